/* Writable checkpoints without FUSE (fs/write/wckpt.c and the modules under it):
 * write, commit and read the pack back, plain and sealed; auto-commit;
 * EBUSY while packing; a failed pack and its retry; renames and removal;
 * and recovery after a "crash" (the table dropped without saving), in
 * every state, with a wrong key, and with leftovers on disk. */
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>

#include "common.h"

#include "common/backing_path.h"
#include "common/fslog.h"
#include "write/packer.h"
#include "write/stage.h"
#include "write/stage_crypt.h"
#include "write/stage_blob.h"
#include "write/wckpt_internal.h"
#include "write/wtree.h"

static char *dir;
static int backing;

static void setup(void)
{
    dir = tu_scratch_open(&backing);
}

static void teardown(void)
{
    tu_scratch_close(dir, backing);
}

TestSuite(wckpt, .init = setup, .fini = teardown, .timeout = 60);

static ckpt_key *make_key(uint8_t fill)
{
    uint8_t raw[CKPT_KEY_BYTES];
    memset(raw, fill, sizeof raw);
    ckpt_key *k;
    cr_assert_eq(ckpt_key_from_bytes(raw, &k, NULL), 0);
    return k;
}

static void open_table(wtable *t, const ckpt_key *key, double delay, int start)
{
    wtable_opts o = {.commit_delay = delay, .pack_threads = 2};
    ckpt_err err = {0};
    static mount_key slot; /* one table open at a time */
    slot.key = (ckpt_key *)key;
    cr_assert_eq(wtable_init(t, dir, backing, &slot, &o, &err), 0, "%s", err.msg);
    cr_assert_eq(wtable_recover(t), 0);
    if (start)
        cr_assert_eq(wtable_start(t), 0);
}

static void close_table(wtable *t)
{
    wtable_stop(t);
    wtable_destroy(t);
}

/* What a SIGKILL leaves: no saving, no parking, threads just gone. */
static void crash_table(wtable *t)
{
    pthread_mutex_lock(&t->lock);
    t->stopping = 1;
    pthread_cond_broadcast(&t->wake);
    pthread_cond_broadcast(&t->timer_wake);
    pthread_mutex_unlock(&t->lock);
    if (t->threads_started) {
        pthread_join(t->packer, NULL);
        pthread_join(t->timer, NULL);
    }
    wtable_destroy(t);
}

static uint32_t make_file(wckpt *c, uint32_t parent, const char *name, const void *data, size_t len)
{
    uint32_t node;
    struct stat st;
    int rc = wckpt_create(c, parent, name, 0640, &node, &st);
    cr_assert_eq(rc, 0, "create %s: %s", name, strerror(-rc));
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < 100000 ? len - done : 100000;
        cr_assert_eq(wckpt_write(c, node, (const uint8_t *)data + done, n, done), (ssize_t)n);
        done += n;
    }
    wckpt_release(c, node, O_WRONLY);
    return node;
}

static void wait_state(wckpt *c, wstate want)
{
    for (int i = 0; i < 3000; i++) {
        pthread_mutex_lock(&c->lock);
        wstate s = c->state;
        pthread_mutex_unlock(&c->lock);
        if (s == want)
            return;
        usleep(10000);
    }
    cr_assert_fail("state %s, wanted %s (error: %s)", wstate_name(c->state), wstate_name(want),
                   c->error ? c->error : "none");
}

/* A tiny safetensors file with one BF16 tensor of n elements. */
static uint8_t *safetensors(size_t n, size_t *len)
{
    char head[256];
    int hl =
        snprintf(head, sizeof head,
                 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", n, 2 * n);
    while (hl % 8)
        head[hl++] = ' ';
    *len = 8 + (size_t)hl + 2 * n;
    uint8_t *b = malloc(*len);
    put_u64(b, (uint64_t)hl);
    memcpy(b + 8, head, (size_t)hl);
    tu_fill_pattern(b + 8 + hl, 2 * n, 77);
    return b;
}

static void expect_pack_file(ckpt_pack *p, const char *path, const void *want, size_t len)
{
    long i = ckpt_file_find(p, path);
    cr_assert_geq(i, 0, "%s not in the pack", path);
    cr_assert_eq(ckpt_file_at(p, (size_t)i)->size, len, "%s size", path);
    uint8_t *got = malloc(len + 1);
    ckpt_err err = {0};
    cr_assert_eq(ckpt_file_pread(p, (size_t)i, got, len, 0, &err), (ssize_t)len, "%s", err.msg);
    cr_assert_eq(memcmp(got, want, len), 0, "%s differs", path);
    free(got);
}

static char *pack_path(const char *name)
{
    char file[300];
    snprintf(file, sizeof file, "%s.tpack", name);
    return tu_join(dir, file);
}

static int count_entries(const char *sub)
{
    char *p = tu_join(dir, sub);
    DIR *d = opendir(p);
    free(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void write_commit_read(const ckpt_key *key)
{
    wtable t;
    open_table(&t, key, 0, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "step-100", 0755, &c), 0);
    size_t big_len = 3 * 1024 * 1024 + 17, st_len;
    uint8_t *big = malloc(big_len), *st = safetensors(300000, &st_len);
    tu_fill_pattern(big, big_len, 1);
    uint32_t sub, node;
    struct stat sb;
    cr_assert_eq(wckpt_mkdir(c, WTREE_ROOT, "opt", 0755, &sub, &sb), 0);
    make_file(c, sub, "state.bin", big, big_len);
    make_file(c, WTREE_ROOT, "model.safetensors", st, st_len);
    make_file(c, WTREE_ROOT, "empty", "", 0);
    /* Read-your-writes before commit. */
    cr_assert_eq(wckpt_lookup(c, sub, "state.bin", &node, &sb), 0);
    cr_assert_eq(sb.st_size, (off_t)big_len);
    uint8_t *back = malloc(big_len);
    cr_assert_eq(wckpt_read(c, node, back, big_len, 0), (ssize_t)big_len);
    cr_assert_eq(memcmp(back, big, big_len), 0);
    char v[64];
    cr_assert_gt(wckpt_xattr(c, "user.ckptfs.state", v, sizeof v), 0);
    cr_assert_str_eq(v, "writing");

    cr_assert_eq(wtable_commit(&t, c), 0);
    wait_state(c, WST_COMMITTED);
    cr_assert_eq(wckpt_read(c, node, back, 10, 0), -ESTALE, "reads go to the pack now");
    cr_assert_eq(wckpt_write(c, node, "x", 1, 0), -ESTALE);
    cr_assert_null(wtable_get(&t, "step-100", 0));
    for (int i = 0; i < 500 && count_entries(".ckptfs/stage") != 0; i++)
        usleep(10000); /* removed just after the state changes */
    cr_assert_eq(count_entries(".ckptfs/stage"), 0, "staging removed");

    char *pp = pack_path("step-100");
    ckpt_pack *p;
    ckpt_err err = {0};
    if (key) {
        cr_assert_eq(ckpt_open(pp, NULL, &p, &err), -EACCES, "packed with the key");
    }
    cr_assert_eq(ckpt_open(pp, key, &p, &err), 0, "%s", err.msg);
    expect_pack_file(p, "opt/state.bin", big, big_len);
    expect_pack_file(p, "model.safetensors", st, st_len);
    expect_pack_file(p, "empty", "", 0);
    cr_assert_eq(ckpt_tensor_count(p), 1, "safetensors indexed");
    cr_assert_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "opt/state.bin"))->mode, 0640);
    ckpt_close(p);
    free(pp);
    free(big);
    free(back);
    free(st);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, plain_write_commit_read)
{
    write_commit_read(NULL);
}

Test(wckpt, sealed_write_commit_read)
{
    ckpt_key *k = make_key(4);
    write_commit_read(k);
    ckpt_key_free(k);
}

Test(wckpt, auto_commit_after_quiet)
{
    wtable t;
    open_table(&t, NULL, 0.3, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "auto", 0755, &c), 0);
    usleep(600000);
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->state, WST_WRITING, "an untouched checkpoint is not committed");
    pthread_mutex_unlock(&c->lock);
    uint32_t node;
    struct stat st;
    cr_assert_eq(wckpt_create(c, WTREE_ROOT, "f", 0644, &node, &st), 0);
    cr_assert_eq(wckpt_write(c, node, "abc", 3, 0), 3);
    usleep(600000);
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->state, WST_WRITING, "not while a file is open");
    pthread_mutex_unlock(&c->lock);
    wckpt_release(c, node, O_WRONLY);
    wait_state(c, WST_COMMITTED);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

/* A file open for reading does not hold the idle commit back (an eval
 * process that mapped a checkpoint still being written, torch.load(mmap=
 * True), keeps it open for as long as it lives): it reads on across the
 * commit. One open for writing does (auto_commit_after_quiet). */
Test(wckpt, auto_commit_with_a_reader_open)
{
    wtable t;
    open_table(&t, NULL, 0.3, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "eval", 0755, &c), 0);
    uint32_t node = make_file(c, WTREE_ROOT, "f", "abc", 3);
    cr_assert_eq(wckpt_open(c, node, O_RDONLY), 0);
    wait_state(c, WST_COMMITTED); /* its reads go to the pack (the FUSE layer's) */
    wckpt_release(c, node, O_RDONLY);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, written_while_packing_and_retry_after_failure)
{
    wtable t;
    open_table(&t, NULL, 0, 0); /* no packer yet: stays packing */
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "b", 0755, &c), 0);
    uint32_t node = make_file(c, WTREE_ROOT, "f", "data", 4), n2;
    cr_assert_eq(wtable_commit(&t, c), 0);
    struct stat st;
    cr_assert_eq(wckpt_open(c, node, O_RDONLY), 0, "reads leave it packing");
    wckpt_release(c, node, O_RDONLY);
    cr_assert_eq(c->state, WST_PACKING);
    /* A write stops the packing: writing again, packed once quiet. */
    cr_assert_eq(wckpt_create(c, WTREE_ROOT, "g", 0644, &n2, &st), 0);
    wckpt_release(c, n2, O_WRONLY);
    cr_assert_eq(c->state, WST_WRITING);
    cr_assert_eq(wckpt_unlink(c, WTREE_ROOT, "g"), 0);
    cr_assert_eq(wtable_commit(&t, c), 0);
    cr_assert_eq(wtable_rename(&t, "b", "c", 0), 0, "a rename too");
    cr_assert_eq(c->state, WST_WRITING);
    cr_assert_eq(wtable_rename(&t, "c", "b", 0), 0);
    cr_assert_eq(wtable_commit(&t, c), 0);
    char buf[8];
    cr_assert_eq(wckpt_read(c, node, buf, 8, 0), 4);
    /* A pack of that name appears: packing must fail, not replace it. */
    char *pp = pack_path("b");
    tu_write_str(pp, "someone else's");
    cr_assert_eq(wtable_start(&t), 0);
    wait_state(c, WST_FAILED);
    tu_assert_contains(c->error, "already exists");
    char v[600];
    cr_assert_gt(wckpt_xattr(c, "user.ckptfs.error", v, sizeof v), 0);
    tu_assert_contains(v, "already exists");
    /* Staged data kept; once the obstacle is gone a commit retries. */
    unlink(pp);
    cr_assert_eq(wckpt_read(c, node, buf, 8, 0), 4);
    cr_assert_eq(wtable_commit(&t, c), 0);
    wait_state(c, WST_COMMITTED);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pp, NULL, &p, NULL), 0);
    expect_pack_file(p, "f", "data", 4);
    ckpt_close(p);
    free(pp);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, names_rename_and_rmdir)
{
    wtable t;
    open_table(&t, NULL, 0, 1);
    wckpt *c, *d;
    cr_assert_eq(wtable_mkdir(&t, ".ckptfs", 0755, &c), -EINVAL);
    cr_assert_eq(wtable_mkdir(&t, "a", 0755, &c), 0);
    cr_assert_eq(wtable_mkdir(&t, "a", 0755, &d), -EEXIST);
    char *pp = pack_path("packed");
    tu_write_str(pp, "x");
    cr_assert_eq(wtable_mkdir(&t, "packed", 0755, &d), -EEXIST);
    cr_assert_eq(wtable_rename(&t, "a", "packed", 0), -ENOTEMPTY);
    cr_assert_eq(wtable_rename(&t, "a", "packed", 1), -EEXIST);
    make_file(c, WTREE_ROOT, "f", "1", 1);
    cr_assert_eq(wtable_rename(&t, "a", "b", 0), 0);
    cr_assert_null(wtable_get(&t, "a", 0));
    cr_assert_eq(wtable_get(&t, "b", 0), c);
    cr_assert_eq(wtable_rmdir(&t, "b"), -ENOTEMPTY);
    /* Packs are renamed and removed as files. */
    cr_assert_eq(wtable_rename(&t, "packed", "p2", 0), 0);
    free(pp);
    pp = pack_path("p2");
    cr_assert_eq(access(pp, F_OK), 0);
    cr_assert_eq(wtable_remove_pack(&t, "p2", 0, NULL), 0);
    cr_assert_neq(access(pp, F_OK), 0);
    free(pp);
    wlisted *names;
    size_t n;
    cr_assert_eq(wtable_list(&t, "", &names, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(names[0].name, "b");
    cr_assert_eq(names[0].ino, wckpt_ino(c, WTREE_ROOT));
    cr_assert_eq(names[0].is_file, 0);
    wlisted_free(names, n);
    close_table(&t);
    /* The new name survived. */
    open_table(&t, NULL, 0, 0);
    c = wtable_get(&t, "b", 0);
    cr_assert_not_null(c);
    cr_assert_eq(wckpt_unlink(c, WTREE_ROOT, "f"), 0);
    cr_assert_eq(wtable_rmdir(&t, "b"), 0);
    cr_assert_null(wtable_get(&t, "b", 0));
    cr_assert_eq(count_entries(".ckptfs/stage"), 0);
    close_table(&t);
}

static int backing_has(const char *sub)
{
    char *p = tu_join(dir, sub);
    int found = access(p, F_OK) == 0;
    free(p);
    return found;
}

/* rename(2)'s errnos where a checkpoint or a namespace meets another
 * name: a directory replaces an empty directory, and only that. */
Test(wckpt, rename_over_a_directory)
{
    wtable t;
    open_table(&t, NULL, 0, 1);
    wckpt *c, *busy;
    cr_assert_eq(wtable_mkdir(&t, "a", 0755, &c), 0);
    make_file(c, WTREE_ROOT, "f", "1", 1);
    char *pp = pack_path("packed");
    tu_write_str(pp, "x");
    free(pp);
    cr_assert_eq(wtable_ns_mkdir(&t, "e1", 0700), 0);
    cr_assert_eq(wtable_ns_mkdir(&t, "e2", 0700), 0);
    cr_assert_eq(wtable_ns_mkdir(&t, "full", 0755), 0);
    cr_assert_eq(wtable_ns_mkdir(&t, "full/sub", 0755), 0);
    /* A checkpoint being written below: nothing of it in BACKING/ns yet. */
    cr_assert_eq(wtable_ns_mkdir(&t, "ns", 0755), 0);
    cr_assert_eq(wtable_mkdir(&t, "ns/w", 0755, &busy), 0);

    cr_assert_eq(wtable_rename(&t, "a", "full", 0), -ENOTEMPTY);
    cr_assert_eq(wtable_rename(&t, "a", "ns", 0), -ENOTEMPTY);
    cr_assert_eq(wtable_rename(&t, "a", "e1", 1), -EEXIST);
    cr_assert(backing_has("full/sub") && backing_has("ns") && backing_has("e1"));
    /* Over an empty namespace: it is replaced, written or packed. */
    cr_assert_eq(wtable_rename(&t, "a", "e1", 0), 0);
    cr_assert_eq(wtable_get(&t, "e1", 0), c);
    cr_assert(!backing_has("e1"), "the empty directory is gone");
    cr_assert_eq(wtable_rename(&t, "packed", "e2", 0), 0);
    cr_assert(backing_has("e2.tpack") && !backing_has("e2") && !backing_has("packed.tpack"));
    int rc = wtable_commit(&t, c);
    cr_assert_eq(rc, 0, "commit: %s", strerror(-rc));
    wait_state(c, WST_COMMITTED);
    cr_assert(backing_has("e1.tpack"));

    /* A namespace over a checkpoint: a directory that is not empty, or a
     * file; over a namespace with a checkpoint being written below. */
    cr_assert_eq(wtable_ns_rename(&t, "full", "e2", 0), -ENOTEMPTY);
    cr_assert_eq(wtable_ns_rename(&t, "full", "e2", 1), -EEXIST);
    wckpt *f;
    uint32_t node;
    struct stat st;
    cr_assert_eq(wtable_create_file(&t, "single", 0644, &f, &node, &st), 0);
    wckpt_release(f, node, O_WRONLY);
    cr_assert_eq(wtable_ns_rename(&t, "full", "single", 0), -ENOTDIR);
    cr_assert_eq(wtable_ns_rename(&t, "full", "ns", 0), -ENOTEMPTY);
    cr_assert(backing_has("full/sub") && backing_has("ns"));
    cr_assert_eq(wtable_get(&t, "ns/w", 0), busy);
    wtable_forget(&t, f, 1);
    wtable_forget(&t, busy, 1);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

static void crash_while_writing(const ckpt_key *key)
{
    wtable t;
    open_table(&t, key, 0, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "w", 0755, &c), 0);
    size_t len = 200000;
    uint8_t *a = malloc(len), *b = malloc(len);
    tu_fill_pattern(a, len, 10);
    tu_fill_pattern(b, len, 11);
    uint32_t sub, na, nb;
    struct stat st;
    cr_assert_eq(wckpt_mkdir(c, WTREE_ROOT, "d", 0700, &sub, &st), 0);
    na = make_file(c, sub, "synced", a, len);
    cr_assert_eq(wckpt_fsync(c, na), 0);
    /* Written after the fsync, never synced: may or may not survive. */
    nb = make_file(c, WTREE_ROOT, "unsynced", b, len);
    (void)nb;
    crash_table(&t);

    open_table(&t, key, 0, 1);
    c = wtable_get(&t, "w", 1);
    cr_assert_not_null(c);
    cr_assert_eq(c->state, WST_WRITING);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "d", &sub, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700);
    cr_assert_eq(wckpt_lookup(c, sub, "synced", &na, &st), 0);
    cr_assert_eq(st.st_size, (off_t)len);
    uint8_t *back = malloc(len);
    cr_assert_eq(wckpt_read(c, na, back, len, 0), (ssize_t)len);
    cr_assert_eq(memcmp(back, a, len), 0, "every fsynced byte intact");
    /* And it carries on: commit and read from the pack. */
    int rc = wtable_commit(&t, c);
    cr_assert_eq(rc, 0, "commit: %s (%s)", strerror(-rc), c->error ? c->error : "");
    wait_state(c, WST_COMMITTED);
    char *pp = pack_path("w");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pp, key, &p, NULL), 0);
    expect_pack_file(p, "d/synced", a, len);
    ckpt_close(p);
    free(pp);
    free(a);
    free(b);
    free(back);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, plain_crash_while_writing)
{
    crash_while_writing(NULL);
}

Test(wckpt, sealed_crash_while_writing)
{
    ckpt_key *k = make_key(5);
    crash_while_writing(k);
    ckpt_key_free(k);
}

Test(wckpt, crash_while_packing_resumes)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "p", 0755, &c), 0);
    make_file(c, WTREE_ROOT, "x", "hello", 5);
    cr_assert_eq(wtable_commit(&t, c), 0);
    /* The packer died half way: a temporary pack is left over. */
    char *tmp = tu_join(dir, ".p.tpack.tmp");
    tu_write_str(tmp, "half a pack");
    crash_table(&t);
    open_table(&t, NULL, 0, 0);
    cr_assert_neq(access(tmp, F_OK), 0, "leftover .tmp removed");
    c = wtable_get(&t, "p", 1);
    cr_assert_not_null(c);
    cr_assert_eq(c->state, WST_PACKING);
    cr_assert_eq(wtable_start(&t), 0);
    wait_state(c, WST_COMMITTED);
    char *pp = pack_path("p");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pp, NULL, &p, NULL), 0);
    expect_pack_file(p, "x", "hello", 5);
    ckpt_close(p);
    free(pp);
    free(tmp);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, crash_after_rename_completes_commit)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "r", 0755, &c), 0);
    make_file(c, WTREE_ROOT, "x", "bytes", 5);
    cr_assert_eq(wtable_commit(&t, c), 0);
    /* Pack renamed into place, then the crash, before staging was removed. */
    packer_file f = {.path = strdup("x"), .blob = wc_file_of(c, 1)->blob, .size = 5, .mode = 0644};
    packer_job job = {.backing_fd = backing,
                      .backing_path = dir,
                      .store = t.store,
                      .name = "r",
                      .files = &f,
                      .n_files = 1};
    ckpt_err err = {0};
    cr_assert_eq(packer_run(&job, &err), 0, "%s", err.msg);
    free(f.path);
    crash_table(&t);
    cr_assert_eq(count_entries(".ckptfs/stage"), 1);
    open_table(&t, NULL, 0, 0);
    cr_assert_null(wtable_get(&t, "r", 0), "committed: the pack is what shows");
    cr_assert_eq(count_entries(".ckptfs/stage"), 0, "staging cleaned up");
    close_table(&t);
}

/* Whether this process has the file at path open (a staged blob's
 * descriptor is opened on its first read after stage_blob_park). */
static int have_open(const char *path)
{
    struct stat want;
    cr_assert_eq(stat(path, &want), 0, "%s", path);
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char fd_path[300];
        struct stat st;
        snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%s", e->d_name);
        found = e->d_name[0] != '.' && stat(fd_path, &st) == 0 && st.st_dev == want.st_dev &&
                st.st_ino == want.st_ino;
    }
    closedir(d);
    return found;
}

typedef struct ahead_probe {
    const char *second; /* the second file's staging file */
    uint64_t first_size;
    int checked, second_read; /* while the first file was being packed */
} ahead_probe;

/* From the packing thread while the first file is fed: gives the second
 * file's lane 5 s to start reading it, so that a loaded machine cannot make
 * the check fail; on the old rule nothing reads it before the writer
 * reaches it, however long this waits. */
static void probe_progress(void *ud, uint64_t done, uint64_t total)
{
    ahead_probe *pr = ud;
    if (pr->checked || done == 0 || done >= pr->first_size)
        return;
    pr->checked = 1;
    for (int i = 0; i < 500 && !(pr->second_read = have_open(pr->second)); i++)
        usleep(10000);
}

/* The background packer queues the hash lanes of a checkpoint's big staged
 * files ahead of the writer, as ckpt pack does a tree's (lanes_ahead.h):
 * the second file is read by its lane while the first is still being
 * packed, not only once the writer reaches it. */
Test(wckpt, packer_hashes_big_files_ahead)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "h", 0755, &c), 0);
    const size_t big = 20u << 20; /* above the writer's lane threshold */
    uint8_t *a = malloc(big), *b = malloc(big);
    tu_fill_pattern(a, big, 5);
    tu_fill_pattern(b, big, 6);
    uint32_t na = make_file(c, WTREE_ROOT, "a.bin", a, big);
    uint32_t nb = make_file(c, WTREE_ROOT, "b.bin", b, big);
    cr_assert_eq(wtable_commit(&t, c), 0);
    stage_blob *bb = wc_file_of(c, nb)->blob;
    ckpt_err err = {0};
    cr_assert_eq(stage_blob_park(bb, &err), 0, "%s", err.msg);
    char second[400];
    snprintf(second, sizeof second, "%s/.ckptfs/stage/%s/data/%016llx", dir, c->dir.sid,
             (unsigned long long)stage_blob_id(bb));
    cr_assert_not(have_open(second), "parked: its descriptor is closed");
    packer_file f[2] = {
        {.path = strdup("a.bin"), .blob = wc_file_of(c, na)->blob, .size = big, .mode = 0644},
        {.path = strdup("b.bin"), .blob = bb, .size = big, .mode = 0644}};
    ahead_probe pr = {.second = second, .first_size = big};
    packer_job job = {.backing_fd = backing,
                      .backing_path = dir,
                      .store = t.store,
                      .name = "h",
                      .files = f,
                      .n_files = 2,
                      .threads = 2,
                      .progress = probe_progress,
                      .progress_ud = &pr};
    cr_assert_eq(packer_run(&job, &err), 0, "%s", err.msg);
    cr_assert(pr.checked, "progress was reported while the first file was packed");
    cr_assert(pr.second_read, "the second file's lane read it while the first was packed");
    char *pp = pack_path("h");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pp, NULL, &p, &err), 0, "%s", err.msg);
    uint8_t want[32];
    tu_sha256(a, big, want);
    cr_assert_arr_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "a.bin"))->sha256, want, 32);
    tu_sha256(b, big, want);
    cr_assert_arr_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "b.bin"))->sha256, want, 32);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    ckpt_close(p);
    free(pp);
    free(f[0].path);
    free(f[1].path);
    free(a);
    free(b);
    close_table(&t);
}

Test(wckpt, crash_leftovers_are_cleaned)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "l", 0755, &c), 0);
    uint32_t n = make_file(c, WTREE_ROOT, "kept", "k", 1);
    cr_assert_eq(wckpt_fsync(c, n), 0);
    make_file(c, WTREE_ROOT, "orphan", "o", 1); /* never saved */
    crash_table(&t);
    /* A staging dir whose mkdir never finished (no record). */
    char *half = tu_join(dir, ".ckptfs/stage/0123456789abcdef0123456789abcdef");
    cr_assert_eq(mkdir(half, 0700), 0);
    open_table(&t, NULL, 0, 0);
    cr_assert_neq(access(half, F_OK), 0);
    c = wtable_get(&t, "l", 0);
    uint32_t node;
    struct stat st;
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "kept", &node, &st), 0);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "orphan", &node, &st), -ENOENT);
    char data_dir[200];
    snprintf(data_dir, sizeof data_dir, ".ckptfs/stage/%s/data", c->dir.sid);
    cr_assert_eq(count_entries(data_dir), 1, "orphan data removed");
    free(half);
    close_table(&t);
}

/* The fault that lost 107 MB: a second writable daemon's recovery took
 * the first one's unsaved files for crash leftovers. Now it cannot start,
 * and names who holds the lock; nothing of the first one's is touched. */
Test(wckpt, second_writer_is_refused_and_deletes_nothing)
{
    wtable t, t2;
    wtable_opts o = {.mount_path = "/mnt/first"};
    ckpt_err err = {0};
    static mount_key none;
    cr_assert_eq(wtable_init(&t, dir, backing, &none, &o, &err), 0, "%s", err.msg);
    cr_assert_eq(wtable_recover(&t), 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "live", 0755, &c), 0);
    uint32_t n = make_file(c, WTREE_ROOT, "unsaved", "u", 1); /* never fsynced */
    char data_dir[200];
    snprintf(data_dir, sizeof data_dir, ".ckptfs/stage/%s/data", c->dir.sid);

    o.mount_path = "/mnt/second";
    cr_assert_eq(wtable_init(&t2, dir, backing, &none, &o, &err), -EBUSY);
    char pid[64];
    snprintf(pid, sizeof pid, "pid %ld, mounted on /mnt/first", (long)getpid());
    tu_assert_contains(err.msg, pid);
    tu_assert_contains(err.msg, "-o ro");
    cr_assert_eq(t2.lock_fd, -1);
    wtable_destroy(&t2);
    cr_assert_eq(count_entries(data_dir), 1, "the first writer's data is still there");
    char buf[2];
    cr_assert_eq(wckpt_read(c, n, buf, 1, 0), 1);

    /* And recovery itself refuses to run without the lock. */
    crash_table(&t);
    cr_assert_eq(wtable_init(&t, dir, backing, &none, &o, &err), 0, "%s", err.msg);
    close(t.lock_fd);
    t.lock_fd = -1;
    cr_assert_eq(wtable_recover(&t), -ENOLCK);
    cr_assert_eq(count_entries(data_dir), 1, "nothing was cleaned up");
    cr_assert_null(t.all);
    wtable_destroy(&t);
    /* Once the lock is free, a new writer takes it and records itself. */
    open_table(&t, NULL, 0, 0);
    char *lock = tu_join(dir, ".ckptfs/lock");
    size_t len;
    char *text = (char *)tu_read_file(lock, &len);
    snprintf(pid, sizeof pid, "pid %ld mount ", (long)getpid());
    cr_assert(len > strlen(pid) && memcmp(text, pid, strlen(pid)) == 0, "%.*s", (int)len, text);
    free(text);
    free(lock);
    close_table(&t);
}

static wstate state_now(wckpt *c)
{
    pthread_mutex_lock(&c->lock);
    wstate s = c->state;
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* A failed staging write keeps the checkpoint failed (xattr and all)
 * until those bytes are rewritten, cut off or removed: writes elsewhere
 * do not hide it. */
Test(wckpt, staging_failure_stays_until_made_good)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "f", 0755, &c), 0);
    uint32_t a = make_file(c, WTREE_ROOT, "a", "0123456789", 10);
    uint32_t b = make_file(c, WTREE_ROOT, "b", "x", 1);
    pthread_mutex_lock(&c->lock);
    wc_staging_failed(c, -ENOSPC, "write failed: No space left on device", a, 4096);
    pthread_mutex_unlock(&c->lock);
    cr_assert_eq(wckpt_write(c, b, "more", 4, 1), 4);
    cr_assert_eq(wckpt_write(c, a, "zz", 2, 0), 2);
    cr_assert_eq(state_now(c), WST_FAILED, "writes elsewhere leave it failed");
    char v[128];
    int len = wckpt_xattr(c, "user.ckptfs.state", v, sizeof v);
    cr_assert(len > 0 && memcmp(v, "failed", 6) == 0);
    len = wckpt_xattr(c, "user.ckptfs.error", v, sizeof v);
    cr_assert(len > 0);
    v[len] = 0;
    tu_assert_contains(v, "No space left");
    /* Rewritten over the failed offset: made good. */
    char block[200] = {0};
    cr_assert_eq(wckpt_write(c, a, block, sizeof block, 4000), (ssize_t)sizeof block);
    cr_assert_eq(state_now(c), WST_WRITING);

    /* Two failures: truncating one file and removing the other. */
    pthread_mutex_lock(&c->lock);
    wc_staging_failed(c, -ENOSPC, "full", a, 100);
    wc_staging_failed(c, -EIO, "sync failed", b, UINT64_MAX);
    wc_staging_failed(c, -EINVAL, "not a disk fault", b, 0); /* ignored */
    pthread_mutex_unlock(&c->lock);
    struct stat st;
    cr_assert_eq(wckpt_setattr(c, a, WSET_SIZE, 0, 50, NULL, NULL, &st), 0);
    cr_assert_eq(state_now(c), WST_FAILED, "b's failure is left");
    cr_assert_eq(wckpt_unlink(c, WTREE_ROOT, "b"), 0);
    cr_assert_eq(state_now(c), WST_WRITING);

    /* A failed namespace save is made good by the next save. */
    pthread_mutex_lock(&c->lock);
    wc_staging_failed(c, -ENOSPC, "cannot write meta", WTREE_NONE, 0);
    pthread_mutex_unlock(&c->lock);
    cr_assert_eq(wckpt_write(c, a, "q", 1, 0), 1);
    cr_assert_eq(state_now(c), WST_FAILED);
    ckpt_err err = {0};
    cr_assert_eq(wc_save(c, &err), 0, "%s", err.msg);
    cr_assert_eq(state_now(c), WST_WRITING);
    close_table(&t);
}

/* A failed write leaves all its bytes missing: a later write over its first
 * byte alone made the whole failure good (it was kept as one offset). */
Test(wckpt, failed_write_needs_all_its_bytes_rewritten)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "g", 0755, &c), 0);
    uint32_t a = make_file(c, WTREE_ROOT, "a", "0123456789", 10);
    pthread_mutex_lock(&c->lock);
    wc_staging_write_failed(c, -ENOSPC, "write failed: No space left on device", a, 1000, 3000);
    pthread_mutex_unlock(&c->lock);
    char block[4000] = {0};
    cr_assert_eq(wckpt_write(c, a, block, 1, 1000), 1);
    cr_assert_eq(state_now(c), WST_FAILED, "one byte of 3000 rewritten");
    cr_assert_eq(wckpt_write(c, a, block, 1000, 1500), 1000);
    cr_assert_eq(state_now(c), WST_FAILED, "the middle rewritten, 1001-1499 and 2500-3999 not");
    cr_assert_eq(wckpt_write(c, a, block, 1500, 2500), 1500);
    cr_assert_eq(state_now(c), WST_FAILED, "the end rewritten, 1001-1499 not");
    cr_assert_eq(wckpt_write(c, a, block, 499, 1001), 499);
    cr_assert_eq(state_now(c), WST_WRITING, "every byte rewritten");
    close_table(&t);
}

/* Which writes failed is saved with the namespace (sealed with it under a
 * key). Before, it was lost with the daemon: after a restart a failed
 * checkpoint stayed failed until `ckpt commit`, even once the trainer had
 * rewritten what failed. Now, after a clean stop, writes elsewhere still
 * leave it failed, and rewriting exactly what failed makes it good, so the
 * idle commit packs it. After a crash the ranges come back too, but a
 * failure after the last save may be missing from them (a full disk fails
 * that save): then only `ckpt commit` clears it, as before. */
static void failed_ranges_survive_a_restart(const ckpt_key *key, int clean)
{
    wtable t;
    open_table(&t, key, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "h", 0755, &c), 0);
    uint8_t want[8192];
    tu_fill_pattern(want, sizeof want, 3);
    uint32_t a = make_file(c, WTREE_ROOT, "a", want, 4096);
    make_file(c, WTREE_ROOT, "b", "x", 1);
    pthread_mutex_lock(&c->lock);
    wc_staging_write_failed(c, -ENOSPC, "write failed: No space left on device", a, 4096, 4096);
    /* Made good by the save below, so not saved. */
    wc_staging_failed(c, -ENOSPC, "cannot write meta", WTREE_NONE, 0);
    pthread_mutex_unlock(&c->lock);
    ckpt_err err = {0};
    cr_assert_eq(wc_save(c, &err), 0, "%s", err.msg);
    cr_assert_eq(state_now(c), WST_FAILED);
    if (clean)
        close_table(&t);
    else
        crash_table(&t);

    open_table(&t, key, 0.3, 1);
    c = wtable_get(&t, "h", 1);
    cr_assert_not_null(c);
    cr_assert_eq(state_now(c), WST_FAILED);
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->n_failures, 1);
    cr_assert_eq(c->failures_lost, !clean);
    pthread_mutex_unlock(&c->lock);
    uint32_t b = wtree_lookup(&c->tree, WTREE_ROOT, "b");
    a = wtree_lookup(&c->tree, WTREE_ROOT, "a");
    cr_assert_neq(a, WTREE_NONE);
    cr_assert_neq(b, WTREE_NONE);
    cr_assert_eq(wckpt_write(c, b, "more", 4, 1), 4);
    cr_assert_eq(wckpt_write(c, a, want + 4096, 4095, 4096), 4095);
    usleep(600000);
    cr_assert_eq(state_now(c), WST_FAILED, "the last failed byte is not rewritten yet");
    cr_assert_eq(wckpt_write(c, a, want + 8191, 1, 8191), 1);
    if (clean) {
        cr_assert_eq(state_now(c), WST_WRITING, "every failed byte rewritten");
    } else {
        usleep(600000);
        cr_assert_eq(state_now(c), WST_FAILED, "after a crash the list may be short");
        cr_assert_eq(wtable_commit(&t, c), 0);
    }
    wait_state(c, WST_COMMITTED);
    char *pp = pack_path("h");
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pp, key, &p, &err), 0, "%s", err.msg);
    expect_pack_file(p, "a", want, sizeof want);
    expect_pack_file(p, "b", "xmore", 5);
    ckpt_close(p);
    free(pp);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, plain_failed_ranges_survive_a_restart)
{
    failed_ranges_survive_a_restart(NULL, 1);
}

Test(wckpt, sealed_failed_ranges_survive_a_restart)
{
    ckpt_key *k = make_key(8);
    failed_ranges_survive_a_restart(k, 1);
    ckpt_key_free(k);
}

Test(wckpt, failed_ranges_after_a_crash_need_a_commit)
{
    failed_ranges_survive_a_restart(NULL, 0);
}

/* A sync that failed (here: parking at a clean stop) is made good by a
 * later sync only while its bytes are still buffered. After a restart they
 * are gone, so neither a sync nor a truncate may clear it: before, one did,
 * and the idle commit packed the file without the bytes the sync lost. */
static void failed_sync_across_a_restart(int by_truncate)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "nd", 0755, &c), 0);
    uint32_t a = make_file(c, WTREE_ROOT, "a", "0123456789", 10);
    pthread_mutex_lock(&c->lock);
    wc_staging_failed(c, -ENOSPC, "park failed: No space left on device", a, UINT64_MAX);
    pthread_mutex_unlock(&c->lock);
    close_table(&t);

    open_table(&t, NULL, 0, 0);
    c = wtable_get(&t, "nd", 1);
    cr_assert_not_null(c);
    uint32_t n;
    struct stat st;
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "a", &n, &st), 0);
    if (by_truncate)
        cr_assert_eq(wckpt_setattr(c, n, WSET_SIZE, 0, 10, NULL, NULL, &st), 0);
    else
        cr_assert_eq(wckpt_fsync(c, n), 0);
    cr_assert_eq(state_now(c), WST_FAILED, "the lost bytes are not made good");
    pthread_mutex_lock(&c->lock);
    cr_assert(c->failures_lost);
    pthread_mutex_unlock(&c->lock);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, failed_sync_is_not_made_good_by_a_sync_after_a_restart)
{
    failed_sync_across_a_restart(0);
}

Test(wckpt, failed_sync_is_not_made_good_by_a_truncate_after_a_restart)
{
    failed_sync_across_a_restart(1);
}

/* Ranges saved complete by a clean stop are marked incomplete on disk as
 * soon as the next daemon has them back: a crash of that one (after a
 * failure that never reached the disk) must not find them complete. */
Test(wckpt, complete_ranges_are_marked_incomplete_once_running_again)
{
    wtable t;
    open_table(&t, NULL, 0, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "r", 0755, &c), 0);
    uint32_t a = make_file(c, WTREE_ROOT, "a", "0123456789", 10);
    pthread_mutex_lock(&c->lock);
    wc_staging_write_failed(c, -ENOSPC, "write failed: No space left on device", a, 0, 10);
    pthread_mutex_unlock(&c->lock);
    close_table(&t);

    open_table(&t, NULL, 0, 0);
    c = wtable_get(&t, "r", 1);
    cr_assert_not_null(c);
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->n_failures, 1);
    cr_assert_not(c->failures_lost, "complete after a clean stop");
    pthread_mutex_unlock(&c->lock);
    wtable_forget(&t, c, 1);
    crash_table(&t);

    open_table(&t, NULL, 0, 0);
    c = wtable_get(&t, "r", 1);
    cr_assert_not_null(c);
    cr_assert_eq(state_now(c), WST_FAILED);
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->n_failures, 1);
    cr_assert(c->failures_lost, "incomplete after a crash of the daemon that had them back");
    pthread_mutex_unlock(&c->lock);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

/* Failures that cannot be read back (here a range a faulty writer saved
 * reversed; test_stage.c has the other faults) lose only themselves: the
 * namespace is recovered, the log names the file and the fault, and the
 * checkpoint stays failed until `ckpt commit`, whatever is rewritten. */
static void unreadable_failed_ranges(const ckpt_key *key)
{
    char log[] = "/tmp/test_wckpt_log_XXXXXX";
    int log_fd = mkstemp(log);
    cr_assert_geq(log_fd, 0);
    close(log_fd);
    cr_assert_eq(fslog_use_file(log), 0);
    wtable t;
    open_table(&t, key, 0.3, 0);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "u", 0755, &c), 0);
    uint32_t a = make_file(c, WTREE_ROOT, "a", "0123456789", 10);
    pthread_mutex_lock(&c->lock);
    wc_staging_failed(c, -EIO, "write failed: Input/output error", a, 5);
    pthread_mutex_unlock(&c->lock);
    ckpt_err err = {0};
    cr_assert_eq(wc_save(c, &err), 0, "%s", err.msg);
    stage_failure bad = {a, 9, 5};
    stage_failures f = {&bad, 1, 0, NULL};
    cr_assert_eq(stage_save_meta(&c->dir, &c->tree, c->next_blob_id, &f, &err), 0, "%s", err.msg);
    char sid[STAGE_SID_LEN + 1];
    strcpy(sid, c->dir.sid);
    crash_table(&t);

    open_table(&t, key, 0.3, 1);
    c = wtable_get(&t, "u", 1);
    cr_assert_not_null(c);
    cr_assert_eq(state_now(c), WST_FAILED);
    cr_assert_not(c->locked, "the namespace is recovered");
    pthread_mutex_lock(&c->lock);
    cr_assert_eq(c->n_failures, 0);
    cr_assert(c->failures_lost);
    pthread_mutex_unlock(&c->lock);
    size_t len;
    char *text = (char *)tu_read_file(log, &len);
    char where[128];
    snprintf(where, sizeof where, "checkpoint 'u': .ckptfs/stage/%s/meta: ", sid);
    tu_assert_contains(text, where);
    tu_assert_contains(text, "warning: ");
    tu_assert_contains(text, "reversed");
    free(text);
    a = wtree_lookup(&c->tree, WTREE_ROOT, "a");
    cr_assert_eq(wckpt_write(c, a, "0123456789", 10, 0), 10);
    usleep(600000);
    cr_assert_eq(state_now(c), WST_FAILED, "rewritten, but which bytes failed is not known");
    cr_assert_eq(wtable_commit(&t, c), 0);
    wait_state(c, WST_COMMITTED);
    wtable_forget(&t, c, 1);
    close_table(&t);
    unlink(log);
}

Test(wckpt, plain_unreadable_failed_ranges)
{
    unreadable_failed_ranges(NULL);
}

Test(wckpt, sealed_unreadable_failed_ranges)
{
    ckpt_key *k = make_key(9);
    unreadable_failed_ranges(k);
    ckpt_key_free(k);
}

Test(wckpt, wrong_key_loses_nothing)
{
    ckpt_key *good = make_key(6), *bad = make_key(7);
    wtable t;
    open_table(&t, good, 0, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "enc", 0755, &c), 0);
    make_file(c, WTREE_ROOT, "f", "secret", 6);
    close_table(&t);

    open_table(&t, bad, 0, 1);
    c = wtable_get(&t, "enc", 0);
    cr_assert_not_null(c, "still listed");
    uint32_t node;
    struct stat st;
    cr_assert_eq(wckpt_getattr(c, WTREE_ROOT, &st), 0);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "f", &node, &st), -EACCES);
    cr_assert_eq(wckpt_create(c, WTREE_ROOT, "g", 0644, &node, &st), -EACCES);
    cr_assert_eq(wtable_commit(&t, c), -EACCES);
    cr_assert_eq(wtable_rmdir(&t, "enc"), -EACCES);
    char v[64];
    cr_assert_gt(wckpt_xattr(c, "user.ckptfs.state", v, sizeof v), 0);
    cr_assert_str_eq(v, "writing");
    close_table(&t);

    open_table(&t, NULL, 0, 1);
    c = wtable_get(&t, "enc", 0);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "f", &node, &st), -EACCES);
    close_table(&t);

    open_table(&t, good, 0, 1);
    c = wtable_get(&t, "enc", 0);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "f", &node, &st), 0);
    char buf[8];
    cr_assert_eq(wckpt_read(c, node, buf, 8, 0), 6);
    cr_assert_eq(memcmp(buf, "secret", 6), 0);
    close_table(&t);
    ckpt_key_free(good);
    ckpt_key_free(bad);
}

Test(wckpt, setattr_truncate_rename_inside)
{
    wtable t;
    open_table(&t, NULL, 0, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "s", 0755, &c), 0);
    uint32_t f = make_file(c, WTREE_ROOT, "f", "0123456789", 10), g;
    struct stat st;
    struct timespec when = {1234567890, 5};
    struct timespec seen = {1000000000, 7};
    cr_assert_eq(wckpt_setattr(c, f, WSET_SIZE | WSET_MODE | WSET_MTIME | WSET_ATIME, 0600, 4,
                               &seen, &when, &st),
                 0);
    cr_assert_eq(st.st_size, 4);
    cr_assert_eq(st.st_mode, S_IFREG | 0600);
    cr_assert_eq(st.st_mtim.tv_sec, 1234567890);
    cr_assert_eq(st.st_atim.tv_sec, 1000000000);
    cr_assert_eq(st.st_atim.tv_nsec, 7);
    /* atime alone (touch -a) leaves the mtime be. */
    struct timespec later = {1100000000, 0};
    cr_assert_eq(wckpt_setattr(c, f, WSET_ATIME, 0, 0, &later, NULL, &st), 0);
    cr_assert_eq(st.st_atim.tv_sec, 1100000000);
    cr_assert_eq(st.st_mtim.tv_sec, 1234567890);
    cr_assert_eq(wckpt_rename(c, WTREE_ROOT, "f", WTREE_ROOT, "g", 0), 0);
    cr_assert_eq(wckpt_lookup(c, WTREE_ROOT, "g", &g, &st), 0);
    cr_assert_eq(g, f);
    cr_assert_eq(wckpt_allocate(c, g, 0, 100), 0);
    cr_assert_eq(wckpt_getattr(c, g, &st), 0);
    cr_assert_eq(st.st_size, 100);
    /* An unlinked file stays usable while open. */
    cr_assert_eq(wckpt_open(c, g, O_RDWR), 0);
    cr_assert_eq(wckpt_unlink(c, WTREE_ROOT, "g"), 0);
    cr_assert_eq(wckpt_write(c, g, "zz", 2, 0), 2);
    char buf[4];
    cr_assert_eq(wckpt_read(c, g, buf, 4, 0), 4);
    cr_assert_eq(memcmp(buf, "zz23", 4), 0);
    wckpt_release(c, g, O_RDWR);
    cr_assert_null(c->tree.nodes[g].data, "freed on last release");
    wdirent *v;
    size_t n;
    uint32_t parent;
    cr_assert_eq(wckpt_list(c, WTREE_ROOT, &v, &n, &parent), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(parent, WTREE_NONE);
    wdirents_free(v, n);
    close_table(&t);
}

/* A file checkpoint unlinked while open (tempfile.TemporaryFile's fallback)
 * keeps working through its handle, as a file unlinked inside a checkpoint
 * does, with nothing left staged meanwhile and nothing packed. */
Test(wckpt, file_checkpoint_unlinked_while_open)
{
    wtable t;
    open_table(&t, NULL, 0, 1);
    wckpt *c;
    uint32_t f;
    struct stat st;
    cr_assert_eq(wtable_create_file(&t, "tmp", 0600, &c, &f, &st), 0);
    cr_assert_eq(wckpt_write(c, f, "head", 4, 0), 4);
    cr_assert_eq(wtable_unlink_file(&t, "tmp"), 0);
    cr_assert_null(wtable_get(&t, "tmp", 0), "the name is gone");
    cr_assert_eq(count_entries(".ckptfs/stage"), 0, "nothing staged is left for a restart");
    cr_assert_eq(wckpt_write(c, f, "tail", 4, 4), 4);
    char buf[8];
    cr_assert_eq(wckpt_read(c, f, buf, sizeof buf, 0), 8);
    cr_assert_eq(memcmp(buf, "headtail", 8), 0);
    cr_assert_eq(wckpt_getattr(c, f, &st), 0);
    cr_assert_eq(st.st_size, 8);
    cr_assert_eq(st.st_nlink, 0);
    cr_assert_eq(wckpt_setattr(c, f, WSET_SIZE, 0, 2, NULL, NULL, &st), 0);
    cr_assert_eq(st.st_size, 2);
    cr_assert_eq(wckpt_allocate(c, f, 0, 100), 0);
    cr_assert_eq(wckpt_fsync(c, f), 0);
    cr_assert_eq(wckpt_flush(c, f), 0);
    wckpt_release(c, f, O_WRONLY);
    cr_assert_null(c->tree.nodes[f].data, "freed on last release");
    cr_assert_eq(wckpt_read(c, f, buf, 1, 0), -ESTALE, "gone once closed");
    wtable_forget(&t, c, 1);
    close_table(&t);
    cr_assert_eq(count_entries(".ckptfs/stage"), 0);
    cr_assert_eq(count_entries(""), 0, "nothing packed");
}

/* Writes len zeros at 0 into node f of c, answered (stage_ack) by starting
 * race(arg) on a thread of its own and giving it 50 ms to meet the write
 * still in flight; the write's result, once race is done too. */
typedef struct racer {
    void *(*race)(void *);
    void *arg;
    pthread_t thread;
    int started;
} racer;

static void answer_then_race(void *arg, size_t len)
{
    (void)len;
    racer *r = arg;
    cr_assert_eq(pthread_create(&r->thread, NULL, r->race, r->arg), 0);
    r->started = 1;
    usleep(50000);
}

static ssize_t write_racing(wckpt *c, uint32_t f, size_t len, void *(*race)(void *), void *arg)
{
    racer r = {race, arg, 0, 0};
    stage_ack ack = {answer_then_race, &r, 0};
    uint8_t *data = calloc(1, len);
    ssize_t n = wckpt_write_acked(c, f, data, len, 0, &ack);
    if (r.started)
        pthread_join(r.thread, NULL);
    free(data);
    return n;
}

/* cp -p sets the mtime (futimens) as soon as its last write is answered,
 * while that write's bytes are still being copied: the time it sets must
 * stay. */
typedef struct mtime_setter {
    wckpt *c;
    uint32_t node;
} mtime_setter;

static void *set_old_mtime(void *arg)
{
    mtime_setter *s = arg;
    struct timespec when = {1234567890, 0};
    struct stat st;
    cr_assert_eq(wckpt_setattr(s->c, s->node, WSET_MTIME, 0, 0, NULL, &when, &st), 0);
    return NULL;
}

Test(wckpt, mtime_set_after_the_answer_stays)
{
    wtable t;
    open_table(&t, NULL, 0, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "m", 0755, &c), 0);
    uint32_t f = make_file(c, WTREE_ROOT, "f", "x", 1);
    mtime_setter s = {c, f};
    cr_assert_eq(write_racing(c, f, 1 << 20, set_old_mtime, &s), 1 << 20);
    struct stat st;
    cr_assert_eq(wckpt_getattr(c, f, &st), 0);
    cr_assert_eq(st.st_mtim.tv_sec, 1234567890, "mtime %lld", (long long)st.st_mtim.tv_sec);
    close_table(&t);
}

/* A commit that waits for a write in flight which then fails (after its
 * answer) is refused, and the checkpoint stays failed with the reason,
 * rather than being committed without those bytes or left stuck. */
typedef struct committer {
    wtable *t;
    wckpt *c;
    int rc;
} committer;

static void *commit_now(void *arg)
{
    committer *k = arg;
    k->rc = wtable_commit(k->t, k->c);
    return NULL;
}

/* A commit that waits for a write in flight, during which another file is
 * written (which makes the checkpoint writing again, as it would stop the
 * packing): nothing failed, so the commit says busy, not EIO. */
typedef struct commit_then_write {
    committer k;
    uint32_t other;
} commit_then_write;

static void *commit_then_write_other(void *arg)
{
    commit_then_write *w = arg;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, commit_now, &w->k), 0);
    usleep(20000); /* the commit now waits for the write in flight */
    cr_assert_eq(wckpt_write(w->k.c, w->other, "y", 1, 0), 1);
    pthread_join(th, NULL);
    return NULL;
}

Test(wckpt, commit_overtaken_by_a_write_says_busy_not_eio)
{
    wtable t;
    open_table(&t, NULL, 3600, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "w", 0755, &c), 0);
    uint32_t f = make_file(c, WTREE_ROOT, "f", "x", 1);
    uint32_t g = make_file(c, WTREE_ROOT, "g", "x", 1);
    commit_then_write w = {{&t, c, 1}, g};
    cr_assert_eq(write_racing(c, f, 1 << 20, commit_then_write_other, &w), 1 << 20);
    cr_assert_eq(w.k.rc, -EBUSY, "commit gave %d", w.k.rc);
    cr_assert_eq(state_now(c), WST_WRITING);
    cr_assert_null(c->error);
    /* And a commit now goes through. */
    cr_assert_eq(wtable_commit(&t, c), 0);
    wait_state(c, WST_COMMITTED);
    wtable_forget(&t, c, 1);
    close_table(&t);
}

Test(wckpt, commit_under_a_write_that_fails_is_refused)
{
    wtable t;
    open_table(&t, NULL, 3600, 1);
    wckpt *c;
    cr_assert_eq(wtable_mkdir(&t, "k", 0755, &c), 0);
    uint32_t f = make_file(c, WTREE_ROOT, "f", "x", 1);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 * 1024, 64 * 1024};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    committer k = {&t, c, 1};
    cr_assert_lt(write_racing(c, f, 1 << 20, commit_now, &k), 0);
    cr_assert_eq(k.rc, -EIO, "commit gave %d", k.rc);
    pthread_mutex_lock(&c->lock);
    wstate s = c->state;
    pthread_mutex_unlock(&c->lock);
    cr_assert_eq(s, WST_FAILED, "state %s", wstate_name(s));
    tu_assert_contains(c->error, "write failed");
    close_table(&t);
}

/* A checkpoint's pack name, as the packer, recovery, reopen, delete and
 * rename (and the read side) make it: NAME.tpack or NAME.tfile, refused
 * rather than cut short when it does not fit. */
Test(wckpt, pack_names_are_whole_or_refused)
{
    char out[16];
    cr_assert_eq(backing_pack_name("run1/ck", 0, out, sizeof out), 0);
    cr_assert_str_eq(out, "run1/ck.tpack");
    cr_assert_eq(backing_pack_name("run1/ck", 1, out, sizeof out), 0);
    cr_assert_str_eq(out, "run1/ck.tfile");
    cr_assert_eq(backing_pack_name("123456789", 0, out, sizeof out), 0, "15 bytes and its NUL");
    cr_assert_str_eq(out, "123456789.tpack");
    cr_assert_eq(backing_pack_name("1234567890", 0, out, sizeof out), -ENAMETOOLONG);
}
