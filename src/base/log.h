/*
 * log.h - one place for diagnostics: stderr in the foreground, syslog when
 * daemonized.
 *
 * Messages are single lines. Callers never pass secrets (keys, tokens,
 * signatures) to these functions; request logs name method, key and status
 * only. Thread-safe.
 */
#ifndef S3CFS_LOG_H
#define S3CFS_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <syslog.h>

enum log_level {
    LOG_LEVEL_ERROR = LOG_ERR,
    LOG_LEVEL_WARN = LOG_WARNING,
    LOG_LEVEL_INFO = LOG_INFO,
    LOG_LEVEL_DEBUG = LOG_DEBUG,
};

/* Send messages to syslog (ident "s3cachefs") instead of stderr. */
void log_use_syslog(void);

/* Messages above LEVEL are dropped. Default: LOG_LEVEL_INFO. */
void log_set_level(enum log_level level);

/* True when messages at LEVEL are emitted (to skip costly formatting). */
bool log_enabled(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* For a condition that lasts (a full disk), so that it is said when it
 * begins and once a minute while it lasts, not once per failed call:
 * whether a line limited by *LAST (a monotonic time in milliseconds, 0
 * before the first line) is due now, in which case *LAST becomes now.
 * One caller of all those racing gets true. */
bool log_due(_Atomic uint64_t *last);

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...)                                                     \
    do {                                                                   \
        if (log_enabled(LOG_LEVEL_DEBUG))                                  \
            log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__);                         \
    } while (0)

#endif /* S3CFS_LOG_H */
