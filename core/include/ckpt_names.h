/*
 * Names in JSON. File paths and tensor names in a pack are bytes, which
 * need not be UTF-8; JSON strings must be. Every JSON document ckptfs
 * writes (a mount's manifest.json, `ckpt ls --json`) therefore gives each
 * name as:
 *
 *   "path": "..."        the name itself when it is valid UTF-8; otherwise
 *                        a display form: every byte that is not part of
 *                        valid UTF-8 as \xNN (two upper-case hex digits)
 *                        and every backslash as \\ (so the form is
 *                        lossless and reads back unambiguously)
 *   "path_b64": "..."    only when the name is not valid UTF-8: its raw
 *                        bytes in standard base64 (RFC 4648, padded)
 *
 * A program that needs the exact bytes uses "<key>_b64" when present and
 * "<key>" otherwise: a real file named "\xFF" (a backslash, x, F, F) has
 * no "path_b64", the byte 0xFF has one.
 */
#ifndef CKPT_NAMES_H
#define CKPT_NAMES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Is s (NUL-terminated) valid UTF-8 (no overlong forms or surrogates)? */
int ckpt_name_is_utf8(const char *s);
/* The display form above (malloc'd; the name itself when valid UTF-8), or
 * NULL when out of memory. */
char *ckpt_name_display(const char *s);
/* Standard padded base64 of len bytes (malloc'd), or NULL. */
char *ckpt_base64(const void *data, size_t len);

#ifdef __cplusplus
}
#endif

#endif
