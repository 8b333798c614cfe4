#include "readahead.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape_octal(char *s)
{
    char *out = s;
    for (char *in = s; *in; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
            in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

/* The "MAJOR:MINOR" of the newest mount at path, into dev. */
static int mount_device(const char *path, char *dev, size_t dev_len)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t cap = 0;
    int rc = -ENOENT;
    while (getline(&line, &cap, f) > 0) {
        /* id parent MAJOR:MINOR root mountpoint ... */
        char *save = NULL, *field[5];
        int n = 0;
        for (char *tok = strtok_r(line, " ", &save); tok && n < 5; tok = strtok_r(NULL, " ", &save))
            field[n++] = tok;
        if (n < 5)
            continue;
        unescape_octal(field[4]);
        if (strcmp(field[4], path) == 0 && strlen(field[2]) < dev_len) {
            strcpy(dev, field[2]);
            rc = 0; /* keep going: a later line is a mount on top */
        }
    }
    free(line);
    fclose(f);
    return rc;
}

int raise_readahead(const char *real_mountpoint, unsigned kib)
{
    char dev[32], knob[96];
    int rc = mount_device(real_mountpoint, dev, sizeof dev);
    if (rc)
        return rc;
    snprintf(knob, sizeof knob, "/sys/class/bdi/%s/read_ahead_kb", dev);
    FILE *f = fopen(knob, "we");
    if (!f)
        return -errno;
    int wrote = fprintf(f, "%u\n", kib);
    if (fclose(f) != 0 || wrote < 0)
        return -EIO;
    return 0;
}
