/* Writer internals shared with the code that feeds it from disk. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "common.h"
#include <sys/types.h>

/* The pack being written, so a tree walk can skip its own output. */
void writer_output_id(const ckpt_writer *w, dev_t *dev, ino_t *ino);
struct ingest_layout;
/* Adds one file of size bytes read through read(ud, ...) as a container
 * whose parser returned lay (NULL: opaque) or, when fault is non-empty,
 * rejected the file: what ckpt_writer_add_reader does after describing the
 * file, for tests that hand it layouts no parser makes yet. */
int ingest_add_layout(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                      uint64_t size, const char *container, const char *fault,
                      struct ingest_layout *lay, ckpt_err *err);
/* Records a tensor of the open file that gets no tensors/ entry, with why
 * (ckpt_skipped_info). */
int writer_add_skipped(ckpt_writer *w, const char *name, const char *reason, ckpt_err *err);
/* Whether a tensor of that name was already added to the pack. */
int writer_has_tensor(const ckpt_writer *w, const char *name);
/* Passes a warning to the caller's opts.warn, if any. */
void writer_warn(const ckpt_writer *w, const char *src, const char *reason);

/* The sibling reader set by ckpt_writer_set_sibling_reader (NULL: none). */
void writer_sibling_reader(const ckpt_writer *w, ckpt_sibling_fn *fn, void **ud);

#endif
