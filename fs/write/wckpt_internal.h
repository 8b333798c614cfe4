/* What the parts of the writable-checkpoint layer (wckpt.c, wckpt_ops.c,
 * wckpt_jobs.c, wckpt_recover.c) share; not for other modules. Locking
 * rules are those of wckpt.h: "c->lock held" means the checkpoint's lock,
 * "t->lock held" the table's. */
#ifndef CKPTFS_WCKPT_INTERNAL_H
#define CKPTFS_WCKPT_INTERNAL_H

#include <time.h>

#include "wckpt.h"

double wc_now_mono(void);
struct timespec wc_now_real(void);
/* What BACKING holds under a checkpoint path: nothing (0), a namespace
 * directory, NAME.tpack or NAME.tfile (the first found, in that order). */
enum { WC_NAMESPACE = 1, WC_PACK_DIR, WC_PACK_FILE };
int wc_backing_kind(wtable *t, const char *name);
/* Is the name taken in BACKING (any of those)? */
int wc_pack_exists(wtable *t, const char *name);

void wc_set_error(wckpt *c, const char *msg);

/* Lifetimes. */
/* A new writable checkpoint called name, writing, its staging set up,
 * with a kernel reference; NULL with *rc (t->lock held). */
wckpt *wc_start(wtable *t, const char *name, uint32_t mode, int is_file, int replaces, int has_base,
                int *rc);
/* Removes a writable checkpoint and its staging, whatever is in it
 * (the pack it would replace stays unless c->dir.replaces). */
void wc_abandon(wtable *t, wckpt *c);
/* A deleted checkpoint closes its base pack unless a file of it is
 * still open (c->lock held). */
void wc_let_go_of_base(wckpt *c);
/* Opens BACKING/name.tpack (or .tfile) as a reopened checkpoint's base,
 * never through a link. */
int wc_open_base(wtable *t, const char *name, int is_file, ckpt_pack **out, ckpt_err *err);
/* After recovery loaded the tree: the files left as packed (c->base set).
 * -EIO if one is not in the base. */
int wc_base_files(wckpt *c);
wckpt *wc_wckpt_new(wtable *t, const char *name);
void wc_wckpt_free(wckpt *c);
/* Frees c once nothing can reach it (t->lock held). */
void wc_release_if_unused(wtable *t, wckpt *c);
/* Closes and frees every staged file of c. */
void wc_free_blobs(wckpt *c);
/* The current checkpoint called name (t->lock held). */
wckpt *wc_by_name(wtable *t, const char *name);

/* A file's size, staged or in the base pack. */
uint64_t wc_file_size(const wfile *f);
/* Before a file left as packed is changed: stages a copy of it (none of
 * its bytes when !keep, as for O_TRUNC) (c->lock held). */
int wc_copy_up(wckpt *c, uint32_t node, wfile *f, int keep);
/* A file's state, or NULL for a directory (c->lock held). */
wfile *wc_file_of(wckpt *c, uint32_t node);
/* Frees a removed file's data once nothing uses it (c->lock held). */
void wc_drop_if_detached(wckpt *c, uint32_t node);
/* A node just detached from the namespace: its staged data goes now (an
 * open descriptor keeps its unlinked blob until closed), the rest of it
 * when the last user lets go (c->lock held). */
void wc_removed(wckpt *c, uint32_t node);

/* State changes (c->lock held). */
/* Can the namespace or data change now? A checkpoint being packed is
 * made writable again first (wc_unpack). */
int wc_modifiable(wckpt *c, const char *what);
/* Stops the packing of c, if any, and makes it writing again: waits for
 * the packer to let go (c->lock released meanwhile). 0, -EROFS if it
 * was committed first, -ENOENT once deleted. */
int wc_unpack(wckpt *c, const char *what);
void wc_touched(wckpt *c, int namespace);
void wc_mark_mtime(wnode *n);
/* A staging write failed: node (WTREE_NONE for the namespace) lost its
 * data from off on. Only a full disk or EIO fails the checkpoint. */
void wc_staging_failed(wckpt *c, int rc, const char *msg, uint32_t node, uint64_t off);
/* Failures of node at offsets first..last (inclusive) were made good;
 * with none left, a checkpoint failed by staging is writing again. */
void wc_staging_repaired(wckpt *c, uint32_t node, uint64_t first, uint64_t last);
/* wc_staging_failed for a write of len bytes at off that failed: all of
 * them are missing until rewritten. */
void wc_staging_write_failed(wckpt *c, int rc, const char *msg, uint32_t node, uint64_t off,
                             size_t len);
/* A commit started: every recorded failure is the packer's to judge. */
void wc_staging_forget_failures(wckpt *c);
/* Saves the namespace (and record) if changed; takes the locks itself.
 * The failed ranges it saves are marked incomplete (a failure after it
 * may never reach the disk: a full disk, then a crash), so after a crash
 * a failed checkpoint stays failed until `ckpt commit`. wc_save_final,
 * at a clean stop, saves them as complete: rewriting them is then enough
 * after the restart too. */
int wc_save(wckpt *c, ckpt_err *err);
int wc_save_final(wckpt *c, ckpt_err *err);

/* Removes BACKING/path and the empty directories below it (what a
 * namespace that became a checkpoint left when a crash cut it short);
 * -ENOTEMPTY if anything else is in it. */
int wc_remove_empty_namespace(wtable *t, const char *path);

/* A rename of a directory over the namespace path replaces it when the
 * mount shows it empty: removes BACKING/path then, its mode in *mode;
 * else -ENOTEMPTY, a checkpoint being written below it included (nothing
 * of that is in BACKING until its commit) (t->lock held). */
int wc_ns_take_empty(wtable *t, const char *path, uint32_t *mode);
/* Makes it again when the rename failed after all. */
void wc_ns_put_back(wtable *t, const char *path, uint32_t mode);

/* Thread bodies (wckpt_jobs.c). */
void *wc_packer_main(void *arg);
void *wc_timer_main(void *arg);

#endif
