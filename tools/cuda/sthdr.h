/* The safetensors header for a list of tensors written back to back in the
 * order given: 8-byte little-endian length, then JSON padded with spaces to
 * a multiple of 8 bytes (so the data that follows stays 8-byte aligned). */
#ifndef CC_STHDR_H
#define CC_STHDR_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_cuda.h"

/* The reference implementation's limit on the JSON part. */
#define CC_ST_MAX_HEADER 100000000ull

/* Checks the tensors (non-empty unique UTF-8 names, known dtypes, sizes that
 * fit, device pointers where there are bytes) and builds the header.
 * lens[i] gets tensor i's size; *out (malloc'd) the 8 + JSON bytes. */
int cc_st_header(const ckpt_cuda_save_tensor *t, size_t n, uint64_t *lens, uint8_t **out,
                 size_t *out_len, ckpt_err *err);

#endif
