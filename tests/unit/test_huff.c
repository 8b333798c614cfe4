/* The Huffman-only deflate encoder (core/src/huff.c): whatever the byte
 * distribution, zlib and libdeflate inflate its output to exactly the
 * input; codes are limited to 15 bits even when the frequencies would
 * make them longer; a stream that does not fit is refused. */
#include "testutil.h"

#include <libdeflate.h>
#include <zlib.h>

#include "huff.h"

static size_t encode(const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
    uint32_t hist[256] = {0};
    for (size_t i = 0; i < n; i++)
        hist[in[i]]++;
    return huff_deflate(in, n, hist, out, cap);
}

static void expect_roundtrip(const uint8_t *in, size_t n, const char *what)
{
    size_t cap = n + n / 2 + 1024;
    uint8_t *out = malloc(cap), *back = malloc(n + 1);
    size_t got = encode(in, n, out, cap);
    cr_assert_gt(got, 0, "%s: encoded to nothing", what);

    z_stream z;
    memset(&z, 0, sizeof z);
    cr_assert_eq(inflateInit2(&z, -15), Z_OK);
    z.next_in = out;
    z.avail_in = (uInt)got;
    z.next_out = back;
    z.avail_out = (uInt)n + 1;
    int rc = inflate(&z, Z_FINISH);
    cr_assert_eq(rc, Z_STREAM_END, "%s: zlib says %d (%s)", what, rc, z.msg ? z.msg : "");
    cr_assert_eq(z.total_out, n, "%s: zlib inflated %lu of %zu", what, z.total_out, n);
    cr_assert_eq(z.avail_in, 0, "%s: bytes left over", what);
    inflateEnd(&z);
    cr_assert_eq(memcmp(back, in, n), 0, "%s: zlib output differs", what);

    struct libdeflate_decompressor *d = libdeflate_alloc_decompressor();
    size_t used = 0, out_n = 0;
    memset(back, 0, n);
    cr_assert_eq(libdeflate_deflate_decompress_ex(d, out, got, back, n, &used, &out_n),
                 LIBDEFLATE_SUCCESS, "%s: libdeflate refuses it", what);
    libdeflate_free_decompressor(d);
    cr_assert_eq(out_n, n);
    cr_assert_eq(used, got);
    cr_assert_eq(memcmp(back, in, n), 0, "%s: libdeflate output differs", what);
    free(out);
    free(back);
}

Test(huff, uniform_random_bytes)
{
    size_t n = 100000;
    uint8_t *b = malloc(n);
    tu_fill_pattern(b, n, 1);
    expect_roundtrip(b, n, "random");
    free(b);
}

Test(huff, one_symbol)
{
    uint8_t b[4096];
    memset(b, 0x3f, sizeof b);
    expect_roundtrip(b, sizeof b, "constant");
    expect_roundtrip(b, 1, "one byte");
}

Test(huff, two_symbols_and_tiny_inputs)
{
    uint8_t b[10] = {0, 255, 0, 255, 0, 0, 0, 255, 0, 0};
    for (size_t n = 1; n <= sizeof b; n++)
        expect_roundtrip(b, n, "tiny");
}

Test(huff, bf16_exponents)
{
    /* The exponent bytes of N(0, 0.02) bf16 weights: a few dozen values. */
    size_t n = 1 << 19;
    uint8_t *b = malloc(n);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        int e = 0x3c - (int)__builtin_ctz((x >> 8) | 0x800000);
        b[i] = (uint8_t)((x & 0x80000000u ? 0x80 : 0) | (e & 0x7f));
    }
    expect_roundtrip(b, n, "exponents");
    free(b);
}

Test(huff, skewed_frequencies_need_length_limits)
{
    /* Fibonacci counts make a minimum-redundancy code as deep as the
     * number of symbols: far over deflate's 15 bits. */
    size_t n = 0, fib[30] = {1, 1};
    for (int i = 2; i < 30; i++)
        fib[i] = fib[i - 1] + fib[i - 2];
    for (int i = 0; i < 30; i++)
        n += fib[i];
    uint8_t *b = malloc(n), *p = b;
    for (int i = 0; i < 30; i++) {
        memset(p, i * 7, fib[i]);
        p += fib[i];
    }
    expect_roundtrip(b, n, "fibonacci");
    free(b);
}

Test(huff, every_byte_value_once_then_many)
{
    size_t n = 256 + 300000;
    uint8_t *b = malloc(n);
    for (int i = 0; i < 256; i++)
        b[i] = (uint8_t)i;
    memset(b + 256, 7, 300000);
    expect_roundtrip(b, n, "all values");
    free(b);
}

Test(huff, too_small_a_buffer_is_refused)
{
    size_t n = 10000;
    uint8_t *b = malloc(n), out[2000];
    tu_fill_pattern(b, n, 3);
    cr_assert_eq(encode(b, n, out, sizeof out), 0);
    memset(b, 1, n);
    size_t exact = encode(b, n, out, sizeof out);
    /* One bit per byte is the least Huffman coding can do. */
    cr_assert(exact > n / 8 && exact < n / 8 + 100, "a constant plane takes %zu bytes", exact);
    uint8_t out2[2000];
    cr_assert_eq(encode(b, n, out2, exact), exact, "exactly its size is enough");
    cr_assert_eq(encode(b, n, out2, exact - 1), 0);
    free(b);
}
