/* What every ckpt-cuda command shares: usage and failure messages in one
 * voice, and loading the key the options name. Its own file so that main.c
 * (option parsing, dispatch) and cmd_load.c (the commands) both call down
 * into it and never into each other. */
#define CKPT_INTERNAL_API /* ckpt_forbid_core_dumps */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_internal.h"
#include "tool.h"

int tool_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ckpt-cuda%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nsee 'ckpt-cuda --help'\n", stderr);
    return EXIT_USAGE;
}

int tool_fail(const ckpt_err *err)
{
    fprintf(stderr, "ckpt-cuda: %s\n", err->msg[0] ? err->msg : strerror(-err->code));
    return EXIT_FAIL;
}

int tool_load_key(const tool_opts *o, ckpt_key **key)
{
    ckpt_err err = {0};
    *key = NULL;
    int rc = o->key_file || o->passphrase_file ? ckpt_forbid_core_dumps() : 0;
    if (rc < 0) {
        fprintf(stderr, "ckpt-cuda: cannot disable core dumps: %s\n", strerror(-rc));
        return EXIT_FAIL;
    }
    if (o->key_file && ckpt_key_load_file(o->key_file, key, &err) < 0)
        return tool_fail(&err);
    if (o->passphrase_file && ckpt_key_load_passphrase_file(o->passphrase_file, key, &err) < 0)
        return tool_fail(&err);
    return EXIT_OK;
}
