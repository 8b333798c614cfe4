/* The copy backend on the CUDA runtime API. Every call is checked and its
 * failure turned into a message that says what was being done; nothing here
 * resets the device or aborts, because the context is shared with the
 * caller's own work. */
#include "backend_cuda.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct cuda_be {
    cc_backend base;
    int dev;
    char name[256];
} cuda_be;

/* The device each bind_thread found current, so unbind_thread restores the
 * caller's choice; a small stack because binds nest (a save's cleanup binds
 * inside the caller's bind). */
#define BIND_DEPTH 8
static _Thread_local int bind_prev[BIND_DEPTH];
static _Thread_local int bind_depth;

static int code_of(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
        return -ENODEV;
    default:
        return -EIO;
    }
}

/* The errors after which, in the runtime's words, "the process must be
 * terminated and relaunched": the context is lost and every later call fails
 * the same way, whichever work (often the caller's kernel) caused it. */
static int is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorMpsClientTerminated:
        return 1;
    default:
        return 0;
    }
}

/* Fills err for a failed call. cudaGetLastError() clears the error, so the
 * caller's own next check does not find ours; a sticky one says so, since
 * the fault need not be in the call that reported it. */
static int fail_cuda(ckpt_err *err, cudaError_t e, const char *what)
{
    cudaGetLastError();
    return cc_fail(err, code_of(e), "%s: %s (%s)%s", what, cudaGetErrorString(e),
                   cudaGetErrorName(e),
                   is_sticky(e) ? "; the device's context is lost, the process must restart to "
                                  "use it again"
                                : "");
}

static int probe(int device, int *count, ckpt_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        /* "driver version is insufficient" means either no driver at all or
         * one older than this (statically linked) runtime, which is common
         * on hosts with a GPU: tell the two apart. */
        int drv = 0;
        if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&drv) == cudaSuccess) {
            if (drv == 0)
                return cc_fail(err, -ENODEV,
                               "no CUDA device: no CUDA driver is installed "
                               "(cudaGetDeviceCount: %s)",
                               cudaGetErrorString(e));
            return cc_fail(err, -ENODEV,
                           "no CUDA device: the driver supports CUDA %d.%d, older than the "
                           "CUDA %d.%d runtime this was built with; update the driver "
                           "(cudaGetDeviceCount: %s)",
                           drv / 1000, drv % 1000 / 10, CUDART_VERSION / 1000,
                           CUDART_VERSION % 1000 / 10, cudaGetErrorString(e));
        }
        return cc_fail(err, -ENODEV, "no CUDA device (cudaGetDeviceCount: %s)",
                       cudaGetErrorString(e));
    }
    if (n <= 0)
        return cc_fail(err, -ENODEV, "no CUDA device (the driver reports none)");
    if (device < 0 || device >= n)
        return cc_fail(err, -ENODEV, "device %d does not exist (%d device%s)", device, n,
                       n == 1 ? "" : "s");
    *count = n;
    return 0;
}

/* cuCtxGetCurrent, found through the runtime so that nothing links libcuda
 * (which would stop the tool from starting, let alone explaining, on a host
 * without a driver); NULL if the driver does not offer it. */
static PFN_cuCtxGetCurrent_v4000 ctx_current;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void find_ctx_current(void)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q);
#elif CUDART_VERSION >= 12000
    cudaError_t e = cudaGetDriverEntryPoint("cuCtxGetCurrent", &fn, cudaEnableDefault, &q);
#else
    /* Before CUDA 12 cudaSetDevice() created no context: nothing to avoid. */
    cudaError_t e = cudaErrorNotSupported;
#endif
    if (e != cudaSuccess)
        cudaGetLastError();
    else if (q == cudaDriverEntryPointSuccess && fn)
        ctx_current = (PFN_cuCtxGetCurrent_v4000)fn;
}

/* The device this thread works on, or -1 when it has none to go back to.
 * cudaGetDevice() says 0 on a thread that never used CUDA (every worker and
 * writer thread we start, and many callers' threads), and since CUDA 12
 * cudaSetDevice(0) creates device 0's primary context: restoring that "0"
 * after working on device 1 would cost device 0 a context (hundreds of MB
 * and a fraction of a second) in every process, on a GPU it never used. */
static int thread_device(void)
{
    pthread_once(&ctx_once, find_ctx_current);
    CUcontext ctx = NULL;
    if (ctx_current && (ctx_current(&ctx) != CUDA_SUCCESS || !ctx))
        return -1;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return dev;
}

static int be_bind(cc_backend *b, ckpt_err *err)
{
    cuda_be *cb = (cuda_be *)b;
    int prev = thread_device();
    cudaError_t e = cudaSetDevice(cb->dev);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "device %d unusable (cudaSetDevice)", cb->dev);
        return fail_cuda(err, e, what);
    }
    if (bind_depth < BIND_DEPTH)
        bind_prev[bind_depth] = prev;
    bind_depth++;
    return 0;
}

static void be_unbind(cc_backend *b)
{
    cuda_be *cb = (cuda_be *)b;
    if (bind_depth == 0)
        return;
    bind_depth--;
    int prev = bind_depth < BIND_DEPTH ? bind_prev[bind_depth] : -1;
    if (prev >= 0 && prev != cb->dev && cudaSetDevice(prev) != cudaSuccess)
        cudaGetLastError();
}

static int be_dev_alloc(cc_backend *b, size_t len, void **out, ckpt_err *err)
{
    cuda_be *cb = (cuda_be *)b;
    cudaError_t e = cudaMalloc(out, len);
    if (e == cudaSuccess)
        return 0;
    /* Callers free what is non-NULL; cudaMalloc does not promise to leave
     * *out alone when it fails. */
    *out = NULL;
    cudaGetLastError();
    char want[32];
    cc_fmt_bytes(len, want);
    if (e != cudaErrorMemoryAllocation)
        return fail_cuda(err, e, "cudaMalloc");
    size_t freeb = 0, total = 0;
    if (cudaMemGetInfo(&freeb, &total) != cudaSuccess) {
        cudaGetLastError();
        return cc_fail(err, -ENOMEM, "out of device memory allocating %s on device %d", want,
                       cb->dev);
    }
    char f[32], t[32];
    cc_fmt_bytes(freeb, f);
    cc_fmt_bytes(total, t);
    return cc_fail(err, -ENOMEM, "out of device memory allocating %s on device %d (%s free of %s)",
                   want, cb->dev, f, t);
}

static void be_dev_free(cc_backend *b, void *p)
{
    ckpt_err ignored;
    /* Called from ckpt_cuda_free(), on whatever thread and device. */
    int bound = be_bind(b, &ignored) == 0;
    if (cudaFree(p) != cudaSuccess)
        cudaGetLastError();
    if (bound)
        be_unbind(b);
}

static int be_host_alloc(cc_backend *b, size_t len, void **out, ckpt_err *err)
{
    cudaError_t e = cudaHostAlloc(out, len, cudaHostAllocDefault);
    if (e == cudaSuccess)
        return 0;
    *out = NULL;
    char want[32], what[96];
    cc_fmt_bytes(len, want);
    snprintf(what, sizeof what, "%s pinned host memory allocating %s (cudaHostAlloc)",
             e == cudaErrorMemoryAllocation ? "out of" : "cannot get", want);
    return fail_cuda(err, e, what);
}

static void be_host_free(cc_backend *b, void *p)
{
    if (cudaFreeHost(p) != cudaSuccess)
        cudaGetLastError();
}

static int be_stream_new(cc_backend *b, void **out, ckpt_err *err)
{
    cudaStream_t s;
    /* Non-blocking: our copies must not serialise with the legacy default
     * stream the caller's kernels may be using. */
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return fail_cuda(err, e, "cudaStreamCreate");
    *out = s;
    return 0;
}

static void be_stream_free(cc_backend *b, void *s)
{
    if (cudaStreamDestroy((cudaStream_t)s) != cudaSuccess)
        cudaGetLastError();
}

static int be_event_new(cc_backend *b, void **out, ckpt_err *err)
{
    cudaEvent_t ev;
    /* Blocking sync: a waiting thread sleeps instead of spinning, leaving
     * the core to the decoder threads. */
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
    if (e != cudaSuccess)
        return fail_cuda(err, e, "cudaEventCreate");
    *out = ev;
    return 0;
}

static void be_event_free(cc_backend *b, void *ev)
{
    if (cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
        cudaGetLastError();
}

static int be_copy_async(cc_backend *b, void *dst, const void *src, size_t len, cc_dir dir,
                         void *stream, ckpt_err *err)
{
    enum cudaMemcpyKind kind = dir == CC_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    cudaError_t e = cudaMemcpyAsync(dst, src, len, kind, (cudaStream_t)stream);
    if (e != cudaSuccess)
        return fail_cuda(err, e,
                         dir == CC_H2D ? "cudaMemcpyAsync host to device"
                                       : "cudaMemcpyAsync device to host");
    return 0;
}

static int be_event_record(cc_backend *b, void *ev, void *stream, ckpt_err *err)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : fail_cuda(err, e, "cudaEventRecord");
}

static int be_event_query(cc_backend *b, void *ev, ckpt_err *err)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    /* Errors of asynchronous copies surface here. */
    return fail_cuda(err, e, "copy failed (cudaEventQuery)");
}

static int be_event_wait(cc_backend *b, void *ev, ckpt_err *err)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? 0 : fail_cuda(err, e, "copy failed (cudaEventSynchronize)");
}

static int be_sync(cc_backend *b, ckpt_err *err)
{
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : fail_cuda(err, e, "cudaDeviceSynchronize");
}

static void be_describe(cc_backend *b, char *buf, size_t len)
{
    cuda_be *cb = (cuda_be *)b;
    snprintf(buf, len, "device %d (%s)", cb->dev, cb->name);
}

static int be_device(cc_backend *b)
{
    return ((cuda_be *)b)->dev;
}

static void be_destroy(cc_backend *b)
{
    free(b);
}

static const cc_backend_ops cuda_ops = {
    .bind_thread = be_bind,
    .unbind_thread = be_unbind,
    .dev_alloc = be_dev_alloc,
    .dev_free = be_dev_free,
    .host_alloc = be_host_alloc,
    .host_free = be_host_free,
    .stream_new = be_stream_new,
    .stream_free = be_stream_free,
    .event_new = be_event_new,
    .event_free = be_event_free,
    .copy_async = be_copy_async,
    .event_record = be_event_record,
    .event_query = be_event_query,
    .event_wait = be_event_wait,
    .sync = be_sync,
    .describe = be_describe,
    .device = be_device,
    .destroy = be_destroy,
};

int cc_cuda_open(void *ud, int device, cc_backend **out, ckpt_err *err)
{
    (void)ud;
    *out = NULL;
    int n;
    int rc = probe(device, &n, err);
    if (rc < 0)
        return rc;
    cuda_be *cb = calloc(1, sizeof *cb);
    if (!cb)
        return cc_fail(err, -ENOMEM, "out of memory");
    cb->base.ops = &cuda_ops;
    cb->dev = device;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
        snprintf(cb->name, sizeof cb->name, "%s", prop.name);
    } else {
        cudaGetLastError();
        snprintf(cb->name, sizeof cb->name, "unknown");
    }
    *out = &cb->base;
    return 0;
}

int cc_cuda_device_count(ckpt_err *err)
{
    int n;
    int rc = probe(0, &n, err);
    return rc < 0 ? rc : n;
}

int cc_cuda_device_line(int device, char *buf, size_t len, ckpt_err *err)
{
    int n;
    int rc = probe(device, &n, err);
    if (rc < 0)
        return rc;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return fail_cuda(err, e, "cudaGetDeviceProperties");
    char bus[32] = "?", mem[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess)
        cudaGetLastError();
    cc_fmt_bytes(prop.totalGlobalMem, mem);
    snprintf(buf, len, "device %d: %s, %s, compute %d.%d, PCI %s", device, prop.name, mem,
             prop.major, prop.minor, bus);
    return 0;
}
