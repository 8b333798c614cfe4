/* The host side of ckpt-cuda's load (issue 15, item 6), without a GPU: the
 * load pipeline of tools/cuda (workers decode straight into the pinned ring
 * and queue one copy per window) over the fake backend of tools/cuda/tests,
 * which stands in for the device in host memory.
 *
 * For each thread count, the median of three loads of PACK: tensor bytes per
 * second of wall time from first read to last copy, and tensor bytes per
 * CPU-second of the process. The per-core decode speed is the one-thread
 * load's (give 1 first); the target is a pipeline at >= 0.8 x threads x
 * that speed. On a machine with fewer free cores than threads the wall
 * ratio cannot show it; bytes per CPU-second against one thread's say
 * whether more threads cost more CPU per byte.
 *
 * The fake moves no bytes here (fake_cfg.no_data), as a GPU's DMA costs the
 * host no CPU. The CPU-seconds include setup (opening the pack, the
 * pinned ring's first touch), which the wall time of the copy phase does
 * not.
 *
 * Last, the time of ckpt-cuda's --verify of a load on the last thread count.
 *
 * Usage: host_pipeline PACK [KEYFILE|-] THREADS...   (make bench-cuda-host) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ckpt.h"
#include "bench.h"
#include "fake_backend.h"
#include "load.h"
#include "util.h"

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One load: wall seconds of its copy phase and CPU-seconds of the whole. */
static int load_once(const char *pack, const ckpt_key *key, unsigned threads, double *wall,
                     double *cpu, uint64_t *bytes)
{
    fake_cfg f = {.no_data = 1};
    ckpt_cuda_load_opts o = {.threads = threads, .key = key};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    double c0 = cpu_seconds();
    if (cc_load(fake_open, &f, pack, &o, &c, &err) != 0) {
        fprintf(stderr, "host_pipeline: %s\n", err.msg);
        return -1;
    }
    *cpu = cpu_seconds() - c0;
    const ckpt_cuda_stats *st = ckpt_cuda_load_stats(c);
    *wall = st->copy_seconds;
    *bytes = st->tensor_bytes;
    ckpt_cuda_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: host_pipeline PACK KEYFILE|- THREADS...\n");
        return 2;
    }
    ckpt_key *key = NULL;
    ckpt_err err = {0};
    if (strcmp(argv[2], "-") != 0 && ckpt_key_load_file(argv[2], &key, &err) != 0) {
        fprintf(stderr, "host_pipeline: %s\n", err.msg);
        return 1;
    }
    double per_core = 0, per_core_cpu = 0;
    for (int a = 3; a < argc; a++) {
        unsigned t = (unsigned)atoi(argv[a]);
        double wall[3], cpu[3];
        uint64_t bytes = 0;
        for (int r = 0; r < 3; r++)
            if (load_once(argv[1], key, t, &wall[r], &cpu[r], &bytes) != 0)
                return 1;
        qsort(wall, 3, sizeof *wall, cmp_double);
        qsort(cpu, 3, sizeof *cpu, cmp_double);
        double gbps = cc_gbps(bytes, wall[1]), per_cpu = cc_gbps(bytes, cpu[1]);
        if (t == 1 || per_core == 0) {
            per_core = gbps / t;
            per_core_cpu = per_cpu;
        }
        printf("threads %u: %.2f GB/s (%.3f s), %.2fx of threads x per-core (%.2f GB/s); "
               "%.2f GB per CPU-s, %.2fx of one thread's\n",
               t, gbps, wall[1], gbps / (t * per_core), per_core, per_cpu, per_cpu / per_core_cpu);
    }
    /* ckpt-cuda --verify's host side: the copies back through the ring and
     * each tensor's SHA-256, here over a fake device that holds the bytes. */
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.threads = (unsigned)atoi(argv[argc - 1]), .key = key};
    ckpt_cuda_ckpt *c = NULL;
    if (cc_load(fake_open, &f, argv[1], &o, &c, &err) != 0) {
        fprintf(stderr, "host_pipeline: %s\n", err.msg);
        return 1;
    }
    double t0 = cc_now();
    long bad = ckpt_cuda_verify(c, NULL, NULL, &err);
    double secs = cc_now() - t0;
    if (bad < 0) {
        fprintf(stderr, "host_pipeline: verify: %s\n", err.msg);
        ckpt_cuda_free(c);
        ckpt_key_free(key);
        return 1;
    }
    printf("verify: %.2f GB/s (%.3f s), %ld tensors differ\n",
           cc_gbps(ckpt_cuda_load_stats(c)->tensor_bytes, secs), secs, bad);
    ckpt_cuda_free(c);
    ckpt_key_free(key);
    return bad == 0 ? 0 : 1;
}
