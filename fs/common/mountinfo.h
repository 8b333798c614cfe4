/* What is mounted where, from /proc/self/mountinfo (proc(5)): used to
 * refuse mounting ckptfs on a mount point that already is one, which
 * would hide the first mount behind the second without a word. */
#ifndef CKPTFS_MOUNTINFO_H
#define CKPTFS_MOUNTINFO_H

#include <stddef.h>

#define MOUNTINFO_SELF "/proc/self/mountinfo"

/* The filesystem type ("ext4", "fuse.ckptfs") of the topmost mount at
 * mount_point (an absolute path, as mountinfo shows it) into fstype:
 * 1 when something is mounted there, 0 when nothing is, or -errno when
 * the table cannot be read. */
int mountinfo_fstype(const char *table, const char *mount_point, char *fstype, size_t cap);

#endif
