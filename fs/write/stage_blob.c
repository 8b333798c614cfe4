#include "stage_blob.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define REC_MAGIC 0x42534B43u /* "CKSB" */
#define REC_HEADER 24u
#define REC_NONCE STAGE_NONCE
#define REC_TAG STAGE_TAG
#define REC_OVERHEAD (REC_HEADER + REC_NONCE + REC_TAG)
#define REC_AD (8u + REC_HEADER)
enum { REC_DATA = 1, REC_SIZE = 2 };
/* Compact once dead records outweigh live ones by this much. */
#define COMPACT_SLACK (8ull << 20)
/* Map entries pack the record offset (+1, so 0 means "no record") above
 * the block's plaintext length - 1. */
#define MAP_OFF(e) (((e) >> 16) - 1)
#define MAP_LEN(e) ((uint32_t)((e) & 0xffffu) + 1)
#define MAP_MAX_OFF ((1ull << 47) - 2)
/* 4096 entries per map page (256 MiB of file); at most 2^20 pages, so a
 * sealed file holds up to 256 TiB. */
#define MAP_PAGE 4096u
#define MAP_MAX_PAGES (1u << 20)

struct stage_blob {
    pthread_mutex_t lock;
    int dirfd, fd;
    uint64_t id;
    char name[24];
    const stage_key *key;     /* NULL: plain */
    uint64_t size;
    int unlinked;
    int need_dir_sync;        /* created; its name is not known durable yet */

    /* Sealed blobs only. */
    uint64_t **pages;         /* block -> newest record, see map_slot */
    size_t n_pages;
    uint64_t log_end, live_bytes;
    uint8_t *buf;             /* one block of plaintext */
    uint64_t buf_block;
    uint32_t buf_len;         /* plaintext bytes of that block (the rest is zero) */
    int buf_valid, buf_dirty;
    uint8_t *rec;             /* a record being sealed or opened */
};

void stage_blob_name(uint64_t id, char out[24])
{
    snprintf(out, 24, "%016" PRIx64, id);
}

uint64_t stage_blob_id(const stage_blob *b)
{
    return b->id;
}

static int fail_io(stage_blob *b, ckpt_err *err, int code, const char *what)
{
    return ckpt_fail(err, code, "staging file %s: %s: %s", b->name, what, strerror(-code));
}

/* Sealed blobs need two block-sized buffers while in use; they are
 * dropped when the blob is parked, so thousands of idle files cost
 * nothing but their maps. */
static int ensure_bufs(stage_blob *b, ckpt_err *err)
{
    if (b->buf)
        return 0;
    b->buf = malloc(STAGE_BLOCK);
    b->rec = malloc(STAGE_BLOCK + REC_OVERHEAD);
    if (b->buf && b->rec)
        return 0;
    free(b->buf);
    free(b->rec);
    b->buf = b->rec = NULL;
    return ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
}

static void drop_bufs(stage_blob *b)
{
    if (b->buf)
        sodium_memzero(b->buf, STAGE_BLOCK);
    free(b->buf);
    free(b->rec);
    b->buf = b->rec = NULL;
    b->buf_valid = 0;
}

static int ensure_fd(stage_blob *b, ckpt_err *err)
{
    if (b->key && ensure_bufs(b, err) != 0)
        return -ENOMEM;
    if (b->fd >= 0)
        return 0;
    b->fd = openat(b->dirfd, b->name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (b->fd < 0)
        return fail_io(b, err, -errno, "cannot reopen");
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

/* 0, or -EIO at end of file, or -errno. */
static int pread_all(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

/* ------------------------------------------------------------- records */

static void make_header(uint8_t h[REC_HEADER], const stage_blob *b, int type, uint64_t block,
                        uint32_t plen)
{
    memset(h, 0, REC_HEADER);
    put_u32(h, REC_MAGIC);
    h[4] = (uint8_t)type;
    h[5] = (uint8_t)b->key->cipher;
    put_u64(h + 8, block);
    put_u32(h + 16, plen);
}

static void make_ad(const stage_blob *b, const uint8_t *header, uint8_t ad[REC_AD])
{
    put_u64(ad, b->id);
    memcpy(ad + 8, header, REC_HEADER);
}

/* Seals one record into r (REC_OVERHEAD + plen bytes). */
static void seal_record(const stage_blob *b, uint8_t *r, int type, uint64_t block,
                        const uint8_t *plain, uint32_t plen)
{
    uint8_t ad[REC_AD];
    make_header(r, b, type, block, plen);
    make_ad(b, r, ad);
    stage_seal(b->key, ad, sizeof ad, plain, plen, r + REC_HEADER, r + REC_HEADER + REC_NONCE);
}

/* Appends n bytes of sealed records at the end of the log; on failure the
 * log is cut back so a half-written record never stays in the middle. */
static int append_records(stage_blob *b, const uint8_t *recs, size_t n, uint64_t *at,
                          ckpt_err *err)
{
    if (b->log_end > MAP_MAX_OFF)
        return ckpt_fail(err, -EFBIG, "staging file %s: log too large", b->name);
    int rc = pwrite_all(b->fd, recs, n, b->log_end);
    if (rc) {
        if (ftruncate(b->fd, (off_t)b->log_end) != 0) {
            /* The partial record stays past log_end; replay cuts it. */
        }
        return fail_io(b, err, rc, "write failed");
    }
    *at = b->log_end;
    b->log_end += n;
    return 0;
}

static int append_record(stage_blob *b, int type, uint64_t block, const uint8_t *plain,
                         uint32_t plen, uint64_t *at, ckpt_err *err)
{
    int rc = ensure_fd(b, err);
    if (rc)
        return rc;
    seal_record(b, b->rec, type, block, plain, plen);
    return append_records(b, b->rec, REC_OVERHEAD + plen, at, err);
}

/* Reads and opens the record at off into out (plen bytes). */
static int load_record(stage_blob *b, uint64_t off, int type, uint64_t block, uint32_t plen,
                       uint8_t *out, ckpt_err *err)
{
    int rc = ensure_fd(b, err);
    if (rc)
        return rc;
    uint8_t *r = b->rec, ad[REC_AD], want[REC_HEADER];
    rc = pread_all(b->fd, r, REC_OVERHEAD + plen, off);
    if (rc)
        return fail_io(b, err, rc, "read failed");
    make_header(want, b, type, block, plen);
    make_ad(b, want, ad);
    if (memcmp(r, want, REC_HEADER) != 0 ||
        stage_unseal(b->key, ad, sizeof ad, r + REC_HEADER + REC_NONCE, plen, r + REC_HEADER,
                     out) != 0)
        return ckpt_fail(err, -EIO,
                         "staging file %s: block %" PRIu64 " fails authentication (damaged)",
                         b->name, block);
    return 0;
}

/* The map is two-level, pages allocated as blocks are touched, so a sparse
 * file costs memory for what it holds, not for how far it reaches. */
static uint64_t *map_slot(stage_blob *b, uint64_t block, int create)
{
    uint64_t page = block / MAP_PAGE;
    if (page >= MAP_MAX_PAGES)
        return NULL;
    if (page >= b->n_pages) {
        if (!create)
            return NULL;
        size_t n = b->n_pages ? b->n_pages : 4;
        while (n <= page)
            n *= 2;
        uint64_t **grown = realloc(b->pages, n * sizeof *grown);
        if (!grown)
            return NULL;
        memset(grown + b->n_pages, 0, (n - b->n_pages) * sizeof *grown);
        b->pages = grown;
        b->n_pages = n;
    }
    if (!b->pages[page]) {
        if (!create)
            return NULL;
        b->pages[page] = calloc(MAP_PAGE, sizeof **b->pages);
        if (!b->pages[page])
            return NULL;
    }
    return &b->pages[page][block % MAP_PAGE];
}

static uint64_t map_get(stage_blob *b, uint64_t block)
{
    uint64_t *e = map_slot(b, block, 0);
    return e ? *e : 0;
}

/* Records that block's newest record is at off; -ENOMEM or -EFBIG. */
static int map_set(stage_blob *b, uint64_t block, uint64_t off, uint32_t plen)
{
    uint64_t *e = map_slot(b, block, 1);
    if (!e)
        return block / MAP_PAGE >= MAP_MAX_PAGES ? -EFBIG : -ENOMEM;
    if (*e)
        b->live_bytes -= REC_OVERHEAD + MAP_LEN(*e);
    *e = ((off + 1) << 16) | (plen - 1);
    b->live_bytes += REC_OVERHEAD + plen;
    return 0;
}

/* Forgets the records of every block at or after first. */
static void map_drop_from(stage_blob *b, uint64_t first)
{
    for (uint64_t p = first / MAP_PAGE; p < b->n_pages; p++) {
        if (!b->pages[p])
            continue;
        for (uint64_t i = p == first / MAP_PAGE ? first % MAP_PAGE : 0; i < MAP_PAGE; i++) {
            uint64_t *e = &b->pages[p][i];
            if (*e)
                b->live_bytes -= REC_OVERHEAD + MAP_LEN(*e);
            *e = 0;
        }
    }
}

static uint64_t blocks_for(uint64_t size)
{
    return size / STAGE_BLOCK + (size % STAGE_BLOCK != 0);
}

/* ------------------------------------------------------------ compaction */

/* Copies the live records into a new log and renames it over the old. */
static int compact(stage_blob *b, ckpt_err *err)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%s.compact", b->name);
    int fd = openat(b->dirfd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return fail_io(b, err, -errno, "cannot create compacted log");
    int rc = 0;
    uint64_t pos = 0;
    /* Records do not depend on where they sit, so they move verbatim. */
    for (size_t p = 0; rc == 0 && p < b->n_pages; p++) {
        for (size_t i = 0; rc == 0 && b->pages[p] && i < MAP_PAGE; i++) {
            uint64_t e = b->pages[p][i];
            if (!e)
                continue;
            size_t n = REC_OVERHEAD + MAP_LEN(e);
            rc = pread_all(b->fd, b->rec, n, MAP_OFF(e));
            if (rc == 0)
                rc = pwrite_all(fd, b->rec, n, pos);
            pos += n;
        }
    }
    /* The size goes last, as replay of the old log would have it. */
    uint8_t size_le[8];
    put_u64(size_le, b->size);
    int old_fd = b->fd;
    uint64_t old_end = b->log_end, size_at;
    ckpt_err e2 = {0};
    if (rc == 0) {
        b->fd = fd;
        b->log_end = pos;
        rc = append_record(b, REC_SIZE, 0, size_le, 8, &size_at, &e2);
        if (rc == 0 && fdatasync(fd) != 0)
            rc = -errno;
    }
    b->fd = old_fd;
    if (rc == 0 && renameat(b->dirfd, tmp, b->dirfd, b->name) != 0)
        rc = -errno;
    if (rc == 0 && fsync(b->dirfd) != 0)
        rc = -errno;
    if (rc) {
        b->log_end = old_end;
        unlinkat(b->dirfd, tmp, 0);
        close(fd);
        return fail_io(b, err, rc, "compacting its log failed");
    }
    /* Same order as written above, so the new offsets follow along. */
    pos = 0;
    for (size_t p = 0; p < b->n_pages; p++) {
        for (size_t i = 0; b->pages[p] && i < MAP_PAGE; i++) {
            uint64_t e = b->pages[p][i];
            if (!e)
                continue;
            b->pages[p][i] = ((pos + 1) << 16) | (e & 0xffffu);
            pos += REC_OVERHEAD + MAP_LEN(e);
        }
    }
    close(old_fd);
    b->fd = fd;
    b->log_end = pos + REC_OVERHEAD + 8;
    return 0;
}

/* ---------------------------------------------------- parallel sealing */

/* Whole blocks of a big write are sealed on every core at once: sealing
 * is most of the cost of writing into an encrypted checkpoint, and the
 * writing process (cp) waits for each write. One fork-join job at a time,
 * shared by all blobs; the threads start on first use (after the daemon
 * has forked) and live as long as the process. */
#define BATCH_BLOCKS 16u
#define BATCH_STRIDE (REC_OVERHEAD + STAGE_BLOCK)

typedef struct seal_job {
    const stage_blob *b;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t first_block;
    size_t n, next;
} seal_job;

static pthread_mutex_t pool_one = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_idle = PTHREAD_COND_INITIALIZER;
static seal_job *pool_job;
static uint64_t pool_gen;
static unsigned pool_busy;
static int pool_state; /* 0 not started, 1 running, -1 no helpers */

static void seal_some(seal_job *j)
{
    for (;;) {
        size_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n)
            return;
        seal_record(j->b, j->dst + i * BATCH_STRIDE, REC_DATA, j->first_block + i,
                    j->src + i * STAGE_BLOCK, STAGE_BLOCK);
    }
}

static void *pool_main(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool_mu);
    for (;;) {
        while (pool_gen == seen)
            pthread_cond_wait(&pool_work, &pool_mu);
        seen = pool_gen;
        seal_job *j = pool_job;
        if (!j)
            continue;
        pool_busy++;
        pthread_mutex_unlock(&pool_mu);
        seal_some(j);
        pthread_mutex_lock(&pool_mu);
        if (--pool_busy == 0)
            pthread_cond_broadcast(&pool_idle);
    }
    return NULL;
}

static void pool_start(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned helpers = cpus > 1 ? (unsigned)(cpus > 64 ? 63 : cpus - 1) : 0, started = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (unsigned i = 0; i < helpers; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, pool_main, NULL) == 0)
            started++;
    }
    pthread_attr_destroy(&attr);
    pool_state = started ? 1 : -1;
}

static void seal_parallel(seal_job *j)
{
    pthread_mutex_lock(&pool_one);
    if (pool_state == 0)
        pool_start();
    if (pool_state > 0) {
        pthread_mutex_lock(&pool_mu);
        pool_job = j;
        pool_gen++;
        pthread_cond_broadcast(&pool_work);
        pthread_mutex_unlock(&pool_mu);
    }
    seal_some(j);
    if (pool_state > 0) {
        /* Every block is claimed; wait for the helpers still sealing one. */
        pthread_mutex_lock(&pool_mu);
        pool_job = NULL;
        while (pool_busy)
            pthread_cond_wait(&pool_idle, &pool_mu);
        pthread_mutex_unlock(&pool_mu);
    }
    pthread_mutex_unlock(&pool_one);
}

/* --------------------------------------------------------- block buffer */

/* Writes the buffered block to the log if it changed. */
static int flush_buf(stage_blob *b, ckpt_err *err)
{
    if (!b->buf_dirty)
        return 0;
    if (b->buf_len == 0) {
        /* A block of nothing: only possible after a truncate into it, and
         * the truncate already recorded the size. */
        b->buf_dirty = 0;
        return 0;
    }
    uint64_t at;
    /* Room in the map first: a record the map cannot hold would be lost. */
    if (!map_slot(b, b->buf_block, 1))
        return ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
    int rc = append_record(b, REC_DATA, b->buf_block, b->buf, b->buf_len, &at, err);
    if (rc)
        return rc;
    map_set(b, b->buf_block, at, b->buf_len);
    b->buf_dirty = 0;
    if (b->log_end > 2 * b->live_bytes + COMPACT_SLACK)
        return compact(b, err);
    return 0;
}

/* Makes the buffer hold block `block` (flushing the one it held). */
static int load_buf(stage_blob *b, uint64_t block, int whole_overwrite, ckpt_err *err)
{
    if (b->buf_valid && b->buf_block == block)
        return 0;
    int rc = flush_buf(b, err);
    if (rc == 0)
        rc = ensure_bufs(b, err);
    if (rc)
        return rc;
    b->buf_valid = 0;
    uint64_t e = map_get(b, block);
    uint32_t len = 0;
    if (e && !whole_overwrite) {
        len = MAP_LEN(e);
        rc = load_record(b, MAP_OFF(e), REC_DATA, block, len, b->buf, err);
        if (rc)
            return rc;
    }
    memset(b->buf + len, 0, STAGE_BLOCK - len);
    b->buf_block = block;
    b->buf_len = len;
    b->buf_valid = 1;
    return 0;
}

/* ---------------------------------------------------------- open/close */

/* Rebuilds the map from the log. A record that is cut short or fails to
 * authenticate can only be an unsynced tail left by a crash (the caller
 * has checked the key), so the log is cut there. */
static int replay(stage_blob *b, ckpt_err *err)
{
    struct stat st;
    if (fstat(b->fd, &st) != 0)
        return fail_io(b, err, -errno, "stat failed");
    uint64_t file_size = (uint64_t)st.st_size, off = 0;
    uint8_t *plain = b->buf;
    for (;;) {
        uint8_t h[REC_HEADER];
        if (off + REC_OVERHEAD > file_size || pread_all(b->fd, h, REC_HEADER, off) != 0)
            break;
        int type = h[4];
        uint64_t block = get_u64(h + 8);
        uint32_t plen = get_u32(h + 16);
        int sane = get_u32(h) == REC_MAGIC &&
                   ((type == REC_DATA && plen >= 1 && plen <= STAGE_BLOCK &&
                     map_slot(b, block, 1) != NULL) ||
                    (type == REC_SIZE && plen == 8));
        ckpt_err ignored;
        if (!sane || off + REC_OVERHEAD + plen > file_size ||
            load_record(b, off, type, block, plen, plain, &ignored) != 0)
            break;
        if (type == REC_DATA) {
            map_set(b, block, off, plen);
            if (block * STAGE_BLOCK + plen > b->size)
                b->size = block * STAGE_BLOCK + plen;
        } else {
            b->size = get_u64(plain);
            map_drop_from(b, blocks_for(b->size));
        }
        off += REC_OVERHEAD + plen;
    }
    b->log_end = off;
    if (off < file_size && ftruncate(b->fd, (off_t)off) != 0)
        return fail_io(b, err, -errno, "cannot cut the damaged tail of the log");
    return 0;
}

int stage_blob_open(int dirfd, uint64_t id, const stage_key *key, int create, stage_blob **out,
                    ckpt_err *err)
{
    *out = NULL;
    stage_blob *b = calloc(1, sizeof *b);
    if (!b)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&b->lock, NULL);
    b->dirfd = dirfd;
    b->id = id;
    b->key = key;
    stage_blob_name(id, b->name);
    int rc = key ? ensure_bufs(b, err) : 0;
    if (rc == 0) {
        int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_EXCL : 0);
        b->fd = openat(dirfd, b->name, flags, 0600);
        if (b->fd < 0)
            rc = fail_io(b, err, -errno, create ? "cannot create" : "cannot open");
    }
    b->need_dir_sync = create;
    if (rc == 0 && !create && key) {
        rc = replay(b, err);
    } else if (rc == 0 && !create) {
        struct stat st;
        if (fstat(b->fd, &st) != 0)
            rc = fail_io(b, err, -errno, "stat failed");
        else
            b->size = (uint64_t)st.st_size;
    }
    if (rc) {
        if (b->fd >= 0)
            close(b->fd);
        b->fd = -1;
        stage_blob_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void stage_blob_free(stage_blob *b)
{
    if (!b)
        return;
    if (b->fd >= 0)
        close(b->fd);
    drop_bufs(b);
    for (size_t p = 0; p < b->n_pages; p++)
        free(b->pages[p]);
    free(b->pages);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

uint64_t stage_blob_size(stage_blob *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t s = b->size;
    pthread_mutex_unlock(&b->lock);
    return s;
}

uint64_t stage_blob_disk_bytes(stage_blob *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t n = b->key ? b->log_end : b->size;
    pthread_mutex_unlock(&b->lock);
    return n;
}

/* -------------------------------------------------------------- reading */

static ssize_t sealed_read(stage_blob *b, uint8_t *buf, size_t len, uint64_t off, ckpt_err *err)
{
    size_t done = 0;
    while (done < len) {
        uint64_t pos = off + done, block = pos / STAGE_BLOCK;
        uint32_t in = (uint32_t)(pos % STAGE_BLOCK);
        size_t n = STAGE_BLOCK - in;
        if (n > len - done)
            n = len - done;
        uint64_t e = map_get(b, block);
        if (b->buf_valid && b->buf_block == block) {
            memcpy(buf + done, b->buf + in, n);
        } else if (!e) {
            memset(buf + done, 0, n);
        } else if (in == 0 && n >= MAP_LEN(e)) {
            /* The whole stored block is wanted: open it in place. */
            uint32_t plen = MAP_LEN(e);
            int rc = load_record(b, MAP_OFF(e), REC_DATA, block, plen, buf + done, err);
            if (rc)
                return rc;
            memset(buf + done + plen, 0, n - plen);
        } else {
            int rc = load_buf(b, block, 0, err);
            if (rc)
                return rc;
            memcpy(buf + done, b->buf + in, n);
        }
        done += n;
    }
    return (ssize_t)done;
}

ssize_t stage_blob_pread(stage_blob *b, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    ssize_t rc = 0;
    if (off >= b->size) {
        rc = 0;
    } else {
        if (len > b->size - off)
            len = (size_t)(b->size - off);
        if (b->key) {
            rc = sealed_read(b, buf, len, off, err);
        } else if ((rc = ensure_fd(b, err)) == 0) {
            /* A plain file can be shorter than b->size only if something
             * else truncated it: report that rather than invent zeros. */
            int r = pread_all(b->fd, buf, len, off);
            rc = r ? fail_io(b, err, r, "read failed") : (ssize_t)len;
        }
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* -------------------------------------------------------------- writing */

/* Seals n whole blocks from src (block first onward) and appends them. */
static int write_batch(stage_blob *b, const uint8_t *src, uint64_t first, size_t n, ckpt_err *err)
{
    if (b->buf_valid && b->buf_block >= first && b->buf_block < first + n) {
        /* Overwritten whole: whatever the buffer held is superseded. */
        b->buf_valid = 0;
        b->buf_dirty = 0;
    }
    int rc = flush_buf(b, err);
    if (rc == 0)
        rc = ensure_fd(b, err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!map_slot(b, first + i, 1))
            rc = ckpt_fail(err, (first + i) / MAP_PAGE >= MAP_MAX_PAGES ? -EFBIG : -ENOMEM,
                           "staging file %s: cannot map block %" PRIu64, b->name, first + i);
    uint8_t *recs = rc ? NULL : malloc(n * BATCH_STRIDE);
    if (rc == 0 && !recs)
        rc = ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
    if (rc)
        return rc;
    seal_job j = {b, src, recs, first, n, 0};
    seal_parallel(&j);
    uint64_t at;
    rc = append_records(b, recs, n * BATCH_STRIDE, &at, err);
    free(recs);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        map_set(b, first + i, at + i * BATCH_STRIDE, STAGE_BLOCK);
    if (b->log_end > 2 * b->live_bytes + COMPACT_SLACK)
        return compact(b, err);
    return 0;
}

static ssize_t sealed_write(stage_blob *b, const uint8_t *buf, size_t len, uint64_t off,
                            ckpt_err *err)
{
    size_t done = 0;
    while (done < len) {
        uint64_t pos = off + done, block = pos / STAGE_BLOCK;
        uint32_t in = (uint32_t)(pos % STAGE_BLOCK);
        if (in == 0 && len - done >= 2 * STAGE_BLOCK) {
            size_t nb = (len - done) / STAGE_BLOCK;
            if (nb > BATCH_BLOCKS)
                nb = BATCH_BLOCKS;
            int rc = write_batch(b, buf + done, block, nb, err);
            if (rc)
                return done ? (ssize_t)done : rc;
            done += nb * STAGE_BLOCK;
            if (pos + nb * STAGE_BLOCK > b->size)
                b->size = pos + nb * STAGE_BLOCK;
            continue;
        }
        size_t n = STAGE_BLOCK - in;
        if (n > len - done)
            n = len - done;
        int rc = load_buf(b, block, in == 0 && n == STAGE_BLOCK, err);
        if (rc)
            return done ? (ssize_t)done : rc;
        memcpy(b->buf + in, buf + done, n);
        if (in + n > b->buf_len)
            b->buf_len = (uint32_t)(in + n);
        b->buf_dirty = 1;
        done += n;
        if (pos + n > b->size)
            b->size = pos + n;
        /* A write that reaches the end of the block is most likely part
         * of a sequential stream: the block is complete, send it now. */
        if (in + n == STAGE_BLOCK) {
            rc = flush_buf(b, err);
            if (rc)
                return rc;
        }
    }
    return (ssize_t)done;
}

ssize_t stage_blob_pwrite(stage_blob *b, const void *buf, size_t len, uint64_t off,
                          ckpt_err *err)
{
    if (off > STAGE_MAX_SIZE || len > STAGE_MAX_SIZE - off)
        return ckpt_fail(err, -EFBIG, "staging file %s: write beyond the largest file size", b->name);
    pthread_mutex_lock(&b->lock);
    ssize_t rc;
    if (b->key) {
        rc = sealed_write(b, buf, len, off, err);
    } else if ((rc = ensure_fd(b, err)) == 0) {
        int r = pwrite_all(b->fd, buf, len, off);
        if (r) {
            rc = fail_io(b, err, r, "write failed");
        } else {
            rc = (ssize_t)len;
            if (off + len > b->size)
                b->size = off + len;
        }
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

static int sealed_truncate(stage_blob *b, uint64_t size, ckpt_err *err)
{
    int rc = flush_buf(b, err);
    if (rc)
        return rc;
    if (size < b->size && size % STAGE_BLOCK) {
        /* The block the new end falls in keeps its head; its tail must
         * read as zeros if the file grows again, so rewrite it now. */
        uint64_t block = size / STAGE_BLOCK;
        uint32_t keep = (uint32_t)(size % STAGE_BLOCK);
        uint64_t e = map_get(b, block);
        if (e && MAP_LEN(e) > keep) {
            rc = load_buf(b, block, 0, err);
            if (rc)
                return rc;
            memset(b->buf + keep, 0, STAGE_BLOCK - keep);
            b->buf_len = keep;
            b->buf_dirty = 1;
            rc = flush_buf(b, err);
            if (rc)
                return rc;
        }
    }
    uint8_t le[8];
    uint64_t at;
    put_u64(le, size);
    rc = append_record(b, REC_SIZE, 0, le, 8, &at, err);
    if (rc)
        return rc;
    b->size = size;
    map_drop_from(b, blocks_for(size));
    if (b->buf_valid && b->buf_block >= blocks_for(size))
        b->buf_valid = 0;
    return 0;
}

int stage_blob_truncate(stage_blob *b, uint64_t size, ckpt_err *err)
{
    if (size > STAGE_MAX_SIZE)
        return ckpt_fail(err, -EFBIG, "staging file %s: size too large", b->name);
    pthread_mutex_lock(&b->lock);
    int rc;
    if (b->key) {
        rc = sealed_truncate(b, size, err);
    } else if ((rc = ensure_fd(b, err)) == 0) {
        if (ftruncate(b->fd, (off_t)size) != 0)
            rc = fail_io(b, err, -errno, "truncate failed");
        else
            b->size = size;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int stage_blob_sync(stage_blob *b, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    int rc = b->key ? flush_buf(b, err) : 0;
    if (rc == 0)
        rc = ensure_fd(b, err);
    if (rc == 0 && fdatasync(b->fd) != 0)
        rc = fail_io(b, err, -errno, "fsync failed");
    if (rc == 0 && b->need_dir_sync && !b->unlinked) {
        if (fsync(b->dirfd) != 0)
            rc = fail_io(b, err, -errno, "fsync of its directory failed");
        else
            b->need_dir_sync = 0;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int stage_blob_park(stage_blob *b, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    int rc = b->key ? flush_buf(b, err) : 0;
    /* An unlinked blob lives only through its descriptor. */
    if (rc == 0 && b->fd >= 0 && !b->unlinked) {
        close(b->fd);
        b->fd = -1;
    }
    if (rc == 0)
        drop_bufs(b);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int stage_blob_unlink(stage_blob *b, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    int rc = ensure_fd(b, err);
    if (rc == 0 && !b->unlinked) {
        if (unlinkat(b->dirfd, b->name, 0) != 0 && errno != ENOENT)
            rc = fail_io(b, err, -errno, "cannot remove");
        else
            b->unlinked = 1;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}
