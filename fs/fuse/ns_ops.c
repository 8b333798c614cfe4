/* Namespace requests (ns_ops.h): names in the root and in the directories
 * above checkpoints, resolved against the write side, the backing
 * directory's namespaces and the read side, in that order. */
#include "ns_ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_mount.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "handles.h"
#include "read_ops.h"
#include "reply.h"
#include "write_ops.h"

/* Names in namespaces are looked up every time, so packs and checkpoints
 * appear, disappear and change kind at once. */
#define NS_ATTR_TIMEOUT 1.0

/* BACKING/path as a namespace: 1 with its stat, 0 if it is none. */
static int ns_stat(ckptfs *fs, const char *path, struct stat *st)
{
    return checkpoints_ns_stat(&fs->table, path, st);
}

static void ns_attr(ckptfs *fs, uint64_t ino, const struct stat *backing, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_atim = backing->st_atim;
    st->st_mtim = backing->st_mtim;
    st->st_ctim = backing->st_ctim;
    st->st_ino = ino;
    if (ino == FUSE_ROOT_ID)
        /* Writable when checkpoints can be written. */
        st->st_mode = S_IFDIR | (fs->writable ? 0755 : 0555);
    else
        st->st_mode = S_IFDIR | (backing->st_mode & (fs->writable ? 07777 : 07555));
    st->st_nlink = 1; /* unknown: keeps find from guessing subdirectories */
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
}

/* The path of a namespace inode, or NULL having replied ESTALE. */
static char *path_of(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    char *p = ns_path(&fs->ns, ino);
    if (!p)
        fuse_reply_err(req, ESTALE);
    return p;
}

/* parent's path joined with name, or NULL having replied. */
static char *child_of(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    char *dir = path_of(req, fs, parent);
    if (!dir)
        return NULL;
    char *full = backing_join(dir, name);
    free(dir);
    if (!full)
        fuse_reply_err(req, ENOMEM);
    return full;
}

fuse_ino_t nsops_route(ckptfs *fs, fuse_ino_t ino)
{
    if (ino == FUSE_ROOT_ID || !ns_owns(ino))
        return ino;
    char *path = ns_path(&fs->ns, ino);
    struct stat st;
    if (!path || ns_stat(fs, path, &st)) {
        free(path);
        return ino;
    }
    /* The checkpoint that took it over: path itself or one above. */
    fuse_ino_t out = ino;
    size_t len = strlen(path);
    for (size_t cut = len; cut > 0 && out == ino; cut--) {
        if (cut < len && path[cut] != '/')
            continue;
        char saved = path[cut];
        path[cut] = '\0';
        const char *rel = saved ? path + cut + 1 : "";
        wckpt *w = fs->writable ? wtable_get(&fs->wtable, path, 0) : NULL;
        uint32_t node;
        int err;
        checkpoint *c;
        if (w && wckpt_find(w, rel, &node) == 0) {
            out = wckpt_ino(w, node);
        } else if (!w && (c = checkpoints_lookup(&fs->table, path, 1, &err))) {
            /* Counted while it is used: a replacement landing meanwhile
             * would otherwise free it under us. */
            if (!c->is_file && checkpoint_open(&fs->table, c) == 0) {
                uint32_t n = pack_tree_find_written(c->tree, c->pack, rel, 0);
                if (n != TREE_NONE)
                    out = checkpoint_ino(c, n);
            }
            checkpoint_forget(&fs->table, c, 1);
        }
        path[cut] = saved;
    }
    free(path);
    return out;
}

static void reply_ns_entry(fuse_req_t req, ckptfs *fs, const char *path, const struct stat *b)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = ns_ino(&fs->ns, path);
    if (!e.ino) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    e.entry_timeout = 0.0;
    e.attr_timeout = NS_ATTR_TIMEOUT;
    ns_attr(fs, e.ino, b, &e.attr);
    fuse_reply_entry(req, &e);
}

void nsops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    char *full = child_of(req, fs, parent, name);
    if (!full)
        return;
    struct stat st;
    if (!backing_path_ok(full))
        fuse_reply_err(req, ENOENT);
    else if (wops_ckpt_lookup(req, fs, full))
        ;
    else if (ns_stat(fs, full, &st))
        reply_ns_entry(req, fs, full, &st);
    else if (!rops_lookup_checkpoint(req, fs, full))
        fuse_reply_err(req, ENOENT);
    free(full);
}

void nsops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    char *path = path_of(req, fs, ino);
    if (!path)
        return;
    struct stat b, st;
    if (ns_stat(fs, path, &b)) {
        ns_attr(fs, ino, &b, &st);
        fuse_reply_attr(req, &st, ino == FUSE_ROOT_ID ? 1.0 : NS_ATTR_TIMEOUT);
    } else {
        fuse_reply_err(req, ESTALE);
    }
    free(path);
}

void nsops_setattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct stat *attr, int to_set)
{
    char *path = path_of(req, fs, ino);
    if (!path)
        return;
    int rc = 0;
    if (!fs->writable)
        rc = EROFS;
    else if (to_set & FUSE_SET_ATTR_SIZE)
        rc = EISDIR;
    if (!rc && !*path) {
        /* The backing directory itself is the administrator's, so its mode
         * and times stay; but copies into the mount's root (rsync -a, cp -a
         * dir/. MNT/, tar with a ./ entry) set them and failed on EPERM. A
         * no-op, as chown is; the mount is private to its user anyway. */
        free(path);
        nsops_getattr(req, fs, ino);
        return;
    }
    int dir = rc ? -1 : backing_open_dir(fs->table.backing_fd, path, 0);
    if (!rc && dir < 0)
        rc = -dir;
    /* Packs keep no owner: chown succeeds as a no-op, as in checkpoints. */
    if (!rc && (to_set & FUSE_SET_ATTR_MODE) && fchmod(dir, attr->st_mode & 07777) != 0)
        rc = errno;
    if (!rc && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                          FUSE_SET_ATTR_MTIME_NOW))) {
        struct timespec ts[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
        if (to_set & FUSE_SET_ATTR_ATIME_NOW)
            ts[0].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_ATIME)
            ts[0] = attr->st_atim;
        if (to_set & FUSE_SET_ATTR_MTIME_NOW)
            ts[1].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_MTIME)
            ts[1] = attr->st_mtim;
        if (futimens(dir, ts) != 0)
            rc = errno;
    }
    struct stat b, st;
    if (!rc && fstat(dir, &b) != 0)
        rc = errno;
    if (dir >= 0)
        close(dir);
    if (rc) {
        fuse_reply_err(req, rc);
    } else {
        ns_attr(fs, ino, &b, &st);
        fuse_reply_attr(req, &st, NS_ATTR_TIMEOUT);
    }
    free(path);
}

void nsops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
    char *path = path_of(req, fs, ino);
    if (!path)
        return;
    fs_handle *h = calloc(1, sizeof *h);
    if (!h) {
        free(path);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->is_root_listing = 1;
    int rc = checkpoints_list(&fs->table, path, &h->u.listing);
    if (rc == 0) {
        rc = wops_listing_add(fs, path, &h->u.listing);
        if (rc)
            root_listing_free(&h->u.listing);
    }
    h->u.listing.parent = *path ? ns_parent_ino(&fs->ns, path) : FUSE_ROOT_ID;
    if (rc == 0 && !h->u.listing.parent)
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < h->u.listing.n; i++) {
        struct root_entry *e = &h->u.listing.entries[i];
        if (!e->is_ns)
            continue;
        char *sub = backing_join(path, e->name);
        e->ino = sub ? ns_ino(&fs->ns, sub) : 0;
        free(sub);
        if (!e->ino)
            rc = -ENOMEM;
    }
    free(path);
    if (rc) {
        if (h->u.listing.entries)
            root_listing_free(&h->u.listing);
        free(h);
        fuse_reply_err(req, -rc);
        return;
    }
    handle_reply_open(req, fs, h, fi);
}

void nsops_mkdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode)
{
    if (!fs->writable) {
        fuse_reply_err(req, EROFS);
        return;
    }
    char *full = child_of(req, fs, parent, name);
    if (!full)
        return;
    int rc = wtable_get(&fs->wtable, full, 0) ? -EEXIST : wtable_ns_mkdir(&fs->wtable, full, mode);
    struct stat st;
    if (rc == 0 && !ns_stat(fs, full, &st))
        rc = -EIO;
    if (rc)
        fuse_reply_err(req, -rc);
    else
        reply_ns_entry(req, fs, full, &st);
    free(full);
}

void nsops_rmdir(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    char *full = child_of(req, fs, parent, name);
    if (!full)
        return;
    struct stat st;
    if (fs->writable && !wtable_get(&fs->wtable, full, 0) && ns_stat(fs, full, &st)) {
        int rc = wtable_ns_rmdir(&fs->wtable, full);
        if (rc == 0)
            ns_removed(&fs->ns, full);
        fuse_reply_err(req, -rc);
    } else if (!fs->writable && ns_stat(fs, full, &st)) {
        fuse_reply_err(req, EROFS);
    } else {
        wops_ckpt_rmdir(req, fs, full);
    }
    free(full);
}

void nsops_unlink(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    char *full = child_of(req, fs, parent, name);
    if (!full)
        return;
    struct stat st;
    if (!wtable_get(&fs->wtable, full, 0) && ns_stat(fs, full, &st))
        fuse_reply_err(req, fs->writable ? EISDIR : EROFS);
    else
        wops_ckpt_unlink(req, fs, full);
    free(full);
}

/* Is name taken in a namespace? */
static int taken(ckptfs *fs, const char *full)
{
    struct stat st;
    int err;
    checkpoint *c;
    if (wtable_get(&fs->wtable, full, 0) || ns_stat(fs, full, &st))
        return 1;
    c = checkpoints_lookup(&fs->table, full, 0, &err);
    return c != NULL;
}

/* create (fi), mknod (neither) and symlink (target). */
static void make_entry(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                       struct fuse_file_info *fi, const char *target)
{
    if (!fs->writable) {
        fuse_reply_err(req, EROFS);
        return;
    }
    if (!fi && !target && !S_ISREG(mode)) {
        fslog_warn("cannot create '%s': a pack holds only regular files, directories and "
                   "symbolic links",
                   name);
        fuse_reply_err(req, EPERM);
        return;
    }
    char *dir = path_of(req, fs, parent);
    if (!dir)
        return;
    char *full = backing_join(dir, name);
    if (!full) {
        free(dir);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    wckpt *w = NULL;
    /* Not backing_path_ok(full): a file that makes its directory the
     * checkpoint is named as inside one (255 bytes, wops_create checks), and
     * one that is a checkpoint of its own is checked by wtable_create_file,
     * which tells ENAMETOOLONG from EINVAL. */
    int rc = taken(fs, full) ? -EEXIST : 0;
    if (rc == 0 && *dir) {
        /* The first file below a namespace that holds nothing else makes
         * it the checkpoint. */
        rc = wtable_ns_convert(&fs->wtable, dir, &w);
        if (rc == -ENOTEMPTY)
            rc = 0;
    }
    if (rc) {
        fuse_reply_err(req, -rc);
    } else if (w) {
        fuse_ino_t root = wckpt_ino(w, WTREE_ROOT);
        if (target)
            wops_symlink(req, fs, target, root, name);
        else if (fi)
            wops_create(req, fs, root, name, mode, fi);
        else
            wops_mknod(req, fs, root, name, mode);
        /* The kernel knows the directory by its namespace inode, which
         * nsops_route now leads here. */
        wtable_forget(&fs->wtable, w, 1);
    } else if (target) {
        wops_ckpt_symlink(req, fs, target, full);
    } else {
        wops_ckpt_create(req, fs, full, mode, fi);
    }
    free(dir);
    free(full);
}

void nsops_create(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                  struct fuse_file_info *fi)
{
    make_entry(req, fs, parent, name, mode, fi, NULL);
}

void nsops_symlink(fuse_req_t req, ckptfs *fs, const char *target, fuse_ino_t parent,
                   const char *name)
{
    make_entry(req, fs, parent, name, 0777, NULL, target);
}

void nsops_rename(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                  fuse_ino_t newparent, const char *newname, unsigned flags)
{
    char *from = child_of(req, fs, parent, name);
    if (!from)
        return;
    char *to = child_of(req, fs, newparent, newname);
    if (!to) {
        free(from);
        return;
    }
    struct stat st;
    if (!fs->writable) {
        fuse_reply_err(req, EROFS);
    } else if (!backing_path_ok(to)) {
        /* As mkdir says it (wtable_ns_mkdir): a name the pack suffix does
         * not fit after is too long, not invalid. */
        fuse_reply_err(req, strlen(backing_base(to)) + BACKING_SUFFIX_LEN > NAME_MAX ? ENAMETOOLONG
                                                                                     : EINVAL);
    } else if (!wtable_get(&fs->wtable, from, 0) && ns_stat(fs, from, &st)) {
        if (flags & ~(unsigned)RENAME_NOREPLACE) {
            fuse_reply_err(req, EINVAL);
        } else {
            int rc = wtable_ns_rename(&fs->wtable, from, to, (flags & RENAME_NOREPLACE) != 0);
            if (rc == 0)
                ns_renamed(&fs->ns, from, to);
            fuse_reply_err(req, -rc);
        }
    } else {
        wops_ckpt_rename(req, fs, from, to, flags);
    }
    free(from);
    free(to);
}

/* What the packs below a namespace add to its state: their bytes, and the
 * first that cannot be read (key mismatch or damaged), so that a namespace
 * never shows committed over a checkpoint that is not. */
typedef struct ns_packs {
    ckptfs *fs;
    unsigned count;
    uint64_t bytes;
    int check;             /* open the packs: the state or error is asked */
    const char *bad_state; /* NULL: every pack opens */
    char error[512];
    char name[BACKING_PATH_MAX + 1]; /* the path being walked */
} ns_packs;

/* Opens the pack of checkpoint p->name (once: the table keeps it open). */
static void check_pack(ns_packs *p)
{
    int err;
    checkpoint *c = checkpoints_lookup(&p->fs->table, p->name, 1, &err);
    if (!c)
        return;
    const char *state = checkpoint_state_name(&p->fs->table, c);
    if (strcmp(state, CKPT_STATE_COMMITTED) != 0) {
        p->bad_state = state;
        if (!checkpoint_get_error(c, p->error, sizeof p->error))
            snprintf(p->error, sizeof p->error, "%.400s: %s", p->name, state);
    }
    checkpoint_forget(&p->fs->table, c, 1);
}

/* Walks the namespace at fd, whose path p->name holds (len bytes). */
static void walk_packs(ns_packs *p, int fd, size_t len, int depth)
{
    int dup_fd = dup(fd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return;
    }
    rewinddir(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            len + 1 + n > BACKING_PATH_MAX)
            continue;
        snprintf(p->name + len, sizeof p->name - len, "/%s", e->d_name);
        if (S_ISDIR(st.st_mode) && depth < 64) {
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            if (sub >= 0) {
                walk_packs(p, sub, len + 1 + n, depth + 1);
                close(sub);
            }
        } else if (S_ISREG(st.st_mode) && n > BACKING_SUFFIX_LEN &&
                   (strcmp(e->d_name + n - BACKING_SUFFIX_LEN, BACKING_PACK_SUFFIX) == 0 ||
                    strcmp(e->d_name + n - BACKING_SUFFIX_LEN, BACKING_FILE_SUFFIX) == 0)) {
            p->bytes += (uint64_t)st.st_size;
            p->count++;
            if (p->check && !p->bad_state) {
                p->name[len + 1 + n - BACKING_SUFFIX_LEN] = 0;
                check_pack(p);
            }
        }
        p->name[len] = 0;
    }
    closedir(d);
}

/* A namespace's state attributes sum up what is below it, so that
 * `ckpt status` and `ckpt commit --wait` treat it as one checkpoint:
 * writing, packing or failed while a checkpoint below is, else key
 * mismatch or damaged when a pack below is, else committed. */
void nsops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size)
{
    if (ino == FUSE_ROOT_ID) { /* the mount itself: ckpt status lists what is in it */
        fuse_reply_err(req, ENODATA);
        return;
    }
    char *path = path_of(req, fs, ino);
    if (!path)
        return;
    wns_state st;
    memset(&st, 0, sizeof st);
    st.state = WST_COMMITTED;
    if (fs->writable)
        wtable_ns_state(&fs->wtable, path, &st);
    ns_packs *packs = calloc(1, sizeof *packs);
    if (!packs) {
        free(path);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    packs->fs = fs;
    /* Opening packs only tells the state: size and progress need none. */
    packs->check =
        !st.rank && (strcmp(name, CKPT_XATTR_STATE) == 0 || strcmp(name, CKPT_XATTR_ERROR) == 0);
    int fd = backing_open_dir(fs->table.backing_fd, path, 0);
    size_t len = strlen(path);
    if (fd >= 0 && len <= BACKING_PATH_MAX) {
        memcpy(packs->name, path, len + 1);
        walk_packs(packs, fd, len, 0);
    }
    if (fd >= 0)
        close(fd);
    /* Nothing in it yet: waiting for data, as a new checkpoint would. */
    if (!st.rank && !packs->count)
        st.state = WST_WRITING;
    const char *bad = st.rank ? NULL : packs->bad_state;
    char value[640];
    int len_out = -1;
    if (strcmp(name, CKPT_XATTR_STATE) == 0) {
        len_out = snprintf(value, sizeof value, "%s", bad ? bad : wstate_name(st.state));
    } else if (strcmp(name, CKPT_XATTR_SIZE) == 0) {
        len_out = snprintf(value, sizeof value, "%" PRIu64, st.size + packs->bytes);
    } else if (strcmp(name, CKPT_XATTR_PROGRESS) == 0) {
        len_out = snprintf(value, sizeof value, "%" PRIu64 " %" PRIu64 " %.3f", st.done, st.total,
                           st.seconds);
    } else if (strcmp(name, CKPT_XATTR_ERROR) == 0 && bad) {
        len_out = snprintf(value, sizeof value, "%s", packs->error);
    } else if (strcmp(name, CKPT_XATTR_ERROR) == 0 && st.state == WST_FAILED) {
        len_out = snprintf(value, sizeof value, "%s", st.error);
    }
    free(packs);
    free(path);
    if (len_out < 0)
        fuse_reply_err(req, ENODATA);
    else
        reply_xattr_value(
            req, value, (size_t)len_out < sizeof value ? (size_t)len_out : sizeof value - 1, size);
}

void nsops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size)
{
    static const char names[] = CKPT_XATTR_STATE "\0" CKPT_XATTR_PROGRESS "\0" CKPT_XATTR_SIZE;
    (void)fs;
    reply_xattr_value(req, names, ino == FUSE_ROOT_ID ? 0 : sizeof names, size);
}

void nsops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name)
{
    if (strcmp(name, CKPT_XATTR_COMMIT) != 0) {
        fuse_reply_err(req, ENOTSUP);
        return;
    }
    char *path = path_of(req, fs, ino);
    if (!path)
        return;
    /* Done with everything below: commit it. An empty directory is an
     * empty checkpoint. */
    int rc = fs->writable ? wtable_commit_below(&fs->wtable, path) : 0;
    if (rc == 0 && fs->writable && *path) {
        wckpt *w;
        if (wtable_ns_convert(&fs->wtable, path, &w) == 0) {
            rc = wtable_commit(&fs->wtable, w);
            wtable_forget(&fs->wtable, w, 1);
        }
    }
    free(path);
    fuse_reply_err(req, rc < 0 ? -rc : 0);
}
