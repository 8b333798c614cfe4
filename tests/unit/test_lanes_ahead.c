/* The window of core/src/lanes_ahead.h over the files a writer will add,
 * with callbacks of the test's own: which files get their lanes queued
 * ahead, within AHEAD_FILES files and AHEAD_BYTES bytes, and that a file's
 * bytes leave the window when its slot is taken or left behind. The jobs
 * are never run: the window only hands them on. */
#include "testutil.h"
#include "lanes_ahead.h"
#include "writer.h"

#define GIB (1ull << 30)

typedef struct files {
    const uint64_t *size;
    int queued[64]; /* the files queued, in order */
    int n_queued;
    int full;  /* the file whose queue answers "lanes full" once, or -1 */
    int fd_of; /* the file whose slot gets a descriptor (fd), or -1 */
    int fd;
} files;

static int job_mark; /* the jobs' address: the window never looks into one */

static uint64_t files_size(void *ud, size_t i)
{
    return ((files *)ud)->size[i];
}

static int files_queue(void *ud, size_t i, ahead_slot *s)
{
    files *f = ud;
    if (f->full == (int)i) {
        f->full = -1;
        return -1;
    }
    if (f->fd_of == (int)i)
        s->fd = f->fd;
    s->job = (struct hash_job *)&job_mark;
    f->queued[f->n_queued++] = (int)i;
    return 1;
}

/* 2 GiB files: two at a time are within the byte bound, and a file's
 * bytes leave the window when it is taken or left behind. */
Test(lanes_ahead, a_files_bytes_leave_the_window_with_its_slot)
{
    const uint64_t size[] = {2 * GIB, 2 * GIB, 2 * GIB, 2 * GIB, 2 * GIB};
    files f = {.size = size, .full = -1, .fd_of = -1};
    lanes_ahead a;
    lanes_ahead_init(&a, 5, files_size, files_queue, &f);
    ahead_slot s = lanes_ahead_next(&a, 0);
    cr_assert_eq(f.n_queued, 2, "files 0 and 1 (%d queued)", f.n_queued);
    cr_assert_eq(s.job, (struct hash_job *)&job_mark, "file 0 takes its job");
    /* File 1 left out: with file 0 taken, both leave room. */
    s = lanes_ahead_next(&a, 2);
    cr_assert_eq(f.n_queued, 4, "files 2 and 3 too (%d queued)", f.n_queued);
    cr_assert_eq(f.queued[2], 2);
    cr_assert_eq(f.queued[3], 3);
    cr_assert_eq(s.job, (struct hash_job *)&job_mark, "file 2 takes its job");
    /* File 3 left out too. */
    s = lanes_ahead_next(&a, 4);
    cr_assert_eq(f.n_queued, 5, "file 4 too (%d queued)", f.n_queued);
    cr_assert_eq(s.job, (struct hash_job *)&job_mark, "file 4 takes its job");
    lanes_ahead_end(&a);
}

/* One file over the byte bound still goes ahead, alone; small files never
 * do; the window holds AHEAD_FILES files, the one being added among
 * them. */
Test(lanes_ahead, the_window_is_bounded_in_files_not_for_one_big_file)
{
    uint64_t size[AHEAD_FILES + 3];
    size[0] = 5 * GIB;
    size[1] = WRITER_LANE_MIN_BYTES - 1;
    for (size_t i = 2; i < AHEAD_FILES + 3; i++)
        size[i] = WRITER_LANE_MIN_BYTES;
    files f = {.size = size, .full = -1, .fd_of = -1};
    lanes_ahead a;
    lanes_ahead_init(&a, AHEAD_FILES + 3, files_size, files_queue, &f);
    ahead_slot s = lanes_ahead_next(&a, 0);
    cr_assert_eq(f.n_queued, 1, "the 5 GiB file goes alone");
    cr_assert_eq(s.job, (struct hash_job *)&job_mark);
    s = lanes_ahead_next(&a, 1);
    cr_assert_eq(f.n_queued, AHEAD_FILES, "and files 2 to %d (%d queued)", AHEAD_FILES, f.n_queued);
    cr_assert_null(s.job, "a small file is added as usual");
    cr_assert_eq(s.fd, -1);
    lanes_ahead_next(&a, 2);
    cr_assert_eq(f.n_queued, AHEAD_FILES + 1, "file %d too, once file 2 is added", AHEAD_FILES + 1);
    lanes_ahead_end(&a);
}

/* Lanes full at file 1: the window stops there and tries it again before
 * the next file; the descriptor of a file left behind is closed. */
Test(lanes_ahead, lanes_full_is_tried_again_and_descriptors_left_behind_are_closed)
{
    const uint64_t size[] = {GIB, GIB, GIB, GIB};
    int fd = open("/dev/null", O_RDONLY);
    cr_assert_geq(fd, 0);
    files f = {.size = size, .full = 1, .fd_of = 2, .fd = fd};
    lanes_ahead a;
    lanes_ahead_init(&a, 4, files_size, files_queue, &f);
    lanes_ahead_next(&a, 0);
    cr_assert_eq(f.n_queued, 1, "lanes full at file 1: nothing past it (%d queued)", f.n_queued);
    ahead_slot s = lanes_ahead_next(&a, 1);
    cr_assert_eq(f.n_queued, 4, "file 1 again, then files 2 and 3 (%d queued)", f.n_queued);
    cr_assert_eq(f.queued[1], 1);
    cr_assert_eq(s.job, (struct hash_job *)&job_mark, "file 1 takes its job");
    cr_assert_neq(fcntl(fd, F_GETFD), -1, "file 2's slot holds its descriptor");
    s = lanes_ahead_next(&a, 3);
    cr_assert_eq(s.job, (struct hash_job *)&job_mark, "file 3 takes its job");
    cr_assert_eq(fcntl(fd, F_GETFD), -1, "file 2 left behind: its descriptor is closed");
    lanes_ahead_end(&a);
}
