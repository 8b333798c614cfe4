/* The in-memory form of an open pack, shared by the reader, the streamer
 * and verify. */
#ifndef CKPT_PACK_H
#define CKPT_PACK_H

#include "common.h"
#include "crypto.h"
#include "store/store.h"

typedef struct extent {
    uint64_t length;
    uint64_t first_chunk;
    uint64_t file_offset; /* derived: where it starts inside its file */
    size_t file_index;    /* derived */
    /* derived: the tensors inside it, p->ext_tensors[first_tensor ..
     * first_tensor + n_tensors), ordered by where they start */
    size_t first_tensor, n_tensors;
    uint8_t kind, elem_size;
} extent;

typedef struct chunk {
    uint64_t offset; /* in the pack file */
    uint32_t stored_size;
    uint32_t raw_size;
    uint32_t crc;
    uint8_t codec, elem_size;
    size_t extent_index; /* derived */
} chunk;

typedef struct file_rec {
    ckpt_file_info info;
    size_t first_extent, n_extents;
} file_rec;

typedef struct tensor_rec {
    ckpt_tensor_info info;
    size_t extent_index;    /* stored tensors only */
    uint64_t extent_offset; /* where its bytes start inside the extent */
    uint64_t *shape;
    char dtype[16];
    /* assembled tensors: parts[k] starts at byte part_start[k] of it */
    size_t *parts;
    uint64_t *part_start;
} tensor_rec;

struct ckpt_pack {
    store_reader *obj; /* where the pack's bytes come from */
    int fd;            /* obj's descriptor, or -1 */
    char *path;        /* for messages: the path, or "<store>/<name>" */
    uint8_t header[128];
    uint8_t pack_id[16];
    uint32_t chunk_size;
    uint64_t file_size;
    uint32_t kdf;
    uint32_t version; /* 1 to 5: some index records differ */
    pack_keys keys;   /* subkey NULL when not encrypted */
    size_t n_files, n_tensors, n_extents, n_chunks;
    size_t n_stored; /* tensors[0..n_stored) are stored, the rest assembled */
    size_t n_skipped;
    file_rec *files;
    ckpt_skipped_info *skipped;
    tensor_rec *tensors;
    extent *extents;
    chunk *chunks;
    size_t *ext_tensors; /* tensor indices grouped by extent (see extent) */
    uint8_t *index;      /* plaintext index; names point into it */
    strmap file_map, tensor_map;
    uint64_t logical_bytes;
};

int pack_stream_chunks(ckpt_pack *p, size_t first, size_t end, unsigned threads,
                       int (*cb)(void *ud, size_t id, const uint8_t *data, const ckpt_err *cerr),
                       void *ud, ckpt_err *err);

/* The chunk ids [first, end) of file f; first == end when it has none. */
void pack_file_chunk_range(const ckpt_pack *p, size_t f, size_t *first, size_t *end);

/* Decodes chunk id; out holds raw_size bytes. On failure err names the pack,
 * the file, and the offset. */
int pack_chunk_decode(ckpt_pack *p, size_t id, uint8_t *out, ckpt_err *err);
/* Describes chunk id for error messages: "file 'x' at offset N". */
void pack_chunk_where(const ckpt_pack *p, size_t id, char *buf, size_t len);

#endif
