/* Subkeys, key check values and chunk AEAD. */
#include "crypto.h"
#include "format.h"

#include <sodium.h>

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

int pack_keys_derive(pack_keys *pk, ckpt_cipher cipher, const uint8_t *master, const uint8_t pack_id[16])
{
    pk->subkey = sodium_malloc(CKPT_KEY_BYTES);
    if (!pk->subkey) return -ENOMEM;
    derive(pk->subkey, CKPT_KEY_BYTES, SUBKEY_CONTEXT, master, pack_id);
    pk->cipher = cipher;
    return 0;
}

void pack_keys_free(pack_keys *pk)
{
    sodium_free(pk->subkey);
    pk->subkey = NULL;
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

int aead_seal(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out)
{
    uint8_t nonce[24];
    make_nonce(nonce, nonce_id);
    unsigned long long clen;
    if (pk->cipher == CKPT_CIPHER_AES256GCM)
        crypto_aead_aes256gcm_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce, pk->subkey);
    else
        crypto_aead_xchacha20poly1305_ietf_encrypt(out, &clen, in, len, ad, ad_len, NULL, nonce, pk->subkey);
    return 0;
}

int aead_open(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out)
{
    uint8_t nonce[24];
    make_nonce(nonce, nonce_id);
    unsigned long long mlen;
    if (len < TPACK_AEAD_TAG) return -EBADMSG;
    int rc = pk->cipher == CKPT_CIPHER_AES256GCM
        ? crypto_aead_aes256gcm_decrypt(out, &mlen, NULL, in, len, ad, ad_len, nonce, pk->subkey)
        : crypto_aead_xchacha20poly1305_ietf_decrypt(out, &mlen, NULL, in, len, ad, ad_len, nonce, pk->subkey);
    return rc == 0 ? 0 : -EBADMSG;
}

int ckpt_cipher_parse(const char *name, ckpt_cipher *out)
{
    if (!name) return -EINVAL;
    if (!strcmp(name, "none")) *out = CKPT_CIPHER_NONE;
    else if (!strcmp(name, "xchacha20poly1305") || !strcmp(name, "xchacha20-poly1305"))
        *out = CKPT_CIPHER_XCHACHA20POLY1305;
    else if (!strcmp(name, "aes256gcm") || !strcmp(name, "aes-256-gcm")) *out = CKPT_CIPHER_AES256GCM;
    else return -EINVAL;
    return 0;
}

const char *ckpt_cipher_name(ckpt_cipher c)
{
    switch (c) {
    case CKPT_CIPHER_NONE: return "none";
    case CKPT_CIPHER_XCHACHA20POLY1305: return "xchacha20poly1305";
    case CKPT_CIPHER_AES256GCM: return "aes256gcm";
    }
    return "unknown";
}

int ckpt_cipher_available(ckpt_cipher c)
{
    if (c == CKPT_CIPHER_AES256GCM) return ckpt_sodium_init() == 0 && crypto_aead_aes256gcm_is_available();
    return c == CKPT_CIPHER_NONE || c == CKPT_CIPHER_XCHACHA20POLY1305;
}
