#include "packer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "common/links.h"

#define TMP_SUFFIX ".tpack.tmp"

/* A checkpoint's base name may be 249 bytes (NAME.tpack fits NAME_MAX),
 * but ".BASE.tpack.tmp" is 11 bytes longer: ckpt_tmp_name shortens such a
 * base, and the name still starts with '.' and ends in .tpack.tmp, as
 * packer_remove_leftovers looks for. */
int packer_tmp_name(const char *name, char *out, size_t cap)
{
    return ckpt_tmp_name(name, ".", TMP_SUFFIX, out, cap);
}

typedef struct source {
    stage_blob *blob;
    ckpt_pack *base; /* when blob is NULL */
    size_t base_index;
    const int *cancel, *cancel_one;
    ckpt_err detail; /* the blob's own message, richer than errno */
} source;

static ssize_t read_blob(void *ud, void *buf, size_t len, uint64_t off)
{
    source *s = ud;
    if ((s->cancel && __atomic_load_n(s->cancel, __ATOMIC_RELAXED)) ||
        (s->cancel_one && __atomic_load_n(s->cancel_one, __ATOMIC_RELAXED)))
        return -ECANCELED;
    if (!s->blob)
        /* Unchanged since the pack this one replaces, but its chunks could
         * not be reused as stored (ckpt_writer_copy_file said -EXDEV: a
         * tensor name now taken, say): decoded and packed again. */
        return ckpt_file_pread(s->base, s->base_index, buf, len, off, &s->detail);
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
    source src = {f->blob, f->base, f->base_index, job->cancel, job->cancel_one, {0}};
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

static ssize_t read_mem(void *ud, void *buf, size_t len, uint64_t off)
{
    const packer_job *job = ud;
    if (off >= job->links_len)
        return 0;
    size_t n = job->links_len - (size_t)off < len ? job->links_len - (size_t)off : len;
    memcpy(buf, job->links + off, n);
    return (ssize_t)n;
}

static int add_links(const packer_job *job, ckpt_writer *w, ckpt_err *err)
{
    char label[600];
    snprintf(label, sizeof label, "%s/%s", job->name, LINKS_FILE);
    return ckpt_writer_add_reader(w, LINKS_FILE, read_mem, (void *)job, job->links_len, 0644,
                                  job->links_mtime_sec, job->links_mtime_nsec, label, err);
}

static void on_progress(void *ud, uint64_t done, uint64_t total)
{
    const packer_job *job = ud;
    job->progress(job->progress_ud, done, total);
}

/* A bad file (stored opaque, or as it is when damaged): the pack's
 * manifest says so too, the log says it when it happens. */
static void on_warn(void *ud, const char *src, const char *reason)
{
    fslog_warn("%s: %s", src, reason);
}

static int write_pack(const packer_job *job, const char *pack, const char *tmp, ckpt_err *err);

enum { NOT_OURS, OURS, OURS_OLD, GONE };

/* Whether pack, listed in the store, is an earlier try's (job->tried): by
 * the pack id in its header, drawn at random for every pack, where an ETag
 * or a size would not tell another writer's pack from ours. NOT_OURS,
 * OURS, OURS_OLD (of the checkpoint before a change), GONE (deleted since
 * it was listed), or -errno when its header could not be read for a
 * reason worth a later try (no answer). A NOT_OURS whose header could
 * not be read leaves why in err. */
static int earlier_try(const packer_job *job, const char *pack, ckpt_err *err)
{
    if (!job->n_tried)
        return NOT_OURS;
    ckpt_pack_info info;
    ckpt_err perr = {0};
    int rc = ckpt_probe_in(job->store, pack, &info, &perr);
    if (rc < 0 && perr.transient) {
        char what[BACKING_PATH_MAX + 16];
        snprintf(what, sizeof what, "checkpoint '%s'", job->name);
        *err = perr;
        return ckpt_fail_prefix(err, what);
    }
    for (size_t i = 0; rc == 0 && i < job->n_tried; i++)
        if (memcmp(info.pack_id, job->tried[i], 16) == 0)
            return job->n_tried - i <= job->n_tried_current ? OURS : OURS_OLD;
    if (rc < 0 && rc != -ENOENT)
        *err = perr;
    return rc == -ENOENT ? GONE : NOT_OURS;
}

int packer_run(const packer_job *job, ckpt_err *err)
{
    char pack[BACKING_PATH_MAX + 64], tmp[BACKING_PATH_MAX + 64];
    if (backing_pack_name(job->name, job->is_file, pack, sizeof pack) != 0 ||
        packer_tmp_name(job->name, tmp, sizeof tmp) != 0)
        return ckpt_fail(err, -ENAMETOOLONG, "checkpoint '%s': name too long", job->name);
    if (job->remote) {
        int kind = job->replace ? 0 : packer_store_kind(job->store, job->name);
        if (kind < PACKER_PACK_DIR)
            return write_pack(job, pack, tmp, err);
        if (kind != (job->is_file ? PACKER_PACK_FILE : PACKER_PACK_DIR))
            /* A pack of the other kind hides the name: never a try of ours. */
            return ckpt_fail(err, -EEXIST,
                             "checkpoint '%s': %s/%s%s already exists; not "
                             "replacing it",
                             job->name, ckpt_store_where(job->store), job->name,
                             kind == PACKER_PACK_FILE ? BACKING_FILE_SUFFIX : BACKING_PACK_SUFFIX);
        ckpt_err why = {0};
        int ours = earlier_try(job, pack, &why);
        if (ours < 0) {
            *err = why;
            return ours;
        }
        if (ours == NOT_OURS)
            return ckpt_fail(err, -EEXIST,
                             "checkpoint '%s': %s/%s already exists; not "
                             "replacing it%s%s%s",
                             job->name, ckpt_store_where(job->store), pack,
                             why.code ? " (its header cannot be read: " : "", why.msg,
                             why.code ? ")" : "");
        if (ours == OURS) {
            fslog_info("checkpoint '%s': %s/%s is the pack of an earlier try, whose upload "
                       "took though no answer said so: it is the commit",
                       job->name, ckpt_store_where(job->store), pack);
            if (job->found_earlier)
                *job->found_earlier = 1;
            return 0;
        }
        /* Gone, or an earlier try's of what the checkpoint was then. */
        return write_pack(job, pack, tmp, err);
    }
    /* Its namespace may have been removed by hand meanwhile; links are
     * never followed on the way. */
    int dir = backing_open_parent(job->backing_fd, job->name, 1);
    if (dir < 0)
        return ckpt_fail(err, dir, "checkpoint '%s': cannot open its directory in %s: %s",
                         job->name, job->backing_path, strerror(-dir));
    struct stat st;
    int exists = fstatat(dir, backing_base(pack), &st, AT_SYMLINK_NOFOLLOW) == 0;
    close(dir);
    if (exists && !job->replace)
        return ckpt_fail(err, -EEXIST, "checkpoint '%s': %s/%s already exists; not replacing it",
                         job->name, job->backing_path, pack);
    return write_pack(job, pack, tmp, err);
}

typedef struct kind_ud {
    const char *name;
    size_t len;
    int kind;
} kind_ud;

static int kind_of(void *ud, const ckpt_object_info *info)
{
    kind_ud *k = ud;
    const char *rest = info->name + k->len;
    if (strncmp(info->name, k->name, k->len) != 0)
        return 0;
    if (info->is_dir && !*rest)
        k->kind = PACKER_NS;
    else if (!info->is_dir && strcmp(rest, BACKING_PACK_SUFFIX) == 0 && k->kind != PACKER_NS)
        k->kind = PACKER_PACK_DIR;
    else if (!info->is_dir && strcmp(rest, BACKING_FILE_SUFFIX) == 0 && !k->kind)
        k->kind = PACKER_PACK_FILE;
    return 0;
}

int packer_store_kind(ckpt_store *s, const char *name)
{
    kind_ud k = {name, strlen(name), 0};
    ckpt_err err = {0};
    /* One listing of what starts with the name: NAME/, NAME.tpack, ... */
    if (ckpt_store_list_dirs(s, name, kind_of, &k, &err) < 0)
        fslog_warn("cannot list %s/%s: %s", ckpt_store_where(s), name, err.msg);
    return k.kind;
}

static int write_pack(const packer_job *job, const char *pack, const char *tmp, ckpt_err *err)
{
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
    ckpt_readers_ahead *ahead = NULL;
    /* One source per file, alive until the writer is done: the writer's
     * hash lanes read big files again beside the pipeline, those of the
     * staged ones from before the writer reaches them. An unchanged file
     * is not hashed ahead: its chunks are usually reused, and when they
     * are not it is decoded from the previous pack, at its turn. */
    size_t n_plan = job->n_files ? job->n_files : 1;
    source *srcs = calloc(n_plan, sizeof *srcs);
    ckpt_planned_reader *plan = calloc(n_plan, sizeof *plan);
    int rc = srcs && plan ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < job->n_files; i++) {
        const packer_file *f = &job->files[i];
        srcs[i] = (source){f->blob, f->base, f->base_index, job->cancel, job->cancel_one, {0}};
        plan[i] = (ckpt_planned_reader){read_blob, &srcs[i], f->size, f->blob != NULL};
    }
    if (rc == 0)
        rc = ckpt_writer_open_in(job->store, pack, tmp, &o, &w, err);
    else
        ckpt_fail(err, rc, "checkpoint '%s': out of memory", job->name);
    if (rc == 0 && !(ahead = ckpt_readers_ahead_new(w, plan, job->n_files)))
        rc = ckpt_fail(err, -ENOMEM, "checkpoint '%s': out of memory", job->name);
    if (rc == 0)
        ckpt_writer_set_sibling_reader(w, read_sibling, (void *)job);
    if (rc == 0 && job->commit_sent)
        ckpt_writer_commit_flag(w, job->commit_sent);
    if (rc == 0 && job->trying) {
        uint8_t id[16];
        ckpt_writer_pack_id(w, id);
        rc = job->trying(job->progress_ud, id, err);
    }
    int links_done = !job->links;
    size_t reused = 0;
    uint64_t reused_bytes = 0;
    for (size_t i = 0; rc == 0 && i < job->n_files; i++) {
        const packer_file *f = &job->files[i];
        if (!links_done && strverscmp(LINKS_FILE, f->path) < 0) {
            links_done = 1;
            if ((rc = add_links(job, w, err)) != 0)
                break;
        }
        if (!f->blob) {
            /* Unchanged since the previous generation: its stored chunks are
             * reused, not decoded and packed again. */
            rc = ckpt_writer_copy_file(w, f->path, f->mode, f->mtime_sec, f->mtime_nsec, f->base,
                                       f->base_index, err);
            if (rc == 0) {
                reused++;
                reused_bytes += f->size;
                continue;
            }
            if (rc != -EXDEV)
                break;
        }
        source *src = &srcs[i];
        char label[600];
        snprintf(label, sizeof label, "%s/%s", job->name, f->path);
        rc = ckpt_writer_add_reader_ahead(ahead, i, f->path, f->mode, f->mtime_sec, f->mtime_nsec,
                                          label, err);
        if (rc == -ECANCELED)
            ckpt_fail(err, rc, "checkpoint '%s': packing stopped", job->name);
        else if (rc && src->detail.code)
            ckpt_fail(err, rc, "checkpoint '%s': %s", job->name, src->detail.msg);
    }
    if (rc == 0 && !links_done)
        rc = add_links(job, w, err);
    if (rc == 0) {
        rc = ckpt_writer_finish(w, NULL, err);
        w = NULL;
    }
    if (w)
        ckpt_writer_abort(w);
    ckpt_readers_ahead_free(ahead);
    free(plan);
    free(srcs);
    if (rc == 0 && job->progress)
        job->progress(job->progress_ud, total, total);
    if (rc == 0 && reused)
        fslog_info(
            "checkpoint '%s': %zu unchanged %s (%llu bytes) reused from the previous generation "
            "without decoding",
            job->name, reused, reused == 1 ? "file" : "files", (unsigned long long)reused_bytes);
    return rc;
}

static int remove_leftovers_in(int fd, int depth)
{
    int dup_fd = dup(fd);
    DIR *dir = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!dir) {
        int e = errno;
        if (dup_fd >= 0)
            close(dup_fd);
        return -e;
    }
    rewinddir(dir);
    int removed = 0;
    size_t suffix = strlen(TMP_SUFFIX);
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            (depth == 0 && strcmp(e->d_name, BACKING_RESERVED) == 0) ||
            fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode) && depth < 64) {
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            if (sub >= 0) {
                int n = remove_leftovers_in(sub, depth + 1);
                removed += n > 0 ? n : 0;
                close(sub);
            }
            continue;
        }
        if (!S_ISREG(st.st_mode) || e->d_name[0] != '.' || len <= suffix + 1 ||
            strcmp(e->d_name + len - suffix, TMP_SUFFIX) != 0)
            continue;
        if (unlinkat(fd, e->d_name, 0) == 0)
            removed++;
    }
    closedir(dir);
    if (removed)
        fsync(fd);
    return removed;
}

int packer_remove_leftovers(int backing_fd)
{
    return remove_leftovers_in(backing_fd, 0);
}

void packer_files_free(packer_file *files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free(files[i].path);
    free(files);
}
