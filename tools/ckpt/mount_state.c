/* Reading a ckptfs mount's checkpoint state: the user.ckptfs.* extended
 * attributes of each checkpoint directory. They are the whole interface
 * between `ckpt commit`/`ckpt status` and the daemon, so both commands
 * work with nothing but a path. */
#include "cli.h"
#include "ckpt_mount.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

/* The attribute's value as a string in buf; 0 or -errno. */
static int get_attr(const char *path, const char *name, char *buf, size_t cap)
{
    ssize_t n = getxattr(path, name, buf, cap - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return 0;
}

int mount_state_read(const char *path, mount_state *st)
{
    memset(st, 0, sizeof *st);
    int rc = get_attr(path, CKPT_XATTR_STATE, st->state, sizeof st->state);
    if (rc)
        return rc;
    char buf[128];
    if (get_attr(path, CKPT_XATTR_SIZE, buf, sizeof buf) == 0)
        st->size = strtoull(buf, NULL, 10);
    if (get_attr(path, CKPT_XATTR_PROGRESS, buf, sizeof buf) == 0 &&
        sscanf(buf, "%" SCNu64 " %" SCNu64 " %lf", &st->done, &st->total, &st->seconds) != 3)
        st->done = st->total = 0;
    if (get_attr(path, CKPT_XATTR_ERROR, st->error, sizeof st->error) != 0)
        st->error[0] = '\0';
    /* Printed as they are: the error quotes file names. */
    cli_sanitize(st->state);
    cli_sanitize(st->error);
    return 0;
}

const char *mount_state_why(int rc)
{
    switch (-rc) {
    case ENODATA:
    case ENOTSUP:
        return "not a checkpoint directory of a ckptfs mount";
    case ENOENT:
        return "no such checkpoint";
    case ENOTCONN:
        return "the ckptfs daemon is not running (mount is disconnected)";
    default:
        return strerror(-rc);
    }
}

double mount_state_eta(const mount_state *st)
{
    if (st->done == 0 || st->total <= st->done || st->seconds < 0.5)
        return -1;
    return st->seconds * (double)(st->total - st->done) / (double)st->done;
}
