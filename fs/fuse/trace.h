/* -o debug: every FUSE request traced through fslog at LOG_DEBUG, one line
 * when it arrives (operation, inode and the arguments that matter: names,
 * offsets, sizes, flags) and one for its outcome (an errno, bytes, an inode):
 *
 *   #12 lookup ino=1 name='step1' pid=4242
 *   #12 lookup -> ino=2147483649 (31 us)
 *   #14 read ino=2147483651 off=0 size=131072 pid=4242
 *   #14 read -> 131072 bytes (412 us)
 *
 * '#12' is the kernel's id for the request. Never traced: file contents,
 * xattr values, symlink targets (only their sizes). Names come from the
 * kernel and from packs, and go through fslog's sanitizer.
 *
 * Two halves, both installed only with -o debug, so that without it no
 * request pays anything: trace_ops.c wraps the operations table (arrivals,
 * with arguments as libfuse decoded them), trace_io.c sits between libfuse
 * and /dev/fuse (request ids on the way in, outcomes on the way out, which
 * also covers requests libfuse answers itself, like ENOSYS). */
#ifndef CKPTFS_TRACE_H
#define CKPTFS_TRACE_H

#include <stdint.h>

#include "fuse_api.h"

/* A table whose every operation that inner has traces and calls inner's;
 * the others stay NULL, so libfuse behaves exactly as with inner. */
const struct fuse_lowlevel_ops *trace_ops(const struct fuse_lowlevel_ops *inner);

/* Hooks reads and writes of the session's /dev/fuse descriptor. After
 * fuse_session_mount, before the loop. 0, or -1 after saying why (then
 * arrivals are still traced, without ids or outcomes). */
int trace_io_install(struct fuse_session *se);

/* The request the calling thread is handling, as trace_io saw it arrive
 * (both halves run on the thread that read the request: ckptfs replies
 * before its operations return). */
typedef struct trace_req {
    uint64_t unique; /* the kernel's id; 0 before the first */
    uint32_t opcode;
    uint32_t pid; /* of the process that made the request */
    uint64_t nodeid;
    double start;   /* monotonic seconds at arrival */
    const char *op; /* set by trace_ops: its name for the request */
    int size_probe; /* getxattr/listxattr asked for the size only */
    int replied;
} trace_req;

trace_req *trace_current(void);

#endif
