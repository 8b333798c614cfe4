#include "source.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

int cc_source_open(const char *path, const ckpt_key *key, cc_source **out, ckpt_err *err)
{
    struct stat st;
    *out = NULL;
    if (cc_is_s3(path))
        return cc_source_open_pack(path, key, out, err);
    if (stat(path, &st) != 0)
        return cc_fail(err, -errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return cc_source_open_mount(path, out, err);
    return cc_source_open_pack(path, key, out, err);
}
