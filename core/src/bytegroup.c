/* Both byte-group transposes, and the choice of kernel for each: one job,
 * the layout of BYTEGROUP planes in memory.
 *
 * The join ran at 11.7 GB/s of output with SSE2 on a 1 MiB bf16 chunk in
 * L2, and took 17% of `ckpt cat --threads 1` of a compressed pack (perf
 * record); with AVX2 it runs at 16.9 GB/s, so where the CPU has AVX2 it
 * gets a kernel built for it (target attribute), chosen at run time, and
 * SSE2 (baseline on x86-64) stays the fallback. Element size 8 was a
 * scalar loop, 1.45 GB/s: 9x slower than the SSE2 kernel it now has.
 * The split (every packed byte) had the same scalar loop for element size
 * 8, 2.5-2.6 GB/s on a 1 MiB chunk; its SSE2 kernel runs at 9.2-9.9. */
#include "bytegroup.h"

#ifdef __SSE2__
#include <emmintrin.h>

/* Of 32 bytes in x and y, the even ones and the odd ones, each in order. */
static inline void sse2_deinterleave(__m128i x, __m128i y, __m128i *even, __m128i *odd)
{
    const __m128i low = _mm_set1_epi16(0x00ff);
    *even = _mm_packus_epi16(_mm_and_si128(x, low), _mm_and_si128(y, low));
    *odd = _mm_packus_epi16(_mm_srli_epi16(x, 8), _mm_srli_epi16(y, 8));
}
#endif

/* GCC and clang build a function for a CPU newer than the baseline with
 * the target attribute, and say at run time whether this one is. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_AVX2_KERNEL 1
#include <immintrin.h>
#endif

/* The split kernels take elements [i, m) of raw (m = n / k) to planes
 * of m bytes; each wider one leaves its tail to the next. */
static void split_scalar(const uint8_t *raw, size_t i, size_t m, unsigned k, uint8_t *planes)
{
    for (unsigned j = 0; j < k; j++)
        for (size_t e = i; e < m; e++)
            planes[j * m + e] = raw[e * k + j];
}

#ifdef __SSE2__
/* 8 vectors of 16 elements of 8 bytes in order to the 8 planes of those
 * elements. Read byte b of the block as the bits of b, vector index above
 * place in the vector: an unpack round (x[t] with x[t + 4]) rotates them
 * left by one, and four rounds carry the element's 4 bits from the top to
 * the bottom, the byte's 3 to the top: 32 unpacks, against 72 instructions
 * for pack-based deinterleaving. Written out so that x stays in
 * registers. */
static inline void sse2_split_round8(__m128i *x)
{
    __m128i y0 = _mm_unpacklo_epi8(x[0], x[4]), y1 = _mm_unpackhi_epi8(x[0], x[4]);
    __m128i y2 = _mm_unpacklo_epi8(x[1], x[5]), y3 = _mm_unpackhi_epi8(x[1], x[5]);
    __m128i y4 = _mm_unpacklo_epi8(x[2], x[6]), y5 = _mm_unpackhi_epi8(x[2], x[6]);
    __m128i y6 = _mm_unpacklo_epi8(x[3], x[7]), y7 = _mm_unpackhi_epi8(x[3], x[7]);
    x[0] = y0, x[1] = y1, x[2] = y2, x[3] = y3, x[4] = y4, x[5] = y5, x[6] = y6, x[7] = y7;
}
#endif

/* The common element sizes, 16 elements at a time. */
static void split_sse2(const uint8_t *raw, size_t i, size_t m, unsigned k, uint8_t *planes)
{
#ifdef __SSE2__
    if (k == 2) {
        uint8_t *a = planes, *b = planes + m;
        for (; i + 16 <= m; i += 16) {
            __m128i lo, hi;
            sse2_deinterleave(_mm_loadu_si128((const __m128i *)(raw + 2 * i)),
                              _mm_loadu_si128((const __m128i *)(raw + 2 * i + 16)), &lo, &hi);
            _mm_storeu_si128((__m128i *)(a + i), lo);
            _mm_storeu_si128((__m128i *)(b + i), hi);
        }
    } else if (k == 4) {
        uint8_t *a = planes, *b = planes + m, *c = planes + 2 * m, *d = planes + 3 * m;
        for (; i + 16 <= m; i += 16) {
            const uint8_t *r = raw + 4 * i;
            __m128i e01, o01, e23, o23, va, vb, vc, vd;
            /* bytes 0 and 2 of each element, then 1 and 3; then once more */
            sse2_deinterleave(_mm_loadu_si128((const __m128i *)r),
                              _mm_loadu_si128((const __m128i *)(r + 16)), &e01, &o01);
            sse2_deinterleave(_mm_loadu_si128((const __m128i *)(r + 32)),
                              _mm_loadu_si128((const __m128i *)(r + 48)), &e23, &o23);
            sse2_deinterleave(e01, e23, &va, &vc);
            sse2_deinterleave(o01, o23, &vb, &vd);
            _mm_storeu_si128((__m128i *)(a + i), va);
            _mm_storeu_si128((__m128i *)(b + i), vb);
            _mm_storeu_si128((__m128i *)(c + i), vc);
            _mm_storeu_si128((__m128i *)(d + i), vd);
        }
    } else if (k == 8) {
        for (; i + 16 <= m; i += 16) {
            __m128i x[8];
            for (unsigned t = 0; t < 8; t++)
                x[t] = _mm_loadu_si128((const __m128i *)(raw + 8 * i + 16 * t));
            sse2_split_round8(x);
            sse2_split_round8(x);
            sse2_split_round8(x);
            sse2_split_round8(x);
            for (unsigned j = 0; j < 8; j++)
                _mm_storeu_si128((__m128i *)(planes + j * m + i), x[j]);
        }
    }
#endif
    split_scalar(raw, i, m, k, planes);
}

/* The join kernels take elements [i, m) of the planes pl[0..k) to
 * out[i * k .. m * k); each wider one leaves its tail to the next. */
static void join_scalar(const uint8_t *const *pl, size_t i, size_t m, unsigned k, uint8_t *out)
{
    for (unsigned j = 0; j < k; j++)
        for (size_t e = i; e < m; e++)
            out[e * k + j] = pl[j][e];
}

/* 16 elements at a time: unpacks of bytes, then of 16-bit pairs, then (k
 * 8) of 32-bit quads give the elements in order. */
static void join_sse2(const uint8_t *const *pl, size_t i, size_t m, unsigned k, uint8_t *out)
{
#ifdef __SSE2__
    if (k == 2) {
        const uint8_t *a = pl[0], *b = pl[1];
        for (; i + 16 <= m; i += 16) {
            __m128i va = _mm_loadu_si128((const __m128i *)(a + i)),
                    vb = _mm_loadu_si128((const __m128i *)(b + i));
            _mm_storeu_si128((__m128i *)(out + 2 * i), _mm_unpacklo_epi8(va, vb));
            _mm_storeu_si128((__m128i *)(out + 2 * i + 16), _mm_unpackhi_epi8(va, vb));
        }
    } else if (k == 4) {
        const uint8_t *a = pl[0], *b = pl[1], *c = pl[2], *d = pl[3];
        for (; i + 16 <= m; i += 16) {
            __m128i va = _mm_loadu_si128((const __m128i *)(a + i)),
                    vb = _mm_loadu_si128((const __m128i *)(b + i));
            __m128i vc = _mm_loadu_si128((const __m128i *)(c + i)),
                    vd = _mm_loadu_si128((const __m128i *)(d + i));
            __m128i ab_lo = _mm_unpacklo_epi8(va, vb), ab_hi = _mm_unpackhi_epi8(va, vb);
            __m128i cd_lo = _mm_unpacklo_epi8(vc, vd), cd_hi = _mm_unpackhi_epi8(vc, vd);
            _mm_storeu_si128((__m128i *)(out + 4 * i), _mm_unpacklo_epi16(ab_lo, cd_lo));
            _mm_storeu_si128((__m128i *)(out + 4 * i + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
            _mm_storeu_si128((__m128i *)(out + 4 * i + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
            _mm_storeu_si128((__m128i *)(out + 4 * i + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
        }
    } else if (k == 8) {
        for (; i + 16 <= m; i += 16) {
            __m128i v[8], p[8], q[8];
            for (unsigned j = 0; j < 8; j++)
                v[j] = _mm_loadu_si128((const __m128i *)(pl[j] + i));
            /* p: bytes (2j, 2j+1) of elements 0-7 (even slots), 8-15 (odd) */
            for (unsigned j = 0; j < 4; j++) {
                p[2 * j] = _mm_unpacklo_epi8(v[2 * j], v[2 * j + 1]);
                p[2 * j + 1] = _mm_unpackhi_epi8(v[2 * j], v[2 * j + 1]);
            }
            /* q: bytes 0-3 (slots 0-3) and 4-7 (4-7) of elements 4t..4t+3 */
            for (unsigned h = 0; h < 2; h++)
                for (unsigned t = 0; t < 2; t++) {
                    q[4 * h + 2 * t] = _mm_unpacklo_epi16(p[4 * h + t], p[4 * h + 2 + t]);
                    q[4 * h + 2 * t + 1] = _mm_unpackhi_epi16(p[4 * h + t], p[4 * h + 2 + t]);
                }
            uint8_t *o = out + 8 * i;
            for (unsigned t = 0; t < 4; t++) {
                _mm_storeu_si128((__m128i *)(o + 32 * t), _mm_unpacklo_epi32(q[t], q[4 + t]));
                _mm_storeu_si128((__m128i *)(o + 32 * t + 16), _mm_unpackhi_epi32(q[t], q[4 + t]));
            }
        }
    }
#endif
    join_scalar(pl, i, m, k, out);
}

#ifdef HAVE_AVX2_KERNEL
/* 32 elements at a time: the SSE2 unpacks work within each 128-bit lane,
 * so the low lanes hold elements 0-15 and the high lanes 16-31, and a
 * final lane permute puts them in order. */
__attribute__((target("avx2"))) static void join_avx2(const uint8_t *const *pl, size_t i, size_t m,
                                                      unsigned k, uint8_t *out)
{
    if (k == 2) {
        const uint8_t *a = pl[0], *b = pl[1];
        for (; i + 32 <= m; i += 32) {
            __m256i va = _mm256_loadu_si256((const __m256i *)(a + i)),
                    vb = _mm256_loadu_si256((const __m256i *)(b + i));
            __m256i lo = _mm256_unpacklo_epi8(va, vb), hi = _mm256_unpackhi_epi8(va, vb);
            _mm256_storeu_si256((__m256i *)(out + 2 * i), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(out + 2 * i + 32),
                                _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    } else if (k == 4) {
        const uint8_t *a = pl[0], *b = pl[1], *c = pl[2], *d = pl[3];
        for (; i + 32 <= m; i += 32) {
            __m256i va = _mm256_loadu_si256((const __m256i *)(a + i)),
                    vb = _mm256_loadu_si256((const __m256i *)(b + i));
            __m256i vc = _mm256_loadu_si256((const __m256i *)(c + i)),
                    vd = _mm256_loadu_si256((const __m256i *)(d + i));
            __m256i ab_lo = _mm256_unpacklo_epi8(va, vb), ab_hi = _mm256_unpackhi_epi8(va, vb);
            __m256i cd_lo = _mm256_unpacklo_epi8(vc, vd), cd_hi = _mm256_unpackhi_epi8(vc, vd);
            /* elements 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31 */
            __m256i x0 = _mm256_unpacklo_epi16(ab_lo, cd_lo),
                    x1 = _mm256_unpackhi_epi16(ab_lo, cd_lo);
            __m256i x2 = _mm256_unpacklo_epi16(ab_hi, cd_hi),
                    x3 = _mm256_unpackhi_epi16(ab_hi, cd_hi);
            uint8_t *o = out + 4 * i;
            _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(x0, x1, 0x20));
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(x2, x3, 0x20));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_permute2x128_si256(x0, x1, 0x31));
            _mm256_storeu_si256((__m256i *)(o + 96), _mm256_permute2x128_si256(x2, x3, 0x31));
        }
    } else if (k == 8) {
        for (; i + 32 <= m; i += 32) {
            __m256i v[8], p[8], q[8], r[8];
            for (unsigned j = 0; j < 8; j++)
                v[j] = _mm256_loadu_si256((const __m256i *)(pl[j] + i));
            for (unsigned j = 0; j < 4; j++) {
                p[2 * j] = _mm256_unpacklo_epi8(v[2 * j], v[2 * j + 1]);
                p[2 * j + 1] = _mm256_unpackhi_epi8(v[2 * j], v[2 * j + 1]);
            }
            for (unsigned h = 0; h < 2; h++)
                for (unsigned t = 0; t < 2; t++) {
                    q[4 * h + 2 * t] = _mm256_unpacklo_epi16(p[4 * h + t], p[4 * h + 2 + t]);
                    q[4 * h + 2 * t + 1] = _mm256_unpackhi_epi16(p[4 * h + t], p[4 * h + 2 + t]);
                }
            /* r[2t], r[2t + 1]: elements 4t..4t+3 of each lane */
            for (unsigned t = 0; t < 4; t++) {
                r[2 * t] = _mm256_unpacklo_epi32(q[t], q[4 + t]);
                r[2 * t + 1] = _mm256_unpackhi_epi32(q[t], q[4 + t]);
            }
            uint8_t *o = out + 8 * i;
            for (unsigned t = 0; t < 4; t++) {
                _mm256_storeu_si256((__m256i *)(o + 32 * t),
                                    _mm256_permute2x128_si256(r[2 * t], r[2 * t + 1], 0x20));
                _mm256_storeu_si256((__m256i *)(o + 128 + 32 * t),
                                    _mm256_permute2x128_si256(r[2 * t], r[2 * t + 1], 0x31));
            }
        }
    }
    join_sse2(pl, i, m, k, out);
}

static int avx2_runs(void)
{
    return __builtin_cpu_supports("avx2");
}
#endif

/* The one place that says which kernels run here and which is fastest;
 * both transposes go through it. */
static int kernel_runs(bytegroup_kernel kern)
{
    switch (kern) {
    case BYTEGROUP_SCALAR:
        return 1;
    case BYTEGROUP_SSE2:
#ifdef __SSE2__
        return 1;
#else
        return 0;
#endif
    case BYTEGROUP_AVX2:
#ifdef HAVE_AVX2_KERNEL
        return avx2_runs();
#else
        return 0;
#endif
    }
    return 0;
}

static bytegroup_kernel fastest_kernel(void)
{
    return kernel_runs(BYTEGROUP_AVX2)   ? BYTEGROUP_AVX2
           : kernel_runs(BYTEGROUP_SSE2) ? BYTEGROUP_SSE2
                                         : BYTEGROUP_SCALAR;
}

int bytegroup_join_with(bytegroup_kernel kern, const uint8_t *const *pl, size_t m, unsigned k,
                        uint8_t *out)
{
    if (!kernel_runs(kern))
        return -1;
    switch (kern) {
    case BYTEGROUP_SCALAR:
        join_scalar(pl, 0, m, k, out);
        break;
    case BYTEGROUP_SSE2:
        join_sse2(pl, 0, m, k, out);
        break;
    case BYTEGROUP_AVX2:
#ifdef HAVE_AVX2_KERNEL
        join_avx2(pl, 0, m, k, out);
#endif
        break;
    }
    return 0;
}

int bytegroup_split_with(bytegroup_kernel kern, const uint8_t *raw, size_t n, unsigned k,
                         uint8_t *planes)
{
    if (!kernel_runs(kern))
        return -1;
    switch (kern) {
    case BYTEGROUP_SCALAR:
        split_scalar(raw, 0, n / k, k, planes);
        break;
    /* No AVX2 split: the same four rounds of unpacks, 32 elements at a
     * time in 256-bit lanes, ran at 8.2-8.8 GB/s on a 1 MiB chunk of
     * 8-byte elements against 9.2-9.9 for SSE2 (this VM's Xeon). */
    case BYTEGROUP_SSE2:
    case BYTEGROUP_AVX2:
        split_sse2(raw, 0, n / k, k, planes);
        break;
    }
    return 0;
}

void bytegroup_join(const uint8_t *const *pl, size_t m, unsigned k, uint8_t *out)
{
    bytegroup_join_with(fastest_kernel(), pl, m, k, out);
}

void bytegroup_split(const uint8_t *raw, size_t n, unsigned k, uint8_t *planes)
{
    bytegroup_split_with(fastest_kernel(), raw, n, k, planes);
}
