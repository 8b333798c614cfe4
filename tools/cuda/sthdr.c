#include "sthdr.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int tensor_bytes(const ckpt_cuda_save_tensor *t, uint64_t *out, ckpt_err *err)
{
    unsigned es = ckpt_dtype_size(t->dtype ? t->dtype : "");
    if (!es)
        return cc_fail(err, -EINVAL, "tensor '%s': unknown dtype '%s'", t->name,
                       t->dtype ? t->dtype : "(null)");
    if (t->ndim > 0 && !t->shape)
        return cc_fail(err, -EINVAL, "tensor '%s': %u dimensions but no shape", t->name, t->ndim);
    uint64_t n = es;
    for (uint32_t k = 0; k < t->ndim; k++) {
        if (t->shape[k] && n > (uint64_t)INT64_MAX / t->shape[k])
            return cc_fail(err, -EOVERFLOW, "tensor '%s': too large", t->name);
        n *= t->shape[k];
    }
    if (n > 0 && !t->dev)
        return cc_fail(err, -EINVAL, "tensor '%s': no device pointer", t->name);
    *out = n;
    return 0;
}

static json_t *entry(const ckpt_cuda_save_tensor *t, uint64_t begin, uint64_t end)
{
    json_t *shape = json_array();
    for (uint32_t k = 0; shape && k < t->ndim; k++) {
        if (json_array_append_new(shape, json_integer((json_int_t)t->shape[k])) < 0) {
            json_decref(shape);
            return NULL;
        }
    }
    if (!shape)
        return NULL;
    /* "o" hands shape over to the new object, also when packing fails. */
    return json_pack("{s:s, s:o, s:[I,I]}", "dtype", t->dtype, "shape", shape, "data_offsets",
                     (json_int_t)begin, (json_int_t)end);
}

static int build_json(const ckpt_cuda_save_tensor *t, size_t n, uint64_t *lens, char **text,
                      ckpt_err *err)
{
    json_t *root = json_object();
    if (!root)
        return cc_fail(err, -ENOMEM, "out of memory");
    uint64_t pos = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *name = t[i].name;
        if (!name || !name[0] || strcmp(name, "__metadata__") == 0) {
            rc = cc_fail(err, -EINVAL, "tensor %zu: name '%s' is not allowed", i,
                         name ? name : "(null)");
            break;
        }
        if (json_object_get(root, name)) {
            rc = cc_fail(err, -EINVAL, "tensor '%s' appears twice", name);
            break;
        }
        if ((rc = tensor_bytes(&t[i], &lens[i], err)) < 0)
            break;
        if (lens[i] > (uint64_t)INT64_MAX - pos) {
            rc = cc_fail(err, -EOVERFLOW, "tensors too large for one file");
            break;
        }
        json_t *e = entry(&t[i], pos, pos + lens[i]);
        /* json_object_set_new refuses keys that are not UTF-8. */
        if (!e || json_object_set_new(root, name, e) < 0)
            rc = cc_fail(err, -EINVAL, "tensor %zu: name is not valid UTF-8 (or out of memory)", i);
        pos += lens[i];
    }
    if (rc == 0 && !(*text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        rc = cc_fail(err, -ENOMEM, "out of memory");
    json_decref(root);
    return rc;
}

int cc_st_header(const ckpt_cuda_save_tensor *t, size_t n, uint64_t *lens, uint8_t **out,
                 size_t *out_len, ckpt_err *err)
{
    char *text = NULL;
    int rc = build_json(t, n, lens, &text, err);
    if (rc < 0)
        return rc;
    size_t jlen = strlen(text), padded = (jlen + 7) / 8 * 8;
    if (padded > CC_ST_MAX_HEADER) {
        free(text);
        return cc_fail(err, -EOVERFLOW, "safetensors header of %zu bytes is over the limit",
                       padded);
    }
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        free(text);
        return cc_fail(err, -ENOMEM, "out of memory");
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, jlen);
    memset(buf + 8 + jlen, ' ', padded - jlen);
    free(text);
    *out = buf;
    *out_len = 8 + padded;
    return 0;
}
