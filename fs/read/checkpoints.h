/* The checkpoints of the backing directory: one per NAME.tpack (a
 * directory) or NAME.tfile (a single file), in the backing directory or
 * in its subdirectories, the namespaces (common/backing_path.h): NAME is
 * the path, "run1/checkpoint-500" for BACKING/run1/checkpoint-500.tpack.
 * Each is opened on first use and kept open while the file stays the same (same inode, size
 * and mtime). When a pack changes or disappears its checkpoint is retired:
 * it stays alive, unlisted, until the kernel forgets its inodes and the
 * last open file and job let go of it.
 *
 * Inode numbers: the root is 1; every node of a checkpoint's tree is
 * (serial << 32) | (node + 1), so a checkpoint dir is (serial << 32) | 1.
 * Serials are never reused, so a stale inode never names another file.
 *
 * Only regular files are packs: a symlink in the backing directory
 * (x.tpack -> /etc/shadow, or to a pack elsewhere) is never followed nor
 * opened; it is left out, with one warning naming it. Packs are opened
 * with O_NOFOLLOW, so a file swapped for a link in between is refused.
 *
 * The packs may instead be objects of a store with no directory (S3:
 * NAME.tpack is the key PREFIX/NAME.tpack): then what each namespace
 * holds comes from remote_listing.h, refreshed every list_interval, and a
 * pack's identity is its ETag. backing_fd is then the local staging
 * directory of a writable mount (its namespaces not yet uploaded show
 * too), or -1. */
#ifndef CKPTFS_CHECKPOINTS_H
#define CKPTFS_CHECKPOINTS_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "chunk_cache.h"
#include "ckpt.h"
#include "pack_tree.h"
#include "common/inode.h"
#include "common/mount_key.h"

#define CKPT_SUFFIX ".tpack"

enum { CHECKPOINT_UNOPENED, CHECKPOINT_OPEN, CHECKPOINT_FAILED };

typedef struct checkpoint {
    struct checkpoint *next;
    uint32_t serial;
    char *name;           /* NAME, its path below the mount */
    char *pack_path;      /* absolute path of NAME.tpack or NAME.tfile */
    int is_file;          /* NAME.tfile: shown as its one file */
    struct stat identity; /* the file as it was when found (from a
                               * store: size, mtime and a mode only) */
    ckpt_object_id oid;   /* the same, as the store compares it */
    int current;          /* still what NAME means */
    int file_dropped;     /* not current, unused: pack file let go (or
                             about to be, by an open under way); atomic */
    uint64_t nlookup;     /* kernel references to its inodes */
    unsigned refs;        /* open files and jobs */
    int scan_seen;        /* last scan generation that saw it */

    /* Held by the first open for as long as it takes (on S3, HTTP GETs
     * with their retries). Retiring runs under the table's lock, so it
     * never waits for it: if an open holds it, the drop (decided by
     * file_dropped) is left to that open, which does it before letting
     * go. drop_lock makes "is a drop decided" and "is open_lock free" one
     * question: taken under the table's lock and under open_lock, and held
     * by neither for longer than the drop itself. */
    pthread_mutex_t open_lock;
    pthread_mutex_t drop_lock;
    int state;      /* CHECKPOINT_*, read with acquire ordering */
    int open_err;   /* negative errno once FAILED */
    int open_cause; /* the failure open_err stands for (-ENOTSUP: a format too new) */
    /* Still UNOPENED after the store failed transiently (ckpt_err): no
     * new try before this CLOCK_MONOTONIC time in ms, so that a gateway
     * that is down is not asked again by every lookup; atomic. 0: none. */
    int64_t retry_after_ms;
    ckpt_pack *pack; /* once OPEN */
    uint32_t chunk_size;
    pack_tree *tree;

    pthread_mutex_t fault_lock;
    size_t *logged_chunks; /* chunks whose fault was already logged */
    size_t n_logged, logged_cap;
    char last_error[512]; /* under fault_lock: why it cannot be opened,
                               * or its last read fault (checkpoint_state.h) */
    /* Under fault_lock: the store's outage, shown instead of last_error
     * while it does not answer (checkpoint_state_name), "" once it does, so
     * that a read fault recorded before shows again. */
    char outage_error[512];

    /* Entries removed by `rm -r` on the way to removing the whole
     * checkpoint: the pack cannot change, so they are only hidden. */
    pthread_mutex_t hide_lock;
    uint8_t *hidden; /* per tree node, once anything is hidden */
    int hide_logged;
} checkpoint;

typedef struct checkpoint_table {
    pthread_mutex_t lock;
    int backing_fd;
    char *backing_path;
    ckpt_store *store;             /* the backing directory: packs are opened in it */
    int own_store;                 /* store is freed with the table */
    struct remote_listing *remote; /* a store without a directory; else NULL */
    struct timespec remote_since;  /* its namespaces' times: they have none */
    const mount_key *key;          /* borrowed from main.c */
    chunk_cache *cache;
    checkpoint *all;
    uint32_t next_serial;
    int scan_generation;
    /* Its own lock, not lock: a pack's open finds the link while holding
     * the checkpoint's open_lock, and locks are taken in one order only:
     * the table's, then a checkpoint's. */
    pthread_mutex_t warn_lock;
    char **warned_links; /* NAME.tpack symlinks already warned about */
    size_t n_warned_links;
} checkpoint_table;

/* One namespace's listing (the root's, or a subdirectory's), taken when
 * it is opened: its checkpoints, and its subdirectories (is_ns, ino 0:
 * the caller numbers namespaces, and sets parent, the inode of ".."). */
typedef struct root_listing {
    size_t n;
    uint64_t parent;
    struct root_entry {
        char *name;
        uint64_t ino;
        mode_t type; /* S_IFDIR or S_IFREG */
        int is_ns;
    } * entries;
} root_listing;

int checkpoints_init(checkpoint_table *t, const char *backing_path, int backing_fd,
                     const mount_key *key, chunk_cache *cache);
/* The packs of store (borrowed; an S3 store), listed at most once per
 * list_interval seconds; backing_fd as above. */
int checkpoints_init_store(checkpoint_table *t, ckpt_store *store, double list_interval,
                           int backing_fd, const mount_key *key, chunk_cache *cache);
/* Is path a namespace (a directory of the backing directory, a prefix of
 * the store)? 1 with its stat (a store's: made up, mode 0755), else 0. */
int checkpoints_ns_stat(checkpoint_table *t, const char *path, struct stat *st);
/* This daemon added or removed NAME's pack: a store's listing of its
 * namespace is taken again at the next question, not an interval later. */
void checkpoints_changed(checkpoint_table *t, const char *name);
void checkpoints_destroy(checkpoint_table *t);

static inline uint64_t checkpoint_ino(const checkpoint *c, uint32_t node)
{
    return inode_make(c->serial, node);
}

/* NAME -> its current checkpoint, with one kernel reference taken when
 * count_lookup; NULL with *err = -ENOENT (or another errno). */
checkpoint *checkpoints_lookup(checkpoint_table *t, const char *name, int count_lookup, int *err);
/* Rescans the namespace ns ("" for the backing directory itself). */
int checkpoints_list(checkpoint_table *t, const char *ns, root_listing *out);
/* The node the checkpoint's name shows: TREE_ROOT for a directory, the
 * one packed file of a NAME.tfile (TREE_NONE if it holds none). Needs
 * the checkpoint open. */
uint32_t checkpoint_entry_node(const checkpoint *c);
void root_listing_free(root_listing *l);

/* The checkpoint of an inode and the node inside it; NULL if none. The
 * caller must hold a kernel reference to the inode (any request on it
 * does), which keeps the checkpoint alive. */
checkpoint *checkpoints_find(checkpoint_table *t, uint64_t ino, uint32_t *node);

void checkpoint_count_lookup(checkpoint_table *t, checkpoint *c);
/* Its pack was deleted through the mount: no longer current, and the pack
 * file is let go as soon as no file in it is open (at once, if none is),
 * so its space comes back. The caller holds a kernel reference. */
void checkpoint_removed(checkpoint_table *t, checkpoint *c);
void checkpoint_forget(checkpoint_table *t, checkpoint *c, uint64_t n);
void checkpoint_ref(checkpoint_table *t, checkpoint *c);
void checkpoint_unref(checkpoint_table *t, checkpoint *c);

/* Opens the pack on first use. 0, or -EACCES (no key, wrong key), -EIO
 * (damaged pack), -ESTALE (its pack file was let go, even while this
 * open ran), or a transient errno. Failures are logged once. */
int checkpoint_open(checkpoint_table *t, checkpoint *c);

/* 1 the first time a fault in this chunk is reported, then 0: one damaged
 * chunk read many times (kernel readahead retries) logs one line. */
int checkpoint_first_fault(checkpoint *c, size_t chunk_id);

/* Removing entries of a committed checkpoint: the pack is immutable, so
 * they are only hidden until the next mount; once everything in the
 * checkpoint directory is hidden, removing it deletes the pack. hide
 * returns 0, -ENOENT, -ENOTDIR, -EISDIR, -ENOTEMPTY or -ENOMEM. The first
 * hide logs that it lasts only until the next mount, unless quiet. */
int checkpoint_hide(checkpoint *c, uint32_t dir, const char *name, int want_dir, int quiet);
int checkpoint_node_hidden(checkpoint *c, uint32_t node);
/* Does the (opened) checkpoint show no packed file or symbolic link any
 * more? Every one hidden, or under a hidden directory, or none packed at
 * all. What ckptfs synthesizes (manifest.json, tensors/) and directories
 * left empty do not count: they are views of the files, so rmdir may
 * delete the pack. */
int checkpoint_is_empty(checkpoint *c);

#endif
