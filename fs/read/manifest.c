#include "manifest.h"

#include "ckpt_names.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/links.h"

/* Text from untrusted packs (cipher names, notes) that JSON must carry:
 * in the display form of ckpt_names.h when it is not UTF-8. */
static json_t *lossy_string(const char *s)
{
    char *shown = ckpt_name_display(s);
    json_t *j = shown ? json_string(shown) : NULL;
    free(shown);
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

/* A name (a path, a tensor's name): key as in ckpt_names.h, and key_b64
 * with its raw bytes when it is not UTF-8. */
static int put_name(json_t *obj, const char *key, const char *name)
{
    if (put(obj, key, lossy_string(name)))
        return -1;
    if (ckpt_name_is_utf8(name))
        return 0;
    char b64_key[64];
    snprintf(b64_key, sizeof b64_key, "%s_b64", key);
    char *b64 = ckpt_base64(name, strlen(name));
    int rc = put(obj, b64_key, b64 ? json_string(b64) : NULL);
    free(b64);
    return rc;
}

/* The path of a node under the checkpoint directory, or null for none. */
static int put_node_path(json_t *obj, const char *key, const pack_tree *t, uint32_t node)
{
    if (node == TREE_NONE)
        return put(obj, key, json_null());
    char *path = pack_tree_path(t, node);
    if (!path)
        return -1;
    int rc = put_name(obj, key, path);
    free(path);
    return rc;
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
        if (put_name(entry, "path", f->path) || put(entry, "size", u64_value(f->size)) ||
            put(entry, "sha256", hex_digest(f->sha256)) ||
            put(entry, "container", json_string(f->container)))
            return -1;
        /* Why a file that claimed a container was stored as plain bytes. */
        if (f->note[0] && put(entry, "warning", lossy_string(f->note)))
            return -1;
        char *shown = t->file_node[i] == TREE_NONE ? NULL : pack_tree_path(t, t->file_node[i]);
        int moved = !shown || strcmp(shown, f->path) != 0;
        free(shown);
        if (moved && put_node_path(entry, "mount_path", t, t->file_node[i]))
            return -1;
    }
    return 0;
}

static int put_shape(json_t *entry, const ckpt_tensor_info *ti)
{
    json_t *shape = json_array();
    if (put(entry, "shape", shape))
        return -1;
    for (uint32_t d = 0; d < ti->ndim; d++) {
        json_t *dim = u64_value(ti->shape[d]);
        if (!dim || json_array_append_new(shape, dim))
            return -1;
    }
    return 0;
}

/* An assembled tensor's parts: the stored chunks it concatenates along
 * dim 0, in order, each with where it starts in the tensor ("row") and
 * where its bytes are ("file", "offset"). */
static int put_parts(json_t *entry, const ckpt_pack *p, const ckpt_tensor_info *ti)
{
    json_t *parts = json_array();
    if (put(entry, "parts", parts))
        return -1;
    uint64_t row = 0;
    for (size_t k = 0; k < ti->n_parts; k++) {
        const ckpt_tensor_info *pi = ckpt_tensor_at(p, ti->parts[k]);
        json_t *part = json_object();
        if (!part || json_array_append_new(parts, part))
            return -1;
        if (put_name(part, "name", pi->name) || put(part, "row", u64_value(row)) ||
            put_shape(part, pi) || put(part, "nbytes", u64_value(pi->nbytes)) ||
            put_name(part, "file", ckpt_file_at(p, pi->file_index)->path) ||
            put(part, "offset", u64_value(pi->file_offset)) ||
            put(part, "sha256", hex_digest(pi->sha256)))
            return -1;
        row += pi->shape[0];
    }
    return 0;
}

static int add_tensors(json_t *list, const ckpt_pack *p, const pack_tree *t)
{
    for (size_t i = 0; i < ckpt_tensor_count(p); i++) {
        const ckpt_tensor_info *ti = ckpt_tensor_at(p, i);
        /* Listed among its assembled tensor's parts. */
        if (ti->part_of != SIZE_MAX)
            continue;
        json_t *entry = json_object();
        json_t *shape = json_array();
        if (!entry || json_array_append_new(list, entry) || !shape) {
            json_decref(shape);
            return -1;
        }
        if (put_name(entry, "name", ti->name) || put(entry, "dtype", lossy_string(ti->dtype)) ||
            put(entry, "shape", shape))
            return -1;
        for (uint32_t d = 0; d < ti->ndim; d++) {
            json_t *dim = u64_value(ti->shape[d]);
            if (!dim || json_array_append_new(shape, dim))
                return -1;
        }
        const ckpt_file_info *fi =
            ti->file_index < ckpt_file_count(p) ? ckpt_file_at(p, ti->file_index) : NULL;
        const char *file = fi ? fi->path : "";
        /* So that loaders need no dtype table of their own: numpy has no
         * bfloat16 or float8, for which numpy_dtype gives the raw bits and
         * numpy_raw_bits says so (view them as torch_dtype). */
        const char *np = ckpt_dtype_numpy(ti->dtype), *torch = ckpt_dtype_torch(ti->dtype);
        if (put(entry, "container", json_string(fi ? fi->container : "")) ||
            put(entry, "numpy_dtype", np ? json_string(np) : json_null()) ||
            (!ckpt_dtype_numpy_exact(ti->dtype) && put(entry, "numpy_raw_bits", json_true())) ||
            put(entry, "torch_dtype", torch ? json_string(torch) : json_null()))
            return -1;
        if (put(entry, "nbytes", u64_value(ti->nbytes)) ||
            put_node_path(entry, "path", t, t->tensor_node[i]))
            return -1;
        /* An assembled tensor has no one place: its parts say where. */
        if (ti->n_parts
                ? put(entry, "file", json_null()) || put(entry, "offset", json_null())
                : put_name(entry, "file", file) || put(entry, "offset", u64_value(ti->file_offset)))
            return -1;
        if (put(entry, "sha256", hex_digest(ti->sha256)) ||
            (ti->n_parts && put_parts(entry, p, ti)))
            return -1;
    }
    return 0;
}

/* Tensors found but not under tensors/, each with its file and why. */
static int add_skipped(json_t *root, const ckpt_pack *p)
{
    json_t *list = json_array();
    if (put(root, "skipped", list))
        return -1;
    for (size_t i = 0; i < ckpt_skipped_count(p); i++) {
        const ckpt_skipped_info *k = ckpt_skipped_at(p, i);
        json_t *entry = json_object();
        if (!entry || json_array_append_new(list, entry))
            return -1;
        if (put_name(entry, "name", k->name) ||
            put_name(entry, "file", ckpt_file_at(p, k->file_index)->path) ||
            put(entry, "reason", lossy_string(k->reason)))
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
        put_name(root, "name", checkpoint) || put(root, "cipher", lossy_string(info.cipher)) ||
        put(root, "kdf", lossy_string(info.kdf)) ||
        put(root, "chunk_size", json_integer(info.chunk_size)) ||
        /* Planes are zstd frames since format version 3 (core/FORMAT.md). */
        put(root, "codec",
            json_string(info.format_version >= 3 ? "bytegroup+zstd" : "bytegroup+deflate")) ||
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
    if (put(root, "tensors", tensors) || add_files(files, p, t) || add_tensors(tensors, p, t) ||
        add_skipped(root, p))
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
