/* The table of checkpoints.h: scanning the backing store and its
 * namespaces (a local directory, or an S3 prefix through
 * remote_listing.c), opening packs on first use, retiring replaced ones.
 * One job at about 920 lines: the scan, the open and the retirement share
 * the table's lock and each checkpoint's identity check. */
#include "checkpoints.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_state.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "manifest.h"
#include "remote_listing.h"

#define SUFFIX_LEN BACKING_SUFFIX_LEN
/* A pack with this many distinct damaged chunks is hopeless; stop keeping
 * track (and keep logging) rather than grow without bound. */
#define MAX_LOGGED_CHUNKS 4096

int checkpoints_init(checkpoint_table *t, const char *backing_path, int backing_fd,
                     const mount_key *key, chunk_cache *cache)
{
    memset(t, 0, sizeof *t);
    t->backing_path = strdup(backing_path);
    if (!t->backing_path)
        return -ENOMEM;
    ckpt_err err = {0};
    int rc = ckpt_store_open_local(backing_path, &t->store, &err);
    if (rc < 0) {
        free(t->backing_path);
        return rc;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->warn_lock, NULL);
    t->backing_fd = backing_fd;
    t->key = key;
    t->cache = cache;
    t->next_serial = 1;
    t->own_store = 1;
    return 0;
}

int checkpoints_init_store(checkpoint_table *t, ckpt_store *store, double list_interval,
                           int backing_fd, const mount_key *key, chunk_cache *cache)
{
    memset(t, 0, sizeof *t);
    /* Names are "<where>/<name>", as the local table's are paths. */
    t->backing_path = strdup(ckpt_store_where(store));
    t->remote = remote_listing_new(store, list_interval);
    if (!t->backing_path || !t->remote) {
        free(t->backing_path);
        remote_listing_free(t->remote);
        return -ENOMEM;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->warn_lock, NULL);
    t->store = store;
    t->backing_fd = backing_fd;
    t->key = key;
    t->cache = cache;
    t->next_serial = 1;
    clock_gettime(CLOCK_REALTIME, &t->remote_since);
    return 0;
}

/* A local pack's identity as its store would give it (local.c's
 * id_from_stat), so the two compare with ckpt_object_id_equal. */
static void id_of_stat(const struct stat *st, ckpt_object_id *id)
{
    memset(id, 0, sizeof *id);
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->size = (uint64_t)st->st_size;
    id->mtime_sec = st->st_mtim.tv_sec;
    id->mtime_nsec = (uint32_t)st->st_mtim.tv_nsec;
}

/* What the mount shows of an object: a read-only regular file of its size
 * and time. */
static void stat_of_id(const ckpt_object_id *id, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFREG | 0444;
    st->st_size = (off_t)id->size;
    st->st_mtim.tv_sec = id->mtime_sec;
    st->st_mtim.tv_nsec = id->mtime_nsec;
}

/* One warning per symlink name for the mount's lifetime: a listing
 * rescans the directory each time. Called from checkpoint_open with the
 * checkpoint's open_lock held, so never under (nor taking) t->lock. */
static void warn_link_once(checkpoint_table *t, const char *file_name)
{
    pthread_mutex_lock(&t->warn_lock);
    int seen = 0;
    for (size_t i = 0; !seen && i < t->n_warned_links; i++)
        seen = strcmp(t->warned_links[i], file_name) == 0;
    if (!seen) {
        char **grown = realloc(t->warned_links, (t->n_warned_links + 1) * sizeof *grown);
        char *copy = grown ? strdup(file_name) : NULL;
        if (grown)
            t->warned_links = grown;
        if (copy)
            t->warned_links[t->n_warned_links++] = copy;
    }
    pthread_mutex_unlock(&t->warn_lock);
    if (!seen)
        fslog_warn("%s/%s is a symbolic link: ignored (packs must be regular files in the "
                   "backing directory; links are never followed)",
                   t->backing_path, file_name);
}

/* Is file_name (a path below the backing directory) a pack? Its stat in
 * *st. Never follows a link. */
static int stat_pack(checkpoint_table *t, const char *file_name, struct stat *st)
{
    int dir = backing_open_parent(t->backing_fd, file_name, 0);
    if (dir < 0)
        return 0;
    int rc = fstatat(dir, backing_base(file_name), st, AT_SYMLINK_NOFOLLOW);
    close(dir);
    if (rc != 0)
        return 0;
    if (S_ISLNK(st->st_mode))
        warn_link_once(t, file_name);
    return S_ISREG(st->st_mode);
}

static void checkpoint_free(checkpoint_table *t, checkpoint *c)
{
    chunk_cache_drop_pack(t->cache, c->serial);
    pack_tree_free(c->tree);
    if (c->pack)
        ckpt_close(c->pack);
    pthread_mutex_destroy(&c->open_lock);
    pthread_mutex_destroy(&c->drop_lock);
    pthread_mutex_destroy(&c->fault_lock);
    pthread_mutex_destroy(&c->hide_lock);
    free(c->hidden);
    free(c->logged_chunks);
    free(c->name);
    free(c->pack_path);
    free(c);
}

void checkpoints_destroy(checkpoint_table *t)
{
    checkpoint *c = t->all;
    while (c) {
        checkpoint *next = c->next;
        checkpoint_free(t, c);
        c = next;
    }
    t->all = NULL;
    for (size_t i = 0; i < t->n_warned_links; i++)
        free(t->warned_links[i]);
    free(t->warned_links);
    pthread_mutex_destroy(&t->warn_lock);
    pthread_mutex_destroy(&t->lock);
    if (t->own_store)
        ckpt_store_free(t->store);
    remote_listing_free(t->remote);
    free(t->backing_path);
}

/* Frees c if nothing can reach it any more. Called with t->lock held. */
static void release_if_unused(checkpoint_table *t, checkpoint *c)
{
    if (c->current || c->refs || c->nlookup)
        return;
    for (checkpoint **link = &t->all; *link; link = &(*link)->next) {
        if (*link == c) {
            *link = c->next;
            break;
        }
    }
    checkpoint_free(t, c);
}

/* The drop itself (drop_pack_file). Called with open_lock and drop_lock
 * held; doing it twice changes nothing. */
static void let_go_of_pack(checkpoint *c)
{
    /* A store's pack holds no descriptor: nothing to let go of. */
    if (c->state == CHECKPOINT_OPEN && ckpt_fd(c->pack) >= 0) {
        int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null_fd < 0 || dup3(null_fd, ckpt_fd(c->pack), O_CLOEXEC) < 0)
            fslog_warn("checkpoint '%s': cannot let go of %s (%s); its space comes back once "
                       "the kernel forgets it",
                       c->name, c->pack_path, strerror(errno));
        if (null_fd >= 0)
            close(null_fd);
    }
    c->open_err = -ESTALE;
    __atomic_store_n(&c->state, CHECKPOINT_FAILED, __ATOMIC_RELEASE);
}

/* A checkpoint no longer current serves only inodes the kernel still
 * holds; if no file is open in it either, its pack file is let go now
 * rather than when the kernel forgets the last inode (which may be never,
 * for a shell's working directory): a deleted pack's space comes back at
 * once. The descriptor is pointed at /dev/null instead of closed, so the
 * pack's in-memory index stays valid for a request that is already
 * looking at it (an xattr of a tensor, a handover); new ones get ESTALE.
 * A first open under way (it holds open_lock, maybe for many seconds of
 * S3 retries) is not waited for, since that would stall the whole mount
 * on the table's lock: the open does the drop when it ends, and its
 * caller gets ESTALE like any request after the drop. Called with t->lock
 * held. */
static void drop_pack_file(checkpoint *c)
{
    if (c->current || c->refs || c->file_dropped)
        return;
    __atomic_store_n(&c->file_dropped, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&c->drop_lock);
    if (pthread_mutex_trylock(&c->open_lock) == 0) {
        let_go_of_pack(c);
        pthread_mutex_unlock(&c->open_lock);
    }
    pthread_mutex_unlock(&c->drop_lock);
}

/* Lets go of open_lock, first doing the drop that drop_pack_file decided
 * (file_dropped) and may have left to this open: then rc becomes ESTALE.
 * drop_lock is held across the unlock, so a drop either finds open_lock
 * free or is seen here. */
static int unlock_open(checkpoint *c, int rc)
{
    pthread_mutex_lock(&c->drop_lock);
    if (__atomic_load_n(&c->file_dropped, __ATOMIC_ACQUIRE)) {
        let_go_of_pack(c);
        rc = c->open_err;
    }
    pthread_mutex_unlock(&c->open_lock);
    pthread_mutex_unlock(&c->drop_lock);
    return rc;
}

static void retire(checkpoint_table *t, checkpoint *c)
{
    c->current = 0;
    drop_pack_file(c);
    release_if_unused(t, c);
}

void checkpoint_removed(checkpoint_table *t, checkpoint *c)
{
    pthread_mutex_lock(&t->lock);
    if (c->current)
        retire(t, c);
    pthread_mutex_unlock(&t->lock);
}

static int same_object(const checkpoint *c, const ckpt_object_id *id)
{
    return ckpt_object_id_equal(&c->oid, id);
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Shown names: checkpoint paths (backing_path.h) whose NAME.tpack (or
 * NAME.tfile) fits. */
static int pack_file_name(const char *name, int is_file, char *out, size_t out_len)
{
    if (!backing_path_ok(name) || backing_pack_name(name, is_file, out, out_len) != 0)
        return -ENOENT;
    return 0;
}

uint32_t checkpoint_entry_node(const checkpoint *c)
{
    if (!c->is_file)
        return TREE_ROOT;
    const tree_node *root = c->tree ? &c->tree->nodes[TREE_ROOT] : NULL;
    for (uint32_t i = 0; root && i < root->n_children; i++) {
        tree_kind k = c->tree->nodes[root->children[i]].kind;
        if (k == TREE_FILE || k == TREE_LINK)
            return root->children[i];
    }
    /* A packed name that clashed with a view: under .packed/. */
    return c->tree && ckpt_file_count(c->pack) > 0 ? c->tree->file_node[0] : TREE_NONE;
}

static checkpoint *checkpoint_new(checkpoint_table *t, const char *name, const char *file_name,
                                  const struct stat *st, const ckpt_object_id *id)
{
    checkpoint *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    size_t path_len = strlen(t->backing_path) + strlen(file_name) + 2;
    c->name = strdup(name);
    c->pack_path = malloc(path_len);
    if (!c->name || !c->pack_path) {
        free(c->name);
        free(c->pack_path);
        free(c);
        return NULL;
    }
    snprintf(c->pack_path, path_len, "%s/%s", t->backing_path, file_name);
    size_t flen = strlen(file_name);
    c->is_file = strcmp(file_name + flen - SUFFIX_LEN, BACKING_FILE_SUFFIX) == 0;
    c->identity = *st;
    c->oid = *id;
    c->current = 1;
    c->state = CHECKPOINT_UNOPENED;
    pthread_mutex_init(&c->open_lock, NULL);
    pthread_mutex_init(&c->drop_lock, NULL);
    pthread_mutex_init(&c->fault_lock, NULL);
    pthread_mutex_init(&c->hide_lock, NULL);
    return c;
}

/* The current checkpoint for name whose file is st, created or replaced as
 * needed. Called with t->lock held. */
static checkpoint *current_for(checkpoint_table *t, const char *name, const char *file_name,
                               const struct stat *st, const ckpt_object_id *id)
{
    size_t flen = strlen(file_name);
    int is_file = strcmp(file_name + flen - SUFFIX_LEN, BACKING_FILE_SUFFIX) == 0;
    for (checkpoint *c = t->all; c; c = c->next) {
        if (!c->current || strcmp(c->name, name) != 0)
            continue;
        if (same_object(c, id) && c->is_file == is_file)
            return c;
        retire(t, c);
        break;
    }
    if (t->next_serial >= INODE_WRITE_SERIAL_BASE)
        return NULL;
    checkpoint *c = checkpoint_new(t, name, file_name, st, id);
    if (!c)
        return NULL;
    c->serial = t->next_serial++;
    c->next = t->all;
    t->all = c;
    return c;
}

/* Is file_name an object of the store? Its identity in *id. */
static int find_object(checkpoint_table *t, const char *file_name, ckpt_object_id *id,
                       struct stat *st)
{
    const char *slash = strrchr(file_name, '/');
    char ns[BACKING_PATH_MAX + 1];
    size_t ns_len = slash ? (size_t)(slash - file_name) : 0;
    if (ns_len >= sizeof ns)
        return 0;
    memcpy(ns, file_name, ns_len);
    ns[ns_len] = '\0';
    int found = remote_listing_find(t->remote, ns, slash ? slash + 1 : file_name, 0, id) == 1;
    if (found)
        stat_of_id(id, st);
    return found;
}

static int find_pack(checkpoint_table *t, const char *file_name, ckpt_object_id *id,
                     struct stat *st)
{
    if (t->remote)
        return find_object(t, file_name, id, st);
    if (!stat_pack(t, file_name, st))
        return 0;
    id_of_stat(st, id);
    return 1;
}

checkpoint *checkpoints_lookup(checkpoint_table *t, const char *name, int count_lookup, int *err)
{
    char file_name[BACKING_PATH_MAX + SUFFIX_LEN + 1];
    struct stat st;
    ckpt_object_id id;
    *err = pack_file_name(name, 0, file_name, sizeof file_name);
    if (*err)
        return NULL;
    int found = find_pack(t, file_name, &id, &st);
    if (!found) {
        pack_file_name(name, 1, file_name, sizeof file_name);
        found = find_pack(t, file_name, &id, &st);
    }
    if (!found) {
        *err = -ENOENT;
        pthread_mutex_lock(&t->lock);
        for (checkpoint *c = t->all; c; c = c->next) {
            if (c->current && strcmp(c->name, name) == 0) {
                retire(t, c);
                break;
            }
        }
        pthread_mutex_unlock(&t->lock);
        return NULL;
    }
    pthread_mutex_lock(&t->lock);
    checkpoint *c = current_for(t, name, file_name, &st, &id);
    if (c && count_lookup)
        c->nlookup++;
    pthread_mutex_unlock(&t->lock);
    if (!c)
        *err = -ENOMEM;
    return c;
}

static int listing_add(root_listing *l, size_t *cap, const char *name, uint64_t ino, mode_t type,
                       int is_ns)
{
    if (l->n == *cap) {
        size_t grown_cap = *cap ? *cap * 2 : 16;
        struct root_entry *grown = realloc(l->entries, grown_cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        l->entries = grown;
        *cap = grown_cap;
    }
    l->entries[l->n].name = strdup(name);
    if (!l->entries[l->n].name)
        return -ENOMEM;
    l->entries[l->n].ino = ino;
    l->entries[l->n].type = type;
    l->entries[l->n].is_ns = is_ns;
    l->n++;
    return 0;
}

/* Is c's pack directly in the namespace ns? */
static int in_namespace(const checkpoint *c, const char *ns)
{
    const char *slash = strrchr(c->name, '/');
    size_t dir_len = slash ? (size_t)(slash - c->name) : 0;
    return dir_len == strlen(ns) && strncmp(c->name, ns, dir_len) == 0;
}

/* Packs that are gone. One found by a lookup while this scan ran (a newer
 * serial) was not missed, just not seen yet. */
static void retire_unseen(checkpoint_table *t, const char *ns, int generation,
                          uint32_t first_new_serial)
{
    pthread_mutex_lock(&t->lock);
    checkpoint *c = t->all;
    while (c) {
        checkpoint *next = c->next;
        if (c->current && c->scan_seen != generation && c->serial < first_new_serial &&
            in_namespace(c, ns))
            retire(t, c);
        c = next;
    }
    pthread_mutex_unlock(&t->lock);
}

static int has_entry(const root_listing *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->entries[i].name, name) == 0)
            return 1;
    return 0;
}

/* The namespaces of the staging directory of a writable mount on a store:
 * made with mkdir, not uploaded into yet. */
static int add_local_namespaces(checkpoint_table *t, const char *ns, root_listing *out, size_t *cap)
{
    int fd = backing_open_dir(t->backing_fd, ns, 0);
    DIR *dir = fd < 0 ? NULL : fdopendir(fd);
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    int rc = 0;
    struct dirent *d;
    while (rc == 0 && (d = readdir(dir))) {
        struct stat st;
        if (backing_name_ok(d->d_name) && !has_entry(out, d->d_name) &&
            fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
            rc = listing_add(out, cap, d->d_name, 0, S_IFDIR, 1);
    }
    closedir(dir);
    return rc;
}

static int list_remote(checkpoint_table *t, const char *ns, root_listing *out)
{
    remote_entry *v;
    size_t n;
    int rc = remote_listing_get(t->remote, ns, &v, &n);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->lock);
    int generation = ++t->scan_generation;
    uint32_t first_new_serial = t->next_serial;
    pthread_mutex_unlock(&t->lock);
    size_t cap = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *base_name = v[i].name;
        size_t len = strlen(base_name);
        if (v[i].is_dir) {
            if (backing_name_ok(base_name))
                rc = listing_add(out, &cap, base_name, 0, S_IFDIR, 1);
            continue;
        }
        int is_file =
            len > SUFFIX_LEN && strcmp(base_name + len - SUFFIX_LEN, BACKING_FILE_SUFFIX) == 0;
        if (len <= SUFFIX_LEN || len - SUFFIX_LEN > NAME_MAX ||
            (!is_file && strcmp(base_name + len - SUFFIX_LEN, BACKING_PACK_SUFFIX) != 0))
            continue;
        char base[NAME_MAX + 1];
        memcpy(base, base_name, len - SUFFIX_LEN);
        base[len - SUFFIX_LEN] = '\0';
        char *name = backing_join(ns, base);
        char *file_name = backing_join(ns, base_name);
        if (!name || !file_name) {
            rc = -ENOMEM;
        } else if (backing_path_ok(name)) {
            struct stat st;
            stat_of_id(&v[i].id, &st);
            pthread_mutex_lock(&t->lock);
            checkpoint *c = current_for(t, name, file_name, &st, &v[i].id);
            if (c) {
                c->scan_seen = generation;
                rc = listing_add(out, &cap, base, checkpoint_ino(c, TREE_ROOT),
                                 is_file ? 0 : S_IFDIR, 0);
            } else {
                rc = -ENOMEM;
            }
            pthread_mutex_unlock(&t->lock);
        }
        free(name);
        free(file_name);
    }
    remote_entries_free(v, n);
    if (rc == 0 && t->backing_fd >= 0)
        rc = add_local_namespaces(t, ns, out, &cap);
    if (rc) {
        root_listing_free(out);
        return rc;
    }
    retire_unseen(t, ns, generation, first_new_serial);
    return 0;
}

int checkpoints_list(checkpoint_table *t, const char *ns, root_listing *out)
{
    memset(out, 0, sizeof *out);
    if (t->remote)
        return list_remote(t, ns, out);
    int fd = backing_open_dir(t->backing_fd, ns, 0);
    if (fd < 0)
        return fd;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    pthread_mutex_lock(&t->lock);
    int generation = ++t->scan_generation;
    uint32_t first_new_serial = t->next_serial;
    pthread_mutex_unlock(&t->lock);

    size_t cap = 0;
    int rc = 0;
    struct dirent *d;
    while (rc == 0 && (d = readdir(dir))) {
        size_t len = strlen(d->d_name);
        struct stat st;
        if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
            continue;
        if (fstatat(dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            /* A namespace: any directory whose name a path may have. */
            if (backing_name_ok(d->d_name))
                rc = listing_add(out, &cap, d->d_name, 0, S_IFDIR, 1);
            continue;
        }
        int is_file =
            len > SUFFIX_LEN && strcmp(d->d_name + len - SUFFIX_LEN, BACKING_FILE_SUFFIX) == 0;
        if (len <= SUFFIX_LEN ||
            (!is_file && strcmp(d->d_name + len - SUFFIX_LEN, BACKING_PACK_SUFFIX) != 0))
            continue;
        char base[NAME_MAX + 1];
        memcpy(base, d->d_name, len - SUFFIX_LEN);
        base[len - SUFFIX_LEN] = '\0';
        char *name = backing_join(ns, base);
        char *file_name = backing_join(ns, d->d_name);
        if (!name || !file_name) {
            free(name);
            free(file_name);
            rc = -ENOMEM;
            break;
        }
        ckpt_object_id id;
        if (backing_path_ok(name) && stat_pack(t, file_name, &st)) {
            id_of_stat(&st, &id);
            pthread_mutex_lock(&t->lock);
            checkpoint *c = current_for(t, name, file_name, &st, &id);
            if (c) {
                c->scan_seen = generation;
                /* A single file may be a link: unknown until opened. */
                rc = listing_add(out, &cap, base, checkpoint_ino(c, TREE_ROOT),
                                 is_file ? 0 : S_IFDIR, 0);
            } else {
                rc = -ENOMEM;
            }
            pthread_mutex_unlock(&t->lock);
        }
        free(name);
        free(file_name);
    }
    closedir(dir);
    if (rc) {
        root_listing_free(out);
        return rc;
    }
    retire_unseen(t, ns, generation, first_new_serial);
    return 0;
}

int checkpoints_ns_stat(checkpoint_table *t, const char *path, struct stat *st)
{
    if (t->remote) {
        /* The top, or a prefix of the store; else maybe a namespace made in
         * the staging directory and not uploaded into yet. */
        const char *slash = strrchr(path, '/');
        char ns[BACKING_PATH_MAX + 1];
        size_t ns_len = slash ? (size_t)(slash - path) : 0;
        int found = !*path;
        if (!found && ns_len < sizeof ns && backing_path_ok(path)) {
            memcpy(ns, path, ns_len);
            ns[ns_len] = '\0';
            found = remote_listing_find(t->remote, ns, slash ? slash + 1 : path, 1, NULL) == 1;
        }
        if (found) {
            /* A prefix has no time of its own: the mount's, not 1970. */
            memset(st, 0, sizeof *st);
            st->st_mode = S_IFDIR | 0755;
            st->st_atim = st->st_mtim = st->st_ctim = t->remote_since;
            return 1;
        }
        if (t->backing_fd < 0)
            return 0;
    }
    if (!*path)
        return fstat(t->backing_fd, st) == 0;
    int dir = backing_open_parent(t->backing_fd, path, 0);
    if (dir < 0)
        return 0;
    int rc = fstatat(dir, backing_base(path), st, AT_SYMLINK_NOFOLLOW);
    close(dir);
    return rc == 0 && S_ISDIR(st->st_mode) && backing_path_ok(path);
}

void checkpoints_changed(checkpoint_table *t, const char *name)
{
    if (!t->remote)
        return;
    const char *slash = strrchr(name, '/');
    char ns[BACKING_PATH_MAX + 1];
    size_t ns_len = slash ? (size_t)(slash - name) : 0;
    if (ns_len >= sizeof ns)
        return;
    memcpy(ns, name, ns_len);
    ns[ns_len] = '\0';
    remote_listing_invalidate(t->remote, ns);
    /* Its parent's listing names the namespace itself, which may be new. */
    if (ns_len)
        checkpoints_changed(t, ns);
}

void root_listing_free(root_listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->entries[i].name);
    free(l->entries);
    memset(l, 0, sizeof *l);
}

checkpoint *checkpoints_find(checkpoint_table *t, uint64_t ino, uint32_t *node)
{
    uint32_t serial, n;
    if (!inode_split(ino, &serial, &n))
        return NULL;
    pthread_mutex_lock(&t->lock);
    checkpoint *c = t->all;
    while (c && c->serial != serial)
        c = c->next;
    pthread_mutex_unlock(&t->lock);
    if (c)
        *node = n;
    return c;
}

void checkpoint_count_lookup(checkpoint_table *t, checkpoint *c)
{
    pthread_mutex_lock(&t->lock);
    c->nlookup++;
    pthread_mutex_unlock(&t->lock);
}

void checkpoint_forget(checkpoint_table *t, checkpoint *c, uint64_t n)
{
    pthread_mutex_lock(&t->lock);
    c->nlookup = n > c->nlookup ? 0 : c->nlookup - n;
    release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
}

void checkpoint_ref(checkpoint_table *t, checkpoint *c)
{
    pthread_mutex_lock(&t->lock);
    c->refs++;
    pthread_mutex_unlock(&t->lock);
}

void checkpoint_unref(checkpoint_table *t, checkpoint *c)
{
    pthread_mutex_lock(&t->lock);
    c->refs--;
    drop_pack_file(c);
    release_if_unused(t, c);
    pthread_mutex_unlock(&t->lock);
}

/* Opening failures that say something about the pack (or the key) are
 * remembered; running out of memory or descriptors is not, nor a store
 * that gave no lasting answer (a gateway down or overloaded). */
static int is_lasting(int err)
{
    return err == -EACCES || err == -EIO || err == -EINVAL || err == -ENOTSUP || err == -ENOENT ||
           err == -EBADMSG || err == -EOVERFLOW;
}

/* Opens the pack file itself, never a link in its place: the backing
 * store opens names with O_NOFOLLOW. -ESTALE when the name no longer
 * leads to c's file. */
static int open_pack_nofollow(checkpoint_table *t, checkpoint *c, ckpt_pack **pack, ckpt_err *err)
{
    const char *file_name = c->pack_path + strlen(t->backing_path) + 1;
    int rc = ckpt_pack_open_in(t->store, file_name, mount_key_get(t->key), pack, err);
    if (rc == -ELOOP) {
        warn_link_once(t, file_name);
        return -ESTALE;
    }
    if (rc < 0)
        return rc;
    ckpt_object_id id;
    ckpt_pack_object_id(*pack, &id);
    if (!same_object(c, &id)) {
        ckpt_close(*pack); /* replaced since it was found */
        *pack = NULL;
        return -ESTALE;
    }
    return 0;
}

/* *transient: the store failed without a lasting answer (ckpt_err). */
static int open_pack(checkpoint_table *t, checkpoint *c, int *transient)
{
    ckpt_err err = {0};
    ckpt_pack *pack = NULL;
    int rc = open_pack_nofollow(t, c, &pack, &err);
    *transient = rc < 0 && err.code == rc && err.transient;
    if (rc == -ESTALE)
        return rc;
    if (rc < 0) {
        /* No key or the wrong one is the mount's configuration; anything
         * else is the pack. */
        fslog_at(rc == -EACCES ? LOG_WARNING : LOG_ERR, "checkpoint '%s': %s", c->name,
                 err.msg[0] ? err.msg : strerror(-rc));
        checkpoint_set_error(c, "%s", err.msg[0] ? err.msg : strerror(-rc));
        return rc;
    }
    /* The file we stat'ed may have been replaced since; never show one
     * pack's contents under another's identity. */
    struct stat st;
    if (ckpt_fd(pack) >= 0 && (fstat(ckpt_fd(pack), &st) || !same_file(&st, &c->identity))) {
        ckpt_close(pack);
        return -ESTALE;
    }
    pack_tree *tree = NULL;
    rc = pack_tree_build(pack, c->name, c->identity.st_mtim.tv_sec,
                         (uint32_t)c->identity.st_mtim.tv_nsec, &tree);
    char *manifest = NULL;
    size_t manifest_len = 0;
    if (rc == 0)
        rc = manifest_build(pack, c->name, tree, &manifest, &manifest_len);
    if (rc) {
        fslog_err("checkpoint '%s': cannot show the pack: %s", c->name, strerror(-rc));
        checkpoint_set_error(c, "%s: cannot show the pack: %s", c->pack_path, strerror(-rc));
        pack_tree_free(tree);
        ckpt_close(pack);
        return rc;
    }
    pack_tree_set_manifest(tree, manifest, manifest_len);
    ckpt_pack_info info;
    ckpt_info(pack, &info);
    c->chunk_size = info.chunk_size;
    c->pack = pack;
    c->tree = tree;
    return 0;
}

/* Long enough for the lookups of one `ls -l` or `cp -r` to share one
 * failure, short enough that a gateway back in service is seen at once. */
#define TRANSIENT_BACKOFF_MS 2000

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int backing_off(checkpoint *c)
{
    int64_t after = __atomic_load_n(&c->retry_after_ms, __ATOMIC_ACQUIRE);
    return after && now_ms() < after;
}

int checkpoint_open(checkpoint_table *t, checkpoint *c)
{
    /* Decided (under the table's lock, with no reference) even if not
     * done yet: an open under way does it when it ends, and a caller that
     * took a reference since must not be handed a pack about to go. */
    if (__atomic_load_n(&c->file_dropped, __ATOMIC_ACQUIRE))
        return -ESTALE;
    int state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
    if (state == CHECKPOINT_OPEN)
        return 0;
    if (state == CHECKPOINT_FAILED)
        return c->open_err;
    if (backing_off(c))
        return -EIO;
    pthread_mutex_lock(&c->open_lock);
    int rc = 0;
    state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
    if (state == CHECKPOINT_FAILED) {
        rc = c->open_err;
    } else if (state == CHECKPOINT_UNOPENED && backing_off(c)) {
        rc = -EIO; /* waited for the open that just failed */
    } else if (state == CHECKPOINT_UNOPENED) {
        int transient;
        rc = open_pack(t, c, &transient);
        if (rc == 0) {
            /* The "no answer" of an earlier try is no longer the news. */
            if (__atomic_exchange_n(&c->retry_after_ms, 0, __ATOMIC_ACQ_REL))
                checkpoint_set_error(c, "%s", "");
            __atomic_store_n(&c->state, CHECKPOINT_OPEN, __ATOMIC_RELEASE);
        } else if (transient) {
            /* Not the pack's fault: not remembered, tried again later. */
            rc = -EIO;
            __atomic_store_n(&c->retry_after_ms, now_ms() + TRANSIENT_BACKOFF_MS, __ATOMIC_RELEASE);
        } else if (is_lasting(rc)) {
            c->open_err = rc == -EACCES ? -EACCES : -EIO;
            c->open_cause = rc;
            rc = c->open_err;
            __atomic_store_n(&c->state, CHECKPOINT_FAILED, __ATOMIC_RELEASE);
        }
    }
    return unlock_open(c, rc);
}

int checkpoint_first_fault(checkpoint *c, size_t chunk_id)
{
    int first = 1;
    pthread_mutex_lock(&c->fault_lock);
    for (size_t i = 0; i < c->n_logged && first; i++)
        first = c->logged_chunks[i] != chunk_id;
    if (first && c->n_logged < MAX_LOGGED_CHUNKS) {
        if (c->n_logged == c->logged_cap) {
            size_t cap = c->logged_cap ? c->logged_cap * 2 : 8;
            size_t *grown = realloc(c->logged_chunks, cap * sizeof *grown);
            if (grown) {
                c->logged_chunks = grown;
                c->logged_cap = cap;
            }
        }
        if (c->n_logged < c->logged_cap)
            c->logged_chunks[c->n_logged++] = chunk_id;
    }
    pthread_mutex_unlock(&c->fault_lock);
    return first;
}

/* ------------------------------------------ hiding entries of a pack */

int checkpoint_node_hidden(checkpoint *c, uint32_t node)
{
    pthread_mutex_lock(&c->hide_lock);
    int hidden = c->hidden && c->hidden[node];
    pthread_mutex_unlock(&c->hide_lock);
    return hidden;
}

int checkpoint_hide(checkpoint *c, uint32_t dir, const char *name, int want_dir, int quiet)
{
    uint32_t node = pack_tree_lookup(c->tree, dir, name);
    pthread_mutex_lock(&c->hide_lock);
    int rc = 0;
    if (node == TREE_NONE || (c->hidden && c->hidden[node])) {
        rc = -ENOENT;
    } else {
        const tree_node *n = &c->tree->nodes[node];
        if (want_dir && n->kind != TREE_DIR)
            rc = -ENOTDIR;
        else if (!want_dir && n->kind == TREE_DIR)
            rc = -EISDIR;
        for (uint32_t i = 0; rc == 0 && want_dir && i < n->n_children; i++)
            if (!c->hidden || !c->hidden[n->children[i]])
                rc = -ENOTEMPTY;
    }
    if (rc == 0 && !c->hidden && !(c->hidden = calloc(c->tree->n_nodes, 1)))
        rc = -ENOMEM;
    if (rc == 0) {
        c->hidden[node] = 1;
        if (!c->hide_logged && !quiet) {
            c->hide_logged = 1;
            fslog_info("checkpoint '%s' is committed and cannot change: removing entries in it "
                       "only hides them until the next mount; removing the directory '%s' "
                       "itself (rm -r) deletes the checkpoint",
                       c->name, c->name);
        }
    }
    pthread_mutex_unlock(&c->hide_lock);
    return rc;
}

int checkpoint_is_empty(checkpoint *c)
{
    const pack_tree *tree = c->tree;
    int empty = 1;
    pthread_mutex_lock(&c->hide_lock);
    for (uint32_t i = 0; empty && i < tree->n_nodes; i++) {
        /* A symbolic link is the user's too: rmdir must not delete it. */
        if (tree->nodes[i].kind != TREE_FILE && tree->nodes[i].kind != TREE_LINK)
            continue;
        int hidden = 0;
        for (uint32_t n = i; c->hidden && !hidden && n != TREE_ROOT && n != TREE_NONE;
             n = tree->nodes[n].parent)
            hidden = c->hidden[n];
        empty = hidden;
    }
    pthread_mutex_unlock(&c->hide_lock);
    return empty;
}
