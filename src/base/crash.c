/*
 * crash.c - a report of the fault that ends the process (see crash.h).
 *
 * The handler uses only write(2), backtrace(3) (loaded at install time,
 * so that its first call does not load libgcc inside the handler) and
 * backtrace_symbols_fd(3), which allocates nothing. It then restores the
 * default action: returning re-runs the faulting instruction, which now
 * ends the process with the signal (a raised signal, SIGABRT, is raised
 * again). SIGBUS is installed first, so that sigbus.c, installed later
 * by the cache, passes the faults outside its guarded mappings on here.
 */
#include "config.h"

#include "base/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define CRASH_FRAMES 64

#if defined(__SANITIZE_ADDRESS__)
#define CRASH_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CRASH_SANITIZED 1
#endif
#endif

#ifndef CRASH_SANITIZED
static void put(const char *text)
{
    size_t len = strlen(text);

    while (len > 0) {
        ssize_t done = write(STDERR_FILENO, text, len);
        if (done <= 0)
            return;
        text += done;
        len -= (size_t)done;
    }
}

/* VALUE in hexadecimal, "0x..." into OUT (19 bytes at least). */
static void hex(uintptr_t value, char *out)
{
    char digits[2 * sizeof(value)];
    size_t count = 0;

    do {
        digits[count++] = "0123456789abcdef"[value & 0xf];
        value >>= 4;
    } while (value != 0);
    *out++ = '0';
    *out++ = 'x';
    while (count > 0)
        *out++ = digits[--count];
    *out = '\0';
}

static const char *signal_name(int signum)
{
    switch (signum) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic fault)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGABRT: return "SIGABRT (aborted)";
    default: return "a fatal signal";
    }
}

static void on_fatal(int signum, siginfo_t *info, void *context)
{
    void *frames[CRASH_FRAMES];
    char address[24];

    (void)context;
    /* the default action from now on: a second fault, in here, just ends
     * the process (SA_RESETHAND does so too, but not when sigbus.c's
     * handler called this one) */
    signal(signum, SIG_DFL);
    put("s3cachefs: fatal: ");
    put(signal_name(signum));
    if (signum != SIGABRT) {
        hex((uintptr_t)info->si_addr, address);
        put(" at address ");
        put(address);
    }
    put("; backtrace (addr2line -f -e s3cachefs OFFSET names a frame):\n");
    int count = backtrace(frames, CRASH_FRAMES);
    backtrace_symbols_fd(frames, count, STDERR_FILENO);
    if (info->si_code <= 0)
        raise(signum); /* sent or raised: again, now with its default */
    /* a fault: returning runs the instruction again, which now ends the
     * process with the default action */
}

#endif /* CRASH_SANITIZED */

bool crash_report_install(void)
{
#ifdef CRASH_SANITIZED
    return false;
#else
    static const int fatal[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGABRT};
    struct sigaction action;
    void *frame;

    backtrace(&frame, 1); /* loads what backtrace() needs, now */
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = on_fatal;
    action.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        if (sigaction(fatal[i], &action, NULL) != 0)
            return false;
    return true;
#endif
}
