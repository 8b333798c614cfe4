/* The copy backend: everything the pipelines need from a device, behind a
 * table of functions. backend_cuda.c implements it with the CUDA runtime;
 * the tests implement it in host memory (with deferred "asynchronous" copies
 * and injected faults), which is how the ring, load and save logic are
 * tested on machines without a GPU.
 *
 * Streams and events are opaque handles. Every function that can fail
 * returns 0 or -errno and fills *err with a message that stands on its own
 * ("out of device memory allocating 1.4 GB ..."). */
#ifndef CC_BACKEND_H
#define CC_BACKEND_H

#include <stddef.h>

#include "ckpt.h"

typedef enum cc_dir { CC_H2D = 1, CC_D2H = 2 } cc_dir;

/* What cudaMalloc guarantees: "aligned to at least 256 bytes". */
#define CC_DEV_ALIGN 256u

typedef struct cc_backend cc_backend;

typedef struct cc_backend_ops {
    /* Makes the backend's device current in the calling thread, remembering
     * what was current so unbind_thread can put it back. */
    int (*bind_thread)(cc_backend *b, ckpt_err *err);
    void (*unbind_thread)(cc_backend *b);
    /* Aligned to CC_DEV_ALIGN, and no more is promised. */
    int (*dev_alloc)(cc_backend *b, size_t len, void **out, ckpt_err *err);
    void (*dev_free)(cc_backend *b, void *p);
    /* Page-locked host memory, so asynchronous copies really are. */
    int (*host_alloc)(cc_backend *b, size_t len, void **out, ckpt_err *err);
    void (*host_free)(cc_backend *b, void *p);
    int (*stream_new)(cc_backend *b, void **out, ckpt_err *err);
    void (*stream_free)(cc_backend *b, void *stream);
    int (*event_new)(cc_backend *b, void **out, ckpt_err *err);
    void (*event_free)(cc_backend *b, void *event);
    /* Queues a copy on stream; it may run any time before the next event
     * recorded on that stream completes. */
    int (*copy_async)(cc_backend *b, void *dst, const void *src, size_t len, cc_dir dir,
                      void *stream, ckpt_err *err);
    int (*event_record)(cc_backend *b, void *event, void *stream, ckpt_err *err);
    /* 1 when the work before the event is done, 0 while it is pending. */
    int (*event_query)(cc_backend *b, void *event, ckpt_err *err);
    int (*event_wait)(cc_backend *b, void *event, ckpt_err *err);
    /* Waits for all work on the device, whoever queued it. */
    int (*sync)(cc_backend *b, ckpt_err *err);
    /* "device 0 (NVIDIA H100 80GB HBM3)" */
    void (*describe)(cc_backend *b, char *buf, size_t len);
    int (*device)(cc_backend *b);
    void (*destroy)(cc_backend *b);
} cc_backend_ops;

struct cc_backend {
    const cc_backend_ops *ops;
};

/* Opens a backend for a device; how the pipelines get one, so that tests can
 * hand them a fake. */
typedef int (*cc_backend_open_fn)(void *ud, int device, cc_backend **out, ckpt_err *err);

#endif
