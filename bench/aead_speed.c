/* Single-thread AEAD throughput, seal and open, for the chunk ciphers:
 * libsodium's crypto_aead_* called directly, ckptfs's aead_seal/aead_open on
 * its libsodium path and on its OpenSSL path (pooled contexts), and the
 * OpenSSL path with a fresh EVP_CIPHER_CTX per chunk (what the pool saves).
 * Figures are MB (10^6 bytes) of plaintext per CPU-second of this thread,
 * best of --reps runs of --secs each, so other load on the machine matters
 * less than it would to wall time.
 *
 *   make bench-aead                       (1 MiB and 64 KiB chunks)
 *   build/bench/aead_speed [--size BYTES] [--secs S] [--reps N]
 */
#include "crypto.h"
#include "format.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef CKPT_USE_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#endif

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum impl { SODIUM_DIRECT, CKPT_SODIUM, CKPT_OPENSSL, OPENSSL_FRESH_CTX, N_IMPL };
static const char *const IMPL_NAME[N_IMPL] = {
    "libsodium crypto_aead_*",
    "ckptfs, libsodium path",
    "ckptfs, OpenSSL path",
    "OpenSSL, new ctx per chunk",
};

typedef struct job {
    ckpt_cipher cipher;
    enum impl impl;
    pack_keys pk;
    uint8_t key[32];
    uint8_t ad[CHUNK_AD_BYTES];
    uint8_t *in, *sealed, *out;
    size_t len;
} job;

static void nonce_of(uint64_t id, uint8_t nonce[24])
{
    memset(nonce, 0, 24);
    for (int b = 0; b < 8; b++)
        nonce[b] = (uint8_t)(id >> (8 * b));
}

#ifdef CKPT_USE_OPENSSL
/* The OpenSSL path without the pool: everything set up per chunk. */
static int fresh_ctx(job *j, int enc, const uint8_t nonce[24], const uint8_t *in, size_t len,
                     uint8_t *out)
{
    uint8_t k2[32], iv[12], fin[32];
    const uint8_t *key = j->key, *ivp = nonce;
    int aes = j->cipher == CKPT_CIPHER_AES256GCM, n, ok;
    if (!aes) {
        crypto_core_hchacha20(k2, nonce, j->key, NULL);
        memset(iv, 0, 4);
        memcpy(iv + 4, nonce + 16, 8);
        key = k2;
        ivp = iv;
    }
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    ok = ctx && EVP_CipherInit_ex(ctx, aes ? EVP_aes_256_gcm() : EVP_chacha20_poly1305(), NULL, key,
                                  ivp, enc) == 1;
    if (ok && !enc)
        ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, (void *)(in + len)) == 1;
    ok = ok && EVP_CipherUpdate(ctx, NULL, &n, j->ad, sizeof j->ad) == 1;
    ok = ok && EVP_CipherUpdate(ctx, out, &n, in, (int)len) == 1;
    ok = ok && EVP_CipherFinal_ex(ctx, fin, &n) == 1;
    if (ok && enc)
        ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, out + len) == 1;
    EVP_CIPHER_CTX_free(ctx);
    sodium_memzero(k2, sizeof k2);
    return ok ? 0 : -1;
}
#endif

static int seal_one(job *j, uint64_t id)
{
    uint8_t nonce[24];
    unsigned long long clen;
    nonce_of(id, nonce);
    switch (j->impl) {
    case SODIUM_DIRECT:
        return j->cipher == CKPT_CIPHER_AES256GCM
                   ? crypto_aead_aes256gcm_encrypt(j->sealed, &clen, j->in, j->len, j->ad,
                                                   sizeof j->ad, NULL, nonce, j->key)
                   : crypto_aead_xchacha20poly1305_ietf_encrypt(
                         j->sealed, &clen, j->in, j->len, j->ad, sizeof j->ad, NULL, nonce, j->key);
    case CKPT_SODIUM:
    case CKPT_OPENSSL:
        return aead_seal(&j->pk, id, j->ad, sizeof j->ad, j->in, j->len, j->sealed);
    default:
#ifdef CKPT_USE_OPENSSL
        return fresh_ctx(j, 1, nonce, j->in, j->len, j->sealed);
#else
        return -1;
#endif
    }
}

static int open_one(job *j, uint64_t id)
{
    uint8_t nonce[24];
    unsigned long long mlen;
    nonce_of(id, nonce);
    size_t slen = j->len + TPACK_AEAD_TAG;
    switch (j->impl) {
    case SODIUM_DIRECT:
        return j->cipher == CKPT_CIPHER_AES256GCM
                   ? crypto_aead_aes256gcm_decrypt(j->out, &mlen, NULL, j->sealed, slen, j->ad,
                                                   sizeof j->ad, nonce, j->key)
                   : crypto_aead_xchacha20poly1305_ietf_decrypt(
                         j->out, &mlen, NULL, j->sealed, slen, j->ad, sizeof j->ad, nonce, j->key);
    case CKPT_SODIUM:
    case CKPT_OPENSSL:
        return aead_open(&j->pk, id, j->ad, sizeof j->ad, j->sealed, slen, j->out);
    default:
#ifdef CKPT_USE_OPENSSL
        return fresh_ctx(j, 0, nonce, j->sealed, j->len, j->out);
#else
        return -1;
#endif
    }
}

/* MB per CPU-second: seal (open 0) or open (open 1) under one nonce over and
 * over, best of reps runs of secs CPU-seconds each. */
static double measure(job *j, int open, double secs, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_now(), t;
        uint64_t n = 0;
        do {
            int rc = open ? open_one(j, 7) : seal_one(j, 7);
            if (rc != 0) {
                fprintf(stderr, "aead_speed: %s %s failed\n", IMPL_NAME[j->impl],
                        open ? "open" : "seal");
                exit(1);
            }
            n++;
            t = cpu_now() - t0;
        } while (t < secs);
        double mbs = (double)n * (double)j->len / t / 1e6;
        if (mbs > best)
            best = mbs;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t size = 1 << 20;
    double secs = 0.4;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc)
            secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: aead_speed [--size BYTES] [--secs S] [--reps N]\n");
            return 2;
        }
    }
    if (sodium_init() < 0)
        return 1;
    job j;
    memset(&j, 0, sizeof j);
    j.len = size;
    j.in = malloc(size);
    j.sealed = malloc(size + TPACK_AEAD_TAG);
    j.out = malloc(size);
    if (!j.in || !j.sealed || !j.out)
        return 1;
    randombytes_buf(j.in, size);
    randombytes_buf(j.key, sizeof j.key);
    randombytes_buf(j.ad, sizeof j.ad);
#ifdef CKPT_USE_OPENSSL
    printf("# %s; libsodium %s\n", OpenSSL_version(OPENSSL_VERSION), sodium_version_string());
#else
    printf("# built without libcrypto (SHA256=sodium); libsodium %s\n", sodium_version_string());
#endif
    printf("# %zu-byte chunks, 46-byte AD, one thread; MB/s per CPU-second, best of %d x %.2f s\n",
           size, reps, secs);
    printf("%-18s %-28s %10s %10s\n", "cipher", "implementation", "seal", "open");
    static const ckpt_cipher ciphers[] = {CKPT_CIPHER_AES256GCM, CKPT_CIPHER_XCHACHA20POLY1305};
    for (size_t c = 0; c < 2; c++) {
        j.cipher = ciphers[c];
        for (int im = 0; im < N_IMPL; im++) {
            j.impl = (enum impl)im;
            if (j.cipher == CKPT_CIPHER_AES256GCM && im <= CKPT_SODIUM &&
                !crypto_aead_aes256gcm_is_available())
                continue;
#ifndef CKPT_USE_OPENSSL
            if (im >= CKPT_OPENSSL)
                continue;
#endif
            if (im == CKPT_SODIUM || im == CKPT_OPENSSL) {
                if (pack_keys_from_key(&j.pk, j.cipher, j.key, im == CKPT_OPENSSL) < 0)
                    return 1;
            }
            double s = measure(&j, 0, secs, reps);
            double o = measure(&j, 1, secs, reps);
            printf("%-18s %-28s %10.0f %10.0f\n", ckpt_cipher_name(j.cipher), IMPL_NAME[im], s, o);
            fflush(stdout);
            if (im == CKPT_SODIUM || im == CKPT_OPENSSL)
                pack_keys_free(&j.pk);
        }
    }
    free(j.in);
    free(j.sealed);
    free(j.out);
    return 0;
}
