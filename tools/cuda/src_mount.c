/* Tensors of a mounted checkpoint directory (ckptfs MOUNT/NAME): the list
 * comes from its manifest.json, the bytes from ordinary pread()s of
 * tensors/<path> (or, for a tensor without one, of its file at its offset),
 * so the daemon decodes in parallel for as many threads as read. The
 * manifest is checked like any input: paths must stay inside the directory
 * and sizes must agree with dtype and shape. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_mount.h"
#include "source.h"
#include "util.h"

typedef struct mount_tensor {
    char *rel;     /* file to read, relative to the directory */
    uint64_t base; /* where the tensor starts in it */
} mount_tensor;

typedef struct mount_src {
    cc_source base;
    char *dir;
    int dirfd;
    cc_tensor *tensors;
    mount_tensor *where;
    size_t n;
} mount_src;

typedef struct mount_reader {
    int fd;
    const char *rel; /* what fd has open: consecutive reads often share it */
} mount_reader;

static int mount_reader_new(cc_source *s, void **out, ckpt_err *err)
{
    mount_reader *rd = calloc(1, sizeof *rd);
    if (!rd)
        return cc_fail(err, -ENOMEM, "%s: out of memory", s->origin);
    rd->fd = -1;
    *out = rd;
    return 0;
}

static void mount_reader_free(cc_source *s, void *p)
{
    mount_reader *rd = p;
    if (rd) {
        if (rd->fd >= 0)
            close(rd->fd);
        free(rd);
    }
}

static int mount_read(cc_source *s, void *p, size_t i, uint64_t off, void *buf, size_t len,
                      ckpt_err *err)
{
    mount_src *ms = (mount_src *)s;
    mount_reader *rd = p;
    const mount_tensor *w = &ms->where[i];
    if (off > ms->tensors[i].nbytes || len > ms->tensors[i].nbytes - off)
        return cc_fail(err, -EINVAL, "%s: read past the end of tensor %zu", s->origin, i);
    if (rd->fd < 0 || rd->rel != w->rel) {
        if (rd->fd >= 0)
            close(rd->fd);
        rd->rel = NULL;
        rd->fd = openat(ms->dirfd, w->rel, O_RDONLY | O_CLOEXEC);
        if (rd->fd < 0)
            return cc_fail(err, -errno, "%s/%s: %s", ms->dir, w->rel, strerror(errno));
        rd->rel = w->rel;
    }
    int rc = cc_pread_all(rd->fd, buf, len, w->base + off);
    if (rc == -EIO)
        return cc_fail(err, rc, "%s/%s: file ends before the %llu bytes the manifest gives",
                       ms->dir, w->rel, (unsigned long long)(w->base + ms->tensors[i].nbytes));
    if (rc < 0)
        return cc_fail(err, rc, "%s/%s: %s", ms->dir, w->rel, strerror(-rc));
    return 0;
}

static void mount_close(cc_source *s)
{
    mount_src *ms = (mount_src *)s;
    for (size_t i = 0; i < ms->n; i++) {
        free((char *)ms->tensors[i].name);
        free((char *)ms->tensors[i].dtype);
        free((uint64_t *)ms->tensors[i].shape);
        free(ms->where[i].rel);
    }
    if (ms->dirfd >= 0)
        close(ms->dirfd);
    free(ms->tensors);
    free(ms->where);
    free(ms->dir);
    free(ms);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int parse_sha(const char *hex, uint8_t out[32])
{
    if (strlen(hex) != 64)
        return -1;
    for (int i = 0; i < 32; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int get_u64(json_t *o, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* One manifest entry into ms->tensors[i] / ms->where[i]. */
/* Where the mount shows the packed file rel: the manifest's "mount_path"
 * when it moved the file (under .packed/, its own path being one the mount
 * uses, such as tensors/...), rel itself when not moved, NULL when the
 * mount does not show it. */
static const char *file_shown_at(json_t *files, const char *rel)
{
    size_t n = json_array_size(files);
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(files, i);
        const char *path = json_string_value(json_object_get(f, "path"));
        if (!path || strcmp(path, rel) != 0)
            continue;
        json_t *moved = json_object_get(f, "mount_path");
        return moved ? json_string_value(moved) : rel;
    }
    return rel;
}

static int parse_tensor(mount_src *ms, const char *mpath, size_t i, json_t *o, json_t *files,
                        ckpt_err *err)
{
    cc_tensor *t = &ms->tensors[i];
    mount_tensor *w = &ms->where[i];
    const char *name = json_string_value(json_object_get(o, "name"));
    const char *dtype = json_string_value(json_object_get(o, "dtype"));
    json_t *shape = json_object_get(o, "shape");
    if (!json_is_object(o) || !name || !dtype || !json_is_array(shape) ||
        get_u64(o, "nbytes", &t->nbytes) < 0)
        return cc_fail(err, -EINVAL, "%s: tensor %zu: needs name, dtype, shape and nbytes", mpath,
                       i);
    if (!(t->name = strdup(name)) || !(t->dtype = strdup(dtype)))
        return cc_fail(err, -ENOMEM, "%s: out of memory", mpath);
    size_t nd = json_array_size(shape);
    uint64_t *dims = calloc(nd ? nd : 1, sizeof *dims);
    if (!dims)
        return cc_fail(err, -ENOMEM, "%s: out of memory", mpath);
    t->shape = dims;
    t->ndim = (uint32_t)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t k = 0; k < nd; k++) {
        json_t *d = json_array_get(shape, k);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return cc_fail(err, -EINVAL, "%s: tensor '%s': bad shape", mpath, name);
        dims[k] = (uint64_t)json_integer_value(d);
        if (dims[k] && numel > UINT64_MAX / dims[k])
            overflow = 1;
        numel *= dims[k];
    }
    unsigned es = ckpt_dtype_size(dtype);
    if (es && (overflow || numel > UINT64_MAX / es || numel * es != t->nbytes))
        return cc_fail(err, -EINVAL, "%s: tensor '%s': nbytes %llu does not match %s and its shape",
                       mpath, name, (unsigned long long)t->nbytes, dtype);
    const char *sha = json_string_value(json_object_get(o, "sha256"));
    if (sha) {
        if (parse_sha(sha, t->sha256) < 0)
            return cc_fail(err, -EINVAL, "%s: tensor '%s': bad sha256", mpath, name);
        t->has_sha256 = 1;
    }
    /* tensors/<path> when the daemon gave one, else the file that holds it. */
    const char *rel = json_string_value(json_object_get(o, "path"));
    w->base = 0;
    if (!rel) {
        rel = json_string_value(json_object_get(o, "file"));
        if (!rel || get_u64(o, "offset", &w->base) < 0)
            return cc_fail(err, -EINVAL, "%s: tensor '%s': neither path nor file and offset", mpath,
                           name);
        const char *file = rel;
        if (!(rel = file_shown_at(files, file)))
            return cc_fail(err, -ENOENT, "%s: tensor '%s': the mount does not show its file '%s'",
                           mpath, name, file);
    }
    if (!ckpt_path_is_safe(rel))
        return cc_fail(err, -EINVAL, "%s: tensor '%s': unsafe path '%s'", mpath, name, rel);
    if (!(w->rel = strdup(rel)))
        return cc_fail(err, -ENOMEM, "%s: out of memory", mpath);
    return 0;
}

int cc_source_open_mount(const char *dir, cc_source **out, ckpt_err *err)
{
    *out = NULL;
    mount_src *ms = calloc(1, sizeof *ms);
    if (!ms || !(ms->dir = strdup(dir))) {
        free(ms);
        return cc_fail(err, -ENOMEM, "%s: out of memory", dir);
    }
    ms->dirfd = -1;
    int rc = 0;
    json_t *root = NULL;
    size_t mlen = strlen(dir) + sizeof "/" CKPT_MOUNT_MANIFEST;
    char *mpath = malloc(mlen);
    if (!mpath) {
        rc = cc_fail(err, -ENOMEM, "%s: out of memory", dir);
        goto out;
    }
    snprintf(mpath, mlen, "%s/" CKPT_MOUNT_MANIFEST, dir);
    ms->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ms->dirfd < 0) {
        rc = cc_fail(err, -errno, "%s: %s", dir, strerror(errno));
        goto out;
    }
    if (faccessat(ms->dirfd, CKPT_MOUNT_MANIFEST, F_OK, 0) != 0) {
        rc = cc_fail(err, -ENOENT,
                     "%s: no manifest.json: not a checkpoint directory of a ckptfs mount", dir);
        goto out;
    }
    json_error_t jerr;
    root = json_load_file(mpath, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = cc_fail(err, -EINVAL, "%s: line %d: %s", mpath, jerr.line, jerr.text);
        goto out;
    }
    json_t *arr = json_object_get(root, "tensors");
    if (!json_is_array(arr)) {
        rc = cc_fail(err, -EINVAL, "%s: no \"tensors\" array", mpath);
        goto out;
    }
    size_t n = json_array_size(arr);
    ms->tensors = calloc(n ? n : 1, sizeof *ms->tensors);
    ms->where = calloc(n ? n : 1, sizeof *ms->where);
    if (!ms->tensors || !ms->where) {
        rc = cc_fail(err, -ENOMEM, "%s: out of memory", mpath);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ms->n = i + 1; /* so close() frees what the failing entry got */
        if ((rc = parse_tensor(ms, mpath, i, json_array_get(arr, i), json_object_get(root, "files"),
                               err)) < 0)
            goto out;
    }
    ms->base.origin = ms->dir;
    ms->base.kind = "mount";
    ms->base.n = n;
    ms->base.tensors = ms->tensors;
    ms->base.reader_new = mount_reader_new;
    ms->base.reader_free = mount_reader_free;
    ms->base.read = mount_read;
    ms->base.close = mount_close;
out:
    json_decref(root);
    free(mpath);
    if (rc < 0) {
        mount_close(&ms->base);
        return rc;
    }
    *out = &ms->base;
    return 0;
}
