/* The load pipeline over any backend and source; ckpt_cuda_load() is this
 * with the CUDA backend (api.c). Internal to libckpt_cuda and its tests. */
#ifndef CC_LOAD_H
#define CC_LOAD_H

#include "backend.h"
#include "ckpt_cuda.h"
#include "plan.h"
#include "source.h"

struct ckpt_cuda_ckpt {
    cc_backend *be;
    int own_be;  /* destroy be in ckpt_cuda_free */
    void *block; /* alloc rounded up to the alignment */
    void *alloc; /* what dev_alloc returned, for dev_free */
    ckpt_cuda_tensor *t;
    size_t n;
    uint64_t *off, *len; /* the layout, for verify */
    cc_layout layout;
    char *strings; /* names and dtypes */
    uint64_t *shapes;
    ckpt_cuda_stats stats;
    size_t pinned_bytes;
    unsigned streams;
};

/* Opens src, then the backend for opts->device, then loads. The result owns
 * the backend. t0 (cc_now() at the caller's start) dates setup_seconds. */
int cc_load(cc_backend_open_fn open_be, void *ud, const char *src, const ckpt_cuda_load_opts *opts,
            ckpt_cuda_ckpt **out, ckpt_err *err);
/* Loads from an open source on an open backend (bound to this thread),
 * which the result borrows. */
int cc_load_from(cc_backend *be, cc_source *s, const ckpt_cuda_load_opts *opts, double t0,
                 ckpt_cuda_ckpt **out, ckpt_err *err);

/* opts with every 0 replaced by its default. */
void cc_load_opts_resolve(const ckpt_cuda_load_opts *in, ckpt_cuda_load_opts *out);

#endif
