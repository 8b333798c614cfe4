/* The pinned ring's bookkeeping, driven through the fake backend, whose
 * copies run late: a slot handed out again before its copy ran would send
 * the wrong bytes, and these tests would see them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "fake_backend.h"
#include "ring.h"
#include "testutil.h"

typedef struct rig {
    fake_cfg cfg;
    cc_backend *be;
    cc_ring *r;
    uint8_t *dev;
} rig;

static void rig_open(rig *g, unsigned slots, size_t slot_bytes, unsigned streams, size_t dev_len)
{
    ckpt_err err = {0};
    cr_assert_eq(fake_open(&g->cfg, 0, &g->be, &err), 0, "%s", err.msg);
    cr_assert_eq(cc_ring_new(g->be, slots, slot_bytes, streams, &g->r, &err), 0, "%s", err.msg);
    if (dev_len) {
        void *d;
        cr_assert_eq(g->be->ops->dev_alloc(g->be, dev_len, &d, &err), 0);
        g->dev = d;
    }
}

/* Frees everything and checks nothing leaked or was freed under a copy. */
static void rig_close(rig *g)
{
    cc_ring_free(g->r);
    if (g->dev)
        g->be->ops->dev_free(g->be, g->dev);
    fake_cfg *c = &g->cfg;
    g->be->ops->destroy(g->be);
    cr_assert_eq(c->live_host, 0, "pinned memory leaked");
    cr_assert_eq(c->live_dev, 0);
    cr_assert_eq(c->live_streams, 0);
    cr_assert_eq(c->live_events, 0);
    cr_assert_eq(c->freed_under_copy, 0, "memory freed while a copy was queued on it");
    cr_assert_eq(c->bad_pointer, 0);
    cr_assert_eq(c->pending_at_destroy, 0);
}

/* Moves WINDOWS windows through `slots` slots on one thread. */
static cc_ring_counters run_windows(unsigned slots)
{
    rig g = {0};
    enum { SLOT = 4096, WINDOWS = 40 };
    rig_open(&g, slots, SLOT, 2, SLOT * WINDOWS);
    uint8_t *want = malloc(SLOT * WINDOWS);
    tu_fill_pattern(want, SLOT * WINDOWS, 7);
    ckpt_err err = {0};
    for (int w = 0; w < WINDOWS; w++) {
        cc_slot *s;
        cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0, "%s", err.msg);
        cr_assert_eq(s->cap, SLOT);
        memcpy(s->buf, want + w * SLOT, SLOT);
        cr_assert_eq(cc_ring_copy(g.r, s, g.dev + w * SLOT, s->buf, SLOT, CC_H2D, &err), 0);
        cr_assert_eq(cc_ring_commit(g.r, s, CC_RECYCLE, &err), 0);
    }
    cr_assert_eq(cc_ring_drain(g.r, &err), 0);
    cr_assert_eq(memcmp(g.dev, want, SLOT * WINDOWS), 0, "device bytes differ");
    cc_ring_counters k;
    cc_ring_get_counters(g.r, &k);
    cr_assert_eq(k.acquires, WINDOWS);
    cr_assert_eq(k.commits, WINDOWS);
    cr_assert_eq(k.reclaim_polls + k.reclaim_waits, WINDOWS - slots, "every reuse was a reclaim");
    cr_assert_eq(g.cfg.pageable, 0, "copies come from pinned memory");
    free(want);
    rig_close(&g);
    return k;
}

Test(ring, recycles_slots_only_after_their_copy)
{
    cc_ring_counters k = run_windows(3);
    cr_assert_gt(k.reclaim_polls, 0, "a finished copy is found by polling");
    /* One slot: the fake's first poll finds the copy running, so acquire
     * must block on it. */
    k = run_windows(1);
    cr_assert_gt(k.reclaim_polls, 0, "the poll path ran");
    cr_assert_gt(k.reclaim_waits, 0, "the blocking path ran");
}

typedef struct producer {
    rig *g;
    const uint8_t *want;
    int first, step, count;
    size_t slot;
} producer;

static void *produce(void *arg)
{
    producer *p = arg;
    ckpt_err err = {0};
    for (int w = p->first; w < p->count; w += p->step) {
        cc_slot *s;
        if (cc_ring_acquire(p->g->r, &s, &err) < 0)
            return NULL;
        /* Partial windows too, so lengths vary. */
        size_t len = p->slot - (size_t)(w % 3) * 7;
        memcpy(s->buf, p->want + (size_t)w * p->slot, len);
        cc_ring_copy(p->g->r, s, p->g->dev + (size_t)w * p->slot, s->buf, len, CC_H2D, &err);
        cc_ring_commit(p->g->r, s, CC_RECYCLE, &err);
    }
    return NULL;
}

Test(ring, many_threads_few_slots)
{
    rig g = {0};
    enum { SLOT = 1024, WINDOWS = 600, THREADS = 5 };
    rig_open(&g, 3, SLOT, 2, SLOT * WINDOWS);
    uint8_t *want = malloc(SLOT * WINDOWS);
    tu_fill_pattern(want, SLOT * WINDOWS, 11);
    memset(g.dev, 0, SLOT * WINDOWS);
    pthread_t t[THREADS];
    producer p[THREADS];
    for (int i = 0; i < THREADS; i++) {
        p[i] = (producer){&g, want, i, THREADS, WINDOWS, SLOT};
        pthread_create(&t[i], NULL, produce, &p[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ckpt_err err = {0};
    cr_assert_eq(cc_ring_drain(g.r, &err), 0, "%s", err.msg);
    for (int w = 0; w < WINDOWS; w++) {
        size_t len = SLOT - (size_t)(w % 3) * 7;
        cr_assert_eq(memcmp(g.dev + w * SLOT, want + w * SLOT, len), 0, "window %d", w);
    }
    free(want);
    rig_close(&g);
}

Test(ring, hold_slots_wait_for_their_bytes)
{
    rig g = {0};
    enum { SLOT = 512 };
    rig_open(&g, 2, SLOT, 1, SLOT * 4);
    tu_fill_pattern(g.dev, SLOT * 4, 3);
    ckpt_err err = {0};
    cc_slot *a, *b;
    cr_assert_eq(cc_ring_acquire(g.r, &a, &err), 0);
    cr_assert_eq(cc_ring_acquire(g.r, &b, &err), 0);
    cr_assert_neq(a, b);
    /* Two copies into one slot, one event. */
    cr_assert_eq(cc_ring_copy(g.r, a, a->buf, g.dev, 100, CC_D2H, &err), 0);
    cr_assert_eq(cc_ring_copy(g.r, a, a->buf + 100, g.dev + SLOT, 200, CC_D2H, &err), 0);
    cr_assert_eq(cc_ring_commit(g.r, a, CC_HOLD, &err), 0);
    cr_assert_eq(cc_ring_copy(g.r, b, b->buf, g.dev + 2 * SLOT, SLOT, CC_D2H, &err), 0);
    cr_assert_eq(cc_ring_commit(g.r, b, CC_HOLD, &err), 0);
    cr_assert_gt(fake_pending(g.be), 0, "the fake defers copies");
    cr_assert_eq(cc_ring_wait(g.r, b, &err), 0);
    cr_assert_eq(memcmp(b->buf, g.dev + 2 * SLOT, SLOT), 0);
    cr_assert_eq(cc_ring_wait(g.r, a, &err), 0);
    cr_assert_eq(memcmp(a->buf, g.dev, 100), 0);
    cr_assert_eq(memcmp(a->buf + 100, g.dev + SLOT, 200), 0);
    cr_assert_eq(cc_ring_wait(g.r, a, &err), 0, "waiting twice is fine");
    cc_ring_release(g.r, a);
    cc_ring_release(g.r, b);
    cr_assert_eq(cc_ring_acquire(g.r, &a, &err), 0);
    cc_ring_release(g.r, a);
    rig_close(&g);
}

Test(ring, drain_makes_held_slots_ready)
{
    rig g = {0};
    rig_open(&g, 2, 256, 2, 512);
    tu_fill_pattern(g.dev, 512, 5);
    ckpt_err err = {0};
    cc_slot *a;
    cr_assert_eq(cc_ring_acquire(g.r, &a, &err), 0);
    cr_assert_eq(cc_ring_copy(g.r, a, a->buf, g.dev + 256, 256, CC_D2H, &err), 0);
    cr_assert_eq(cc_ring_commit(g.r, a, CC_HOLD, &err), 0);
    cr_assert_eq(cc_ring_drain(g.r, &err), 0);
    cr_assert_eq(fake_pending(g.be), 0);
    cr_assert_eq(memcmp(a->buf, g.dev + 256, 256), 0);
    cr_assert_eq(cc_ring_wait(g.r, a, &err), 0);
    cc_ring_release(g.r, a);
    rig_close(&g);
}

Test(ring, release_waits_out_queued_copies)
{
    rig g = {0};
    rig_open(&g, 1, 256, 1, 256);
    ckpt_err err = {0};
    cc_slot *a;
    cr_assert_eq(cc_ring_acquire(g.r, &a, &err), 0);
    memset(a->buf, 0x11, 256);
    cr_assert_eq(cc_ring_copy(g.r, a, g.dev, a->buf, 256, CC_H2D, &err), 0);
    /* Abandoned before commit (as when a later piece fails). */
    cc_ring_release(g.r, a);
    cr_assert_eq(fake_pending(g.be), 0, "release ran the queued copy first");
    cr_assert_eq(g.dev[255], 0x11);
    rig_close(&g);
}

Test(ring, copy_failure_sticks)
{
    rig g = {0};
    g.cfg.fail_copy_at = 3;
    rig_open(&g, 2, 256, 1, 1024);
    ckpt_err err = {0};
    cc_slot *s;
    int failed_at = -1;
    for (int w = 0; w < 4 && failed_at < 0; w++) {
        cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0);
        if (cc_ring_copy(g.r, s, g.dev + w * 256, s->buf, 256, CC_H2D, &err) < 0) {
            failed_at = w;
            cc_ring_release(g.r, s);
            break;
        }
        cr_assert_eq(cc_ring_commit(g.r, s, CC_RECYCLE, &err), 0);
    }
    cr_assert_eq(failed_at, 2);
    tu_assert_contains(err.msg, "cudaMemcpyAsync");
    ckpt_err again = {0};
    cr_assert_eq(cc_ring_acquire(g.r, &s, &again), -EIO, "the failure sticks");
    cr_assert_str_eq(again.msg, err.msg);
    cr_assert_eq(cc_ring_drain(g.r, &again), -EIO);
    rig_close(&g);
}

Test(ring, async_fault_surfaces_on_wait)
{
    rig g = {0};
    g.cfg.fail_wait_at = 1;
    rig_open(&g, 1, 256, 1, 1024);
    ckpt_err err = {0};
    cc_slot *s;
    cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0);
    cr_assert_eq(cc_ring_copy(g.r, s, g.dev, s->buf, 256, CC_H2D, &err), 0);
    cr_assert_eq(cc_ring_commit(g.r, s, CC_RECYCLE, &err), 0);
    /* The only slot is in flight: acquire polls (pending on the first poll),
     * then blocks on it and gets the fault. */
    cr_assert_eq(cc_ring_acquire(g.r, &s, &err), -EIO);
    tu_assert_contains(err.msg, "unspecified launch failure");
    cr_assert_eq(cc_ring_error(g.r, NULL), -EIO);
    rig_close(&g);
}

typedef struct blocked {
    cc_ring *r;
    int rc;
    ckpt_err err;
} blocked;

static void *acquire_one(void *arg)
{
    blocked *b = arg;
    cc_slot *s;
    b->rc = cc_ring_acquire(b->r, &s, &b->err);
    if (b->rc == 0)
        cc_ring_release(b->r, s);
    return NULL;
}

/* Waits (up to 10 s) until an acquire on another thread sleeps. */
static void wait_until_blocked(cc_ring *r)
{
    cc_ring_counters k;
    for (int i = 0; i < 10000; i++) {
        cc_ring_get_counters(r, &k);
        if (k.idle_waits > 0)
            return;
        usleep(1000);
    }
    cr_assert_fail("the second acquire never blocked");
}

Test(ring, fail_wakes_a_blocked_acquire)
{
    rig g = {0};
    rig_open(&g, 1, 256, 1, 0);
    ckpt_err err = {0};
    cc_slot *s;
    cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0);
    blocked b = {.r = g.r};
    pthread_t t;
    pthread_create(&t, NULL, acquire_one, &b);
    wait_until_blocked(g.r); /* the only slot is being filled */
    ckpt_err e = {.code = -ENOSPC};
    snprintf(e.msg, sizeof e.msg, "out.safetensors: No space left on device");
    cc_ring_fail(g.r, &e);
    pthread_join(t, NULL);
    cr_assert_eq(b.rc, -ENOSPC);
    cr_assert_str_eq(b.err.msg, e.msg);
    cc_ring_release(g.r, s);
    rig_close(&g);
}

Test(ring, release_wakes_a_blocked_acquire)
{
    rig g = {0};
    rig_open(&g, 1, 256, 1, 0);
    ckpt_err err = {0};
    cc_slot *s;
    cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0);
    blocked b = {.r = g.r, .rc = 1};
    pthread_t t;
    pthread_create(&t, NULL, acquire_one, &b);
    wait_until_blocked(g.r);
    cc_ring_release(g.r, s);
    pthread_join(t, NULL);
    cr_assert_eq(b.rc, 0);
    rig_close(&g);
}

Test(ring, copy_outside_the_slot_is_refused)
{
    rig g = {0};
    rig_open(&g, 2, 256, 1, 1024);
    ckpt_err err = {0};
    cc_slot *s;
    cr_assert_eq(cc_ring_acquire(g.r, &s, &err), 0);
    cr_assert_eq(cc_ring_copy(g.r, s, g.dev, s->buf + 200, 100, CC_H2D, &err), -EINVAL);
    tu_assert_contains(err.msg, "outside slot");
    cr_assert_eq(g.cfg.copies, 0, "nothing reached the device");
    cc_ring_release(g.r, s);
    rig_close(&g);
}

Test(ring, pinned_allocation_failure)
{
    fake_cfg cfg = {.fail_host_alloc = 1};
    cc_backend *be;
    cc_ring *r = (cc_ring *)1;
    ckpt_err err = {0};
    cr_assert_eq(fake_open(&cfg, 0, &be, &err), 0);
    cr_assert_eq(cc_ring_new(be, 4, 1 << 20, 2, &r, &err), -ENOMEM);
    cr_assert_null(r);
    tu_assert_contains(err.msg, "pinned");
    be->ops->destroy(be);
    cr_assert_eq(cfg.live_events + cfg.live_streams + cfg.live_host, 0);
}

Test(ring, bad_geometry)
{
    fake_cfg cfg = {0};
    cc_backend *be;
    cc_ring *r;
    ckpt_err err = {0};
    cr_assert_eq(fake_open(&cfg, 0, &be, &err), 0);
    cr_assert_eq(cc_ring_new(be, 0, 1024, 1, &r, &err), -EINVAL);
    cr_assert_eq(cc_ring_new(be, 2, 1024, 0, &r, &err), -EINVAL);
    cr_assert_eq(cc_ring_new(be, 2, SIZE_MAX / 2 + 1, 1, &r, &err), -EINVAL);
    be->ops->destroy(be);
}
