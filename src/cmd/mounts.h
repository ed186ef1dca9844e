/*
 * mounts.h - what the commands (`stats`, `sync`, `pending`, `warm`,
 * and the daemon's own setup in main.c) share to find an s3cachefs mount
 * and ask its daemon: paths made absolute without touching the mount,
 * /proc/self/mountinfo read, and an extended attribute read by a child
 * process with a deadline.
 *
 * Why a child: a getxattr() on a mount whose daemon is stopped or stuck
 * blocks in the kernel until the daemon answers; in a child, the command
 * gives up after its deadline and kills it (SIGKILL ends a FUSE request's
 * wait) instead of hanging itself.
 */
#ifndef S3CFS_MOUNTS_H
#define S3CFS_MOUNTS_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

/* A line of /proc/self/mountinfo, unescaped. */
struct mounts_entry {
    char point[PATH_MAX];
    char type[64];              /* "fuse.s3cachefs", "tmpfs", ... */
    char source[512];           /* for s3cachefs: bucket[:prefix] */
    unsigned major, minor;      /* the device: /sys/class/bdi/MAJ:MIN */
};

/* ARG made absolute without stat()ing ARG itself (a mount point whose
 * daemon is stuck would hang): its parent resolved, its last component
 * kept; "/", "." and ".." resolved whole. 0 or an errno; *OUT malloc'd. */
int mounts_canonical_path(const char *arg, char **out);

/* Undo mountinfo's octal escapes (\040 for a space...) in place. */
void mounts_unescape(char *text);

/* The mount whose point is PATH (absolute, resolved; the last one, which
 * hides those below) into *OUT. False if PATH is not a mount point. */
bool mounts_at(const char *path, struct mounts_entry *out);

/* The mount PATH (absolute, resolved) is in: the longest mount point at
 * or above it (of equal ones the last) into *OUT. */
bool mounts_holding(const char *path, struct mounts_entry *out);

/*
 * The extended attribute NAME of PATH (at most MAX bytes), read by a child
 * process within TIMEOUT_MS, into *VALUE (malloc'd, NUL-terminated; may
 * be NULL if the value is not wanted) and *LEN. 0; getxattr()'s errno;
 * ETIMEDOUT (the child is killed); EIO (the child died without a word);
 * ENOMEM or fork()'s errno. With MASK, the wait lets in the signals MASK
 * does not block (ppoll): one that sets *STOP ends it with EINTR (the
 * child is killed).
 */
int mounts_ask_xattr(const char *path, const char *name, size_t max,
                     int timeout_ms, const sigset_t *mask,
                     volatile sig_atomic_t *stop, char **value, size_t *len);

/* Whether PATH is the point of a mounted s3cachefs whose daemon answers
 * within TIMEOUT_MS (no message: for telling a command from the name of
 * a bucket). A fuse mount of another subtype counts if its daemon answers
 * the pid attribute (-o subtype= may have renamed it). */
bool mounts_is_s3cachefs(const char *path, int timeout_ms);

#endif /* S3CFS_MOUNTS_H */
