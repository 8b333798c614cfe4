/* A fixed set of threads running queued jobs. Urgent jobs (chunks a reader
 * is already waiting for) run before prefetch jobs. */
#ifndef CKPTFS_WORKER_POOL_H
#define CKPTFS_WORKER_POOL_H

/* cancelled is 1 when the pool shuts down before the job ran: the job must
 * then only release what it holds. */
typedef void (*work_fn)(void *arg, int cancelled);

typedef struct worker_pool worker_pool;

/* NULL on failure (errno set). */
worker_pool *worker_pool_new(unsigned threads, unsigned max_queued);
/* 0, or -EAGAIN when the queue is full or the pool is stopping: the caller
 * keeps ownership of arg. */
int worker_pool_submit(worker_pool *p, work_fn fn, void *arg, int urgent);
/* Cancels queued jobs, waits for running ones, joins the threads. */
void worker_pool_free(worker_pool *p);

#endif
