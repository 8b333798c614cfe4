/* Internal helpers shared by the library's translation units. */
#ifndef CKPT_COMMON_H
#define CKPT_COMMON_H

#include "ckpt.h"
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define CKPT_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Fills err (if any) and returns code, so callers can `return ckpt_fail(...)`. */
int ckpt_fail(ckpt_err *err, int code, const char *fmt, ...) CKPT_PRINTF(3, 4);
/* Prefixes an existing message with "<prefix>: " (used to add file names). */
int ckpt_fail_prefix(ckpt_err *err, const char *prefix);

/* Initialises libsodium once; returns 0 or -ENOSYS. */
int ckpt_sodium_init(void);
unsigned ckpt_default_threads(void);

static inline void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Growable byte buffer for building the index. */
typedef struct bytebuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} bytebuf;
void bb_put(bytebuf *b, const void *data, size_t n);
void bb_u8(bytebuf *b, uint8_t v);
void bb_u16(bytebuf *b, uint16_t v);
void bb_u32(bytebuf *b, uint32_t v);
void bb_u64(bytebuf *b, uint64_t v);
void bb_free(bytebuf *b);

/* Grows *arr (of elem-sized items) so it holds at least n+1 items. */
int grow_array(void **arr, size_t *cap, size_t n, size_t elem);

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
/* numel * elem with overflow checking; returns 0 or -EOVERFLOW. */
int ckpt_tensor_bytes(const char *dtype, uint32_t ndim, const uint64_t *shape, uint64_t *out);

#endif
