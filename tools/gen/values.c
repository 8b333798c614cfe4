/* ckpt-gen's values: N(0, 0.02) drawn from a xoshiro256** stream seeded by
 * the run's seed and the tensor's name (so values do not depend on
 * sharding, format or write order), and their exact rounding to bf16 and
 * f16, so a bf16 and an f32 run with the same seed hold the same numbers. */
#include <math.h>
#include <string.h>

#include "gen.h"

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(rng *r)
{
    uint64_t result = rotl(r->s[1] * 5, 7) * 9;
    uint64_t t = r->s[1] << 17;
    r->s[2] ^= r->s[0];
    r->s[3] ^= r->s[1];
    r->s[1] ^= r->s[2];
    r->s[0] ^= r->s[3];
    r->s[2] ^= t;
    r->s[3] = rotl(r->s[3], 45);
    return result;
}

void rng_seed(rng *r, uint64_t seed, const char *name)
{
    /* FNV-1a of the name gives each tensor its own stream. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t sm = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&sm);
    r->have_spare = false;
    r->spare = 0.0;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Box-Muller: each pair of uniforms yields two independent normals. */
double rng_normal(rng *r)
{
    if (r->have_spare) {
        r->have_spare = false;
        return r->spare;
    }
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log() stays finite */
    double u2 = rng_uniform(r);
    double radius = sqrt(-2.0 * log(u1));
    double angle = 2.0 * M_PI * u2;
    r->spare = radius * sin(angle);
    r->have_spare = true;
    return radius * cos(angle);
}

uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

/* Round to nearest, ties to even, as torch's .to(torch.bfloat16) does. */
uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* keep NaN a NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* IEEE half, round to nearest even, with subnormals: at std 0.02 about one
 * value in 300 is below the smallest normal half (2^-14). */
uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* 65520 and up round past 65504, the largest half */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) /* normal half: rebias the exponent, round 13 bits */
        return sign | (uint16_t)((a - (112u << 23) + 0x0fffu + ((a >> 13) & 1u)) >> 13);
    uint32_t e = a >> 23;
    if (e < 102) /* below half the smallest subnormal: rounds to zero */
        return sign;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t m = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u)))
        m++; /* may carry into the smallest normal, which encodes correctly */
    return sign | (uint16_t)m;
}

/* The bf16 value widened back to float32: what a bf16 tensor holds. */
float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
