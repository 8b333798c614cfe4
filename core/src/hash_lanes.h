/* Whole-file SHA-256 on threads of their own, reading the file again from a
 * descriptor, so that several files hash at once (not for other modules
 * than the pack writer).
 *
 * Reader threads of their own read the files ahead of the lanes, block by
 * block and several at once, so that a lane's thread runs nothing but its
 * file's SHA-256 chain (hash_lanes.c says why).
 *
 * Why a second read: a pack stores files one after another, and the writer
 * holds only a bounded ring of chunks, so the hash of file k, fed from the
 * ring, would have to finish before file k+1 could enter it: one SHA-256
 * chain (about 2 GB/s with SHA-NI) would bound the whole pack. Read again
 * from the page cache, each big file's chain runs in a lane beside the
 * others. The lane also takes the CRC-32 of what it read, which the writer
 * compares with the CRC-32 of the bytes it packed: a file that changed
 * between the two reads fails the pack instead of getting a wrong digest. */
#ifndef CKPT_HASH_LANES_H
#define CKPT_HASH_LANES_H

#include "common.h"

typedef struct hash_job {
    int fd; /* owned: closed when the job is done; -1: read through read */
    /* Where fd is -1: the file's source, which answers from any thread
     * until the job is done (ckpt_writer_add_reader's callback). */
    ckpt_read_fn read;
    void *ud;
    uint64_t size;
    uint8_t sha256[32]; /* results, once hash_lanes_wait() returned */
    uint32_t crc;
    int rc;           /* 0, or -errno (-EIO: the file is shorter) */
    uint32_t fed_crc; /* the writer's: CRC-32 of the bytes it packed */
    struct hash_job *next;
} hash_job;

typedef struct hash_lanes hash_lanes;

/* n lane threads and n readers, with a few buffers of block bytes per lane;
 * NULL on failure. */
hash_lanes *hash_lanes_start(unsigned n, size_t block);
/* Queues a job; lanes take jobs in the order given. */
void hash_lanes_submit(hash_lanes *h, hash_job *j);
/* Jobs submitted and not yet done. */
size_t hash_lanes_pending(hash_lanes *h);
/* Waits until every job submitted is done. */
void hash_lanes_wait(hash_lanes *h);
/* Stops the lanes (jobs not started are left with rc -ECANCELED, fds
 * closed) and frees h; the jobs stay the caller's. */
void hash_lanes_stop(hash_lanes *h);

#endif
