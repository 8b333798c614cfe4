/* Fuzzes the torch.save format (formats/torch.c) end to end: sniff, then
 * describe over an ingest_source of the input. An accepted layout must keep
 * formats.h's promises (fz_check_torch_layout); a refusal is -EINVAL, says
 * why in one line and leaves the layout empty (fz_check_verdict). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "container_check.h"
#include "formats/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)ckpt_format_torch.sniff("fuzz.pt", data, size < 4096 ? size : 4096, size);
    fz_mem m = {data, size, SIZE_MAX};
    ingest_source src = {.read = fz_read, .ud = &m, .size = size, .name = "fuzz.pt"};
    ingest_layout l;
    char msg[512];
    int rc = ckpt_format_torch.describe(&src, "fuzz.pt", &l, msg, sizeof msg);
    if (rc < 0 && rc != -EINVAL)
        abort();
    fz_check_verdict(rc, msg, &l, "torch archive: ");
    if (rc < 0)
        return 0;
    if (rc == 0)
        fz_check_torch_layout(&l, size);
    ingest_layout_free(&l);
    return 0;
}
