/* The read side's FUSE requests: inodes inside packs (and, through
 * handover.h, inodes of checkpoints committed since their lookup). The
 * dispatcher (ops.c) sends a request here once it has decided that the
 * write side does not take it. Each function replies. */
#ifndef CKPTFS_READ_OPS_H
#define CKPTFS_READ_OPS_H

#include "mount.h"

/* A pack called name (a checkpoint path): replies with its entry (its
 * directory, or its one file) and returns 1; 0 (no reply) when there is
 * none. */
int rops_lookup_checkpoint(fuse_req_t req, ckptfs *fs, const char *name);
void rops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name);
/* No reply: forget answers once for a batch. */
void rops_forget(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup);
void rops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
void rops_open(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
void rops_read(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off,
               struct fuse_file_info *fi);
void rops_release(fuse_req_t req, ckptfs *fs, fs_handle *h);
void rops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi);
/* A pack directory, or a namespace when listing (taken at opendir) is set. */
void rops_readdir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off,
                  const root_listing *listing);
void rops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size);
void rops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size);
void rops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name);
void rops_readlink(fuse_req_t req, ckptfs *fs, fuse_ino_t ino);
/* Is name in the pack directory parent something ckptfs shows of the
 * files (manifest.json, tensors/), not a packed file? */
int rops_is_view(ckptfs *fs, fuse_ino_t parent, const char *name);
/* unlink/rmdir inside a committed checkpoint: hides the entry (the pack is
 * immutable); EROFS on a read-only mount. quiet: as checkpoint_hide. */
void rops_remove(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, int want_dir,
                 int quiet);

#endif
