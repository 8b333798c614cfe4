/* Internal helpers shared by the library's translation units: the
 * internal API that fs/ and tools/ may also use (ckpt_internal.h), plus what
 * only the library needs. */
#ifndef CKPT_COMMON_H
#define CKPT_COMMON_H

#ifndef CKPT_INTERNAL_API
#define CKPT_INTERNAL_API
#endif
#include "ckpt_internal.h"
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

/* Initialises libsodium once; returns 0 or -ENOSYS. */
int ckpt_sodium_init(void);

/* String -> index map (open addressing), for path and tensor-name lookup.
 * Keys come from untrusted packs and safetensors headers, so the hash is
 * keyed (SipHash, random key per map): chosen keys cannot all collide. */
typedef struct strmap {
    const char **keys;
    size_t *vals;
    size_t cap, n;
    uint8_t hash_key[16];
} strmap;
int strmap_init(strmap *m, size_t expected);
/* Returns 0 if inserted, 1 if the key already exists (*old set), -ENOMEM. */
int strmap_put(strmap *m, const char *key, size_t val, size_t *old);
long strmap_get(const strmap *m, const char *key);
void strmap_free(strmap *m);

int ckpt_dtype_valid(const char *dtype);
/* A container byte's name ("" for 0), or NULL if unknown; and back (-1). */
const char *ckpt_container_name(unsigned code);
int ckpt_container_code(const char *name);
/* Is s[0..n) strict UTF-8 (no overlongs, surrogates, or > U+10FFFF)? */
int ckpt_utf8_valid(const uint8_t *s, size_t n);
/* numel * elem with overflow checking; returns 0 or -EOVERFLOW. */
int ckpt_tensor_bytes(const char *dtype, uint32_t ndim, const uint64_t *shape, uint64_t *out);

#endif
