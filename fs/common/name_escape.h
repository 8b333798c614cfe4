/* Turns a tensor name into a relative path under tensors/.
 *
 * '/' in a name makes subdirectories. Bytes that would not survive as path
 * components are percent-encoded (%XX, upper-case hex): '%' itself, control
 * bytes (0x01-0x1f, 0x7f), a '/' that would start, end or double up a
 * component (leading, trailing, "//"), and the dots of a component that is
 * exactly "." or "..". Decoding is: split on '/', percent-decode each
 * component, join with '/'; so the mapping is reversible and two names
 * never share a path. */
#ifndef CKPTFS_NAME_ESCAPE_H
#define CKPTFS_NAME_ESCAPE_H

/* malloc'd path, or NULL when out of memory. The empty name has no path:
 * it maps to "", which callers must skip. */
char *tensor_name_to_path(const char *name);

#endif
