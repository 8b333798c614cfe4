/* Validates safetensors and npy headers and turns them into tensor layouts.
 * The input is untrusted: every length is checked before it is used, sizes
 * are computed with overflow checks, and nothing past head_len is read. */
#include "ingest.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"

/* Names are quoted into messages; long or hostile names are cut short and
 * control bytes escaped so that a message stays one readable line. */
#define QUOTED_NAME_MAX 64
#define QUOTED_NAME_BUF (QUOTED_NAME_MAX * 4 + 8)
#define SHAPE_TEXT_BUF 160

static void set_msg(char *msg, size_t msg_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_msg(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (!msg || msg_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_len, fmt, ap);
    va_end(ap);
    /* Messages quote the file (jansson's "near '...'" echoes raw header
     * bytes): keep them one printable line. */
    for (unsigned char *c = (unsigned char *)msg; *c; c++)
        if (*c < 0x20 || *c == 0x7f)
            *c = '?';
}

static void quote_name(char *dst, size_t cap, const char *name)
{
    size_t o = 0;
    size_t taken = 0;
    const unsigned char *s = (const unsigned char *)name;
    for (; *s; s++) {
        /* Cut only at the start of a UTF-8 sequence, never inside one. */
        if (taken >= QUOTED_NAME_MAX && (*s & 0xC0) != 0x80) {
            snprintf(dst + o, cap - o, "...");
            return;
        }
        if (o + 5 >= cap)
            break;
        if (*s < 0x20 || *s == 0x7F || *s == '\'' || *s == '\\')
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", *s);
        else
            dst[o++] = (char)*s;
        taken++;
    }
    dst[o] = '\0';
}

/* "3, 4" for shape {3, 4}: callers add the brackets their format uses. */
static void shape_text(char *dst, size_t cap, const uint64_t *shape, uint32_t ndim)
{
    size_t o = 0;
    dst[0] = '\0';
    for (uint32_t i = 0; i < ndim; i++) {
        int n = snprintf(dst + o, cap - o, "%s%llu", i ? ", " : "",
                         (unsigned long long)shape[i]);
        if (n < 0 || (size_t)n >= cap - o) {
            /* Too long to show whole; mark the cut so it is not misread. */
            if (cap > 4)
                memcpy(dst + cap - 4, "...", 4);
            return;
        }
        o += (size_t)n;
    }
}

/* Element count times element size; false when it does not fit in 64 bits.
 * Multiplies in the reference's order (dimensions left to right, then the
 * element size) so that shapes holding a zero overflow exactly when the
 * reference says they do. */
static bool tensor_nbytes(const uint64_t *shape, uint32_t ndim, unsigned elem_size,
                          uint64_t *out)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return false;
    return !__builtin_mul_overflow(n, (uint64_t)elem_size, out);
}

static uint64_t read_le(const uint8_t *p, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void ingest_layout_free(ingest_layout *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->t[i].name);
    free(l->t);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------ safetensors */

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
        set_msg(msg, msg_len, "safetensors header: __metadata__ is not an object");
        return -EINVAL;
    }
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val)) {
            char q[QUOTED_NAME_BUF];
            quote_name(q, sizeof q, key);
            set_msg(msg, msg_len,
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
static int st_parse_tensor(const char *name, size_t name_len, json_t *obj, st_entry *e,
                           char *msg, size_t msg_len)
{
    char q[QUOTED_NAME_BUF];
    quote_name(q, sizeof q, name);

    if (name_len == 0) {
        set_msg(msg, msg_len, "safetensors header: a tensor has an empty name");
        return -EINVAL;
    }
    if (strlen(name) != name_len) {
        set_msg(msg, msg_len, "safetensors header: tensor '%s': name contains a NUL byte", q);
        return -EINVAL;
    }
    if (!json_is_object(obj)) {
        set_msg(msg, msg_len, "safetensors header: tensor '%s' is not an object", q);
        return -EINVAL;
    }

    json_t *dtype = json_object_get(obj, "dtype");
    if (!json_is_string(dtype)) {
        set_msg(msg, msg_len, "safetensors header: tensor '%s': %s", q,
                dtype ? "dtype is not a string" : "no dtype");
        return -EINVAL;
    }
    const char *dt = json_string_value(dtype);
    unsigned elem_size = ckpt_dtype_size(dt);
    if (elem_size == 0 || json_string_length(dtype) >= sizeof e->t.dtype) {
        char qd[QUOTED_NAME_BUF];
        quote_name(qd, sizeof qd, dt);
        set_msg(msg, msg_len, "safetensors header: tensor '%s': unknown dtype '%s'", q, qd);
        return -EINVAL;
    }
    memcpy(e->t.dtype, dt, json_string_length(dtype) + 1);

    json_t *shape = json_object_get(obj, "shape");
    if (!json_is_array(shape)) {
        set_msg(msg, msg_len, "safetensors header: tensor '%s': %s", q,
                shape ? "shape is not an array" : "no shape");
        return -EINVAL;
    }
    size_t ndim = json_array_size(shape);
    if (ndim > CKPT_MAX_NDIM) {
        set_msg(msg, msg_len,
                "safetensors header: tensor '%s': shape has %zu dimensions, more than %d", q,
                ndim, CKPT_MAX_NDIM);
        return -EINVAL;
    }
    e->t.ndim = (uint32_t)ndim;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_to_u64(d, &e->t.shape[i])) {
            if (json_is_integer(d))
                set_msg(msg, msg_len,
                        "safetensors header: tensor '%s': shape[%zu] is %lld, not a "
                        "non-negative integer",
                        q, i, (long long)json_integer_value(d));
            else
                set_msg(msg, msg_len,
                        "safetensors header: tensor '%s': shape[%zu] is not an integer", q, i);
            return -EINVAL;
        }
    }

    json_t *offs = json_object_get(obj, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_to_u64(json_array_get(offs, 0), &e->begin) ||
        !json_to_u64(json_array_get(offs, 1), &e->end)) {
        set_msg(msg, msg_len,
                "safetensors header: tensor '%s': %s", q,
                offs ? "data_offsets is not a pair of non-negative integers [begin, end]"
                     : "no data_offsets");
        return -EINVAL;
    }
    if (e->end < e->begin) {
        set_msg(msg, msg_len,
                "safetensors header: tensor '%s': data_offsets [%llu, %llu] end before they "
                "begin",
                q, (unsigned long long)e->begin, (unsigned long long)e->end);
        return -EINVAL;
    }

    char st[SHAPE_TEXT_BUF];
    shape_text(st, sizeof st, e->t.shape, e->t.ndim);
    if (!tensor_nbytes(e->t.shape, e->t.ndim, elem_size, &e->t.nbytes)) {
        set_msg(msg, msg_len,
                "safetensors header: tensor '%s': size of %s[%s] overflows 64 bits", q,
                e->t.dtype, st);
        return -EINVAL;
    }
    if (e->end - e->begin != e->t.nbytes) {
        set_msg(msg, msg_len,
                "safetensors header: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes "
                "but %s[%s] needs %llu",
                q, (unsigned long long)e->begin, (unsigned long long)e->end,
                (unsigned long long)(e->end - e->begin), e->t.dtype, st,
                (unsigned long long)e->t.nbytes);
        return -EINVAL;
    }
    e->t.name = strdup(name);
    if (!e->t.name) {
        set_msg(msg, msg_len, "safetensors header: out of memory");
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
            quote_name(q, sizeof q, e[i].t.name);
            if (i == 0)
                set_msg(msg, msg_len,
                        "safetensors header: tensor data must start at offset 0, but the "
                        "first tensor '%s' starts at %llu",
                        q, (unsigned long long)e[i].begin);
            else if (e[i].begin < expect)
                set_msg(msg, msg_len,
                        "safetensors header: tensor '%s': data_offsets [%llu, %llu] overlap "
                        "the previous tensor, which ends at %llu",
                        q, (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                        (unsigned long long)expect);
            else
                set_msg(msg, msg_len,
                        "safetensors header: gap of %llu bytes before tensor '%s' "
                        "(data_offsets [%llu, %llu], previous tensor ends at %llu)",
                        (unsigned long long)(e[i].begin - expect), q,
                        (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                        (unsigned long long)expect);
            return -EINVAL;
        }
        if (e[i].end > data_len) {
            quote_name(q, sizeof q, e[i].t.name);
            set_msg(msg, msg_len,
                    "safetensors header: tensor '%s': data_offsets [%llu, %llu] run past the "
                    "end of the file, which holds %llu bytes of data",
                    q, (unsigned long long)e[i].begin, (unsigned long long)e[i].end,
                    (unsigned long long)data_len);
            return -EINVAL;
        }
        expect = e[i].end;
    }
    if (expect != data_len) {
        set_msg(msg, msg_len,
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
        set_msg(msg, msg_len, "safetensors header: not a JSON object");
        return -EINVAL;
    }
    size_t cap = json_object_size(root);
    st_entry *e = calloc(cap ? cap : 1, sizeof *e);
    if (!e) {
        set_msg(msg, msg_len, "safetensors header: out of memory");
        return -ENOMEM;
    }
    size_t n = 0;
    int rc = 0;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(root, key, key_len, val) {
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
        set_msg(msg, msg_len, "safetensors header: out of memory");
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

int ingest_safetensors(const uint8_t *head, size_t head_len, uint64_t file_size,
                       ingest_layout *out, uint64_t *need, char *msg, size_t msg_len)
{
    memset(out, 0, sizeof *out);
    set_msg(msg, msg_len, "%s", "");
    if (head_len > file_size)
        head_len = (size_t)file_size;

    if (file_size < 8) {
        set_msg(msg, msg_len,
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
    uint64_t hlen = read_le(head, 8);
    if (hlen > CKPT_SAFETENSORS_MAX_HEADER) {
        set_msg(msg, msg_len,
                "safetensors header: header length %llu exceeds the limit of %llu bytes",
                (unsigned long long)hlen, (unsigned long long)CKPT_SAFETENSORS_MAX_HEADER);
        return -EINVAL;
    }
    uint64_t header_bytes = 8 + hlen;
    if (header_bytes > file_size) {
        set_msg(msg, msg_len,
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
        set_msg(msg, msg_len, "safetensors header: does not start with '{'");
        return -EINVAL;
    }

    json_error_t jerr;
    json_t *root = json_loadb((const char *)head + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root) {
        set_msg(msg, msg_len, "safetensors header: invalid JSON at byte %d: %s",
                jerr.position, jerr.text);
        return -EINVAL;
    }
    int rc = st_parse_header(root, header_bytes, file_size - header_bytes, out, msg, msg_len);
    json_decref(root);
    return rc;
}

/* -------------------------------------------------------------------- npy */

/* What the header dict says, once parsed. */
typedef struct npy_header {
    char descr[16];
    bool descr_is_string;  /* false for structured (list) descrs */
    bool descr_too_long;
    bool fortran_order;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_NDIM];
    bool too_many_dims;
} npy_header;

/* A cursor over the header text; err holds the first fault found. */
typedef struct npy_lex {
    const char *p, *end;
    const char *start;
    char err[128];
} npy_lex;

/* Nested lists and tuples only appear in structured descrs; bound them so a
 * hostile header cannot exhaust the stack. */
#define NPY_MAX_NESTING 32

static void lex_fail(npy_lex *lx, const char *what)
{
    if (!lx->err[0])
        snprintf(lx->err, sizeof lx->err, "%s at offset %td", what, lx->p - lx->start);
}

static void lex_skip_space(npy_lex *lx)
{
    while (lx->p < lx->end &&
           (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
        lx->p++;
}

static bool lex_eat(npy_lex *lx, char c)
{
    lex_skip_space(lx);
    if (lx->p < lx->end && *lx->p == c) {
        lx->p++;
        return true;
    }
    return false;
}

static bool lex_peek(npy_lex *lx, char c)
{
    lex_skip_space(lx);
    return lx->p < lx->end && *lx->p == c;
}

/* A quoted string; its raw body (escapes kept) is returned as [*s, *s+*len). */
static bool lex_string(npy_lex *lx, const char **s, size_t *len)
{
    lex_skip_space(lx);
    if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"')) {
        lex_fail(lx, "expected a string");
        return false;
    }
    char quote = *lx->p++;
    const char *body = lx->p;
    while (lx->p < lx->end && *lx->p != quote) {
        if (*lx->p == '\n' || *lx->p == '\0') {
            lex_fail(lx, "unterminated string");
            return false;
        }
        if (*lx->p == '\\') {
            lx->p++;
            if (lx->p >= lx->end)
                break;
        }
        lx->p++;
    }
    if (lx->p >= lx->end) {
        lex_fail(lx, "unterminated string");
        return false;
    }
    *s = body;
    *len = (size_t)(lx->p - body);
    lx->p++;
    return true;
}

static bool lex_word(npy_lex *lx, const char *w)
{
    lex_skip_space(lx);
    size_t n = strlen(w);
    if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, w, n) != 0)
        return false;
    const char *after = lx->p + n;
    if (after < lx->end && (*after == '_' || (*after >= 'a' && *after <= 'z') ||
                            (*after >= 'A' && *after <= 'Z') ||
                            (*after >= '0' && *after <= '9')))
        return false;
    lx->p = after;
    return true;
}

/* A non-negative decimal integer; Python 2 era headers may carry an 'L'. */
static bool lex_uint(npy_lex *lx, uint64_t *out)
{
    lex_skip_space(lx);
    if (lx->p >= lx->end || *lx->p < '0' || *lx->p > '9') {
        lex_fail(lx, "expected a non-negative integer");
        return false;
    }
    uint64_t v = 0;
    while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(*lx->p - '0'), &v)) {
            lex_fail(lx, "integer too large");
            return false;
        }
        lx->p++;
    }
    if (lx->p < lx->end && *lx->p == 'L')
        lx->p++;
    *out = v;
    return true;
}

/* Skips any literal a structured descr may hold: strings, integers, and
 * lists or tuples of them. */
static bool lex_skip_value(npy_lex *lx, int depth)
{
    lex_skip_space(lx);
    if (lx->p >= lx->end) {
        lex_fail(lx, "expected a value");
        return false;
    }
    char c = *lx->p;
    if (c == '\'' || c == '"') {
        const char *s;
        size_t n;
        return lex_string(lx, &s, &n);
    }
    if (c >= '0' && c <= '9') {
        uint64_t v;
        return lex_uint(lx, &v);
    }
    if (c == '-') {
        lx->p++;
        uint64_t v;
        return lex_uint(lx, &v);
    }
    if (lex_word(lx, "True") || lex_word(lx, "False") || lex_word(lx, "None"))
        return true;
    if (c == '[' || c == '(') {
        if (depth >= NPY_MAX_NESTING) {
            lex_fail(lx, "nested too deeply");
            return false;
        }
        char close = c == '[' ? ']' : ')';
        lx->p++;
        while (!lex_eat(lx, close)) {
            if (!lex_skip_value(lx, depth + 1))
                return false;
            if (!lex_eat(lx, ',') && !lex_peek(lx, close)) {
                lex_fail(lx, "expected ',' or a closing bracket");
                return false;
            }
        }
        return true;
    }
    lex_fail(lx, "unexpected character");
    return false;
}

static bool npy_parse_shape(npy_lex *lx, npy_header *h)
{
    if (!lex_eat(lx, '(')) {
        lex_fail(lx, "shape is not a tuple");
        return false;
    }
    size_t count = 0;
    bool trailing_comma = false;
    while (!lex_eat(lx, ')')) {
        uint64_t d;
        if (!lex_uint(lx, &d))
            return false;
        if (count < CKPT_MAX_NDIM)
            h->shape[count] = d;
        count++;
        trailing_comma = lex_eat(lx, ',');
        if (!trailing_comma && !lex_peek(lx, ')')) {
            lex_fail(lx, "expected ',' or ')' in shape");
            return false;
        }
    }
    /* In Python "(5)" is just the integer 5, not a tuple. */
    if (count == 1 && !trailing_comma) {
        lex_fail(lx, "shape is not a tuple");
        return false;
    }
    h->too_many_dims = count > CKPT_MAX_NDIM;
    h->ndim = h->too_many_dims ? 0 : (uint32_t)count;
    return true;
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4 };

static bool npy_parse_dict(npy_lex *lx, npy_header *h)
{
    unsigned seen = 0;
    if (!lex_eat(lx, '{')) {
        lex_fail(lx, "header is not a dict");
        return false;
    }
    while (!lex_eat(lx, '}')) {
        const char *k;
        size_t kn;
        if (!lex_string(lx, &k, &kn))
            return false;
        unsigned key;
        if (kn == 5 && memcmp(k, "descr", 5) == 0)
            key = KEY_DESCR;
        else if (kn == 13 && memcmp(k, "fortran_order", 13) == 0)
            key = KEY_FORTRAN;
        else if (kn == 5 && memcmp(k, "shape", 5) == 0)
            key = KEY_SHAPE;
        else {
            lex_fail(lx, "unknown key");
            return false;
        }
        if (seen & key) {
            lex_fail(lx, "duplicate key");
            return false;
        }
        seen |= key;
        if (!lex_eat(lx, ':')) {
            lex_fail(lx, "expected ':'");
            return false;
        }
        if (key == KEY_DESCR) {
            if (lex_peek(lx, '\'') || lex_peek(lx, '"')) {
                const char *s;
                size_t n;
                if (!lex_string(lx, &s, &n))
                    return false;
                h->descr_is_string = true;
                h->descr_too_long = n >= sizeof h->descr;
                if (!h->descr_too_long) {
                    memcpy(h->descr, s, n);
                    h->descr[n] = '\0';
                }
            } else if (lex_peek(lx, '[')) {
                if (!lex_skip_value(lx, 0))
                    return false;
            } else {
                lex_fail(lx, "descr is neither a string nor a list");
                return false;
            }
        } else if (key == KEY_FORTRAN) {
            if (lex_word(lx, "True"))
                h->fortran_order = true;
            else if (lex_word(lx, "False"))
                h->fortran_order = false;
            else {
                lex_fail(lx, "fortran_order is not True or False");
                return false;
            }
        } else if (!npy_parse_shape(lx, h)) {
            return false;
        }
        if (!lex_eat(lx, ',') && !lex_peek(lx, '}')) {
            lex_fail(lx, "expected ',' or '}'");
            return false;
        }
    }
    if (seen != (KEY_DESCR | KEY_FORTRAN | KEY_SHAPE)) {
        lex_fail(lx, !(seen & KEY_DESCR)     ? "no 'descr' key"
                     : !(seen & KEY_FORTRAN) ? "no 'fortran_order' key"
                                             : "no 'shape' key");
        return false;
    }
    lex_skip_space(lx);
    if (lx->p != lx->end) {
        lex_fail(lx, "unexpected text after the dict");
        return false;
    }
    return true;
}

/* The safetensors dtype for a descr numpy writes for plain numbers, or NULL
 * when the array cannot be presented as a little-endian raw tensor. */
static const char *npy_dtype_for(const char *descr)
{
    static const struct {
        const char *code, *dtype;
    } map[] = {
        {"b1", "BOOL"}, {"i1", "I8"},  {"u1", "U8"},  {"i2", "I16"}, {"u2", "U16"},
        {"f2", "F16"},  {"i4", "I32"}, {"u4", "U32"}, {"f4", "F32"}, {"i8", "I64"},
        {"u8", "U64"},  {"f8", "F64"},
    };
    char order = descr[0];
    const char *code = descr;
    if (order == '<' || order == '|' || order == '=' || order == '>')
        code++;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(code, map[i].code) != 0)
            continue;
        /* Byte order means nothing for one-byte types, so '>' is fine there. */
        if (order == '>' && code[1] != '1')
            return NULL;
        return map[i].dtype;
    }
    return NULL;
}

int ingest_npy(const uint8_t *head, size_t head_len, uint64_t file_size, const char *name,
               ingest_layout *out, uint64_t *need, char *msg, size_t msg_len)
{
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

    memset(out, 0, sizeof *out);
    set_msg(msg, msg_len, "%s", "");
    if (head_len > file_size)
        head_len = (size_t)file_size;
    if (!name || !name[0]) {
        set_msg(msg, msg_len, "npy: no tensor name given");
        return -EINVAL;
    }

    if (file_size < 8) {
        set_msg(msg, msg_len, "npy header: file is %llu bytes, too short for the npy preamble",
                (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < 8) {
        if (need)
            *need = 8;
        return -EAGAIN;
    }
    if (memcmp(head, magic, sizeof magic) != 0) {
        set_msg(msg, msg_len, "npy header: bad magic (not an npy file)");
        return -EINVAL;
    }
    unsigned major = head[6], minor = head[7];
    if (major < 1 || major > 3 || minor != 0) {
        set_msg(msg, msg_len, "npy header: unsupported format version %u.%u", major, minor);
        return -EINVAL;
    }
    /* Version 1 stores the header length in 2 bytes, versions 2 and 3 in 4. */
    unsigned len_bytes = major == 1 ? 2 : 4;
    uint64_t prefix = 8 + len_bytes;
    if (file_size < prefix) {
        set_msg(msg, msg_len, "npy header: file is %llu bytes, too short for the npy preamble",
                (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < prefix) {
        if (need)
            *need = prefix;
        return -EAGAIN;
    }
    uint64_t dict_len = read_le(head + 8, len_bytes);
    uint64_t header_bytes = prefix + dict_len;
    if (header_bytes > file_size) {
        set_msg(msg, msg_len,
                "npy header: header length %llu runs past the end of the %llu-byte file",
                (unsigned long long)dict_len, (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < header_bytes) {
        if (need)
            *need = header_bytes;
        return -EAGAIN;
    }

    npy_header h;
    memset(&h, 0, sizeof h);
    npy_lex lx = {.p = (const char *)head + prefix,
                  .end = (const char *)head + header_bytes,
                  .start = (const char *)head + prefix};
    lx.err[0] = '\0';
    if (!npy_parse_dict(&lx, &h)) {
        set_msg(msg, msg_len, "npy header: bad dict: %s", lx.err);
        return -EINVAL;
    }

    const char *dtype = h.descr_is_string && !h.descr_too_long ? npy_dtype_for(h.descr) : NULL;
    if (!dtype || h.fortran_order || h.too_many_dims)
        return 1;

    unsigned elem_size = ckpt_dtype_size(dtype);
    char st[SHAPE_TEXT_BUF];
    shape_text(st, sizeof st, h.shape, h.ndim);
    /* A one-dimensional shape prints as Python does: "(5,)". */
    const char *tuple_comma = h.ndim == 1 ? "," : "";
    uint64_t nbytes;
    if (elem_size == 0 || !tensor_nbytes(h.shape, h.ndim, elem_size, &nbytes)) {
        set_msg(msg, msg_len, "npy header: size of shape (%s%s) %s overflows 64 bits", st,
                tuple_comma, h.descr);
        return -EINVAL;
    }
    uint64_t data_len = file_size - header_bytes;
    if (data_len != nbytes) {
        set_msg(msg, msg_len, "npy data is %llu bytes but shape (%s%s) %s needs %llu",
                (unsigned long long)data_len, st, tuple_comma, h.descr,
                (unsigned long long)nbytes);
        return -EINVAL;
    }

    out->t = calloc(1, sizeof *out->t);
    char *copy = strdup(name);
    if (!out->t || !copy) {
        free(out->t);
        free(copy);
        out->t = NULL;
        set_msg(msg, msg_len, "npy: out of memory");
        return -ENOMEM;
    }
    ingest_tensor *t = &out->t[0];
    t->name = copy;
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = h.ndim;
    memcpy(t->shape, h.shape, sizeof h.shape);
    t->offset = header_bytes;
    t->nbytes = nbytes;
    out->n = 1;
    out->header_bytes = header_bytes;
    return 0;
}
