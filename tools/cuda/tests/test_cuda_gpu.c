/* libckpt_cuda on a real device. Each test that needs one checks first and
 * skips with the reason when there is none (no driver, no GPU); the
 * no-device test runs only then, and checks that every entry point fails
 * with a clear message instead of crashing. */
#include <criterion/criterion.h>
#include <errno.h>

#include "backend_cuda.h"
#include "ckpt_cuda.h"
#include "cuda_testlib.h"

static char *dir;
static char *pack;

static void setup(void)
{
    dir = tu_mkdtemp();
    pack = tu_join(dir, "fixture.tpack");
    tl_make_pack(pack, NULL, 6);
}

static void teardown(void)
{
    tu_rm_rf(dir);
    free(pack);
    free(dir);
}

TestSuite(gpu, .init = setup, .fini = teardown);

/* The number of devices, or skips the test saying why there is none. */
static int need_device(void)
{
    ckpt_err err = {0};
    int n = ckpt_cuda_device_count(&err);
    if (n < 0)
        cr_skip_test("needs a GPU: %s", err.msg);
    return n;
}

static void load_verify(const char *src, const ckpt_cuda_load_opts *o, size_t want)
{
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_cuda_load(src, o, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_cuda_count(c), want);
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, &err), 0, "%s", err.msg);
    size_t align = o && o->alignment ? o->alignment : CKPT_CUDA_DEFAULT_ALIGN;
    for (size_t i = 0; i < ckpt_cuda_count(c); i++) {
        const ckpt_cuda_tensor *t = ckpt_cuda_tensor_at(c, i);
        cr_assert_eq(t->offset % align, 0);
        cr_assert_eq((uintptr_t)t->dev % align, 0, "%s at %p", t->name, t->dev);
    }
    ckpt_cuda_free(c);
}

Test(gpu, no_device_is_a_clear_error)
{
    ckpt_err err = {0};
    if (ckpt_cuda_device_count(&err) > 0)
        cr_skip_test("a device is present");
    tu_assert_contains(err.msg, "no CUDA device");
    ckpt_cuda_ckpt *c = NULL;
    cr_assert_eq(ckpt_cuda_load(pack, NULL, &c, &err), -ENODEV);
    tu_assert_contains(err.msg, "no CUDA device");
    cr_assert_null(c);
    static uint8_t fake[4];
    uint64_t shape[] = {1};
    ckpt_cuda_save_tensor t = {"x", "F32", 1, shape, fake};
    char *out = tu_join(dir, "x.safetensors");
    ckpt_cuda_save_job *job = NULL;
    cr_assert_eq(ckpt_cuda_save(out, &t, 1, NULL, &job, &err), -ENODEV);
    tu_assert_contains(err.msg, "no CUDA device");
    cr_assert_null(job);
    cr_assert_neq(access(out, F_OK), 0, "no file without a device");
    cc_backend *be = NULL;
    cr_assert_eq(cc_cuda_open(NULL, 0, &be, &err), -ENODEV);
    cr_assert_null(be);
    free(out);
}

Test(gpu, load_and_verify_pack)
{
    need_device();
    load_verify(pack, NULL, TL_N);
    ckpt_cuda_load_opts small = {.pinned_bytes = 128 * 1024, .threads = 3, .streams = 2};
    load_verify(pack, &small, TL_N);
    const char *sel[] = {"a.*"};
    ckpt_cuda_load_opts sub = {.select = sel, .n_select = 1};
    load_verify(pack, &sub, 2);
    /* More than cudaMalloc's 256 bytes: the block's start is rounded up. */
    ckpt_cuda_load_opts wide = {.alignment = 1 << 22};
    load_verify(pack, &wide, TL_N);
}

Test(gpu, load_checkpoint_directory)
{
    need_device();
    char *m = tu_join(dir, "mnt");
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    load_verify(m, NULL, TL_N);
    free(m);
}

Test(gpu, save_then_load_round_trip)
{
    need_device();
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_cuda_load(pack, NULL, &c, &err), 0, "%s", err.msg);
    ckpt_cuda_save_tensor t[TL_N];
    for (size_t i = 0; i < TL_N; i++) {
        const ckpt_cuda_tensor *s = ckpt_cuda_tensor_at(c, i);
        t[i] = (ckpt_cuda_save_tensor){s->name, s->dtype, s->ndim, s->shape, s->dev};
    }
    char *out = tu_join(dir, "model.safetensors");
    ckpt_cuda_save_opts so = {.pinned_bytes = 128 * 1024};
    ckpt_cuda_save_job *job = NULL;
    cr_assert_eq(ckpt_cuda_save(out, t, TL_N, &so, &job, &err), 0, "%s", err.msg);
    ckpt_cuda_free(c); /* allowed as soon as save returned */
    cr_assert_eq(ckpt_cuda_save_wait(job, &err), 0, "%s", err.msg);

    char *tp = tu_join(dir, "saved.tpack");
    ckpt_writer *w;
    ckpt_write_opts wo = {.threads = 2};
    tl_ok(ckpt_writer_open(tp, NULL, &wo, &w, &err), &err, "writer_open");
    tl_ok(ckpt_writer_add_path(w, "model.safetensors", out, &err), &err, "ingest");
    tl_ok(ckpt_writer_finish(w, NULL, &err), &err, "finish");
    load_verify(tp, NULL, TL_N);
    /* And the digests are the fixture's own. */
    ckpt_pack *p;
    tl_ok(ckpt_open(tp, NULL, &p, &err), &err, "open");
    for (size_t i = 0; i < TL_N; i++) {
        const ckpt_tensor_info *ti =
            ckpt_tensor_at(p, (size_t)ckpt_tensor_find(p, tl_tensors[i].name));
        uint8_t *d = tl_data(i), sha[32];
        tu_sha256(d, tl_nbytes(i), sha);
        cr_assert_eq(memcmp(sha, ti->sha256, 32), 0, "%s", tl_tensors[i].name);
        free(d);
    }
    ckpt_close(p);
    free(tp);
    free(out);
}

Test(gpu, bad_device_index)
{
    int n = need_device();
    ckpt_cuda_load_opts o = {.device = n};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_cuda_load(pack, &o, &c, &err), -ENODEV);
    char want[64];
    snprintf(want, sizeof want, "device %d does not exist (%d device", n, n);
    tu_assert_contains(err.msg, want);
}

Test(gpu, out_of_device_memory)
{
    need_device();
    cc_backend *be;
    ckpt_err err = {0};
    cr_assert_eq(cc_cuda_open(NULL, 0, &be, &err), 0, "%s", err.msg);
    cr_assert_eq(be->ops->bind_thread(be, &err), 0, "%s", err.msg);
    void *p = NULL;
    cr_assert_eq(be->ops->dev_alloc(be, (size_t)1 << 50, &p, &err), -ENOMEM);
    tu_assert_contains(err.msg, "out of device memory allocating 1.1 PB");
    /* The failure is not sticky: the device still works. */
    cr_assert_eq(be->ops->dev_alloc(be, 1 << 20, &p, &err), 0, "%s", err.msg);
    be->ops->dev_free(be, p);
    be->ops->unbind_thread(be);
    be->ops->destroy(be);
    load_verify(pack, NULL, TL_N);
}
