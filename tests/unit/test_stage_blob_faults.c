/* Staged files (fs/write/stage_blob.c) when the staging disk fails a read,
 * which the other tests cannot make happen: pread is interposed here, and
 * passes through unless a test arms it. Reopening a sealed blob replays
 * its log; a read that fails there says nothing about the log, so the
 * open must fail and leave it whole, not take the failure for a torn tail
 * and cut every record after it. */
#include "testutil.h"

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
static stage_key *key;

static void setup(void)
{
    dir = tu_mkdtemp();
    dirfd_ = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(dirfd_, 0);
    cr_assert_geq(sodium_init(), 0);
    key = stage_key_new(stage_cipher_default());
    cr_assert_not_null(key);
    memset(key->bytes, 0x5a, STAGE_KEY_BYTES);
    cr_assert_eq(stage_key_ready(key), 0);
}

static void teardown(void)
{
    stage_key_free(key);
    close(dirfd_);
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(stage_blob_faults, .init = setup, .fini = teardown);

static uint64_t file_size_of(uint64_t id)
{
    char name[24];
    struct stat st;
    stage_blob_name(id, name);
    cr_assert_eq(fstatat(dirfd_, name, &st, 0), 0);
    return (uint64_t)st.st_size;
}

Test(stage_blob_faults, sealed_read_error_on_reopen_cuts_nothing)
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
