/* Where an S3 store is and who we are there: the s3:// URL, the endpoint and
 * region, and the credentials, found the way the AWS CLI and SDKs find them
 * (s3.h lists the order). Credentials come from the environment or the
 * ~/.aws files only, never from options or argv, and the secret parts are
 * wiped when freed. Nothing here talks to the network. */
#include "s3.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bucket names: S3's rules loosened to what other stores accept (capitals,
 * '_'), but never '/', spaces or control bytes. */
static int bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)b[i]) && b[i] != '.' && b[i] != '-' && b[i] != '_')
            return 0;
    return 1;
}

int s3_url_parse(const char *url, s3_url *out, ckpt_err *err)
{
    memset(out, 0, sizeof *out);
    if (!url || strncmp(url, "s3://", 5) != 0)
        return ckpt_fail(err, -EINVAL, "%s: not an s3:// URL", url ? url : "(null)");
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    if (!bucket_ok(b, blen))
        return ckpt_fail(err, -EINVAL,
                         "%s: bad bucket name (3 to 63 letters, digits, '.', '-' or '_')", url);
    const char *p = slash ? slash + 1 : "";
    size_t plen = strlen(p);
    while (plen && p[plen - 1] == '/')
        plen--;
    out->bucket = strndup(b, blen);
    out->prefix = strndup(p, plen);
    if (!out->bucket || !out->prefix) {
        s3_url_free(out);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    if (plen && !ckpt_path_is_safe(out->prefix)) {
        s3_url_free(out);
        return ckpt_fail(err, -EINVAL,
                         "%s: bad prefix (no empty, '.' or '..' components, no leading '/')", url);
    }
    return 0;
}

void s3_url_free(s3_url *u)
{
    free(u->bucket);
    free(u->prefix);
    u->bucket = u->prefix = NULL;
}

char *s3_uri_encode(const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = malloc(3 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
            (keep_slash && *p == '/')) {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = 0;
    return out;
}

/* ------------------------------------------------------------ INI files */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

int s3_ini_get(const char *path, const char *section, const char *key, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
    /* stdio's own buffer would go back to the heap holding the file's
     * secrets, every profile's: ours is wiped. */
    char iobuf[4096];
    setvbuf(f, iobuf, _IOFBF, sizeof iobuf);
    char line[4096];
    int in_section = 0, found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *l = trim(line);
        if (!*l || *l == '#' || *l == ';')
            continue;
        if (*l == '[') {
            char *end = strchr(l, ']');
            if (!end)
                continue;
            *end = 0;
            in_section = strcmp(trim(l + 1), section) == 0;
            continue;
        }
        char *eq = strchr(l, '=');
        if (!in_section || !eq)
            continue;
        *eq = 0;
        if (strcmp(trim(l), key) != 0)
            continue;
        if (!(*out = strdup(trim(eq + 1)))) {
            found = -ENOMEM;
            break;
        }
        found = 1;
    }
    sodium_memzero(line, sizeof line); /* it may have held a secret */
    fclose(f);
    sodium_memzero(iobuf, sizeof iobuf);
    return found;
}

/* ------------------------------------------------------------- resolving */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void free_secret(char **s)
{
    if (*s) {
        sodium_memzero(*s, strlen(*s));
        free(*s);
        *s = NULL;
    }
}

void s3_config_free(s3_config *c)
{
    free(c->endpoint);
    free(c->region);
    free(c->ca_bundle);
    free(c->access_key);
    free_secret(&c->secret_key);
    free_secret(&c->session_token);
    memset(c, 0, sizeof *c);
}

/* The two AWS files: credentials first, then config. */
typedef struct aws_files {
    char *cred, *conf;
    const char *profile;
    char conf_section[160];
} aws_files;

static int files_init(aws_files *f, const char *profile)
{
    memset(f, 0, sizeof *f);
    f->profile = profile;
    const char *home = env("HOME");
    const char *c = env("AWS_SHARED_CREDENTIALS_FILE"), *k = env("AWS_CONFIG_FILE");
    if (c)
        f->cred = strdup(c);
    else if (home && asprintf(&f->cred, "%s/.aws/credentials", home) < 0)
        f->cred = NULL;
    if (k)
        f->conf = strdup(k);
    else if (home && asprintf(&f->conf, "%s/.aws/config", home) < 0)
        f->conf = NULL;
    if (strcmp(profile, "default") == 0)
        snprintf(f->conf_section, sizeof f->conf_section, "default");
    else
        snprintf(f->conf_section, sizeof f->conf_section, "profile %s", profile);
    return 0;
}

static void files_free(aws_files *f)
{
    free(f->cred);
    free(f->conf);
}

/* key from the profile: credentials file, then config file. 1, 0, -errno. */
static int profile_get(const aws_files *f, const char *key, int cred_file_too, char **out,
                       const char **from)
{
    int rc = 0;
    *out = NULL;
    if (cred_file_too && f->cred && (rc = s3_ini_get(f->cred, f->profile, key, out)) != 0) {
        *from = f->cred;
        return rc;
    }
    if (f->conf && (rc = s3_ini_get(f->conf, f->conf_section, key, out)) != 0)
        *from = f->conf;
    return rc;
}

static int dup_or(char **dst, const char *a, char *owned_b, const char *c)
{
    if (a) {
        free(owned_b);
        *dst = strdup(a);
    } else if (owned_b) {
        *dst = owned_b;
    } else {
        *dst = c ? strdup(c) : NULL;
        return c && !*dst ? -ENOMEM : 0;
    }
    return *dst ? 0 : -ENOMEM;
}

static int check_endpoint(char *e, ckpt_err *err)
{
    if (strncmp(e, "http://", 7) != 0 && strncmp(e, "https://", 8) != 0)
        return ckpt_fail(err, -EINVAL, "endpoint '%s': expected http://HOST[:PORT] or https://...",
                         e);
    const char *host = strstr(e, "://") + 3;
    if (!*host || *host == '/' || strpbrk(e, "?# \t\r\n@"))
        return ckpt_fail(err, -EINVAL, "endpoint '%s': expected http://HOST[:PORT] or https://...",
                         e);
    size_t n = strlen(e);
    while (n && e[n - 1] == '/')
        e[--n] = 0;
    return 0;
}

int s3_config_resolve(const ckpt_store_opts *opts, s3_config *out, ckpt_err *err)
{
    static const ckpt_store_opts none;
    if (!opts)
        opts = &none;
    memset(out, 0, sizeof *out);
    const char *profile = opts->profile ? opts->profile : env("AWS_PROFILE");
    if (!profile)
        profile = "default";
    if (!*profile || strpbrk(profile, "[]\r\n"))
        return ckpt_fail(err, -EINVAL, "bad profile name '%s'", profile);
    aws_files f;
    files_init(&f, profile);
    const char *from = NULL;
    char *v = NULL;
    int rc = 0;

    /* Region. */
    const char *r = opts->region ? opts->region : env("AWS_REGION");
    if (!r)
        r = env("AWS_DEFAULT_REGION");
    if (!r && (rc = profile_get(&f, "region", 0, &v, &from)) < 0)
        goto unreadable;
    if ((rc = dup_or(&out->region, r, v, "us-east-1")) < 0)
        goto oom;
    v = NULL;
    for (const char *p = out->region; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-') {
            rc = ckpt_fail(err, -EINVAL, "bad region '%s'", out->region);
            goto fail;
        }

    /* Endpoint. */
    const char *e = opts->endpoint ? opts->endpoint : env("AWS_ENDPOINT_URL_S3");
    if (!e)
        e = env("AWS_ENDPOINT_URL");
    if (!e && (rc = profile_get(&f, "endpoint_url", 0, &v, &from)) < 0)
        goto unreadable;
    if (!e && !v && asprintf(&v, "https://s3.%s.amazonaws.com", out->region) < 0) {
        v = NULL;
        goto oom;
    }
    if ((rc = dup_or(&out->endpoint, e, v, NULL)) < 0)
        goto oom;
    v = NULL;
    if ((rc = check_endpoint(out->endpoint, err)) < 0)
        goto fail;

    /* The CAs an https endpoint is checked against, as the AWS CLI takes
     * them: a gateway with a certificate of a private CA could not be
     * reached at all, the system's store being the only one. */
    const char *ca = env("AWS_CA_BUNDLE");
    from = "AWS_CA_BUNDLE";
    if (!ca && (rc = profile_get(&f, "ca_bundle", 0, &v, &from)) < 0)
        goto unreadable;
    if ((rc = dup_or(&out->ca_bundle, ca, v, NULL)) < 0)
        goto oom;
    v = NULL;
    if (out->ca_bundle) {
        /* Absolute: a daemon leaves its directory for '/'. */
        char *abs = realpath(out->ca_bundle, NULL);
        if (!abs || access(abs, R_OK) != 0) {
            rc = ckpt_fail(err, -errno, "CA bundle '%s' (from %s): %s", out->ca_bundle, from,
                           strerror(errno));
            free(abs);
            goto fail;
        }
        free(out->ca_bundle);
        out->ca_bundle = abs;
    }

    /* Credentials: an explicit profile wins over the environment, as with
     * the AWS CLI's --profile; otherwise the environment's keys win. */
    if (!opts->profile && env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
        out->access_key = strdup(env("AWS_ACCESS_KEY_ID"));
        out->secret_key = strdup(env("AWS_SECRET_ACCESS_KEY"));
        if (env("AWS_SESSION_TOKEN") && !(out->session_token = strdup(env("AWS_SESSION_TOKEN"))))
            goto oom;
        if (!out->access_key || !out->secret_key)
            goto oom;
        snprintf(out->source, sizeof out->source, "the environment (AWS_ACCESS_KEY_ID)");
    } else {
        const char *from_id = NULL, *from_secret = NULL, *from_token = NULL;
        if ((rc = profile_get(&f, "aws_access_key_id", 1, &out->access_key, &from_id)) < 0 ||
            (rc = profile_get(&f, "aws_secret_access_key", 1, &out->secret_key, &from_secret)) <
                0 ||
            (rc = profile_get(&f, "aws_session_token", 1, &out->session_token, &from_token)) < 0) {
            from = from_id ? from_id : from_secret ? from_secret : f.cred;
            goto unreadable;
        }
        if (!out->access_key || !out->secret_key || !*out->access_key || !*out->secret_key) {
            rc = ckpt_fail(err, -EACCES,
                           "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                           "or give profile '%s' aws_access_key_id and aws_secret_access_key "
                           "in %s",
                           profile, f.cred ? f.cred : "~/.aws/credentials");
            goto fail;
        }
        snprintf(out->source, sizeof out->source, "profile '%s' in %.120s", profile, from_id);
    }
    if (strpbrk(out->access_key, ":\r\n") || strpbrk(out->secret_key, "\r\n") ||
        (out->session_token && strpbrk(out->session_token, "\r\n"))) {
        rc =
            ckpt_fail(err, -EINVAL, "S3 credentials from %s contain a newline or ':'", out->source);
        goto fail;
    }
    files_free(&f);
    return 0;

unreadable:
    rc = ckpt_fail(err, rc, "%s: cannot read: %s", from ? from : "AWS config", strerror(-rc));
    goto fail;
oom:
    free(v);
    rc = ckpt_fail(err, -ENOMEM, "out of memory");
fail:
    files_free(&f);
    s3_config_free(out);
    return rc;
}
