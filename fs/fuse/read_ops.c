/* The read side's requests: inodes inside packs, answered from the pack
 * tree, with reads handed to the reader. Inodes of checkpoints committed
 * since their lookup come here too, through handover_resolve. */
#include "read_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_mount.h"
#include "handles.h"
#include "handover.h"
#include "reply.h"

/* Everything inside a pack is immutable and a changed pack gets new inode
 * numbers, so the kernel may cache those entries, attributes and pages for
 * as long as it likes. Names in the root must be looked up every time so
 * packs appear and disappear at once. */
#define PACK_TIMEOUT 86400.0

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

/* What a file takes on disk, in 512-byte blocks, so that du of a checkpoint
 * shows what its pack takes and not what unpacking it would: a packed
 * file's share of the pack (its size times the pack's size over the sum of
 * the packed sizes). manifest.json and tensors/ are views of the packed
 * files that take no space of their own: 0, so du does not count the
 * tensors twice. */
static blkcnt_t packed_blocks(const checkpoint *c, const tree_node *n)
{
    if (n->kind != TREE_FILE)
        return 0;
    ckpt_pack_info info;
    ckpt_info(c->pack, &info);
    if (!info.logical_bytes)
        return 0;
    double share = (double)n->size * (double)c->identity.st_size / (double)info.logical_bytes;
    return (blkcnt_t)(share / 512.0 + 0.5);
}

/* A single-file checkpoint whose pack cannot be read (damaged): still a
 * file, so that it can be removed (unlink(2) looks the name up first; an
 * EIO there made it impossible), with no contents to show (opens fail with
 * EIO, as the pack's reads would). Its size is the pack's: 0 would tell
 * size-only tools (rsync --size-only, loaders skipping empty files) it
 * is a good empty file. */
static void damaged_file_attr(ckptfs *fs, const checkpoint *c, struct stat *st)
{
    checkpoint_dir_attr(fs, c, st);
    st->st_mode = S_IFREG | (c->identity.st_mode & 0444) | (fs->writable ? 0200 : 0);
    st->st_size = c->identity.st_size;
}

static void node_attr(ckptfs *fs, const checkpoint *c, uint32_t node, struct stat *st)
{
    if (node == TREE_ROOT && c->is_file) {
        damaged_file_attr(fs, c, st); /* the only way such a lookup ends here */
        return;
    }
    if (node == TREE_ROOT) {
        checkpoint_dir_attr(fs, c, st);
        return;
    }
    const tree_node *n = &c->tree->nodes[node];
    memset(st, 0, sizeof *st);
    /* A single-file checkpoint's file has its checkpoint's number: the one
     * a namespace's listing gives it without opening the pack. The kernel
     * still knows it by its own node. */
    st->st_ino =
        checkpoint_ino(c, c->is_file && node == checkpoint_entry_node(c) ? TREE_ROOT : node);
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
    if (n->kind == TREE_LINK) {
        st->st_mode = S_IFLNK | 0777;
        st->st_nlink = 1;
        st->st_size = (off_t)n->size;
        return;
    }
    /* On a writable mount a packed file can be written again (the
     * checkpoint is reopened): its mode as written, less the set-id bits,
     * which a pack from elsewhere must not bring in (as on -o ro and in
     * ckpt unpack). */
    st->st_mode = S_IFREG | (fs->writable && n->kind == TREE_FILE
                                 ? ckpt_file_at(c->pack, n->file_index)->mode & 0777
                                 : n->mode);
    st->st_nlink = 1;
    st->st_size = (off_t)n->size;
    st->st_blocks = packed_blocks(c, n);
    /* st_blksize stays the page size: readers that size their buffers by it
     * (cat, cp) then copy through buffers that fit in the CPU cache, which
     * matters once the data is in the page cache. */
}

/* The opened checkpoint and node of an inode inside a pack, or an errno. */
static int resolve(ckptfs *fs, fuse_ino_t ino, checkpoint **c, uint32_t *node)
{
    if (wtable_owns(ino))
        return handover_resolve(fs, ino, c, node);
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

int rops_lookup_checkpoint(fuse_req_t req, ckptfs *fs, const char *name)
{
    int err;
    checkpoint *c = checkpoints_lookup(&fs->table, name, 1, &err);
    if (!c)
        return 0;
    uint32_t node = TREE_ROOT;
    if (c->is_file) {
        /* A single file: its size and mode are in the pack. */
        err = checkpoint_open(&fs->table, c);
        node = err ? TREE_NONE : checkpoint_entry_node(c);
        if (err == -EIO && checkpoint_is_broken(c))
            node = TREE_ROOT; /* damaged: a file that can be removed */
        if (node == TREE_NONE) {
            checkpoint_forget(&fs->table, c, 1);
            fuse_reply_err(req, err ? -err : EIO);
            return 1;
        }
    }
    /* Looked up every time: the name may mean a new pack (or a writable
     * checkpoint) at any time. */
    reply_entry(req, fs, c, node, 0.0, c->is_file ? 0.0 : PACK_TIMEOUT);
    return 1;
}

void rops_lookup(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name)
{
    checkpoint *c;
    uint32_t node;
    int err = resolve_dir(fs, parent, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    uint32_t child = pack_tree_lookup(c->tree, node, name);
    if (child != TREE_NONE && checkpoint_node_hidden(c, child)) {
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

void rops_forget(ckptfs *fs, fuse_ino_t ino, uint64_t nlookup)
{
    uint32_t node;
    checkpoint *c = checkpoints_find(&fs->table, ino, &node);
    if (c)
        checkpoint_forget(&fs->table, c, nlookup);
}

void rops_getattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    struct stat st;
    uint32_t node;
    checkpoint *c = checkpoints_find(&fs->table, ino, &node);
    if (c && node == TREE_ROOT && c->is_file) {
        /* Only a damaged single-file checkpoint is known by this number
         * (rops_lookup_checkpoint); its pack may have been replaced by a
         * good one since. */
        int rc = checkpoint_open(&fs->table, c);
        if (rc == 0)
            node_attr(fs, c, checkpoint_entry_node(c), &st);
        else if (rc == -EIO && checkpoint_is_broken(c))
            damaged_file_attr(fs, c, &st);
        if (rc == 0 || (rc == -EIO && checkpoint_is_broken(c)))
            fuse_reply_attr(req, &st, 0.0);
        else
            fuse_reply_err(req, -rc);
        return;
    }
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

/* Every open gets a handle holding a reference to its checkpoint, so that
 * the pack it opened stays readable when a new generation replaces it or
 * it is deleted, as an open file on a local disk does (np.memmap and
 * torch.from_file fault pages in long after the open). A read-only mount
 * used to answer the first open ENOSYS, so that the kernel stopped
 * sending opens (about 15 us of some 37 us per small file): it then held
 * no reference, and such reads got ESTALE, a mapping SIGBUS, once the
 * pack was replaced. */
void rops_open(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
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
    fs_handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->u.file.checkpoint = c;
    h->u.file.node = node;
    checkpoint_ref(&fs->table, c);
    /* Replaced between resolve() and the reference: its pack may be let
     * go already, and the handle would read nothing. */
    err = checkpoint_open(&fs->table, c);
    if (err) {
        checkpoint_unref(&fs->table, c);
        free(h);
        fuse_reply_err(req, -err);
        return;
    }
    /* Packs are immutable: pages cached by an earlier open stay valid. */
    fi->keep_cache = 1;
    fi->noflush = 1;
    handle_reply_open(req, fs, h, fi);
}

void rops_read(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off,
               struct fuse_file_info *fi)
{
    checkpoint *c;
    uint32_t node;
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

void rops_release(fuse_req_t req, ckptfs *fs, fs_handle *h)
{
    handle_drop(fs, h);
    fuse_reply_err(req, 0);
}

void rops_opendir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, struct fuse_file_info *fi)
{
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

/* tensors/ at the top of a checkpoint: always ckptfs's own (a packed
 * file of that name shows under .packed/). */
static int is_tensors_dir(const pack_tree *t, uint32_t node)
{
    return t->nodes[node].kind == TREE_DIR && t->nodes[node].parent == TREE_ROOT &&
           strcmp(t->nodes[node].name, CKPT_MOUNT_TENSORS_DIR) == 0;
}

void rops_readdir(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off,
                  const root_listing *listing)
{
    checkpoint *c = NULL;
    uint32_t node = 0;
    if (!listing) {
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
    uint64_t self = c ? checkpoint_ino(c, node) : ino;
    uint64_t parent = listing ? listing->parent : FUSE_ROOT_ID;
    if (c && node != TREE_ROOT)
        parent = checkpoint_ino(c, dir->parent);
    else if (c && off <= 1) /* the namespace that holds the checkpoint */
        parent = ns_parent_ino(&fs->ns, c->name);
    if (!parent) /* out of memory */
        parent = FUSE_ROOT_ID;
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
            if (checkpoint_node_hidden(c, child) ||
                (fs->hide_tensors && node == TREE_ROOT && is_tensors_dir(c->tree, child)))
                continue;
            name = c->tree->nodes[child].name;
            entry_ino = checkpoint_ino(c, child);
            if (c->tree->nodes[child].kind == TREE_LINK)
                type = S_IFLNK;
            else if (c->tree->nodes[child].kind != TREE_DIR)
                type = S_IFREG;
        } else {
            name = listing->entries[i - 2].name;
            entry_ino = listing->entries[i - 2].ino;
            type = listing->entries[i - 2].type; /* 0: unknown (DT_UNKNOWN) */
        }
        size_t added = add_entry(req, buf, used, size, name, entry_ino, type, (off_t)(i + 1));
        if (!added)
            break;
        used += added;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

/* The value of one of the tensor attributes into buf (NUL-terminated);
 * its length, or -1 for an attribute the tensor does not have. */
static long tensor_xattr(const ckpt_tensor_info *t, const char *name, char *buf, size_t cap)
{
    int n = -1;
    if (strcmp(name, CKPT_XATTR_DTYPE) == 0)
        n = snprintf(buf, cap, "%s", t->dtype);
    if (strcmp(name, CKPT_XATTR_SHA256) == 0) {
        char hex[65];
        ckpt_hex32(t->sha256, hex);
        n = snprintf(buf, cap, "%s", hex);
    }
    if (n >= 0) /* a value cut short is never sent: its length is past buf */
        return (size_t)n < cap ? n : -2;
    if (strcmp(name, CKPT_XATTR_SHAPE) == 0) {
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
 * `ckpt status` and `ckpt commit --wait` read every checkpoint alike. The
 * state opens the pack (checkpoint_state.h): one that cannot be read shows
 * as key mismatch or damaged, never as committed. */
static long committed_xattr(ckptfs *fs, checkpoint *c, const char *name, char *buf, size_t cap)
{
    if (strcmp(name, CKPT_XATTR_STATE) == 0)
        return snprintf(buf, cap, "%s", checkpoint_state_name(&fs->table, c));
    if (strcmp(name, CKPT_XATTR_SIZE) == 0)
        return snprintf(buf, cap, "%" PRIu64, (uint64_t)c->identity.st_size);
    if (strcmp(name, CKPT_XATTR_PROGRESS) == 0)
        return snprintf(buf, cap, "%" PRIu64 " %" PRIu64 " 0", (uint64_t)c->identity.st_size,
                        (uint64_t)c->identity.st_size);
    if (strcmp(name, CKPT_XATTR_PACK) == 0) {
        int len = snprintf(buf, cap, "%s", c->pack_path);
        return len < 0 || (size_t)len >= cap ? -2 : len;
    }
    if (strcmp(name, CKPT_XATTR_ERROR) == 0) {
        /* Opening first: why it cannot be opened is the error to show. */
        checkpoint_state_name(&fs->table, c);
        size_t len = checkpoint_get_error(c, buf, cap);
        return len ? (long)len : -1;
    }
    return -1;
}

void rops_getxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name, size_t size)
{
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    if (!c && wtable_owns(ino) && resolve(fs, ino, &c, &node) != 0)
        c = NULL;
    if (c && c->is_file && checkpoint_open(&fs->table, c) == 0 && node == checkpoint_entry_node(c))
        node = TREE_ROOT; /* a single file: its checkpoint's state */
    if (c && node == TREE_ROOT) {
        char value[PATH_MAX + sizeof c->last_error];
        long len = committed_xattr(fs, c, name, value, sizeof value);
        if (len < 0)
            fuse_reply_err(req, len == -1 ? ENODATA : ERANGE);
        else
            reply_xattr_value(req, value, (size_t)len, size);
        return;
    }
    const ckpt_tensor_info *t = tensor_of(fs, ino);
    if (!t) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    /* Room for a digest (64 hex digits) or the dtype's name, and for the
     * longest shape: ndim numbers of up to 20 digits with ", " between. */
    size_t cap = 80 + (size_t)t->ndim * 24;
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

void rops_listxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size)
{
    static const char names[] = CKPT_XATTR_DTYPE "\0" CKPT_XATTR_SHAPE "\0" CKPT_XATTR_SHA256;
    static const char dir_names[] =
        CKPT_XATTR_STATE "\0" CKPT_XATTR_PROGRESS "\0" CKPT_XATTR_SIZE "\0" CKPT_XATTR_PACK;
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    if (c && (node == TREE_ROOT || (c->is_file && checkpoint_open(&fs->table, c) == 0 &&
                                    node == checkpoint_entry_node(c))))
        reply_xattr_value(req, dir_names, sizeof dir_names, size);
    else if (tensor_of(fs, ino))
        reply_xattr_value(req, names, sizeof names, size);
    else
        reply_xattr_value(req, "", 0, size);
}

void rops_setxattr(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const char *name)
{
    uint32_t node;
    checkpoint *c = ino == FUSE_ROOT_ID ? NULL : checkpoints_find(&fs->table, ino, &node);
    /* `ckpt commit` on a checkpoint that is already committed: done. */
    if (c && (node == TREE_ROOT || c->is_file) && strcmp(name, CKPT_XATTR_COMMIT) == 0) {
        fuse_reply_err(req, 0);
        return;
    }
    fuse_reply_err(req, EROFS);
}

void rops_readlink(fuse_req_t req, ckptfs *fs, fuse_ino_t ino)
{
    checkpoint *c;
    uint32_t node;
    int err = resolve(fs, ino, &c, &node);
    if (err)
        fuse_reply_err(req, err);
    else if (c->tree->nodes[node].kind != TREE_LINK)
        fuse_reply_err(req, EINVAL);
    else
        fuse_reply_readlink(req, c->tree->nodes[node].target);
}

int rops_is_view(ckptfs *fs, fuse_ino_t parent, const char *name)
{
    uint32_t node;
    checkpoint *c = wtable_owns(parent) ? NULL : checkpoints_find(&fs->table, parent, &node);
    if (!c || checkpoint_open(&fs->table, c) != 0 || node >= c->tree->n_nodes)
        return 0;
    uint32_t n = pack_tree_lookup(c->tree, node, name);
    if (n == TREE_NONE)
        return 0;
    const tree_node *t = &c->tree->nodes[n];
    return t->kind == TREE_MANIFEST || t->kind == TREE_TENSOR ||
           (node == TREE_ROOT && t->kind == TREE_DIR && strcmp(name, "tensors") == 0);
}

void rops_remove(fuse_req_t req, ckptfs *fs, fuse_ino_t parent, const char *name, int want_dir,
                 int quiet)
{
    if (!fs->writable) {
        fuse_reply_err(req, EROFS);
        return;
    }
    checkpoint *c;
    uint32_t node;
    int err = resolve_dir(fs, parent, &c, &node);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    fuse_reply_err(req, -checkpoint_hide(c, node, name, want_dir, quiet));
}
