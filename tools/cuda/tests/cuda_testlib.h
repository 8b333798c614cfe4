/* Fixtures shared by the libckpt_cuda tests: a small checkpoint with
 * awkward tensors (crossing 64 KiB chunks, sharing chunks, empty, scalar,
 * odd sizes, two files), packed with libckpt or laid out like a ckptfs
 * checkpoint directory. Header-only, like testutil.h. */
#ifndef CUDA_TESTLIB_H
#define CUDA_TESTLIB_H

#include <jansson.h>

#include "ckpt.h"
#include "testutil.h"

typedef struct tl_tensor {
    const char *file;
    const char *name;
    const char *dtype;
    uint32_t ndim;
    uint64_t shape[3];
} tl_tensor;

static const tl_tensor tl_tensors[] = {
    {"model.bin", "emb", "F32", 2, {300, 100}},  {"model.bin", "a.bias", "BF16", 1, {384}},
    {"model.bin", "a.w", "BF16", 2, {128, 384}}, {"model.bin", "empty", "F32", 1, {0}},
    {"model.bin", "scalar", "F32", 0, {0}},      {"model.bin", "u8", "U8", 1, {3}},
    {"extra.bin", "big", "F16", 1, {200000}},    {"extra.bin", "tail", "I64", 1, {5}},
};
#define TL_N (sizeof tl_tensors / sizeof tl_tensors[0])
/* Opaque bytes at the start of each file, so tensors start unaligned. */
#define TL_LEAD 100

static inline uint64_t tl_nbytes(size_t i)
{
    const tl_tensor *t = &tl_tensors[i];
    uint64_t n = ckpt_dtype_size(t->dtype);
    for (uint32_t k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

/* Tensor i's bytes (malloc'd, at least 1 byte). */
static inline uint8_t *tl_data(size_t i)
{
    uint64_t n = tl_nbytes(i);
    uint8_t *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    tu_fill_pattern(p, n, (uint32_t)i + 1);
    return p;
}

static inline void tl_ok(int rc, const ckpt_err *err, const char *what)
{
    cr_assert_geq(rc, 0, "%s: %s", what, err->msg);
}

/* Packs the fixture with 64 KiB chunks, so chunks straddle tensors. */
/* The fixture's files and tensors into w, then finish. */
static inline void tl_write_pack(ckpt_writer *w)
{
    ckpt_err err = {0};
    const char *open_file = NULL;
    uint8_t lead[TL_LEAD];
    memset(lead, 'x', sizeof lead);
    for (size_t i = 0; i < TL_N; i++) {
        const tl_tensor *t = &tl_tensors[i];
        if (!open_file || strcmp(open_file, t->file) != 0) {
            if (open_file)
                tl_ok(ckpt_writer_end_file(w, &err), &err, "end_file");
            tl_ok(ckpt_writer_begin_file(w, t->file, 0644, 0, 0, &err), &err, "begin_file");
            tl_ok(ckpt_writer_write(w, lead, sizeof lead, &err), &err, "write");
            open_file = t->file;
        }
        tl_ok(ckpt_writer_begin_tensor(w, t->name, t->dtype, t->ndim, t->shape, &err), &err,
              "begin_tensor");
        uint8_t *d = tl_data(i);
        /* In two pieces, as a streaming producer would. */
        uint64_t n = tl_nbytes(i), half = n / 2;
        tl_ok(ckpt_writer_tensor_data(w, d, half, &err), &err, "tensor_data");
        tl_ok(ckpt_writer_tensor_data(w, d + half, n - half, &err), &err, "tensor_data");
        free(d);
        tl_ok(ckpt_writer_end_tensor(w, &err), &err, "end_tensor");
    }
    tl_ok(ckpt_writer_end_file(w, &err), &err, "end_file");
    tl_ok(ckpt_writer_finish(w, NULL, &err), &err, "finish");
}

static inline void tl_make_pack(const char *path, const ckpt_key *key, int level)
{
    ckpt_write_opts o = {.chunk_size = CKPT_CHUNK_MIN, .level = level, .key = key, .threads = 2};
    ckpt_writer *w;
    ckpt_err err = {0};
    tl_ok(ckpt_writer_open(path, NULL, &o, &w, &err), &err, "writer_open");
    tl_write_pack(w);
}

/* The same pack as the object name in store s (an s3:// store). */
static inline void tl_make_pack_in(ckpt_store *s, const char *name, const ckpt_key *key, int level)
{
    ckpt_write_opts o = {.chunk_size = CKPT_CHUNK_MIN, .level = level, .key = key, .threads = 2};
    ckpt_writer *w;
    ckpt_err err = {0};
    tl_ok(ckpt_writer_open_in(s, name, NULL, &o, &w, &err), &err, "writer_open_in");
    tl_write_pack(w);
}

static inline json_t *tl_manifest_entry(size_t i)
{
    const tl_tensor *t = &tl_tensors[i];
    json_t *shape = json_array();
    for (uint32_t k = 0; k < t->ndim; k++)
        json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
    uint8_t *d = tl_data(i), sha[32];
    tu_sha256(d, tl_nbytes(i), sha);
    free(d);
    char hex[65];
    ckpt_hex32(sha, hex);
    return json_pack("{s:s, s:s, s:o, s:I, s:s}", "name", t->name, "dtype", t->dtype, "shape",
                     shape, "nbytes", (json_int_t)tl_nbytes(i), "sha256", hex);
}

/* A directory laid out like MOUNT/NAME of ckptfs: manifest.json, the files,
 * and tensors/<name>. Tensor "tail" has no path (as for an unnamed tensor),
 * so it is read from its file at its offset. */
static inline void tl_make_mount_dir(const char *dir)
{
    char *tdir = tu_join(dir, "tensors");
    cr_assert_eq(mkdir(tdir, 0755), 0);
    json_t *arr = json_array();
    FILE *files[2] = {NULL, NULL};
    uint64_t pos[2] = {TL_LEAD, TL_LEAD};
    for (size_t i = 0; i < TL_N; i++) {
        const tl_tensor *t = &tl_tensors[i];
        int f = strcmp(t->file, "model.bin") != 0;
        if (!files[f]) {
            char *p = tu_join(dir, t->file);
            files[f] = fopen(p, "wb");
            cr_assert_not_null(files[f]);
            for (int k = 0; k < TL_LEAD; k++)
                fputc('x', files[f]);
            free(p);
        }
        uint8_t *d = tl_data(i);
        uint64_t n = tl_nbytes(i);
        cr_assert_eq(fwrite(d, 1, n, files[f]), n);
        json_t *e = tl_manifest_entry(i);
        if (strcmp(t->name, "tail") == 0) {
            json_object_set_new(e, "file", json_string(t->file));
            json_object_set_new(e, "offset", json_integer((json_int_t)pos[f]));
        } else {
            char rel[128], *p;
            snprintf(rel, sizeof rel, "tensors/%s", t->name);
            json_object_set_new(e, "path", json_string(rel));
            p = tu_join(dir, rel);
            tu_write_file(p, d, n);
            free(p);
        }
        pos[f] += n;
        free(d);
        json_array_append_new(arr, e);
    }
    for (int f = 0; f < 2; f++)
        fclose(files[f]);
    json_t *root =
        json_pack("{s:i, s:s, s:o}", "format_version", 1, "name", "fixture", "tensors", arr);
    char *mp = tu_join(dir, "manifest.json");
    cr_assert_eq(json_dump_file(root, mp, JSON_INDENT(2)), 0);
    json_decref(root);
    free(mp);
    free(tdir);
}

#endif
