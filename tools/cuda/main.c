/* `ckpt-cuda`: loads checkpoints straight into GPU memory and measures how
 * close that comes to the host-to-device link's limit. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend_cuda.h"
#include "cmd_load.h"
#include "tool.h"

static void usage(FILE *f)
{
    fputs("usage: ckpt-cuda load SRC [--device N] [--verify] [--select PATTERN]...\n"
          "       ckpt-cuda bench SRC [--device N]\n"
          "       ckpt-cuda devices\n"
          "       ckpt-cuda --help | --version\n"
          "\n"
          "Loads a checkpoint straight into GPU memory: reading or decoding overlaps\n"
          "the copies, through a small ring of pinned buffers and several streams.\n"
          "SRC is a .tpack file, an S3 object s3://BUCKET/[PREFIX/]NAME.tpack (endpoint\n"
          "and credentials from the AWS environment variables and ~/.aws), or a\n"
          "checkpoint directory of a ckptfs mount (MOUNT/NAME, read through its\n"
          "manifest.json).\n"
          "\n"
          "commands:\n"
          "  load     load every tensor (or the selected ones) and print the rate\n"
          "  bench    time plain pinned cudaMemcpy (the link's limit), a naive load\n"
          "           (read everything, then copy) and the pipeline; print the ratios\n"
          "  devices  list the CUDA devices\n"
          "\n"
          "options:\n"
          "  --device N            CUDA device index (default 0)\n"
          "  --verify              copy the tensors back and check each SHA-256\n"
          "  --select PATTERN      load only matching tensors (repeatable): an exact\n"
          "                        name, or a glob such as 'h.0.*'\n"
          "  --pinned SIZE         pinned host memory bound (default 256M; K/M/G)\n"
          "  --threads N           reader/decoder threads (default: one per core, at most 32)\n"
          "  --streams N           CUDA streams (default 4)\n"
          "  --align N             tensor alignment in device memory (default 256)\n"
          "  --key-file FILE       key of an encrypted .tpack\n"
          "  --passphrase-file F   passphrase of an encrypted .tpack\n"
          "  -q, --quiet           print only errors\n"
          "\n"
          "exit status: 0 success, 1 failure (no device, unreadable source, a tensor\n"
          "that does not verify), 2 usage error\n",
          f);
}

/* "256M", "1G", "65536": binary multiples. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        break;
    }
    if (shift && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end || (shift && v > (SIZE_MAX >> shift)))
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

static int parse_uint(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

enum { O_DEVICE = 256, O_VERIFY, O_SELECT, O_PINNED, O_THREADS, O_STREAMS, O_ALIGN, O_KEY, O_PASS };

static int parse_opts(const char *cmd, int argc, char **argv, tool_opts *o)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, O_DEVICE},
        {"verify", no_argument, NULL, O_VERIFY},
        {"select", required_argument, NULL, O_SELECT},
        {"pinned", required_argument, NULL, O_PINNED},
        {"threads", required_argument, NULL, O_THREADS},
        {"streams", required_argument, NULL, O_STREAMS},
        {"align", required_argument, NULL, O_ALIGN},
        {"key-file", required_argument, NULL, O_KEY},
        {"passphrase-file", required_argument, NULL, O_PASS},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    unsigned long v;
    size_t sz;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":qh", longopts, NULL)) != -1) {
        switch (c) {
        case O_DEVICE:
            if (parse_uint(optarg, 1023, &v) < 0)
                return tool_usage_error(cmd, "--device wants a device index, not '%s'", optarg);
            o->load.device = (int)v;
            break;
        case O_VERIFY:
            o->verify = 1;
            break;
        case O_SELECT: {
            const char **p = realloc(o->select, (o->n_select + 1) * sizeof *p);
            if (!p)
                return tool_usage_error(cmd, "out of memory");
            o->select = p;
            o->select[o->n_select++] = optarg;
            break;
        }
        case O_PINNED:
            if (parse_size(optarg, &sz) < 0 || sz < 128 * 1024)
                return tool_usage_error(cmd, "--pinned wants a size of at least 128K, not '%s'",
                                        optarg);
            o->load.pinned_bytes = sz;
            break;
        case O_THREADS:
            if (parse_uint(optarg, 256, &v) < 0 || v == 0)
                return tool_usage_error(cmd, "--threads wants 1..256, not '%s'", optarg);
            o->load.threads = (unsigned)v;
            break;
        case O_STREAMS:
            if (parse_uint(optarg, 64, &v) < 0 || v == 0)
                return tool_usage_error(cmd, "--streams wants 1..64, not '%s'", optarg);
            o->load.streams = (unsigned)v;
            break;
        case O_ALIGN:
            if (parse_size(optarg, &sz) < 0 || sz == 0 || (sz & (sz - 1)) || sz > (1u << 30))
                return tool_usage_error(cmd, "--align wants a power of two up to 1G, not '%s'",
                                        optarg);
            o->load.alignment = sz;
            break;
        case O_KEY:
            o->key_file = optarg;
            break;
        case O_PASS:
            o->passphrase_file = optarg;
            break;
        case 'q':
            o->quiet = 1;
            break;
        case 'h':
            usage(stdout);
            return -1;
        case ':':
            return tool_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
        default:
            return tool_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (o->key_file && o->passphrase_file)
        return tool_usage_error(cmd, "give --key-file or --passphrase-file, not both");
    if (optind >= argc)
        return tool_usage_error(cmd, "missing SRC (a .tpack file or a mounted checkpoint)");
    if (optind + 1 < argc)
        return tool_usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
    o->src = argv[optind];
    struct stat st;
    if ((o->key_file || o->passphrase_file) && stat(o->src, &st) == 0 && S_ISDIR(st.st_mode))
        return tool_usage_error(cmd,
                                "%s is a mounted checkpoint, which its daemon decrypts: "
                                "--key-file and --passphrase-file are for .tpack files",
                                o->src);
    o->load.select = o->select;
    o->load.n_select = o->n_select;
    return 0;
}

static int cmd_devices(int argc, char **argv)
{
    if (argc > 1) {
        if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
            usage(stdout);
            return EXIT_OK;
        }
        return tool_usage_error("devices", "unexpected argument '%s'", argv[1]);
    }
    ckpt_err err = {0};
    int n = ckpt_cuda_device_count(&err);
    if (n < 0)
        return tool_fail(&err);
    for (int i = 0; i < n; i++) {
        char line[512];
        if (cc_cuda_device_line(i, line, sizeof line, &err) < 0)
            return tool_fail(&err);
        puts(line);
    }
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return tool_usage_error(NULL, "missing command");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("ckpt-cuda %s\n", CKPT_VERSION_STRING);
        return EXIT_OK;
    }
    if (strcmp(cmd, "devices") == 0)
        return cmd_devices(argc - 1, argv + 1);
    if (strcmp(cmd, "load") != 0 && strcmp(cmd, "bench") != 0) {
        if (cmd[0] == '-')
            return tool_usage_error(NULL, "unknown option '%s' (options go after the command)",
                                    cmd);
        return tool_usage_error(NULL, "unknown command '%s'", cmd);
    }
    tool_opts o = {0};
    int rc = parse_opts(cmd, argc - 1, argv + 1, &o);
    if (rc == 0) {
        if (strcmp(cmd, "bench") == 0 && (o.verify || o.n_select))
            rc = tool_usage_error(cmd, "--verify and --select are for 'load'");
        else
            rc = strcmp(cmd, "load") == 0 ? cmd_load(&o) : cmd_bench(&o);
    } else if (rc < 0) {
        rc = EXIT_OK; /* --help */
    }
    free(o.select);
    return rc;
}
