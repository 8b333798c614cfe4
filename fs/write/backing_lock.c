/* The backing directory's writer lock (backing_lock.h). */
#include "backing_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "stage.h"

/* Who holds the lock, from what it wrote: "pid 12, mounted on /mnt". */
static void read_holder(int fd, char *out, size_t cap)
{
    char line[4200];
    ssize_t n = pread(fd, line, sizeof line - 1, 0);
    line[n > 0 ? n : 0] = '\0';
    line[strcspn(line, "\n")] = '\0';
    long pid;
    int at = 0;
    if (sscanf(line, "pid %ld mount %n", &pid, &at) == 1 && at > 0)
        snprintf(out, cap, "pid %ld, mounted on %s", pid, line + at);
    else
        snprintf(out, cap, "%s", line[0] ? line : "its lock file is still empty");
}

int backing_lock_note_pid(int fd, const char *mount_path)
{
    char line[4200];
    int len = snprintf(line, sizeof line, "pid %ld mount %s\n", (long)getpid(),
                       mount_path ? mount_path : "?");
    if (len < 0 || (size_t)len >= sizeof line)
        len = snprintf(line, sizeof line, "pid %ld mount ?\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
        return -errno;
    return 0;
}

int backing_lock_take(int backing_fd, const char *backing_path, const char *mount_path, int *fd,
                      ckpt_err *err)
{
    *fd = -1;
    if (mkdirat(backing_fd, STAGE_HIDDEN_DIR, 0700) != 0 && errno != EEXIST)
        return ckpt_fail(err, -errno, "%s/%s: cannot create: %s", backing_path, STAGE_HIDDEN_DIR,
                         strerror(errno));
    int hidden =
        openat(backing_fd, STAGE_HIDDEN_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (hidden < 0)
        return ckpt_fail(err, -errno, "%s/%s: cannot open: %s", backing_path, STAGE_HIDDEN_DIR,
                         strerror(errno));
    char shown[4200];
    snprintf(shown, sizeof shown, "%s/%s", backing_path, STAGE_HIDDEN_DIR);
    int rc = stage_private_dir(hidden, shown, err);
    if (rc < 0) {
        close(hidden);
        return rc;
    }
    int lfd = openat(hidden, BACKING_LOCK_FILE, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    int open_errno = errno;
    close(hidden);
    if (lfd < 0)
        return ckpt_fail(err, -open_errno, "%s/%s/%s: cannot open the writer lock: %s",
                         backing_path, STAGE_HIDDEN_DIR, BACKING_LOCK_FILE, strerror(open_errno));
    while ((rc = flock(lfd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR)
        ;
    if (rc != 0) {
        int e = errno;
        char holder[4200];
        read_holder(lfd, holder, sizeof holder);
        close(lfd);
        if (e != EWOULDBLOCK)
            return ckpt_fail(err, -e, "%s/%s/%s: cannot lock: %s", backing_path, STAGE_HIDDEN_DIR,
                             BACKING_LOCK_FILE, strerror(e));
        return ckpt_fail(err, -EBUSY,
                         "%s is already served by a writable ckptfs (%s): one writer per backing "
                         "directory; unmount that one first, or mount this one read-only (-o ro)",
                         backing_path, holder);
    }
    rc = backing_lock_note_pid(lfd, mount_path);
    if (rc) {
        close(lfd);
        return ckpt_fail(err, rc, "%s/%s/%s: cannot write: %s", backing_path, STAGE_HIDDEN_DIR,
                         BACKING_LOCK_FILE, strerror(-rc));
    }
    *fd = lfd;
    return 0;
}

void backing_lock_release(int fd)
{
    if (fd >= 0)
        close(fd);
}
