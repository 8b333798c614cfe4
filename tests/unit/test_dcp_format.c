/* PyTorch DCP checkpoints (formats/dcp.c over formats/torch.c).
 *
 * Real checkpoints: tests/unit/gen_dcp_fixtures.py saves them with the
 * venv's torch (dcp.save in one process, dcp.async_save, dcp.save from 2
 * gloo ranks with dim-0-sharded DTensors, and Megatron's torch_dist layout)
 * and dumps the name, dtype, shape and sha256 of every tensor chunk as the
 * generator made it. Each must be found with those bytes at [offset,
 * offset + nbytes) of its .distcp file. Without .metadata the fallback scan
 * must find the same storage regions. A run skips, saying why, only when
 * the interpreter has no torch.
 *
 * Hostile metadata is assembled here opcode by opcode: overlapping items,
 * items past the file, absurd counts through shared nodes, deep nesting,
 * cycles and unknown globals are refused with one-line messages checked by
 * their text. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "formats/dcp.h"
#include "formats/formats.h"
#include "formats/torch.h"
#include "testutil.h"
#include "torch_fixtures.h"

/* ------------------------------------------------------------ sources */

/* A .distcp file and its sibling .metadata, in memory. */
typedef struct mem {
    ff_mem file;
    const uint8_t *meta; /* NULL: no .metadata */
    size_t meta_len;
    int meta_err; /* returned instead when non-zero */
} mem;

static int mem_sibling(void *ud, const char *name, uint8_t **out, size_t *len, size_t max)
{
    const mem *m = ud;
    cr_assert_str_eq(name, ".metadata");
    if (m->meta_err)
        return m->meta_err;
    if (!m->meta)
        return -ENOENT;
    if (m->meta_len > max)
        return -EFBIG;
    *out = malloc(m->meta_len ? m->meta_len : 1);
    cr_assert_not_null(*out);
    memcpy(*out, m->meta, m->meta_len);
    *len = m->meta_len;
    return 0;
}

/* describe() of file p as path, with meta as its sibling .metadata (NULL:
 * no sibling reader at all). */
static tf_result describe(const uint8_t *p, size_t len, const char *path, const uint8_t *meta,
                          size_t meta_len, bool with_reader)
{
    mem m = {{p, len}, meta, meta_len, 0};
    ingest_source src = {.read = ff_mem_read, .ud = &m.file, .size = len, .name = path};
    if (with_reader) {
        src.read_sibling = mem_sibling;
        src.sibling_ud = &m;
    }
    tf_result r = tf_describe(&ckpt_format_dcp, &src, p, len, path);
    cr_assert(r.sniff);
    if (r.rc < 0) {
        cr_assert_eq(r.l.n_skipped, 0);
        cr_assert(strncmp(r.msg, "dcp: ", 5) == 0, "message: %s", r.msg);
    }
    return r;
}

/* ------------------------------------------------------------ real torch */

typedef struct loaded {
    char key[512]; /* "dir/file" */
    uint8_t *file, *meta;
    size_t flen, mlen;
    tf_result with, without;
} loaded;

static void load(loaded *x, const char *root, const char *d, const char *f)
{
    snprintf(x->key, sizeof x->key, "%s/%s", d, f);
    char *ddir = tu_join(root, d);
    char *fpath = tu_join(ddir, f), *mpath = tu_join(ddir, ".metadata");
    x->file = tu_read_file(fpath, &x->flen);
    x->meta = tu_read_file(mpath, &x->mlen);
    x->with = describe(x->file, x->flen, x->key, x->meta, x->mlen, true);
    cr_assert_eq(x->with.rc, 0, "%s: rc %d: %s", x->key, x->with.rc, x->with.msg);
    cr_assert_eq(x->with.l.n_skipped, 0, "%s: %s skipped: %s", x->key,
                 x->with.l.n_skipped ? x->with.l.skipped[0].name : "",
                 x->with.l.n_skipped ? x->with.l.skipped[0].reason : "");
    /* without .metadata (no reader; a reader but no file): the scan finds
     * the same storage regions, and names nothing */
    for (int k = 0; k < 2; k++) {
        tf_result *w = &x->without;
        *w = describe(x->file, x->flen, x->key, NULL, 0, k == 1);
        cr_assert_eq(w->rc, 0, "%s: scan rc %d: %s", x->key, w->rc, w->msg);
        cr_assert_eq(w->l.n, 0);
        cr_assert_eq(w->l.n_regions, x->with.l.n_regions,
                     "%s: the scan finds %zu regions, "
                     "the metadata %zu",
                     x->key, w->l.n_regions, x->with.l.n_regions);
        for (size_t i = 0; i < w->l.n_regions; i++) {
            cr_assert_eq(w->l.regions[i].offset, x->with.l.regions[i].offset);
            cr_assert_eq(w->l.regions[i].length, x->with.l.regions[i].length);
            cr_assert_str_eq(w->l.regions[i].dtype, x->with.l.regions[i].dtype);
        }
        if (k == 0)
            ingest_layout_free(&w->l);
    }
    /* a .metadata that is not DCP's: scanned, and the manifest says why */
    static const uint8_t junk[] = {0x80, 2, 'N', '.'};
    tf_result j = describe(x->file, x->flen, x->key, junk, sizeof junk, true);
    cr_assert_eq(j.rc, 0, "%s: %s", x->key, j.msg);
    cr_assert_eq(j.l.n_regions, x->with.l.n_regions);
    const ingest_skipped *s = ff_find_skipped(&j.l, ".metadata");
    cr_assert_not_null(s);
    cr_assert_str_eq(s->reason, "ignored: the pickle holds a None, not a "
                                "torch.distributed.checkpoint.metadata.Metadata");
    ingest_layout_free(&j.l);
    free(ddir);
    free(fpath);
    free(mpath);
}

static void unload(loaded *x)
{
    ingest_layout_free(&x->with.l);
    ingest_layout_free(&x->without.l);
    free(x->file);
    free(x->meta);
    memset(x, 0, sizeof *x);
}

/* Checks every fact of root/expect.tsv; the number of tensors checked. */
static size_t check_fixtures(const char *root)
{
    char *ex_path = tu_join(root, "expect.tsv");
    char *text = (char *)tu_read_file(ex_path, NULL);
    free(ex_path);
    loaded x;
    memset(&x, 0, sizeof x);
    size_t checked = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[8] = {0};
        size_t nf = 0;
        for (char *rest = line, *tok; (tok = strsep(&rest, "\t")) && nf < 8;)
            f[nf++] = tok;
        if (f[0][0] == 'V') {
            cr_log_info("fixtures from torch %s", f[1]);
            continue;
        }
        cr_assert_geq(nf, 4);
        char key[512];
        snprintf(key, sizeof key, "%s/%s", f[1], f[2]);
        if (strcmp(key, x.key) != 0) {
            if (x.file)
                unload(&x);
            load(&x, root, f[1], f[2]);
        }
        const ingest_layout *l = &x.with.l;
        if (f[0][0] == 'N') {
            cr_assert_eq(l->n, (size_t)strtoul(f[3], NULL, 10), "%s: %zu tensors, want %s", key,
                         l->n, f[3]);
            continue;
        }
        cr_assert_eq(nf, 7, "bad expect line");
        tf_check_tensor(l, x.file, x.flen, key, &f[3]);
        checked++;
    }
    if (x.file)
        unload(&x);
    free(text);
    return checked;
}

/* The parsed .metadata of root/d. */
static dcp_metadata parse_dir(const char *root, const char *d)
{
    char *ddir = tu_join(root, d), *mpath = tu_join(ddir, ".metadata");
    size_t len;
    uint8_t *data = tu_read_file(mpath, &len);
    dcp_metadata md;
    char msg[512];
    int rc = dcp_metadata_parse(data, len, &md, msg, sizeof msg);
    cr_assert_eq(rc, 0, "%s: %s", mpath, msg);
    free(data);
    free(ddir);
    free(mpath);
    return md;
}

static const dcp_tensor *md_tensor(const dcp_metadata *md, const char *fqn)
{
    for (size_t i = 0; i < md->n_tensors; i++)
        if (strcmp(md->tensors[i].fqn, fqn) == 0)
            return &md->tensors[i];
    return NULL;
}

Test(dcp_real, torch2_checkpoints, .timeout = 600)
{
    char *py = tf_venv_python();
    char *dir = tf_generate(py, "gen_dcp_fixtures.py");
    size_t n = check_fixtures(dir);
    cr_assert_geq(n, 3 * 28 + 9, "only %zu tensors checked", n);

    /* the metadata itself: the 2-rank save chunks model.w in two files */
    dcp_metadata md = parse_dir(dir, "ranks2");
    const dcp_tensor *w = md_tensor(&md, "model.w");
    cr_assert_not_null(w);
    cr_assert_str_eq(w->dtype, "F32");
    cr_assert_eq(w->ndim, 2);
    cr_assert_eq(w->size[0], 8);
    cr_assert_eq(w->size[1], 6);
    cr_assert_eq(w->n_chunks, 2);
    cr_assert_eq(w->chunks[1].offsets[0], 4);
    cr_assert_eq(w->chunks[1].sizes[0], 4);
    cr_assert_neq(w->chunks[0].item, DCP_NO_ITEM);
    cr_assert_str_eq(md.items[w->chunks[0].item].relative_path, "__0_0.distcp");
    cr_assert_str_eq(md.items[w->chunks[1].item].relative_path, "__1_0.distcp");
    cr_assert_eq(md.n_bytes, 1); /* epoch */
    dcp_metadata_free(&md);

    /* nested model + optimizer with bytes items (ints, strings, lists) */
    md = parse_dir(dir, "single");
    cr_assert_eq(md.n_tensors, 28);
    cr_assert_geq(md.n_bytes, 3);
    cr_assert_not_null(md_tensor(&md, "optim.state.0.exp_avg"));
    size_t bytes_items = 0;
    for (size_t i = 0; i < md.n_items; i++)
        bytes_items += md.items[i].kind == DCP_ITEM_BYTES;
    cr_assert_eq(bytes_items, md.n_bytes);
    dcp_metadata_free(&md);

    /* Megatron's side files: common.pt is a torch archive; metadata.json
     * and .metadata are not *.distcp */
    char *mdir = tu_join(dir, "megatron"), *common = tu_join(mdir, "common.pt");
    size_t clen;
    uint8_t *c = tu_read_file(common, &clen);
    ff_mem m = {c, clen};
    ingest_source src = {.read = ff_mem_read, .ud = &m, .size = clen, .name = "common.pt"};
    ingest_layout l;
    char msg[512];
    cr_assert(ckpt_format_torch.sniff("common.pt", c, clen < 4096 ? clen : 4096, clen));
    cr_assert_eq(ckpt_format_torch.describe(&src, "common.pt", &l, msg, sizeof msg), 0, "%s", msg);
    cr_assert_not_null(ff_find_tensor(&l, "rng"));
    ingest_layout_free(&l);
    cr_assert_not(ckpt_format_dcp.sniff("megatron/metadata.json", c, 0, 0));
    cr_assert_not(ckpt_format_dcp.sniff("megatron/.metadata", c, 0, 0));
    free(c);
    free(common);
    free(mdir);

    tu_rm_rf(dir);
    free(dir);
    free(py);
}

/* ------------------------------------------------------------ pickle assembly */

/* One opcode (or argument byte): the listings below read as pickle. */
static void op(ff_buf *b, uint8_t c)
{
    ff_byte(b, c);
}

static void str(ff_buf *b, const char *s)
{
    op(b, 'X');
    ff_le(b, strlen(s), 4);
    ff_put(b, s, strlen(s));
}

static void num(ff_buf *b, int64_t v)
{
    op(b, 0x8a); /* LONG1 */
    op(b, 8);
    ff_le(b, (uint64_t)v, 8);
}

static void global(ff_buf *b, const char *m, const char *n)
{
    op(b, 'c');
    ff_put(b, m, strlen(m));
    op(b, '\n');
    ff_put(b, n, strlen(n));
    op(b, '\n');
}

#define MD "torch.distributed.checkpoint.metadata"
#define FS "torch.distributed.checkpoint.filesystem"

/* cls.__new__(cls) whose state dict the caller fills between MARK and
 * end_obj(). */
static void obj(ff_buf *b, const char *m, const char *n)
{
    global(b, m, n);
    op(b, ')');
    op(b, 0x81); /* NEWOBJ */
    op(b, '}');
    op(b, '(');
}

static void end_obj(ff_buf *b)
{
    op(b, 'u'); /* SETITEMS */
    op(b, 'b'); /* BUILD */
}

static void size(ff_buf *b, uint32_t n, const uint64_t *d)
{
    global(b, "torch", "Size");
    op(b, '(');
    for (uint32_t i = 0; i < n; i++)
        num(b, (int64_t)d[i]);
    op(b, 't');
    op(b, 0x85); /* TUPLE1 */
    op(b, 'R');
}

static void props(ff_buf *b, const char *dtype)
{
    global(b, MD, "TensorProperties");
    op(b, ')');
    op(b, 0x81);
    op(b, '(');
    global(b, "torch", dtype);
    op(b, 'N');
    op(b, 0x89);
    op(b, 'N');
    op(b, 0x89);
    op(b, 't');
    op(b, 'b');
}

/* A TensorStorageMetadata of n dims with one chunk per entry of offs (each
 * chunk's sizes = csize). */
static void tensor_md(ff_buf *b, const char *dtype, uint32_t n, const uint64_t *gsize,
                      size_t nchunks, const uint64_t (*offs)[4], const uint64_t *csize)
{
    obj(b, MD, "TensorStorageMetadata");
    str(b, "properties");
    props(b, dtype);
    str(b, "size");
    size(b, n, gsize);
    str(b, "chunks");
    op(b, ']');
    op(b, '(');
    for (size_t i = 0; i < nchunks; i++) {
        obj(b, MD, "ChunkStorageMetadata");
        str(b, "offsets");
        size(b, n, offs[i]);
        str(b, "sizes");
        size(b, n, csize);
        end_obj(b);
    }
    op(b, 'e'); /* APPENDS */
    end_obj(b);
}

/* MetadataIndex(fqn, offsets) : _StorageInfo(path, offset, length) */
static void item(ff_buf *b, const char *fqn, uint32_t n, const uint64_t *offs, const char *path,
                 int64_t off, int64_t len, bool transformed)
{
    obj(b, MD, "MetadataIndex");
    str(b, "fqn");
    str(b, fqn);
    str(b, "offset");
    if (offs)
        size(b, n, offs);
    else
        op(b, 'N');
    str(b, "index");
    op(b, 'N');
    end_obj(b);
    obj(b, FS, "_StorageInfo");
    str(b, "relative_path");
    str(b, path);
    str(b, "offset");
    num(b, off);
    str(b, "length");
    num(b, len);
    if (transformed) {
        str(b, "transform_descriptors");
        op(b, ']');
        str(b, "zstd");
        op(b, 'a');
    }
    end_obj(b);
}

static void md_begin(ff_buf *b)
{
    op(b, 0x80);
    op(b, 2);
    obj(b, MD, "Metadata");
    str(b, "state_dict_metadata");
    op(b, '}');
    op(b, '(');
}

static void md_mid(ff_buf *b)
{
    op(b, 'u');
    str(b, "storage_data");
    op(b, '}');
    op(b, '(');
}

static void md_end(ff_buf *b)
{
    op(b, 'u');
    end_obj(b);
    op(b, '.');
}

static const uint64_t G[2] = {4, 3};
static const uint64_t HALF[2] = {2, 3};
static const uint64_t O0[4] = {0, 0}, O2[4] = {2, 0};

/* Two chunks of "w" (rows 0-1 and 2-3) in __0_0.distcp at [a0, a0+l0) and
 * [a1, a1+l1), and a bytes item "step" at [s, s+sl). */
static ff_buf two_chunks(int64_t a0, int64_t l0, int64_t a1, int64_t l1, int64_t s, int64_t sl)
{
    ff_buf b = {0};
    const uint64_t offs[2][4] = {{0, 0}, {2, 0}};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 2, offs, HALF);
    str(&b, "step");
    obj(&b, MD, "BytesStorageMetadata");
    end_obj(&b);
    md_mid(&b);
    item(&b, "w", 2, O0, "__0_0.distcp", a0, l0, false);
    item(&b, "w", 2, O2, "__0_0.distcp", a1, l1, false);
    item(&b, "step", 0, NULL, "__0_0.distcp", s, sl, false);
    md_end(&b);
    return b;
}

static int parse(const ff_buf *b, dcp_metadata *md, char *msg, size_t cap)
{
    int rc = dcp_metadata_parse(b->p, b->len, md, msg, cap);
    if (rc) {
        cr_assert_eq(md->n_tensors, 0);
        cr_assert_eq(md->n_items, 0);
        cr_assert_null(strchr(msg, '\n'));
        cr_assert(strncmp(msg, "dcp metadata: ", 14) == 0, "message: %s", msg);
    }
    return rc;
}

#define REFUSED(b, text)                                                                           \
    do {                                                                                           \
        dcp_metadata md_;                                                                          \
        char msg_[512];                                                                            \
        int rc_ = parse(&(b), &md_, msg_, sizeof msg_);                                            \
        cr_assert_eq(rc_, -EINVAL, "rc %d (%s)", rc_, msg_);                                       \
        tu_assert_contains(msg_, text);                                                            \
        free((b).p);                                                                               \
    } while (0)

Test(dcp_metadata, assembled_metadata_parses)
{
    ff_buf b = two_chunks(0, 100, 100, 50, 150, 10);
    dcp_metadata md;
    char msg[512];
    cr_assert_eq(parse(&b, &md, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(md.n_tensors, 1);
    cr_assert_eq(md.n_bytes, 1);
    cr_assert_eq(md.n_items, 3);
    cr_assert_str_eq(md.tensors[0].dtype, "F32");
    cr_assert_eq(md.tensors[0].n_chunks, 2);
    cr_assert_eq(md.items[0].kind, DCP_ITEM_TENSOR);
    cr_assert_eq(md.items[1].offset, 100);
    cr_assert_eq(md.items[2].kind, DCP_ITEM_BYTES);
    cr_assert_str_eq(md.items[2].fqn, "step");
    dcp_metadata_free(&md);
    free(b.p);
}

Test(dcp_metadata, overlapping_items_are_refused)
{
    ff_buf b = two_chunks(0, 100, 99, 50, 150, 10);
    REFUSED(b, "items of '__0_0.distcp' overlap: 'w' at [0, 100) and 'w' at [99, 149)");
    b = two_chunks(0, 100, 100, 50, 120, 10);
    REFUSED(b, "'w' at [100, 150) and 'step' at [120, 130)");
    /* Not a neighbour: an empty item between them hid it. */
    b = two_chunks(0, 100, 50, 0, 60, 10);
    REFUSED(b, "'w' at [0, 100) and 'step' at [60, 70)");
}

Test(dcp_metadata, bad_items_are_refused)
{
    ff_buf b = two_chunks(-1, 100, 100, 50, 150, 10);
    REFUSED(b, "'w': its offset or length is not an integer >= 0");
    b = two_chunks(0, 100, 100, 50, 150, 10);
    free(b.p);

    /* a chunk past the tensor, an unknown fqn, a chunk named twice */
    const uint64_t offs[1][4] = {{3, 0}};
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 1, offs, HALF);
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': chunk 0 runs past the tensor's size in dimension 0");

    b = (ff_buf){0};
    md_begin(&b);
    md_mid(&b);
    item(&b, "ghost", 0, NULL, "__0_0.distcp", 0, 1, false);
    md_end(&b);
    REFUSED(b, "a storage item names 'ghost', which state_dict_metadata does not");

    const uint64_t one[1][4] = {{0, 0}};
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 1, one, G);
    md_mid(&b);
    item(&b, "w", 2, O0, "__0_0.distcp", 0, 10, false);
    item(&b, "w", 2, O0, "__1_0.distcp", 0, 10, false);
    md_end(&b);
    REFUSED(b, "'w': two storage items name the same chunk");

    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 1, one, G);
    md_mid(&b);
    item(&b, "w", 2, O2, "__0_0.distcp", 0, 10, false);
    md_end(&b);
    REFUSED(b, "'w': a storage item names a chunk the tensor does not have");
}

Test(dcp_metadata, unknown_globals_are_refused)
{
    ff_buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    global(&b, "os", "system");
    str(&b, "rm -rf /");
    op(&b, 0x85);
    op(&b, 'R');
    op(&b, '.');
    REFUSED(b, "the pickle holds os.system, not a torch.distributed.checkpoint.metadata.Metadata");

    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    global(&b, "builtins", "eval");
    str(&b, "1");
    op(&b, 0x85);
    op(&b, 'R');
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': unknown storage metadata builtins.eval");

    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 0, NULL, G);
    md_mid(&b);
    obj(&b, MD, "MetadataIndex");
    str(&b, "fqn");
    str(&b, "w");
    end_obj(&b);
    global(&b, "subprocess", "Popen");
    op(&b, ')');
    op(&b, 'R');
    md_end(&b);
    REFUSED(b, "'w': its storage is subprocess.Popen, not a _StorageInfo");

    /* a dtype that is not torch's */
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    obj(&b, MD, "TensorStorageMetadata");
    str(&b, "properties");
    global(&b, MD, "TensorProperties");
    op(&b, ')');
    op(&b, 0x81);
    op(&b, '(');
    global(&b, "numpy", "float32");
    op(&b, 't');
    op(&b, 'b');
    end_obj(&b);
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': its dtype is numpy.float32, not a torch dtype");
}

Test(dcp_metadata, absurd_counts_through_shared_nodes_are_refused)
{
    /* one chunks list of 1024 chunks, memoized, shared by 5000 tensors:
     * a small pickle that would make 5 million chunks */
    ff_buf b = {0};
    md_begin(&b);
    const uint64_t g1[1] = {1024}, c1[1] = {1};
    str(&b, "t0");
    obj(&b, MD, "TensorStorageMetadata");
    str(&b, "properties");
    props(&b, "float32");
    op(&b, 'q'); /* BINPUT 1 */
    op(&b, 1);
    str(&b, "size");
    size(&b, 1, g1);
    op(&b, 'q');
    op(&b, 2);
    str(&b, "chunks");
    op(&b, ']');
    op(&b, '(');
    for (uint64_t i = 0; i < 1024; i++) {
        obj(&b, MD, "ChunkStorageMetadata");
        str(&b, "offsets");
        size(&b, 1, &i);
        str(&b, "sizes");
        size(&b, 1, c1);
        end_obj(&b);
    }
    op(&b, 'e');
    op(&b, 'q');
    op(&b, 3);
    end_obj(&b);
    for (int t = 1; t < 5000; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        str(&b, name);
        obj(&b, MD, "TensorStorageMetadata");
        str(&b, "properties");
        op(&b, 'h');
        op(&b, 1);
        str(&b, "size");
        op(&b, 'h');
        op(&b, 2);
        str(&b, "chunks");
        op(&b, 'h');
        op(&b, 3);
        end_obj(&b);
    }
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "more chunks than the pickle has values (shared chunk lists)");

    /* 33 dimensions */
    uint64_t d33[33];
    for (int i = 0; i < 33; i++)
        d33[i] = 1;
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    obj(&b, MD, "TensorStorageMetadata");
    str(&b, "properties");
    props(&b, "float32");
    str(&b, "size");
    size(&b, 33, d33);
    end_obj(&b);
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': its size is not a torch.Size of at most 32 dimensions");

    /* a size whose bytes overflow */
    const uint64_t huge[2] = {1ull << 40, 1ull << 22};
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, huge, 0, NULL, huge);
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': its size in bytes overflows");
}

Test(dcp_metadata, deep_nesting_and_cycles_are_refused)
{
    ff_buf b = {0};
    op(&b, 0x80);
    op(&b, 2);
    for (int i = 0; i < 200; i++)
        op(&b, ']');
    for (int i = 0; i < 199; i++)
        op(&b, 'a');
    op(&b, '.');
    REFUSED(b, "values nest deeper than 64");

    /* a chunks list that contains itself */
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    obj(&b, MD, "TensorStorageMetadata");
    str(&b, "properties");
    props(&b, "float32");
    str(&b, "size");
    size(&b, 2, G);
    str(&b, "chunks");
    op(&b, ']');
    op(&b, 'q');
    op(&b, 7);
    op(&b, 'h');
    op(&b, 7);
    op(&b, 'a');
    end_obj(&b);
    md_mid(&b);
    md_end(&b);
    REFUSED(b, "'w': chunk 0 is a list, not a ChunkStorageMetadata");

    /* the Metadata's state dict holds the Metadata itself */
    b = (ff_buf){0};
    op(&b, 0x80);
    op(&b, 2);
    global(&b, MD, "Metadata");
    op(&b, ')');
    op(&b, 0x81);
    op(&b, 'q');
    op(&b, 0);
    op(&b, '}');
    op(&b, '(');
    str(&b, "state_dict_metadata");
    op(&b, 'h');
    op(&b, 0);
    op(&b, 'u');
    op(&b, 'b');
    op(&b, '.');
    REFUSED(b, "state_dict_metadata is not a dict");
}

/* ------------------------------------------------------------ describe */

Test(dcp_describe, items_past_the_file_are_refused)
{
    ff_buf b = two_chunks(0, 100, 100, 50, 150, 60);
    uint8_t file[200] = {0};
    tf_result r = describe(file, sizeof file, "ckpt/__0_0.distcp", b.p, b.len, true);
    cr_assert_eq(r.rc, -EINVAL);
    cr_assert_str_eq(r.msg, "dcp: .metadata places 'step' at [150, 210), past the end of the "
                            "file (200 bytes)");
    free(b.p);
    ingest_layout_free(&r.l);

    /* offsets near 2^63 do not wrap */
    b = two_chunks(0, 100, INT64_MAX, INT64_MAX, 150, 10);
    r = describe(file, sizeof file, "ckpt/__0_0.distcp", b.p, b.len, true);
    cr_assert_eq(r.rc, -EINVAL);
    tu_assert_contains(r.msg, "'w' at [9223372036854775807, 18446744073709551614), past the end");
    free(b.p);
}

Test(dcp_describe, unusable_items_are_skipped_not_fatal)
{
    /* garbage where the archives should be: every item is skipped, the
     * file stays opaque bytes but its layout keeps the skipped items, so
     * the manifest says why it has no tensor; transformed items say so */
    ff_buf b = two_chunks(0, 100, 100, 50, 150, 10);
    uint8_t file[160];
    memset(file, 0xAB, sizeof file);
    tf_result r = describe(file, sizeof file, "__0_0.distcp", b.p, b.len, true);
    cr_assert_eq(r.rc, 0, "rc %d: %s", r.rc, r.msg);
    cr_assert_eq(r.l.n, 0);
    cr_assert_eq(r.l.n_regions, 0);
    cr_assert_eq(r.l.n_skipped, 2);
    tu_assert_contains(r.l.skipped[0].reason, "not a torch archive");
    ingest_layout_free(&r.l);
    free(b.p);

    const uint64_t one[1][4] = {{0, 0}};
    b = (ff_buf){0};
    md_begin(&b);
    str(&b, "w");
    tensor_md(&b, "float32", 2, G, 1, one, G);
    md_mid(&b);
    item(&b, "w", 2, O0, "__0_0.distcp", 0, 100, true);
    md_end(&b);
    dcp_metadata md;
    char msg[512];
    cr_assert_eq(dcp_metadata_parse(b.p, b.len, &md, msg, sizeof msg), 0, "%s", msg);
    cr_assert(md.items[0].transformed);
    dcp_metadata_free(&md);
    mem m = {{file, sizeof file}, b.p, b.len, 0};
    ingest_source src = {.read = ff_mem_read,
                         .ud = &m.file,
                         .size = sizeof file,
                         .name = "x",
                         .read_sibling = mem_sibling,
                         .sibling_ud = &m};
    ingest_layout l;
    /* nothing typed, every item transformed (FileSystemWriter with
     * ZStandard): opaque bytes, and the skipped list says why */
    cr_assert_eq(ckpt_format_dcp.describe(&src, "__0_0.distcp", &l, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(l.n, 0);
    cr_assert_eq(l.n_regions, 0);
    cr_assert_eq(l.n_skipped, 1);
    cr_assert_str_eq(l.skipped[0].name, "w");
    tu_assert_contains(l.skipped[0].reason, "transformed");
    ingest_layout_free(&l);
    free(b.p);
}

Test(dcp_describe, invalid_or_unreadable_metadata_falls_back_to_the_scan)
{
    /* a tiny archive-free file (its items compressed, say): the scan finds
     * nothing; no error, and the layout keeps why .metadata was not used,
     * so the manifest does not show a dcp file with no tensor and no
     * reason (the note was dropped) */
    uint8_t file[64] = {'P', 'K', 3, 4};
    static const uint8_t junk[] = {0x80, 2, 'N', '.'};
    tf_result r = describe(file, sizeof file, "__0_0.distcp", junk, sizeof junk, true);
    cr_assert_eq(r.rc, 0, "rc %d: %s", r.rc, r.msg);
    cr_assert_eq(r.l.n, 0);
    cr_assert_eq(r.l.n_regions, 0);
    cr_assert_eq(r.l.n_skipped, 1);
    cr_assert_str_eq(r.l.skipped[0].name, ".metadata");
    cr_assert_str_eq(r.l.skipped[0].reason, "ignored: the pickle holds a None, not a "
                                            "torch.distributed.checkpoint.metadata.Metadata");
    ingest_layout_free(&r.l);
    mem m = {{file, sizeof file}, NULL, 0, -EACCES};
    ingest_source src = {.read = ff_mem_read,
                         .ud = &m.file,
                         .size = sizeof file,
                         .name = "x",
                         .read_sibling = mem_sibling,
                         .sibling_ud = &m};
    ingest_layout l;
    char msg[512];
    cr_assert_eq(ckpt_format_dcp.describe(&src, "__0_0.distcp", &l, msg, sizeof msg), 0, "%s", msg);
    cr_assert_eq(l.n_skipped, 1);
    cr_assert_str_eq(l.skipped[0].reason, "not read: Permission denied");
    ingest_layout_free(&l);
    /* no .metadata at all: nothing to say, the file is plain bytes */
    m.meta_err = 0;
    cr_assert_eq(ckpt_format_dcp.describe(&src, "__0_0.distcp", &l, msg, sizeof msg), 1);
    cr_assert(ckpt_format_dcp.sniff("a/b/__3_1.distcp", NULL, 0, 0));
    cr_assert_not(ckpt_format_dcp.sniff("a/b/.distcp.tmp", NULL, 0, 0));
}
