#include "fake_backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fake_event {
    uint64_t recorded, completed;
    struct fake_stream *stream;
} fake_event;

typedef struct fake_op {
    struct fake_op *next;
    void *dst;
    const void *src;
    size_t len;
    fake_event *ev; /* a record, when set; else a copy */
    uint64_t gen;
} fake_op;

typedef struct fake_stream {
    fake_op *head, *tail;
    struct fake_stream *next_live;
} fake_stream;

typedef struct alloc {
    uint8_t *p;
    size_t len;
    int dev;
    void *raw; /* what malloc returned, when not p */
} alloc;

typedef struct fake_be {
    cc_backend base;
    fake_cfg *cfg;
    int dev;
    pthread_mutex_t mu;
    alloc *allocs;
    size_t n_allocs, cap_allocs;
    alloc region;         /* cfg->dev_region, as an allocation */
    fake_stream *streams; /* live ones, for checks */
    long queries, waits;
} fake_be;

static fake_be *F(cc_backend *b)
{
    return (fake_be *)b;
}

static int fail(ckpt_err *err, int code, const char *msg)
{
    if (err) {
        err->code = code;
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    return code;
}

static int inside(const alloc *a, const void *p, size_t len)
{
    const uint8_t *q = p;
    return q >= a->p && q <= a->p + a->len && len <= (size_t)(a->p + a->len - q);
}

static const alloc *find(fake_be *f, const void *p, size_t len)
{
    for (size_t i = 0; i < f->n_allocs; i++)
        if (inside(&f->allocs[i], p, len))
            return &f->allocs[i];
    f->region = (alloc){f->cfg->dev_region, f->cfg->dev_region_len, 1, NULL};
    if (f->region.p && inside(&f->region, p, len))
        return &f->region;
    return NULL;
}

static void track(fake_be *f, void *p, size_t len, int dev, void *raw)
{
    if (f->n_allocs == f->cap_allocs) {
        f->cap_allocs = f->cap_allocs ? 2 * f->cap_allocs : 16;
        f->allocs = realloc(f->allocs, f->cap_allocs * sizeof *f->allocs);
        if (!f->allocs)
            abort();
    }
    f->allocs[f->n_allocs++] = (alloc){p, len, dev, raw};
}

/* Forgets allocation p: its length, and in *raw what to free(). */
static size_t untrack(fake_be *f, void *p, void **raw)
{
    *raw = p;
    for (size_t i = 0; i < f->n_allocs; i++) {
        if (f->allocs[i].p == p) {
            size_t len = f->allocs[i].len;
            if (f->allocs[i].raw)
                *raw = f->allocs[i].raw;
            f->allocs[i] = f->allocs[--f->n_allocs];
            return len;
        }
    }
    f->cfg->bad_pointer++;
    return 0;
}

static int overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
    const uint8_t *x = a, *y = b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* Is any queued copy reading or writing [p, p + len)? */
static void check_free(fake_be *f, void *p, size_t len)
{
    for (fake_stream *s = f->streams; s; s = s->next_live)
        for (fake_op *o = s->head; o; o = o->next)
            if (!o->ev && (overlaps(o->dst, o->len, p, len) || overlaps(o->src, o->len, p, len)))
                f->cfg->freed_under_copy++;
}

/* Runs stream s's queue up to and including the record of generation gen
 * of event ev (or everything when ev is NULL). */
static void run_stream(fake_stream *s, fake_event *ev, uint64_t gen)
{
    while (s->head) {
        fake_op *o = s->head;
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        int stop = 0;
        if (o->ev) {
            if (o->gen > o->ev->completed)
                o->ev->completed = o->gen;
            stop = ev && o->ev == ev && o->gen >= gen;
        } else {
            memcpy(o->dst, o->src, o->len);
        }
        free(o);
        if (stop)
            return;
    }
}

static void push(fake_stream *s, fake_op *o)
{
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
}

static int fb_bind(cc_backend *b, ckpt_err *err)
{
    fake_be *f = F(b);
    pthread_mutex_lock(&f->mu);
    f->cfg->bind_depth++;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static void fb_unbind(cc_backend *b)
{
    fake_be *f = F(b);
    pthread_mutex_lock(&f->mu);
    f->cfg->bind_depth--;
    pthread_mutex_unlock(&f->mu);
}

static int fb_dev_alloc(cc_backend *b, size_t len, void **out, ckpt_err *err)
{
    fake_be *f = F(b);
    void *raw;
    pthread_mutex_lock(&f->mu);
    int rc = 0;
    if (f->cfg->dev_capacity && len > f->cfg->dev_capacity - f->cfg->dev_in_use) {
        char msg[200];
        snprintf(msg, sizeof msg, "out of device memory allocating %zu bytes on device %d", len,
                 f->dev);
        rc = fail(err, -ENOMEM, msg);
    } else if (!(raw = malloc(len + 3 * CC_DEV_ALIGN))) {
        rc = fail(err, -ENOMEM, "fake: malloc failed");
    } else {
        /* Aligned to exactly what cudaMalloc promises and no more (an odd
         * multiple of it), so a pipeline counting on more is caught. */
        uintptr_t two = 2 * (uintptr_t)CC_DEV_ALIGN;
        *out = (void *)((((uintptr_t)raw + two - 1) & ~(two - 1)) + CC_DEV_ALIGN);
        /* Garbage, like fresh device memory: padding must be written. */
        memset(*out, 0xA5, len);
        track(f, *out, len, 1, raw);
        f->cfg->dev_in_use += len;
        f->cfg->live_dev++;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void fb_dev_free(cc_backend *b, void *p)
{
    fake_be *f = F(b);
    void *raw;
    pthread_mutex_lock(&f->mu);
    size_t len = untrack(f, p, &raw);
    check_free(f, p, len);
    f->cfg->dev_in_use -= len;
    f->cfg->live_dev--;
    pthread_mutex_unlock(&f->mu);
    free(raw);
}

static int fb_host_alloc(cc_backend *b, size_t len, void **out, ckpt_err *err)
{
    fake_be *f = F(b);
    if (f->cfg->fail_host_alloc)
        return fail(err, -ENOMEM, "out of pinned host memory (fake)");
    pthread_mutex_lock(&f->mu);
    int rc = 0;
    if (!(*out = malloc(len))) {
        rc = fail(err, -ENOMEM, "fake: malloc failed");
    } else {
        memset(*out, 0x5A, len);
        track(f, *out, len, 0, NULL);
        f->cfg->live_host++;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void fb_host_free(cc_backend *b, void *p)
{
    fake_be *f = F(b);
    void *raw;
    pthread_mutex_lock(&f->mu);
    size_t len = untrack(f, p, &raw);
    check_free(f, p, len);
    f->cfg->live_host--;
    pthread_mutex_unlock(&f->mu);
    free(raw);
}

static int fb_stream_new(cc_backend *b, void **out, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_stream *s = calloc(1, sizeof *s);
    if (!s)
        return fail(err, -ENOMEM, "fake: calloc failed");
    pthread_mutex_lock(&f->mu);
    s->next_live = f->streams;
    f->streams = s;
    f->cfg->live_streams++;
    pthread_mutex_unlock(&f->mu);
    *out = s;
    return 0;
}

static void fb_stream_free(cc_backend *b, void *p)
{
    fake_be *f = F(b);
    fake_stream *s = p;
    pthread_mutex_lock(&f->mu);
    /* Like cudaStreamDestroy: queued work still completes. */
    run_stream(s, NULL, 0);
    for (fake_stream **pp = &f->streams; *pp; pp = &(*pp)->next_live) {
        if (*pp == s) {
            *pp = s->next_live;
            break;
        }
    }
    f->cfg->live_streams--;
    pthread_mutex_unlock(&f->mu);
    free(s);
}

static int fb_event_new(cc_backend *b, void **out, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_event *e = calloc(1, sizeof *e);
    if (!e)
        return fail(err, -ENOMEM, "fake: calloc failed");
    pthread_mutex_lock(&f->mu);
    f->cfg->live_events++;
    pthread_mutex_unlock(&f->mu);
    *out = e;
    return 0;
}

static void fb_event_free(cc_backend *b, void *e)
{
    fake_be *f = F(b);
    pthread_mutex_lock(&f->mu);
    f->cfg->live_events--;
    pthread_mutex_unlock(&f->mu);
    free(e);
}

static int fb_copy_async(cc_backend *b, void *dst, const void *src, size_t len, cc_dir dir,
                         void *stream, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_cfg *c = f->cfg;
    pthread_mutex_lock(&f->mu);
    long n = ++c->copies;
    if (c->fail_copy_at && n == c->fail_copy_at) {
        pthread_mutex_unlock(&f->mu);
        return fail(err, -EIO, "cudaMemcpyAsync: invalid argument (fake)");
    }
    const void *dev = dir == CC_H2D ? dst : src, *host = dir == CC_H2D ? src : dst;
    const alloc *d = find(f, dev, len), *h = find(f, host, len);
    if (!d || !d->dev)
        c->bad_pointer++;
    if (!h)
        c->pageable++;
    else if (h->dev)
        c->bad_pointer++;
    if (dir == CC_H2D) {
        c->h2d++;
        c->h2d_bytes += len;
    } else {
        c->d2h++;
        c->d2h_bytes += len;
    }
    int rc = 0;
    if (c->immediate || !d || (h && h->dev)) {
        if (d && !(h && h->dev) && !c->no_data)
            memcpy(dst, src, len);
    } else {
        fake_op *o = calloc(1, sizeof *o);
        if (!o) {
            rc = fail(err, -ENOMEM, "fake: calloc failed");
        } else {
            o->dst = dst;
            o->src = src;
            o->len = c->no_data ? 0 : len;
            push(stream, o);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fb_event_record(cc_backend *b, void *ev, void *stream, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_event *e = ev;
    fake_op *o = calloc(1, sizeof *o);
    if (!o)
        return fail(err, -ENOMEM, "fake: calloc failed");
    pthread_mutex_lock(&f->mu);
    e->stream = stream;
    o->ev = e;
    o->gen = ++e->recorded;
    push(stream, o);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int fb_event_query(cc_backend *b, void *ev, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_event *e = ev;
    pthread_mutex_lock(&f->mu);
    /* Every other poll finds the copy still running, so both reclaim paths
     * (poll and block) get exercised. */
    if (e->completed < e->recorded && (++f->queries % 2) == 0)
        run_stream(e->stream, e, e->recorded);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&f->mu);
    return done;
}

static int fb_event_wait(cc_backend *b, void *ev, ckpt_err *err)
{
    fake_be *f = F(b);
    fake_event *e = ev;
    pthread_mutex_lock(&f->mu);
    long n = ++f->waits;
    if (e->completed < e->recorded)
        run_stream(e->stream, e, e->recorded);
    pthread_mutex_unlock(&f->mu);
    if (f->cfg->fail_wait_at && n == f->cfg->fail_wait_at)
        return fail(err, -EIO,
                    "copy failed (cudaEventSynchronize): unspecified launch failure (fake)");
    return 0;
}

static int fb_sync(cc_backend *b, ckpt_err *err)
{
    fake_be *f = F(b);
    pthread_mutex_lock(&f->mu);
    f->cfg->syncs++;
    for (fake_stream *s = f->streams; s; s = s->next_live)
        run_stream(s, NULL, 0);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static void fb_describe(cc_backend *b, char *buf, size_t len)
{
    snprintf(buf, len, "device %d (fake)", F(b)->dev);
}

static int fb_device(cc_backend *b)
{
    return F(b)->dev;
}

long fake_pending(cc_backend *b)
{
    fake_be *f = F(b);
    long n = 0;
    pthread_mutex_lock(&f->mu);
    for (fake_stream *s = f->streams; s; s = s->next_live)
        for (fake_op *o = s->head; o; o = o->next)
            n += !o->ev;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void fb_destroy(cc_backend *b)
{
    fake_be *f = F(b);
    f->cfg->pending_at_destroy += fake_pending(b);
    f->cfg->destroys++;
    pthread_mutex_destroy(&f->mu);
    free(f->allocs);
    free(f);
}

static const cc_backend_ops fake_ops = {
    .bind_thread = fb_bind,
    .unbind_thread = fb_unbind,
    .dev_alloc = fb_dev_alloc,
    .dev_free = fb_dev_free,
    .host_alloc = fb_host_alloc,
    .host_free = fb_host_free,
    .stream_new = fb_stream_new,
    .stream_free = fb_stream_free,
    .event_new = fb_event_new,
    .event_free = fb_event_free,
    .copy_async = fb_copy_async,
    .event_record = fb_event_record,
    .event_query = fb_event_query,
    .event_wait = fb_event_wait,
    .sync = fb_sync,
    .describe = fb_describe,
    .device = fb_device,
    .destroy = fb_destroy,
};

int fake_open(void *ud, int device, cc_backend **out, ckpt_err *err)
{
    fake_cfg *c = ud;
    *out = NULL;
    if (c->no_driver)
        return fail(err, -ENODEV,
                    "no CUDA device (cudaGetDeviceCount: CUDA driver version is insufficient "
                    "for CUDA runtime version)");
    int ndev = c->ndev ? c->ndev : 1;
    if (device < 0 || device >= ndev) {
        char msg[100];
        snprintf(msg, sizeof msg, "device %d does not exist (%d device%s)", device, ndev,
                 ndev == 1 ? "" : "s");
        return fail(err, -ENODEV, msg);
    }
    fake_be *f = calloc(1, sizeof *f);
    if (!f)
        return fail(err, -ENOMEM, "fake: calloc failed");
    f->base.ops = &fake_ops;
    f->cfg = c;
    f->dev = device;
    pthread_mutex_init(&f->mu, NULL);
    c->opens++;
    *out = &f->base;
    return 0;
}
