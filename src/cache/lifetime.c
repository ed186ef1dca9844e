/*
 * lifetime.c - the counters since the cache was created (see lifetime.h).
 * The note "lifetime" holds "since SECONDS" and "NAME TOTAL" lines; a
 * name this version does not count is kept as it was (a newer version
 * wrote it), so that going back and forth between versions loses nothing.
 */
#include "config.h"

#include "cache/lifetime.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "cache/cache.h"

#define NOTE "lifetime"
#define NAME_MAX_LEN 64

/* The counters that count events: summed across mounts. */
static const char *const counted[] = {
    "bytes_read", "bytes_from_cache", "bytes_from_bucket", "bytes_to_bucket",
    "bytes_read_around_cache", "cache_evicted_blocks", "cache_corrupt_blocks",
    "requests_get", "requests_head", "requests_list", "requests_put",
    "requests_delete", "requests_copy", "requests_multipart", "retries",
    "failures", "bytes_written", "uploads_completed", "upload_failures",
    "upload_retries", "copies_on_write",
    /* with -o shared_cache */
    "bytes_from_tier", "bytes_to_tier", "tier_bad_blocks", "tier_errors",
    "tier_requests_get", "tier_requests_head", "tier_requests_list",
    "tier_requests_put", "tier_requests_delete", "tier_requests_copy",
    "tier_requests_multipart",
};
#define COUNTED (sizeof(counted) / sizeof(counted[0]))

struct other {                  /* a name of the note not counted here */
    char name[NAME_MAX_LEN];
    uint64_t value;
};

struct lifetime {
    struct cache *cache;
    lifetime_counters_fn counters;
    void *arg;
    uint64_t since;
    uint64_t before[COUNTED];   /* what earlier mounts counted */
    struct other *others;
    size_t other_count;
    pthread_mutex_t lock;       /* stopping, and one store at a time */
    pthread_cond_t wake;
    bool stopping;
    pthread_t thread;
    bool started;
    double period;              /* seconds between stores */
    bool store_failing;         /* the last store failed (logged once) */
};

bool lifetime_counts(const char *name)
{
    for (size_t i = 0; i < COUNTED; i++)
        if (strcmp(name, counted[i]) == 0)
            return true;
    return false;
}

static int counted_index(const char *name)
{
    for (size_t i = 0; i < COUNTED; i++)
        if (strcmp(name, counted[i]) == 0)
            return (int)i;
    return -1;
}

/* Each "NAME VALUE" line of TEXT with an unsigned VALUE, to VISIT. */
static void each_line(const char *text,
                      void (*visit)(void *arg, const char *name, uint64_t value),
                      void *arg)
{
    const char *line = text;

    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char name[NAME_MAX_LEN], rest[32];
        const char *space = memchr(line, ' ', len);
        if (space != NULL && (size_t)(space - line) < sizeof(name) &&
            len - (size_t)(space - line) - 1 < sizeof(rest)) {
            size_t name_len = (size_t)(space - line);
            size_t rest_len = len - name_len - 1;
            memcpy(name, line, name_len);
            name[name_len] = '\0';
            memcpy(rest, space + 1, rest_len);
            rest[rest_len] = '\0';
            char *stop;
            errno = 0;
            unsigned long long value = strtoull(rest, &stop, 10);
            if (rest[0] >= '0' && rest[0] <= '9' && *stop == '\0' && errno == 0)
                visit(arg, name, value);
        }
        line = end != NULL ? end + 1 : NULL;
    }
}

static void load_line(void *arg, const char *name, uint64_t value)
{
    struct lifetime *lifetime = arg;
    int i = counted_index(name);

    if (strcmp(name, "since") == 0) {
        lifetime->since = value;
    } else if (i >= 0) {
        lifetime->before[i] = value;
    } else {
        struct other *more = realloc(lifetime->others,
                                     (lifetime->other_count + 1) * sizeof(*more));
        if (more == NULL)
            return;
        lifetime->others = more;
        snprintf(more[lifetime->other_count].name, NAME_MAX_LEN, "%s", name);
        more[lifetime->other_count++].value = value;
    }
}

struct now {
    uint64_t values[COUNTED];
};

static void now_line(void *arg, const char *name, uint64_t value)
{
    struct now *now = arg;
    int i = counted_index(name);

    if (i >= 0)
        now->values[i] = value;
}

/* The totals: earlier mounts' plus TEXT's (a sum past 2^64 stays there). */
static void totals(const struct lifetime *lifetime, const char *text,
                   uint64_t out[COUNTED])
{
    struct now now = {{0}};

    each_line(text, now_line, &now);
    for (size_t i = 0; i < COUNTED; i++) {
        uint64_t sum = lifetime->before[i] + now.values[i];
        out[i] = sum < lifetime->before[i] ? UINT64_MAX : sum;
    }
}

/* Store the totals of the counters now (LOCK held). */
static void store_locked(struct lifetime *lifetime)
{
    char *text = NULL, *note = NULL;
    size_t size = 0;
    uint64_t sums[COUNTED];

    if (lifetime->counters(lifetime->arg, &text) != 0)
        return;
    totals(lifetime, text, sums);
    FILE *out = open_memstream(&note, &size);
    if (out != NULL) {
        fprintf(out, "since %" PRIu64 "\n", lifetime->since);
        for (size_t i = 0; i < COUNTED; i++)
            fprintf(out, "%s %" PRIu64 "\n", counted[i], sums[i]);
        for (size_t i = 0; i < lifetime->other_count; i++)
            fprintf(out, "%s %" PRIu64 "\n", lifetime->others[i].name,
                    lifetime->others[i].value);
        if (fclose(out) == 0) {
            int err = cache_note_put(lifetime->cache, NOTE, note);
            if (err != 0 && !lifetime->store_failing)
                log_warn("cannot store the counters since the cache was "
                         "created: %s (logged once until a store succeeds)",
                         strerror(err));
            lifetime->store_failing = err != 0;
        }
    }
    free(note);
    free(text);
}

static void *store_main(void *arg)
{
    struct lifetime *lifetime = arg;
    struct timespec until;

    pthread_mutex_lock(&lifetime->lock);
    while (!lifetime->stopping) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        double whole = (double)until.tv_sec + until.tv_nsec / 1e9 +
                       lifetime->period;
        until.tv_sec = (time_t)whole;
        until.tv_nsec = (long)((whole - (double)until.tv_sec) * 1e9);
        int rc = 0;
        while (!lifetime->stopping && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&lifetime->wake, &lifetime->lock, &until);
        if (!lifetime->stopping)
            store_locked(lifetime);
    }
    pthread_mutex_unlock(&lifetime->lock);
    return NULL;
}

int lifetime_start(struct cache *cache, double period,
                   lifetime_counters_fn counters, void *arg,
                   struct lifetime **out)
{
    pthread_condattr_t attr;
    struct lifetime *lifetime = calloc(1, sizeof(*lifetime));
    char *note = NULL;

    *out = NULL;
    if (lifetime == NULL)
        return ENOMEM;
    lifetime->cache = cache;
    lifetime->counters = counters;
    lifetime->arg = arg;
    lifetime->period = period > 0 ? period : LIFETIME_STORE_SECONDS;
    pthread_mutex_init(&lifetime->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&lifetime->wake, &attr);
    pthread_condattr_destroy(&attr);
    int err = cache_note_get(cache, NOTE, &note);
    if (err == 0)
        each_line(note, load_line, lifetime);
    else if (err != ENOENT)
        log_warn("cannot read the counters since the cache was created (%s): "
                 "counting again from now", strerror(err));
    free(note);
    if (lifetime->since == 0) {
        /* stored at once: a daemon killed in its first minute keeps the
         * day counting began */
        lifetime->since = (uint64_t)time(NULL);
        pthread_mutex_lock(&lifetime->lock);
        store_locked(lifetime);
        pthread_mutex_unlock(&lifetime->lock);
    }
    err = pthread_create(&lifetime->thread, NULL, store_main, lifetime);
    if (err != 0) {
        lifetime_stop(&lifetime);
        return err;
    }
    lifetime->started = true;
    *out = lifetime;
    return 0;
}

int lifetime_append(struct lifetime *lifetime, const char *text, char **out)
{
    uint64_t sums[COUNTED];
    char *buf = NULL;
    size_t size = 0;
    FILE *stream = open_memstream(&buf, &size);

    *out = NULL;
    if (stream == NULL)
        return ENOMEM;
    totals(lifetime, text, sums);
    fputs(text, stream);
    for (size_t i = 0; i < COUNTED; i++)
        fprintf(stream, "lifetime_%s %" PRIu64 "\n", counted[i], sums[i]);
    fprintf(stream, "lifetime_since %" PRIu64 "\n", lifetime->since);
    if (fclose(stream) != 0) {
        free(buf);
        return ENOMEM;
    }
    *out = buf;
    return 0;
}

void lifetime_stop(struct lifetime **lifetimep)
{
    struct lifetime *lifetime = *lifetimep;

    if (lifetime == NULL)
        return;
    if (lifetime->started) {
        pthread_mutex_lock(&lifetime->lock);
        lifetime->stopping = true;
        pthread_cond_signal(&lifetime->wake);
        pthread_mutex_unlock(&lifetime->lock);
        pthread_join(lifetime->thread, NULL);
        pthread_mutex_lock(&lifetime->lock);
        store_locked(lifetime);
        pthread_mutex_unlock(&lifetime->lock);
    }
    pthread_cond_destroy(&lifetime->wake);
    pthread_mutex_destroy(&lifetime->lock);
    free(lifetime->others);
    free(lifetime);
    *lifetimep = NULL;
}
