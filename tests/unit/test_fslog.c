/* The daemon's logger (fs/common/fslog.c) writing to a file: the line format,
 * levels and the priority filter, the sanitizer, truncation to one line,
 * and a reopen requested the way SIGHUP requests it, after the file was
 * moved away as logrotate does. */
#include "testutil.h"

#include <time.h>

#include "common/fslog.h"

static char *dir, *path;

static void setup(void)
{
    dir = tu_mkdtemp();
    path = tu_join(dir, "ckptfs.log");
}

static void teardown(void)
{
    fslog_close();
    tu_rm_rf(dir);
    free(path);
    free(dir);
}

TestSuite(fslog, .init = setup, .fini = teardown);

/* The whole file, NUL-terminated ("" if absent); free() it. */
static char *slurp(const char *p)
{
    FILE *f = fopen(p, "rb");
    char *buf = calloc(1, 1 << 16);
    cr_assert_not_null(buf);
    if (f) {
        size_t n = fread(buf, 1, (1 << 16) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

Test(fslog, file_lines_carry_time_pid_and_level)
{
    cr_assert_eq(fslog_use_file(path), 0);
    cr_assert_str_eq(fslog_destination(), path);
    fslog_err("packing failed: %d", 42);
    fslog_warn("wrong key");
    fslog_info("mounted");
    char *log = slurp(path);
    char want[64];
    snprintf(want, sizeof want, " ckptfs[%ld]: error: packing failed: 42\n", (long)getpid());
    cr_assert_not_null(strstr(log, want), "%s", log);
    cr_assert_not_null(strstr(log, "]: warning: wrong key\n"), "%s", log);
    cr_assert_not_null(strstr(log, "]: mounted\n"), "%s", log);
    /* 2026-01-02T03:04:05.678+0000 */
    int y, mo, d, h, mi, s, ms;
    cr_assert_eq(sscanf(log, "%4d-%2d-%2dT%2d:%2d:%2d.%3d", &y, &mo, &d, &h, &mi, &s, &ms), 7, "%s",
                 log);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    free(log);
}

Test(fslog, debug_lines_only_when_asked)
{
    cr_assert_eq(fslog_use_file(path), 0);
    cr_assert(!fslog_enabled(LOG_DEBUG));
    fslog_debug("hidden");
    fslog_set_max_priority(LOG_DEBUG);
    fslog_debug("#2 lookup ino=1 name='x'");
    char *log = slurp(path);
    cr_assert_null(strstr(log, "hidden"), "%s", log);
    cr_assert_not_null(strstr(log, "]: debug: #2 lookup ino=1 name='x'\n"), "%s", log);
    free(log);
}

Test(fslog, names_cannot_break_lines_or_terminals)
{
    cr_assert_eq(fslog_use_file(path), 0);
    fslog_warn("checkpoint '%s' not shown", "evil\nckptfs[1]: error: forged\x1b[2J\x7f");
    char *log = slurp(path);
    cr_assert_eq(count_lines(log), 1, "%s", log);
    cr_assert_not_null(strstr(log, "'evil?ckptfs[1]: error: forged?[2J?' not shown\n"), "%s", log);
    free(log);
}

Test(fslog, long_messages_stay_one_line)
{
    cr_assert_eq(fslog_use_file(path), 0);
    char *big = malloc(10000);
    cr_assert_not_null(big);
    memset(big, 'n', 9999);
    big[9999] = '\0';
    fslog_info("name %s", big);
    char *log = slurp(path);
    cr_assert_eq(count_lines(log), 1);
    cr_assert_not_null(strstr(log, "n...\n"), "truncation is marked");
    free(log);
    free(big);
}

Test(fslog, bad_paths_are_refused_and_change_nothing)
{
    cr_assert_eq(fslog_use_file("relative.log"), -EINVAL);
    char *missing = tu_join(dir, "no/such/dir/x.log");
    cr_assert_eq(fslog_use_file(missing), -ENOENT);
    cr_assert_str_eq(fslog_destination(), "stderr");
    free(missing);
}

/* Polls until file holds text (the reopener works on its own thread). */
static int wait_for(const char *p, const char *text)
{
    for (int i = 0; i < 400; i++) {
        char *log = slurp(p);
        int found = strstr(log, text) != NULL;
        free(log);
        if (found)
            return 1;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    return 0;
}

Test(fslog, reopen_after_rotation)
{
    cr_assert_eq(fslog_use_file(path), 0);
    cr_assert_eq(fslog_start_reopener(), 0);
    fslog_info("before");
    char *rotated = tu_join(dir, "ckptfs.log.1");
    cr_assert_eq(rename(path, rotated), 0);
    /* What the SIGHUP handler does; several at once are one reopen. */
    fslog_request_reopen();
    fslog_request_reopen();
    cr_assert(wait_for(path, "log file reopened (SIGHUP)"));
    fslog_info("after");
    char *old = slurp(rotated), *now = slurp(path);
    cr_assert_not_null(strstr(old, "]: before\n"));
    cr_assert_not_null(strstr(old, "SIGHUP: reopening log file"));
    cr_assert_null(strstr(old, "after"), "%s", old);
    cr_assert_not_null(strstr(now, "]: after\n"), "%s", now);
    cr_assert_null(strstr(now, "before"), "%s", now);
    free(old);
    free(now);
    free(rotated);
}

Test(fslog, reopen_without_a_file_is_harmless)
{
    cr_assert_eq(fslog_start_reopener(), 0);
    fslog_request_reopen();
    fslog_close();          /* joins the reopener, whatever it was doing */
    fslog_request_reopen(); /* after close: nowhere to write, no crash */
    cr_assert_str_eq(fslog_destination(), "stderr");
}

/* The log ckptfs keeps itself (BACKING/.ckptfs/log, no /dev/log): rotated
 * once max bytes were written, path -> path.1 -> path.2, the oldest
 * dropped, so the files never hold much more than keep * max. */
Test(fslog, rotated_file_is_bounded)
{
    enum { MAX = 4096, KEEP = 3 };
    cr_assert_eq(fslog_use_rotated_file(path, MAX, KEEP), 0);
    for (int i = 0; i < 1000; i++)
        fslog_info("line %d of a log that would grow without bound: %0100d", i, i);
    char *p1 = tu_join(dir, "ckptfs.log.1"), *p2 = tu_join(dir, "ckptfs.log.2");
    char *p3 = tu_join(dir, "ckptfs.log.3");
    struct stat st;
    off_t total = 0;
    const char *paths[] = {path, p1, p2};
    for (int i = 0; i < KEEP; i++) {
        cr_assert_eq(stat(paths[i], &st), 0, "%s missing", paths[i]);
        cr_assert_leq(st.st_size, MAX + 200, "%s is %lld bytes", paths[i], (long long)st.st_size);
        total += st.st_size;
    }
    cr_assert_neq(stat(p3, &st), 0, "only %d files are kept", KEEP);
    cr_assert_geq(total, 2 * MAX, "the rotated files hold the recent lines");
    /* The newest line is in the current file, the one before in .1. */
    char *log = slurp(path);
    cr_assert_not_null(strstr(log, "line 999 "));
    free(log);
    free(p1);
    free(p2);
    free(p3);
}

/* Starting on a file already over the limit rotates it first. */
Test(fslog, rotated_file_over_the_limit_at_start)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 200; i++)
        fprintf(f, "an old line from an earlier mount, number %d\n", i);
    fclose(f);
    cr_assert_eq(fslog_use_rotated_file(path, 4096, 3), 0);
    fslog_info("new");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_lt(st.st_size, 200);
    char *p1 = tu_join(dir, "ckptfs.log.1");
    cr_assert_eq(stat(p1, &st), 0);
    free(p1);
}
