/* ckpt-gen's output: files written through a 1 MiB buffer (so memory use
 * does not grow with the model) and counted for the summary, and the
 * growable strings the headers are built in. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPT_INTERNAL_API /* ckpt_write_full */
#include "ckpt_internal.h"
#include "gen.h"

#define WRITE_BUF_BYTES (1u << 20)

uint64_t total_bytes_written;
unsigned files_written;

char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (!p) {
        fputs("ckpt-gen: out of memory\n", stderr);
        exit(1);
    }
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

void out_open(out_file *f, const char *dir, const char *name)
{
    f->path = path_join(dir, name);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0)
        io_error(f->path);
    f->buf = malloc(WRITE_BUF_BYTES);
    if (!f->buf) {
        fputs("ckpt-gen: out of memory\n", stderr);
        exit(1);
    }
    f->used = 0;
    f->bytes = 0;
}

static void out_flush(out_file *f)
{
    ssize_t w = ckpt_write_full(f->fd, f->buf, f->used);
    if (w < 0) {
        errno = (int)-w; /* io_error() reports errno */
        io_error(f->path);
    }
    f->used = 0;
}

void out_write(out_file *f, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        if (f->used == WRITE_BUF_BYTES)
            out_flush(f);
        size_t n = WRITE_BUF_BYTES - f->used;
        if (n > len)
            n = len;
        memcpy(f->buf + f->used, p, n);
        f->used += n;
        f->bytes += n;
        p += n;
        len -= n;
    }
}

/* Room for one element; flushes first if the buffer is full. Elements are
 * 2 or 4 bytes and the buffer size is a multiple of 4, so they never split. */
uint8_t *out_reserve(out_file *f, size_t n)
{
    if (WRITE_BUF_BYTES - f->used < n)
        out_flush(f);
    uint8_t *p = f->buf + f->used;
    f->used += n;
    f->bytes += n;
    return p;
}

void out_close(out_file *f)
{
    out_flush(f);
    if (close(f->fd) != 0)
        io_error(f->path);
    total_bytes_written += f->bytes;
    files_written++;
    free(f->buf);
    free(f->path);
    memset(f, 0, sizeof *f);
}

void sb_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            fputs("ckpt-gen: formatting failed\n", stderr);
            exit(1);
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) {
            fputs("ckpt-gen: out of memory\n", stderr);
            exit(1);
        }
    }
}

void write_text_file(const char *dir, const char *name, const strbuf *b)
{
    out_file f;
    out_open(&f, dir, name);
    out_write(&f, b->s, b->len);
    out_close(&f);
}
