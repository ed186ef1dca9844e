/*
 * refresh_cmd.c - `s3cachefs refresh PATH...` (see refresh_cmd.h): each
 * path's mount found through /proc/self/mountinfo, then its
 * FS_REFRESH_XATTR read by a child process with a deadline
 * (mounts_ask_xattr(): a stuck daemon does not hang the command), and the
 * daemon's answer ("name value" lines) printed as one line.
 */
#include "config.h"

#include "cmd/refresh_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/args.h"
#include "cmd/mounts.h"
#include "fs/fs.h"

#define EXIT_OK 0
#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define ANSWER_MAX 4096
/* a tree of a million keys: a million index records deleted */
#define REFRESH_TIMEOUT_MS (10 * 60 * 1000)
#define MOUNT_TYPE "fuse.s3cachefs"

static const char help_text[] =
    "usage: s3cachefs refresh PATH...\n"
    "\n"
    "The mount holding each PATH forgets what it knows of it: a directory's\n"
    "listings and attributes at any depth, a file's attributes and its\n"
    "directory's listing; in memory, in the cache index and in the kernel.\n"
    "The next use lists and asks the bucket again (also under -o trust).\n"
    "\n"
    "  -h, --help  this text\n"
    "\n"
    "Exit status: 0 done, 1 a path failed, 2 bad usage.\n";

/* Whether ARG is in a mount of type fuse.s3cachefs; *POINT gets its
 * point (PATH_MAX bytes) and *PATH the canonical path (malloc'd). */
static int mount_of_path(const char *arg, char **path, char *point)
{
    struct mounts_entry mount;
    int err = mounts_canonical_path(arg, path);

    if (err != 0)
        return err;
    if (!mounts_holding(*path, &mount) ||
        (strcmp(mount.type, MOUNT_TYPE) != 0 &&
         !(strncmp(mount.type, "fuse", 4) == 0 &&
           mounts_is_s3cachefs(mount.point, 5000))))
        return EXDEV;
    snprintf(point, PATH_MAX, "%s", mount.point);
    return 0;
}

static bool is_help(const char *arg)
{
    static const char *const names[] = {"-h", "--help"};

    return args_is_one_of(arg, names, 2);
}

bool refresh_cmd_requested(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "refresh") != 0)
        return false;
    if (argc == 2)
        return true;
    for (int i = 2; i < argc; i++)
        if (is_help(argv[i]))
            return true;
    /* `s3cachefs refresh /mnt -o ...` mounts a bucket named "refresh":
     * its mount point is not inside an s3cachefs mount */
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0) {
            i++;
            continue;
        }
        char *path = NULL, point[PATH_MAX];
        bool inside = argv[i][0] != '-' && mount_of_path(argv[i], &path, point) == 0;
        free(path);
        if (inside)
            return true;
    }
    return false;
}

/* The value of NAME in ANSWER's "name value" lines, or 0. */
static unsigned long long answer_value(const char *answer, const char *name)
{
    size_t len = strlen(name);

    for (const char *line = answer; line != NULL && *line != '\0';) {
        if (strncmp(line, name, len) == 0 && line[len] == ' ')
            return strtoull(line + len + 1, NULL, 10);
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return 0;
}

/* Refresh ARG; prints its line. Returns 0 or 1 (failed). */
static int refresh_one(const char *arg)
{
    char *path = NULL, *answer = NULL, point[PATH_MAX];
    size_t len = 0;
    int err = mount_of_path(arg, &path, point);

    if (err == EXDEV) {
        fprintf(stderr, "s3cachefs refresh: %s: not inside an s3cachefs mount\n", arg);
        free(path);
        return 1;
    }
    if (err == 0)
        err = mounts_ask_xattr(path, FS_REFRESH_XATTR, ANSWER_MAX, REFRESH_TIMEOUT_MS,
                               NULL, NULL, &answer, &len);
    if (err == 0 && strncmp(answer, "refresh 1\n", 10) != 0)
        err = EPROTO;
    if (err != 0) {
        const char *why = err == ENODATA || err == ENOTSUP || err == EPROTO
                              ? "the daemon of this mount does not know the "
                                "request (an older s3cachefs?)"
                          : err == ETIMEDOUT ? "the daemon did not answer in time"
                                             : strerror(err);
        fprintf(stderr, "s3cachefs refresh: %s: %s\n", arg, why);
        free(path);
        free(answer);
        return 1;
    }
    printf("%s: forgot %llu listing%s (%llu stored) and %llu stored "
           "attribute%s of %llu inode%s; the kernel %llu entr%s\n",
           arg, answer_value(answer, "listings"),
           answer_value(answer, "listings") == 1 ? "" : "s",
           answer_value(answer, "stored_listings"),
           answer_value(answer, "stored_records"),
           answer_value(answer, "stored_records") == 1 ? "" : "s",
           answer_value(answer, "inodes"),
           answer_value(answer, "inodes") == 1 ? "" : "s",
           answer_value(answer, "kernel_entries"),
           answer_value(answer, "kernel_entries") == 1 ? "y" : "ies");
    free(path);
    free(answer);
    return 0;
}

int refresh_cmd_main(int argc, char **argv)
{
    int paths = 0, failed = 0;

    for (int i = 2; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(help_text, stdout);
            return EXIT_OK;
        }
        if (argv[i][0] == '-' && strcmp(argv[i], "--") != 0) {
            fprintf(stderr, "s3cachefs refresh: unknown option '%s'\n%s",
                    argv[i], help_text);
            return EXIT_USAGE;
        }
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            continue;
        paths++;
        failed += refresh_one(argv[i]);
    }
    if (paths == 0) {
        fprintf(stderr, "s3cachefs refresh: no PATH\n%s", help_text);
        return EXIT_USAGE;
    }
    fflush(stdout);
    return failed > 0 ? EXIT_FAILED : EXIT_OK;
}
