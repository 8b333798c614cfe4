/* Chunk AEAD: ckptfs's OpenSSL path (EVP AES-256-GCM; libsodium's HChaCha20
 * then EVP ChaCha20-Poly1305 for XChaCha20-Poly1305) against libsodium's
 * crypto_aead_* on random keys, nonces, associated data and lengths;
 * tampering; published known-answer vectors through ckptfs's own seal and
 * open; sharing one key between threads; packs written before the OpenSSL
 * path existed (tests/unit/data/v1-*.tpack). */
#include "testutil.h"
#include "ckpt.h"
#include "crypto.h"
#include "format.h"

#include <pthread.h>
#include <sodium.h>
#ifdef CKPT_USE_OPENSSL
#include <openssl/evp.h>
#endif

static const ckpt_cipher CIPHERS[] = {CKPT_CIPHER_AES256GCM, CKPT_CIPHER_XCHACHA20POLY1305};
/* OpenSSL where the library is built with it, then libsodium. */
static const int IMPLS[] = {1, 0};

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    size_t got = 0;
    cr_assert_eq(sodium_hex2bin(out, n, hex, strlen(hex), " ", &got, NULL), 0, "bad hex");
    cr_assert_eq(got, n, "hex has %zu bytes, expected %zu", got, n);
}

static void keys_from(pack_keys *pk, ckpt_cipher c, const uint8_t key[32], int openssl)
{
    cr_assert_eq(sodium_init() >= 0, 1);
    cr_assert_eq(pack_keys_from_key(pk, c, key, openssl), 0);
#ifdef CKPT_USE_OPENSSL
    cr_assert_str_eq(aead_impl(pk), openssl ? "openssl" : "libsodium");
#else
    cr_assert_str_eq(aead_impl(pk), "libsodium");
#endif
}

static int can_run(ckpt_cipher c)
{
    /* The reference is libsodium's, which needs hardware AES for AES-GCM. */
    return c != CKPT_CIPHER_AES256GCM || crypto_aead_aes256gcm_is_available();
}

/* libsodium's own functions, the reference. */
static void ref_seal(ckpt_cipher c, const uint8_t *key, const uint8_t nonce[24], const uint8_t *ad,
                     size_t ad_len, const uint8_t *in, size_t len, uint8_t *out)
{
    unsigned long long clen = 0;
    if (c == CKPT_CIPHER_AES256GCM)
        crypto_aead_aes256gcm_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce, key);
    else
        crypto_aead_xchacha20poly1305_ietf_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce,
                                                   key);
    cr_assert_eq(clen, len + TPACK_AEAD_TAG);
}

static int ref_open(ckpt_cipher c, const uint8_t *key, const uint8_t nonce[24], const uint8_t *ad,
                    size_t ad_len, const uint8_t *in, size_t len, uint8_t *out)
{
    unsigned long long mlen;
    return c == CKPT_CIPHER_AES256GCM
               ? crypto_aead_aes256gcm_decrypt(out, &mlen, NULL, in, len, ad, ad_len, nonce, key)
               : crypto_aead_xchacha20poly1305_ietf_decrypt(out, &mlen, NULL, in, len, ad, ad_len,
                                                            nonce, key);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Every way a sealed message can be altered fails to open, on both paths. */
static void expect_tamper_fails(ckpt_cipher c, pack_keys pks[2], const uint8_t nonce[24],
                                const uint8_t *ad, size_t ad_len, const uint8_t *sealed, size_t len)
{
    size_t slen = len + TPACK_AEAD_TAG;
    uint8_t *bad = malloc(slen), *out = malloc(len + 1);
    uint8_t *ad2 = malloc(ad_len + 1);
    uint8_t n2[24];
    cr_assert(bad && out && ad2);
    for (int what = 0; what < 5; what++) {
        memcpy(bad, sealed, slen);
        memcpy(ad2, ad, ad_len);
        memcpy(n2, nonce, 24);
        size_t ad2_len = ad_len;
        switch (what) {
        case 0: /* ciphertext */
            if (len == 0)
                continue;
            bad[randombytes_uniform((uint32_t)len)] ^= (uint8_t)(1u << randombytes_uniform(8));
            break;
        case 1: /* tag */
            bad[len + randombytes_uniform(TPACK_AEAD_TAG)] ^=
                (uint8_t)(1u << randombytes_uniform(8));
            break;
        case 2: /* associated data: a flipped bit, or one byte more */
            if (ad_len)
                ad2[randombytes_uniform((uint32_t)ad_len)] ^=
                    (uint8_t)(1u << randombytes_uniform(8));
            else
                ad2[ad2_len++] = 0;
            break;
        case 3: /* nonce: AES-GCM reads 12 bytes; XChaCha's first 16 go to HChaCha20 */
            n2[randombytes_uniform(c == CKPT_CIPHER_AES256GCM ? 12 : 16)] ^=
                (uint8_t)(1u << randombytes_uniform(8));
            break;
        case 4: /* XChaCha: the nonce bytes that ChaCha20 itself reads */
            if (c == CKPT_CIPHER_AES256GCM)
                continue;
            n2[16 + randombytes_uniform(8)] ^= (uint8_t)(1u << randombytes_uniform(8));
            break;
        }
        for (int i = 0; i < 2; i++) {
            memset(out, 0xa5, len + 1);
            cr_assert_eq(aead_open_nonce(&pks[i], n2, ad2, ad2_len, bad, slen, out), -EBADMSG,
                         "%s/%s: tamper %d, len %zu opened", ckpt_cipher_name(c),
                         aead_impl(&pks[i]), what, len);
            cr_assert(all_zero(out, len), "failed open leaves plaintext in out");
            cr_assert_eq(out[len], 0xa5, "failed open writes past the plaintext");
        }
        if (can_run(c))
            cr_assert_neq(ref_open(c, pks[0].subkey, n2, ad2, ad2_len, bad, slen, out), 0);
    }
    free(bad);
    free(out);
    free(ad2);
}

static void cross_check(ckpt_cipher c, size_t len, size_t ad_len)
{
    uint8_t key[32], nonce[24];
    randombytes_buf(key, sizeof key);
    randombytes_buf(nonce, sizeof nonce);
    uint8_t *ad = malloc(ad_len + 1), *in = malloc(len + 1);
    uint8_t *sealed[2], *ref = malloc(len + TPACK_AEAD_TAG), *out = malloc(len + 1);
    cr_assert(ad && in && ref && out);
    randombytes_buf(ad, ad_len);
    randombytes_buf(in, len);
    pack_keys pks[2];
    for (int i = 0; i < 2; i++) {
        keys_from(&pks[i], c, key, IMPLS[i]);
        sealed[i] = malloc(len + TPACK_AEAD_TAG);
        cr_assert_not_null(sealed[i]);
        cr_assert_eq(aead_seal_nonce(&pks[i], nonce, ad, ad_len, in, len, sealed[i]), 0);
    }
    cr_assert_arr_eq(sealed[0], sealed[1], len + TPACK_AEAD_TAG,
                     "%s, len %zu, ad %zu: OpenSSL and libsodium paths differ", ckpt_cipher_name(c),
                     len, ad_len);
    if (can_run(c)) {
        ref_seal(c, key, nonce, ad, ad_len, in, len, ref);
        cr_assert_arr_eq(sealed[0], ref, len + TPACK_AEAD_TAG,
                         "%s, len %zu: differs from libsodium's crypto_aead_*", ckpt_cipher_name(c),
                         len);
        cr_assert_eq(ref_open(c, key, nonce, ad, ad_len, sealed[0], len + TPACK_AEAD_TAG, out), 0);
        cr_assert_arr_eq(out, in, len);
    }
    /* Each path opens the other's output. */
    for (int i = 0; i < 2; i++) {
        memset(out, 0, len + 1);
        cr_assert_eq(
            aead_open_nonce(&pks[i], nonce, ad, ad_len, sealed[1 - i], len + TPACK_AEAD_TAG, out),
            0, "%s/%s cannot open len %zu", ckpt_cipher_name(c), aead_impl(&pks[i]), len);
        cr_assert_arr_eq(out, in, len);
    }
    expect_tamper_fails(c, pks, nonce, ad, ad_len, sealed[0], len);
    for (int i = 0; i < 2; i++) {
        pack_keys_free(&pks[i]);
        cr_assert_null(pks[i].subkey);
        cr_assert_null(pks[i].evp);
        free(sealed[i]);
    }
    free(ad);
    free(in);
    free(ref);
    free(out);
}

Test(crypto, openssl_and_libsodium_agree)
{
    static const size_t lens[] = {0, 1, 15, 16, 17, 4095, (1u << 20) + 3};
    static const size_t ad_lens[] = {0, 1, CHUNK_AD_BYTES, TPACK_HEADER_SIZE};
    for (size_t ci = 0; ci < 2; ci++)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            for (size_t ai = 0; ai < sizeof ad_lens / sizeof *ad_lens; ai++)
                cross_check(CIPHERS[ci], lens[li], ad_lens[ai]);
            cross_check(CIPHERS[ci], lens[li], randombytes_uniform(300));
        }
    /* Random lengths, short and long. */
    for (int k = 0; k < 40; k++)
        cross_check(CIPHERS[k & 1], randombytes_uniform(k < 30 ? 600 : 300000),
                    randombytes_uniform(200));
}

/* aead_seal's nonce is the chunk number, u64 little-endian, then zeros
 * (core/FORMAT.md section 5), built here independently. */
Test(crypto, chunk_number_nonce)
{
    static const uint64_t ids[] = {
        0, 1, 255, 256, 0x0123456789abcdefull, UINT64_MAX - 1, TPACK_INDEX_NONCE_ID};
    uint8_t key[32], ad[CHUNK_AD_BYTES], in[1000], got[1000 + TPACK_AEAD_TAG], want[sizeof got],
        out[1000];
    randombytes_buf(key, sizeof key);
    randombytes_buf(in, sizeof in);
    cr_assert_eq(TPACK_INDEX_NONCE_ID, UINT64_MAX);
    uint8_t pack_id[16];
    randombytes_buf(pack_id, sizeof pack_id);
    chunk_ad(ad, pack_id, 5, 2, 3, sizeof in, 1, 2);
    for (size_t ci = 0; ci < 2; ci++) {
        ckpt_cipher c = CIPHERS[ci];
        for (int i = 0; i < 2; i++) {
            pack_keys pk;
            keys_from(&pk, c, key, IMPLS[i]);
            for (size_t k = 0; k < sizeof ids / sizeof *ids; k++) {
                uint8_t nonce[24] = {0};
                for (int b = 0; b < 8; b++)
                    nonce[b] = (uint8_t)(ids[k] >> (8 * b));
                cr_assert_eq(aead_seal(&pk, ids[k], ad, sizeof ad, in, sizeof in, got), 0);
                cr_assert_eq(aead_seal_nonce(&pk, nonce, ad, sizeof ad, in, sizeof in, want), 0);
                cr_assert_arr_eq(got, want, sizeof got);
                if (can_run(c)) {
                    ref_seal(c, key, nonce, ad, sizeof ad, in, sizeof in, want);
                    cr_assert_arr_eq(got, want, sizeof got);
                }
                cr_assert_eq(aead_open(&pk, ids[k], ad, sizeof ad, got, sizeof got, out), 0);
                cr_assert_arr_eq(out, in, sizeof in);
                if (ids[k] != 0)
                    cr_assert_eq(aead_open(&pk, ids[k] - 1, ad, sizeof ad, got, sizeof got, out),
                                 -EBADMSG);
            }
            pack_keys_free(&pk);
        }
    }
}

Test(crypto, in_place_and_short_input)
{
    uint8_t key[32], nonce[24], ad[7], buf[5000 + TPACK_AEAD_TAG], in[5000], sealed[sizeof buf];
    randombytes_buf(key, sizeof key);
    randombytes_buf(nonce, sizeof nonce);
    randombytes_buf(ad, sizeof ad);
    randombytes_buf(in, sizeof in);
    for (size_t ci = 0; ci < 2; ci++)
        for (int i = 0; i < 2; i++) {
            pack_keys pk;
            keys_from(&pk, CIPHERS[ci], key, IMPLS[i]);
            cr_assert_eq(aead_seal_nonce(&pk, nonce, ad, sizeof ad, in, sizeof in, sealed), 0);
            memcpy(buf, in, sizeof in);
            cr_assert_eq(aead_seal_nonce(&pk, nonce, ad, sizeof ad, buf, sizeof in, buf), 0);
            cr_assert_arr_eq(buf, sealed, sizeof sealed);
            cr_assert_eq(aead_open_nonce(&pk, nonce, ad, sizeof ad, buf, sizeof buf, buf), 0);
            cr_assert_arr_eq(buf, in, sizeof in);
            /* Shorter than a tag. */
            for (size_t n = 0; n < TPACK_AEAD_TAG; n++)
                cr_assert_eq(aead_open_nonce(&pk, nonce, ad, sizeof ad, sealed, n, buf), -EBADMSG);
            pack_keys_free(&pk);
        }
}

/* ------------------------------------------------- known-answer vectors */

static const char SUNSCREEN[] =
    "Ladies and Gentlemen of the class of '99: If I could offer you only one tip "
    "for the future, sunscreen would be it.";

static void kat(ckpt_cipher c, const char *key_hex, const uint8_t nonce[24], const char *ad_hex,
                const uint8_t *pt, size_t len, const char *ct_tag_hex)
{
    uint8_t key[32], ad[64], *want = malloc(len + TPACK_AEAD_TAG),
                             *got = malloc(len + TPACK_AEAD_TAG);
    uint8_t *out = malloc(len + 1);
    cr_assert(want && got && out);
    size_t ad_len = strlen(ad_hex) / 2;
    unhex(key_hex, key, 32);
    unhex(ad_hex, ad, ad_len);
    unhex(ct_tag_hex, want, len + TPACK_AEAD_TAG);
    for (int i = 0; i < 2; i++) {
        pack_keys pk;
        keys_from(&pk, c, key, IMPLS[i]);
        if (!can_run(c) && !pk.evp) {
            pack_keys_free(&pk);
            continue;
        }
        cr_assert_eq(aead_seal_nonce(&pk, nonce, ad, ad_len, pt, len, got), 0);
        cr_assert_arr_eq(got, want, len + TPACK_AEAD_TAG, "%s/%s: wrong ciphertext or tag",
                         ckpt_cipher_name(c), aead_impl(&pk));
        cr_assert_eq(aead_open_nonce(&pk, nonce, ad, ad_len, want, len + TPACK_AEAD_TAG, out), 0);
        cr_assert_arr_eq(out, pt, len);
        want[len] ^= 1;
        cr_assert_eq(aead_open_nonce(&pk, nonce, ad, ad_len, want, len + TPACK_AEAD_TAG, out),
                     -EBADMSG);
        want[len] ^= 1;
        pack_keys_free(&pk);
    }
    free(want);
    free(got);
    free(out);
}

/* draft-irtf-cfrg-xchacha-03, appendix A.3.1: HChaCha20 and then the
 * RFC 8439 AEAD, which is all of ckptfs's XChaCha20-Poly1305 path. */
Test(crypto, kat_xchacha20poly1305_draft_a3_1)
{
    uint8_t nonce[24];
    unhex("404142434445464748494a4b4c4d4e4f5051525354555657", nonce, 24);
    kat(CKPT_CIPHER_XCHACHA20POLY1305,
        "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f", nonce,
        "50515253c0c1c2c3c4c5c6c7", (const uint8_t *)SUNSCREEN, strlen(SUNSCREEN),
        "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb"
        "731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452"
        "2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9"
        "21f9664c97637da9768812f615c68b13b52e"
        "c0875924c1c7987947deafd8780acf49");
}

/* The GCM specification's test case 16 (AES-256, 96-bit IV, with AAD; also
 * in NIST's GCM validation). The nonce's last 12 bytes are not read. */
Test(crypto, kat_aes256gcm_test_case_16)
{
    uint8_t nonce[24], pt[60];
    memset(nonce, 0xee, sizeof nonce);
    unhex("cafebabefacedbaddecaf888", nonce, 12);
    unhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
          "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
          pt, sizeof pt);
    kat(CKPT_CIPHER_AES256GCM, "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
        nonce, "feedfacedeadbeeffeedfacedeadbeefabaddad2", pt, sizeof pt,
        "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
        "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        "76fc6ece0f4e1768cddf8853bb2d551b");
}

/* RFC 8439 section 2.8.2, the AEAD that XChaCha20-Poly1305 runs after
 * HChaCha20, in both libraries ckptfs composes (it has no 12-byte-nonce
 * mode of its own). */
Test(crypto, kat_chacha20poly1305_rfc8439_2_8_2)
{
    uint8_t key[32], nonce[12], ad[12], want[114 + 16], got[sizeof want];
    size_t len = strlen(SUNSCREEN);
    cr_assert_eq(len, 114);
    unhex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f", key, 32);
    unhex("070000004041424344454647", nonce, 12);
    unhex("50515253c0c1c2c3c4c5c6c7", ad, 12);
    unhex("d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6"
          "3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36"
          "92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc"
          "3ff4def08e4b7a9de576d26586cec64b6116"
          "1ae10b594f09e26a7e902ecbd0600691",
          want, sizeof want);
    cr_assert_eq(sodium_init() >= 0, 1);
    unsigned long long n;
    crypto_aead_chacha20poly1305_ietf_encrypt(got, &n, (const uint8_t *)SUNSCREEN, len, ad,
                                              sizeof ad, NULL, nonce, key);
    cr_assert_arr_eq(got, want, sizeof want, "libsodium");
#ifdef CKPT_USE_OPENSSL
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    uint8_t out[114];
    int l1, l2;
    cr_assert_eq(EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, key, nonce), 1);
    cr_assert_eq(EVP_EncryptUpdate(ctx, NULL, &l1, ad, sizeof ad), 1);
    cr_assert_eq(EVP_EncryptUpdate(ctx, got, &l1, (const uint8_t *)SUNSCREEN, (int)len), 1);
    cr_assert_eq(EVP_EncryptFinal_ex(ctx, got + l1, &l2), 1);
    cr_assert_eq((size_t)(l1 + l2), len);
    cr_assert_eq(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, got + len), 1);
    cr_assert_arr_eq(got, want, sizeof want, "OpenSSL");
    cr_assert_eq(EVP_DecryptInit_ex(ctx, NULL, NULL, key, nonce), 1);
    cr_assert_eq(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, want + len), 1);
    cr_assert_eq(EVP_DecryptUpdate(ctx, NULL, &l1, ad, sizeof ad), 1);
    cr_assert_eq(EVP_DecryptUpdate(ctx, out, &l1, want, (int)len), 1);
    cr_assert_eq(EVP_DecryptFinal_ex(ctx, out + l1, &l2), 1);
    cr_assert_arr_eq(out, SUNSCREEN, len);
    EVP_CIPHER_CTX_free(ctx);
#endif
}

/* ------------------------------------------------------------- threads */

typedef struct thr_arg {
    const pack_keys *pk;
    const uint8_t *key;
    unsigned seed;
    int bad;
} thr_arg;

static void *thr_main(void *v)
{
    thr_arg *a = v;
    ckpt_cipher c = a->pk->cipher;
    size_t max = 70000;
    uint8_t *in = malloc(max), *s = malloc(max + TPACK_AEAD_TAG), *r = malloc(max + TPACK_AEAD_TAG);
    uint8_t *out = malloc(max), ad[CHUNK_AD_BYTES];
    if (!in || !s || !r || !out) {
        a->bad = 1;
        goto done;
    }
    for (unsigned k = 0; k < 300; k++) {
        size_t len = randombytes_uniform((uint32_t)max);
        uint64_t id = (uint64_t)a->seed << 32 | k;
        randombytes_buf(in, len);
        randombytes_buf(ad, sizeof ad);
        if (aead_seal(a->pk, id, ad, sizeof ad, in, len, s) != 0) {
            a->bad = 2;
            break;
        }
        if (can_run(c)) {
            uint8_t nonce[24] = {0};
            for (int b = 0; b < 8; b++)
                nonce[b] = (uint8_t)(id >> (8 * b));
            unsigned long long clen;
            if (c == CKPT_CIPHER_AES256GCM)
                crypto_aead_aes256gcm_encrypt(r, &clen, in, len, ad, sizeof ad, NULL, nonce,
                                              a->key);
            else
                crypto_aead_xchacha20poly1305_ietf_encrypt(r, &clen, in, len, ad, sizeof ad, NULL,
                                                           nonce, a->key);
            if (memcmp(s, r, len + TPACK_AEAD_TAG) != 0) {
                a->bad = 3;
                break;
            }
        }
        if (aead_open(a->pk, id, ad, sizeof ad, s, len + TPACK_AEAD_TAG, out) != 0 ||
            memcmp(out, in, len) != 0) {
            a->bad = 4;
            break;
        }
        s[len] ^= 1;
        if (aead_open(a->pk, id, ad, sizeof ad, s, len + TPACK_AEAD_TAG, out) != -EBADMSG) {
            a->bad = 5;
            break;
        }
    }
done:
    free(in);
    free(s);
    free(r);
    free(out);
    return NULL;
}

/* Packs seal and open from several workers at once under one pack key. */
Test(crypto, threads_share_a_key)
{
    enum { N = 6 };
    for (size_t ci = 0; ci < 2; ci++) {
        uint8_t key[32];
        randombytes_buf(key, sizeof key);
        pack_keys pk;
        keys_from(&pk, CIPHERS[ci], key, 1);
        pthread_t t[N];
        thr_arg a[N];
        for (unsigned i = 0; i < N; i++) {
            a[i] = (thr_arg){.pk = &pk, .key = key, .seed = i};
            cr_assert_eq(pthread_create(&t[i], NULL, thr_main, &a[i]), 0);
        }
        for (unsigned i = 0; i < N; i++) {
            pthread_join(t[i], NULL);
            cr_assert_eq(a[i].bad, 0, "%s: thread %u failed at step %d",
                         ckpt_cipher_name(CIPHERS[ci]), i, a[i].bad);
        }
        pack_keys_free(&pk);
    }
}

Test(crypto, default_cipher)
{
    cr_assert_eq(sodium_init() >= 0, 1);
    ckpt_cipher want = crypto_aead_aes256gcm_is_available() ? CKPT_CIPHER_AES256GCM
                                                            : CKPT_CIPHER_XCHACHA20POLY1305;
    cr_assert_eq(ckpt_cipher_default(), want);
    cr_assert(ckpt_cipher_available(ckpt_cipher_default()));
    cr_assert(ckpt_cipher_available(CKPT_CIPHER_XCHACHA20POLY1305));
#ifdef CKPT_USE_OPENSSL
    cr_assert(ckpt_cipher_available(CKPT_CIPHER_AES256GCM),
              "OpenSSL runs AES-GCM with or without AES-NI");
#endif
}

/* ------------------------------------------- packs from before OpenSSL */

/* tests/unit/data/v1-{xchacha20poly1305,aes256gcm}.tpack were written by
 * `ckpt pack --chunk-size 64K --cipher ...` at commit 992a407, when libsodium
 * sealed every chunk, from: gen/ = `ckpt-gen gen --preset tiny --layers 1
 * --dim 16 --vocab 64 --seed 7`, and opaque.bin = 70000 bytes, byte i being
 * (31 i + 7) mod 251. The key file held the hex of bytes 00..1f. */
static char *data_path(const char *name)
{
    const char *src = __FILE__;
    const char *slash = strrchr(src, '/');
    size_t dlen = slash ? (size_t)(slash - src) : 1;
    size_t n = dlen + strlen("/data/") + strlen(name) + 1;
    char *p = malloc(n);
    cr_assert_not_null(p);
    snprintf(p, n, "%.*s/data/%s", (int)dlen, slash ? src : ".", name);
    return p;
}

static void expect_sha(ckpt_pack *p, const char *name, uint64_t size, const char *sha_hex)
{
    ckpt_err e = {0};
    long i = ckpt_file_find(p, name);
    cr_assert_geq(i, 0, "%s missing", name);
    uint8_t *buf = malloc(size + 1), sha[32], want[32];
    cr_assert_not_null(buf);
    cr_assert_eq(ckpt_file_pread(p, (size_t)i, buf, size + 1, 0, &e), (ssize_t)size, "%s: %s", name,
                 e.msg);
    tu_sha256(buf, size, sha);
    unhex(sha_hex, want, 32);
    cr_assert_arr_eq(sha, want, 32, "%s: wrong contents", name);
    if (!strcmp(name, "opaque.bin"))
        for (size_t k = 0; k < size; k++)
            cr_assert_eq(buf[k], (uint8_t)((31 * k + 7) % 251));
    free(buf);
}

static void read_old_pack(const char *name, const char *cipher)
{
    ckpt_cipher c;
    cr_assert_eq(ckpt_cipher_parse(cipher, &c), 0);
    if (!ckpt_cipher_available(c))
        cr_skip_test("%s is not available here", cipher);
    char *path = data_path(name);
    uint8_t raw[32];
    for (int i = 0; i < 32; i++)
        raw[i] = (uint8_t)i;
    ckpt_err e = {0};
    ckpt_key *key;
    cr_assert_eq(ckpt_key_from_bytes(raw, &key, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "%s: %s", path, e.msg);
    ckpt_pack_info info;
    ckpt_info(p, &info);
    cr_assert_str_eq(info.cipher, cipher);
    cr_assert_eq(ckpt_file_count(p), 3);
    expect_sha(p, "opaque.bin", 70000,
               "b56c58471e5e93f1329a5878b818e0cd23ab1a59925a7dc2b1576063a9109955");
    expect_sha(p, "gen/config.json", 757,
               "2e672d9466b977b44f905df81c7b6cb87e2804d409dbb5b2343c1d181c323092");
    expect_sha(p, "gen/model.safetensors", 42712,
               "33f8544578f1f9c09347fc2269aee8d3938e66332cb7e1ec08c905ea701902a0");
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    /* And not with another key. */
    raw[0] ^= 1;
    ckpt_key *wrong;
    cr_assert_eq(ckpt_key_from_bytes(raw, &wrong, &e), 0, "%s", e.msg);
    cr_assert_lt(ckpt_open(path, wrong, &p, &e), 0);
    ckpt_key_free(wrong);
    ckpt_key_free(key);
    free(path);
}

Test(crypto, reads_xchacha_pack_from_before)
{
    read_old_pack("v1-xchacha20poly1305.tpack", "xchacha20poly1305");
}

Test(crypto, reads_aes_pack_from_before)
{
    read_old_pack("v1-aes256gcm.tpack", "aes256gcm");
}
