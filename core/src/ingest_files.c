/* Adding files and trees from disk: safetensors and npy files are checked
 * and their tensors indexed; everything else is stored as opaque bytes. */
#include "formats/formats.h"
#include "writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_BLOCK (1u << 20)
/* What a format's sniff() is shown: the first page of the file. */
#define SNIFF_HEAD 4096

/* Where a file's bytes come from: a descriptor (add_path) or the caller's
 * callback (add_reader). Everything below reads through this. */
typedef struct source {
    ckpt_read_fn read;
    void *ud;
    const char *name;         /* for error messages */
} source;

static ssize_t fd_read(void *ud, void *buf, size_t len, uint64_t off)
{
    return ckpt_pread_full(*(const int *)ud, buf, len, off);
}

static int read_at(const source *src, uint8_t *buf, size_t len, uint64_t off, ckpt_err *err)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = src->read(src->ud, buf + done, len - done, off + done);
        if (r < 0) return ckpt_fail(err, (int)r, "%s: read failed: %s", src->name, strerror((int)-r));
        if (r == 0) return ckpt_fail(err, -EIO, "%s: file shrank while being packed", src->name);
        done += (size_t)r;
    }
    return 0;
}

/* The tensor layout of a file whose container format claims it: 0 with lay
 * filled, 1 to store it opaque (no format claims it, or a valid file that is
 * best kept as bytes), or -errno naming the file (a malformed container
 * fails the pack). */
static int describe_file(const source *src, const char *pack_path, uint64_t size, ingest_layout *lay,
                         ckpt_err *err)
{
    uint8_t head[SNIFF_HEAD];
    size_t have = size < sizeof head ? (size_t)size : sizeof head;
    int rc = read_at(src, head, have, 0, err);
    if (rc < 0) return rc;
    const container_format *fmt = ckpt_container_sniff(pack_path, head, have, size);
    if (!fmt) return 1;
    ingest_source isrc = {src->read, src->ud, size, src->name};
    char msg[400] = "";
    rc = fmt->describe(&isrc, pack_path, lay, msg, sizeof msg);
    /* msg names the part ("safetensors header: ..."); prefix the file. */
    if (rc < 0) return ckpt_fail(err, rc, "%s: %s", src->name, msg);
    return rc;
}

/* Streams [off, off+len) of the source into the writer as opaque data or tensor data. */
static int copy_range(ckpt_writer *w, const source *src, uint8_t *buf, uint64_t off, uint64_t len, int tensor,
                      ckpt_err *err)
{
    while (len) {
        size_t n = len < READ_BLOCK ? (size_t)len : READ_BLOCK;
        int rc = read_at(src, buf, n, off, err);
        if (rc == 0) rc = tensor ? ckpt_writer_tensor_data(w, buf, n, err) : ckpt_writer_write(w, buf, n, err);
        if (rc < 0) return rc;
        off += n;
        len -= n;
    }
    return 0;
}

/* Begins tensor t of the file at pack_path. Two files may hold tensors of
 * the same name (two safetensors shards, a model and its EMA copy): the
 * first file's keeps the name, a later one's is named "PATH/NAME" (its
 * file's path in the pack, '/', its name), so tensors/ shows it under
 * tensors/PATH/NAME. The pack never fails for a clash. */
static int begin_tensor(ckpt_writer *w, const char *pack_path, const ingest_tensor *t, ckpt_err *err)
{
    int rc = ckpt_writer_begin_tensor(w, t->name, t->dtype, t->ndim, t->shape, err);
    if (rc != -EEXIST) return rc;
    size_t len = strlen(pack_path) + 1 + strlen(t->name) + 1;
    char *qualified = malloc(len);
    if (!qualified) return ckpt_fail(err, -ENOMEM, "out of memory");
    snprintf(qualified, len, "%s/%s", pack_path, t->name);
    rc = ckpt_writer_begin_tensor(w, qualified, t->dtype, t->ndim, t->shape, err);
    if (rc == -EEXIST)
        ckpt_fail(err, rc, "%s: tensor '%s' is also in an earlier file, and '%s' is taken too", pack_path,
                  t->name, qualified);
    free(qualified);
    return rc;
}

static int add_source(ckpt_writer *w, const char *pack_path, const source *src, uint64_t size, uint32_t mode,
                      int64_t mtime_sec, uint32_t mtime_nsec, ckpt_err *err)
{
    ingest_layout lay;
    memset(&lay, 0, sizeof lay);
    int rc = describe_file(src, pack_path, size, &lay, err);
    if (rc < 0) return rc;
    int structured = rc == 0;
    uint8_t *buf = malloc(READ_BLOCK);
    if (!buf) { ingest_layout_free(&lay); return ckpt_fail(err, -ENOMEM, "out of memory"); }
    rc = ckpt_writer_begin_file(w, pack_path, mode, mtime_sec, mtime_nsec, err);
    if (rc == 0 && !structured) {
        rc = copy_range(w, src, buf, 0, size, 0, err);
    } else if (rc == 0) {
        rc = copy_range(w, src, buf, 0, lay.header_bytes, 0, err);
        for (size_t i = 0; rc == 0 && i < lay.n; i++) {
            const ingest_tensor *t = &lay.t[i];
            rc = begin_tensor(w, pack_path, t, err);
            if (rc == 0) rc = copy_range(w, src, buf, t->offset, t->nbytes, 1, err);
            if (rc == 0) rc = ckpt_writer_end_tensor(w, err);
        }
    }
    if (rc == 0) rc = ckpt_writer_end_file(w, err);
    free(buf);
    ingest_layout_free(&lay);
    return rc;
}

static int add_fd(ckpt_writer *w, const char *pack_path, int fd, const char *src_path, const struct stat *st,
                  ckpt_err *err)
{
    source src = {fd_read, &fd, src_path};
    int rc = add_source(w, pack_path, &src, (uint64_t)st->st_size, (uint32_t)st->st_mode, (int64_t)st->st_mtim.tv_sec,
                        (uint32_t)st->st_mtim.tv_nsec, err);
    if (rc == 0) {
        struct stat now;
        if (fstat(fd, &now) == 0 && (now.st_size != st->st_size || now.st_mtim.tv_sec != st->st_mtim.tv_sec ||
                                     now.st_mtim.tv_nsec != st->st_mtim.tv_nsec))
            rc = ckpt_fail(err, -EAGAIN, "%s: file changed while being packed", src_path);
    }
    return rc;
}

int ckpt_writer_add_reader(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud, uint64_t size,
                           uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec, const char *src_name,
                           ckpt_err *err)
{
    if (!read) return ckpt_fail(err, -EINVAL, "%s: no read callback", pack_path ? pack_path : "(null)");
    source src = {read, ud, src_name ? src_name : pack_path};
    return add_source(w, pack_path, &src, size, mode, mtime_sec, mtime_nsec, err);
}

int ckpt_writer_add_path(ckpt_writer *w, const char *pack_path, const char *src_path, ckpt_err *err)
{
    int fd = open(src_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ELOOP) return ckpt_fail(err, -ELOOP, "%s: is a symbolic link; refusing to follow it", src_path);
        return ckpt_fail(err, -errno, "%s: cannot open: %s", src_path, strerror(errno));
    }
    struct stat st;
    int rc;
    if (fstat(fd, &st) < 0) rc = ckpt_fail(err, -errno, "%s: stat failed: %s", src_path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = ckpt_fail(err, -EINVAL, "%s: not a regular file", src_path);
    else rc = add_fd(w, pack_path, fd, src_path, &st, err);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------ tree walk */

typedef struct pathlist {
    char **v;
    size_t n, cap;
} pathlist;

static void pathlist_free(pathlist *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Collects regular files below root/rel; anything else is an error, so
 * nothing is silently left out of a checkpoint. */
static int walk(const char *root, const char *rel, pathlist *out, dev_t skip_dev, ino_t skip_ino, uint64_t *bytes,
                int depth, ckpt_err *err)
{
    if (depth > 64) return ckpt_fail(err, -ELOOP, "%s/%s: directories nested too deeply", root, rel);
    char *dirpath;
    if (asprintf(&dirpath, "%s%s%s", root, *rel ? "/" : "", rel) < 0) return ckpt_fail(err, -ENOMEM, "out of memory");
    DIR *d = opendir(dirpath);
    if (!d) {
        int rc = ckpt_fail(err, -errno, "%s: cannot open directory: %s", dirpath, strerror(errno));
        free(dirpath);
        return rc;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *child, *full;
        if (asprintf(&child, "%s%s%s", rel, *rel ? "/" : "", de->d_name) < 0) { rc = -ENOMEM; break; }
        if (asprintf(&full, "%s/%s", dirpath, de->d_name) < 0) { free(child); rc = -ENOMEM; break; }
        struct stat st;
        if (lstat(full, &st) < 0) {
            rc = ckpt_fail(err, -errno, "%s: stat failed: %s", full, strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(root, child, out, skip_dev, skip_ino, bytes, depth + 1, err);
        } else if (S_ISLNK(st.st_mode)) {
            rc = ckpt_fail(err, -ELOOP, "%s: is a symbolic link; refusing to follow it (copy the target in instead)", full);
        } else if (!S_ISREG(st.st_mode)) {
            rc = ckpt_fail(err, -EINVAL, "%s: not a regular file or directory", full);
        } else if (!(st.st_dev == skip_dev && st.st_ino == skip_ino)) {
            if (bytes) *bytes += (uint64_t)st.st_size;
            if (out) {
                if (grow_array((void **)&out->v, &out->cap, out->n, sizeof *out->v) < 0) rc = -ENOMEM;
                else { out->v[out->n++] = child; child = NULL; }
            }
        }
        free(child);
        free(full);
    }
    if (rc == -ENOMEM) ckpt_fail(err, rc, "out of memory");
    closedir(d);
    free(dirpath);
    return rc;
}

int ckpt_writer_add_tree(ckpt_writer *w, const char *src_dir, ckpt_err *err)
{
    pathlist l = {0};
    dev_t dev;
    ino_t ino;
    writer_output_id(w, &dev, &ino);
    int rc = walk(src_dir, "", &l, dev, ino, NULL, 0, err);
    if (rc == 0) qsort(l.v, l.n, sizeof *l.v, cmp_str);
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        char *full;
        if (asprintf(&full, "%s/%s", src_dir, l.v[i]) < 0) { rc = ckpt_fail(err, -ENOMEM, "out of memory"); break; }
        rc = ckpt_writer_add_path(w, l.v[i], full, err);
        free(full);
    }
    pathlist_free(&l);
    return rc;
}

int ckpt_tree_size(const char *path, uint64_t *out, ckpt_err *err)
{
    struct stat st;
    if (stat(path, &st) < 0) return ckpt_fail(err, -errno, "%s: %s", path, strerror(errno));
    *out = 0;
    if (S_ISREG(st.st_mode)) {
        *out = (uint64_t)st.st_size;
        return 0;
    }
    return walk(path, "", NULL, 0, 0, out, 0, err);
}
