/* The registry of container formats: which parsers packing tries, in which
 * order, and the layout they hand back. Adding a format is one file in this
 * directory plus one line in ckpt_container_formats[]. */
#include <stdlib.h>
#include <string.h>

#include "binary.h"
#include "formats.h"
#include "formats/dcp.h"
#include "parse.h"
#include "torch.h"

/* safetensors and npy sniff by extension, the others by their magic bytes
 * (a torch.save zip, GGUF, tensorizer), whatever the file is called. */
const container_format *const ckpt_container_formats[] = {
    &ckpt_format_safetensors, &ckpt_format_npy,  &ckpt_format_dcp, /* before torch: a .distcp starts with a torch.save zip */
    &ckpt_format_torch,       &ckpt_format_gguf, &ckpt_format_tensorizer, NULL,
};

const container_format *ckpt_container_sniff(const char *path, const uint8_t *head, size_t head_len,
                                             uint64_t size)
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
    for (size_t i = 0; i < l->n_chunks; i++) {
        free(l->chunks[i].name);
        free(l->chunks[i].whole);
    }
    free(l->chunks);
    memset(l, 0, sizeof *l);
}
