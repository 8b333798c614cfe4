#include "backing_path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int component_ok(const char *p, size_t n)
{
    if (n == 0 || n + BACKING_SUFFIX_LEN > NAME_MAX)
        return 0;
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
        return 0;
    return !(n == sizeof BACKING_RESERVED - 1 && memcmp(p, BACKING_RESERVED, n) == 0);
}

int backing_name_ok(const char *name)
{
    return !strchr(name, '/') && component_ok(name, strlen(name));
}

int backing_path_ok(const char *path)
{
    size_t len = strlen(path);
    if (len == 0 || len > BACKING_PATH_MAX)
        return 0;
    const char *p = path;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (!component_ok(p, n))
            return 0;
        if (!slash)
            return 1;
        p = slash + 1;
    }
}

int backing_pack_name(const char *path, int is_file, char *out, size_t cap)
{
    size_t n = strlen(path);
    if (n + BACKING_SUFFIX_LEN >= cap)
        return -ENAMETOOLONG;
    memcpy(out, path, n);
    memcpy(out + n, is_file ? BACKING_FILE_SUFFIX : BACKING_PACK_SUFFIX, BACKING_SUFFIX_LEN + 1);
    return 0;
}

const char *backing_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int backing_dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= cap)
        return -ENAMETOOLONG;
    memcpy(out, path, n);
    out[n] = '\0';
    return 0;
}

char *backing_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s)
        return NULL;
    if (a) {
        memcpy(s, dir, a);
        s[a++] = '/';
    }
    memcpy(s + a, name, b + 1);
    return s;
}

int backing_is_below(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 0)
        return 1;
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int backing_open_dir(int backing_fd, const char *dir, int create)
{
    int fd = openat(backing_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    const char *p = dir;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        char name[NAME_MAX + 1];
        if (n == 0 || n > NAME_MAX) {
            close(fd);
            return n ? -ENAMETOOLONG : -EINVAL;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        int next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, name, 0755) != 0 && errno != EEXIST) {
                int e = errno;
                close(fd);
                return -e;
            }
            fsync(fd);
            next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        }
        int e = errno;
        close(fd);
        if (next < 0)
            return e == ELOOP ? -ENOTDIR : -e;
        fd = next;
        p += n;
        if (*p == '/')
            p++;
    }
    return fd;
}

int backing_open_parent(int backing_fd, const char *path, int create)
{
    char dir[BACKING_PATH_MAX + 1];
    int rc = backing_dir_of(path, dir, sizeof dir);
    return rc ? rc : backing_open_dir(backing_fd, dir, create);
}
