/* ckpt-gen's formats: config.json, safetensors shards (header JSON padded
 * as the reference writer pads it) with model.safetensors.index.json when
 * sharded, and version 1 npy files, laid out as Hugging Face and numpy
 * write them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

/* The safetensors reference writer pads its header to this alignment. */
#define ST_HEADER_ALIGN 8
/* numpy aligns the data of an .npy file to this many bytes. */
#define NPY_ALIGN 64

static const char *st_dtype_name(elem_format f)
{
    return f == FMT_BF16 ? "BF16" : f == FMT_F16 ? "F16" : "F32";
}

static const char *torch_dtype_name(elem_format f)
{
    return f == FMT_BF16 ? "bfloat16" : f == FMT_F16 ? "float16" : "float32";
}

void write_config(const options *o)
{
    /* Heads of 64 dimensions as in GPT-2; other widths fall back to the
     * largest head count that divides them. */
    unsigned heads = o->dim >= 64 ? o->dim / 64 : 1;
    while (o->dim % heads)
        heads--;
    strbuf b = {0};
    sb_printf(&b,
              "{\n"
              "  \"activation_function\": \"gelu_new\",\n"
              "  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
              "  \"attn_pdrop\": 0.1,\n"
              "  \"bos_token_id\": %u,\n"
              "  \"embd_pdrop\": 0.1,\n"
              "  \"eos_token_id\": %u,\n"
              "  \"initializer_range\": 0.02,\n"
              "  \"layer_norm_epsilon\": 1e-05,\n"
              "  \"model_type\": \"gpt2\",\n"
              "  \"n_ctx\": %u,\n"
              "  \"n_embd\": %u,\n"
              "  \"n_head\": %u,\n"
              "  \"n_inner\": null,\n"
              "  \"n_layer\": %u,\n"
              "  \"n_positions\": %u,\n"
              "  \"reorder_and_upcast_attn\": false,\n"
              "  \"resid_pdrop\": 0.1,\n"
              "  \"scale_attn_by_inverse_layer_idx\": false,\n"
              "  \"scale_attn_weights\": true,\n"
              "  \"summary_activation\": null,\n"
              "  \"summary_first_dropout\": 0.1,\n"
              "  \"summary_proj_to_labels\": true,\n"
              "  \"summary_type\": \"cls_index\",\n"
              "  \"summary_use_proj\": true,\n"
              "  \"torch_dtype\": \"%s\",\n"
              "  \"transformers_version\": \"4.40.0\",\n"
              "  \"use_cache\": true,\n"
              "  \"vocab_size\": %u\n"
              "}\n",
              o->vocab - 1, o->vocab - 1, N_POSITIONS, o->dim, heads, o->layers, N_POSITIONS,
              torch_dtype_name(o->dtype), o->vocab);
    write_text_file(o->outdir, "config.json", &b);
    free(b.s);
}

static void shard_name(char *dst, size_t cap, unsigned shard, unsigned shards)
{
    if (shards == 1)
        snprintf(dst, cap, "model.safetensors");
    else
        snprintf(dst, cap, "model-%05u-of-%05u.safetensors", shard + 1, shards);
}

/* Header of one shard: tensors of that shard in file order, padded with
 * spaces as the reference writer does. */
static void st_header(const tensor_list *l, unsigned shard, elem_format fmt, strbuf *b)
{
    unsigned esize = elem_bytes(fmt);
    sb_printf(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < l->n; i++) {
        const tensor_spec *t = &l->t[i];
        if (t->shard != shard)
            continue;
        sb_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu", t->name, st_dtype_name(fmt),
                  (unsigned long long)t->shape[0]);
        if (t->ndim == 2)
            sb_printf(b, ",%llu", (unsigned long long)t->shape[1]);
        sb_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->shard_offset,
                  (unsigned long long)(t->shard_offset + t->numel * esize));
    }
    sb_printf(b, "}");
    while (b->len % ST_HEADER_ALIGN)
        sb_printf(b, " ");
}

void st_begin_shard(out_file *f, const options *o, const tensor_list *l, unsigned shard)
{
    char name[64];
    shard_name(name, sizeof name, shard, o->shards);
    strbuf hdr = {0};
    st_header(l, shard, o->dtype, &hdr);
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++)
        len_le[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    out_open(f, o->outdir, name);
    out_write(f, len_le, sizeof len_le);
    out_write(f, hdr.s, hdr.len);
    free(hdr.s);
}

void write_index(const options *o, const tensor_list *l)
{
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++)
        total += l->t[i].numel * elem_bytes(o->dtype);
    strbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
              (unsigned long long)total);
    for (size_t i = 0; i < l->n; i++) {
        char name[64];
        shard_name(name, sizeof name, l->t[i].shard, o->shards);
        sb_printf(&b, "%s\n    \"%s\": \"%s\"", i ? "," : "", l->t[i].name, name);
    }
    sb_printf(&b, "\n  }\n}\n");
    write_text_file(o->outdir, "model.safetensors.index.json", &b);
    free(b.s);
}

/* numpy cannot hold bfloat16, so bf16 tensors go to npy as float32. */
elem_format npy_format(elem_format f)
{
    return f == FMT_BF16 ? FMT_F32 : f;
}

void npy_begin(out_file *f, const char *dir, const tensor_spec *t, elem_format fmt)
{
    char name[NAME_MAX_LEN + 8];
    snprintf(name, sizeof name, "%s.npy", t->name);
    strbuf dict = {0};
    sb_printf(&dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,",
              fmt == FMT_F16 ? "<f2" : "<f4", (unsigned long long)t->shape[0]);
    if (t->ndim == 2)
        sb_printf(&dict, " %llu", (unsigned long long)t->shape[1]);
    sb_printf(&dict, "), }");
    /* Version 1 preamble (10 bytes), then spaces and a newline up to the
     * alignment, as numpy.save writes it. */
    while ((10 + dict.len + 1) % NPY_ALIGN)
        sb_printf(&dict, " ");
    sb_printf(&dict, "\n");
    uint8_t pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(dict.len & 0xff), (uint8_t)(dict.len >> 8)};
    out_open(f, dir, name);
    out_write(f, pre, sizeof pre);
    out_write(f, dict.s, dict.len);
    free(dict.s);
}

void put_value(out_file *f, elem_format fmt, float v)
{
    if (fmt == FMT_F32) {
        uint32_t x = f32_bits(v);
        uint8_t *p = out_reserve(f, 4);
        p[0] = (uint8_t)x;
        p[1] = (uint8_t)(x >> 8);
        p[2] = (uint8_t)(x >> 16);
        p[3] = (uint8_t)(x >> 24);
        return;
    }
    uint16_t h = fmt == FMT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    uint8_t *p = out_reserve(f, 2);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}
