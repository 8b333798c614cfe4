/* The local-directory store: objects are the regular files of one
 * directory, reached with *at() calls relative to a descriptor opened once,
 * so renaming or replacing the directory's path later changes nothing.
 * Every open uses O_NOFOLLOW (a symbolic link planted at a name is refused,
 * never followed) and O_CLOEXEC; a name with directories in it ("run1/x")
 * is resolved with no link followed on the way and never above the
 * store's directory. New objects are written to a temporary
 * name and published by commit: fsync, rename over the final name, fsync of
 * the directory; abort unlinks the temporary file.
 *
 * The same code, with AT_FDCWD as its directory and names taken as paths,
 * serves the path-based API (ckpt_open, ckpt_writer_open), so the bytes on
 * disk, the syscalls and the messages are those of before the store. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct local_store {
    ckpt_store base;
    int dirfd; /* AT_FDCWD: names are paths as given */
} local_store;

typedef struct local_reader {
    store_reader base;
    int fd;
} local_reader;

typedef struct local_upload {
    store_upload base;
    local_store *store;
    int fd;
    char *name, *tmp;             /* relative to the store */
    char *shown_name, *shown_tmp; /* for messages */
} local_upload;

typedef struct local_lock {
    ckpt_store_lock base;
    int fd;
} local_lock;

/* Names in messages: "<dir>/<name>", or the path itself for AT_FDCWD. */
#define SHOWN_MAX 8192
static const char *shown(const local_store *ls, const char *name, char buf[SHOWN_MAX])
{
    if (!ls->base.where)
        return name;
    snprintf(buf, SHOWN_MAX, "%s/%s", ls->base.where, name);
    return buf;
}

/* openat(), except that below a store directory a link in any component
 * of name fails with ELOOP, and ".." cannot leave the directory
 * (openat2's RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH; kernels before 5.6
 * fall back to O_NOFOLLOW on the last component). */
static int open_at(const local_store *ls, const char *name, int flags, mode_t mode)
{
    if (ls->dirfd != AT_FDCWD && strchr(name, '/')) {
        struct open_how how = {.flags = (uint64_t)(flags | O_NOFOLLOW),
                               .mode = flags & O_CREAT ? mode : 0,
                               .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH};
        long fd = syscall(SYS_openat2, ls->dirfd, name, &how, sizeof how);
        if (fd >= 0 || errno != ENOSYS)
            return (int)fd;
    }
    return openat(ls->dirfd, name, flags | O_NOFOLLOW, mode);
}

static void id_from_stat(const struct stat *st, ckpt_object_id *id)
{
    memset(id, 0, sizeof *id);
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->mtime_sec = (int64_t)st->st_mtim.tv_sec;
    id->mtime_nsec = (uint32_t)st->st_mtim.tv_nsec;
    id->size = (uint64_t)st->st_size;
}

/* ---------------------------------------------------------------- reading */

static ssize_t reader_read_at(store_reader *r, void *buf, size_t len, uint64_t off, ckpt_err *err)
{
    ssize_t n = ckpt_pread_full(((local_reader *)r)->fd, buf, len, off);
    if (n < 0)
        ckpt_fail(err, (int)n, "%s: %s", r->name, strerror((int)-n));
    return n;
}

static int reader_fd(const store_reader *r)
{
    return ((const local_reader *)r)->fd;
}

static void reader_close(store_reader *r)
{
    local_reader *lr = (local_reader *)r;
    if (!lr)
        return;
    if (lr->fd >= 0)
        close(lr->fd);
    free(lr->base.name);
    free(lr);
}

static const store_reader_ops reader_ops = {
    .read_at = reader_read_at, .fd = reader_fd, .close = reader_close};

/* Takes fd (closed on failure): a reader if it is a regular file. */
static int reader_from_fd(int fd, const char *shown_name, store_reader **out, ckpt_err *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ckpt_fail(err, -EINVAL, "%s: not a regular file", shown_name);
    }
    local_reader *lr = calloc(1, sizeof *lr);
    char *name = strdup(shown_name);
    if (!lr || !name) {
        free(lr);
        free(name);
        close(fd);
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", shown_name);
    }
    lr->base.ops = &reader_ops;
    lr->base.name = name;
    id_from_stat(&st, &lr->base.id);
    lr->fd = fd;
    *out = &lr->base;
    return 0;
}

static int local_open_read(ckpt_store *s, const char *name, store_reader **out, ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    char buf[SHOWN_MAX];
    const char *sn = shown(ls, name, buf);
    int fd = open_at(ls, name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0 && errno == ELOOP)
        return ckpt_fail(err, -ELOOP, "%s: is a symbolic link; refusing to follow it", sn);
    if (fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot open: %s", sn, strerror(errno));
    return reader_from_fd(fd, sn, out, err);
}

int store_local_open_path(const char *path, store_reader **out, ckpt_err *err)
{
    /* Followed: a pack reached through a symbolic link has always opened. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot open: %s", path, strerror(errno));
    return reader_from_fd(fd, path, out, err);
}

/* ---------------------------------------------------------------- listing */

typedef struct listing {
    ckpt_object_info *v;
    size_t n, cap;
} listing;

static void listing_free(listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free((char *)l->v[i].name);
    free(l->v);
}

static int info_cmp(const void *a, const void *b)
{
    return strcmp(((const ckpt_object_info *)a)->name, ((const ckpt_object_info *)b)->name);
}

static int local_list(ckpt_store *s, const char *prefix, int dirs, ckpt_object_fn fn, void *ud,
                      ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    /* "a/b": the directory "a", the names starting with "b". */
    const char *slash = strrchr(prefix, '/');
    size_t dir_len = slash ? (size_t)(slash - prefix) : 0;
    const char *leaf = slash ? slash + 1 : prefix;
    char *dir = slash ? strndup(prefix, dir_len) : strdup(".");
    if (!dir)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", ckpt_store_where(s));
    char buf[SHOWN_MAX];
    const char *sd = slash ? shown(ls, dir, buf) : ckpt_store_where(s);
    int fd = open_at(ls, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        int rc = ckpt_fail(err, -errno, "%s: cannot list: %s", sd, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(dir);
        return rc;
    }
    listing l = {0}, subdirs = {0};
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = readdir(d))) {
        if (strncmp(de->d_name, leaf, strlen(leaf)) != 0 || !strcmp(de->d_name, ".") ||
            !strcmp(de->d_name, ".."))
            continue;
        struct stat st;
        /* Only regular files are objects; links and directories are not. */
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        int is_dir = S_ISDIR(st.st_mode);
        if (!S_ISREG(st.st_mode) && !(dirs && is_dir))
            continue;
        listing *into = is_dir ? &subdirs : &l;
        char *name;
        if ((slash ? asprintf(&name, "%s/%s", dir, de->d_name)
                   : asprintf(&name, "%s", de->d_name)) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (grow_array((void **)&into->v, &into->cap, into->n, sizeof *into->v) < 0) {
            free(name);
            rc = -ENOMEM;
            break;
        }
        memset(&into->v[into->n], 0, sizeof into->v[0]);
        into->v[into->n].name = name;
        into->v[into->n].is_dir = is_dir;
        if (!is_dir)
            id_from_stat(&st, &into->v[into->n].id);
        into->n++;
    }
    if (rc == 0 && errno)
        rc = ckpt_fail(err, -errno, "%s: cannot list: %s", sd, strerror(errno));
    else if (rc == -ENOMEM)
        ckpt_fail(err, rc, "%s: out of memory", sd);
    closedir(d);
    free(dir);
    if (rc == 0) {
        if (l.n)
            qsort(l.v, l.n, sizeof *l.v, info_cmp);
        for (size_t i = 0; rc == 0 && i < l.n; i++)
            rc = fn(ud, &l.v[i]);
        if (subdirs.n)
            qsort(subdirs.v, subdirs.n, sizeof *subdirs.v, info_cmp);
        for (size_t i = 0; rc == 0 && i < subdirs.n; i++)
            rc = fn(ud, &subdirs.v[i]);
    }
    listing_free(&l);
    listing_free(&subdirs);
    return rc;
}

/* ---------------------------------------------------------------- writing */

static void upload_free(local_upload *u)
{
    if (u->fd >= 0)
        close(u->fd);
    free(u->name);
    free(u->tmp);
    free(u->shown_name);
    free(u->shown_tmp);
    free(u);
}

static int upload_write(store_upload *su, const void *buf, size_t len, ckpt_err *err)
{
    local_upload *u = (local_upload *)su;
    ssize_t r = ckpt_write_full(u->fd, buf, len);
    if (r < 0)
        return ckpt_fail(err, (int)r, "%s: write failed: %s", u->shown_tmp, strerror((int)-r));
    return 0;
}

static void upload_abort(store_upload *su)
{
    local_upload *u = (local_upload *)su;
    if (!u)
        return;
    unlinkat(u->store->dirfd, u->tmp, 0);
    upload_free(u);
}

/* fsync of the directory holding name, so the rename is durable. */
static int fsync_dir_of(const local_store *ls, const char *name)
{
    char *copy = strdup(name);
    if (!copy)
        return -ENOMEM;
    const char *dir = dirname(copy);
    int rc;
    if (strcmp(dir, ".") == 0 && ls->dirfd != AT_FDCWD) {
        rc = fsync(ls->dirfd) < 0 ? -errno : 0;
    } else {
        /* A path given to the path API is followed, as it always was. */
        int dfd = ls->dirfd == AT_FDCWD ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                                        : open_at(ls, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        rc = dfd < 0 ? -errno : fsync(dfd) < 0 ? -errno : 0;
        if (dfd >= 0)
            close(dfd);
    }
    free(copy);
    return rc;
}

static int upload_commit(store_upload *su, ckpt_err *err)
{
    local_upload *u = (local_upload *)su;
    int rc = 0;
    if (fsync(u->fd) < 0) {
        rc = ckpt_fail(err, -errno, "%s: fsync failed: %s", u->shown_tmp, strerror(errno));
        upload_abort(su);
        return rc;
    }
    /* Renamed while still locked: a writer that opened the temporary name
     * meanwhile finds, once it has the lock, that the name is no longer
     * this file (take_temporary). */
    if (renameat(u->store->dirfd, u->tmp, u->store->dirfd, u->name) < 0) {
        rc = ckpt_fail(err, -errno, "%s: cannot rename to %s: %s", u->shown_tmp, u->shown_name,
                       strerror(errno));
        upload_abort(su);
        return rc;
    }
    close(u->fd);
    u->fd = -1;
    if ((rc = fsync_dir_of(u->store, u->name)) < 0)
        /* The object is complete and in place; only its durability is in doubt. */
        ckpt_fail(err, rc, "%s: directory fsync failed: %s", u->shown_name, strerror(-rc));
    upload_free(u);
    return rc;
}

static const store_upload_ops upload_ops = {upload_write, upload_commit, upload_abort};

/* Opens the upload's temporary file, empty and locked. Two writers of one
 * name would share it: each would truncate and overwrite the other's
 * bytes, and the first to rename would publish the mix. The lock goes with
 * the descriptor, so a file left by a killed writer is simply taken over;
 * one whose name was renamed or removed under us (its writer finished or
 * gave up between our open and our lock) is not ours to truncate, so the
 * name is opened again. Where the file system has no flock, as before. */
static int take_temporary(local_store *ls, local_upload *u, ckpt_err *err)
{
    for (int tries = 0; tries < 8; tries++) {
        /* O_NOFOLLOW: a symlink planted at the temporary name must not redirect the write. */
        u->fd = open_at(ls, u->tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (u->fd < 0)
            return ckpt_fail(err, -errno, "%s: cannot create: %s", u->shown_tmp, strerror(errno));
        if (flock(u->fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            if (e == EWOULDBLOCK)
                return ckpt_fail(err, -EBUSY, "%s: another writer is writing it now", u->shown_tmp);
            if (e != ENOSYS && e != EOPNOTSUPP && e != ENOLCK && e != EINVAL)
                return ckpt_fail(err, -e, "%s: cannot lock: %s", u->shown_tmp, strerror(e));
        }
        struct stat mine, named;
        if (fstat(u->fd, &mine) == 0 &&
            fstatat(ls->dirfd, u->tmp, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
            mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
            if (ftruncate(u->fd, 0) < 0)
                return ckpt_fail(err, -errno, "%s: cannot create: %s", u->shown_tmp,
                                 strerror(errno));
            return 0;
        }
        close(u->fd);
        u->fd = -1;
    }
    return ckpt_fail(err, -EBUSY, "%s: other writers keep replacing it", u->shown_tmp);
}

static int local_create(ckpt_store *s, const char *name, const char *tmp_name, store_upload **out,
                        ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    char buf[SHOWN_MAX];
    char tmp_buf[PATH_MAX];
    if (!tmp_name) {
        if (ckpt_tmp_name(name, "", ".tmp", tmp_buf, sizeof tmp_buf) < 0)
            return ckpt_fail(err, -ENAMETOOLONG, "%s: name too long", shown(ls, name, buf));
        tmp_name = tmp_buf;
    }
    local_upload *u = calloc(1, sizeof *u);
    if (!u)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    u->base.ops = &upload_ops;
    u->store = ls;
    u->fd = -1;
    u->name = strdup(name);
    u->tmp = strdup(tmp_name);
    if (u->name && u->tmp) {
        u->shown_name = strdup(shown(ls, u->name, buf));
        u->shown_tmp = strdup(shown(ls, u->tmp, buf));
    }
    if (!u->shown_name || !u->shown_tmp) {
        upload_free(u);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    int rc = take_temporary(ls, u, err);
    if (rc < 0) {
        upload_free(u);
        return rc;
    }
    struct stat st;
    if (fstat(u->fd, &st) == 0)
        id_from_stat(&st, &u->base.id);
    if (fstatat(ls->dirfd, u->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
        id_from_stat(&st, &u->base.replaces);
    *out = &u->base;
    return 0;
}

/* ------------------------------------------------------ administration */

static int local_remove(ckpt_store *s, const char *name, ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    char buf[SHOWN_MAX];
    if (unlinkat(ls->dirfd, name, 0) < 0)
        return ckpt_fail(err, -errno, "%s: cannot remove: %s", shown(ls, name, buf),
                         strerror(errno));
    return 0;
}

static int local_rename(ckpt_store *s, const char *from, const char *to, ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    char b1[SHOWN_MAX], b2[SHOWN_MAX];
    if (renameat(ls->dirfd, from, ls->dirfd, to) < 0)
        return ckpt_fail(err, -errno, "%s: cannot rename to %s: %s", shown(ls, from, b1),
                         shown(ls, to, b2), strerror(errno));
    return 0;
}

/* flock, not fcntl: flock locks belong to the open file, so a second take in
 * the same process conflicts too, and they go with the descriptor. */
static int local_lock_take(ckpt_store *s, const char *name, ckpt_store_lock **out, ckpt_err *err)
{
    local_store *ls = (local_store *)s;
    char buf[SHOWN_MAX];
    const char *sn = shown(ls, name, buf);
    int fd = open_at(ls, name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot open the lock file: %s", sn, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = e == EWOULDBLOCK ? ckpt_pread_full(fd, pid, sizeof pid - 1, 0) : -1;
        close(fd);
        if (e != EWOULDBLOCK)
            return ckpt_fail(err, -e, "%s: cannot lock: %s", sn, strerror(e));
        long holder = n > 0 ? strtol(pid, NULL, 10) : 0;
        if (holder > 0)
            return ckpt_fail(err, -EBUSY, "%s: locked by process %ld", sn, holder);
        return ckpt_fail(err, -EBUSY, "%s: locked by another process", sn);
    }
    /* The holder's PID, for the message of whoever finds the lock taken. */
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || ckpt_pwrite_full(fd, pid, (size_t)len, 0) < 0) {
        int rc = ckpt_fail(err, -errno, "%s: cannot write the lock file: %s", sn, strerror(errno));
        close(fd);
        return rc;
    }
    local_lock *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    l->base.store = s;
    l->fd = fd;
    *out = &l->base;
    return 0;
}

static void local_unlock(ckpt_store_lock *base)
{
    local_lock *l = (local_lock *)base;
    /* No stale PID for the next contender to blame; closing unlocks. */
    if (ftruncate(l->fd, 0) < 0) {
        /* nothing to do: the lock goes with the descriptor regardless */
    }
    close(l->fd);
    free(l);
}

static void local_free(ckpt_store *s)
{
    local_store *ls = (local_store *)s;
    if (ls->dirfd >= 0)
        close(ls->dirfd);
    free(ls->base.where);
    free(ls);
}

static const store_ops local_ops = {
    .list = local_list,
    .open_read = local_open_read,
    .create = local_create,
    .remove = local_remove,
    .rename = local_rename,
    .lock = local_lock_take,
    .unlock = local_unlock,
    .free = local_free,
};

static local_store *local_new(int dirfd, const char *where)
{
    local_store *ls = calloc(1, sizeof *ls);
    if (!ls)
        return NULL;
    ls->base.ops = &local_ops;
    ls->dirfd = dirfd;
    if (where && !(ls->base.where = strdup(where))) {
        free(ls);
        return NULL;
    }
    return ls;
}

int ckpt_store_open_local(const char *dir, ckpt_store **out, ckpt_err *err)
{
    *out = NULL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot open directory: %s", dir, strerror(errno));
    local_store *ls = local_new(fd, dir);
    if (!ls) {
        close(fd);
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", dir);
    }
    *out = &ls->base;
    return 0;
}

ckpt_store *store_cwd(void)
{
    local_store *ls = local_new(AT_FDCWD, NULL);
    return ls ? &ls->base : NULL;
}
