#include "nspace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/backing_path.h"

int ns_init(ns_table *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->paths = calloc(16, sizeof *t->paths);
    if (!t->paths || !(t->paths[0] = strdup("")))
        return -ENOMEM;
    t->cap = 16;
    t->n = 1;
    return 0;
}

void ns_destroy(ns_table *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free(t->paths[i]);
    free(t->paths);
    pthread_mutex_destroy(&t->lock);
    memset(t, 0, sizeof *t);
}

uint64_t ns_ino(ns_table *t, const char *path)
{
    pthread_mutex_lock(&t->lock);
    uint64_t ino = 0;
    for (uint32_t i = 0; i < t->n && !ino; i++)
        if (t->paths[i] && strcmp(t->paths[i], path) == 0)
            ino = (uint64_t)i + 1;
    if (!ino && t->n < UINT32_MAX - 1) {
        if (t->n == t->cap) {
            char **grown = realloc(t->paths, 2 * t->cap * sizeof *grown);
            if (grown) {
                t->paths = grown;
                t->cap *= 2;
            }
        }
        char *copy = t->n < t->cap ? strdup(path) : NULL;
        if (copy) {
            t->paths[t->n] = copy;
            ino = (uint64_t)t->n + 1;
            t->n++;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return ino;
}

uint64_t ns_parent_ino(ns_table *t, const char *path)
{
    char dir[BACKING_PATH_MAX + 1];
    return backing_dir_of(path, dir, sizeof dir) == 0 ? ns_ino(t, dir) : 0;
}

char *ns_path(ns_table *t, uint64_t ino)
{
    if (!ns_owns(ino))
        return NULL;
    pthread_mutex_lock(&t->lock);
    uint64_t id = ino - 1;
    char *p = id < t->n && t->paths[id] ? strdup(t->paths[id]) : NULL;
    pthread_mutex_unlock(&t->lock);
    return p;
}

static void forget_below(ns_table *t, const char *path)
{
    for (uint32_t i = 1; i < t->n; i++) {
        if (t->paths[i] && backing_is_below(t->paths[i], path)) {
            free(t->paths[i]);
            t->paths[i] = NULL;
        }
    }
}

void ns_removed(ns_table *t, const char *path)
{
    pthread_mutex_lock(&t->lock);
    forget_below(t, path);
    pthread_mutex_unlock(&t->lock);
}

void ns_renamed(ns_table *t, const char *from, const char *to)
{
    size_t flen = strlen(from), tlen = strlen(to);
    pthread_mutex_lock(&t->lock);
    forget_below(t, to);
    for (uint32_t i = 1; i < t->n; i++) {
        char *p = t->paths[i];
        if (!p || !backing_is_below(p, from))
            continue;
        size_t rest = strlen(p) - flen;
        char *moved = malloc(tlen + rest + 1);
        if (!moved)
            continue;
        memcpy(moved, to, tlen);
        memcpy(moved + tlen, p + flen, rest + 1);
        free(p);
        t->paths[i] = moved;
    }
    pthread_mutex_unlock(&t->lock);
}
