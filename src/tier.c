/*
 * tier.c - the shared cache tier (see tier.h).
 *
 * tier->lock guards the write queue (a FIFO of offered blocks and the
 * bytes it holds), the writers' state and the skip state (skip_until, the
 * current pause). The counters are atomics. No lock is held during a
 * request.
 */
#include "config.h"

#include "tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "tier_format.h"

struct tier_put {
    struct tier_put *next;
    struct cache_object *object; /* where the block is cached */
    char *key;                   /* the origin's */
    char *etag;
    uint64_t index;
    uint32_t len;
};

struct tier {
    struct s3_client *s3;
    struct cache *cache;
    char *prefix;
    char *origin;
    uint32_t block_size;
    uint64_t queue_limit;        /* blocks */
    uint64_t queued_blocks;
    double skip_first;

    pthread_mutex_t lock;
    pthread_cond_t work;         /* a block was queued, or stopping */
    pthread_cond_t idle;         /* the queue emptied and no one writes */
    struct tier_put *head, *tail;
    uint64_t queued_bytes;
    unsigned writing;            /* writers inside a PUT */
    bool stopping;
    double skip_until;           /* monotonic seconds; 0: not skipped */
    double skip_pause;           /* the pause the next failure sets */
    pthread_t writers[TIER_WRITERS];
    unsigned writer_count;

    atomic_bool conditional;     /* writes carry If-None-Match: * (until
                                    the server refuses it) */
    atomic_int lease_mode;       /* -1 not known yet, 0 off, 1 on */
    atomic_bool probing;         /* a thread is finding lease_mode out */
    _Atomic uint64_t leases, lease_waits, lease_waits_met;
    _Atomic uint64_t hits, hit_bytes, misses, bad, errors, skipped;
    _Atomic uint64_t puts, put_bytes, put_exists, put_dropped;
};

/* ---------------------------------------------------------- skipping */

static bool skipped_now_locked(const struct tier *tier)
{
    return tier->skip_until > 0 && clock_monotonic_seconds() < tier->skip_until;
}

static bool skipped_now(struct tier *tier)
{
    pthread_mutex_lock(&tier->lock);
    bool skipped = skipped_now_locked(tier);
    pthread_mutex_unlock(&tier->lock);
    return skipped;
}

/* A request to the tier failed with ERR: skip it for a while (longer
 * each time it keeps failing). */
static void note_failure(struct tier *tier, const char *what, int err)
{
    atomic_fetch_add(&tier->errors, 1);
    pthread_mutex_lock(&tier->lock);
    bool already = skipped_now_locked(tier);
    double pause = tier->skip_pause;
    if (!already) {
        tier->skip_until = clock_monotonic_seconds() + pause;
        tier->skip_pause = pause * 2 < TIER_SKIP_MAX ? pause * 2 : TIER_SKIP_MAX;
    }
    pthread_mutex_unlock(&tier->lock);
    if (!already)
        log_warn("shared cache: %s failed (%s); reading from the origin "
                 "only for %.0f s", what, strerror(err), pause);
}

/* A request to the tier worked: the next failure pauses briefly again. */
static void note_success(struct tier *tier)
{
    pthread_mutex_lock(&tier->lock);
    bool back = tier->skip_until > 0 && !skipped_now_locked(tier);
    if (back) {
        tier->skip_until = 0;
        tier->skip_pause = tier->skip_first;
    }
    pthread_mutex_unlock(&tier->lock);
    if (back)
        log_info("shared cache: answering again");
}

/* ------------------------------------------------------------ reading */

/* tier_get_block(); a miss is counted only with COUNT_MISS (a wait for
 * a block another node fetches asks several times). */
static int get_block(struct tier *tier, const char *key, const char *etag,
                     uint64_t index, uint32_t len, char *scratch,
                     const char **data, bool count_miss)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, index};
    char *tier_key = NULL;
    size_t got = 0;

    *data = NULL;
    if (skipped_now(tier)) {
        atomic_fetch_add(&tier->skipped, 1);
        return ENOENT;
    }
    int err = tier_block_key(tier->prefix, &id, &tier_key);
    if (err != 0)
        return err;
    err = s3_get_object_range(tier->s3, tier_key, 0,
                              (size_t)len + TIER_HEADER_LEN, NULL, scratch,
                              &got, NULL);
    if (err == ENOENT || err == EINVAL) {
        /* (EINVAL: a range past the end, an empty object) */
        if (count_miss)
            atomic_fetch_add(&tier->misses, 1);
        note_success(tier);
        err = ENOENT;
    } else if (err != 0) {
        note_failure(tier, "a read", err);
    } else if (tier_frame_check(&id, scratch, got, len) != 0) {
        atomic_fetch_add(&tier->bad, 1);
        log_warn("shared cache: block %llu of '%s' there does not verify; "
                 "read from the origin", (unsigned long long)index, key);
        err = EBADMSG;
    } else {
        atomic_fetch_add(&tier->hits, 1);
        atomic_fetch_add(&tier->hit_bytes, len);
        note_success(tier);
        *data = scratch + TIER_HEADER_LEN;
    }
    free(tier_key);
    return err;
}

int tier_get_block(struct tier *tier, const char *key, const char *etag,
                   uint64_t index, uint32_t len, char *scratch,
                   const char **data)
{
    return get_block(tier, key, etag, index, len, scratch, data, true);
}

/* ------------------------------------------------------------- leases */

#define LEASE_POLL_FIRST 0.02         /* seconds between GETs while waiting, */
#define LEASE_POLL_MAX 0.25           /* doubling up to this */
#define LEASE_TEXT_MAX 64

/* Whether the server refuses a second conditional write of one key: two
 * writes of a probe object, then its delete. 1 (leases work), 0 (it
 * ignores or refuses the condition), -1 (the tier failed: ask later). */
static int probe_leases(struct tier *tier)
{
    struct s3_put_meta meta = {.if_none_match = true};
    struct s3_body body = {.data = "probe\n", .fd = -1, .length = 6};
    struct timespec now;
    char *key = NULL;

    clock_gettime(CLOCK_REALTIME, &now);
    if (asprintf(&key, "%s%sprobe-%ld-%ld%09ld", tier->prefix, TIER_ROOT,
                 (long)getpid(), (long)now.tv_sec, now.tv_nsec) < 0)
        return -1;
    int first = s3_put_object(tier->s3, key, &body, &meta, NULL);
    int second = first == 0 ? s3_put_object(tier->s3, key, &body, &meta, NULL)
                            : first;
    if (first == 0 || second == 0)
        s3_delete_object(tier->s3, key);
    free(key);
    if (first == 0 && second == ESTALE)
        return 1;
    if (first == ENOSYS || second == ENOSYS || (first == 0 && second == 0)) {
        log_info("shared cache: the server has no conditional writes, so no "
                 "leases: nodes that miss a block at the same moment each "
                 "fetch it from the origin");
        return 0;
    }
    note_failure(tier, "a write", first != 0 ? first : second);
    return -1;
}

/* 1 when leases work (found out on first use), else 0. */
static int leases_on(struct tier *tier)
{
    int mode = atomic_load(&tier->lease_mode);

    if (mode >= 0)
        return mode;
    if (atomic_exchange(&tier->probing, true))
        return 0;   /* another thread asks: fetch meanwhile */
    mode = probe_leases(tier);
    if (mode >= 0)
        atomic_store(&tier->lease_mode, mode);
    atomic_store(&tier->probing, false);
    return mode > 0;
}

/* Claim blocks FIRST..LAST of their group (all in one group) for
 * TIER_LEASE_SECONDS: 0, ESTALE (another node holds the lease: its text
 * in HELD, HELD_LEN bytes), or the client's errno. */
static int put_lease(struct tier *tier, const char *lease_key, uint64_t first,
                     uint64_t last, char *held, size_t held_len)
{
    struct s3_put_meta meta = {.if_none_match = true};
    char text[LEASE_TEXT_MAX];
    size_t got = 0;
    int len = snprintf(text, sizeof(text), "%.3f %llu %llu\n",
                       clock_wall_seconds() + TIER_LEASE_SECONDS,
                       (unsigned long long)first, (unsigned long long)last);
    struct s3_body body = {.data = text, .fd = -1, .length = (uint64_t)len};
    int err = s3_put_object(tier->s3, lease_key, &body, &meta, NULL);

    if (err != ESTALE)
        return err;
    err = s3_get_object_range(tier->s3, lease_key, 0, held_len - 1, NULL, held,
                              &got, NULL);
    held[err == 0 ? got : 0] = '\0';
    return err == 0 ? ESTALE : err;
}

/* Claim FIRST..LAST of the group of FIRST (LAST within it); on ESTALE,
 * *expires (wall seconds), *from and *to say what the other lease
 * covers (an unreadable one: expired). 0, ESTALE or an errno. */
static int claim_group(struct tier *tier, const struct tier_block_id *id,
                       uint64_t first, uint64_t last, double *expires,
                       uint64_t *from, uint64_t *to)
{
    char held[LEASE_TEXT_MAX];
    char *lease_key = NULL;
    struct tier_block_id group = *id;
    int err;

    group.index = first;
    err = tier_lease_key(tier->prefix, &group, TIER_LEASE_BLOCKS, &lease_key);
    for (int attempt = 0; err == 0; attempt++) {
        err = put_lease(tier, lease_key, first, last, held, sizeof(held));
        if (err != ESTALE)
            break;
        unsigned long long a = 0, b = 0;
        *expires = 0;
        if (sscanf(held, "%lf %llu %llu", expires, &a, &b) != 3)
            *expires = 0;
        *from = a;
        *to = b;
        double left = *expires - clock_wall_seconds();
        if ((left > 0 && left <= TIER_LEASE_SECONDS + 1) || attempt == 1)
            break;
        /* past its time (its node died or is stuck): take it over */
        err = s3_delete_object(tier->s3, lease_key);
    }
    free(lease_key);
    if (err == ESTALE) {
        /* (a lease taken over by someone else at once counts as theirs
         * only while it runs) */
        double left = *expires - clock_wall_seconds();
        if (!(left > 0 && left <= TIER_LEASE_SECONDS + 1))
            *from = 1, *to = 0;     /* covers nothing: fetch */
    }
    return err;
}

enum tier_claim tier_claim_blocks(struct tier *tier, const char *key,
                                  const char *etag, uint64_t first,
                                  uint64_t last, uint64_t *covered,
                                  double *until)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, first};
    uint64_t group_last = first - first % TIER_LEASE_BLOCKS + TIER_LEASE_BLOCKS - 1;
    double expires = 0;
    uint64_t from = 0, to = 0;

    if (skipped_now(tier) || !leases_on(tier))
        return TIER_FETCH;
    int err = claim_group(tier, &id, first, last < group_last ? last : group_last,
                          &expires, &from, &to);
    if (err == 0) {
        atomic_fetch_add(&tier->leases, 1);
        note_success(tier);
        if (last > group_last) {
            /* the run goes on into the next group: claim that part too
             * (if another node has it, the overlap is fetched twice) */
            double ignored_expires;
            uint64_t ignored_from, ignored_to;
            if (claim_group(tier, &id, group_last + 1, last, &ignored_expires,
                            &ignored_from, &ignored_to) == 0)
                atomic_fetch_add(&tier->leases, 1);
        }
        return TIER_FETCH;
    }
    if (err != ESTALE) {
        note_failure(tier, "a lease", err);
        return TIER_FETCH;
    }
    if (first < from || first > to)
        return TIER_FETCH;  /* its lease is on other blocks of the group */
    *covered = to;
    *until = clock_monotonic_seconds() + (expires - clock_wall_seconds());
    return TIER_AWAIT;
}

int tier_await_block(struct tier *tier, const char *key, const char *etag,
                     uint64_t index, uint32_t len, char *scratch,
                     const char **data, double until)
{
    double pause = LEASE_POLL_FIRST;
    int err;

    atomic_fetch_add(&tier->lease_waits, 1);
    for (;;) {
        err = get_block(tier, key, etag, index, len, scratch, data, false);
        if (err != ENOENT || skipped_now(tier))
            break;
        double left = until - clock_monotonic_seconds();
        if (left <= 0)
            break;
        double wait = pause < left ? pause : left;
        struct timespec nap = {.tv_sec = (time_t)wait,
                               .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&nap, NULL);
        pause = pause * 2 < LEASE_POLL_MAX ? pause * 2 : LEASE_POLL_MAX;
    }
    if (err == 0)
        atomic_fetch_add(&tier->lease_waits_met, 1);
    return err;
}

/* ------------------------------------------------------------ writing */

static void put_free(struct tier *tier, struct tier_put *put)
{
    if (put == NULL)
        return;
    cache_object_close(tier->cache, &put->object);
    free(put->key);
    free(put->etag);
    free(put);
}

void tier_offer_block(struct tier *tier, struct cache_object *object,
                      const char *key, const char *etag, uint64_t index)
{
    pthread_mutex_lock(&tier->lock);
    bool room = !tier->stopping && !skipped_now_locked(tier) &&
                tier->queued_blocks < tier->queue_limit;
    pthread_mutex_unlock(&tier->lock);
    struct tier_put *put = room ? calloc(1, sizeof(*put)) : NULL;
    if (put != NULL) {
        put->key = strdup(key);
        put->etag = strdup(etag);
        put->index = index;
        put->len = cache_object_block_len(object, index);
        put->object = cache_object_ref(tier->cache, object);
    }
    if (put == NULL || put->key == NULL || put->etag == NULL ||
        put->object == NULL) {
        atomic_fetch_add(&tier->put_dropped, 1);
        put_free(tier, put);
        return;
    }
    uint32_t len = put->len;
    pthread_mutex_lock(&tier->lock);
    bool take = !tier->stopping && !skipped_now_locked(tier) &&
                tier->queued_blocks < tier->queue_limit;
    if (take) {
        if (tier->tail != NULL)
            tier->tail->next = put;
        else
            tier->head = put;
        tier->tail = put;
        tier->queued_bytes += len;
        tier->queued_blocks++;
        pthread_cond_signal(&tier->work);
    }
    pthread_mutex_unlock(&tier->lock);
    if (!take) {
        atomic_fetch_add(&tier->put_dropped, 1);
        put_free(tier, put);
    }
}

/* Write one queued block, read back from the local cache into BUFFER
 * (block_size + TIER_HEADER_LEN bytes): framed, If-None-Match: *. */
static void write_block(struct tier *tier, struct tier_put *put, char *buffer)
{
    struct tier_block_id id = {tier->origin, put->key, put->etag,
                               tier->block_size, put->index};
    struct s3_put_meta meta = {.if_none_match = atomic_load(&tier->conditional)};
    struct s3_body body = {.data = buffer, .fd = -1,
                           .length = (uint64_t)put->len + TIER_HEADER_LEN};
    char *tier_key = NULL;

    if (cache_block_read(tier->cache, put->object, put->index, 0, put->len,
                         buffer + TIER_HEADER_LEN, false) != 0) {
        atomic_fetch_add(&tier->put_dropped, 1); /* evicted meanwhile */
        return;
    }
    int err = tier_frame_header(&id, buffer + TIER_HEADER_LEN, put->len,
                                (unsigned char *)buffer);

    if (err == 0)
        err = tier_block_key(tier->prefix, &id, &tier_key);
    if (err == 0)
        err = s3_put_object(tier->s3, tier_key, &body, &meta, NULL);
    if (err == ENOSYS && meta.if_none_match) {
        /* (Swift's s3api answers 501 to If-None-Match on a PUT) */
        if (atomic_exchange(&tier->conditional, false))
            log_info("shared cache: the server does not take conditional "
                     "writes; of nodes writing one block at once the last "
                     "wins (the same bytes)");
        meta.if_none_match = false;
        err = s3_put_object(tier->s3, tier_key, &body, &meta, NULL);
    }
    if (err == 0) {
        atomic_fetch_add(&tier->puts, 1);
        atomic_fetch_add(&tier->put_bytes, put->len);
        note_success(tier);
    } else if (err == ESTALE) {
        atomic_fetch_add(&tier->put_exists, 1); /* another node was first */
        note_success(tier);
    } else {
        atomic_fetch_add(&tier->put_dropped, 1);
        note_failure(tier, "a write", err);
    }
    free(tier_key);
}

static void *writer_main(void *arg)
{
    struct tier *tier = arg;
    char *buffer = malloc((size_t)tier->block_size + TIER_HEADER_LEN);

    pthread_mutex_lock(&tier->lock);
    for (;;) {
        while (!tier->stopping && tier->head == NULL)
            pthread_cond_wait(&tier->work, &tier->lock);
        if (tier->stopping)
            break;
        struct tier_put *put = tier->head;
        tier->head = put->next;
        if (tier->head == NULL)
            tier->tail = NULL;
        bool skipped = skipped_now_locked(tier);
        tier->writing++;
        pthread_mutex_unlock(&tier->lock);
        if (skipped || buffer == NULL)
            atomic_fetch_add(&tier->put_dropped, 1);
        else
            write_block(tier, put, buffer);
        uint32_t len = put->len;
        put_free(tier, put);
        pthread_mutex_lock(&tier->lock);
        tier->writing--;
        tier->queued_bytes -= len;
        tier->queued_blocks--;
        if (tier->head == NULL && tier->writing == 0)
            pthread_cond_broadcast(&tier->idle);
    }
    pthread_mutex_unlock(&tier->lock);
    free(buffer);
    return NULL;
}

void tier_flush(struct tier *tier)
{
    pthread_mutex_lock(&tier->lock);
    while (!tier->stopping && (tier->head != NULL || tier->writing > 0))
        pthread_cond_wait(&tier->idle, &tier->lock);
    pthread_mutex_unlock(&tier->lock);
}

/* ------------------------------------------------------------ the rest */

int tier_create(const struct tier_conf *conf, struct tier **out)
{
    struct tier *tier;
    int err = 0;

    *out = NULL;
    if (conf->s3 == NULL || conf->cache == NULL || conf->origin == NULL ||
        conf->block_size == 0)
        return EINVAL;
    tier = calloc(1, sizeof(*tier));
    if (tier == NULL)
        return ENOMEM;
    tier->s3 = conf->s3;
    tier->cache = conf->cache;
    tier->prefix = strdup(conf->prefix != NULL ? conf->prefix : "");
    tier->origin = strdup(conf->origin);
    tier->block_size = conf->block_size;
    tier->queue_limit = conf->queue_blocks ? conf->queue_blocks : TIER_QUEUE_BLOCKS;
    tier->skip_first = conf->skip_seconds > 0 ? conf->skip_seconds
                                              : TIER_SKIP_SECONDS;
    tier->skip_pause = tier->skip_first;
    atomic_init(&tier->conditional, true);
    atomic_init(&tier->lease_mode, -1);
    atomic_init(&tier->probing, false);
    pthread_mutex_init(&tier->lock, NULL);
    pthread_cond_init(&tier->work, NULL);
    pthread_cond_init(&tier->idle, NULL);
    if (tier->prefix == NULL || tier->origin == NULL)
        err = ENOMEM;
    for (unsigned i = 0; err == 0 && i < TIER_WRITERS; i++) {
        err = pthread_create(&tier->writers[i], NULL, writer_main, tier);
        if (err == 0)
            tier->writer_count++;
    }
    if (err != 0) {
        tier_destroy(&tier);
        return err;
    }
    *out = tier;
    return 0;
}

void tier_destroy(struct tier **tierp)
{
    struct tier *tier = *tierp;

    if (tier == NULL)
        return;
    pthread_mutex_lock(&tier->lock);
    tier->stopping = true;
    pthread_cond_broadcast(&tier->work);
    pthread_cond_broadcast(&tier->idle);
    pthread_mutex_unlock(&tier->lock);
    for (unsigned i = 0; i < tier->writer_count; i++)
        pthread_join(tier->writers[i], NULL);
    while (tier->head != NULL) {
        struct tier_put *put = tier->head;
        tier->head = put->next;
        put_free(tier, put);
    }
    pthread_cond_destroy(&tier->idle);
    pthread_cond_destroy(&tier->work);
    pthread_mutex_destroy(&tier->lock);
    free(tier->prefix);
    free(tier->origin);
    free(tier);
    *tierp = NULL;
}

void tier_get_stats(struct tier *tier, struct tier_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->hits = atomic_load(&tier->hits);
    out->hit_bytes = atomic_load(&tier->hit_bytes);
    out->misses = atomic_load(&tier->misses);
    out->bad = atomic_load(&tier->bad);
    out->errors = atomic_load(&tier->errors);
    out->skipped = atomic_load(&tier->skipped);
    out->puts = atomic_load(&tier->puts);
    out->put_bytes = atomic_load(&tier->put_bytes);
    out->put_exists = atomic_load(&tier->put_exists);
    out->put_dropped = atomic_load(&tier->put_dropped);
    out->leases = atomic_load(&tier->leases);
    out->lease_waits = atomic_load(&tier->lease_waits);
    out->lease_waits_met = atomic_load(&tier->lease_waits_met);
    out->lease_mode = atomic_load(&tier->lease_mode);
    pthread_mutex_lock(&tier->lock);
    out->queued_bytes = tier->queued_bytes;
    out->skipping = skipped_now_locked(tier);
    pthread_mutex_unlock(&tier->lock);
    s3_client_stats(tier->s3, &out->s3);
}
