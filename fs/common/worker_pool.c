#include "worker_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct job {
    struct job *next;
    work_fn fn;
    void *arg;
} job;

typedef struct job_queue {
    job *head, *tail;
} job_queue;

struct worker_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    job_queue urgent, background;
    unsigned queued, max_queued;
    int stopping;
    unsigned n_threads;
    pthread_t *threads;
};

static void queue_push(job_queue *q, job *j)
{
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
}

static job *queue_pop(job_queue *q)
{
    job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
    }
    return j;
}

static void *worker_main(void *arg)
{
    worker_pool *p = arg;
    pthread_setname_np(pthread_self(), "ckptfs-worker");
    pthread_mutex_lock(&p->lock);
    for (;;) {
        job *j = queue_pop(&p->urgent);
        if (!j)
            j = queue_pop(&p->background);
        if (!j) {
            if (p->stopping)
                break;
            pthread_cond_wait(&p->wake, &p->lock);
            continue;
        }
        p->queued--;
        pthread_mutex_unlock(&p->lock);
        j->fn(j->arg, 0);
        free(j);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

worker_pool *worker_pool_new(unsigned threads, unsigned max_queued)
{
    worker_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->threads = calloc(threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->max_queued = max_queued;
    for (unsigned i = 0; i < threads; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc) {
            worker_pool_free(p);
            errno = rc;
            return NULL;
        }
        p->n_threads++;
    }
    return p;
}

int worker_pool_submit(worker_pool *p, work_fn fn, void *arg, int urgent)
{
    job *j = malloc(sizeof *j);
    if (!j)
        return -EAGAIN;
    j->fn = fn;
    j->arg = arg;
    pthread_mutex_lock(&p->lock);
    if (p->stopping || p->queued >= p->max_queued) {
        pthread_mutex_unlock(&p->lock);
        free(j);
        return -EAGAIN;
    }
    queue_push(urgent ? &p->urgent : &p->background, j);
    p->queued++;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

static void cancel_jobs(job *j)
{
    while (j) {
        job *next = j->next;
        j->fn(j->arg, 1);
        free(j);
        j = next;
    }
}

void worker_pool_free(worker_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    job *urgent = p->urgent.head, *background = p->background.head;
    p->urgent.head = p->urgent.tail = NULL;
    p->background.head = p->background.tail = NULL;
    p->queued = 0;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    cancel_jobs(urgent);
    cancel_jobs(background);
    for (unsigned i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}
