/* Feeds arbitrary bytes to the pack reader as a file, then reads and
 * verifies whatever it accepts: nothing may crash, hang or leak. */
#include "ckpt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.tpack", 0);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ckpt_pack *p;
    ckpt_err e;
    if (ckpt_open(path, NULL, &p, &e) == 0) {
        uint8_t buf[4096];
        for (size_t i = 0; i < ckpt_file_count(p); i++) {
            const ckpt_file_info *f = ckpt_file_at(p, i);
            for (uint64_t off = 0; off < f->size && off < (1u << 22); off += sizeof buf)
                if (ckpt_file_pread(p, i, buf, sizeof buf, off, &e) < 0)
                    break;
        }
        for (size_t i = 0; i < ckpt_tensor_count(p); i++)
            ckpt_tensor_pread(p, i, buf, sizeof buf, 0, &e);
        ckpt_verify(p, 1, NULL, NULL, NULL, NULL, &e);
        ckpt_close(p);
    }
    close(fd);
    return 0;
}
