#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OPT(templ, field)                                                                          \
    {                                                                                              \
        templ, offsetof(fs_options, field), 1                                                      \
    }
enum { KEY_RO = 1 };

static const struct fuse_opt ckptfs_opts[] = {
    OPT("key_file=%s", key_file),
    OPT("passphrase_file=%s", passphrase_file),
    OPT("cache_size=%s", cache_size_text),
    OPT("threads=%s", threads_text),
    OPT("commit_delay=%s", commit_delay_text),
    OPT("log_file=%s", log_file),
    OPT("log_max=%s", log_max_text),
    OPT("tensors=%s", tensors_text),
    OPT("finish_on_exit", finish_on_exit),
    OPT("endpoint=%s", endpoint),
    OPT("region=%s", region),
    OPT("profile=%s", profile),
    OPT("cache_dir=%s", cache_dir),
    OPT("cache_dir_size=%s", cache_dir_size_text),
    OPT("list_interval=%s", list_interval_text),
    OPT("stage_dir=%s", stage_dir),
    FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_KEY("-r", KEY_RO), /* libfuse's short form of ro */
    FUSE_OPT_END,
};

int fs_parse_size(const char *text, uint64_t *out)
{
    if (!text || !isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        return -1;
    }
    if (*end != '\0')
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int keep_mountpoint(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    fs_options *o = data;
    (void)outargs;
    if (key == KEY_RO) {
        o->read_only = 1;
        return 1; /* and the kernel mounts it read-only too */
    }
    if (key != FUSE_OPT_KEY_NONOPT)
        return 1;
    o->positional++;
    if (o->positional == 1) {
        o->backing_dir = strdup(arg);
        return o->backing_dir ? 0 : -1;
    }
    if (o->positional == 2)
        return 1; /* the mountpoint, for fuse_parse_cmdline */
    fprintf(stderr, "ckptfs: unexpected argument '%s'\n", arg);
    return -1;
}

static long online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* The daemon's working directory is "/" (fuse_daemonize), and files are
 * opened again there (the key, to lock it in the daemon's memory; the log,
 * on SIGHUP): relative paths are made absolute now. Whether they can be
 * opened is for main to find out, naming the path. */
static int make_absolute(char **path, const char *what)
{
    if (!*path)
        return 0;
    if (!(*path)[0]) {
        fprintf(stderr, "ckptfs: bad %s '' (want the path of a file)\n", what);
        return -1;
    }
    if ((*path)[0] == '/')
        return 0;
    char cwd[PATH_MAX], *abs = NULL;
    if (!getcwd(cwd, sizeof cwd) || asprintf(&abs, "%s/%s", cwd, *path) < 0) {
        fprintf(stderr, "ckptfs: bad %s '%s': cannot make it absolute: %s\n", what, *path,
                strerror(errno));
        return -1;
    }
    free(*path);
    *path = abs;
    return 0;
}

/* Options that only a store URL takes; given with a directory they would
 * silently do nothing, so they are refused. The endpoint is validated by
 * the store; here only its shape, so a typo fails before any request. */
static int parse_store_options(fs_options *o)
{
    int is_url = o->backing_dir && strncmp(o->backing_dir, "s3://", 5) == 0;
    const char *only_url = o->endpoint              ? "endpoint"
                           : o->region              ? "region"
                           : o->profile             ? "profile"
                           : o->cache_dir           ? "cache_dir"
                           : o->cache_dir_size_text ? "cache_dir_size"
                           : o->list_interval_text  ? "list_interval"
                           : o->stage_dir           ? "stage_dir"
                                                    : NULL;
    if (!is_url && only_url) {
        fprintf(stderr, "ckptfs: %s is for a store (s3://BUCKET/PREFIX), not a directory\n",
                only_url);
        return -1;
    }
    if (o->endpoint && strncmp(o->endpoint, "http://", 7) != 0 &&
        strncmp(o->endpoint, "https://", 8) != 0) {
        fprintf(stderr, "ckptfs: bad endpoint '%s' (want http[s]://HOST[:PORT])\n", o->endpoint);
        return -1;
    }
    if (o->cache_dir_size_text && (fs_parse_size(o->cache_dir_size_text, &o->cache_dir_bytes) ||
                                   o->cache_dir_bytes < CKPTFS_MIN_CACHE)) {
        fprintf(stderr, "ckptfs: bad cache_dir_size '%s' (want a size of at least 1M, e.g. 20G)\n",
                o->cache_dir_size_text);
        return -1;
    }
    if (o->cache_dir_size_text && !o->cache_dir) {
        fprintf(stderr, "ckptfs: cache_dir_size needs cache_dir\n");
        return -1;
    }
    o->list_interval = CKPTFS_DEFAULT_LIST_INTERVAL;
    if (o->list_interval_text) {
        char *end;
        errno = 0;
        double d = strtod(o->list_interval_text, &end);
        if (errno || end == o->list_interval_text || *end || !isfinite(d) || d < 0 ||
            d > CKPTFS_MAX_LIST_INTERVAL) {
            fprintf(stderr, "ckptfs: bad list_interval '%s' (want seconds, 0 to %d)\n",
                    o->list_interval_text, CKPTFS_MAX_LIST_INTERVAL);
            return -1;
        }
        o->list_interval = d;
    }
    return 0;
}

int fs_options_parse(struct fuse_args *args, fs_options *o)
{
    memset(o, 0, sizeof *o);
    if (fuse_opt_parse(args, o, ckptfs_opts, keep_mountpoint) == -1)
        return -1;
    if (o->key_file && o->passphrase_file) {
        fprintf(stderr, "ckptfs: key_file and passphrase_file are mutually exclusive\n");
        return -1;
    }
    o->cache_bytes = CKPTFS_DEFAULT_CACHE;
    if (o->cache_size_text &&
        (fs_parse_size(o->cache_size_text, &o->cache_bytes) || o->cache_bytes < CKPTFS_MIN_CACHE)) {
        fprintf(stderr, "ckptfs: bad cache_size '%s' (want a size of at least 1M, e.g. 512M)\n",
                o->cache_size_text);
        return -1;
    }
    long threads = online_cpus();
    if (o->threads_text) {
        char *end;
        errno = 0;
        threads = strtol(o->threads_text, &end, 10);
        if (errno || end == o->threads_text || *end || threads < 1 ||
            threads > CKPTFS_MAX_THREADS) {
            fprintf(stderr, "ckptfs: bad threads '%s' (want 1..%u)\n", o->threads_text,
                    CKPTFS_MAX_THREADS);
            return -1;
        }
    }
    o->threads = threads > CKPTFS_MAX_THREADS ? CKPTFS_MAX_THREADS : (unsigned)threads;
    o->commit_delay = CKPTFS_DEFAULT_COMMIT_DELAY;
    if (o->commit_delay_text) {
        char *end;
        errno = 0;
        double d = strtod(o->commit_delay_text, &end);
        if (errno || end == o->commit_delay_text || *end || !isfinite(d) || d < 0 ||
            d > CKPTFS_MAX_COMMIT_DELAY) {
            fprintf(stderr,
                    "ckptfs: bad commit_delay '%s' (want seconds, 0 to %d; 0 commits "
                    "only on 'ckpt commit')\n",
                    o->commit_delay_text, CKPTFS_MAX_COMMIT_DELAY);
            return -1;
        }
        o->commit_delay = d;
    }
    o->log_max = CKPTFS_DEFAULT_LOG_MAX;
    if (o->log_max_text && (fs_parse_size(o->log_max_text, &o->log_max) || o->log_max < 4096)) {
        fprintf(stderr, "ckptfs: bad log_max '%s' (want a size of at least 4K, e.g. 4M)\n",
                o->log_max_text);
        return -1;
    }
    if (o->tensors_text && strcmp(o->tensors_text, "show") != 0 &&
        strcmp(o->tensors_text, "hide") != 0) {
        fprintf(stderr, "ckptfs: bad tensors '%s' (want show or hide)\n", o->tensors_text);
        return -1;
    }
    o->hide_tensors = o->tensors_text && strcmp(o->tensors_text, "hide") == 0;
    if (parse_store_options(o) != 0)
        return -1;
    /* The write side's settings do nothing on a read-only mount. Said
     * rather than refused, so that adding ro to an fstab line is enough. */
    const char *write_only = o->stage_dir           ? "stage_dir"
                             : o->commit_delay_text ? "commit_delay"
                             : o->finish_on_exit    ? "finish_on_exit"
                                                    : NULL;
    if (o->read_only && write_only)
        fprintf(stderr, "ckptfs: warning: %s does nothing on a read-only mount (ro); ignored\n",
                write_only);
    if (make_absolute(&o->key_file, "key_file") != 0 ||
        make_absolute(&o->cache_dir, "cache_dir") != 0 ||
        make_absolute(&o->stage_dir, "stage_dir") != 0 ||
        make_absolute(&o->passphrase_file, "passphrase_file") != 0 ||
        make_absolute(&o->log_file, "log_file") != 0)
        return -1;
    return 0;
}

void fs_options_free(fs_options *o)
{
    free(o->backing_dir);
    free(o->key_file);
    free(o->passphrase_file);
    free(o->cache_size_text);
    free(o->threads_text);
    free(o->commit_delay_text);
    free(o->log_file);
    free(o->log_max_text);
    free(o->tensors_text);
    free(o->endpoint);
    free(o->region);
    free(o->profile);
    free(o->cache_dir);
    free(o->cache_dir_size_text);
    free(o->list_interval_text);
    free(o->stage_dir);
    memset(o, 0, sizeof *o);
}

void fs_options_usage(const char *prog)
{
    printf("usage: %s [options] BACKING_DIR MOUNTPOINT\n"
           "       %s [options] s3://BUCKET[/PREFIX] MOUNTPOINT\n"
           "\n"
           "Shows every BACKING_DIR/NAME.tpack as a directory MOUNTPOINT/NAME/, and packs\n"
           "new checkpoints written into the mount: mkdir MOUNTPOINT/NAME, copy or save\n"
           "files into it, and it is packed to BACKING_DIR/NAME.tpack in the background.\n"
           "\n"
           "ckptfs options:\n"
           "    -o key_file=PATH         key for encrypted packs (32 raw bytes or 64 hex digits)\n"
           "    -o passphrase_file=PATH  passphrase for encrypted packs\n"
           "    -o cache_size=SIZE       decoded-chunk cache (default 256M; K/M/G/T suffix)\n"
           "    -o threads=N             decode and packing workers (default: number of CPUs)\n"
           "    -o ro, -r                serve the packs only: no writing, no staging area\n"
           "    -o commit_delay=SECONDS  commit a checkpoint being written once nothing in it\n"
           "                             was open or changed for this long (default 2;\n"
           "                             0: only 'ckpt commit MOUNTPOINT/NAME' commits)\n"
           "    -o finish_on_exit        on SIGTERM, SIGINT or unmount, finish the checkpoint\n"
           "                             being packed before exiting (default: suspend it at\n"
           "                             once; the next mount packs it again)\n"
           "    -o log_file=PATH         log to PATH (appended; created mode 0600) instead of\n"
           "                             stderr (-f) or syslog; SIGHUP reopens it\n"
           "    -o log_max=SIZE          without syslog (no /dev/log), the log goes to\n"
           "                             BACKING_DIR/.ckptfs/log, rotated at SIZE (default\n"
           "                             4M) keeping log.1 and log.2\n"
           "    -o tensors=show|hide     hide: tensors/ is not listed in a checkpoint (so\n"
           "                             cp -r, rsync and find skip it) but still opens by\n"
           "                             path (default: show)\n"
           "    -o debug, -d             log every request and its outcome (implies -f)\n"
           "\n"
           "Packs in an S3 bucket (s3://BUCKET/PREFIX/NAME.tpack; credentials from\n"
           "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws, never options):\n"
           "    -o endpoint=URL          http[s]://HOST[:PORT] (default AWS_ENDPOINT_URL_S3,\n"
           "                             AWS_ENDPOINT_URL, the profile's, then AWS)\n"
           "    -o region=R, profile=P   as the AWS CLI\n"
           "    -o list_interval=SECONDS new packs under the prefix show within this\n"
           "                             (default 5)\n"
           "    -o cache_dir=DIR         keep chunks read, as stored (compressed, encrypted),\n"
           "                             in DIR; -o cache_dir_size=SIZE bounds it (default 10G)\n"
           "    -o stage_dir=DIR         where checkpoints being written are staged (default\n"
           "                             $XDG_CACHE_HOME/ckptfs/HASH-OF-URL); one writable\n"
           "                             mount per prefix (a lease object); -o ro takes none\n"
           "\n"
           "Logging: errors, warnings and events (mounted, committed, suspended...) go to\n"
           "stderr with -f, else to syslog (facility daemon) when /dev/log exists, else to\n"
           "BACKING_DIR/.ckptfs/log; or to log_file. Keys and file contents are never\n"
           "logged. Signals: SIGTERM/SIGINT unmount and exit within seconds, suspending\n"
           "packing (staged data stays; no partial pack is left); SIGHUP reopens log_file\n"
           "(logrotate) and is otherwise ignored.\n"
           "\n"
           "In a committed checkpoint, manifest.json describes the pack and tensors/ holds\n"
           "one raw file per tensor (both read-only; see also the user.ckptfs.* xattrs);\n"
           "writing into it reopens it, and it is packed again once quiet.\n"
           "'ckpt status MOUNTPOINT' shows each checkpoint's state (writing, packing,\n"
           "committed, failed); 'rm -r MOUNTPOINT/NAME' deletes one. Written data is staged\n"
           "under BACKING_DIR/.ckptfs (encrypted when a key is given) until it is packed.\n"
           "\n",
           prog, prog);
}
