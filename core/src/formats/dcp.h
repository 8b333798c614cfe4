/* PyTorch distributed checkpoints (torch.distributed.checkpoint, "DCP") as
 * FileSystemWriter writes them (torch >= 2.0; dcp.save and dcp.async_save),
 * and Megatron-core's torch_dist layout, which is the same plus
 * metadata.json and common.pt (both ordinary files: common.pt is a
 * torch.save archive, formats/torch.h):
 *
 *   DIR/.metadata        a pickle of torch.distributed.checkpoint.metadata.
 *                        Metadata: state_dict_metadata (fqn -> tensor
 *                        properties, global size, chunks; or bytes) and
 *                        storage_data (MetadataIndex(fqn, chunk offsets) ->
 *                        _StorageInfo(relative_path, offset, length))
 *   DIR/__R_N.distcp     the items, back to back: each tensor chunk is a
 *                        complete torch.save archive of one tensor at
 *                        [offset, offset + length); each bytes item is the
 *                        torch.save archive of some other object
 *
 * dcp_metadata_parse() reads .metadata with the restricted pickle reader
 * (formats/pickle.h: nothing is imported or called) and validates it.
 *
 * ckpt_format_dcp (a container_format) claims "*.distcp" in any directory.
 * describe() reads the sibling ".metadata" through src->read_sibling and,
 * for each item of this file (relative_path equal to the file's basename):
 *   - a tensor chunk: its torch archive is parsed in place (formats/torch.c
 *     over [offset, offset + length)); its storage becomes a region of its
 *     dtype and the chunk ONE tensor, named
 *         FQN                  when the chunk is the whole tensor, else
 *         FQN@o0,o1,...        the chunk's offsets in the global tensor,
 *     e.g. "model.w@4,0" for rows 4.. of a tensor sharded on dim 0 over
 *     2 ranks. Assembling dim-0 chunks into one FQN tensor is not done
 *     here (a later step); each chunk is its own tensor. A chunk whose
 *     archive does not hold exactly one tensor of the metadata's dtype and
 *     the chunk's shape, or whose dtype is not supported, is listed in
 *     out->skipped with why (its storage stays a region where known);
 *   - a bytes item: its storages (if any) become regions; no tensor;
 *   - an item with transform_descriptors (compressed or otherwise
 *     transformed DCP) stays opaque and is listed in out->skipped.
 * An item that runs past the end of this file is -EINVAL naming the fqn.
 *
 * Without read_sibling, without a readable .metadata (missing, or larger
 * than DCP_MAX_METADATA), with a .metadata that fails validation (listed in
 * out->skipped as ".metadata" with why), or one that names no item of this
 * file, describe() falls back to scanning the file as a sequence of
 * torch.save archives from offset 0: each archive must start with a zip
 * local header and ends where its own end of central directory record
 * (zip64 records included) says its central directory ends; it is then
 * parsed as above. Storages become regions, with no tensor names. The scan
 * stops at anything unexpected; the rest of the file stays opaque.
 *
 * describe() returns 0, or 1 when nothing in the file can be typed (keep it
 * opaque); -EINVAL with "dcp: ..." in msg; -ENOMEM. */
#ifndef CKPT_FORMATS_DCP_H
#define CKPT_FORMATS_DCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/formats.h"

#define DCP_MAX_METADATA (256u << 20) /* .metadata bytes */
#define DCP_MAX_ENTRIES (1u << 20)    /* state_dict_metadata entries */
#define DCP_MAX_CHUNKS (1u << 22)     /* chunks of all tensors together */
#define DCP_MAX_ITEMS (1u << 22)      /* storage_data entries */
#define DCP_MAX_FQN 1024              /* bytes of a fqn */
#define DCP_MAX_PATH 4096             /* bytes of a relative_path */
#define DCP_NO_ITEM SIZE_MAX

/* All names and paths point into the parsed pickle, which the metadata
 * keeps (and dcp_metadata_free frees): hostile metadata that repeats one
 * long string through the memo costs no more memory than it took input.
 * Dimensions live in one array per tensor. */
typedef struct dcp_chunk {
    const uint64_t *offsets; /* ndim values: where the chunk starts in the global tensor */
    const uint64_t *sizes;   /* ndim values */
    uint32_t ndim;
    size_t item; /* its storage item (index into dcp_metadata.items), or DCP_NO_ITEM */
} dcp_chunk;

typedef struct dcp_tensor {
    const char *fqn;
    char dtype[16];       /* safetensors spelling ("BF16"); "" if not supported */
    char torch_dtype[32]; /* the torch.<name> global's name, for messages */
    uint32_t ndim;
    const uint64_t *size; /* ndim values: the global size */
    size_t n_chunks;
    dcp_chunk *chunks; /* sorted by offsets; within the global size, distinct */
    uint64_t *dims;    /* private: the size and the chunks' offsets and sizes */
} dcp_tensor;

typedef enum dcp_item_kind { DCP_ITEM_TENSOR, DCP_ITEM_BYTES } dcp_item_kind;

typedef struct dcp_item {
    dcp_item_kind kind;
    const char *fqn;
    size_t tensor, chunk;      /* DCP_ITEM_TENSOR: tensors[tensor].chunks[chunk] */
    const char *relative_path; /* the file, relative to the directory of .metadata */
    uint64_t offset, length;   /* offset + length does not overflow */
    bool transformed;          /* transform_descriptors given: not a plain archive */
} dcp_item;

typedef struct dcp_metadata {
    size_t n_tensors;
    dcp_tensor *tensors; /* in .metadata's order */
    size_t n_bytes;      /* BytesStorageMetadata entries */
    size_t n_items;
    dcp_item *items; /* sorted by relative_path, then offset; the items of
                          * one file do not overlap */
    void *doc;       /* private: the pickle the strings point into */
} dcp_metadata;

/* Parses and validates .metadata's bytes. Returns 0 and fills *md; -EINVAL
 * with a one-line message ("dcp metadata: ...") for a malformed, hostile or
 * over-limit pickle; -ENOMEM. On failure *md is empty. Checks: the root is
 * a Metadata object; every entry is a TensorStorageMetadata (a torch dtype,
 * a torch.Size, chunks whose offsets + sizes lie within it) or a
 * BytesStorageMetadata; every storage item names a known fqn (and, for a
 * tensor, one of its chunks, once) with a relative_path, and non-negative
 * offset and length whose sum does not overflow; the items of one file do
 * not overlap (the message names both fqns). Counts are bounded
 * (DCP_MAX_*; and chunks by the pickle's node count, so that one chunk
 * list shared through the memo cannot stand for millions) and the walk is
 * of fixed depth, so shared or cyclic pickle nodes cannot make it loop. */
int dcp_metadata_parse(const uint8_t *data, size_t len, dcp_metadata *md, char *msg,
                       size_t msg_len);

void dcp_metadata_free(dcp_metadata *md);

extern const container_format ckpt_format_dcp;

#endif
