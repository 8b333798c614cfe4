/* Single-core speed of the chunk codec on real tensor chunks (issue 15's
 * targets: decode >= 1.5 GB/s of bf16 output per core compressed, >= 1.2
 * GB/s compressed + encrypted; encode >= 0.5 GB/s compressed + encrypted).
 *
 * The data is cut into chunks (1 MiB by default) held in memory, and each
 * stage does per chunk what the pack writer's workers and the reader do:
 *   encode            chunk_encode + CRC-32 of the raw bytes
 *   encode+seal       chunk_encode + AEAD seal (no CRC in encrypted packs)
 *   decode            chunk_decode + CRC-32 check
 *   open+decode       AEAD open + chunk_decode
 * Speeds are GB/s of raw (decoded) bytes per CPU-second of this thread,
 * the median of --reps runs. The cipher is whatever core/src/crypto.c
 * uses for the named cipher in this build.
 *
 * Usage: codec_speed FILE [--elem K] [--mib N] [--chunk KIB] [--reps R] [--level L]
 *   FILE    a safetensors file (its header is skipped) or raw tensor bytes
 *   --elem  element size the chunks are typed with (default 2: bf16;
 *           0: opaque, the encoder chooses)
 * Built by `make bench-codec`. */
#include "codec.h"
#include "crypto.h"
#include "format.h"

#include <libdeflate.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

typedef struct chunkbuf {
    uint8_t *payload, *sealed;
    size_t len;
    uint8_t codec, group;
    uint32_t crc;
} chunkbuf;

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    unsigned elem = 2, mib = 64, reps = 3, chunk_kib = 1024;
    int level = 6;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--elem") && i + 1 < argc)
            elem = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            chunk_kib = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--level") && i + 1 < argc)
            level = atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (!path || (elem != 0 && elem != 1 && elem != 2 && elem != 4 && elem != 8) || !mib || !reps ||
        chunk_kib < 64) {
        fprintf(
            stderr,
            "usage: codec_speed FILE [--elem 0|1|2|4|8] [--mib N] [--chunk KIB] [--reps R] [--level L]\n");
        return 2;
    }
    if (sodium_init() < 0)
        return 1;
    size_t cs = (size_t)chunk_kib << 10;
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
        if (fgetc(f) == '{' && hl < (100u << 20))
            skip = 8 + hl;
    }
    fseek(f, (long)skip, SEEK_SET);
    size_t total = (size_t)mib << 20;
    uint8_t *raw = malloc(total);
    size_t got = fread(raw, 1, total, f);
    fclose(f);
    got -= got % cs;
    size_t n = got / cs;
    if (!n) {
        fprintf(stderr, "%s: less than one chunk of data\n", path);
        return 1;
    }

    chunkbuf *c = calloc(n, sizeof *c);
    for (size_t i = 0; i < n; i++) {
        c[i].payload = malloc(cs + TPACK_CHUNK_OVERHEAD);
        c[i].sealed = malloc(cs + TPACK_CHUNK_OVERHEAD);
    }
    uint8_t *out = malloc(cs), *scratch = malloc(cs), *plain = malloc(cs + TPACK_CHUNK_OVERHEAD);
    uint8_t master[32], pack_id[16];
    randombytes_buf(master, sizeof master);
    randombytes_buf(pack_id, sizeof pack_id);
    chunk_encoder enc;
    chunk_encoder_init(&enc);

    static const struct {
        const char *name;
        ckpt_cipher c;
    } ciphers[] = {
        {"xchacha20poly1305", CKPT_CIPHER_XCHACHA20POLY1305},
        {"aes256gcm", CKPT_CIPHER_AES256GCM},
    };
    double *t = calloc(reps, sizeof *t);
    printf(
        "%s: %zu chunks of %u KiB, element size %u, level %d; GB/s of raw bytes per CPU-second of one thread, "
        "median of %u\n\n",
        path, n, chunk_kib, elem, level, reps);

    /* encode (plain): what a worker does for an unencrypted pack. */
    size_t stored = 0;
    for (unsigned r = 0; r < reps; r++) {
        double t0 = cpu_now();
        stored = 0;
        for (size_t i = 0; i < n; i++) {
            if (chunk_encode(&enc, raw + i * cs, cs, elem, level, c[i].payload, &c[i].len,
                             &c[i].codec, &c[i].group) < 0)
                return 1;
            c[i].crc = (uint32_t)libdeflate_crc32(0, raw + i * cs, cs);
            stored += c[i].len;
        }
        t[r] = cpu_now() - t0;
    }
    printf("| stage | cipher | GB/s per core |\n|---|---|---|\n");
    printf("| ratio | | %.4f |\n", (double)got / (double)stored);
    printf("| encode | none | %.3f |\n", (double)got / median(t, reps) / 1e9);

    /* decode (plain): chunk_decode and the CRC check. */
    for (unsigned r = 0; r < reps; r++) {
        double t0 = cpu_now();
        for (size_t i = 0; i < n; i++) {
            const char *why = NULL;
            if (chunk_decode(c[i].payload, c[i].len, c[i].codec, c[i].group, CKPT_FORMAT_VERSION,
                             out, cs, scratch, &why) < 0 ||
                (uint32_t)libdeflate_crc32(0, out, cs) != c[i].crc) {
                fprintf(stderr, "chunk %zu does not decode: %s\n", i,
                        why ? why : "checksum mismatch");
                return 1;
            }
        }
        t[r] = cpu_now() - t0;
    }
    printf("| decode | none | %.3f |\n", (double)got / median(t, reps) / 1e9);

    for (size_t ci = 0; ci < sizeof ciphers / sizeof *ciphers; ci++) {
        if (!ckpt_cipher_available(ciphers[ci].c)) {
            printf("| encode+seal | %s | (not available on this CPU) |\n", ciphers[ci].name);
            continue;
        }
        pack_keys pk = {0};
        if (pack_keys_derive(&pk, ciphers[ci].c, master, pack_id) < 0)
            return 1;
        for (unsigned r = 0; r < reps; r++) {
            double t0 = cpu_now();
            for (size_t i = 0; i < n; i++) {
                size_t len;
                if (chunk_encode(&enc, raw + i * cs, cs, elem, level, plain, &len, &c[i].codec,
                                 &c[i].group) < 0)
                    return 1;
                uint8_t ad[CHUNK_AD_BYTES];
                chunk_ad(ad, pack_id, i, 0, i, (uint32_t)cs, c[i].codec, c[i].group);
                aead_seal(&pk, i, ad, sizeof ad, plain, len, c[i].sealed);
                c[i].len = len + TPACK_AEAD_TAG;
            }
            t[r] = cpu_now() - t0;
        }
        printf("| encode+seal | %s | %.3f |\n", ciphers[ci].name,
               (double)got / median(t, reps) / 1e9);
        for (unsigned r = 0; r < reps; r++) {
            double t0 = cpu_now();
            for (size_t i = 0; i < n; i++) {
                uint8_t ad[CHUNK_AD_BYTES];
                chunk_ad(ad, pack_id, i, 0, i, (uint32_t)cs, c[i].codec, c[i].group);
                const char *why = NULL;
                if (aead_open(&pk, i, ad, sizeof ad, c[i].sealed, c[i].len, plain) < 0 ||
                    chunk_decode(plain, c[i].len - TPACK_AEAD_TAG, c[i].codec, c[i].group,
                                 CKPT_FORMAT_VERSION, out, cs, scratch, &why) < 0) {
                    fprintf(stderr, "chunk %zu does not open: %s\n", i,
                            why ? why : "authentication failed");
                    return 1;
                }
            }
            t[r] = cpu_now() - t0;
        }
        printf("| open+decode | %s | %.3f |\n", ciphers[ci].name,
               (double)got / median(t, reps) / 1e9);
        if (memcmp(out, raw + (n - 1) * cs, cs)) {
            fprintf(stderr, "last chunk differs\n");
            return 1;
        }
        pack_keys_free(&pk);
    }
    chunk_encoder_free(&enc);
    chunk_decoder_release();
    for (size_t i = 0; i < n; i++) {
        free(c[i].payload);
        free(c[i].sealed);
    }
    free(c);
    free(t);
    free(out);
    free(scratch);
    free(plain);
    free(raw);
    return 0;
}
