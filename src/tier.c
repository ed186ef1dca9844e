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
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "tier_format.h"

struct tier_put {
    struct tier_put *next;
    char *key;                   /* the origin's */
    char *etag;
    uint64_t index;
    char *data;                  /* TIER_HEADER_LEN free bytes, then len */
    uint32_t len;
};

struct tier {
    struct s3_client *s3;
    char *prefix;
    char *origin;
    uint32_t block_size;
    uint64_t queue_limit;
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

int tier_get_block(struct tier *tier, const char *key, const char *etag,
                   uint64_t index, uint32_t len, char *scratch,
                   const char **data)
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

/* ------------------------------------------------------------ writing */

static void put_free(struct tier_put *put)
{
    if (put == NULL)
        return;
    free(put->key);
    free(put->etag);
    free(put->data);
    free(put);
}

bool tier_wants(struct tier *tier, uint32_t len)
{
    pthread_mutex_lock(&tier->lock);
    bool wants = !tier->stopping && !skipped_now_locked(tier) &&
                 tier->queued_bytes + len <= tier->queue_limit;
    pthread_mutex_unlock(&tier->lock);
    return wants;
}

void tier_offer_block(struct tier *tier, const char *key, const char *etag,
                      uint64_t index, char *buffer, uint32_t len)
{
    struct tier_put *put = calloc(1, sizeof(*put));

    if (put != NULL) {
        put->key = strdup(key);
        put->etag = strdup(etag);
        put->index = index;
        put->data = buffer;
        put->len = len;
    } else {
        free(buffer);
    }
    if (put == NULL || put->key == NULL || put->etag == NULL) {
        atomic_fetch_add(&tier->put_dropped, 1);
        put_free(put);
        return;
    }
    pthread_mutex_lock(&tier->lock);
    bool take = !tier->stopping && !skipped_now_locked(tier) &&
                tier->queued_bytes + len <= tier->queue_limit;
    if (take) {
        if (tier->tail != NULL)
            tier->tail->next = put;
        else
            tier->head = put;
        tier->tail = put;
        tier->queued_bytes += len;
        pthread_cond_signal(&tier->work);
    }
    pthread_mutex_unlock(&tier->lock);
    if (!take) {
        atomic_fetch_add(&tier->put_dropped, 1);
        put_free(put);
    }
}

/* Write one queued block: framed, If-None-Match: *. */
static void write_block(struct tier *tier, struct tier_put *put)
{
    struct tier_block_id id = {tier->origin, put->key, put->etag,
                               tier->block_size, put->index};
    struct s3_put_meta meta = {.if_none_match = atomic_load(&tier->conditional)};
    struct s3_body body = {.data = put->data, .fd = -1,
                           .length = (uint64_t)put->len + TIER_HEADER_LEN};
    char *tier_key = NULL;
    int err = tier_frame_header(&id, put->data + TIER_HEADER_LEN, put->len,
                                (unsigned char *)put->data);

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
        if (skipped)
            atomic_fetch_add(&tier->put_dropped, 1);
        else
            write_block(tier, put);
        uint32_t len = put->len;
        put_free(put);
        pthread_mutex_lock(&tier->lock);
        tier->writing--;
        tier->queued_bytes -= len;
        if (tier->head == NULL && tier->writing == 0)
            pthread_cond_broadcast(&tier->idle);
    }
    pthread_mutex_unlock(&tier->lock);
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
    if (conf->s3 == NULL || conf->origin == NULL || conf->block_size == 0)
        return EINVAL;
    tier = calloc(1, sizeof(*tier));
    if (tier == NULL)
        return ENOMEM;
    tier->s3 = conf->s3;
    tier->prefix = strdup(conf->prefix != NULL ? conf->prefix : "");
    tier->origin = strdup(conf->origin);
    tier->block_size = conf->block_size;
    tier->queue_limit = conf->queue_bytes ? conf->queue_bytes : TIER_QUEUE_BYTES;
    tier->skip_first = conf->skip_seconds > 0 ? conf->skip_seconds
                                              : TIER_SKIP_SECONDS;
    tier->skip_pause = tier->skip_first;
    atomic_init(&tier->conditional, true);
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
        put_free(put);
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
    pthread_mutex_lock(&tier->lock);
    out->queued_bytes = tier->queued_bytes;
    out->skipping = skipped_now_locked(tier);
    pthread_mutex_unlock(&tier->lock);
    s3_client_stats(tier->s3, &out->s3);
}
