/* A restricted pickle reader: it interprets a pickle (protocols 2 to 5, the
 * opcodes the torch and DCP picklers emit) into an inert value graph and
 * NEVER imports, looks up or calls anything. Where Python would import a
 * global, this records its module and name; where Python would call it
 * (REDUCE, NEWOBJ), this records the call with its arguments; a persistent
 * id (BINPERSID) is recorded with its value. What the graph means is for the
 * caller to decide (formats/torch.c recognises torch's rebuild functions).
 *
 * Used for torch.save's data.pkl and PyTorch DCP's .metadata.
 *
 * Opcodes understood: PROTO FRAME STOP; MARK POP POP_MARK DUP; NONE NEWTRUE
 * NEWFALSE; BININT BININT1 BININT2 LONG1 LONG4 BINFLOAT; SHORT_BINUNICODE
 * BINUNICODE BINUNICODE8 SHORT_BINSTRING BINSTRING; SHORT_BINBYTES BINBYTES
 * BINBYTES8 BYTEARRAY8; EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3; EMPTY_LIST
 * APPEND APPENDS; EMPTY_DICT SETITEM SETITEMS; EMPTY_SET ADDITEMS FROZENSET;
 * GLOBAL STACK_GLOBAL REDUCE NEWOBJ NEWOBJ_EX BUILD; BINPERSID PERSID;
 * BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET. Anything else (the text
 * opcodes of protocols 0 and 1, EXT1/2/4, out-of-band buffers) is refused
 * with a message naming the opcode and its byte offset.
 *
 * Untrusted input: the input length, the stack (values and marks), the memo,
 * the nesting depth, the node count and the bytes allocated are all bounded
 * (pickle_limits); strings must be valid UTF-8 (surrogates allowed, as
 * Python's 'surrogatepass'). Memory use is linear in the input.
 *
 * The graph. Values are pk_value nodes owned by the pickle_doc; freeing the
 * doc frees them all. Because of the memo (BINGET) and DUP a node may be
 * reached from several places, and since containers can be modified after
 * they were memoized, a hostile pickle can even make a cycle. A caller that
 * walks the graph must therefore bound its own depth and its total visits;
 * pk_value.depth is the nesting depth at construction (it is what the depth
 * limit checks) and is exact for pickles that build each container before
 * placing it, as the standard pickler does. pickle_node() lists every node
 * once, which lets a caller scan for (say) all persistent ids without
 * walking at all.
 *
 * Messages are one line without a prefix ("unknown opcode 0x49 ('I') at
 * byte 12"); the caller names the file. Thread safety: none needed; a doc is
 * immutable once parsed and may be read from several threads. */
#ifndef CKPT_FORMATS_PICKLE_H
#define CKPT_FORMATS_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum pk_kind {
    PK_NONE,
    PK_BOOL,
    PK_INT,    /* fits int64_t: u.i */
    PK_BIGINT, /* a LONG1/LONG4 wider than 64 bits: u.s holds its little-endian
                * two's complement bytes */
    PK_FLOAT,  /* u.f */
    PK_STR,    /* u.s: UTF-8 (from SHORT_BINSTRING/BINSTRING: ASCII) */
    PK_BYTES,  /* u.s: bytes, bytearray, or a non-ASCII SHORT_BINSTRING/BINSTRING */
    PK_TUPLE,  /* u.seq */
    PK_LIST,   /* u.seq */
    PK_DICT,   /* u.seq: key0, value0, key1, value1, ... in insertion order;
                * a repeated key is kept (Python keeps the last: pk_dict_get) */
    PK_SET,    /* u.seq: set or frozenset */
    PK_GLOBAL, /* u.global: what GLOBAL / STACK_GLOBAL name, never imported */
    PK_CALL,   /* u.call: REDUCE, NEWOBJ or NEWOBJ_EX, never called */
    PK_PERSID, /* u.persid: the value BINPERSID/PERSID handed to persistent_load */
} pk_kind;

typedef struct pk_value pk_value;

typedef struct pk_seq {
    pk_value **v;
    size_t n;
    size_t cap; /* private */
} pk_seq;

struct pk_value {
    pk_kind kind;
    uint32_t depth;  /* 0 for scalars; 1 + the deepest child when built */
    bool py2_string; /* PK_BYTES from SHORT_BINSTRING/BINSTRING: a str to
                           torch.load, which decodes them as UTF-8 */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            char *p; /* NUL-terminated copy; may hold NULs: use len */
            size_t len;
        } s;
        pk_seq seq;
        struct {
            char *module;
            char *name;
        } global;
        struct {
            pk_value *callable; /* REDUCE: func; NEWOBJ/_EX: the class */
            pk_value *args;     /* a PK_TUPLE */
            pk_value *kwargs;   /* NEWOBJ_EX's dict, else NULL */
            pk_value *state;    /* the last BUILD's state, or NULL */
            pk_seq dictitems;   /* SETITEM(S) on the result: key, value, ... */
            pk_seq listitems;   /* APPEND(S) on the result */
            bool newobj;        /* cls.__new__(cls, *args) rather than func(*args) */
        } call;
        pk_value *persid;
    } u;
};

/* Bounds; a zero field takes its default (shown). */
typedef struct pickle_limits {
    size_t max_input;   /* 256 MiB */
    size_t max_stack;   /* 1 Mi values, and as many marks */
    size_t max_memo;    /* 4 Mi memo slots (the largest index + 1) */
    uint32_t max_depth; /* 256 */
    size_t max_nodes;   /* 16 Mi nodes */
    size_t max_bytes;   /* 1 GiB: nodes, strings and arrays together */
} pickle_limits;

typedef struct pickle_doc pickle_doc;

/* Parses data[0..len) up to STOP; bytes after STOP are ignored. Returns 0
 * and sets *out, -EINVAL with a message for a malformed or over-limit
 * pickle, -ENOMEM. lim may be NULL for the defaults. */
int pickle_parse(const uint8_t *data, size_t len, const pickle_limits *lim, pickle_doc **out,
                 char *msg, size_t msg_len);

void pickle_free(pickle_doc *d);

/* The value STOP returned. */
const pk_value *pickle_root(const pickle_doc *d);

/* Every node the parse made, each once, in creation order. */
size_t pickle_node_count(const pickle_doc *d);
const pk_value *pickle_node(const pickle_doc *d, size_t i);

/* ---- helpers; each accepts NULL and answers false/NULL/0 ---- */

const char *pk_kind_name(pk_kind k);

/* A PK_STR equal to s. */
bool pk_is_str(const pk_value *v, const char *s);

/* A PK_GLOBAL naming module.name exactly. */
bool pk_is_global(const pk_value *v, const char *module, const char *name);

/* A PK_CALL whose callable is the global module.name. */
bool pk_is_call_of(const pk_value *v, const char *module, const char *name);

/* Items of a tuple, list, set or dict (2 per dict pair); 0 for others. */
size_t pk_len(const pk_value *v);
const pk_value *pk_at(const pk_value *v, size_t i);

/* The value of the last pair whose key is the string key, in a PK_DICT (or
 * in a PK_CALL's dictitems). */
const pk_value *pk_dict_get(const pk_value *dict, const char *key);

/* A PK_INT (or PK_BOOL) as int64_t. */
bool pk_int(const pk_value *v, int64_t *out);

#endif
