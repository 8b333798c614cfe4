/* The state of one mount, shared by the FUSE operations of both sides. */
#ifndef CKPTFS_CKPTFS_H
#define CKPTFS_CKPTFS_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/worker_pool.h"
#include "fuse_api.h"
#include "nspace.h"
#include "read/read.h"
#include "write/write.h"

/* An open file (only while the kernel still sends opens, see op_open) or
 * an open root directory. Kept on a list so handles the kernel never
 * released (a forced unmount) are still freed at exit. */
typedef struct fs_handle {
    struct fs_handle *prev, *next;
    int is_root_listing;
    int is_wlisting; /* a directory of a writable checkpoint */
    int is_fwd;      /* a pack's file opened as the file of the
                                 checkpoint written under its name */
    union {
        struct {
            checkpoint *checkpoint; /* referenced */
            uint32_t node;
        } file;
        root_listing listing;
        struct {
            uint64_t ino; /* the writable file's inode */
            wckpt *ckpt;  /* its checkpoint, referenced: once committed,
                             reads go to the pack it pinned (handover.h) */
        } fwd;            /* is_fwd */
        struct {
            wdirent *entries;
            size_t n;
            uint64_t self, parent;
        } wlisting;
    } u;
} fs_handle;

typedef struct ckptfs {
    checkpoint_table table;
    chunk_cache *cache;
    worker_pool *pool;
    reader reader;
    uid_t uid;
    gid_t gid;
    pthread_mutex_t handles_lock;
    fs_handle handles;      /* sentinel of the open-handle list */
    const char *mount_path; /* resolved before mounting */
    unsigned readahead_kib;
    int readahead_pending;   /* raise it at the first request after INIT */
    int hide_tensors;        /* -o tensors=hide: tensors/ left out of listings */
    wtable wtable;           /* checkpoints being written */
    ns_table ns;             /* namespace inodes */
    int writable;            /* the staging area could be set up */
    struct fuse_session *se; /* for invalidations, once mounted */
} ckptfs;

extern const struct fuse_lowlevel_ops ckptfs_ops;

#endif
