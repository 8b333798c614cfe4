/* Sequential readahead for one S3 object: a reader that walks the object in
 * order gets the bytes ahead of it fetched by several ranged GETs in
 * parallel, so it runs at about the speed of one GET of the whole object
 * instead of paying a round trip per chunk.
 *
 * Why here and not in the callers: a pack's chunks are 1 MiB or so, and
 * one GET of that size costs about as much in latency and request overhead
 * as it moves (measured on RGW over loopback: about 2 ms for the request,
 * 1.3 ms for the megabyte), so even the mount's decode workers reading
 * chunks in parallel left the connection half idle. Here the object is cut
 * in segments (RA_SEG, larger than a chunk: each segment is one coalesced
 * GET of many neighbouring chunks) fetched by RA_THREADS threads, up to
 * RA_AHEAD segments ahead of the reader.
 *
 * Which reads are sequential: two streams of reads are told apart, each
 * by where its furthest read ended, so that a sequential reader keeps its
 * stream across a read elsewhere (a header, another file). A read that
 * starts up to RA_SLACK behind a stream's end (the mount's workers read a
 * few chunks at once, a little out of order) or up to RA_GAP past it
 * continues it; any other read starts a new stream in place of the least
 * recently used. A stream is read ahead once its reads cover RA_TRIGGER
 * bytes, each counted once, and only while they go on continuing it,
 * from where its own reads stopped (the first segment starting midway:
 * it used to start at its segment's start, fetching again up to the
 * 8 MiB its first reads had: 483.6 MB asked of the gateway for a cold
 * read of a 475.1 MB pack, now 475.2); one
 * stream at a time, since the slots hold one window (two readers taking
 * turns would evict each other's segments before they are read). Random
 * reads therefore go straight to one ranged GET, with no extra latency and
 * no wasted bytes. The readahead used to start at two near reads in a row
 * and go on at any read that landed in a segment already held: a random
 * 1 MiB read is two or three neighbouring chunk reads, so it started, and
 * later random reads kept it going; 40 random 1 MiB reads of a cold 167 MB
 * pack fetched 178 MB from the gateway.
 *
 * Slots: a fixed array of RA_AHEAD + 2 segment buffers, so memory is
 * bounded (64 MiB at most per object being streamed, and nothing
 * for one that is not). A slot is EMPTY, QUEUED, LOADING, READY or FAILED;
 * readers pin a slot while they copy out of it (refs), and a slot is
 * reused only when unpinned and outside the window of the latest read.
 *
 * Arriving segments: a reader uses a LOADING segment's bytes as soon as
 * the ones it needs have arrived (filled, which the fetch advances through
 * s3_ra_arrived every S3_PROGRESS_STEP or so), so a segment can be large,
 * few GETs for the gateway to answer, without the reader waiting for the
 * whole of one. Bytes told are final: the GET tells them only once the
 * answer is known to be the range of the generation opened, and a retry
 * skips them rather than writing them again under a reader. A segment that
 * fails midway leaves the readers that copied its first bytes with good
 * bytes; it is FAILED for every later reader, as one that failed at once.
 *
 * A FAILED segment is not an error here: the read falls back to the caller's
 * own ranged GET, whose error (HTTP status, -ESTALE for a replaced object)
 * is the one reported, so readahead never changes what a read returns;
 * except for a reader that waited for a fetch that failed slowly (no bytes
 * for RA_SPENT_MS or more before it failed: the store retried): it gets
 * that fetch's error (the same GET with the same If-Match, over a wider
 * range). Falling back there made a second GET with a retry budget of its
 * own after the first had spent all of its: against a hung gateway a read
 * failed after 60 s, not the 30 s that one request's retries take. A quick
 * failure (an answer refused at once, or a GET that failed while its bytes
 * were still coming) still falls back, as the reader's own GET may fare
 * otherwise. The time counted is since the last bytes, not since the GET
 * began: a 16 MiB segment takes more than RA_SPENT_MS on a slow link, and
 * a slow, healthy GET that then failed once gave its error to its readers.
 *
 * Generations: the segment fetch is the caller's ranged GET, carrying
 * If-Match with the ETag fixed at open, so every byte served from a
 * segment belongs to the generation the reader opened. After the object
 * is replaced, a reader may still be served what was fetched before (at
 * most the window), then gets -ESTALE from the first GET after: it keeps
 * its generation or fails, and never sees the new bytes.
 *
 * Locking: one mutex per object guards the slots; fetches and copies run
 * outside it. Threads start when a stream is first read ahead and are joined
 * by s3_ra_free, which first abandons their GETs (s3_ra_cancelled): closing
 * a file used to wait for a hung segment GET and all its retries, 20 s
 * against a gateway gone silent midway (test_s3_ra_gets). */
#include "s3.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* 16 MiB segments, 2 ahead, 2 GETs at once. The gateway's CPU goes
 * mostly per request: reading a 475 MB pack object in ranged GETs one
 * after another cost radosgw and its OSD 1.07-1.18 CPU-s in 1 MiB GETs,
 * 0.90-0.92 in 4 MiB, 0.68-0.69 in 16 MiB, 0.59-0.64 in 64 MiB, and
 * 0.53-0.61 in one GET (2026-11-27, 2 cores shared with the reader). The
 * segments used to be 4 MiB (12 ahead, 6 GETs at once): larger ones, before
 * a reader could use a segment's bytes as they arrived, made it wait for a
 * whole segment and were no faster. Now 16 x 2 x 2, 16 x 4 x 3, 32 x 2 x 2
 * and 64 x 1 x 2 were within the noise of one another; 16 MiB keeps the
 * memory near what it was (4 segments, 64 MiB, against 14 of 4 MiB). An
 * aligned segment is four of RGW's 4 MiB RADOS objects. */
#define RA_SEG (16u << 20)
#define RA_AHEAD 2u
#define RA_THREADS 2u
#define RA_SLOTS (RA_AHEAD + 2)
#define RA_SLACK (16ull << 20)
#define RA_GAP (4ull << 20)
#define RA_TRIGGER (8ull << 20)
/* An object this small gains nothing from readahead (its reads are as few
 * as the segment GETs would be). */
#define RA_MIN_SIZE (8ull << 20)
#define RA_STREAMS 2u
#define RA_STALE 32u
/* A failed fetch that had no bytes for this long before it failed had its
 * retries (the first backoff is 125-250 ms, a stalled try 15 s): its error
 * is a waiting reader's. */
#define RA_SPENT_MS 1000
#define SEG_ALIGN (2u << 20)

enum { EMPTY, QUEUED, LOADING, READY, FAILED };

typedef struct slot {
    s3_ra *ra;
    uint64_t seg; /* segment number: bytes [seg * RA_SEG, + len) */
    uint8_t *buf; /* RA_SEG bytes once allocated; kept for reuse */
    size_t len;
    size_t from;   /* buf[0, from) is not fetched: the stream's readers had it */
    size_t filled; /* LOADING: buf[from, filled) has arrived */
    int state;
    unsigned refs;
    int rc;               /* FAILED: the fetch's -errno */
    uint64_t quiet_since; /* LOADING: ms when it began, or its last bytes came */
    int spent;            /* FAILED after RA_SPENT_MS or more without bytes */
    ckpt_err err;         /* FAILED: why */
} slot;

struct s3_ra {
    s3_ra_fetch_fn fetch;
    void *ud;
    uint64_t size;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a slot became QUEUED, or stop */
    pthread_cond_t done; /* a slot left LOADING, or a pin was dropped */
    slot slots[RA_SLOTS];
    struct stream {
        uint64_t end;  /* where its furthest read ended */
        uint64_t run;  /* bytes its reads cover, gaps left out */
        uint64_t used; /* when it was last continued (ra->reads) */
        uint64_t from; /* read ahead from here: where its own reads stopped */
        uint64_t next; /* where the readahead would start at this read */
    } streams[RA_STREAMS];
    uint64_t reads;
    struct stream *ahead; /* the stream read ahead, if any */
    pthread_t threads[RA_THREADS];
    unsigned n_threads;
    atomic_int stop; /* read by the fetches' GETs without mu */
    s3_ra_stats stats;
};

int s3_ra_new(uint64_t size, s3_ra_fetch_fn fetch, void *ud, s3_ra **out)
{
    s3_ra *ra = calloc(1, sizeof *ra);
    if (!ra)
        return -ENOMEM;
    ra->fetch = fetch;
    ra->ud = ud;
    ra->size = size;
    pthread_mutex_init(&ra->mu, NULL);
    pthread_cond_init(&ra->work, NULL);
    pthread_cond_init(&ra->done, NULL);
    *out = ra;
    return 0;
}

void s3_ra_free(s3_ra *ra)
{
    if (!ra)
        return;
    pthread_mutex_lock(&ra->mu);
    ra->stop = 1;
    pthread_cond_broadcast(&ra->work);
    pthread_mutex_unlock(&ra->mu);
    for (unsigned i = 0; i < ra->n_threads; i++)
        pthread_join(ra->threads[i], NULL);
    for (unsigned i = 0; i < RA_SLOTS; i++)
        free(ra->slots[i].buf);
    pthread_mutex_destroy(&ra->mu);
    pthread_cond_destroy(&ra->work);
    pthread_cond_destroy(&ra->done);
    free(ra);
}

void s3_ra_get_stats(s3_ra *ra, s3_ra_stats *out)
{
    pthread_mutex_lock(&ra->mu);
    *out = ra->stats;
    pthread_mutex_unlock(&ra->mu);
}

/* A segment buffer, in huge pages where the kernel gives them (THP set to
 * "madvise" or "always"). In 4 KiB pages the GET's first writes into the
 * slots fault once a page: a cold read of a 475 MB pack through the mount
 * took 23,000-25,000 faults, those in the slots 3.4% of the daemon's CPU
 * (perf); in 2 MiB pages 8,500-13,000 faults. */
static int seg_new(uint8_t **buf)
{
    _Static_assert(SEG_ALIGN % S3_RA_ALIGN == 0, "segments are lent as S3_RA_ALIGN-aligned");
    if (posix_memalign((void **)buf, SEG_ALIGN, RA_SEG) != 0) {
        *buf = NULL;
        return -ENOMEM;
    }
#ifdef MADV_HUGEPAGE
    madvise(*buf, RA_SEG, MADV_HUGEPAGE);
#endif
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *fetch_thread(void *arg)
{
    s3_ra *ra = arg;
    pthread_setname_np(pthread_self(), "s3-readahead");
    pthread_mutex_lock(&ra->mu);
    for (;;) {
        slot *next = NULL;
        for (unsigned i = 0; i < RA_SLOTS; i++) {
            slot *s = &ra->slots[i];
            if (s->state == QUEUED && (!next || s->seg < next->seg))
                next = s;
        }
        if (ra->stop)
            break;
        if (!next) {
            pthread_cond_wait(&ra->work, &ra->mu);
            continue;
        }
        next->state = LOADING;
        next->quiet_since = now_ms();
        pthread_mutex_unlock(&ra->mu);
        ckpt_err err = {0};
        ssize_t got = -ENOMEM;
        if (next->buf || seg_new(&next->buf) == 0)
            got =
                ra->fetch(ra->ud, next->buf, next->len, next->seg * RA_SEG, next->from, next, &err);
        pthread_mutex_lock(&ra->mu);
        next->state = got == (ssize_t)next->len ? READY : FAILED;
        next->rc = got < 0 ? (int)got : -EIO;
        next->spent = now_ms() - next->quiet_since >= RA_SPENT_MS;
        next->err = err;
        if (next->state == FAILED && !next->err.msg[0])
            ckpt_fail(&next->err, next->rc, "read ahead of bytes %llu-%llu: %zd of %zu bytes",
                      (unsigned long long)(next->seg * RA_SEG),
                      (unsigned long long)(next->seg * RA_SEG + next->len - 1), got, next->len);
        ra->stats.segments++;
        ra->stats.bytes += next->state == READY ? next->len - next->from : 0;
        ra->stats.failed += next->state == FAILED;
        pthread_cond_broadcast(&ra->done);
    }
    pthread_mutex_unlock(&ra->mu);
    return NULL;
}

int s3_ra_cancelled(void *seg)
{
    return atomic_load(&((slot *)seg)->ra->stop);
}

void s3_ra_arrived(void *seg, size_t n)
{
    slot *s = seg;
    s3_ra *ra = s->ra;
    pthread_mutex_lock(&ra->mu);
    if (n > s->filled && n <= s->len) {
        s->filled = n;
        s->quiet_since = now_ms();
        pthread_cond_broadcast(&ra->done);
    }
    pthread_mutex_unlock(&ra->mu);
}

static slot *find(s3_ra *ra, uint64_t seg)
{
    for (unsigned i = 0; i < RA_SLOTS; i++)
        if (ra->slots[i].state != EMPTY && ra->slots[i].seg == seg)
            return &ra->slots[i];
    return NULL;
}

/* Queues segments first .. first + RA_AHEAD that are neither held nor
 * loading, in slots outside [first - 1, first + RA_AHEAD] (one behind
 * stays for readers a little out of order), none of them before from.
 * Called with mu held. */
static void schedule(s3_ra *ra, uint64_t first, uint64_t from)
{
    uint64_t n_segs = (ra->size + RA_SEG - 1) / RA_SEG;
    for (uint64_t seg = first; seg < n_segs && seg <= first + RA_AHEAD; seg++) {
        uint64_t off = seg * RA_SEG;
        size_t len = ra->size - off < RA_SEG ? (size_t)(ra->size - off) : RA_SEG;
        if (find(ra, seg) || off + len <= from)
            continue;
        slot *free_slot = NULL;
        for (unsigned i = 0; i < RA_SLOTS && !free_slot; i++) {
            slot *s = &ra->slots[i];
            int outside = s->seg + 1 < first || s->seg > first + RA_AHEAD;
            if (s->state == EMPTY ||
                ((s->state == READY || s->state == FAILED) && !s->refs && outside))
                free_slot = s;
        }
        if (!free_slot)
            return;
        *free_slot = (slot){.ra = ra,
                            .seg = seg,
                            .buf = free_slot->buf,
                            .len = len,
                            .from = from > off ? (size_t)(from - off) : 0,
                            .state = QUEUED};
        pthread_cond_signal(&ra->work);
    }
}

static void start_threads(s3_ra *ra)
{
    while (ra->n_threads < RA_THREADS &&
           pthread_create(&ra->threads[ra->n_threads], NULL, fetch_thread, ra) == 0)
        ra->n_threads++;
}

/* A range of an object that is read ahead at all: an object of a segment
 * or two gains nothing from it. */
static int in_object(const s3_ra *ra, size_t len, uint64_t off)
{
    return len && off < ra->size && len <= ra->size - off && s3_ra_segment_size(ra);
}

uint64_t s3_ra_segment_size(const s3_ra *ra)
{
    return ra && ra->size > RA_MIN_SIZE ? RA_SEG : 0;
}

/* Whether a reader may copy bytes [lo, to) of s's segment: fetched (not
 * before where the stream's own reads stopped), and loaded or arrived. */
static int holds(const slot *s, size_t lo, size_t to)
{
    return lo >= s->from && (s->state == READY || (s->state == LOADING && s->filled >= to));
}

/* The stream a read continues (the one whose end is nearest), or a new
 * one in place of the least recently used. Its run counts the bytes its
 * reads cover past one another, a gap up to RA_GAP left out; a read behind
 * its end (a worker late with its chunk) continues it but covers nothing
 * new, so random reads near a stream do not add up to a reader's run.
 * Called with mu held. */
static struct stream *continue_stream(s3_ra *ra, uint64_t off, size_t len)
{
    struct stream *s = NULL, *lru = &ra->streams[0];
    uint64_t best = UINT64_MAX;
    for (unsigned i = 0; i < RA_STREAMS; i++) {
        struct stream *t = &ra->streams[i];
        if (t->used && off + RA_SLACK >= t->end && off <= t->end + RA_GAP) {
            uint64_t dist = off > t->end ? off - t->end : t->end - off;
            if (dist < best) {
                best = dist;
                s = t;
            }
        }
        if (t->used < lru->used)
            lru = t;
    }
    if (!s) {
        s = lru;
        if (ra->ahead == s)
            ra->ahead = NULL;
        *s = (struct stream){.end = off};
    }
    /* A read past its end is served by the readahead it starts; one
     * behind it (whose bytes others read already) reads its own. */
    s->next = off >= s->end ? off : off + len > s->end ? off + len : s->end;
    if (off + len > s->end) {
        s->run += off >= s->end ? len : off + len - s->end;
        s->end = off + len;
    }
    s->used = ++ra->reads;
    return s;
}

/* Whether this read's stream is the one read ahead: one stream at a time,
 * as the slots hold one window; another takes over once it has gone
 * RA_STALE reads without a read. Called with mu held. */
static int reads_ahead(s3_ra *ra, struct stream *s)
{
    if (s->run < RA_TRIGGER)
        return 0;
    if (ra->ahead && ra->ahead != s && ra->reads - ra->ahead->used <= RA_STALE)
        return 0;
    if (ra->ahead != s)
        s->from = s->next;
    ra->ahead = s;
    return 1;
}

int s3_ra_borrow(s3_ra *ra, void *buf, size_t len, uint64_t off, const void **data, void **hold,
                 ckpt_err *err)
{
    *hold = NULL;
    if (!in_object(ra, len, off))
        return 0;
    uint64_t first = off / RA_SEG, last = (off + len - 1) / RA_SEG;
    pthread_mutex_lock(&ra->mu);
    struct stream *st = continue_stream(ra, off, len);
    if (reads_ahead(ra, st)) {
        start_threads(ra);
        schedule(ra, first, st->from);
    }
    /* All the segments the read needs, the bytes it needs of them arrived,
     * pinned, or none. */
    slot *held[2] = {NULL, NULL};
    int ok = last - first < 2 && ra->n_threads > 0, failed = 0, early = 0;
    for (uint64_t seg = first; ok && seg <= last; seg++) {
        slot *s = find(ra, seg);
        uint64_t seg_off = seg * RA_SEG;
        size_t lo = off > seg_off ? (size_t)(off - seg_off) : 0;
        size_t to =
            (size_t)((off + len < seg_off + RA_SEG ? off + len : seg_off + RA_SEG) - seg_off);
        int waited = 0;
        while (s && lo >= s->from && (s->state == QUEUED || s->state == LOADING) &&
               !holds(s, lo, to)) {
            waited = 1;
            pthread_cond_wait(&ra->done, &ra->mu);
            s = find(ra, seg);
        }
        early |= s && s->state == LOADING;
        if (s && s->state == FAILED && waited && s->spent && s->rc != -ENOMEM) {
            /* Its fetch spent its retries while we waited: no second GET. */
            failed = s->rc;
            if (err)
                *err = s->err;
        }
        if (!s || !holds(s, lo, to)) {
            ok = 0;
            break;
        }
        s->refs++;
        held[seg - first] = s;
    }
    if (!ok) {
        for (int i = 0; i < 2; i++)
            if (held[i])
                held[i]->refs--;
        ra->stats.misses++;
        pthread_mutex_unlock(&ra->mu);
        return failed;
    }
    ra->stats.hits++;
    ra->stats.early += early;
    pthread_mutex_unlock(&ra->mu);
    if (!held[1]) { /* in one segment: lent as it is */
        *data = held[0]->buf + (off - held[0]->seg * RA_SEG);
        *hold = held[0];
        return 1;
    }
    uint8_t *dst = buf;
    for (int i = 0; i < 2; i++) {
        uint64_t seg_off = held[i]->seg * RA_SEG;
        uint64_t from = off > seg_off ? off : seg_off;
        uint64_t to = off + len < seg_off + held[i]->len ? off + len : seg_off + held[i]->len;
        memcpy(dst + (from - off), held[i]->buf + (from - seg_off), (size_t)(to - from));
    }
    s3_ra_release(ra, held[0]);
    s3_ra_release(ra, held[1]);
    *data = buf;
    return 1;
}

void s3_ra_release(s3_ra *ra, void *hold)
{
    slot *s = hold;
    pthread_mutex_lock(&ra->mu);
    s->refs--;
    pthread_cond_broadcast(&ra->done);
    pthread_mutex_unlock(&ra->mu);
}

int s3_ra_read(s3_ra *ra, void *buf, size_t len, uint64_t off)
{
    const void *data;
    void *hold;
    int r = s3_ra_borrow(ra, buf, len, off, &data, &hold, NULL);
    if (r <= 0)
        return r;
    if (hold) {
        memcpy(buf, data, len);
        s3_ra_release(ra, hold);
    }
    return 1;
}
