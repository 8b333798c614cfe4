/* Queuing the hash lanes of the big files a writer will add, ahead of it
 * (not for other modules than the code that feeds the pack writer).
 *
 * A big file's whole-file SHA-256 is a serial chain on a hash lane
 * (hash_lanes.h). Queued only when the writer reaches its file, the last
 * big file's chain starts when most of the encoding is done and runs after
 * it. A caller that knows the files it will add, in order, and their sizes
 * (a tree walk, ckptfs's packer) keeps a window over them instead: before
 * adding file i it calls lanes_ahead_next(), which queues the lanes of the
 * big files from i on, within AHEAD_FILES files and AHEAD_BYTES bytes, and
 * takes file i's slot, whose job the file adopts at begin_file
 * (writer_file_adopt). A file whose lane was not queued (too small, could
 * not be opened, lanes full) is added at its turn as before. */
#ifndef CKPT_LANES_AHEAD_H
#define CKPT_LANES_AHEAD_H

#include "common.h"
#include <sys/stat.h>

/* The window: the byte bound keeps what the lanes read ahead within what
 * the page cache is likely to hold when the encoder reads it again. One
 * file bigger than the bound still goes ahead alone: a tree of 5 GB shards
 * would otherwise never be hashed ahead. */
#define AHEAD_FILES 16
#define AHEAD_BYTES (4ull << 30)

/* A file of the window, as its queue callback left it. */
typedef struct ahead_slot {
    int fd;               /* the caller's descriptor, or -1: none (closed by lanes_ahead_end) */
    struct stat st;       /* the caller's, with fd */
    struct hash_job *job; /* its lane's job (writer_prehash*), or NULL: added as usual */
} ahead_slot;

/* File i's size as the caller knows it (0: never queued ahead); the same
 * answer each time: a queued file's is asked again when its slot is
 * released, to take it off the bytes held, until lanes_ahead_end. */
typedef uint64_t (*ahead_size_fn)(void *ud, size_t i);
/* Opens file i if need be and queues its lane, setting s->job (s->fd and
 * s->st are the callback's to set; s comes with fd -1). 1: queued; 0: not
 * this file (the window goes on with the next); -1: not now (the lanes are
 * full: again before the next file). On 0 and -1 a descriptor left in s->fd
 * is closed for the callback. */
typedef int (*ahead_queue_fn)(void *ud, size_t i, ahead_slot *s);

typedef struct lanes_ahead {
    /* A ring: file i's slot is ring[i % AHEAD_FILES], free again once
     * file i is taken, and the window looks no further than AHEAD_FILES
     * files past the one being added. */
    ahead_slot ring[AHEAD_FILES];
    size_t n;      /* files */
    size_t next;   /* the first file not considered yet */
    size_t done;   /* the first file whose slot is not released yet */
    uint64_t held; /* sizes of the files queued (a job in their slot), not released yet */
    ahead_size_fn size;
    ahead_queue_fn queue;
    void *ud;
} lanes_ahead;

void lanes_ahead_init(lanes_ahead *a, size_t n, ahead_size_fn size, ahead_queue_fn queue, void *ud);
/* Before adding file cur (files are added in order, any may be left out):
 * queues the lanes of the files from cur on, within the window, and takes
 * file cur's slot out of it: fd (the caller's to close now) -1 and job
 * NULL when nothing was queued for it. */
ahead_slot lanes_ahead_next(lanes_ahead *a, size_t cur);
/* Closes the descriptors of the files left in the window (their jobs stay
 * the writer's). */
void lanes_ahead_end(lanes_ahead *a);

#endif
