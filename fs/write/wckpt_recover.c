/* Startup recovery of writable checkpoints: every staging directory is
 * put back as the checkpoint it was (see wckpt.h), and what a crash left
 * behind is cleaned up. */
#include "wckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CKPT_INTERNAL_API
#include "ckpt_internal.h"
#include "common/backing_path.h"
#include "common/fslog.h"
#include "wckpt_internal.h"

/* ----------------------------------------------------------- recovery */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Data files no saved namespace mentions were created after the last
 * wc_save; nothing promised them (their creator never fsynced), so they go,
 * together with half-finished compactions. */
static void remove_orphans(wckpt *c)
{
    uint64_t *ids = calloc(c->tree.n_nodes ? c->tree.n_nodes : 1, sizeof *ids);
    size_t n = 0;
    if (!ids)
        return;
    for (uint32_t i = 0; i < c->tree.n_nodes; i++)
        if (c->tree.nodes[i].linked && c->tree.nodes[i].kind != WNODE_DIR)
            ids[n++] = c->tree.nodes[i].blob_id;
    qsort(ids, n, sizeof *ids, cmp_u64);
    int fd = dup(c->dir.data_fd);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        free(ids);
        return;
    }
    rewinddir(dir);
    unsigned removed = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        char *end;
        uint64_t id = strtoull(e->d_name, &end, 16);
        if (*end == '\0' && strlen(e->d_name) == 16 && bsearch(&id, ids, n, sizeof *ids, cmp_u64))
            continue;
        if (unlinkat(c->dir.data_fd, e->d_name, 0) == 0)
            removed++;
    }
    closedir(dir);
    free(ids);
    if (removed)
        fslog_warn("checkpoint '%s': removed %u staged file(s) created after its last saved state",
                   c->name, removed);
}

static int open_blobs(wckpt *c)
{
    for (uint32_t i = 0; i < c->tree.n_nodes; i++) {
        wnode *n = &c->tree.nodes[i];
        if (!n->linked || n->kind == WNODE_DIR || (n->blob_id & WTREE_BASE_BLOB))
            continue;
        wfile *f = calloc(1, sizeof *f);
        if (!f)
            return -ENOMEM;
        ckpt_err err = {0};
        int rc = stage_blob_open(c->dir.data_fd, n->blob_id, c->dir.key, 0, &f->blob, &err);
        if (rc == -ENOENT) {
            /* Named in a saved namespace but never synced itself. */
            char path[WTREE_PATH_MAX + 1];
            wtree_path(&c->tree, i, path, sizeof path);
            fslog_warn("checkpoint '%s': %s had no data on disk (written but never synced); it "
                       "is empty now",
                       c->name, path);
            rc = stage_blob_open(c->dir.data_fd, n->blob_id, c->dir.key, 1, &f->blob, &err);
        }
        if (rc) {
            free(f);
            fslog_err("checkpoint '%s': %s", c->name, err.msg);
            return rc;
        }
        stage_blob_park(f->blob, &err);
        f->base_index = -1;
        n->data = f;
    }
    return wc_base_files(c);
}

/* A failed checkpoint gets back the staging writes that failed, so that
 * rewriting them makes it good, as before the restart. Without them it
 * stays failed until `ckpt commit`: the idle commit must not pack it with
 * bytes missing. (Saved with a record not failed, they are ignored: the
 * crash came before the record said so, and such a failure is lost with
 * the rest of what was not saved.) */
static void restore_failures(wckpt *c, stage_failures *f)
{
    if (f->unread) {
        fslog_warn("checkpoint '%s': %s/stage/%s/meta: which writes failed cannot be read back "
                   "(%s); it stays failed until 'ckpt commit'",
                   c->name, STAGE_HIDDEN_DIR, c->dir.sid, f->unread);
        return;
    }
    c->failures = f->v;
    c->n_failures = f->n;
    c->failures_lost = f->lost;
    f->v = NULL;
    /* A failed sync is made good by syncing again only while its bytes are
     * still buffered: the previous daemon's buffer went with it, so no sync
     * or rewrite here can tell which bytes are missing. */
    for (size_t i = 0; i < c->n_failures && !c->failures_lost; i++)
        if (c->failures[i].first == UINT64_MAX) {
            char path[4096];
            if (wtree_path(&c->tree, c->failures[i].node, path, sizeof path) < 0)
                snprintf(path, sizeof path, "?");
            c->failures_lost = 1;
            fslog_warn("checkpoint '%s': a sync of '%s' failed before the restart, and the "
                       "bytes it held went with that daemon; it stays failed until 'ckpt commit'",
                       c->name, path);
        }
}

/* Whether the pack of kind under rec's name is what rec's packing made
 * (its commit completed). In a store whose commit may take unanswered, a
 * pack there may be an earlier try's, of the checkpoint before it was
 * written to again: only the pack id of the try under way (written before
 * its pack could be made) says it is this packing's. Records from before
 * such ids were kept say nothing, and keep the old rule. */
static int packed_by_record(wtable *t, const stage_record *rec, int kind)
{
    if (!t->opts.store || (!rec->has_trying && !rec->n_tried))
        return 1;
    if (!rec->has_trying || (kind == WC_PACK_FILE) != (rec->is_file != 0))
        return 0;
    char pack[BACKING_PATH_MAX + 64];
    ckpt_pack_info info;
    ckpt_err err = {0};
    if (backing_pack_name(rec->name, rec->is_file, pack, sizeof pack) != 0)
        return 0; /* never: a valid name fits */
    if (ckpt_probe_in(t->store, pack, &info, &err) < 0) {
        fslog_warn("checkpoint '%s': %s", rec->name, err.msg);
        return 0;
    }
    return memcmp(info.pack_id, rec->trying, 16) == 0;
}

static int recover_one(void *ud, const char *sid)
{
    wtable *t = ud;
    stage_dir d;
    stage_record rec;
    ckpt_err err = {0};
    int rc = stage_open(&t->root, sid, &d, &rec, &err);
    if (rc == -ENOENT) {
        /* A checkpoint whose creation (or removal) a crash cut short. */
        if (stage_remove_sid(&t->root, sid, &err) == 0)
            fslog_info("removed unfinished staging %s", sid);
        return 0;
    }
    if (rc) {
        fslog_warn("%s; leaving it alone", err.msg);
        return 0;
    }
    if (!wtable_name_ok(rec.name) || wc_by_name(t, rec.name)) {
        fslog_warn("staging %s: name '%s' is %s; leaving it alone", sid, rec.name,
                   wtable_name_ok(rec.name) ? "taken by another staged checkpoint" : "not valid");
        goto skip;
    }
    int kind = wc_backing_kind(t, rec.name);
    if (kind == WC_NAMESPACE) {
        /* A namespace becoming this checkpoint when the crash came: its
         * directories are in the staged namespace already. */
        if (wc_remove_empty_namespace(t, rec.name) != 0) {
            fslog_warn("staging %s: a directory named '%s' is in the backing directory too; the "
                       "staged checkpoint is left alone (move the directory to reach it)",
                       sid, rec.name);
            goto skip;
        }
        kind = wc_backing_kind(t, rec.name);
    }
    if (kind && !rec.replaces && rec.state == STAGE_PACKING && !packed_by_record(t, &rec, kind)) {
        /* Packed again, its earlier try's pack replaced (packer_run): the
         * try under way is taken as tried, the restart hiding whether it
         * took. */
        fslog_warn("checkpoint '%s': the pack under its name is not the one its packing was "
                   "making (an earlier try's, or another writer's); its staged files stay and "
                   "it is packed again",
                   rec.name);
    } else if (kind && !rec.replaces) {
        if (rec.state == STAGE_PACKING) {
            /* Packed and renamed into place before the crash. */
            fsync(t->backing_fd);
            if (stage_remove(&t->root, &d, &err) == 0)
                fslog_info("checkpoint '%s': its pack was in place; commit completed", rec.name);
            else
                fslog_err("checkpoint '%s': %s", rec.name, err.msg);
        } else {
            fslog_warn("staging %s: a pack named '%s' exists too; the staged checkpoint is left "
                       "alone (remove or rename the pack to reach it)",
                       sid, rec.name);
        }
        goto skip;
    }
    /* Loaded, the try under way is over, taken as tried: its pack may
     * have taken unseen (no pack listed: a listing failing at mount), and
     * a later record must not go on saying "trying" it, or a crash then
     * takes that older pack for a newer commit. */
    stage_end_try(&d, 1);
    wckpt *c = wc_wckpt_new(t, rec.name);
    if (!c) {
        fslog_err("staging %s: out of memory", sid);
        goto skip;
    }
    c->dir = d;
    c->is_file = rec.is_file;
    c->unsealed = !rec.sealed && mount_key_get(t->root.key) != NULL;
    c->state = rec.state == STAGE_PACKING  ? WST_PACKING
               : rec.state == STAGE_FAILED ? WST_FAILED
                                           : WST_WRITING;
    if (rec.error)
        wc_set_error(c, rec.error);
    /* Until its failures are read back (restore_failures). */
    if (c->state == WST_FAILED)
        c->failures_lost = 1;
    uint64_t next = 1;
    stage_failures failures = {0};
    rc = stage_unlock(&t->root, &c->dir, &rec, &err);
    if (rc == 0)
        rc = stage_load_meta(&c->dir, &c->tree, &next, &failures, &err);
    if (rc == 0 && c->state == WST_FAILED)
        restore_failures(c, &failures);
    free(failures.v);
    if (rc == 0 && rec.has_base)
        rc = wc_open_base(t, rec.name, rec.is_file, &c->base, &err);
    if (rc == 0) {
        c->next_blob_id = next;
        remove_orphans(c);
        rc = open_blobs(c);
        if (rc)
            ckpt_fail(&err, rc, "its staged files cannot be opened");
    }
    if (rc) {
        /* Shown, but its contents cannot be reached: nothing is deleted. */
        c->locked = 1;
        wc_set_error(c, err.msg);
        wc_free_blobs(c);
        wtree_free(&c->tree);
        wtree_init(&c->tree, 0755, 0, 0);
        fslog_warn("%s (it stays %s; nothing is deleted)", err.msg, wstate_name(c->state));
    } else {
        fslog_info("checkpoint '%s' recovered: %s", c->name, wstate_name(c->state));
    }
    c->saved_gen = c->meta_gen;
    if (c->state == WST_PACKING)
        c->commit_seq = ++t->commit_seq;
    c->next = t->all;
    t->all = c;
    /* Its failures came back complete (a clean stop). On disk they are
     * marked incomplete again at once: a failure from now on may not
     * reach the disk before a crash. */
    if (rc == 0 && c->state == WST_FAILED && !c->failures_lost) {
        c->meta_gen++;
        ckpt_err save_err = {0};
        if (wc_save(c, &save_err) != 0) {
            fslog_warn("%s", save_err.msg);
            c->failures_lost = 1;
        }
    }
    stage_record_free(&rec);
    return 0;
skip:
    stage_record_free(&rec);
    stage_dir_close(&d);
    return 0;
}

int wtable_recover(wtable *t)
{
    /* Without the lock another daemon may own what is staged: cleaning
     * up "leftovers" would delete the data it is writing. */
    if (t->lock_fd < 0) {
        fslog_err("%s: staging is left alone: this daemon does not hold the writer lock",
                  t->backing_path);
        return -ENOLCK;
    }
    int removed = packer_remove_leftovers(t->backing_fd);
    if (removed > 0)
        fslog_info("removed %d unfinished pack(s) (.NAME.tpack.tmp) left by a crash", removed);
    ckpt_err err = {0};
    pthread_mutex_lock(&t->lock);
    int rc = stage_scan(&t->root, recover_one, t, &err);
    pthread_mutex_unlock(&t->lock);
    if (rc)
        fslog_err("%s", err.msg);
    return rc;
}
