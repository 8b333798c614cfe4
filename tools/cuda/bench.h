/* `ckpt-cuda bench`: three ways to get the same bytes onto the device, timed
 * in one run on one backend, so the ratios compare like with like:
 *  - link:     cudaMemcpy host-to-device from pinned memory, the ceiling;
 *  - naive:    read (or decode) every tensor into pageable memory on one
 *              thread, then copy each one over;
 *  - pipeline: ckpt-cuda's load.
 * The source is read once untimed first, so the page cache (or the mount's
 * cache) is equally warm for naive and pipeline. */
#ifndef CC_BENCH_H
#define CC_BENCH_H

#include <stdint.h>

#include "backend.h"
#include "ckpt_cuda.h"
#include "source.h"

typedef struct cc_bench_result {
    uint64_t bytes;      /* tensor bytes */
    uint64_t link_bytes; /* moved by the link test */
    double link_s;
    int naive_skipped; /* the whole checkpoint would not fit in RAM */
    double naive_read_s, naive_copy_s;
    double pipe_s, pipe_copy_s;
    ckpt_cuda_stats pipe;
} cc_bench_result;

/* be must be bound to this thread. */
int cc_bench(cc_backend *be, cc_source *s, const ckpt_cuda_load_opts *opts, cc_bench_result *r,
             ckpt_err *err);

static inline double cc_gbps(uint64_t bytes, double s)
{
    return s > 0 ? (double)bytes / s / 1e9 : 0.0;
}

#endif
