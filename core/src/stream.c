/* Chunks decoded by worker threads: in order, decoded ahead (cat, the
 * mount's readers), or in no order, each handed on by the worker that
 * decoded it (unpack). A file's chunks have consecutive
 * global ids, so every stream is a range of ids. */
#include "pack.h"
#include "format.h"

#include <pthread.h>
#include <stdatomic.h>
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
        ckpt_err e = {0};
        int rc = pack_chunk_decode(s->p, id, sl->buf, &e);
        pthread_mutex_lock(&s->mu);
        sl->id = id;
        sl->rc = rc;
        sl->err = e;
        sl->done = 1;
        /* The consumer waits for one id: wake it for that one only. */
        if (id == s->next_consume)
            pthread_cond_signal(&s->ready);
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
        ckpt_err e = {0};
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
            /* One slot came free, so one worker can go on: a broadcast woke
             * every idle worker per chunk to find the window full again. */
            pthread_cond_signal(&s.work);
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

void pack_file_chunk_range(const ckpt_pack *p, size_t f, size_t *first, size_t *end)
{
    const file_rec *fr = &p->files[f];
    *first = *end = 0;
    for (size_t j = 0; j < fr->n_extents; j++) {
        const extent *e = &p->extents[fr->first_extent + j];
        size_t n = (size_t)(e->length / p->chunk_size + (e->length % p->chunk_size != 0));
        if (j == 0)
            *first = e->first_chunk;
        *end = e->first_chunk + n;
    }
}

/* ------------------------------------------------------------ unordered */

/* Each worker takes the next chunk id, decodes it where the dest callback
 * says (or into its own buffer) and hands it to the sink itself: no consumer
 * thread, no reordering, so the per-byte work after decoding (unpack's
 * writes) spreads over the workers too. */
typedef struct par {
    ckpt_pack *p;
    ckpt_file_dest_fn dest;
    ckpt_file_sink_fn sink;
    void *ud;
    atomic_size_t next;
    size_t end;
    atomic_int stop; /* the first sink's non-zero return */
} par;

static void par_stop(par *s, int rc)
{
    int zero = 0;
    atomic_compare_exchange_strong(&s->stop, &zero, rc);
}

/* The worker's own buffer is allocated when a chunk first needs it: with a
 * dest that always answers, never (each would be an mmap and munmap, which
 * wait for the other workers' populating of their dest). */
static void par_run(par *s)
{
    uint8_t *buf = NULL;
    while (!atomic_load(&s->stop)) {
        size_t id = atomic_fetch_add(&s->next, 1);
        if (id >= s->end)
            break;
        const extent *x = &s->p->extents[s->p->chunks[id].extent_index];
        uint64_t off = chunk_file_offset(s->p, id);
        size_t len = s->p->chunks[id].raw_size;
        uint8_t *out = s->dest ? s->dest(s->ud, x->file_index, off, len) : NULL;
        if (!out && !buf && !(buf = malloc(s->p->chunk_size))) {
            par_stop(s, -ENOMEM);
            break;
        }
        out = out ? out : buf;
        ckpt_err e = {0};
        int drc = pack_chunk_decode(s->p, id, out, &e);
        int rc = s->sink(s->ud, x->file_index, off, drc < 0 ? NULL : out, len, drc < 0 ? &e : NULL);
        if (rc) {
            par_stop(s, rc);
            break;
        }
    }
    free(buf);
}

static void *par_worker(void *arg)
{
    pthread_setname_np(pthread_self(), "ckpt-decode");
    par_run(arg);
    return NULL;
}

int ckpt_files_decode(ckpt_pack *p, size_t first_file, size_t end_file, unsigned threads,
                      ckpt_file_dest_fn dest, ckpt_file_sink_fn sink, void *ud, ckpt_err *err)
{
    if (end_file > p->n_files || first_file > end_file)
        return ckpt_fail(err, -EINVAL, "%s: no files [%zu, %zu)", p->path, first_file, end_file);
    size_t first = 0, end = 0, a, b;
    /* Files' chunks are consecutive: the range runs from the first chunk of
     * the first file that has any to the end of the last such file. */
    for (size_t f = first_file; f < end_file; f++) {
        pack_file_chunk_range(p, f, &a, &b);
        if (a == b)
            continue;
        if (first == end)
            first = a;
        end = b;
    }
    if (first == end)
        return 0;
    if (threads == 0)
        threads = ckpt_default_threads();
    if (threads > end - first)
        threads = (unsigned)(end - first);
    par s = {.p = p, .dest = dest, .sink = sink, .ud = ud, .end = end};
    atomic_init(&s.next, first);
    atomic_init(&s.stop, 0);
    pthread_t *tids = calloc(threads, sizeof *tids);
    if (!tids)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    unsigned started = 0;
    for (; threads > 1 && started < threads; started++)
        if (pthread_create(&tids[started], NULL, par_worker, &s) != 0)
            break;
    if (started == 0)
        par_worker(&s); /* one thread, or none to spare: here */
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    int rc = atomic_load(&s.stop);
    if (rc == -ENOMEM)
        return ckpt_fail(err, rc, "%s: out of memory", p->path);
    return rc;
}
