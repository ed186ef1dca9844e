/*
 * cache_policy.c - what the block cache keeps (see cache.h, "Bounds"):
 * room for a block about to be filled, made by evicting the least
 * recently used blocks, probation first, until the size and free-space
 * bounds hold; and recency: reads noted in memory (cache_add_touch), then
 * written once a second by the flusher thread (cache_flush), which moves
 * touched blocks to the recent end of their segment, promotes re-used
 * probation blocks and demotes the oldest protected ones beyond their
 * share. Eviction passes by the blocks held by reads not yet answered
 * (cache.h, "Holds"): they are the most recently used, whatever the
 * buffered recency says. The data path (cache.c) calls in through
 * cache_make_room(), cache_release_room() and cache_add_touch();
 * cache_dir.c starts and stops the flusher. cache_reserve_disk()
 * (cache.h) is the same room making for the write path's staging files:
 * free space only. Layouts and locking rules: cache_internal.h.
 */
#include "config.h"

#include "cache/cache_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"

/* The largest block record: its header and a checksum per piece. */
#define BLOCK_RECORD_MAX (sizeof(struct block_record) + \
    (CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE) * sizeof(uint64_t))

/* ------------------------------------------------------------ eviction */

struct victim {
    uint8_t segment;
    uint64_t id;
    uint64_t block;
    uint32_t len;
};

struct victim_scan {
    struct victim *victims;
    size_t count;
    size_t max;
    struct cache *passing_held;  /* not NULL: blocks it holds are passed
                                    by (eviction; demotion takes them) */
};

static int collect_victim(void *arg, const void *key, size_t key_len,
                          const void *value, size_t value_len)
{
    struct victim_scan *scan = arg;
    const unsigned char *bytes = key;
    (void)value;
    (void)value_len;
    if (key_len != sizeof(struct recency_key) || scan->count == scan->max ||
        bytes[0] >= SEGMENT_PINNED)
        return -1; /* (pinned blocks are never victims, nor demoted) */
    struct victim victim = {
        .segment = bytes[0],
        .id = get_be64(bytes + 9),
        .block = get_be64(bytes + 17),
    };
    /* a block in the pipe of a read not yet answered is the most recently
     * used of all, whatever its tick says (touches wait up to a second) */
    if (scan->passing_held != NULL &&
        cache_block_held(scan->passing_held, victim.id, victim.block))
        return 0;
    scan->victims[scan->count++] = victim;
    return 0;
}

static int find_first_block(void *arg, const void *key, size_t key_len,
                            const void *value, size_t value_len)
{
    uint64_t *first_id = arg;
    (void)value;
    (void)value_len;
    *first_id = key_len == 16 ? get_be64(key) : UINT64_MAX;
    return -1;
}

/* Whether object ID has no block left in the index. */
static bool object_empty_txn(struct db_txn *txn, uint64_t id)
{
    struct block_key start = block_key(id, 0);
    uint64_t first_id = UINT64_MAX;
    db_scan(txn, DB_BLOCKS, start.bytes, sizeof(start.bytes), find_first_block,
            &first_id);
    return first_id != id;
}

/* Forget the record of an object that has no blocks and no open handle;
 * true when its data file should go. */
static bool retire_object_txn(struct cache *cache, struct db_txn *txn, uint64_t id)
{
    unsigned char id_key[8];
    const void *value;
    size_t len;
    struct object_record record;

    pthread_mutex_lock(&cache->lock);
    bool open = cache_object_is_open_locked(cache, id);
    cache_unlock(cache);
    if (open || !object_empty_txn(txn, id))
        return false;
    put_be64(id_key, id);
    if (db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len) == 0 &&
        len >= sizeof(record)) {
        memcpy(&record, value, sizeof(record));
        const void *mapped;
        size_t mapped_len;
        uint64_t mapped_id = 0;
        if (db_get(txn, DB_KEYS, record.key_hash, sizeof(record.key_hash),
                   &mapped, &mapped_len) == 0 && mapped_len == sizeof(mapped_id))
            memcpy(&mapped_id, mapped, sizeof(mapped_id));
        if (mapped_id == id)
            db_del(txn, DB_KEYS, record.key_hash, sizeof(record.key_hash));
        cache_pin_release_txn(txn, id);
        db_del(txn, DB_OBJECTS, id_key, sizeof(id_key));
    }
    return true;
}

/* Drop up to EVICT_BATCH of the least recently used blocks, probation
 * first, until WANT bytes are free. Returns the bytes freed (0: nothing
 * left to evict) and an errno in *err. */
static uint64_t evict_some(struct cache *cache, uint64_t want, int *err)
{
    struct victim victims[EVICT_BATCH];
    struct victim_scan scan = {.victims = victims, .max = EVICT_BATCH,
                               .passing_held = cache};
    uint64_t retired[EVICT_BATCH];
    size_t retired_count = 0;
    struct db_txn *txn = NULL;
    struct usage_record usage;
    uint64_t freed = 0;
    size_t dropped = 0;

    *err = db_txn_begin(cache->db, true, &txn);
    if (*err != 0)
        return 0;
    *err = cache_usage_get(txn, &usage);
    if (*err == 0)
        *err = db_scan(txn, DB_RECENCY, NULL, 0, collect_victim, &scan);
    for (size_t i = 0; *err == 0 && i < scan.count && freed < want; i++) {
        *err = cache_drop_block_txn(txn, victims[i].id, victims[i].block,
                                    &usage, &victims[i].len);
        if (*err == ENOENT) {
            *err = 0;
            continue;
        }
        freed += account(victims[i].len);
        dropped = i + 1;
    }
    /* objects left without blocks go, unless someone has them open */
    for (size_t i = 0; *err == 0 && i < dropped; i++) {
        bool seen = false;
        for (size_t k = 0; k < retired_count; k++)
            seen = seen || retired[k] == victims[i].id;
        if (!seen && retire_object_txn(cache, txn, victims[i].id))
            retired[retired_count++] = victims[i].id;
    }
    if (*err == 0)
        *err = cache_usage_commit(cache, &txn, &usage);
    db_txn_abort(&txn);
    if (*err != 0)
        return 0;

    for (size_t i = 0; i < dropped; i++) {
        bool gone = false;
        for (size_t k = 0; k < retired_count; k++)
            gone = gone || retired[k] == victims[i].id;
        if (!gone && victims[i].len > 0)
            cache_punch_block(cache, victims[i].id, victims[i].block, victims[i].len);
    }
    for (size_t k = 0; k < retired_count; k++)
        cache_unlink_data_file(cache, retired[k]);
    atomic_fetch_add(&cache->evicted_blocks, dropped);
    return freed;
}

int cache_evict_key(struct cache *cache, const char *key, uint64_t *freed)
{
    unsigned char hash[KEY_HASH_LEN];
    struct db_txn *txn = NULL;
    struct usage_record usage;
    uint64_t id = 0, *blocks = NULL;
    uint32_t *lens = NULL;
    size_t count = 0;
    bool retired = false;
    const void *value;
    size_t len;
    int err = cache_key_hash(cache->bucket, key, hash);

    *freed = 0;
    if (err != 0)
        return err;
    pthread_mutex_lock(&cache->evict_lock);
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    if (err == 0)
        err = db_get(txn, DB_KEYS, hash, sizeof(hash), &value, &len);
    if (err == ENOENT || (err == 0 && len != sizeof(id))) {
        err = 0; /* nothing cached */
        goto out;
    }
    if (err == 0) {
        bool was_pinned = false;
        memcpy(&id, value, sizeof(id));
        err = cache_pin_clear_txn(txn, id, &was_pinned); /* evicted: unpinned */
        if (err == 0)
            err = cache_object_blocks_txn(txn, id, &blocks, &count);
    }
    if (err == 0 && count > 0 && (lens = calloc(count, sizeof(*lens))) == NULL)
        err = ENOMEM;
    for (size_t i = 0; err == 0 && i < count; i++) {
        err = cache_drop_block_txn(txn, id, blocks[i], &usage, &lens[i]);
        if (err == ENOENT)
            err = 0;
        *freed += lens[i];
    }
    if (err == 0)
        retired = retire_object_txn(cache, txn, id);
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
    if (err != 0)
        goto out;
    /* committed: give the disk space back (outside the transaction) */
    if (retired) {
        cache_unlink_data_file(cache, id);
    } else {
        for (size_t i = 0; i < count; i++)
            if (lens[i] > 0)
                cache_punch_block(cache, id, blocks[i], lens[i]);
    }
out:
    db_txn_abort(&txn);
    pthread_mutex_unlock(&cache->evict_lock);
    if (err != 0)
        *freed = 0;
    free(blocks);
    free(lens);
    return err;
}

/* Bytes the filesystem must keep free, and what it has now. */
static void disk_space(const struct cache *cache, uint64_t *free_bytes,
                       uint64_t *keep_free)
{
    struct statvfs st;

    *free_bytes = UINT64_MAX;
    *keep_free = cache->min_free_bytes;
    if (statvfs(cache->dir, &st) != 0)
        return;
    *free_bytes = (uint64_t)st.f_bavail * st.f_frsize;
    uint64_t by_ratio = (uint64_t)(cache->min_free_ratio *
                                   (double)st.f_blocks * (double)st.f_frsize);
    if (by_ratio > *keep_free)
        *keep_free = by_ratio;
}

/* The line of cache_disk_full(), FREE_BYTES and KEEP_FREE as
 * disk_space() said them. */
static void say_disk_full(struct cache *cache, uint64_t free_bytes,
                          uint64_t keep_free)
{
    if (log_due(&cache->full_logged))
        log_error("cache directory %s is full: %llu KiB free, %llu KiB kept "
                  "free (cache_min_free); writes fail with ENOSPC and reads "
                  "bypass the cache until there is room", cache->dir,
                  (unsigned long long)(free_bytes >> 10),
                  (unsigned long long)(keep_free >> 10));
}

void cache_disk_full(struct cache *cache)
{
    uint64_t free_bytes, keep_free;

    disk_space(cache, &free_bytes, &keep_free);
    say_disk_full(cache, free_bytes, keep_free);
}

/* A + B, saturating (min_free may be set absurdly high on purpose). */
static uint64_t add_capped(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Evict until NEED more bytes fit under cache_size and DISK_NEED more
 * bytes can be written leaving min_free, then reserve NEED (checked and
 * reserved under evict_lock, so concurrent fills cannot overshoot
 * together). ENOSPC if that cannot be done. */
int cache_make_room(struct cache *cache, uint64_t need, uint64_t disk_need)
{
    int err = 0;

    pthread_mutex_lock(&cache->evict_lock);
    for (;;) {
        uint64_t free_bytes, keep_free;
        pthread_mutex_lock(&cache->lock);
        uint64_t committed = cache->usage.bytes[0] + cache->usage.bytes[1] +
                             cache->reserved;
        cache_unlock(cache);
        disk_space(cache, &free_bytes, &keep_free);
        uint64_t wanted_size = add_capped(committed, need);
        uint64_t wanted_free = add_capped(keep_free, disk_need);
        /* only room asked for under cache_size makes it a reason to
         * evict: cache_reserve_disk() is about free space alone */
        uint64_t over_size = need > 0 && wanted_size > cache->size_limit
                                 ? wanted_size - cache->size_limit : 0;
        uint64_t over_disk = free_bytes < wanted_free
                                 ? wanted_free - free_bytes : 0;
        uint64_t want = over_size > over_disk ? over_size : over_disk;
        if (want == 0) {
            pthread_mutex_lock(&cache->lock);
            cache->reserved += need;
            cache_unlock(cache);
            break;
        }
        if (evict_some(cache, want, &err) == 0) {
            /* (cache_reserve_disk()'s callers say it when they give up:
             * the writer asks for more than it needs first) */
            if (err == 0 && over_disk > 0 && need > 0)
                say_disk_full(cache, free_bytes, keep_free);
            if (err == 0)
                err = ENOSPC;
            break;
        }
    }
    pthread_mutex_unlock(&cache->evict_lock);
    return err;
}

int cache_reserve_disk(struct cache *cache, uint64_t bytes)
{
    /* nothing reserved under cache_size: staging bytes are not cached */
    return cache_make_room(cache, 0, bytes);
}

void cache_release_room(struct cache *cache, uint64_t bytes)
{
    pthread_mutex_lock(&cache->lock);
    cache->reserved -= bytes;
    cache_unlock(cache);
}

/* ------------------------------------------------------------ recency */

void cache_add_touch(struct cache *cache, uint64_t id, uint64_t block,
                     bool reuse)
{
    pthread_mutex_lock(&cache->lock);
    if (cache->touch_count < TOUCHES_MAX) /* recency is best effort */
        cache->touches[cache->touch_count++] = (struct touch){id, block, reuse};
    cache_unlock(cache);
}

/* Read the record of block (ID, BLOCK) into SCRATCH (BLOCK_RECORD_MAX
 * bytes): *len gets its length, or 0 when that cannot be a block record.
 * ENOENT when the block is not recorded. */
static int load_block_record_txn(struct db_txn *txn, uint64_t id,
                                 uint64_t block, char *scratch, size_t *len)
{
    struct block_key key = block_key(id, block);
    const void *value;
    int err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, len);

    if (err != 0)
        return err;
    if (*len < sizeof(struct block_record) || *len > BLOCK_RECORD_MAX)
        *len = 0;
    else
        memcpy(scratch, value, *len);
    return 0;
}

/* Give block (ID, BLOCK), whose record (LEN bytes) is in SCRATCH and
 * whose recency key is filed under segment FROM, a new tick at the most
 * recent end of segment TO; its bytes move with it when FROM and TO
 * differ. */
static int move_block_txn(struct db_txn *txn, uint64_t id, uint64_t block,
                          uint8_t from, uint8_t to, struct usage_record *usage,
                          char *scratch, size_t len)
{
    struct block_key key = block_key(id, block);
    struct block_record record;
    uint64_t tick;
    int err;

    memcpy(&record, scratch, sizeof(record));
    struct recency_key old_key = recency_key(from, record.tick, id, block);
    db_del(txn, DB_RECENCY, old_key.bytes, sizeof(old_key.bytes));
    err = cache_next_tick(txn, &tick);
    if (err != 0)
        return err;
    if (to != from) {
        uint64_t bytes = account(record.len);
        usage_sub(usage, from, bytes);
        usage->bytes[usage_slot(to)] += bytes;
    }
    record.segment = to;
    record.tick = tick;
    memcpy(scratch, &record, sizeof(record));
    struct recency_key new_key = recency_key(to, tick, id, block);
    err = db_put(txn, DB_RECENCY, new_key.bytes, sizeof(new_key.bytes), "", 0);
    if (err == 0)
        err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), scratch, len);
    return err;
}

int cache_segment_move_txn(struct db_txn *txn, uint64_t id, uint64_t block,
                           uint8_t to, struct usage_record *usage)
{
    char *scratch = malloc(BLOCK_RECORD_MAX);
    struct block_record record;
    size_t len = 0;
    int err = scratch == NULL ? ENOMEM
                              : load_block_record_txn(txn, id, block, scratch, &len);

    if (err == 0 && len == 0)
        err = EIO;
    if (err == 0) {
        memcpy(&record, scratch, sizeof(record));
        if (record.segment != to)
            err = move_block_txn(txn, id, block, record.segment, to, usage,
                                 scratch, len);
    }
    free(scratch);
    return err;
}

/* Move a touched block to the most recent end of its segment, promoting
 * a re-used probation block. */
static int apply_touch_txn(struct db_txn *txn, const struct touch *touch,
                           struct usage_record *usage, char *scratch)
{
    struct block_record record;
    size_t len;
    int err = load_block_record_txn(txn, touch->id, touch->block, scratch,
                                    &len);

    if (err == ENOENT)
        return 0; /* evicted since */
    if (err != 0 || len == 0)
        return err;
    memcpy(&record, scratch, sizeof(record));
    uint8_t to = touch->reuse && record.segment == SEGMENT_PROBATION
                     ? SEGMENT_PROTECTED : record.segment;
    return move_block_txn(txn, touch->id, touch->block, record.segment, to,
                          usage, scratch, len);
}

/* Keep the protected segment to its share: its oldest blocks go back to
 * the most recent end of probation. */
static int demote_protected_txn(struct cache *cache, struct db_txn *txn,
                                struct usage_record *usage, char *scratch)
{
    uint64_t cap = (uint64_t)(PROTECTED_SHARE * (double)cache->size_limit);
    unsigned char start[1] = {SEGMENT_PROTECTED};
    int err = 0;

    while (err == 0 && usage->bytes[SEGMENT_PROTECTED] > cap) {
        struct victim victims[EVICT_BATCH];
        struct victim_scan scan = {.victims = victims, .max = EVICT_BATCH};
        err = db_scan(txn, DB_RECENCY, start, sizeof(start), collect_victim, &scan);
        if (err != 0 || scan.count == 0)
            break;
        for (size_t i = 0; err == 0 && i < scan.count &&
                           usage->bytes[SEGMENT_PROTECTED] > cap; i++) {
            size_t len;
            err = load_block_record_txn(txn, victims[i].id, victims[i].block,
                                        scratch, &len);
            if (err == 0 && len == 0)
                err = EIO; /* a damaged record: stop rather than rescan it forever */
            if (err != 0)
                break;
            err = move_block_txn(txn, victims[i].id, victims[i].block,
                                 SEGMENT_PROTECTED, SEGMENT_PROBATION, usage,
                                 scratch, len);
        }
    }
    return err;
}

int cache_flush(struct cache *cache)
{
    struct touch *touches = NULL;
    size_t count;
    struct db_txn *txn = NULL;
    struct usage_record usage;
    char *scratch = NULL;
    int err = 0;

    pthread_mutex_lock(&cache->lock);
    count = cache->touch_count;
    if (count > 0) {
        touches = malloc(count * sizeof(*touches));
        if (touches != NULL) {
            memcpy(touches, cache->touches, count * sizeof(*touches));
            cache->touch_count = 0;
        }
    }
    cache_unlock(cache);
    if (count > 0 && touches == NULL)
        return ENOMEM;
    if (count == 0)
        return 0;
    scratch = malloc(BLOCK_RECORD_MAX);
    if (scratch == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    for (size_t i = 0; err == 0 && i < count; i++)
        err = apply_touch_txn(txn, &touches[i], &usage, scratch);
    if (err == 0)
        err = demote_protected_txn(cache, txn, &usage, scratch);
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
out:
    db_txn_abort(&txn);
    free(scratch);
    free(touches);
    return err;
}

void *cache_flusher_main(void *arg)
{
    struct cache *cache = arg;

    pthread_mutex_lock(&cache->lock);
    while (!cache->stopping) {
        /* (flusher_wake waits on the monotonic clock) */
        struct timespec until = clock_monotonic_after(FLUSH_INTERVAL_S);
        pthread_cond_timedwait(&cache->flusher_wake, &cache->lock, &until);
        if (cache->stopping)
            break;
        cache_unlock(cache);
        int err = cache_flush(cache);
        if (err != 0)
            log_warn("cache: recency update failed: %s", strerror(err));
        pthread_mutex_lock(&cache->lock);
    }
    cache_unlock(cache);
    return NULL;
}
