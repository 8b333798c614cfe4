/* The S3 backend's parts, private to core/src/store (and its unit tests and
 * fuzz target). One job per file:
 *
 *   s3_config.c  s3://BUCKET/PREFIX, the options, and the AWS way of finding
 *                the endpoint, the region and the credentials
 *   s3_xml.c     the XML the server answers with (libxml2), bounded and
 *                validated; nothing here touches the network
 *   s3_http.c    requests: a pool of kept-alive libcurl handles, SigV4 by
 *                libcurl (CURLOPT_AWS_SIGV4), retries with backoff, and the
 *                mapping of failures to errno values and messages
 *   s3_upload.c  a new object: a single PUT when small, else a multipart
 *                upload streamed in parts from background threads
 *   s3_readahead.c  sequential readers: segments ahead fetched by parallel
 *                ranged GETs
 *   s3_outage.c  the gateway marked down after a request got no answer:
 *                others fail at once until a probe finds it back
 *   s3.c         the store itself: list, ranged reads, remove, rename, lock,
 *                and the cleanup of abandoned uploads
 *
 * Secrets (the secret key, the session token) live only in s3_config and in
 * the handle options libcurl is given; no message ever contains them
 * (s3_scrub() is the last line of defence for what a server echoes). */
#ifndef CKPT_S3_H
#define CKPT_S3_H

#include "store.h"

#include <pthread.h>

/* ------------------------------------------------------------ config */

typedef struct s3_url {
    char *bucket;
    char *prefix; /* "" or "a/b": no leading or trailing '/' */
} s3_url;

/* "s3://BUCKET[/PREFIX[/]]". -EINVAL with a message naming the URL. */
int s3_url_parse(const char *url, s3_url *out, ckpt_err *err);
void s3_url_free(s3_url *u);

typedef struct s3_config {
    char *endpoint; /* "http[s]://host[:port][/path]", no trailing '/' */
    char *region;
    char *access_key;
    char *secret_key;    /* secret: wiped on free */
    char *session_token; /* secret, or NULL */
    char *ca_bundle;     /* PEM file of CAs to trust for https, or NULL */
    char source[160];    /* where the credentials came from, for messages */
} s3_config;

/* Resolves the endpoint, region and credentials:
 *   endpoint: opts, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 *             endpoint_url in the config file, https://s3.REGION.amazonaws.com
 *   region:   opts, AWS_REGION, AWS_DEFAULT_REGION, the profile's region,
 *             us-east-1
 *   CAs:      AWS_CA_BUNDLE, the profile's ca_bundle, else the system's
 *   keys:     with an explicit profile option, that profile; else
 *             AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
 *             else the profile AWS_PROFILE (or "default") from
 *             AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then
 *             AWS_CONFIG_FILE (~/.aws/config, section "[profile NAME]").
 * -EACCES when no credentials are found, -EINVAL for a bad endpoint. */
int s3_config_resolve(const ckpt_store_opts *opts, s3_config *out, ckpt_err *err);
void s3_config_free(s3_config *c);

/* The value of key in [section] of an INI file such as ~/.aws/credentials:
 * 1 and *out (malloc'd), 0 when absent, -errno when unreadable (a missing
 * file is absent). Comments ('#', ';'), blank lines and spaces around '='
 * are allowed. */
int s3_ini_get(const char *path, const char *section, const char *key, char **out);

/* AWS URI encoding (RFC 3986 unreserved characters kept; '/' kept when
 * keep_slash), malloc'd; NULL when out of memory. */
char *s3_uri_encode(const char *s, int keep_slash);

/* ------------------------------------------------------------- XML */

/* Responses larger than this are refused, never parsed. */
#define S3_XML_MAX (4u << 20)

typedef struct s3_error {
    char code[64];     /* "NoSuchBucket", ... ("" when none) */
    char message[200]; /* the server's words, scrubbed of control bytes */
} s3_error;

/* 1 and *out filled when body is an <Error> document, 0 when it is some
 * other well-formed document (or empty), -EINVAL when it is not XML. */
int s3_xml_error(const char *body, size_t len, s3_error *out);

typedef struct s3_entry {
    char *key;
    uint64_t size;
    int64_t mtime; /* seconds since the epoch */
    char etag[80]; /* as the server quotes it */
    int is_prefix; /* a CommonPrefixes entry: key ends in '/', no size */
} s3_entry;

typedef struct s3_list {
    s3_entry *v;
    size_t n;
    int truncated;
    char *next_token; /* NextContinuationToken, when truncated */
} s3_list;

/* ListObjectsV2 (ListBucketResult): Contents, then CommonPrefixes (is_prefix). 0 or
 * -EINVAL with err saying what is wrong. */
int s3_xml_list_objects(const char *body, size_t len, s3_list *out, ckpt_err *err);
void s3_list_free(s3_list *l);

/* InitiateMultipartUploadResult: the UploadId (malloc'd). */
int s3_xml_upload_id(const char *body, size_t len, char **out, ckpt_err *err);

/* CompleteMultipartUpload's answer, which can be an <Error> inside a 200:
 * 0 for a CompleteMultipartUploadResult, 1 with *e for an error, -EINVAL
 * for anything else. Also used for CopyObject (CopyObjectResult). */
int s3_xml_complete(const char *body, size_t len, const char *root, s3_error *e, ckpt_err *err);

typedef struct s3_upload_info {
    char *key, *upload_id;
    int64_t initiated;
} s3_upload_info;

typedef struct s3_uploads {
    s3_upload_info *v;
    size_t n;
    int truncated;
    char *next_key_marker, *next_upload_id_marker;
} s3_uploads;

/* ListMultipartUploadsResult. */
int s3_xml_list_uploads(const char *body, size_t len, s3_uploads *out, ckpt_err *err);
void s3_uploads_free(s3_uploads *u);

/* "2024-05-01T12:00:00.000Z" (ISO 8601, UTC) or "Wed, 01 May 2024 12:00:00
 * GMT" (HTTP date): 0 and *out, or -EINVAL. */
int s3_parse_time(const char *s, int64_t *out);

/* --------------------------------------------------------- retries */

typedef struct s3_retry_policy {
    unsigned max_attempts; /* including the first */
    unsigned base_ms;      /* the first delay; doubles each time */
    unsigned cap_ms;       /* no single delay longer */
    unsigned deadline_ms;  /* no retry starts later than this after the first try */
} s3_retry_policy;

/* 7 attempts, 250 ms doubling to at most 8 s, within 30 s. */
extern const s3_retry_policy s3_retry_default;

/* Whether an outcome is worth another try: HTTP 5xx, 429 and 408, or a
 * transport failure (status 0 with a connection, timeout or transfer
 * error from libcurl). */
int s3_retryable(long status, int curl_code);

/* The delay before the next attempt after `attempts` have failed, elapsed_ms
 * after the first began: base * 2^(attempts-1), capped, times a jitter
 * factor in [0.5, 1); -1 when the count or the deadline is spent. */
long s3_retry_delay(const s3_retry_policy *p, unsigned attempts, uint64_t elapsed_ms,
                    double jitter);

/* ----------------------------------------------- outage (s3_outage.c) */

/* After a request got no answer (its retries spent), others fail at once
 * for this long; then one request probes the gateway first. As long as a
 * mount's back-off of a pack that failed to open (fs/read/checkpoints.c),
 * so a gateway back in service is seen as soon. */
#define S3_OUTAGE_BACKOFF_MS 2000
/* The probe: a HEAD of the bucket, one try, at most this long in all (a
 * stopped gateway accepts the connection and never answers). */
#define S3_OUTAGE_PROBE_MS 3000

typedef struct s3_outage {
    pthread_mutex_t mu;
    int down;             /* the last request that went got no answer */
    int probing;          /* a probe is under way */
    uint64_t since_ms;    /* when the request that found it down began */
    uint64_t probe_at_ms; /* no probe before */
    uint64_t answer_ms;   /* the last answer to a request or a probe */
    char why[160];        /* libcurl's words for the last failure */
} s3_outage;

void s3_outage_init(s3_outage *o);
void s3_outage_destroy(s3_outage *o);
enum { S3_OUTAGE_GO, S3_OUTAGE_PROBE, S3_OUTAGE_REFUSE };
/* Before a request at now_ms: S3_OUTAGE_GO (not known down), S3_OUTAGE_PROBE
 * (the back-off is over and no probe is under way: probe, then call
 * s3_outage_probed), or S3_OUTAGE_REFUSE with why (cap bytes, may be NULL)
 * saying for how long there was no answer and what the last failure was. */
int s3_outage_admit(s3_outage *o, uint64_t now_ms, char *why, size_t cap);
/* The probe's outcome; when it got no answer, what (libcurl's words) and
 * why filled as by a refusal. */
void s3_outage_probed(s3_outage *o, int answered, const char *what, uint64_t now_ms, char *why,
                      size_t cap);
/* After a request that went, begun at began_ms: silent when it got no
 * answer after its retries, nor the probe begun at probe_ms that checked
 * (marks down since began_ms, unless down already; the back-off from
 * now_ms), else clears the mark. A silent note is ignored when another
 * request or probe got an answer since probe_ms: the gateway came back
 * meanwhile. */
void s3_outage_note(s3_outage *o, int silent, const char *what, uint64_t began_ms,
                    uint64_t probe_ms, uint64_t now_ms);
int s3_outage_is_down(s3_outage *o);

/* ------------------------------------------------------------ HTTP */

typedef struct s3_client s3_client;

/* Takes cfg (moved: *cfg is emptied). */
int s3_client_new(s3_config *cfg, s3_client **out, ckpt_err *err);
void s3_client_free(s3_client *c);
const s3_config *s3_client_config(const s3_client *c);
/* The policy of requests that name none (default: s3_retry_default). */
void s3_client_set_retry(s3_client *c, const s3_retry_policy *p);
const s3_retry_policy *s3_client_retry(const s3_client *c);

#define S3_PROGRESS_STEP (256u << 10)

struct s3_resp;

typedef struct s3_req {
    const char *method; /* GET HEAD PUT POST DELETE */
    const char *bucket;
    const char *key;            /* unencoded; NULL: the bucket itself */
    const char *query;          /* canonical: sorted, encoded, "k=v&..." */
    const char *const *headers; /* "Name: value", NULL-terminated, or NULL */
    const void *body;           /* request body (PUT, POST) */
    size_t body_len;
    void *dst; /* 2xx body into dst[0..dst_len) (ranged reads) */
    size_t dst_len;
    /* With dst: told as the 2xx body arrives (every S3_PROGRESS_STEP bytes
     * or so, and at its end), rs holding the headers and dst_got, so that
     * the bytes in dst can be used before the transfer ends. It returns 1
     * when it took the bytes so far as final (a retry keeps them), 0 when
     * it cannot judge them yet (a retry writes them again), negative when
     * the answer is not the one asked for (ends it as an overflow).
     * Set only where every try must return the same bytes (If-Match): a
     * retry then skips what an earlier try told, never writing over bytes
     * that readers may be copying. */
    int (*progress)(void *ud, const struct s3_resp *rs);
    void *progress_ud;
    /* With dst: a GET of bytes [range_off, range_off + dst_len), whose
     * Range header is made here, so that a retry asks only for the bytes
     * after those an earlier try told (progress) rather than for all of
     * them again; the try's answer must then be their range (rs->dst_from
     * says where it starts). */
    int ranged;
    uint64_t range_off;
    /* Asked while the request runs (during a transfer, between tries):
     * nonzero abandons it, with no more tries, as -ECANCELED (the readahead
     * being closed: it used to wait for a hung GET and all its retries). */
    int (*cancelled)(void *ud);
    void *cancel_ud;
    const s3_retry_policy *retry; /* NULL: the client's */
    unsigned timeout_ms;          /* each attempt at most this long; 0: no bound */
    /* Rides out an outage: neither refused while the gateway is marked
     * down nor cut short when it is marked down meanwhile, but retried
     * as the policy says. For what must not fail merely because other
     * requests found the gateway silent: renewing the write lease, the
     * HEADs that judge whether a Complete whose answer was lost took. */
    int patient;
} s3_req;

typedef struct s3_resp {
    long status; /* 0: no HTTP answer (transport failure) */
    char *body;  /* captured body (non-2xx, or 2xx without dst), NUL-ended */
    size_t body_len;
    size_t dst_got;  /* bytes of dst written, by this try or told by earlier ones */
    size_t dst_from; /* rq->ranged: this try's range starts at dst[dst_from] */
    size_t dst_told; /* of them, told to rq->progress, which accepted the answer */
    int overflow;    /* the body did not fit dst or S3_XML_MAX */
    char etag[80];
    uint64_t content_length;
    int has_length;
    char content_range[96];
    int64_t last_modified;
    int curl_code;
    char curl_msg[160];
    unsigned attempts;
} s3_resp;

/* Performs rq, retrying what s3_retryable() allows under rq->retry. 0 when
 * an HTTP answer came (any status: look at rs->status), -EIO when none did;
 * -ENOMEM; -ECANCELED when rq->cancelled said so (not noted as an outage). rs is always filled; free it with s3_resp_free. While the
 * gateway is marked down (s3_outage.c) -EIO at once, with rs->attempts 0
 * and rs->curl_msg saying since when; retries stop when another request
 * marks it down meanwhile. A request that got no answer marks it down
 * when a probe (one HEAD of the endpoint, S3_OUTAGE_PROBE_MS at most) gets
 * none either. */
int s3_request(s3_client *c, const s3_req *rq, s3_resp *rs);
void s3_resp_free(s3_resp *rs);

/* A failed answer as an errno and a message "<what>: <action> failed: ...":
 * 403 InvalidAccessKeyId/SignatureDoesNotMatch/AccessDenied -> -EACCES,
 * 404 NoSuchBucket/NoSuchKey -> -ENOENT, 412 -> -ESTALE, others -> -EIO
 * with the HTTP status, the server's code and the attempts made. */
int s3_fail(ckpt_err *err, const s3_client *c, const char *what, const char *action,
            const s3_resp *rs);

/* 0 when the gateway is not known to be down (no request is made then),
 * else -EIO (transient) with err naming where and since when; probes it
 * first when the back-off is over, so a caller that polls sees it back. */
int s3_client_reachable(s3_client *c, const char *where, ckpt_err *err);

/* Replaces any occurrence of the client's secret key, session token and
 * access key in err's message with "[redacted]". */
void s3_scrub(const s3_client *c, ckpt_err *err);

/* ----------------------------------------------------------- store */

/* ---------------------------------------------------- local cache (s3_cache.c) */

typedef struct s3_cache s3_cache;
#define S3_CACHE_TAG_LEN 33 /* 32 hex digits and the NUL */

/* dir created mode 0700 if missing; refused unless ours and not writable
 * by others. max_bytes 0: 10 GiB. */
int s3_cache_open(const char *dir, uint64_t max_bytes, s3_cache **out, ckpt_err *err);
void s3_cache_free(s3_cache *c);
/* fn (ckpt_store_opts.cache_warn) is called once, at the first put that
 * fails, with a line naming the directory and the cause. */
void s3_cache_set_warn(s3_cache *c, void (*fn)(void *ud, const char *msg), void *ud);
/* The name of one version of an object in the cache; -1 without an ETag
 * (then it is not cached). */
int s3_cache_tag(const char *bucket, const char *key, const char *etag, char out[S3_CACHE_TAG_LEN]);
/* 1 and buf filled when the range is cached, else 0: its own entry, or
 * (seg not 0) the parts of the entries of the segments that hold it, the
 * object cut in seg bytes each from 0 and the last ending at size (the
 * readahead's), one segment or several. Counts one hit or one miss. A
 * damaged entry is a miss. Thread-safe. */
int s3_cache_get(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len, uint64_t seg,
                 uint64_t size);
/* 1 and buf filled when [off, off + len) is cached: its own entry, or
 * the entries of its parts (a segment whose chunks were cached one by one
 * before the readahead started). Else 0, buf holding what the cache has
 * and gaps the spans it lacks, the bytes to fetch: up to max of them,
 * left to right (*n_gaps; 0 when it returns 1), the last taking in any
 * beyond. Counts one hit or one miss. Thread-safe. */
typedef struct s3_span {
    uint64_t off;
    size_t len;
} s3_span;
int s3_cache_fill_gaps(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len,
                       s3_span *gaps, size_t max, size_t *n_gaps);
/* 1 when s3_cache_get of the range would find its files (it may still
 * find them damaged), without reading them or counting anything. */
int s3_cache_holds(s3_cache *c, const char *tag, uint64_t off, size_t len, uint64_t seg,
                   uint64_t size);
/* Keeps a range just read from the store; failures only cost a later miss. */
void s3_cache_put(s3_cache *c, const char *tag, uint64_t off, const void *buf, size_t len);
/* The same, for a range of which fetched bytes came from the store (the
 * rest from the cache: s3_cache_fill_gaps). */
void s3_cache_keep(s3_cache *c, const char *tag, uint64_t off, const void *buf, size_t len,
                   size_t fetched);
void s3_cache_stats(s3_cache *c, ckpt_store_cache_stats *out);

/* ----------------------------------------------- readahead (s3_readahead.c) */

typedef struct s3_ra s3_ra;
/* Reads bytes [off + skip, off + len) into buf + skip (a ranged GET
 * carrying the object's If-Match, or the cache's file of the segment): len,
 * or -errno. buf[0, skip) is not wanted (the readers read it themselves
 * before the readahead started) but may be filled all the same.
 * buf is aligned to S3_RA_ALIGN, so the cache may read into it directly.
 * While it runs it may call s3_ra_arrived(seg, n) to say that buf[0, n)
 * holds its final bytes, which readers may then use (n only grows; bytes
 * told are never written again, a retry included). */
#define S3_RA_ALIGN 4096
typedef ssize_t (*s3_ra_fetch_fn)(void *ud, void *buf, size_t len, uint64_t off, size_t skip,
                                  void *seg, ckpt_err *err);
void s3_ra_arrived(void *seg, size_t n);
/* Nonzero once the readahead of seg's fetch is being freed: the fetch
 * should give up (s3_req.cancelled). */
int s3_ra_cancelled(void *seg);
typedef struct s3_ra_stats {
    uint64_t hits, misses;            /* reads served from segments, reads left to the caller */
    uint64_t segments, bytes, failed; /* segment GETs made, bytes they brought, failures */
    uint64_t early; /* of the hits, reads served while their segment was still arriving */
} s3_ra_stats;

/* Readahead over an object of size bytes, fetched with fetch(ud, ...). */
int s3_ra_new(uint64_t size, s3_ra_fetch_fn fetch, void *ud, s3_ra **out);
/* Abandons in-flight fetches (s3_ra_cancelled) and waits for them to
 * return; NULL is fine. */
void s3_ra_free(s3_ra *ra);
/* 1 with buf filled from fetched segments; 0 when the caller must read the
 * range itself (not a sequential reader, or a segment that had failed
 * already or quickly: the caller's own GET then reports why); -errno when
 * the read waited for a segment whose fetch failed after a second or more
 * without bytes (its retries spent: a GET of its own would only spend as
 * many again).
 * Thread-safe. */
int s3_ra_read(s3_ra *ra, void *buf, size_t len, uint64_t off);
/* s3_ra_read without the copy where it can: 1 with *data the bytes, in a
 * segment that stays pinned until s3_ra_release(ra, *hold) when the range
 * lies in one (*hold not NULL), else copied into buf (*hold NULL); 0 or
 * -errno (with err, which may be NULL, saying why) as s3_ra_read.
 * Thread-safe. */
int s3_ra_borrow(s3_ra *ra, void *buf, size_t len, uint64_t off, const void **data, void **hold,
                 ckpt_err *err);
void s3_ra_release(s3_ra *ra, void *hold);
/* The size of the segments the object is read ahead in (the last one
 * ends at the object's end), or 0 for an object not read ahead at all. */
uint64_t s3_ra_segment_size(const s3_ra *ra);
void s3_ra_get_stats(s3_ra *ra, s3_ra_stats *out);

/* ----------------------------------------------------------- store */

typedef struct s3_store {
    ckpt_store base;
    s3_client *http;
    s3_cache *cache; /* NULL: none */
    s3_url url;
    unsigned part_size; /* first part size for multipart uploads */
    unsigned parts_in_flight;
    struct s3_lock *lease; /* the writer's lease this store holds, or NULL */
    pthread_mutex_t aborts_mu;
    struct s3_abort_due *aborts_due; /* uploads whose abort got no answer */
} s3_store;

/* 0 when the store holds no lease, or holds it still; -EBUSY naming the
 * new holder when the lease lapsed and another writer took it (a writer
 * paused, or cut off from the gateway, for longer than the lease): what
 * would be written under the prefix then is refused, not mixed with the
 * other writer's. One GET when the lease was not renewed for a while. */
int s3_lease_check(s3_store *s, ckpt_err *err);

/* "<prefix>/<name>" (or name), malloc'd. */
char *s3_key(const s3_store *s, const char *name);
/* ETags as servers write them: quoted or not, hex in either case. */
int s3_etag_equal(const char *a, const char *b);

int s3_upload_create(s3_store *s, const char *name, store_upload **out, ckpt_err *err);
long s3_abort_stale(ckpt_store *base, const char *name, uint64_t older_than_s, ckpt_err *err);
/* Sends again the aborts of our own uploads that got no answer (the
 * gateway was down when the upload failed): the count still due. */
long s3_retry_aborts(ckpt_store *base);
void s3_aborts_free(s3_store *s);

#endif
