/* The ckpt-cuda commands that load a checkpoint: `load` and `bench`
 * (cmd_load.c). main.c parses the options and calls one of them. */
#ifndef CC_CMD_LOAD_H
#define CC_CMD_LOAD_H

#include "tool.h"

/* EXIT_OK, EXIT_FAIL or EXIT_USAGE, having printed what happened. */
int cmd_load(const tool_opts *o);
int cmd_bench(const tool_opts *o);

#endif
