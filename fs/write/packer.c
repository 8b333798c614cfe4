#include "packer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/fslog.h"

#define PACK_SUFFIX ".tpack"
#define TMP_SUFFIX ".tpack.tmp"

int packer_tmp_name(const char *name, char *out, size_t cap)
{
    int n = snprintf(out, cap, ".%s" TMP_SUFFIX, name);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

typedef struct source {
    stage_blob *blob;
    const int *cancel;
    ckpt_err detail;          /* the blob's own message, richer than errno */
} source;

static ssize_t read_blob(void *ud, void *buf, size_t len, uint64_t off)
{
    source *s = ud;
    if (s->cancel && __atomic_load_n(s->cancel, __ATOMIC_RELAXED))
        return -ECANCELED;
    return stage_blob_pread(s->blob, buf, len, off, &s->detail);
}


/* The writer's sibling reader (ckpt_writer_set_sibling_reader): a staged
 * file of this checkpoint, whole, by its path in the pack; so that a DCP
 * directory saved into the mount finds its .metadata. */
static int read_sibling(void *ud, const char *pack_path, uint8_t **out, size_t *len, size_t max)
{
    const packer_job *job = ud;
    const packer_file *f = NULL;
    for (size_t i = 0; i < job->n_files && !f; i++)
        if (strcmp(job->files[i].path, pack_path) == 0)
            f = &job->files[i];
    if (!f)
        return -ENOENT;
    if (f->size > max)
        return -EFBIG;
    uint8_t *buf = malloc(f->size ? (size_t)f->size : 1);
    if (!buf)
        return -ENOMEM;
    source src = {f->blob, job->cancel, {0}};
    size_t done = 0;
    while (done < f->size) {
        ssize_t r = read_blob(&src, buf + done, (size_t)f->size - done, done);
        if (r <= 0) {
            free(buf);
            return r < 0 ? (int)r : -EIO;
        }
        done += (size_t)r;
    }
    *out = buf;
    *len = done;
    return 0;
}

static void on_progress(void *ud, uint64_t done, uint64_t total)
{
    const packer_job *job = ud;
    job->progress(job->progress_ud, done, total);
}

/* A file whose container parser rejected it is stored opaque; the pack's
 * manifest carries the warning too, the log says it when it happens. */
static void on_warn(void *ud, const char *src, const char *reason)
{
    fslog_warn("%s: stored opaque: %s", src, reason);
}

int packer_run(const packer_job *job, ckpt_err *err)
{
    char pack[512], tmp[512];
    if (snprintf(pack, sizeof pack, "%s" PACK_SUFFIX, job->name) >= (int)sizeof pack ||
        packer_tmp_name(job->name, tmp, sizeof tmp) != 0)
        return ckpt_fail(err, -ENAMETOOLONG, "checkpoint '%s': name too long", job->name);
    struct stat st;
    if (fstatat(job->backing_fd, pack, &st, AT_SYMLINK_NOFOLLOW) == 0)
        return ckpt_fail(err, -EEXIST, "checkpoint '%s': %s/%s already exists; not replacing it",
                         job->name, job->backing_path, pack);
    uint64_t total = 0;
    for (size_t i = 0; i < job->n_files; i++)
        total += job->files[i].size;
    ckpt_write_opts o = {0};
    o.level = -1;
    o.key = job->key;
    o.cipher = job->key ? job->cipher : CKPT_CIPHER_NONE;
    o.threads = job->threads;
    o.progress_total = total;
    if (job->progress) {
        o.progress = on_progress;
        o.progress_ud = (void *)job;
    }
    o.warn = on_warn;
    ckpt_writer *w = NULL;
    int rc = ckpt_writer_open_in(job->store, pack, tmp, &o, &w, err);
    if (rc == 0)
        ckpt_writer_set_sibling_reader(w, read_sibling, (void *)job);
    for (size_t i = 0; rc == 0 && i < job->n_files; i++) {
        const packer_file *f = &job->files[i];
        source src = {f->blob, job->cancel, {0}};
        char label[600];
        snprintf(label, sizeof label, "%s/%s", job->name, f->path);
        rc = ckpt_writer_add_reader(w, f->path, read_blob, &src, f->size, f->mode, f->mtime_sec,
                                    f->mtime_nsec, label, err);
        if (rc == -ECANCELED)
            ckpt_fail(err, rc, "checkpoint '%s': packing stopped", job->name);
        else if (rc && src.detail.code)
            ckpt_fail(err, rc, "checkpoint '%s': %s", job->name, src.detail.msg);
    }
    if (rc == 0) {
        rc = ckpt_writer_finish(w, NULL, err);
        w = NULL;
    }
    if (w)
        ckpt_writer_abort(w);
    if (rc == 0 && job->progress)
        job->progress(job->progress_ud, total, total);
    return rc;
}

int packer_remove_leftovers(int backing_fd)
{
    int fd = dup(backing_fd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return -e;
    }
    rewinddir(dir);
    int removed = 0;
    size_t suffix = strlen(TMP_SUFFIX);
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] != '.' || len <= suffix + 1 ||
            strcmp(e->d_name + len - suffix, TMP_SUFFIX) != 0)
            continue;
        if (unlinkat(backing_fd, e->d_name, 0) == 0)
            removed++;
    }
    closedir(dir);
    if (removed)
        fsync(backing_fd);
    return removed;
}

void packer_files_free(packer_file *files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free(files[i].path);
    free(files);
}
