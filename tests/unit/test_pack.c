/* Library-level tests of the pack format: round trips under every option,
 * and every kind of damage or hostile index a reader must refuse. */
#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include "testutil.h"
#include "ckpt.h"
#include "ckpt_internal.h"
#include "store/store.h"

#include <sodium.h>
#include <sys/prctl.h>
#include <sys/resource.h>

TU_TMPDIR_SUITE(pack);

/* Float-like data: N(0, 0.02) as bf16, so bytegroup coding is exercised. */
static void fill_bf16(uint16_t *v, size_t n, uint32_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        double u = ((s >> 11) + 0.5) / 9007199254740992.0, g = (u - 0.5) * 0.06;
        float f = (float)g;
        uint32_t b;
        memcpy(&b, &f, 4);
        v[i] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
    }
}

typedef struct fixture {
    uint8_t *opaque; /* 2.5 chunks of patterned bytes */
    size_t opaque_len;
    uint16_t *t0, *t1; /* tensors: [300, 1000] and [7] BF16 */
} fixture;

static fixture make_fixture(uint32_t chunk)
{
    fixture f;
    f.opaque_len = chunk * 2 + chunk / 2 + 3;
    f.opaque = malloc(f.opaque_len);
    tu_fill_pattern(f.opaque, f.opaque_len, 7);
    f.t0 = malloc(300 * 1000 * 2);
    f.t1 = malloc(7 * 2);
    fill_bf16(f.t0, 300 * 1000, 1);
    fill_bf16(f.t1, 7, 2);
    return f;
}

static void free_fixture(fixture *f)
{
    free(f->opaque);
    free(f->t0);
    free(f->t1);
}

/* Writes: "config.json" (small), "sub/data.bin" (opaque, multi-chunk),
 * "model.bin" (8-byte prefix, tensor t0, tensor t1, 5-byte suffix), "empty". */
static void write_pack(const char *path, const ckpt_write_opts *o, const fixture *f)
{
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, o, &w, &e), 0, "%s", e.msg);
    const char *cfg = "{\"n_layer\": 2}\n";
    cr_assert_eq(ckpt_writer_begin_file(w, "config.json", 0644, 1700000000, 5, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, cfg, strlen(cfg), &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "sub/data.bin", 0600, 1, 0, &e), 0, "%s", e.msg);
    /* In odd-sized pieces, so chunk cutting does not depend on write sizes. */
    for (size_t off = 0; off < f->opaque_len; off += 77777) {
        size_t n = f->opaque_len - off < 77777 ? f->opaque_len - off : 77777;
        cr_assert_eq(ckpt_writer_write(w, f->opaque + off, n, &e), 0, "%s", e.msg);
    }
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "model.bin", 0644, 2, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, "PREFIX!!", 8, &e), 0, "%s", e.msg);
    uint64_t s0[2] = {300, 1000}, s1[1] = {7};
    cr_assert_eq(ckpt_writer_begin_tensor(w, "layer.0/weight", "BF16", 2, s0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, f->t0, 100000, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, (uint8_t *)f->t0 + 100000, 500000, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "bias", "BF16", 1, s1, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, f->t1, 14, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, "SUFIX", 5, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "empty", 0644, 3, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    ckpt_write_stats st;
    cr_assert_eq(ckpt_writer_finish(w, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(st.n_files, 4);
    cr_assert_eq(st.n_tensors, 2);
    cr_assert_eq(st.stored_bytes, tu_file_size(path));
}

static void expect_file(ckpt_pack *p, const char *path, const void *want, size_t len)
{
    ckpt_err e = {0};
    long i = ckpt_file_find(p, path);
    cr_assert_geq(i, 0, "missing %s", path);
    const ckpt_file_info *fi = ckpt_file_at(p, (size_t)i);
    cr_assert_eq(fi->size, len, "%s size", path);
    uint8_t sha[32];
    tu_sha256(want, len, sha);
    cr_assert_arr_eq(fi->sha256, sha, 32, "%s sha256", path);
    uint8_t *buf = malloc(len + 10);
    cr_assert_eq(ckpt_file_pread(p, (size_t)i, buf, len + 10, 0, &e), (ssize_t)len, "%s", e.msg);
    cr_assert(len == 0 || memcmp(buf, want, len) == 0, "%s content", path);
    /* Odd offsets and sizes that straddle chunk boundaries. */
    for (uint64_t off = 1; off < len; off = off * 3 + 12345) {
        size_t n = (size_t)(len - off < 70001 ? len - off : 70001);
        cr_assert_eq(ckpt_file_pread(p, (size_t)i, buf, n, off, &e), (ssize_t)n, "%s", e.msg);
        cr_assert(memcmp(buf, (const uint8_t *)want + off, n) == 0, "%s at %llu", path,
                  (unsigned long long)off);
    }
    cr_assert_eq(ckpt_file_pread(p, (size_t)i, buf, 10, len, &e), 0, "read at EOF returns 0");
    free(buf);
}

/* Runs of chunks fetched at once (the mount's random reads on S3) decode
 * as each chunk read on its own does, plain, stored and encrypted. */
static void check_runs(ckpt_pack *p)
{
    ckpt_pack_info info;
    ckpt_info(p, &info);
    ckpt_err e = {0};
    uint8_t *one = malloc(info.chunk_size), *other = malloc(info.chunk_size);
    size_t runs = 0;
    for (size_t first = 0; first < info.n_chunks; runs++) {
        void *stored;
        ssize_t got = ckpt_chunks_fetch(p, first, 3, &stored, &e);
        cr_assert_gt(got, 0, "run from chunk %zu: %s", first, e.msg);
        cr_assert_leq(got, 3);
        for (size_t id = first; id < first + (size_t)got; id++) {
            memset(one, 0xA5, info.chunk_size);
            memset(other, 0xA5, info.chunk_size); /* the tail past a short chunk */
            cr_assert_eq(ckpt_chunk_decode(p, id, one, &e), 0, "%s", e.msg);
            cr_assert_eq(ckpt_chunk_decode_stored(p, first, stored, id, other, &e), 0, "%s", e.msg);
            cr_assert_arr_eq(one, other, info.chunk_size, "chunk %zu of the run from %zu", id,
                             first);
        }
        free(stored);
        first += (size_t)got;
    }
    cr_assert_lt(runs, info.n_chunks, "chunks written back to back make runs of several");
    cr_assert_lt(ckpt_chunks_fetch(p, info.n_chunks, 1, &(void *){NULL}, &e), 0);
    free(one);
    free(other);
}

static void check_pack(const char *path, const ckpt_key *key, const fixture *f)
{
    ckpt_err e = {0};
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_file_count(p), 4);
    expect_file(p, "config.json", "{\"n_layer\": 2}\n", 15);
    expect_file(p, "sub/data.bin", f->opaque, f->opaque_len);
    expect_file(p, "empty", "", 0);
    size_t mlen = 8 + 600000 + 14 + 5;
    uint8_t *model = malloc(mlen);
    memcpy(model, "PREFIX!!", 8);
    memcpy(model + 8, f->t0, 600000);
    memcpy(model + 600008, f->t1, 14);
    memcpy(model + 600022, "SUFIX", 5);
    expect_file(p, "model.bin", model, mlen);
    free(model);

    const ckpt_file_info *cfg = ckpt_file_at(p, (size_t)ckpt_file_find(p, "config.json"));
    cr_assert_eq(cfg->mode, 0644);
    cr_assert_eq(cfg->mtime_sec, 1700000000);
    cr_assert_eq(cfg->mtime_nsec, 5);
    cr_assert_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "sub/data.bin"))->mode, 0600);

    long t = ckpt_tensor_find(p, "layer.0/weight");
    cr_assert_geq(t, 0);
    const ckpt_tensor_info *ti = ckpt_tensor_at(p, (size_t)t);
    cr_assert_str_eq(ti->dtype, "BF16");
    cr_assert_eq(ti->ndim, 2);
    cr_assert_eq(ti->shape[0], 300);
    cr_assert_eq(ti->shape[1], 1000);
    cr_assert_eq(ti->nbytes, 600000);
    cr_assert_eq(ti->file_offset, 8);
    uint8_t sha[32];
    tu_sha256(f->t0, 600000, sha);
    cr_assert_arr_eq(ti->sha256, sha, 32);
    uint8_t *buf = malloc(600000);
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)t, buf, 600000, 0, &e), 600000, "%s", e.msg);
    cr_assert_arr_eq(buf, f->t0, 600000);
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)t, buf, 1000, 599500, &e), 500,
                 "short read at tensor end");
    cr_assert_arr_eq(buf, (uint8_t *)f->t0 + 599500, 500);
    free(buf);
    cr_assert_eq(ckpt_tensor_find(p, "nope"), -1);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    check_runs(p);
    ckpt_close(p);
}

static void roundtrip(ckpt_write_opts o, const ckpt_key *key)
{
    fixture f = make_fixture(o.chunk_size ? o.chunk_size : CKPT_CHUNK_DEFAULT);
    char *path = tu_join(dir, "x.tpack");
    write_pack(path, &o, &f);
    check_pack(path, key, &f);
    char *tmp = tu_join(dir, "x.tpack.tmp");
    cr_assert_eq(access(tmp, F_OK), -1, "temporary file left behind");
    free(tmp);
    free(path);
    free_fixture(&f);
}

static ckpt_key *test_key(uint8_t fill)
{
    uint8_t raw[32];
    memset(raw, fill, sizeof raw);
    ckpt_key *k;
    ckpt_err e;
    cr_assert_eq(ckpt_key_from_bytes(raw, &k, &e), 0);
    return k;
}

Test(pack, roundtrip_default)
{
    roundtrip((ckpt_write_opts){.level = -1}, NULL);
}
Test(pack, roundtrip_stored)
{
    roundtrip((ckpt_write_opts){.level = 0, .threads = 1}, NULL);
}
Test(pack, roundtrip_level9_small_chunks)
{
    roundtrip((ckpt_write_opts){.level = 9, .chunk_size = 65536, .threads = 3}, NULL);
}
/* More workers than chunks of the 600 KB tensor: most of its chunks are
 * encoded before the previous one is hashed and are parked (pack_write.c
 * hash_tensor_parts); its digest must still be its bytes' SHA-256. */
Test(pack, roundtrip_many_workers_parked_tensor_parts)
{
    for (int round = 0; round < 4; round++)
        roundtrip((ckpt_write_opts){.level = 1, .chunk_size = 65536, .threads = 16}, NULL);
    ckpt_key *k = test_key(0x5c);
    roundtrip((ckpt_write_opts){.level = -1, .key = k, .chunk_size = 65536, .threads = 16}, k);
    ckpt_key_free(k);
}
Test(pack, roundtrip_big_chunks)
{
    roundtrip((ckpt_write_opts){.level = 1, .chunk_size = 16u << 20}, NULL);
}

/* ckpt_files_decode's dest: a chunk it places is decoded there and the
 * sink gets that very pointer; one it declines (NULL) comes in the worker's
 * buffer. Every other chunk is declined, so both kinds meet in each
 * multi-chunk file, at boundaries that are not page-aligned (the tensor
 * extents start at offset 8). */
static int declined(uint64_t off)
{
    return off / 65536 % 2;
}

typedef struct placed {
    ckpt_pack *p;
    uint8_t *out[4];
    int misplaced, n_declined;
} placed;

static void *place_dest(void *ud, size_t file, uint64_t off, size_t len)
{
    placed *pl = ud;
    return declined(off) ? NULL : pl->out[file] + off;
}

static int place_sink(void *ud, size_t file, uint64_t off, const void *data, size_t len,
                      const ckpt_err *cerr)
{
    placed *pl = ud;
    if (!data)
        return -EIO;
    if (declined(off) == (data == pl->out[file] + off))
        __atomic_store_n(&pl->misplaced, 1, __ATOMIC_RELAXED);
    if (declined(off))
        memcpy(pl->out[file] + off, data, len);
    __atomic_add_fetch(&pl->n_declined, declined(off), __ATOMIC_RELAXED);
    return 0;
}

Test(pack, files_decode_into_dest)
{
    fixture f = make_fixture(65536);
    char *path = tu_join(dir, "x.tpack");
    write_pack(path, &(ckpt_write_opts){.level = 1, .chunk_size = 65536, .threads = 2}, &f);
    ckpt_err e = {0};
    placed pl = {0};
    cr_assert_eq(ckpt_open(path, NULL, &pl.p, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_file_count(pl.p), 4);
    unsigned threads[] = {1, 2, 16};
    for (size_t t = 0; t < 3; t++) {
        for (size_t i = 0; i < 4; i++)
            pl.out[i] = calloc(1, ckpt_file_at(pl.p, i)->size + 1);
        cr_assert_eq(ckpt_files_decode(pl.p, 0, 4, threads[t], place_dest, place_sink, &pl, &e), 0,
                     "%s", e.msg);
        cr_assert_eq(pl.misplaced, 0, "a sink got data elsewhere than dest said");
        cr_assert_gt(pl.n_declined, 3, "chunks in the worker's buffer too");
        pl.n_declined = 0;
        for (size_t i = 0; i < 4; i++) {
            const ckpt_file_info *fi = ckpt_file_at(pl.p, i);
            uint8_t sha[32];
            tu_sha256(pl.out[i], fi->size, sha);
            cr_assert_arr_eq(sha, fi->sha256, 32, "%s at %u threads", fi->path, threads[t]);
            free(pl.out[i]);
        }
    }
    ckpt_close(pl.p);
    free(path);
    free_fixture(&f);
}

Test(pack, roundtrip_xchacha)
{
    ckpt_key *k = test_key(1);
    roundtrip((ckpt_write_opts){.level = -1, .key = k, .chunk_size = 65536}, k);
    ckpt_key_free(k);
}

Test(pack, roundtrip_xchacha_stored)
{
    ckpt_key *k = test_key(1);
    roundtrip((ckpt_write_opts){.level = 0, .key = k, .chunk_size = 65536}, k);
    ckpt_key_free(k);
}

Test(pack, roundtrip_aes256gcm)
{
    if (!ckpt_cipher_available(CKPT_CIPHER_AES256GCM))
        cr_skip_test("AES-256-GCM not supported by this CPU");
    ckpt_key *k = test_key(2);
    roundtrip((ckpt_write_opts){.level = -1, .key = k, .cipher = CKPT_CIPHER_AES256GCM}, k);
    ckpt_key_free(k);
}

Test(pack, roundtrip_passphrase)
{
    char *pf = tu_join(dir, "pass");
    tu_write_str(pf, "correct horse battery staple\n");
    chmod(pf, 0600);
    ckpt_key *k;
    ckpt_err e;
    cr_assert_eq(ckpt_key_load_passphrase_file(pf, &k, &e), 0, "%s", e.msg);
    roundtrip((ckpt_write_opts){.level = -1, .key = k}, k);
    ckpt_pack_info info;
    char *path = tu_join(dir, "x.tpack");
    cr_assert_eq(ckpt_probe(path, &info, &e), 0, "%s", e.msg);
    cr_assert_str_eq(info.kdf, "argon2id");
    cr_assert_str_eq(info.cipher, ckpt_cipher_name(ckpt_cipher_default()),
                     "a key and no cipher: the default");
    ckpt_key_free(k);
    free(pf);
    free(path);
}

Test(pack, same_input_different_pack_ids)
{
    ckpt_key *k = test_key(3);
    fixture f = make_fixture(CKPT_CHUNK_DEFAULT);
    char *a = tu_join(dir, "a.tpack"), *b = tu_join(dir, "b.tpack");
    ckpt_write_opts o = {.level = -1, .key = k};
    write_pack(a, &o, &f);
    write_pack(b, &o, &f);
    size_t la, lb;
    uint8_t *pa = tu_read_file(a, &la), *pb = tu_read_file(b, &lb);
    cr_assert_eq(la, lb);
    /* Fresh pack ids give fresh subkeys, so no ciphertext repeats across packs. */
    cr_assert_neq(memcmp(pa + 16, pb + 16, 16), 0);
    cr_assert_neq(memcmp(pa + 200, pb + 200, 64), 0);
    free(pa);
    free(pb);
    free(a);
    free(b);
    free_fixture(&f);
    ckpt_key_free(k);
}

/* ------------------------------------------------------------ damage */

static char *small_pack(const ckpt_key *key, uint32_t chunk)
{
    fixture f = make_fixture(chunk);
    char *path = tu_join(dir, "d.tpack");
    ckpt_write_opts o = {.level = -1, .key = key, .chunk_size = chunk};
    write_pack(path, &o, &f);
    free_fixture(&f);
    return path;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x10;
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static void expect_open_fails(const char *path, const ckpt_key *key, int code, const char *words)
{
    ckpt_pack *p = (ckpt_pack *)0x1;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_open(path, key, &p, &e), code, "code %d, message: %s", e.code, e.msg);
    cr_assert_null(p);
    cr_assert_eq(e.code, code);
    cr_assert(tu_contains(e.msg, words), "message '%s' lacks '%s'", e.msg, words);
    cr_assert(tu_contains(e.msg, path), "message '%s' does not name the file", e.msg);
}

Test(pack, bad_magic)
{
    char *p = small_pack(NULL, 65536);
    flip_byte(p, 2);
    expect_open_fails(p, NULL, -EINVAL, "bad magic");
    free(p);
}

Test(pack, unknown_version)
{
    char *p = small_pack(NULL, 65536);
    int fd = open(p, O_RDWR);
    uint8_t v[4] = {CKPT_FORMAT_VERSION + 1, 0, 0, 0};
    cr_assert_eq(pwrite(fd, v, 4, 8), 4);
    close(fd);
    char want[64];
    snprintf(want, sizeof want, "unsupported format version %d", CKPT_FORMAT_VERSION + 1);
    expect_open_fails(p, NULL, -ENOTSUP, want);
    free(p);
}

Test(pack, header_bit_flip)
{
    char *p = small_pack(NULL, 65536);
    flip_byte(p, 44); /* chunk size */
    expect_open_fails(p, NULL, -EIO, "header checksum mismatch");
    free(p);
}

Test(pack, truncated)
{
    char *p = small_pack(NULL, 65536);
    uint64_t size = tu_file_size(p);
    cr_assert_eq(truncate(p, (off_t)(size - 100)), 0);
    expect_open_fails(p, NULL, -EIO, "truncated or unfinished");
    cr_assert_eq(truncate(p, 150), 0);
    expect_open_fails(p, NULL, -EIO, "truncated");
    cr_assert_eq(truncate(p, 0), 0);
    expect_open_fails(p, NULL, -EIO, "truncated");
    free(p);
}

Test(pack, index_bit_flip_plain)
{
    char *p = small_pack(NULL, 65536);
    flip_byte(p, tu_file_size(p) - 64 - 30);
    expect_open_fails(p, NULL, -EIO, "index checksum mismatch");
    free(p);
}

Test(pack, index_bit_flip_encrypted)
{
    ckpt_key *k = test_key(4);
    char *p = small_pack(k, 65536);
    flip_byte(p, tu_file_size(p) - 64 - 30);
    expect_open_fails(p, k, -EIO, "failed authentication");
    free(p);
    ckpt_key_free(k);
}

Test(pack, footer_points_outside)
{
    char *p = small_pack(NULL, 65536);
    int fd = open(p, O_RDWR);
    uint8_t big[8];
    memset(big, 0xff, 8);
    cr_assert_eq(pwrite(fd, big, 8, (off_t)(tu_file_size(p) - 64)), 8);
    close(fd);
    expect_open_fails(p, NULL, -EIO, "footer points outside");
    free(p);
}

Test(pack, wrong_and_missing_key)
{
    ckpt_key *k = test_key(5), *other = test_key(6);
    char *p = small_pack(k, 65536);
    expect_open_fails(p, other, -EACCES, "wrong key");
    expect_open_fails(p, NULL, -EACCES, "no key");
    free(p);
    ckpt_key_free(k);
    ckpt_key_free(other);
}

/* A flipped byte in chunk data fails exactly the reads that touch that chunk. */
static void corrupt_chunk_case(const ckpt_key *key, const char *words)
{
    char *path = small_pack(key, 65536);
    ckpt_err e = {0};
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "%s", e.msg);
    long fi = ckpt_file_find(p, "sub/data.bin");
    ckpt_chunk_ref ref;
    cr_assert_eq(ckpt_chunk_locate(p, (size_t)fi, 65536 + 10, &ref, &e), 0);
    ckpt_close(p);
    /* Chunks are back to back from offset 128: config.json is chunk 0, data.bin starts at chunk 1. */
    cr_assert_eq(ref.id, 2);
    fixture f = make_fixture(65536);
    /* The patterned bytes are stored raw, so chunk 2 (data.bin's second) sits
     * right after config.json's chunk and data.bin's first one. */
    uint64_t cfg_stored = key ? 15 + 16 : 15, chunk_stored = key ? 65536 + 16 : 65536;
    flip_byte(path, 128 + cfg_stored + chunk_stored + 100);
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "index is intact, open works: %s", e.msg);
    uint8_t *buf = malloc(600000);
    ssize_t r = ckpt_file_pread(p, (size_t)fi, buf, f.opaque_len, 0, &e);
    cr_assert_eq(r, -EIO);
    cr_assert(tu_contains(e.msg, words), "message: %s", e.msg);
    cr_assert(tu_contains(e.msg, "sub/data.bin"), "message names the file: %s", e.msg);
    /* Other files and the intact chunks of this one are still readable. */
    long cfg = ckpt_file_find(p, "config.json");
    cr_assert_eq(ckpt_file_pread(p, (size_t)cfg, buf, 15, 0, &e), 15, "%s", e.msg);
    long t = ckpt_tensor_find(p, "layer.0/weight");
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)t, buf, 600000, 0, &e), 600000, "%s", e.msg);
    cr_assert_arr_eq(buf, f.t0, 600000);
    cr_assert_eq(ckpt_file_pread(p, (size_t)fi, buf, 1000, 2 * 65536 + 5, &e), 1000, "%s", e.msg);
    cr_assert_arr_eq(buf, f.opaque + 2 * 65536 + 5, 1000);
    long faults = ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e);
    cr_assert_eq(faults, 2, "one chunk and its file: got %ld", faults);
    ckpt_close(p);
    free(buf);
    free(path);
    free_fixture(&f);
}

Test(pack, corrupt_chunk_plain)
{
    corrupt_chunk_case(NULL, "checksum mismatch");
}
Test(pack, corrupt_chunk_encrypted)
{
    ckpt_key *k = test_key(7);
    corrupt_chunk_case(k, "authentication failed");
    ckpt_key_free(k);
}

/* The same tensor verified by 16 workers: a part decoded before the
 * tensor's previous chunk is hashed is parked for the worker that hashes
 * that one (verify.c hash_tensor_chain), so no worker ever sleeps on a
 * tensor's chain, and the digests still match. */
Test(pack, verify_many_workers_parks_tensor_parts)
{
    fixture f = make_fixture(65536);
    char *path = tu_join(dir, "v.tpack");
    write_pack(path, &(ckpt_write_opts){.level = 1, .chunk_size = 65536, .threads = 2}, &f);
    ckpt_err e = {0};
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    unsigned long parked = 0;
    for (int round = 0; round < 8; round++) {
        ckpt_verify_stats st = {0};
        cr_assert_eq(ckpt_verify_counted(p, 16, NULL, NULL, NULL, NULL, &st, &e), 0, "%s", e.msg);
        cr_assert_eq(st.waited, 0, "round %d: %lu parts waited for their turn", round, st.waited);
        parked += st.parked;
    }
    cr_assert_gt(parked, 0, "16 workers on 10 chunks of one tensor parked nothing in 8 rounds");
    ckpt_close(p);
    free(path);
    free_fixture(&f);
}
/* A corrupt chunk inside the tensor, verified by 16 workers: the chain goes
 * past it (parked parts after it included), and the chunk, its file and
 * the tensor are reported, nothing else. */
Test(pack, verify_many_workers_corrupt_tensor_chunk)
{
    fixture f = make_fixture(65536);
    char *path = tu_join(dir, "c.tpack");
    write_pack(path, &(ckpt_write_opts){.level = 0, .chunk_size = 65536, .threads = 2}, &f);
    /* Stored raw: the tensor's bytes from 300000 on are in the file as they are. */
    size_t len;
    uint8_t *raw = tu_read_file(path, &len);
    const uint8_t *at = memmem(raw, len, (const uint8_t *)f.t0 + 300000, 256);
    cr_assert(at, "the tensor's bytes are stored as they are");
    flip_byte(path, (uint64_t)(at - raw));
    free(raw);
    ckpt_err e = {0};
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    for (int round = 0; round < 4; round++) {
        cr_assert_eq(ckpt_verify_counted(p, 16, NULL, NULL, NULL, NULL, NULL, &e), 3,
                     "the chunk, model.bin and layer.0/weight");
    }
    ckpt_close(p);
    free(path);
    free_fixture(&f);
}

/* --------------------------------------------- hostile but authentic index */

/* Rewrites the index of an unencrypted pack and re-seals its digest, to test
 * the semantic checks behind the checksum. */
static void patch_index(const char *path, void (*patch)(uint8_t *idx, size_t len))
{
    size_t len;
    uint8_t *b = tu_read_file(path, &len);
    uint8_t *ftr = b + len - 64;
    uint64_t ioff = 0, iraw = 0;
    for (int i = 7; i >= 0; i--) {
        ioff = ioff << 8 | ftr[i];
        iraw = iraw << 8 | ftr[16 + i];
    }
    patch(b + ioff, (size_t)iraw);
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, b, 128);
    crypto_hash_sha256_update(&st, b + ioff, iraw);
    crypto_hash_sha256_final(&st, ftr + 24);
    tu_write_file(path, b, len);
    free(b);
}

/* The first file record starts at byte 32: u16 path_len, then the path. */
static void path_dotdot(uint8_t *idx, size_t len)
{
    memcpy(idx + 34,
           "../"
           "xxxxxxxx",
           11);
}
static void path_absolute(uint8_t *idx, size_t len)
{
    idx[34] = '/';
}
static void path_nul(uint8_t *idx, size_t len)
{
    idx[36] = 0;
}
static void counts_huge(uint8_t *idx, size_t len)
{
    memset(idx + 24, 0xff, 8);
}
static void file_size_huge(uint8_t *idx, size_t len)
{
    size_t plen = idx[32] | idx[33] << 8;
    memset(idx + 34 + plen + 4 + 8 + 4, 0xff, 8);
}
/* small_pack's second file is "sub/data.bin": renaming the first file's
 * path bytes "config.json" to "sub/data.bi" and its length to 12 would shift
 * the record, so instead both get the same 11-byte name. */
static void duplicate_path(uint8_t *idx, size_t len)
{
    size_t p1 = idx[32] | idx[33] << 8;
    uint8_t *second = idx + 34 + p1 + 4 + 8 + 4 + 8 + 32 + 8 + 4 + 3; /* + container, empty note */
    cr_assert_eq(second[0], 12);
    memcpy(second + 2, "config.json/", 12);
}
static void chunk_offset_huge(uint8_t *idx, size_t len)
{
    /* Chunk records are the n_chunks * 24 bytes before the skipped records
     * (none here) and the version-5 assembled count (zero). */
    uint64_t nc = 0;
    for (int i = 7; i >= 0; i--)
        nc = nc << 8 | idx[24 + i];
    uint8_t *c0 = idx + len - 4 - nc * 24;
    memset(c0, 0xff, 8);
}

static void expect_patched_refused(void (*patch)(uint8_t *, size_t), const char *words)
{
    char *p = small_pack(NULL, 65536);
    patch_index(p, patch);
    ckpt_pack *pk = NULL;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_open(p, NULL, &pk, &e), -EIO, "must refuse; got %d: %s", e.code, e.msg);
    cr_assert(tu_contains(e.msg, words), "message '%s' lacks '%s'", e.msg, words);
    free(p);
}

Test(pack, index_path_dotdot)
{
    expect_patched_refused(path_dotdot, "unsafe path");
}
Test(pack, index_path_absolute)
{
    expect_patched_refused(path_absolute, "unsafe path");
}
Test(pack, index_path_nul)
{
    expect_patched_refused(path_nul, "truncated");
}
Test(pack, index_counts_overflow)
{
    expect_patched_refused(counts_huge, "record counts");
}
Test(pack, index_size_overflow)
{
    expect_patched_refused(file_size_huge, "index:");
}
Test(pack, index_trailing_slash)
{
    expect_patched_refused(duplicate_path, "unsafe path");
}

/* Two one-file records named "aa" and "ab" (or "a" and "b/c"), for renaming. */
static char *two_file_pack(const char *n1, const char *n2)
{
    char *path = tu_join(dir, "two.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, n1, 0644, 0, 0, &e), 0);
    cr_assert_eq(ckpt_writer_write(w, "x", 1, &e), 0);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0);
    cr_assert_eq(ckpt_writer_begin_file(w, n2, 0644, 0, 0, &e), 0);
    cr_assert_eq(ckpt_writer_write(w, "y", 1, &e), 0);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    return path;
}

static size_t second_path_at(const uint8_t *idx)
{
    size_t p1 = idx[32] | idx[33] << 8;
    return 34 + p1 + 4 + 8 + 4 + 8 + 32 + 8 + 4 + 3 + 2;
}
static void rename_ab_to_aa(uint8_t *idx, size_t len)
{
    idx[second_path_at(idx) + 1] = 'a';
}
static void rename_bc_to_ac(uint8_t *idx, size_t len)
{
    idx[second_path_at(idx)] = 'a';
}

static void expect_two_file_refused(const char *n1, const char *n2,
                                    void (*patch)(uint8_t *, size_t), const char *words)
{
    char *p = two_file_pack(n1, n2);
    patch_index(p, patch);
    ckpt_pack *pk = NULL;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_open(p, NULL, &pk, &e), -EIO, "must refuse; got %d: %s", e.code, e.msg);
    cr_assert(tu_contains(e.msg, words), "message '%s' lacks '%s'", e.msg, words);
    free(p);
}

Test(pack, index_duplicate_path)
{
    expect_two_file_refused("aa", "ab", rename_ab_to_aa, "duplicate file path 'aa'");
}
Test(pack, index_file_is_also_directory)
{
    expect_two_file_refused("a", "b/c", rename_bc_to_ac, "'a' is both a file and a directory");
}
Test(pack, index_chunk_offset_outside)
{
    expect_patched_refused(chunk_offset_huge, "chunk 0 is at offset");
}

/* ------------------------------------------------------- writer refusals */

Test(pack, writer_refuses_bad_names)
{
    ckpt_err e = {0};
    ckpt_writer *w;
    char *path = tu_join(dir, "w.tpack");
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    const char *bad[] = {"../x", "/abs", "a//b", "a/./b", "a/", "", "."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(ckpt_writer_begin_file(w, bad[i], 0644, 0, 0, &e), -EINVAL, "'%s' accepted",
                     bad[i]);
        cr_assert(tu_contains(e.msg, "unsafe path"), "%s", e.msg);
    }
    cr_assert_eq(ckpt_writer_begin_file(w, "a/b", 0644, 0, 0, &e), 0);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "t", "BF17", 0, NULL, &e), -EINVAL);
    cr_assert(tu_contains(e.msg, "unknown dtype 'BF17'"), "%s", e.msg);
    uint64_t huge[2] = {1ull << 40, 1ull << 40};
    cr_assert_eq(ckpt_writer_begin_tensor(w, "t", "F32", 2, huge, &e), -EINVAL);
    cr_assert(tu_contains(e.msg, "overflows"), "%s", e.msg);
    uint64_t two = 2;
    cr_assert_eq(ckpt_writer_begin_tensor(w, "t", "F32", 1, &two, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, "123456789", 9, &e), -EINVAL, "more than 8 bytes");
    cr_assert_eq(ckpt_writer_tensor_data(w, "1234", 4, &e), 0);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), -EINVAL, "short tensor accepted");
    cr_assert(tu_contains(e.msg, "got 4 of its 8 bytes"), "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, "5678", 4, &e), 0);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0);
    cr_assert_eq(ckpt_writer_begin_file(w, "a/b", 0644, 0, 0, &e), -EEXIST);
    cr_assert(tu_contains(e.msg, "duplicate path 'a/b'"), "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "a", 0644, 0, 0, &e), -EEXIST);
    cr_assert_eq(ckpt_writer_begin_file(w, "a/b/c", 0644, 0, 0, &e), -EEXIST);
    cr_assert_eq(ckpt_writer_begin_file(w, "c", 0644, 0, 0, &e), 0);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "t", "F32", 1, &two, &e), -EEXIST);
    cr_assert(tu_contains(e.msg, "duplicate tensor name 't'"), "%s", e.msg);
    ckpt_writer_abort(w);
    char *tmp = tu_join(dir, "w.tpack.tmp");
    cr_assert_eq(access(tmp, F_OK), -1, "abort removes the temporary file");
    cr_assert_eq(access(path, F_OK), -1, "abort never creates the pack");
    free(tmp);
    free(path);
}

Test(pack, writer_options_validated)
{
    ckpt_err e = {0};
    ckpt_writer *w;
    char *path = tu_join(dir, "w.tpack");
    cr_assert_eq(ckpt_writer_open(path, NULL, &(ckpt_write_opts){.chunk_size = 3000}, &w, &e),
                 -EINVAL);
    cr_assert(tu_contains(e.msg, "power of two"), "%s", e.msg);
    cr_assert_eq(ckpt_writer_open(path, NULL, &(ckpt_write_opts){.chunk_size = 32u << 20}, &w, &e),
                 -EINVAL);
    cr_assert_eq(ckpt_writer_open(path, NULL, &(ckpt_write_opts){.level = 10}, &w, &e), -EINVAL);
    cr_assert_eq(
        ckpt_writer_open(path, NULL, &(ckpt_write_opts){.cipher = CKPT_CIPHER_AES256GCM}, &w, &e),
        -EINVAL);
    cr_assert(tu_contains(e.msg, "no key"), "%s", e.msg);
    free(path);
}

/* --------------------------------------------------------- ingest via disk */

typedef struct warned {
    int n;
    char src[512], reason[512];
} warned;

/* ckpt_writer_add_tree of src into a new pack at path, opened. */
static ckpt_pack *pack_tree(const char *src, const char *path)
{
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_tree(w, src, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    return p;
}

static void on_warn(void *ud, const char *src, const char *reason)
{
    warned *w = ud;
    w->n++;
    snprintf(w->src, sizeof w->src, "%s", src);
    snprintf(w->reason, sizeof w->reason, "%s", reason);
}

Test(pack, add_tree_indexes_safetensors_and_npy)
{
    char *src = tu_join(dir, "src");
    mkdir(src, 0755);
    char *sub = tu_join(src, "npy");
    mkdir(sub, 0755);
    /* safetensors with two F32 tensors. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]}}";
    size_t hl = strlen(hdr), total = 8 + hl + 24;
    uint8_t *st = calloc(1, total);
    for (int i = 0; i < 8; i++)
        st[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(st + 8, hdr, hl);
    tu_fill_pattern(st + 8 + hl, 24, 3);
    char *stp = tu_join(src, "model.safetensors");
    tu_write_file(stp, st, total);
    /* npy v1 of 3 little-endian u16. */
    char npy[128] = "\x93NUMPY\x01\x00";
    const char *d = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
    size_t dl = 118 - 10;
    npy[8] = (char)dl;
    npy[9] = 0;
    memset(npy + 10, ' ', dl);
    memcpy(npy + 10, d, strlen(d));
    npy[10 + dl - 1] = '\n';
    memcpy(npy + 118, "\x01\x00\x02\x00\x03\x00", 6);
    char *np = tu_join(sub, "w.npy");
    tu_write_file(np, npy, 124);

    char *path = tu_join(dir, "t.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_pack *p = pack_tree(src, path);
    cr_assert_eq(ckpt_file_count(p), 2);
    cr_assert_str_eq(ckpt_file_at(p, 0)->path, "model.safetensors");
    cr_assert_str_eq(ckpt_file_at(p, 1)->path, "npy/w.npy");
    expect_file(p, "model.safetensors", st, total);
    expect_file(p, "npy/w.npy", npy, 124);
    cr_assert_eq(ckpt_tensor_count(p), 3);
    const ckpt_tensor_info *b = ckpt_tensor_at(p, (size_t)ckpt_tensor_find(p, "b"));
    cr_assert_str_eq(b->dtype, "I64");
    cr_assert_eq(b->file_offset, 8 + hl + 16);
    uint8_t got[8];
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)ckpt_tensor_find(p, "b"), got, 8, 0, &e), 8);
    cr_assert_arr_eq(got, st + 8 + hl + 16, 8);
    long wi = ckpt_tensor_find(p, "npy/w");
    cr_assert_geq(wi, 0, "npy tensor is named by its path without .npy");
    cr_assert_str_eq(ckpt_tensor_at(p, (size_t)wi)->dtype, "U16");
    cr_assert_eq(ckpt_tensor_at(p, (size_t)wi)->file_offset, 118);
    cr_assert_str_eq(ckpt_file_at(p, 0)->container, "safetensors");
    cr_assert_str_eq(ckpt_file_at(p, 0)->note, "");
    cr_assert_str_eq(ckpt_file_at(p, 1)->container, "npy");
    ckpt_close(p);

    /* A malformed safetensors header no longer fails the pack: the file is
     * stored opaque, byte-identical, with a warning that names the file and
     * the fault, given to opts.warn and kept as the file's note. */
    st[8] = '[';
    tu_write_file(stp, st, total);
    warned w_seen = {0};
    ckpt_write_opts wo = {.level = -1, .warn = on_warn, .warn_ud = &w_seen};
    cr_assert_eq(ckpt_writer_open(path, NULL, &wo, &w, &e), 0);
    cr_assert_eq(ckpt_writer_add_tree(w, src, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(w_seen.n, 1);
    cr_assert(tu_contains(w_seen.src, "model.safetensors"), "%s", w_seen.src);
    cr_assert(tu_contains(w_seen.reason, "safetensors header"), "%s", w_seen.reason);
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    expect_file(p, "model.safetensors", st, total);
    cr_assert_str_eq(ckpt_file_at(p, 0)->container, "");
    cr_assert(tu_contains(ckpt_file_at(p, 0)->note,
                          "model.safetensors: stored opaque: safetensors header"),
              "%s", ckpt_file_at(p, 0)->note);
    cr_assert_eq(ckpt_tensor_count(p), 1, "only the npy tensor is left");
    cr_assert_eq(ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    /* A symlink is refused rather than silently followed or skipped. */
    char *ln = tu_join(src, "link");
    cr_assert_eq(symlink("model.safetensors", ln), 0);
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0);
    cr_assert_eq(ckpt_writer_add_tree(w, src, &e), -ELOOP);
    cr_assert(tu_contains(e.msg, "symbolic link"), "%s", e.msg);
    ckpt_writer_abort(w);
    free(ln);
    free(st);
    free(stp);
    free(np);
    free(sub);
    free(src);
    free(path);
}

/* A safetensors key longer than a pack can name a tensor (65535 bytes): the
 * file is stored opaque with a warning, and the rest of the pack goes on
 * (the writer refused it halfway, failing the whole pack with "invalid
 * tensor name", naming neither file nor tensor). */
Test(pack, an_over_long_tensor_name_makes_its_file_opaque)
{
    size_t nl = 70000;
    char *json = malloc(nl + 128);
    cr_assert_not_null(json);
    json[0] = '{';
    json[1] = '"';
    memset(json + 2, 'a', nl);
    strcpy(json + 2 + nl, "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
    size_t jl = strlen(json), total = 8 + jl + 4;
    uint8_t *st = malloc(total);
    for (int i = 0; i < 8; i++)
        st[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    memcpy(st + 8, json, jl);
    memset(st + 8 + jl, 0, 4);
    char *src = tu_join(dir, "long"), *stp = tu_join(src, "m.safetensors");
    cr_assert_eq(mkdir(src, 0755), 0);
    tu_write_file(stp, st, total);
    char *path = tu_join(dir, "long.tpack");
    warned w_seen = {0};
    ckpt_write_opts wo = {.level = -1, .warn = on_warn, .warn_ud = &w_seen};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(path, NULL, &wo, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_tree(w, src, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(w_seen.n, 1);
    cr_assert(tu_contains(w_seen.reason, "name over 65535 bytes"), "%s", w_seen.reason);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    expect_file(p, "m.safetensors", st, total);
    cr_assert_eq(ckpt_tensor_count(p), 0);
    ckpt_close(p);
    free(json);
    free(st);
    free(stp);
    free(src);
    free(path);
}

/* A FIFO given to ckpt_writer_add_path is refused at once (the open
 * blocked until something wrote to it). */
Test(pack, a_fifo_is_refused_without_hanging, .timeout = 30)
{
    char *fifo = tu_join(dir, "fifo"), *pack = tu_join(dir, "f.tpack");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    ckpt_write_opts o = {.threads = 1};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_path(w, "fifo", fifo, &e), -EINVAL);
    tu_assert_contains(e.msg, "not a regular file");
    ckpt_writer_abort(w);
    free(fifo);
    free(pack);
}

/* A file rewritten while it is packed, its mtime then put back (rsync
 * --inplace -t does so): the ctime still tells, and the pack fails rather
 * than store a file torn between two versions. */
struct rewrite_ctx {
    const char *path;
    int done;
};

static void rewrite_once(void *ud, uint64_t done, uint64_t total)
{
    struct rewrite_ctx *r = ud;
    (void)done;
    (void)total;
    if (r->done++)
        return;
    struct stat st;
    int fd = open(r->path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fstat(fd, &st), 0);
    usleep(20000); /* a ctime tick later */
    cr_assert_eq(pwrite(fd, "!", 1, 0), 1);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    cr_assert_eq(futimens(fd, ts), 0);
    close(fd);
}

Test(pack, a_file_rewritten_with_its_mtime_put_back_fails_the_pack)
{
    char *src = tu_join(dir, "w.bin"), *pack = tu_join(dir, "w.tpack");
    uint8_t *data = malloc(1u << 20);
    tu_fill_pattern(data, 1u << 20, 5);
    tu_write_file(src, data, 1u << 20);
    struct rewrite_ctx r = {src, 0};
    ckpt_write_opts o = {
        .threads = 1, .chunk_size = CKPT_CHUNK_MIN, .progress = rewrite_once, .progress_ud = &r};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_path(w, "w.bin", src, &e), -EAGAIN, "%s", e.msg);
    tu_assert_contains(e.msg, "changed while being packed");
    cr_assert(r.done > 0, "the file was rewritten during the pack");
    ckpt_writer_abort(w);
    free(data);
    free(src);
    free(pack);
}

Test(pack, keys, .timeout = 30)
{
    char *kf = tu_join(dir, "key");
    ckpt_err e = {0};
    cr_assert_eq(ckpt_keygen(kf, &e), 0, "%s", e.msg);
    struct stat s;
    cr_assert_eq(stat(kf, &s), 0);
    cr_assert_eq(s.st_mode & 0777, 0600);
    cr_assert_eq(s.st_size, 32);
    cr_assert_eq(ckpt_keygen(kf, &e), -EEXIST, "keygen overwrote a key");
    ckpt_key *k;
    cr_assert_eq(ckpt_key_load_file(kf, &k, &e), 0, "%s", e.msg);
    ckpt_key_free(k);
    chmod(kf, 0644);
    cr_assert_eq(ckpt_key_load_file(kf, &k, &e), -EACCES);
    cr_assert(tu_contains(e.msg, "chmod 600"), "%s", e.msg);
    char *hex = tu_join(dir, "hexkey");
    tu_write_str(hex, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
    chmod(hex, 0600);
    cr_assert_eq(ckpt_key_load_file(hex, &k, &e), 0, "%s", e.msg);
    ckpt_key_free(k);
    tu_write_str(hex, "short");
    cr_assert_eq(ckpt_key_load_file(hex, &k, &e), -EINVAL);
    cr_assert(tu_contains(e.msg, "32 raw bytes or 64 hex digits"), "%s", e.msg);
    /* A FIFO in place of the key or passphrase file is refused at once: the
     * open blocked until something wrote to it, hanging the command. */
    char *fifo = tu_join(dir, "fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(ckpt_key_load_file(fifo, &k, &e), -EINVAL);
    cr_assert(tu_contains(e.msg, "not a regular file"), "%s", e.msg);
    cr_assert_eq(ckpt_key_load_passphrase_file(fifo, &k, &e), -EINVAL);
    cr_assert(tu_contains(e.msg, "not a regular file"), "%s", e.msg);
    free(fifo);
    free(kf);
    free(hex);
}

/* What the daemon and the tools call before loading a key. Criterion runs
 * each test in its own process, so the flags change this one only. */
Test(pack, forbid_core_dumps_clears_dumpable_and_core_limit)
{
    cr_assert_eq(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 1, "a test process starts dumpable");
    cr_assert_eq(ckpt_forbid_core_dumps(), 0);
    cr_assert_eq(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0);
    struct rlimit r;
    cr_assert_eq(getrlimit(RLIMIT_CORE, &r), 0);
    cr_assert_eq(r.rlim_cur, 0);
    cr_assert_eq(r.rlim_max, 0);
}

/* ckpt pack's order: numbers in names by value, so that a DCP save of more
 * than ten ranks packs __2_0 before __10_0 and its chunks come in row order
 * (the condition for assembling them, pack_write.c). */
Test(pack, add_tree_orders_numbers_by_value)
{
    char *src = tu_join(dir, "ranks");
    mkdir(src, 0755);
    const char *names[] = {"__10_0.distcp", "__2_0.distcp", "__0_0.distcp", ".metadata", "b"};
    for (size_t i = 0; i < 5; i++) {
        char *f = tu_join(src, names[i]);
        tu_write_file(f, names[i], strlen(names[i]));
        free(f);
    }
    char *path = tu_join(dir, "ranks.tpack");
    ckpt_pack *p = pack_tree(src, path);
    const char *want[] = {".metadata", "__0_0.distcp", "__2_0.distcp", "__10_0.distcp", "b"};
    cr_assert_eq(ckpt_file_count(p), 5);
    for (size_t i = 0; i < 5; i++)
        cr_assert_str_eq(ckpt_file_at(p, i)->path, want[i]);
    ckpt_close(p);
    free(path);
    free(src);
}

/* Big files of a tree have their SHA-256 lanes queued before the writer
 * reaches them (ingest_files.c open_ahead), small ones between them are
 * hashed from the ring: every digest is still its file's. */
Test(pack, add_tree_big_files_hashed_ahead)
{
    char *src = tu_join(dir, "big");
    mkdir(src, 0755);
    const char *names[] = {"a.bin", "b.bin", "c.txt", "d.bin"};
    const size_t sizes[] = {(17u << 20) + 3, (16u << 20), 100, (18u << 20) + 12345};
    uint8_t want[4][32];
    for (size_t i = 0; i < 4; i++) {
        uint8_t *buf = malloc(sizes[i]);
        tu_fill_pattern(buf, sizes[i], (uint32_t)(i + 11));
        tu_sha256(buf, sizes[i], want[i]);
        char *f = tu_join(src, names[i]);
        tu_write_file(f, buf, sizes[i]);
        free(f);
        free(buf);
    }
    char *path = tu_join(dir, "big.tpack");
    ckpt_pack *p = pack_tree(src, path);
    cr_assert_eq(ckpt_file_count(p), 4);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_str_eq(ckpt_file_at(p, i)->path, names[i]);
        cr_assert_arr_eq(ckpt_file_at(p, i)->sha256, want[i], 32, "%s", names[i]);
    }
    ckpt_err e = {0};
    cr_assert_eq(ckpt_verify(p, 3, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(path);
    free(src);
}

/* A store whose borrow lends its bytes but answers a byte short of a
 * chunk, as a store does at what it takes for the end of the object; it
 * counts the loans not given back. */
typedef struct short_store {
    ckpt_store base;
    ckpt_store *inner;
} short_store;

typedef struct short_reader {
    store_reader base;
    store_reader *inner;
} short_reader;

static int loans_out;

static ssize_t short_read_at(store_reader *r, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    store_reader *in = ((short_reader *)r)->inner;
    return in->ops->read_at(in, buf, len, off, err);
}

static int short_fd(const store_reader *r)
{
    return -1; /* reads go through borrow, as on S3 */
}

static void short_close(store_reader *r)
{
    store_reader *in = ((short_reader *)r)->inner;
    in->ops->close(in);
    free(r);
}

static ssize_t short_borrow(store_reader *r, void *spare, size_t len, uint64_t off,
                            const void **data, void **hold, ckpt_err *err)
{
    uint8_t *loan = malloc(len ? len : 1);
    cr_assert_not_null(loan);
    ssize_t got = short_read_at(r, loan, len, off, err);
    if (got <= 0) {
        free(loan);
        *hold = NULL;
        return got;
    }
    __atomic_add_fetch(&loans_out, 1, __ATOMIC_RELAXED);
    *data = loan;
    *hold = loan;
    return got - 1;
}

static void short_release(store_reader *r, void *hold)
{
    __atomic_sub_fetch(&loans_out, 1, __ATOMIC_RELAXED);
    free(hold);
}

static const store_reader_ops short_reader_ops = {.read_at = short_read_at,
                                                  .fd = short_fd,
                                                  .close = short_close,
                                                  .borrow = short_borrow,
                                                  .release = short_release};

static int short_open_read(ckpt_store *s, const char *name, store_reader **out, ckpt_err *err)
{
    ckpt_store *in = ((short_store *)s)->inner;
    short_reader *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    int rc = in->ops->open_read(in, name, &r->inner, err);
    if (rc < 0) {
        free(r);
        return rc;
    }
    r->base = *r->inner;
    r->base.ops = &short_reader_ops;
    *out = &r->base;
    return 0;
}

static const store_ops short_store_ops = {.open_read = short_open_read};

/* A chunk read whose bytes come back short fails, and gives back what the
 * store lent it all the same: a loan kept pins an S3 readahead segment
 * for good. */
Test(pack, a_short_borrow_gives_its_loan_back)
{
    fixture f = make_fixture(CKPT_CHUNK_DEFAULT);
    char *path = tu_join(dir, "x.tpack");
    write_pack(path, &(ckpt_write_opts){.level = -1}, &f);
    ckpt_err e = {0};
    short_store s = {.base = {.ops = &short_store_ops, .where = NULL}};
    cr_assert_eq(ckpt_store_open_local(dir, &s.inner, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_pack_open_in(&s.base, "x.tpack", NULL, &p, &e), 0, "%s", e.msg);
    ckpt_pack_info info;
    ckpt_info(p, &info);
    uint8_t *out = malloc(info.chunk_size);
    size_t failed = 0;
    for (size_t id = 0; id < info.n_chunks; id++) /* stored chunks are read, not borrowed */
        failed += ckpt_chunk_decode(p, id, out, &e) < 0;
    cr_assert_gt(failed, 0, "no short chunk failed");
    cr_assert_eq(loans_out, 0, "%d loan(s) not given back", loans_out);
    ckpt_close(p);
    ckpt_store_free(s.inner);
    free(out);
    free(path);
    free_fixture(&f);
}
