/* CoreWeave tensorizer `.tensors` files (PyPI tensorizer, data versions 1-5,
 * as serialization.py of 2.12.1 writes and reads them): where each tensor's
 * bytes lie. tensorizer never compresses, so grouping these bytes by dtype
 * is where packing gains.
 *
 * Layout (all little-endian):
 *   "|TZR|" u32 version, 32 bytes of feature flags (bit 0 encrypted, bit 1
 *   versioned metadata), u64 tensor bytes (unused), 8 bytes unused,
 *   u64 tensor count
 *   u64 metadata length, then that many bytes (the writer reserves 256 KiB):
 *     per tensor: [u32 entry version, when versioned] u16 name length, name,
 *     u8 type, u8 dtype length, dtype, u8 ndim, shape as u32 (u64 from entry
 *     version 5), u64 header offset, u64 data offset, u64 data length
 *   per tensor, at its header offset:
 *     u64 header size, u16 module index, u8 type, u16 name length, name,
 *     u8 dtype length, dtype, u8 ndim, shape, u16 hash bytes, hashes,
 *     [u64 crypt-info length and crypt info, in encrypted files],
 *     i64 data length (the header's last 8 bytes), then the data.
 * A name is UTF-8, or 0x1E and a JSON array of keys and indices for nested
 * state dicts: that becomes a dotted name ("layers.0.weight").
 * dtype is numpy's dtype.str ("<f4"); types numpy lacks are written as
 * "<V2" NUL "torch.bfloat16".
 *
 * Every tensor's header is read and must agree with its index entry.
 * Encrypted files (data version 3, or the encrypted flag) are checked as
 * far as the index and then kept opaque (describe returns 1). Tensors whose
 * dtype has no safetensors name, big-endian ones, and meta tensors (shape
 * but no data) are left out: their bytes stay opaque. complex64/128/32
 * become regions of F32/F64/F16. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binary.h"
#include "binread.h"
#include "common.h"
#include "formats.h"

#define TZR_MAGIC "|TZR|"
#define TZR_FILE_HEADER_BYTES 65u /* magic, version, flags, 3 x u64 */
#define TZR_MAX_VERSION 5u
#define TZR_FLAG_ENCRYPTED 1u
#define TZR_FLAG_VERSIONED 2u
#define TZR_MAX_TENSORS (1u << 20)
#define TZR_MIN_ENTRY_BYTES 29u /* empty name and dtype, no dims, 3 x u64 */
#define TZR_MAX_NDIM 255u       /* a u8 on disk; more than CKPT_MAX_NDIM is refused */
#define TZR_MAX_NAME 65535u
#define TZR_MAX_DTYPE 255u

/* One index entry, checked against its per-tensor header. */
typedef struct tzr_entry {
    char *raw_name; /* as on disk, NUL-terminated */
    size_t raw_len;
    uint8_t type;
    char dtype[TZR_MAX_DTYPE + 1];
    size_t dtype_len;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_NDIM];
    bool long_shape;
    uint64_t header_off, data_off, data_len;
} tzr_entry;

typedef struct tzr_parse {
    binread r;
    char *msg;
    size_t msg_len;
    int rc;
} tzr_parse;

static bool fail(tzr_parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool fail(tzr_parse *p, const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    binread_msg(p->msg, p->msg_len, "tensorizer: %s", text);
    if (!p->rc)
        p->rc = -EINVAL;
    return false;
}

static bool fail_read(tzr_parse *p, const char *what)
{
    if (p->r.err == -EINVAL)
        return fail(p, "%s runs past the end of the %llu-byte file", what,
                    (unsigned long long)p->r.src->size);
    p->rc = p->r.err;
    binread_msg(p->msg, p->msg_len, "tensorizer: read failed in %s: %s", what, strerror(-p->r.err));
    return false;
}

static bool oom(tzr_parse *p)
{
    p->rc = -ENOMEM;
    binread_msg(p->msg, p->msg_len, "tensorizer: out of memory");
    return false;
}

/* How a dtype string maps to packing: a tensor dtype, or a region dtype
 * whose elements are `elem` bytes on disk (complex numbers). */
typedef struct tzr_dtype {
    const char *code;
    size_t code_len;
    const char *dtype;
    unsigned elem;
    bool region;
} tzr_dtype;

#define TZR_DT(code, dtype, elem, region)                                                          \
    {                                                                                              \
        code, sizeof code - 1, dtype, elem, region                                                 \
    }
static const tzr_dtype tzr_dtypes[] = {
    TZR_DT("<f4", "F32", 4, false),
    TZR_DT("<f2", "F16", 2, false),
    TZR_DT("<f8", "F64", 8, false),
    TZR_DT("<i8", "I64", 8, false),
    TZR_DT("<i4", "I32", 4, false),
    TZR_DT("<i2", "I16", 2, false),
    TZR_DT("|i1", "I8", 1, false),
    TZR_DT("|u1", "U8", 1, false),
    TZR_DT("<u2", "U16", 2, false),
    TZR_DT("<u4", "U32", 4, false),
    TZR_DT("<u8", "U64", 8, false),
    TZR_DT("|b1", "BOOL", 1, false),
    TZR_DT("<V2\0torch.bfloat16", "BF16", 2, false),
    TZR_DT("|V1\0torch.float8_e5m2", "F8_E5M2", 1, false),
    TZR_DT("|V1\0torch.float8_e4m3fn", "F8_E4M3", 1, false),
    TZR_DT("<c8", "F32", 8, true),
    TZR_DT("<c16", "F64", 16, true),
    TZR_DT("<V4\0torch.complex32", "F16", 4, true),
};

static const tzr_dtype *tzr_dtype_lookup(const char *code, size_t len)
{
    for (size_t i = 0; i < sizeof tzr_dtypes / sizeof tzr_dtypes[0]; i++)
        if (tzr_dtypes[i].code_len == len && memcmp(tzr_dtypes[i].code, code, len) == 0)
            return &tzr_dtypes[i];
    return NULL;
}

/* name, type, dtype and shape, as both the index and the tensor header hold
 * them: the index has the type after the name, the header before it. */
static bool read_name_dtype_shape(tzr_parse *p, tzr_entry *e, bool type_first, const char *what)
{
    if (type_first && !binread_u8(&p->r, &e->type))
        return fail_read(p, what);
    uint16_t nlen;
    if (!binread_u16(&p->r, &nlen))
        return fail_read(p, what);
    e->raw_name = malloc((size_t)nlen + 1);
    if (!e->raw_name)
        return oom(p);
    if (!binread_bytes(&p->r, e->raw_name, nlen))
        return fail_read(p, what);
    e->raw_name[nlen] = '\0';
    e->raw_len = nlen;
    if (!type_first && !binread_u8(&p->r, &e->type))
        return fail_read(p, what);
    uint8_t dlen, ndim;
    if (!binread_u8(&p->r, &dlen) || !binread_bytes(&p->r, e->dtype, dlen))
        return fail_read(p, what);
    e->dtype[dlen] = '\0';
    e->dtype_len = dlen;
    if (!binread_u8(&p->r, &ndim))
        return fail_read(p, what);
    e->ndim = ndim;
    for (unsigned d = 0; d < ndim; d++) {
        uint64_t v = 0;
        if (e->long_shape) {
            if (!binread_u64(&p->r, &v))
                return fail_read(p, what);
        } else {
            uint32_t v32;
            if (!binread_u32(&p->r, &v32))
                return fail_read(p, what);
            v = v32;
        }
        if (d < CKPT_MAX_NDIM)
            e->shape[d] = v;
    }
    return true;
}

/* The dotted name of a JSON-seq path, or a copy of a plain name; NULL with
 * a message when the name cannot be a tensor name. */
static char *tensor_name(tzr_parse *p, const tzr_entry *e, size_t index)
{
    char q[BINREAD_QUOTE_BUF];
    binread_quote(q, sizeof q, e->raw_name, e->raw_len);
    if (e->raw_len == 0) {
        fail(p, "tensor %zu has an empty name", index);
        return NULL;
    }
    if (strlen(e->raw_name) != e->raw_len) {
        fail(p, "tensor '%s': name contains a NUL byte", q);
        return NULL;
    }
    if ((unsigned char)e->raw_name[0] != 0x1E) {
        char *copy = strdup(e->raw_name);
        if (!copy)
            oom(p);
        return copy;
    }
    if (e->type != 2) {
        fail(p, "tensor '%s': a structured name outside a state dict (type %u)", q, e->type);
        return NULL;
    }
    json_error_t jerr;
    json_t *path = json_loadb(e->raw_name + 1, e->raw_len - 1, 0, &jerr);
    if (!json_is_array(path) || json_array_size(path) == 0) {
        json_decref(path);
        fail(p, "tensor '%s': structured name is not a non-empty JSON array", q);
        return NULL;
    }
    /* Dotted text is never longer than the JSON it came from, except that
     * escapes like \u00e9 shrink and integers stay the same. */
    size_t cap = e->raw_len + 1, o = 0;
    char *out = malloc(cap);
    if (!out) {
        json_decref(path);
        oom(p);
        return NULL;
    }
    size_t i;
    json_t *item;
    json_array_foreach(path, i, item)
    {
        char num[24];
        const char *s;
        size_t n;
        if (json_is_string(item)) {
            s = json_string_value(item);
            n = json_string_length(item);
            if (strlen(s) != n) {
                free(out);
                json_decref(path);
                fail(p, "tensor '%s': structured name holds a NUL byte", q);
                return NULL;
            }
        } else if (json_is_integer(item) && json_integer_value(item) >= 0) {
            n = (size_t)snprintf(num, sizeof num, "%lld", (long long)json_integer_value(item));
            s = num;
        } else {
            free(out);
            json_decref(path);
            fail(p, "tensor '%s': structured name part %zu is not a key or an index", q, i);
            return NULL;
        }
        if (o + n + 2 > cap) { /* cannot happen for valid UTF-8 JSON; stay safe */
            char *bigger = realloc(out, o + n + 2);
            if (!bigger) {
                free(out);
                json_decref(path);
                oom(p);
                return NULL;
            }
            out = bigger;
            cap = o + n + 2;
        }
        if (i > 0)
            out[o++] = '.';
        memcpy(out + o, s, n);
        o += n;
    }
    out[o] = '\0';
    json_decref(path);
    return out;
}

/* Reads one index entry at the cursor. */
static bool read_entry(tzr_parse *p, size_t index, bool versioned, uint64_t meta_end, tzr_entry *e)
{
    char what[64];
    snprintf(what, sizeof what, "metadata entry %zu", index);
    if (versioned) {
        uint32_t v;
        if (!binread_u32(&p->r, &v))
            return fail_read(p, what);
        if (v != 1 && v != 5)
            return fail(p, "metadata entry %zu has unsupported version %u", index, v);
        e->long_shape = v >= 5;
    }
    if (!read_name_dtype_shape(p, e, false, what))
        return false;
    if (!binread_u64(&p->r, &e->header_off) || !binread_u64(&p->r, &e->data_off) ||
        !binread_u64(&p->r, &e->data_len))
        return fail_read(p, what);
    if (p->r.pos > meta_end)
        return fail(p, "metadata entry %zu runs past the end of the metadata section (%llu)", index,
                    (unsigned long long)meta_end);
    return true;
}

/* Reads the tensor header at e->header_off and checks it against e. */
static bool check_header(tzr_parse *p, size_t index, bool crypt_info, const tzr_entry *e,
                         const char *qname)
{
    char what[BINREAD_QUOTE_BUF + 48];
    snprintf(what, sizeof what, "header of tensor '%s'", qname);
    uint64_t hsize;
    if (!binread_seek(&p->r, e->header_off) || !binread_u64(&p->r, &hsize))
        return fail_read(p, what);
    uint64_t hend;
    if (__builtin_add_overflow(e->header_off, hsize, &hend) || hend > p->r.src->size)
        return fail(p,
                    "tensor '%s': header of %llu bytes at %llu runs past the end of the "
                    "%llu-byte file",
                    qname, (unsigned long long)hsize, (unsigned long long)e->header_off,
                    (unsigned long long)p->r.src->size);
    if (hend != e->data_off)
        return fail(p, "tensor '%s': header ends at %llu but the index puts its data at %llu",
                    qname, (unsigned long long)hend, (unsigned long long)e->data_off);
    uint16_t module;
    tzr_entry h;
    memset(&h, 0, sizeof h);
    h.long_shape = e->long_shape;
    bool ok = binread_u16(&p->r, &module) || fail_read(p, what);
    ok = ok && read_name_dtype_shape(p, &h, true, what);
    uint16_t hash_len;
    ok = ok &&
         ((binread_u16(&p->r, &hash_len) && binread_skip(&p->r, hash_len)) || fail_read(p, what));
    if (ok && crypt_info) {
        uint64_t clen;
        ok = (binread_u64(&p->r, &clen) && binread_skip(&p->r, clen)) || fail_read(p, what);
    }
    uint64_t dlen = 0;
    if (ok && (p->r.pos > hend || hend - p->r.pos < 8))
        ok = fail(p, "tensor '%s': header fields run past its %llu-byte header size", qname,
                  (unsigned long long)hsize);
    ok = ok && ((binread_seek(&p->r, hend - 8) && binread_u64(&p->r, &dlen)) || fail_read(p, what));
    if (ok && (h.raw_len != e->raw_len || memcmp(h.raw_name, e->raw_name, e->raw_len) != 0 ||
               h.type != e->type))
        ok = fail(p, "tensor %zu: header name or type differs from the index ('%s')", index, qname);
    if (ok && (h.dtype_len != e->dtype_len || memcmp(h.dtype, e->dtype, e->dtype_len) != 0 ||
               h.ndim != e->ndim ||
               memcmp(h.shape, e->shape,
                      sizeof h.shape[0] * (e->ndim < CKPT_MAX_NDIM ? e->ndim : CKPT_MAX_NDIM))))
        ok = fail(p, "tensor '%s': header dtype or shape differs from the index", qname);
    if (ok && dlen != e->data_len)
        ok = fail(p, "tensor '%s': header says %lld data bytes, the index %llu", qname,
                  (long long)dlen, (unsigned long long)e->data_len);
    free(h.raw_name);
    return ok;
}

/* Adds entry e to out as a tensor or region, or leaves it out. */
static bool add_entry(tzr_parse *p, tzr_entry *e, char *name, const char *qname, ingest_layout *out,
                      size_t *cap_t, size_t *cap_r)
{
    const tzr_dtype *dt = tzr_dtype_lookup(e->dtype, e->dtype_len);
    if (!dt || e->ndim > CKPT_MAX_NDIM) {
        free(name); /* left out: its bytes stay opaque */
        return true;
    }
    uint64_t numel = 1, nbytes;
    bool over = false;
    for (uint32_t d = 0; d < e->ndim; d++)
        over |= __builtin_mul_overflow(numel, e->shape[d], &numel);
    over |= __builtin_mul_overflow(numel, (uint64_t)dt->elem, &nbytes);
    if (!over && e->data_len == 0 && nbytes != 0) {
        free(name); /* a meta tensor: shape only, read back as zeros */
        return true;
    }
    /* The packer sizes tensors with ckpt_tensor_bytes, whose order of
     * multiplication may overflow on a shape holding a zero. */
    uint64_t check;
    if (!over && !dt->region)
        over = ckpt_tensor_bytes(dt->dtype, e->ndim, e->shape, &check) != 0 || check != nbytes;
    if (over || nbytes != e->data_len) {
        free(name);
        return fail(p, "tensor '%s': %llu data bytes, but its dtype and shape need %s%llu", qname,
                    (unsigned long long)e->data_len, over ? "more than " : "",
                    over ? (unsigned long long)UINT64_MAX : (unsigned long long)nbytes);
    }
    if (dt->region) {
        free(name);
        if (grow_array((void **)&out->regions, cap_r, out->n_regions, sizeof *out->regions))
            return oom(p);
        ingest_region *g = &out->regions[out->n_regions++];
        g->offset = e->data_off;
        g->length = e->data_len;
        snprintf(g->dtype, sizeof g->dtype, "%s", dt->dtype);
        return true;
    }
    if (grow_array((void **)&out->t, cap_t, out->n, sizeof *out->t)) {
        free(name);
        return oom(p);
    }
    ingest_tensor *t = &out->t[out->n++];
    memset(t, 0, sizeof *t);
    t->name = name;
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->dtype);
    t->ndim = e->ndim;
    memcpy(t->shape, e->shape, sizeof t->shape[0] * e->ndim);
    t->offset = e->data_off;
    t->nbytes = e->data_len;
    return true;
}

static int tzr_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    (void)path;
    (void)size;
    return head_len >= 5 && memcmp(head, TZR_MAGIC, 5) == 0;
}

static int tzr_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                        size_t msg_len)
{
    (void)path;
    memset(out, 0, sizeof *out);
    binread_msg(msg, msg_len, "%s", "");
    tzr_parse *p = malloc(sizeof *p);
    if (!p) {
        binread_msg(msg, msg_len, "tensorizer: out of memory");
        return -ENOMEM;
    }
    binread_init(&p->r, src, 0);
    p->msg = msg;
    p->msg_len = msg_len;
    p->rc = 0;
    tzr_entry *ent = NULL;
    size_t n_ent = 0, cap_ent = 0, cap_t = 0, cap_r = 0;
    strmap names;
    bool names_ok = false;

    uint8_t magic[5], flags[32], skip8[8];
    uint32_t version;
    uint64_t tensor_bytes, count, meta_len;
    if (src->size < TZR_FILE_HEADER_BYTES + 8) {
        fail(p, "file is %llu bytes, too short for the %u-byte header",
             (unsigned long long)src->size, TZR_FILE_HEADER_BYTES + 8);
        goto done;
    }
    if (!binread_bytes(&p->r, magic, 5) || !binread_u32(&p->r, &version) ||
        !binread_bytes(&p->r, flags, 32) || !binread_u64(&p->r, &tensor_bytes) ||
        !binread_bytes(&p->r, skip8, 8) || !binread_u64(&p->r, &count) ||
        !binread_u64(&p->r, &meta_len)) {
        fail_read(p, "file header");
        goto done;
    }
    if (memcmp(magic, TZR_MAGIC, 5) != 0) {
        fail(p, "bad magic (not a tensorizer file)");
        goto done;
    }
    if (version == 0) {
        fail(p, "unsupported data version 0");
        goto done;
    }
    if (version > TZR_MAX_VERSION) {
        p->rc = 1; /* a newer tensorizer's file: keep it opaque */
        goto done;
    }
    for (int i = 1; i < 32; i++)
        if (flags[i]) {
            fail(p, "unknown feature flags (byte %d is 0x%02x)", i, flags[i]);
            goto done;
        }
    if (flags[0] & ~(TZR_FLAG_ENCRYPTED | TZR_FLAG_VERSIONED)) {
        fail(p, "unknown feature flags 0x%02x", flags[0]);
        goto done;
    }
    bool versioned = flags[0] & TZR_FLAG_VERSIONED;
    if (versioned && version < 5) {
        fail(p, "versioned-metadata flag in a data version %u file", version);
        goto done;
    }
    /* tensorizer's own rule for which headers carry crypt info. */
    bool encrypted = version == 3 || (version >= 4 && (flags[0] & TZR_FLAG_ENCRYPTED));

    uint64_t meta_start = p->r.pos;
    if (meta_len > binread_left(&p->r)) {
        fail(p, "metadata length %llu runs past the end of the %llu-byte file",
             (unsigned long long)meta_len, (unsigned long long)src->size);
        goto done;
    }
    uint64_t meta_end = meta_start + meta_len;
    if (count > TZR_MAX_TENSORS || count > meta_len / TZR_MIN_ENTRY_BYTES) {
        fail(p,
             "tensor count %llu is absurd: %llu bytes of metadata hold at most %llu entries "
             "(limit %u)",
             (unsigned long long)count, (unsigned long long)meta_len,
             (unsigned long long)(meta_len / TZR_MIN_ENTRY_BYTES), TZR_MAX_TENSORS);
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        if (grow_array((void **)&ent, &cap_ent, n_ent, sizeof *ent)) {
            oom(p);
            goto done;
        }
        memset(&ent[n_ent], 0, sizeof ent[n_ent]);
        n_ent++;
        if (!read_entry(p, i, versioned, meta_end, &ent[i]))
            goto done;
    }
    /* Index entries alone: data inside the file, headers before their data. */
    for (size_t i = 0; i < n_ent; i++) {
        const tzr_entry *e = &ent[i];
        char q[BINREAD_QUOTE_BUF];
        binread_quote(q, sizeof q, e->raw_name, e->raw_len);
        uint64_t end;
        if (__builtin_add_overflow(e->data_off, e->data_len, &end) || end > src->size) {
            fail(p,
                 "tensor '%s': %llu data bytes at %llu run past the end of the %llu-byte "
                 "file",
                 q, (unsigned long long)e->data_len, (unsigned long long)e->data_off,
                 (unsigned long long)src->size);
            goto done;
        }
        if (e->header_off < meta_end || e->data_off < e->header_off) {
            fail(p,
                 "tensor '%s': header offset %llu lies outside the tensor section "
                 "[%llu, %llu]",
                 q, (unsigned long long)e->header_off, (unsigned long long)meta_end,
                 (unsigned long long)e->data_off);
            goto done;
        }
        if (e->type > 2) {
            fail(p, "tensor '%s': unknown tensor type %u", q, e->type);
            goto done;
        }
    }
    if (encrypted) {
        p->rc = 1;
        goto done;
    }

    if (strmap_init(&names, n_ent) != 0) {
        oom(p);
        goto done;
    }
    names_ok = true;
    for (size_t i = 0; i < n_ent; i++) {
        tzr_entry *e = &ent[i];
        char q[BINREAD_QUOTE_BUF];
        binread_quote(q, sizeof q, e->raw_name, e->raw_len);
        if (!check_header(p, i, false, e, q))
            goto done;
        char *name = tensor_name(p, e, i);
        if (!name)
            goto done;
        size_t before = out->n;
        if (!add_entry(p, e, name, q, out, &cap_t, &cap_r))
            goto done;
        if (out->n > before) {
            size_t old;
            int put = strmap_put(&names, out->t[out->n - 1].name, i, &old);
            if (put < 0) {
                oom(p);
                goto done;
            }
            if (put == 1) {
                binread_quote(q, sizeof q, out->t[out->n - 1].name,
                              strlen(out->t[out->n - 1].name));
                fail(p, "tensor name '%s' appears twice", q);
                goto done;
            }
        }
    }
    p->rc = binread_finish_layout(out, src->size, "tensorizer", msg, msg_len);

done:;
    int rc = p->rc;
    if (names_ok)
        strmap_free(&names);
    for (size_t i = 0; i < n_ent; i++)
        free(ent[i].raw_name);
    free(ent);
    free(p);
    if (rc != 0)
        binread_layout_free(out);
    return rc;
}

const container_format ckpt_format_tensorizer = {
    .name = "tensorizer",
    .sniff = tzr_sniff,
    .describe = tzr_describe,
};
