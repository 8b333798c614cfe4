#include "name_escape.h"

#include <stdlib.h>
#include <string.h>

static char *put_escaped(char *out, unsigned char byte)
{
    static const char hex[] = "0123456789ABCDEF";
    *out++ = '%';
    *out++ = hex[byte >> 4];
    *out++ = hex[byte & 15];
    return out;
}

static int needs_escape(unsigned char byte)
{
    return byte == '%' || byte < 0x20 || byte == 0x7f;
}

char *tensor_name_to_path(const char *name)
{
    size_t len = strlen(name);
    /* Every byte grows to at most three. */
    char *path = malloc(len * 3 + 1);
    if (!path)
        return NULL;
    char *out = path;
    char *component = out; /* where the component being written starts */
    for (size_t i = 0; i <= len; i++) {
        unsigned char byte = (unsigned char)name[i];
        int at_end = byte == '\0';
        int separator = byte == '/' && out != component && i + 1 < len && name[i + 1] != '/';
        if (at_end || separator) {
            /* A component that came out as "." or ".." names the directory
             * itself or its parent: encode its dots. */
            size_t clen = (size_t)(out - component);
            if ((clen == 1 && component[0] == '.') ||
                (clen == 2 && component[0] == '.' && component[1] == '.')) {
                out = component;
                for (size_t d = 0; d < clen; d++)
                    out = put_escaped(out, '.');
            }
            if (at_end)
                break;
            *out++ = '/';
            component = out;
        } else if (byte == '/' || needs_escape(byte)) {
            out = put_escaped(out, byte);
        } else {
            *out++ = (char)byte;
        }
    }
    *out = '\0';
    return path;
}
