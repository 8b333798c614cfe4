/* Command-line values and usage errors. Every usage error ends in a pointer
 * to the help, and exits with EXIT_USAGE so scripts can tell a typo from a
 * failed operation. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ckpt%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (cmd)
        fprintf(stderr, "\nsee 'ckpt %s --help' or 'ckpt --help'\n", cmd);
    else
        fprintf(stderr, "\nsee 'ckpt --help'\n");
    return EXIT_USAGE;
}

int cli_bad_option(const char *cmd, int c, char **argv)
{
    /* getopt leaves the offending element just before optind; for a short
     * option inside a cluster ("-xq") optopt is the precise culprit. */
    const char *arg = optind > 0 ? argv[optind - 1] : "?";
    if (c == ':')
        return cli_usage_error(cmd, "option '%s' needs a value", arg);
    if (optopt > 0 && optopt < 0x100 && arg[0] == '-' && arg[1] != '-')
        return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return cli_usage_error(cmd, "unknown option '%s'", arg);
}

int cli_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = (unsigned)v;
    return 0;
}

int cli_parse_chunk_size(const char *s, uint32_t *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned long long mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1024 * 1024, end++;
    /* "1MiB" and "64KB" read naturally too, and mean the same. */
    if (mult > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end || v > CKPT_CHUNK_MAX)
        return -1;
    v *= mult;
    if (v < CKPT_CHUNK_MIN || v > CKPT_CHUNK_MAX || (v & (v - 1)) != 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}
