#include "backing_store.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int backing_is_store_url(const char *arg)
{
    return arg && strncmp(arg, "s3://", 5) == 0;
}

/* FNV-1a: a directory name, not a secret; the same URL must give the same
 * name in every run. */
static uint64_t name_hash(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *s = a; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull; /* keeps "ab"+"c" apart from "a"+"bc" */
    for (const char *s = b ? b : ""; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

char *backing_default_stage_dir(const char *url, const char *endpoint)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char *out = NULL;
    uint64_t h = name_hash(url, endpoint);
    int n;
    if (xdg && xdg[0] == '/')
        n = asprintf(&out, "%s/ckptfs/%016llx", xdg, (unsigned long long)h);
    else if (home && home[0] == '/')
        n = asprintf(&out, "%s/.cache/ckptfs/%016llx", home, (unsigned long long)h);
    else
        return NULL;
    return n < 0 ? NULL : out;
}

int backing_make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            rc = -errno;
        *s = c;
        if (!c)
            break;
    }
    free(p);
    return rc;
}
