/* Daemon logging: stderr while in the foreground, syslog once daemonized.
 * Every message is one line; bytes that could break a line or a terminal
 * (untrusted names from packs end up in messages) are replaced by '?'. */
#ifndef CKPTFS_FSLOG_H
#define CKPTFS_FSLOG_H

void fslog_use_syslog(void);
void fslog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fslog_close(void);

#endif
