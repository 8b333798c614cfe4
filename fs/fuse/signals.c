#include "signals.h"

#include <errno.h>
#include <string.h>

#include "common/fslog.h"

static void handled_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
}

void signals_block(sigset_t *saved)
{
    sigset_t set;
    handled_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, saved);
}

void signals_unblock(const sigset_t *saved)
{
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* Async-signal-safe: fslog_request_reopen only writes to a pipe. */
static void on_hangup(int sig)
{
    (void)sig;
    fslog_request_reopen();
}

int signals_install(struct fuse_session *se)
{
    if (fuse_set_signal_handlers(se) != 0)
        return -1;
    /* After libfuse's: it installs a handler only where the disposition is
     * still the default, and its exit-on-SIGHUP must not stay. SA_RESTART
     * so a hangup does not interrupt the loop's system calls. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_hangup;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGHUP, &sa, NULL) != 0) {
        fslog_err("cannot handle SIGHUP: %s", strerror(errno));
        fuse_remove_signal_handlers(se);
        return -1;
    }
    return 0;
}

void signals_remove(struct fuse_session *se)
{
    /* libfuse resets only the handlers that are still its own. */
    fuse_remove_signal_handlers(se);
    /* A logrotate SIGHUP while exiting must not cut the exit short. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
}

const char *signals_name(int sig)
{
    switch (sig) {
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGHUP:
        return "SIGHUP";
    case SIGQUIT:
        return "SIGQUIT";
    }
    return NULL;
}
