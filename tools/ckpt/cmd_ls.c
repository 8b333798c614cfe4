/* `ckpt ls` and `ckpt info`: what a pack holds and how it is stored, for
 * people (aligned columns) and for programs (--json). */
#include "cli.h"
#include "ckpt_names.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char ls_help[] =
    "usage: ckpt ls PACK [options]\n"
    "\n"
    "PACK is a .tpack file or a checkpoint directory of a ckptfs mount\n"
    "(MOUNT/NAME), which stands for the pack it shows.\n"
    "Lists the files of PACK (size, mode, path), or its tensors (dtype, shape,\n"
    "bytes, name).\n"
    "\n"
    "options:\n"
    "  --tensors                 list tensors instead of files\n"
    "  -l, --long                long listing: pack details first, then mtime and\n"
    "                            SHA-256 for files, file and offset for tensors\n"
    "  --json                    everything as one JSON document: pack, files\n"
    "                            [{path,size,mode,mtime,sha256,container,...}],\n"
    "                            tensors [{name,dtype,shape,nbytes,file,offset,\n"
    "                            sha256,...}] and skipped, with the fields of a\n"
    "                            mount's manifest.json (so not with --tensors or -l)\n"
    "  --key-file FILE           key of an encrypted pack\n"
    "  --passphrase-file FILE    passphrase of an encrypted pack\n" CLI_S3_HELP
    "  -h, --help                show this help\n";

static const char info_help[] =
    "usage: ckpt info PACK [--key-file FILE | --passphrase-file FILE]\n"
    "\n"
    "Shows how PACK is stored: format version, cipher, key derivation, chunk\n"
    "size, sizes and counts. Without the key of an encrypted pack only what its\n"
    "header says is shown. PACK may be s3://BUCKET/[PREFIX/]NAME.tpack\n"
    "(--endpoint, --region, --profile as for 'ckpt ls').\n";

struct ls_opts {
    const char *pack;
    cli_keyopts keys;
    int tensors;
    int json;
    int lng;
};

static int parse_ls_opts(const char *cmd, int argc, char **argv, struct ls_opts *o)
{
    static const struct option opts[] = {
        CLI_KEY_OPTIONS,
        {"tensors", no_argument, NULL, OPT_TENSORS},
        {"json", no_argument, NULL, OPT_JSON},
        {"long", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    int is_info = strcmp(cmd, "info") == 0;
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "lh", opts, NULL)) != -1) {
        if (cli_keyopt(c, optarg, &o->keys))
            continue;
        if (is_info && (c == OPT_TENSORS || c == OPT_JSON || c == 'l'))
            return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        switch (c) {
        case 1:
            if (o->pack)
                return cli_usage_error(cmd, "unexpected argument '%s'", optarg);
            o->pack = optarg;
            break;
        case OPT_TENSORS:
            o->tensors = 1;
            break;
        case OPT_JSON:
            o->json = 1;
            break;
        case 'l':
            o->lng = 1;
            break;
        case 'h':
            fputs(is_info ? info_help : ls_help, stdout);
            return -1;
        default:
            return cli_bad_option(cmd, c, argv);
        }
    }
    if (optind < argc && !o->pack)
        o->pack = argv[optind++];
    if (optind < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (!o->pack)
        return cli_usage_error(cmd, "missing PACK");
    if (o->json && (o->tensors || o->lng))
        return cli_usage_error(cmd, "--json lists everything: --tensors and -l do not apply");
    return cli_keyopts_check(cmd, &o->keys);
}

/* ------------------------------------------------------------- info */

static void print_info(const char *path, const ckpt_pack_info *in, int have_index)
{
    char hex[33], a[16], b[16];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", in->pack_id[i]);
    printf("pack:         %s\n", path);
    printf("format:       %" PRIu32 "\n", in->format_version);
    printf("pack id:      %s\n", hex);
    printf("cipher:       %s\n", in->cipher);
    printf("key:          %s\n", in->kdf);
    if (in->chunk_size % (1024 * 1024) == 0)
        printf("chunk size:   %" PRIu32 " MiB\n", in->chunk_size / (1024 * 1024));
    else
        printf("chunk size:   %" PRIu32 " KiB\n", in->chunk_size / 1024);
    if (!have_index) {
        printf("contents:     encrypted; give --key-file or --passphrase-file to see them\n");
        return;
    }
    printf("files:        %zu\n", in->n_files);
    printf("tensors:      %zu\n", in->n_tensors);
    printf("chunks:       %zu\n", in->n_chunks);
    printf("size:         %s (%" PRIu64 " bytes) stored in %s (%" PRIu64 " bytes)\n",
           cli_fmt_bytes(in->logical_bytes, a, sizeof a), in->logical_bytes,
           cli_fmt_bytes(in->stored_bytes, b, sizeof b), in->stored_bytes);
    if (in->stored_bytes)
        printf("ratio:        %.3f\n", (double)in->logical_bytes / (double)in->stored_bytes);
}

int cmd_info(int argc, char **argv)
{
    struct ls_opts o = {0};
    int rc = parse_ls_opts("info", argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;

    ckpt_pack_info in;
    ckpt_err err = {0};
    char pack_path[PATH_MAX];
    if (cli_resolve_pack(&o.pack, pack_path, sizeof pack_path))
        return EXIT_FAIL;
    if (cli_probe(o.pack, &o.keys, &in, &err) < 0)
        return cli_fail_err(&err);
    /* The header is readable without a key; everything else of an
     * encrypted pack is not, and that is not an error for `info`. */
    if (strcmp(in.cipher, "none") != 0 && !o.keys.key_file && !o.keys.pass_file) {
        print_info(o.pack, &in, 0);
        return EXIT_OK;
    }
    ckpt_pack *p;
    ckpt_key *key;
    if (cli_open_pack(o.pack, &o.keys, &p, &key))
        return EXIT_FAIL;
    ckpt_info(p, &in);
    print_info(o.pack, &in, 1);
    cli_close_pack(p, key);
    return EXIT_OK;
}

/* --------------------------------------------------------------- ls */

static void fmt_shape(const ckpt_tensor_info *t, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

static void list_files(ckpt_pack *p, int lng)
{
    char hex[65], when[32];
    for (size_t i = 0; i < ckpt_file_count(p); i++) {
        const ckpt_file_info *f = ckpt_file_at(p, i);
        if (!lng) {
            printf("%12" PRIu64 "  %04o  ", f->size, (unsigned)f->mode);
            cli_put_name(f->path);
            putchar('\n');
            continue;
        }
        time_t t = (time_t)f->mtime_sec;
        struct tm tm;
        if (!localtime_r(&t, &tm) || !strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm))
            snprintf(when, sizeof when, "%" PRId64, f->mtime_sec);
        ckpt_hex32(f->sha256, hex);
        printf("%04o  %12" PRIu64 "  %s  %.16s  ", (unsigned)f->mode, f->size, when, hex);
        cli_put_name(f->path);
        putchar('\n');
    }
}

static void list_tensors(ckpt_pack *p, int lng)
{
    /* Shapes vary in width; size the column to the widest so the names,
     * which are what people scan for, line up. */
    char shape[512];
    int width = 0;
    size_t n = ckpt_tensor_count(p);
    for (size_t i = 0; i < n; i++) {
        fmt_shape(ckpt_tensor_at(p, i), shape, sizeof shape);
        int len = (int)strlen(shape);
        if (len > width)
            width = len < 40 ? len : 40;
    }
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor_info *t = ckpt_tensor_at(p, i);
        /* Chunks of an assembled tensor: shown as it, as the mount does. */
        if (t->part_of != SIZE_MAX)
            continue;
        fmt_shape(t, shape, sizeof shape);
        printf("%-5s  %-*s  %12" PRIu64 "  ", t->dtype, width, shape, t->nbytes);
        cli_put_name(t->name);
        if (lng && t->n_parts) {
            printf("  (assembled from %zu chunks)", t->n_parts);
        } else if (lng) {
            fputs("  (", stdout);
            cli_put_name(ckpt_file_at(p, t->file_index)->path);
            printf(" @ %" PRIu64 ")", t->file_offset);
        }
        putchar('\n');
    }
}

static json_t *json_hex32(const uint8_t digest[32])
{
    char hex[65];
    ckpt_hex32(digest, hex);
    return json_string(hex);
}

/* Paths and names are bytes that need not be UTF-8, which JSON cannot
 * carry: key holds the name or its display form, and key_b64 its raw bytes
 * when it is not UTF-8 (ckpt_names.h), as in a mount's manifest.json. */
static void set_name(json_t *o, const char *key, const char *name, int *bad)
{
    char *shown = ckpt_name_display(name);
    json_t *j = shown ? json_string(shown) : NULL;
    free(shown);
    if (!j) {
        *bad = 1;
        j = json_null();
    }
    json_object_set_new(o, key, j);
    if (ckpt_name_is_utf8(name))
        return;
    char b64_key[64];
    snprintf(b64_key, sizeof b64_key, "%s_b64", key);
    char *b64 = ckpt_base64(name, strlen(name));
    if (!b64)
        *bad = 1;
    json_object_set_new(o, b64_key, b64 ? json_string(b64) : json_null());
    free(b64);
}

/* Other text (a note) in the display form alone. */
static json_t *json_str(const char *s, int *bad)
{
    char *shown = ckpt_name_display(s);
    json_t *j = shown ? json_string(shown) : NULL;
    free(shown);
    if (!j) {
        *bad = 1;
        return json_null();
    }
    return j;
}

static json_t *json_u64(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* An assembled tensor's chunks in order, with the fields manifest.json
 * gives them. */
static json_t *json_parts(ckpt_pack *p, const ckpt_tensor_info *t, int *bad)
{
    json_t *parts = json_array();
    uint64_t row = 0;
    for (size_t k = 0; k < t->n_parts; k++) {
        const ckpt_tensor_info *pt = ckpt_tensor_at(p, t->parts[k]);
        json_t *part = json_object(), *shape = json_array();
        for (uint32_t d = 0; d < pt->ndim; d++)
            json_array_append_new(shape, json_u64(pt->shape[d]));
        set_name(part, "name", pt->name, bad);
        json_object_set_new(part, "row", json_u64(row));
        json_object_set_new(part, "shape", shape);
        json_object_set_new(part, "nbytes", json_u64(pt->nbytes));
        set_name(part, "file", ckpt_file_at(p, pt->file_index)->path, bad);
        json_object_set_new(part, "offset", json_u64(pt->file_offset));
        json_object_set_new(part, "sha256", json_hex32(pt->sha256));
        json_array_append_new(parts, part);
        row += pt->shape[0];
    }
    return parts;
}

static json_t *build_json(ckpt_pack *p, int *bad)
{
    ckpt_pack_info in;
    ckpt_info(p, &in);
    char id[33];
    for (int i = 0; i < 16; i++)
        snprintf(id + 2 * i, 3, "%02x", in.pack_id[i]);

    json_t *pack = json_object();
    set_name(pack, "path", ckpt_path(p), bad);
    json_t *rest = json_pack(
        "{s:I, s:s, s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "format_version",
        (json_int_t)in.format_version, "pack_id", id, "chunk_size", (json_int_t)in.chunk_size,
        "cipher", in.cipher, "kdf", in.kdf, "stored_bytes", (json_int_t)in.stored_bytes,
        "logical_bytes", (json_int_t)in.logical_bytes, "n_files", (json_int_t)in.n_files,
        "n_tensors", (json_int_t)in.n_tensors, "n_chunks", (json_int_t)in.n_chunks);
    if (!rest || json_object_update(pack, rest))
        *bad = 1;
    json_decref(rest);
    json_t *files = json_array();
    for (size_t i = 0; i < ckpt_file_count(p); i++) {
        const ckpt_file_info *f = ckpt_file_at(p, i);
        json_t *o = json_object();
        set_name(o, "path", f->path, bad);
        json_object_set_new(o, "size", json_u64(f->size));
        /* A number, as stat reports it: programs use it, people have -l. */
        json_object_set_new(o, "mode", json_integer(f->mode));
        json_object_set_new(o, "mtime", json_integer(f->mtime_sec));
        json_object_set_new(o, "mtime_nsec", json_integer(f->mtime_nsec));
        json_object_set_new(o, "sha256", json_hex32(f->sha256));
        json_object_set_new(o, "container", json_string(f->container));
        if (f->note[0])
            json_object_set_new(o, "warning", json_str(f->note, bad));
        json_array_append_new(files, o);
    }
    json_t *tensors = json_array();
    for (size_t i = 0; i < ckpt_tensor_count(p); i++) {
        const ckpt_tensor_info *t = ckpt_tensor_at(p, i);
        /* Listed among its assembled tensor's parts, as manifest.json does. */
        if (t->part_of != SIZE_MAX)
            continue;
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_u64(t->shape[d]));
        json_t *o = json_object();
        set_name(o, "name", t->name, bad);
        json_object_set_new(o, "dtype", json_string(t->dtype));
        /* Loaders need no dtype table of their own (README.md, manifest). */
        json_object_set_new(o, "container", json_string(ckpt_file_at(p, t->file_index)->container));
        json_object_set_new(o, "numpy_dtype", json_string(ckpt_dtype_numpy(t->dtype)));
        if (!ckpt_dtype_numpy_exact(t->dtype))
            json_object_set_new(o, "numpy_raw_bits", json_true());
        json_object_set_new(o, "torch_dtype", json_string(ckpt_dtype_torch(t->dtype)));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "nbytes", json_u64(t->nbytes));
        if (t->n_parts) {
            /* No one place: where its parts are (as in manifest.json). */
            json_object_set_new(o, "file", json_null());
            json_object_set_new(o, "offset", json_null());
        } else {
            set_name(o, "file", ckpt_file_at(p, t->file_index)->path, bad);
            json_object_set_new(o, "offset", json_u64(t->file_offset));
        }
        json_object_set_new(o, "sha256", json_hex32(t->sha256));
        if (t->n_parts)
            json_object_set_new(o, "parts", json_parts(p, t, bad));
        json_array_append_new(tensors, o);
    }
    /* Tensors a parser found but does not show, with why (as manifest.json). */
    json_t *skipped = json_array();
    for (size_t i = 0; i < ckpt_skipped_count(p); i++) {
        const ckpt_skipped_info *k = ckpt_skipped_at(p, i);
        json_t *o = json_object();
        set_name(o, "name", k->name, bad);
        set_name(o, "file", ckpt_file_at(p, k->file_index)->path, bad);
        json_object_set_new(o, "reason", json_str(k->reason, bad));
        json_array_append_new(skipped, o);
    }
    json_t *root = json_object();
    json_object_set_new(root, "pack", pack);
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "tensors", tensors);
    json_object_set_new(root, "skipped", skipped);
    return root;
}

int cmd_ls(int argc, char **argv)
{
    struct ls_opts o = {0};
    int rc = parse_ls_opts("ls", argc, argv, &o);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;

    ckpt_pack *p;
    ckpt_key *key;
    if (cli_open_pack(o.pack, &o.keys, &p, &key))
        return EXIT_FAIL;
    rc = EXIT_OK;
    if (o.json) {
        int bad = 0;
        json_t *root = build_json(p, &bad);
        if (bad)
            rc = cli_fail("%s: cannot build the JSON listing (out of memory)", o.pack);
        else if (!root || json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
            rc = cli_fail("%s: cannot write the JSON listing", o.pack);
        else
            putchar('\n');
        json_decref(root);
    } else {
        if (o.lng) {
            ckpt_pack_info in;
            ckpt_info(p, &in);
            print_info(o.pack, &in, 1);
            putchar('\n');
        }
        if (o.tensors)
            list_tensors(p, o.lng);
        else
            list_files(p, o.lng);
    }
    cli_close_pack(p, key);
    if (fflush(stdout) != 0)
        rc = cli_fail("writing the listing failed");
    return rc;
}
