#include "plan.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int cc_pattern_match(const char *pattern, const char *name)
{
    if (strpbrk(pattern, "*?[") == NULL)
        return strcmp(pattern, name) == 0;
    return fnmatch(pattern, name, 0) == 0;
}

int cc_select(const char *const *names, size_t n_names, const char *const *patterns,
              size_t n_patterns, size_t **idx, size_t *n_idx, ckpt_err *err)
{
    *idx = NULL;
    *n_idx = 0;
    if (n_names == 0)
        return 0;
    size_t *out = malloc(n_names * sizeof *out);
    /* One hit flag per pattern, so the typo in a list of patterns is named. */
    unsigned char *hit = calloc(n_patterns ? n_patterns : 1, 1);
    if (!out || !hit) {
        free(out);
        free(hit);
        return cc_fail(err, -ENOMEM, "out of memory selecting tensors");
    }
    size_t n = 0;
    for (size_t i = 0; i < n_names; i++) {
        int take = n_patterns == 0;
        for (size_t k = 0; k < n_patterns; k++) {
            if (cc_pattern_match(patterns[k], names[i])) {
                hit[k] = 1;
                take = 1;
            }
        }
        if (take)
            out[n++] = i;
    }
    for (size_t k = 0; k < n_patterns; k++) {
        if (!hit[k]) {
            int rc = cc_fail(err, -ENOENT, "no tensor matches '%s'", patterns[k]);
            free(out);
            free(hit);
            return rc;
        }
    }
    free(hit);
    if (n == 0) {
        free(out);
        out = NULL;
    }
    *idx = out;
    *n_idx = n;
    return 0;
}

int cc_plan_offsets(const uint64_t *len, size_t n, uint64_t align, uint64_t *off, uint64_t *total,
                    ckpt_err *err)
{
    if (align == 0 || (align & (align - 1)) != 0 || align > CC_MAX_ALIGN)
        return cc_fail(err, -EINVAL, "alignment %llu is not a power of two up to 1 GiB",
                       (unsigned long long)align);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t at = (pos + align - 1) & ~(align - 1);
        if (at < pos || len[i] > UINT64_MAX - at)
            return cc_fail(err, -EOVERFLOW, "tensors too large to lay out in one block");
        off[i] = at;
        pos = at + len[i];
    }
    *total = pos;
    return 0;
}

uint64_t cc_window_count(uint64_t total, uint64_t size)
{
    return total / size + (total % size != 0);
}

void cc_pieces_begin(cc_piece_iter *it, const cc_layout *l, uint64_t start, uint64_t end)
{
    it->l = l;
    it->start = start;
    it->end = end;
    /* Item ends ascend too (items do not overlap), so binary search for the
     * first item ending after start. */
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->off[mid] + l->len[mid] <= start)
            lo = mid + 1;
        else
            hi = mid;
    }
    it->next = lo;
}

int cc_pieces_next(cc_piece_iter *it, cc_piece *p)
{
    const cc_layout *l = it->l;
    while (it->next < l->n) {
        size_t i = it->next;
        uint64_t a = l->off[i], b = a + l->len[i];
        if (a >= it->end)
            return 0;
        it->next++;
        if (b <= a)
            continue; /* empty items have no bytes to move */
        if (a < it->start)
            a = it->start;
        if (b > it->end)
            b = it->end;
        p->item = i;
        p->item_off = a - l->off[i];
        p->win_off = a - it->start;
        p->len = b - a;
        return 1;
    }
    return 0;
}

int cc_plan_ring(uint64_t total, size_t pinned_bytes, unsigned workers, unsigned streams,
                 size_t max_slot, unsigned *slots, size_t *slot_bytes, ckpt_err *err)
{
    if (pinned_bytes < 2 * CC_SLOT_QUANTUM)
        return cc_fail(err, -EINVAL,
                       "pinned memory bound of %zu bytes is below the minimum 128 KiB",
                       pinned_bytes);
    uint64_t n = (uint64_t)workers + streams;
    if (n < 2)
        n = 2;
    if (n > 64)
        n = 64;
    if (n > pinned_bytes / CC_SLOT_QUANTUM)
        n = pinned_bytes / CC_SLOT_QUANTUM;
    size_t size = pinned_bytes / (size_t)n / CC_SLOT_QUANTUM * CC_SLOT_QUANTUM;
    /* A small checkpoint spreads over all slots instead of pinning the
     * whole bound; the rounding up keeps slots whole quanta. */
    uint64_t need = (total + n - 1) / n;
    need = (need + CC_SLOT_QUANTUM - 1) / CC_SLOT_QUANTUM * CC_SLOT_QUANTUM;
    if (need == 0)
        need = CC_SLOT_QUANTUM;
    if (need < size)
        size = (size_t)need;
    if (max_slot) {
        size_t cap = max_slot < CC_SLOT_QUANTUM ? CC_SLOT_QUANTUM
                                                : max_slot / CC_SLOT_QUANTUM * CC_SLOT_QUANTUM;
        if (size > cap)
            size = cap;
    }
    *slots = (unsigned)n;
    *slot_bytes = size;
    return 0;
}
