/* Verification: the device block comes back window by window through the
 * pinned ring (a few windows in flight while the oldest is hashed), and each
 * tensor's SHA-256 is compared with the digest its source recorded. The
 * copies back are real device reads, so this checks what the GPU holds, not
 * what was sent. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hashing is this pass's bottleneck: OpenSSL's SHA-256 takes the CPU's SHA
 * instructions (about 1.5 GB/s), libsodium's is portable C (0.2 GB/s). A
 * build without libcrypto (make SHA256=sodium) keeps libsodium's. */
#ifdef CKPT_USE_OPENSSL
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
typedef SHA256_CTX sha_state;
#define sha_init(s) SHA256_Init(s)
#define sha_update(s, p, n) SHA256_Update(s, p, n)
#define sha_final(s, out) SHA256_Final(out, s)
#else
typedef crypto_hash_sha256_state sha_state;
#define sha_init(s) crypto_hash_sha256_init(s)
#define sha_update(s, p, n) crypto_hash_sha256_update(s, p, n)
#define sha_final(s, out) crypto_hash_sha256_final(s, out)
#endif

#include "load.h"
#include "ring.h"
#include "util.h"

typedef struct verifier {
    ckpt_cuda_ckpt *c;
    ckpt_fault_fn fault;
    void *ud;
    sha_state st;
    long bad;
} verifier;

static void finish_tensor(verifier *v, size_t i)
{
    const ckpt_cuda_tensor *t = &v->c->t[i];
    uint8_t got[32];
    sha_final(&v->st, got);
    if (!t->has_sha256) {
        if (v->fault)
            v->fault(v->ud, "nodigest", t->name, 0, "the source recorded no SHA-256");
        return;
    }
    if (memcmp(got, t->sha256, 32) != 0) {
        v->bad++;
        if (v->fault) {
            char want[65], have[65], msg[200];
            ckpt_hex32(t->sha256, want);
            ckpt_hex32(got, have);
            snprintf(msg, sizeof msg, "SHA-256 on the device is %s, expected %s", have, want);
            v->fault(v->ud, "tensor", t->name, 0, msg);
        }
    }
}

/* Hashes the pieces of window [start, end) held in buf. */
static void hash_window(verifier *v, const uint8_t *buf, uint64_t start, uint64_t end)
{
    cc_piece_iter it;
    cc_piece p;
    cc_pieces_begin(&it, &v->c->layout, start, end);
    while (cc_pieces_next(&it, &p)) {
        if (p.item_off == 0)
            sha_init(&v->st);
        sha_update(&v->st, buf + p.win_off, p.len);
        if (p.item_off + p.len == v->c->len[p.item])
            finish_tensor(v, p.item);
    }
}

static int issue(cc_ring *r, const ckpt_cuda_ckpt *c, uint64_t start, uint64_t end, cc_slot **out,
                 ckpt_err *err)
{
    cc_slot *s;
    int rc = cc_ring_acquire(r, &s, err);
    if (rc < 0)
        return rc;
    if ((rc = cc_ring_copy(r, s, s->buf, (const uint8_t *)c->block + start, (size_t)(end - start),
                           CC_D2H, err)) < 0 ||
        (rc = cc_ring_commit(r, s, CC_HOLD, err)) < 0) {
        cc_ring_release(r, s);
        return rc;
    }
    *out = s;
    return 0;
}

static long verify_block(verifier *v, cc_ring *r, ckpt_err *err)
{
    ckpt_cuda_ckpt *c = v->c;
    size_t wb = cc_ring_slot_bytes(r);
    unsigned nslots = cc_ring_slot_count(r);
    uint64_t total = c->layout.total, nwin = cc_window_count(total, wb);
    cc_slot **fifo = calloc(nslots, sizeof *fifo);
    if (!fifo)
        return cc_fail(err, -ENOMEM, "out of memory");
    uint64_t issued = 0, done = 0;
    int rc = 0;
    while (done < nwin) {
        /* Keep every slot busy; the oldest is then the next to hash. */
        while (issued < nwin && issued - done < nslots) {
            uint64_t a = issued * wb, b = a + wb < total ? a + wb : total;
            if ((rc = issue(r, c, a, b, &fifo[issued % nslots], err)) < 0)
                goto out;
            issued++;
        }
        cc_slot *s = fifo[done % nslots];
        fifo[done % nslots] = NULL;
        rc = cc_ring_wait(r, s, err);
        if (rc == 0) {
            uint64_t a = done * wb, b = a + wb < total ? a + wb : total;
            hash_window(v, s->buf, a, b);
        }
        cc_ring_release(r, s);
        if (rc < 0)
            goto out;
        done++;
    }
out:
    for (unsigned i = 0; i < nslots; i++)
        if (fifo[i])
            cc_ring_release(r, fifo[i]);
    free(fifo);
    return rc < 0 ? rc : v->bad;
}

long ckpt_cuda_verify(ckpt_cuda_ckpt *c, ckpt_fault_fn fault, void *ud, ckpt_err *err)
{
    if (sodium_init() < 0)
        return cc_fail(err, -ENOSYS, "libsodium failed to initialise");
    verifier v = {.c = c, .fault = fault, .ud = ud};
    /* Empty tensors have no bytes on the device; their digest is still
     * checked, so a source that recorded a wrong one is caught. */
    for (size_t i = 0; i < c->n; i++) {
        if (c->len[i] == 0) {
            sha_init(&v.st);
            finish_tensor(&v, i);
        }
    }
    if (c->layout.total == 0)
        return v.bad;
    cc_backend *be = c->be;
    int rc = be->ops->bind_thread(be, err);
    if (rc < 0)
        return rc;
    unsigned slots;
    size_t slot_bytes;
    cc_ring *r = NULL;
    long res;
    /* Hashing is the bottleneck: a few mid-sized slots keep it busy. */
    if ((rc = cc_plan_ring(c->layout.total, c->pinned_bytes, 1, c->streams, (size_t)8 << 20, &slots,
                           &slot_bytes, err)) < 0 ||
        (rc = cc_ring_new(be, slots, slot_bytes, c->streams, &r, err)) < 0)
        res = rc;
    else
        res = verify_block(&v, r, err);
    cc_ring_free(r);
    be->ops->unbind_thread(be);
    return res;
}
