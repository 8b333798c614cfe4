/* Sealing for the staging area (stage.h, stage_blob.h): AEAD with a random
 * nonce per message, through libckpt's ckpt_aead (OpenSSL's EVP: sealing
 * sits on the writer's critical path, and libsodium's AES-256-GCM took 52%
 * of the daemon's cycles during a cp -r into an encrypted mount), or
 * libsodium for a key not made ready (stage_key_ready), the same bytes
 * either way. AES-256-GCM where the CPU has AES-NI, XChaCha20-Poly1305
 * elsewhere. A checkpoint
 * keeps the cipher it was created with, so staging written on one machine
 * reads on another as long as that one has the cipher too.
 *
 * Random 96-bit GCM nonces stay safe far beyond what one checkpoint seals:
 * every checkpoint has its own key, and the collision bound (2^32 messages
 * per key) is 256 TiB of 64 KiB blocks. */
#ifndef CKPTFS_STAGE_CRYPT_H
#define CKPTFS_STAGE_CRYPT_H

#include <stddef.h>
#include <stdint.h>

#define STAGE_KEY_BYTES 32
#define STAGE_NONCE 24 /* room for either cipher's nonce */
#define STAGE_TAG 16

typedef enum stage_cipher {
    STAGE_CIPHER_XCHACHA = 1,
    STAGE_CIPHER_AESGCM = 2,
} stage_cipher;

struct ckpt_aead;

typedef struct stage_key {
    uint8_t *bytes; /* sodium_malloc'd, STAGE_KEY_BYTES */
    stage_cipher cipher;
    struct ckpt_aead *aead; /* set by stage_key_ready */
} stage_key;

/* The fastest cipher this CPU can run. */
stage_cipher stage_cipher_default(void);
int stage_cipher_available(stage_cipher c);
const char *stage_cipher_name(stage_cipher c);
/* 0 with *out, or -1 for an unknown name. */
int stage_cipher_parse(const char *name, stage_cipher *out);

/* A key in locked memory, or NULL. Free with stage_key_free. */
stage_key *stage_key_new(stage_cipher c);
/* Once k->bytes holds the key: seal and open through OpenSSL from now on.
 * 0, or -ENOMEM (k still works, through libsodium). */
int stage_key_ready(stage_key *k);
void stage_key_free(stage_key *k);

/* out gets len + STAGE_TAG bytes; nonce gets a fresh random nonce. */
void stage_seal(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in, size_t len,
                uint8_t nonce[STAGE_NONCE], uint8_t *out);
/* in is len + STAGE_TAG bytes; 0, or -EIO if it does not authenticate. */
int stage_unseal(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in,
                 size_t len, const uint8_t nonce[STAGE_NONCE], uint8_t *out);
/* The same with the tag apart; out may be in (opened in place). */
int stage_unseal_detached(const stage_key *k, const uint8_t *ad, size_t ad_len, const uint8_t *in,
                          size_t len, const uint8_t tag[STAGE_TAG],
                          const uint8_t nonce[STAGE_NONCE], uint8_t *out);

#endif
