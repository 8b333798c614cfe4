/* Per-pack key derivation (libsodium) and chunk sealing (OpenSSL's EVP when
 * the library is built with libcrypto, else libsodium; the same bytes either
 * way, see core/FORMAT.md section 5). */
#ifndef CKPT_CRYPTO_H
#define CKPT_CRYPTO_H

#include "common.h"

/* Keys in locked memory: the master key for a pack (from a key file, or
 * Argon2id over a passphrase) and the pack's subkey derived from it. */
struct aead_evp;
typedef struct pack_keys {
    uint8_t *subkey; /* sodium_malloc'd, 32 bytes; NULL when unencrypted */
    ckpt_cipher cipher;
    struct aead_evp *evp; /* reusable OpenSSL contexts; NULL = libsodium seals */
} pack_keys;

typedef struct kdf_params {
    uint32_t kdf; /* enum tpack_kdf */
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

/* Seal: out gets len + TPACK_AEAD_TAG bytes. Open: out gets len -
 * TPACK_AEAD_TAG bytes, or zeros where it fails. Both return 0 or -errno:
 * -EBADMSG (open: not authentic), and, only where OpenSSL fails (out of
 * memory) and libsodium cannot stand in, -ENOMEM or -EIO. in and out may be
 * the same buffer, but not overlap otherwise. Any number of threads may seal
 * and open under one pack_keys at once. */
int aead_seal(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out);
int aead_open(const pack_keys *pk, uint64_t nonce_id, const uint8_t *ad, size_t ad_len,
              const uint8_t *in, size_t len, uint8_t *out);

/* pack_keys_derive() with the sealing library chosen by hand, for tests and
 * benches: use_openssl 0 = libsodium; 1 = OpenSSL where built with it
 * (otherwise libsodium). aead_impl() names the one pk uses. */
int pack_keys_derive_impl(pack_keys *pk, ckpt_cipher cipher, const uint8_t *master,
                          const uint8_t pack_id[16], int use_openssl);
const char *aead_impl(const pack_keys *pk);

/* For known-answer tests: pack_keys over a caller's 32-byte key instead of a
 * derived one, and sealing under a caller's nonce (aead_seal/aead_open make
 * it from the chunk number: core/FORMAT.md section 5). The nonce is 24
 * bytes; AES-256-GCM uses the first 12. */
int pack_keys_from_key(pack_keys *pk, ckpt_cipher cipher, const uint8_t key[32], int use_openssl);
int aead_seal_nonce(const pack_keys *pk, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                    const uint8_t *in, size_t len, uint8_t *out);
int aead_open_nonce(const pack_keys *pk, const uint8_t nonce[24], const uint8_t *ad, size_t ad_len,
                    const uint8_t *in, size_t len, uint8_t *out);

#endif
