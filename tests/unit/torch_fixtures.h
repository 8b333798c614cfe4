/* Real torch files for the unit tests: a Python generator
 * (tests/unit/gen_torch_fixtures.py, gen_dcp_fixtures.py) run by the
 * project's venv (torch 2.x) or by Debian's python3 (torch 1.13) writes them
 * into a new directory with an expect.tsv of what they hold. And what both
 * parsers owe every file, real or hostile: a layout that keeps formats.h's
 * promises, or an empty one with a one-line message. Shared by
 * test_torch_format.c and test_dcp_format.c. */
#ifndef CKPT_TORCH_FIXTURES_H
#define CKPT_TORCH_FIXTURES_H

#include "format_fixtures.h"
#include "testutil.h"

#include <sys/wait.h>

/* The source tree (tests run from it unless CKPT_SRCDIR says otherwise). */
static inline const char *tf_srcdir(void)
{
    const char *d = getenv("CKPT_SRCDIR");
    return d && d[0] ? d : ".";
}

/* $CKPT_PYTHON, else the venv's python (scripts/venv.sh builds build/venv).
 * A CKPT_PYTHON that is not there (a build without the venv, such as the
 * Debian package's) skips the test. */
static inline char *tf_venv_python(void)
{
    const char *env = getenv("CKPT_PYTHON");
    if (env && env[0]) {
        char *py = env[0] == '/' ? strdup(env) : tu_join(tf_srcdir(), env);
        if (access(py, X_OK) != 0) {
            free(py);
            cr_skip_test("CKPT_PYTHON=%s is not there (no venv): real torch test skipped", env);
        }
        return py;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd '%s' && scripts/venv.sh 2>/dev/null", tf_srcdir());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char buf[1024] = "";
    char *got = fgets(buf, sizeof buf, p);
    int st = pclose(p);
    cr_assert(got && st == 0, "scripts/venv.sh failed (exit %d)", st);
    buf[strcspn(buf, "\n")] = '\0';
    char *path = buf[0] == '/' ? strdup(buf) : tu_join(tf_srcdir(), buf);
    cr_assert_not_null(path);
    return path;
}

/* Runs tests/unit/SCRIPT with python into a new directory and returns it;
 * skips the test when that interpreter has no torch (the generator exits
 * 3), fails it with the generator's log on any other error. */
static inline char *tf_generate(const char *python, const char *script)
{
    char *dir = tu_mkdtemp();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/unit/%s' '%s' 2>'%s/gen.log'", python, tf_srcdir(),
             script, dir, dir);
    int st = system(cmd);
    cr_assert_neq(st, -1, "system(%s): %s", cmd, strerror(errno));
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc != 0) {
        char *log_path = tu_join(dir, "gen.log");
        char *log = (char *)tu_read_file(log_path, NULL);
        if (rc == 3) {
            tu_rm_rf(dir);
            cr_skip_test("%s has no torch: %s", python, log);
        }
        cr_assert_fail("%s: exit %d: %s", cmd, rc, log);
    }
    return dir;
}

/* One tensor line of expect.tsv against the layout of file: f holds its
 * fields from the name on (name, dtype, shape as "2,3", the sha256 of the
 * bytes torch dumped); where names the file in messages. */
static inline void tf_check_tensor(const ingest_layout *l, const uint8_t *file, size_t flen,
                                   const char *where, char *const *f)
{
    const ingest_tensor *t = ff_find_tensor(l, f[0]);
    cr_assert_not_null(t, "%s: tensor '%s' not found", where, f[0]);
    cr_assert_str_eq(t->dtype, f[1], "%s: %s", where, f[0]);
    char shape[512] = "";
    for (uint32_t d = 0; d < t->ndim; d++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%llu", d ? "," : "",
                 (unsigned long long)t->shape[d]);
    cr_assert_str_eq(shape, f[2], "%s: %s shape", where, f[0]);
    cr_assert(t->offset <= flen && t->nbytes <= flen - t->offset);
    char sx[65];
    ff_sha_hex(file + t->offset, (size_t)t->nbytes, sx);
    cr_assert_str_eq(sx, f[3], "%s: %s bytes differ from torch's", where, f[0]);
}

/* The promises of formats.h, and torch's: regions sorted, disjoint and in
 * the file; tensors sorted, in the file, each inside one region of its
 * dtype, with nbytes = elements * element size. */
static inline void tf_check_invariants(const ingest_layout *l, uint64_t size)
{
    for (size_t i = 0; i < l->n_regions; i++) {
        const ingest_region *r = &l->regions[i];
        unsigned es = ckpt_dtype_size(r->dtype);
        cr_assert_gt(es, 0, "region dtype %s", r->dtype);
        cr_assert(r->offset <= size && r->length <= size - r->offset);
        cr_assert_eq(r->length % es, 0);
        if (i)
            cr_assert_geq(r->offset, l->regions[i - 1].offset + l->regions[i - 1].length);
    }
    for (size_t i = 0; i < l->n; i++) {
        const ingest_tensor *t = &l->t[i];
        uint64_t n = ckpt_dtype_size(t->dtype);
        cr_assert_gt(n, 0);
        for (uint32_t d = 0; d < t->ndim; d++)
            n *= t->shape[d];
        cr_assert_eq(n, t->nbytes, "%s: nbytes", t->name);
        if (i)
            cr_assert_geq(t->offset, l->t[i - 1].offset);
        bool inside = false;
        for (size_t r = 0; r < l->n_regions; r++) {
            const ingest_region *g = &l->regions[r];
            if (t->offset >= g->offset && t->offset + t->nbytes <= g->offset + g->length &&
                strcmp(g->dtype, t->dtype) == 0)
                inside = true;
        }
        cr_assert(inside, "tensor %s [%llu, +%llu) lies in no %s region", t->name,
                  (unsigned long long)t->offset, (unsigned long long)t->nbytes, t->dtype);
    }
    if (l->n)
        cr_assert_eq(l->header_bytes, l->t[0].offset);
}

typedef struct tf_result {
    int rc;
    int sniff; /* what sniff() said of the file */
    char msg[512];
    ingest_layout l;
} tf_result;

/* f's sniff() and describe() of a file of len bytes at p, read through src,
 * as path; the layout checked against tf_check_invariants when it is
 * accepted, and empty, with a one-line message, when it is refused. */
static inline tf_result tf_describe(const container_format *f, const ingest_source *src,
                                    const uint8_t *p, size_t len, const char *path)
{
    tf_result r;
    memset(&r, 0, sizeof r);
    r.sniff = f->sniff(path, p, len < 4096 ? len : 4096, len);
    r.rc = f->describe(src, path, &r.l, r.msg, sizeof r.msg);
    if (r.rc == 0)
        tf_check_invariants(&r.l, len);
    if (r.rc < 0) {
        cr_assert_eq(r.l.n, 0);
        cr_assert_eq(r.l.n_regions, 0);
        cr_assert_null(strchr(r.msg, '\n'));
    }
    return r;
}

#endif
