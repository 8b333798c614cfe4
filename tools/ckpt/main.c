/* `ckpt`: entry point. Picks the subcommand and handles the global options;
 * each subcommand parses the rest of the line itself. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"pack", cmd_pack, "pack a directory or a file into a .tpack"},
    {"unpack", cmd_unpack, "recreate the packed files in a directory"},
    {"ls", cmd_ls, "list the files or tensors of a pack (also as JSON)"},
    {"info", cmd_info, "show how a pack is stored (cipher, chunk size, sizes)"},
    {"cat", cmd_cat, "write one file or tensor of a pack to stdout"},
    {"verify", cmd_verify, "check every chunk, file and tensor of a pack"},
    {"keygen", cmd_keygen, "write a new random key file"},
    {"commit", cmd_commit, "commit a checkpoint written into a ckptfs mount"},
    {"status", cmd_status, "show the checkpoints of a ckptfs mount and their state"},
    {"s3-cleanup", cmd_s3_cleanup, "abort unfinished uploads left under an s3:// prefix"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fputs("usage: ckpt COMMAND [ARGS...]\n"
          "       ckpt --help | --version\n"
          "\n"
          "Packs model checkpoints into compressed, optionally encrypted .tpack files\n"
          "whose files and tensors can be read back without unpacking everything.\n"
          "\n"
          "commands:\n",
          f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fputs("\n"
          "Encrypted packs take --key-file FILE (from 'ckpt keygen') or\n"
          "--passphrase-file FILE on every command that reads or writes them.\n"
          "'ckpt COMMAND --help' describes each command's options.\n"
          "\n"
          "Packs on S3: a PACK or OUT may be s3://BUCKET/[PREFIX/]NAME.tpack, on AWS\n"
          "or any S3 API (--endpoint URL, --region, --profile; path-style requests).\n"
          "Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/\n"
          "AWS_SESSION_TOKEN or ~/.aws/credentials and ~/.aws/config (AWS_PROFILE),\n"
          "never from the command line.\n"
          "\n"
          "exit status: 0 success, 1 failure, 2 usage error, 3 'ckpt status' listed a\n"
          "failed, key mismatch or damaged checkpoint\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage_error(NULL, "missing command");
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
        printf("ckpt %s (format %d)\n", CKPT_VERSION_STRING, CKPT_FORMAT_VERSION);
        return EXIT_OK;
    }
    /* "ckpt help pack" is what people type after reading "ckpt help". */
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return EXIT_OK;
        }
        static char help_opt[] = "--help";
        char *help_argv[] = {argv[2], help_opt, NULL};
        for (size_t i = 0; i < N_COMMANDS; i++)
            if (strcmp(argv[2], commands[i].name) == 0)
                return commands[i].run(2, help_argv);
        return cli_usage_error(NULL, "unknown command '%s'", argv[2]);
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    if (name[0] == '-')
        return cli_usage_error(NULL, "unknown option '%s' (options go after the command)", name);
    return cli_usage_error(NULL, "unknown command '%s'", name);
}
