/*
 * sigbus.c - reading a mapped file without dying of SIGBUS (see sigbus.h).
 *
 * The guard of each thread is a thread-local pointer (the executable's
 * own TLS, which a signal handler may read). The handler replaces the
 * faulting page with an anonymous one by mmap(MAP_FIXED): not on POSIX's
 * list of async-signal-safe calls, but a plain system call on Linux, the
 * way systemd's journal reader survives truncated files. Returning from
 * the handler retries the read, which now finds the zero page.
 */
#include "config.h"

#include "base/sigbus.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static _Thread_local struct sigbus_guard *current;
static size_t page_size;
static struct sigaction before; /* the handler this one replaced */

static void on_sigbus(int signum, siginfo_t *info, void *context)
{
    const char *address = info->si_addr;
    int saved_errno = errno;

    for (struct sigbus_guard *guard = current; guard != NULL;
         guard = guard->outer) {
        if (address < guard->start || address >= guard->start + guard->len)
            continue;
        void *page = (void *)((uintptr_t)address & ~(uintptr_t)(page_size - 1));
        if (mmap(page, page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) == MAP_FAILED)
            break;
        guard->faulted = true;
        errno = saved_errno;
        return;
    }
    /* not a guarded read: die of it as if there were no handler, or
     * pass it on to the one installed before (crash.h's report) */
    if ((before.sa_flags & SA_SIGINFO) && before.sa_sigaction != NULL &&
        before.sa_sigaction != on_sigbus) {
        errno = saved_errno;
        before.sa_sigaction(signum, info, context);
        return;
    }
    signal(signum, SIG_DFL);
    errno = saved_errno;
    /* (returning retries the access, which now takes the default action) */
}

int sigbus_install(void)
{
    struct sigaction action;

    page_size = (size_t)sysconf(_SC_PAGESIZE);
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    struct sigaction replaced;
    if (sigaction(SIGBUS, &action, &replaced) != 0)
        return errno;
    if (!((replaced.sa_flags & SA_SIGINFO) && replaced.sa_sigaction == on_sigbus))
        before = replaced;
    return 0;
}

void sigbus_guard_begin(struct sigbus_guard *guard, const void *start,
                        size_t len)
{
    guard->start = start;
    guard->len = len;
    guard->faulted = false;
    guard->outer = current;
    atomic_signal_fence(memory_order_seq_cst);
    current = guard;
}

bool sigbus_guard_end(struct sigbus_guard *guard)
{
    current = guard->outer;
    atomic_signal_fence(memory_order_seq_cst);
    return guard->faulted;
}
