#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "load.h"
#include "util.h"

/* At least this much goes over the link, so a small checkpoint still gets a
 * bandwidth rather than a latency. */
#define LINK_MIN_BYTES ((uint64_t)1 << 30)

static int copy_sync(cc_backend *be, void *stream, void *ev, void *dst, const void *src, size_t len,
                     ckpt_err *err)
{
    int rc = be->ops->copy_async(be, dst, src, len, CC_H2D, stream, err);
    if (rc == 0)
        rc = be->ops->event_record(be, ev, stream, err);
    if (rc == 0)
        rc = be->ops->event_wait(be, ev, err);
    return rc;
}

static int bench_link(cc_backend *be, void *stream, void *ev, size_t chunk, cc_bench_result *r,
                      ckpt_err *err)
{
    void *host = NULL, *dev = NULL;
    int rc = be->ops->host_alloc(be, chunk, &host, err);
    if (rc == 0)
        rc = be->ops->dev_alloc(be, chunk, &dev, err);
    /* One copy untimed: the first pays for mapping and clocks ramping up. */
    if (rc == 0)
        rc = copy_sync(be, stream, ev, dev, host, chunk, err);
    uint64_t want = r->bytes > LINK_MIN_BYTES ? r->bytes : LINK_MIN_BYTES, moved = 0;
    double t0 = cc_now();
    while (rc == 0 && moved < want) {
        rc = copy_sync(be, stream, ev, dev, host, chunk, err);
        moved += chunk;
    }
    r->link_s = cc_now() - t0;
    r->link_bytes = moved;
    if (dev)
        be->ops->dev_free(be, dev);
    if (host)
        be->ops->host_free(be, host);
    return rc;
}

/* Reads every tensor into buf, one after another; per-tensor offsets in off. */
static int read_all(cc_source *s, uint8_t *buf, const uint64_t *off, ckpt_err *err)
{
    void *rd = NULL;
    int rc = s->reader_new(s, &rd, err);
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (s->tensors[i].nbytes)
            rc = s->read(s, rd, i, 0, buf + off[i], (size_t)s->tensors[i].nbytes, err);
    if (rd)
        s->reader_free(s, rd);
    return rc;
}

static int fits_in_ram(uint64_t bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psize <= 0)
        return 1;
    return bytes / 4 * 5 < (uint64_t)pages * (uint64_t)psize;
}

static int bench_naive(cc_backend *be, cc_source *s, void *stream, void *ev, cc_bench_result *r,
                       ckpt_err *err)
{
    uint64_t *off = calloc(s->n ? s->n : 1, sizeof *off), pos = 0;
    if (!off)
        return cc_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        off[i] = pos;
        pos += s->tensors[i].nbytes;
    }
    uint8_t *buf = NULL;
    void *dev = NULL;
    int rc = 0;
    if (!fits_in_ram(pos) || !(buf = malloc(pos ? pos : 1))) {
        r->naive_skipped = 1;
        goto out;
    }
    /* The untimed pass warms caches for both naive and pipeline. */
    if ((rc = read_all(s, buf, off, err)) < 0)
        goto out;
    double t0 = cc_now();
    if ((rc = read_all(s, buf, off, err)) < 0)
        goto out;
    double t1 = cc_now();
    if (pos && (rc = be->ops->dev_alloc(be, pos, &dev, err)) < 0)
        goto out;
    for (size_t i = 0; rc == 0 && i < s->n; i++)
        if (s->tensors[i].nbytes)
            rc = copy_sync(be, stream, ev, (uint8_t *)dev + off[i], buf + off[i],
                           (size_t)s->tensors[i].nbytes, err);
    r->naive_read_s = t1 - t0;
    r->naive_copy_s = cc_now() - t1;
out:
    if (dev)
        be->ops->dev_free(be, dev);
    free(buf);
    free(off);
    return rc;
}

int cc_bench(cc_backend *be, cc_source *s, const ckpt_cuda_load_opts *opts, cc_bench_result *r,
             ckpt_err *err)
{
    ckpt_cuda_load_opts o;
    cc_load_opts_resolve(opts, &o);
    /* All three move the same bytes: the whole checkpoint. */
    o.select = NULL;
    o.n_select = 0;
    *r = (cc_bench_result){0};
    for (size_t i = 0; i < s->n; i++)
        r->bytes += s->tensors[i].nbytes;
    void *stream = NULL, *ev = NULL;
    int rc = be->ops->stream_new(be, &stream, err);
    if (rc == 0)
        rc = be->ops->event_new(be, &ev, err);
    size_t chunk = o.pinned_bytes < r->bytes ? o.pinned_bytes : (size_t)r->bytes;
    if (chunk < CC_SLOT_QUANTUM)
        chunk = CC_SLOT_QUANTUM;
    if (rc == 0)
        rc = bench_link(be, stream, ev, chunk, r, err);
    if (rc == 0)
        rc = bench_naive(be, s, stream, ev, r, err);
    if (rc == 0) {
        ckpt_cuda_ckpt *c = NULL;
        rc = cc_load_from(be, s, &o, cc_now(), &c, err);
        if (rc == 0) {
            r->pipe = c->stats;
            r->pipe_s = c->stats.total_seconds;
            r->pipe_copy_s = c->stats.copy_seconds;
        }
        ckpt_cuda_free(c);
    }
    if (ev)
        be->ops->event_free(be, ev);
    if (stream)
        be->ops->stream_free(be, stream);
    return rc;
}
