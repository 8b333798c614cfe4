/* The table of checkpoints (fs/read/checkpoints.c): lock order. Retiring a
 * checkpoint takes its open_lock with the table's lock held, so an open
 * (which holds open_lock) must never wait for the table's lock, or the two
 * deadlock and every request of the mount after them. */
#include "testutil.h"

#include <pthread.h>
#include <time.h>

#include "read/read.h"

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

/* A pack swapped for a symbolic link after it was found: the open refuses
 * the link and warns about it, and must do so without the table's lock,
 * which a retire of the same checkpoint may hold while it waits for the
 * checkpoint's open_lock. */
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

    /* As a retire of c does, between taking the table's lock and c's
     * open_lock. */
    pthread_mutex_lock(&t.lock);
    open_job job = {&t, c, 1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, open_in_thread, &job), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    int joined = pthread_timedjoin_np(th, NULL, &until);
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
