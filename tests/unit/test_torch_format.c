/* torch.save archives (formats/torch.c over formats/zip.c and
 * formats/pickle.c).
 *
 * Real archives: tests/unit/gen_torch_fixtures.py writes them with real torch
 * into a scratch directory, once with the venv's torch 2.x (scripts/venv.sh)
 * and once with Debian's python3-torch 1.13, together with the name, dtype,
 * shape and sha256 of every tensor's bytes as torch dumps them. Each tensor
 * must be found with those bytes at [offset, offset + nbytes) of the file.
 * A run skips, saying why, only when the interpreter has no torch.
 *
 * Hostile archives are built here, byte by byte, with a small zip writer
 * and a pickle assembler: unknown globals stay inert data, and broken zips
 * and pickles are refused with one-line messages checked by their text. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <zlib.h>

#include "formats/formats.h"
#include "formats/pickle.h"
#include "formats/torch.h"
#include "formats/zip.h"
#include "testutil.h"
#include "torch_fixtures.h"

/* ------------------------------------------------------------ parsing */

static tf_result describe(const uint8_t *p, size_t len, const char *path)
{
    ff_mem m = {p, len};
    ingest_source src = {.read = ff_mem_read, .ud = &m, .size = len, .name = path};
    return tf_describe(&ckpt_format_torch, &src, p, len, path);
}

/* ------------------------------------------------------------ real torch */

/* Checks every fact of dir/expect.tsv; returns how many tensors it checked. */
static size_t check_fixtures(const char *dir)
{
    char *ex_path = tu_join(dir, "expect.tsv");
    char *text = (char *)tu_read_file(ex_path, NULL);
    free(ex_path);
    char cur[256] = "";
    uint8_t *file = NULL;
    size_t flen = 0;
    tf_result r;
    memset(&r, 0, sizeof r);
    size_t checked = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[7] = {0};
        size_t nf = 0;
        /* strsep, not strtok: a 0-d tensor's shape is an empty field */
        for (char *rest = line, *tok; (tok = strsep(&rest, "\t")) && nf < 7;)
            f[nf++] = tok;
        if (f[0][0] == 'V') {
            cr_log_info("fixtures from torch %s", f[1]);
            continue;
        }
        cr_assert_geq(nf, 3);
        if (strcmp(cur, f[1]) != 0) {
            if (file)
                ingest_layout_free(&r.l);
            free(file);
            snprintf(cur, sizeof cur, "%s", f[1]);
            char *path = tu_join(dir, cur);
            file = tu_read_file(path, &flen);
            free(path);
            r = describe(file, flen, cur);
            cr_assert_eq(r.sniff, 1, "%s: not sniffed as torch", cur);
            cr_assert_eq(r.rc, 0, "%s: rc %d: %s", cur, r.rc, r.msg);
        }
        if (f[0][0] == 'N') {
            cr_assert_eq(r.l.n, (size_t)strtoul(f[2], NULL, 10), "%s: %zu tensors, want %s", cur,
                         r.l.n, f[2]);
        } else if (f[0][0] == 'S') {
            const ingest_skipped *s = ff_find_skipped(&r.l, f[2]);
            cr_assert_not_null(s, "%s: '%s' not skipped", cur, f[2]);
            tu_assert_contains(s->reason, f[3]);
            cr_assert_null(ff_find_tensor(&r.l, f[2]));
        } else {
            cr_assert_eq(nf, 6, "bad expect line");
            tf_check_tensor(&r.l, file, flen, cur, &f[2]);
            checked++;
        }
    }
    if (file)
        ingest_layout_free(&r.l);
    free(file);
    free(text);
    return checked;
}

Test(torch_real, torch2_archives, .timeout = 300)
{
    char *py = tf_venv_python();
    char *dir = tf_generate(py, "gen_torch_fixtures.py");
    size_t n = check_fixtures(dir);
    cr_assert_gt(n, 40, "only %zu tensors checked", n);
    tu_rm_rf(dir);
    free(dir);
    free(py);
}

Test(torch_real, torch1_archives, .timeout = 300)
{
    char *dir = tf_generate("/usr/bin/python3", "gen_torch_fixtures.py");
    size_t n = check_fixtures(dir);
    cr_assert_gt(n, 40, "only %zu tensors checked", n);
    tu_rm_rf(dir);
    free(dir);
}

/* ------------------------------------------------------------ builders */

typedef struct zent {
    const char *name;
    const void *data;
    size_t len;
} zent;

/* A stored zip of the entries, as torch lays it out (data after each local
 * header, then the central directory, zip64 end records, end record). */
static ff_buf zip_build(const zent *e, size_t n, bool zip64)
{
    ff_buf b = {0};
    uint64_t *off = calloc(n ? n : 1, sizeof *off);
    for (size_t i = 0; i < n; i++) {
        off[i] = b.len;
        size_t nl = strlen(e[i].name);
        ff_le(&b, 0x04034b50, 4);
        ff_le(&b, 20, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 2); /* stored */
        ff_le(&b, 0, 4); /* time, date */
        ff_le(&b, crc32(0, e[i].data, (uInt)e[i].len), 4);
        ff_le(&b, e[i].len, 4);
        ff_le(&b, e[i].len, 4);
        ff_le(&b, nl, 2);
        ff_le(&b, 0, 2);
        ff_put(&b, e[i].name, nl);
        ff_put(&b, e[i].data, e[i].len);
    }
    uint64_t cd = b.len;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(e[i].name);
        ff_le(&b, 0x02014b50, 4);
        ff_le(&b, 20, 2);
        ff_le(&b, 20, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 4);
        ff_le(&b, crc32(0, e[i].data, (uInt)e[i].len), 4);
        ff_le(&b, e[i].len, 4);
        ff_le(&b, e[i].len, 4);
        ff_le(&b, nl, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 2);
        ff_le(&b, 0, 4);
        ff_le(&b, off[i], 4);
        ff_put(&b, e[i].name, nl);
    }
    uint64_t cd_size = b.len - cd;
    if (zip64) {
        uint64_t rec = b.len;
        ff_le(&b, 0x06064b50, 4);
        ff_le(&b, 44, 8);
        ff_le(&b, 45, 2);
        ff_le(&b, 45, 2);
        ff_le(&b, 0, 4);
        ff_le(&b, 0, 4);
        ff_le(&b, n, 8);
        ff_le(&b, n, 8);
        ff_le(&b, cd_size, 8);
        ff_le(&b, cd, 8);
        ff_le(&b, 0x07064b50, 4);
        ff_le(&b, 0, 4);
        ff_le(&b, rec, 8);
        ff_le(&b, 1, 4);
    }
    ff_le(&b, 0x06054b50, 4);
    ff_le(&b, 0, 2);
    ff_le(&b, 0, 2);
    ff_le(&b, zip64 ? 0xFFFF : n, 2);
    ff_le(&b, zip64 ? 0xFFFF : n, 2);
    ff_le(&b, zip64 ? 0xFFFFFFFFu : cd_size, 4);
    ff_le(&b, zip64 ? 0xFFFFFFFFu : cd, 4);
    ff_le(&b, 0, 2);
    free(off);
    return b;
}

/* Pickle assembly. */
static void pk_op(ff_buf *b, char op)
{
    ff_byte(b, (uint8_t)op);
}

static void pk_str(ff_buf *b, const char *s)
{
    pk_op(b, 'X');
    ff_le(b, strlen(s), 4);
    ff_put(b, s, strlen(s));
}

static void pk_global(ff_buf *b, const char *m, const char *n)
{
    pk_op(b, 'c');
    ff_put(b, m, strlen(m));
    ff_byte(b, '\n');
    ff_put(b, n, strlen(n));
    ff_byte(b, '\n');
}

static void pk_k(ff_buf *b, uint8_t v)
{
    pk_op(b, 'K');
    ff_byte(b, v);
}

/* _rebuild_tensor_v2(persid('storage', cls, key, 'cpu', numel), offset,
 * (rows, cols), (stride0, stride1), False, OrderedDict()) */
static void pk_tensor(ff_buf *b, const char *cls, const char *key, uint8_t numel, uint8_t offset,
                      uint8_t rows, uint8_t cols, uint8_t s0, uint8_t s1)
{
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    pk_op(b, '(');
    pk_op(b, '(');
    pk_str(b, "storage");
    pk_global(b, "torch", cls);
    pk_str(b, key);
    pk_str(b, "cpu");
    pk_k(b, numel);
    pk_op(b, 't');
    pk_op(b, 'Q');
    pk_k(b, offset);
    pk_k(b, rows);
    pk_k(b, cols);
    ff_byte(b, 0x86);
    pk_k(b, s0);
    pk_k(b, s1);
    ff_byte(b, 0x86);
    ff_byte(b, 0x89);
    pk_global(b, "collections", "OrderedDict");
    pk_op(b, ')');
    pk_op(b, 'R');
    pk_op(b, 't');
    pk_op(b, 'R');
}

/* An archive of "archive/data.pkl" = pkl and "archive/data/0" = 24 floats. */
static ff_buf archive_with(const ff_buf *pkl)
{
    static float data[24];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i;
    zent e[] = {{"archive/data.pkl", pkl->p, pkl->len},
                {"archive/data/0", data, sizeof data},
                {"archive/version", "3\n", 2}};
    return zip_build(e, 3, true);
}

/* {"w": a 4x6 float tensor over storage 0} */
static ff_buf simple_pickle(void)
{
    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, '}');
    pk_str(&p, "w");
    pk_tensor(&p, "FloatStorage", "0", 24, 0, 4, 6, 6, 1);
    pk_op(&p, 's');
    pk_op(&p, '.');
    return p;
}

/* ------------------------------------------------------------ built archives */

Test(torch_built, simple_archive_and_zip32)
{
    ff_buf p = simple_pickle();
    for (int z64 = 0; z64 < 2; z64++) {
        static float data[24];
        zent e[] = {{"archive/data.pkl", p.p, p.len}, {"archive/data/0", data, sizeof data}};
        ff_buf a = zip_build(e, 2, z64);
        tf_result r = describe(a.p, a.len, "m.pt");
        cr_assert_eq(r.sniff, 1);
        cr_assert_eq(r.rc, 0, "%s", r.msg);
        cr_assert_eq(r.l.n, 1);
        cr_assert_str_eq(r.l.t[0].name, "w");
        cr_assert_str_eq(r.l.t[0].dtype, "F32");
        cr_assert_eq(r.l.t[0].nbytes, 96);
        cr_assert_eq(r.l.n_regions, 1);
        ingest_layout_free(&r.l);
        free(a.p);
    }
    free(p.p);
}

Test(torch_built, sniff_claims_only_torch_zips)
{
    ff_buf p = simple_pickle();
    ff_buf a = archive_with(&p);
    cr_assert_eq(ckpt_format_torch.sniff("x.bin", a.p, a.len, a.len), 1);
    zent other[] = {{"archive/code.py", "x", 1}};
    ff_buf o = zip_build(other, 1, false);
    cr_assert_eq(ckpt_format_torch.sniff("x.pt", o.p, o.len, o.len), 0);
    static const uint8_t st[] = "\x08\0\0\0\0\0\0\0{}      ";
    cr_assert_eq(ckpt_format_torch.sniff("x.pt", st, sizeof st - 1, sizeof st - 1), 0);
    zent nested[] = {{"a/b/data.pkl", p.p, p.len}};
    ff_buf n = zip_build(nested, 1, false);
    cr_assert_eq(ckpt_format_torch.sniff("x.pt", n.p, n.len, n.len), 0);
    free(a.p);
    free(o.p);
    free(n.p);
    free(p.p);
}

Test(torch_built, zip_without_data_pkl_is_opaque)
{
    zent e[] = {{"archive/other.txt", "hi", 2}};
    ff_buf a = zip_build(e, 1, false);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 1, "rc %d: %s", r.rc, r.msg);
    free(a.p);
}

/* os.system via GLOBAL + REDUCE, beside a real tensor: never run, and the
 * file is refused (stored opaque with a warning naming the global), as
 * torch.load(weights_only=True) refuses it. */
Test(torch_built, unknown_globals_are_inert)
{
    char marker[] = "/tmp/ckpt-torch-pwned-XXXXXX";
    int fd = mkstemp(marker);
    cr_assert_geq(fd, 0);
    close(fd);
    unlink(marker);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "touch %s", marker);

    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, '}');
    pk_str(&p, "evil");
    pk_global(&p, "os", "system");
    pk_op(&p, '(');
    pk_str(&p, cmd);
    pk_op(&p, 't');
    pk_op(&p, 'R');
    pk_op(&p, 's');
    pk_str(&p, "builtins");
    ff_byte(&p, 0x8c); /* SHORT_BINUNICODE + STACK_GLOBAL: builtins.eval */
    ff_byte(&p, 8);
    ff_put(&p, "builtins", 8);
    ff_byte(&p, 0x8c);
    ff_byte(&p, 4);
    ff_put(&p, "eval", 4);
    ff_byte(&p, 0x93);
    pk_op(&p, '(');
    pk_str(&p, "__import__('os').system('true')");
    pk_op(&p, 't');
    pk_op(&p, 'R');
    pk_op(&p, 's');
    pk_str(&p, "w");
    pk_tensor(&p, "FloatStorage", "0", 24, 0, 4, 6, 6, 1);
    pk_op(&p, 's');
    pk_op(&p, '.');
    ff_buf a = archive_with(&p);
    tf_result r = describe(a.p, a.len, "evil.pt");
    cr_assert_eq(r.rc, -EINVAL, "rc %d: %s", r.rc, r.msg);
    cr_assert(strstr(r.msg, "names the global os.system"), "%s", r.msg);
    cr_assert_eq(r.l.n, 0);
    cr_assert_neq(access(marker, F_OK), 0, "the pickle ran a command");
    ingest_layout_free(&r.l);
    free(a.p);

    /* Only the evil call: refused the same way. */
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    pk_global(&q, "os", "system");
    pk_op(&q, '(');
    pk_str(&q, cmd);
    pk_op(&q, 't');
    pk_op(&q, 'R');
    pk_op(&q, '.');
    a = archive_with(&q);
    r = describe(a.p, a.len, "evil.pt");
    cr_assert_eq(r.rc, -EINVAL, "rc %d: %s", r.rc, r.msg);
    cr_assert(strstr(r.msg, "os.system"), "%s", r.msg);
    cr_assert_neq(access(marker, F_OK), 0, "the pickle ran a command");
    free(a.p);
    free(p.p);
    free(q.p);
}

/* A storage of an unknown class stays unlisted; a missing record or a view
 * past its storage is skipped with why, marked damaged (torch.load refuses
 * the file), which alone keeps the layout; a known storage is a region
 * even with no tensor presented. */
Test(torch_built, not_understood_is_not_an_error)
{
    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, '}');
    pk_str(&p, "q");
    pk_tensor(&p, "QInt8Storage", "0", 96, 0, 4, 6, 6, 1);
    pk_op(&p, 's');
    pk_str(&p, "missing");
    pk_tensor(&p, "FloatStorage", "7", 24, 0, 4, 6, 6, 1);
    pk_op(&p, 's');
    pk_op(&p, '.');
    ff_buf a = archive_with(&p);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 0, "rc %d: %s", r.rc, r.msg); /* nothing usable, but damaged */
    cr_assert_eq(r.l.n, 0);
    cr_assert_eq(r.l.n_regions, 0);
    const ingest_skipped *q = ff_find_skipped(&r.l, "q");
    const ingest_skipped *m = ff_find_skipped(&r.l, "missing");
    cr_assert(!q || !q->damaged, "an unknown storage class is not damage");
    cr_assert_not_null(m);
    cr_assert_str_eq(m->reason, "its storage record is missing");
    cr_assert(m->damaged);
    ingest_layout_free(&r.l);
    free(a.p);
    free(p.p);

    ff_buf p2 = {0};
    ff_byte(&p2, 0x80);
    ff_byte(&p2, 2);
    pk_op(&p2, ']');
    pk_tensor(&p2, "FloatStorage", "0", 24, 20, 2, 3, 3, 1); /* 20 + 6 > 24 */
    pk_op(&p2, 'a');
    pk_op(&p2, '.');
    a = archive_with(&p2);
    r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 0, "rc %d: %s", r.rc, r.msg);
    cr_assert_eq(r.l.n, 0);
    cr_assert_eq(r.l.n_regions, 1);
    cr_assert_str_eq(r.l.regions[0].dtype, "F32");
    cr_assert_eq(r.l.n_skipped, 1);
    cr_assert_str_eq(r.l.skipped[0].name, "0");
    tu_assert_contains(r.l.skipped[0].reason, "runs past its storage");
    cr_assert(r.l.skipped[0].damaged);
    ingest_layout_free(&r.l);
    free(a.p);
    free(p2.p);
}

/* A name found three times (a hostile dict repeats its key): as in
 * torch.load, the last value is the one shown; the others are skipped,
 * saying why. (It showed the first: not what torch.load gives.) */
Test(torch_built, repeated_names)
{
    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, '}');
    pk_op(&p, '(');
    for (int i = 0; i < 3; i++) {
        pk_str(&p, "w");
        pk_tensor(&p, "FloatStorage", "0", 24, (uint8_t)i, 1, 6, 6, 1);
    }
    pk_op(&p, 'u');
    pk_op(&p, '.');
    ff_buf a = archive_with(&p);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1);
    cr_assert_eq(r.l.t[0].offset, r.l.regions[0].offset + 2 * sizeof(float),
                 "the last value (storage offset 2) keeps the name");
    cr_assert_eq(r.l.n_skipped, 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_str_eq(r.l.skipped[i].name, "w");
        tu_assert_contains(r.l.skipped[i].reason, "torch.load keeps the last");
    }
    ingest_layout_free(&r.l);
    free(a.p);
    free(p.p);
}

/* {1: a, True: b} is {1: b} to Python: the 1 holding a is not shown as
 * "1" (b, under a bool key, is not named at all). */
Test(torch_built, keys_equal_across_kinds)
{
    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, '}');
    pk_op(&p, '(');
    pk_k(&p, 1);
    pk_tensor(&p, "FloatStorage", "0", 24, 0, 1, 6, 6, 1);
    ff_byte(&p, 0x88); /* NEWTRUE */
    pk_tensor(&p, "FloatStorage", "0", 24, 1, 1, 6, 6, 1);
    pk_op(&p, 'u');
    pk_op(&p, '.');
    ff_buf a = archive_with(&p);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 0, "nothing is shown as '1'");
    cr_assert_eq(r.l.n_skipped, 1);
    cr_assert_str_eq(r.l.skipped[0].name, "1");
    tu_assert_contains(r.l.skipped[0].reason, "torch.load keeps the last");
    ingest_layout_free(&r.l);
    free(a.p);
    free(p.p);
}

/* {"w": a, b"w": 0} keeps both keys in Python 3: bytes never equal str,
 * so "w" is shown (it was skipped as set again). A non-ASCII Python 2 byte
 * string (SHORT_BINSTRING) is a str to torch.load, which decodes it as
 * UTF-8, so {"\u00e9": a, '\xc3\xa9': 0} does hide a. */
static tf_result str_key_then(ff_buf *p, const char *key, char op)
{
    ff_byte(p, 0x80);
    ff_byte(p, 3);
    pk_op(p, '}');
    pk_op(p, '(');
    pk_str(p, key);
    pk_tensor(p, "FloatStorage", "0", 24, 0, 1, 6, 6, 1);
    pk_op(p, op); /* SHORT_BINBYTES or SHORT_BINSTRING of the same bytes */
    ff_byte(p, (uint8_t)strlen(key));
    ff_put(p, key, strlen(key));
    pk_k(p, 0);
    pk_op(p, 'u');
    pk_op(p, '.');
    ff_buf a = archive_with(p);
    tf_result r = describe(a.p, a.len, "x.pt");
    free(a.p);
    return r;
}

Test(torch_built, bytes_key_does_not_hide_a_str_key)
{
    ff_buf p = {0};
    tf_result r = str_key_then(&p, "w", 'C');
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 1, "w is shown");
    cr_assert_str_eq(r.l.t[0].name, "w");
    cr_assert_eq(r.l.n_skipped, 0);
    ingest_layout_free(&r.l);
    free(p.p);

    ff_buf q = {0};
    r = str_key_then(&q, "\xc3\xa9", 'U');
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 0, "the Python 2 string is the same key");
    cr_assert_eq(r.l.n_skipped, 1);
    tu_assert_contains(r.l.skipped[0].reason, "torch.load keeps the last");
    ingest_layout_free(&r.l);
    free(q.p);
}

/* One dict of 4000 unnamed (None) keys, reached 100000 times through the
 * memo: each walk of it cost its length (and a sort), unbounded by the
 * walk's visit count, which only named children paid. */
Test(torch_hostile, a_big_dict_reached_often_through_the_memo, .timeout = 20)
{
    ff_buf p = {0};
    ff_byte(&p, 0x80);
    ff_byte(&p, 2);
    pk_op(&p, ']');
    pk_op(&p, '(');
    pk_op(&p, '}');
    pk_op(&p, '(');
    for (int i = 0; i < 4000; i++) {
        pk_op(&p, 'N');
        pk_k(&p, (uint8_t)i);
    }
    pk_op(&p, 'u');
    pk_op(&p, 'q');
    ff_byte(&p, 0);
    for (int i = 0; i < 100000; i++) {
        pk_op(&p, 'h');
        ff_byte(&p, 0);
    }
    pk_op(&p, 'e');
    pk_op(&p, '.');
    ff_buf a = archive_with(&p);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_geq(r.rc, 0, "rc %d: %s", r.rc, r.msg); /* no tensor: 1, opaque */
    cr_assert_eq(r.l.n, 0);
    ingest_layout_free(&r.l);
    free(a.p);
    free(p.p);
}

/* _rebuild_tensor_v2/_v3 with torch's view metadata (get_tensor_metadata)
 * as its last argument: {"neg": v}. */
static void pk_tensor_meta(ff_buf *b, int version, const char *key, uint8_t numel, bool neg)
{
    pk_global(b, "torch._utils", version == 3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    pk_op(b, '(');
    pk_op(b, '(');
    pk_str(b, "storage");
    if (version == 3)
        pk_global(b, "torch", "UntypedStorage");
    else
        pk_global(b, "torch", "FloatStorage");
    pk_str(b, key);
    pk_str(b, "cpu");
    pk_k(b, numel);
    pk_op(b, 't');
    pk_op(b, 'Q');
    pk_k(b, 0);
    pk_k(b, 4);
    ff_byte(b, 0x85);
    pk_k(b, 1);
    ff_byte(b, 0x85);
    ff_byte(b, 0x89);
    pk_global(b, "collections", "OrderedDict");
    pk_op(b, ')');
    pk_op(b, 'R');
    if (version == 3)
        pk_global(b, "torch", "uint16");
    pk_op(b, '}');
    pk_str(b, "neg");
    ff_byte(b, neg ? 0x88 : 0x89);
    pk_op(b, 's');
    pk_op(b, 't');
    pk_op(b, 'R');
}

/* torch saves a negated view (torch._neg_view(x), c.conj().imag) as its
 * storage's bytes plus {'neg': True}, and torch.load negates them: those
 * bytes are not the tensor's values, so it is skipped with why. A false
 * flag changes nothing. (It was presented as its storage's bytes.) */
Test(torch_built, negated_views_are_skipped)
{
    for (int version = 2; version <= 3; version++) {
        ff_buf p = {0};
        ff_byte(&p, 0x80);
        ff_byte(&p, 2);
        pk_op(&p, '}');
        pk_str(&p, "neg");
        pk_tensor_meta(&p, version, "0", version == 3 ? 96 : 24, true);
        pk_op(&p, 's');
        pk_str(&p, "plain");
        pk_tensor_meta(&p, version, "0", version == 3 ? 96 : 24, false);
        pk_op(&p, 's');
        pk_op(&p, '.');
        ff_buf a = archive_with(&p);
        tf_result r = describe(a.p, a.len, "x.pt");
        cr_assert_eq(r.rc, 0, "v%d: %s", version, r.msg);
        cr_assert_eq(r.l.n, 1, "v%d: %zu tensors presented", version, r.l.n);
        cr_assert_str_eq(r.l.t[0].name, "plain");
        cr_assert_str_eq(r.l.t[0].dtype, version == 3 ? "U16" : "F32");
        const ingest_skipped *s = ff_find_skipped(&r.l, "neg");
        cr_assert_not_null(s, "v%d: 'neg' not skipped", version);
        tu_assert_contains(s->reason, "negated");
        ingest_layout_free(&r.l);
        free(a.p);
        free(p.p);
    }
}

/* A big-endian archive: its storage stays a region, its tensor is skipped. */
Test(torch_built, big_endian_archive)
{
    ff_buf p = simple_pickle();
    static float data[24];
    zent e[] = {{"archive/data.pkl", p.p, p.len},
                {"archive/byteorder", "big", 3},
                {"archive/data/0", data, sizeof data}};
    ff_buf a = zip_build(e, 3, true);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 0, "%s", r.msg);
    cr_assert_eq(r.l.n, 0);
    cr_assert_eq(r.l.n_regions, 1);
    cr_assert_eq(r.l.n_skipped, 1);
    tu_assert_contains(r.l.skipped[0].reason, "big-endian");
    ingest_layout_free(&r.l);
    free(a.p);
    e[1].data = "middle";
    e[1].len = 6;
    a = zip_build(e, 3, true);
    r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "torch archive: archive/byteorder is neither");
    free(a.p);
    free(p.p);
}

static void expect_fault(const uint8_t *p, size_t len, const char *fragment)
{
    tf_result r = describe(p, len, "bad.pt");
    cr_assert_eq(r.rc, -EINVAL, "rc %d (msg: %s), want -EINVAL with '%s'", r.rc, r.msg, fragment);
    tu_assert_contains(r.msg, "torch archive: ");
    tu_assert_contains(r.msg, fragment);
}

Test(torch_hostile, truncated_zip)
{
    ff_buf p = simple_pickle();
    ff_buf a = archive_with(&p);
    expect_fault(a.p, a.len - 1, "no zip end of central directory record");
    expect_fault(a.p, 10, "too short for a zip end of central directory record");
    /* Every prefix is refused cleanly. */
    for (size_t n = 0; n < a.len; n++) {
        tf_result r = describe(a.p, n, "bad.pt");
        cr_assert_eq(r.rc, -EINVAL, "prefix %zu: rc %d", n, r.rc);
        tu_assert_contains(r.msg, "torch archive: ");
    }
    free(a.p);
    free(p.p);
}

/* Offset of central entry i's local-header-offset field in a zip_build. */
static size_t cd_entry_at(const ff_buf *a, size_t i)
{
    size_t at = 0;
    for (size_t k = 0; k + 4 <= a->len; k++) {
        if (memcmp(a->p + k, "PK\1\2", 4) == 0) {
            if (at++ == i)
                return k;
        }
    }
    cr_assert_fail("no central entry %zu", i);
    return 0;
}

Test(torch_hostile, entry_outside_the_file)
{
    ff_buf p = simple_pickle();
    ff_buf a = archive_with(&p);
    size_t c = cd_entry_at(&a, 1);
    a.p[c + 42] = 0xF0; /* local header offset far past the end */
    a.p[c + 43] = 0xFF;
    a.p[c + 44] = 0x7F;
    expect_fault(a.p, a.len, "lies outside the entries' area");
    free(a.p);

    a = archive_with(&p);
    c = cd_entry_at(&a, 1);
    a.p[c + 8] |= 0x08; /* sizes in a data descriptor, so only the central ones count */
    a.p[c + 20] = 0xFF; /* compressed size: past the central directory */
    a.p[c + 21] = 0xFF;
    a.p[c + 24] = 0xFF;
    a.p[c + 25] = 0xFF;
    expect_fault(a.p, a.len, "runs past the entries' area");
    free(a.p);

    a = archive_with(&p);
    size_t eocd = a.len - 22;
    a.p[eocd - 20 + 15] = 0x7F; /* zip64 locator past the file */
    expect_fault(a.p, a.len, "zip64 locator points at");
    free(a.p);
    free(p.p);
}

Test(torch_hostile, overlapping_entries)
{
    ff_buf p = simple_pickle();
    zent e[] = {{"archive/data.pkl", p.p, p.len}, {"archive/data/0", "abcd", 4}};
    ff_buf a = zip_build(e, 2, false);
    /* data.pkl's central entry grows over the next entry's local header; a
     * data descriptor flag spares it the local size check. */
    size_t c = cd_entry_at(&a, 0);
    uint32_t grown = (uint32_t)(p.len + 30 + strlen("archive/data/0") + 4);
    a.p[c + 8] |= 0x08;
    for (int i = 0; i < 4; i++) {
        a.p[c + 20 + i] = (uint8_t)(grown >> (8 * i));
        a.p[c + 24 + i] = (uint8_t)(grown >> (8 * i));
    }
    expect_fault(a.p, a.len, "entry 'archive/data/0' at");
    expect_fault(a.p, a.len, "overlaps entry 'archive/data.pkl'");
    free(a.p);
    free(p.p);
}

Test(torch_hostile, duplicate_names_and_local_header_mismatch)
{
    ff_buf p = simple_pickle();
    zent e[] = {{"archive/data.pkl", p.p, p.len}, {"archive/data.pkl", "x", 1}};
    ff_buf a = zip_build(e, 2, false);
    expect_fault(a.p, a.len, "two entries are named 'archive/data.pkl'");
    free(a.p);

    zent f[] = {{"archive/data.pkl", p.p, p.len}, {"archive/data/0", "abcd", 4}};
    a = zip_build(f, 2, false);
    size_t c = cd_entry_at(&a, 1);
    a.p[c + 46 + 13] = '1'; /* central name archive/data/1, local says /0 */
    expect_fault(a.p, a.len, "names another entry");
    free(a.p);
    free(p.p);
}

Test(torch_hostile, huge_counts)
{
    ff_buf p = simple_pickle();
    ff_buf a = archive_with(&p);
    /* zip64 end record claims 2^40 entries */
    size_t rec = a.len - 22 - 20 - 56;
    cr_assert_eq(a.p[rec], 'P');
    a.p[rec + 24 + 5] = 1;
    a.p[rec + 32 + 5] = 1;
    expect_fault(a.p, a.len, "more than the 262144 allowed");
    free(a.p);

    /* a plain end record that claims 60000 entries in a small directory */
    zent e[] = {{"archive/data.pkl", p.p, p.len}};
    a = zip_build(e, 1, false);
    a.p[a.len - 22 + 8] = 0x60;
    a.p[a.len - 22 + 9] = 0xEA;
    a.p[a.len - 22 + 10] = 0x60;
    a.p[a.len - 22 + 11] = 0xEA;
    expect_fault(a.p, a.len, "claims 60000 entries but its central directory holds only");
    free(a.p);

    /* a pickle memo index of 2^31 */
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    pk_op(&q, '}');
    pk_op(&q, 'r');
    ff_le(&q, 0x80000000u, 4);
    pk_op(&q, '.');
    a = archive_with(&q);
    expect_fault(a.p, a.len, "memo index 2147483648 is past");
    free(a.p);
    free(q.p);
    free(p.p);
}

/* One tensor named 300000 ways through the memo (3 bytes each). */
Test(torch_hostile, too_many_tensors)
{
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    pk_op(&q, ']');
    pk_tensor(&q, "FloatStorage", "0", 24, 0, 4, 6, 6, 1);
    pk_op(&q, 'q');
    ff_byte(&q, 1);
    pk_op(&q, 'a');
    for (int i = 0; i < 300000; i++) {
        pk_op(&q, 'h');
        ff_byte(&q, 1);
        pk_op(&q, 'a');
    }
    pk_op(&q, '.');
    ff_buf a = archive_with(&q);
    expect_fault(a.p, a.len, "archive/data.pkl names more than 262144 tensors");
    free(a.p);
    free(q.p);
}

Test(torch_hostile, deep_nesting)
{
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    for (int i = 0; i < 100000; i++)
        pk_op(&q, ']');
    for (int i = 0; i < 99999; i++)
        pk_op(&q, 'a');
    pk_op(&q, '.');
    ff_buf a = archive_with(&q);
    expect_fault(a.p, a.len, "values nest deeper than 128");
    free(a.p);

    /* Deep but legal for the parser (within 128): the naming walk stops at
     * its own bound and nothing fails. */
    ff_buf d = {0};
    ff_byte(&d, 0x80);
    ff_byte(&d, 2);
    for (int i = 0; i < 120; i++)
        pk_op(&d, ']');
    for (int i = 0; i < 119; i++)
        pk_op(&d, 'a');
    pk_op(&d, '.');
    a = archive_with(&d);
    tf_result r = describe(a.p, a.len, "x.pt");
    cr_assert_eq(r.rc, 1, "rc %d: %s", r.rc, r.msg);
    free(a.p);
    free(d.p);
    free(q.p);
}

#define PKL(s, frag)                                                                               \
    {                                                                                              \
        s, sizeof s - 1, frag                                                                      \
    }

Test(torch_hostile, broken_pickles)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *fragment;
    } cases[] = {
        PKL("\x80\x02I1\n.", "unknown or unsupported opcode 'I' (opcode 0x49 at byte 2)"),
        PKL("\x80\x02X\xff\xff\xff\x7f", "runs past the end of the pickle"),
        PKL("\x80\x02}", "without STOP"),
        PKL("\x80\x02.", "stack underflow"),
        PKL("\x80\x02t.", "no MARK to pop to"),
        PKL("\x80\x09}.", "pickle protocol 9 is not supported"),
        PKL("\x80\x02h\x05.", "memo key 5 was never stored"),
        PKL("\x80\x02K\x01K\x02K\x03s.", "setting items on a int"),
        PKL("\x80\x02X\x02\x00\x00\x00\xc3\x28.", "not valid UTF-8"),
        PKL("\x80\x02"
            "cos\nsystem\nK\x01R.",
            "call arguments are a int, not a tuple"),
        PKL("\x80\x02\x97.", "unknown or unsupported opcode (opcode 0x97 at byte 2)"),
        PKL("\x80\x02"
            "cos\n",
            "GLOBAL without two newline-terminated names"),
        PKL("\x80\x02}K\x01"
            "b.",
            "BUILD on a dict"),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ff_buf q = {0};
        ff_put(&q, cases[i].bytes, cases[i].len);
        ff_buf a = archive_with(&q);
        expect_fault(a.p, a.len, cases[i].fragment);
        expect_fault(a.p, a.len, "torch archive: archive/data.pkl: ");
        free(a.p);
        free(q.p);
    }
}

/* ------------------------------------------------------------ the pickle API */

Test(pickle, value_graph)
{
    pickle_doc *d;
    char msg[256];
    int rc;
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 4);
    ff_byte(&q, 0x95); /* FRAME */
    ff_le(&q, 0, 8);
    pk_op(&q, '}');
    pk_op(&q, 'q');
    ff_byte(&q, 0);
    pk_op(&q, '(');
    pk_str(&q, "i");
    pk_op(&q, 'J');
    ff_le(&q, (uint32_t)-5, 4);
    pk_str(&q, "big");
    ff_byte(&q, 0x8a);
    ff_byte(&q, 9);
    ff_put(&q, "\x01\x02\x03\x04\x05\x06\x07\x08\x09", 9);
    pk_str(&q, "neg");
    ff_byte(&q, 0x8a);
    ff_byte(&q, 2);
    ff_put(&q, "\x00\xff", 2);
    pk_str(&q, "f");
    pk_op(&q, 'G');
    ff_put(&q, "\x3f\xf8\x00\x00\x00\x00\x00\x00", 8);
    pk_str(&q, "b");
    pk_op(&q, 'C');
    ff_byte(&q, 3);
    ff_put(&q, "a\0b", 3);
    pk_str(&q, "self");
    pk_op(&q, 'N');
    ff_byte(&q, 0x88);
    pk_op(&q, 'h');
    ff_byte(&q, 0);
    ff_byte(&q, 0x87);
    pk_str(&q, "i");
    pk_k(&q, 7); /* a repeated key: the last wins in pk_dict_get */
    pk_op(&q, 'u');
    pk_op(&q, '.');
    rc = pickle_parse(q.p, q.len, NULL, &d, msg, sizeof msg);
    cr_assert_eq(rc, 0, "%s", msg);
    const pk_value *root = pickle_root(d);
    cr_assert_eq(root->kind, PK_DICT);
    cr_assert_eq(pk_len(root), 14);
    int64_t x;
    cr_assert(pk_int(pk_dict_get(root, "i"), &x) && x == 7);
    cr_assert(pk_int(pk_at(root, 1), &x) && x == -5);
    cr_assert_eq(pk_dict_get(root, "big")->kind, PK_BIGINT);
    cr_assert_eq(pk_dict_get(root, "big")->u.s.len, 9);
    cr_assert(pk_int(pk_dict_get(root, "neg"), &x) && x == -256);
    cr_assert_float_eq(pk_dict_get(root, "f")->u.f, 1.5, 0);
    const pk_value *b = pk_dict_get(root, "b");
    cr_assert_eq(b->kind, PK_BYTES);
    cr_assert_eq(b->u.s.len, 3);
    cr_assert_eq(memcmp(b->u.s.p, "a\0b", 3), 0);
    const pk_value *s = pk_dict_get(root, "self");
    cr_assert_eq(s->kind, PK_TUPLE);
    cr_assert_eq(pk_at(s, 0)->kind, PK_NONE);
    cr_assert_eq(pk_at(s, 1)->kind, PK_BOOL);
    cr_assert_eq(pk_at(s, 2), root, "the memo shares the node");
    cr_assert_gt(pickle_node_count(d), 10);
    cr_assert_null(pk_dict_get(root, "nope"));
    pickle_free(d);
    free(q.p);
}

Test(pickle, limits)
{
    /* 2000 open marks against a stack of 1000 */
    ff_buf q = {0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    for (int i = 0; i < 2000; i++)
        pk_op(&q, '(');
    pk_op(&q, '.');
    pickle_doc *d;
    char msg[256];
    pickle_limits lim = {.max_stack = 1000};
    cr_assert_eq(pickle_parse(q.p, q.len, &lim, &d, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "more than 1000 open MARKs");
    free(q.p);

    /* 5000 values against 1000 nodes; then against 64 KiB of memory */
    q = (ff_buf){0};
    ff_byte(&q, 0x80);
    ff_byte(&q, 2);
    pk_op(&q, ']');
    for (int i = 0; i < 5000; i++) {
        pk_op(&q, 'N');
        pk_op(&q, 'a');
    }
    pk_op(&q, '.');
    lim = (pickle_limits){.max_nodes = 1000};
    cr_assert_eq(pickle_parse(q.p, q.len, &lim, &d, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "more than 1000 values");
    lim = (pickle_limits){.max_bytes = 65536};
    cr_assert_eq(pickle_parse(q.p, q.len, &lim, &d, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "more than 65536 bytes of memory");
    lim = (pickle_limits){.max_input = 100};
    cr_assert_eq(pickle_parse(q.p, q.len, &lim, &d, msg, sizeof msg), -EINVAL);
    tu_assert_contains(msg, "more than the 100 allowed");
    cr_assert_eq(pickle_parse(q.p, q.len, NULL, &d, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(pk_len(pickle_root(d)), 5000);
    pickle_free(d);
    free(q.p);
}

/* ------------------------------------------------------------ the zip API */

Test(zip, entries_and_find)
{
    zent e[] = {{"a/x", "hello", 5}, {"a/y", "", 0}, {"a/z", "0123456789", 10}};
    ff_buf b = zip_build(e, 3, false);
    ff_mem m = {b.p, b.len};
    ingest_source src = {.read = ff_mem_read, .ud = &m, .size = b.len, .name = "t.zip"};
    zip_archive z;
    char msg[256];
    cr_assert_eq(zip_open(&src, &z, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(z.n, 3);
    cr_assert_not(z.zip64);
    const zip_entry *x = zip_find(&z, "a/z");
    cr_assert_not_null(x);
    cr_assert(zip_entry_is_raw(x));
    cr_assert_eq(x->size, 10);
    cr_assert_eq(memcmp(b.p + x->data_offset, "0123456789", 10), 0);
    cr_assert_null(zip_find(&z, "a/q"));
    zip_close(&z);
    free(b.p);
}
