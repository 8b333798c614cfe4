/* `ckpt status MOUNT[/NAME]`: every checkpoint of a ckptfs mount with its
 * state, size, packing progress and last error. On a terminal, a table
 * fitted to its width (status_watch.c draws it; --watch keeps redrawing
 * it); elsewhere each checkpoint is one plain line, for scripts and logs. */
#include "status.h"
#include "ckpt_mount.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WATCH_SECONDS 1.0

static const char status_help[] =
    "usage: ckpt status MOUNT[/NAME] [--watch [--interval SECONDS]]\n"
    "\n"
    "Shows every checkpoint of a ckptfs mount (or just NAME) with its state:\n"
    "  writing       being written; committed by 'ckpt commit' or after a quiet delay\n"
    "  packing       being packed in the background; a write into it stops the\n"
    "                packing (writing again)\n"
    "  committed     packed into BACKING/NAME.tpack\n"
    "  failed        packing or staging failed (the reason follows); 'ckpt commit'\n"
    "                retries\n"
    "  key mismatch  the pack is encrypted with another key than the mount's (or the\n"
    "                mount has none): reads fail with EACCES\n"
    "  damaged       the pack cannot be read (empty, not a pack, a damaged header or\n"
    "                index; the reason follows): reads fail with EIO\n"
    "  unreachable   its store (an S3 gateway) does not answer now (the reason\n"
    "                follows): reads of what is not cached fail with EIO, at once\n"
    "                after the first; committed again once it answers\n"
    "SIZE is the data written so far, or the size of the pack once committed. The\n"
    "last error of a checkpoint (a read fault in a committed one) follows its line.\n"
    "\n"
    "options:\n"
    "  -w, --watch          a live view, one line per checkpoint (state, bytes staged\n"
    "                       and packed, MB/s, ETA), until interrupted (Ctrl-C); on a\n"
    "                       terminal redrawn in place to its width, elsewhere a plain\n"
    "                       line whenever a checkpoint's line changes\n"
    "  -n, --interval SECS  seconds between refreshes of --watch (default 1)\n"
    "  -h, --help           show this help\n"
    "\n"
    "exit status: 0 when every checkpoint is writing, packing or committed; 3 when\n"
    "one is failed, key mismatch or damaged; else 4 when one is unreachable; 1 when\n"
    "MOUNT cannot be read; 2 usage error. --watch runs until interrupted.\n";

struct status_opts {
    const char *path;
    int watch;
    double interval;
    int interval_given;
};

static int parse_status_opts(int argc, char **argv, struct status_opts *o)
{
    static const struct option opts[] = {
        {"watch", no_argument, NULL, 'w'},
        {"interval", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "wn:h", opts, NULL)) != -1) {
        switch (c) {
        case 1:
            if (o->path)
                return cli_usage_error("status", "unexpected argument '%s'", optarg);
            o->path = optarg;
            break;
        case 'w':
            o->watch = 1;
            break;
        case 'n': {
            char *end;
            o->interval = strtod(optarg, &end);
            o->interval_given = 1;
            if (end == optarg || *end || !(o->interval >= 0.1 && o->interval <= 3600))
                return cli_usage_error("status", "bad --interval '%s': want seconds, 0.1 to 3600",
                                       optarg);
            break;
        }
        case 'h':
            fputs(status_help, stdout);
            return -1;
        default:
            return cli_bad_option("status", c, argv);
        }
    }
    if (optind < argc && !o->path)
        o->path = argv[optind++];
    if (optind < argc)
        return cli_usage_error("status", "unexpected argument '%s'", argv[optind]);
    if (!o->path)
        return cli_usage_error("status", "missing MOUNT");
    if (o->interval_given && !o->watch)
        return cli_usage_error("status", "--interval needs --watch");
    return 0;
}

typedef status_entry entry;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

void status_free(entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].name);
        free(v[i].path);
    }
    free(v);
}

int status_is_error_state(const char *state)
{
    return strcmp(state, CKPT_STATE_FAILED) == 0 || strcmp(state, CKPT_STATE_KEY_MISMATCH) == 0 ||
           strcmp(state, CKPT_STATE_DAMAGED) == 0 || strcmp(state, CKPT_STATE_UNREACHABLE) == 0;
}

int status_exit(const entry *v, size_t n)
{
    int rc = EXIT_OK;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].st.state, CKPT_STATE_UNREACHABLE) == 0)
            rc = EXIT_CKPT_UNREACHABLE;
        else if (status_is_error_state(v[i].st.state))
            return EXIT_CKPT_FAILED; /* the lasting trouble first */
    return rc;
}

int status_collect(const char *path, entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    mount_state st;
    int rc = mount_state_read(path, &st);
    if (rc == 0) {
        entry *v = calloc(1, sizeof *v);
        const char *base = strrchr(path, '/');
        if (!v || !(v->name = strdup(base && base[1] ? base + 1 : path)) ||
            !(v->path = strdup(path))) {
            status_free(v, v ? 1 : 0);
            return -ENOMEM;
        }
        v->st = st;
        *out = v;
        *n = 1;
        return 0;
    }
    DIR *d = opendir(path);
    if (!d)
        return rc == -ENODATA || rc == -ENOTSUP ? -errno : rc;
    size_t cap = 0, count = 0, others = 0;
    entry *v = NULL;
    struct dirent *e;
    rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char *full;
        if (asprintf(&full, "%s/%s", path, e->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (mount_state_read(full, &st) != 0) {
            free(full);
            others++;
            continue;
        }
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            entry *grown = realloc(v, cap * sizeof *grown);
            if (!grown) {
                free(full);
                rc = -ENOMEM;
                break;
            }
            v = grown;
        }
        v[count].path = full;
        v[count].name = strdup(e->d_name);
        v[count].st = st;
        if (!v[count++].name)
            rc = -ENOMEM;
    }
    closedir(d);
    if (rc == 0 && count == 0 && others)
        rc = -ENODATA; /* entries, but none a checkpoint: not a ckptfs mount */
    if (rc) {
        status_free(v, count);
        return rc;
    }
    qsort(v, count, sizeof *v, cmp_entry);
    *out = v;
    *n = count;
    return 0;
}

/* One plain line per checkpoint, for scripts and logs. */
static void print_entry(const entry *e, size_t name_width, size_t state_width)
{
    const mount_state *st = &e->st;
    char size[16], done[16], total[16], eta[16];
    cli_fmt_bytes(st->size, size, sizeof size);
    char name[NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", e->name);
    cli_sanitize(name);
    printf("%-*s  %-*s  %10s", (int)name_width, name, (int)state_width, st->state, size);
    if (strcmp(st->state, CKPT_STATE_PACKING) == 0 && st->done == 0 && st->seconds == 0) {
        printf("  queued behind another checkpoint");
    } else if (strcmp(st->state, CKPT_STATE_PACKING) == 0) {
        double pct = st->total ? 100.0 * (double)st->done / (double)st->total : 0.0;
        cli_fmt_bytes(st->done, done, sizeof done);
        cli_fmt_bytes(st->total, total, sizeof total);
        cli_fmt_eta(mount_state_eta(st), eta, sizeof eta);
        printf("  %.1f%% %s of %s, ETA %s", pct, done, total, eta);
    }
    if (st->error[0])
        printf(status_is_error_state(st->state) ? "  %s" : "  last error: %s", st->error);
    putchar('\n');
}

/* status_exit's answer, or -errno. */
static int show(const struct status_opts *o)
{
    entry *v;
    size_t n;
    int rc = status_collect(o->path, &v, &n);
    if (rc)
        return rc;
    size_t width = 4, state_width = 9;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i].name), slen = strlen(v[i].st.state);
        if (len > width)
            width = len;
        if (slen > state_width)
            state_width = slen;
    }
    for (size_t i = 0; i < n; i++)
        print_entry(&v[i], width, state_width);
    fflush(stdout);
    rc = status_exit(v, n);
    status_free(v, n);
    return rc;
}

int cmd_status(int argc, char **argv)
{
    struct status_opts o = {.interval = WATCH_SECONDS};
    int rc = parse_status_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (o.watch || isatty(STDOUT_FILENO))
        return status_watch(o.path, o.interval, !o.watch);
    rc = show(&o);
    if (rc < 0)
        return cli_fail("%s: %s", o.path,
                        rc == -ENODATA ? "not a ckptfs mount or checkpoint" : mount_state_why(rc));
    return rc;
}
