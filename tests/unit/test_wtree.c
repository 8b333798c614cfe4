/* The namespace of a checkpoint being written (fs/write/wtree.c): adding,
 * removing and renaming with rename(2)'s rules, paths, the sorted file
 * list for packing, and many entries in one directory. */
#include "testutil.h"

#include "write/wtree.h"

static wtree t;
static void setup(void)
{
    cr_assert_eq(wtree_init(&t, 0755, 1, 2), 0);
}
static void teardown(void)
{
    wtree_free(&t);
}
TestSuite(wtree, .init = setup, .fini = teardown);

static uint32_t add(uint32_t dir, const char *name, wnode_kind kind)
{
    uint32_t id = WTREE_NONE;
    int rc = wtree_add(&t, dir, name, kind, 0644, 0, 0, 0, &id);
    cr_assert_eq(rc, 0, "add %s: %s", name, strerror(-rc));
    return id;
}

static void expect_path(uint32_t id, const char *want)
{
    char buf[WTREE_PATH_MAX + 1];
    cr_assert_eq(wtree_path(&t, id, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, want);
}

Test(wtree, add_lookup_and_paths)
{
    uint32_t a = add(WTREE_ROOT, "a", WNODE_DIR);
    uint32_t b = add(a, "b", WNODE_DIR);
    uint32_t f = add(b, "f.bin", WNODE_FILE);
    cr_assert_eq(wtree_lookup(&t, WTREE_ROOT, "a"), a);
    cr_assert_eq(wtree_lookup(&t, b, "f.bin"), f);
    cr_assert_eq(wtree_lookup(&t, a, "f.bin"), WTREE_NONE);
    expect_path(f, "a/b/f.bin");
    expect_path(a, "a");
    expect_path(WTREE_ROOT, "");
    uint32_t x;
    cr_assert_eq(wtree_add(&t, b, "f.bin", WNODE_FILE, 0, 0, 0, 0, &x), -EEXIST);
    cr_assert_eq(wtree_add(&t, f, "g", WNODE_FILE, 0, 0, 0, 0, &x), -ENOTDIR);
    cr_assert_eq(wtree_add(&t, a, "..", WNODE_FILE, 0, 0, 0, 0, &x), -EINVAL);
    cr_assert_eq(wtree_add(&t, a, "x/y", WNODE_FILE, 0, 0, 0, 0, &x), -EINVAL);
    cr_assert_eq(wtree_add(&t, a, "", WNODE_FILE, 0, 0, 0, 0, &x), -EINVAL);
}

Test(wtree, remove_rules)
{
    uint32_t d = add(WTREE_ROOT, "d", WNODE_DIR);
    uint32_t f = add(d, "f", WNODE_FILE), out;
    cr_assert_eq(wtree_remove(&t, WTREE_ROOT, "d", 1, &out), -ENOTEMPTY);
    cr_assert_eq(wtree_remove(&t, WTREE_ROOT, "d", 0, &out), -EISDIR);
    cr_assert_eq(wtree_remove(&t, d, "f", 1, &out), -ENOTDIR);
    cr_assert_eq(wtree_remove(&t, d, "nope", 0, &out), -ENOENT);
    cr_assert_eq(wtree_remove(&t, d, "f", 0, &out), 0);
    cr_assert_eq(out, f);
    cr_assert_not(t.nodes[f].linked);
    cr_assert_eq(wtree_lookup(&t, d, "f"), WTREE_NONE);
    /* Detached, the directory is gone for new entries too. */
    cr_assert_eq(wtree_remove(&t, WTREE_ROOT, "d", 1, &out), 0);
    cr_assert_eq(wtree_add(&t, d, "g", WNODE_FILE, 0, 0, 0, 0, &out), -ENOENT);
    /* Ids are never reused. */
    uint32_t again = add(WTREE_ROOT, "d", WNODE_DIR);
    cr_assert_neq(again, d);
}

Test(wtree, rename_rules)
{
    uint32_t a = add(WTREE_ROOT, "a", WNODE_DIR), b = add(a, "b", WNODE_DIR);
    uint32_t f = add(WTREE_ROOT, "f", WNODE_FILE), g = add(WTREE_ROOT, "g", WNODE_FILE);
    uint32_t e = add(WTREE_ROOT, "empty", WNODE_DIR), rep;
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "a", b, "x", 0, &rep), -EINVAL, "into itself");
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "a", a, "x", 0, &rep), -EINVAL);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "f", WTREE_ROOT, "a", 0, &rep), -EISDIR);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "a", WTREE_ROOT, "f", 0, &rep), -ENOTDIR);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "empty", WTREE_ROOT, "a", 0, &rep), -ENOTEMPTY);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "f", WTREE_ROOT, "g", 1, &rep), -EEXIST);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "zz", WTREE_ROOT, "g", 0, &rep), -ENOENT);
    /* A file replaces a file. */
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "f", WTREE_ROOT, "g", 0, &rep), 0);
    cr_assert_eq(rep, g);
    cr_assert_eq(wtree_lookup(&t, WTREE_ROOT, "g"), f);
    cr_assert_eq(wtree_lookup(&t, WTREE_ROOT, "f"), WTREE_NONE);
    /* A directory replaces an empty one and moves its subtree along. */
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "a", WTREE_ROOT, "empty", 0, &rep), 0);
    cr_assert_eq(rep, e);
    expect_path(b, "empty/b");
    /* Across directories, then back; renaming onto itself is a no-op. */
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, "g", b, "deep", 0, &rep), 0);
    expect_path(f, "empty/b/deep");
    cr_assert_eq(wtree_rename(&t, b, "deep", b, "deep", 0, &rep), 0);
    cr_assert_eq(rep, WTREE_NONE);
    cr_assert_eq(t.nodes[WTREE_ROOT].n_children, 1);
}

Test(wtree, files_sorted_by_path_numbers_by_value)
{
    uint32_t d = add(WTREE_ROOT, "d", WNODE_DIR);
    add(d, "z", WNODE_FILE);
    add(WTREE_ROOT, "d.txt", WNODE_FILE);
    add(WTREE_ROOT, "B", WNODE_FILE);
    add(d, "a", WNODE_FILE);
    add(WTREE_ROOT, "emptydir", WNODE_DIR);
    /* A DCP save of 11 ranks: __10_0 after __2_0, so chunks come in row order. */
    add(d, "__10_0.distcp", WNODE_FILE);
    add(d, "__2_0.distcp", WNODE_FILE);
    uint32_t *ids;
    size_t n;
    cr_assert_eq(wtree_files_sorted(&t, &ids, &n), 0);
    cr_assert_eq(n, 6);
    /* '.' (0x2e) sorts before '/' (0x2f); numbers by value */
    const char *want[] = {"B", "d.txt", "d/__2_0.distcp", "d/__10_0.distcp", "d/a", "d/z"};
    for (size_t i = 0; i < n; i++)
        expect_path(ids[i], want[i]);
    free(ids);
}

Test(wtree, many_entries_in_one_directory)
{
    char name[32];
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "f%05d", i);
        add(WTREE_ROOT, name, WNODE_FILE);
    }
    uint32_t out;
    for (int i = 0; i < 20000; i += 2) {
        snprintf(name, sizeof name, "f%05d", i);
        cr_assert_eq(wtree_remove(&t, WTREE_ROOT, name, 0, &out), 0);
    }
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "f%05d", i);
        cr_assert_eq(wtree_lookup(&t, WTREE_ROOT, name) != WTREE_NONE, i % 2 == 1, "%s", name);
    }
    cr_assert_eq(t.nodes[WTREE_ROOT].n_children, 10000);
}

Test(wtree, paths_must_fit_a_pack)
{
    char name[300];
    memset(name, 'n', 200);
    name[200] = '\0';
    uint32_t dir = WTREE_ROOT, out;
    int depth = 0, rc;
    while ((rc = wtree_add(&t, dir, name, WNODE_DIR, 0755, 0, 0, 0, &out)) == 0) {
        dir = out;
        depth++;
    }
    cr_assert_eq(rc, -ENAMETOOLONG);
    cr_assert_eq(depth, 20); /* 20 * 201 - 1 = 4019 fits, 21 would not */
    memset(name, 'n', 255);
    name[255] = '\0';
    cr_assert_eq(wtree_add(&t, WTREE_ROOT, name, WNODE_FILE, 0, 0, 0, 0, &out), 0);
    strcat(name, "x");
    cr_assert_eq(wtree_add(&t, WTREE_ROOT, name, WNODE_FILE, 0, 0, 0, 0, &out), -ENAMETOOLONG);
}

/* Renaming a directory moves everything below it: a rename that would
 * make a path below it too long for a pack is refused like an add, not
 * left for the next load of the saved namespace to find. */
Test(wtree, rename_keeps_paths_below_within_a_pack)
{
    char name[300];
    memset(name, 'n', 200);
    name[200] = '\0';
    uint32_t top = add(WTREE_ROOT, name, WNODE_DIR), dir = top;
    for (int i = 1; i < 20; i++)
        dir = add(dir, name, WNODE_DIR); /* 20 * 201 - 1 = 4019 bytes */
    memset(name, 'f', 70);
    name[70] = '\0';
    uint32_t leaf = add(dir, name, WNODE_FILE); /* 4090 */
    uint32_t replaced;
    memset(name, 'm', 255);
    name[255] = '\0';
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, t.nodes[top].name, WTREE_ROOT, name, 0, &replaced),
                 -ENAMETOOLONG, "a path below would be 4145 bytes");
    name[205] = '\0';
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, t.nodes[top].name, WTREE_ROOT, name, 0, &replaced), 0,
                 "4095 bytes fit");
    char buf[WTREE_PATH_MAX + 1];
    cr_assert_eq(wtree_path(&t, leaf, buf, sizeof buf), 0);
    cr_assert_eq(strlen(buf), WTREE_PATH_MAX);
    /* Moving it one level down does not fit either. */
    uint32_t sub = add(WTREE_ROOT, "d", WNODE_DIR);
    cr_assert_eq(wtree_rename(&t, WTREE_ROOT, name, sub, name, 0, &replaced), -ENAMETOOLONG);
    expect_path(sub, "d");
}
