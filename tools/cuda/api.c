/* The public entry points: the pipelines bound to the CUDA backend. */
#include "backend_cuda.h"
#include "ckpt_cuda.h"
#include "load.h"
#include "save.h"

int ckpt_cuda_load(const char *src, const ckpt_cuda_load_opts *opts, ckpt_cuda_ckpt **out,
                   ckpt_err *err)
{
    return cc_load(cc_cuda_open, NULL, src, opts, out, err);
}

int ckpt_cuda_save(const char *path, const ckpt_cuda_save_tensor *tensors, size_t n,
                   const ckpt_cuda_save_opts *opts, ckpt_cuda_save_job **job, ckpt_err *err)
{
    return cc_save(cc_cuda_open, NULL, path, tensors, n, opts, job, err);
}

int ckpt_cuda_device_count(ckpt_err *err)
{
    return cc_cuda_device_count(err);
}
