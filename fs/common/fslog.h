/* Daemon logging. Where lines go: stderr while in the foreground, syslog
 * (facility daemon) once daemonized where /dev/log exists (journald or a
 * syslog daemon listens there), else BACKING/.ckptfs/log, rotated by
 * ckptfs itself (fslog_use_rotated_file); or a file with -o log_file
 * (which a SIGHUP reopens, for logrotate). Every message is one line at a syslog
 * priority; bytes that could break a line or a terminal (untrusted names
 * from packs end up in messages) are replaced by '?'. Nothing that holds
 * key material may be passed here.
 *
 * Priorities as used by ckptfs:
 *   LOG_ERR      something failed: packing, a read, saving staged state
 *   LOG_WARNING  something was refused or degraded and someone should act
 *                (wrong key, EBUSY while packing, data lost to a crash)
 *   LOG_NOTICE   normal but worth knowing: packing suspended at exit
 *   LOG_INFO     the life of the mount and its checkpoints (mounted,
 *                committed, recovered, renamed, deleted)
 *   LOG_DEBUG    -o debug only: per-request tracing (trace_ops.c)
 *
 * Does not depend on FUSE, so unit tests can build it. */
#ifndef CKPTFS_FSLOG_H
#define CKPTFS_FSLOG_H

#include <stdarg.h>
#include <stdint.h>
#include <syslog.h>

void fslog_at(int priority, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fslog_vat(int priority, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#define fslog_err(...) fslog_at(LOG_ERR, __VA_ARGS__)
#define fslog_warn(...) fslog_at(LOG_WARNING, __VA_ARGS__)
#define fslog_notice(...) fslog_at(LOG_NOTICE, __VA_ARGS__)
#define fslog_info(...) fslog_at(LOG_INFO, __VA_ARGS__)
#define fslog_debug(...) fslog_at(LOG_DEBUG, __VA_ARGS__)

/* Messages less urgent than this are dropped: LOG_INFO unless -o debug. */
void fslog_set_max_priority(int priority);
int fslog_enabled(int priority);

/* From now on to syslog (after fuse_daemonize, whose stderr is /dev/null). */
void fslog_use_syslog(void);
/* From now on to path, appended, created mode 0600 (names of checkpoints
 * are not for everyone). path must be absolute: the daemon's working
 * directory is "/". 0, or -errno with nothing changed. */
int fslog_use_file(const char *path);
/* fslog_use_file, and the file is rotated by ckptfs once max_bytes were
 * written to it: path -> path.1 -> ... -> path.(keep-1), the oldest
 * dropped, so the log never takes much more than keep * max_bytes. */
int fslog_use_rotated_file(const char *path, uint64_t max_bytes, int keep);
/* Does /dev/log take syslog messages (a socket there)? */
int fslog_syslog_available(void);
/* While on: messages at LOG_WARNING or above also go to stderr. For the
 * start of a mount with -o log_file, so that why a mount failed is shown
 * where it was typed, not only in the file. */
void fslog_tee_stderr(int on);
/* Where lines go now: "stderr", "syslog" or the file's path. */
const char *fslog_destination(void);

/* SIGHUP: have the log file reopened (a no-op unless logging to a file).
 * Async-signal-safe: it only writes a byte to a pipe that a thread started
 * by fslog_start_reopener() reads. */
void fslog_request_reopen(void);
/* Starts that thread; without it requests are ignored. 0 or -errno. Call
 * after any fork, with the signals the daemon handles blocked. */
int fslog_start_reopener(void);

/* Stops the reopener and closes syslog or the file; later lines go to
 * stderr. */
void fslog_close(void);

#endif
