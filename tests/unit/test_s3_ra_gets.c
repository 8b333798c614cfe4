/* The S3 readahead's segment GETs against a loopback server that breaks
 * them on demand: a GET cut midway and retried, one that hangs while the
 * reader is closed. What a real gateway does not do when asked, and what
 * tests/unit/test_s3.c's fake fetch (no HTTP) cannot show. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/s3.h"
#include "testutil.h"

/* A GET longer than this is a readahead segment's (the reader's own are
 * 1 MiB here). */
#define SEG_GET (2u << 20)

enum { NONE, CUT, HANG };

/* One object p/o of size bytes (obj_byte), ETag "e1" until the first cut
 * (etag_after from then on, the object replaced behind a gateway that
 * ignores If-Match), one connection per request. The fault_at-th segment
 * GET, or every one from fault_off, sends cut_after bytes of its body, then
 * closes (CUT) or waits until stop (HANG). Every GET's Range is noted; a
 * suffix range (bytes=-N) is served as a gateway serves it. */
typedef struct srv {
    int port, stop;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t size;
    int fault;
    unsigned fault_at, seg_gets, live;
    uint64_t fault_off; /* not 0: every segment GET from here meets the fault */
    size_t cut_after;
    const char *etag_after;
    int cut;
    /* The first 64 GETs' ranges: to is the last byte, inclusive as in the
     * Range header (got_to in test_s3.c is one past it). */
    uint64_t from[64], to[64];
    unsigned n_gets;
    uint64_t sent; /* bytes of bodies sent */
} srv;

static uint8_t obj_byte(uint64_t i)
{
    return (uint8_t)(i * 13 + i / 8191);
}

static int send_all(int fd, const void *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = send(fd, (const char *)p + done, n - done, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

static void serve(srv *s, int fd)
{
    char req[4096] = "";
    size_t got = 0;
    while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t n = read(fd, req + got, sizeof req - 1 - got);
        if (n <= 0)
            return;
        got += (size_t)n;
        req[got] = 0;
    }
    pthread_mutex_lock(&s->mu);
    const char *etag = s->cut && s->etag_after ? s->etag_after : "\"e1\"";
    pthread_mutex_unlock(&s->mu);
    char etag_line[96] = ""; /* none where etag_after is "" */
    if (etag[0])
        snprintf(etag_line, sizeof etag_line, "ETag: %s\r\n", etag);
    char head[512];
    if (!strncmp(req, "HEAD ", 5)) {
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Length: %llu\r\n%s"
                         "Connection: close\r\n\r\n",
                         (unsigned long long)s->size, etag_line);
        send_all(fd, head, (size_t)n);
        return;
    }
    const char *r = strcasestr(req, "\r\nRange: bytes=");
    if (!strncmp(req, "GET ", 4) && !r) { /* the listing that opening the store makes */
        static const char list[] = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                                   "<ListBucketResult><IsTruncated>false</IsTruncated>"
                                   "</ListBucketResult>";
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         strlen(list), list);
        send_all(fd, head, (size_t)n);
        return;
    }
    unsigned long long a, b; /* bytes=-b: the last b bytes (the open's GET) */
    if (r && !strncmp(req, "GET ", 4) && r[15] == '-' && sscanf(r + 16, "%llu", &b) == 1 && b)
        a = b < s->size ? s->size - b : 0, b = s->size - 1;
    else if (strncmp(req, "GET ", 4) || !r || sscanf(r + 15, "%llu-%llu", &a, &b) != 2 || a > b ||
             b >= s->size)
        return;
    int fault = NONE;
    pthread_mutex_lock(&s->mu);
    if (s->n_gets < 64) {
        s->from[s->n_gets] = a;
        s->to[s->n_gets] = b;
    }
    s->n_gets++;
    if (b - a + 1 > SEG_GET &&
        (++s->seg_gets == s->fault_at || (s->fault_off && a >= s->fault_off)))
        fault = s->fault;
    pthread_mutex_unlock(&s->mu);
    size_t len = (size_t)(b - a + 1);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 206 Partial Content\r\nContent-Length: %zu\r\n"
                     "Content-Range: bytes %llu-%llu/%llu\r\n%s"
                     "Connection: close\r\n\r\n",
                     len, a, b, (unsigned long long)s->size, etag_line);
    if (send_all(fd, head, (size_t)n) < 0)
        return;
    size_t upto = fault != NONE && s->cut_after < len ? s->cut_after : len;
    static _Thread_local uint8_t buf[1u << 16];
    for (size_t at = 0; at < upto;) {
        size_t k = upto - at < sizeof buf ? upto - at : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = obj_byte(a + at + i);
        if (send_all(fd, buf, k) < 0)
            return;
        at += k;
        pthread_mutex_lock(&s->mu);
        s->sent += k;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    if (fault == CUT)
        s->cut = 1;
    while (fault == HANG && !s->stop)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

typedef struct conn {
    srv *s;
    int fd;
} conn;

static void *conn_main(void *arg)
{
    conn c = *(conn *)arg;
    srv *s = c.s;
    free(arg);
    serve(s, c.fd);
    int fd = c.fd;
    close(fd);
    pthread_mutex_lock(&s->mu);
    s->live--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int listen_fd;

static void *srv_main(void *arg)
{
    srv *s = arg;
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        conn *c = malloc(sizeof *c);
        cr_assert_not_null(c);
        *c = (conn){s, fd};
        pthread_mutex_lock(&s->mu);
        s->live++;
        pthread_mutex_unlock(&s->mu);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, conn_main, c), 0);
        pthread_detach(t);
    }
}

static void srv_start(srv *s, uint64_t size)
{
    *s = (srv){.size = size};
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    cr_assert(listen_fd >= 0 && bind(listen_fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              listen(listen_fd, 64) == 0 &&
              getsockname(listen_fd, (struct sockaddr *)&a, &alen) == 0);
    s->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&s->th, NULL, srv_main, s), 0);
}

static void srv_stop(srv *s)
{
    shutdown(listen_fd, SHUT_RDWR);
    pthread_join(s->th, NULL);
    close(listen_fd);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    while (s->live)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static ckpt_store *srv_store(const srv *s)
{
    setenv("AWS_ACCESS_KEY_ID", "A", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "S", 1);
    setenv("HOME", "/nonexistent", 1);
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_CONFIG_FILE");
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", s->port);
    ckpt_store_opts o = {.endpoint = endpoint, .retry_seconds = 5};
    ckpt_store *st;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_open("s3://bucket/p", &o, &st, &err), 0, "%s", err.msg);
    return st;
}

/* Reads [0, upto) of r in order, 1 MiB at a time: the bytes, or the first
 * error (its offset in *at). */
static ssize_t read_through(store_reader *r, uint64_t upto, uint64_t *at, ckpt_err *err)
{
    uint8_t *buf = malloc(1u << 20);
    ssize_t got = 0;
    for (*at = 0; *at < upto; *at += 1u << 20) {
        got = r->ops->read_at(r, buf, 1u << 20, *at, err);
        if (got != 1 << 20)
            break;
        for (size_t i = 0; i < 1u << 20; i++)
            if (buf[i] != obj_byte(*at + i))
                cr_assert_fail("byte %llu differs", (unsigned long long)(*at + i));
    }
    free(buf);
    return got;
}

/* The 48 MiB object read through once, its first segment GET cut after
 * 3 MiB, the answers after the cut carrying etag_after (NULL: "e1", "":
 * none). The read's last result; the server is stopped, *st left to free. */
static ssize_t read_cut_object(srv *s, const char *etag_after, ckpt_store **st, uint64_t *at,
                               ckpt_err *err)
{
    srv_start(s, 48ull << 20);
    s->fault = CUT;
    s->fault_at = 1;
    s->cut_after = 3u << 20;
    s->etag_after = etag_after;
    *st = srv_store(s);
    store_reader *r;
    cr_assert_eq((*st)->ops->open_read(*st, "o", &r, err), 0, "%s", err->msg);
    ssize_t got = read_through(r, s->size, at, err);
    r->ops->close(r);
    srv_stop(s);
    return got;
}

/* Each byte sent once, but what the cut try sent past its last telling (a
 * step at most). */
static void assert_sent_once(const srv *s)
{
    cr_assert_leq(s->sent, s->size + S3_PROGRESS_STEP, "%llu bytes sent of a %llu-byte object",
                  (unsigned long long)s->sent, (unsigned long long)s->size);
}

/* A segment GET cut after 3 MiB is retried from the first byte its first
 * try did not tell (a Range of its own), not for the whole segment again:
 * it used to ask for all 16 MiB again and drop the 3 MiB it had. */
Test(s3_ra_gets, a_cut_segment_get_resumes_where_it_stopped, .timeout = 60)
{
    srv s;
    ckpt_store *st;
    ckpt_err err = {0};
    uint64_t at;
    ssize_t got = read_cut_object(&s, NULL, &st, &at, &err);
    cr_assert_eq(got, 1 << 20, "at %llu: %zd %s", (unsigned long long)at, got, err.msg);
    /* The cut GET (the first of a segment's) and its retry: the same end,
     * a start past the bytes told (a step in at least), no later than the
     * cut. */
    int resumed = 0;
    for (unsigned j = 0; j < s.n_gets && j < 64; j++) {
        for (unsigned i = 0; i < j; i++)
            resumed |= s.to[i] - s.from[i] + 1 > SEG_GET && s.to[i] == s.to[j] &&
                       s.from[j] >= s.from[i] + S3_PROGRESS_STEP &&
                       s.from[j] <= s.from[i] + s.cut_after;
    }
    for (unsigned i = 0; i < s.n_gets && i < 64; i++)
        cr_log_info("GET %llu-%llu", (unsigned long long)s.from[i], (unsigned long long)s.to[i]);
    cr_assert(resumed, "no GET resumed the cut segment past its told bytes (%u GETs)", s.n_gets);
    assert_sent_once(&s);
    ckpt_store_free(st);
}

/* The resumed try's answer comes with another ETag (the object replaced,
 * If-Match ignored): its bytes are never served after the first try's,
 * the read fails with -ESTALE. */
Test(s3_ra_gets, a_resumed_segment_get_of_another_etag_is_stale, .timeout = 60)
{
    srv s;
    ckpt_store *st;
    ckpt_err err = {0};
    uint64_t at;
    ssize_t got = read_cut_object(&s, "\"e2\"", &st, &at, &err);
    cr_assert_eq(got, -ESTALE, "at %llu: %zd %s", (unsigned long long)at, got, err.msg);
    cr_assert(strstr(err.msg, "replaced"), "%s", err.msg);
    cr_assert_leq(at, (19ull << 20), "served up to %llu", (unsigned long long)at);
    ckpt_store_free(st);
}

/* The resumed try's answer has no ETag (a proxy that drops it from 206
 * answers): nothing says the object changed, and If-Match was sent, so its
 * bytes are the object's. It used to count as replaced (-ESTALE), and
 * the readers fetched its bytes again with GETs of their own. */
Test(s3_ra_gets, a_resumed_segment_get_without_an_etag_is_kept, .timeout = 60)
{
    srv s;
    ckpt_store *st;
    ckpt_err err = {0};
    uint64_t at;
    ssize_t got = read_cut_object(&s, "", &st, &at, &err);
    cr_assert_eq(got, 1 << 20, "at %llu: %zd %s", (unsigned long long)at, got, err.msg);
    assert_sent_once(&s); /* kept, not fetched again by the readers */
    ckpt_store_free(st);
}

static double secs_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Closing a reader whose segments ahead hang midway (a gateway gone
 * silent) abandons their GETs: it used to wait for them, a stalled try
 * (15 s) and its retries, before close returned. */
Test(s3_ra_gets, closing_a_reader_abandons_its_hung_segment_gets, .timeout = 60)
{
    srv s;
    srv_start(&s, 48ull << 20);
    s.fault = HANG;
    s.fault_off = 16ull << 20; /* the segments after the first */
    s.cut_after = 1u << 20;
    ckpt_store *st = srv_store(&s);
    store_reader *r;
    ckpt_err err = {0};
    cr_assert_eq(st->ops->open_read(st, "o", &r, &err), 0, "%s", err.msg);
    uint64_t at;
    ssize_t got = read_through(r, 12ull << 20, &at, &err);
    cr_assert_eq(got, 1 << 20, "at %llu: %zd %s", (unsigned long long)at, got, err.msg);
    /* Both later segments' GETs are under way, hanging. */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pthread_mutex_lock(&s.mu);
        unsigned hung = s.seg_gets;
        pthread_mutex_unlock(&s.mu);
        if (hung >= 3 || secs_since(&t0) > 5)
            break;
        usleep(10000);
    }
    cr_assert_geq(s.seg_gets, 3u, "the segments ahead were not asked for");
    usleep(300000); /* their first MiB sent, the rest never */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r->ops->close(r);
    double took = secs_since(&t0);
    srv_stop(&s);
    ckpt_store_free(st);
    cr_log_info("close took %.3f s", took);
    cr_assert_lt(took, 2.0, "close took %.2f s", took);
}
