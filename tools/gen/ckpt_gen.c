/* ckpt-gen: writes a synthetic GPT-2-shaped checkpoint laid out the way
 * Hugging Face publishes one (config.json, model.safetensors or shards plus
 * an index, optionally one .npy per tensor), so packing, mounting and
 * benchmarks can run on realistic data without downloading a model.
 *
 * Values are drawn from N(0, 0.02) (layer norms are ones and zeros) with a
 * PRNG seeded from --seed and the tensor's name, so a tensor's values do not
 * depend on sharding, format or the order tensors are written in: a bf16
 * and an f32 run with the same seed hold the same numbers, rounded.
 * Everything is streamed through 1 MiB buffers; memory use does not grow
 * with the model. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_INTERNAL_API /* ckpt_write_full */
#include "ckpt_internal.h"

#define WRITE_BUF_BYTES (1u << 20)
#define INIT_STD 0.02
#define N_POSITIONS 1024u
#define NAME_MAX_LEN 64
/* The safetensors reference writer pads its header to this alignment. */
#define ST_HEADER_ALIGN 8
/* numpy aligns the data of an .npy file to this many bytes. */
#define NPY_ALIGN 64

static const char *usage_text =
    "usage: ckpt-gen OUTDIR [--preset gpt2|gpt2-medium|gpt2-large|gpt2-xl|tiny]\n"
    "                [--dtype bf16|f16|f32] [--layers N] [--dim D] [--vocab V]\n"
    "                [--seed S] [--format safetensors|npy|both] [--shards N]\n"
    "Writes a GPT-2-shaped checkpoint with N(0, 0.02) weights into OUTDIR.\n"
    "Defaults: --preset tiny --dtype bf16 --seed 0 --format safetensors --shards 1.\n"
    "--layers/--dim/--vocab override the preset. npy files are version 1, C order;\n"
    "numpy has no bfloat16, so with --dtype bf16 they hold the bf16 values widened\n"
    "exactly to float32.\n";

/* ------------------------------------------------------------- options */

typedef enum elem_format { FMT_BF16, FMT_F16, FMT_F32 } elem_format;

typedef struct preset {
    const char *name;
    unsigned layers, dim, vocab;
} preset;

static const preset presets[] = {
    {"tiny", 2, 128, 1000},        {"gpt2", 12, 768, 50257},
    {"gpt2-medium", 24, 1024, 50257}, {"gpt2-large", 36, 1280, 50257},
    {"gpt2-xl", 48, 1600, 50257},
};

typedef struct options {
    const char *outdir;
    const char *preset;
    unsigned layers, dim, vocab;
    elem_format dtype;
    uint64_t seed;
    bool safetensors, npy;
    unsigned shards;
} options;

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ckpt-gen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fputs(usage_text, stderr);
    exit(2);
}

static void io_error(const char *path) __attribute__((noreturn));

static void io_error(const char *path)
{
    fprintf(stderr, "ckpt-gen: %s: %s\n", path, strerror(errno));
    exit(1);
}

static uint64_t parse_number(const char *opt, const char *s, uint64_t min, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end || errno || v < min || v > max)
        usage_error("%s wants a whole number from %llu to %llu, not '%s'", opt,
                    (unsigned long long)min, (unsigned long long)max, s);
    return v;
}

static void parse_args(int argc, char **argv, options *o)
{
    long layers = -1, dim = -1, vocab = -1;
    memset(o, 0, sizeof *o);
    o->preset = "tiny";
    o->dtype = FMT_BF16;
    o->safetensors = true;
    o->shards = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0) {
            if (o->outdir)
                usage_error("more than one OUTDIR ('%s' and '%s')", o->outdir, a);
            o->outdir = a;
            continue;
        }
        /* Both "--opt value" and "--opt=value". */
        static const char *const known[] = {"--preset", "--dtype", "--layers", "--dim",
                                            "--vocab",  "--seed",  "--format", "--shards"};
        const char *eq = strchr(a, '=');
        size_t opt_len = eq ? (size_t)(eq - a) : strlen(a);
        const char *opt = NULL;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (strlen(known[k]) == opt_len && strncmp(known[k], a, opt_len) == 0)
                opt = known[k];
        if (!opt)
            usage_error("unknown option '%.*s'", (int)opt_len, a);
        const char *val;
        if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                usage_error("%s needs a value", a);
            val = argv[++i];
        }

        if (strcmp(opt, "--preset") == 0) {
            o->preset = val;
        } else if (strcmp(opt, "--dtype") == 0) {
            if (strcmp(val, "bf16") == 0)
                o->dtype = FMT_BF16;
            else if (strcmp(val, "f16") == 0)
                o->dtype = FMT_F16;
            else if (strcmp(val, "f32") == 0)
                o->dtype = FMT_F32;
            else
                usage_error("--dtype must be bf16, f16 or f32, not '%s'", val);
        } else if (strcmp(opt, "--layers") == 0) {
            layers = (long)parse_number(opt, val, 1, 1000);
        } else if (strcmp(opt, "--dim") == 0) {
            dim = (long)parse_number(opt, val, 1, 65536);
        } else if (strcmp(opt, "--vocab") == 0) {
            vocab = (long)parse_number(opt, val, 1, 10000000);
        } else if (strcmp(opt, "--seed") == 0) {
            o->seed = parse_number(opt, val, 0, UINT64_MAX);
        } else if (strcmp(opt, "--format") == 0) {
            o->safetensors = strcmp(val, "safetensors") == 0 || strcmp(val, "both") == 0;
            o->npy = strcmp(val, "npy") == 0 || strcmp(val, "both") == 0;
            if (!o->safetensors && !o->npy)
                usage_error("--format must be safetensors, npy or both, not '%s'", val);
        } else if (strcmp(opt, "--shards") == 0) {
            o->shards = (unsigned)parse_number(opt, val, 1, 99999);
        } else {
            usage_error("unknown option '%s'", opt);
        }
    }
    if (!o->outdir)
        usage_error("no OUTDIR given");
    if (o->shards > 1 && !o->safetensors)
        usage_error("--shards splits safetensors output; --format npy has none");

    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, o->preset) == 0)
            p = &presets[i];
    if (!p)
        usage_error("unknown preset '%s'", o->preset);
    o->layers = layers > 0 ? (unsigned)layers : p->layers;
    o->dim = dim > 0 ? (unsigned)dim : p->dim;
    o->vocab = vocab > 0 ? (unsigned)vocab : p->vocab;
}

/* ------------------------------------------------------------- numbers */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* xoshiro256**: fast, and statistically far better than this use needs. */
typedef struct rng {
    uint64_t s[4];
    bool have_spare;
    double spare;
} rng;

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(rng *r)
{
    uint64_t result = rotl(r->s[1] * 5, 7) * 9;
    uint64_t t = r->s[1] << 17;
    r->s[2] ^= r->s[0];
    r->s[3] ^= r->s[1];
    r->s[1] ^= r->s[2];
    r->s[0] ^= r->s[3];
    r->s[2] ^= t;
    r->s[3] = rotl(r->s[3], 45);
    return result;
}

static void rng_seed(rng *r, uint64_t seed, const char *name)
{
    /* FNV-1a of the name gives each tensor its own stream. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t sm = seed ^ h;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&sm);
    r->have_spare = false;
    r->spare = 0.0;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Box-Muller: each pair of uniforms yields two independent normals. */
static double rng_normal(rng *r)
{
    if (r->have_spare) {
        r->have_spare = false;
        return r->spare;
    }
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log() stays finite */
    double u2 = rng_uniform(r);
    double radius = sqrt(-2.0 * log(u1));
    double angle = 2.0 * M_PI * u2;
    r->spare = radius * sin(angle);
    r->have_spare = true;
    return radius * cos(angle);
}

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

/* Round to nearest, ties to even, as torch's .to(torch.bfloat16) does. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* keep NaN a NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* IEEE half, round to nearest even, with subnormals: at std 0.02 about one
 * value in 300 is below the smallest normal half (2^-14). */
static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* 65520 and up round past 65504, the largest half */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) /* normal half: rebias the exponent, round 13 bits */
        return sign | (uint16_t)((a - (112u << 23) + 0x0fffu + ((a >> 13) & 1u)) >> 13);
    uint32_t e = a >> 23;
    if (e < 102) /* below half the smallest subnormal: rounds to zero */
        return sign;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t m = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u)))
        m++; /* may carry into the smallest normal, which encodes correctly */
    return sign | (uint16_t)m;
}

/* ------------------------------------------------------------- tensors */

typedef enum init_kind { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init_kind;

typedef struct tensor_spec {
    char name[NAME_MAX_LEN];
    uint32_t ndim;
    uint64_t shape[2];
    init_kind init;
    uint64_t numel;
    unsigned shard;
    uint64_t shard_offset; /* where its data starts in the shard's data area */
} tensor_spec;

typedef struct tensor_list {
    tensor_spec *t;
    size_t n, cap;
} tensor_list;

static void add_tensor(tensor_list *l, init_kind init, uint64_t d0, uint64_t d1,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* d1 == 0 means a vector of d0 elements. */
static void add_tensor(tensor_list *l, init_kind init, uint64_t d0, uint64_t d1,
                       const char *fmt, ...)
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
static void gpt2_tensors(const options *o, tensor_list *l)
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

static int tensor_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tensor_spec *)a)->name, ((const tensor_spec *)b)->name);
}

static unsigned elem_bytes(elem_format f)
{
    return f == FMT_F32 ? 4 : 2;
}

/* Splits the tensors (in file order) into `shards` runs of about equal
 * bytes, none empty. */
static void assign_shards(tensor_list *l, unsigned shards, unsigned esize)
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

/* ------------------------------------------------------------- output */

typedef struct out_file {
    int fd;
    char *path;
    uint8_t *buf;
    size_t used;
    uint64_t bytes;
} out_file;

static uint64_t total_bytes_written;
static unsigned files_written;

static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (!p) {
        fputs("ckpt-gen: out of memory\n", stderr);
        exit(1);
    }
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static void out_open(out_file *f, const char *dir, const char *name)
{
    f->path = path_join(dir, name);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0)
        io_error(f->path);
    f->buf = malloc(WRITE_BUF_BYTES);
    if (!f->buf) {
        fputs("ckpt-gen: out of memory\n", stderr);
        exit(1);
    }
    f->used = 0;
    f->bytes = 0;
}

static void out_flush(out_file *f)
{
    ssize_t w = ckpt_write_full(f->fd, f->buf, f->used);
    if (w < 0) {
        errno = (int)-w; /* io_error() reports errno */
        io_error(f->path);
    }
    f->used = 0;
}

static void out_write(out_file *f, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        if (f->used == WRITE_BUF_BYTES)
            out_flush(f);
        size_t n = WRITE_BUF_BYTES - f->used;
        if (n > len)
            n = len;
        memcpy(f->buf + f->used, p, n);
        f->used += n;
        f->bytes += n;
        p += n;
        len -= n;
    }
}

/* Room for one element; flushes first if the buffer is full. Elements are
 * 2 or 4 bytes and the buffer size is a multiple of 4, so they never split. */
static uint8_t *out_reserve(out_file *f, size_t n)
{
    if (WRITE_BUF_BYTES - f->used < n)
        out_flush(f);
    uint8_t *p = f->buf + f->used;
    f->used += n;
    f->bytes += n;
    return p;
}

static void out_close(out_file *f)
{
    out_flush(f);
    if (close(f->fd) != 0)
        io_error(f->path);
    total_bytes_written += f->bytes;
    files_written++;
    free(f->buf);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* A growable string for the JSON and npy headers. */
typedef struct strbuf {
    char *s;
    size_t len, cap;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            fputs("ckpt-gen: formatting failed\n", stderr);
            exit(1);
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) {
            fputs("ckpt-gen: out of memory\n", stderr);
            exit(1);
        }
    }
}

static void write_text_file(const char *dir, const char *name, const strbuf *b)
{
    out_file f;
    out_open(&f, dir, name);
    out_write(&f, b->s, b->len);
    out_close(&f);
}

/* ------------------------------------------------------------- formats */

static const char *st_dtype_name(elem_format f)
{
    return f == FMT_BF16 ? "BF16" : f == FMT_F16 ? "F16" : "F32";
}

static const char *torch_dtype_name(elem_format f)
{
    return f == FMT_BF16 ? "bfloat16" : f == FMT_F16 ? "float16" : "float32";
}

static void write_config(const options *o)
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

static void st_begin_shard(out_file *f, const options *o, const tensor_list *l, unsigned shard)
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

static void write_index(const options *o, const tensor_list *l)
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
static elem_format npy_format(elem_format f)
{
    return f == FMT_BF16 ? FMT_F32 : f;
}

static void npy_begin(out_file *f, const char *dir, const tensor_spec *t, elem_format fmt)
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
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(dict.len & 0xff),
                       (uint8_t)(dict.len >> 8)};
    out_open(f, dir, name);
    out_write(f, pre, sizeof pre);
    out_write(f, dict.s, dict.len);
    free(dict.s);
}

static void put_value(out_file *f, elem_format fmt, float v)
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

/* The bf16 value widened back to float32: what a bf16 tensor holds. */
static float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Streams one tensor's values to the safetensors shard and/or its npy file. */
static void emit_values(const tensor_spec *t, const options *o, out_file *st, out_file *npy)
{
    rng r;
    rng_seed(&r, o->seed, t->name);
    elem_format nfmt = npy_format(o->dtype);
    for (uint64_t i = 0; i < t->numel; i++) {
        float v = t->init == INIT_ONES    ? 1.0f
                  : t->init == INIT_ZEROS ? 0.0f
                                          : (float)(INIT_STD * rng_normal(&r));
        if (st)
            put_value(st, o->dtype, v);
        if (npy) {
            float nv = o->dtype == FMT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
            put_value(npy, nfmt, nv);
        }
    }
}

static void make_dir(const char *path)
{
    /* mkdir -p: create each missing component in turn. */
    char *p = strdup(path);
    if (!p) {
        fputs("ckpt-gen: out of memory\n", stderr);
        exit(1);
    }
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            io_error(p);
        *s = c;
        if (!c)
            break;
    }
    struct stat st;
    if (stat(path, &st) != 0)
        io_error(path);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        io_error(path);
    }
    free(p);
}

int main(int argc, char **argv)
{
    options o;
    parse_args(argc, argv, &o);

    tensor_list l = {0};
    gpt2_tensors(&o, &l);
    if (o.shards > l.n)
        usage_error("--shards %u is more than the %zu tensors", o.shards, l.n);
    /* File order is by name, as the safetensors reference writes it. */
    qsort(l.t, l.n, sizeof *l.t, tensor_name_cmp);
    assign_shards(&l, o.safetensors ? o.shards : 1, elem_bytes(o.dtype));

    make_dir(o.outdir);
    write_config(&o);
    char *npy_dir = path_join(o.outdir, "tensors_npy");
    if (o.npy)
        make_dir(npy_dir);

    out_file shard = {.fd = -1};
    bool shard_open = false;
    for (size_t i = 0; i < l.n; i++) {
        const tensor_spec *t = &l.t[i];
        if (o.safetensors && (!shard_open || t->shard != l.t[i - 1].shard)) {
            if (shard_open)
                out_close(&shard);
            st_begin_shard(&shard, &o, &l, t->shard);
            shard_open = true;
        }
        out_file npy;
        if (o.npy)
            npy_begin(&npy, npy_dir, t, npy_format(o.dtype));
        emit_values(t, &o, o.safetensors ? &shard : NULL, o.npy ? &npy : NULL);
        if (o.npy)
            out_close(&npy);
    }
    if (shard_open)
        out_close(&shard);
    if (o.safetensors && o.shards > 1)
        write_index(&o, &l);

    printf("ckpt-gen: %s: %u files, %zu tensors, %llu bytes (%s: %u layers, dim %u, vocab %u, "
           "%s, seed %llu)\n",
           o.outdir, files_written, l.n, (unsigned long long)total_bytes_written, o.preset,
           o.layers, o.dim, o.vocab,
           o.dtype == FMT_BF16 ? "bf16" : o.dtype == FMT_F16 ? "f16" : "f32",
           (unsigned long long)o.seed);
    free(npy_dir);
    free(l.t);
    return 0;
}
