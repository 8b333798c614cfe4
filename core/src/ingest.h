/* Parsers for the tensor containers that packing understands. They only
 * describe where tensors live; the bytes themselves are streamed by the
 * writer. Both parsers take untrusted input and never read past len. */
#ifndef CKPT_INGEST_H
#define CKPT_INGEST_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_MAX_NDIM 32
/* The safetensors reference refuses headers larger than this. */
#define CKPT_SAFETENSORS_MAX_HEADER 100000000ull

typedef struct ingest_tensor {
    char *name;
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_NDIM];
    uint64_t offset;   /* absolute offset of the first byte in the file */
    uint64_t nbytes;
} ingest_tensor;

typedef struct ingest_layout {
    uint64_t header_bytes;    /* bytes before the first tensor */
    size_t n;                 /* tensors, sorted by offset, contiguous */
    ingest_tensor *t;
} ingest_layout;

/* safetensors: `head` holds the first head_len bytes of a file of file_size
 * bytes (at least 8 + header length bytes, or the whole file if shorter).
 * Returns 0, or -EINVAL with a message in msg. If more bytes are needed it
 * returns -EAGAIN and sets *need to the number of leading bytes required. */
int ingest_safetensors(const uint8_t *head, size_t head_len, uint64_t file_size,
                       ingest_layout *out, uint64_t *need, char *msg, size_t msg_len);

/* npy versions 1-3, C order, little-endian or byte-order-free dtypes. Same
 * contract as above. A valid npy that cannot be presented as a raw tensor
 * (Fortran order, big-endian, object or structured dtype) returns 1: store it
 * as an opaque file. */
int ingest_npy(const uint8_t *head, size_t head_len, uint64_t file_size, const char *name,
               ingest_layout *out, uint64_t *need, char *msg, size_t msg_len);

void ingest_layout_free(ingest_layout *l);

#endif
