/* Fuzzes packing as a whole: the registry's sniffing (formats/formats.c),
 * the shared parse and binary-read helpers (formats/parse.c, binread.c),
 * every container parser and the writer's layout checks, by packing the
 * input as one file and reading the pack back. The first byte picks the
 * file's name, so formats that sniff by extension get their turn too.
 *
 * The oracle is the project's promise for any file: packing never fails on
 * the file's bytes, the file reads back byte-identical, and every tensor
 * reads back as the bytes of its file at its offset. */
#include "container_check.h" /* fz_mem, fz_read */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {
    "model.safetensors", "x.npy",         "__0_0.distcp", "model.pt",
    "model.gguf",        "model.tensors", "blob.bin",
};
#define N_NAMES (sizeof names / sizeof names[0])

static char dir[64];

static void check_round_trip(const char *pack, const uint8_t *want, size_t size)
{
    ckpt_pack *p;
    ckpt_err e;
    if (ckpt_open(pack, NULL, &p, &e) != 0 || ckpt_file_count(p) != 1)
        abort();
    uint8_t *got = malloc(size ? size : 1);
    if (!got || ckpt_file_pread(p, 0, got, size, 0, &e) != (ssize_t)size ||
        memcmp(got, want, size) != 0)
        abort();
    for (size_t i = 0; i < ckpt_tensor_count(p); i++) {
        const ckpt_tensor_info *t = ckpt_tensor_at(p, i);
        if (t->file_index != 0 || t->file_offset > size || t->nbytes > size - t->file_offset)
            abort();
        if (ckpt_tensor_pread(p, i, got, (size_t)t->nbytes, 0, &e) != (ssize_t)t->nbytes ||
            memcmp(got, want + t->file_offset, (size_t)t->nbytes) != 0)
            abort();
    }
    for (size_t i = 0; i < ckpt_skipped_count(p); i++)
        if (ckpt_skipped_at(p, i)->file_index != 0 || !ckpt_skipped_at(p, i)->name[0])
            abort();
    free(got);
    ckpt_close(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_formats.XXXXXX");
        if (!mkdtemp(dir))
            abort();
    }
    const char *name = names[data[0] % N_NAMES];
    fz_mem m = {data + 1, size - 1, SIZE_MAX};
    char pack[128], tmp[128];
    snprintf(pack, sizeof pack, "%s/p.tpack", dir);
    snprintf(tmp, sizeof tmp, "%s/p.tpack.tmp", dir);
    ckpt_write_opts o = {.chunk_size = 65536, .level = 1, .threads = 1};
    ckpt_writer *w;
    ckpt_err e;
    if (ckpt_writer_open(pack, tmp, &o, &w, &e) != 0)
        abort();
    /* A parser's verdict on the bytes is never the writer's failure. */
    if (ckpt_writer_add_reader(w, name, fz_read, &m, m.n, 0644, 0, 0, NULL, &e) != 0 ||
        ckpt_writer_finish(w, NULL, &e) != 0)
        abort();
    check_round_trip(pack, m.p, m.n);
    unlink(pack);
    return 0;
}
