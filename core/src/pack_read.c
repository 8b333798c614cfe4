/* Opening a pack: every header, footer and index field is checked before
 * any of it is used, so later reads can trust the in-memory index. The
 * index is parsed one section per function, in its on-disk order
 * (index_counts, _files, _extents, _tensors, _chunks, _skipped, _assembled), each
 * checked against the sections before it.
 *
 * One job at about 1,200 lines: the reader of one pack. The reads at the end
 * (chunk decode, pread, locate) are the other half of the same contract,
 * trusting exactly what the checks above proved; the streaming and verify
 * paths that build on them live in stream.c. Bytes come through a
 * store_reader (store/store.h), never from a path or descriptor directly. */
#include "pack.h"
#include "codec.h"
#include "format.h"

#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zlib.h>

/* Fuzz builds skip checksums so mutated inputs reach the checks behind them
 * (the usual libFuzzer convention); release builds never define this. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define FUZZING_SKIPS_CHECKSUMS 1
#else
#define FUZZING_SKIPS_CHECKSUMS 0
#endif

/* All len bytes at off: 0, -ENODATA when the pack ends first, or -errno
 * with *why saying what the store found (an S3 store: the HTTP status). */
static int read_exact(store_reader *obj, void *buf, size_t len, uint64_t off, ckpt_err *why)
{
    *why = (ckpt_err){0};
    ssize_t r = obj->ops->read_at(obj, buf, len, off, why);
    return r < 0 ? (int)r : (size_t)r < len ? -ENODATA : 0;
}

/* read_exact without the copy where the store lends its memory: *data is
 * where the bytes are (buf or the store's), *hold for release_stored. */
static int borrow_exact(store_reader *obj, void *buf, size_t len, uint64_t off, const void **data,
                        void **hold, ckpt_err *why)
{
    *data = buf;
    *hold = NULL;
    if (!obj->ops->borrow)
        return read_exact(obj, buf, len, off, why);
    *why = (ckpt_err){0};
    ssize_t r = obj->ops->borrow(obj, buf, len, off, data, hold, why);
    return r < 0 ? (int)r : (size_t)r < len ? -ENODATA : 0;
}

/* What read_exact's failure was, in words: the store's own message when it
 * gave one (it names the object), else strerror. */
static const char *read_why(int rc, const ckpt_err *why)
{
    return rc != -ENODATA && why->msg[0] ? why->msg : strerror(-rc);
}

/* rc, with err marked transient when the store's failure (why) was: the
 * read may succeed later, so it says nothing about the pack. */
static int read_failed(ckpt_err *err, int rc, const ckpt_err *why)
{
    if (err)
        err->transient = rc != -ENODATA && why->transient;
    return rc;
}

/* Bounds-checked reader over the plaintext index. */
typedef struct rd {
    const uint8_t *p;
    size_t len, pos;
    int bad;
} rd;

static const uint8_t *rd_take(rd *r, size_t n)
{
    if (r->bad || n > r->len - r->pos) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *q = r->p + r->pos;
    r->pos += n;
    return q;
}
static uint8_t rd_u8(rd *r)
{
    const uint8_t *q = rd_take(r, 1);
    return q ? q[0] : 0;
}
static uint16_t rd_u16(rd *r)
{
    const uint8_t *q = rd_take(r, 2);
    return q ? get_u16(q) : 0;
}
static uint32_t rd_u32(rd *r)
{
    const uint8_t *q = rd_take(r, 4);
    return q ? get_u32(q) : 0;
}
static uint64_t rd_u64(rd *r)
{
    const uint8_t *q = rd_take(r, 8);
    return q ? get_u64(q) : 0;
}

/* Copies a length-prefixed string into the arena as a C string. */
static char *rd_str(rd *r, size_t n, char **arena)
{
    const uint8_t *q = rd_take(r, n);
    if (!q || memchr(q, 0, n)) {
        r->bad = 1;
        return NULL;
    }
    char *s = *arena;
    memcpy(s, q, n);
    s[n] = 0;
    *arena += n + 1;
    return s;
}

/* Orders paths bytewise but with '/' below every other byte, so all of
 * "a/..." comes straight after "a", before "a-b" or "a.b". */
static int cmp_path_slash_first(const void *x, const void *y)
{
    const unsigned char *a = *(const unsigned char *const *)x,
                        *b = *(const unsigned char *const *)y;
    while (*a && *a == *b)
        a++, b++;
    int ra = *a == '/' ? 1 : *a ? *a + 1 : 0, rb = *b == '/' ? 1 : *b ? *b + 1 : 0;
    return ra - rb;
}

typedef struct ext_key {
    uint64_t extent, offset;
    size_t tensor;
} ext_key;

static int cmp_ext_key(const void *x, const void *y)
{
    const ext_key *a = x, *b = y;
    if (a->extent != b->extent)
        return a->extent < b->extent ? -1 : 1;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->tensor < b->tensor ? -1 : a->tensor > b->tensor;
}

/* Fills p->ext_tensors: each extent's tensors in the order they start, so
 * verify can hash them as chunks stream by. */
static int group_tensors_by_extent(ckpt_pack *p)
{
    ext_key *k = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *k);
    p->ext_tensors = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *p->ext_tensors);
    if (!k || !p->ext_tensors) {
        free(k);
        return -ENOMEM;
    }
    for (size_t i = 0; i < p->n_tensors; i++)
        k[i] = (ext_key){p->tensors[i].extent_index, p->tensors[i].extent_offset, i};
    qsort(k, p->n_tensors, sizeof *k, cmp_ext_key);
    for (size_t i = 0; i < p->n_extents; i++)
        p->extents[i].n_tensors = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        extent *e = &p->extents[k[i].extent];
        if (e->n_tensors++ == 0)
            e->first_tensor = i;
        p->ext_tensors[i] = k[i].tensor;
    }
    free(k);
    return 0;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        rc = ckpt_fail(err, -EIO, __VA_ARGS__);                                                    \
        goto fail;                                                                                 \
    } while (0)

/* The counts at the head of the index, and the arrays they size. */
static int index_counts(ckpt_pack *p, rd *r, size_t len, ckpt_err *err)
{
    if (rd_u32(r) != TPACK_INDEX_MAGIC)
        return ckpt_fail(err, -EIO, "index: bad magic");
    uint64_t nf = rd_u32(r), nt = rd_u32(r);
    uint64_t ns = rd_u32(r); /* reserved (0) before version 4 */
    if (p->version < 4)
        ns = 0;
    uint64_t ne = rd_u64(r), nc = rd_u64(r);
    /* Each record has a minimum size, so counts larger than the index allows are lies. */
    if (r->bad || nf > len / 70 || nt > len / 48 || ne > len / TPACK_EXTENT_RECORD ||
        nc > len / TPACK_CHUNK_RECORD || ns > len / TPACK_SKIPPED_RECORD_MIN)
        return ckpt_fail(err, -EIO, "index: record counts do not fit the index size");
    p->n_files = nf;
    p->n_tensors = p->n_stored = nt;
    p->n_extents = ne;
    p->n_chunks = nc;
    p->n_skipped = ns;
    p->skipped = calloc(ns ? ns : 1, sizeof *p->skipped);
    if (!p->skipped)
        return ckpt_fail(err, -ENOMEM, "out of memory for the index");
    p->files = calloc(nf ? nf : 1, sizeof *p->files);
    p->tensors = calloc(nt ? nt : 1, sizeof *p->tensors);
    p->extents = calloc(ne ? ne : 1, sizeof *p->extents);
    p->chunks = calloc(nc ? nc : 1, sizeof *p->chunks);
    p->index = malloc(len + 1);
    if (!p->files || !p->tensors || !p->extents || !p->chunks || !p->index)
        return ckpt_fail(err, -ENOMEM, "out of memory for the index");
    if (strmap_init(&p->file_map, nf) < 0 || strmap_init(&p->tensor_map, nt) < 0)
        return ckpt_fail(err, -ENOMEM, "out of memory for the index");
    return 0;
}

/* File records: safe unique paths, extents in order and covering all. */
static int index_files(ckpt_pack *p, rd *r, char **arena, ckpt_err *err)
{
    int rc = 0;
    size_t nf = p->n_files, ne = p->n_extents;
    uint64_t next_extent = 0;
    for (size_t i = 0; i < nf; i++) {
        file_rec *f = &p->files[i];
        uint16_t plen = rd_u16(r);
        f->info.path = rd_str(r, plen, arena);
        f->info.mode = rd_u32(r);
        f->info.mtime_sec = (int64_t)rd_u64(r);
        f->info.mtime_nsec = rd_u32(r);
        f->info.size = rd_u64(r);
        const uint8_t *sha = rd_take(r, 32);
        uint64_t first = rd_u64(r);
        uint32_t n = rd_u32(r);
        uint8_t container = 0;
        f->info.note = "";
        if (p->version >= 2) {
            container = rd_u8(r);
            uint16_t nlen = rd_u16(r);
            if (!r->bad && nlen > TPACK_NOTE_MAX)
                BAD("index: file '%s' has a note of %u bytes (at most %u)", f->info.path, nlen,
                    TPACK_NOTE_MAX);
            if (!r->bad && nlen &&
                !ckpt_utf8_valid(r->p + r->pos, nlen < r->len - r->pos ? nlen : r->len - r->pos))
                BAD("index: file '%s' has a note that is not UTF-8", f->info.path);
            if (nlen)
                f->info.note = rd_str(r, nlen, arena);
        }
        if (r->bad)
            BAD("index: file record %zu is truncated", i);
        f->info.container = ckpt_container_name(container);
        if (!f->info.container)
            BAD("index: file '%s' has unknown container %u", f->info.path, container);
        memcpy(f->info.sha256, sha, 32);
        if (!ckpt_path_is_safe(f->info.path))
            BAD("index: file %zu has an unsafe path '%s'", i, f->info.path);
        if (f->info.mode & ~07777u)
            BAD("index: file '%s' has invalid mode %o", f->info.path, f->info.mode);
        if (f->info.mtime_nsec >= 1000000000u)
            BAD("index: file '%s' has invalid mtime", f->info.path);
        if (first != next_extent || n > ne - next_extent)
            BAD("index: file '%s' has extents out of range", f->info.path);
        f->first_extent = first;
        f->n_extents = n;
        next_extent += n;
        size_t dup;
        int put = strmap_put(&p->file_map, f->info.path, i, &dup);
        if (put < 0)
            return ckpt_fail(err, -ENOMEM, "out of memory");
        if (put == 1)
            BAD("index: duplicate file path '%s'", f->info.path);
    }
    if (next_extent != ne)
        BAD("index: files cover %llu of %llu extents", (unsigned long long)next_extent,
            (unsigned long long)ne);
fail:
    return rc;
}

/* Extent records, then where each lies in its file: kinds, element sizes,
 * chunks in order and covering all, and lengths summing to file sizes. */
static int index_extents(ckpt_pack *p, rd *r, ckpt_err *err)
{
    int rc = 0;
    size_t ne = p->n_extents, nc = p->n_chunks;
    uint64_t next_chunk = 0;
    for (size_t i = 0; i < ne; i++) {
        extent *e = &p->extents[i];
        e->length = rd_u64(r);
        e->first_chunk = rd_u64(r);
        e->kind = rd_u8(r);
        e->elem_size = rd_u8(r);
        rd_u16(r);
        rd_u32(r);
        if (r->bad)
            BAD("index: extent record %zu is truncated", i);
        if (e->kind > EXTENT_TYPED ||
            !(e->elem_size == 1 || e->elem_size == 2 || e->elem_size == 4 || e->elem_size == 8) ||
            (e->kind == EXTENT_DATA && e->elem_size != 1))
            BAD("index: extent %zu has an invalid kind or element size", i);
        uint64_t n = e->length / p->chunk_size + (e->length % p->chunk_size != 0);
        if (e->first_chunk != next_chunk || n > nc - next_chunk)
            BAD("index: extent %zu has chunks out of range", i);
        next_chunk += n;
    }
    if (next_chunk != nc)
        BAD("index: extents cover %llu of %llu chunks", (unsigned long long)next_chunk,
            (unsigned long long)nc);

    for (size_t i = 0; i < p->n_files; i++) {
        file_rec *f = &p->files[i];
        uint64_t off = 0;
        for (size_t j = 0; j < f->n_extents; j++) {
            extent *e = &p->extents[f->first_extent + j];
            e->file_index = i;
            e->file_offset = off;
            if (e->length > UINT64_MAX - off)
                BAD("index: file '%s' extents overflow", f->info.path);
            off += e->length;
        }
        if (off != f->info.size)
            BAD("index: file '%s' extents hold %llu bytes, not its size %llu", f->info.path,
                (unsigned long long)off, (unsigned long long)f->info.size);
        if (f->info.size > UINT64_MAX - p->logical_bytes)
            BAD("index: total size overflows");
        p->logical_bytes += f->info.size;
    }
fail:
    return rc;
}

/* The head both kinds of tensor record share: name, dtype, rank and shape
 * (what names "tensor" or "assembled tensor" in messages). A rank below
 * min_ndim or above 64 is refused; the caller checks the dtype once the
 * rest of its record is known not to be truncated. */
static int read_tensor_head(rd *r, char **arena, tensor_rec *t, const char *what, size_t i,
                            unsigned min_ndim, ckpt_err *err)
{
    int rc = 0;
    uint16_t nlen = rd_u16(r);
    t->info.name = rd_str(r, nlen, arena);
    uint8_t dlen = rd_u8(r);
    const uint8_t *d = rd_take(r, dlen);
    uint8_t ndim = rd_u8(r);
    if (r->bad)
        BAD("index: %s record %zu is truncated", what, i);
    if (nlen == 0)
        BAD("index: %s %zu has an empty name", what, i);
    if (dlen >= sizeof t->dtype || memchr(d, 0, dlen) || ndim < min_ndim || ndim > 64)
        BAD("index: %s '%s' has an invalid dtype or rank", what, t->info.name);
    memcpy(t->dtype, d, dlen);
    t->dtype[dlen] = 0;
    t->info.ndim = ndim;
    t->shape = calloc(ndim ? ndim : 1, sizeof *t->shape);
    if (!t->shape)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    for (unsigned j = 0; j < ndim; j++)
        t->shape[j] = rd_u64(r);
fail:
    return rc;
}

/* Tensor records: each owns exactly one tensor extent of its file, of the
 * size its dtype and shape need; every tensor extent has its tensor. */
static int index_tensors(ckpt_pack *p, rd *r, char **arena, ckpt_err *err)
{
    int rc = 0;
    size_t nf = p->n_files, ne = p->n_extents;
    for (size_t i = 0; i < p->n_tensors; i++) {
        tensor_rec *t = &p->tensors[i];
        if ((rc = read_tensor_head(r, arena, t, "tensor", i, 0, err)) < 0)
            goto fail;
        uint8_t ndim = (uint8_t)t->info.ndim;
        uint32_t fi = rd_u32(r);
        uint64_t ei = rd_u64(r);
        uint64_t eoff = p->version >= 2 ? rd_u64(r) : 0;
        const uint8_t *sha = rd_take(r, 32);
        if (r->bad)
            BAD("index: tensor record '%s' is truncated", t->info.name);
        uint64_t nbytes;
        if (!ckpt_dtype_valid(t->dtype))
            BAD("index: tensor '%s' has unknown dtype '%s'", t->info.name, t->dtype);
        if (ckpt_tensor_bytes(t->dtype, ndim, t->shape, &nbytes) < 0)
            BAD("index: tensor '%s' shape overflows", t->info.name);
        if (fi >= nf || ei >= ne)
            BAD("index: tensor '%s' points outside the index", t->info.name);
        extent *e = &p->extents[ei];
        if (e->kind != EXTENT_TYPED || e->file_index != fi || (p->version < 2 && e->n_tensors != 0))
            BAD("index: tensor '%s' does not own its extent", t->info.name);
        if (e->elem_size != ckpt_dtype_size(t->dtype))
            BAD("index: tensor '%s' is %s but its extent holds %u-byte elements", t->info.name,
                t->dtype, e->elem_size);
        /* Version 1: the tensor is its extent. Version 2: any range inside it. */
        if (p->version < 2 && e->length != nbytes)
            BAD("index: tensor '%s' is %llu bytes but %s%s needs %llu", t->info.name,
                (unsigned long long)e->length, t->dtype, "", (unsigned long long)nbytes);
        if (eoff > e->length || nbytes > e->length - eoff)
            BAD("index: tensor '%s' ([%llu, +%llu) of extent %llu) lies outside its extent of %llu bytes",
                t->info.name, (unsigned long long)eoff, (unsigned long long)nbytes,
                (unsigned long long)ei, (unsigned long long)e->length);
        e->n_tensors++;
        t->extent_index = ei;
        t->extent_offset = eoff;
        t->info.dtype = t->dtype;
        t->info.ndim = ndim;
        t->info.shape = t->shape;
        t->info.nbytes = nbytes;
        t->info.file_index = fi;
        t->info.file_offset = e->file_offset + eoff;
        t->info.part_of = SIZE_MAX;
        memcpy(t->info.sha256, sha, 32);
        size_t dup;
        int put = strmap_put(&p->tensor_map, t->info.name, i, &dup);
        if (put < 0)
            return ckpt_fail(err, -ENOMEM, "out of memory");
        if (put == 1)
            BAD("index: duplicate tensor name '%s'", t->info.name);
    }
    /* A version-1 typed extent is exactly one tensor's bytes; since version 2
     * a typed extent may be a region with no tensor of its own. */
    if (p->version < 2)
        for (size_t i = 0; i < ne; i++)
            if (p->extents[i].kind == EXTENT_TYPED && p->extents[i].n_tensors == 0)
                BAD("index: tensor extent %zu has no tensor", i);
    if ((rc = group_tensors_by_extent(p)) < 0)
        return ckpt_fail(err, rc, "out of memory for the index");
fail:
    return rc;
}

/* Chunk records: packed back to back from the header to the index, each of
 * the size its extent implies, with a codec that can hold it. */
static int index_chunks(ckpt_pack *p, rd *r, uint64_t index_offset, ckpt_err *err)
{
    int rc = 0;
    size_t ne = p->n_extents;
    uint64_t pos = TPACK_HEADER_SIZE;
    size_t ext = 0;
    uint32_t tag = p->keys.subkey ? TPACK_AEAD_TAG : 0;
    for (size_t i = 0; i < p->n_chunks; i++) {
        chunk *c = &p->chunks[i];
        c->offset = rd_u64(r);
        c->stored_size = rd_u32(r);
        c->raw_size = rd_u32(r);
        c->crc = rd_u32(r);
        c->codec = rd_u8(r);
        c->elem_size = rd_u8(r);
        rd_u16(r);
        if (r->bad)
            BAD("index: chunk record %zu is truncated", i);
        while (ext < ne && i >= p->extents[ext].first_chunk +
                                    (p->extents[ext].length + p->chunk_size - 1) / p->chunk_size)
            ext++;
        extent *e = &p->extents[ext];
        uint64_t k = i - e->first_chunk, start = k * p->chunk_size;
        uint64_t want = e->length - start < p->chunk_size ? e->length - start : p->chunk_size;
        c->extent_index = ext;
        if (c->offset != pos)
            BAD("index: chunk %zu is at offset %llu, expected %llu", i,
                (unsigned long long)c->offset, (unsigned long long)pos);
        if (c->raw_size != want)
            BAD("index: chunk %zu has size %u, expected %llu", i, c->raw_size,
                (unsigned long long)want);
        if (c->stored_size < tag || c->stored_size > index_offset - pos ||
            !chunk_shape_valid(c->codec, c->elem_size, c->raw_size, c->stored_size - tag))
            BAD("index: chunk %zu has an invalid codec or stored size", i);
        /* Checked for every codec: elem_size is in the chunk's associated data.
         * Since version 2 a chunk of opaque data may be byte-grouped by a
         * width of its own (its codec is then BYTEGROUP, whose shape check
         * above allows 2, 4 or 8 only). */
        int own_width = p->version >= 2 && e->kind == EXTENT_DATA && c->codec == CODEC_BYTEGROUP;
        if (!own_width && c->elem_size != e->elem_size)
            BAD("index: chunk %zu element size mismatch", i);
        pos += c->stored_size;
    }
    if (pos != index_offset)
        BAD("index: chunk data ends at %llu but the index starts at %llu", (unsigned long long)pos,
            (unsigned long long)index_offset);
fail:
    return rc;
}

/* Assembled tensors (version 5): each the concatenation along dim 0 of
 * stored tensors of its dtype and trailing shape, whose first dimensions
 * add up to its own. A part is a stored tensor (so no tensor contains
 * itself) and belongs to one assembled tensor at most. */
static int index_assembled(ckpt_pack *p, rd *r, char **arena, ckpt_err *err)
{
    int rc = 0;
    uint64_t na = rd_u32(r);
    /* The smallest record: a 1-byte name, no dtype, one dimension, one part. */
    if (r->bad || na > (r->len - r->pos) / 52)
        return ckpt_fail(err, -EIO, "index: assembled tensor count does not fit the index");
    size_t ns = p->n_stored;
    tensor_rec *grown = realloc(p->tensors, (ns + na + 1) * sizeof *grown);
    if (!grown)
        return ckpt_fail(err, -ENOMEM, "out of memory for the index");
    p->tensors = grown;
    memset(grown + ns, 0, (na + 1) * sizeof *grown);
    for (size_t i = 0; i < ns; i++)
        grown[i].info.dtype = grown[i].dtype; /* it moved */
    for (size_t k = 0; k < na; k++) {
        tensor_rec *t = &p->tensors[ns + k];
        p->n_tensors = ns + k + 1; /* so that ckpt_close frees what was read */
        if ((rc = read_tensor_head(r, arena, t, "assembled tensor", k, 1, err)) < 0)
            goto fail;
        uint8_t ndim = (uint8_t)t->info.ndim;
        if (!ckpt_dtype_valid(t->dtype))
            BAD("index: assembled tensor '%s' has unknown dtype '%s'", t->info.name, t->dtype);
        uint64_t np = rd_u32(r);
        if (r->bad || np == 0 || np > ns || np > (r->len - r->pos) / 4)
            BAD("index: assembled tensor '%s' has an invalid part count", t->info.name);
        t->parts = malloc(np * sizeof *t->parts);
        t->part_start = malloc(np * sizeof *t->part_start);
        if (!t->parts || !t->part_start)
            return ckpt_fail(err, -ENOMEM, "out of memory");
        uint64_t rows = 0, bytes = 0;
        for (size_t j = 0; j < np; j++) {
            uint32_t pi = rd_u32(r);
            if (r->bad)
                BAD("index: assembled tensor record '%s' is truncated", t->info.name);
            if (pi >= ns)
                BAD("index: assembled tensor '%s': part %zu is not a stored tensor", t->info.name,
                    j);
            tensor_rec *part = &p->tensors[pi];
            if (part->info.part_of != SIZE_MAX)
                BAD("index: assembled tensor '%s': part '%s' is already a part", t->info.name,
                    part->info.name);
            if (strcmp(part->dtype, t->dtype) != 0 || part->info.ndim != ndim ||
                memcmp(part->shape + 1, t->shape + 1, (ndim - 1) * sizeof *t->shape) != 0)
                BAD("index: assembled tensor '%s': part '%s' differs in dtype or trailing shape",
                    t->info.name, part->info.name);
            if (part->shape[0] > t->shape[0] - rows || rows > t->shape[0])
                BAD("index: assembled tensor '%s': its parts have more rows than it", t->info.name);
            rows += part->shape[0];
            part->info.part_of = ns + k;
            t->parts[j] = pi;
            t->part_start[j] = bytes;
            bytes += part->info.nbytes; /* at most its own size, checked below */
        }
        const uint8_t *sha = rd_take(r, 32);
        if (r->bad)
            BAD("index: assembled tensor record '%s' is truncated", t->info.name);
        uint64_t nbytes;
        if (rows != t->shape[0])
            BAD("index: assembled tensor '%s': its parts have %llu of its %llu rows", t->info.name,
                (unsigned long long)rows, (unsigned long long)t->shape[0]);
        if (ckpt_tensor_bytes(t->dtype, ndim, t->shape, &nbytes) < 0 || nbytes != bytes)
            BAD("index: assembled tensor '%s' shape overflows", t->info.name);
        t->info.dtype = t->dtype;
        t->info.ndim = ndim;
        t->info.shape = t->shape;
        t->info.nbytes = nbytes;
        t->info.n_parts = (size_t)np;
        t->info.parts = t->parts;
        t->info.part_of = SIZE_MAX;
        t->info.file_index = p->tensors[t->parts[0]].info.file_index;
        t->info.file_offset = p->tensors[t->parts[0]].info.file_offset;
        memcpy(t->info.sha256, sha, 32);
        size_t dup;
        int put = strmap_put(&p->tensor_map, t->info.name, ns + k, &dup);
        if (put < 0)
            return ckpt_fail(err, -ENOMEM, "out of memory");
        if (put == 1)
            BAD("index: duplicate tensor name '%s'", t->info.name);
    }
fail:
    return rc;
}

/* A file path must not also be a directory of another file ("a" and "a/b").
 * Looking up every prefix of every path would cost the square of the path
 * length; sorted with '/' first, a clash is always between neighbours. */
static int index_check_dirs(ckpt_pack *p, ckpt_err *err)
{
    int rc = 0;
    size_t nf = p->n_files;
    const char **sorted = malloc((nf ? nf : 1) * sizeof *sorted);
    if (!sorted)
        return ckpt_fail(err, -ENOMEM, "out of memory for the index");
    for (size_t i = 0; i < nf; i++)
        sorted[i] = p->files[i].info.path;
    qsort(sorted, nf, sizeof *sorted, cmp_path_slash_first);
    for (size_t i = 0; i + 1 < nf && rc == 0; i++) {
        size_t n = strlen(sorted[i]);
        if (strncmp(sorted[i], sorted[i + 1], n) == 0 && sorted[i + 1][n] == '/')
            rc = ckpt_fail(err, -EIO, "index: '%s' is both a file and a directory", sorted[i]);
    }
    free(sorted);
    return rc;
}

/* Skipped-tensor records (version 4): a name, the file it is in and why it
 * is not under tensors/. Names need not be unique (two files may skip the
 * same name); reasons are UTF-8 notes. */
static int index_skipped(ckpt_pack *p, rd *r, char **arena, ckpt_err *err)
{
    int rc = 0;
    for (size_t i = 0; i < p->n_skipped; i++) {
        ckpt_skipped_info *s = &p->skipped[i];
        uint32_t file = rd_u32(r);
        uint16_t nlen = rd_u16(r);
        if (!r->bad && nlen == 0)
            BAD("index: skipped tensor %zu has an empty name", i);
        s->name = rd_str(r, nlen, arena);
        uint16_t rlen = rd_u16(r);
        if (!r->bad && rlen > TPACK_NOTE_MAX)
            BAD("index: skipped tensor %zu has a reason of %u bytes (at most %u)", i, rlen,
                TPACK_NOTE_MAX);
        if (!r->bad &&
            !ckpt_utf8_valid(r->p + r->pos, rlen < r->len - r->pos ? rlen : r->len - r->pos))
            BAD("index: skipped tensor %zu has a reason that is not UTF-8", i);
        s->reason = rd_str(r, rlen, arena);
        if (r->bad)
            BAD("index: skipped tensor record %zu is truncated", i);
        if (file >= p->n_files)
            BAD("index: skipped tensor '%s' names file %u of %zu", s->name, file, p->n_files);
        s->file_index = file;
    }
fail:
    return rc;
}

/* The plaintext index, section by section in its on-disk order (FORMAT.md):
 * counts, files, extents, tensors, chunks, skipped tensors, assembled tensors. Each section is checked against
 * those before it, so nothing read later can point outside what exists. */
static int parse_index(ckpt_pack *p, const uint8_t *idx, size_t len, uint64_t index_offset,
                       ckpt_err *err)
{
    rd r = {idx, len, 0, 0};
    int rc = index_counts(p, &r, len, err);
    char *arena = (char *)p->index;
    if (rc == 0)
        rc = index_files(p, &r, &arena, err);
    if (rc == 0)
        rc = index_extents(p, &r, err);
    if (rc == 0)
        rc = index_tensors(p, &r, &arena, err);
    if (rc == 0)
        rc = index_chunks(p, &r, index_offset, err);
    if (rc == 0)
        rc = index_skipped(p, &r, &arena, err);
    if (rc == 0 && p->version >= 5)
        rc = index_assembled(p, &r, &arena, err);
    if (rc == 0 && r.pos != r.len)
        rc = ckpt_fail(err, -EIO, "index: %zu unexpected bytes at its end", r.len - r.pos);
    if (rc == 0)
        rc = index_check_dirs(p, err);
    return rc;
}

static int read_header(store_reader *obj, uint8_t hdr[128], ckpt_err *err)
{
    const char *path = obj->name;
    uint64_t size = obj->id.size;
    if (size < TPACK_HEADER_SIZE + TPACK_FOOTER_SIZE)
        return ckpt_fail(err, -EIO, "%s: truncated: %llu bytes is less than a header and footer",
                         path, (unsigned long long)size);
    ckpt_err why;
    int rc = read_exact(obj, hdr, TPACK_HEADER_SIZE, 0, &why);
    if (rc < 0)
        return read_failed(
            err, ckpt_fail(err, rc, "%s: cannot read header: %s", path, read_why(rc, &why)), &why);
    if (memcmp(hdr + HDR_MAGIC, TPACK_MAGIC, 8) != 0)
        return ckpt_fail(err, -EINVAL, "%s: not a tpack file (bad magic)", path);
    uint32_t version = get_u32(hdr + HDR_VERSION);
    if (version < 1 || version > CKPT_FORMAT_VERSION)
        return ckpt_fail(err, -ENOTSUP,
                         "%s: unsupported format version %u (this build reads versions 1 to %d)",
                         path, version, CKPT_FORMAT_VERSION);
    if (!FUZZING_SKIPS_CHECKSUMS && get_u32(hdr + HDR_CRC) != (uint32_t)crc32(0, hdr, HDR_CRC))
        return ckpt_fail(err, -EIO, "%s: header checksum mismatch (corrupt header)", path);
    if (get_u32(hdr + HDR_SIZE) != TPACK_HEADER_SIZE)
        return ckpt_fail(err, -EIO, "%s: bad header size", path);
    uint32_t flags = get_u32(hdr + HDR_FLAGS), cipher = get_u32(hdr + HDR_CIPHER),
             kdf = get_u32(hdr + HDR_KDF);
    uint32_t cs = get_u32(hdr + HDR_CHUNK_SIZE);
    if (flags & ~TPACK_FLAG_ENCRYPTED)
        return ckpt_fail(err, -ENOTSUP, "%s: unknown header flags %#x", path, flags);
    int enc = flags & TPACK_FLAG_ENCRYPTED;
    if (cipher > CKPT_CIPHER_AES256GCM || kdf > TPACK_KDF_ARGON2ID || (enc != 0) != (cipher != 0) ||
        (enc != 0) != (kdf != 0))
        return ckpt_fail(err, -ENOTSUP, "%s: unknown cipher %u or key derivation %u", path, cipher,
                         kdf);
    if (cs < CKPT_CHUNK_MIN || cs > CKPT_CHUNK_MAX || (cs & (cs - 1)))
        return ckpt_fail(err, -EIO, "%s: invalid chunk size %u", path, cs);
    if (kdf == TPACK_KDF_ARGON2ID) {
        uint64_t ops = get_u64(hdr + HDR_KDF_OPS), mem = get_u64(hdr + HDR_KDF_MEM);
        if (ops < crypto_pwhash_OPSLIMIT_MIN || ops > TPACK_KDF_OPS_MAX ||
            mem < crypto_pwhash_MEMLIMIT_MIN || mem > TPACK_KDF_MEM_MAX)
            return ckpt_fail(err, -EIO, "%s: passphrase limits out of range (ops %llu, mem %llu)",
                             path, (unsigned long long)ops, (unsigned long long)mem);
    }
    return 0;
}

static void fill_info_from_header(const uint8_t *hdr, uint64_t size, ckpt_pack_info *info)
{
    static const char *kdfs[] = {"none", "keyfile", "argon2id"};
    memset(info, 0, sizeof *info);
    info->format_version = get_u32(hdr + HDR_VERSION);
    info->chunk_size = get_u32(hdr + HDR_CHUNK_SIZE);
    info->cipher = ckpt_cipher_name((ckpt_cipher)get_u32(hdr + HDR_CIPHER));
    info->kdf = kdfs[get_u32(hdr + HDR_KDF)];
    memcpy(info->pack_id, hdr + HDR_PACK_ID, 16);
    info->stored_bytes = size;
}

static int probe_object(store_reader *obj, ckpt_pack_info *info, ckpt_err *err)
{
    uint8_t hdr[TPACK_HEADER_SIZE];
    int rc = read_header(obj, hdr, err);
    if (rc == 0)
        fill_info_from_header(hdr, obj->id.size, info);
    obj->ops->close(obj);
    return rc;
}

int ckpt_probe(const char *path, ckpt_pack_info *info, ckpt_err *err)
{
    store_reader *obj;
    int rc = store_local_open_path(path, &obj, err);
    return rc < 0 ? rc : probe_object(obj, info, err);
}

int ckpt_probe_in(ckpt_store *s, const char *name, ckpt_pack_info *info, ckpt_err *err)
{
    if (!name || !ckpt_path_is_safe(name))
        return ckpt_fail(err, -EINVAL, "%s: invalid pack name '%s'", ckpt_store_where(s),
                         name ? name : "(null)");
    store_reader *obj;
    int rc = s->ops->open_read(s, name, &obj, err);
    return rc < 0 ? rc : probe_object(obj, info, err);
}

static int unlock_keys(ckpt_pack *p, const ckpt_key *key, ckpt_err *err)
{
    const uint8_t *h = p->header;
    ckpt_cipher cipher = (ckpt_cipher)get_u32(h + HDR_CIPHER);
    if (!key)
        return ckpt_fail(
            err, -EACCES,
            "%s: no key: the pack is encrypted with %s; give a key file or passphrase file",
            p->path, ckpt_cipher_name(cipher));
    if (!ckpt_cipher_available(cipher))
        return ckpt_fail(err, -ENOTSUP, "%s: cipher %s is not available on this CPU", p->path,
                         ckpt_cipher_name(cipher));
    kdf_params kp;
    memset(&kp, 0, sizeof kp);
    kp.kdf = p->kdf;
    kp.ops = get_u64(h + HDR_KDF_OPS);
    kp.mem = get_u64(h + HDR_KDF_MEM);
    memcpy(kp.salt, h + HDR_KDF_SALT, 16);
    uint8_t *master = sodium_malloc(CKPT_KEY_BYTES);
    if (!master)
        return ckpt_fail(err, -ENOMEM, "%s: out of locked memory", p->path);
    int rc = key_master(key, &kp, master, err);
    if (rc < 0) {
        sodium_free(master);
        return ckpt_fail_prefix(err, p->path);
    }
    uint8_t check[16];
    key_check_value(master, p->pack_id, check);
    if (sodium_memcmp(check, h + HDR_KEY_CHECK, 16) != 0) {
        sodium_free(master);
        return ckpt_fail(err, -EACCES, "%s: wrong key: this key does not open the pack", p->path);
    }
    rc = pack_keys_derive(&p->keys, cipher, master, p->pack_id);
    sodium_free(master);
    return rc < 0 ? ckpt_fail(err, rc, "%s: out of locked memory", p->path) : 0;
}

static int load_index(ckpt_pack *p, ckpt_err *err)
{
    uint8_t ftr[TPACK_FOOTER_SIZE];
    ckpt_err why;
    int rc = read_exact(p->obj, ftr, sizeof ftr, p->file_size - TPACK_FOOTER_SIZE, &why);
    if (rc < 0)
        return read_failed(
            err, ckpt_fail(err, rc, "%s: cannot read footer: %s", p->path, read_why(rc, &why)),
            &why);
    if (memcmp(ftr + FTR_MAGIC, TPACK_END_MAGIC, 8) != 0)
        return ckpt_fail(err, -EIO, "%s: truncated or unfinished pack (no footer)", p->path);
    uint64_t ioff = get_u64(ftr + FTR_INDEX_OFFSET), istored = get_u64(ftr + FTR_INDEX_STORED);
    uint64_t iraw = get_u64(ftr + FTR_INDEX_RAW);
    uint64_t tag = p->keys.subkey ? TPACK_AEAD_TAG : 0;
    /* read_header() made sure file_size holds a header and a footer, and the
     * subtraction below must not wrap: an offset matching the wrap would
     * pass the sum check too. */
    if (ioff < TPACK_HEADER_SIZE || istored > p->file_size - TPACK_FOOTER_SIZE ||
        ioff > p->file_size - TPACK_FOOTER_SIZE - istored ||
        ioff + istored + TPACK_FOOTER_SIZE != p->file_size || iraw > TPACK_INDEX_MAX ||
        istored != iraw + tag || iraw < 32)
        return ckpt_fail(err, -EIO,
                         "%s: footer points outside the file (index at %llu, %llu bytes)", p->path,
                         (unsigned long long)ioff, (unsigned long long)istored);
    /* Encrypted: the tag authenticates the index and header, and the digest
     * is all zero (FORMAT.md); anything else there is damage no other check
     * would see. */
    static const uint8_t zero[32];
    if (p->keys.subkey && !FUZZING_SKIPS_CHECKSUMS && memcmp(ftr + FTR_DIGEST, zero, 32) != 0)
        return ckpt_fail(err, -EIO,
                         "%s: damaged footer: the index digest of an encrypted pack is not zero",
                         p->path);
    uint8_t *stored = malloc(istored);
    uint8_t *plain = p->keys.subkey ? malloc(iraw) : stored;
    if (!stored || !plain) {
        free(stored);
        if (plain != stored)
            free(plain);
        return ckpt_fail(err, -ENOMEM, "%s: out of memory for the index", p->path);
    }
    rc = read_exact(p->obj, stored, istored, ioff, &why);
    if (rc < 0) {
        int code = rc;
        rc = ckpt_fail(err, rc == -ESTALE || rc == -ENOMEM ? rc : -EIO, "%s: cannot read index: %s",
                       p->path, read_why(rc, &why));
        read_failed(err, code, &why);
    } else if (p->keys.subkey) {
        if (aead_open(&p->keys, TPACK_INDEX_NONCE_ID, p->header, TPACK_HEADER_SIZE, stored, istored,
                      plain) < 0)
            rc = ckpt_fail(err, -EIO,
                           "%s: index or header failed authentication (corrupt or tampered)",
                           p->path);
    } else {
        crypto_hash_sha256_state st;
        uint8_t digest[32];
        crypto_hash_sha256_init(&st);
        crypto_hash_sha256_update(&st, p->header, TPACK_HEADER_SIZE);
        crypto_hash_sha256_update(&st, plain, iraw);
        crypto_hash_sha256_final(&st, digest);
        if (!FUZZING_SKIPS_CHECKSUMS && memcmp(digest, ftr + FTR_DIGEST, 32) != 0)
            rc = ckpt_fail(err, -EIO, "%s: index checksum mismatch (corrupt index or header)",
                           p->path);
    }
    if (rc == 0) {
        rc = parse_index(p, plain, iraw, ioff, err);
        if (rc < 0)
            ckpt_fail_prefix(err, p->path);
    }
    if (plain != stored)
        free(plain);
    free(stored);
    return rc;
}

/* Opens the pack whose bytes obj holds; takes obj, even on failure. */
static int open_object(store_reader *obj, const ckpt_key *key, ckpt_pack **out, ckpt_err *err)
{
    ckpt_pack *p = calloc(1, sizeof *p);
    if (!p || !(p->path = strdup(obj->name))) {
        int rc = ckpt_fail(err, -ENOMEM, "%s: out of memory", obj->name);
        free(p);
        obj->ops->close(obj);
        return rc;
    }
    p->obj = obj;
    p->fd = obj->ops->fd(obj);
    p->file_size = obj->id.size;
    int rc = read_header(obj, p->header, err);
    if (rc == 0) {
        memcpy(p->pack_id, p->header + HDR_PACK_ID, 16);
        p->chunk_size = get_u32(p->header + HDR_CHUNK_SIZE);
        p->kdf = get_u32(p->header + HDR_KDF);
        p->version = get_u32(p->header + HDR_VERSION);
        if (get_u32(p->header + HDR_FLAGS) & TPACK_FLAG_ENCRYPTED)
            rc = unlock_keys(p, key, err);
    }
    if (rc == 0)
        rc = load_index(p, err);
    if (rc < 0) {
        ckpt_close(p);
        return rc;
    }
    *out = p;
    return 0;
}

int ckpt_open(const char *path, const ckpt_key *key, ckpt_pack **out, ckpt_err *err)
{
    *out = NULL;
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "%s: libsodium failed to initialise", path);
    store_reader *obj;
    int rc = store_local_open_path(path, &obj, err);
    return rc < 0 ? rc : open_object(obj, key, out, err);
}

int ckpt_pack_open_in(ckpt_store *s, const char *name, const ckpt_key *key, ckpt_pack **out,
                      ckpt_err *err)
{
    *out = NULL;
    if (!name || !ckpt_path_is_safe(name))
        return ckpt_fail(err, -EINVAL, "%s: invalid pack name '%s'", ckpt_store_where(s),
                         name ? name : "(null)");
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "%s/%s: libsodium failed to initialise", ckpt_store_where(s),
                         name);
    store_reader *obj;
    int rc = s->ops->open_read(s, name, &obj, err);
    return rc < 0 ? rc : open_object(obj, key, out, err);
}

void ckpt_pack_object_id(const ckpt_pack *p, ckpt_object_id *out)
{
    *out = p->obj->id;
}

void ckpt_close(ckpt_pack *p)
{
    if (!p)
        return;
    if (p->obj)
        p->obj->ops->close(p->obj);
    pack_keys_free(&p->keys);
    if (p->tensors)
        for (size_t i = 0; i < p->n_tensors; i++) {
            free(p->tensors[i].shape);
            free(p->tensors[i].parts);
            free(p->tensors[i].part_start);
        }
    free(p->files);
    free(p->skipped);
    free(p->tensors);
    free(p->extents);
    free(p->chunks);
    free(p->ext_tensors);
    free(p->index);
    strmap_free(&p->file_map);
    strmap_free(&p->tensor_map);
    free(p->path);
    free(p);
}

void ckpt_info(const ckpt_pack *p, ckpt_pack_info *info)
{
    fill_info_from_header(p->header, p->file_size, info);
    info->logical_bytes = p->logical_bytes;
    info->n_files = p->n_files;
    info->n_tensors = p->n_tensors;
    info->n_chunks = p->n_chunks;
}

const char *ckpt_path(const ckpt_pack *p)
{
    return p->path;
}
int ckpt_fd(const ckpt_pack *p)
{
    return p->fd;
}
size_t ckpt_file_count(const ckpt_pack *p)
{
    return p->n_files;
}
size_t ckpt_tensor_count(const ckpt_pack *p)
{
    return p->n_tensors;
}
size_t ckpt_skipped_count(const ckpt_pack *p)
{
    return p->n_skipped;
}
const ckpt_skipped_info *ckpt_skipped_at(const ckpt_pack *p, size_t i)
{
    return i < p->n_skipped ? &p->skipped[i] : NULL;
}

const ckpt_file_info *ckpt_file_at(const ckpt_pack *p, size_t i)
{
    return i < p->n_files ? &p->files[i].info : NULL;
}
const ckpt_tensor_info *ckpt_tensor_at(const ckpt_pack *p, size_t i)
{
    return i < p->n_tensors ? &p->tensors[i].info : NULL;
}
long ckpt_file_find(const ckpt_pack *p, const char *path)
{
    return strmap_get(&p->file_map, path);
}
size_t ckpt_assembled_count(const ckpt_pack *p)
{
    return p->n_tensors - p->n_stored;
}
long ckpt_tensor_find(const ckpt_pack *p, const char *name)
{
    return strmap_get(&p->tensor_map, name);
}

void pack_chunk_where(const ckpt_pack *p, size_t id, char *buf, size_t len)
{
    const chunk *c = &p->chunks[id];
    const extent *e = &p->extents[c->extent_index];
    uint64_t off = e->file_offset + (id - e->first_chunk) * (uint64_t)p->chunk_size;
    const char *path = p->files[e->file_index].info.path;
    /* Name the first tensor whose bytes the chunk holds, if any. */
    const tensor_rec *hit = NULL;
    uint64_t a = off - e->file_offset, b = a + c->raw_size;
    for (size_t i = 0; i < e->n_tensors && !hit; i++) {
        const tensor_rec *t = &p->tensors[p->ext_tensors[e->first_tensor + i]];
        if (t->extent_offset >= b)
            break;
        if (t->extent_offset + t->info.nbytes > a)
            hit = t;
    }
    if (hit)
        snprintf(buf, len, "chunk %zu (file '%s' at offset %llu, tensor '%s')", id, path,
                 (unsigned long long)off, hit->info.name);
    else
        snprintf(buf, len, "chunk %zu (file '%s' at offset %llu)", id, path,
                 (unsigned long long)off);
}

static int chunk_fault(ckpt_pack *p, size_t id, const char *why, ckpt_err *err)
{
    char where[300];
    pack_chunk_where(p, id, where, sizeof where);
    return ckpt_fail(err, -EIO, "%s: %s: %s", p->path, where, why);
}

/* A chunk that could not be read: -EIO naming the chunk, except a pack
 * replaced under its reader, which stays -ESTALE. */
static int chunk_read_fault(ckpt_pack *p, size_t id, int rc, const ckpt_err *why, ckpt_err *err)
{
    if (rc == -ENODATA)
        return chunk_fault(p, id, "pack file is shorter than its index says", err);
    int r = chunk_fault(p, id, read_why(rc, why), err);
    if (rc == -ESTALE && err)
        err->code = -ESTALE;
    read_failed(err, rc, why);
    return rc == -ESTALE ? rc : r;
}

/* Decodes chunk id from its stored bytes (src, already read) into out. */
static int decode_stored(ckpt_pack *p, size_t id, const uint8_t *src, uint8_t *out, ckpt_err *err)
{
    const chunk *c = &p->chunks[id];
    int enc = p->keys.subkey != NULL;
    if (c->codec == CODEC_STORED && !enc) {
        if (src != out)
            memcpy(out, src, c->raw_size);
        if (!FUZZING_SKIPS_CHECKSUMS && (uint32_t)libdeflate_crc32(0, out, c->raw_size) != c->crc)
            return chunk_fault(p, id, "checksum mismatch", err);
        return 0;
    }
    uint8_t *scratch = c->codec == CODEC_BYTEGROUP
                           ? chunk_decode_buf(DECODE_BUF_SCRATCH, c->raw_size ? c->raw_size : 1)
                           : NULL;
    if (c->codec == CODEC_BYTEGROUP && !scratch)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    size_t plen = c->stored_size;
    if (enc) {
        const extent *e = &p->extents[c->extent_index];
        uint8_t ad[CHUNK_AD_BYTES];
        chunk_ad(ad, p->pack_id, id, c->extent_index, id - e->first_chunk, c->raw_size, c->codec,
                 c->elem_size);
        plen = c->stored_size - TPACK_AEAD_TAG;
        /* Stored chunks decrypt straight into the caller's buffer. */
        uint8_t *payload =
            c->codec == CODEC_STORED ? out : chunk_decode_buf(DECODE_BUF_PLAIN, plen ? plen : 1);
        if (!payload)
            return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
        if (aead_open(&p->keys, id, ad, sizeof ad, src, c->stored_size, payload) < 0)
            return chunk_fault(p, id, "authentication failed", err);
        src = payload;
    }
    const char *why = NULL;
    if (chunk_decode(src, plen, c->codec, c->elem_size, p->version, out, c->raw_size, scratch,
                     &why) < 0)
        return chunk_fault(p, id, why, err);
    if (!FUZZING_SKIPS_CHECKSUMS && !enc &&
        (uint32_t)libdeflate_crc32(0, out, c->raw_size) != c->crc)
        return chunk_fault(p, id, "checksum mismatch", err);
    return 0;
}

int pack_chunk_decode(ckpt_pack *p, size_t id, uint8_t *out, ckpt_err *err)
{
    const chunk *c = &p->chunks[id];
    ckpt_err why;
    if (c->codec == CODEC_STORED && !p->keys.subkey) {
        int rc = read_exact(p->obj, out, c->raw_size, c->offset, &why);
        return rc < 0 ? chunk_read_fault(p, id, rc, &why, err)
                      : decode_stored(p, id, out, out, err);
    }
    uint8_t *stored = chunk_decode_buf(DECODE_BUF_STORED, c->stored_size ? c->stored_size : 1);
    if (!stored)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    const void *in;
    void *hold;
    int rc = borrow_exact(p->obj, stored, c->stored_size, c->offset, &in, &hold, &why);
    /* A short answer may come with a loan all the same. */
    rc = rc < 0 ? chunk_read_fault(p, id, rc, &why, err) : decode_stored(p, id, in, out, err);
    if (hold)
        p->obj->ops->release(p->obj, hold);
    return rc;
}

/* A FUSE read spans at most 1 MiB, 2 or 3 chunks; a run this long is
 * several reads' worth. */
#define CHUNK_RUN_MAX 64

ssize_t ckpt_chunks_fetch(ckpt_pack *p, size_t first, size_t n, void **stored, ckpt_err *err)
{
    *stored = NULL;
    if (first >= p->n_chunks || n == 0)
        return ckpt_fail(err, -EINVAL, "%s: no chunk %zu", p->path, first);
    if (n > p->n_chunks - first)
        n = p->n_chunks - first;
    if (n > CHUNK_RUN_MAX)
        n = CHUNK_RUN_MAX;
    const chunk *c = &p->chunks[first];
    /* Chunks are written back to back, but an index may say otherwise. */
    size_t lens[CHUNK_RUN_MAX] = {c->stored_size}, count = 1, len = c->stored_size;
    while (count < n && c[count].offset == c[count - 1].offset + c[count - 1].stored_size &&
           len <= SIZE_MAX - c[count].stored_size) {
        lens[count] = c[count].stored_size;
        len += lens[count++];
    }
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
    ckpt_err why = {0};
    ssize_t r;
    if (p->obj->ops->read_run) {
        r = p->obj->ops->read_run(p->obj, buf, c->offset, lens, count, &why);
    } else {
        r = p->obj->ops->read_at(p->obj, buf, len, c->offset, &why);
        r = r < 0 ? r : (size_t)r < len ? -ENODATA : 0;
    }
    if (r < 0) {
        free(buf);
        if (r == -EAGAIN)
            return ckpt_fail(err, -EAGAIN, "%s: chunks %zu-%zu are better read one by one", p->path,
                             first, first + count - 1);
        return chunk_read_fault(p, first, (int)r, &why, err);
    }
    *stored = buf;
    return (ssize_t)count;
}

int ckpt_chunk_decode_stored(ckpt_pack *p, size_t first, const void *stored, size_t id, void *out,
                             ckpt_err *err)
{
    if (id >= p->n_chunks || id < first)
        return ckpt_fail(err, -EINVAL, "%s: no chunk %zu in the run from %zu", p->path, id, first);
    const uint8_t *src = (const uint8_t *)stored + (p->chunks[id].offset - p->chunks[first].offset);
    return decode_stored(p, id, src, out, err);
}

int ckpt_chunk_decode(ckpt_pack *p, size_t id, void *out, ckpt_err *err)
{
    if (id >= p->n_chunks)
        return ckpt_fail(err, -EINVAL, "%s: no chunk %zu", p->path, id);
    return pack_chunk_decode(p, id, out, err);
}

int ckpt_chunk_plain_at(const ckpt_pack *p, size_t id, uint64_t *pack_offset)
{
    if (id >= p->n_chunks || p->keys.subkey || p->chunks[id].codec != CODEC_STORED)
        return 0;
    *pack_offset = p->chunks[id].offset;
    return 1;
}

int ckpt_chunk_locate(const ckpt_pack *p, size_t file_index, uint64_t off, ckpt_chunk_ref *out,
                      ckpt_err *err)
{
    if (file_index >= p->n_files)
        return ckpt_fail(err, -ENOENT, "%s: no file %zu", p->path, file_index);
    const file_rec *f = &p->files[file_index];
    if (off >= f->info.size)
        return ckpt_fail(err, -EINVAL, "%s: offset %llu is past the end of '%s'", p->path,
                         (unsigned long long)off, f->info.path);
    /* First extent whose end lies beyond off; empty extents end where they start, so they are skipped. */
    size_t lo = f->first_extent, hi = f->first_extent + f->n_extents;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const extent *e = &p->extents[mid];
        if (e->file_offset + e->length <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    const extent *e = &p->extents[lo];
    uint64_t k = (off - e->file_offset) / p->chunk_size;
    out->id = e->first_chunk + k;
    out->file_offset = e->file_offset + k * p->chunk_size;
    out->size = p->chunks[out->id].raw_size;
    return 0;
}

ssize_t ckpt_file_pread(ckpt_pack *p, size_t file_index, void *buf, size_t len, uint64_t off,
                        ckpt_err *err)
{
    if (file_index >= p->n_files)
        return ckpt_fail(err, -ENOENT, "%s: no file %zu", p->path, file_index);
    uint64_t size = p->files[file_index].info.size;
    if (off >= size || len == 0)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    if (len > SSIZE_MAX)
        len = SSIZE_MAX;
    uint8_t *dst = buf, *tmp = NULL;
    size_t done = 0;
    while (done < len) {
        ckpt_chunk_ref ref;
        int rc = ckpt_chunk_locate(p, file_index, off + done, &ref, err);
        if (rc < 0) {
            free(tmp);
            return rc;
        }
        uint64_t skip = off + done - ref.file_offset;
        size_t n = ref.size - skip < len - done ? (size_t)(ref.size - skip) : len - done;
        if (skip == 0 && n == ref.size) {
            rc = pack_chunk_decode(p, ref.id, dst + done, err);
        } else {
            if (!tmp && !(tmp = malloc(p->chunk_size)))
                return ckpt_fail(err, -ENOMEM, "%s: out of memory", p->path);
            rc = pack_chunk_decode(p, ref.id, tmp, err);
            if (rc == 0)
                memcpy(dst + done, tmp + skip, n);
        }
        if (rc < 0) {
            free(tmp);
            return rc;
        }
        done += n;
    }
    free(tmp);
    return (ssize_t)done;
}

int ckpt_tensor_locate(const ckpt_pack *p, size_t i, uint64_t off, size_t *file_index,
                       uint64_t *file_offset, uint64_t *run, ckpt_err *err)
{
    if (i >= p->n_tensors)
        return ckpt_fail(err, -ENOENT, "%s: no tensor %zu", p->path, i);
    const tensor_rec *t = &p->tensors[i];
    if (off >= t->info.nbytes)
        return ckpt_fail(err, -EINVAL, "%s: offset %llu is past the end of tensor '%s'", p->path,
                         (unsigned long long)off, t->info.name);
    if (t->info.n_parts) {
        /* The last part starting at or before off; parts of no bytes start
         * where the next one does, so the search passes over them. */
        size_t lo = 0, hi = t->info.n_parts;
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (t->part_start[mid] <= off)
                lo = mid;
            else
                hi = mid;
        }
        t = &p->tensors[t->parts[lo]];
        off -= p->tensors[i].part_start[lo];
    }
    *file_index = t->info.file_index;
    *file_offset = t->info.file_offset + off;
    *run = t->info.nbytes - off;
    return 0;
}

ssize_t ckpt_tensor_pread(ckpt_pack *p, size_t tensor_index, void *buf, size_t len, uint64_t off,
                          ckpt_err *err)
{
    if (tensor_index >= p->n_tensors)
        return ckpt_fail(err, -ENOENT, "%s: no tensor %zu", p->path, tensor_index);
    const ckpt_tensor_info *t = &p->tensors[tensor_index].info;
    if (off >= t->nbytes || len == 0)
        return 0;
    if (len > t->nbytes - off)
        len = (size_t)(t->nbytes - off);
    if (len > SSIZE_MAX)
        len = SSIZE_MAX;
    size_t done = 0;
    while (done < len) {
        size_t fi;
        uint64_t foff, run;
        int rc = ckpt_tensor_locate(p, tensor_index, off + done, &fi, &foff, &run, err);
        if (rc < 0)
            return rc;
        size_t n = run < len - done ? (size_t)run : len - done;
        ssize_t got = ckpt_file_pread(p, fi, (uint8_t *)buf + done, n, foff, err);
        if (got < 0)
            return got;
        if ((size_t)got != n)
            return ckpt_fail(err, -EIO, "%s: tensor '%s' ends early", p->path, t->name);
        done += n;
    }
    return (ssize_t)done;
}
