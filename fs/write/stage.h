/* The staging area on the backing filesystem: where checkpoints being
 * written keep their data until it is packed.
 *
 *   BACKING/.ckptfs/                 0700, hidden from the mount ('.')
 *   BACKING/.ckptfs/stage/SID/record the checkpoint's name and state
 *   BACKING/.ckptfs/stage/SID/meta   its namespace (paths, modes, mtimes)
 *   BACKING/.ckptfs/stage/SID/data/  one blob per file (stage_blob.h)
 *
 * SID is 32 random hex digits, so names never reach the directory layout.
 * The record is text (the name hex-encoded; "file 1" for a single-file
 * checkpoint, "replaces 1" when its pack is to replace one in place); it holds nothing secret, as
 * the name becomes the pack's file name anyway. When the mount has a key,
 * the meta file and every blob are sealed with a key of the checkpoint's
 * own, BLAKE2b(master staging key, SID); the master staging key comes from
 * the mount key and a salt (ckpt_key_derive), and the record keeps the salt
 * and a key check, so a wrong key is told apart from damage before
 * anything is decrypted (and before a crash tail is cut from a blob).
 *
 * The meta file also keeps the staging writes that failed and were not
 * made good yet (stage_failures), as byte ranges of the files it names: a
 * restart then keeps the checkpoint failed until exactly those are
 * rewritten. They are sealed with the namespace, as they tell which files
 * lost which bytes.
 *
 * Record and meta are replaced atomically: written to a temporary file,
 * fsynced, renamed over, and the directory fsynced. A checkpoint that is
 * committed has no staging directory: it is removed once the pack is in
 * place. */
#ifndef CKPTFS_STAGE_H
#define CKPTFS_STAGE_H

#include <pthread.h>
#include <stdint.h>

#include "ckpt.h"
#include "common/mount_key.h"
#include "stage_blob.h"
#include "stage_crypt.h"
#include "wtree.h"

#define STAGE_HIDDEN_DIR ".ckptfs"
#define STAGE_SID_LEN 32

typedef enum stage_state { STAGE_WRITING = 1, STAGE_PACKING = 2, STAGE_FAILED = 3 } stage_state;

typedef struct stage_root {
    int backing_fd;       /* borrowed */
    int stage_fd;         /* BACKING/.ckptfs/stage */
    const mount_key *key; /* borrowed; no key: plain staging */
    pthread_mutex_t key_lock;
    uint8_t salt[16]; /* for new checkpoints */
    int have_salt;
    uint8_t master_salt[16]; /* the salt master was derived for */
    uint8_t *master;         /* sodium_malloc'd; NULL until first needed */
    int master_valid;
} stage_root;

/* Tries whose pack ids are kept: more failed tries than this in a row
 * mean a store that takes nothing, not one that drops answers. */
#define STAGE_TRIED_MAX 4

typedef struct stage_dir {
    char sid[STAGE_SID_LEN + 1];
    int fd;           /* BACKING/.ckptfs/stage/SID */
    int data_fd;      /* .../data */
    stage_key *key;   /* the checkpoint's own key, or NULL (plain) */
    uint8_t salt[16]; /* the master key's salt, for the record */
    /* Kept in the record with the name: */
    int is_file;  /* a single-file checkpoint (NAME.tfile) */
    int replaces; /* its pack replaces one already there */
    int has_base; /* reopened: unchanged files are read from
                                 that pack (WTREE_BASE_BLOB) */
    /* The pack ids of failed tries to pack it into a store, newest last
     * (packer_job.tried). */
    uint8_t tried[STAGE_TRIED_MAX][16];
    unsigned n_tried;
    /* The pack id of the try under way (has_trying), written before its
     * pack can be made: at recovery a pack under the name is this
     * packing's commit only when it carries this id. */
    uint8_t trying[16];
    int has_trying;
} stage_dir;

/* Keeps id as the newest of d's tries, the oldest let go when full. */
void stage_note_try(stage_dir *d, const uint8_t id[16]);
/* Ends the try under way, if any: kept as tried (stage_note_try) when its
 * pack may have been made, else let go; either way d's next record names
 * no try under way. */
void stage_end_try(stage_dir *d, int may_have_made);

typedef struct stage_record {
    char *name;
    stage_state state;
    int sealed;
    uint8_t salt[16];
    uint8_t check[16];
    stage_cipher cipher;
    char *error;                     /* why it failed, or NULL */
    int is_file, replaces, has_base; /* as in stage_dir */
    uint8_t tried[STAGE_TRIED_MAX][16];
    unsigned n_tried;
    uint8_t trying[16];
    int has_trying;
} stage_record;

/* A staging write that failed and was not made good (wckpt.h). */
typedef struct stage_failure {
    uint32_t node;        /* a file of the tree; WTREE_NONE: the namespace
                             or record, which the next save makes good (so
                             never saved) */
    uint64_t first, last; /* the bytes that went missing (a failed write's
                             whole range; one offset for other operations);
                             UINT64_MAX: not durable (a failed sync) */
} stage_failure;

typedef struct stage_failures {
    stage_failure *v; /* malloc'd */
    size_t n;
    int lost; /* some are not in v: only a commit clears the failure */
    /* From stage_load_meta: why none could be read back (then lost is
     * set): damage, or a namespace saved before they were kept. */
    const char *unread;
} stage_failures;

/* Creates BACKING/.ckptfs/stage if needed. Errors name the path. */
int stage_root_open(stage_root *r, int backing_fd, const mount_key *key, ckpt_err *err);
void stage_root_close(stage_root *r);

/* A new staging directory for checkpoint name, recorded as writing, with
 * d->is_file and d->replaces as the caller set them. The key (when the
 * root has one) is ready in d->key. */
int stage_create(stage_root *r, const char *name, stage_dir *d, ckpt_err *err);
/* Opens an existing one and reads its record (which the caller frees). */
int stage_open(stage_root *r, const char *sid, stage_dir *d, stage_record *rec, ckpt_err *err);
/* Derives d->key for a sealed record and checks it: -EACCES on a missing
 * or wrong key. No-op for a plain record. */
int stage_unlock(stage_root *r, stage_dir *d, const stage_record *rec, ckpt_err *err);
void stage_dir_close(stage_dir *d);
void stage_record_free(stage_record *rec);

/* Replaces the record (atomically and durably). */
int stage_write_record(stage_root *r, stage_dir *d, const char *name, stage_state state,
                       const char *error, ckpt_err *err);
/* Replaces the meta file with the tree (linked nodes only) and the
 * failures f (NULL: none) of its linked files. In two steps too, so the
 * (slow, durable) write can run without the tree's lock. */
int stage_save_meta(stage_dir *d, const wtree *t, uint64_t next_blob_id, const stage_failures *f,
                    ckpt_err *err);
int stage_encode_meta(const stage_dir *d, const wtree *t, uint64_t next_blob_id,
                      const stage_failures *f, uint8_t **out, size_t *len);
int stage_write_meta(stage_dir *d, const uint8_t *buf, size_t len, ckpt_err *err);
/* Builds the tree from the meta file (tree initialised here), and the
 * failures into f (unless NULL; f->v is the caller's to free). No meta
 * file yet is an empty tree with no failures. -EIO for a damaged file,
 * -EACCES if it does not authenticate; failures that do not make sense
 * fail nothing but set f->unread. */
int stage_load_meta(stage_dir *d, wtree *t, uint64_t *next_blob_id, stage_failures *f,
                    ckpt_err *err);
/* Removes the staging directory with everything in it, durably. */
int stage_remove(stage_root *r, stage_dir *d, ckpt_err *err);

/* Calls fn for each staging directory's SID; a non-zero return stops. */
int stage_scan(stage_root *r, int (*fn)(void *ud, const char *sid), void *ud, ckpt_err *err);
/* Removes a staging directory that has no usable record. */
int stage_remove_sid(stage_root *r, const char *sid, ckpt_err *err);

const char *stage_state_name(stage_state s);

/* Hex of len bytes into out (2*len+1). */
void stage_hex(const void *bytes, size_t len, char *out);

/* Makes sure the directory open as fd (shown names it in messages) is
 * this process's own and private: 0700 if it was wider (made by an older
 * ckptfs, or restored from a backup), -EPERM if another user owns it (it
 * could read, replace or plant staged data and the lock). */
int stage_private_dir(int fd, const char *shown, ckpt_err *err);

#endif
