/*
 * libckpt: read and write packed checkpoints (.tpack).
 *
 * A pack holds files (byte-identical) and tensors (named views of byte ranges
 * inside those files). Every byte is stored in chunks that are compressed,
 * optionally encrypted, and indexed, so any byte range can be read by decoding
 * only the chunks that cover it. core/FORMAT.md describes the bytes on disk.
 *
 * Conventions
 *  - Functions that can fail return 0 (or a non-negative count) on success and
 *    a negative errno value on failure, and fill *err (which may be NULL) with
 *    the same code and a one-line message that names the file and the fault.
 *  - Error codes: -EIO corrupt or unreadable data (bad checksum, failed
 *    authentication, truncated pack); -EACCES missing or wrong key;
 *    -EINVAL bad argument or malformed input; -ENOENT no such file/tensor;
 *    -ENOMEM; -ENOTSUP unknown version or unsupported feature; other errno
 *    values pass through from the operating system.
 *  - Reads on one open pack are thread-safe. Writers are used from one thread
 *    (they run their own worker threads internally).
 *  - Strings returned by the library live as long as the object they came from.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_VERSION_STRING "0.1.0"
/* The version this build writes; it reads this one and every earlier one. */
#define CKPT_FORMAT_VERSION 5

#define CKPT_CHUNK_MIN (64u * 1024u)
#define CKPT_CHUNK_MAX (16u * 1024u * 1024u)
#define CKPT_CHUNK_DEFAULT (1024u * 1024u)
#define CKPT_KEY_BYTES 32

typedef struct ckpt_err {
    int code;      /* negative errno, 0 when no error */
    char msg[512]; /* "<file>: <fault>" */
    /* The store gave no lasting answer (none, HTTP 5xx or 429, after its
     * retries): the same call may succeed later, so the fault must not be
     * taken as the pack's. Cleared by every ckpt_fail. */
    int transient;
} ckpt_err;

/* Progress: done and total are byte counts of logical (plaintext) data. */
typedef void (*ckpt_progress_fn)(void *ud, uint64_t done, uint64_t total);

/* ------------------------------------------------------------------ keys */

/* A key lives in locked, non-dumpable memory and is wiped when freed. */
typedef struct ckpt_key ckpt_key;

/* Key file: exactly 32 raw bytes, or 64 hex digits with an optional newline.
 * Refused if the file is readable by group or others. */
int ckpt_key_load_file(const char *path, ckpt_key **out, ckpt_err *err);
/* Passphrase file: its contents, less one trailing newline. The pack key is
 * derived with Argon2id using the salt and limits stored in each pack. */
int ckpt_key_load_passphrase_file(const char *path, ckpt_key **out, ckpt_err *err);
/* Raw 32-byte key from memory (copied). */
int ckpt_key_from_bytes(const uint8_t key[CKPT_KEY_BYTES], ckpt_key **out, ckpt_err *err);
int ckpt_key_is_passphrase(const ckpt_key *key);
void ckpt_key_free(ckpt_key *key);
/* Derives a 32-byte secret for another purpose from the same key (ckptfs
 * seals its staging area with one): keyed BLAKE2b-256, the key being the
 * master key, over context (a NUL-terminated label) and salt. For a
 * passphrase the master key is first derived from salt with Argon2id at
 * libsodium's interactive limits, which takes a fraction of a second.
 * Different contexts or salts give unrelated secrets. */
int ckpt_key_derive(const ckpt_key *key, const char *context, const uint8_t salt[16],
                    uint8_t out[CKPT_KEY_BYTES], ckpt_err *err);
/* Writes 32 random bytes to path with mode 0600; refuses to overwrite. */
int ckpt_keygen(const char *path, ckpt_err *err);

/* ---------------------------------------------------------------- stores */

/* Where packs live. A store holds named objects (a pack is one object): a
 * local directory today, an object store such as S3 later. Objects are
 * read by ranges and written whole: a new object becomes visible only when
 * it is complete, never half-written. Names are relative, '/'-separated,
 * and safe by ckpt_path_is_safe(). The path-based functions below
 * (ckpt_open, ckpt_writer_open, ...) are the local case of the _in ones.
 * A store may be used from several threads at once. */
typedef struct ckpt_store ckpt_store;

/* What tells one version of an object from another: a caller that saw an
 * object can tell whether it was replaced since. Local files fill dev, ino
 * and the mtime; object stores fill etag (and leave dev and ino 0). */
typedef struct ckpt_object_id {
    uint64_t dev, ino;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint64_t size;
    char etag[80];
} ckpt_object_id;

/* Whether two identities name the same version of an object. */
int ckpt_object_id_equal(const ckpt_object_id *a, const ckpt_object_id *b);

typedef struct ckpt_object_info {
    const char *name;  /* relative to the store */
    ckpt_object_id id; /* size and mtime are in here */
    /* Only from ckpt_store_list_dirs: a directory (a local subdirectory,
     * an S3 common prefix), named without a trailing '/'; id is zero. */
    int is_dir;
} ckpt_object_info;

/* The directory dir as a store (opened once: renaming dir later does not
 * move the store). Objects are its regular files; symbolic links are
 * refused (-ELOOP), never followed. */
int ckpt_store_open_local(const char *dir, ckpt_store **out, ckpt_err *err);
void ckpt_store_free(ckpt_store *s);

/* Options of an object store; every field may be 0/NULL. */
typedef struct ckpt_store_opts {
    /* "http[s]://host[:port]", for stores other than AWS. NULL: the
     * environment's AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then the
     * profile's endpoint_url, then https://s3.REGION.amazonaws.com. */
    const char *endpoint;
    /* NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, us-east-1. */
    const char *region;
    /* A profile of ~/.aws/credentials and ~/.aws/config. NULL: the keys in
     * AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, else the
     * profile AWS_PROFILE (or "default"). Credentials are never options. */
    const char *profile;
    unsigned part_size_mib;   /* multipart upload part size, 8..64; 0 = 8 */
    unsigned parts_in_flight; /* parts uploaded at once, 1..16; 0 = 8 */
    unsigned retry_seconds;   /* no retry of a request starts later; 0 = 30 */
    /* A local directory caching the bytes read from an object store AS
     * STORED (still compressed and encrypted): one file per range read,
     * named by a hash of the object's name and ETag and by the range, so
     * a replaced object is never served from it and nothing in it is
     * plaintext an encrypted pack did not already put on the wire. Kept
     * under cache_bytes by evicting the least recently used files. NULL:
     * no cache. The directory may be shared by several processes. */
    const char *cache_dir;
    uint64_t cache_bytes; /* 0 = 10 GiB */
    /* Called once, from a reading thread, the first time the cache fails
     * to keep a range (a full or read-only file system, an entry's name
     * taken by a directory): reads go on from the store, so without it
     * such a cache is seen only as hits that never come. NULL: no call. */
    void (*cache_warn)(void *ud, const char *msg);
    void *cache_warn_ud;
} ckpt_store_opts;

/* A store named by a URL: "s3://BUCKET/PREFIX" is an S3 bucket (any S3 API:
 * AWS, Ceph RGW, MinIO, ...; path-style requests, endpoint/BUCKET/KEY),
 * anything else a local directory (as ckpt_store_open_local; opts unused).
 * Opening an S3 store checks the credentials and the bucket with one
 * listing, so bad keys fail here (-EACCES) and a missing bucket too
 * (-ENOENT), with messages that name the cause but never a secret.
 *
 * How an S3 store differs from a directory: a new object is uploaded while
 * it is written (a multipart upload, completed by commit); rename is a copy
 * and a delete, not atomic; the writer's lock is a lease in an object
 * (conditional PUT), not flock; ckpt_fd() is -1. Requests are retried with
 * backoff on 5xx, 429 and connection errors (7 tries within
 * retry_seconds, 30 s by default), then
 * fail with -EIO naming the object and the HTTP status. A pack replaced
 * under an open reader fails its reads with -ESTALE, never mixing
 * versions. */
int ckpt_store_open(const char *url, const ckpt_store_opts *opts, ckpt_store **out, ckpt_err *err);
/* Aborts the unfinished uploads (left by a crashed or interrupted writer)
 * of the object name (NULL: of every object under the store's prefix) that
 * began more than older_than_s seconds ago (0: all, which is only safe when
 * no writer of them is running). Returns how many were aborted, or -errno.
 * A local store leaves none behind: it returns 0. */
long ckpt_store_abort_stale_uploads(ckpt_store *s, const char *name, uint64_t older_than_s,
                                    ckpt_err *err);
/* The store for messages: the directory, or a URL. */
const char *ckpt_store_where(const ckpt_store *s);
/* 0 unless the store is known not to answer now: an S3 gateway that gave
 * a request no answer after its retries, during which every request
 * fails at once with -EIO (ckpt_err's transient) instead of retrying
 * again. Then -EIO with err saying since when and why. Makes no request,
 * except a short probe of such a gateway once its back-off (2 s) is over,
 * so a caller that polls sees it back. A local store always answers. */
int ckpt_store_reachable(ckpt_store *s, ckpt_err *err);

/* Calls fn once per object whose name starts with prefix ("" for all), in
 * byte order of names, with info valid during the call only. Listing is
 * one level: a prefix "a/b" lists the objects directly inside "a" whose
 * names start with "b". A non-zero return from fn stops the listing and is
 * returned. */
typedef int (*ckpt_object_fn)(void *ud, const ckpt_object_info *info);
int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_object_fn fn, void *ud, ckpt_err *err);
/* ckpt_store_list, and also fn once per directory directly inside the
 * listed one whose name starts with prefix (info->is_dir set): what a
 * browser of the store needs to descend. Objects and directories come in
 * byte order of names, each kind on its own. */
int ckpt_store_list_dirs(ckpt_store *s, const char *prefix, ckpt_object_fn fn, void *ud,
                         ckpt_err *err);

/* Reads of a store's local cache (ckpt_store_opts.cache_dir) since it was
 * opened; all 0 without one. */
typedef struct ckpt_store_cache_stats {
    uint64_t hits, misses; /* ranges read from the cache, from the store */
    uint64_t hit_bytes, miss_bytes;
    uint64_t stored_bytes; /* what the cache directory holds, as counted */
} ckpt_store_cache_stats;
void ckpt_store_cache_stats_get(ckpt_store *s, ckpt_store_cache_stats *out);

/* --------------------------------------------------------------- reading */

typedef struct ckpt_pack ckpt_pack;

typedef struct ckpt_pack_info {
    uint32_t format_version;
    uint32_t chunk_size;
    const char *cipher; /* "none", "xchacha20poly1305", "aes256gcm" */
    const char *kdf;    /* "none", "keyfile", "argon2id" */
    uint8_t pack_id[16];
    uint64_t stored_bytes;  /* size of the .tpack file */
    uint64_t logical_bytes; /* sum of file sizes */
    size_t n_files, n_tensors, n_chunks;
} ckpt_pack_info;

typedef struct ckpt_file_info {
    const char *path; /* relative, '/'-separated, validated */
    uint32_t mode;    /* permission bits only (07777) */
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint64_t size;
    uint8_t sha256[32];
    /* The tensor container the file was read as: "safetensors", "npy",
     * "torch", "dcp", "tensorizer", "gguf", or "" for opaque bytes (and for
     * every file of a version-1 pack). */
    const char *container;
    /* "" or a one-line warning: why a file that claimed a container was
     * stored as opaque bytes ("<path>: stored opaque: <fault>"). */
    const char *note;
} ckpt_file_info;

typedef struct ckpt_tensor_info {
    const char *name;
    const char *dtype; /* safetensors dtype name: "BF16", "F32", ... */
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    size_t file_index;    /* the file whose bytes hold the tensor */
    uint64_t file_offset; /* where the tensor starts inside that file (for a
                                 view: its region's start + its offset in it) */
    uint8_t sha256[32];
    /* Assembled tensors (format version 5): a tensor a PyTorch DCP checkpoint
     * saved in chunks along dim 0 (one per rank) is also listed whole, as
     * the concatenation of its chunks. Such a tensor has no bytes of its own:
     * n_parts > 0 and parts[] are the stored tensors it is made of, in dim-0
     * order; file_index and file_offset are its first part's, so read it
     * with ckpt_tensor_pread() or ckpt_tensor_locate(), never as one file
     * range. sha256 is that of the assembled bytes. Stored tensors have
     * n_parts 0 and parts NULL. Assembled tensors come after all stored
     * ones: indices ckpt_tensor_count() - ckpt_assembled_count() onward. */
    size_t n_parts;
    const size_t *parts;
    /* For a stored tensor that is a part of an assembled one, that tensor's
     * index; else SIZE_MAX. (The mount shows only the assembled tensor.) */
    size_t part_of;
} ckpt_tensor_info;

/* Opens and validates a pack: header, footer and the whole index. key may be
 * NULL for an unencrypted pack; an encrypted pack then fails with -EACCES and
 * "no key", and a wrong key with -EACCES and "wrong key". */
int ckpt_open(const char *path, const ckpt_key *key, ckpt_pack **out, ckpt_err *err);
/* ckpt_open for the object name in store s (messages name it "<where>/<name>"). */
int ckpt_pack_open_in(ckpt_store *s, const char *name, const ckpt_key *key, ckpt_pack **out,
                      ckpt_err *err);
void ckpt_close(ckpt_pack *p);
/* The identity of the pack object as it was opened: compare it with a later
 * listing to find out whether the pack was replaced since. */
void ckpt_pack_object_id(const ckpt_pack *p, ckpt_object_id *out);

/* Reads only the header: whether the pack is encrypted and how. Cheap; does
 * not need a key. Returns -EIO/-EINVAL/-ENOTSUP for bad headers. */
int ckpt_probe(const char *path, ckpt_pack_info *info, ckpt_err *err);
/* ckpt_probe for the object name in store s. */
int ckpt_probe_in(ckpt_store *s, const char *name, ckpt_pack_info *info, ckpt_err *err);

void ckpt_info(const ckpt_pack *p, ckpt_pack_info *info);
const char *ckpt_path(const ckpt_pack *p);

size_t ckpt_file_count(const ckpt_pack *p);
const ckpt_file_info *ckpt_file_at(const ckpt_pack *p, size_t i);
/* Index of the file with this path, or -1. */
long ckpt_file_find(const ckpt_pack *p, const char *path);

/* Every tensor: the stored ones, then the assembled ones (see n_parts). */
size_t ckpt_tensor_count(const ckpt_pack *p);
const ckpt_tensor_info *ckpt_tensor_at(const ckpt_pack *p, size_t i);
long ckpt_tensor_find(const ckpt_pack *p, const char *name);
/* How many of the tensors are assembled (the last ones). */
size_t ckpt_assembled_count(const ckpt_pack *p);
/* Where byte off (< nbytes) of tensor i lies: in file *file_index at
 * *file_offset, with *run bytes of the tensor contiguous there (to the end
 * of the tensor, or of the part holding off for an assembled tensor). */
int ckpt_tensor_locate(const ckpt_pack *p, size_t i, uint64_t off, size_t *file_index,
                       uint64_t *file_offset, uint64_t *run, ckpt_err *err);

/* A tensor a container parser found but does not show under tensors/ (a
 * non-contiguous view, a quantized GGUF block type, a DCP chunk whose item
 * it cannot read, ...): its bytes are in its file as always; reason says
 * why it has no file of its own. Packs before format version 4 have none. */
typedef struct ckpt_skipped_info {
    const char *name;
    const char *reason; /* one line, UTF-8 */
    size_t file_index;  /* the file it was found in */
} ckpt_skipped_info;

size_t ckpt_skipped_count(const ckpt_pack *p);
const ckpt_skipped_info *ckpt_skipped_at(const ckpt_pack *p, size_t i);

/* pread() on a file or a tensor: decodes only the chunks covering the range.
 * Returns the number of bytes read (short only at end of file), or -errno.
 * A corrupt chunk fails the call with -EIO; other ranges stay readable. */
ssize_t ckpt_file_pread(ckpt_pack *p, size_t file_index, void *buf, size_t len, uint64_t off,
                        ckpt_err *err);
ssize_t ckpt_tensor_pread(ckpt_pack *p, size_t tensor_index, void *buf, size_t len, uint64_t off,
                          ckpt_err *err);

/* ---- chunk-level access, for callers that cache or decode in parallel ---- */

typedef struct ckpt_chunk_ref {
    size_t id;            /* global chunk number */
    uint64_t file_offset; /* where the chunk's bytes start in its file */
    uint32_t size;        /* decoded size */
} ckpt_chunk_ref;

/* The chunk of file_index that holds byte off (off < file size). */
int ckpt_chunk_locate(const ckpt_pack *p, size_t file_index, uint64_t off, ckpt_chunk_ref *out,
                      ckpt_err *err);
/* Decodes chunk id into out, which holds at least its decoded size.
 * Thread-safe; independent chunks can be decoded in parallel. */
int ckpt_chunk_decode(ckpt_pack *p, size_t id, void *out, ckpt_err *err);
/* The stored bytes of chunks first, first + 1, ... (up to n of them, while
 * each lies right after the one before in the pack, as written) read at
 * once: an object store fetches them with one request where decoding them
 * one by one makes one each. *stored (free() it) holds them; decode each
 * with ckpt_chunk_decode_stored. The number of chunks read, or -errno:
 * -EAGAIN when the store would rather have them read one by one (it has
 * them nearby, in its cache). */
ssize_t ckpt_chunks_fetch(ckpt_pack *p, size_t first, size_t n, void **stored, ckpt_err *err);
/* ckpt_chunk_decode of chunk id of a run that ckpt_chunks_fetch(p, first,
 * ...) read into stored. Thread-safe, as ckpt_chunk_decode. */
int ckpt_chunk_decode_stored(ckpt_pack *p, size_t first, const void *stored, size_t id, void *out,
                             ckpt_err *err);
/* If chunk id is stored raw and unencrypted, its bytes can be read straight
 * from the pack file at *pack_offset (for zero-copy); returns 1, else 0. */
int ckpt_chunk_plain_at(const ckpt_pack *p, size_t id, uint64_t *pack_offset);
/* The pack's file descriptor (read-only), or -1 for a pack in a store that
 * has none (an object store): then read chunks with ckpt_chunk_decode(). */
int ckpt_fd(const ckpt_pack *p);

/* In-order streaming of a byte range of a file, with chunks decoded ahead on
 * `threads` worker threads (0 = all cores). The sink is called in order with
 * each piece; for a corrupt chunk it gets data == NULL and chunk_err set, and
 * streaming continues. A non-zero return from the sink stops the stream and is
 * returned. */
typedef int (*ckpt_sink_fn)(void *ud, uint64_t file_offset, const void *data, size_t len,
                            const ckpt_err *chunk_err);
int ckpt_file_stream(ckpt_pack *p, size_t file_index, uint64_t off, uint64_t len, unsigned threads,
                     ckpt_sink_fn sink, void *ud, ckpt_err *err);

/* Decodes every chunk of files [first_file, end_file) on `threads` worker
 * threads (0 = all cores) and hands each to the sink on the thread that
 * decoded it: in no particular order and concurrently, so the sink must be
 * thread-safe (a pwrite at file_offset is). A corrupt chunk gets data ==
 * NULL and chunk_err set. A non-zero return from the sink stops the workers
 * (chunks they already hold still finish) and the first such value is
 * returned. Memory: one chunk buffer per thread.
 *
 * dest (may be NULL), called on the worker before each chunk is decoded,
 * may name where its len bytes go (a mapping of the output file, say): the
 * chunk is decoded straight there and the sink gets that pointer as data.
 * NULL from it means the worker's own buffer. Whatever a corrupt chunk
 * left there is undefined. */
typedef void *(*ckpt_file_dest_fn)(void *ud, size_t file_index, uint64_t file_offset, size_t len);
typedef int (*ckpt_file_sink_fn)(void *ud, size_t file_index, uint64_t file_offset,
                                 const void *data, size_t len, const ckpt_err *chunk_err);
int ckpt_files_decode(ckpt_pack *p, size_t first_file, size_t end_file, unsigned threads,
                      ckpt_file_dest_fn dest, ckpt_file_sink_fn sink, void *ud, ckpt_err *err);

/* Decodes everything, checks every chunk and every file and tensor SHA-256.
 * fault() is called once per problem (kind is "chunk", "file" or "tensor").
 * Returns the number of faults found (0 = pack is good), or -errno if the
 * verification itself could not run. */
typedef void (*ckpt_fault_fn)(void *ud, const char *kind, const char *name, uint64_t offset,
                              const char *fault);
long ckpt_verify(ckpt_pack *p, unsigned threads, ckpt_fault_fn fault, void *fault_ud,
                 ckpt_progress_fn progress, void *progress_ud, ckpt_err *err);

/* --------------------------------------------------------------- writing */

typedef enum ckpt_cipher {
    CKPT_CIPHER_NONE = 0,
    CKPT_CIPHER_XCHACHA20POLY1305 = 1,
    CKPT_CIPHER_AES256GCM = 2,
} ckpt_cipher;

typedef struct ckpt_write_opts {
    uint32_t chunk_size;       /* power of two in [CKPT_CHUNK_MIN, CKPT_CHUNK_MAX]; 0 = default */
    int level;                 /* zlib level 1..9; 0 = store everything raw; -1 = default (6) */
    ckpt_cipher cipher;        /* key set + NONE means ckpt_cipher_default() */
    const ckpt_key *key;       /* NULL = unencrypted */
    unsigned threads;          /* compression/encryption workers; 0 = all cores */
    ckpt_progress_fn progress; /* called from the writer's thread */
    void *progress_ud;
    uint64_t progress_total; /* total bytes expected, for progress; may be 0 */
    /* Called (from the writer's thread) once for a file that
     * ckpt_writer_add_path/_reader finds bad: src names the source, reason
     * says what was done and the fault, "stored opaque: <fault>" when its
     * container parser rejected it (the pack records that as the file's
     * note), or "stored as it is, but damaged: tensor '<name>': <fault>"
     * when its parser read it but its own loader would refuse it (a
     * torch.save storage record missing or cut short; the tensors left out
     * are in the manifest's skipped list). NULL: no call. */
    void (*warn)(void *ud, const char *src, const char *reason);
    void *warn_ud;
} ckpt_write_opts;

/* Parses the names used on the command line ("xchacha20poly1305", ...). */
int ckpt_cipher_parse(const char *name, ckpt_cipher *out);
const char *ckpt_cipher_name(ckpt_cipher c);
int ckpt_cipher_available(ckpt_cipher c);
/* What a pack gets when no cipher is named: AES-256-GCM where the CPU has
 * hardware AES (AES-NI and PCLMULQDQ, or ARMv8 AES), else XChaCha20-Poly1305. */
ckpt_cipher ckpt_cipher_default(void);

typedef struct ckpt_writer ckpt_writer;

/* The pack is written to tmp_path (NULL = "<final_path>.tmp", its base
 * shortened with a hash where that would pass NAME_MAX) in one
 * sequential pass; ckpt_writer_finish() writes the index, fsyncs, renames it
 * to final_path and fsyncs the directory. Until then final_path is untouched. */
int ckpt_writer_open(const char *final_path, const char *tmp_path, const ckpt_write_opts *opts,
                     ckpt_writer **out, ckpt_err *err);
/* ckpt_writer_open for the object name in store s. tmp_name (NULL =
 * "<name>.tmp", shortened as above) is where a local store writes until ckpt_writer_finish();
 * a store without renames ignores it. Either way the pack appears whole at
 * finish or not at all. */
int ckpt_writer_open_in(ckpt_store *s, const char *name, const char *tmp_name,
                        const ckpt_write_opts *opts, ckpt_writer **out, ckpt_err *err);

/* Streaming: begin a file, append its bytes as opaque data and/or tensors in
 * order, end it. Tensor data must be exactly numel * dtype size bytes and
 * may arrive in several ckpt_writer_tensor_data() calls. */
int ckpt_writer_begin_file(ckpt_writer *w, const char *path, uint32_t mode, int64_t mtime_sec,
                           uint32_t mtime_nsec, ckpt_err *err);
int ckpt_writer_write(ckpt_writer *w, const void *data, size_t len, ckpt_err *err);
int ckpt_writer_begin_tensor(ckpt_writer *w, const char *name, const char *dtype, uint32_t ndim,
                             const uint64_t *shape, ckpt_err *err);
int ckpt_writer_tensor_data(ckpt_writer *w, const void *data, size_t len, ckpt_err *err);
int ckpt_writer_end_tensor(ckpt_writer *w, ckpt_err *err);
int ckpt_writer_end_file(ckpt_writer *w, ckpt_err *err);

/* Regions and views (format version 2): a region is a run of the file's
 * bytes of one element type (a torch storage record, a GGUF tensor block),
 * stored as one typed extent and compressed grouped by the dtype's size,
 * that has no tensor of its own. Its bytes follow begin_region through
 * ckpt_writer_tensor_data() (any number of bytes, in as many calls as
 * needed) up to end_region. begin_tensor/end_tensor are the special case
 * of a region with one tensor that covers it exactly. */
int ckpt_writer_begin_region(ckpt_writer *w, const char *dtype, ckpt_err *err);
int ckpt_writer_end_region(ckpt_writer *w, ckpt_err *err);
/* Adds a tensor that is a view of bytes of the current file: file_offset is
 * where it starts in the file, and its numel * dtype size bytes must lie
 * inside the region (or begin_tensor extent) open now, whose dtype must have
 * the same element size. Views may overlap one another (tied weights) and
 * start anywhere inside the region. A view must be added before the writer
 * is given its first byte: its SHA-256 is computed as the bytes stream by,
 * so a view over bytes already written fails with -EINVAL. A view that
 * would run past the end of its region fails end_region (or end_tensor)
 * with -EINVAL and "spans two extents". Names are unique in the pack. */
int ckpt_writer_add_view(ckpt_writer *w, const char *name, const char *dtype, uint32_t ndim,
                         const uint64_t *shape, uint64_t file_offset, ckpt_err *err);
/* Records the current file's container ("safetensors", "npy", "torch",
 * "dcp", "tensorizer", "gguf"; NULL or "" for opaque bytes) and a note
 * (NULL or "": none; else at most 1024 bytes of UTF-8: the warning shown
 * when a file that claimed a container was stored opaque). */
int ckpt_writer_set_container(ckpt_writer *w, const char *container, const char *note,
                              ckpt_err *err);

/* Adds one file from disk. A file that a container parser claims
 * ("*.safetensors", "*.npy", ...) has its tensors indexed and its data
 * compressed by dtype; one the parser rejects is stored opaque with a note
 * (and opts.warn called) naming the file and the fault, never failing the
 * pack. Everything else is stored as an opaque file. */
int ckpt_writer_add_path(ckpt_writer *w, const char *pack_path, const char *src_path,
                         ckpt_err *err);
/* A source of bytes for ckpt_writer_add_reader: reads up to len bytes at off
 * into buf and returns how many it read (0 only at the end), or a negative
 * errno, which fails the add with that code. */
typedef ssize_t (*ckpt_read_fn)(void *ud, void *buf, size_t len, uint64_t off);

/* Adds one file of size bytes whose contents come from read(ud, ...) rather
 * than from a path: for sources that are not plain files (ckptfs packs
 * decrypted staging data this way). Detection, validation and indexing are
 * those of ckpt_writer_add_path, keyed on pack_path's extension. src_name
 * names the source in error messages (NULL: pack_path). The source must not
 * change while it is added. read is called from the writer's worker threads
 * too, several calls at once (each reads its own chunk), until the add
 * returns. */
int ckpt_writer_add_reader(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                           uint64_t size, uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                           const char *src_name, ckpt_err *err);
/* Reads the whole of the file at pack_path (a path inside the pack being
 * written, such as "ckpt/.metadata") into *out (malloc'd; the library frees
 * it) and its length into *len: 0; -ENOENT when there is no such file;
 * -EFBIG when it has more than max bytes; or another negative errno.
 * Container formats whose files are described by a sibling file (PyTorch
 * DCP's *.distcp by the directory's .metadata) use it for files added with
 * ckpt_writer_add_reader, which otherwise have no directory to look in.
 * Files added by path read their siblings from disk, beside the file. */
typedef int (*ckpt_sibling_fn)(void *ud, const char *pack_path, uint8_t **out, size_t *len,
                               size_t max);
/* Sets (or, with fn NULL, clears) the sibling reader for later
 * ckpt_writer_add_reader calls. Without one such files are still packed;
 * they are only understood less well. */
void ckpt_writer_set_sibling_reader(ckpt_writer *w, ckpt_sibling_fn fn, void *ud);
/* Adds a directory tree recursively (regular files only; symlinks and special
 * files are refused with an error), paths relative to src_dir, sorted. */
int ckpt_writer_add_tree(ckpt_writer *w, const char *src_dir, ckpt_err *err);

typedef struct ckpt_write_stats {
    uint64_t logical_bytes; /* bytes in */
    uint64_t stored_bytes;  /* size of the finished pack */
    size_t n_files, n_tensors, n_chunks;
} ckpt_write_stats;

int ckpt_writer_finish(ckpt_writer *w, ckpt_write_stats *stats, ckpt_err *err);
/* Abandons the pack: frees everything and removes the temporary file. */
void ckpt_writer_abort(ckpt_writer *w);
/* Stops a pack from outside the call adding to it: from the progress
 * callback, or from another thread (not from a signal handler: it takes a
 * lock). The writer then fails as it would on a write error: the call
 * adding to it returns -ECANCELED at its next chunk, as does any later
 * call that adds bytes, ends a file or finishes. ckpt_writer_abort() then
 * drops what this writer wrote: its temporary file, or its own upload,
 * never another writer's upload of the same name. */
void ckpt_writer_cancel(ckpt_writer *w);

/* Total size in bytes of the regular files under path (a file or a tree);
 * for progress bars. */
int ckpt_tree_size(const char *path, uint64_t *out, ckpt_err *err);

/* ----------------------------------------------------------------- utils */

/* Bytes per element of a safetensors dtype name, or 0 if unknown. */
unsigned ckpt_dtype_size(const char *dtype);
/* The numpy dtype string ("<f4", "<i8", "|b1", ...) of a safetensors dtype
 * name, or NULL if unknown. numpy has no bfloat16 or float8: BF16 gives
 * "<u2" and F8_* give "|u1", the raw bits, and ckpt_dtype_numpy_exact()
 * says 0 for them (view the array as torch_dtype to get the values). */
const char *ckpt_dtype_numpy(const char *dtype);
int ckpt_dtype_numpy_exact(const char *dtype);
/* The torch dtype name ("torch.float32", "torch.bfloat16", ...), or NULL. */
const char *ckpt_dtype_torch(const char *dtype);
/* Is this a safe relative path (no "..", ".", empty components, NUL,
 * leading '/', over-long names)? */
int ckpt_path_is_safe(const char *path);
/* Lower-case hex of a 32-byte digest into out[65]. */
void ckpt_hex32(const uint8_t digest[32], char out[65]);

#ifdef __cplusplus
}
#endif
#endif
