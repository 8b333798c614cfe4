#include "links.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int link_target_check(const char *target)
{
    size_t len = strlen(target);
    if (len == 0)
        return -ENOENT;
    return len > LINK_TARGET_MAX ? -ENAMETOOLONG : 0;
}

int links_encode(const link_entry *v, size_t n, char **out, size_t *len)
{
    json_t *root = json_object(), *list = json_array();
    int rc = root && list ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *e = json_pack("{s:s, s:s, s:[I, I]}", "path", v[i].path, "target", v[i].target,
                              "mtime", (json_int_t)v[i].mtime_sec, (json_int_t)v[i].mtime_nsec);
        if (!e || json_array_append_new(list, e) != 0)
            rc = -ENOMEM;
    }
    if (rc == 0 && (json_object_set_new(root, "version", json_integer(1)) != 0 ||
                    json_object_set(root, "links", list) != 0))
        rc = -ENOMEM;
    char *text = rc == 0 ? json_dumps(root, JSON_COMPACT) : NULL;
    if (rc == 0 && !text)
        rc = -ENOMEM;
    json_decref(list);
    json_decref(root);
    if (rc)
        return rc;
    *len = strlen(text);
    *out = text;
    return 0;
}

int links_decode(const char *buf, size_t len, int (*fn)(void *ud, const link_entry *e), void *ud)
{
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    json_t *list = root ? json_object_get(root, "links") : NULL;
    int rc = json_is_array(list) ? 0 : -EIO;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        if (rc)
            break;
        json_t *p = json_object_get(e, "path"), *t = json_object_get(e, "target");
        json_t *m = json_object_get(e, "mtime");
        if (!json_is_string(p) || !json_is_string(t) || link_target_check(json_string_value(t)))
            continue;
        link_entry le = {json_string_value(p), json_string_value(t), 0, 0};
        if (json_is_array(m) && json_array_size(m) == 2) {
            le.mtime_sec = (int64_t)json_integer_value(json_array_get(m, 0));
            json_int_t ns = json_integer_value(json_array_get(m, 1));
            le.mtime_nsec = ns >= 0 && ns < 1000000000 ? (uint32_t)ns : 0;
        }
        rc = fn(ud, &le);
    }
    json_decref(root);
    return rc;
}
