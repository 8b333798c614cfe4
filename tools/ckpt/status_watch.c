/* `ckpt status --watch`: a live view of a ckptfs mount, one line per
 * checkpoint: name, state, bytes staged and packed, packing rate and ETA
 * (or, for a checkpoint that failed or cannot be read, why). It stays open
 * until interrupted, whether or not anything is packing.
 *
 * On a terminal the table is fitted to its width (names cut with "..."),
 * so no line wraps, and redrawn in place. Elsewhere (a pipe, a log file)
 * it writes plain lines of the same shape, a checkpoint's line again only
 * when it changed. */
#include "status.h"
#include "ckpt_mount.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_COLUMNS 512
#define STATE_W 12 /* "key mismatch" */
#define BYTES_W 9  /* "999.9 MB" */
#define RATE_W 7   /* "1234.5" (MB/s) */
#define ETA_W 8    /* "12:34:56" */
/* Everything but the name: five columns, each after two spaces. */
#define FIXED_W (2 + STATE_W + 2 + BYTES_W + 2 + BYTES_W + 2 + RATE_W + 2 + ETA_W)
#define MIN_NAME_W 8
/* Narrower terminals wrap the lines: the columns need this much. */
#define MIN_COLUMNS (FIXED_W + MIN_NAME_W + 1)

/* The width to fit: the terminal's, else $COLUMNS, else 80. One column is
 * left free: a character in the last one makes some terminals wrap. */
static size_t screen_columns(int tty, size_t *rows)
{
    struct winsize ws;
    size_t cols = 0;
    *rows = 0;
    if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        cols = ws.ws_col;
        *rows = ws.ws_row;
    }
    const char *env = getenv("COLUMNS");
    if (!cols && env && atoi(env) > 0)
        cols = (size_t)atoi(env);
    if (!cols)
        cols = 80;
    if (cols < MIN_COLUMNS)
        cols = MIN_COLUMNS;
    if (cols > MAX_COLUMNS)
        cols = MAX_COLUMNS;
    return cols - 1;
}

/* s cut to at most width bytes (so at most width columns), ending in "..."
 * when cut, never inside a UTF-8 sequence; bytes that would move the
 * cursor or talk to the terminal become '?'. */
static void fit(char *out, const char *s, size_t width)
{
    size_t len = strlen(s);
    size_t keep = len;
    if (len > width) {
        keep = width > 3 ? width - 3 : 0;
        while (keep > 0 && ((unsigned char)s[keep] & 0xC0) == 0x80)
            keep--;
    }
    memcpy(out, s, keep);
    if (keep < len)
        memcpy(out + keep, "...", 4);
    else
        out[keep] = '\0';
    cli_sanitize(out);
}

/* Errors name the pack ("/BACKING/NAME.tpack: wrong key: ..."); the line
 * already names the checkpoint, and the room is better spent on why. */
static const char *short_error(const char *error)
{
    const char *after = strstr(error, ".tpack: ");
    return error[0] == '/' && after ? after + 8 : error;
}

/* One checkpoint's line, at most width columns; one with an error shows
 * the error after its state instead of the numbers. */
static void format_line(const status_entry *e, size_t width, char *line, size_t cap)
{
    const mount_state *st = &e->st;
    size_t name_w = width - FIXED_W;
    char name[MAX_COLUMNS + 4], state[STATE_W + 4];
    char staged[16] = "-", packed[16] = "-", rate[16] = "-", eta[16] = "-";
    fit(name, e->name, name_w);
    fit(state, st->state, STATE_W);
    int packing = strcmp(st->state, CKPT_STATE_PACKING) == 0;
    if (strcmp(st->state, CKPT_STATE_COMMITTED) == 0) {
        cli_fmt_bytes(st->size, packed, sizeof packed);
    } else if (packing) {
        cli_fmt_bytes(st->total ? st->total : st->size, staged, sizeof staged);
        cli_fmt_bytes(st->done, packed, sizeof packed);
        if (st->seconds > 0)
            snprintf(rate, sizeof rate, "%.1f", (double)st->done / st->seconds / 1e6);
        if (st->done == 0 && st->seconds == 0)
            snprintf(eta, sizeof eta, "queued");
        else
            cli_fmt_eta(mount_state_eta(st), eta, sizeof eta);
    } else if (!status_is_error_state(st->state) || strcmp(st->state, CKPT_STATE_FAILED) == 0) {
        cli_fmt_bytes(st->size, staged, sizeof staged);
    } else {
        cli_fmt_bytes(st->size, packed, sizeof packed); /* the pack that cannot be read */
    }
    int n;
    if (st->error[0]) {
        /* Why, in the room of the byte and rate columns: the news here. */
        n = snprintf(line, cap, "%-*s  %-*s", (int)name_w, name, STATE_W, state);
        if (n < 0 || (size_t)n >= cap)
            return;
        char why[MAX_COLUMNS + 4];
        fit(why, short_error(st->error), width - (size_t)n - 2);
        snprintf(line + n, cap - (size_t)n, "  %s", why);
        return;
    }
    n = snprintf(line, cap, "%-*s  %-*s  %*s  %*s", (int)name_w, name, STATE_W, state, BYTES_W,
                 staged, BYTES_W, packed);
    if (n < 0 || (size_t)n >= cap)
        return;
    {
        snprintf(line + n, cap - (size_t)n, "  %*s  %*s", RATE_W, rate, ETA_W, eta);
    }
}

static void format_header(size_t width, char *line, size_t cap)
{
    snprintf(line, cap, "%-*s  %-*s  %*s  %*s  %*s  %*s", (int)(width - FIXED_W), "NAME", STATE_W,
             "STATE", BYTES_W, "STAGED", BYTES_W, "PACKED", RATE_W, "MB/s", ETA_W, "ETA");
}

/* What was last written for each checkpoint, for the plain output. */
typedef struct seen_line {
    char *name, *line;
} seen_line;

typedef struct watch_state {
    int tty;
    size_t drawn; /* lines of the last frame on the terminal */
    seen_line *seen;
    size_t n_seen;
    char last_error[512];
} watch_state;

static const char *seen_get(const watch_state *w, const char *name)
{
    for (size_t i = 0; i < w->n_seen; i++)
        if (strcmp(w->seen[i].name, name) == 0)
            return w->seen[i].line;
    return NULL;
}

static void seen_set(watch_state *w, const char *name, const char *line)
{
    for (size_t i = 0; i < w->n_seen; i++) {
        if (strcmp(w->seen[i].name, name) == 0) {
            char *copy = strdup(line);
            if (copy) {
                free(w->seen[i].line);
                w->seen[i].line = copy;
            }
            return;
        }
    }
    seen_line *grown = realloc(w->seen, (w->n_seen + 1) * sizeof *grown);
    if (!grown)
        return;
    w->seen = grown;
    grown[w->n_seen].name = strdup(name);
    grown[w->n_seen].line = strdup(line);
    if (grown[w->n_seen].name && grown[w->n_seen].line)
        w->n_seen++;
    else {
        free(grown[w->n_seen].name);
        free(grown[w->n_seen].line);
    }
}

static void seen_free(watch_state *w)
{
    for (size_t i = 0; i < w->n_seen; i++) {
        free(w->seen[i].name);
        free(w->seen[i].line);
    }
    free(w->seen);
}

/* One frame on the terminal: back over the last one, every line drawn over
 * and cleared to its end, then whatever the last frame had below cleared. */
static void draw_tty(watch_state *w, const status_entry *v, size_t n, const char *err)
{
    size_t rows;
    size_t width = screen_columns(1, &rows);
    char line[MAX_COLUMNS * 2 + 64];
    if (w->drawn)
        printf("\r\033[%zuA", w->drawn);
    size_t lines = 0;
    if (err) {
        fit(line, err, width);
        printf("%s\033[K\n", line);
        lines++;
    } else {
        /* Cursor movement stops at the top: never more lines than fit. */
        size_t room = rows > 2 ? rows - 2 : SIZE_MAX;
        format_header(width, line, sizeof line);
        printf("%s\033[K\n", line);
        lines++;
        for (size_t i = 0; i < n; i++, lines++) {
            if (i + 1 == room && i + 1 < n) {
                printf("... and %zu more\033[K\n", n - i);
                lines++;
                break;
            }
            format_line(&v[i], width, line, sizeof line);
            printf("%s\033[K\n", line);
        }
    }
    printf("\033[J");
    fflush(stdout);
    w->drawn = lines;
}

/* Plain lines: the header once, then each checkpoint's line when it is new
 * or changed, and a checkpoint that went away once. */
static void draw_plain(watch_state *w, const status_entry *v, size_t n, const char *err)
{
    size_t rows;
    size_t width = screen_columns(0, &rows);
    char line[MAX_COLUMNS * 2 + 64];
    if (err) {
        if (strcmp(err, w->last_error) != 0) {
            fit(line, err, width);
            printf("%s\n", line);
            memcpy(w->last_error, err, strnlen(err, sizeof w->last_error - 1));
            w->last_error[strnlen(err, sizeof w->last_error - 1)] = '\0';
        }
        fflush(stdout);
        return;
    }
    w->last_error[0] = '\0';
    if (!w->drawn) {
        format_header(width, line, sizeof line);
        printf("%s\n", line);
        w->drawn = 1;
    }
    for (size_t i = 0; i < n; i++) {
        format_line(&v[i], width, line, sizeof line);
        const char *before = seen_get(w, v[i].name);
        if (!before || strcmp(before, line) != 0) {
            printf("%s\n", line);
            seen_set(w, v[i].name, line);
        }
    }
    for (size_t i = 0; i < w->n_seen; i++) {
        int present = 0;
        for (size_t j = 0; j < n && !present; j++)
            present = strcmp(v[j].name, w->seen[i].name) == 0;
        if (!present && strcmp(w->seen[i].line, "") != 0) {
            char gone[MAX_COLUMNS + 4];
            fit(gone, w->seen[i].name, width - 8);
            printf("%s  (gone)\n", gone);
            char *empty = strdup("");
            if (empty) {
                free(w->seen[i].line);
                w->seen[i].line = empty;
            }
        }
    }
    fflush(stdout);
}

int status_watch(const char *path, double interval, int once)
{
    watch_state w = {.tty = isatty(STDOUT_FILENO)};
    status_entry *v;
    size_t n;
    /* A path that is not a mount at the start is a mistake: say so. */
    int rc = status_collect(path, &v, &n);
    if (rc)
        return cli_fail("%s: %s", path,
                        rc == -ENODATA ? "not a ckptfs mount or checkpoint" : mount_state_why(rc));
    int exit_rc = EXIT_OK;
    for (;;) {
        char err[512];
        const char *why = NULL;
        if (rc) {
            /* Later (an unmount, a restart): shown, and watched on. */
            snprintf(err, sizeof err, "%s: %s", path,
                     rc == -ENODATA ? "not a ckptfs mount or checkpoint" : mount_state_why(rc));
            why = err;
            n = 0;
            v = NULL;
        }
        if (w.tty)
            draw_tty(&w, v, n, why);
        else
            draw_plain(&w, v, n, why);
        exit_rc = status_exit(v, n);
        status_free(v, n);
        if (once)
            break;
        struct timespec ts = {(time_t)interval,
                              (long)((interval - (double)(time_t)interval) * 1e9)};
        nanosleep(&ts, NULL);
        rc = status_collect(path, &v, &n);
    }
    seen_free(&w);
    return exit_rc;
}
