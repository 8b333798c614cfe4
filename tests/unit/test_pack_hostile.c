/* Packs built to attack the reader: authentic (re-sealed) indexes with
 * malformed fields, inputs chosen against the reader's own data structures,
 * and failure paths whose messages must still name the pack. */
#include "testutil.h"
#include "ckpt.h"
#include "writer.h"

#include <signal.h>
#include <sodium.h>
#include <sys/resource.h>
#include <time.h>

TU_TMPDIR_SUITE(hostile);

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* "data.bin": 2.5 chunks of opaque bytes; "model.bin": an 8-byte prefix, then
 * tensors "w" (BF16 [40000]) and "b" (F32 [3]). 64 KiB chunks. */
static char *build_pack(void)
{
    char *path = tu_join(dir, "h.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 65536, .level = 6, .threads = 2};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    size_t n = 65536 * 2 + 30000;
    uint8_t *buf = malloc(n);
    tu_fill_pattern(buf, n, 11);
    cr_assert_eq(ckpt_writer_begin_file(w, "data.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, buf, n, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "model.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, "PREFIX!!", 8, &e), 0, "%s", e.msg);
    uint64_t sw = 40000, sb = 3;
    cr_assert_eq(ckpt_writer_begin_tensor(w, "w", "BF16", 1, &sw, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, buf, 80000, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "b", "F32", 1, &sb, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, buf, 12, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    free(buf);
    return path;
}

/* Where the record sections of a plaintext index start (FORMAT.md section 4). */
typedef struct idx_map {
    uint8_t *idx;
    size_t len;
    uint64_t nf, nt, ne, nc;
    size_t files, extents, tensors, chunks;
    size_t after_chunks; /* versions 4 and 5: the skipped, then the assembled */
} idx_map;

static size_t tensor_at(const idx_map *m, uint64_t i);

static idx_map map_index(uint8_t *idx, size_t len)
{
    idx_map m = {idx, len, 0, 0, 0, 0, 32, 0, 0, 0, 0};
    m.nf = idx[4] | (uint32_t)idx[5] << 8;
    m.nt = idx[8] | (uint32_t)idx[9] << 8;
    m.ne = rd64(idx + 16);
    m.nc = rd64(idx + 24);
    size_t pos = m.files;
    /* Version 2: 70 bytes and the path, then u8 container, u16 note_len, note. */
    for (uint64_t i = 0; i < m.nf; i++) {
        pos += 70 + (size_t)(idx[pos] | idx[pos + 1] << 8);
        pos += 3 + (size_t)(idx[pos + 1] | idx[pos + 2] << 8);
    }
    m.extents = pos;
    m.tensors = pos + 24 * m.ne;
    m.chunks = tensor_at(&m, m.nt);
    m.after_chunks = m.chunks + 24 * m.nc;
    return m;
}

/* Offset of tensor i's record. */
static size_t tensor_at(const idx_map *m, uint64_t i)
{
    size_t pos = m->tensors;
    for (uint64_t k = 0; k < i; k++) {
        size_t nlen = (size_t)(m->idx[pos] | m->idx[pos + 1] << 8);
        size_t dlen = m->idx[pos + 2 + nlen];
        size_t ndim = m->idx[pos + 3 + nlen + dlen];
        pos += 2 + nlen + 1 + dlen + 1 + 8 * ndim + 4 + 8 + 8 + 32;
    }
    return pos;
}

/* Rewrites the index of an unencrypted pack and re-seals its digest, so the
 * semantic checks behind the checksum are what gets tested. */
static void patch_index(const char *path, void (*patch)(idx_map *m))
{
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    uint8_t *ftr = b + len - 64;
    uint64_t ioff = rd64(ftr), iraw = rd64(ftr + 16);
    idx_map m = map_index(b + ioff, (size_t)iraw);
    patch(&m);
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, b, 128);
    crypto_hash_sha256_update(&st, b + ioff, iraw);
    crypto_hash_sha256_final(&st, ftr + 24);
    tu_write_file(path, b, len);
    free(b);
}

static void expect_refused(const char *path, const char *words)
{
    ckpt_pack *p = NULL;
    ckpt_err e = {0};
    int rc = ckpt_open(path, NULL, &p, &e);
    if (rc == 0)
        ckpt_close(p);
    cr_assert_eq(rc, -EIO, "must refuse with -EIO; got %d: %s", rc, e.msg);
    tu_assert_contains(e.msg, words);
    tu_assert_contains(e.msg, path);
}

/* A fresh pack from build with its index patched: the reader must refuse
 * it, naming the pack and saying words. */
static void expect_patch_refused(char *(*build)(void), void (*patch)(idx_map *m), const char *words)
{
    char *path = build();
    patch_index(path, patch);
    expect_refused(path, words);
    free(path);
}

/* ------------------------------------------------------------ footer */

/* index_stored_size just under the file size: file_size - 64 - stored wraps
 * around, and an index_offset chosen to match the wrap passed the bounds
 * check and reached pread() with a negative offset. */
Test(hostile, footer_index_size_wraps_around)
{
    char *path = build_pack();
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    uint64_t stored = len - 60;
    le64(b + len - 64, (uint64_t)len - 64 - stored); /* 2^64 - 4 */
    le64(b + len - 56, stored);
    le64(b + len - 48, stored);
    tu_write_file(path, b, len);
    free(b);
    expect_refused(path, "footer points outside the file");
    free(path);
}

/* FORMAT.md section 2: an encrypted pack's index_digest is all zero (the
 * AEAD tag authenticates the index and header). Nothing read it, so a
 * damaged byte there passed ckpt verify. */
Test(hostile, encrypted_footer_digest_must_be_zero)
{
    char *path = tu_join(dir, "e.tpack");
    uint8_t raw[CKPT_KEY_BYTES];
    memset(raw, 7, sizeof raw);
    ckpt_key *k = NULL;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_key_from_bytes(raw, &k, &e), 0, "%s", e.msg);
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 65536, .level = 6, .threads = 1, .key = k};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "a.txt", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, "hello", 5, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    for (size_t i = 0; i < 32; i++)
        cr_assert_eq(b[len - 40 + i], 0, "writers leave the digest zero");
    b[len - 40 + 5] ^= 0x10;
    tu_write_file(path, b, len);
    free(b);
    ckpt_pack *p = NULL;
    int rc = ckpt_open(path, k, &p, &e);
    if (rc == 0)
        ckpt_close(p);
    cr_assert_eq(rc, -EIO, "must refuse with -EIO; got %d: %s", rc, e.msg);
    tu_assert_contains(e.msg, "footer");
    tu_assert_contains(e.msg, path);
    ckpt_key_free(k);
    free(path);
}

/* ------------------------------------------------------------ records */

/* FORMAT.md: strings must not contain NUL. "BF16" -> "U16\0" named a valid
 * dtype of the same width, so the record was accepted as "U16". */
static void dtype_nul(idx_map *m)
{
    size_t t = tensor_at(m, 0);
    size_t nlen = (size_t)(m->idx[t] | m->idx[t + 1] << 8);
    cr_assert_eq(m->idx[t + 2 + nlen], 4);
    cr_assert_arr_eq(m->idx + t + 3 + nlen, "BF16", 4);
    memcpy(m->idx + t + 3 + nlen, "U16\0", 4);
}
Test(hostile, dtype_with_nul_refused)
{
    expect_patch_refused(build_pack, dtype_nul, "invalid dtype");
}

/* FORMAT.md: kind 0 (opaque data) has elem_size 1. */
static void data_extent_elem2(idx_map *m)
{
    uint8_t *e = m->idx + m->extents;
    cr_assert_eq(e[16], 0, "extent 0 is data.bin's opaque bytes");
    e[17] = 2;
}
Test(hostile, data_extent_with_element_size_refused)
{
    expect_patch_refused(build_pack, data_extent_elem2,
                         "extent 0 has an invalid kind or element size");
}

/* FORMAT.md: a chunk's elem_size is its extent's, whatever the codec (it is
 * part of the chunk's associated data in encrypted packs). */
static void chunk_elem4(idx_map *m)
{
    uint8_t *c = m->idx + m->chunks;
    cr_assert_neq(c[20], 2, "chunk 0 is opaque data, not byte-grouped");
    c[21] = 4;
}
Test(hostile, chunk_element_size_differs_from_extent)
{
    expect_patch_refused(build_pack, chunk_elem4, "chunk 0 element size mismatch");
}

/* ------------------------------------------------ version-2 records */

/* Offset of file i's container byte (after the 70 fixed bytes and the path). */
static size_t container_at(const idx_map *m, uint64_t i)
{
    size_t pos = m->files;
    for (uint64_t k = 0;; k++) {
        size_t c = pos + 70 + (size_t)(m->idx[pos] | m->idx[pos + 1] << 8);
        if (k == i)
            return c;
        pos = c + 3 + (size_t)(m->idx[c + 1] | m->idx[c + 2] << 8);
    }
}

/* FORMAT.md: container values above 6 are unknown. */
static void container_7(idx_map *m)
{
    m->idx[container_at(m, 1)] = 7;
}
Test(hostile, unknown_container_refused)
{
    expect_patch_refused(build_pack, container_7,
                         "index: file 'model.bin' has unknown container 7");
}

/* FORMAT.md: a note is at most 1024 bytes. */
static void note_2000(idx_map *m)
{
    size_t c = container_at(m, 0);
    m->idx[c + 1] = 2000 & 0xff;
    m->idx[c + 2] = 2000 >> 8;
}
Test(hostile, note_too_long_refused)
{
    expect_patch_refused(build_pack, note_2000,
                         "index: file 'data.bin' has a note of 2000 bytes (at most 1024)");
}

/* A pack whose one file carries the note "ok!". */
static char *note_pack(void)
{
    char *path = tu_join(dir, "n.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "f.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_set_container(w, "", "ok!", &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    return path;
}
/* FORMAT.md: notes are UTF-8 (JSON carries them). */
static void note_not_utf8(idx_map *m)
{
    size_t c = container_at(m, 0);
    cr_assert_arr_eq(m->idx + c + 3, "ok!", 3);
    m->idx[c + 4] = 0xff;
}
Test(hostile, note_not_utf8_refused)
{
    expect_patch_refused(note_pack, note_not_utf8,
                         "index: file 'f.bin' has a note that is not UTF-8");
}

/* Offset of tensor i's extent_offset field. */
static size_t extent_offset_at(const idx_map *m, uint64_t i)
{
    size_t t = tensor_at(m, i);
    size_t nlen = (size_t)(m->idx[t] | m->idx[t + 1] << 8);
    size_t dlen = m->idx[t + 2 + nlen];
    size_t ndim = m->idx[t + 3 + nlen + dlen];
    return t + 2 + nlen + 1 + dlen + 1 + 8 * ndim + 4 + 8;
}

/* FORMAT.md: a tensor's bytes lie inside its extent; an offset chosen so
 * that offset + nbytes wraps past 2^64 must not pass for "inside". */
static void view_past_extent(idx_map *m)
{
    le64(m->idx + extent_offset_at(m, 0), 2);
}
static void view_offset_wraps(idx_map *m)
{
    le64(m->idx + extent_offset_at(m, 0), UINT64_MAX - 10);
}
Test(hostile, view_out_of_bounds_refused)
{
    expect_patch_refused(
        build_pack, view_past_extent,
        "index: tensor 'w' ([2, +80000) of extent 2) lies outside its extent of 80000 bytes");
    expect_patch_refused(build_pack, view_offset_wraps, "lies outside its extent");
}

/* FORMAT.md: a tensor's dtype has its extent's element size. */
static void dtype_bool(idx_map *m)
{
    size_t t = tensor_at(m, 0);
    size_t nlen = (size_t)(m->idx[t] | m->idx[t + 1] << 8);
    cr_assert_arr_eq(m->idx + t + 3 + nlen, "BF16", 4);
    memcpy(m->idx + t + 3 + nlen, "BOOL", 4);
}
Test(hostile, view_dtype_width_differs_from_extent)
{
    expect_patch_refused(build_pack, dtype_bool,
                         "index: tensor 'w' is BOOL but its extent holds 2-byte elements");
}

/* FORMAT.md: an opaque chunk may be byte-grouped, but only by 2, 4 or 8. */
static void opaque_group_3(idx_map *m)
{
    uint8_t *c = m->idx + m->chunks;
    c[20] = 2;
    c[21] = 3;
}
Test(hostile, opaque_chunk_grouped_by_3_refused)
{
    expect_patch_refused(build_pack, opaque_group_3,
                         "index: chunk 0 has an invalid codec or stored size");
}

/* ------------------------------------- indexes built against the reader */

/* An unencrypted pack of zero-byte files with these paths, index built by
 * hand (the writer has its own rules about names). */
static char *raw_pack(const char *const *paths, size_t n)
{
    char *path = tu_join(dir, "raw.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    size_t hlen;
    uint8_t *hdr = tu_read_file(path, &hlen);
    size_t cap = 32 + 4, len = 32;
    for (size_t i = 0; i < n; i++)
        cap += 73 + strlen(paths[i]);
    uint8_t *b = calloc(1, 128 + cap + 64);
    memcpy(b, hdr, 128);
    free(hdr);
    uint8_t *idx = b + 128;
    le64(idx, 0x58444954u | (uint64_t)n << 32);
    for (size_t i = 0; i < n; i++) {
        size_t pl = strlen(paths[i]);
        idx[len] = (uint8_t)pl;
        idx[len + 1] = (uint8_t)(pl >> 8);
        memcpy(idx + len + 2, paths[i], pl);
        idx[len + 2 + pl] = 0xa4; /* mode 0644 */
        idx[len + 3 + pl] = 0x01;
        len += 73 + pl; /* mtime, size, extents, container, note 0; sha256 is not checked at open */
    }
    len += 4; /* version 5: no assembled tensors (a zero count; none skipped) */
    uint8_t *ftr = idx + len;
    le64(ftr, 128);
    le64(ftr + 8, len);
    le64(ftr + 16, len);
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, b, 128 + len);
    crypto_hash_sha256_final(&st, ftr + 24);
    memcpy(ftr + 56, "TPACKEND", 8);
    tu_write_file(path, b, 128 + len + 64);
    free(b);
    return path;
}

static double open_seconds(const char *path, int *rc, ckpt_err *e)
{
    struct timespec a, b;
    ckpt_pack *p = NULL;
    clock_gettime(CLOCK_MONOTONIC, &a);
    *rc = ckpt_open(path, NULL, &p, e);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (*rc == 0)
        ckpt_close(p);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
}

static uint64_t fnv1a_step(uint64_t h, uint8_t c)
{
    return (h ^ c) * 1099511628211ull;
}

/* Paths chosen so that an unkeyed FNV-1a agrees in its low 20 bits for all of
 * them: every insert into the path map then probed every earlier path, and
 * a 4 MB index took seconds to open (quadratic). The low bits of FNV-1a
 * depend only on the low bits of its state, so two free bytes and a computed
 * last byte hit any target. */
Test(hostile, colliding_paths_open_in_linear_time, .timeout = 60)
{
    enum { N = 50000 };
    const uint64_t mask = (1u << 20) - 1, target = 0x5a5a5;
    uint64_t inv = 1099511628211ull; /* P^-1 mod 2^64 by Newton's iteration */
    for (int i = 0; i < 6; i++)
        inv *= 2 - 1099511628211ull * inv;
    uint64_t want = (target * inv) & mask; /* state ^ last byte must equal this */
    char **paths = calloc(N, sizeof *paths);
    for (size_t i = 0; i < N; i++) {
        char *s = malloc(16);
        int n = snprintf(s, 16, "f%06zu", i);
        uint64_t h = 1469598103934665603ull;
        for (int k = 0; k < n; k++)
            h = fnv1a_step(h, (uint8_t)s[k]);
        int found = 0;
        for (int x = 1; x < 256 && !found; x++)
            for (int y = 1; y < 256 && !found; y++) {
                uint64_t g = fnv1a_step(fnv1a_step(h, (uint8_t)x), (uint8_t)y);
                unsigned z = (unsigned)((g ^ want) & 0xff);
                if (((g ^ want) & mask & ~0xffull) || z == 0 || z == '/' || x == '/' || y == '/')
                    continue;
                s[n] = (char)x;
                s[n + 1] = (char)y;
                s[n + 2] = (char)z;
                s[n + 3] = 0;
                cr_assert_eq(fnv1a_step(g, (uint8_t)z) & mask, target);
                found = 1;
            }
        cr_assert(found);
        paths[i] = s;
    }
    char *path = raw_pack((const char *const *)paths, N);
    int rc;
    ckpt_err e = {0};
    double t = open_seconds(path, &rc, &e);
    cr_assert_eq(rc, 0, "%s", e.msg);
    cr_assert_lt(t, 1.0, "opening %d colliding paths took %.2f s", N, t);
    for (size_t i = 0; i < N; i++)
        free(paths[i]);
    free(paths);
    free(path);
}

/* Paths of 2,000 one-byte components: the file/directory clash check looked
 * up every prefix of every path, quadratic in the path length (~1.5 s per
 * MB of index). */
Test(hostile, deep_paths_open_in_linear_time, .timeout = 60)
{
    enum { N = 800 };
    char **paths = calloc(N, sizeof *paths);
    for (size_t i = 0; i < N; i++) {
        char *s = malloc(4096);
        size_t n = 0;
        for (int k = 0; k < 2000; k++) {
            s[n++] = 'a';
            s[n++] = '/';
        }
        snprintf(s + n, 4096 - n, "%zu", i);
        paths[i] = s;
    }
    char *path = raw_pack((const char *const *)paths, N);
    int rc;
    ckpt_err e = {0};
    double t = open_seconds(path, &rc, &e);
    cr_assert_eq(rc, 0, "%s", e.msg);
    cr_assert_lt(t, 1.0, "opening %d deep paths took %.2f s", N, t);
    for (size_t i = 0; i < N; i++)
        free(paths[i]);
    free(paths);
    free(path);
}

/* The clash check must still see a file and a directory of the same name
 * when other names sort between them ('-' and '.' sort before '/'), and must
 * not mistake "ab" or "a-b" for a directory of "a". */
Test(hostile, file_directory_clash_found_between_neighbours)
{
    const char *ok[] = {"a-b", "a.c", "ab", "a/x", "a/y/z", "b"};
    char *path = raw_pack(ok, 6);
    int rc;
    ckpt_err e = {0};
    open_seconds(path, &rc, &e);
    cr_assert_eq(rc, 0, "%s", e.msg);
    free(path);
    const char *bad[] = {"a/y/z", "a-b", "a.c", "a\x01", "a", "a/x", "ab"};
    path = raw_pack(bad, 7);
    expect_refused(path, "'a' is both a file and a directory");
    free(path);
    const char *deep[] = {"x/y", "x/y-", "x/y/z/w", "x/y."};
    path = raw_pack(deep, 4);
    expect_refused(path, "'x/y' is both a file and a directory");
    free(path);
}

/* ------------------------------------------------------------ messages */

Test(hostile, writer_option_errors_name_the_pack)
{
    char *path = tu_join(dir, "opts.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, &(ckpt_write_opts){.chunk_size = 3000}, &w, &e),
                 -EINVAL);
    tu_assert_contains(e.msg, path);
    cr_assert_eq(ckpt_writer_open(path, NULL, &(ckpt_write_opts){.level = 10}, &w, &e), -EINVAL);
    tu_assert_contains(e.msg, path);
    cr_assert_eq(
        ckpt_writer_open(path, NULL, &(ckpt_write_opts){.cipher = CKPT_CIPHER_AES256GCM}, &w, &e),
        -EINVAL);
    tu_assert_contains(e.msg, path);
    free(path);
}

/* Out-of-memory failures on an open pack say which pack. Allocations of a
 * chunk's size are made to fail by interposing malloc, which ASan's own
 * allocator does not allow, so this runs in the plain build only. */
#if defined(__SANITIZE_ADDRESS__)
#define HOSTILE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOSTILE_ASAN 1
#endif
#endif

#ifndef HOSTILE_ASAN
extern void *__libc_malloc(size_t n);
static volatile size_t fail_malloc_from; /* 0: never fail */
void *malloc(size_t n)
{
    if (fail_malloc_from && n >= fail_malloc_from) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(n);
}

static int drop_sink(void *ud, uint64_t off, const void *d, size_t n, const ckpt_err *ce)
{
    return 0;
}
#endif

Test(hostile, out_of_memory_messages_name_the_pack)
{
#ifdef HOSTILE_ASAN
    cr_skip_test("malloc cannot be interposed under ASan");
#else
    char *path = tu_join(dir, "big.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 1u << 20, .level = 1, .threads = 1};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    size_t n = 1u << 20;
    uint16_t *v = malloc(n);
    for (size_t i = 0; i < n / 2; i++)
        v[i] = (uint16_t)(0x3c00 | (i * 2654435761u >> 24));
    uint64_t shape = n / 2;
    cr_assert_eq(ckpt_writer_begin_file(w, "t.bin", 0644, 0, 0, &e), 0);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "t", "BF16", 1, &shape, &e), 0);
    cr_assert_eq(ckpt_writer_tensor_data(w, v, n, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0);
    cr_assert_eq(ckpt_writer_write(w, "tail", 4, &e), 0);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    uint8_t small[16];
    ckpt_err e1 = {0}, e2 = {0}, e3 = {0};
    fail_malloc_from = n;
    ssize_t r1 = ckpt_file_pread(p, 0, small, 4, 5, &e1); /* bounce buffer */
    int r2 = ckpt_chunk_decode(p, 0, v, &e2);             /* byte-group scratch */
    int r3 = ckpt_file_stream(p, 0, 0, UINT64_MAX, 2, drop_sink, NULL, &e3); /* slot buffers */
    fail_malloc_from = 0;
    cr_assert_eq(r1, -ENOMEM, "%zd %s", r1, e1.msg);
    cr_assert_eq(r2, -ENOMEM, "%d %s", r2, e2.msg);
    cr_assert_eq(r3, -ENOMEM, "%d %s", r3, e3.msg);
    tu_assert_contains(e1.msg, path);
    tu_assert_contains(e2.msg, path);
    tu_assert_contains(e3.msg, path);
    ckpt_close(p);
    free(v);
    free(path);
#endif
}

/* ------------------------------------------------- writer failure paths */

/* A write error in a worker writing its chunk (here EFBIG from RLIMIT_FSIZE,
 * as with ENOSPC) must reach the producer, which may be waiting for a free slot,
 * without deadlock, naming the temporary file; abort then cleans up. */
Test(hostile, writer_output_error_stops_producer, .timeout = 30)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1u << 20, RLIM_INFINITY};
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &lim), 0);
    lim.rlim_cur = 1u << 20;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    char *path = tu_join(dir, "full.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 65536, .level = 0, .threads = 4};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    size_t n = 1u << 20;
    uint8_t *buf = malloc(n);
    tu_fill_pattern(buf, n, 5);
    int rc = ckpt_writer_begin_file(w, "a", 0644, 0, 0, &e);
    for (int i = 0; rc == 0 && i < 64; i++)
        rc = ckpt_writer_write(w, buf, n, &e);
    cr_assert_eq(rc, -EFBIG, "%d %s", rc, e.msg);
    tu_assert_contains(e.msg, "full.tpack.tmp: write failed");
    ckpt_writer_abort(w);
    char *tmp = tu_join(dir, "full.tpack.tmp");
    cr_assert_eq(access(tmp, F_OK), -1, "abort removes the temporary file");
    free(tmp);
    free(buf);
    free(path);
}

/* ------------------------------------------------------ assembled tensors */

/* "d/a" holds "w@0" and "d/b" "w@2" (F32 [2] each), chunks of "w" (F32
 * [4]), which the pack records as assembled from them; "d/b" also records
 * one skipped tensor, "s", so the assembled section is not the first after
 * the chunks. */
static char *assembled_pack(void)
{
    char *path = tu_join(dir, "as.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    uint64_t two = 2, four = 4;
    float v[2] = {1, 2};
    const char *files[2] = {"d/a", "d/b"}, *names[2] = {"w@0", "w@2"};
    for (int i = 0; i < 2; i++) {
        uint64_t off = 2 * (uint64_t)i;
        cr_assert_eq(ckpt_writer_begin_file(w, files[i], 0644, 0, 0, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_begin_tensor(w, names[i], "F32", 1, &two, &e), 0, "%s", e.msg);
        cr_assert_eq(writer_chunk_of(w, "d", "w", 1, &four, &off, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_tensor_data(w, v, sizeof v, &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
        if (i == 1)
            cr_assert_eq(writer_add_skipped(w, "s", "why", &e), 0, "%s", e.msg);
        cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    }
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_assembled_count(p), 1);
    cr_assert_eq(ckpt_skipped_count(p), 1);
    ckpt_close(p);
    return path;
}

/* After the chunks, the skipped record of "s" (12 bytes: file index, name
 * length, "s", reason length, "why"), then the assembled section
 * (FORMAT.md section 4): u32 count, then name "w" at +6, dtype "F32" at +8,
 * ndim at +11, shape at +12, part count at +20, parts at +24 and +28,
 * sha256. */
#define AS(m, k) ((m)->idx + (m)->after_chunks + 12 + (k))
static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void as_count_huge(idx_map *m)
{
    le32(AS(m, 0), UINT32_MAX);
}
static void as_part_outside(idx_map *m)
{
    le32(AS(m, 28), 7);
}
static void as_part_itself(idx_map *m)
{
    le32(AS(m, 28), 2);
}
static void as_part_twice(idx_map *m)
{
    le32(AS(m, 28), 0);
}
static void as_rows_more(idx_map *m)
{
    le64(AS(m, 12), 5);
}
static void as_rows_fewer(idx_map *m)
{
    le64(AS(m, 12), 3);
}
static void as_dtype(idx_map *m)
{
    AS(m, 8)[0] = 'I';
}
static void as_rank0(idx_map *m)
{
    AS(m, 11)[0] = 0;
}
static void as_no_parts(idx_map *m)
{
    le32(AS(m, 20), 0);
}
Test(hostile, assembled_tensors_are_checked)
{
    static const struct {
        void (*patch)(idx_map *);
        const char *words;
    } cases[] = {
        {as_count_huge, "index: assembled tensor count does not fit the index"},
        {as_part_outside, "index: assembled tensor 'w': part 1 is not a stored tensor"},
        {as_part_itself, "index: assembled tensor 'w': part 1 is not a stored tensor"},
        {as_part_twice, "index: assembled tensor 'w': part 'w@0' is already a part"},
        {as_rows_more, "index: assembled tensor 'w': its parts have 4 of its 5 rows"},
        {as_rows_fewer, "index: assembled tensor 'w': its parts have more rows than it"},
        {as_dtype, "index: assembled tensor 'w': part 'w@0' differs in dtype or trailing shape"},
        {as_rank0, "index: assembled tensor 'w' has an invalid dtype or rank"},
        {as_no_parts, "index: assembled tensor 'w' has an invalid part count"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_patch_refused(assembled_pack, cases[i].patch, cases[i].words);
}
