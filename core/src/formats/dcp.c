/* PyTorch DCP checkpoints (see dcp.h): .metadata's validation, and the
 * container_format for *.distcp files.
 *
 * The Metadata graph is read along fixed paths (root -> field -> entry ->
 * field -> chunk -> field -> torch.Size), never by a generic recursive walk,
 * so its depth is bounded by construction; the loops run over dicts and
 * lists whose cumulative lengths are bounded (DCP_MAX_*), so nodes shared
 * through the memo, or even cycles, cannot make the walk loop or explode.
 *
 * One job at about 900 lines: the .metadata reader and the per-shard
 * describe share the metadata's types and limits; the pickle and zip work
 * is already elsewhere (pickle.c, torch.c, zip.c). */
#include "formats/dcp.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "formats/fmt_util.h"
#include "formats/pickle.h"
#include "formats/torch.h"

#define MOD_MD "torch.distributed.checkpoint.metadata"
#define MOD_FS "torch.distributed.checkpoint.filesystem"
#define MSG_PREFIX "dcp metadata: "
/* a tensor name: FQN@ and up to CKPT_MAX_NDIM offsets of 20 digits */
#define MAX_NAME (DCP_MAX_FQN + 1 + CKPT_MAX_NDIM * 21 + 1)

/* ------------------------------------------------------------ object fields */

/* The state a dataclass instance was BUILT with: a dict, or for classes with
 * __slots__ a (dict or None, slots dict) pair; where field lives. */
static const pk_value *field(const pk_value *obj, const char *name)
{
    if (!obj || obj->kind != PK_CALL)
        return NULL;
    const pk_value *st = obj->u.call.state;
    if (st && st->kind == PK_DICT)
        return pk_dict_get(st, name);
    if (st && st->kind == PK_TUPLE && pk_len(st) == 2) {
        const pk_value *v = pk_dict_get(pk_at(st, 1), name);
        return v ? v : pk_dict_get(pk_at(st, 0), name);
    }
    /* NEWOBJ_EX with keyword arguments */
    return pk_dict_get(obj->u.call.kwargs, name);
}

static bool is_obj(const pk_value *v, const char *module, const char *cls)
{
    return pk_is_call_of(v, module, cls);
}

static const char *global_name(const pk_value *v, char *buf, size_t cap)
{
    if (v && v->kind == PK_CALL)
        v = v->u.call.callable;
    if (v && v->kind == PK_GLOBAL) {
        char a[FMT_QUOTE_BUF], b[FMT_QUOTE_BUF];
        fmt_quote(a, sizeof a, v->u.global.module);
        fmt_quote(b, sizeof b, v->u.global.name);
        snprintf(buf, cap, "%s.%s", a, b);
    } else {
        snprintf(buf, cap, "a %s", v ? pk_kind_name(v->kind) : "missing value");
    }
    return buf;
}

/* torch.Size((d0, d1, ...)), or a plain tuple or list of ints >= 0. */
static bool parse_size(const pk_value *v, uint64_t *out, uint32_t *n)
{
    if (pk_is_call_of(v, "torch", "Size") && !v->u.call.newobj && pk_len(v->u.call.args) == 1)
        v = pk_at(v->u.call.args, 0);
    if (!v || (v->kind != PK_TUPLE && v->kind != PK_LIST) || pk_len(v) > CKPT_MAX_NDIM)
        return false;
    for (size_t i = 0; i < pk_len(v); i++) {
        int64_t x;
        if (!pk_int(pk_at(v, i), &x) || x < 0)
            return false;
        out[i] = (uint64_t)x;
    }
    *n = (uint32_t)pk_len(v);
    return true;
}

static bool str_ok(const pk_value *v, size_t max)
{
    return v && v->kind == PK_STR && v->u.s.len > 0 && v->u.s.len <= max &&
           !memchr(v->u.s.p, '\0', v->u.s.len);
}

/* ------------------------------------------------------------ the parse */

typedef struct parse_ctx {
    dcp_metadata *md;
    size_t max_chunks; /* DCP_MAX_CHUNKS, or fewer when the pickle has fewer nodes */
    size_t cap_items;
    dcp_tensor **by_fqn;     /* the tensors sorted by fqn */
    const char **bytes_fqns; /* sorted, borrowed from the doc */
    char *msg;
    size_t msg_len;
} parse_ctx;

static int fail(parse_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parse_ctx *c, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    fmt_msg(c->msg, c->msg_len, MSG_PREFIX "%s", tmp);
    return -EINVAL;
}

static int chunk_cmp(const void *a, const void *b)
{
    const dcp_chunk *x = a, *y = b;
    for (uint32_t d = 0; d < x->ndim; d++)
        if (x->offsets[d] != y->offsets[d])
            return x->offsets[d] < y->offsets[d] ? -1 : 1;
    return 0;
}

static int fqn_cmp(const void *a, const void *b)
{
    return strcmp((*(dcp_tensor *const *)a)->fqn, (*(dcp_tensor *const *)b)->fqn);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void quote_fqn(char *dst, size_t cap, const char *fqn)
{
    fmt_quote(dst, cap, fqn);
}

/* One TensorStorageMetadata entry. */
static int parse_tensor(parse_ctx *c, const char *fqn, const pk_value *v, size_t *total_chunks)
{
    char q[FMT_QUOTE_BUF], g[2 * FMT_QUOTE_BUF + 8];
    quote_fqn(q, sizeof q, fqn);
    dcp_tensor *t = &c->md->tensors[c->md->n_tensors];
    memset(t, 0, sizeof *t);
    const pk_value *props = field(v, "properties");
    if (!is_obj(props, MOD_MD, "TensorProperties"))
        return fail(c, "'%s': properties is %s, not a TensorProperties", q,
                    global_name(props, g, sizeof g));
    /* TensorProperties.__getstate__ gives (dtype, layout, requires_grad,
     * memory_format, pin_memory); older torch pickles its __dict__ */
    const pk_value *st = props->u.call.state, *dt = NULL;
    if (st && st->kind == PK_TUPLE && pk_len(st) >= 1)
        dt = pk_at(st, 0);
    else
        dt = field(props, "dtype");
    if (!dt || dt->kind != PK_GLOBAL || strcmp(dt->u.global.module, "torch") != 0)
        return fail(c, "'%s': its dtype is %s, not a torch dtype", q, global_name(dt, g, sizeof g));
    snprintf(t->torch_dtype, sizeof t->torch_dtype, "%s", dt->u.global.name);
    const char *sd = torch_dtype_name(dt->u.global.name);
    snprintf(t->dtype, sizeof t->dtype, "%s", sd ? sd : "");
    uint64_t size[CKPT_MAX_NDIM];
    if (!parse_size(field(v, "size"), size, &t->ndim))
        return fail(c, "'%s': its size is not a torch.Size of at most %d dimensions", q,
                    CKPT_MAX_NDIM);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, size[d], &numel))
            return fail(c, "'%s': its size overflows", q);
    unsigned es = ckpt_dtype_size(t->dtype);
    if (es && __builtin_mul_overflow(numel, es, &numel))
        return fail(c, "'%s': its size in bytes overflows", q);
    const pk_value *chunks = field(v, "chunks");
    if (!chunks || chunks->kind != PK_LIST)
        return fail(c, "'%s': its chunks are not a list", q);
    size_t n = pk_len(chunks);
    if (n > c->max_chunks - *total_chunks)
        return c->max_chunks < DCP_MAX_CHUNKS
                   ? fail(c, "more chunks than the pickle has values (shared chunk lists)")
                   : fail(c, "more than %u chunks", DCP_MAX_CHUNKS);
    *total_chunks += n;
    /* the size, then each chunk's offsets and sizes */
    t->fqn = fqn;
    t->chunks = calloc(n ? n : 1, sizeof *t->chunks);
    size_t ndims = (1 + 2 * n) * t->ndim; /* n <= DCP_MAX_CHUNKS: no overflow */
    t->dims = malloc((ndims ? ndims : 1) * sizeof *t->dims);
    if (!t->chunks || !t->dims) {
        free(t->chunks);
        free(t->dims);
        memset(t, 0, sizeof *t);
        return -ENOMEM;
    }
    c->md->n_tensors++; /* owned by md from here on */
    memcpy(t->dims, size, t->ndim * sizeof *size);
    t->size = t->dims;
    for (size_t i = 0; i < n; i++) {
        const pk_value *ch = pk_at(chunks, i);
        dcp_chunk *k = &t->chunks[i];
        uint64_t *ko = t->dims + (1 + 2 * i) * t->ndim, *ks = ko + t->ndim;
        uint64_t tmp[CKPT_MAX_NDIM];
        uint32_t no = 0, ns = 0;
        if (!is_obj(ch, MOD_MD, "ChunkStorageMetadata"))
            return fail(c, "'%s': chunk %zu is %s, not a ChunkStorageMetadata", q, i,
                        global_name(ch, g, sizeof g));
        if (!parse_size(field(ch, "offsets"), tmp, &no) || no != t->ndim ||
            (memcpy(ko, tmp, no * sizeof *tmp), !parse_size(field(ch, "sizes"), tmp, &ns)) ||
            ns != t->ndim)
            return fail(c,
                        "'%s': chunk %zu's offsets or sizes are not a torch.Size of %u "
                        "dimensions",
                        q, i, t->ndim);
        memcpy(ks, tmp, ns * sizeof *tmp);
        k->offsets = ko;
        k->sizes = ks;
        k->ndim = t->ndim;
        for (uint32_t d = 0; d < t->ndim; d++) {
            uint64_t end;
            if (__builtin_add_overflow(ko[d], ks[d], &end) || end > size[d])
                return fail(c, "'%s': chunk %zu runs past the tensor's size in dimension %u", q, i,
                            d);
        }
        k->item = DCP_NO_ITEM;
        t->n_chunks++;
    }
    qsort(t->chunks, t->n_chunks, sizeof *t->chunks, chunk_cmp);
    for (size_t i = 1; i < t->n_chunks; i++)
        if (chunk_cmp(&t->chunks[i - 1], &t->chunks[i]) == 0)
            return fail(c, "'%s': two chunks start at the same offsets", q);
    return 0;
}

static dcp_tensor *find_tensor(parse_ctx *c, const char *fqn, size_t *index)
{
    size_t lo = 0, hi = c->md->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->by_fqn[mid]->fqn, fqn);
        if (r == 0) {
            *index = (size_t)(c->by_fqn[mid] - c->md->tensors);
            return c->by_fqn[mid];
        }
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int parse_state_dict_metadata(parse_ctx *c, const pk_value *sdm)
{
    if (!sdm || sdm->kind != PK_DICT)
        return fail(c, "state_dict_metadata is not a dict");
    size_t n = pk_len(sdm) / 2;
    if (n > DCP_MAX_ENTRIES)
        return fail(c, "state_dict_metadata has %zu entries, more than the %u allowed", n,
                    DCP_MAX_ENTRIES);
    c->md->tensors = calloc(n ? n : 1, sizeof *c->md->tensors);
    c->bytes_fqns = calloc(n ? n : 1, sizeof *c->bytes_fqns);
    if (!c->md->tensors || !c->bytes_fqns)
        return -ENOMEM;
    size_t total_chunks = 0;
    char q[FMT_QUOTE_BUF], g[2 * FMT_QUOTE_BUF + 8];
    for (size_t i = 0; i < n; i++) {
        const pk_value *k = pk_at(sdm, 2 * i), *v = pk_at(sdm, 2 * i + 1);
        if (!str_ok(k, DCP_MAX_FQN))
            return fail(c, "state_dict_metadata key %zu is not a name of 1 to %u bytes", i,
                        DCP_MAX_FQN);
        fmt_quote_n(q, sizeof q, k->u.s.p, k->u.s.len);
        if (is_obj(v, MOD_MD, "BytesStorageMetadata")) {
            c->bytes_fqns[c->md->n_bytes++] = k->u.s.p;
        } else if (is_obj(v, MOD_MD, "TensorStorageMetadata")) {
            int rc = parse_tensor(c, k->u.s.p, v, &total_chunks);
            if (rc)
                return rc;
        } else {
            return fail(c, "'%s': unknown storage metadata %s", q, global_name(v, g, sizeof g));
        }
    }
    /* names are unique */
    c->by_fqn = malloc((c->md->n_tensors ? c->md->n_tensors : 1) * sizeof *c->by_fqn);
    if (!c->by_fqn)
        return -ENOMEM;
    for (size_t i = 0; i < c->md->n_tensors; i++)
        c->by_fqn[i] = &c->md->tensors[i];
    qsort(c->by_fqn, c->md->n_tensors, sizeof *c->by_fqn, fqn_cmp);
    qsort(c->bytes_fqns, c->md->n_bytes, sizeof *c->bytes_fqns, str_cmp);
    const char *dup = NULL;
    for (size_t i = 1; i < c->md->n_tensors && !dup; i++)
        if (strcmp(c->by_fqn[i - 1]->fqn, c->by_fqn[i]->fqn) == 0)
            dup = c->by_fqn[i]->fqn;
    for (size_t i = 1; i < c->md->n_bytes && !dup; i++)
        if (strcmp(c->bytes_fqns[i - 1], c->bytes_fqns[i]) == 0)
            dup = c->bytes_fqns[i];
    for (size_t i = 0; i < c->md->n_bytes && !dup; i++) {
        size_t ti;
        if (find_tensor(c, c->bytes_fqns[i], &ti))
            dup = c->bytes_fqns[i];
    }
    if (dup) {
        quote_fqn(q, sizeof q, dup);
        return fail(c, "'%s' appears twice in state_dict_metadata", q);
    }
    return 0;
}

static bool is_bytes_fqn(parse_ctx *c, const char *fqn)
{
    return bsearch(&fqn, c->bytes_fqns, c->md->n_bytes, sizeof *c->bytes_fqns, str_cmp) != NULL;
}

static int parse_item(parse_ctx *c, size_t i, const pk_value *key, const pk_value *val)
{
    char q[FMT_QUOTE_BUF], g[2 * FMT_QUOTE_BUF + 8];
    if (!is_obj(key, MOD_MD, "MetadataIndex"))
        return fail(c, "storage_data key %zu is %s, not a MetadataIndex", i,
                    global_name(key, g, sizeof g));
    const pk_value *fq = field(key, "fqn");
    if (!str_ok(fq, DCP_MAX_FQN))
        return fail(c, "storage_data key %zu has no fqn of 1 to %u bytes", i, DCP_MAX_FQN);
    fmt_quote_n(q, sizeof q, fq->u.s.p, fq->u.s.len);
    if (!is_obj(val, MOD_FS, "_StorageInfo"))
        return fail(c, "'%s': its storage is %s, not a _StorageInfo", q,
                    global_name(val, g, sizeof g));
    const pk_value *rp = field(val, "relative_path"), *td = field(val, "transform_descriptors");
    int64_t off, len;
    if (!str_ok(rp, DCP_MAX_PATH))
        return fail(c, "'%s': its relative_path is not a name of 1 to %u bytes", q, DCP_MAX_PATH);
    if (!pk_int(field(val, "offset"), &off) || !pk_int(field(val, "length"), &len) || off < 0 ||
        len < 0)
        return fail(c, "'%s': its offset or length is not an integer >= 0", q);
    if (td && td->kind != PK_NONE && td->kind != PK_LIST && td->kind != PK_TUPLE)
        return fail(c, "'%s': its transform_descriptors are not a list", q);

    dcp_item it = {.offset = (uint64_t)off,
                   .length = (uint64_t)len,
                   .transformed = td && td->kind != PK_NONE && pk_len(td) > 0};
    size_t ti;
    dcp_tensor *t = find_tensor(c, fq->u.s.p, &ti);
    const pk_value *ko = field(key, "offset");
    if (t) {
        uint64_t po[CKPT_MAX_NDIM];
        dcp_chunk probe = {.offsets = po, .ndim = t->ndim};
        uint32_t n = 0;
        if (!parse_size(ko, po, &n) || n != t->ndim)
            return fail(c, "'%s': its storage key's offset is not a torch.Size of %u dimensions", q,
                        t->ndim);
        dcp_chunk *k = bsearch(&probe, t->chunks, t->n_chunks, sizeof *t->chunks, chunk_cmp);
        if (!k)
            return fail(c, "'%s': a storage item names a chunk the tensor does not have", q);
        if (k->item != DCP_NO_ITEM)
            return fail(c, "'%s': two storage items name the same chunk", q);
        k->item = c->md->n_items;
        it.kind = DCP_ITEM_TENSOR;
        it.tensor = ti;
        it.chunk = (size_t)(k - t->chunks);
    } else if (is_bytes_fqn(c, fq->u.s.p)) {
        if (ko && ko->kind != PK_NONE)
            return fail(c, "'%s': a bytes item has a chunk offset", q);
        it.kind = DCP_ITEM_BYTES;
        it.tensor = it.chunk = DCP_NO_ITEM;
    } else {
        return fail(c, "a storage item names '%s', which state_dict_metadata does not", q);
    }
    it.fqn = fq->u.s.p;
    it.relative_path = rp->u.s.p;
    c->md->items[c->md->n_items++] = it;
    return 0;
}

static int item_cmp(const void *a, const void *b)
{
    const dcp_item *x = a, *y = b;
    int r = strcmp(x->relative_path, y->relative_path);
    if (r)
        return r;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->length != y->length)
        return x->length < y->length ? -1 : 1;
    return 0;
}

static int parse_storage_data(parse_ctx *c, const pk_value *sd)
{
    if (!sd || sd->kind != PK_DICT)
        return fail(c, "storage_data is not a dict");
    size_t n = pk_len(sd) / 2;
    if (n > DCP_MAX_ITEMS)
        return fail(c, "storage_data has %zu items, more than the %u allowed", n, DCP_MAX_ITEMS);
    c->md->items = calloc(n ? n : 1, sizeof *c->md->items);
    if (!c->md->items)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = parse_item(c, i, pk_at(sd, 2 * i), pk_at(sd, 2 * i + 1));
        if (rc)
            return rc;
    }
    qsort(c->md->items, c->md->n_items, sizeof *c->md->items, item_cmp);
    /* the chunks' item indices follow the sort */
    for (size_t i = 0; i < c->md->n_items; i++) {
        dcp_item *it = &c->md->items[i];
        if (it->kind == DCP_ITEM_TENSOR)
            c->md->tensors[it->tensor].chunks[it->chunk].item = i;
    }
    /* Sorted by file and offset, an item overlaps an earlier one exactly
     * when it starts before the furthest end reached so far in its file
     * (not only its neighbour's: a long item may cover several). */
    const dcp_item *furthest = NULL;
    for (size_t i = 0; i < c->md->n_items; i++) {
        const dcp_item *a = furthest, *b = &c->md->items[i];
        if (b->length == 0)
            continue; /* an empty item overlaps nothing */
        int same_file = a && strcmp(a->relative_path, b->relative_path) == 0;
        if (!same_file || b->offset + b->length > a->offset + a->length)
            furthest = b;
        if (!same_file || a->offset + a->length <= b->offset)
            continue;
        char qa[FMT_QUOTE_BUF], qb[FMT_QUOTE_BUF], qp[FMT_QUOTE_BUF];
        quote_fqn(qa, sizeof qa, a->fqn);
        quote_fqn(qb, sizeof qb, b->fqn);
        quote_fqn(qp, sizeof qp, a->relative_path);
        return fail(c, "items of '%s' overlap: '%s' at [%llu, %llu) and '%s' at [%llu, %llu)", qp,
                    qa, (unsigned long long)a->offset, (unsigned long long)(a->offset + a->length),
                    qb, (unsigned long long)b->offset, (unsigned long long)(b->offset + b->length));
    }
    return 0;
}

void dcp_metadata_free(dcp_metadata *md)
{
    if (!md)
        return;
    for (size_t i = 0; i < md->n_tensors; i++) {
        free(md->tensors[i].chunks);
        free(md->tensors[i].dims);
    }
    free(md->tensors);
    free(md->items);
    pickle_free(md->doc);
    memset(md, 0, sizeof *md);
}

int dcp_metadata_parse(const uint8_t *data, size_t len, dcp_metadata *md, char *msg, size_t msg_len)
{
    memset(md, 0, sizeof *md);
    fmt_msg(msg, msg_len, "%s", "");
    parse_ctx c = {.md = md, .msg = msg, .msg_len = msg_len};
    char why[400], g[2 * FMT_QUOTE_BUF + 8];
    if (len > DCP_MAX_METADATA)
        return fail(&c, "%zu bytes, more than the %u allowed", len, DCP_MAX_METADATA);
    pickle_doc *doc = NULL;
    /* Metadata nests about a dozen levels deep */
    pickle_limits lim = {.max_input = DCP_MAX_METADATA, .max_depth = 64};
    int rc = pickle_parse(data, len, &lim, &doc, why, sizeof why);
    if (rc == -ENOMEM)
        goto oom;
    if (rc) {
        fail(&c, "%s", why);
        goto out;
    }
    md->doc = doc; /* the strings point into it */
    c.max_chunks =
        pickle_node_count(doc) < DCP_MAX_CHUNKS ? pickle_node_count(doc) : DCP_MAX_CHUNKS;
    const pk_value *root = pickle_root(doc);
    if (!is_obj(root, MOD_MD, "Metadata")) {
        rc = fail(&c, "the pickle holds %s, not a " MOD_MD ".Metadata",
                  global_name(root, g, sizeof g));
        goto out;
    }
    rc = parse_state_dict_metadata(&c, field(root, "state_dict_metadata"));
    if (rc == 0)
        rc = parse_storage_data(&c, field(root, "storage_data"));
    if (rc == -ENOMEM)
        goto oom;
    goto out;
oom:
    fmt_msg(msg, msg_len, MSG_PREFIX "out of memory");
    rc = -ENOMEM;
out:
    if (rc)
        dcp_metadata_free(md);
    else if (!md->doc)
        pickle_free(doc);
    free(c.by_fqn);
    free(c.bytes_fqns);
    return rc;
}

/* ------------------------------------------------------------ the layout */

typedef struct acc {
    ingest_tensor *t;
    size_t n_t, cap_t;
    ingest_region *r;
    size_t n_r, cap_r;
    ingest_skipped *sk;
    size_t n_sk, cap_sk;
    ingest_chunk *ch;
    size_t n_ch, cap_ch;
} acc;

static int grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? 2 * *cap : 16;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static int add_skipped(acc *a, const char *name, const char *reason)
{
    if (grow((void **)&a->sk, &a->cap_sk, a->n_sk, sizeof *a->sk))
        return -ENOMEM;
    ingest_skipped *s = &a->sk[a->n_sk];
    if (!(s->name = strdup(name)))
        return -ENOMEM;
    snprintf(s->reason, sizeof s->reason, "%s", reason);
    s->damaged = false;
    a->n_sk++;
    return 0;
}

/* Where chunk k named name lies in t, for assembling (formats.h). */
static int add_chunk(acc *a, const char *name, const dcp_tensor *t, const dcp_chunk *k)
{
    if (grow((void **)&a->ch, &a->cap_ch, a->n_ch, sizeof *a->ch))
        return -ENOMEM;
    ingest_chunk *c = &a->ch[a->n_ch];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    c->whole = strdup(t->fqn);
    if (!c->name || !c->whole) {
        free(c->name);
        free(c->whole);
        return -ENOMEM;
    }
    c->ndim = t->ndim;
    memcpy(c->whole_shape, t->size, t->ndim * sizeof *t->size);
    memcpy(c->offsets, k->offsets, t->ndim * sizeof *k->offsets);
    a->n_ch++;
    return 0;
}

static int add_regions(acc *a, const ingest_layout *l)
{
    for (size_t i = 0; i < l->n_regions; i++) {
        if (grow((void **)&a->r, &a->cap_r, a->n_r, sizeof *a->r))
            return -ENOMEM;
        a->r[a->n_r++] = l->regions[i];
    }
    return 0;
}

static void acc_free(acc *a)
{
    for (size_t i = 0; i < a->n_t; i++)
        free(a->t[i].name);
    free(a->t);
    free(a->r);
    for (size_t i = 0; i < a->n_sk; i++)
        free(a->sk[i].name);
    free(a->sk);
    for (size_t i = 0; i < a->n_ch; i++) {
        free(a->ch[i].name);
        free(a->ch[i].whole);
    }
    free(a->ch);
    memset(a, 0, sizeof *a);
}

static int tensor_cmp(const void *x, const void *y)
{
    const ingest_tensor *a = x, *b = y;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int region_cmp(const void *x, const void *y)
{
    const ingest_region *a = x, *b = y;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Hands the accumulated layout to out: 0, or 1 when it holds nothing.
 * With keep_skipped, skipped entries alone are something: a file whose
 * every item .metadata names was skipped (all of them transformed, as
 * FileSystemWriter(_extensions=[ZStandard()]) writes them) stays opaque
 * bytes but keeps saying why it has no tensor. So does one whose .metadata
 * was not used (unreadable, refused, naming none of its items: a ".metadata"
 * entry says why) and whose scan found no torch archive (its items
 * compressed too): without that entry it would be a dcp file with no
 * tensor and no word why. */
static int acc_finish(acc *a, ingest_layout *out, bool keep_skipped)
{
    if (!a->n_t && !a->n_r && !(keep_skipped && a->n_sk)) {
        acc_free(a);
        return 1;
    }
    if (a->n_t)
        qsort(a->t, a->n_t, sizeof *a->t, tensor_cmp);
    if (a->n_r)
        qsort(a->r, a->n_r, sizeof *a->r, region_cmp);
    out->t = a->t;
    out->n = a->n_t;
    out->regions = a->r;
    out->n_regions = a->n_r;
    out->skipped = a->sk;
    out->n_skipped = a->n_sk;
    out->chunks = a->ch;
    out->n_chunks = a->n_ch;
    out->header_bytes = out->n ? out->t[0].offset : out->n_regions ? out->regions[0].offset : 0;
    memset(a, 0, sizeof *a);
    return 0;
}

/* ------------------------------------------------------------ with .metadata */

/* FQN, or FQN@o0,o1,... for a chunk that is not the whole tensor. */
static void chunk_name(char *dst, size_t cap, const dcp_tensor *t, const dcp_chunk *k)
{
    bool whole = true;
    for (uint32_t d = 0; d < t->ndim; d++)
        whole &= k->offsets[d] == 0 && k->sizes[d] == t->size[d];
    size_t o = (size_t)snprintf(dst, cap, "%s", t->fqn);
    if (whole || o >= cap)
        return;
    for (uint32_t d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(dst + o, cap - o, "%c%llu", d ? ',' : '@',
                              (unsigned long long)k->offsets[d]);
}

/* One tensor chunk's item: its storages as regions, and the tensor. */
/* A failure of the source itself (not of the bytes read) ends describe(). */
static int source_failed(int rc, const char *what, char *msg, size_t msg_len)
{
    if (rc >= 0 || rc == -EINVAL || rc == -EIO)
        return 0;
    if (rc == -ENOMEM)
        fmt_msg(msg, msg_len, "dcp: out of memory");
    else
        fmt_msg(msg, msg_len, "dcp: reading %s: %s", what, strerror(-rc));
    return rc;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int describe_chunk(acc *a, const ingest_source *src, const dcp_metadata *md,
                          const dcp_item *it, const char *const *fqns, char *msg, size_t msg_len)
{
    const dcp_tensor *t = &md->tensors[it->tensor];
    const dcp_chunk *k = &t->chunks[it->chunk];
    char name[MAX_NAME], why[400], reason[96];
    chunk_name(name, sizeof name, t, k);
    /* "a@0" may be both a tensor's fqn and a chunk of "a": the tensor keeps
     * the name, in whichever file each lies */
    const char *np = name;
    if (strcmp(name, t->fqn) != 0 && bsearch(&np, fqns, md->n_tensors, sizeof *fqns, str_ptr_cmp))
        return add_skipped(a, name, "a tensor has this chunk's name");
    ingest_layout sub;
    int rc = torch_describe_range(src, it->offset, it->length, "dcp-item", &sub, why, sizeof why);
    if (rc < 0) {
        char q[FMT_QUOTE_BUF];
        fmt_quote(q, sizeof q, name);
        char what[FMT_QUOTE_BUF + 16];
        snprintf(what, sizeof what, "'%s'", q);
        if ((rc = source_failed(rc, what, msg, msg_len)))
            return rc;
        return add_skipped(a, name, "its item is not a torch archive this reader understands");
    }
    rc = add_regions(a, &sub);
    if (rc == 0) {
        bool same = sub.n == 1 && t->dtype[0] && strcmp(sub.t[0].dtype, t->dtype) == 0 &&
                    sub.t[0].ndim == t->ndim;
        for (uint32_t d = 0; same && d < t->ndim; d++)
            same = sub.t[0].shape[d] == k->sizes[d];
        if (!t->dtype[0]) {
            fmt_msg(reason, sizeof reason, "its dtype torch.%s is not supported", t->torch_dtype);
            rc = add_skipped(a, name, reason);
        } else if (sub.n == 0 && sub.n_skipped) {
            rc = add_skipped(a, name, sub.skipped[0].reason);
            if (rc == 0)
                a->sk[a->n_sk - 1].damaged = sub.skipped[0].damaged;
        } else if (sub.n != 1) {
            fmt_msg(reason, sizeof reason, "its item holds %zu tensors, not one", sub.n);
            rc = add_skipped(a, name, reason);
        } else if (!same) {
            rc = add_skipped(a, name,
                             "its item's tensor differs from the metadata's dtype or shape");
        } else if (grow((void **)&a->t, &a->cap_t, a->n_t, sizeof *a->t)) {
            rc = -ENOMEM;
        } else {
            ingest_tensor *dst = &a->t[a->n_t];
            *dst = sub.t[0];
            if (!(dst->name = strdup(name)))
                rc = -ENOMEM;
            else
                a->n_t++;
            if (rc == 0 && strcmp(name, t->fqn) != 0)
                rc = add_chunk(a, name, t, k);
        }
    }
    ingest_layout_free(&sub);
    return rc;
}

static int describe_items(acc *a, const ingest_source *src, const char *base,
                          const dcp_metadata *md, char *msg, size_t msg_len)
{
    size_t mine = 0;
    for (size_t i = 0; i < md->n_items; i++) {
        const dcp_item *it = &md->items[i];
        if (strcmp(it->relative_path, base) != 0)
            continue;
        mine++;
        if (it->offset > src->size || it->length > src->size - it->offset) {
            char q[FMT_QUOTE_BUF];
            fmt_quote(q, sizeof q, it->fqn);
            fmt_msg(msg, msg_len,
                    "dcp: .metadata places '%s' at [%llu, %llu), past the end of the file "
                    "(%llu bytes)",
                    q, (unsigned long long)it->offset,
                    (unsigned long long)(it->offset + it->length), (unsigned long long)src->size);
            return -EINVAL;
        }
    }
    if (!mine)
        return 1;
    const char **fqns = malloc((md->n_tensors ? md->n_tensors : 1) * sizeof *fqns);
    if (!fqns)
        return -ENOMEM;
    for (size_t i = 0; i < md->n_tensors; i++)
        fqns[i] = md->tensors[i].fqn;
    qsort(fqns, md->n_tensors, sizeof *fqns, str_ptr_cmp);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < md->n_items; i++) {
        const dcp_item *it = &md->items[i];
        if (strcmp(it->relative_path, base) != 0)
            continue;
        if (it->transformed) {
            char name[MAX_NAME];
            if (it->kind == DCP_ITEM_TENSOR)
                chunk_name(name, sizeof name, &md->tensors[it->tensor],
                           &md->tensors[it->tensor].chunks[it->chunk]);
            else
                snprintf(name, sizeof name, "%s", it->fqn);
            rc = add_skipped(a, name,
                             "its item is transformed (compressed or encrypted DCP); "
                             "kept opaque");
        } else if (it->kind == DCP_ITEM_TENSOR) {
            rc = describe_chunk(a, src, md, it, fqns, msg, msg_len);
        } else {
            /* a bytes item: any storages it holds are regions */
            ingest_layout sub;
            char why[400];
            rc = torch_describe_range(src, it->offset, it->length, "dcp-item", &sub, why,
                                      sizeof why);
            if (rc == 0)
                rc = add_regions(a, &sub);
            else
                rc = source_failed(rc, "a bytes item", msg, msg_len);
            ingest_layout_free(&sub);
        }
    }
    free(fqns);
    return rc;
}

/* ------------------------------------------------------------ the scan */

#define SCAN_BLOCK (1u << 20)

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Whether an end of central directory record at e ends the archive that
 * starts at start: its central directory (located through the zip64
 * records when there are some) ends right before the records that follow
 * it. Sets *end past the record and its comment. */
static int eocd_ends(const ingest_source *src, uint64_t start, uint64_t e, uint64_t *end)
{
    uint8_t r[22], loc[20], z[56];
    if (e > src->size || src->size - e < sizeof r)
        return 0;
    int rc = fmt_read_exact(src, r, sizeof r, e);
    if (rc)
        return rc;
    uint64_t stop = e + 22 + (uint64_t)(r[20] | r[21] << 8);
    if (stop > src->size || (r[4] | r[5] | r[6] | r[7]))
        return 0;
    uint64_t cd_size = le32(r + 12), cd_off = le32(r + 16), cd_end_at = e;
    if (e >= start + 20 && (rc = fmt_read_exact(src, loc, sizeof loc, e - 20)) == 0 &&
        le32(loc) == 0x07064b50) {
        uint64_t zoff = le64(loc + 8), zpos;
        if (zoff > src->size - start || (zpos = start + zoff) > e - 20 ||
            e - 20 - zpos < sizeof z || fmt_read_exact(src, z, sizeof z, zpos) ||
            le32(z) != 0x06064b50 || le64(z + 4) != e - 20 - zpos - 12)
            return 0;
        cd_size = le64(z + 40);
        cd_off = le64(z + 48);
        cd_end_at = zpos;
    } else if (rc && rc != -EIO) {
        return rc;
    }
    uint64_t cd_end;
    if (__builtin_add_overflow(cd_off, cd_size, &cd_end) || cd_end != cd_end_at - start)
        return 0;
    *end = stop;
    return 1;
}

/* The end of the archive that starts at start (a zip local header): the
 * first end of central directory record after it that ends it. 0 if none. */
static int archive_end(const ingest_source *src, uint64_t start, uint8_t *buf, uint64_t *end)
{
    uint64_t pos = start + 30;
    while (pos < src->size && src->size - pos >= 22) {
        uint64_t left = src->size - pos;
        size_t n = left < SCAN_BLOCK ? (size_t)left : SCAN_BLOCK;
        int rc = fmt_read_exact(src, buf, n, pos);
        if (rc)
            return rc;
        for (size_t i = 0; i + 4 <= n; i++) {
            if (buf[i] != 'P' || buf[i + 1] != 'K' || buf[i + 2] != 5 || buf[i + 3] != 6)
                continue;
            rc = eocd_ends(src, start, pos + i, end);
            if (rc)
                return rc;
        }
        if (n < 4)
            break;
        pos += n - 3; /* a signature across the block boundary */
        if (n < SCAN_BLOCK)
            break;
    }
    return 0;
}

/* The file as a sequence of torch.save archives, as far as it is one. */
static int scan_archives(acc *a, const ingest_source *src)
{
    uint8_t *buf = malloc(SCAN_BLOCK);
    if (!buf)
        return -ENOMEM;
    uint64_t pos = 0;
    int rc = 0;
    for (size_t n = 0; n < DCP_MAX_ITEMS && src->size - pos >= 52; n++) {
        uint8_t sig[4];
        uint64_t end = 0;
        if (fmt_read_exact(src, sig, 4, pos) || le32(sig) != 0x04034b50)
            break;
        if ((rc = archive_end(src, pos, buf, &end)) != 1) {
            rc = rc == -ENOMEM ? rc : 0;
            break;
        }
        ingest_layout sub;
        char why[400];
        rc = torch_describe_range(src, pos, end - pos, "dcp-item", &sub, why, sizeof why);
        if (rc == 0)
            rc = add_regions(a, &sub);
        ingest_layout_free(&sub);
        if (rc < 0) {
            rc = rc == -ENOMEM ? rc : 0;
            break;
        }
        rc = 0;
        pos = end;
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------ the format */

static int dcp_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    (void)head;
    (void)head_len;
    (void)size;
    static const char ext[] = ".distcp";
    size_t n = path ? strlen(path) : 0;
    return n >= sizeof ext && strcmp(path + n - (sizeof ext - 1), ext) == 0;
}

static int dcp_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                        size_t msg_len)
{
    memset(out, 0, sizeof *out);
    fmt_msg(msg, msg_len, "%s", "");
    acc a = {0};
    const char *slash = path ? strrchr(path, '/') : NULL;
    const char *base = slash ? slash + 1 : path ? path : "";
    int rc = 1;
    bool named = false; /* .metadata names items of this file */
    bool noted = false; /* ...or a ".metadata" entry says why it was not used */
    if (src->read_sibling) {
        uint8_t *data = NULL;
        size_t len = 0;
        int r = src->read_sibling(src->sibling_ud, ".metadata", &data, &len, DCP_MAX_METADATA);
        char note[96] = "";
        if (r == 0) {
            dcp_metadata md;
            char why[512];
            r = dcp_metadata_parse(data, len, &md, why, sizeof why);
            if (r == 0) {
                rc = describe_items(&a, src, base, &md, msg, msg_len);
                named = rc == 0;
                if (rc == 1)
                    fmt_msg(note, sizeof note, "ignored: it names no item of this file");
            } else if (r != -ENOMEM) {
                size_t pl = strlen(MSG_PREFIX);
                fmt_msg(note, sizeof note, "ignored: %s",
                        strncmp(why, MSG_PREFIX, pl) == 0 ? why + pl : why);
            } else {
                rc = -ENOMEM;
            }
            dcp_metadata_free(&md);
        } else if (r != -ENOENT) {
            fmt_msg(note, sizeof note, "not read: %s", strerror(-r));
        }
        free(data);
        if (rc == 1 && note[0]) {
            if (add_skipped(&a, ".metadata", note))
                rc = -ENOMEM;
            noted = true;
        }
        if (rc < 0)
            goto fail;
    }
    if (rc == 1 && (rc = scan_archives(&a, src)) < 0)
        goto fail;
    return acc_finish(&a, out, named || noted);
fail:
    if (rc == -ENOMEM)
        fmt_msg(msg, msg_len, "dcp: out of memory");
    acc_free(&a);
    memset(out, 0, sizeof *out);
    return rc;
}

const container_format ckpt_format_dcp = {
    .name = "dcp",
    .sniff = dcp_sniff,
    .describe = dcp_describe,
};
