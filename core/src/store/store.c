/* The backend-independent half of the store: the public and internal entry
 * points, which check their arguments once and dispatch to the backend's
 * vtable, and the identity comparison. */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckpt_object_id_equal(const ckpt_object_id *a, const ckpt_object_id *b)
{
    if (a->size != b->size)
        return 0;
    if (a->etag[0] || b->etag[0])
        return strcmp(a->etag, b->etag) == 0;
    return a->dev == b->dev && a->ino == b->ino && a->mtime_sec == b->mtime_sec &&
           a->mtime_nsec == b->mtime_nsec;
}

char *store_display_name(const ckpt_store *s, const char *name)
{
    char *out;
    if (!s->where)
        return strdup(name);
    return asprintf(&out, "%s/%s", s->where, name) < 0 ? NULL : out;
}

const char *ckpt_store_where(const ckpt_store *s)
{
    return s->where ? s->where : ".";
}

int ckpt_store_open(const char *url, const ckpt_store_opts *opts, ckpt_store **out, ckpt_err *err)
{
    *out = NULL;
    if (!url || !*url)
        return ckpt_fail(err, -EINVAL, "empty store URL");
    if (strncmp(url, "s3://", 5) == 0)
        return store_s3_open(url, opts, out, err);
    return ckpt_store_open_local(url, out, err);
}

void ckpt_store_free(ckpt_store *s)
{
    if (s)
        s->ops->free(s);
}

/* Names reach backends only when safe: no "..", no leading '/', no empty
 * component, so a name can never leave its store. */
static int check_name(const ckpt_store *s, const char *name, ckpt_err *err)
{
    if (name && ckpt_path_is_safe(name))
        return 0;
    return ckpt_fail(err, -EINVAL, "%s: invalid object name '%s'", ckpt_store_where(s),
                     name ? name : "(null)");
}

int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_object_fn fn, void *ud, ckpt_err *err)
{
    if (!fn)
        return ckpt_fail(err, -EINVAL, "%s: list without a callback", ckpt_store_where(s));
    return s->ops->list(s, prefix ? prefix : "", 0, fn, ud, err);
}

int ckpt_store_list_dirs(ckpt_store *s, const char *prefix, ckpt_object_fn fn, void *ud,
                         ckpt_err *err)
{
    if (!fn)
        return ckpt_fail(err, -EINVAL, "%s: list without a callback", ckpt_store_where(s));
    return s->ops->list(s, prefix ? prefix : "", 1, fn, ud, err);
}

void ckpt_store_cache_stats_get(ckpt_store *s, ckpt_store_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (s && s->ops->cache_stats)
        s->ops->cache_stats(s, out);
}

int ckpt_store_reachable(ckpt_store *s, ckpt_err *err)
{
    return s && s->ops->reachable ? s->ops->reachable(s, err) : 0;
}

long ckpt_store_retry_aborts(ckpt_store *s)
{
    return s && s->ops->retry_aborts ? s->ops->retry_aborts(s) : 0;
}

int ckpt_store_remove(ckpt_store *s, const char *name, ckpt_err *err)
{
    int rc = check_name(s, name, err);
    return rc < 0 ? rc : s->ops->remove(s, name, err);
}

int ckpt_store_remove_if(ckpt_store *s, const char *name, const ckpt_object_id *want, ckpt_err *err)
{
    int rc = check_name(s, name, err);
    if (rc < 0)
        return rc;
    return want && s->ops->remove_if ? s->ops->remove_if(s, name, want, err)
                                     : s->ops->remove(s, name, err);
}

int ckpt_store_rename(ckpt_store *s, const char *from, const char *to, ckpt_err *err)
{
    int rc = check_name(s, from, err);
    if (rc == 0)
        rc = check_name(s, to, err);
    return rc < 0 ? rc : s->ops->rename(s, from, to, err);
}

int ckpt_store_lock_take(ckpt_store *s, const char *name, ckpt_store_lock **out, ckpt_err *err)
{
    *out = NULL;
    int rc = check_name(s, name, err);
    return rc < 0 ? rc : s->ops->lock(s, name, out, err);
}

void ckpt_store_lock_release(ckpt_store_lock *l)
{
    if (l)
        l->store->ops->unlock(l);
}

void ckpt_store_lock_before_fork(ckpt_store_lock *l)
{
    if (l && l->store->ops->lock_before_fork)
        l->store->ops->lock_before_fork(l);
}

int ckpt_store_lock_after_fork(ckpt_store_lock *l, ckpt_err *err)
{
    if (!l || !l->store->ops->lock_after_fork)
        return 0;
    return l->store->ops->lock_after_fork(l, err);
}

long ckpt_store_abort_stale_uploads(ckpt_store *s, const char *name, uint64_t older_than_s,
                                    ckpt_err *err)
{
    if (name) {
        int rc = check_name(s, name, err);
        if (rc < 0)
            return rc;
    }
    return s->ops->abort_stale ? s->ops->abort_stale(s, name, older_than_s, err) : 0;
}
