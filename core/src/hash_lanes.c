/* Lanes of hash_lanes.h: a FIFO of jobs and n threads that each take one
 * job at a time and read its file through from offset 0. */
#include "hash_lanes.h"
#include "sha256.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <libdeflate.h>

struct hash_lanes {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    hash_job *head, *tail;
    size_t pending; /* queued or running */
    int stopping;
    size_t block;
    pthread_t *tids;
    unsigned n;
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

static void run_job(hash_lanes *h, hash_job *j, uint8_t *buf)
{
    ckpt_sha256 st;
    ckpt_sha256_init(&st);
    uint32_t crc = 0;
    uint64_t off = 0;
    int rc = 0;
    while (off < j->size) {
        pthread_mutex_lock(&h->mu);
        int stop = h->stopping;
        pthread_mutex_unlock(&h->mu);
        if (stop) {
            rc = -ECANCELED;
            break;
        }
        size_t n = j->size - off < h->block ? (size_t)(j->size - off) : h->block;
        ssize_t r = j->fd >= 0 ? ckpt_pread_full(j->fd, buf, n, off) : read_full(j, buf, n, off);
        if (r < 0) {
            rc = (int)r;
            break;
        }
        if ((size_t)r < n) {
            rc = -EIO;
            break;
        }
        ckpt_sha256_update(&st, buf, n);
        crc = (uint32_t)libdeflate_crc32(crc, buf, n);
        off += n;
    }
    ckpt_sha256_final(&st, j->sha256);
    j->crc = crc;
    j->rc = rc;
}

static void *lane(void *arg)
{
    hash_lanes *h = arg;
    pthread_setname_np(pthread_self(), "ckpt-hash");
    uint8_t *buf = malloc(h->block);
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->head && !h->stopping)
            pthread_cond_wait(&h->work, &h->mu);
        hash_job *j = h->head;
        if (!j)
            break;
        h->head = j->next;
        if (!h->head)
            h->tail = NULL;
        pthread_mutex_unlock(&h->mu);
        if (buf)
            run_job(h, j, buf);
        else
            j->rc = -ENOMEM;
        if (j->fd >= 0)
            close(j->fd);
        j->fd = -1;
        pthread_mutex_lock(&h->mu);
        h->pending--;
        pthread_cond_broadcast(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    free(buf);
    return NULL;
}

hash_lanes *hash_lanes_start(unsigned n, size_t block)
{
    hash_lanes *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->tids = calloc(n ? n : 1, sizeof *h->tids);
    if (!h->tids) {
        free(h);
        return NULL;
    }
    h->block = block;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->work, NULL);
    pthread_cond_init(&h->done, NULL);
    for (; h->n < n; h->n++)
        if (pthread_create(&h->tids[h->n], NULL, lane, h) != 0)
            break;
    if (h->n == 0) {
        hash_lanes_stop(h);
        return NULL;
    }
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
    pthread_cond_signal(&h->work);
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
    pthread_cond_broadcast(&h->work);
    pthread_mutex_unlock(&h->mu);
    for (unsigned i = 0; i < h->n; i++)
        pthread_join(h->tids[i], NULL);
    /* Left in the queue: no lane will take them now. */
    for (hash_job *j = h->head; j; j = j->next) {
        if (j->fd >= 0)
            close(j->fd);
        j->fd = -1;
        j->rc = -ECANCELED;
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->work);
    pthread_cond_destroy(&h->done);
    free(h->tids);
    free(h);
}
