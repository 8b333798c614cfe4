/* `ckpt-cuda load` and `ckpt-cuda bench`. */
#include <stdio.h>

#include "backend_cuda.h"
#include "bench.h"
#include "cmd_load.h"
#include "source.h"
#include "tool.h"
#include "util.h"

static void on_fault(void *ud, const char *kind, const char *name, uint64_t offset,
                     const char *fault)
{
    (void)offset;
    size_t *nodigest = ud;
    if (kind[0] == 'n') {
        (*nodigest)++;
        return;
    }
    fprintf(stderr, "ckpt-cuda: %s '%s': %s\n", kind, name, fault);
}

static int verify(ckpt_cuda_ckpt *c, const tool_opts *o)
{
    ckpt_err err = {0};
    size_t nodigest = 0;
    double t0 = cc_now();
    long bad = ckpt_cuda_verify(c, on_fault, &nodigest, &err);
    if (bad < 0)
        return tool_fail(&err);
    size_t n = ckpt_cuda_count(c);
    if (bad > 0) {
        fprintf(stderr, "ckpt-cuda: verify: %ld of %zu tensors differ from their SHA-256\n", bad,
                n);
        return EXIT_FAIL;
    }
    if (!o->quiet) {
        printf("verify: %zu tensors match their SHA-256 (%.3f s)", n - nodigest, cc_now() - t0);
        if (nodigest)
            printf("; %zu had no recorded digest", nodigest);
        putchar('\n');
    }
    return EXIT_OK;
}

static void print_load(ckpt_cuda_ckpt *c)
{
    const ckpt_cuda_stats *st = ckpt_cuda_load_stats(c);
    char bytes[32], pinned[32];
    cc_fmt_bytes(st->tensor_bytes, bytes);
    cc_fmt_bytes(st->pinned_bytes, pinned);
    printf("loaded %zu tensors, %s onto device %d in %.3f s: %.2f GB/s\n", ckpt_cuda_count(c),
           bytes, ckpt_cuda_device(c), st->total_seconds,
           cc_gbps(st->tensor_bytes, st->total_seconds));
    printf("  setup %.3f s (open %.3f, device %.3f, allocate %.3f, pin %.3f), copies %.3f s "
           "(%.2f GB/s); %u threads, %u streams, %u slots, %s pinned\n",
           st->setup_seconds, st->open_seconds, st->device_seconds, st->alloc_seconds,
           st->pin_seconds, st->copy_seconds, cc_gbps(st->tensor_bytes, st->copy_seconds),
           st->threads, st->streams, st->slots, pinned);
}

int cmd_load(const tool_opts *o)
{
    ckpt_key *key = NULL;
    int rc = tool_load_key(o, &key);
    if (rc != EXIT_OK)
        return rc;
    ckpt_cuda_load_opts lo = o->load;
    lo.key = key;
    ckpt_err err = {0};
    ckpt_cuda_ckpt *c = NULL;
    if (ckpt_cuda_load(o->src, &lo, &c, &err) < 0) {
        ckpt_key_free(key);
        return tool_fail(&err);
    }
    ckpt_key_free(key);
    if (!o->quiet)
        print_load(c);
    rc = o->verify ? verify(c, o) : EXIT_OK;
    ckpt_cuda_free(c);
    return rc;
}

static void print_bench(const cc_backend *be, const cc_source *s, const cc_bench_result *r)
{
    char bytes[32], link[32], desc[300];
    cc_fmt_bytes(r->bytes, bytes);
    cc_fmt_bytes(r->link_bytes, link);
    be->ops->describe((cc_backend *)be, desc, sizeof desc);
    double lg = cc_gbps(r->link_bytes, r->link_s), pg = cc_gbps(r->bytes, r->pipe_s);
    printf("source: %s (%s), %zu tensors, %s; %s\n", s->origin, s->kind, s->n, bytes, desc);
    printf("link      pinned cudaMemcpy H2D      %8.2f GB/s  (%s in %.3f s)\n", lg, link,
           r->link_s);
    double ng = 0;
    if (r->naive_skipped) {
        printf("naive     skipped: the checkpoint would not fit in host memory\n");
    } else {
        ng = cc_gbps(r->bytes, r->naive_read_s + r->naive_copy_s);
        printf("naive     read all, then copy        %8.2f GB/s  (read %.3f s, copy %.3f s)\n", ng,
               r->naive_read_s, r->naive_copy_s);
    }
    printf("pipeline  ckpt-cuda load             %8.2f GB/s  (%.3f s; copies %.3f s; %u threads, "
           "%u streams, %u slots)\n",
           pg, r->pipe_s, r->pipe_copy_s, r->pipe.threads, r->pipe.streams, r->pipe.slots);
    if (lg > 0)
        printf("pipeline / link  = %.2f\n", pg / lg);
    if (ng > 0)
        printf("pipeline / naive = %.2f\n", pg / ng);
}

int cmd_bench(const tool_opts *o)
{
    ckpt_key *key = NULL;
    int rc = tool_load_key(o, &key);
    if (rc != EXIT_OK)
        return rc;
    ckpt_err err = {0};
    cc_source *s = NULL;
    cc_backend *be = NULL;
    if (cc_source_open(o->src, key, &s, &err) < 0 ||
        cc_cuda_open(NULL, o->load.device, &be, &err) < 0 || be->ops->bind_thread(be, &err) < 0) {
        rc = tool_fail(&err);
    } else {
        cc_bench_result r;
        if (cc_bench(be, s, &o->load, &r, &err) < 0)
            rc = tool_fail(&err);
        else
            print_bench(be, s, &r);
        be->ops->unbind_thread(be);
    }
    if (be)
        be->ops->destroy(be);
    cc_source_close(s);
    ckpt_key_free(key);
    return rc;
}
