/* GGUF (llama.cpp's model files, versions 2 and 3): where each tensor's
 * bytes lie, so that plain float and integer tensors are packed grouped by
 * their element size and quantized blocks by their own type.
 *
 * Layout (all little-endian; big-endian files are kept opaque):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv times:      string key, u32 value type, value
 *   n_tensors times: string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
 *                    u64 offset (relative to the data section)
 *   padding to general.alignment (default 32), then the data section.
 * A string is a u64 length and that many bytes; an array value is a u32
 * element type, a u64 count and the elements (arrays may nest).
 *
 * Shapes: ne[0] is the fastest-moving dimension (ggml's row length), so the
 * C-order shape is ne reversed. GGUFWriter writes numpy's shape (a, b) as
 * ne = {b, a}; the tests check that a tensor reads back with numpy's shape.
 *
 * Only the header is read, through a fixed window; every count, length and
 * nesting depth is bounded by the bytes left in the file and a hard cap, so
 * work and memory stay proportional to the header's real size.
 *
 * What llama.cpp accepts but this does not: nothing known. What it refuses
 * and this accepts: tensors out of order or with gaps in the data section
 * (llama.cpp wants them packed in order), which break no layout rule here. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binary.h"
#include "binread.h"
#include "common.h"
#include "formats.h"

#define GGUF_HEADER_BYTES 24u
#define GGML_MAX_DIMS 4u
#define GGUF_DEFAULT_ALIGNMENT 32u
/* Hard caps beside the bytes-left bounds: far above real models (a 405B
 * model has ~1100 tensors and ~40 keys; a vocabulary is one array). */
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_NAME 65535u /* tensor names; llama.cpp itself stops at 63 */
#define GGUF_MAX_DEPTH 8u    /* arrays of arrays */
#define GGUF_MAX_ALIGNMENT (1u << 30)
/* Smallest encodings, for bounding counts by the bytes left. */
#define GGUF_MIN_KV_BYTES 13u /* empty key, type, one-byte value */
#define GGUF_MIN_TI_BYTES 24u /* empty name, n_dims 0, type, offset */
#define GGUF_KEY_SHOWN 256u   /* key bytes kept for messages and comparison */

enum {
    GGUF_T_UINT8,
    GGUF_T_INT8,
    GGUF_T_UINT16,
    GGUF_T_INT16,
    GGUF_T_UINT32,
    GGUF_T_INT32,
    GGUF_T_FLOAT32,
    GGUF_T_BOOL,
    GGUF_T_STRING,
    GGUF_T_ARRAY,
    GGUF_T_UINT64,
    GGUF_T_INT64,
    GGUF_T_FLOAT64,
    GGUF_T_COUNT
};

/* Bytes of a fixed-size value type; 0 for string, array and unknown. */
static unsigned gguf_scalar_size(uint32_t type)
{
    static const unsigned sz[GGUF_T_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < GGUF_T_COUNT ? sz[type] : 0;
}

/* ggml tensor types: block of `blck` elements stored in `size` bytes (the
 * GGUF spec's and gguf-py's GGML_QUANT_SIZES). dtype is the safetensors name
 * for plain types; quantized ones become regions of "GGML_<name>". */
typedef struct ggml_type_info {
    uint32_t id;
    const char *name;
    uint32_t blck, size;
    const char *dtype;
} ggml_type_info;

static const ggml_type_info ggml_types[] = {
    {0, "F32", 1, 4, "F32"},        {1, "F16", 1, 2, "F16"},        {2, "Q4_0", 32, 18, NULL},
    {3, "Q4_1", 32, 20, NULL},      {6, "Q5_0", 32, 22, NULL},      {7, "Q5_1", 32, 24, NULL},
    {8, "Q8_0", 32, 34, NULL},      {9, "Q8_1", 32, 40, NULL},      {10, "Q2_K", 256, 84, NULL},
    {11, "Q3_K", 256, 110, NULL},   {12, "Q4_K", 256, 144, NULL},   {13, "Q5_K", 256, 176, NULL},
    {14, "Q6_K", 256, 210, NULL},   {15, "Q8_K", 256, 292, NULL},   {16, "IQ2_XXS", 256, 66, NULL},
    {17, "IQ2_XS", 256, 74, NULL},  {18, "IQ3_XXS", 256, 98, NULL}, {19, "IQ1_S", 256, 50, NULL},
    {20, "IQ4_NL", 32, 18, NULL},   {21, "IQ3_S", 256, 110, NULL},  {22, "IQ2_S", 256, 82, NULL},
    {23, "IQ4_XS", 256, 136, NULL}, {24, "I8", 1, 1, "I8"},         {25, "I16", 1, 2, "I16"},
    {26, "I32", 1, 4, "I32"},       {27, "I64", 1, 8, "I64"},       {28, "F64", 1, 8, "F64"},
    {29, "IQ1_M", 256, 56, NULL},   {30, "BF16", 1, 2, "BF16"},     {34, "TQ1_0", 256, 54, NULL},
    {35, "TQ2_0", 256, 66, NULL},   {39, "MXFP4", 32, 17, NULL},    {40, "NVFP4", 64, 36, NULL},
    {41, "Q1_0", 128, 18, NULL},
};

static const ggml_type_info *ggml_type_lookup(uint32_t id)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == id)
            return &ggml_types[i];
    return NULL;
}

/* Parser state: the cursor and the message buffer. */
typedef struct gguf_parse {
    binread r;
    char *msg;
    size_t msg_len;
    int rc;
} gguf_parse;

static bool fail(gguf_parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool fail(gguf_parse *p, const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    binread_msg(p->msg, p->msg_len, "gguf: %s", text);
    if (!p->rc)
        p->rc = -EINVAL;
    return false;
}

/* Turns a cursor fault into a message about `what`. */
static bool fail_read(gguf_parse *p, const char *what)
{
    if (p->r.err == -EINVAL)
        return fail(p, "%s runs past the end of the %llu-byte file", what,
                    (unsigned long long)p->r.src->size);
    p->rc = p->r.err;
    binread_msg(p->msg, p->msg_len, "gguf: read failed in %s: %s", what, strerror(-p->r.err));
    return false;
}

/* A string's length, checked against the bytes left and a cap. */
static bool read_strlen(gguf_parse *p, uint64_t cap, const char *what, uint64_t *len)
{
    if (!binread_u64(&p->r, len))
        return fail_read(p, what);
    if (*len > binread_left(&p->r))
        return fail(p, "%s length %llu runs past the end of the %llu-byte file", what,
                    (unsigned long long)*len, (unsigned long long)p->r.src->size);
    if (*len > cap)
        return fail(p, "%s length %llu exceeds the limit of %llu bytes", what,
                    (unsigned long long)*len, (unsigned long long)cap);
    return true;
}

/* Skips one value of `type`; `key` names it in messages. */
static bool skip_value(gguf_parse *p, uint32_t type, unsigned depth, const char *key)
{
    char what[BINREAD_QUOTE_BUF + 48];
    unsigned sz = gguf_scalar_size(type);
    if (sz) {
        snprintf(what, sizeof what, "value of key '%s'", key);
        return binread_skip(&p->r, sz) || fail_read(p, what);
    }
    if (type == GGUF_T_STRING) {
        uint64_t len;
        snprintf(what, sizeof what, "string value of key '%s'", key);
        return read_strlen(p, UINT64_MAX, what, &len) && binread_skip(&p->r, len);
    }
    if (type != GGUF_T_ARRAY)
        return fail(p, "key '%s' has unknown value type %u", key, type);
    if (depth >= GGUF_MAX_DEPTH)
        return fail(p, "key '%s': arrays nest deeper than %u levels", key, GGUF_MAX_DEPTH);

    uint32_t et;
    uint64_t count;
    snprintf(what, sizeof what, "array header of key '%s'", key);
    if (!binread_u32(&p->r, &et) || !binread_u64(&p->r, &count))
        return fail_read(p, what);
    uint64_t left = binread_left(&p->r);
    unsigned esz = gguf_scalar_size(et);
    /* The smallest encoding of one element bounds the count. */
    uint64_t min_elem = esz ? esz : et == GGUF_T_STRING ? 8 : et == GGUF_T_ARRAY ? 12 : 0;
    if (min_elem == 0)
        return fail(p, "key '%s': array of unknown value type %u", key, et);
    if (count > left / min_elem)
        return fail(p,
                    "key '%s': array of %llu elements of type %u runs past the end of the "
                    "%llu-byte file",
                    key, (unsigned long long)count, et, (unsigned long long)p->r.src->size);
    if (esz)
        return binread_skip(&p->r, count * esz) || fail_read(p, what);
    for (uint64_t i = 0; i < count; i++)
        if (!skip_value(p, et, depth + 1, key))
            return false;
    return true;
}

/* Reads the key/value section; sets *alignment from general.alignment. */
static bool read_kvs(gguf_parse *p, uint64_t n_kv, uint32_t *alignment)
{
    static const char align_key[] = "general.alignment";
    bool have_alignment = false;
    uint8_t key[GGUF_KEY_SHOWN];
    char q[BINREAD_QUOTE_BUF];
    for (uint64_t i = 0; i < n_kv; i++) {
        char what[64];
        snprintf(what, sizeof what, "key %llu", (unsigned long long)i);
        uint64_t klen;
        if (!read_strlen(p, UINT64_MAX, what, &klen))
            return false;
        size_t shown = klen < sizeof key ? (size_t)klen : sizeof key;
        if (!binread_bytes(&p->r, key, shown) || !binread_skip(&p->r, klen - shown))
            return fail_read(p, what);
        binread_quote(q, sizeof q, (const char *)key, shown);
        uint32_t type;
        snprintf(what, sizeof what, "value type of key %llu", (unsigned long long)i);
        if (!binread_u32(&p->r, &type))
            return fail_read(p, what);
        if (klen == sizeof align_key - 1 && memcmp(key, align_key, klen) == 0) {
            if (have_alignment)
                return fail(p, "general.alignment is given twice");
            have_alignment = true;
            if (type != GGUF_T_UINT32)
                return fail(p, "general.alignment has value type %u, not uint32 (4)", type);
            uint32_t a;
            if (!binread_u32(&p->r, &a))
                return fail_read(p, "general.alignment");
            if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
                return fail(p, "general.alignment %u is not a power of two up to %u", a,
                            GGUF_MAX_ALIGNMENT);
            *alignment = a;
            continue;
        }
        if (!skip_value(p, type, 0, q))
            return false;
    }
    return true;
}

/* One tensor info, kept until the data section's start is known. */
typedef struct gguf_ti {
    char *name;
    uint32_t n_dims;
    uint64_t ne[GGML_MAX_DIMS];
    const ggml_type_info *type;
    uint64_t offset; /* relative to the data section */
    uint64_t nbytes;
} gguf_ti;

static bool read_ti(gguf_parse *p, uint64_t index, gguf_ti *ti)
{
    char what[BINREAD_QUOTE_BUF + 48];
    snprintf(what, sizeof what, "name of tensor %llu", (unsigned long long)index);
    uint64_t nlen;
    if (!read_strlen(p, GGUF_MAX_NAME, what, &nlen))
        return false;
    if (nlen == 0)
        return fail(p, "tensor %llu has an empty name", (unsigned long long)index);
    ti->name = malloc((size_t)nlen + 1);
    if (!ti->name) {
        p->rc = -ENOMEM;
        binread_msg(p->msg, p->msg_len, "gguf: out of memory");
        return false;
    }
    if (!binread_bytes(&p->r, ti->name, (size_t)nlen))
        return fail_read(p, what);
    ti->name[nlen] = '\0';
    char q[BINREAD_QUOTE_BUF];
    binread_quote(q, sizeof q, ti->name, (size_t)nlen);
    if (strlen(ti->name) != nlen)
        return fail(p, "tensor '%s': name contains a NUL byte", q);

    snprintf(what, sizeof what, "tensor info of '%s'", q);
    if (!binread_u32(&p->r, &ti->n_dims))
        return fail_read(p, what);
    if (ti->n_dims > GGML_MAX_DIMS)
        return fail(p, "tensor '%s' has %u dimensions, more than %u", q, ti->n_dims, GGML_MAX_DIMS);
    for (uint32_t d = 0; d < ti->n_dims; d++) {
        if (!binread_u64(&p->r, &ti->ne[d]))
            return fail_read(p, what);
        if (ti->ne[d] > (uint64_t)INT64_MAX)
            return fail(p, "tensor '%s': ne[%u] is %llu, more than INT64_MAX", q, d,
                        (unsigned long long)ti->ne[d]);
    }
    for (uint32_t d = ti->n_dims; d < GGML_MAX_DIMS; d++)
        ti->ne[d] = 1;
    uint32_t type;
    if (!binread_u32(&p->r, &type) || !binread_u64(&p->r, &ti->offset))
        return fail_read(p, what);
    ti->type = ggml_type_lookup(type);
    if (!ti->type)
        return fail(p, "tensor '%s' has unknown ggml type %u", q, type);

    /* Rows are whole blocks; the size is rows of blocks times the rest. */
    const ggml_type_info *ty = ti->type;
    if (ti->ne[0] % ty->blck != 0)
        return fail(p, "tensor '%s': ne[0] = %llu is not a multiple of the %s block size %u", q,
                    (unsigned long long)ti->ne[0], ty->name, ty->blck);
    uint64_t elems = 1, bytes = (ti->ne[0] / ty->blck);
    bool over = __builtin_mul_overflow(bytes, (uint64_t)ty->size, &bytes);
    for (uint32_t d = 0; d < GGML_MAX_DIMS; d++)
        over |= __builtin_mul_overflow(elems, ti->ne[d], &elems);
    for (uint32_t d = 1; d < GGML_MAX_DIMS; d++)
        over |= __builtin_mul_overflow(bytes, ti->ne[d], &bytes);
    /* The packer sizes plain tensors with ckpt_tensor_bytes, in C order:
     * a shape holding a zero may overflow there and not here. */
    if (!over && ty->dtype) {
        uint64_t shape[GGML_MAX_DIMS], check;
        for (uint32_t d = 0; d < ti->n_dims; d++)
            shape[d] = ti->ne[ti->n_dims - 1 - d];
        over = ckpt_tensor_bytes(ty->dtype, ti->n_dims, shape, &check) != 0 || check != bytes;
    }
    if (over || elems > (uint64_t)INT64_MAX)
        return fail(p, "tensor '%s': size of %s[%llu, %llu, %llu, %llu] overflows 64 bits", q,
                    ty->name, (unsigned long long)ti->ne[0], (unsigned long long)ti->ne[1],
                    (unsigned long long)ti->ne[2], (unsigned long long)ti->ne[3]);
    ti->nbytes = bytes;
    return true;
}

/* Checks each tensor against the data section and moves it into out. */
static bool emit(gguf_parse *p, gguf_ti *ti, uint64_t n, uint64_t data_start, uint32_t alignment,
                 ingest_layout *out)
{
    uint64_t size = p->r.src->size;
    size_t n_plain = 0, n_quant = 0;
    for (uint64_t i = 0; i < n; i++) {
        char q[BINREAD_QUOTE_BUF];
        binread_quote(q, sizeof q, ti[i].name, strlen(ti[i].name));
        if (ti[i].offset % alignment != 0)
            return fail(p, "tensor '%s': offset %llu is not a multiple of the alignment %u", q,
                        (unsigned long long)ti[i].offset, alignment);
        uint64_t abs, end;
        if (__builtin_add_overflow(data_start, ti[i].offset, &abs) ||
            __builtin_add_overflow(abs, ti[i].nbytes, &end) || end > size)
            return fail(p,
                        "tensor '%s': %llu bytes at data offset %llu run past the end of the "
                        "%llu-byte file (data section starts at %llu)",
                        q, (unsigned long long)ti[i].nbytes, (unsigned long long)ti[i].offset,
                        (unsigned long long)size, (unsigned long long)data_start);
        ti[i].offset = abs;
        if (ti[i].type->dtype)
            n_plain++;
        else
            n_quant++;
    }
    out->t = calloc(n_plain ? n_plain : 1, sizeof *out->t);
    out->regions = calloc(n_quant ? n_quant : 1, sizeof *out->regions);
    out->skipped = calloc(n_quant ? n_quant : 1, sizeof *out->skipped);
    if (!out->t || !out->regions || !out->skipped) {
        p->rc = -ENOMEM;
        binread_msg(p->msg, p->msg_len, "gguf: out of memory");
        return false;
    }
    for (uint64_t i = 0; i < n; i++) {
        const ggml_type_info *ty = ti[i].type;
        if (ty->dtype) {
            ingest_tensor *t = &out->t[out->n++];
            t->name = ti[i].name;
            ti[i].name = NULL;
            snprintf(t->dtype, sizeof t->dtype, "%s", ty->dtype);
            t->ndim = ti[i].n_dims;
            for (uint32_t d = 0; d < ti[i].n_dims; d++)
                t->shape[d] = ti[i].ne[ti[i].n_dims - 1 - d];
            t->offset = ti[i].offset;
            t->nbytes = ti[i].nbytes;
        } else {
            ingest_region *g = &out->regions[out->n_regions++];
            g->offset = ti[i].offset;
            g->length = ti[i].nbytes;
            snprintf(g->dtype, sizeof g->dtype, "GGML_%s", ty->name);
            /* Its blocks mix scales and packed integers: no raw element
             * file a loader could use, so it is named with the reason. */
            ingest_skipped *k = &out->skipped[out->n_skipped++];
            k->name = ti[i].name;
            ti[i].name = NULL;
            snprintf(
                k->reason, sizeof k->reason,
                "quantized type %s has no element dtype: its blocks stay in the file as they are",
                ty->name);
        }
    }
    return true;
}

static int gguf_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    (void)path;
    (void)size;
    return head_len >= 4 && memcmp(head, "GGUF", 4) == 0;
}

static int gguf_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                         size_t msg_len)
{
    (void)path;
    memset(out, 0, sizeof *out);
    binread_msg(msg, msg_len, "%s", "");
    gguf_parse *p = malloc(sizeof *p);
    if (!p) {
        binread_msg(msg, msg_len, "gguf: out of memory");
        return -ENOMEM;
    }
    binread_init(&p->r, src, 0);
    p->msg = msg;
    p->msg_len = msg_len;
    p->rc = 0;
    gguf_ti *ti = NULL;
    size_t ti_cap = 0;
    uint64_t n_ti = 0;
    strmap names;
    bool names_ok = false;

    uint8_t magic[4];
    uint32_t version;
    uint64_t n_tensors, n_kv;
    if (src->size < GGUF_HEADER_BYTES) {
        fail(p, "file is %llu bytes, too short for the %u-byte header",
             (unsigned long long)src->size, GGUF_HEADER_BYTES);
        goto done;
    }
    if (!binread_bytes(&p->r, magic, 4) || !binread_u32(&p->r, &version) ||
        !binread_u64(&p->r, &n_tensors) || !binread_u64(&p->r, &n_kv)) {
        fail_read(p, "header");
        goto done;
    }
    if (memcmp(magic, "GGUF", 4) != 0) {
        fail(p, "bad magic (not a GGUF file)");
        goto done;
    }
    if (version != 2 && version != 3) {
        uint32_t swapped = __builtin_bswap32(version);
        /* Version 1 (u32 counts) and big-endian files are real GGUF files
         * this parser does not lay out: keep them opaque, no warning. */
        if (version == 1 || (swapped >= 1 && swapped <= 3)) {
            p->rc = 1;
            goto done;
        }
        fail(p, "unsupported version %u", version);
        goto done;
    }
    uint64_t left = binread_left(&p->r);
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > left / GGUF_MIN_TI_BYTES) {
        fail(p,
             "tensor count %llu is absurd: the %llu-byte file holds at most %llu tensor "
             "infos (limit %u)",
             (unsigned long long)n_tensors, (unsigned long long)src->size,
             (unsigned long long)(left / GGUF_MIN_TI_BYTES), GGUF_MAX_TENSORS);
        goto done;
    }
    if (n_kv > GGUF_MAX_KV || n_kv > left / GGUF_MIN_KV_BYTES) {
        fail(p,
             "key/value count %llu is absurd: the %llu-byte file holds at most %llu (limit "
             "%u)",
             (unsigned long long)n_kv, (unsigned long long)src->size,
             (unsigned long long)(left / GGUF_MIN_KV_BYTES), GGUF_MAX_KV);
        goto done;
    }

    uint32_t alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!read_kvs(p, n_kv, &alignment))
        goto done;

    if (strmap_init(&names, (size_t)n_tensors) != 0) {
        p->rc = -ENOMEM;
        binread_msg(msg, msg_len, "gguf: out of memory");
        goto done;
    }
    names_ok = true;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow_array((void **)&ti, &ti_cap, (size_t)n_ti, sizeof *ti) != 0) {
            p->rc = -ENOMEM;
            binread_msg(msg, msg_len, "gguf: out of memory");
            goto done;
        }
        memset(&ti[n_ti], 0, sizeof ti[n_ti]);
        n_ti++;
        if (!read_ti(p, i, &ti[n_ti - 1]))
            goto done;
        size_t old;
        int put = strmap_put(&names, ti[n_ti - 1].name, (size_t)i, &old);
        if (put < 0) {
            p->rc = -ENOMEM;
            binread_msg(msg, msg_len, "gguf: out of memory");
            goto done;
        }
        if (put == 1) {
            char q[BINREAD_QUOTE_BUF];
            binread_quote(q, sizeof q, ti[n_ti - 1].name, strlen(ti[n_ti - 1].name));
            fail(p, "tensor name '%s' appears twice", q);
            goto done;
        }
    }

    /* The data section starts at the next multiple of the alignment. */
    uint64_t data_start = p->r.pos;
    uint64_t rem = data_start % alignment;
    if (rem && __builtin_add_overflow(data_start, alignment - rem, &data_start)) {
        fail(p, "data section offset overflows");
        goto done;
    }
    if (n_tensors > 0 && data_start > src->size) {
        fail(p, "tensor data section starts at %llu, past the end of the %llu-byte file",
             (unsigned long long)data_start, (unsigned long long)src->size);
        goto done;
    }
    if (!emit(p, ti, n_ti, data_start, alignment, out))
        goto done;
    p->rc = binread_finish_layout(out, src->size, "gguf", msg, msg_len);

done:;
    int rc = p->rc;
    if (names_ok)
        strmap_free(&names);
    for (uint64_t i = 0; i < n_ti; i++)
        free(ti[i].name);
    free(ti);
    free(p);
    if (rc != 0)
        binread_layout_free(out);
    return rc;
}

const container_format ckpt_format_gguf = {
    .name = "gguf",
    .sniff = gguf_sniff,
    .describe = gguf_describe,
};
