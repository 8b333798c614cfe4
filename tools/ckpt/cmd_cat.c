/* `ckpt cat`: one file, or one tensor's raw bytes, to stdout. Only the
 * chunks that cover it are decoded, so pulling one tensor out of a large
 * checkpoint costs about the size of that tensor. */
#include "cli.h"
#define CKPT_INTERNAL_API /* ckpt_write_full */
#include "ckpt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char cat_help[] =
    "usage: ckpt cat PACK PATH [options]\n"
    "       ckpt cat PACK --tensor NAME [options]\n"
    "\n"
    "PACK is a .tpack file or a checkpoint directory of a ckptfs mount\n"
    "(MOUNT/NAME), which stands for the pack it shows.\n"
    "\n"
    "Writes the file PATH of PACK, or the raw bytes of the tensor NAME\n"
    "(little-endian, C order, as stored in its file), to stdout.\n"
    "\n"
    "options:\n"
    "  --tensor NAME             a tensor instead of a file\n"
    "  --key-file FILE           key of an encrypted pack\n"
    "  --passphrase-file FILE    passphrase of an encrypted pack\n"
    "  --threads N               decoding threads (default: all cores)\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

struct cat_opts {
    const char *pack, *path, *tensor;
    cli_keyopts keys;
    unsigned threads;
};

static int parse_cat_opts(int argc, char **argv, struct cat_opts *o)
{
    static const struct option opts[] = {
        CLI_KEY_OPTIONS,
        {"tensor", required_argument, NULL, OPT_TENSOR},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "h", opts, NULL)) != -1) {
        if (cli_keyopt(c, optarg, &o->keys))
            continue;
        switch (c) {
        case 1:
            if (!o->pack)
                o->pack = optarg;
            else if (!o->path)
                o->path = optarg;
            else
                return cli_usage_error("cat", "unexpected argument '%s'", optarg);
            break;
        case OPT_TENSOR:
            o->tensor = optarg;
            break;
        case OPT_THREADS:
            if (cli_parse_uint(optarg, 0, 1024, &o->threads) < 0)
                return cli_usage_error("cat", "bad --threads '%s': expected 0..1024", optarg);
            break;
        case 'h':
            fputs(cat_help, stdout);
            return -1;
        default:
            return cli_bad_option("cat", c, argv);
        }
    }
    for (; optind < argc; optind++) {
        if (!o->pack)
            o->pack = argv[optind];
        else if (!o->path)
            o->path = argv[optind];
        else
            return cli_usage_error("cat", "unexpected argument '%s'", argv[optind]);
    }
    if (!o->pack)
        return cli_usage_error("cat", "missing PACK");
    if (o->path && o->tensor)
        return cli_usage_error("cat", "give either PATH or --tensor NAME, not both");
    if (!o->path && !o->tensor)
        return cli_usage_error("cat", "missing PATH or --tensor NAME");
    return cli_keyopts_check("cat", &o->keys);
}

struct out_ctx {
    int write_errno;
    ckpt_err chunk_err;
};

static int to_stdout(void *ud, uint64_t off, const void *data, size_t len, const ckpt_err *cerr)
{
    struct out_ctx *s = ud;
    if (!data) {
        s->chunk_err = *cerr;
        return cerr->code ? cerr->code : -EIO;
    }
    ssize_t n = ckpt_write_full(STDOUT_FILENO, data, len);
    if (n < 0) {
        s->write_errno = (int)-n;
        return (int)n;
    }
    return 0;
}

int cmd_cat(int argc, char **argv)
{
    struct cat_opts o = {0};
    int rc = parse_cat_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;

    ckpt_pack *p;
    ckpt_key *key;
    if (cli_open_pack(o.pack, &o.keys, &p, &key))
        return EXIT_FAIL;

    /* A tensor is a byte range of the file that holds it (an assembled
     * one, a range of each of its parts' files in turn); streaming a range
     * decodes ahead in parallel just like a whole file. */
    size_t file = 0;
    uint64_t off = 0, len;
    long tensor = -1;
    if (o.tensor) {
        tensor = ckpt_tensor_find(p, o.tensor);
        if (tensor < 0) {
            cli_close_pack(p, key);
            return cli_fail("%s: no tensor named '%s'", o.pack, o.tensor);
        }
        len = ckpt_tensor_at(p, (size_t)tensor)->nbytes;
    } else {
        long f = ckpt_file_find(p, o.path);
        if (f < 0) {
            cli_close_pack(p, key);
            return cli_fail("%s: no file '%s' in the pack", o.pack, o.path);
        }
        file = (size_t)f;
        len = ckpt_file_at(p, file)->size;
    }

    ckpt_err err = {0};
    struct out_ctx s = {0};
    rc = 0;
    for (uint64_t done = 0; rc >= 0 && done < len;) {
        uint64_t run = len - done;
        if (tensor >= 0)
            rc = ckpt_tensor_locate(p, (size_t)tensor, done, &file, &off, &run, &err);
        if (rc >= 0)
            rc = ckpt_file_stream(p, file, off, run, o.threads, to_stdout, &s, &err);
        done += run;
    }
    cli_close_pack(p, key);
    if (rc >= 0)
        return EXIT_OK;
    if (s.chunk_err.msg[0])
        return cli_fail_err(&s.chunk_err);
    if (s.write_errno)
        return cli_fail("writing to stdout: %s", strerror(s.write_errno));
    return cli_fail_err(&err);
}
