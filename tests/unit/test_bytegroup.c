/* The byte-group join and split, every kernel this CPU runs (scalar,
 * SSE2, AVX2) and whichever one bytegroup_join / bytegroup_split pick:
 * each element size, every plane length around the 16- and 32-element
 * steps, unaligned input and output, nothing written outside the output,
 * and a split by any kernel then a join by any gives the bytes back. */
#include "testutil.h"

#include "bytegroup.h"

#define GUARD 64

static void fill(uint8_t *b, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (uint8_t)(x >> 7);
    }
}

/* Joins planes of m elements of width k with kern (at offset `skew` from
 * an aligned address, planes and output alike) and checks every byte
 * against the definition: out[e * k + j] is byte e of plane j. Returns
 * -1 when the kernel does not run here. */
static int check_join(bytegroup_kernel kern, unsigned k, size_t m, size_t skew)
{
    uint8_t *src = malloc(k * (m + skew) + 1), *buf = malloc(m * k + skew + GUARD);
    cr_assert(src && buf);
    fill(src, k * (m + skew) + 1, (uint32_t)(m * 8 + k + skew));
    const uint8_t *pl[8];
    for (unsigned j = 0; j < k; j++)
        pl[j] = src + j * (m + skew) + skew;
    uint8_t *out = buf + skew;
    memset(buf, 0xa5, m * k + skew + GUARD);
    int rc = kern == (bytegroup_kernel)-1 ? (bytegroup_join(pl, m, k, out), 0)
                                          : bytegroup_join_with(kern, pl, m, k, out);
    if (rc == 0) {
        for (size_t e = 0; e < m; e++)
            for (unsigned j = 0; j < k; j++)
                cr_assert_eq(out[e * k + j], pl[j][e],
                             "kernel %d, k %u, m %zu, skew %zu: byte %u of element %zu", kern, k, m,
                             skew, j, e);
        for (size_t g = 0; g < GUARD; g++)
            cr_assert_eq(out[m * k + g], 0xa5, "kernel %d, k %u, m %zu: wrote past the end", kern,
                         k, m);
        for (size_t g = 0; g < skew; g++)
            cr_assert_eq(buf[g], 0xa5, "kernel %d, k %u, m %zu: wrote before the start", kern, k,
                         m);
    }
    free(src);
    free(buf);
    return rc;
}

static const size_t lengths[] = {0,   1,   15,  16,  17,   31,   32,    33,           47,
                                 48,  63,  64,  65,  95,   96,   97,    127,          128,
                                 129, 255, 257, 999, 4099, 8192, 65543, (1 << 19) + 3};

Test(bytegroup, every_kernel_joins_every_width_and_length)
{
    /* -1: whatever bytegroup_join picks on this CPU. */
    static const int kernels[] = {BYTEGROUP_SCALAR, BYTEGROUP_SSE2, BYTEGROUP_AVX2, -1};
    unsigned ran[4] = {0};
    for (size_t q = 0; q < sizeof kernels / sizeof *kernels; q++)
        for (unsigned k = 2; k <= 8; k *= 2)
            for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
                for (size_t skew = 0; skew < 2; skew++)
                    ran[q] += check_join((bytegroup_kernel)kernels[q], k, lengths[l], skew) == 0;
    cr_assert(ran[0] > 0 && ran[3] > 0, "the scalar join and the chosen one always run");
#if defined(__x86_64__)
    cr_assert(ran[1] > 0, "SSE2 is baseline on x86-64");
    if (__builtin_cpu_supports("avx2"))
        cr_assert(ran[2] > 0, "this CPU has AVX2, so its kernel must run");
#endif
}

/* As check_join, for the split: plane j byte e is raw[e * k + j]. */
static int check_split(bytegroup_kernel kern, unsigned k, size_t m, size_t skew)
{
    size_t n = m * k;
    uint8_t *src = malloc(n + skew + 1), *buf = malloc(n + skew + GUARD);
    cr_assert(src && buf);
    fill(src, n + skew + 1, (uint32_t)(m * 8 + k + skew + 7));
    const uint8_t *raw = src + skew;
    uint8_t *planes = buf + skew;
    memset(buf, 0xa5, n + skew + GUARD);
    int rc = kern == (bytegroup_kernel)-1 ? (bytegroup_split(raw, n, k, planes), 0)
                                          : bytegroup_split_with(kern, raw, n, k, planes);
    if (rc == 0) {
        for (unsigned j = 0; j < k; j++)
            for (size_t e = 0; e < m; e++)
                cr_assert_eq(planes[j * m + e], raw[e * k + j],
                             "kernel %d, k %u, m %zu, skew %zu: byte %zu of plane %u", kern, k, m,
                             skew, e, j);
        for (size_t g = 0; g < GUARD; g++)
            cr_assert_eq(planes[n + g], 0xa5, "kernel %d, k %u, m %zu: wrote past the end", kern, k,
                         m);
        for (size_t g = 0; g < skew; g++)
            cr_assert_eq(buf[g], 0xa5, "kernel %d, k %u, m %zu: wrote before the start", kern, k,
                         m);
    }
    free(src);
    free(buf);
    return rc;
}

Test(bytegroup, every_kernel_splits_every_width_and_length)
{
    static const int kernels[] = {BYTEGROUP_SCALAR, BYTEGROUP_SSE2, BYTEGROUP_AVX2, -1};
    unsigned ran[4] = {0};
    for (size_t q = 0; q < sizeof kernels / sizeof *kernels; q++)
        for (unsigned k = 2; k <= 8; k *= 2)
            for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++)
                for (size_t skew = 0; skew < 4; skew++)
                    ran[q] += check_split((bytegroup_kernel)kernels[q], k, lengths[l], skew) == 0;
    cr_assert(ran[0] > 0 && ran[3] > 0, "the scalar split and the chosen one always run");
#if defined(__x86_64__)
    cr_assert(ran[1] > 0, "SSE2 is baseline on x86-64");
    if (__builtin_cpu_supports("avx2"))
        cr_assert(ran[2] > 0, "this CPU has AVX2, so its kernel must run");
#endif
}

Test(bytegroup, split_then_join_gives_the_bytes_back)
{
    static const bytegroup_kernel kernels[] = {BYTEGROUP_SCALAR, BYTEGROUP_SSE2, BYTEGROUP_AVX2};
    for (size_t s = 0; s < 3; s++)
        for (size_t t = 0; t < 3; t++)
            for (unsigned k = 2; k <= 8; k *= 2)
                for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
                    size_t n = lengths[l] * k;
                    uint8_t *raw = malloc(n + 1), *planes = malloc(n + 1), *back = malloc(n + 1);
                    cr_assert(raw && planes && back);
                    fill(raw, n, (uint32_t)n);
                    const uint8_t *pl[8];
                    for (unsigned j = 0; j < k; j++)
                        pl[j] = planes + j * lengths[l];
                    if (bytegroup_split_with(kernels[s], raw, n, k, planes) == 0 &&
                        bytegroup_join_with(kernels[t], pl, lengths[l], k, back) == 0)
                        cr_assert(memcmp(raw, back, n) == 0, "split %d, join %d, k %u, n %zu",
                                  kernels[s], kernels[t], k, n);
                    free(raw);
                    free(planes);
                    free(back);
                }
    /* and the pair the codec calls */
    for (unsigned k = 2; k <= 8; k *= 2) {
        size_t m = 4099, n = m * k;
        uint8_t *raw = malloc(n), *planes = malloc(n), *back = malloc(n);
        cr_assert(raw && planes && back);
        fill(raw, n, 99);
        bytegroup_split(raw, n, k, planes);
        const uint8_t *pl[8];
        for (unsigned j = 0; j < k; j++)
            pl[j] = planes + j * m;
        bytegroup_join(pl, m, k, back);
        cr_assert(memcmp(raw, back, n) == 0, "k %u", k);
        free(raw);
        free(planes);
        free(back);
    }
}
