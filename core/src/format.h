/* On-disk layout of a .tpack file; core/FORMAT.md is the prose version. */
#ifndef CKPT_FORMAT_H
#define CKPT_FORMAT_H

#include <stdint.h>

#define TPACK_MAGIC "\x89TPACK\r\n"
#define TPACK_END_MAGIC "TPACKEND"
#define TPACK_INDEX_MAGIC 0x58444954u /* "TIDX" */
#define TPACK_HEADER_SIZE 128
#define TPACK_FOOTER_SIZE 64

/* Header field offsets. */
enum {
    HDR_MAGIC = 0,
    HDR_VERSION = 8,
    HDR_SIZE = 12,
    HDR_PACK_ID = 16,
    HDR_FLAGS = 32,
    HDR_CIPHER = 36,
    HDR_KDF = 40,
    HDR_CHUNK_SIZE = 44,
    HDR_KDF_OPS = 48,
    HDR_KDF_MEM = 56,
    HDR_KDF_SALT = 64,
    HDR_KEY_CHECK = 80,
    HDR_RESERVED = 96,
    HDR_CRC = 124,
};
enum {
    FTR_INDEX_OFFSET = 0,
    FTR_INDEX_STORED = 8,
    FTR_INDEX_RAW = 16,
    FTR_DIGEST = 24,
    FTR_MAGIC = 56
};

#define TPACK_FLAG_ENCRYPTED 1u

enum tpack_kdf { TPACK_KDF_NONE = 0, TPACK_KDF_KEYFILE = 1, TPACK_KDF_ARGON2ID = 2 };

/* Chunk codecs. BYTEGROUP payload: per plane {u8 method, u32 length}, then planes. */
enum tpack_codec { CODEC_STORED = 0, CODEC_DEFLATE = 1, CODEC_BYTEGROUP = 2 };
/* Plane methods: 2 (one zstd frame) since version 3. */
enum tpack_plane { PLANE_STORED = 0, PLANE_DEFLATE = 1, PLANE_ZSTD = 2 };

/* Kind 1 was "the one tensor's bytes" in version 1; since version 2 it is a
 * typed extent that holds any number of (possibly overlapping) tensors. */
enum tpack_extent_kind { EXTENT_DATA = 0, EXTENT_TYPED = 1 };

/* A file record's container byte (version 2); ckpt_container_name() spells them. */
enum tpack_container {
    CONTAINER_NONE = 0,
    CONTAINER_SAFETENSORS = 1,
    CONTAINER_NPY = 2,
    CONTAINER_TORCH = 3,
    CONTAINER_DCP = 4,
    CONTAINER_TENSORIZER = 5,
    CONTAINER_GGUF = 6,
    CONTAINER_MAX = CONTAINER_GGUF,
};
/* The longest note a file record may carry (bytes of UTF-8). */
#define TPACK_NOTE_MAX 1024
/* The largest index a reader accepts (raw bytes); a writer refuses to
 * finish a pack whose index is larger, which no reader would open. */
#define TPACK_INDEX_MAX (1ull << 31)

#define TPACK_EXTENT_RECORD 24
#define TPACK_CHUNK_RECORD 24
/* u32 file, u16 name_len, a name of at least 1 byte, u16 reason_len. */
#define TPACK_SKIPPED_RECORD_MIN 9
#define TPACK_AEAD_TAG 16
#define TPACK_INDEX_NONCE_ID UINT64_MAX
/* The most a chunk can grow over its raw size: plane table plus AEAD tag. */
#define TPACK_CHUNK_OVERHEAD (5 * 8 + TPACK_AEAD_TAG)
/* Argon2id limits accepted from a header, so a hostile pack cannot make
 * opening it take unbounded time or memory. */
#define TPACK_KDF_OPS_MAX 10u
#define TPACK_KDF_MEM_MAX (1024ull * 1024 * 1024)

#endif
