/* Helpers shared by the binary container parsers (gguf.c, tensorizer.c): a
 * bounds-checked little-endian cursor over an ingest_source, one-line fault
 * messages, and the final layout check and sort.
 *
 * The cursor reads through a small window, so a parser walks a header of
 * any length with a fixed buffer. Every read is checked against the file
 * size first; the first fault is kept in the cursor (later reads fail
 * without touching the source) and the parser reports it once.
 *
 * Private to core/src/formats. */
#ifndef CKPT_FORMATS_BINREAD_H
#define CKPT_FORMATS_BINREAD_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats.h"

#define BINREAD_WINDOW 65536u

typedef struct binread {
    const ingest_source *src;
    uint64_t pos;     /* next byte to read */
    uint64_t win_off; /* file offset of win[0] */
    size_t win_len;   /* valid bytes in win */
    int err;          /* first fault: -EINVAL (past the end) or the source's -errno */
    uint8_t win[BINREAD_WINDOW];
} binread;

void binread_init(binread *r, const ingest_source *src, uint64_t pos);
/* Bytes left between pos and the end of the file. */
uint64_t binread_left(const binread *r);
/* Copies n bytes at pos into dst and advances. False at the end of the
 * file (err = -EINVAL) or on a read error (err = -errno). */
bool binread_bytes(binread *r, void *dst, size_t n);
bool binread_skip(binread *r, uint64_t n);
bool binread_u8(binread *r, uint8_t *v);
bool binread_u16(binread *r, uint16_t *v);
bool binread_u32(binread *r, uint32_t *v);
bool binread_u64(binread *r, uint64_t *v);
/* Moves to an absolute offset (which may be the end of the file). */
bool binread_seek(binread *r, uint64_t pos);

/* Formats msg like snprintf and then keeps it one printable line. */
void binread_msg(char *msg, size_t msg_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A name quoted for a message: cut short after 64 characters, control
 * bytes, quotes and backslashes escaped. */
#define BINREAD_QUOTE_BUF (64 * 4 + 8)
void binread_quote(char *dst, size_t cap, const char *name, size_t name_len);

/* Sorts out->t and out->regions by offset, refuses ranges that leave the
 * file or overlap one another (tensors and regions alike; empty ranges
 * overlap nothing), and sets out->header_bytes to the offset of the first
 * non-empty range (the file size when there is none). `fmt` prefixes the
 * message ("gguf"). Returns 0 or -EINVAL. */
int binread_finish_layout(ingest_layout *out, uint64_t file_size, const char *fmt, char *msg,
                          size_t msg_len);

/* Frees what a parser put in out, regions included, and zeroes it. */
void binread_layout_free(ingest_layout *out);

#endif
