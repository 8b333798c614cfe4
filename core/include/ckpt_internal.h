/*
 * libckpt's internal API: helpers that ckptfs's own daemon (fs/) and tools
 * (tools/) share with the library. Unstable: names and signatures change
 * without notice, and this header is not installed. Programs outside this
 * tree use ckpt.h only.
 *
 * Like zstd's ZSTD_STATIC_LINKING_ONLY, it must be asked for by name, so a
 * reader of any file can see that the file reaches past the public API:
 *
 *     #define CKPT_INTERNAL_API
 *     #include "ckpt_internal.h"
 *
 * The library's own sources get it through core/src/common.h.
 */
#ifndef CKPT_INTERNAL_H
#define CKPT_INTERNAL_H

#ifndef CKPT_INTERNAL_API
#error                                                                                             \
    "ckpt_internal.h is libckpt's unstable, uninstalled API: #define CKPT_INTERNAL_API before including it (ckptfs's own code only)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>

#include "ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* ---------------------------------------------------------------- errors */

/* Fills err (if any) and returns code, so callers can `return ckpt_fail(...)`. */
int ckpt_fail(ckpt_err *err, int code, const char *fmt, ...) CKPT_PRINTF(3, 4);
/* Prefixes an existing message with "<prefix>: " (used to add file names). */
int ckpt_fail_prefix(ckpt_err *err, const char *prefix);

/* Online CPUs, between 1 and 256: the default worker count. */
unsigned ckpt_default_threads(void);

/* For a program about to hold a key (the daemon, the tools; never the
 * library, which must not change its host process): no core dump, and no
 * ptrace attach or /proc/PID/mem read by the user's other processes. The
 * core limit alone is ignored by some core_pattern helpers; the dumpable
 * flag is not. Returns 0, or -errno. */
int ckpt_forbid_core_dumps(void);

/* sodium_malloc and sodium_free for secrets that live long (keys, pack and
 * staging subkeys): guarded, locked, kept out of core dumps, wiped when
 * freed, and listed for ckpt_secrets_relock. */
void *ckpt_secret_alloc(size_t len);
void ckpt_secret_free(void *p);
/* Locks every live secret again: a child of fork(2) inherits no memory
 * locks (ckptfs daemonizing after it read its key and derived staging
 * keys). Returns 0, or -errno of the first that failed (RLIMIT_MEMLOCK). */
int ckpt_secrets_relock(void);

/* ------------------------------------------------ little-endian fields */

static inline void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ------------------------------------------------------- growing memory */

/* Growable byte buffer for building records. An allocation failure sets
 * oom and makes later puts no-ops, so a builder checks once at the end. */
typedef struct bytebuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} bytebuf;
void bb_put(bytebuf *b, const void *data, size_t n);
void bb_u8(bytebuf *b, uint8_t v);
void bb_u16(bytebuf *b, uint16_t v);
void bb_u32(bytebuf *b, uint32_t v);
void bb_u64(bytebuf *b, uint64_t v);
void bb_free(bytebuf *b);

/* Grows *arr (of elem-sized items) so it holds at least n+1 items; 0 or
 * -ENOMEM (*arr untouched). */
int grow_array(void **arr, size_t *cap, size_t n, size_t elem);

/* ------------------------------------------------------ whole transfers */

/* read(2)/write(2) until the whole length is moved, retrying EINTR and
 * short transfers; the one copy of that loop for the library, the daemon
 * and the tools. len must not exceed SSIZE_MAX.
 *
 * Reads return the bytes read, which is less than len only when the file
 * ends first (0 at or past the end), or -errno; what was read before an
 * error is in buf but not reported. A caller that needs exactly len bytes
 * treats a short count as its own error (a truncated file).
 *
 * Writes return len, or -errno (-EIO if the kernel accepts nothing without
 * saying why); after an error an unknown prefix may have been written. */
ssize_t ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off);
ssize_t ckpt_read_full(int fd, void *buf, size_t len);
ssize_t ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
ssize_t ckpt_write_full(int fd, const void *buf, size_t len);

/* Opens path read-only (O_CLOEXEC and `flags`, e.g. O_NOFOLLOW) if it is a
 * regular file, and fills *st. A FIFO or device put in its place must not
 * hang or act on the open: it is opened O_NONBLOCK, which is cleared once
 * the file is known to be regular. Returns the descriptor, -errno, or
 * -EINVAL for anything but a regular file. */
int ckpt_open_regular(const char *path, int flags, struct stat *st);

/* The temporary file a writer renames to path: path's directory, then
 * prefix, path's base name and suffix ("d/.NAME.tpack.tmp", "OUT.tmp"), in
 * out (cap bytes). A base name for which that would pass NAME_MAX keeps its
 * first bytes (227 for ckptfs's packs) and gets '~' and a 16-digit hash of
 * the whole, so that long names sharing a beginning still get their own.
 * 0, or -ENAMETOOLONG. */
int ckpt_tmp_name(const char *path, const char *prefix, const char *suffix, char *out, size_t cap);

/* ------------------------------------------------ store administration */

/* What ckptfs's writer does to a store beside reading and writing packs.
 * remove and rename act on one object; on an object store rename is a copy
 * and a delete, so it is not atomic there: use it only for names nobody
 * reads concurrently. */
int ckpt_store_remove(ckpt_store *s, const char *name, ckpt_err *err);
int ckpt_store_rename(ckpt_store *s, const char *from, const char *to, ckpt_err *err);
/* remove, only while name is still the version want names: else -ESTALE
 * and nothing removed. On S3 a HEAD compares the ETag and the DELETE
 * carries If-Match; Ceph RGW 16.2 ignores If-Match on a DELETE, so there an
 * object replaced between the HEAD and the DELETE is removed. A local
 * store does not check want (a plain remove). */
int ckpt_store_remove_if(ckpt_store *s, const char *name, const ckpt_object_id *want,
                         ckpt_err *err);
/* An upload that failed because the store did not answer could not be
 * aborted either: the store keeps it and sends the abort again here (and
 * before its next upload starts). The count of aborts still due: 0 when
 * none, or for a store that always reaches its objects. Fails fast, as
 * any request, while the store is known to be down. */
long ckpt_store_retry_aborts(ckpt_store *s);

/* An exclusive advisory lock named name, for the one writer of a store
 * (local: flock on that file, created if missing, holding the owner's PID).
 * Another holder, in this process or another, makes it fail with -EBUSY and
 * a message naming the holder's PID when known. Released by unlock or when
 * the process exits. */
typedef struct ckpt_store_lock ckpt_store_lock;
int ckpt_store_lock_take(ckpt_store *s, const char *name, ckpt_store_lock **out, ckpt_err *err);
void ckpt_store_lock_release(ckpt_store_lock *l);
/* Before a fork (a daemon going to the background): an S3 lease's
 * renewing thread is stopped, so that the fork copies no thread's state
 * in the middle of a request (a mutex of the HTTP pool, an allocator
 * lock). Until ckpt_store_lock_after_fork the lease is not renewed; it
 * lasts a minute. */
void ckpt_store_lock_before_fork(ckpt_store_lock *l);
/* In the child of a fork (a daemon going to the background): the lock is
 * this process's now. A local flock needs nothing; an S3 lease, whose
 * renewing thread did not survive the fork, is renewed at once naming the
 * new pid, and its renewer started again. 0, or -errno when the lease
 * could not be renewed (then it is no longer held). */
int ckpt_store_lock_after_fork(ckpt_store_lock *l, ckpt_err *err);

/* ---------------------------------------------------- pack generations */

/* Adds file file_index of src to w as path (with this mode and mtime: a
 * file renamed, chmod-ed or touched since is still the same bytes), as it is
 * stored in src: its chunks' stored bytes are reused, never decoded or encoded again (in an encrypted
 * pack each chunk is opened under src's key and sealed under w's, which
 * authenticates it on the way), and its tensors, digests, container, note
 * and skipped tensors come along. For a new generation of a pack whose
 * unchanged files need no work. src stays open until w is finished.
 * Returns -EXDEV, having added nothing, where the chunks cannot be reused
 * (another chunk size, one pack encrypted and the other not, or a tensor
 * name already in w): add the file from its decoded bytes instead. */
int ckpt_writer_copy_file(ckpt_writer *w, const char *path, uint32_t mode, int64_t mtime_sec,
                          uint32_t mtime_nsec, ckpt_pack *src, size_t file_index, ckpt_err *err);

/* ckpt_writer_add_reader for a source that read(ud, ...) answers from any
 * thread, several calls at once, until w is finished or aborted: a big
 * file's SHA-256 is then taken by a hash lane that reads it again beside
 * the pipeline (as for files added by path), so that several files' hash
 * chains run at once instead of one after another. For ckptfs's packer,
 * whose staged files stay in place until the pack is committed. */
int ckpt_writer_add_reader_shared(ckpt_writer *w, const char *pack_path, ckpt_read_fn read,
                                  void *ud, uint64_t size, uint32_t mode, int64_t mtime_sec,
                                  uint32_t mtime_nsec, const char *src_name, ckpt_err *err);

/* The files a caller will add with ckpt_writer_add_reader_ahead, in the
 * order of the plan (any may be left out): the hash lanes of the big ones
 * are queued ahead of the writer, a window of them at a time, as
 * ckpt_writer_add_tree queues a tree's, so that each file's SHA-256 chain
 * runs beside the encoding of the files before it instead of starting when
 * the writer reaches the file. For ckptfs's packer, whose staged files do
 * not change once committed. */
typedef struct ckpt_planned_reader {
    /* As for ckpt_writer_add_reader_shared: read(ud, ...) answers from any
     * thread, several calls at once, until the writer is finished or
     * aborted, from the moment the plan is made. */
    ckpt_read_fn read;
    void *ud;
    uint64_t size;
    int hash_ahead; /* 0: its lane is queued only when it is added (a file
                     * that may not be added from its bytes at all) */
} ckpt_planned_reader;
typedef struct ckpt_readers_ahead ckpt_readers_ahead;

/* plan: n files, borrowed until ckpt_readers_ahead_free. NULL: out of
 * memory. */
ckpt_readers_ahead *ckpt_readers_ahead_new(ckpt_writer *w, const ckpt_planned_reader *plan,
                                           size_t n);
/* ckpt_writer_add_reader_shared of planned file i, with its read, ud and
 * size; files are added in the plan's order. */
int ckpt_writer_add_reader_ahead(ckpt_readers_ahead *a, size_t i, const char *pack_path,
                                 uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                                 const char *src_name, ckpt_err *err);
/* Before or after the writer is finished or aborted (lanes queued for files
 * left out are the writer's). */
void ckpt_readers_ahead_free(ckpt_readers_ahead *a);

/* The pack id w writes into its header (random, unique per pack): a
 * writer whose commit got no answer keeps it, so that a later try that
 * finds a pack under the name can tell its own upload from another's. */
void ckpt_writer_pack_id(const ckpt_writer *w, uint8_t out[16]);

/* *sent becomes 1 once w's finish has sent the store the request that
 * makes the pack (S3: the Complete, or the one PUT): only a try that got
 * that far can have left its pack under the name unanswered. */
void ckpt_writer_commit_flag(ckpt_writer *w, int *sent);

/* ------------------------------------------------ sealing under a nonce */

/* The chunks' AEADs under a caller's key and nonce, for ckptfs's staging
 * area: OpenSSL's EVP where built with libcrypto (3-4x libsodium's speed
 * here), else libsodium, the same bytes either way. AES-256-GCM uses the
 * nonce's first 12 bytes, XChaCha20-Poly1305 all 24. Any number of threads
 * may seal and open under one ckpt_aead at once. */
typedef struct ckpt_aead ckpt_aead;

/* key: 32 bytes, copied into locked memory. NULL when out of memory. */
ckpt_aead *ckpt_aead_new(ckpt_cipher cipher, const uint8_t key[32]);
void ckpt_aead_free(ckpt_aead *a);
/* out gets len bytes of ciphertext, then the 16-byte tag. 0, or -ENOMEM/-EIO
 * where OpenSSL fails and libsodium cannot stand in. */
int ckpt_aead_seal(const ckpt_aead *a, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                   const uint8_t *in, size_t len, uint8_t *out);
/* in: len bytes of ciphertext, its tag apart; out may be in. 0, or
 * -EBADMSG (not authentic: out is zeroed) or -ENOMEM/-EIO as above. */
int ckpt_aead_open(const ckpt_aead *a, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                   const uint8_t *in, size_t len, const uint8_t tag[16], uint8_t *out);

/* What ckpt_verify's workers did with the tensors' SHA-256 chains (for
 * tests): parts parked for the worker that hashed the tensor's previous
 * chunk, and parts whose worker slept until that chunk was hashed. */
typedef struct ckpt_verify_stats {
    unsigned long parked, waited;
} ckpt_verify_stats;
/* ckpt_verify, counting into *stats (NULL: not). */
long ckpt_verify_counted(ckpt_pack *p, unsigned threads, ckpt_fault_fn fault, void *fault_ud,
                         ckpt_progress_fn progress, void *progress_ud, ckpt_verify_stats *stats,
                         ckpt_err *err);

#ifdef __cplusplus
}
#endif
#endif
