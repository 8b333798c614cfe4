/* Which coder for the byte planes of tensor chunks (issue 15, item 1): on
 * real bf16 (or any 2/4-byte) tensor data, each 1 MiB chunk is split into
 * its byte planes and every plane is coded by each candidate; prints the
 * ratio on the whole data (planes that do not save 1/50 count as stored, as
 * in the pack) and the single-thread encode and decode speed of the
 * compressed planes, in MB/s of plane bytes (median of --reps runs, thread
 * CPU time, so a busy machine shifts them less than wall time would).
 *
 * Usage: plane_codecs FILE [--elem K] [--mib N] [--reps R]
 *   FILE    a safetensors file (its header is skipped) or raw tensor bytes
 *   --elem  the element size to group by (default 2: bf16)
 *   --mib   how much of the file to use (default 64)
 *
 * Built by `make bench-codec`. */
#include "huff.h"

#include <libdeflate.h>
/* The experimental parameters (literal compression mode) are in zstd.h
 * behind this macro; only this measurement uses them. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK (1u << 20)

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct cand {
    const char *name;
    int zstd; /* 0: libdeflate Huffman-only (today's) */
    int level;
    int strategy; /* 0: the level's */
    int min_match, target_len, hash_log, window_log, search_log;
    int lit_mode; /* ZSTD_ps_* or 0 */
} cand;

static size_t encode(const cand *c, ZSTD_CCtx *cc, const uint8_t *in, size_t n, uint8_t *out,
                     size_t cap)
{
    if (!c->zstd) {
        uint32_t h[256] = {0};
        for (size_t i = 0; i < n; i++)
            h[in[i]]++;
        return huff_deflate(in, n, h, out, cap);
    }
    ZSTD_CCtx_reset(cc, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, c->level);
    if (c->strategy)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_strategy, c->strategy);
    if (c->min_match)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_minMatch, c->min_match);
    if (c->target_len)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_targetLength, c->target_len);
    if (c->hash_log)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_hashLog, c->hash_log);
    if (c->window_log)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_windowLog, c->window_log);
    if (c->search_log)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_searchLog, c->search_log);
    if (c->lit_mode)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_literalCompressionMode, c->lit_mode);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 0);
    size_t r = ZSTD_compress2(cc, out, cap, in, n);
    return ZSTD_isError(r) ? 0 : r;
}

static int decode(const cand *c, ZSTD_DCtx *dc, struct libdeflate_decompressor *ld,
                  const uint8_t *in, size_t len, uint8_t *out, size_t n)
{
    if (!c->zstd) {
        size_t got = 0;
        return libdeflate_deflate_decompress(ld, in, len, out, n, &got) == LIBDEFLATE_SUCCESS &&
                       got == n
                   ? 0
                   : -1;
    }
    size_t r = ZSTD_decompressDCtx(dc, out, n, in, len);
    return !ZSTD_isError(r) && r == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    unsigned k = 2, mib = 64, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--elem") && i + 1 < argc)
            k = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = (unsigned)atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (!path || (k != 2 && k != 4 && k != 8) || !mib || !reps) {
        fprintf(stderr, "usage: plane_codecs FILE [--elem 2|4|8] [--mib N] [--reps R]\n");
        return 2;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint8_t hdr[8];
    uint64_t skip = 0;
    if (fread(hdr, 1, 8, f) == 8) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | hdr[i];
        int c0 = fgetc(f);
        if (c0 == '{' && hl < (100u << 20))
            skip = 8 + hl;
    }
    fseek(f, (long)skip, SEEK_SET);
    size_t total = (size_t)mib << 20;
    uint8_t *raw = malloc(total);
    size_t got = fread(raw, 1, total, f);
    fclose(f);
    got -= got % CHUNK;
    if (!got) {
        fprintf(stderr, "%s: less than 1 MiB of data\n", path);
        return 1;
    }
    size_t nchunks = got / CHUNK, m = CHUNK / k, nplanes = nchunks * k;
    /* Planes of every chunk, back to back. */
    uint8_t *planes = malloc(got);
    for (size_t c = 0; c < nchunks; c++)
        for (unsigned j = 0; j < k; j++)
            for (size_t i = 0; i < m; i++)
                planes[c * CHUNK + j * m + i] = raw[c * CHUNK + i * k + j];
    size_t cap = ZSTD_compressBound(m) + 1024;
    uint8_t *comp = malloc(nplanes * cap), *back = malloc(m);
    size_t *clen = calloc(nplanes, sizeof *clen);

    const cand cands[] = {
        {"deflate huffman-only (format v1, v2)", 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"zstd -1", 1, 1, 0, 0, 0, 0, 0, 0, 0},
        {"zstd -2", 1, 2, 0, 0, 0, 0, 0, 0, 0},
        {"zstd -3", 1, 3, 0, 0, 0, 0, 0, 0, 0},
        {"zstd -1 fast mml7", 1, 1, ZSTD_fast, 7, 0, 0, 0, 0, 0},
        {"zstd -1 fast mml7 tl64 lit=huf", 1, 1, ZSTD_fast, 7, 64, 0, 0, 0, ZSTD_ps_enable},
        {"zstd -1 fast mml7 tl256 lit=huf", 1, 1, ZSTD_fast, 7, 256, 0, 0, 0, ZSTD_ps_enable},
        {"zstd -1 fast mml7 tl4k lit=huf", 1, 1, ZSTD_fast, 7, 4096, 0, 0, 0, ZSTD_ps_enable},
        {"zstd -1 fast mml7 tl128k lit=huf", 1, 1, ZSTD_fast, 7, 131072, 0, 0, 0, ZSTD_ps_enable},
        {"zstd -1 fast mml7 tl4k h6 lit=huf", 1, 1, ZSTD_fast, 7, 4096, 6, 0, 0, ZSTD_ps_enable},
        {"zstd dfast mml7 h6", 1, 1, ZSTD_dfast, 7, 0, 6, 0, 0, 0},
        {"zstd fast mml7 h6 (no experimental)", 1, 1, ZSTD_fast, 7, 0, 6, 0, 0, 0},
        {"zstd -1 lit=uncompressed", 1, 1, 0, 0, 0, 0, 0, 0, ZSTD_ps_disable},
    };
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    struct libdeflate_decompressor *ld = libdeflate_alloc_decompressor();
    printf(
        "%s: %zu chunks of 1 MiB, grouped by %u; speeds in MB/s of plane bytes, single thread, median of %u\n\n",
        path, nchunks, k, reps);
    printf("| coder | ratio (all data) |");
    for (unsigned j = 0; j < k; j++)
        printf(" plane %u ratio |", j);
    printf(" encode MB/s | decode MB/s |\n|---|---|");
    for (unsigned j = 0; j < k; j++)
        printf("---|");
    printf("---|---|\n");
    for (size_t ci = 0; ci < sizeof cands / sizeof *cands; ci++) {
        const cand *c = &cands[ci];
        double *te = calloc(reps, sizeof *te), *td = calloc(reps, sizeof *td);
        size_t stored_total = 0, coded_bytes = 0;
        size_t plane_raw[8] = {0}, plane_stored[8] = {0};
        for (unsigned r = 0; r < reps; r++) {
            double t0 = cpu_now();
            for (size_t p = 0; p < nplanes; p++)
                clen[p] = encode(c, cc, planes + p * m, m, comp + p * cap, cap);
            te[r] = cpu_now() - t0;
        }
        /* What the pack would keep: a plane that saves < 1/50 is stored. */
        for (size_t p = 0; p < nplanes; p++) {
            int keep = clen[p] && clen[p] + m / 50 < m;
            if (!keep)
                clen[p] = 0;
            size_t s = keep ? clen[p] : m;
            stored_total += s + 5;
            plane_raw[p % k] += m;
            plane_stored[p % k] += s;
            if (keep)
                coded_bytes += m;
        }
        for (unsigned r = 0; r < reps; r++) {
            double t0 = cpu_now();
            for (size_t p = 0; p < nplanes; p++)
                if (clen[p] && decode(c, dc, ld, comp + p * cap, clen[p], back, m) < 0) {
                    fprintf(stderr, "%s: plane %zu does not decode\n", c->name, p);
                    return 1;
                }
            td[r] = cpu_now() - t0;
        }
        /* Check one plane round-trips byte for byte. */
        for (size_t p = 0; p < nplanes; p++)
            if (clen[p]) {
                decode(c, dc, ld, comp + p * cap, clen[p], back, m);
                if (memcmp(back, planes + p * m, m)) {
                    fprintf(stderr, "%s: plane %zu differs\n", c->name, p);
                    return 1;
                }
                break;
            }
        qsort(te, reps, sizeof *te, cmp_d);
        qsort(td, reps, sizeof *td, cmp_d);
        double enc_s = te[reps / 2], dec_s = td[reps / 2];
        printf("| %s | %.4f |", c->name, (double)got / (double)stored_total);
        for (unsigned j = 0; j < k; j++)
            printf(" %.3f |", (double)plane_raw[j] / (double)plane_stored[j]);
        printf(" %.0f | %.0f |\n", (double)got / enc_s / 1e6,
               coded_bytes ? (double)coded_bytes / dec_s / 1e6 : 0.0);
        free(te);
        free(td);
    }
    ZSTD_freeCCtx(cc);
    ZSTD_freeDCtx(dc);
    libdeflate_free_decompressor(ld);
    free(raw);
    free(planes);
    free(comp);
    free(back);
    free(clen);
    return 0;
}
