/* Writer internals shared with the code that feeds it from disk. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "common.h"
#include <sys/types.h>

/* The pack being written, so a tree walk can skip its own output. */
void writer_output_id(const ckpt_writer *w, dev_t *dev, ino_t *ino);
/* Passes a warning to the caller's opts.warn, if any. */
void writer_warn(const ckpt_writer *w, const char *src, const char *reason);

#endif
