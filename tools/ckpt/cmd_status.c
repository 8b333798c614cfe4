/* `ckpt status MOUNT[/NAME]`: every checkpoint of a ckptfs mount with its
 * state, size and packing progress. On a terminal a checkpoint being
 * packed gets a progress bar with bytes done and an ETA; elsewhere each
 * checkpoint is one plain line, for scripts and logs. */
#include "cli.h"
#include "ckpt_mount.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 24
#define WATCH_SECONDS 0.5

static const char status_help[] =
    "usage: ckpt status MOUNT[/NAME] [--watch]\n"
    "\n"
    "Shows every checkpoint of a ckptfs mount (or just NAME) with its state:\n"
    "  writing    being written; committed by 'ckpt commit' or after a quiet delay\n"
    "  packing    being packed in the background; read-only meanwhile\n"
    "  committed  packed into BACKING/NAME.tpack\n"
    "  failed     packing or staging failed (the reason follows); 'ckpt commit' retries\n"
    "SIZE is the data written so far, or the size of the pack once committed.\n"
    "\n"
    "options:\n"
    "  -w, --watch    refresh until nothing is being packed\n"
    "  -h, --help     show this help\n";

struct status_opts {
    const char *path;
    int watch;
};

static int parse_status_opts(int argc, char **argv, struct status_opts *o)
{
    static const struct option opts[] = {
        {"watch", no_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "wh", opts, NULL)) != -1) {
        switch (c) {
        case 1:
            if (o->path)
                return cli_usage_error("status", "unexpected argument '%s'", optarg);
            o->path = optarg;
            break;
        case 'w':
            o->watch = 1;
            break;
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
    return 0;
}

typedef struct entry {
    char *name, *path;
    mount_state st;
} entry;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static void free_entries(entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].name);
        free(v[i].path);
    }
    free(v);
}

/* The checkpoints to show: path itself if it is one, else its entries. */
static int collect(const char *path, entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    mount_state st;
    int rc = mount_state_read(path, &st);
    if (rc == 0) {
        entry *v = calloc(1, sizeof *v);
        const char *base = strrchr(path, '/');
        if (!v || !(v->name = strdup(base && base[1] ? base + 1 : path)) || !(v->path = strdup(path))) {
            free_entries(v, v ? 1 : 0);
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
        free_entries(v, count);
        return rc;
    }
    qsort(v, count, sizeof *v, cmp_entry);
    *out = v;
    *n = count;
    return 0;
}

static void print_entry(const entry *e, int tty, size_t name_width)
{
    const mount_state *st = &e->st;
    char size[16], done[16], total[16], eta[16];
    cli_fmt_bytes(st->size, size, sizeof size);
    printf("%-*s  %-9s  %10s", (int)name_width, e->name, st->state, size);
    if (strcmp(st->state, CKPT_STATE_PACKING) == 0 && st->done == 0 && st->seconds == 0) {
        printf("  queued behind another checkpoint");
    } else if (strcmp(st->state, CKPT_STATE_PACKING) == 0) {
        double pct = st->total ? 100.0 * (double)st->done / (double)st->total : 0.0;
        cli_fmt_bytes(st->done, done, sizeof done);
        cli_fmt_bytes(st->total, total, sizeof total);
        cli_fmt_eta(mount_state_eta(st), eta, sizeof eta);
        if (tty) {
            char bar[BAR_WIDTH + 1];
            int fill = (int)(pct / 100.0 * BAR_WIDTH + 0.5);
            for (int i = 0; i < BAR_WIDTH; i++)
                bar[i] = i < fill ? '#' : '.';
            bar[BAR_WIDTH] = '\0';
            printf("  [%s] %5.1f%%  %s / %s  ETA %s", bar, pct, done, total, eta);
        } else {
            printf("  %.1f%% %s of %s, ETA %s", pct, done, total, eta);
        }
    } else if (strcmp(st->state, CKPT_STATE_FAILED) == 0 && st->error[0]) {
        printf("  %s", st->error);
    }
    /* Erase what a longer line left there when redrawing. */
    printf(tty ? "\033[K\n" : "\n");
}

static int show(const struct status_opts *o, int tty, int *packing, size_t *lines)
{
    entry *v;
    size_t n;
    int rc = collect(o->path, &v, &n);
    if (rc)
        return rc;
    size_t width = 4;
    *packing = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i].name);
        if (len > width)
            width = len;
        *packing |= strcmp(v[i].st.state, CKPT_STATE_PACKING) == 0;
    }
    if (tty)
        printf("%-*s  %-9s  %10s\033[K\n", (int)width, "NAME", "STATE", "SIZE");
    for (size_t i = 0; i < n; i++)
        print_entry(&v[i], tty, width);
    fflush(stdout);
    *lines = n + (tty ? 1 : 0);
    free_entries(v, n);
    return 0;
}

int cmd_status(int argc, char **argv)
{
    struct status_opts o = {0};
    int rc = parse_status_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    int tty = isatty(STDOUT_FILENO);
    size_t lines = 0;
    int packing = 0;
    for (;;) {
        rc = show(&o, tty, &packing, &lines);
        if (rc)
            return cli_fail("%s: %s", o.path,
                            rc == -ENODATA ? "not a ckptfs mount or checkpoint" : mount_state_why(rc));
        if (!o.watch || !packing)
            return EXIT_OK;
        struct timespec ts = {0, (long)(WATCH_SECONDS * 1e9)};
        nanosleep(&ts, NULL);
        if (tty && lines)
            printf("\033[%zuA", lines); /* back up and draw over */
    }
}
