/* Adding files and trees from disk: a file that a container format claims
 * (formats/) is described by its parser and written as regions, tensors and
 * opaque gaps; a file the parser rejects, and everything else, is stored as
 * opaque bytes. */
#include "formats/formats.h"
#include "lanes_ahead.h"
#include "writer.h"
#include "format.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a format's sniff() is shown: the first page of the file. */
#define SNIFF_HEAD 4096

/* Where a file's bytes come from: a descriptor (add_path) or the caller's
 * callback (add_reader). Everything below reads through this. */
typedef struct source {
    ckpt_read_fn read;
    void *ud;
    const char *name; /* for error messages */
    /* Where sibling files (DCP's .metadata beside a *.distcp) come from:
     * beside disk_path (add_path), or the writer's sibling reader by pack
     * path (add_reader); neither: none. */
    const char *disk_path;
    ckpt_writer *w;
    const char *pack_path;
    int shared;             /* read answers until the writer is done (add_reader_shared) */
    struct hash_job *early; /* its hash lane's job, queued before (writer_prehash) */
} source;

/* ---- sibling files (formats.h: ingest_source.read_sibling) ---- */

/* The whole of the regular file dir(path)/name, at most max bytes. */
static int read_disk_sibling(const char *path, const char *name, uint8_t **out, size_t *len,
                             size_t max)
{
    const char *slash = strrchr(path, '/');
    char *full;
    if (asprintf(&full, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, name) < 0)
        return -ENOMEM;
    struct stat st;
    int fd = ckpt_open_regular(full, O_NOFOLLOW, &st); /* a planted FIFO must not block */
    free(full);
    if (fd < 0)
        return fd;
    int rc = 0;
    uint8_t *buf = NULL;
    if ((uint64_t)st.st_size > max)
        rc = -EFBIG;
    else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
        rc = -ENOMEM;
    if (rc == 0) {
        ssize_t r = ckpt_pread_full(fd, buf, (size_t)st.st_size, 0);
        if (r < 0)
            rc = (int)r;
        else if ((size_t)r != (size_t)st.st_size)
            rc = -EIO;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = (size_t)st.st_size;
    return 0;
}

static int source_read_sibling(void *ud, const char *name, uint8_t **out, size_t *len, size_t max)
{
    const source *src = ud;
    *out = NULL;
    *len = 0;
    if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
        return -EINVAL;
    if (src->disk_path)
        return read_disk_sibling(src->disk_path, name, out, len, max);
    ckpt_sibling_fn fn;
    void *fn_ud;
    writer_sibling_reader(src->w, &fn, &fn_ud);
    const char *slash = strrchr(src->pack_path, '/');
    char *full;
    if (asprintf(&full, "%.*s%s", slash ? (int)(slash - src->pack_path + 1) : 0, src->pack_path,
                 name) < 0)
        return -ENOMEM;
    int rc = fn(fn_ud, full, out, len, max);
    free(full);
    if (rc == 0 && *len > max) {
        free(*out);
        *out = NULL;
        *len = 0;
        rc = -EFBIG;
    }
    return rc > 0 ? -EIO : rc;
}

static int source_has_siblings(const source *src)
{
    ckpt_sibling_fn fn = NULL;
    void *fn_ud;
    if (src->disk_path)
        return 1;
    if (src->w && src->pack_path)
        writer_sibling_reader(src->w, &fn, &fn_ud);
    return fn != NULL;
}

static ssize_t fd_read(void *ud, void *buf, size_t len, uint64_t off)
{
    return ckpt_pread_full(*(const int *)ud, buf, len, off);
}

static int read_at(const source *src, uint8_t *buf, size_t len, uint64_t off, ckpt_err *err)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = src->read(src->ud, buf + done, len - done, off + done);
        if (r < 0)
            return ckpt_fail(err, (int)r, "%s: read failed: %s", src->name, strerror((int)-r));
        if (r == 0)
            return ckpt_fail(err, -EIO, "%s: file shrank while being packed", src->name);
        done += (size_t)r;
    }
    return 0;
}

/* A source whose read failures are remembered, so that a parser's error
 * caused by the source (an I/O error, a file that shrank) fails the add as
 * before, while a fault in the file's contents only makes it opaque. */
typedef struct watched {
    const source *src;
    uint64_t size;
    int read_err;
} watched;

static ssize_t watched_read(void *ud, void *buf, size_t len, uint64_t off)
{
    watched *wt = ud;
    ssize_t r = wt->src->read(wt->src->ud, buf, len, off);
    if (r < 0)
        wt->read_err = (int)r;
    else if (r == 0 && len && off < wt->size)
        wt->read_err = -EIO;
    return r;
}

/* What describe_file() found. */
typedef struct described {
    const container_format *fmt; /* NULL: no format claims the file */
    int structured;              /* lay holds tensors and regions to index */
    char fault[400];             /* non-empty: the format rejected the file */
} described;

/* Asks the container format that claims the file for its layout. A fault
 * in the file's contents is not an error: d->fault says why it is to be
 * stored opaque. Only a failure to read the source is (-errno). */
static int describe_file(const source *src, const char *pack_path, uint64_t size,
                         ingest_layout *lay, described *d, ckpt_err *err)
{
    memset(d, 0, sizeof *d);
    uint8_t head[SNIFF_HEAD];
    size_t have = size < sizeof head ? (size_t)size : sizeof head;
    int rc = read_at(src, head, have, 0, err);
    if (rc < 0)
        return rc;
    d->fmt = ckpt_container_sniff(pack_path, head, have, size);
    if (!d->fmt)
        return 0;
    watched wt = {src, size, 0};
    ingest_source isrc = {.read = watched_read, .ud = &wt, .size = size, .name = src->name};
    if (source_has_siblings(src)) {
        isrc.read_sibling = source_read_sibling;
        isrc.sibling_ud = (void *)src;
    }
    char msg[sizeof d->fault] = "";
    rc = d->fmt->describe(&isrc, pack_path, lay, msg, sizeof msg);
    if (rc < 0 && wt.read_err < 0)
        return ckpt_fail(err, wt.read_err, "%s: %s", src->name,
                         msg[0] ? msg : strerror(-wt.read_err));
    if (rc < 0) {
        ingest_layout_free(lay);
        snprintf(d->fault, sizeof d->fault, "%s", msg[0] ? msg : strerror(-rc));
    }
    d->structured = rc == 0;
    return 0;
}

static int fill_from_source(void *ud, uint8_t *dst, size_t n, uint64_t off, ckpt_err *err)
{
    return read_at(ud, dst, n, off, err);
}

/* Streams [off, off+len) of the source into the writer as opaque data or
 * tensor data, read straight into the writer's chunks. */
static int copy_range(ckpt_writer *w, const source *src, uint64_t off, uint64_t len, int tensor,
                      ckpt_err *err)
{
    return writer_feed_from(w, tensor, fill_from_source, (void *)src, off, len, err);
}

/* ------------------------------------------------------- layout to writer */

/* One typed stretch of the file, in the order the writer is given it: a
 * region (with the tensors inside it as views) or a tensor on its own. */
typedef struct piece {
    uint64_t off, len;
    int region; /* 1: lay->regions[idx], 0: lay->t[idx] */
    size_t idx;
} piece;

static int cmp_piece(const void *x, const void *y)
{
    const piece *a = x, *b = y;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1; /* empty tensors first */
    return a->region - b->region;
}

/* The region whose bytes hold tensor t wholly, or -1; regions are sorted
 * and disjoint (checked first). */
static long region_of(const ingest_layout *lay, const ingest_tensor *t)
{
    size_t lo = 0, hi = lay->n_regions;
    while (lo < hi) { /* first region starting after t */
        size_t mid = lo + (hi - lo) / 2;
        if (lay->regions[mid].offset <= t->offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const ingest_region *r = &lay->regions[lo - 1];
    return t->offset - r->offset <= r->length && t->nbytes <= r->length - (t->offset - r->offset)
               ? (long)lo - 1
               : -1;
}

/* Tensor names are unique in a pack. Two files may hold tensors of the
 * same name (two shards, a model and its EMA copy, pytorch_model.bin beside
 * model.safetensors): the first file's keeps the name, a later one's is
 * renamed "PATH/NAME" (its file's path in the pack, '/', its name), so
 * tensors/ shows it under tensors/PATH/NAME. When that name is taken too,
 * the file is stored opaque (-EINVAL with why) rather than failing the
 * checkpoint. *renamed is the new name (malloc'd) or NULL. */
static int qualify_name(const ckpt_writer *w, const char *pack_path, const strmap *in_file,
                        const ingest_tensor *t, char **renamed, char *why, size_t why_len)
{
    *renamed = NULL;
    if (!writer_has_tensor(w, t->name))
        return 0;
    size_t len = strlen(pack_path) + 1 + strlen(t->name) + 1;
    char *qualified = malloc(len);
    if (!qualified)
        return -ENOMEM;
    snprintf(qualified, len, "%s/%s", pack_path, t->name);
    if (writer_has_tensor(w, qualified) || strmap_get(in_file, qualified) >= 0) {
        /* Cut when long: the message is for reading. */
        if (snprintf(why, why_len,
                     "tensor '%.120s' is also in an earlier file, and '%.200s' is taken too",
                     t->name, qualified) >= (int)why_len)
            why[why_len - 1] = '\0';
        free(qualified);
        return -EINVAL;
    }
    *renamed = qualified;
    return 0;
}

/* Turns a parser's layout into pieces, checking what the writer would
 * otherwise refuse halfway through the file: stretches inside the file and
 * disjoint, tensors either inside one region of their element size or clear
 * of all regions, names unique within the file. *owner[i] is the region of
 * tensor i or -1. On a fault, why says what is wrong and -EINVAL returns. */
static int plan_pieces(const ckpt_writer *w, const char *pack_path, ingest_layout *lay,
                       uint64_t size, piece **out, size_t *n_out, long **owner_out, char *why,
                       size_t why_len)
{
    size_t n = 0, cap = lay->n_regions + lay->n;
    piece *pc = malloc((cap ? cap : 1) * sizeof *pc);
    long *owner = malloc((lay->n ? lay->n : 1) * sizeof *owner);
    /* New names wait here until the map of the file's own names, which
     * points at the old ones, is freed. */
    char **renamed = calloc(lay->n ? lay->n : 1, sizeof *renamed);
    strmap names = {0};
    int rc = -ENOMEM;
    if (!pc || !owner || !renamed || strmap_init(&names, lay->n) < 0)
        goto out;
    for (size_t i = 0; i < lay->n; i++)
        if (strmap_put(&names, lay->t[i].name, i, NULL) == 1) {
            snprintf(why, why_len, "layout: tensor name '%.200s' appears twice", lay->t[i].name);
            rc = -EINVAL;
            goto out;
        }
    rc = -EINVAL;
    for (size_t i = 0; i < lay->n_regions; i++) {
        const ingest_region *r = &lay->regions[i];
        if (r->offset > size || r->length > size - r->offset) {
            snprintf(why, why_len,
                     "layout: region %zu (%s at %llu, %llu bytes) lies outside the file", i,
                     r->dtype, (unsigned long long)r->offset, (unsigned long long)r->length);
            goto out;
        }
        if (i && r->offset < lay->regions[i - 1].offset + lay->regions[i - 1].length) {
            snprintf(why, why_len, "layout: region %zu at %llu overlaps the one before it", i,
                     (unsigned long long)r->offset);
            goto out;
        }
        /* A type the pack cannot name (a quantized GGUF block run): its bytes
         * stay opaque data, whose chunks still get the best grouping. */
        if (ckpt_dtype_size(r->dtype))
            pc[n++] = (piece){r->offset, r->length, 1, i};
    }
    for (size_t i = 0; i < lay->n; i++) {
        const ingest_tensor *t = &lay->t[i];
        uint64_t nbytes;
        if (ckpt_tensor_bytes(t->dtype, t->ndim, t->shape, &nbytes) < 0 || nbytes != t->nbytes ||
            t->offset > size || t->nbytes > size - t->offset) {
            snprintf(why, why_len,
                     "layout: tensor '%.200s' lies outside the file or does not match its shape",
                     t->name);
            goto out;
        }
        if ((rc = qualify_name(w, pack_path, &names, t, &renamed[i], why, why_len)) < 0)
            goto out;
        rc = -EINVAL;
        /* What ckpt_writer_begin_tensor refuses would fail the whole pack
         * halfway; here it only makes this file opaque. */
        const char *final = renamed[i] ? renamed[i] : t->name;
        if (strlen(final) > UINT16_MAX || t->ndim > 64) {
            snprintf(why, why_len,
                     "layout: tensor '%.200s' has a name over %u bytes or over 64 "
                     "dimensions",
                     final, UINT16_MAX);
            goto out;
        }
        owner[i] = region_of(lay, t);
        if (owner[i] >= 0) {
            if (ckpt_dtype_size(lay->regions[owner[i]].dtype) != ckpt_dtype_size(t->dtype)) {
                snprintf(why, why_len, "layout: tensor '%.200s' (%s) lies in a region of %s",
                         t->name, t->dtype, lay->regions[owner[i]].dtype);
                goto out;
            }
            continue;
        }
        pc[n++] = (piece){t->offset, t->nbytes, 0, i};
    }
    qsort(pc, n, sizeof *pc, cmp_piece);
    for (size_t i = 1; i < n; i++)
        if (pc[i].off < pc[i - 1].off + pc[i - 1].len) {
            snprintf(why, why_len, "layout: %s at %llu overlaps a region or tensor before it",
                     pc[i].region ? "a region" : "a tensor", (unsigned long long)pc[i].off);
            goto out;
        }
    rc = 0;
out:
    strmap_free(&names);
    for (size_t i = 0; renamed && i < lay->n; i++) {
        if (renamed[i] && rc == 0) {
            free(lay->t[i].name);
            lay->t[i].name = renamed[i];
        } else {
            free(renamed[i]);
        }
    }
    free(renamed);
    if (rc < 0) {
        free(pc);
        free(owner);
        return rc;
    }
    *out = pc;
    *n_out = n;
    *owner_out = owner;
    return 0;
}

/* Tells the writer that tensor t, just added, is a chunk of a larger
 * tensor when the layout says so (DCP). The scope is the file's directory:
 * chunks of one tensor are the files of one DCP checkpoint. A chunk renamed
 * by qualify_name() is no longer found, and its tensor is not assembled. */
static int mark_chunk(ckpt_writer *w, const char *pack_path, const ingest_layout *lay,
                      const strmap *chunks, const ingest_tensor *t, ckpt_err *err)
{
    long c = chunks->cap ? strmap_get(chunks, t->name) : -1;
    if (c < 0)
        return 0;
    const ingest_chunk *k = &lay->chunks[c];
    const char *slash = strrchr(pack_path, '/');
    char *scope = strndup(pack_path, slash ? (size_t)(slash - pack_path) : 0);
    if (!scope)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    int rc = writer_chunk_of(w, scope, k->whole, k->ndim, k->whole_shape, k->offsets, err);
    free(scope);
    return rc;
}

/* Writes the file's bytes in order: opaque gaps, regions with their views
 * (declared before the region's bytes, as the writer asks), tensors. */
static int write_pieces(ckpt_writer *w, const char *pack_path, const source *src,
                        const ingest_layout *lay, const piece *pc, size_t n, const long *owner,
                        uint64_t size, ckpt_err *err)
{
    uint64_t pos = 0;
    int rc = 0;
    /* Each region's views in tensor order, by a stable counting sort: a
     * scan of every tensor per region was quadratic (a torch.save with
     * 60000 storages spent 44% of `ckpt pack` there). */
    size_t *first = calloc(lay->n_regions + 1, sizeof *first);
    size_t *views = malloc((lay->n ? lay->n : 1) * sizeof *views);
    if (!first || !views) {
        free(first);
        free(views);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < lay->n; j++)
        if (owner[j] >= 0)
            first[owner[j] + 1]++;
    for (size_t r = 0; r < lay->n_regions; r++)
        first[r + 1] += first[r];
    for (size_t j = 0, r; j < lay->n; j++)
        if (owner[j] >= 0) {
            r = (size_t)owner[j];
            views[first[r]++] = j;
        }
    for (size_t r = lay->n_regions; r > 0; r--) /* back to each region's start */
        first[r] = first[r - 1];
    first[0] = 0;
    strmap chunks = {0};
    if (lay->n_chunks) {
        if (strmap_init(&chunks, lay->n_chunks) < 0) {
            free(first);
            free(views);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < lay->n_chunks; i++)
            if (strmap_put(&chunks, lay->chunks[i].name, i, NULL) < 0) {
                strmap_free(&chunks);
                free(first);
                free(views);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const piece *p = &pc[i];
        if (p->off > pos)
            rc = copy_range(w, src, pos, p->off - pos, 0, err);
        if (rc == 0 && p->region) {
            rc = ckpt_writer_begin_region(w, lay->regions[p->idx].dtype, err);
            for (size_t k = first[p->idx]; rc == 0 && k < first[p->idx + 1]; k++) {
                const ingest_tensor *t = &lay->t[views[k]];
                rc = ckpt_writer_add_view(w, t->name, t->dtype, t->ndim, t->shape, t->offset, err);
                if (rc == 0)
                    rc = mark_chunk(w, pack_path, lay, &chunks, t, err);
            }
            if (rc == 0)
                rc = copy_range(w, src, p->off, p->len, 1, err);
            if (rc == 0)
                rc = ckpt_writer_end_region(w, err);
        } else if (rc == 0) {
            const ingest_tensor *t = &lay->t[p->idx];
            rc = ckpt_writer_begin_tensor(w, t->name, t->dtype, t->ndim, t->shape, err);
            if (rc == 0)
                rc = mark_chunk(w, pack_path, lay, &chunks, t, err);
            if (rc == 0)
                rc = copy_range(w, src, t->offset, t->nbytes, 1, err);
            if (rc == 0)
                rc = ckpt_writer_end_tensor(w, err);
        }
        pos = p->off + p->len;
    }
    if (rc == 0 && size > pos)
        rc = copy_range(w, src, pos, size - pos, 0, err);
    strmap_free(&chunks);
    free(first);
    free(views);
    return rc;
}

/* Makes note a valid note in place: bytes that are not part of valid UTF-8
 * become '?' (a hostile name may be quoted in it), and it is cut between
 * characters to at most TPACK_NOTE_MAX bytes. */
static void clean_note(char *note)
{
    size_t len = strlen(note);
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        while (k <= 4 && i + k <= len && !ckpt_utf8_valid((const uint8_t *)note + i, k))
            k++;
        if (k > 4 || i + k > len) {
            note[i++] = '?';
            continue;
        }
        i += k;
    }
    if (len > TPACK_NOTE_MAX) {
        len = TPACK_NOTE_MAX;
        while (len && ((uint8_t)note[len] & 0xC0) == 0x80)
            len--;
        note[len] = 0;
    }
}

/* "<pack path>: stored opaque: <fault>" as a note (clean_note). */
static void make_note(char *note, size_t cap, const char *pack_path, const char *fault)
{
    snprintf(note, cap, "%s: stored opaque: %s", pack_path, fault);
    clean_note(note);
}

/* The parser's skipped tensors, recorded with the file so the manifest says
 * why they have no tensors/ entry. One the index cannot hold (a name over
 * 64 KiB) is left out rather than failing the file. */
static int add_skipped(ckpt_writer *w, const ingest_layout *lay, ckpt_err *err)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < lay->n_skipped; i++) {
        const ingest_skipped *k = &lay->skipped[i];
        size_t nl = k->name ? strlen(k->name) : 0;
        if (nl == 0 || nl > UINT16_MAX)
            continue;
        char reason[sizeof k->reason + 1];
        snprintf(reason, sizeof reason, "%s", k->reason);
        clean_note(reason);
        rc = writer_add_skipped(w, k->name, reason, err);
    }
    return rc;
}

/* A file its own loader refuses (a torch.save archive with a storage record
 * missing or cut short) is packed as it is, its readable tensors indexed:
 * one warning names the file and its first fault, as one stored opaque
 * gets. Tensors skipped by design (a dtype a pack has no element type for)
 * load fine and stay in the manifest's skipped list only. */
static void warn_damaged(ckpt_writer *w, const source *src, const ingest_layout *lay)
{
    const ingest_skipped *first = NULL;
    size_t n = 0;
    for (size_t i = 0; i < lay->n_skipped; i++)
        if (lay->skipped[i].damaged && n++ == 0)
            first = &lay->skipped[i];
    if (!first)
        return;
    char more[64] = "";
    if (n > 1)
        snprintf(more, sizeof more, " (and %zu more tensors)", n - 1);
    char msg[TPACK_NOTE_MAX + 512];
    snprintf(msg, sizeof msg, "stored as it is, but damaged: tensor '%.256s': %s%s",
             first->name ? first->name : "", first->reason, more);
    clean_note(msg);
    writer_warn(w, src->name, msg);
}

/* The second half of adding a file: writes it from its layout (when
 * structured) or as opaque bytes, with the container name or the fault. */
static int add_described(ckpt_writer *w, const char *pack_path, const source *src, uint64_t size,
                         uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                         const char *container, int structured, ingest_layout *lay, char *fault,
                         size_t fault_len, ckpt_err *err)
{
    piece *pc = NULL;
    long *owner = NULL;
    size_t n = 0;
    int rc = 0;
    if (structured) {
        rc = plan_pieces(w, pack_path, lay, size, &pc, &n, &owner, fault, fault_len);
        if (rc == -ENOMEM)
            return ckpt_fail(err, rc, "out of memory");
        if (rc < 0)
            structured = 0;
        rc = 0;
    }
    char note[TPACK_NOTE_MAX + 512] = "";
    if (fault[0]) {
        make_note(note, sizeof note, pack_path, fault);
        char warning[sizeof note];
        snprintf(warning, sizeof warning, "stored opaque: %s", fault);
        writer_warn(w, src->name, warning);
        /* A file its parser rejected is opaque bytes, whatever it claimed to be. */
        container = "";
    }
    if (!container || ckpt_container_code(container) < 0)
        container = "";
    if (rc == 0)
        rc = ckpt_writer_begin_file(w, pack_path, mode, mtime_sec, mtime_nsec, err);
    if (rc == 0)
        rc = ckpt_writer_set_container(w, container, note, err);
    if (rc == 0 && !(src->early && writer_file_adopt(w, src->early, size))) {
        if (src->read == fd_read)
            writer_file_rehash(w, *(const int *)src->ud, size);
        else if (src->shared)
            writer_file_rehash_reader(w, src->read, src->ud, size);
    }
    if (rc == 0 && !structured)
        rc = copy_range(w, src, 0, size, 0, err);
    else if (rc == 0)
        rc = write_pieces(w, pack_path, src, lay, pc, n, owner, size, err);
    if (rc == 0 && structured)
        rc = add_skipped(w, lay, err);
    if (rc == 0 && structured)
        warn_damaged(w, src, lay);
    if (rc == 0)
        rc = ckpt_writer_end_file(w, err);
    /* The workers read the file's chunks (writer_feed_from); src goes away
     * when this returns. */
    int waited = writer_wait_fills(w, rc ? NULL : err);
    if (rc == 0)
        rc = waited;
    free(pc);
    free(owner);
    return rc;
}

int ingest_add_layout(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                      uint64_t size, const char *container, const char *fault,
                      struct ingest_layout *lay, ckpt_err *err)
{
    source src = {.read = read, .ud = ud, .name = pack_path};
    char f[400];
    snprintf(f, sizeof f, "%s", fault ? fault : "");
    return add_described(w, pack_path, &src, size, 0644, 0, 0, container, lay != NULL, lay, f,
                         sizeof f, err);
}

static int add_source(ckpt_writer *w, const char *pack_path, const source *src, uint64_t size,
                      uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec, ckpt_err *err)
{
    ingest_layout lay;
    memset(&lay, 0, sizeof lay);
    described d;
    int rc = describe_file(src, pack_path, size, &lay, &d, err);
    if (rc < 0)
        return rc;
    rc = add_described(w, pack_path, src, size, mode, mtime_sec, mtime_nsec,
                       d.fmt ? d.fmt->name : "", d.structured, &lay, d.fault, sizeof d.fault, err);
    ingest_layout_free(&lay);
    return rc;
}

static int add_fd(ckpt_writer *w, const char *pack_path, int fd, const char *src_path,
                  const struct stat *st, struct hash_job *early, ckpt_err *err)
{
    source src = {fd_read, &fd, src_path, .disk_path = src_path, .early = early};
    int rc = add_source(w, pack_path, &src, (uint64_t)st->st_size, (uint32_t)st->st_mode,
                        (int64_t)st->st_mtim.tv_sec, (uint32_t)st->st_mtim.tv_nsec, err);
    if (rc == 0) {
        struct stat now;
        /* ctime too: a rewrite that puts the mtime back (rsync --inplace
         * -t, futimens) cannot put it back. */
        if (fstat(fd, &now) == 0 &&
            (now.st_size != st->st_size || now.st_mtim.tv_sec != st->st_mtim.tv_sec ||
             now.st_mtim.tv_nsec != st->st_mtim.tv_nsec ||
             now.st_ctim.tv_sec != st->st_ctim.tv_sec ||
             now.st_ctim.tv_nsec != st->st_ctim.tv_nsec))
            rc = ckpt_fail(err, -EAGAIN, "%s: file changed while being packed", src_path);
    }
    return rc;
}

int ckpt_writer_add_reader(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                           uint64_t size, uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                           const char *src_name, ckpt_err *err)
{
    if (!read)
        return ckpt_fail(err, -EINVAL, "%s: no read callback", pack_path ? pack_path : "(null)");
    source src = {read, ud, src_name ? src_name : pack_path, .w = w, .pack_path = pack_path};
    return add_source(w, pack_path, &src, size, mode, mtime_sec, mtime_nsec, err);
}

/* early: its lane's job, queued before (ckpt_writer_add_reader_ahead), or
 * NULL. */
static int add_shared(ckpt_writer *w, const char *pack_path, ckpt_read_fn read, void *ud,
                      uint64_t size, uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                      const char *src_name, struct hash_job *early, ckpt_err *err)
{
    if (!read)
        return ckpt_fail(err, -EINVAL, "%s: no read callback", pack_path ? pack_path : "(null)");
    source src = {read,
                  ud,
                  src_name ? src_name : pack_path,
                  .w = w,
                  .pack_path = pack_path,
                  .shared = 1,
                  .early = early};
    return add_source(w, pack_path, &src, size, mode, mtime_sec, mtime_nsec, err);
}

int ckpt_writer_add_reader_shared(ckpt_writer *w, const char *pack_path, ckpt_read_fn read,
                                  void *ud, uint64_t size, uint32_t mode, int64_t mtime_sec,
                                  uint32_t mtime_nsec, const char *src_name, ckpt_err *err)
{
    return add_shared(w, pack_path, read, ud, size, mode, mtime_sec, mtime_nsec, src_name, NULL,
                      err);
}

int ckpt_writer_add_path(ckpt_writer *w, const char *pack_path, const char *src_path, ckpt_err *err)
{
    struct stat st;
    int fd = ckpt_open_regular(src_path, O_NOFOLLOW, &st);
    if (fd == -ELOOP)
        return ckpt_fail(err, -ELOOP, "%s: is a symbolic link; refusing to follow it", src_path);
    if (fd == -EINVAL)
        return ckpt_fail(err, -EINVAL, "%s: not a regular file", src_path);
    if (fd < 0)
        return ckpt_fail(err, fd, "%s: cannot open: %s", src_path, strerror(-fd));
    int rc = add_fd(w, pack_path, fd, src_path, &st, NULL, err);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------ tree walk */

typedef struct pathent {
    char *rel;
    uint64_t size; /* when walked */
} pathent;

typedef struct pathlist {
    pathent *v;
    size_t n, cap;
} pathlist;

static void pathlist_free(pathlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].rel);
    free(l->v);
}

/* Pack order: numbers in names by value (glibc's strverscmp), so that a
 * DCP save's __2_0.distcp comes before __10_0.distcp, and the chunks of a
 * tensor sharded over more than ten ranks come in row order and assemble
 * (pack_write.c). */
static int cmp_path(const void *a, const void *b)
{
    return strverscmp(((const pathent *)a)->rel, ((const pathent *)b)->rel);
}

/* Collects regular files below root/rel; anything else is an error, so
 * nothing is silently left out of a checkpoint. */
/* skip_dev/skip_ino: files left out (the pack being written and the one it
 * replaces), 0 0 for none. */
static int walk(const char *root, const char *rel, pathlist *out, const dev_t skip_dev[2],
                const ino_t skip_ino[2], uint64_t *bytes, int depth, ckpt_err *err)
{
    if (depth > 64)
        return ckpt_fail(err, -ELOOP, "%s/%s: directories nested too deeply", root, rel);
    char *dirpath;
    if (asprintf(&dirpath, "%s%s%s", root, *rel ? "/" : "", rel) < 0)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    DIR *d = opendir(dirpath);
    if (!d) {
        int rc = ckpt_fail(err, -errno, "%s: cannot open directory: %s", dirpath, strerror(errno));
        free(dirpath);
        return rc;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *child, *full;
        if (asprintf(&child, "%s%s%s", rel, *rel ? "/" : "", de->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (asprintf(&full, "%s/%s", dirpath, de->d_name) < 0) {
            free(child);
            rc = -ENOMEM;
            break;
        }
        struct stat st;
        if (lstat(full, &st) < 0) {
            rc = ckpt_fail(err, -errno, "%s: stat failed: %s", full, strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(root, child, out, skip_dev, skip_ino, bytes, depth + 1, err);
        } else if (S_ISLNK(st.st_mode)) {
            rc = ckpt_fail(
                err, -ELOOP,
                "%s: is a symbolic link; refusing to follow it (copy the target in instead)", full);
        } else if (!S_ISREG(st.st_mode)) {
            rc = ckpt_fail(err, -EINVAL, "%s: not a regular file or directory", full);
        } else if (!(st.st_dev == skip_dev[0] && st.st_ino == skip_ino[0]) &&
                   !(st.st_dev == skip_dev[1] && st.st_ino == skip_ino[1] && skip_ino[1])) {
            if (bytes)
                *bytes += (uint64_t)st.st_size;
            if (out) {
                if (grow_array((void **)&out->v, &out->cap, out->n, sizeof *out->v) < 0)
                    rc = -ENOMEM;
                else {
                    out->v[out->n++] = (pathent){child, (uint64_t)st.st_size};
                    child = NULL;
                }
            }
        }
        free(child);
        free(full);
    }
    if (rc == -ENOMEM)
        ckpt_fail(err, rc, "out of memory");
    closedir(d);
    free(dirpath);
    return rc;
}

/* ckpt_writer_add_tree's window (lanes_ahead.h): the walked files, opened
 * ahead and added from the descriptor that their lane reads too. */
typedef struct tree_ahead {
    ckpt_writer *w;
    const char *src_dir;
    const pathlist *l;
} tree_ahead;

static uint64_t tree_size(void *ud, size_t i)
{
    return ((const tree_ahead *)ud)->l->v[i].size;
}

static int tree_queue(void *ud, size_t i, ahead_slot *s)
{
    const tree_ahead *t = ud;
    char *full;
    if (asprintf(&full, "%s/%s", t->src_dir, t->l->v[i].rel) < 0)
        return -1;
    s->fd = ckpt_open_regular(full, O_NOFOLLOW, &s->st);
    free(full);
    if (s->fd < 0)
        return 0; /* left to ckpt_writer_add_path, which says why */
    s->job = writer_prehash(t->w, s->fd, (uint64_t)s->st.st_size);
    return s->job ? 1 : -1;
}

int ckpt_writer_add_tree(ckpt_writer *w, const char *src_dir, ckpt_err *err)
{
    pathlist l = {0};
    dev_t dev[2];
    ino_t ino[2];
    writer_output_id(w, dev, ino);
    int rc = walk(src_dir, "", &l, dev, ino, NULL, 0, err);
    if (rc == 0)
        qsort(l.v, l.n, sizeof *l.v, cmp_path);
    tree_ahead t = {w, src_dir, &l};
    lanes_ahead a;
    lanes_ahead_init(&a, rc == 0 ? l.n : 0, tree_size, tree_queue, &t);
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        ahead_slot f = lanes_ahead_next(&a, i);
        char *full;
        if (asprintf(&full, "%s/%s", src_dir, l.v[i].rel) < 0) {
            if (f.fd >= 0)
                close(f.fd);
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        if (f.fd >= 0) {
            rc = add_fd(w, l.v[i].rel, f.fd, full, &f.st, f.job, err);
            close(f.fd);
        } else {
            rc = ckpt_writer_add_path(w, l.v[i].rel, full, err);
        }
        free(full);
    }
    lanes_ahead_end(&a);
    pathlist_free(&l);
    return rc;
}

/* ------------------------------------------- a caller's sources, planned */

struct ckpt_readers_ahead {
    ckpt_writer *w;
    const ckpt_planned_reader *plan;
    lanes_ahead win;
};

static uint64_t planned_size(void *ud, size_t i)
{
    const ckpt_planned_reader *r = &((const ckpt_readers_ahead *)ud)->plan[i];
    return r->hash_ahead ? r->size : 0;
}

static int planned_queue(void *ud, size_t i, ahead_slot *s)
{
    const ckpt_readers_ahead *a = ud;
    const ckpt_planned_reader *r = &a->plan[i];
    s->job = writer_prehash_reader(a->w, r->read, r->ud, r->size);
    return s->job ? 1 : -1;
}

ckpt_readers_ahead *ckpt_readers_ahead_new(ckpt_writer *w, const ckpt_planned_reader *plan,
                                           size_t n)
{
    ckpt_readers_ahead *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->w = w;
    a->plan = plan;
    lanes_ahead_init(&a->win, n, planned_size, planned_queue, a);
    return a;
}

void ckpt_readers_ahead_free(ckpt_readers_ahead *a)
{
    if (!a)
        return;
    lanes_ahead_end(&a->win);
    free(a);
}

int ckpt_writer_add_reader_ahead(ckpt_readers_ahead *a, size_t i, const char *pack_path,
                                 uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec,
                                 const char *src_name, ckpt_err *err)
{
    if (i >= a->win.n)
        return ckpt_fail(err, -EINVAL, "%s: not a planned source",
                         pack_path ? pack_path : "(null)");
    const ckpt_planned_reader *r = &a->plan[i];
    ahead_slot f = lanes_ahead_next(&a->win, i);
    return add_shared(a->w, pack_path, r->read, r->ud, r->size, mode, mtime_sec, mtime_nsec,
                      src_name, f.job, err);
}

int ckpt_tree_size(const char *path, uint64_t *out, ckpt_err *err)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return ckpt_fail(err, -errno, "%s: %s", path, strerror(errno));
    *out = 0;
    if (S_ISREG(st.st_mode)) {
        *out = (uint64_t)st.st_size;
        return 0;
    }
    static const dev_t none_dev[2];
    static const ino_t none_ino[2];
    return walk(path, "", NULL, none_dev, none_ino, out, 0, err);
}
