/* The S3 store's chunk cache on disk (core/src/store/s3_cache.c): ranges
 * come back byte-identical and are counted as hits; a file that is
 * truncated, extended or has a flipped bit is a miss and never returned,
 * and a later put replaces it; a part of a readahead segment is served
 * from the segment's file (the direct-I/O path, with an aligned buffer,
 * and the buffered one), reading only the blocks that hold it, and a part
 * across two segments from both; another ETag never reads an older version's
 * bytes; the directory stays under its bound. The mount's use of it
 * against a real gateway is tests/integration/test_s3_mount.sh. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/s3.h"
#include "testutil.h"

TU_TMPDIR_SUITE(s3_cache);

#define SEG (4u << 20)

static void fill(uint8_t *buf, size_t len, uint64_t off)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)((off + i) * 13 + (off + i) / 997);
}

static s3_cache *open_cache(uint64_t max_bytes)
{
    s3_cache *c;
    ckpt_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/cache", dir);
    cr_assert_eq(s3_cache_open(path, max_bytes, &c, &err), 0, "%s", err.msg);
    return c;
}

static void tag_of(const char *etag, char tag[S3_CACHE_TAG_LEN])
{
    cr_assert_eq(s3_cache_tag("bkt", "p/x.tpack", etag, tag), 0);
}

/* The file of one entry, as s3_cache.c names it. */
static void entry_path(const char *tag, uint64_t off, size_t len, char out[4096])
{
    snprintf(out, 4096, "%s/cache/%s-%llx-%zx", dir, tag, (unsigned long long)off, len);
}

static ckpt_store_cache_stats stats(s3_cache *c)
{
    ckpt_store_cache_stats st = {0};
    s3_cache_stats(c, &st);
    return st;
}

Test(s3_cache, a_range_comes_back_and_is_counted)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t in[70000], out[70000];
    fill(in, sizeof in, 12345);
    cr_assert_eq(s3_cache_get(c, tag, 12345, out, sizeof out, 0, 0), 0);
    s3_cache_put(c, tag, 12345, in, sizeof in);
    memset(out, 0, sizeof out);
    cr_assert_eq(s3_cache_get(c, tag, 12345, out, sizeof out, 0, 0), 1);
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    /* The same offset with another length is another range. */
    cr_assert_eq(s3_cache_get(c, tag, 12345, out, 4096, 0, 0), 0);
    ckpt_store_cache_stats st = stats(c);
    cr_assert_eq(st.hits, 1);
    cr_assert_eq(st.misses, 2);
    cr_assert_eq(st.hit_bytes, sizeof in);
    cr_assert_eq(st.miss_bytes, sizeof in);
    cr_assert_geq(st.stored_bytes, sizeof in);
    s3_cache_free(c);
}

/* Each damage to the file of a cached range, then: a miss, buf left to
 * the caller's GET, and the put after it makes the range a hit again. */
static void damaged_is_a_miss(void (*damage)(const char *path, size_t len))
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN], path[4096];
    tag_of("\"e1\"", tag);
    size_t len = 100000;
    uint8_t *in = malloc(len), *out = malloc(len);
    fill(in, len, 0);
    s3_cache_put(c, tag, 0, in, len);
    entry_path(tag, 0, len, path);
    damage(path, len);
    cr_assert_eq(s3_cache_get(c, tag, 0, out, len, 0, 0), 0, "a damaged file was served");
    cr_assert_eq(stats(c).misses, 1);
    s3_cache_put(c, tag, 0, in, len);
    cr_assert_eq(s3_cache_get(c, tag, 0, out, len, 0, 0), 1, "the put did not replace it");
    cr_assert_eq(memcmp(in, out, len), 0);
    free(in);
    free(out);
    s3_cache_free(c);
}

static void truncate_to_len(const char *path, size_t len)
{
    cr_assert_eq(truncate(path, (off_t)len), 0); /* the trailer gone */
}
static void truncate_half(const char *path, size_t len)
{
    cr_assert_eq(truncate(path, (off_t)len / 2), 0);
}
static void extend(const char *path, size_t len)
{
    FILE *f = fopen(path, "ab");
    cr_assert_not_null(f);
    fputc('x', f);
    fclose(f);
}
static void flip_byte(const char *path, size_t len)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)len / 3, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, (long)len / 3, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
}
static void flip_crc(const char *path, size_t len)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)len + 5, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, (long)len + 5, SEEK_SET);
    fputc(ch ^ 1, f);
    fclose(f);
}
static void unlink_it(const char *path, size_t len)
{
    cr_assert_eq(unlink(path), 0);
}

Test(s3_cache, a_truncated_file_is_a_miss)
{
    damaged_is_a_miss(truncate_to_len);
    damaged_is_a_miss(truncate_half);
}
Test(s3_cache, an_extended_file_is_a_miss)
{
    damaged_is_a_miss(extend);
}
Test(s3_cache, a_flipped_bit_is_a_miss)
{
    damaged_is_a_miss(flip_byte);
    damaged_is_a_miss(flip_crc);
}
Test(s3_cache, a_removed_file_is_a_miss)
{
    damaged_is_a_miss(unlink_it);
}

static int warn_calls;
static char warn_msg[8192];
static void record_warn(void *ud, const char *msg)
{
    (void)ud;
    warn_calls++;
    snprintf(warn_msg, sizeof warn_msg, "%s", msg);
}

/* A range that cannot be kept (its entry's name taken by a directory, as
 * a full or read-only file system refuses the file): still a miss, never
 * a crash, and one warning naming the directory and the cause, not one
 * per read. */
Test(s3_cache, a_put_that_fails_warns_once)
{
    s3_cache *c = open_cache(0);
    s3_cache_set_warn(c, record_warn, NULL);
    char tag[S3_CACHE_TAG_LEN], path[4096], cdir[4096];
    tag_of("\"e1\"", tag);
    uint8_t in[4096], out[4096];
    fill(in, sizeof in, 0);
    entry_path(tag, 0, sizeof in, path);
    cr_assert_eq(mkdir(path, 0700), 0);
    s3_cache_put(c, tag, 0, in, sizeof in);
    s3_cache_put(c, tag, 0, in, sizeof in);
    cr_assert_eq(s3_cache_get(c, tag, 0, out, sizeof out, 0, 0), 0);
    cr_assert_eq(warn_calls, 1, "%d warnings", warn_calls);
    snprintf(cdir, sizeof cdir, "cache directory %s/cache: ", dir);
    cr_assert_not_null(strstr(warn_msg, cdir), "%s", warn_msg);
    cr_assert_not_null(strstr(warn_msg, "(rename: Is a directory)"), "%s", warn_msg);
    /* The temporary file went with it. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "ls -A %s/cache | grep -q tmp", dir);
    cr_assert_neq(system(tmp), 0, "a temporary file was left");
    s3_cache_free(c);
}

Test(s3_cache, another_etag_is_another_object)
{
    s3_cache *c = open_cache(0);
    char t1[S3_CACHE_TAG_LEN], t2[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", t1);
    tag_of("\"e2\"", t2);
    cr_assert_str_neq(t1, t2);
    uint8_t in[4096], out[4096];
    fill(in, sizeof in, 0);
    s3_cache_put(c, t1, 0, in, sizeof in);
    cr_assert_eq(s3_cache_get(c, t2, 0, out, sizeof out, 0, 0), 0);
    char none[S3_CACHE_TAG_LEN];
    cr_assert_eq(s3_cache_tag("bkt", "p/x.tpack", "", none), -1, "no ETag, yet a tag");
    s3_cache_free(c);
}

/* A readahead segment (aligned buffer: read with O_DIRECT where the file
 * system takes it) and a chunk inside it, read from the segment's file. */
Test(s3_cache, a_part_of_a_segment_is_read_from_the_segment)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint64_t seg_off = 3ull * SEG;
    uint8_t *seg, *back;
    cr_assert_eq(posix_memalign((void **)&seg, S3_RA_ALIGN, SEG), 0);
    cr_assert_eq(posix_memalign((void **)&back, S3_RA_ALIGN, SEG), 0);
    fill(seg, SEG, seg_off);
    s3_cache_put(c, tag, seg_off, seg, SEG);
    cr_assert_eq(s3_cache_get(c, tag, seg_off, back, SEG, 0, 0), 1);
    cr_assert_eq(memcmp(seg, back, SEG), 0);
    uint8_t chunk[700001];
    uint64_t off = seg_off + 1234567;
    cr_assert_eq(s3_cache_get(c, tag, off, chunk, sizeof chunk, 0, 0), 0, "no entry of its own");
    cr_assert_eq(s3_cache_get(c, tag, off, chunk, sizeof chunk, SEG, 16ull * SEG), 1);
    cr_assert_eq(memcmp(chunk, seg + (off - seg_off), sizeof chunk), 0);
    /* Partly in a segment not cached: a miss, not a read past its end. */
    cr_assert_eq(s3_cache_get(c, tag, seg_off + SEG - 100, chunk, 200, SEG, 16ull * SEG), 0);
    ckpt_store_cache_stats st = stats(c);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.misses, 2);
    /* A damaged segment serves none of its parts. */
    char path[4096];
    entry_path(tag, seg_off, SEG, path);
    flip_byte(path, SEG);
    cr_assert_eq(s3_cache_get(c, tag, seg_off, back, SEG, 0, 0), 0);
    cr_assert_eq(s3_cache_get(c, tag, off, chunk, sizeof chunk, SEG, 16ull * SEG), 0);
    free(seg);
    free(back);
    s3_cache_free(c);
}

/* Flips one bit of the file at pos. */
static void flip_at(const char *path, long pos)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, pos, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

/* Segments 0..n-1 of an object of size bytes, put as the readahead does. */
static void put_segments(s3_cache *c, const char *tag, unsigned n, uint64_t size)
{
    uint8_t *seg;
    cr_assert_eq(posix_memalign((void **)&seg, S3_RA_ALIGN, SEG), 0);
    for (unsigned k = 0; k < n; k++) {
        uint64_t off = (uint64_t)k * SEG;
        size_t len = size - off < SEG ? (size_t)(size - off) : SEG;
        fill(seg, len, off);
        s3_cache_put(c, tag, off, seg, len);
    }
    free(seg);
}

/* A chunk across a segment boundary is in two files; it used to be a miss
 * (a GET) at every read however warm the cache (8 of 98 range reads of 60
 * random reads through the mount, 5.3 MB from the gateway). */
Test(s3_cache, a_range_across_two_segments_is_read_from_both)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint64_t size = 2ull * SEG + 5000; /* the last segment is short */
    put_segments(c, tag, 3, size);
    size_t len = 1000003;
    uint8_t *out = malloc(len), *want = malloc(len);
    uint64_t off = SEG - 400001;
    fill(want, len, off);
    cr_assert_eq(s3_cache_get(c, tag, off, out, len, SEG, size), 1);
    cr_assert_eq(memcmp(out, want, len), 0);
    /* Into the short last segment, up to the object's end. */
    off = size - 70000;
    fill(want, 70000, off);
    cr_assert_eq(s3_cache_get(c, tag, off, out, 70000, SEG, size), 1);
    cr_assert_eq(memcmp(out, want, 70000), 0);
    cr_assert_eq(s3_cache_get(c, tag, off, out, 70001, SEG, size), 0, "past the end");
    ckpt_store_cache_stats st = stats(c);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.hit_bytes, 1000003 + 70000);
    /* Damage in the second file's part: a miss, not half a range. */
    char path[4096];
    entry_path(tag, SEG, SEG, path);
    flip_at(path, 1000);
    cr_assert_eq(s3_cache_get(c, tag, SEG - 400001, out, len, SEG, size), 0);
    free(out);
    free(want);
    s3_cache_free(c);
}

/* What this process has read so far (read(2) and pread(2) bytes). */
static uint64_t bytes_read(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    cr_assert_not_null(f);
    unsigned long long n = 0;
    cr_assert_eq(fscanf(f, "rchar: %llu", &n), 1);
    fclose(f);
    return n;
}

/* A part of a segment reads its own 64 KiB blocks and their CRCs, not the
 * whole 4 MiB file (which made a warm random read from cache_dir slower
 * than one GET), and still serves no byte whose block fails its CRC:
 * a flipped bit in a block read, or in its CRC, is a miss. */
Test(s3_cache, a_part_of_a_segment_reads_only_its_blocks)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN], path[4096];
    tag_of("\"e1\"", tag);
    uint64_t size = 3ull * SEG;
    put_segments(c, tag, 3, size);
    uint8_t out[65536], want[65536];
    uint64_t off = SEG + 100000; /* blocks 1 and 2 of segment 1 */
    fill(want, sizeof want, off);
    uint64_t before = bytes_read();
    cr_assert_eq(s3_cache_get(c, tag, off, out, sizeof out, SEG, size), 1);
    uint64_t read = bytes_read() - before;
    cr_assert_eq(memcmp(out, want, sizeof out), 0);
    cr_assert_leq(read, 2 * 65536 + 4096, "%llu bytes read for 64 KiB", (unsigned long long)read);
    entry_path(tag, SEG, SEG, path);
    flip_at(path, 3 * 65536); /* a block not read: the part is still served */
    cr_assert_eq(s3_cache_get(c, tag, off, out, sizeof out, SEG, size), 1);
    cr_assert_eq(memcmp(out, want, sizeof out), 0);
    flip_at(path, 65536 + 5); /* the head of block 1, before the range */
    cr_assert_eq(s3_cache_get(c, tag, off, out, sizeof out, SEG, size), 0);
    flip_at(path, 65536 + 5); /* undone; now block 2's CRC */
    cr_assert_eq(s3_cache_get(c, tag, off, out, sizeof out, SEG, size), 1);
    flip_at(path, (long)SEG + 4 * 2 + 1);
    cr_assert_eq(s3_cache_get(c, tag, off, out, sizeof out, SEG, size), 0);
    s3_cache_free(c);
}

Test(s3_cache, the_directory_stays_under_its_bound)
{
    uint64_t max = 1u << 20;
    s3_cache *c = open_cache(max);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t buf[64 << 10];
    for (unsigned i = 0; i < 64; i++) {
        fill(buf, sizeof buf, (uint64_t)i << 16);
        s3_cache_put(c, tag, (uint64_t)i << 16, buf, sizeof buf);
        cr_assert_leq(stats(c).stored_bytes, max, "%llu bytes held after %u puts",
                      (unsigned long long)stats(c).stored_bytes, i + 1);
    }
    /* A range over a quarter of the bound is never kept. */
    uint8_t *big = calloc(1, max / 2);
    s3_cache_put(c, tag, 1ull << 30, big, max / 2);
    cr_assert_eq(s3_cache_get(c, tag, 1ull << 30, big, max / 2, 0, 0), 0);
    free(big);
    s3_cache_free(c);
}

/* What the cache directory holds, counted from the files themselves. */
static uint64_t dir_bytes(void)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "du -sb --apparent-size %s/cache", dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    unsigned long long n = 0;
    cr_assert_eq(fscanf(p, "%llu", &n), 1);
    pclose(p);
    return n;
}

/* A mount reopening a directory filled under a larger bound (or by other
 * processes meanwhile) brings it under its own at once, not at its first
 * miss: one that only hits would otherwise keep it over for good. */
Test(s3_cache, a_directory_over_the_bound_is_trimmed_when_opened)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t buf[64 << 10];
    for (unsigned i = 0; i < 16; i++) {
        fill(buf, sizeof buf, (uint64_t)i << 16);
        s3_cache_put(c, tag, (uint64_t)i << 16, buf, sizeof buf);
        /* Puts within one clock tick share an mtime: set an order. */
        char path[4096];
        entry_path(tag, (uint64_t)i << 16, sizeof buf, path);
        struct timespec t[2] = {{1000000 + i, 0}, {1000000 + i, 0}};
        cr_assert_eq(utimensat(AT_FDCWD, path, t, 0), 0);
    }
    s3_cache_free(c);
    cr_assert_gt(dir_bytes(), 1u << 20);
    uint64_t max = 256u << 10;
    c = open_cache(max);
    cr_assert_leq(dir_bytes(), max, "%llu bytes in the directory", (unsigned long long)dir_bytes());
    cr_assert_leq(stats(c).stored_bytes, max);
    /* The most recently used survive. */
    cr_assert_eq(s3_cache_get(c, tag, 15u << 16, buf, sizeof buf, 0, 0), 1);
    s3_cache_free(c);
}

/* Two mounts sharing the directory (two handles here): each counts only
 * its own puts between scans, so before they rescanned every tenth of the
 * bound the directory grew to twice its bound before either evicted. */
Test(s3_cache, a_shared_directory_stays_near_its_bound)
{
    uint64_t max = 1u << 20, peak = 0;
    s3_cache *a = open_cache(max), *b = open_cache(max);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t buf[64 << 10];
    for (unsigned i = 0; i < 64; i++) {
        fill(buf, sizeof buf, (uint64_t)i << 16);
        s3_cache_put(i % 2 ? b : a, tag, (uint64_t)i << 16, buf, sizeof buf);
        uint64_t n = dir_bytes();
        peak = n > peak ? n : peak;
    }
    cr_assert_leq(peak, max + max / 2, "the directory held %llu bytes for a bound of %llu",
                  (unsigned long long)peak, (unsigned long long)max);
    s3_cache_free(a);
    s3_cache_free(b);
}

/* A process killed in a put (SIGKILL, a crash) leaves its temporary file,
 * up to a 4 MiB segment, outside the count: the next open removes it once
 * it is old enough that no put can still be writing it. */
Test(s3_cache, a_killed_puts_temporary_file_is_removed)
{
    s3_cache *c = open_cache(0);
    s3_cache_free(c);
    char stale[4096], fresh[4096];
    snprintf(stale, sizeof stale, "%s/cache/.tmp.99999.1", dir);
    snprintf(fresh, sizeof fresh, "%s/cache/.tmp.99999.2", dir);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? fresh : stale, "wb");
        cr_assert_not_null(f);
        fputs("part of a segment", f);
        fclose(f);
    }
    struct timespec t[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, stale, t, 0), 0);
    c = open_cache(0);
    cr_assert_neq(access(stale, F_OK), 0, "an hour-old temporary file is still there");
    cr_assert_eq(access(fresh, F_OK), 0, "a put's temporary file in use was removed");
    s3_cache_free(c);
}

/* The disk bytes (st_blocks) of the directory's regular files, entries and
 * temporary files alike. */
static uint64_t disk_bytes_now(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/cache", dir);
    DIR *d = opendir(path);
    cr_assert_not_null(d);
    uint64_t n = 0;
    struct dirent *de;
    struct stat st;
    while ((de = readdir(d)))
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            n += (uint64_t)st.st_blocks * 512;
    closedir(d);
    return n;
}

/* The bound is on what the disk holds: an index entry of 300 bytes takes
 * a 4 KiB block, and a count of sizes let a directory of small entries
 * take 13 times its bound. */
Test(s3_cache, the_count_is_of_disk_blocks)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t buf[300];
    for (unsigned i = 0; i < 20; i++) {
        fill(buf, sizeof buf, i * 1000);
        s3_cache_put(c, tag, i * 1000, buf, sizeof buf);
    }
    cr_assert_eq(stats(c).stored_bytes, disk_bytes_now(), "counted %llu, the disk holds %llu",
                 (unsigned long long)stats(c).stored_bytes, (unsigned long long)disk_bytes_now());
    s3_cache_free(c);
    c = open_cache(0);
    cr_assert_eq(stats(c).stored_bytes, disk_bytes_now());
    s3_cache_free(c);
}

/* A damaged file replaced by the next put was counted once more, until the
 * next scan. */
Test(s3_cache, a_replaced_file_is_counted_once)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN], path[4096];
    tag_of("\"e1\"", tag);
    size_t len = 100000;
    uint8_t *in = malloc(len), *out = malloc(len);
    fill(in, len, 0);
    s3_cache_put(c, tag, 0, in, len);
    uint64_t once = stats(c).stored_bytes;
    entry_path(tag, 0, len, path);
    flip_byte(path, len);
    cr_assert_eq(s3_cache_get(c, tag, 0, out, len, 0, 0), 0);
    s3_cache_put(c, tag, 0, in, len);
    cr_assert_eq(stats(c).stored_bytes, once, "%llu counted after the replacement, %llu before",
                 (unsigned long long)stats(c).stored_bytes, (unsigned long long)once);
    cr_assert_eq(stats(c).stored_bytes, disk_bytes_now());
    free(in);
    free(out);
    s3_cache_free(c);
}

struct putter {
    s3_cache *c;
    const char *tag;
    unsigned first;
};

static void *putter_run(void *arg)
{
    struct putter *p = arg;
    uint8_t *buf = malloc(SEG);
    for (unsigned i = p->first; i < p->first + 8; i++) {
        fill(buf, SEG, (uint64_t)i * SEG);
        s3_cache_put(p->c, p->tag, (uint64_t)i * SEG, buf, SEG);
    }
    free(buf);
    return NULL;
}

static int putting;
static void *watch_disk(void *arg)
{
    uint64_t *peak = arg;
    while (__atomic_load_n(&putting, __ATOMIC_RELAXED)) {
        uint64_t n = disk_bytes_now();
        *peak = n > *peak ? n : *peak;
    }
    return NULL;
}

/* The readahead's threads keep several 4 MiB segments at once: each was
 * counted only once written, and a scan brought the count to 90% while
 * the others were still writing, so a directory bounded at 20 MB held
 * 24.6 MB in a mount. What is written and what is being written now stay
 * under the bound together. */
Test(s3_cache, concurrent_puts_stay_under_the_bound)
{
    uint64_t max = 20u << 20, peak = 0;
    s3_cache *c = open_cache(max);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    pthread_t w, t[6];
    struct putter p[6];
    putting = 1;
    cr_assert_eq(pthread_create(&w, NULL, watch_disk, &peak), 0);
    for (unsigned i = 0; i < 6; i++) {
        p[i] = (struct putter){c, tag, i * 8};
        cr_assert_eq(pthread_create(&t[i], NULL, putter_run, &p[i]), 0);
    }
    for (unsigned i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    __atomic_store_n(&putting, 0, __ATOMIC_RELAXED);
    pthread_join(w, NULL);
    cr_assert_leq(peak, max, "the directory held %llu bytes for a bound of %llu",
                  (unsigned long long)peak, (unsigned long long)max);
    cr_assert_leq(stats(c).stored_bytes, max);
    cr_assert_gt(stats(c).stored_bytes, max / 2, "the cache kept little: %llu bytes",
                 (unsigned long long)stats(c).stored_bytes);
    s3_cache_free(c);
}

/* A readahead segment whose chunks were kept one by one (read before the
 * readahead started) is filled from their entries, a chunk across its end
 * included; only what none holds is left to fetch, and a damaged chunk
 * entry is among it, never served. */
Test(s3_cache, a_segment_is_filled_from_the_entries_of_its_chunks)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN], path[4096];
    tag_of("\"e1\"", tag);
    uint8_t *in = malloc(2 * SEG), *out = malloc(SEG);
    fill(in, 2 * SEG, 0);
    /* Chunks [0, 1M) [1M, 2.5M) and [3.5M, 5M), across the segment's end. */
    uint64_t at[] = {0, 1u << 20, 7u << 19}, len[] = {1u << 20, 3u << 19, 3u << 19};
    for (int i = 0; i < 3; i++)
        s3_cache_put(c, tag, at[i], in + at[i], len[i]);
    s3_span gap;
    size_t n;
    memset(out, 0, SEG);
    cr_assert_eq(s3_cache_fill_gaps(c, tag, 0, out, SEG, &gap, 1, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(gap.off, 5u << 19);
    cr_assert_eq(gap.len, 1u << 20, "%zu bytes to fetch", gap.len);
    cr_assert_eq(memcmp(out, in, 5u << 19), 0);
    cr_assert_eq(memcmp(out + (7u << 19), in + (7u << 19), 1u << 19), 0);
    /* Once the gap is held as well, the segment is all the cache's. */
    s3_cache_put(c, tag, 5u << 19, in + (5u << 19), 1u << 20);
    memset(out, 0, SEG);
    cr_assert_eq(s3_cache_fill_gaps(c, tag, 0, out, SEG, &gap, 1, &n), 1);
    cr_assert_eq(n, 0);
    cr_assert_eq(memcmp(out, in, SEG), 0);
    /* A flipped byte in the second chunk: its part is fetched again. */
    entry_path(tag, 1u << 20, 3u << 19, path);
    flip_byte(path, 3u << 19);
    cr_assert_eq(s3_cache_fill_gaps(c, tag, 0, out, SEG, &gap, 1, &n), 0);
    cr_assert_eq(gap.off, 1u << 20);
    cr_assert_eq(gap.len, 3u << 19);
    ckpt_store_cache_stats st = stats(c);
    cr_assert_eq(st.hits, 1);
    cr_assert_eq(st.misses, 2);
    free(in);
    free(out);
    s3_cache_free(c);
}

/* The spans a segment lacks, one by one: a chunk before those a stream
 * read (another file's, never read) is a span of its own, not the start
 * of one that takes in the chunks held after it; past max, the last span
 * takes in the rest. */
Test(s3_cache, the_gaps_a_segment_lacks_are_told_one_by_one)
{
    s3_cache *c = open_cache(0);
    char tag[S3_CACHE_TAG_LEN];
    tag_of("\"e1\"", tag);
    uint8_t *in = malloc(SEG), *out = malloc(SEG);
    fill(in, SEG, 0);
    /* Held: [64K, 1M) and [2M, 3M); lacking: [0, 64K), [1M, 2M), [3M, 4M). */
    s3_cache_put(c, tag, 64u << 10, in + (64u << 10), (1u << 20) - (64u << 10));
    s3_cache_put(c, tag, 2u << 20, in + (2u << 20), 1u << 20);
    s3_span g[3];
    size_t n;
    memset(out, 0, SEG);
    cr_assert_eq(s3_cache_fill_gaps(c, tag, 0, out, SEG, g, 3, &n), 0);
    cr_assert_eq(n, 3);
    uint64_t want[3][2] = {{0, 64u << 10}, {1u << 20, 1u << 20}, {3u << 20, SEG - (3u << 20)}};
    for (size_t i = 0; i < 3; i++)
        cr_assert(g[i].off == want[i][0] && g[i].len == want[i][1], "gap %zu: %llu+%zu", i,
                  (unsigned long long)g[i].off, g[i].len);
    cr_assert_eq(memcmp(out + (64u << 10), in + (64u << 10), (1u << 20) - (64u << 10)), 0);
    cr_assert_eq(memcmp(out + (2u << 20), in + (2u << 20), 1u << 20), 0);
    /* Two at most: the second runs to the last byte lacking. */
    cr_assert_eq(s3_cache_fill_gaps(c, tag, 0, out, SEG, g, 2, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert(g[1].off == 1u << 20 && g[1].len == SEG - (1u << 20), "%llu+%zu",
              (unsigned long long)g[1].off, g[1].len);
    free(in);
    free(out);
    s3_cache_free(c);
}
