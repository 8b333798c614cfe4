/* The safetensors container: an 8-byte little-endian header length, a JSON
 * header naming each tensor's dtype, shape and data_offsets, then the data.
 * Checked as strictly as the reference implementation (huggingface/
 * safetensors): the header starts with '{', keys are unique, and the
 * tensors tile the data region exactly, with no gap, overlap or tail.
 *
 * The input is untrusted: every length is checked before it is used, sizes
 * are computed with overflow checks, and nothing past head_len is read. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "parse.h"

/* One tensor entry plus the relative offsets, kept until the layout check. */
typedef struct st_entry {
    ingest_tensor t;
    uint64_t begin, end;
} st_entry;

static int st_entry_cmp(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    /* Zero-sized tensors may share an offset; order them by name so the
     * layout is the same however the JSON object was ordered. */
    return strcmp(x->t.name, y->t.name);
}

static int st_check_metadata(json_t *meta, char *msg, size_t msg_len)
{
    if (!json_is_object(meta)) {
        ingest_msg(msg, msg_len, "safetensors header: __metadata__ is not an object");
        return -EINVAL;
    }
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val)
    {
        if (!json_is_string(val)) {
            char q[QUOTED_NAME_BUF];
            ingest_quote_name(q, sizeof q, key);
            ingest_msg(msg, msg_len,
                       "safetensors header: __metadata__ value for '%s' is not a string", q);
            return -EINVAL;
        }
    }
    return 0;
}

static bool json_to_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Checks one tensor object on its own: dtype, shape, offsets and size. */
static int st_parse_tensor(const char *name, size_t name_len, json_t *obj, st_entry *e, char *msg,
                           size_t msg_len)
{
    char q[QUOTED_NAME_BUF];
    ingest_quote_name(q, sizeof q, name);

    if (name_len == 0) {
        ingest_msg(msg, msg_len, "safetensors header: a tensor has an empty name");
        return -EINVAL;
    }
    if (strlen(name) != name_len) {
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s': name contains a NUL byte", q);
        return -EINVAL;
    }
    if (!json_is_object(obj)) {
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s' is not an object", q);
        return -EINVAL;
    }

    json_t *dtype = json_object_get(obj, "dtype");
    if (!json_is_string(dtype)) {
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s': %s", q,
                   dtype ? "dtype is not a string" : "no dtype");
        return -EINVAL;
    }
    const char *dt = json_string_value(dtype);
    unsigned elem_size = ckpt_dtype_size(dt);
    if (elem_size == 0 || json_string_length(dtype) >= sizeof e->t.dtype) {
        char qd[QUOTED_NAME_BUF];
        ingest_quote_name(qd, sizeof qd, dt);
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s': unknown dtype '%s'", q, qd);
        return -EINVAL;
    }
    memcpy(e->t.dtype, dt, json_string_length(dtype) + 1);

    json_t *shape = json_object_get(obj, "shape");
    if (!json_is_array(shape)) {
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s': %s", q,
                   shape ? "shape is not an array" : "no shape");
        return -EINVAL;
    }
    size_t ndim = json_array_size(shape);
    if (ndim > CKPT_MAX_NDIM) {
        ingest_msg(msg, msg_len,
                   "safetensors header: tensor '%s': shape has %zu dimensions, more than %d", q,
                   ndim, CKPT_MAX_NDIM);
        return -EINVAL;
    }
    e->t.ndim = (uint32_t)ndim;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_to_u64(d, &e->t.shape[i])) {
            if (json_is_integer(d))
                ingest_msg(msg, msg_len,
                           "safetensors header: tensor '%s': shape[%zu] is %lld, not a "
                           "non-negative integer",
                           q, i, (long long)json_integer_value(d));
            else
                ingest_msg(msg, msg_len,
                           "safetensors header: tensor '%s': shape[%zu] is not an integer", q, i);
            return -EINVAL;
        }
    }

    json_t *offs = json_object_get(obj, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_to_u64(json_array_get(offs, 0), &e->begin) ||
        !json_to_u64(json_array_get(offs, 1), &e->end)) {
        ingest_msg(msg, msg_len, "safetensors header: tensor '%s': %s", q,
                   offs ? "data_offsets is not a pair of non-negative integers [begin, end]"
                        : "no data_offsets");
        return -EINVAL;
    }
    if (e->end < e->begin) {
        ingest_msg(msg, msg_len,
                   "safetensors header: tensor '%s': data_offsets [%llu, %llu] end before they "
                   "begin",
                   q, (unsigned long long)e->begin, (unsigned long long)e->end);
        return -EINVAL;
    }

    char st[SHAPE_TEXT_BUF];
    ingest_shape_text(st, sizeof st, e->t.shape, e->t.ndim);
    if (!ingest_tensor_nbytes(e->t.shape, e->t.ndim, elem_size, &e->t.nbytes)) {
        ingest_msg(msg, msg_len,
                   "safetensors header: tensor '%s': size of %s[%s] overflows 64 bits", q,
                   e->t.dtype, st);
        return -EINVAL;
    }
    if (e->end - e->begin != e->t.nbytes) {
        ingest_msg(msg, msg_len,
                   "safetensors header: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes "
                   "but %s[%s] needs %llu",
                   q, (unsigned long long)e->begin, (unsigned long long)e->end,
                   (unsigned long long)(e->end - e->begin), e->t.dtype, st,
                   (unsigned long long)e->t.nbytes);
        return -EINVAL;
    }
    e->t.name = strdup(name);
    if (!e->t.name) {
        ingest_msg(msg, msg_len, "safetensors header: out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* Sorted entries must tile [0, data_len) exactly, as the reference demands. */
static int st_check_tiling(const st_entry *e, size_t n, uint64_t data_len, char *msg,
                           size_t msg_len)
{
    uint64_t expect = 0;
    char q[QUOTED_NAME_BUF];
    for (size_t i = 0; i < n; i++) {
        if (e[i].begin != expect) {
            ingest_quote_name(q, sizeof q, e[i].t.name);
            if (i == 0)
                ingest_msg(msg, msg_len,
                           "safetensors header: tensor data must start at offset 0, but the "
                           "first tensor '%s' starts at %llu",
                           q, (unsigned long long)e[i].begin);
            else if (e[i].begin < expect)
                ingest_msg(msg, msg_len,
                           "safetensors header: tensor '%s': data_offsets [%llu, %llu] overlap "
                           "the previous tensor, which ends at %llu",
                           q, (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                           (unsigned long long)expect);
            else
                ingest_msg(msg, msg_len,
                           "safetensors header: gap of %llu bytes before tensor '%s' "
                           "(data_offsets [%llu, %llu], previous tensor ends at %llu)",
                           (unsigned long long)(e[i].begin - expect), q,
                           (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                           (unsigned long long)expect);
            return -EINVAL;
        }
        if (e[i].end > data_len) {
            ingest_quote_name(q, sizeof q, e[i].t.name);
            ingest_msg(msg, msg_len,
                       "safetensors header: tensor '%s': data_offsets [%llu, %llu] run past the "
                       "end of the file, which holds %llu bytes of data",
                       q, (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                       (unsigned long long)data_len);
            return -EINVAL;
        }
        expect = e[i].end;
    }
    if (expect != data_len) {
        ingest_msg(msg, msg_len,
                   "safetensors header: %llu trailing bytes after the last tensor (tensor data "
                   "ends at %llu, the file holds %llu bytes of data)",
                   (unsigned long long)(data_len - expect), (unsigned long long)expect,
                   (unsigned long long)data_len);
        return -EINVAL;
    }
    return 0;
}

static void st_entries_free(st_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(e[i].t.name);
    free(e);
}

static int st_parse_header(json_t *root, uint64_t header_bytes, uint64_t data_len,
                           ingest_layout *out, char *msg, size_t msg_len)
{
    if (!json_is_object(root)) {
        ingest_msg(msg, msg_len, "safetensors header: not a JSON object");
        return -EINVAL;
    }
    size_t cap = json_object_size(root);
    st_entry *e = calloc(cap ? cap : 1, sizeof *e);
    if (!e) {
        ingest_msg(msg, msg_len, "safetensors header: out of memory");
        return -ENOMEM;
    }
    size_t n = 0;
    int rc = 0;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(root, key, key_len, val)
    {
        if (key_len == strlen("__metadata__") && strcmp(key, "__metadata__") == 0) {
            rc = st_check_metadata(val, msg, msg_len);
        } else {
            rc = st_parse_tensor(key, key_len, val, &e[n], msg, msg_len);
            if (rc == 0)
                n++;
        }
        if (rc)
            goto fail;
    }
    qsort(e, n, sizeof *e, st_entry_cmp);
    rc = st_check_tiling(e, n, data_len, msg, msg_len);
    if (rc)
        goto fail;

    out->t = calloc(n ? n : 1, sizeof *out->t);
    if (!out->t) {
        ingest_msg(msg, msg_len, "safetensors header: out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        out->t[i] = e[i].t;
        out->t[i].offset = header_bytes + e[i].begin;
    }
    out->n = n;
    out->header_bytes = header_bytes;
    free(e); /* the names now belong to out */
    return 0;

fail:
    st_entries_free(e, n);
    return rc;
}

int ingest_safetensors(const uint8_t *head, size_t head_len, uint64_t file_size, ingest_layout *out,
                       uint64_t *need, char *msg, size_t msg_len)
{
    memset(out, 0, sizeof *out);
    ingest_msg(msg, msg_len, "%s", "");
    if (head_len > file_size)
        head_len = (size_t)file_size;

    if (file_size < 8) {
        ingest_msg(msg, msg_len,
                   "safetensors header: file is %llu bytes, too short to hold the 8-byte header "
                   "length",
                   (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < 8) {
        if (need)
            *need = 8;
        return -EAGAIN;
    }
    uint64_t hlen = ingest_read_le(head, 8);
    if (hlen > CKPT_SAFETENSORS_MAX_HEADER) {
        ingest_msg(msg, msg_len,
                   "safetensors header: header length %llu exceeds the limit of %llu bytes",
                   (unsigned long long)hlen, (unsigned long long)CKPT_SAFETENSORS_MAX_HEADER);
        return -EINVAL;
    }
    uint64_t header_bytes = 8 + hlen;
    if (header_bytes > file_size) {
        ingest_msg(msg, msg_len,
                   "safetensors header: header length %llu runs past the end of the %llu-byte "
                   "file",
                   (unsigned long long)hlen, (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < header_bytes) {
        if (need)
            *need = header_bytes;
        return -EAGAIN;
    }
    /* The reference insists on '{' first: no leading whitespace or BOM. */
    if (hlen == 0 || head[8] != '{') {
        ingest_msg(msg, msg_len, "safetensors header: does not start with '{'");
        return -EINVAL;
    }

    json_error_t jerr;
    json_t *root = json_loadb((const char *)head + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        ingest_msg(msg, msg_len, "safetensors header: invalid JSON at byte %d: %s", jerr.position,
                   jerr.text);
        return -EINVAL;
    }
    int rc = st_parse_header(root, header_bytes, file_size - header_bytes, out, msg, msg_len);
    json_decref(root);
    return rc;
}

static int st_parse_head(const uint8_t *head, size_t head_len, uint64_t file_size,
                         const char *tensor_name, ingest_layout *out, uint64_t *need, char *msg,
                         size_t msg_len)
{
    (void)tensor_name; /* the header names every tensor */
    return ingest_safetensors(head, head_len, file_size, out, need, msg, msg_len);
}

static int st_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    (void)head, (void)head_len, (void)size;
    return ingest_path_has_suffix(path, ".safetensors");
}

static int st_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                       size_t msg_len)
{
    (void)path;
    return ingest_describe_head(src, st_parse_head, NULL, CKPT_SAFETENSORS_MAX_HEADER + 8,
                                "safetensors file", out, msg, msg_len);
}

const container_format ckpt_format_safetensors = {"safetensors", st_sniff, st_describe};
