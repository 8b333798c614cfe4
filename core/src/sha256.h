/* SHA-256 of file and tensor bytes. Packing hashes every byte twice (for its
 * file and for its tensor) and verifying does too; libsodium's portable
 * SHA-256 (270-340 MB/s on a Xeon with SHA extensions) was 80% of packing
 * time. So the default build (CKPT_USE_OPENSSL, -lcrypto) uses OpenSSL's,
 * which takes the CPU's SHA instructions (about 1.5 GB/s there);
 * `make SHA256=sodium` keeps libsodium's. Same digests either way. */
#ifndef CKPT_SHA256_H
#define CKPT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef CKPT_USE_OPENSSL
/* The one-shot SHA256_* calls are deprecated in OpenSSL 3 only in favour of
 * EVP, which would need a heap context per hash; they remain supported. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

typedef SHA256_CTX ckpt_sha256;
static inline void ckpt_sha256_init(ckpt_sha256 *s)
{
    SHA256_Init(s);
}
static inline void ckpt_sha256_update(ckpt_sha256 *s, const void *p, size_t n)
{
    SHA256_Update(s, p, n);
}
static inline void ckpt_sha256_final(ckpt_sha256 *s, uint8_t out[32])
{
    SHA256_Final(out, s);
}
#else
#include <sodium.h>

typedef crypto_hash_sha256_state ckpt_sha256;
static inline void ckpt_sha256_init(ckpt_sha256 *s)
{
    crypto_hash_sha256_init(s);
}
static inline void ckpt_sha256_update(ckpt_sha256 *s, const void *p, size_t n)
{
    crypto_hash_sha256_update(s, p, n);
}
static inline void ckpt_sha256_final(ckpt_sha256 *s, uint8_t out[32])
{
    crypto_hash_sha256_final(s, out);
}
#endif

#endif
