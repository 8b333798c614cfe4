/* Fuzzes the bounded reader every binary parser stands on
 * (core/src/formats/binread.c). The input is a little program and a file:
 * byte 0 is the source's largest read (so the read window refills at every
 * boundary), bytes 1..32 are operations (u8, u16, u32, u64, bytes, skip,
 * seek), the rest is the file. Each operation is checked against the same
 * operation done directly on the file in memory: the same verdict, the
 * same value, the same position; the first failure sticks (err). Then
 * binread_quote must give one printable line within its buffer. */
#include "container_check.h" /* fz_mem, fz_read */
#include "formats/binread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OPS 32

static uint64_t le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 + OPS)
        return 0;
    fz_mem m = {data + 1 + OPS, size - 1 - OPS, data[0] ? data[0] : 1};
    ingest_source src = {.read = fz_read, .ud = &m, .size = m.n, .name = "fuzz"};
    binread r;
    binread_init(&r, &src, 0);
    uint64_t pos = 0; /* the model */
    int failed = 0;
    static uint8_t buf[1 << 16];
    for (size_t i = 0; i < OPS && !failed; i++) {
        uint8_t op = data[1 + i];
        size_t width = 0, n = (size_t)(op >> 3) * 97;
        bool ok;
        uint64_t got = 0, want_pos = pos;
        switch (op & 7) {
        case 0: {
            uint8_t v;
            ok = binread_u8(&r, &v);
            got = v;
            width = 1;
            break;
        }
        case 1: {
            uint16_t v;
            ok = binread_u16(&r, &v);
            got = v;
            width = 2;
            break;
        }
        case 2: {
            uint32_t v;
            ok = binread_u32(&r, &v);
            got = v;
            width = 4;
            break;
        }
        case 3: {
            uint64_t v;
            ok = binread_u64(&r, &v);
            got = v;
            width = 8;
            break;
        }
        case 4:
            ok = binread_bytes(&r, buf, n);
            if ((pos + n <= m.n) != ok || (ok && n && memcmp(buf, m.p + pos, n) != 0))
                abort();
            want_pos = ok ? pos + n : pos;
            break;
        case 5:
            ok = binread_skip(&r, n);
            if ((pos + n <= m.n) != ok)
                abort();
            want_pos = ok ? pos + n : pos;
            break;
        default:
            ok = binread_seek(&r, n);
            if ((n <= m.n) != ok)
                abort();
            want_pos = ok ? n : pos;
            break;
        }
        if (width) {
            if ((pos + width <= m.n) != ok || (ok && got != le(m.p + pos, width)))
                abort();
            want_pos = ok ? pos + width : pos;
        }
        if (!ok) {
            if (r.err != -EINVAL)
                abort();
            failed = 1;
            break;
        }
        pos = want_pos;
        if (r.pos != pos || binread_left(&r) != m.n - pos)
            abort();
    }
    char q[BINREAD_QUOTE_BUF];
    binread_quote(q, sizeof q, (const char *)m.p, m.n < 512 ? m.n : 512);
    size_t ql = strnlen(q, sizeof q);
    if (ql == sizeof q)
        abort();
    for (size_t i = 0; i < ql; i++)
        if ((unsigned char)q[i] < 0x20 || q[i] == 0x7f)
            abort();
    return 0;
}
