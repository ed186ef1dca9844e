/*
 * lifetime.h - the counters since the cache was created: what the mounts
 * before this one counted, kept as a note of the cache (cache_note_get),
 * plus what this mount counts.
 *
 * It works on the text of the stats attribute ("name value" lines, fs.h
 * FS_STATS_XATTR), so that it needs to know only which names count
 * events (bytes, requests, blocks evicted...) rather than describe a
 * state (cache_used_bytes, uploads_pending): those are summed across
 * mounts and shown as "lifetime_NAME", with "lifetime_since" (Unix
 * seconds) when counting began: the cache's creation, or the first mount
 * of a version that counts them.
 *
 * The totals are stored every LIFETIME_STORE_SECONDS by a thread of its
 * own and when the mount ends: a daemon killed loses at most that much.
 * A cache index rebuilt after a system crash starts again from zero.
 */
#ifndef S3CFS_LIFETIME_H
#define S3CFS_LIFETIME_H

#include <stdbool.h>

#define LIFETIME_STORE_SECONDS 60

struct cache;
struct lifetime;

/* The text of the counters now ("name value" lines, malloc'd): 0 or an
 * errno. */
typedef int (*lifetime_counters_fn)(void *arg, char **text);

/*
 * Read what earlier mounts counted from CACHE (nothing, for a new cache:
 * then the start is stored at once) and start storing the totals of
 * COUNTERS(ARG) every PERIOD seconds (0: LIFETIME_STORE_SECONDS). 0 or an
 * errno (a note that cannot be read is logged and counting starts over).
 */
int lifetime_start(struct cache *cache, double period,
                   lifetime_counters_fn counters, void *arg,
                   struct lifetime **out);

/* TEXT (the counters now) with the lifetime lines appended, into *OUT
 * (malloc'd). 0 or ENOMEM. */
int lifetime_append(struct lifetime *lifetime, const char *text, char **out);

/* Store the totals one last time, stop the thread, free; *LIFETIME =
 * NULL. Safe on NULL. */
void lifetime_stop(struct lifetime **lifetime);

/* Whether NAME is one the lifetime lines sum (exposed for the tests and
 * for `s3cachefs stats`). */
bool lifetime_counts(const char *name);

#endif /* S3CFS_LIFETIME_H */
