#include "stage_crypt.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"

stage_cipher stage_cipher_default(void)
{
    if (sodium_init() >= 0 && crypto_aead_aes256gcm_is_available())
        return STAGE_CIPHER_AESGCM;
    return STAGE_CIPHER_XCHACHA;
}

int stage_cipher_available(stage_cipher c)
{
    if (sodium_init() < 0)
        return 0;
    return c == STAGE_CIPHER_XCHACHA ||
           (c == STAGE_CIPHER_AESGCM && crypto_aead_aes256gcm_is_available());
}

const char *stage_cipher_name(stage_cipher c)
{
    return c == STAGE_CIPHER_AESGCM ? "aes256gcm" : "xchacha20poly1305";
}

int stage_cipher_parse(const char *name, stage_cipher *out)
{
    if (strcmp(name, "aes256gcm") == 0)
        *out = STAGE_CIPHER_AESGCM;
    else if (strcmp(name, "xchacha20poly1305") == 0)
        *out = STAGE_CIPHER_XCHACHA;
    else
        return -1;
    return 0;
}

stage_key *stage_key_new(stage_cipher c)
{
    stage_key *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->bytes = ckpt_secret_alloc(STAGE_KEY_BYTES);
    if (!k->bytes) {
        free(k);
        return NULL;
    }
    k->cipher = c;
    return k;
}

int stage_key_ready(stage_key *k)
{
    ckpt_aead_free(k->aead);
    k->aead = ckpt_aead_new(k->cipher == STAGE_CIPHER_AESGCM ? CKPT_CIPHER_AES256GCM
                                                             : CKPT_CIPHER_XCHACHA20POLY1305,
                            k->bytes);
    return k->aead ? 0 : -ENOMEM;
}

void stage_key_free(stage_key *k)
{
    if (!k)
        return;
    ckpt_aead_free(k->aead);
    ckpt_secret_free(k->bytes);
    free(k);
}

void stage_seal(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in, size_t len,
                uint8_t nonce[STAGE_NONCE], uint8_t *out)
{
    memset(nonce, 0, STAGE_NONCE);
    randombytes_buf(nonce, k->cipher == STAGE_CIPHER_AESGCM
                               ? crypto_aead_aes256gcm_NPUBBYTES
                               : crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
    if (k->aead && ckpt_aead_seal(k->aead, nonce, ad, ad_len, in, len, out) == 0)
        return;
    if (k->cipher == STAGE_CIPHER_AESGCM) {
        crypto_aead_aes256gcm_encrypt(out, NULL, in, len, ad, ad_len, NULL, nonce, k->bytes);
    } else {
        crypto_aead_xchacha20poly1305_ietf_encrypt(out, NULL, in, len, ad, ad_len, NULL, nonce,
                                                   k->bytes);
    }
}

int stage_unseal(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in,
                 size_t len, const uint8_t nonce[STAGE_NONCE], uint8_t *out)
{
    return stage_unseal_detached(k, ad, ad_len, in, len, in + len, nonce, out);
}

int stage_unseal_detached(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in,
                          size_t len, const uint8_t tag[STAGE_TAG],
                          const uint8_t nonce[STAGE_NONCE], uint8_t *out)
{
    int rc;
    if (k->aead)
        rc = ckpt_aead_open(k->aead, nonce, ad, ad_len, in, len, tag, out);
    else if (k->cipher == STAGE_CIPHER_AESGCM)
        rc = crypto_aead_aes256gcm_decrypt_detached(out, NULL, in, len, tag, ad, ad_len, nonce,
                                                    k->bytes);
    else
        rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(out, NULL, in, len, tag, ad,
                                                                 ad_len, nonce, k->bytes);
    return rc == 0 ? 0 : -EIO;
}
