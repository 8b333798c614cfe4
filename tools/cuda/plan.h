/* Host-side planning, free of CUDA: which tensors to load, where each one
 * goes in a linear block, and which pieces of which tensors a window of that
 * block covers. The load pipeline moves the block window by window (one
 * pinned buffer each); saving uses the same windows over the file's data. */
#ifndef CC_PLAN_H
#define CC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define CC_MAX_ALIGN ((uint64_t)1 << 30)

/* Does name match pattern? Exact unless the pattern holds '*', '?' or '[';
 * then fnmatch() without flags, so '*' crosses '.' and '/'. */
int cc_pattern_match(const char *pattern, const char *name);

/* Indices (ascending, each once) of the names that match any pattern; all of
 * them when n_patterns == 0. A pattern that matches nothing is -ENOENT naming
 * it. *idx is malloc'd (NULL when *n_idx == 0). */
int cc_select(const char *const *names, size_t n_names, const char *const *patterns,
              size_t n_patterns, size_t **idx, size_t *n_idx, ckpt_err *err);

/* A block of items laid out one after another: item i is bytes
 * [off[i], off[i] + len[i]). Offsets ascend and items do not overlap. */
typedef struct cc_layout {
    size_t n;
    const uint64_t *off;
    const uint64_t *len;
    uint64_t total; /* block size: end of the last item */
} cc_layout;

/* Places items in order, each at the next multiple of align (a power of two
 * up to CC_MAX_ALIGN; 1 = contiguous). Fills off[] and *total. -EINVAL for a
 * bad alignment, -EOVERFLOW if the block would not fit in 64 bits. */
int cc_plan_offsets(const uint64_t *len, size_t n, uint64_t align, uint64_t *off, uint64_t *total,
                    ckpt_err *err);

/* Windows of `size` bytes cut the block [0, total): how many. */
uint64_t cc_window_count(uint64_t total, uint64_t size);

/* One item's share of a window. */
typedef struct cc_piece {
    size_t item;
    uint64_t item_off; /* where the piece starts inside the item */
    uint64_t win_off;  /* where it goes inside the window */
    uint64_t len;
} cc_piece;

/* Walks the non-empty pieces of window [start, end) in block order; the
 * bytes between pieces are padding. */
typedef struct cc_piece_iter {
    const cc_layout *l;
    uint64_t start, end;
    size_t next;
} cc_piece_iter;

void cc_pieces_begin(cc_piece_iter *it, const cc_layout *l, uint64_t start, uint64_t end);
/* 1 with *p filled, or 0 when the window has no more pieces. */
int cc_pieces_next(cc_piece_iter *it, cc_piece *p);

/* Ring geometry for moving `total` bytes with `workers` threads filling or
 * draining slots and `streams` streams: one slot per worker plus one per
 * stream in flight, slot sizes a multiple of 64 KiB and at most max_slot
 * (0 = no limit), at most pinned_bytes in all, and no more pinned memory
 * than the data needs. -EINVAL if pinned_bytes cannot hold two 64 KiB
 * slots. */
#define CC_SLOT_QUANTUM ((size_t)64 * 1024)
int cc_plan_ring(uint64_t total, size_t pinned_bytes, unsigned workers, unsigned streams,
                 size_t max_slot, unsigned *slots, size_t *slot_bytes, ckpt_err *err);

#endif
