/* `ckpt status`: what the one-shot listing (cmd_status.c) and the live view
 * (status_watch.c) share. */
#ifndef CKPT_STATUS_H
#define CKPT_STATUS_H

#include <stddef.h>

#include "cli.h"

typedef struct status_entry {
    char *name, *path;
    mount_state st;
} status_entry;

/* The checkpoints to show: path itself if it is one, else its entries,
 * sorted by name. 0 or -errno (-ENODATA: not a ckptfs mount). */
int status_collect(const char *path, status_entry **out, size_t *n);
void status_free(status_entry *v, size_t n);

/* Is this a state in which the pack cannot be read or packing failed, so
 * that the error is the news? */
int status_is_error_state(const char *state);
/* EXIT_CKPT_FAILED if any of v is in an error state other than
 * unreachable, else EXIT_CKPT_UNREACHABLE if any is unreachable, else
 * EXIT_OK. */
int status_exit(const status_entry *v, size_t n);

/* The live view: refreshes every interval seconds until interrupted. On a
 * terminal it redraws a table fitted to its width in place; otherwise it
 * appends a plain line whenever a checkpoint's line changes. once: draw one
 * table and return (plain `ckpt status` on a terminal) with status_exit's
 * answer. */
int status_watch(const char *path, double interval, int once);

#endif
