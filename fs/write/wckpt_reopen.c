/* Late writes: a committed checkpoint written to again is reopened. Its
 * pack becomes the base of a writable checkpoint of the same name, whose
 * files are the pack's until changed (WTREE_BASE_BLOB: read from the
 * base, copied into staging on the first change); its commit packs a new
 * generation that replaces the pack atomically (packer_job.replace), the
 * unchanged files decoded from the base and packed again. Readers that
 * hold files of the old generation open keep reading it: the read side
 * keeps that pack's descriptor until they let go. */
#include "wckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "common/links.h"
#include "wckpt_internal.h"

int wc_open_base(wtable *t, const char *name, int is_file, ckpt_pack **out, ckpt_err *err)
{
    char object[BACKING_PATH_MAX + NAME_MAX + 2];
    if (backing_pack_name(name, is_file, object, sizeof object) != 0)
        return ckpt_fail(err, -ENAMETOOLONG, "checkpoint '%s': name too long", name);
    /* Through the store, local too: it follows no link in any component
     * (as the read side opens packs), and every message of the pack, a
     * damaged chunk met while packing the next generation included, names
     * BACKING/NAME.tpack rather than a /proc/self/fd path. */
    return ckpt_pack_open_in(t->store, object, mount_key_get(t->key), out, err);
}

/* The directory of path in c's tree, made as needed; *base gets the last
 * component (c->lock held). */
static int parent_of(wckpt *c, char *path, int64_t sec, uint32_t nsec, uint32_t *dir, char **base)
{
    uint32_t d = WTREE_ROOT, node;
    char *p = path, *slash;
    int rc = 0;
    while (rc == 0 && (slash = strchr(p, '/'))) {
        *slash = '\0';
        node = wtree_lookup(&c->tree, d, p);
        if (node == WTREE_NONE)
            rc = wtree_add(&c->tree, d, p, WNODE_DIR, 0755, sec, nsec, 0, &node);
        d = node;
        p = slash + 1;
    }
    *dir = d;
    *base = p;
    return rc;
}

/* One link of the base: staged (a link is its target's bytes). */
static int add_link(void *ud, const link_entry *e)
{
    wckpt *c = ud;
    char path[WTREE_PATH_MAX + 1];
    if (snprintf(path, sizeof path, "%s", e->path) >= (int)sizeof path)
        return 0;
    uint32_t dir, node;
    char *base;
    int rc = parent_of(c, path, e->mtime_sec, e->mtime_nsec, &dir, &base);
    wfile *f = rc == 0 ? calloc(1, sizeof *f) : NULL;
    if (rc == 0 && !f)
        rc = -ENOMEM;
    ckpt_err err = {0};
    uint64_t id = c->next_blob_id;
    if (rc == 0)
        rc = stage_blob_open(c->dir.data_fd, id, c->dir.key, 1, &f->blob, &err);
    if (rc == 0) {
        size_t len = strlen(e->target);
        ssize_t n = stage_blob_pwrite(f->blob, e->target, len, 0, &err);
        rc = n == (ssize_t)len ? stage_blob_park(f->blob, &err) : n < 0 ? (int)n : -EIO;
    }
    if (rc == 0)
        rc = wtree_add(&c->tree, dir, base, WNODE_LINK, 0777, e->mtime_sec, e->mtime_nsec, id,
                       &node);
    if (rc == 0) {
        c->next_blob_id++;
        f->base_index = -1;
        c->tree.nodes[node].data = f;
        return 0;
    }
    if (f && f->blob) {
        stage_blob_unlink(f->blob, &err);
        stage_blob_free(f->blob);
    }
    free(f);
    return rc == -EEXIST || rc == -EINVAL ? 0 : rc; /* a bad entry is left out */
}

static int links_from_base(wckpt *c, size_t index)
{
    uint64_t size = ckpt_file_at(c->base, index)->size;
    if (size > (64u << 20))
        return -EIO;
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return -ENOMEM;
    ckpt_err err = {0};
    ssize_t n = ckpt_file_pread(c->base, index, buf, size, 0, &err);
    int rc = n == (ssize_t)size ? links_decode(buf, size, add_link, c) : n < 0 ? (int)n : -EIO;
    free(buf);
    return rc;
}

/* The base pack's files and links as nodes of c's tree (c->lock held). */
static int tree_from_base(wckpt *c)
{
    size_t n = ckpt_file_count(c->base);
    int rc = 0;
    long links = -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const ckpt_file_info *fi = ckpt_file_at(c->base, i);
        if (strcmp(fi->path, LINKS_FILE) == 0) {
            links = (long)i;
            continue;
        }
        char path[WTREE_PATH_MAX + 1];
        snprintf(path, sizeof path, "%s", fi->path);
        uint32_t dir, node;
        char *p;
        rc = parent_of(c, path, fi->mtime_sec, fi->mtime_nsec, &dir, &p);
        /* Without set-id bits, as stat shows a packed file (read_ops.c). */
        if (rc == 0)
            rc = wtree_add(&c->tree, dir, p, WNODE_FILE, fi->mode & 0777, fi->mtime_sec,
                           fi->mtime_nsec, WTREE_BASE_BLOB | i, &node);
        wfile *f = rc == 0 ? calloc(1, sizeof *f) : NULL;
        if (rc == 0 && !f)
            rc = -ENOMEM;
        if (rc == 0) {
            f->base_index = (long)i;
            f->base_size = fi->size;
            c->tree.nodes[node].data = f;
        }
    }
    if (rc == 0 && links >= 0)
        rc = links_from_base(c, (size_t)links);
    return rc;
}

int wc_base_files(wckpt *c)
{
    for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
        wnode *n = &c->tree.nodes[i];
        if (!n->linked || n->kind != WNODE_FILE || !(n->blob_id & WTREE_BASE_BLOB))
            continue;
        uint64_t index = n->blob_id & ~WTREE_BASE_BLOB;
        if (!c->base || index >= ckpt_file_count(c->base))
            return -EIO;
        wfile *f = calloc(1, sizeof *f);
        if (!f)
            return -ENOMEM;
        f->base_index = (long)index;
        f->base_size = ckpt_file_at(c->base, (size_t)index)->size;
        n->data = f;
    }
    return 0;
}

int wtable_reopen(wtable *t, const char *name, wckpt **out)
{
    pthread_mutex_lock(&t->lock);
    wckpt *c = wc_by_name(t, name);
    if (c) {
        c->nlookup++;
        pthread_mutex_unlock(&t->lock);
        *out = c;
        return 0;
    }
    int kind = wc_backing_kind(t, name);
    if (kind != WC_PACK_DIR && kind != WC_PACK_FILE) {
        pthread_mutex_unlock(&t->lock);
        return -ENOENT;
    }
    int is_file = kind == WC_PACK_FILE;
    ckpt_err err = {0};
    ckpt_pack *base = NULL;
    int rc = wc_open_base(t, name, is_file, &base, &err);
    if (rc) {
        pthread_mutex_unlock(&t->lock);
        fslog_err("cannot write into checkpoint '%s': %s", name, err.msg);
        /* As a reader of the pack is answered (read/checkpoints.c): a pack
         * damaged in place after the read side opened it is met here
         * first, and its writer must not hear of a read-only mount.
         * -EUCLEAN tells the front end the pack itself is unreadable (not
         * the store's outage): its entries may then be removed, hidden,
         * on the way to deleting it. */
        /* Only what says the bytes are bad: out of descriptors (EMFILE),
         * a replaced object (ESTALE) and the like would otherwise hide a
         * good pack's entries as if removed. */
        if (!err.transient && (rc == -EIO || rc == -EINVAL || rc == -EBADMSG || rc == -EOVERFLOW))
            return -EUCLEAN; /* as read/checkpoints.c's is_lasting, less what is no damage */
        return rc == -EACCES ? -EACCES : -EIO;
    }
    /* The record says "base" from the start: staging is never without
     * what its unchanged files are read from. */
    wckpt *made = NULL;
    c = wc_start(t, name, 0755, is_file, 1, 1, &rc);
    if (c) {
        pthread_mutex_lock(&c->lock);
        c->base = base;
        base = NULL;
        rc = tree_from_base(c);
        c->meta_gen++;
        /* Reopened for a change, which may never come (a file opened for
         * writing and closed untouched): the idle commit still packs it
         * again once quiet, or it would stay writing, its
         * pack shown through the write side, until ckpt commit. */
        c->changed_since_commit = 1;
        pthread_mutex_unlock(&c->lock);
        made = c;
    }
    pthread_mutex_unlock(&t->lock);
    if (base)
        ckpt_close(base);
    if (rc == 0)
        rc = wc_save(made, &err);
    if (rc) {
        if (made) {
            pthread_mutex_lock(&t->lock);
            pthread_mutex_lock(&made->lock);
            made->dir.replaces = 0; /* the pack stays */
            pthread_mutex_unlock(&made->lock);
            pthread_mutex_unlock(&t->lock);
            wc_abandon(t, made);
            wtable_forget(t, made, 1);
        }
        fslog_err("cannot write into checkpoint '%s': %s", name,
                  err.msg[0] ? err.msg : strerror(-rc));
        /* A full disk is the writer's to hear, as from any disk, and goes
         * away once there is room; the rest is no fault of the write. */
        return rc == -ENOSPC || rc == -EDQUOT ? rc : -EROFS;
    }
    /* Not at LOG_INFO: what follows is not known yet. rm -r starts with an
     * unlink that reopens, and then deletes the checkpoint; with
     * commit_delay=0 nothing is packed until ckpt commit. The commit (or
     * the deletion) says what happened, once. */
    fslog_debug("checkpoint '%s': written to after its commit: reopened", name);
    *out = made;
    return 0;
}
