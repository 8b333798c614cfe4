/* Bounded, thread-safe LRU cache of decoded chunks, keyed by (pack, chunk).
 *
 * An entry is created in the LOADING state by whoever asks first; that
 * caller decodes into it and calls chunk_cache_filled(). Everyone else who
 * asks meanwhile gets the same entry and waits, so concurrent readers of
 * one chunk share one decode. Entries in use are pinned and never evicted.
 * Reads may push the cache over its bound only while every byte is pinned
 * (at most the chunks of the reads in flight); prefetch never does. */
#ifndef CKPTFS_CHUNK_CACHE_H
#define CKPTFS_CHUNK_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct chunk_cache chunk_cache;
typedef struct chunk_entry chunk_entry;

chunk_cache *chunk_cache_new(uint64_t capacity_bytes);
/* Every entry must have been released. */
void chunk_cache_free(chunk_cache *c);

/* For a reader: the pinned entry for the chunk, or NULL when out of memory.
 * *must_fill is 1 when the caller created it and has to fill it. */
chunk_entry *chunk_cache_acquire(chunk_cache *c, uint64_t pack, uint64_t id, size_t size,
                                 int *must_fill);
/* For prefetch: 1 with *out a new pinned LOADING entry to fill; 0 when the
 * chunk is already cached or loading; -ENOSPC when it would not fit in the
 * bound without evicting pinned entries; -ENOMEM. */
int chunk_cache_reserve(chunk_cache *c, uint64_t pack, uint64_t id, size_t size, chunk_entry **out);

/* The filler's buffer (size bytes, as asked). */
uint8_t *chunk_entry_buffer(chunk_entry *e);
/* Maps the pages of a LOADING entry's buffer that are not mapped yet (a
 * buffer new to the cache has none), so that its filler does not take a
 * page fault per 4 KiB; for a thread with nothing else to do while the
 * filler waits for the bytes. The caller holds a pin. */
void chunk_entry_prefault(chunk_entry *e);
/* Ends loading; err < 0 marks the entry failed (and forgets it, so a later
 * read tries again) with the library's message. Wakes all waiters. */
void chunk_cache_filled(chunk_cache *c, chunk_entry *e, int err, const char *msg);
/* Waits until loaded; 0, or the negative errno of a failed load with its
 * message in *msg (valid while the entry is pinned). */
int chunk_cache_wait(chunk_cache *c, chunk_entry *e, const char **msg);
const uint8_t *chunk_entry_data(const chunk_entry *e);
/* One more pin on an entry the caller already holds pinned. */
void chunk_cache_pin(chunk_cache *c, chunk_entry *e);
void chunk_cache_release(chunk_cache *c, chunk_entry *e);
/* chunk_cache_release for a chunk a sequential reader has read to its end:
 * its buffer is the first to be reused, before the cache is full (until
 * someone asks for the chunk again). */
void chunk_cache_release_spent(chunk_cache *c, chunk_entry *e);

/* Forgets every chunk of a pack that is being closed. */
void chunk_cache_drop_pack(chunk_cache *c, uint64_t pack);

typedef struct chunk_cache_stats {
    uint64_t capacity, used, hits, misses, evictions, prefetch_skipped;
} chunk_cache_stats;
void chunk_cache_get_stats(chunk_cache *c, chunk_cache_stats *out);

#endif
