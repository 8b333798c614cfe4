/* stage_blob's private parts, shared by its two files and its white-box
 * test: stage_blob.c (opening, the block buffer, reads and writes) and
 * stage_blob_log.c (the sealed record log: records, the block map,
 * compaction and parallel sealing). Not for other modules. */
#ifndef CKPTFS_STAGE_BLOB_INTERNAL_H
#define CKPTFS_STAGE_BLOB_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "stage_blob.h"

#define REC_MAGIC 0x42534B43u /* "CKSB" */
#define REC_HEADER 24u
#define REC_NONCE STAGE_NONCE
#define REC_TAG STAGE_TAG
#define REC_OVERHEAD (REC_HEADER + REC_NONCE + REC_TAG)
#define REC_AD (8u + REC_HEADER)
enum { REC_DATA = 1, REC_SIZE = 2 };
/* Compact once dead records outweigh live ones by this much. */
#define COMPACT_SLACK (8ull << 20)
/* Map entries pack the record offset (+1, so 0 means "no record") above
 * the block's plaintext length - 1. */
#define MAP_OFF(e) (((e) >> 16) - 1)
#define MAP_LEN(e) ((uint32_t)((e)&0xffffu) + 1)
#define MAP_MAX_OFF ((1ull << 47) - 2)
/* 4096 entries per map page (256 MiB of file); at most 2^20 pages, so a
 * sealed file holds up to 256 TiB. */
#define MAP_PAGE 4096u
#define MAP_MAX_PAGES (1u << 20)

struct stage_blob {
    pthread_mutex_t lock;
    int dirfd, fd;
    uint64_t id;
    char name[24];
    const stage_key *key; /* NULL: plain */
    uint64_t size;
    uint64_t fits; /* plain: a size its file system is known to allow */
    int unlinked;
    int need_dir_sync; /* created or compacted; its name is not known durable yet */
    /* A write that failed after its answer (stage_ack): its error for the
     * next flush or fsync, whether the next write is still to be refused
     * with it, and why. */
    int late_err, late_refuse;
    char late_msg[sizeof((ckpt_err *)0)->msg];

    /* Sealed blobs only. */
    uint64_t **pages; /* block -> newest record, see map_slot */
    size_t n_pages;
    uint64_t log_end, live_bytes;
    uint64_t compact_retry; /* a compaction failed: not again before log_end reaches this */
    uint8_t *buf;           /* one block of plaintext */
    uint64_t buf_block;
    uint32_t buf_len; /* plaintext bytes of that block (the rest is zero) */
    int buf_valid, buf_dirty;
    uint8_t *rec; /* a record being sealed or opened */
};

#define BATCH_BLOCKS 16u
#define BATCH_STRIDE (REC_OVERHEAD + STAGE_BLOCK)

typedef struct seal_job {
    const stage_blob *b;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t first_block;
    size_t n, next;
} seal_job;

int blob_append_records(stage_blob *b, const uint8_t *recs, size_t n, uint64_t *at, ckpt_err *err);
int blob_append_record(stage_blob *b, int type, uint64_t block, const uint8_t *plain, uint32_t plen,
                       uint64_t *at, ckpt_err *err);
int blob_load_record(stage_blob *b, uint64_t off, int type, uint64_t block, uint32_t plen,
                     uint8_t *out, ckpt_err *err);
/* Opens the sealed record r (REC_OVERHEAD + plen bytes, already read)
 * into out: 0, or -EIO if it is not that record or fails to authenticate. */
int blob_open_record(const stage_blob *b, const uint8_t *r, int type, uint64_t block, uint32_t plen,
                     uint8_t *out);
/* A DATA record read under the blob's lock by blob_fetch_record, its
 * ciphertext already in out, to be opened there by blob_open_fetched
 * after the lock is released: so that readers of one blob on several
 * threads (the packer's workers) decrypt at once instead of in turn. */
typedef struct fetched_rec {
    uint8_t head[REC_HEADER + REC_NONCE], tag[REC_TAG];
    uint8_t *out;
    uint64_t block;
    uint32_t plen;
} fetched_rec;
int blob_fetch_record(stage_blob *b, uint64_t off, uint64_t block, uint32_t plen, uint8_t *out,
                      fetched_rec *f, ckpt_err *err);
int blob_open_fetched(const stage_blob *b, fetched_rec *f, ckpt_err *err);
uint64_t *blob_map_slot(stage_blob *b, uint64_t block, int create);
uint64_t blob_map_get(stage_blob *b, uint64_t block);
int blob_map_set(stage_blob *b, uint64_t block, uint64_t off, uint32_t plen);
void blob_map_drop_from(stage_blob *b, uint64_t first);
uint64_t blob_blocks_for(uint64_t size);
int blob_compact(stage_blob *b, ckpt_err *err);
/* Compacts the log if dead records outweigh live ones. Compaction only
 * gives space back, so its failure (a disk too full for the copy, say)
 * fails no write: the log stays as it was, whole, the failure is logged
 * and the next try waits until the log has grown by COMPACT_SLACK. An
 * unlinked blob is never compacted: the rename would give it its name
 * back, a file nobody removes. */
void blob_maybe_compact(stage_blob *b);
void blob_seal_parallel(seal_job *j);
int blob_fail_io(stage_blob *b, ckpt_err *err, int code, const char *what);
int blob_ensure_fd(stage_blob *b, ckpt_err *err);
int blob_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
int blob_pread_all(int fd, void *buf, size_t len, uint64_t off);

#endif
