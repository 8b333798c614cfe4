/* Paths in the backing directory, shared by both sides of the mount.
 *
 * A checkpoint's name is its path below the mount: "step100", or
 * "run1/checkpoint-500" when it lives in a namespace. Namespaces are
 * plain directories of the backing directory (BACKING/run1/), and a
 * checkpoint is BACKING/PATH.tpack (a directory of files) or
 * BACKING/PATH.tfile (one file, shown as a file). Every component is a
 * real name: not empty, not "." or "..", not ".ckptfs" (the daemon's
 * staging), and at most NAME_MAX bytes with its suffix, so 249. Names
 * may start with '.': the daemon's temporary packs (.NAME.tpack.tmp)
 * end in .tmp, which no pack or namespace shows.
 *
 * Symbolic links in the backing directory are never followed: directories
 * are opened one component at a time with O_NOFOLLOW. */
#ifndef CKPTFS_BACKING_PATH_H
#define CKPTFS_BACKING_PATH_H

#include <stddef.h>
#include <sys/types.h>

#define BACKING_PACK_SUFFIX ".tpack"
#define BACKING_FILE_SUFFIX ".tfile"
/* Both suffixes have this length. */
#define BACKING_SUFFIX_LEN 6u
#define BACKING_RESERVED ".ckptfs"
/* Longest checkpoint or namespace path. */
#define BACKING_PATH_MAX 1024u

/* Is this a checkpoint or namespace path (see above)? */
int backing_path_ok(const char *path);
/* Is this one component of such a path? */
int backing_name_ok(const char *name);

/* The pack of checkpoint path, path.tfile (is_file) or path.tpack, into
 * out (cap bytes); -ENAMETOOLONG. The one place these names are made, for
 * files of the backing directory and objects of a store alike. */
int backing_pack_name(const char *path, int is_file, char *out, size_t cap);

/* The last component of path (path itself when it has no '/'). */
const char *backing_base(const char *path);
/* The directory part of path ("" when none) into out; -ENAMETOOLONG. */
int backing_dir_of(const char *path, char *out, size_t cap);
/* dir + "/" + name (or name when dir is ""), malloc'd; NULL on ENOMEM. */
char *backing_join(const char *dir, const char *name);
/* Is path equal to dir or below it? ("" holds everything.) */
int backing_is_below(const char *path, const char *dir);

/* Opens the directory dir ("" for the backing directory itself) without
 * following links; with create, makes missing components (mode 0755,
 * each fsynced into its parent). The descriptor, or -errno. */
int backing_open_dir(int backing_fd, const char *dir, int create);
/* Opens the directory holding path's last component: the descriptor, or
 * -errno. */
int backing_open_parent(int backing_fd, const char *path, int create);

#endif
