/* The restricted pickle interpreter of pickle.h. One loop reads an opcode and
 * its argument, checks every length against the input, and applies it to a
 * value stack with Python 3's mark semantics (values below the innermost
 * mark cannot be popped). Nodes are counted into a byte budget as they are
 * made; the doc owns them in one array, so a graph that shares nodes (memo,
 * DUP) or loops is freed exactly once.
 *
 * One job at about 900 lines, kept whole: the opcode interpreter, its
 * stack, memo and node budget are one state machine over untrusted bytes,
 * and its limits are easiest to audit in one place. */
#include "formats/pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "formats/fmt_util.h"

#define MAX_GLOBAL_PART 1024

struct pickle_doc {
    pk_value **nodes;
    size_t n_nodes, cap_nodes;
    pk_value *root;
};

typedef struct parser {
    const uint8_t *p;
    size_t len, pos;
    size_t op_at; /* offset of the opcode being run, for messages */
    uint8_t op;
    pickle_limits lim;
    size_t bytes; /* allocated so far, against lim.max_bytes */
    pickle_doc *doc;
    pk_value **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t n_marks, marks_cap;
    pk_value **memo;
    size_t memo_len, memo_cap;
    char *msg;
    size_t msg_len;
    int err;
} parser;

static int fail(parser *ps, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(parser *ps, int err, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fmt_msg(ps->msg, ps->msg_len, "%s (opcode 0x%02x at byte %zu)", what, ps->op, ps->op_at);
    ps->err = err;
    return err;
}

static int oom(parser *ps)
{
    return fail(ps, -ENOMEM, "out of memory");
}

/* Charges n bytes to the budget. */
static int charge(parser *ps, size_t n)
{
    if (n > ps->lim.max_bytes - ps->bytes)
        return fail(ps, -EINVAL, "pickle needs more than %zu bytes of memory", ps->lim.max_bytes);
    ps->bytes += n;
    return 0;
}

/* Grows *arr (of elem-size items) to hold at least need, charging growth. */
static int grow(parser *ps, void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 8;
    while (nc < need)
        nc *= 2;
    if (nc > SIZE_MAX / elem)
        return oom(ps);
    int rc = charge(ps, (nc - *cap) * elem);
    if (rc)
        return rc;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return oom(ps);
    *arr = p;
    *cap = nc;
    return 0;
}

static pk_value *node(parser *ps, pk_kind kind)
{
    pickle_doc *d = ps->doc;
    if (d->n_nodes >= ps->lim.max_nodes) {
        fail(ps, -EINVAL, "pickle makes more than %zu values", ps->lim.max_nodes);
        return NULL;
    }
    if (grow(ps, (void **)&d->nodes, &d->cap_nodes, d->n_nodes + 1, sizeof *d->nodes) ||
        charge(ps, sizeof(pk_value)))
        return NULL;
    pk_value *v = calloc(1, sizeof *v);
    if (!v) {
        oom(ps);
        return NULL;
    }
    v->kind = kind;
    d->nodes[d->n_nodes++] = v;
    return v;
}

/* Records that child now sits inside v. */
static int nest(parser *ps, pk_value *v, const pk_value *child)
{
    if (child && child->depth + 1 > v->depth) {
        v->depth = child->depth + 1;
        if (v->depth > ps->lim.max_depth)
            return fail(ps, -EINVAL, "values nest deeper than %u", ps->lim.max_depth);
    }
    return 0;
}

static int seq_push(parser *ps, pk_value *owner, pk_seq *s, pk_value *item)
{
    int rc = grow(ps, (void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    if (rc)
        return rc;
    s->v[s->n++] = item;
    return nest(ps, owner, item);
}

/* ------------------------------------------------------------ the stack */

static int push(parser *ps, pk_value *v)
{
    if (!v)
        return ps->err;
    if (ps->sp >= ps->lim.max_stack)
        return fail(ps, -EINVAL, "stack grows past %zu values", ps->lim.max_stack);
    int rc = grow(ps, (void **)&ps->stack, &ps->stack_cap, ps->sp + 1, sizeof *ps->stack);
    if (rc)
        return rc;
    ps->stack[ps->sp++] = v;
    return 0;
}

/* Where the values above the innermost mark begin. */
static size_t floor_of(const parser *ps)
{
    return ps->n_marks ? ps->marks[ps->n_marks - 1] : 0;
}

static pk_value *pop(parser *ps)
{
    if (ps->sp <= floor_of(ps)) {
        fail(ps, -EINVAL, "stack underflow");
        return NULL;
    }
    return ps->stack[--ps->sp];
}

static pk_value *top(parser *ps)
{
    if (ps->sp <= floor_of(ps)) {
        fail(ps, -EINVAL, "stack underflow");
        return NULL;
    }
    return ps->stack[ps->sp - 1];
}

/* Removes the innermost mark; *from is where the values above it begin. */
static int pop_mark(parser *ps, size_t *from)
{
    if (ps->n_marks == 0)
        return fail(ps, -EINVAL, "no MARK to pop to");
    *from = ps->marks[--ps->n_marks];
    return 0;
}

/* ------------------------------------------------------------ input */

static int need(parser *ps, size_t n)
{
    if (n > ps->len - ps->pos)
        return fail(ps, -EINVAL, "pickle truncated: %zu more bytes needed, %zu left", n,
                    ps->len - ps->pos);
    return 0;
}

static uint64_t take_le(parser *ps, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)ps->p[ps->pos + i] << (8 * i);
    ps->pos += n;
    return v;
}

/* Valid UTF-8, allowing encoded surrogates as Python's surrogatepass does. */
static bool utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (k > n - i - 1)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k + 1;
    }
    return true;
}

static bool ascii_only(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80)
            return false;
    return true;
}

/* A node holding a copy of n input bytes at the read position. */
static pk_value *bytes_node(parser *ps, pk_kind kind, size_t n)
{
    if (need(ps, n) || charge(ps, n + 1))
        return NULL;
    const uint8_t *src = ps->p + ps->pos;
    if (kind == PK_STR && !utf8_ok(src, n)) {
        fail(ps, -EINVAL, "string of %zu bytes is not valid UTF-8", n);
        return NULL;
    }
    pk_value *v = node(ps, kind);
    if (!v)
        return NULL;
    v->u.s.p = malloc(n + 1);
    if (!v->u.s.p) {
        oom(ps);
        return NULL;
    }
    memcpy(v->u.s.p, src, n);
    v->u.s.p[n] = '\0';
    v->u.s.len = n;
    ps->pos += n;
    return v;
}

/* A length prefix of `width` bytes, checked against the input left. */
static int take_len(parser *ps, unsigned width, size_t *n)
{
    int rc = need(ps, width);
    if (rc)
        return rc;
    uint64_t v = take_le(ps, width);
    if (v > ps->len - ps->pos)
        return fail(ps, -EINVAL, "length %llu runs past the end of the pickle",
                    (unsigned long long)v);
    *n = (size_t)v;
    return 0;
}

static int op_string(parser *ps, pk_kind kind, unsigned width)
{
    size_t n;
    int rc = take_len(ps, width, &n);
    if (rc)
        return rc;
    return push(ps, bytes_node(ps, kind, n));
}

/* SHORT_BINSTRING / BINSTRING: Python 3 decodes them as ASCII by default;
 * anything else stays bytes here rather than failing. */
static int op_binstring(parser *ps, unsigned width)
{
    size_t n;
    int rc = take_len(ps, width, &n);
    if (rc)
        return rc;
    pk_value *v = bytes_node(ps, ascii_only(ps->p + ps->pos, n) ? PK_STR : PK_BYTES, n);
    if (v)
        v->py2_string = v->kind == PK_BYTES;
    return push(ps, v);
}

/* LONG1 / LONG4: little-endian two's complement of n bytes. */
static int op_long(parser *ps, unsigned width)
{
    size_t n;
    int rc = take_len(ps, width, &n);
    if (rc)
        return rc;
    if (n > 8)
        return push(ps, bytes_node(ps, PK_BIGINT, n));
    pk_value *v = node(ps, PK_INT);
    if (!v)
        return ps->err;
    uint64_t u = take_le(ps, (unsigned)n);
    if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1)
        u |= ~(uint64_t)0 << (8 * n);
    v->u.i = (int64_t)u;
    return push(ps, v);
}

static int op_int(parser *ps, unsigned width, bool is_signed)
{
    int rc = need(ps, width);
    if (rc)
        return rc;
    uint64_t u = take_le(ps, width);
    pk_value *v = node(ps, PK_INT);
    if (!v)
        return ps->err;
    v->u.i = is_signed ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
    return push(ps, v);
}

static int op_float(parser *ps)
{
    int rc = need(ps, 8);
    if (rc)
        return rc;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | ps->p[ps->pos + i];
    ps->pos += 8;
    pk_value *v = node(ps, PK_FLOAT);
    if (!v)
        return ps->err;
    memcpy(&v->u.f, &u, sizeof u);
    return push(ps, v);
}

static pk_value *global_node(parser *ps, const char *mod, size_t ml, const char *name, size_t nl)
{
    if (ml == 0 || nl == 0 || ml > MAX_GLOBAL_PART || nl > MAX_GLOBAL_PART ||
        memchr(mod, '\0', ml) || memchr(name, '\0', nl) || !utf8_ok((const uint8_t *)mod, ml) ||
        !utf8_ok((const uint8_t *)name, nl)) {
        fail(ps, -EINVAL, "bad global name");
        return NULL;
    }
    if (charge(ps, ml + nl + 2))
        return NULL;
    pk_value *v = node(ps, PK_GLOBAL);
    if (!v)
        return NULL;
    v->u.global.module = strndup(mod, ml);
    v->u.global.name = strndup(name, nl);
    if (!v->u.global.module || !v->u.global.name) {
        oom(ps);
        return NULL;
    }
    return v;
}

/* GLOBAL: "module\nname\n" in the input. */
static int op_global(parser *ps)
{
    const char *s = (const char *)ps->p + ps->pos;
    size_t left = ps->len - ps->pos;
    const char *nl1 = memchr(s, '\n', left);
    const char *nl2 = nl1 ? memchr(nl1 + 1, '\n', left - (size_t)(nl1 + 1 - s)) : NULL;
    if (!nl2)
        return fail(ps, -EINVAL, "GLOBAL without two newline-terminated names");
    pk_value *v = global_node(ps, s, (size_t)(nl1 - s), nl1 + 1, (size_t)(nl2 - nl1 - 1));
    ps->pos += (size_t)(nl2 + 1 - s);
    return push(ps, v);
}

static int op_stack_global(parser *ps)
{
    pk_value *name = pop(ps);
    pk_value *mod = name ? pop(ps) : NULL;
    if (!mod)
        return ps->err;
    if (mod->kind != PK_STR || name->kind != PK_STR)
        return fail(ps, -EINVAL, "STACK_GLOBAL needs two strings, got %s and %s",
                    pk_kind_name(mod->kind), pk_kind_name(name->kind));
    return push(ps, global_node(ps, mod->u.s.p, mod->u.s.len, name->u.s.p, name->u.s.len));
}

/* A tuple of the values from stack[from] up; they leave the stack. */
static pk_value *tuple_from(parser *ps, size_t from)
{
    pk_value *t = node(ps, PK_TUPLE);
    if (!t)
        return NULL;
    for (size_t i = from; i < ps->sp; i++)
        if (seq_push(ps, t, &t->u.seq, ps->stack[i]))
            return NULL;
    ps->sp = from;
    return t;
}

static int op_tuple_n(parser *ps, size_t n)
{
    if (ps->sp - floor_of(ps) < n)
        return fail(ps, -EINVAL, "stack underflow");
    return push(ps, tuple_from(ps, ps->sp - n));
}

static int op_tuple_mark(parser *ps)
{
    size_t from = 0;
    int rc = pop_mark(ps, &from);
    if (rc)
        return rc;
    return push(ps, tuple_from(ps, from));
}

static int op_call(parser *ps, bool newobj, bool has_kwargs)
{
    pk_value *kwargs = NULL;
    if (has_kwargs) {
        kwargs = pop(ps);
        if (!kwargs)
            return ps->err;
        if (kwargs->kind != PK_DICT)
            return fail(ps, -EINVAL, "NEWOBJ_EX keyword arguments are a %s, not a dict",
                        pk_kind_name(kwargs->kind));
    }
    pk_value *args = pop(ps);
    pk_value *fn = args ? pop(ps) : NULL;
    if (!fn)
        return ps->err;
    if (args->kind != PK_TUPLE)
        return fail(ps, -EINVAL, "call arguments are a %s, not a tuple", pk_kind_name(args->kind));
    pk_value *v = node(ps, PK_CALL);
    if (!v)
        return ps->err;
    v->u.call.callable = fn;
    v->u.call.args = args;
    v->u.call.kwargs = kwargs;
    v->u.call.newobj = newobj;
    int rc = nest(ps, v, fn);
    if (!rc)
        rc = nest(ps, v, args);
    if (!rc)
        rc = nest(ps, v, kwargs);
    return rc ? rc : push(ps, v);
}

static int op_build(parser *ps)
{
    pk_value *state = pop(ps);
    pk_value *obj = state ? top(ps) : NULL;
    if (!obj)
        return ps->err;
    if (obj->kind != PK_CALL)
        return fail(ps, -EINVAL, "BUILD on a %s", pk_kind_name(obj->kind));
    obj->u.call.state = state;
    return nest(ps, obj, state);
}

/* Adds key/value pairs stack[from..sp) to the dict or call at stack[from-1]. */
static int set_items(parser *ps, size_t from)
{
    if ((ps->sp - from) % 2)
        return fail(ps, -EINVAL, "odd number of items to set");
    if (from <= floor_of(ps))
        return fail(ps, -EINVAL, "stack underflow");
    pk_value *d = ps->stack[from - 1];
    pk_seq *s;
    if (d->kind == PK_DICT)
        s = &d->u.seq;
    else if (d->kind == PK_CALL)
        s = &d->u.call.dictitems;
    else
        return fail(ps, -EINVAL, "setting items on a %s", pk_kind_name(d->kind));
    for (size_t i = from; i < ps->sp; i++) {
        int rc = seq_push(ps, d, s, ps->stack[i]);
        if (rc)
            return rc;
    }
    ps->sp = from;
    return 0;
}

/* Appends stack[from..sp) to the list, call or set at stack[from-1]. */
static int append_items(parser *ps, size_t from, bool to_set)
{
    if (from <= floor_of(ps))
        return fail(ps, -EINVAL, "stack underflow");
    pk_value *l = ps->stack[from - 1];
    pk_seq *s;
    if (to_set ? l->kind == PK_SET : l->kind == PK_LIST)
        s = &l->u.seq;
    else if (!to_set && l->kind == PK_CALL)
        s = &l->u.call.listitems;
    else
        return fail(ps, -EINVAL, "%s items to a %s", to_set ? "adding" : "appending",
                    pk_kind_name(l->kind));
    for (size_t i = from; i < ps->sp; i++) {
        int rc = seq_push(ps, l, s, ps->stack[i]);
        if (rc)
            return rc;
    }
    ps->sp = from;
    return 0;
}

static int op_mark(parser *ps)
{
    if (ps->n_marks >= ps->lim.max_stack)
        return fail(ps, -EINVAL, "more than %zu open MARKs", ps->lim.max_stack);
    int rc = grow(ps, (void **)&ps->marks, &ps->marks_cap, ps->n_marks + 1, sizeof *ps->marks);
    if (rc)
        return rc;
    ps->marks[ps->n_marks++] = ps->sp;
    return 0;
}

static int memo_put(parser *ps, uint64_t idx)
{
    pk_value *v = top(ps);
    if (!v)
        return ps->err;
    if (idx >= ps->lim.max_memo)
        return fail(ps, -EINVAL, "memo index %llu is past the %zu allowed", (unsigned long long)idx,
                    ps->lim.max_memo);
    size_t old = ps->memo_cap;
    int rc = grow(ps, (void **)&ps->memo, &ps->memo_cap, (size_t)idx + 1, sizeof *ps->memo);
    if (rc)
        return rc;
    if (ps->memo_cap > old)
        memset(ps->memo + old, 0, (ps->memo_cap - old) * sizeof *ps->memo);
    ps->memo[idx] = v;
    if (idx >= ps->memo_len)
        ps->memo_len = (size_t)idx + 1;
    return 0;
}

static int memo_get(parser *ps, uint64_t idx)
{
    if (idx >= ps->memo_len || !ps->memo[idx])
        return fail(ps, -EINVAL, "memo key %llu was never stored", (unsigned long long)idx);
    return push(ps, ps->memo[idx]);
}

static int op_u(parser *ps, unsigned width, uint64_t *v)
{
    int rc = need(ps, width);
    if (!rc)
        *v = take_le(ps, width);
    return rc;
}

static int op_persid_text(parser *ps)
{
    const char *s = (const char *)ps->p + ps->pos;
    const char *nl = memchr(s, '\n', ps->len - ps->pos);
    if (!nl)
        return fail(ps, -EINVAL, "PERSID without a newline");
    size_t n = (size_t)(nl - s);
    if (!ascii_only((const uint8_t *)s, n))
        return fail(ps, -EINVAL, "PERSID is not ASCII");
    pk_value *str = bytes_node(ps, PK_STR, n);
    if (!str)
        return ps->err;
    ps->pos++; /* the newline */
    pk_value *v = node(ps, PK_PERSID);
    if (!v)
        return ps->err;
    v->u.persid = str;
    int rc = nest(ps, v, str);
    return rc ? rc : push(ps, v);
}

static int op_binpersid(parser *ps)
{
    pk_value *pid = pop(ps);
    if (!pid)
        return ps->err;
    pk_value *v = node(ps, PK_PERSID);
    if (!v)
        return ps->err;
    v->u.persid = pid;
    int rc = nest(ps, v, pid);
    return rc ? rc : push(ps, v);
}

static int op_frozenset(parser *ps)
{
    size_t from = 0;
    int rc = pop_mark(ps, &from);
    if (rc)
        return rc;
    pk_value *s = node(ps, PK_SET);
    if (!s)
        return ps->err;
    for (size_t i = from; i < ps->sp; i++)
        if ((rc = seq_push(ps, s, &s->u.seq, ps->stack[i])))
            return rc;
    ps->sp = from;
    return push(ps, s);
}

/* Runs one opcode. Returns 1 at STOP. */
static int step(parser *ps)
{
    uint64_t u;
    size_t from = 0;
    int rc;
    ps->op_at = ps->pos;
    ps->op = ps->p[ps->pos++];
    switch (ps->op) {
    case 0x80: /* PROTO */
        if ((rc = op_u(ps, 1, &u)))
            return rc;
        if (u > 5)
            return fail(ps, -EINVAL, "pickle protocol %llu is not supported",
                        (unsigned long long)u);
        return 0;
    case 0x95: /* FRAME: a length hint only */
        if ((rc = op_u(ps, 8, &u)))
            return rc;
        if (u > ps->len - ps->pos)
            return fail(ps, -EINVAL, "frame of %llu bytes runs past the end of the pickle",
                        (unsigned long long)u);
        return 0;
    case '.': /* STOP */
        ps->doc->root = pop(ps);
        return ps->doc->root ? 1 : ps->err;
    case '(':
        return op_mark(ps);
    case '0': /* POP: at a mark, Python pops the mark */
        if (ps->sp == floor_of(ps) && ps->n_marks)
            return pop_mark(ps, &from);
        return pop(ps) ? 0 : ps->err;
    case '1': /* POP_MARK */
        if ((rc = pop_mark(ps, &from)))
            return rc;
        ps->sp = from;
        return 0;
    case '2': /* DUP */
        return top(ps) ? push(ps, top(ps)) : ps->err;
    case 'N':
        return push(ps, node(ps, PK_NONE));
    case 0x88:   /* NEWTRUE */
    case 0x89: { /* NEWFALSE */
        pk_value *v = node(ps, PK_BOOL);
        if (v)
            v->u.b = ps->op == 0x88;
        return push(ps, v);
    }
    case 'J':
        return op_int(ps, 4, true);
    case 'K':
        return op_int(ps, 1, false);
    case 'M':
        return op_int(ps, 2, false);
    case 0x8a:
        return op_long(ps, 1);
    case 0x8b:
        return op_long(ps, 4);
    case 'G':
        return op_float(ps);
    case 0x8c:
        return op_string(ps, PK_STR, 1);
    case 'X':
        return op_string(ps, PK_STR, 4);
    case 0x8d:
        return op_string(ps, PK_STR, 8);
    case 'U':
        return op_binstring(ps, 1);
    case 'T':
        return op_binstring(ps, 4);
    case 'C':
        return op_string(ps, PK_BYTES, 1);
    case 'B':
        return op_string(ps, PK_BYTES, 4);
    case 0x8e: /* BINBYTES8 */
    case 0x96: /* BYTEARRAY8 */
        return op_string(ps, PK_BYTES, 8);
    case ')':
        return push(ps, node(ps, PK_TUPLE));
    case 't':
        return op_tuple_mark(ps);
    case 0x85:
        return op_tuple_n(ps, 1);
    case 0x86:
        return op_tuple_n(ps, 2);
    case 0x87:
        return op_tuple_n(ps, 3);
    case ']':
        return push(ps, node(ps, PK_LIST));
    case 'a': /* APPEND */
        if (ps->sp - floor_of(ps) < 2)
            return fail(ps, -EINVAL, "stack underflow");
        return append_items(ps, ps->sp - 1, false);
    case 'e': /* APPENDS */
        if ((rc = pop_mark(ps, &from)))
            return rc;
        return append_items(ps, from, false);
    case '}':
        return push(ps, node(ps, PK_DICT));
    case 's': /* SETITEM */
        if (ps->sp - floor_of(ps) < 3)
            return fail(ps, -EINVAL, "stack underflow");
        return set_items(ps, ps->sp - 2);
    case 'u': /* SETITEMS */
        if ((rc = pop_mark(ps, &from)))
            return rc;
        return set_items(ps, from);
    case 0x8f:
        return push(ps, node(ps, PK_SET)); /* EMPTY_SET */
    case 0x90:                             /* ADDITEMS */
        if ((rc = pop_mark(ps, &from)))
            return rc;
        return append_items(ps, from, true);
    case 0x91:
        return op_frozenset(ps);
    case 'c':
        return op_global(ps);
    case 0x93:
        return op_stack_global(ps);
    case 'R':
        return op_call(ps, false, false);
    case 0x81:
        return op_call(ps, true, false);
    case 0x92:
        return op_call(ps, true, true);
    case 'b':
        return op_build(ps);
    case 'Q':
        return op_binpersid(ps);
    case 'P':
        return op_persid_text(ps);
    case 'q':
        return (rc = op_u(ps, 1, &u)) ? rc : memo_put(ps, u);
    case 'r':
        return (rc = op_u(ps, 4, &u)) ? rc : memo_put(ps, u);
    case 0x94:
        return memo_put(ps, ps->memo_len);
    case 'h':
        return (rc = op_u(ps, 1, &u)) ? rc : memo_get(ps, u);
    case 'j':
        return (rc = op_u(ps, 4, &u)) ? rc : memo_get(ps, u);
    default:
        if (ps->op >= 0x20 && ps->op < 0x7f)
            return fail(ps, -EINVAL, "unknown or unsupported opcode '%c'", ps->op);
        return fail(ps, -EINVAL, "unknown or unsupported opcode");
    }
}

int pickle_parse(const uint8_t *data, size_t len, const pickle_limits *lim, pickle_doc **out,
                 char *msg, size_t msg_len)
{
    *out = NULL;
    fmt_msg(msg, msg_len, "%s", "");
    parser ps = {.p = data, .len = len, .msg = msg, .msg_len = msg_len};
    if (lim)
        ps.lim = *lim;
    if (!ps.lim.max_input)
        ps.lim.max_input = (size_t)256 << 20;
    if (!ps.lim.max_stack)
        ps.lim.max_stack = (size_t)1 << 20;
    if (!ps.lim.max_memo)
        ps.lim.max_memo = (size_t)4 << 20;
    if (!ps.lim.max_depth)
        ps.lim.max_depth = 256;
    if (!ps.lim.max_nodes)
        ps.lim.max_nodes = (size_t)16 << 20;
    if (!ps.lim.max_bytes)
        ps.lim.max_bytes = (size_t)1 << 30;
    if (len > ps.lim.max_input) {
        fmt_msg(msg, msg_len, "pickle is %zu bytes, more than the %zu allowed", len,
                ps.lim.max_input);
        return -EINVAL;
    }
    ps.doc = calloc(1, sizeof *ps.doc);
    if (!ps.doc) {
        fmt_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    while (rc == 0) {
        if (ps.pos >= ps.len) {
            fmt_msg(msg, msg_len, "pickle ends after %zu bytes without STOP", ps.len);
            rc = -EINVAL;
            break;
        }
        rc = step(&ps);
    }
    free(ps.stack);
    free(ps.marks);
    free(ps.memo);
    if (rc < 0) {
        pickle_free(ps.doc);
        return rc;
    }
    *out = ps.doc;
    return 0;
}

void pickle_free(pickle_doc *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_nodes; i++) {
        pk_value *v = d->nodes[i];
        switch (v->kind) {
        case PK_STR:
        case PK_BYTES:
        case PK_BIGINT:
            free(v->u.s.p);
            break;
        case PK_TUPLE:
        case PK_LIST:
        case PK_DICT:
        case PK_SET:
            free(v->u.seq.v);
            break;
        case PK_GLOBAL:
            free(v->u.global.module);
            free(v->u.global.name);
            break;
        case PK_CALL:
            free(v->u.call.dictitems.v);
            free(v->u.call.listitems.v);
            break;
        default:
            break;
        }
        free(v);
    }
    free(d->nodes);
    free(d);
}

const pk_value *pickle_root(const pickle_doc *d)
{
    return d ? d->root : NULL;
}

size_t pickle_node_count(const pickle_doc *d)
{
    return d ? d->n_nodes : 0;
}

const pk_value *pickle_node(const pickle_doc *d, size_t i)
{
    return d && i < d->n_nodes ? d->nodes[i] : NULL;
}

/* ------------------------------------------------------------ helpers */

const char *pk_kind_name(pk_kind k)
{
    static const char *const names[] = {
        [PK_NONE] = "None",   [PK_BOOL] = "bool",
        [PK_INT] = "int",     [PK_BIGINT] = "int",
        [PK_FLOAT] = "float", [PK_STR] = "str",
        [PK_BYTES] = "bytes", [PK_TUPLE] = "tuple",
        [PK_LIST] = "list",   [PK_DICT] = "dict",
        [PK_SET] = "set",     [PK_GLOBAL] = "global",
        [PK_CALL] = "call",   [PK_PERSID] = "persistent id",
    };
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

bool pk_is_str(const pk_value *v, const char *s)
{
    return v && v->kind == PK_STR && v->u.s.len == strlen(s) &&
           memcmp(v->u.s.p, s, v->u.s.len) == 0;
}

bool pk_is_global(const pk_value *v, const char *module, const char *name)
{
    return v && v->kind == PK_GLOBAL && strcmp(v->u.global.module, module) == 0 &&
           strcmp(v->u.global.name, name) == 0;
}

bool pk_is_call_of(const pk_value *v, const char *module, const char *name)
{
    return v && v->kind == PK_CALL && pk_is_global(v->u.call.callable, module, name);
}

size_t pk_len(const pk_value *v)
{
    if (!v)
        return 0;
    switch (v->kind) {
    case PK_TUPLE:
    case PK_LIST:
    case PK_DICT:
    case PK_SET:
        return v->u.seq.n;
    default:
        return 0;
    }
}

const pk_value *pk_at(const pk_value *v, size_t i)
{
    return i < pk_len(v) ? v->u.seq.v[i] : NULL;
}

const pk_value *pk_dict_get(const pk_value *dict, const char *key)
{
    const pk_seq *s = NULL;
    if (dict && dict->kind == PK_DICT)
        s = &dict->u.seq;
    else if (dict && dict->kind == PK_CALL)
        s = &dict->u.call.dictitems;
    if (!s)
        return NULL;
    for (size_t i = s->n / 2; i-- > 0;)
        if (pk_is_str(s->v[2 * i], key))
            return s->v[2 * i + 1];
    return NULL;
}

bool pk_int(const pk_value *v, int64_t *out)
{
    if (v && v->kind == PK_INT) {
        *out = v->u.i;
        return true;
    }
    if (v && v->kind == PK_BOOL) {
        *out = v->u.b;
        return true;
    }
    return false;
}
