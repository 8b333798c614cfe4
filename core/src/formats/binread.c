/* The binary parsers' cursor, messages and layout check: see binread.h. */
#include "binread.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void binread_init(binread *r, const ingest_source *src, uint64_t pos)
{
    r->src = src;
    r->pos = pos;
    r->win_off = 0;
    r->win_len = 0;
    r->err = 0;
}

uint64_t binread_left(const binread *r)
{
    return r->pos < r->src->size ? r->src->size - r->pos : 0;
}

/* Refills the window so that it starts at pos. */
static bool refill(binread *r)
{
    uint64_t left = binread_left(r);
    size_t want = left < BINREAD_WINDOW ? (size_t)left : BINREAD_WINDOW;
    size_t got = 0;
    while (got < want) {
        ssize_t n = r->src->read(r->src->ud, r->win + got, want - got, r->pos + got);
        if (n < 0) {
            r->err = (int)n;
            return false;
        }
        if (n == 0) { /* the file shrank under us */
            r->err = -EIO;
            return false;
        }
        got += (size_t)n;
    }
    r->win_off = r->pos;
    r->win_len = got;
    return true;
}

bool binread_bytes(binread *r, void *dst, size_t n)
{
    if (r->err)
        return false;
    if (n > binread_left(r)) {
        r->err = -EINVAL;
        return false;
    }
    uint8_t *out = dst;
    while (n > 0) {
        if (r->pos < r->win_off || r->pos >= r->win_off + r->win_len) {
            if (!refill(r))
                return false;
        }
        size_t at = (size_t)(r->pos - r->win_off);
        size_t take = r->win_len - at < n ? r->win_len - at : n;
        memcpy(out, r->win + at, take);
        out += take;
        r->pos += take;
        n -= take;
    }
    return true;
}

bool binread_skip(binread *r, uint64_t n)
{
    if (r->err)
        return false;
    if (n > binread_left(r)) {
        r->err = -EINVAL;
        return false;
    }
    r->pos += n;
    return true;
}

bool binread_seek(binread *r, uint64_t pos)
{
    if (r->err)
        return false;
    if (pos > r->src->size) {
        r->err = -EINVAL;
        return false;
    }
    r->pos = pos;
    return true;
}

bool binread_u8(binread *r, uint8_t *v)
{
    return binread_bytes(r, v, 1);
}

bool binread_u16(binread *r, uint16_t *v)
{
    uint8_t b[2];
    if (!binread_bytes(r, b, 2))
        return false;
    *v = (uint16_t)(b[0] | (b[1] << 8));
    return true;
}

bool binread_u32(binread *r, uint32_t *v)
{
    uint8_t b[4];
    if (!binread_bytes(r, b, 4))
        return false;
    *v = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    return true;
}

bool binread_u64(binread *r, uint64_t *v)
{
    uint8_t b[8];
    if (!binread_bytes(r, b, 8))
        return false;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | b[i];
    *v = x;
    return true;
}

void binread_msg(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (!msg || msg_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_len, fmt, ap);
    va_end(ap);
    for (unsigned char *c = (unsigned char *)msg; *c; c++)
        if (*c < 0x20 || *c == 0x7f)
            *c = '?';
}

void binread_quote(char *dst, size_t cap, const char *name, size_t name_len)
{
    size_t o = 0, taken = 0;
    const unsigned char *s = (const unsigned char *)name;
    if (cap == 0)
        return;
    for (size_t i = 0; i < name_len; i++) {
        /* Cut only at the start of a UTF-8 sequence, never inside one. */
        if (taken >= 64 && (s[i] & 0xC0) != 0x80) {
            if (o + 4 <= cap)
                memcpy(dst + o, "...", 4);
            else
                dst[o] = '\0';
            return;
        }
        if (o + 5 >= cap)
            break;
        if (s[i] < 0x20 || s[i] == 0x7F || s[i] == '\'' || s[i] == '\\')
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", s[i]);
        else
            dst[o++] = (char)s[i];
        taken++;
    }
    dst[o] = '\0';
}

/* One typed range for the overlap check. */
typedef struct span {
    uint64_t begin, end;
    const char *what; /* tensor name or region dtype */
    int is_region;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    const ingest_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int region_cmp(const void *a, const void *b)
{
    const ingest_region *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->length != y->length)
        return x->length < y->length ? -1 : 1;
    return 0;
}

static void span_text(char *dst, size_t cap, const span *s)
{
    char q[BINREAD_QUOTE_BUF];
    binread_quote(q, sizeof q, s->what, strlen(s->what));
    snprintf(dst, cap, "%s '%s' [%llu, %llu)", s->is_region ? "region of" : "tensor", q,
             (unsigned long long)s->begin, (unsigned long long)s->end);
}

int binread_finish_layout(ingest_layout *out, uint64_t file_size, const char *fmt, char *msg,
                          size_t msg_len)
{
    size_t n = out->n + out->n_regions;
    if (out->n > 1)
        qsort(out->t, out->n, sizeof *out->t, tensor_cmp);
    if (out->n_regions > 1)
        qsort(out->regions, out->n_regions, sizeof *out->regions, region_cmp);
    span *s = calloc(n ? n : 1, sizeof *s);
    if (!s) {
        binread_msg(msg, msg_len, "%s: out of memory", fmt);
        return -ENOMEM;
    }
    size_t k = 0;
    uint64_t first = file_size;
    for (size_t i = 0; i < out->n; i++) {
        const ingest_tensor *t = &out->t[i];
        s[k++] = (span){t->offset, t->offset + t->nbytes, t->name, 0};
        if (t->offset < first)
            first = t->offset;
    }
    for (size_t i = 0; i < out->n_regions; i++) {
        const ingest_region *g = &out->regions[i];
        s[k++] = (span){g->offset, g->offset + g->length, g->dtype, 1};
        if (g->offset < first)
            first = g->offset;
    }
    int rc = 0;
    char a[BINREAD_QUOTE_BUF + 64], b[BINREAD_QUOTE_BUF + 64];
    /* Callers computed offset + length without overflow; check the file. */
    for (size_t i = 0; i < k; i++) {
        if (s[i].end > file_size || s[i].end < s[i].begin) {
            span_text(a, sizeof a, &s[i]);
            binread_msg(msg, msg_len, "%s: %s runs past the end of the %llu-byte file", fmt, a,
                        (unsigned long long)file_size);
            rc = -EINVAL;
            goto out;
        }
    }
    qsort(s, k, sizeof *s, span_cmp);
    const span *prev = NULL;
    for (size_t i = 0; i < k; i++) {
        if (s[i].begin == s[i].end)
            continue;
        if (prev && s[i].begin < prev->end) {
            span_text(a, sizeof a, &s[i]);
            span_text(b, sizeof b, prev);
            binread_msg(msg, msg_len, "%s: %s overlaps %s", fmt, a, b);
            rc = -EINVAL;
            goto out;
        }
        prev = &s[i];
    }
    out->header_bytes = first;
out:
    free(s);
    return rc;
}

void binread_layout_free(ingest_layout *out)
{
    /* Skipped tensors (GGUF's quantized ones) too: one freeing rule. */
    ingest_layout_free(out);
}
