/* Where tensor bytes come from: a .tpack opened with libckpt (decoded on the
 * calling threads), or a mounted checkpoint directory (manifest.json plus
 * ordinary reads). The load pipeline sees only this interface. */
#ifndef CC_SOURCE_H
#define CC_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

typedef struct cc_tensor {
    const char *name;
    const char *dtype;
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    uint8_t sha256[32];
    int has_sha256;
} cc_tensor;

typedef struct cc_source cc_source;
struct cc_source {
    const char *origin; /* the path the source was opened with */
    const char *kind;   /* "pack" or "mount" */
    uint32_t granule;   /* bytes decoded as one unit (a pack's chunk), or 0 */
    size_t n;
    const cc_tensor *tensors; /* in the source's order */
    /* Per-thread state (a decoded-chunk cache, an open file): each reading
     * thread makes its own, so reads need no lock. */
    int (*reader_new)(cc_source *s, void **out, ckpt_err *err);
    void (*reader_free)(cc_source *s, void *rd);
    /* Reads bytes [off, off + len) of tensor i, all of them, into buf. */
    int (*read)(cc_source *s, void *rd, size_t i, uint64_t off, void *buf, size_t len,
                ckpt_err *err);
    void (*close)(cc_source *s);
};

/* A directory is read as a mounted checkpoint, anything else as a .tpack:
 * a path, or s3://BUCKET/[PREFIX/]NAME.tpack (endpoint, region and keys
 * from the environment: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_*). */
int cc_source_open(const char *path, const ckpt_key *key, cc_source **out, ckpt_err *err);
/* Whether path names an object in S3 (s3://...). */
int cc_is_s3(const char *path);
int cc_source_open_pack(const char *path, const ckpt_key *key, cc_source **out, ckpt_err *err);
int cc_source_open_mount(const char *dir, cc_source **out, ckpt_err *err);

static inline void cc_source_close(cc_source *s)
{
    if (s)
        s->close(s);
}

#endif
