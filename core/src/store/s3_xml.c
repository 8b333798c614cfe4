/* The XML an S3 server answers with, parsed with libxml2 into plain structs.
 * Input is hostile until checked: documents over S3_XML_MAX are refused
 * unparsed; the parser loads no DTD, expands no entities beyond the five
 * predefined ones, reaches no network and prints nothing (XML_PARSE_NONET,
 * NOERROR, NOWARNING, and no NOENT); libxml2's own limits bound the depth.
 * Every field is length-checked and every number range-checked before it is
 * used; a document of the wrong kind is an error naming what was expected.
 * Elements are matched by local name, so the S3 namespace may or may not be
 * declared. */
#include "s3.h"

#include <ctype.h>
#include <errno.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEY_MAX 1024 /* S3's own limit on a key, in bytes */

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;
static void xml_init(void)
{
    xmlInitParser();
}

static xmlDocPtr parse(const char *body, size_t len)
{
    if (!body || len == 0 || len > S3_XML_MAX)
        return NULL;
    pthread_once(&xml_once, xml_init);
    return xmlReadMemory(body, (int)len, "s3.xml", NULL,
                         XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING |
                             XML_PARSE_NOCDATA);
}

static int is(const xmlNode *n, const char *name)
{
    return n && n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0;
}

static xmlNode *child(const xmlNode *n, const char *name)
{
    for (xmlNode *c = n ? n->children : NULL; c; c = c->next)
        if (is(c, name))
            return c;
    return NULL;
}

/* The text of an element, bounded: 1 copied, 0 absent, -1 too long. */
static int text(const xmlNode *n, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!n)
        return 0;
    xmlChar *t = xmlNodeGetContent(n);
    if (!t)
        return 0;
    size_t len = strlen((const char *)t);
    int rc = len < cap ? 1 : -1;
    if (rc == 1)
        memcpy(buf, t, len + 1);
    xmlFree(t);
    return rc;
}

static int child_text(const xmlNode *n, const char *name, char *buf, size_t cap)
{
    return text(child(n, name), buf, cap);
}

static char *child_dup(const xmlNode *n, const char *name, size_t max, int *bad)
{
    char buf[KEY_MAX + 1];
    int r = child_text(n, name, buf, max + 1 < sizeof buf ? max + 1 : sizeof buf);
    if (r < 0)
        *bad = 1;
    if (r <= 0)
        return NULL;
    char *s = strdup(buf);
    if (!s)
        *bad = 2;
    return s;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!*s || strlen(s) > 19)
        return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

static int is_true(const char *s)
{
    return strcmp(s, "true") == 0;
}

/* Control bytes would let a server draw on the user's terminal. */
static void clean(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = ' ';
}

int s3_parse_time(const char *s, int64_t *out)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (end) {
        if (*end == '.') /* fraction of a second */
            for (end++; isdigit((unsigned char)*end); end++)
                ;
        if (*end == 'Z')
            end++;
        else if (!strcmp(end, "+00:00"))
            end += 6;
    } else {
        memset(&tm, 0, sizeof tm);
        end = strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    }
    if (!end || *end || tm.tm_year < 70 || tm.tm_year > 1100)
        return -EINVAL;
    *out = (int64_t)timegm(&tm);
    return 0;
}

int s3_xml_error(const char *body, size_t len, s3_error *out)
{
    memset(out, 0, sizeof *out);
    if (!body || len == 0)
        return 0;
    xmlDocPtr d = parse(body, len);
    if (!d)
        return -EINVAL;
    xmlNode *root = xmlDocGetRootElement(d);
    int rc = 0;
    if (is(root, "Error")) {
        rc = 1;
        if (child_text(root, "Code", out->code, sizeof out->code) < 0)
            snprintf(out->code, sizeof out->code, "(too long)");
        /* A message is prose: a long one is cut, not refused. */
        xmlNode *m = child(root, "Message");
        xmlChar *t = m ? xmlNodeGetContent(m) : NULL;
        if (t)
            snprintf(out->message, sizeof out->message, "%s", (const char *)t);
        xmlFree(t);
        clean(out->code);
        clean(out->message);
    }
    xmlFreeDoc(d);
    return rc;
}

static int bad_doc(ckpt_err *err, const char *what)
{
    return ckpt_fail(err, -EINVAL, "%s", what);
}

/* The root of a document that must be a `want`, or NULL with err set. */
static xmlNode *root_of(xmlDocPtr d, const char *want, ckpt_err *err)
{
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    if (!d)
        ckpt_fail(err, -EINVAL, "malformed XML in the answer (expected %s)", want);
    else if (!is(root, want))
        ckpt_fail(err, -EINVAL, "unexpected XML document <%.40s> (expected %s)",
                  root ? (const char *)root->name : "", want);
    else
        return root;
    return NULL;
}

void s3_list_free(s3_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].key);
    free(l->v);
    free(l->next_token);
    memset(l, 0, sizeof *l);
}

static int parse_entry(xmlNode *c, s3_entry *e, ckpt_err *err)
{
    char num[32], when[64];
    int bad = 0;
    memset(e, 0, sizeof *e);
    e->key = child_dup(c, "Key", KEY_MAX, &bad);
    if (bad == 2)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    if (!e->key || !*e->key)
        return bad_doc(err, "listing: an entry without a valid <Key>");
    if (child_text(c, "Size", num, sizeof num) <= 0 || parse_u64(num, &e->size) < 0 ||
        e->size > (1ull << 53))
        return bad_doc(err, "listing: an entry without a valid <Size>");
    if (child_text(c, "ETag", e->etag, sizeof e->etag) < 0)
        return bad_doc(err, "listing: an over-long <ETag>");
    if (child_text(c, "LastModified", when, sizeof when) > 0 && s3_parse_time(when, &e->mtime) < 0)
        return bad_doc(err, "listing: a bad <LastModified>");
    return 0;
}

static int parse_prefix(xmlNode *c, s3_entry *e, ckpt_err *err)
{
    int bad = 0;
    memset(e, 0, sizeof *e);
    e->is_prefix = 1;
    e->key = child_dup(c, "Prefix", KEY_MAX, &bad);
    if (bad == 2)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t n = e->key ? strlen(e->key) : 0;
    if (n < 2 || e->key[n - 1] != '/')
        return bad_doc(err, "listing: a common prefix without a valid <Prefix>");
    return 0;
}

int s3_xml_list_objects(const char *body, size_t len, s3_list *out, ckpt_err *err)
{
    memset(out, 0, sizeof *out);
    xmlDocPtr d = parse(body, len);
    xmlNode *root = root_of(d, "ListBucketResult", err);
    int rc = root ? 0 : -EINVAL;
    size_t cap = 0;
    char flag[16];
    for (xmlNode *c = root ? root->children : NULL; rc == 0 && c; c = c->next) {
        int prefix = is(c, "CommonPrefixes");
        if (!prefix && !is(c, "Contents"))
            continue;
        if (grow_array((void **)&out->v, &cap, out->n, sizeof *out->v) < 0) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        rc = prefix ? parse_prefix(c, &out->v[out->n], err) : parse_entry(c, &out->v[out->n], err);
        out->n++; /* freed with the list even when half-filled */
    }
    if (rc == 0) {
        if (child_text(root, "IsTruncated", flag, sizeof flag) < 0)
            rc = bad_doc(err, "listing: a bad <IsTruncated>");
        out->truncated = is_true(flag);
        int bad = 0;
        out->next_token = child_dup(root, "NextContinuationToken", KEY_MAX, &bad);
        if (rc == 0 && out->truncated && (bad || !out->next_token || !*out->next_token))
            rc = bad_doc(err, "listing: truncated without a valid <NextContinuationToken>");
    }
    xmlFreeDoc(d);
    if (rc < 0)
        s3_list_free(out);
    return rc;
}

int s3_xml_upload_id(const char *body, size_t len, char **out, ckpt_err *err)
{
    *out = NULL;
    xmlDocPtr d = parse(body, len);
    xmlNode *root = root_of(d, "InitiateMultipartUploadResult", err);
    int rc = root ? 0 : -EINVAL, bad = 0;
    if (root) {
        *out = child_dup(root, "UploadId", KEY_MAX, &bad);
        if (bad == 2)
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
        else if (!*out || !**out)
            rc = bad_doc(err, "no valid <UploadId> in the answer");
    }
    xmlFreeDoc(d);
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int s3_xml_complete(const char *body, size_t len, const char *root_name, s3_error *e, ckpt_err *err)
{
    memset(e, 0, sizeof *e);
    int r = s3_xml_error(body, len, e);
    if (r == 1)
        return 1;
    if (r < 0)
        return ckpt_fail(err, -EINVAL, "malformed XML in the answer (expected %s)", root_name);
    xmlDocPtr d = parse(body, len);
    int rc = root_of(d, root_name, err) ? 0 : -EINVAL;
    xmlFreeDoc(d);
    return rc;
}

void s3_uploads_free(s3_uploads *u)
{
    for (size_t i = 0; i < u->n; i++) {
        free(u->v[i].key);
        free(u->v[i].upload_id);
    }
    free(u->v);
    free(u->next_key_marker);
    free(u->next_upload_id_marker);
    memset(u, 0, sizeof *u);
}

int s3_xml_list_uploads(const char *body, size_t len, s3_uploads *out, ckpt_err *err)
{
    memset(out, 0, sizeof *out);
    xmlDocPtr d = parse(body, len);
    xmlNode *root = root_of(d, "ListMultipartUploadsResult", err);
    int rc = root ? 0 : -EINVAL;
    size_t cap = 0;
    for (xmlNode *c = root ? root->children : NULL; rc == 0 && c; c = c->next) {
        if (!is(c, "Upload"))
            continue;
        if (grow_array((void **)&out->v, &cap, out->n, sizeof *out->v) < 0) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            break;
        }
        s3_upload_info *u = &out->v[out->n++];
        memset(u, 0, sizeof *u);
        int bad = 0;
        char when[64];
        u->key = child_dup(c, "Key", KEY_MAX, &bad);
        u->upload_id = child_dup(c, "UploadId", KEY_MAX, &bad);
        if (bad == 2)
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
        else if (!u->key || !*u->key || !u->upload_id || !*u->upload_id)
            rc = bad_doc(err, "uploads: an entry without a valid <Key> or <UploadId>");
        else if (child_text(c, "Initiated", when, sizeof when) <= 0 ||
                 s3_parse_time(when, &u->initiated) < 0)
            rc = bad_doc(err, "uploads: an entry without a valid <Initiated>");
    }
    if (rc == 0) {
        char flag[16];
        int bad = 0;
        if (child_text(root, "IsTruncated", flag, sizeof flag) < 0)
            rc = bad_doc(err, "uploads: a bad <IsTruncated>");
        out->truncated = is_true(flag);
        out->next_key_marker = child_dup(root, "NextKeyMarker", KEY_MAX, &bad);
        out->next_upload_id_marker = child_dup(root, "NextUploadIdMarker", KEY_MAX, &bad);
        if (rc == 0 && out->truncated && (bad || !out->next_key_marker || !*out->next_key_marker))
            rc = bad_doc(err, "uploads: truncated without a valid <NextKeyMarker>");
    }
    xmlFreeDoc(d);
    if (rc < 0)
        s3_uploads_free(out);
    return rc;
}
