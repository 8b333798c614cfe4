/* The load pipeline: plan the device block, then let worker threads move it
 * window by window. Each worker takes the next window, waits for a free
 * pinned slot, fills it from the source (reading or decoding straight into
 * pinned memory, zeroing alignment padding), and queues one host-to-device
 * copy for the whole window. Copies run while the next windows fill; the
 * ring recycles a slot once its copy is done. */
#include "load.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "util.h"

void cc_load_opts_resolve(const ckpt_cuda_load_opts *in, ckpt_cuda_load_opts *out)
{
    static const ckpt_cuda_load_opts zero;
    *out = in ? *in : zero;
    if (out->alignment == 0)
        out->alignment = CKPT_CUDA_DEFAULT_ALIGN;
    if (out->pinned_bytes == 0)
        out->pinned_bytes = CKPT_CUDA_DEFAULT_PINNED;
    if (out->streams == 0)
        out->streams = CKPT_CUDA_DEFAULT_STREAMS;
    if (out->threads == 0) {
        out->threads = cc_cpu_count();
        if (out->threads > 32)
            out->threads = 32;
    }
}

typedef struct load_job {
    cc_backend *be;
    cc_source *src;
    cc_ring *ring;
    const cc_layout *layout;
    const size_t *src_index; /* layout item -> source tensor */
    uint8_t *block;
    uint64_t nwin;
    size_t win_bytes;
    atomic_uint_fast64_t next;
} load_job;

/* Fills slot s with window w: the pieces from the source, zeros between. */
static int fill_window(load_job *j, void *rd, uint64_t w, cc_slot *s, size_t *len, ckpt_err *err)
{
    uint64_t start = w * j->win_bytes, end = start + j->win_bytes;
    if (end > j->layout->total)
        end = j->layout->total;
    uint64_t done = 0;
    cc_piece_iter it;
    cc_piece p;
    cc_pieces_begin(&it, j->layout, start, end);
    while (cc_pieces_next(&it, &p)) {
        /* Padding is zeroed so the block's bytes never depend on what the
         * slot held before. */
        if (p.win_off > done)
            memset(s->buf + done, 0, (size_t)(p.win_off - done));
        int rc = j->src->read(j->src, rd, j->src_index[p.item], p.item_off, s->buf + p.win_off,
                              (size_t)p.len, err);
        if (rc < 0)
            return rc;
        done = p.win_off + p.len;
    }
    if (end - start > done)
        memset(s->buf + done, 0, (size_t)(end - start - done));
    *len = (size_t)(end - start);
    return 0;
}

static void run_worker(load_job *j, int bind)
{
    ckpt_err e = {0};
    void *rd = NULL;
    int bound = 0;
    if (bind) {
        if (j->be->ops->bind_thread(j->be, &e) < 0) {
            cc_ring_fail(j->ring, &e);
            return;
        }
        bound = 1;
    }
    if (j->src->reader_new(j->src, &rd, &e) < 0) {
        cc_ring_fail(j->ring, &e);
        goto out;
    }
    for (;;) {
        uint64_t w = atomic_fetch_add(&j->next, 1);
        if (w >= j->nwin)
            break;
        cc_slot *s;
        if (cc_ring_acquire(j->ring, &s, &e) < 0)
            break;
        size_t len;
        if (fill_window(j, rd, w, s, &len, &e) < 0 ||
            cc_ring_copy(j->ring, s, j->block + w * j->win_bytes, s->buf, len, CC_H2D, &e) < 0 ||
            cc_ring_commit(j->ring, s, CC_RECYCLE, &e) < 0) {
            cc_ring_fail(j->ring, &e);
            cc_ring_release(j->ring, s);
            break;
        }
    }
out:
    if (rd)
        j->src->reader_free(j->src, rd);
    /* Only a bind that worked is undone. */
    if (bound)
        j->be->ops->unbind_thread(j->be);
}

static void *worker_main(void *arg)
{
    run_worker(arg, 1);
    return NULL;
}

/* Runs the pipeline with `threads` workers, the caller's thread being one. */
static int move_block(load_job *j, unsigned threads, ckpt_err *err)
{
    pthread_t *tid = calloc(threads, sizeof *tid);
    if (!tid)
        return cc_fail(err, -ENOMEM, "out of memory");
    unsigned started = 0;
    for (unsigned i = 1; i < threads; i++) {
        if (pthread_create(&tid[i], NULL, worker_main, j) != 0)
            break; /* fewer workers is slower, not wrong */
        started++;
    }
    run_worker(j, 0);
    for (unsigned i = 1; i <= started; i++)
        pthread_join(tid[i], NULL);
    free(tid);
    return cc_ring_drain(j->ring, err);
}

/* Copies the selected tensors' descriptions into the result. */
static int describe(ckpt_cuda_ckpt *c, const cc_source *s, const size_t *idx, ckpt_err *err)
{
    size_t chars = 0, dims = 0;
    for (size_t i = 0; i < c->n; i++) {
        const cc_tensor *t = &s->tensors[idx[i]];
        chars += strlen(t->name) + strlen(t->dtype) + 2;
        dims += t->ndim;
    }
    c->strings = malloc(chars ? chars : 1);
    c->shapes = calloc(dims ? dims : 1, sizeof *c->shapes);
    if (!c->strings || !c->shapes)
        return cc_fail(err, -ENOMEM, "out of memory");
    char *sp = c->strings;
    uint64_t *dp = c->shapes;
    for (size_t i = 0; i < c->n; i++) {
        const cc_tensor *t = &s->tensors[idx[i]];
        ckpt_cuda_tensor *d = &c->t[i];
        size_t k = strlen(t->name) + 1;
        memcpy(sp, t->name, k);
        d->name = sp;
        sp += k;
        k = strlen(t->dtype) + 1;
        memcpy(sp, t->dtype, k);
        d->dtype = sp;
        sp += k;
        if (t->ndim) /* a scalar's shape may be NULL */
            memcpy(dp, t->shape, t->ndim * sizeof *dp);
        d->shape = dp;
        d->ndim = t->ndim;
        dp += t->ndim;
        d->nbytes = t->nbytes;
        memcpy(d->sha256, t->sha256, 32);
        d->has_sha256 = t->has_sha256;
    }
    return 0;
}

void ckpt_cuda_free(ckpt_cuda_ckpt *c)
{
    if (!c)
        return;
    if (c->alloc)
        c->be->ops->dev_free(c->be, c->alloc);
    if (c->own_be)
        c->be->ops->destroy(c->be);
    free(c->t);
    free(c->off);
    free(c->len);
    free(c->strings);
    free(c->shapes);
    free(c);
}

/* Selection, descriptions and layout: everything before the device. */
static int select_tensors(const cc_source *s, const ckpt_cuda_load_opts *o, size_t **idx, size_t *n,
                          ckpt_err *err)
{
    const char **names = malloc((s->n ? s->n : 1) * sizeof *names);
    if (!names)
        return cc_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++)
        names[i] = s->tensors[i].name;
    int rc = cc_select(names, s->n, o->select, o->n_select, idx, n, err);
    free(names);
    return rc;
}

static int plan(ckpt_cuda_ckpt *c, cc_source *s, const ckpt_cuda_load_opts *o, size_t **idx,
                ckpt_err *err)
{
    int rc = select_tensors(s, o, idx, &c->n, err);
    if (rc < 0)
        return rc;
    size_t n = c->n ? c->n : 1;
    c->t = calloc(n, sizeof *c->t);
    c->off = calloc(n, sizeof *c->off);
    c->len = calloc(n, sizeof *c->len);
    if (!c->t || !c->off || !c->len)
        return cc_fail(err, -ENOMEM, "out of memory");
    if ((rc = describe(c, s, *idx, err)) < 0)
        return rc;
    for (size_t i = 0; i < c->n; i++)
        c->len[i] = c->t[i].nbytes;
    if ((rc = cc_plan_offsets(c->len, c->n, o->alignment, c->off, &c->layout.total, err)) < 0)
        return rc;
    if (c->layout.total > SIZE_MAX)
        return cc_fail(err, -EOVERFLOW, "checkpoint too large for this host");
    c->layout.n = c->n;
    c->layout.off = c->off;
    c->layout.len = c->len;
    return 0;
}

/* Big slots only cost pinning time (paid on every load) once copies are
 * large enough to run at full speed; but a chunk that straddles two windows
 * is decoded twice, so slots stay at least 16 chunks long. */
static size_t load_max_slot(const cc_source *s)
{
    size_t cap = (size_t)8 << 20, chunks = (size_t)s->granule * 16;
    return chunks > cap ? chunks : cap;
}

int cc_load_from(cc_backend *be, cc_source *s, const ckpt_cuda_load_opts *opts, double t0,
                 ckpt_cuda_ckpt **out, ckpt_err *err)
{
    *out = NULL;
    ckpt_cuda_load_opts o;
    cc_load_opts_resolve(opts, &o);
    ckpt_cuda_ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return cc_fail(err, -ENOMEM, "out of memory");
    c->be = be;
    c->pinned_bytes = o.pinned_bytes;
    c->streams = o.streams;
    size_t *idx = NULL;
    cc_ring *ring = NULL;
    double t_alloc = cc_now();
    int rc = plan(c, s, &o, &idx, err);
    if (rc < 0)
        goto fail;
    uint64_t total = c->layout.total;
    if (total > 0) {
        /* Offsets are multiples of the alignment, but cudaMalloc aligns the
         * block to 256 bytes only: for more, over-allocate and round the
         * start up, so the tensors' addresses are aligned too. */
        uint64_t slack = o.alignment > CC_DEV_ALIGN ? o.alignment - CC_DEV_ALIGN : 0;
        if (slack > SIZE_MAX - total) {
            rc = cc_fail(err, -EOVERFLOW, "checkpoint too large for this host");
            goto fail;
        }
        if ((rc = be->ops->dev_alloc(be, (size_t)(total + slack), &c->alloc, err)) < 0)
            goto fail;
        uintptr_t a = (uintptr_t)c->alloc, m = (uintptr_t)o.alignment - 1;
        c->block = (uint8_t *)c->alloc + (((a + m) & ~m) - a);
    }
    c->stats.alloc_seconds = cc_now() - t_alloc;
    for (size_t i = 0; i < c->n; i++)
        c->t[i].dev = c->block ? (uint8_t *)c->block + c->off[i] : NULL;
    for (size_t i = 0; i < c->n; i++) {
        c->t[i].offset = c->off[i];
        c->stats.tensor_bytes += c->t[i].nbytes;
    }
    c->stats.device_bytes = total;
    c->stats.streams = o.streams;
    if (total > 0) {
        unsigned slots;
        size_t slot_bytes;
        double t_pin = cc_now();
        if ((rc = cc_plan_ring(total, o.pinned_bytes, o.threads, o.streams, load_max_slot(s),
                               &slots, &slot_bytes, err)) < 0 ||
            (rc = cc_ring_new(be, slots, slot_bytes, o.streams, &ring, err)) < 0)
            goto fail;
        c->stats.pin_seconds = cc_now() - t_pin;
        load_job j = {
            .be = be,
            .src = s,
            .ring = ring,
            .layout = &c->layout,
            .src_index = idx,
            .block = c->block,
            .win_bytes = slot_bytes,
            .nwin = cc_window_count(total, slot_bytes),
        };
        atomic_init(&j.next, 0);
        unsigned threads = o.threads;
        if (threads > j.nwin)
            threads = (unsigned)j.nwin;
        c->stats.slots = slots;
        c->stats.threads = threads;
        c->stats.pinned_bytes = (uint64_t)slots * slot_bytes;
        double t1 = cc_now();
        c->stats.setup_seconds = t1 - t0;
        if ((rc = move_block(&j, threads, err)) < 0)
            goto fail;
        c->stats.copy_seconds = cc_now() - t1;
    } else {
        c->stats.setup_seconds = cc_now() - t0;
    }
    cc_ring_free(ring);
    free(idx);
    c->stats.total_seconds = cc_now() - t0;
    *out = c;
    return 0;
fail:
    cc_ring_free(ring);
    free(idx);
    ckpt_cuda_free(c);
    return rc;
}

int cc_load(cc_backend_open_fn open_be, void *ud, const char *src, const ckpt_cuda_load_opts *opts,
            ckpt_cuda_ckpt **out, ckpt_err *err)
{
    double t0 = cc_now();
    *out = NULL;
    cc_source *s = NULL;
    int rc = cc_source_open(src, opts ? opts->key : NULL, &s, err);
    if (rc < 0)
        return rc;
    /* A pattern that matches nothing is a typo: say so before any device
     * is involved, so it reads the same on a machine without one. */
    if (opts && opts->n_select) {
        size_t *idx = NULL, n = 0;
        rc = select_tensors(s, opts, &idx, &n, err);
        free(idx);
        if (rc < 0) {
            cc_source_close(s);
            return rc;
        }
    }
    double t_open = cc_now() - t0;
    cc_backend *be = NULL;
    if ((rc = open_be(ud, opts ? opts->device : 0, &be, err)) < 0) {
        cc_source_close(s);
        return rc;
    }
    if ((rc = be->ops->bind_thread(be, err)) < 0) {
        be->ops->destroy(be);
        cc_source_close(s);
        return rc;
    }
    double t_device = cc_now() - t0 - t_open;
    rc = cc_load_from(be, s, opts, t0, out, err);
    be->ops->unbind_thread(be);
    cc_source_close(s);
    if (rc < 0) {
        be->ops->destroy(be);
        return rc;
    }
    (*out)->own_be = 1;
    (*out)->stats.open_seconds = t_open;
    (*out)->stats.device_seconds = t_device;
    return 0;
}

size_t ckpt_cuda_count(const ckpt_cuda_ckpt *c)
{
    return c->n;
}

const ckpt_cuda_tensor *ckpt_cuda_tensor_at(const ckpt_cuda_ckpt *c, size_t i)
{
    return i < c->n ? &c->t[i] : NULL;
}

const ckpt_cuda_tensor *ckpt_cuda_find(const ckpt_cuda_ckpt *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0)
            return &c->t[i];
    return NULL;
}

void *ckpt_cuda_block(const ckpt_cuda_ckpt *c, uint64_t *bytes)
{
    if (bytes)
        *bytes = c->layout.total;
    return c->block;
}

int ckpt_cuda_device(const ckpt_cuda_ckpt *c)
{
    return c->be->ops->device(c->be);
}

const ckpt_cuda_stats *ckpt_cuda_load_stats(const ckpt_cuda_ckpt *c)
{
    return &c->stats;
}
