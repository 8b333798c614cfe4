/* The FUSE low-level operations: map inodes to checkpoints and tree nodes,
 * answer from the tree, and hand reads to the reader. */
#include "ckptfs.h"
#include "readahead.h"
#include "wops.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Everything inside a pack is immutable and a changed pack gets new inode
 * numbers, so the kernel may cache those entries, attributes and pages for
 * as long as it likes. Names in the root must be looked up every time so
 * packs appear and disappear at once. */
#define PACK_TIMEOUT 86400.0
#define ROOT_ATTR_TIMEOUT 1.0

#define XATTR_DTYPE "user.ckptfs.dtype"
#define XATTR_SHAPE "user.ckptfs.shape"
#define XATTR_SHA256 "user.ckptfs.sha256"
#define XATTR_STATE "user.ckptfs.state"
#define XATTR_PROGRESS "user.ckptfs.progress"
#define XATTR_SIZE "user.ckptfs.size"
#define XATTR_COMMIT "user.ckptfs.commit"

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

static void root_attr(ckptfs *fs, struct stat *st)
{
    struct stat backing;
    memset(st, 0, sizeof *st);
    if (fstat(fs->table.backing_fd, &backing) == 0) {
        st->st_atim = backing.st_atim;
        st->st_mtim = backing.st_mtim;
        st->st_ctim = backing.st_ctim;
    }
    st->st_ino = FUSE_ROOT_ID;
    /* Writable when checkpoints can be written: mkdir makes one. */
    st->st_mode = S_IFDIR | (fs->writable ? 0755 : 0555);
    st->st_nlink = 1; /* unknown: keeps find from guessing subdirectories */
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
}

/* A checkpoint dir: readable (and searchable) by whoever may read the pack. */
static void checkpoint_dir_attr(ckptfs *fs, const checkpoint *c, struct stat *st)
{
    memset(st, 0, sizeof *st);
    mode_t readable = c->identity.st_mode & 0444;
    st->st_ino = checkpoint_ino(c, TREE_ROOT);
    /* Owner-writable when the mount is: removing the entries (only hides
     * them) and then the directory is how a checkpoint is deleted. */
    st->st_mode = S_IFDIR | readable | (readable >> 2) | (fs->writable ? 0200 : 0);
    st->st_nlink = 1;
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_atim = c->identity.st_mtim;
    st->st_mtim = c->identity.st_mtim;
    st->st_ctim = c->identity.st_mtim;
}

static void node_attr(ckptfs *fs, const checkpoint *c, uint32_t node, struct stat *st)
{
    if (node == TREE_ROOT) {
        checkpoint_dir_attr(fs, c, st);
        return;
    }
    const tree_node *n = &c->tree->nodes[node];
    memset(st, 0, sizeof *st);
    st->st_ino = checkpoint_ino(c, node);
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_mtim.tv_sec = n->mtime_sec;
    st->st_mtim.tv_nsec = n->mtime_nsec;
    st->st_atim = st->st_mtim;
    st->st_ctim = st->st_mtim;
    if (n->kind == TREE_DIR) {
        st->st_mode = S_IFDIR | n->mode | (fs->writable ? 0200 : 0);
        st->st_nlink = 2 + n->n_subdirs;
        return;
    }
    st->st_mode = S_IFREG | n->mode;
    st->st_nlink = 1;
    st->st_size = (off_t)n->size;
    st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
    /* st_blksize stays the page size: readers that size their buffers by it
     * (cat, cp) then copy through buffers that fit in the CPU cache, which
     * matters once the data is in the page cache. */
}

/* The opened checkpoint and node of an inode inside a pack, or an errno. */
static int resolve(ckptfs *fs, fuse_ino_t ino, checkpoint **c, uint32_t *node)
{
    if (wtable_owns(ino))
        return wops_translate(fs, ino, c, node);
    *c = checkpoints_find(&fs->table, ino, node);
    if (!*c)
        return ESTALE;
    int rc = checkpoint_open(&fs->table, *c);
    if (rc)
        return -rc;
    if (*node >= (*c)->tree->n_nodes)
        return ESTALE;
    return 0;
}

/* resolve() for the operations that only make sense on a directory. */
static int resolve_dir(ckptfs *fs, fuse_ino_t ino, checkpoint **c, uint32_t *node)
{
    int err = resolve(fs, ino, c, node);
    if (!err && (*c)->tree->nodes[*node].kind != TREE_DIR)
        err = ENOTDIR;
    return err;
}

static void reply_entry(fuse_req_t req, ckptfs *fs, checkpoint *c, uint32_t node,
                        double entry_timeout, double attr_timeout)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = checkpoint_ino(c, node);
    e.entry_timeout = entry_timeout;
    e.attr_timeout = attr_timeout;
    node_attr(fs, c, node, &e.attr);
    /* The kernel holds the reference only if the reply reached it. */
    if (fuse_reply_entry(req, &e) != 0)
        checkpoint_forget(&fs->table, c, 1);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID && wops_root_lookup(req, fs, name))
        return;
    if (wtable_owns(parent) && wops_lookup(req, fs, parent, name))
        return;
    if (parent == FUSE_ROOT_ID) {
        int err;
        checkpoint *c = checkpoints_lookup(&fs->table, name, 1, &err);
        if (!c) {
            fuse_reply_err(req, -err);
            return;
        }
        reply_entry(req, fs, c, TREE_ROOT, 0.0, PACK_TIMEOUT);
        return;
    }
    checkpoint *c;
    uint32_t node;
    int err = resolve_dir(fs, parent, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    uint32_t child = pack_tree_lookup(c->tree, node, name);
    if (child != TREE_NONE && wops_pack_hidden(c, child)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (child == TREE_NONE) {
        /* A negative entry the kernel may keep: the pack never changes. */
        struct fuse_entry_param e;
        memset(&e, 0, sizeof e);
        e.entry_timeout = PACK_TIMEOUT;
        fuse_reply_entry(req, &e);
        return;
    }
    checkpoint_count_lookup(&fs->table, c);
    reply_entry(req, fs, c, child, PACK_TIMEOUT, PACK_TIMEOUT);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    ckptfs *fs = fs_of(req);
    uint32_t node;
    if (wtable_owns(ino))
        wops_forget(fs, ino, nlookup);
    checkpoint *c = ino == FUSE_ROOT_ID || wtable_owns(ino) ? NULL
                                                            : checkpoints_find(&fs->table, ino, &node);
    if (c)
        checkpoint_forget(&fs->table, c, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    ckptfs *fs = fs_of(req);
    for (size_t i = 0; i < count; i++) {
        uint32_t node;
        if (wtable_owns(forgets[i].ino)) {
            wops_forget(fs, forgets[i].ino, forgets[i].nlookup);
            continue;
        }
        checkpoint *c = forgets[i].ino == FUSE_ROOT_ID
                            ? NULL
                            : checkpoints_find(&fs->table, forgets[i].ino, &node);
        if (c)
            checkpoint_forget(&fs->table, c, forgets[i].nlookup);
    }
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    struct stat st;
    (void)fi;
    if (ino == FUSE_ROOT_ID) {
        root_attr(fs, &st);
        fuse_reply_attr(req, &st, ROOT_ATTR_TIMEOUT);
        return;
    }
    if (wtable_owns(ino) && wops_getattr(req, fs, ino))
        return;
    uint32_t node;
    checkpoint *c = checkpoints_find(&fs->table, ino, &node);
    if (c && node == TREE_ROOT) {
        /* Listing a pack must not need its key: no open here. */
        checkpoint_dir_attr(fs, c, &st);
        fuse_reply_attr(req, &st, PACK_TIMEOUT);
        return;
    }
    int err = resolve(fs, ino, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    node_attr(fs, c, node, &st);
    fuse_reply_attr(req, &st, PACK_TIMEOUT);
}

static void handle_track(ckptfs *fs, fs_handle *h)
{
    pthread_mutex_lock(&fs->handles_lock);
    h->next = fs->handles.next;
    h->prev = &fs->handles;
    fs->handles.next->prev = h;
    fs->handles.next = h;
    pthread_mutex_unlock(&fs->handles_lock);
}

static void handle_untrack(ckptfs *fs, fs_handle *h)
{
    pthread_mutex_lock(&fs->handles_lock);
    h->prev->next = h->next;
    h->next->prev = h->prev;
    pthread_mutex_unlock(&fs->handles_lock);
}

static void handle_free(ckptfs *fs, fs_handle *h)
{
    if (h->is_root_listing) {
        root_listing_free(&h->u.listing);
    } else if (h->is_wlisting) {
        wdirents_free(h->u.wlisting.entries, h->u.wlisting.n);
    } else {
        checkpoint_unref(&fs->table, h->u.file.checkpoint);
    }
    free(h);
}

void ckptfs_track_handle(ckptfs *fs, fs_handle *h)
{
    handle_track(fs, h);
}

void ckptfs_drop_handle(ckptfs *fs, fs_handle *h)
{
    handle_untrack(fs, h);
    handle_free(fs, h);
}

void ckptfs_free_handles(ckptfs *fs)
{
    while (fs->handles.next != &fs->handles) {
        fs_handle *h = fs->handles.next;
        handle_untrack(fs, h);
        handle_free(fs, h);
    }
}

/* Opening a packed file needs nothing from us once its lookup worked:
 * packs are immutable and the kernel checks permissions. So on a read-only
 * mount (-o ro), where the kernel supports it, the first open answers
 * ENOSYS, which
 * makes the kernel stop sending FUSE_OPEN and FUSE_RELEASE altogether and
 * keep cached pages across opens (its default for no-open). That saves
 * two round trips per file: about 15 us of some 37 us per small file,
 * which shows on checkpoints of many small tensors. */
static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (ino == FUSE_ROOT_ID) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (wtable_owns(ino) && wops_open(req, fs, ino, fi))
        return;
    checkpoint *c;
    uint32_t node;
    int err = resolve(fs, ino, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    if (c->tree->nodes[node].kind == TREE_DIR) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        fuse_reply_err(req, EROFS);
        return;
    }
    /* Only on a read-only mount: once the kernel stops sending opens, an
     * open for writing of a packed file could no longer be refused. */
    if (fs->no_open && !fs->writable) {
        fuse_reply_err(req, ENOSYS);
        return;
    }
    fs_handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->u.file.checkpoint = c;
    h->u.file.node = node;
    checkpoint_ref(&fs->table, c);
    handle_track(fs, h);
    fi->fh = (uintptr_t)h;
    /* Packs are immutable: pages cached by an earlier open stay valid. */
    fi->keep_cache = 1;
    fi->noflush = 1;
    if (fuse_reply_open(req, fi) != 0) {
        handle_untrack(fs, h);
        handle_free(fs, h);
    }
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    checkpoint *c;
    uint32_t node;
    if (wtable_owns(ino) && wops_read(req, fs, ino, size, off))
        return;
    if (fi->fh) {
        fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
        c = h->u.file.checkpoint;
        node = h->u.file.node;
    } else {
        /* No handle: the open file pins the inode, so the kernel's
         * reference keeps the checkpoint alive. */
        int err = resolve(fs, ino, &c, &node);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
    }
    if (off < 0 || c->tree->nodes[node].kind == TREE_DIR) {
        fuse_reply_err(req, off < 0 ? EINVAL : EISDIR);
        return;
    }
    read_plan plan;
    int rc = reader_read(&fs->reader, c, node, (uint64_t)off, size, &plan);
    if (rc) {
        fuse_reply_err(req, -rc);
        return;
    }
    if (plan.n == 0)
        fuse_reply_buf(req, NULL, 0);
    else
        fuse_reply_iov(req, plan.iov, (int)plan.n);
    read_plan_release(&fs->reader, &plan);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
    if (wtable_owns(ino) || !h) {
        /* Files of writable checkpoints have no handle (fh 0). */
        wops_release(req, fs, ino);
        return;
    }
    handle_untrack(fs, h);
    handle_free(fs, h);
    fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (ino == FUSE_ROOT_ID) {
        fs_handle *h = calloc(1, sizeof *h);
        if (!h) {
            fuse_reply_err(req, ENOMEM);
            return;
        }
        h->is_root_listing = 1;
        int rc = checkpoints_list(&fs->table, &h->u.listing);
        if (rc == 0) {
            rc = wops_root_listing_add(fs, &h->u.listing);
            if (rc)
                root_listing_free(&h->u.listing);
        }
        if (rc) {
            free(h);
            fuse_reply_err(req, -rc);
            return;
        }
        handle_track(fs, h);
        fi->fh = (uintptr_t)h;
        if (fuse_reply_open(req, fi) != 0) {
            handle_untrack(fs, h);
            handle_free(fs, h);
        }
        return;
    }
    if (wtable_owns(ino) && wops_opendir(req, fs, ino, fi))
        return;
    checkpoint *c;
    uint32_t node;
    int err = resolve_dir(fs, ino, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    fi->fh = 0;
    /* Cached listings are dropped by the kernel when an entry is removed
     * (hidden) through this mount. */
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

/* Adds one entry; 0 when it did not fit. */
static size_t add_entry(fuse_req_t req, char *buf, size_t used, size_t size, const char *name,
                        uint64_t ino, mode_t type, off_t next)
{
    struct stat st;
    memset(&st, 0, sizeof st);
    st.st_ino = ino;
    st.st_mode = type;
    size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, next);
    return need > size - used ? 0 : need;
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    checkpoint *c = NULL;
    uint32_t node = 0;
    const root_listing *listing = NULL;
    if (fi->fh && ((fs_handle *)(uintptr_t)fi->fh)->is_wlisting) {
        wops_readdir(req, (fs_handle *)(uintptr_t)fi->fh, size, off);
        return;
    }
    if (ino == FUSE_ROOT_ID) {
        listing = &((fs_handle *)(uintptr_t)fi->fh)->u.listing;
    } else {
        int err = resolve(fs, ino, &c, &node);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    const tree_node *dir = c ? &c->tree->nodes[node] : NULL;
    uint64_t self = c ? checkpoint_ino(c, node) : FUSE_ROOT_ID;
    uint64_t parent = !c || node == TREE_ROOT ? FUSE_ROOT_ID : checkpoint_ino(c, dir->parent);
    size_t total = c ? 2 + (size_t)dir->n_children : 2 + listing->n;
    size_t used = 0;
    for (size_t i = off < 0 ? 0 : (size_t)off; i < total; i++) {
        const char *name;
        uint64_t entry_ino;
        mode_t type = S_IFDIR;
        if (i == 0) {
            name = ".";
            entry_ino = self;
        } else if (i == 1) {
            name = "..";
            entry_ino = parent;
        } else if (c) {
            uint32_t child = dir->children[i - 2];
            if (wops_pack_hidden(c, child))
                continue;
            name = c->tree->nodes[child].name;
            entry_ino = checkpoint_ino(c, child);
            if (c->tree->nodes[child].kind != TREE_DIR)
                type = S_IFREG;
        } else {
            name = listing->entries[i - 2].name;
            entry_ino = listing->entries[i - 2].ino;
        }
        size_t added = add_entry(req, buf, used, size, name, entry_ino, type, (off_t)(i + 1));
        if (!added)
            break;
        used += added;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (fi->fh) {
        fs_handle *h = (fs_handle *)(uintptr_t)fi->fh;
        handle_untrack(fs, h);
        handle_free(fs, h);
    }
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

/* The value of one of the tensor attributes into buf (NUL-terminated);
 * its length, or -1 for an attribute the tensor does not have. */
static long tensor_xattr(const ckpt_tensor_info *t, const char *name, char *buf, size_t cap)
{
    if (strcmp(name, XATTR_DTYPE) == 0)
        return snprintf(buf, cap, "%s", t->dtype);
    if (strcmp(name, XATTR_SHA256) == 0) {
        char hex[65];
        ckpt_hex32(t->sha256, hex);
        return snprintf(buf, cap, "%s", hex);
    }
    if (strcmp(name, XATTR_SHAPE) == 0) {
        size_t len = 0;
        len += (size_t)snprintf(buf, cap, "[");
        for (uint32_t d = 0; d < t->ndim && len < cap; d++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "]");
        return len < cap ? (long)len : -2;
    }
    return -1;
}

static void reply_xattr_value(fuse_req_t req, const char *value, size_t len, size_t size)
{
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, value, len);
}

/* The tensor an inode shows, or NULL. */
static const ckpt_tensor_info *tensor_of(ckptfs *fs, fuse_ino_t ino)
{
    checkpoint *c;
    uint32_t node;
    if (ino == FUSE_ROOT_ID || !checkpoints_find(&fs->table, ino, &node) || node == TREE_ROOT ||
        resolve(fs, ino, &c, &node))
        return NULL;
    const tree_node *n = &c->tree->nodes[node];
    return n->kind == TREE_TENSOR ? ckpt_tensor_at(c->pack, n->tensor_index) : NULL;
}

/* The state attributes of a committed checkpoint's directory, so that
 * `ckpt status` and `ckpt commit --wait` read every checkpoint alike. */
static long committed_xattr(const checkpoint *c, const char *name, char *buf, size_t cap)
{
    if (strcmp(name, XATTR_STATE) == 0)
        return snprintf(buf, cap, "committed");
    if (strcmp(name, XATTR_SIZE) == 0)
        return snprintf(buf, cap, "%" PRIu64, (uint64_t)c->identity.st_size);
    if (strcmp(name, XATTR_PROGRESS) == 0)
        return snprintf(buf, cap, "%" PRIu64 " %" PRIu64 " 0", (uint64_t)c->identity.st_size,
                        (uint64_t)c->identity.st_size);
    return -1;
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    ckptfs *fs = fs_of(req);
    if (wtable_owns(ino) && wops_getxattr(req, fs, ino, name, size))
        return;
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    if (!c && wtable_owns(ino) && resolve(fs, ino, &c, &node) != 0)
        c = NULL;
    if (c && node == TREE_ROOT) {
        char value[64];
        long len = committed_xattr(c, name, value, sizeof value);
        if (len < 0)
            fuse_reply_err(req, ENODATA);
        else
            reply_xattr_value(req, value, (size_t)len, size);
        return;
    }
    const ckpt_tensor_info *t = tensor_of(fs, ino);
    if (!t) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    /* Room for the longest shape: 32 dimensions of 20 digits. */
    size_t cap = 32 + (size_t)t->ndim * 24;
    char *value = malloc(cap);
    if (!value) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    long len = tensor_xattr(t, name, value, cap);
    if (len == -1)
        fuse_reply_err(req, ENODATA);
    else if (len < 0)
        fuse_reply_err(req, EIO);
    else
        reply_xattr_value(req, value, (size_t)len, size);
    free(value);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    static const char names[] = XATTR_DTYPE "\0" XATTR_SHAPE "\0" XATTR_SHA256;
    static const char dir_names[] = XATTR_STATE "\0" XATTR_PROGRESS "\0" XATTR_SIZE;
    ckptfs *fs = fs_of(req);
    if (wtable_owns(ino) && wops_listxattr(req, fs, ino, size))
        return;
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    if (c && node == TREE_ROOT)
        reply_xattr_value(req, dir_names, sizeof dir_names, size);
    else if (tensor_of(fs, ino))
        reply_xattr_value(req, names, sizeof names, size);
    else
        reply_xattr_value(req, "", 0, size);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
    ckptfs *fs = fs_of(req);
    if (wtable_owns(ino) && wops_setxattr(req, fs, ino, name, value, size))
        return;
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    /* `ckpt commit` on a checkpoint that is already committed: done. */
    if (c && node == TREE_ROOT && strcmp(name, XATTR_COMMIT) == 0) {
        fuse_reply_err(req, 0);
        return;
    }
    fuse_reply_err(req, EROFS);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    fuse_reply_err(req, wtable_owns(ino) ? ENODATA : EROFS);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    fuse_reply_err(req, EINVAL);
}

/* Not called with default_permissions (the kernel checks modes itself);
 * kept for mounts without it. Packs are read-only, the rest is not. */
static void op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
    ckptfs *fs = fs_of(req);
    int ro = !fs->writable || (ino != FUSE_ROOT_ID && !wtable_owns(ino));
    fuse_reply_err(req, (mask & W_OK) && ro ? EROFS : 0);
}

/* Nothing to flush: packs are read-only and writes to checkpoints being
 * written reach the staging area before they return. ENOSYS makes the
 * kernel stop sending FLUSH on every close (files opened without
 * FUSE_OPEN cannot ask for that with noflush). */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    fuse_reply_err(req, ENOSYS);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)datasync;
    (void)fi;
    ckptfs *fs = fs_of(req);
    if (wtable_owns(ino) && wops_fsync(req, fs, ino))
        return;
    fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    op_fsync(req, ino, datasync, fi);
}

/* ---- changes: checkpoints being written take them; packs do not ---- */

/* EROFS for a pack; an entry inside a committed checkpoint is for
 * `rm -r`, see wops_pack_hide. */
static void remove_in_pack(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name,
                           int want_dir)
{
    checkpoint *c;
    uint32_t node;
    int err = resolve_dir(fs, parent, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    fuse_reply_err(req, -wops_pack_hide(fs, c, node, name, want_dir));
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (wtable_owns(ino) && wops_setattr(req, fs, ino, attr, to_set))
        return;
    fuse_reply_err(req, EROFS);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID && fs->writable)
        wops_root_refuse(req, name, "a file");
    else if (!(wtable_owns(parent) && wops_mknod(req, fs, parent, name, mode)))
        fuse_reply_err(req, EROFS);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID)
        wops_root_mkdir(req, fs, name, mode);
    else if (!(wtable_owns(parent) && wops_mkdir(req, fs, parent, name, mode)))
        fuse_reply_err(req, EROFS);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID)
        fuse_reply_err(req, fs->writable ? EISDIR : EROFS);
    else if (!(wtable_owns(parent) && wops_unlink(req, fs, parent, name)))
        remove_in_pack(req, fs, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID)
        wops_root_rmdir(req, fs, name);
    else if (!(wtable_owns(parent) && wops_rmdir(req, fs, parent, name)))
        remove_in_pack(req, fs, parent, name, 1);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID && fs->writable)
        wops_root_refuse(req, name, "a symbolic link");
    else if (wtable_owns(parent))
        fuse_reply_err(req, EPERM); /* a pack holds no links */
    else
        fuse_reply_err(req, EROFS);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID && newparent == FUSE_ROOT_ID)
        wops_root_rename(req, fs, name, newname, flags);
    else if (wtable_owns(parent) || wtable_owns(newparent))
        wops_rename(req, fs, parent, name, newparent, newname, flags);
    else
        fuse_reply_err(req, parent == FUSE_ROOT_ID || newparent == FUSE_ROOT_ID ? EXDEV : EROFS);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    fuse_reply_err(req, wtable_owns(newparent) ? EPERM : EROFS);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (!(wtable_owns(ino) && wops_write(req, fs, ino, buf, size, off)))
        fuse_reply_err(req, EROFS);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (parent == FUSE_ROOT_ID && fs->writable)
        wops_root_refuse(req, name, "a file");
    else if (!(wtable_owns(parent) && wops_create(req, fs, parent, name, mode, fi)))
        fuse_reply_err(req, EROFS);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                         struct fuse_file_info *fi)
{
    ckptfs *fs = fs_of(req);
    if (!(wtable_owns(ino) && wops_fallocate(req, fs, ino, mode, offset, length)))
        fuse_reply_err(req, EROFS);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    ckptfs *fs = userdata;
    fs->no_open = (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) != 0;
    /* More readahead requests in flight keep the decode workers busy. */
    if (conn->max_background < 64)
        conn->max_background = 64;
    if (conn->congestion_threshold < 48)
        conn->congestion_threshold = 48;
    conn->time_gran = 1;
    /* Writers into checkpoints: 1 MiB per request (st_blksize makes cp
     * write that much at once) costs an eighth of the trips of 128 KiB. */
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
    .write = op_write,
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
