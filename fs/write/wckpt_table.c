/* The table of writable checkpoints: setting it up and down, finding a
 * checkpoint by name or inode, reference counts, and the root's mkdir,
 * rmdir and rename. One job at about 610 lines: each of these takes the
 * table's lock and keeps its list and the backing names in step. */
#include "wckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "common/links.h"
#include "backing_lock.h"
#include "wckpt_internal.h"

/* One writer per store prefix: the store's lease, then the uploads an
 * earlier writer left unfinished (a crash, kill -9), which only a writer
 * holding the lock can know to be nobody's. */
static int take_store_lock(wtable *t, ckpt_err *err)
{
    int rc = ckpt_store_lock_take(t->opts.store, STAGE_HIDDEN_DIR "/" BACKING_LOCK_FILE,
                                  &t->store_lock, err);
    if (rc)
        return rc;
    ckpt_err abort_err = {0};
    long n = ckpt_store_abort_stale_uploads(t->opts.store, NULL, 0, &abort_err);
    if (n < 0)
        fslog_warn("cannot abort the unfinished uploads under %s: %s",
                   ckpt_store_where(t->opts.store), abort_err.msg);
    else if (n > 0)
        fslog_notice("aborted %ld unfinished upload%s left under %s by an earlier writer", n,
                     n == 1 ? "" : "s", ckpt_store_where(t->opts.store));
    return 0;
}

int wtable_init(wtable *t, const char *backing_path, int backing_fd, const mount_key *key,
                const wtable_opts *o, ckpt_err *err)
{
    memset(t, 0, sizeof *t);
    t->backing_fd = backing_fd;
    t->lock_fd = -1;
    t->key = key;
    if (o)
        t->opts = *o;
    t->next_serial = INODE_WRITE_SERIAL_BASE;
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->timer_wake, &attr);
    pthread_cond_init(&t->wake, &attr); /* the packer's wait for aborts due */
    pthread_condattr_destroy(&attr);
    t->backing_path = strdup(backing_path);
    if (!t->backing_path)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    /* First: until it is ours, nothing under .ckptfs is (not even the
     * salt stage_root_open may write). */
    int rc = t->opts.store ? take_store_lock(t, err) : 0;
    if (rc)
        return rc;
    rc = backing_lock_take(backing_fd, backing_path, t->opts.mount_path, &t->lock_fd, err);
    if (rc)
        return rc;
    if (t->opts.store)
        t->store = t->opts.store;
    else
        rc = ckpt_store_open_local(backing_path, &t->store, err);
    if (rc)
        return rc;
    rc = stage_root_open(&t->root, backing_fd, key, err);
    if (rc) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        ckpt_fail(err, rc, "%s/%s", backing_path, msg);
        return rc;
    }
    t->root_ready = 1;
    return 0;
}

void wtable_before_fork(wtable *t)
{
    ckpt_store_lock_before_fork(t->store_lock);
}

void wtable_note_pid(wtable *t)
{
    int rc = t->lock_fd >= 0 ? backing_lock_note_pid(t->lock_fd, t->opts.mount_path) : 0;
    if (rc)
        fslog_warn("%s/%s/%s: cannot record the daemon's pid: %s", t->backing_path,
                   STAGE_HIDDEN_DIR, BACKING_LOCK_FILE, strerror(-rc));
    ckpt_err err = {0};
    if (t->store_lock && ckpt_store_lock_after_fork(t->store_lock, &err) != 0)
        fslog_err("%s; another writer may start on this prefix", err.msg);
}

int wtable_start(wtable *t)
{
    if (t->threads_started)
        return 0;
    if (pthread_create(&t->packer, NULL, wc_packer_main, t) != 0)
        return -EAGAIN;
    if (pthread_create(&t->timer, NULL, wc_timer_main, t) != 0) {
        pthread_mutex_lock(&t->lock);
        t->stopping = 1;
        pthread_cond_broadcast(&t->wake);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->packer, NULL);
        t->stopping = 0;
        return -EAGAIN;
    }
    t->threads_started = 1;
    return 0;
}

/* Which checkpoints this run leaves packing, and what the next does. */
static void log_suspended(wtable *t)
{
    for (wckpt *c = t->all; c; c = c->next) {
        pthread_mutex_lock(&c->lock);
        if (c->current && c->state == WST_PACKING && !c->locked) {
            if (c->pack_suspended)
                fslog_notice("checkpoint '%s' suspended: packing stopped at %.1f of %.1f MB as "
                             "the daemon exits; the next mount packs it again from its staged "
                             "data",
                             c->name, (double)c->pack_done / 1e6, (double)c->pack_total / 1e6);
            else
                fslog_notice("checkpoint '%s' suspended: it was waiting to be packed as the "
                             "daemon exits; the next mount packs it",
                             c->name);
        }
        pthread_mutex_unlock(&c->lock);
    }
}

void wtable_stop(wtable *t)
{
    pthread_mutex_lock(&t->lock);
    __atomic_store_n(&t->stopping, 1, __ATOMIC_RELAXED);
    if (!t->opts.finish_on_stop)
        __atomic_store_n(&t->cancel_packing, 1, __ATOMIC_RELAXED);
    int running = 0;
    for (wckpt *c = t->all; c; c = c->next)
        running |= c->pack_running;
    pthread_cond_broadcast(&t->wake);
    pthread_cond_broadcast(&t->timer_wake);
    pthread_mutex_unlock(&t->lock);
    if (running && t->opts.finish_on_stop)
        fslog_info("finishing the pack under way before exiting (finish_on_exit)");
    if (t->threads_started) {
        pthread_join(t->packer, NULL);
        pthread_join(t->timer, NULL);
        t->threads_started = 0;
    }
    log_suspended(t);
    /* Parked first: a block that fails to reach the disk is then one of
     * the failures the last save keeps. */
    for (wckpt *c = t->all; c; c = c->next) {
        ckpt_err err = {0};
        pthread_mutex_lock(&c->lock);
        for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
            wfile *f = c->tree.nodes[i].kind != WNODE_DIR ? c->tree.nodes[i].data : NULL;
            if (f && f->blob && stage_blob_park(f->blob, &err) != 0) {
                wc_staging_failed(c, err.code, err.msg, i, UINT64_MAX);
                fslog_err("checkpoint '%s': %s", c->name, err.msg);
            }
        }
        pthread_mutex_unlock(&c->lock);
        if (c->current && wc_save_final(c, &err) != 0)
            fslog_err("checkpoint '%s': cannot save its namespace: %s", c->name, err.msg);
    }
}

void wtable_destroy(wtable *t)
{
    wckpt *c = t->all;
    while (c) {
        wckpt *next = c->next;
        wc_wckpt_free(c);
        c = next;
    }
    t->all = NULL;
    if (t->root_ready)
        stage_root_close(&t->root);
    if (!t->opts.store)
        ckpt_store_free(t->store);
    /* Last: the staging area stays ours until nothing here touches it. */
    backing_lock_release(t->lock_fd);
    ckpt_store_lock_release(t->store_lock);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->wake);
    pthread_cond_destroy(&t->timer_wake);
    free(t->backing_path);
    memset(t, 0, sizeof *t);
}

/* The current checkpoint called name (t->lock held). */
wckpt *wc_by_name(wtable *t, const char *name)
{
    for (wckpt *c = t->all; c; c = c->next)
        if (c->current && strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

wckpt *wtable_get(wtable *t, const char *name, int count_lookup)
{
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    if (c && count_lookup)
        c->nlookup++;
    pthread_mutex_unlock(&t->lock);
    return c;
}

static wckpt *find(wtable *t, uint64_t ino, uint32_t *node, int ref)
{
    uint32_t serial, n;
    if (!inode_split(ino, &serial, &n) || !inode_is_written(ino))
        return NULL;
    pthread_mutex_lock(&t->lock);
    wckpt *c = t->all;
    while (c && c->serial != serial)
        c = c->next;
    if (c && ref)
        c->refs++;
    pthread_mutex_unlock(&t->lock);
    if (c)
        *node = n;
    return c;
}

wckpt *wtable_find(wtable *t, uint64_t ino, uint32_t *node)
{
    return find(t, ino, node, 0);
}

wckpt *wtable_find_ref(wtable *t, uint64_t ino, uint32_t *node)
{
    return find(t, ino, node, 1);
}

void wtable_count_lookup(wtable *t, wckpt *c)
{
    pthread_mutex_lock(&t->lock);
    c->nlookup++;
    pthread_mutex_unlock(&t->lock);
}

void wtable_forget(wtable *t, wckpt *c, uint64_t n)
{
    pthread_mutex_lock(&t->lock);
    c->nlookup = n > c->nlookup ? 0 : c->nlookup - n;
    wc_release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
}

void wtable_ref(wtable *t, wckpt *c)
{
    pthread_mutex_lock(&t->lock);
    c->refs++;
    pthread_mutex_unlock(&t->lock);
}

void wtable_unref(wtable *t, wckpt *c)
{
    pthread_mutex_lock(&t->lock);
    c->refs--;
    wc_release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
}

void wlisted_free(wlisted *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].name);
    free(v);
}

/* Is c directly in namespace ns? */
static int in_ns(const wckpt *c, const char *ns)
{
    const char *slash = strrchr(c->name, '/');
    size_t dir_len = slash ? (size_t)(slash - c->name) : 0;
    return dir_len == strlen(ns) && strncmp(c->name, ns, dir_len) == 0;
}

int wtable_list(wtable *t, const char *ns, wlisted **out, size_t *n)
{
    pthread_mutex_lock(&t->lock);
    size_t count = 0;
    for (wckpt *c = t->all; c; c = c->next)
        count += c->current && in_ns(c, ns);
    wlisted *v = calloc(count ? count : 1, sizeof *v);
    size_t i = 0;
    int rc = v ? 0 : -ENOMEM;
    for (wckpt *c = t->all; rc == 0 && c; c = c->next) {
        if (!c->current || !in_ns(c, ns))
            continue;
        v[i].name = strdup(backing_base(c->name));
        if (!v[i].name) {
            rc = -ENOMEM;
            break;
        }
        v[i].ino = wckpt_entry_ino(c);
        uint32_t e = wckpt_entry_node(c);
        v[i].is_link = c->is_file && e != WTREE_NONE && c->tree.nodes[e].kind == WNODE_LINK;
        v[i++].is_file = c->is_file;
    }
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        wlisted_free(v, i);
        return rc;
    }
    *out = v;
    *n = i;
    return 0;
}

int wtable_has_below(wtable *t, const char *path)
{
    pthread_mutex_lock(&t->lock);
    int found = 0;
    for (wckpt *c = t->all; c && !found; c = c->next)
        found = c->current && backing_is_below(c->name, path);
    pthread_mutex_unlock(&t->lock);
    return found;
}

/* Is name free for a new checkpoint? 0, -EEXIST, -EINVAL or
 * -ENAMETOOLONG (t->lock held). */
static int name_free(wtable *t, const char *name)
{
    if (!wtable_name_ok(name))
        return strlen(backing_base(name)) + BACKING_SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    return wc_by_name(t, name) || wc_pack_exists(t, name) ? -EEXIST : 0;
}

/* A new writable checkpoint called name, writing, with its staging set
 * up and a kernel reference (t->lock held). */
wckpt *wc_start(wtable *t, const char *name, uint32_t mode, int is_file, int replaces, int has_base,
                int *rc)
{
    wckpt *c = wc_wckpt_new(t, name);
    *rc = c ? 0 : -ENOMEM;
    ckpt_err err = {0};
    struct timespec ts = wc_now_real();
    if (*rc == 0)
        *rc = wtree_init(&c->tree, mode, ts.tv_sec, (uint32_t)ts.tv_nsec);
    if (*rc == 0) {
        c->next_blob_id = 1;
        c->is_file = is_file;
        c->dir.is_file = is_file;
        c->dir.replaces = replaces;
        c->dir.has_base = has_base;
        *rc = stage_create(&t->root, name, &c->dir, &err);
        if (*rc)
            fslog_err("cannot start checkpoint '%s': %s", name, err.msg);
    }
    if (*rc) {
        if (c)
            wc_wckpt_free(c);
        return NULL;
    }
    c->state = WST_WRITING;
    c->meta_gen = 1; /* the root's mode and mtime */
    c->nlookup = 1;
    c->next = t->all;
    t->all = c;
    return c;
}

int wtable_mkdir(wtable *t, const char *name, uint32_t mode, wckpt **out)
{
    pthread_mutex_lock(&t->lock);
    int rc = name_free(t, name);
    wckpt *c = rc == 0 ? wc_start(t, name, mode, 0, 0, 0, &rc) : NULL;
    pthread_mutex_unlock(&t->lock);
    if (c)
        *out = c;
    return rc;
}

static int create_single(wtable *t, const char *name, uint32_t mode, const char *target,
                         wckpt **out, uint32_t *node, struct stat *st)
{
    int rc = target ? link_target_check(target) : 0;
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    rc = name_free(t, name);
    wckpt *c = rc == 0 ? wc_start(t, name, 0755, 1, 0, 0, &rc) : NULL;
    pthread_mutex_unlock(&t->lock);
    if (!c)
        return rc;
    rc = target ? wckpt_symlink(c, WTREE_ROOT, backing_base(name), target, node, st)
                : wckpt_create(c, WTREE_ROOT, backing_base(name), mode, node, st);
    if (rc) {
        wtable_unlink_file(t, name);
        wtable_forget(t, c, 1);
        return rc;
    }
    *out = c;
    return 0;
}

int wtable_create_file(wtable *t, const char *name, uint32_t mode, wckpt **out, uint32_t *node,
                       struct stat *st)
{
    return create_single(t, name, mode, NULL, out, node, st);
}

int wtable_create_link(wtable *t, const char *name, const char *target, wckpt **out, uint32_t *node,
                       struct stat *st)
{
    return create_single(t, name, 0777, target, out, node, st);
}

/* The identity of the pack c was reopened from (c->lock held), in buf;
 * NULL when it was not reopened from one. Only that object goes with c:
 * on a store, another writer may have put a new one under the name since. */
static const ckpt_object_id *base_id(const wckpt *c, ckpt_object_id *buf)
{
    if (!c->base)
        return NULL;
    ckpt_pack_object_id(c->base, buf);
    return buf;
}

/* Drops a writable checkpoint with its staging, and the pack it would
 * have replaced (t->lock held; c->lock not). -ESTALE when that pack was
 * left, replaced since it was reopened. */
static int drop(wtable *t, wckpt *c, int want_file)
{
    pthread_mutex_lock(&c->lock);
    ckpt_object_id buf;
    const ckpt_object_id *want = base_id(c, &buf);
    int rc = c->locked ? -EACCES : c->state == WST_PACKING ? -EBUSY : 0;
    if (rc == 0 && c->is_file != want_file)
        rc = c->is_file ? -ENOTDIR : -EISDIR;
    if (rc == 0 && !want_file && c->tree.nodes[WTREE_ROOT].n_children)
        rc = -ENOTEMPTY;
    if (rc == 0) {
        c->state = WST_DELETED;
        while (c->inflight)
            pthread_cond_wait(&c->changed, &c->lock);
        /* A file checkpoint's file goes as a file unlinked inside a
         * checkpoint does: a descriptor still open on it goes on reading
         * and writing its unlinked blob (wckpt_ops.c), which the last close
         * frees; nothing of it stays in the staging area meanwhile. */
        const wnode *root = &c->tree.nodes[WTREE_ROOT];
        const char *base = root->n_children ? c->tree.nodes[root->children[0]].name : NULL;
        uint32_t file;
        if (want_file && base && wtree_remove(&c->tree, WTREE_ROOT, base, 0, &file) == 0)
            wc_removed(c, file);
        wc_let_go_of_base(c); /* its space comes back at once */
    }
    int replaces = c->dir.replaces;
    pthread_mutex_unlock(&c->lock);
    if (rc == 0) {
        ckpt_err err = {0};
        c->current = 0;
        if (stage_remove(&t->root, &c->dir, &err) != 0)
            fslog_warn("checkpoint '%s' removed, but not all of its staging: %s", c->name, err.msg);
        if (replaces && wc_pack_exists(t, c->name) &&
            wtable_remove_pack(t, c->name, c->is_file, want) == -ESTALE)
            rc = -ESTALE; /* the name shows the new pack now */
        wc_release_if_unused(t, c);
    }
    return rc;
}

/* A checkpoint that is removed or renamed while it is packed stops being
 * packed first, as a write would stop it (waiting needs t->lock free:
 * the packer takes it to finish). */
static void unpack_name(wtable *t, const char *name, const char *what)
{
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    if (c)
        c->refs++;
    pthread_mutex_unlock(&t->lock);
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    wc_unpack(c, what);
    pthread_mutex_unlock(&c->lock);
    wtable_unref(t, c);
}

void wc_abandon(wtable *t, wckpt *c)
{
    pthread_mutex_lock(&t->lock);
    pthread_mutex_lock(&c->lock);
    c->state = WST_DELETED;
    while (c->inflight)
        pthread_cond_wait(&c->changed, &c->lock);
    ckpt_object_id buf;
    const ckpt_object_id *want = base_id(c, &buf);
    wc_let_go_of_base(c);
    int replaces = c->dir.replaces;
    pthread_mutex_unlock(&c->lock);
    ckpt_err err = {0};
    c->current = 0;
    if (stage_remove(&t->root, &c->dir, &err) != 0)
        fslog_warn("checkpoint '%s' removed, but not all of its staging: %s", c->name, err.msg);
    if (replaces && wc_pack_exists(t, c->name))
        wtable_remove_pack(t, c->name, c->is_file, want);
    wc_release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
}

void wc_let_go_of_base(wckpt *c)
{
    if (!c->base)
        return;
    for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
        const wfile *f = c->tree.nodes[i].kind != WNODE_DIR ? c->tree.nodes[i].data : NULL;
        if (f && !f->blob && (f->open || f->busy))
            return; /* still read, as on a local disk; freed with c */
    }
    ckpt_close(c->base);
    c->base = NULL;
}

int wtable_rmdir(wtable *t, const char *name)
{
    unpack_name(t, name, "removed");
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    int rc = c ? drop(t, c, 0) : -ENOENT;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int wtable_unlink_file(wtable *t, const char *name)
{
    unpack_name(t, name, "removed");
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    int rc = c ? drop(t, c, 1) : -ENOENT;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int wtable_remove_pack(wtable *t, const char *name, int is_file, const ckpt_object_id *want)
{
    char file[NAME_MAX + 1], object[BACKING_PATH_MAX + NAME_MAX + 2];
    if (!wtable_name_ok(name) ||
        backing_pack_name(backing_base(name), is_file, file, sizeof file) ||
        backing_pack_name(name, is_file, object, sizeof object))
        return -ENOENT;
    int rc;
    if (t->opts.store) {
        ckpt_err err = {0};
        rc = ckpt_store_remove_if(t->store, object, want, &err);
        if (rc == -ESTALE)
            fslog_warn("checkpoint '%s': %s", name, err.msg);
        else if (rc && rc != -ENOENT)
            fslog_err("checkpoint '%s': cannot delete: %s", name, err.msg);
        if (t->pack_changed)
            t->pack_changed(t->successor_ud, name);
    } else {
        int dir = backing_open_parent(t->backing_fd, name, 0);
        if (dir < 0)
            return dir;
        rc = unlinkat(dir, file, 0) != 0 || fsync(dir) != 0 ? -errno : 0;
        close(dir);
    }
    /* On a store, backing_path is the staging directory: name the object. */
    if (rc == 0)
        fslog_info("checkpoint '%s' deleted (%s/%s removed)", name,
                   t->opts.store ? ckpt_store_where(t->store) : t->backing_path, object);
    return rc;
}

/* On a store rename is a copy and a delete (not atomic: a reader may see
 * both names for a moment). */
static int rename_object(wtable *t, const char *from, const char *to, int is_file, int replace)
{
    char a[BACKING_PATH_MAX + NAME_MAX + 2], b[BACKING_PATH_MAX + NAME_MAX + 2];
    if (backing_pack_name(from, is_file, a, sizeof a) ||
        backing_pack_name(to, is_file, b, sizeof b))
        return -ENAMETOOLONG;
    if (!replace && wc_backing_kind(t, to))
        return -EEXIST;
    ckpt_err err = {0};
    int rc = ckpt_store_rename(t->store, a, b, &err);
    if (rc)
        fslog_err("cannot rename checkpoint '%s' to '%s': %s", from, to, err.msg);
    if (t->pack_changed) {
        t->pack_changed(t->successor_ud, from);
        t->pack_changed(t->successor_ud, to);
    }
    return rc;
}

/* Renames BACKING/from's pack to to's, replacing a pack there when
 * replace; both directories fsynced. */
static int rename_pack(wtable *t, const char *from, const char *to, int is_file, int replace)
{
    if (t->opts.store)
        return rename_object(t, from, to, is_file, replace);
    char a[NAME_MAX + 1], b[NAME_MAX + 1];
    if (backing_pack_name(backing_base(from), is_file, a, sizeof a) ||
        backing_pack_name(backing_base(to), is_file, b, sizeof b))
        return -ENAMETOOLONG;
    int fd_a = backing_open_parent(t->backing_fd, from, 0);
    int fd_b = fd_a < 0 ? fd_a : backing_open_parent(t->backing_fd, to, 0);
    int rc = fd_a < 0 ? fd_a : fd_b < 0 ? fd_b : 0;
    if (rc == 0 && renameat2(fd_a, a, fd_b, b, replace ? 0 : RENAME_NOREPLACE) != 0)
        rc = -errno;
    if (rc == 0 && (fsync(fd_b) != 0 || fsync(fd_a) != 0))
        rc = -errno;
    if (fd_a >= 0)
        close(fd_a);
    if (fd_b >= 0)
        close(fd_b);
    return rc;
}

/* Renames the writable checkpoint c to `to` (t->lock held). */
static int rename_writable(wtable *t, wckpt *c, const char *to, int replaces)
{
    pthread_mutex_lock(&c->save_lock);
    pthread_mutex_lock(&c->lock);
    int rc = c->state == WST_PACKING ? -EBUSY : 0;
    stage_state st = c->state == WST_FAILED ? STAGE_FAILED : STAGE_WRITING;
    char *error = c->error ? strdup(c->error) : NULL;
    int was_replacing = c->dir.replaces;
    pthread_mutex_unlock(&c->lock);
    ckpt_err err = {0};
    if (rc == 0) {
        c->dir.replaces = replaces;
        rc = stage_write_record(&t->root, &c->dir, to, st, error, &err);
        if (rc)
            c->dir.replaces = was_replacing;
    }
    pthread_mutex_unlock(&c->save_lock);
    free(error);
    char *copy = rc == 0 ? strdup(to) : NULL;
    if (rc == 0 && copy) {
        pthread_mutex_lock(&c->lock);
        free(c->name);
        c->name = copy;
        pthread_mutex_unlock(&c->lock);
    } else if (rc == 0) {
        rc = -ENOMEM;
    } else if (rc != -EBUSY) {
        fslog_err("cannot rename checkpoint '%s': %s", c->name, err.msg);
    }
    return rc;
}

int wtable_rename(wtable *t, const char *from, const char *to, int noreplace)
{
    if (!wtable_name_ok(to))
        return strlen(backing_base(to)) + BACKING_SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    if (strcmp(from, to) == 0)
        return 0;
    unpack_name(t, from, "renamed");
    unpack_name(t, to, "replaced");
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, from), *target = wc_by_name(t, to);
    int from_kind = c ? 0 : wtable_name_ok(from) ? wc_backing_kind(t, from) : 0;
    int to_kind = wc_backing_kind(t, to);
    int from_file = c ? c->is_file : from_kind == WC_PACK_FILE;
    int to_exists = target || to_kind;
    int to_file = target ? target->is_file : to_kind == WC_PACK_FILE;
    int rc = 0, ns_taken = 0;
    uint32_t ns_mode = 0;
    if (!c && from_kind != WC_PACK_DIR && from_kind != WC_PACK_FILE) {
        rc = -ENOENT;
    } else if (to_exists && noreplace) {
        rc = -EEXIST;
    } else if (!target && to_kind == WC_NAMESPACE && !from_file) {
        /* A directory replaces an empty one: the namespace goes first (a
         * crash then loses an empty directory, never hides the checkpoint
         * behind it) and comes back if the rename fails. */
        rc = wc_ns_take_empty(t, to, &ns_mode);
        ns_taken = rc == 0;
        to_kind = ns_taken ? wc_backing_kind(t, to) : to_kind;
        if (ns_taken && to_kind)
            rc = -ENOTEMPTY; /* a pack the directory hid */
    } else if (to_exists && !(from_file && to_file)) {
        /* A directory replaces only an empty one; a checkpoint is not. */
        rc = from_file ? -EISDIR : to_file ? -ENOTDIR : -ENOTEMPTY;
    }
    if (rc == 0 && target) {
        /* rename(2) over a file: the one there goes. */
        pthread_mutex_lock(&target->lock);
        if (target->state == WST_PACKING)
            rc = -EBUSY;
        pthread_mutex_unlock(&target->lock);
    }
    if (rc == 0 && c && c->dir.has_base) {
        /* Reopened: the pack it reads unchanged files from moves along. */
        rc = rename_pack(t, from, to, from_file, to_file);
        if (rc == 0)
            rc = rename_writable(t, c, to, 1);
    } else if (rc == 0 && c) {
        rc = rename_writable(t, c, to, to_kind != 0 || c->dir.replaces);
        if (rc == 0 && c->dir.replaces && !to_kind && wc_pack_exists(t, from))
            wtable_remove_pack(t, from, from_file, NULL); /* what it was to replace */
    } else if (rc == 0) {
        rc = rename_pack(t, from, to, from_file, to_file);
        if (rc == -EEXIST)
            rc = noreplace ? -EEXIST : -ENOTEMPTY;
    }
    if (rc == 0 && target) {
        /* Replaced: its staging goes; the pack at `to`, if any, is now the
         * renamed one's (or is replaced when that one commits). */
        pthread_mutex_lock(&target->lock);
        target->dir.replaces = 0;
        pthread_mutex_unlock(&target->lock);
        if (drop(t, target, 1) != 0)
            fslog_warn("checkpoint '%s': replaced, but its staging is left", to);
    }
    if (rc && ns_taken)
        wc_ns_put_back(t, to, ns_mode);
    pthread_mutex_unlock(&t->lock);
    return rc;
}
