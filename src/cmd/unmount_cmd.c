/*
 * unmount_cmd.c - unmounting that waits for the uploads (see unmount_cmd.h).
 *
 * `s3cachefs --unmount [-l] MOUNTPOINT`. The daemon is found before the
 * mount goes (a pidfd, so that a pid reused meanwhile cannot be mistaken
 * for it), then the mount point is unmounted (umount2 as root,
 * fusermount3 -u otherwise), then the command waits for the daemon to
 * exit, saying so once if that takes a while.
 */
#include "config.h"

#include "cmd/unmount_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs.h"

#define TELL_AFTER_MS 2000      /* say what it waits for after this long */
#define POLL_MS 100             /* without pidfd_open: kill(pid, 0) steps */

extern char **environ;

bool unmount_cmd_requested(int argc, char **argv)
{
    return argc > 1 && strcmp(argv[1], "--unmount") == 0;
}

void unmount_cmd_report_clear(const char *cache_dir)
{
    char path[PATH_MAX];

    if (snprintf(path, sizeof(path), "%s/%s", cache_dir, UNMOUNT_REPORT) <
        (int)sizeof(path))
        unlink(path);
}

int unmount_cmd_report_write(const char *cache_dir, uint64_t left)
{
    char path[PATH_MAX], tmp[PATH_MAX], text[64];
    int err = 0;

    if (snprintf(path, sizeof(path), "%s/%s", cache_dir, UNMOUNT_REPORT) >=
            (int)sizeof(path) ||
        snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return ENAMETOOLONG;
    int len = snprintf(text, sizeof(text), "uploads_left %llu\n",
                       (unsigned long long)left);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, (size_t)len) != len || fsync(fd) != 0)
        err = errno ? errno : EIO;
    if (fd >= 0 && close(fd) != 0 && err == 0)
        err = errno;
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
    if (err != 0) {
        unlink(tmp);
        log_warn("cannot write %s (%s): s3cachefs --unmount will report that "
                 "the daemon ended without saying", path, strerror(err));
    }
    return err;
}

/* What the daemon that used CACHE_DIR said as it exited: 0 and *LEFT, or
 * ENOENT (it said nothing: killed, or an older version) or another errno. */
static int read_report(const char *cache_dir, uint64_t *left)
{
    char path[PATH_MAX], text[64];
    unsigned long long count;

    if (snprintf(path, sizeof(path), "%s/%s", cache_dir, UNMOUNT_REPORT) >=
        (int)sizeof(path))
        return ENAMETOOLONG;
    FILE *file = fopen(path, "re");
    if (file == NULL)
        return errno;
    bool ok = fgets(text, sizeof(text), file) != NULL &&
              sscanf(text, "uploads_left %llu", &count) == 1;
    fclose(file);
    if (!ok)
        return EINVAL;
    *left = count;
    return 0;
}

/* The pid of the daemon serving MOUNTPOINT, or 0 if it does not say (not
 * an s3cachefs mount, or its daemon is gone). */
static pid_t daemon_pid(const char *mountpoint)
{
    char text[32];
    ssize_t len = getxattr(mountpoint, FS_PID_XATTR, text, sizeof(text) - 1);

    if (len <= 0)
        return 0;
    text[len] = '\0';
    char *end = NULL;
    long pid = strtol(text, &end, 10);
    return end != text && *end == '\0' && pid > 0 ? (pid_t)pid : 0;
}

/* Unmount MOUNTPOINT: 0 or an errno (told on stderr). */
static int do_unmount(const char *mountpoint, bool lazy)
{
    if (geteuid() == 0) {
        if (umount2(mountpoint, lazy ? MNT_DETACH : 0) == 0)
            return 0;
        int err = errno;
        fprintf(stderr, "s3cachefs: cannot unmount %s: %s\n", mountpoint,
                strerror(err));
        return err;
    }
    /* not root: the setuid helper does it */
    char *args[5] = {"fusermount3", "-u"};
    int count = 2;
    if (lazy)
        args[count++] = "-z";
    args[count] = (char *)mountpoint;
    pid_t child;
    int status = 0;
    int err = posix_spawnp(&child, "fusermount3", NULL, NULL, args, environ);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: cannot run fusermount3: %s\n", strerror(err));
        return err;
    }
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : EBUSY;
}

/* Wait for PID (PIDFD, or -1 to poll) to exit. */
static void wait_daemon(pid_t pid, int pidfd, const char *mountpoint)
{
    uint64_t started = clock_monotonic_ms();
    bool told = false;

    for (;;) {
        if (pidfd >= 0) {
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            int ready = poll(&p, 1, told ? -1 : TELL_AFTER_MS);
            if (ready > 0 || (ready < 0 && errno != EINTR))
                return;
        } else {
            if (kill(pid, 0) != 0 && errno == ESRCH)
                return;
            nanosleep(&(struct timespec){0, POLL_MS * 1000000L}, NULL);
        }
        if (!told && clock_monotonic_ms() - started >= TELL_AFTER_MS) {
            fprintf(stderr, "s3cachefs: %s is unmounted; waiting for its "
                    "daemon (pid %ld) to finish the uploads\n", mountpoint,
                    (long)pid);
            told = true;
        }
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: s3cachefs --unmount [-l] MOUNTPOINT\n");
    return 1;
}

int unmount_cmd_main(int argc, char **argv)
{
    const char *mountpoint = NULL;
    bool lazy = false;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') {
            if (mountpoint != NULL)
                return usage();
            mountpoint = arg;
            continue;
        }
        if (strcmp(arg, "-l") != 0)
            return usage();
        lazy = true;
    }
    if (mountpoint == NULL)
        return usage();

    pid_t pid = daemon_pid(mountpoint);
    if (pid == 0) {
        fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount, or its "
                "daemon does not answer (fusermount3 -u unmounts it)\n",
                mountpoint);
        return 1;
    }
    /* where it will leave its report (a daemon older than the report
     * does not say: then only its exit is waited for) */
    char cache_dir[PATH_MAX];
    ssize_t cache_len = getxattr(mountpoint, FS_CACHE_XATTR, cache_dir,
                                 sizeof(cache_dir) - 1);
    if (cache_len > 0)
        cache_dir[cache_len] = '\0';
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    int err = do_unmount(mountpoint, lazy);
    if (err != 0) {
        if (pidfd >= 0)
            close(pidfd);
        return 1;
    }
    wait_daemon(pid, pidfd, mountpoint);
    if (pidfd >= 0)
        close(pidfd);
    if (cache_len <= 0)
        return 0;
    uint64_t left = 0;
    err = read_report(cache_dir, &left);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: the daemon of %s (pid %ld) ended without "
                "saying what it uploaded (was it killed?); what its journal "
                "holds is uploaded by the next mount on %s\n", mountpoint,
                (long)pid, cache_dir);
        return 1;
    }
    if (left > 0) {
        fprintf(stderr, "s3cachefs: %llu file%s of %s could not be uploaded "
                "(the daemon's log says which and why); what its journal "
                "holds stays in %s, and the next mount on it uploads it\n",
                (unsigned long long)left,
                left == 1 ? "" : "s", mountpoint, cache_dir);
        return 1;
    }
    return 0;
}
