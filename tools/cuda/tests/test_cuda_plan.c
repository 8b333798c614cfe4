/* The host-side planner: name selection, offsets and alignment, windows and
 * their pieces, ring geometry. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "plan.h"
#include "testutil.h"

Test(plan, pattern_exact_glob_prefix)
{
    cr_assert(cc_pattern_match("h.0.attn.bias", "h.0.attn.bias"));
    cr_assert_not(cc_pattern_match("h.0", "h.0.attn.bias"), "no glob characters: exact only");
    cr_assert(cc_pattern_match("h.0.*", "h.0.attn.bias"));
    cr_assert_not(cc_pattern_match("h.0.*", "h.10.attn.bias"));
    cr_assert(cc_pattern_match("*", "a/b.c"), "'*' crosses '/' and '.'");
    cr_assert(cc_pattern_match("h.?.ln_1.*", "h.3.ln_1.weight"));
    cr_assert(cc_pattern_match("h.[01].mlp*", "h.1.mlp.c_fc.weight"));
    cr_assert_not(cc_pattern_match("h.[01].mlp*", "h.2.mlp.c_fc.weight"));
    cr_assert(cc_pattern_match("*.bias", "h.0.attn.c_attn.bias"));
}

static const char *const names[] = {"wte", "h.0.w", "h.0.b", "h.1.w", "h.1.b", "ln_f"};
#define N_NAMES (sizeof names / sizeof names[0])

Test(plan, select_all_without_patterns)
{
    size_t *idx, n;
    ckpt_err err = {0};
    cr_assert_eq(cc_select(names, N_NAMES, NULL, 0, &idx, &n, &err), 0);
    cr_assert_eq(n, N_NAMES);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(idx[i], i);
    free(idx);
}

Test(plan, select_keeps_source_order_and_dedups)
{
    const char *pats[] = {"ln_f", "h.1.*", "*.w"};
    size_t *idx, n;
    ckpt_err err = {0};
    cr_assert_eq(cc_select(names, N_NAMES, pats, 3, &idx, &n, &err), 0, "%s", err.msg);
    size_t want[] = {1, 3, 4, 5}; /* h.0.w, h.1.w, h.1.b, ln_f; h.1.w once */
    cr_assert_eq(n, 4);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(idx[i], want[i], "idx[%zu] = %zu", i, idx[i]);
    free(idx);
}

Test(plan, select_names_the_pattern_that_matches_nothing)
{
    const char *pats[] = {"wte", "h.2.*"};
    size_t *idx = (size_t *)1, n = 99;
    ckpt_err err = {0};
    cr_assert_eq(cc_select(names, N_NAMES, pats, 2, &idx, &n, &err), -ENOENT);
    tu_assert_contains(err.msg, "no tensor matches 'h.2.*'");
    cr_assert_null(idx);
    cr_assert_eq(n, 0);
}

Test(plan, select_from_nothing)
{
    size_t *idx, n;
    cr_assert_eq(cc_select(NULL, 0, NULL, 0, &idx, &n, NULL), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(idx);
}

Test(plan, offsets_are_aligned_and_packed)
{
    uint64_t len[] = {1, 1, 300, 0, 5, 256};
    uint64_t off[6], total;
    ckpt_err err = {0};
    cr_assert_eq(cc_plan_offsets(len, 6, 256, off, &total, &err), 0);
    uint64_t want[] = {0, 256, 512, 1024, 1024, 1280};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(off[i], want[i], "off[%d] = %llu", i, (unsigned long long)off[i]);
    cr_assert_eq(total, 1536);

    cr_assert_eq(cc_plan_offsets(len, 6, 1, off, &total, &err), 0);
    cr_assert_eq(off[5], 307, "alignment 1 is contiguous");
    cr_assert_eq(total, 563);
}

Test(plan, offsets_property)
{
    uint64_t len[64], off[64], total;
    uint32_t x = 12345;
    for (uint64_t align = 1; align <= 4096; align *= 4) {
        for (int i = 0; i < 64; i++) {
            x = x * 1103515245u + 12345u;
            len[i] = (x >> 8) % 5000;
        }
        cr_assert_eq(cc_plan_offsets(len, 64, align, off, &total, NULL), 0);
        for (int i = 0; i < 64; i++) {
            cr_assert_eq(off[i] % align, 0);
            if (i > 0) {
                cr_assert_geq(off[i], off[i - 1] + len[i - 1]);
                cr_assert_lt(off[i], off[i - 1] + len[i - 1] + align, "no wasted alignment");
            }
        }
        cr_assert_eq(total, off[63] + len[63]);
    }
}

Test(plan, bad_alignment_and_overflow)
{
    uint64_t len[] = {UINT64_MAX - 10, 100}, off[2], total;
    ckpt_err err = {0};
    cr_assert_eq(cc_plan_offsets(len, 1, 0, off, &total, &err), -EINVAL);
    cr_assert_eq(cc_plan_offsets(len, 1, 3, off, &total, &err), -EINVAL);
    tu_assert_contains(err.msg, "alignment 3");
    cr_assert_eq(cc_plan_offsets(len, 1, CC_MAX_ALIGN * 2, off, &total, &err), -EINVAL);
    cr_assert_eq(cc_plan_offsets(len, 2, 256, off, &total, &err), -EOVERFLOW);
}

Test(plan, window_count)
{
    cr_assert_eq(cc_window_count(0, 10), 0);
    cr_assert_eq(cc_window_count(1, 10), 1);
    cr_assert_eq(cc_window_count(10, 10), 1);
    cr_assert_eq(cc_window_count(11, 10), 2);
}

/* Every byte of every item appears in exactly one piece, in order, and
 * pieces sit inside their windows, for awkward window sizes. */
Test(plan, pieces_cover_every_item_once)
{
    uint64_t len[] = {7, 0, 300, 1, 4096, 0, 0, 9999, 3};
    size_t n = sizeof len / sizeof len[0];
    uint64_t off[9], total;
    cr_assert_eq(cc_plan_offsets(len, n, 64, off, &total, NULL), 0);
    cc_layout l = {.n = n, .off = off, .len = len, .total = total};
    uint64_t sizes[] = {1, 3, 64, 100, 4096, total, total + 5};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t ws = sizes[k], seen[9] = {0};
        size_t last_item = 0;
        int any = 0;
        for (uint64_t w = 0; w < cc_window_count(total, ws); w++) {
            uint64_t a = w * ws, b = a + ws < total ? a + ws : total;
            cc_piece_iter it;
            cc_piece p;
            uint64_t prev_end = 0;
            cc_pieces_begin(&it, &l, a, b);
            while (cc_pieces_next(&it, &p)) {
                cr_assert_gt(p.len, 0);
                cr_assert_leq(p.win_off + p.len, b - a);
                cr_assert_geq(p.win_off, prev_end, "pieces ascend");
                prev_end = p.win_off + p.len;
                cr_assert_eq(p.item_off, seen[p.item], "item %zu continues where it stopped",
                             p.item);
                cr_assert_eq(a + p.win_off, off[p.item] + p.item_off);
                cr_assert(!any || p.item >= last_item);
                seen[p.item] += p.len;
                last_item = p.item;
                any = 1;
            }
        }
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(seen[i], len[i], "window %llu: item %zu", (unsigned long long)ws, i);
    }
}

Test(plan, ring_geometry)
{
    unsigned slots;
    size_t sb;
    ckpt_err err = {0};
    /* Small checkpoint: spread over the slots, not the whole bound. */
    cr_assert_eq(cc_plan_ring(1314112, 256u << 20, 2, 4, 0, &slots, &sb, &err), 0);
    cr_assert_eq(slots, 6);
    cr_assert_eq(sb, 256 * 1024);
    /* Large: the bound is respected, slots are whole quanta. */
    cr_assert_eq(cc_plan_ring(100ull << 30, 256u << 20, 16, 4, 0, &slots, &sb, &err), 0);
    cr_assert_eq(slots, 20);
    cr_assert_eq(sb % CC_SLOT_QUANTUM, 0);
    cr_assert_leq((uint64_t)slots * sb, 256u << 20);
    cr_assert_geq((uint64_t)slots * sb, (256u << 20) - slots * CC_SLOT_QUANTUM);
    /* Many workers: capped. */
    cr_assert_eq(cc_plan_ring(100ull << 30, 256u << 20, 200, 4, 0, &slots, &sb, &err), 0);
    cr_assert_eq(slots, 64);
    /* Tight bound: fewer, minimum-size slots. */
    cr_assert_eq(cc_plan_ring(100ull << 30, 3 * CC_SLOT_QUANTUM, 8, 4, 0, &slots, &sb, &err), 0);
    cr_assert_eq(slots, 3);
    cr_assert_eq(sb, CC_SLOT_QUANTUM);
    cr_assert_eq(cc_plan_ring(1, CC_SLOT_QUANTUM, 1, 1, 0, &slots, &sb, &err), -EINVAL);
    tu_assert_contains(err.msg, "below the minimum");
    /* A slot cap: more, smaller slots are not made; the same count, capped. */
    cr_assert_eq(cc_plan_ring(100ull << 30, 256u << 20, 2, 4, 8u << 20, &slots, &sb, &err), 0);
    cr_assert_eq(slots, 6);
    cr_assert_eq(sb, 8u << 20);
    cr_assert_eq(cc_plan_ring(100ull << 30, 256u << 20, 2, 4, 1000, &slots, &sb, &err), 0);
    cr_assert_eq(sb, CC_SLOT_QUANTUM, "a cap under one quantum still gives whole slots");
    /* Nothing to move still gives a usable ring. */
    cr_assert_eq(cc_plan_ring(0, 256u << 20, 1, 1, 0, &slots, &sb, &err), 0);
    cr_assert_eq(sb, CC_SLOT_QUANTUM);
}
