/* Errors, byte buffers, the string map, dtypes and path rules. */
#include "common.h"

#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int ckpt_fail(ckpt_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        err->transient = 0;
    }
    return code;
}

int ckpt_fail_prefix(ckpt_err *err, const char *prefix)
{
    if (!err)
        return 0;
    char tmp[sizeof err->msg + 4096];
    int n = snprintf(tmp, sizeof tmp, "%s: %s", prefix, err->msg);
    if (n < 0)
        return err->code;
    size_t keep = strnlen(tmp, sizeof err->msg - 1);
    memcpy(err->msg, tmp, keep);
    err->msg[keep] = 0;
    return err->code;
}

static int sodium_status = 1;
static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static void sodium_init_once(void)
{
    sodium_status = sodium_init() < 0 ? -1 : 0;
}

int ckpt_sodium_init(void)
{
    pthread_once(&sodium_once, sodium_init_once);
    return sodium_status == 0 ? 0 : -ENOSYS;
}

unsigned ckpt_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

static void bb_reserve(bytebuf *b, size_t n)
{
    if (b->oom || b->len + n <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void bb_put(bytebuf *b, const void *data, size_t n)
{
    bb_reserve(b, n);
    if (b->oom)
        return;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
}
void bb_u8(bytebuf *b, uint8_t v)
{
    bb_put(b, &v, 1);
}
void bb_u16(bytebuf *b, uint16_t v)
{
    uint8_t t[2];
    put_u16(t, v);
    bb_put(b, t, 2);
}
void bb_u32(bytebuf *b, uint32_t v)
{
    uint8_t t[4];
    put_u32(t, v);
    bb_put(b, t, 4);
}
void bb_u64(bytebuf *b, uint64_t v)
{
    uint8_t t[8];
    put_u64(t, v);
    bb_put(b, t, 8);
}
void bb_free(bytebuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int grow_array(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    if (c <= n)
        c = n + 1;
    if (c > SIZE_MAX / elem)
        return -ENOMEM;
    void *p = realloc(*arr, c * elem);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

_Static_assert(sizeof((strmap *)0)->hash_key == crypto_shorthash_KEYBYTES, "strmap hash key size");

/* Callers have run ckpt_sodium_init() (ckpt_open, ckpt_writer_open). */
static uint64_t str_hash(const strmap *m, const char *s)
{
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, (const unsigned char *)s, strlen(s), m->hash_key);
    return get_u64(h);
}

int strmap_init(strmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 1)
        cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->cap = cap;
    m->n = 0;
    randombytes_buf(m->hash_key, sizeof m->hash_key);
    if (!m->keys || !m->vals) {
        strmap_free(m);
        return -ENOMEM;
    }
    return 0;
}

static int strmap_grow(strmap *m)
{
    strmap bigger;
    if (strmap_init(&bigger, m->cap) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            strmap_put(&bigger, m->keys[i], m->vals[i], NULL);
    strmap_free(m);
    *m = bigger;
    return 0;
}

int strmap_put(strmap *m, const char *key, size_t val, size_t *old)
{
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m) < 0)
        return -ENOMEM;
    size_t i = str_hash(m, key) & (m->cap - 1);
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) {
            if (old)
                *old = m->vals[i];
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->n++;
    return 0;
}

long strmap_get(const strmap *m, const char *key)
{
    if (!m->cap)
        return -1;
    size_t i = str_hash(m, key) & (m->cap - 1);
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0)
            return (long)m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void strmap_free(strmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* numpy has no bfloat16 or float8: those map to unsigned ints of their
 * width (the raw bits), marked inexact. */
static const struct {
    const char *name;
    unsigned size;
    const char *numpy, *torch;
    int numpy_exact;
} dtypes[] = {
    {"BOOL", 1, "|b1", "torch.bool", 1},
    {"U8", 1, "|u1", "torch.uint8", 1},
    {"I8", 1, "|i1", "torch.int8", 1},
    {"F8_E5M2", 1, "|u1", "torch.float8_e5m2", 0},
    {"F8_E4M3", 1, "|u1", "torch.float8_e4m3fn", 0},
    {"I16", 2, "<i2", "torch.int16", 1},
    {"U16", 2, "<u2", "torch.uint16", 1},
    {"F16", 2, "<f2", "torch.float16", 1},
    {"BF16", 2, "<u2", "torch.bfloat16", 0},
    {"I32", 4, "<i4", "torch.int32", 1},
    {"U32", 4, "<u4", "torch.uint32", 1},
    {"F32", 4, "<f4", "torch.float32", 1},
    {"F64", 8, "<f8", "torch.float64", 1},
    {"I64", 8, "<i8", "torch.int64", 1},
    {"U64", 8, "<u8", "torch.uint64", 1},
};

static int dtype_find(const char *dtype)
{
    if (!dtype)
        return -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, dtype) == 0)
            return (int)i;
    return -1;
}

unsigned ckpt_dtype_size(const char *dtype)
{
    int i = dtype_find(dtype);
    return i < 0 ? 0 : dtypes[i].size;
}

const char *ckpt_dtype_numpy(const char *dtype)
{
    int i = dtype_find(dtype);
    return i < 0 ? NULL : dtypes[i].numpy;
}

int ckpt_dtype_numpy_exact(const char *dtype)
{
    int i = dtype_find(dtype);
    return i >= 0 && dtypes[i].numpy_exact;
}

const char *ckpt_dtype_torch(const char *dtype)
{
    int i = dtype_find(dtype);
    return i < 0 ? NULL : dtypes[i].torch;
}

int ckpt_dtype_valid(const char *dtype)
{
    return ckpt_dtype_size(dtype) != 0;
}

int ckpt_tensor_bytes(const char *dtype, uint32_t ndim, const uint64_t *shape, uint64_t *out)
{
    uint64_t n = ckpt_dtype_size(dtype);
    if (!n)
        return -EINVAL;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] && n > UINT64_MAX / shape[i])
            return -EOVERFLOW;
        n *= shape[i];
    }
    *out = n;
    return 0;
}

#define TMP_HASH_HEX 16

int ckpt_tmp_name(const char *path, const char *prefix, const char *suffix, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t len = strlen(base), fixed = strlen(prefix) + strlen(suffix);
    int n;
    if (fixed + len <= NAME_MAX) {
        n = snprintf(out, cap, "%.*s%s%s%s", (int)(base - path), path, prefix, base, suffix);
    } else {
        if (fixed + 1 + TMP_HASH_HEX >= NAME_MAX)
            return -ENAMETOOLONG;
        /* FNV-1a: names are not secret, and a collision only makes the
         * later of two writers fail on the other's lock (EBUSY). */
        uint64_t h = 14695981039346656037ull;
        for (size_t i = 0; i < len; i++)
            h = (h ^ (unsigned char)base[i]) * 1099511628211ull;
        int keep = (int)(NAME_MAX - fixed - 1 - TMP_HASH_HEX);
        n = snprintf(out, cap, "%.*s%s%.*s~%016llx%s", (int)(base - path), path, prefix, keep, base,
                     (unsigned long long)h, suffix);
    }
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int ckpt_path_is_safe(const char *path)
{
    if (!path || !*path || path[0] == '/')
        return 0;
    size_t total = strlen(path);
    if (total > 4095)
        return 0;
    const char *p = path;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || n > 255)
            return 0;
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!slash)
            break;
        p = slash + 1;
        if (!*p)
            return 0; /* trailing slash */
    }
    return 1;
}

void ckpt_hex32(const uint8_t digest[32], char out[65])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[digest[i] >> 4];
        out[2 * i + 1] = hx[digest[i] & 15];
    }
    out[64] = 0;
}

/* Indexed by the file record's container byte (format.h). */
static const char *const containers[] = {"",    "safetensors", "npy", "torch",
                                         "dcp", "tensorizer",  "gguf"};

const char *ckpt_container_name(unsigned code)
{
    return code < sizeof containers / sizeof containers[0] ? containers[code] : NULL;
}

int ckpt_container_code(const char *name)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < sizeof containers / sizeof containers[0]; i++)
        if (strcmp(containers[i], name) == 0)
            return (int)i;
    return -1;
}

/* Strict UTF-8 (RFC 3629): no overlong forms, surrogates or code points
 * above U+10FFFF, so anything accepted is also accepted by JSON encoders. */
int ckpt_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!len || c > 0xF4 || c < 0xC2 || n - i < len)
            return 0;
        for (size_t j = 1; j < len; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
        uint8_t d = s[i + 1];
        if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d >= 0xA0) || (c == 0xF0 && d < 0x90) ||
            (c == 0xF4 && d >= 0x90))
            return 0;
        i += len;
    }
    return 1;
}
