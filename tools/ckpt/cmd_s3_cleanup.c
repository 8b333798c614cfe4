/* `ckpt s3-cleanup`: aborts the unfinished multipart uploads that a crashed
 * or killed `ckpt pack -o s3://...` (or daemon) left under a prefix. S3
 * keeps their parts, and bills for them, until someone does. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char cleanup_help[] =
    "usage: ckpt s3-cleanup s3://BUCKET[/PREFIX] [options]\n"
    "\n"
    "Aborts the unfinished uploads under PREFIX: what a writer killed in the\n"
    "middle of a pack leaves behind. No pack is touched, and packs in progress\n"
    "are spared unless --older-than 0 says otherwise.\n"
    "\n"
    "options:\n"
    "  --older-than SECONDS      only uploads begun this long ago (default 86400;\n"
    "                            0: all, for when no writer is running)\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

int cmd_s3_cleanup(int argc, char **argv)
{
    static const struct option opts[] = {
        {"older-than", required_argument, NULL, OPT_OLDER_THAN},
        CLI_S3_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    cli_keyopts k = {0};
    const char *url = NULL;
    unsigned older = 86400;
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "h", opts, NULL)) != -1) {
        if (cli_keyopt(c, optarg, &k))
            continue;
        switch (c) {
        case 1:
            if (url)
                return cli_usage_error("s3-cleanup", "unexpected argument '%s'", optarg);
            url = optarg;
            break;
        case OPT_OLDER_THAN:
            if (cli_parse_uint(optarg, 0, 100u * 365 * 86400, &older) < 0)
                return cli_usage_error("s3-cleanup", "bad --older-than '%s': expected seconds",
                                       optarg);
            break;
        case 'h':
            fputs(cleanup_help, stdout);
            return EXIT_OK;
        default:
            return cli_bad_option("s3-cleanup", c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("s3-cleanup", "unexpected argument '%s'", argv[optind]);
    if (!url)
        return cli_usage_error("s3-cleanup", "missing s3://BUCKET[/PREFIX]");
    if (!cli_is_s3(url))
        return cli_usage_error("s3-cleanup", "'%s' is not an s3:// URL", url);
    ckpt_err err = {0};
    ckpt_store *s;
    if (cli_store_open(url, &k, &s, &err) < 0)
        return cli_fail_err(&err);
    long n = ckpt_store_abort_stale_uploads(s, NULL, older, &err);
    ckpt_store_free(s);
    if (n < 0)
        return cli_fail_err(&err);
    printf("aborted %ld unfinished upload%s under %s\n", n, n == 1 ? "" : "s", url);
    return EXIT_OK;
}
