/* Tensors of a .tpack, decoded with libckpt on the reading threads. The
 * pack is a local path or an object s3://BUCKET/[PREFIX/]NAME.tpack, opened
 * through libckpt's store (endpoint, region and keys from the environment,
 * the AWS way; ranged GETs, read ahead when sequential).
 *
 * A chunk that lies wholly inside the requested range is decoded straight
 * into the caller's (pinned) buffer. A chunk that straddles the range's
 * edge goes through a one-chunk cache per reader: neighbouring small
 * tensors (biases, norms) share chunks, and without the cache each of them
 * would decode the whole shared chunk again. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include "ckpt_internal.h"
#include "source.h"
#include "util.h"

typedef struct pack_src {
    cc_source base;
    ckpt_store *store; /* an s3:// pack's store, or NULL; outlives p */
    ckpt_pack *p;
    cc_tensor *tensors;
    size_t *index; /* tensors[k] is the pack's tensor index[k] */
    uint32_t chunk_size;
} pack_src;

typedef struct pack_reader {
    uint8_t *buf; /* one decoded chunk */
    size_t id;
    int valid;
} pack_reader;

static int pack_reader_new(cc_source *s, void **out, ckpt_err *err)
{
    pack_reader *rd = calloc(1, sizeof *rd);
    if (!rd)
        return cc_fail(err, -ENOMEM, "%s: out of memory", s->origin);
    *out = rd;
    return 0;
}

static void pack_reader_free(cc_source *s, void *p)
{
    pack_reader *rd = p;
    if (rd) {
        free(rd->buf);
        free(rd);
    }
}

static int read_stretch(pack_src *ps, pack_reader *rd, size_t file, uint64_t pos, uint64_t end,
                        uint8_t **dstp, ckpt_err *err);

static int pack_read(cc_source *s, void *p, size_t i, uint64_t off, void *buf, size_t len,
                     ckpt_err *err)
{
    pack_src *ps = (pack_src *)s;
    pack_reader *rd = p;
    const ckpt_tensor_info *t = i < s->n ? ckpt_tensor_at(ps->p, ps->index[i]) : NULL;
    if (!t || off > t->nbytes || len > t->nbytes - off)
        return cc_fail(err, -EINVAL, "%s: read past the end of tensor %zu", s->origin, i);
    i = ps->index[i];
    uint8_t *dst = buf;
    /* One stretch of one file at a time: a stored tensor is one, an
     * assembled one (a DCP tensor saved in chunks) one per part. */
    for (uint64_t done = 0; done < len;) {
        size_t file;
        uint64_t pos, run;
        int rc = ckpt_tensor_locate(ps->p, i, off + done, &file, &pos, &run, err);
        if (rc < 0)
            return rc;
        uint64_t end = pos + (run < len - done ? run : len - done);
        done += end - pos;
        rc = read_stretch(ps, rd, file, pos, end, &dst, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Bytes [pos, end) of file into *dst, which moves past them. */
static int read_stretch(pack_src *ps, pack_reader *rd, size_t file, uint64_t pos, uint64_t end,
                        uint8_t **dstp, ckpt_err *err)
{
    cc_source *s = &ps->base;
    uint8_t *dst = *dstp;
    while (pos < end) {
        ckpt_chunk_ref ref;
        int rc = ckpt_chunk_locate(ps->p, file, pos, &ref, err);
        if (rc < 0)
            return rc;
        uint64_t cend = ref.file_offset + ref.size;
        uint64_t n = (cend < end ? cend : end) - pos;
        if (ref.file_offset == pos && cend <= end) {
            rc = ckpt_chunk_decode(ps->p, ref.id, dst, err);
            if (rc < 0)
                return rc;
        } else {
            if (!rd->buf && !(rd->buf = malloc(ps->chunk_size)))
                return cc_fail(err, -ENOMEM, "%s: out of memory", s->origin);
            if (!rd->valid || rd->id != ref.id) {
                rd->valid = 0;
                rc = ckpt_chunk_decode(ps->p, ref.id, rd->buf, err);
                if (rc < 0)
                    return rc;
                rd->id = ref.id;
                rd->valid = 1;
            }
            memcpy(dst, rd->buf + (pos - ref.file_offset), (size_t)n);
        }
        dst += n;
        pos += n;
    }
    *dstp = dst;
    return 0;
}

static void pack_close(cc_source *s)
{
    pack_src *ps = (pack_src *)s;
    ckpt_close(ps->p);
    ckpt_store_free(ps->store);
    free(ps->tensors);
    free(ps->index);
    free(ps);
}

int cc_is_s3(const char *path)
{
    return strncmp(path, "s3://", 5) == 0;
}

/* s3://BUCKET/[PREFIX/]NAME: the store s3://BUCKET[/PREFIX] and NAME in it. */
static int open_s3(pack_src *ps, const char *url, const ckpt_key *key, ckpt_err *err)
{
    const char *slash = strrchr(url + 5, '/');
    if (!slash || !slash[1])
        return cc_fail(err, -EINVAL, "%s: expected s3://BUCKET/[PREFIX/]NAME.tpack", url);
    char *store_url = strndup(url, (size_t)(slash - url));
    if (!store_url)
        return cc_fail(err, -ENOMEM, "%s: out of memory", url);
    /* Before the credentials are read: a core dump would hold them. */
    int rc = ckpt_forbid_core_dumps();
    if (rc < 0)
        cc_fail(err, rc, "cannot disable core dumps: %s", strerror(-rc));
    else
        rc = ckpt_store_open(store_url, NULL, &ps->store, err);
    free(store_url);
    if (rc == 0)
        rc = ckpt_pack_open_in(ps->store, slash + 1, key, &ps->p, err);
    return rc;
}

int cc_source_open_pack(const char *path, const ckpt_key *key, cc_source **out, ckpt_err *err)
{
    *out = NULL;
    pack_src *ps = calloc(1, sizeof *ps);
    if (!ps)
        return cc_fail(err, -ENOMEM, "%s: out of memory", path);
    int rc = cc_is_s3(path) ? open_s3(ps, path, key, err) : ckpt_open(path, key, &ps->p, err);
    if (rc < 0) {
        ckpt_store_free(ps->store);
        free(ps);
        return rc;
    }
    ckpt_pack_info info;
    ckpt_info(ps->p, &info);
    ps->chunk_size = info.chunk_size;
    size_t n = ckpt_tensor_count(ps->p);
    ps->tensors = calloc(n ? n : 1, sizeof *ps->tensors);
    ps->index = calloc(n ? n : 1, sizeof *ps->index);
    if (!ps->tensors || !ps->index) {
        ckpt_close(ps->p);
        free(ps->tensors);
        free(ps->index);
        ckpt_store_free(ps->store);
        free(ps);
        return cc_fail(err, -ENOMEM, "%s: out of memory", path);
    }
    /* The strings live in the open pack, which outlives the source's users.
     * The tensors are the mount's: a chunk of an assembled tensor (a DCP
     * tensor saved in dim-0 shards) is loaded as part of it, not again on
     * its own. */
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor_info *t = ckpt_tensor_at(ps->p, i);
        if (t->part_of != SIZE_MAX)
            continue;
        ps->index[shown] = i;
        cc_tensor *d = &ps->tensors[shown++];
        d->name = t->name;
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        d->shape = t->shape;
        d->nbytes = t->nbytes;
        memcpy(d->sha256, t->sha256, 32);
        d->has_sha256 = 1;
    }
    ps->base.origin = ckpt_path(ps->p);
    ps->base.kind = "pack";
    ps->base.granule = info.chunk_size;
    ps->base.n = shown;
    ps->base.tensors = ps->tensors;
    ps->base.reader_new = pack_reader_new;
    ps->base.reader_free = pack_reader_free;
    ps->base.read = pack_read;
    ps->base.close = pack_close;
    *out = &ps->base;
    return 0;
}
