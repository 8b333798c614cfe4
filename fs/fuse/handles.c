#include "handles.h"

#include <stdlib.h>

static void handle_untrack(ckptfs *fs, fs_handle *h)
{
    pthread_mutex_lock(&fs->handles_lock);
    h->prev->next = h->next;
    h->next->prev = h->prev;
    pthread_mutex_unlock(&fs->handles_lock);
}

static void handle_free(ckptfs *fs, fs_handle *h)
{
    if (h->is_root_listing)
        root_listing_free(&h->u.listing);
    else if (h->is_wlisting)
        wdirents_free(h->u.wlisting.entries, h->u.wlisting.n);
    else if (h->is_fwd)
        wtable_unref(&fs->wtable, h->u.fwd.ckpt);
    else
        checkpoint_unref(&fs->table, h->u.file.checkpoint);
    free(h);
}

void handle_track(ckptfs *fs, fs_handle *h)
{
    pthread_mutex_lock(&fs->handles_lock);
    h->next = fs->handles.next;
    h->prev = &fs->handles;
    fs->handles.next->prev = h;
    fs->handles.next = h;
    pthread_mutex_unlock(&fs->handles_lock);
}

void handle_drop(ckptfs *fs, fs_handle *h)
{
    handle_untrack(fs, h);
    handle_free(fs, h);
}

void handles_free_all(ckptfs *fs)
{
    while (fs->handles.next != &fs->handles)
        handle_drop(fs, fs->handles.next);
}

void handle_reply_open(fuse_req_t req, ckptfs *fs, fs_handle *h, struct fuse_file_info *fi)
{
    handle_track(fs, h);
    fi->fh = (uintptr_t)h;
    if (fuse_reply_open(req, fi) != 0)
        handle_drop(fs, h);
}
