/* fs/fuse: the FUSE front end, and the one header fs/main.c includes. The
 * low-level operations table (ops.c dispatches each request to
 * read_ops.c or write_ops.c), the mount's state (mount.h), option parsing,
 * signals, request tracing and libfuse's log. */
#ifndef CKPTFS_FRONTEND_H
#define CKPTFS_FRONTEND_H

#include "handles.h"
#include "handover.h"
#include "libfuse_log.h"
#include "mount.h"
#include "options.h"
#include "signals.h"
#include "trace.h"

#endif
