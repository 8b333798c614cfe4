#include "reader.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_state.h"
#include "common/fslog.h"

/* Reads this close to where the last one ended continue it: the kernel's
 * readahead requests arrive on several threads, a little out of order. */
#define SEQUENTIAL_SLACK (1u << 20)
/* A reader that starts elsewhere than at the beginning is sequential once
 * its reads have covered this much. The kernel cuts a read into requests
 * of 1 MiB (max_pages) and reads on past its end: a random pread of 2 MiB
 * came as 3 requests back to back, one of 4 MiB as 6. Taken for a stream
 * from the second request on, such a read had 8 MiB prefetched behind it,
 * which on S3 set off the store's readahead: 12-17 GETs for one 2 MiB
 * read, 27 for 4 MiB (the gateway's counter). The store's readahead waits
 * for 8 MiB in order too; a sequential reader that starts mid-file pays
 * with its first 8 MiB being read without prefetch. */
#define SEQUENTIAL_RUN (8u << 20)
#define PREFETCH_PER_THREAD (4ull << 20)
#define PREFETCH_MIN (8ull << 20)

/* The stored bytes of chunks that one read needs and that lie back to
 * back in the pack, fetched with one request (on S3, one ranged GET where
 * each chunk was its own), shared by their decodes; the last one frees it. */
typedef struct chunk_run {
    void *stored;
    size_t first; /* its first chunk */
    atomic_uint refs;
} chunk_run;

typedef struct decode_job {
    reader *r;
    checkpoint *checkpoint; /* referenced */
    chunk_entry *entry;     /* pinned */
    size_t id;
    chunk_run *run; /* NULL: the chunk is read on its own */
} decode_job;

typedef struct prefault_job {
    reader *r;
    chunk_entry *entry; /* pinned */
} prefault_job;

void reader_init(reader *r, checkpoint_table *table, chunk_cache *cache, worker_pool *pool,
                 uint64_t cache_bytes, unsigned threads)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->streams_lock, NULL);
    r->table = table;
    r->cache = cache;
    r->pool = pool;
    uint64_t ahead = (uint64_t)threads * PREFETCH_PER_THREAD;
    if (ahead < PREFETCH_MIN)
        ahead = PREFETCH_MIN;
    /* Leave most of the cache to chunks that were asked for. */
    if (ahead > cache_bytes / 4)
        ahead = cache_bytes / 4;
    r->prefetch_bytes = ahead;
    r->spill_chunks = threads;
}

void reader_set_pool(reader *r, worker_pool *pool)
{
    r->pool = pool;
}

void reader_destroy(reader *r)
{
    pthread_mutex_destroy(&r->streams_lock);
}

static void decode_into(chunk_cache *cache, checkpoint *c, chunk_entry *e, size_t id)
{
    ckpt_err err = {0};
    int rc = ckpt_chunk_decode(c->pack, id, chunk_entry_buffer(e), &err);
    chunk_cache_filled(cache, e, rc < 0 ? rc : 0, err.msg);
}

static void run_release(chunk_run *run)
{
    if (atomic_fetch_sub(&run->refs, 1) == 1) {
        free(run->stored);
        free(run);
    }
}

/* decode_into for a chunk of a run: from the bytes fetched with the run's. */
static void decode_run_into(chunk_cache *cache, checkpoint *c, chunk_entry *e, size_t id,
                            chunk_run *run)
{
    ckpt_err err = {0};
    int rc =
        ckpt_chunk_decode_stored(c->pack, run->first, run->stored, id, chunk_entry_buffer(e), &err);
    chunk_cache_filled(cache, e, rc < 0 ? rc : 0, err.msg);
    run_release(run);
}

static void run_decode_job(void *arg, int cancelled)
{
    decode_job *job = arg;
    if (cancelled) {
        chunk_cache_filled(job->r->cache, job->entry, -ECANCELED, "ckptfs is shutting down");
        if (job->run)
            run_release(job->run);
    } else if (job->run) {
        decode_run_into(job->r->cache, job->checkpoint, job->entry, job->id, job->run);
    } else {
        decode_into(job->r->cache, job->checkpoint, job->entry, job->id);
    }
    chunk_cache_release(job->r->cache, job->entry);
    checkpoint_unref(job->r->table, job->checkpoint);
    free(job);
}

/* Hands a LOADING entry (one pin of which the job takes over) to the pool.
 * 0, or -EAGAIN with the pin still the caller's. */
static int submit_decode(reader *r, checkpoint *c, chunk_entry *e, size_t id, chunk_run *run,
                         int urgent)
{
    if (!r->pool)
        return -EAGAIN;
    decode_job *job = malloc(sizeof *job);
    if (!job)
        return -EAGAIN;
    *job = (decode_job){.r = r, .checkpoint = c, .entry = e, .id = id, .run = run};
    checkpoint_ref(r->table, c);
    if (worker_pool_submit(r->pool, run_decode_job, job, urgent) == 0)
        return 0;
    checkpoint_unref(r->table, c);
    free(job);
    return -EAGAIN;
}

static void plan_init(read_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->iov = plan->inline_iov;
    plan->chunks = plan->inline_chunks;
    plan->cap = READ_PLAN_INLINE;
}

static int plan_grow(read_plan *plan)
{
    size_t cap = plan->cap * 2;
    struct iovec *iov = malloc(cap * sizeof *iov);
    plan_chunk *chunks = malloc(cap * sizeof *chunks);
    if (!iov || !chunks) {
        free(iov);
        free(chunks);
        return -ENOMEM;
    }
    memcpy(iov, plan->iov, plan->n * sizeof *iov);
    memcpy(chunks, plan->chunks, plan->n * sizeof *chunks);
    if (plan->iov != plan->inline_iov) {
        free(plan->iov);
        free(plan->chunks);
    }
    plan->iov = iov;
    plan->chunks = chunks;
    plan->cap = cap;
    return 0;
}

void read_plan_release(reader *r, read_plan *plan)
{
    for (size_t i = 0; i < plan->n; i++) {
        plan_chunk *pc = &plan->chunks[i];
        if (pc->entry && plan->sequential && pc->ends_here)
            chunk_cache_release_spent(r->cache, pc->entry);
        else if (pc->entry)
            chunk_cache_release(r->cache, pc->entry);
    }
    if (plan->iov != plan->inline_iov) {
        free(plan->iov);
        free(plan->chunks);
    }
    plan_init(plan);
}

static void log_fault(checkpoint *c, const tree_node *n, size_t file_index, uint64_t position,
                      const char *msg)
{
    const pack_tree *t = c->tree;
    const char *file = ckpt_file_at(c->pack, file_index)->path;
    char *shown = pack_tree_path(t, (uint32_t)(n - t->nodes));
    int other_name = shown && strcmp(shown, file) != 0;
    fslog_err("checkpoint '%s': read of '%s' at offset %" PRIu64 "%s%s%s failed: %s", c->name, file,
              position, other_name ? " (via '" : "", other_name ? shown : "",
              other_name ? "')" : "", msg && msg[0] ? msg : "corrupt chunk");
    checkpoint_set_error(c, "%s: read of '%s' at offset %" PRIu64 " failed: %s", c->pack_path, file,
                         position, msg && msg[0] ? msg : "corrupt chunk");
    free(shown);
}

/* How far prefetch may run for a read of node n: to the node's end, and for
 * a tensor a little into the bytes that follow it in its file. Tensors are
 * usually stored in name order, the order in which a shell glob over
 * tensors/, cp -r and most loaders read them, so those bytes are likely the
 * next file asked for; decoding its first chunks keeps every core busy
 * while the last chunks of this tensor finish. One chunk per worker bounds
 * the waste when the guess is wrong. */
static uint64_t prefetch_limit(const reader *r, const checkpoint *c, const tree_node *n)
{
    uint64_t node_end = n->file_offset + n->size;
    if (n->kind != TREE_TENSOR)
        return node_end;
    uint64_t file_size = ckpt_file_at(c->pack, n->file_index)->size;
    uint64_t spill = (uint64_t)r->spill_chunks * c->chunk_size;
    if (spill > r->prefetch_bytes)
        spill = r->prefetch_bytes;
    return file_size - node_end < spill ? file_size : node_end + spill;
}

static int near(uint64_t offset, uint64_t expected)
{
    return offset + SEQUENTIAL_SLACK >= expected && offset <= expected + SEQUENTIAL_SLACK;
}

/* Follows the reader of [offset, offset + len) of file ino. Returns 1 if it
 * reads sequentially, with the file positions [*from, *to) still to
 * prefetch (limited by limit). Called with streams_lock held. */
static int follow_stream(reader *r, uint64_t ino, uint64_t offset, uint64_t len, uint64_t file_base,
                         uint64_t limit, uint64_t *from, uint64_t *to)
{
    size_t set_index = (size_t)((ino * 0x9E3779B97F4A7C15ull) >> 32) % STREAM_SETS;
    read_stream *set = &r->streams[set_index * STREAM_WAYS];
    read_stream *s = NULL, *victim = &set[0];
    uint64_t best = UINT64_MAX;
    for (int w = 0; w < STREAM_WAYS; w++) {
        read_stream *way = &set[w];
        if (way->ino == ino && near(offset, way->next_offset)) {
            uint64_t d =
                offset > way->next_offset ? offset - way->next_offset : way->next_offset - offset;
            if (d < best) {
                best = d;
                s = way;
            }
        }
        if (way->last_use < victim->last_use)
            victim = way;
    }
    if (!s) {
        s = victim;
        *s = (read_stream){.ino = ino, .start = offset, .next_offset = offset + len};
    }
    s->last_use = ++r->clock;
    if (offset < s->start)
        s->start = offset;
    if (offset + len > s->next_offset)
        s->next_offset = offset + len;
    if (!near(s->start, 0) && s->next_offset - s->start < SEQUENTIAL_RUN)
        return 0;
    uint64_t read_end = file_base + offset + len;
    *from = read_end > s->prefetched_to ? read_end : s->prefetched_to;
    *to = read_end + r->prefetch_bytes < limit ? read_end + r->prefetch_bytes : limit;
    if (*to > s->prefetched_to)
        s->prefetched_to = *to;
    return 1;
}

/* The tensor an assembled-tensor node shows, or NULL for any other node. */
static const ckpt_tensor_info *assembled_of(const checkpoint *c, const tree_node *n)
{
    if (n->kind != TREE_TENSOR)
        return NULL;
    const ckpt_tensor_info *t = ckpt_tensor_at(c->pack, n->tensor_index);
    return t && t->n_parts ? t : NULL;
}

/* Sequential readers get the chunks ahead of them decoded in the
 * background, as far as the cache has unpinned room. An assembled tensor
 * is read ahead within the part that the read ends in: the next part is
 * in another file, and the next read there starts its own read-ahead.
 * 1 if this read is part of a sequential stream. */
static int prefetch(reader *r, checkpoint *c, uint32_t node, uint64_t offset, uint64_t len)
{
    if (!r->pool || r->prefetch_bytes == 0)
        return 0;
    const tree_node *n = &c->tree->nodes[node];
    size_t file_index = n->file_index;
    /* file_base + node offset = file position (modulo 2^64 for a part) */
    uint64_t file_base = n->file_offset, limit;
    if (assembled_of(c, n)) {
        uint64_t last, run;
        if (ckpt_tensor_locate(c->pack, n->tensor_index, offset + len - 1, &file_index, &last, &run,
                               NULL) < 0)
            return 0;
        file_base = last - (offset + len - 1);
        limit = last + run;
    } else {
        limit = prefetch_limit(r, c, n);
    }
    uint64_t from = 0, to = 0;
    pthread_mutex_lock(&r->streams_lock);
    int sequential =
        follow_stream(r, checkpoint_ino(c, node), offset, len, file_base, limit, &from, &to);
    pthread_mutex_unlock(&r->streams_lock);
    if (!sequential)
        return 0;

    for (uint64_t pos = from; pos < to;) {
        ckpt_chunk_ref ref;
        if (ckpt_chunk_locate(c->pack, file_index, pos, &ref, NULL) < 0 || ref.size == 0 ||
            ref.file_offset > pos)
            return 1;
        chunk_entry *e;
        int rc = chunk_cache_reserve(r->cache, c->serial, ref.id, ref.size, &e);
        if (rc < 0)
            return 1; /* no room: the reader will catch up first */
        if (rc == 1 && submit_decode(r, c, e, ref.id, NULL, 0)) {
            /* A reader may already be waiting on the entry: fill it. */
            decode_into(r->cache, c, e, ref.id);
            chunk_cache_release(r->cache, e);
            return 1;
        }
        pos = ref.file_offset + ref.size;
    }
    return 1;
}

/* Pins every chunk under [start, end) of file file_index into the plan. */
static int plan_chunks(reader *r, checkpoint *c, size_t file_index, uint64_t start, uint64_t end,
                       read_plan *plan)
{
    ckpt_err err = {0};
    for (uint64_t pos = start; pos < end;) {
        ckpt_chunk_ref ref;
        int rc = ckpt_chunk_locate(c->pack, file_index, pos, &ref, &err);
        if (rc < 0 || ref.file_offset > pos || pos - ref.file_offset >= ref.size) {
            fslog_err("checkpoint '%s': no chunk holds offset %" PRIu64 " of '%s'%s%s", c->name,
                      pos, ckpt_file_at(c->pack, file_index)->path, rc < 0 ? ": " : "",
                      rc < 0 ? err.msg : "");
            return -EIO;
        }
        if (plan->n == plan->cap && plan_grow(plan))
            return -ENOMEM;
        int must_fill;
        chunk_entry *e = chunk_cache_acquire(r->cache, c->serial, ref.id, ref.size, &must_fill);
        if (!e)
            return -ENOMEM;
        uint64_t skip = pos - ref.file_offset;
        uint64_t take = ref.size - skip < end - pos ? ref.size - skip : end - pos;
        plan->chunks[plan->n] = (plan_chunk){.entry = e,
                                             .id = ref.id,
                                             .file_index = file_index,
                                             .file_offset = ref.file_offset,
                                             .position = pos,
                                             .ends_here = skip + take == ref.size,
                                             .must_fill = must_fill};
        plan->iov[plan->n] = (struct iovec){.iov_base = (void *)(chunk_entry_data(e) + skip),
                                            .iov_len = (size_t)take};
        plan->n++;
        pos += take;
    }
    return 0;
}

static void run_prefault_job(void *arg, int cancelled)
{
    prefault_job *job = arg;
    if (!cancelled)
        chunk_entry_prefault(job->entry);
    chunk_cache_release(job->r->cache, job->entry);
    free(job);
}

/* A random read on an object store waits about 2 ms for the store to
 * answer, then decodes into buffers that, until the cache is full, are
 * new: a page fault per 4 KiB, 28% of the daemon's CPU in random 1 MiB
 * reads (perf). The pool, idle meanwhile, maps them in that wait. */
static void prefault_new(reader *r, read_plan *plan)
{
    for (size_t i = 0; i < plan->n; i++) {
        if (!plan->chunks[i].must_fill)
            continue;
        prefault_job *job = malloc(sizeof *job);
        if (!job)
            return;
        *job = (prefault_job){.r = r, .entry = plan->chunks[i].entry};
        chunk_cache_pin(r->cache, job->entry);
        if (worker_pool_submit(r->pool, run_prefault_job, job, 1) != 0) {
            chunk_cache_release(r->cache, job->entry);
            free(job);
            return;
        }
    }
}

/* Fills plan->chunks[from ..] that are one run of the pack: read with one
 * request, decoded on the pool but for the first, which is decoded here.
 * How many it filled (0: none, they are to be read one by one). */
static size_t fill_run(reader *r, checkpoint *c, read_plan *plan, size_t from, size_t n)
{
    plan_chunk *pcs = &plan->chunks[from];
    chunk_run *run = malloc(sizeof *run);
    if (!run)
        return 0;
    ckpt_err err = {0};
    ssize_t got = ckpt_chunks_fetch(c->pack, pcs[0].id, n, &run->stored, &err);
    if (got == -EAGAIN) {
        free(run);
        return 0;
    }
    if (got < 0) {
        free(run);
        /* The chunks' own reads would fail alike, each after its retries. */
        for (size_t i = 0; i < n; i++) {
            chunk_cache_filled(r->cache, pcs[i].entry, (int)got, err.msg);
            pcs[i].must_fill = 0;
        }
        return n;
    }
    run->first = pcs[0].id;
    atomic_init(&run->refs, (unsigned)got);
    for (ssize_t i = 1; i < got; i++) {
        chunk_cache_pin(r->cache, pcs[i].entry);
        if (submit_decode(r, c, pcs[i].entry, pcs[i].id, run, 1) != 0) {
            chunk_cache_release(r->cache, pcs[i].entry);
            decode_run_into(r->cache, c, pcs[i].entry, pcs[i].id, run);
        }
        pcs[i].must_fill = 0;
    }
    decode_run_into(r->cache, c, pcs[0].entry, pcs[0].id, run);
    pcs[0].must_fill = 0;
    return (size_t)got;
}

/* A random read that needs several chunks no one has yet: on an object
 * store each was its own GET, and the gateway's time to answer one, not
 * the bytes, is most of a GET (1.9 ms of 2.2 for 1 MiB from Ceph RGW on
 * loopback), so two chunks' GETs at once took 3-5 ms on two cores where
 * one GET of both takes 2.4. Chunks that follow one another in the file
 * follow one another in the pack: one GET for each such run. A sequential
 * reader is left to the store's readahead. */
static void fill_runs(reader *r, checkpoint *c, read_plan *plan)
{
    if (plan->sequential || ckpt_fd(c->pack) >= 0)
        return;
    if (r->pool)
        prefault_new(r, plan);
    for (size_t i = 0; i < plan->n;) {
        size_t n = 0;
        while (i + n < plan->n && plan->chunks[i + n].must_fill &&
               plan->chunks[i + n].id == plan->chunks[i].id + n)
            n++;
        size_t filled = n > 1 ? fill_run(r, c, plan, i, n) : 0;
        i += filled ? filled : 1;
    }
}

/* Decodes the chunks this read created: all but one on the pool, so a
 * read that spans several chunks decodes them in parallel, and the first
 * right here. */
static void fill_chunks(reader *r, checkpoint *c, read_plan *plan)
{
    fill_runs(r, c, plan);
    plan_chunk *here = NULL;
    for (size_t i = 0; i < plan->n; i++) {
        plan_chunk *pc = &plan->chunks[i];
        if (!pc->must_fill)
            continue;
        if (!here) {
            here = pc;
            continue;
        }
        chunk_cache_pin(r->cache, pc->entry);
        if (submit_decode(r, c, pc->entry, pc->id, NULL, 1) == 0) {
            pc->must_fill = 0;
        } else {
            chunk_cache_release(r->cache, pc->entry);
        }
    }
    for (size_t i = 0; i < plan->n; i++) {
        plan_chunk *pc = &plan->chunks[i];
        if (pc->must_fill) {
            decode_into(r->cache, c, pc->entry, pc->id);
            pc->must_fill = 0;
        }
    }
}

int reader_read(reader *r, checkpoint *c, uint32_t node, uint64_t offset, size_t size,
                read_plan *plan)
{
    plan_init(plan);
    const tree_node *n = &c->tree->nodes[node];
    if (offset >= n->size || size == 0)
        return 0;
    uint64_t len = n->size - offset < size ? n->size - offset : size;
    if (n->kind == TREE_MANIFEST) {
        plan->iov[0] = (struct iovec){.iov_base = c->tree->manifest + offset, .iov_len = len};
        plan->chunks[0] = (plan_chunk){0};
        plan->n = 1;
        return 0;
    }
    int rc = 0;
    if (assembled_of(c, n)) {
        /* Its bytes are its parts', in several files: one stretch each. */
        for (uint64_t pos = offset; rc == 0 && pos < offset + len;) {
            size_t file_index;
            uint64_t at, run;
            if (ckpt_tensor_locate(c->pack, n->tensor_index, pos, &file_index, &at, &run, NULL) <
                0) {
                rc = -EIO;
                break;
            }
            uint64_t take = run < offset + len - pos ? run : offset + len - pos;
            rc = plan_chunks(r, c, file_index, at, at + take, plan);
            pos += take;
        }
    } else {
        uint64_t start = n->file_offset + offset;
        rc = plan_chunks(r, c, n->file_index, start, start + len, plan);
    }
    if (rc == 0)
        plan->sequential = prefetch(r, c, node, offset, len);
    /* Even when planning failed half way: other readers may be waiting on
     * the entries this read created. */
    fill_chunks(r, c, plan);
    for (size_t i = 0; i < plan->n && rc == 0; i++) {
        plan_chunk *pc = &plan->chunks[i];
        const char *msg = NULL;
        int failed = chunk_cache_wait(r->cache, pc->entry, &msg);
        if (failed) {
            if (failed != -ECANCELED && checkpoint_first_fault(c, pc->id))
                log_fault(c, n, pc->file_index, pc->position, msg);
            /* A pack replaced in the store under this reader (the ETag
             * no longer matches) says so, as a local pack let go does. */
            rc = failed == -ENOMEM || failed == -ESTALE ? failed : -EIO;
        }
    }
    if (rc)
        read_plan_release(r, plan);
    return rc;
}
