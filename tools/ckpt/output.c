/* Failure messages and the human-readable numbers used in summaries. Sizes
 * use decimal units so that "MB/s" compares directly with disk and network
 * figures quoted elsewhere. */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Bytes of s at c that a terminal takes as a control: C0 and DEL (1), and
 * the C1 controls U+0080..U+009F in UTF-8 (2: xterm reads U+009B as CSI).
 * 0: a byte to show as it is. */
static int control_len(const unsigned char *c)
{
    if (*c < 0x20 || *c == 0x7f)
        return 1;
    if (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f)
        return 2;
    return 0;
}

void cli_sanitize(char *s)
{
    unsigned char *in = (unsigned char *)s, *out = in;
    while (*in) {
        int n = control_len(in);
        if (n) {
            *out++ = '?';
            in += n;
        } else {
            *out++ = *in++;
        }
    }
    *out = '\0';
}

void cli_put_name(const char *name)
{
    for (const unsigned char *c = (const unsigned char *)name; *c;) {
        int n = control_len(c);
        putchar(n ? '?' : *c);
        c += n ? n : 1;
    }
}

/* A message may quote names from a pack: its control bytes become '?'. */
int cli_fail(const char *fmt, ...)
{
    va_list ap;
    char *msg = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    fputs("ckpt: ", stderr);
    if (n < 0) {
        fputs("out of memory\n", stderr);
        return EXIT_FAIL;
    }
    cli_sanitize(msg);
    fputs(msg, stderr);
    fputc('\n', stderr);
    free(msg);
    return EXIT_FAIL;
}

int cli_fail_err(const ckpt_err *err)
{
    return cli_fail("%s", err->msg[0] ? err->msg : "unknown error");
}

const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"kB", "MB", "GB", "TB", "PB"};
    if (n < 1000) {
        snprintf(buf, len, "%u B", (unsigned)n);
        return buf;
    }
    double v = (double)n / 1000.0;
    size_t u = 0;
    while (v >= 999.95 && u + 1 < sizeof unit / sizeof unit[0]) {
        v /= 1000.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

const char *cli_fmt_rate(uint64_t bytes, double secs, char *buf, size_t len)
{
    double mbs = secs > 0 ? (double)bytes / secs / 1e6 : 0.0;
    /* Small rates keep a decimal so a tiny demo does not read "0 MB/s". */
    snprintf(buf, len, mbs >= 10.0 ? "%.0f MB/s" : "%.1f MB/s", mbs);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
