/* The FUSE side of writable checkpoints (wckpt.h): requests on the root
 * that create, remove or rename checkpoints, requests on the inodes of
 * checkpoints being written, and the way back from a committed
 * checkpoint's old inodes to its pack.
 *
 * Functions that take an inode return 1 once they have replied, and 0 when
 * the inode belongs to a checkpoint committed since it was looked up: the
 * caller then answers from the pack, where wops_translate finds the same
 * path. ops.c calls them before its read-only handling. */
#ifndef CKPTFS_WOPS_H
#define CKPTFS_WOPS_H

#include "ckptfs.h"

/* ---- the root ---- */
int wops_root_lookup(fuse_req_t req, ckptfs *fs, const char *name);
void wops_root_mkdir(fuse_req_t req, ckptfs *fs, const char *name, mode_t mode);
void wops_root_rmdir(fuse_req_t req, ckptfs *fs, const char *name);
void wops_root_rename(fuse_req_t req, ckptfs *fs, const char *name, const char *newname,
                      unsigned flags);
/* create, mknod, symlink, link at the root: refused, with a log line. */
void wops_root_refuse(fuse_req_t req, const char *name, const char *what);
/* Adds the writable checkpoints to a root listing (they hide a pack of
 * the same name). */
int wops_root_listing_add(ckptfs *fs, root_listing *l);

/* ---- inodes of writable checkpoints (wtable_owns(ino)) ---- */
int wops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void wops_forget(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup);
int wops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_setattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct stat *attr, int to_set);
int wops_mknod(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode);
int wops_mkdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode);
int wops_unlink(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
int wops_rmdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
void wops_rename(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                 fuse_ino_t newparent, const char *newname, unsigned flags);
int wops_open(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
int wops_create(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                struct fuse_file_info *fi);
int wops_read(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off);
int wops_write(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *buf, size_t size,
               off_t off);
void wops_release(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_fsync(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
int wops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
int wops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size);
int wops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name,
                  const char *value, size_t size);
int wops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size);
int wops_fallocate(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, int mode, off_t off, off_t len);

/* A directory listing taken at opendir (fs_handle.u.wlisting). */
void wops_readdir(fuse_req_t req, fs_handle *h, size_t size, off_t off);

/* The pack checkpoint and node that an inode of a committed writable
 * checkpoint now stands for: 0, or ESTALE when there is none (the pack was
 * renamed or removed since, or the path is not in it). */
int wops_translate(ckptfs *fs, fuse_ino_t ino, checkpoint **c, uint32_t *node);
/* For wtable.drop_successor: lets go of that pack. */
void wops_drop_successor(void *ud, void *successor);
/* For wtable.committed: has the kernel drop its entry for name, so the
 * inodes of the checkpoint as it was written are forgotten (and freed)
 * once unused; the next lookup finds the pack. */
void wops_committed(void *ud, const char *name);

/* Deleting committed checkpoints: removing an entry inside one hides it
 * (the pack is immutable), and removing the checkpoint directory once
 * everything in it is hidden deletes the pack. */
int wops_pack_hide(ckptfs *fs, checkpoint *c, uint32_t dir, const char *name, int want_dir);
int wops_pack_hidden(checkpoint *c, uint32_t node);

#endif
