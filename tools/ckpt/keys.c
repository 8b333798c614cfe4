/* Key options, opening packs with them, and `ckpt keygen`. Key material only
 * ever passes through the library's locked buffers; nothing here reads or
 * prints it. */
#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include "cli.h"
#include "ckpt_internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

int cli_keyopt(int c, const char *arg, cli_keyopts *k)
{
    if (c == OPT_KEY_FILE)
        k->key_file = arg;
    else if (c == OPT_PASS_FILE)
        k->pass_file = arg;
    else if (c == OPT_ENDPOINT)
        k->endpoint = arg;
    else if (c == OPT_REGION)
        k->region = arg;
    else if (c == OPT_PROFILE)
        k->profile = arg;
    else
        return 0;
    return 1;
}

int cli_keyopts_check(const char *cmd, const cli_keyopts *k)
{
    if (k->key_file && k->pass_file)
        return cli_usage_error(cmd, "--key-file and --passphrase-file cannot be combined");
    return 0;
}

/* Before any key is read: a core dump or a debugger would see it. */
static int protect_key(ckpt_err *err)
{
    int rc = ckpt_forbid_core_dumps();
    return rc < 0 ? ckpt_fail(err, rc, "cannot disable core dumps: %s", strerror(-rc)) : 0;
}

int cli_load_key(const cli_keyopts *k, ckpt_key **out, ckpt_err *err)
{
    *out = NULL;
    if ((k->key_file || k->pass_file) && protect_key(err) < 0)
        return err->code;
    if (k->key_file)
        return ckpt_key_load_file(k->key_file, out, err);
    if (k->pass_file)
        return ckpt_key_load_passphrase_file(k->pass_file, out, err);
    return 0;
}

/* The store of the pack open from an s3:// URL: the tool opens one pack at
 * a time, and the store must outlive it. */
static ckpt_store *pack_store;

int cli_open_pack(const char *path, const cli_keyopts *k, ckpt_pack **out, ckpt_key **key)
{
    ckpt_err err = {0};
    char pack_path[PATH_MAX];
    *key = NULL;
    if (cli_resolve_pack(&path, pack_path, sizeof pack_path))
        return EXIT_FAIL;
    if (cli_load_key(k, key, &err) < 0)
        return cli_fail_err(&err);
    int rc;
    if (cli_is_s3(path)) {
        const char *name;
        rc = cli_store_for(path, k, &pack_store, &name, &err);
        if (rc == 0)
            rc = ckpt_pack_open_in(pack_store, name, *key, out, &err);
    } else {
        rc = ckpt_open(path, *key, out, &err);
    }
    if (rc < 0) {
        cli_fail_err(&err);
        ckpt_store_free(pack_store);
        pack_store = NULL;
        ckpt_key_free(*key);
        *key = NULL;
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

void cli_close_pack(ckpt_pack *p, ckpt_key *key)
{
    /* The key outlives the pack: the library is free to keep using it. */
    ckpt_close(p);
    ckpt_store_free(pack_store);
    pack_store = NULL;
    ckpt_key_free(key);
}

static const char keygen_help[] =
    "usage: ckpt keygen -o KEYFILE\n"
    "\n"
    "Writes a new random 256-bit key to KEYFILE with mode 0600. An existing\n"
    "file is never overwritten. Anyone who can read the key can read the packs\n"
    "made with it, and a lost key cannot be recovered.\n";

int cmd_keygen(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const char *out = NULL;
    int c;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, CLI_OPTSTRING_PREFIX "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'h':
            fputs(keygen_help, stdout);
            return EXIT_OK;
        case 1:
            return cli_usage_error("keygen", "unexpected argument '%s'", optarg);
        default:
            return cli_bad_option("keygen", c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("keygen", "unexpected argument '%s'", argv[optind]);
    if (!out)
        return cli_usage_error("keygen", "missing -o KEYFILE");
    ckpt_err err = {0};
    if (protect_key(&err) < 0 || ckpt_keygen(out, &err) < 0)
        return cli_fail_err(&err);
    printf("wrote a new key to %s (mode 0600); keep it secret and backed up\n", out);
    return EXIT_OK;
}
