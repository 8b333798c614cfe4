/* Fuzzes the npy header parser with the input as a whole file, and again
 * with only a prefix copied into a buffer of exactly that size so that any
 * read past head_len trips ASan. Accepted layouts are checked against the
 * promises formats/formats.h makes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "formats/formats.h"

static void check_layout(const ingest_layout *l, uint64_t file_size)
{
    if (l->n != 1 || strcmp(l->t[0].name, "tensor") != 0)
        abort();
    const ingest_tensor *t = &l->t[0];
    uint64_t n = ckpt_dtype_size(t->dtype);
    if (n == 0 || t->ndim > CKPT_MAX_NDIM || t->offset != l->header_bytes)
        abort();
    for (uint32_t d = 0; d < t->ndim; d++)
        n *= t->shape[d]; /* cannot overflow: the parser proved it fits */
    if (n != t->nbytes || t->offset + t->nbytes != file_size)
        abort();
}

static void check_result(int rc, const ingest_layout *l, const char *msg)
{
    if (rc < 0 && rc != -EAGAIN && (msg[0] == '\0' || memchr(msg, '\n', strlen(msg))))
        abort();
    if (rc != 0 && (l->n != 0 || l->t != NULL))
        abort(); /* only success hands back a layout */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ingest_layout l;
    uint64_t need = 0;
    char msg[512];

    int rc = ingest_npy(data, size, size, "tensor", &l, &need, msg, sizeof msg);
    if (rc == -EAGAIN || rc > 1)
        abort(); /* the whole file was there: nothing more to ask for */
    check_result(rc, &l, msg);
    if (rc == 0)
        check_layout(&l, size);
    ingest_layout_free(&l);

    /* A prefix: the parser must ask for more within the file, or give the
     * same verdict, which may not depend on bytes past the header. */
    size_t head_len = size / 2;
    uint8_t *head = malloc(head_len ? head_len : 1);
    if (!head)
        return 0;
    memcpy(head, data, head_len);
    int rc2 = ingest_npy(head, head_len, size, "tensor", &l, &need, msg, sizeof msg);
    if (rc2 == -EAGAIN && (need <= head_len || need > size))
        abort();
    if (rc2 != -EAGAIN && rc2 != rc)
        abort();
    check_result(rc2, &l, msg);
    ingest_layout_free(&l);
    free(head);
    return 0;
}
