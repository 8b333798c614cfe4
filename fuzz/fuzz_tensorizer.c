/* Fuzzes the tensorizer parser (core/src/formats/tensorizer.c) with the
 * input as a whole file; container_check.h says what is checked. Seeds:
 * real TensorSerializer files with their index compacted (fuzz/corpus/
 * tensorizer, from tests/unit/gen_tensorizer_fixtures.py OUT SMALLDIR). */
#include "container_check.h"
#include "formats/binary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_container(&ckpt_format_tensorizer, data, size, CKPT_MAX_NDIM, NULL, "tensorizer: ");
    return 0;
}
