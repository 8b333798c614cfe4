/* The table of writable checkpoints: setting it up and down, finding a
 * checkpoint by name or inode, reference counts, and the root's mkdir,
 * rmdir and rename. */
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
#include "common/fslog.h"
#include "backing_lock.h"
#include "wckpt_internal.h"

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
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&t->wake, NULL);
    t->backing_path = strdup(backing_path);
    if (!t->backing_path)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    /* First: until it is ours, nothing under .ckptfs is (not even the
     * salt stage_root_open may write). */
    int rc = backing_lock_take(backing_fd, backing_path, t->opts.mount_path, &t->lock_fd, err);
    if (rc)
        return rc;
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

void wtable_note_pid(wtable *t)
{
    int rc = t->lock_fd >= 0 ? backing_lock_note_pid(t->lock_fd, t->opts.mount_path) : 0;
    if (rc)
        fslog_warn("%s/%s/%s: cannot record the daemon's pid: %s", t->backing_path,
                   STAGE_HIDDEN_DIR, BACKING_LOCK_FILE, strerror(-rc));
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
                             "data", c->name, (double)c->pack_done / 1e6,
                             (double)c->pack_total / 1e6);
            else
                fslog_notice("checkpoint '%s' suspended: it was waiting to be packed as the "
                             "daemon exits; the next mount packs it", c->name);
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
    for (wckpt *c = t->all; c; c = c->next) {
        ckpt_err err = {0};
        if (c->current && wc_save(c, &err) != 0)
            fslog_err("checkpoint '%s': cannot save its namespace: %s", c->name, err.msg);
        pthread_mutex_lock(&c->lock);
        for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
            wfile *f = c->tree.nodes[i].kind == WNODE_FILE ? c->tree.nodes[i].data : NULL;
            if (f && stage_blob_park(f->blob, &err) != 0)
                fslog_err("checkpoint '%s': %s", c->name, err.msg);
        }
        pthread_mutex_unlock(&c->lock);
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
    ckpt_store_free(t->store);
    /* Last: the staging area stays ours until nothing here touches it. */
    backing_lock_release(t->lock_fd);
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

wckpt *wtable_find(wtable *t, uint64_t ino, uint32_t *node)
{
    uint32_t serial, n;
    if (!inode_split(ino, &serial, &n) || !inode_is_written(ino))
        return NULL;
    pthread_mutex_lock(&t->lock);
    wckpt *c = t->all;
    while (c && c->serial != serial)
        c = c->next;
    pthread_mutex_unlock(&t->lock);
    if (c)
        *node = n;
    return c;
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

int wtable_names(wtable *t, char ***names, uint64_t **inos, size_t *n)
{
    pthread_mutex_lock(&t->lock);
    size_t count = 0;
    for (wckpt *c = t->all; c; c = c->next)
        count += c->current;
    char **nv = calloc(count ? count : 1, sizeof *nv);
    uint64_t *iv = calloc(count ? count : 1, sizeof *iv);
    size_t i = 0;
    int rc = nv && iv ? 0 : -ENOMEM;
    for (wckpt *c = t->all; rc == 0 && c; c = c->next) {
        if (!c->current)
            continue;
        nv[i] = strdup(c->name);
        if (!nv[i]) {
            rc = -ENOMEM;
            break;
        }
        iv[i++] = wckpt_ino(c, WTREE_ROOT);
    }
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        for (size_t j = 0; nv && j < i; j++)
            free(nv[j]);
        free(nv);
        free(iv);
        return rc;
    }
    *names = nv;
    *inos = iv;
    *n = i;
    return 0;
}

int wtable_mkdir(wtable *t, const char *name, uint32_t mode, wckpt **out)
{
    if (!wtable_name_ok(name))
        return strlen(name) + SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    pthread_mutex_lock(&t->lock);
    if (wc_by_name(t, name) || wc_pack_exists(t, name)) {
        pthread_mutex_unlock(&t->lock);
        return -EEXIST;
    }
    wckpt *c = wc_wckpt_new(t, name);
    int rc = c ? 0 : -ENOMEM;
    ckpt_err err = {0};
    struct timespec ts = wc_now_real();
    if (rc == 0)
        rc = wtree_init(&c->tree, mode, ts.tv_sec, (uint32_t)ts.tv_nsec);
    if (rc == 0) {
        c->next_blob_id = 1;
        rc = stage_create(&t->root, name, &c->dir, &err);
        if (rc)
            fslog_err("cannot start checkpoint '%s': %s", name, err.msg);
    }
    if (rc) {
        if (c)
            wc_wckpt_free(c);
        pthread_mutex_unlock(&t->lock);
        return rc;
    }
    c->state = WST_WRITING;
    c->meta_gen = 1; /* the root's mode and mtime */
    c->nlookup = 1;
    c->next = t->all;
    t->all = c;
    pthread_mutex_unlock(&t->lock);
    *out = c;
    return 0;
}

int wtable_rmdir(wtable *t, const char *name)
{
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    if (!c) {
        pthread_mutex_unlock(&t->lock);
        return -ENOENT;
    }
    pthread_mutex_lock(&c->lock);
    int rc = c->locked ? -EACCES : c->state == WST_PACKING ? -EBUSY : 0;
    if (rc == 0 && c->tree.nodes[WTREE_ROOT].n_children)
        rc = -ENOTEMPTY;
    if (rc == 0) {
        c->state = WST_DELETED;
        while (c->inflight)
            pthread_cond_wait(&c->changed, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == 0) {
        ckpt_err err = {0};
        c->current = 0;
        if (stage_remove(&t->root, &c->dir, &err) != 0)
            fslog_warn("checkpoint '%s' removed, but not all of its staging: %s", name, err.msg);
        wc_release_if_unused(t, c);
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int wtable_remove_pack(wtable *t, const char *name)
{
    char file[NAME_MAX + 1];
    if (!wtable_name_ok(name))
        return -ENOENT;
    snprintf(file, sizeof file, "%s" PACK_SUFFIX, name);
    if (unlinkat(t->backing_fd, file, 0) != 0)
        return -errno;
    if (fsync(t->backing_fd) != 0)
        return -errno;
    fslog_info("checkpoint '%s' deleted (%s/%s removed)", name, t->backing_path, file);
    return 0;
}

int wtable_rename(wtable *t, const char *from, const char *to, int noreplace)
{
    if (!wtable_name_ok(to))
        return strlen(to) + SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    if (strcmp(from, to) == 0)
        return 0;
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, from);
    int rc = 0;
    if (wc_by_name(t, to) || wc_pack_exists(t, to)) {
        /* Only an empty directory could be replaced; a checkpoint is not. */
        rc = noreplace ? -EEXIST : -ENOTEMPTY;
    } else if (c) {
        pthread_mutex_lock(&c->save_lock);
        pthread_mutex_lock(&c->lock);
        rc = c->state == WST_PACKING ? -EBUSY : 0;
        stage_state st = c->state == WST_FAILED ? STAGE_FAILED : STAGE_WRITING;
        char *error = c->error ? strdup(c->error) : NULL;
        pthread_mutex_unlock(&c->lock);
        ckpt_err err = {0};
        if (rc == 0)
            rc = stage_write_record(&t->root, &c->dir, to, st, error, &err);
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
            fslog_err("cannot rename checkpoint '%s': %s", from, err.msg);
        }
    } else if (wtable_name_ok(from) && wc_pack_exists(t, from)) {
        char a[NAME_MAX + 1], b[NAME_MAX + 1];
        snprintf(a, sizeof a, "%s" PACK_SUFFIX, from);
        snprintf(b, sizeof b, "%s" PACK_SUFFIX, to);
        if (renameat2(t->backing_fd, a, t->backing_fd, b, RENAME_NOREPLACE) != 0)
            rc = errno == EEXIST ? (noreplace ? -EEXIST : -ENOTEMPTY) : -errno;
        else if (fsync(t->backing_fd) != 0)
            rc = -errno;
    } else {
        rc = -ENOENT;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}
