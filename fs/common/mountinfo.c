/* Reading /proc/self/mountinfo (mountinfo.h). A line is
 *   ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
 * with spaces, tabs, newlines and backslashes in paths written as \ooo. */
#include "mountinfo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Undoes the octal escapes, in place. */
static void unescape(char *s)
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

int mountinfo_fstype(const char *table, const char *mount_point, char *fstype, size_t cap)
{
    FILE *f = fopen(table, "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t line_cap = 0;
    int found = 0;
    /* Later lines are mounted later: the last match is the one on top. */
    while (getline(&line, &line_cap, f) > 0) {
        char *save = NULL, *field = strtok_r(line, " \n", &save);
        char *point = NULL;
        for (int i = 1; field && i < 5; i++) {
            field = strtok_r(NULL, " \n", &save);
            if (i == 4)
                point = field;
        }
        if (!point)
            continue;
        unescape(point);
        if (strcmp(point, mount_point) != 0)
            continue;
        while ((field = strtok_r(NULL, " \n", &save)) && strcmp(field, "-") != 0)
            ;
        char *type = field ? strtok_r(NULL, " \n", &save) : NULL;
        if (!type)
            continue;
        unescape(type);
        snprintf(fstype, cap, "%s", type);
        found = 1;
    }
    free(line);
    fclose(f);
    return found;
}
