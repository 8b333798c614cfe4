/* The table of checkpoints (fs/read/checkpoints.c): its locks. A first
 * open holds the checkpoint's open_lock for as long as it takes (HTTP GETs
 * with retries, on S3), and the table's lock is behind every lookup of the
 * mount: neither may wait for the other. An open never takes the table's
 * lock, and retiring a checkpoint (under the table's lock) leaves its
 * drop to an open under way. A slow open is made here by holding its
 * first read (pread is interposed below, passing through in every thread
 * but the one a test arms). */
#include "testutil.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>

#include "read/read.h"

/* Armed in one thread: its next read waits until gate_open. */
static _Thread_local int hold_next_read;
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_entered, gate_open;

ssize_t pread64(int fd, void *buf, size_t len, off_t off);
ssize_t pread64(int fd, void *buf, size_t len, off_t off)
{
    if (hold_next_read) {
        hold_next_read = 0;
        pthread_mutex_lock(&gate_lock);
        gate_entered = 1;
        pthread_cond_broadcast(&gate_cond);
        while (!gate_open)
            pthread_cond_wait(&gate_cond, &gate_lock);
        pthread_mutex_unlock(&gate_lock);
    }
    return syscall(SYS_pread64, fd, buf, len, off);
}

static void open_gate(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

/* Has a held read reached the gate, within 5 s? */
static int gate_reached(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&gate_lock);
    int rc = 0;
    while (!gate_entered && rc == 0)
        rc = pthread_cond_timedwait(&gate_cond, &gate_lock, &until);
    int entered = gate_entered;
    pthread_mutex_unlock(&gate_lock);
    return entered;
}

/* Joins th, waiting at most 5 s; 0 if it ended in time. */
static int join_within_5s(pthread_t th)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    return pthread_timedjoin_np(th, NULL, &until);
}

typedef struct open_job {
    checkpoint_table *t;
    checkpoint *c;
    int rc;
} open_job;

static void *open_in_thread(void *arg)
{
    open_job *job = arg;
    job->rc = checkpoint_open(job->t, job->c);
    return NULL;
}

static void *slow_open_in_thread(void *arg)
{
    hold_next_read = 1;
    return open_in_thread(arg);
}

/* A pack swapped for a symbolic link after it was found: the open refuses
 * the link and warns about it, and must do so without the table's lock,
 * which is taken before a checkpoint's locks, never after. */
Test(checkpoints, open_of_a_pack_swapped_for_a_link_never_waits_for_the_table)
{
    char *dir = tu_mkdtemp();
    char *pack = tu_join(dir, "p.tpack");
    char *other = tu_join(dir, "elsewhere");
    char *link = tu_join(dir, "link.tmp");
    FILE *f = fopen(pack, "w");
    cr_assert_not_null(f);
    fputs("not looked at: the open stops at the link", f);
    fclose(f);
    f = fopen(other, "w");
    cr_assert_not_null(f);
    fclose(f);

    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    chunk_cache *cache = chunk_cache_new(1u << 20);
    cr_assert_not_null(cache);
    checkpoint_table t;
    cr_assert_eq(checkpoints_init(&t, dir, fd, NULL, cache), 0);
    int err = 0;
    checkpoint *c = checkpoints_lookup(&t, "p", 1, &err);
    cr_assert_not_null(c, "lookup: %s", strerror(-err));

    cr_assert_eq(symlink("elsewhere", link), 0);
    cr_assert_eq(rename(link, pack), 0);

    /* As a lookup or a retire of c does. */
    pthread_mutex_lock(&t.lock);
    open_job job = {&t, c, 1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, open_in_thread, &job), 0);
    int joined = join_within_5s(th);
    pthread_mutex_unlock(&t.lock);
    if (joined != 0)
        pthread_join(th, NULL);
    cr_assert_eq(joined, 0, "the open waited for the table's lock while holding open_lock");
    cr_assert_eq(job.rc, -ESTALE, "open of a pack swapped for a link: %d", job.rc);

    checkpoint_forget(&t, c, 1);
    checkpoints_destroy(&t);
    chunk_cache_free(cache);
    close(fd);
    tu_rm_rf(dir);
    free(dir);
    free(pack);
    free(other);
    free(link);
}

static void write_pack(const char *path)
{
    ckpt_err e = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open(path, NULL, NULL, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "a.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_write(w, "abc", 3, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
}

typedef struct retire_job {
    checkpoint_table *t;
    checkpoint *c;
    checkpoint *other; /* another checkpoint, looked up after the retire */
    int err;
} retire_job;

static void *retire_then_look_up(void *arg)
{
    retire_job *job = arg;
    checkpoint_removed(job->t, job->c);
    job->other = checkpoints_lookup(job->t, "q", 1, &job->err);
    return NULL;
}

/* Deleting a checkpoint while its first open is still reading the pack
 * (on S3, seconds of GETs and retries): the retire holds the table's lock,
 * so it must not wait for the open, or every lookup of the mount waits
 * with it. The open, when it ends, lets go of the pack file itself, and
 * its caller gets ESTALE as a request after the delete would. */
Test(checkpoints, retiring_a_checkpoint_never_waits_for_its_first_open, .timeout = 60)
{
    char *dir = tu_mkdtemp();
    char *pack = tu_join(dir, "p.tpack");
    char *other = tu_join(dir, "q.tpack");
    write_pack(pack);
    write_pack(other);

    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    chunk_cache *cache = chunk_cache_new(1u << 20);
    cr_assert_not_null(cache);
    checkpoint_table t;
    cr_assert_eq(checkpoints_init(&t, dir, fd, NULL, cache), 0);
    int err = 0;
    /* The kernel's reference, held by the request that opens. */
    checkpoint *c = checkpoints_lookup(&t, "p", 1, &err);
    cr_assert_not_null(c, "lookup: %s", strerror(-err));

    open_job opener = {&t, c, 1};
    pthread_t open_th;
    cr_assert_eq(pthread_create(&open_th, NULL, slow_open_in_thread, &opener), 0);
    int reached = gate_reached();

    retire_job retirer = {&t, c, NULL, 0};
    pthread_t retire_th;
    cr_assert_eq(pthread_create(&retire_th, NULL, retire_then_look_up, &retirer), 0);
    int retired = reached ? join_within_5s(retire_th) : -1;
    int open_running = pthread_tryjoin_np(open_th, NULL) == EBUSY;
    open_gate();
    if (open_running)
        pthread_join(open_th, NULL);
    if (retired != 0)
        pthread_join(retire_th, NULL);

    cr_assert(reached, "the open never read the pack");
    cr_assert_eq(retired, 0, "the retire waited for the open with the table's lock held");
    cr_assert(open_running, "the open ended before it was let through");
    cr_assert_not_null(retirer.other, "lookup of another checkpoint: %s", strerror(-retirer.err));

    /* Opened, then let go of by the open itself. */
    cr_assert_eq(opener.rc, -ESTALE, "open that ended after the delete: %d", opener.rc);
    cr_assert_eq(__atomic_load_n(&c->state, __ATOMIC_ACQUIRE), CHECKPOINT_FAILED);
    cr_assert_eq(checkpoint_open(&t, c), -ESTALE);
    cr_assert_not_null(c->pack);
    char fd_path[64], target[64] = "";
    snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", ckpt_fd(c->pack));
    ssize_t n = readlink(fd_path, target, sizeof target - 1);
    cr_assert_gt(n, 0);
    target[n] = '\0';
    cr_assert_str_eq(target, "/dev/null", "the pack's descriptor still leads to %s", target);

    checkpoint_forget(&t, retirer.other, 1);
    checkpoint_forget(&t, c, 1);
    checkpoints_destroy(&t);
    chunk_cache_free(cache);
    close(fd);
    tu_rm_rf(dir);
    free(dir);
    free(pack);
    free(other);
}
