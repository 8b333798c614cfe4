/* A Huffman-only deflate encoder for the byte planes of tensor chunks.
 *
 * zlib's Z_HUFFMAN_ONLY strategy encodes about 120 MB/s here, and the
 * exponent planes of every bf16 chunk go through it: that was over half of
 * all packing time. The output here is one final dynamic-Huffman block of
 * literals (RFC 1951, section 3.2.7) with a code built from the plane's
 * own histogram, which any inflater reads (FORMAT.md asks only for a raw
 * deflate stream), written several times faster. */
#ifndef CKPT_HUFF_H
#define CKPT_HUFF_H

#include <stddef.h>
#include <stdint.h>

/* Encodes in[0..n) (n >= 1) with hist its byte histogram. Returns the
 * number of bytes written to out, or 0 if the stream would not fit in cap
 * bytes (nothing useful is left in out then). */
size_t huff_deflate(const uint8_t *in, size_t n, const uint32_t hist[256], uint8_t *out,
                    size_t cap);

#endif
