/* fs/read: the read side of the mount, and its one public header. Packs
 * in the backing directory are opened lazily (checkpoints.h), shown as a
 * tree (pack_tree.h) with a synthesized manifest (manifest.h), and read
 * through the reader (reader.h), which decodes chunks on worker threads
 * into a shared LRU cache (chunk_cache.h). Knows nothing of FUSE or of
 * checkpoints being written. */
#ifndef CKPTFS_READ_H
#define CKPTFS_READ_H

#include "checkpoint_state.h"
#include "checkpoints.h"
#include "chunk_cache.h"
#include "manifest.h"
#include "pack_tree.h"
#include "reader.h"

#endif
