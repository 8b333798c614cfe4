/* ckpt-gen's parts and what they share. The program is four jobs, one file
 * each, called from main in ckpt_gen.c:
 *
 *   model.c    the GPT-2 shape: presets, the tensor list, sharding
 *   values.c   the values: a per-tensor seeded N(0, 0.02) stream, and its
 *              rounding to bf16 and f16
 *   output.c   buffered output files and growable strings
 *   formats.c  what is written: config.json, safetensors shards and their
 *              index, npy files
 */
#ifndef CKPT_GEN_H
#define CKPT_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define N_POSITIONS 1024u
#define NAME_MAX_LEN 64

/* ---------------------------------------------------------------- options */

typedef enum elem_format { FMT_BF16, FMT_F16, FMT_F32 } elem_format;

typedef struct options {
    const char *outdir;
    const char *preset;
    unsigned layers, dim, vocab;
    elem_format dtype;
    uint64_t seed;
    bool safetensors, npy;
    unsigned shards;
} options;

/* "ckpt-gen: <message>" on stderr, exit 2. */
void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "ckpt-gen: <path>: <strerror(errno)>" on stderr, exit 1. */
void io_error(const char *path) __attribute__((noreturn));

/* ------------------------------------------------------------------ model */

typedef struct preset {
    const char *name;
    unsigned layers, dim, vocab;
} preset;

/* The preset called name, or NULL. */
const preset *preset_find(const char *name);

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

/* The tensors of a GPT-2 of o's layers, dim and vocab. */
void gpt2_tensors(const options *o, tensor_list *l);
/* qsort order by name, as the safetensors reference writes tensors. */
int tensor_name_cmp(const void *a, const void *b);
unsigned elem_bytes(elem_format f);
/* Spreads the (sorted) tensors over shards of about equal size. */
void assign_shards(tensor_list *l, unsigned shards, unsigned esize);

/* ----------------------------------------------------------------- values */

/* xoshiro256**: fast, and statistically far better than this use needs. */
typedef struct rng {
    uint64_t s[4];
    bool have_spare;
    double spare;
} rng;

/* A stream of its own for each tensor name, the same for every run with
 * this seed. */
void rng_seed(rng *r, uint64_t seed, const char *name);
/* N(0, 1). */
double rng_normal(rng *r);
/* The float's bits. */
uint32_t f32_bits(float f);
/* Round to nearest even, as torch does. */
uint16_t f32_to_bf16(float f);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);

/* ----------------------------------------------------------------- output */

typedef struct out_file {
    int fd;
    char *path;
    uint8_t *buf;
    size_t used;
    uint64_t bytes;
} out_file;

/* For the summary line. */
extern uint64_t total_bytes_written;
extern unsigned files_written;

/* "a/b", malloc'd; exits when out of memory (as every helper here does). */
char *path_join(const char *a, const char *b);
void out_open(out_file *f, const char *dir, const char *name);
void out_write(out_file *f, const void *data, size_t len);
/* n bytes of the buffer to fill in place (n is small). */
uint8_t *out_reserve(out_file *f, size_t n);
void out_close(out_file *f);

/* A growable string for the JSON and npy headers. */
typedef struct strbuf {
    char *s;
    size_t len, cap;
} strbuf;

void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void write_text_file(const char *dir, const char *name, const strbuf *b);

/* ---------------------------------------------------------------- formats */

void write_config(const options *o);
/* Opens shard's file and writes its safetensors header. */
void st_begin_shard(out_file *f, const options *o, const tensor_list *l, unsigned shard);
/* model.safetensors.index.json, for a sharded checkpoint. */
void write_index(const options *o, const tensor_list *l);
/* The element format npy files hold: numpy has no bf16, so bf16 is f32. */
elem_format npy_format(elem_format f);
void npy_begin(out_file *f, const char *dir, const tensor_spec *t, elem_format fmt);
void put_value(out_file *f, elem_format fmt, float v);

#endif
