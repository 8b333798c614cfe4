/* What every container parser in this directory shares: one-line messages
 * that quote hostile names safely, overflow-checked tensor sizes,
 * little-endian fields, and the loop that reads a file's header through an
 * ingest_source until the head-based parser has all it asked for.
 *
 * Private to core/src/formats/: the rest of core sees formats.h only. */
#ifndef CKPT_FORMATS_PARSE_H
#define CKPT_FORMATS_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats.h"

/* Names are quoted into messages; long or hostile names are cut short and
 * control bytes escaped so that a message stays one readable line. */
#define QUOTED_NAME_MAX 64
#define QUOTED_NAME_BUF (QUOTED_NAME_MAX * 4 + 8)
#define SHAPE_TEXT_BUF 160

/* printf into msg (which may be NULL), control bytes replaced by '?'. */
void ingest_msg(char *msg, size_t msg_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* name, cut after QUOTED_NAME_MAX characters and escaped for '...' quotes. */
void ingest_quote_name(char *dst, size_t cap, const char *name);
/* "3, 4" for shape {3, 4}: callers add the brackets their format uses. */
void ingest_shape_text(char *dst, size_t cap, const uint64_t *shape, uint32_t ndim);

/* Element count times element size; false when it does not fit in 64 bits.
 * Multiplies in the safetensors reference's order (dimensions left to
 * right, then the element size) so that shapes holding a zero overflow
 * exactly when the reference says they do. */
static inline bool ingest_tensor_nbytes(const uint64_t *shape, uint32_t ndim, unsigned elem_size,
                                        uint64_t *out)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return false;
    return !__builtin_mul_overflow(n, (uint64_t)elem_size, out);
}

/* Does path end with suffix (".npy")? Case-sensitive, as packing always was. */
int ingest_path_has_suffix(const char *path, const char *suffix);

static inline uint64_t ingest_read_le(const uint8_t *p, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A head-based parser (ingest_safetensors, ingest_npy), as describe() calls
 * it; tensor_name is for formats whose file is one unnamed tensor. */
typedef int (*ingest_head_parser)(const uint8_t *head, size_t head_len, uint64_t file_size,
                                  const char *tensor_name, ingest_layout *out, uint64_t *need,
                                  char *msg, size_t msg_len);

/* describe() for a head-based parser: reads the first 4096 bytes (or the
 * whole file if shorter), then as many as the parser asks for with -EAGAIN,
 * but never more than max_head; what ("safetensors file") names the format
 * in the message for a header that does not fit. Returns what the parser
 * returns (0, 1, or -errno with msg set), or -errno with msg set when a read
 * fails or the file turns out shorter than src->size. */
int ingest_describe_head(const ingest_source *src, ingest_head_parser parse,
                         const char *tensor_name, uint64_t max_head, const char *what,
                         ingest_layout *out, char *msg, size_t msg_len);

/* The formats this directory implements, listed in formats.c. */
extern const container_format ckpt_format_safetensors;
extern const container_format ckpt_format_npy;

#endif
