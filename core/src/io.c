/* Whole reads and writes over file descriptors (ckpt_internal.h): the one
 * EINTR-and-short-transfer loop for the library, the daemon and the tools.
 * Each function is the same loop over a different system call; positioned
 * and streaming variants differ only in whether the offset advances. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_open_regular(const char *path, int flags, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | flags);
    if (fd < 0)
        return -errno;
    int rc = fstat(fd, st) < 0 ? -errno : !S_ISREG(st->st_mode) ? -EINVAL : 0;
    if (rc == 0 && fcntl(fd, F_SETFL, 0) < 0)
        rc = -errno;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

ssize_t ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break; /* end of file */
        done += (size_t)r;
    }
    return (ssize_t)done;
}

ssize_t ckpt_read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = read(fd, p + done, len - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break; /* end of file */
        done += (size_t)r;
    }
    return (ssize_t)done;
}

ssize_t ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, p + done, len - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        done += (size_t)w;
    }
    return (ssize_t)done;
}

ssize_t ckpt_write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        done += (size_t)w;
    }
    return (ssize_t)done;
}
