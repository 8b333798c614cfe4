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

void stage_blob_name(uint64_t id, char out[24])
{
    snprintf(out, 24, "%016" PRIx64, id);
}

uint64_t stage_blob_id(const stage_blob *b)
{
    return b->id;
}

int blob_fail_io(stage_blob *b, ckpt_err *err, int code, const char *what)
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

int blob_ensure_fd(stage_blob *b, ckpt_err *err)
{
    if (b->key && ensure_bufs(b, err) != 0)
        return -ENOMEM;
    if (b->fd >= 0)
        return 0;
    b->fd = openat(b->dirfd, b->name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (b->fd < 0)
        return blob_fail_io(b, err, -errno, "cannot reopen");
    return 0;
}

int blob_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    ssize_t w = ckpt_pwrite_full(fd, buf, len, off);
    return w < 0 ? (int)w : 0;
}

/* 0, or -EIO at end of file, or -errno. */
int blob_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
    ssize_t r = ckpt_pread_full(fd, buf, len, off);
    return r < 0 ? (int)r : (size_t)r == len ? 0 : -EIO;
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
    if (!blob_map_slot(b, b->buf_block, 1))
        return ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
    int rc = blob_append_record(b, REC_DATA, b->buf_block, b->buf, b->buf_len, &at, err);
    if (rc)
        return rc;
    blob_map_set(b, b->buf_block, at, b->buf_len);
    b->buf_dirty = 0;
    blob_maybe_compact(b);
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
    uint64_t e = blob_map_get(b, block);
    uint32_t len = 0;
    if (e && !whole_overwrite) {
        len = MAP_LEN(e);
        rc = blob_load_record(b, MAP_OFF(e), REC_DATA, block, len, b->buf, err);
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
 * has checked the key), so the log is cut there. A read that fails, or a
 * map that cannot grow, says nothing of the log: the open fails and the
 * log is left whole (cutting it would destroy synced records for good). */
static int replay(stage_blob *b, ckpt_err *err)
{
    struct stat st;
    if (fstat(b->fd, &st) != 0)
        return blob_fail_io(b, err, -errno, "stat failed");
    uint64_t file_size = (uint64_t)st.st_size, off = 0;
    uint8_t *plain = b->buf;
    for (;;) {
        uint8_t h[REC_HEADER];
        if (off + REC_OVERHEAD > file_size)
            break;
        int rc = blob_pread_all(b->fd, h, REC_HEADER, off);
        if (rc)
            return blob_fail_io(b, err, rc, "read failed");
        int type = h[4];
        uint64_t block = get_u64(h + 8);
        uint32_t plen = get_u32(h + 16);
        int sane =
            get_u32(h) == REC_MAGIC && ((type == REC_DATA && plen >= 1 && plen <= STAGE_BLOCK &&
                                         block / MAP_PAGE < MAP_MAX_PAGES) ||
                                        (type == REC_SIZE && plen == 8));
        if (!sane || off + REC_OVERHEAD + plen > file_size)
            break;
        rc = blob_pread_all(b->fd, b->rec, REC_OVERHEAD + plen, off);
        if (rc)
            return blob_fail_io(b, err, rc, "read failed");
        if (blob_open_record(b, b->rec, type, block, plen, plain) != 0)
            break;
        if (type == REC_DATA) {
            if (blob_map_set(b, block, off, plen) != 0)
                return ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
            if (block * STAGE_BLOCK + plen > b->size)
                b->size = block * STAGE_BLOCK + plen;
        } else {
            b->size = get_u64(plain);
            blob_map_drop_from(b, blob_blocks_for(b->size));
        }
        off += REC_OVERHEAD + plen;
    }
    b->log_end = off;
    if (off < file_size && ftruncate(b->fd, (off_t)off) != 0)
        return blob_fail_io(b, err, -errno, "cannot cut the damaged tail of the log");
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
            rc = blob_fail_io(b, err, -errno, create ? "cannot create" : "cannot open");
    }
    b->need_dir_sync = create;
    if (rc == 0 && !create && key) {
        rc = replay(b, err);
    } else if (rc == 0 && !create) {
        struct stat st;
        if (fstat(b->fd, &st) != 0)
            rc = blob_fail_io(b, err, -errno, "stat failed");
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

/* With the lock held. Whole stored blocks are only fetched into buf, with
 * their records in fr[*n_fr] for the caller to open once it has let go of
 * the lock (fr NULL: opened here). */
static ssize_t sealed_read(stage_blob *b, uint8_t *buf, size_t len, uint64_t off, fetched_rec *fr,
                           size_t *n_fr, ckpt_err *err)
{
    size_t done = 0;
    while (done < len) {
        uint64_t pos = off + done, block = pos / STAGE_BLOCK;
        uint32_t in = (uint32_t)(pos % STAGE_BLOCK);
        size_t n = STAGE_BLOCK - in;
        if (n > len - done)
            n = len - done;
        uint64_t e = blob_map_get(b, block);
        if (b->buf_valid && b->buf_block == block) {
            memcpy(buf + done, b->buf + in, n);
        } else if (!e) {
            memset(buf + done, 0, n);
        } else if (in == 0 && n >= MAP_LEN(e)) {
            /* The whole stored block is wanted: open it in place. */
            uint32_t plen = MAP_LEN(e);
            int rc =
                fr ? blob_fetch_record(b, MAP_OFF(e), block, plen, buf + done, &fr[(*n_fr)++], err)
                   : blob_load_record(b, MAP_OFF(e), REC_DATA, block, plen, buf + done, err);
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
    /* Room for every whole block of the read (NULL: opened under the lock). */
    fetched_rec *fr = b->key ? malloc((len / STAGE_BLOCK + 2) * sizeof *fr) : NULL;
    size_t n_fr = 0;
    pthread_mutex_lock(&b->lock);
    ssize_t rc = 0;
    if (off >= b->size) {
        rc = 0;
    } else {
        if (len > b->size - off)
            len = (size_t)(b->size - off);
        if (b->key) {
            rc = sealed_read(b, buf, len, off, fr, &n_fr, err);
        } else if ((rc = blob_ensure_fd(b, err)) == 0) {
            /* A plain file can be shorter than b->size only if something
             * else truncated it: report that rather than invent zeros. */
            int r = blob_pread_all(b->fd, buf, len, off);
            rc = r ? blob_fail_io(b, err, r, "read failed") : (ssize_t)len;
        }
    }
    pthread_mutex_unlock(&b->lock);
    /* The records' bytes are the caller's now: a write to the blob meanwhile
     * appends new records, and never changes these. */
    for (size_t i = 0; i < n_fr && rc >= 0; i++)
        if (blob_open_fetched(b, &fr[i], err) < 0)
            rc = -EIO;
    free(fr);
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
        rc = blob_ensure_fd(b, err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!blob_map_slot(b, first + i, 1))
            rc = ckpt_fail(err, (first + i) / MAP_PAGE >= MAP_MAX_PAGES ? -EFBIG : -ENOMEM,
                           "staging file %s: cannot map block %" PRIu64, b->name, first + i);
    uint8_t *recs = rc ? NULL : malloc(n * BATCH_STRIDE);
    if (rc == 0 && !recs)
        rc = ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
    if (rc)
        return rc;
    seal_job j = {b, src, recs, first, n, 0};
    blob_seal_parallel(&j);
    uint64_t at;
    rc = blob_append_records(b, recs, n * BATCH_STRIDE, &at, err);
    free(recs);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        blob_map_set(b, first + i, at + i * BATCH_STRIDE, STAGE_BLOCK);
    blob_maybe_compact(b);
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

/* With the lock held: a write refused for the error of an earlier one. */
static ssize_t refuse_late(stage_blob *b, ckpt_err *err)
{
    b->late_refuse = 0;
    return ckpt_fail(err, b->late_err, "an earlier write failed: %s", b->late_msg);
}

/* With the lock held: the write answered before it failed with rc. */
static void keep_late(stage_blob *b, int rc, const ckpt_err *err)
{
    if (b->late_err)
        return; /* the first one is the one to report */
    b->late_err = rc;
    b->late_refuse = 1;
    snprintf(b->late_msg, sizeof b->late_msg, "%s", err->msg[0] ? err->msg : strerror(-rc));
}

/* With the lock held: the kept error, taken. */
static int take_late(stage_blob *b, ckpt_err *err)
{
    int rc = b->late_err;
    if (rc)
        ckpt_fail(err, rc, "an earlier write failed: %s", b->late_msg);
    b->late_err = b->late_refuse = 0;
    return rc;
}

static void answer(stage_ack *ack, size_t len)
{
    if (ack) {
        ack->given = 1;
        ack->fn(ack->arg, len);
    }
}

/* Can a plain blob's file grow to end bytes? (The lock held, the
 * descriptor open.) The staging file system's llseek bounds offsets by
 * the largest file it allows, the bound its writes obey (ext4 with 4 KiB
 * blocks: 16 TiB less 4 KiB, where STAGE_MAX_SIZE is 256 TiB; xfs, btrfs,
 * tmpfs: 8 EiB), so asking it before the writer is answered refuses a
 * write past it with EFBIG, as a local disk does, where it was answered,
 * then failed and failed the checkpoint. The next power of two is asked
 * first, which then holds for every smaller end: a file written from
 * start to end asks a few dozen times (an lseek takes 0.13 us, a 256 KiB
 * write 45 us). A file system whose llseek bounds nothing leaves it to
 * the write. */
static int check_fits(stage_blob *b, uint64_t end, ckpt_err *err)
{
    if (b->key || end <= b->fits)
        return 0;
    uint64_t pow2 = 1;
    while (pow2 < end) /* end <= STAGE_MAX_SIZE (check_range) */
        pow2 <<= 1;
    if (lseek(b->fd, (off_t)pow2, SEEK_SET) >= 0) {
        b->fits = pow2;
        return 0;
    }
    if (lseek(b->fd, (off_t)end, SEEK_SET) >= 0) {
        b->fits = end;
        return 0;
    }
    if (errno != EINVAL)
        return 0;
    return ckpt_fail(err, -EFBIG,
                     "staging file %s: %" PRIu64 " bytes are more than its file system allows in "
                     "a file",
                     b->name, end);
}

/* With the lock held: answers the writer (ack), then writes. */
static ssize_t locked_pwrite(stage_blob *b, const void *buf, size_t len, uint64_t off,
                             stage_ack *ack, ckpt_err *err)
{
    if (b->late_refuse)
        return refuse_late(b, err);
    ssize_t rc = blob_ensure_fd(b, err);
    if (rc == 0)
        rc = check_fits(b, off + len, err);
    if (rc)
        return rc;
    answer(ack, len);
    if (b->key) {
        rc = sealed_write(b, buf, len, off, err);
        /* Cut short: the writer was told all of it was written. */
        if (ack && rc >= 0 && (size_t)rc < len)
            rc = err->code < 0 ? err->code : -EIO;
    } else {
        int r = blob_pwrite_all(b->fd, buf, len, off);
        if (r) {
            rc = blob_fail_io(b, err, r, "write failed");
        } else {
            rc = (ssize_t)len;
            if (off + len > b->size)
                b->size = off + len;
        }
    }
    if (rc < 0 && ack)
        keep_late(b, (int)rc, err);
    return rc;
}

static int check_range(stage_blob *b, size_t len, uint64_t off, ckpt_err *err)
{
    if (off > STAGE_MAX_SIZE || len > STAGE_MAX_SIZE - off)
        return ckpt_fail(err, -EFBIG, "staging file %s: write beyond the largest file size",
                         b->name);
    return 0;
}

ssize_t stage_blob_pwrite_acked(stage_blob *b, const void *buf, size_t len, uint64_t off,
                                stage_ack *ack, ckpt_err *err)
{
    int rc = check_range(b, len, off, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&b->lock);
    ssize_t n = locked_pwrite(b, buf, len, off, ack, err);
    pthread_mutex_unlock(&b->lock);
    return n;
}

ssize_t stage_blob_pwrite(stage_blob *b, const void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    return stage_blob_pwrite_acked(b, buf, len, off, NULL, err);
}

int stage_blob_take_error(stage_blob *b, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    int rc = take_late(b, err);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* Exactly len bytes of fd into buf; -EIO if fd ends first. */
static int read_fd_all(int fd, uint8_t *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = read(fd, buf + done, len - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        done += (size_t)r;
    }
    return 0;
}

/* splice() moves the pages of a pipe into the page cache of the staging
 * file with one copy, where read() then pwrite() would make two; it needs
 * both ends to support it, so -EINVAL says to copy instead. */
static int splice_all(int from, int to, size_t len, uint64_t off)
{
    loff_t at = (loff_t)off;
    size_t done = 0;
    while (done < len) {
        ssize_t r = splice(from, NULL, to, &at, len - done, SPLICE_F_MOVE);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 || (done && errno == EINVAL) ? -EIO : -errno;
        done += (size_t)r;
    }
    return 0;
}

/* The bytes in fd copied into memory, for the writes that cannot splice. */
static uint8_t *take_pipe(stage_blob *b, int fd, size_t len, ckpt_err *err)
{
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        ckpt_fail(err, -ENOMEM, "staging file %s: out of memory", b->name);
        return NULL;
    }
    int r = read_fd_all(fd, buf, len);
    if (r) {
        ckpt_fail(err, r, "staging file %s: cannot read the data to write: %s", b->name,
                  strerror(-r));
        free(buf);
        return NULL;
    }
    return buf;
}

ssize_t stage_blob_write_fd(stage_blob *b, int fd, size_t len, uint64_t off, stage_ack *ack,
                            ckpt_err *err)
{
    int rc0 = check_range(b, len, off, err);
    if (rc0)
        return rc0;
    uint8_t *buf = NULL;
    /* Sealed blobs encrypt in memory. */
    if (b->key && !(buf = take_pipe(b, fd, len, err)))
        return err->code;
    pthread_mutex_lock(&b->lock);
    ssize_t rc;
    if (buf || b->late_refuse) {
        rc = locked_pwrite(b, buf, len, off, ack, err);
    } else if ((rc = blob_ensure_fd(b, err)) == 0 && (rc = check_fits(b, off + len, err)) == 0) {
        answer(ack, len);
        int r = splice_all(fd, b->fd, len, off);
        /* A file system without splice took nothing from fd: copy. */
        if (r == -EINVAL && (buf = take_pipe(b, fd, len, err)) != NULL)
            r = blob_pwrite_all(b->fd, buf, len, off);
        else if (r == -EINVAL)
            r = err->code;
        if (r == 0) {
            rc = (ssize_t)len;
            if (off + len > b->size)
                b->size = off + len;
        } else {
            rc = blob_fail_io(b, err, r, "write failed");
            if (ack)
                keep_late(b, r, err);
        }
    }
    pthread_mutex_unlock(&b->lock);
    free(buf);
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
        uint64_t e = blob_map_get(b, block);
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
    rc = blob_append_record(b, REC_SIZE, 0, le, 8, &at, err);
    if (rc)
        return rc;
    b->size = size;
    blob_map_drop_from(b, blob_blocks_for(size));
    if (b->buf_valid && b->buf_block >= blob_blocks_for(size))
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
    } else if ((rc = blob_ensure_fd(b, err)) == 0) {
        if (ftruncate(b->fd, (off_t)size) != 0)
            rc = blob_fail_io(b, err, -errno, "truncate failed");
        else
            b->size = size;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int stage_blob_sync(stage_blob *b, ckpt_err *err)
{
    pthread_mutex_lock(&b->lock);
    int rc = take_late(b, err);
    if (rc == 0 && b->key)
        rc = flush_buf(b, err);
    if (rc == 0)
        rc = blob_ensure_fd(b, err);
    if (rc == 0 && fdatasync(b->fd) != 0)
        rc = blob_fail_io(b, err, -errno, "fsync failed");
    if (rc == 0 && b->need_dir_sync && !b->unlinked) {
        if (fsync(b->dirfd) != 0)
            rc = blob_fail_io(b, err, -errno, "fsync of its directory failed");
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
    int rc = blob_ensure_fd(b, err);
    if (rc == 0 && !b->unlinked) {
        if (unlinkat(b->dirfd, b->name, 0) != 0 && errno != ENOENT)
            rc = blob_fail_io(b, err, -errno, "cannot remove");
        else
            b->unlinked = 1;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}
