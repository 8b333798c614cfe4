/* The directory tree one checkpoint shows: packed files at their packed
 * paths, the synthesized manifest.json, and one file per tensor under
 * tensors/. Built once when a pack is opened; immutable afterwards, so it
 * is read without locks.
 *
 * Name clashes. manifest.json, tensors/ and .packed/ at the top level are
 * reserved for ckptfs: a packed file whose first path component is one of
 * them is shown under .packed/ instead (a packed "manifest.json" appears as
 * ".packed/manifest.json", "tensors/a.bin" as ".packed/tensors/a.bin").
 * Tools can therefore always trust manifest.json and tensors/, and every
 * packed byte stays reachable. The manifest lists each file's packed path
 * and, when it differs, its "mount_path". Any other clash inside a pack (a
 * path that is both a file and a directory, a duplicate path, a component
 * over 255 bytes) keeps the first entry and logs the ones left out. */
#ifndef CKPTFS_PACK_TREE_H
#define CKPTFS_PACK_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define TREE_NONE UINT32_MAX
#define TREE_ROOT 0u

/* TREE_LINK: a symbolic link the checkpoint was written with, from its
 * LINKS_FILE (common/links.h), which itself is not shown. */
typedef enum tree_kind { TREE_DIR, TREE_FILE, TREE_TENSOR, TREE_MANIFEST, TREE_LINK } tree_kind;

typedef struct tree_node {
    char *name; /* one path component; "" for the root */
    uint32_t parent;
    tree_kind kind;
    uint32_t mode; /* permission bits, never write bits */
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint64_t size;
    size_t file_index;    /* FILE, TENSOR: the packed file holding the bytes */
    uint64_t file_offset; /* TENSOR: where its bytes start in that file */
    size_t tensor_index;  /* TENSOR */
    char *target;         /* LINK */
    uint32_t *children;   /* DIR */
    uint32_t n_children, children_cap, n_subdirs;
} tree_node;

typedef struct pack_tree {
    tree_node *nodes;
    uint32_t n_nodes, nodes_cap;
    uint32_t *slots; /* hash of (parent, name) -> node */
    size_t slot_mask;
    uint32_t *file_node;   /* per packed file: its node or TREE_NONE */
    uint32_t *tensor_node; /* per tensor */
    uint32_t manifest_node;
    char *manifest;
    size_t manifest_len;
} pack_tree;

/* Builds the tree; 0 or -ENOMEM/-EIO (too many entries). checkpoint names
 * the pack in log lines; mtime is used for synthesized entries. */
int pack_tree_build(const ckpt_pack *p, const char *checkpoint, int64_t mtime_sec,
                    uint32_t mtime_nsec, pack_tree **out);
/* Takes ownership of the manifest text. */
void pack_tree_set_manifest(pack_tree *t, char *text, size_t len);
void pack_tree_free(pack_tree *t);

uint32_t pack_tree_lookup(const pack_tree *t, uint32_t parent, const char *name);
/* The node that path, as the checkpoint was written (a file when
 * is_file, else a directory; "" is the root), shows as in the pack,
 * following the move of reserved top-level names under .packed/; or
 * TREE_NONE. */
uint32_t pack_tree_find_written(const pack_tree *t, const ckpt_pack *p, const char *path,
                                int is_file);
/* The node's path relative to the checkpoint directory (malloc'd). */
char *pack_tree_path(const pack_tree *t, uint32_t node);

#endif
