/* The ckpt-cuda command-line tool: its options, exit codes, and the helpers
 * every command shares (tool.c). */
#ifndef CC_TOOL_H
#define CC_TOOL_H

#include "ckpt_cuda.h"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

typedef struct tool_opts {
    const char *src;
    int verify, quiet;
    const char *key_file, *passphrase_file;
    const char **select;
    size_t n_select;
    ckpt_cuda_load_opts load;
} tool_opts;

/* Prints "ckpt-cuda CMD: <message>" and the pointer to --help; EXIT_USAGE. */
int tool_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "ckpt-cuda: <message>"; EXIT_FAIL. */
int tool_fail(const ckpt_err *err);

/* The key named by --key-file/--passphrase-file, or NULL; EXIT_* on failure. */
int tool_load_key(const tool_opts *o, ckpt_key **key);

#endif
