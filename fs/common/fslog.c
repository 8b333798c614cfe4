#include "fslog.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { FSLOG_STDERR, FSLOG_SYSLOG, FSLOG_FILE };

/* The destination changes only while one thread runs (start-up, exit);
 * the atomics keep the rest honest for the threads that read it. */
static int fslog_dest = FSLOG_STDERR;
static int fslog_max = LOG_INFO;
static int fslog_tee;
/* The log file. Its descriptor number never changes: a reopen dup3()s the
 * new file onto it, so a thread writing while that happens writes whole to
 * either file and never to a closed or reused descriptor. */
static int fslog_fd = -1;
static char fslog_path[PATH_MAX];
/* SIGHUP -> reopener thread: the only thing the handler touches. */
static int fslog_pipe_r = -1, fslog_pipe_w = -1;
static pthread_t fslog_reopener;
static int fslog_reopener_running;
/* Rotation of a file ckptfs chose itself (fslog_use_rotated_file): bytes
 * written to the current file, and the size at which it is rotated. */
static uint64_t fslog_written, fslog_rotate_max;
static int fslog_rotate_keep;
static pthread_mutex_t fslog_rotate_lock = PTHREAD_MUTEX_INITIALIZER;

void fslog_set_max_priority(int priority)
{
    __atomic_store_n(&fslog_max, priority, __ATOMIC_RELAXED);
}

int fslog_enabled(int priority)
{
    return priority <= __atomic_load_n(&fslog_max, __ATOMIC_RELAXED);
}

void fslog_tee_stderr(int on)
{
    __atomic_store_n(&fslog_tee, on, __ATOMIC_RELAXED);
}

const char *fslog_destination(void)
{
    switch (__atomic_load_n(&fslog_dest, __ATOMIC_ACQUIRE)) {
    case FSLOG_SYSLOG:
        return "syslog";
    case FSLOG_FILE:
        return fslog_path;
    }
    return "stderr";
}

static const char *fslog_tag(int priority)
{
    if (priority <= LOG_ERR)
        return "error: ";
    if (priority == LOG_WARNING)
        return "warning: ";
    if (priority == LOG_DEBUG)
        return "debug: ";
    return "";
}

/* Is stderr the journal (systemd runs ckptfs -f as a service)? Then
 * "<N>" before a line is its syslog priority, and the journal names the
 * sender itself. systemd says so in $JOURNAL_STREAM ("DEVICE:INODE" of
 * the stream it gave us, sd-daemon(3)); a stderr redirected since is
 * another file and does not match. */
static int fslog_journal;
static pthread_once_t fslog_journal_once = PTHREAD_ONCE_INIT;

static void fslog_detect_journal(void)
{
    const char *env = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    fslog_journal = env && sscanf(env, "%llu:%llu", &dev, &ino) == 2 &&
                    fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
                    (unsigned long long)st.st_ino == ino;
}

static void fslog_to_stderr(int priority, const char *msg)
{
    pthread_once(&fslog_journal_once, fslog_detect_journal);
    /* One call so lines from concurrent threads never interleave. */
    if (fslog_journal)
        fprintf(stderr, "<%d>%s\n", priority, msg);
    else
        fprintf(stderr, "ckptfs: %s%s\n", fslog_tag(priority), msg);
}

static int fslog_open_file(const char *path);

/* PATH -> PATH.1 -> ... -> PATH.(keep-1), the oldest dropped, and a new
 * PATH dup3()ed onto the descriptor (see fslog_fd). One thread at a time;
 * those that find it done since they asked do nothing. */
static void fslog_rotate(void)
{
    pthread_mutex_lock(&fslog_rotate_lock);
    if (__atomic_load_n(&fslog_written, __ATOMIC_RELAXED) < fslog_rotate_max) {
        pthread_mutex_unlock(&fslog_rotate_lock);
        return;
    }
    char from[PATH_MAX + 16], to[PATH_MAX + 16];
    for (int k = fslog_rotate_keep - 1; k >= 1; k--) {
        if (k == 1)
            snprintf(from, sizeof from, "%s", fslog_path);
        else
            snprintf(from, sizeof from, "%s.%d", fslog_path, k - 1);
        snprintf(to, sizeof to, "%s.%d", fslog_path, k);
        rename(from, to);
    }
    int fd = fslog_open_file(fslog_path);
    if (fd >= 0) {
        dup3(fd, fslog_fd, O_CLOEXEC);
        close(fd);
    }
    /* Even when that failed: try again only after as much again. */
    __atomic_store_n(&fslog_written, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&fslog_rotate_lock);
}

/* A file has no syslog to stamp its lines: time (local, with offset, to
 * the millisecond), pid, level. One write(2) per line on an O_APPEND file
 * keeps concurrent lines whole. */
static void fslog_to_file(int priority, const char *msg)
{
    struct timespec ts;
    struct tm tm;
    char when[40] = "", zone[8] = "";
    clock_gettime(CLOCK_REALTIME, &ts);
    if (localtime_r(&ts.tv_sec, &tm)) {
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        strftime(zone, sizeof zone, "%z", &tm);
    }
    char line[2300];
    int n = snprintf(line, sizeof line, "%s.%03ld%s ckptfs[%ld]: %s%s\n", when,
                     ts.tv_nsec / 1000000, zone, (long)getpid(), fslog_tag(priority), msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line) {
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    ssize_t w = write(__atomic_load_n(&fslog_fd, __ATOMIC_ACQUIRE), line, (size_t)n);
    /* Nowhere left to report a failed log write. */
    if (w > 0 && __atomic_load_n(&fslog_rotate_max, __ATOMIC_RELAXED) &&
        __atomic_add_fetch(&fslog_written, (uint64_t)w, __ATOMIC_RELAXED) >=
            __atomic_load_n(&fslog_rotate_max, __ATOMIC_RELAXED))
        fslog_rotate();
}

void fslog_vat(int priority, const char *fmt, va_list ap)
{
    if (!fslog_enabled(priority))
        return;
    char msg[2048];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 4);
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    int dest = __atomic_load_n(&fslog_dest, __ATOMIC_ACQUIRE);
    switch (dest) {
    case FSLOG_SYSLOG:
        syslog(priority, "%s", msg);
        break;
    case FSLOG_FILE:
        fslog_to_file(priority, msg);
        break;
    default:
        fslog_to_stderr(priority, msg);
        break;
    }
    if (dest != FSLOG_STDERR && priority <= LOG_WARNING &&
        __atomic_load_n(&fslog_tee, __ATOMIC_RELAXED))
        fslog_to_stderr(priority, msg);
}

void fslog_at(int priority, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fslog_vat(priority, fmt, ap);
    va_end(ap);
}

void fslog_use_syslog(void)
{
    /* LOG_NDELAY: connect now, in the daemon, not at the first message. */
    openlog("ckptfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
    __atomic_store_n(&fslog_dest, FSLOG_SYSLOG, __ATOMIC_RELEASE);
}

static int fslog_open_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
    return fd < 0 ? -errno : fd;
}

int fslog_use_file(const char *path)
{
    if (path[0] != '/')
        return -EINVAL;
    if (strlen(path) >= sizeof fslog_path)
        return -ENAMETOOLONG;
    int fd = fslog_open_file(path);
    if (fd < 0)
        return fd;
    if (__atomic_load_n(&fslog_dest, __ATOMIC_ACQUIRE) == FSLOG_SYSLOG)
        closelog();
    if (fslog_fd >= 0)
        close(fslog_fd);
    snprintf(fslog_path, sizeof fslog_path, "%s", path);
    __atomic_store_n(&fslog_fd, fd, __ATOMIC_RELEASE);
    __atomic_store_n(&fslog_dest, FSLOG_FILE, __ATOMIC_RELEASE);
    return 0;
}

int fslog_use_rotated_file(const char *path, uint64_t max_bytes, int keep)
{
    int rc = fslog_use_file(path);
    if (rc)
        return rc;
    struct stat st;
    uint64_t size = fstat(fslog_fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    fslog_rotate_keep = keep < 1 ? 1 : keep;
    __atomic_store_n(&fslog_written, size, __ATOMIC_RELAXED);
    __atomic_store_n(&fslog_rotate_max, max_bytes, __ATOMIC_RELAXED);
    if (size >= max_bytes)
        fslog_rotate();
    return 0;
}

int fslog_syslog_available(void)
{
    struct stat st;
    return stat("/dev/log", &st) == 0 && S_ISSOCK(st.st_mode);
}

/* The file at the path now: the one logrotate created, or a new one. If
 * it cannot be opened, lines keep going to the old file, which says why. */
static void fslog_reopen(void)
{
    if (__atomic_load_n(&fslog_dest, __ATOMIC_ACQUIRE) != FSLOG_FILE) {
        fslog_info("SIGHUP: logging to %s, nothing to reopen", fslog_destination());
        return;
    }
    int fd = fslog_open_file(fslog_path);
    if (fd < 0) {
        fslog_err("SIGHUP: cannot reopen log file %s: %s; still logging here", fslog_path,
                  strerror(-fd));
        return;
    }
    fslog_info("SIGHUP: reopening log file %s", fslog_path);
    __atomic_store_n(&fslog_written, 0, __ATOMIC_RELAXED);
    if (dup3(fd, fslog_fd, O_CLOEXEC) < 0)
        fslog_err("SIGHUP: cannot switch to the new log file %s: %s", fslog_path, strerror(errno));
    else
        fslog_info("log file reopened (SIGHUP)");
    close(fd);
}

void fslog_request_reopen(void)
{
    int fd = __atomic_load_n(&fslog_pipe_w, __ATOMIC_RELAXED);
    if (fd < 0)
        return;
    int saved = errno;
    /* Non-blocking: a pipe full of requests already asks for a reopen. */
    ssize_t w = write(fd, "h", 1);
    (void)w;
    errno = saved;
}

static void *fslog_reopener_main(void *arg)
{
    (void)arg;
    char buf[64];
    for (;;) {
        ssize_t n = read(fslog_pipe_r, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || memchr(buf, 'q', (size_t)n))
            break;
        /* Several signals in a row: one reopen. */
        fslog_reopen();
    }
    return NULL;
}

int fslog_start_reopener(void)
{
    int p[2];
    if (fslog_reopener_running)
        return 0;
    if (pipe2(p, O_CLOEXEC) != 0)
        return -errno;
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    fslog_pipe_r = p[0];
    int rc = pthread_create(&fslog_reopener, NULL, fslog_reopener_main, NULL);
    if (rc) {
        close(p[0]);
        close(p[1]);
        fslog_pipe_r = -1;
        return -rc;
    }
    fslog_reopener_running = 1;
    __atomic_store_n(&fslog_pipe_w, p[1], __ATOMIC_RELEASE);
    return 0;
}

void fslog_close(void)
{
    if (fslog_reopener_running) {
        int w = __atomic_exchange_n(&fslog_pipe_w, -1, __ATOMIC_ACQ_REL);
        /* Blocking now: the quit byte must get through even if the pipe is
         * full of requests. */
        fcntl(w, F_SETFL, 0);
        ssize_t n = write(w, "q", 1);
        (void)n;
        pthread_join(fslog_reopener, NULL);
        close(w);
        close(fslog_pipe_r);
        fslog_pipe_r = -1;
        fslog_reopener_running = 0;
    }
    int dest = __atomic_exchange_n(&fslog_dest, FSLOG_STDERR, __ATOMIC_ACQ_REL);
    if (dest == FSLOG_SYSLOG)
        closelog();
    if (fslog_fd >= 0)
        close(fslog_fd);
    fslog_fd = -1;
    __atomic_store_n(&fslog_rotate_max, 0, __ATOMIC_RELAXED);
}
