/* The decoded-chunk cache (fs/read/chunk_cache.c): which buffer a new
 * chunk gets. Chunks a sequential reader has finished (released spent)
 * give theirs to the next chunk before the cache is full; others stay
 * cached until the bound needs their room. */
#include "testutil.h"

#include <sys/mman.h>

#include "read/chunk_cache.h"

#define MIB (1u << 20)

/* A chunk acquired, filled and released; its buffer. */
static const uint8_t *load(chunk_cache *c, uint64_t id, size_t size, int spent)
{
    int must_fill = 0;
    chunk_entry *e = chunk_cache_acquire(c, 1, id, size, &must_fill);
    cr_assert_not_null(e);
    cr_assert(must_fill, "chunk %llu was cached already", (unsigned long long)id);
    memset(chunk_entry_buffer(e), (int)id, size);
    chunk_cache_filled(c, e, 0, NULL);
    const uint8_t *data = chunk_entry_data(e);
    if (spent)
        chunk_cache_release_spent(c, e);
    else
        chunk_cache_release(c, e);
    return data;
}

/* Whether the chunk is still cached (a hit), released again either way. */
static int cached(chunk_cache *c, uint64_t id, size_t size)
{
    int must_fill = 0;
    chunk_entry *e = chunk_cache_acquire(c, 1, id, size, &must_fill);
    cr_assert_not_null(e);
    if (must_fill)
        chunk_cache_filled(c, e, -EIO, "not loaded");
    chunk_cache_release(c, e);
    return !must_fill;
}

Test(chunk_cache, spent_buffer_goes_to_the_next_chunk)
{
    chunk_cache *c = chunk_cache_new(64 * MIB);
    const uint8_t *a = load(c, 1, MIB, 1);
    const uint8_t *b = load(c, 2, MIB, 0);
    cr_assert_eq(a, b, "the spent chunk's buffer was not reused");
    cr_assert(!cached(c, 1, MIB), "a recycled chunk is still cached");
    chunk_cache_stats st;
    chunk_cache_get_stats(c, &st);
    cr_assert_eq(st.used, MIB, "cache holds %llu bytes", (unsigned long long)st.used);
    chunk_cache_free(c);
}

Test(chunk_cache, unspent_chunks_stay_cached_below_the_bound)
{
    chunk_cache *c = chunk_cache_new(64 * MIB);
    const uint8_t *a = load(c, 1, MIB, 0);
    const uint8_t *b = load(c, 2, MIB, 0);
    cr_assert_neq(a, b);
    cr_assert(cached(c, 1, MIB));
    cr_assert(cached(c, 2, MIB));
    chunk_cache_free(c);
}

/* Asked for again after it was spent: an ordinary cached chunk once more. */
Test(chunk_cache, a_spent_chunk_asked_for_again_is_kept)
{
    chunk_cache *c = chunk_cache_new(64 * MIB);
    load(c, 1, MIB, 1);
    cr_assert(cached(c, 1, MIB));
    const uint8_t *b = load(c, 2, MIB, 0);
    cr_assert(cached(c, 1, MIB), "chunk 1 was recycled after a hit");
    cr_assert(cached(c, 2, MIB));
    (void)b;
    chunk_cache_free(c);
}

/* Sizes differ (chunks end where tensors do): a buffer is reused for a
 * chunk of between half its size and its size, and the spent entries
 * behind the coldest one are looked through. */
Test(chunk_cache, spent_buffers_are_matched_by_size)
{
    chunk_cache *c = chunk_cache_new(64 * MIB);
    const uint8_t *big = load(c, 1, MIB, 1);
    const uint8_t *small = load(c, 2, 8192, 1);
    cr_assert_neq(big, small, "an 8 KiB chunk took a 1 MiB buffer");
    const uint8_t *next = load(c, 3, 700 * 1024, 0);
    cr_assert_eq(next, big, "the 1 MiB spent buffer behind a small one was not found");
    cr_assert(cached(c, 2, 8192), "the small spent chunk was recycled instead");
    chunk_cache_free(c);
}

/* Pages of [p, p + len) that are mapped in. */
static size_t resident_pages(const uint8_t *p, size_t len)
{
    size_t pages = len / 4096, n = 0;
    unsigned char *vec = malloc(pages);
    cr_assert_eq(mincore((void *)p, len, vec), 0, "mincore: %s", strerror(errno));
    for (size_t i = 0; i < pages; i++)
        n += vec[i] & 1;
    free(vec);
    return n;
}

Test(chunk_cache, prefault_maps_a_new_buffer)
{
    chunk_cache *c = chunk_cache_new(64 * MIB);
    int must_fill = 0;
    chunk_entry *e = chunk_cache_acquire(c, 1, 1, MIB, &must_fill);
    cr_assert(e && must_fill);
    cr_assert_eq(resident_pages(chunk_entry_buffer(e), MIB), 0, "a new buffer has no pages yet");
    chunk_entry_prefault(e);
    size_t n = resident_pages(chunk_entry_buffer(e), MIB);
    cr_assert_eq(n, MIB / 4096, "%zu of %u pages mapped after the prefault", n, MIB / 4096);
    chunk_cache_filled(c, e, 0, NULL);
    chunk_cache_release(c, e);
    chunk_cache_free(c);
}
