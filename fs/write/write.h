/* fs/write: the write side of the mount, and its one public header.
 * Checkpoints being written (wckpt.h, the state machine and its table)
 * keep their namespace (wtree.h) and contents (stage_blob.h) in the
 * staging area (stage.h), encrypted when the mount has a key
 * (stage_crypt.h), and are packed in the background (packer.h). Knows
 * nothing of FUSE or of the read side: the FUSE layer wires callbacks in
 * (wtable.committed, wtable.drop_successor). */
#ifndef CKPTFS_WRITE_H
#define CKPTFS_WRITE_H

#include "wckpt.h"

#endif
