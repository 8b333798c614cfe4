/* Fuzzes the parsers of S3's XML answers (core/src/store/s3_xml.c): the same
 * input is given to each (ListObjectsV2, error, InitiateMultipartUpload,
 * CompleteMultipartUpload, ListMultipartUploads) and to the time parser,
 * and whatever is accepted is checked against the promises s3.h makes:
 * bounded, NUL-terminated fields, non-empty keys, a continuation when
 * truncated, and an error message on every refusal. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/s3.h"

static void check_err(int rc, const ckpt_err *err)
{
    if (rc < 0 && (rc != -EINVAL && rc != -ENOMEM))
        abort();
    if (rc < 0 && (err->msg[0] == '\0' || memchr(err->msg, '\n', strlen(err->msg))))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    ckpt_err err = {0};

    s3_list l;
    int rc = s3_xml_list_objects(body, size, &l, &err);
    check_err(rc, &err);
    if (rc == 0) {
        for (size_t i = 0; i < l.n; i++)
            if (!l.v[i].key || !l.v[i].key[0] || strlen(l.v[i].key) > 1024 ||
                l.v[i].size > (1ull << 53) || strlen(l.v[i].etag) >= sizeof l.v[i].etag)
                abort();
        if (l.truncated && (!l.next_token || !l.next_token[0]))
            abort();
        s3_list_free(&l);
    } else if (l.v || l.n || l.next_token) {
        abort(); /* a refusal hands nothing back */
    }

    s3_error e;
    rc = s3_xml_error(body, size, &e);
    if (rc < -EINVAL || rc > 1 || strlen(e.code) >= sizeof e.code ||
        strlen(e.message) >= sizeof e.message)
        abort();
    for (const char *p = e.message; *p; p++)
        if ((unsigned char)*p < 0x20)
            abort(); /* control bytes are cleaned away */

    char *id = NULL;
    err = (ckpt_err){0};
    rc = s3_xml_upload_id(body, size, &id, &err);
    check_err(rc, &err);
    if ((rc == 0) != (id != NULL) || (id && !id[0]))
        abort();
    free(id);

    err = (ckpt_err){0};
    rc = s3_xml_complete(body, size, "CompleteMultipartUploadResult", &e, &err);
    check_err(rc, &err);
    if (rc > 1)
        abort();

    s3_uploads u;
    err = (ckpt_err){0};
    rc = s3_xml_list_uploads(body, size, &u, &err);
    check_err(rc, &err);
    if (rc == 0) {
        for (size_t i = 0; i < u.n; i++)
            if (!u.v[i].key || !u.v[i].key[0] || !u.v[i].upload_id || !u.v[i].upload_id[0])
                abort();
        if (u.truncated && !u.next_key_marker)
            abort();
        s3_uploads_free(&u);
    }

    /* Times, as a NUL-terminated string. */
    if (size < 256) {
        char t[256];
        memcpy(t, data, size);
        t[size] = 0;
        int64_t when;
        s3_parse_time(t, &when);
    }
    return 0;
}
