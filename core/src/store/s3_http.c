/* Requests to an S3 server through libcurl.
 *
 * Signing is libcurl's (CURLOPT_AWS_SIGV4, "aws:amz:REGION:s3"); this file
 * writes no SigV4. What libcurl 7.88 needs from us for the signature to
 * match the server's: every request carries x-amz-content-sha256 (we send
 * UNSIGNED-PAYLOAD; RGW refuses the signature without the header), the path
 * is URI-encoded exactly once, and the query is already canonical (sorted,
 * encoded, every parameter with '=': "uploads=", not "uploads"), because
 * 7.88 signs the query as given. No header may be empty ("Expect:" breaks
 * the signature), and the session token goes in x-amz-security-token.
 *
 * Connections: handles are pooled (at most POOL_MAX idle ones), each keeps
 * its connection alive between requests (curl_easy_reset keeps it), so
 * concurrent ranged reads from several threads run in parallel on separate
 * kept-alive connections. The pool is the only shared state, under one
 * mutex.
 *
 * Retries: s3_retryable() outcomes are retried under the request's policy
 * (s3_retry_default: 7 attempts within 30 s, backoff 250 ms doubling, capped
 * at 8 s, with jitter); a body is re-sent from its start and a ranged read
 * refills its buffer from the start, except for the bytes an earlier try
 * told when the caller follows the body as it arrives (rq->progress):
 * those are skipped, not written again under a reader, and where the
 * request's range is ours (rq->ranged) not asked for again either: a
 * 16 MiB readahead segment cut at 15 MiB used to be fetched whole again.
 *
 * Cancelling: a request whose rq->cancelled says so stops within about a
 * second (curl asks the transfer callback at least that often while
 * nothing arrives), and between tries at the next 50 ms.
 *
 * Outages: s3_outage.c is asked before each request and told after it, so
 * that once one request got no answer the others fail at once instead of
 * each spending the retries again; a probe (gateway_answers) finds the
 * gateway back. */
#include "s3.h"

#include <curl/curl.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 32
/* curl's receive buffer: see the setopt for why this size. */
#define RECV_BUFFER (512u << 10)

const s3_retry_policy s3_retry_default = {7, 250, 8000, 30000};

struct s3_client {
    s3_config cfg;
    char *sigv4;        /* "aws:amz:REGION:s3" */
    char *token_header; /* "x-amz-security-token: ..." (secret) or NULL */
    s3_retry_policy retry;
    char via[320]; /* " (through the proxy URL of VAR)" or "" */
    pthread_mutex_t mu;
    struct conn *idle[POOL_MAX];
    size_t n_idle;
    s3_outage outage;
};

/* A pooled handle and the socket of its kept-alive connection. */
typedef struct conn {
    CURL *h;
    curl_socket_t fd; /* CURL_SOCKET_BAD when none */
} conn;

static void conn_free(conn *k)
{
    curl_easy_cleanup(k->h); /* closes the connection through on_close */
    free(k);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int s3_retryable(long status, int curl_code)
{
    /* 501: the server does not implement what was asked; asking again
     * does not make it. */
    if ((status >= 500 && status != 501) || status == 429 || status == 408)
        return 1;
    if (status != 0)
        return 0;
    switch (curl_code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return 1;
    default:
        return 0;
    }
}

long s3_retry_delay(const s3_retry_policy *p, unsigned attempts, uint64_t elapsed_ms, double jitter)
{
    if (attempts == 0)
        return 0;
    if (attempts >= p->max_attempts || elapsed_ms >= p->deadline_ms)
        return -1;
    uint64_t d = p->base_ms;
    for (unsigned i = 1; i < attempts && d < p->cap_ms; i++)
        d *= 2;
    if (d > p->cap_ms)
        d = p->cap_ms;
    if (jitter < 0)
        jitter = 0;
    if (jitter >= 1)
        jitter = 0.999;
    d = (uint64_t)((double)d * (0.5 + jitter / 2));
    /* A retry that would start after the deadline is not made. */
    if (elapsed_ms + d > p->deadline_ms)
        return -1;
    return (long)d;
}

/* Does no_proxy (or NO_PROXY) name host, as libcurl 7.88 reads it: "*";
 * else a list (commas, spaces) of names, each matching a host name whole
 * or as a domain suffix (a leading '.' optional), and of addresses
 * (IPv4 ones with an optional /BITS) matching an address host. */
static int no_proxy_names(const char *host, size_t host_len)
{
    const char *np = getenv("no_proxy");
    if (!np || !*np)
        np = getenv("NO_PROXY");
    if (!np)
        return 0;
    if (!strcmp(np, "*"))
        return 1;
    char name[256];
    if (host_len >= sizeof name)
        return 0;
    memcpy(name, host, host_len);
    name[host_len] = 0;
    struct in_addr a4;
    struct in6_addr a6;
    int v4 = inet_pton(AF_INET, name, &a4) == 1, v6 = inet_pton(AF_INET6, name, &a6) == 1;
    while (*np) {
        while (*np == ',' || *np == ' ' || *np == '\t')
            np++;
        size_t n = strcspn(np, ", \t");
        char e[256];
        snprintf(e, sizeof e, "%.*s", (int)(n < sizeof e ? n : 0), np);
        np += n;
        if (!e[0])
            continue;
        if (v4) {
            char *slash = strchr(e, '/');
            long bits = slash ? strtol(slash + 1, NULL, 10) : 32;
            struct in_addr m;
            if (slash)
                *slash = 0;
            if (bits < 0 || bits > 32 || inet_pton(AF_INET, e, &m) != 1)
                continue;
            uint32_t mask = bits ? htonl(~0u << (32 - bits)) : 0;
            if (((a4.s_addr ^ m.s_addr) & mask) == 0)
                return 1;
        } else if (v6) {
            struct in6_addr m;
            if (inet_pton(AF_INET6, e, &m) == 1 && !memcmp(&m, &a6, sizeof m))
                return 1;
        } else {
            const char *t = e[0] == '.' ? e + 1 : e;
            size_t tn = strlen(t);
            if (tn && tn <= host_len && strcasecmp(name + host_len - tn, t) == 0 &&
                (tn == host_len || name[host_len - tn - 1] == '.'))
                return 1;
        }
    }
    return 0;
}

/* The proxy libcurl takes from the environment for endpoint, in c->via for
 * messages, without any user:password@ (a proxy's credentials are as
 * secret as ours): a proxy that answers for the gateway (a 403 of its
 * policy, a 502) was reported as the S3 server's answer, naming neither. */
static void note_proxy(s3_client *c)
{
    const char *ep = c->cfg.endpoint;
    int https = strncmp(ep, "https://", 8) == 0;
    const char *host = strstr(ep, "://") + 3;
    size_t host_len;
    if (*host == '[') {
        host++;
        host_len = strcspn(host, "]");
    } else {
        host_len = strcspn(host, ":/");
    }
    c->via[0] = 0;
    if (no_proxy_names(host, host_len))
        return;
    /* libcurl's order; for http only the lower-case name (CGI's HTTP_PROXY
     * is a request header). */
    const char *names[] = {https ? "https_proxy" : "http_proxy", https ? "HTTPS_PROXY" : NULL,
                           "all_proxy", "ALL_PROXY"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = names[i] ? getenv(names[i]) : NULL;
        if (!v || !*v)
            continue;
        const char *at = strrchr(v, '@'), *scheme = strstr(v, "://");
        const char *rest = at ? at + 1 : scheme ? scheme + 3 : v;
        int slen = scheme && (!at || scheme < at) ? (int)(scheme - v + 3) : 0;
        snprintf(c->via, sizeof c->via, " (through the proxy %.*s%.200s of %s)", slen, v, rest,
                 names[i]);
        return;
    }
}

int s3_client_new(s3_config *cfg, s3_client **out, ckpt_err *err)
{
    *out = NULL;
    pthread_once(&curl_once, curl_init);
    s3_client *c = curl_init_rc == CURLE_OK ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        s3_config_free(cfg);
        if (curl_init_rc != CURLE_OK)
            return ckpt_fail(err, -EIO, "libcurl failed to initialise: %s",
                             curl_easy_strerror(curl_init_rc));
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    c->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    c->retry = s3_retry_default;
    note_proxy(c);
    pthread_mutex_init(&c->mu, NULL);
    s3_outage_init(&c->outage);
    if (asprintf(&c->sigv4, "aws:amz:%s:s3", c->cfg.region) < 0)
        c->sigv4 = NULL;
    if (c->cfg.session_token &&
        asprintf(&c->token_header, "x-amz-security-token: %s", c->cfg.session_token) < 0)
        c->token_header = NULL;
    if (!c->sigv4 || (c->cfg.session_token && !c->token_header)) {
        s3_client_free(c);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    *out = c;
    return 0;
}

void s3_client_free(s3_client *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_idle; i++)
        conn_free(c->idle[i]);
    if (c->token_header) {
        sodium_memzero(c->token_header, strlen(c->token_header));
        free(c->token_header);
    }
    free(c->sigv4);
    s3_config_free(&c->cfg);
    pthread_mutex_destroy(&c->mu);
    s3_outage_destroy(&c->outage);
    free(c);
}

const s3_config *s3_client_config(const s3_client *c)
{
    return &c->cfg;
}

void s3_client_set_retry(s3_client *c, const s3_retry_policy *p)
{
    c->retry = *p;
}

const s3_retry_policy *s3_client_retry(const s3_client *c)
{
    return &c->retry;
}

static conn *handle_get(s3_client *c)
{
    conn *k = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->n_idle)
        k = c->idle[--c->n_idle];
    pthread_mutex_unlock(&c->mu);
    if (k) {
        curl_easy_reset(k->h); /* keeps the connection */
        return k;
    }
    if (!(k = calloc(1, sizeof *k)))
        return NULL;
    k->fd = CURL_SOCKET_BAD;
    if (!(k->h = curl_easy_init())) {
        free(k);
        return NULL;
    }
    return k;
}

static void handle_put(s3_client *c, conn *k)
{
    pthread_mutex_lock(&c->mu);
    if (c->n_idle < POOL_MAX) {
        c->idle[c->n_idle++] = k;
        k = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (k)
        conn_free(k);
}

/* ------------------------------------------------------- one attempt */

typedef struct xfer {
    CURL *h;
    conn *k;
    const s3_req *rq;
    s3_resp *rs;
    size_t sent;           /* of the request body */
    size_t cap;            /* of rs->body */
    const char *piece_end; /* where the last piece of the body ended */
    size_t since_ack;      /* bytes taken since quick-ACK was last asked for */
    size_t keep;           /* of dst, told by an earlier try (rq->progress) */
    size_t told;           /* dst_got when rq->progress was last called */
} xfer;

static size_t on_read(char *buf, size_t size, size_t n, void *ud)
{
    xfer *x = ud;
    size_t want = size * n, left = x->rq->body_len - x->sent;
    if (want > left)
        want = left;
    memcpy(buf, (const char *)x->rq->body + x->sent, want);
    x->sent += want;
    return want;
}

static int on_seek(void *ud, curl_off_t off, int origin)
{
    xfer *x = ud;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->rq->body_len)
        return CURL_SEEKFUNC_CANTSEEK;
    x->sent = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

/* Delayed ACKs on a kept-alive connection: RGW's beast frontend sends the
 * last, partial segment of a response only when the segment before it is
 * ACKed (Nagle), and Linux delays that ACK by 40 ms once a connection has
 * left its first quick-ACK phase. Measured on the tests' gateway: a 100 KB
 * ranged GET took 2-4 ms on a new connection and 42-48 ms on a reused one
 * (tcpdump: our ACK came 46 ms late). Quick-ACK mode is not sticky, so it is
 * asked for again after every receive and at the end of the headers. With
 * it, `ckpt cat` of a 250 MB file from the gateway went from 8.1 s to 1.2 s
 * on one thread (0.72 s on two). */
static void quickack(xfer *x)
{
    if (x->k->fd != CURL_SOCKET_BAD) {
        int one = 1;
        setsockopt(x->k->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    }
}

/* libcurl 7.88 gives no socket to a write callback (CURLINFO_ACTIVESOCKET
 * is -1 there), so the socket is noted when made and forgotten when closed;
 * both callbacks keep the conn they were set with for the connection's life. */
static int on_sockopt(void *ud, curl_socket_t fd, curlsocktype purpose)
{
    ((conn *)ud)->fd = fd;
    return CURL_SOCKOPT_OK;
}

static int on_close(void *ud, curl_socket_t fd)
{
    conn *k = ud;
    if (k->fd == fd)
        k->fd = CURL_SOCKET_BAD;
    return close(fd);
}

static int on_xferinfo(void *ud, curl_off_t dl_total, curl_off_t dl_now, curl_off_t ul_total,
                       curl_off_t ul_now)
{
    const s3_req *rq = ud;
    return rq->cancelled(rq->cancel_ud) != 0;
}

static size_t on_write(char *data, size_t size, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = size * n;
    /* curl hands one receive (up to its 512 KiB buffer) to us in pieces of
     * 16 KiB, back to back; a piece that does not follow the last one is a
     * new receive (and, should a curl ever append one receive to another,
     * 512 KiB taken is at least one). Asking again for each piece was
     * 29,000 setsockopt calls per 475 MB, 2.3% of the mount's CPU in a cold
     * sequential read (perf); now 1,600. */
    x->since_ack += len;
    if (data != x->piece_end || x->since_ack >= RECV_BUFFER) {
        quickack(x);
        x->since_ack = 0;
    }
    x->piece_end = data + len;
    long status = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
    s3_resp *rs = x->rs;
    if (x->rq->dst && status >= 200 && status < 300) {
        if (len > x->rq->dst_len - rs->dst_got) {
            rs->overflow = 1;
            return 0; /* more than asked for: stop, the caller reports it */
        }
        size_t skip = rs->dst_got < x->keep ? x->keep - rs->dst_got : 0;
        if (skip < len)
            memcpy((char *)x->rq->dst + rs->dst_got + skip, data + skip, len - skip);
        rs->dst_got += len;
        if (x->rq->progress && rs->dst_got > x->keep &&
            (rs->dst_got - x->told >= S3_PROGRESS_STEP || rs->dst_got == x->rq->dst_len)) {
            x->told = rs->dst_got;
            rs->status = status; /* else set when the transfer ends */
            int judged = x->rq->progress(x->rq->progress_ud, rs);
            if (judged < 0) {
                rs->overflow = 1;
                return 0;
            }
            /* Only bytes the caller judged are kept by a retry: a 200 to a
             * ranged GET (a proxy that ignores Range) is the object from its
             * start, not the range, and a retry answered 206 must not keep
             * it as the range's first bytes. */
            if (judged > 0)
                rs->dst_told = rs->dst_got;
        }
        return len;
    }
    if (len > S3_XML_MAX - rs->body_len) {
        rs->overflow = 1;
        return 0;
    }
    if (rs->body_len + len + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < rs->body_len + len + 1)
            cap *= 2;
        char *b = realloc(rs->body, cap);
        if (!b)
            return 0;
        rs->body = b;
        x->cap = cap;
    }
    memcpy(rs->body + rs->body_len, data, len);
    rs->body_len += len;
    rs->body[rs->body_len] = 0;
    return len;
}

static void header_value(const char *line, size_t len, size_t name_len, char *out, size_t cap)
{
    const char *v = line + name_len;
    size_t n = len - name_len;
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    if (n >= cap)
        n = 0; /* too long to be what we expect: treat as absent */
    memcpy(out, v, n);
    out[n] = 0;
}

static size_t on_header(char *line, size_t size, size_t n, void *ud)
{
    s3_resp *rs = ((xfer *)ud)->rs;
    size_t len = size * n;
    char v[128];
    if (len <= 2) /* the end of the headers: the body may wait for our ACK */
        quickack(ud);
    if (len > 5 && strncmp(line, "HTTP/", 5) == 0) {
        /* A new response (after 100 Continue, say): forget the old headers. */
        rs->etag[0] = rs->content_range[0] = 0;
        rs->has_length = 0;
        rs->last_modified = 0;
    } else if (len > 5 && strncasecmp(line, "ETag:", 5) == 0) {
        header_value(line, len, 5, rs->etag, sizeof rs->etag);
    } else if (len > 14 && strncasecmp(line, "Content-Range:", 14) == 0) {
        header_value(line, len, 14, rs->content_range, sizeof rs->content_range);
    } else if (len > 15 && strncasecmp(line, "Content-Length:", 15) == 0) {
        header_value(line, len, 15, v, sizeof v);
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        rs->has_length = v[0] >= '0' && v[0] <= '9' && !*end && !errno;
        rs->content_length = x;
    } else if (len > 14 && strncasecmp(line, "Last-Modified:", 14) == 0) {
        header_value(line, len, 14, v, sizeof v);
        int64_t t;
        if (s3_parse_time(v, &t) == 0)
            rs->last_modified = t;
    }
    return len;
}

static char *make_url(const s3_client *c, const s3_req *rq)
{
    char *b = s3_uri_encode(rq->bucket, 0);
    char *k = rq->key ? s3_uri_encode(rq->key, 1) : NULL;
    char *url = NULL;
    if (b && (!rq->key || k) &&
        asprintf(&url, "%s/%s%s%s%s%s", c->cfg.endpoint, b, rq->key ? "/" : "", k ? k : "",
                 rq->query ? "?" : "", rq->query ? rq->query : "") < 0)
        url = NULL;
    free(b);
    free(k);
    return url;
}

static void reset_resp(s3_resp *rs)
{
    unsigned attempts = rs->attempts;
    free(rs->body);
    memset(rs, 0, sizeof *rs);
    rs->attempts = attempts;
}

static int attempt(s3_client *c, conn *k, const s3_req *rq, const char *url,
                   struct curl_slist *hdrs, s3_resp *rs, size_t keep)
{
    CURL *h = k->h;
    xfer x = {.h = h, .k = k, .rq = rq, .rs = rs, .keep = keep, .told = rs->dst_got};
    const char *m = rq->method;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)rq->timeout_ms); /* a pooled handle keeps it */
    /* A stalled transfer (under 1 KB/s for 15 s) is a failed attempt. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 15L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_sockopt);
    curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, k);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, k);
    if (c->cfg.ca_bundle)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cfg.ca_bundle);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, c->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, c->cfg.access_key);
    curl_easy_setopt(h, CURLOPT_PASSWORD, c->cfg.secret_key);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    /* curl moves 16 KiB per recv and 64 KiB per send by default: a
     * ckpt cat of a 475 MB pack made 29,400 recvfrom and 30,326 poll
     * calls (strace -c), and with 512 KiB 1,072 and 1,661, for about 4%
     * less of ckpt's CPU time; an upload's sendto calls went from 7,311
     * to 968 with 512 KiB (359 with 2 MiB, which cost 15 MiB of RSS). */
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)RECV_BUFFER);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 512L << 10);
    if (rq->cancelled) {
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)rq);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    if (!strcmp(m, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(m, "PUT")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rq->body_len);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, &x);
    } else if (!strcmp(m, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->body_len ? rq->body : "");
    } else if (strcmp(m, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m);
    }
    char ebuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rq->cancelled) { /* the handle may be pooled: no pointer into rq stays */
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 1L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, NULL);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, NULL);
    }
    rs->curl_code = (int)cc;
    /* Only a cancel is left unretried; another callback's abort is a fault. */
    if (cc == CURLE_ABORTED_BY_CALLBACK && rq->cancelled && rq->cancelled(rq->cancel_ud)) {
        snprintf(rs->curl_msg, sizeof rs->curl_msg, "abandoned");
        rs->status = 0;
        return -ECANCELED;
    }
    if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && rs->overflow)) {
        snprintf(rs->curl_msg, sizeof rs->curl_msg, "%.*s", (int)sizeof rs->curl_msg - 1,
                 ebuf[0] ? ebuf : curl_easy_strerror(cc));
        /* A response cut short is no answer: retry it as a transport error. */
        rs->status = 0;
        return cc == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO;
    }
    rs->status = status;
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A TLS handshake answered in plain HTTP (an https:// endpoint at an
 * http-only port): no retry makes it TLS, so it is not retried, and the
 * error says what to change. */
static int plain_http_answer(const s3_resp *rs)
{
    return rs->curl_code == CURLE_SSL_CONNECT_ERROR &&
           strstr(rs->curl_msg, "wrong version number") != NULL;
}

/* Sleeps ms, in steps that ask rq->cancelled: 1 when it said so. */
static int sleep_unless_cancelled(const s3_req *rq, long ms)
{
    while (ms > 0) {
        if (rq->cancelled && rq->cancelled(rq->cancel_ud))
            return 1;
        long step = rq->cancelled && ms > 50 ? 50 : ms;
        struct timespec ts = {step / 1000, (step % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        ms -= step;
    }
    return rq->cancelled && rq->cancelled(rq->cancel_ud);
}

static int request(s3_client *c, const s3_req *rq, s3_resp *rs)
{
    memset(rs, 0, sizeof *rs);
    const s3_retry_policy *p = rq->retry ? rq->retry : &c->retry;
    char *url = make_url(c, rq);
    struct curl_slist *hdrs = NULL, *t;
    int ok = url != NULL;
    /* libcurl signs these; the payload is not hashed (UNSIGNED-PAYLOAD). */
    if (ok && !(t = curl_slist_append(hdrs, "x-amz-content-sha256: UNSIGNED-PAYLOAD")))
        ok = 0;
    else if (ok)
        hdrs = t;
    if (ok && c->token_header && (t = curl_slist_append(hdrs, c->token_header)))
        hdrs = t;
    else if (ok && c->token_header)
        ok = 0;
    for (const char *const *hp = rq->headers; ok && hp && *hp; hp++) {
        if ((t = curl_slist_append(hdrs, *hp)))
            hdrs = t;
        else
            ok = 0;
    }
    conn *k = ok ? handle_get(c) : NULL;
    if (!k) {
        free(url);
        curl_slist_free_all(hdrs);
        rs->curl_code = CURLE_OUT_OF_MEMORY;
        return -ENOMEM;
    }
    uint64_t t0 = now_ms();
    int rc;
    /* Of dst, told by the tries so far: a retry skips those bytes. Not all
     * that a try wrote: bytes past the last call came with headers not yet
     * judged, and no reader sees them until a call tells them. */
    size_t kept = 0;
    for (;;) {
        if (rs->dst_told > kept)
            kept = rs->dst_told;
        reset_resp(rs);
        rs->attempts++;
        /* A try asks for the bytes not yet told; when all were (the try
         * broke after its last byte), for the last, which it skips. */
        char range[64];
        struct curl_slist with_range = {range, hdrs};
        if (rq->ranged && rq->dst_len) {
            rs->dst_got = rs->dst_from = kept < rq->dst_len ? kept : rq->dst_len - 1;
            snprintf(range, sizeof range, "Range: bytes=%llu-%llu",
                     (unsigned long long)(rq->range_off + rs->dst_from),
                     (unsigned long long)(rq->range_off + rq->dst_len - 1));
        }
        rc = attempt(c, k, rq, url, rq->ranged && rq->dst_len ? &with_range : hdrs, rs, kept);
        if (rc == -ENOMEM || rc == -ECANCELED || !s3_retryable(rs->status, rs->curl_code) ||
            plain_http_answer(rs))
            break;
        long d = s3_retry_delay(p, rs->attempts, now_ms() - t0,
                                (double)randombytes_uniform(1000) / 1000.0);
        /* Another request marked the gateway down meanwhile: what it
         * found, one more try here would only find again, later. */
        if (d < 0 || (!rq->patient && s3_outage_is_down(&c->outage)))
            break;
        if (sleep_unless_cancelled(rq, d)) {
            rc = -ECANCELED;
            snprintf(rs->curl_msg, sizeof rs->curl_msg, "abandoned");
            break;
        }
    }
    if (rc == 0)
        handle_put(c, k);
    else
        conn_free(k); /* its connection is suspect */
    if (hdrs) {
        /* The token header is the client's; the list only points at copies. */
        for (struct curl_slist *s = hdrs; s; s = s->next)
            sodium_memzero(s->data, strlen(s->data));
        curl_slist_free_all(hdrs);
    }
    free(url);
    return rc;
}

/* No answer from the gateway itself: a transport failure worth retrying,
 * or a proxy's 502/504 saying the gateway behind it gave none. */
static int gateway_silent(const s3_resp *rs)
{
    if (rs->status == 502 || rs->status == 504)
        return 1;
    return rs->status == 0 && s3_retryable(0, rs->curl_code) && !plain_http_answer(rs);
}

static void silent_what(const s3_resp *rs, char *what, size_t cap)
{
    if (rs->status)
        snprintf(what, cap, "HTTP %ld", rs->status);
    else
        snprintf(what, cap, "%s", rs->curl_msg[0] ? rs->curl_msg : "no response");
}

/* One HEAD of the endpoint's root (ListBuckets: any S3 server answers
 * it), one try, bounded: any answer but a proxy's 502/504 (a 403 too:
 * someone answered) shows the gateway is back. */
static int gateway_answers(s3_client *c, char *what, size_t cap)
{
    static const s3_retry_policy once = {1, 0, 0, 0};
    s3_req rq = {.method = "HEAD", .bucket = "", .retry = &once, .timeout_ms = S3_OUTAGE_PROBE_MS};
    s3_resp rs;
    int rc = request(c, &rq, &rs);
    int answered = rc == 0 && !gateway_silent(&rs);
    if (!answered)
        silent_what(&rs, what, cap);
    s3_resp_free(&rs);
    return answered || rc == -ENOMEM;
}

/* Asks s3_outage whether a request may go, probing when it is time: 1 when
 * it may, else 0 with why. */
static int admitted(s3_client *c, char *why, size_t cap)
{
    int r = s3_outage_admit(&c->outage, now_ms(), why, cap);
    if (r == S3_OUTAGE_PROBE) {
        char what[160];
        int ok = gateway_answers(c, what, sizeof what);
        s3_outage_probed(&c->outage, ok, what, now_ms(), why, cap);
        return ok;
    }
    return r == S3_OUTAGE_GO;
}

int s3_request(s3_client *c, const s3_req *rq, s3_resp *rs)
{
    char why[sizeof rs->curl_msg];
    if (!rq->patient && !admitted(c, why, sizeof why)) {
        memset(rs, 0, sizeof *rs);
        rs->curl_code = CURLE_COULDNT_CONNECT;
        snprintf(rs->curl_msg, sizeof rs->curl_msg, "%s", why);
        return -EIO;
    }
    uint64_t began = now_ms();
    int rc = request(c, rq, rs);
    if (rc != -ENOMEM && rc != -ECANCELED) {
        char what[160], probe_what[160];
        int silent = gateway_silent(rs);
        if (silent)
            silent_what(rs, what, sizeof what);
        /* Only this request's answers lost (a Complete that outlasted a
         * load balancer's timeout, say) while the gateway answers others:
         * not an outage, and what the caller does next to judge the
         * request (a HEAD of the object, an abort) must not be refused. */
        uint64_t probe_began = now_ms();
        if (silent && gateway_answers(c, probe_what, sizeof probe_what))
            silent = 0;
        s3_outage_note(&c->outage, silent, silent ? what : NULL, began, probe_began, now_ms());
    }
    return rc;
}

int s3_client_reachable(s3_client *c, const char *where, ckpt_err *err)
{
    char why[200];
    if (admitted(c, why, sizeof why))
        return 0;
    int rc =
        ckpt_fail(err, -EIO, "%s: no answer from %s%s (%s)", where, c->cfg.endpoint, c->via, why);
    if (err)
        err->transient = 1;
    s3_scrub(c, err);
    return rc;
}

void s3_resp_free(s3_resp *rs)
{
    free(rs->body);
    rs->body = NULL;
    rs->body_len = 0;
}

/* ------------------------------------------------------------ failures */

void s3_scrub(const s3_client *c, ckpt_err *err)
{
    if (!err)
        return;
    const char *secrets[] = {c->cfg.secret_key, c->cfg.session_token, c->cfg.access_key};
    for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++) {
        const char *s = secrets[i];
        size_t n = s ? strlen(s) : 0;
        char *hit, *from = err->msg;
        if (n < 4)
            continue;
        /* Searching on after each replacement: a secret that is part of
         * "[redacted]" would otherwise be found in it again, forever. */
        while ((hit = strstr(from, s))) {
            char rest[sizeof err->msg];
            snprintf(rest, sizeof rest, "%s", hit + n);
            snprintf(hit, sizeof err->msg - (size_t)(hit - err->msg), "[redacted]%s", rest);
            from = hit + strnlen(hit, sizeof "[redacted]" - 1); /* cut short at the end */
        }
    }
}

int s3_fail(ckpt_err *err, const s3_client *c, const char *what, const char *action,
            const s3_resp *rs)
{
    int rc;
    if (rs->status == 0) {
        char tries[40] = ""; /* none: refused at once, the gateway being down */
        if (rs->attempts)
            snprintf(tries, sizeof tries, " after %u attempt%s", rs->attempts,
                     rs->attempts == 1 ? "" : "s");
        rc = ckpt_fail(err, rs->curl_code == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO,
                       "%s: %s failed: no answer from %s%s (%s%s)%s", what, action, c->cfg.endpoint,
                       c->via, rs->curl_msg[0] ? rs->curl_msg : "no response",
                       rs->curl_code == CURLE_PEER_FAILED_VERIFICATION
                           ? (c->cfg.ca_bundle ? "; not signed by a CA of the CA bundle"
                                               : "; a private CA's: set AWS_CA_BUNDLE")
                       : plain_http_answer(rs)
                           ? "; it answers plain HTTP: give the endpoint as http://"
                           : "",
                       tries);
        if (err && rc == -EIO)
            err->transient = 1;
        s3_scrub(c, err);
        return rc;
    }
    s3_error e;
    int is_err = s3_xml_error(rs->body, rs->body_len, &e) == 1;
    if (!is_err && rs->body_len > 0) {
        /* A body that is no S3 error: not an S3 server's answer (a web
         * server at a wrong endpoint, a proxy), whose 404 is no missing
         * object and whose 403 no refused key. */
        rc = ckpt_fail(err,
                       rs->status == 403   ? -EACCES
                       : rs->status == 404 ? -ENOENT
                                           : -EIO,
                       "%s: %s failed: HTTP %ld from %s%s is not an S3 answer (no S3 error "
                       "code in it; is the endpoint right?) after %u attempt%s",
                       what, action, rs->status, c->cfg.endpoint, c->via, rs->attempts,
                       rs->attempts == 1 ? "" : "s");
        if (err && s3_retryable(rs->status, 0))
            err->transient = 1; /* a proxy's "bad gateway", "busy" or "timeout" */
        s3_scrub(c, err);
        return rc;
    }
    const char *code = is_err ? e.code : "";
    char detail[300];
    snprintf(detail, sizeof detail, "%s%s%s", code, is_err && e.message[0] ? ": " : "",
             is_err ? e.message : "");
    if (!strcmp(code, "InvalidAccessKeyId"))
        rc = ckpt_fail(err, -EACCES,
                       "%s: %s failed: the server does not know the access key from %s "
                       "(HTTP 403 InvalidAccessKeyId)",
                       what, action, c->cfg.source);
    else if (!strcmp(code, "SignatureDoesNotMatch"))
        rc = ckpt_fail(err, -EACCES,
                       "%s: %s failed: the secret key from %s does not match "
                       "(HTTP 403 SignatureDoesNotMatch)",
                       what, action, c->cfg.source);
    else if (rs->status == 403)
        rc = ckpt_fail(err, -EACCES, "%s: %s failed: access denied (HTTP 403 %s)", what, action,
                       code[0] ? detail : "Forbidden");
    else if (!strcmp(code, "NoSuchBucket"))
        rc = ckpt_fail(err, -ENOENT, "%s: %s failed: no such bucket (HTTP 404 NoSuchBucket)", what,
                       action);
    else if (rs->status == 404)
        rc = ckpt_fail(err, -ENOENT, "%s: %s failed: no such object (HTTP 404%s%s)", what, action,
                       code[0] ? " " : "", code);
    else if (rs->status == 412)
        rc = ckpt_fail(err, -ESTALE,
                       "%s: %s failed: the object was replaced since it was opened "
                       "(HTTP 412 PreconditionFailed)",
                       what, action);
    else
        rc = ckpt_fail(err, -EIO, "%s: %s failed: HTTP %ld%s%s after %u attempt%s", what, action,
                       rs->status, code[0] ? " " : "", code[0] ? detail : "", rs->attempts,
                       rs->attempts == 1 ? "" : "s");
    if (err && s3_retryable(rs->status, 0))
        err->transient = 1;            /* what was retried (5xx, 429, 408): not the object */
    if (err && !is_err && c->via[0]) { /* no body to tell who answered */
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, "%s", c->via);
    }
    s3_scrub(c, err);
    return rc;
}
