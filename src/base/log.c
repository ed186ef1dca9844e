/*
 * log.c - stderr/syslog diagnostics (see log.h).
 *
 * State: two atomics set before threads start (destination, level); the
 * stderr path formats into a local buffer and writes it with one call so
 * lines from concurrent threads do not interleave.
 */
#include "config.h"

#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_bool log_to_syslog;
static atomic_int log_threshold = LOG_LEVEL_INFO;

void log_use_syslog(void)
{
    openlog("s3cachefs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
    atomic_store(&log_to_syslog, true);
}

void log_set_level(enum log_level level)
{
    atomic_store(&log_threshold, (int)level);
}

bool log_enabled(enum log_level level)
{
    return (int)level <= atomic_load(&log_threshold);
}

#define LOG_DUE_EVERY_MS 60000

bool log_due(_Atomic uint64_t *last)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    /* (+1: a clock that reads 0 still sets *LAST) */
    uint64_t now_ms = (uint64_t)now.tv_sec * 1000 +
                      (uint64_t)now.tv_nsec / 1000000 + 1;
    uint64_t before = atomic_load(last);
    return (before == 0 || now_ms - before >= LOG_DUE_EVERY_MS) &&
           atomic_compare_exchange_strong(last, &before, now_ms);
}

static const char *level_name(enum log_level level)
{
    switch (level) {
    case LOG_LEVEL_ERROR: return "error";
    case LOG_LEVEL_WARN: return "warning";
    case LOG_LEVEL_INFO: return "info";
    default: return "debug";
    }
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (!log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* keys may hold any byte: one message stays one line */
    for (char *c = line; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';

    if (atomic_load(&log_to_syslog)) {
        syslog((int)level, "%s", line);
        return;
    }
    char out[1100];
    int n = snprintf(out, sizeof(out), "s3cachefs: %s: %s\n",
                     level_name(level), line);
    if (n > (int)sizeof(out) - 1)
        n = (int)sizeof(out) - 1;
    if (write(STDERR_FILENO, out, (size_t)n) < 0) {
        /* nowhere left to report a failed diagnostic */
    }
}
