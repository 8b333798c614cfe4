/* Fuzzes the safetensors header parser with the input as a whole file, and
 * again with only the prefix the parser asked for, copied into a buffer of
 * exactly that size so that any read past head_len trips ASan. Accepted
 * layouts are checked against the promises formats/formats.h makes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "formats/formats.h"

static void check_layout(const ingest_layout *l, uint64_t file_size)
{
    uint64_t at = l->header_bytes;
    for (size_t i = 0; i < l->n; i++) {
        const ingest_tensor *t = &l->t[i];
        uint64_t n = ckpt_dtype_size(t->dtype);
        if (!t->name || !t->name[0] || n == 0 || t->ndim > CKPT_MAX_NDIM || t->offset != at)
            abort();
        for (uint32_t d = 0; d < t->ndim; d++)
            n *= t->shape[d]; /* cannot overflow: the parser proved it fits */
        if (n != t->nbytes)
            abort();
        at += t->nbytes;
    }
    if (at != file_size)
        abort();
}

static void check_message(int rc, const char *msg)
{
    if (rc < 0 && rc != -EAGAIN && (msg[0] == '\0' || memchr(msg, '\n', strlen(msg))))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ingest_layout l;
    uint64_t need = 0;
    char msg[512];

    int rc = ingest_safetensors(data, size, size, &l, &need, msg, sizeof msg);
    if (rc == -EAGAIN || rc > 0)
        abort(); /* the whole file was there: nothing more to ask for */
    check_message(rc, msg);
    if (rc == 0)
        check_layout(&l, size);
    ingest_layout_free(&l);

    /* Feed a short prefix: the parser must ask for more, within the file. */
    size_t head_len = size > 8 ? 8 + (size - 8) / 2 : size / 2;
    uint8_t *head = malloc(head_len ? head_len : 1);
    if (!head)
        return 0;
    memcpy(head, data, head_len);
    int rc2 = ingest_safetensors(head, head_len, size, &l, &need, msg, sizeof msg);
    if (rc2 == -EAGAIN && (need <= head_len || need > size))
        abort();
    /* With enough bytes the verdict cannot depend on the data region. */
    if (rc2 != -EAGAIN && rc2 != rc)
        abort();
    check_message(rc2, msg);
    ingest_layout_free(&l);
    free(head);
    return 0;
}
