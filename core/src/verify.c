/* ckpt_verify: every chunk decoded, every file and tensor SHA-256 checked,
 * with no per-byte work on a single thread for the whole pack.
 *
 *   decode workers (pool)        lane hash threads (one per lane)
 *   take the next chunk of any   take their lane's chunks in order and
 *   lane with room in its        feed the file's SHA-256: a file's hash
 *   window, decode it, hash its  is one chain, so it is the one serial
 *   part of each tensor          stage, and lanes run several at once
 *
 * A lane verifies one file at a time and then takes the next unstarted one,
 * so a pack of many files hashes min(files, lanes) files at once, while one
 * huge file is bounded by one SHA-256 chain (about 2 GB/s with SHA-NI) and
 * everything else in it scales. A tensor's hash is a chain too, over its
 * chunks in order: the worker that decoded a chunk hashes the chunk's part
 * of each tensor whose previous chunk is hashed; a part that comes before
 * that is parked in its slot, and whoever hashes the previous chunk's part
 * hashes it next (the pack writer does the same, pack_write.c), so no
 * worker sleeps while a big tensor's chain goes by one chunk at a time.
 *
 * Memory: lanes x window chunk buffers, whatever the pack's size. */
#include "pack.h"
#include "format.h"
#include "sha256.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct vslot {
    uint8_t *buf;
    size_t id; /* the chunk it holds, from when a worker takes it */
    int done;  /* decoded: the lane may hash it (under mu) */
    int rc;    /* of the decode, set before done */
    ckpt_err err;
    /* Holders of buf besides the lane: the worker until it is through the
     * chunk's tensors, and a parked part; the slot is taken again once the
     * lane has hashed it and busy is 0 (under mu). */
    unsigned busy;
    size_t parked; /* the tensor whose part waits here for its turn; SIZE_MAX: none */
} vslot;

typedef struct lane {
    struct verify *v;
    size_t file;                        /* the file it verifies; n_files when none */
    size_t next_assign, next_hash, end; /* chunk ids of the file */
    vslot *slots;
    size_t window;
    ckpt_sha256 st;
    pthread_t tid;
    int started;
} lane;

typedef struct verify {
    ckpt_pack *p;
    pthread_mutex_t mu; /* all scheduling state below */
    pthread_cond_t work, ready, tensor_hashed;
    lane *lanes;
    size_t n_lanes, rr; /* rr: the lane the next worker looks at first */
    size_t next_file;
    size_t lanes_done;   /* lanes that found no more files */
    size_t *tensor_next; /* per tensor: the chunk whose part is hashed next */
    ckpt_sha256 *th;
    /* per assembled tensor (by index - n_stored): the part that feeds its
     * hash next, and whether a part came early (then it is read again) */
    size_t *next_part;
    uint8_t *out_of_order;
    uint8_t *file_bad, *tensor_bad, (*file_got)[32];

    pthread_mutex_t report_mu; /* the callbacks are not thread-safe */
    ckpt_fault_fn fault;
    void *fault_ud;
    ckpt_progress_fn progress;
    void *progress_ud;
    uint64_t done;
    long faults;
    ckpt_verify_stats stats; /* under mu */
} verify;

static uint64_t chunk_offset_in_file(const ckpt_pack *p, size_t id)
{
    const extent *e = &p->extents[p->chunks[id].extent_index];
    return e->file_offset + (id - e->first_chunk) * (uint64_t)p->chunk_size;
}

static void report(verify *v, const char *kind, const char *name, uint64_t off, const char *msg)
{
    pthread_mutex_lock(&v->report_mu);
    v->faults++;
    if (v->fault)
        v->fault(v->fault_ud, kind, name, off, msg);
    pthread_mutex_unlock(&v->report_mu);
}

/* Gives the lane its next file with chunks (files without any are done on
 * the spot); 0 when there are no more. Called with mu held. */
static int lane_take_file(lane *l)
{
    verify *v = l->v;
    while (v->next_file < v->p->n_files) {
        size_t f = v->next_file++, first, end;
        pack_file_chunk_range(v->p, f, &first, &end);
        ckpt_sha256_init(&l->st);
        if (first == end) {
            ckpt_sha256_final(&l->st, v->file_got[f]);
            continue;
        }
        l->file = f;
        l->next_assign = l->next_hash = first;
        l->end = end;
        pthread_cond_broadcast(&v->work);
        return 1;
    }
    l->file = v->p->n_files;
    l->next_assign = l->next_hash = l->end = 0;
    v->lanes_done++;
    pthread_cond_broadcast(&v->work);
    return 0;
}

/* The bytes of part ti feed its assembled tensor's hash too when they come
 * in the tensor's order; waiting for that could stall every worker on a
 * file no lane has started, so a part that comes early marks the tensor to
 * be read again after the pass instead. Parts of no bytes never come, so
 * they are passed over. Called with mu held. */
static void assembled_take(verify *v, const tensor_rec *part, size_t ti, const uint8_t *data,
                           uint64_t len, int part_done)
{
    const ckpt_pack *p = v->p;
    size_t a = part->info.part_of, k = a - p->n_stored;
    const tensor_rec *t = &p->tensors[a];
    if (v->out_of_order[k])
        return;
    size_t *next = &v->next_part[k];
    while (*next < t->info.n_parts && p->tensors[t->parts[*next]].info.nbytes == 0)
        ++*next;
    if (*next >= t->info.n_parts || t->parts[*next] != ti) {
        v->out_of_order[k] = 1;
        return;
    }
    if (!data)
        v->tensor_bad[a] = 1;
    else
        ckpt_sha256_update(&v->th[a], data, (size_t)len);
    if (part_done)
        ++*next;
}

/* Hashes assembled tensor a, whose parts came out of order, by reading it
 * again a chunk at a time (after the pass: nothing else runs). */
static void assembled_rehash(verify *v, size_t a)
{
    ckpt_pack *p = v->p;
    uint64_t n = p->tensors[a].info.nbytes;
    uint8_t *buf = malloc(p->chunk_size);
    ckpt_sha256_init(&v->th[a]);
    v->tensor_bad[a] = !buf;
    for (uint64_t off = 0; buf && off < n;) {
        size_t want = n - off < p->chunk_size ? (size_t)(n - off) : p->chunk_size;
        if (ckpt_tensor_pread(p, a, buf, want, off, NULL) != (ssize_t)want) {
            v->tensor_bad[a] = 1;
            break;
        }
        ckpt_sha256_update(&v->th[a], buf, want);
        off += want;
    }
    free(buf);
}

/* Tensor ti's part [lo, hi) of chunk id, in offsets of the chunk. */
static void part_in_chunk(const ckpt_pack *p, size_t id, size_t ti, uint64_t *lo, uint64_t *hi)
{
    const chunk *c = &p->chunks[id];
    const extent *e = &p->extents[c->extent_index];
    const tensor_rec *t = &p->tensors[ti];
    uint64_t a = (id - e->first_chunk) * (uint64_t)p->chunk_size, b = a + c->raw_size;
    uint64_t ts = t->extent_offset, te = ts + t->info.nbytes;
    *lo = (ts > a ? ts : a) - a;
    *hi = (te < b ? te : b) - a;
}

/* Tensor ti's part of slot s's chunk, whose turn it is, then each of its
 * next chunks' parts that were parked meanwhile. Always advanced, failed
 * or not, so that nothing waits on a chunk that will not come.
 * parked: the part was parked in s (it holds one of s's busy). */
static void hash_tensor_chain(verify *v, lane *l, vslot *s, size_t ti, int parked)
{
    const ckpt_pack *p = v->p;
    const tensor_rec *t = &p->tensors[ti];
    for (;;) {
        size_t id = s->id;
        uint64_t lo, hi;
        part_in_chunk(p, id, ti, &lo, &hi);
        const uint8_t *data = s->rc < 0 ? NULL : s->buf + lo;
        if (!data)
            v->tensor_bad[ti] = 1;
        else
            ckpt_sha256_update(&v->th[ti], data, (size_t)(hi - lo));
        const chunk *c = &p->chunks[id];
        uint64_t a = (id - p->extents[c->extent_index].first_chunk) * (uint64_t)p->chunk_size;
        int ends = a + hi == t->extent_offset + t->info.nbytes;
        pthread_mutex_lock(&v->mu);
        if (t->info.part_of != SIZE_MAX)
            assembled_take(v, t, ti, data, hi - lo, ends);
        v->tensor_next[ti] = id + 1;
        pthread_cond_broadcast(&v->tensor_hashed);
        if (parked && --s->busy == 0)
            pthread_cond_broadcast(&v->work);
        /* The tensor's next chunk is the lane's next one: its slot holds
         * it while a part is parked there (busy), so its id is settled. */
        vslot *n = &l->slots[(id + 1) % l->window];
        int found = !ends && n->busy && n->id == id + 1 && n->parked == ti;
        if (found)
            n->parked = SIZE_MAX;
        pthread_mutex_unlock(&v->mu);
        if (!found)
            return;
        s = n;
        parked = 1;
    }
}

/* The chunk's part of each tensor that overlaps it, in each tensor's chunk
 * order. Tensors are sorted by start, so the scan stops at the first one
 * past the chunk. A part whose tensor's previous chunk is not hashed yet is
 * parked for the worker that hashes that one; only a second such part of
 * the same chunk (tensors that overlap) waits its turn, which always comes:
 * the previous chunk was taken earlier from the same lane. */
static void hash_tensor_parts(verify *v, lane *l, vslot *s)
{
    const ckpt_pack *p = v->p;
    size_t id = s->id;
    const chunk *c = &p->chunks[id];
    const extent *e = &p->extents[c->extent_index];
    uint64_t a = (id - e->first_chunk) * (uint64_t)p->chunk_size, b = a + c->raw_size;
    for (size_t i = 0; i < e->n_tensors; i++) {
        size_t ti = p->ext_tensors[e->first_tensor + i];
        const tensor_rec *t = &p->tensors[ti];
        uint64_t ts = t->extent_offset, te = ts + t->info.nbytes;
        if (ts >= b)
            break;
        if (te <= a)
            continue;
        pthread_mutex_lock(&v->mu);
        if (v->tensor_next[ti] != id && s->parked == SIZE_MAX) {
            s->parked = ti;
            s->busy++;
            v->stats.parked++;
            pthread_mutex_unlock(&v->mu);
            continue;
        }
        if (v->tensor_next[ti] != id)
            v->stats.waited++;
        while (v->tensor_next[ti] != id)
            pthread_cond_wait(&v->tensor_hashed, &v->mu);
        pthread_mutex_unlock(&v->mu);
        hash_tensor_chain(v, l, s, ti, 0);
    }
}

/* The next chunk to decode, from the first lane (round-robin) with room in
 * its window; 0 when every lane is out of files. Called with mu held. */
static int take_chunk(verify *v, lane **out, size_t *id)
{
    for (;;) {
        for (size_t k = 0; k < v->n_lanes; k++) {
            lane *l = &v->lanes[(v->rr + k) % v->n_lanes];
            if (l->next_assign < l->end && l->next_assign - l->next_hash < l->window &&
                !l->slots[l->next_assign % l->window].busy) {
                v->rr = (v->rr + k + 1) % v->n_lanes;
                *out = l;
                *id = l->next_assign++;
                return 1;
            }
        }
        if (v->lanes_done == v->n_lanes)
            return 0;
        pthread_cond_wait(&v->work, &v->mu);
    }
}

static void *decode_worker(void *arg)
{
    verify *v = arg;
    pthread_setname_np(pthread_self(), "ckpt-decode");
    pthread_mutex_lock(&v->mu);
    lane *l;
    size_t id;
    while (take_chunk(v, &l, &id)) {
        vslot *s = &l->slots[id % l->window];
        s->id = id;
        s->busy = 1;
        pthread_mutex_unlock(&v->mu);
        memset(&s->err, 0, sizeof s->err);
        s->rc = pack_chunk_decode(v->p, id, s->buf, &s->err);
        /* The file's chain and the tensors' read the buffer side by side. */
        pthread_mutex_lock(&v->mu);
        s->done = 1;
        pthread_cond_broadcast(&v->ready);
        pthread_mutex_unlock(&v->mu);
        hash_tensor_parts(v, l, s);
        pthread_mutex_lock(&v->mu);
        if (--s->busy == 0)
            pthread_cond_broadcast(&v->work);
    }
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

/* One lane: its files' chunks in order into the file's SHA-256. */
static void *lane_hasher(void *arg)
{
    lane *l = arg;
    verify *v = l->v;
    const ckpt_pack *p = v->p;
    pthread_setname_np(pthread_self(), "ckpt-hash");
    pthread_mutex_lock(&v->mu);
    while (lane_take_file(l)) {
        while (l->next_hash < l->end) {
            size_t id = l->next_hash;
            vslot *s = &l->slots[id % l->window];
            while (!(s->done && s->id == id))
                pthread_cond_wait(&v->ready, &v->mu);
            pthread_mutex_unlock(&v->mu);
            const chunk *c = &p->chunks[id];
            if (s->rc < 0) {
                v->file_bad[l->file] = 1;
                report(v, "chunk", p->files[l->file].info.path, chunk_offset_in_file(p, id),
                       s->err.msg);
            } else {
                ckpt_sha256_update(&l->st, s->buf, c->raw_size);
            }
            if (v->progress) {
                pthread_mutex_lock(&v->report_mu);
                v->done += c->raw_size;
                v->progress(v->progress_ud, v->done, p->logical_bytes);
                pthread_mutex_unlock(&v->report_mu);
            }
            pthread_mutex_lock(&v->mu);
            s->done = 0;
            l->next_hash++;
            pthread_cond_broadcast(&v->work);
        }
        ckpt_sha256_final(&l->st, v->file_got[l->file]);
    }
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

static void check_digest(verify *v, const char *kind, const char *name, const uint8_t got[32],
                         const uint8_t want[32], int bad)
{
    char msg[600];
    if (bad)
        snprintf(msg, sizeof msg, "%s: %s '%s' is unreadable (corrupt chunks)", v->p->path, kind,
                 name);
    else if (memcmp(got, want, 32) != 0)
        snprintf(msg, sizeof msg, "%s: %s '%s': sha256 mismatch", v->p->path, kind, name);
    else
        return;
    report(v, kind, name, 0, msg);
}

/* Lanes and workers for `threads` cores: up to one lane per file but no
 * more than the cores (a lane's hash thread is busy all the time), and a
 * window per lane that keeps its share of the workers fed. At most 256 MiB
 * of chunk buffers in all. */
static void plan(const ckpt_pack *p, unsigned threads, size_t *lanes, size_t *window)
{
    size_t l = p->n_files < threads ? p->n_files : threads;
    if (l == 0)
        l = 1;
    size_t per = 2 * ((threads + l - 1) / l) + 2;
    size_t cap = (256u << 20) / p->chunk_size / l;
    if (cap < 2)
        cap = 2;
    *lanes = l;
    *window = per < cap ? per : cap;
}

long ckpt_verify(ckpt_pack *p, unsigned threads, ckpt_fault_fn fault, void *fault_ud,
                 ckpt_progress_fn progress, void *progress_ud, ckpt_err *err)
{
    return ckpt_verify_counted(p, threads, fault, fault_ud, progress, progress_ud, NULL, err);
}

long ckpt_verify_counted(ckpt_pack *p, unsigned threads, ckpt_fault_fn fault, void *fault_ud,
                         ckpt_progress_fn progress, void *progress_ud, ckpt_verify_stats *stats,
                         ckpt_err *err)
{
    if (threads == 0)
        threads = ckpt_default_threads();
    verify v;
    memset(&v, 0, sizeof v);
    v.p = p;
    v.fault = fault;
    v.fault_ud = fault_ud;
    v.progress = progress;
    v.progress_ud = progress_ud;
    size_t window;
    plan(p, threads, &v.n_lanes, &window);
    v.lanes = calloc(v.n_lanes, sizeof *v.lanes);
    v.tensor_next = calloc(p->n_tensors + 1, sizeof *v.tensor_next);
    v.th = calloc(p->n_tensors + 1, sizeof *v.th);
    v.file_bad = calloc(p->n_files + 1, 1);
    v.tensor_bad = calloc(p->n_tensors + 1, 1);
    v.next_part = calloc(p->n_tensors - p->n_stored + 1, sizeof *v.next_part);
    v.out_of_order = calloc(p->n_tensors - p->n_stored + 1, 1);
    v.file_got = calloc(p->n_files + 1, sizeof *v.file_got);
    pthread_t *tids = calloc(threads, sizeof *tids);
    long rc = 0;
    if (!v.lanes || !v.tensor_next || !v.th || !v.file_bad || !v.tensor_bad || !v.next_part ||
        !v.out_of_order || !v.file_got || !tids)
        rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    for (size_t i = 0; rc == 0 && i < v.n_lanes; i++) {
        lane *l = &v.lanes[i];
        l->v = &v;
        l->window = window;
        l->slots = calloc(window, sizeof *l->slots);
        if (!l->slots)
            rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
        for (size_t j = 0; rc == 0 && j < window; j++) {
            l->slots[j].parked = SIZE_MAX;
            if (!(l->slots[j].buf = malloc(p->chunk_size)))
                rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
        }
    }
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < p->n_tensors; i++) {
        const tensor_rec *t = &p->tensors[i];
        /* Assembled tensors have no chunks of their own: SIZE_MAX is never
         * a chunk id, so nothing waits on them. */
        v.tensor_next[i] = t->info.n_parts ? SIZE_MAX
                                           : p->extents[t->extent_index].first_chunk +
                                                 t->extent_offset / p->chunk_size;
        ckpt_sha256_init(&v.th[i]);
    }
    pthread_mutex_init(&v.mu, NULL);
    pthread_mutex_init(&v.report_mu, NULL);
    pthread_cond_init(&v.work, NULL);
    pthread_cond_init(&v.ready, NULL);
    pthread_cond_init(&v.tensor_hashed, NULL);
    /* Lanes first: workers wait for them to take files. A lane that cannot
     * start counts as done, so the others still finish the pack. */
    unsigned started = 0;
    size_t lanes_started = 0;
    for (size_t i = 0; i < v.n_lanes; i++) {
        lane *l = &v.lanes[i];
        l->started = pthread_create(&l->tid, NULL, lane_hasher, l) == 0;
        if (l->started) {
            lanes_started++;
        } else {
            pthread_mutex_lock(&v.mu);
            v.lanes_done++;
            pthread_cond_broadcast(&v.work);
            pthread_mutex_unlock(&v.mu);
        }
    }
    for (; lanes_started && started < threads; started++)
        if (pthread_create(&tids[started], NULL, decode_worker, &v) != 0)
            break;
    if (lanes_started && started == 0)
        decode_worker(&v); /* no thread to spare: decode here */
    for (unsigned i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    for (size_t i = 0; i < v.n_lanes; i++)
        if (v.lanes[i].started)
            pthread_join(v.lanes[i].tid, NULL);
    pthread_mutex_destroy(&v.mu);
    pthread_mutex_destroy(&v.report_mu);
    pthread_cond_destroy(&v.work);
    pthread_cond_destroy(&v.ready);
    pthread_cond_destroy(&v.tensor_hashed);
    if (!lanes_started) {
        rc = ckpt_fail(err, -EAGAIN, "%s: cannot start verify threads", p->path);
        goto out;
    }
    for (size_t a = p->n_stored; a < p->n_tensors; a++)
        if (v.out_of_order[a - p->n_stored])
            assembled_rehash(&v, a);
    /* Digests in index order, after every chunk fault, as before. */
    for (size_t i = 0; i < p->n_files; i++)
        check_digest(&v, "file", p->files[i].info.path, v.file_got[i], p->files[i].info.sha256,
                     v.file_bad[i]);
    for (size_t i = 0; i < p->n_tensors; i++) {
        uint8_t got[32];
        ckpt_sha256_final(&v.th[i], got);
        check_digest(&v, "tensor", p->tensors[i].info.name, got, p->tensors[i].info.sha256,
                     v.tensor_bad[i]);
    }
    rc = v.faults;
    if (stats)
        *stats = v.stats;
out:
    for (size_t i = 0; v.lanes && i < v.n_lanes; i++) {
        for (size_t j = 0; v.lanes[i].slots && j < v.lanes[i].window; j++)
            free(v.lanes[i].slots[j].buf);
        free(v.lanes[i].slots);
    }
    free(v.lanes);
    free(v.tensor_next);
    free(v.th);
    free(v.file_bad);
    free(v.tensor_bad);
    free(v.next_part);
    free(v.out_of_order);
    free(v.file_got);
    free(tids);
    return rc;
}
