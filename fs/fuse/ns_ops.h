/* Requests on namespaces (nspace.h): the mount's root and the directories
 * above checkpoints. A name in a namespace is, in this order, a
 * checkpoint being written (the write side), a namespace (a directory of
 * the backing directory), or a pack (the read side); so a writable
 * checkpoint hides a pack of the same name. Directories are made as
 * namespaces; the first file written into one makes it a checkpoint
 * (wtable_ns_convert), unless it holds checkpoints already: a file there,
 * or at the root, is a checkpoint of its own.
 *
 * Like ops.c this asks both sides; it is where namespaces are dispatched.
 * Each function replies. */
#ifndef CKPTFS_NS_OPS_H
#define CKPTFS_NS_OPS_H

#include "mount.h"

/* The inode to serve a request on ino with: ino itself, unless ino is a
 * namespace that became a checkpoint since the kernel looked it up; then
 * the same directory in that checkpoint (being written, or its pack). */
fuse_ino_t nsops_route(ckptfs *fs, fuse_ino_t ino);

void nsops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void nsops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
void nsops_setattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct stat *attr, int to_set);
void nsops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
void nsops_mkdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode);
void nsops_rmdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void nsops_unlink(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
/* create (fi) and mknod (fi NULL). */
void nsops_create(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                  struct fuse_file_info *fi);
/* A link in a namespace: its first entry makes an empty one the
 * checkpoint, as a file does; else a single-link checkpoint. */
void nsops_symlink(fuse_req_t req, ckptfs *fs, const char *target, fuse_ino_t parent,
                   const char *name);
/* Both parents namespaces. */
void nsops_rename(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                  fuse_ino_t newparent, const char *newname, unsigned flags);
void nsops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size);
void nsops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size);
void nsops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name);

#endif
