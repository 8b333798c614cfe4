/* Fuzzes PyTorch DCP (formats/dcp.c) three ways with each input:
 *   1. dcp_metadata_parse() of the input as .metadata: an accepted
 *      metadata keeps dcp.h's promises (items sorted by file and offset,
 *      those of one file disjoint, offset + length not wrapping; chunks
 *      inside their tensor, each naming a tensor item that names it back);
 *      a refusal is -EINVAL with one line starting "dcp metadata: ";
 *   2. describe() of a fixed real .distcp (dcp_fixture.h) with the input as
 *      its sibling .metadata;
 *   3. describe() of the input as a .distcp without .metadata (the scan of
 *      back-to-back torch.save archives).
 * An accepted layout must keep formats.h's promises (fz_check_torch_layout,
 * as fuzz_torch checks them). A refusal is -EINVAL or -ENOMEM with one line
 * starting "dcp: " and an empty layout. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "container_check.h"
#include "dcp_fixture.h"
#include "formats/dcp.h"

/* A .distcp file and the .metadata beside it. */
typedef struct mem {
    fz_mem file;
    const uint8_t *meta;
    size_t meta_len;
} mem;

static int mem_sibling(void *ud, const char *name, uint8_t **out, size_t *len, size_t max)
{
    const mem *m = ud;
    if (strcmp(name, ".metadata") != 0)
        abort();
    if (m->meta_len > max)
        return -EFBIG;
    *out = malloc(m->meta_len ? m->meta_len : 1);
    if (!*out)
        return -ENOMEM;
    if (m->meta_len)
        memcpy(*out, m->meta, m->meta_len);
    *len = m->meta_len;
    return 0;
}

static void check_metadata(const dcp_metadata *md)
{
    for (size_t i = 0; i < md->n_items; i++) {
        const dcp_item *it = &md->items[i];
        if (!it->fqn || !it->relative_path || it->offset + it->length < it->offset)
            abort();
        if (i) {
            const dcp_item *p = &md->items[i - 1];
            int r = strcmp(p->relative_path, it->relative_path);
            if (r > 0 || (r == 0 && p->offset > it->offset))
                abort();
            if (r == 0 && p->length && it->length && p->offset + p->length > it->offset)
                abort();
        }
        if (it->kind == DCP_ITEM_TENSOR) {
            if (it->tensor >= md->n_tensors || it->chunk >= md->tensors[it->tensor].n_chunks ||
                md->tensors[it->tensor].chunks[it->chunk].item != i)
                abort();
        }
    }
    for (size_t i = 0; i < md->n_tensors; i++) {
        const dcp_tensor *t = &md->tensors[i];
        if (!t->fqn || t->ndim > CKPT_MAX_NDIM)
            abort();
        for (size_t k = 0; k < t->n_chunks; k++) {
            const dcp_chunk *c = &t->chunks[k];
            if (c->ndim != t->ndim)
                abort();
            for (uint32_t d = 0; d < t->ndim; d++)
                if (c->offsets[d] > t->size[d] || c->sizes[d] > t->size[d] - c->offsets[d])
                    abort();
            if (c->item != DCP_NO_ITEM &&
                (c->item >= md->n_items || md->items[c->item].tensor != i ||
                 md->items[c->item].chunk != k))
                abort();
        }
    }
}

static void run_describe(const uint8_t *file, size_t len, const uint8_t *meta, size_t meta_len,
                         int with_sibling)
{
    mem m = {{file, len, SIZE_MAX}, meta, meta_len};
    ingest_source src = {.read = fz_read, .ud = &m.file, .size = len, .name = "fuzz"};
    if (with_sibling) {
        src.read_sibling = mem_sibling;
        src.sibling_ud = &m;
    }
    ingest_layout l;
    char msg[512];
    int rc = ckpt_format_dcp.describe(&src, "ckpt/__0_0.distcp", &l, msg, sizeof msg);
    if (rc < 0 && rc != -EINVAL && rc != -ENOMEM)
        abort();
    fz_check_verdict(rc, msg, &l, "dcp: ");
    if (rc < 0)
        return;
    if (rc == 0)
        fz_check_torch_layout(&l, len);
    ingest_layout_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dcp_metadata md;
    char msg[512];
    int rc = dcp_metadata_parse(data, size, &md, msg, sizeof msg);
    if (rc == 0) {
        check_metadata(&md);
        dcp_metadata_free(&md);
    } else if ((rc != -EINVAL && rc != -ENOMEM) || strncmp(msg, "dcp metadata: ", 14) != 0 ||
               strchr(msg, '\n') || md.n_items || md.n_tensors || md.items || md.tensors ||
               md.doc) {
        abort();
    }
    run_describe(dcp_fixture, sizeof dcp_fixture, data, size, 1);
    run_describe(data, size, NULL, 0, 0);
    return 0;
}
