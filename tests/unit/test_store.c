/* The local-directory store (core/src/store/local.c): listing, ranged reads,
 * atomic writes (visible only after commit, nothing left after abort), the
 * refusal of symbolic links, the writer's lock, and packs written and read
 * through a store. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "testutil.h"

static char *dir;
static ckpt_store *store;

static void setup(void)
{
    dir = tu_mkdtemp();
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_open_local(dir, &store, &err), 0, "%s", err.msg);
}

static void teardown(void)
{
    ckpt_store_free(store);
    tu_rm_rf(dir);
    free(dir);
}

static void put(const char *name, const char *text)
{
    char *p = tu_join(dir, name);
    tu_write_str(p, text);
    free(p);
}

/* Collects a listing as "name:size" lines. */
static int collect(void *ud, const ckpt_object_info *info)
{
    char *buf = ud;
    size_t n = strlen(buf);
    snprintf(buf + n, 1024 - n, "%s:%llu\n", info->name, (unsigned long long)info->id.size);
    return 0;
}

static void expect_listing(const char *prefix, const char *want)
{
    char got[1024] = "";
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_list(store, prefix, collect, got, &err), 0, "%s", err.msg);
    cr_assert_str_eq(got, want, "listing '%s'", prefix);
}

static int count_entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    for (struct dirent *de; (de = readdir(d));)
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

TestSuite(store, .init = setup, .fini = teardown);

Test(store, lists_regular_files_sorted_by_prefix)
{
    put("b.tpack", "bbbb");
    put("a.tpack", "aa");
    put("notes.txt", "n");
    char *sub = tu_join(dir, "sub");
    cr_assert_eq(mkdir(sub, 0755), 0);
    put("sub/x.tpack", "xxx");
    free(sub);
    char *link = tu_join(dir, "l.tpack");
    cr_assert_eq(symlink("a.tpack", link), 0);
    free(link);

    /* Links and directories are not objects. */
    expect_listing("", "a.tpack:2\nb.tpack:4\nnotes.txt:1\n");
    expect_listing("b", "b.tpack:4\n");
    expect_listing("sub/", "sub/x.tpack:3\n");
    expect_listing("zzz", "");
}

static int stop_after_one(void *ud, const ckpt_object_info *info)
{
    (void)info;
    ++*(int *)ud;
    return 7;
}

Test(store, list_needs_a_callback)
{
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_list(store, "", NULL, NULL, &err), -EINVAL);
}

Test(store, list_returns_what_stops_it)
{
    put("a", "1");
    put("b", "2");
    int calls = 0;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_list(store, "", stop_after_one, &calls, &err), 7);
    cr_assert_eq(calls, 1);
}

Test(store, ranged_reads)
{
    put("obj", "0123456789");
    store_reader *r;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->open_read(store, "obj", &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r->id.size, 10);
    cr_assert(r->ops->fd(r) >= 0, "a local object has a descriptor");
    char buf[16] = {0};
    cr_assert_eq(r->ops->read_at(r, buf, 4, 3, NULL), 4);
    cr_assert_eq(memcmp(buf, "3456", 4), 0);
    /* Short only at the end; nothing past it. */
    cr_assert_eq(r->ops->read_at(r, buf, 16, 7, NULL), 3);
    cr_assert_eq(memcmp(buf, "789", 3), 0);
    cr_assert_eq(r->ops->read_at(r, buf, 4, 10, NULL), 0);
    cr_assert_eq(r->ops->read_at(r, buf, 4, 1000, NULL), 0);
    char *want = tu_join(dir, "obj");
    cr_assert_str_eq(r->name, want, "messages name the object by its path");
    free(want);
    r->ops->close(r);
}

Test(store, missing_object)
{
    store_reader *r;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->open_read(store, "nope", &r, &err), -ENOENT);
    cr_assert(strstr(err.msg, "nope: cannot open"), "%s", err.msg);
}

Test(store, a_new_object_is_visible_only_after_commit)
{
    put("obj", "old");
    store_upload *u;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->create(store, "obj", NULL, &u, &err), 0, "%s", err.msg);
    cr_assert_eq(u->ops->write(u, "new ", 4, &err), 0, "%s", err.msg);
    cr_assert_eq(u->ops->write(u, "bytes", 5, &err), 0, "%s", err.msg);
    /* Readers still see the old object, whole. */
    char *path = tu_join(dir, "obj");
    size_t len;
    uint8_t *got = tu_read_file(path, &len);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(got, "old", 3), 0);
    free(got);
    cr_assert_eq(u->ops->commit(u, &err), 0, "%s", err.msg);
    got = tu_read_file(path, &len);
    cr_assert_eq(len, 9);
    cr_assert_eq(memcmp(got, "new bytes", 9), 0);
    free(got);
    free(path);
    /* The temporary name is gone: obj is the only entry. */
    cr_assert_eq(count_entries(), 1);
    expect_listing("", "obj:9\n");
}

/* Two uploads of one name would share its temporary file, truncating and
 * overwriting each other, and the first commit would publish the mix: the
 * second is refused while the first writes, and may go once it is done. */
Test(store, a_name_being_written_is_refused_to_a_second_upload)
{
    store_upload *a, *b;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->create(store, "obj", NULL, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(a->ops->write(a, "first", 5, &err), 0, "%s", err.msg);
    cr_assert_eq(store->ops->create(store, "obj", NULL, &b, &err), -EBUSY);
    tu_assert_contains(err.msg, "obj.tmp: another writer is writing it now");
    cr_assert_eq(a->ops->commit(a, &err), 0, "%s", err.msg);
    expect_listing("", "obj:5\n");
    cr_assert_eq(store->ops->create(store, "obj", NULL, &b, &err), 0, "%s", err.msg);
    b->ops->abort(b);
    expect_listing("", "obj:5\n");
}

/* NAME.tmp of a 255-byte NAME passes NAME_MAX: the temporary file gets a
 * shortened name with a hash of the whole, and the object its own. */
Test(store, a_name_of_name_max_bytes_is_written)
{
    char name[256], other[256];
    memset(name, 'n', 255);
    name[255] = '\0';
    memcpy(other, name, sizeof other);
    other[250] = 'o';
    store_upload *u, *v;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->create(store, name, NULL, &u, &err), 0, "%s", err.msg);
    /* A name differing only past the kept bytes has its own temporary file. */
    cr_assert_eq(store->ops->create(store, other, NULL, &v, &err), 0, "%s", err.msg);
    cr_assert_eq(u->ops->write(u, "long", 4, &err), 0, "%s", err.msg);
    cr_assert_eq(v->ops->write(v, "other", 5, &err), 0, "%s", err.msg);
    cr_assert_eq(count_entries(), 2);
    cr_assert_eq(u->ops->commit(u, &err), 0, "%s", err.msg);
    cr_assert_eq(v->ops->commit(v, &err), 0, "%s", err.msg);
    cr_assert_eq(count_entries(), 2, "only the two objects are left");
    char *path = tu_join(dir, name);
    size_t len;
    uint8_t *got = tu_read_file(path, &len);
    cr_assert_eq(len, 4);
    cr_assert_eq(memcmp(got, "long", 4), 0);
    free(got);
    free(path);
}

/* ckptfs's temporary packs (.NAME.tpack.tmp) keep this shape across
 * versions, so a daemon removes what an older one left. */
Test(store, temporary_names)
{
    char out[600], name[300];
    cr_assert_eq(ckpt_tmp_name("ns/ckpt", ".", ".tpack.tmp", out, sizeof out), 0);
    cr_assert_str_eq(out, "ns/.ckpt.tpack.tmp");
    cr_assert_eq(ckpt_tmp_name("a.tpack", "", ".tmp", out, sizeof out), 0);
    cr_assert_str_eq(out, "a.tpack.tmp");
    memset(name, 'c', 249);
    memcpy(name, "ns/", 3);
    name[249] = '\0'; /* a 246-byte base: 257 bytes as .BASE.tpack.tmp */
    cr_assert_eq(ckpt_tmp_name(name, ".", ".tpack.tmp", out, sizeof out), 0);
    const char *base = strrchr(out, '/') + 1;
    cr_assert_eq(strlen(base), 255);
    cr_assert_eq(base[0], '.');
    cr_assert_eq(strspn(base + 1, "c"), 227, "227 bytes of the name are kept");
    cr_assert_eq(base[228], '~');
    cr_assert_eq(strspn(base + 229, "0123456789abcdef"), 16);
    cr_assert_str_eq(base + 245, ".tpack.tmp");
    cr_assert_eq(ckpt_tmp_name(name, ".", ".tpack.tmp", out, 20), -ENAMETOOLONG);
}

Test(store, abort_leaves_nothing)
{
    store_upload *u;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->create(store, "obj", "tmp-obj", &u, &err), 0, "%s", err.msg);
    cr_assert_eq(u->ops->write(u, "partial", 7, &err), 0, "%s", err.msg);
    char *tmp = tu_join(dir, "tmp-obj");
    cr_assert_eq(access(tmp, F_OK), 0, "written under the temporary name");
    free(tmp);
    u->ops->abort(u);
    cr_assert_eq(count_entries(), 0);
}

Test(store, refuses_symbolic_links)
{
    put("target", "secret");
    char *link = tu_join(dir, "link");
    cr_assert_eq(symlink("target", link), 0);
    store_reader *r;
    ckpt_err err = {0};
    cr_assert_eq(store->ops->open_read(store, "link", &r, &err), -ELOOP);
    cr_assert(strstr(err.msg, "link: is a symbolic link"), "%s", err.msg);

    /* Nor is a link planted at the temporary name followed when writing. */
    char *tmp = tu_join(dir, "obj.tmp");
    cr_assert_eq(symlink("target", tmp), 0);
    store_upload *u;
    cr_assert_eq(store->ops->create(store, "obj", NULL, &u, &err), -ELOOP);
    cr_assert(strstr(err.msg, "obj.tmp: cannot create"), "%s", err.msg);
    size_t len;
    char *target = tu_join(dir, "target");
    uint8_t *got = tu_read_file(target, &len);
    cr_assert_eq(len, 6, "the link's target is untouched");
    free(got);
    free(target);
    free(tmp);
    free(link);
}

Test(store, names_cannot_leave_the_store)
{
    ckpt_err err = {0};
    ckpt_pack *p;
    cr_assert_eq(ckpt_pack_open_in(store, "../x.tpack", NULL, &p, &err), -EINVAL);
    cr_assert_eq(ckpt_pack_open_in(store, "/etc/passwd", NULL, &p, &err), -EINVAL);
    cr_assert_eq(ckpt_store_remove(store, "../x", &err), -EINVAL);
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open_in(store, "a/../../b", NULL, NULL, &w, &err), -EINVAL);
}

Test(store, lock_held_twice_fails_naming_the_holder)
{
    ckpt_store_lock *l1, *l2;
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_lock_take(store, "writer.lock", &l1, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_store_lock_take(store, "writer.lock", &l2, &err), -EBUSY);
    char want[64];
    snprintf(want, sizeof want, "locked by process %ld", (long)getpid());
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    ckpt_store_lock_release(l1);
    cr_assert_eq(ckpt_store_lock_take(store, "writer.lock", &l2, &err), 0, "%s", err.msg);
    ckpt_store_lock_release(l2);
}

Test(store, remove_and_rename)
{
    put("a", "1");
    ckpt_err err = {0};
    cr_assert_eq(ckpt_store_rename(store, "a", "b", &err), 0, "%s", err.msg);
    expect_listing("", "b:1\n");
    cr_assert_eq(ckpt_store_remove(store, "b", &err), 0, "%s", err.msg);
    expect_listing("", "");
    cr_assert_eq(ckpt_store_remove(store, "b", &err), -ENOENT);
}

static int find_id(void *ud, const ckpt_object_info *info)
{
    if (strcmp(info->name, "p.tpack") == 0)
        *(ckpt_object_id *)ud = info->id;
    return 0;
}

Test(store, packs_written_and_read_through_the_store)
{
    ckpt_err err = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open_in(store, "p.tpack", NULL, NULL, &w, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "f.bin", 0644, 0, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_write(w, "hello store", 11, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &err), 0, "%s", err.msg);
    char *final = tu_join(dir, "p.tpack");
    cr_assert_neq(access(final, F_OK), 0, "no pack before finish");
    free(final);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &err), 0, "%s", err.msg);

    ckpt_object_id listed = {0};
    cr_assert_eq(ckpt_store_list(store, "", find_id, &listed, &err), 0);
    cr_assert_eq(count_entries(), 1, "only the pack, no temporary file");

    ckpt_pack *p;
    cr_assert_eq(ckpt_pack_open_in(store, "p.tpack", NULL, &p, &err), 0, "%s", err.msg);
    char buf[16] = {0};
    cr_assert_eq(ckpt_file_pread(p, 0, buf, sizeof buf, 0, &err), 11);
    cr_assert_str_eq(buf, "hello store");
    ckpt_object_id opened;
    ckpt_pack_object_id(p, &opened);
    cr_assert(ckpt_object_id_equal(&opened, &listed));
    char *want = tu_join(dir, "p.tpack");
    cr_assert_str_eq(ckpt_path(p), want);
    free(want);
    ckpt_close(p);

    /* A replacement is a different object, whatever its name. */
    cr_assert_eq(ckpt_writer_open_in(store, "p.tpack", NULL, NULL, &w, &err), 0, "%s", err.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &err), 0, "%s", err.msg);
    ckpt_object_id now = {0};
    cr_assert_eq(ckpt_store_list(store, "", find_id, &now, &err), 0);
    cr_assert_not(ckpt_object_id_equal(&opened, &now));
}

Test(store, an_aborted_pack_leaves_nothing)
{
    ckpt_err err = {0};
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_open_in(store, "p.tpack", ".p.tpack.tmp", NULL, &w, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(count_entries(), 1, "the temporary file");
    ckpt_writer_abort(w);
    cr_assert_eq(count_entries(), 0);
}
