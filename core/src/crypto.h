/* Per-pack key derivation and chunk sealing, all through libsodium. */
#ifndef CKPT_CRYPTO_H
#define CKPT_CRYPTO_H

#include "common.h"

/* Keys in locked memory: the master key for a pack (from a key file, or
 * Argon2id over a passphrase) and the pack's subkey derived from it. */
typedef struct pack_keys {
    uint8_t *subkey;     /* sodium_malloc'd, 32 bytes; NULL when unencrypted */
    ckpt_cipher cipher;
} pack_keys;

typedef struct kdf_params {
    uint32_t kdf;        /* enum tpack_kdf */
    uint64_t ops, mem;
    uint8_t salt[16];
} kdf_params;

/* Resolves the master key for these KDF parameters into master (32 bytes,
 * caller-provided locked memory). */
int key_master(const ckpt_key *key, const kdf_params *kp, uint8_t *master, ckpt_err *err);
void key_check_value(const uint8_t *master, const uint8_t pack_id[16], uint8_t out[16]);
int pack_keys_derive(pack_keys *pk, ckpt_cipher cipher, const uint8_t *master,
                     const uint8_t pack_id[16]);
void pack_keys_free(pack_keys *pk);

/* Additional data binding a chunk to its pack and place. */
#define CHUNK_AD_BYTES 46
void chunk_ad(uint8_t ad[CHUNK_AD_BYTES], const uint8_t pack_id[16], uint64_t chunk_id,
              uint64_t extent_id, uint64_t chunk_in_extent, uint32_t raw_size, uint8_t codec,
              uint8_t elem_size);

/* Seal: out gets len + TPACK_AEAD_TAG bytes. Open: returns 0 or -EBADMSG. */
int aead_seal(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out);
int aead_open(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out);

#endif
