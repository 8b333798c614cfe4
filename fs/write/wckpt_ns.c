/* Namespaces: the directories of the backing directory above checkpoints
 * (BACKING/run1/ above BACKING/run1/checkpoint-500.tpack). The table makes,
 * removes and renames them, as the mount's one writer, and turns one into
 * a checkpoint when the first file is written into it (wtable_ns_convert):
 * the rule that decides which directory is a checkpoint. */
#include "wckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backing_path.h"
#include "common/fslog.h"
#include "packer.h"
#include "wckpt_internal.h"

/* Namespace names must not read as packs. */
static int ns_name_ok(const char *path)
{
    const char *base = backing_base(path);
    size_t len = strlen(base);
    if (!backing_path_ok(path))
        return 0;
    return len <= BACKING_SUFFIX_LEN ||
           (strcmp(base + len - BACKING_SUFFIX_LEN, BACKING_PACK_SUFFIX) != 0 &&
            strcmp(base + len - BACKING_SUFFIX_LEN, BACKING_FILE_SUFFIX) != 0);
}

/* Any writable checkpoint at or below path (t->lock held)? */
static int busy_below(wtable *t, const char *path)
{
    for (wckpt *c = t->all; c; c = c->next)
        if (c->current && backing_is_below(c->name, path))
            return 1;
    return 0;
}

/* rmdir of the namespace path, with t->lock held: -ENOTEMPTY if anything
 * is in it, a checkpoint being written below it included (nothing of that
 * is in BACKING until its commit); its mode in *st when st is not NULL. */
static int remove_namespace_locked(wtable *t, const char *path, struct stat *st)
{
    if (busy_below(t, path))
        return -ENOTEMPTY;
    int dir = backing_open_parent(t->backing_fd, path, 0);
    if (dir < 0)
        return dir;
    int rc = st && fstatat(dir, backing_base(path), st, AT_SYMLINK_NOFOLLOW) != 0 ? -errno : 0;
    if (rc == 0 && unlinkat(dir, backing_base(path), AT_REMOVEDIR) != 0)
        rc = errno == EEXIST ? -ENOTEMPTY : -errno;
    if (rc == 0 && fsync(dir) != 0)
        rc = -errno;
    close(dir);
    return rc;
}

int wc_ns_take_empty(wtable *t, const char *path, uint32_t *mode)
{
    if (t->opts.store && packer_store_kind(t->store, path) == PACKER_NS)
        return -ENOTEMPTY;
    struct stat st;
    int rc = remove_namespace_locked(t, path, &st);
    if (rc == 0)
        *mode = st.st_mode & 07777;
    return rc;
}

void wc_ns_put_back(wtable *t, const char *path, uint32_t mode)
{
    int dir = backing_open_parent(t->backing_fd, path, 0);
    if (dir < 0 || mkdirat(dir, backing_base(path), mode) != 0 || fsync(dir) != 0)
        fslog_warn("'%s': a rename over this empty directory failed, and the directory could not "
                   "be made again",
                   path);
    if (dir >= 0)
        close(dir);
}

int wtable_ns_mkdir(wtable *t, const char *path, uint32_t mode)
{
    if (!ns_name_ok(path)) {
        if (backing_path_ok(path))
            fslog_warn("mkdir '%s': a directory above checkpoints cannot end in %s or %s (those "
                       "are packs in the backing directory)",
                       path, BACKING_PACK_SUFFIX, BACKING_FILE_SUFFIX);
        return strlen(backing_base(path)) + BACKING_SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    }
    pthread_mutex_lock(&t->lock);
    int rc = wc_by_name(t, path) || wc_pack_exists(t, path) ? -EEXIST : 0;
    int dir = rc ? rc : backing_open_parent(t->backing_fd, path, 0);
    if (rc == 0 && dir < 0)
        rc = dir;
    if (rc == 0 && mkdirat(dir, backing_base(path), mode & 07777) != 0)
        rc = -errno;
    if (rc == 0 && fsync(dir) != 0)
        rc = -errno;
    if (dir >= 0)
        close(dir);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int wtable_ns_rmdir(wtable *t, const char *path)
{
    pthread_mutex_lock(&t->lock);
    int rc = remove_namespace_locked(t, path, NULL);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int wtable_ns_rename(wtable *t, const char *from, const char *to, int noreplace)
{
    if (!ns_name_ok(to))
        return strlen(backing_base(to)) + BACKING_SUFFIX_LEN > NAME_MAX ? -ENAMETOOLONG : -EINVAL;
    if (backing_is_below(to, from))
        return strcmp(from, to) == 0 ? 0 : -EINVAL;
    pthread_mutex_lock(&t->lock);
    int rc = 0, kind = wc_backing_kind(t, to);
    wckpt *target = wc_by_name(t, to);
    if (busy_below(t, from)) {
        fslog_warn("cannot rename '%s': a checkpoint in it is being written; rename it once "
                   "committed",
                   from);
        rc = -EBUSY;
    } else if ((target || kind) && noreplace) {
        rc = -EEXIST;
    } else if (target ? target->is_file : kind == WC_PACK_FILE) {
        rc = -ENOTDIR;
    } else if (target || kind == WC_PACK_DIR || busy_below(t, to)) {
        /* A checkpoint directory counts as not empty (as in wtable_rename),
         * and so does a namespace with one being written below it, which
         * has nothing of it in BACKING yet for renameat to see. */
        rc = -ENOTEMPTY;
    }
    int a = rc ? rc : backing_open_parent(t->backing_fd, from, 0);
    int b = a < 0 ? a : backing_open_parent(t->backing_fd, to, 0);
    if (rc == 0 && (a < 0 || b < 0))
        rc = a < 0 ? a : b;
    if (rc == 0 && renameat(a, backing_base(from), b, backing_base(to)) != 0)
        rc = errno == EEXIST ? -ENOTEMPTY : -errno;
    if (rc == 0 && (fsync(a) != 0 || fsync(b) != 0))
        rc = -errno;
    if (a >= 0)
        close(a);
    if (b >= 0)
        close(b);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* ---------------------------------------------- becoming a checkpoint */

typedef struct subdir {
    char *rel; /* below the namespace */
    uint32_t mode;
    struct timespec mtime;
} subdir;

typedef struct scan {
    subdir *v;
    size_t n, cap;
} scan;

/* Collects the directories below fd (pre-order) into s; -ENOTEMPTY as
 * soon as anything else is there. */
static int scan_dirs(int fd, const char *rel, scan *s, int depth)
{
    if (depth > 64)
        return -ENOTEMPTY;
    int dup_fd = dup(fd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        return -errno;
    }
    rewinddir(d);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
            rc = -ENOTEMPTY;
            break;
        }
        char *sub = backing_join(rel, e->d_name);
        if (!sub ||
            (s->n == s->cap && !(s->v = realloc(s->v, (s->cap = s->cap * 2 + 8) * sizeof *s->v)))) {
            free(sub);
            rc = -ENOMEM;
            break;
        }
        s->v[s->n++] = (subdir){sub, st.st_mode & 07777, st.st_mtim};
        int child = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        rc = child < 0 ? -errno : scan_dirs(child, sub, s, depth + 1);
        if (child >= 0)
            close(child);
    }
    closedir(d);
    return rc;
}

/* Removes the (empty) directory tree s found under fd, deepest first. */
static int remove_dirs(int fd, const scan *s)
{
    for (size_t i = s->n; i-- > 0;)
        if (unlinkat(fd, s->v[i].rel, AT_REMOVEDIR) != 0)
            return -errno;
    return 0;
}

static void scan_free(scan *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i].rel);
    free(s->v);
}

int wc_remove_empty_namespace(wtable *t, const char *path)
{
    int fd = backing_open_dir(t->backing_fd, path, 0);
    if (fd < 0)
        return fd == -ENOENT ? 0 : fd;
    scan s = {0};
    int rc = scan_dirs(fd, "", &s, 0);
    if (rc == 0)
        rc = remove_dirs(fd, &s);
    close(fd);
    scan_free(&s);
    int parent = rc ? -1 : backing_open_parent(t->backing_fd, path, 0);
    if (rc == 0 && parent < 0)
        rc = parent;
    if (rc == 0 && (unlinkat(parent, backing_base(path), AT_REMOVEDIR) != 0 || fsync(parent) != 0))
        rc = -errno;
    if (parent >= 0)
        close(parent);
    return rc;
}

int wtable_ns_convert(wtable *t, const char *path, wckpt **out)
{
    if (!*path)
        return -ENOTEMPTY; /* files at the root are checkpoints of their own */
    pthread_mutex_lock(&t->lock);
    int rc = busy_below(t, path) ? -ENOTEMPTY : 0;
    int fd = rc ? rc : backing_open_dir(t->backing_fd, path, 0);
    if (rc == 0 && fd < 0)
        rc = fd;
    struct stat st;
    if (rc == 0 && fstat(fd, &st) != 0)
        rc = -errno;
    scan s = {0};
    if (rc == 0)
        rc = scan_dirs(fd, "", &s, 0);
    wckpt *c = rc == 0 ? wc_start(t, path, st.st_mode & 07777, 0, 0, 0, &rc) : NULL;
    if (c) {
        pthread_mutex_lock(&c->lock);
        c->tree.nodes[WTREE_ROOT].mtime_sec = st.st_mtim.tv_sec;
        c->tree.nodes[WTREE_ROOT].mtime_nsec = (uint32_t)st.st_mtim.tv_nsec;
        c->tree.nodes[WTREE_ROOT].atime_sec = st.st_atim.tv_sec;
        c->tree.nodes[WTREE_ROOT].atime_nsec = (uint32_t)st.st_atim.tv_nsec;
        for (size_t i = 0; rc == 0 && i < s.n; i++) {
            char dir_path[BACKING_PATH_MAX + 1];
            uint32_t dir = WTREE_ROOT, node;
            rc = backing_dir_of(s.v[i].rel, dir_path, sizeof dir_path);
            for (char *p = dir_path, *q; rc == 0 && *p && dir != WTREE_NONE; p = q) {
                q = strchr(p, '/');
                if (q)
                    *q++ = '\0';
                else
                    q = p + strlen(p);
                dir = wtree_lookup(&c->tree, dir, p);
            }
            if (rc == 0 && dir == WTREE_NONE)
                rc = -EIO;
            if (rc == 0)
                rc = wtree_add(&c->tree, dir, backing_base(s.v[i].rel), WNODE_DIR, s.v[i].mode,
                               s.v[i].mtime.tv_sec, (uint32_t)s.v[i].mtime.tv_nsec, 0, &node);
        }
        c->meta_gen++;
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&t->lock);
    ckpt_err err = {0};
    /* Its directories are durable in staging before they leave BACKING. */
    if (c && rc == 0)
        rc = wc_save(c, &err);
    if (c && rc == 0 && (rc = remove_dirs(fd, &s)) == 0) {
        int parent = backing_open_parent(t->backing_fd, path, 0);
        rc = parent < 0 ? parent : unlinkat(parent, backing_base(path), AT_REMOVEDIR) ? -errno : 0;
        if (parent >= 0) {
            fsync(parent);
            close(parent);
        }
    }
    if (fd >= 0)
        close(fd);
    scan_free(&s);
    if (c && rc) {
        fslog_err("cannot make '%s' a checkpoint: %s", path, err.msg[0] ? err.msg : strerror(-rc));
        wtable_rmdir(t, path);
        wtable_forget(t, c, 1);
        return rc == -ENOTEMPTY ? -EIO : rc;
    }
    if (c) {
        fslog_info("'%s' is a checkpoint: the first file was written into it", path);
        *out = c;
    }
    return rc;
}

int wtable_commit_below(wtable *t, const char *path)
{
    pthread_mutex_lock(&t->lock);
    size_t n = 0;
    for (wckpt *c = t->all; c; c = c->next)
        n += c->current && backing_is_below(c->name, path);
    wckpt **v = calloc(n ? n : 1, sizeof *v);
    n = 0;
    for (wckpt *c = t->all; v && c; c = c->next) {
        if (c->current && backing_is_below(c->name, path)) {
            c->refs++;
            v[n++] = c;
        }
    }
    pthread_mutex_unlock(&t->lock);
    if (!v)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int r = wtable_commit(t, v[i]);
        if (r && !rc)
            rc = r;
        wtable_unref(t, v[i]);
    }
    free(v);
    return rc ? rc : (int)n;
}

int wtable_ns_state(wtable *t, const char *path, wns_state *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&t->lock);
    for (wckpt *c = t->all; c; c = c->next) {
        if (!c->current || !backing_is_below(c->name, path))
            continue;
        pthread_mutex_lock(&c->lock);
        static const int rank[] = {[WST_WRITING] = 1, [WST_PACKING] = 2, [WST_FAILED] = 3};
        int r = c->state <= WST_FAILED ? rank[c->state] : 0;
        if (r > out->rank) {
            out->rank = r;
            out->state = c->state;
            snprintf(out->error, sizeof out->error, "%s%s%s", c->name, c->error ? ": " : "",
                     c->error ? c->error : "");
        }
        for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
            const wnode *n = &c->tree.nodes[i];
            if (n->linked && n->kind == WNODE_FILE && n->data)
                out->size += wc_file_size(n->data);
        }
        if (c->state == WST_PACKING) {
            out->done += __atomic_load_n(&c->pack_done, __ATOMIC_RELAXED);
            out->total += __atomic_load_n(&c->pack_total, __ATOMIC_RELAXED);
            if (c->pack_running && wc_now_mono() - c->pack_started > out->seconds)
                out->seconds = wc_now_mono() - c->pack_started;
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&t->lock);
    if (!out->rank)
        out->state = WST_COMMITTED;
    return 0;
}
