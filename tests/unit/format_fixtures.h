/* Helpers for the container-format tests (test_gguf_format.c,
 * test_tensorizer_format.c): run a Python generator from the pinned venv
 * into a scratch directory, read its manifest, parse a file from memory
 * and compare every tensor and region with what the generator recorded.
 * The in-memory source, the layout lookups and the byte builder serve the
 * torch and DCP tests too (through torch_fixtures.h).
 *
 * The venv's python is $CKPT_PYTHON, else $B/venv/bin/python (B defaults to
 * build), relative to the repository root the tests run from; make it with
 * `B=build scripts/venv.sh`. Without it the real-file tests are skipped with
 * a message saying so. Header-only, like testutil.h. */
#ifndef CKPT_FORMAT_FIXTURES_H
#define CKPT_FORMAT_FIXTURES_H

#include <sys/wait.h>

#include "common.h"
#include "formats/formats.h"
#include "testutil.h"

/* ------------------------------------------------------------ sources */

typedef struct ff_mem {
    const uint8_t *p;
    size_t n;
} ff_mem;

static inline ssize_t ff_mem_read(void *ud, void *buf, size_t len, uint64_t off)
{
    const ff_mem *m = ud;
    if (off >= m->n)
        return 0;
    size_t k = m->n - (size_t)off < len ? m->n - (size_t)off : len;
    memcpy(buf, m->p + off, k);
    return (ssize_t)k;
}

typedef struct ff_result {
    int rc;
    char msg[512];
    ingest_layout l;
} ff_result;

/* Frees a layout, regions included whether or not ingest_layout_free
 * knows about them yet. */
static inline void ff_layout_free(ingest_layout *l)
{
    free(l->regions);
    l->regions = NULL;
    l->n_regions = 0;
    ingest_layout_free(l);
}

static inline ff_result ff_parse(const container_format *f, const uint8_t *p, size_t n)
{
    ff_result r;
    memset(&r, 0, sizeof r);
    ff_mem m = {p, n};
    ingest_source src = {.read = ff_mem_read, .ud = &m, .size = n, .name = "fixture"};
    r.rc = f->describe(&src, "fixture", &r.l, r.msg, sizeof r.msg);
    if (r.rc < 0) {
        cr_assert(r.msg[0] != '\0', "rc %d with no message", r.rc);
        cr_assert_null(strchr(r.msg, '\n'), "message is not one line: %s", r.msg);
    }
    return r;
}

/* Expects describe to refuse the bytes with -EINVAL and a message holding
 * `fragment`. */
static inline void ff_expect_fault(const container_format *f, const uint8_t *p, size_t n,
                                   const char *fragment)
{
    ff_result r = ff_parse(f, p, n);
    cr_assert_eq(r.rc, -EINVAL, "rc %d (%s), expected -EINVAL with \"%s\"", r.rc, r.msg, fragment);
    tu_assert_contains(r.msg, fragment);
    cr_assert_eq(r.l.n, 0);
    cr_assert_null(r.l.t);
    ff_layout_free(&r.l);
}

static inline const ingest_tensor *ff_find_tensor(const ingest_layout *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0)
            return &l->t[i];
    return NULL;
}

static inline const ingest_skipped *ff_find_skipped(const ingest_layout *l, const char *name)
{
    for (size_t i = 0; i < l->n_skipped; i++)
        if (strcmp(l->skipped[i].name, name) == 0)
            return &l->skipped[i];
    return NULL;
}

/* ------------------------------------------------------------ builder */

/* Hostile files are written byte by byte into one of these. */
typedef struct ff_buf {
    uint8_t *p;
    size_t len, cap;
} ff_buf;

static inline void ff_put(ff_buf *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    if (n)
        memcpy(b->p + b->len, d, n);
    b->len += n;
}

static inline void ff_byte(ff_buf *b, uint8_t c)
{
    ff_put(b, &c, 1);
}

/* v as n bytes, little-endian. */
static inline void ff_le(ff_buf *b, uint64_t v, unsigned n)
{
    uint8_t t[8];
    for (unsigned i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    ff_put(b, t, n);
}

/* ------------------------------------------------------------ generator */

static inline char *ff_python(void)
{
    const char *env = getenv("CKPT_PYTHON");
    if (env && env[0])
        return access(env, X_OK) == 0 ? strdup(env) : NULL;
    const char *b = getenv("B");
    char path[4096];
    snprintf(path, sizeof path, "%s/venv/bin/python", b && b[0] ? b : "build");
    return access(path, X_OK) == 0 ? strdup(path) : NULL;
}

/* Runs `python script dir [extra]`; skips the test when there is no venv. */
static inline void ff_generate(const char *script, const char *dir, const char *extra)
{
    char *py = ff_python();
    if (!py)
        cr_skip_test("no python venv (run `B=build scripts/venv.sh`, or set CKPT_PYTHON): "
                     "real-file test of %s skipped",
                     script);
    cr_assert_eq(access(script, R_OK), 0, "%s: %s (tests run from the repository root)", script,
                 strerror(errno));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s%s%s >'%s/gen.log' 2>&1", py, script, dir,
             extra ? "'" : "", extra ? extra : "", extra ? "'" : "", dir);
    int st = system(cmd);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        char *log = tu_join(dir, "gen.log");
        size_t n;
        uint8_t *text = tu_read_file(log, &n);
        cr_assert_fail("%s failed (status %d):\n%s", script, st, (char *)text);
    }
    free(py);
}

/* ------------------------------------------------------------ manifest */

typedef struct ff_item {
    int is_region;
    char name[256];
    char dtype[32];
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_NDIM];
    uint64_t nbytes; /* regions */
    char sha[65];
    int seen;
} ff_item;

typedef struct ff_file {
    char name[128];
    int opaque;
    ff_item items[64];
    size_t n;
} ff_file;

/* Reads manifest.tsv into files[]; returns how many. */
static inline size_t ff_manifest(const char *dir, ff_file *files, size_t cap)
{
    char *path = tu_join(dir, "manifest.tsv");
    uint8_t *text = tu_read_file(path, NULL);
    free(path);
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r((char *)text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[6] = {0};
        int k = 0;
        for (char *s = line; k < 6; k++) {
            f[k] = s;
            char *tab = strchr(s, '\t');
            if (!tab)
                break;
            *tab = '\0';
            s = tab + 1;
        }
        if (strcmp(f[0], "file") == 0) {
            cr_assert_lt(n, cap);
            memset(&files[n], 0, sizeof files[n]);
            snprintf(files[n].name, sizeof files[n].name, "%s", f[1]);
            files[n].opaque = f[2] ? atoi(f[2]) : 0;
            n++;
            continue;
        }
        cr_assert_gt(n, 0, "manifest: item before any file");
        ff_file *cur = &files[n - 1];
        cr_assert_lt(cur->n, sizeof cur->items / sizeof cur->items[0]);
        ff_item *it = &cur->items[cur->n++];
        memset(it, 0, sizeof *it);
        if (strcmp(f[0], "tensor") == 0) {
            cr_assert(f[4], "manifest: short tensor line");
            snprintf(it->name, sizeof it->name, "%s", f[1]);
            snprintf(it->dtype, sizeof it->dtype, "%s", f[2]);
            for (char *d = f[3]; *d;) {
                it->shape[it->ndim++] = strtoull(d, &d, 10);
                if (*d == ',')
                    d++;
            }
            snprintf(it->sha, sizeof it->sha, "%s", f[4]);
        } else {
            cr_assert_str_eq(f[0], "region");
            cr_assert(f[3], "manifest: short region line");
            it->is_region = 1;
            snprintf(it->dtype, sizeof it->dtype, "%s", f[1]);
            it->nbytes = strtoull(f[2], NULL, 10);
            snprintf(it->sha, sizeof it->sha, "%s", f[3]);
        }
    }
    free(text);
    return n;
}

static inline void ff_sha_hex(const uint8_t *p, size_t n, char out[65])
{
    uint8_t d[32];
    tu_sha256(p, n, d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* Parses dir/file with f and checks it against the manifest: every tensor
 * (name, dtype, shape, sha256 of its bytes) and region (dtype, length,
 * sha256), no more and no fewer; ranges inside the file and disjoint. */
static inline void ff_check_file(const container_format *f, const char *dir, ff_file *mf)
{
    char *path = tu_join(dir, mf->name);
    size_t n;
    uint8_t *buf = tu_read_file(path, &n);
    free(path);
    cr_assert(f->sniff(mf->name, buf, n < 4096 ? n : 4096, n), "%s: sniff refused it", mf->name);
    ff_result r = ff_parse(f, buf, n);
    if (mf->opaque) {
        cr_assert_eq(r.rc, 1, "%s: rc %d (%s), expected 1 (kept opaque)", mf->name, r.rc, r.msg);
        cr_assert_eq(r.l.n, 0);
        free(buf);
        return;
    }
    cr_assert_eq(r.rc, 0, "%s: rc %d: %s", mf->name, r.rc, r.msg);
    size_t want_t = 0, want_r = 0;
    for (size_t i = 0; i < mf->n; i++)
        mf->items[i].is_region ? want_r++ : want_t++;
    cr_assert_eq(r.l.n, want_t, "%s: %zu tensors, expected %zu", mf->name, r.l.n, want_t);
    cr_assert_eq(r.l.n_regions, want_r, "%s: %zu regions, expected %zu", mf->name, r.l.n_regions,
                 want_r);
    uint64_t first = n, prev_end = 0;
    for (size_t i = 0; i < r.l.n; i++) {
        const ingest_tensor *t = &r.l.t[i];
        cr_assert_leq(t->offset + t->nbytes, n);
        cr_assert_geq(t->offset, prev_end, "%s: tensors out of order or overlapping", mf->name);
        prev_end = t->offset + t->nbytes;
        if (t->offset < first)
            first = t->offset;
        ff_item *it = NULL;
        for (size_t k = 0; k < mf->n; k++)
            if (!mf->items[k].is_region && strcmp(mf->items[k].name, t->name) == 0)
                it = &mf->items[k];
        cr_assert_not_null(it, "%s: unexpected tensor '%s'", mf->name, t->name);
        cr_assert_eq(it->seen, 0, "%s: tensor '%s' twice", mf->name, t->name);
        it->seen = 1;
        cr_assert_str_eq(t->dtype, it->dtype, "%s: tensor '%s'", mf->name, t->name);
        cr_assert_eq(t->ndim, it->ndim, "%s: tensor '%s': ndim %u, expected %u", mf->name, t->name,
                     t->ndim, it->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            cr_assert_eq(t->shape[d], it->shape[d], "%s: tensor '%s': shape[%u] %llu != %llu",
                         mf->name, t->name, d, (unsigned long long)t->shape[d],
                         (unsigned long long)it->shape[d]);
        uint64_t expect_bytes;
        cr_assert_eq(ckpt_tensor_bytes(t->dtype, t->ndim, t->shape, &expect_bytes), 0);
        cr_assert_eq(t->nbytes, expect_bytes, "%s: tensor '%s': nbytes", mf->name, t->name);
        char hex[65];
        ff_sha_hex(buf + t->offset, (size_t)t->nbytes, hex);
        cr_assert_str_eq(hex, it->sha, "%s: tensor '%s': bytes differ", mf->name, t->name);
    }
    prev_end = 0;
    for (size_t i = 0; i < r.l.n_regions; i++) {
        const ingest_region *g = &r.l.regions[i];
        cr_assert_leq(g->offset + g->length, n);
        cr_assert_geq(g->offset, prev_end, "%s: regions out of order or overlapping", mf->name);
        prev_end = g->offset + g->length;
        if (g->offset < first)
            first = g->offset;
        char hex[65];
        ff_sha_hex(buf + g->offset, (size_t)g->length, hex);
        ff_item *it = NULL;
        for (size_t k = 0; k < mf->n; k++)
            if (mf->items[k].is_region && !mf->items[k].seen && strcmp(mf->items[k].sha, hex) == 0)
                it = &mf->items[k];
        cr_assert_not_null(it, "%s: region %s [%llu, +%llu) matches no generated tensor", mf->name,
                           g->dtype, (unsigned long long)g->offset, (unsigned long long)g->length);
        it->seen = 1;
        cr_assert_str_eq(g->dtype, it->dtype);
        cr_assert_eq(g->length, it->nbytes);
    }
    cr_assert_eq(r.l.header_bytes, first, "%s: header_bytes %llu, first range at %llu", mf->name,
                 (unsigned long long)r.l.header_bytes, (unsigned long long)first);
    ff_layout_free(&r.l);
    free(buf);
}

#endif
