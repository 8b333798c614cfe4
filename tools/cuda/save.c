/* Saving device tensors as a safetensors file.
 *
 * The file's data region is cut into windows of one pinned slot each. The
 * calling thread queues the device-to-host copies of window after window
 * (one copy per tensor piece, one event per window) and hands each slot to
 * a writer thread, which waits for the slot's copies, write()s it in order
 * and gives the slot back. Once the last copy has completed, the device
 * memory is no longer needed and the call returns; the writer finishes the
 * file in the background and ckpt_cuda_save_wait() joins it.
 *
 * The file is written in place, as torch.save and safetensors write theirs,
 * not under a temporary name renamed over it: in a ckptfs mount that name
 * would be a file of the checkpoint for as long as the save runs (or for
 * good, if the process dies), a rename over a file checkpoint still being
 * packed is refused with EBUSY, and a rename replaces a symlink and drops
 * the file's mode, owner and links. */
#include "save.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"
#include "ring.h"
#include "sthdr.h"
#include "util.h"

struct ckpt_cuda_save_job {
    cc_backend *be;
    cc_ring *ring;
    char *path;
    int fd;
    int is_regular; /* only a regular file is removed after a failure */
    int do_fsync;
    uint8_t *header;
    size_t header_len;
    const void **dev;
    uint64_t *off, *len;
    cc_layout layout;
    size_t win_bytes;
    uint64_t nwin;
    /* Slots handed to the writer, in window order. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cc_slot **queue;
    uint64_t queued, taken;
    int producer_stopped;
    pthread_t writer;
    int writer_started;
    int wrc; /* the writer's result */
    ckpt_err werr;
};

static void job_free(ckpt_cuda_save_job *j)
{
    if (!j)
        return;
    ckpt_err ignored;
    /* Pinned memory, streams and events belong to the device's context. */
    if (j->be && j->be->ops->bind_thread(j->be, &ignored) == 0) {
        cc_ring_free(j->ring);
        j->be->ops->unbind_thread(j->be);
    } else {
        cc_ring_free(j->ring);
    }
    if (j->fd >= 0)
        close(j->fd);
    if (j->be)
        j->be->ops->destroy(j->be);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->queue);
    free(j->path);
    free(j->header);
    free(j->dev);
    free(j->off);
    free(j->len);
    free(j);
}

/* The next slot for the writer, or NULL once the producer stopped early. */
static cc_slot *next_slot(ckpt_cuda_save_job *j)
{
    pthread_mutex_lock(&j->mu);
    while (j->taken == j->queued && !j->producer_stopped)
        pthread_cond_wait(&j->cv, &j->mu);
    cc_slot *s = NULL;
    if (j->taken < j->queued)
        s = j->queue[j->taken++ % cc_ring_slot_count(j->ring)];
    pthread_mutex_unlock(&j->mu);
    return s;
}

static int write_windows(ckpt_cuda_save_job *j, ckpt_err *err)
{
    int rc = cc_write_all(j->fd, j->header, j->header_len);
    if (rc < 0)
        return cc_fail(err, rc, "%s: %s", j->path, strerror(-rc));
    for (uint64_t w = 0; w < j->nwin; w++) {
        cc_slot *s = next_slot(j);
        if (!s) {
            rc = cc_ring_error(j->ring, err);
            return rc < 0 ? rc : cc_fail(err, -ECANCELED, "save stopped");
        }
        uint64_t a = w * j->win_bytes, b = a + j->win_bytes;
        if (b > j->layout.total)
            b = j->layout.total;
        rc = cc_ring_wait(j->ring, s, err);
        if (rc == 0 && (rc = cc_write_all(j->fd, s->buf, (size_t)(b - a))) < 0)
            cc_fail(err, rc, "%s: %s", j->path, strerror(-rc));
        cc_ring_release(j->ring, s);
        if (rc < 0)
            return rc;
    }
    if (j->do_fsync && fsync(j->fd) != 0)
        return cc_fail(err, -errno, "%s: fsync: %s", j->path, strerror(errno));
    return 0;
}

static void *writer_main(void *arg)
{
    ckpt_cuda_save_job *j = arg;
    ckpt_err e = {0};
    int rc = j->be->ops->bind_thread(j->be, &e);
    if (rc == 0) {
        rc = write_windows(j, &e);
        j->be->ops->unbind_thread(j->be);
    }
    /* close() is where a FUSE daemon reports what it could not store. */
    int fd = j->fd;
    j->fd = -1;
    if (close(fd) != 0 && rc == 0)
        rc = cc_fail(&e, -errno, "%s: close: %s", j->path, strerror(errno));
    if (rc < 0 && j->ring)
        cc_ring_fail(j->ring, &e); /* stops the producer at its next slot */
    j->wrc = rc;
    j->werr = e;
    return NULL;
}

/* Queues the copies of window w into one slot and hands it to the writer. */
static int produce_window(ckpt_cuda_save_job *j, uint64_t w, ckpt_err *err)
{
    cc_slot *s;
    int rc = cc_ring_acquire(j->ring, &s, err);
    if (rc < 0)
        return rc;
    uint64_t a = w * j->win_bytes, b = a + j->win_bytes;
    if (b > j->layout.total)
        b = j->layout.total;
    cc_piece_iter it;
    cc_piece p;
    cc_pieces_begin(&it, &j->layout, a, b);
    while (rc == 0 && cc_pieces_next(&it, &p))
        rc = cc_ring_copy(j->ring, s, s->buf + p.win_off,
                          (const uint8_t *)j->dev[p.item] + p.item_off, (size_t)p.len, CC_D2H, err);
    if (rc == 0)
        rc = cc_ring_commit(j->ring, s, CC_HOLD, err);
    if (rc < 0) {
        cc_ring_release(j->ring, s);
        return rc;
    }
    pthread_mutex_lock(&j->mu);
    j->queue[j->queued++ % cc_ring_slot_count(j->ring)] = s;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

/* A failed save leaves no half-written checkpoint behind; a path that is
 * not a regular file (a device, a pipe) is never removed. */
static void remove_partial(ckpt_cuda_save_job *j)
{
    if (j->is_regular)
        unlink(j->path);
}

static void stop_producer(ckpt_cuda_save_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->producer_stopped = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Header, layout and the copy of the caller's descriptions. */
static int prepare(ckpt_cuda_save_job *j, const char *path, const ckpt_cuda_save_tensor *t,
                   size_t n, ckpt_err *err)
{
    size_t m = n ? n : 1;
    j->path = strdup(path);
    j->dev = calloc(m, sizeof *j->dev);
    j->off = calloc(m, sizeof *j->off);
    j->len = calloc(m, sizeof *j->len);
    if (!j->path || !j->dev || !j->off || !j->len)
        return cc_fail(err, -ENOMEM, "out of memory");
    int rc = cc_st_header(t, n, j->len, &j->header, &j->header_len, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        j->dev[i] = t[i].dev;
    /* Contiguous: safetensors data has no padding between tensors. */
    if ((rc = cc_plan_offsets(j->len, n, 1, j->off, &j->layout.total, err)) < 0)
        return rc;
    j->layout.n = n;
    j->layout.off = j->off;
    j->layout.len = j->len;
    return 0;
}

static int start(ckpt_cuda_save_job *j, const ckpt_cuda_save_opts *o, ckpt_err *err)
{
    cc_backend *be = j->be;
    size_t pinned = o->pinned_bytes ? o->pinned_bytes : CKPT_CUDA_DEFAULT_PINNED;
    unsigned streams = o->streams ? o->streams : CKPT_CUDA_DEFAULT_STREAMS;
    /* Kernels may still be writing the tensors on the caller's streams; our
     * streams do not order after those, so wait for the device first. */
    int rc = be->ops->sync(be, err);
    if (rc < 0)
        return rc;
    if (j->layout.total > 0) {
        unsigned slots;
        /* Two workers: this thread fills, the writer drains. */
        /* No cap on slot size: pinned_bytes alone decides how much can be
         * copied out before the writer has to catch up. */
        if ((rc = cc_plan_ring(j->layout.total, pinned, 2, streams, 0, &slots, &j->win_bytes,
                               err)) < 0 ||
            (rc = cc_ring_new(be, slots, j->win_bytes, streams, &j->ring, err)) < 0)
            return rc;
        j->nwin = cc_window_count(j->layout.total, j->win_bytes);
        if (!(j->queue = calloc(slots, sizeof *j->queue)))
            return cc_fail(err, -ENOMEM, "out of memory");
    }
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (j->fd < 0)
        return cc_fail(err, -errno, "%s: %s", j->path, strerror(errno));
    struct stat st;
    j->is_regular = fstat(j->fd, &st) == 0 && S_ISREG(st.st_mode);
    if (pthread_create(&j->writer, NULL, writer_main, j) != 0) {
        rc = cc_fail(err, -EAGAIN, "cannot start the writer thread");
        remove_partial(j);
        return rc;
    }
    j->writer_started = 1;
    return 0;
}

int cc_save(cc_backend_open_fn open_be, void *ud, const char *path,
            const ckpt_cuda_save_tensor *tensors, size_t n, const ckpt_cuda_save_opts *opts,
            ckpt_cuda_save_job **out, ckpt_err *err)
{
    static const ckpt_cuda_save_opts defaults;
    const ckpt_cuda_save_opts *o = opts ? opts : &defaults;
    ckpt_err local;
    if (!err)
        err = &local; /* the message also goes to the ring and the writer */
    *out = NULL;
    ckpt_cuda_save_job *j = calloc(1, sizeof *j);
    if (!j)
        return cc_fail(err, -ENOMEM, "out of memory");
    j->fd = -1;
    j->do_fsync = o->fsync;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    int rc = prepare(j, path, tensors, n, err);
    if (rc == 0)
        rc = open_be(ud, o->device, &j->be, err);
    if (rc < 0) {
        job_free(j);
        return rc;
    }
    if ((rc = j->be->ops->bind_thread(j->be, err)) < 0) {
        job_free(j);
        return rc;
    }
    if ((rc = start(j, o, err)) == 0) {
        for (uint64_t w = 0; w < j->nwin && rc == 0; w++)
            rc = produce_window(j, w, err);
        stop_producer(j);
        /* Every copy done: the caller may reuse the device memory. */
        if (j->ring) {
            int drc = cc_ring_drain(j->ring, err);
            if (rc == 0)
                rc = drc;
        }
    }
    if (rc < 0) {
        if (j->ring)
            cc_ring_fail(j->ring, err);
        if (j->writer_started) {
            pthread_join(j->writer, NULL);
            remove_partial(j);
        }
    }
    j->be->ops->unbind_thread(j->be);
    if (rc < 0) {
        job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

int ckpt_cuda_save_wait(ckpt_cuda_save_job *j, ckpt_err *err)
{
    if (!j)
        return 0;
    pthread_join(j->writer, NULL);
    int rc = j->wrc;
    if (rc < 0) {
        cc_fail_copy(err, &j->werr);
        remove_partial(j);
    }
    job_free(j);
    return rc;
}
