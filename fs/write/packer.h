/* Packs the staged files of one checkpoint into BACKING/NAME.tpack with the
 * library's streaming writer: written as BACKING/.NAME.tpack.tmp, fsynced,
 * renamed into place and the directory fsynced (ckpt_writer_finish), so
 * NAME.tpack is either absent or complete. Files go in in byte order of
 * their paths, *.safetensors and *.npy indexed as tensors, exactly as
 * `ckpt pack` would pack the same tree. FUSE-free; runs on whatever thread
 * calls it (ckptfs runs it on its packer thread). */
#ifndef CKPTFS_PACKER_H
#define CKPTFS_PACKER_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "stage_blob.h"

typedef struct packer_file {
    char *path;       /* path inside the pack */
    stage_blob *blob; /* or, when NULL: */
    ckpt_pack *base;  /* file base_index of this pack, copied */
    size_t base_index;
    uint64_t size;
    uint32_t mode;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
} packer_file;

typedef struct packer_job {
    int backing_fd;           /* where the pack goes */
    const char *backing_path; /* the same, for messages */
    ckpt_store *store;        /* the same, as the store the pack is written to */
    int remote;               /* store is not the backing directory (S3):
                               * that is only the staging area then */
    const char *name;         /* NAME of NAME.tpack: a path, its directories
                                 made as needed */
    int is_file;              /* NAME.tfile: one file */
    int replace;              /* replace NAME's pack if there is one */
    packer_file *files;
    size_t n_files;
    /* The checkpoint's links (common/links.h), packed as LINKS_FILE in
     * its place in path order; NULL when it has none. */
    const char *links;
    size_t links_len;
    int64_t links_mtime_sec;
    uint32_t links_mtime_nsec;
    const ckpt_key *key; /* NULL: unencrypted pack */
    ckpt_cipher cipher;  /* with a key: NONE means the default */
    unsigned threads;    /* 0: all cores */
    /* Progress in bytes of file data, from the packing thread. */
    void (*progress)(void *ud, uint64_t done, uint64_t total);
    void *progress_ud;
    /* Polled while packing; non-zero stops it with -ECANCELED. */
    const int *cancel;
    const int *cancel_one; /* the same, for this checkpoint alone */
    /* A store's commit may take though its answer never came (S3: the
     * CompleteMultipartUpload and the HEADs judging it all unanswered):
     * the pack ids of this checkpoint's earlier failed tries, a pack
     * under the name carrying one of them being this checkpoint's own:
     * taken as this commit when of the last n_tried_current (tries of the
     * checkpoint as it is now), else replaced (tries of the checkpoint
     * before a change, or before a restart, which cannot tell). */
    const uint8_t (*tried)[16];
    size_t n_tried, n_tried_current;
    /* NULL, or set to 1 once this run sent the store the request that
     * makes its pack: a try that failed before cannot have made it. */
    int *commit_sent;
    int *found_earlier; /* NULL, or set to 1 when an earlier try's pack is taken as the commit */
    /* NULL, or told this run's pack id before its pack can be made, so
     * that a crash's recovery can tell this run's pack from an earlier
     * try's (progress_ud; non-zero fails the run with err). */
    int (*trying)(void *ud, const uint8_t id[16], ckpt_err *err);
} packer_job;

/* 0 once NAME.tpack is durably in place (atomically replacing the one
 * there with job->replace; or, on a store, found there from an earlier
 * try: job->tried); else a negative errno with err saying what failed,
 * and no new pack and no temporary file left behind. -EEXIST if
 * NAME.tpack exists already (not an earlier try's) and not job->replace. */
int packer_run(const packer_job *job, ckpt_err *err);

/* The temporary pack of name, .BASE.tpack.tmp in name's directory (a
 * path relative to BACKING; a BASE too long for that is shortened, see
 * packer.c), in out (cap bytes); -ENAMETOOLONG. */
int packer_tmp_name(const char *name, char *out, size_t cap);

/* Removes hidden leftover temporary packs (.NAME.tpack.tmp) from the
 * backing directory and its namespaces: only a packer that died leaves
 * them. Returns how many were removed, or -errno. */
int packer_remove_leftovers(int backing_fd);

/* What NAME is in a store that is not a directory: PACKER_NS (a prefix
 * with objects under it), PACKER_PACK_DIR (NAME.tpack), PACKER_PACK_FILE
 * (NAME.tfile), 0 (nothing, or the store could not be listed). */
enum { PACKER_NS = 1, PACKER_PACK_DIR = 2, PACKER_PACK_FILE = 3 };
int packer_store_kind(ckpt_store *s, const char *name);

void packer_files_free(packer_file *files, size_t n);

#endif
