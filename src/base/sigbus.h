/*
 * sigbus.h - reading a mapped file without dying of SIGBUS.
 *
 * A read of a mapped file page that the kernel cannot provide raises
 * SIGBUS: the file was truncated under the mapping, the page is a hole
 * of a tmpfs that is full (tmpfs allocates on a read fault), or the disk
 * answered with an I/O error. A cache must treat all three as a damaged
 * block, not as the end of the process.
 *
 * A thread that reads a mapping guards it: sigbus_guard_begin() names
 * the range, sigbus_guard_end() says whether a fault happened in it.
 * A fault inside a guarded range has an anonymous zero page mapped over
 * the faulting page and the read goes on (what it reads there is zeros:
 * the caller must discard it); a SIGBUS anywhere else goes to the
 * handler installed before this one (crash.h's report), or else ends the
 * process with the default action.
 */
#ifndef S3CFS_SIGBUS_H
#define S3CFS_SIGBUS_H

#include <stdbool.h>
#include <stddef.h>

struct sigbus_guard {
    const char *start;           /* the guarded range */
    size_t len;
    volatile bool faulted;       /* set by the handler */
    struct sigbus_guard *outer;  /* the thread's guard before this one */
};

/* Install the process's SIGBUS handler, in place of any other (again
 * if something replaced it). 0 or the errno of sigaction(). */
int sigbus_install(void);

/* Guard LEN bytes at START (a mapping) for the calling thread, until
 * sigbus_guard_end(). Guards nest. The handler must be installed. */
void sigbus_guard_begin(struct sigbus_guard *guard, const void *start,
                        size_t len);

/* End GUARD (the thread's latest): whether a read of the range faulted
 * (then part of it reads as zeros; the mapping stays valid to unmap). */
bool sigbus_guard_end(struct sigbus_guard *guard);

#endif /* S3CFS_SIGBUS_H */
