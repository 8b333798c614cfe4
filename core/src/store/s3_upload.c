/* A new S3 object, written sequentially and made visible whole by commit.
 *
 * Bytes collect in a part buffer. An object that ends before the first part
 * fills is sent with one PUT at commit. Otherwise the first full part
 * starts a multipart upload (CreateMultipartUpload) and each full part is
 * queued for background threads that PUT it (UploadPart); at most
 * parts_in_flight parts are queued or uploading, and the writer waits for a
 * free slot, so memory is bounded by (parts_in_flight + 1) part buffers.
 * Commit sends the last part, waits for all, and completes the upload
 * (CompleteMultipartUpload, whose 200 may still carry an <Error>): only then
 * is the object visible. A Complete left without a clear answer (lost,
 * a 5xx, NoSuchUpload to a retry) is judged by the object's ETag, which
 * S3 derives from the parts' MD5s. Abort, or any failure, aborts the upload
 * (AbortMultipartUpload), so nothing is left (an abort the gateway did not
 * answer is sent again by ckpt_store_retry_aborts); an upload left by a
 * crash is for ckpt_store_abort_stale_uploads.
 *
 * Parts: the store's part size (8 MiB by default) for parts 1..1000, then
 * doubling every 1000 parts up to 64 MiB, so the 10000 parts S3 allows
 * reach 8 + 16 + 32 + 7 * 64 = 504 GB before the upload is refused
 * (-EFBIG).
 *
 * What uploading costs the client, by thread (perf, a 475 MB pack to RGW on
 * 2 shared cores, 2026-11-27): 0.27-0.34 CPU-s of ckpt's 2.5-3.1, for the
 * copy into the part buffer, libcurl's copy into its send buffer, the sends
 * and the first touch of the part buffers; the gateway spends about 2 CPU-s
 * on the same bytes. The part buffer stays: a retry sends the part again
 * from it, and CURLOPT_POSTFIELDS would not save libcurl's copy (its
 * readmoredata copies a large body into the send buffer too). Nothing per
 * byte is hashed here (UNSIGNED-PAYLOAD, no Content-MD5): the pack's chunks
 * carry their own CRC or AEAD tag. Huge pages for the part buffers
 * (MADV_HUGEPAGE) cut the page faults of a pack from 25.9k to 7.5k but
 * saved only 0.03 CPU-s (medians of 4), so they are not asked for. */
#include "s3.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef CKPT_USE_OPENSSL
#include <openssl/evp.h>
#endif

#define MAX_PARTS 10000
#define PART_CAP (64u << 20)

typedef struct part {
    uint8_t *buf;
    size_t len, cap;
    unsigned num;
} part;

typedef struct s3_up {
    store_upload base;
    s3_store *s;
    char *key, *shown, *upload_id, *id_query_value; /* uploadId, URI-encoded */
    part cur;                                       /* being filled */
    unsigned next_num;                              /* number of cur */
    unsigned n_sent;                                /* parts handed to the threads */
    uint64_t total;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* queue changed, a part finished, stop */
    part *queue;       /* FIFO of parts_in_flight slots */
    size_t q_head, q_len;
    unsigned busy; /* parts queued or uploading */
    part *spare;   /* finished buffers for reuse */
    size_t n_spare;
    char (*etags)[80]; /* by part number - 1 */
    size_t etags_cap;
    pthread_t threads[16];
    unsigned n_threads;
    int stop, failed;
    ckpt_err fail_err;
} s3_up;

static size_t part_size_for(const s3_store *s, unsigned num)
{
    size_t sz = s->part_size;
    for (unsigned g = (num - 1) / 1000; g && sz < PART_CAP; g--)
        sz *= 2;
    return sz > PART_CAP && s->part_size <= PART_CAP ? PART_CAP : sz;
}

static void up_free(s3_up *u)
{
    free(u->cur.buf);
    for (size_t i = 0; i < u->q_len; i++)
        free(u->queue[(u->q_head + i) % u->s->parts_in_flight].buf);
    for (size_t i = 0; i < u->n_spare; i++)
        free(u->spare[i].buf);
    free(u->spare);
    free(u->queue);
    free(u->etags);
    free(u->key);
    free(u->shown);
    free(u->upload_id);
    free(u->id_query_value);
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->cv);
    free(u);
}

static void stop_threads(s3_up *u)
{
    pthread_mutex_lock(&u->mu);
    u->stop = 1;
    u->failed = 1; /* what is still queued is not sent */
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    for (unsigned i = 0; i < u->n_threads; i++)
        pthread_join(u->threads[i], NULL);
    u->n_threads = 0;
}

/* ------------------------------------------------------- the part threads */

static int put_part(s3_up *u, part *p, char etag[80], ckpt_err *err)
{
    char *q = NULL;
    if (asprintf(&q, "partNumber=%u&uploadId=%s", p->num, u->id_query_value) < 0)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    s3_req rq = {.method = "PUT",
                 .bucket = u->s->url.bucket,
                 .key = u->key,
                 .query = q,
                 .body = p->buf,
                 .body_len = p->len};
    s3_resp rs;
    int rc = s3_request(u->s->http, &rq, &rs);
    char what[64];
    snprintf(what, sizeof what, "upload of part %u", p->num);
    if (rc == 0 && rs.status == 200 && rs.etag[0])
        snprintf(etag, 80, "%s", rs.etag);
    else if (rc == 0 && rs.status == 200)
        rc = ckpt_fail(err, -EIO, "%s: %s failed: no ETag in the answer", u->shown, what);
    else
        rc = s3_fail(err, u->s->http, u->shown, what, &rs);
    s3_resp_free(&rs);
    free(q);
    return rc;
}

static void *part_thread(void *arg)
{
    s3_up *u = arg;
    pthread_mutex_lock(&u->mu);
    for (;;) {
        while (!u->q_len && !u->stop)
            pthread_cond_wait(&u->cv, &u->mu);
        if (!u->q_len)
            break;
        part p = u->queue[u->q_head];
        u->q_head = (u->q_head + 1) % u->s->parts_in_flight;
        u->q_len--;
        int skip = u->failed;
        pthread_mutex_unlock(&u->mu);
        char etag[80] = "";
        ckpt_err err = {0};
        int rc = skip ? 0 : put_part(u, &p, etag, &err);
        pthread_mutex_lock(&u->mu);
        if (rc < 0 && !u->failed) {
            u->failed = 1;
            u->fail_err = err;
        } else if (rc == 0 && !skip) {
            snprintf(u->etags[p.num - 1], 80, "%s", etag);
        }
        u->spare[u->n_spare++] = p; /* room: at most parts_in_flight + 1 buffers exist */
        u->busy--;
        pthread_cond_broadcast(&u->cv);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

/* ------------------------------------------------------------ the writer */

static int fail_upload(s3_up *u, ckpt_err *err)
{
    pthread_mutex_lock(&u->mu);
    int rc = u->fail_err.code ? u->fail_err.code : -EIO;
    if (err)
        *err = u->fail_err;
    pthread_mutex_unlock(&u->mu);
    return rc;
}

static int start_upload(s3_up *u, ckpt_err *err)
{
    s3_req rq = {.method = "POST", .bucket = u->s->url.bucket, .key = u->key, .query = "uploads="};
    s3_resp rs;
    int rc = s3_request(u->s->http, &rq, &rs);
    if (rc == 0 && rs.status == 200 && !rs.overflow) {
        if ((rc = s3_xml_upload_id(rs.body, rs.body_len, &u->upload_id, err)) < 0)
            ckpt_fail_prefix(err, u->shown);
    } else {
        rc = s3_fail(err, u->s->http, u->shown, "starting the multipart upload", &rs);
    }
    s3_resp_free(&rs);
    if (rc == 0 && !(u->id_query_value = s3_uri_encode(u->upload_id, 0)))
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    return rc;
}

/* Hands cur to the part threads and gives cur a fresh buffer (unless last). */
static int submit(s3_up *u, int last, ckpt_err *err)
{
    if (!u->upload_id) {
        int rc = start_upload(u, err);
        if (rc < 0)
            return rc;
    }
    if (u->cur.num > MAX_PARTS)
        return ckpt_fail(err, -EFBIG,
                         "%s: more than %d parts: the object is too large for "
                         "S3 at this part size",
                         u->shown, MAX_PARTS);
    pthread_mutex_lock(&u->mu);
    if (u->cur.num > u->etags_cap) {
        size_t cap = u->etags_cap ? u->etags_cap * 2 : 64;
        void *e = realloc(u->etags, cap * sizeof *u->etags);
        if (!e) {
            pthread_mutex_unlock(&u->mu);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        u->etags = e;
        memset(u->etags + u->etags_cap, 0, (cap - u->etags_cap) * sizeof *u->etags);
        u->etags_cap = cap;
    }
    while (u->busy >= u->s->parts_in_flight && !u->failed)
        pthread_cond_wait(&u->cv, &u->mu);
    if (u->failed) {
        pthread_mutex_unlock(&u->mu);
        return fail_upload(u, err);
    }
    u->queue[(u->q_head + u->q_len) % u->s->parts_in_flight] = u->cur;
    u->q_len++;
    u->busy++;
    u->n_sent = u->cur.num;
    memset(&u->cur, 0, sizeof u->cur);
    if (u->n_threads < u->busy && u->n_threads < u->s->parts_in_flight &&
        pthread_create(&u->threads[u->n_threads], NULL, part_thread, u) == 0)
        u->n_threads++;
    pthread_cond_broadcast(&u->cv);
    int rc = 0;
    if (!u->n_threads)
        rc = ckpt_fail(err, -EAGAIN, "%s: cannot start upload threads", u->shown);
    /* The next buffer: a spare one big enough, else a new one. */
    u->next_num++;
    size_t want = part_size_for(u->s, u->next_num);
    for (size_t i = u->n_spare; rc == 0 && !last && !u->cur.buf && i-- > 0;) {
        part sp = u->spare[i];
        u->spare[i] = u->spare[--u->n_spare];
        if (sp.cap >= want)
            u->cur = sp;
        else
            free(sp.buf); /* parts grew: never big enough again */
    }
    pthread_mutex_unlock(&u->mu);
    if (rc == 0 && !last && !u->cur.buf) {
        if (!(u->cur.buf = malloc(want)))
            return ckpt_fail(err, -ENOMEM, "%s: out of memory for a %zu MiB part", u->shown,
                             want >> 20);
        u->cur.cap = want;
    }
    u->cur.len = 0;
    u->cur.num = u->next_num;
    return rc;
}

static int up_write(store_upload *su, const void *buf, size_t len, ckpt_err *err)
{
    s3_up *u = (s3_up *)su;
    const uint8_t *p = buf;
    while (len) {
        if (!u->cur.buf) {
            size_t want = part_size_for(u->s, u->cur.num);
            if (!(u->cur.buf = malloc(want)))
                return ckpt_fail(err, -ENOMEM, "%s: out of memory for a part", u->shown);
            u->cur.cap = want;
        }
        size_t n = u->cur.cap - u->cur.len < len ? u->cur.cap - u->cur.len : len;
        memcpy(u->cur.buf + u->cur.len, p, n);
        u->cur.len += n;
        u->total += n;
        p += n;
        len -= n;
        if (u->cur.len == u->cur.cap) {
            int rc = submit(u, 0, err);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* An abort that got no answer: sent again by s3_retry_aborts. */
typedef struct s3_abort_due {
    struct s3_abort_due *next;
    char *key, *id_query_value;
} s3_abort_due;

/* 1 when the upload is gone (aborted now, or already: NoSuchUpload), 0
 * when the gateway gave no answer worth trusting (none, or one it gives
 * for "try later": 5xx, 429, 408), -1 when it refused for good (403). */
static int send_abort(s3_store *s, const char *key, const char *id_query_value)
{
    char *q = NULL;
    if (asprintf(&q, "uploadId=%s", id_query_value) < 0)
        return 0;
    s3_req rq = {.method = "DELETE", .bucket = s->url.bucket, .key = key, .query = q};
    s3_resp rs;
    int rc = s3_request(s->http, &rq, &rs);
    int gone = rc == 0 && ((rs.status >= 200 && rs.status < 300) || rs.status == 404);
    int later = !gone && (rc < 0 || s3_retryable(rs.status, 0));
    s3_resp_free(&rs);
    free(q);
    return gone ? 1 : later ? 0 : -1;
}

static void abort_later(s3_store *s, const char *key, const char *id_query_value)
{
    s3_abort_due *d = calloc(1, sizeof *d);
    if (d && (d->key = strdup(key)) && (d->id_query_value = strdup(id_query_value))) {
        pthread_mutex_lock(&s->aborts_mu);
        d->next = s->aborts_due;
        s->aborts_due = d;
        pthread_mutex_unlock(&s->aborts_mu);
        return;
    }
    if (d)
        free(d->key);
    free(d); /* out of memory: the next writable mount's abort_stale finds it */
}

long s3_retry_aborts(ckpt_store *base)
{
    s3_store *s = (s3_store *)base;
    pthread_mutex_lock(&s->aborts_mu);
    s3_abort_due *todo = s->aborts_due;
    s->aborts_due = NULL;
    pthread_mutex_unlock(&s->aborts_mu);
    long left = 0;
    while (todo) {
        s3_abort_due *d = todo;
        todo = d->next;
        /* A refusal for good (403) is left to the next writable mount's
         * abort_stale, as an upload of a crashed writer is. The first
         * "later" ends the round with the rest unsent: against a gateway
         * that answers 503 to everything each abort would wait out its
         * retries (30 s), and a round of many would hold up the packer
         * and the next upload for minutes. */
        if (send_abort(s, d->key, d->id_query_value) == 0) {
            d->next = todo;
            todo = NULL;
            s3_abort_due *last = d;
            for (left = 1; last->next; last = last->next)
                left++;
            pthread_mutex_lock(&s->aborts_mu);
            last->next = s->aborts_due;
            s->aborts_due = d;
            for (s3_abort_due *x = last->next; x; x = x->next)
                left++;
            pthread_mutex_unlock(&s->aborts_mu);
            break;
        }
        free(d->key);
        free(d->id_query_value);
        free(d);
    }
    return left;
}

void s3_aborts_free(s3_store *s)
{
    s3_abort_due *d = s->aborts_due;
    while (d) {
        s3_abort_due *next = d->next;
        free(d->key);
        free(d->id_query_value);
        free(d);
        d = next;
    }
    s->aborts_due = NULL;
    pthread_mutex_destroy(&s->aborts_mu);
}

/* An upload fails mostly because the gateway stopped answering, and then
 * so does its abort: it is kept and sent again once the gateway answers,
 * so that no upload outlives an outage (its parts are stored, and billed,
 * until aborted). */
static void up_abort(store_upload *su)
{
    s3_up *u = (s3_up *)su;
    if (!u)
        return;
    stop_threads(u);
    if (u->upload_id && send_abort(u->s, u->key, u->id_query_value) == 0)
        abort_later(u->s, u->key, u->id_query_value);
    up_free(u);
}

/* After the request that makes the object (the PUT, or the Complete):
 * one refused unsent while the gateway is down (no attempt) committed
 * nothing, and a try per refusal would push out the one that did. */
static void note_sent(s3_up *u, const s3_resp *rs)
{
    if (u->base.commit_sent && rs->attempts > 0)
        *u->base.commit_sent = 1;
}

static int put_whole(s3_up *u, ckpt_err *err)
{
    s3_req rq = {.method = "PUT",
                 .bucket = u->s->url.bucket,
                 .key = u->key,
                 .body = u->cur.buf ? u->cur.buf : (const uint8_t *)"",
                 .body_len = u->cur.len};
    s3_resp rs;
    int rc = s3_request(u->s->http, &rq, &rs);
    note_sent(u, &rs);
    if (rc < 0 || rs.status != 200)
        rc = s3_fail(err, u->s->http, u->shown, "upload", &rs);
    s3_resp_free(&rs);
    return rc;
}

/* The ETag S3 and RGW give a completed multipart object: the MD5 of the
 * parts' binary MD5s (their ETags), "-", the number of parts. It tells our
 * object from an older one under the key, which a same-size replacement
 * matches in size. 0 and out ("<32 hex>-<n>", unquoted), or -1 when it is
 * unknown: a part's ETag is no plain MD5 (SSE-KMS, some gateways), or the
 * library is built without libcrypto. */
static int expected_etag(const s3_up *u, char out[48])
{
#ifdef CKPT_USE_OPENSSL
    size_t n = u->n_sent;
    uint8_t *md5s = malloc(n * 16 + 1), sum[EVP_MAX_MD_SIZE];
    unsigned sum_len = 0;
    int ok = md5s != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        const char *e = u->etags[i];
        size_t len = strlen(e);
        if (len == 34 && e[0] == '"' && e[33] == '"')
            e++, len -= 2;
        ok = len == 32 && strspn(e, "0123456789abcdefABCDEF") == 32;
        for (size_t j = 0; ok && j < 16; j++) {
            char byte[3] = {e[2 * j], e[2 * j + 1], 0};
            md5s[i * 16 + j] = (uint8_t)strtoul(byte, NULL, 16);
        }
    }
    ok = ok && EVP_Digest(md5s, n * 16, sum, &sum_len, EVP_md5(), NULL) == 1 && sum_len == 16;
    for (unsigned j = 0; ok && j < 16; j++)
        snprintf(out + 2 * j, 3, "%02x", sum[j]);
    if (ok)
        snprintf(out + 32, 16, "-%zu", n);
    free(md5s);
    return ok ? 0 : -1;
#else
    (void)u;
    (void)out;
    return -1;
#endif
}

/* Whether a Complete we got no clear answer to made our object after all:
 * its answer lost, a 5xx, or NoSuchUpload to a retry (the first try may
 * have taken effect). The object under the key must have the ETag our
 * parts give; without that ETag, an object of our size is taken as ours
 * only when size_will_do (after NoSuchUpload: the upload is surely gone),
 * never after a mere transport error. A first try may still be assembling
 * a large object (our tries gave up on its slow answer): with the ETag
 * known, the object is looked at four times over about a quarter of the
 * retry deadline (7 s of the default 30). */
static int completed_anyway(s3_up *u, int size_will_do)
{
    char want[48];
    int known = expected_etag(u, want) == 0;
    if (!known && !size_will_do)
        return 0;
    static const unsigned waits_in_30ths[] = {0, 1, 2, 4};
    unsigned deadline_ms = s3_client_retry(u->s->http)->deadline_ms;
    int ok = 0;
    for (size_t i = 0; !ok && i < (known ? 4u : 1u); i++) {
        unsigned ms = deadline_ms / 30 * waits_in_30ths[i];
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        s3_req rq = {.method = "HEAD", .bucket = u->s->url.bucket, .key = u->key, .patient = 1};
        s3_resp rs;
        ok = s3_request(u->s->http, &rq, &rs) == 0 && rs.status == 200 && rs.has_length &&
             rs.content_length == u->total && (!known || s3_etag_equal(rs.etag, want));
        s3_resp_free(&rs);
    }
    return ok;
}

static int complete(s3_up *u, ckpt_err *err)
{
    size_t n = u->n_sent;
    size_t cap = 128 + n * 140;
    char *xml = malloc(cap), *q = NULL;
    if (!xml || asprintf(&q, "uploadId=%s", u->id_query_value) < 0) {
        free(xml);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    size_t len = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag></Part>", i + 1,
                                u->etags[i]);
    len += (size_t)snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
    const char *hdrs[] = {"Content-Type: application/xml", NULL};
    s3_req rq = {.method = "POST",
                 .bucket = u->s->url.bucket,
                 .key = u->key,
                 .query = q,
                 .headers = hdrs,
                 .body = xml,
                 .body_len = len};
    s3_resp rs;
    int rc = s3_request(u->s->http, &rq, &rs);
    note_sent(u, &rs);
    if (rc == 0 && rs.status == 200 && !rs.overflow) {
        s3_error e;
        int r = s3_xml_complete(rs.body, rs.body_len, "CompleteMultipartUploadResult", &e, err);
        /* An <Error> in a 200 (InternalError: "retry") may follow a
         * first try that took effect too. */
        if (r == 1 && !completed_anyway(u, 0))
            rc = ckpt_fail(err, -EIO, "%s: completing the upload failed: %s%s%s", u->shown, e.code,
                           e.message[0] ? ": " : "", e.message);
        else if (r < 0)
            rc = ckpt_fail_prefix(err, u->shown);
    } else if (rc == 0 && rs.status == 404 && rs.attempts > 1) {
        /* Judged by the object once, however long that takes: not twice. */
        rc = completed_anyway(u, 1)
                 ? 0
                 : s3_fail(err, u->s->http, u->shown, "completing the upload", &rs);
    } else if (((rc == -EIO && rs.status == 0) || (rc == 0 && rs.status >= 500) ||
                (rc == 0 && rs.attempts > 1)) &&
               completed_anyway(u, 0)) {
        /* No answer, a 5xx, or any refusal of a retry (InvalidPart from
         * a gateway whose first try completed): judged by the object. */
        rc = 0;
    } else {
        rc = s3_fail(err, u->s->http, u->shown, "completing the upload", &rs);
    }
    s3_resp_free(&rs);
    free(q);
    free(xml);
    return rc;
}

static int up_commit(store_upload *su, ckpt_err *err)
{
    s3_up *u = (s3_up *)su;
    int rc;
    if ((rc = s3_lease_check(u->s, err)) < 0) {
        up_abort(su);
        return rc;
    }
    if (!u->upload_id) {
        rc = put_whole(u, err);
        if (rc < 0) {
            up_abort(su);
            return rc;
        }
        up_free(u);
        return 0;
    }
    /* The last part; an empty one after the last full part is not sent. */
    if (u->cur.len && (rc = submit(u, 1, err)) < 0) {
        up_abort(su);
        return rc;
    }
    pthread_mutex_lock(&u->mu);
    while (u->busy)
        pthread_cond_wait(&u->cv, &u->mu);
    int failed = u->failed;
    pthread_mutex_unlock(&u->mu);
    if (failed) {
        rc = fail_upload(u, err);
        up_abort(su);
        return rc;
    }
    stop_threads(u);
    if ((rc = complete(u, err)) < 0) {
        up_abort(su);
        return rc;
    }
    up_free(u);
    return 0;
}

static const store_upload_ops up_ops = {up_write, up_commit, up_abort};

int s3_upload_create(s3_store *s, const char *name, store_upload **out, ckpt_err *err)
{
    int rc = s3_lease_check(s, err);
    if (rc < 0)
        return rc;
    /* A new try of a pack an outage failed cleans up after the old one. */
    s3_retry_aborts(&s->base);
    s3_up *u = calloc(1, sizeof *u);
    if (!u)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    u->base.ops = &up_ops;
    u->s = s;
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->cv, NULL);
    u->next_num = 1;
    u->cur.num = 1;
    u->key = s3_key(s, name);
    u->shown = store_display_name(&s->base, name);
    u->queue = calloc(s->parts_in_flight, sizeof *u->queue);
    u->spare = calloc(s->parts_in_flight + 2, sizeof *u->spare);
    if (!u->key || !u->shown || !u->queue || !u->spare) {
        up_free(u);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    *out = &u->base;
    return 0;
}
