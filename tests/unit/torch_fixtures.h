/* Real torch files for the unit tests: a Python generator
 * (tests/unit/gen_torch_fixtures.py, gen_dcp_fixtures.py) run by the
 * project's venv (torch 2.x) or by Debian's python3 (torch 1.13) writes them
 * into a new directory with an expect.tsv of what they hold. Shared by
 * test_torch_format.c and test_dcp_format.c. */
#ifndef CKPT_TORCH_FIXTURES_H
#define CKPT_TORCH_FIXTURES_H

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

static inline void tf_hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

#endif
