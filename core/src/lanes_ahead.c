/* The window of lanes_ahead.h over the files a writer will add. */
#include "lanes_ahead.h"
#include "writer.h"

#include <unistd.h>

static const ahead_slot empty = {.fd = -1};

void lanes_ahead_init(lanes_ahead *a, size_t n, ahead_size_fn size, ahead_queue_fn queue, void *ud)
{
    for (size_t i = 0; i < AHEAD_FILES; i++)
        a->ring[i] = empty;
    a->n = n;
    a->next = a->done = 0;
    a->held = 0;
    a->size = size;
    a->queue = queue;
    a->ud = ud;
}

/* Slot of file i out of the window, for the caller to take or drop. */
static ahead_slot release(lanes_ahead *a, size_t i)
{
    ahead_slot s = a->ring[i % AHEAD_FILES];
    if (s.job)
        a->held -= a->size(a->ud, i); /* what fill counted when it queued it */
    a->ring[i % AHEAD_FILES] = empty;
    return s;
}

/* Files before cur that the caller left out: their slots are free again
 * (a descriptor opened for nothing is closed; the lane's job stays the
 * writer's, hashed for nothing). */
static void release_before(lanes_ahead *a, size_t cur)
{
    for (; a->done < cur && a->done < a->next; a->done++) {
        ahead_slot s = release(a, a->done);
        if (s.fd >= 0)
            close(s.fd);
    }
    if (a->done < cur)
        a->done = cur;
}

/* Queues the lanes of the files from cur on, within the window. */
static void fill(lanes_ahead *a, size_t cur)
{
    if (a->next < cur)
        a->next = cur;
    for (; a->next < a->n && a->next - cur < AHEAD_FILES; a->next++) {
        uint64_t size = a->size(a->ud, a->next);
        if (size < WRITER_LANE_MIN_BYTES)
            continue;
        if (a->held && a->held + size > AHEAD_BYTES)
            return;
        ahead_slot *s = &a->ring[a->next % AHEAD_FILES];
        int q = a->queue(a->ud, a->next, s);
        if (q <= 0) {
            if (s->fd >= 0)
                close(s->fd);
            *s = empty;
            if (q < 0)
                return; /* the lanes are full: again before the next file */
            continue;
        }
        a->held += size;
    }
}

ahead_slot lanes_ahead_next(lanes_ahead *a, size_t cur)
{
    release_before(a, cur);
    fill(a, cur);
    if (cur >= a->next || cur < a->done)
        return empty; /* never considered, or taken already */
    a->done = cur + 1;
    return release(a, cur);
}

void lanes_ahead_end(lanes_ahead *a)
{
    release_before(a, a->next);
}
