/* Packs written by the last version-1 and version-2 writers stay readable:
 * the fixtures in tests/unit/fixtures/ (made by make_v1.py / make_v2.py and
 * the `ckpt pack` of that version, see there) open, verify and read back
 * byte-identical, through every read path a client uses (file pread, tensor
 * pread, streaming). Version 2 adds raw/noise.f32, opaque chunks grouped by
 * 4 with deflated planes (plane method 1, which version 3 no longer writes). */
#include "testutil.h"
#include "ckpt.h"

/* Tests run from the repository root (make unit); CKPT_FIXTURES overrides. */
static char *fixture(const char *name)
{
    const char *d = getenv("CKPT_FIXTURES");
    return tu_join(d && *d ? d : "tests/unit/fixtures", name);
}

typedef struct want {
    const char *name, *sha256;
    uint64_t size, offset; /* offset: where a tensor starts in its file */
    const char *file;      /* tensors: the file that holds it */
} want;

static const want files[] = {
    {"emb.npy", "dca330bdb5a0f1c82cee14a974778f251df7ec0b6cca14c5c67831a1df0237ec", 8128, 0, NULL},
    {"model.safetensors", "67ac2751fb8dec4af1fe1523715139eb07b44fe857bda3797d32ab4f3ca20b99", 17120,
     0, NULL},
    {"notes/empty", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 0, 0, NULL},
    {"notes/log.txt", "77b22f1db260f79844ee580bc4fb83feaf28de5bc079fb23e423c7b2b2126019", 73351, 0,
     NULL},
    /* version 2 only */
    {"raw/noise.f32", "0b53399fb52ba26a53a3e987e8eb753d07f5e243060168fe959196b7bd3649d4", 98304, 0,
     NULL},
};
static const want tensors[] = {
    {"emb", "8069575cb5d0f2f64475712c6b7f73205cb88bdb74b73f7ccfa09af848cccb07", 8000, 128,
     "emb.npy"},
    {"a.weight", "d0f130a53cf28bf23ffae3033cd991a12427ce29715ea11213ebb698dcbd78e4", 16384,
     17120 - 16384 - 512 - 8, "model.safetensors"},
    {"a.bias", "380adc6bf0586c954d735959f3beb62bac02b50ca03a839385fd7f3080544887", 512,
     17120 - 512 - 8, "model.safetensors"},
    {"step", "1af2444c165b8d6156651aa4f8dc49e6302f690473e80304fdfdb73baa9140c7", 8, 17120 - 8,
     "model.safetensors"},
};

static void hex_of(const uint8_t *d, char out[65])
{
    ckpt_hex32(d, out);
}

static void check_sha(const uint8_t *buf, size_t len, const char *want_hex, const char *what)
{
    uint8_t d[32];
    char hex[65];
    tu_sha256(buf, len, d);
    hex_of(d, hex);
    cr_assert_str_eq(hex, want_hex, "%s: sha256 %s, want %s", what, hex, want_hex);
}

static int sink_copy(void *ud, uint64_t off, const void *data, size_t len, const ckpt_err *cerr)
{
    cr_assert_null(cerr, "stream fault: %s", cerr ? cerr->msg : "");
    memcpy((uint8_t *)ud + off, data, len);
    return 0;
}

static void check_pack(const char *name, unsigned version, int encrypted)
{
    char *path = fixture(name);
    ckpt_key *key = NULL;
    ckpt_err e;
    if (encrypted) {
        uint8_t k[CKPT_KEY_BYTES];
        for (unsigned i = 0; i < sizeof k; i++)
            k[i] = (uint8_t)i;
        cr_assert_eq(ckpt_key_from_bytes(k, &key, &e), 0, "%s", e.msg);
    }
    ckpt_pack *p;
    cr_assert_eq(ckpt_open(path, key, &p, &e), 0, "%s", e.msg);
    ckpt_pack_info in;
    ckpt_info(p, &in);
    cr_assert_eq(in.format_version, version);
    cr_assert_str_eq(in.cipher, encrypted ? "xchacha20poly1305" : "none");
    size_t n_files = version == 1 ? 4 : 5;
    cr_assert_eq(in.n_files, n_files);
    cr_assert_eq(in.n_tensors, 4);
    cr_assert_eq(ckpt_verify(p, 2, NULL, NULL, NULL, NULL, &e), 0, "%s", e.msg);

    for (size_t i = 0; i < n_files; i++) {
        long fi = ckpt_file_find(p, files[i].name);
        cr_assert_geq(fi, 0, "%s: no file %s", name, files[i].name);
        const ckpt_file_info *f = ckpt_file_at(p, (size_t)fi);
        cr_assert_eq(f->size, files[i].size);
        uint8_t *buf = malloc(f->size + 1);
        cr_assert_eq(ckpt_file_pread(p, (size_t)fi, buf, f->size + 1, 0, &e), (ssize_t)f->size,
                     "%s", e.msg);
        check_sha(buf, f->size, files[i].sha256, files[i].name);
        memset(buf, 0, f->size);
        cr_assert_eq(ckpt_file_stream(p, (size_t)fi, 0, f->size, 2, sink_copy, buf, &e), 0, "%s",
                     e.msg);
        check_sha(buf, f->size, files[i].sha256, files[i].name);
        char hex[65];
        hex_of(f->sha256, hex);
        cr_assert_str_eq(hex, files[i].sha256);
        free(buf);
    }
    for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) {
        long ti = ckpt_tensor_find(p, tensors[i].name);
        cr_assert_geq(ti, 0, "%s: no tensor %s", name, tensors[i].name);
        const ckpt_tensor_info *t = ckpt_tensor_at(p, (size_t)ti);
        cr_assert_eq(t->nbytes, tensors[i].size);
        cr_assert_eq(t->file_offset, tensors[i].offset, "%s: offset %llu", tensors[i].name,
                     (unsigned long long)t->file_offset);
        cr_assert_str_eq(ckpt_file_at(p, t->file_index)->path, tensors[i].file);
        uint8_t *buf = malloc(t->nbytes);
        cr_assert_eq(ckpt_tensor_pread(p, (size_t)ti, buf, t->nbytes, 0, &e), (ssize_t)t->nbytes,
                     "%s", e.msg);
        check_sha(buf, t->nbytes, tensors[i].sha256, tensors[i].name);
        free(buf);
    }
    ckpt_close(p);
    ckpt_key_free(key);
    free(path);
}

Test(v1_fixture, plain_pack_reads_back)
{
    check_pack("v1-plain.tpack", 1, 0);
}
Test(v1_fixture, encrypted_pack_reads_back)
{
    check_pack("v1-xchacha.tpack", 1, 1);
}
Test(v2_fixture, plain_pack_reads_back)
{
    check_pack("v2-plain.tpack", 2, 0);
}
Test(v2_fixture, encrypted_pack_reads_back)
{
    check_pack("v2-xchacha.tpack", 2, 1);
}
