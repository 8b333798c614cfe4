/* The tensorizer parser (core/src/formats/tensorizer.c): real files from
 * tensorizer's TensorSerializer (tests/unit/gen_tensorizer_fixtures.py),
 * checked tensor by tensor against torch's bytes, the same files with
 * their index compacted, an encrypted one, and hand-made hostile files. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format_fixtures.h"
#include "formats/binary.h"

/* ------------------------------------------------------------ builder */

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

typedef struct tz_t {
    const char *name;
    const char *dtype; /* may hold a NUL: dtype_len says how long */
    size_t dtype_len;
    uint32_t ndim;
    uint32_t shape[4];
    uint64_t data_len;
    /* filled by tz_build: where fields landed, for patching */
    size_t idx_shape, idx_loc, hdr, hdr_dlen;
} tz_t;

/* A version-1 file as TensorSerializer lays it out, minus the reserved
 * slack in the index and with an empty hash block. */
static ff_buf tz_build(uint32_t version, uint8_t flags, uint64_t count, tz_t *t, size_t n)
{
    ff_buf b = {0};
    ff_put(&b, "|TZR|", 5);
    ff_le(&b, version, 4);
    uint8_t fl[32] = {flags};
    ff_put(&b, fl, 32);
    ff_le(&b, 0, 8);
    ff_le(&b, 0, 8);
    ff_le(&b, count, 8);
    size_t meta_len = 0;
    for (size_t i = 0; i < n; i++)
        meta_len += 2 + strlen(t[i].name) + 1 + 1 + t[i].dtype_len + 1 + 4 * t[i].ndim + 24;
    ff_le(&b, meta_len, 8);
    size_t at = b.len + meta_len;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(t[i].name);
        size_t hsize = 8 + 2 + 1 + 2 + nl + 1 + t[i].dtype_len + 1 + 4 * t[i].ndim + 2 + 1 + 8;
        ff_le(&b, nl, 2);
        ff_put(&b, t[i].name, nl);
        ff_le(&b, 2, 1);
        ff_le(&b, t[i].dtype_len, 1);
        ff_put(&b, t[i].dtype, t[i].dtype_len);
        ff_le(&b, t[i].ndim, 1);
        t[i].idx_shape = b.len;
        for (uint32_t d = 0; d < t[i].ndim; d++)
            ff_le(&b, t[i].shape[d], 4);
        t[i].idx_loc = b.len;
        ff_le(&b, at, 8);
        ff_le(&b, at + hsize, 8);
        ff_le(&b, t[i].data_len, 8);
        at += hsize + t[i].data_len;
    }
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(t[i].name);
        size_t hsize = 8 + 2 + 1 + 2 + nl + 1 + t[i].dtype_len + 1 + 4 * t[i].ndim + 2 + 1 + 8;
        t[i].hdr = b.len;
        ff_le(&b, hsize, 8);
        ff_le(&b, 0, 2);
        ff_le(&b, 2, 1);
        ff_le(&b, nl, 2);
        ff_put(&b, t[i].name, nl);
        ff_le(&b, t[i].dtype_len, 1);
        ff_put(&b, t[i].dtype, t[i].dtype_len);
        ff_le(&b, t[i].ndim, 1);
        for (uint32_t d = 0; d < t[i].ndim; d++)
            ff_le(&b, t[i].shape[d], 4);
        ff_le(&b, 1, 2); /* hash block: one byte, zero hashes */
        ff_le(&b, 0, 1);
        t[i].hdr_dlen = b.len;
        ff_le(&b, t[i].data_len, 8);
        uint8_t *d = malloc(t[i].data_len ? t[i].data_len : 1);
        cr_assert_not_null(d);
        tu_fill_pattern(d, t[i].data_len, (uint32_t)i + 1);
        ff_put(&b, d, t[i].data_len);
        free(d);
    }
    return b;
}

#define DT(s) s, sizeof s - 1

static ff_buf two_tensors(tz_t *t)
{
    t[0] = (tz_t){.name = "w", DT("<f4"), .ndim = 2, .shape = {2, 3}, .data_len = 24};
    t[1] = (tz_t){.name = "h", DT("<V2\0torch.bfloat16"), .ndim = 1, .shape = {5}, .data_len = 10};
    return tz_build(1, 0, 2, t, 2);
}

static void expect_fault(ff_buf *b, const char *fragment)
{
    ff_expect_fault(&ckpt_format_tensorizer, b->p, b->len, fragment);
    free(b->p);
}

/* ------------------------------------------------------------ real files */

Test(tensorizer_format, real_files_from_tensor_serializer, .timeout = 120)
{
    char *dir = tu_mkdtemp();
    char *small = tu_join(dir, "small");
    ff_generate("tests/unit/gen_tensorizer_fixtures.py", dir, small);
    ff_file files[16];
    size_t n = ff_manifest(dir, files, 16);
    cr_assert_geq(n, 5);
    int opaque = 0, compacted = 0;
    for (size_t i = 0; i < n; i++) {
        opaque += files[i].opaque;
        ff_file copy = files[i];
        ff_check_file(&ckpt_format_tensorizer, dir, &files[i]);
        /* The compacted copy must describe the same tensors. */
        char *p = tu_join(small, copy.name);
        if (access(p, R_OK) == 0) {
            ff_check_file(&ckpt_format_tensorizer, small, &copy);
            compacted++;
        }
        free(p);
    }
    cr_assert_eq(opaque, 1, "the generator writes one encrypted file");
    cr_assert_geq(compacted, 3);
    tu_rm_rf(dir);
    free(small);
    free(dir);
}

/* ------------------------------------------------------------ hand-made */

Test(tensorizer_format, sniff_by_magic)
{
    cr_assert(ckpt_format_tensorizer.sniff("m.tensors", (const uint8_t *)"|TZR|\1", 6, 6));
    cr_assert(ckpt_format_tensorizer.sniff("m.bin", (const uint8_t *)"|TZR|\1", 6, 6));
    cr_assert_not(ckpt_format_tensorizer.sniff("m.tensors", (const uint8_t *)"|TZX|", 5, 5));
    cr_assert_not(ckpt_format_tensorizer.sniff("m.tensors", (const uint8_t *)"|TZR", 4, 4));
    cr_assert_str_eq(ckpt_format_tensorizer.name, "tensorizer");
}

Test(tensorizer_format, hand_made_file)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    ff_result r = ff_parse(&ckpt_format_tensorizer, b.p, b.len);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 2);
    cr_assert_str_eq(r.l.t[0].name, "w");
    cr_assert_str_eq(r.l.t[0].dtype, "F32");
    cr_assert_eq(r.l.t[0].ndim, 2);
    cr_assert_eq(r.l.t[0].shape[1], 3);
    cr_assert_eq(r.l.t[0].offset, t[0].hdr_dlen + 8);
    cr_assert_str_eq(r.l.t[1].dtype, "BF16");
    cr_assert_eq(r.l.t[1].offset + r.l.t[1].nbytes, b.len);
    cr_assert_eq(r.l.header_bytes, r.l.t[0].offset);
    ff_layout_free(&r.l);
    free(b.p);
}

Test(tensorizer_format, encrypted_flag_keeps_file_opaque)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + 5, 4, 4); /* data version 4 with the encrypted flag */
    b.p[9] = 1;
    cr_assert_eq(ff_parse(&ckpt_format_tensorizer, b.p, b.len).rc, 1);
    put_le(b.p + 5, 3, 4); /* data version 3 always carries crypt info */
    b.p[9] = 0;
    cr_assert_eq(ff_parse(&ckpt_format_tensorizer, b.p, b.len).rc, 1);
    free(b.p);
}

Test(tensorizer_format, unknown_dtype_and_meta_tensor_are_left_out)
{
    tz_t t[3] = {
        {.name = "c", DT(">f4"), .ndim = 1, .shape = {2}, .data_len = 8},
        {.name = "hollow", DT("<f4"), .ndim = 2, .shape = {3, 4}, .data_len = 0},
        {.name = "kept", DT("<i8"), .ndim = 1, .shape = {2}, .data_len = 16},
    };
    ff_buf b = tz_build(4, 0, 3, t, 3);
    ff_result r = ff_parse(&ckpt_format_tensorizer, b.p, b.len);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1);
    cr_assert_str_eq(r.l.t[0].name, "kept");
    cr_assert_str_eq(r.l.t[0].dtype, "I64");
    ff_layout_free(&r.l);
    free(b.p);
}

Test(tensorizer_format, every_truncation_is_refused_cleanly)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    for (size_t n = 0; n < b.len; n++) {
        ff_result r = ff_parse(&ckpt_format_tensorizer, b.p, n);
        cr_assert_eq(r.rc, -EINVAL, "cut at %zu: rc %d", n, r.rc);
        tu_assert_contains(r.msg, "tensorizer: ");
        ff_layout_free(&r.l);
    }
    free(b.p);
}

/* ------------------------------------------------------------ hostile */

Test(tensorizer_format, absurd_tensor_count)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + 57, 1ull << 40, 8);
    expect_fault(&b, "tensorizer: tensor count 1099511627776 is absurd");
}

Test(tensorizer_format, metadata_length_past_eof)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + 65, 1ull << 33, 8);
    expect_fault(&b, "tensorizer: metadata length 8589934592 runs past the end");
}

Test(tensorizer_format, name_length_past_eof)
{
    tz_t t[1] = {{.name = "w", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4}};
    ff_buf b = tz_build(1, 0, 1, t, 1);
    put_le(b.p + 73, 60000, 2);
    expect_fault(&b, "tensorizer: metadata entry 0 runs past the end of the");
}

Test(tensorizer_format, entry_past_metadata_section)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    /* Shrink the index by one byte: the second entry no longer fits. */
    put_le(b.p + 65, (t[1].idx_loc + 24 - 73) - 1, 8);
    expect_fault(&b, "tensorizer: metadata entry 1 runs past the end of the metadata section");
}

Test(tensorizer_format, dims_overflow)
{
    tz_t t[1] = {{.name = "big",
                  DT("<f8"),
                  .ndim = 4,
                  .shape = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu},
                  .data_len = 8}};
    ff_buf b = tz_build(1, 0, 1, t, 1);
    expect_fault(&b, "tensorizer: tensor 'big': 8 data bytes, but its dtype and shape need more "
                     "than");
}

Test(tensorizer_format, size_mismatch)
{
    tz_t t[1] = {{.name = "w", DT("<f4"), .ndim = 1, .shape = {3}, .data_len = 8}};
    ff_buf b = tz_build(1, 0, 1, t, 1);
    expect_fault(&b, "tensorizer: tensor 'w': 8 data bytes, but its dtype and shape need 12");
}

Test(tensorizer_format, data_offset_past_eof)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + t[1].idx_loc + 8, 1u << 30, 8);
    expect_fault(&b, "tensorizer: tensor 'h': 10 data bytes at 1073741824 run past the end");
}

Test(tensorizer_format, data_length_wraps)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + t[1].idx_loc + 16, UINT64_MAX, 8);
    expect_fault(&b, "tensorizer: tensor 'h': 18446744073709551615 data bytes at");
}

Test(tensorizer_format, header_disagrees_with_index)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + t[1].hdr_dlen, 12, 8);
    expect_fault(&b, "tensorizer: tensor 'h': header says 12 data bytes, the index 10");
    b = two_tensors(t);
    put_le(b.p + t[0].idx_loc + 8, t[0].hdr + 30, 8);
    expect_fault(&b, "tensorizer: tensor 'w': header ends at");
    b = two_tensors(t);
    put_le(b.p + t[1].idx_shape, 6, 4);
    expect_fault(&b, "tensorizer: tensor 'h': header dtype or shape differs from the index");
}

Test(tensorizer_format, header_size_past_eof)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    put_le(b.p + t[1].hdr, 1u << 20, 8);
    expect_fault(&b, "tensorizer: tensor 'h': header of 1048576 bytes at");
}

Test(tensorizer_format, overlapping_tensors)
{
    /* "a" is a U8 run whose index and header are stretched to the end of
     * the file, so that it covers "b"'s header and data. */
    tz_t t[2] = {
        {.name = "a", DT("|u1"), .ndim = 1, .shape = {16}, .data_len = 16},
        {.name = "b", DT("<f4"), .ndim = 1, .shape = {2}, .data_len = 8},
    };
    ff_buf b = tz_build(1, 0, 2, t, 2);
    uint64_t a_data = t[0].hdr_dlen + 8;
    uint64_t stretched = b.len - a_data;
    put_le(b.p + t[0].idx_shape, stretched, 4);
    put_le(b.p + t[0].idx_loc + 16, stretched, 8);
    put_le(b.p + t[0].hdr_dlen - 7, stretched, 4); /* header shape: before hashes */
    put_le(b.p + t[0].hdr_dlen, stretched, 8);
    expect_fault(&b, "tensorizer: tensor 'b' [");
}

Test(tensorizer_format, unknown_flags_and_versions)
{
    tz_t t[2];
    ff_buf b = two_tensors(t);
    b.p[9] = 4;
    expect_fault(&b, "tensorizer: unknown feature flags 0x04");
    b = two_tensors(t);
    b.p[9] = 2;
    expect_fault(&b, "tensorizer: versioned-metadata flag in a data version 1 file");
    b = two_tensors(t);
    put_le(b.p + 5, 0, 4);
    expect_fault(&b, "tensorizer: unsupported data version 0");
    b = two_tensors(t);
    put_le(b.p + 5, 9, 4); /* a newer tensorizer: valid, kept opaque */
    cr_assert_eq(ff_parse(&ckpt_format_tensorizer, b.p, b.len).rc, 1);
    free(b.p);
}

Test(tensorizer_format, names)
{
    tz_t t[2] = {
        {.name = "\x1e[\"layers\",3,\"w\"]", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4},
        {.name = "\x1e{\"no\":1}", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4},
    };
    ff_buf b = tz_build(1, 0, 1, t, 1);
    ff_result r = ff_parse(&ckpt_format_tensorizer, b.p, b.len);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_str_eq(r.l.t[0].name, "layers.3.w");
    ff_layout_free(&r.l);
    free(b.p);
    b = tz_build(1, 0, 1, t + 1, 1);
    expect_fault(&b, "structured name is not a non-empty JSON array");

    tz_t d[2] = {
        {.name = "same", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4},
        {.name = "same", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4},
    };
    b = tz_build(1, 0, 2, d, 2);
    expect_fault(&b, "tensorizer: tensor name 'same' appears twice");
    tz_t e[1] = {{.name = "", DT("<f4"), .ndim = 1, .shape = {1}, .data_len = 4}};
    b = tz_build(1, 0, 1, e, 1);
    expect_fault(&b, "tensorizer: tensor 0 has an empty name");
}

Test(tensorizer_format, zero_dim_that_overflows_in_c_order)
{
    tz_t t[1] = {{.name = "zero",
                  DT("<f8"),
                  .ndim = 4,
                  .shape = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0},
                  .data_len = 0}};
    ff_buf b = tz_build(1, 0, 1, t, 1);
    expect_fault(&b, "tensorizer: tensor 'zero': 0 data bytes, but its dtype and shape need "
                     "more than");
}
