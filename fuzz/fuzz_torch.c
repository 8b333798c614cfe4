/* Fuzzes the torch.save format (formats/torch.c) end to end: sniff, then
 * describe over an ingest_source of the input. An accepted layout must keep
 * formats.h's promises: regions of known dtypes, sorted, disjoint, inside
 * the file; tensors sorted by offset, of known dtypes, nbytes = elements x
 * element size, each inside a region of its dtype. A refusal says why in
 * one line and leaves the layout empty. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "formats/torch.h"

typedef struct mem {
    const uint8_t *p;
    size_t len;
} mem;

static ssize_t mem_read(void *ud, void *buf, size_t len, uint64_t off)
{
    const mem *m = ud;
    if (off >= m->len)
        return 0;
    size_t n = m->len - (size_t)off < len ? m->len - (size_t)off : len;
    memcpy(buf, m->p + off, n);
    return (ssize_t)n;
}

static void check_layout(const ingest_layout *l, uint64_t size)
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

static void release(ingest_layout *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->t[i].name);
    free(l->t);
    free(l->regions);
    for (size_t i = 0; i < l->n_skipped; i++)
        free(l->skipped[i].name);
    free(l->skipped);
    memset(l, 0, sizeof *l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)ckpt_format_torch.sniff("fuzz.pt", data, size < 4096 ? size : 4096, size);
    mem m = {data, size};
    ingest_source src = {.read = mem_read, .ud = &m, .size = size, .name = "fuzz.pt"};
    ingest_layout l;
    char msg[512];
    int rc = ckpt_format_torch.describe(&src, "fuzz.pt", &l, msg, sizeof msg);
    if (rc < 0) {
        if (rc != -EINVAL || strncmp(msg, "torch archive: ", 15) != 0 || strchr(msg, '\n') || l.n ||
            l.t || l.n_regions || l.regions || l.n_skipped || l.skipped)
            abort();
        return 0;
    }
    if (rc == 1 && (l.n || l.n_regions))
        abort();
    if (rc == 0)
        check_layout(&l, size);
    release(&l);
    return 0;
}
