/* Writer internals shared with the code that feeds it from disk. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "common.h"
#include <sys/types.h>

/* The pack being written, so a tree walk can skip its own output. */
/* The file being written and the one it will replace (0, 0 where none or
 * not local): a tree packed into itself must skip both. */
void writer_output_id(const ckpt_writer *w, dev_t dev[2], ino_t ino[2]);
struct ingest_layout;
/* Adds one file of size bytes read through read(ud, ...) as a container
 * whose parser returned lay (NULL: opaque) or, when fault is non-empty,
 * rejected the file: what ckpt_writer_add_reader does after describing the
 * file, for tests that hand it layouts no parser makes yet. */
int ingest_add_layout(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                      uint64_t size, const char *container, const char *fault,
                      struct ingest_layout *lay, ckpt_err *err);
/* Right after ckpt_writer_begin_file: the file's size bytes, in the order
 * they will be fed, can be read again with pread(fd) (fd is dup'd), so its
 * SHA-256 may be taken by a hash lane beside the pipeline (hash_lanes.h).
 * Returns 1 if so, 0 if it is hashed from the fed bytes as usual. */
int writer_file_rehash(ckpt_writer *w, int fd, uint64_t size);
/* The same for a source read through read(ud, ...), which must answer from
 * any thread, several at once, until the writer is finished or aborted. */
int writer_file_rehash_reader(ckpt_writer *w, ckpt_read_fn read, void *ud, uint64_t size);
/* Files smaller than this are hashed from the ring, not on a lane: they
 * hash as fast from there, and the lanes' queue then holds few descriptors. */
#define WRITER_LANE_MIN_BYTES (16u << 20)
/* A file of size bytes that will be added later, read with pread(fd) (fd
 * is dup'd): its SHA-256 starts on a hash lane now, so that the chains of
 * the big files a caller will add (lanes_ahead.h) run beside the encoding
 * from the start instead of each from when the writer reaches its file. The
 * job, or NULL (too small, lanes full, no memory): the writer keeps it
 * until writer_file_adopt() hands it to the file. */
struct hash_job *writer_prehash(ckpt_writer *w, int fd, uint64_t size);
/* The same for a source read through read(ud, ...), which must answer from
 * any thread, several at once, until the writer is finished or aborted. */
struct hash_job *writer_prehash_reader(ckpt_writer *w, ckpt_read_fn read, void *ud, uint64_t size);
/* Right after ckpt_writer_begin_file, in place of writer_file_rehash: the
 * open file's bytes are those of job j, queued for size bytes. 1 if the
 * file takes it, 0 if it is hashed from the fed bytes as usual (j is then
 * left to the writer, hashed for nothing). */
int writer_file_adopt(ckpt_writer *w, struct hash_job *j, uint64_t size);
/* Reads exactly n bytes at off into dst, or fails with err set. */
typedef int (*writer_fill_fn)(void *ud, uint8_t *dst, size_t n, uint64_t off, ckpt_err *err);
/* ckpt_writer_write (tensor 0) or ckpt_writer_tensor_data (tensor 1) of
 * the len bytes that fill() reads from src_off on, read straight into the
 * writer's chunk buffers instead of through a buffer of the caller's. The
 * reads are left to the workers that encode the chunks, so fill() is called
 * from several threads at once, until writer_wait_fills() returns; a failed
 * read fails the writer with fill()'s error. */
int writer_feed_from(ckpt_writer *w, int tensor, writer_fill_fn fill, void *ud, uint64_t src_off,
                     uint64_t len, ckpt_err *err);
/* Returns once every read that writer_feed_from left to the workers is
 * done (those of the slot being filled are done here), so that their
 * source may go away: 0 or the writer's failure. */
int writer_wait_fills(ckpt_writer *w, ckpt_err *err);
/* Records a tensor of the open file that gets no tensors/ entry, with why
 * (ckpt_skipped_info). */
int writer_add_skipped(ckpt_writer *w, const char *name, const char *reason, ckpt_err *err);
/* Whether a tensor of that name was already added to the pack. */
int writer_has_tensor(const ckpt_writer *w, const char *name);
/* Passes a warning to the caller's opts.warn, if any. */
void writer_warn(const ckpt_writer *w, const char *src, const char *reason);

/* Says that the tensor just added (begin_tensor or add_view, before its
 * first byte) is the chunk at offsets of the tensor whole, of shape
 * whole_shape, in scope (the DCP directory: chunks of one whole in two
 * directories are two tensors). At finish the chunks of a whole become
 * one assembled tensor named whole when they came in the order of their
 * rows, each the next rows of it and whole in every other dimension, and
 * covered all its rows (and no tensor is named whole). Anything else
 * leaves them as they are; only bad arguments fail (-EINVAL). */
int writer_chunk_of(ckpt_writer *w, const char *scope, const char *whole, uint32_t ndim,
                    const uint64_t *whole_shape, const uint64_t *offsets, ckpt_err *err);

/* The sibling reader set by ckpt_writer_set_sibling_reader (NULL: none). */
void writer_sibling_reader(const ckpt_writer *w, ckpt_sibling_fn *fn, void **ud);

#endif
