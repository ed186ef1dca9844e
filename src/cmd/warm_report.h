/*
 * warm_report.h - what `s3cachefs warm` (warm_cmd.h) reads and prints,
 * without I/O of its own so that unit tests can check it: the lines of a
 * --from list, sizes, durations, the progress line of a terminal, the
 * one-line summary, JSON strings.
 */
#ifndef S3CFS_WARM_REPORT_H
#define S3CFS_WARM_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum warm_mode {
    WARM_MODE_FETCH,     /* warm */
    WARM_MODE_CHECK,     /* --check */
    WARM_MODE_EVICT,     /* --evict */
    WARM_MODE_PIN,       /* --pin */
    WARM_MODE_UNPIN,     /* --unpin */
};

/* What a run did so far, over the files it was asked for. */
struct warm_totals {
    uint64_t files;          /* regular files found */
    uint64_t done;           /* of which answered (any status) */
    uint64_t failed;         /* paths that failed: not found, not a
                                regular file, a fetch that failed, not
                                answered, interrupted */
    uint64_t staged;         /* files with data not uploaded (left alone) */
    uint64_t bytes;          /* the sizes of the files found */
    uint64_t bytes_done;     /* the sizes of those answered, plus what is
                                cached of those under way */
    uint64_t before;         /* already cached when asked */
    uint64_t fetched;        /* fetched by this run */
    uint64_t cached;         /* cached when answered */
    uint64_t freed;          /* --evict */
    uint64_t pin_used;       /* --pin, --unpin: the pinned bytes after the
                                last answer, and what they may take */
    uint64_t pin_max;
};

/* The word of MODE as the command says it ("warm", "check", "evict",
 * "pin", "unpin"). Static. */
const char *warm_report_mode_name(enum warm_mode mode);

/*
 * One line of a --from list (one path a line; the newline is not part of
 * it), cut in place: a trailing "\r" and the line's trailing blanks go,
 * leading blanks too. NULL for a line to skip (blank, or a comment: '#'
 * first after the blanks); else the path (pointing into LINE).
 */
char *warm_report_list_line(char *line);

/* BYTES as "512 B", "1.5 KiB" ... "2.0 TiB" into BUF (CAP bytes). */
void warm_report_format_bytes(uint64_t bytes, char *buf, size_t cap);

/* SECONDS as "M:SS" or "H:MM:SS" (rounded down; negative as 0). */
void warm_report_format_duration(double seconds, char *buf, size_t cap);

/* Percent of PART in WHOLE, rounded down; 100 for an empty WHOLE. So a
 * file is 100% only when all of it is there. */
unsigned warm_report_percent(uint64_t part, uint64_t whole);

/*
 * The progress line a terminal shows (no newline), at most WIDTH
 * columns: "warm  [#####     ] 3/12 files  1.0/4.0 GiB  210 MiB/s  ETA
 * 0:14" after SECONDS. The rate is of bytes_done; the ETA is left out
 * until something was done.
 */
void warm_report_progress_line(enum warm_mode mode, const struct warm_totals *totals,
                               double seconds, unsigned width, char *buf, size_t cap);

/*
 * The one-line summary (no newline), e.g.
 *   warm: 12 files, 4.0 GiB: 3.2 GiB fetched, 820 MiB already cached,
 *     14.2 s, 230 MiB/s, 0 failed
 *   check: 12 files, 4.0 GiB, 1.0 GiB cached (25%), 0 failed
 *   evict: 12 files, 4.0 GiB freed, 0 failed
 * plus ", N staged (not uploaded yet: left alone)" and ", interrupted"
 * when they apply, and for --pin and --unpin "; pinned now: 1.0 GiB of
 * 40 GiB allowed". The rate is of the bytes fetched.
 */
void warm_report_summary_line(enum warm_mode mode, const struct warm_totals *totals,
                              double seconds, bool interrupted, char *buf, size_t cap);

/* TEXT as a JSON string (quotes, escapes; bytes that are not UTF-8 as
 * U+FFFD) on OUT. */
void warm_report_json_string(FILE *out, const char *text);

#endif /* S3CFS_WARM_REPORT_H */
