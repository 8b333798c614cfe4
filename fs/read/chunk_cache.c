#include "chunk_cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { LOADING, READY, FAILED };

#define BUFFER_ALIGN 4096u

/* Chunk buffers are mapped directly rather than taken from malloc: they
 * live long and come in a few large sizes, while libckpt's temporary
 * buffers come and go; sharing one heap would fragment it and let the
 * daemon's footprint drift above the cache bound. */
static uint8_t *buffer_new(size_t capacity)
{
    void *p = mmap(NULL, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void buffer_free(uint8_t *buf, size_t capacity)
{
    if (buf)
        munmap(buf, capacity);
}

struct chunk_entry {
    chunk_entry *hash_next;
    chunk_entry *lru_prev, *lru_next; /* linked only while READY, unpinned, in the table */
    uint64_t pack, id;
    uint8_t *data;
    size_t capacity; /* bytes allocated, what the bound counts */
    unsigned pins;
    int state;
    int err;
    char *err_msg;
    int in_table;
    int spent; /* read to its end by a sequential reader: recycled first */
};

void chunk_entry_prefault(chunk_entry *e)
{
#ifdef MADV_POPULATE_WRITE
    /* Before Linux 5.14, EINVAL: the filler faults them in, as it did. */
    madvise(e->data, e->capacity, MADV_POPULATE_WRITE);
#else
    (void)e;
#endif
}

struct chunk_cache {
    pthread_mutex_t lock;
    pthread_cond_t loaded;
    chunk_entry **buckets;
    size_t bucket_mask;
    chunk_entry lru; /* sentinel: next = most recently used */
    uint64_t capacity, used, lru_bytes;
    chunk_cache_stats stats;
};

static size_t round_capacity(size_t size)
{
    return (size + BUFFER_ALIGN - 1) / BUFFER_ALIGN * BUFFER_ALIGN;
}

static size_t bucket_of(const chunk_cache *c, uint64_t pack, uint64_t id)
{
    uint64_t h = (pack * 0x9E3779B97F4A7C15ull) ^ (id * 0xC2B2AE3D27D4EB4Full);
    h ^= h >> 29;
    return (size_t)h & c->bucket_mask;
}

chunk_cache *chunk_cache_new(uint64_t capacity_bytes)
{
    chunk_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    size_t buckets = 1024;
    while (buckets < (1u << 20) && (uint64_t)buckets * 65536 < capacity_bytes)
        buckets *= 2;
    c->buckets = calloc(buckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    c->bucket_mask = buckets - 1;
    c->lru.lru_next = c->lru.lru_prev = &c->lru;
    c->capacity = capacity_bytes;
    c->stats.capacity = capacity_bytes;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->loaded, NULL);
    return c;
}

static void lru_unlink(chunk_cache *c, chunk_entry *e)
{
    if (!e->lru_next)
        return;
    e->lru_prev->lru_next = e->lru_next;
    e->lru_next->lru_prev = e->lru_prev;
    e->lru_next = e->lru_prev = NULL;
    c->lru_bytes -= e->capacity;
}

static void lru_push_front(chunk_cache *c, chunk_entry *e)
{
    e->lru_next = c->lru.lru_next;
    e->lru_prev = &c->lru;
    c->lru.lru_next->lru_prev = e;
    c->lru.lru_next = e;
    c->lru_bytes += e->capacity;
}

static void table_remove(chunk_cache *c, chunk_entry *e)
{
    if (!e->in_table)
        return;
    chunk_entry **link = &c->buckets[bucket_of(c, e->pack, e->id)];
    while (*link != e)
        link = &(*link)->hash_next;
    *link = e->hash_next;
    e->hash_next = NULL;
    e->in_table = 0;
}

static chunk_entry *table_find(chunk_cache *c, uint64_t pack, uint64_t id)
{
    for (chunk_entry *e = c->buckets[bucket_of(c, pack, id)]; e; e = e->hash_next)
        if (e->pack == pack && e->id == id)
            return e;
    return NULL;
}

static void entry_destroy(chunk_cache *c, chunk_entry *e)
{
    c->used -= e->capacity;
    buffer_free(e->data, e->capacity);
    free(e->err_msg);
    free(e);
}

/* Evicts least recently used entries until need more bytes fit. An evicted
 * buffer of exactly the wanted capacity is handed back through *spare
 * (still counted in used) so the common case of same-sized chunks recycles
 * memory instead of returning it to malloc. */
static void make_room(chunk_cache *c, size_t need, uint8_t **spare)
{
    while (c->used + (*spare ? 0 : need) > c->capacity && c->lru.lru_prev != &c->lru) {
        chunk_entry *victim = c->lru.lru_prev;
        lru_unlink(c, victim);
        table_remove(c, victim);
        c->stats.evictions++;
        if (!*spare && victim->capacity == need) {
            *spare = victim->data;
            victim->data = NULL;
            free(victim->err_msg);
            free(victim);
            continue;
        }
        entry_destroy(c, victim);
    }
}

/* A sequential reader hands each chunk on to the kernel's page cache,
 * which keeps it (keep_cache), and never comes back for it; the oldest
 * such chunk's buffer is the one to decode the next into, long before the
 * cache is full. Fresh buffers cost a page fault per 4 KiB, measured at
 * 12% of the daemon's CPU on the first cold read after mounting. */
/* How many spent entries take_spent looks through: small chunks (the last
 * of each tensor) lie between the big ones. */
#define SPENT_SCAN 16

static void take_spent(chunk_cache *c, size_t need, uint8_t **spare, size_t *spare_cap)
{
    if (*spare)
        return;
    chunk_entry *e = c->lru.lru_prev;
    /* Chunks end where tensors do, so sizes vary: a buffer up to twice
     * the size will do (its pages are already mapped, and the bound
     * counts what it has). */
    for (int i = 0; i < SPENT_SCAN && e != &c->lru && e->spent; i++, e = e->lru_prev) {
        if (e->capacity < need || e->capacity / 2 > need)
            continue;
        lru_unlink(c, e);
        table_remove(c, e);
        c->stats.evictions++;
        *spare = e->data;
        *spare_cap = e->capacity;
        e->data = NULL;
        free(e->err_msg);
        free(e);
        return;
    }
}

static chunk_entry *entry_create(chunk_cache *c, uint64_t pack, uint64_t id, size_t need,
                                 uint8_t *spare)
{
    chunk_entry *e = calloc(1, sizeof *e);
    if (!e) {
        if (spare) {
            buffer_free(spare, need);
            c->used -= need;
        }
        return NULL;
    }
    e->data = spare;
    if (!e->data) {
        e->data = buffer_new(need);
        if (!e->data) {
            free(e);
            return NULL;
        }
        c->used += need;
    }
    e->pack = pack;
    e->id = id;
    e->capacity = need;
    e->pins = 1;
    e->state = LOADING;
    size_t b = bucket_of(c, pack, id);
    e->hash_next = c->buckets[b];
    c->buckets[b] = e;
    e->in_table = 1;
    return e;
}

static void pin(chunk_cache *c, chunk_entry *e)
{
    if (e->pins++ == 0)
        lru_unlink(c, e);
}

/* The LRU's cold end, where spent entries go. */
static void lru_push_back(chunk_cache *c, chunk_entry *e)
{
    e->lru_prev = c->lru.lru_prev;
    e->lru_next = &c->lru;
    c->lru.lru_prev->lru_next = e;
    c->lru.lru_prev = e;
    c->lru_bytes += e->capacity;
}

chunk_entry *chunk_cache_acquire(chunk_cache *c, uint64_t pack, uint64_t id, size_t size,
                                 int *must_fill)
{
    size_t need = round_capacity(size ? size : 1);
    pthread_mutex_lock(&c->lock);
    chunk_entry *e = table_find(c, pack, id);
    if (e) {
        pin(c, e);
        e->spent = 0; /* wanted again */
        c->stats.hits++;
        *must_fill = 0;
    } else {
        uint8_t *spare = NULL;
        size_t cap = need;
        take_spent(c, need, &spare, &cap);
        make_room(c, need, &spare);
        e = entry_create(c, pack, id, cap, spare);
        c->stats.misses++;
        *must_fill = e != NULL;
    }
    pthread_mutex_unlock(&c->lock);
    return e;
}

int chunk_cache_reserve(chunk_cache *c, uint64_t pack, uint64_t id, size_t size, chunk_entry **out)
{
    size_t need = round_capacity(size ? size : 1);
    int rc = 0;
    *out = NULL;
    pthread_mutex_lock(&c->lock);
    if (!table_find(c, pack, id)) {
        uint64_t pinned = c->used - c->lru_bytes;
        if (pinned + need <= c->capacity) {
            uint8_t *spare = NULL;
            size_t cap = need;
            take_spent(c, need, &spare, &cap);
            make_room(c, need, &spare);
            *out = entry_create(c, pack, id, cap, spare);
            rc = *out ? 1 : -ENOMEM;
        } else {
            c->stats.prefetch_skipped++;
            rc = -ENOSPC;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

uint8_t *chunk_entry_buffer(chunk_entry *e)
{
    return e->data;
}

const uint8_t *chunk_entry_data(const chunk_entry *e)
{
    return e->data;
}

void chunk_cache_filled(chunk_cache *c, chunk_entry *e, int err, const char *msg)
{
    char *copy = err < 0 && msg ? strdup(msg) : NULL;
    pthread_mutex_lock(&c->lock);
    if (err < 0) {
        e->state = FAILED;
        e->err = err;
        e->err_msg = copy;
        table_remove(c, e);
    } else {
        e->state = READY;
    }
    pthread_cond_broadcast(&c->loaded);
    pthread_mutex_unlock(&c->lock);
}

int chunk_cache_wait(chunk_cache *c, chunk_entry *e, const char **msg)
{
    pthread_mutex_lock(&c->lock);
    while (e->state == LOADING)
        pthread_cond_wait(&c->loaded, &c->lock);
    int err = e->state == FAILED ? e->err : 0;
    if (msg)
        *msg = e->err_msg ? e->err_msg : "";
    pthread_mutex_unlock(&c->lock);
    return err;
}

void chunk_cache_pin(chunk_cache *c, chunk_entry *e)
{
    pthread_mutex_lock(&c->lock);
    pin(c, e);
    pthread_mutex_unlock(&c->lock);
}

static void release(chunk_cache *c, chunk_entry *e, int spent)
{
    pthread_mutex_lock(&c->lock);
    if (spent)
        e->spent = 1;
    if (--e->pins == 0) {
        if (e->in_table && e->state == READY && e->spent)
            lru_push_back(c, e);
        else if (e->in_table && e->state == READY)
            lru_push_front(c, e);
        else
            entry_destroy(c, e);
    }
    pthread_mutex_unlock(&c->lock);
}

void chunk_cache_release(chunk_cache *c, chunk_entry *e)
{
    release(c, e, 0);
}

void chunk_cache_release_spent(chunk_cache *c, chunk_entry *e)
{
    release(c, e, 1);
}

void chunk_cache_drop_pack(chunk_cache *c, uint64_t pack)
{
    pthread_mutex_lock(&c->lock);
    for (size_t b = 0; b <= c->bucket_mask; b++) {
        chunk_entry **link = &c->buckets[b];
        while (*link) {
            chunk_entry *e = *link;
            if (e->pack != pack) {
                link = &e->hash_next;
                continue;
            }
            *link = e->hash_next;
            e->hash_next = NULL;
            e->in_table = 0;
            if (e->pins == 0) {
                lru_unlink(c, e);
                entry_destroy(c, e);
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
}

void chunk_cache_get_stats(chunk_cache *c, chunk_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->used = c->used;
    pthread_mutex_unlock(&c->lock);
}

void chunk_cache_free(chunk_cache *c)
{
    if (!c)
        return;
    for (size_t b = 0; b <= c->bucket_mask; b++) {
        chunk_entry *e = c->buckets[b];
        while (e) {
            chunk_entry *next = e->hash_next;
            entry_destroy(c, e);
            e = next;
        }
    }
    pthread_cond_destroy(&c->loaded);
    pthread_mutex_destroy(&c->lock);
    free(c->buckets);
    free(c);
}
