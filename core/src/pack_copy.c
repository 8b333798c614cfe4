/* Files copied as stored from an earlier generation of a pack
 * (ckpt_writer_copy_file): their chunks go through the writer's pipeline
 * like any others, in order, but pre-encoded; the encode workers only
 * re-seal them (pack_write.c, copied_payload). Their tensors, digests,
 * container and skipped tensors are taken from the source's index. */
#include "writer_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Registers src's tensor ti as a tensor of the file being copied, whose
 * first extent in this pack is first_extent; its digest comes with it. */
static int copy_tensor(ckpt_writer *w, const ckpt_pack *src, size_t ti, uint64_t first_extent,
                       ckpt_err *err)
{
    const tensor_rec *t = &src->tensors[ti];
    const file_rec *f = &src->files[t->info.file_index];
    if (strmap_get(&w->tensor_map, t->info.name) >= 0)
        return -EXDEV; /* named again by the caller's decode path */
    char *name = strdup(t->info.name);
    uint64_t *shape = malloc((t->info.ndim ? t->info.ndim : 1) * sizeof *shape);
    tensor_hash *th = calloc(1, sizeof *th);
    if (!name || !shape || !th ||
        grow_array((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors) < 0 ||
        strmap_put(&w->tensor_map, name, w->n_tensors, NULL) < 0) {
        free(name);
        free(shape);
        free(th);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    memcpy(shape, t->info.shape, t->info.ndim * sizeof *shape);
    memcpy(th->digest, t->info.sha256, 32);
    th->next_id = UINT64_MAX; /* no chunk of it will be hashed here */
    wtensor *wt = &w->tensors[w->n_tensors++];
    *wt = (wtensor){name,
                    {0},
                    t->info.ndim,
                    shape,
                    t->info.nbytes,
                    (uint32_t)(w->n_files - 1),
                    first_extent + (t->extent_index - f->first_extent),
                    t->extent_offset,
                    th,
                    NULL};
    snprintf(wt->dtype, sizeof wt->dtype, "%s", t->dtype);
    return 0;
}

int ckpt_writer_copy_file(ckpt_writer *w, const char *path, uint32_t mode, int64_t mtime_sec,
                          uint32_t mtime_nsec, ckpt_pack *src, size_t file_index, ckpt_err *err)
{
    if (file_index >= src->n_files)
        return ckpt_fail(err, -EINVAL, "%s: no file %zu in %s", w->final_path, file_index,
                         src->path);
    const file_rec *f = &src->files[file_index];
    /* Chunks are cut at the chunk size and sealed or checksummed by the
     * pack's encryption: copied as they are only where both agree. The
     * caller packs the file from its decoded bytes otherwise. */
    if (src->chunk_size != w->chunk_size || (src->keys.subkey != NULL) != (w->keys.subkey != NULL))
        return -EXDEV;
    /* A part of an assembled tensor (a DCP chunk) is packed again instead:
     * the assembled tensor's hash chains over the bytes of all its parts,
     * which only the encoder sees. */
    for (size_t i = 0; i < src->n_stored; i++)
        if (src->tensors[i].info.file_index == file_index &&
            (src->tensors[i].info.part_of != SIZE_MAX ||
             strmap_get(&w->tensor_map, src->tensors[i].info.name) >= 0))
            return -EXDEV;
    int rc = ckpt_writer_begin_file(w, path, mode, mtime_sec, mtime_nsec, err);
    if (rc == 0)
        rc = ckpt_writer_set_container(w, f->info.container, f->info.note, err);
    if (rc < 0)
        return rc;
    wfile *wf = &w->files[w->n_files - 1];
    free(wf->hash);
    wf->hash = NULL;
    memcpy(wf->sha256, f->info.sha256, 32);
    uint64_t first_extent = w->n_extents;
    for (size_t x = f->first_extent; rc == 0 && x < f->first_extent + f->n_extents; x++) {
        const extent *e = &src->extents[x];
        rc = writer_open_extent(w, e->kind, e->elem_size, err);
        uint64_t n_chunks = (e->length + src->chunk_size - 1) / src->chunk_size;
        for (uint64_t k = 0; rc == 0 && k < n_chunks; k++) {
            uint64_t id = e->first_chunk + k;
            const chunk *c = &src->chunks[id];
            if ((rc = writer_acquire_slot(w, err)) < 0)
                break;
            wslot *s = w->filling;
            ckpt_err why = {0};
            ssize_t got = src->obj->ops->read_at(src->obj, s->out, c->stored_size, c->offset, &why);
            if (got != (ssize_t)c->stored_size) {
                rc = ckpt_fail(err, got < 0 ? (int)got : -EIO,
                               "%s: cannot copy chunk %llu of %s: %s", w->final_path,
                               (unsigned long long)id, src->path,
                               why.msg[0] ? why.msg : "short read");
                /* The slot goes through the pipeline empty, so none waits on it. */
                s->in_len = 0;
                s->copy_src = NULL;
                writer_set_failed(w, err);
                writer_submit_slot(w);
                break;
            }
            s->copy_src = src;
            s->copy_src_id = id;
            s->in_len = c->raw_size;
            s->out_len = c->stored_size;
            s->codec = c->codec;
            s->elem = c->elem_size;
            s->crc = c->crc;
            w->file_bytes += c->raw_size;
            w->fed += c->raw_size;
            writer_submit_slot(w);
        }
        if (rc == 0)
            writer_close_extent(w);
    }
    for (size_t i = 0; rc == 0 && i < src->n_stored; i++) /* assembled: none here */
        if (src->tensors[i].info.file_index == file_index)
            rc = copy_tensor(w, src, i, first_extent, err);
    if (rc == -EXDEV)
        rc = ckpt_fail(err, -EIO, "%s: tensor names changed while copying %s", w->final_path, path);
    for (size_t i = 0; rc == 0 && i < src->n_skipped; i++)
        if (src->skipped[i].file_index == file_index)
            rc = writer_add_skipped(w, src->skipped[i].name, src->skipped[i].reason, err);
    if (rc < 0) {
        w->in_file = 0;
        return rc;
    }
    return ckpt_writer_end_file(w, err);
}
