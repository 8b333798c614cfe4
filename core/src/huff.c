/* One dynamic-Huffman deflate block of literals: code lengths from the
 * histogram (minimum-redundancy lengths, then limited to 15 bits), the
 * block header with its code-length code, the symbols, end of block. */
#include "huff.h"

#include <stdlib.h>
#include <string.h>

#define LIT_SYMS 257 /* literals 0..255 and end-of-block */
#define END_OF_BLOCK 256
#define MAX_BITS 15
#define CL_SYMS 19
#define CL_MAX_BITS 7

/* The order code-length code lengths are sent in (RFC 1951, 3.2.7). */
static const uint8_t cl_order[CL_SYMS] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                          11, 4,  12, 3, 13, 2, 14, 1, 15};

typedef struct item {
    uint32_t freq;
    uint16_t sym;
} item;

static int cmp_item(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->freq != y->freq)
        return x->freq < y->freq ? -1 : 1;
    return x->sym < y->sym ? -1 : x->sym > y->sym;
}

/* Minimum-redundancy code lengths in place (Moffat and Katajainen, "In-place
 * calculation of minimum-redundancy codes", 1995): a[0..n) holds the
 * frequencies in ascending order, n >= 2; on return a[i] is the length of
 * the code of the i-th, longest first. */
static void min_redundancy(uint32_t *a, int n)
{
    int root = 0, leaf = 2, next;
    a[0] += a[1];
    for (next = 1; next < n - 1; next++) {
        /* First child: the smaller of the next internal node and leaf. */
        if (leaf >= n || a[root] < a[leaf]) {
            a[next] = a[root];
            a[root++] = (uint32_t)next;
        } else {
            a[next] = a[leaf++];
        }
        /* Second child, the same way. */
        if (leaf >= n || (root < next && a[root] < a[leaf])) {
            a[next] += a[root];
            a[root++] = (uint32_t)next;
        } else {
            a[next] += a[leaf++];
        }
    }
    /* Internal nodes hold parent indices: turn them into depths. */
    a[n - 2] = 0;
    for (next = n - 3; next >= 0; next--)
        a[next] = a[a[next]] + 1;
    /* Leaf depths from the number of internal nodes at each depth. */
    int avail = 1, used = 0, depth = 0;
    root = n - 2;
    next = n - 1;
    while (avail > 0) {
        while (root >= 0 && (int)a[root] == depth) {
            used++;
            root--;
        }
        while (avail > used) {
            a[next--] = (uint32_t)depth;
            avail--;
        }
        avail = 2 * used;
        depth++;
        used = 0;
    }
}

/* Code lengths for freq[0..nsym), none over max_bits; unused symbols get 0.
 * The code is complete (Kraft sum 1) whenever two or more symbols occur. */
static void build_lengths(const uint32_t *freq, int nsym, int max_bits, uint8_t *len)
{
    item items[LIT_SYMS];
    uint32_t a[LIT_SYMS];
    int n = 0;
    memset(len, 0, (size_t)nsym);
    for (int s = 0; s < nsym; s++)
        if (freq[s])
            items[n++] = (item){freq[s], (uint16_t)s};
    if (n == 0)
        return;
    if (n == 1) {
        len[items[0].sym] = 1;
        return;
    }
    qsort(items, (size_t)n, sizeof *items, cmp_item);
    for (int i = 0; i < n; i++)
        a[i] = items[i].freq;
    min_redundancy(a, n);
    unsigned count[LIT_SYMS + 1] = {0};
    int longest = 0;
    for (int i = 0; i < n; i++) {
        count[a[i]]++;
        if ((int)a[i] > longest)
            longest = (int)a[i];
    }
    /* Too long: two leaves at the deepest level become one leaf a level up,
     * and a shallower leaf splits into two, which keeps the Kraft sum (the
     * adjustment of JPEG, ITU T.81 annex K.3). */
    for (int i = longest; i > max_bits; i--) {
        while (count[i] > 0) {
            int j = i - 2;
            while (count[j] == 0)
                j--;
            count[i] -= 2;
            count[i - 1]++;
            count[j + 1] += 2;
            count[j]--;
        }
    }
    /* The most frequent symbols take the shortest codes. */
    int idx = n - 1;
    for (int l = 1; l <= max_bits; l++)
        for (unsigned c = 0; c < count[l]; c++)
            len[items[idx--].sym] = (uint8_t)l;
}

/* Canonical codes for the lengths (RFC 1951, 3.2.2), bit-reversed because
 * deflate sends Huffman codes starting from their most significant bit. */
static void build_codes(const uint8_t *len, int nsym, uint16_t *code)
{
    unsigned count[MAX_BITS + 1] = {0}, next[MAX_BITS + 1] = {0};
    for (int s = 0; s < nsym; s++)
        count[len[s]]++;
    count[0] = 0;
    unsigned c = 0;
    for (int bits = 1; bits <= MAX_BITS; bits++) {
        c = (c + count[bits - 1]) << 1;
        next[bits] = c;
    }
    for (int s = 0; s < nsym; s++) {
        code[s] = 0;
        if (!len[s])
            continue;
        unsigned v = next[len[s]]++, r = 0;
        for (int b = 0; b < len[s]; b++)
            r |= ((v >> b) & 1u) << (len[s] - 1 - b);
        code[s] = (uint16_t)r;
    }
}

typedef struct bits {
    uint8_t *p;
    uint64_t buf;
    unsigned n;
} bits;

static inline void put(bits *w, uint32_t v, unsigned n)
{
    w->buf |= (uint64_t)v << w->n;
    w->n += n;
    if (w->n >= 32) {
        uint32_t word = (uint32_t)w->buf;
        w->p[0] = (uint8_t)word;
        w->p[1] = (uint8_t)(word >> 8);
        w->p[2] = (uint8_t)(word >> 16);
        w->p[3] = (uint8_t)(word >> 24);
        w->p += 4;
        w->buf >>= 32;
        w->n -= 32;
    }
}

static inline void store64(uint8_t *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, 8);
#else
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
#endif
}

/* The symbols, three per step and without branches: codes are at most 15
 * bits and at most 7 bits are pending, so three fit in the 64-bit buffer,
 * which is stored whole and advanced by the bytes it completed. Stops 8
 * bytes short of end (each store writes 8) and returns how far it got;
 * put() writes the rest. */
static size_t encode_fast(bits *w, const uint8_t *in, size_t n, const uint16_t *code,
                          const uint8_t *len, const uint8_t *end)
{
    uint32_t table[256];
    for (int s = 0; s < 256; s++)
        table[s] = code[s] | (uint32_t)len[s] << 16;
    uint8_t *p = w->p;
    uint64_t buf = w->buf;
    unsigned nb = w->n;
    while (nb >= 8) {
        *p++ = (uint8_t)buf;
        buf >>= 8;
        nb -= 8;
    }
    size_t i = 0;
    for (; i + 3 <= n && end - p >= 8; i += 3) {
        uint32_t e0 = table[in[i]], e1 = table[in[i + 1]], e2 = table[in[i + 2]];
        buf |= (uint64_t)(e0 & 0xffff) << nb;
        nb += e0 >> 16;
        buf |= (uint64_t)(e1 & 0xffff) << nb;
        nb += e1 >> 16;
        buf |= (uint64_t)(e2 & 0xffff) << nb;
        nb += e2 >> 16;
        store64(p, buf);
        p += nb >> 3;
        buf >>= nb & ~7u;
        nb &= 7;
    }
    w->p = p;
    w->buf = buf;
    w->n = nb;
    return i;
}

size_t huff_deflate(const uint8_t *in, size_t n, const uint32_t hist[256], uint8_t *out, size_t cap)
{
    uint32_t freq[LIT_SYMS];
    uint8_t len[LIT_SYMS + 1]; /* the 257 literal/length lengths, then the one distance length */
    uint16_t code[LIT_SYMS];
    memcpy(freq, hist, 256 * sizeof *freq);
    freq[END_OF_BLOCK] = 1;
    build_lengths(freq, LIT_SYMS, MAX_BITS, len);
    build_codes(len, LIT_SYMS, code);
    /* No distance codes: one of length zero (RFC 1951, 3.2.7). */
    len[LIT_SYMS] = 0;

    uint32_t cl_freq[CL_SYMS] = {0};
    uint8_t cl_len[CL_SYMS];
    uint16_t cl_code[CL_SYMS];
    for (int s = 0; s <= LIT_SYMS; s++)
        cl_freq[len[s]]++;
    build_lengths(cl_freq, CL_SYMS, CL_MAX_BITS, cl_len);
    build_codes(cl_len, CL_SYMS, cl_code);
    int ncl = CL_SYMS;
    while (ncl > 4 && cl_len[cl_order[ncl - 1]] == 0)
        ncl--;

    /* The exact size first: most planes that do not pay stop here. */
    uint64_t total = 3 + 5 + 5 + 4 + 3 * (uint64_t)ncl + len[END_OF_BLOCK];
    for (int s = 0; s <= LIT_SYMS; s++)
        total += cl_len[len[s]];
    for (int s = 0; s < 256; s++)
        total += (uint64_t)hist[s] * len[s];
    if ((total + 7) / 8 > cap)
        return 0;

    bits w = {out, 0, 0};
    put(&w, 1, 1);                 /* BFINAL */
    put(&w, 2, 2);                 /* BTYPE 10: dynamic Huffman */
    put(&w, LIT_SYMS - 257, 5);    /* HLIT */
    put(&w, 0, 5);                 /* HDIST: one distance code */
    put(&w, (uint32_t)ncl - 4, 4); /* HCLEN */
    for (int i = 0; i < ncl; i++)
        put(&w, cl_len[cl_order[i]], 3);
    for (int s = 0; s <= LIT_SYMS; s++)
        put(&w, cl_code[len[s]], cl_len[len[s]]);
    size_t i = encode_fast(&w, in, n, code, len, out + cap);
    for (; i < n; i++)
        put(&w, code[in[i]], len[in[i]]);
    put(&w, code[END_OF_BLOCK], len[END_OF_BLOCK]);
    /* The last partial word, padded with zero bits to a byte. */
    while (w.n > 0) {
        *w.p++ = (uint8_t)w.buf;
        w.buf >>= 8;
        w.n = w.n > 8 ? w.n - 8 : 0;
    }
    return (size_t)(w.p - out);
}
