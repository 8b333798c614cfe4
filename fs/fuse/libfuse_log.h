/* libfuse's own messages (fuse_log) through fslog, at their priority, so
 * that once daemonized they reach syslog or the log file rather than the
 * /dev/null fuse_daemonize makes of stderr. */
#ifndef CKPTFS_LIBFUSE_LOG_H
#define CKPTFS_LIBFUSE_LOG_H

void libfuse_log_to_fslog(void);

#endif
