/* stage's private parts, shared by stage.c (root, records, directories)
 * and stage_meta.c (the namespace file). Not for other modules. */
#ifndef CKPTFS_STAGE_INTERNAL_H
#define CKPTFS_STAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "stage.h"

#define META_NAME "meta"
#define META_MAGIC_PLAIN "CKPTMET1"
#define META_MAGIC_SEALED "CKPTMES1"
#define META_HASH 32u
#define META_NONCE STAGE_NONCE
#define META_TAG STAGE_TAG
/* A namespace this large is not a checkpoint; refuse rather than allocate. */
#define META_MAX (1ull << 30)

/* Replaces dirfd/name with data: temporary file, fsync, rename, fsync of
 * the directory. A crash leaves the old contents or the new, never a mix. */
int stage_replace_file(int dirfd, const char *what, const char *name, const void *data, size_t len,
                       ckpt_err *err);
/* The whole of dirfd/name, up to max bytes; -ENOENT if absent. */
int stage_read_small(int dirfd, const char *name, size_t max, uint8_t **out, size_t *len);

#endif
