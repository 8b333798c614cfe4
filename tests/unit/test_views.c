/* Format version 2: regions (typed extents with no tensor of their own),
 * tensors that are views inside them (overlapping, at an offset), containers
 * and notes on files, ingest from a container's layout, and the grouping
 * chosen per chunk for opaque data. */
#include "testutil.h"
#include "ckpt.h"
#include "codec.h"
#include "format.h"
#include "pack.h"
#include "writer.h"
#include "formats/formats.h"

#include <math.h>

TU_TMPDIR_SUITE(views);

static ckpt_key *test_key(void)
{
    uint8_t k[CKPT_KEY_BYTES];
    for (unsigned i = 0; i < sizeof k; i++)
        k[i] = (uint8_t)(i * 7 + 1);
    ckpt_key *key;
    ckpt_err e;
    cr_assert_eq(ckpt_key_from_bytes(k, &key, &e), 0, "%s", e.msg);
    return key;
}

static ckpt_writer *open_writer(const char *path, const ckpt_key *key)
{
    ckpt_write_opts o = {.chunk_size = 65536, .level = -1, .key = key, .threads = 2};
    ckpt_writer *w;
    ckpt_err e;
    cr_assert_eq(ckpt_writer_open(path, NULL, &o, &w, &e), 0, "%s", e.msg);
    return w;
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        ckpt_err e_ = {0};                                                                         \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, 0, "%s: %s", #call, e_.msg);                                             \
    } while (0)
#define OKE(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, 0, "%s: rc %d: %s", #call, rc_, e.msg);                                  \
    } while (0)

/* Float-like bytes: N(0, 0.02) as float32, at any alignment. */
static void fill_f32(void *dst, size_t n, uint32_t seed)
{
    uint8_t *v8 = dst;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        double u1, u2;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        u1 = ((s >> 11) + 0.5) / 9007199254740992.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        u2 = ((s >> 11) + 0.5) / 9007199254740992.0;
        float f = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        memcpy(v8 + 4 * i, &f, 4);
    }
}

static void expect_tensor(ckpt_pack *p, const char *name, const uint8_t *want, uint64_t nbytes,
                          uint64_t file_offset)
{
    ckpt_err e = {0};
    long i = ckpt_tensor_find(p, name);
    cr_assert_geq(i, 0, "no tensor %s", name);
    const ckpt_tensor_info *t = ckpt_tensor_at(p, (size_t)i);
    cr_assert_eq(t->nbytes, nbytes, "%s: %llu bytes", name, (unsigned long long)t->nbytes);
    cr_assert_eq(t->file_offset, file_offset, "%s at %llu, want %llu", name,
                 (unsigned long long)t->file_offset, (unsigned long long)file_offset);
    uint8_t *got = malloc(nbytes + 1);
    cr_assert_eq(ckpt_tensor_pread(p, (size_t)i, got, nbytes + 1, 0, &e), (ssize_t)nbytes, "%s",
                 e.msg);
    cr_assert(memcmp(got, want, nbytes) == 0, "%s reads back different bytes", name);
    uint8_t d[32];
    tu_sha256(want, nbytes, d);
    cr_assert_arr_eq(t->sha256, d, 32, "%s: recorded sha256 differs", name);
    /* Through the file too, at the tensor's offset: what the mount does. */
    cr_assert_eq(ckpt_file_pread(p, t->file_index, got, nbytes, t->file_offset, &e),
                 (ssize_t)nbytes, "%s", e.msg);
    cr_assert(memcmp(got, want, nbytes) == 0, "%s via its file reads back different bytes", name);
    free(got);
}

/* model.bin: 100 bytes of header, a 200 KB F32 region (3+ chunks) holding
 * views "a" (at its start), "b" (overlapping a, from byte 40000), "tied"
 * (exactly a) and "tail" (ending with the region); 50 bytes of opaque gap;
 * a BF16 region with no views; a begin_tensor "t"; an opaque tail. */
enum { HDR = 100, REG = 200000, GAP = 50, REG2 = 3000, TLEN = 4096 };

typedef struct model {
    uint8_t *bytes;
    size_t len;
    uint64_t reg, reg2, t; /* file offsets */
} model;

static model make_model(void)
{
    model m;
    m.len = HDR + REG + GAP + REG2 + TLEN + 7;
    m.bytes = malloc(m.len);
    tu_fill_pattern(m.bytes, m.len, 11);
    m.reg = HDR;
    fill_f32(m.bytes + m.reg, REG / 4, 1);
    m.reg2 = m.reg + REG + GAP;
    m.t = m.reg2 + REG2;
    fill_f32(m.bytes + m.t, TLEN / 4, 2);
    return m;
}

static void write_model(ckpt_writer *w, const model *m)
{
    ckpt_err e = {0};
    uint64_t sa[2] = {100, 100}, sb[1] = {10000}, stail[1] = {1000};
    OKE(ckpt_writer_begin_file(w, "model.bin", 0644, 0, 0, &e));
    OKE(ckpt_writer_set_container(w, "torch", NULL, &e));
    OKE(ckpt_writer_write(w, m->bytes, HDR, &e));
    OKE(ckpt_writer_begin_region(w, "F32", &e));
    OKE(ckpt_writer_add_view(w, "a", "F32", 2, sa, m->reg, &e));
    OKE(ckpt_writer_add_view(w, "b", "F32", 1, sb, m->reg + 40000, &e));
    OKE(ckpt_writer_add_view(w, "tied", "F32", 2, sa, m->reg, &e));
    OKE(ckpt_writer_add_view(w, "tail", "I32", 1, stail, m->reg + REG - 4000, &e));
    /* Odd-sized pieces, so chunk and call boundaries fall inside views. */
    for (size_t off = 0; off < REG;) {
        size_t n = REG - off < 12345 ? REG - off : 12345;
        OKE(ckpt_writer_tensor_data(w, m->bytes + m->reg + off, n, &e));
        off += n;
    }
    OKE(ckpt_writer_end_region(w, &e));
    OKE(ckpt_writer_write(w, m->bytes + m->reg + REG, GAP, &e));
    OKE(ckpt_writer_begin_region(w, "BF16", &e));
    OKE(ckpt_writer_tensor_data(w, m->bytes + m->reg2, REG2, &e));
    OKE(ckpt_writer_end_region(w, &e));
    uint64_t st[1] = {TLEN / 4};
    OKE(ckpt_writer_begin_tensor(w, "t", "F32", 1, st, &e));
    OKE(ckpt_writer_tensor_data(w, m->bytes + m->t, TLEN, &e));
    OKE(ckpt_writer_end_tensor(w, &e));
    OKE(ckpt_writer_write(w, m->bytes + m->t + TLEN, 7, &e));
    OKE(ckpt_writer_end_file(w, &e));
}

static void check_model(const char *path, const ckpt_key *key, const model *m)
{
    ckpt_err e = {0};
    ckpt_pack *p;
    OKE(ckpt_open(path, key, &p, &e));
    ckpt_pack_info in;
    ckpt_info(p, &in);
    cr_assert_eq(in.format_version, CKPT_FORMAT_VERSION);
    cr_assert_eq(ckpt_tensor_count(p), 5);
    const ckpt_file_info *f = ckpt_file_at(p, 0);
    cr_assert_str_eq(f->container, "torch");
    cr_assert_str_eq(f->note, "");
    uint8_t *all = malloc(m->len);
    cr_assert_eq(ckpt_file_pread(p, 0, all, m->len, 0, &e), (ssize_t)m->len, "%s", e.msg);
    cr_assert(memcmp(all, m->bytes, m->len) == 0, "file bytes differ");
    free(all);
    expect_tensor(p, "a", m->bytes + m->reg, 40000, m->reg);
    expect_tensor(p, "tied", m->bytes + m->reg, 40000, m->reg);
    expect_tensor(p, "b", m->bytes + m->reg + 40000, 40000, m->reg + 40000);
    expect_tensor(p, "tail", m->bytes + m->reg + REG - 4000, 4000, m->reg + REG - 4000);
    expect_tensor(p, "t", m->bytes + m->t, TLEN, m->t);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    /* Three typed extents (two regions and t), the view-less one included. */
    size_t typed = 0;
    for (size_t i = 0; i < p->n_extents; i++)
        typed += p->extents[i].kind == EXTENT_TYPED;
    cr_assert_eq(typed, 3);
    ckpt_close(p);
}

Test(views, regions_and_overlapping_views_round_trip)
{
    model m = make_model();
    char *path = tu_join(dir, "v.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    write_model(w, &m);
    OK(ckpt_writer_finish(w, NULL, &e_));
    check_model(path, NULL, &m);
    free(path);
    free(m.bytes);
}

Test(views, encrypted_regions_and_views_round_trip)
{
    model m = make_model();
    ckpt_key *key = test_key();
    char *path = tu_join(dir, "ve.tpack");
    ckpt_writer *w = open_writer(path, key);
    write_model(w, &m);
    OK(ckpt_writer_finish(w, NULL, &e_));
    check_model(path, key, &m);
    ckpt_key_free(key);
    free(path);
    free(m.bytes);
}

/* A corrupt chunk inside a region makes verify blame every view over it. */
Test(views, corrupt_region_chunk_fails_every_view_over_it)
{
    model m = make_model();
    char *path = tu_join(dir, "vc.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    write_model(w, &m);
    OK(ckpt_writer_finish(w, NULL, &e_));
    ckpt_pack *p;
    ckpt_err e = {0};
    OKE(ckpt_open(path, NULL, &p, &e));
    /* The region's first chunk holds a, tied and the start of b. */
    const extent *x = &p->extents[1];
    cr_assert_eq(x->kind, EXTENT_TYPED);
    uint64_t at = p->chunks[x->first_chunk].offset + 100;
    ckpt_close(p);
    int fd = open(path, O_RDWR);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 1;
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
    close(fd);
    OKE(ckpt_open(path, NULL, &p, &e));
    long faults = ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e);
    /* chunk + file + a + tied + b */
    cr_assert_eq(faults, 5, "%ld faults", faults);
    ckpt_close(p);
    free(path);
    free(m.bytes);
}

static void expect_err(int rc, const ckpt_err *e, const char *words)
{
    cr_assert_eq(rc, -EINVAL, "rc %d: %s", rc, e->msg);
    tu_assert_contains(e->msg, words);
}

Test(views, view_outside_a_region_refused)
{
    char *path = tu_join(dir, "o.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    ckpt_err e = {0};
    uint64_t s[1] = {4};
    OKE(ckpt_writer_begin_file(w, "f", 0644, 0, 0, &e));
    expect_err(ckpt_writer_add_view(w, "v", "F32", 1, s, 0, &e), &e, "no region is open");
    OKE(ckpt_writer_write(w, "0123456789abcdef", 16, &e));
    expect_err(ckpt_writer_add_view(w, "v", "F32", 1, s, 16, &e), &e, "no region is open");
    OKE(ckpt_writer_begin_region(w, "F32", &e));
    /* Before the region: bytes of the opaque extent. */
    expect_err(ckpt_writer_add_view(w, "v", "F32", 1, s, 8, &e), &e, "before its region");
    /* Wrong element size. */
    expect_err(ckpt_writer_add_view(w, "v", "BF16", 1, s, 16, &e), &e, "2-byte elements");
    uint8_t z[32] = {0};
    OKE(ckpt_writer_tensor_data(w, z, 32, &e));
    /* Bytes already written. */
    expect_err(ckpt_writer_add_view(w, "v", "F32", 1, s, 16, &e), &e, "already written");
    OKE(ckpt_writer_add_view(w, "v", "F32", 1, s, 48, &e));
    OKE(ckpt_writer_tensor_data(w, z, 16, &e));
    OKE(ckpt_writer_end_region(w, &e));
    expect_err(ckpt_writer_add_view(w, "w", "F32", 1, s, 64, &e), &e, "no region is open");
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    expect_tensor(p, "v", z, 16, 48);
    ckpt_close(p);
    free(path);
}

Test(views, view_spanning_two_extents_refused)
{
    char *path = tu_join(dir, "s.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    ckpt_err e = {0};
    uint64_t s[1] = {8};
    uint8_t z[64] = {0};
    OKE(ckpt_writer_begin_file(w, "f", 0644, 0, 0, &e));
    OKE(ckpt_writer_begin_region(w, "F32", &e));
    OKE(ckpt_writer_add_view(w, "v", "F32", 1, s, 16, &e));
    OKE(ckpt_writer_tensor_data(w, z, 32, &e));
    int rc = ckpt_writer_end_region(w, &e);
    expect_err(rc, &e, "view 'v' (file bytes 16 to 48) runs past the end of its region at 32");
    tu_assert_contains(e.msg, "spans two extents");
    /* The pack cannot be finished: the view's digest is unknowable. */
    cr_assert_lt(ckpt_writer_finish(w, NULL, &e), 0);
    tu_assert_contains(e.msg, "spans two extents");
    cr_assert_neq(access(path, F_OK), 0, "no pack is left behind");
    free(path);
}

Test(views, begin_tensor_still_refuses_misuse)
{
    char *path = tu_join(dir, "m.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    ckpt_err e = {0};
    uint64_t s[1] = {2};
    OKE(ckpt_writer_begin_file(w, "f", 0644, 0, 0, &e));
    OKE(ckpt_writer_begin_tensor(w, "t", "F32", 1, s, &e));
    expect_err(ckpt_writer_end_region(w, &e), &e, "end_region outside a region");
    expect_err(ckpt_writer_begin_region(w, "F32", &e), &e, "inside another tensor or region");
    expect_err(ckpt_writer_tensor_data(w, "0123456789", 10, &e), &e, "more data than its 8 bytes");
    expect_err(ckpt_writer_end_tensor(w, &e), &e, "got 0 of its 8 bytes");
    OKE(ckpt_writer_tensor_data(w, "01234567", 8, &e));
    OKE(ckpt_writer_end_tensor(w, &e));
    expect_err(ckpt_writer_set_container(w, "zip", NULL, &e), &e, "unknown container 'zip'");
    char big[TPACK_NOTE_MAX + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    expect_err(ckpt_writer_set_container(w, "", big, &e), &e, "longer than 1024");
    expect_err(ckpt_writer_set_container(w, "", "bad \xff utf8", &e), &e, "not UTF-8");
    OKE(ckpt_writer_set_container(w, "gguf", "a note", &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    cr_assert_str_eq(ckpt_file_at(p, 0)->container, "gguf");
    cr_assert_str_eq(ckpt_file_at(p, 0)->note, "a note");
    ckpt_close(p);
    free(path);
}

/* ----------------------------------------------------- ingest from a layout */

typedef struct mem {
    const uint8_t *p;
    size_t len;
} mem;
static ssize_t mem_read(void *ud, void *buf, size_t len, uint64_t off)
{
    const mem *m = ud;
    if (off >= m->len)
        return 0;
    size_t n = m->len - off < len ? m->len - (size_t)off : len;
    memcpy(buf, m->p + off, n);
    return (ssize_t)n;
}

static void add_tensor(ingest_layout *l, const char *name, const char *dtype, uint64_t numel,
                       uint64_t off)
{
    l->t = realloc(l->t, (l->n + 1) * sizeof *l->t);
    ingest_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = 1;
    t->shape[0] = numel;
    t->offset = off;
    t->nbytes = numel * ckpt_dtype_size(dtype);
}

static void add_region(ingest_layout *l, const char *dtype, uint64_t off, uint64_t len)
{
    l->regions = realloc(l->regions, (l->n_regions + 1) * sizeof *l->regions);
    ingest_region *r = &l->regions[l->n_regions++];
    memset(r, 0, sizeof *r);
    snprintf(r->dtype, sizeof r->dtype, "%s", dtype);
    r->offset = off;
    r->length = len;
}

/* What a torch archive parser hands back: storage records as regions, two
 * tied tensors and one at an offset inside them, a tensor of its own, and
 * opaque bytes between. */
static ingest_layout torch_like(const model *m)
{
    ingest_layout l;
    memset(&l, 0, sizeof l);
    add_region(&l, "F32", m->reg, REG);
    add_region(&l, "BF16", m->reg2, REG2);
    add_tensor(&l, "w", "F32", 1000, m->reg);
    add_tensor(&l, "w_tied", "F32", 1000, m->reg);
    add_tensor(&l, "w.part", "F32", 500, m->reg + 4000);
    add_tensor(&l, "h", "BF16", 100, m->reg2 + 200);
    add_tensor(&l, "t", "F32", TLEN / 4, m->t);
    return l;
}

Test(views, ingest_writes_regions_views_and_gaps)
{
    model m = make_model();
    char *path = tu_join(dir, "i.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    mem src = {m.bytes, m.len};
    ingest_layout l = torch_like(&m);
    OK(ingest_add_layout(w, "m.pt", mem_read, &src, m.len, "torch", NULL, &l, &e_));
    ingest_layout_free(&l);
    OK(ckpt_writer_finish(w, NULL, &e_));
    ckpt_err e = {0};
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    cr_assert_str_eq(ckpt_file_at(p, 0)->container, "torch");
    cr_assert_eq(ckpt_tensor_count(p), 5);
    expect_tensor(p, "w", m.bytes + m.reg, 4000, m.reg);
    expect_tensor(p, "w_tied", m.bytes + m.reg, 4000, m.reg);
    expect_tensor(p, "w.part", m.bytes + m.reg + 4000, 2000, m.reg + 4000);
    expect_tensor(p, "h", m.bytes + m.reg2 + 200, 200, m.reg2 + 200);
    expect_tensor(p, "t", m.bytes + m.t, TLEN, m.t);
    /* header, region, gap, region, t, tail */
    cr_assert_eq(p->files[0].n_extents, 6);
    cr_assert_eq(ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(path);
    free(m.bytes);
}

static void add_skip(ingest_layout *l, const char *name, const char *reason)
{
    l->skipped = realloc(l->skipped, (l->n_skipped + 1) * sizeof *l->skipped);
    ingest_skipped *k = &l->skipped[l->n_skipped++];
    k->name = strdup(name);
    snprintf(k->reason, sizeof k->reason, "%s", reason);
    k->damaged = false;
}

/* What the parser found but does not show is kept with its file and why
 * (format version 4); a reason that is not UTF-8 is made valid, never a
 * failure; a file stored opaque keeps no skipped list. */
Test(views, skipped_tensors_are_recorded_with_their_reason)
{
    model m = make_model();
    char *path = tu_join(dir, "s.tpack");
    ckpt_writer *w = open_writer(path, NULL);
    mem src = {m.bytes, m.len};
    ingest_layout l = torch_like(&m);
    add_skip(&l, "w.T", "it is a non-contiguous view of its storage");
    add_skip(&l, "odd", "bad \xff byte");
    OK(ingest_add_layout(w, "m.pt", mem_read, &src, m.len, "torch", NULL, &l, &e_));
    ingest_layout_free(&l);
    /* A layout the writer refuses makes the file opaque: no skipped list. */
    ingest_layout l2 = torch_like(&m);
    add_tensor(&l2, "x", "F16", 100, m.reg);
    add_skip(&l2, "gone", "never recorded: the file is opaque");
    OK(ingest_add_layout(w, "n.pt", mem_read, &src, m.len, "torch", NULL, &l2, &e_));
    ingest_layout_free(&l2);
    OK(ckpt_writer_finish(w, NULL, &e_));
    ckpt_err e = {0};
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    ckpt_pack_info in;
    ckpt_info(p, &in);
    cr_assert_eq(in.format_version, CKPT_FORMAT_VERSION);
    cr_assert_eq(ckpt_skipped_count(p), 2);
    cr_assert_str_eq(ckpt_skipped_at(p, 0)->name, "w.T");
    cr_assert_str_eq(ckpt_skipped_at(p, 0)->reason, "it is a non-contiguous view of its storage");
    cr_assert_eq(ckpt_skipped_at(p, 0)->file_index, 0);
    cr_assert_str_eq(ckpt_skipped_at(p, 1)->reason, "bad ? byte");
    cr_assert_null(ckpt_skipped_at(p, 2));
    cr_assert_eq(ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(path);
    free(m.bytes);
}

typedef struct warned {
    int n;
    char reason[512];
} warned;
static void on_warn(void *ud, const char *src, const char *reason)
{
    warned *w = ud;
    w->n++;
    snprintf(w->reason, sizeof w->reason, "%s: %s", src, reason);
}

/* A layout the writer would refuse halfway makes the file opaque, with a
 * note, before any of it is written. */
static void expect_layout_opaque(void (*spoil)(ingest_layout *, const model *), const char *words)
{
    model m = make_model();
    char *path = tu_join(dir, "bad.tpack");
    warned seen = {0};
    ckpt_write_opts o = {
        .chunk_size = 65536, .level = -1, .threads = 1, .warn = on_warn, .warn_ud = &seen};
    ckpt_writer *w;
    ckpt_err e = {0};
    OKE(ckpt_writer_open(path, NULL, &o, &w, &e));
    mem src = {m.bytes, m.len};
    ingest_layout l = torch_like(&m);
    spoil(&l, &m);
    OKE(ingest_add_layout(w, "m.pt", mem_read, &src, m.len, "torch", NULL, &l, &e));
    ingest_layout_free(&l);
    OKE(ckpt_writer_finish(w, NULL, &e));
    cr_assert_eq(seen.n, 1);
    tu_assert_contains(seen.reason, words);
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    cr_assert_eq(ckpt_tensor_count(p), 0);
    cr_assert_str_eq(ckpt_file_at(p, 0)->container, "");
    tu_assert_contains(ckpt_file_at(p, 0)->note, "m.pt: stored opaque: layout: ");
    tu_assert_contains(ckpt_file_at(p, 0)->note, words);
    uint8_t *all = malloc(m.len);
    cr_assert_eq(ckpt_file_pread(p, 0, all, m.len, 0, &e), (ssize_t)m.len);
    cr_assert(memcmp(all, m.bytes, m.len) == 0);
    free(all);
    ckpt_close(p);
    free(path);
    free(m.bytes);
}

static void straddles(ingest_layout *l, const model *m)
{
    add_tensor(l, "x", "F32", 100, m->reg + REG - 8);
}
static void wrong_width(ingest_layout *l, const model *m)
{
    add_tensor(l, "x", "F16", 100, m->reg);
}
static void overlapping(ingest_layout *l, const model *m)
{
    add_region(l, "F32", m->reg + REG - 4, 100);
}
static void past_end(ingest_layout *l, const model *m)
{
    l->regions[1].length = 1u << 30;
}
static void twice(ingest_layout *l, const model *m)
{
    add_tensor(l, "w", "F32", 1, m->reg2 + REG2 + 4);
}

Test(views, ingest_faulty_layouts_store_the_file_opaque)
{
    expect_layout_opaque(straddles, "overlaps");
    expect_layout_opaque(wrong_width, "lies in a region of F32");
    expect_layout_opaque(overlapping, "overlaps the one before it");
    expect_layout_opaque(past_end, "lies outside the file");
    expect_layout_opaque(twice, "tensor name 'w' appears twice");
}

/* ------------------------------------------------------- opaque grouping */

typedef struct sample {
    const char *what;
    unsigned want; /* the grouping the encoder must choose */
    void (*fill)(uint8_t *, size_t);
} sample;

static void fill_text(uint8_t *b, size_t n)
{
    size_t o = 0;
    for (unsigned i = 0; o < n; i++) {
        char line[80];
        int k = snprintf(line, sizeof line, "step %u loss %.4f lr %.6f\n", i, 2.0 / (1 + i % 97),
                         1e-4 * (i % 13));
        for (int j = 0; j < k && o < n; j++)
            b[o++] = (uint8_t)line[j];
    }
}
static void fill_bf16(uint8_t *b, size_t n)
{
    float *f = malloc(n * 2);
    fill_f32(f, n / 2, 3);
    for (size_t i = 0; i < n / 2; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        b[2 * i] = (uint8_t)(u >> 16);
        b[2 * i + 1] = (uint8_t)(u >> 24);
    }
    free(f);
}
static void fill_fp32(uint8_t *b, size_t n)
{
    fill_f32(b, n / 4, 4);
}
static void fill_fp64(uint8_t *b, size_t n)
{
    float *f = malloc(n / 2);
    fill_f32(f, n / 8, 5);
    for (size_t i = 0; i < n / 8; i++) {
        double d = f[i];
        memcpy(b + 8 * i, &d, 8);
    }
    free(f);
}
static void fill_random(uint8_t *b, size_t n)
{
    randombytes_buf(b, n);
}

static const sample samples[] = {
    {"text", 1, fill_text}, {"bf16", 2, fill_bf16},     {"fp32", 4, fill_fp32},
    {"fp64", 8, fill_fp64}, {"random", 0, fill_random},
};

Test(views, opaque_grouping_chosen_per_chunk)
{
    size_t n = 1 << 20;
    uint8_t *b = malloc(n);
    chunk_encoder enc;
    chunk_encoder_init(&enc);
    for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) {
        samples[i].fill(b, n);
        double ratio;
        unsigned k = chunk_choose_grouping(&enc, b, n, &ratio);
        cr_assert_eq(k, samples[i].want, "%s: chose %u (estimate %.3f), want %u", samples[i].what,
                     k, ratio, samples[i].want);
    }
    chunk_encoder_free(&enc);
    free(b);
}

/* Each kind of opaque data in one file, one chunk each, plus a short odd
 * tail: every chunk reads back byte-identical, plain and encrypted, and the
 * chunk records say the grouping chosen. */
static void grouping_round_trip(const ckpt_key *key)
{
    size_t cs = 65536, n = cs * (sizeof samples / sizeof *samples) + 1001;
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < sizeof samples / sizeof *samples; i++)
        samples[i].fill(b + i * cs, cs);
    fill_fp32(b + n - 1001, 1000);
    char *path = tu_join(dir, "g.tpack");
    ckpt_writer *w = open_writer(path, key);
    ckpt_err e = {0};
    OKE(ckpt_writer_begin_file(w, "blob.bin", 0644, 0, 0, &e));
    OKE(ckpt_writer_write(w, b, n, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_pack *p;
    OKE(ckpt_open(path, key, &p, &e));
    for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) {
        const chunk *c = &p->chunks[i];
        unsigned want = samples[i].want;
        if (want >= 2) {
            cr_assert_eq(c->codec, CODEC_BYTEGROUP, "%s: codec %u", samples[i].what, c->codec);
            cr_assert_eq(c->elem_size, want, "%s: grouped by %u", samples[i].what, c->elem_size);
        } else {
            cr_assert_eq(c->codec, want ? CODEC_DEFLATE : CODEC_STORED, "%s: codec %u",
                         samples[i].what, c->codec);
            cr_assert_eq(c->elem_size, 1);
        }
    }
    /* The tail is 1001 bytes: no width divides it, so it is not grouped. */
    cr_assert_eq(p->chunks[p->n_chunks - 1].elem_size, 1);
    uint8_t *got = malloc(n);
    cr_assert_eq(ckpt_file_pread(p, 0, got, n, 0, &e), (ssize_t)n, "%s", e.msg);
    cr_assert(memcmp(got, b, n) == 0, "opaque bytes differ");
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(got);
    free(b);
    free(path);
}

Test(views, opaque_grouping_round_trips)
{
    grouping_round_trip(NULL);
}
Test(views, opaque_grouping_round_trips_encrypted)
{
    ckpt_key *k = test_key();
    grouping_round_trip(k);
    ckpt_key_free(k);
}

/* Level 0 stores everything, grouping included. */
Test(views, no_compression_stores_opaque_chunks)
{
    size_t n = 65536;
    uint8_t *b = malloc(n);
    fill_fp32(b, n);
    char *path = tu_join(dir, "z.tpack");
    ckpt_write_opts o = {.chunk_size = 65536, .level = 0};
    ckpt_writer *w;
    ckpt_err e = {0};
    OKE(ckpt_writer_open(path, NULL, &o, &w, &e));
    OKE(ckpt_writer_begin_file(w, "f", 0644, 0, 0, &e));
    OKE(ckpt_writer_write(w, b, n, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    cr_assert_eq(p->chunks[0].codec, CODEC_STORED);
    ckpt_close(p);
    free(b);
    free(path);
}

/* CKPT_WRITE_FUZZ_SEEDS=DIR writes small version-2 packs (regions, views,
 * notes, grouped opaque chunks) as seeds for fuzz/fuzz_pack.c: that is how
 * fuzz/corpus/pack/v2-*.tpack were made. */
Test(views, fuzz_seeds)
{
    const char *out = getenv("CKPT_WRITE_FUZZ_SEEDS");
    if (!out || !*out)
        return;
    char *path = tu_join(out, "v2-views.tpack");
    ckpt_write_opts o = {.chunk_size = 65536, .level = 6, .threads = 1};
    ckpt_writer *w;
    ckpt_err e = {0};
    OKE(ckpt_writer_open(path, NULL, &o, &w, &e));
    float f[256];
    fill_f32(f, 256, 9);
    uint64_t s4[1] = {4}, s2[2] = {8, 8};
    OKE(ckpt_writer_begin_file(w, "m.pt", 0644, 0, 0, &e));
    OKE(ckpt_writer_set_container(w, "torch", NULL, &e));
    OKE(ckpt_writer_write(w, "PK\3\4header", 10, &e));
    OKE(ckpt_writer_begin_region(w, "F32", &e));
    OKE(ckpt_writer_add_view(w, "a", "F32", 2, s2, 10, &e));
    OKE(ckpt_writer_add_view(w, "a_tied", "F32", 2, s2, 10, &e));
    OKE(ckpt_writer_add_view(w, "b", "I32", 1, s4, 10 + 200, &e));
    OKE(ckpt_writer_tensor_data(w, f, 512, &e));
    OKE(ckpt_writer_end_region(w, &e));
    OKE(ckpt_writer_begin_region(w, "BF16", &e));
    OKE(ckpt_writer_tensor_data(w, f + 128, 128, &e));
    OKE(ckpt_writer_end_region(w, &e));
    OKE(ckpt_writer_begin_tensor(w, "t", "F32", 1, s4, &e));
    OKE(ckpt_writer_tensor_data(w, f + 200, 16, &e));
    OKE(ckpt_writer_end_tensor(w, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_begin_file(w, "bad.safetensors", 0644, 0, 0, &e));
    OKE(ckpt_writer_set_container(
        w, "", "bad.safetensors: stored opaque: safetensors header: invalid JSON", &e));
    OKE(ckpt_writer_write(w, "\x10\0\0\0\0\0\0\0{not json", 17, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_begin_file(w, "blob.bin", 0644, 0, 0, &e));
    OKE(ckpt_writer_write(w, f, sizeof f, &e));
    OKE(ckpt_writer_end_file(w, &e));
    OKE(ckpt_writer_finish(w, NULL, &e));
    ckpt_pack *p;
    OKE(ckpt_open(path, NULL, &p, &e));
    cr_assert_eq(p->chunks[p->n_chunks - 1].codec, CODEC_BYTEGROUP, "blob.bin is grouped");
    cr_assert_eq(ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);
    ckpt_close(p);
    free(path);
}
