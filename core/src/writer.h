/* Writer internals shared with the code that feeds it from disk. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "common.h"
#include <sys/types.h>

/* The pack being written, so a tree walk can skip its own output. */
void writer_output_id(const ckpt_writer *w, dev_t *dev, ino_t *ino);

#endif
