/* What `ckpt status` and the user.ckptfs.state/error xattrs say about a
 * pack: committed when it opens, key mismatch when it cannot be decrypted
 * with the mount's key (or the mount has none), damaged when it is not a
 * readable pack (empty, garbage, a damaged header or index); and the last
 * error seen, from opening it or from a read fault in it. */
#ifndef CKPTFS_CHECKPOINT_STATE_H
#define CKPTFS_CHECKPOINT_STATE_H

#include <stddef.h>

#include "checkpoints.h"

/* Records the last error (one line; logged by the caller). */
void checkpoint_set_error(checkpoint *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The last error into buf ("" if none); its length. */
size_t checkpoint_get_error(checkpoint *c, char *buf, size_t cap);

/* Whether opening the pack failed for good with -EIO: it is no readable
 * pack. Never after a failure of the store itself (ckpt_err's transient),
 * which is not remembered. */
int checkpoint_is_damaged(checkpoint *c);

/* Damaged in its bytes (not a pack of a format newer than this build's,
 * nor one gone since it was listed): what rmdir may delete. */
int checkpoint_is_broken(checkpoint *c);

/* One of the CKPT_STATE_* of ckpt_mount.h: opens the pack (once) to tell.
 * A transient failure (a gateway that does not answer) says unreachable,
 * also for a pack opened before, while its store is down
 * (ckpt_store_reachable); the error attribute says why. */
const char *checkpoint_state_name(checkpoint_table *t, checkpoint *c);

#endif
