/* The progress bar. It is cosmetic, so it never blocks the work: a redraw is
 * skipped when another thread holds the lock or the last one was under
 * 100 ms ago, and nothing is drawn at all unless stderr is a terminal (logs
 * and pipes stay clean). */
#include "cli.h"

#include <stdio.h>
#include <unistd.h>

#define REDRAW_INTERVAL 0.1

void progress_start(progress *pg, const char *label, uint64_t total)
{
    pg->enabled = isatty(STDERR_FILENO);
    pg->drawn = 0;
    pg->label = label;
    pg->done = 0;
    pg->total = total;
    pg->start = cli_now();
    pg->last_draw = 0;
    pthread_mutex_init(&pg->mu, NULL);
}

void cli_fmt_eta(double secs, char *buf, size_t len)
{
    if (secs < 0 || secs > 99 * 3600) {
        snprintf(buf, len, "--:--");
        return;
    }
    unsigned s = (unsigned)(secs + 0.5);
    if (s >= 3600)
        snprintf(buf, len, "%u:%02u:%02u", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, len, "%u:%02u", s / 60, s % 60);
}

/* Caller holds pg->mu. */
static void draw(progress *pg, double now)
{
    char done[16], total[16], rate[16], eta[16];
    double elapsed = now - pg->start;
    double pct = pg->total ? 100.0 * (double)pg->done / (double)pg->total : 0.0;
    if (pct > 100.0)
        pct = 100.0;
    double bps = elapsed > 0 ? (double)pg->done / elapsed : 0.0;
    uint64_t left = pg->total > pg->done ? pg->total - pg->done : 0;
    /* The first fraction of a second gives wild rates; wait for a real one. */
    cli_fmt_eta(bps > 0 && elapsed >= 0.5 ? (double)left / bps : -1, eta, sizeof eta);
    /* \033[K erases what a longer previous line left behind. */
    fprintf(stderr, "\r%s %5.1f%%  %s / %s  %s  ETA %s\033[K", pg->label, pct,
            cli_fmt_bytes(pg->done, done, sizeof done),
            cli_fmt_bytes(pg->total, total, sizeof total),
            cli_fmt_rate(pg->done, elapsed, rate, sizeof rate), eta);
    fflush(stderr);
    pg->drawn = 1;
    pg->last_draw = now;
}

static void maybe_draw(progress *pg)
{
    double now = cli_now();
    if (now - pg->last_draw >= REDRAW_INTERVAL)
        draw(pg, now);
}

void progress_set(progress *pg, uint64_t done, uint64_t total)
{
    if (!pg->enabled || pthread_mutex_trylock(&pg->mu) != 0)
        return;
    pg->done = done;
    if (total)
        pg->total = total;
    maybe_draw(pg);
    pthread_mutex_unlock(&pg->mu);
}

void progress_add(progress *pg, uint64_t delta)
{
    if (!pg->enabled)
        return;
    /* Unlike progress_set, a skipped add would lose bytes, so wait. */
    pthread_mutex_lock(&pg->mu);
    pg->done += delta;
    maybe_draw(pg);
    pthread_mutex_unlock(&pg->mu);
}

void progress_clear(progress *pg)
{
    if (!pg->enabled)
        return;
    pthread_mutex_lock(&pg->mu);
    if (pg->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        pg->drawn = 0;
        /* Let the next update redraw at once rather than leave a gap. */
        pg->last_draw = 0;
    }
    pthread_mutex_unlock(&pg->mu);
}

void progress_end(progress *pg)
{
    progress_clear(pg);
    pg->enabled = 0;
    pthread_mutex_destroy(&pg->mu);
}

void progress_cb(void *ud, uint64_t done, uint64_t total)
{
    progress_set(ud, done, total);
}
