/* Mount paths for the commands that read a pack: given MOUNT/NAME, a
 * checkpoint directory of a ckptfs mount, `ckpt ls|info|cat|verify|unpack`
 * open the pack it is read from, which the daemon names in the
 * user.ckptfs.pack attribute (ckpt_mount.h). The pack is read directly, not
 * through the mount, so an encrypted one needs its key here too, and
 * `ckpt verify` checks the bytes on disk. */
#include "cli.h"
#include "ckpt_mount.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

/* Whether dir is a namespace of a mount (a directory of checkpoints, such
 * as run1/ holding run1/checkpoint-500/): its state attributes sum up the
 * checkpoints below it, which have a state of their own, where the files
 * and directories inside a checkpoint have none. */
static int is_namespace(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    char child[4096];
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if ((size_t)snprintf(child, sizeof child, "%s/%s", dir, e->d_name) >= sizeof child)
            continue;
        found = lgetxattr(child, CKPT_XATTR_STATE, NULL, 0) >= 0;
    }
    closedir(d);
    return found;
}

int cli_resolve_pack(const char **path, char *buf, size_t cap)
{
    struct stat st;
    if (stat(*path, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0; /* a pack, or an error ckpt_open names */
    ssize_t n = getxattr(*path, CKPT_XATTR_PACK, buf, cap - 1);
    if (n > 0) {
        buf[n] = '\0';
        *path = buf;
        return 0;
    }
    if (n < 0 && errno == ENOTCONN)
        return cli_fail("%s: the ckptfs daemon is not running (mount is disconnected)", *path);
    mount_state ms;
    if (mount_state_read(*path, &ms) == 0) {
        if (is_namespace(*path))
            return cli_fail("%s: a namespace of a ckptfs mount (a directory of checkpoints), not "
                            "a checkpoint: name one of them ('ckpt status %s' lists them)",
                            *path, *path);
        return cli_fail("%s: this checkpoint is %s: it has no pack until it is committed "
                        "('ckpt commit --wait %s')",
                        *path, ms.state, *path);
    }
    return cli_fail("%s: is a directory, not a pack nor a checkpoint of a ckptfs mount", *path);
}
