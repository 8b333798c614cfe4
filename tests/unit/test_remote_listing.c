/* The listings of an S3 mount (fs/read/remote_listing.c) while the store
 * fails: a fake store whose listing, once broken, takes a while to fail,
 * as a stopped or hung gateway does through the retries. The last good
 * listing goes on being answered; a failed refresh is not tried again on
 * every lookup, and lookups of a namespace whose refresh is failing do not
 * wait behind it. */
#include <pthread.h>
#include <time.h>

#include "read/remote_listing.h"
#include "store/store.h"
#include "testutil.h"

#define FAIL_MS 600 /* how long a broken listing takes to fail */

typedef struct fake_store {
    ckpt_store base;
    pthread_mutex_t mu;
    int broken;
    int calls;
} fake_store;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fake_list(ckpt_store *s, const char *prefix, int dirs, ckpt_object_fn fn, void *ud,
                     ckpt_err *err)
{
    fake_store *f = (fake_store *)s;
    pthread_mutex_lock(&f->mu);
    f->calls++;
    int broken = f->broken;
    pthread_mutex_unlock(&f->mu);
    if (broken) {
        struct timespec ts = {0, FAIL_MS * 1000000L};
        nanosleep(&ts, NULL);
        return ckpt_fail(err, -EIO, "fake: listing failed: no answer");
    }
    ckpt_object_info info = {.name = "a.tpack"};
    info.id.size = 1;
    return fn(ud, &info);
}

static void fake_free(ckpt_store *s)
{
    (void)s;
}

static const store_ops fake_ops = {.list = fake_list, .free = fake_free};

static fake_store fake = {.base = {.ops = &fake_ops, .where = "fake://"},
                          .mu = PTHREAD_MUTEX_INITIALIZER};

static void set_broken(int b)
{
    pthread_mutex_lock(&fake.mu);
    fake.broken = b;
    fake.calls = 0;
    pthread_mutex_unlock(&fake.mu);
}

static int calls(void)
{
    pthread_mutex_lock(&fake.mu);
    int n = fake.calls;
    pthread_mutex_unlock(&fake.mu);
    return n;
}

/* The interval is shorter than a failing listing takes: before, the
 * failed refresh counted from its start, so it was stale as soon as it
 * ended and every lookup listed again. */
Test(remote_listing, failed_refresh_waits_an_interval)
{
    set_broken(0);
    remote_listing *r = remote_listing_new(&fake.base, 0.3);
    cr_assert_not_null(r);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    struct timespec ts = {0, 350 * 1000000L};
    nanosleep(&ts, NULL);
    set_broken(1);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1, "the last good listing");
    cr_assert_eq(calls(), 1);
    double t0 = now_s();
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    cr_assert_eq(remote_listing_find(r, "", "b.tpack", 0, NULL), 0);
    cr_assert_eq(calls(), 1, "listed again %d times right after a failed refresh", calls() - 1);
    cr_assert_lt(now_s() - t0, 0.2);
    remote_listing_free(r);
}

typedef struct finder {
    remote_listing *r;
    double took;
    int found;
} finder;

static void *find_a(void *arg)
{
    finder *f = arg;
    double t0 = now_s();
    f->found = remote_listing_find(f->r, "", "a.tpack", 0, NULL);
    f->took = now_s() - t0;
    return NULL;
}

/* One thread refreshes a namespace whose listing is failing; another's
 * lookup of it is answered from the last good listing, not after the
 * failure (before, the mutex was held across the refresh). */
Test(remote_listing, lookups_do_not_wait_for_a_failing_refresh)
{
    set_broken(0);
    remote_listing *r = remote_listing_new(&fake.base, 0.1);
    cr_assert_not_null(r);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    set_broken(1);
    struct timespec ts = {0, 150 * 1000000L};
    nanosleep(&ts, NULL);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1); /* fails: warned */
    nanosleep(&ts, NULL);
    finder a = {.r = r}, b = {.r = r};
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, find_a, &a), 0);
    while (calls() < 2) {
        struct timespec w = {0, 1000000L};
        nanosleep(&w, NULL);
    }
    cr_assert_eq(pthread_create(&tb, NULL, find_a, &b), 0);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    cr_assert_eq(a.found, 1);
    cr_assert_eq(b.found, 1);
    cr_assert_eq(calls(), 2, "one refresh, not one each");
    cr_assert_gt(a.took, FAIL_MS / 1000.0 * 0.8, "the refreshing lookup took %.3f s", a.took);
    cr_assert_lt(b.took, 0.2, "a lookup waited %.3f s behind a failing refresh", b.took);
    remote_listing_free(r);
}

/* Healthy: answered from memory within the interval; invalidated, listed
 * again. */
Test(remote_listing, invalidate_lists_again)
{
    set_broken(0);
    remote_listing *r = remote_listing_new(&fake.base, 60);
    cr_assert_not_null(r);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    cr_assert_eq(calls(), 1);
    remote_listing_invalidate(r, "");
    cr_assert_eq(remote_listing_find(r, "", "a.tpack", 0, NULL), 1);
    cr_assert_eq(calls(), 2);
    remote_listing_free(r);
}
