/* The namespace of a checkpoint being written: directories and files with
 * their modes, mtimes and atimes, in memory. Node 0 is the checkpoint directory.
 *
 * Node ids are never reused while the tree lives, so an id the kernel
 * still holds never names another file. A removed node stays allocated,
 * detached (parent WTREE_NONE), until the tree is freed: the kernel may
 * still send requests for it (an unlinked file that is still open).
 *
 * Not thread-safe: the owner (wckpt) locks around every call. */
#ifndef CKPTFS_WTREE_H
#define CKPTFS_WTREE_H

#include <stddef.h>
#include <stdint.h>

#define WTREE_NONE UINT32_MAX
#define WTREE_ROOT 0u
/* Pack paths must fit in 4095 bytes (FORMAT.md). */
#define WTREE_PATH_MAX 4095u
/* A file's blob_id with this bit set names no staged blob but file
 * (blob_id & ~WTREE_BASE_BLOB) of the pack the checkpoint reopened: a
 * file left as it was packed. */
#define WTREE_BASE_BLOB (1ull << 63)
/* Node ids become the low 32 bits of inode numbers, with +1. */
#define WTREE_MAX_NODES (UINT32_MAX - 2u)
/* The permission bits a node keeps: never the set-id bits. Every file and
 * directory shows as the daemon's user's, whoever made it (-o allow_other),
 * so a set-uid file made there would run as that user (root, mounted with
 * -o suid); a packed file shows none either (read_ops.c). */
#define WTREE_MODE_BITS 01777u

/* A link is staged like a file whose bytes are its target. */
typedef enum wnode_kind { WNODE_DIR = 1, WNODE_FILE = 2, WNODE_LINK = 3 } wnode_kind;

typedef struct wnode {
    char *name;      /* one component; "" for the root */
    uint32_t parent; /* WTREE_NONE: root or removed */
    uint8_t kind;    /* wnode_kind */
    uint8_t linked;  /* reachable from the root */
    uint32_t mode;   /* permission bits */
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint32_t atime_nsec;
    int64_t atime_sec;  /* as set by utimensat; a pack keeps none */
    uint64_t blob_id;   /* files: which staged blob holds the bytes */
    void *data;         /* files: the owner's per-file state */
    uint32_t *children; /* dirs */
    uint32_t n_children, children_cap;
    uint32_t slot; /* its place in the name index */
} wnode;

typedef struct wtree {
    wnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *index; /* hash of (parent, name) -> node */
    size_t index_mask, index_used;
    uint8_t hash_key[16];
} wtree;

int wtree_init(wtree *t, uint32_t root_mode, int64_t mtime_sec, uint32_t mtime_nsec);
void wtree_free(wtree *t);

static inline wnode *wtree_node(const wtree *t, uint32_t id)
{
    return id < t->n_nodes ? &t->nodes[id] : NULL;
}

/* Is this a name a file may have? (not "", ".", "..", no '/', <= 255) */
int wtree_name_ok(const char *name);

/* The child of dir called name, or WTREE_NONE. */
uint32_t wtree_lookup(const wtree *t, uint32_t dir, const char *name);

/* Adds a file or directory (its atime is its mtime). 0 with *out, or -EEXIST, -ENOTDIR, -ENOENT (dir
 * removed), -EINVAL (bad name), -ENAMETOOLONG (the path would not fit in a
 * pack), -ENOSPC (too many nodes), -ENOMEM. */
int wtree_add(wtree *t, uint32_t dir, const char *name, wnode_kind kind, uint32_t mode,
              int64_t mtime_sec, uint32_t mtime_nsec, uint64_t blob_id, uint32_t *out);

/* unlink (want_dir 0) or rmdir (1): 0 with *out the detached node, or
 * -ENOENT, -EISDIR, -ENOTDIR, -ENOTEMPTY. */
int wtree_remove(wtree *t, uint32_t dir, const char *name, int want_dir, uint32_t *out);

/* rename(2) within the tree. A file replaces a file and a directory an
 * empty directory; *replaced gets the node that was replaced (detached) or
 * WTREE_NONE. noreplace: -EEXIST instead of replacing. Errors as rename(2):
 * -ENOENT, -EEXIST, -EISDIR, -ENOTDIR, -ENOTEMPTY, -EINVAL (a directory into
 * itself), -ENAMETOOLONG. */
int wtree_rename(wtree *t, uint32_t dir, const char *name, uint32_t newdir, const char *newname,
                 int noreplace, uint32_t *replaced);

/* Length of the node's path relative to the root (0 for the root). */
size_t wtree_path_len(const wtree *t, uint32_t node);
/* The path into out (cap bytes); 0, or -ENAMETOOLONG. */
int wtree_path(const wtree *t, uint32_t node, char *out, size_t cap);

/* The linked files (kind WNODE_FILE, or WNODE_LINK when links) in pack
 * order (byte order of their paths): a malloc'd array of node ids in
 * *out. 0 or -ENOMEM. */
int wtree_files_sorted(const wtree *t, uint32_t **out, size_t *n);
int wtree_links_sorted(const wtree *t, uint32_t **out, size_t *n);

/* Visits every linked node, parents before children (root first). */
typedef int (*wtree_visit_fn)(void *ud, const wtree *t, uint32_t node);
int wtree_walk(const wtree *t, wtree_visit_fn fn, void *ud);

#endif
