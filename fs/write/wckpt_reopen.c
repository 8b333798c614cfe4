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
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "wckpt_internal.h"

int wc_open_base(wtable *t, const char *name, int is_file, ckpt_pack **out, ckpt_err *err)
{
    char file[NAME_MAX + 1];
    snprintf(file, sizeof file, "%s%s", backing_base(name),
             is_file ? BACKING_FILE_SUFFIX : PACK_SUFFIX);
    int dir = backing_open_parent(t->backing_fd, name, 0);
    int fd = dir < 0 ? dir : openat(dir, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (dir >= 0 && fd < 0)
        fd = -errno;
    if (dir >= 0)
        close(dir);
    if (fd < 0)
        return ckpt_fail(err, fd, "checkpoint '%s': cannot open its pack %s/%s%s: %s", name,
                         t->backing_path, name, is_file ? BACKING_FILE_SUFFIX : PACK_SUFFIX,
                         strerror(-fd));
    /* libckpt opens by path: this reopens what the O_NOFOLLOW open found. */
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int rc = ckpt_open(proc, mount_key_get(t->key), out, err);
    close(fd);
    return rc;
}

/* The base pack's files as nodes of c's tree (c->lock held). */
static int tree_from_base(wckpt *c)
{
    size_t n = ckpt_file_count(c->base);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const ckpt_file_info *fi = ckpt_file_at(c->base, i);
        char path[WTREE_PATH_MAX + 1];
        snprintf(path, sizeof path, "%s", fi->path);
        uint32_t dir = WTREE_ROOT, node;
        char *p = path, *slash;
        while (rc == 0 && (slash = strchr(p, '/'))) {
            *slash = '\0';
            node = wtree_lookup(&c->tree, dir, p);
            if (node == WTREE_NONE)
                rc = wtree_add(&c->tree, dir, p, WNODE_DIR, 0755, fi->mtime_sec, fi->mtime_nsec,
                               0, &node);
            dir = node;
            p = slash + 1;
        }
        if (rc == 0)
            rc = wtree_add(&c->tree, dir, p, WNODE_FILE, fi->mode, fi->mtime_sec, fi->mtime_nsec,
                           WTREE_BASE_BLOB | i, &node);
        wfile *f = rc == 0 ? calloc(1, sizeof *f) : NULL;
        if (rc == 0 && !f)
            rc = -ENOMEM;
        if (rc == 0) {
            f->base_index = (long)i;
            f->base_size = fi->size;
            c->tree.nodes[node].data = f;
        }
    }
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
        return rc == -EACCES ? -EACCES : -EROFS;
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
        fslog_err("cannot write into checkpoint '%s': %s", name, err.msg[0] ? err.msg : strerror(-rc));
        return -EROFS;
    }
    fslog_info("checkpoint '%s': written to after its commit: reopened; a new generation of "
               "its pack replaces it once quiet", name);
    *out = made;
    return 0;
}
