/* The staged contents of one file of a checkpoint being written.
 *
 * Without a key a blob is a plain file on the backing filesystem, read and
 * written in place. With a key no plaintext may reach the disk, so a blob is
 * a log of sealed records, appended and never overwritten:
 *
 *   record = header (24 bytes) || nonce (24) || ciphertext || tag (16)
 *   header = u32 magic "CKSB" | u8 type | u8 cipher | 2 zero | u64 block | u32 plen
 *            | u32 0
 *
 * A DATA record holds block `block` of the file (STAGE_BLOCK plaintext bytes,
 * fewer only at its end); a SIZE record holds the u64 file size set by a
 * truncate. Each is sealed (stage_crypt.h) with a random nonce and, as
 * associated data, the blob id and the header. The newest record of a block
 * wins. Appending only means a crash can damage nothing but the unsynced
 * tail, so bytes synced before stay intact even when a block is rewritten;
 * replay on open stops at the first record that fails to authenticate and
 * cuts the log there. The map of where each block's newest record lives
 * takes 8 bytes per 64 KiB block, in memory. A log with more dead records
 * than live ones is compacted (copied live records into a new file, renamed
 * over the old one).
 *
 * Writes gather in a one-block buffer (so small sequential writes make one
 * record per block, not one per write), which reaches the log when the write
 * fills the block, when another block is written, or on sync. Big writes
 * (cp sends 256 KiB at a time) skip it: their whole blocks are sealed on all
 * cores at once and appended with one write.
 *
 * The descriptor is opened on first use and can be closed while the blob is
 * idle (stage_blob_park); the blob and its map live on.
 *
 * Every operation takes the blob's lock; errors are a negative errno with
 * a message in *err naming the staging file. */
#ifndef CKPTFS_STAGE_BLOB_H
#define CKPTFS_STAGE_BLOB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.h"
#include "stage_crypt.h"

#define STAGE_BLOCK (64u * 1024u)
/* The largest staged file (the reach of a sealed blob's map); a plain
 * blob's is its file system's largest file too when that is smaller (16
 * TiB on ext4): a write past it is refused (EFBIG) before its answer. */
#define STAGE_MAX_SIZE (256ull << 40)

typedef struct stage_blob stage_blob;

/* The blob with this id in the directory dirfd (borrowed; it must outlive
 * the blob), named by its id in hex. key: NULL for plain staging (borrowed
 * too). create: make a new empty blob (fails if it exists); else open an
 * existing one, replaying its log if sealed. */
int stage_blob_open(int dirfd, uint64_t id, const stage_key *key, int create, stage_blob **out,
                    ckpt_err *err);
/* Closes the descriptor and frees the blob; unsynced data is dropped. */
void stage_blob_free(stage_blob *b);

uint64_t stage_blob_id(const stage_blob *b);
uint64_t stage_blob_size(stage_blob *b);
/* Bytes the blob takes on disk now. */
uint64_t stage_blob_disk_bytes(stage_blob *b);

/* pread/pwrite semantics: reads are short only at the end of the file;
 * writes past the end leave zeros in between. Returns bytes read/written. */
ssize_t stage_blob_pread(stage_blob *b, void *buf, size_t len, uint64_t off, ckpt_err *err);
ssize_t stage_blob_pwrite(stage_blob *b, const void *buf, size_t len, uint64_t off, ckpt_err *err);

/* A write's early answer. fn(arg, len) is called once the write has been
 * checked and ordered after every earlier operation on the blob (its lock
 * is held, so it must not call back into the blob), but before its bytes
 * are copied: the FUSE layer answers the writer there, and the writer's
 * next request travels while this one is written. A write that fails after
 * its answer has nobody left to tell, so the blob keeps the error, as a
 * page cache keeps a writeback error: the next write is refused with it
 * (once: a writer that frees space and retries is not refused again), and
 * stage_blob_take_error and stage_blob_sync return it, once. */
typedef struct stage_ack {
    void (*fn)(void *arg, size_t len);
    void *arg;
    int given; /* set once fn was called: a failure then is the blob's to keep */
} stage_ack;

/* stage_blob_pwrite that calls ack (NULL: none) as above. */
ssize_t stage_blob_pwrite_acked(stage_blob *b, const void *buf, size_t len, uint64_t off,
                                stage_ack *ack, ckpt_err *err);
/* stage_blob_pwrite_acked of the next len bytes of fd (a pipe, as FUSE
 * hands over a write). A failed write may leave some of them in fd. */
ssize_t stage_blob_write_fd(stage_blob *b, int fd, size_t len, uint64_t off, stage_ack *ack,
                            ckpt_err *err);
/* The error of a write that failed after its answer (0: none), cleared,
 * with its message in *err: what close reports. */
int stage_blob_take_error(stage_blob *b, ckpt_err *err);
int stage_blob_truncate(stage_blob *b, uint64_t size, ckpt_err *err);
/* Durable: returns once every byte written so far is on disk, together
 * with the blob's name in its directory; or the error of a write that
 * failed after its answer (taken, as stage_blob_take_error). */
int stage_blob_sync(stage_blob *b, ckpt_err *err);
/* Writes out the block buffer (without syncing) and closes the descriptor;
 * the next operation reopens it. 0, or the error of the write. */
int stage_blob_park(stage_blob *b, ckpt_err *err);
/* Removes the blob's file from its directory. The blob stays usable (its
 * descriptor is kept open for that) until freed: an unlinked file that is
 * still open keeps working, as on any filesystem. */
int stage_blob_unlink(stage_blob *b, ckpt_err *err);

/* The file name a blob id has in its directory. */
void stage_blob_name(uint64_t id, char out[24]);

#endif
