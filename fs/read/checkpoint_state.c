#include "checkpoint_state.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_mount.h"

static void set_line(checkpoint *c, char *dst, const char *fmt, va_list ap)
{
    char msg[sizeof c->last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* One line: xattr values are shown as is by `ckpt status`. */
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    pthread_mutex_lock(&c->fault_lock);
    memcpy(dst, msg, sizeof msg);
    pthread_mutex_unlock(&c->fault_lock);
}

void checkpoint_set_error(checkpoint *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_line(c, c->last_error, fmt, ap);
    va_end(ap);
}

static void set_outage_error(checkpoint *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_line(c, c->outage_error, fmt, ap);
    va_end(ap);
}

size_t checkpoint_get_error(checkpoint *c, char *buf, size_t cap)
{
    if (!cap)
        return 0;
    pthread_mutex_lock(&c->fault_lock);
    snprintf(buf, cap, "%s", c->outage_error[0] ? c->outage_error : c->last_error);
    pthread_mutex_unlock(&c->fault_lock);
    return strlen(buf);
}

int checkpoint_is_damaged(checkpoint *c)
{
    return __atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == CHECKPOINT_FAILED && c->open_err == -EIO;
}

int checkpoint_is_broken(checkpoint *c)
{
    return checkpoint_is_damaged(c) && c->open_cause != -ENOTSUP && c->open_cause != -ENOENT;
}

const char *checkpoint_state_name(checkpoint_table *t, checkpoint *c)
{
    int rc = checkpoint_open(t, c);
    if (rc == -EACCES)
        return CKPT_STATE_KEY_MISMATCH;
    if (rc == -EIO && checkpoint_is_damaged(c))
        return CKPT_STATE_DAMAGED;
    /* An -EIO that was not remembered is the store's, not the pack's: its
     * open already recorded why. */
    if (rc == -EIO)
        return CKPT_STATE_UNREACHABLE;
    /* Open before the outage: what is not in memory or cache_dir cannot
     * be read now either. */
    ckpt_err err = {0};
    if (rc == 0 && ckpt_store_reachable(t->store, &err) < 0) {
        set_outage_error(c, "%s", err.msg);
        return CKPT_STATE_UNREACHABLE;
    }
    if (rc == 0)
        set_outage_error(c, "%s", ""); /* no longer the news */
    return CKPT_STATE_COMMITTED;
}
