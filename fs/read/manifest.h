/* manifest.json: a pretty-printed description of one checkpoint (pack
 * parameters, files, tensors with their paths under the mount), built once
 * when the pack is opened. */
#ifndef CKPTFS_MANIFEST_H
#define CKPTFS_MANIFEST_H

#include <stddef.h>

#include "ckpt.h"
#include "pack_tree.h"

/* 0 with a malloc'd text, or -ENOMEM. */
int manifest_build(const ckpt_pack *p, const char *checkpoint, const pack_tree *t, char **text,
                   size_t *len);

#endif
