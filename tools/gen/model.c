/* ckpt-gen's model: the GPT-2 presets, the tensors of a GPT-2 of a given
 * depth and width (names and shapes as Hugging Face's GPT2LMHeadModel saves
 * them), and how they are spread over safetensors shards. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

static const preset presets[] = {
    {"tiny", 2, 128, 1000},          {"gpt2", 12, 768, 50257},     {"gpt2-medium", 24, 1024, 50257},
    {"gpt2-large", 36, 1280, 50257}, {"gpt2-xl", 48, 1600, 50257},
};

const preset *preset_find(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

static void add_tensor(tensor_list *l, init_kind init, uint64_t d0, uint64_t d1, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));

/* d1 == 0 means a vector of d0 elements. */
static void add_tensor(tensor_list *l, init_kind init, uint64_t d0, uint64_t d1, const char *fmt,
                       ...)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
        if (!l->t) {
            fputs("ckpt-gen: out of memory\n", stderr);
            exit(1);
        }
    }
    tensor_spec *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->init = init;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->ndim = d1 ? 2 : 1;
    t->numel = d1 ? d0 * d1 : d0;
}

/* GPT-2 as Hugging Face names it; Conv1D weights are stored [in, out]. */
void gpt2_tensors(const options *o, tensor_list *l)
{
    uint64_t d = o->dim;
    add_tensor(l, INIT_NORMAL, o->vocab, d, "wte.weight");
    add_tensor(l, INIT_NORMAL, N_POSITIONS, d, "wpe.weight");
    for (unsigned i = 0; i < o->layers; i++) {
        add_tensor(l, INIT_ONES, d, 0, "h.%u.ln_1.weight", i);
        add_tensor(l, INIT_ZEROS, d, 0, "h.%u.ln_1.bias", i);
        add_tensor(l, INIT_NORMAL, d, 3 * d, "h.%u.attn.c_attn.weight", i);
        add_tensor(l, INIT_NORMAL, 3 * d, 0, "h.%u.attn.c_attn.bias", i);
        add_tensor(l, INIT_NORMAL, d, d, "h.%u.attn.c_proj.weight", i);
        add_tensor(l, INIT_NORMAL, d, 0, "h.%u.attn.c_proj.bias", i);
        add_tensor(l, INIT_ONES, d, 0, "h.%u.ln_2.weight", i);
        add_tensor(l, INIT_ZEROS, d, 0, "h.%u.ln_2.bias", i);
        add_tensor(l, INIT_NORMAL, d, 4 * d, "h.%u.mlp.c_fc.weight", i);
        add_tensor(l, INIT_NORMAL, 4 * d, 0, "h.%u.mlp.c_fc.bias", i);
        add_tensor(l, INIT_NORMAL, 4 * d, d, "h.%u.mlp.c_proj.weight", i);
        add_tensor(l, INIT_NORMAL, d, 0, "h.%u.mlp.c_proj.bias", i);
    }
    add_tensor(l, INIT_ONES, d, 0, "ln_f.weight");
    add_tensor(l, INIT_ZEROS, d, 0, "ln_f.bias");
}

int tensor_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tensor_spec *)a)->name, ((const tensor_spec *)b)->name);
}

unsigned elem_bytes(elem_format f)
{
    return f == FMT_F32 ? 4 : 2;
}

/* Splits the tensors (in file order) into `shards` runs of about equal
 * bytes, none empty. */
void assign_shards(tensor_list *l, unsigned shards, unsigned esize)
{
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++)
        total += l->t[i].numel * esize;
    unsigned s = 0;
    size_t in_shard = 0;
    uint64_t before = 0, shard_start = 0;
    for (size_t i = 0; i < l->n; i++) {
        uint64_t bound = (uint64_t)((long double)total * (s + 1) / shards);
        bool tensors_just_enough = l->n - i <= (size_t)(shards - 1 - s);
        if (s + 1 < shards && in_shard > 0 && (before >= bound || tensors_just_enough)) {
            s++;
            in_shard = 0;
            shard_start = before;
        }
        l->t[i].shard = s;
        l->t[i].shard_offset = before - shard_start;
        in_shard++;
        before += l->t[i].numel * esize;
    }
}
