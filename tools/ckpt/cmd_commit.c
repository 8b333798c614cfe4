/* `ckpt commit MOUNT/NAME [--wait]`: ask the ckptfs daemon to pack a
 * checkpoint written into the mount (by setting user.ckptfs.commit on its
 * directory), and with --wait follow it until it is committed. */
#include "cli.h"
#include "ckpt_mount.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>

/* A look costs a few getxattr round trips (tens of microseconds); at
 * 0.1 s the wait itself added 5-9% to the packing of a 600 MB checkpoint
 * (about a second), so --wait looks often. */
#define POLL_SECONDS 0.02

static const char commit_help[] =
    "usage: ckpt commit MOUNT/NAME [--wait]\n"
    "\n"
    "Commits a checkpoint written into a ckptfs mount: it is packed in the\n"
    "background into BACKING/NAME.tpack (writing into it later reopens it, and it\n"
    "is packed again once quiet). Without --wait the command returns once packing\n"
    "has started.\n"
    "\n"
    "A checkpoint that failed (disk full, a damaged file) keeps its staged data;\n"
    "committing it again retries. Committing a committed checkpoint does nothing.\n"
    "\n"
    "options:\n"
    "  -w, --wait     wait until it is committed, with a progress bar on a terminal;\n"
    "                 exit status 1 if packing fails\n"
    "  -q, --quiet    print nothing on success\n"
    "  -h, --help     show this help\n";

struct commit_opts {
    const char *path;
    int wait, quiet;
};

static int parse_commit_opts(int argc, char **argv, struct commit_opts *o)
{
    static const struct option opts[] = {
        {"wait", no_argument, NULL, 'w'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "wqh", opts, NULL)) != -1) {
        switch (c) {
        case 1:
            if (o->path)
                return cli_usage_error("commit", "unexpected argument '%s'", optarg);
            o->path = optarg;
            break;
        case 'w':
            o->wait = 1;
            break;
        case 'q':
            o->quiet = 1;
            break;
        case 'h':
            fputs(commit_help, stdout);
            return -1;
        default:
            return cli_bad_option("commit", c, argv);
        }
    }
    if (optind < argc && !o->path)
        o->path = argv[optind++];
    if (optind < argc)
        return cli_usage_error("commit", "unexpected argument '%s'", argv[optind]);
    if (!o->path)
        return cli_usage_error("commit", "missing MOUNT/NAME");
    return 0;
}

static void sleep_seconds(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Follows the checkpoint until it is committed or failed. */
static int wait_committed(const struct commit_opts *o)
{
    progress pg;
    progress_start(&pg, "packing", 0);
    mount_state st;
    int rc;
    for (;;) {
        rc = mount_state_read(o->path, &st);
        if (rc || strcmp(st.state, CKPT_STATE_PACKING) != 0)
            break;
        /* A commit waits its turn while another checkpoint is packed. */
        pg.label = st.done == 0 && st.seconds == 0 ? "queued " : "packing";
        progress_set(&pg, st.done, st.total);
        sleep_seconds(POLL_SECONDS);
    }
    progress_end(&pg);
    if (rc)
        return cli_fail("%s: %s", o->path, mount_state_why(rc));
    if (strcmp(st.state, CKPT_STATE_COMMITTED) == 0) {
        if (!o->quiet) {
            char size[16];
            printf("%s: committed (%s packed)\n", o->path,
                   cli_fmt_bytes(st.size, size, sizeof size));
        }
        return EXIT_OK;
    }
    if (strcmp(st.state, CKPT_STATE_FAILED) == 0)
        return cli_fail("%s: packing failed: %s (staged data is kept; fix the cause and run "
                        "'ckpt commit' again)",
                        o->path, st.error[0] ? st.error : "no reason recorded");
    if (strcmp(st.state, CKPT_STATE_UNREACHABLE) == 0)
        return cli_fail("%s: packed, but its store does not answer now: %s", o->path,
                        st.error[0] ? st.error : "no reason recorded");
    if (strcmp(st.state, CKPT_STATE_KEY_MISMATCH) == 0 || strcmp(st.state, CKPT_STATE_DAMAGED) == 0)
        return cli_fail("%s: packed, but the pack cannot be read (%s): %s", o->path, st.state,
                        st.error[0] ? st.error : "no reason recorded");
    /* Writing again: someone wrote into it after the commit failed. */
    return cli_fail("%s: not committed: it is %s again", o->path, st.state);
}

int cmd_commit(int argc, char **argv)
{
    struct commit_opts o = {0};
    int rc = parse_commit_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    /* Only on a ckptfs checkpoint: anywhere else setxattr would just
     * store the attribute. */
    mount_state st0;
    rc = mount_state_read(o.path, &st0);
    if (rc)
        return cli_fail("%s: %s", o.path, mount_state_why(rc));
    if (setxattr(o.path, CKPT_XATTR_COMMIT, "1", 1, 0) != 0) {
        int e = errno;
        mount_state st;
        if (e == EACCES && mount_state_read(o.path, &st) == 0 && st.error[0])
            return cli_fail("%s: cannot commit: %s", o.path, st.error);
        if (e == EACCES)
            return cli_fail("%s: cannot commit: its staged data cannot be read with the mount's "
                            "key (remount with the key it was written with)",
                            o.path);
        if (e == ENOTSUP || e == EROFS || e == EPERM)
            return cli_fail("%s: not a checkpoint directory of a writable ckptfs mount", o.path);
        if (e == EBUSY)
            return cli_fail("%s: cannot commit: it was written to while committing, so it is "
                            "writing again (it commits on its own once quiet; or commit again "
                            "once its writer is done)",
                            o.path);
        return cli_fail("%s: cannot commit: %s", o.path, mount_state_why(-e));
    }
    if (o.wait)
        return wait_committed(&o);
    if (!o.quiet) {
        mount_state st;
        if (mount_state_read(o.path, &st) == 0)
            printf("%s: %s\n", o.path, st.state);
    }
    return EXIT_OK;
}
