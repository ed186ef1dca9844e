/*
 * metrics_text.h - a mount's counters in the Prometheus text exposition
 * format (version 0.0.4), for the endpoint of -o metrics (metrics_http.h).
 *
 * Pure: a snapshot of the counters in, text out. Every family has its
 * HELP and TYPE lines; names carry their unit (_bytes, _seconds) and
 * counters end in _total, as `promtool check metrics` wants. Requests
 * are one family labelled by kind (get, head, list, put, delete, copy,
 * multipart), with a histogram of their latency by the same label.
 * The families and what each means are listed in metrics_text.c and in
 * the man page (METRICS).
 */
#ifndef S3CFS_METRICS_TEXT_H
#define S3CFS_METRICS_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "fs/fs.h"

/* What the text is made of; nothing is owned. */
struct metrics_snapshot {
    const struct fs_stats *stats;
    uint32_t block_size;        /* of the cache */
    double start_time;          /* the daemon's, seconds since the epoch */
    const char *version;        /* PACKAGE_VERSION */
};

/* The text of SNAPSHOT into *TEXT (malloc'd, NUL-terminated, *LEN bytes
 * before the NUL). 0 or ENOMEM. */
int metrics_text_render(const struct metrics_snapshot *snapshot, char **text,
                        size_t *len);

#endif /* S3CFS_METRICS_TEXT_H */
