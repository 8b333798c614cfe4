/* The one place that picks the libfuse API level, so every file agrees. */
#ifndef CKPTFS_FUSE_API_H
#define CKPTFS_FUSE_API_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#endif
