/* Tensor containers that packing understands (safetensors, npy, and the
 * formats added later: torch.save zips, DCP, tensorizer, GGUF).
 *
 * A parser only describes where tensors live in a file; the bytes are
 * streamed by the writer. Every parser takes untrusted input: it bounds every
 * size, count and nesting depth, computes sizes with overflow checks and
 * never reads past the source. A file a parser rejects is stored opaque with
 * a warning that names the file and the fault; it never fails a checkpoint.
 * (Until the callers switch to that, ingest_files.c still fails the pack on
 * a rejected file, with the parser's message.)
 *
 * Not part of the public API: for core's own translation units, the fuzz
 * targets and the unit tests. */
#ifndef CKPT_FORMATS_H
#define CKPT_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define CKPT_MAX_NDIM 32
/* The safetensors reference refuses headers larger than this. */
#define CKPT_SAFETENSORS_MAX_HEADER 100000000ull

/* One tensor: a contiguous, little-endian, C-order byte range of the file. */
typedef struct ingest_tensor {
    char *name;
    char dtype[16]; /* safetensors dtype name: F32, BF16, ... */
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_NDIM];
    uint64_t offset; /* absolute offset of the first byte in the file */
    uint64_t nbytes;
} ingest_tensor;

/* A byte range of one element type that is not exactly one tensor (a torch
 * storage record, a quantized GGUF block run): packed grouped by its element
 * size, with no file under tensors/. */
typedef struct ingest_region {
    uint64_t offset;
    uint64_t length;
    char dtype[16];
} ingest_region;

/* ---- added for torch.save archives (formats/torch.c) ----
 * A tensor a parser found but does not present as a file under tensors/
 * (a non-contiguous view, an unknown dtype, ...), with why, for the manifest
 * and the log. */
typedef struct ingest_skipped {
    char *name;
    char reason[96];
    /* The file is damaged: its own loader (torch.load) would refuse it, so
     * packing warns. False for what ckptfs does not show by design (an
     * unsupported dtype, a non-contiguous view), which loads fine. */
    bool damaged;
} ingest_skipped;
/* ---- end of the torch.save addition ---- */

/* ---- added for PyTorch DCP (formats/dcp.c) ----
 * A tensor of t[] (by name) that is a chunk of a larger tensor: where it
 * lies in it, so the writer can assemble the chunks (pack_write.c). */
typedef struct ingest_chunk {
    char *name;  /* the chunk's name in t[] (malloc'd) */
    char *whole; /* the larger tensor's name (malloc'd) */
    uint32_t ndim;
    uint64_t whole_shape[CKPT_MAX_NDIM];
    uint64_t offsets[CKPT_MAX_NDIM];
} ingest_chunk;
/* ---- end of the DCP addition ---- */

typedef struct ingest_layout {
    uint64_t header_bytes; /* bytes before the first tensor */
    size_t n;              /* tensors, sorted by offset */
    ingest_tensor *t;
    size_t n_regions; /* typed ranges beside the tensors, sorted by offset */
    ingest_region *regions;
    /* ---- added for torch.save archives (formats/torch.c) ----
     * Tensors found but not in t[], in the order found; each name is
     * malloc'd. ingest_layout_free() must free them (and regions). */
    size_t n_skipped;
    ingest_skipped *skipped;
    /* ---- end of the torch.save addition ---- */
    /* DCP: chunks of larger tensors (names and wholes malloc'd); freed by
     * ingest_layout_free(). */
    size_t n_chunks;
    ingest_chunk *chunks;
} ingest_layout;

void ingest_layout_free(ingest_layout *l);

/* Where a parser reads a file from: the whole file is `size` bytes, and
 * read() returns bytes read (short only at the end), or -errno. */
typedef struct ingest_source {
    ckpt_read_fn read;
    void *ud;
    uint64_t size;
    const char *name; /* for messages */
    /* ---- added for PyTorch DCP (formats/dcp.c); OPTIONAL: NULL means
     * unavailable, and every parser must work without it ----
     * Reads the whole of the file `name` (one path component, such as
     * ".metadata") in the same directory as this file into *out (malloc'd,
     * the caller frees it) and its length into *len. Returns 0; -ENOENT
     * when there is no such file; -EFBIG when it is larger than max bytes;
     * -EINVAL for a name that is not one plain component; or another
     * -errno. sibling_ud is passed as ud. */
    int (*read_sibling)(void *ud, const char *name, uint8_t **out, size_t *len, size_t max);
    void *sibling_ud;
    /* ---- end of the DCP addition ---- */
} ingest_source;

/* One container format. sniff() looks at the path and the first head_len
 * bytes (up to 4096, fewer for a shorter file) and says whether the file
 * claims to be this format. describe() then fills out: it returns 0; 1 for
 * a valid file that is best kept opaque; or -errno with a one-line message
 * in msg naming the fault (the caller prefixes the file name). */
typedef struct container_format {
    const char *name; /* "safetensors", "npy", ... as the manifest spells it */
    int (*sniff)(const char *path, const uint8_t *head, size_t head_len, uint64_t size);
    int (*describe)(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                    size_t msg_len);
} container_format;

/* The formats, in the order they are tried; NULL-terminated. */
extern const container_format *const ckpt_container_formats[];

/* The first format whose sniff() claims the file, or NULL. */
const container_format *ckpt_container_sniff(const char *path, const uint8_t *head, size_t head_len,
                                             uint64_t size);

/* ---- the head-based parsers, kept for their callers and tests ---- */

/* safetensors: `head` holds the first head_len bytes of a file of file_size
 * bytes (at least 8 + header length bytes, or the whole file if shorter).
 * Returns 0, or -EINVAL with a message in msg. If more bytes are needed it
 * returns -EAGAIN and sets *need to the number of leading bytes required. */
int ingest_safetensors(const uint8_t *head, size_t head_len, uint64_t file_size, ingest_layout *out,
                       uint64_t *need, char *msg, size_t msg_len);

/* npy versions 1-3, C order, little-endian or byte-order-free dtypes. Same
 * contract as above. A valid npy that cannot be presented as a raw tensor
 * (Fortran order, big-endian, object or structured dtype) returns 1: store it
 * as an opaque file. */
int ingest_npy(const uint8_t *head, size_t head_len, uint64_t file_size, const char *name,
               ingest_layout *out, uint64_t *need, char *msg, size_t msg_len);

#endif
