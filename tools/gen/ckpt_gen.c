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
 * with the model.
 *
 * This file is the command line (options, the loop over tensors, making
 * OUTDIR); the model, the values, the output files and the formats are one
 * file each (gen.h). */
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

#include "gen.h"

#define INIT_STD 0.02

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

void usage_error(const char *fmt, ...)
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

void io_error(const char *path)
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

    const preset *p = preset_find(o->preset);
    if (!p)
        usage_error("unknown preset '%s'", o->preset);
    o->layers = layers > 0 ? (unsigned)layers : p->layers;
    o->dim = dim > 0 ? (unsigned)dim : p->dim;
    o->vocab = vocab > 0 ? (unsigned)vocab : p->vocab;
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
           o.dtype == FMT_BF16  ? "bf16"
           : o.dtype == FMT_F16 ? "f16"
                                : "f32",
           (unsigned long long)o.seed);
    free(npy_dir);
    free(l.t);
    return 0;
}
