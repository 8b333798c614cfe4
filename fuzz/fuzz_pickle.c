/* Fuzzes the restricted pickle reader (formats/pickle.c). An accepted pickle
 * is walked through the pickle.h API with a visit budget (the graph may share
 * nodes or loop): every node is of a known kind, containers hold non-NULL
 * items, dicts hold pairs, calls have a tuple of arguments. A refused one
 * must say why in one line. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/pickle.h"

static size_t budget;

static void walk(const pk_value *v, unsigned depth)
{
    if (!v)
        abort();
    if (depth > 300 || budget == 0)
        return;
    budget--;
    if ((unsigned)v->kind > PK_PERSID || !pk_kind_name(v->kind))
        abort();
    switch (v->kind) {
    case PK_STR:
    case PK_BYTES:
    case PK_BIGINT:
        if (!v->u.s.p || v->u.s.p[v->u.s.len] != '\0')
            abort();
        break;
    case PK_DICT:
        if (pk_len(v) % 2)
            abort();
        /* fall through */
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
        for (size_t i = 0; i < pk_len(v); i++)
            walk(pk_at(v, i), depth + 1);
        break;
    case PK_GLOBAL:
        if (!v->u.global.module[0] || !v->u.global.name[0])
            abort();
        break;
    case PK_CALL:
        if (!v->u.call.callable || !v->u.call.args || v->u.call.args->kind != PK_TUPLE ||
            v->u.call.dictitems.n % 2)
            abort();
        walk(v->u.call.callable, depth + 1);
        walk(v->u.call.args, depth + 1);
        if (v->u.call.state)
            walk(v->u.call.state, depth + 1);
        for (size_t i = 0; i < v->u.call.dictitems.n; i++)
            walk(v->u.call.dictitems.v[i], depth + 1);
        for (size_t i = 0; i < v->u.call.listitems.n; i++)
            walk(v->u.call.listitems.v[i], depth + 1);
        (void)pk_dict_get(v, "state");
        break;
    case PK_PERSID:
        walk(v->u.persid, depth + 1);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pickle_doc *d = NULL;
    char msg[512];
    /* Small limits, so that the fuzzer reaches them. */
    pickle_limits lim = {.max_stack = 4096,
                         .max_memo = 4096,
                         .max_depth = 64,
                         .max_nodes = 1 << 16,
                         .max_bytes = 16 << 20};
    int rc = pickle_parse(data, size, &lim, &d, msg, sizeof msg);
    if (rc < 0) {
        if (rc != -EINVAL || !msg[0] || strchr(msg, '\n') || d)
            abort();
        return 0;
    }
    if (rc != 0 || !pickle_root(d))
        abort();
    budget = 100000;
    walk(pickle_root(d), 0);
    for (size_t i = 0; i < pickle_node_count(d); i++)
        if (!pickle_node(d, i) || pickle_node(d, i)->depth > lim.max_depth)
            abort();
    (void)pk_dict_get(pickle_root(d), "state_dict");
    pickle_free(d);
    return 0;
}
