/* The save pipeline over any backend; ckpt_cuda_save() is this with the CUDA
 * backend (api.c). Internal to libckpt_cuda and its tests. */
#ifndef CC_SAVE_H
#define CC_SAVE_H

#include "backend.h"
#include "ckpt_cuda.h"

/* Checks the tensors and builds the header before asking for a device, so
 * a bad call fails the same way with or without one. The job owns the
 * backend. */
int cc_save(cc_backend_open_fn open_be, void *ud, const char *path,
            const ckpt_cuda_save_tensor *tensors, size_t n, const ckpt_cuda_save_opts *opts,
            ckpt_cuda_save_job **out, ckpt_err *err);

#endif
