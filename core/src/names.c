/* Names in JSON (ckpt_names.h). */
#include "ckpt_names.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s, or 0. */
static size_t utf8_seq(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int ckpt_name_is_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = utf8_seq(p);
        if (!n)
            return 0;
        p += n;
    }
    return 1;
}

char *ckpt_name_display(const char *s)
{
    if (ckpt_name_is_utf8(s))
        return strdup(s);
    size_t len = strlen(s);
    char *out = malloc(len * 4 + 1), *o = out;
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = utf8_seq(p);
        if (n == 1 && *p == '\\') {
            *o++ = '\\';
            *o++ = '\\';
        } else if (n) {
            memcpy(o, p, n);
            o += n;
        } else {
            o += sprintf(o, "\\x%02X", *p);
            n = 1;
        }
        p += n;
    }
    *o = '\0';
    return out;
}

char *ckpt_base64(const void *data, size_t len)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *in = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? alphabet[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? alphabet[v & 63] : '=';
    }
    *o = '\0';
    return out;
}
