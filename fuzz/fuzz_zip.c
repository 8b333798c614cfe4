/* Fuzzes the zip directory reader (formats/zip.c) with the input as a whole
 * file read through an ingest_source. An accepted archive is checked against
 * zip.h's promises: every entry's header and data lie before the central
 * directory, which lies in the file; entries do not overlap; names are
 * non-empty, NUL-free and found by zip_find. Messages are one line. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/zip.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mem m = {data, size};
    ingest_source src = {.read = mem_read, .ud = &m, .size = size, .name = "fuzz.zip"};
    zip_archive z;
    char msg[512];
    int rc = zip_open(&src, &z, msg, sizeof msg);
    if (rc < 0) {
        if (rc != -EINVAL || !msg[0] || strchr(msg, '\n') || z.n || z.e)
            abort();
        return 0;
    }
    if (rc != 0 || z.cd_offset > size || z.cd_size > size - z.cd_offset)
        abort();
    for (size_t i = 0; i < z.n; i++) {
        const zip_entry *e = &z.e[i];
        if (!e->name || !e->name[0] || strlen(e->name) > ZIP_MAX_NAME)
            abort();
        if (e->header_offset >= e->data_offset || e->data_offset > z.cd_offset ||
            e->comp_size > z.cd_offset - e->data_offset)
            abort();
        if (zip_find(&z, e->name) != e)
            abort();
        if (zip_entry_is_raw(e) && e->size != e->comp_size)
            abort();
        for (size_t j = 0; j < z.n; j++) {
            const zip_entry *f = &z.e[j];
            if (j != i && f->header_offset >= e->header_offset &&
                f->header_offset < e->data_offset + e->comp_size)
                abort();
        }
    }
    zip_close(&z);
    return 0;
}
