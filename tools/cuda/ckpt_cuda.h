/*
 * libckpt_cuda: checkpoints straight into GPU memory, and GPU tensors out to
 * a safetensors file, through the CUDA runtime.
 *
 * Loading reads a checkpoint from one of two sources:
 *  - a mounted checkpoint directory (ckptfs MOUNT/NAME): manifest.json names
 *    the tensors and tensors/<path> holds their bytes, read with pread();
 *  - a .tpack file, opened with libckpt and decoded on host threads.
 * Reading/decoding overlaps the host-to-device copies: the bytes go into a
 * small ring of pinned host buffers, each sent with cudaMemcpyAsync on one of
 * several streams while the next buffers fill. Pinned memory is bounded
 * (pinned_bytes, default 256 MiB) whatever the checkpoint's size.
 *
 * The whole checkpoint (or the chosen subset) lands in ONE device allocation,
 * each tensor at an aligned offset, so freeing it is one call and the layout
 * is predictable.
 *
 * Conventions follow libckpt (ckpt.h): 0 or a count on success, a negative
 * errno value on failure with *err filled. Device faults map to:
 *   -ENODEV  no driver, no device, or a device index that does not exist
 *   -ENOMEM  out of device or pinned host memory (the message gives the size)
 *   -EIO     a CUDA call failed otherwise (the message names the call)
 * Nothing here aborts the process or resets the device: the CUDA context is
 * shared with the caller's own work.
 *
 * Threads: each call uses its own streams and buffers, so calls may run
 * concurrently. The calling thread's current device is restored on return;
 * a thread that had no CUDA context is left on the call's device (restoring
 * the runtime's default, device 0, would create a context there).
 */
#ifndef CKPT_CUDA_H
#define CKPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_CUDA_DEFAULT_ALIGN 256u
#define CKPT_CUDA_DEFAULT_PINNED (256u * 1024u * 1024u)
#define CKPT_CUDA_DEFAULT_STREAMS 4u

/* ------------------------------------------------------------------ load */

typedef struct ckpt_cuda_load_opts {
    int device; /* CUDA device index */
    /* Subset: a tensor is loaded if any pattern matches its name. A pattern
     * without '*', '?' or '[' must equal the name; otherwise it is a glob
     * (fnmatch, where '*' also matches '.' and '/'), so "h.0.*" is a prefix.
     * A pattern that matches nothing is an error (-ENOENT), since it is most
     * likely a typo. n_select == 0 loads every tensor. */
    const char *const *select;
    size_t n_select;
    size_t alignment;    /* of each tensor's address and offset: a power
                                 * of two up to 1 GiB; 0 = CKPT_CUDA_DEFAULT_ALIGN */
    size_t pinned_bytes; /* bound on pinned host memory; 0 = default */
    unsigned threads;    /* reader/decoder threads; 0 = one per core (max 32) */
    unsigned streams;    /* CUDA streams; 0 = CKPT_CUDA_DEFAULT_STREAMS */
    const ckpt_key *key; /* for encrypted .tpack files, else NULL */
} ckpt_cuda_load_opts;

typedef struct ckpt_cuda_tensor {
    const char *name;
    const char *dtype; /* safetensors dtype name: "BF16", "F32", ... */
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    uint64_t offset;    /* inside the device block */
    void *dev;          /* device pointer: block base + offset */
    uint8_t sha256[32]; /* digest the source recorded */
    int has_sha256;     /* 0 when the source recorded none */
} ckpt_cuda_tensor;

typedef struct ckpt_cuda_stats {
    uint64_t tensor_bytes; /* sum of the loaded tensors' sizes */
    uint64_t device_bytes; /* size of the device block (with padding) */
    uint64_t pinned_bytes; /* pinned host memory actually used */
    unsigned threads, streams, slots;
    double setup_seconds; /* opening the source, allocating */
    /* Its parts, so that a slow setup says what to blame: opening the
     * source (pack index, manifest, S3 HEAD), the device's context,
     * planning the layout and cudaMalloc of the block, pinning the host
     * ring. */
    double open_seconds, device_seconds, alloc_seconds, pin_seconds;
    double copy_seconds; /* first read to last copy completed */
    double total_seconds;
} ckpt_cuda_stats;

typedef struct ckpt_cuda_ckpt ckpt_cuda_ckpt;

/* Loads the tensors of src (a checkpoint directory holding manifest.json, or
 * a .tpack file) into device memory. On success every tensor's bytes are on
 * the device and visible to work on any stream. opts may be NULL. */
int ckpt_cuda_load(const char *src, const ckpt_cuda_load_opts *opts, ckpt_cuda_ckpt **out,
                   ckpt_err *err);
/* Frees the device block and everything else. NULL is fine. */
void ckpt_cuda_free(ckpt_cuda_ckpt *c);

size_t ckpt_cuda_count(const ckpt_cuda_ckpt *c);
/* Tensors in the order of the source (a pack's index, the manifest). */
const ckpt_cuda_tensor *ckpt_cuda_tensor_at(const ckpt_cuda_ckpt *c, size_t i);
/* By exact name, or NULL. */
const ckpt_cuda_tensor *ckpt_cuda_find(const ckpt_cuda_ckpt *c, const char *name);
/* The device block and its size (NULL, 0 when every tensor is empty). */
void *ckpt_cuda_block(const ckpt_cuda_ckpt *c, uint64_t *bytes);
int ckpt_cuda_device(const ckpt_cuda_ckpt *c);
const ckpt_cuda_stats *ckpt_cuda_load_stats(const ckpt_cuda_ckpt *c);

/* Copies every tensor back to the host and compares its SHA-256 with the one
 * the source recorded; fault() is called for each mismatch (with kind
 * "tensor") and for a tensor with no recorded digest (kind "nodigest").
 * Returns the number of mismatches (0 = all good), or -errno. */
long ckpt_cuda_verify(ckpt_cuda_ckpt *c, ckpt_fault_fn fault, void *ud, ckpt_err *err);

/* ------------------------------------------------------------------ save */

typedef struct ckpt_cuda_save_tensor {
    const char *name;  /* non-empty, unique, not "__metadata__" */
    const char *dtype; /* safetensors dtype name */
    uint32_t ndim;
    const uint64_t *shape;
    const void *dev; /* device pointer; may be NULL for 0 bytes */
} ckpt_cuda_save_tensor;

typedef struct ckpt_cuda_save_opts {
    int device;
    /* Bounds pinned memory. The call returns when the last device-to-host copy
     * has completed; with more tensor bytes than pinned_bytes, that waits for
     * all but the last pinned_bytes to be written to the file. Set it to the
     * checkpoint size or more to return after the copies alone. */
    size_t pinned_bytes; /* 0 = CKPT_CUDA_DEFAULT_PINNED */
    unsigned streams;    /* 0 = CKPT_CUDA_DEFAULT_STREAMS */
    int fsync;           /* fsync() the file before closing it */
} ckpt_cuda_save_opts;

typedef struct ckpt_cuda_save_job ckpt_cuda_save_job;

/* Writes the tensors, in the order given, as a safetensors file at path
 * (created or truncated, mode 0644); for ckptfs this is a file inside a
 * writing checkpoint, e.g. MOUNT/NAME/model.safetensors, and the daemon packs
 * it in the background. It first waits for all work already queued on the
 * device (so kernels still writing the tensors finish), and returns once
 * every byte has left the device: the tensors' memory may then be reused or
 * freed. A background thread finishes writing and closes the file; call
 * ckpt_cuda_save_wait() to join it. On failure nothing is left to wait for
 * and the partial file is removed. */
int ckpt_cuda_save(const char *path, const ckpt_cuda_save_tensor *tensors, size_t n,
                   const ckpt_cuda_save_opts *opts, ckpt_cuda_save_job **job, ckpt_err *err);
/* Waits until the file is written and closed, frees the job, and returns 0
 * or the write error (the partial file is then removed). */
int ckpt_cuda_save_wait(ckpt_cuda_save_job *job, ckpt_err *err);

/* ----------------------------------------------------------------- misc */

/* Number of usable devices (>= 1), or -ENODEV with the reason. */
int ckpt_cuda_device_count(ckpt_err *err);

#ifdef __cplusplus
}
#endif
#endif
