#include "fslog.h"

#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>

static int to_syslog;

void fslog_use_syslog(void)
{
    openlog("ckptfs", LOG_PID, LOG_DAEMON);
    to_syslog = 1;
}

void fslog_close(void)
{
    if (to_syslog)
        closelog();
    to_syslog = 0;
}

void fslog(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    for (char *c = line; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    if (to_syslog)
        syslog(LOG_ERR, "%s", line);
    else
        /* One call so lines from concurrent threads never interleave. */
        fprintf(stderr, "ckptfs: %s\n", line);
}
