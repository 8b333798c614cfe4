/* Finding what is mounted at a path in a mountinfo table
 * (fs/common/mountinfo.c): escaped paths, the optional fields before
 * "-", the topmost of stacked mounts, and nothing mounted. */
#include "testutil.h"

#include "common/mountinfo.h"

static const char table[] =
    "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
    "40 22 0:35 / /mnt/a\\040b rw,relatime shared:12 master:3 - fuse.ckptfs ckptfs rw\n"
    "41 22 0:36 / /mnt/x rw - tmpfs tmpfs rw\n"
    "42 41 0:37 / /mnt/x rw - fuse.ckptfs ckptfs rw,user_id=0\n";

Test(mountinfo, finds_the_topmost_mount)
{
    char *d = tu_mkdtemp(), *path = tu_join(d, "mountinfo"), type[64];
    tu_write_str(path, table);
    cr_assert_eq(mountinfo_fstype(path, "/mnt/a b", type, sizeof type), 1);
    cr_assert_str_eq(type, "fuse.ckptfs");
    cr_assert_eq(mountinfo_fstype(path, "/mnt/x", type, sizeof type), 1);
    cr_assert_str_eq(type, "fuse.ckptfs", "the later mount hides the tmpfs");
    cr_assert_eq(mountinfo_fstype(path, "/proc", type, sizeof type), 1);
    cr_assert_str_eq(type, "proc");
    cr_assert_eq(mountinfo_fstype(path, "/mnt", type, sizeof type), 0);
    cr_assert_eq(mountinfo_fstype(path, "/mnt/a\\040b", type, sizeof type), 0);
    free(path);
    path = tu_join(d, "missing");
    cr_assert_eq(mountinfo_fstype(path, "/", type, sizeof type), -ENOENT);
    free(path);
    tu_rm_rf(d);
    free(d);
}

Test(mountinfo, reads_this_process_table)
{
    char type[64];
    cr_assert_eq(mountinfo_fstype(MOUNTINFO_SELF, "/", type, sizeof type), 1);
}
