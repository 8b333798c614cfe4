/* The registry of container formats: which parsers packing tries, in which
 * order, and the layout they hand back. Adding a format is one file in this
 * directory plus one line in ckpt_container_formats[]. */
#include <stdlib.h>
#include <string.h>

#include "formats.h"
#include "formats/dcp.h"
#include "parse.h"

/* Sniffing is by extension today, so the order only matters once a format
 * sniffs by content: put the most specific first. */
const container_format *const ckpt_container_formats[] = {
    &ckpt_format_safetensors,
    &ckpt_format_npy,
    /* Formats that describe typed regions and tensors that do not tile the
     * file (gaps between them). ingest_files.c still copies only the header
     * and the tensors, so these stay off until the writer takes regions;
     * define CKPT_FORMATS_REGIONS (with that writer) to turn them on. */
#ifdef CKPT_FORMATS_REGIONS
    &ckpt_format_dcp,
#endif
    NULL,
};

const container_format *ckpt_container_sniff(const char *path, const uint8_t *head,
                                             size_t head_len, uint64_t size)
{
    for (const container_format *const *f = ckpt_container_formats; *f; f++)
        if ((*f)->sniff(path, head, head_len, size))
            return *f;
    return NULL;
}

void ingest_layout_free(ingest_layout *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->t[i].name);
    free(l->t);
    free(l->regions);
    for (size_t i = 0; i < l->n_skipped; i++)
        free(l->skipped[i].name);
    free(l->skipped);
    memset(l, 0, sizeof *l);
}
