#include "pack_tree.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_mount.h"
#include "common/fslog.h"
#include "common/links.h"
#include "common/name_escape.h"

#define COMPONENT_MAX 255
/* A hostile pack could name a million clashing entries; say so a few
 * times, then once more with the total. */
#define SKIP_LOG_LIMIT 8

typedef struct builder {
    pack_tree *t;
    const char *checkpoint;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    size_t skipped;
} builder;

static uint64_t hash_name(uint32_t parent, const char *name, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ parent;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 32);
}

static void slot_insert(pack_tree *t, uint32_t node)
{
    const tree_node *n = &t->nodes[node];
    size_t s = (size_t)hash_name(n->parent, n->name, strlen(n->name)) & t->slot_mask;
    while (t->slots[s] != TREE_NONE)
        s = (s + 1) & t->slot_mask;
    t->slots[s] = node;
}

static int slots_grow(pack_tree *t)
{
    size_t count = t->slots ? (t->slot_mask + 1) * 2 : 64;
    uint32_t *slots = malloc(count * sizeof *slots);
    if (!slots)
        return -ENOMEM;
    memset(slots, 0xff, count * sizeof *slots);
    free(t->slots);
    t->slots = slots;
    t->slot_mask = count - 1;
    for (uint32_t i = 1; i < t->n_nodes; i++)
        slot_insert(t, i);
    return 0;
}

static uint32_t find_child(const pack_tree *t, uint32_t parent, const char *name, size_t len)
{
    size_t s = (size_t)hash_name(parent, name, len) & t->slot_mask;
    for (; t->slots[s] != TREE_NONE; s = (s + 1) & t->slot_mask) {
        const tree_node *n = &t->nodes[t->slots[s]];
        if (n->parent == parent && strncmp(n->name, name, len) == 0 && n->name[len] == '\0')
            return t->slots[s];
    }
    return TREE_NONE;
}

uint32_t pack_tree_lookup(const pack_tree *t, uint32_t parent, const char *name)
{
    return find_child(t, parent, name, strlen(name));
}

static int add_child(tree_node *dir, uint32_t child)
{
    if (dir->n_children == dir->children_cap) {
        uint32_t cap = dir->children_cap ? dir->children_cap * 2 : 4;
        uint32_t *grown = realloc(dir->children, cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        dir->children = grown;
        dir->children_cap = cap;
    }
    dir->children[dir->n_children++] = child;
    return 0;
}

/* Appends a node; *proto gives everything but name and parent. */
static int add_node(builder *b, uint32_t parent, const char *name, size_t len,
                    const tree_node *proto, uint32_t *out)
{
    pack_tree *t = b->t;
    /* Inode numbers carry node + 1 in 32 bits. */
    if (t->n_nodes >= UINT32_MAX - 2)
        return -EIO;
    if ((size_t)(t->n_nodes + 1) * 2 > t->slot_mask + 1 && slots_grow(t))
        return -ENOMEM;
    if (t->n_nodes == t->nodes_cap) {
        uint32_t cap = t->nodes_cap * 2;
        tree_node *grown = realloc(t->nodes, (size_t)cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        t->nodes = grown;
        t->nodes_cap = cap;
    }
    char *copy = strndup(name, len);
    if (!copy)
        return -ENOMEM;
    uint32_t id = t->n_nodes;
    if (add_child(&t->nodes[parent], id)) {
        free(copy);
        return -ENOMEM;
    }
    tree_node *n = &t->nodes[id];
    *n = *proto;
    n->name = copy;
    n->parent = parent;
    n->children = NULL;
    n->n_children = n->children_cap = n->n_subdirs = 0;
    t->n_nodes++;
    if (n->kind == TREE_DIR)
        t->nodes[parent].n_subdirs++;
    slot_insert(t, id);
    *out = id;
    return 0;
}

static tree_node dir_proto(const builder *b)
{
    tree_node n = {0};
    n.kind = TREE_DIR;
    n.mode = 0555;
    n.mtime_sec = b->mtime_sec;
    n.mtime_nsec = b->mtime_nsec;
    return n;
}

static void log_skip(builder *b, const char *what, const char *path, const char *why)
{
    if (++b->skipped <= SKIP_LOG_LIMIT)
        fslog_warn("checkpoint '%s': %s '%s' not shown: %s", b->checkpoint, what, path, why);
}

/* Adds path below start, creating implied directories. Returns 0 with *out
 * set, 1 when the entry clashes or cannot be a path (logged and skipped),
 * or a negative errno. */
static int insert_path(builder *b, uint32_t start, const char *path, const tree_node *proto,
                       const char *what, uint32_t *out)
{
    pack_tree *t = b->t;
    tree_node dir = dir_proto(b);
    uint32_t at = start;
    const char *p = path;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || len > COMPONENT_MAX || (len == 1 && p[0] == '.') ||
            (len == 2 && p[0] == '.' && p[1] == '.')) {
            log_skip(b, what, path, "it is not a usable path");
            return 1;
        }
        uint32_t found = find_child(t, at, p, len);
        if (!slash) {
            if (found != TREE_NONE) {
                log_skip(b, what, path, "an earlier entry has the same path");
                return 1;
            }
            return add_node(b, at, p, len, proto, out);
        }
        if (found == TREE_NONE) {
            int rc = add_node(b, at, p, len, &dir, &found);
            if (rc)
                return rc;
        } else if (t->nodes[found].kind != TREE_DIR) {
            log_skip(b, what, path, "an earlier file has the name of one of its directories");
            return 1;
        }
        at = found;
        p = slash + 1;
    }
}

static int is_reserved_top(const char *path)
{
    static const char *const reserved[] = {CKPT_MOUNT_MANIFEST, CKPT_MOUNT_TENSORS_DIR,
                                           CKPT_MOUNT_PACKED_DIR};
    size_t len = strcspn(path, "/");
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strlen(reserved[i]) == len && strncmp(path, reserved[i], len) == 0)
            return 1;
    return 0;
}

static int add_link(void *ud, const link_entry *e)
{
    builder *b = ud;
    tree_node proto = {0};
    proto.kind = TREE_LINK;
    proto.mode = 0777;
    proto.mtime_sec = e->mtime_sec;
    proto.mtime_nsec = e->mtime_nsec;
    proto.size = strlen(e->target);
    proto.target = strdup(e->target);
    if (!proto.target)
        return -ENOMEM;
    uint32_t node;
    int rc =
        is_reserved_top(e->path) ? 1 : insert_path(b, TREE_ROOT, e->path, &proto, "link", &node);
    if (rc)
        free(proto.target);
    return rc < 0 ? rc : 0;
}

/* The links the checkpoint was written with, from its LINKS_FILE. */
static int add_links(builder *b, const ckpt_pack *p, size_t index)
{
    uint64_t size = ckpt_file_at(p, index)->size;
    char *buf = size <= (64u << 20) ? malloc(size ? size : 1) : NULL;
    if (!buf) {
        log_skip(b, "file", LINKS_FILE, "too large");
        return 0;
    }
    ckpt_err err = {0};
    /* Reading does not change the pack: its index is what is const. */
    ssize_t n = ckpt_file_pread((ckpt_pack *)p, index, buf, size, 0, &err);
    int rc = n == (ssize_t)size ? links_decode(buf, size, add_link, b) : -EIO;
    free(buf);
    if (rc == -EIO) {
        log_skip(b, "links of", LINKS_FILE, "the file cannot be read");
        rc = 0;
    }
    return rc;
}

static int add_files(builder *b, const ckpt_pack *p)
{
    pack_tree *t = b->t;
    uint32_t packed_dir = TREE_NONE;
    long links = -1;
    for (size_t i = 0; i < ckpt_file_count(p); i++) {
        const ckpt_file_info *f = ckpt_file_at(p, i);
        if (strcmp(f->path, LINKS_FILE) == 0) {
            links = (long)i;
            continue;
        }
        tree_node proto = {0};
        proto.kind = TREE_FILE;
        proto.mode = f->mode & 0555;
        proto.mtime_sec = f->mtime_sec;
        proto.mtime_nsec = f->mtime_nsec;
        proto.size = f->size;
        proto.file_index = i;
        uint32_t start = TREE_ROOT;
        if (is_reserved_top(f->path)) {
            if (packed_dir == TREE_NONE) {
                tree_node dir = dir_proto(b);
                int rc = add_node(b, TREE_ROOT, CKPT_MOUNT_PACKED_DIR,
                                  strlen(CKPT_MOUNT_PACKED_DIR), &dir, &packed_dir);
                if (rc)
                    return rc;
            }
            start = packed_dir;
        }
        int rc = insert_path(b, start, f->path, &proto, "file", &t->file_node[i]);
        if (rc < 0)
            return rc;
    }
    return links >= 0 ? add_links(b, p, (size_t)links) : 0;
}

static int add_tensors(builder *b, const ckpt_pack *p, uint32_t tensors_dir)
{
    pack_tree *t = b->t;
    for (size_t i = 0; i < ckpt_tensor_count(p); i++) {
        const ckpt_tensor_info *ti = ckpt_tensor_at(p, i);
        /* A chunk of an assembled tensor is shown as part of it only; the
         * manifest lists it under the assembled tensor's parts. */
        if (ti->file_index >= ckpt_file_count(p) || ti->part_of != SIZE_MAX)
            continue;
        const ckpt_file_info *f = ckpt_file_at(p, ti->file_index);
        tree_node proto = {0};
        proto.kind = TREE_TENSOR;
        proto.mode = f->mode & 0444;
        proto.mtime_sec = f->mtime_sec;
        proto.mtime_nsec = f->mtime_nsec;
        proto.size = ti->nbytes;
        proto.file_index = ti->file_index;
        proto.file_offset = ti->file_offset;
        proto.tensor_index = i;
        char *path = tensor_name_to_path(ti->name);
        if (!path)
            return -ENOMEM;
        int rc = 1;
        if (path[0])
            rc = insert_path(b, tensors_dir, path, &proto, "tensor", &t->tensor_node[i]);
        else
            log_skip(b, "tensor", ti->name, "the name is empty");
        free(path);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int pack_tree_build(const ckpt_pack *p, const char *checkpoint, int64_t mtime_sec,
                    uint32_t mtime_nsec, pack_tree **out)
{
    builder b = {.checkpoint = checkpoint, .mtime_sec = mtime_sec, .mtime_nsec = mtime_nsec};
    pack_tree *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    b.t = t;
    size_t n_files = ckpt_file_count(p), n_tensors = ckpt_tensor_count(p);
    int rc = -ENOMEM;
    t->nodes_cap = 64;
    t->nodes = malloc(t->nodes_cap * sizeof *t->nodes);
    t->file_node = malloc((n_files + 1) * sizeof *t->file_node);
    t->tensor_node = malloc((n_tensors + 1) * sizeof *t->tensor_node);
    if (!t->nodes || !t->file_node || !t->tensor_node || slots_grow(t))
        goto fail;
    memset(t->file_node, 0xff, (n_files + 1) * sizeof *t->file_node);
    memset(t->tensor_node, 0xff, (n_tensors + 1) * sizeof *t->tensor_node);

    t->nodes[TREE_ROOT] = dir_proto(&b);
    t->nodes[TREE_ROOT].name = strdup("");
    t->nodes[TREE_ROOT].parent = TREE_ROOT;
    if (!t->nodes[TREE_ROOT].name)
        goto fail;
    t->n_nodes = 1;

    /* manifest.json and tensors/ tell of every file (names, shapes,
     * digests): readable only by whom every file is (-o allow_other). */
    uint32_t readable = 0444;
    for (size_t i = 0; i < n_files; i++)
        readable &= ckpt_file_at(p, i)->mode;
    tree_node manifest = {0};
    manifest.kind = TREE_MANIFEST;
    manifest.mode = readable;
    manifest.mtime_sec = mtime_sec;
    manifest.mtime_nsec = mtime_nsec;
    tree_node dir = dir_proto(&b);
    dir.mode = readable | readable >> 2;
    uint32_t tensors_dir;
    if ((rc = add_node(&b, TREE_ROOT, CKPT_MOUNT_MANIFEST, strlen(CKPT_MOUNT_MANIFEST), &manifest,
                       &t->manifest_node)) ||
        (rc = add_node(&b, TREE_ROOT, CKPT_MOUNT_TENSORS_DIR, strlen(CKPT_MOUNT_TENSORS_DIR), &dir,
                       &tensors_dir)) ||
        (rc = add_files(&b, p)) || (rc = add_tensors(&b, p, tensors_dir)))
        goto fail;
    if (b.skipped > SKIP_LOG_LIMIT)
        fslog_warn("checkpoint '%s': %zu entries not shown in all", checkpoint, b.skipped);
    *out = t;
    return 0;
fail:
    pack_tree_free(t);
    return rc;
}

void pack_tree_set_manifest(pack_tree *t, char *text, size_t len)
{
    free(t->manifest);
    t->manifest = text;
    t->manifest_len = len;
    t->nodes[t->manifest_node].size = len;
}

char *pack_tree_path(const pack_tree *t, uint32_t node)
{
    size_t len = 0;
    for (uint32_t n = node; n != TREE_ROOT; n = t->nodes[n].parent)
        len += strlen(t->nodes[n].name) + 1;
    char *path = malloc(len + 1);
    if (!path)
        return NULL;
    path[len ? len - 1 : 0] = '\0';
    size_t end = len ? len - 1 : 0;
    for (uint32_t n = node; n != TREE_ROOT; n = t->nodes[n].parent) {
        size_t l = strlen(t->nodes[n].name);
        end -= l;
        memcpy(path + end, t->nodes[n].name, l);
        if (end > 0)
            path[--end] = '/';
    }
    return path;
}

void pack_tree_free(pack_tree *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; i < t->n_nodes; i++) {
        free(t->nodes[i].name);
        free(t->nodes[i].children);
        free(t->nodes[i].target);
    }
    free(t->nodes);
    free(t->slots);
    free(t->file_node);
    free(t->tensor_node);
    free(t->manifest);
    free(t);
}

uint32_t pack_tree_find_written(const pack_tree *t, const ckpt_pack *p, const char *path,
                                int is_file)
{
    if (!*path)
        return TREE_ROOT;
    if (is_file) {
        long i = ckpt_file_find(p, path);
        return i < 0 ? TREE_NONE : t->file_node[i];
    }
    uint32_t node =
        is_reserved_top(path) ? pack_tree_lookup(t, TREE_ROOT, CKPT_MOUNT_PACKED_DIR) : TREE_ROOT;
    char *copy = strdup(path), *save = NULL;
    if (!copy)
        return TREE_NONE;
    for (char *part = strtok_r(copy, "/", &save); part && node != TREE_NONE;
         part = strtok_r(NULL, "/", &save))
        node = pack_tree_lookup(t, node, part);
    free(copy);
    return node;
}
