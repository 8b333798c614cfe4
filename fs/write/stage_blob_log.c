/* The sealed (encrypted) form of a staging file is a log of records:
 * each block written is sealed as a new record appended at the end, a map
 * from block to newest record finds it again, and compaction rewrites the
 * log once dead records outweigh live ones. Whole blocks of big writes are
 * sealed in parallel. */
#include "stage_blob_internal.h"

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

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/fslog.h"

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
int blob_append_records(stage_blob *b, const uint8_t *recs, size_t n, uint64_t *at, ckpt_err *err)
{
    if (b->log_end > MAP_MAX_OFF)
        return ckpt_fail(err, -EFBIG, "staging file %s: log too large", b->name);
    int rc = blob_pwrite_all(b->fd, recs, n, b->log_end);
    if (rc) {
        if (ftruncate(b->fd, (off_t)b->log_end) != 0) {
            /* The partial record stays past log_end; replay cuts it. */
        }
        return blob_fail_io(b, err, rc, "write failed");
    }
    *at = b->log_end;
    b->log_end += n;
    return 0;
}

int blob_append_record(stage_blob *b, int type, uint64_t block, const uint8_t *plain, uint32_t plen,
                       uint64_t *at, ckpt_err *err)
{
    int rc = blob_ensure_fd(b, err);
    if (rc)
        return rc;
    seal_record(b, b->rec, type, block, plain, plen);
    return blob_append_records(b, b->rec, REC_OVERHEAD + plen, at, err);
}

int blob_open_record(const stage_blob *b, const uint8_t *r, int type, uint64_t block, uint32_t plen,
                     uint8_t *out)
{
    uint8_t ad[REC_AD], want[REC_HEADER];
    make_header(want, b, type, block, plen);
    make_ad(b, want, ad);
    if (memcmp(r, want, REC_HEADER) != 0 ||
        stage_unseal(b->key, ad, sizeof ad, r + REC_HEADER + REC_NONCE, plen, r + REC_HEADER,
                     out) != 0)
        return -EIO;
    return 0;
}

/* Reads and opens the record at off into out (plen bytes). */
int blob_load_record(stage_blob *b, uint64_t off, int type, uint64_t block, uint32_t plen,
                     uint8_t *out, ckpt_err *err)
{
    int rc = blob_ensure_fd(b, err);
    if (rc)
        return rc;
    rc = blob_pread_all(b->fd, b->rec, REC_OVERHEAD + plen, off);
    if (rc)
        return blob_fail_io(b, err, rc, "read failed");
    if (blob_open_record(b, b->rec, type, block, plen, out) != 0)
        return ckpt_fail(err, -EIO,
                         "staging file %s: block %" PRIu64 " fails authentication (damaged)",
                         b->name, block);
    return 0;
}

int blob_fetch_record(stage_blob *b, uint64_t off, uint64_t block, uint32_t plen, uint8_t *out,
                      fetched_rec *f, ckpt_err *err)
{
    int rc = blob_ensure_fd(b, err);
    if (rc)
        return rc;
    rc = blob_pread_all(b->fd, f->head, sizeof f->head, off);
    if (rc == 0)
        rc = blob_pread_all(b->fd, out, plen, off + sizeof f->head);
    if (rc == 0)
        rc = blob_pread_all(b->fd, f->tag, sizeof f->tag, off + sizeof f->head + plen);
    if (rc)
        return blob_fail_io(b, err, rc, "read failed");
    f->out = out;
    f->block = block;
    f->plen = plen;
    return 0;
}

int blob_open_fetched(const stage_blob *b, fetched_rec *f, ckpt_err *err)
{
    uint8_t ad[REC_AD], want[REC_HEADER];
    make_header(want, b, REC_DATA, f->block, f->plen);
    make_ad(b, want, ad);
    if (memcmp(f->head, want, REC_HEADER) != 0 ||
        stage_unseal_detached(b->key, ad, sizeof ad, f->out, f->plen, f->tag, f->head + REC_HEADER,
                              f->out) != 0)
        return ckpt_fail(err, -EIO,
                         "staging file %s: block %" PRIu64 " fails authentication (damaged)",
                         b->name, f->block);
    return 0;
}

/* The map is two-level, pages allocated as blocks are touched, so a sparse
 * file costs memory for what it holds, not for how far it reaches. */
uint64_t *blob_map_slot(stage_blob *b, uint64_t block, int create)
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

uint64_t blob_map_get(stage_blob *b, uint64_t block)
{
    uint64_t *e = blob_map_slot(b, block, 0);
    return e ? *e : 0;
}

/* Records that block's newest record is at off; -ENOMEM or -EFBIG. */
int blob_map_set(stage_blob *b, uint64_t block, uint64_t off, uint32_t plen)
{
    uint64_t *e = blob_map_slot(b, block, 1);
    if (!e)
        return block / MAP_PAGE >= MAP_MAX_PAGES ? -EFBIG : -ENOMEM;
    if (*e)
        b->live_bytes -= REC_OVERHEAD + MAP_LEN(*e);
    *e = ((off + 1) << 16) | (plen - 1);
    b->live_bytes += REC_OVERHEAD + plen;
    return 0;
}

/* Forgets the records of every block at or after first. */
void blob_map_drop_from(stage_blob *b, uint64_t first)
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

uint64_t blob_blocks_for(uint64_t size)
{
    return size / STAGE_BLOCK + (size % STAGE_BLOCK != 0);
}

/* ------------------------------------------------------------ compaction */

/* Copies the live records into a new log and renames it over the old. */
int blob_compact(stage_blob *b, ckpt_err *err)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%s.compact", b->name);
    int fd = openat(b->dirfd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return blob_fail_io(b, err, -errno, "cannot create compacted log");
    int rc = 0;
    uint64_t pos = 0;
    /* Records do not depend on where they sit, so they move verbatim. */
    for (size_t p = 0; rc == 0 && p < b->n_pages; p++) {
        for (size_t i = 0; rc == 0 && b->pages[p] && i < MAP_PAGE; i++) {
            uint64_t e = b->pages[p][i];
            if (!e)
                continue;
            size_t n = REC_OVERHEAD + MAP_LEN(e);
            rc = blob_pread_all(b->fd, b->rec, n, MAP_OFF(e));
            if (rc == 0)
                rc = blob_pwrite_all(fd, b->rec, n, pos);
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
        rc = blob_append_record(b, REC_SIZE, 0, size_le, 8, &size_at, &e2);
        if (rc == 0 && fdatasync(fd) != 0)
            rc = -errno;
    }
    b->fd = old_fd;
    if (rc == 0 && renameat(b->dirfd, tmp, b->dirfd, b->name) != 0)
        rc = -errno;
    if (rc) {
        b->log_end = old_end;
        unlinkat(b->dirfd, tmp, 0);
        close(fd);
        return blob_fail_io(b, err, rc, "compacting its log failed");
    }
    /* Renamed: the old log is unlinked, so the new one is the blob's from
     * here on, whatever the directory's sync says (going on with the old
     * one would lose all that is written next at the first reopen). */
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
    if (fsync(b->dirfd) != 0) {
        /* Until a sync of the directory works, a crash may leave the old
         * log under the name (whole, without what comes next): the next
         * stage_blob_sync syncs it again rather than promise anything. */
        b->need_dir_sync = 1;
        return blob_fail_io(b, err, -errno, "sync of its directory after compacting its log");
    }
    return 0;
}

void blob_maybe_compact(stage_blob *b)
{
    if (b->unlinked || b->log_end <= 2 * b->live_bytes + COMPACT_SLACK ||
        b->log_end < b->compact_retry)
        return;
    ckpt_err err = {0};
    if (blob_compact(b, &err) != 0) {
        b->compact_retry = b->log_end + COMPACT_SLACK;
        fslog_warn("%s (nothing is lost; it is tried again later)", err.msg);
    } else {
        b->compact_retry = 0;
    }
}

/* ---------------------------------------------------- parallel sealing */

/* Whole blocks of a big write are sealed on every core at once: sealing
 * is most of the cost of writing into an encrypted checkpoint, and the
 * writing process (cp) waits for each write. One fork-join job at a time,
 * shared by all blobs; the threads start on first use (after the daemon
 * has forked) and live as long as the process. */
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
    pthread_setname_np(pthread_self(), "ckptfs-seal");
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

void blob_seal_parallel(seal_job *j)
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
