/* `ckpt verify`: decode everything and check every digest. One line per
 * fault on stdout, so a damaged pack can be triaged (which file, where), and
 * exit status 1 if there was any. */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static const char verify_help[] =
    "usage: ckpt verify PACK [options]\n"
    "\n"
    "PACK is a .tpack file or a checkpoint directory of a ckptfs mount\n"
    "(MOUNT/NAME), which stands for the pack it shows.\n"
    "\n"
    "Decodes every chunk of PACK and checks its authentication tag or checksum,\n"
    "and the SHA-256 of every file and tensor. Prints one line per fault and\n"
    "exits with status 1 if any was found.\n"
    "\n"
    "options:\n"
    "  --key-file FILE           key of an encrypted pack\n"
    "  --passphrase-file FILE    passphrase of an encrypted pack\n"
    "  --threads N               decoding threads (default: all cores)\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

struct verify_opts {
    const char *pack;
    cli_keyopts keys;
    unsigned threads;
};

static int parse_verify_opts(int argc, char **argv, struct verify_opts *o)
{
    static const struct option opts[] = {
        CLI_KEY_OPTIONS,
        {"threads", required_argument, NULL, OPT_THREADS},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const cli_args a = {
        .cmd = "verify",
        .help = verify_help,
        .optstring = CLI_OPTSTRING_PREFIX "h",
        .longopts = opts,
        .pos = {&o->pack},
        .pos0_name = "PACK",
        .keys = &o->keys,
        .threads = &o->threads,
    };
    int rc = cli_parse_args(argc, argv, &a);
    return rc ? rc : cli_keyopts_check("verify", &o->keys);
}

struct fault_ctx {
    const char *name;
    progress *pg;
};

static void on_fault(void *ud, const char *kind, const char *name, uint64_t off, const char *fault)
{
    struct fault_ctx *ctx = ud;
    progress_clear(ctx->pg);
    /* The library's message is complete (pack, chunk, file, offset, fault);
     * rebuilding it here would only let the two drift apart. One printf per
     * line: stdio locks the stream per call, so concurrent faults do not
     * interleave. */
    char *line = NULL;
    if ((fault && fault[0] ? asprintf(&line, "%s", fault)
                           : asprintf(&line, "%s: %s '%s' at offset %" PRIu64 ": fault", ctx->name,
                                      kind, name, off)) < 0) {
        puts("fault (out of memory describing it)");
        return;
    }
    cli_sanitize(line); /* it quotes names from the pack */
    printf("%s\n", line);
    fflush(stdout);
    free(line);
}

int cmd_verify(int argc, char **argv)
{
    struct verify_opts o = {0};
    int rc = parse_verify_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;

    ckpt_pack *p;
    ckpt_key *key;
    if (cli_open_pack(o.pack, &o.keys, &p, &key))
        return EXIT_FAIL;
    ckpt_pack_info info;
    ckpt_info(p, &info);

    progress pg;
    progress_start(&pg, "verifying", info.logical_bytes);
    struct fault_ctx ctx = {.name = o.pack, .pg = &pg};
    ckpt_err err = {0};
    long faults = ckpt_verify(p, o.threads, on_fault, &ctx, progress_cb, &pg, &err);
    progress_end(&pg);
    cli_close_pack(p, key);

    if (faults < 0)
        return cli_fail_err(&err);
    if (faults > 0) {
        printf("FAILED: %ld %s\n", faults, faults == 1 ? "fault" : "faults");
        return EXIT_FAIL;
    }
    printf("OK: %zu files, %zu tensors, %zu chunks verified\n", info.n_files, info.n_tensors,
           info.n_chunks);
    return EXIT_OK;
}
