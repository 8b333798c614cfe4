/* The load pipeline and verification over the fake device: from a .tpack
 * and from a checkpoint directory, with subsets, tight pinned memory, many
 * threads, and every device fault the fake can inject. */
#include <criterion/criterion.h>
#include <errno.h>

#include "bench.h"
#include "cuda_testlib.h"
#include "fake_backend.h"
#include "load.h"

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

TestSuite(load, .init = setup, .fini = teardown);

/* Every loaded tensor holds its bytes at an aligned offset and address, and
 * padding is zero (the fake's fresh device memory is 0xA5). */
static void check_block(ckpt_cuda_ckpt *c, size_t align)
{
    uint64_t total;
    uint8_t *block = ckpt_cuda_block(c, &total);
    uint64_t cursor = 0;
    for (size_t i = 0; i < ckpt_cuda_count(c); i++) {
        const ckpt_cuda_tensor *t = ckpt_cuda_tensor_at(c, i);
        size_t k = 0;
        while (strcmp(tl_tensors[k].name, t->name) != 0)
            k++;
        cr_assert_str_eq(t->dtype, tl_tensors[k].dtype);
        cr_assert_eq(t->ndim, tl_tensors[k].ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            cr_assert_eq(t->shape[d], tl_tensors[k].shape[d]);
        cr_assert_eq(t->nbytes, tl_nbytes(k));
        cr_assert_eq(t->offset % align, 0, "%s at %llu", t->name, (unsigned long long)t->offset);
        /* The address too: the fake's allocations, like cudaMalloc's, are
         * aligned to 256 bytes and no more. */
        cr_assert_eq((uintptr_t)t->dev % align, 0, "%s at address %p", t->name, t->dev);
        cr_assert_eq((uint8_t *)t->dev, block + t->offset);
        for (uint64_t p = cursor; p < t->offset; p++)
            cr_assert_eq(block[p], 0, "padding byte %llu", (unsigned long long)p);
        uint8_t *want = tl_data(k);
        cr_assert_eq(memcmp(t->dev, want, t->nbytes), 0, "tensor %s differs", t->name);
        free(want);
        cursor = t->offset + t->nbytes;
    }
    cr_assert_eq(cursor, total);
}

static void check_clean(const fake_cfg *f)
{
    cr_assert_eq(f->live_dev, 0, "device memory leaked");
    cr_assert_eq(f->live_host, 0, "pinned memory leaked");
    cr_assert_eq(f->live_streams + f->live_events, 0);
    cr_assert_eq(f->freed_under_copy, 0);
    cr_assert_eq(f->bad_pointer, 0);
    cr_assert_eq(f->bind_depth, 0, "a thread was left bound");
    cr_assert_eq(f->opens, f->destroys);
    cr_assert_eq(f->pending_at_destroy, 0);
}

static ckpt_cuda_ckpt *load_ok(fake_cfg *f, const char *src, const ckpt_cuda_load_opts *o)
{
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    int rc = cc_load(fake_open, f, src, o, &c, &err);
    cr_assert_eq(rc, 0, "load %s: %s", src, err.msg);
    return c;
}

Test(load, pack_small_ring_many_threads)
{
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.pinned_bytes = 128 * 1024, .threads = 4, .streams = 3};
    ckpt_cuda_ckpt *c = load_ok(&f, pack, &o);
    cr_assert_eq(ckpt_cuda_count(c), TL_N);
    check_block(c, 256);
    const ckpt_cuda_stats *st = ckpt_cuda_load_stats(c);
    cr_assert_eq(st->slots, 2, "128 KiB holds two 64 KiB slots");
    cr_assert_leq(st->pinned_bytes, 128 * 1024);
    /* The parts of setup are disjoint stretches of it, each taken. */
    double parts[] = {st->open_seconds, st->device_seconds, st->alloc_seconds, st->pin_seconds};
    double parts_sum = 0;
    for (size_t i = 0; i < 4; i++) {
        cr_assert_gt(parts[i], 0, "setup part %zu timed", i);
        parts_sum += parts[i];
    }
    cr_assert_leq(parts_sum, st->setup_seconds);
    uint64_t sum = 0;
    for (size_t i = 0; i < TL_N; i++)
        sum += tl_nbytes(i);
    cr_assert_eq(st->tensor_bytes, sum);
    cr_assert_eq(f.pageable, 0, "every copy left from pinned memory");
    cr_assert_eq(f.h2d_bytes, st->device_bytes, "one copy per window, padding included");
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0);
    ckpt_cuda_free(c);
    check_clean(&f);
}

Test(load, pack_default_ring)
{
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = load_ok(&f, pack, NULL);
    check_block(c, CKPT_CUDA_DEFAULT_ALIGN);
    cr_assert_eq(ckpt_cuda_device(c), 0);
    cr_assert_not_null(ckpt_cuda_find(c, "a.w"));
    cr_assert_null(ckpt_cuda_find(c, "a"));
    ckpt_cuda_free(c);
    check_clean(&f);
}

/* A pack on S3 (tests/integration/test_s3.sh runs this with the gateway's
 * CKPT_TEST_S3_URL=s3://BUCKET/PREFIX, its endpoint and keys; skipped
 * otherwise): the same tensors, byte for byte, as from a local pack. */
Test(load, pack_from_s3)
{
    const char *url = getenv("CKPT_TEST_S3_URL");
    if (!url || !*url)
        cr_skip_test("CKPT_TEST_S3_URL is not set (tests/integration/test_s3.sh sets it)");
    ckpt_store *s;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_open(url, NULL, &s, &err), 0, "%s", err.msg);
    tl_make_pack_in(s, "cuda/fixture.tpack", NULL, 6);
    char *src = NULL;
    cr_assert(asprintf(&src, "%s/cuda/fixture.tpack", url) > 0);
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.pinned_bytes = 128 * 1024, .threads = 3, .streams = 2};
    ckpt_cuda_ckpt *c = load_ok(&f, src, &o);
    cr_assert_eq(ckpt_cuda_count(c), TL_N);
    check_block(c, 256);
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0);
    ckpt_cuda_free(c);
    check_clean(&f);
    /* A missing object fails with the store's message, before the device. */
    char *missing = NULL;
    cr_assert(asprintf(&missing, "%s/cuda/none.tpack", url) > 0);
    ckpt_cuda_ckpt *none = NULL;
    fake_cfg g = {0};
    cr_assert_lt(cc_load(fake_open, &g, missing, NULL, &none, &err), 0);
    cr_assert(strstr(err.msg, "none.tpack"), "%s", err.msg);
    cr_assert_eq(g.opens, 0, "the device was opened for a missing pack");
    free(missing);
    free(src);
    ckpt_store_free(s);
}

Test(load, stored_pack_and_big_alignment)
{
    char *raw = tu_join(dir, "raw.tpack");
    tl_make_pack(raw, NULL, 0);
    fake_cfg f = {.immediate = 1};
    ckpt_cuda_load_opts o = {.alignment = 4096, .threads = 1, .pinned_bytes = 1 << 20};
    ckpt_cuda_ckpt *c = load_ok(&f, raw, &o);
    check_block(c, 4096);
    ckpt_cuda_free(c);
    check_clean(&f);
    free(raw);
}

Test(load, subset_by_glob_and_name)
{
    fake_cfg f = {0};
    const char *sel[] = {"a.*", "tail", "empty"};
    ckpt_cuda_load_opts o = {.select = sel, .n_select = 3, .threads = 2};
    ckpt_cuda_ckpt *c = load_ok(&f, pack, &o);
    cr_assert_eq(ckpt_cuda_count(c), 4);
    const char *want[] = {"a.bias", "a.w", "empty", "tail"};
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(ckpt_cuda_tensor_at(c, i)->name, want[i]);
    cr_assert_null(ckpt_cuda_tensor_at(c, 4));
    check_block(c, 256);
    uint64_t total;
    ckpt_cuda_block(c, &total);
    cr_assert_eq(total, 768 + 98304 + 40, "a.w and tail start aligned already");
    ckpt_cuda_free(c);
    check_clean(&f);
}

Test(load, typo_in_selection_fails_before_the_device)
{
    fake_cfg f = {0};
    const char *sel[] = {"a.*", "h.0.*"};
    ckpt_cuda_load_opts o = {.select = sel, .n_select = 2};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_load(fake_open, &f, pack, &o, &c, &err), -ENOENT);
    tu_assert_contains(err.msg, "no tensor matches 'h.0.*'");
    cr_assert_null(c);
    cr_assert_eq(f.opens, 0);
}

Test(load, only_empty_tensors)
{
    fake_cfg f = {0};
    const char *sel[] = {"empty"};
    ckpt_cuda_load_opts o = {.select = sel, .n_select = 1};
    ckpt_cuda_ckpt *c = load_ok(&f, pack, &o);
    uint64_t total = 1;
    cr_assert_null(ckpt_cuda_block(c, &total));
    cr_assert_eq(total, 0);
    cr_assert_eq(ckpt_cuda_count(c), 1);
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0, "empty digest checks out");
    ckpt_cuda_free(c);
    check_clean(&f);
}

Test(load, mount_directory)
{
    char *m = tu_join(dir, "mnt");
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.pinned_bytes = 256 * 1024, .threads = 3};
    ckpt_cuda_ckpt *c = load_ok(&f, m, &o);
    cr_assert_eq(ckpt_cuda_count(c), TL_N);
    check_block(c, 256);
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0);
    ckpt_cuda_free(c);
    check_clean(&f);
    free(m);
}

/* A tensor with no tensors/ file is read from its packed file, which the
 * mount may have moved under .packed/ (its own path being one the mount
 * uses): the manifest's "mount_path" says where. It was opened at its
 * original path, which the mount shows as something else, or not at all. */
static char *move_tail_file(const char *m, json_t *mount_path_of)
{
    char *mp = tu_join(m, "manifest.json");
    json_t *root = json_load_file(mp, 0, NULL);
    cr_assert_not_null(root);
    json_t *arr = json_object_get(root, "tensors"), *e;
    size_t i;
    const char *file = NULL;
    json_array_foreach(arr, i, e) if (json_object_get(e, "file")) file =
        json_string_value(json_object_get(e, "file"));
    cr_assert_not_null(file);
    char *from = tu_join(m, file), *packed = tu_join(m, ".packed"), *to = tu_join(packed, file);
    cr_assert_eq(mkdir(packed, 0755), 0);
    cr_assert_eq(rename(from, to), 0);
    json_t *moved = mount_path_of ? mount_path_of : json_sprintf(".packed/%s", file);
    json_object_set_new(root, "files",
                        json_pack("[{s:s, s:o}]", "path", file, "mount_path", moved));
    cr_assert_eq(json_dump_file(root, mp, 0), 0);
    char *name = strdup(file);
    json_decref(root);
    free(from);
    free(packed);
    free(to);
    free(mp);
    return name;
}

Test(load, mount_file_moved_under_packed)
{
    char *m = tu_join(dir, "moved");
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    free(move_tail_file(m, NULL));
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.pinned_bytes = 256 * 1024, .threads = 2};
    ckpt_cuda_ckpt *c = load_ok(&f, m, &o);
    cr_assert_eq(ckpt_cuda_count(c), TL_N);
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0, "the moved file's tensor is right");
    ckpt_cuda_free(c);
    check_clean(&f);
    free(m);

    m = tu_join(dir, "unshown");
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    char *file = move_tail_file(m, json_null());
    ckpt_cuda_ckpt *c2 = NULL;
    ckpt_err err = {0};
    fake_cfg f2 = {0};
    cr_assert_lt(cc_load(fake_open, &f2, m, NULL, &c2, &err), 0);
    tu_assert_contains(err.msg, "the mount does not show its file");
    tu_assert_contains(err.msg, file);
    check_clean(&f2);
    free(file);
    free(m);
}

/* Rewrites one manifest entry's field and expects the load to fail. */
static void bad_manifest(const char *field, json_t *value, const char *expect)
{
    char *m = tu_join(dir, "bad");
    tu_rm_rf(m);
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    char *mp = tu_join(m, "manifest.json");
    json_t *root = json_load_file(mp, 0, NULL);
    json_t *e = json_array_get(json_object_get(root, "tensors"), 2);
    json_object_set_new(e, field, value);
    cr_assert_eq(json_dump_file(root, mp, 0), 0);
    json_decref(root);
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_lt(cc_load(fake_open, &f, m, NULL, &c, &err), 0, "expected '%s'", expect);
    tu_assert_contains(err.msg, expect);
    check_clean(&f);
    free(mp);
    free(m);
}

Test(load, mount_manifest_is_checked)
{
    bad_manifest("path", json_string("../../etc/passwd"), "unsafe path");
    bad_manifest("path", json_string("/etc/passwd"), "unsafe path");
    bad_manifest("nbytes", json_integer(12), "does not match BF16");
    bad_manifest("shape", json_string("x"), "needs name, dtype, shape and nbytes");
    bad_manifest("sha256", json_string("zz"), "bad sha256");
    bad_manifest("path", json_string("tensors/missing"), "tensors/missing: No such file");
}

Test(load, mount_short_tensor_file)
{
    char *m = tu_join(dir, "short");
    cr_assert_eq(mkdir(m, 0755), 0);
    tl_make_mount_dir(m);
    char *p = tu_join(m, "tensors/a.w");
    cr_assert_eq(truncate(p, 1000), 0);
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_load(fake_open, &f, m, NULL, &c, &err), -EIO);
    tu_assert_contains(err.msg, "tensors/a.w: file ends before");
    check_clean(&f);
    free(p);
    free(m);
}

Test(load, plain_directory_is_not_a_checkpoint)
{
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = NULL;
    ckpt_err err = {0};
    cr_assert_eq(cc_load(fake_open, &f, dir, NULL, &c, &err), -ENOENT);
    tu_assert_contains(err.msg, "no manifest.json");
    char *nope = tu_join(dir, "nope.tpack");
    cr_assert_eq(cc_load(fake_open, &f, nope, NULL, &c, &err), -ENOENT);
    tu_assert_contains(err.msg, "nope.tpack");
    cr_assert_eq(f.opens, 0, "source errors come before the device");
    free(nope);
}

typedef struct faults {
    int n;
    char name[64];
    char kind[16];
} faults;

static void on_fault(void *ud, const char *kind, const char *name, uint64_t off, const char *msg)
{
    faults *f = ud;
    f->n++;
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->kind, sizeof f->kind, "%s", kind);
}

Test(load, verify_sees_device_corruption)
{
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = load_ok(&f, pack, NULL);
    const ckpt_cuda_tensor *t = ckpt_cuda_find(c, "big");
    ((uint8_t *)t->dev)[12345] ^= 1;
    faults fl = {0};
    ckpt_err err = {0};
    cr_assert_eq(ckpt_cuda_verify(c, on_fault, &fl, &err), 1, "%s", err.msg);
    cr_assert_eq(fl.n, 1);
    cr_assert_str_eq(fl.name, "big");
    cr_assert_str_eq(fl.kind, "tensor");
    cr_assert_gt(f.d2h, 0, "verify reads the device back");
    ckpt_cuda_free(c);
    check_clean(&f);
}

static void load_fails(fake_cfg *f, const ckpt_cuda_load_opts *o, int code, const char *expect)
{
    ckpt_cuda_ckpt *c = (ckpt_cuda_ckpt *)1;
    ckpt_err err = {0};
    cr_assert_eq(cc_load(fake_open, f, pack, o, &c, &err), code, "%s", err.msg);
    cr_assert_null(c);
    tu_assert_contains(err.msg, expect);
    check_clean(f);
}

Test(load, no_driver)
{
    fake_cfg f = {.no_driver = 1};
    load_fails(&f, NULL, -ENODEV, "no CUDA device (cudaGetDeviceCount");
}

Test(load, bad_device_index)
{
    fake_cfg f = {.ndev = 2};
    ckpt_cuda_load_opts o = {.device = 3};
    load_fails(&f, &o, -ENODEV, "device 3 does not exist (2 devices)");
}

Test(load, out_of_device_memory)
{
    fake_cfg f = {.dev_capacity = 4096};
    load_fails(&f, NULL, -ENOMEM, "out of device memory allocating");
}

Test(load, out_of_pinned_memory)
{
    fake_cfg f = {.fail_host_alloc = 1};
    load_fails(&f, NULL, -ENOMEM, "pinned");
}

Test(load, copy_fails_midway)
{
    fake_cfg f = {.fail_copy_at = 4};
    ckpt_cuda_load_opts o = {.pinned_bytes = 128 * 1024, .threads = 3};
    load_fails(&f, &o, -EIO, "cudaMemcpyAsync");
}

Test(load, async_fault_midway)
{
    fake_cfg f = {.fail_wait_at = 2};
    ckpt_cuda_load_opts o = {.pinned_bytes = 128 * 1024, .threads = 2};
    load_fails(&f, &o, -EIO, "unspecified launch failure");
}

Test(load, corrupt_chunk_names_the_pack)
{
    /* Byte 300 lies in the first chunk's stored bytes (after the 128-byte
     * header), which holds the start of "emb". */
    int fd = open(pack, O_RDWR);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, 300), 1);
    b ^= 0x40;
    cr_assert_eq(pwrite(fd, &b, 1, 300), 1);
    close(fd);
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.pinned_bytes = 128 * 1024, .threads = 3};
    load_fails(&f, &o, -EIO, "fixture.tpack");
}

Test(load, encrypted_pack)
{
    uint8_t raw[CKPT_KEY_BYTES];
    memset(raw, 7, sizeof raw);
    ckpt_key *key;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_key_from_bytes(raw, &key, &err), 0);
    char *enc = tu_join(dir, "enc.tpack");
    tl_make_pack(enc, key, 6);
    fake_cfg f = {0};
    ckpt_cuda_ckpt *c = NULL;
    cr_assert_eq(cc_load(fake_open, &f, enc, NULL, &c, &err), -EACCES);
    tu_assert_contains(err.msg, "no key");
    ckpt_cuda_load_opts o = {.key = key, .threads = 2};
    c = load_ok(&f, enc, &o);
    check_block(c, 256);
    ckpt_cuda_free(c);
    check_clean(&f);
    ckpt_key_free(key);
    free(enc);
}

Test(load, bench_runs_on_any_backend)
{
    fake_cfg f = {.immediate = 1};
    cc_backend *be;
    cc_source *s;
    ckpt_err err = {0};
    cr_assert_eq(cc_source_open(pack, NULL, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(fake_open(&f, 0, &be, &err), 0);
    cr_assert_eq(be->ops->bind_thread(be, &err), 0);
    cc_bench_result r;
    ckpt_cuda_load_opts o = {.pinned_bytes = 1 << 20};
    cr_assert_eq(cc_bench(be, s, &o, &r, &err), 0, "%s", err.msg);
    cr_assert_geq(r.link_bytes, 1u << 30);
    cr_assert_eq(r.naive_skipped, 0);
    cr_assert_gt(r.pipe_s, 0);
    cr_assert_gt(f.pageable, 0, "the naive load copies from pageable memory");
    be->ops->unbind_thread(be);
    be->ops->destroy(be);
    cc_source_close(s);
    check_clean(&f);
}

/* A DCP tensor saved in two dim-0 chunks (the v5 seed: "w" from "w@0,0"
 * and "w@2,0") loads once, whole, under its FQN, as the mount shows it;
 * its chunks are not loaded again on their own. */
Test(load, assembled_tensor_loads_once_whole)
{
    const char *root = getenv("CKPT_SRCDIR") ? getenv("CKPT_SRCDIR") : ".";
    char *seed = tu_join(root, "fuzz/corpus/pack/v5-assembled.tpack");
    ckpt_pack *p;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_open(seed, NULL, &p, &e), 0, "%s", e.msg);
    long w = ckpt_tensor_find(p, "w");
    cr_assert_geq(w, 0);
    const ckpt_tensor_info *ti = ckpt_tensor_at(p, (size_t)w);
    cr_assert_eq(ti->n_parts, 2);
    uint8_t *want = malloc(ti->nbytes);
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)w, want, ti->nbytes, 0, &e), (ssize_t)ti->nbytes);
    fake_cfg f = {0};
    ckpt_cuda_load_opts o = {.threads = 2};
    ckpt_cuda_ckpt *c = load_ok(&f, seed, &o);
    cr_assert_eq(ckpt_cuda_count(c), ckpt_tensor_count(p) - 2, "no chunk twice");
    cr_assert_null(ckpt_cuda_find(c, "w@0,0"));
    const ckpt_cuda_tensor *t = ckpt_cuda_find(c, "w");
    cr_assert_not_null(t);
    cr_assert_eq(t->nbytes, ti->nbytes);
    cr_assert_eq(memcmp(t->dev, want, ti->nbytes), 0, "w differs from its parts in order");
    cr_assert_eq(ckpt_cuda_verify(c, NULL, NULL, NULL), 0);
    ckpt_cuda_free(c);
    check_clean(&f);
    ckpt_close(p);
    free(want);
    free(seed);
}
