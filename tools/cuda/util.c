#include "util.h"

#define CKPT_INTERNAL_API /* ckpt_write_full, ckpt_pread_full */
#include "ckpt_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cc_fail(ckpt_err *err, int code, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int cc_fail_copy(ckpt_err *err, const ckpt_err *from)
{
    if (err && err != from)
        *err = *from;
    return from->code;
}

void cc_fmt_bytes(uint64_t n, char out[32])
{
    static const char *const units[] = {"kB", "MB", "GB", "TB", "PB"};
    if (n < 1000) {
        snprintf(out, 32, "%llu B", (unsigned long long)n);
        return;
    }
    double v = (double)n / 1000.0;
    size_t u = 0;
    while (v >= 1000.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1000.0;
        u++;
    }
    snprintf(out, 32, "%.1f %s", v, units[u]);
}

double cc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

unsigned cc_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1u : (unsigned)n;
}

int cc_write_all(int fd, const void *buf, size_t len)
{
    ssize_t w = ckpt_write_full(fd, buf, len);
    return w < 0 ? (int)w : 0;
}

int cc_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
    ssize_t r = ckpt_pread_full(fd, buf, len, off);
    return r < 0 ? (int)r : (size_t)r < len ? -EIO : 0;
}
