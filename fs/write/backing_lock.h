/* One writer per backing directory: a writable daemon holds an exclusive
 * flock(2) on BACKING/.ckptfs/lock for as long as it runs, and the file
 * says who holds it ("pid PID mount MOUNTPOINT\n", written once the lock
 * is taken). Another writable daemon on the same backing directory is
 * refused at start, before it recovers or deletes anything, with the
 * holder's pid and mount point in the message. Read-only mounts take no
 * lock: they change nothing.
 *
 * flock rather than a POSIX record lock: it belongs to the open file, so
 * it survives the daemon's fork into the background (fuse_daemonize),
 * and it goes with the process, however that ends (no stale lock after a
 * crash). A file of its own, so it can move to a store's lock operation
 * later without touching the rest. */
#ifndef CKPTFS_BACKING_LOCK_H
#define CKPTFS_BACKING_LOCK_H

#include "ckpt.h"

#define BACKING_LOCK_FILE "lock"

/* Takes the lock of the backing directory (backing_path names it in
 * messages) and records this process and mount_path in it: the lock's
 * descriptor in *fd. -EBUSY when another process holds it (err names its
 * pid and mount point), another -errno when the file cannot be made (a
 * read-only backing directory). */
int backing_lock_take(int backing_fd, const char *backing_path, const char *mount_path, int *fd,
                      ckpt_err *err);
/* Writes this process's pid again (after fork, the daemon's pid is new). */
int backing_lock_note_pid(int fd, const char *mount_path);
/* Lets go (close); -1 is ignored. */
void backing_lock_release(int fd);

#endif
