/* ckptfs's own command-line options (-o key_file=... and friends). */
#ifndef CKPTFS_OPTIONS_H
#define CKPTFS_OPTIONS_H

#include <stdint.h>

#include "fuse_api.h"

#define CKPTFS_DEFAULT_CACHE (256ull << 20)
#define CKPTFS_MIN_CACHE (1ull << 20)
#define CKPTFS_MAX_THREADS 256u
#define CKPTFS_DEFAULT_COMMIT_DELAY 2.0
#define CKPTFS_MAX_COMMIT_DELAY 86400
#define CKPTFS_DEFAULT_LOG_MAX (4ull << 20)
/* A store's listing is answered from memory for this long (s3://). */
#define CKPTFS_DEFAULT_LIST_INTERVAL 5.0
#define CKPTFS_MAX_LIST_INTERVAL 3600

typedef struct fs_options {
    char *backing_dir; /* first positional argument */
    char *key_file;
    char *passphrase_file;
    char *cache_size_text;
    char *threads_text;
    char *commit_delay_text;
    char *log_file; /* absolute (made so at parsing); NULL: none */
    char *log_max_text;
    char *tensors_text;
    uint64_t log_max; /* rotation size of BACKING/.ckptfs/log */
    int hide_tensors; /* -o tensors=hide */
    uint64_t cache_bytes;
    double commit_delay; /* seconds; 0: only `ckpt commit` commits */
    int read_only;       /* -o ro: serve packs only */
    int finish_on_exit;  /* finish the pack under way before exiting */
    unsigned threads;
    int positional; /* positional arguments seen */
    /* A store URL (s3://BUCKET/PREFIX) as the backing: */
    char *endpoint, *region, *profile;
    char *cache_dir; /* absolute; NULL: no local cache of stored chunks */
    char *cache_dir_size_text;
    uint64_t cache_dir_bytes; /* 0: the store's default */
    char *list_interval_text;
    double list_interval;
    char *stage_dir; /* absolute; NULL: backing_default_stage_dir */
} fs_options;

/* Takes ckptfs's options out of args and leaves FUSE's (the mountpoint
 * included) for fuse_parse_cmdline. Returns 0, or -1 after printing why. */
int fs_options_parse(struct fuse_args *args, fs_options *o);
void fs_options_free(fs_options *o);

/* "4096", "64K", "256M", "2G" (binary units); 0 on success, -1 if malformed. */
int fs_parse_size(const char *text, uint64_t *out);

void fs_options_usage(const char *prog);

#endif
