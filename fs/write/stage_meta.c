/* The namespace file ("meta") of a staged checkpoint: the wtree encoded
 * as records, sealed with the checkpoint's key (or hashed, when plain), and
 * replaced atomically; decoding validates every field, since the file is
 * read back after crashes and may be damaged.
 *
 * Versions (the first u32 of the plaintext): 1 had mtimes only; 2 adds an
 * atime after every mtime; 3 adds, after the nodes, the failed staging
 * writes (stage_failures): a u8 "some lost", a u32 count, and per failure
 * the u32 position of its file in this file and the u64 first and last
 * byte. Version 3 is written; all are read (staging left by an older
 * daemon shows atime = mtime, as it did then, and its failures as lost).
 * The failures are checked apart from the nodes: ones that make no sense
 * lose only themselves (f->unread), not the namespace. */
#include "stage_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"

#define META_VERSION 3u
/* The smallest node record (an empty name) of each version. */
#define META_NODE_MIN_V1 31u
#define META_NODE_MIN_V2 43u
/* A failure: its file's position, first and last byte. */
#define META_FAILURE_LEN 20u

typedef struct enc {
    bytebuf b;
    uint32_t *index_of; /* node id -> position in the file (0 = root or
                           not saved) */
    uint32_t n;
} enc;

static int encode_node(void *ud, const wtree *t, uint32_t id)
{
    enc *e = ud;
    const wnode *n = &t->nodes[id];
    if (id == WTREE_ROOT) {
        e->index_of[id] = 0;
        return 0;
    }
    e->index_of[id] = ++e->n;
    size_t len = strlen(n->name);
    bb_u32(&e->b, e->index_of[n->parent]);
    bb_u8(&e->b, n->kind);
    bb_u32(&e->b, n->mode);
    bb_u64(&e->b, (uint64_t)n->mtime_sec);
    bb_u32(&e->b, n->mtime_nsec);
    bb_u64(&e->b, (uint64_t)n->atime_sec);
    bb_u32(&e->b, n->atime_nsec);
    bb_u64(&e->b, n->blob_id);
    bb_u16(&e->b, (uint16_t)len);
    bb_put(&e->b, n->name, len);
    return 0;
}

/* The failures of the files saved: those of the namespace (WTREE_NONE)
 * are made good by this very save, and a detached file's went with it. */
static void encode_failures(enc *e, const wtree *t, const stage_failures *f)
{
    size_t at = e->b.len;
    uint8_t lost = f && f->lost;
    uint32_t n = 0;
    bb_u8(&e->b, 0);
    bb_u32(&e->b, 0);
    for (size_t i = 0; f && i < f->n; i++) {
        const stage_failure *x = &f->v[i];
        if (x->node >= t->n_nodes || !e->index_of[x->node])
            continue;
        if (n == UINT32_MAX) {
            lost = 1;
            break;
        }
        bb_u32(&e->b, e->index_of[x->node]);
        bb_u64(&e->b, x->first);
        bb_u64(&e->b, x->last);
        n++;
    }
    if (!e->b.oom) {
        e->b.p[at] = lost;
        put_u32(e->b.p + at + 1, n);
    }
}

int stage_encode_meta(const stage_dir *d, const wtree *t, uint64_t next_blob_id,
                      const stage_failures *f, uint8_t **out, size_t *out_len)
{
    enc e = {{0}, calloc(t->n_nodes ? t->n_nodes : 1, sizeof(uint32_t)), 0};
    if (!e.index_of)
        return -ENOMEM;
    const wnode *root = &t->nodes[WTREE_ROOT];
    bb_u32(&e.b, META_VERSION);
    bb_u64(&e.b, next_blob_id);
    bb_u32(&e.b, root->mode);
    bb_u64(&e.b, (uint64_t)root->mtime_sec);
    bb_u32(&e.b, root->mtime_nsec);
    bb_u64(&e.b, (uint64_t)root->atime_sec);
    bb_u32(&e.b, root->atime_nsec);
    size_t count_at = e.b.len;
    bb_u32(&e.b, 0);
    int rc = wtree_walk(t, encode_node, &e);
    if (rc == 0)
        encode_failures(&e, t, f);
    free(e.index_of);
    if (rc == 0 && e.b.oom)
        rc = -ENOMEM;
    size_t len = 8 + (d->key ? META_NONCE + e.b.len + META_TAG : e.b.len + META_HASH);
    uint8_t *buf = rc ? NULL : malloc(len);
    if (rc == 0 && !buf)
        rc = -ENOMEM;
    if (rc == 0) {
        put_u32(e.b.p + count_at, e.n);
        if (d->key) {
            memcpy(buf, META_MAGIC_SEALED, 8);
            uint8_t ad[8 + STAGE_SID_LEN];
            memcpy(ad, META_MAGIC_SEALED, 8);
            memcpy(ad + 8, d->sid, STAGE_SID_LEN);
            stage_seal(d->key, ad, sizeof ad, e.b.p, e.b.len, buf + 8, buf + 8 + META_NONCE);
        } else {
            memcpy(buf, META_MAGIC_PLAIN, 8);
            memcpy(buf + 8, e.b.p, e.b.len);
            crypto_generichash(buf + 8 + e.b.len, META_HASH, e.b.p, e.b.len, NULL, 0);
        }
    }
    if (e.b.p)
        sodium_memzero(e.b.p, e.b.len);
    bb_free(&e.b);
    *out = buf;
    *out_len = len;
    return rc;
}

int stage_write_meta(stage_dir *d, const uint8_t *buf, size_t len, ckpt_err *err)
{
    char what[64];
    snprintf(what, sizeof what, "staging %s", d->sid);
    /* Blobs the namespace names must exist after a crash too. */
    if (fsync(d->data_fd) != 0)
        return ckpt_fail(err, -errno, "%s: fsync of the data directory: %s", what, strerror(errno));
    return stage_replace_file(d->fd, what, META_NAME, buf, len, err);
}

int stage_save_meta(stage_dir *d, const wtree *t, uint64_t next_blob_id, const stage_failures *f,
                    ckpt_err *err)
{
    uint8_t *buf;
    size_t len;
    int rc = stage_encode_meta(d, t, next_blob_id, f, &buf, &len);
    if (rc)
        return ckpt_fail(err, rc, "out of memory");
    rc = stage_write_meta(d, buf, len, err);
    free(buf);
    return rc;
}

typedef struct dec {
    const uint8_t *p;
    size_t left;
    int bad;
} dec;

static const uint8_t *take(dec *d, size_t n)
{
    if (d->bad || d->left < n) {
        d->bad = 1;
        return NULL;
    }
    const uint8_t *p = d->p;
    d->p += n;
    d->left -= n;
    return p;
}

static uint64_t take_u64(dec *d)
{
    const uint8_t *p = take(d, 8);
    return p ? get_u64(p) : 0;
}
static uint32_t take_u32(dec *d)
{
    const uint8_t *p = take(d, 4);
    return p ? get_u32(p) : 0;
}
static uint16_t take_u16(dec *d)
{
    const uint8_t *p = take(d, 2);
    return p ? get_u16(p) : 0;
}
static uint8_t take_u8(dec *d)
{
    const uint8_t *p = take(d, 1);
    return p ? p[0] : 0;
}

/* The failures after the nodes (id_of: position -> node id, n of them).
 * Their bytes are authenticated with the rest, so what is wrong here came
 * from a faulty writer: only they are lost, as unread says. */
static void decode_failures(dec *d, const wtree *t, const uint32_t *id_of, uint32_t n,
                            stage_failures *f)
{
    uint8_t lost = take_u8(d);
    uint32_t count = take_u32(d);
    if (d->bad || lost > 1) {
        f->unread = "damaged: no valid header";
        return;
    }
    if (count > d->left / META_FAILURE_LEN) {
        f->unread = "damaged: more of them counted than the file holds";
        return;
    }
    if (count && !(f->v = malloc((size_t)count * sizeof *f->v))) {
        f->unread = "out of memory";
        return;
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t at = take_u32(d);
        uint64_t first = take_u64(d), last = take_u64(d);
        if (at == 0 || at > n || t->nodes[id_of[at]].kind == WNODE_DIR) {
            f->unread = "damaged: a failure names no file of the namespace";
            break;
        }
        /* Past STAGE_MAX_SIZE only the "not durable" mark. */
        if (first > last || (last > STAGE_MAX_SIZE && first != UINT64_MAX)) {
            f->unread = "damaged: a failed range is reversed or past the largest file size";
            break;
        }
        f->v[i] = (stage_failure){id_of[at], first, last};
    }
    if (!f->unread && d->left)
        f->unread = "damaged: bytes after the last failure";
    if (f->unread) {
        free(f->v);
        f->v = NULL;
        return;
    }
    f->n = count;
    f->lost = lost;
}

static int decode_meta(const uint8_t *p, size_t len, wtree *t, uint64_t *next_blob_id,
                       stage_failures *f)
{
    dec d = {p, len, 0};
    uint32_t version = take_u32(&d);
    if (version < 1 || version > META_VERSION)
        return -EIO;
    int has_atime = version >= 2;
    *next_blob_id = take_u64(&d);
    uint32_t root_mode = take_u32(&d);
    int64_t root_sec = (int64_t)take_u64(&d);
    uint32_t root_nsec = take_u32(&d);
    int64_t root_asec = has_atime ? (int64_t)take_u64(&d) : root_sec;
    uint32_t root_ansec = has_atime ? take_u32(&d) : root_nsec;
    uint32_t n = take_u32(&d);
    if (d.bad || n > d.left / (has_atime ? META_NODE_MIN_V2 : META_NODE_MIN_V1) ||
        root_ansec >= 1000000000u)
        return -EIO;
    int rc = wtree_init(t, root_mode, root_sec, root_nsec);
    if (rc)
        return rc;
    t->nodes[WTREE_ROOT].atime_sec = root_asec;
    t->nodes[WTREE_ROOT].atime_nsec = root_ansec;
    uint32_t *id_of = malloc(((size_t)n + 1) * sizeof *id_of);
    if (!id_of) {
        wtree_free(t);
        return -ENOMEM;
    }
    id_of[0] = WTREE_ROOT;
    char name[256];
    for (uint32_t i = 1; rc == 0 && i <= n; i++) {
        uint32_t parent = take_u32(&d);
        uint8_t kind = take_u8(&d);
        uint32_t mode = take_u32(&d);
        int64_t sec = (int64_t)take_u64(&d);
        uint32_t nsec = take_u32(&d);
        int64_t asec = has_atime ? (int64_t)take_u64(&d) : sec;
        uint32_t ansec = has_atime ? take_u32(&d) : nsec;
        uint64_t blob = take_u64(&d);
        uint16_t nlen = take_u16(&d);
        const uint8_t *nm = nlen < sizeof name ? take(&d, nlen) : NULL;
        if (d.bad || !nm || parent >= i || memchr(nm, 0, nlen) || mode > 07777 ||
            nsec >= 1000000000u || ansec >= 1000000000u) {
            rc = -EIO;
            break;
        }
        memcpy(name, nm, nlen);
        name[nlen] = 0;
        /* wtree_add checks the name, the parent being a directory and
         * duplicates; any of those means a damaged file. */
        rc = wtree_add(t, id_of[parent], name, (wnode_kind)kind, mode, sec, nsec, blob, &id_of[i]);
        if (rc && rc != -ENOMEM)
            rc = -EIO;
        if (rc == 0 && kind != WNODE_DIR && !(blob & WTREE_BASE_BLOB) && blob >= *next_blob_id)
            rc = -EIO;
        if (rc == 0) {
            t->nodes[id_of[i]].atime_sec = asec;
            t->nodes[id_of[i]].atime_nsec = ansec;
        }
    }
    if (rc == 0 && version >= 3)
        decode_failures(&d, t, id_of, n, f);
    else if (rc == 0)
        f->unread = "saved by an older ckptfs, which kept them in memory only";
    free(id_of);
    if (rc == 0 && d.left && version < 3)
        rc = -EIO;
    if (rc == 0 && f->unread)
        f->lost = 1;
    if (rc)
        wtree_free(t);
    return rc;
}

int stage_load_meta(stage_dir *d, wtree *t, uint64_t *next_blob_id, stage_failures *f,
                    ckpt_err *err)
{
    stage_failures ignored;
    if (!f)
        f = &ignored;
    memset(f, 0, sizeof *f);
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = stage_read_small(d->fd, META_NAME, META_MAX, &buf, &len);
    if (rc == -ENOENT) {
        /* Created, then a crash before the first save: nothing was synced. */
        *next_blob_id = 1;
        rc = wtree_init(t, 0755, 0, 0);
        return rc ? ckpt_fail(err, rc, "out of memory") : 0;
    }
    if (rc)
        return ckpt_fail(err, rc == -EIO ? -EIO : rc, "staging %s: cannot read its namespace: %s",
                         d->sid, strerror(-rc));
    uint8_t *plain = NULL;
    size_t plen = 0;
    if (len >= 8 + META_NONCE + META_TAG && memcmp(buf, META_MAGIC_SEALED, 8) == 0) {
        if (!d->key) {
            free(buf);
            return ckpt_fail(err, -EACCES, "staging %s: namespace is encrypted and no key is set",
                             d->sid);
        }
        plen = len - 8 - META_NONCE - META_TAG;
        plain = malloc(plen ? plen : 1);
        uint8_t ad[8 + STAGE_SID_LEN];
        memcpy(ad, META_MAGIC_SEALED, 8);
        memcpy(ad + 8, d->sid, STAGE_SID_LEN);
        if (plain &&
            stage_unseal(d->key, ad, sizeof ad, buf + 8 + META_NONCE, plen, buf + 8, plain) != 0)
            rc = -EIO; /* the key was checked: this is damage */
    } else if (len >= 8 + META_HASH && memcmp(buf, META_MAGIC_PLAIN, 8) == 0) {
        if (d->key) {
            /* Sealed staging never writes a plain namespace. */
            rc = -EIO;
        } else {
            plen = len - 8 - META_HASH;
            plain = malloc(plen ? plen : 1);
            uint8_t h[META_HASH];
            crypto_generichash(h, META_HASH, buf + 8, plen, NULL, 0);
            if (plain && memcmp(h, buf + 8 + plen, META_HASH) != 0)
                rc = -EIO;
            else if (plain)
                memcpy(plain, buf + 8, plen);
        }
    } else {
        rc = -EIO;
    }
    free(buf);
    if (rc == 0 && !plain)
        rc = -ENOMEM;
    if (rc == 0)
        rc = decode_meta(plain, plen, t, next_blob_id, f);
    if (f == &ignored || rc) {
        free(f->v);
        memset(f, 0, sizeof *f);
    }
    if (plain)
        sodium_memzero(plain, plen);
    free(plain);
    if (rc == -EIO)
        return ckpt_fail(err, rc, "staging %s: namespace file is damaged", d->sid);
    if (rc)
        return ckpt_fail(err, rc, "staging %s: %s", d->sid, strerror(-rc));
    return 0;
}
