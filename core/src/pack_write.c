/* The streaming writer. Four stages run at once: the caller's thread cuts
 * the files into chunk slots, reading nothing itself where the bytes come
 * from a source (writer_feed_from: the read is left in the slot); worker
 * threads read, compress, encrypt, checksum and hash the tensors of slots;
 * one output thread appends the encoded chunks to the pack in order (not
 * the workers at their own offsets: their concurrent writes to the one
 * file queue on its inode lock, whose waiters spin, and on 16 cores that
 * made a pack 1.6x slower than one appending thread); one hash thread computes the SHA-256 of small files from the slots (a file's
 * hash is one chain over all its bytes, so it is the one serial per-byte
 * stage, overlapped with everything else: about 2 GB/s per file with
 * SHA-NI). Slots are used round-robin, so order is kept without any
 * reordering buffer. A big file read from a descriptor or a shared source
 * is hashed instead by a hash lane that reads it again (hash_lanes.h), so
 * that several files' chains run at once rather than one after another
 * through the ring; a tree walk and ckptfs's packer queue their big files'
 * lanes before the writer reaches them (lanes_ahead.h, writer_prehash).
 *
 * A tensor's SHA-256 is a chain too, but tensors are many: the worker that
 * encoded a chunk hashes the chunk's part of each tensor whose previous
 * chunk is hashed, and parks the others for the worker that hashes that
 * one (hash_tensor_parts). The pack goes to a
 * store_upload (store/store.h): nothing is visible under its name until
 * finish commits it.
 *
 * One job at about 1,370 lines: the pipeline's stages share the slot ring and
 * its one lock (writer_state.h), and the index written at finish is the
 * record of what they produced, so splitting them would spread one state
 * machine over files. Feeding it from disk is ingest_files.c; files copied
 * from an earlier generation are pack_copy.c. */
#include "writer_state.h"
#include "sha256.h"
#include "codec.h"
#include "crypto.h"
#include "format.h"
#include "hash_lanes.h"
#include "pack.h"
#include "store/store.h"

#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zlib.h>

static int writer_failed(ckpt_writer *w, ckpt_err *err)
{
    pthread_mutex_lock(&w->mu);
    int f = w->failed;
    if (f && err)
        *err = w->fail_err;
    pthread_mutex_unlock(&w->mu);
    return f ? (w->fail_err.code ? w->fail_err.code : -EIO) : 0;
}

void writer_set_failed(ckpt_writer *w, const ckpt_err *e)
{
    pthread_mutex_lock(&w->mu);
    if (!w->failed) {
        w->failed = 1;
        w->fail_err = *e;
    }
    pthread_cond_broadcast(&w->to_fill);
    pthread_cond_broadcast(&w->to_write);
    pthread_mutex_unlock(&w->mu);
}

/* A copied chunk's payload, for the seal that follows: in an encrypted pack
 * its plaintext payload (opened under the source pack's key, nonce and
 * associated data, so a damaged or moved chunk fails with -EBADMSG) in
 * payload; unencrypted, the stored bytes as they are, already in s->out.
 * Never decoded: the codec, its planes and the CRC stay as they were. */
static int copied_payload(const ckpt_writer *w, const wslot *s, uint8_t *payload, size_t *plen)
{
    const ckpt_pack *src = s->copy_src;
    if (!w->keys.subkey) {
        *plen = s->out_len;
        return 0;
    }
    if (!payload)
        return -ENOMEM;
    const chunk *c = &src->chunks[s->copy_src_id];
    const extent *e = &src->extents[c->extent_index];
    uint8_t ad[CHUNK_AD_BYTES];
    chunk_ad(ad, src->pack_id, s->copy_src_id, c->extent_index, s->copy_src_id - e->first_chunk,
             c->raw_size, c->codec, c->elem_size);
    if (c->stored_size < TPACK_AEAD_TAG)
        return -EBADMSG;
    *plen = c->stored_size - TPACK_AEAD_TAG;
    int rc = aead_open(&src->keys, s->copy_src_id, ad, sizeof ad, s->out, c->stored_size, payload);
    return rc;
}

/* Reads the slot's bytes that writer_feed_from left to the worker (none
 * once the writer failed: the pack is lost and the source may be gone). */
static void run_fills(ckpt_writer *w, wslot *s)
{
    for (unsigned i = 0; i < s->n_fills; i++) {
        const wfill *f = &s->fills[i];
        pthread_mutex_lock(&w->mu);
        int failed = w->failed;
        pthread_mutex_unlock(&w->mu);
        ckpt_err e = {0};
        if (!failed && f->fill(f->ud, s->in + f->dst, f->n, f->src_off, &e) < 0)
            writer_set_failed(w, &e);
    }
    s->n_fills = 0;
}

/* The tensor's span sp of chunk s, whose turn it is, then each of the
 * tensor's next chunks whose span was parked meanwhile. Always advanced,
 * failed or not, so that nothing waits on a chunk that will not come.
 * parked: s holds sp for this call (a reference in pending). */
static void hash_tensor_parts(ckpt_writer *w, wslot *s, wspan *sp, int parked)
{
    tensor_hash *th = sp->th;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int failed = w->failed;
        pthread_mutex_unlock(&w->mu);
        if (!failed) {
            ckpt_sha256_update(&th->st, s->in + sp->a, sp->b - sp->a);
            if (sp->last)
                ckpt_sha256_final(&th->st, th->digest);
        }
        uint64_t next = s->id + 1;
        pthread_mutex_lock(&w->mu);
        th->next_id = next;
        pthread_cond_broadcast(&w->tensor_hashed);
        if (parked && --s->pending == 0) {
            s->state = SLOT_FREE;
            pthread_cond_broadcast(&w->to_fill);
        }
        /* A slot holds chunk next only while it is in flight; one with a
         * span parked is in flight (pending), so its id is settled. */
        wslot *n = &w->slots[next % w->n_slots];
        wspan *found = NULL;
        if (!sp->last && n->n_parked && n->id == next)
            for (size_t i = 0; i < n->n_spans && !found; i++)
                if (n->spans[i].parked && n->spans[i].th == th)
                    found = &n->spans[i];
        if (found) {
            found->parked = 0;
            n->n_parked--;
        }
        pthread_mutex_unlock(&w->mu);
        if (!found)
            return;
        s = n;
        sp = found;
        parked = 1;
    }
}

static void *encode_worker(void *arg)
{
    ckpt_writer *w = arg;
    pthread_setname_np(pthread_self(), "ckpt-encode");
    chunk_encoder enc;
    chunk_encoder_init(&enc);
    uint8_t *payload = w->keys.subkey ? malloc(w->chunk_size + TPACK_CHUNK_OVERHEAD) : NULL;
    if (w->keys.subkey && !payload) {
        ckpt_err e;
        ckpt_fail(&e, -ENOMEM, "%s: out of memory", w->final_path);
        writer_set_failed(w, &e);
    }
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stopping && w->next_encode >= w->submitted)
            pthread_cond_wait(&w->to_encode, &w->mu);
        if (w->next_encode >= w->submitted)
            break;
        wslot *s = &w->slots[w->next_encode++ % w->n_slots];
        pthread_mutex_unlock(&w->mu);
        if (!s->filled) {
            run_fills(w, s);
            pthread_mutex_lock(&w->mu);
            s->filled = 1;
            w->fills_pending--;
            pthread_cond_broadcast(&w->slot_filled);
            pthread_mutex_unlock(&w->mu);
        }
        int rc = -ENOMEM;
        uint8_t *dst = payload ? payload : s->out;
        size_t plen = 0;
        if (s->copy_src) {
            rc = copied_payload(w, s, payload, &plen);
            if (rc == -EBADMSG) {
                ckpt_err e;
                char where[512];
                pack_chunk_where(s->copy_src, (size_t)s->copy_src_id, where, sizeof where);
                ckpt_fail(
                    &e, -EIO, "%s: cannot copy chunk %llu of %s (%s): it fails authentication",
                    w->final_path, (unsigned long long)s->copy_src_id, s->copy_src->path, where);
                writer_set_failed(w, &e);
                rc = 0;
            }
        } else if (dst) {
            rc = chunk_encode(&enc, s->in, s->in_len, s->opaque ? 0 : s->elem, w->level, dst, &plen,
                              &s->codec, &s->elem);
        }
        if (rc == 0 && payload) {
            uint8_t ad[CHUNK_AD_BYTES];
            chunk_ad(ad, w->pack_id, s->id, s->extent_id, s->in_extent, (uint32_t)s->in_len,
                     s->codec, s->elem);
            rc = aead_seal(&w->keys, s->id, ad, sizeof ad, payload, plen, s->out);
            plen += TPACK_AEAD_TAG;
        }
        /* Encrypted chunks are authenticated by their tag; a CRC would only cost
         * decode time. A copied chunk keeps the CRC its source recorded. */
        if (!s->copy_src)
            s->crc = payload ? 0 : (uint32_t)libdeflate_crc32(0, s->in, s->in_len);
        if (s->job)
            s->src_crc = payload ? (uint32_t)libdeflate_crc32(0, s->in, s->in_len) : s->crc;
        s->out_len = plen;
        if (rc < 0) {
            ckpt_err e;
            ckpt_fail(&e, rc, "%s: out of memory while compressing", w->final_path);
            writer_set_failed(w, &e);
        }
        /* The chunk's part of each tensor, in chunk order. A part whose
         * tensor's previous chunk is not hashed yet is parked for the
         * worker that hashes that one, so that no worker sleeps while a
         * big tensor's SHA-256 chain goes by, one chunk at a time (on 16
         * cores, that wait cost a third of `ckpt pack`'s time). A part that
         * also feeds an assembled tensor's chain waits its turn instead. */
        for (size_t i = 0; i < s->n_spans; i++) {
            wspan *sp = &s->spans[i];
            pthread_mutex_lock(&w->mu);
            if (sp->th->next_id != s->id && !sp->ch) {
                sp->parked = 1;
                s->n_parked++;
                s->pending++;
                pthread_mutex_unlock(&w->mu);
                continue;
            }
            while (sp->th->next_id != s->id)
                pthread_cond_wait(&w->tensor_hashed, &w->mu);
            pthread_mutex_unlock(&w->mu);
            hash_tensor_parts(w, s, sp, 0);
            if (sp->ch) {
                pthread_mutex_lock(&w->mu);
                while (sp->ch->next_seq != sp->seq)
                    pthread_cond_wait(&w->tensor_hashed, &w->mu);
                int failed = w->failed;
                pthread_mutex_unlock(&w->mu);
                if (!failed)
                    ckpt_sha256_update(&sp->ch->st, s->in + sp->a, sp->b - sp->a);
                pthread_mutex_lock(&w->mu);
                sp->ch->next_seq++;
                pthread_cond_broadcast(&w->tensor_hashed);
                pthread_mutex_unlock(&w->mu);
            }
        }
        pthread_mutex_lock(&w->mu);
        s->state = SLOT_ENCODED;
        pthread_cond_broadcast(&w->to_write);
    }
    pthread_mutex_unlock(&w->mu);
    chunk_encoder_free(&enc);
    free(payload);
    return NULL;
}

static void *output_worker(void *arg)
{
    ckpt_writer *w = arg;
    pthread_setname_np(pthread_self(), "ckpt-output");
    pthread_mutex_lock(&w->mu);
    for (;;) {
        wslot *s = &w->slots[w->next_write % w->n_slots];
        while (!(w->next_write < w->submitted && s->state == SLOT_ENCODED) &&
               !(w->stopping && w->next_write >= w->submitted))
            pthread_cond_wait(&w->to_write, &w->mu);
        if (w->next_write >= w->submitted)
            break;
        int failed = w->failed;
        pthread_mutex_unlock(&w->mu);
        if (!failed) {
            ckpt_err e;
            int rc = w->out->ops->write(w->out, s->out, s->out_len, &e);
            if (rc == 0 &&
                grow_array((void **)&w->chunks, &w->cap_chunks, w->n_chunks, sizeof *w->chunks) < 0)
                rc = ckpt_fail(&e, -ENOMEM, "%s: out of memory", w->final_path);
            if (rc < 0) {
                writer_set_failed(w, &e);
            } else {
                w->chunks[w->n_chunks++] = (wchunk){
                    w->write_pos, (uint32_t)s->out_len, (uint32_t)s->in_len, s->crc, s->codec,
                    s->elem};
                w->write_pos += s->out_len;
                /* In chunk order, so this is the CRC of the file's bytes so far. */
                if (s->job)
                    s->job->fed_crc =
                        (uint32_t)crc32_combine(s->job->fed_crc, s->src_crc, (z_off_t)s->in_len);
            }
        }
        pthread_mutex_lock(&w->mu);
        s->state = SLOT_WRITTEN;
        if (--s->pending == 0)
            s->state = SLOT_FREE;
        w->next_write++;
        pthread_cond_broadcast(&w->to_fill);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Each file's SHA-256, over its chunks in order, as soon as they are
 * submitted: in parallel with their encoding and writing. */
static void *hash_worker(void *arg)
{
    ckpt_writer *w = arg;
    pthread_setname_np(pthread_self(), "ckpt-hash");
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stopping && w->next_hash >= w->submitted)
            pthread_cond_wait(&w->to_hash, &w->mu);
        if (w->next_hash >= w->submitted)
            break;
        wslot *s = &w->slots[w->next_hash % w->n_slots];
        while (!s->filled)
            pthread_cond_wait(&w->slot_filled, &w->mu);
        int failed = w->failed;
        pthread_mutex_unlock(&w->mu);
        /* A copied file's SHA-256 comes with it (its slots hold no plaintext);
         * a file with a hash lane is hashed there. */
        if (!failed && s->file_hash && !s->copy_src)
            ckpt_sha256_update(s->file_hash, s->in, s->in_len);
        pthread_mutex_lock(&w->mu);
        w->next_hash++;
        if (--s->pending == 0)
            s->state = SLOT_FREE;
        pthread_cond_broadcast(&w->to_fill);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ------------------------------------------------------------ producer */

int writer_acquire_slot(ckpt_writer *w, ckpt_err *err)
{
    pthread_mutex_lock(&w->mu);
    uint64_t seq = w->submitted;
    wslot *s = &w->slots[seq % w->n_slots];
    while (s->state != SLOT_FREE && !w->failed)
        pthread_cond_wait(&w->to_fill, &w->mu);
    int failed = w->failed;
    pthread_mutex_unlock(&w->mu);
    if (failed)
        return writer_failed(w, err);
    wextent *e = &w->extents[w->n_extents - 1];
    s->state = SLOT_FILLING;
    s->in_len = 0;
    s->id = seq;
    s->extent_id = w->n_extents - 1;
    s->in_extent = seq - e->first_chunk;
    s->elem = e->elem;
    s->opaque = e->kind == EXTENT_DATA;
    s->n_spans = 0;
    s->n_fills = 0;
    s->filled = 0;
    s->pending = 2;
    s->job = w->files[w->n_files - 1].job;
    s->file_hash = s->job ? NULL : w->files[w->n_files - 1].hash;
    s->copy_src = NULL;
    w->filling = s;
    return 0;
}

/* Hands the chunk's part of each live tensor to the workers, which hash
 * tensors in chunk order; tensors that end in this chunk stop being
 * live. Spans are fixed here because the producer may add views to the
 * extent while earlier chunks are still being written. */
static int slot_spans(ckpt_writer *w, wslot *s)
{
    uint64_t a = s->in_extent * w->chunk_size, b = a + s->in_len;
    size_t keep = 0;
    for (size_t i = 0; i < w->n_live; i++) {
        const wtensor *t = &w->tensors[w->live[i]];
        uint64_t ts = t->extent_offset, te = ts + t->nbytes;
        if (ts < b && te > a) {
            if (grow_array((void **)&s->spans, &s->cap_spans, s->n_spans, sizeof *s->spans) < 0)
                return -ENOMEM;
            uint64_t lo = ts > a ? ts : a, hi = te < b ? te : b;
            /* Its first chunk: the workers hash its chunks from here on, in order. */
            if (ts >= a)
                t->hash->next_id = s->id;
            s->spans[s->n_spans++] = (wspan){.th = t->hash,
                                             .a = (uint32_t)(lo - a),
                                             .b = (uint32_t)(hi - a),
                                             .last = te <= b,
                                             .ch = t->chain,
                                             .seq = t->chain ? t->chain->assigned++ : 0};
        }
        if (te > b)
            w->live[keep++] = w->live[i];
    }
    w->n_live = keep;
    return 0;
}

void writer_submit_slot(ckpt_writer *w)
{
    wslot *s = w->filling;
    w->filling = NULL;
    if (slot_spans(w, s) < 0) {
        ckpt_err e;
        ckpt_fail(&e, -ENOMEM, "%s: out of memory", w->final_path);
        writer_set_failed(w, &e);
    }
    w->extents[w->n_extents - 1].length += s->in_len;
    pthread_mutex_lock(&w->mu);
    s->state = SLOT_QUEUED;
    if (s->n_fills)
        w->fills_pending++;
    else
        s->filled = 1;
    w->submitted++;
    pthread_cond_signal(&w->to_encode);
    pthread_cond_signal(&w->to_hash);
    pthread_mutex_unlock(&w->mu);
    if (w->opts.progress)
        w->opts.progress(w->opts.progress_ud, w->fed, w->opts.progress_total);
}

int writer_open_extent(ckpt_writer *w, uint8_t kind, uint8_t elem, ckpt_err *err)
{
    if (grow_array((void **)&w->extents, &w->cap_extents, w->n_extents, sizeof *w->extents) < 0)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    w->extents[w->n_extents++] = (wextent){0, w->submitted, kind, elem};
    w->files[w->n_files - 1].n_extents++;
    w->extent_open = 1;
    return 0;
}

void writer_close_extent(ckpt_writer *w)
{
    if (w->filling)
        writer_submit_slot(w);
    w->extent_open = 0;
}

/* Appends bytes to the open extent, cutting chunks as slots fill: len bytes
 * of data, or when data is NULL, len bytes that fill() reads from src_off on
 * straight into the slots (one copy fewer on the caller's thread, which is
 * the pack's one reader). */
static int feed(ckpt_writer *w, const uint8_t *data, writer_fill_fn fill, void *ud,
                uint64_t src_off, uint64_t len, ckpt_err *err)
{
    w->file_bytes += len;
    while (len) {
        if (!w->filling) {
            int rc = writer_acquire_slot(w, err);
            if (rc < 0)
                return rc;
        }
        wslot *s = w->filling;
        size_t n = w->chunk_size - s->in_len;
        if (n > len)
            n = (size_t)len;
        if (data) {
            memcpy(s->in + s->in_len, data, n);
            data += n;
        } else if (s->n_fills < SLOT_FILLS) {
            s->fills[s->n_fills++] = (wfill){fill, ud, src_off, (uint32_t)s->in_len, (uint32_t)n};
            src_off += n;
        } else {
            int rc = fill(ud, s->in + s->in_len, n, src_off, err);
            if (rc < 0)
                return rc;
            src_off += n;
        }
        s->in_len += n;
        len -= n;
        w->fed += n;
        if (w->in_region)
            w->region_bytes += n;
        /* A tensor's last chunk goes out as soon as it is complete. */
        if (s->in_len == w->chunk_size ||
            (w->in_tensor && w->region_bytes == w->tensors[w->cur_tensor].nbytes))
            writer_submit_slot(w);
    }
    return writer_failed(w, err);
}

int ckpt_writer_begin_file(ckpt_writer *w, const char *path, uint32_t mode, int64_t mtime_sec,
                           uint32_t mtime_nsec, ckpt_err *err)
{
    if (w->in_file)
        return ckpt_fail(err, -EINVAL, "%s: begin_file('%s') inside another file", w->final_path,
                         path);
    if (!ckpt_path_is_safe(path))
        return ckpt_fail(err, -EINVAL,
                         "%s: unsafe path '%s' (absolute, empty, '.', '..' or too long)",
                         w->final_path, path);
    if (strlen(path) > UINT16_MAX)
        return ckpt_fail(err, -EINVAL, "%s: path too long", w->final_path);
    if (strmap_get(&w->file_map, path) >= 0)
        return ckpt_fail(err, -EEXIST, "%s: duplicate path '%s'", w->final_path, path);
    if (strmap_get(&w->dir_map, path) >= 0)
        return ckpt_fail(err, -EEXIST, "%s: '%s' is already a directory in the pack", w->final_path,
                         path);
    char *copy = strdup(path);
    ckpt_sha256 *fh = malloc(sizeof *fh);
    if (!copy || !fh ||
        grow_array((void **)&w->files, &w->cap_files, w->n_files, sizeof *w->files) < 0) {
        free(copy);
        free(fh);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    char tmp[4096];
    for (const char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
        memcpy(tmp, path, (size_t)(s - path));
        tmp[s - path] = 0;
        if (strmap_get(&w->file_map, tmp) >= 0) {
            free(copy);
            free(fh);
            return ckpt_fail(err, -EEXIST, "%s: '%s' is already a file in the pack", w->final_path,
                             tmp);
        }
    }
    for (const char *s = strchr(copy, '/'); s; s = strchr(s + 1, '/')) {
        /* Directory keys live in a copy owned by the map entry list below. */
        char *dir = strndup(copy, (size_t)(s - copy));
        if (!dir) {
            free(copy);
            free(fh);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        if (strmap_put(&w->dir_map, dir, 0, NULL) != 0)
            free(dir);
    }
    if (strmap_put(&w->file_map, copy, w->n_files, NULL) < 0) {
        free(copy);
        free(fh);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    ckpt_sha256_init(fh);
    w->files[w->n_files++] =
        (wfile){copy, mode & 07777,   mtime_sec, mtime_nsec, 0,   {0}, w->n_extents,
                0,    CONTAINER_NONE, NULL,      fh,         NULL};
    w->file_bytes = 0;
    w->in_file = 1;
    return 0;
}

int ckpt_writer_write(ckpt_writer *w, const void *data, size_t len, ckpt_err *err)
{
    if (!w->in_file || w->in_region)
        return ckpt_fail(err, -EINVAL, "%s: write outside a file or inside a tensor or region",
                         w->final_path);
    if (!w->extent_open) {
        int rc = writer_open_extent(w, EXTENT_DATA, 1, err);
        if (rc < 0)
            return rc;
    }
    return feed(w, data, NULL, NULL, 0, len, err);
}

/* Registers a tensor of the current file over [extent_offset, +nbytes) of
 * the open typed extent and makes it live; *idx is its index. */
static int new_tensor(ckpt_writer *w, const char *what, const char *name, const char *dtype,
                      uint32_t ndim, const uint64_t *shape, uint64_t extent_offset, size_t *idx,
                      ckpt_err *err)
{
    if (!name || !*name || strlen(name) > UINT16_MAX)
        return ckpt_fail(err, -EINVAL, "%s: invalid %s name", w->final_path, what);
    if (!ckpt_dtype_size(dtype))
        return ckpt_fail(err, -EINVAL, "%s: %s '%s': unknown dtype '%s'", w->final_path, what, name,
                         dtype ? dtype : "");
    if (ndim > 64)
        return ckpt_fail(err, -EINVAL, "%s: %s '%s': too many dimensions (%u)", w->final_path, what,
                         name, ndim);
    uint64_t nbytes;
    if (ckpt_tensor_bytes(dtype, ndim, shape, &nbytes) < 0)
        return ckpt_fail(err, -EINVAL, "%s: %s '%s': shape overflows", w->final_path, what, name);
    if (strmap_get(&w->tensor_map, name) >= 0)
        return ckpt_fail(err, -EEXIST, "%s: duplicate tensor name '%s'", w->final_path, name);
    if (grow_array((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors) < 0 ||
        grow_array((void **)&w->live, &w->cap_live, w->n_live, sizeof *w->live) < 0)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->shape = malloc((ndim ? ndim : 1) * sizeof *t->shape);
    t->hash = malloc(sizeof *t->hash);
    if (!t->name || !t->shape || !t->hash ||
        strmap_put(&w->tensor_map, t->name, w->n_tensors, NULL) < 0) {
        free(t->name);
        free(t->shape);
        free(t->hash);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, ndim * sizeof *shape);
    t->nbytes = nbytes;
    t->file_index = (uint32_t)(w->n_files - 1);
    t->extent_index = w->n_extents - 1;
    t->extent_offset = extent_offset;
    ckpt_sha256_init(&t->hash->st);
    if (nbytes == 0)
        ckpt_sha256_final(&t->hash->st, t->hash->digest);
    else
        w->live[w->n_live++] = w->n_tensors;
    *idx = w->n_tensors++;
    return 0;
}

/* Opens a typed extent of dtype's element size, closing opaque data. */
static int open_region(ckpt_writer *w, const char *what, const char *name, const char *dtype,
                       ckpt_err *err)
{
    if (!w->in_file || w->in_region)
        return ckpt_fail(err, -EINVAL,
                         "%s: %s '%s' outside a file or inside another tensor or region",
                         w->final_path, what, name);
    unsigned es = ckpt_dtype_size(dtype);
    if (!es)
        return ckpt_fail(err, -EINVAL, "%s: %s '%s': unknown dtype '%s'", w->final_path, what, name,
                         dtype ? dtype : "");
    if (w->extent_open)
        writer_close_extent(w);
    int rc = writer_open_extent(w, EXTENT_TYPED, (uint8_t)es, err);
    if (rc < 0)
        return rc;
    w->in_region = 1;
    w->region_bytes = 0;
    w->n_live = 0;
    return 0;
}

/* Closes the open typed extent. Every tensor in it must end inside it. */
static int close_region(ckpt_writer *w, ckpt_err *err)
{
    writer_close_extent(w);
    w->in_region = 0;
    w->in_tensor = 0;
    if (w->n_live) {
        const wtensor *t = &w->tensors[w->live[0]];
        uint64_t start = w->file_bytes - w->region_bytes;
        ckpt_err e;
        ckpt_fail(
            &e, -EINVAL,
            "%s: view '%s' (file bytes %llu to %llu) runs past the end of its region at %llu: a view must lie "
            "inside one region; it spans two extents",
            w->final_path, t->name, (unsigned long long)(start + t->extent_offset),
            (unsigned long long)(start + t->extent_offset + t->nbytes),
            (unsigned long long)w->file_bytes);
        w->n_live = 0;
        /* Its digest can never be finished: the pack cannot be completed. */
        writer_set_failed(w, &e);
        if (err)
            *err = e;
        return e.code;
    }
    return writer_failed(w, err);
}

int ckpt_writer_begin_tensor(ckpt_writer *w, const char *name, const char *dtype, uint32_t ndim,
                             const uint64_t *shape, ckpt_err *err)
{
    uint64_t nbytes;
    if (!name || !*name || strlen(name) > UINT16_MAX)
        return ckpt_fail(err, -EINVAL, "%s: invalid tensor name", w->final_path);
    if (dtype && ckpt_dtype_size(dtype) && ndim <= 64 &&
        ckpt_tensor_bytes(dtype, ndim, shape, &nbytes) < 0)
        return ckpt_fail(err, -EINVAL, "%s: tensor '%s': shape overflows", w->final_path, name);
    if (strmap_get(&w->tensor_map, name) >= 0)
        return ckpt_fail(err, -EEXIST, "%s: duplicate tensor name '%s'", w->final_path, name);
    if (ndim > 64)
        return ckpt_fail(err, -EINVAL, "%s: tensor '%s': too many dimensions (%u)", w->final_path,
                         name, ndim);
    int rc = open_region(w, "tensor", name, dtype, err);
    if (rc == 0)
        rc = new_tensor(w, "tensor", name, dtype, ndim, shape, 0, &w->cur_tensor, err);
    if (rc < 0) {
        if (w->in_region) {
            w->in_region = 0;
            w->extent_open = 0;
        } /* an empty extent is harmless */
        return rc;
    }
    w->in_tensor = 1;
    return 0;
}

int ckpt_writer_begin_region(ckpt_writer *w, const char *dtype, ckpt_err *err)
{
    return open_region(w, "region of", dtype ? dtype : "", dtype, err);
}

int ckpt_writer_add_view(ckpt_writer *w, const char *name, const char *dtype, uint32_t ndim,
                         const uint64_t *shape, uint64_t file_offset, ckpt_err *err)
{
    const char *n = name ? name : "";
    if (!w->in_file || !w->in_region)
        return ckpt_fail(
            err, -EINVAL,
            "%s: view '%s': no region is open (a view lies inside a region or tensor of the "
            "current file)",
            w->final_path, n);
    const wextent *e = &w->extents[w->n_extents - 1];
    unsigned es = ckpt_dtype_size(dtype);
    if (es && es != e->elem)
        return ckpt_fail(err, -EINVAL,
                         "%s: view '%s': %s has %u-byte elements but its region holds %u-byte ones",
                         w->final_path, n, dtype, es, e->elem);
    uint64_t start = w->file_bytes - w->region_bytes;
    if (file_offset < start)
        return ckpt_fail(
            err, -EINVAL,
            "%s: view '%s' starts at file offset %llu, before its region (at %llu): a view "
            "must lie inside one region",
            w->final_path, n, (unsigned long long)file_offset, (unsigned long long)start);
    if (file_offset < w->file_bytes)
        return ckpt_fail(
            err, -EINVAL,
            "%s: view '%s' starts at file offset %llu, but the file's bytes up to %llu were "
            "already written: add a view before its bytes",
            w->final_path, n, (unsigned long long)file_offset, (unsigned long long)w->file_bytes);
    size_t idx;
    return new_tensor(w, "view", name, dtype, ndim, shape, file_offset - start, &idx, err);
}

int ckpt_writer_tensor_data(ckpt_writer *w, const void *data, size_t len, ckpt_err *err)
{
    if (!w->in_region)
        return ckpt_fail(err, -EINVAL, "%s: tensor data outside a tensor or region", w->final_path);
    if (w->in_tensor) {
        const wtensor *t = &w->tensors[w->cur_tensor];
        if (len > t->nbytes - w->region_bytes)
            return ckpt_fail(err, -EINVAL, "%s: tensor '%s': more data than its %llu bytes",
                             w->final_path, t->name, (unsigned long long)t->nbytes);
    }
    return feed(w, data, NULL, NULL, 0, len, err);
}

int writer_feed_from(ckpt_writer *w, int tensor, writer_fill_fn fill, void *ud, uint64_t src_off,
                     uint64_t len, ckpt_err *err)
{
    if (!tensor) {
        if (!w->in_file || w->in_region)
            return ckpt_fail(err, -EINVAL, "%s: write outside a file or inside a tensor or region",
                             w->final_path);
        if (!w->extent_open) {
            int rc = writer_open_extent(w, EXTENT_DATA, 1, err);
            if (rc < 0)
                return rc;
        }
    } else {
        if (!w->in_region)
            return ckpt_fail(err, -EINVAL, "%s: tensor data outside a tensor or region",
                             w->final_path);
        if (w->in_tensor && len > w->tensors[w->cur_tensor].nbytes - w->region_bytes)
            return ckpt_fail(err, -EINVAL, "%s: tensor '%s': more data than its %llu bytes",
                             w->final_path, w->tensors[w->cur_tensor].name,
                             (unsigned long long)w->tensors[w->cur_tensor].nbytes);
    }
    return feed(w, NULL, fill, ud, src_off, len, err);
}

int writer_wait_fills(ckpt_writer *w, ckpt_err *err)
{
    if (w->filling)
        run_fills(w, w->filling);
    pthread_mutex_lock(&w->mu);
    while (w->fills_pending)
        pthread_cond_wait(&w->slot_filled, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return writer_failed(w, err);
}

int ckpt_writer_end_tensor(ckpt_writer *w, ckpt_err *err)
{
    if (!w->in_tensor)
        return ckpt_fail(err, -EINVAL, "%s: end_tensor outside a tensor", w->final_path);
    const wtensor *t = &w->tensors[w->cur_tensor];
    if (w->region_bytes != t->nbytes)
        return ckpt_fail(err, -EINVAL, "%s: tensor '%s' got %llu of its %llu bytes", w->final_path,
                         t->name, (unsigned long long)w->region_bytes,
                         (unsigned long long)t->nbytes);
    return close_region(w, err);
}

int ckpt_writer_end_region(ckpt_writer *w, ckpt_err *err)
{
    if (!w->in_region || w->in_tensor)
        return ckpt_fail(err, -EINVAL, "%s: end_region outside a region", w->final_path);
    return close_region(w, err);
}

int ckpt_writer_set_container(ckpt_writer *w, const char *container, const char *note,
                              ckpt_err *err)
{
    if (!w->in_file)
        return ckpt_fail(err, -EINVAL, "%s: set_container outside a file", w->final_path);
    int code = ckpt_container_code(container ? container : "");
    if (code < 0)
        return ckpt_fail(err, -EINVAL, "%s: unknown container '%s'", w->final_path, container);
    size_t len = note ? strlen(note) : 0;
    if (len > TPACK_NOTE_MAX)
        return ckpt_fail(err, -EINVAL, "%s: note of %zu bytes is longer than %u", w->final_path,
                         len, TPACK_NOTE_MAX);
    if (!ckpt_utf8_valid((const uint8_t *)note, len))
        return ckpt_fail(err, -EINVAL, "%s: note is not UTF-8", w->final_path);
    wfile *f = &w->files[w->n_files - 1];
    char *copy = len ? strdup(note) : NULL;
    if (len && !copy)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    free(f->note);
    f->note = copy;
    f->container = (uint8_t)code;
    return 0;
}

int writer_add_skipped(ckpt_writer *w, const char *name, const char *reason, ckpt_err *err)
{
    if (!w->in_file)
        return ckpt_fail(err, -EINVAL, "%s: a skipped tensor outside a file", w->final_path);
    size_t nl = strlen(name), rl = strlen(reason);
    /* Parsers' names and reasons are bounded, but the index fields are u16. */
    if (nl == 0 || nl > UINT16_MAX || rl > TPACK_NOTE_MAX ||
        !ckpt_utf8_valid((const uint8_t *)reason, rl))
        return ckpt_fail(err, -EINVAL, "%s: skipped tensor name or reason out of range",
                         w->final_path);
    if (w->n_skipped >= UINT32_MAX)
        return ckpt_fail(err, -EOVERFLOW, "%s: too many skipped tensors", w->final_path);
    char *n = strdup(name), *r = strdup(reason);
    if (!n || !r ||
        grow_array((void **)&w->skipped, &w->cap_skipped, w->n_skipped, sizeof *w->skipped) < 0) {
        free(n);
        free(r);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    w->skipped[w->n_skipped++] = (ckpt_skipped_info){n, r, w->n_files - 1};
    return 0;
}

/* ---------------------------------------------------- assembled tensors */

/* The group of whole in scope, made on first sight; NULL when out of memory. */
static wgroup *group_of(ckpt_writer *w, const char *scope, const char *whole, const char *dtype,
                        uint32_t ndim, const uint64_t *shape)
{
    /* The length first, so that no two (scope, whole) pairs share a key. */
    char *key;
    if (asprintf(&key, "%zu:%s%s", strlen(scope), scope, whole) < 0)
        return NULL;
    long at = strmap_get(&w->group_map, key);
    if (at >= 0) {
        free(key);
        return &w->groups[at];
    }
    if (grow_array((void **)&w->groups, &w->cap_groups, w->n_groups, sizeof *w->groups) < 0) {
        free(key);
        return NULL;
    }
    wgroup *g = &w->groups[w->n_groups];
    memset(g, 0, sizeof *g);
    g->scope = strdup(scope);
    g->whole = strdup(whole);
    g->shape = malloc(ndim * sizeof *shape);
    g->ch = calloc(1, sizeof *g->ch);
    if (!g->scope || !g->whole || !g->shape || !g->ch ||
        strmap_put(&w->group_map, key, w->n_groups, NULL) < 0) {
        free(g->scope);
        free(g->whole);
        free(g->shape);
        free(g->ch);
        free(key);
        return NULL;
    }
    snprintf(g->dtype, sizeof g->dtype, "%s", dtype);
    g->ndim = ndim;
    memcpy(g->shape, shape, ndim * sizeof *shape);
    ckpt_sha256_init(&g->ch->st);
    w->n_groups++;
    return g;
}

int writer_chunk_of(ckpt_writer *w, const char *scope, const char *whole, uint32_t ndim,
                    const uint64_t *whole_shape, const uint64_t *offsets, ckpt_err *err)
{
    if (!w->in_region || !w->n_tensors ||
        w->tensors[w->n_tensors - 1].extent_index != w->n_extents - 1 ||
        w->tensors[w->n_tensors - 1].extent_offset < w->region_bytes)
        return ckpt_fail(err, -EINVAL,
                         "%s: chunk_of: no tensor was just added, or its bytes have begun",
                         w->final_path);
    if (!whole || !*whole || strlen(whole) > UINT16_MAX || ndim < 1 || ndim > 64)
        return ckpt_fail(err, -EINVAL, "%s: chunk_of: invalid name or rank", w->final_path);
    size_t ti = w->n_tensors - 1;
    wtensor *t = &w->tensors[ti];
    wgroup *g = group_of(w, scope ? scope : "", whole, t->dtype, ndim, whole_shape);
    if (!g)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    if (g->broken)
        return 0;
    /* The chunk must be the next rows of the tensor, whole in every other
     * dimension: then the parts, in the order they come, are the tensor. */
    int fits = strcmp(t->dtype, g->dtype) == 0 && t->ndim == ndim && g->ndim == ndim &&
               offsets[0] == g->rows &&
               memcmp(whole_shape, g->shape, ndim * sizeof *whole_shape) == 0 &&
               t->shape[0] <= g->shape[0] - g->rows;
    for (uint32_t d = 1; fits && d < ndim; d++)
        fits = offsets[d] == 0 && t->shape[d] == g->shape[d];
    if (!fits || grow_array((void **)&g->parts, &g->cap_parts, g->n_parts, sizeof *g->parts) < 0) {
        g->broken = 1; /* out of memory too: the chunks stay as they are */
        return 0;
    }
    g->parts[g->n_parts++] = ti;
    g->rows += t->shape[0];
    t->chain = g->ch;
    return 0;
}

/* At finish, every thread stopped: the groups whose parts tile their
 * tensor become assembled tensors, unless a tensor already has the name
 * (the first group of a name keeps it). */
static int settle_groups(ckpt_writer *w, size_t *n_assembled)
{
    *n_assembled = 0;
    for (size_t i = 0; i < w->n_groups; i++) {
        wgroup *g = &w->groups[i];
        if (g->broken || g->n_parts == 0 || g->rows != g->shape[0] ||
            strmap_get(&w->tensor_map, g->whole) >= 0)
            continue;
        uint64_t nbytes;
        if (ckpt_tensor_bytes(g->dtype, g->ndim, g->shape, &nbytes) < 0)
            continue;
        if (strmap_put(&w->tensor_map, g->whole, w->n_tensors + *n_assembled, NULL) < 0)
            return -ENOMEM;
        ckpt_sha256_final(&g->ch->st, g->digest);
        g->assembled = 1;
        ++*n_assembled;
    }
    return 0;
}

int ckpt_writer_end_file(ckpt_writer *w, ckpt_err *err)
{
    if (!w->in_file || w->in_region)
        return ckpt_fail(err, -EINVAL, "%s: end_file without a file or inside a tensor or region",
                         w->final_path);
    if (w->extent_open)
        writer_close_extent(w);
    wfile *f = &w->files[w->n_files - 1];
    f->size = w->file_bytes;
    w->in_file = 0;
    return writer_failed(w, err);
}

/* --------------------------------------------------------- open/finish */

static void build_header(ckpt_writer *w, uint32_t kdf, const kdf_params *kp,
                         const uint8_t check[16])
{
    uint8_t *h = w->header;
    memset(h, 0, TPACK_HEADER_SIZE);
    memcpy(h + HDR_MAGIC, TPACK_MAGIC, 8);
    put_u32(h + HDR_VERSION, CKPT_FORMAT_VERSION);
    put_u32(h + HDR_SIZE, TPACK_HEADER_SIZE);
    memcpy(h + HDR_PACK_ID, w->pack_id, 16);
    put_u32(h + HDR_FLAGS, w->keys.subkey ? TPACK_FLAG_ENCRYPTED : 0);
    put_u32(h + HDR_CIPHER, w->keys.subkey ? (uint32_t)w->keys.cipher : 0);
    put_u32(h + HDR_KDF, kdf);
    put_u32(h + HDR_CHUNK_SIZE, w->chunk_size);
    if (kdf == TPACK_KDF_ARGON2ID) {
        put_u64(h + HDR_KDF_OPS, kp->ops);
        put_u64(h + HDR_KDF_MEM, kp->mem);
        memcpy(h + HDR_KDF_SALT, kp->salt, 16);
    }
    if (check)
        memcpy(h + HDR_KEY_CHECK, check, 16);
    put_u32(h + HDR_CRC, (uint32_t)crc32(0, h, HDR_CRC));
}

static int setup_keys(ckpt_writer *w, ckpt_err *err)
{
    if (!w->opts.key)
        return 0;
    ckpt_cipher c = w->opts.cipher == CKPT_CIPHER_NONE ? ckpt_cipher_default() : w->opts.cipher;
    if (!ckpt_cipher_available(c))
        return ckpt_fail(err, -ENOTSUP, "cipher %s is not available on this CPU",
                         ckpt_cipher_name(c));
    kdf_params kp;
    memset(&kp, 0, sizeof kp);
    kp.kdf = ckpt_key_is_passphrase(w->opts.key) ? TPACK_KDF_ARGON2ID : TPACK_KDF_KEYFILE;
    if (kp.kdf == TPACK_KDF_ARGON2ID) {
        kp.ops = crypto_pwhash_OPSLIMIT_INTERACTIVE;
        kp.mem = crypto_pwhash_MEMLIMIT_INTERACTIVE;
        randombytes_buf(kp.salt, sizeof kp.salt);
    }
    uint8_t *master = sodium_malloc(CKPT_KEY_BYTES);
    if (!master)
        return ckpt_fail(err, -ENOMEM, "out of locked memory");
    int rc = key_master(w->opts.key, &kp, master, err);
    if (rc == 0) {
        uint8_t check[16];
        key_check_value(master, w->pack_id, check);
        rc = pack_keys_derive(&w->keys, c, master, w->pack_id);
        if (rc < 0)
            rc = ckpt_fail(err, rc, "out of locked memory");
        else
            build_header(w, kp.kdf, &kp, check);
    }
    sodium_free(master);
    return rc;
}

static void stop_threads(ckpt_writer *w)
{
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->to_encode);
    pthread_cond_broadcast(&w->to_write);
    pthread_cond_broadcast(&w->to_hash);
    pthread_mutex_unlock(&w->mu);
    for (unsigned i = 0; i < w->n_workers; i++)
        pthread_join(w->workers[i], NULL);
    w->n_workers = 0;
    if (w->out_started)
        pthread_join(w->out_thread, NULL);
    w->out_started = 0;
    if (w->hash_started)
        pthread_join(w->hash_thread, NULL);
    w->hash_started = 0;
}

/* Descriptors queued on the lanes at most, and lane threads. */
#define LANE_MAX_QUEUED 16
#define LANE_MAX 8

/* Queues j (fd or read set) on the lanes, starting them if need be; 0 if
 * they cannot take it. open_file: j is the open file's own. The cap bounds
 * the descriptors queued; later files' jobs, queued ahead, filled it and
 * left the open file to the writer's one hash thread, so they stop one
 * short of it, and the open file's job passes it if it holds no descriptor.
 * One that holds one does not: nothing else bounds the open files' jobs
 * pending, one per big file added while the lanes lag behind. */
static int lanes_submit(ckpt_writer *w, hash_job *j, uint64_t size, int open_file)
{
    if (!w->lanes) {
        unsigned n = w->n_threads < LANE_MAX ? w->n_threads : LANE_MAX;
        w->lanes = hash_lanes_start(n ? n : 1, w->chunk_size);
        if (!w->lanes)
            return 0;
    }
    size_t cap = open_file ? LANE_MAX_QUEUED : LANE_MAX_QUEUED - 1;
    if (!(open_file && j->fd < 0) && hash_lanes_pending(w->lanes) >= cap)
        return 0;
    j->size = size;
    hash_lanes_submit(w->lanes, j);
    return 1;
}

/* A job that reads the file of size bytes again through read(ud, ...)
 * where read is set, else through a descriptor of its own (fd dup'd);
 * NULL for a file too small for a lane (no descriptor is dup'd for it),
 * or if there is no memory or no descriptor. */
static hash_job *new_job(int fd, ckpt_read_fn read, void *ud, uint64_t size)
{
    if (size < WRITER_LANE_MIN_BYTES)
        return NULL;
    hash_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->fd = read ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    j->read = read;
    j->ud = ud;
    if (j->fd < 0 && !read) {
        free(j);
        return NULL;
    }
    return j;
}

/* A job no lane took. */
static void drop_job(hash_job *j)
{
    if (j->fd >= 0)
        close(j->fd);
    free(j);
}

/* Queues the open file's job j (NULL: none could be made) on the lanes; 1
 * if they took it, 0 (j dropped) if the file is hashed from the ring. */
static int rehash_job(ckpt_writer *w, hash_job *j, uint64_t size)
{
    if (!j)
        return 0;
    if (w->in_file && !w->file_bytes && lanes_submit(w, j, size, 1)) {
        w->files[w->n_files - 1].job = j;
        return 1;
    }
    drop_job(j);
    return 0;
}

/* Queues j (NULL: none could be made) for a file added later, which
 * writer_file_adopt hands it to; NULL (j dropped) if the lanes cannot take
 * it. */
static hash_job *prehash_job(ckpt_writer *w, hash_job *j, uint64_t size)
{
    if (!j)
        return NULL;
    if (grow_array((void **)&w->early, &w->cap_early, w->n_early, sizeof *w->early) < 0 ||
        !lanes_submit(w, j, size, 0)) {
        drop_job(j);
        return NULL;
    }
    w->early[w->n_early++] = j;
    return j;
}

hash_job *writer_prehash(ckpt_writer *w, int fd, uint64_t size)
{
    return prehash_job(w, new_job(fd, NULL, NULL, size), size);
}

hash_job *writer_prehash_reader(ckpt_writer *w, ckpt_read_fn read, void *ud, uint64_t size)
{
    return prehash_job(w, new_job(-1, read, ud, size), size);
}

int writer_file_adopt(ckpt_writer *w, hash_job *j, uint64_t size)
{
    size_t i = 0;
    while (i < w->n_early && w->early[i] != j)
        i++;
    if (i == w->n_early || !w->in_file || w->file_bytes || j->size != size)
        return 0;
    w->early[i] = w->early[--w->n_early];
    w->files[w->n_files - 1].job = j;
    return 1;
}

int writer_file_rehash(ckpt_writer *w, int fd, uint64_t size)
{
    return rehash_job(w, new_job(fd, NULL, NULL, size), size);
}

int writer_file_rehash_reader(ckpt_writer *w, ckpt_read_fn read, void *ud, uint64_t size)
{
    return rehash_job(w, new_job(-1, read, ud, size), size);
}

/* Frees everything; an unfinished pack is abandoned and its temporary file
 * removed. */
static void writer_free(ckpt_writer *w)
{
    stop_threads(w);
    hash_lanes_stop(w->lanes);
    if (w->out)
        w->out->ops->abort(w->out);
    ckpt_store_free(w->own_store);
    for (size_t i = 0; i < w->n_files; i++) {
        free(w->files[i].path);
        free(w->files[i].note);
        free(w->files[i].hash);
        free(w->files[i].job);
    }
    for (size_t i = 0; i < w->n_early; i++)
        free(w->early[i]);
    free(w->early);
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].shape);
        free(w->tensors[i].hash);
    }
    for (size_t i = 0; i < w->n_skipped; i++) {
        free((char *)w->skipped[i].name);
        free((char *)w->skipped[i].reason);
    }
    free(w->skipped);
    for (size_t i = 0; i < w->n_groups; i++) {
        wgroup *g = &w->groups[i];
        free(g->scope);
        free(g->whole);
        free(g->shape);
        free(g->parts);
        free(g->ch);
    }
    for (size_t i = 0; i < w->group_map.cap; i++)
        free((char *)w->group_map.keys[i]);
    free(w->groups);
    strmap_free(&w->group_map);
    for (size_t i = 0; i < w->dir_map.cap; i++)
        free((char *)w->dir_map.keys[i]);
    strmap_free(&w->file_map);
    strmap_free(&w->dir_map);
    strmap_free(&w->tensor_map);
    if (w->slots)
        for (size_t i = 0; i < w->n_slots; i++) {
            free(w->slots[i].in);
            free(w->slots[i].out);
            free(w->slots[i].spans);
        }
    free(w->slots);
    free(w->workers);
    free(w->files);
    free(w->extents);
    free(w->tensors);
    free(w->chunks);
    free(w->live);
    pack_keys_free(&w->keys);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->to_encode);
    pthread_cond_destroy(&w->to_write);
    pthread_cond_destroy(&w->to_fill);
    pthread_cond_destroy(&w->to_hash);
    pthread_cond_destroy(&w->tensor_hashed);
    pthread_cond_destroy(&w->slot_filled);
    free(w->final_path);
    free(w);
}

/* Opens a writer for name in s; final_path names it in messages. */
static int writer_open(ckpt_store *s, const char *name, const char *tmp_name,
                       const char *final_path, const ckpt_write_opts *opts, ckpt_writer **out,
                       ckpt_err *err)
{
    *out = NULL;
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    ckpt_write_opts o = opts ? *opts : (ckpt_write_opts){0};
    if (!opts)
        o.level = -1;
    uint32_t cs = o.chunk_size ? o.chunk_size : CKPT_CHUNK_DEFAULT;
    if (cs < CKPT_CHUNK_MIN || cs > CKPT_CHUNK_MAX || (cs & (cs - 1)))
        return ckpt_fail(err, -EINVAL,
                         "%s: chunk size %u is not a power of two between 64K and 16M", final_path,
                         cs);
    if (o.level < -1 || o.level > 9)
        return ckpt_fail(err, -EINVAL, "%s: compression level %d is not in 0..9", final_path,
                         o.level);
    if (o.cipher != CKPT_CIPHER_NONE && !o.key)
        return ckpt_fail(err, -EINVAL, "%s: a cipher was chosen but no key given", final_path);
    ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->to_encode, NULL);
    pthread_cond_init(&w->to_write, NULL);
    pthread_cond_init(&w->to_fill, NULL);
    pthread_cond_init(&w->to_hash, NULL);
    pthread_cond_init(&w->tensor_hashed, NULL);
    pthread_cond_init(&w->slot_filled, NULL);
    w->opts = o;
    w->chunk_size = cs;
    w->level = o.level < 0 ? 6 : o.level;
    w->final_path = strdup(final_path);
    int rc = 0;
    if (!w->final_path || strmap_init(&w->file_map, 64) < 0 || strmap_init(&w->dir_map, 64) < 0 ||
        strmap_init(&w->tensor_map, 256) < 0 || strmap_init(&w->group_map, 16) < 0) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto fail;
    }
    randombytes_buf(w->pack_id, sizeof w->pack_id);
    build_header(w, TPACK_KDF_NONE, NULL, NULL);
    if ((rc = setup_keys(w, err)) < 0)
        goto fail;

    unsigned threads = o.threads ? o.threads : ckpt_default_threads();
    w->n_threads = threads;
    /* Two slots per worker keep everyone busy; cap the memory they pin. */
    size_t n = 2 * (size_t)threads + 2, cap = (512u << 20) / (2 * (size_t)cs);
    w->n_slots = n < cap ? n : cap < 3 ? 3 : cap;
    w->slots = calloc(w->n_slots, sizeof *w->slots);
    w->workers = calloc(threads, sizeof *w->workers);
    if (!w->slots || !w->workers) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < w->n_slots; i++) {
        w->slots[i].in = malloc(cs);
        w->slots[i].out = malloc(cs + TPACK_CHUNK_OVERHEAD);
        if (!w->slots[i].in || !w->slots[i].out) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory for chunk buffers");
            goto fail;
        }
    }
    /* Nothing is visible under name until finish commits the upload. */
    if ((rc = s->ops->create(s, name, tmp_name, &w->out, err)) < 0)
        goto fail;
    w->dev = (dev_t)w->out->id.dev;
    w->ino = (ino_t)w->out->id.ino;
    if ((rc = w->out->ops->write(w->out, w->header, TPACK_HEADER_SIZE, err)) < 0)
        goto fail;
    w->write_pos = TPACK_HEADER_SIZE;
    for (unsigned i = 0; i < threads; i++) {
        if (pthread_create(&w->workers[i], NULL, encode_worker, w) != 0)
            break;
        w->n_workers++;
    }
    if (w->n_workers == 0 || pthread_create(&w->out_thread, NULL, output_worker, w) != 0) {
        rc = ckpt_fail(err, -EAGAIN, "cannot start writer threads");
        goto fail;
    }
    w->out_started = 1;
    if (pthread_create(&w->hash_thread, NULL, hash_worker, w) != 0) {
        rc = ckpt_fail(err, -EAGAIN, "cannot start writer threads");
        goto fail;
    }
    w->hash_started = 1;
    *out = w;
    return 0;
fail:
    writer_free(w); /* removes the temporary file, if it was made */
    return rc;
}

int ckpt_writer_open(const char *final_path, const char *tmp_path, const ckpt_write_opts *opts,
                     ckpt_writer **out, ckpt_err *err)
{
    /* Paths as given, resolved as open(2) and rename(2) resolve them. */
    ckpt_store *cwd = store_cwd();
    if (!cwd)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    int rc = writer_open(cwd, final_path, tmp_path, final_path, opts, out, err);
    if (rc < 0)
        ckpt_store_free(cwd);
    else
        (*out)->own_store = cwd;
    return rc;
}

int ckpt_writer_open_in(ckpt_store *s, const char *name, const char *tmp_name,
                        const ckpt_write_opts *opts, ckpt_writer **out, ckpt_err *err)
{
    *out = NULL;
    if (!name || !ckpt_path_is_safe(name) || (tmp_name && !ckpt_path_is_safe(tmp_name)))
        return ckpt_fail(err, -EINVAL, "%s: invalid pack name '%s'", ckpt_store_where(s),
                         !name                     ? "(null)"
                         : ckpt_path_is_safe(name) ? tmp_name
                                                   : name);
    char *shown = store_display_name(s, name);
    if (!shown)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    int rc = writer_open(s, name, tmp_name, shown, opts, out, err);
    free(shown);
    return rc;
}

void writer_output_id(const ckpt_writer *w, dev_t dev[2], ino_t ino[2])
{
    dev[0] = w->dev;
    ino[0] = w->ino;
    dev[1] = (dev_t)w->out->replaces.dev;
    ino[1] = (ino_t)w->out->replaces.ino;
}

int writer_has_tensor(const ckpt_writer *w, const char *name)
{
    return strmap_get(&w->tensor_map, name) >= 0;
}

void writer_warn(const ckpt_writer *w, const char *src, const char *reason)
{
    if (w->opts.warn)
        w->opts.warn(w->opts.warn_ud, src, reason);
}

void ckpt_writer_set_sibling_reader(ckpt_writer *w, ckpt_sibling_fn fn, void *ud)
{
    w->sibling_fn = fn;
    w->sibling_ud = fn ? ud : NULL;
}

void ckpt_writer_pack_id(const ckpt_writer *w, uint8_t out[16])
{
    memcpy(out, w->pack_id, 16);
}

void ckpt_writer_commit_flag(ckpt_writer *w, int *sent)
{
    w->out->commit_sent = sent; /* the upload sends the commit: it sets the flag */
}

void writer_sibling_reader(const ckpt_writer *w, ckpt_sibling_fn *fn, void **ud)
{
    *fn = w->sibling_fn;
    *ud = w->sibling_ud;
}

void ckpt_writer_abort(ckpt_writer *w)
{
    if (!w)
        return;
    writer_free(w); /* stops the threads first, then removes the temporary file */
}

void ckpt_writer_cancel(ckpt_writer *w)
{
    ckpt_err e;
    ckpt_fail(&e, -ECANCELED, "%s: packing cancelled", w->final_path);
    writer_set_failed(w, &e);
}

/* The head of a tensor record, stored and assembled alike: name, dtype,
 * rank, shape (FORMAT.md section 4). */
static void bb_tensor_head(bytebuf *b, const char *name, const char *dtype, uint32_t ndim,
                           const uint64_t *shape)
{
    size_t len = strlen(name), dl = strlen(dtype);
    bb_u16(b, (uint16_t)len);
    bb_put(b, name, len);
    bb_u8(b, (uint8_t)dl);
    bb_put(b, dtype, dl);
    bb_u8(b, (uint8_t)ndim);
    for (uint32_t j = 0; j < ndim; j++)
        bb_u64(b, shape[j]);
}

static void build_index(ckpt_writer *w, size_t n_assembled, bytebuf *b)
{
    bb_u32(b, TPACK_INDEX_MAGIC);
    bb_u32(b, (uint32_t)w->n_files);
    bb_u32(b, (uint32_t)w->n_tensors);
    bb_u32(b, (uint32_t)w->n_skipped);
    bb_u64(b, w->n_extents);
    bb_u64(b, w->n_chunks);
    for (size_t i = 0; i < w->n_files; i++) {
        const wfile *f = &w->files[i];
        size_t len = strlen(f->path);
        bb_u16(b, (uint16_t)len);
        bb_put(b, f->path, len);
        bb_u32(b, f->mode);
        bb_u64(b, (uint64_t)f->mtime_sec);
        bb_u32(b, f->mtime_nsec);
        bb_u64(b, f->size);
        bb_put(b, f->sha256, 32);
        bb_u64(b, f->first_extent);
        bb_u32(b, (uint32_t)f->n_extents);
        size_t nl = f->note ? strlen(f->note) : 0;
        bb_u8(b, f->container);
        bb_u16(b, (uint16_t)nl);
        bb_put(b, f->note, nl);
    }
    for (size_t i = 0; i < w->n_extents; i++) {
        const wextent *e = &w->extents[i];
        bb_u64(b, e->length);
        bb_u64(b, e->first_chunk);
        bb_u8(b, e->kind);
        bb_u8(b, e->elem);
        bb_u16(b, 0);
        bb_u32(b, 0);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        bb_tensor_head(b, t->name, t->dtype, t->ndim, t->shape);
        bb_u32(b, t->file_index);
        bb_u64(b, t->extent_index);
        bb_u64(b, t->extent_offset);
        bb_put(b, t->hash->digest, 32);
    }
    for (size_t i = 0; i < w->n_chunks; i++) {
        const wchunk *c = &w->chunks[i];
        bb_u64(b, c->offset);
        bb_u32(b, c->stored);
        bb_u32(b, c->raw);
        bb_u32(b, c->crc);
        bb_u8(b, c->codec);
        bb_u8(b, c->elem);
        bb_u16(b, 0);
    }
    for (size_t i = 0; i < w->n_skipped; i++) {
        const ckpt_skipped_info *k = &w->skipped[i];
        size_t nl = strlen(k->name), rl = strlen(k->reason);
        bb_u32(b, (uint32_t)k->file_index);
        bb_u16(b, (uint16_t)nl);
        bb_put(b, k->name, nl);
        bb_u16(b, (uint16_t)rl);
        bb_put(b, k->reason, rl);
    }
    /* Version 5: the tensors assembled from DCP chunks, after the skipped. */
    bb_u32(b, (uint32_t)n_assembled);
    for (size_t i = 0; i < w->n_groups; i++) {
        const wgroup *g = &w->groups[i];
        if (!g->assembled)
            continue;
        bb_tensor_head(b, g->whole, g->dtype, g->ndim, g->shape);
        bb_u32(b, (uint32_t)g->n_parts);
        for (size_t j = 0; j < g->n_parts; j++)
            bb_u32(b, (uint32_t)g->parts[j]);
        bb_put(b, g->digest, 32);
    }
}

int ckpt_writer_finish(ckpt_writer *w, ckpt_write_stats *stats, ckpt_err *err)
{
    int rc = 0;
    /* A writer that failed says why, not what the failure left undone. */
    if ((rc = writer_failed(w, err)) < 0)
        goto fail;
    if (w->in_file) {
        rc = ckpt_fail(err, -EINVAL, "%s: finish with a file still open", w->final_path);
        goto fail;
    }
    stop_threads(w); /* drains every submitted chunk first */
    if ((rc = writer_failed(w, err)) < 0)
        goto fail;
    if (w->lanes)
        hash_lanes_wait(w->lanes);
    for (size_t i = 0; i < w->n_files; i++) {
        wfile *f = &w->files[i];
        if (!f->job) {
            if (f->hash)
                ckpt_sha256_final(f->hash, f->sha256); /* else copied */
            continue;
        }
        if (f->job->rc < 0 && f->job->rc != -EIO) {
            rc = ckpt_fail(err, f->job->rc, "%s: reading '%s' again to hash it failed: %s",
                           w->final_path, f->path, strerror(-f->job->rc));
            goto fail;
        }
        if (f->job->rc < 0 || f->job->crc != f->job->fed_crc) {
            rc = ckpt_fail(err, -EAGAIN, "%s: file changed while being packed", f->path);
            goto fail;
        }
        memcpy(f->sha256, f->job->sha256, 32);
    }
    size_t n_assembled;
    if (settle_groups(w, &n_assembled) < 0) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory for the index");
        goto fail;
    }
    bytebuf idx = {0};
    build_index(w, n_assembled, &idx);
    uint8_t *stored = idx.p;
    size_t stored_len = idx.len;
    uint8_t ftr[TPACK_FOOTER_SIZE] = {0};
    if (idx.oom) {
        bb_free(&idx);
        rc = ckpt_fail(err, -ENOMEM, "out of memory for the index");
        goto fail;
    }
    if (idx.len > TPACK_INDEX_MAX) {
        rc = ckpt_fail(err, -EFBIG,
                       "%s: its index would be %zu bytes, over the %llu a reader "
                       "accepts (too many files, tensors or chunks, or names too long)",
                       w->final_path, idx.len, (unsigned long long)TPACK_INDEX_MAX);
        bb_free(&idx);
        goto fail;
    }
    if (w->keys.subkey) {
        stored = malloc(idx.len + TPACK_AEAD_TAG);
        if (!stored) {
            bb_free(&idx);
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            goto fail;
        }
        if (aead_seal(&w->keys, TPACK_INDEX_NONCE_ID, w->header, TPACK_HEADER_SIZE, idx.p, idx.len,
                      stored) < 0) {
            free(stored);
            bb_free(&idx);
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            goto fail;
        }
        stored_len = idx.len + TPACK_AEAD_TAG;
    } else {
        ckpt_sha256 st;
        ckpt_sha256_init(&st);
        ckpt_sha256_update(&st, w->header, TPACK_HEADER_SIZE);
        ckpt_sha256_update(&st, idx.p, idx.len);
        ckpt_sha256_final(&st, ftr + FTR_DIGEST);
    }
    put_u64(ftr + FTR_INDEX_OFFSET, w->write_pos);
    put_u64(ftr + FTR_INDEX_STORED, stored_len);
    put_u64(ftr + FTR_INDEX_RAW, idx.len);
    memcpy(ftr + FTR_MAGIC, TPACK_END_MAGIC, 8);
    rc = w->out->ops->write(w->out, stored, stored_len, err);
    if (rc == 0)
        rc = w->out->ops->write(w->out, ftr, sizeof ftr, err);
    if (stored != idx.p)
        free(stored);
    bb_free(&idx);
    if (rc < 0)
        goto fail;
    uint64_t total = w->write_pos + stored_len + TPACK_FOOTER_SIZE;
    /* Local: fsync, rename over the final name, fsync the directory. A
     * failed commit leaves no pack, unless only the directory fsync failed:
     * then the pack is complete and in place, its durability in doubt. */
    rc = w->out->ops->commit(w->out, err);
    w->out = NULL;
    if (rc < 0) {
        writer_free(w);
        return rc;
    }
    if (stats) {
        stats->logical_bytes = 0;
        for (size_t i = 0; i < w->n_files; i++)
            stats->logical_bytes += w->files[i].size;
        stats->stored_bytes = total;
        stats->n_files = w->n_files;
        stats->n_tensors = w->n_tensors + n_assembled;
        stats->n_chunks = w->n_chunks;
    }
    writer_free(w);
    return 0;
fail:
    ckpt_writer_abort(w);
    return rc;
}
