/* A bounded reader of zip archives as torch.save (torch >= 1.6) writes them:
 * the central directory is read whole, every entry's local header is checked
 * against it, and each entry's name, compression method and data range in
 * the file are reported. It never decompresses: torch stores its records
 * uncompressed (method 0, "stored"), 64-byte aligned, so a stored entry's
 * bytes are simply [data_offset, data_offset + size) of the file.
 *
 *   [local header 0][data 0][descriptor] ... [central directory]
 *   [zip64 end record][zip64 locator][end of central directory]
 *
 * Input is untrusted. zip_open() accepts an archive only when:
 *   - the end record is the last thing in the file (its comment runs to the
 *     end), one disk only, and a zip64 end record when the 32-bit fields are
 *     saturated (torch always writes one);
 *   - at most ZIP_MAX_ENTRIES entries, a central directory of at most
 *     ZIP_MAX_CD_BYTES that lies inside the file and holds exactly its
 *     entries, names of 1..ZIP_MAX_NAME bytes without NUL, no duplicates;
 *   - each local header and its data lie before the central directory, the
 *     local header's signature, name and method match the central entry (and
 *     its CRC and sizes, unless a data descriptor carries them), and no two
 *     entries' header+data ranges overlap.
 * Every offset and size is computed with overflow checks. The archive is
 * read only through the ingest_source (never past src->size).
 *
 * Messages are one line without a prefix ("central directory ..."): the
 * caller names the container ("torch archive: ..."). */
#ifndef CKPT_FORMATS_ZIP_H
#define CKPT_FORMATS_ZIP_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/formats.h"

#define ZIP_MAX_ENTRIES 262144u
#define ZIP_MAX_NAME 4096u
#define ZIP_MAX_CD_BYTES (64u << 20)

#define ZIP_METHOD_STORED 0

typedef struct zip_entry {
    char *name;      /* NUL-terminated, no NUL inside */
    uint16_t method; /* 0 stored, 8 deflate, ... */
    uint16_t flags;  /* general purpose flags; bit 0: encrypted */
    uint32_t crc32;
    uint64_t header_offset; /* local header */
    uint64_t data_offset;   /* first byte of the entry's (stored) data */
    uint64_t comp_size;     /* bytes of data in the file */
    uint64_t size;          /* bytes once uncompressed */
} zip_entry;

typedef struct zip_archive {
    size_t n;
    zip_entry *e;       /* in central directory order */
    size_t *by_name;    /* indices into e, sorted by name (zip_find) */
    uint64_t cd_offset; /* the central directory: [cd_offset, cd_offset + cd_size) */
    uint64_t cd_size;
    bool zip64; /* a zip64 end record was used */
} zip_archive;

/* Reads and validates the archive's directory. Returns 0, -EINVAL with a
 * message for a malformed archive, -EIO (or the read callback's -errno)
 * when the source fails, -ENOMEM. On failure *z is empty. */
int zip_open(const ingest_source *src, zip_archive *z, char *msg, size_t msg_len);

/* The entry with exactly this name, or NULL. */
const zip_entry *zip_find(const zip_archive *z, const char *name);

/* Whether the entry's bytes can be used as they lie in the file: stored,
 * not encrypted, and as many bytes in the file as uncompressed. */
bool zip_entry_is_raw(const zip_entry *e);

void zip_close(zip_archive *z);

#endif
