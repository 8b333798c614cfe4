/* In-order delivery of consecutive chunks, decoded ahead by worker threads:
 * the basis of cat, unpack and verify. A file's chunks have consecutive
 * global ids, so every stream is a range of ids. */
#include "pack.h"
#include "format.h"
#include "sha256.h"

#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>

typedef int (*chunk_cb)(void *ud, size_t id, const uint8_t *data, const ckpt_err *cerr);

typedef struct slot {
    uint8_t *buf;
    size_t id;
    int done;
    int rc;
    ckpt_err err;
} slot;

typedef struct stream {
    ckpt_pack *p;
    pthread_mutex_t mu;
    pthread_cond_t work, ready;
    size_t next_assign, next_consume, end, window;
    slot *slots;
    int stop;
} stream;

static void *stream_worker(void *arg)
{
    stream *s = arg;
    pthread_setname_np(pthread_self(), "ckpt-decode");
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->next_assign < s->end && s->next_assign - s->next_consume >= s->window)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->stop || s->next_assign >= s->end)
            break;
        size_t id = s->next_assign++;
        slot *sl = &s->slots[id % s->window];
        pthread_mutex_unlock(&s->mu);
        ckpt_err e = {0, ""};
        int rc = pack_chunk_decode(s->p, id, sl->buf, &e);
        pthread_mutex_lock(&s->mu);
        sl->id = id;
        sl->rc = rc;
        sl->err = e;
        sl->done = 1;
        pthread_cond_broadcast(&s->ready);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int stream_inline(ckpt_pack *p, size_t first, size_t end, chunk_cb cb, void *ud,
                         ckpt_err *err)
{
    uint8_t *buf = malloc(p->chunk_size);
    if (!buf)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    int rc = 0;
    for (size_t id = first; id < end && rc == 0; id++) {
        ckpt_err e = {0, ""};
        int drc = pack_chunk_decode(p, id, buf, &e);
        rc = cb(ud, id, drc < 0 ? NULL : buf, drc < 0 ? &e : NULL);
    }
    free(buf);
    return rc;
}

int pack_stream_chunks(ckpt_pack *p, size_t first, size_t end, unsigned threads, chunk_cb cb,
                       void *ud, ckpt_err *err)
{
    if (threads == 0)
        threads = ckpt_default_threads();
    if (end - first < 2 || threads == 1)
        return stream_inline(p, first, end, cb, ud, err);
    if (threads > end - first)
        threads = (unsigned)(end - first);
    stream s;
    memset(&s, 0, sizeof s);
    s.p = p;
    s.next_assign = s.next_consume = first;
    s.end = end;
    /* Two chunks in flight per worker, but never more than 256 MiB of them. */
    size_t cap = (256u << 20) / p->chunk_size;
    s.window = 2 * (size_t)threads + 2 < cap ? 2 * (size_t)threads + 2 : cap;
    if (threads > s.window - 1)
        threads = (unsigned)(s.window - 1);
    s.slots = calloc(s.window, sizeof *s.slots);
    pthread_t *tids = calloc(threads, sizeof *tids);
    int rc = 0;
    if (!s.slots || !tids)
        rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    for (size_t i = 0; rc == 0 && i < s.window; i++)
        if (!(s.slots[i].buf = malloc(p->chunk_size)))
            rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    if (rc < 0)
        goto out;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_cond_init(&s.ready, NULL);
    unsigned started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, stream_worker, &s) != 0)
            break;
    if (started == 0) {
        rc = stream_inline(p, first, end, cb, ud, err);
    } else {
        for (size_t id = first; id < end && rc == 0; id++) {
            slot *sl = &s.slots[id % s.window];
            pthread_mutex_lock(&s.mu);
            while (!(sl->done && sl->id == id))
                pthread_cond_wait(&s.ready, &s.mu);
            pthread_mutex_unlock(&s.mu);
            rc = cb(ud, id, sl->rc < 0 ? NULL : sl->buf, sl->rc < 0 ? &sl->err : NULL);
            pthread_mutex_lock(&s.mu);
            sl->done = 0;
            s.next_consume++;
            pthread_cond_broadcast(&s.work);
            pthread_mutex_unlock(&s.mu);
        }
    }
    pthread_mutex_lock(&s.mu);
    s.stop = 1;
    pthread_cond_broadcast(&s.work);
    pthread_mutex_unlock(&s.mu);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.work);
    pthread_cond_destroy(&s.ready);
out:
    if (s.slots)
        for (size_t i = 0; i < s.window; i++)
            free(s.slots[i].buf);
    free(s.slots);
    free(tids);
    return rc;
}

typedef struct range_ctx {
    ckpt_pack *p;
    uint64_t off, end;
    ckpt_sink_fn sink;
    void *ud;
} range_ctx;

static uint64_t chunk_file_offset(const ckpt_pack *p, size_t id)
{
    const extent *e = &p->extents[p->chunks[id].extent_index];
    return e->file_offset + (id - e->first_chunk) * (uint64_t)p->chunk_size;
}

static int range_cb(void *ud, size_t id, const uint8_t *data, const ckpt_err *cerr)
{
    range_ctx *c = ud;
    uint64_t start = chunk_file_offset(c->p, id), stop = start + c->p->chunks[id].raw_size;
    uint64_t a = start > c->off ? start : c->off, b = stop < c->end ? stop : c->end;
    return c->sink(c->ud, a, data ? data + (a - start) : NULL, (size_t)(b - a), cerr);
}

int ckpt_file_stream(ckpt_pack *p, size_t file_index, uint64_t off, uint64_t len, unsigned threads,
                     ckpt_sink_fn sink, void *ud, ckpt_err *err)
{
    if (file_index >= p->n_files)
        return ckpt_fail(err, -ENOENT, "%s: no file %zu", p->path, file_index);
    uint64_t size = p->files[file_index].info.size;
    if (off >= size || len == 0)
        return 0;
    if (len > size - off)
        len = size - off;
    ckpt_chunk_ref a, b;
    int rc = ckpt_chunk_locate(p, file_index, off, &a, err);
    if (rc == 0)
        rc = ckpt_chunk_locate(p, file_index, off + len - 1, &b, err);
    if (rc < 0)
        return rc;
    range_ctx c = {p, off, off + len, sink, ud};
    return pack_stream_chunks(p, a.id, b.id + 1, threads, range_cb, &c, err);
}

/* ------------------------------------------------------------------ verify */

typedef struct verify_ctx {
    ckpt_pack *p;
    ckpt_sha256 *fh, *th;
    uint8_t *file_bad, *tensor_bad;
    ckpt_fault_fn fault;
    void *fault_ud;
    ckpt_progress_fn progress;
    void *progress_ud;
    uint64_t done;
    long faults;
} verify_ctx;

static int verify_cb(void *ud, size_t id, const uint8_t *data, const ckpt_err *cerr)
{
    verify_ctx *v = ud;
    const chunk *c = &v->p->chunks[id];
    const extent *e = &v->p->extents[c->extent_index];
    if (!data) {
        v->faults++;
        v->file_bad[e->file_index] = 1;
        if (v->fault)
            v->fault(v->fault_ud, "chunk", v->p->files[e->file_index].info.path,
                     chunk_file_offset(v->p, id), cerr->msg);
    } else {
        ckpt_sha256_update(&v->fh[e->file_index], data, c->raw_size);
    }
    /* Every tensor that overlaps the chunk takes its part of it; chunks
     * arrive in order, so each tensor's bytes are hashed in order. Tensors
     * are sorted by start, so the scan stops at the first one past it. */
    uint64_t a = (id - e->first_chunk) * (uint64_t)v->p->chunk_size, b = a + c->raw_size;
    for (size_t i = 0; i < e->n_tensors; i++) {
        size_t ti = v->p->ext_tensors[e->first_tensor + i];
        const tensor_rec *t = &v->p->tensors[ti];
        uint64_t ts = t->extent_offset, te = ts + t->info.nbytes;
        if (ts >= b)
            break;
        if (te <= a)
            continue;
        uint64_t lo = ts > a ? ts : a, hi = te < b ? te : b;
        if (!data)
            v->tensor_bad[ti] = 1;
        else
            ckpt_sha256_update(&v->th[ti], data + (lo - a), (size_t)(hi - lo));
    }
    v->done += c->raw_size;
    if (v->progress)
        v->progress(v->progress_ud, v->done, v->p->logical_bytes);
    return 0;
}

static void verify_digest(verify_ctx *v, const char *kind, const char *name, ckpt_sha256 *st,
                          const uint8_t want[32], int bad)
{
    uint8_t got[32];
    ckpt_sha256_final(st, got);
    char msg[600];
    if (bad) {
        snprintf(msg, sizeof msg, "%s: %s '%s' is unreadable (corrupt chunks)", v->p->path, kind,
                 name);
    } else if (memcmp(got, want, 32) != 0) {
        snprintf(msg, sizeof msg, "%s: %s '%s': sha256 mismatch", v->p->path, kind, name);
    } else {
        return;
    }
    v->faults++;
    if (v->fault)
        v->fault(v->fault_ud, kind, name, 0, msg);
}

long ckpt_verify(ckpt_pack *p, unsigned threads, ckpt_fault_fn fault, void *fault_ud,
                 ckpt_progress_fn progress, void *progress_ud, ckpt_err *err)
{
    verify_ctx v;
    memset(&v, 0, sizeof v);
    v.p = p;
    v.fault = fault;
    v.fault_ud = fault_ud;
    v.progress = progress;
    v.progress_ud = progress_ud;
    v.fh = calloc(p->n_files + 1, sizeof *v.fh);
    v.th = calloc(p->n_tensors + 1, sizeof *v.th);
    v.file_bad = calloc(p->n_files + 1, 1);
    v.tensor_bad = calloc(p->n_tensors + 1, 1);
    long rc = 0;
    if (!v.fh || !v.th || !v.file_bad || !v.tensor_bad) {
        rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
        goto out;
    }
    for (size_t i = 0; i < p->n_files; i++)
        ckpt_sha256_init(&v.fh[i]);
    for (size_t i = 0; i < p->n_tensors; i++)
        ckpt_sha256_init(&v.th[i]);
    rc = pack_stream_chunks(p, 0, p->n_chunks, threads, verify_cb, &v, err);
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < p->n_files; i++)
        verify_digest(&v, "file", p->files[i].info.path, &v.fh[i], p->files[i].info.sha256,
                      v.file_bad[i]);
    for (size_t i = 0; i < p->n_tensors; i++)
        verify_digest(&v, "tensor", p->tensors[i].info.name, &v.th[i], p->tensors[i].info.sha256,
                      v.tensor_bad[i]);
    rc = v.faults;
out:
    free(v.fh);
    free(v.th);
    free(v.file_bad);
    free(v.tensor_bad);
    return rc;
}
