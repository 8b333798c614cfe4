/* The listings of a store that has no directory to look at (S3): what
 * each namespace holds, listed with ckpt_store_list_dirs at most once per
 * interval and answered from memory in between. A lookup of every path
 * the kernel asks about (ls -l, a shell's completion) would otherwise be
 * one LIST request each; the price is that a pack uploaded by another
 * writer shows up within the interval, not at once.
 *
 * When a listing fails (the gateway is down) the last good one goes on
 * being answered, with one warning until listing works again, and the
 * listing is tried again an interval after the failure ended; a
 * namespace never listed fails with the store's error.
 *
 * Thread-safe: one mutex, not held during a refresh; concurrent lookups
 * of a namespace being refreshed wait for it (one request, not one each),
 * or, once its listing has failed, are answered from the last good one
 * without waiting for the store's retries. */
#ifndef CKPTFS_REMOTE_LISTING_H
#define CKPTFS_REMOTE_LISTING_H

#include <stddef.h>

#include "ckpt.h"

typedef struct remote_listing remote_listing;

typedef struct remote_entry {
    char *name;        /* within its namespace: "x.tpack", "run1" */
    int is_dir;        /* a namespace (an S3 common prefix) */
    ckpt_object_id id; /* objects only */
} remote_entry;

/* interval: seconds a listing is answered from memory. NULL: no memory. */
remote_listing *remote_listing_new(ckpt_store *s, double interval);
void remote_listing_free(remote_listing *r);

/* A copy of namespace ns's entries ("" for the top), refreshed first if
 * older than the interval; free with remote_entries_free. */
int remote_listing_get(remote_listing *r, const char *ns, remote_entry **out, size_t *n);
void remote_entries_free(remote_entry *v, size_t n);

/* Is base (an object when !want_dir, a namespace when want_dir) in ns?
 * 1 (with its identity in *id for an object; id may be NULL), 0, or
 * -errno when ns cannot be listed. */
int remote_listing_find(remote_listing *r, const char *ns, const char *base, int want_dir,
                        ckpt_object_id *id);

/* Forgets what is known of ns, so the next question lists it again: after
 * this daemon uploaded or deleted a pack there. */
void remote_listing_invalidate(remote_listing *r, const char *ns);

#endif
