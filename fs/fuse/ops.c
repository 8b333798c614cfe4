/* The FUSE low-level operations table and the one place that decides,
 * per request, which side answers it:
 *
 *   namespaces        the root and the directories above checkpoints
 *                     (nspace.h): ns_ops.h, which asks both sides by name;
 *                     a namespace that became a checkpoint since its
 *                     lookup is served as that checkpoint (nsops_route)
 *   inode_is_written  the write side (write_ops.h), unless the checkpoint
 *                     was committed since: then the read side, which finds
 *                     the pack through handover.h
 *   anything else     the read side (read_ops.h), unless a checkpoint is
 *                     being written under the pack's name (a late write
 *                     reopened it): then the same path there (route); a
 *                     change to a committed checkpoint reopens it
 *                     (route_change, handover_writable). Files opened
 *                     before keep reading the generation they opened.
 *
 * Neither side includes the other; both share mount.h and handles.h. */
#include "mount.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "handles.h"
#include "handover.h"
#include "ns_ops.h"
#include "read_ops.h"
#include "readahead.h"
#include "write_ops.h"

/* The kernel applies the readahead negotiated at FUSE_INIT when it reads
 * our INIT reply, overwriting anything set before; any later request
 * proves that has happened. */
static void raise_readahead_once(ckptfs *fs)
{
    if (__atomic_exchange_n(&fs->readahead_pending, 0, __ATOMIC_ACQ_REL))
        raise_readahead(fs->mount_path, fs->readahead_kib);
}

static ckptfs *fs_of(fuse_req_t req)
{
    ckptfs *fs = fuse_req_userdata(req);
    if (__atomic_load_n(&fs->readahead_pending, __ATOMIC_ACQUIRE))
        raise_readahead_once(fs);
    return fs;
}

/* The inode to answer a request on ino with: a namespace that became a
 * checkpoint is that checkpoint's directory, and a pack's inode is the
 * writable checkpoint's under the same name, if one is being written. */
static fuse_ino_t route(ckptfs *fs, fuse_ino_t ino)
{
    ino = nsops_route(fs, ino);
    fuse_ino_t w;
    if (!ns_owns(ino) && !wtable_owns(ino) && handover_writable(fs, ino, 0, &w) == 0)
        return w;
    return ino;
}

/* route() for a change: a committed checkpoint is reopened for writing
 * (late writes never fail). 0 with *out, or the errno to reply. */
static int route_change_or_damaged(ckptfs *fs, fuse_ino_t ino, fuse_ino_t *out)
{
    ino = nsops_route(fs, ino);
    if (ns_owns(ino)) {
        *out = ino;
        return 0;
    }
    if (!fs->writable)
        return EROFS;
    int err = handover_writable(fs, ino, 1, out);
    return err == ENOENT ? EROFS : err;
}

/* EUCLEAN (its pack damaged since the read side opened it) is EIO to a
 * change; only a removal goes on (remove_entry). */
static int route_change(ckptfs *fs, fuse_ino_t ino, fuse_ino_t *out)
{
    int err = route_change_or_damaged(fs, ino, out);
    return err == EUCLEAN ? EIO : err;
}

/* Names over NAME_MAX bytes fit in no directory here, as on a local
 * filesystem: the kernel passes up to 1024 bytes on to us, and without
 * this a lookup would say ENOENT and each side its own errno. Replies
 * ENAMETOOLONG (returns 1) for the first such name given. */
static int refuse_long_name(fuse_req_t req, const char *name, const char *other)
{
    if (strlen(name) <= NAME_MAX && (!other || strlen(other) <= NAME_MAX))
        return 0;
    fuse_reply_err(req, ENAMETOOLONG);
    return 1;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    fuse_ino_t p = route(fs, parent);
    if (p != parent && rops_is_view(fs, parent, name)) {
        /* A view of the old generation, through its directory (rm -r
         * of a checkpoint it is reopening goes on to remove it). */
        rops_lookup(req, fs, parent, name);
        return;
    }
    parent = p;
    if (ns_owns(parent)) {
        nsops_lookup(req, fs, parent, name);
        return;
    }
    if (wtable_owns(parent) && wops_lookup(req, fs, parent, name))
        return;
    rops_lookup(req, fs, parent, name);
}

static void forget_one(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup)
{
    if (ns_owns(ino))
        return; /* namespaces are numbered for the mount's lifetime */
    if (wtable_owns(ino))
        wops_forget(fs, ino, nlookup);
    else
        rops_forget(fs, ino, nlookup);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    forget_one(fs_of(req), ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    ckptfs *fs = fs_of(req);
    for (size_t i = 0; i < count; i++)
        forget_one(fs, forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    (void)fi;
    ino = route(fs, ino);
    if (ns_owns(ino)) {
        nsops_getattr(req, fs, ino);
        return;
    }
    if (wtable_owns(ino) && wops_getattr(req, fs, ino))
        return;
    rops_getattr(req, fs, ino);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (ns_owns(ino)) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (wtable_owns(ino) && wops_open(req, fs, ino, fi))
        return;
    /* A packed file opened for writing reopens its checkpoint; one whose
     * checkpoint is being written again opens the file written. */
    int writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
    fuse_ino_t w;
    int err = writing ? route_change(fs, ino, &w) : (w = route(fs, ino)) == ino ? ENOENT : 0;
    if (err == 0 && w != ino && wtable_owns(w)) {
        wops_open_fwd(req, fs, w, fi);
        return;
    }
    if (writing && err && err != EROFS) {
        fuse_reply_err(req, err);
        return;
    }
    rops_open(req, fs, ino, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_fwd) {
        if (!wops_read(req, fs, h->u.fwd.ino, size, off)) {
            struct fuse_file_info plain = *fi; /* committed since: from its pack */
            plain.fh = 0;
            rops_read(req, fs, h->u.fwd.ino, size, off, &plain);
        }
        return;
    }
    if (wtable_owns(ino) && wops_read(req, fs, ino, size, off))
        return;
    rops_read(req, fs, ino, size, off, fi);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_fwd) {
        wops_release(req, fs, h->u.fwd.ino, fi->flags);
        handle_drop(fs, h);
        return;
    }
    /* Files of writable checkpoints have no handle (fh 0); one opened
     * after its commit was opened by the read side, with a handle. */
    if (!h)
        wops_release(req, fs, ino, fi->flags);
    else
        rops_release(req, fs, h);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    ino = route(fs, ino);
    if (ns_owns(ino))
        nsops_opendir(req, fs, ino, fi);
    else if (!(wtable_owns(ino) && wops_opendir(req, fs, ino, fi)))
        rops_opendir(req, fs, ino, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_wlisting)
        wops_readdir(req, h, size, off);
    else if (h && h->is_root_listing)
        rops_readdir(req, fs, ino, size, off, &h->u.listing);
    else /* routed as opendir was: a namespace (a shell's cwd) may be a checkpoint by now */
        rops_readdir(req, fs, nsops_route(fs, ino), size, off, NULL);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (fi->fh)
        handle_drop(fs, (fs_handle *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    ckptfs *fs = fs_of(req);
    struct statvfs sv;
    (void)ino;
    if (fstatvfs(fs->table.backing_fd, &sv) != 0)
        memset(&sv, 0, sizeof sv);
    if (!fs->writable) {
        sv.f_bfree = sv.f_bavail = 0;
        sv.f_ffree = sv.f_favail = 0;
        sv.f_flag |= ST_RDONLY;
    }
    sv.f_namemax = NAME_MAX;
    fuse_reply_statfs(req, &sv);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    ckptfs *fs = fs_of(req);
    ino = route(fs, ino);
    if (ns_owns(ino))
        nsops_getxattr(req, fs, ino, name, size);
    else if (!(wtable_owns(ino) && wops_getxattr(req, fs, ino, name, size)))
        rops_getxattr(req, fs, ino, name, size);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    ckptfs *fs = fs_of(req);
    ino = route(fs, ino);
    if (ns_owns(ino))
        nsops_listxattr(req, fs, ino, size);
    else if (!(wtable_owns(ino) && wops_listxattr(req, fs, ino, size)))
        rops_listxattr(req, fs, ino, size);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
    ckptfs *fs = fs_of(req);
    ino = route(fs, ino);
    if (ns_owns(ino))
        nsops_setxattr(req, fs, ino, name);
    else if (!(wtable_owns(ino) && wops_setxattr(req, fs, ino, name, value, size)))
        rops_setxattr(req, fs, ino, name);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    fuse_reply_err(req, wtable_owns(ino) || ns_owns(ino) ? ENODATA : EROFS);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    ckptfs *fs = fs_of(req);
    ino = route(fs, ino);
    if (ns_owns(ino))
        fuse_reply_err(req, EINVAL);
    else if (!(wtable_owns(ino) && wops_readlink(req, fs, ino)))
        rops_readlink(req, fs, ino);
}

/* Not called with default_permissions (the kernel checks modes itself);
 * kept for mounts without it. Packs are read-only, the rest is not. */
static void op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
    ckptfs *fs = fs_of(req);
    int ro = !fs->writable || (!ns_owns(ino) && !wtable_owns(ino));
    fuse_reply_err(req, (mask & W_OK) && ro ? EROFS : 0);
}

/* Nothing to flush: packs are read-only and writes to checkpoints being
 * written reach the staging area before they return. ENOSYS makes the
 * kernel stop sending FLUSH on every close (files opened without
 * FUSE_OPEN cannot ask for that with noflush). */
/* Each close of a file being written: a write answered before it was
 * written (write_ops.c) and failed after is reported here, as close(2)
 * reports a failed writeback. Packed files ask for no flush (noflush). */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (!fs->writable) {
        /* Nothing to report on a read-only mount: the kernel stops asking
         * (where it opens without us, noflush cannot tell it). */
        fuse_reply_err(req, ENOSYS);
        return;
    }
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_fwd)
        ino = h->u.fwd.ino;
    if (!(wtable_owns(ino) && wops_flush(req, fs, ino)))
        fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)datasync;
    (void)fi;
    ckptfs *fs = fs_of(req);
    fs_handle *h = fi ? (fs_handle *)(uintptr_t)fi->fh : NULL;
    ino = h && h->is_fwd ? h->u.fwd.ino : route(fs, ino);
    if (wtable_owns(ino) && wops_fsync(req, fs, ino))
        return;
    fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    op_fsync(req, ino, datasync, fi);
}

/* ---- changes: checkpoints being written take them; packs do not ---- */

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    int err = route_change(fs, ino, &ino);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    if (ns_owns(ino)) {
        nsops_setattr(req, fs, ino, attr, to_set);
        return;
    }
    if (wtable_owns(ino) && wops_setattr(req, fs, ino, attr, to_set))
        return;
    fuse_reply_err(req, EROFS);
}

/* The changes below run on what route_change finds; a checkpoint
 * committed between that and the change is routed (reopened) once more. */
#define CHANGE_TRIES 2

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    for (int i = 0; i < CHANGE_TRIES; i++) {
        fuse_ino_t p;
        int err = route_change(fs, parent, &p);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        if (ns_owns(p)) {
            nsops_create(req, fs, p, name, mode, NULL);
            return;
        }
        if (wtable_owns(p) && wops_mknod(req, fs, p, name, mode))
            return;
    }
    fuse_reply_err(req, EROFS);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    for (int i = 0; i < CHANGE_TRIES; i++) {
        fuse_ino_t p;
        int err = route_change(fs, parent, &p);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        if (ns_owns(p)) {
            nsops_mkdir(req, fs, p, name, mode);
            return;
        }
        if (wtable_owns(p) && wops_mkdir(req, fs, p, name, mode))
            return;
    }
    fuse_reply_err(req, EROFS);
}

/* unlink and rmdir: in a committed checkpoint they reopen it, so the
 * removal lasts; where that cannot be, the entry is only hidden. */
static void remove_entry(fuse_req_t req, fuse_ino_t parent, const char *name, int want_dir)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    for (int i = 0; i < CHANGE_TRIES; i++) {
        fuse_ino_t p;
        int err = route_change_or_damaged(fs, parent, &p);
        if (err == EROFS || err == EACCES || err == EUCLEAN) {
            /* A view (tensors/) of a generation being replaced: rm -r of
             * a reopened checkpoint hides it on its way to deleting it,
             * which the log says; "only hidden until the next mount"
             * would not be true of it. A pack damaged in place since it
             * was opened cannot be reopened: its entries are hidden, so
             * that rm -r reaches the rmdir that deletes it (an EIO here
             * left it until a remount). */
            fuse_ino_t dir = nsops_route(fs, parent);
            rops_remove(req, fs, dir, name, want_dir, handover_is_rewritten(fs, dir));
            return;
        }
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        if (p != parent && rops_is_view(fs, parent, name)) {
            /* rm -r of a reopened checkpoint: its views go with its files. */
            fuse_reply_err(req, 0);
            return;
        }
        if (ns_owns(p)) {
            if (want_dir)
                nsops_rmdir(req, fs, p, name);
            else
                nsops_unlink(req, fs, p, name);
            return;
        }
        if (wtable_owns(p) &&
            (want_dir ? wops_rmdir(req, fs, p, name) : wops_unlink(req, fs, p, name)))
            return;
    }
    fuse_reply_err(req, EROFS);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_entry(req, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_entry(req, parent, name, 1);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    for (int i = 0; i < CHANGE_TRIES; i++) {
        fuse_ino_t p;
        int err = route_change(fs, parent, &p);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        if (ns_owns(p)) {
            nsops_symlink(req, fs, link, p, name);
            return;
        }
        if (wtable_owns(p) && wops_symlink(req, fs, link, p, name))
            return;
    }
    fuse_reply_err(req, EROFS);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, newname))
        return;
    fuse_ino_t p, np;
    int err = route_change(fs, parent, &p);
    if (!err)
        err = route_change(fs, newparent, &np);
    if (err)
        fuse_reply_err(req, err);
    else if (ns_owns(p) && ns_owns(np))
        nsops_rename(req, fs, p, name, np, newname, flags);
    else if (ns_owns(p) || ns_owns(np))
        fuse_reply_err(req, EXDEV);
    else if (wtable_owns(p) || wtable_owns(np))
        wops_rename(req, fs, p, name, np, newname, flags);
    else
        fuse_reply_err(req, EROFS);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    if (refuse_long_name(req, newname, NULL))
        return;
    fuse_reply_err(req, wtable_owns(newparent) || ns_owns(newparent) ? EPERM : EROFS);
}

/* write_buf rather than write, so that a request libfuse splices in from
 * the device (FUSE_CAP_SPLICE_READ) goes on to the staging file by splice
 * (wops_write_buf). It splices only when it can grow its pipes to a full
 * request (max_write + 4 KiB), past /proc/sys/fs/pipe-max-size (1 MiB),
 * which takes CAP_SYS_RESOURCE: root in a container may lack it, as on the
 * machines we test on. It would gain nothing for cp: since Linux 5.17 the
 * kernel copies a direct-I/O write's pages into the pipe rather than lend
 * them, so the data is copied twice either way (cp -r of 710 MB with
 * pipe-max-size raised to 2 MiB, splicing: 0.37-0.46 s; reading: 0.28-0.39
 * s, 3 rounds each, taking turns). */
static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                         struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_fwd)
        ino = h->u.fwd.ino;
    if (!(wtable_owns(ino) && wops_write_buf(req, fs, ino, bufv, off)))
        fuse_reply_err(req, EROFS);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (refuse_long_name(req, name, NULL))
        return;
    for (int i = 0; i < CHANGE_TRIES; i++) {
        fuse_ino_t p;
        int err = route_change(fs, parent, &p);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        if (ns_owns(p)) {
            nsops_create(req, fs, p, name, mode, fi);
            return;
        }
        if (wtable_owns(p) && wops_create(req, fs, p, name, mode, fi))
            return;
    }
    fuse_reply_err(req, EROFS);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                         struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (h && h->is_fwd)
        ino = h->u.fwd.ino;
    if (!(wtable_owns(ino) && wops_fallocate(req, fs, ino, mode, offset, length)))
        fuse_reply_err(req, EROFS);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    (void)userdata;
    /* More readahead requests in flight keep the decode workers busy. */
    if (conn->max_background < 64)
        conn->max_background = 64;
    if (conn->congestion_threshold < 48)
        conn->congestion_threshold = 48;
    conn->time_gran = 1;
    /* 1 MiB, though cp is steered to 256 KiB writes (WCKPT_WRITE_SIZE):
     * libfuse derives max_pages, the largest read request, from max_write,
     * and cold reads ran 3-5% faster at 1 MiB than at 256 KiB; writes at
     * st_blksize ran as fast or faster (a 2 GB cp -r 0.85-0.91 s against
     * 0.94-0.99 s; libfuse then reads requests instead of splicing them,
     * its pipe being too small). */
    conn->max_write = 1u << 20;
    /* No writeback cache: with it writes would return before reaching us,
     * so EBUSY (packing) and ENOSPC would surface only at close, as EIO,
     * and a commit could miss data still in the kernel. */
}

const struct fuse_lowlevel_ops ckptfs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readlink = op_readlink,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .symlink = op_symlink,
    .rename = op_rename,
    .link = op_link,
    .open = op_open,
    .read = op_read,
    .write_buf = op_write_buf,
    .flush = op_flush,
    .release = op_release,
    .fsync = op_fsync,
    .fsyncdir = op_fsyncdir,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .statfs = op_statfs,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
    .access = op_access,
    .create = op_create,
    .fallocate = op_fallocate,
};
