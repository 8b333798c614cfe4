/* From the inodes of a committed written checkpoint to its pack. */
#ifndef CKPTFS_HANDOVER_H
#define CKPTFS_HANDOVER_H

#include "mount.h"

/* The pack checkpoint and node that an inode of a committed writable
 * checkpoint now stands for: 0, or ESTALE when there is none (the pack was
 * renamed or removed since, or the path is not in it). */
int handover_resolve(ckptfs *fs, fuse_ino_t ino, checkpoint **c, uint32_t *node);
/* The other way, for late writes: the inode, in the checkpoint being
 * written under the same name, of what ino (a pack's inode, or one of a
 * writable checkpoint committed since) shows. 0 with *out (ino itself
 * for a checkpoint still being written); ENOENT when nothing is being
 * written under that name, unless reopen: then the committed checkpoint
 * is reopened for writing (wtable_reopen). EROFS for what ckptfs
 * synthesizes (manifest.json, tensors/), ESTALE for gone. */
int handover_writable(ckptfs *fs, fuse_ino_t ino, int reopen, fuse_ino_t *out);
/* Is ino a pack's inode whose checkpoint is being written again (reopened)
 * under the same name? */
int handover_is_rewritten(ckptfs *fs, fuse_ino_t ino);
/* For wtable.drop_successor: lets go of that pack. */
void handover_drop_successor(void *ud, void *successor);
/* For wtable.pin_successor and unpin_successor: files open since before
 * a commit hold the pack it made as an open file of it would. */
void handover_pin_successor(void *ud, wckpt *w);
void handover_unpin_successor(void *ud, void *successor);
/* For wtable.committed: has the kernel drop its entry for name, so the
 * inodes of the checkpoint as it was written are forgotten (and freed)
 * once unused; the next lookup finds the pack. */
void handover_committed(void *ud, const char *name);
/* wtable's pack_changed: the read side lists NAME's namespace again. */
void handover_pack_changed(void *ud, const char *name);

#endif
