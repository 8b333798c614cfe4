#include "libfuse_log.h"

#include <stdio.h>
#include <string.h>

#include "common/fslog.h"
#include "fuse_api.h"

/* libfuse builds some lines in several calls ("unknown option(s): `",
 * then each option, then "'\n"): pieces wait here, per thread, for their
 * newline. */
static _Thread_local char pending[1024];
static _Thread_local size_t pending_len;

static void to_fslog(enum fuse_log_level level, const char *fmt, va_list ap)
{
    size_t room = sizeof pending - pending_len;
    int n = vsnprintf(pending + pending_len, room, fmt, ap);
    if (n < 0)
        return;
    pending_len += (size_t)n < room ? (size_t)n : room - 1;
    int full = pending_len == sizeof pending - 1;
    if (!full && (pending_len == 0 || pending[pending_len - 1] != '\n'))
        return;
    /* One fslog line per line of text. fuse_log_level's values are
     * syslog's priorities. */
    char *line = pending;
    while (*line) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        if (*line)
            fslog_at((int)level, "%s", line);
        if (!end)
            break;
        line = end + 1;
    }
    pending_len = 0;
    pending[0] = '\0';
}

void libfuse_log_to_fslog(void)
{
    fuse_set_log_func(to_fslog);
}
