/* ckpt_writer_add_reader: files whose bytes come from a callback pack the
 * same as from disk (safetensors and npy indexed), and a failing, short or
 * malformed source fails the add with an error naming it. */
#include "testutil.h"

#include "ckpt.h"

TU_TMPDIR_SUITE(add_reader);

typedef struct mem_source {
    const uint8_t *data;
    size_t len;
    size_t short_at; /* pretend the source ends here (0: no) */
    int fail_with;   /* return this errno for reads past byte 100 */
} mem_source;

static ssize_t mem_read(void *ud, void *buf, size_t len, uint64_t off)
{
    mem_source *m = ud;
    if (m->fail_with && off + len > 100)
        return -m->fail_with;
    size_t end = m->short_at ? m->short_at : m->len;
    if (off >= end)
        return 0;
    size_t n = end - off < len ? end - (size_t)off : len;
    /* Odd-sized reads, as a real source may return. */
    if (n > 777)
        n = 777;
    memcpy(buf, m->data + off, n);
    return (ssize_t)n;
}

/* A safetensors file with two F32 tensors. */
static uint8_t *safetensors(size_t *len)
{
    const char *head = "{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[10,10],\"data_offsets\":[400,800]}}";
    size_t hl = strlen(head);
    *len = 8 + hl + 800;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, head, hl);
    tu_fill_pattern(b + 8 + hl, 800, 9);
    return b;
}

static ckpt_writer *open_writer(const char *name)
{
    char *path = tu_join(dir, name);
    ckpt_writer *w;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &err), 0, "%s", err.msg);
    free(path);
    return w;
}

Test(add_reader, packs_like_a_file_on_disk)
{
    size_t len;
    uint8_t *st = safetensors(&len);
    char *src = tu_join(dir, "m.safetensors");
    tu_write_file(src, st, len);
    ckpt_err err = {0};

    ckpt_writer *w = open_writer("disk.tpack");
    cr_assert_eq(ckpt_writer_add_path(w, "m.safetensors", src, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &err), 0);
    w = open_writer("cb.tpack");
    mem_source m = {st, len, 0, 0};
    cr_assert_eq(
        ckpt_writer_add_reader(w, "m.safetensors", mem_read, &m, len, 0640, 1234, 5, NULL, &err), 0,
        "%s", err.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &err), 0);

    char *a = tu_join(dir, "disk.tpack"), *b = tu_join(dir, "cb.tpack");
    ckpt_pack *pa, *pb;
    cr_assert_eq(ckpt_open(a, NULL, &pa, &err), 0);
    cr_assert_eq(ckpt_open(b, NULL, &pb, &err), 0);
    cr_assert_eq(ckpt_tensor_count(pb), 2);
    cr_assert_eq(ckpt_tensor_count(pa), ckpt_tensor_count(pb));
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(memcmp(ckpt_tensor_at(pa, i)->sha256, ckpt_tensor_at(pb, i)->sha256, 32), 0);
    const ckpt_file_info *f = ckpt_file_at(pb, 0);
    cr_assert_eq(memcmp(f->sha256, ckpt_file_at(pa, 0)->sha256, 32), 0);
    cr_assert_eq(f->mode, 0640);
    cr_assert_eq(f->mtime_sec, 1234);
    cr_assert_eq(f->mtime_nsec, 5);
    ckpt_close(pa);
    ckpt_close(pb);
    free(a);
    free(b);
    free(src);
    free(st);
}

Test(add_reader, source_errors_fail_the_add)
{
    size_t len;
    uint8_t *st = safetensors(&len);
    ckpt_err err = {0};
    ckpt_writer *w = open_writer("e.tpack");
    mem_source failing = {st, len, 0, EIO};
    int rc =
        ckpt_writer_add_reader(w, "x.bin", mem_read, &failing, len, 0644, 0, 0, "ckpt/x.bin", &err);
    cr_assert_eq(rc, -EIO, "rc %d: %s", rc, err.msg);
    tu_assert_contains(err.msg, "ckpt/x.bin");
    ckpt_writer_abort(w);

    w = open_writer("s.tpack");
    mem_source short_src = {st, len, len - 10, 0};
    cr_assert_eq(
        ckpt_writer_add_reader(w, "y.bin", mem_read, &short_src, len, 0644, 0, 0, NULL, &err),
        -EIO);
    tu_assert_contains(err.msg, "shrank");
    tu_assert_contains(err.msg, "y.bin");
    ckpt_writer_abort(w);

    w = open_writer("h.tpack");
    uint8_t bad[64];
    memset(bad, 0xff, sizeof bad);
    mem_source bad_src = {bad, sizeof bad, 0, 0};
    /* A malformed header is the file's fault, not the source's: the file
     * is stored opaque (test_pack.c checks the warning), the add succeeds. */
    cr_assert_eq(ckpt_writer_add_reader(w, "z.safetensors", mem_read, &bad_src, sizeof bad, 0644, 0,
                                        0, "ckpt/z.safetensors", &err),
                 0, "%s", err.msg);
    /* A source that fails while the parser reads it still fails the add. */
    mem_source failing_st = {st, len, 0, EIO};
    rc = ckpt_writer_add_reader(w, "f.safetensors", mem_read, &failing_st, len, 0644, 0, 0,
                                "ckpt/f.safetensors", &err);
    cr_assert_eq(rc, -EIO, "rc %d: %s", rc, err.msg);
    tu_assert_contains(err.msg, "ckpt/f.safetensors");
    cr_assert_eq(ckpt_writer_add_reader(w, "n.bin", NULL, NULL, 0, 0644, 0, 0, NULL, &err),
                 -EINVAL);
    ckpt_writer_abort(w);
    free(st);
}

/* Two files with tensors of the same name: the pack never fails; the
 * later file's are named FILE/NAME. */
Test(add_reader, tensor_name_clash_is_qualified_by_file)
{
    size_t len;
    uint8_t *st = safetensors(&len);
    ckpt_writer *w = open_writer("clash.tpack");
    ckpt_err err = {0};
    mem_source a = {st, len, 0, 0}, b = {st, len, 0, 0};
    cr_assert_eq(
        ckpt_writer_add_reader(w, "model-1.safetensors", mem_read, &a, len, 0644, 0, 0, NULL, &err),
        0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_add_reader(w, "sub/model-2.safetensors", mem_read, &b, len, 0644, 0, 0,
                                        NULL, &err),
                 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &err), 0, "%s", err.msg);
    char *path = tu_join(dir, "clash.tpack");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_tensor_count(p), 4);
    long first = ckpt_tensor_find(p, "a"),
         second = ckpt_tensor_find(p, "sub/model-2.safetensors/a");
    cr_assert_geq(first, 0);
    cr_assert_geq(second, 0);
    cr_assert_eq(ckpt_tensor_at(p, (size_t)first)->file_index, 0);
    cr_assert_eq(ckpt_tensor_at(p, (size_t)second)->file_index, 1);
    cr_assert_geq(ckpt_tensor_find(p, "sub/model-2.safetensors/b"), 0);
    ckpt_close(p);
    free(path);
    free(st);
}
