/* Chunk payload encoding: byte-grouping by element size, then per plane a
 * zstd frame (in effect Huffman-only; deflate at level 9 when LZ77 wins)
 * or stored, whichever is smaller. */
#ifndef CKPT_CODEC_H
#define CKPT_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

struct libdeflate_compressor;
struct ZSTD_CCtx_s;

typedef struct chunk_encoder {
    z_stream z;
    int z_level, z_strategy, z_ready;
    uint8_t *planes; /* transposed copy of the chunk */
    size_t planes_cap;
    uint8_t *sample; /* opaque chunks: the bytes the grouping is chosen on */
    struct libdeflate_compressor *trial;
    uint8_t *trial_out;     /* what the deflate trial writes */
    struct ZSTD_CCtx_s *zc; /* the plane coder, made on first use */
} chunk_encoder;

void chunk_encoder_init(chunk_encoder *e);
void chunk_encoder_free(chunk_encoder *e);

/* Encodes raw[0..n). elem is the element size of typed data, or 0 for
 * opaque bytes, whose grouping (none, or 2, 4 or 8) the encoder chooses per
 * chunk (FORMAT.md section 3). out must hold n + TPACK_CHUNK_OVERHEAD bytes.
 * Returns 0 or -ENOMEM; sets the codec, the payload length and *group, the
 * element size the chunk record carries (elem, or the width chosen). */
int chunk_encode(chunk_encoder *e, const uint8_t *raw, size_t n, unsigned elem, int level,
                 uint8_t *out, size_t *out_len, uint8_t *codec, uint8_t *group);

/* Opaque chunks: the grouping chunk_encode() would choose for raw[0..n)
 * (1: none, 0: nothing pays, store it) and its estimated payload size for the
 * sample it looked at; exposed for tests and measurements. */
unsigned chunk_choose_grouping(chunk_encoder *e, const uint8_t *raw, size_t n, double *ratio);

/* Decodes a payload of a pack of format version `version` into out
 * (exactly raw_size bytes). scratch must hold raw_size bytes for BYTEGROUP
 * payloads. Returns 0, or -EIO (or -ENOMEM) with *why set. The decoder
 * state (zstd and libdeflate contexts) is kept per thread and freed when
 * the thread exits, or by chunk_decoder_release(). */
int chunk_decode(const uint8_t *payload, size_t len, uint8_t codec, unsigned elem, unsigned version,
                 uint8_t *out, size_t raw_size, uint8_t *scratch, const char **why);
void chunk_decoder_release(void);

/* This thread's buffer `which`, at least n bytes (n > 0), kept with its
 * decoder state until the thread asks for a larger one or exits; NULL when
 * out of memory. pack_chunk_decode needs up to three per chunk (the stored
 * bytes, the plaintext, the byte-group scratch): a malloc and free of each
 * for every chunk made glibc grow and trim its heap each time, and `ckpt
 * cat` of an encrypted pack spent as long in page faults as in user code.
 * Memory stays bounded by threads times three chunks. */
enum { DECODE_BUF_STORED, DECODE_BUF_PLAIN, DECODE_BUF_SCRATCH, DECODE_BUF_COUNT };
uint8_t *chunk_decode_buf(int which, size_t n);

/* Is this (codec, elem, raw size, payload size) combination well-formed? */
int chunk_shape_valid(uint8_t codec, unsigned elem, uint32_t raw_size, uint32_t payload_size);

#endif
