/* The two threads behind writable checkpoints: the packer, which packs
 * committed checkpoints one at a time in commit order (each with all cores),
 * and the timer, which commits quiet checkpoints, saves changed namespaces
 * and parks idle files. */
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
#include "common/links.h"
#include "wckpt_internal.h"

/* How often the timer looks for quiet checkpoints and unsaved namespaces. */
#define TICK_SECONDS 0.2
#define PACK_RETRY_FIRST 2.0
#define PACK_RETRY_MAX 30.0
/* A changed namespace is saved at most this often without an fsync. */
#define SAVE_INTERVAL 1.0
/* Idle files give back their descriptor (and buffers) after this long. */
#define PARK_AFTER 5.0

/* --------------------------------------------------------- the packer */

static void pack_progress(void *ud, uint64_t done, uint64_t total)
{
    wckpt *c = ud;
    __atomic_store_n(&c->pack_total, total, __ATOMIC_RELAXED);
    __atomic_store_n(&c->pack_done, done, __ATOMIC_RELAXED);
}

/* The files to pack, in pack order (c->lock held). */
static int snapshot_files(wckpt *c, packer_file **out, size_t *n)
{
    uint32_t *ids;
    size_t count;
    int rc = wtree_files_sorted(&c->tree, &ids, &count);
    if (rc)
        return rc;
    packer_file *files = calloc(count ? count : 1, sizeof *files);
    if (!files) {
        free(ids);
        return -ENOMEM;
    }
    for (size_t i = 0; rc == 0 && i < count; i++) {
        const wnode *node = &c->tree.nodes[ids[i]];
        wfile *f = node->data;
        size_t len = wtree_path_len(&c->tree, ids[i]);
        files[i].path = malloc(len + 1);
        if (!files[i].path || !f) {
            rc = files[i].path ? -EIO : -ENOMEM;
            break;
        }
        wtree_path(&c->tree, ids[i], files[i].path, len + 1);
        files[i].blob = f->blob;
        files[i].base = c->base;
        files[i].base_index = f->blob ? 0 : (size_t)f->base_index;
        files[i].size = wc_file_size(f);
        files[i].mode = node->mode;
        files[i].mtime_sec = node->mtime_sec;
        files[i].mtime_nsec = node->mtime_nsec;
    }
    free(ids);
    if (rc) {
        packer_files_free(files, count);
        return rc;
    }
    *out = files;
    *n = count;
    return 0;
}

/* The links of c as LINKS_FILE's bytes, or NULL (c->lock held). */
static int snapshot_links(wckpt *c, char **out, size_t *len)
{
    uint32_t *ids;
    size_t n;
    *out = NULL;
    *len = 0;
    int rc = wtree_links_sorted(&c->tree, &ids, &n);
    if (rc || n == 0) {
        free(ids);
        return rc;
    }
    link_entry *v = calloc(n, sizeof *v);
    char **bufs = calloc(n, sizeof *bufs);
    if (!v || !bufs)
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const wnode *node = &c->tree.nodes[ids[i]];
        const wfile *f = node->data;
        size_t plen = wtree_path_len(&c->tree, ids[i]);
        char *path = malloc(plen + 1 + LINK_TARGET_MAX + 1);
        if (!path || !f || !f->blob) {
            free(path);
            rc = path ? -EIO : -ENOMEM;
            break;
        }
        bufs[i] = path;
        wtree_path(&c->tree, ids[i], path, plen + 1);
        char *target = path + plen + 1;
        ckpt_err err = {0};
        ssize_t got = stage_blob_pread(f->blob, target, LINK_TARGET_MAX, 0, &err);
        if (got <= 0) {
            rc = got < 0 ? (int)got : -EIO;
            break;
        }
        target[got] = '\0';
        v[i] = (link_entry){path, target, node->mtime_sec, node->mtime_nsec};
    }
    if (rc == 0)
        rc = links_encode(v, n, out, len);
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(v);
    free(ids);
    return rc;
}

/* The record says which try is under way before its pack can be made: a
 * crash's recovery takes a pack under the name for this packing's commit
 * only by this id, never by an earlier try's (whose checkpoint may have
 * changed since), so staging is not deleted under a stale pack. */
static int note_trying(void *ud, const uint8_t id[16], ckpt_err *err)
{
    wckpt *c = ud;
    pthread_mutex_lock(&c->save_lock);
    pthread_mutex_lock(&c->lock);
    memcpy(c->dir.trying, id, 16);
    c->dir.has_trying = 1;
    char *name = strdup(c->name);
    pthread_mutex_unlock(&c->lock);
    int rc = name ? stage_write_record(&c->table->root, &c->dir, name, STAGE_PACKING, NULL, err)
                  : ckpt_fail(err, -ENOMEM, "checkpoint '%s': out of memory", c->name);
    pthread_mutex_unlock(&c->save_lock);
    free(name);
    return rc;
}

static void pack_one(wtable *t, wckpt *c)
{
    packer_file *files = NULL;
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    int rc = snapshot_files(c, &files, &n);
    char *links = NULL;
    size_t links_len = 0;
    if (rc == 0)
        rc = snapshot_links(c, &links, &links_len);
    int64_t links_sec = c->tree.nodes[WTREE_ROOT].mtime_sec;
    uint32_t links_nsec = c->tree.nodes[WTREE_ROOT].mtime_nsec;
    c->pack_started = wc_now_mono();
    uint64_t total = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        total += files[i].size;
    pack_progress(c, 0, total);
    char *name = strdup(c->name);
    int replaces = c->dir.replaces;
    /* dir.tried changes only here, under both locks. */
    uint8_t tried[STAGE_TRIED_MAX][16];
    size_t n_tried = c->dir.n_tried, n_tried_current = c->tries_current;
    memcpy(tried, c->dir.tried, sizeof tried);
    pthread_mutex_unlock(&c->lock);
    int commit_sent = 0, found_earlier = 0;
    ckpt_err err = {0};
    if (rc || !name) {
        ckpt_fail(&err, rc ? rc : -ENOMEM, "checkpoint '%s': %s", c->name,
                  rc == -EIO ? "a file has no staged data" : "out of memory");
        rc = err.code;
    } else {
        packer_job job = {
            .backing_fd = t->backing_fd,
            .backing_path = t->backing_path,
            .store = t->store,
            .remote = t->opts.store != NULL,
            .name = name,
            .is_file = c->is_file,
            .replace = replaces,
            .files = files,
            .n_files = n,
            .links = links,
            .links_len = links_len,
            .links_mtime_sec = links_sec,
            .links_mtime_nsec = links_nsec,
            .key = mount_key_get(t->key),
            .cipher = t->opts.cipher,
            .threads = t->opts.pack_threads,
            .progress = pack_progress,
            .progress_ud = c,
            .cancel = &t->cancel_packing,
            .cancel_one = &c->cancel_pack,
            .tried = tried,
            .n_tried = n_tried,
            .n_tried_current = n_tried_current,
            .commit_sent = &commit_sent,
            .found_earlier = &found_earlier,
            .trying = t->opts.store ? note_trying : NULL,
        };
        double start = wc_now_mono();
        rc = packer_run(&job, &err);
        if (rc == 0 && found_earlier) {
            pack_progress(c, total, total);
            fslog_info("checkpoint '%s' committed: %zu files, %.1f MB, its pack an earlier "
                       "try's (nothing uploaded again)",
                       name, n, (double)total / 1e6);
        } else if (rc == 0)
            fslog_info("checkpoint '%s' committed: %zu files, %.1f MB packed in %.2f s%s", name, n,
                       (double)c->pack_total / 1e6, wc_now_mono() - start,
                       replaces ? " (written to after its commit: this new generation of "
                                  "its pack replaced the old one)"
                                : "");
    }
    packer_files_free(files, n);
    free(links);

    if (rc == 0) {
        /* From now on the name means the pack. */
        ckpt_err rm_err = {0};
        if (t->pack_changed)
            t->pack_changed(t->successor_ud, name);
        pthread_mutex_lock(&t->lock);
        pthread_mutex_lock(&c->lock);
        c->state = WST_COMMITTED;
        c->current = 0;
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_unlock(&t->lock);
        pthread_mutex_lock(&c->lock);
        /* Reads that started before the state changed finish first. */
        while (c->inflight)
            pthread_cond_wait(&c->changed, &c->lock);
        wc_free_blobs(c);
        /* The generation it replaced: let go, so its space comes back
         * (readers of it hold the read side's descriptor). */
        if (c->base) {
            ckpt_close(c->base);
            c->base = NULL;
        }
        pthread_mutex_unlock(&c->lock);
        /* The pack is durable; a crash before this removal is finished by
         * recovery (a "packing" record with its pack in place). */
        if (stage_remove(&t->root, &c->dir, &rm_err) != 0)
            fslog_warn("checkpoint '%s': %s (removed at the next mount)", name, rm_err.msg);
        /* Before the kernel is told: files open since before the commit
         * go on reading this generation, whatever replaces it later. */
        pthread_mutex_lock(&c->lock);
        int open_files = c->open_files > 0;
        pthread_mutex_unlock(&c->lock);
        if (open_files && t->pin_successor)
            t->pin_successor(t->successor_ud, c);
    } else if (rc == -ECANCELED) {
        /* Stopped: a later record tells no try under way (one written to
         * since must not be taken for this try's pack). Nothing to keep as
         * tried: the stop is polled while files are read, before the
         * commit is sent, and no request of the commit ends in -ECANCELED. */
        pthread_mutex_lock(&c->save_lock);
        pthread_mutex_lock(&c->lock);
        stage_end_try(&c->dir, 0);
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_unlock(&c->save_lock);
        if (__atomic_load_n(&c->cancel_pack, __ATOMIC_RELAXED))
            fslog_info("checkpoint '%s': written to while it was being packed: packing stopped; "
                       "it is writing again and is packed once quiet",
                       name ? name : c->name);
    } else {
        fslog_err("checkpoint '%s': packing failed: %s", name ? name : c->name, err.msg);
        ckpt_err rec_err = {0};
        pthread_mutex_lock(&c->save_lock);
        /* Its Complete (or its one PUT) may have taken unanswered: a retry
         * that finds this pack under the name knows it for its own
         * (packer_run). A try that never sent it made nothing, and is not
         * kept: tries failing at once through an outage would push out
         * the one that counts. A commit is sent only after note_trying,
         * so a try is under way when it was. */
        pthread_mutex_lock(&c->lock);
        stage_end_try(&c->dir, commit_sent);
        if (commit_sent && c->tries_current < c->dir.n_tried)
            c->tries_current++;
        pthread_mutex_unlock(&c->lock);
        if (stage_write_record(&t->root, &c->dir, name ? name : c->name, STAGE_FAILED, err.msg,
                               &rec_err) != 0) {
            fslog_err("checkpoint '%s': %s", c->name, rec_err.msg);
            /* Still "packing" on disk: the next save writes it (wc_save). */
            pthread_mutex_lock(&c->lock);
            c->record_dirty = 1;
            pthread_mutex_unlock(&c->lock);
        }
        pthread_mutex_unlock(&c->save_lock);
    }
    pthread_mutex_lock(&t->lock);
    pthread_mutex_lock(&c->lock);
    c->pack_running = 0;
    /* Still "packing" on disk: wtable_stop says so, the next start packs
     * it again. */
    c->pack_suspended = rc == -ECANCELED;
    if (rc == -ECANCELED && c->cancel_pack) {
        /* Written to: back to writing, for the writer waiting on it. */
        c->pack_suspended = 0;
        c->cancel_pack = 0;
        c->state = WST_WRITING;
        c->commit_seq = 0;
        c->record_dirty = 1;
        c->meta_gen++;
        c->changed_since_commit = 1;
        c->last_change = wc_now_mono();
    }
    if (rc != 0 && rc != -ECANCELED) {
        c->state = WST_FAILED;
        wc_set_error(c, err.msg);
        /* The store's outage is not the checkpoint's fault: its staged
         * files stay, and it is packed again, as often as the outage
         * lets a try fail at once (the store refuses requests while it
         * is down) and no more often than every PACK_RETRY_MAX once it
         * answers "try later". */
        if (err.transient && t->opts.store) {
            double wait = c->pack_retry_wait ? c->pack_retry_wait * 2 : PACK_RETRY_FIRST;
            c->pack_retry_wait = wait < PACK_RETRY_MAX ? wait : PACK_RETRY_MAX;
            c->pack_retry_at = wc_now_mono() + c->pack_retry_wait;
            fslog_info("checkpoint '%s': packed again in %.0f s (its staged files stay; "
                       "ckpt commit tries at once)",
                       c->name, c->pack_retry_wait);
        }
    } else if (rc == 0) {
        c->pack_retry_wait = 0;
    }
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    wc_release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
    /* The kernel is told only now, with pack_running cleared: it takes the
     * lock of the directory holding the checkpoint, which a rename(2) of
     * the checkpoint holds while the daemon answers it, and that answer
     * may wait for pack_running (wc_unpack): told earlier, a rename that
     * came as the pack ended hung the mount for good (tmp-step-100 renamed
     * to step-100 after the save). */
    if (rc == 0 && name && t->committed)
        t->committed(t->successor_ud, name);
    free(name);
}

void *wc_packer_main(void *arg)
{
    wtable *t = arg;
    pthread_setname_np(pthread_self(), "ckptfs-packer");
    long aborts_due = 0;
    pthread_mutex_lock(&t->lock);
    while (!t->stopping) {
        wckpt *next = NULL;
        for (wckpt *c = t->all; c; c = c->next) {
            pthread_mutex_lock(&c->lock);
            if (c->state == WST_PACKING && c->commit_seq && !c->pack_running && !c->locked &&
                (!next || c->commit_seq < next->commit_seq))
                next = c;
            pthread_mutex_unlock(&c->lock);
        }
        if (!next && aborts_due) {
            /* The uploads an outage left: their aborts are sent again once
             * the store answers (it is probed at most every 2 s). */
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += 2;
            pthread_cond_timedwait(&t->wake, &t->lock, &until);
            if (t->stopping)
                break; /* what is still due is the next writable mount's */
            pthread_mutex_unlock(&t->lock);
            aborts_due = ckpt_store_retry_aborts(t->store);
            pthread_mutex_lock(&t->lock);
            continue;
        }
        if (!next) {
            pthread_cond_wait(&t->wake, &t->lock);
            continue;
        }
        /* Under the checkpoint's lock, where wc_unpack reads it: a writer
         * that finds the pack running from here on asks to cancel it, and
         * the request must not be cleared after (it was, in pack_one, so
         * such a writer waited for the whole pack and then got EROFS). */
        pthread_mutex_lock(&next->lock);
        next->pack_running = 1;
        __atomic_store_n(&next->cancel_pack, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&next->lock);
        pthread_mutex_unlock(&t->lock);
        pack_one(t, next);
        /* Any abort the pack left is sent from the wait above, which
         * unmounting ends without sending it. */
        aborts_due = 1;
        pthread_mutex_lock(&t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* ---------------------------------------------------------- the timer */

/* Closes descriptors of files nobody used for a while (c->lock held). */
static void park_idle(wckpt *c, double now)
{
    for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
        wfile *f = c->tree.nodes[i].kind != WNODE_DIR ? c->tree.nodes[i].data : NULL;
        if (f && f->blob && !f->open && !f->busy && f->last_use && now - f->last_use > PARK_AFTER) {
            ckpt_err err = {0};
            if (stage_blob_park(f->blob, &err) == 0)
                f->last_use = 0;
        }
    }
}

static void tick(wtable *t, double *last_park)
{
    pthread_mutex_lock(&t->lock);
    size_t n = 0;
    for (wckpt *c = t->all; c; c = c->next)
        n++;
    wckpt **list = calloc(n ? n : 1, sizeof *list);
    n = 0;
    for (wckpt *c = t->all; list && c; c = c->next) {
        if (!c->current)
            continue;
        c->refs++;
        list[n++] = c;
    }
    pthread_mutex_unlock(&t->lock);
    double now = wc_now_mono();
    int park = now - *last_park >= PARK_AFTER;
    if (park)
        *last_park = now;
    for (size_t i = 0; i < n; i++) {
        wckpt *c = list[i];
        pthread_mutex_lock(&c->lock);
        int quiet = c->state == WST_WRITING && !c->locked && t->opts.commit_delay > 0 &&
                    c->changed_since_commit && c->open_writers == 0 && c->inflight == 0 &&
                    now - c->last_change >= t->opts.commit_delay;
        int unsaved =
            (c->saved_gen != c->meta_gen || c->record_dirty) && now - c->last_save >= SAVE_INTERVAL;
        int retry =
            c->state == WST_FAILED && !c->locked && c->pack_retry_at && now >= c->pack_retry_at;
        if (retry)
            c->pack_retry_at = 0; /* pack_one sets it again if this try fails the same way */
        if (park)
            park_idle(c, now);
        pthread_mutex_unlock(&c->lock);
        if (quiet) {
            fslog_info(
                "checkpoint '%s': nothing open for writing or changed for %.1f s: committing",
                c->name, t->opts.commit_delay);
            wtable_commit(t, c);
        } else if (retry) {
            fslog_info("checkpoint '%s': packing it again (the store did not answer the last try)",
                       c->name);
            wtable_commit(t, c);
        } else if (unsaved) {
            ckpt_err err = {0};
            if (wc_save(c, &err) != 0)
                fslog_err("checkpoint '%s': cannot save its namespace: %s", c->name, err.msg);
        }
    }
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < n; i++) {
        list[i]->refs--;
        wc_release_if_unused(t, list[i]);
    }
    pthread_mutex_unlock(&t->lock);
    free(list);
}

void *wc_timer_main(void *arg)
{
    wtable *t = arg;
    pthread_setname_np(pthread_self(), "ckptfs-timer");
    double last_park = wc_now_mono();
    pthread_mutex_lock(&t->lock);
    while (!t->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(TICK_SECONDS * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->timer_wake, &t->lock, &until);
        if (t->stopping)
            break;
        pthread_mutex_unlock(&t->lock);
        tick(t, &last_park);
        pthread_mutex_lock(&t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}
