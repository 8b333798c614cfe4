/* Saving "device" tensors (fake backend) as safetensors: the file must pass
 * libckpt's safetensors ingest (validated like the reference) and hold the
 * bytes the device had when the call returned. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>

#include "cuda_testlib.h"
#include "fake_backend.h"
#include "save.h"

TU_TMPDIR_SUITE(save);

/* The fixture's tensors in one "device" region, 1000 bytes apart, so the
 * save gathers from scattered pointers. */
typedef struct devset {
    uint8_t *region;
    size_t len;
    ckpt_cuda_save_tensor t[TL_N];
} devset;

static void devset_make(devset *d, fake_cfg *f)
{
    size_t len = 0;
    for (size_t i = 0; i < TL_N; i++)
        len += tl_nbytes(i) + 1000;
    d->region = malloc(len);
    d->len = len;
    memset(d->region, 0xCC, len);
    size_t pos = 0;
    for (size_t i = 0; i < TL_N; i++) {
        const tl_tensor *t = &tl_tensors[i];
        uint8_t *data = tl_data(i);
        memcpy(d->region + pos, data, tl_nbytes(i));
        free(data);
        d->t[i] = (ckpt_cuda_save_tensor){t->name, t->dtype, t->ndim, t->shape, d->region + pos};
        pos += tl_nbytes(i) + 1000;
    }
    f->dev_region = d->region;
    f->dev_region_len = len;
}

static void check_clean(const fake_cfg *f)
{
    cr_assert_eq(f->live_host, 0, "pinned memory leaked");
    cr_assert_eq(f->live_streams + f->live_events, 0);
    cr_assert_eq(f->freed_under_copy, 0);
    cr_assert_eq(f->bad_pointer, 0);
    cr_assert_eq(f->bind_depth, 0);
    cr_assert_eq(f->opens, f->destroys);
    cr_assert_eq(f->pending_at_destroy, 0);
}

/* Checks the header's framing, then packs the file with libckpt, whose
 * ingest validates it, and compares every tensor. */
static void check_file(const char *path, size_t n)
{
    size_t len;
    uint8_t *buf = tu_read_file(path, &len);
    cr_assert_geq(len, 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    cr_assert_eq(hlen % 8, 0, "data starts 8-byte aligned");
    cr_assert_eq(buf[8], '{');
    uint64_t data = 0;
    for (size_t i = 0; i < n; i++)
        data += tl_nbytes(i);
    cr_assert_eq(len, 8 + hlen + data);
    json_error_t jerr;
    json_t *root = json_loadb((char *)buf + 8, hlen, 0, &jerr);
    cr_assert_not_null(root, "header JSON: %s", jerr.text);
    /* Order as given, offsets contiguous. */
    const char *key;
    json_t *v;
    size_t i = 0;
    uint64_t pos = 0;
    json_object_foreach(root, key, v)
    {
        cr_assert_str_eq(key, tl_tensors[i].name);
        json_t *offs = json_object_get(v, "data_offsets");
        cr_assert_eq((uint64_t)json_integer_value(json_array_get(offs, 0)), pos);
        pos += tl_nbytes(i);
        cr_assert_eq((uint64_t)json_integer_value(json_array_get(offs, 1)), pos);
        i++;
    }
    cr_assert_eq(i, n);
    json_decref(root);
    free(buf);

    char *tp = tu_join(dir, "check.tpack");
    ckpt_writer *w;
    ckpt_err err = {0};
    ckpt_write_opts o = {.level = 1, .threads = 1};
    tl_ok(ckpt_writer_open(tp, NULL, &o, &w, &err), &err, "writer_open");
    tl_ok(ckpt_writer_add_path(w, "model.safetensors", path, &err), &err, "ingest");
    tl_ok(ckpt_writer_finish(w, NULL, &err), &err, "finish");
    ckpt_pack *p;
    tl_ok(ckpt_open(tp, NULL, &p, &err), &err, "open");
    cr_assert_eq(ckpt_tensor_count(p), n);
    for (size_t k = 0; k < n; k++) {
        long ti = ckpt_tensor_find(p, tl_tensors[k].name);
        cr_assert_geq(ti, 0, "%s missing", tl_tensors[k].name);
        const ckpt_tensor_info *t = ckpt_tensor_at(p, (size_t)ti);
        cr_assert_str_eq(t->dtype, tl_tensors[k].dtype);
        cr_assert_eq(t->ndim, tl_tensors[k].ndim);
        cr_assert_eq(t->nbytes, tl_nbytes(k));
        uint8_t *want = tl_data(k), *got = malloc(t->nbytes + 1);
        cr_assert_eq(ckpt_tensor_pread(p, (size_t)ti, got, t->nbytes, 0, &err), (ssize_t)t->nbytes);
        cr_assert_eq(memcmp(got, want, t->nbytes), 0, "%s differs", t->name);
        free(want);
        free(got);
    }
    ckpt_close(p);
    unlink(tp);
    free(tp);
}

static int exists(const char *path)
{
    return access(path, F_OK) == 0;
}

Test(save, roundtrip_through_safetensors_ingest)
{
    fake_cfg f = {0};
    devset d;
    devset_make(&d, &f);
    char *out = tu_join(dir, "model.safetensors");
    ckpt_cuda_save_opts o = {.pinned_bytes = 128 * 1024, .streams = 3, .fsync = 1};
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, d.t, TL_N, &o, &job, &err), 0, "%s", err.msg);
    /* The device memory is free for reuse the moment save returns. */
    memset(d.region, 0xEE, d.len);
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), 0, "%s", err.msg);
    cr_assert_geq(f.syncs, 1, "waits for the caller's kernels first");
    cr_assert_eq(f.pageable, 0, "copies land in pinned memory");
    check_clean(&f);
    check_file(out, TL_N);
    free(out);
    free(d.region);
}

Test(save, default_options_one_window)
{
    fake_cfg f = {0};
    devset d;
    devset_make(&d, &f);
    char *out = tu_join(dir, "model.safetensors");
    tu_write_str(out, "an older, longer file that must be replaced entirely ........");
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, d.t, TL_N, NULL, &job, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), 0, "%s", err.msg);
    check_clean(&f);
    check_file(out, TL_N);
    free(out);
    free(d.region);
}

Test(save, prefix_of_the_list)
{
    fake_cfg f = {0};
    devset d;
    devset_make(&d, &f);
    char *out = tu_join(dir, "two.safetensors");
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, d.t, 2, NULL, &job, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), 0, "%s", err.msg);
    check_file(out, 2);
    free(out);
    free(d.region);
}

Test(save, no_tensors_is_a_valid_empty_file)
{
    fake_cfg f = {0};
    char *out = tu_join(dir, "empty.safetensors");
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, NULL, 0, NULL, &job, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), 0, "%s", err.msg);
    check_clean(&f);
    check_file(out, 0);
    free(out);
}

static void refused(const ckpt_cuda_save_tensor *t, size_t n, const char *expect)
{
    fake_cfg f = {0};
    char *out = tu_join(dir, "bad.safetensors");
    ckpt_cuda_save_job *job = (ckpt_cuda_save_job *)1;
    ckpt_err err = {0};
    cr_assert_lt(cc_save(fake_open, &f, out, t, n, NULL, &job, &err), 0, "expected %s", expect);
    cr_assert_null(job);
    tu_assert_contains(err.msg, expect);
    cr_assert_not(exists(out), "nothing written for a bad call");
    cr_assert_eq(f.opens, 0, "checked before any device");
    free(out);
}

Test(save, bad_tensor_lists_are_refused)
{
    static uint8_t dev[64];
    uint64_t s4[] = {4}, huge[] = {UINT64_MAX / 2, 4};
    ckpt_cuda_save_tensor a = {"a", "F32", 1, s4, dev};
    ckpt_cuda_save_tensor dup[] = {a, a};
    refused(dup, 2, "tensor 'a' appears twice");
    ckpt_cuda_save_tensor t = a;
    t.dtype = "F33";
    refused(&t, 1, "unknown dtype 'F33'");
    t = a;
    t.name = "";
    refused(&t, 1, "is not allowed");
    t.name = "__metadata__";
    refused(&t, 1, "is not allowed");
    t = a;
    t.dev = NULL;
    refused(&t, 1, "no device pointer");
    t = a;
    t.shape = NULL;
    refused(&t, 1, "no shape");
    t = a;
    t.ndim = 2;
    t.shape = huge;
    refused(&t, 1, "too large");
    t = a;
    t.name = "bad\xff utf8";
    refused(&t, 1, "not valid UTF-8");
}

Test(save, no_driver)
{
    fake_cfg f = {.no_driver = 1};
    devset d;
    devset_make(&d, &f);
    char *out = tu_join(dir, "model.safetensors");
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, d.t, TL_N, NULL, &job, &err), -ENODEV);
    tu_assert_contains(err.msg, "no CUDA device");
    cr_assert_not(exists(out));
    free(out);
    free(d.region);
}

Test(save, unwritable_path)
{
    fake_cfg f = {0};
    devset d;
    devset_make(&d, &f);
    char *out = tu_join(dir, "no/such/dir/model.safetensors");
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, out, d.t, TL_N, NULL, &job, &err), -ENOENT);
    tu_assert_contains(err.msg, "no/such/dir/model.safetensors");
    check_clean(&f);
    free(out);
    free(d.region);
}

/* A fault during the copies fails either the save or the wait, never both
 * silently, and never leaves a partial file. */
static void fault_run(fake_cfg *f, const char *expect)
{
    devset d;
    devset_make(&d, f);
    char *out = tu_join(dir, "model.safetensors");
    ckpt_cuda_save_opts o = {.pinned_bytes = 128 * 1024};
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    int rc = cc_save(fake_open, f, out, d.t, TL_N, &o, &job, &err);
    if (rc == 0)
        rc = ckpt_cuda_save_wait(job, &err);
    cr_assert_lt(rc, 0);
    tu_assert_contains(err.msg, expect);
    cr_assert_not(exists(out), "partial file removed");
    check_clean(f);
    free(out);
    free(d.region);
}

Test(save, copy_fault)
{
    fake_cfg f = {.fail_copy_at = 3};
    fault_run(&f, "cudaMemcpyAsync");
}

Test(save, async_fault)
{
    fake_cfg f = {.fail_wait_at = 2};
    fault_run(&f, "unspecified launch failure");
}

Test(save, write_fault)
{
    /* The file may not grow past 64 KiB: write() fails with EFBIG. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 * 1024, 64 * 1024};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    fake_cfg f = {0};
    fault_run(&f, "File too large");
}

/* A FIFO nobody drains: the writer blocks once the pipe is full, yet the
 * save returns (every copy is done, the ring holds the rest); the error
 * that ends the write then comes from the wait, and the FIFO, not being a
 * regular file, is left in place. */
Test(save, returns_before_the_file_is_written)
{
    signal(SIGPIPE, SIG_IGN);
    fake_cfg f = {0};
    devset d;
    devset_make(&d, &f);
    char *fifo = tu_join(dir, "pipe.safetensors");
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    cr_assert_geq(rd, 0);
    ckpt_cuda_save_job *job = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_save(fake_open, &f, fifo, d.t, TL_N, NULL, &job, &err), 0, "%s", err.msg);
    memset(d.region, 0xEE, d.len);
    uint8_t head[8];
    cr_assert_eq(fcntl(rd, F_SETFL, 0), 0);
    cr_assert_eq(read(rd, head, sizeof head), 8, "the writer started");
    close(rd);
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), -EPIPE);
    tu_assert_contains(err.msg, "pipe.safetensors: Broken pipe");
    cr_assert(exists(fifo), "only regular files are removed");
    check_clean(&f);
    free(fifo);
    free(d.region);
}
