/* A copy backend in host memory for the tests, with the asynchrony that
 * matters: copies queue on their stream and run only when an event behind
 * them is waited for (or, every other time, polled), so a pipeline that
 * reuses a pinned buffer before its copy has run moves the wrong bytes and
 * the test sees it. It also checks every copy's pointers against live
 * allocations, notices host memory freed under a queued copy, counts what
 * is left allocated, and injects faults on demand. Device memory is aligned
 * like cudaMalloc's: to 256 bytes, and never by chance to more. */
#ifndef FAKE_BACKEND_H
#define FAKE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct fake_cfg {
    /* Faults. */
    int no_driver;       /* open fails like a machine without a driver */
    int ndev;            /* devices; 0 means 1 */
    size_t dev_capacity; /* bytes of "device memory"; 0 = unlimited */
    int fail_host_alloc; /* pinned allocations fail */
    long fail_copy_at;   /* the n-th copy_async fails (1-based; 0 = never) */
    long fail_wait_at;   /* the n-th event_wait reports an async fault */
    int immediate;       /* run copies at once instead of deferring them */
    /* For benchmarks: copies are checked and ordered as usual but move no
     * bytes, as a device's DMA costs the host no CPU (and the "device"
     * memory is never touched, so never faulted in). */
    int no_data;
    /* Memory the test owns that counts as device memory (the tensors a
     * save is given, which no backend instance allocated). */
    uint8_t *dev_region;
    size_t dev_region_len;

    /* Observations (written by the backend, read by the test). */
    long opens, destroys;
    long copies, h2d, d2h, pageable;
    uint64_t h2d_bytes, d2h_bytes;
    long live_dev, live_host, live_streams, live_events;
    long bad_pointer;      /* a copy outside any live allocation */
    long freed_under_copy; /* host/device memory freed with a copy queued on it */
    long pending_at_destroy;
    long syncs;
    long bind_depth; /* binds minus unbinds, summed over threads */
    size_t dev_in_use;
} fake_cfg;

/* A cc_backend_open_fn: ud is a fake_cfg*, which must outlive the backend. */
int fake_open(void *ud, int device, cc_backend **out, ckpt_err *err);

/* Copies still queued on any stream. */
long fake_pending(cc_backend *b);

#endif
