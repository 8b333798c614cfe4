/* The local cache of an S3 store: ranges of objects as the store holds
 * them (a pack's chunks still compressed and encrypted), one file per
 * range read, so that a second read of a chunk costs a local pread
 * instead of a GET.
 *
 *   name    "<tag>-<offset>-<length>" in hex; tag is a BLAKE2b hash of
 *           bucket, key and ETag, so a replaced object (a new ETag) never
 *           reads an older version's bytes, and two buckets never mix
 *   ranges  what a reader asked for (a chunk, the index), and for a
 *           sequential reader the readahead's 16 MiB segments: those are
 *           read back by the readahead's threads, several at once and
 *           ahead of the reader, as they were fetched (s3.c)
 *   file    the bytes, the CRC-32 of each 64 KiB block of them (the last
 *           one shorter), then a trailer: "ck2\n" and the block size.
 *           A CRC per block, not one for the file, so that a part of an
 *           entry is read and checked alone: a chunk read from a
 *           segment reads its own blocks and their CRCs (1-2 MiB for a
 *           1 MiB chunk), not the whole segment to check one CRC, which
 *           made a warm random read from cache_dir slower than one GET
 *   put     written to a temporary file, then renamed: a reader in
 *           another process sees a whole file or none; a scan removes
 *           the temporary files of processes killed in a put
 *   hit     a file of exactly the length asked for plus the CRCs and the
 *           trailer, whose blocks read all match their CRCs; anything else
 *           (truncated, extended, a flipped bit, a file of an older format)
 *           is a miss, and the file is then replaced. A range may also be
 *           served by the segments that hold it, in parts: a chunk across
 *           two segments from both files. A readahead segment without
 *           its own file is filled from the entries of its parts (the
 *           chunks a first read kept one by one before its readahead
 *           started, which a remount's readahead may start earlier:
 *           4.2 MB fetched again on a remount in CI), found in an index
 *           of the entries' names (rebuilt at each scan, added to at each
 *           put), and only what none holds is fetched. Every byte served is in a block
 *           whose CRC was checked, whoever reads it (a chunk read checks
 *           its own CRC or AEAD tag as well, a pack copy does not). The
 *           mtime of each file read is touched, which is what eviction
 *           orders by
 *   count   disk bytes (st_blocks), not sizes: the disk is what fills
 *   evict   a put reserves its file's room before it writes; when what
 *           is held and what is being written would pass the limit, one
 *           scan of the directory removes the least recently used files
 *           down to 90% of it (a put that still finds no room keeps
 *           nothing); the scan also corrects the count for what other
 *           processes sharing the directory added or removed. Within one
 *           process the directory so never passes the limit, where six
 *           readahead threads writing 4 MiB segments at once, each counted
 *           only once written, took one bounded at 20 MiB to 42 MB
 *           (test_s3_cache). A scan also follows every
 *           tenth of the limit put: each process counts only its own puts,
 *           so two mounts sharing the directory filled it to twice the
 *           limit before either evicted (1.97 MiB for 1 MiB, test_s3_cache;
 *           67.7 MB for 40M with two mounts on Ceph RGW); now n of them
 *           keep it under about (1 + n/10) times the limit. Opening the
 *           directory trims it as well, as it may be over a smaller limit
 *
 * The directory must be ours and writable by us alone (as ssh asks of
 * ~/.ssh): a file planted by someone else would be served as the store's
 * bytes. An encrypted pack's chunks are authenticated anyway; an
 * unencrypted one's are only checksummed. The CRC (libdeflate's, about
 * 0.05 s of one core for the 475 MB of a 710 MB checkpoint) is against
 * damage, not against an attacker. */
#include "s3.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libdeflate.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_CACHE_BYTES (10ull << 30)
#define TAG_BYTES 16
#define TRAILER_BYTES 8
#define BLOCK (64u << 10)
static const char trailer_magic[4] = {'c', 'k', '2', '\n'};

static size_t n_blocks(size_t len)
{
    return len / BLOCK + (len % BLOCK != 0);
}

/* What follows an entry's len bytes in its file: the CRCs and the trailer. */
static size_t meta_bytes(size_t len)
{
    return n_blocks(len) * 4 + TRAILER_BYTES;
}

struct s3_cache {
    int dirfd;
    char *path;
    uint64_t max_bytes;
    uint64_t blksize;           /* the file system's block: what a file's size rounds up to */
    pthread_mutex_t evict_lock; /* scans, and reservations for puts */
    uint64_t total;             /* atomic: disk bytes the directory's entries take, as counted */
    uint64_t pending;           /* atomic: disk bytes reserved by puts still writing */
    uint64_t unscanned;         /* atomic: bytes put since the last scan */
    pthread_mutex_t index_lock;
    struct known *known; /* the entries, as of the last scan and our puts since */
    size_t n_known, cap_known;
    uint64_t hits, misses, hit_bytes, miss_bytes; /* atomic */
    uint64_t seq;                                 /* atomic: names temporary files apart */
    void (*warn)(void *ud, const char *msg);
    void *warn_ud;
    int warned; /* atomic */
};

/* Cache files, as named by entry_name; other files are left alone. */
static int is_entry(const char *name)
{
    size_t n = strspn(name, "0123456789abcdef");
    return n == TAG_BYTES * 2 && name[n] == '-';
}

static void entry_name(const char *tag, uint64_t off, size_t len, char out[96])
{
    snprintf(out, 96, "%s-%llx-%zx", tag, (unsigned long long)off, len);
}

/* An entry by what its name says, for finding the entries that hold
 * parts of a range without listing the directory at every miss. */
struct known {
    char tag[S3_CACHE_TAG_LEN];
    uint64_t off, len;
};

static int parse_name(const char *name, struct known *k)
{
    unsigned long long off, len;
    char end;
    if (!is_entry(name) || sscanf(name + TAG_BYTES * 2, "-%llx-%llx%c", &off, &len, &end) != 2)
        return -1;
    memcpy(k->tag, name, TAG_BYTES * 2);
    k->tag[TAG_BYTES * 2] = 0;
    k->off = off;
    k->len = len;
    return 0;
}

/* Appends k, which the list does not hold. Called with index_lock held
 * (as know is); a failed allocation only costs a miss. */
static void know_new(s3_cache *c, const struct known *k)
{
    if (c->n_known == c->cap_known) {
        size_t ncap = c->cap_known ? c->cap_known * 2 : 256;
        struct known *g = realloc(c->known, ncap * sizeof *g);
        if (!g)
            return;
        c->known = g;
        c->cap_known = ncap;
    }
    c->known[c->n_known++] = *k;
}

static void know(s3_cache *c, const struct known *k)
{
    for (size_t i = 0; i < c->n_known; i++)
        if (c->known[i].off == k->off && c->known[i].len == k->len &&
            strcmp(c->known[i].tag, k->tag) == 0)
            return;
    know_new(c, k);
}

/* What a file takes on disk: the bound is on that, not on the sizes, as
 * it is the disk that fills (a 4 KiB block holds a 300-byte index
 * entry). */
static uint64_t disk_bytes(const struct stat *st)
{
    return (uint64_t)st->st_blocks * 512;
}

/* What a file of n bytes will take, before it is written. */
static uint64_t disk_estimate(const s3_cache *c, uint64_t n)
{
    return (n + c->blksize - 1) / c->blksize * c->blksize;
}

typedef struct entry {
    char name[96];
    struct timespec used;
    uint64_t size;
} entry;

static int by_use(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec)
        return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

/* A put's temporary file lives for one write of at most a segment; one
 * this old was left by a process killed in a put (SIGKILL, a crash, five
 * such files after five kills in a read on Ceph RGW), outside the count,
 * and would otherwise stay for good. */
#define STALE_TMP_SECONDS 600

static void drop_if_stale(s3_cache *c, const char *name)
{
    struct stat st;
    if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        st.st_mtime + STALE_TMP_SECONDS < time(NULL))
        unlinkat(c->dirfd, name, 0);
}

/* Scans the directory: the disk bytes its entries take, and (when over
 * limit) removes the least recently used entries until below keep_below;
 * one pass both counts and evicts, and rebuilds the index of entries. */
static uint64_t scan(s3_cache *c, uint64_t limit, uint64_t keep_below)
{
    int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return __atomic_load_n(&c->total, __ATOMIC_RELAXED);
    }
    entry *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (strncmp(de->d_name, ".tmp.", 5) == 0)
            drop_if_stale(c, de->d_name);
        if (!is_entry(de->d_name) || strlen(de->d_name) >= sizeof v->name ||
            fstatat(c->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        total += disk_bytes(&st);
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            entry *g = realloc(v, ncap * sizeof *v);
            if (!g)
                break;
            v = g;
            cap = ncap;
        }
        memcpy(v[n].name, de->d_name, strlen(de->d_name) + 1); /* its length is checked above */
        v[n].used = st.st_mtim;
        v[n].size = disk_bytes(&st);
        n++;
    }
    closedir(d);
    size_t first = 0;
    if (total > limit) {
        qsort(v, n, sizeof *v, by_use);
        for (; first < n && total > keep_below; first++)
            if (unlinkat(c->dirfd, v[first].name, 0) == 0)
                total -= v[first].size;
    }
    pthread_mutex_lock(&c->index_lock);
    c->n_known = 0;
    for (size_t i = first; i < n; i++) {
        struct known k;
        if (parse_name(v[i].name, &k) == 0)
            know_new(c, &k); /* names in a directory are unique: know's search made a
                              * scan quadratic (1e10 steps for 160k entries) */
    }
    pthread_mutex_unlock(&c->index_lock);
    free(v);
    return total;
}

int s3_cache_open(const char *dir, uint64_t max_bytes, s3_cache **out, ckpt_err *err)
{
    *out = NULL;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return ckpt_fail(err, -errno, "cache directory %s: cannot create: %s", dir,
                         strerror(errno));
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return ckpt_fail(err, -errno, "cache directory %s: cannot open: %s", dir, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        return ckpt_fail(err, -EPERM,
                         "cache directory %s: must be owned by this user and "
                         "writable by no one else (chmod 700)",
                         dir);
    }
    s3_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(dir))) {
        free(c);
        close(fd);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    c->dirfd = fd;
    c->max_bytes = max_bytes ? max_bytes : DEFAULT_CACHE_BYTES;
    c->blksize = st.st_blksize > 0 ? (uint64_t)st.st_blksize : 4096;
    pthread_mutex_init(&c->evict_lock, NULL);
    pthread_mutex_init(&c->index_lock, NULL);
    c->total = scan(c, c->max_bytes, c->max_bytes / 10 * 9);
    *out = c;
    return 0;
}

void s3_cache_free(s3_cache *c)
{
    if (!c)
        return;
    close(c->dirfd);
    pthread_mutex_destroy(&c->evict_lock);
    pthread_mutex_destroy(&c->index_lock);
    free(c->known);
    free(c->path);
    free(c);
}

void s3_cache_set_warn(s3_cache *c, void (*fn)(void *ud, const char *msg), void *ud)
{
    c->warn = fn;
    c->warn_ud = ud;
}

/* Once: a cache that keeps nothing would otherwise go unnoticed, every
 * read a GET, until someone compares hit counts. */
static void put_failed(s3_cache *c, const char *what, int e)
{
    if (!c->warn || __atomic_exchange_n(&c->warned, 1, __ATOMIC_RELAXED))
        return;
    char msg[PATH_MAX + 256];
    snprintf(msg, sizeof msg,
             "cache directory %s: cannot keep what is read (%s: %s); reading from the store "
             "instead (logged once)",
             c->path, what, strerror(e));
    c->warn(c->warn_ud, msg);
}

int s3_cache_tag(const char *bucket, const char *key, const char *etag, char out[S3_CACHE_TAG_LEN])
{
    if (!etag || !etag[0])
        return -1; /* no version to tell: never cached */
    uint8_t h[TAG_BYTES];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const uint8_t *)bucket, strlen(bucket) + 1);
    crypto_generichash_update(&st, (const uint8_t *)key, strlen(key) + 1);
    crypto_generichash_update(&st, (const uint8_t *)etag, strlen(etag));
    crypto_generichash_final(&st, h, sizeof h);
    sodium_bin2hex(out, S3_CACHE_TAG_LEN, h, sizeof h);
    return 0;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_trailer(uint8_t *tr)
{
    memcpy(tr, trailer_magic, 4);
    put_le32(tr + 4, BLOCK);
}

static int trailer_ok(const uint8_t *tr)
{
    uint8_t want[TRAILER_BYTES];
    put_trailer(want);
    return memcmp(tr, want, TRAILER_BYTES) == 0;
}

/* An entry's file, opened (O_DIRECT when direct and the file system takes
 * it), when it is a regular file of the length an entry of len has; -1
 * otherwise. */
static int open_entry(s3_cache *c, const char *name, size_t len, int *direct)
{
    int fd = *direct ? openat(c->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0) {
        *direct = 0;
        fd = openat(c->dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    }
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                    (uint64_t)st.st_size != len + meta_bytes(len))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The bytes of an entry of len bytes, its CRCs and trailer in meta
 * (meta_bytes(len)); -1 on a short file. A page-aligned buffer and length
 * (the readahead's segments) are read with O_DIRECT, straight into buf:
 * the device fills it with no page cache in between, whose copy and page
 * handling cost the readahead's threads 0.2 s of CPU for a 710 MB
 * checkpoint (perf), on cores the decoder needs; the warm read went from
 * 0.83x to 0.88x of a local directory with it. Where the file system
 * refuses O_DIRECT, the same read goes buffered. */
static int read_entry(s3_cache *c, const char *name, void *buf, size_t len, uint8_t *meta)
{
    size_t mlen = meta_bytes(len);
    int direct = (uintptr_t)buf % S3_RA_ALIGN == 0 && len % S3_RA_ALIGN == 0 && mlen <= S3_RA_ALIGN;
    int fd = open_entry(c, name, len, &direct);
    if (fd < 0)
        return -1;
    int ok = 1;
    if (direct) {
        _Alignas(S3_RA_ALIGN) uint8_t page[S3_RA_ALIGN];
        struct iovec iov[2] = {{buf, len}, {page, sizeof page}};
        ssize_t got = preadv(fd, iov, 2, 0);
        if (got == (ssize_t)(len + mlen))
            memcpy(meta, page, mlen);
        else if (got >= 0 || errno != EINVAL)
            ok = 0;
        else
            direct = 0; /* refused after all: read it buffered */
    }
    if (ok && !direct) {
        struct iovec iov[2] = {{buf, len}, {meta, mlen}};
        ok = preadv(fd, iov, 2, 0) == (ssize_t)(len + mlen);
    }
    if (ok)
        futimens(fd, NULL); /* recently used: evicted last */
    close(fd);
    return ok ? 0 : -1;
}

/* Reads the entry for [off, off + len) into buf: 1 when it is there, whole
 * and every block matches its CRC; 0 otherwise (touching nothing but buf). */
static int load(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len)
{
    char name[96];
    entry_name(tag, off, len, name);
    size_t mlen = meta_bytes(len);
    uint8_t small[S3_RA_ALIGN], *meta = mlen <= sizeof small ? small : malloc(mlen);
    int ok =
        meta && read_entry(c, name, buf, len, meta) == 0 && trailer_ok(meta + mlen - TRAILER_BYTES);
    for (size_t b = 0; ok && b < n_blocks(len); b++) {
        size_t n = len - b * BLOCK < BLOCK ? len - b * BLOCK : BLOCK;
        ok = (uint32_t)libdeflate_crc32(0, (uint8_t *)buf + b * BLOCK, n) == get_le32(meta + 4 * b);
    }
    if (meta != small)
        free(meta);
    return ok;
}

/* The CRC-32 of bytes [from, to) of what the three pieces hold in turn. */
static uint32_t crc_of(const struct iovec *v, int n, size_t from, size_t to)
{
    uint32_t crc = 0;
    size_t at = 0;
    for (int i = 0; i < n && at < to; at += v[i].iov_len, i++) {
        size_t a = from > at ? from - at : 0, e = to - at < v[i].iov_len ? to - at : v[i].iov_len;
        if (a < e)
            crc = (uint32_t)libdeflate_crc32(crc, (uint8_t *)v[i].iov_base + a, e - a);
    }
    return crc;
}

/* The most blocks one load_part reads (4 MiB); a larger span is read in
 * pieces of it (load_span). */
#define MAX_PART_BLOCKS 64

/* Bytes [at, at + n) of the entry of [off, off + len) into buf, with the
 * blocks that hold them, each checked against its CRC: 1 when all match,
 * else 0. Only those blocks are read (buffered: they are rarely page
 * aligned at both ends), the head and tail beyond the range into
 * *scratch, 2 * BLOCK bytes allocated at the first entry found: most
 * ranges of a cold read have none, and pay only the failed open. */
static int load_part(s3_cache *c, const char *tag, uint64_t off, size_t len, size_t at, void *buf,
                     size_t n, uint8_t **scratch_p)
{
    char name[96];
    entry_name(tag, off, len, name);
    int direct = 0;
    int fd = open_entry(c, name, len, &direct);
    if (fd < 0)
        return 0;
    if (!*scratch_p && !(*scratch_p = malloc(2 * BLOCK))) {
        close(fd);
        return 0;
    }
    uint8_t *scratch = *scratch_p;
    size_t b0 = at / BLOCK, b1 = (at + n - 1) / BLOCK, nb = b1 - b0 + 1;
    size_t start = b0 * BLOCK, end = (b1 + 1) * BLOCK < len ? (b1 + 1) * BLOCK : len;
    struct iovec v[3] = {{scratch, at - start}, {buf, n}, {scratch + BLOCK, end - (at + n)}};
    uint8_t crcs[4 * MAX_PART_BLOCKS], tr[TRAILER_BYTES];
    int ok = nb <= MAX_PART_BLOCKS && preadv(fd, v, 3, (off_t)start) == (ssize_t)(end - start) &&
             pread(fd, crcs, 4 * nb, (off_t)(len + 4 * b0)) == (ssize_t)(4 * nb) &&
             pread(fd, tr, sizeof tr, (off_t)(len + 4 * n_blocks(len))) == (ssize_t)sizeof tr &&
             trailer_ok(tr);
    for (size_t b = 0; ok && b < nb; b++) {
        size_t from = b * BLOCK, to = from + BLOCK < end - start ? from + BLOCK : end - start;
        ok = crc_of(v, 3, from, to) == get_le32(crcs + 4 * b);
    }
    if (ok)
        futimens(fd, NULL);
    close(fd);
    return ok;
}

/* Bytes [at, at + n) of the object from the entry of [e_off, e_off +
 * e_len), which holds them, in pieces of at most MAX_PART_BLOCKS blocks. */
static int load_span(s3_cache *c, const char *tag, uint64_t e_off, uint64_t e_len, uint64_t at,
                     uint8_t *buf, uint64_t n, uint8_t **scratch)
{
    while (n) {
        uint64_t k = MAX_PART_BLOCKS * BLOCK - (at - e_off) % BLOCK;
        k = k < n ? k : n;
        if (!load_part(c, tag, e_off, (size_t)e_len, (size_t)(at - e_off), buf, (size_t)k, scratch))
            return 0;
        at += k;
        buf += k;
        n -= k;
    }
    return 1;
}

/* The range from the entries of the segments that hold it, in parts. */
static int load_from_segments(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len,
                              uint64_t seg, uint64_t size)
{
    if (!seg || !len || off >= size || len > size - off)
        return 0;
    uint8_t *scratch = NULL;
    int ok = 1;
    for (uint64_t at = off; ok && at < off + len;) {
        uint64_t s_off = at / seg * seg, s_len = size - s_off < seg ? size - s_off : seg;
        uint64_t n = s_off + s_len - at < off + len - at ? s_off + s_len - at : off + len - at;
        ok = load_span(c, tag, s_off, s_len, at, (uint8_t *)buf + (at - off), n, &scratch);
        at += n;
    }
    free(scratch);
    return ok;
}

int s3_cache_holds(s3_cache *c, const char *tag, uint64_t off, size_t len, uint64_t seg,
                   uint64_t size)
{
    char name[96];
    struct stat st;
    entry_name(tag, off, len, name);
    if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        return 1;
    if (!seg || !len || off >= size || len > size - off)
        return 0;
    for (uint64_t s_off = off / seg * seg; s_off < off + len; s_off += seg) {
        entry_name(tag, s_off, (size_t)(size - s_off < seg ? size - s_off : seg), name);
        if (fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            return 0;
    }
    return 1;
}

int s3_cache_get(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len, uint64_t seg,
                 uint64_t size)
{
    int hit = load(c, tag, off, buf, len) || load_from_segments(c, tag, off, buf, len, seg, size);
    __atomic_add_fetch(hit ? &c->hits : &c->misses, 1, __ATOMIC_RELAXED);
    if (hit)
        __atomic_add_fetch(&c->hit_bytes, len, __ATOMIC_RELAXED);
    return hit;
}

/* The known entries of tag that overlap [off, off + len), other than the
 * range's own (already found wanting); *n of them, NULL when none. */
static struct known *overlapping(s3_cache *c, const char *tag, uint64_t off, size_t len, size_t *n)
{
    struct known *v = NULL;
    size_t cap = 0;
    *n = 0;
    pthread_mutex_lock(&c->index_lock);
    for (size_t i = 0; i < c->n_known; i++) {
        const struct known *k = &c->known[i];
        if (k->off >= off + len || k->off + k->len <= off || (k->off == off && k->len == len) ||
            strcmp(k->tag, tag) != 0)
            continue;
        if (*n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct known *g = realloc(v, ncap * sizeof *g);
            if (!g)
                break;
            v = g;
            cap = ncap;
        }
        v[(*n)++] = *k;
    }
    pthread_mutex_unlock(&c->index_lock);
    return v;
}

int s3_cache_fill_gaps(s3_cache *c, const char *tag, uint64_t off, void *buf, size_t len,
                       s3_span *gaps, size_t max, size_t *n_gaps)
{
    *n_gaps = 0;
    int whole = load(c, tag, off, buf, len);
    size_t n = 0;
    struct known *v = whole ? NULL : overlapping(c, tag, off, len, &n);
    uint64_t end = off + len;
    uint8_t *scratch = NULL;
    /* Left to right: from the entry that reaches furthest past at, or a
     * gap up to the next entry; an entry that fails its CRCs is dropped
     * and its part looked for again. */
    for (uint64_t at = off; !whole && at < end;) {
        size_t best = n;
        uint64_t next = end;
        for (size_t i = 0; i < n; i++) {
            uint64_t e = v[i].off + v[i].len;
            if (v[i].off <= at && e > at && (best == n || e > v[best].off + v[best].len))
                best = i;
            else if (v[i].off > at && v[i].off < next)
                next = v[i].off;
        }
        if (best == n) {
            s3_span *g = &gaps[*n_gaps - (*n_gaps == max)];
            if (*n_gaps < max)
                g->off = at, ++*n_gaps;
            g->len = (size_t)(next - g->off); /* the last one takes in the rest */
            at = next;
            continue;
        }
        uint64_t to = v[best].off + v[best].len < end ? v[best].off + v[best].len : end;
        if (load_span(c, tag, v[best].off, v[best].len, at, (uint8_t *)buf + (at - off), to - at,
                      &scratch))
            at = to;
        else
            v[best] = v[--n];
    }
    free(scratch);
    free(v);
    if (!whole && !*n_gaps)
        whole = 1; /* every byte from the entries of its parts */
    __atomic_add_fetch(whole ? &c->hits : &c->misses, 1, __ATOMIC_RELAXED);
    if (whole)
        __atomic_add_fetch(&c->hit_bytes, len, __ATOMIC_RELAXED);
    return whole;
}

/* Room for a put of need disk bytes, taken before it writes: 1, or 0
 * when the bound cannot make room (everything held is being written).
 * Several puts of 4 MiB segments at once, each counted only once written,
 * took a directory bounded at 20 MB to 24.6 MB; now what is written and
 * what is being written stay within the bound together. */
static int reserve(s3_cache *c, uint64_t need)
{
    uint64_t max = c->max_bytes;
    pthread_mutex_lock(&c->evict_lock);
    uint64_t pending = __atomic_load_n(&c->pending, __ATOMIC_RELAXED) + need;
    uint64_t total = __atomic_load_n(&c->total, __ATOMIC_RELAXED);
    if (total + pending > max || __atomic_load_n(&c->unscanned, __ATOMIC_RELAXED) > max / 10) {
        __atomic_store_n(&c->unscanned, 0, __ATOMIC_RELAXED);
        uint64_t room = pending < max ? max - pending : 0, keep = max / 10 * 9;
        total = scan(c, room, keep > pending ? keep - pending : 0);
        __atomic_store_n(&c->total, total, __ATOMIC_RELAXED);
    }
    int ok = total + pending <= max;
    if (ok)
        __atomic_add_fetch(&c->pending, need, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->evict_lock);
    return ok;
}

void s3_cache_put(s3_cache *c, const char *tag, uint64_t off, const void *buf, size_t len)
{
    s3_cache_keep(c, tag, off, buf, len, len);
}

void s3_cache_keep(s3_cache *c, const char *tag, uint64_t off, const void *buf, size_t len,
                   size_t fetched)
{
    __atomic_add_fetch(&c->miss_bytes, fetched, __ATOMIC_RELAXED);
    size_t mlen = meta_bytes(len);
    uint64_t need = disk_estimate(c, len + mlen);
    if (len > c->max_bytes / 4)
        return; /* it would push out a quarter of the cache at once */
    if (!reserve(c, need))
        return;
    char name[96], tmp[64];
    entry_name(tag, off, len, name);
    snprintf(tmp, sizeof tmp, ".tmp.%ld.%llx", (long)getpid(),
             (unsigned long long)__atomic_add_fetch(&c->seq, 1, __ATOMIC_RELAXED));
    int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        __atomic_sub_fetch(&c->pending, need, __ATOMIC_RELAXED);
        put_failed(c, "create", errno);
        return;
    }
    uint8_t small[S3_RA_ALIGN], *meta = mlen <= sizeof small ? small : malloc(mlen);
    ssize_t w = meta ? 0 : -ENOMEM;
    for (size_t b = 0; meta && b < n_blocks(len); b++) {
        size_t n = len - b * BLOCK < BLOCK ? len - b * BLOCK : BLOCK;
        put_le32(meta + 4 * b, (uint32_t)libdeflate_crc32(0, (const uint8_t *)buf + b * BLOCK, n));
    }
    if (meta)
        put_trailer(meta + mlen - TRAILER_BYTES);
    if (w >= 0)
        w = ckpt_write_full(fd, buf, len);
    if (w >= 0)
        w = ckpt_write_full(fd, meta, mlen);
    if (meta != small)
        free(meta);
    int e = w < 0 ? (int)-w : 0;
    if (close(fd) != 0 && !e)
        e = errno;
    /* Once closed: a file system may hold blocks past the end of a file
     * being written (XFS's speculative preallocation) and let them go at
     * its close. */
    struct stat st;
    uint64_t took =
        e == 0 && fstatat(c->dirfd, tmp, &st, AT_SYMLINK_NOFOLLOW) == 0 ? disk_bytes(&st) : need;
    /* The file this one replaces (a damaged one) was counted: it goes.
     * Under the scans' lock, so that a scan, which counts what the
     * directory holds, never falls between the rename and the count and
     * has the new file counted twice, or the replaced one taken off twice. */
    pthread_mutex_lock(&c->evict_lock);
    uint64_t replaced =
        fstatat(c->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? disk_bytes(&st) : 0;
    const char *what = "write";
    if (!e && renameat(c->dirfd, tmp, c->dirfd, name) != 0) {
        e = errno;
        what = "rename";
    }
    if (e) {
        __atomic_sub_fetch(&c->pending, need, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->evict_lock);
        unlinkat(c->dirfd, tmp, 0); /* a full disk: the cache is only a cache */
        put_failed(c, what, e);
        return;
    }
    /* Counted before the reservation is let go: the two never sum to
     * less than the directory holds. */
    uint64_t t = __atomic_load_n(&c->total, __ATOMIC_RELAXED) + took;
    __atomic_store_n(&c->total, replaced <= t ? t - replaced : 0, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&c->pending, need, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->evict_lock);
    struct known k;
    if (parse_name(name, &k) == 0) {
        pthread_mutex_lock(&c->index_lock);
        know(c, &k);
        pthread_mutex_unlock(&c->index_lock);
    }
    __atomic_add_fetch(&c->unscanned, len + mlen, __ATOMIC_RELAXED);
}

void s3_cache_stats(s3_cache *c, ckpt_store_cache_stats *out)
{
    if (!c)
        return;
    out->hits = __atomic_load_n(&c->hits, __ATOMIC_RELAXED);
    out->misses = __atomic_load_n(&c->misses, __ATOMIC_RELAXED);
    out->hit_bytes = __atomic_load_n(&c->hit_bytes, __ATOMIC_RELAXED);
    out->miss_bytes = __atomic_load_n(&c->miss_bytes, __ATOMIC_RELAXED);
    out->stored_bytes = __atomic_load_n(&c->total, __ATOMIC_RELAXED);
}
