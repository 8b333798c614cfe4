/* Keys: loading, locked storage, passphrase derivation, keygen. */
#include "crypto.h"
#include "format.h"

#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <sodium.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

struct ckpt_key {
    int is_passphrase;
    size_t len;
    uint8_t *bytes;       /* sodium_malloc: guarded, locked, not dumped */
    pthread_mutex_t lock; /* guards the derivation cache */
    int cached;
    kdf_params cached_params;
    uint8_t *cached_master; /* sodium_malloc'd, 32 bytes */
};

/* Long-lived secrets (keys, subkeys) in sodium_malloc'd memory, listed so
 * that a process that forked since they were made can lock them again: the
 * child of fork(2) holds no memory locks (ckpt_secrets_relock). */
typedef struct secret {
    void *p;
    size_t len;
    struct secret *next;
} secret;
static pthread_mutex_t secrets_mu = PTHREAD_MUTEX_INITIALIZER;
static secret *secrets;

void *ckpt_secret_alloc(size_t len)
{
    void *p = sodium_malloc(len);
    secret *s = p ? malloc(sizeof *s) : NULL;
    if (!s) {
        sodium_free(p);
        return NULL;
    }
    s->p = p;
    s->len = len;
    pthread_mutex_lock(&secrets_mu);
    s->next = secrets;
    secrets = s;
    pthread_mutex_unlock(&secrets_mu);
    return p;
}

void ckpt_secret_free(void *p)
{
    if (!p)
        return;
    secret *s = NULL;
    pthread_mutex_lock(&secrets_mu);
    for (secret **at = &secrets; *at; at = &(*at)->next) {
        if ((*at)->p == p) {
            s = *at;
            *at = s->next;
            break;
        }
    }
    pthread_mutex_unlock(&secrets_mu);
    free(s);
    sodium_free(p);
}

int ckpt_secrets_relock(void)
{
    int rc = 0;
    pthread_mutex_lock(&secrets_mu);
    for (secret *s = secrets; s; s = s->next)
        if (sodium_mlock(s->p, s->len) != 0 && rc == 0)
            rc = -errno;
    pthread_mutex_unlock(&secrets_mu);
    return rc;
}

int ckpt_forbid_core_dumps(void)
{
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        return -errno;
    return 0;
}

static int key_new(const uint8_t *bytes, size_t len, int is_passphrase, ckpt_key **out,
                   ckpt_err *err)
{
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    ckpt_key *k = calloc(1, sizeof *k);
    if (!k)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    k->bytes = ckpt_secret_alloc(len ? len : 1);
    k->cached_master = ckpt_secret_alloc(CKPT_KEY_BYTES);
    if (!k->bytes || !k->cached_master) {
        ckpt_secret_free(k->bytes);
        ckpt_secret_free(k->cached_master);
        free(k);
        return ckpt_fail(err, -ENOMEM, "cannot allocate locked memory for the key");
    }
    memcpy(k->bytes, bytes, len);
    k->len = len;
    k->is_passphrase = is_passphrase;
    pthread_mutex_init(&k->lock, NULL);
    *out = k;
    return 0;
}

void ckpt_key_free(ckpt_key *k)
{
    if (!k)
        return;
    ckpt_secret_free(k->bytes);
    ckpt_secret_free(k->cached_master);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

int ckpt_key_is_passphrase(const ckpt_key *k)
{
    return k && k->is_passphrase;
}

int ckpt_key_from_bytes(const uint8_t key[CKPT_KEY_BYTES], ckpt_key **out, ckpt_err *err)
{
    return key_new(key, CKPT_KEY_BYTES, 0, out, err);
}

/* Whoever owns a secret file can swap in a key they know, so only the
 * user's own files are trusted, and root's (who could read or change any
 * of them anyway), as ssh trusts its configuration files. */
static int check_secret_owner(const char *path, uid_t owner, ckpt_err *err)
{
    uid_t me = geteuid();
    if (owner == me || owner == 0)
        return 0;
    char name[128];
    struct passwd pw, *found = NULL;
    char buf[1024];
    if (getpwuid_r(owner, &pw, buf, sizeof buf, &found) == 0 && found)
        snprintf(name, sizeof name, "%s (uid %u)", found->pw_name, (unsigned)owner);
    else
        snprintf(name, sizeof name, "uid %u", (unsigned)owner);
    return ckpt_fail(err, -EACCES,
                     "%s: owned by %s, not by the user running this (uid %u), and it holds a "
                     "secret its owner could replace; use a copy you own (chown, or cp and "
                     "chmod 600)",
                     path, name, (unsigned)me);
}

/* Reads a small secret file into locked memory, refusing files others can
 * read or own. */
static int read_secret_file(const char *path, uint8_t **buf, size_t *len, size_t max, ckpt_err *err)
{
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    struct stat st;
    int fd = ckpt_open_regular(path, 0, &st); /* a FIFO in its place must not hang */
    if (fd == -EINVAL)
        return ckpt_fail(err, -EINVAL, "%s: not a regular file", path);
    if (fd < 0)
        return ckpt_fail(err, fd, "%s: cannot open: %s", path, strerror(-fd));
    if (st.st_mode & 077) {
        close(fd);
        return ckpt_fail(err, -EACCES,
                         "%s: group or others may access it (mode %04o), and it holds a secret; "
                         "run chmod 600",
                         path, (unsigned)(st.st_mode & 07777));
    }
    int rc = check_secret_owner(path, st.st_uid, err);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ckpt_fail(err, -EINVAL, "%s: too large for a key (%lld bytes)", path,
                         (long long)st.st_size);
    }
    uint8_t *b = sodium_malloc(max + 1);
    if (!b) {
        close(fd);
        return ckpt_fail(err, -ENOMEM, "cannot allocate locked memory for the key");
    }
    /* One byte more than a key may hold tells a too-large file apart. */
    ssize_t r = ckpt_read_full(fd, b, max + 1);
    close(fd);
    if (r < 0) {
        sodium_free(b);
        return ckpt_fail(err, (int)r, "%s: read failed: %s", path, strerror((int)-r));
    }
    size_t n = (size_t)r;
    if (n > max) {
        sodium_free(b);
        return ckpt_fail(err, -EINVAL, "%s: too large for a key", path);
    }
    *buf = b;
    *len = n;
    return 0;
}

int ckpt_key_load_file(const char *path, ckpt_key **out, ckpt_err *err)
{
    uint8_t *b;
    size_t n;
    int rc = read_secret_file(path, &b, &n, 128, err);
    if (rc < 0)
        return rc;
    uint8_t *raw = sodium_malloc(CKPT_KEY_BYTES);
    if (!raw) {
        sodium_free(b);
        return ckpt_fail(err, -ENOMEM, "out of locked memory");
    }
    size_t hexlen = n;
    while (hexlen && (b[hexlen - 1] == '\n' || b[hexlen - 1] == '\r'))
        hexlen--;
    size_t binlen = 0;
    if (n == CKPT_KEY_BYTES) {
        memcpy(raw, b, CKPT_KEY_BYTES);
        rc = 0;
    } else if (hexlen == 2 * CKPT_KEY_BYTES &&
               sodium_hex2bin(raw, CKPT_KEY_BYTES, (const char *)b, hexlen, NULL, &binlen, NULL) ==
                   0 &&
               binlen == CKPT_KEY_BYTES) {
        rc = 0;
    } else {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: a key file holds 32 raw bytes or 64 hex digits, this one has %zu bytes",
                       path, n);
    }
    sodium_free(b);
    if (rc == 0)
        rc = key_new(raw, CKPT_KEY_BYTES, 0, out, err);
    sodium_free(raw);
    return rc;
}

int ckpt_key_load_passphrase_file(const char *path, ckpt_key **out, ckpt_err *err)
{
    uint8_t *b;
    size_t n;
    int rc = read_secret_file(path, &b, &n, 4096, err);
    if (rc < 0)
        return rc;
    if (n && b[n - 1] == '\n')
        n--;
    if (n && b[n - 1] == '\r')
        n--;
    if (n == 0)
        rc = ckpt_fail(err, -EINVAL, "%s: passphrase is empty", path);
    else
        rc = key_new(b, n, 1, out, err);
    sodium_free(b);
    return rc;
}

int key_master(const ckpt_key *key, const kdf_params *kp, uint8_t *master, ckpt_err *err)
{
    if (!key->is_passphrase) {
        if (kp->kdf != TPACK_KDF_KEYFILE)
            return ckpt_fail(err, -EACCES, "wrong key: pack expects a passphrase, got a key file");
        memcpy(master, key->bytes, CKPT_KEY_BYTES);
        return 0;
    }
    if (kp->kdf != TPACK_KDF_ARGON2ID)
        return ckpt_fail(err, -EACCES, "wrong key: pack expects a key file, got a passphrase");
    ckpt_key *k = (ckpt_key *)key; /* the cache is internal, the key itself is unchanged */
    pthread_mutex_lock(&k->lock);
    if (k->cached && memcmp(&k->cached_params, kp, sizeof *kp) == 0) {
        memcpy(master, k->cached_master, CKPT_KEY_BYTES);
        pthread_mutex_unlock(&k->lock);
        return 0;
    }
    int rc = crypto_pwhash(master, CKPT_KEY_BYTES, (const char *)k->bytes, k->len, kp->salt,
                           kp->ops, (size_t)kp->mem, crypto_pwhash_ALG_ARGON2ID13);
    if (rc == 0) {
        memcpy(k->cached_master, master, CKPT_KEY_BYTES);
        k->cached_params = *kp;
        k->cached = 1;
    }
    pthread_mutex_unlock(&k->lock);
    if (rc != 0)
        return ckpt_fail(err, -ENOMEM, "Argon2id key derivation failed (out of memory?)");
    return 0;
}

int ckpt_key_derive(const ckpt_key *key, const char *context, const uint8_t salt[16],
                    uint8_t out[CKPT_KEY_BYTES], ckpt_err *err)
{
    if (!key || !context || !salt || !out)
        return ckpt_fail(err, -EINVAL, "key derivation: missing argument");
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    kdf_params kp;
    memset(&kp, 0, sizeof kp);
    kp.kdf = key->is_passphrase ? TPACK_KDF_ARGON2ID : TPACK_KDF_KEYFILE;
    if (key->is_passphrase) {
        kp.ops = crypto_pwhash_OPSLIMIT_INTERACTIVE;
        kp.mem = crypto_pwhash_MEMLIMIT_INTERACTIVE;
        memcpy(kp.salt, salt, 16);
    }
    uint8_t *master = sodium_malloc(CKPT_KEY_BYTES);
    if (!master)
        return ckpt_fail(err, -ENOMEM, "out of locked memory");
    int rc = key_master(key, &kp, master, err);
    if (rc == 0) {
        /* The context's NUL keeps "ab"+salt apart from "a"+"b"||salt. */
        crypto_generichash_state st;
        crypto_generichash_init(&st, master, CKPT_KEY_BYTES, CKPT_KEY_BYTES);
        crypto_generichash_update(&st, (const unsigned char *)context, strlen(context) + 1);
        crypto_generichash_update(&st, salt, 16);
        crypto_generichash_final(&st, out, CKPT_KEY_BYTES);
        sodium_memzero(&st, sizeof st);
    }
    sodium_free(master);
    return rc;
}

int ckpt_keygen(const char *path, ckpt_err *err)
{
    if (ckpt_sodium_init() < 0)
        return ckpt_fail(err, -ENOSYS, "libsodium failed to initialise");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return ckpt_fail(err, -EEXIST, "%s: already exists; not overwriting a key", path);
        return ckpt_fail(err, -errno, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t *k = sodium_malloc(CKPT_KEY_BYTES);
    if (!k) {
        close(fd);
        unlink(path);
        return ckpt_fail(err, -ENOMEM, "out of locked memory");
    }
    randombytes_buf(k, CKPT_KEY_BYTES);
    ssize_t w = write(fd, k, CKPT_KEY_BYTES);
    int e = errno;
    sodium_free(k);
    if (w != CKPT_KEY_BYTES || fsync(fd) < 0) {
        if (w == CKPT_KEY_BYTES)
            e = errno;
        close(fd);
        unlink(path);
        return ckpt_fail(err, -e, "%s: write failed: %s", path, strerror(e));
    }
    close(fd);
    return 0;
}
