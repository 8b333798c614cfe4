/* Byte-grouping exposes the low-entropy exponent bytes of float tensors as
 * their own plane, where Huffman coding alone gets most of the gain; the
 * mantissa planes are close to random and are stored as they are.
 *
 * Since format version 3 a plane is coded as one zstd frame (plane method
 * 2) whose blocks are in effect Huffman-coded literals: zstd's decoder reads
 * them four streams at a time, about four times as fast as inflate reads a
 * Huffman-only deflate block (plane method 1, versions 1 and 2), at the
 * same ratio. Measured with bench/plane_codecs.c on 64 MiB of N(0, 0.02)
 * bf16 from ckpt-gen, one core, MB/s of plane bytes:
 *
 *   coder                                   ratio   encode  decode
 *   Huffman-only deflate (huff.c/libdeflate) 1.4936    865     558
 *   zstd -1                                  1.4621    648    1490
 *   zstd -3                                  1.4104    369    1162
 *   zstd fast, minMatch 7, hashLog 6         1.4929   1481    2326
 *   ... and targetLength 4096, literals Huffman-coded (chosen)
 *                                            1.4935   1710    2363
 *
 * zstd's own levels find matches in the exponent plane that cost more than
 * they save (the plane is order-0 noise), so the match finder is starved
 * (64-entry hash table, 7-byte matches, a large skip step) and only the
 * literal Huffman coder works. On fp32 the chosen settings give 1.1979,
 * as deflate does. */
#include "codec.h"
#include "bytegroup.h"
#include "huff.h"
#include "format.h"
#include "common.h"

#include <libdeflate.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
/* ZSTD_c_literalCompressionMode is among zstd.h's experimental parameters,
 * declared only behind this macro; it is set through the stable
 * ZSTD_CCtx_setParameter() and, should a libzstd refuse it, the plane
 * coder goes on without it (ratio 1.4929 instead of 1.4935 on bf16). */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

/* A plane or chunk is compressed only if that saves at least 1/50 of it. */
static int worth_it(size_t packed, size_t raw)
{
    return packed + raw / 50 < raw;
}

void chunk_encoder_init(chunk_encoder *e)
{
    memset(e, 0, sizeof *e);
}

void chunk_encoder_free(chunk_encoder *e)
{
    if (e->z_ready)
        deflateEnd(&e->z);
    ZSTD_freeCCtx(e->zc);
    if (e->trial)
        libdeflate_free_compressor(e->trial);
    free(e->sample);
    free(e->trial_out);
    free(e->planes);
    memset(e, 0, sizeof *e);
}

static int deflater(chunk_encoder *e, int level, int strategy)
{
    if (e->z_ready && e->z_level == level && e->z_strategy == strategy)
        return deflateReset(&e->z) == Z_OK ? 0 : -ENOMEM;
    if (e->z_ready)
        deflateEnd(&e->z);
    e->z_ready = 0;
    memset(&e->z, 0, sizeof e->z);
    if (deflateInit2(&e->z, level, Z_DEFLATED, -15, 8, strategy) != Z_OK)
        return -ENOMEM;
    e->z_ready = 1;
    e->z_level = level;
    e->z_strategy = strategy;
    return 0;
}

/* Deflates into out, giving up once the result is not worth keeping.
 * Returns the compressed size, or 0 if it did not pay. */
static size_t deflate_bounded(chunk_encoder *e, const uint8_t *in, size_t n, int level,
                              int strategy, uint8_t *out)
{
    if (n < 64 || deflater(e, level, strategy) < 0)
        return 0;
    size_t limit = n - n / 50 - 1;
    e->z.next_in = (Bytef *)in;
    e->z.avail_in = (uInt)n;
    e->z.next_out = out;
    e->z.avail_out = (uInt)limit;
    int rc = deflate(&e->z, Z_FINISH);
    if (rc != Z_STREAM_END)
        return 0;
    size_t got = limit - e->z.avail_out;
    return worth_it(got, n) ? got : 0;
}

/* The plane coder's settings (see the top of this file): set once per
 * encoder, kept across frames. */
static ZSTD_CCtx *plane_cctx(chunk_encoder *e)
{
    if (e->zc)
        return e->zc;
    ZSTD_CCtx *z = ZSTD_createCCtx();
    if (!z)
        return NULL;
    static const struct {
        ZSTD_cParameter p;
        int v;
    } set[] = {
        {ZSTD_c_compressionLevel, 1}, {ZSTD_c_strategy, ZSTD_fast}, {ZSTD_c_minMatch, 7},
        {ZSTD_c_hashLog, 6},          {ZSTD_c_targetLength, 4096},  {ZSTD_c_checksumFlag, 0},
        {ZSTD_c_contentSizeFlag, 1},
    };
    for (size_t i = 0; i < sizeof set / sizeof *set; i++)
        if (ZSTD_isError(ZSTD_CCtx_setParameter(z, set[i].p, set[i].v))) {
            ZSTD_freeCCtx(z);
            return NULL;
        }
    /* With a large targetLength the fast strategy would leave literals
     * uncompressed unless told otherwise; refused: the plane still codes,
     * with the default rule (see above). */
    if (ZSTD_isError(ZSTD_CCtx_setParameter(z, ZSTD_c_literalCompressionMode, ZSTD_ps_enable)))
        ZSTD_CCtx_setParameter(z, ZSTD_c_targetLength, 0);
    return e->zc = z;
}

/* One zstd frame of in[0..n) in at most cap bytes; 0 if it does not fit
 * (or zstd has no memory: the plane is then stored). */
static size_t zstd_plane(chunk_encoder *e, const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
    ZSTD_CCtx *z = plane_cctx(e);
    if (!z)
        return 0;
    size_t r = ZSTD_compress2(z, out, cap, in, n);
    return ZSTD_isError(r) ? 0 : r;
}

/* Byte counts. Exponent planes repeat a few values, and one array would
 * make each increment wait for the last one to the same counter; four
 * arrays let four run at once. */
static void histogram(const uint8_t *p, size_t n, uint32_t out[256])
{
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][p[i]]++;
        h[1][p[i + 1]]++;
        h[2][p[i + 2]]++;
        h[3][p[i + 3]]++;
    }
    for (; i < n; i++)
        h[0][p[i]]++;
    for (int s = 0; s < 256; s++)
        out[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
}

/* Order-0 entropy in bits per byte of a plane with histogram h: a plane
 * above the threshold cannot shrink enough under Huffman coding, so it is
 * not even tried. */
static double entropy(const uint32_t h[256], size_t n)
{
    double bits = 0;
    for (int i = 0; i < 256; i++)
        if (h[i]) {
            double q = (double)h[i] / (double)n;
            bits -= q * log2(q);
        }
    return bits;
}

/* Order-0 entropy of a plane, from eight 16 KiB slices spread over it when
 * it is larger than those: the estimate only decides whether the plane is
 * worth handing to the coder (which counts its bytes again, and stores the
 * plane when coding does not pay), and a whole-plane histogram cost as
 * much as the transpose. */
#define ENTROPY_SLICE (16u << 10)
#define ENTROPY_SLICES 8u
static double plane_entropy(const uint8_t *plane, size_t m)
{
    uint32_t hist[256];
    if (m <= (size_t)ENTROPY_SLICE * ENTROPY_SLICES) {
        histogram(plane, m, hist);
        return entropy(hist, m);
    }
    uint32_t sum[256] = {0};
    for (unsigned s = 0; s < ENTROPY_SLICES; s++) {
        size_t off = (m - ENTROPY_SLICE) / (ENTROPY_SLICES - 1) * s;
        histogram(plane + off, ENTROPY_SLICE, hist);
        for (int b = 0; b < 256; b++)
            sum[b] += hist[b];
    }
    return entropy(sum, (size_t)ENTROPY_SLICE * ENTROPY_SLICES);
}

static int encode_bytegroup(chunk_encoder *e, const uint8_t *raw, size_t n, unsigned k, int level,
                            uint8_t *out, size_t *out_len)
{
    /* planes holds the transposed chunk plus room for level 9's second trial. */
    if (e->planes_cap < 2 * n) {
        uint8_t *p = realloc(e->planes, 2 * n);
        if (!p)
            return -ENOMEM;
        e->planes = p;
        e->planes_cap = 2 * n;
    }
    bytegroup_split(raw, n, k, e->planes);
    size_t m = n / k, pos = 5 * (size_t)k;
    for (unsigned j = 0; j < k; j++) {
        const uint8_t *plane = e->planes + j * m;
        uint8_t *dst = out + pos;
        size_t got = 0;
        uint8_t method = PLANE_STORED;
        if (m >= 64 && plane_entropy(plane, m) < 7.84) {
            /* In effect Huffman-only: see the top of the file. */
            got = zstd_plane(e, plane, m, dst, m - m / 50 - 1);
            if (got && worth_it(got, m))
                method = PLANE_ZSTD;
            else
                got = 0;
            if (level >= 9) {
                /* Highest level: also try LZ77, which helps integer and sparse data. */
                uint8_t *alt = e->planes + n;
                size_t got2 = deflate_bounded(e, plane, m, level, Z_DEFAULT_STRATEGY, alt);
                if (got2 && (!got || got2 < got)) {
                    memmove(dst, alt, got2);
                    got = got2;
                    method = PLANE_DEFLATE;
                }
            }
        }
        if (!got)
            memcpy(dst, plane, m);
        out[5 * j] = method;
        put_u32(out + 5 * j + 1, (uint32_t)(got ? got : m));
        pos += got ? got : m;
    }
    *out_len = pos;
    return 0;
}

/* ---- opaque chunks: choosing the grouping ----
 *
 * Opaque data is often an array of numbers in a format nobody parsed (a raw
 * fp32 blob, an ONNX weight file, int64 token ids), where byte-grouping by
 * the element width beats plain deflate; or text, pickles and tables, where
 * deflate's LZ77 wins; or compressed data, where nothing pays. Each chunk
 * gets the smallest estimate over: no grouping (DEFLATE), or BYTEGROUP with
 * width 2, 4 or 8, judged on a sample:
 *  - the sample is four 16 KiB slices spread over the chunk (the whole
 *    chunk when it is at most 64 KiB), each starting at a multiple of 8 so
 *    that every width sees the element boundaries the chunk has;
 *  - grouped by k, the estimate is the order-0 entropy of each plane, which
 *    is what the Huffman-only plane coder gets within a few per cent, at
 *    least 1 bit per byte (a Huffman code has no shorter code), a plane at
 *    or above the 7.84 bits/byte cut being stored; one pass over the
 *    sample fills the eight byte-lane histograms, and the lanes add up to
 *    the planes of widths 4 and 2;
 *  - ungrouped, the estimate is the real size of libdeflate level 1 on the
 *    sample's first 16 KiB, scaled to the sample: order-0 entropy knows
 *    nothing of repeated strings, which is where deflate's gain on text
 *    comes from. 16 KiB, not all 64, because LZ77 on number-like bytes
 *    runs at ~70 MB/s here, and the whole sample would cost a third of
 *    the time of byte-grouping the chunk (measured on a 2-core box:
 *    0.94 ms per 64 KiB of fp32 noise at level 1; ~0.23 ms per 16 KiB).
 * If even the best estimate does not save 1/50 of the sample, the chunk is
 * stored without trying to deflate all of it (which ran at ~60 MB/s on
 * incompressible data).
 *
 * Measured (1 MiB chunks, level 6, estimate vs what the encoder then got,
 * as a fraction of the raw size): fp32 N(0, 0.02) 0.834 / 0.835 (width 4),
 * bf16 0.668 / 0.669 (2), fp64 0.865 / 0.875 (8), int64 ids 0.338 / 0.339
 * (8), text 0.333 / 0.255 (deflate), random bytes 1.0 (stored after the
 * 0.3 ms choice, where deflating the whole chunk only to give up took tens
 * of ms). The choice takes 0.1-0.2 ms per
 * chunk; byte-grouping an fp32 chunk takes ~1.4 ms. A raw fp32 blob of
 * 200 MB packs to ratio 1.198, as the same bytes as .npy do (1.198),
 * against 1.078 for plain deflate before. */
#define SAMPLE_SLICE (16u * 1024u)
#define SAMPLE_MAX (4u * SAMPLE_SLICE)
#define LZ_TRIAL SAMPLE_SLICE

/* Estimated bytes of a plane of m bytes with histogram h under the plane coder. */
static double plane_estimate(const uint32_t h[256], size_t m)
{
    if (m == 0)
        return 0;
    double bits = entropy(h, m);
    if (bits >= 7.84)
        return (double)m;
    if (bits < 1)
        bits = 1;
    return (double)m * bits / 8;
}

unsigned chunk_choose_grouping(chunk_encoder *e, const uint8_t *raw, size_t n, double *ratio)
{
    const uint8_t *smp = raw;
    size_t len = n;
    if (n > SAMPLE_MAX) {
        if (!e->sample && !(e->sample = malloc(SAMPLE_MAX)))
            return 1;
        size_t step = (n / 4) & ~(size_t)7;
        for (unsigned i = 0; i < 4; i++)
            memcpy(e->sample + i * SAMPLE_SLICE, raw + i * step, SAMPLE_SLICE);
        smp = e->sample;
        len = SAMPLE_MAX;
    }
    size_t len8 = len & ~(size_t)7;
    if (len8 < 64) {
        if (ratio)
            *ratio = 1;
        return 1;
    }

    /* Lane j of 8 holds bytes i with i % 8 == j. */
    uint32_t lane[8][256];
    memset(lane, 0, sizeof lane);
    for (size_t i = 0; i < len8; i += 8)
        for (unsigned j = 0; j < 8; j++)
            lane[j][smp[i + j]]++;
    double best = (double)len8;
    unsigned pick = 0;
    for (unsigned k = 2; k <= 8; k *= 2) {
        if (n % k)
            continue;
        double est = 5.0 * k;
        for (unsigned j = 0; j < k; j++) {
            uint32_t h[256];
            for (int b = 0; b < 256; b++) {
                uint32_t c = 0;
                for (unsigned l = j; l < 8; l += k)
                    c += lane[l][b];
                h[b] = c;
            }
            est += plane_estimate(h, len8 / k);
        }
        if (est < best) {
            best = est;
            pick = k;
        }
    }

    if (!e->trial)
        e->trial = libdeflate_alloc_compressor(1);
    if (!e->trial_out)
        e->trial_out = malloc(LZ_TRIAL);
    size_t tn = len < LZ_TRIAL ? len : LZ_TRIAL;
    if (e->trial && e->trial_out) {
        /* 0 when it does not fit in tn bytes: no gain. */
        size_t got = libdeflate_deflate_compress(e->trial, smp, tn, e->trial_out, tn);
        double est = got ? (double)got * (double)len8 / (double)tn : (double)len8;
        if (est < best) {
            best = est;
            pick = 1;
        }
    }
    if (ratio)
        *ratio = best / (double)len8;
    return worth_it((size_t)best, len8) ? pick : 0;
}

int chunk_encode(chunk_encoder *e, const uint8_t *raw, size_t n, unsigned elem, int level,
                 uint8_t *out, size_t *out_len, uint8_t *codec, uint8_t *group)
{
    *group = (uint8_t)(elem ? elem : 1);
    if (level > 0 && elem == 0) {
        unsigned k = chunk_choose_grouping(e, raw, n, NULL);
        if (k >= 2) {
            int rc = encode_bytegroup(e, raw, n, k, level, out, out_len);
            if (rc < 0)
                return rc;
            if (worth_it(*out_len, n)) {
                *codec = CODEC_BYTEGROUP;
                *group = (uint8_t)k;
                return 0;
            }
        } else if (k == 1) {
            size_t got = deflate_bounded(e, raw, n, level, Z_DEFAULT_STRATEGY, out);
            if (got) {
                *out_len = got;
                *codec = CODEC_DEFLATE;
                return 0;
            }
        }
    } else if (level > 0 && (elem == 2 || elem == 4 || elem == 8) && n % elem == 0 && n >= 64) {
        int rc = encode_bytegroup(e, raw, n, elem, level, out, out_len);
        if (rc < 0)
            return rc;
        if (worth_it(*out_len, n)) {
            *codec = CODEC_BYTEGROUP;
            return 0;
        }
    } else if (level > 0) {
        size_t got = deflate_bounded(e, raw, n, level, Z_DEFAULT_STRATEGY, out);
        if (got) {
            *out_len = got;
            *codec = CODEC_DEFLATE;
            return 0;
        }
    }
    memcpy(out, raw, n);
    *out_len = n;
    *codec = CODEC_STORED;
    return 0;
}

/* Decoder state, one per thread that decodes (stream workers, the
 * daemon's threads, callers of ckpt_chunk_decode), made on its first chunk
 * and freed when the thread exits: no allocation per chunk. */
typedef struct decoder_state {
    ZSTD_DCtx *zd;
    struct libdeflate_decompressor *ld;
    uint8_t *buf[DECODE_BUF_COUNT]; /* chunk_decode_buf */
    size_t cap[DECODE_BUF_COUNT];
} decoder_state;

static pthread_key_t dec_key;
static pthread_once_t dec_once = PTHREAD_ONCE_INIT;
static int dec_key_ok;
/* Also reachable from here, so leak checkers see the main thread's state
 * (thread-specific values of a thread still running at exit are not freed). */
static _Thread_local decoder_state *dec_tls;

static void decoder_state_free(void *arg)
{
    decoder_state *d = arg;
    if (!d)
        return;
    ZSTD_freeDCtx(d->zd);
    if (d->ld)
        libdeflate_free_decompressor(d->ld);
    for (int i = 0; i < DECODE_BUF_COUNT; i++)
        free(d->buf[i]);
    free(d);
    dec_tls = NULL;
}

static void dec_key_make(void)
{
    dec_key_ok = pthread_key_create(&dec_key, decoder_state_free) == 0;
}

static decoder_state *decoder(void)
{
    if (dec_tls)
        return dec_tls;
    pthread_once(&dec_once, dec_key_make);
    decoder_state *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->zd = ZSTD_createDCtx();
    d->ld = libdeflate_alloc_decompressor();
    /* Plane frames never need a window over 16 MiB (the largest chunk). */
    if (!d->zd || !d->ld || ZSTD_isError(ZSTD_DCtx_setParameter(d->zd, ZSTD_d_windowLogMax, 24)) ||
        (dec_key_ok && pthread_setspecific(dec_key, d) != 0)) {
        decoder_state_free(d);
        return NULL;
    }
    return dec_tls = d;
}

uint8_t *chunk_decode_buf(int which, size_t n)
{
    decoder_state *d = decoder();
    if (!d)
        return NULL;
    if (d->cap[which] < n) {
        free(d->buf[which]);
        d->buf[which] = malloc(n);
        d->cap[which] = d->buf[which] ? n : 0;
    }
    return d->buf[which];
}

void chunk_decoder_release(void)
{
    decoder_state *d = dec_tls;
    if (!d)
        return;
    if (dec_key_ok)
        pthread_setspecific(dec_key, NULL);
    decoder_state_free(d);
}

/* libdeflate decodes raw deflate about twice as fast as zlib's inflate on
 * Huffman-only planes, and every load pays for decoding. Planes of version
 * 1 and 2 were encoded by huff.c (libdeflate has no Huffman-only
 * strategy), other data by zlib. */
static int inflate_exact(const uint8_t *in, size_t len, uint8_t *out, size_t want)
{
    decoder_state *d = decoder();
    if (!d)
        return -ENOMEM;
    size_t in_used = 0, got = 0;
    enum libdeflate_result r =
        libdeflate_deflate_decompress_ex(d->ld, in, len, out, want, &in_used, &got);
    return r == LIBDEFLATE_SUCCESS && got == want && in_used == len ? 0 : -EIO;
}

/* Exactly one zstd frame, all of in, decoding to exactly want bytes. */
static int unzstd_exact(const uint8_t *in, size_t len, uint8_t *out, size_t want)
{
    decoder_state *d = decoder();
    if (!d)
        return -ENOMEM;
    if (ZSTD_findFrameCompressedSize(in, len) != len)
        return -EIO;
    size_t r = ZSTD_decompressDCtx(d->zd, out, want, in, len);
    return !ZSTD_isError(r) && r == want ? 0 : -EIO;
}

int chunk_shape_valid(uint8_t codec, unsigned elem, uint32_t raw_size, uint32_t payload_size)
{
    switch (codec) {
    case CODEC_STORED:
        return payload_size == raw_size;
    case CODEC_DEFLATE:
        return payload_size > 0 && payload_size < raw_size;
    case CODEC_BYTEGROUP:
        return (elem == 2 || elem == 4 || elem == 8) && raw_size % elem == 0 &&
               payload_size >= 5 * elem && payload_size <= raw_size + 5 * elem;
    }
    return 0;
}

int chunk_decode(const uint8_t *payload, size_t len, uint8_t codec, unsigned elem, unsigned version,
                 uint8_t *out, size_t raw_size, uint8_t *scratch, const char **why)
{
    if (codec == CODEC_STORED) {
        if (len != raw_size) {
            *why = "stored chunk has the wrong length";
            return -EIO;
        }
        if (out != payload)
            memcpy(out, payload, len);
        return 0;
    }
    if (codec == CODEC_DEFLATE) {
        int rc = inflate_exact(payload, len, out, raw_size);
        if (rc < 0) {
            *why = rc == -ENOMEM ? "out of memory for the decoder" : "deflate stream is corrupt";
            return rc;
        }
        return 0;
    }
    if (codec != CODEC_BYTEGROUP ||
        !chunk_shape_valid(codec, elem, (uint32_t)raw_size, (uint32_t)len)) {
        *why = "unknown codec";
        return -EIO;
    }
    size_t m = raw_size / elem, pos = 5 * (size_t)elem;
    const uint8_t *planes[8];
    for (unsigned j = 0; j < elem; j++) {
        uint8_t method = payload[5 * j];
        uint32_t plen = get_u32(payload + 5 * j + 1);
        if (plen > len - pos) {
            *why = "plane runs past the chunk";
            return -EIO;
        }
        if (method == PLANE_STORED) {
            if (plen != m) {
                *why = "stored plane has the wrong length";
                return -EIO;
            }
            planes[j] = payload + pos;
        } else if (method == PLANE_DEFLATE) {
            int rc = inflate_exact(payload + pos, plen, scratch + j * m, m);
            if (rc < 0) {
                *why = rc == -ENOMEM ? "out of memory for the decoder"
                                     : "deflate stream of a plane is corrupt";
                return rc;
            }
            planes[j] = scratch + j * m;
        } else if (method == PLANE_ZSTD && version >= 3) {
            int rc = unzstd_exact(payload + pos, plen, scratch + j * m, m);
            if (rc < 0) {
                *why = rc == -ENOMEM ? "out of memory for the decoder"
                                     : "zstd frame of a plane is corrupt";
                return rc;
            }
            planes[j] = scratch + j * m;
        } else {
            *why = "unknown plane method";
            return -EIO;
        }
        pos += plen;
    }
    if (pos != len) {
        *why = "trailing bytes after the planes";
        return -EIO;
    }
    bytegroup_join(planes, m, elem, out);
    return 0;
}
