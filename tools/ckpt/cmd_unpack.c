/* `ckpt unpack`: recreate every packed file under a directory.
 *
 * Paths come from the pack, which may be hostile. The library already refuses
 * unsafe paths, but this is the code that writes to the disk, so it checks
 * again and creates everything relative to directory descriptors opened with
 * O_NOFOLLOW: a symlink planted in DIR cannot redirect a write outside it. */
#include "cli.h"
#define CKPT_INTERNAL_API /* ckpt_pwrite_full, ckpt_default_threads */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char unpack_help[] =
    "usage: ckpt unpack PACK -o DIR [options]\n"
    "\n"
    "Recreates every file of PACK under DIR (created if needed), byte for byte,\n"
    "with its permissions (less set-id bits) and modification time. Existing\n"
    "files are left alone and the command fails before writing anything,\n"
    "unless --force is given. Interrupted, it removes the files it was writing.\n"
    "\n"
    "options:\n"
    "  -o, --output DIR          where to put the files (required)\n"
    "  --key-file FILE           key of an encrypted pack\n"
    "  --passphrase-file FILE    passphrase of an encrypted pack\n"
    "  --threads N               decoding threads (default: all cores)\n"
    "  -f, --force               replace existing files\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

struct unpack_opts {
    const char *pack, *dir;
    cli_keyopts keys;
    unsigned threads;
    int force;
};

static int unpack_opt(void *ud, int c, const char *arg)
{
    struct unpack_opts *o = ud;
    if (c == 'o')
        o->dir = arg;
    else if (c == 'f')
        o->force = 1;
    return 0;
}

static int parse_unpack_opts(int argc, char **argv, struct unpack_opts *o)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        CLI_KEY_OPTIONS,
        {"threads", required_argument, NULL, OPT_THREADS},
        {"force", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const cli_args a = {
        .cmd = "unpack",
        .help = unpack_help,
        .optstring = CLI_OPTSTRING_PREFIX "o:fh",
        .longopts = opts,
        .pos = {&o->pack},
        .pos0_name = "PACK",
        .keys = &o->keys,
        .threads = &o->threads,
        .own = unpack_opt,
        .ud = o,
    };
    int rc = cli_parse_args(argc, argv, &a);
    if (rc)
        return rc;
    if (!o->dir)
        return cli_usage_error("unpack", "missing -o DIR");
    if (!o->dir[0])
        return cli_usage_error("unpack", "-o names no directory (it is empty)");
    return cli_keyopts_check("unpack", &o->keys);
}

/* Stricter than it needs to be on purpose: any path that could climb out of
 * DIR or alias another entry is refused outright. */
static int path_ok(const char *path)
{
    if (!ckpt_path_is_safe(path) || path[0] == '/' || path[0] == '\0')
        return 0;
    for (const char *p = path; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!end)
            break;
        p = end + 1;
        if (!*p)
            return 0;
    }
    return 1;
}

static int mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0777) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* Walks to the parent directory of path under root, creating directories as
 * needed and never following a symlink. Returns a descriptor or -errno, and
 * points *leaf at the last component. */
static int open_parent(int root, const char *path, const char **leaf)
{
    char comp[256];
    int fd = dup(root);
    if (fd < 0)
        return -errno;
    const char *p = path;
    for (const char *slash; (slash = strchr(p, '/')); p = slash + 1) {
        size_t n = (size_t)(slash - p);
        if (n >= sizeof comp) {
            close(fd);
            return -ENAMETOOLONG;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        if (mkdirat(fd, comp, 0777) < 0 && errno != EEXIST) {
            int e = errno;
            close(fd);
            return -e;
        }
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(fd);
        if (next < 0)
            return e == ELOOP ? -ENOTDIR : -e;
        fd = next;
    }
    *leaf = p;
    return fd;
}

/* One file being unpacked: its descriptor, its mapping when it has one,
 * and the first thing that went wrong with it (the chunk fault at the
 * lowest offset, or a write error). */
struct out_file {
    int dirfd, fd;
    const char *leaf;
    uint8_t *map; /* NULL: written with pwrite */
    size_t map_len;
    uint64_t bad_off; /* UINT64_MAX: no fault yet */
    int write_errno;
    ckpt_err chunk_err;
};

/* Files are unpacked in batches, each decoded by all workers at once, so
 * many small files keep every core busy and the descriptors held stay few. */
#define BATCH_FILES 64

struct batch {
    struct out_file f[BATCH_FILES];
    size_t first;
    uint32_t chunk_size; /* files of more than one chunk are mapped... */
    int map;             /* ...when this is set (see map_out) */
    size_t page_size;
    progress *pg;
    pthread_mutex_t mu; /* the faults; writes need no lock */
};

/* An interruption stops the workers at their next chunk; the files being
 * written are then removed like failed ones, and the files already
 * finished stay. A second signal does not wait for the workers: it removes
 * the batch's files still open (unlinkat and _exit are async-signal-safe;
 * a file's fd is published last when opened and first when closed, with
 * atomics, since the handler may run on any thread). */
static volatile sig_atomic_t interrupted;
static struct batch *volatile current; /* the batch from its opens to its closes */
static volatile sig_atomic_t current_n;
static size_t removed_on_interrupt; /* by the main thread, once stopped */

static void on_signal(int sig)
{
    if (interrupted) {
        struct batch *b = current;
        for (sig_atomic_t i = 0; b && i < current_n; i++)
            if (__atomic_load_n(&b->f[i].fd, __ATOMIC_ACQUIRE) >= 0)
                unlinkat(b->f[i].dirfd, b->f[i].leaf, 0);
        _exit(128 + sig);
    }
    interrupted = sig;
}

/* Where a chunk of a mapped file is decoded: in its place in the file.
 * Writes into one file with pwrite take the file's lock (i_rwsem, on tmpfs
 * and ext4 alike) for the whole copy, and unpack's workers all write the
 * same file at once (they take chunks in order): with 2 workers on 2 cores
 * a tenth of the CPU time went to spinning on that lock, and on 16 cores the
 * copy into one file bounded the whole unpack (flat from 4 threads, 4.5x the
 * CPU per byte). Page faults on a shared mapping take no such lock.
 *
 * The chunk's pages are populated first, in one call rather than a fault
 * per page (the faults took a quarter of the CPU time), and so that a page
 * that cannot be had (a full disk or tmpfs) is an error here, and the chunk
 * goes the pwrite way, which reports it, rather than a SIGBUS when the
 * decoder touches it. fallocate would do that too, but under the lock. */
#define POPULATE_STEP (64u << 10)

static void *dest(void *ud, size_t file_index, uint64_t off, size_t len)
{
    struct batch *b = ud;
    struct out_file *f = &b->f[file_index - b->first];
    if (!f->map || interrupted)
        return NULL;
    /* Extents start anywhere; madvise wants a page boundary. In steps,
     * because each call holds the process's mmap_lock: a worker starting up
     * (its stack, its malloc arena) waits for every call in flight, and the
     * calls after it for it; with 1 MiB calls, 16 workers switched 6 times
     * as often as with pwrite. */
    for (uint64_t at = off - off % b->page_size; at < off + len; at += POPULATE_STEP) {
        size_t n = off + len - at < POPULATE_STEP ? (size_t)(off + len - at) : POPULATE_STEP;
        if (madvise(f->map + at, n, MADV_POPULATE_WRITE) < 0)
            return NULL;
    }
    return f->map + off;
}

/* On the worker that decoded the chunk: its bytes go straight to their place
 * in the file (or are there already), so writing spreads over the workers
 * with the decoding. A fault only marks its file; the other files go on. */
static int sink(void *ud, size_t file_index, uint64_t off, const void *data, size_t len,
                const ckpt_err *cerr)
{
    struct batch *b = ud;
    if (interrupted)
        return -EINTR;
    struct out_file *f = &b->f[file_index - b->first];
    int in_place = f->map && data == f->map + off;
    ssize_t n = data && !in_place ? ckpt_pwrite_full(f->fd, data, len, off) : (ssize_t)len;
    if (data && n >= 0) {
        progress_add(b->pg, (uint64_t)n);
        return 0;
    }
    pthread_mutex_lock(&b->mu);
    if (off < f->bad_off) {
        f->bad_off = off;
        f->write_errno = data ? (int)-n : 0;
        if (!data)
            f->chunk_err = *cerr;
    }
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* With three workers or more running at once, a file of more than one
 * chunk is written through a shared mapping (see dest()), at its full size
 * from the start. The copy of pwrite is about a third of a chunk's work
 * (perf, 2 workers), so from three writers the file's lock bounds the whole
 * unpack: on 16 cores it went 3.5x faster than one worker and no faster
 * with more. Below that pwrite stays, being cheaper where it is not
 * waited for: populating pages costs more than copying into them. With 16
 * workers on 2 cores (a 2-core VM, gpt2-medium 4 shards, encrypted), the
 * mapping took 12-27% more CPU per byte into tmpfs and 44% more into ext4.
 * Where the file system cannot map the file, or the kernel populate it
 * (MADV_POPULATE_WRITE, Linux 5.14), it is written with pwrite. */
#define MAP_MIN_WORKERS 3

static void map_out(struct out_file *f, uint64_t size, uint32_t chunk_size)
{
    if (size <= chunk_size || size > SIZE_MAX || ftruncate(f->fd, (off_t)size) < 0)
        return;
    void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED)
        return;
    f->map = m;
    f->map_len = (size_t)size;
}

/* Creates file i's entry; -1 (and a message) when it cannot. */
static int open_out(ckpt_pack *p, size_t i, int root, const struct unpack_opts *o, progress *pg,
                    uint32_t chunk_size, int map, struct out_file *f)
{
    const ckpt_file_info *fi = ckpt_file_at(p, i);
    *f = (struct out_file){.dirfd = -1, .fd = -1, .leaf = fi->path, .bad_off = UINT64_MAX};
    int dirfd = open_parent(root, fi->path, &f->leaf);
    if (dirfd < 0) {
        progress_clear(pg);
        cli_fail("%s/%s: cannot create its directory: %s", o->dir, fi->path, strerror(-dirfd));
        return -1;
    }
    /* --force replaces by unlinking first: that works for read-only files
     * and replaces a symlink rather than writing through it. */
    if (o->force && unlinkat(dirfd, f->leaf, 0) < 0 && errno != ENOENT) {
        int e = errno;
        close(dirfd);
        progress_clear(pg);
        cli_fail("%s/%s: cannot replace it: %s", o->dir, fi->path, strerror(e));
        return -1;
    }
    /* Read as well as write: a shared mapping needs both (see map_out). */
    int fd = openat(dirfd, f->leaf, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        close(dirfd);
        progress_clear(pg);
        if (e == EEXIST)
            cli_fail("%s/%s: already exists (use --force to replace it)", o->dir, fi->path);
        else
            cli_fail("%s/%s: %s", o->dir, fi->path, strerror(e));
        return -1;
    }
    f->dirfd = dirfd;
    __atomic_store_n(&f->fd, fd, __ATOMIC_RELEASE);
    if (map)
        map_out(f, fi->size, chunk_size);
    return 0;
}

/* Sets mode and mtime and closes; a file that failed is removed. Returns -1
 * (with a message) when it failed. */
static int close_out(ckpt_pack *p, size_t i, const struct unpack_opts *o, progress *pg,
                     struct out_file *f, const char *batch_err)
{
    const ckpt_file_info *fi = ckpt_file_at(p, i);
    const char *failed = NULL;
    char why[600];
    /* Before the mtime is set: a write through the mapping may set it. */
    if (f->map)
        munmap(f->map, f->map_len);
    f->map = NULL;
    if (batch_err) {
        failed = batch_err;
    } else if (f->bad_off != UINT64_MAX && !f->write_errno) {
        failed = f->chunk_err.msg[0] ? f->chunk_err.msg : "corrupt chunk";
    } else if (f->bad_off != UINT64_MAX) {
        snprintf(why, sizeof why, "%s/%s: write failed: %s", o->dir, fi->path,
                 strerror(f->write_errno));
        failed = why;
    } else {
        /* Permissions last, so a read-only file could still be written;
         * the mtime after the final write, which would otherwise bump it.
         * Set-id and sticky bits are dropped: a pack is data, and one from
         * elsewhere must not plant a setuid program when unpacked by root. */
        struct timespec ts[2] = {
            {.tv_nsec = UTIME_NOW},
            {.tv_sec = (time_t)fi->mtime_sec, .tv_nsec = (long)fi->mtime_nsec},
        };
        if (fchmod(f->fd, (mode_t)(fi->mode & 0777)) < 0 || futimens(f->fd, ts) < 0) {
            snprintf(why, sizeof why, "%s/%s: cannot set mode or mtime: %s", o->dir, fi->path,
                     strerror(errno));
            failed = why;
        }
    }
    int fd = f->fd;
    __atomic_store_n(&f->fd, -1, __ATOMIC_RELEASE); /* the handler's no more */
    if (close(fd) < 0 && !failed) {
        snprintf(why, sizeof why, "%s/%s: write failed: %s", o->dir, fi->path, strerror(errno));
        failed = why;
    }
    if (failed)
        /* A half-written file looks like a good one to the next reader. */
        unlinkat(f->dirfd, f->leaf, 0);
    close(f->dirfd);
    if (!failed)
        return 0;
    if (!*failed) {
        removed_on_interrupt++;
        return -1;
    }
    progress_clear(pg);
    cli_fail("%s", failed);
    return -1;
}

/* What a batch's decode failure does to its files: an interruption removes
 * them without a message each (the command gives one). */
static const char *batch_failure(int rc, const ckpt_err *err)
{
    if (rc == -EINTR && interrupted)
        return "";
    return rc < 0 ? err->msg : NULL;
}

/* Files [first, end): created, decoded by all workers at once, finished in
 * order. Returns how many failed. */
static size_t unpack_batch(ckpt_pack *p, size_t first, size_t end, int root,
                           const struct unpack_opts *o, struct batch *b)
{
    size_t failed = 0;
    b->first = first;
    for (size_t i = first; i < end; i++)
        b->f[i - first].fd = -1;
    current_n = (sig_atomic_t)(end - first);
    current = b;
    for (size_t i = first; i < end; i++)
        if (open_out(p, i, root, o, b->pg, b->chunk_size, b->map, &b->f[i - first]) < 0)
            failed++;
    /* A file that could not be created takes no chunks: the whole batch is
     * decoded only when all of it is open (rare failures cost a rerun of
     * the rest one by one). */
    ckpt_err err = {0};
    if (failed) {
        for (size_t i = first; i < end; i++) {
            struct out_file *f = &b->f[i - first];
            if (f->fd < 0)
                continue;
            int rc = ckpt_files_decode(p, i, i + 1, o->threads, dest, sink, b, &err);
            failed += close_out(p, i, o, b->pg, f, batch_failure(rc, &err)) < 0;
        }
        current = NULL;
        return failed;
    }
    int rc = ckpt_files_decode(p, first, end, o->threads, dest, sink, b, &err);
    for (size_t i = first; i < end; i++)
        failed += close_out(p, i, o, b->pg, &b->f[i - first], batch_failure(rc, &err)) < 0;
    current = NULL;
    return failed;
}

/* Without --force, nothing is written when anything is in the way: a
 * half-unpacked directory is harder to clean up than an error up front. */
static int check_paths(ckpt_pack *p, int root, const struct unpack_opts *o)
{
    for (size_t i = 0; i < ckpt_file_count(p); i++) {
        const char *path = ckpt_file_at(p, i)->path;
        struct stat st;
        if (!path_ok(path))
            return cli_fail("%s: refusing unsafe path '%s'", o->pack, path);
        if (!o->force && fstatat(root, path, &st, AT_SYMLINK_NOFOLLOW) == 0)
            return cli_fail("%s/%s: already exists (use --force to replace it)", o->dir, path);
    }
    return EXIT_OK;
}

int cmd_unpack(int argc, char **argv)
{
    struct unpack_opts o = {0};
    int rc = parse_unpack_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    /* Either way forced: the mapping is tested on 2-core machines, and
     * measured against pwrite where the gate's guess may be wrong. */
    const char *force_map = getenv("CKPT_UNPACK_MAP");
    if (force_map && strcmp(force_map, "0") != 0 && strcmp(force_map, "1") != 0)
        return cli_usage_error("unpack", "CKPT_UNPACK_MAP='%s': want 0 (pwrite) or 1 (a mapping)",
                               force_map);

    ckpt_pack *p;
    ckpt_key *key;
    if (cli_open_pack(o.pack, &o.keys, &p, &key))
        return EXIT_FAIL;
    int mk = mkdir_p(o.dir);
    int root = mk < 0 ? mk : open(o.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        cli_close_pack(p, key);
        return cli_fail("%s: %s", o.dir, strerror(mk < 0 ? -mk : errno));
    }
    rc = check_paths(p, root, &o);
    if (rc) {
        close(root);
        cli_close_pack(p, key);
        return rc;
    }

    ckpt_pack_info info;
    ckpt_info(p, &info);
    progress pg;
    progress_start(&pg, "unpacking", info.logical_bytes);
    double t0 = cli_now();
    size_t n = ckpt_file_count(p), failed = 0;
    /* A damaged file does not stop the others: whatever is intact is still
     * worth having, and every failure is reported. */
    struct batch *b = malloc(sizeof *b);
    if (!b) {
        close(root);
        cli_close_pack(p, key);
        return cli_fail("out of memory");
    }
    b->pg = &pg;
    b->chunk_size = info.chunk_size;
    unsigned cores = ckpt_default_threads(), workers = o.threads ? o.threads : cores;
    b->map = (workers < cores ? workers : cores) >= MAP_MIN_WORKERS;
    if (force_map)
        b->map = force_map[0] == '1';
    b->page_size = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&b->mu, NULL);
    cli_catch_interrupts(on_signal);
    size_t done = 0;
    for (; done < n && !interrupted; done += BATCH_FILES)
        failed +=
            unpack_batch(p, done, done + BATCH_FILES < n ? done + BATCH_FILES : n, root, &o, b);
    int sig = interrupted;
    cli_catch_interrupts(SIG_DFL);
    pthread_mutex_destroy(&b->mu);
    free(b);
    progress_end(&pg);
    double secs = cli_now() - t0;
    close(root);
    cli_close_pack(p, key);

    if (sig && removed_on_interrupt) {
        cli_fail("interrupted; the %zu files being written were removed, those finished "
                 "before were kept",
                 removed_on_interrupt);
        return 128 + sig;
    }
    if (sig && done < n) {
        cli_fail("interrupted between files; those written were kept");
        return 128 + sig;
    }
    if (sig) {
        cli_fail("interrupted once every file was written; they are all kept");
        return 128 + sig;
    }
    if (failed)
        return cli_fail("%s: %zu of %zu files could not be unpacked", o.pack, failed, n);
    char size[16], rate[16];
    printf("unpacked %zu %s (%s) into %s in %.2f s, %s\n", n, n == 1 ? "file" : "files",
           cli_fmt_bytes(info.logical_bytes, size, sizeof size), o.dir, secs,
           cli_fmt_rate(info.logical_bytes, secs, rate, sizeof rate));
    return EXIT_OK;
}
