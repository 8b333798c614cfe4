/* ckptfs: mount a directory of packed checkpoints, and pack new ones
 * written into it. Parses options, loads the key and recovers checkpoints
 * left by an earlier run before daemonizing (so errors reach the
 * terminal), mounts, runs the FUSE loop and frees everything at unmount.
 *
 * Exit: SIGTERM or SIGINT (or an unmount) ends the loop; the mount goes
 * first, so nothing new arrives, then packing is suspended or, with
 * -o finish_on_exit, finished (wtable_stop). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include "ckpt_internal.h"
#include "common/backing_store.h"
#include "common/fslog.h"
#include "common/mount_key.h"
#include "common/mountinfo.h"
#include "fuse/frontend.h"

#define EXIT_USAGE 2
/* Prefetch and read-ahead jobs waiting for a decode worker. */
#define MAX_QUEUED_JOBS 4096
/* The largest request FUSE sends (256 pages): one 1 MiB chunk per read. */
#define READAHEAD_KIB 1024

static int load_key(const fs_options *o, ckpt_key **key, int priority)
{
    ckpt_err err = {0};
    int rc = 0;
    *key = NULL;
    if (o->key_file)
        rc = ckpt_key_load_file(o->key_file, key, &err);
    else if (o->passphrase_file)
        rc = ckpt_key_load_passphrase_file(o->passphrase_file, key, &err);
    if (rc < 0)
        fslog_at(priority, "cannot load key: %s", err.msg[0] ? err.msg : strerror(-rc));
    return rc;
}

/* fork() in fuse_daemonize drops memory locks: every secret made before it
 * (the key, and the staging keys and pack subkeys that recovery derived)
 * is locked again, and a key loaded again in the daemon is locked anew. If
 * the file is gone by now, the first copy still works. */
static void reload_key_after_fork(const fs_options *o, mount_key *key)
{
    ckpt_key *fresh = NULL;
    if (ckpt_secrets_relock() < 0)
        fslog_warn("cannot lock keys in memory again after going to the background (raise "
                   "ulimit -l): they may be swapped out");
    if (!key->key || load_key(o, &fresh, LOG_WARNING) < 0)
        return;
    /* No thread uses it yet: they start after this. */
    ckpt_key_free(key->key);
    key->key = fresh;
}

/* One descriptor per staged file being written, so many files written at
 * once (one per tensor) need more than the usual soft limit. */
static void raise_fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

/* The staging area for checkpoints written into the mount, and what an
 * earlier run left there. Without it (a read-only backing directory) the
 * mount still serves the packs; but another writable daemon on the same
 * backing directory is an error (-1): its staged data is not ours. */
static int setup_writing(ckptfs *fs, const fs_options *o, const char *backing_path, int backing_fd,
                         ckpt_store *store, const mount_key *key, const char *mount_path)
{
    ckpt_err err = {0};
    wtable_opts wo = {
        .commit_delay = o->commit_delay,
        .pack_threads = o->threads,
        .finish_on_stop = o->finish_on_exit,
        .mount_path = mount_path,
        .store = store,
    };
    int rc = wtable_init(&fs->wtable, backing_path, backing_fd, key, &wo, &err);
    if (rc == -EBUSY) {
        fslog_err("cannot mount: %s", err.msg);
        wtable_destroy(&fs->wtable);
        return -1;
    }
    if (rc != 0) {
        fslog_warn("cannot write checkpoints into this mount (%s); it is read-only", err.msg);
        wtable_destroy(&fs->wtable);
        return 0;
    }
    fs->wtable.drop_successor = handover_drop_successor;
    fs->wtable.pin_successor = handover_pin_successor;
    fs->wtable.unpin_successor = handover_unpin_successor;
    fs->wtable.committed = handover_committed;
    fs->wtable.pack_changed = handover_pack_changed;
    fs->wtable.successor_ud = fs;
    fs->writable = 1;
    raise_fd_limit();
    wtable_recover(&fs->wtable);
    return 0;
}

/* Chunk-sized buffers come and go with every chunk packed and staged
 * (libckpt's decoder keeps its own per thread: chunk_decode_buf). With
 * glibc's defaults those are mapped and unmapped each time (or trimmed
 * away and faulted back in): page faults on every chunk, measured at about
 * 7% of the daemon's CPU on compressed packs when the decoder still
 * allocated its three per chunk. Keeping them in the heap recycles the
 * memory; what stays reserved is bounded by the threads that can work at
 * once times a few chunks, and a few arenas keep it from multiplying. */
static void tune_malloc(void)
{
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_ARENA_MAX, 4);
}

static void print_version(void)
{
    printf("ckptfs %s (pack format %d)\n", CKPT_VERSION_STRING, CKPT_FORMAT_VERSION);
    fflush(stdout); /* before libfuse runs fusermount3 --version */
    fuse_lowlevel_version();
}

static void print_help(const char *prog)
{
    fs_options_usage(prog);
    printf("FUSE options:\n");
    fuse_cmdline_help();
    fuse_lowlevel_help();
}

/* libfuse's -d / -o debug dumps raw requests to stderr; ours (trace.h)
 * replace it, so libfuse is not told. fuse_parse_cmdline has already
 * noted it (cmd.debug, and foreground, which it implies). */
static int drop_libfuse_debug(struct fuse_args *args)
{
    static const struct fuse_opt drop[] = {
        FUSE_OPT_KEY("debug", FUSE_OPT_KEY_DISCARD),
        FUSE_OPT_KEY("-d", FUSE_OPT_KEY_DISCARD),
        FUSE_OPT_END,
    };
    return fuse_opt_parse(args, NULL, drop, NULL);
}

static void log_mounted(const ckptfs *fs, const fs_options *o, const char *backing, const char *mnt,
                        int tracing)
{
    char cache[32];
    snprintf(cache, sizeof cache, "%lluM", (unsigned long long)(o->cache_bytes >> 20));
    /* Whether there is a key, never anything about it. */
    fslog_info("mounted %s on %s (%s; %s; cache %s; %u decode workers; %s; pid %ld%s)", backing,
               mnt, fs->writable ? "writable" : "read-only",
               o->key_file          ? "key file"
               : o->passphrase_file ? "passphrase"
                                    : "no key",
               cache, o->threads,
               !fs->writable       ? "no packing"
               : o->finish_on_exit ? "packing finished at exit"
                                   : "packing suspended at exit",
               (long)getpid(), tracing ? "; tracing requests" : "");
}

/* Why the loop ended, as fuse_session_loop says: a signal's number, 0 for
 * an unmount, or -errno. */
static void log_loop_end(int rc, const char *mnt)
{
    const char *sig = signals_name(rc);
    if (sig)
        fslog_info("%s: unmounting %s", sig, mnt);
    else if (rc < 0)
        fslog_err("the FUSE loop failed: %s; unmounting %s", strerror(-rc), mnt);
    else
        fslog_info("%s was unmounted", mnt);
}

static int run_loop(struct fuse_session *se, const struct fuse_cmdline_opts *cmd)
{
    if (cmd->singlethread)
        return fuse_session_loop(se);
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg)
        return -ENOMEM;
    fuse_loop_cfg_set_clone_fd(cfg, (unsigned)cmd->clone_fd);
    /* UINT_MAX means "not given": keep libfuse's defaults. */
    if (cmd->max_idle_threads != UINT_MAX)
        fuse_loop_cfg_set_idle_threads(cfg, cmd->max_idle_threads);
    if (cmd->max_threads != UINT_MAX)
        fuse_loop_cfg_set_max_threads(cfg, cmd->max_threads);
    int rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return rc;
}

/* Everything one run of the daemon holds, so that each phase of main is
 * a function and the teardown undoes exactly what was set up. */
typedef struct daemon_run {
    struct fuse_args args;
    struct fuse_cmdline_opts cmd;
    fs_options o;
    ckptfs fs;
    mount_key key; /* the key's one owner (mount_key.h) */
    struct fuse_session *se;
    int backing_fd, table_ready, mounted, have_mount_path;
    ckpt_store *store; /* packs in an object store: the table's and
                               * the writer's, freed after both */
    char *stage_dir;   /* with a store: the local staging directory */
    char backing_path[PATH_MAX], mount_path[PATH_MAX];
    sigset_t unblocked;
} daemon_run;

/* libfuse checks its own options only in fuse_session_new, which runs
 * after the backing store is opened, the key read and the writer lock
 * taken: a typo beside a running writer was reported as that writer's
 * lock. A session made and dropped now, on a copy of the arguments (it
 * consumes what it parses), names the typo first; it opens nothing. */
static int check_libfuse_options(const struct fuse_args *args)
{
    struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
    for (int i = 0; i < args->argc; i++) {
        if (fuse_opt_add_arg(&copy, args->argv[i]) != 0) {
            fuse_opt_free_args(&copy);
            return -1;
        }
    }
    static const struct fuse_lowlevel_ops no_ops;
    struct fuse_session *se = fuse_session_new(&copy, &no_ops, sizeof no_ops, NULL);
    fuse_opt_free_args(&copy);
    if (!se)
        return -1;
    fuse_session_destroy(se);
    return 0;
}

/* 0 to go on; 1 when done (help, version); -1 on a usage error. */
static int parse_command_line(daemon_run *d, const char *prog)
{
    if (fs_options_parse(&d->args, &d->o) != 0 || fuse_parse_cmdline(&d->args, &d->cmd) != 0)
        return -1;
    if (d->cmd.show_help) {
        print_help(prog);
        return 1;
    }
    if (d->cmd.show_version) {
        print_version();
        return 1;
    }
    if (!d->o.backing_dir || !d->cmd.mountpoint) {
        fprintf(stderr, "ckptfs: need BACKING_DIR and MOUNTPOINT (see %s --help)\n", prog);
        return -1;
    }
    if (d->cmd.debug) {
        if (drop_libfuse_debug(&d->args) != 0)
            return -1;
        fslog_set_max_priority(LOG_DEBUG);
    }
    if (check_libfuse_options(&d->args) != 0)
        return -1;
    if (backing_is_store_url(d->o.backing_dir)) {
        d->stage_dir = d->o.stage_dir ? strdup(d->o.stage_dir)
                                      : backing_default_stage_dir(d->o.backing_dir, d->o.endpoint);
        if (!d->stage_dir) {
            fprintf(stderr, "ckptfs: no HOME or XDG_CACHE_HOME for the staging directory; "
                            "give -o stage_dir=DIR\n");
            return -1;
        }
    }
    return 0;
}

/* No syslog to log to in the background (no /dev/log: a container, a
 * minimal system): BACKING/.ckptfs/log, rotated at log_max and keeping
 * LOG_KEEP files, so that it is never lost and never grows without bound.
 * If even that cannot be opened, lines are lost; the terminal is told. */
#define LOG_KEEP 3
static void use_backing_log(const daemon_run *d)
{
    char backing[PATH_MAX], *path = NULL;
    int rc = -ENOENT;
    /* With a store, its local directory holds the log (made now: the log
     * comes first). */
    const char *local = d->stage_dir ? d->stage_dir : d->o.backing_dir;
    if (d->stage_dir)
        backing_make_dirs(d->stage_dir);
    /* A backing directory that is not there is not warned about here:
     * open_backing_and_key says so next, and a warning about its log
     * before that only hides the cause. */
    int found = realpath(local, backing) != NULL;
    if (found) {
        char *dir = NULL;
        if (asprintf(&dir, "%s/.ckptfs", backing) >= 0) {
            struct stat st;
            if (mkdir(dir, 0700) != 0 && errno != EEXIST)
                rc = -errno;
            else if (lstat(dir, &st) != 0)
                rc = -errno;
            /* Only a directory of ours: one that whoever can write the
             * backing directory put there (a link to a file of their
             * choosing, their own directory) would take our log lines. */
            else if (!S_ISDIR(st.st_mode))
                rc = -ENOTDIR;
            else if (st.st_uid != geteuid())
                rc = -EPERM;
            else if (asprintf(&path, "%s/log", dir) < 0)
                path = NULL;
            else if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
                rc = -EEXIST;
            else
                rc = fslog_use_rotated_file(path, d->o.log_max, LOG_KEEP);
            free(dir);
        }
    }
    if (rc && found)
        fprintf(stderr,
                "ckptfs: warning: no syslog (/dev/log) and cannot log to %s/.ckptfs/log "
                "(%s): the log is lost; use -o log_file=PATH\n",
                local, strerror(-rc));
    fslog_tee_stderr(1);
    free(path);
}

/* The log's destination from the start, so that what recovery says is
 * there too; until mounted, errors and warnings are also shown where
 * ckptfs was run (why a mount failed belongs there). */
static int open_log(const daemon_run *d)
{
    if (d->o.log_file) {
        int rc = fslog_use_file(d->o.log_file);
        if (rc) {
            fprintf(stderr, "ckptfs: cannot open log_file '%s': %s\n", d->o.log_file,
                    strerror(-rc));
            return -1;
        }
        fslog_tee_stderr(1);
    } else if (!d->cmd.foreground && fslog_syslog_available()) {
        fslog_use_syslog();
        fslog_tee_stderr(1);
    } else if (!d->cmd.foreground) {
        use_backing_log(d);
    }
    return 0;
}

static void cache_warn(void *ud, const char *msg)
{
    (void)ud;
    fslog_warn("%s", msg);
}

/* The store named by the URL, proven by one listing (bad credentials, a
 * missing bucket and an unreachable endpoint fail here, before the
 * daemon goes to the background), and the local staging directory when
 * writable. */
static int open_store(daemon_run *d)
{
    ckpt_err err = {0};
    ckpt_store_opts so = {
        .endpoint = d->o.endpoint,
        .region = d->o.region,
        .profile = d->o.profile,
        .cache_dir = d->o.cache_dir,
        .cache_bytes = d->o.cache_dir_bytes,
        .cache_warn = cache_warn,
    };
    /* Before the credentials are read: a core dump would hold them. */
    int rc = ckpt_forbid_core_dumps();
    if (rc < 0) {
        fprintf(stderr, "ckptfs: cannot disable core dumps: %s\n", strerror(-rc));
        return -1;
    }
    rc = ckpt_store_open(d->o.backing_dir, &so, &d->store, &err);
    if (rc < 0) {
        fprintf(stderr, "ckptfs: cannot mount %s: %s\n", d->o.backing_dir,
                err.msg[0] ? err.msg : strerror(-rc));
        return -1;
    }
    snprintf(d->backing_path, sizeof d->backing_path, "%s", d->o.backing_dir);
    if (d->o.read_only)
        return 0;
    rc = backing_make_dirs(d->stage_dir);
    char real[PATH_MAX];
    if (rc < 0 || !realpath(d->stage_dir, real) ||
        (d->backing_fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "ckptfs: cannot use staging directory '%s': %s\n", d->stage_dir,
                strerror(rc < 0 ? -rc : errno));
        return -1;
    }
    free(d->stage_dir);
    d->stage_dir = strdup(real);
    return d->stage_dir ? 0 : -1;
}

static int open_backing_and_key(daemon_run *d)
{
    if (d->stage_dir) {
        if (open_store(d) != 0)
            return -1;
    } else if (!realpath(d->o.backing_dir, d->backing_path) ||
               (d->backing_fd = open(d->backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "ckptfs: cannot use backing directory '%s': %s\n", d->o.backing_dir,
                strerror(errno));
        return -1;
    }
    /* Before the key is read: a core dump would hold it (and decrypted
     * chunks). */
    int rc = d->o.key_file || d->o.passphrase_file ? ckpt_forbid_core_dumps() : 0;
    if (rc < 0) {
        fprintf(stderr, "ckptfs: cannot disable core dumps: %s\n", strerror(-rc));
        return -1;
    }
    return load_key(&d->o, &d->key.key, LOG_ERR) < 0 ? -1 : 0;
}

/* A second ckptfs mounted over a first would hide it, and its daemon would
 * go on running unseen: refused, before anything is set up. Mounting over
 * another filesystem is left to the user, as with mount(8). */
static int check_mount_point(const daemon_run *d)
{
    char fstype[64];
    int rc = mountinfo_fstype(MOUNTINFO_SELF, d->cmd.mountpoint, fstype, sizeof fstype);
    if (rc == 1 && strcmp(fstype, "fuse.ckptfs") == 0) {
        fprintf(stderr,
                "ckptfs: %s is already a ckptfs mount; unmount it first (fusermount3 -u %s)\n",
                d->cmd.mountpoint, d->cmd.mountpoint);
        return -1;
    }
    return 0;
}

/* The options ckptfs always mounts with. The source that the mount table
 * shows (fsname) is the backing directory or store URL, as /etc/fstab names
 * it: `mount -a` then knows the line is mounted (with any other source it
 * mounts it again, which fails), and findmnt and df say what is mounted.
 * Commas and backslashes in it are escaped for libfuse's option parser. */
static int add_mount_options(struct fuse_args *args, int read_only, const char *source)
{
    const char *fixed = read_only ? "-oro,default_permissions,subtype=ckptfs,fsname="
                                  : "-odefault_permissions,subtype=ckptfs,fsname=";
    size_t n = strlen(source);
    char *opt = malloc(strlen(fixed) + 2 * n + 1);
    if (!opt)
        return -1;
    char *p = stpcpy(opt, fixed);
    for (size_t i = 0; i < n; i++) {
        if (source[i] == ',' || source[i] == '\\')
            *p++ = '\\';
        *p++ = source[i];
    }
    *p = '\0';
    int rc = fuse_opt_add_arg(args, opt);
    free(opt);
    return rc;
}

/* The read side, then the write side (which recovers what an earlier run
 * left), then the FUSE session over both. -2 when libfuse refused an
 * option (it has said which), else -1 on failure. */
static int build_mount(daemon_run *d)
{
    ckptfs *fs = &d->fs;
    tune_malloc();
    /* Threads may start from here on (recovery seals staged data). */
    signals_block(NULL);
    fs->hide_tensors = d->o.hide_tensors;
    fs->uid = getuid();
    fs->gid = getgid();
    fs->cache = chunk_cache_new(d->o.cache_bytes);
    int table_rc = !fs->cache ? -ENOMEM
                   : d->store ? checkpoints_init_store(&fs->table, d->store, d->o.list_interval,
                                                       d->backing_fd, &d->key, fs->cache)
                              : checkpoints_init(&fs->table, d->backing_path, d->backing_fd,
                                                 &d->key, fs->cache);
    if (table_rc != 0 || ns_init(&fs->ns) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return -1;
    }
    d->table_ready = 1;
    reader_init(&fs->reader, &fs->table, fs->cache, NULL, d->o.cache_bytes, d->o.threads);
    if (!d->o.read_only && setup_writing(fs, &d->o, d->store ? d->stage_dir : d->backing_path,
                                         d->backing_fd, d->store, &d->key, d->cmd.mountpoint) != 0)
        return -1;

    /* The mode bits we show are enforced; without staging, read-only in
     * the kernel too. */
    if (add_mount_options(&d->args, !fs->writable, d->backing_path) != 0)
        return -1;
    /* Tracing costs nothing unless asked for: another table, other I/O. */
    const struct fuse_lowlevel_ops *ops = d->cmd.debug ? trace_ops(&ckptfs_ops) : &ckptfs_ops;
    d->se = fuse_session_new(&d->args, ops, sizeof *ops, fs);
    return d->se ? 0 : -2;
}

/* Mounts, then forks into the background unless -f. */
static int mount_and_daemonize(daemon_run *d)
{
    /* Resolved now: once mounted, looking at the path would wait for the
     * FUSE loop that is not running yet. */
    d->have_mount_path = realpath(d->cmd.mountpoint, d->mount_path) != NULL;
    if (fuse_session_mount(d->se, d->cmd.mountpoint) != 0)
        return -1;
    d->mounted = 1;
    if (d->cmd.debug)
        trace_io_install(d->se);
    if (d->have_mount_path) {
        d->fs.mount_path = d->mount_path;
        d->fs.readahead_kib = READAHEAD_KIB;
        d->fs.readahead_pending = 1;
    }
    /* No thread may be running across the fork: it would be copied in the
     * middle of whatever it held. */
    if (!d->cmd.foreground && d->fs.writable)
        wtable_before_fork(&d->fs.wtable);
    if (fuse_daemonize(d->cmd.foreground) != 0)
        return -1;
    fslog_tee_stderr(0);
    if (!d->cmd.foreground) {
        reload_key_after_fork(&d->o, &d->key);
        if (d->fs.writable)
            wtable_note_pid(&d->fs.wtable);
    }
    return 0;
}

/* Threads only now: they would not survive the daemon's fork. Until the
 * loop runs, signals wait: they must reach this thread. */
static void start_threads(daemon_run *d)
{
    ckptfs *fs = &d->fs;
    signals_block(NULL);
    int rc = fslog_start_reopener();
    if (rc != 0)
        fslog_warn("cannot start the log reopener (%s); SIGHUP will not reopen the log",
                   strerror(-rc));
    fs->pool = worker_pool_new(d->o.threads, MAX_QUEUED_JOBS);
    if (!fs->pool)
        fslog_warn("cannot start decode workers (%s); decoding on request threads",
                   strerror(errno));
    reader_set_pool(&fs->reader, fs->pool);
    __atomic_store_n(&fs->se, d->se, __ATOMIC_RELEASE);
    if (fs->writable && wtable_start(&fs->wtable) != 0)
        fslog_err("cannot start the packer (%s); checkpoints written now stay unpacked until "
                  "the next mount",
                  strerror(errno));
}

static const char *shown_mount_path(const daemon_run *d)
{
    return d->have_mount_path ? d->mount_path : d->cmd.mountpoint;
}

static void tear_down(daemon_run *d)
{
    ckptfs *fs = &d->fs;
    /* Packing in progress resumes next time. Stopped before the session
     * goes: the packer tells the kernel about commits through it. */
    if (fs->writable)
        wtable_stop(&fs->wtable);
    if (d->se)
        fuse_session_destroy(d->se);
    worker_pool_free(fs->pool);
    if (d->table_ready)
        reader_destroy(&fs->reader);
    handles_free_all(fs);
    /* Before the packs: committed checkpoints let go of theirs. */
    if (fs->writable)
        wtable_destroy(&fs->wtable);
    if (d->table_ready) {
        checkpoints_destroy(&fs->table);
        ns_destroy(&fs->ns);
    }
    chunk_cache_free(fs->cache);
    if (d->store && d->o.cache_dir) {
        ckpt_store_cache_stats cs;
        ckpt_store_cache_stats_get(d->store, &cs);
        fslog_info("cache_dir %s: %llu hits (%.1f MB), %llu misses (%.1f MB); %.1f MB held",
                   d->o.cache_dir, (unsigned long long)cs.hits, (double)cs.hit_bytes / 1e6,
                   (unsigned long long)cs.misses, (double)cs.miss_bytes / 1e6,
                   (double)cs.stored_bytes / 1e6);
    }
    /* Last of what uses it: the table and the writer borrow it. */
    ckpt_store_free(d->store);
    free(d->stage_dir);
    if (d->key.key)
        ckpt_key_free(d->key.key);
    if (d->backing_fd >= 0)
        close(d->backing_fd);
    pthread_mutex_destroy(&fs->handles_lock);
    if (d->mounted)
        fslog_info("stopped");
    free(d->cmd.mountpoint);
    fs_options_free(&d->o);
    fuse_opt_free_args(&d->args);
    fslog_close();
}

int main(int argc, char **argv)
{
    static daemon_run d; /* large (two PATH_MAX buffers); zeroed */
    d.args = (struct fuse_args)FUSE_ARGS_INIT(argc, argv);
    d.backing_fd = -1;
    d.fs.handles.next = d.fs.handles.prev = &d.fs.handles;
    pthread_mutex_init(&d.fs.handles_lock, NULL);
    pthread_sigmask(SIG_SETMASK, NULL, &d.unblocked);
    libfuse_log_to_fslog();

    int exit_code = EXIT_USAGE;
    int parsed = parse_command_line(&d, argv[0]);
    if (parsed != 0) {
        exit_code = parsed > 0 ? EXIT_SUCCESS : EXIT_USAGE;
        goto out;
    }
    exit_code = EXIT_FAILURE;
    if (open_log(&d) != 0 || check_mount_point(&d) != 0 || open_backing_and_key(&d) != 0)
        goto out;
    int built = build_mount(&d);
    if (built != 0) {
        if (built == -2)
            exit_code = EXIT_USAGE;
        goto out;
    }
    /* Helpers libfuse runs (fusermount3) must not inherit blocked signals. */
    signals_unblock(&d.unblocked);
    if (signals_install(d.se) != 0)
        goto out;
    if (mount_and_daemonize(&d) == 0) {
        start_threads(&d);
        log_mounted(&d.fs, &d.o, d.backing_path, shown_mount_path(&d), d.cmd.debug);
        signals_unblock(&d.unblocked);
        int loop_rc = run_loop(d.se, &d.cmd);
        exit_code = loop_rc < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        log_loop_end(loop_rc, shown_mount_path(&d));
    }
    if (d.mounted) {
        __atomic_store_n(&d.fs.se, NULL, __ATOMIC_RELEASE);
        fuse_session_unmount(d.se);
    }
    /* From here a second SIGTERM or SIGINT ends the process at once: as
     * safe as a crash, which the next mount recovers from. */
    signals_remove(d.se);
out:
    tear_down(&d);
    return exit_code;
}
