/* The mount's key has one owner, fs/main.c: it loads the key, loads it
 * again after fuse_daemonize's fork (memory locks do not survive a fork)
 * and frees it at exit. The read side (packs) and the write side (staging,
 * packing) only borrow it through this holder, so a reload reaches every
 * user at once and no struct keeps a stale copy. */
#ifndef CKPTFS_MOUNT_KEY_H
#define CKPTFS_MOUNT_KEY_H

#include <stddef.h>

#include "ckpt.h"

typedef struct mount_key {
    ckpt_key *key; /* NULL: the mount has no key */
} mount_key;

static inline const ckpt_key *mount_key_get(const mount_key *k)
{
    return k ? k->key : NULL;
}

#endif
