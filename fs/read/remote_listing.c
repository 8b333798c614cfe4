#include "remote_listing.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fslog.h"

typedef struct ns_cache {
    char *ns;
    double listed_at; /* monotonic seconds; 0: never listed */
    remote_entry *v;
    size_t n;
    int warned;      /* a failed refresh was logged */
    int ever;        /* v holds a listing that once succeeded */
    int refreshing;  /* a thread is listing it, without the lock */
    unsigned marked; /* invalidations, so one during a refresh is kept */
} ns_cache;

struct remote_listing {
    pthread_mutex_t lock;
    pthread_cond_t listed; /* a refresh ended */
    ckpt_store *store;
    double interval;
    ns_cache *all;
    size_t n, cap;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

remote_listing *remote_listing_new(ckpt_store *s, double interval)
{
    remote_listing *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->listed, NULL);
    r->store = s;
    r->interval = interval;
    return r;
}

void remote_entries_free(remote_entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

void remote_listing_free(remote_listing *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->all[i].ns);
        remote_entries_free(r->all[i].v, r->all[i].n);
    }
    free(r->all);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->listed);
    free(r);
}

typedef struct collect {
    remote_entry *v;
    size_t n, cap, skip; /* skip: the namespace's "ns/" in names */
} collect;

static int collect_one(void *ud, const ckpt_object_info *info)
{
    collect *c = ud;
    const char *base = info->name + c->skip;
    if (strlen(info->name) <= c->skip || strchr(base, '/'))
        return 0; /* not directly in the namespace: the listing is one level */
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 32;
        remote_entry *g = realloc(c->v, cap * sizeof *g);
        if (!g)
            return -ENOMEM;
        c->v = g;
        c->cap = cap;
    }
    remote_entry *e = &c->v[c->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(base)))
        return -ENOMEM;
    e->is_dir = info->is_dir;
    e->id = info->id;
    c->n++;
    return 0;
}

static ns_cache *cache_of(remote_listing *r, const char *ns)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->all[i].ns, ns) == 0)
            return &r->all[i];
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        ns_cache *g = realloc(r->all, cap * sizeof *g);
        if (!g)
            return NULL;
        r->all = g;
        r->cap = cap;
    }
    ns_cache *c = &r->all[r->n];
    memset(c, 0, sizeof *c);
    if (!(c->ns = strdup(ns)))
        return NULL;
    r->n++;
    return c;
}

/* ns's cache, listed again when stale. Called with r->lock held, which
 * the listing itself runs without: a listing that fails takes the store's
 * whole retry time (10 s against a stopped gateway, 30 s against a hung
 * one), and with the lock held every lookup of the mount waited that long
 * behind it. While a refresh is under way, others wait for it, except
 * where the last one failed: they are answered from the last good listing
 * at once. A failed refresh is tried again an interval after it ended (it
 * was an interval after it began, which against a down gateway was at
 * once: every lookup listed again, a stat took two listings' time). */
static int fresh(remote_listing *r, const char *ns, ns_cache **out)
{
    ns_cache *c = cache_of(r, ns);
    if (!c)
        return -ENOMEM;
    size_t at = (size_t)(c - r->all); /* r->all may move while unlocked */
    for (;;) {
        c = &r->all[at];
        *out = c;
        if (c->ever && c->listed_at > 0 && now_s() - c->listed_at < r->interval)
            return 0;
        if (!c->refreshing)
            break;
        if (c->ever && c->warned && c->listed_at > 0)
            return 0; /* the gateway is failing: the last good listing, now */
        pthread_cond_wait(&r->listed, &r->lock);
    }
    double now = now_s();
    unsigned marked = c->marked;
    size_t ns_len = strlen(ns);
    char *prefix = malloc(ns_len + 2);
    if (!prefix)
        return -ENOMEM;
    memcpy(prefix, ns, ns_len);
    if (ns_len)
        prefix[ns_len++] = '/';
    prefix[ns_len] = '\0';
    collect got = {.skip = ns_len};
    ckpt_err err = {0};
    c->refreshing = 1;
    pthread_mutex_unlock(&r->lock);
    int rc = ckpt_store_list_dirs(r->store, prefix, collect_one, &got, &err);
    free(prefix);
    pthread_mutex_lock(&r->lock);
    c = *out = &r->all[at];
    c->refreshing = 0;
    pthread_cond_broadcast(&r->listed);
    if (rc < 0) {
        remote_entries_free(got.v, got.n);
        if (!c->ever)
            return rc;
        if (!c->warned)
            fslog_warn("cannot list %s/%s (%s): showing the listing of %.0f s ago until it "
                       "works again",
                       ckpt_store_where(r->store), ns, err.msg[0] ? err.msg : strerror(-rc),
                       now - c->listed_at);
        if (c->marked == marked)
            c->listed_at = now_s(); /* retried after the interval, not on every lookup */
        c->warned = 1;
        return 0;
    }
    if (c->warned)
        fslog_info("listing %s/%s works again", ckpt_store_where(r->store), ns);
    c->warned = 0;
    remote_entries_free(c->v, c->n);
    c->v = got.v;
    c->n = got.n;
    /* Invalidated while listing: what was listed may miss the change. */
    c->listed_at = c->marked == marked ? now : 0;
    c->ever = 1;
    return 0;
}

int remote_listing_get(remote_listing *r, const char *ns, remote_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&r->lock);
    ns_cache *c;
    int rc = fresh(r, ns, &c);
    remote_entry *v = rc == 0 && c->n ? calloc(c->n, sizeof *v) : NULL;
    if (rc == 0 && c->n && !v)
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < c->n; i++) {
        v[i] = c->v[i];
        if (!(v[i].name = strdup(c->v[i].name))) {
            remote_entries_free(v, i);
            v = NULL;
            rc = -ENOMEM;
        }
    }
    if (rc == 0) {
        *out = v;
        *n = c->n;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int remote_listing_find(remote_listing *r, const char *ns, const char *base, int want_dir,
                        ckpt_object_id *id)
{
    pthread_mutex_lock(&r->lock);
    ns_cache *c;
    int rc = fresh(r, ns, &c);
    int found = 0;
    for (size_t i = 0; rc == 0 && !found && i < c->n; i++) {
        found = c->v[i].is_dir == want_dir && strcmp(c->v[i].name, base) == 0;
        if (found && id)
            *id = c->v[i].id;
    }
    pthread_mutex_unlock(&r->lock);
    return rc < 0 ? rc : found;
}

void remote_listing_invalidate(remote_listing *r, const char *ns)
{
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->all[i].ns, ns) == 0) {
            r->all[i].listed_at = 0;
            r->all[i].marked++;
        }
    pthread_mutex_unlock(&r->lock);
}
