/*
 * args.h - the argument conventions the commands share (`sync`,
 * `pending`, `warm`): "--name=VALUE" or "--name VALUE", and telling a
 * command's own option from a mount option.
 */
#ifndef S3CFS_ARGS_H
#define S3CFS_ARGS_H

#include <stdbool.h>
#include <stddef.h>

/* Whether ARG (up to a '=') is one of the COUNT NAMES. */
bool args_is_one_of(const char *arg, const char *const *names, size_t count);

/* The value of option NAME at ARGV[*I] ("--name=V" or "--name V", which
 * moves *I on), or NULL when ARGV[*I] is not NAME; *MISSING says it is
 * NAME without a value. */
const char *args_value(char **argv, int argc, int *i, const char *name,
                       bool *missing);

#endif /* S3CFS_ARGS_H */
