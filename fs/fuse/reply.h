/* Replies that both sides give alike. */
#ifndef CKPTFS_REPLY_H
#define CKPTFS_REPLY_H

#include <stddef.h>

#include "fuse_api.h"

/* An extended attribute's value: its length when size is 0 (the caller
 * asks how big a buffer it needs), ERANGE when size is too small. */
void reply_xattr_value(fuse_req_t req, const char *value, size_t len, size_t size);

#endif
