/* Symbolic links in a pack. The pack format has files only, so the links
 * of a checkpoint are one reserved file at its top, ".ckptfs-links": JSON,
 *
 *   {"version": 1, "links": [{"path": "snapshots/abc/config.json",
 *     "target": "../../blobs/5f1e...", "mtime": [1732400000, 123456789]}]}
 *
 * paths relative to the checkpoint directory, targets as given to
 * symlink(2) (never resolved by the daemon: the kernel follows them). The
 * read side shows each as a symbolic link and hides the file; the write
 * side writes it when packing. One home for the encoding. */
#ifndef CKPTFS_LINKS_H
#define CKPTFS_LINKS_H

#include <stddef.h>
#include <stdint.h>

#define LINKS_FILE ".ckptfs-links"
/* Targets as Linux allows them: 1 to PATH_MAX - 1 bytes, no NUL. */
#define LINK_TARGET_MAX 4095u

typedef struct link_entry {
    const char *path;
    const char *target;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
} link_entry;

/* 0 for a target symlink(2) would take, else -ENOENT (empty) or
 * -ENAMETOOLONG. */
int link_target_check(const char *target);
/* The file's bytes, malloc'd (not NUL-terminated); 0 or -ENOMEM. */
int links_encode(const link_entry *v, size_t n, char **out, size_t *len);
/* Calls fn for each well-formed entry (path and target checked as
 * strings only); -EIO if the file is not one. */
int links_decode(const char *buf, size_t len, int (*fn)(void *ud, const link_entry *e), void *ud);

#endif
