#include "checkpoint_state.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_mount.h"

void checkpoint_set_error(checkpoint *c, const char *fmt, ...)
{
    char msg[sizeof c->last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One line: xattr values are shown as is by `ckpt status`. */
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    pthread_mutex_lock(&c->fault_lock);
    memcpy(c->last_error, msg, sizeof msg);
    pthread_mutex_unlock(&c->fault_lock);
}

size_t checkpoint_get_error(checkpoint *c, char *buf, size_t cap)
{
    if (!cap)
        return 0;
    pthread_mutex_lock(&c->fault_lock);
    snprintf(buf, cap, "%s", c->last_error);
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
        checkpoint_set_error(c, "%s", err.msg);
        __atomic_store_n(&c->outage_shown, 1, __ATOMIC_RELEASE);
        return CKPT_STATE_UNREACHABLE;
    }
    if (rc == 0 && __atomic_exchange_n(&c->outage_shown, 0, __ATOMIC_ACQ_REL))
        checkpoint_set_error(c, "%s", ""); /* no longer the news */
    return CKPT_STATE_COMMITTED;
}
