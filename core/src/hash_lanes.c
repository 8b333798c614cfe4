/* Lanes of hash_lanes.h: a FIFO of jobs, n lane threads that each take one
 * job at a time and run its SHA-256 chain, and n reader threads that read
 * the lanes' files ahead of them, block by block, and take each block's
 * CRC-32.
 *
 * Why readers apart from the chains: a lane that read and checksummed its
 * own file spent about a fifth of its time on that (0.11 CPU-s per 177 MB
 * shard against 0.088 for SHA-256 alone, on this machine's SHA-NI), and a
 * lane's thread is the serial part of the pack. Readers take any lane's
 * next block, so one file's blocks are read by several readers at once, and
 * reading a sealed staging file (ckptfs decrypts it in its read callback)
 * spreads the same way. Each lane has WINDOW block buffers: block b goes in
 * buffer b % WINDOW once the chain has hashed block b - WINDOW.
 *
 * Why a condition variable per waiter kind: one for everything woke every
 * idle lane and every waiting reader about twice per block; now a block
 * read wakes its lane alone, a buffer freed wakes one reader, and only job
 * changes (a few per file) wake the idle lanes. */
#include "hash_lanes.h"
#include "sha256.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zlib.h>

#define WINDOW 4

typedef struct lane {
    struct hash_lanes *h;
    hash_job *job; /* the job being hashed; NULL: idle */
    uint8_t *buf[WINDOW];
    int ready[WINDOW]; /* the block is read (or failed: rc) */
    uint32_t crc[WINDOW];
    uint64_t n_blocks, next_read, next_hash;
    unsigned in_flight; /* readers reading into its buffers */
    int rc;             /* the first read's failure */
    uint64_t hashed;    /* bytes of all its jobs so far */
    pthread_cond_t cv;  /* its block read, its read failed, or stopping */
} lane;

struct hash_lanes {
    pthread_mutex_t mu;
    pthread_cond_t to_read; /* a block to read, or stopping */
    pthread_cond_t to_take; /* a job an idle lane may take, or stopping */
    pthread_cond_t done;
    hash_job *head, *tail;
    size_t pending; /* queued or running */
    int stopping;
    size_t block;
    lane *lanes;
    pthread_t *tids; /* n lanes, then n readers */
    unsigned n, started, lanes_started;
    unsigned next_lane; /* where readers start looking: the lanes take turns */
};

/* ckpt_pread_full's contract from a job's read callback. */
static ssize_t read_full(const hash_job *j, uint8_t *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = j->read(j->ud, buf + done, n - done, off + done);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static size_t block_len(const hash_lanes *h, const hash_job *j, uint64_t b)
{
    uint64_t left = j->size - b * h->block;
    return left < h->block ? (size_t)left : h->block;
}

/* A lane with a block to read and a free buffer for it, or NULL: of those,
 * the one with the fewest blocks read or being read ahead of its chain, so
 * that scarce readers keep every running chain fed. Taking the first lane
 * that had one starved the others while reads were slower than the chains
 * (a sealed staging file, decrypted in its read callback): the first lane's
 * file was read whole before the second's got a block. */
static lane *lane_to_read(hash_lanes *h)
{
    lane *best = NULL;
    for (unsigned k = 0; k < h->n; k++) {
        lane *l = &h->lanes[(h->next_lane + k) % h->n];
        if (l->job && !l->rc && l->next_read < l->n_blocks &&
            l->next_read < l->next_hash + WINDOW &&
            (!best || l->next_read - l->next_hash < best->next_read - best->next_hash))
            best = l;
    }
    if (best)
        h->next_lane = (unsigned)(best - h->lanes + 1) % h->n;
    return best;
}

static void *reader(void *arg)
{
    hash_lanes *h = arg;
    pthread_setname_np(pthread_self(), "ckpt-hashread");
    pthread_mutex_lock(&h->mu);
    for (;;) {
        lane *l;
        while (!(l = lane_to_read(h)) && !h->stopping)
            pthread_cond_wait(&h->to_read, &h->mu);
        /* l is NULL only when stopping, and then no new read even where
         * there is one: each may be a slow callback (a decrypt, an S3 GET)
         * whose bytes nobody will hash. */
        if (h->stopping)
            break;
        hash_job *j = l->job;
        uint64_t b = l->next_read++;
        unsigned slot = (unsigned)(b % WINDOW);
        l->in_flight++;
        pthread_mutex_unlock(&h->mu);
        size_t n = block_len(h, j, b);
        uint64_t off = b * h->block;
        ssize_t r = j->fd >= 0 ? ckpt_pread_full(j->fd, l->buf[slot], n, off)
                               : read_full(j, l->buf[slot], n, off);
        uint32_t crc = r == (ssize_t)n ? (uint32_t)libdeflate_crc32(0, l->buf[slot], n) : 0;
        pthread_mutex_lock(&h->mu);
        if (r != (ssize_t)n && !l->rc)
            l->rc = r < 0 ? (int)r : -EIO; /* shorter than when it was added */
        l->crc[slot] = crc;
        l->ready[slot] = 1;
        l->in_flight--;
        pthread_cond_signal(&l->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* The job's chain, over blocks the readers fill; called and returns with
 * h->mu held. */
static void run_job(hash_lanes *h, lane *l, hash_job *j)
{
    ckpt_sha256 st;
    ckpt_sha256_init(&st);
    uint32_t crc = 0;
    for (int i = 0; i < WINDOW; i++)
        l->ready[i] = 0;
    l->n_blocks = (j->size + h->block - 1) / h->block;
    l->next_read = l->next_hash = 0;
    l->rc = 0;
    l->job = j;
    pthread_cond_broadcast(&h->to_read);
    while (l->next_hash < l->n_blocks) {
        unsigned slot = (unsigned)(l->next_hash % WINDOW);
        while (!l->ready[slot] && !l->rc && !h->stopping)
            pthread_cond_wait(&l->cv, &h->mu);
        if (h->stopping && !l->rc)
            l->rc = -ECANCELED;
        if (l->rc)
            break;
        size_t n = block_len(h, j, l->next_hash);
        pthread_mutex_unlock(&h->mu);
        ckpt_sha256_update(&st, l->buf[slot], n);
        crc = (uint32_t)crc32_combine(crc, l->crc[slot], (z_off_t)n);
        pthread_mutex_lock(&h->mu);
        l->ready[slot] = 0;
        l->next_hash++;
        if (l->next_read < l->n_blocks)
            pthread_cond_signal(&h->to_read); /* a buffer for one block */
    }
    /* No reader may still be writing into the buffers or reading the file. */
    while (l->in_flight)
        pthread_cond_wait(&l->cv, &h->mu);
    l->job = NULL;
    l->hashed += j->size;
    if (h->head)
        pthread_cond_broadcast(&h->to_take); /* idle now: the next lane may differ */
    ckpt_sha256_final(&st, j->sha256);
    j->crc = crc;
    j->rc = l->rc;
}

/* Whether l is the idle lane that has hashed least (the first such): the
 * one to take the next job, so that files spread over the lanes' threads
 * instead of following each other on whichever thread wakes first, which
 * would make one thread's time the sum of several chains. */
static int lane_is_next(const hash_lanes *h, const lane *l)
{
    for (unsigned i = 0; i < h->lanes_started; i++) {
        const lane *o = &h->lanes[i];
        if (o != l && !o->job && (o->hashed < l->hashed || (o->hashed == l->hashed && o < l)))
            return 0;
    }
    return 1;
}

static void *lane_main(void *arg)
{
    lane *l = arg;
    hash_lanes *h = l->h;
    pthread_setname_np(pthread_self(), "ckpt-hash");
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!(h->head && lane_is_next(h, l)) && !h->stopping)
            pthread_cond_wait(&h->to_take, &h->mu);
        /* Jobs not taken by then are hash_lanes_stop's to cancel, unread. */
        if (h->stopping)
            break;
        hash_job *j = h->head;
        h->head = j->next;
        if (h->head)
            pthread_cond_broadcast(&h->to_take); /* another idle lane is next now */
        else
            h->tail = NULL;
        run_job(h, l, j);
        if (j->fd >= 0)
            close(j->fd);
        j->fd = -1;
        h->pending--;
        pthread_cond_broadcast(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

hash_lanes *hash_lanes_start(unsigned n, size_t block)
{
    if (n == 0)
        n = 1;
    hash_lanes *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->lanes = calloc(n, sizeof *h->lanes);
    h->tids = calloc(2 * (size_t)n, sizeof *h->tids);
    h->block = block;
    h->n = n;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->to_read, NULL);
    pthread_cond_init(&h->to_take, NULL);
    pthread_cond_init(&h->done, NULL);
    int ok = h->lanes && h->tids;
    for (unsigned i = 0; h->lanes && i < n; i++)
        pthread_cond_init(&h->lanes[i].cv, NULL);
    for (unsigned i = 0; ok && i < n; i++) {
        h->lanes[i].h = h;
        for (int k = 0; k < WINDOW; k++)
            ok = ok && (h->lanes[i].buf[k] = malloc(block)) != NULL;
    }
    /* Lanes first, then readers, which serve any lane: any number of
     * readers above 0 works. */
    for (unsigned i = 0; ok && i < n; i++)
        if ((ok = pthread_create(&h->tids[h->started], NULL, lane_main, &h->lanes[i]) == 0))
            h->started++;
    unsigned lanes = h->lanes_started = h->started;
    for (unsigned i = 0; ok && i < n; i++)
        if ((ok = pthread_create(&h->tids[h->started], NULL, reader, h) == 0))
            h->started++;
    if (lanes == 0 || h->started == lanes) {
        hash_lanes_stop(h);
        return NULL;
    }
    /* Fewer threads than asked: the started lanes share the queue. */
    return h;
}

void hash_lanes_submit(hash_lanes *h, hash_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&h->mu);
    if (h->tail)
        h->tail->next = j;
    else
        h->head = j;
    h->tail = j;
    h->pending++;
    pthread_cond_broadcast(&h->to_take);
    pthread_mutex_unlock(&h->mu);
}

size_t hash_lanes_pending(hash_lanes *h)
{
    pthread_mutex_lock(&h->mu);
    size_t n = h->pending;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void hash_lanes_wait(hash_lanes *h)
{
    pthread_mutex_lock(&h->mu);
    while (h->pending)
        pthread_cond_wait(&h->done, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void hash_lanes_stop(hash_lanes *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_cond_broadcast(&h->to_read);
    pthread_cond_broadcast(&h->to_take);
    for (unsigned i = 0; h->lanes && i < h->n; i++)
        pthread_cond_broadcast(&h->lanes[i].cv);
    pthread_mutex_unlock(&h->mu);
    for (unsigned i = 0; i < h->started; i++)
        pthread_join(h->tids[i], NULL);
    /* Left in the queue: no lane will take them now. */
    for (hash_job *j = h->head; j; j = j->next) {
        if (j->fd >= 0)
            close(j->fd);
        j->fd = -1;
        j->rc = -ECANCELED;
    }
    for (unsigned i = 0; h->lanes && i < h->n; i++) {
        for (int k = 0; k < WINDOW; k++)
            free(h->lanes[i].buf[k]);
        pthread_cond_destroy(&h->lanes[i].cv);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->to_read);
    pthread_cond_destroy(&h->to_take);
    pthread_cond_destroy(&h->done);
    free(h->lanes);
    free(h->tids);
    free(h);
}
