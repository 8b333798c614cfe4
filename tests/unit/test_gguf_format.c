/* The GGUF parser (core/src/formats/gguf.c): real files from gguf-py's
 * GGUFWriter (tests/unit/gen_gguf_fixtures.py) checked tensor by tensor
 * against the bytes numpy gave the writer, hand-made files for the shape
 * order, and one test per hostile input with its message. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format_fixtures.h"
#include "formats/binary.h"

/* ------------------------------------------------------------ builder */

typedef struct gb {
    uint8_t *p;
    size_t len, cap;
} gb;

static void gb_put(gb *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void gb_u32(gb *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 4);
}

static void gb_u64(gb *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, 8);
}

static void gb_str(gb *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}

static void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}

/* Tensor info: name, dims (ne order), ggml type, offset. */
static void gb_ti(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                  uint64_t offset)
{
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        gb_u64(b, ne[i]);
    gb_u32(b, type);
    gb_u64(b, offset);
}

static void gb_pad(gb *b, size_t align)
{
    static const uint8_t zero[64];
    while (b->len % align)
        gb_put(b, zero, 1);
    (void)zero;
}

static void gb_data(gb *b, size_t n, uint32_t seed)
{
    uint8_t *d = malloc(n ? n : 1);
    cr_assert_not_null(d);
    tu_fill_pattern(d, n, seed);
    gb_put(b, d, n);
    free(d);
}

enum { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_BF16 = 30 };

/* Two F32 tensors: "w" ne {3, 2} (numpy shape (2, 3)) and "b" ne {4}. */
static gb valid_file(void)
{
    gb b = {0};
    gb_header(&b, 3, 2, 1);
    gb_str(&b, "general.architecture");
    gb_u32(&b, 8);
    gb_str(&b, "llama");
    gb_ti(&b, "w", 2, (uint64_t[]){3, 2}, T_F32, 0);
    gb_ti(&b, "b", 1, (uint64_t[]){4}, T_F32, 32);
    gb_pad(&b, 32);
    gb_data(&b, 24, 1);
    gb_pad(&b, 32);
    gb_data(&b, 16, 2);
    return b;
}

static void expect_fault(gb *b, const char *fragment)
{
    ff_expect_fault(&ckpt_format_gguf, b->p, b->len, fragment);
    free(b->p);
}

/* ------------------------------------------------------------ real files */

Test(gguf_format, real_files_from_gguf_writer)
{
    char *dir = tu_mkdtemp();
    ff_generate("tests/unit/gen_gguf_fixtures.py", dir, NULL);
    ff_file files[16];
    size_t n = ff_manifest(dir, files, 16);
    cr_assert_geq(n, 5);
    for (size_t i = 0; i < n; i++)
        ff_check_file(&ckpt_format_gguf, dir, &files[i]);
    tu_rm_rf(dir);
    free(dir);
}

/* ------------------------------------------------------------ hand-made */

Test(gguf_format, sniff_by_magic)
{
    cr_assert(ckpt_format_gguf.sniff("x.bin", (const uint8_t *)"GGUF\3\0\0\0", 8, 8));
    cr_assert_not(ckpt_format_gguf.sniff("x.gguf", (const uint8_t *)"GGUX\3\0\0\0", 8, 8));
    cr_assert_not(ckpt_format_gguf.sniff("x.gguf", (const uint8_t *)"GGU", 3, 3));
    cr_assert_str_eq(ckpt_format_gguf.name, "gguf");
}

Test(gguf_format, shape_is_ne_reversed)
{
    gb b = valid_file();
    ff_result r = ff_parse(&ckpt_format_gguf, b.p, b.len);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 2);
    cr_assert_str_eq(r.l.t[0].name, "w");
    cr_assert_str_eq(r.l.t[0].dtype, "F32");
    cr_assert_eq(r.l.t[0].ndim, 2);
    cr_assert_eq(r.l.t[0].shape[0], 2);
    cr_assert_eq(r.l.t[0].shape[1], 3);
    cr_assert_eq(r.l.t[0].nbytes, 24);
    cr_assert_eq(r.l.t[1].offset, r.l.t[0].offset + 32);
    cr_assert_eq(r.l.header_bytes, r.l.t[0].offset);
    cr_assert_eq(r.l.header_bytes % 32, 0);
    ff_layout_free(&r.l);
    free(b.p);
}

Test(gguf_format, version_2_and_quantized_region)
{
    gb b = {0};
    gb_header(&b, 2, 2, 0);
    gb_ti(&b, "q", 2, (uint64_t[]){64, 3}, T_Q8_0, 0);
    gb_ti(&b, "h", 1, (uint64_t[]){5}, T_BF16, 224);
    gb_pad(&b, 32);
    gb_data(&b, 3 * 2 * 34, 3);
    gb_pad(&b, 32);
    gb_data(&b, 10, 4);
    ff_result r = ff_parse(&ckpt_format_gguf, b.p, b.len);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1);
    cr_assert_str_eq(r.l.t[0].dtype, "BF16");
    cr_assert_eq(r.l.n_regions, 1);
    cr_assert_str_eq(r.l.regions[0].dtype, "GGML_Q8_0");
    cr_assert_eq(r.l.regions[0].length, 204);
    cr_assert_eq(r.l.header_bytes, r.l.regions[0].offset);
    ff_layout_free(&r.l);
    free(b.p);
}

Test(gguf_format, old_and_big_endian_versions_stay_opaque)
{
    gb b = {0};
    gb_header(&b, 1, 0, 0);
    cr_assert_eq(ff_parse(&ckpt_format_gguf, b.p, b.len).rc, 1);
    free(b.p);
    b = (gb){0};
    gb_header(&b, 0x03000000u, 0, 0);
    cr_assert_eq(ff_parse(&ckpt_format_gguf, b.p, b.len).rc, 1);
    free(b.p);
    b = (gb){0};
    gb_header(&b, 7, 0, 0);
    expect_fault(&b, "gguf: unsupported version 7");
}

Test(gguf_format, every_truncation_is_refused_cleanly)
{
    gb b = valid_file();
    /* Cutting into the header or the tensor data must fail with a message;
     * none may read past the end (ASan) or succeed. */
    for (size_t n = 0; n < b.len; n++) {
        ff_result r = ff_parse(&ckpt_format_gguf, b.p, n);
        cr_assert_eq(r.rc, -EINVAL, "cut at %zu: rc %d", n, r.rc);
        tu_assert_contains(r.msg, "gguf: ");
        ff_layout_free(&r.l);
    }
    free(b.p);
}

/* ------------------------------------------------------------ hostile */

Test(gguf_format, absurd_tensor_count)
{
    gb b = {0};
    gb_header(&b, 3, 1ull << 40, 0);
    gb_data(&b, 100, 5);
    expect_fault(&b, "gguf: tensor count 1099511627776 is absurd");
}

Test(gguf_format, absurd_kv_count)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1000);
    gb_data(&b, 100, 5);
    expect_fault(&b, "gguf: key/value count 1000 is absurd");
}

Test(gguf_format, key_length_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, 1u << 30);
    gb_put(&b, "general.name", 12);
    gb_u32(&b, 8);
    expect_fault(&b, "gguf: key 0 length 1073741824 runs past the end of the");
}

Test(gguf_format, string_value_length_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "general.name");
    gb_u32(&b, 8);
    gb_u64(&b, 0xFFFFFFFFFFFFull);
    gb_put(&b, "abc", 3);
    expect_fault(&b, "gguf: string value of key 'general.name' length 281474976710655 runs "
                     "past the end");
}

Test(gguf_format, array_count_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "tokens");
    gb_u32(&b, 9);
    gb_u32(&b, 8);
    gb_u64(&b, 1ull << 50);
    gb_data(&b, 64, 6);
    expect_fault(&b, "gguf: key 'tokens': array of 1125899906842624 elements of type 8 runs "
                     "past the end");
}

Test(gguf_format, arrays_nested_too_deep)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "deep");
    gb_u32(&b, 9);
    for (int i = 0; i < 12; i++) {
        gb_u32(&b, 9);
        gb_u64(&b, 1);
    }
    gb_u32(&b, 0);
    gb_u64(&b, 0);
    expect_fault(&b, "gguf: key 'deep': arrays nest deeper than 8 levels");
}

Test(gguf_format, unknown_value_type)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "odd");
    gb_u32(&b, 13);
    gb_u64(&b, 0);
    expect_fault(&b, "gguf: key 'odd' has unknown value type 13");
}

Test(gguf_format, alignment_not_power_of_two)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "general.alignment");
    gb_u32(&b, 4);
    gb_u32(&b, 48);
    expect_fault(&b, "gguf: general.alignment 48 is not a power of two");
}

Test(gguf_format, alignment_of_wrong_type)
{
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "general.alignment");
    gb_u32(&b, 10);
    gb_u64(&b, 64);
    expect_fault(&b, "gguf: general.alignment has value type 10, not uint32");
}

Test(gguf_format, dims_overflow)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "huge", 4, (uint64_t[]){1ull << 32, 1ull << 32, 1ull << 32, 1}, T_F32, 0);
    gb_pad(&b, 32);
    gb_data(&b, 64, 7);
    expect_fault(&b, "gguf: tensor 'huge': size of F32[4294967296, 4294967296, 4294967296, 1] "
                     "overflows 64 bits");
}

Test(gguf_format, dim_above_int64_max)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "neg", 1, (uint64_t[]){UINT64_MAX}, T_F32, 0);
    expect_fault(&b, "gguf: tensor 'neg': ne[0] is 18446744073709551615, more than INT64_MAX");
}

Test(gguf_format, too_many_dims)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "five", 5, (uint64_t[]){1, 1, 1, 1, 1}, T_F32, 0);
    gb_pad(&b, 32);
    gb_data(&b, 4, 8);
    expect_fault(&b, "gguf: tensor 'five' has 5 dimensions, more than 4");
}

Test(gguf_format, unknown_ggml_type)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "t", 1, (uint64_t[]){4}, 99, 0);
    gb_pad(&b, 32);
    gb_data(&b, 16, 9);
    expect_fault(&b, "gguf: tensor 't' has unknown ggml type 99");
}

Test(gguf_format, partial_quant_block)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "q", 1, (uint64_t[]){33}, T_Q8_0, 0);
    gb_pad(&b, 32);
    gb_data(&b, 68, 10);
    expect_fault(&b, "gguf: tensor 'q': ne[0] = 33 is not a multiple of the Q8_0 block size 32");
}

Test(gguf_format, tensor_offset_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "far", 1, (uint64_t[]){4}, T_F32, 1u << 20);
    gb_pad(&b, 32);
    gb_data(&b, 16, 11);
    expect_fault(&b, "gguf: tensor 'far': 16 bytes at data offset 1048576 run past the end of "
                     "the");
}

Test(gguf_format, tensor_offset_overflow)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "wrap", 1, (uint64_t[]){4}, T_F32, UINT64_MAX - 31);
    gb_pad(&b, 32);
    gb_data(&b, 16, 11);
    expect_fault(&b, "gguf: tensor 'wrap': 16 bytes at data offset 18446744073709551584 run "
                     "past the end");
}

Test(gguf_format, tensor_runs_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "long", 1, (uint64_t[]){400}, T_F32, 0);
    gb_pad(&b, 32);
    gb_data(&b, 16, 11);
    expect_fault(&b, "gguf: tensor 'long': 1600 bytes at data offset 0 run past the end");
}

Test(gguf_format, unaligned_offset)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "odd", 1, (uint64_t[]){4}, T_F32, 4);
    gb_pad(&b, 32);
    gb_data(&b, 32, 12);
    expect_fault(&b, "gguf: tensor 'odd': offset 4 is not a multiple of the alignment 32");
}

Test(gguf_format, overlapping_tensors)
{
    gb b = {0};
    gb_header(&b, 3, 2, 0);
    gb_ti(&b, "first", 1, (uint64_t[]){16}, T_F32, 0);
    gb_ti(&b, "second", 1, (uint64_t[]){8}, T_F32, 32);
    gb_pad(&b, 32);
    gb_data(&b, 64, 13);
    expect_fault(&b, "gguf: tensor 'second' [");
    b = (gb){0};
    gb_header(&b, 3, 2, 0);
    gb_ti(&b, "first", 1, (uint64_t[]){16}, T_F32, 0);
    gb_ti(&b, "second", 1, (uint64_t[]){8}, T_F32, 32);
    gb_pad(&b, 32);
    gb_data(&b, 64, 13);
    ff_result r = ff_parse(&ckpt_format_gguf, b.p, b.len);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "overlaps tensor 'first'");
    free(b.p);
}

Test(gguf_format, duplicate_and_empty_names)
{
    gb b = {0};
    gb_header(&b, 3, 2, 0);
    gb_ti(&b, "same", 1, (uint64_t[]){4}, T_F32, 0);
    gb_ti(&b, "same", 1, (uint64_t[]){4}, T_F32, 32);
    gb_pad(&b, 32);
    gb_data(&b, 64, 14);
    expect_fault(&b, "gguf: tensor name 'same' appears twice");
    b = (gb){0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "", 1, (uint64_t[]){4}, T_F32, 0);
    gb_pad(&b, 32);
    gb_data(&b, 16, 14);
    expect_fault(&b, "gguf: tensor 0 has an empty name");
}

Test(gguf_format, name_with_control_bytes_is_quoted)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "bad\nname", 1, (uint64_t[]){4}, 99, 0);
    expect_fault(&b, "gguf: tensor 'bad\\x0aname' has unknown ggml type 99");
}

Test(gguf_format, data_section_past_eof)
{
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "t", 1, (uint64_t[]){0}, T_F32, 0);
    /* 24 + 8 + 1 + 4 + 8 + 4 + 8 = 57 bytes; the data would start at 64. */
    expect_fault(&b, "gguf: tensor data section starts at 64, past the end of the 57-byte file");
}

Test(gguf_format, zero_dim_that_overflows_in_c_order)
{
    /* 0 elements in all, but the packer multiplies the C-order shape
     * (1, 2^40, 2^40, 0) left to right and overflows before the zero. */
    gb b = {0};
    gb_header(&b, 3, 1, 0);
    gb_ti(&b, "zero", 4, (uint64_t[]){0, 1ull << 40, 1ull << 40, 1}, T_F32, 0);
    gb_pad(&b, 32);
    expect_fault(&b, "gguf: tensor 'zero': size of F32[0, 1099511627776, 1099511627776, 1] "
                     "overflows 64 bits");
}
