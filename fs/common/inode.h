/* How the mount numbers its inodes: one home for the encoding that the
 * read side (packs) and the write side (checkpoints being written) share.
 *
 *   inode = serial << 32 | (node + 1)
 *
 * Every checkpoint, packed or being written, gets a serial when it is
 * opened; node is its index in that checkpoint's tree. The serial space is
 * split so that the dispatcher can tell which side owns an inode from the
 * number alone: packs take serials 1 .. INODE_WRITE_SERIAL_BASE - 1, and
 * checkpoints being written take the rest. Serial 0 and node + 1 == 0 are
 * never used, so FUSE_ROOT_ID (1) is never a checkpoint's inode. */
#ifndef CKPTFS_INODE_H
#define CKPTFS_INODE_H

#include <stdint.h>

#define INODE_WRITE_SERIAL_BASE 0x80000000u

static inline uint64_t inode_make(uint32_t serial, uint32_t node)
{
    return ((uint64_t)serial << 32) | ((uint64_t)node + 1);
}

/* Splits an inode; 0 when it is no checkpoint's (root, or malformed). */
static inline int inode_split(uint64_t ino, uint32_t *serial, uint32_t *node)
{
    *serial = (uint32_t)(ino >> 32);
    uint32_t low = (uint32_t)ino;
    if (*serial == 0 || low == 0)
        return 0;
    *node = low - 1;
    return 1;
}

/* Whether an inode belongs to a checkpoint being written. */
static inline int inode_is_written(uint64_t ino)
{
    return (uint32_t)(ino >> 32) >= INODE_WRITE_SERIAL_BASE;
}

#endif
