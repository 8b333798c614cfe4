/* Small helpers shared by libckpt_cuda's translation units. */
#ifndef CC_UTIL_H
#define CC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define CC_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Fills err (if any) and returns code, so callers can `return cc_fail(...)`. */
int cc_fail(ckpt_err *err, int code, const char *fmt, ...) CC_PRINTF(3, 4);
/* Copies an error into err (if any); returns its code. */
int cc_fail_copy(ckpt_err *err, const ckpt_err *from);

/* "1.4 GB", "512 B": decimal units like the ckpt tool prints. */
void cc_fmt_bytes(uint64_t n, char out[32]);
/* Monotonic seconds. */
double cc_now(void);
/* Online CPUs, at least 1. */
unsigned cc_cpu_count(void);
/* Writes all of buf, retrying short writes and EINTR; 0 or -errno. */
int cc_write_all(int fd, const void *buf, size_t len);
/* Reads exactly len bytes at off; 0, -EIO for a short file, or -errno. */
int cc_pread_all(int fd, void *buf, size_t len, uint64_t off);

#endif
