#include "ring.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { S_FREE, S_FILLING, S_INFLIGHT, S_READY };

typedef struct slot_state {
    int state;
    cc_commit_mode mode;
    unsigned pending; /* copies queued since acquire, not yet behind an event */
    uint64_t seq;     /* commit number: tells a reused slot from the one waited on */
} slot_state;

struct cc_ring {
    cc_backend *be;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned n, nstreams;
    size_t slot_bytes;
    uint8_t *host;
    cc_slot *slots;
    slot_state *st;
    void **streams;
    void **events;
    uint64_t seq;
    int failed;
    ckpt_err error;
    cc_ring_counters count;
};

static void *stream_of(cc_ring *r, unsigned i)
{
    return r->streams[i % r->nstreams];
}

int cc_ring_new(cc_backend *be, unsigned nslots, size_t slot_bytes, unsigned nstreams,
                cc_ring **out, ckpt_err *err)
{
    *out = NULL;
    if (nslots == 0 || nstreams == 0 || slot_bytes == 0 || slot_bytes > SIZE_MAX / nslots)
        return cc_fail(err, -EINVAL, "bad ring geometry: %u slots of %zu bytes, %u streams", nslots,
                       slot_bytes, nstreams);
    cc_ring *r = calloc(1, sizeof *r);
    if (!r)
        return cc_fail(err, -ENOMEM, "out of memory");
    r->be = be;
    r->n = nslots;
    r->nstreams = nstreams;
    r->slot_bytes = slot_bytes;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->slots = calloc(nslots, sizeof *r->slots);
    r->st = calloc(nslots, sizeof *r->st);
    r->streams = calloc(nstreams, sizeof *r->streams);
    r->events = calloc(nslots, sizeof *r->events);
    int rc;
    if (!r->slots || !r->st || !r->streams || !r->events) {
        rc = cc_fail(err, -ENOMEM, "out of memory");
        goto fail;
    }
    /* One pinned allocation: pinning costs per call as well as per byte. */
    void *host = NULL;
    if ((rc = be->ops->host_alloc(be, (size_t)nslots * slot_bytes, &host, err)) < 0)
        goto fail;
    r->host = host;
    for (unsigned i = 0; i < nslots; i++) {
        r->slots[i].buf = r->host + (size_t)i * slot_bytes;
        r->slots[i].cap = slot_bytes;
        r->slots[i].index = i;
        if ((rc = be->ops->event_new(be, &r->events[i], err)) < 0)
            goto fail;
    }
    for (unsigned i = 0; i < nstreams; i++)
        if ((rc = be->ops->stream_new(be, &r->streams[i], err)) < 0)
            goto fail;
    *out = r;
    return 0;
fail:
    cc_ring_free(r);
    return rc;
}

/* Makes sure no copy still targets slot i's buffer: copies queued without an
 * event get one and are waited for; if the backend cannot even do that (a
 * broken context), the whole device is synchronised instead. */
static void quiesce(cc_ring *r, unsigned i)
{
    cc_backend *be = r->be;
    ckpt_err ignored;
    if (r->st[i].pending == 0)
        return;
    if (be->ops->event_record(be, r->events[i], stream_of(r, i), &ignored) < 0 ||
        be->ops->event_wait(be, r->events[i], &ignored) < 0)
        be->ops->sync(be, &ignored);
    r->st[i].pending = 0;
}

void cc_ring_free(cc_ring *r)
{
    if (!r)
        return;
    cc_backend *be = r->be;
    ckpt_err ignored;
    if (r->st && r->events) {
        for (unsigned i = 0; i < r->n; i++) {
            if (r->st[i].state == S_INFLIGHT && r->events[i])
                be->ops->event_wait(be, r->events[i], &ignored);
            if (r->events[i])
                quiesce(r, i);
        }
    }
    if (r->events)
        for (unsigned i = 0; i < r->n; i++)
            if (r->events[i])
                be->ops->event_free(be, r->events[i]);
    if (r->streams)
        for (unsigned i = 0; i < r->nstreams; i++)
            if (r->streams[i])
                be->ops->stream_free(be, r->streams[i]);
    if (r->host)
        be->ops->host_free(be, r->host);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r->slots);
    free(r->st);
    free(r->streams);
    free(r->events);
    free(r);
}

static void fail_locked(cc_ring *r, const ckpt_err *e)
{
    if (!r->failed) {
        r->failed = 1;
        r->error = *e;
        if (r->error.code == 0)
            r->error.code = -EIO;
    }
    pthread_cond_broadcast(&r->cv);
}

void cc_ring_fail(cc_ring *r, const ckpt_err *e)
{
    pthread_mutex_lock(&r->mu);
    fail_locked(r, e);
    pthread_mutex_unlock(&r->mu);
}

int cc_ring_error(cc_ring *r, ckpt_err *err)
{
    pthread_mutex_lock(&r->mu);
    int rc = r->failed ? cc_fail_copy(err, &r->error) : 0;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Waits on slot i's event with the lock dropped. Returns 1 if the slot is
 * still the same flight afterwards (and now done), 0 if someone else moved
 * it on meanwhile, or -errno (the ring is failed). Called with the lock. */
static int wait_flight_locked(cc_ring *r, unsigned i)
{
    uint64_t seq = r->st[i].seq;
    ckpt_err e = {0};
    pthread_mutex_unlock(&r->mu);
    int rc = r->be->ops->event_wait(r->be, r->events[i], &e);
    pthread_mutex_lock(&r->mu);
    if (rc < 0) {
        fail_locked(r, &e);
        return rc;
    }
    return r->st[i].state == S_INFLIGHT && r->st[i].seq == seq;
}

static void take_locked(cc_ring *r, unsigned i, cc_slot **out)
{
    r->st[i].state = S_FILLING;
    r->st[i].pending = 0;
    r->count.acquires++;
    *out = &r->slots[i];
}

int cc_ring_acquire(cc_ring *r, cc_slot **out, ckpt_err *err)
{
    cc_backend *be = r->be;
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->failed) {
            int rc = cc_fail_copy(err, &r->error);
            pthread_mutex_unlock(&r->mu);
            return rc;
        }
        unsigned oldest = r->n;
        for (unsigned i = 0; i < r->n; i++) {
            if (r->st[i].state == S_FREE) {
                take_locked(r, i, out);
                pthread_mutex_unlock(&r->mu);
                return 0;
            }
        }
        /* No free slot: reclaim a recycled one whose copy has finished. */
        for (unsigned i = 0; i < r->n; i++) {
            if (r->st[i].state != S_INFLIGHT || r->st[i].mode != CC_RECYCLE)
                continue;
            ckpt_err e = {0};
            int q = be->ops->event_query(be, r->events[i], &e);
            if (q < 0) {
                fail_locked(r, &e);
                break;
            }
            if (q > 0) {
                r->count.reclaim_polls++;
                take_locked(r, i, out);
                pthread_mutex_unlock(&r->mu);
                return 0;
            }
            if (oldest == r->n || r->st[i].seq < r->st[oldest].seq)
                oldest = i;
        }
        if (r->failed)
            continue;
        if (oldest < r->n) {
            /* Copies finish in about the order they were queued: the
             * oldest flight is the one to block on. */
            int rc = wait_flight_locked(r, oldest);
            if (rc == 1) {
                r->count.reclaim_waits++;
                take_locked(r, oldest, out);
                pthread_mutex_unlock(&r->mu);
                return 0;
            }
            continue;
        }
        /* Everything is being filled or held by a consumer. */
        r->count.idle_waits++;
        pthread_cond_wait(&r->cv, &r->mu);
    }
}

int cc_ring_copy(cc_ring *r, cc_slot *s, void *dst, const void *src, size_t len, cc_dir dir,
                 ckpt_err *err)
{
    const uint8_t *host = dir == CC_H2D ? (const uint8_t *)src : (const uint8_t *)dst;
    if (host < s->buf || host > s->buf + s->cap || len > (size_t)(s->buf + s->cap - host))
        return cc_fail(err, -EINVAL, "ring: copy of %zu bytes outside slot %u", len, s->index);
    int rc = cc_ring_error(r, err);
    if (rc < 0)
        return rc;
    ckpt_err e = {0};
    rc = r->be->ops->copy_async(r->be, dst, src, len, dir, stream_of(r, s->index), &e);
    pthread_mutex_lock(&r->mu);
    if (rc < 0) {
        fail_locked(r, &e);
        cc_fail_copy(err, &e);
    } else {
        r->st[s->index].pending++;
        r->count.copies++;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int cc_ring_commit(cc_ring *r, cc_slot *s, cc_commit_mode mode, ckpt_err *err)
{
    unsigned i = s->index;
    ckpt_err e = {0};
    int rc = r->be->ops->event_record(r->be, r->events[i], stream_of(r, i), &e);
    pthread_mutex_lock(&r->mu);
    if (rc < 0) {
        /* The slot stays FILLING: the caller releases it, which waits out
         * the copies that were queued. */
        fail_locked(r, &e);
        pthread_mutex_unlock(&r->mu);
        return cc_fail_copy(err, &e);
    }
    slot_state *st = &r->st[i];
    st->state = S_INFLIGHT;
    st->mode = mode;
    st->pending = 0;
    st->seq = ++r->seq;
    r->count.commits++;
    /* An acquire sleeping because nothing was in flight can now wait on it. */
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int cc_ring_wait(cc_ring *r, cc_slot *s, ckpt_err *err)
{
    unsigned i = s->index;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    while (r->st[i].state == S_INFLIGHT) {
        rc = wait_flight_locked(r, i);
        if (rc < 0)
            break;
        if (rc == 1)
            r->st[i].state = S_READY;
        rc = 0;
    }
    if (rc < 0)
        cc_fail_copy(err, &r->error);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void cc_ring_release(cc_ring *r, cc_slot *s)
{
    unsigned i = s->index;
    pthread_mutex_lock(&r->mu);
    if (r->st[i].state == S_INFLIGHT) {
        /* Released without waiting (an error path): the copy may still be
         * writing into the buffer. */
        ckpt_err ignored;
        pthread_mutex_unlock(&r->mu);
        r->be->ops->event_wait(r->be, r->events[i], &ignored);
        pthread_mutex_lock(&r->mu);
    }
    if (r->st[i].pending) {
        pthread_mutex_unlock(&r->mu);
        quiesce(r, i);
        pthread_mutex_lock(&r->mu);
    }
    r->st[i].state = S_FREE;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int cc_ring_drain(cc_ring *r, ckpt_err *err)
{
    pthread_mutex_lock(&r->mu);
    for (int again = 1; again;) {
        again = 0;
        for (unsigned i = 0; i < r->n; i++) {
            if (r->st[i].state != S_INFLIGHT)
                continue;
            int rc = wait_flight_locked(r, i);
            if (rc == 1)
                r->st[i].state = r->st[i].mode == CC_HOLD ? S_READY : S_FREE;
            if (rc < 0)
                break;
            /* The lock was dropped: look at every slot again. */
            again = 1;
        }
        if (r->failed)
            break;
    }
    int rc = r->failed ? cc_fail_copy(err, &r->error) : 0;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

unsigned cc_ring_slot_count(const cc_ring *r)
{
    return r->n;
}

size_t cc_ring_slot_bytes(const cc_ring *r)
{
    return r->slot_bytes;
}

void cc_ring_get_counters(cc_ring *r, cc_ring_counters *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->count;
    pthread_mutex_unlock(&r->mu);
}
