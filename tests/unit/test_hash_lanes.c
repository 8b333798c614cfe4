/* Big files packed from disk are hashed by hash lanes that read them again
 * (core/src/hash_lanes.h): the digests must be those of the bytes packed,
 * and a file whose second read differs must fail the pack, not get a wrong
 * digest. */
#include "testutil.h"
#include "ckpt.h"
#include "writer.h"
#include "hash_lanes.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

TU_TMPDIR_SUITE(hash_lanes);

#define BIG (20u << 20) /* above the writer's lane threshold */

static char *big_file(const char *name, uint32_t seed, uint8_t **bytes)
{
    char *path = tu_join(dir, name);
    uint8_t *b = malloc(BIG);
    tu_fill_pattern(b, BIG, seed);
    tu_write_file(path, b, BIG);
    *bytes = b;
    return path;
}

/* A writer into pack at compression level 1 on threads workers. */
static ckpt_writer *writer_with(const char *pack, unsigned threads)
{
    ckpt_write_opts o = {.level = 1, .threads = threads};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    return w;
}

/* The pack's file name carries the SHA-256 of bytes. */
static void has_digest(ckpt_pack *p, const char *name, const uint8_t *bytes, size_t size)
{
    uint8_t want[32];
    tu_sha256(bytes, size, want);
    long k = ckpt_file_find(p, name);
    cr_assert_geq(k, 0, "%s", name);
    cr_assert_arr_eq(ckpt_file_at(p, (size_t)k)->sha256, want, 32, "%s", name);
}

Test(hash_lanes, several_big_files_get_their_own_digests)
{
    uint8_t *a, *b;
    char *pa = big_file("a.bin", 1, &a), *pb = big_file("b.bin", 2, &b);
    char *pack = tu_join(dir, "p.tpack");
    ckpt_writer *w = writer_with(pack, 3);
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_add_path(w, "a.bin", pa, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_path(w, "b.bin", pb, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    has_digest(p, "a.bin", a, BIG);
    has_digest(p, "b.bin", b, BIG);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(a);
    free(b);
    free(pa);
    free(pb);
    free(pack);
}

/* The lane is pointed at another file of the same size: what it reads is
 * not what was packed, as when a file changes between the two reads. */
Test(hash_lanes, a_second_read_that_differs_fails_the_pack)
{
    uint8_t *a, *b, *buf = malloc(BIG);
    char *pa = big_file("a.bin", 1, &a), *pb = big_file("b.bin", 2, &b);
    char *pack = tu_join(dir, "p.tpack");
    ckpt_write_opts o = {.level = 1, .threads = 2};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "a.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    int other = open(pb, O_RDONLY);
    cr_assert_eq(writer_file_rehash(w, other, BIG), 1, "a big file goes to a lane");
    close(other); /* the lane has its own descriptor */
    cr_assert_eq(ckpt_writer_write(w, a, BIG, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), -EAGAIN, "%s", e.msg);
    tu_assert_contains(e.msg, "changed while being packed");
    cr_assert_eq(access(pack, F_OK), -1, "no pack is left");
    free(a);
    free(b);
    free(buf);
    free(pa);
    free(pb);
    free(pack);
}

/* A source of ckpt_writer_add_reader_shared: bytes in memory, which the
 * hash lane reads again. With b set, the MiB at CHANGED reads as a the
 * first time and as b after, as a file changed between the packer's read
 * and the lane's would (both read it whole, 1 MiB-aligned). */
#define CHANGED (5u << 20)
typedef struct shared_src {
    const uint8_t *a, *b;
    uint64_t served;  /* bytes, over all threads (atomic) */
    int changed_seen; /* reads of the MiB at CHANGED (atomic) */
} shared_src;

static ssize_t shared_read(void *ud, void *buf, size_t len, uint64_t off)
{
    shared_src *s = ud;
    if (off >= BIG)
        return 0;
    size_t n = BIG - off < len ? (size_t)(BIG - off) : len;
    __atomic_fetch_add(&s->served, n, __ATOMIC_RELAXED);
    const uint8_t *from = s->a;
    if (s->b && off <= CHANGED && off + n > CHANGED &&
        __atomic_fetch_add(&s->changed_seen, 1, __ATOMIC_RELAXED) > 0)
        from = s->b;
    memcpy(buf, from + off, n);
    return (ssize_t)n;
}

/* The packer's path: a big file from a callback gets a hash lane (its
 * digest is right) and is read from several threads at once. */
Test(hash_lanes, a_shared_reader_gets_a_lane_and_the_right_digest)
{
    uint8_t *a = malloc(BIG);
    tu_fill_pattern(a, BIG, 3);
    shared_src s = {a, NULL, 0, 0};
    char *pack = tu_join(dir, "p.tpack");
    ckpt_writer *w = writer_with(pack, 4);
    ckpt_err e = {0};
    cr_assert_eq(
        ckpt_writer_add_reader_shared(w, "a.bin", shared_read, &s, BIG, 0644, 0, 0, NULL, &e), 0,
        "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    /* Packed once and hashed again by the lane: twice the file's bytes
     * (describing it reads a little more). */
    cr_assert_geq(s.served, 2ull * BIG, "the lane read the file again (%llu bytes served)",
                  (unsigned long long)s.served);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    has_digest(p, "a.bin", a, BIG);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(a);
    free(pack);
}

Test(hash_lanes, a_shared_reader_that_changes_fails_the_pack)
{
    uint8_t *a = malloc(BIG), *b = malloc(BIG);
    tu_fill_pattern(a, BIG, 3);
    tu_fill_pattern(b, BIG, 4);
    shared_src s = {a, b, 0, 0};
    char *pack = tu_join(dir, "p.tpack");
    ckpt_write_opts o = {.level = 1, .threads = 4};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    int rc = ckpt_writer_add_reader_shared(w, "a.bin", shared_read, &s, BIG, 0644, 0, 0, NULL, &e);
    if (rc == 0)
        rc = ckpt_writer_finish(w, NULL, &e);
    else
        ckpt_writer_abort(w);
    cr_assert_eq(rc, -EAGAIN, "%d %s", rc, e.msg);
    tu_assert_contains(e.msg, "changed while being packed");
    cr_assert_eq(s.changed_seen, 2, "read once to pack, once to hash");
    cr_assert_eq(access(pack, F_OK), -1, "no pack is left");
    free(a);
    free(b);
    free(pack);
}

/* ckptfs's packer's path (ckpt_readers_ahead): 18 big sources, more than
 * the window's ring, of which one is planned not to be hashed ahead and one
 * is left out after its lane was queued: every file added gets its own
 * bytes' digest, and the one left out is not in the pack. */
Test(hash_lanes, planned_readers_hashed_ahead)
{
    enum { N = 18, SKIPPED = 3, NOT_AHEAD = 5 };
    const size_t size = WRITER_LANE_MIN_BYTES;
    uint8_t *bytes[N];
    shared_src s[N];
    ckpt_planned_reader plan[N];
    for (int i = 0; i < N; i++) {
        bytes[i] = malloc(size);
        tu_fill_pattern(bytes[i], size, 100 + (uint32_t)i);
        s[i] = (shared_src){bytes[i], NULL, 0, 0};
        plan[i] = (ckpt_planned_reader){shared_read, &s[i], size, i != NOT_AHEAD};
    }
    char *pack = tu_join(dir, "p.tpack");
    ckpt_write_opts o = {.level = 1, .threads = 2};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    ckpt_readers_ahead *a = ckpt_readers_ahead_new(w, plan, N);
    cr_assert_not_null(a);
    for (int i = 0; i < N; i++) {
        if (i == SKIPPED)
            continue;
        char name[32];
        snprintf(name, sizeof name, "f%02d.bin", i);
        cr_assert_eq(ckpt_writer_add_reader_ahead(a, (size_t)i, name, 0644, 0, 0, NULL, &e), 0,
                     "%s", e.msg);
    }
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_readers_ahead_free(a);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_file_count(p), N - 1);
    cr_assert_lt(ckpt_file_find(p, "f03.bin"), 0, "the file left out is not packed");
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%02d.bin", i);
        long k = ckpt_file_find(p, name);
        if (i == SKIPPED)
            continue;
        uint8_t want[32];
        tu_sha256(bytes[i], size, want);
        cr_assert_geq(k, 0, "%s", name);
        cr_assert_arr_eq(ckpt_file_at(p, (size_t)k)->sha256, want, 32, "%s", name);
        cr_assert_geq(s[i].served, 2ull * size, "%s: packed, and read again by its lane", name);
    }
    cr_assert_eq(s[SKIPPED].served, size,
                 "its lane was queued ahead, and read it once (%llu bytes served)",
                 (unsigned long long)s[SKIPPED].served);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    for (int i = 0; i < N; i++)
        free(bytes[i]);
    free(pack);
}

/* Sources of the lanes' own tests: blocks of a pattern, each read slower
 * than a chain hashes it, logged in the order served. */
#define SLOW_BLOCK (64u << 10)
#define SLOW_BLOCKS 32
typedef struct slow_log {
    int order[4 * SLOW_BLOCKS]; /* the job of each read served, in order */
    int n;                      /* reads served (atomic) */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gate_open; /* 0: job 0's first read waits for it */
    int gated;     /* job 0's read is waiting */
} slow_log;
typedef struct slow_src {
    slow_log *log;
    int id;
    const uint8_t *bytes;
} slow_src;

static ssize_t slow_read(void *ud, void *buf, size_t len, uint64_t off)
{
    slow_src *s = ud;
    slow_log *g = s->log;
    if (s->id == 0) {
        pthread_mutex_lock(&g->gate_mu);
        g->gated = 1;
        pthread_cond_broadcast(&g->gate_cv);
        while (!g->gate_open)
            pthread_cond_wait(&g->gate_cv, &g->gate_mu);
        pthread_mutex_unlock(&g->gate_mu);
    }
    usleep(2000);
    int k = __atomic_fetch_add(&g->n, 1, __ATOMIC_RELAXED);
    if (k < 4 * SLOW_BLOCKS)
        g->order[k] = s->id;
    memcpy(buf, s->bytes + off, len);
    return (ssize_t)len;
}

/* Two chains on two lanes, with readers slower than either: both files are
 * read as they go, not the first whole before the second gets a block. */
Test(hash_lanes, scarce_readers_feed_every_running_chain)
{
    const size_t size = (size_t)SLOW_BLOCK * SLOW_BLOCKS;
    slow_log g = {
        .gate_mu = PTHREAD_MUTEX_INITIALIZER, .gate_cv = PTHREAD_COND_INITIALIZER, .gate_open = 1};
    uint8_t *bytes[2];
    slow_src src[2];
    hash_job job[2];
    hash_lanes *h = hash_lanes_start(2, SLOW_BLOCK);
    cr_assert_not_null(h);
    for (int i = 0; i < 2; i++) {
        bytes[i] = malloc(size);
        tu_fill_pattern(bytes[i], size, 200 + (uint32_t)i);
        src[i] = (slow_src){&g, i + 1, bytes[i]};
        job[i] = (hash_job){.fd = -1, .read = slow_read, .ud = &src[i], .size = size};
    }
    /* Both submitted back to back, so a slow fill of the second's bytes
     * cannot let the first be read whole before the second is queued. */
    for (int i = 0; i < 2; i++)
        hash_lanes_submit(h, &job[i]);
    hash_lanes_wait(h);
    hash_lanes_stop(h);
    int last_first = -1, second_before = 0;
    for (int k = 0; k < 2 * SLOW_BLOCKS; k++)
        if (g.order[k] == 1)
            last_first = k;
    for (int k = 0; k < last_first; k++)
        second_before += g.order[k] == 2;
    cr_assert_geq(second_before, SLOW_BLOCKS / 4,
                  "the second file got %d of its %d blocks read before the first's last",
                  second_before, SLOW_BLOCKS);
    for (int i = 0; i < 2; i++) {
        uint8_t want[32];
        tu_sha256(bytes[i], size, want);
        cr_assert_eq(job[i].rc, 0);
        cr_assert_arr_eq(job[i].sha256, want, 32);
        free(bytes[i]);
    }
}

static void *stop_lanes(void *h)
{
    hash_lanes_stop(h);
    return NULL;
}

/* Stopped while the one lane waits for job 0's first block: the jobs queued
 * behind it are cancelled without a read. */
Test(hash_lanes, jobs_not_started_are_not_read_after_stop)
{
    enum { JOBS = 5 };
    const size_t size = (size_t)SLOW_BLOCK * 4;
    slow_log g = {.gate_mu = PTHREAD_MUTEX_INITIALIZER, .gate_cv = PTHREAD_COND_INITIALIZER};
    uint8_t *bytes = calloc(1, size);
    slow_src src[JOBS];
    hash_job job[JOBS];
    hash_lanes *h = hash_lanes_start(1, SLOW_BLOCK);
    cr_assert_not_null(h);
    for (int i = 0; i < JOBS; i++) {
        src[i] = (slow_src){&g, i, bytes};
        job[i] = (hash_job){.fd = -1, .read = slow_read, .ud = &src[i], .size = size};
        hash_lanes_submit(h, &job[i]);
    }
    pthread_mutex_lock(&g.gate_mu);
    while (!g.gated)
        pthread_cond_wait(&g.gate_cv, &g.gate_mu);
    pthread_mutex_unlock(&g.gate_mu);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, stop_lanes, h), 0);
    usleep(100 * 1000); /* stopping is set by now */
    pthread_mutex_lock(&g.gate_mu);
    g.gate_open = 1;
    pthread_cond_broadcast(&g.gate_cv);
    pthread_mutex_unlock(&g.gate_mu);
    pthread_join(t, NULL);
    for (int k = 0; k < g.n; k++)
        cr_assert_eq(g.order[k], 0, "read %d was job %d's, queued behind the stop", k, g.order[k]);
    for (int i = 0; i < JOBS; i++)
        cr_assert_eq(job[i].rc, -ECANCELED, "job %d", i);
    free(bytes);
}

/* A later file's source whose reads wait until the test opens the gate, so
 * that its job stays queued on the lanes. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cv = PTHREAD_COND_INITIALIZER;
static int held_open;

static ssize_t held_read(void *ud, void *buf, size_t len, uint64_t off)
{
    pthread_mutex_lock(&held_mu);
    while (!held_open)
        pthread_cond_wait(&held_cv, &held_mu);
    pthread_mutex_unlock(&held_mu);
    memset(buf, 0, len);
    return (ssize_t)len;
}

/* Later files' jobs fill the lanes' queue (as 16 files queued ahead do):
 * the open file, whose own job was not queued ahead, still gets a lane. */
Test(hash_lanes, the_open_file_gets_a_lane_when_later_files_fill_the_queue)
{
    uint8_t *a = malloc(BIG);
    tu_fill_pattern(a, BIG, 5);
    shared_src s = {a, NULL, 0, 0};
    char *pack = tu_join(dir, "p.tpack");
    ckpt_writer *w = writer_with(pack, 2);
    ckpt_err e = {0};
    int queued = 0;
    for (int i = 0; i < 16; i++)
        queued += writer_prehash_reader(w, held_read, NULL, WRITER_LANE_MIN_BYTES) != NULL;
    cr_assert_geq(queued, 15, "later files' jobs queued: %d", queued);
    cr_assert_eq(ckpt_writer_begin_file(w, "a.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    int took = writer_file_rehash_reader(w, shared_read, &s, BIG);
    pthread_mutex_lock(&held_mu);
    held_open = 1;
    pthread_cond_broadcast(&held_cv);
    pthread_mutex_unlock(&held_mu);
    cr_assert_eq(took, 1, "the open file's job was refused a lane");
    cr_assert_eq(ckpt_writer_write(w, a, BIG, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    cr_assert_geq(s.served, BIG, "the lane read the file");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    has_digest(p, "a.bin", a, BIG);
    ckpt_close(p);
    free(a);
    free(pack);
}

/* The same with descriptors: later files' jobs stop one short of the cap,
 * the open file's job, which holds a descriptor, takes the last place, and
 * the next open file's is refused: the queue never holds more than 16 jobs
 * and so never more than 16 descriptors. */
Test(hash_lanes, the_open_files_descriptor_takes_the_last_place_and_no_more)
{
    uint8_t *a, *b;
    char *pa = big_file("a.bin", 6, &a), *pb = big_file("b.bin", 7, &b);
    char *pack = tu_join(dir, "p.tpack");
    ckpt_writer *w = writer_with(pack, 2);
    ckpt_err e = {0};
    int queued = 0;
    for (int i = 0; i < 16; i++)
        queued += writer_prehash_reader(w, held_read, NULL, WRITER_LANE_MIN_BYTES) != NULL;
    int took[2];
    const char *path[2] = {pa, pb};
    const uint8_t *bytes[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ckpt_writer_begin_file(w, i ? "b.bin" : "a.bin", 0644, 0, 0, &e), 0, "%s",
                     e.msg);
        int fd = open(path[i], O_RDONLY);
        cr_assert_geq(fd, 0);
        took[i] = writer_file_rehash(w, fd, BIG);
        close(fd);
        cr_assert_eq(ckpt_writer_write(w, bytes[i], BIG, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    }
    pthread_mutex_lock(&held_mu);
    held_open = 1;
    pthread_cond_broadcast(&held_cv);
    pthread_mutex_unlock(&held_mu);
    cr_assert_eq(queued, 15, "later files' jobs queued: %d", queued);
    cr_assert_eq(took[0], 1, "the open file's job was refused a lane");
    cr_assert_eq(took[1], 0, "a 17th job, with its descriptor, was queued");
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    for (int i = 0; i < 2; i++)
        has_digest(p, i ? "b.bin" : "a.bin", bytes[i], BIG);
    ckpt_close(p);
    free(a);
    free(b);
    free(pa);
    free(pb);
    free(pack);
}
