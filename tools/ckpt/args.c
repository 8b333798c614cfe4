/* Command lines, their values and usage errors. Every usage error ends in a
 * pointer to the help, and exits with EXIT_USAGE so scripts can tell a typo
 * from a failed operation. */
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

/* The next free slot of the positionals takes arg; none left is an error. */
static int take_positional(const cli_args *a, const char *arg)
{
    for (size_t i = 0; i < sizeof a->pos / sizeof a->pos[0] && a->pos[i]; i++) {
        if (!*a->pos[i]) {
            *a->pos[i] = arg;
            return 0;
        }
    }
    return cli_usage_error(a->cmd, "unexpected argument '%s'%s", arg, a->surplus ? a->surplus : "");
}

int cli_parse_args(int argc, char **argv, const cli_args *a)
{
    int c, rc;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, a->optstring, a->longopts, NULL)) != -1) {
        if (cli_keyopt(c, optarg, a->keys))
            continue;
        if (c == 1) {
            rc = take_positional(a, optarg);
        } else if (c == OPT_THREADS && a->threads) {
            rc = cli_parse_uint(optarg, 0, 1024, a->threads) < 0
                     ? cli_usage_error(a->cmd, "bad --threads '%s': expected 0..1024", optarg)
                     : 0;
        } else if (c == 'h') {
            fputs(a->help, stdout);
            return -1;
        } else if (c == '?' || c == ':' || !a->own) {
            rc = cli_bad_option(a->cmd, c, argv);
        } else {
            rc = a->own(a->ud, c, optarg);
        }
        if (rc)
            return rc;
    }
    /* What follows "--" is positional too. */
    for (; optind < argc; optind++)
        if ((rc = take_positional(a, argv[optind])))
            return rc;
    if (!*a->pos[0])
        return cli_usage_error(a->cmd, "missing %s", a->pos0_name);
    return 0;
}
