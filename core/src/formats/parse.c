/* The parsers' shared helpers (parse.h): message text and the header-read
 * loop. Kept apart from the parsers so each parser file is its format only. */
#include "parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ingest_msg(char *msg, size_t msg_len, const char *fmt, ...)
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

void ingest_quote_name(char *dst, size_t cap, const char *name)
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

void ingest_shape_text(char *dst, size_t cap, const uint64_t *shape, uint32_t ndim)
{
    size_t o = 0;
    dst[0] = '\0';
    for (uint32_t i = 0; i < ndim; i++) {
        int n = snprintf(dst + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
        if (n < 0 || (size_t)n >= cap - o) {
            /* Too long to show whole; mark the cut so it is not misread. */
            if (cap > 4)
                memcpy(dst + cap - 4, "...", 4);
            return;
        }
        o += (size_t)n;
    }
}

int ingest_path_has_suffix(const char *path, const char *suffix)
{
    size_t a = strlen(path), b = strlen(suffix);
    return a >= b && strcmp(path + a - b, suffix) == 0;
}

/* All of [off, off + len) from the source; short reads are retried, and an
 * early end means the file shrank after its size was taken. */
static int source_read_full(const ingest_source *src, uint8_t *buf, size_t len, uint64_t off,
                            char *msg, size_t msg_len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = src->read(src->ud, buf + done, len - done, off + done);
        if (r < 0) {
            ingest_msg(msg, msg_len, "read failed: %s", strerror((int)-r));
            return (int)r;
        }
        if (r == 0) {
            ingest_msg(msg, msg_len, "file shrank while being packed");
            return -EIO;
        }
        done += (size_t)r;
    }
    return 0;
}

/* The first read: enough for every preamble we know, and one page. */
#define HEAD_FIRST_READ 4096
/* Each -EAGAIN must ask for more than we have, so a parser settles within
 * a few rounds: preamble, length field, header. More is a parser bug. */
#define HEAD_MAX_ROUNDS 4

int ingest_describe_head(const ingest_source *src, ingest_head_parser parse,
                         const char *tensor_name, uint64_t max_head, const char *what,
                         ingest_layout *out, char *msg, size_t msg_len)
{
    memset(out, 0, sizeof *out);
    ingest_msg(msg, msg_len, "%s", "");
    uint64_t size = src->size;
    size_t have = size < HEAD_FIRST_READ ? (size_t)size : HEAD_FIRST_READ;
    uint8_t *head = malloc(have ? have : 1);
    if (!head) {
        ingest_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    int rc = source_read_full(src, head, have, 0, msg, msg_len);
    for (int round = 0; rc == 0; round++) {
        uint64_t need = 0;
        rc = parse(head, have, size, tensor_name, out, &need, msg, msg_len);
        if (rc != -EAGAIN)
            break;
        if (round + 1 >= HEAD_MAX_ROUNDS || need <= have || need > size || need > max_head) {
            ingest_msg(msg, msg_len, "invalid %s: header length %llu does not fit the file", what,
                       (unsigned long long)need);
            rc = -EINVAL;
            break;
        }
        uint8_t *bigger = realloc(head, (size_t)need);
        if (!bigger) {
            ingest_msg(msg, msg_len, "out of memory");
            rc = -ENOMEM;
            break;
        }
        head = bigger;
        rc = source_read_full(src, head + have, (size_t)need - have, have, msg, msg_len);
        have = (size_t)need;
    }
    free(head);
    return rc;
}
