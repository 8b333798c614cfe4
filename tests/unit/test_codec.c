/* The chunk codec with the zstd plane method (plane method 2, format
 * version 3): every element size and odd sizes round-trip byte-identical;
 * compressible planes are zstd frames; a version-2 pack may not use them;
 * corrupt or padded frames fail cleanly, and through a pack the message
 * names the chunk. */
#include "testutil.h"
#include "ckpt.h"

#include <math.h>
#include <pthread.h>

#include "codec.h"
#include "format.h"

/* bf16-like elements of width k: the top byte (the exponent plane) takes a
 * few values, the others are noise. */
static void fill_floats(uint8_t *b, size_t n, unsigned k, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (uint8_t)x;
        if (k && i % k == k - 1)
            b[i] = (uint8_t)(0x3c + (x >> 8) % 3 - (x >> 12) % 2 * 0x80);
    }
}

typedef struct encoded {
    uint8_t *payload;
    size_t len;
    uint8_t codec, group;
} encoded;

static encoded encode(chunk_encoder *e, const uint8_t *raw, size_t n, unsigned elem, int level)
{
    encoded r;
    r.payload = malloc(n + TPACK_CHUNK_OVERHEAD);
    cr_assert_eq(chunk_encode(e, raw, n, elem, level, r.payload, &r.len, &r.codec, &r.group), 0);
    return r;
}

static void expect_decodes(const encoded *c, const uint8_t *raw, size_t n, const char *what)
{
    uint8_t *out = malloc(n + 1), *scratch = malloc(n + 1);
    const char *why = NULL;
    cr_assert(chunk_shape_valid(c->codec, c->group, (uint32_t)n, (uint32_t)c->len), "%s: shape",
              what);
    int rc = chunk_decode(c->payload, c->len, c->codec, c->group, 3, out, n, scratch, &why);
    cr_assert_eq(rc, 0, "%s: %s", what, why ? why : "");
    cr_assert_arr_eq(out, raw, n, "%s: differs", what);
    free(out);
    free(scratch);
}

/* The plane methods of a BYTEGROUP payload. */
static unsigned count_method(const encoded *c, uint8_t method)
{
    unsigned n = 0;
    if (c->codec != CODEC_BYTEGROUP)
        return 0;
    for (unsigned j = 0; j < c->group; j++)
        n += c->payload[5 * j] == method;
    return n;
}

Test(codec, zstd_planes_round_trip_every_width_and_odd_size)
{
    static const size_t sizes[] = {8,    24,   56,    64,        72,      136,
                                   1000, 4104, 65528, 65536 + 8, 1 << 20, (1 << 20) - 8};
    static const int levels[] = {1, 6, 9};
    chunk_encoder e;
    chunk_encoder_init(&e);
    unsigned zstd_planes = 0;
    for (unsigned k = 2; k <= 8; k *= 2)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
                size_t n = sizes[s] - sizes[s] % k;
                uint8_t *raw = malloc(n);
                fill_floats(raw, n, k, (uint32_t)(n + k));
                char what[96];
                snprintf(what, sizeof what, "k=%u n=%zu level %d", k, n, levels[l]);
                encoded c = encode(&e, raw, n, k, levels[l]);
                expect_decodes(&c, raw, n, what);
                if (n >= 4096 && levels[l] < 9) {
                    cr_assert_eq(c.codec, CODEC_BYTEGROUP, "%s: codec %u", what, c.codec);
                    cr_assert_eq(count_method(&c, PLANE_ZSTD), 1,
                                 "%s: the exponent plane is a zstd frame", what);
                    cr_assert_eq(count_method(&c, PLANE_DEFLATE), 0, "%s: no deflate below level 9",
                                 what);
                }
                zstd_planes += count_method(&c, PLANE_ZSTD);
                /* Opaque: the encoder picks the width itself. */
                encoded o = encode(&e, raw, n, 0, levels[l]);
                expect_decodes(&o, raw, n, what);
                free(c.payload);
                free(o.payload);
                free(raw);
            }
    cr_assert_gt(zstd_planes, 50);
    chunk_encoder_free(&e);
}

Test(codec, constant_and_incompressible_planes)
{
    chunk_encoder e;
    chunk_encoder_init(&e);
    size_t n = 3 * 65536;
    uint8_t *raw = calloc(1, n);
    encoded c = encode(&e, raw, n, 2, 6); /* all zero: tiny frames */
    expect_decodes(&c, raw, n, "zeros");
    cr_assert_lt(c.len, 200);
    free(c.payload);
    fill_floats(raw, n, 0, 5); /* noise: stored */
    c = encode(&e, raw, n, 4, 6);
    expect_decodes(&c, raw, n, "noise");
    cr_assert_eq(c.codec, CODEC_STORED);
    free(c.payload);
    free(raw);
    chunk_encoder_free(&e);
}

/* The first zstd plane of a payload: where its body starts, and its length. */
static size_t zstd_body(const encoded *c, size_t n, size_t *len)
{
    size_t pos = 5 * (size_t)c->group;
    for (unsigned j = 0; j < c->group; j++) {
        uint32_t plen = (uint32_t)c->payload[5 * j + 1] | (uint32_t)c->payload[5 * j + 2] << 8 |
                        (uint32_t)c->payload[5 * j + 3] << 16 |
                        (uint32_t)c->payload[5 * j + 4] << 24;
        if (c->payload[5 * j] == PLANE_ZSTD) {
            *len = plen;
            return pos;
        }
        pos += plen;
    }
    cr_assert_fail("no zstd plane in a payload of %zu bytes", n);
    return 0;
}

static void expect_refused(const uint8_t *payload, size_t len, const encoded *c, unsigned version,
                           size_t n, const char *want, const char *what)
{
    uint8_t *out = malloc(n), *scratch = malloc(n);
    const char *why = NULL;
    int rc = chunk_decode(payload, len, c->codec, c->group, version, out, n, scratch, &why);
    cr_assert_eq(rc, -EIO, "%s: rc %d", what, rc);
    cr_assert(why && tu_contains(why, want), "%s: why '%s', want '%s'", what, why ? why : "(null)",
              want);
    free(out);
    free(scratch);
}

Test(codec, corrupt_zstd_frames_fail_cleanly)
{
    chunk_encoder e;
    chunk_encoder_init(&e);
    size_t n = 65536;
    uint8_t *raw = malloc(n);
    fill_floats(raw, n, 2, 9);
    encoded c = encode(&e, raw, n, 2, 6);
    size_t flen, at = zstd_body(&c, n, &flen);
    uint8_t *bad = malloc(c.len + 16);

    /* Bad magic. */
    memcpy(bad, c.payload, c.len);
    bad[at] ^= 0xff;
    expect_refused(bad, c.len, &c, 3, n, "zstd frame of a plane is corrupt", "magic");
    /* Every byte of the frame header and the first block, flipped in turn:
     * refused or decoded to some n bytes, never past the buffers. */
    for (size_t i = 0; i < 64 && i < flen; i++) {
        memcpy(bad, c.payload, c.len);
        bad[at + i] ^= 0x5a;
        uint8_t *out = malloc(n), *scratch = malloc(n);
        const char *why = NULL;
        int rc = chunk_decode(bad, c.len, c.codec, c.group, 3, out, n, scratch, &why);
        cr_assert(rc == 0 || (rc == -EIO && why), "byte %zu: rc %d", i, rc);
        free(out);
        free(scratch);
    }
    /* A frame cut short: its plane claims fewer bytes, the rest trails. */
    memcpy(bad, c.payload, c.len);
    uint32_t shorter = (uint32_t)flen - 3;
    bad[5 * 1 + 1] = (uint8_t)shorter;
    bad[5 * 1 + 2] = (uint8_t)(shorter >> 8);
    bad[5 * 1 + 3] = (uint8_t)(shorter >> 16);
    bad[5 * 1 + 4] = (uint8_t)(shorter >> 24);
    cr_assert_eq(c.payload[5], PLANE_ZSTD, "plane 1 is the exponent plane");
    expect_refused(bad, c.len, &c, 3, n, "", "truncated frame");
    /* Bytes after the frame inside its plane body (a second frame, here a
     * skippable one): exactly one frame per plane. */
    static const uint8_t skippable[8] = {0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0};
    memcpy(bad, c.payload, at + flen);
    memcpy(bad + at + flen, skippable, 8);
    memcpy(bad + at + flen + 8, c.payload + at + flen, c.len - at - flen);
    uint32_t longer = (uint32_t)flen + 8;
    bad[6] = (uint8_t)longer;
    bad[7] = (uint8_t)(longer >> 8);
    bad[8] = (uint8_t)(longer >> 16);
    bad[9] = (uint8_t)(longer >> 24);
    expect_refused(bad, c.len + 8, &c, 3, n, "zstd frame of a plane is corrupt", "trailing frame");
    /* A version-2 pack has no plane method 2. */
    expect_refused(c.payload, c.len, &c, 2, n, "unknown plane method", "version 2");
    free(bad);
    free(c.payload);
    free(raw);
    chunk_encoder_free(&e);
}

/* Decoder state is per thread: many threads decoding at once, each
 * getting its own contexts, and a thread that exits frees its own. */
typedef struct job {
    const encoded *c;
    const uint8_t *raw;
    size_t n;
} job;

static void *decode_many(void *arg)
{
    const job *j = arg;
    uint8_t *out = malloc(j->n), *scratch = malloc(j->n);
    for (int i = 0; i < 20; i++) {
        const char *why = NULL;
        if (chunk_decode(j->c->payload, j->c->len, j->c->codec, j->c->group, 3, out, j->n, scratch,
                         &why) != 0 ||
            memcmp(out, j->raw, j->n) != 0) {
            free(out);
            free(scratch);
            return (void *)1;
        }
    }
    free(out);
    free(scratch);
    return NULL;
}

Test(codec, decoders_are_per_thread)
{
    chunk_encoder e;
    chunk_encoder_init(&e);
    size_t n = 1 << 18;
    uint8_t *raw = malloc(n);
    fill_floats(raw, n, 4, 3);
    encoded c = encode(&e, raw, n, 4, 6);
    job j = {&c, raw, n};
    pthread_t t[6];
    for (int i = 0; i < 6; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, decode_many, &j), 0);
    for (int i = 0; i < 6; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r, "thread %d decoded wrong", i);
    }
    cr_assert_null(decode_many(&j));
    chunk_decoder_release();
    cr_assert_null(decode_many(&j), "a released decoder is made again");
    chunk_decoder_release();
    free(c.payload);
    free(raw);
    chunk_encoder_free(&e);
}

/* Through a pack: a zstd frame with a broken magic fails the reads of its
 * chunk only, and the message names the pack, the chunk and the tensor. */
Test(codec, corrupt_frame_in_a_pack_names_the_chunk)
{
    char *dir = tu_mkdtemp(), *path = tu_join(dir, "z.tpack");
    ckpt_err e = {0};
    ckpt_writer *w;
    ckpt_write_opts o = {.chunk_size = 65536, .level = 6, .threads = 2};
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    size_t n = 65536 * 3;
    uint8_t *raw = malloc(n);
    fill_floats(raw, n, 2, 21);
    uint64_t shape = n / 2;
    cr_assert_eq(ckpt_writer_begin_file(w, "m.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_tensor(w, "w", "BF16", 1, &shape, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_tensor_data(w, raw, n, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_tensor(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);

    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    ckpt_pack_info info;
    ckpt_info(p, &info);
    cr_assert_eq(info.format_version, CKPT_FORMAT_VERSION);
    cr_assert_eq(info.n_chunks, 3);
    ckpt_close(p);
    /* Chunk 1 starts after chunk 0; its plane table says where plane 1 is. */
    size_t len;
    uint8_t *pk = tu_read_file(path, &len);
    size_t c0 = 128 + 10 +
                ((size_t)pk[128 + 1] | (size_t)pk[128 + 2] << 8 | (size_t)pk[128 + 3] << 16) +
                ((size_t)pk[128 + 6] | (size_t)pk[128 + 7] << 8 | (size_t)pk[128 + 8] << 16);
    cr_assert_eq(pk[c0 + 5], PLANE_ZSTD, "chunk 1's exponent plane is zstd");
    size_t plane0 = (size_t)pk[c0 + 1] | (size_t)pk[c0 + 2] << 8 | (size_t)pk[c0 + 3] << 16;
    pk[c0 + 10 + plane0] ^= 0xff; /* the frame's magic */
    tu_write_file(path, pk, len);
    free(pk);

    cr_assert_eq(ckpt_open(path, NULL, &p, &e), 0, "%s", e.msg);
    uint8_t *buf = malloc(n);
    cr_assert_eq(ckpt_tensor_pread(p, 0, buf, n, 0, &e), -EIO);
    tu_assert_contains(e.msg, "chunk 1 (file 'm.bin'");
    tu_assert_contains(e.msg, "tensor 'w'");
    tu_assert_contains(e.msg, "zstd frame of a plane is corrupt");
    tu_assert_contains(e.msg, path);
    cr_assert_eq(ckpt_tensor_pread(p, 0, buf, 65536, 0, &e), 65536, "chunk 0 still reads: %s",
                 e.msg);
    cr_assert_arr_eq(buf, raw, 65536);
    cr_assert_eq(ckpt_tensor_pread(p, 0, buf, 65536, 2 * 65536, &e), 65536,
                 "chunk 2 still reads: %s", e.msg);
    cr_assert_arr_eq(buf, raw + 2 * 65536, 65536);
    ckpt_close(p);
    free(buf);
    free(raw);
    tu_rm_rf(dir);
    free(dir);
    free(path);
}
