/* Helpers shared by the Criterion unit tests: scratch directories, whole-file
 * I/O and SHA-256. Header-only (static inline) so each test binary stays a
 * single source file. Every helper asserts on failure, so a broken fixture
 * fails the test that uses it instead of producing a confusing later error. */
#ifndef CKPT_TESTUTIL_H
#define CKPT_TESTUTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh private directory under $TMPDIR (or /tmp); free() the result. */
static inline char *tu_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    size_t n = strlen(base) + sizeof "/ckpt-test-XXXXXX";
    char *path = malloc(n);
    cr_assert_not_null(path);
    snprintf(path, n, "%s/ckpt-test-XXXXXX", base);
    cr_assert_not_null(mkdtemp(path), "mkdtemp(%s): %s", path, strerror(errno));
    return path;
}

/* "dir/name" in a malloc'd string. */
static inline char *tu_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    cr_assert_not_null(path);
    snprintf(path, n, "%s/%s", dir, name);
    return path;
}

static inline int tu_rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* rm -rf: scratch directories are cleaned up even when a test made them
 * read-only or left nested files behind. Missing paths are fine. */
static inline void tu_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    cr_assert_eq(nftw(path, tu_rm_entry, 16, FTW_DEPTH | FTW_PHYS), 0, "rm -rf %s: %s", path,
                 strerror(errno));
}

/* A suite whose tests each get a fresh scratch directory in `dir`, removed
 * with everything in it after the test. */
#define TU_TMPDIR_SUITE(name)                                                                      \
    static char *dir;                                                                              \
    static void tu_tmpdir_setup(void)                                                              \
    {                                                                                              \
        dir = tu_mkdtemp();                                                                        \
    }                                                                                              \
    static void tu_tmpdir_teardown(void)                                                           \
    {                                                                                              \
        tu_rm_rf(dir);                                                                             \
        free(dir);                                                                                 \
    }                                                                                              \
    TestSuite(name, .init = tu_tmpdir_setup, .fini = tu_tmpdir_teardown)

/* A scratch directory with a descriptor on it: the backing directory of
 * the staging and writable-checkpoint tests. */
static inline char *tu_scratch_open(int *fd)
{
    char *dir = tu_mkdtemp();
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(*fd, 0, "open(%s): %s", dir, strerror(errno));
    return dir;
}

static inline void tu_scratch_close(char *dir, int fd)
{
    close(fd);
    tu_rm_rf(dir);
    free(dir);
}

/* Writes len bytes to path (created 0644 or truncated). */
static inline void tu_write_file(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "open(%s): %s", path, strerror(errno));
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        cr_assert_gt(w, 0, "write(%s): %s", path, strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    cr_assert_eq(close(fd), 0, "close(%s): %s", path, strerror(errno));
}

static inline void tu_write_str(const char *path, const char *s)
{
    tu_write_file(path, s, strlen(s));
}

/* The whole file in a malloc'd buffer with a NUL after the last byte (so text
 * files can be used as strings); *len_out gets the size if not NULL. */
static inline uint8_t *tu_read_file(const char *path, size_t *len_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open(%s): %s", path, strerror(errno));
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0, "fstat(%s): %s", path, strerror(errno));
    size_t cap = (size_t)st.st_size + 1, len = 0;
    uint8_t *buf = malloc(cap);
    cr_assert_not_null(buf);
    for (;;) {
        if (len + 1 >= cap) {
            /* The file grew after fstat; keep reading to its real end. */
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        cr_assert_geq(r, 0, "read(%s): %s", path, strerror(errno));
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

static inline uint64_t tu_file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat(%s): %s", path, strerror(errno));
    return (uint64_t)st.st_size;
}

static inline void tu_sha256(const void *buf, size_t len, uint8_t out[32])
{
    cr_assert_geq(sodium_init(), 0, "sodium_init failed");
    crypto_hash_sha256(out, buf, len);
}

static inline void tu_sha256_file(const char *path, uint8_t out[32])
{
    size_t len;
    uint8_t *buf = tu_read_file(path, &len);
    tu_sha256(buf, len, out);
    free(buf);
}

/* Deterministic filler bytes, so tests can tell data apart without a RNG. */
static inline void tu_fill_pattern(void *buf, size_t len, uint32_t seed)
{
    uint8_t *p = buf;
    uint32_t x = seed * 2654435761u + 1;
    if (x == 0) /* xorshift never leaves zero */
        x = 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* Does haystack contain needle? For asserting on error messages. */
static inline int tu_contains(const char *haystack, const char *needle)
{
    return haystack && needle && strstr(haystack, needle) != NULL;
}

/* A function, not an inline ?:, so arrays can be passed without warnings. */
static inline const char *tu_str_or_null(const char *s)
{
    return s ? s : "(null)";
}

#define tu_assert_contains(haystack, needle)                                                       \
    cr_assert(tu_contains((haystack), (needle)), "expected \"%s\" in \"%s\"", (needle),            \
              tu_str_or_null(haystack))

#endif
