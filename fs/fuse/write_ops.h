/* The FUSE side of writable checkpoints (wckpt.h): requests on the root
 * that create, remove or rename checkpoints, requests on the inodes of
 * checkpoints being written. Committed checkpoints' old inodes are
 * handover.h's.
 *
 * Functions that take an inode return 1 once they have replied, and 0 when
 * the inode belongs to a checkpoint committed since it was looked up: the
 * caller then answers from the pack, where handover_resolve finds the same
 * path. ops.c, the dispatcher, calls them before the read side. */
#ifndef CKPTFS_WRITE_OPS_H
#define CKPTFS_WRITE_OPS_H

#include "mount.h"

/* ---- checkpoints by name (a path), for the namespaces (ns_ops.c) ---- */
/* A writable checkpoint called name: replies with its entry, returns 1;
 * 0 (no reply) when there is none. */
int wops_ckpt_lookup(fuse_req_t req, ckptfs *fs, const char *name);
/* rmdir of a checkpoint directory, writable or packed. */
void wops_ckpt_rmdir(fuse_req_t req, ckptfs *fs, const char *name);
/* unlink of a single-file checkpoint, writable or packed. */
void wops_ckpt_unlink(fuse_req_t req, ckptfs *fs, const char *name);
void wops_ckpt_rename(fuse_req_t req, ckptfs *fs, const char *name, const char *newname,
                      unsigned flags);
/* A new single-file checkpoint; fi NULL for mknod. */
void wops_ckpt_create(fuse_req_t req, ckptfs *fs, const char *name, mode_t mode,
                      struct fuse_file_info *fi);
/* A new single-link checkpoint. */
void wops_ckpt_symlink(fuse_req_t req, ckptfs *fs, const char *target, const char *name);
/* Adds the writable checkpoints of namespace ns to its listing (they hide
 * a pack of the same name). */
int wops_listing_add(ckptfs *fs, const char *ns, root_listing *l);

/* ---- inodes of writable checkpoints (wtable_owns(ino)) ---- */
int wops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void wops_forget(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup);
int wops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_setattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct stat *attr, int to_set);
int wops_mknod(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode);
int wops_symlink(fuse_req_t req, ckptfs *fs, const char *target, fuse_ino_t parent,
                 const char *name);
int wops_readlink(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_mkdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode);
int wops_unlink(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
int wops_rmdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void wops_rename(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                 fuse_ino_t newparent, const char *newname, unsigned flags);
int wops_open(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
/* An open of a pack's file served by the writable checkpoint's file ino
 * (handover_writable): replies with a handle (fs_handle.is_fwd) that
 * read, write, fsync and release follow. */
void wops_open_fwd(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
int wops_create(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                struct fuse_file_info *fi);
int wops_read(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off);
int wops_write_buf(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off);
/* flags: the handle's, as opened */
void wops_release(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, int flags);
int wops_fsync(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
/* At a close: the error of a write that failed after it was answered. */
int wops_flush(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
int wops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size);
int wops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, const char *value,
                  size_t size);
int wops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size);
int wops_fallocate(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, int mode, off_t off, off_t len);

/* A directory listing taken at opendir (fs_handle.u.wlisting). */
void wops_readdir(fuse_req_t req, fs_handle *h, size_t size, off_t off);

#endif
