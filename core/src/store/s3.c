/* The S3 store: the objects under s3://BUCKET/PREFIX of any S3 API (AWS,
 * Ceph RGW, MinIO, ...), reached with path-style requests
 * (endpoint/BUCKET/KEY) through s3_http.c.
 *
 *   open     one ListObjectsV2 (max-keys=1), so bad credentials and a
 *            missing bucket fail here, with the server's reason
 *   list     ListObjectsV2 with delimiter '/', paginated: one level, in
 *            the server's (byte) order, as the local store lists
 *   read     a GET of the object's last 64 KiB at open fixes the identity
 *            (ETag, size, Last-Modified) and brings a pack's footer and
 *            index with it, held by the reader (HEAD with a cache_dir,
 *            which holds those bytes); every read those bytes do not
 *            serve is one ranged GET carrying If-Match: ETag, so a
 *            replaced object fails with -ESTALE (412), never mixes versions;
 *            reads they serve (the last 64 KiB: index, footer, last chunks;
 *            a whole pack under 64 KiB) keep returning the opened
 *            generation, consistent, not mixed;
 *            each answer is checked: 206, the Content-Range asked for, the
 *            exact length; a sequential reader is served from segments
 *            fetched ahead in parallel (s3_readahead.c) by the same GETs,
 *            so after a replacement it may get bytes of its own generation
 *            fetched before, then -ESTALE; a run of chunks that one random
 *            read needs is one GET (read_run)
 *   write    s3_upload.c: multipart upload, completed by commit
 *   remove   HEAD (so a missing object is -ENOENT, as locally), DELETE
 *   rename   CopyObject then DELETE: NOT atomic (a reader may see both
 *            names, or, after a failed delete, keep seeing the old one);
 *            objects over 5 GiB (the limit of one copy) are refused
 *   lock     an object holding a lease (holder host:pid, expiry), taken
 *            with a conditional PUT (If-None-Match: *), renewed by a
 *            thread with If-Match on our own ETag; an expired lease is
 *            taken over with If-Match on its ETag. A gateway that ignores
 *            the conditions (older ones) makes the lock best effort.
 *   abort_stale  ListMultipartUploads under the prefix, AbortMultipartUpload
 *            for each upload older than the age given
 *
 * One job at about 630 lines: the store operations above, each a short
 * request sequence; HTTP, XML, configuration and uploads are s3_http.c,
 * s3_xml.c, s3_config.c and s3_upload.c. */
#include "s3.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOCK_LEASE_S 60 /* a lock not renewed for this long may be taken over */

char *s3_key(const s3_store *s, const char *name)
{
    char *k;
    if (!s->url.prefix[0])
        return strdup(name);
    return asprintf(&k, "%s/%s", s->url.prefix, name) < 0 ? NULL : k;
}

/* ---------------------------------------------------------------- reading */

typedef struct s3_reader {
    store_reader base;
    s3_store *s;
    char *key;
    int cached; /* has a tag: reads go through the cache */
    char tag[S3_CACHE_TAG_LEN];
    s3_ra *ra; /* NULL: every read is its own GET */
    /* The object's last bytes, [tail_off, size), or NULL: what the open's
     * GET brought (a pack's footer and index, and the chunks before them
     * within TAIL_GUESS bytes), joined by a read that ends where they
     * begin while the whole stays within TAIL_KEEP (the rest of a larger
     * index). Reads take their bytes from it rather than asking again: a
     * cold read of a 475 MB pack asked for its 54 KB index and footer a
     * second time, in its last readahead segment. Under tail_mu. */
    pthread_mutex_t tail_mu;
    uint8_t *tail;
    uint64_t tail_off;
} s3_reader;

/* 64 KiB holds the index and footer of gpt2-medium's 475 MB pack (54 KB)
 * and costs one GET, as the HEAD it replaces did; a larger index takes one
 * GET more, for its first bytes. Held for as long as the reader is open:
 * up to 1 MiB (an index of about 40,000 chunks), beyond which the last
 * readahead segment asks for the index's start again. */
#define TAIL_GUESS (64u << 10)
#define TAIL_KEEP (1u << 20)

/* Copies the part of [off, off + len) (within the object) that the tail
 * holds, always its end, into buf; returns the bytes before that part,
 * which the caller reads otherwise (len: none held). */
static size_t tail_take(s3_reader *sr, uint8_t *buf, size_t len, uint64_t off)
{
    size_t head = len;
    pthread_mutex_lock(&sr->tail_mu);
    if (sr->tail && off + len > sr->tail_off) {
        uint64_t from = off > sr->tail_off ? off : sr->tail_off;
        head = (size_t)(from - off);
        memcpy(buf + head, sr->tail + (from - sr->tail_off), len - head);
    }
    pthread_mutex_unlock(&sr->tail_mu);
    return head;
}

/* Bytes [off, off + len) just read: kept as the tail's start when they
 * end where it begins and the whole stays within TAIL_KEEP. */
static void tail_join(s3_reader *sr, const uint8_t *buf, size_t len, uint64_t off)
{
    uint64_t size = sr->base.id.size;
    pthread_mutex_lock(&sr->tail_mu);
    uint8_t *t = NULL;
    if (sr->tail && len && off + len == sr->tail_off && size - off <= TAIL_KEEP &&
        (t = malloc((size_t)(size - off)))) {
        memcpy(t, buf, len);
        memcpy(t + len, sr->tail, (size_t)(size - sr->tail_off));
        free(sr->tail);
        sr->tail = t;
        sr->tail_off = off;
    }
    pthread_mutex_unlock(&sr->tail_mu);
}

static ssize_t get_range(s3_reader *sr, void *buf, size_t len, uint64_t off, ckpt_err *err);
static ssize_t get_range_told(s3_reader *sr, void *buf, size_t len, uint64_t off, void *seg,
                              size_t base, ckpt_err *err);

/* One GET, kept in the cache when whole. */
static ssize_t get_and_keep(s3_reader *sr, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    ssize_t got = get_range(sr, buf, len, off, err);
    if (sr->cached && got == (ssize_t)len)
        s3_cache_put(sr->s->cache, sr->tag, off, buf, len);
    return got;
}

/* A segment for the readahead: from the cache when it holds it (its own
 * file, or the files of the chunks read before the readahead started,
 * which a remount's readahead may start earlier than the first read's
 * did), else one GET of the span the cache lacks, then kept whole. The
 * skip bytes the stream's readers had are fetched only without a cache:
 * with one, those readers kept their chunks in it, so the span it lacks
 * starts where they stopped (what it lacks before, a chunk nobody read,
 * is a GET of its own), and the segment is kept whole, one
 * file (what remains, a chunk a worker had in flight, is fetched for
 * that). The readahead runs several of these at once, ahead of
 * a sequential reader, so a cached object is read back from its cache
 * files in parallel, as it is fetched from the store. Before, a hit was
 * one file per chunk read in the reader's thread, each read waiting for
 * its pread, and a cold-page-cache read from a full cache_dir ran at
 * 0.72x of the same pack in a local directory, where the kernel's
 * readahead keeps the pack file ahead (2 cores, medians of 3). */
static ssize_t ra_fetch(void *ud, void *buf, size_t len, uint64_t off, size_t skip, void *seg,
                        ckpt_err *err)
{
    s3_reader *sr = ud;
    if (!sr->cached) {
        size_t head = tail_take(sr, (uint8_t *)buf + skip, len - skip, off + skip);
        ssize_t got =
            head ? get_range_told(sr, (uint8_t *)buf + skip, head, off + skip, seg, skip, err) : 0;
        return got < 0 ? got : (ssize_t)len;
    }
    s3_cache *c = sr->s->cache;
    s3_span gap[4];
    size_t n_gaps, fetched = 0;
    if (s3_cache_fill_gaps(c, sr->tag, off, buf, len, gap, 4, &n_gaps))
        return (ssize_t)len;
    /* A GET for each span the cache lacks, so that the chunks the readers
     * read and kept are not asked for again when one before them was never
     * read (another file's: the first 7.7 MB of a cold read of
     * gpt2-medium's safetensors, before its config.json's chunk, were);
     * spans less than 2 MiB apart are one GET, the bytes between costing
     * less than a request (about 1.9 ms here, 2 MB at curl's speed). What
     * lies before a GET's span is in buf already. */
    for (size_t i = 0; i < n_gaps;) {
        uint64_t from = gap[i].off, to = from + gap[i].len;
        while (++i < n_gaps && gap[i].off - to < (2u << 20))
            to = gap[i].off + gap[i].len;
        size_t n = (size_t)(to - from);
        ssize_t got = get_range_told(sr, (uint8_t *)buf + (from - off), n, from, seg,
                                     (size_t)(from - off), err);
        if (got != (ssize_t)n)
            return got < 0 ? got : -EIO;
        fetched += n;
    }
    s3_cache_keep(c, sr->tag, off, buf, len, fetched);
    return (ssize_t)len;
}

/* From the cache (the range's own entry, or the segments that hold it);
 * else one GET, kept in the cache. */
static ssize_t read_uncached_ahead(s3_reader *sr, void *buf, size_t len, uint64_t off,
                                   ckpt_err *err)
{
    if (sr->cached && s3_cache_get(sr->s->cache, sr->tag, off, buf, len, s3_ra_segment_size(sr->ra),
                                   sr->base.id.size))
        return (ssize_t)len;
    return get_and_keep(sr, buf, len, off, err);
}

static ssize_t reader_read_at(store_reader *r, void *buf, size_t len, uint64_t off, ckpt_err *err);

/* The part of a read before the tail, read as any other (its range ends
 * where the tail begins); what it brought joins the tail (the rest of a
 * pack's index). */
static ssize_t read_copied(s3_reader *sr, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    ssize_t got = reader_read_at(&sr->base, buf, len, off, err);
    if (got == (ssize_t)len)
        tail_join(sr, buf, len, off);
    return got;
}

/* From the segments read ahead when the reader is sequential (lent
 * without a copy where the range lies in one segment: the copy was 6% of
 * the daemon's CPU in a warm read from cache_dir), else as above. */
static ssize_t reader_borrow(store_reader *r, void *spare, size_t len, uint64_t off,
                             const void **data, void **hold, ckpt_err *err)
{
    s3_reader *sr = (s3_reader *)r;
    uint64_t size = r->id.size;
    *data = spare;
    *hold = NULL;
    if (off >= size || len == 0)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    size_t head = tail_take(sr, spare, len, off);
    if (head < len) {
        ssize_t got = head ? read_copied(sr, spare, head, off, err) : 0;
        return got < 0 ? got : (ssize_t)len;
    }
    int ra = sr->ra ? s3_ra_borrow(sr->ra, spare, len, off, data, hold, err) : 0;
    if (ra == 1)
        return (ssize_t)len;
    if (ra < 0)
        return ra; /* the segment's GET failed, its retries spent */
    return read_uncached_ahead(sr, spare, len, off, err);
}

/* A piece of a run from the cache into buf (the run's, from off). */
static int run_piece_cached(s3_reader *sr, uint8_t *buf, uint64_t off, uint64_t at, size_t len)
{
    return sr->cached && s3_cache_get(sr->s->cache, sr->tag, at, buf + (at - off), len,
                                      s3_ra_segment_size(sr->ra), sr->base.id.size);
}

/* One GET for the run, each piece then kept in the cache on its own, so
 * that a later read of any one of them finds it. A run the cache holds
 * (its first piece, as a rule the rest with it) is -EAGAIN: read piece by
 * piece, the pieces are read from their files in parallel, where one
 * thread here would read them one after another (a warm random 1 MiB read
 * took 4.4-4.7 ms that way against 3.4-3.6 ms). Otherwise the pieces the
 * cache holds at either end come from it and the GET covers the rest,
 * held pieces amid it too: a request costs more than the bytes, so those
 * are neither read from their files nor written to them again. */
static ssize_t reader_read_run(store_reader *r, void *buf, uint64_t off, const size_t *lens,
                               size_t n, ckpt_err *err)
{
    s3_reader *sr = (s3_reader *)r;
    uint64_t seg = s3_ra_segment_size(sr->ra), end = off;
    for (size_t i = 0; i < n; end += lens[i++])
        if (end > r->id.size || lens[i] > r->id.size - end)
            return -ENODATA;
    if (sr->cached && n && s3_cache_holds(sr->s->cache, sr->tag, off, lens[0], seg, r->id.size))
        return -EAGAIN;
    uint64_t held = off + tail_take(sr, buf, (size_t)(end - off), off);
    size_t lo = 0, hi = n; /* the pieces [lo, hi) are fetched */
    uint64_t from = off, to = end;
    while (lo < hi && run_piece_cached(sr, buf, off, from, lens[lo]))
        from += lens[lo++];
    while (hi > lo + 1 && run_piece_cached(sr, buf, off, to - lens[hi - 1], lens[hi - 1]))
        to -= lens[--hi];
    if (to > held)
        to = held;
    if (from >= to)
        return 0;
    ssize_t got = get_range(sr, (uint8_t *)buf + (from - off), (size_t)(to - from), from, err);
    if (got < 0 || !sr->cached)
        return got < 0 ? got : 0;
    for (uint64_t at = from; lo < hi; at += lens[lo++]) {
        int between = at != from && at + lens[lo] != to;
        if (lens[lo] &&
            !(between && s3_cache_holds(sr->s->cache, sr->tag, at, lens[lo], seg, r->id.size)))
            s3_cache_put(sr->s->cache, sr->tag, at, (uint8_t *)buf + (at - off), lens[lo]);
    }
    return 0;
}

static void reader_release(store_reader *r, void *hold)
{
    s3_ra_release(((s3_reader *)r)->ra, hold);
}

static ssize_t reader_read_at(store_reader *r, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    const void *data;
    void *hold;
    ssize_t got = reader_borrow(r, buf, len, off, &data, &hold, err);
    if (hold) {
        memcpy(buf, data, (size_t)got);
        reader_release(r, hold);
    }
    return got;
}

/* The Content-Range of the answer to a try of a GET of len bytes at off
 * that resumed at byte from of them. */
static void want_range(char *out, size_t cap, uint64_t off, size_t len, size_t from, uint64_t size)
{
    snprintf(out, cap, "bytes %llu-%llu/%llu", (unsigned long long)(off + from),
             (unsigned long long)(off + len - 1), (unsigned long long)size);
}

/* A readahead segment's GET as it arrives: the bytes so far are the
 * segment's once the answer is the range asked for, of the generation
 * opened (If-Match makes it so; the ETag is checked as after the GET). */
typedef struct arrival {
    uint64_t off, size;
    size_t len;
    const char *etag;
    void *seg;
    size_t base; /* bytes of the segment before the GET's range */
} arrival;

static int on_arrival(void *ud, const s3_resp *rs)
{
    const arrival *a = ud;
    char want[96];
    want_range(want, sizeof want, a->off, a->len, rs->dst_from, a->size);
    if (rs->status == 200 && !rs->dst_from)
        return 0; /* the whole object: judged when it has arrived */
    if (rs->status != 206 || strcmp(rs->content_range, want) ||
        (rs->etag[0] && a->etag[0] && strcmp(rs->etag, a->etag)))
        return -1;
    s3_ra_arrived(a->seg, a->base + rs->dst_got);
    return 1;
}

/* One ranged GET of exactly len bytes (within the object) at off. */
static ssize_t get_range(s3_reader *sr, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    return get_range_told(sr, buf, len, off, NULL, 0, err);
}

/* The same, telling the readahead's segment seg (when not NULL) what has
 * arrived, base bytes of it being there before. */
static ssize_t get_range_told(s3_reader *sr, void *buf, size_t len, uint64_t off, void *seg,
                              size_t base, ckpt_err *err)
{
    store_reader *r = &sr->base;
    uint64_t size = r->id.size;
    uint64_t last = off + len - 1;
    char match[100], want[96];
    snprintf(match, sizeof match, "If-Match: %s", r->id.etag);
    const char *hdrs[] = {r->id.etag[0] ? match : NULL, NULL};
    arrival a = {
        .off = off, .size = size, .len = len, .etag = r->id.etag, .seg = seg, .base = base};
    s3_req rq = {.method = "GET",
                 .bucket = sr->s->url.bucket,
                 .key = sr->key,
                 .headers = hdrs,
                 .dst = buf,
                 .dst_len = len,
                 .ranged = 1,
                 .range_off = off,
                 .progress = seg && r->id.etag[0] ? on_arrival : NULL,
                 .progress_ud = &a,
                 .cancelled = seg ? s3_ra_cancelled : NULL,
                 .cancel_ud = seg};
    s3_resp rs;
    int rc = s3_request(sr->s->http, &rq, &rs);
    char what[64];
    snprintf(what, sizeof what, "read of bytes %llu-%llu", (unsigned long long)off,
             (unsigned long long)last);
    want_range(want, sizeof want, off, len, rs.dst_from, size);
    if (rc == 0 && (rs.status == 206 || rs.status == 200)) {
        int whole = rs.status == 200 && off == 0 && len == size && !rs.dst_from;
        /* A resumed try (there are none without an ETag: the progress that
         * tells bytes needs one) is held to the same ETag; one without an
         * ETag rests on its If-Match, as a first try does. */
        if (rs.etag[0] && r->id.etag[0] && strcmp(rs.etag, r->id.etag) != 0)
            rc = ckpt_fail(err, -ESTALE,
                           "%s: %s failed: the object was replaced since it was "
                           "opened (ETag %s, was %s)",
                           r->name, what, rs.etag, r->id.etag);
        else if (rs.overflow || rs.dst_got != len || (!whole && strcmp(rs.content_range, want)))
            rc = ckpt_fail(err, -EIO,
                           "%s: %s failed: the answer (HTTP %ld, %zu bytes, "
                           "Content-Range '%s') is not the range asked for",
                           r->name, what, rs.status, rs.dst_got, rs.content_range);
        else
            rc = 0;
    } else if (rc == -ECANCELED) {
        rc = ckpt_fail(err, rc, "%s: %s abandoned: the reader was closed", r->name, what);
    } else {
        rc = s3_fail(err, sr->s->http, r->name, what, &rs);
    }
    s3_resp_free(&rs);
    return rc < 0 ? rc : (ssize_t)len;
}

static int reader_fd(const store_reader *r)
{
    return -1;
}

static void reader_close(store_reader *r)
{
    s3_reader *sr = (s3_reader *)r;
    if (!sr)
        return;
    s3_ra_free(sr->ra);
    pthread_mutex_destroy(&sr->tail_mu);
    free(sr->tail);
    free(sr->key);
    free(sr->base.name);
    free(sr);
}

static const store_reader_ops reader_ops = {.read_at = reader_read_at,
                                            .fd = reader_fd,
                                            .close = reader_close,
                                            .borrow = reader_borrow,
                                            .release = reader_release,
                                            .read_run = reader_read_run};

/* The identity the open fixes, from the answer that told the size. */
static void set_id(s3_reader *r, uint64_t size, const s3_resp *rs)
{
    r->base.id.size = size;
    r->base.id.mtime_sec = rs->last_modified;
    snprintf(r->base.id.etag, sizeof r->base.id.etag, "%s", rs->etag);
}

/* A decimal number of digits alone at *p (no sign, no space, no wrap),
 * p moved past it; -1 when there is none. */
static int decimal(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    for (; isdigit((unsigned char)*s); s++) {
        if (x > (UINT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *p = s;
    *v = x;
    return 0;
}

/* The range of a 206 to a suffix GET of at most max bytes, "bytes
 * A-B/SIZE" ending at the object's last byte; -1 for anything else. */
static int suffix_range(const char *cr, uint64_t max, uint64_t *a, uint64_t *size)
{
    uint64_t b;
    if (strncmp(cr, "bytes ", 6) != 0)
        return -1;
    cr += 6;
    if (decimal(&cr, a) < 0 || *cr++ != '-' || decimal(&cr, &b) < 0 || *cr++ != '/' ||
        decimal(&cr, size) < 0 || *cr)
        return -1;
    return *a <= b && *size && b == *size - 1 && *size - *a <= max ? 0 : -1;
}

/* The open's GET of the object's last TAIL_GUESS bytes (a suffix range):
 * 1 with the identity fixed and the bytes held as the tail, 0 when the
 * answer is not one to use, for a HEAD to fix the identity instead: 416
 * (an empty object), a 200 of more than asked (a gateway that ignores
 * ranges), an answer without an ETag (the HEAD may carry one: reads are
 * pinned to it), and a refusal of the range itself (another 4xx than
 * 401, 403 and 404, or 501, from a gateway without suffix ranges);
 * -errno naming the object when it cannot be read. */
static int open_by_tail(s3_reader *r, ckpt_err *err)
{
    s3_store *s = r->s;
    uint8_t *buf = malloc(TAIL_GUESS);
    if (!buf)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    char range[48];
    snprintf(range, sizeof range, "Range: bytes=-%u", TAIL_GUESS);
    const char *hdrs[] = {range, NULL};
    s3_req rq = {.method = "GET",
                 .bucket = s->url.bucket,
                 .key = r->key,
                 .headers = hdrs,
                 .dst = buf,
                 .dst_len = TAIL_GUESS};
    s3_resp rs;
    int rc = s3_request(s->http, &rq, &rs);
    uint64_t a = 0, size = 0;
    int refused = rs.status == 501 || (rs.status >= 400 && rs.status < 500 && rs.status != 401 &&
                                       rs.status != 403 && rs.status != 404);
    if (rc == 0 && rs.status == 206 && !rs.overflow && rs.etag[0] &&
        suffix_range(rs.content_range, TAIL_GUESS, &a, &size) == 0 && rs.dst_got == size - a)
        rc = 1;
    else if (rc == 0 && rs.status == 200 && !rs.overflow && rs.etag[0] && rs.has_length &&
             rs.content_length == rs.dst_got)
        rc = 1, size = rs.dst_got; /* the whole object, a = 0 */
    else if (rc == 0 && (refused || (rs.status >= 200 && rs.status < 300)))
        rc = 0;
    else
        rc = s3_fail(err, s->http, r->base.name, "open", &rs);
    if (rc == 1) {
        set_id(r, size, &rs);
        uint8_t *fit = realloc(buf, rs.dst_got ? rs.dst_got : 1);
        r->tail = fit ? fit : buf;
        r->tail_off = a;
        buf = NULL;
    }
    free(buf);
    s3_resp_free(&rs);
    return rc;
}

/* The HEAD that fixes the object's identity: 0 or -errno naming it. */
static int open_by_head(s3_reader *r, ckpt_err *err)
{
    s3_store *s = r->s;
    s3_req rq = {.method = "HEAD", .bucket = s->url.bucket, .key = r->key};
    s3_resp rs;
    int rc = s3_request(s->http, &rq, &rs);
    if (rc == 0 && rs.status == 200 && rs.has_length) {
        set_id(r, rs.content_length, &rs);
    } else if (rc == 0 && rs.status == 200) {
        rc = ckpt_fail(err, -EIO, "%s: the server gave no Content-Length", r->base.name);
    } else {
        rc = s3_fail(err, s->http, r->base.name, "open", &rs);
    }
    s3_resp_free(&rs);
    return rc;
}

/* With a cache_dir, a HEAD: the cache holds what the open reads (the
 * ETag names its files), so a warm open fetches no bytes. */
static int s3_open_read(ckpt_store *base, const char *name, store_reader **out, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    s3_reader *r = calloc(1, sizeof *r);
    if (r)
        pthread_mutex_init(&r->tail_mu, NULL);
    if (!r || !(r->key = s3_key(s, name)) || !(r->base.name = store_display_name(base, name))) {
        reader_close(r ? &r->base : NULL);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    r->base.ops = &reader_ops;
    r->s = s;
    int rc = s->cache ? 0 : open_by_tail(r, err);
    if (rc == 0)
        rc = open_by_head(r, err);
    if (rc < 0) {
        reader_close(&r->base);
        return rc;
    }
    const char *etag = r->base.id.etag;
    r->cached = s->cache && s3_cache_tag(s->url.bucket, r->key, etag, r->tag) == 0;
    /* Without an ETag a segment could mix generations: no readahead. */
    if (etag[0] && s3_ra_new(r->base.id.size, ra_fetch, r, &r->ra) < 0)
        r->ra = NULL;
    *out = &r->base;
    return 0;
}

/* ---------------------------------------------------------------- listing */

/* One page of ListObjectsV2 under key_prefix; token continues a listing. */
static int list_page(s3_store *s, const char *key_prefix, const char *token, unsigned max_keys,
                     const char *action, s3_list *page, ckpt_err *err)
{
    char *p = s3_uri_encode(key_prefix, 0), *t = token ? s3_uri_encode(token, 0) : NULL, *q = NULL;
    char mk[32] = "";
    if (max_keys)
        snprintf(mk, sizeof mk, "&max-keys=%u", max_keys);
    /* Sorted by name, as the signature needs. */
    if (p && (!token || t) &&
        asprintf(&q, "%s%s%sdelimiter=%%2F&list-type=2%s&prefix=%s", t ? "continuation-token=" : "",
                 t ? t : "", t ? "&" : "", mk, p) < 0)
        q = NULL;
    free(p);
    free(t);
    if (!q)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    s3_req rq = {.method = "GET", .bucket = s->url.bucket, .query = q};
    s3_resp rs;
    int rc = s3_request(s->http, &rq, &rs);
    free(q);
    if (rc == 0 && rs.status == 200 && !rs.overflow) {
        rc = s3_xml_list_objects(rs.body, rs.body_len, page, err);
        if (rc < 0)
            ckpt_fail_prefix(err, s->base.where);
    } else {
        rc = s3_fail(err, s->http, s->base.where, action, &rs);
    }
    s3_resp_free(&rs);
    return rc;
}

static int s3_list_objects(ckpt_store *base, const char *prefix, int dirs, ckpt_object_fn fn,
                           void *ud, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    size_t skip = s->url.prefix[0] ? strlen(s->url.prefix) + 1 : 0;
    char *kp = s3_key(s, prefix);
    if (!kp)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    char *token = NULL;
    int rc = 0;
    do {
        s3_list page;
        rc = list_page(s, kp, token, 0, "listing", &page, err);
        /* A server that hands back the token it was given would list the
         * same page forever. */
        if (rc == 0 && page.truncated && token && !strcmp(token, page.next_token)) {
            s3_list_free(&page);
            rc = ckpt_fail(err, -EIO, "%s: listing: the server repeats its continuation token",
                           base->where);
        }
        free(token);
        token = NULL;
        if (rc < 0)
            break;
        for (size_t i = 0; rc == 0 && i < page.n; i++) {
            s3_entry *e = &page.v[i];
            if (strlen(e->key) <= skip || strncmp(e->key, kp, strlen(kp)) != 0 ||
                (e->is_prefix && !dirs))
                continue;
            if (e->is_prefix)
                e->key[strlen(e->key) - 1] = '\0'; /* parse_prefix: ends in '/' */
            const char *name = e->key + skip;
            if (!*name || !ckpt_path_is_safe(name))
                continue; /* a key no local name could have ("a//b") */
            ckpt_object_info info = {.name = name, .is_dir = e->is_prefix};
            info.id.size = e->size;
            info.id.mtime_sec = e->mtime;
            snprintf(info.id.etag, sizeof info.id.etag, "%s", e->etag);
            rc = fn(ud, &info);
        }
        if (rc == 0 && page.truncated && !(token = strdup(page.next_token)))
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
        s3_list_free(&page);
    } while (rc == 0 && token);
    free(token);
    free(kp);
    return rc;
}

/* ------------------------------------------------------ administration */

/* A request on one object whose only interest is its status. */
static int simple(s3_store *s, const char *method, const char *key, const char *const *hdrs,
                  s3_resp *rs)
{
    s3_req rq = {.method = method, .bucket = s->url.bucket, .key = key, .headers = hdrs};
    return s3_request(s->http, &rq, rs);
}

int s3_etag_equal(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na >= 2 && a[0] == '"' && a[na - 1] == '"')
        a++, na -= 2;
    if (nb >= 2 && b[0] == '"' && b[nb - 1] == '"')
        b++, nb -= 2;
    return na && na == nb && strncasecmp(a, b, na) == 0;
}

/* want: the version the caller saw, or NULL. A DELETE is not conditional
 * on Ceph RGW 16.2: it deletes whatever If-Match says (tested: a wrong
 * ETag, 204, the object gone), so the HEAD compares first, and the DELETE
 * carries If-Match for the stores that honour it (AWS S3 since 2024): on
 * RGW, a replacement that lands between the two is deleted. */
static int remove_object(ckpt_store *base, const char *name, const ckpt_object_id *want,
                         ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    int lrc = s3_lease_check(s, err);
    if (lrc < 0)
        return lrc;
    char *key = s3_key(s, name), *shown = store_display_name(base, name), *if_match = NULL;
    int rc = !key || !shown ? ckpt_fail(err, -ENOMEM, "out of memory") : 0;
    if (rc == 0 && want && want->etag[0] &&
        asprintf(&if_match, "If-Match: %s%s%s", want->etag[0] == '"' ? "" : "\"", want->etag,
                 want->etag[0] == '"' ? "" : "\"") < 0) {
        if_match = NULL;
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    }
    s3_resp rs = {0};
    /* DELETE of a missing key succeeds on S3; a local store says ENOENT. */
    if (rc == 0 && (simple(s, "HEAD", key, NULL, &rs) < 0 || rs.status != 200))
        rc = s3_fail(err, s->http, shown, "remove", &rs);
    if (rc == 0 && if_match &&
        (!s3_etag_equal(rs.etag, want->etag) || !rs.has_length || rs.content_length != want->size))
        rc =
            ckpt_fail(err, -ESTALE, "%s: not removed: replaced since it was seen (ETag %s, now %s)",
                      shown, want->etag, rs.etag);
    s3_resp_free(&rs);
    const char *hdrs[] = {if_match, NULL};
    if (rc == 0 && (simple(s, "DELETE", key, if_match ? hdrs : NULL, &rs) < 0 ||
                    (rs.status != 204 && rs.status != 200)))
        rc = rs.status == 412 ? ckpt_fail(err, -ESTALE,
                                          "%s: not removed: replaced since it was seen (HTTP "
                                          "412 PreconditionFailed)",
                                          shown)
                              : s3_fail(err, s->http, shown, "remove", &rs);
    s3_resp_free(&rs);
    free(if_match);
    free(key);
    free(shown);
    return rc;
}

static int s3_remove(ckpt_store *base, const char *name, ckpt_err *err)
{
    return remove_object(base, name, NULL, err);
}

static int s3_remove_if(ckpt_store *base, const char *name, const ckpt_object_id *want,
                        ckpt_err *err)
{
    return remove_object(base, name, want, err);
}

static int s3_rename(ckpt_store *base, const char *from, const char *to, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    int lrc = s3_lease_check(s, err);
    if (lrc < 0)
        return lrc;
    char *kf = s3_key(s, from), *kt = s3_key(s, to), *sf = store_display_name(base, from);
    char *src = NULL, *enc = NULL, *benc = s3_uri_encode(s->url.bucket, 0);
    int rc = 0;
    s3_resp rs = {0};
    if (!kf || !kt || !sf || !benc || !(enc = s3_uri_encode(kf, 1)) ||
        asprintf(&src, "x-amz-copy-source: /%s/%s", benc, enc) < 0) {
        src = NULL;
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (simple(s, "HEAD", kf, NULL, &rs) < 0 || rs.status != 200) {
        rc = s3_fail(err, s->http, sf, "rename", &rs);
        goto out;
    }
    if (rs.content_length > (5ull << 30)) {
        rc = ckpt_fail(err, -EFBIG,
                       "%s: rename failed: objects over 5 GiB cannot be copied in "
                       "one request, and renaming them is not supported on S3",
                       sf);
        goto out;
    }
    s3_resp_free(&rs);
    const char *hdrs[] = {src, NULL};
    if (simple(s, "PUT", kt, hdrs, &rs) < 0 || rs.status != 200) {
        rc = s3_fail(err, s->http, sf, "rename (copy)", &rs);
        goto out;
    }
    /* A copy can fail after its 200 has been sent: the body says so. */
    s3_error e;
    int r = s3_xml_complete(rs.body, rs.body_len, "CopyObjectResult", &e, err);
    if (r == 1)
        rc = ckpt_fail(err, -EIO, "%s: rename (copy) failed: %s %s", sf, e.code, e.message);
    else if (r < 0)
        rc = ckpt_fail_prefix(err, sf);
    if (rc < 0)
        goto out;
    s3_resp_free(&rs);
    if (simple(s, "DELETE", kf, NULL, &rs) < 0 || (rs.status != 204 && rs.status != 200))
        rc = s3_fail(err, s->http, sf, "rename (delete after copy)", &rs);
out:
    s3_resp_free(&rs);
    free(kf);
    free(kt);
    free(sf);
    free(src);
    free(enc);
    free(benc);
    return rc;
}

/* ------------------------------------------------------------------ lock */

typedef struct s3_lock {
    ckpt_store_lock base;
    s3_store *s;
    char *key, *shown;
    char holder[300];
    char token[33];
    char etag[80];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t renewer;
    int stop, lost;
    int running;     /* renewer started (not in a child of a fork until restarted) */
    int64_t put_at;  /* CLOCK_BOOTTIME seconds of the last PUT of the lease that took */
    char taker[300]; /* lost: who holds it now */
} s3_lock;

static int64_t boot_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return ts.tv_sec;
}

static void lock_body(const s3_lock *l, char *buf, size_t cap)
{
    snprintf(buf, cap, "holder %s\nexpires %lld\ntoken %s\n", l->holder,
             (long long)time(NULL) + LOCK_LEASE_S, l->token);
}

/* Reads the lease into lease (cap bytes, NUL-ended) and its ETag: 1 when
 * it is there, else 0. */
static int lease_get(const s3_lock *l, char *lease, size_t cap, char etag[80])
{
    memset(lease, 0, cap);
    s3_req rq = {.method = "GET",
                 .bucket = l->s->url.bucket,
                 .key = l->key,
                 .dst = lease,
                 .dst_len = cap - 1,
                 .patient = 1};
    s3_resp rs;
    int ok = s3_request(l->s->http, &rq, &rs) == 0 && rs.status == 200 && !rs.overflow;
    snprintf(etag, 80, "%s", ok ? rs.etag : "");
    s3_resp_free(&rs);
    return ok;
}

/* PUT the lease with a condition; the status, and the new ETag in l. A 412
 * after a retry may answer our own earlier try, which took effect though
 * its answer was lost (a timeout, a dropped connection): the lease then
 * carries our token, and is ours. */
static long lock_put(s3_lock *l, const char *cond, ckpt_err *err)
{
    char body[512];
    lock_body(l, body, sizeof body);
    const char *hdrs[] = {cond, NULL};
    s3_req rq = {.method = "PUT",
                 .bucket = l->s->url.bucket,
                 .key = l->key,
                 .headers = hdrs,
                 .body = body,
                 .body_len = strlen(body),
                 .patient = 1};
    s3_resp rs;
    long status = -1;
    if (s3_request(l->s->http, &rq, &rs) == 0)
        status = rs.status;
    if (status == 200) {
        snprintf(l->etag, sizeof l->etag, "%s", rs.etag);
        pthread_mutex_lock(&l->mu); /* held by no caller; s3_lease_check reads it */
        l->put_at = boot_s();
        pthread_mutex_unlock(&l->mu);
    } else if (status != 412)
        s3_fail(err, l->s->http, l->shown, "taking the lock", &rs);
    unsigned attempts = rs.attempts;
    s3_resp_free(&rs);
    if (status == 412 && attempts > 1) {
        char lease[512], etag[80];
        if (lease_get(l, lease, sizeof lease, etag) && etag[0] && strstr(lease, l->token)) {
            snprintf(l->etag, sizeof l->etag, "%s", etag);
            pthread_mutex_lock(&l->mu);
            l->put_at = boot_s();
            pthread_mutex_unlock(&l->mu);
            status = 200;
        }
    }
    return status;
}

/* PUT If-Match: etag. RGW 16.2 compares a PUT's If-Match with the ETag
 * unquoted (a quoted one never matches there), AWS with it quoted: the
 * quoted form first, then the bare one, and a true mismatch fails both. */
static long lock_put_if_match(s3_lock *l, const char *etag, ckpt_err *err)
{
    char cond[100];
    snprintf(cond, sizeof cond, "If-Match: %s", etag);
    long st = lock_put(l, cond, err);
    size_t n = strlen(etag);
    if (st == 412 && n > 2 && etag[0] == '"' && etag[n - 1] == '"') {
        snprintf(cond, sizeof cond, "If-Match: %.*s", (int)(n - 2), etag + 1);
        st = lock_put(l, cond, err);
    }
    return st;
}

static void *lock_renewer(void *arg)
{
    s3_lock *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += LOCK_LEASE_S / 3;
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        if (l->stop)
            break;
        char etag[80];
        snprintf(etag, sizeof etag, "%s", l->etag);
        pthread_mutex_unlock(&l->mu);
        ckpt_err err = {0};
        long st = lock_put_if_match(l, etag, &err);
        char lease[512], got[80];
        /* Someone took it over: our lease had expired. */
        int taken = st == 412 && lease_get(l, lease, sizeof lease, got);
        pthread_mutex_lock(&l->mu);
        if (st == 412) {
            const char *h = taken ? strstr(lease, "holder ") : NULL;
            l->lost = 1;
            if (h)
                sscanf(h + 7, "%299[^\n]", l->taker);
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* "HOST:PID" naming this host and a process that no longer exists. Only
 * this host can tell; a PID namespace shared under one host name (two
 * containers with the same hostname) would mistake another's writer. */
static int holder_is_dead(const char *holder)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t n = strlen(host);
    if (!n || strncmp(holder, host, n) != 0 || holder[n] != ':')
        return 0;
    char *end;
    long pid = strtol(holder + n + 1, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid())
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static int s3_lock_take(ckpt_store *base, const char *name, ckpt_store_lock **out, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    s3_lock *l = calloc(1, sizeof *l);
    if (!l || !(l->key = s3_key(s, name)) || !(l->shown = store_display_name(base, name))) {
        if (l) {
            free(l->key);
            free(l);
        }
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    l->base.store = base;
    l->s = s;
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(l->holder, sizeof l->holder, "%s:%ld", host, (long)getpid());
    uint8_t rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(l->token, sizeof l->token, rnd, sizeof rnd);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);

    int rc = 0;
    long st = lock_put(l, "If-None-Match: *", err);
    if (st == 412) {
        /* Held, or left behind: read the lease. */
        char lease[512] = "";
        s3_req rq = {.method = "GET",
                     .bucket = s->url.bucket,
                     .key = l->key,
                     .dst = lease,
                     .dst_len = sizeof lease - 1};
        s3_resp rs;
        char holder[300] = "another writer", etag[80] = "";
        long long expires = 0;
        if (s3_request(s->http, &rq, &rs) == 0 && rs.status == 200 && !rs.overflow) {
            lease[rs.dst_got] = 0;
            const char *h = strstr(lease, "holder "), *e = strstr(lease, "expires ");
            if (h)
                sscanf(h + 7, "%299[^\n]", holder);
            if (e)
                expires = atoll(e + 8);
            snprintf(etag, sizeof etag, "%s", rs.etag);
        }
        s3_resp_free(&rs);
        long long now = (long long)time(NULL);
        if (expires > now && holder_is_dead(holder))
            expires = 0; /* a crashed writer of this host: no need to wait out its lease */
        if (expires > now || !etag[0]) {
            rc = ckpt_fail(err, -EBUSY,
                           "%s: locked by %s (lease ends in %lld s; one writer per "
                           "prefix)",
                           l->shown, holder, expires > now ? expires - now : 0);
        } else {
            st = lock_put_if_match(l, etag, err);
            if (st == 412)
                rc = ckpt_fail(err, -EBUSY,
                               "%s: locked by another writer (it took over the "
                               "expired lease of %s just now)",
                               l->shown, holder);
            else if (st != 200)
                rc = err && err->code ? err->code : -EIO;
        }
    } else if (st != 200) {
        rc = err && err->code ? err->code : -EIO;
    }
    if (rc == 0 && pthread_create(&l->renewer, NULL, lock_renewer, l) != 0)
        rc = ckpt_fail(err, -EAGAIN, "%s: cannot start the lease renewer", l->shown);
    l->running = rc == 0;
    if (rc == 0)
        s->lease = l;
    if (rc < 0) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l->key);
        free(l->shown);
        free(l);
        return rc;
    }
    *out = &l->base;
    return 0;
}

static void stop_renewer(s3_lock *l)
{
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->running)
        pthread_join(l->renewer, NULL);
    l->running = 0;
}

static void s3_unlock(ckpt_store_lock *base)
{
    s3_lock *l = (s3_lock *)base;
    stop_renewer(l);
    if (l->s->lease == l)
        l->s->lease = NULL;
    if (!l->lost) {
        /* Only our own lease: a DELETE cannot be conditional, so check first. */
        char lease[512], etag[80];
        int ours = lease_get(l, lease, sizeof lease, etag) && strstr(lease, l->token) != NULL;
        if (ours) {
            s3_resp rs;
            simple(l->s, "DELETE", l->key, NULL, &rs);
            s3_resp_free(&rs);
        }
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->key);
    free(l->shown);
    free(l);
}

/* A renewal under way finishes first (it is one PUT); the next one is
 * the child's, at once. */
static void s3_lock_before_fork(ckpt_store_lock *base)
{
    stop_renewer((s3_lock *)base);
}

/* Only this thread runs here: the lock's mutex and renewer are made anew
 * (the renewer was stopped before the fork, or never started). */
static int s3_lock_after_fork(ckpt_store_lock *base, ckpt_err *err)
{
    s3_lock *l = (s3_lock *)base;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->stop = 0;
    l->running = 0;
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(l->holder, sizeof l->holder, "%s:%ld", host, (long)getpid());
    char etag[80];
    snprintf(etag, sizeof etag, "%s", l->etag);
    long st = lock_put_if_match(l, etag, err);
    if (st != 200) {
        l->lost = 1;
        if (st == 412)
            return ckpt_fail(err, -EBUSY, "%s: the lease was taken over while starting", l->shown);
        return err && err->code ? err->code : -EIO;
    }
    if (pthread_create(&l->renewer, NULL, lock_renewer, l) != 0) {
        l->lost = 1;
        return ckpt_fail(err, -EAGAIN, "%s: cannot start the lease renewer", l->shown);
    }
    l->running = 1;
    return 0;
}

int s3_lease_check(s3_store *s, ckpt_err *err)
{
    s3_lock *l = s->lease;
    if (!l)
        return 0;
    pthread_mutex_lock(&l->mu);
    int lost = l->lost;
    int64_t age = boot_s() - l->put_at;
    pthread_mutex_unlock(&l->mu);
    char lease[512], etag[80];
    /* Not renewed for half the lease (the renewer runs every third): the
     * writer was paused or cut off, and another may have taken it over. */
    if (!lost && age >= LOCK_LEASE_S / 2 && lease_get(l, lease, sizeof lease, etag) &&
        !strstr(lease, l->token)) {
        const char *h = strstr(lease, "holder ");
        pthread_mutex_lock(&l->mu);
        l->lost = lost = 1;
        if (h)
            sscanf(h + 7, "%299[^\n]", l->taker);
        pthread_mutex_unlock(&l->mu);
    }
    if (!lost)
        return 0;
    pthread_mutex_lock(&l->mu);
    char taker[300];
    snprintf(taker, sizeof taker, "%s", l->taker[0] ? l->taker : "another writer");
    pthread_mutex_unlock(&l->mu);
    return ckpt_fail(err, -EBUSY,
                     "%s: this writer's lease was taken over by %s after it went %d s "
                     "without renewal (one writer per prefix): nothing more is written here; "
                     "unmount, and remount once that writer is done",
                     l->shown, taker, LOCK_LEASE_S);
}

/* ----------------------------------------------------------- stale uploads */

static int abort_upload(s3_store *s, const char *key, const char *id, ckpt_err *err)
{
    char *enc = s3_uri_encode(id, 0), *q = NULL;
    if (!enc || asprintf(&q, "uploadId=%s", enc) < 0) {
        free(enc);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    free(enc);
    s3_req rq = {.method = "DELETE", .bucket = s->url.bucket, .key = key, .query = q};
    s3_resp rs;
    int rc = s3_request(s->http, &rq, &rs);
    /* 404 NoSuchUpload: someone finished or aborted it first. */
    if (rc < 0 || (rs.status != 204 && rs.status != 200 && rs.status != 404)) {
        char what[1200];
        snprintf(what, sizeof what, "s3://%s/%s", s->url.bucket, key);
        rc = s3_fail(err, s->http, what, "aborting an unfinished upload", &rs);
    }
    s3_resp_free(&rs);
    free(q);
    return rc < 0 ? rc : 0;
}

long s3_abort_stale(ckpt_store *base, const char *name, uint64_t older_than_s, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    char *kp = s3_key(s, name ? name : ""), *pe = kp ? s3_uri_encode(kp, 0) : NULL;
    char *km = NULL, *um = NULL;
    int64_t cutoff = (int64_t)time(NULL) - (int64_t)older_than_s;
    long n = 0;
    int rc = pe ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    while (rc == 0) {
        char *q = NULL, *kme = km ? s3_uri_encode(km, 0) : NULL,
             *ume = um ? s3_uri_encode(um, 0) : NULL;
        if (asprintf(&q, "%s%s%sprefix=%s%s%s%suploads=", kme ? "key-marker=" : "", kme ? kme : "",
                     kme ? "&" : "", pe, ume ? "&upload-id-marker=" : "", ume ? ume : "", "&") < 0)
            q = NULL;
        free(kme);
        free(ume);
        if (!q) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        s3_req rq = {.method = "GET", .bucket = s->url.bucket, .query = q};
        s3_resp rs;
        s3_uploads ups = {0};
        rc = s3_request(s->http, &rq, &rs);
        free(q);
        if (rc == 0 && rs.status == 200 && !rs.overflow) {
            if ((rc = s3_xml_list_uploads(rs.body, rs.body_len, &ups, err)) < 0)
                ckpt_fail_prefix(err, base->where);
        } else {
            rc = s3_fail(err, s->http, base->where, "listing unfinished uploads", &rs);
        }
        s3_resp_free(&rs);
        for (size_t i = 0; rc == 0 && i < ups.n; i++) {
            if ((name ? strcmp(ups.v[i].key, kp) : strncmp(ups.v[i].key, kp, strlen(kp))) != 0 ||
                (older_than_s && ups.v[i].initiated > cutoff))
                continue;
            if ((rc = abort_upload(s, ups.v[i].key, ups.v[i].upload_id, err)) == 0)
                n++;
        }
        /* Markers that do not move would list the same page forever. */
        if (rc == 0 && ups.truncated && km && !strcmp(km, ups.next_key_marker) &&
            !strcmp(um ? um : "", ups.next_upload_id_marker ? ups.next_upload_id_marker : ""))
            rc = ckpt_fail(err, -EIO,
                           "%s: listing unfinished uploads: the server repeats its markers",
                           base->where);
        free(km);
        free(um);
        km = um = NULL;
        int more = rc == 0 && ups.truncated;
        if (more) {
            km = strdup(ups.next_key_marker);
            um = ups.next_upload_id_marker ? strdup(ups.next_upload_id_marker) : NULL;
            if (!km || (ups.next_upload_id_marker && !um)) {
                rc = ckpt_fail(err, -ENOMEM, "out of memory");
                more = 0;
            }
        }
        s3_uploads_free(&ups);
        if (!more)
            break;
    }
    free(km);
    free(um);
    free(pe);
    free(kp);
    return rc < 0 ? rc : n;
}

/* ------------------------------------------------------------------ store */

static int s3_create(ckpt_store *base, const char *name, const char *tmp_name, store_upload **out,
                     ckpt_err *err)
{
    return s3_upload_create((s3_store *)base, name, out, err);
}

static void s3_free(ckpt_store *base)
{
    s3_store *s = (s3_store *)base;
    s3_aborts_free(s);
    s3_client_free(s->http);
    s3_cache_free(s->cache);
    s3_url_free(&s->url);
    free(s->base.where);
    free(s);
}

static void s3_stats(ckpt_store *base, ckpt_store_cache_stats *out)
{
    s3_cache_stats(((s3_store *)base)->cache, out);
}

static int s3_reachable(ckpt_store *base, ckpt_err *err)
{
    s3_store *s = (s3_store *)base;
    return s3_client_reachable(s->http, s->base.where, err);
}

static const store_ops s3_ops = {
    .list = s3_list_objects,
    .open_read = s3_open_read,
    .create = s3_create,
    .remove = s3_remove,
    .remove_if = s3_remove_if,
    .rename = s3_rename,
    .lock = s3_lock_take,
    .unlock = s3_unlock,
    .lock_before_fork = s3_lock_before_fork,
    .lock_after_fork = s3_lock_after_fork,
    .free = s3_free,
    .abort_stale = s3_abort_stale,
    .cache_stats = s3_stats,
    .reachable = s3_reachable,
    .retry_aborts = s3_retry_aborts,
};

int store_s3_open(const char *url, const ckpt_store_opts *opts, ckpt_store **out, ckpt_err *err)
{
    *out = NULL;
    static const ckpt_store_opts none;
    if (!opts)
        opts = &none;
    if (opts->part_size_mib && (opts->part_size_mib < 8 || opts->part_size_mib > 64))
        return ckpt_fail(err, -EINVAL, "%s: part size %u MiB is not in 8..64", url,
                         opts->part_size_mib);
    if (opts->retry_seconds > 3600)
        return ckpt_fail(err, -EINVAL, "%s: retry time %u s is more than an hour", url,
                         opts->retry_seconds);
    if (opts->parts_in_flight > 16)
        return ckpt_fail(err, -EINVAL, "%s: %u parts in flight is more than 16", url,
                         opts->parts_in_flight);
    s3_store *s = calloc(1, sizeof *s);
    if (!s)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    s->base.ops = &s3_ops;
    pthread_mutex_init(&s->aborts_mu, NULL);
    /* 8 parts of 8 MiB in flight (the AWS CLI's part size): what is left
     * to send after the last chunk is encoded, which no encoding overlaps,
     * halves, for a little less memory (9 part buffers of 8 MiB against 5
     * of 16). Packing 710 MB to RGW on 2 shared cores, interleaved with
     * 4 x 16 MiB (load 6-9): medians 2.93 s and 2.97 s, within the noise;
     * peak RSS 105 MiB and 112 MiB. There the gateway's own CPU (1.8 s to
     * take in 475 MB) is the limit, not the parts in flight. */
    s->part_size = (opts->part_size_mib ? opts->part_size_mib : 8) << 20;
    s->parts_in_flight = opts->parts_in_flight ? opts->parts_in_flight : 8;
    s3_config cfg;
    int rc = s3_url_parse(url, &s->url, err);
    if (rc == 0 && asprintf(&s->base.where, "s3://%s%s%s", s->url.bucket,
                            s->url.prefix[0] ? "/" : "", s->url.prefix) < 0) {
        s->base.where = NULL;
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    }
    if (rc == 0 && (rc = s3_config_resolve(opts, &cfg, err)) < 0)
        ckpt_fail_prefix(err, url);
    if (rc == 0)
        rc = s3_client_new(&cfg, &s->http, err);
    if (rc == 0 && opts->retry_seconds) {
        s3_retry_policy p = s3_retry_default;
        p.deadline_ms = opts->retry_seconds * 1000u;
        s3_client_set_retry(s->http, &p);
    }
    if (rc == 0 && opts->cache_dir)
        rc = s3_cache_open(opts->cache_dir, opts->cache_bytes, &s->cache, err);
    if (rc == 0 && s->cache)
        s3_cache_set_warn(s->cache, opts->cache_warn, opts->cache_warn_ud);
    if (rc == 0) {
        /* One listing proves the endpoint, the keys and the bucket. */
        char *kp = s3_key(s, "");
        s3_list page;
        rc = kp ? list_page(s, kp, NULL, 1, "open", &page, err)
                : ckpt_fail(err, -ENOMEM, "out of memory");
        if (rc == 0)
            s3_list_free(&page);
        free(kp);
    }
    if (rc < 0) {
        s3_free(&s->base);
        return rc;
    }
    *out = &s->base;
    return 0;
}
