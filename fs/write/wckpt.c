/* Writable checkpoints: lifetimes and the state machine (changes, saving,
 * commit). The table and the root's mkdir, rmdir and rename are in
 * wckpt_table.c, the packer and timer threads in wckpt_jobs.c, recovery in
 * wckpt_recover.c, the file operations inside a checkpoint in wckpt_ops.c;
 * wckpt.h describes the whole. */
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
#include "ckpt_mount.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "wckpt_internal.h"

double wc_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timespec wc_now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
}

const char *wstate_name(wstate s)
{
    switch (s) {
    case WST_WRITING:
        return CKPT_STATE_WRITING;
    case WST_PACKING:
        return CKPT_STATE_PACKING;
    case WST_COMMITTED:
        return CKPT_STATE_COMMITTED;
    case WST_FAILED:
        return CKPT_STATE_FAILED;
    case WST_DELETED:
        return "deleted";
    }
    return "unknown";
}

int wtable_name_ok(const char *name)
{
    return backing_path_ok(name);
}

/* A store's packs and prefixes; the staging directory's namespaces (made
 * with mkdir, nothing uploaded under them yet). */
static int store_kind(wtable *t, const char *name)
{
    int kind = packer_store_kind(t->store, name);
    if (kind)
        return kind == PACKER_NS         ? WC_NAMESPACE
               : kind == PACKER_PACK_DIR ? WC_PACK_DIR
                                         : WC_PACK_FILE;
    int dir = backing_open_parent(t->backing_fd, name, 0);
    struct stat st;
    if (dir >= 0 && fstatat(dir, backing_base(name), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode))
        kind = WC_NAMESPACE;
    if (dir >= 0)
        close(dir);
    return kind;
}

int wc_backing_kind(wtable *t, const char *name)
{
    if (t->opts.store)
        return store_kind(t, name);
    int dir = backing_open_parent(t->backing_fd, name, 0);
    if (dir < 0)
        return 0;
    const char *base = backing_base(name);
    char file[NAME_MAX + 1];
    struct stat st;
    int kind = 0;
    if (fstatat(dir, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
        kind = WC_NAMESPACE;
    if (!kind && backing_pack_name(base, 0, file, sizeof file) == 0 &&
        fstatat(dir, file, &st, AT_SYMLINK_NOFOLLOW) == 0)
        kind = WC_PACK_DIR;
    if (!kind && backing_pack_name(base, 1, file, sizeof file) == 0 &&
        fstatat(dir, file, &st, AT_SYMLINK_NOFOLLOW) == 0)
        kind = WC_PACK_FILE;
    close(dir);
    return kind;
}

int wc_pack_exists(wtable *t, const char *name)
{
    return wc_backing_kind(t, name) != 0;
}

uint32_t wckpt_entry_node(wckpt *c)
{
    if (!c->is_file)
        return WTREE_ROOT;
    pthread_mutex_lock(&c->lock);
    const wnode *root = &c->tree.nodes[WTREE_ROOT];
    uint32_t node = root->n_children ? root->children[0] : WTREE_NONE;
    pthread_mutex_unlock(&c->lock);
    return node;
}

uint64_t wckpt_entry_ino(wckpt *c)
{
    uint32_t node = wckpt_entry_node(c);
    return node == WTREE_NONE ? 0 : wckpt_ino(c, node);
}

void wc_set_error(wckpt *c, const char *msg)
{
    c->pack_retry_at = 0; /* whatever failed now, it is not the retried pack */
    free(c->error);
    c->error = msg ? strdup(msg) : NULL;
}

/* ---------------------------------------------------------- lifetimes */

static void wfile_free(wfile *f)
{
    if (!f)
        return;
    stage_blob_free(f->blob);
    free(f);
}

uint64_t wc_file_size(const wfile *f)
{
    return f->blob ? stage_blob_size(f->blob) : f->base_size;
}

int wc_copy_up(wckpt *c, uint32_t node, wfile *f, int keep)
{
    if (f->blob)
        return 0;
    ckpt_err err = {0};
    uint64_t id = c->next_blob_id;
    stage_blob *b = NULL;
    int rc = stage_blob_open(c->dir.data_fd, id, c->dir.key, 1, &b, &err);
    size_t cap = 1u << 20;
    char *buf = rc == 0 && keep && f->base_size ? malloc(cap) : NULL;
    if (rc == 0 && keep && f->base_size && !buf)
        rc = -ENOMEM;
    for (uint64_t off = 0; rc == 0 && keep && off < f->base_size;) {
        ssize_t n = ckpt_file_pread(c->base, (size_t)f->base_index, buf, cap, off, &err);
        if (n <= 0) {
            rc = n < 0 ? (int)n : -EIO;
            break;
        }
        ssize_t w = stage_blob_pwrite(b, buf, (size_t)n, off, &err);
        if (w != n) {
            rc = w < 0 ? (int)w : -EIO;
            break;
        }
        off += (uint64_t)n;
    }
    free(buf);
    if (rc) {
        if (b) {
            ckpt_err ignored;
            stage_blob_unlink(b, &ignored);
            stage_blob_free(b);
        }
        fslog_err("checkpoint '%s': cannot copy a packed file for writing: %s", c->name,
                  err.msg[0] ? err.msg : strerror(-rc));
        wc_staging_failed(c, rc, err.msg[0] ? err.msg : "copy for writing failed", WTREE_NONE, 0);
        return rc;
    }
    c->next_blob_id++;
    f->blob = b;
    f->base_index = -1;
    c->tree.nodes[node].blob_id = id;
    c->meta_gen++;
    return 0;
}

void wc_free_blobs(wckpt *c)
{
    for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
        wfile_free(c->tree.nodes[i].data);
        c->tree.nodes[i].data = NULL;
    }
}

void wc_wckpt_free(wckpt *c)
{
    /* Files the kernel never released (a forced unmount). */
    if (c->successor && c->successor_pinned && c->table->unpin_successor)
        c->table->unpin_successor(c->table->successor_ud, c->successor);
    if (c->successor && c->table->drop_successor)
        c->table->drop_successor(c->table->successor_ud, c->successor);
    wc_free_blobs(c);
    wtree_free(&c->tree);
    stage_dir_close(&c->dir);
    if (c->base)
        ckpt_close(c->base);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->save_lock);
    pthread_cond_destroy(&c->changed);
    free(c->name);
    free(c->error);
    free(c->failures);
    free(c);
}

/* Frees c once nothing can reach it. Called with t->lock held. */
void wc_release_if_unused(wtable *t, wckpt *c)
{
    if (c->current || c->refs || c->nlookup || c->pack_running)
        return;
    for (wckpt **link = &t->all; *link; link = &(*link)->next) {
        if (*link == c) {
            *link = c->next;
            break;
        }
    }
    wc_wckpt_free(c);
}

wckpt *wc_wckpt_new(wtable *t, const char *name)
{
    if (t->next_serial == UINT32_MAX)
        return NULL;
    wckpt *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = strdup(name);
    if (!c->name) {
        free(c);
        return NULL;
    }
    c->table = t;
    c->serial = t->next_serial++;
    c->current = 1;
    c->dir.fd = c->dir.data_fd = -1;
    c->last_change = wc_now_mono();
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->save_lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    return c;
}

/* A file's state, or NULL for a directory or a node without data. */
wfile *wc_file_of(wckpt *c, uint32_t node)
{
    wnode *n = wtree_node(&c->tree, node);
    return n && n->kind != WNODE_DIR ? n->data : NULL;
}

/* Frees a removed file's data once nothing uses it. */
void wc_drop_if_detached(wckpt *c, uint32_t node)
{
    wnode *n = wtree_node(&c->tree, node);
    wfile *f = n ? n->data : NULL;
    if (f && !n->linked && f->open == 0 && f->busy == 0) {
        wfile_free(f);
        n->data = NULL;
    }
}

/* ------------------------------------------------------ state changes */

/* Can the namespace or data change now? Called with c->lock held. */
int wc_modifiable(wckpt *c, const char *what)
{
    if (c->locked)
        return -EACCES;
    if (c->unsealed && c->state != WST_COMMITTED) {
        if (c->unsealed == 1)
            fslog_warn("checkpoint '%s': %s refused: it was staged without a key and this mount "
                       "has one, so what is written now would be staged in the clear; commit it "
                       "('ckpt commit'; its pack is encrypted), then write into it again",
                       c->name, what);
        c->unsealed = 2;
        return -EACCES;
    }
    switch (c->state) {
    case WST_WRITING:
    case WST_FAILED:
        return 0;
    case WST_PACKING:
        return wc_unpack(c, what);
    case WST_COMMITTED:
        return -EROFS;
    case WST_DELETED:
        break;
    }
    return -ENOENT;
}

int wc_unpack(wckpt *c, const char *what)
{
    if (c->state != WST_PACKING)
        return 0;
    if (c->pack_running) {
        __atomic_store_n(&c->cancel_pack, 1, __ATOMIC_RELAXED);
        while (c->pack_running)
            pthread_cond_wait(&c->changed, &c->lock);
    }
    if (c->state == WST_PACKING) { /* not started yet */
        c->state = WST_WRITING;
        c->commit_seq = 0;
        c->record_dirty = 1;
        c->meta_gen++;
        c->changed_since_commit = 1;
        c->last_change = wc_now_mono();
        fslog_info("checkpoint '%s': %s while it waited to be packed: it is writing again and "
                   "is packed once quiet",
                   c->name, what);
    }
    switch (c->state) {
    case WST_WRITING:
    case WST_FAILED:
        return c->locked ? -EACCES : 0;
    case WST_COMMITTED:
        /* Packed before it could stop: -ESTALE sends the caller to the pack,
         * whose change reopens it (late writes never fail). */
        return -ESTALE;
    default:
        return -ENOENT;
    }
}

/* Called with c->lock held after a change succeeded. Only data arms the
 * auto-commit: a writer that makes its directories, then spends a while
 * before the first file, must not see an empty checkpoint committed. (A
 * reopened one is armed from its reopening: wtable_reopen.) */
void wc_touched(wckpt *c, int namespace)
{
    c->tries_current = 0; /* a pack of an earlier try is replaced, not taken */
    if (!namespace)
        c->changed_since_commit = 1;
    c->last_change = wc_now_mono();
    if (namespace)
        c->meta_gen++;
    if (c->state == WST_FAILED && !namespace && c->n_failures == 0 && !c->failures_lost) {
        /* New data after a failed pack: the failure was about what came
         * before. A staging failure waits for wc_staging_repaired. */
        c->state = WST_WRITING;
        c->record_dirty = 1;
        c->meta_gen++;
        fslog_info("checkpoint '%s': new data written; state is writing again", c->name);
    }
}

void wc_mark_mtime(wnode *n)
{
    struct timespec ts = wc_now_real();
    n->mtime_sec = ts.tv_sec;
    n->mtime_nsec = (uint32_t)ts.tv_nsec;
}

/* Records a failure of the staging disk (c->lock held): bytes first..last
 * of node are missing. */
static void staging_failed(wckpt *c, int rc, const char *msg, uint32_t node, uint64_t first,
                           uint64_t last)
{
    if (rc != -ENOSPC && rc != -EDQUOT && rc != -EIO)
        return;
    /* Packed already (a close parking its blob as the commit lands):
     * nothing staged is needed any more, and the state must stay. */
    if (c->state == WST_COMMITTED || c->state == WST_DELETED)
        return;
    if (c->state != WST_FAILED || !c->error || strcmp(c->error, msg) != 0)
        fslog_err("checkpoint '%s': %s; state is now failed (staged data is kept: free space, "
                  "rewrite what failed and run 'ckpt commit' to retry)",
                  c->name, msg);
    size_t i = 0;
    while (i < c->n_failures && (c->failures[i].node != node || c->failures[i].first != first ||
                                 c->failures[i].last != last))
        i++;
    if (i == c->n_failures) {
        stage_failure *grown = realloc(c->failures, (c->n_failures + 1) * sizeof *grown);
        if (grown) {
            c->failures = grown;
            c->failures[c->n_failures++] = (stage_failure){node, first, last};
        } else {
            c->failures_lost = 1;
        }
    }
    c->state = WST_FAILED;
    wc_set_error(c, msg);
    c->record_dirty = 1;
    c->meta_gen++;
}

void wc_staging_failed(wckpt *c, int rc, const char *msg, uint32_t node, uint64_t off)
{
    staging_failed(c, rc, msg, node, off, off);
}

void wc_staging_write_failed(wckpt *c, int rc, const char *msg, uint32_t node, uint64_t off,
                             size_t len)
{
    uint64_t last = len && off <= UINT64_MAX - len ? off + len - 1 : off;
    staging_failed(c, rc, msg, node, off, last);
}

/* Bytes first..last of node are good again: a failure is made good when
 * all its missing bytes are; a rewrite of part of them leaves the rest
 * (two pieces when it covers the middle; left whole if the list cannot
 * grow for the second). */
void wc_staging_repaired(wckpt *c, uint32_t node, uint64_t first, uint64_t last)
{
    size_t kept = 0, before = c->n_failures;
    for (size_t i = 0; i < before; i++) {
        stage_failure f = c->failures[i];
        if (f.node != node) {
            c->failures[kept++] = f;
            continue;
        }
        if (first <= f.first && f.last <= last)
            continue;
        if (first <= f.first && f.first <= last) {
            f.first = last + 1;
        } else if (first <= f.last && f.last <= last) {
            f.last = first - 1;
        } else if (f.first < first && last < f.last) {
            stage_failure *grown = realloc(c->failures, (c->n_failures + 1) * sizeof *c->failures);
            if (grown) {
                c->failures = grown;
                grown[c->n_failures++] = (stage_failure){node, last + 1, f.last};
                f.last = first - 1;
            }
        }
        c->failures[kept++] = f;
    }
    /* The pieces split off above, after the ones kept. */
    for (size_t i = before; i < c->n_failures; i++)
        c->failures[kept++] = c->failures[i];
    c->n_failures = kept;
    if (kept || kept == before || c->failures_lost || c->state != WST_FAILED)
        return;
    c->state = WST_WRITING;
    wc_set_error(c, NULL);
    c->record_dirty = 1;
    c->meta_gen++;
    fslog_info("checkpoint '%s': what failed is made good (rewritten, cut off, removed or "
               "saved); state is writing again",
               c->name);
}

void wc_staging_forget_failures(wckpt *c)
{
    free(c->failures);
    c->failures = NULL;
    c->n_failures = 0;
    c->failures_lost = 0;
}

/* Writes the namespace and, if needed, the record, unless nothing changed
 * since the last wc_save. The tree is encoded under the lock, written without. */
static int save(wckpt *c, int final, ckpt_err *err)
{
    pthread_mutex_lock(&c->lock);
    if (final && c->state == WST_FAILED)
        c->meta_gen++; /* its failures, saved as complete this time */
    if (c->locked || c->state == WST_COMMITTED || c->state == WST_DELETED ||
        (c->saved_gen == c->meta_gen && !c->record_dirty)) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    uint64_t gen = c->meta_gen;
    int write_record = c->record_dirty;
    wstate state = c->state;
    char *name = strdup(c->name), *error = c->error ? strdup(c->error) : NULL;
    c->record_dirty = 0;
    c->last_save = wc_now_mono();
    uint8_t *buf = NULL;
    size_t len = 0;
    stage_failures f = {c->failures, c->n_failures,
                        c->failures_lost || (!final && c->state == WST_FAILED), NULL};
    int rc = name ? stage_encode_meta(&c->dir, &c->tree, c->next_blob_id, &f, &buf, &len) : -ENOMEM;
    pthread_mutex_unlock(&c->lock);
    if (rc) {
        free(name);
        free(error);
        return ckpt_fail(err, rc, "checkpoint '%s': out of memory", c->name);
    }
    pthread_mutex_lock(&c->save_lock);
    /* A commit may have come between: its record (written under
     * save_lock) must not be overwritten with an older state. */
    pthread_mutex_lock(&c->lock);
    int same_state = c->state == state;
    pthread_mutex_unlock(&c->lock);
    if (c->saved_gen < gen)
        rc = stage_write_meta(&c->dir, buf, len, err);
    if (rc == 0 && write_record && same_state)
        rc = stage_write_record(&c->table->root, &c->dir, name,
                                state == WST_FAILED ? STAGE_FAILED : STAGE_WRITING, error, err);
    if (rc == 0 && c->saved_gen < gen)
        c->saved_gen = gen;
    pthread_mutex_unlock(&c->save_lock);
    free(buf);
    free(name);
    free(error);
    pthread_mutex_lock(&c->lock);
    if (rc) {
        if (write_record)
            c->record_dirty = 1;
        wc_staging_failed(c, rc, err->msg, WTREE_NONE, 0);
    } else if (c->saved_gen >= gen) {
        /* The namespace as of gen is on disk: an earlier failed save is
         * made good. */
        wc_staging_repaired(c, WTREE_NONE, 0, UINT64_MAX);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wc_save(wckpt *c, ckpt_err *err)
{
    return save(c, 0, err);
}

int wc_save_final(wckpt *c, ckpt_err *err)
{
    return save(c, 1, err);
}

int wtable_commit(wtable *t, wckpt *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->locked) {
        pthread_mutex_unlock(&c->lock);
        return -EACCES;
    }
    if (c->state == WST_PACKING || c->state == WST_COMMITTED) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    if (c->state == WST_DELETED) {
        pthread_mutex_unlock(&c->lock);
        return -ENOENT;
    }
    wstate was = c->state;
    c->state = WST_PACKING;
    c->commit_seq = 0; /* not for the packer until the record says packing */
    c->busy_logged = 0;
    c->changed_since_commit = 0;
    /* Writes already past the state check finish before the snapshot. */
    while (c->inflight)
        pthread_cond_wait(&c->changed, &c->lock);
    if (c->state != WST_PACKING) {
        /* One of them failed after its writer was told it worked: the
         * checkpoint is failed, and a pack now would miss those bytes
         * (-EIO). Or a new change came meanwhile and made it writing
         * again (wc_unpack), as it would have stopped the packing: no
         * I/O failed, it is busy being written (-EBUSY). */
        int rc = c->state == WST_FAILED ? -EIO : -EBUSY;
        if (rc == -EBUSY)
            fslog_info("checkpoint '%s': written to while its commit waited for the writes under "
                       "way: it is writing again",
                       c->name);
        c->changed_since_commit = 1;
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    /* Saved without failures: a commit hands them all to the packer
     * (wc_staging_forget_failures), so after a failed pack new data makes
     * the checkpoint writing again. Marked incomplete all the same: a
     * staging failure after that pack's may not reach the disk before a
     * crash (wc_save). */
    stage_failures none = {NULL, 0, 1, NULL};
    int rc = stage_encode_meta(&c->dir, &c->tree, c->next_blob_id, &none, &buf, &len);
    uint64_t gen = c->meta_gen;
    char *name = strdup(c->name);
    pthread_mutex_unlock(&c->lock);
    ckpt_err err = {0};
    if (rc == 0 && !name)
        rc = -ENOMEM;
    if (rc)
        ckpt_fail(&err, rc, "checkpoint '%s': out of memory", c->name);
    pthread_mutex_lock(&c->save_lock);
    /* No try is under way until the packer notes one (note_trying). */
    pthread_mutex_lock(&c->lock);
    stage_end_try(&c->dir, 0);
    pthread_mutex_unlock(&c->lock);
    /* The namespace first: a record saying "packing" promises it. */
    if (rc == 0)
        rc = stage_write_meta(&c->dir, buf, len, &err);
    if (rc == 0)
        rc = stage_write_record(&t->root, &c->dir, name, STAGE_PACKING, NULL, &err);
    if (rc == 0 && c->saved_gen < gen)
        c->saved_gen = gen;
    pthread_mutex_unlock(&c->save_lock);
    free(buf);
    free(name);
    pthread_mutex_lock(&t->lock);
    pthread_mutex_lock(&c->lock);
    if (rc) {
        c->state = was == WST_FAILED ? WST_FAILED : WST_WRITING;
        wc_staging_failed(c, rc, err.msg, WTREE_NONE, 0);
        if (c->state != WST_FAILED)
            fslog_err("checkpoint '%s': cannot commit: %s", c->name, err.msg);
    } else {
        wc_set_error(c, NULL);
        wc_staging_forget_failures(c);
        c->record_dirty = 0;
        c->commit_seq = ++t->commit_seq;
        /* What status shows while it waits for the packer. */
        uint64_t total = 0;
        for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
            const wnode *n = &c->tree.nodes[i];
            if (n->linked && n->kind == WNODE_FILE && n->data)
                total += wc_file_size(n->data);
        }
        c->pack_done = 0;
        c->pack_total = total;
        pthread_cond_signal(&t->wake);
    }
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&t->lock);
    return rc;
}
