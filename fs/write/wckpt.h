/* Writable checkpoints: the first file written into a namespace directory
 * makes it one (wtable_ns_convert; `mkdir MOUNT/NAME` makes a namespace),
 * files are written into its staging area (stage.h), and a commit packs
 * it in the background (packer.h) into BACKING/NAME.tpack, after which
 * the pack is what NAME shows. NAME is a path (common/backing_path.h):
 * "run1/checkpoint-500" packs into BACKING/run1/checkpoint-500.tpack. A
 * file written directly into a namespace is a checkpoint of its own
 * (is_file; wtable_create_file), packed into BACKING/NAME.tfile; unlinked
 * while open, it goes with its staging at once and lives on only through
 * its descriptors, as an unlinked file does (wtable_unlink_file).
 *
 * Namespaces are directories of the backing directory; the table makes,
 * removes and renames them (wtable_ns_*) as it is the writer.
 *
 * States: writing -> packing -> committed, or -> failed (packing failed or
 * the staging disk filled up; the staged data stays and a commit retries).
 * A checkpoint failed by staging stays failed until what failed is made
 * good (the file rewritten over the failed range, truncated or removed;
 * the namespace saved), or a commit: data written elsewhere meanwhile does
 * not hide the failure, nor does a restart (the failed ranges are saved
 * with the namespace). One failed by packing turns writing on new data.
 * A commit comes from `ckpt commit` (wtable_commit) or, with a commit delay,
 * from the timer once data was written and nothing in the checkpoint has
 * been open or changed for that long. Making directories alone does not
 * count (a writer may take a while between its mkdir and its first file),
 * nor does a restart: a checkpoint found writing after a crash waits for
 * `ckpt commit` or new data, so half a checkpoint is never committed.
 * While packing, changes are refused with EBUSY; once committed, the pack
 * is immutable and the staging area is gone.
 *
 * Crash safety: the record (state and name) and the namespace are replaced
 * atomically; fsync on a file makes its data and the namespace durable; on
 * startup wtable_recover puts every checkpoint back where it was (writing,
 * failed, or packing, which restarts) and removes what a crash left
 * behind (hidden .NAME.tpack.tmp files, staging of checkpoints whose pack
 * is in place, files never recorded in a saved namespace).
 *
 * This layer knows nothing of FUSE: fs/wops.c maps requests onto it. It
 * is wckpt.c (table, lifetimes, commits), wckpt_ops.c (files inside a
 * checkpoint), wckpt_jobs.c (packer and timer threads) and
 * wckpt_recover.c (startup).
 *
 * Inode numbers follow common/inode.h, with serials from
 * INODE_WRITE_SERIAL_BASE, apart from those of packs.
 *
 * Locking: the table's lock, then a checkpoint's lock; never the reverse.
 * Blob I/O runs without either, counted in `inflight`. */
#ifndef CKPTFS_WCKPT_H
#define CKPTFS_WCKPT_H

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "packer.h"
#include "stage.h"
#include "stage_blob.h"
#include "wtree.h"
#include "common/inode.h"

typedef enum wstate {
    WST_WRITING = 1,
    WST_PACKING,
    WST_COMMITTED,
    WST_FAILED,
    WST_DELETED,
} wstate;

typedef struct wfile {
    stage_blob *blob; /* NULL: unchanged since the base pack */
    long base_index;  /* then: its file there (else -1) */
    uint64_t base_size;
    unsigned open; /* handles the kernel opened (create, open) */
    unsigned busy; /* reads and writes running without the lock */
    double last_use;
} wfile;

struct wtable;

typedef struct wckpt {
    struct wckpt *next;
    struct wtable *table;
    uint32_t serial;
    char *name;       /* its path below the mount */
    int is_file;      /* one file (node 1), shown as that file */
    int current;      /* what its name means */
    uint64_t nlookup; /* kernel references to its inodes */
    unsigned refs;    /* threads and handles using it */

    pthread_mutex_t lock;
    pthread_cond_t changed; /* state, inflight */
    wstate state;
    int locked; /* sealed, and the mount's key cannot open it */
    /* Staged without a key, recovered by a mount with one: readable and
     * committable (the pack is sealed), but nothing more is staged into it
     * in the clear (wc_modifiable: EACCES); 2 once the log said so. */
    int unsealed;
    char *error; /* why it failed (or is locked) */
    /* Staging writes that failed (a full disk, EIO) and were not made good
     * since: while any is left the checkpoint stays failed, whatever else
     * is written meanwhile (wc_staging_failed, wc_staging_repaired). Saved
     * with the namespace, so a restart keeps them (stage.h). */
    stage_failure *failures;
    size_t n_failures;
    int failures_lost; /* one could not be recorded (or read back after
                          a restart): only a commit clears the failure */
    int busy_logged;   /* "refused while packing" said this round */
    stage_dir dir;
    wtree tree;
    uint64_t next_blob_id;
    unsigned open_files, inflight;
    /* Of open_files, those that may write (opened for writing, or made
     * by create): the idle commit waits for them only, since a file open
     * for reading goes on reading across a commit (an eval process that
     * mapped a checkpoint still being written must not keep it from being
     * packed for as long as it lives). */
    unsigned open_writers;
    double last_change; /* monotonic seconds */
    int changed_since_commit;
    uint64_t commit_seq; /* packing order */
    int pack_running;
    int pack_suspended; /* cancelled by wtable_stop, to be packed again */
    int cancel_pack;    /* written to while packing: stop, write on */
    uint64_t pack_done, pack_total;
    double pack_started;
    /* A pack that failed because the object store did not answer (or
     * answered "try later") is committed again at pack_retry_at
     * (monotonic; 0: not), after pack_retry_wait seconds, doubled each
     * time up to PACK_RETRY_MAX. */
    double pack_retry_at, pack_retry_wait;
    /* Of dir.tried, how many of the newest packed what the checkpoint is
     * now (none after a change, or a restart): packer_job.n_tried_current. */
    unsigned tries_current;

    /* Namespace saves: a generation per change, written without the lock. */
    uint64_t meta_gen, saved_gen;
    int record_dirty; /* state changed back to writing */
    double last_save;
    pthread_mutex_t save_lock;

    /* A checkpoint written to after its commit reopens its pack: files
     * left unchanged are read from it (wfile.base_index) and packed again
     * from it into the new generation, which replaces it atomically. */
    ckpt_pack *base;

    /* Once committed: the FUSE layer's handle on the pack that replaced it,
     * released through the table's drop_successor when c is freed. */
    void *successor;
    /* Files open since before the commit (open_files of them) read that
     * pack: it is pinned (wtable.pin_successor) until the last is closed,
     * so a later generation replacing it cannot take it from them. */
    int successor_pinned;
} wckpt;

typedef struct wtable_opts {
    double commit_delay;    /* seconds of quiet before auto-commit; 0: never */
    unsigned pack_threads;  /* 0: all cores */
    ckpt_cipher cipher;     /* with a key: NONE means the default */
    int finish_on_stop;     /* wtable_stop finishes the pack under way */
    const char *mount_path; /* borrowed; named in the writer lock */
    /* Where packs go when not in the backing directory (an S3 store,
     * borrowed): the backing directory is then only the staging area,
     * and the store's own lock (a lease object) is taken as well. */
    ckpt_store *store;
} wtable_opts;

typedef struct wtable {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* packer: work queued, or stopping */
    int backing_fd;      /* borrowed */
    int lock_fd;         /* the writer lock (backing_lock.h), or -1 */
    char *backing_path;
    ckpt_store *store;                  /* where packs are written: the backing
                               * directory, or opts.store */
    struct ckpt_store_lock *store_lock; /* opts.store's writer lock */
    const mount_key *key;               /* borrowed from main.c */
    wtable_opts opts;
    stage_root root;
    int root_ready;
    wckpt *all;
    uint32_t next_serial;
    uint64_t commit_seq;
    int stopping;       /* threads: return (the packer once idle) */
    int cancel_packing; /* the pack under way: stop it, -ECANCELED */
    int threads_started;
    pthread_t packer, timer;
    pthread_cond_t timer_wake;
    void (*drop_successor)(void *ud, void *successor);
    /* Called (from the packer thread) once c is committed with files still
     * open in it: binds c->successor to the new pack and pins it (sets
     * successor_pinned); unpin_successor lets it go after the last close. */
    void (*pin_successor)(void *ud, wckpt *c);
    void (*unpin_successor)(void *ud, void *successor);
    void *successor_ud;
    /* Called (from the packer thread) once a checkpoint is committed, so
     * the FUSE layer can make the kernel let go of its old inodes. */
    void (*committed)(void *ud, const char *name);
    /* Called when this daemon put, removed or renamed NAME's pack (before
     * the name means it), for a read side that caches listings. */
    void (*pack_changed)(void *ud, const char *name);
} wtable;

/* Flags for wckpt_setattr. */
/* The size of a write into a checkpoint: the st_blksize its files show,
 * by which cp and most writers size their buffers. Small enough that the
 * writer's buffer, the request and the staging page cache's folio fit in a
 * core's L2 cache together: a 2 GB cp -r into the mount returned in
 * 0.88-0.92 s at 256 KiB, 0.98-1.12 s at 128 KiB, 1.2-1.4 s at 512 KiB and
 * 2.2-2.3 s at 1 MiB (2-core Xeon, 2 MiB L2 per core; with 1 MiB the
 * staging write's copy_folio_from_iter_atomic took 71% of the daemon's
 * cycles, as a 4 MiB dd into ext4 runs 2.4x slower than a 1 MiB one).
 * Bigger writes still come whole, up to the mount's max_write. */
#define WCKPT_WRITE_SIZE (256u << 10)

#define WSET_MODE 1
#define WSET_SIZE 2
#define WSET_MTIME 4 /* to the given time */
#define WSET_MTIME_NOW 8
#define WSET_ATIME 16 /* to the given time */
#define WSET_ATIME_NOW 32

typedef struct wdirent {
    char *name;
    uint32_t node;
    int is_dir, is_link;
} wdirent;

/* ------------------------------------------------------------ the table */

/* Takes the backing directory's writer lock, then sets up the staging
 * area under it. Errors name the path; -EBUSY when another writable
 * daemon holds the lock (err names its pid and mount point): nothing was
 * touched then. */
int wtable_init(wtable *t, const char *backing_path, int backing_fd, const mount_key *key,
                const wtable_opts *o, ckpt_err *err);
/* Puts every staged checkpoint back (see above); logs what it did.
 * Refuses (-ENOLCK) unless this table holds the writer lock: staging may
 * belong to another daemon. */
int wtable_recover(wtable *t);
/* Before a fork: stops the store lease's renewer (after the fork
 * wtable_note_pid renews the lease and starts it again). */
void wtable_before_fork(wtable *t);
/* Records this process in the writer lock again (after a fork). */
void wtable_note_pid(wtable *t);
/* Starts the packer and the commit timer (after any fork). */
int wtable_start(wtable *t);
/* Stops both and saves every namespace. The pack under way is abandoned
 * (its .tmp removed) unless opts.finish_on_stop, then finished; either
 * way checkpoints still packing stay so on disk, and the next start packs
 * them again from their staged data. Logs each one left packing. */
void wtable_stop(wtable *t);
void wtable_destroy(wtable *t);

/* The writable checkpoint called name (writing, packing or failed), with a
 * kernel reference taken when count_lookup; NULL if none. */
wckpt *wtable_get(wtable *t, const char *name, int count_lookup);
/* The checkpoint and node of an inode; NULL if not a writable one. The
 * caller holds a kernel reference to the inode. */
wckpt *wtable_find(wtable *t, uint64_t ino, uint32_t *node);
/* The same with a reference taken (wtable_unref), for a caller that keeps
 * c beyond the kernel's lookups of its inodes. */
wckpt *wtable_find_ref(wtable *t, uint64_t ino, uint32_t *node);
static inline int wtable_owns(uint64_t ino)
{
    return inode_is_written(ino);
}
static inline uint64_t wckpt_ino(const wckpt *c, uint32_t node)
{
    return inode_make(c->serial, node);
}
void wtable_count_lookup(wtable *t, wckpt *c);
void wtable_forget(wtable *t, wckpt *c, uint64_t n);
void wtable_ref(wtable *t, wckpt *c);
void wtable_unref(wtable *t, wckpt *c);

/* The writable checkpoints directly in namespace ns ("" for the root):
 * their last components, inodes (the root, or the file of an is_file
 * one) and kinds, malloc'd (free with wlisted_free). */
typedef struct wlisted {
    char *name;
    uint64_t ino;
    int is_file, is_link;
} wlisted;
int wtable_list(wtable *t, const char *ns, wlisted **out, size_t *n);
void wlisted_free(wlisted *v, size_t n);
/* The node a writable checkpoint's name shows: its root, or the file of
 * a single-file one (WTREE_NONE if it has none, which cannot happen). */
uint32_t wckpt_entry_node(wckpt *c);
uint64_t wckpt_entry_ino(wckpt *c);
/* Is a writable checkpoint at or below path? */
int wtable_has_below(wtable *t, const char *path);

/* Is this a name a checkpoint may have? (backing_path_ok) */
int wtable_name_ok(const char *name);
/* A new, empty checkpoint directory: 0 with *out (a kernel reference
 * taken), -EEXIST if the name is taken by a checkpoint, a pack or a
 * namespace, -EINVAL for a bad name. Its namespace must exist. */
int wtable_mkdir(wtable *t, const char *name, uint32_t mode, wckpt **out);
/* A new single-file checkpoint, its file created and open (release it
 * like an opened one): 0 with *out (a kernel reference taken), *node and
 * *st; errors as wtable_mkdir. */
int wtable_create_file(wtable *t, const char *name, uint32_t mode, wckpt **out, uint32_t *node,
                       struct stat *st);
/* The same for a symbolic link: a single-link checkpoint (not open). */
int wtable_create_link(wtable *t, const char *name, const char *target, wckpt **out, uint32_t *node,
                       struct stat *st);
/* Reopens the committed checkpoint name (its pack BACKING/name.tpack or
 * .tfile) for writing: a writable checkpoint whose files are the pack's
 * until changed, whose commit packs a new generation over it. *out gets
 * a kernel reference; the existing writable one if there is one.
 * -EACCES: the pack's key is not the mount's; -EIO: the pack cannot be
 * opened (damaged), as its readers are told; -ENOSPC (or -EDQUOT): no room
 * to start its staging; -EROFS: its staging could not be started for
 * another reason; the log says why. */
int wtable_reopen(wtable *t, const char *name, wckpt **out);
/* rmdir of a writable checkpoint directory: -ENOENT if name is none (then
 * it may be a pack), -ENOTDIR for a single-file one, -ENOTEMPTY, -EBUSY
 * while packing. */
int wtable_rmdir(wtable *t, const char *name);
/* unlink of a single-file checkpoint: -ENOENT if none, -EISDIR for a
 * directory. Removes a pack it would have replaced too. A handle still
 * open on its file keeps reading and writing it (an unlinked blob) until
 * its last release. */
int wtable_unlink_file(wtable *t, const char *name);
/* Removes BACKING/name.tpack (or .tfile, is_file) durably; on a store,
 * only while it is the version want names when want is not NULL (else
 * -ESTALE, logged, and it stays). */
int wtable_remove_pack(wtable *t, const char *name, int is_file, const ckpt_object_id *want);
/* Renames a checkpoint, writable or packed, within or across namespaces
 * (to's namespace must exist). A single file replaces a single file, as
 * rename(2) does, atomically: a writable one hides the pack it replaces
 * until its own pack replaces it. A directory replaces an empty
 * namespace (removed first); -ENOTEMPTY over anything else that is a
 * directory, an empty checkpoint included. */
int wtable_rename(wtable *t, const char *from, const char *to, int noreplace);

/* ------------------------------------------------------- namespaces */

/* mkdir of a namespace BACKING/path (its parent must exist): -EEXIST if
 * the name is taken. */
int wtable_ns_mkdir(wtable *t, const char *path, uint32_t mode);
/* rmdir of an empty namespace: -ENOTEMPTY if anything is in it. */
int wtable_ns_rmdir(wtable *t, const char *path);
/* Renames a namespace with everything packed in it; -EBUSY while a
 * checkpoint below it is being written. Over a checkpoint: -ENOTDIR for
 * a single file, -ENOTEMPTY for a directory; -ENOTEMPTY over a namespace
 * with a checkpoint being written below it. */
int wtable_ns_rename(wtable *t, const char *from, const char *to, int noreplace);
/* The first file into the namespace path makes it a checkpoint: when it
 * holds nothing but empty directories, they become the checkpoint's
 * directories and *out (a kernel reference taken) is the checkpoint;
 * -ENOTEMPTY when it holds a checkpoint or a file (the new file is then
 * a checkpoint of its own). */
int wtable_ns_convert(wtable *t, const char *path, wckpt **out);
/* What a namespace's state attributes say: the most pressing state of
 * the writable checkpoints below it (failed, then packing, then writing;
 * committed when none), their staged bytes and packing progress. */
typedef struct wns_state {
    wstate state;
    int rank;
    char error[512]; /* "NAME: why" of the failed one */
    uint64_t size, done, total;
    double seconds;
} wns_state;
int wtable_ns_state(wtable *t, const char *path, wns_state *out);
/* Commits every writable checkpoint at or below path: how many, or the
 * first error. */
int wtable_commit_below(wtable *t, const char *path);
/* Starts packing (a no-op if packing or committed). -EACCES when locked. */
int wtable_commit(wtable *t, wckpt *c);

/* ------------------------------------------------- inside a checkpoint */

/* The node at rel, a path inside the checkpoint ("" for its root):
 * 0, -ENOENT, -ESTALE once committed. */
int wckpt_find(wckpt *c, const char *rel, uint32_t *node);
/* Attributes of a node (ino, uid and gid are the caller's). */
int wckpt_getattr(wckpt *c, uint32_t node, struct stat *st);
int wckpt_lookup(wckpt *c, uint32_t dir, const char *name, uint32_t *node, struct stat *st);
/* Creates a file and opens it (release it like an opened one, with the
 * open's flags; it counts as open for writing: wckpt_open_read_only for a
 * create that asked O_RDONLY). */
int wckpt_create(wckpt *c, uint32_t dir, const char *name, uint32_t mode, uint32_t *node,
                 struct stat *st);
/* A symbolic link (its target checked: link_target_check). */
int wckpt_symlink(wckpt *c, uint32_t dir, const char *name, const char *target, uint32_t *node,
                  struct stat *st);
/* A link's target into buf (cap bytes, NUL-terminated); -EINVAL for
 * anything else. */
int wckpt_readlink(wckpt *c, uint32_t node, char *buf, size_t cap);
int wckpt_mkdir(wckpt *c, uint32_t dir, const char *name, uint32_t mode, uint32_t *node,
                struct stat *st);
int wckpt_unlink(wckpt *c, uint32_t dir, const char *name);
int wckpt_rmdir(wckpt *c, uint32_t dir, const char *name);
int wckpt_rename(wckpt *c, uint32_t dir, const char *name, uint32_t newdir, const char *newname,
                 int noreplace);
/* open flags as open(2): writing needs the checkpoint writable (EBUSY
 * while packing). */
int wckpt_open(wckpt *c, uint32_t node, int flags);
/* Whether a handle opened with flags may write (what the idle commit
 * waits for); O_TRUNC is not counted, as the kernel drops it from the
 * flags a release carries. */
static inline int wckpt_flags_write(int flags)
{
    return (flags & O_ACCMODE) != O_RDONLY;
}
/* A handle wckpt_create made that was asked for reading only. */
void wckpt_open_read_only(wckpt *c);
/* Closes a handle; flags as it was opened with. */
void wckpt_release(wckpt *c, uint32_t node, int flags);
ssize_t wckpt_read(wckpt *c, uint32_t node, void *buf, size_t len, uint64_t off);
ssize_t wckpt_write(wckpt *c, uint32_t node, const void *buf, size_t len, uint64_t off);
/* wckpt_write that answers the writer through ack (NULL: none) before the
 * bytes are copied (stage_ack); a failure after that is logged, marks the
 * checkpoint failed as any failed write does, and is what the file's next
 * write, wckpt_flush and wckpt_fsync return. */
ssize_t wckpt_write_acked(wckpt *c, uint32_t node, const void *buf, size_t len, uint64_t off,
                          stage_ack *ack);
/* wckpt_write_acked of the next len bytes of fd, a pipe
 * (stage_blob_write_fd). */
ssize_t wckpt_write_fd(wckpt *c, uint32_t node, int fd, size_t len, uint64_t off, stage_ack *ack);
/* At each close of a file: the error of a write that failed after its
 * answer, once (0: none). */
int wckpt_flush(wckpt *c, uint32_t node);
/* atime is kept while the checkpoint is written (reads leave it alone, as
 * with noatime); the pack keeps only mtimes. */
int wckpt_setattr(wckpt *c, uint32_t node, int flags, uint32_t mode, uint64_t size,
                  const struct timespec *atime, const struct timespec *mtime, struct stat *st);
/* Extends the file to off + len if shorter (fallocate mode 0). */
int wckpt_allocate(wckpt *c, uint32_t node, uint64_t off, uint64_t len);
/* Returns once the node's data (a file) and the namespace are durable. */
int wckpt_fsync(wckpt *c, uint32_t node);
/* A snapshot of a directory: its entries and its parent (WTREE_NONE for
 * the checkpoint directory). */
int wckpt_list(wckpt *c, uint32_t dir, wdirent **out, size_t *n, uint32_t *parent);
void wdirents_free(wdirent *v, size_t n);

/* Attribute values for the checkpoint directory: user.ckptfs.state,
 * .progress ("DONE TOTAL SECONDS"), .size (staged bytes), .error. The
 * length written to buf, or -ENODATA. */
int wckpt_xattr(wckpt *c, const char *attr, char *buf, size_t cap);
const char *wstate_name(wstate s);

#endif
