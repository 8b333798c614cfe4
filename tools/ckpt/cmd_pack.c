/* `ckpt pack`: a directory or a single file into a .tpack.
 *
 * The library writes OUT.tmp (a shortened name with a hash where that would
 * pass NAME_MAX) and renames it into place only when the pack is complete, so the one thing left to this command is never to leave the
 * temporary file behind: on errors it aborts the writer, and on SIGINT or
 * SIGTERM the next progress callback cancels it, which fails the add under
 * way, and it is aborted the same.
 *
 * OUT may be s3://BUCKET/[PREFIX/]NAME.tpack: the pack is then uploaded as
 * it is written (a multipart upload that becomes the object only when the
 * pack is complete); an interrupted pack aborts its own upload, and only
 * that one: another writer may be uploading the same name. */
#define CKPT_INTERNAL_API /* ckpt_store_remove */
#include "ckpt_internal.h"
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char pack_help[] =
    "usage: ckpt pack SRC -o OUT.tpack [options]\n"
    "\n"
    "Packs SRC, a directory (recursively; regular files only) or a single file,\n"
    "into OUT.tpack. Checkpoint files are checked and their tensors indexed:\n"
    "*.safetensors, *.npy and DCP *.distcp by name, torch.save archives, GGUF\n"
    "and tensorizer files by their first bytes. Other files, and those that fail\n"
    "the check (with a warning), are stored as they are. OUT may be an S3 object,\n"
    "s3://BUCKET/[PREFIX/]NAME.tpack, uploaded while it is packed.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE         the pack to write (required)\n"
    "  --key-file FILE           encrypt with the key in FILE (see 'ckpt keygen')\n"
    "  --passphrase-file FILE    encrypt with a key derived from a passphrase\n"
    "  --cipher NAME             aes256gcm (default where the CPU has hardware\n"
    "                            AES) or xchacha20poly1305 (default elsewhere);\n"
    "                            needs a key\n"
    "  --chunk-size SIZE         64K..16M, a power of two (default 1M)\n"
    "  --level N                 compression level 1..9 (default 6)\n"
    "  --no-compress             store the data without compressing it\n"
    "  --threads N               worker threads (default: all cores)\n"
    "  -f, --force               replace OUT if it exists\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

struct pack_opts {
    const char *src, *out;
    cli_keyopts keys;
    const char *cipher;
    uint32_t chunk_size;
    int level;
    int no_compress;
    unsigned threads;
    int force;
};

static int pack_opt(void *ud, int c, const char *arg)
{
    struct pack_opts *o = ud;
    unsigned level;
    switch (c) {
    case 'o':
        o->out = arg;
        break;
    case OPT_CIPHER:
        o->cipher = arg;
        break;
    case OPT_CHUNK_SIZE:
        if (cli_parse_chunk_size(arg, &o->chunk_size) < 0)
            return cli_usage_error("pack",
                                   "bad --chunk-size '%s': expected a power of two "
                                   "from 64K to 16M",
                                   arg);
        break;
    case OPT_LEVEL:
        if (cli_parse_uint(arg, 1, 9, &level) < 0)
            return cli_usage_error("pack", "bad --level '%s': expected 1..9", arg);
        o->level = (int)level;
        break;
    case OPT_NO_COMPRESS:
        o->no_compress = 1;
        break;
    case 'f':
        o->force = 1;
        break;
    }
    return 0;
}

static int parse_pack_opts(int argc, char **argv, struct pack_opts *o)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        CLI_KEY_OPTIONS,
        {"cipher", required_argument, NULL, OPT_CIPHER},
        {"chunk-size", required_argument, NULL, OPT_CHUNK_SIZE},
        {"level", required_argument, NULL, OPT_LEVEL},
        {"no-compress", no_argument, NULL, OPT_NO_COMPRESS},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"force", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const cli_args a = {
        .cmd = "pack",
        .help = pack_help,
        .optstring = CLI_OPTSTRING_PREFIX "o:fh",
        .longopts = opts,
        .pos = {&o->src},
        .pos0_name = "SRC",
        .surplus = " (one SRC only)",
        .keys = &o->keys,
        .threads = &o->threads,
        .own = pack_opt,
        .ud = o,
    };
    int rc = cli_parse_args(argc, argv, &a);
    if (rc)
        return rc;
    if (!o->out)
        return cli_usage_error("pack", "missing -o OUT.tpack");
    if (!o->out[0])
        return cli_usage_error("pack", "-o names no file (it is empty)");
    if (o->no_compress && o->level > 0)
        return cli_usage_error("pack", "--level and --no-compress contradict each other");
    if (o->cipher && !o->keys.key_file && !o->keys.pass_file)
        return cli_usage_error("pack", "--cipher needs --key-file or --passphrase-file");
    return cli_keyopts_check("pack", &o->keys);
}

static volatile sig_atomic_t interrupted;
static const char *tmp_to_remove;
/* An S3 pack's store and object name (NULL: a local pack). */
static ckpt_store *out_store;
static const char *out_name;

static void on_signal(int sig)
{
    /* A second signal means the user will not wait for the next progress
     * callback (an S3 request may be retrying for 30 s); unlink, write and
     * _exit are async-signal-safe. An upload is left to the store's
     * cleanup: aborting it needs requests. */
    if (interrupted) {
        static const char left[] =
            "ckpt: interrupted again; the unfinished upload is left for 'ckpt s3-cleanup'\n";
        if (tmp_to_remove)
            unlink(tmp_to_remove);
        else if (out_store && write(STDERR_FILENO, left, sizeof left - 1) < 0)
            _exit(128 + sig);
        _exit(128 + sig);
    }
    interrupted = sig;
}

struct pack_ctx {
    progress pg;
    ckpt_writer *w;
};

static void pack_progress(void *ud, uint64_t done, uint64_t total)
{
    struct pack_ctx *ctx = ud;
    if (interrupted) {
        /* The writer cannot be freed inside its own callback; cancelled,
         * it fails the add under way, and write_pack aborts it: its
         * temporary file is removed, or its own upload aborted (not the
         * uploads of this name: another writer's would go too). */
        ckpt_writer_cancel(ctx->w);
        return;
    }
    progress_set(&ctx->pg, done, total);
}

/* A bad file (one its container parser rejected is packed as opaque bytes;
 * a damaged one as it is): say so above the progress bar, which redraws
 * itself after. */
static void pack_warn(void *ud, const char *src, const char *reason)
{
    struct pack_ctx *ctx = ud;
    progress_clear(&ctx->pg);
    char *line = NULL;
    if (asprintf(&line, "warning: %s: %s", src, reason) < 0) {
        fputs("warning: a file is bad (out of memory saying which)\n", stderr);
        return;
    }
    cli_sanitize(line);
    fprintf(stderr, "%s\n", line);
    free(line);
}

static const char *plural(size_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

static void print_summary(const ckpt_write_stats *st, double secs)
{
    char in[16], out[16], rate[16];
    double ratio = st->stored_bytes ? (double)st->logical_bytes / (double)st->stored_bytes : 0.0;
    printf("packed %zu %s, %zu %s: %s -> %s (ratio %.3f) in %.2f s, %s\n", st->n_files,
           plural(st->n_files, "file", "files"), st->n_tensors,
           plural(st->n_tensors, "tensor", "tensors"),
           cli_fmt_bytes(st->logical_bytes, in, sizeof in),
           cli_fmt_bytes(st->stored_bytes, out, sizeof out), ratio, secs,
           cli_fmt_rate(st->logical_bytes, secs, rate, sizeof rate));
}

static int write_pack(const struct pack_opts *o, int src_is_dir, ckpt_write_opts *wo,
                      const char *tmp, int out_existed)
{
    ckpt_err err = {0};
    ckpt_writer *w;
    ckpt_write_stats st;
    struct pack_ctx ctx = {0};

    if (ckpt_tree_size(o->src, &wo->progress_total, &err) < 0)
        return cli_fail_err(&err);
    wo->progress = pack_progress;
    wo->progress_ud = &ctx;
    wo->warn = pack_warn;
    wo->warn_ud = &ctx;

    double t0 = cli_now();
    cli_catch_interrupts(on_signal);
    if ((out_store ? ckpt_writer_open_in(out_store, out_name, NULL, wo, &w, &err)
                   : ckpt_writer_open(o->out, tmp, wo, &w, &err)) < 0) {
        cli_catch_interrupts(SIG_DFL);
        return cli_fail_err(&err);
    }
    /* Only once it is ours: a temporary file another run holds is not. */
    tmp_to_remove = out_store ? NULL : tmp;
    ctx.w = w;
    progress_start(&ctx.pg, "packing", wo->progress_total);
    int rc;
    if (src_is_dir) {
        rc = ckpt_writer_add_tree(w, o->src, &err);
    } else {
        /* A single file is packed under its own name, without the
         * directories that led to it. */
        const char *base = strrchr(o->src, '/');
        rc = ckpt_writer_add_path(w, base ? base + 1 : o->src, o->src, &err);
    }
    if (rc < 0 || interrupted) {
        int sig = interrupted;
        progress_end(&ctx.pg);
        ckpt_writer_abort(w);
        cli_catch_interrupts(SIG_DFL);
        if (!sig)
            return cli_fail_err(&err);
        cli_fail("interrupted; nothing was written");
        return 128 + sig;
    }
    rc = ckpt_writer_finish(w, &st, &err);
    progress_end(&ctx.pg);
    double secs = cli_now() - t0;
    int sig = interrupted;
    cli_catch_interrupts(SIG_DFL);
    if (rc < 0)
        return cli_fail_err(&err);
    if (sig) {
        /* The signal came while the index was being written. Honour it, but
         * a pack that replaced an older one stays: removing it now would
         * lose both. */
        if (!out_existed) {
            if (out_store)
                ckpt_store_remove(out_store, out_name, &err);
            else
                unlink(o->out);
            cli_fail("interrupted; nothing was written");
        } else {
            cli_fail("interrupted after %s was complete; it is kept", o->out);
        }
        return 128 + sig;
    }
    print_summary(&st, secs);
    return EXIT_OK;
}

static int exists_cb(void *ud, const ckpt_object_info *info)
{
    return strcmp(info->name, (const char *)ud) == 0 ? 1 : 0;
}

/* 1 if the store has an object named name, 0 if not, or -errno. */
static int object_exists(ckpt_store *s, const char *name, ckpt_err *err)
{
    return ckpt_store_list(s, name, exists_cb, (void *)name, err);
}

static int run_pack(struct pack_opts o)
{
    int rc;

    struct stat sst, ost;
    if (stat(o.src, &sst) < 0)
        return cli_fail("%s: %s", o.src, strerror(errno));
    if (!S_ISDIR(sst.st_mode) && !S_ISREG(sst.st_mode))
        return cli_fail("%s: not a regular file or a directory", o.src);
    int out_existed;
    if (cli_is_s3(o.out)) {
        ckpt_err err = {0};
        if (cli_store_for(o.out, &o.keys, &out_store, &out_name, &err) < 0)
            return cli_fail_err(&err);
        if ((out_existed = object_exists(out_store, out_name, &err)) < 0)
            return cli_fail_err(&err);
    } else {
        out_existed = lstat(o.out, &ost) == 0;
        if (out_existed && S_ISDIR(ost.st_mode))
            return cli_fail("%s: is a directory", o.out);
    }
    if (out_existed && !o.force)
        return cli_fail("%s: already exists (use --force to replace it)", o.out);

    ckpt_write_opts wo = {
        .chunk_size = o.chunk_size,
        .level = o.no_compress ? 0 : o.level,
        .threads = o.threads,
    };
    if (o.cipher) {
        if (ckpt_cipher_parse(o.cipher, &wo.cipher) < 0 || wo.cipher == CKPT_CIPHER_NONE)
            return cli_usage_error("pack",
                                   "unknown --cipher '%s': expected xchacha20poly1305 "
                                   "or aes256gcm",
                                   o.cipher);
        if (!ckpt_cipher_available(wo.cipher))
            return cli_fail("cipher %s is not available on this machine (no hardware "
                            "support); use xchacha20poly1305",
                            o.cipher);
    }

    ckpt_err err = {0};
    ckpt_key *key;
    if (cli_load_key(&o.keys, &key, &err) < 0)
        return cli_fail_err(&err);
    wo.key = key;

    /* The library's own choice, named here so that a signal can remove it. */
    char tmp[PATH_MAX];
    if (ckpt_tmp_name(o.out, "", ".tmp", tmp, sizeof tmp) < 0) {
        ckpt_key_free(key);
        return cli_fail("%s: name too long", o.out);
    }
    rc = write_pack(&o, S_ISDIR(sst.st_mode), &wo, tmp, out_existed);
    ckpt_key_free(key);
    return rc;
}

int cmd_pack(int argc, char **argv)
{
    struct pack_opts o = {.level = -1};
    int rc = parse_pack_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    rc = run_pack(o);
    ckpt_store_free(out_store); /* an S3 OUT's store, opened by run_pack */
    out_store = NULL;
    return rc;
}
