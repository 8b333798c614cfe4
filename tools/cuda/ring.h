/* The pinned ring: a fixed set of page-locked host buffers ("slots") that
 * carry bytes between the host and the device, each with its own event and
 * one of a few streams. Plain C over the copy backend, so it is tested
 * without CUDA.
 *
 * A slot's life:
 *
 *   FREE --acquire--> FILLING --commit(RECYCLE)--> IN FLIGHT --done--> FREE
 *                        |    \--commit(HOLD)----> IN FLIGHT --wait--> READY
 *                        |                                               |
 *                        +--release (unused, or after a failure)--> FREE <+ release
 *
 * RECYCLE is for host-to-device: once the copy has run, the bytes are on the
 * device and the slot can be refilled; acquire() reclaims such slots itself,
 * polling events first and blocking on the oldest only when none is done.
 * HOLD is for device-to-host: the slot's bytes are wanted after the copy, so
 * it stays out of circulation until its consumer releases it.
 *
 * All functions are thread-safe. The first failure (a backend error, or one
 * reported with cc_ring_fail) sticks: later acquires return it, so every
 * thread of a pipeline stops at its next step. */
#ifndef CC_RING_H
#define CC_RING_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct cc_slot {
    uint8_t *buf;
    size_t cap;
    unsigned index;
} cc_slot;

typedef enum cc_commit_mode { CC_RECYCLE = 0, CC_HOLD = 1 } cc_commit_mode;

typedef struct cc_ring cc_ring;

typedef struct cc_ring_counters {
    uint64_t acquires; /* slots handed out */
    uint64_t copies;   /* copies queued */
    uint64_t commits;
    uint64_t reclaim_polls; /* slots reclaimed because their event was done */
    uint64_t reclaim_waits; /* ... because acquire blocked on their event */
    uint64_t idle_waits;    /* acquire found nothing to reclaim and slept */
} cc_ring_counters;

/* nslots buffers of slot_bytes each (one pinned allocation), nstreams
 * streams. The caller's thread must be bound to the backend's device. */
int cc_ring_new(cc_backend *be, unsigned nslots, size_t slot_bytes, unsigned nstreams,
                cc_ring **out, ckpt_err *err);
/* Waits for every copy still running, then frees everything. NULL is fine. */
void cc_ring_free(cc_ring *r);

int cc_ring_acquire(cc_ring *r, cc_slot **out, ckpt_err *err);
/* Queues a copy on the slot's stream. The host side (src for H2D, dst for
 * D2H) must lie inside the slot. */
int cc_ring_copy(cc_ring *r, cc_slot *s, void *dst, const void *src, size_t len, cc_dir dir,
                 ckpt_err *err);
int cc_ring_commit(cc_ring *r, cc_slot *s, cc_commit_mode mode, ckpt_err *err);
/* For a HOLD slot: waits until its copies are done and its bytes readable. */
int cc_ring_wait(cc_ring *r, cc_slot *s, ckpt_err *err);
/* Returns a FILLING, READY or held slot to the ring; any copy it still has
 * queued is waited for first, so the buffer is never reused under a copy. */
void cc_ring_release(cc_ring *r, cc_slot *s);
/* Waits for every committed copy; HOLD slots become READY. Returns the
 * ring's sticky error, if any. */
int cc_ring_drain(cc_ring *r, ckpt_err *err);

/* Makes e the ring's error (the first one wins) and wakes every waiter. */
void cc_ring_fail(cc_ring *r, const ckpt_err *e);
/* 0, or the sticky error copied into err. */
int cc_ring_error(cc_ring *r, ckpt_err *err);

unsigned cc_ring_slot_count(const cc_ring *r);
size_t cc_ring_slot_bytes(const cc_ring *r);
void cc_ring_get_counters(cc_ring *r, cc_ring_counters *out);

#endif
