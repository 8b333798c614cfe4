/* The write side's FUSE requests: one short function per operation on
 * the root (creating, removing and renaming checkpoints) and on the inodes
 * of checkpoints being written; each turns a request into a wtable call
 * and its answer into a reply. One job, hence one file, though long. */
#include "write_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backing_path.h"
#include "common/fslog.h"
#include "common/links.h"
#include "ckpt_mount.h"
#include "handles.h"
#include "reply.h"

/* Everything inside a checkpoint being written changes only through this
 * mount, which the kernel sees; a short timeout still lets it notice a
 * commit (the checkpoint's name then leads to the pack's inodes). */
#define WRITE_TIMEOUT 1.0

static void fill_ids(ckptfs *fs, struct stat *st, uint64_t ino)
{
    st->st_ino = ino;
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
}

/* The cache flags of an open of a file being written. Writes go through
 * to us either way (no writeback cache, see op_init), so the kernel's
 * pages stay right and are kept. A write-only open (cp, safetensors,
 * torch.save) also bypasses them: its writes then reach us straight from
 * the writer's buffer instead of first being copied into pages nobody
 * reads, and the kernel no longer asks for security.capability before
 * every write. On cp -r of 710 MB that cut cp's own CPU time from about
 * 0.3-0.4 s to 0.11 s and a round trip per MiB. The kernel drops what it
 * had cached of a range written this way (6.6 and later), and such a
 * descriptor cannot be mapped, so nothing else changes for it. */
static void set_open_cache(struct fuse_file_info *fi, int keep)
{
    fi->keep_cache = keep;
    fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY;
    /* A reader's close has no write error to hear (wops_flush): it must not
     * take one meant for the writer, and costs no round trip. */
    fi->noflush = (fi->flags & O_ACCMODE) == O_RDONLY;
}

/* The writable checkpoint of an inode; replies ESTALE if there is none. */
static wckpt *find(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, uint32_t *node)
{
    wckpt *c = wtable_find(&fs->wtable, ino, node);
    if (!c)
        fuse_reply_err(req, ESTALE);
    return c;
}

static int committed(wckpt *c)
{
    pthread_mutex_lock(&c->lock);
    int yes = c->state == WST_COMMITTED;
    pthread_mutex_unlock(&c->lock);
    return yes;
}

/* Replies to rc (< 0) unless the checkpoint was committed in between, in
 * which case the caller answers from the pack (returns 0). */
static int reply_error(fuse_req_t req, wckpt *c, int rc)
{
    if (rc == -ESTALE && committed(c))
        return 0;
    fuse_reply_err(req, -rc);
    return 1;
}

static void reply_entry(fuse_req_t req, ckptfs *fs, wckpt *c, uint32_t node, struct stat *st,
                        double entry_timeout)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = wckpt_ino(c, node);
    e.entry_timeout = entry_timeout;
    e.attr_timeout = WRITE_TIMEOUT;
    e.attr = *st;
    fill_ids(fs, &e.attr, e.ino);
    /* The kernel holds the reference only if the reply reached it. */
    if (fuse_reply_entry(req, &e) != 0)
        wtable_forget(&fs->wtable, c, 1);
}

/* ------------------------------------------- checkpoints by name */

int wops_ckpt_lookup(fuse_req_t req, ckptfs *fs, const char *name)
{
    if (!fs->writable)
        return 0;
    wckpt *c = wtable_get(&fs->wtable, name, 1);
    if (!c)
        return 0;
    struct stat st;
    uint32_t node = wckpt_entry_node(c);
    int rc = node == WTREE_NONE ? -EIO : wckpt_getattr(c, node, &st);
    if (rc) {
        wtable_forget(&fs->wtable, c, 1);
        /* Committed this instant: the pack answers. */
        if (rc == -ESTALE)
            return 0;
        fuse_reply_err(req, -rc);
        return 1;
    }
    /* Looked up every time: the name moves to the pack at commit. */
    reply_entry(req, fs, c, node, &st, 0.0);
    return 1;
}

/* A pack deleted with the writable checkpoint that reopened it: the read
 * side lets go of its file now (a lookup that misses retires it). */
static void pack_gone(ckptfs *fs, const char *name)
{
    int err;
    checkpoint *c = checkpoints_lookup(&fs->table, name, 0, &err);
    (void)c;
}

void wops_ckpt_rmdir(fuse_req_t req, ckptfs *fs, const char *name)
{
    int rc = fs->writable ? wtable_rmdir(&fs->wtable, name) : -ENOENT;
    if (rc == 0)
        pack_gone(fs, name);
    if (rc != -ENOENT) {
        if (rc == -EBUSY)
            fslog_warn("rmdir '%s': the checkpoint is being packed; remove it once committed",
                       name);
        fuse_reply_err(req, -rc);
        return;
    }
    /* A committed checkpoint: its pack goes once no packed file shows
     * (rm -r hid them all, or it never had any); manifest.json and
     * tensors/ are only views of those files. */
    int err;
    checkpoint *c = checkpoints_lookup(&fs->table, name, 1, &err);
    if (!c) {
        fuse_reply_err(req, -err);
        return;
    }
    rc = c->is_file ? -ENOTDIR : checkpoint_open(&fs->table, c);
    /* A pack that cannot be opened (ckpt status: damaged) shows nothing
     * inside to remove first, and is deleted where the user sees it, as
     * on any filesystem. Not one whose key is not the mount's (EACCES):
     * that is the mount's configuration, and the pack is likely fine.
     * Nor one the store could not be asked about (a gateway down): a good
     * pack would go with an outage that ends between the open and the
     * delete. Nor a pack of a newer format than this build reads: it is
     * likely fine for the ckpt that wrote it. */
    int damaged = rc == -EIO && checkpoint_is_broken(c);
    if (rc == 0 && !checkpoint_is_empty(c))
        rc = -ENOTEMPTY;
    /* Only the object listed goes, damaged or not: on S3 another writer
     * may have replaced it since, and what it put there is not empty. */
    if (rc == 0 || damaged)
        rc = fs->writable ? wtable_remove_pack(&fs->wtable, name, 0, &c->oid) : -EROFS;
    if (rc == 0 && damaged) {
        char why[sizeof c->last_error];
        checkpoint_get_error(c, why, sizeof why);
        fslog_warn("checkpoint '%s': the pack deleted was damaged: %s", name, why);
    }
    if (rc == 0)
        checkpoint_removed(&fs->table, c);
    checkpoint_forget(&fs->table, c, 1);
    fuse_reply_err(req, -rc);
}

void wops_ckpt_unlink(fuse_req_t req, ckptfs *fs, const char *name)
{
    int rc = fs->writable ? wtable_unlink_file(&fs->wtable, name) : -ENOENT;
    if (rc == 0)
        pack_gone(fs, name);
    if (rc != -ENOENT) {
        fuse_reply_err(req, -rc);
        return;
    }
    int err;
    checkpoint *c = checkpoints_lookup(&fs->table, name, 1, &err);
    if (!c) {
        fuse_reply_err(req, -err);
        return;
    }
    int damaged = c->is_file && checkpoint_open(&fs->table, c) == -EIO && checkpoint_is_broken(c);
    /* A pack goes only while it is the object listed (on S3 another writer
     * may have replaced it meanwhile). */
    rc = !c->is_file    ? -EISDIR
         : fs->writable ? wtable_remove_pack(&fs->wtable, name, 1, &c->oid)
                        : -EROFS;
    if (rc == 0 && damaged) {
        char why[sizeof c->last_error];
        checkpoint_get_error(c, why, sizeof why);
        fslog_warn("checkpoint '%s': the pack deleted was damaged: %s", name, why);
    }
    if (rc == 0)
        checkpoint_removed(&fs->table, c);
    checkpoint_forget(&fs->table, c, 1);
    fuse_reply_err(req, -rc);
}

void wops_ckpt_rename(fuse_req_t req, ckptfs *fs, const char *name, const char *newname,
                      unsigned flags)
{
    if (!fs->writable) {
        fuse_reply_err(req, EROFS);
        return;
    }
    if (flags & ~(unsigned)RENAME_NOREPLACE) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    int rc = wtable_rename(&fs->wtable, name, newname, (flags & RENAME_NOREPLACE) != 0);
    if (rc == 0) {
        fslog_info("checkpoint '%s' renamed to '%s'", name, newname);
        ns_removed(&fs->ns, newname); /* an empty namespace it replaced */
    }
    fuse_reply_err(req, -rc);
}

void wops_ckpt_create(fuse_req_t req, ckptfs *fs, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    wckpt *c;
    uint32_t node;
    struct stat st;
    int rc = wtable_create_file(&fs->wtable, name, mode & 07777, &c, &node, &st);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    if (fi && !wckpt_flags_write(fi->flags))
        wckpt_open_read_only(c);
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = wckpt_ino(c, node);
    e.entry_timeout = 0.0;
    e.attr_timeout = WRITE_TIMEOUT;
    e.attr = st;
    fill_ids(fs, &e.attr, e.ino);
    if (!fi) { /* mknod */
        wckpt_release(c, node, O_WRONLY);
        if (fuse_reply_entry(req, &e) != 0)
            wtable_forget(&fs->wtable, c, 1);
        return;
    }
    fi->fh = 0;
    set_open_cache(fi, 1);
    if (fuse_reply_create(req, &e, fi) != 0) {
        wckpt_release(c, node, fi->flags);
        wtable_forget(&fs->wtable, c, 1);
    }
}

int wops_listing_add(ckptfs *fs, const char *ns, root_listing *l)
{
    if (!fs->writable)
        return 0;
    wlisted *v;
    size_t n;
    int rc = wtable_list(&fs->wtable, ns, &v, &n);
    if (rc)
        return rc;
    struct root_entry *grown = realloc(l->entries, (l->n + n + 1) * sizeof *grown);
    if (!grown) {
        rc = -ENOMEM;
    } else {
        l->entries = grown;
        for (size_t i = 0; i < n; i++) {
            size_t j = 0;
            while (j < l->n && strcmp(l->entries[j].name, v[i].name) != 0)
                j++;
            if (j < l->n) { /* shadows a pack (or namespace) of the same name */
                free(l->entries[j].name);
            } else {
                l->n++;
            }
            l->entries[j].name = v[i].name;
            l->entries[j].ino = v[i].ino;
            l->entries[j].type = v[i].is_link ? S_IFLNK : v[i].is_file ? S_IFREG : S_IFDIR;
            l->entries[j].is_ns = 0;
            v[i].name = NULL;
        }
    }
    wlisted_free(v, n);
    return rc;
}

/* ------------------------------------------------------- inside a ckpt */

int wops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    uint32_t dir, node;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    struct stat st;
    int rc = wckpt_lookup(c, dir, name, &node, &st);
    if (rc)
        return reply_error(req, c, rc);
    wtable_count_lookup(&fs->wtable, c);
    reply_entry(req, fs, c, node, &st, WRITE_TIMEOUT);
    return 1;
}

void wops_forget(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup)
{
    uint32_t node;
    wckpt *c = wtable_find(&fs->wtable, ino, &node);
    if (c)
        wtable_forget(&fs->wtable, c, nlookup);
}

int wops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    struct stat st;
    int rc = wckpt_getattr(c, node, &st);
    if (rc)
        return reply_error(req, c, rc);
    fill_ids(fs, &st, ino);
    fuse_reply_attr(req, &st, WRITE_TIMEOUT);
    return 1;
}

int wops_setattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct stat *attr, int to_set)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    /* Packs keep no owner: that change succeeds as a no-op, as on
     * filesystems that cannot store one, so cp -a and tar work. The access
     * time is kept until the commit (the pack has none). */
    int flags = 0;
    if (to_set & FUSE_SET_ATTR_MODE)
        flags |= WSET_MODE;
    if (to_set & FUSE_SET_ATTR_SIZE)
        flags |= WSET_SIZE;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        flags |= WSET_MTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME)
        flags |= WSET_MTIME;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        flags |= WSET_ATIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME)
        flags |= WSET_ATIME;
    if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size < 0) {
        fuse_reply_err(req, EINVAL);
        return 1;
    }
    struct stat st;
    int rc = wckpt_setattr(c, node, flags, (uint32_t)attr->st_mode, (uint64_t)attr->st_size,
                           &attr->st_atim, &attr->st_mtim, &st);
    if (rc)
        return reply_error(req, c, rc);
    fill_ids(fs, &st, ino);
    fuse_reply_attr(req, &st, WRITE_TIMEOUT);
    return 1;
}

int wops_create(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                struct fuse_file_info *fi)
{
    uint32_t dir, node;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    struct stat st;
    int rc = wckpt_create(c, dir, name, mode & 07777, &node, &st);
    if (rc)
        return reply_error(req, c, rc);
    if (!wckpt_flags_write(fi->flags))
        wckpt_open_read_only(c);
    wtable_count_lookup(&fs->wtable, c);
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = wckpt_ino(c, node);
    e.entry_timeout = WRITE_TIMEOUT;
    e.attr_timeout = WRITE_TIMEOUT;
    e.attr = st;
    fill_ids(fs, &e.attr, e.ino);
    fi->fh = 0;
    set_open_cache(fi, 1);
    if (fuse_reply_create(req, &e, fi) != 0) {
        wckpt_release(c, node, fi->flags);
        wtable_forget(&fs->wtable, c, 1);
    }
    return 1;
}

int wops_mknod(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode)
{
    uint32_t dir, node;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    if (!S_ISREG(mode)) {
        fslog_warn("checkpoint '%s': cannot create '%s': a pack holds only regular files and "
                   "directories",
                   c->name, name);
        fuse_reply_err(req, EPERM);
        return 1;
    }
    struct stat st;
    int rc = wckpt_create(c, dir, name, mode & 07777, &node, &st);
    if (rc)
        return reply_error(req, c, rc);
    wckpt_release(c, node, O_WRONLY);
    wtable_count_lookup(&fs->wtable, c);
    reply_entry(req, fs, c, node, &st, WRITE_TIMEOUT);
    return 1;
}

int wops_symlink(fuse_req_t req, ckptfs *fs, const char *target, fuse_ino_t parent,
                 const char *name)
{
    uint32_t dir, node;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    struct stat st;
    int rc = wckpt_symlink(c, dir, name, target, &node, &st);
    if (rc)
        return reply_error(req, c, rc);
    wtable_count_lookup(&fs->wtable, c);
    reply_entry(req, fs, c, node, &st, WRITE_TIMEOUT);
    return 1;
}

int wops_readlink(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    char target[LINK_TARGET_MAX + 1];
    int rc = wckpt_readlink(c, node, target, sizeof target);
    if (rc)
        return reply_error(req, c, rc);
    fuse_reply_readlink(req, target);
    return 1;
}

void wops_ckpt_symlink(fuse_req_t req, ckptfs *fs, const char *target, const char *name)
{
    wckpt *c;
    uint32_t node;
    struct stat st;
    int rc = wtable_create_link(&fs->wtable, name, target, &c, &node, &st);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    reply_entry(req, fs, c, node, &st, 0.0);
}

int wops_mkdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode)
{
    uint32_t dir, node;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    struct stat st;
    int rc = wckpt_mkdir(c, dir, name, mode & 07777, &node, &st);
    if (rc)
        return reply_error(req, c, rc);
    wtable_count_lookup(&fs->wtable, c);
    reply_entry(req, fs, c, node, &st, WRITE_TIMEOUT);
    return 1;
}

/* unlink and rmdir: the same lookup and replies around a different removal. */
static int remove_entry(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                        int (*remove)(wckpt *, uint32_t, const char *))
{
    uint32_t dir;
    wckpt *c = find(req, fs, parent, &dir);
    if (!c)
        return 1;
    int rc = remove(c, dir, name);
    if (rc)
        return reply_error(req, c, rc);
    fuse_reply_err(req, 0);
    return 1;
}

int wops_unlink(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    return remove_entry(req, fs, parent, name, wckpt_unlink);
}

int wops_rmdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    return remove_entry(req, fs, parent, name, wckpt_rmdir);
}

void wops_rename(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                 fuse_ino_t newparent, const char *newname, unsigned flags)
{
    uint32_t dir, newdir;
    wckpt *c = wtable_owns(parent) ? wtable_find(&fs->wtable, parent, &dir) : NULL;
    wckpt *d = wtable_owns(newparent) ? wtable_find(&fs->wtable, newparent, &newdir) : NULL;
    if (flags & ~(unsigned)RENAME_NOREPLACE) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    /* Only within one checkpoint; anything else is a copy (mv does that
     * by itself on EXDEV). */
    if (!c || c != d) {
        fuse_reply_err(req, c || d ? EXDEV : EROFS);
        return;
    }
    int rc = wckpt_rename(c, dir, name, newdir, newname, (flags & RENAME_NOREPLACE) != 0);
    fuse_reply_err(req, rc == -ESTALE ? EROFS : -rc);
}

int wops_open(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    int rc = wckpt_open(c, node, fi->flags);
    if (rc)
        return reply_error(req, c, rc);
    fi->fh = 0;
    /* Every change goes through the kernel, so its cache stays right. */
    set_open_cache(fi, 1);
    if (fuse_reply_open(req, fi) != 0)
        wckpt_release(c, node, fi->flags);
    return 1;
}

void wops_open_fwd(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
    uint32_t node;
    /* Referenced from the start, and by the handle while open: the kernel
     * never looked this inode up, so nothing else keeps the checkpoint
     * (once committed, its reads go to the pack it pinned). */
    wckpt *c = wtable_find_ref(&fs->wtable, ino, &node);
    if (!c) {
        fuse_reply_err(req, ESTALE);
        return;
    }
    int rc = wckpt_open(c, node, fi->flags);
    if (rc) {
        wtable_unref(&fs->wtable, c);
        fuse_reply_err(req, rc == -ESTALE ? EROFS : -rc);
        return;
    }
    fs_handle *h = calloc(1, sizeof *h);
    if (!h) {
        wckpt_release(c, node, fi->flags);
        wtable_unref(&fs->wtable, c);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->is_fwd = 1;
    h->u.fwd.ino = ino;
    h->u.fwd.ckpt = c;
    /* The kernel's pages are the old generation's: not kept. */
    set_open_cache(fi, 0);
    handle_track(fs, h);
    fi->fh = (uintptr_t)h;
    if (fuse_reply_open(req, fi) != 0) {
        wckpt_release(c, node, fi->flags);
        handle_drop(fs, h);
    }
}

int wops_read(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return 1;
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return 1;
    }
    ssize_t n = wckpt_read(c, node, buf, size, (uint64_t)off);
    int handled = 1;
    if (n < 0)
        handled = reply_error(req, c, (int)n);
    else
        fuse_reply_buf(req, buf, (size_t)n);
    free(buf);
    return handled;
}

/* A write is answered as soon as it is ordered (stage_ack): cp waits for
 * each answer before it reads its next MiB, so answering first lets that
 * read and the kernel's copy of the next request run while this one is
 * written to the staging file, where answering last made one thread do
 * all of it in turn. libfuse's buffer stays ours until we return. */
static void answer_write(void *req, size_t len)
{
    fuse_reply_write(req, len);
}

/* The bytes of a write as libfuse hands them over: in memory, or, when
 * requests are spliced from the device (see op_write_buf), still in a
 * pipe, from which splice moves them to the staging file without a copy
 * through here. */
static ssize_t write_bufvec(wckpt *c, uint32_t node, struct fuse_bufvec *bufv, off_t off,
                            stage_ack *ack)
{
    size_t size = fuse_buf_size(bufv);
    const struct fuse_buf *b = &bufv->buf[0];
    if (bufv->count == 1 && bufv->off == 0 && (b->flags & FUSE_BUF_IS_FD) &&
        !(b->flags & FUSE_BUF_FD_SEEK))
        return wckpt_write_fd(c, node, b->fd, size, (uint64_t)off, ack);
    if (bufv->count == 1 && !(b->flags & FUSE_BUF_IS_FD))
        return wckpt_write_acked(c, node, (const char *)b->mem + bufv->off, size, (uint64_t)off,
                                 ack);
    char *mem = malloc(size ? size : 1);
    if (!mem)
        return -ENOMEM;
    struct fuse_bufvec dst = FUSE_BUFVEC_INIT(size);
    dst.buf[0].mem = mem;
    ssize_t got = fuse_buf_copy(&dst, bufv, 0);
    ssize_t n = got < 0               ? got
                : (size_t)got != size ? -EIO
                                      : wckpt_write_acked(c, node, mem, size, (uint64_t)off, ack);
    free(mem);
    return n;
}

int wops_write_buf(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (off < 0) {
        fuse_reply_err(req, EINVAL);
        return 1;
    }
    stage_ack ack = {answer_write, req, 0};
    ssize_t n = write_bufvec(c, node, bufv, off, &ack);
    if (n >= 0)
        bufv->idx = bufv->count; /* all taken: libfuse need not empty its pipe */
    if (ack.given)
        return 1; /* a later failure: the file's next write and its close say so */
    if (n < 0)
        /* Committed under a writer: the pack is read-only. */
        fuse_reply_err(req, n == -ESTALE ? EROFS : (int)-n);
    else
        fuse_reply_write(req, (size_t)n);
    return 1;
}

int wops_flush(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    uint32_t node;
    wckpt *c = wtable_find(&fs->wtable, ino, &node);
    if (!c)
        return 0;
    int rc = wckpt_flush(c, node);
    fuse_reply_err(req, -rc);
    return 1;
}

void wops_release(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, int flags)
{
    uint32_t node;
    wckpt *c = wtable_find(&fs->wtable, ino, &node);
    if (c)
        wckpt_release(c, node, flags);
    fuse_reply_err(req, 0);
}

int wops_fsync(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    int rc = wckpt_fsync(c, node);
    fuse_reply_err(req, rc == -ESTALE ? 0 : -rc);
    return 1;
}

int wops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
    uint32_t node, parent;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    fs_handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return 1;
    }
    /* A snapshot: entries added or removed while it is read cannot make
     * readdir skip or repeat the others. */
    int rc = wckpt_list(c, node, &h->u.wlisting.entries, &h->u.wlisting.n, &parent);
    if (rc) {
        free(h);
        return reply_error(req, c, rc);
    }
    h->is_wlisting = 1;
    h->u.wlisting.self = ino;
    if (parent != WTREE_NONE) {
        h->u.wlisting.parent = wckpt_ino(c, parent);
    } else {
        /* Its root: ".." is the namespace that holds the checkpoint (its
         * name is under c->lock, which a rename takes). */
        pthread_mutex_lock(&c->lock);
        uint64_t ns = ns_parent_ino(&fs->ns, c->name);
        pthread_mutex_unlock(&c->lock);
        h->u.wlisting.parent = ns ? ns : FUSE_ROOT_ID; /* 0: out of memory */
    }
    handle_reply_open(req, fs, h, fi);
    return 1;
}

void wops_readdir(fuse_req_t req, fs_handle *h, size_t size, off_t off)
{
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    uint64_t serial_bits = h->u.wlisting.self & ~(uint64_t)UINT32_MAX;
    size_t total = 2 + h->u.wlisting.n, used = 0;
    for (size_t i = off < 0 ? 0 : (size_t)off; i < total; i++) {
        struct stat st;
        memset(&st, 0, sizeof st);
        const char *name;
        st.st_mode = S_IFDIR;
        if (i == 0) {
            name = ".";
            st.st_ino = h->u.wlisting.self;
        } else if (i == 1) {
            name = "..";
            st.st_ino = h->u.wlisting.parent;
        } else {
            const wdirent *e = &h->u.wlisting.entries[i - 2];
            name = e->name;
            st.st_ino = serial_bits | ((uint64_t)e->node + 1);
            st.st_mode = e->is_dir ? S_IFDIR : e->is_link ? S_IFLNK : S_IFREG;
        }
        size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(i + 1));
        if (need > size - used)
            break;
        used += need;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

int wops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (committed(c))
        return 0;
    char value[1024];
    int len = node == wckpt_entry_node(c) ? wckpt_xattr(c, name, value, sizeof value) : -ENODATA;
    if (len < 0)
        fuse_reply_err(req, -len);
    else
        reply_xattr_value(req, value, (size_t)len, size);
    return 1;
}

int wops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, const char *value,
                  size_t size)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (node == wckpt_entry_node(c) && strcmp(name, CKPT_XATTR_COMMIT) == 0) {
        int rc = wtable_commit(&fs->wtable, c);
        if (rc == -EACCES)
            fslog_warn("checkpoint '%s': cannot commit: %s", c->name,
                       c->error ? c->error : "its staged data cannot be read with this key");
        fuse_reply_err(req, -rc);
        return 1;
    }
    if (committed(c))
        return 0;
    /* Packs keep no extended attributes; cp -a and friends skip ENOTSUP. */
    fuse_reply_err(req, strncmp(name, CKPT_XATTR_PREFIX, strlen(CKPT_XATTR_PREFIX)) == 0 ? EPERM
                                                                                         : ENOTSUP);
    return 1;
}

int wops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size)
{
    static const char names[] = CKPT_XATTR_STATE "\0" CKPT_XATTR_PROGRESS "\0" CKPT_XATTR_SIZE;
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (committed(c))
        return 0;
    reply_xattr_value(req, names, node == wckpt_entry_node(c) ? sizeof names : 0, size);
    return 1;
}

int wops_fallocate(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, int mode, off_t off, off_t len)
{
    uint32_t node;
    wckpt *c = find(req, fs, ino, &node);
    if (!c)
        return 1;
    if (mode != 0) {
        fuse_reply_err(req, EOPNOTSUPP);
        return 1;
    }
    if (off < 0 || len <= 0) {
        fuse_reply_err(req, EINVAL);
        return 1;
    }
    int rc = wckpt_allocate(c, node, (uint64_t)off, (uint64_t)len);
    fuse_reply_err(req, rc == -ESTALE ? EROFS : -rc);
    return 1;
}
