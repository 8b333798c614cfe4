/* Packs named by URL: s3://BUCKET/[PREFIX/]NAME.tpack is the object NAME.tpack
 * in the store s3://BUCKET/PREFIX; anything else is a local path. The S3
 * options (--endpoint, --region, --profile) travel in cli_keyopts with the
 * key options; credentials never come from the command line. */
#include "cli.h"
#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include "ckpt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_is_s3(const char *path)
{
    return strncmp(path, "s3://", 5) == 0;
}

int cli_store_open(const char *store_url, const cli_keyopts *k, ckpt_store **out, ckpt_err *err)
{
    ckpt_store_opts so = {.endpoint = k->endpoint, .region = k->region, .profile = k->profile};
    /* Before the credentials are read: a core dump would hold them. */
    int rc = ckpt_forbid_core_dumps();
    if (rc < 0)
        return ckpt_fail(err, rc, "cannot disable core dumps: %s", strerror(-rc));
    return ckpt_store_open(store_url, &so, out, err);
}

int cli_store_for(const char *url, const cli_keyopts *k, ckpt_store **out, const char **name,
                  ckpt_err *err)
{
    *out = NULL;
    const char *slash = strrchr(url + 5, '/');
    if (!slash || !slash[1]) {
        err->code = -EINVAL;
        snprintf(err->msg, sizeof err->msg, "%s: expected s3://BUCKET/[PREFIX/]NAME.tpack", url);
        return -EINVAL;
    }
    char *store_url = strndup(url, (size_t)(slash - url));
    if (!store_url) {
        err->code = -ENOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -ENOMEM;
    }
    int rc = cli_store_open(store_url, k, out, err);
    free(store_url);
    *name = slash + 1;
    return rc;
}

int cli_probe(const char *path, const cli_keyopts *k, ckpt_pack_info *info, ckpt_err *err)
{
    if (!cli_is_s3(path))
        return ckpt_probe(path, info, err);
    ckpt_store *s;
    const char *name;
    int rc = cli_store_for(path, k, &s, &name, err);
    if (rc == 0)
        rc = ckpt_probe_in(s, name, info, err);
    ckpt_store_free(s);
    return rc;
}
