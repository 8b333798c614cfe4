#include "stage_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"

#define RECORD_NAME "record"
#define SALT_NAME "salt"
#define DATA_DIR "data"
#define RECORD_MAGIC "ckptfs-stage 1"
#define MASTER_CONTEXT "ckptfs staging v1"
#define CKPT_KEY_CONTEXT "ckptfs-stage-key"
#define CHECK_CONTEXT "ckptfs-stage-check"

const char *stage_state_name(stage_state s)
{
    switch (s) {
    case STAGE_WRITING:
        return "writing";
    case STAGE_PACKING:
        return "packing";
    case STAGE_FAILED:
        return "failed";
    }
    return "unknown";
}

void stage_hex(const void *bytes, size_t len, char *out)
{
    sodium_bin2hex(out, 2 * len + 1, bytes, len);
}

static int unhex(const char *hex, uint8_t *out, size_t len)
{
    size_t got = 0;
    const char *end;
    if (strlen(hex) != 2 * len || sodium_hex2bin(out, len, hex, 2 * len, NULL, &got, &end) != 0 ||
        got != len)
        return -1;
    return 0;
}

/* Replaces dirfd/name with data: temporary file, fsync, rename, fsync of
 * the directory. A crash leaves the old contents or the new, never a mix. */
int stage_replace_file(int dirfd, const char *what, const char *name, const void *data, size_t len,
                       ckpt_err *err)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return ckpt_fail(err, -errno, "%s: cannot create %s: %s", what, tmp, strerror(errno));
    ssize_t w = ckpt_write_full(fd, data, len);
    int rc = w < 0 ? (int)w : 0;
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && renameat(dirfd, tmp, dirfd, name) != 0)
        rc = -errno;
    if (rc) {
        unlinkat(dirfd, tmp, 0);
        return ckpt_fail(err, rc, "%s: cannot write %s: %s", what, name, strerror(-rc));
    }
    if (fsync(dirfd) != 0)
        return ckpt_fail(err, -errno, "%s: fsync after writing %s: %s", what, name,
                         strerror(errno));
    return 0;
}

/* The whole of dirfd/name, up to max bytes; -ENOENT if absent. */
int stage_read_small(int dirfd, const char *name, size_t max, uint8_t **out, size_t *len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        close(fd);
        return -EIO;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    ssize_t got = ckpt_read_full(fd, buf, n);
    close(fd);
    if (got < 0 || (size_t)got != n) {
        free(buf);
        return -EIO;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* ------------------------------------------------------------------ root */

int stage_private_dir(int fd, const char *shown, ckpt_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ckpt_fail(err, -errno, "%s: cannot stat: %s", shown, strerror(errno));
    if (st.st_uid != geteuid())
        return ckpt_fail(err, -EPERM,
                         "%s is owned by uid %u, not by this daemon's user (uid %u): staged data "
                         "there is not private; remove it or mount as its owner",
                         shown, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0)
        return ckpt_fail(err, -errno, "%s: cannot make it private (chmod 700): %s", shown,
                         strerror(errno));
    return 0;
}

int stage_root_open(stage_root *r, int backing_fd, const mount_key *key, ckpt_err *err)
{
    memset(r, 0, sizeof *r);
    r->stage_fd = -1;
    r->backing_fd = backing_fd;
    r->key = key;
    pthread_mutex_init(&r->key_lock, NULL);
    if (sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    if (mkdirat(backing_fd, STAGE_HIDDEN_DIR, 0700) != 0 && errno != EEXIST)
        return ckpt_fail(err, -errno, "%s: cannot create the staging directory: %s",
                         STAGE_HIDDEN_DIR, strerror(errno));
    int hidden =
        openat(backing_fd, STAGE_HIDDEN_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (hidden < 0)
        return ckpt_fail(err, -errno, "%s: cannot open: %s", STAGE_HIDDEN_DIR, strerror(errno));
    int rc = 0;
    if (mkdirat(hidden, "stage", 0700) != 0 && errno != EEXIST)
        rc = ckpt_fail(err, -errno, "%s/stage: cannot create: %s", STAGE_HIDDEN_DIR,
                       strerror(errno));
    if (rc == 0) {
        r->stage_fd = openat(hidden, "stage", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (r->stage_fd < 0)
            rc = ckpt_fail(err, -errno, "%s/stage: cannot open: %s", STAGE_HIDDEN_DIR,
                           strerror(errno));
        else
            rc = stage_private_dir(r->stage_fd, STAGE_HIDDEN_DIR "/stage", err);
    }
    if (rc == 0 && key) {
        /* The salt for new checkpoints' keys; kept across mounts so the
         * (possibly slow) derivation is done once per mount. */
        uint8_t *buf = NULL;
        size_t len = 0;
        int got = stage_read_small(hidden, SALT_NAME, 64, &buf, &len);
        if (got == 0 && len == sizeof r->salt) {
            memcpy(r->salt, buf, sizeof r->salt);
        } else {
            randombytes_buf(r->salt, sizeof r->salt);
            rc = stage_replace_file(hidden, STAGE_HIDDEN_DIR, SALT_NAME, r->salt, sizeof r->salt,
                                    err);
        }
        free(buf);
        r->have_salt = rc == 0;
    }
    /* Both new directories must outlast a crash before anything is
     * staged in them. */
    if (rc == 0) {
        fsync(hidden);
        fsync(backing_fd);
    }
    close(hidden);
    if (rc && r->stage_fd >= 0) {
        close(r->stage_fd);
        r->stage_fd = -1;
    }
    return rc;
}

void stage_root_close(stage_root *r)
{
    if (r->stage_fd >= 0)
        close(r->stage_fd);
    r->stage_fd = -1;
    ckpt_secret_free(r->master);
    r->master = NULL;
    pthread_mutex_destroy(&r->key_lock);
}

/* The checkpoint key for sid under the master key of salt. The master
 * key of the last salt is kept: normally every checkpoint has the same. */
static int derive_key(stage_root *r, const uint8_t salt[16], const char *sid, stage_cipher cipher,
                      stage_key **out, ckpt_err *err)
{
    uint8_t sid_bin[STAGE_SID_LEN / 2];
    *out = NULL;
    if (unhex(sid, sid_bin, sizeof sid_bin) != 0)
        return ckpt_fail(err, -EINVAL, "staging %s: malformed id", sid);
    pthread_mutex_lock(&r->key_lock);
    int rc = 0;
    if (!r->master && !(r->master = ckpt_secret_alloc(CKPT_KEY_BYTES)))
        rc = ckpt_fail(err, -ENOMEM, "out of locked memory");
    if (rc == 0 && (!r->master_valid || memcmp(r->master_salt, salt, 16) != 0)) {
        r->master_valid = 0;
        rc = ckpt_key_derive(mount_key_get(r->key), MASTER_CONTEXT, salt, r->master, err);
        if (rc == 0) {
            memcpy(r->master_salt, salt, 16);
            r->master_valid = 1;
        }
    }
    stage_key *k = NULL;
    if (rc == 0 && !(k = stage_key_new(cipher)))
        rc = ckpt_fail(err, -ENOMEM, "out of locked memory");
    if (rc == 0) {
        /* The cipher is in the derivation: one key never serves two. */
        uint8_t msg[sizeof CKPT_KEY_CONTEXT + sizeof sid_bin + 1];
        memcpy(msg, CKPT_KEY_CONTEXT, sizeof CKPT_KEY_CONTEXT);
        memcpy(msg + sizeof CKPT_KEY_CONTEXT, sid_bin, sizeof sid_bin);
        msg[sizeof msg - 1] = (uint8_t)cipher;
        crypto_generichash(k->bytes, STAGE_KEY_BYTES, msg, sizeof msg, r->master, CKPT_KEY_BYTES);
        /* Out of memory here only costs speed: libsodium seals instead. */
        (void)stage_key_ready(k);
    }
    pthread_mutex_unlock(&r->key_lock);
    *out = k;
    return rc;
}

static void key_check(const stage_key *key, uint8_t out[16])
{
    crypto_generichash(out, 16, (const uint8_t *)CHECK_CONTEXT, sizeof CHECK_CONTEXT, key->bytes,
                       STAGE_KEY_BYTES);
}

/* ---------------------------------------------------------------- record */

static int record_text(const char *name, stage_state state, const stage_dir *d, const char *error,
                       char **out)
{
    size_t nlen = strlen(name), elen = error ? strlen(error) : 0;
    size_t cap = 256 + (STAGE_TRIED_MAX + 1) * 40 + 16 + 2 * nlen + 2 * elen;
    char *t = malloc(cap);
    if (!t)
        return -ENOMEM;
    char *name_hex = malloc(2 * nlen + 1), *err_hex = malloc(2 * elen + 1);
    if (!name_hex || !err_hex) {
        free(t);
        free(name_hex);
        free(err_hex);
        return -ENOMEM;
    }
    stage_hex(name, nlen, name_hex);
    stage_hex(error ? error : "", elen, err_hex);
    int n = snprintf(t, cap, RECORD_MAGIC "\nstate %s\nname %s\nsealed %d\n",
                     stage_state_name(state), name_hex, d->key != NULL);
    if (d->key) {
        char salt[33], check[33];
        uint8_t c[16];
        key_check(d->key, c);
        stage_hex(d->salt, 16, salt);
        stage_hex(c, 16, check);
        n += snprintf(t + n, cap - (size_t)n, "salt %s\ncheck %s\ncipher %s\n", salt, check,
                      stage_cipher_name(d->key->cipher));
    }
    if (d->is_file)
        n += snprintf(t + n, cap - (size_t)n, "file 1\n");
    if (d->replaces)
        n += snprintf(t + n, cap - (size_t)n, "replaces 1\n");
    if (d->has_base)
        n += snprintf(t + n, cap - (size_t)n, "base 1\n");
    for (unsigned i = 0; i < d->n_tried; i++) {
        char hex[33];
        stage_hex(d->tried[i], 16, hex);
        n += snprintf(t + n, cap - (size_t)n, "tried %s\n", hex);
    }
    if (d->has_trying) {
        char hex[33];
        stage_hex(d->trying, 16, hex);
        n += snprintf(t + n, cap - (size_t)n, "trying %s\n", hex);
    }
    if (error)
        snprintf(t + n, cap - (size_t)n, "error %s\n", err_hex);
    free(name_hex);
    free(err_hex);
    *out = t;
    return 0;
}

void stage_note_try(stage_dir *d, const uint8_t id[16])
{
    if (d->n_tried == STAGE_TRIED_MAX)
        memmove(d->tried[0], d->tried[1], (STAGE_TRIED_MAX - 1) * sizeof d->tried[0]);
    else
        d->n_tried++;
    memcpy(d->tried[d->n_tried - 1], id, 16);
}

void stage_end_try(stage_dir *d, int may_have_made)
{
    if (d->has_trying && may_have_made)
        stage_note_try(d, d->trying);
    d->has_trying = 0;
}

int stage_write_record(stage_root *r, stage_dir *d, const char *name, stage_state state,
                       const char *error, ckpt_err *err)
{
    char *text;
    int rc = record_text(name, state, d, error, &text);
    if (rc)
        return ckpt_fail(err, rc, "out of memory");
    char what[64];
    snprintf(what, sizeof what, "staging %s", d->sid);
    rc = stage_replace_file(d->fd, what, RECORD_NAME, text, strlen(text), err);
    free(text);
    return rc;
}

static char *unhex_string(const char *hex)
{
    size_t len = strlen(hex);
    if (len % 2)
        return NULL;
    char *s = malloc(len / 2 + 1);
    if (!s)
        return NULL;
    if (len && unhex(hex, (uint8_t *)s, len / 2) != 0) {
        free(s);
        return NULL;
    }
    s[len / 2] = 0;
    if (strlen(s) != len / 2) { /* an embedded NUL */
        free(s);
        return NULL;
    }
    return s;
}

static int parse_record(char *text, stage_record *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->cipher = STAGE_CIPHER_XCHACHA;
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, RECORD_MAGIC) != 0)
        return -EIO;
    int have_salt = 0, have_check = 0, have_sealed = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *val = strchr(line, ' ');
        if (!val)
            continue;
        *val++ = 0;
        if (strcmp(line, "state") == 0) {
            rec->state = strcmp(val, "writing") == 0   ? STAGE_WRITING
                         : strcmp(val, "packing") == 0 ? STAGE_PACKING
                         : strcmp(val, "failed") == 0  ? STAGE_FAILED
                                                       : 0;
        } else if (strcmp(line, "name") == 0) {
            free(rec->name);
            rec->name = unhex_string(val);
        } else if (strcmp(line, "sealed") == 0) {
            rec->sealed = strcmp(val, "1") == 0;
            have_sealed = 1;
        } else if (strcmp(line, "salt") == 0) {
            have_salt = unhex(val, rec->salt, 16) == 0;
        } else if (strcmp(line, "check") == 0) {
            have_check = unhex(val, rec->check, 16) == 0;
        } else if (strcmp(line, "cipher") == 0) {
            if (stage_cipher_parse(val, &rec->cipher) != 0)
                rec->cipher = 0; /* unknown: refused when unlocking */
        } else if (strcmp(line, "file") == 0) {
            rec->is_file = strcmp(val, "1") == 0;
        } else if (strcmp(line, "replaces") == 0) {
            rec->replaces = strcmp(val, "1") == 0;
        } else if (strcmp(line, "base") == 0) {
            rec->has_base = strcmp(val, "1") == 0;
        } else if (strcmp(line, "tried") == 0) {
            if (rec->n_tried < STAGE_TRIED_MAX && unhex(val, rec->tried[rec->n_tried], 16) == 0)
                rec->n_tried++;
        } else if (strcmp(line, "trying") == 0) {
            rec->has_trying = unhex(val, rec->trying, 16) == 0;
        } else if (strcmp(line, "error") == 0) {
            free(rec->error);
            rec->error = unhex_string(val);
        }
    }
    if (!rec->state || !rec->name || !rec->name[0] || !have_sealed ||
        (rec->sealed && (!have_salt || !have_check))) {
        stage_record_free(rec);
        return -EIO;
    }
    return 0;
}

void stage_record_free(stage_record *rec)
{
    free(rec->name);
    free(rec->error);
    memset(rec, 0, sizeof *rec);
}

/* ------------------------------------------------------------ directories */

static void dir_init(stage_dir *d)
{
    memset(d, 0, sizeof *d);
    d->fd = d->data_fd = -1;
}

void stage_dir_close(stage_dir *d)
{
    if (d->data_fd >= 0)
        close(d->data_fd);
    if (d->fd >= 0)
        close(d->fd);
    stage_key_free(d->key);
    dir_init(d);
}

int stage_create(stage_root *r, const char *name, stage_dir *d, ckpt_err *err)
{
    int is_file = d->is_file, replaces = d->replaces, has_base = d->has_base;
    dir_init(d);
    d->is_file = is_file;
    d->replaces = replaces;
    d->has_base = has_base;
    uint8_t sid[STAGE_SID_LEN / 2];
    randombytes_buf(sid, sizeof sid);
    stage_hex(sid, sizeof sid, d->sid);
    if (mkdirat(r->stage_fd, d->sid, 0700) != 0)
        return ckpt_fail(err, -errno, "staging for '%s': cannot create %s/stage/%s: %s", name,
                         STAGE_HIDDEN_DIR, d->sid, strerror(errno));
    int rc = 0;
    d->fd = openat(r->stage_fd, d->sid, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (d->fd < 0 || mkdirat(d->fd, DATA_DIR, 0700) != 0 ||
        (d->data_fd = openat(d->fd, DATA_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        rc = ckpt_fail(err, -errno, "staging for '%s': cannot set up %s/stage/%s: %s", name,
                       STAGE_HIDDEN_DIR, d->sid, strerror(errno));
    if (rc == 0 && mount_key_get(r->key)) {
        memcpy(d->salt, r->salt, 16);
        rc = derive_key(r, d->salt, d->sid, stage_cipher_default(), &d->key, err);
    }
    if (rc == 0)
        rc = stage_write_record(r, d, name, STAGE_WRITING, NULL, err);
    if (rc == 0 && fsync(r->stage_fd) != 0)
        rc = ckpt_fail(err, -errno, "staging for '%s': fsync: %s", name, strerror(errno));
    if (rc) {
        ckpt_err ignored;
        stage_remove(r, d, &ignored);
        stage_dir_close(d);
    }
    return rc;
}

int stage_open(stage_root *r, const char *sid, stage_dir *d, stage_record *rec, ckpt_err *err)
{
    dir_init(d);
    memset(rec, 0, sizeof *rec);
    if (strlen(sid) != STAGE_SID_LEN || strspn(sid, "0123456789abcdef") != STAGE_SID_LEN)
        return ckpt_fail(err, -EINVAL, "staging %s: not a staging directory", sid);
    snprintf(d->sid, sizeof d->sid, "%s", sid);
    d->fd = openat(r->stage_fd, sid, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (d->fd < 0)
        return ckpt_fail(err, -errno, "staging %s: cannot open: %s", sid, strerror(errno));
    d->data_fd = openat(d->fd, DATA_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    uint8_t *text = NULL;
    size_t len = 0;
    int rc = d->data_fd < 0 ? -errno : stage_read_small(d->fd, RECORD_NAME, 1 << 16, &text, &len);
    if (rc == 0)
        rc = parse_record((char *)text, rec);
    free(text);
    if (rc == 0) {
        d->is_file = rec->is_file;
        d->replaces = rec->replaces;
        d->has_base = rec->has_base;
        memcpy(d->tried, rec->tried, sizeof d->tried);
        d->n_tried = rec->n_tried;
        memcpy(d->trying, rec->trying, sizeof d->trying);
        d->has_trying = rec->has_trying;
    }
    if (rc) {
        stage_dir_close(d);
        return ckpt_fail(err, rc == -ENOENT ? -ENOENT : -EIO, "staging %s: no usable record (%s)",
                         sid, rc == -EIO ? "damaged" : strerror(-rc));
    }
    return 0;
}

int stage_unlock(stage_root *r, stage_dir *d, const stage_record *rec, ckpt_err *err)
{
    if (!rec->sealed || d->key)
        return 0;
    if (!mount_key_get(r->key))
        return ckpt_fail(err, -EACCES,
                         "checkpoint '%s': its staged data is encrypted; "
                         "mount with its key to reach it",
                         rec->name);
    if (!rec->cipher || !stage_cipher_available(rec->cipher))
        return ckpt_fail(err, -EACCES,
                         "checkpoint '%s': its staged data is sealed with a cipher "
                         "this CPU cannot run",
                         rec->name);
    stage_key *k;
    int rc = derive_key(r, rec->salt, d->sid, rec->cipher, &k, err);
    if (rc)
        return rc;
    uint8_t c[16];
    key_check(k, c);
    if (sodium_memcmp(c, rec->check, 16) != 0) {
        stage_key_free(k);
        return ckpt_fail(err, -EACCES, "checkpoint '%s': wrong key for its staged data", rec->name);
    }
    d->key = k;
    memcpy(d->salt, rec->salt, 16);
    return 0;
}

static int remove_entries(int fd)
{
    int dup_fd = dup(fd);
    if (dup_fd < 0)
        return -errno;
    DIR *dir = fdopendir(dup_fd);
    if (!dir) {
        close(dup_fd);
        return -errno;
    }
    rewinddir(dir);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT) {
            if (errno == EISDIR || errno == EPERM) {
                int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sub >= 0) {
                    int r2 = remove_entries(sub);
                    close(sub);
                    if (r2 == 0 && unlinkat(fd, e->d_name, AT_REMOVEDIR) == 0)
                        continue;
                }
            }
            rc = -errno;
        }
    }
    closedir(dir);
    return rc;
}

static int remove_sid_dir(stage_root *r, const char *sid, ckpt_err *err)
{
    int fd = openat(r->stage_fd, sid, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return 0;
    /* The record first: a crash half way then leaves a directory without
     * one, which recovery removes, never a checkpoint missing files. */
    int rc = fd < 0 ? -errno : 0;
    if (rc == 0 && unlinkat(fd, RECORD_NAME, 0) == 0)
        fsync(fd);
    if (rc == 0)
        rc = remove_entries(fd);
    if (fd >= 0)
        close(fd);
    if (rc == 0 && unlinkat(r->stage_fd, sid, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = -errno;
    if (rc == 0 && fsync(r->stage_fd) != 0)
        rc = -errno;
    if (rc)
        return ckpt_fail(err, rc, "staging %s: cannot remove: %s", sid, strerror(-rc));
    return 0;
}

int stage_remove(stage_root *r, stage_dir *d, ckpt_err *err)
{
    return remove_sid_dir(r, d->sid, err);
}

int stage_remove_sid(stage_root *r, const char *sid, ckpt_err *err)
{
    if (strlen(sid) != STAGE_SID_LEN || strspn(sid, "0123456789abcdef") != STAGE_SID_LEN)
        return ckpt_fail(err, -EINVAL, "staging %s: not a staging directory", sid);
    return remove_sid_dir(r, sid, err);
}

int stage_scan(stage_root *r, int (*fn)(void *ud, const char *sid), void *ud, ckpt_err *err)
{
    int fd = dup(r->stage_fd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return ckpt_fail(err, -e, "%s/stage: cannot list: %s", STAGE_HIDDEN_DIR, strerror(e));
    }
    rewinddir(dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        rc = fn(ud, e->d_name);
    }
    closedir(dir);
    return rc;
}
