/* Helpers for the container parsers in formats/: exact reads through an
 * ingest_source, and messages that are one printable line naming the fault,
 * with names from the file quoted safely. Private to core/src/formats
 * (static inline, so each parser stays one unit).
 *
 * The same conventions as ingest.c's safetensors and npy messages: control
 * bytes become '?', quoted names are cut after 64 characters at a UTF-8
 * boundary and their quote and backslash bytes are escaped. */
#ifndef CKPT_FORMATS_FMT_UTIL_H
#define CKPT_FORMATS_FMT_UTIL_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "formats/formats.h"

#define FMT_QUOTE_MAX 64
#define FMT_QUOTE_BUF (FMT_QUOTE_MAX * 4 + 8)

static inline void fmt_msg(char *msg, size_t msg_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void fmt_msg(char *msg, size_t msg_len, const char *fmt, ...)
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

/* Quotes len bytes of s (which need not be NUL-terminated) into dst. */
static inline void fmt_quote_n(char *dst, size_t cap, const char *s, size_t len)
{
    size_t o = 0, taken = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len; i++) {
        if (taken >= FMT_QUOTE_MAX && (p[i] & 0xC0) != 0x80) {
            snprintf(dst + o, cap - o, "...");
            return;
        }
        if (o + 5 >= cap)
            break;
        if (p[i] < 0x20 || p[i] == 0x7F || p[i] == '\'' || p[i] == '\\')
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", p[i]);
        else
            dst[o++] = (char)p[i];
        taken++;
    }
    dst[o] = '\0';
}

static inline void fmt_quote(char *dst, size_t cap, const char *s)
{
    fmt_quote_n(dst, cap, s, strlen(s));
}

/* Reads exactly len bytes at off: 0; -EIO for a short read or a range past
 * src->size; or the read callback's -errno. */
static inline int fmt_read_exact(const ingest_source *src, void *buf, size_t len, uint64_t off)
{
    if (off > src->size || len > src->size - off)
        return -EIO;
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = src->read(src->ud, p, len, off);
        if (r < 0)
            return (int)r;
        if (r == 0 || (size_t)r > len)
            return -EIO;
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

#endif
