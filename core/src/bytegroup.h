/* The byte-group transposes of BYTEGROUP chunks (FORMAT.md section 3): an
 * array of n / k elements of k bytes, and its k planes of byte j of every
 * element. Both run on every byte packed or read. */
#ifndef CKPT_BYTEGROUP_H
#define CKPT_BYTEGROUP_H

#include <stddef.h>
#include <stdint.h>

/* raw[0..n) (n a multiple of k) into planes[0..n): plane j, of n / k
 * bytes, at planes + j * (n / k); with the fastest kernel this CPU runs. */
void bytegroup_split(const uint8_t *raw, size_t n, unsigned k, uint8_t *planes);

/* The k planes pl[0..k) of m bytes each into out[0..m * k), with the
 * fastest kernel this CPU runs. */
void bytegroup_join(const uint8_t *const *pl, size_t m, unsigned k, uint8_t *out);

/* For tests, which must reach every kernel whatever the CPU picks:
 * bytegroup_join and bytegroup_split with one kernel. Return -1, writing
 * nothing, when this build or CPU lacks it. */
typedef enum { BYTEGROUP_SCALAR, BYTEGROUP_SSE2, BYTEGROUP_AVX2 } bytegroup_kernel;
int bytegroup_join_with(bytegroup_kernel kern, const uint8_t *const *pl, size_t m, unsigned k,
                        uint8_t *out);
int bytegroup_split_with(bytegroup_kernel kern, const uint8_t *raw, size_t n, unsigned k,
                         uint8_t *planes);

#endif
