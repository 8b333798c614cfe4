/* SIGINT and SIGTERM for the commands that clean up after themselves
 * (pack, unpack): their handlers only set a flag, or, on a second signal,
 * remove what is half-written and _exit. */
#include "cli.h"

#include <signal.h>
#include <string.h>

void cli_catch_interrupts(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    /* Restart interrupted I/O: the library should not see a spurious EINTR
     * and report it as a write error; the flag is what stops the work. */
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}
