/*
 * args.c - the argument conventions the commands share (see
 * args.h).
 */
#include "config.h"

#include "cmd/args.h"

#include <string.h>

bool args_is_one_of(const char *arg, const char *const *names, size_t count)
{
    size_t len = strcspn(arg, "=");

    for (size_t i = 0; i < count; i++)
        if (strlen(names[i]) == len && strncmp(arg, names[i], len) == 0)
            return true;
    return false;
}

const char *args_value(char **argv, int argc, int *i, const char *name,
                       bool *missing)
{
    size_t len = strlen(name);
    const char *arg = argv[*i];

    *missing = false;
    if (strncmp(arg, name, len) != 0)
        return NULL;
    if (arg[len] == '=')
        return arg + len + 1;
    if (arg[len] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}
