/*
 * stats_text.h - the counters of a mount, parsed from the text of its
 * user.s3cachefs.stats attribute (fs.c, fs_stats_text(); the counters are
 * listed in man s3cachefs, COUNTERS).
 *
 * The text is one line per counter, "name value": a name of lower-case
 * letters, digits and '_', one space, an unsigned integer or a decimal
 * ("0.5000"). Counters are kept in the daemon's order, unknown names
 * included, so that a newer daemon's counters show up in --json without
 * a change here. Pure: no I/O.
 */
#ifndef S3CFS_STATS_TEXT_H
#define S3CFS_STATS_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STATS_TEXT_MAX_COUNTERS 256
#define STATS_TEXT_MAX_NAME 64     /* with its NUL */
#define STATS_TEXT_MAX_VALUE 32    /* with its NUL */

struct stats_counter {
    char name[STATS_TEXT_MAX_NAME];
    char text[STATS_TEXT_MAX_VALUE]; /* as written: also a valid JSON number */
    bool integer;                    /* TEXT is an unsigned integer... */
    uint64_t value;                  /* ...whose value is this */
    double real;                     /* TEXT as a double, whatever it is */
};

struct stats_text {
    struct stats_counter *counters;  /* owned; COUNT of them */
    size_t count;
};

/*
 * Parse TEXT (LEN bytes, need not end in NUL) into *OUT, replacing what
 * it held (free it with stats_text_free() in every case). Returns 0;
 * EPROTO for a text that is not counters, with one sentence in ERR naming
 * the line; ENOMEM.
 */
int stats_text_parse(const char *text, size_t len, struct stats_text *out,
                     char *err, size_t errlen);

/* The counter NAME, or NULL. Valid as long as STATS is. */
const struct stats_counter *stats_text_find(const struct stats_text *stats,
                                            const char *name);

/* The integer counter NAME into *VALUE: 0; ENOENT if absent, EINVAL if it
 * is not an integer (*VALUE is then 0). */
int stats_text_get(const struct stats_text *stats, const char *name,
                   uint64_t *value);

/* Free what stats_text_parse() allocated; safe twice. */
void stats_text_free(struct stats_text *stats);

#endif /* S3CFS_STATS_TEXT_H */
