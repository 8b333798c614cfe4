/* The state of one mount, shared by the FUSE operations. */
#ifndef CKPTFS_CKPTFS_H
#define CKPTFS_CKPTFS_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "checkpoints.h"
#include "chunk_cache.h"
#include "fuse_api.h"
#include "reader.h"
#include "worker_pool.h"

/* An open file (only while the kernel still sends opens, see op_open) or
 * an open root directory. Kept on a list so handles the kernel never
 * released (a forced unmount) are still freed at exit. */
typedef struct fs_handle {
    struct fs_handle *prev, *next;
    int is_root_listing;
    union {
        struct {
            checkpoint *checkpoint; /* referenced */
            uint32_t node;
        } file;
        root_listing listing;
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
    fs_handle handles;        /* sentinel of the open-handle list */
    const char *mount_path;   /* resolved before mounting */
    unsigned readahead_kib;
    int readahead_pending;    /* raise it at the first request after INIT */
    int no_open;              /* the kernel can do without FUSE_OPEN */
} ckptfs;

extern const struct fuse_lowlevel_ops ckptfs_ops;

/* Frees handles the kernel did not release. */
void ckptfs_free_handles(ckptfs *fs);

#endif
