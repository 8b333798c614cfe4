/* The safetensors and npy header parsers: layouts of valid files, and one
 * test per fault with the exact return code and a telling part of the
 * message. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "testutil.h"

/* ------------------------------------------------------------ builders */

typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

/* 8-byte length, the JSON padded with spaces to a multiple of 8 as the
 * reference writer does, then data_len pattern bytes. */
static blob st_make(const char *json, size_t data_len)
{
    size_t jl = strlen(json);
    size_t hl = (jl + 7) / 8 * 8;
    blob b = {.len = 8 + hl + data_len};
    b.p = malloc(b.len);
    cr_assert_not_null(b.p);
    for (int i = 0; i < 8; i++)
        b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b.p + 8, json, jl);
    memset(b.p + 8 + jl, ' ', hl - jl);
    tu_fill_pattern(b.p + 8 + hl, data_len, 7);
    return b;
}

static uint64_t st_header_bytes(const blob *b)
{
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)b->p[i] << (8 * i);
    return 8 + n;
}

typedef struct result {
    int rc;
    uint64_t need;
    char msg[512];
    ingest_layout l;
} result;

static result st_parse(const blob *b)
{
    result r = {.need = 12345};
    r.rc = ingest_safetensors(b->p, b->len, b->len, &r.l, &r.need, r.msg, sizeof r.msg);
    return r;
}

/* Runs a header that must be refused and checks code and message. */
static void st_expect_fault(const char *json, size_t data_len, const char *fragment)
{
    blob b = st_make(json, data_len);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, -EINVAL, "rc %d for %s (msg: %s)", r.rc, json, r.msg);
    tu_assert_contains(r.msg, "safetensors header: ");
    tu_assert_contains(r.msg, fragment);
    cr_assert_eq(r.l.n, 0);
    cr_assert_null(r.l.t);
    free(b.p);
}

/* npy preamble for `major`, the dict padded with spaces and a newline so the
 * data starts on a 64-byte boundary as numpy writes it, then data_len bytes. */
static blob npy_make(int major, const char *dict, size_t data_len)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t dl = strlen(dict);
    size_t total = (prefix + dl + 1 + 63) / 64 * 64;
    size_t hl = total - prefix;
    blob b = {.len = total + data_len};
    b.p = malloc(b.len);
    cr_assert_not_null(b.p);
    memcpy(b.p, "\x93NUMPY", 6);
    b.p[6] = (uint8_t)major;
    b.p[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        b.p[8 + i] = (uint8_t)(hl >> (8 * i));
    memcpy(b.p + prefix, dict, dl);
    memset(b.p + prefix + dl, ' ', hl - dl - 1);
    b.p[total - 1] = '\n';
    tu_fill_pattern(b.p + total, data_len, 3);
    return b;
}

static result npy_parse(const blob *b)
{
    result r = {.need = 12345};
    r.rc = ingest_npy(b->p, b->len, b->len, "arr", &r.l, &r.need, r.msg, sizeof r.msg);
    return r;
}

static void npy_expect(int major, const char *dict, size_t data_len, int rc, const char *fragment)
{
    blob b = npy_make(major, dict, data_len);
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, rc, "rc %d, want %d for %s (msg: %s)", r.rc, rc, dict, r.msg);
    if (fragment)
        tu_assert_contains(r.msg, fragment);
    if (rc != 0) {
        cr_assert_eq(r.l.n, 0);
        cr_assert_null(r.l.t);
    }
    ingest_layout_free(&r.l);
    free(b.p);
}

/* ------------------------------------------------- safetensors: valid */

Test(safetensors, several_dtypes_sorted_by_offset)
{
    /* Listed out of order on purpose: the layout comes back sorted. */
    const char *json = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"d\":{\"dtype\":\"I64\",\"shape\":[1,1],\"data_offsets\":[33,41]},"
                       "\"c\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[32,33]},"
                       "\"e\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[41,44]}}";
    blob b = st_make(json, 44);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    uint64_t hb = st_header_bytes(&b);
    cr_assert_eq(hb, 8 + (strlen(json) + 7) / 8 * 8);
    cr_assert_eq(r.l.header_bytes, hb);
    cr_assert_eq(r.l.n, 5);

    static const struct {
        const char *name, *dtype;
        uint32_t ndim;
        uint64_t d0, off, nbytes;
    } want[] = {
        {"a", "F32", 2, 2, 0, 24}, {"b", "BF16", 1, 4, 24, 8},    {"c", "U8", 0, 0, 32, 1},
        {"d", "I64", 2, 1, 33, 8}, {"e", "F8_E4M3", 1, 3, 41, 3},
    };
    for (size_t i = 0; i < 5; i++) {
        const ingest_tensor *t = &r.l.t[i];
        cr_assert_str_eq(t->name, want[i].name);
        cr_assert_str_eq(t->dtype, want[i].dtype);
        cr_assert_eq(t->ndim, want[i].ndim, "%s ndim", t->name);
        if (t->ndim)
            cr_assert_eq(t->shape[0], want[i].d0);
        cr_assert_eq(t->offset, hb + want[i].off, "%s offset", t->name);
        cr_assert_eq(t->nbytes, want[i].nbytes, "%s nbytes", t->name);
    }
    cr_assert_eq(r.l.t[0].shape[1], 3);
    cr_assert_eq(r.l.t[4].offset + r.l.t[4].nbytes, b.len);
    ingest_layout_free(&r.l);
    cr_assert_eq(r.l.n, 0);
    cr_assert_null(r.l.t);
    free(b.p);
}

Test(safetensors, metadata_is_not_a_tensor)
{
    blob b = st_make("{\"__metadata__\":{\"format\":\"pt\",\"note\":\"\"},"
                     "\"w\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}",
                     8);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1);
    cr_assert_str_eq(r.l.t[0].name, "w");
    cr_assert_eq(r.l.t[0].offset, st_header_bytes(&b));
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(safetensors, zero_tensors)
{
    const char *headers[] = {"{}", "{\"__metadata__\":{}}"};
    for (size_t i = 0; i < 2; i++) {
        blob b = st_make(headers[i], 0);
        result r = st_parse(&b);
        cr_assert_eq(r.rc, 0, "%s: %s", headers[i], r.msg);
        cr_assert_eq(r.l.n, 0);
        cr_assert_eq(r.l.header_bytes, b.len);
        ingest_layout_free(&r.l);
        free(b.p);
    }
}

Test(safetensors, empty_tensors_share_an_offset)
{
    blob b = st_make("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                     "\"y\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                     "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     8);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 4);
    /* Ties on offset are broken by end, then by name. */
    cr_assert_str_eq(r.l.t[0].name, "a");
    cr_assert_str_eq(r.l.t[1].name, "y");
    cr_assert_str_eq(r.l.t[2].name, "z");
    cr_assert_str_eq(r.l.t[3].name, "b");
    cr_assert_eq(r.l.t[2].nbytes, 0);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(safetensors, whitespace_padding_and_unknown_fields_are_accepted)
{
    blob b = st_make("{\"w\":{\"dtype\":\"U16\",\"shape\":[3],\"data_offsets\":[0,6],"
                     "\"extra\":1}}  \n",
                     6);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(safetensors, asks_for_more_bytes)
{
    blob b = st_make("{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    uint64_t hb = st_header_bytes(&b);
    ingest_layout l;
    uint64_t need = 0;
    char msg[256];

    cr_assert_eq(ingest_safetensors(b.p, 5, b.len, &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, 8);
    cr_assert_eq(ingest_safetensors(b.p, 8, b.len, &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, hb);
    cr_assert_eq(ingest_safetensors(b.p, (size_t)hb - 1, b.len, &l, &need, msg, sizeof msg),
                 -EAGAIN);
    cr_assert_eq(need, hb);
    /* Exactly the header is enough: the data itself is never read. */
    cr_assert_eq(ingest_safetensors(b.p, (size_t)hb, b.len, &l, &need, msg, sizeof msg), 0, "%s",
                 msg);
    cr_assert_eq(l.n, 1);
    ingest_layout_free(&l);
    free(b.p);
}

/* ------------------------------------------------ safetensors: faults */

Test(safetensors, file_shorter_than_length_field)
{
    uint8_t buf[5] = {1, 0, 0, 0, 0};
    ingest_layout l;
    uint64_t need = 0;
    char msg[256];
    cr_assert_eq(ingest_safetensors(buf, sizeof buf, sizeof buf, &l, &need, msg, sizeof msg),
                 -EINVAL);
    tu_assert_contains(msg, "too short");
}

Test(safetensors, header_too_large)
{
    blob b = st_make("{}", 0);
    uint64_t n = CKPT_SAFETENSORS_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++)
        b.p[i] = (uint8_t)(n >> (8 * i));
    result r = st_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "header length 100000001 exceeds the limit");
    free(b.p);
}

Test(safetensors, header_past_eof)
{
    blob b = st_make("{}", 0);
    b.p[0] = 200; /* the file holds 8 bytes of header, not 200 */
    result r = st_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "header length 200 runs past the end of the 16-byte file");
    free(b.p);
}

Test(safetensors, not_json)
{
    st_expect_fault("{\"a\": nope}", 0, "invalid JSON");
}

/* Found by fuzzing: jansson's message quotes the bad token, here a raw
 * newline inside a key; ours must stay one printable line. */
Test(safetensors, invalid_json_message_is_one_line)
{
    blob b = st_make("{\"e.emp\\\n\\ty\":{}}", 0);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "safetensors header: invalid JSON at byte ");
    for (const char *c = r.msg; *c; c++)
        cr_assert(*c >= 0x20 && *c != 0x7f, "control byte 0x%02x in \"%s\"", (unsigned char)*c,
                  r.msg);
    tu_assert_contains(r.msg, "near '\"e.emp\\?'");
    free(b.p);
}

Test(safetensors, not_starting_with_brace)
{
    st_expect_fault(" {}", 0, "does not start with '{'");
    st_expect_fault("[1, 2]", 0, "does not start with '{'");
}

Test(safetensors, trailing_garbage_in_header)
{
    st_expect_fault("{} x", 0, "invalid JSON");
}

Test(safetensors, duplicate_key)
{
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                    2, "duplicate");
}

Test(safetensors, unknown_dtype)
{
    st_expect_fault("{\"w\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16,
                    "tensor 'w': unknown dtype 'F128'");
    st_expect_fault("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                    "unknown dtype 'f32'");
}

Test(safetensors, missing_or_mistyped_fields)
{
    st_expect_fault("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'w': no dtype");
    st_expect_fault("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                    "dtype is not a string");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "no shape");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
                    "shape is not an array");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "no data_offsets");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
                    "data_offsets is not a pair");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
                    "data_offsets is not a pair");
    st_expect_fault("{\"w\":[1,2]}", 0, "tensor 'w' is not an object");
}

Test(safetensors, negative_shape)
{
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-3],\"data_offsets\":[0,6]}}", 6,
                    "tensor 'w': shape[1] is -3, not a non-negative integer");
}

Test(safetensors, non_integer_shape)
{
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2,
                    "tensor 'w': shape[0] is not an integer");
    st_expect_fault("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2,
                    "shape[0] is not an integer");
}

Test(safetensors, too_many_dimensions)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
             "1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}");
    st_expect_fault(json, 1, "shape has 33 dimensions, more than 32");
}

Test(safetensors, offsets_overlap)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
                    12,
                    "tensor 'b': data_offsets [4, 12] overlap the previous tensor, which "
                    "ends at 8");
}

Test(safetensors, offsets_gap)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[12,20]}}",
                    20, "gap of 4 bytes before tensor 'b'");
}

Test(safetensors, offsets_not_starting_at_zero)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}", 12,
                    "must start at offset 0, but the first tensor 'a' starts at 4");
}

Test(safetensors, offsets_reversed)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
                    "data_offsets [8, 0] end before they begin");
}

Test(safetensors, trailing_bytes)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 11,
                    "3 trailing bytes after the last tensor");
    st_expect_fault("{}", 1, "1 trailing bytes after the last tensor");
}

Test(safetensors, data_truncated)
{
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 5,
                    "tensor 'a': data_offsets [0, 8] run past the end of the file, which "
                    "holds 5 bytes of data");
}

Test(safetensors, size_mismatch)
{
    st_expect_fault("{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10,
                    "safetensors header: tensor 'x': data_offsets [0, 10] hold 10 bytes but "
                    "BF16[3] needs 6");
}

Test(safetensors, shape_overflow)
{
    st_expect_fault("{\"x\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776],"
                    "\"data_offsets\":[0,0]}}",
                    0, "tensor 'x': size of U8[1099511627776, 1099511627776] overflows 64 bits");
    /* The element count fits but the byte count does not. */
    st_expect_fault("{\"x\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                    "\"data_offsets\":[0,0]}}",
                    0, "overflows 64 bits");
}

Test(safetensors, zero_dimension_before_huge_ones_does_not_overflow)
{
    /* As in the reference: the running product is zero once a zero is seen. */
    blob b = st_make("{\"x\":{\"dtype\":\"U8\",\"shape\":[0,1099511627776,1099511627776],"
                     "\"data_offsets\":[0,0]}}",
                     0);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.t[0].nbytes, 0);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(safetensors, bad_metadata)
{
    st_expect_fault("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
    st_expect_fault("{\"__metadata__\":{\"k\":1}}", 0,
                    "__metadata__ value for 'k' is not a string");
}

Test(safetensors, empty_name)
{
    st_expect_fault("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                    "empty name");
}

Test(safetensors, nul_in_name_refused)
{
    blob b = st_make("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    result r = st_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    cr_assert(r.msg[0]);
    free(b.p);
}

Test(safetensors, control_bytes_in_name_are_escaped_in_messages)
{
    st_expect_fault("{\"a\\nb\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
                    "tensor 'a\\x0ab'");
}

Test(safetensors, invalid_utf8_refused)
{
    st_expect_fault("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                    "invalid JSON");
}

Test(safetensors, frees_partial_results_on_late_fault)
{
    /* Several good tensors, then a bad one: nothing may leak (ASan build). */
    st_expect_fault("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                    "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,4]}}",
                    4, "tensor 'c'");
}

/* ----------------------------------------------------------- npy: valid */

Test(npy, v1_float32_matrix)
{
    blob b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48);
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1);
    /* 71 bytes of header round up to 128, as numpy writes it. */
    cr_assert_eq(r.l.header_bytes, 128);
    const ingest_tensor *t = &r.l.t[0];
    cr_assert_str_eq(t->name, "arr");
    cr_assert_str_eq(t->dtype, "F32");
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 3);
    cr_assert_eq(t->shape[1], 4);
    cr_assert_eq(t->offset, 128);
    cr_assert_eq(t->nbytes, 48);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(npy, v2_and_v3)
{
    blob b = npy_make(2, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", 40);
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_str_eq(r.l.t[0].dtype, "I64");
    cr_assert_eq(r.l.t[0].ndim, 1);
    cr_assert_eq(r.l.t[0].shape[0], 5);
    cr_assert_eq(r.l.t[0].offset, 128);
    ingest_layout_free(&r.l);
    free(b.p);

    b = npy_make(3, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), }", 8);
    r = npy_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_str_eq(r.l.t[0].dtype, "U8");
    cr_assert_eq(r.l.t[0].ndim, 3);
    cr_assert_eq(r.l.t[0].nbytes, 8);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(npy, every_mapped_descr)
{
    static const struct {
        const char *descr, *dtype;
        size_t size;
    } cases[] = {
        {"|b1", "BOOL", 1}, {"|i1", "I8", 1},  {"|u1", "U8", 1},  {"<i2", "I16", 2},
        {"<u2", "U16", 2},  {"<f2", "F16", 2}, {"<i4", "I32", 4}, {"<u4", "U32", 4},
        {"<f4", "F32", 4},  {"<i8", "I64", 8}, {"<u8", "U64", 8}, {"<f8", "F64", 8},
        {"=f4", "F32", 4},  {"|f8", "F64", 8}, {">u1", "U8", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (7,), }",
                 cases[i].descr);
        blob b = npy_make(1, dict, 7 * cases[i].size);
        result r = npy_parse(&b);
        cr_assert_eq(r.rc, 0, "%s: %s", cases[i].descr, r.msg);
        cr_assert_str_eq(r.l.t[0].dtype, cases[i].dtype, "%s", cases[i].descr);
        cr_assert_eq(r.l.t[0].nbytes, 7 * cases[i].size);
        ingest_layout_free(&r.l);
        free(b.p);
    }
}

Test(npy, scalar_and_empty_shapes)
{
    blob b = npy_make(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 8);
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.t[0].ndim, 0);
    cr_assert_eq(r.l.t[0].nbytes, 8);
    ingest_layout_free(&r.l);
    free(b.p);

    b = npy_make(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 3), }", 0);
    r = npy_parse(&b);
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.t[0].nbytes, 0);
    cr_assert_eq(r.l.t[0].offset, b.len);
    ingest_layout_free(&r.l);
    free(b.p);
}

Test(npy, keys_in_any_order_and_either_quote)
{
    npy_expect(1, "{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<f4\"}", 24, 0, NULL);
    npy_expect(1, "{ 'fortran_order' : False ,\n 'shape' : ( 2 , 3 , ) , 'descr' : '<i4' }", 24, 0,
               NULL);
    /* Headers written by Python 2 may spell integers as longs. */
    npy_expect(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 24, 0, NULL);
}

Test(npy, asks_for_more_bytes)
{
    blob b = npy_make(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16);
    ingest_layout l;
    uint64_t need = 0;
    char msg[256];
    cr_assert_eq(ingest_npy(b.p, 3, b.len, "x", &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, 8);
    cr_assert_eq(ingest_npy(b.p, 9, b.len, "x", &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, 12);
    cr_assert_eq(ingest_npy(b.p, 12, b.len, "x", &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, 128);
    cr_assert_eq(ingest_npy(b.p, 127, b.len, "x", &l, &need, msg, sizeof msg), -EAGAIN);
    cr_assert_eq(need, 128);
    cr_assert_eq(ingest_npy(b.p, 128, b.len, "x", &l, &need, msg, sizeof msg), 0, "%s", msg);
    cr_assert_str_eq(l.t[0].name, "x");
    ingest_layout_free(&l);
    free(b.p);
}

/* ----------------------------------------------- npy: stored as opaque */

Test(npy, fortran_order_is_opaque)
{
    npy_expect(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", 48, 1, NULL);
}

Test(npy, big_endian_is_opaque)
{
    npy_expect(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", 48, 1, NULL);
    npy_expect(1, "{'descr': '>i2', 'fortran_order': False, 'shape': (3,), }", 6, 1, NULL);
}

Test(npy, other_descrs_are_opaque)
{
    npy_expect(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, 1, NULL);
    npy_expect(1, "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, 1, NULL);
    npy_expect(1, "{'descr': '<U5', 'fortran_order': False, 'shape': (2,), }", 40, 1, NULL);
    npy_expect(1, "{'descr': '<f16', 'fortran_order': False, 'shape': (1,), }", 16, 1, NULL);
    npy_expect(1,
               "{'descr': [('a', '<f4'), ('b', '<i4', (2,)), ('c', [('d', '|u1')])], "
               "'fortran_order': False, 'shape': (3,), }",
               39, 1, NULL);
}

/* ------------------------------------------------------------ npy: faults */

Test(npy, truncated_data)
{
    npy_expect(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 40, -EINVAL,
               "npy data is 40 bytes but shape (3, 4) <f4 needs 48");
    npy_expect(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 0, -EINVAL,
               "npy data is 0 bytes but shape (5,) <f4 needs 20");
}

Test(npy, trailing_data)
{
    npy_expect(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 5, -EINVAL,
               "npy data is 5 bytes but shape (4,) |u1 needs 4");
}

Test(npy, bad_magic)
{
    blob b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    b.p[1] = 'n';
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "npy header: bad magic");
    free(b.p);
}

Test(npy, unsupported_version)
{
    blob b = npy_make(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    b.p[6] = 4;
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "unsupported format version 4.0");
    free(b.p);
}

Test(npy, header_past_eof)
{
    blob b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    b.p[8] = 0xff;
    b.p[9] = 0x7f;
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "header length 32767 runs past the end of the 132-byte file");
    free(b.p);
}

Test(npy, too_short)
{
    uint8_t buf[9] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0};
    ingest_layout l;
    uint64_t need;
    char msg[128];
    cr_assert_eq(ingest_npy(buf, 9, 9, "x", &l, &need, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "too short");
    cr_assert_eq(ingest_npy(buf, 5, 5, "x", &l, &need, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "too short");
}

Test(npy, bad_dict)
{
    static const struct {
        const char *dict, *fragment;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False}", "no 'shape' key"},
        {"{'descr': '<f4', 'shape': (1,)}", "no 'fortran_order' key"},
        {"{'fortran_order': False, 'shape': (1,)}", "no 'descr' key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "unknown key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
         "duplicate key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "shape is not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "shape is not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
         "expected a non-negative integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
         "integer too large"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
         "fortran_order is not True or False"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}",
         "fortran_order is not True or False"},
        {"{'descr': 4, 'fortran_order': False, 'shape': (1,)}", "descr is neither"},
        {"{'descr': '<f4 , 'fortran_order': False, 'shape': (1,)}", "bad dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} extra", "unexpected text"},
        {"['descr', '<f4']", "header is not a dict"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", "expected ',' or ')'"},
        {"{'descr': [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['a']]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "
         "'fortran_order': False, 'shape': (1,)}",
         "nested too deeply"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        blob b = npy_make(1, cases[i].dict, 4);
        result r = npy_parse(&b);
        cr_assert_eq(r.rc, -EINVAL, "rc %d for %s", r.rc, cases[i].dict);
        tu_assert_contains(r.msg, "npy header: bad dict: ");
        tu_assert_contains(r.msg, cases[i].fragment);
        free(b.p);
    }
}

Test(npy, nul_in_header_refused)
{
    blob b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    b.p[60] = '\0'; /* inside the space padding */
    result r = npy_parse(&b);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "bad dict");
    free(b.p);
}

Test(npy, shape_overflow)
{
    npy_expect(1,
               "{'descr': '<f8', 'fortran_order': False, "
               "'shape': (4294967296, 4294967296), }",
               0, -EINVAL, "overflows 64 bits");
}

Test(npy, empty_name_refused)
{
    blob b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
    ingest_layout l;
    uint64_t need;
    char msg[128];
    cr_assert_eq(ingest_npy(b.p, b.len, b.len, "", &l, &need, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "no tensor name");
    free(b.p);
}

Test(layout, free_is_idempotent)
{
    ingest_layout l;
    memset(&l, 0, sizeof l);
    ingest_layout_free(&l);
    ingest_layout_free(&l);
    ingest_layout_free(NULL);
}
