/* The storage seam: where packs live, kept apart from what a pack is. The
 * pack reader and writer see objects only through these three vtables, so a
 * second backend (S3) is one more file beside local.c.
 *
 *   ckpt_store     a namespace of objects: list, open for reading, create,
 *                  remove, rename, lock
 *   store_reader   one object opened for ranged reads; its identity is
 *                  fixed at open, so a replacement is detected, not mixed in
 *   store_upload   one new object, written sequentially, then committed
 *                  (becomes visible whole) or aborted (leaves nothing)
 *
 * Designed for an object store as much as for a directory: reads are by
 * range, never by seeking; commit is the only atomic step (a local store
 * does fsync + rename + directory fsync; S3 completes a multipart upload);
 * an ETag may stand for the identity; and rename is not promised atomic.
 *
 * Private to core: the public face is ckpt_store in ckpt.h, and the lock,
 * remove and rename in ckpt_internal.h. Thread safety: read_at may be
 * called from many threads at once; an upload is used from one thread at
 * a time (the writer's output thread, then its caller). */
#ifndef CKPT_STORE_H
#define CKPT_STORE_H

#ifndef CKPT_INTERNAL_API
#define CKPT_INTERNAL_API
#endif
#include "ckpt_internal.h"

typedef struct store_ops store_ops;
typedef struct store_reader store_reader;
typedef struct store_upload store_upload;

struct ckpt_store {
    const store_ops *ops;
    char *where; /* for messages: "<where>/<name>"; NULL: names are paths */
};

struct store_ops {
    /* dirs: also directories (ckpt_store_list_dirs). */
    int (*list)(ckpt_store *s, const char *prefix, int dirs, ckpt_object_fn fn, void *ud,
                ckpt_err *err);
    int (*open_read)(ckpt_store *s, const char *name, store_reader **out, ckpt_err *err);
    /* tmp_name: where a store with renames writes until commit (NULL:
     * "<name>.tmp"); stores without renames ignore it. */
    int (*create)(ckpt_store *s, const char *name, const char *tmp_name, store_upload **out,
                  ckpt_err *err);
    int (*remove)(ckpt_store *s, const char *name, ckpt_err *err);
    /* remove, only while name is still the version want names (-ESTALE
     * otherwise); NULL: remove, want not checked. */
    int (*remove_if)(ckpt_store *s, const char *name, const ckpt_object_id *want, ckpt_err *err);
    int (*rename)(ckpt_store *s, const char *from, const char *to, ckpt_err *err);
    int (*lock)(ckpt_store *s, const char *name, ckpt_store_lock **out, ckpt_err *err);
    void (*unlock)(ckpt_store_lock *l);
    /* NULL when a lock survives fork as it is. */
    void (*lock_before_fork)(ckpt_store_lock *l);
    int (*lock_after_fork)(ckpt_store_lock *l, ckpt_err *err);
    void (*free)(ckpt_store *s);
    /* Aborts unfinished uploads; NULL when a store leaves none behind. */
    long (*abort_stale)(ckpt_store *s, const char *name, uint64_t older_than_s, ckpt_err *err);
    /* NULL when a store has no local cache. */
    void (*cache_stats)(ckpt_store *s, ckpt_store_cache_stats *out);
    /* NULL when a store always answers (ckpt_store_reachable). */
    int (*reachable)(ckpt_store *s, ckpt_err *err);
    /* NULL when an abort always reaches the store (ckpt_store_retry_aborts). */
    long (*retry_aborts)(ckpt_store *s);
};

typedef struct store_reader_ops {
    /* Up to len bytes at off: the count (short only at the end of the
     * object), or -errno with err (may be NULL) saying why, naming the
     * object (an S3 reader: the HTTP status; -ESTALE when the object was
     * replaced since it was opened). Thread-safe. */
    ssize_t (*read_at)(store_reader *r, void *buf, size_t len, uint64_t off, ckpt_err *err);
    /* A descriptor for zero-copy reads (ckpt_fd), or -1. */
    int (*fd)(const store_reader *r);
    void (*close)(store_reader *r);
    /* Optional (NULL: read_at): read_at without the copy where the store
     * already holds the bytes in memory (an S3 reader's readahead). The
     * count as read_at's, with *data where the bytes are: in the store's
     * memory, held until release(r, *hold) when *hold is not NULL, else
     * in spare (len bytes), as read_at would have put them. */
    ssize_t (*borrow)(store_reader *r, void *spare, size_t len, uint64_t off, const void **data,
                      void **hold, ckpt_err *err);
    void (*release)(store_reader *r, void *hold);
    /* Optional (NULL: read_at of the whole run): n pieces that lie back to
     * back from off, piece i lens[i] bytes, into buf, with as few requests
     * as the store can make (an S3 reader: one ranged GET for the pieces
     * its cache lacks), each piece cached on its own, as read_at would
     * have cached it. 0, or -errno (-ENODATA: the object ends first;
     * -EAGAIN: the pieces are better read one by one, nothing was read). */
    ssize_t (*read_run)(store_reader *r, void *buf, uint64_t off, const size_t *lens, size_t n,
                        ckpt_err *err);
} store_reader_ops;

struct store_reader {
    const store_reader_ops *ops;
    ckpt_object_id id; /* id.size is the object's size */
    char *name;        /* for messages, as the store names the object */
};

typedef struct store_upload_ops {
    /* Appends len bytes; 0 or -errno with err naming the object. */
    int (*write)(store_upload *u, const void *buf, size_t len, ckpt_err *err);
    /* Makes the object visible whole, replacing any object of that name.
     * Frees u whatever happens. On failure the object is not visible (and
     * nothing of it is left), except for a local store whose directory
     * fsync failed: the object is in place, only its durability is in doubt. */
    int (*commit)(store_upload *u, ckpt_err *err);
    /* Drops the upload and everything written; frees u. */
    void (*abort)(store_upload *u);
} store_upload_ops;

struct store_upload {
    const store_upload_ops *ops;
    ckpt_object_id id;       /* of what is being written, where known (dev, ino) */
    ckpt_object_id replaces; /* of the object commit will replace, where known */
    /* NULL, or set to 1 by commit once the request that makes the object
     * is sent: a commit failed before it cannot have made the object. */
    int *commit_sent;
};

/* Every backend's lock begins with this, so ckpt_store_lock_release finds
 * the backend. */
struct ckpt_store_lock {
    ckpt_store *store;
};

/* "<where>/<name>", or name when the store's names are paths; free() it.
 * NULL when out of memory. */
char *store_display_name(const ckpt_store *s, const char *name);

/* The current directory as a store whose names are paths as given, resolved
 * as open(2) would: what the path-based API (ckpt_writer_open) runs on, with
 * its messages unchanged. */
ckpt_store *store_cwd(void);

/* path (followed if a symbolic link, as ckpt_open always has) opened for
 * reading; messages name path. */
int store_local_open_path(const char *path, store_reader **out, ckpt_err *err);

/* s3://BUCKET/PREFIX (store/s3.c). */
int store_s3_open(const char *url, const ckpt_store_opts *opts, ckpt_store **out, ckpt_err *err);

#endif
