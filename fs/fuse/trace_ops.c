/* The arrival half of -o debug tracing (trace.h): a copy of the operations
 * table whose entries log the request, with the arguments libfuse decoded,
 * then call the real operation. Installed only with -o debug. */
#include "trace.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/fslog.h"

static const struct fuse_lowlevel_ops *inner;
static struct fuse_lowlevel_ops traced;

/* "#id op ino=N args pid=P". Inode 0 (no inode: forget_multi) is left out. */
static void arrive(const char *op, fuse_ino_t ino, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void arrive(const char *op, fuse_ino_t ino, const char *fmt, ...)
{
    trace_req *r = trace_current();
    r->op = op;
    char args[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char inode[32] = "";
    if (ino)
        snprintf(inode, sizeof inode, " ino=%" PRIu64, (uint64_t)ino);
    fslog_debug("#%" PRIu64 " %s%s%s%s pid=%" PRIu32, r->unique, op, inode, args[0] ? " " : "",
                args, r->pid);
}

/* ckptfs replies before an operation returns; if one ever does not, the
 * reply (logged when it goes) is not mistaken for a lost request. */
static void depart(void)
{
    trace_req *r = trace_current();
    if (r->unique && !r->replied)
        fslog_debug("#%" PRIu64 " %s: no reply yet (answered later)", r->unique,
                    r->op ? r->op : "request");
}

/* ------------------------------------------------------------ flags */

static void add_name(char *out, size_t cap, size_t *len, const char *name)
{
    if (*len < cap)
        *len += (size_t)snprintf(out + *len, cap - *len, "%s%s", *len ? "|" : "", name);
}

/* The kernel's O_LARGEFILE, which glibc defines as 0 on 64-bit machines
 * but the kernel still sets on every open there. */
#if defined(__x86_64__) || defined(__aarch64__)
#define KERNEL_O_LARGEFILE 0100000
#else
#define KERNEL_O_LARGEFILE 0
#endif

static const char *open_flags(int flags, char *out, size_t cap)
{
    static const struct {
        int bit;
        const char *name;
    } known[] = {
        {O_CREAT, "O_CREAT"},       {O_EXCL, "O_EXCL"},
        {O_NOCTTY, "O_NOCTTY"},     {O_TRUNC, "O_TRUNC"},
        {O_APPEND, "O_APPEND"},     {O_NONBLOCK, "O_NONBLOCK"},
        {O_SYNC, "O_SYNC"},         {O_DSYNC, "O_DSYNC"},
        {O_DIRECT, "O_DIRECT"},     {O_DIRECTORY, "O_DIRECTORY"},
        {O_NOFOLLOW, "O_NOFOLLOW"}, {O_NOATIME, "O_NOATIME"},
        {O_CLOEXEC, "O_CLOEXEC"},   {O_PATH, "O_PATH"},
        {O_TMPFILE, "O_TMPFILE"},   {KERNEL_O_LARGEFILE, "O_LARGEFILE"},
    };
    size_t len = 0;
    int acc = flags & O_ACCMODE;
    add_name(out, cap, &len,
             acc == O_RDONLY   ? "O_RDONLY"
             : acc == O_WRONLY ? "O_WRONLY"
             : acc == O_RDWR   ? "O_RDWR"
                               : "O_ACCMODE");
    int rest = flags & ~O_ACCMODE;
    /* Composite flags (O_SYNC holds O_DSYNC) come first in the table. */
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (known[i].bit && (rest & known[i].bit) == known[i].bit) {
            add_name(out, cap, &len, known[i].name);
            rest &= ~known[i].bit;
        }
    }
    if (rest && len < cap)
        snprintf(out + len, cap - len, "|0%o", (unsigned)rest);
    return out;
}

static const char *setattr_what(const struct stat *attr, int to_set, char *out, size_t cap)
{
    size_t len = 0;
    char v[64];
    if (to_set & FUSE_SET_ATTR_MODE) {
        snprintf(v, sizeof v, "mode=0%o", (unsigned)(attr->st_mode & 07777));
        add_name(out, cap, &len, v);
    }
    if (to_set & FUSE_SET_ATTR_UID)
        add_name(out, cap, &len, "uid");
    if (to_set & FUSE_SET_ATTR_GID)
        add_name(out, cap, &len, "gid");
    if (to_set & FUSE_SET_ATTR_SIZE) {
        snprintf(v, sizeof v, "size=%" PRId64, (int64_t)attr->st_size);
        add_name(out, cap, &len, v);
    }
    if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW))
        add_name(out, cap, &len, to_set & FUSE_SET_ATTR_ATIME_NOW ? "atime=now" : "atime");
    if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW))
        add_name(out, cap, &len, to_set & FUSE_SET_ATTR_MTIME_NOW ? "mtime=now" : "mtime");
    if (to_set & FUSE_SET_ATTR_CTIME)
        add_name(out, cap, &len, "ctime");
    if (!len)
        snprintf(out, cap, "0x%x", (unsigned)to_set);
    return out;
}

/* ------------------------------------------------------- operations */

static void t_init(void *userdata, struct fuse_conn_info *conn)
{
    arrive("init", 0, "kernel protocol %u.%u", conn->proto_major, conn->proto_minor);
    inner->init(userdata, conn);
    fslog_debug("init: max_write=%u max_readahead=%u max_background=%u "
                "congestion_threshold=%u capable=0x%x want=0x%x",
                conn->max_write, conn->max_readahead, conn->max_background,
                conn->congestion_threshold, conn->capable, conn->want);
}

static void t_destroy(void *userdata)
{
    fslog_debug("destroy");
    inner->destroy(userdata);
}

static void t_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    arrive("lookup", parent, "name='%s'", name);
    inner->lookup(req, parent, name);
    depart();
}

static void t_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    arrive("forget", ino, "nlookup=%" PRIu64, nlookup);
    inner->forget(req, ino, nlookup); /* no reply: none to wait for */
}

static void t_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    arrive("forget_multi", 0, "count=%zu", count);
    inner->forget_multi(req, count, forgets);
}

static void t_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    arrive("getattr", ino, "%s", "");
    inner->getattr(req, ino, fi);
    depart();
}

static void t_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                      struct fuse_file_info *fi)
{
    char what[160];
    arrive("setattr", ino, "set=%s", setattr_what(attr, to_set, what, sizeof what));
    inner->setattr(req, ino, attr, to_set, fi);
    depart();
}

static void t_readlink(fuse_req_t req, fuse_ino_t ino)
{
    arrive("readlink", ino, "%s", "");
    inner->readlink(req, ino);
    depart();
}

static void t_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    arrive("mknod", parent, "name='%s' mode=0%o", name, (unsigned)mode);
    inner->mknod(req, parent, name, mode, rdev);
    depart();
}

static void t_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    arrive("mkdir", parent, "name='%s' mode=0%o", name, (unsigned)mode);
    inner->mkdir(req, parent, name, mode);
    depart();
}

static void t_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    arrive("unlink", parent, "name='%s'", name);
    inner->unlink(req, parent, name);
    depart();
}

static void t_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    arrive("rmdir", parent, "name='%s'", name);
    inner->rmdir(req, parent, name);
    depart();
}

static void t_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    /* The target is the link's contents: its length only. */
    arrive("symlink", parent, "name='%s' target=%zu bytes", name, strlen(link));
    inner->symlink(req, link, parent, name);
    depart();
}

static void t_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                     const char *newname, unsigned int flags)
{
    arrive("rename", parent, "name='%s' newparent=%" PRIu64 " newname='%s'%s%s", name,
           (uint64_t)newparent, newname, flags & RENAME_NOREPLACE ? " noreplace" : "",
           flags & RENAME_EXCHANGE ? " exchange" : "");
    inner->rename(req, parent, name, newparent, newname, flags);
    depart();
}

static void t_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    arrive("link", ino, "newparent=%" PRIu64 " newname='%s'", (uint64_t)newparent, newname);
    inner->link(req, ino, newparent, newname);
    depart();
}

static void t_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    char flags[200];
    arrive("open", ino, "flags=%s", open_flags(fi->flags, flags, sizeof flags));
    inner->open(req, ino, fi);
    depart();
}

static void t_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    arrive("read", ino, "off=%" PRId64 " size=%zu", (int64_t)off, size);
    inner->read(req, ino, size, off, fi);
    depart();
}

static void t_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                        struct fuse_file_info *fi)
{
    arrive("write", ino, "off=%" PRId64 " size=%zu", (int64_t)off, fuse_buf_size(bufv));
    inner->write_buf(req, ino, bufv, off, fi);
    depart();
}

static void t_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    arrive("flush", ino, "%s", "");
    inner->flush(req, ino, fi);
    depart();
}

static void t_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    arrive("release", ino, "%s", "");
    inner->release(req, ino, fi);
    depart();
}

static void t_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    arrive("fsync", ino, "datasync=%d", datasync);
    inner->fsync(req, ino, datasync, fi);
    depart();
}

static void t_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    arrive("opendir", ino, "%s", "");
    inner->opendir(req, ino, fi);
    depart();
}

static void t_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    arrive("readdir", ino, "off=%" PRId64 " size=%zu", (int64_t)off, size);
    inner->readdir(req, ino, size, off, fi);
    depart();
}

static void t_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    arrive("releasedir", ino, "%s", "");
    inner->releasedir(req, ino, fi);
    depart();
}

static void t_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    arrive("fsyncdir", ino, "datasync=%d", datasync);
    inner->fsyncdir(req, ino, datasync, fi);
    depart();
}

static void t_statfs(fuse_req_t req, fuse_ino_t ino)
{
    arrive("statfs", ino, "%s", "");
    inner->statfs(req, ino);
    depart();
}

static void t_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                       size_t size, int flags)
{
    /* The value is data: its size only. */
    arrive("setxattr", ino, "name='%s' size=%zu flags=0x%x", name, size, (unsigned)flags);
    inner->setxattr(req, ino, name, value, size, flags);
    depart();
}

static void t_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    arrive("getxattr", ino, "name='%s' size=%zu", name, size);
    trace_current()->size_probe = size == 0;
    inner->getxattr(req, ino, name, size);
    depart();
}

static void t_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    arrive("listxattr", ino, "size=%zu", size);
    trace_current()->size_probe = size == 0;
    inner->listxattr(req, ino, size);
    depart();
}

static void t_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    arrive("removexattr", ino, "name='%s'", name);
    inner->removexattr(req, ino, name);
    depart();
}

static void t_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
    arrive("access", ino, "mask=%s%s%s%s", mask == F_OK ? "F_OK" : "", mask & R_OK ? "r" : "",
           mask & W_OK ? "w" : "", mask & X_OK ? "x" : "");
    inner->access(req, ino, mask);
    depart();
}

static void t_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                     struct fuse_file_info *fi)
{
    char flags[200];
    arrive("create", parent, "name='%s' mode=0%o flags=%s", name, (unsigned)mode,
           open_flags(fi->flags, flags, sizeof flags));
    inner->create(req, parent, name, mode, fi);
    depart();
}

static void t_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                        struct fuse_file_info *fi)
{
    arrive("fallocate", ino, "mode=0x%x off=%" PRId64 " len=%" PRId64, (unsigned)mode,
           (int64_t)offset, (int64_t)length);
    inner->fallocate(req, ino, mode, offset, length, fi);
    depart();
}

const struct fuse_lowlevel_ops *trace_ops(const struct fuse_lowlevel_ops *ops)
{
    inner = ops;
    /* Operations not wrapped here still work, untraced on arrival (their
     * outcome is logged all the same). */
    traced = *ops;
#define WRAP(field, fn)                                                                            \
    if (ops->field)                                                                                \
        traced.field = fn;
    WRAP(init, t_init)
    WRAP(destroy, t_destroy)
    WRAP(lookup, t_lookup)
    WRAP(forget, t_forget)
    WRAP(forget_multi, t_forget_multi)
    WRAP(getattr, t_getattr)
    WRAP(setattr, t_setattr)
    WRAP(readlink, t_readlink)
    WRAP(mknod, t_mknod)
    WRAP(mkdir, t_mkdir)
    WRAP(unlink, t_unlink)
    WRAP(rmdir, t_rmdir)
    WRAP(symlink, t_symlink)
    WRAP(rename, t_rename)
    WRAP(link, t_link)
    WRAP(open, t_open)
    WRAP(read, t_read)
    WRAP(write_buf, t_write_buf)
    WRAP(flush, t_flush)
    WRAP(release, t_release)
    WRAP(fsync, t_fsync)
    WRAP(opendir, t_opendir)
    WRAP(readdir, t_readdir)
    WRAP(releasedir, t_releasedir)
    WRAP(fsyncdir, t_fsyncdir)
    WRAP(statfs, t_statfs)
    WRAP(setxattr, t_setxattr)
    WRAP(getxattr, t_getxattr)
    WRAP(listxattr, t_listxattr)
    WRAP(removexattr, t_removexattr)
    WRAP(access, t_access)
    WRAP(create, t_create)
    WRAP(fallocate, t_fallocate)
#undef WRAP
    return &traced;
}
