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
#include <unistd.h>

#include "fuse/mount.h"
#include "common/fslog.h"
#include "fuse/libfuse_log.h"
#include "fuse/options.h"
#include "fuse/signals.h"
#include "fuse/trace.h"
#include "fuse/handles.h"
#include "fuse/handover.h"

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

/* A core dump would hold the key (and decrypted chunks). */
static int forbid_core_dumps(void)
{
    struct rlimit none = {0, 0};
    return setrlimit(RLIMIT_CORE, &none);
}

/* fork() in fuse_daemonize drops memory locks; a key loaded again in the
 * daemon is locked again. If the file is gone by now, the first copy still
 * works, just unlocked. */
static void reload_key_after_fork(const fs_options *o, ckpt_key **key, ckptfs *fs)
{
    ckpt_key *fresh = NULL;
    if (!*key || load_key(o, &fresh, LOG_WARNING) < 0)
        return;
    ckpt_key_free(*key);
    *key = fresh;
    fs->table.key = fresh;
    /* No thread uses it yet: they start after this. */
    fs->wtable.key = fresh;
    fs->wtable.root.key = fresh;
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
 * mount still serves the packs. */
static void setup_writing(ckptfs *fs, const fs_options *o, const char *backing_path,
                          int backing_fd, const ckpt_key *key)
{
    ckpt_err err = {0};
    wtable_opts wo = {
        .commit_delay = o->commit_delay,
        .pack_threads = o->threads,
        .finish_on_stop = o->finish_on_exit,
    };
    if (wtable_init(&fs->wtable, backing_path, backing_fd, key, &wo, &err) != 0) {
        fslog_warn("cannot write checkpoints into this mount (%s); it is read-only", err.msg);
        wtable_destroy(&fs->wtable);
        return;
    }
    fs->wtable.drop_successor = handover_drop_successor;
    fs->wtable.committed = handover_committed;
    fs->wtable.successor_ud = fs;
    fs->writable = 1;
    raise_fd_limit();
    wtable_recover(&fs->wtable);
}

/* libckpt allocates up to three chunk-sized buffers for every chunk it
 * decodes. With glibc's defaults those are mapped and unmapped each time
 * (or trimmed away and faulted back in): page faults on every chunk,
 * measured at about 7% of the daemon's CPU on compressed packs. Keeping
 * them in the heap recycles the memory; what stays reserved is bounded by
 * the decodes that can run at once (request threads plus workers) times
 * three chunks, and a few arenas keep it from multiplying. */
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

static void log_mounted(const ckptfs *fs, const fs_options *o, const char *backing,
                        const char *mnt, int tracing)
{
    char cache[32];
    snprintf(cache, sizeof cache, "%lluM", (unsigned long long)(o->cache_bytes >> 20));
    /* Whether there is a key, never anything about it. */
    fslog_info("mounted %s on %s (%s; %s; cache %s; %u decode workers; %s; pid %ld%s)", backing,
               mnt, fs->writable ? "writable" : "read-only",
               o->key_file ? "key file" : o->passphrase_file ? "passphrase" : "no key", cache,
               o->threads, !fs->writable ? "no packing"
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

int main(int argc, char **argv)
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts cmd;
    fs_options o;
    ckptfs fs;
    ckpt_key *key = NULL;
    struct fuse_session *se = NULL;
    int backing_fd = -1, exit_code = EXIT_USAGE, table_ready = 0, mounted = 0;
    char backing_path[PATH_MAX], mount_path[PATH_MAX];
    sigset_t unblocked;
    memset(&cmd, 0, sizeof cmd);
    memset(&fs, 0, sizeof fs);
    fs.handles.next = fs.handles.prev = &fs.handles;
    pthread_mutex_init(&fs.handles_lock, NULL);
    pthread_sigmask(SIG_SETMASK, NULL, &unblocked);
    libfuse_log_to_fslog();

    if (fs_options_parse(&args, &o) != 0 || fuse_parse_cmdline(&args, &cmd) != 0)
        goto out;
    if (cmd.show_help) {
        print_help(argv[0]);
        exit_code = 0;
        goto out;
    }
    if (cmd.show_version) {
        print_version();
        exit_code = 0;
        goto out;
    }
    if (!o.backing_dir || !cmd.mountpoint) {
        fprintf(stderr, "ckptfs: need BACKING_DIR and MOUNTPOINT (see %s --help)\n", argv[0]);
        goto out;
    }
    if (cmd.debug) {
        if (drop_libfuse_debug(&args) != 0)
            goto out;
        fslog_set_max_priority(LOG_DEBUG);
    }

    exit_code = EXIT_FAILURE;
    /* The log's destination from the start, so that what recovery says
     * is there too; until mounted, errors and warnings are also shown
     * where ckptfs was run (why a mount failed belongs there). */
    if (o.log_file) {
        int rc = fslog_use_file(o.log_file);
        if (rc) {
            fprintf(stderr, "ckptfs: cannot open log_file '%s': %s\n", o.log_file,
                    strerror(-rc));
            goto out;
        }
        fslog_tee_stderr(1);
    } else if (!cmd.foreground) {
        fslog_use_syslog();
        fslog_tee_stderr(1);
    }
    if (!realpath(o.backing_dir, backing_path) ||
        (backing_fd = open(backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "ckptfs: cannot use backing directory '%s': %s\n", o.backing_dir,
                strerror(errno));
        goto out;
    }
    if (load_key(&o, &key, LOG_ERR) < 0)
        goto out;
    if (key && forbid_core_dumps() != 0) {
        fprintf(stderr, "ckptfs: cannot disable core dumps: %s\n", strerror(errno));
        goto out;
    }

    tune_malloc();
    /* Threads may start from here on (recovery seals staged data). */
    signals_block(NULL);
    fs.uid = getuid();
    fs.gid = getgid();
    fs.cache = chunk_cache_new(o.cache_bytes);
    if (!fs.cache || checkpoints_init(&fs.table, backing_path, backing_fd, key, fs.cache) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        goto out;
    }
    table_ready = 1;
    reader_init(&fs.reader, &fs.table, fs.cache, NULL, o.cache_bytes, o.threads);
    if (!o.read_only)
        setup_writing(&fs, &o, backing_path, backing_fd, key);

    /* The mode bits we show are enforced; without staging, read-only in
     * the kernel too. */
    if (fuse_opt_add_arg(&args, fs.writable ? "-odefault_permissions,subtype=ckptfs,fsname=ckptfs"
                                            : "-oro,default_permissions,subtype=ckptfs,fsname=ckptfs") != 0)
        goto out;
    /* Tracing costs nothing unless asked for: another table, other I/O. */
    const struct fuse_lowlevel_ops *ops = cmd.debug ? trace_ops(&ckptfs_ops) : &ckptfs_ops;
    se = fuse_session_new(&args, ops, sizeof *ops, &fs);
    if (!se) {
        exit_code = EXIT_USAGE; /* libfuse said which option it did not know */
        goto out;
    }
    /* Helpers libfuse runs (fusermount3) must not inherit blocked signals. */
    signals_unblock(&unblocked);
    if (signals_install(se) != 0)
        goto out;
    /* Resolved now: once mounted, looking at the path would wait for the
     * FUSE loop that is not running yet. */
    int have_mount_path = realpath(cmd.mountpoint, mount_path) != NULL;
    if (fuse_session_mount(se, cmd.mountpoint) != 0)
        goto out_handlers;
    mounted = 1;
    if (cmd.debug)
        trace_io_install(se);
    if (have_mount_path) {
        fs.mount_path = mount_path;
        fs.readahead_kib = READAHEAD_KIB;
        fs.readahead_pending = 1;
    }
    if (fuse_daemonize(cmd.foreground) != 0)
        goto out_unmount;
    fslog_tee_stderr(0);
    if (!cmd.foreground)
        reload_key_after_fork(&o, &key, &fs);
    /* Threads only now: they would not survive the daemon's fork. Until
     * the loop runs, signals wait: they must reach this thread. */
    signals_block(NULL);
    int rc = fslog_start_reopener();
    if (rc != 0)
        fslog_warn("cannot start the log reopener (%s); SIGHUP will not reopen the log",
                   strerror(-rc));
    fs.pool = worker_pool_new(o.threads, MAX_QUEUED_JOBS);
    if (!fs.pool)
        fslog_warn("cannot start decode workers (%s); decoding on request threads",
                   strerror(errno));
    reader_set_pool(&fs.reader, fs.pool);
    __atomic_store_n(&fs.se, se, __ATOMIC_RELEASE);
    if (fs.writable && wtable_start(&fs.wtable) != 0)
        fslog_err("cannot start the packer (%s); checkpoints written now stay unpacked until "
                  "the next mount", strerror(errno));
    log_mounted(&fs, &o, backing_path, have_mount_path ? mount_path : cmd.mountpoint, cmd.debug);
    signals_unblock(&unblocked);

    int loop_rc = run_loop(se, &cmd);
    exit_code = loop_rc < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
    log_loop_end(loop_rc, have_mount_path ? mount_path : cmd.mountpoint);

out_unmount:
    __atomic_store_n(&fs.se, NULL, __ATOMIC_RELEASE);
    fuse_session_unmount(se);
out_handlers:
    /* From here a second SIGTERM or SIGINT ends the process at once: as
     * safe as a crash, which the next mount recovers from. */
    signals_remove(se);
out:
    /* Packing in progress resumes next time. Stopped before the session
     * goes: the packer tells the kernel about commits through it. */
    if (fs.writable)
        wtable_stop(&fs.wtable);
    if (se)
        fuse_session_destroy(se);
    worker_pool_free(fs.pool);
    if (table_ready)
        reader_destroy(&fs.reader);
    handles_free_all(&fs);
    /* Before the packs: committed checkpoints let go of theirs. */
    if (fs.writable)
        wtable_destroy(&fs.wtable);
    if (table_ready)
        checkpoints_destroy(&fs.table);
    chunk_cache_free(fs.cache);
    if (key)
        ckpt_key_free(key);
    if (backing_fd >= 0)
        close(backing_fd);
    pthread_mutex_destroy(&fs.handles_lock);
    if (mounted)
        fslog_info("stopped");
    free(cmd.mountpoint);
    fs_options_free(&o);
    fuse_opt_free_args(&args);
    fslog_close();
    return exit_code;
}
