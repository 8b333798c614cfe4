/* Writer internals shared with the code that feeds it from disk. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "common.h"
#include <sys/types.h>

/* The pack being written, so a tree walk can skip its own output. */
void writer_output_id(const ckpt_writer *w, dev_t *dev, ino_t *ino);

/* The sibling reader set by ckpt_writer_set_sibling_reader (NULL: none). */
void writer_sibling_reader(const ckpt_writer *w, ckpt_sibling_fn *fn, void **ud);

#endif
