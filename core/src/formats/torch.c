/* torch.save archives as a container_format (see torch.h). Three passes over
 * the pickle's value graph, so that nothing depends on walk order:
 *   1. every persistent id names a storage record: collect them by key;
 *   2. every rebuild call gives untyped storages their dtype (torch >= 2.1
 *      saves untyped storages for dtypes without a *Storage class);
 *   3. a bounded walk from the root names the tensors.
 * The walk is bounded in depth and in total visits because the graph may
 * share nodes or loop (pickle.h).
 *
 * One job at about 900 lines: the three steps above read one archive and
 * hand each other its records; the zip and the pickle machine are zip.c
 * and pickle.c. */
#include "formats/torch.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "formats/fmt_util.h"
#include "formats/pickle.h"
#include "formats/zip.h"

#define MAX_NAME 1024         /* a dotted tensor name */
#define MAX_KEY 64            /* a storage key ("0", "1", ...) */
#define MAX_WALK_DEPTH 64     /* state dicts nest a handful of levels */
#define MAX_VISITS (1u << 22) /* nodes visited by the naming walk */
/* Tensors found (presented or skipped): each costs an ingest_tensor (about
 * 300 bytes) and its name, so a pickle that names one tensor a million ways
 * through the memo is refused rather than allowed to take gigabytes. Real
 * state dicts hold thousands; optimizer states a few times that. */
#define MAX_TENSORS (1u << 18)

/* ------------------------------------------------------------ dtypes */

static const struct {
    const char *cls, *dtype;
} storage_classes[] = {
    {"FloatStorage", "F32"},     {"DoubleStorage", "F64"}, {"HalfStorage", "F16"},
    {"BFloat16Storage", "BF16"}, {"LongStorage", "I64"},   {"IntStorage", "I32"},
    {"ShortStorage", "I16"},     {"CharStorage", "I8"},    {"ByteStorage", "U8"},
    {"BoolStorage", "BOOL"},
};

static const struct {
    const char *torch, *dtype;
} torch_dtypes[] = {
    {"float32", "F32"},
    {"float", "F32"},
    {"float64", "F64"},
    {"double", "F64"},
    {"float16", "F16"},
    {"half", "F16"},
    {"bfloat16", "BF16"},
    {"int64", "I64"},
    {"long", "I64"},
    {"int32", "I32"},
    {"int", "I32"},
    {"int16", "I16"},
    {"short", "I16"},
    {"int8", "I8"},
    {"uint8", "U8"},
    {"bool", "BOOL"},
    {"uint16", "U16"},
    {"uint32", "U32"},
    {"uint64", "U64"},
    {"float8_e4m3fn", "F8_E4M3"},
    {"float8_e5m2", "F8_E5M2"},
};

/* The dtype a storage class names, "" for an untyped storage, NULL if not
 * understood. */
static const char *storage_class_dtype(const pk_value *g)
{
    if (!g || g->kind != PK_GLOBAL)
        return NULL;
    const char *m = g->u.global.module, *n = g->u.global.name;
    if ((strcmp(m, "torch") == 0 || strcmp(m, "torch.storage") == 0) &&
        (strcmp(n, "UntypedStorage") == 0 || strcmp(n, "_UntypedStorage") == 0))
        return "";
    if (strcmp(m, "torch") != 0 && strcmp(m, "torch.cuda") != 0)
        return NULL;
    for (size_t i = 0; i < sizeof storage_classes / sizeof storage_classes[0]; i++)
        if (strcmp(n, storage_classes[i].cls) == 0)
            return storage_classes[i].dtype;
    return NULL;
}

/* The dtype a torch.<dtype> global names, or NULL. */
static const char *torch_dtype(const pk_value *g)
{
    if (!g || g->kind != PK_GLOBAL || strcmp(g->u.global.module, "torch") != 0)
        return NULL;
    for (size_t i = 0; i < sizeof torch_dtypes / sizeof torch_dtypes[0]; i++)
        if (strcmp(g->u.global.name, torch_dtypes[i].torch) == 0)
            return torch_dtypes[i].dtype;
    return NULL;
}

/* ------------------------------------------------------------ storages */

typedef struct storage {
    const char *key;      /* in the pickle doc */
    const pk_value *type; /* the storage class global */
    int64_t numel;
    bool untyped;
    char dtype[16];          /* "" while unknown */
    bool conflict;           /* used with two dtypes: not understood */
    const pk_value *unknown; /* a dtype global _rebuild_tensor_v3 gave it that no
                              * pack dtype matches (torch.complex32) */
    const zip_entry *e;      /* its record, when usable */
    const char *problem;     /* why it is not usable */
    bool damaged;            /* ...and torch.load refuses the file for it */
} storage;

static const char DTYPE_UNSUPPORTED[] = "its storage's dtype is not supported";

typedef struct torch_ctx {
    const zip_archive *z;
    const char *dir; /* the archive's directory, "archive" */
    storage *st;
    size_t n_st;
    ingest_tensor *t;
    size_t n_t, cap_t;
    ingest_skipped *sk;
    size_t n_sk, cap_sk;
    size_t visits;
    char name[MAX_NAME + 1];
    int err;         /* -ENOMEM once out of memory */
    bool big_endian; /* <dir>/byteorder says "big": no tensor is presented */
    size_t shadowed; /* > 0 below a dict entry whose key comes again later */
} torch_ctx;

/* ('storage', storage_type, key, location, numel) */
static bool parse_persid(const pk_value *p, const char **key, const pk_value **type, int64_t *numel)
{
    const pk_value *pid = p && p->kind == PK_PERSID ? p->u.persid : NULL;
    if (!pid || pid->kind != PK_TUPLE || pk_len(pid) != 5 || !pk_is_str(pk_at(pid, 0), "storage"))
        return false;
    const pk_value *k = pk_at(pid, 2);
    if (pk_at(pid, 1)->kind != PK_GLOBAL || k->kind != PK_STR || k->u.s.len == 0 ||
        k->u.s.len > MAX_KEY || memchr(k->u.s.p, '\0', k->u.s.len) ||
        memchr(k->u.s.p, '/', k->u.s.len) || !pk_int(pk_at(pid, 4), numel) || *numel < 0)
        return false;
    *key = k->u.s.p;
    *type = pk_at(pid, 1);
    return true;
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const storage *)a)->key, ((const storage *)b)->key);
}

static storage *find_storage(torch_ctx *c, const pk_value *persid)
{
    const char *key;
    const pk_value *type;
    int64_t numel;
    if (!parse_persid(persid, &key, &type, &numel))
        return NULL;
    storage probe = {.key = key};
    return bsearch(&probe, c->st, c->n_st, sizeof *c->st, by_key);
}

static void set_dtype(storage *s, const char *dtype)
{
    if (s->conflict)
        return;
    if (s->unknown || (s->dtype[0] && strcmp(s->dtype, dtype) != 0)) {
        s->conflict = true;
        s->dtype[0] = '\0';
        return;
    }
    snprintf(s->dtype, sizeof s->dtype, "%s", dtype);
}

/* Pass 1: one storage per key; the same key under two classes conflicts. */
static int collect_storages(torch_ctx *c, const pickle_doc *doc)
{
    size_t n = 0, total = pickle_node_count(doc);
    for (size_t i = 0; i < total; i++)
        if (pickle_node(doc, i)->kind == PK_PERSID)
            n++;
    c->st = calloc(n ? n : 1, sizeof *c->st);
    if (!c->st)
        return -ENOMEM;
    for (size_t i = 0; i < total; i++) {
        storage *s = &c->st[c->n_st];
        if (parse_persid(pickle_node(doc, i), &s->key, &s->type, &s->numel))
            c->n_st++;
    }
    qsort(c->st, c->n_st, sizeof *c->st, by_key);
    size_t out = 0;
    for (size_t i = 0; i < c->n_st; i++) {
        storage *s = &c->st[i];
        const char *dt = storage_class_dtype(s->type);
        if (out > 0 && strcmp(c->st[out - 1].key, s->key) == 0) {
            storage *first = &c->st[out - 1];
            if (!pk_is_global(s->type, first->type->u.global.module, first->type->u.global.name) ||
                s->numel != first->numel)
                first->conflict = true, first->dtype[0] = '\0';
            continue;
        }
        c->st[out] = *s;
        c->st[out].untyped = dt && !dt[0];
        if (dt && dt[0])
            set_dtype(&c->st[out], dt);
        out++;
    }
    c->n_st = out;
    return 0;
}

/* A rebuild call: its version (1, 2 or 3) and argument tuple, or 0. */
static int tensor_call(const pk_value *v, const pk_value **args)
{
    if (pk_is_call_of(v, "torch._tensor", "_rebuild_from_type_v2")) {
        /* (func, new_type, args, state) */
        const pk_value *a = v->u.call.args;
        if (pk_len(a) < 3 || pk_at(a, 0)->kind != PK_GLOBAL || pk_at(a, 2)->kind != PK_TUPLE)
            return 0;
        const pk_value *fn = pk_at(a, 0);
        *args = pk_at(a, 2);
        if (pk_is_global(fn, "torch._utils", "_rebuild_tensor_v2"))
            return 2;
        if (pk_is_global(fn, "torch._utils", "_rebuild_tensor_v3"))
            return 3;
        return 0;
    }
    if (!v || v->kind != PK_CALL || v->u.call.newobj)
        return 0;
    *args = v->u.call.args;
    if (pk_is_call_of(v, "torch._utils", "_rebuild_tensor"))
        return 1;
    if (pk_is_call_of(v, "torch._utils", "_rebuild_tensor_v2"))
        return 2;
    if (pk_is_call_of(v, "torch._utils", "_rebuild_tensor_v3"))
        return 3;
    return 0;
}

/* Pass 2: _rebuild_tensor_v3(storage, offset, size, stride, requires_grad,
 * hooks, dtype, ...) gives an untyped storage its dtype. */
static void type_untyped(torch_ctx *c, const pickle_doc *doc)
{
    size_t total = pickle_node_count(doc);
    for (size_t i = 0; i < total; i++) {
        const pk_value *args;
        if (tensor_call(pickle_node(doc, i), &args) != 3)
            continue;
        storage *s = find_storage(c, pk_at(args, 0));
        const char *dt = torch_dtype(pk_at(args, 6));
        if (!s || !s->untyped)
            continue;
        const pk_value *g = pk_at(args, 6);
        if (dt)
            set_dtype(s, dt);
        else if (!g || g->kind != PK_GLOBAL || s->dtype[0] ||
                 (s->unknown &&
                  !pk_is_global(g, s->unknown->u.global.module, s->unknown->u.global.name)))
            s->conflict = true, s->dtype[0] = '\0';
        else if (!s->conflict)
            s->unknown = g; /* one dtype, just not one a pack has */
    }
}

/* Why s is not usable, in why's room when it names the dtype: the
 * torch.complex32 that _rebuild_tensor_v3 gave it, or the class of a typed
 * storage (torch.ComplexFloatStorage). */
static const char *storage_problem(const storage *s, char *why, size_t cap)
{
    const pk_value *g = s->unknown ? s->unknown : s->type;
    if (!s->problem)
        return "its storage is not understood";
    if (s->problem != DTYPE_UNSUPPORTED || !g || g->kind != PK_GLOBAL)
        return s->problem;
    char m[48], n[48];
    fmt_quote(m, sizeof m, g->u.global.module);
    fmt_quote(n, sizeof n, g->u.global.name);
    snprintf(why, cap, "its dtype is not supported (%s.%s)", m, n);
    return why;
}

/* Finds each storage's record and checks it holds exactly the storage. */
static int resolve_storages(torch_ctx *c)
{
    char path[MAX_NAME + MAX_KEY + 16];
    for (size_t i = 0; i < c->n_st; i++) {
        storage *s = &c->st[i];
        snprintf(path, sizeof path, "%s/data/%s", c->dir, s->key);
        const zip_entry *e = zip_find(c->z, path);
        unsigned es = ckpt_dtype_size(s->dtype);
        uint64_t want;
        if (!e)
            s->problem = "its storage record is missing", s->damaged = true;
        else if (!zip_entry_is_raw(e))
            s->problem = "its storage record is compressed";
        else if (s->conflict)
            s->problem = "its storage is used with several dtypes";
        else if (!es)
            s->problem = DTYPE_UNSUPPORTED;
        else if (s->untyped
                     ? (uint64_t)s->numel != e->size || e->size % es
                     : __builtin_mul_overflow((uint64_t)s->numel, es, &want) || want != e->size)
            s->problem = "its storage record's size does not match the storage",
            s->damaged = true; /* torch.load: "record size ... does not match" */
        else
            s->e = e;
    }
    return 0;
}

/* ------------------------------------------------------------ tensors */

/* False (and the walk stops) once too many tensors were found. */
static bool room_for_tensor(torch_ctx *c)
{
    if (c->err)
        return false;
    if (c->n_t + c->n_sk >= MAX_TENSORS) {
        c->err = -E2BIG;
        return false;
    }
    return true;
}

/* Records c->name as skipped, without the count check (for moves). */
static void push_skipped(torch_ctx *c, const char *reason)
{
    if (c->err)
        return;
    if (c->n_sk == c->cap_sk) {
        size_t nc = c->cap_sk ? 2 * c->cap_sk : 16;
        ingest_skipped *p = realloc(c->sk, nc * sizeof *p);
        if (!p) {
            c->err = -ENOMEM;
            return;
        }
        c->sk = p;
        c->cap_sk = nc;
    }
    ingest_skipped *k = &c->sk[c->n_sk];
    k->name = strdup(c->name);
    if (!k->name) {
        c->err = -ENOMEM;
        return;
    }
    snprintf(k->reason, sizeof k->reason, "%s", reason);
    k->damaged = false;
    c->n_sk++;
}

static void add_skipped(torch_ctx *c, const char *reason)
{
    if (room_for_tensor(c))
        push_skipped(c, reason);
}

/* add_skipped for a fault torch.load refuses the whole file for. */
static void add_damaged(torch_ctx *c, const char *reason)
{
    size_t before = c->n_sk;
    add_skipped(c, reason);
    if (c->n_sk > before)
        c->sk[before].damaged = true;
}

static bool int_tuple(const pk_value *v, uint64_t *out, uint32_t *n)
{
    if (!v || v->kind != PK_TUPLE || pk_len(v) > CKPT_MAX_NDIM)
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

/* Whether the rebuild call's optional metadata (torch._utils.
 * get_tensor_metadata: argument 6 of _rebuild_tensor_v2, 7 of _v3) sets a
 * view bit. torch saves a negated view (torch._neg_view(x), or
 * c.conj().imag) as its storage's bytes plus {'neg': True}, and the loader
 * negates; those bytes are not the tensor's values. Absent, None or a dict
 * of false flags sets nothing; anything else is taken to set a bit. */
static bool sets_view_bits(int version, const pk_value *args)
{
    size_t at = version == 2 ? 6 : version == 3 ? 7 : SIZE_MAX;
    const pk_value *m = at < pk_len(args) ? pk_at(args, at) : NULL;
    if (!m || m->kind == PK_NONE)
        return false;
    if (m->kind != PK_DICT)
        return true;
    for (size_t i = 1; i < pk_len(m); i += 2) {
        int64_t x;
        if (!pk_int(pk_at(m, i), &x) || x != 0)
            return true;
    }
    return false;
}

/* The tensor at c->name, made by a rebuild call with these arguments. */
static void add_tensor(torch_ctx *c, int version, const pk_value *args)
{
    if (!room_for_tensor(c))
        return;
    ingest_tensor t = {0};
    uint64_t stride[CKPT_MAX_NDIM];
    uint32_t nstride = 0;
    int64_t soff;
    if (!c->name[0] || pk_len(args) < 4 || !pk_int(pk_at(args, 1), &soff) || soff < 0) {
        add_skipped(c, c->name[0] ? "its rebuild arguments are not understood"
                                  : "it has an empty name");
        return;
    }
    if (pk_len(pk_at(args, 2)) > CKPT_MAX_NDIM) {
        add_skipped(c, "it has more dimensions than supported");
        return;
    }
    if (!int_tuple(pk_at(args, 2), t.shape, &t.ndim) ||
        !int_tuple(pk_at(args, 3), stride, &nstride) || nstride != t.ndim) {
        add_skipped(c, "its size or stride is not understood");
        return;
    }
    storage *s = find_storage(c, pk_at(args, 0));
    if (!s) {
        add_skipped(c, "its storage is not understood");
        return;
    }
    if (!s->e) {
        char why[128];
        if (s->damaged)
            add_damaged(c, storage_problem(s, why, sizeof why));
        else
            add_skipped(c, storage_problem(s, why, sizeof why));
        return;
    }
    if (c->big_endian) {
        add_skipped(c, "the archive is big-endian");
        return;
    }
    const char *v3_dtype = version == 3 ? torch_dtype(pk_at(args, 6)) : NULL;
    if (version == 3 && (!v3_dtype || strcmp(s->dtype, v3_dtype) != 0)) {
        add_skipped(c, "its dtype differs from its storage's");
        return;
    }
    if (sets_view_bits(version, args)) {
        add_skipped(c, "it is a negated or conjugated view (torch metadata)");
        return;
    }
    unsigned es = ckpt_dtype_size(s->dtype);
    /* C-order: each dimension longer than 1 steps over all later ones. */
    uint64_t numel = 1, expect = 1;
    bool contiguous = true, overflow = false;
    for (uint32_t d = t.ndim; d-- > 0;) {
        if (t.shape[d] != 1 && stride[d] != expect)
            contiguous = false;
        overflow |= __builtin_mul_overflow(expect, t.shape[d], &expect);
        overflow |= __builtin_mul_overflow(numel, t.shape[d], &numel);
    }
    if (numel == 0)
        contiguous = true, overflow = false;
    if (overflow) {
        add_skipped(c, "its size overflows");
        return;
    }
    if (!contiguous) {
        add_skipped(c, "it is a non-contiguous view of its storage");
        return;
    }
    uint64_t end, first, len = s->e->size;
    if (__builtin_add_overflow((uint64_t)soff, numel, &end) ||
        __builtin_mul_overflow(end, es, &end) || end > len) {
        add_damaged(c, "its view runs past its storage"); /* torch: out of bounds */
        return;
    }
    first = (uint64_t)soff * es; /* <= end, so no overflow */
    snprintf(t.dtype, sizeof t.dtype, "%s", s->dtype);
    t.offset = s->e->data_offset + first;
    t.nbytes = numel * es;
    if (c->n_t == c->cap_t) {
        size_t nc = c->cap_t ? 2 * c->cap_t : 16;
        ingest_tensor *p = realloc(c->t, nc * sizeof *p);
        if (!p) {
            c->err = -ENOMEM;
            return;
        }
        c->t = p;
        c->cap_t = nc;
    }
    t.name = strdup(c->name);
    if (!t.name) {
        c->err = -ENOMEM;
        return;
    }
    c->t[c->n_t++] = t;
}

static void walk(torch_ctx *c, const pk_value *v, size_t depth);

/* Walks v under c->name + "." + seg (seg of seg_len bytes), then restores
 * c->name. */
static void walk_child(torch_ctx *c, const pk_value *v, const char *seg, size_t seg_len,
                       size_t depth)
{
    size_t at = strlen(c->name);
    size_t dot = at ? 1 : 0;
    if (memchr(seg, '\0', seg_len))
        return; /* no such name can be presented */
    if (at + dot + seg_len > MAX_NAME) {
        const pk_value *args;
        if (tensor_call(v, &args)) {
            add_skipped(c, "its name is too long");
        }
        return;
    }
    if (dot)
        c->name[at] = '.';
    memcpy(c->name + at + dot, seg, seg_len);
    c->name[at + dot + seg_len] = '\0';
    walk(c, v, depth + 1);
    c->name[at] = '\0';
}

/* A dict key as Python compares it: numbers by value (True == 1 == 1.0),
 * strings by their bytes, a Python 2 byte string as a string (torch.load
 * decodes it as UTF-8), bytes only with bytes (b"w" != "w"); other kinds
 * equal nothing here. A bigint never equals an int64 once pickle has
 * sized it, unless padded: not worth the cost. */
typedef struct keyed_pair {
    int cls; /* 0: compares with nothing, 1: number, 2: string, 3: bytes */
    int64_t i;
    const char *s;
    size_t len;
    size_t pair;
} keyed_pair;

static keyed_pair key_of(const pk_value *k, size_t pair)
{
    keyed_pair kp = {.pair = pair};
    if (k->kind == PK_INT || k->kind == PK_BOOL) {
        kp.cls = pk_int(k, &kp.i) ? 1 : 0;
    } else if (k->kind == PK_FLOAT && k->u.f > -9.2e18 && k->u.f < 9.2e18 &&
               k->u.f == (double)(int64_t)k->u.f) {
        kp.cls = 1;
        kp.i = (int64_t)k->u.f;
    } else if (k->kind == PK_STR || k->kind == PK_BYTES) {
        kp.cls = k->kind == PK_STR || k->py2_string ? 2 : 3;
        kp.s = k->u.s.p;
        kp.len = k->u.s.len;
    }
    return kp;
}

static int same_key_cmp(const keyed_pair *x, const keyed_pair *y)
{
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1;
    if (x->cls == 1)
        return x->i < y->i ? -1 : x->i > y->i;
    if (x->cls >= 2) {
        if (x->len != y->len)
            return x->len < y->len ? -1 : 1;
        return memcmp(x->s, y->s, x->len);
    }
    return 0;
}

static int keyed_pair_cmp(const void *a, const void *b)
{
    const keyed_pair *x = a, *y = b;
    int r = same_key_cmp(x, y);
    return r ? r : (x->pair < y->pair ? -1 : x->pair > y->pair);
}

/* A hostile pickle may set one key of a dict twice: torch.load keeps the
 * last value, so the earlier ones must not be presented as that name
 * (nor as another spelling of it: {1: a, True: b} is {1: b}). Returns a
 * flag per pair (NULL when none is shadowed), or sets c->err. */
static bool *shadowed_pairs(torch_ctx *c, const pk_value *const *items, size_t n_pairs)
{
    if (n_pairs < 2)
        return NULL;
    keyed_pair *ix = malloc(n_pairs * sizeof *ix);
    bool *flags = calloc(n_pairs, sizeof *flags);
    if (!ix || !flags) {
        free(ix);
        free(flags);
        c->err = -ENOMEM;
        return NULL;
    }
    for (size_t i = 0; i < n_pairs; i++)
        ix[i] = key_of(items[2 * i], i);
    qsort(ix, n_pairs, sizeof *ix, keyed_pair_cmp);
    bool any = false;
    for (size_t i = 0; i + 1 < n_pairs; i++)
        if (ix[i].cls && same_key_cmp(&ix[i], &ix[i + 1]) == 0)
            any = flags[ix[i].pair] = true;
    free(ix);
    if (!any) {
        free(flags);
        return NULL;
    }
    return flags;
}

static void walk_items(torch_ctx *c, const pk_value *const *items, size_t n, bool pairs,
                       size_t depth)
{
    char num[24];
    /* Counted up front, whatever is named: a dict or list reached through
     * the memo millions of times costs its length each time. */
    c->visits += n;
    if (c->visits > MAX_VISITS)
        return;
    bool *shadowed = pairs ? shadowed_pairs(c, items, n / 2) : NULL;
    for (size_t i = 0; i < n && !c->err; i++) {
        if (!pairs) {
            snprintf(num, sizeof num, "%zu", i);
            walk_child(c, items[i], num, strlen(num), depth);
            continue;
        }
        if (i + 1 >= n)
            break;
        bool hidden = shadowed && shadowed[i / 2];
        const pk_value *k = items[i], *val = items[++i];
        int64_t x;
        c->shadowed += hidden;
        if (k->kind == PK_STR) {
            walk_child(c, val, k->u.s.p, k->u.s.len, depth);
        } else if (k->kind == PK_INT && pk_int(k, &x)) {
            snprintf(num, sizeof num, "%lld", (long long)x);
            walk_child(c, val, num, strlen(num), depth);
        }
        c->shadowed -= hidden;
    }
    free(shadowed);
}

static void walk(torch_ctx *c, const pk_value *v, size_t depth)
{
    if (c->err || !v || depth > MAX_WALK_DEPTH || ++c->visits > MAX_VISITS)
        return;
    const pk_value *args;
    int version = tensor_call(v, &args);
    if (version && c->shadowed) {
        add_skipped(c, "its dict key is set again later, and torch.load keeps the last");
        return;
    }
    if (version) {
        add_tensor(c, version, args);
        return;
    }
    switch (v->kind) {
    case PK_DICT:
        walk_items(c, (const pk_value *const *)v->u.seq.v, v->u.seq.n, true, depth);
        return;
    case PK_LIST:
    case PK_TUPLE:
        walk_items(c, (const pk_value *const *)v->u.seq.v, v->u.seq.n, false, depth);
        return;
    case PK_CALL:
        if (pk_is_call_of(v, "torch._utils", "_rebuild_parameter") ||
            pk_is_call_of(v, "torch._utils", "_rebuild_parameter_with_state")) {
            walk(c, pk_at(v->u.call.args, 0), depth + 1);
        } else if (pk_is_call_of(v, "collections", "OrderedDict")) {
            walk_items(c, (const pk_value *const *)v->u.call.dictitems.v, v->u.call.dictitems.n,
                       true, depth);
        }
        return;
    default:
        return;
    }
}

/* ------------------------------------------------------------ the layout */

static int tensor_cmp(const void *a, const void *b)
{
    const ingest_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int region_cmp(const void *a, const void *b)
{
    const ingest_region *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int name_index_cmp(const void *a, const void *b)
{
    /* ties broken by position: the first found keeps the name */
    const ingest_tensor *const *x = a, *const *y = b;
    int r = strcmp((*x)->name, (*y)->name);
    return r ? r : (*x < *y ? -1 : *x > *y);
}

/* A name found twice (a dict key "a.b" beside a nested a -> b) keeps its
 * first tensor; the others are skipped. */
static int drop_duplicates(torch_ctx *c)
{
    if (c->n_t < 2)
        return 0;
    ingest_tensor **ix = malloc(c->n_t * sizeof *ix);
    if (!ix)
        return -ENOMEM;
    for (size_t i = 0; i < c->n_t; i++)
        ix[i] = &c->t[i];
    qsort(ix, c->n_t, sizeof *ix, name_index_cmp);
    const char *kept = ix[0]->name; /* the first of a run of equal names */
    for (size_t i = 1; i < c->n_t; i++) {
        if (strcmp(kept, ix[i]->name) != 0) {
            kept = ix[i]->name;
        } else {
            snprintf(c->name, sizeof c->name, "%s", ix[i]->name);
            push_skipped(c, "another tensor has the same name"); /* a move */
            free(ix[i]->name);
            ix[i]->name = NULL;
        }
    }
    free(ix);
    size_t out = 0;
    for (size_t i = 0; i < c->n_t; i++)
        if (c->t[i].name)
            c->t[out++] = c->t[i];
    c->n_t = out;
    return c->err;
}

/* The bare tensor's name: the path without .pt, .pth or .bin. */
static void bare_name(char *dst, size_t cap, const char *path)
{
    static const char *const exts[] = {".pt", ".pth", ".bin"};
    size_t n = path ? strlen(path) : 0;
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        size_t el = strlen(exts[i]);
        if (n > el && strcmp(path + n - el, exts[i]) == 0) {
            n -= el;
            break;
        }
    }
    if (n >= cap)
        n = 0; /* too long to use: the tensor is skipped as unnamed */
    memcpy(dst, path ? path : "", n);
    dst[n] = '\0';
}

static bool is_bare_tensor(const pk_value *v)
{
    const pk_value *args;
    for (int i = 0; i < 4 && v; i++) {
        if (tensor_call(v, &args))
            return true;
        if (!pk_is_call_of(v, "torch._utils", "_rebuild_parameter") &&
            !pk_is_call_of(v, "torch._utils", "_rebuild_parameter_with_state"))
            return false;
        v = pk_at(v->u.call.args, 0);
    }
    return false;
}

/* Does the layout skip a tensor for damage? Then it is something, even
 * with nothing else usable: the file must not pass for plain bytes with no
 * word of the fault torch.load refuses it for. */
static bool any_damaged(const ingest_layout *l)
{
    for (size_t i = 0; i < l->n_skipped; i++)
        if (l->skipped[i].damaged)
            return true;
    return false;
}

static int fill_layout(torch_ctx *c, ingest_layout *out)
{
    size_t nr = 0;
    for (size_t i = 0; i < c->n_st; i++)
        nr += c->st[i].e != NULL;
    out->regions = calloc(nr ? nr : 1, sizeof *out->regions);
    if (!out->regions)
        return -ENOMEM;
    for (size_t i = 0; i < c->n_st; i++) {
        if (!c->st[i].e)
            continue;
        ingest_region *r = &out->regions[out->n_regions++];
        r->offset = c->st[i].e->data_offset;
        r->length = c->st[i].e->size;
        snprintf(r->dtype, sizeof r->dtype, "%s", c->st[i].dtype);
    }
    qsort(out->regions, out->n_regions, sizeof *out->regions, region_cmp);
    if (c->n_t)
        qsort(c->t, c->n_t, sizeof *c->t, tensor_cmp);
    out->t = c->t;
    out->n = c->n_t;
    out->skipped = c->sk;
    out->n_skipped = c->n_sk;
    c->t = NULL;
    c->n_t = 0;
    c->sk = NULL;
    c->n_sk = 0;
    if (out->n)
        out->header_bytes = out->t[0].offset;
    else if (out->n_regions)
        out->header_bytes = out->regions[0].offset;
    return 0;
}

static void ctx_free(torch_ctx *c)
{
    for (size_t i = 0; i < c->n_t; i++)
        free(c->t[i].name);
    free(c->t);
    for (size_t i = 0; i < c->n_sk; i++)
        free(c->sk[i].name);
    free(c->sk);
    free(c->st);
}

static void layout_clear(ingest_layout *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->t[i].name);
    free(l->t);
    free(l->regions);
    for (size_t i = 0; i < l->n_skipped; i++)
        free(l->skipped[i].name);
    free(l->skipped);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------ globals */

/* Globals a state dict needs: torch's own (rebuild functions, storage
 * classes, dtypes, Parameter, Size, device), the containers
 * torch.load(weights_only=True) allows (OrderedDict, Counter, set,
 * bytearray, complex, _codecs.encode for bytes) and numpy's array and
 * scalar reconstruction (HF's rng_state.pth, Lightning's .ckpt). The reader
 * never calls anything; a pickle that names any other global (os.system, a
 * user class) is one torch's safe loader refuses too, so the file is stored
 * opaque with a warning that names the global. */
static bool allowed_global(const char *m, const char *n)
{
    static const char *const pairs[][2] = {
        {"collections", "OrderedDict"},
        {"collections", "Counter"},
        {"builtins", "set"},
        {"builtins", "bytearray"},
        {"builtins", "complex"},
        {"_codecs", "encode"},
        {"numpy", "dtype"},
        {"numpy", "ndarray"},
    };
    if (strcmp(m, "torch") == 0 || strncmp(m, "torch.", 6) == 0)
        return true;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (strcmp(m, pairs[i][0]) == 0 && strcmp(n, pairs[i][1]) == 0)
            return true;
    if (strcmp(m, "numpy.core.multiarray") == 0 || strcmp(m, "numpy._core.multiarray") == 0)
        return strcmp(n, "_reconstruct") == 0 || strcmp(n, "scalar") == 0;
    return strcmp(m, "numpy.dtypes") == 0;
}

/* The first global the pickle names that allowed_global() refuses, or NULL. */
static const pk_value *unknown_global(const pickle_doc *doc)
{
    size_t total = pickle_node_count(doc);
    for (size_t i = 0; i < total; i++) {
        const pk_value *v = pickle_node(doc, i);
        if (v->kind == PK_GLOBAL && !allowed_global(v->u.global.module, v->u.global.name))
            return v;
    }
    return NULL;
}

/* ------------------------------------------------------------ the format */

/* <dir>/byteorder holds "little" or "big" (torch >= 1.9; older archives are
 * little-endian). Storages of a big-endian archive are still regions: byte
 * grouping does not care about byte order, but tensors/ presents
 * little-endian bytes only. */
static int read_byteorder(torch_ctx *c, const ingest_source *src, char *msg, size_t msg_len)
{
    char path[MAX_NAME + 16], text[8] = "";
    snprintf(path, sizeof path, "%s/byteorder", c->dir);
    const zip_entry *e = zip_find(c->z, path);
    if (!e)
        return 0;
    int rc = -EINVAL;
    if (zip_entry_is_raw(e) && e->size < sizeof text)
        rc = fmt_read_exact(src, text, (size_t)e->size, e->data_offset);
    if (rc == 0 && strcmp(text, "little") == 0)
        return 0;
    if (rc == 0 && strcmp(text, "big") == 0) {
        c->big_endian = true;
        return 0;
    }
    char q[FMT_QUOTE_BUF];
    fmt_quote(q, sizeof q, path);
    fmt_msg(msg, msg_len, "torch archive: %s is neither \"little\" nor \"big\"", q);
    return -EINVAL;
}

static int torch_sniff(const char *path, const uint8_t *head, size_t head_len, uint64_t size)
{
    static const uint8_t magic[4] = {'P', 'K', 3, 4};
    static const char pkl[] = "/data.pkl";
    if (head_len < 30 || size < 30 + 22 || memcmp(head, magic, 4) != 0)
        return 0;
    size_t nlen = (size_t)head[26] | (size_t)head[27] << 8;
    if (nlen < sizeof pkl || nlen > head_len - 30)
        return 0;
    const char *name = (const char *)head + 30;
    /* "<dir>/data.pkl", <dir> one non-empty component */
    return memcmp(name + nlen - (sizeof pkl - 1), pkl, sizeof pkl - 1) == 0 &&
           memchr(name, '/', nlen - (sizeof pkl - 1)) == NULL && !memchr(name, '\0', nlen);
}

static int torch_describe(const ingest_source *src, const char *path, ingest_layout *out, char *msg,
                          size_t msg_len)
{
    memset(out, 0, sizeof *out);
    fmt_msg(msg, msg_len, "%s", "");
    char why[400];
    zip_archive z;
    int rc = zip_open(src, &z, why, sizeof why);
    if (rc) {
        fmt_msg(msg, msg_len, "torch archive: %s", why);
        return rc;
    }
    torch_ctx c = {.z = &z};
    pickle_doc *doc = NULL;
    uint8_t *pkl = NULL;
    char dir[MAX_NAME + 1];
    char pkl_name[MAX_NAME + 16];

    /* torch takes its directory from the first entry's name */
    const char *slash = z.n ? strchr(z.e[0].name, '/') : NULL;
    size_t dlen = slash ? (size_t)(slash - z.e[0].name) : 0;
    if (!slash || dlen == 0 || dlen > MAX_NAME) {
        rc = 1;
        goto out;
    }
    memcpy(dir, z.e[0].name, dlen);
    dir[dlen] = '\0';
    c.dir = dir;
    snprintf(pkl_name, sizeof pkl_name, "%s/data.pkl", dir);
    const zip_entry *pe = zip_find(&z, pkl_name);
    if (!pe) {
        rc = 1; /* a zip, but not a torch archive */
        goto out;
    }
    char q[FMT_QUOTE_BUF];
    fmt_quote(q, sizeof q, pkl_name);
    if (!zip_entry_is_raw(pe)) {
        fmt_msg(msg, msg_len, "torch archive: %s is compressed or encrypted", q);
        rc = -EINVAL;
        goto out;
    }
    if (pe->size > TORCH_MAX_PICKLE) {
        fmt_msg(msg, msg_len, "torch archive: %s is %llu bytes, more than the %u allowed", q,
                (unsigned long long)pe->size, TORCH_MAX_PICKLE);
        rc = -EINVAL;
        goto out;
    }
    pkl = malloc(pe->size ? (size_t)pe->size : 1);
    if (!pkl) {
        rc = -ENOMEM;
        goto oom;
    }
    rc = fmt_read_exact(src, pkl, (size_t)pe->size, pe->data_offset);
    if (rc) {
        fmt_msg(msg, msg_len, "torch archive: cannot read %s: %s", q, strerror(-rc));
        goto out;
    }
    /* Python itself needs more than this to load such a pickle. */
    pickle_limits lim = {.max_input = TORCH_MAX_PICKLE,
                         .max_depth = 128,
                         .max_nodes = (size_t)4 << 20,
                         .max_bytes = (size_t)256 << 20};
    rc = pickle_parse(pkl, (size_t)pe->size, &lim, &doc, why, sizeof why);
    if (rc == -ENOMEM)
        goto oom;
    if (rc) {
        fmt_msg(msg, msg_len, "torch archive: %s: %s", q, why);
        goto out;
    }

    const pk_value *bad = unknown_global(doc);
    if (bad) {
        char qm[FMT_QUOTE_BUF], qn[FMT_QUOTE_BUF];
        fmt_quote(qm, sizeof qm, bad->u.global.module);
        fmt_quote(qn, sizeof qn, bad->u.global.name);
        fmt_msg(msg, msg_len,
                "torch archive: %s names the global %s.%s, which torch.load(weights_only=True) "
                "refuses",
                q, qm, qn);
        rc = -EINVAL;
        goto out;
    }
    if ((rc = collect_storages(&c, doc)))
        goto oom;
    type_untyped(&c, doc);
    resolve_storages(&c);
    if ((rc = read_byteorder(&c, src, msg, msg_len)))
        goto out;
    const pk_value *root = pickle_root(doc);
    if (is_bare_tensor(root))
        bare_name(c.name, sizeof c.name, path);
    walk(&c, root, 0);
    if (c.err == -E2BIG) {
        fmt_msg(msg, msg_len, "torch archive: %s names more than %u tensors", q, MAX_TENSORS);
        rc = -EINVAL;
        goto out;
    }
    if (c.err || drop_duplicates(&c)) {
        rc = -ENOMEM;
        goto oom;
    }
    if ((rc = fill_layout(&c, out)))
        goto oom;
    rc = out->n || out->n_regions || any_damaged(out) ? 0 : 1;
    if (rc == 1)
        layout_clear(out);
    goto out;
oom:
    fmt_msg(msg, msg_len, "torch archive: out of memory");
    layout_clear(out);
    rc = -ENOMEM;
out:
    pickle_free(doc);
    free(pkl);
    ctx_free(&c);
    zip_close(&z);
    return rc;
}

const container_format ckpt_format_torch = {
    .name = "torch",
    .sniff = torch_sniff,
    .describe = torch_describe,
};

/* ------------------------------------------------------------ embedded archives */

typedef struct sub_source {
    const ingest_source *src;
    uint64_t base, len;
} sub_source;

static ssize_t sub_read(void *ud, void *buf, size_t len, uint64_t off)
{
    const sub_source *s = ud;
    if (off >= s->len)
        return 0;
    if (len > s->len - off)
        len = (size_t)(s->len - off);
    return s->src->read(s->src->ud, buf, len, s->base + off);
}

int torch_describe_range(const ingest_source *src, uint64_t base, uint64_t len, const char *path,
                         ingest_layout *out, char *msg, size_t msg_len)
{
    memset(out, 0, sizeof *out);
    if (base > src->size || len > src->size - base) {
        fmt_msg(msg, msg_len, "torch archive: [%llu, +%llu) lies outside the file",
                (unsigned long long)base, (unsigned long long)len);
        return -EINVAL;
    }
    sub_source s = {src, base, len};
    ingest_source sub = {.read = sub_read, .ud = &s, .size = len, .name = src->name};
    int rc = torch_describe(&sub, path, out, msg, msg_len);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < out->n; i++)
        out->t[i].offset += base;
    for (size_t i = 0; i < out->n_regions; i++)
        out->regions[i].offset += base;
    out->header_bytes += base;
    return 0;
}

const char *torch_dtype_name(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof torch_dtypes / sizeof torch_dtypes[0]; i++)
        if (strcmp(name, torch_dtypes[i].torch) == 0)
            return torch_dtypes[i].dtype;
    return NULL;
}
