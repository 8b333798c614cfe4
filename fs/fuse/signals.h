/* The daemon's signals.
 *
 * SIGTERM and SIGINT end the FUSE loop (libfuse's handler); main then
 * unmounts and suspends packing (wtable_stop). SIGHUP, which libfuse would
 * treat the same way, reopens the log file instead (fslog).
 *
 * libfuse's handler only sets a flag that the loop looks at when a read
 * from /dev/fuse returns, and its own worker threads block these signals,
 * so the signal must land on the thread running the loop: every thread
 * ckptfs starts (and the threads those start) must block them too. Hence
 * signals_block() before starting any, and signals_unblock() once all of
 * them run, just before the loop. */
#ifndef CKPTFS_SIGNALS_H
#define CKPTFS_SIGNALS_H

#include <signal.h>

#include "fuse_api.h"

/* Blocks SIGTERM, SIGINT, SIGHUP and SIGQUIT in the calling thread, and so
 * in every thread it starts from now on; *saved is the mask before. */
void signals_block(sigset_t *saved);
void signals_unblock(const sigset_t *saved);

/* libfuse's handlers for the session, with SIGHUP taken over to request a
 * log reopen. 0, or -1 after saying why. */
int signals_install(struct fuse_session *se);
/* SIGTERM and SIGINT back to their defaults (a second one while exiting
 * ends the process at once); SIGHUP ignored until exit. */
void signals_remove(struct fuse_session *se);

/* A name for what fuse_session_loop returned when a signal ended it (the
 * signal number), or NULL. */
const char *signals_name(int sig);

#endif
