/* Open-file and open-directory handles of both sides. They are kept on
 * the mount's list so that handles the kernel never released (a forced
 * unmount) are still freed at exit. */
#ifndef CKPTFS_HANDLES_H
#define CKPTFS_HANDLES_H

#include "mount.h"

/* Puts a handle on the list, or takes it off and frees it. */
void handle_track(ckptfs *fs, fs_handle *h);
void handle_drop(ckptfs *fs, fs_handle *h);
/* Frees handles the kernel did not release. */
void handles_free_all(ckptfs *fs);

/* fuse_reply_open, tracking h first; drops h if the reply did not reach
 * the kernel (it will never release it). */
void handle_reply_open(fuse_req_t req, ckptfs *fs, fs_handle *h, struct fuse_file_info *fi);

#endif
