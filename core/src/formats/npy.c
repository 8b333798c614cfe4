/* The npy container (numpy.save), versions 1-3: a magic string, a version,
 * a little-endian header length, a Python dict literal giving descr,
 * fortran_order and shape, then the array's bytes.
 *
 * The dict is parsed by a small lexer of exactly the literals numpy writes
 * (strings, integers, booleans, tuples, and the lists of a structured
 * descr), never by evaluating it. The input is untrusted: every length is
 * checked before it is used, sizes are computed with overflow checks,
 * nesting is bounded, and nothing past head_len is read. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "parse.h"

/* npy headers are tiny in practice; this bounds what a hostile one can make
 * us read. */
#define NPY_MAX_HEADER (64u << 20)

/* What the header dict says, once parsed. */
typedef struct npy_header {
    char descr[16];
    bool descr_is_string; /* false for structured (list) descrs */
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
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
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
                            (*after >= 'A' && *after <= 'Z') || (*after >= '0' && *after <= '9')))
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
        {"b1", "BOOL"}, {"i1", "I8"},  {"u1", "U8"},  {"i2", "I16"}, {"u2", "U16"}, {"f2", "F16"},
        {"i4", "I32"},  {"u4", "U32"}, {"f4", "F32"}, {"i8", "I64"}, {"u8", "U64"}, {"f8", "F64"},
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
    ingest_msg(msg, msg_len, "%s", "");
    if (head_len > file_size)
        head_len = (size_t)file_size;
    if (!name || !name[0]) {
        ingest_msg(msg, msg_len, "npy: no tensor name given");
        return -EINVAL;
    }

    if (file_size < 8) {
        ingest_msg(msg, msg_len, "npy header: file is %llu bytes, too short for the npy preamble",
                   (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < 8) {
        if (need)
            *need = 8;
        return -EAGAIN;
    }
    if (memcmp(head, magic, sizeof magic) != 0) {
        ingest_msg(msg, msg_len, "npy header: bad magic (not an npy file)");
        return -EINVAL;
    }
    unsigned major = head[6], minor = head[7];
    if (major < 1 || major > 3 || minor != 0) {
        ingest_msg(msg, msg_len, "npy header: unsupported format version %u.%u", major, minor);
        return -EINVAL;
    }
    /* Version 1 stores the header length in 2 bytes, versions 2 and 3 in 4. */
    unsigned len_bytes = major == 1 ? 2 : 4;
    uint64_t prefix = 8 + len_bytes;
    if (file_size < prefix) {
        ingest_msg(msg, msg_len, "npy header: file is %llu bytes, too short for the npy preamble",
                   (unsigned long long)file_size);
        return -EINVAL;
    }
    if (head_len < prefix) {
        if (need)
            *need = prefix;
        return -EAGAIN;
    }
    uint64_t dict_len = ingest_read_le(head + 8, len_bytes);
    uint64_t header_bytes = prefix + dict_len;
    if (header_bytes > file_size) {
        ingest_msg(msg, msg_len,
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
        ingest_msg(msg, msg_len, "npy header: bad dict: %s", lx.err);
        return -EINVAL;
    }

    const char *dtype = h.descr_is_string && !h.descr_too_long ? npy_dtype_for(h.descr) : NULL;
    if (!dtype || h.fortran_order || h.too_many_dims)
        return 1;

    unsigned elem_size = ckpt_dtype_size(dtype);
    char st[SHAPE_TEXT_BUF];
    ingest_shape_text(st, sizeof st, h.shape, h.ndim);
    /* A one-dimensional shape prints as Python does: "(5,)". */
    const char *tuple_comma = h.ndim == 1 ? "," : "";
    uint64_t nbytes;
    if (elem_size == 0 || !ingest_tensor_nbytes(h.shape, h.ndim, elem_size, &nbytes)) {
        ingest_msg(msg, msg_len, "npy header: size of shape (%s%s) %s overflows 64 bits", st,
                   tuple_comma, h.descr);
        return -EINVAL;
    }
    uint64_t data_len = file_size - header_bytes;
    if (data_len != nbytes) {
        ingest_msg(msg, msg_len, "npy data is %llu bytes but shape (%s%s) %s needs %llu",
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
        ingest_msg(msg, msg_len, "npy: out of memory");
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

static int npy_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    (void)head, (void)head_len, (void)size;
    return ingest_path_has_suffix(path, ".npy");
}

/* An npy file holds one tensor, named by its path without the extension. */
static int npy_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                        size_t msg_len)
{
    size_t len = strlen(path);
    if (ingest_path_has_suffix(path, ".npy"))
        len -= 4;
    char *name = strndup(path, len);
    if (!name) {
        memset(out, 0, sizeof *out);
        ingest_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    int rc =
        ingest_describe_head(src, ingest_npy, name, NPY_MAX_HEADER, "npy file", out, msg, msg_len);
    free(name);
    return rc;
}

const container_format ckpt_format_npy = {"npy", npy_sniff, npy_describe};
