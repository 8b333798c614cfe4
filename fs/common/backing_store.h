/* A mount whose packs live in an object store (s3://BUCKET/PREFIX) rather
 * than a backing directory: what it keeps locally instead.
 *
 * The staging area of checkpoints being written must be a local
 * directory (files are written at random offsets, renamed, fsynced),
 * and it holds this mount's writer lock and log. By default it is
 * $XDG_CACHE_HOME/ckptfs/<hash> (~/.cache/ckptfs/<hash>), the hash of the
 * URL and endpoint, so a second mount of the same prefix finds what an
 * interrupted one left staged, and two prefixes never share one. */
#ifndef CKPTFS_BACKING_STORE_H
#define CKPTFS_BACKING_STORE_H

/* Is the backing argument a store URL rather than a directory? */
int backing_is_store_url(const char *arg);

/* The default staging directory of url (endpoint may be NULL), malloc'd;
 * NULL when no home directory is known (then stage_dir is required). */
char *backing_default_stage_dir(const char *url, const char *endpoint);

/* mkdir -p path with mode 0700 for what it makes. 0 or -errno. */
int backing_make_dirs(const char *path);

#endif
