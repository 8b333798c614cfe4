/* Shared by the container-format fuzz targets (fuzz_gguf.c,
 * fuzz_tensorizer.c): runs a format's describe() over the input as a whole
 * file, twice (once through a source that returns at most 7 bytes a call,
 * to exercise the parsers' read window), and aborts on any broken promise
 * of formats.h: a verdict that depends on read sizes, an error without a
 * one-line message, a layout left behind on error, a tensor or region
 * outside the file or overlapping another, a tensor whose size is not its
 * dtype times its shape, or header_bytes past the first range.
 *
 * The torch-family targets (fuzz_torch.c, fuzz_dcp_metadata.c) check their
 * layouts with fz_check_torch_layout instead: their tensors may share a
 * storage, so they overlap, but each lies inside a region of its dtype. */
#ifndef CKPT_FUZZ_CONTAINER_CHECK_H
#define CKPT_FUZZ_CONTAINER_CHECK_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ckpt.h"
#include "common.h"
#include "formats/formats.h"

typedef struct fz_mem {
    const uint8_t *p;
    size_t n;
    size_t max_read;
} fz_mem;

static inline ssize_t fz_read(void *ud, void *buf, size_t len, uint64_t off)
{
    const fz_mem *m = ud;
    if (off >= m->n)
        return 0;
    size_t k = m->n - (size_t)off < len ? m->n - (size_t)off : len;
    if (k > m->max_read)
        k = m->max_read;
    memcpy(buf, m->p + off, k);
    return (ssize_t)k;
}

typedef struct fz_range {
    uint64_t b, e;
} fz_range;

static inline int fz_range_cmp(const void *a, const void *b)
{
    const fz_range *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : 0;
}

static inline void fz_check_layout(const ingest_layout *l, uint64_t size, uint32_t max_ndim,
                                   const char *region_prefix)
{
    size_t n = l->n + l->n_regions;
    fz_range *r = malloc((n ? n : 1) * sizeof *r);
    if (!r)
        return;
    size_t k = 0;
    uint64_t first = size;
    for (size_t i = 0; i < l->n; i++) {
        const ingest_tensor *t = &l->t[i];
        uint64_t elems;
        if (!t->name || !t->name[0] || t->ndim > max_ndim)
            abort();
        /* The packer's own size computation must accept the tensor. */
        if (ckpt_tensor_bytes(t->dtype, t->ndim, t->shape, &elems) != 0)
            abort();
        if (elems != t->nbytes || t->offset > size || t->nbytes > size - t->offset)
            abort();
        if (i > 0 && l->t[i - 1].offset > t->offset) /* sorted */
            abort();
        r[k++] = (fz_range){t->offset, t->offset + t->nbytes};
        if (t->offset < first)
            first = t->offset;
    }
    for (size_t i = 0; i < l->n_regions; i++) {
        const ingest_region *g = &l->regions[i];
        if (g->offset > size || g->length > size - g->offset)
            abort();
        if (!memchr(g->dtype, '\0', sizeof g->dtype) || !g->dtype[0])
            abort();
        if (region_prefix && strncmp(g->dtype, region_prefix, strlen(region_prefix)) != 0 &&
            ckpt_dtype_size(g->dtype) == 0)
            abort();
        if (i > 0 && l->regions[i - 1].offset > g->offset)
            abort();
        r[k++] = (fz_range){g->offset, g->offset + g->length};
        if (g->offset < first)
            first = g->offset;
    }
    qsort(r, k, sizeof *r, fz_range_cmp);
    uint64_t end = 0;
    for (size_t i = 0; i < k; i++) {
        if (r[i].b == r[i].e)
            continue;
        if (r[i].b < end)
            abort();
        end = r[i].e;
    }
    if (l->header_bytes > first)
        abort();
    free(r);
}

/* A torch.save or DCP layout: regions of known dtypes, sorted, disjoint,
 * inside the file; tensors sorted by offset, of known dtypes, nbytes =
 * elements x element size, each inside a region of its dtype; skipped
 * tensors named, with a reason; header_bytes the first tensor's offset. */
static inline void fz_check_torch_layout(const ingest_layout *l, uint64_t size)
{
    for (size_t i = 0; i < l->n_regions; i++) {
        const ingest_region *r = &l->regions[i];
        unsigned es = ckpt_dtype_size(r->dtype);
        if (!es || r->offset > size || r->length > size - r->offset || r->length % es)
            abort();
        if (i && r->offset < l->regions[i - 1].offset + l->regions[i - 1].length)
            abort();
    }
    for (size_t i = 0; i < l->n; i++) {
        const ingest_tensor *t = &l->t[i];
        uint64_t n = ckpt_dtype_size(t->dtype);
        if (!t->name || !t->name[0] || !n || t->ndim > CKPT_MAX_NDIM)
            abort();
        for (uint32_t d = 0; d < t->ndim; d++)
            n *= t->shape[d]; /* cannot overflow: the parser proved it fits */
        if (n != t->nbytes || t->offset > size || t->nbytes > size - t->offset)
            abort();
        if (i && t->offset < l->t[i - 1].offset)
            abort();
        int inside = 0;
        for (size_t r = 0; r < l->n_regions && !inside; r++) {
            const ingest_region *g = &l->regions[r];
            inside = t->offset >= g->offset && t->offset + t->nbytes <= g->offset + g->length &&
                     strcmp(g->dtype, t->dtype) == 0;
        }
        if (!inside)
            abort();
    }
    for (size_t i = 0; i < l->n_skipped; i++)
        if (!l->skipped[i].name || !l->skipped[i].reason[0])
            abort();
    if (l->n && l->header_bytes != l->t[0].offset)
        abort();
}

/* What describe() owes any input but an accepted one: a refusal (rc < 0;
 * which codes are allowed is the caller's to check) says why in one line
 * starting with msg_prefix and leaves the layout empty, and a file kept
 * opaque (1) describes nothing. */
static inline void fz_check_verdict(int rc, const char *msg, const ingest_layout *l,
                                    const char *msg_prefix)
{
    if (rc < 0 && (strncmp(msg, msg_prefix, strlen(msg_prefix)) != 0 || strchr(msg, '\n') || l->n ||
                   l->t || l->n_regions || l->regions || l->n_skipped || l->skipped))
        abort();
    if (rc == 1 && (l->n || l->n_regions))
        abort();
}

static inline void fz_free(ingest_layout *l)
{
    free(l->regions); /* whether or not ingest_layout_free knows regions yet */
    l->regions = NULL;
    l->n_regions = 0;
    ingest_layout_free(l);
}

static inline int fz_run(const container_format *f, const uint8_t *data, size_t size,
                         size_t max_read, uint32_t max_ndim, const char *region_prefix,
                         const char *msg_prefix)
{
    fz_mem m = {data, size, max_read};
    ingest_source src = {.read = fz_read, .ud = &m, .size = size, .name = "fuzz"};
    ingest_layout l;
    char msg[512];
    int rc = f->describe(&src, "fuzz", &l, msg, sizeof msg);
    if (rc < 0) {
        if (rc != -EINVAL && rc != -ENOMEM)
            abort();
        if (!msg[0] || memchr(msg, '\n', strlen(msg)) ||
            strncmp(msg, msg_prefix, strlen(msg_prefix)) != 0)
            abort();
        if (l.n || l.t || l.n_regions || l.regions)
            abort();
    } else if (rc == 1) {
        if (l.n || l.n_regions)
            abort();
    } else if (rc == 0) {
        fz_check_layout(&l, size, max_ndim, region_prefix);
        if (!f->sniff("fuzz", data, size < 4096 ? size : 4096, size))
            abort(); /* accepted what it would not claim */
    } else {
        abort();
    }
    fz_free(&l);
    return rc;
}

/* Both read patterns must reach the same verdict. */
static inline void fz_container(const container_format *f, const uint8_t *data, size_t size,
                                uint32_t max_ndim, const char *region_prefix,
                                const char *msg_prefix)
{
    int a = fz_run(f, data, size, SIZE_MAX, max_ndim, region_prefix, msg_prefix);
    int b = fz_run(f, data, size, 7, max_ndim, region_prefix, msg_prefix);
    if (a != b)
        abort();
}

#endif
