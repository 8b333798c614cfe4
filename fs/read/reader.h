/* Reads of files inside checkpoints: each read decodes only the chunks
 * that cover it, through the shared chunk cache, and a file read
 * sequentially gets the chunks ahead of it decoded on the worker pool.
 *
 * Sequential reading is recognised per file, not per open: the kernel is
 * told not to send opens at all (see op_open), so reads arrive without a
 * handle. A small table of streams remembers, for recently read files,
 * where each reader is; a few ways per file let several readers of one
 * file be followed at once. */
#ifndef CKPTFS_READER_H
#define CKPTFS_READER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "checkpoints.h"
#include "chunk_cache.h"
#include "common/worker_pool.h"

#define STREAM_SETS 64
#define STREAM_WAYS 4

typedef struct read_stream {
    uint64_t ino;           /* 0: unused */
    uint64_t start;         /* the lowest offset it has read from */
    uint64_t next_offset;   /* where this reader reads next */
    uint64_t prefetched_to; /* file position prefetch has covered */
    uint64_t last_use;
} read_stream;

typedef struct reader {
    checkpoint_table *table;
    chunk_cache *cache;
    worker_pool *pool;
    uint64_t prefetch_bytes; /* how far ahead of a sequential reader */
    unsigned spill_chunks;   /* how far past the end of a tensor, see prefetch() */
    pthread_mutex_t streams_lock;
    uint64_t clock;
    read_stream streams[STREAM_SETS * STREAM_WAYS];
} reader;

#define READ_PLAN_INLINE 20

typedef struct plan_chunk {
    chunk_entry *entry; /* pinned */
    size_t id;
    size_t file_index;    /* its file */
    uint64_t file_offset; /* where the chunk starts in its file */
    uint64_t position;    /* where the read starts in that file, for messages */
    int ends_here;        /* the read covers the chunk's last byte */
    int must_fill;
} plan_chunk;

/* The answer to one read: iovecs into pinned cache entries (or into the
 * manifest), valid until read_plan_release. */
typedef struct read_plan {
    struct iovec *iov;
    plan_chunk *chunks;
    size_t n, cap;  /* iovecs and chunks, one per covered chunk */
    int sequential; /* part of a sequential stream: chunks it ends are spent */
    struct iovec inline_iov[READ_PLAN_INLINE];
    plan_chunk inline_chunks[READ_PLAN_INLINE];
} read_plan;

void reader_init(reader *r, checkpoint_table *table, chunk_cache *cache, worker_pool *pool,
                 uint64_t cache_bytes, unsigned threads);
void reader_set_pool(reader *r, worker_pool *pool);
void reader_destroy(reader *r);

/* Reads node (a file of an open checkpoint, which the caller keeps alive).
 * 0 with the plan filled (maybe empty at end of file), or -EIO/-ENOMEM. */
int reader_read(reader *r, checkpoint *c, uint32_t node, uint64_t offset, size_t size,
                read_plan *plan);
void read_plan_release(reader *r, read_plan *plan);

#endif
