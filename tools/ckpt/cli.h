/* Shared plumbing of the `ckpt` tool: exit codes, option helpers, key
 * loading, the progress bar and the subcommand entry points. Everything here
 * is a thin layer over ckpt.h; the tool holds no format knowledge. */
#ifndef CKPT_CLI_H
#define CKPT_CLI_H

#include "ckpt.h"

#include <getopt.h>
#include <pthread.h>
#include <stdint.h>

#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* EXIT_CKPT_FAILED: `ckpt status` read the mount, and some checkpoint is
 * failed, damaged or keyed wrongly. Apart from EXIT_FAIL so that a script
 * tells a failed checkpoint from a mount it could not read, as systemctl
 * status answers 3 for a failed unit. EXIT_CKPT_UNREACHABLE: none is, but
 * the store of some does not answer now, which a later run may find over. */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,
    EXIT_USAGE = 2,
    EXIT_CKPT_FAILED = 3,
    EXIT_CKPT_UNREACHABLE = 4
};

/* ----------------------------------------------------------- messages */

/* "ckpt CMD: <msg>" plus a hint at the command's help; returns EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);
/* Explains a '?' or ':' from getopt_long; returns EXIT_USAGE. */
int cli_bad_option(const char *cmd, int c, char **argv);
/* "ckpt: <msg>"; returns EXIT_FAIL. */
int cli_fail(const char *fmt, ...) CLI_PRINTF(1, 2);
int cli_fail_err(const ckpt_err *err);
/* Names come from packs and mounts, which may be hostile: a control (C0 or
 * DEL byte, or a UTF-8 C1 control such as U+009B, CSI to xterm) is written
 * as one '?', so no escape sequence runs and no newline fakes a line.
 * --json output escapes them instead. */
void cli_put_name(const char *name);
/* SIGINT and SIGTERM go to handler (SIG_DFL: back to the default), with
 * interrupted I/O restarted. */
void cli_catch_interrupts(void (*handler)(int));
void cli_sanitize(char *s); /* the same, in place */

/* ------------------------------------------------------------ parsing */

/* Chunk sizes: digits with an optional K or M suffix (binary), a power of two
 * in [CKPT_CHUNK_MIN, CKPT_CHUNK_MAX]. Returns 0 or -1. */
int cli_parse_chunk_size(const char *s, uint32_t *out);
int cli_parse_uint(const char *s, unsigned min, unsigned max, unsigned *out);

/* getopt_long values of the options with no short form; above any char so
 * they cannot clash with one, and shared so every command's table agrees. */
enum {
    OPT_KEY_FILE = 0x100,
    OPT_PASS_FILE,
    OPT_THREADS,
    OPT_CIPHER,
    OPT_CHUNK_SIZE,
    OPT_LEVEL,
    OPT_NO_COMPRESS,
    OPT_TENSORS,
    OPT_TENSOR,
    OPT_JSON,
    OPT_ENDPOINT,
    OPT_REGION,
    OPT_PROFILE,
    OPT_OLDER_THAN,
};

/* Where a pack is and how to read it: the key options, and the S3 options
 * for packs named s3://BUCKET/PREFIX/NAME.tpack. */
#define CLI_KEY_OPTIONS                                                                            \
    {"key-file", required_argument, NULL, OPT_KEY_FILE},                                           \
        {"passphrase-file", required_argument, NULL, OPT_PASS_FILE}, CLI_S3_OPTIONS
#define CLI_S3_OPTIONS                                                                             \
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},                                           \
        {"region", required_argument, NULL, OPT_REGION},                                           \
    {                                                                                              \
        "profile", required_argument, NULL, OPT_PROFILE                                            \
    }

/* The help lines of CLI_S3_OPTIONS. */
#define CLI_S3_HELP                                                                                \
    "  --endpoint URL            S3 endpoint of s3:// packs (default:\n"                           \
    "                            $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, AWS)\n"                  \
    "  --region NAME             S3 region (default: $AWS_REGION, us-east-1)\n"                    \
    "  --profile NAME            credentials from this profile of ~/.aws\n"

/* getopt_long optstring prefix: '-' hands positionals over in order (so
 * options may follow them even under POSIXLY_CORRECT) and ':' reports a
 * missing argument distinctly. */
#define CLI_OPTSTRING_PREFIX "-:"

typedef struct cli_keyopts {
    const char *key_file;
    const char *pass_file;
    const char *endpoint, *region, *profile; /* for s3:// packs */
} cli_keyopts;

/* Records --key-file/--passphrase-file and the S3 options; returns 1 if c
 * was one of them. */
int cli_keyopt(int c, const char *arg, cli_keyopts *k);
/* Both kinds of key at once is a usage error: returns 0 or EXIT_USAGE. */
int cli_keyopts_check(const char *cmd, const cli_keyopts *k);
/* Loads the key the options name; *out stays NULL when none was given. */
int cli_load_key(const cli_keyopts *k, ckpt_key **out, ckpt_err *err);
/* Opens a pack with the key options; prints the error and returns EXIT_FAIL
 * on failure. Close with cli_close_pack, which also frees *key. */
int cli_open_pack(const char *path, const cli_keyopts *k, ckpt_pack **out, ckpt_key **key);
/* A checkpoint directory of a ckptfs mount (MOUNT/NAME) stands for its pack:
 * *path is pointed at the pack's path, written to buf. Anything else is left
 * as it is. 0, or EXIT_FAIL after saying why (a checkpoint still being
 * written, a directory that is not a checkpoint). cli_open_pack does this. */
int cli_resolve_pack(const char **path, char *buf, size_t cap);
void cli_close_pack(ckpt_pack *p, ckpt_key *key);

/* ------------------------------------------------- a command's options */

/* How cli_parse_args reads a command line. What the pack commands share is
 * handled there: positionals, the key and S3 options, --threads and -h;
 * every other option of the table goes to own. Messages name cmd. */
typedef struct cli_args {
    const char *cmd;
    const char *help;      /* what -h prints */
    const char *optstring; /* CLI_OPTSTRING_PREFIX and the short options */
    const struct option *longopts;
    const char **pos[2];   /* the positionals, in order; pos[1] may be NULL */
    const char *pos0_name; /* pos[0] is required: "missing PACK" */
    const char *surplus;   /* appended to "unexpected argument 'X'", or NULL */
    cli_keyopts *keys;
    unsigned *threads; /* NULL: the command has no --threads */
    /* 0, or an exit status after saying why. NULL: no options of its own. */
    int (*own)(void *ud, int c, const char *arg);
    void *ud;
} cli_args;

/* 0 when the command should run, -1 after printing the help, or EXIT_USAGE.
 * The command's own checks of the result follow, cli_keyopts_check last. */
int cli_parse_args(int argc, char **argv, const cli_args *a);

/* ----------------------------------------------------- packs by URL */

/* Whether a pack name is an S3 URL (s3://BUCKET/[PREFIX/]NAME). */
int cli_is_s3(const char *path);
/* Opens the store at store_url with the S3 options of k, once core dumps
 * are off (they would hold the credentials). 0 or -errno. */
int cli_store_open(const char *store_url, const cli_keyopts *k, ckpt_store **out, ckpt_err *err);
/* Opens the store holding the pack url (s3://BUCKET/PREFIX/NAME: the store
 * s3://BUCKET/PREFIX) and points *name into url at NAME. 0 or -errno. */
int cli_store_for(const char *url, const cli_keyopts *k, ckpt_store **out, const char **name,
                  ckpt_err *err);
/* ckpt_probe for a path or an s3:// URL. */
int cli_probe(const char *path, const cli_keyopts *k, ckpt_pack_info *info, ckpt_err *err);

/* ----------------------------------------------------------- numbers */

/* Decimal units, as in "709.4 MB". buf holds at least 16 bytes. */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);
/* "221 MB/s"; buf holds at least 16 bytes. */
const char *cli_fmt_rate(uint64_t bytes, double secs, char *buf, size_t len);
double cli_now(void);

/* -------------------------------------------------------- progress bar */

/* A one-line bar on stderr, drawn only when stderr is a terminal. Updates may
 * come from library worker threads, so the state is guarded; a busy lock
 * just skips a redraw. */
typedef struct progress {
    int enabled;
    int drawn;
    const char *label;
    uint64_t done, total;
    double start, last_draw;
    pthread_mutex_t mu;
} progress;

void progress_start(progress *pg, const char *label, uint64_t total);
void progress_set(progress *pg, uint64_t done, uint64_t total);
void progress_add(progress *pg, uint64_t delta);
/* Erases the bar so a message can be printed; the next update redraws it. */
void progress_clear(progress *pg);
void progress_end(progress *pg);
/* ckpt_progress_fn adapter; ud is a progress. */
void progress_cb(void *ud, uint64_t done, uint64_t total);

/* ------------------------------------------------- ckptfs mount state */

/* A checkpoint directory of a ckptfs mount, as its user.ckptfs.* extended
 * attributes describe it. */
typedef struct mount_state {
    char state[32];       /* writing, packing, committed, failed */
    uint64_t size;        /* staged bytes; the pack's size once committed */
    uint64_t done, total; /* packing progress in bytes */
    double seconds;       /* packing so far */
    char error[1024];     /* why it failed, or "" */
} mount_state;

/* 0, or -errno (-ENODATA: not a checkpoint directory of a ckptfs mount). */
int mount_state_read(const char *path, mount_state *st);
/* What a mount_state_read error means, in words. */
const char *mount_state_why(int rc);
/* Seconds of packing left, or -1 while unknown. */
double mount_state_eta(const mount_state *st);
/* "1:05", "1:02:03", or "--:--" for a negative value. */
void cli_fmt_eta(double secs, char *buf, size_t len);

/* -------------------------------------------------------- subcommands */

int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_commit(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_s3_cleanup(int argc, char **argv);

#endif
