/* The zip directory reader that torch.save archives need (see zip.h for what
 * is accepted). Order of work: find the end record in the last 64 KiB, take
 * the zip64 end record if a locator precedes it, read the central directory
 * whole, then check each entry's local header with one small read each. */
#include "formats/zip.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/fmt_util.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOCATOR64 0x07064b50u

#define EOCD_LEN 22u
#define EOCD64_LEN 56u
#define LOCATOR64_LEN 20u
#define CENTRAL_LEN 46u
#define LOCAL_LEN 30u
#define MAX_COMMENT 65535u

#define FLAG_ENCRYPTED 0x0001u
#define FLAG_DESCRIPTOR 0x0008u

static uint64_t le(const uint8_t *p, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int read_fail(int rc, char *msg, size_t msg_len, const char *what)
{
    fmt_msg(msg, msg_len, "cannot read the %s (%s)", what,
            rc == -EIO ? "file is short" : strerror(-rc));
    return rc == -EIO ? -EINVAL : rc;
}

/* Finds the end of central directory record: the last one whose comment
 * runs exactly to the end of the file. */
static int find_eocd(const ingest_source *src, uint8_t rec[EOCD_LEN], uint64_t *at, char *msg,
                     size_t msg_len)
{
    if (src->size < EOCD_LEN) {
        fmt_msg(msg, msg_len,
                "file is %llu bytes, too short for a zip end of central directory record",
                (unsigned long long)src->size);
        return -EINVAL;
    }
    uint64_t tail = src->size < EOCD_LEN + MAX_COMMENT ? src->size : EOCD_LEN + MAX_COMMENT;
    uint8_t *buf = malloc((size_t)tail);
    if (!buf) {
        fmt_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    uint64_t start = src->size - tail;
    int rc = fmt_read_exact(src, buf, (size_t)tail, start);
    if (rc) {
        free(buf);
        return read_fail(rc, msg, msg_len, "end of the archive");
    }
    for (size_t i = (size_t)(tail - EOCD_LEN) + 1; i-- > 0;) {
        if (le(buf + i, 4) == SIG_EOCD && i + EOCD_LEN + le(buf + i + 20, 2) == tail) {
            memcpy(rec, buf + i, EOCD_LEN);
            *at = start + i;
            free(buf);
            return 0;
        }
    }
    free(buf);
    fmt_msg(msg, msg_len, "no zip end of central directory record at the end of the file");
    return -EINVAL;
}

/* Fills the directory's place and entry count from the end records. */
static int read_end(const ingest_source *src, zip_archive *z, uint64_t *n_entries,
                    uint64_t *cd_limit, char *msg, size_t msg_len)
{
    uint8_t eocd[EOCD_LEN] = {0};
    uint64_t eocd_at = 0;
    int rc = find_eocd(src, eocd, &eocd_at, msg, msg_len);
    if (rc)
        return rc;
    uint64_t disk = le(eocd + 4, 2), cd_disk = le(eocd + 6, 2);
    uint64_t n_here = le(eocd + 8, 2), n_all = le(eocd + 10, 2);
    z->cd_size = le(eocd + 12, 4);
    z->cd_offset = le(eocd + 16, 4);
    *cd_limit = eocd_at;

    uint8_t loc[LOCATOR64_LEN];
    bool have_loc = false;
    if (eocd_at >= LOCATOR64_LEN) {
        rc = fmt_read_exact(src, loc, sizeof loc, eocd_at - LOCATOR64_LEN);
        if (rc)
            return read_fail(rc, msg, msg_len, "zip64 locator");
        have_loc = le(loc, 4) == SIG_LOCATOR64;
    }
    bool saturated = n_here == 0xFFFF || n_all == 0xFFFF || z->cd_size == 0xFFFFFFFFu ||
                     z->cd_offset == 0xFFFFFFFFu || disk == 0xFFFF || cd_disk == 0xFFFF;
    if (saturated && !have_loc) {
        fmt_msg(msg, msg_len,
                "end of central directory needs zip64 values but has no zip64 "
                "locator");
        return -EINVAL;
    }
    if (have_loc) {
        uint64_t rec_disk = le(loc + 4, 4), rec_at = le(loc + 8, 8), disks = le(loc + 16, 4);
        uint64_t loc_at = eocd_at - LOCATOR64_LEN;
        if (rec_disk != 0 || disks > 1) {
            fmt_msg(msg, msg_len,
                    "zip64 locator names %llu disks: multi-disk archives are not "
                    "supported",
                    (unsigned long long)disks);
            return -EINVAL;
        }
        if (rec_at > loc_at || loc_at - rec_at < EOCD64_LEN) {
            fmt_msg(msg, msg_len, "zip64 locator points at %llu, not before the locator at %llu",
                    (unsigned long long)rec_at, (unsigned long long)loc_at);
            return -EINVAL;
        }
        uint8_t r[EOCD64_LEN];
        rc = fmt_read_exact(src, r, sizeof r, rec_at);
        if (rc)
            return read_fail(rc, msg, msg_len, "zip64 end of central directory");
        if (le(r, 4) != SIG_EOCD64) {
            fmt_msg(msg, msg_len, "no zip64 end of central directory record at %llu",
                    (unsigned long long)rec_at);
            return -EINVAL;
        }
        disk = le(r + 16, 4);
        cd_disk = le(r + 20, 4);
        n_here = le(r + 24, 8);
        n_all = le(r + 32, 8);
        z->cd_size = le(r + 40, 8);
        z->cd_offset = le(r + 48, 8);
        z->zip64 = true;
        *cd_limit = rec_at;
    }
    if (disk != 0 || cd_disk != 0 || n_here != n_all) {
        fmt_msg(msg, msg_len, "archive spans several disks, which is not supported");
        return -EINVAL;
    }
    if (n_all > ZIP_MAX_ENTRIES) {
        fmt_msg(msg, msg_len, "archive claims %llu entries, more than the %u allowed",
                (unsigned long long)n_all, ZIP_MAX_ENTRIES);
        return -EINVAL;
    }
    if (z->cd_offset > *cd_limit || z->cd_size > *cd_limit - z->cd_offset) {
        fmt_msg(msg, msg_len, "central directory [%llu, +%llu) runs past its end record at %llu",
                (unsigned long long)z->cd_offset, (unsigned long long)z->cd_size,
                (unsigned long long)*cd_limit);
        return -EINVAL;
    }
    if (z->cd_size > ZIP_MAX_CD_BYTES) {
        fmt_msg(msg, msg_len, "central directory is %llu bytes, more than the %u allowed",
                (unsigned long long)z->cd_size, ZIP_MAX_CD_BYTES);
        return -EINVAL;
    }
    if (n_all > z->cd_size / CENTRAL_LEN) {
        fmt_msg(msg, msg_len,
                "archive claims %llu entries but its central directory holds only %llu bytes",
                (unsigned long long)n_all, (unsigned long long)z->cd_size);
        return -EINVAL;
    }
    *n_entries = n_all;
    return 0;
}

/* Takes the zip64 values (extra field 0x0001) for the saturated fields, in
 * the order the format fixes: size, compressed size, header offset. */
static int zip64_extra(const uint8_t *x, size_t xlen, zip_entry *e, bool want_size, bool want_comp,
                       bool want_off, const char *qname, char *msg, size_t msg_len)
{
    if (!want_size && !want_comp && !want_off)
        return 0;
    size_t i = 0;
    while (i + 4 <= xlen) {
        unsigned id = (unsigned)le(x + i, 2);
        size_t len = (size_t)le(x + i + 2, 2);
        if (len > xlen - i - 4)
            break;
        if (id == 0x0001) {
            const uint8_t *p = x + i + 4;
            size_t need = 8u * ((size_t)want_size + (size_t)want_comp + (size_t)want_off);
            if (len < need)
                break;
            if (want_size) {
                e->size = le(p, 8);
                p += 8;
            }
            if (want_comp) {
                e->comp_size = le(p, 8);
                p += 8;
            }
            if (want_off)
                e->header_offset = le(p, 8);
            return 0;
        }
        i += 4 + len;
    }
    fmt_msg(msg, msg_len, "entry '%s' lacks the zip64 values its central entry needs", qname);
    return -EINVAL;
}

/* Parses the central entry at *pos of the directory into e. */
static int parse_central(const uint8_t *cd, size_t cd_len, size_t *pos, size_t idx, zip_entry *e,
                         char *msg, size_t msg_len)
{
    const uint8_t *c = cd + *pos;
    if (cd_len - *pos < CENTRAL_LEN || le(c, 4) != SIG_CENTRAL) {
        fmt_msg(msg, msg_len, "central directory entry %zu is missing or has a bad signature", idx);
        return -EINVAL;
    }
    e->flags = (uint16_t)le(c + 8, 2);
    e->method = (uint16_t)le(c + 10, 2);
    e->crc32 = (uint32_t)le(c + 16, 4);
    e->comp_size = le(c + 20, 4);
    e->size = le(c + 24, 4);
    size_t nlen = (size_t)le(c + 28, 2), xlen = (size_t)le(c + 30, 2), clen = (size_t)le(c + 32, 2);
    uint64_t disk = le(c + 34, 2);
    e->header_offset = le(c + 42, 4);
    if (CENTRAL_LEN + nlen + xlen + clen > cd_len - *pos) {
        fmt_msg(msg, msg_len, "central directory entry %zu runs past the directory", idx);
        return -EINVAL;
    }
    const char *name = (const char *)c + CENTRAL_LEN;
    char q[FMT_QUOTE_BUF];
    fmt_quote_n(q, sizeof q, name, nlen);
    if (nlen == 0 || nlen > ZIP_MAX_NAME || memchr(name, '\0', nlen)) {
        fmt_msg(msg, msg_len, "central directory entry %zu has a bad name '%s' (%zu bytes)", idx, q,
                nlen);
        return -EINVAL;
    }
    if (disk != 0 && disk != 0xFFFF) {
        fmt_msg(msg, msg_len,
                "entry '%s' lies on disk %llu: multi-disk archives are not "
                "supported",
                q, (unsigned long long)disk);
        return -EINVAL;
    }
    int rc =
        zip64_extra(c + CENTRAL_LEN + nlen, xlen, e, e->size == 0xFFFFFFFFu,
                    e->comp_size == 0xFFFFFFFFu, e->header_offset == 0xFFFFFFFFu, q, msg, msg_len);
    if (rc)
        return rc;
    e->name = malloc(nlen + 1);
    if (!e->name) {
        fmt_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    memcpy(e->name, name, nlen);
    e->name[nlen] = '\0';
    *pos += CENTRAL_LEN + nlen + xlen + clen;
    return 0;
}

/* Checks the entry's local header against its central entry and sets its
 * data offset; everything must lie before the central directory. */
static int check_local(const ingest_source *src, const zip_archive *z, zip_entry *e, uint8_t *buf,
                       char *msg, size_t msg_len)
{
    char q[FMT_QUOTE_BUF];
    fmt_quote(q, sizeof q, e->name);
    size_t nlen = strlen(e->name);
    uint64_t limit = z->cd_offset;
    if (e->header_offset > limit || limit - e->header_offset < LOCAL_LEN + nlen) {
        fmt_msg(msg, msg_len,
                "entry '%s': local header at %llu lies outside the entries' area [0, %llu)", q,
                (unsigned long long)e->header_offset, (unsigned long long)limit);
        return -EINVAL;
    }
    int rc = fmt_read_exact(src, buf, LOCAL_LEN + nlen, e->header_offset);
    if (rc)
        return read_fail(rc, msg, msg_len, "local header");
    if (le(buf, 4) != SIG_LOCAL) {
        fmt_msg(msg, msg_len, "entry '%s': no local header at %llu", q,
                (unsigned long long)e->header_offset);
        return -EINVAL;
    }
    if (le(buf + 26, 2) != nlen || memcmp(buf + LOCAL_LEN, e->name, nlen) != 0) {
        fmt_msg(msg, msg_len, "entry '%s': local header at %llu names another entry", q,
                (unsigned long long)e->header_offset);
        return -EINVAL;
    }
    if (le(buf + 8, 2) != e->method) {
        fmt_msg(msg, msg_len, "entry '%s': local header says method %u, the central directory %u",
                q, (unsigned)le(buf + 8, 2), (unsigned)e->method);
        return -EINVAL;
    }
    if (!(e->flags & FLAG_DESCRIPTOR)) {
        uint64_t lcomp = le(buf + 18, 4), lsize = le(buf + 22, 4);
        if (le(buf + 14, 4) != e->crc32 || (lcomp != 0xFFFFFFFFu && lcomp != e->comp_size) ||
            (lsize != 0xFFFFFFFFu && lsize != e->size)) {
            fmt_msg(msg, msg_len,
                    "entry '%s': local header's CRC or sizes differ from the central directory", q);
            return -EINVAL;
        }
    }
    uint64_t xlen = le(buf + 28, 2);
    e->data_offset = e->header_offset + LOCAL_LEN + nlen + xlen;
    if (e->data_offset > limit || e->comp_size > limit - e->data_offset) {
        fmt_msg(msg, msg_len,
                "entry '%s': data [%llu, +%llu) runs past the entries' area, which ends at "
                "%llu",
                q, (unsigned long long)e->data_offset, (unsigned long long)e->comp_size,
                (unsigned long long)limit);
        return -EINVAL;
    }
    if (e->method == ZIP_METHOD_STORED && !(e->flags & FLAG_ENCRYPTED) && e->comp_size != e->size) {
        fmt_msg(msg, msg_len, "entry '%s' is stored but its sizes differ (%llu and %llu)", q,
                (unsigned long long)e->comp_size, (unsigned long long)e->size);
        return -EINVAL;
    }
    return 0;
}

/* qsort has no context argument: the entries being sorted are passed here.
 * zip_open is called from several threads, so this is thread-local. */
static _Thread_local const zip_entry *sort_entries;

static int by_offset(const void *a, const void *b)
{
    const zip_entry *x = &sort_entries[*(const size_t *)a], *y = &sort_entries[*(const size_t *)b];
    return x->header_offset < y->header_offset ? -1 : x->header_offset > y->header_offset;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(sort_entries[*(const size_t *)a].name, sort_entries[*(const size_t *)b].name);
}

static int check_layout(zip_archive *z, char *msg, size_t msg_len)
{
    size_t *ix = malloc((z->n ? z->n : 1) * sizeof *ix);
    if (!ix) {
        fmt_msg(msg, msg_len, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < z->n; i++)
        ix[i] = i;
    sort_entries = z->e;
    qsort(ix, z->n, sizeof *ix, by_offset);
    for (size_t i = 1; i < z->n; i++) {
        const zip_entry *p = &z->e[ix[i - 1]], *c = &z->e[ix[i]];
        if (c->header_offset < p->data_offset + p->comp_size) {
            char qp[FMT_QUOTE_BUF], qc[FMT_QUOTE_BUF];
            fmt_quote(qp, sizeof qp, p->name);
            fmt_quote(qc, sizeof qc, c->name);
            fmt_msg(msg, msg_len, "entry '%s' at %llu overlaps entry '%s', whose data ends at %llu",
                    qc, (unsigned long long)c->header_offset, qp,
                    (unsigned long long)(p->data_offset + p->comp_size));
            free(ix);
            return -EINVAL;
        }
    }
    qsort(ix, z->n, sizeof *ix, by_name);
    for (size_t i = 1; i < z->n; i++) {
        if (strcmp(z->e[ix[i - 1]].name, z->e[ix[i]].name) == 0) {
            char q[FMT_QUOTE_BUF];
            fmt_quote(q, sizeof q, z->e[ix[i]].name);
            fmt_msg(msg, msg_len, "two entries are named '%s'", q);
            free(ix);
            return -EINVAL;
        }
    }
    sort_entries = NULL;
    z->by_name = ix;
    return 0;
}

int zip_open(const ingest_source *src, zip_archive *z, char *msg, size_t msg_len)
{
    memset(z, 0, sizeof *z);
    fmt_msg(msg, msg_len, "%s", "");
    uint64_t n_entries = 0, cd_limit = 0;
    int rc = read_end(src, z, &n_entries, &cd_limit, msg, msg_len);
    if (rc)
        return rc;
    uint8_t *cd = malloc(z->cd_size ? (size_t)z->cd_size : 1);
    uint8_t *lbuf = malloc(LOCAL_LEN + ZIP_MAX_NAME);
    z->e = calloc(n_entries ? (size_t)n_entries : 1, sizeof *z->e);
    if (!cd || !lbuf || !z->e) {
        fmt_msg(msg, msg_len, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    rc = fmt_read_exact(src, cd, (size_t)z->cd_size, z->cd_offset);
    if (rc) {
        rc = read_fail(rc, msg, msg_len, "central directory");
        goto out;
    }
    size_t pos = 0;
    for (size_t i = 0; i < n_entries; i++) {
        rc = parse_central(cd, (size_t)z->cd_size, &pos, i, &z->e[i], msg, msg_len);
        if (rc)
            goto out;
        z->n = i + 1;
        rc = check_local(src, z, &z->e[i], lbuf, msg, msg_len);
        if (rc)
            goto out;
    }
    if (pos != z->cd_size) {
        fmt_msg(msg, msg_len, "central directory holds %llu bytes after its %llu entries",
                (unsigned long long)(z->cd_size - pos), (unsigned long long)n_entries);
        rc = -EINVAL;
        goto out;
    }
    rc = check_layout(z, msg, msg_len);
out:
    free(cd);
    free(lbuf);
    if (rc)
        zip_close(z);
    return rc;
}

const zip_entry *zip_find(const zip_archive *z, const char *name)
{
    size_t lo = 0, hi = z->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(z->e[z->by_name[mid]].name, name);
        if (c == 0)
            return &z->e[z->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

bool zip_entry_is_raw(const zip_entry *e)
{
    return e->method == ZIP_METHOD_STORED && !(e->flags & FLAG_ENCRYPTED) &&
           e->comp_size == e->size;
}

void zip_close(zip_archive *z)
{
    if (!z)
        return;
    for (size_t i = 0; i < z->n; i++)
        free(z->e[i].name);
    free(z->e);
    free(z->by_name);
    memset(z, 0, sizeof *z);
}
