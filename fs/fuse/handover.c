/* A checkpoint written through the mount is a pack once committed, but
 * the kernel may go on using the inodes it knew it by (a shell's working
 * directory, an open file). This maps those inodes to the same paths in
 * the pack that replaced it: the one place where the two sides meet. */
#include "handover.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/backing_path.h"
#include "common/fslog.h"

/* The pack that replaced w, pinned by a lookup reference for as long as
 * w lives (its inodes may be used long after the commit: a shell's
 * working directory, an open file). */
static checkpoint *successor(ckptfs *fs, wckpt *w)
{
    pthread_mutex_lock(&w->lock);
    checkpoint *c = w->successor;
    char *name = c ? NULL : strdup(w->name);
    pthread_mutex_unlock(&w->lock);
    if (c || !name)
        return c;
    int err;
    c = checkpoints_lookup(&fs->table, name, 1, &err);
    free(name);
    if (!c)
        return NULL;
    pthread_mutex_lock(&w->lock);
    if (w->successor) { /* another thread won */
        checkpoint *won = w->successor;
        pthread_mutex_unlock(&w->lock);
        checkpoint_forget(&fs->table, c, 1);
        return won;
    }
    w->successor = c;
    pthread_mutex_unlock(&w->lock);
    return c;
}

void handover_committed(void *ud, const char *name)
{
    ckptfs *fs = ud;
    struct fuse_session *se = __atomic_load_n(&fs->se, __ATOMIC_ACQUIRE);
    char dir[BACKING_PATH_MAX + 1];
    if (!se || backing_dir_of(name, dir, sizeof dir) != 0)
        return;
    uint64_t parent = ns_ino(&fs->ns, dir);
    const char *base = backing_base(name);
    if (parent)
        fuse_lowlevel_notify_inval_entry(se, parent, base, strlen(base));
}

void handover_pack_changed(void *ud, const char *name)
{
    ckptfs *fs = ud;
    checkpoints_changed(&fs->table, name);
}

void handover_drop_successor(void *ud, void *successor_)
{
    ckptfs *fs = ud;
    checkpoint_forget(&fs->table, successor_, 1);
}

/* Opened now, while the name still leads to this generation: a pinned
 * pack must be the one committed, and a later open by name would find
 * whatever replaced it. */
void handover_pin_successor(void *ud, wckpt *w)
{
    ckptfs *fs = ud;
    checkpoint *c = successor(fs, w);
    int err = -ESTALE;
    if (c) {
        checkpoint_ref(&fs->table, c);
        err = checkpoint_open(&fs->table, c);
    }
    pthread_mutex_lock(&w->lock); /* also for the name: a rename replaces it */
    int pin = !err && w->open_files > 0 && !w->successor_pinned;
    if (pin)
        w->successor_pinned = 1;
    else if (err && w->open_files > 0)
        fslog_warn("checkpoint '%s': files open since before its commit cannot hold on to its "
                   "pack (%s): they read it until a newer one replaces it, then get ESTALE",
                   w->name, strerror(-err));
    pthread_mutex_unlock(&w->lock);
    if (c && !pin)
        checkpoint_unref(&fs->table, c);
}

void handover_unpin_successor(void *ud, void *successor_)
{
    ckptfs *fs = ud;
    checkpoint_unref(&fs->table, successor_);
}

int handover_resolve(ckptfs *fs, fuse_ino_t ino, checkpoint **out, uint32_t *node)
{
    uint32_t wn;
    wckpt *w = wtable_find(&fs->wtable, ino, &wn);
    if (!w)
        return ESTALE;
    pthread_mutex_lock(&w->lock);
    int ok = w->state == WST_COMMITTED && wn < w->tree.n_nodes;
    size_t len = ok ? wtree_path_len(&w->tree, wn) : 0;
    char *path = ok ? malloc(len + 1) : NULL;
    int is_file = ok && w->tree.nodes[wn].kind == WNODE_FILE;
    if (path)
        wtree_path(&w->tree, wn, path, len + 1);
    pthread_mutex_unlock(&w->lock);
    int rc = ESTALE;
    checkpoint *c = path ? successor(fs, w) : NULL;
    if (c) {
        int err = checkpoint_open(&fs->table, c);
        uint32_t n = err ? TREE_NONE : pack_tree_find_written(c->tree, c->pack, path, is_file);
        if (err) {
            rc = -err;
        } else if (n != TREE_NONE) {
            *out = c;
            *node = n;
            rc = 0;
        }
    }
    free(path);
    return rc;
}

/* The path inside its checkpoint, and the checkpoint's name, of a pack
 * inode; EROFS for what ckptfs synthesizes (manifest.json, tensors/). */
static int pack_path_of(ckptfs *fs, fuse_ino_t ino, int need_writable, char **name, char **path)
{
    uint32_t node;
    checkpoint *c = checkpoints_find(&fs->table, ino, &node);
    if (!c)
        return ESTALE;
    if (!need_writable) {
        /* Most pack inodes: nothing is being written under that name. */
        if (!wtable_get(&fs->wtable, c->name, 0))
            return ENOENT;
    }
    int err = checkpoint_open(&fs->table, c);
    if (err)
        return -err;
    if (node >= c->tree->n_nodes)
        return ESTALE;
    tree_kind kind = c->tree->nodes[node].kind;
    if (kind == TREE_TENSOR || kind == TREE_MANIFEST)
        return EROFS;
    char *p = pack_tree_path(c->tree, node);
    if (!p)
        return ENOMEM;
    if (strcmp(p, "tensors") == 0 || strncmp(p, "tensors/", 8) == 0) {
        free(p);
        return EROFS;
    }
    if (strncmp(p, ".packed/", 8) == 0) /* a packed name that clashed: its own path */
        memmove(p, p + 8, strlen(p + 8) + 1);
    else if (strcmp(p, ".packed") == 0)
        p[0] = '\0';
    *name = strdup(c->name);
    *path = p;
    if (!*name) {
        free(p);
        return ENOMEM;
    }
    return 0;
}

int handover_is_rewritten(ckptfs *fs, fuse_ino_t ino)
{
    uint32_t node;
    if (!fs->writable || ns_owns(ino) || wtable_owns(ino))
        return 0;
    checkpoint *c = checkpoints_find(&fs->table, ino, &node);
    return c && wtable_get(&fs->wtable, c->name, 0) != NULL;
}

int handover_writable(ckptfs *fs, fuse_ino_t ino, int reopen, fuse_ino_t *out)
{
    if (!fs->writable || ns_owns(ino))
        return ENOENT;
    char *name = NULL, *path = NULL;
    if (wtable_owns(ino)) {
        uint32_t wn;
        wckpt *w = wtable_find(&fs->wtable, ino, &wn);
        if (!w)
            return ESTALE;
        pthread_mutex_lock(&w->lock);
        int committed = w->state == WST_COMMITTED;
        if (committed && wn < w->tree.n_nodes && w->tree.nodes[wn].linked) {
            size_t len = wtree_path_len(&w->tree, wn);
            path = malloc(len + 1);
            if (path)
                wtree_path(&w->tree, wn, path, len + 1);
            name = strdup(w->name);
        }
        pthread_mutex_unlock(&w->lock);
        if (!committed) {
            *out = ino;
            return 0;
        }
        if (!path || !name) {
            free(path);
            free(name);
            return ESTALE;
        }
    } else {
        int err = pack_path_of(fs, ino, reopen, &name, &path);
        if (err)
            return err;
    }
    wckpt *w = wtable_get(&fs->wtable, name, 1);
    int rc = 0;
    if (!w)
        rc = reopen ? -wtable_reopen(&fs->wtable, name, &w) : ENOENT;
    uint32_t node;
    if (rc == 0) {
        rc = -wckpt_find(w, path, &node);
        if (rc == 0)
            *out = wckpt_ino(w, node);
        /* Current, so alive without this reference; the kernel takes its
         * own with the replies it gets. */
        wtable_forget(&fs->wtable, w, 1);
    }
    free(name);
    free(path);
    return rc;
}
