/* Store-wide fail-fast while the gateway does not answer.
 *
 * Without it, every request during an outage spent the whole retry
 * sequence on its own: against a stopped gateway (SIGSTOP: connections
 * are accepted, nothing answers) one getfattr of a mount took 42 s, and
 * each lookup, listing refresh and open of another pack as long again.
 * Here the first request that ends with no answer after its retries, and
 * whose failure a probe confirms (the gateway answers nothing else either:
 * a lost answer to one long request is no outage), marks the gateway
 * down; until a back-off has passed, every request fails at
 * once with -EIO (transient: not the object's fault), as s3fs and rclone
 * mounts answer a gateway they cannot reach. The first request after the
 * back-off probes first: one HEAD of the bucket, bounded by its own
 * timeout, whose any HTTP answer (even 403) shows the gateway is back;
 * meanwhile the others still fail at once. Any answer to a request that
 * was already under way clears the mark as well.
 *
 * An answer, even 500 or 503, is no outage, however many come: the
 * gateway is there, and what it refuses is this request (an object
 * whose placement group is down, a throttle), not every request. A 503
 * SlowDown asks the client to back off, which each request's retries do
 * (exponential, with jitter, within the deadline); failing every other
 * request at once would turn a throttle into EIO for every reader, and
 * answer for objects the gateway still serves. s3fs and rclone do the same:
 * a 5xx is retried per request (rclone's pacer slows down on 503), and
 * nothing marks the whole store down. The cost: against a gateway that
 * answers 500 to everything, each request waits out its retries (30 s).
 *
 * Only the state machine lives here, with the time given by the caller, so
 * that it is tested without a network; s3_http.c asks it before and tells
 * it after each request. One mutex; nothing is held across a request. */
#include "s3.h"

#include <stdio.h>
#include <string.h>

void s3_outage_init(s3_outage *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
}

void s3_outage_destroy(s3_outage *o)
{
    pthread_mutex_destroy(&o->mu);
}

static void describe(const s3_outage *o, uint64_t now_ms, char *why, size_t cap)
{
    if (!why || !cap)
        return;
    uint64_t since = now_ms > o->since_ms ? now_ms - o->since_ms : 0;
    uint64_t left = o->probe_at_ms > now_ms ? o->probe_at_ms - now_ms : 0;
    snprintf(why, cap, "none for %.1f s, not asked again for %.1f s; last: %s", (double)since / 1e3,
             (double)left / 1e3, o->why);
}

int s3_outage_admit(s3_outage *o, uint64_t now_ms, char *why, size_t cap)
{
    pthread_mutex_lock(&o->mu);
    int r = S3_OUTAGE_GO;
    if (o->down && !o->probing && now_ms >= o->probe_at_ms) {
        o->probing = 1;
        r = S3_OUTAGE_PROBE;
    } else if (o->down) {
        describe(o, now_ms, why, cap);
        r = S3_OUTAGE_REFUSE;
    }
    pthread_mutex_unlock(&o->mu);
    return r;
}

void s3_outage_probed(s3_outage *o, int answered, const char *what, uint64_t now_ms, char *why,
                      size_t cap)
{
    pthread_mutex_lock(&o->mu);
    o->probing = 0;
    if (answered) {
        o->down = 0;
        o->answer_ms = now_ms;
    } else {
        o->probe_at_ms = now_ms + S3_OUTAGE_BACKOFF_MS;
        if (what && what[0])
            snprintf(o->why, sizeof o->why, "%s", what);
        describe(o, now_ms, why, cap);
    }
    pthread_mutex_unlock(&o->mu);
}

void s3_outage_note(s3_outage *o, int silent, const char *what, uint64_t began_ms,
                    uint64_t probe_ms, uint64_t now_ms)
{
    pthread_mutex_lock(&o->mu);
    if (!silent) {
        o->down = 0;
        o->answer_ms = now_ms;
    } else if (o->answer_ms > probe_ms) {
        /* Someone got an answer after this request's probe began: the
         * gateway is back, whatever this one found before. */
    } else {
        if (!o->down)
            o->since_ms = began_ms;
        o->down = 1;
        o->probe_at_ms = now_ms + S3_OUTAGE_BACKOFF_MS;
        snprintf(o->why, sizeof o->why, "%s", what && what[0] ? what : "no response");
    }
    pthread_mutex_unlock(&o->mu);
}

int s3_outage_is_down(s3_outage *o)
{
    pthread_mutex_lock(&o->mu);
    int down = o->down;
    pthread_mutex_unlock(&o->mu);
    return down;
}
