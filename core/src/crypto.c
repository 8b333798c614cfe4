/* Subkeys, key check values and chunk AEAD. libsodium derives keys; chunks
 * and the index are sealed by OpenSSL's EVP where the library is built with
 * libcrypto (CKPT_USE_OPENSSL) and by libsodium otherwise, or if OpenSSL
 * fails: both give the same bytes (tests/unit/test_crypto.c). */
#include "crypto.h"
#include "format.h"

#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#ifdef CKPT_USE_OPENSSL
#include <openssl/evp.h>
#endif

static const char SUBKEY_CONTEXT[16] = "tpack-subkey-v1";
static const char CHECK_CONTEXT[16] = "tpack-keycheck1";

/* Keyed BLAKE2b over a fixed context plus the pack id: a different key per
 * pack, so chunk counters can serve as nonces without ever repeating. */
static void derive(uint8_t *out, size_t out_len, const char ctx[16], const uint8_t *master,
                   const uint8_t pack_id[16])
{
    uint8_t msg[32];
    memcpy(msg, ctx, 16);
    memcpy(msg + 16, pack_id, 16);
    crypto_generichash(out, out_len, msg, sizeof msg, master, CKPT_KEY_BYTES);
}

void key_check_value(const uint8_t *master, const uint8_t pack_id[16], uint8_t out[16])
{
    derive(out, 16, CHECK_CONTEXT, master, pack_id);
}

#ifdef CKPT_USE_OPENSSL
static struct aead_evp *evp_new(void);
static void evp_free(struct aead_evp *e);
#endif

static int keys_init(pack_keys *pk, ckpt_cipher cipher, int use_openssl)
{
    pk->evp = NULL;
    pk->subkey = ckpt_secret_alloc(CKPT_KEY_BYTES);
    if (!pk->subkey)
        return -ENOMEM;
    pk->cipher = cipher;
#ifdef CKPT_USE_OPENSSL
    /* No contexts: libsodium seals (same bytes, slower). */
    if (use_openssl)
        pk->evp = evp_new();
#endif
    return 0;
}

int pack_keys_derive_impl(pack_keys *pk, ckpt_cipher cipher, const uint8_t *master,
                          const uint8_t pack_id[16], int use_openssl)
{
    int rc = keys_init(pk, cipher, use_openssl);
    if (rc == 0)
        derive(pk->subkey, CKPT_KEY_BYTES, SUBKEY_CONTEXT, master, pack_id);
    return rc;
}

int pack_keys_from_key(pack_keys *pk, ckpt_cipher cipher, const uint8_t key[32], int use_openssl)
{
    int rc = keys_init(pk, cipher, use_openssl);
    if (rc == 0)
        memcpy(pk->subkey, key, CKPT_KEY_BYTES);
    return rc;
}

int pack_keys_derive(pack_keys *pk, ckpt_cipher cipher, const uint8_t *master,
                     const uint8_t pack_id[16])
{
    return pack_keys_derive_impl(pk, cipher, master, pack_id, 1);
}

void pack_keys_free(pack_keys *pk)
{
#ifdef CKPT_USE_OPENSSL
    evp_free(pk->evp);
#endif
    pk->evp = NULL;
    ckpt_secret_free(pk->subkey);
    pk->subkey = NULL;
}

const char *aead_impl(const pack_keys *pk)
{
    return pk->evp ? "openssl" : "libsodium";
}

void chunk_ad(uint8_t ad[CHUNK_AD_BYTES], const uint8_t pack_id[16], uint64_t chunk_id,
              uint64_t extent_id, uint64_t chunk_in_extent, uint32_t raw_size, uint8_t codec,
              uint8_t elem_size)
{
    memcpy(ad, pack_id, 16);
    put_u64(ad + 16, chunk_id);
    put_u64(ad + 24, extent_id);
    put_u64(ad + 32, chunk_in_extent);
    put_u32(ad + 40, raw_size);
    ad[44] = codec;
    ad[45] = elem_size;
}

static void make_nonce(uint8_t nonce[24], uint64_t id)
{
    memset(nonce, 0, 24);
    put_u64(nonce, id);
}

#ifdef CKPT_USE_OPENSSL
/* OpenSSL's EVP AES-256-GCM and ChaCha20-Poly1305, 3-4x libsodium's speed on
 * x86-64 with AES-NI/AVX2 (bench/aead_speed.c). XChaCha20-Poly1305 is the
 * standard construction over them: libsodium's HChaCha20 turns the key and
 * the first 16 nonce bytes into a subkey, and ChaCha20-Poly1305-IETF runs
 * under that subkey with the nonce 4 zero bytes || the last 8 nonce bytes,
 * which is exactly what crypto_aead_xchacha20poly1305_ietf_* compute.
 *
 * Contexts are kept per pack key, in a pool: making one per chunk costs an
 * allocation, a provider lookup and, for AES, the key schedule. AES contexts
 * hold the pack subkey's schedule from creation on; ChaCha contexts get the
 * per-nonce HChaCha20 subkey each time. The pool hands a context to one
 * thread at a time. OpenSSL wipes a context's key state when it frees it
 * (OPENSSL_clear_free); the schedules live in OpenSSL's heap, not in
 * sodium_malloc'd pages, for as long as the pack key is open. */
typedef struct evp_slot {
    EVP_CIPHER_CTX *ctx;
    struct evp_slot *next;
} evp_slot;

struct aead_evp {
    pthread_mutex_t mu;
    evp_slot *idle;
};

static struct aead_evp *evp_new(void)
{
    struct aead_evp *e = calloc(1, sizeof *e);
    if (e && pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        e = NULL;
    }
    return e;
}

static void slot_free(evp_slot *s)
{
    EVP_CIPHER_CTX_free(s->ctx);
    free(s);
}

static void evp_free(struct aead_evp *e)
{
    if (!e)
        return;
    while (e->idle) {
        evp_slot *s = e->idle;
        e->idle = s->next;
        slot_free(s);
    }
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* An idle context for pk's cipher (AES ones keyed already), or NULL. */
static evp_slot *slot_get(const pack_keys *pk)
{
    struct aead_evp *e = pk->evp;
    pthread_mutex_lock(&e->mu);
    evp_slot *s = e->idle;
    if (s)
        e->idle = s->next;
    pthread_mutex_unlock(&e->mu);
    if (s)
        return s;
    s = malloc(sizeof *s);
    if (!s)
        return NULL;
    s->ctx = EVP_CIPHER_CTX_new();
    int aes = pk->cipher == CKPT_CIPHER_AES256GCM;
    if (!s->ctx || EVP_CipherInit_ex(s->ctx, aes ? EVP_aes_256_gcm() : EVP_chacha20_poly1305(),
                                     NULL, aes ? pk->subkey : NULL, NULL, 1) != 1) {
        slot_free(s);
        return NULL;
    }
    return s;
}

static void slot_put(const pack_keys *pk, evp_slot *s)
{
    struct aead_evp *e = pk->evp;
    pthread_mutex_lock(&e->mu);
    s->next = e->idle;
    e->idle = s;
    pthread_mutex_unlock(&e->mu);
}

/* EVP lengths are ints: feed longer inputs in pieces (both AEADs stream). */
static int evp_update(EVP_CIPHER_CTX *ctx, uint8_t *out, const uint8_t *in, size_t len)
{
    while (len > 0) {
        int n = len > (size_t)INT_MAX / 2 ? INT_MAX / 2 : (int)len, outl;
        if (EVP_CipherUpdate(ctx, out, &outl, in, n) != 1 || (out && outl != n))
            return -1;
        in += n;
        if (out)
            out += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One seal (enc 1) or open (enc 0) on ctx. Returns 0; -EBADMSG (open: the
 * tag did not match); -EAGAIN (OpenSSL failed before writing anything: the
 * caller may use libsodium instead); -EIO (OpenSSL failed after writing to
 * out, which may be in, so libsodium cannot start over). */
static int evp_run(EVP_CIPHER_CTX *ctx, int enc, const uint8_t *key, const uint8_t iv[12],
                   const uint8_t *ad, size_t ad_len, const uint8_t *in, size_t len, uint8_t *out,
                   uint8_t tag[TPACK_AEAD_TAG])
{
    uint8_t fin[EVP_MAX_BLOCK_LENGTH];
    int finl = 0;
    if (EVP_CipherInit_ex(ctx, NULL, NULL, key, iv, enc) != 1)
        return -EAGAIN;
    if (!enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, TPACK_AEAD_TAG, tag) != 1)
        return -EAGAIN;
    if (evp_update(ctx, NULL, ad, ad_len) < 0)
        return -EAGAIN;
    if (evp_update(ctx, out, in, len) < 0)
        return -EIO;
    if (EVP_CipherFinal_ex(ctx, fin, &finl) != 1)
        return enc ? -EIO : -EBADMSG;
    if (finl != 0)
        return -EIO;
    if (enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, TPACK_AEAD_TAG, tag) != 1)
        return -EIO;
    return 0;
}

/* The OpenSSL path for aead_seal/aead_open: returns as evp_run. */
static int evp_aead(const pack_keys *pk, int enc, const uint8_t nonce[24], const uint8_t *ad,
                    size_t ad_len, const uint8_t *in, size_t len, uint8_t *out, uint8_t *tag)
{
    evp_slot *s = slot_get(pk);
    if (!s)
        return -EAGAIN;
    int rc;
    if (pk->cipher == CKPT_CIPHER_AES256GCM) {
        rc = evp_run(s->ctx, enc, NULL, nonce, ad, ad_len, in, len, out, tag);
    } else {
        uint8_t k2[32], iv[12];
        crypto_core_hchacha20(k2, nonce, pk->subkey, NULL);
        memset(iv, 0, 4);
        memcpy(iv + 4, nonce + 16, 8);
        rc = evp_run(s->ctx, enc, k2, iv, ad, ad_len, in, len, out, tag);
        sodium_memzero(k2, sizeof k2);
    }
    /* A context OpenSSL failed on is not trusted again. */
    if (rc == -EAGAIN || rc == -EIO)
        slot_free(s);
    else
        slot_put(pk, s);
    return rc;
}
#endif

int aead_seal_nonce(const pack_keys *pk, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                    const uint8_t *in, size_t len, uint8_t *out)
{
#ifdef CKPT_USE_OPENSSL
    if (pk->evp) {
        int rc = evp_aead(pk, 1, nonce, ad, ad_len, in, len, out, out + len);
        if (rc != -EAGAIN)
            return rc;
    }
#endif
    unsigned long long clen;
    if (pk->cipher == CKPT_CIPHER_AES256GCM) {
        /* OpenSSL failed where it alone can run AES-GCM (no AES-NI). */
        if (!crypto_aead_aes256gcm_is_available())
            return -ENOMEM;
        crypto_aead_aes256gcm_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce, pk->subkey);
    } else
        crypto_aead_xchacha20poly1305_ietf_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce,
                                                   pk->subkey);
    return 0;
}

/* aead_open_nonce with the tag apart (in holds len bytes of ciphertext). */
static int open_detached(const pack_keys *pk, const uint8_t nonce[24], const uint8_t *ad,
                         size_t ad_len, const uint8_t *in, size_t len,
                         const uint8_t tag_in[TPACK_AEAD_TAG], uint8_t *out)
{
    /* Copy the tag first: it may lie where out is written. */
    uint8_t tag[TPACK_AEAD_TAG];
    memcpy(tag, tag_in, TPACK_AEAD_TAG);
    int rc = -EAGAIN;
#ifdef CKPT_USE_OPENSSL
    if (pk->evp)
        rc = evp_aead(pk, 0, nonce, ad, ad_len, in, len, out, tag);
#endif
    if (rc == -EAGAIN && pk->cipher == CKPT_CIPHER_AES256GCM &&
        !crypto_aead_aes256gcm_is_available())
        return -ENOMEM; /* OpenSSL failed where it alone can run AES-GCM */
    if (rc == -EAGAIN)
        rc = (pk->cipher == CKPT_CIPHER_AES256GCM
                  ? crypto_aead_aes256gcm_decrypt_detached(out, NULL, in, len, tag, ad, ad_len,
                                                           nonce, pk->subkey)
                  : crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                        out, NULL, in, len, tag, ad, ad_len, nonce, pk->subkey)) == 0
                 ? 0
                 : -EBADMSG;
    if (rc == 0)
        return 0;
    /* Nothing unauthenticated leaves: OpenSSL decrypts before it checks. */
    sodium_memzero(out, len);
    return rc;
}

int aead_open_nonce(const pack_keys *pk, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                    const uint8_t *in, size_t len, uint8_t *out)
{
    if (len < TPACK_AEAD_TAG)
        return -EBADMSG;
    return open_detached(pk, nonce, ad, ad_len, in, len - TPACK_AEAD_TAG, in + len - TPACK_AEAD_TAG,
                         out);
}

/* ------------------------------------------------------------- ckpt_aead */

struct ckpt_aead {
    pack_keys pk;
};

ckpt_aead *ckpt_aead_new(ckpt_cipher cipher, const uint8_t key[32])
{
    ckpt_aead *a = calloc(1, sizeof *a);
    if (a && pack_keys_from_key(&a->pk, cipher, key, 1) != 0) {
        free(a);
        a = NULL;
    }
    return a;
}

void ckpt_aead_free(ckpt_aead *a)
{
    if (!a)
        return;
    pack_keys_free(&a->pk);
    free(a);
}

int ckpt_aead_seal(const ckpt_aead *a, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                   const uint8_t *in, size_t len, uint8_t *out)
{
    return aead_seal_nonce(&a->pk, nonce, ad, ad_len, in, len, out);
}

int ckpt_aead_open(const ckpt_aead *a, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                   const uint8_t *in, size_t len, const uint8_t tag[16], uint8_t *out)
{
    return open_detached(&a->pk, nonce, ad, ad_len, in, len, tag, out);
}

int aead_seal(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out)
{
    uint8_t nonce[24];
    make_nonce(nonce, nonce_id);
    return aead_seal_nonce(pk, nonce, ad, ad_len, in, len, out);
}

int aead_open(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out)
{
    uint8_t nonce[24];
    make_nonce(nonce, nonce_id);
    return aead_open_nonce(pk, nonce, ad, ad_len, in, len, out);
}

int ckpt_cipher_parse(const char *name, ckpt_cipher *out)
{
    if (!name)
        return -EINVAL;
    if (!strcmp(name, "none"))
        *out = CKPT_CIPHER_NONE;
    else if (!strcmp(name, "xchacha20poly1305") || !strcmp(name, "xchacha20-poly1305"))
        *out = CKPT_CIPHER_XCHACHA20POLY1305;
    else if (!strcmp(name, "aes256gcm") || !strcmp(name, "aes-256-gcm"))
        *out = CKPT_CIPHER_AES256GCM;
    else
        return -EINVAL;
    return 0;
}

const char *ckpt_cipher_name(ckpt_cipher c)
{
    switch (c) {
    case CKPT_CIPHER_NONE:
        return "none";
    case CKPT_CIPHER_XCHACHA20POLY1305:
        return "xchacha20poly1305";
    case CKPT_CIPHER_AES256GCM:
        return "aes256gcm";
    }
    return "unknown";
}

/* libsodium's AES-256-GCM needs AES-NI and PCLMULQDQ (or ARMv8's crypto
 * extensions); OpenSSL's runs anywhere, in software where it must. */
int ckpt_cipher_available(ckpt_cipher c)
{
#ifdef CKPT_USE_OPENSSL
    if (c == CKPT_CIPHER_AES256GCM)
        return 1;
#else
    if (c == CKPT_CIPHER_AES256GCM)
        return ckpt_sodium_init() == 0 && crypto_aead_aes256gcm_is_available();
#endif
    return c == CKPT_CIPHER_NONE || c == CKPT_CIPHER_XCHACHA20POLY1305;
}

/* AES-256-GCM where the CPU does AES and carry-less multiplication in
 * hardware (fastest, and constant-time); XChaCha20-Poly1305 elsewhere. */
ckpt_cipher ckpt_cipher_default(void)
{
    if (ckpt_sodium_init() == 0 && crypto_aead_aes256gcm_is_available())
        return CKPT_CIPHER_AES256GCM;
    return CKPT_CIPHER_XCHACHA20POLY1305;
}
