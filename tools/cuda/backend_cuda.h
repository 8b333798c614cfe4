/* The copy backend on the CUDA runtime, plus device queries for the tool.
 * The only part of libckpt_cuda that includes CUDA headers. */
#ifndef CC_BACKEND_CUDA_H
#define CC_BACKEND_CUDA_H

#include <stddef.h>

#include "backend.h"

/* A backend on `device` (a cc_backend_open_fn; ud is unused). Fails with
 * -ENODEV and "no CUDA device (...)" or "device N does not exist (M
 * devices)" before touching anything. */
int cc_cuda_open(void *ud, int device, cc_backend **out, ckpt_err *err);
/* Number of devices (>= 1), or -ENODEV with the reason. */
int cc_cuda_device_count(ckpt_err *err);
/* One line about a device: name, memory, compute capability, PCI bus. */
int cc_cuda_device_line(int device, char *buf, size_t len, ckpt_err *err);

#endif
