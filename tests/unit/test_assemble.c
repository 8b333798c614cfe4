/* Assembled tensors (format version 5), through the
 * writer: chunks of one tensor, in files of one directory, become one
 * tensor named after it when they tile it along dim 0 in the order they are
 * added; gaps, overlaps, chunks out of order and chunks cut along another
 * dimension leave the chunks as they are. The assembled tensor reads as
 * the concatenation of its parts (pread, locate, verify), the mount shows
 * only it, and the manifest lists its parts. */
#include "testutil.h"
#include "ckpt.h"
#include "writer.h"

#include <jansson.h>
#include <sodium.h>

#include "read/manifest.h"
#include "read/pack_tree.h"

TU_TMPDIR_SUITE(assemble);

/* One chunk of "w" (F32, whole shape 'whole'): rows rows x cols, filled
 * with the values of the whole tensor at its place (value = row * 100 +
 * column), at offsets. */
typedef struct chunk {
    const char *file, *name;
    uint64_t rows, cols;
    uint64_t off0, off1;
} chunk;

static float value(uint64_t r, uint64_t c)
{
    return (float)(r * 100 + c);
}

/* A pack of the chunks, each in its own file, in the order given; each a
 * chunk of "w" of shape whole_rows x whole_cols in directory "ckpt". */
static char *pack_chunks(const chunk *ch, size_t n, uint64_t whole_rows, uint64_t whole_cols)
{
    char *path = tu_join(dir, "a.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 65536, .level = 6, .threads = 2};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    for (size_t i = 0; i < n; i++) {
        const chunk *c = &ch[i];
        uint64_t shape[2] = {c->rows, c->cols}, whole[2] = {whole_rows, whole_cols},
                 offs[2] = {c->off0, c->off1};
        float *v = malloc(c->rows * c->cols * sizeof *v + 1);
        for (uint64_t r = 0; r < c->rows; r++)
            for (uint64_t k = 0; k < c->cols; k++)
                v[r * c->cols + k] = value(c->off0 + r, c->off1 + k);
        cr_assert_eq(ckpt_writer_begin_file(w, c->file, 0644, 0, 0, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_write(w, "HEADER", 6, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_begin_tensor(w, c->name, "F32", 2, shape, &e), 0, "%s", e.msg);
        cr_assert_eq(writer_chunk_of(w, "ckpt", "w", 2, whole, offs, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_tensor_data(w, v, c->rows * c->cols * sizeof *v, &e), 0, "%s",
                     e.msg);
        cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
        free(v);
    }
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    return path;
}

static ckpt_pack *open_pack(const char *path)
{
    ckpt_pack *p;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    return p;
}

static void fault(void *ud, const char *kind, const char *name, uint64_t off, const char *why)
{
    (void)ud;
    (void)off;
    cr_log_error("%s %s: %s", kind, name, why);
}

/* 40000 x 3 rows over three files (1.4 MB: parts span several chunks). */
static const chunk TILE[] = {
    {"ckpt/__0_0.distcp", "w@0,0", 15000, 3, 0, 0},
    {"ckpt/__1_0.distcp", "w@15000,0", 0, 3, 15000, 0}, /* a rank with no rows */
    {"ckpt/__2_0.distcp", "w@15000,0x", 25000, 3, 15000, 0},
};

Test(assemble, dim0_chunks_in_order_become_one_tensor)
{
    char *path = pack_chunks(TILE, 3, 40000, 3);
    ckpt_pack *p = open_pack(path);
    ckpt_pack_info in;
    ckpt_info(p, &in);
    cr_assert_eq(in.format_version, 5);
    cr_assert_eq(ckpt_assembled_count(p), 1);
    cr_assert_eq(ckpt_tensor_count(p), 4);
    long wi = ckpt_tensor_find(p, "w");
    cr_assert_eq(wi, 3);
    const ckpt_tensor_info *t = ckpt_tensor_at(p, (size_t)wi);
    cr_assert_eq(t->n_parts, 3);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 40000);
    cr_assert_eq(t->nbytes, 40000 * 3 * 4);
    for (size_t k = 0; k < 3; k++) {
        cr_assert_eq(t->parts[k], k);
        cr_assert_eq(ckpt_tensor_at(p, k)->part_of, (size_t)wi);
        cr_assert_eq(ckpt_tensor_at(p, k)->n_parts, 0);
    }

    /* Its bytes: the whole tensor, read in one go and across the seam. */
    size_t n = (size_t)t->nbytes;
    float *got = malloc(n), *want = malloc(n);
    for (uint64_t r = 0; r < 40000; r++)
        for (uint64_t k = 0; k < 3; k++)
            want[r * 3 + k] = value(r, k);
    ckpt_err e = {0};
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)wi, got, n, 0, &e), (ssize_t)n, "%s", e.msg);
    cr_assert(memcmp(got, want, n) == 0);
    uint64_t seam = 15000 * 12 - 5;
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)wi, got, 10, seam, &e), 10, "%s", e.msg);
    cr_assert(memcmp(got, (uint8_t *)want + seam, 10) == 0);
    uint8_t digest[32];
    crypto_hash_sha256(digest, (const uint8_t *)want, n);
    cr_assert(memcmp(digest, t->sha256, 32) == 0, "the sha256 is that of the assembled bytes");

    size_t fi;
    uint64_t at, run;
    cr_assert_eq(ckpt_tensor_locate(p, (size_t)wi, 15000 * 12, &fi, &at, &run, &e), 0, "%s", e.msg);
    cr_assert_eq(fi, 2, "the empty part is passed over");
    cr_assert_eq(at, 6);
    cr_assert_eq(run, 25000 * 12);
    cr_assert_eq(ckpt_tensor_locate(p, (size_t)wi, n, &fi, &at, &run, &e), -EINVAL);

    cr_assert_eq(ckpt_verify(p, 2, fault, NULL, NULL, NULL, &e), 0, "%s", e.msg);

    /* The mount shows w alone; the manifest lists its parts. */
    pack_tree *tree;
    cr_assert_eq(pack_tree_build(p, "a", 0, 0, &tree), 0);
    uint32_t tdir = pack_tree_lookup(tree, TREE_ROOT, "tensors");
    cr_assert_neq(pack_tree_lookup(tree, tdir, "w"), TREE_NONE);
    cr_assert_eq(pack_tree_lookup(tree, tdir, "w@0,0"), TREE_NONE);
    char *text;
    size_t len;
    cr_assert_eq(manifest_build(p, "a", tree, &text, &len), 0);
    json_error_t je;
    json_t *m = json_loads(text, 0, &je);
    cr_assert_not_null(m, "%s", je.text);
    json_t *tensors = json_object_get(m, "tensors");
    cr_assert_eq(json_array_size(tensors), 1);
    json_t *tw = json_array_get(tensors, 0);
    cr_assert_str_eq(json_string_value(json_object_get(tw, "name")), "w");
    cr_assert(json_is_null(json_object_get(tw, "file")));
    json_t *parts = json_object_get(tw, "parts");
    cr_assert_eq(json_array_size(parts), 3);
    json_t *p2 = json_array_get(parts, 2);
    cr_assert_str_eq(json_string_value(json_object_get(p2, "name")), "w@15000,0x");
    cr_assert_str_eq(json_string_value(json_object_get(p2, "file")), "ckpt/__2_0.distcp");
    cr_assert_eq(json_integer_value(json_object_get(p2, "row")), 15000);
    cr_assert_eq(json_integer_value(json_object_get(p2, "offset")), 6);
    cr_assert_eq(json_array_size(json_object_get(m, "skipped")), 0);
    json_decref(m);
    free(text);
    pack_tree_free(tree);

    free(got);
    free(want);
    ckpt_close(p);
    free(path);
}

/* Packs the chunks and expects no assembled tensor: each chunk keeps its
 * name and its place under tensors/. */
static void expect_kept(const chunk *ch, size_t n, uint64_t rows, uint64_t cols)
{
    char *path = pack_chunks(ch, n, rows, cols);
    ckpt_pack *p = open_pack(path);
    cr_assert_eq(ckpt_assembled_count(p), 0);
    cr_assert_eq(ckpt_tensor_count(p), n);
    cr_assert_eq(ckpt_tensor_find(p, "w"), -1);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ckpt_tensor_at(p, i)->part_of, SIZE_MAX);
    ckpt_err e = {0};
    cr_assert_eq(ckpt_verify(p, 2, fault, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(path);
}

Test(assemble, gaps_overlaps_order_and_other_dims_are_kept_apart)
{
    const chunk gap[] = {{"ckpt/a", "w@0,0", 2, 3, 0, 0}, {"ckpt/b", "w@3,0", 1, 3, 3, 0}};
    expect_kept(gap, 2, 4, 3);
    const chunk overlap[] = {{"ckpt/a", "w@0,0", 2, 3, 0, 0}, {"ckpt/b", "w@1,0", 3, 3, 1, 0}};
    expect_kept(overlap, 2, 4, 3);
    const chunk short_of[] = {{"ckpt/a", "w@0,0", 2, 3, 0, 0}, {"ckpt/b", "w@2,0", 1, 3, 2, 0}};
    expect_kept(short_of, 2, 4, 3);
    const chunk reversed[] = {{"ckpt/a", "w@2,0", 2, 3, 2, 0}, {"ckpt/b", "w@0,0", 2, 3, 0, 0}};
    expect_kept(reversed, 2, 4, 3);
    const chunk dim1[] = {{"ckpt/a", "w@0,0", 4, 2, 0, 0}, {"ckpt/b", "w@0,2", 4, 1, 0, 2}};
    expect_kept(dim1, 2, 4, 3);
    const chunk both[] = {{"ckpt/a", "w@0,0", 2, 3, 0, 0},
                          {"ckpt/b", "w@2,0", 2, 2, 2, 0},
                          {"ckpt/c", "w@2,2", 2, 1, 2, 2}};
    expect_kept(both, 3, 4, 3);
}

Test(assemble, a_name_taken_by_a_tensor_is_not_assembled_over)
{
    char *path = tu_join(dir, "t.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    uint64_t one[1] = {2}, whole[1] = {4}, o0[1] = {0}, o2[1] = {2};
    float v[2] = {1, 2};
    cr_assert_eq(ckpt_writer_begin_file(w, "x", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "w", "F32", 1, one, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, v, 8, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "w@0", "F32", 1, one, &e), 0, "%s", e.msg);
    cr_assert_eq(writer_chunk_of(w, "", "w", 1, whole, o0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, v, 8, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "w@2", "F32", 1, one, &e), 0, "%s", e.msg);
    cr_assert_eq(writer_chunk_of(w, "", "w", 1, whole, o2, &e), 0, "%s", e.msg);
    /* too late: its bytes have begun */
    cr_assert_eq(ckpt_writer_tensor_data(w, v, 4, &e), 0, "%s", e.msg);
    cr_assert_eq(writer_chunk_of(w, "", "w", 1, whole, o2, &e), -EINVAL);
    cr_assert_eq(ckpt_writer_tensor_data(w, v + 1, 4, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p = open_pack(path);
    cr_assert_eq(ckpt_assembled_count(p), 0);
    cr_assert_eq(ckpt_tensor_at(p, (size_t)ckpt_tensor_find(p, "w"))->n_parts, 0);
    ckpt_close(p);
    free(path);
}

/* The packs of earlier versions read as before: no assembled tensors, and
 * skipped ones only from version 4 (the same DCP save packed by the version-4
 * writer keeps its two chunks of "w" apart). */
Test(assemble, older_packs_have_none)
{
    static const char *const old[] = {
        "tests/unit/fixtures/v1-plain.tpack", "tests/unit/fixtures/v2-plain.tpack",
        "fuzz/corpus/pack/v3-zstd.tpack", "fuzz/corpus/pack/v4-skipped.tpack"};
    const char *root = getenv("CKPT_SRCDIR") ? getenv("CKPT_SRCDIR") : ".";
    for (size_t i = 0; i < 4; i++) {
        char *path = tu_join(root, old[i]);
        ckpt_pack *p = open_pack(path);
        ckpt_pack_info in;
        ckpt_info(p, &in);
        cr_assert_eq(in.format_version, i + 1);
        cr_assert_eq(ckpt_assembled_count(p), 0);
        cr_assert_eq(ckpt_skipped_count(p), i == 3 ? 1 : 0);
        if (i == 3)
            cr_assert_lt(ckpt_tensor_find(p, "w"), 0, "v4 assembles nothing");
        for (size_t t = 0; t < ckpt_tensor_count(p); t++) {
            cr_assert_eq(ckpt_tensor_at(p, t)->part_of, SIZE_MAX);
            cr_assert_eq(ckpt_tensor_at(p, t)->n_parts, 0);
        }
        ckpt_err e = {0};
        cr_assert_eq(ckpt_verify(p, 1, fault, NULL, NULL, NULL, &e), 0, "%s", e.msg);
        ckpt_close(p);
        free(path);
    }
}
