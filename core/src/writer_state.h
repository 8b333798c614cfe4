/* The writer's state, shared by the two files that drive its pipeline:
 * pack_write.c (the pipeline, new files, the index) and pack_copy.c (files
 * copied as stored from an earlier generation). Nothing else includes it. */
#ifndef CKPT_WRITER_STATE_H
#define CKPT_WRITER_STATE_H

#include "writer.h"
#include "sha256.h"
#include "crypto.h"
#include "format.h"
#include "hash_lanes.h"
#include "pack.h"
#include "store/store.h"

#include <pthread.h>

enum { SLOT_FREE, SLOT_FILLING, SLOT_QUEUED, SLOT_ENCODED, SLOT_WRITTEN };

typedef struct tensor_hash {
    ckpt_sha256 st;
    uint8_t digest[32];
    uint64_t next_id; /* the chunk whose part is hashed next (under mu) */
} tensor_hash;

/* The SHA-256 of a tensor assembled from parts (a DCP tensor saved in
 * dim-0 chunks): one chain over the parts' bytes in the order they are
 * submitted, which is the tensor's order, or the tensor is not assembled
 * (see writer_chunk_of). Spans are numbered as they are submitted and
 * hashed in that order. */
typedef struct chain_hash {
    ckpt_sha256 st;
    uint64_t assigned; /* spans numbered so far (producer) */
    uint64_t next_seq; /* the span hashed next (under mu) */
} chain_hash;

/* The part [a, b) of a chunk that belongs to one tensor; last: the tensor
 * ends in this chunk, so its digest can be finished. ch: the assembled
 * tensor's chain it also feeds, as span seq of it, or NULL. */
typedef struct wspan {
    tensor_hash *th;
    uint32_t a, b;
    int last;
    chain_hash *ch;
    uint64_t seq;
    int parked; /* encoded before its tensor's previous chunk was hashed:
                 * left for whoever hashes that one (under mu) */
} wspan;

/* A read of the slot's bytes [dst, dst + n) from a source, left to the
 * worker that encodes the slot (writer_feed_from), so reading spreads over
 * the workers instead of running on the producer's one thread. */
typedef struct wfill {
    writer_fill_fn fill;
    void *ud;
    uint64_t src_off;
    uint32_t dst, n;
} wfill;
#define SLOT_FILLS 4

typedef struct wslot {
    uint8_t *in, *out;
    wfill fills[SLOT_FILLS]; /* still to be read into in */
    unsigned n_fills;
    int filled; /* in holds all of its bytes (under mu) */
    size_t in_len, out_len;
    uint64_t id, extent_id, in_extent;
    wspan *spans; /* tensors whose bytes the chunk holds */
    size_t n_spans, cap_spans;
    uint8_t codec, elem; /* elem: the chunk record's (the encoder may group opaque data) */
    int opaque;          /* of an opaque extent: the encoder picks the grouping */
    uint32_t crc;
    int state;
    int pending;            /* of output, file hash and parked spans: the slot is free when
                             * all are done */
    unsigned n_parked;      /* spans parked in it (under mu) */
    ckpt_sha256 *file_hash; /* of the chunk's file; NULL: a hash lane does it */
    hash_job *job;          /* the lane's job of the chunk's file, or NULL */
    uint32_t src_crc;       /* with job: CRC-32 of in, for job->fed_crc */
    /* A chunk copied from another pack (ckpt_writer_copy_file): out holds
     * its stored bytes, which the worker only re-seals. */
    const ckpt_pack *copy_src;
    uint64_t copy_src_id;
} wslot;

typedef struct wfile {
    char *path;
    uint32_t mode;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint64_t size;
    uint8_t sha256[32];
    uint64_t first_extent, n_extents;
    uint8_t container;
    char *note;        /* NULL: none */
    ckpt_sha256 *hash; /* the hash thread's; finished at finish; NULL: copied */
    hash_job *job;     /* or a hash lane's (hash_lanes.h); NULL: none */
} wfile;

typedef struct wextent {
    uint64_t length, first_chunk;
    uint8_t kind, elem;
} wextent;

typedef struct wtensor {
    char *name;
    char dtype[16];
    uint32_t ndim;
    uint64_t *shape;
    uint64_t nbytes;
    uint32_t file_index;
    uint64_t extent_index, extent_offset;
    tensor_hash *hash;
    chain_hash *chain; /* a part's assembled tensor's, or NULL */
} wtensor;

/* The chunks of one tensor of one DCP directory (scope), gathered as
 * they are added, to be recorded as one assembled tensor at finish when
 * they tile it along dim 0. */
typedef struct wgroup {
    char *scope, *whole;
    char dtype[16];
    uint32_t ndim;
    uint64_t *shape;
    uint64_t rows; /* dim-0 rows of the parts so far */
    size_t *parts;
    size_t n_parts, cap_parts;
    int broken;    /* a part out of order, overlapping, or of another shape */
    int assembled; /* finish: recorded, with digest */
    uint8_t digest[32];
    chain_hash *ch;
} wgroup;

typedef struct wchunk {
    uint64_t offset;
    uint32_t stored, raw, crc;
    uint8_t codec, elem;
} wchunk;

struct ckpt_writer {
    store_upload *out;     /* the pack being written; NULL once committed */
    ckpt_store *own_store; /* the store made for a path-based open, freed with w */
    char *final_path;      /* for messages: the path, or "<store>/<name>" */
    dev_t dev;
    ino_t ino;
    uint32_t chunk_size;
    int level;
    ckpt_write_opts opts;
    uint8_t header[TPACK_HEADER_SIZE];
    uint8_t pack_id[16];
    pack_keys keys;

    wfile *files;
    size_t n_files, cap_files;
    wextent *extents;
    size_t n_extents, cap_extents;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    wchunk *chunks;
    size_t n_chunks, cap_chunks; /* output thread only until finish */
    ckpt_skipped_info *skipped;
    size_t n_skipped, cap_skipped; /* name and reason malloc'd */
    wgroup *groups;
    size_t n_groups, cap_groups;
    strmap file_map, dir_map, tensor_map, group_map; /* group_map keys malloc'd */

    /* Producer state. A typed extent is open (in_region) after begin_region
     * or begin_tensor (in_tensor, the tensor being cur_tensor). live holds
     * the tensors of the open typed extent whose bytes have not all been
     * handed to the pipeline yet. */
    int in_file, in_region, in_tensor, extent_open;
    size_t cur_tensor;
    size_t *live;
    size_t n_live, cap_live;
    uint64_t file_bytes, region_bytes, fed;
    wslot *filling;

    /* Pipeline. */
    pthread_mutex_t mu;
    pthread_cond_t to_encode, to_write, to_fill, to_hash, tensor_hashed, slot_filled;
    wslot *slots;
    size_t n_slots;
    uint64_t submitted, next_encode, next_write, next_hash;
    uint64_t fills_pending; /* submitted slots whose fills no worker has done yet */
    int stopping, failed;
    ckpt_err fail_err;
    pthread_t *workers;
    unsigned n_workers;
    pthread_t out_thread, hash_thread;
    int out_started, hash_started;
    hash_lanes *lanes; /* started by the first file big enough */
    /* Jobs queued before their file was added (writer_prehash), not yet
     * adopted by it: freed with the writer, after the lanes stop. */
    hash_job **early;
    size_t n_early, cap_early;
    unsigned n_threads;
    uint64_t write_pos;

    /* ckpt_writer_set_sibling_reader: siblings of files added by reader */
    ckpt_sibling_fn sibling_fn;
    void *sibling_ud;
};

/* The pipeline's producer side (pack_write.c). */
void writer_set_failed(ckpt_writer *w, const ckpt_err *e);
int writer_open_extent(ckpt_writer *w, uint8_t kind, uint8_t elem, ckpt_err *err);
void writer_close_extent(ckpt_writer *w);
/* Takes the next slot for the open extent as w->filling. */
int writer_acquire_slot(ckpt_writer *w, ckpt_err *err);
/* Queues w->filling for encoding, hashing and output. */
void writer_submit_slot(ckpt_writer *w);

#endif
