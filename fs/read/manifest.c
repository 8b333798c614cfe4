#include "manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/links.h"

/* Names come from untrusted packs and JSON needs UTF-8: a string that is
 * not valid UTF-8 is shown with its bytes >= 0x80 as \xNN. */
static json_t *lossy_string(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    size_t len = strlen(s);
    char *ascii = malloc(len * 4 + 1);
    if (!ascii)
        return NULL;
    char *out = ascii;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c < 0x80)
            *out++ = (char)*c;
        else
            out += sprintf(out, "\\x%02X", *c);
    }
    *out = '\0';
    j = json_string(ascii);
    free(ascii);
    return j;
}

static json_t *hex_digest(const uint8_t digest[32])
{
    char hex[65];
    ckpt_hex32(digest, hex);
    return json_string(hex);
}

/* json_integer is signed; a dimension of a zero-sized tensor could be
 * anything up to 2^64-1. */
static json_t *u64_value(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)v);
    char digits[24];
    snprintf(digits, sizeof digits, "%" PRIu64, v);
    return json_string(digits);
}

/* json_object_set_new with every failure (a NULL value included) reported. */
static int put(json_t *obj, const char *key, json_t *value)
{
    return value ? json_object_set_new(obj, key, value) : -1;
}

static json_t *path_or_null(const pack_tree *t, uint32_t node)
{
    if (node == TREE_NONE)
        return json_null();
    char *path = pack_tree_path(t, node);
    if (!path)
        return NULL;
    json_t *j = lossy_string(path);
    free(path);
    return j;
}

static int add_files(json_t *list, const ckpt_pack *p, const pack_tree *t)
{
    for (size_t i = 0; i < ckpt_file_count(p); i++) {
        const ckpt_file_info *f = ckpt_file_at(p, i);
        if (strcmp(f->path, LINKS_FILE) == 0)
            continue; /* shown as the links it holds */
        json_t *entry = json_object();
        if (!entry || json_array_append_new(list, entry))
            return -1;
        if (put(entry, "path", lossy_string(f->path)) || put(entry, "size", u64_value(f->size)) ||
            put(entry, "sha256", hex_digest(f->sha256)))
            return -1;
        char *shown = t->file_node[i] == TREE_NONE ? NULL : pack_tree_path(t, t->file_node[i]);
        int moved = !shown || strcmp(shown, f->path) != 0;
        free(shown);
        if (moved && put(entry, "mount_path", path_or_null(t, t->file_node[i])))
            return -1;
    }
    return 0;
}

static int add_tensors(json_t *list, const ckpt_pack *p, const pack_tree *t)
{
    for (size_t i = 0; i < ckpt_tensor_count(p); i++) {
        const ckpt_tensor_info *ti = ckpt_tensor_at(p, i);
        json_t *entry = json_object();
        json_t *shape = json_array();
        if (!entry || json_array_append_new(list, entry) || !shape) {
            json_decref(shape);
            return -1;
        }
        if (put(entry, "name", lossy_string(ti->name)) || put(entry, "dtype", lossy_string(ti->dtype)) ||
            put(entry, "shape", shape))
            return -1;
        for (uint32_t d = 0; d < ti->ndim; d++) {
            json_t *dim = u64_value(ti->shape[d]);
            if (!dim || json_array_append_new(shape, dim))
                return -1;
        }
        const char *file = ti->file_index < ckpt_file_count(p)
                               ? ckpt_file_at(p, ti->file_index)->path
                               : "";
        if (put(entry, "nbytes", u64_value(ti->nbytes)) ||
            put(entry, "path", path_or_null(t, t->tensor_node[i])) ||
            put(entry, "file", lossy_string(file)) ||
            put(entry, "offset", u64_value(ti->file_offset)) ||
            put(entry, "sha256", hex_digest(ti->sha256)))
            return -1;
    }
    return 0;
}

int manifest_build(const ckpt_pack *p, const char *checkpoint, const pack_tree *t, char **text,
                   size_t *len)
{
    ckpt_pack_info info;
    ckpt_info(p, &info);
    json_t *root = json_object();
    json_t *files = json_array(), *tensors = json_array();
    int rc = -ENOMEM;
    if (!root || !files || !tensors) {
        json_decref(files);
        json_decref(tensors);
        goto done;
    }
    if (put(root, "format_version", json_integer(info.format_version)) ||
        put(root, "name", lossy_string(checkpoint)) ||
        put(root, "cipher", lossy_string(info.cipher)) || put(root, "kdf", lossy_string(info.kdf)) ||
        put(root, "chunk_size", json_integer(info.chunk_size)) ||
        put(root, "codec", json_string("bytegroup+deflate")) ||
        put(root, "stored_bytes", u64_value(info.stored_bytes)) ||
        put(root, "logical_bytes", u64_value(info.logical_bytes))) {
        json_decref(files);
        json_decref(tensors);
        goto done;
    }
    if (put(root, "files", files)) {
        json_decref(tensors);
        goto done;
    }
    if (put(root, "tensors", tensors) || add_files(files, p, t) || add_tensors(tensors, p, t))
        goto done;
    char *dumped = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!dumped)
        goto done;
    /* A trailing newline, like any text file. */
    size_t n = strlen(dumped);
    char *with_newline = realloc(dumped, n + 2);
    if (!with_newline) {
        free(dumped);
        goto done;
    }
    with_newline[n] = '\n';
    with_newline[n + 1] = '\0';
    *text = with_newline;
    *len = n + 1;
    rc = 0;
done:
    json_decref(root);
    return rc;
}
