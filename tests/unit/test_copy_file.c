/* ckpt_writer_copy_file: a new generation of a pack reuses the stored
 * chunks of unchanged files. Checked: files and tensors read back exact,
 * with the same digests; unencrypted chunks are the same bytes; encrypted
 * ones are opened and sealed again under the new pack's key (a damaged one
 * fails the copy, naming it); a copy beside new files; -EXDEV where chunks
 * cannot be reused. */
#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "pack.h"
#include "testutil.h"

/* The file as it was: same path, mode and mtime. */
static int copy_as_was(ckpt_writer *w, ckpt_pack *src, size_t i, ckpt_err *err)
{
    const ckpt_file_info *f = ckpt_file_at(src, i);
    return ckpt_writer_copy_file(w, f->path, f->mode, f->mtime_sec, f->mtime_nsec, src, i, err);
}

#include <math.h>

TU_TMPDIR_SUITE(copy_file);

#define OKE(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, 0, "%s: rc %d: %s", #call, rc_, e.msg);                                  \
    } while (0)

static ckpt_key *test_key(uint8_t seed)
{
    uint8_t k[CKPT_KEY_BYTES];
    for (unsigned i = 0; i < sizeof k; i++)
        k[i] = (uint8_t)(i * 7 + seed);
    ckpt_key *key;
    ckpt_err e;
    cr_assert_eq(ckpt_key_from_bytes(k, &key, &e), 0, "%s", e.msg);
    return key;
}

static ckpt_writer *open_writer(const char *name, const ckpt_key *key, ckpt_cipher cipher,
                                uint32_t chunk_size)
{
    ckpt_write_opts o = {
        .chunk_size = chunk_size, .level = -1, .key = key, .cipher = cipher, .threads = 2};
    ckpt_writer *w;
    ckpt_err e = {0};
    char *path = tu_join(dir, name);
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    free(path);
    return w;
}

static ckpt_pack *open_pack(const char *name, const ckpt_key *key)
{
    ckpt_pack *p;
    ckpt_err e = {0};
    char *path = tu_join(dir, name);
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "%s", e.msg);
    free(path);
    return p;
}

#define NF 70000 /* floats: more than one 64 KiB chunk */
static float weights[NF];
static uint8_t text[100000];

static void fill(void)
{
    uint64_t s = 12345;
    for (size_t i = 0; i < NF; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        weights[i] = (float)(0.02 * ((double)(s >> 11) / 9007199254740992.0 - 0.5));
    }
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (uint8_t)("checkpoint "[i % 11]);
}

/* The source: an opaque file, a file with a tensor, another opaque file. */
static void write_source(const char *name, const ckpt_key *key, ckpt_cipher cipher)
{
    fill();
    ckpt_writer *w = open_writer(name, key, cipher, 65536);
    ckpt_err e = {0};
    uint64_t shape[1] = {NF};
    OKE(ckpt_writer_begin_file(w, "a.txt", 0644, 11, 12, &e));
    OKE(ckpt_writer_write(w, text, sizeof text, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_begin_file(w, "w.bin", 0600, 13, 14, &e));
    OKE(ckpt_writer_write(w, "head", 4, &e));
    OKE(ckpt_writer_begin_tensor(w, "w", "F32", 1, shape, &e));
    OKE(ckpt_writer_tensor_data(w, weights, sizeof weights, &e));
    OKE(ckpt_writer_end_tensor(w, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_begin_file(w, "z.txt", 0644, 0, 0, &e));
    OKE(ckpt_writer_write(w, text, 5000, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
}

/* Every file and tensor of b equals a's of the same name, byte for byte
 * and digest for digest; new.txt is the one written anew. */
static void expect_same_content(ckpt_pack *a, ckpt_pack *b)
{
    ckpt_err e = {0};
    for (size_t i = 0; i < ckpt_file_count(b); i++) {
        const ckpt_file_info *fb = ckpt_file_at(b, i);
        long j = ckpt_file_find(a, fb->path);
        if (strcmp(fb->path, "new.txt") == 0) {
            char got[16] = "";
            cr_assert_eq(ckpt_file_pread(b, i, got, sizeof got, 0, &e), 10, "%s", e.msg);
            cr_assert(memcmp(got, "late write", 10) == 0);
            continue;
        }
        cr_assert_geq(j, 0, "%s", fb->path);
        const ckpt_file_info *fa = ckpt_file_at(a, (size_t)j);
        cr_assert_eq(fa->size, fb->size);
        cr_assert_eq(fa->mode, fb->mode);
        cr_assert_eq(fa->mtime_sec, fb->mtime_sec);
        cr_assert(memcmp(fa->sha256, fb->sha256, 32) == 0);
        uint8_t *x = malloc(fa->size + 1), *y = malloc(fb->size + 1);
        cr_assert_eq(ckpt_file_pread(a, (size_t)j, x, fa->size, 0, &e), (ssize_t)fa->size, "%s",
                     e.msg);
        cr_assert_eq(ckpt_file_pread(b, i, y, fb->size, 0, &e), (ssize_t)fb->size, "%s", e.msg);
        cr_assert(memcmp(x, y, fa->size) == 0, "%s differs", fb->path);
        free(x);
        free(y);
    }
    cr_assert_eq(ckpt_tensor_count(b), ckpt_tensor_count(a));
    long t = ckpt_tensor_find(b, "w");
    cr_assert_geq(t, 0);
    uint8_t *x = malloc(sizeof weights);
    cr_assert_eq(ckpt_tensor_pread(b, (size_t)t, x, sizeof weights, 0, &e), (ssize_t)sizeof weights,
                 "%s", e.msg);
    cr_assert(memcmp(x, weights, sizeof weights) == 0);
    cr_assert(memcmp(ckpt_tensor_at(b, (size_t)t)->sha256, ckpt_tensor_at(a, 0)->sha256, 32) == 0);
    cr_assert_eq(ckpt_tensor_at(b, (size_t)t)->file_offset, 4);
    free(x);
    cr_assert_eq(ckpt_verify(b, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
}

/* Copies a.txt and w.bin from the source, adds a new file between them,
 * and leaves z.txt out (it was "deleted"). */
static void write_generation(ckpt_pack *src, const ckpt_key *key, ckpt_cipher cipher)
{
    ckpt_writer *w = open_writer("gen2.tpack", key, cipher, 65536);
    ckpt_err e = {0};
    OKE(copy_as_was(w, src, 0, &e));
    OKE(ckpt_writer_begin_file(w, "new.txt", 0644, 0, 0, &e));
    OKE(ckpt_writer_write(w, "late write", 10, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(copy_as_was(w, src, 1, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
}

Test(copy_file, unencrypted_chunks_are_reused_byte_for_byte)
{
    write_source("gen1.tpack", NULL, CKPT_CIPHER_NONE);
    ckpt_pack *a = open_pack("gen1.tpack", NULL);
    write_generation(a, NULL, CKPT_CIPHER_NONE);
    ckpt_pack *b = open_pack("gen2.tpack", NULL);
    cr_assert_eq(ckpt_file_count(b), 3);
    cr_assert_eq(ckpt_file_find(b, "z.txt"), -1);
    expect_same_content(a, b);
    /* w.bin's chunks: the same stored bytes, codec and CRC in both packs. */
    const file_rec *fa = &a->files[1], *fb = &b->files[ckpt_file_find(b, "w.bin")];
    cr_assert_eq(fa->n_extents, fb->n_extents);
    size_t n = 0;
    for (size_t x = 0; x < fa->n_extents; x++) {
        const extent *ea = &a->extents[fa->first_extent + x],
                     *eb = &b->extents[fb->first_extent + x];
        cr_assert_eq(ea->length, eb->length);
        cr_assert_eq(ea->kind, eb->kind);
        for (uint64_t k = 0; k * 65536 < ea->length; k++, n++) {
            const chunk *ca = &a->chunks[ea->first_chunk + k],
                        *cb = &b->chunks[eb->first_chunk + k];
            cr_assert_eq(ca->stored_size, cb->stored_size);
            cr_assert_eq(ca->codec, cb->codec);
            cr_assert_eq(ca->crc, cb->crc);
            uint8_t *x1 = malloc(ca->stored_size), *x2 = malloc(cb->stored_size);
            ckpt_err e = {0};
            cr_assert_eq(a->obj->ops->read_at(a->obj, x1, ca->stored_size, ca->offset, &e),
                         (ssize_t)ca->stored_size);
            cr_assert_eq(b->obj->ops->read_at(b->obj, x2, cb->stored_size, cb->offset, &e),
                         (ssize_t)cb->stored_size);
            cr_assert(memcmp(x1, x2, ca->stored_size) == 0);
            free(x1);
            free(x2);
        }
    }
    cr_assert_geq(n, 3, "the tensor spans several chunks");
    ckpt_close(b);
    ckpt_close(a);
}

static void encrypted_round_trip(ckpt_cipher from, ckpt_cipher to)
{
    ckpt_key *k1 = test_key(1), *k2 = test_key(2);
    write_source("gen1.tpack", k1, from);
    ckpt_pack *a = open_pack("gen1.tpack", k1);
    /* Another key even: every chunk is opened under the old pack's and
     * sealed under the new one's. */
    write_generation(a, k2, to);
    ckpt_pack *b = open_pack("gen2.tpack", k2);
    expect_same_content(a, b);
    ckpt_close(b);
    ckpt_close(a);
    ckpt_key_free(k1);
    ckpt_key_free(k2);
}

Test(copy_file, aes_gcm_chunks_are_resealed)
{
    encrypted_round_trip(CKPT_CIPHER_AES256GCM, CKPT_CIPHER_AES256GCM);
}
Test(copy_file, xchacha_to_aes_gcm)
{
    encrypted_round_trip(CKPT_CIPHER_XCHACHA20POLY1305, CKPT_CIPHER_AES256GCM);
}

Test(copy_file, a_damaged_encrypted_chunk_fails_the_copy)
{
    ckpt_key *k = test_key(1);
    write_source("gen1.tpack", k, CKPT_CIPHER_AES256GCM);
    ckpt_pack *a = open_pack("gen1.tpack", k);
    /* Flip a byte of w.bin's second chunk on disk. */
    const chunk *c = &a->chunks[a->extents[a->files[1].first_extent + 1].first_chunk + 1];
    char *path = tu_join(dir, "gen1.tpack");
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)(c->offset + 10), SEEK_SET);
    int ch = fgetc(f);
    fseek(f, (long)(c->offset + 10), SEEK_SET);
    fputc(ch ^ 1, f);
    fclose(f);
    free(path);
    ckpt_writer *w = open_writer("gen2.tpack", k, CKPT_CIPHER_AES256GCM, 65536);
    ckpt_err e = {0};
    int rc = copy_as_was(w, a, 1, &e);
    if (rc == 0)
        rc = ckpt_writer_finish(w, NULL, &e);
    else
        ckpt_writer_abort(w);
    cr_assert_eq(rc, -EIO, "rc %d: %s", rc, e.msg);
    tu_assert_contains(e.msg, "fails authentication");
    tu_assert_contains(e.msg, "w.bin");
    ckpt_close(a);
    ckpt_key_free(k);
}

Test(copy_file, chunks_that_cannot_be_reused_are_refused_with_exdev)
{
    ckpt_key *k = test_key(1);
    write_source("gen1.tpack", NULL, CKPT_CIPHER_NONE);
    ckpt_pack *a = open_pack("gen1.tpack", NULL);
    ckpt_err e = {0};
    ckpt_writer *w = open_writer("other-size.tpack", NULL, CKPT_CIPHER_NONE, 131072);
    cr_assert_eq(copy_as_was(w, a, 1, &e), -EXDEV);
    ckpt_writer_abort(w);
    w = open_writer("encrypted.tpack", k, CKPT_CIPHER_AES256GCM, 65536);
    cr_assert_eq(copy_as_was(w, a, 1, &e), -EXDEV);
    ckpt_writer_abort(w);
    /* A tensor of that name is in the new pack already. */
    w = open_writer("clash.tpack", NULL, CKPT_CIPHER_NONE, 65536);
    uint64_t shape[1] = {1};
    OKE(ckpt_writer_begin_file(w, "other.bin", 0644, 0, 0, &e));
    OKE(ckpt_writer_begin_tensor(w, "w", "F32", 1, shape, &e));
    OKE(ckpt_writer_tensor_data(w, "abcd", 4, &e));
    OKE(ckpt_writer_end_tensor(w, &e));
    OKE(ckpt_writer_end_file(w, &e));
    cr_assert_eq(copy_as_was(w, a, 1, &e), -EXDEV);
    OKE(copy_as_was(w, a, 0, &e)); /* no tensors: copied */
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_close(a);
    ckpt_key_free(k);
}
