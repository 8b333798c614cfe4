/* Inode numbers of namespaces: the directories above checkpoints (the
 * mount's root, and BACKING/run1/ shown as MOUNT/run1/). A namespace is
 * known by its path; its inode is inode_make(0, id), serial 0 being no
 * checkpoint's, so the root (id 0, path "") is FUSE_ROOT_ID. Ids are
 * never reused: an inode the kernel still holds always means the same
 * path (which may since have become a checkpoint: ops.c then forwards).
 * Renaming a namespace renames the paths below it too. */
#ifndef CKPTFS_NSPACE_H
#define CKPTFS_NSPACE_H

#include <pthread.h>
#include <stdint.h>

typedef struct ns_table {
    pthread_mutex_t lock;
    char **paths; /* by id; NULL: never */
    uint32_t n, cap;
} ns_table;

int ns_init(ns_table *t);
void ns_destroy(ns_table *t);

/* Is ino a namespace's (the root included)? */
static inline int ns_owns(uint64_t ino)
{
    return (ino >> 32) == 0 && ino != 0;
}
/* The inode of path, numbered on first use; 0 when out of memory. */
uint64_t ns_ino(ns_table *t, const char *path);
/* The inode of the namespace that holds path (what ".." of path's
 * directory is); 0 when out of memory. */
uint64_t ns_parent_ino(ns_table *t, const char *path);
/* The path of a namespace inode, malloc'd; NULL if unknown. */
char *ns_path(ns_table *t, uint64_t ino);
/* A namespace is gone (removed, or a checkpoint now): its inodes and
 * those below it are stale. */
void ns_removed(ns_table *t, const char *path);
/* A namespace moved: from and everything below it now live under to. */
void ns_renamed(ns_table *t, const char *from, const char *to);

#endif
