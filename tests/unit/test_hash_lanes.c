/* Big files packed from disk are hashed by hash lanes that read them again
 * (core/src/hash_lanes.h): the digests must be those of the bytes packed,
 * and a file whose second read differs must fail the pack, not get a wrong
 * digest. */
#include "testutil.h"
#include "ckpt.h"
#include "writer.h"

#include <fcntl.h>
#include <unistd.h>

static char *dir;
static void setup(void)
{
    dir = tu_mkdtemp();
}
static void teardown(void)
{
    tu_rm_rf(dir);
    free(dir);
}
TestSuite(hash_lanes, .init = setup, .fini = teardown);

#define BIG (20u << 20) /* above the writer's lane threshold */

static char *big_file(const char *name, uint32_t seed, uint8_t **bytes)
{
    char *path = tu_join(dir, name);
    uint8_t *b = malloc(BIG);
    tu_fill_pattern(b, BIG, seed);
    tu_write_file(path, b, BIG);
    *bytes = b;
    return path;
}

Test(hash_lanes, several_big_files_get_their_own_digests)
{
    uint8_t *a, *b, want[32];
    char *pa = big_file("a.bin", 1, &a), *pb = big_file("b.bin", 2, &b);
    char *pack = tu_join(dir, "p.tpack");
    ckpt_write_opts o = {.level = 1, .threads = 3};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_path(w, "a.bin", pa, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_add_path(w, "b.bin", pb, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), 0, "%s", e.msg);
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(pack, NULL, &p, &e), 0, "%s", e.msg);
    tu_sha256(a, BIG, want);
    cr_assert_arr_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "a.bin"))->sha256, want, 32);
    tu_sha256(b, BIG, want);
    cr_assert_arr_eq(ckpt_file_at(p, (size_t)ckpt_file_find(p, "b.bin"))->sha256, want, 32);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(a);
    free(b);
    free(pa);
    free(pb);
    free(pack);
}

/* The lane is pointed at another file of the same size: what it reads is
 * not what was packed, as when a file changes between the two reads. */
Test(hash_lanes, a_second_read_that_differs_fails_the_pack)
{
    uint8_t *a, *b, *buf = malloc(BIG);
    char *pa = big_file("a.bin", 1, &a), *pb = big_file("b.bin", 2, &b);
    char *pack = tu_join(dir, "p.tpack");
    ckpt_write_opts o = {.level = 1, .threads = 2};
    ckpt_writer *w;
    ckpt_err e = {0};
    cr_assert_eq(ckpt_writer_open(pack, NULL, &o, &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_begin_file(w, "a.bin", 0644, 0, 0, &e), 0, "%s", e.msg);
    int other = open(pb, O_RDONLY);
    cr_assert_eq(writer_file_rehash(w, other, BIG), 1, "a big file goes to a lane");
    close(other); /* the lane has its own descriptor */
    cr_assert_eq(ckpt_writer_write(w, a, BIG, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_end_file(w, &e), 0, "%s", e.msg);
    cr_assert_eq(ckpt_writer_finish(w, NULL, &e), -EAGAIN, "%s", e.msg);
    tu_assert_contains(e.msg, "changed while being packed");
    cr_assert_eq(access(pack, F_OK), -1, "no pack is left");
    free(a);
    free(b);
    free(buf);
    free(pa);
    free(pb);
    free(pack);
}
