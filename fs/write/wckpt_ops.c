/* File operations inside a writable checkpoint: the namespace under the
 * checkpoint's lock, data I/O on the staged blobs without it. One job at
 * about 600 lines, one FUSE operation a function. */
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
#include "common/fslog.h"
#include "common/links.h"
#include "wckpt_internal.h"

/* ------------------------------------------------- inside a checkpoint */

static void fill_attr(wckpt *c, uint32_t node, struct stat *st)
{
    const wnode *n = &c->tree.nodes[node];
    memset(st, 0, sizeof *st);
    st->st_mtim.tv_sec = n->mtime_sec;
    st->st_mtim.tv_nsec = n->mtime_nsec;
    st->st_atim.tv_sec = n->atime_sec;
    st->st_atim.tv_nsec = n->atime_nsec;
    st->st_ctim = st->st_mtim;
    st->st_blksize = WCKPT_WRITE_SIZE;
    if (n->kind == WNODE_DIR) {
        st->st_mode = S_IFDIR | n->mode;
        st->st_nlink = 1; /* unknown, as on the root: find must not guess */
        return;
    }
    const wfile *f = n->data;
    st->st_mode = (n->kind == WNODE_LINK ? S_IFLNK : S_IFREG) | n->mode;
    st->st_nlink = n->linked ? 1 : 0;
    if (f) {
        st->st_size = (off_t)wc_file_size(f);
        st->st_blocks =
            (blkcnt_t)(((f->blob ? stage_blob_disk_bytes(f->blob) : f->base_size) + 511) / 512);
    }
}

/* A file removed while open (a descriptor still uses it): it lives on
 * through that descriptor, also once its checkpoint is gone (a file
 * checkpoint unlinked while open, as tempfile.TemporaryFile does). */
static int open_detached(wckpt *c, uint32_t node)
{
    const wnode *n = wtree_node(&c->tree, node);
    return n && n->kind != WNODE_DIR && !n->linked && n->data;
}

/* The node, if it can be looked at: -EACCES when locked, -ESTALE once
 * the checkpoint is committed or gone (callers then look at the pack),
 * except a file of a deleted checkpoint that is still open. */
static int usable(wckpt *c, uint32_t node)
{
    if (c->state == WST_DELETED && open_detached(c, node))
        return 0;
    if (c->state == WST_COMMITTED || c->state == WST_DELETED)
        return -ESTALE;
    if (c->locked)
        return node == WTREE_ROOT ? 0 : -EACCES;
    return node < c->tree.n_nodes ? 0 : -ESTALE;
}

/* wc_modifiable for a change to node, which usable let through: the open
 * file of a deleted checkpoint changes freely, as an unlinked file does on
 * any filesystem (its checkpoint has nothing left to stage or pack). */
static int node_modifiable(wckpt *c, const char *what)
{
    return c->state == WST_DELETED ? 0 : wc_modifiable(c, what);
}

int wckpt_getattr(wckpt *c, uint32_t node, struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, node);
    if (rc == 0)
        fill_attr(c, node, st);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_lookup(wckpt *c, uint32_t dir, const char *name, uint32_t *node, struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, dir);
    if (rc == 0 && c->locked)
        rc = -EACCES;
    if (rc == 0 && c->tree.nodes[dir].kind != WNODE_DIR)
        rc = -ENOTDIR;
    if (rc == 0) {
        *node = wtree_lookup(&c->tree, dir, name);
        if (*node == WTREE_NONE)
            rc = -ENOENT;
        else
            fill_attr(c, *node, st);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* A new file (open, for create) or link (its target staged as its bytes). */
static int make_node(wckpt *c, uint32_t dir, const char *name, uint32_t mode, const char *target,
                     uint32_t *node, struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    int rc = wc_modifiable(c, target ? "making a link" : "creating a file");
    if (rc == 0 && dir == WTREE_ROOT && !c->is_file && strcmp(name, LINKS_FILE) == 0) {
        fslog_warn("checkpoint '%s': '%s' is reserved for the links of a checkpoint", c->name,
                   name);
        rc = -EPERM;
    }
    wfile *f = NULL;
    ckpt_err err = {0};
    uint64_t id = c->next_blob_id;
    if (rc == 0 && wtree_lookup(&c->tree, dir, name) != WTREE_NONE)
        rc = -EEXIST;
    if (rc == 0 && !(f = calloc(1, sizeof *f)))
        rc = -ENOMEM;
    if (rc == 0) {
        f->base_index = -1;
        rc = stage_blob_open(c->dir.data_fd, id, c->dir.key, 1, &f->blob, &err);
        if (rc) {
            wc_staging_failed(c, rc, err.msg, WTREE_NONE, 0);
            fslog_err("checkpoint '%s': %s", c->name, err.msg);
        }
    }
    if (rc == 0) {
        struct timespec ts = wc_now_real();
        rc = wtree_add(&c->tree, dir, name, target ? WNODE_LINK : WNODE_FILE, target ? 0777 : mode,
                       ts.tv_sec, (uint32_t)ts.tv_nsec, id, node);
        if (rc == 0 && target) {
            ssize_t n = stage_blob_pwrite(f->blob, target, strlen(target), 0, &err);
            rc = n == (ssize_t)strlen(target) ? stage_blob_park(f->blob, &err)
                 : n < 0                      ? (int)n
                                              : -EIO;
            if (rc) {
                uint32_t gone;
                wtree_remove(&c->tree, dir, name, 0, &gone);
                wc_staging_failed(c, rc, err.msg, WTREE_NONE, 0);
            }
        }
        if (rc) {
            stage_blob_unlink(f->blob, &err);
            stage_blob_free(f->blob);
            f->blob = NULL;
        }
    }
    if (rc == 0) {
        c->next_blob_id++;
        f->open = target ? 0 : 1;
        f->last_use = wc_now_mono();
        c->tree.nodes[*node].data = f;
        f = NULL;
        c->open_files += target ? 0 : 1;
        c->open_writers += target ? 0 : 1;
        wc_mark_mtime(&c->tree.nodes[dir]);
        wc_touched(c, 1);
        wc_touched(c, 0); /* a file or link, even empty, arms the commit */
        fill_attr(c, *node, st);
    }
    free(f);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_create(wckpt *c, uint32_t dir, const char *name, uint32_t mode, uint32_t *node,
                 struct stat *st)
{
    return make_node(c, dir, name, mode, NULL, node, st);
}

int wckpt_symlink(wckpt *c, uint32_t dir, const char *name, const char *target, uint32_t *node,
                  struct stat *st)
{
    int rc = link_target_check(target);
    return rc ? rc : make_node(c, dir, name, 0777, target, node, st);
}

int wckpt_readlink(wckpt *c, uint32_t node, char *buf, size_t cap)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, node);
    if (rc == 0 && c->locked)
        rc = -EACCES;
    if (rc == 0 && c->tree.nodes[node].kind != WNODE_LINK)
        rc = -EINVAL;
    wfile *f = rc == 0 ? wc_file_of(c, node) : NULL;
    if (rc == 0 && (!f || !f->blob))
        rc = -EIO;
    if (rc == 0) {
        ckpt_err err = {0};
        ssize_t n = stage_blob_pread(f->blob, buf, cap - 1, 0, &err);
        rc = n < 0 ? (int)n : 0;
        if (n >= 0)
            buf[n] = '\0';
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_mkdir(wckpt *c, uint32_t dir, const char *name, uint32_t mode, uint32_t *node,
                struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    int rc = wc_modifiable(c, "creating a directory");
    if (rc == 0) {
        struct timespec ts = wc_now_real();
        rc = wtree_add(&c->tree, dir, name, WNODE_DIR, mode, ts.tv_sec, (uint32_t)ts.tv_nsec, 0,
                       node);
    }
    if (rc == 0) {
        wc_mark_mtime(&c->tree.nodes[dir]);
        wc_touched(c, 1);
        fill_attr(c, *node, st);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void wc_removed(wckpt *c, uint32_t node)
{
    /* Whatever failed in it is gone with it. */
    wc_staging_repaired(c, node, 0, UINT64_MAX);
    wfile *f = wc_file_of(c, node);
    if (f && f->blob) {
        ckpt_err err = {0};
        if (stage_blob_unlink(f->blob, &err) != 0)
            fslog_err("checkpoint '%s': %s", c->name, err.msg);
    }
    wc_drop_if_detached(c, node);
}

int wckpt_unlink(wckpt *c, uint32_t dir, const char *name)
{
    pthread_mutex_lock(&c->lock);
    int rc = wc_modifiable(c, "removing a file");
    uint32_t node;
    if (rc == 0)
        rc = wtree_remove(&c->tree, dir, name, 0, &node);
    if (rc == 0) {
        wc_removed(c, node);
        wc_mark_mtime(&c->tree.nodes[dir]);
        wc_touched(c, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_rmdir(wckpt *c, uint32_t dir, const char *name)
{
    pthread_mutex_lock(&c->lock);
    int rc = wc_modifiable(c, "removing a directory");
    uint32_t node;
    if (rc == 0)
        rc = wtree_remove(&c->tree, dir, name, 1, &node);
    if (rc == 0) {
        wc_mark_mtime(&c->tree.nodes[dir]);
        wc_touched(c, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_rename(wckpt *c, uint32_t dir, const char *name, uint32_t newdir, const char *newname,
                 int noreplace)
{
    pthread_mutex_lock(&c->lock);
    int rc = wc_modifiable(c, "renaming");
    uint32_t replaced = WTREE_NONE;
    if (rc == 0)
        rc = wtree_rename(&c->tree, dir, name, newdir, newname, noreplace, &replaced);
    if (rc == 0) {
        if (replaced != WTREE_NONE)
            wc_removed(c, replaced);
        wc_mark_mtime(&c->tree.nodes[dir]);
        if (newdir != dir)
            wc_mark_mtime(&c->tree.nodes[newdir]);
        wc_touched(c, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_open(wckpt *c, uint32_t node, int flags)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, node);
    if (rc == 0 && c->locked)
        rc = -EACCES;
    if (rc == 0 && c->tree.nodes[node].kind == WNODE_DIR)
        rc = -EISDIR;
    if (rc == 0 && ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)))
        rc = node_modifiable(c, "opening a file for writing");
    wfile *f = rc == 0 ? wc_file_of(c, node) : NULL;
    if (rc == 0 && !f)
        rc = -ESTALE;
    if (rc == 0 && !f->blob && ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)))
        rc = wc_copy_up(c, node, f, !(flags & O_TRUNC));
    if (rc == 0 && (flags & O_TRUNC)) {
        /* The kernel leaves O_TRUNC to the open (atomic_o_trunc). */
        ckpt_err err = {0};
        rc = stage_blob_truncate(f->blob, 0, &err);
        if (rc) {
            wc_staging_failed(c, rc, err.msg, node, 0);
        } else {
            wc_staging_repaired(c, node, 0, UINT64_MAX);
            wc_mark_mtime(&c->tree.nodes[node]);
            wc_touched(c, 0);
        }
    }
    if (rc == 0) {
        f->open++;
        f->last_use = wc_now_mono();
        c->open_files++;
        c->open_writers += wckpt_flags_write(flags) ? 1 : 0;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void wckpt_open_read_only(wckpt *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->open_writers)
        c->open_writers--;
    pthread_mutex_unlock(&c->lock);
}

static void writer_closed(wckpt *c, int flags)
{
    if (wckpt_flags_write(flags) && c->open_writers)
        c->open_writers--;
}

void wckpt_release(wckpt *c, uint32_t node, int flags)
{
    pthread_mutex_lock(&c->lock);
    wfile *f = wc_file_of(c, node);
    if (f && f->open) {
        f->open--;
        c->open_files--;
        writer_closed(c, flags);
        f->last_use = wc_now_mono();
        if (!f->open && !f->busy && f->blob && c->tree.nodes[node].linked) {
            /* Closed: its partial last block goes to disk now rather than
             * waiting in memory, and the descriptor is given back. */
            ckpt_err err = {0};
            if (stage_blob_park(f->blob, &err) != 0) {
                wc_staging_failed(c, err.code, err.msg, node, UINT64_MAX);
                fslog_err("checkpoint '%s': %s", c->name, err.msg);
            }
        }
        wc_drop_if_detached(c, node);
    }
    void *unpin = NULL;
    if (!f && c->state == WST_COMMITTED && c->open_files > 0) {
        /* Open since before the commit (its file's staging is gone): the
         * last of those lets go of the pack they read. */
        writer_closed(c, flags);
        if (--c->open_files == 0 && c->successor_pinned) {
            c->successor_pinned = 0;
            unpin = c->successor;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (unpin && c->table->unpin_successor)
        c->table->unpin_successor(c->table->successor_ud, unpin);
}

/* Takes a file for I/O without the lock: 0 with *f, or -errno. */
static int begin_io(wckpt *c, uint32_t node, int write, wfile **f)
{
    int rc = usable(c, node);
    if (rc == 0 && c->locked)
        rc = -EACCES;
    if (rc == 0 && c->tree.nodes[node].kind == WNODE_DIR)
        rc = -EISDIR;
    if (rc == 0 && write)
        rc = node_modifiable(c, "writing");
    if (rc == 0 && !(*f = wc_file_of(c, node)))
        rc = -ESTALE;
    if (rc == 0 && write && !(*f)->blob)
        rc = wc_copy_up(c, node, *f, 1);
    if (rc == 0) {
        (*f)->busy++;
        c->inflight++;
    }
    return rc;
}

static void end_io(wckpt *c, uint32_t node, wfile *f)
{
    f->busy--;
    f->last_use = wc_now_mono();
    if (--c->inflight == 0)
        pthread_cond_broadcast(&c->changed);
    wc_drop_if_detached(c, node);
}

ssize_t wckpt_read(wckpt *c, uint32_t node, void *buf, size_t len, uint64_t off)
{
    wfile *f = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = begin_io(c, node, 0, &f);
    pthread_mutex_unlock(&c->lock);
    if (rc)
        return rc;
    ckpt_err err = {0};
    ssize_t n = f->blob ? stage_blob_pread(f->blob, buf, len, off, &err)
                        : ckpt_file_pread(c->base, (size_t)f->base_index, buf, len, off, &err);
    pthread_mutex_lock(&c->lock);
    if (n < 0)
        fslog_err("checkpoint '%s': %s", c->name, err.msg);
    end_io(c, node, f);
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* The data of a write comes from buf, or when buf is NULL from fd. */
static ssize_t write_from(wckpt *c, uint32_t node, const void *buf, int fd, size_t len,
                          uint64_t off, stage_ack *ack)
{
    wfile *f = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = begin_io(c, node, 1, &f);
    if (rc == 0) {
        /* Before the bytes, as Linux does: a futimens the writer sends
         * once answered must not be overwritten by this write's end. */
        wc_mark_mtime(&c->tree.nodes[node]);
        wc_touched(c, 0);
    }
    pthread_mutex_unlock(&c->lock);
    if (rc)
        return rc;
    ckpt_err err = {0};
    ssize_t n = buf ? stage_blob_pwrite_acked(f->blob, buf, len, off, ack, &err)
                    : stage_blob_write_fd(f->blob, fd, len, off, ack, &err);
    pthread_mutex_lock(&c->lock);
    if (n < 0) {
        /* Failed after the writer was told it worked: whatever the cause,
         * the checkpoint must not be packed without these bytes. */
        int why = ack && ack->given && n != -ENOSPC && n != -EDQUOT ? -EIO : (int)n;
        wc_staging_write_failed(c, why, err.msg, node, off, len);
        if (n != -ENOSPC && n != -EDQUOT)
            fslog_err("checkpoint '%s': %s", c->name, err.msg);
    } else if (n > 0) {
        wc_staging_repaired(c, node, off, off + (uint64_t)n - 1);
    }
    end_io(c, node, f);
    pthread_mutex_unlock(&c->lock);
    return n;
}

ssize_t wckpt_write(wckpt *c, uint32_t node, const void *buf, size_t len, uint64_t off)
{
    return write_from(c, node, buf, -1, len, off, NULL);
}

ssize_t wckpt_write_acked(wckpt *c, uint32_t node, const void *buf, size_t len, uint64_t off,
                          stage_ack *ack)
{
    return write_from(c, node, buf, -1, len, off, ack);
}

ssize_t wckpt_write_fd(wckpt *c, uint32_t node, int fd, size_t len, uint64_t off, stage_ack *ack)
{
    return write_from(c, node, NULL, fd, len, off, ack);
}

int wckpt_flush(wckpt *c, uint32_t node)
{
    pthread_mutex_lock(&c->lock);
    wfile *f = usable(c, node) == 0 ? wc_file_of(c, node) : NULL;
    stage_blob *blob = f ? f->blob : NULL;
    if (blob) {
        f->busy++;
        c->inflight++;
    }
    pthread_mutex_unlock(&c->lock);
    if (!blob)
        return 0;
    ckpt_err err = {0};
    int rc = stage_blob_take_error(blob, &err);
    pthread_mutex_lock(&c->lock);
    if (rc)
        fslog_err("checkpoint '%s': close reports: %s", c->name, err.msg);
    end_io(c, node, f);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_setattr(wckpt *c, uint32_t node, int flags, uint32_t mode, uint64_t size,
                  const struct timespec *atime, const struct timespec *mtime, struct stat *st)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, node);
    if (rc == 0 && flags)
        rc = node_modifiable(c, "changing attributes");
    wnode *n = rc == 0 ? &c->tree.nodes[node] : NULL;
    if (rc == 0 && (flags & WSET_SIZE)) {
        wfile *f = wc_file_of(c, node);
        ckpt_err err = {0};
        if (!f)
            rc = n->kind == WNODE_DIR ? -EISDIR : -ESTALE;
        else if (!f->blob && (rc = wc_copy_up(c, node, f, size > 0)) != 0)
            ;
        else if ((rc = stage_blob_truncate(f->blob, size, &err)) != 0)
            wc_staging_failed(c, rc, err.msg, node, size);
        if (rc == 0) {
            /* What failed past the new end is no longer expected. */
            wc_staging_repaired(c, node, size, UINT64_MAX);
            wc_mark_mtime(n);
        }
    }
    if (rc == 0 && (flags & WSET_MODE))
        n->mode = mode & WTREE_MODE_BITS;
    if (rc == 0 && (flags & WSET_MTIME) && mtime) {
        n->mtime_sec = mtime->tv_sec;
        n->mtime_nsec = (uint32_t)mtime->tv_nsec;
    }
    if (rc == 0 && (flags & WSET_MTIME_NOW))
        wc_mark_mtime(n);
    if (rc == 0 && (flags & (WSET_ATIME | WSET_ATIME_NOW))) {
        struct timespec ts = (flags & WSET_ATIME) && atime ? *atime : wc_now_real();
        n->atime_sec = ts.tv_sec;
        n->atime_nsec = (uint32_t)ts.tv_nsec;
    }
    if (rc == 0 && flags)
        wc_touched(c, !(flags & WSET_SIZE));
    if (rc == 0)
        fill_attr(c, node, st);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_allocate(wckpt *c, uint32_t node, uint64_t off, uint64_t len)
{
    pthread_mutex_lock(&c->lock);
    wfile *f = NULL;
    int rc = begin_io(c, node, 1, &f);
    if (rc == 0) {
        ckpt_err err = {0};
        if (off + len > wc_file_size(f) &&
            (rc = stage_blob_truncate(f->blob, off + len, &err)) != 0)
            wc_staging_failed(c, rc, err.msg, node, off);
        if (rc == 0)
            wc_touched(c, 0);
        end_io(c, node, f);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int wckpt_fsync(wckpt *c, uint32_t node)
{
    wfile *f = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, node);
    if (rc == -ESTALE && c->state == WST_COMMITTED)
        rc = 0; /* the pack is durable */
    else if (rc == 0 && c->locked)
        rc = -EACCES;
    else if (rc == 0 && c->tree.nodes[node].kind == WNODE_FILE && (f = wc_file_of(c, node)) &&
             f->blob) {
        f->busy++;
        c->inflight++;
    }
    int committed = c->state == WST_COMMITTED;
    pthread_mutex_unlock(&c->lock);
    if (rc || committed)
        return rc;
    ckpt_err err = {0};
    if (f) {
        rc = stage_blob_sync(f->blob, &err);
        pthread_mutex_lock(&c->lock);
        if (rc)
            wc_staging_failed(c, rc, err.msg, node, UINT64_MAX);
        else
            wc_staging_repaired(c, node, UINT64_MAX, UINT64_MAX);
        end_io(c, node, f);
        pthread_mutex_unlock(&c->lock);
    }
    if (rc == 0)
        rc = wc_save(c, &err);
    if (rc)
        fslog_err("checkpoint '%s': fsync failed: %s", c->name, err.msg);
    return rc;
}

int wckpt_list(wckpt *c, uint32_t dir, wdirent **out, size_t *n, uint32_t *parent)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, dir);
    if (rc == 0 && c->locked)
        rc = -EACCES;
    const wnode *d = rc == 0 ? &c->tree.nodes[dir] : NULL;
    if (rc == 0 && d->kind != WNODE_DIR)
        rc = -ENOTDIR;
    wdirent *v = NULL;
    uint32_t count = 0;
    if (rc == 0 && !(v = calloc(d->n_children ? d->n_children : 1, sizeof *v)))
        rc = -ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < d->n_children; i++) {
        const wnode *child = &c->tree.nodes[d->children[i]];
        v[i].name = strdup(child->name);
        v[i].node = d->children[i];
        v[i].is_dir = child->kind == WNODE_DIR;
        v[i].is_link = child->kind == WNODE_LINK;
        count++;
        if (!v[i].name)
            rc = -ENOMEM;
    }
    if (rc == 0)
        *parent = d->parent;
    pthread_mutex_unlock(&c->lock);
    if (rc) {
        wdirents_free(v, count);
        return rc;
    }
    *out = v;
    *n = count;
    return 0;
}

void wdirents_free(wdirent *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].name);
    free(v);
}

int wckpt_xattr(wckpt *c, const char *attr, char *buf, size_t cap)
{
    int len = -ENODATA;
    pthread_mutex_lock(&c->lock);
    if (strcmp(attr, CKPT_XATTR_STATE) == 0) {
        len = snprintf(buf, cap, "%s", wstate_name(c->state));
    } else if (strcmp(attr, CKPT_XATTR_PROGRESS) == 0) {
        uint64_t done = __atomic_load_n(&c->pack_done, __ATOMIC_RELAXED);
        uint64_t total = __atomic_load_n(&c->pack_total, __ATOMIC_RELAXED);
        double secs =
            c->state == WST_PACKING && c->pack_running ? wc_now_mono() - c->pack_started : 0;
        len = snprintf(buf, cap, "%" PRIu64 " %" PRIu64 " %.3f", done, total, secs);
    } else if (strcmp(attr, CKPT_XATTR_SIZE) == 0) {
        uint64_t size = 0;
        for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
            const wnode *n = &c->tree.nodes[i];
            if (n->linked && n->kind == WNODE_FILE && n->data)
                size += wc_file_size(n->data);
        }
        len = snprintf(buf, cap, "%" PRIu64, size);
    } else if (strcmp(attr, CKPT_XATTR_ERROR) == 0 && c->error) {
        len = snprintf(buf, cap, "%s", c->error);
    }
    pthread_mutex_unlock(&c->lock);
    if (len >= 0 && (size_t)len >= cap)
        len = (int)cap - 1;
    return len;
}

int wckpt_find(wckpt *c, const char *rel, uint32_t *node)
{
    pthread_mutex_lock(&c->lock);
    int rc = usable(c, WTREE_ROOT);
    uint32_t n = WTREE_ROOT;
    char part[NAME_MAX + 1];
    for (const char *p = rel; rc == 0 && *p;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || len > NAME_MAX) {
            rc = -ENOENT;
            break;
        }
        memcpy(part, p, len);
        part[len] = '\0';
        n = wtree_lookup(&c->tree, n, part);
        if (n == WTREE_NONE)
            rc = -ENOENT;
        p += len + (slash != NULL);
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == 0)
        *node = n;
    return rc;
}
