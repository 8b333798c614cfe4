/* Names in JSON (core/include/ckpt_names.h): UTF-8 names as they are,
 * others in a lossless display form beside their base64 bytes. */
#include "testutil.h"

#include "ckpt_names.h"

static void expect_display(const char *name, const char *want)
{
    char *got = ckpt_name_display(name);
    cr_assert_not_null(got);
    cr_assert_str_eq(got, want);
    free(got);
}

static void expect_b64(const char *data, size_t len, const char *want)
{
    char *got = ckpt_base64(data, len);
    cr_assert_not_null(got);
    cr_assert_str_eq(got, want);
    free(got);
}

Test(names, utf8_is_told_apart)
{
    cr_assert(ckpt_name_is_utf8("plain/ascii.bin"));
    cr_assert(ckpt_name_is_utf8("caf\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80"));
    cr_assert(ckpt_name_is_utf8("\\xFF"));
    cr_assert_not(ckpt_name_is_utf8("\xff\xfe.bin"));
    cr_assert_not(ckpt_name_is_utf8("\xc0\xaf"));         /* overlong '/' */
    cr_assert_not(ckpt_name_is_utf8("\xed\xa0\x80"));     /* a surrogate */
    cr_assert_not(ckpt_name_is_utf8("\xf4\x90\x80\x80")); /* above U+10FFFF */
    cr_assert_not(ckpt_name_is_utf8("cut \xe2\x82"));
}

Test(names, display_form_is_lossless)
{
    expect_display("model.safetensors", "model.safetensors");
    expect_display("a\\b", "a\\b"); /* UTF-8: the name itself */
    expect_display("\xff\xfe.bin", "\\xFF\\xFE.bin");
    /* Not UTF-8: a backslash is doubled, so it never reads as an escape. */
    expect_display("a\\xFF\xff", "a\\\\xFF\\xFF");
    expect_display("caf\xc3\xa9\xff", "caf\xc3\xa9\\xFF");
}

Test(names, base64_is_standard)
{
    expect_b64("", 0, "");
    expect_b64("f", 1, "Zg==");
    expect_b64("fo", 2, "Zm8=");
    expect_b64("foo", 3, "Zm9v");
    expect_b64("foobar", 6, "Zm9vYmFy");
    expect_b64("\xff\xfe.bin", 6, "//4uYmlu");
}
