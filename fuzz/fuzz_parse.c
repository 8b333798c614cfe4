/* Fuzzes the parsers' shared helpers (core/src/formats/parse.c) with
 * hostile bytes: ingest_describe_head's read-more loop (a toy parser asks
 * for the number of bytes its head names, as safetensors' length prefix
 * does, and must be refused past the file, past the limit or after too many
 * rounds, never read out of bounds), ingest_msg and ingest_quote_name
 * (one printable line within the buffer, whatever the name), and
 * ingest_shape_text (never past its buffer). */
#include "container_check.h" /* fz_mem, fz_read */
#include "formats/parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The head's first 8 bytes say how long the head is: more is asked for
 * until the parser has it all; the last head byte must then be readable. */
static int toy_parse(const uint8_t *head, size_t head_len, uint64_t file_size,
                     const char *tensor_name, ingest_layout *out, uint64_t *need, char *msg,
                     size_t msg_len)
{
    (void)tensor_name;
    (void)out;
    if (head_len < 8) {
        ingest_msg(msg, msg_len, "toy: %zu bytes", head_len);
        return 1;
    }
    uint64_t want = 0;
    memcpy(&want, head, 8);
    if (want > head_len) {
        *need = want;
        return -EAGAIN;
    }
    if (head_len > file_size)
        abort();
    volatile uint8_t last = head[head_len - 1];
    (void)last;
    return 0;
}

static void check_line(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        abort();
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_mem m = {data, size, SIZE_MAX};
    ingest_source src = {.read = fz_read, .ud = &m, .size = size, .name = "fuzz"};
    ingest_layout out;
    char msg[256];
    int rc =
        ingest_describe_head(&src, toy_parse, NULL, 1u << 20, "toy file", &out, msg, sizeof msg);
    if (rc != 0 && rc != 1 && rc != -EINVAL)
        abort();
    if (rc != 0)
        check_line(msg, sizeof msg);

    char *name = malloc(size + 1);
    if (!name)
        return 0;
    memcpy(name, data, size);
    name[size] = '\0';
    char quoted[QUOTED_NAME_BUF];
    ingest_quote_name(quoted, sizeof quoted, name);
    check_line(quoted, sizeof quoted);
    ingest_msg(msg, sizeof msg, "bad '%s'", name);
    check_line(msg, sizeof msg);
    free(name);

    uint64_t shape[CKPT_MAX_NDIM];
    uint32_t ndim = (uint32_t)(size / 8 < CKPT_MAX_NDIM ? size / 8 : CKPT_MAX_NDIM);
    memcpy(shape, data, ndim * 8);
    char text[64];
    ingest_shape_text(text, sizeof text, shape, ndim);
    if (strnlen(text, sizeof text) == sizeof text)
        abort();
    return 0;
}
