/* Staged file contents (fs/write/stage_blob.c), plain and sealed: random writes
 * and truncates against an in-memory model, reopening after sync, crash
 * leftovers (a torn tail, a torn rewrite), no plaintext on disk,
 * compaction, sparse files and unlinked-but-open blobs, writes answered
 * before they are written (stage_ack), a disk that fails a read (pread is
 * interposed below, passing through unless a test arms it) and the
 * libraries that seal. */
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "common.h"

#include "write/stage_blob_internal.h"
#include "write/stage_crypt.h"

/* Armed: the next read whose range covers fail_at fails with EIO, once. */
static long long fail_at = -1;

ssize_t pread64(int fd, void *buf, size_t len, off_t off);
ssize_t pread64(int fd, void *buf, size_t len, off_t off)
{
    long long at = __atomic_load_n(&fail_at, __ATOMIC_RELAXED);
    if (at >= off && at < (long long)off + (long long)len &&
        __atomic_compare_exchange_n(&fail_at, &at, -1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        errno = EIO;
        return -1;
    }
    return syscall(SYS_pread64, fd, buf, len, off);
}

static char *dir;
static int dirfd_;
/* Sealed tests run with the default cipher (AES-256-GCM where the CPU has
 * it); sealed_xchacha_* cover the other. */
static stage_key *key, *xkey;

static void setup(void)
{
    dir = tu_mkdtemp();
    dirfd_ = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(dirfd_, 0);
    cr_assert_geq(sodium_init(), 0);
    key = stage_key_new(stage_cipher_default());
    xkey = stage_key_new(STAGE_CIPHER_XCHACHA);
    cr_assert(key && xkey);
    memset(key->bytes, 0x5a, STAGE_KEY_BYTES);
    memset(xkey->bytes, 0x5b, STAGE_KEY_BYTES);
    cr_assert_eq(stage_key_ready(key), 0);
    cr_assert_eq(stage_key_ready(xkey), 0);
}

static void teardown(void)
{
    stage_key_free(key);
    stage_key_free(xkey);
    close(dirfd_);
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(stage_blob, .init = setup, .fini = teardown);

static stage_blob *open_blob(uint64_t id, const stage_key *k, int create)
{
    stage_blob *b = NULL;
    ckpt_err err = {0};
    int rc = stage_blob_open(dirfd_, id, k, create, &b, &err);
    cr_assert_eq(rc, 0, "open: %s", err.msg);
    return b;
}

static void expect_contents(stage_blob *b, const uint8_t *want, uint64_t size)
{
    cr_assert_eq(stage_blob_size(b), size, "size %llu, want %llu",
                 (unsigned long long)stage_blob_size(b), (unsigned long long)size);
    uint8_t *got = malloc(size + 100);
    ckpt_err err = {0};
    ssize_t n = stage_blob_pread(b, got, size + 100, 0, &err);
    cr_assert_eq(n, (ssize_t)size, "pread gave %zd: %s", n, err.msg);
    for (uint64_t i = 0; i < size; i++)
        if (got[i] != want[i])
            cr_assert_fail("byte %llu differs: %u, want %u", (unsigned long long)i, got[i],
                           want[i]);
    free(got);
}

/* Random writes, overwrites, appends and truncates, the same applied to a
 * buffer; reads at random places compared as we go. */
static void random_ops(const stage_key *k, uint32_t seed, int reopen_each_round)
{
    const uint64_t cap = 3 * STAGE_BLOCK + 12345;
    uint8_t *model = calloc(1, cap), *tmp = malloc(cap);
    uint64_t size = 0;
    stage_blob *b = open_blob(7, k, 1);
    srand(seed);
    ckpt_err err = {0};
    for (int round = 0; round < 6; round++) {
        for (int op = 0; op < 60; op++) {
            int what = rand() % 10;
            uint64_t off = (uint64_t)rand() % cap;
            size_t len = (size_t)(rand() % (what < 2 ? 200 : 90000));
            if (off + len > cap)
                len = (size_t)(cap - off);
            if (what < 7) {
                tu_fill_pattern(tmp, len, (uint32_t)rand());
                cr_assert_eq(stage_blob_pwrite(b, tmp, len, off, &err), (ssize_t)len, "%s",
                             err.msg);
                memcpy(model + off, tmp, len);
                if (off + len > size)
                    size = off + len;
            } else if (what < 9) {
                uint64_t ns = (uint64_t)rand() % cap;
                cr_assert_eq(stage_blob_truncate(b, ns, &err), 0, "%s", err.msg);
                if (ns < size)
                    memset(model + ns, 0, size - ns);
                size = ns;
            } else {
                ssize_t n = stage_blob_pread(b, tmp, len, off, &err);
                size_t want = off >= size ? 0 : (size - off < len ? (size_t)(size - off) : len);
                cr_assert_eq(n, (ssize_t)want, "%s", err.msg);
                cr_assert_eq(memcmp(tmp, model + off, want), 0, "read at %llu differs",
                             (unsigned long long)off);
            }
        }
        expect_contents(b, model, size);
        if (reopen_each_round) {
            cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
            stage_blob_free(b);
            b = open_blob(7, k, 0);
            expect_contents(b, model, size);
        }
    }
    stage_blob_free(b);
    free(model);
    free(tmp);
}

Test(stage_blob, plain_random_ops)
{
    random_ops(NULL, 1, 0);
}
Test(stage_blob, plain_random_ops_reopened)
{
    random_ops(NULL, 2, 1);
}
Test(stage_blob, sealed_random_ops)
{
    random_ops(key, 3, 0);
}
Test(stage_blob, sealed_random_ops_reopened)
{
    random_ops(key, 4, 1);
}
Test(stage_blob, sealed_random_ops_other_seed)
{
    random_ops(key, 5, 1);
}
Test(stage_blob, sealed_xchacha_random_ops_reopened)
{
    random_ops(xkey, 6, 1);
}

/* Big aligned writes take the parallel path; mixed with small ones. */
static void big_writes(const stage_key *k)
{
    size_t len = 40 * STAGE_BLOCK + 333;
    uint8_t *data = malloc(len), *back = malloc(len);
    tu_fill_pattern(data, len, 31);
    ckpt_err err = {0};
    stage_blob *b = open_blob(40, k, 1);
    cr_assert_eq(stage_blob_pwrite(b, data, 100, 0, &err), 100);          /* buffered */
    cr_assert_eq(stage_blob_pwrite(b, data, len, 0, &err), (ssize_t)len); /* batches */
    cr_assert_eq(
        stage_blob_pwrite(b, data + 5 * STAGE_BLOCK, 3 * STAGE_BLOCK, 5 * STAGE_BLOCK, &err),
        (ssize_t)(3 * STAGE_BLOCK));
    expect_contents(b, data, len);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    stage_blob_free(b);
    b = open_blob(40, k, 0);
    expect_contents(b, data, len);
    stage_blob_free(b);
    free(data);
    free(back);
}

Test(stage_blob, sealed_big_writes)
{
    big_writes(key);
}
Test(stage_blob, sealed_xchacha_big_writes)
{
    big_writes(xkey);
}
Test(stage_blob, plain_big_writes)
{
    big_writes(NULL);
}

Test(stage_blob, sealed_small_sequential_writes_make_one_record_per_block)
{
    stage_blob *b = open_blob(1, key, 1);
    uint8_t piece[1000];
    ckpt_err err = {0};
    uint8_t *model = malloc(400000);
    for (size_t off = 0; off < 400000; off += sizeof piece) {
        tu_fill_pattern(piece, sizeof piece, (uint32_t)off);
        memcpy(model + off, piece, sizeof piece);
        cr_assert_eq(stage_blob_pwrite(b, piece, sizeof piece, off, &err), (ssize_t)sizeof piece);
    }
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    /* 7 blocks (6 full, one partial), each one record. */
    cr_assert_eq(stage_blob_disk_bytes(b), 400000 + 7 * REC_OVERHEAD);
    expect_contents(b, model, 400000);
    stage_blob_free(b);
    b = open_blob(1, key, 0);
    expect_contents(b, model, 400000);
    stage_blob_free(b);
    free(model);
}

/* Scans the blob's file for any 32-byte window of the plaintext. */
static int file_contains_plaintext(uint64_t id, const uint8_t *plain, size_t len)
{
    char name[24];
    stage_blob_name(id, name);
    char *path = tu_join(dir, name);
    size_t n;
    uint8_t *disk = tu_read_file(path, &n);
    free(path);
    int found = 0;
    for (size_t i = 0; i + 32 <= len && !found; i += 4096)
        found = memmem(disk, n, plain + i, 32) != NULL;
    free(disk);
    return found;
}

Test(stage_blob, sealed_leaves_no_plaintext_on_disk)
{
    size_t len = 5 * STAGE_BLOCK + 77;
    uint8_t *data = malloc(len);
    tu_fill_pattern(data, len, 99);
    ckpt_err err = {0};
    stage_blob *b = open_blob(3, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, data, len, 0, &err), (ssize_t)len);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    cr_assert_not(file_contains_plaintext(3, data, len));
    stage_blob_free(b);
    /* The plain one does hold it, which shows the scan works. */
    b = open_blob(4, NULL, 1);
    cr_assert_eq(stage_blob_pwrite(b, data, len, 0, &err), (ssize_t)len);
    cr_assert(file_contains_plaintext(4, data, len));
    stage_blob_free(b);
    free(data);
}

static void chop_file(uint64_t id, uint64_t cut)
{
    char name[24];
    stage_blob_name(id, name);
    cr_assert_eq(ftruncate(openat(dirfd_, name, O_RDWR), (off_t)cut), 0);
}

static uint64_t file_size_of(uint64_t id)
{
    char name[24];
    struct stat st;
    stage_blob_name(id, name);
    cr_assert_eq(fstatat(dirfd_, name, &st, 0), 0);
    return (uint64_t)st.st_size;
}

Test(stage_blob, sealed_torn_rewrite_keeps_synced_block)
{
    uint8_t a[STAGE_BLOCK], c[100];
    tu_fill_pattern(a, sizeof a, 1);
    tu_fill_pattern(c, sizeof c, 2);
    ckpt_err err = {0};
    stage_blob *b = open_blob(9, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, a, sizeof a, 0, &err), (ssize_t)sizeof a);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    uint64_t synced = file_size_of(9);
    /* Rewrite part of the synced block; the record reaches the file... */
    cr_assert_eq(stage_blob_pwrite(b, c, sizeof c, 500, &err), (ssize_t)sizeof c);
    cr_assert_eq(stage_blob_park(b, &err), 0);
    stage_blob_free(b);
    cr_assert_gt(file_size_of(9), synced);
    /* ...but only half of it made it to disk before the crash. */
    chop_file(9, synced + (file_size_of(9) - synced) / 2);
    b = open_blob(9, key, 0);
    expect_contents(b, a, sizeof a);
    cr_assert_eq(file_size_of(9), synced, "the torn tail is cut");
    /* And the blob keeps working after the cut. */
    cr_assert_eq(stage_blob_pwrite(b, c, sizeof c, 500, &err), (ssize_t)sizeof c);
    memcpy(a + 500, c, sizeof c);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    stage_blob_free(b);
    b = open_blob(9, key, 0);
    expect_contents(b, a, sizeof a);
    stage_blob_free(b);
}

Test(stage_blob, sealed_garbage_tail_is_cut)
{
    uint8_t a[3000];
    tu_fill_pattern(a, sizeof a, 5);
    ckpt_err err = {0};
    stage_blob *b = open_blob(10, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, a, sizeof a, 0, &err), (ssize_t)sizeof a);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    stage_blob_free(b);
    uint64_t synced = file_size_of(10);
    char name[24];
    stage_blob_name(10, name);
    int fd = openat(dirfd_, name, O_WRONLY | O_APPEND);
    uint8_t junk[777];
    tu_fill_pattern(junk, sizeof junk, 6);
    put_u32(junk, REC_MAGIC); /* a plausible header, then garbage */
    junk[4] = REC_DATA;
    put_u32(junk + 16, 700);
    cr_assert_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    b = open_blob(10, key, 0);
    expect_contents(b, a, sizeof a);
    cr_assert_eq(file_size_of(10), synced);
    stage_blob_free(b);
}

Test(stage_blob, sealed_record_moved_to_another_blob_fails)
{
    uint8_t a[4000];
    tu_fill_pattern(a, sizeof a, 8);
    ckpt_err err = {0};
    stage_blob *b = open_blob(11, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, a, sizeof a, 0, &err), (ssize_t)sizeof a);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    stage_blob_free(b);
    /* Blob 12 gets blob 11's log: the id in the associated data refuses it. */
    char from[24], to[24];
    stage_blob_name(11, from);
    stage_blob_name(12, to);
    cr_assert_eq(linkat(dirfd_, from, dirfd_, to, 0), 0);
    b = open_blob(12, key, 0);
    cr_assert_eq(stage_blob_size(b), 0);
    stage_blob_free(b);
}

Test(stage_blob, sealed_log_is_compacted)
{
    uint8_t blk[STAGE_BLOCK];
    ckpt_err err = {0};
    stage_blob *b = open_blob(13, key, 1);
    for (int i = 0; i < 400; i++) {
        tu_fill_pattern(blk, sizeof blk, (uint32_t)i);
        cr_assert_eq(stage_blob_pwrite(b, blk, sizeof blk, (uint64_t)(i % 3) * STAGE_BLOCK, &err),
                     (ssize_t)sizeof blk, "%s", err.msg);
    }
    /* 400 block writes, 3 live blocks: without compaction 26 MB. */
    cr_assert_lt(stage_blob_disk_bytes(b), 3 * STAGE_BLOCK + COMPACT_SLACK + 4 * STAGE_BLOCK);
    cr_assert_eq(stage_blob_sync(b, &err), 0);
    uint8_t *want = malloc(3 * STAGE_BLOCK);
    for (int i = 397; i < 400; i++)
        tu_fill_pattern(want + (size_t)(i % 3) * STAGE_BLOCK, STAGE_BLOCK, (uint32_t)i);
    expect_contents(b, want, 3 * STAGE_BLOCK);
    stage_blob_free(b);
    b = open_blob(13, key, 0);
    expect_contents(b, want, 3 * STAGE_BLOCK);
    stage_blob_free(b);
    free(want);
    char name[40];
    stage_blob_name(13, name);
    strcat(name, ".compact");
    struct stat st;
    cr_assert_neq(fstatat(dirfd_, name, &st, 0), 0, "no compaction leftovers");
}

static ino_t ino_of(int fd, const char *name)
{
    struct stat st;
    cr_assert_eq(name ? fstatat(fd, name, &st, 0) : fstat(fd, &st), 0);
    return st.st_ino;
}

/* Rewrites blocks 0-2 of b (named in dirfd_) with patterns seed.. until
 * its log has been compacted (renamed over its name) once, the model
 * following along. Return values are not checked: some tests make
 * compaction fail. */
static void rewrite_until_compacted(stage_blob *b, uint8_t *model, uint32_t seed)
{
    uint8_t blk[STAGE_BLOCK];
    ckpt_err err = {0};
    ino_t first = ino_of(dirfd_, b->name);
    for (int i = 0; i < 1000; i++) {
        tu_fill_pattern(blk, sizeof blk, seed + (uint32_t)i);
        uint64_t off = (uint64_t)(i % 3) * STAGE_BLOCK;
        (void)stage_blob_pwrite(b, blk, sizeof blk, off, &err);
        memcpy(model + off, blk, sizeof blk);
        if (ino_of(dirfd_, b->name) != first)
            return;
    }
    cr_assert_fail("the log was never compacted (%llu bytes)", (unsigned long long)b->log_end);
}

/* Compaction only gives space back: when it cannot be done (here its
 * temporary file cannot be made; on a full disk the copy does not fit)
 * the write that called for it has still succeeded, whole, and says so;
 * the file keeps its size and contents, and the log is tried again later. */
Test(stage_blob, sealed_failed_compaction_fails_no_write)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(17, key, 1);
    char tmp[40];
    stage_blob_name(17, tmp);
    strcat(tmp, ".compact");
    cr_assert_eq(mkdirat(dirfd_, tmp, 0700), 0); /* compaction cannot create it */
    uint8_t *model = calloc(1, 3 * STAGE_BLOCK);
    uint8_t blk[STAGE_BLOCK];
    int failed = 0;
    uint64_t before = 0;
    for (int i = 0; i < 300; i++) {
        tu_fill_pattern(blk, sizeof blk, 100u + (uint32_t)i);
        uint64_t off = (uint64_t)(i % 3) * STAGE_BLOCK;
        failed += stage_blob_pwrite(b, blk, sizeof blk, off, &err) != (ssize_t)sizeof blk;
        memcpy(model + off, blk, sizeof blk);
        before = b->log_end;
    }
    cr_assert_eq(failed, 0, "a write failed for its compaction: %s", err.msg);
    cr_assert_gt(before, 2 * 3 * STAGE_BLOCK + COMPACT_SLACK, "compaction was due");
    /* A big write (sealed as a batch) that calls for compaction: its blocks
     * count in the file's size. */
    uint8_t *big = malloc(1 << 20);
    tu_fill_pattern(big, 1 << 20, 7);
    model = realloc(model, 3 * STAGE_BLOCK + (1 << 20));
    memcpy(model + 3 * STAGE_BLOCK, big, 1 << 20);
    cr_assert_eq(stage_blob_pwrite(b, big, 1 << 20, 3 * STAGE_BLOCK, &err), 1 << 20, "%s", err.msg);
    expect_contents(b, model, 3 * STAGE_BLOCK + (1 << 20));
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    stage_blob_free(b);
    b = open_blob(17, key, 0);
    expect_contents(b, model, 3 * STAGE_BLOCK + (1 << 20));
    /* Once compaction can be done again, it is. */
    cr_assert_eq(unlinkat(dirfd_, tmp, AT_REMOVEDIR), 0);
    rewrite_until_compacted(b, model, 900);
    expect_contents(b, model, 3 * STAGE_BLOCK + (1 << 20));
    stage_blob_free(b);
    free(model);
    free(big);
}

/* A compaction whose rename went through but whose directory sync failed
 * must go on with the new log: the old one is unlinked, and whatever is
 * written into it is gone at the next reopen (park) or crash, fsync
 * or not. The directory is synced again by the next stage_blob_sync. */
Test(stage_blob, sealed_compaction_with_failed_directory_sync_keeps_the_new_log)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(18, key, 1);
    char name[24];
    stage_blob_name(18, name);
    uint8_t *model = calloc(1, 3 * STAGE_BLOCK);
    /* fsync of an O_PATH descriptor fails (EBADF); renameat through it works. */
    int real = b->dirfd, opath = openat(dirfd_, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(opath, 0);
    b->dirfd = opath;
    rewrite_until_compacted(b, model, 300);
    b->dirfd = real;
    /* Closed while idle and opened again by name: the same log. */
    cr_assert_eq(stage_blob_park(b, &err), 0, "%s", err.msg);
    expect_contents(b, model, 3 * STAGE_BLOCK);
    cr_assert_eq(ino_of(b->fd, NULL), ino_of(dirfd_, name));
    /* Written and synced after the compaction: must survive a reopen. */
    uint8_t blk[STAGE_BLOCK];
    for (uint32_t i = 0; i < 3; i++) {
        tu_fill_pattern(blk, sizeof blk, 5000 + i);
        cr_assert_eq(stage_blob_pwrite(b, blk, sizeof blk, i * STAGE_BLOCK, &err),
                     (ssize_t)sizeof blk, "%s", err.msg);
        memcpy(model + i * STAGE_BLOCK, blk, sizeof blk);
    }
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    cr_assert_eq(stage_blob_park(b, &err), 0, "%s", err.msg);
    expect_contents(b, model, 3 * STAGE_BLOCK);
    stage_blob_free(b);
    b = open_blob(18, key, 0);
    expect_contents(b, model, 3 * STAGE_BLOCK);
    stage_blob_free(b);
    close(opath);
    free(model);
}

/* An unlinked blob lives in its descriptor only: compacting its log must
 * not give it a name in the directory again (a file nobody removes). */
Test(stage_blob, sealed_unlinked_blob_is_not_given_its_name_back)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(19, key, 1);
    char name[24];
    stage_blob_name(19, name);
    uint8_t *model = calloc(1, 3 * STAGE_BLOCK);
    cr_assert_eq(stage_blob_pwrite(b, model, 3 * STAGE_BLOCK, 0, &err), 3 * STAGE_BLOCK);
    cr_assert_eq(stage_blob_unlink(b, &err), 0, "%s", err.msg);
    uint8_t blk[STAGE_BLOCK];
    for (int i = 0; i < 300; i++) {
        tu_fill_pattern(blk, sizeof blk, 700u + (uint32_t)i);
        uint64_t off = (uint64_t)(i % 3) * STAGE_BLOCK;
        cr_assert_eq(stage_blob_pwrite(b, blk, sizeof blk, off, &err), (ssize_t)sizeof blk, "%s",
                     err.msg);
        memcpy(model + off, blk, sizeof blk);
    }
    struct stat st;
    cr_assert_neq(fstatat(dirfd_, name, &st, 0), 0, "its name came back");
    expect_contents(b, model, 3 * STAGE_BLOCK);
    stage_blob_free(b);
    DIR *d = fdopendir(dup(dirfd_));
    cr_assert_not_null(d);
    rewinddir(d);
    struct dirent *e;
    while ((e = readdir(d)))
        cr_assert(e->d_name[0] == '.', "left behind: %s", e->d_name);
    closedir(d);
    free(model);
}

static void sparse(const stage_key *k)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(14, k, 1);
    uint64_t far = 1ull << 40;
    cr_assert_eq(stage_blob_pwrite(b, "end", 3, far, &err), 3, "%s", err.msg);
    cr_assert_eq(stage_blob_size(b), far + 3);
    uint8_t buf[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    cr_assert_eq(stage_blob_pread(b, buf, 8, far - 5, &err), 8);
    cr_assert_eq(memcmp(buf, "\0\0\0\0\0end", 8), 0);
    cr_assert_eq(stage_blob_pread(b, buf, 8, 12345678, &err), 8);
    cr_assert_eq(memcmp(buf, "\0\0\0\0\0\0\0\0", 8), 0);
    cr_assert_eq(stage_blob_pwrite(b, "x", 1, STAGE_MAX_SIZE, &err), -EFBIG);
    cr_assert_eq(stage_blob_truncate(b, STAGE_MAX_SIZE + 1, &err), -EFBIG);
    stage_blob_free(b);
}

Test(stage_blob, plain_sparse)
{
    sparse(NULL);
}
Test(stage_blob, sealed_sparse)
{
    sparse(key);
}

static void unlinked_stays_usable(const stage_key *k)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(15, k, 1);
    cr_assert_eq(stage_blob_pwrite(b, "hello", 5, 0, &err), 5);
    cr_assert_eq(stage_blob_park(b, &err), 0);
    cr_assert_eq(stage_blob_unlink(b, &err), 0, "%s", err.msg);
    char name[24];
    struct stat st;
    stage_blob_name(15, name);
    cr_assert_neq(fstatat(dirfd_, name, &st, 0), 0);
    cr_assert_eq(stage_blob_pwrite(b, " world", 6, 5, &err), 6);
    cr_assert_eq(stage_blob_park(b, &err), 0); /* must keep the descriptor */
    expect_contents(b, (const uint8_t *)"hello world", 11);
    stage_blob_free(b);
}

Test(stage_blob, plain_unlinked_stays_usable)
{
    unlinked_stays_usable(NULL);
}
Test(stage_blob, sealed_unlinked_stays_usable)
{
    unlinked_stays_usable(key);
}

Test(stage_blob, park_and_reopen)
{
    ckpt_err err = {0};
    stage_blob *b = open_blob(16, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, "abc", 3, 0, &err), 3);
    cr_assert_eq(stage_blob_park(b, &err), 0);
    cr_assert_eq(b->fd, -1);
    expect_contents(b, (const uint8_t *)"abc", 3);
    stage_blob_free(b);
}

Test(stage_blob, create_refuses_existing_and_open_needs_it)
{
    stage_blob *b = open_blob(17, NULL, 1);
    stage_blob_free(b);
    ckpt_err err = {0};
    cr_assert_eq(stage_blob_open(dirfd_, 17, NULL, 1, &b, &err), -EEXIST);
    tu_assert_contains(err.msg, "0000000000000011");
    cr_assert_eq(stage_blob_open(dirfd_, 18, key, 0, &b, &err), -ENOENT);
    cr_assert_null(b);
}

/* The packer's workers read one staged file at once: whole sealed blocks
 * are opened outside the blob's lock, into each caller's buffer. */
typedef struct reader_arg {
    stage_blob *b;
    const uint8_t *want;
    uint64_t size;
    unsigned seed;
    int bad; /* reads that came back wrong */
} reader_arg;

static void *read_at_random(void *p)
{
    reader_arg *r = p;
    uint8_t *buf = malloc(3 * STAGE_BLOCK);
    ckpt_err err = {0};
    for (int i = 0; i < 200; i++) {
        uint64_t off = (uint64_t)rand_r(&r->seed) % r->size;
        size_t len = (size_t)(rand_r(&r->seed) % (3 * STAGE_BLOCK)) + 1;
        size_t want = r->size - off < len ? (size_t)(r->size - off) : len;
        ssize_t n = stage_blob_pread(r->b, buf, len, off, &err);
        if (n != (ssize_t)want || memcmp(buf, r->want + off, want) != 0)
            r->bad++;
    }
    free(buf);
    return NULL;
}

Test(stage_blob, sealed_reads_from_several_threads_at_once)
{
    const uint64_t size = 40 * STAGE_BLOCK + 999;
    uint8_t *a = malloc(size);
    tu_fill_pattern(a, size, 21);
    ckpt_err err = {0};
    stage_blob *b = open_blob(20, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, a, size, 0, &err), (ssize_t)size, "%s", err.msg);
    pthread_t t[4];
    reader_arg r[4];
    for (unsigned i = 0; i < 4; i++) {
        r[i] = (reader_arg){b, a, size, i + 1, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, read_at_random, &r[i]), 0);
    }
    for (unsigned i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(r[i].bad, 0, "reader %u got %d wrong reads", i, r[i].bad);
    }
    stage_blob_free(b);
    free(a);
}

/* A whole block damaged on disk after the blob was opened (so replay did
 * not see it) fails the read that opens it outside the lock. */
Test(stage_blob, sealed_whole_block_damaged_after_open_fails_the_read)
{
    const uint64_t size = 4 * STAGE_BLOCK;
    uint8_t *a = malloc(size), *got = malloc(size);
    tu_fill_pattern(a, size, 22);
    ckpt_err err = {0};
    stage_blob *b = open_blob(21, key, 1);
    cr_assert_eq(stage_blob_pwrite(b, a, size, 0, &err), (ssize_t)size, "%s", err.msg);
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    cr_assert_eq(stage_blob_pread(b, got, size, 0, &err), (ssize_t)size, "%s", err.msg);
    cr_assert_eq(memcmp(got, a, size), 0);
    char name[24];
    stage_blob_name(21, name);
    int fd = openat(dirfd_, name, O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    /* Inside the third record's ciphertext. */
    uint64_t at = 2 * (REC_OVERHEAD + STAGE_BLOCK) + REC_HEADER + REC_NONCE + 100;
    uint8_t c;
    cr_assert_eq(pread(fd, &c, 1, (off_t)at), 1);
    c ^= 0x40;
    cr_assert_eq(pwrite(fd, &c, 1, (off_t)at), 1);
    close(fd);
    ssize_t n = stage_blob_pread(b, got, size, 0, &err);
    cr_assert_eq(n, -EIO, "read gave %zd", n);
    tu_assert_contains(err.msg, "block 2 fails authentication");
    /* The blocks before it are still readable on their own. */
    cr_assert_eq(stage_blob_pread(b, got, 2 * STAGE_BLOCK, 0, &err), (ssize_t)(2 * STAGE_BLOCK),
                 "%s", err.msg);
    cr_assert_eq(memcmp(got, a, 2 * STAGE_BLOCK), 0);
    stage_blob_free(b);
    free(a);
    free(got);
}

/* What an ack saw: how often it came, for how many bytes, and how big the
 * blob's file was then (nothing of the write may be on disk yet). */
typedef struct ack_seen {
    uint64_t id;
    int calls;
    size_t len;
    off_t disk_size;
} ack_seen;

static void record_ack(void *arg, size_t len)
{
    ack_seen *a = arg;
    char name[24];
    stage_blob_name(a->id, name);
    struct stat st;
    cr_assert_eq(fstatat(dirfd_, name, &st, 0), 0);
    a->calls++;
    a->len = len;
    a->disk_size = st.st_size;
}

/* A write handed over in a pipe (how libfuse passes spliced requests):
 * spliced into a plain blob, read into memory and sealed for a keyed one;
 * either way it is answered once, before any of it reaches the disk, the
 * blob reads back what the pipe held, at the offset given, and the pipe is
 * left empty. */
static void write_from_pipe(const stage_key *k)
{
    enum { LEN = 40000, OFF = 12345 };
    uint8_t *data = malloc(LEN), *want = calloc(1, OFF + LEN);
    for (size_t i = 0; i < LEN; i++)
        data[i] = (uint8_t)(i * 131 + 7);
    memcpy(want + OFF, data, LEN);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(write(p[1], data, LEN), LEN); /* fits the pipe's 64 KiB */
    stage_blob *b = open_blob(11, k, 1);
    ckpt_err err = {0};
    ack_seen seen = {11, 0, 0, -1};
    stage_ack ack = {record_ack, &seen, 0};
    cr_assert_eq(stage_blob_write_fd(b, p[0], LEN, OFF, &ack, &err), LEN, "%s", err.msg);
    cr_assert_eq(seen.calls, 1);
    cr_assert_eq(seen.len, LEN);
    cr_assert_eq(seen.disk_size, 0, "%lld bytes were on disk before the answer",
                 (long long)seen.disk_size);
    expect_contents(b, want, OFF + LEN);
    cr_assert_eq(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    uint8_t left;
    cr_assert_eq(read(p[0], &left, 1), -1, "bytes left in the pipe");
    stage_blob_free(b);
    close(p[0]);
    close(p[1]);
    free(data);
    free(want);
}

Test(stage_blob, write_fd_plain)
{
    write_from_pipe(NULL);
}

Test(stage_blob, write_fd_sealed)
{
    write_from_pipe(key);
}

/* A pipe that ends early is an error, not a short write. */
Test(stage_blob, write_fd_short_pipe)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(write(p[1], "abc", 3), 3);
    close(p[1]);
    stage_blob *b = open_blob(12, NULL, 1);
    ckpt_err err = {0};
    cr_assert_lt(stage_blob_write_fd(b, p[0], 10, 0, NULL, &err), 0);
    stage_blob_free(b);
    close(p[0]);
}

/* The largest size the scratch file system allows a file (s_maxbytes:
 * 16 TiB less 4 KiB on ext4 with 4 KiB blocks), found with ftruncate. */
static uint64_t fs_max_file_size(void)
{
    int fd = openat(dirfd_, "probe", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    unlinkat(dirfd_, "probe", 0);
    uint64_t lo = 0, hi = INT64_MAX;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (ftruncate(fd, (off_t)mid) == 0)
            lo = mid;
        else
            hi = mid - 1;
    }
    close(fd);
    return lo;
}

/* A plain blob cannot grow past what its file system allows, which may be
 * less than STAGE_MAX_SIZE: a write past it is refused with EFBIG before
 * its answer, as a local disk refuses it, and leaves no error to report
 * later (it was answered, then failed). */
Test(stage_blob, plain_write_past_the_file_systems_largest_file)
{
    uint64_t max = fs_max_file_size();
    if (max >= STAGE_MAX_SIZE)
        cr_skip_test("the scratch file system allows files of %llu bytes", (unsigned long long)max);
    stage_blob *b = open_blob(16, NULL, 1);
    ckpt_err err = {0};
    ack_seen seen = {16, 0, 0, -1};
    stage_ack ack = {record_ack, &seen, 0};
    cr_assert_eq(stage_blob_pwrite_acked(b, "x", 1, max, &ack, &err), -EFBIG);
    cr_assert_eq(seen.calls, 0, "refused before its answer");
    tu_assert_contains(err.msg, "staging file");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(write(p[1], "yz", 2), 2);
    cr_assert_eq(stage_blob_write_fd(b, p[0], 2, max - 1, &ack, &err), -EFBIG, "%s", err.msg);
    cr_assert_eq(seen.calls, 0);
    close(p[0]);
    close(p[1]);
    cr_assert_eq(stage_blob_truncate(b, max + 1, &err), -EFBIG);
    cr_assert_eq(stage_blob_take_error(b, &err), 0, "nothing kept for close");
    cr_assert_eq(stage_blob_pwrite_acked(b, "ok", 2, 0, &ack, &err), 2, "%s", err.msg);
    cr_assert_eq(stage_blob_pwrite(b, "!", 1, max - 1, &err), 1, "up to the limit: %s", err.msg);
    cr_assert_eq(stage_blob_size(b), max);
    cr_assert_eq(stage_blob_truncate(b, 2, &err), 0, "%s", err.msg);
    expect_contents(b, (const uint8_t *)"ok", 2);
    stage_blob_free(b);
}

/* A write answered early that then fails (here: past RLIMIT_FSIZE, as a
 * full disk would) keeps its error, as a page cache keeps a writeback
 * error: the next write is refused with it, once and unanswered; close
 * (stage_blob_take_error) and fsync (stage_blob_sync) hear of it once.
 * Unanswered writes fail as before and keep nothing. */
static void failure_after_answer(const stage_key *k)
{
    enum { LIMIT = 256 * 1024, BIG = 1 << 20 };
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {LIMIT, LIMIT};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    uint8_t *data = calloc(1, BIG);
    stage_blob *b = open_blob(13, k, 1);
    ckpt_err err = {0};
    ack_seen seen = {13, 0, 0, -1};
    stage_ack ack = {record_ack, &seen, 0};

    cr_assert_eq(stage_blob_pwrite_acked(b, data, BIG, 0, &ack, &err), -EFBIG, "%s", err.msg);
    cr_assert_eq(seen.calls, 1, "answered before it failed");
    tu_assert_contains(err.msg, "staging file");

    memset(&err, 0, sizeof err);
    cr_assert_eq(stage_blob_pwrite_acked(b, data, 100, 0, &ack, &err), -EFBIG);
    cr_assert_eq(seen.calls, 1, "a refused write is not answered");
    tu_assert_contains(err.msg, "an earlier write failed");
    tu_assert_contains(err.msg, "staging file"); /* the first failure's own words */
    memset(data, 0x11, 100);
    cr_assert_eq(stage_blob_pwrite_acked(b, data, 100, 0, &ack, &err), 100, "refused once only: %s",
                 err.msg);
    cr_assert_eq(seen.calls, 2);

    memset(&err, 0, sizeof err);
    cr_assert_eq(stage_blob_take_error(b, &err), -EFBIG, "close still hears of it");
    tu_assert_contains(err.msg, "an earlier write failed");
    cr_assert_eq(stage_blob_take_error(b, &err), 0, "once");

    cr_assert_eq(stage_blob_pwrite_acked(b, data, BIG, 0, &ack, &err), -EFBIG);
    cr_assert_eq(stage_blob_sync(b, &err), -EFBIG, "fsync hears of it");
    cr_assert_eq(stage_blob_take_error(b, &err), 0, "and takes it");
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);

    /* Without an answer the caller hears of the failure itself. */
    cr_assert_eq(stage_blob_pwrite(b, data, BIG, 0, &err), -EFBIG);
    cr_assert_eq(stage_blob_take_error(b, &err), 0);
    cr_assert_eq(stage_blob_pwrite(b, data, 100, 0, &err), 100, "%s", err.msg);
    stage_blob_free(b);
    free(data);
}

Test(stage_blob, plain_failure_after_answer_is_kept)
{
    failure_after_answer(NULL);
}

Test(stage_blob, sealed_failure_after_answer_is_kept)
{
    failure_after_answer(key);
}

/* Staging sealed through libsodium (a key not made ready, as daemons
 * before ckpt_aead wrote it) opens through OpenSSL and the other way
 * round: the same bytes either way, so a staging area survives an upgrade
 * or a downgrade of the daemon. */
static void libraries_agree(stage_cipher c, uint8_t fill)
{
    stage_key *slow = stage_key_new(c), *fast = stage_key_new(c);
    cr_assert(slow && fast);
    memset(slow->bytes, fill, STAGE_KEY_BYTES);
    memset(fast->bytes, fill, STAGE_KEY_BYTES);
    cr_assert_eq(stage_key_ready(fast), 0);
    cr_assert_null(slow->aead);
    enum { LEN = 3 * STAGE_BLOCK + 100 };
    uint8_t *want = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        want[i] = (uint8_t)(i * 7 + fill);
    ckpt_err err = {0};

    stage_blob *b = open_blob(21, slow, 1);
    cr_assert_eq(stage_blob_pwrite(b, want, LEN, 0, &err), LEN, "%s", err.msg);
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    stage_blob_free(b);

    b = open_blob(21, fast, 0);
    expect_contents(b, want, LEN);
    memset(want + STAGE_BLOCK, 0xee, STAGE_BLOCK + 10);
    cr_assert_eq(stage_blob_pwrite(b, want + STAGE_BLOCK, STAGE_BLOCK + 10, STAGE_BLOCK, &err),
                 STAGE_BLOCK + 10, "%s", err.msg);
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    stage_blob_free(b);

    b = open_blob(21, slow, 0);
    expect_contents(b, want, LEN);
    stage_blob_free(b);
    stage_key_free(slow);
    stage_key_free(fast);
    free(want);
}

Test(stage_blob, sealed_libsodium_and_openssl_agree_aesgcm)
{
    if (!stage_cipher_available(STAGE_CIPHER_AESGCM))
        cr_skip_test("no AES-NI: AES-256-GCM staging is not used here");
    libraries_agree(STAGE_CIPHER_AESGCM, 0x21);
}

Test(stage_blob, sealed_libsodium_and_openssl_agree_xchacha)
{
    libraries_agree(STAGE_CIPHER_XCHACHA, 0x42);
}

/* Reopening a sealed blob replays its log; a read that fails there says
 * nothing about the log, so the open must fail and leave it whole, not
 * take the failure for a torn tail and cut every record after it. */
Test(stage_blob, sealed_read_error_on_reopen_cuts_nothing)
{
    enum { LEN = 3 * STAGE_BLOCK };
    uint8_t *data = malloc(LEN), *back = malloc(LEN);
    tu_fill_pattern(data, LEN, 42);
    ckpt_err err = {0};
    stage_blob *b = NULL;
    cr_assert_eq(stage_blob_open(dirfd_, 1, key, 1, &b, &err), 0, "%s", err.msg);
    /* One block at a time: three records, one after the other. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stage_blob_pwrite(b, data + i * STAGE_BLOCK, STAGE_BLOCK,
                                       (uint64_t)i * STAGE_BLOCK, &err),
                     STAGE_BLOCK, "%s", err.msg);
    cr_assert_eq(stage_blob_sync(b, &err), 0, "%s", err.msg);
    stage_blob_free(b);
    uint64_t synced = file_size_of(1);

    /* The disk fails the read of the second record's data once. */
    __atomic_store_n(&fail_at, (long long)(REC_OVERHEAD + STAGE_BLOCK + REC_HEADER + 100),
                     __ATOMIC_RELAXED);
    b = NULL;
    int rc = stage_blob_open(dirfd_, 1, key, 0, &b, &err);
    cr_assert_eq(__atomic_load_n(&fail_at, __ATOMIC_RELAXED), -1, "the read was made");
    cr_assert_eq(rc, -EIO, "the open fails (%d)", rc);
    tu_assert_contains(err.msg, "read failed");
    cr_assert_null(b);
    cr_assert_eq(file_size_of(1), synced, "synced records were cut");

    /* The disk works again: everything synced is there. */
    cr_assert_eq(stage_blob_open(dirfd_, 1, key, 0, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(stage_blob_size(b), LEN);
    cr_assert_eq(stage_blob_pread(b, back, LEN, 0, &err), LEN, "%s", err.msg);
    cr_assert_eq(memcmp(back, data, LEN), 0);
    stage_blob_free(b);
    free(data);
    free(back);
}
