#include "reply.h"
#include <errno.h>

void reply_xattr_value(fuse_req_t req, const char *value, size_t len, size_t size)
{
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, value, len);
}
