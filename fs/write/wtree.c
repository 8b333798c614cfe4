#include "wtree.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define SLOT_EMPTY UINT32_MAX
#define SLOT_GONE (UINT32_MAX - 1u)
#define NAME_MAX_BYTES 255u

int wtree_name_ok(const char *name)
{
    size_t len = strlen(name);
    return len > 0 && len <= NAME_MAX_BYTES && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 &&
           !strchr(name, '/');
}

/* Names come from whoever writes into the mount; a keyed hash keeps one
 * directory's worth of chosen names from all landing in one chain. */
static size_t hash_of(const wtree *t, uint32_t parent, const char *name)
{
    uint8_t msg[4 + NAME_MAX_BYTES];
    size_t len = strlen(name);
    if (len > NAME_MAX_BYTES)
        len = NAME_MAX_BYTES;
    memcpy(msg, &parent, 4);
    memcpy(msg + 4, name, len);
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, msg, 4 + len, t->hash_key);
    uint64_t v;
    memcpy(&v, h, sizeof v);
    return (size_t)v;
}

static int index_insert(wtree *t, uint32_t id);

static int index_grow(wtree *t)
{
    size_t live = 0;
    for (size_t i = 0; i <= t->index_mask; i++)
        live += t->index[i] < SLOT_GONE;
    size_t cap = (t->index_mask + 1) * 2;
    while (cap < 4 * (live + 1))
        cap *= 2;
    uint32_t *old = t->index;
    size_t old_cap = t->index_mask + 1;
    t->index = malloc(cap * sizeof *t->index);
    if (!t->index) {
        t->index = old;
        return -ENOMEM;
    }
    memset(t->index, 0xff, cap * sizeof *t->index);
    t->index_mask = cap - 1;
    t->index_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i] < SLOT_GONE)
            index_insert(t, old[i]);
    free(old);
    return 0;
}

static int index_insert(wtree *t, uint32_t id)
{
    if ((t->index_used + 1) * 10 > (t->index_mask + 1) * 7) {
        int rc = index_grow(t);
        if (rc)
            return rc;
    }
    wnode *n = &t->nodes[id];
    size_t i = hash_of(t, n->parent, n->name) & t->index_mask;
    while (t->index[i] < SLOT_GONE)
        i = (i + 1) & t->index_mask;
    if (t->index[i] == SLOT_EMPTY)
        t->index_used++;
    t->index[i] = id;
    n->slot = (uint32_t)i;
    return 0;
}

static void index_remove(wtree *t, uint32_t id)
{
    t->index[t->nodes[id].slot] = SLOT_GONE;
}

uint32_t wtree_lookup(const wtree *t, uint32_t dir, const char *name)
{
    if (!t->index)
        return WTREE_NONE;
    size_t i = hash_of(t, dir, name) & t->index_mask;
    for (;;) {
        uint32_t id = t->index[i];
        if (id == SLOT_EMPTY)
            return WTREE_NONE;
        if (id != SLOT_GONE && t->nodes[id].parent == dir && strcmp(t->nodes[id].name, name) == 0)
            return id;
        i = (i + 1) & t->index_mask;
    }
}

static int new_node(wtree *t, const char *name, uint32_t *out)
{
    if (t->n_nodes >= WTREE_MAX_NODES)
        return -ENOSPC;
    if (t->n_nodes == t->cap_nodes) {
        uint32_t cap = t->cap_nodes ? t->cap_nodes * 2 : 64;
        if (cap > WTREE_MAX_NODES)
            cap = WTREE_MAX_NODES;
        wnode *grown = realloc(t->nodes, (size_t)cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        t->nodes = grown;
        t->cap_nodes = cap;
    }
    wnode *n = &t->nodes[t->n_nodes];
    memset(n, 0, sizeof *n);
    n->name = strdup(name);
    if (!n->name)
        return -ENOMEM;
    n->parent = WTREE_NONE;
    *out = t->n_nodes++;
    return 0;
}

int wtree_init(wtree *t, uint32_t root_mode, int64_t mtime_sec, uint32_t mtime_nsec)
{
    memset(t, 0, sizeof *t);
    if (sodium_init() < 0)
        return -ENOSYS;
    randombytes_buf(t->hash_key, sizeof t->hash_key);
    t->index = malloc(64 * sizeof *t->index);
    if (!t->index)
        return -ENOMEM;
    memset(t->index, 0xff, 64 * sizeof *t->index);
    t->index_mask = 63;
    uint32_t root;
    int rc = new_node(t, "", &root);
    if (rc) {
        wtree_free(t);
        return rc;
    }
    wnode *r = &t->nodes[root];
    r->kind = WNODE_DIR;
    r->linked = 1;
    r->mode = root_mode & WTREE_MODE_BITS;
    r->mtime_sec = r->atime_sec = mtime_sec;
    r->mtime_nsec = r->atime_nsec = mtime_nsec;
    return 0;
}

void wtree_free(wtree *t)
{
    for (uint32_t i = 0; i < t->n_nodes; i++) {
        free(t->nodes[i].name);
        free(t->nodes[i].children);
    }
    free(t->nodes);
    free(t->index);
    memset(t, 0, sizeof *t);
}

/* Room for one more child of dir, so that adding it cannot fail. */
static int child_reserve(wtree *t, uint32_t dir)
{
    wnode *d = &t->nodes[dir];
    if (d->n_children == d->children_cap) {
        uint32_t cap = d->children_cap ? d->children_cap * 2 : 8;
        uint32_t *grown = realloc(d->children, (size_t)cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        d->children = grown;
        d->children_cap = cap;
    }
    return 0;
}

static int child_add(wtree *t, uint32_t dir, uint32_t id)
{
    int rc = child_reserve(t, dir);
    if (rc)
        return rc;
    wnode *d = &t->nodes[dir];
    d->children[d->n_children++] = id;
    return 0;
}

static void child_remove(wtree *t, uint32_t dir, uint32_t id)
{
    wnode *d = &t->nodes[dir];
    for (uint32_t i = 0; i < d->n_children; i++) {
        if (d->children[i] == id) {
            d->children[i] = d->children[--d->n_children];
            return;
        }
    }
}

size_t wtree_path_len(const wtree *t, uint32_t node)
{
    size_t len = 0;
    for (uint32_t n = node; n != WTREE_ROOT && n != WTREE_NONE; n = t->nodes[n].parent)
        len += strlen(t->nodes[n].name) + (t->nodes[n].parent != WTREE_ROOT);
    return len;
}

int wtree_path(const wtree *t, uint32_t node, char *out, size_t cap)
{
    size_t len = wtree_path_len(t, node);
    if (len + 1 > cap)
        return -ENAMETOOLONG;
    out[len] = '\0';
    size_t end = len;
    for (uint32_t n = node; n != WTREE_ROOT && n != WTREE_NONE; n = t->nodes[n].parent) {
        size_t l = strlen(t->nodes[n].name);
        end -= l;
        memcpy(out + end, t->nodes[n].name, l);
        if (t->nodes[n].parent != WTREE_ROOT)
            out[--end] = '/';
    }
    return 0;
}

/* Can name go under dir without the path outgrowing a pack's limit? */
static int fits(const wtree *t, uint32_t dir, const char *name)
{
    size_t base = wtree_path_len(t, dir);
    return base + (base ? 1 : 0) + strlen(name) <= WTREE_PATH_MAX;
}

/* The longest path below directory dir, relative to it ("/a/b": 4). */
static size_t longest_below(const wtree *t, uint32_t dir)
{
    size_t best = 0;
    const wnode *d = &t->nodes[dir];
    for (uint32_t i = 0; i < d->n_children; i++) {
        const wnode *c = &t->nodes[d->children[i]];
        size_t len =
            1 + strlen(c->name) + (c->kind == WNODE_DIR ? longest_below(t, d->children[i]) : 0);
        if (len > best)
            best = len;
    }
    return best;
}

static int dir_ok(const wtree *t, uint32_t dir)
{
    const wnode *d = wtree_node(t, dir);
    if (!d || !d->linked)
        return -ENOENT;
    return d->kind == WNODE_DIR ? 0 : -ENOTDIR;
}

int wtree_add(wtree *t, uint32_t dir, const char *name, wnode_kind kind, uint32_t mode,
              int64_t mtime_sec, uint32_t mtime_nsec, uint64_t blob_id, uint32_t *out)
{
    int rc = dir_ok(t, dir);
    if (rc)
        return rc;
    if (!wtree_name_ok(name))
        return strlen(name) > NAME_MAX_BYTES ? -ENAMETOOLONG : -EINVAL;
    if (kind != WNODE_DIR && kind != WNODE_FILE && kind != WNODE_LINK)
        return -EINVAL;
    if (wtree_lookup(t, dir, name) != WTREE_NONE)
        return -EEXIST;
    if (!fits(t, dir, name))
        return -ENAMETOOLONG;
    /* Reserve the child slot first so nothing fails after the node exists. */
    rc = child_reserve(t, dir);
    if (rc)
        return rc;
    uint32_t id;
    rc = new_node(t, name, &id);
    if (rc)
        return rc;
    wnode *n = &t->nodes[id];
    n->parent = dir;
    n->kind = (uint8_t)kind;
    n->mode = mode & WTREE_MODE_BITS;
    n->mtime_sec = n->atime_sec = mtime_sec;
    n->mtime_nsec = n->atime_nsec = mtime_nsec;
    n->blob_id = blob_id;
    rc = index_insert(t, id);
    if (rc) {
        /* Leave it allocated but detached: ids are never handed out twice. */
        n->parent = WTREE_NONE;
        return rc;
    }
    n->linked = 1;
    child_add(t, dir, id);
    *out = id;
    return 0;
}

static void detach(wtree *t, uint32_t id)
{
    wnode *n = &t->nodes[id];
    index_remove(t, id);
    child_remove(t, n->parent, id);
    n->parent = WTREE_NONE;
    n->linked = 0;
}

int wtree_remove(wtree *t, uint32_t dir, const char *name, int want_dir, uint32_t *out)
{
    int rc = dir_ok(t, dir);
    if (rc)
        return rc;
    uint32_t id = wtree_lookup(t, dir, name);
    if (id == WTREE_NONE)
        return -ENOENT;
    wnode *n = &t->nodes[id];
    if (want_dir && n->kind != WNODE_DIR)
        return -ENOTDIR;
    if (!want_dir && n->kind == WNODE_DIR)
        return -EISDIR;
    if (n->kind == WNODE_DIR && n->n_children)
        return -ENOTEMPTY;
    detach(t, id);
    *out = id;
    return 0;
}

int wtree_rename(wtree *t, uint32_t dir, const char *name, uint32_t newdir, const char *newname,
                 int noreplace, uint32_t *replaced)
{
    *replaced = WTREE_NONE;
    int rc = dir_ok(t, dir);
    if (rc == 0)
        rc = dir_ok(t, newdir);
    if (rc)
        return rc;
    if (!wtree_name_ok(newname))
        return strlen(newname) > NAME_MAX_BYTES ? -ENAMETOOLONG : -EINVAL;
    uint32_t src = wtree_lookup(t, dir, name);
    if (src == WTREE_NONE)
        return -ENOENT;
    wnode *s = &t->nodes[src];
    if (s->kind == WNODE_DIR) {
        for (uint32_t n = newdir; n != WTREE_NONE; n = t->nodes[n].parent)
            if (n == src)
                return -EINVAL;
    }
    uint32_t dst = wtree_lookup(t, newdir, newname);
    if (dst == src)
        return 0;
    if (dst != WTREE_NONE) {
        const wnode *d = &t->nodes[dst];
        if (noreplace)
            return -EEXIST;
        if (s->kind != WNODE_DIR && d->kind == WNODE_DIR)
            return -EISDIR;
        if (s->kind == WNODE_DIR && d->kind != WNODE_DIR)
            return -ENOTDIR;
        if (d->kind == WNODE_DIR && d->n_children)
            return -ENOTEMPTY;
    }
    /* What is below a directory moves with it: its paths must fit too
     * (a namespace saved with a longer one would not load again). */
    size_t below = s->kind == WNODE_DIR ? longest_below(t, src) : 0;
    if (!fits(t, newdir, newname) ||
        wtree_path_len(t, newdir) + (newdir != WTREE_ROOT) + strlen(newname) + below >
            WTREE_PATH_MAX)
        return -ENAMETOOLONG;
    char *copy = strdup(newname);
    if (!copy)
        return -ENOMEM;
    wnode *nd = &t->nodes[newdir];
    if (nd->n_children == nd->children_cap) {
        uint32_t cap = nd->children_cap ? nd->children_cap * 2 : 8;
        uint32_t *grown = realloc(nd->children, (size_t)cap * sizeof *grown);
        if (!grown) {
            free(copy);
            return -ENOMEM;
        }
        nd->children = grown;
        nd->children_cap = cap;
    }
    if (dst != WTREE_NONE) {
        detach(t, dst);
        *replaced = dst;
    }
    index_remove(t, src);
    child_remove(t, dir, src);
    s = &t->nodes[src];
    free(s->name);
    s->name = copy;
    s->parent = newdir;
    if (index_insert(t, src) != 0) {
        /* Out of memory growing the index: the node cannot be found by
         * name any more, so detach it rather than leave it half-linked. */
        s->parent = WTREE_NONE;
        s->linked = 0;
        return -ENOMEM;
    }
    child_add(t, newdir, src);
    return 0;
}

typedef struct path_entry {
    char *path;
    uint32_t id;
} path_entry;

static int cmp_path(const void *a, const void *b)
{
    /* Numbers by value, as ckpt pack orders files (core/src/ingest_files.c):
     * a DCP save of more than ten ranks then packs in row order. */
    return strverscmp(((const path_entry *)a)->path, ((const path_entry *)b)->path);
}

int wtree_walk(const wtree *t, wtree_visit_fn fn, void *ud)
{
    uint32_t *queue = malloc((size_t)t->n_nodes * sizeof *queue);
    if (!queue)
        return -ENOMEM;
    size_t head = 0, tail = 0;
    queue[tail++] = WTREE_ROOT;
    int rc = 0;
    while (rc == 0 && head < tail) {
        uint32_t id = queue[head++];
        rc = fn(ud, t, id);
        const wnode *n = &t->nodes[id];
        for (uint32_t i = 0; n->kind == WNODE_DIR && i < n->n_children; i++)
            queue[tail++] = n->children[i];
    }
    free(queue);
    return rc;
}

typedef struct collect {
    path_entry *v;
    size_t n;
    uint8_t kind;
} collect;

static int collect_file(void *ud, const wtree *t, uint32_t id)
{
    collect *c = ud;
    if (t->nodes[id].kind != c->kind)
        return 0;
    size_t len = wtree_path_len(t, id);
    char *p = malloc(len + 1);
    if (!p)
        return -ENOMEM;
    wtree_path(t, id, p, len + 1);
    c->v[c->n].path = p;
    c->v[c->n].id = id;
    c->n++;
    return 0;
}

static int sorted_of(const wtree *t, uint8_t kind, uint32_t **out, size_t *n)
{
    collect c = {calloc(t->n_nodes ? t->n_nodes : 1, sizeof *c.v), 0, kind};
    *out = NULL;
    *n = 0;
    if (!c.v)
        return -ENOMEM;
    int rc = wtree_walk(t, collect_file, &c);
    uint32_t *ids = NULL;
    if (rc == 0) {
        qsort(c.v, c.n, sizeof *c.v, cmp_path);
        ids = malloc((c.n ? c.n : 1) * sizeof *ids);
        if (!ids)
            rc = -ENOMEM;
        for (size_t i = 0; ids && i < c.n; i++)
            ids[i] = c.v[i].id;
    }
    for (size_t i = 0; i < c.n; i++)
        free(c.v[i].path);
    free(c.v);
    if (rc == 0) {
        *out = ids;
        *n = c.n;
    }
    return rc;
}

int wtree_files_sorted(const wtree *t, uint32_t **out, size_t *n)
{
    return sorted_of(t, WNODE_FILE, out, n);
}

int wtree_links_sorted(const wtree *t, uint32_t **out, size_t *n)
{
    return sorted_of(t, WNODE_LINK, out, n);
}
