/*
 * mounts.c - finding an s3cachefs mount and asking its daemon, for the
 * commands (see mounts.h).
 */
#include "config.h"

#include "cmd/mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "fs/fs.h"

int mounts_canonical_path(const char *arg, char **out)
{
    char *copy = strdup(arg), *parent = NULL;
    int err = 0;

    *out = NULL;
    if (copy == NULL)
        return ENOMEM;
    size_t len = strlen(copy);
    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = '\0';
    char *slash = strrchr(copy, '/');
    const char *base = slash != NULL ? slash + 1 : copy;
    if (strcmp(copy, "/") == 0 || strcmp(base, ".") == 0 ||
        strcmp(base, "..") == 0 || base[0] == '\0') {
        *out = realpath(copy, NULL);
        err = *out == NULL ? errno : 0;
        goto out;
    }
    if (slash == copy) {
        parent = strdup("/");
    } else if (slash != NULL) {
        *slash = '\0';
        parent = realpath(copy, NULL);
    } else {
        parent = realpath(".", NULL);
    }
    if (parent == NULL) {
        err = errno != 0 ? errno : ENOMEM;
        goto out;
    }
    if (asprintf(out, "%s%s%s", parent, strcmp(parent, "/") == 0 ? "" : "/",
                 base) < 0) {
        *out = NULL;
        err = ENOMEM;
    }
out:
    free(parent);
    free(copy);
    return err;
}

void mounts_unescape(char *text)
{
    char *out = text;

    for (const char *in = text; *in != '\0'; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' &&
            in[2] <= '7' && in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

/* Whether mount point POINT is PATH or above it. */
static bool point_holds(const char *point, const char *path)
{
    size_t len = strlen(point);

    if (strcmp(point, "/") == 0)
        return true;
    return strncmp(path, point, len) == 0 && (path[len] == '\0' || path[len] == '/');
}

/* Read /proc/self/mountinfo for PATH: the mount at it (EXACT) or the one
 * holding it. */
static bool find(const char *path, bool exact, struct mounts_entry *out)
{
    FILE *mounts = fopen("/proc/self/mountinfo", "re");
    char *line = NULL;
    size_t cap = 0, best = 0;
    bool found = false;
    struct mounts_entry *here = malloc(sizeof(*here));

    if (mounts == NULL || here == NULL) {
        if (mounts != NULL)
            fclose(mounts);
        free(here);
        return false;
    }
    while (getline(&line, &cap, mounts) > 0) {
        /* ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [FIELDS...] - TYPE SOURCE ... */
        const char *dash = strstr(line, " - ");
        if (dash == NULL ||
            sscanf(line, "%*u %*u %u:%u %*s %4095s", &here->major, &here->minor,
                   here->point) != 3 ||
            sscanf(dash, " - %63s", here->type) != 1)
            continue;
        here->source[0] = '\0';
        sscanf(dash, " - %*s %511s", here->source);
        mounts_unescape(here->point);
        mounts_unescape(here->source);
        size_t len = strlen(here->point);
        bool match = exact ? strcmp(here->point, path) == 0
                           : point_holds(here->point, path) && len >= best;
        if (match) {
            best = len;
            *out = *here;
            found = true;
        }
    }
    free(line);
    free(here);
    fclose(mounts);
    return found;
}

bool mounts_at(const char *path, struct mounts_entry *out)
{
    return find(path, true, out);
}

bool mounts_holding(const char *path, struct mounts_entry *out)
{
    return find(path, false, out);
}

/* The child of mounts_ask_xattr(): one getxattr(), then its errno and the
 * value into the pipe FD. It never returns. */
static void ask_child(const char *path, const char *name, size_t max, int fd)
{
    char *value = malloc(max > 0 ? max : 1);
    ssize_t len = value == NULL ? -1 : getxattr(path, name, value, max);
    int err = value == NULL ? ENOMEM : len < 0 ? errno : 0;
    const char *from = (const char *)&err;
    size_t left = sizeof(err);

    for (int part = 0; part < 2; part++) {
        while (left > 0) {
            ssize_t wrote = write(fd, from, left);
            if (wrote < 0 && errno == EINTR)
                continue;
            if (wrote <= 0)
                _exit(1);
            from += wrote;
            left -= (size_t)wrote;
        }
        from = value;
        left = len > 0 ? (size_t)len : 0;
    }
    _exit(0);
}

int mounts_ask_xattr(const char *path, const char *name, size_t max,
                     int timeout_ms, const sigset_t *mask,
                     volatile sig_atomic_t *stop, char **value, size_t *len)
{
    size_t cap = sizeof(int) + max, got = 0;
    char *buf = malloc(cap + 1);
    int fds[2] = {-1, -1}, err = 0;
    pid_t child = -1;

    if (value != NULL)
        *value = NULL;
    if (len != NULL)
        *len = 0;
    if (buf == NULL)
        return ENOMEM;
    if (pipe2(fds, O_CLOEXEC) != 0 || (child = fork()) < 0) {
        err = errno;
        goto out;
    }
    if (child == 0)
        ask_child(path, name, max, fds[1]);
    close(fds[1]);
    fds[1] = -1;

    uint64_t deadline = clock_monotonic_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = clock_monotonic_ms();
        if (now >= deadline) {
            err = ETIMEDOUT;
            break;
        }
        struct pollfd ready = {.fd = fds[0], .events = POLLIN};
        struct timespec wait = {
            .tv_sec = (time_t)((deadline - now) / 1000),
            .tv_nsec = (long)((deadline - now) % 1000) * 1000000,
        };
        int count = ppoll(&ready, 1, &wait, mask);
        if (count < 0 && errno == EINTR && stop != NULL && *stop != 0) {
            err = EINTR;
            break;
        }
        if (count <= 0)
            continue;
        ssize_t n = read(fds[0], buf + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the child is done */
        got += (size_t)n;
        if (got == cap)
            break; /* (it has said all it can) */
    }
    if (err == 0 && got < sizeof(int))
        err = EIO; /* the child died without a word */
    if (err == 0)
        memcpy(&err, buf, sizeof(int));
    if (err == 0) {
        size_t length = got - sizeof(int);
        memmove(buf, buf + sizeof(int), length);
        buf[length] = '\0';
        if (len != NULL)
            *len = length;
        if (value != NULL) {
            *value = buf;
            buf = NULL;
        }
    }
out:
    if (child > 0) {
        if (err == ETIMEDOUT || err == EINTR)
            kill(child, SIGKILL);
        /* (a child the kernel still holds in a request cannot be reaped
         * yet: left to init rather than waited for without end) */
        for (int tries = 0; tries < 20; tries++) {
            pid_t done = waitpid(child, NULL, WNOHANG);
            if (done == child || (done < 0 && errno != EINTR))
                break;
            nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
        }
    }
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    free(buf);
    return err;
}

bool mounts_is_s3cachefs(const char *path, int timeout_ms)
{
    char *canonical = NULL;
    struct mounts_entry *mount = malloc(sizeof(*mount));
    bool yes = false;

    if (mount == NULL || mounts_canonical_path(path, &canonical) != 0 ||
        !mounts_at(canonical, mount))
        goto out;
    if (strcmp(mount->type, "fuse.s3cachefs") == 0)
        yes = true;
    else if (strncmp(mount->type, "fuse", 4) == 0) /* -o subtype= renamed it? */
        yes = mounts_ask_xattr(canonical, FS_PID_XATTR, 64, timeout_ms, NULL, NULL,
                               NULL, NULL) == 0;
out:
    free(mount);
    free(canonical);
    return yes;
}
