/* Fuzzes the GGUF parser (core/src/formats/gguf.c) with the input as a
 * whole file; container_check.h says what is checked. Seeds: real
 * GGUFWriter files (fuzz/corpus/gguf, from tests/unit/gen_gguf_fixtures.py). */
#include "container_check.h"
#include "formats/binary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_container(&ckpt_format_gguf, data, size, 4, "GGML_", "gguf: ");
    return 0;
}
