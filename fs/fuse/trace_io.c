/* The outcome half of -o debug tracing (trace.h): libfuse reads requests
 * and writes replies through these hooks, which note each request's id as
 * it arrives and log each reply as it leaves. The headers are the kernel's
 * protocol (linux/fuse.h), the one thing every reply has in common, so no
 * reply function of libfuse needs wrapping. */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/fslog.h"

static _Thread_local trace_req current;

trace_req *trace_current(void)
{
    return &current;
}

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* For requests that no operation of ours saw (libfuse answers those it
 * has no operation for, and interrupts). */
static const char *opcode_name(uint32_t op)
{
    switch (op) {
    case FUSE_LOOKUP:
        return "lookup";
    case FUSE_GETATTR:
        return "getattr";
    case FUSE_SETATTR:
        return "setattr";
    case FUSE_READLINK:
        return "readlink";
    case FUSE_MKNOD:
        return "mknod";
    case FUSE_MKDIR:
        return "mkdir";
    case FUSE_OPEN:
        return "open";
    case FUSE_READ:
        return "read";
    case FUSE_WRITE:
        return "write";
    case FUSE_INIT:
        return "init";
    case FUSE_GETLK:
        return "getlk";
    case FUSE_SETLK:
        return "setlk";
    case FUSE_SETLKW:
        return "setlkw";
    case FUSE_INTERRUPT:
        return "interrupt";
    case FUSE_BMAP:
        return "bmap";
    case FUSE_DESTROY:
        return "destroy";
    case FUSE_IOCTL:
        return "ioctl";
    case FUSE_POLL:
        return "poll";
    case FUSE_LSEEK:
        return "lseek";
    case FUSE_COPY_FILE_RANGE:
        return "copy_file_range";
    case FUSE_SYNCFS:
        return "syncfs";
    case FUSE_TMPFILE:
        return "tmpfile";
    case FUSE_READDIRPLUS:
        return "readdirplus";
    }
    return "request";
}

/* The first len bytes after the header, across the iovecs. */
static size_t copy_payload(const struct iovec *iov, int count, void *dst, size_t len)
{
    size_t got = 0;
    for (int i = 1; i < count && got < len; i++) {
        size_t take = iov[i].iov_len < len - got ? iov[i].iov_len : len - got;
        memcpy((char *)dst + got, iov[i].iov_base, take);
        got += take;
    }
    return got;
}

/* What a successful reply says, for the requests where that is more than
 * "ok": the inode found or made, or how many bytes. */
static void describe_success(const trace_req *r, const struct iovec *iov, int count, size_t payload,
                             char *out, size_t cap)
{
    switch (r->opcode) {
    case FUSE_LOOKUP:
    case FUSE_MKNOD:
    case FUSE_MKDIR:
    case FUSE_SYMLINK:
    case FUSE_LINK:
    case FUSE_CREATE: {
        struct fuse_entry_out e;
        if (copy_payload(iov, count, &e, sizeof e) < sizeof e)
            break;
        if (e.nodeid == 0)
            snprintf(out, cap, "no such entry (negative entry, cached %" PRIu64 " s)",
                     (uint64_t)e.entry_valid);
        else
            snprintf(out, cap, "ino=%" PRIu64, (uint64_t)e.nodeid);
        return;
    }
    case FUSE_WRITE: {
        struct fuse_write_out w;
        if (copy_payload(iov, count, &w, sizeof w) < sizeof w)
            break;
        snprintf(out, cap, "%" PRIu32 " bytes written", w.size);
        return;
    }
    case FUSE_GETXATTR:
    case FUSE_LISTXATTR: {
        struct fuse_getxattr_out g;
        if (!r->size_probe)
            snprintf(out, cap, "%zu bytes", payload); /* the value's: not shown */
        else if (copy_payload(iov, count, &g, sizeof g) == sizeof g)
            snprintf(out, cap, "size %" PRIu32, g.size);
        else
            break;
        return;
    }
    case FUSE_READ:
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
    case FUSE_READLINK:
        snprintf(out, cap, "%zu bytes", payload);
        return;
    }
    snprintf(out, cap, "ok");
}

static const char *notify_name(int code)
{
    switch (code) {
    case FUSE_NOTIFY_INVAL_INODE:
        return "inval_inode";
    case FUSE_NOTIFY_INVAL_ENTRY:
        return "inval_entry";
    case FUSE_NOTIFY_DELETE:
        return "delete";
    case FUSE_NOTIFY_STORE:
        return "store";
    case FUSE_NOTIFY_RETRIEVE:
        return "retrieve";
    }
    return "other";
}

static void log_reply(const struct iovec *iov, int count, int send_errno)
{
    struct fuse_out_header h;
    if (count < 1 || iov[0].iov_len < sizeof h)
        return;
    memcpy(&h, iov[0].iov_base, sizeof h);
    char lost[96] = "";
    if (send_errno)
        snprintf(lost, sizeof lost, " (not delivered: %s)", strerror(send_errno));
    if (h.unique == 0) {
        /* A notification from us (the error field holds its code). */
        fslog_debug("notify %s%s", notify_name(h.error), lost);
        return;
    }
    trace_req *r = &current;
    int ours = r->unique == h.unique;
    const char *op = ours && r->op ? r->op : ours ? opcode_name(r->opcode) : "reply";
    char what[160];
    if (h.error) {
        const char *name = strerrorname_np(-h.error);
        snprintf(what, sizeof what, "%s (%s)", name ? name : "error", strerror(-h.error));
    } else if (ours) {
        size_t payload = h.len > sizeof h ? h.len - sizeof h : 0;
        describe_success(r, iov, count, payload, what, sizeof what);
    } else {
        snprintf(what, sizeof what, "ok");
    }
    if (ours) {
        r->replied = 1;
        fslog_debug("#%" PRIu64 " %s -> %s (%.0f us)%s%s", h.unique, op, what,
                    (now_mono() - r->start) * 1e6, r->op ? "" : " [answered by libfuse]", lost);
    } else {
        fslog_debug("#%" PRIu64 " %s -> %s%s", h.unique, op, what, lost);
    }
}

static ssize_t traced_read(int fd, void *buf, size_t len, void *userdata)
{
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n >= (ssize_t)sizeof(struct fuse_in_header)) {
        const struct fuse_in_header *in = buf;
        memset(&current, 0, sizeof current);
        current.unique = in->unique;
        current.opcode = in->opcode;
        current.pid = in->pid;
        current.nodeid = in->nodeid;
        current.start = now_mono();
        /* libfuse looks at errno only when the read failed; these calls
         * cannot touch it then. */
    }
    return n;
}

static ssize_t traced_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    (void)userdata;
    ssize_t n = writev(fd, iov, count);
    int saved = errno;
    log_reply(iov, count, n < 0 ? saved : 0);
    errno = saved;
    return n;
}

int trace_io_install(struct fuse_session *se)
{
    /* No splice hooks: libfuse then neither splices requests in nor
     * replies out, so every byte passes through the two above. */
    const struct fuse_custom_io io = {
        .read = traced_read,
        .writev = traced_writev,
    };
    int rc = fuse_session_custom_io(se, &io, fuse_session_fd(se));
    if (rc != 0) {
        fslog_warn("-o debug: cannot follow replies (%s); tracing requests only", strerror(-rc));
        return -1;
    }
    return 0;
}
