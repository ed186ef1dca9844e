/*
 * cache.c - the block cache's data path (see cache.h): object versions
 * and their handles, reading blocks back (verified piece by piece, damaged
 * ones dropped), filling blocks, statistics.
 *
 * The other parts: cache_store.c (index accessors, usage, data files:
 * what all of them build on), cache_policy.c (what stays: room,
 * eviction, recency; called from here through cache_make_room() before a
 * block is filled and cache_add_touch() after a block is read again),
 * cache_adopt.c (the write path's calls), cache_dir.c (the directory:
 * lock, state, open and close). The layouts, constants and the locking
 * rules are in cache_internal.h.
 */
#include "config.h"

#include "cache/cache_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/sigbus.h"
#include "cache/cachestat.h"

/* ------------------------------------------------------------ accessors */

void cache_get_stats(struct cache *cache, struct cache_stats *out)
{
    pthread_mutex_lock(&cache->lock);
    out->used_bytes = cache->usage.bytes[0] + cache->usage.bytes[1];
    out->protected_bytes = cache->usage.bytes[SEGMENT_PROTECTED];
    out->blocks = cache->usage.blocks;
    cache_unlock(cache);
    out->index_bytes = db_file_bytes(cache->db);
    out->pinned_bytes = 0;
    struct db_txn *txn = NULL;
    if (db_txn_begin(cache->db, false, &txn) == 0 &&
        cache_meta_get_u64(txn, "pinned", &out->pinned_bytes) != 0)
        out->pinned_bytes = 0;
    db_txn_abort(&txn);
    out->size_limit = cache->size_limit;
    out->served_bytes = atomic_load(&cache->served_bytes);
    out->unhashed_bytes = atomic_load(&cache->unhashed_bytes);
    out->stored_bytes = atomic_load(&cache->stored_bytes);
    out->evicted_blocks = atomic_load(&cache->evicted_blocks);
    out->corrupt_blocks = atomic_load(&cache->corrupt_blocks);
}

struct db *cache_index(struct cache *cache)
{
    return cache->db;
}

int cache_name_hash(const struct cache *cache, const char *name,
                    unsigned char *out)
{
    return cache_key_hash(cache->bucket, name, out);
}

uint32_t cache_block_size(const struct cache *cache)
{
    return cache->block_size;
}

/* Whether the key with HASH is cached as version (ETAG, SIZE); its id in
 * *id if so. */
static bool version_matches_txn(struct db_txn *txn, const unsigned char *hash,
                                const char *etag, uint64_t size, uint64_t *id)
{
    struct object_record record;
    unsigned char id_key[8];
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag);

    if (db_get(txn, DB_KEYS, hash, KEY_HASH_LEN, &value, &len) != 0 ||
        len != sizeof(*id))
        return false;
    memcpy(id, value, sizeof(*id));
    put_be64(id_key, *id);
    if (db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len) != 0 ||
        len != sizeof(record) + etag_len)
        return false;
    memcpy(&record, value, sizeof(record));
    return record.size == size && record.etag_len == etag_len &&
           memcmp((const char *)value + sizeof(record), etag, etag_len) == 0;
}

/* Find or create the version's id in the index. *stale_id gets the id of
 * a replaced version (0 if none), whose data file the caller removes. */
static int resolve_version(struct cache *cache, const char *key,
                           const char *etag, uint64_t size, uint64_t *id,
                           uint64_t *stale_id)
{
    unsigned char hash[KEY_HASH_LEN];
    unsigned char id_key[8];
    struct db_txn *txn = NULL;
    struct usage_record usage;
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag);
    int err;

    *stale_id = 0;
    err = cache_key_hash(cache->bucket, key, hash);
    if (err != 0)
        return err;
    /* the common case, a version already cached: a read transaction */
    if (db_txn_begin(cache->db, false, &txn) == 0) {
        bool cached = version_matches_txn(txn, hash, etag, size, id);
        db_txn_abort(&txn);
        if (cached)
            return 0;
    }
    err = db_txn_begin(cache->db, true, &txn);
    if (err != 0)
        return err;
    err = cache_usage_get(txn, &usage);
    if (err == 0)
        err = db_get(txn, DB_KEYS, hash, sizeof(hash), &value, &len);
    if (err == 0 && len == sizeof(uint64_t)) {
        memcpy(id, value, sizeof(*id));
        put_be64(id_key, *id);
        struct object_record record;
        err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
        if (err == 0 && len == sizeof(record) + etag_len) {
            memcpy(&record, value, sizeof(record));
            if (record.size == size && record.etag_len == etag_len &&
                memcmp((const char *)value + sizeof(record), etag, etag_len) == 0) {
                db_txn_abort(&txn); /* the cached version is this one */
                return 0;
            }
        }
        /* another version of the key (or a broken record): drop it */
        *stale_id = *id;
        err = cache_drop_version_txn(txn, *stale_id, &usage);
    } else if (err == ENOENT || err == 0) {
        err = 0;
    }
    if (err != 0)
        goto out;

    err = cache_meta_get_u64(txn, "next_id", id);
    if (err == 0)
        err = cache_meta_put_u64(txn, "next_id", ++*id);
    struct object_record *record = calloc(1, sizeof(*record) + etag_len);
    if (record == NULL)
        err = ENOMEM;
    if (err == 0) {
        record->size = size;
        memcpy(record->key_hash, hash, sizeof(hash));
        record->etag_len = (uint16_t)etag_len;
        memcpy((char *)(record + 1), etag, etag_len);
        put_be64(id_key, *id);
        err = db_put(txn, DB_OBJECTS, id_key, sizeof(id_key), record,
                     sizeof(*record) + etag_len);
    }
    free(record);
    if (err == 0)
        err = db_put(txn, DB_KEYS, hash, sizeof(hash), id, sizeof(*id));
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
out:
    db_txn_abort(&txn);
    return err;
}

int cache_object_open(struct cache *cache, const char *key, const char *etag,
                      uint64_t size, struct cache_object **out)
{
    struct cache_object *object = NULL;
    uint64_t id = 0, stale_id = 0;
    int err;

    *out = NULL;
    if (strlen(etag) > 1024)
        return EINVAL;
    err = resolve_version(cache, key, etag, size, &id, &stale_id);
    if (err != 0)
        return err;
    if (stale_id != 0)
        cache_retire_dropped_version(cache, stale_id);

    pthread_mutex_lock(&cache->lock);
    struct cache_object probe = {.id = id};
    void *found = tfind(&probe, &cache->open_objects, cache_compare_object_id);
    if (found != NULL) {
        object = *(struct cache_object **)found;
        object->refs++;
    }
    cache_unlock(cache);
    if (object != NULL) {
        *out = object;
        return 0;
    }

    object = calloc(1, sizeof(*object));
    if (object == NULL)
        return ENOMEM;
    object->id = id;
    object->size = size;
    object->block_size = cache->block_size;
    object->refs = 1;
    object->fd = -1;
    object->key = strdup(key);
    if (object->key == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = cache_open_data_file(cache, id, &object->fd);
    if (err != 0)
        goto out;
    pthread_mutex_lock(&cache->lock);
    found = tfind(object, &cache->open_objects, cache_compare_object_id);
    if (found != NULL) { /* another thread opened it meanwhile */
        struct cache_object *other = *(struct cache_object **)found;
        other->refs++;
        cache_unlock(cache);
        close(object->fd);
        free(object->key);
        free(object);
        *out = other;
        return 0;
    }
    if (tsearch(object, &cache->open_objects, cache_compare_object_id) == NULL)
        err = ENOMEM;
    cache_unlock(cache);
out:
    if (err != 0) {
        if (object->fd >= 0)
            close(object->fd);
        free(object->key);
        free(object);
        object = NULL;
    }
    *out = object;
    return err;
}

struct cache_object *cache_object_ref(struct cache *cache,
                                      struct cache_object *object)
{
    pthread_mutex_lock(&cache->lock);
    object->refs++;
    cache_unlock(cache);
    return object;
}

void cache_object_close(struct cache *cache, struct cache_object **objectp)
{
    struct cache_object *object = *objectp;

    if (object == NULL)
        return;
    pthread_mutex_lock(&cache->lock);
    bool last = --object->refs == 0;
    if (last)
        tdelete(object, &cache->open_objects, cache_compare_object_id);
    cache_unlock(cache);
    if (last) {
        close(object->fd);
        if (object->replaced)
            cache_unlink_data_file(cache, object->id);
        free(object->key);
        free(object);
    }
    *objectp = NULL;
}

uint64_t cache_object_id(const struct cache_object *object)
{
    return object->id;
}

uint64_t cache_object_blocks(const struct cache_object *object)
{
    return (object->size + object->block_size - 1) / object->block_size;
}

uint32_t cache_object_block_len(const struct cache_object *object,
                                uint64_t block)
{
    uint64_t start = block * object->block_size;
    if (start >= object->size)
        return 0;
    uint64_t left = object->size - start;
    return left < object->block_size ? (uint32_t)left : object->block_size;
}

/* ------------------------------------------------------------- reading */

bool cache_block_present(struct cache *cache, struct cache_object *object,
                         uint64_t block)
{
    struct db_txn *txn = NULL;
    struct block_key key = block_key(object->id, block);
    const void *value;
    size_t len;
    bool present = false;

    if (db_txn_begin(cache->db, false, &txn) == 0) {
        present = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value,
                         &len) == 0;
        db_txn_abort(&txn);
    }
    return present;
}

/* Sums the lengths of one object's block records (db_scan visitor). */
struct cached_sum {
    uint64_t id;
    uint64_t bytes;
};

static int sum_cached_block(void *arg, const void *key, size_t key_len,
                            const void *value, size_t value_len)
{
    struct cached_sum *sum = arg;
    struct block_record record;

    if (key_len != sizeof(struct block_key) || get_be64(key) != sum->id)
        return -1; /* past the object's blocks */
    if (value_len >= sizeof(record)) {
        memcpy(&record, value, sizeof(record));
        sum->bytes += record.len;
    }
    return 0;
}

static int cached_bytes_txn(struct db_txn *txn, uint64_t id, uint64_t *bytes)
{
    struct cached_sum sum = {.id = id};
    struct block_key start = block_key(id, 0);
    int err = db_scan(txn, DB_BLOCKS, start.bytes, sizeof(start.bytes),
                      sum_cached_block, &sum);

    *bytes = err == 0 ? sum.bytes : 0;
    return err;
}

int cache_object_cached_bytes(struct cache *cache, struct cache_object *object,
                              uint64_t *bytes)
{
    struct db_txn *txn = NULL;
    int err = db_txn_begin(cache->db, false, &txn);

    *bytes = 0;
    if (err != 0)
        return err;
    err = cached_bytes_txn(txn, object->id, bytes);
    db_txn_abort(&txn);
    return err;
}

/* Whether version ID is flagged pinned. */
static bool pinned_txn(struct db_txn *txn, uint64_t id)
{
    unsigned char id_key[8];
    const void *value;
    size_t len;
    struct object_record record;

    put_be64(id_key, id);
    if (db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len) != 0 ||
        len < sizeof(record))
        return false;
    memcpy(&record, value, sizeof(record));
    return (record.flags & OBJECT_PINNED) != 0;
}

int cache_version_cached_bytes(struct cache *cache, const char *key,
                               const char *etag, uint64_t size, uint64_t *bytes,
                               bool *pinned)
{
    unsigned char hash[KEY_HASH_LEN];
    struct db_txn *txn = NULL;
    uint64_t id = 0;
    int err = cache_key_hash(cache->bucket, key, hash);

    *bytes = 0;
    if (pinned != NULL)
        *pinned = false;
    if (err != 0)
        return err;
    err = db_txn_begin(cache->db, false, &txn);
    if (err != 0)
        return err;
    if (version_matches_txn(txn, hash, etag, size, &id)) {
        err = cached_bytes_txn(txn, id, bytes);
        if (pinned != NULL)
            *pinned = pinned_txn(txn, id);
    }
    db_txn_abort(&txn);
    return err;
}

uint64_t cache_pin_max(const struct cache *cache)
{
    return (uint64_t)(PIN_SHARE * (double)cache->size_limit);
}

int cache_pin_version(struct cache *cache, const char *key, const char *etag,
                      uint64_t size, bool pin, uint64_t *pinned_total)
{
    unsigned char hash[KEY_HASH_LEN], id_key[8];
    struct db_txn *txn = NULL;
    struct usage_record usage;
    uint64_t id = 0, stale_id = 0, total = 0, *blocks = NULL;
    size_t count = 0;
    bool changed = false;
    const void *value;
    size_t len;
    int err;

    *pinned_total = 0;
    if (strlen(etag) > 1024)
        return EINVAL;
    err = cache_key_hash(cache->bucket, key, hash);
    /* a pin makes the version first, so that what is fetched after it is
     * pinned as it comes (a warm of a file near the cache's size does
     * not evict its own beginning) */
    if (err == 0 && pin) {
        err = resolve_version(cache, key, etag, size, &id, &stale_id);
        if (err == 0 && stale_id != 0)
            cache_retire_dropped_version(cache, stale_id);
    }
    if (err != 0)
        return err;
    pthread_mutex_lock(&cache->evict_lock);
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    if (err == 0)
        err = cache_meta_get_u64(txn, "pinned", &total);
    if (err != 0)
        goto out;
    if (!version_matches_txn(txn, hash, etag, size, &id))
        goto out; /* not cached (unpin: nothing to do; pin: evicted since) */
    put_be64(id_key, id);
    err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
    if (err == 0 && len < sizeof(struct object_record))
        err = EIO;
    if (err != 0)
        goto out;
    struct object_record record;
    memcpy(&record, value, sizeof(record));
    bool is_pinned = (record.flags & OBJECT_PINNED) != 0;
    if (pin && !is_pinned) {
        if (total + account(size) > cache_pin_max(cache)) {
            err = ENOSPC;
            goto out;
        }
        char *copy = malloc(len);
        if (copy == NULL) {
            err = ENOMEM;
            goto out;
        }
        memcpy(copy, value, len);
        record.flags |= OBJECT_PINNED;
        memcpy(copy, &record, sizeof(record));
        err = db_put(txn, DB_OBJECTS, id_key, sizeof(id_key), copy, len);
        free(copy);
        total += account(size);
        if (err == 0)
            err = cache_meta_put_u64(txn, "pinned", total);
        changed = true;
    } else if (!pin && is_pinned) {
        bool was = false;
        err = cache_pin_clear_txn(txn, id, &was);
        total -= total > account(size) ? account(size) : total;
        changed = true;
    }
    /* its blocks move with it: out of eviction's reach, or back at the
     * recent end of probation */
    if (err == 0 && changed)
        err = cache_object_blocks_txn(txn, id, &blocks, &count);
    for (size_t i = 0; err == 0 && i < count; i++) {
        err = cache_segment_move_txn(txn, id, blocks[i],
                                     pin ? SEGMENT_PINNED : SEGMENT_PROBATION,
                                     &usage);
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
out:
    db_txn_abort(&txn);
    pthread_mutex_unlock(&cache->evict_lock);
    free(blocks);
    *pinned_total = total;
    return err;
}

/* Drop a damaged block, unless it was replaced since we read its record. */
static void drop_damaged_block(struct cache *cache, struct cache_object *object,
                               uint64_t block, uint64_t tick, const char *why)
{
    struct db_txn *txn = NULL;
    struct block_key key = block_key(object->id, block);
    struct usage_record usage;
    const void *value;
    size_t len;
    uint32_t dropped_len = 0;
    bool dropped = false;

    if (db_txn_begin(cache->db, true, &txn) != 0)
        return;
    int err = cache_usage_get(txn, &usage);
    if (err == 0)
        err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &len);
    if (err == 0 && len >= sizeof(struct block_record) &&
        ((const struct block_record *)value)->tick != tick)
        err = ESTALE; /* replaced since: not ours to drop */
    if (err == 0)
        err = cache_drop_block_txn(txn, object->id, block, &usage, &dropped_len);
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
    if (err == 0)
        dropped = true;
    db_txn_abort(&txn);
    if (dropped) {
        if (dropped_len > 0)
            cache_punch_block(cache, object->id, block, dropped_len);
        atomic_fetch_add(&cache->corrupt_blocks, 1);
        log_warn("cache: block %llu of '%s' is damaged (%s); fetching it again",
                 (unsigned long long)block, object->key, why);
    }
}

/* Take BOUNCE out of cache->bounces; call with `lock` held. */
static void unlist_bounce_locked(struct cache *cache, struct bounce *bounce)
{
    if (bounce->prev != NULL)
        bounce->prev->next = bounce->next;
    else
        cache->bounces = bounce->next;
    if (bounce->next != NULL)
        bounce->next->prev = bounce->prev;
}

void cache_free_bounce(void *arg)
{
    struct bounce *bounce = arg;
    struct cache *cache = bounce->cache;

    pthread_mutex_lock(&cache->lock);
    unlist_bounce_locked(cache, bounce);
    cache_unlock(cache);
    free(bounce);
}

/* This thread's read buffer, at least LEN bytes (it grows to the largest
 * read the thread makes: FUSE reads are at most 1 MiB whatever the block
 * size). */
static char *bounce_buffer(struct cache *cache, size_t len)
{
    struct bounce *bounce = pthread_getspecific(cache->bounce_key);

    if (bounce != NULL && bounce->size >= len)
        return bounce->data;
    size_t size = len < CACHE_PIECE_SIZE * 4 ? CACHE_PIECE_SIZE * 4 : len;
    struct bounce *fresh = malloc(sizeof(*fresh) + size);
    if (fresh == NULL)
        return NULL;
    fresh->cache = cache;
    fresh->size = size;
    fresh->prev = NULL;
    pthread_mutex_lock(&cache->lock);
    if (bounce != NULL) /* replace the smaller one in the list */
        unlist_bounce_locked(cache, bounce);
    fresh->next = cache->bounces;
    if (cache->bounces != NULL)
        cache->bounces->prev = fresh;
    cache->bounces = fresh;
    cache_unlock(cache);
    free(bounce);
    pthread_setspecific(cache->bounce_key, fresh);
    return fresh->data;
}

/* The block record of BLOCK (its pieces' sums into SUMS): 0, ENOENT
 * (none, or a damaged one, dropped), or the index's errno. */
static int block_record_get(struct cache *cache, struct cache_object *object,
                            uint64_t block, struct block_record *record,
                            uint64_t *sums)
{
    struct db_txn *txn = NULL;
    struct block_key key = block_key(object->id, block);
    const void *value;
    size_t value_len;
    bool damaged = false;
    int err = db_txn_begin(cache->db, false, &txn);

    if (err != 0)
        return err;
    err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &value_len);
    memset(record, 0, sizeof(*record));
    if (err == 0 && value_len >= sizeof(*record)) {
        memcpy(record, value, sizeof(*record));
        uint32_t pieces = pieces_of(record->len);
        damaged = value_len != sizeof(*record) + pieces * sizeof(uint64_t) ||
                  record->len != cache_object_block_len(object, block);
        if (!damaged && sums != NULL)
            memcpy(sums, (const char *)value + sizeof(*record),
                   pieces * sizeof(uint64_t));
    } else if (err == 0) {
        damaged = true;
    }
    db_txn_abort(&txn);
    if (damaged) {
        drop_damaged_block(cache, object, block, record->tick, "bad index record");
        return ENOENT;
    }
    return err;
}

/* The whole pieces that bytes [OFFSET, OFFSET+LEN) of a block of
 * BLOCK_LEN bytes lie in (LEN > 0, OFFSET + LEN <= BLOCK_LEN): the
 * bytes a read checks. */
struct piece_span {
    uint32_t first;              /* first piece */
    uint32_t last;               /* last piece */
    uint32_t start;              /* their bytes in the block: [start, end) */
    uint32_t end;
};

static struct piece_span piece_span(uint32_t offset, uint32_t len,
                                    uint32_t block_len)
{
    struct piece_span span;

    span.first = offset / CACHE_PIECE_SIZE;
    span.last = (offset + len - 1) / CACHE_PIECE_SIZE;
    span.start = span.first * CACHE_PIECE_SIZE;
    span.end = (span.last + 1) * CACHE_PIECE_SIZE;
    if (span.end > block_len)
        span.end = block_len;
    return span;
}

/* Whether BYTES, the bytes of SPAN, hash to the pieces' SUMS. */
static bool piece_span_matches(const struct piece_span *span, const char *bytes,
                               const uint64_t *sums)
{
    for (uint32_t piece = span->first; piece <= span->last; piece++) {
        uint32_t from = piece * CACHE_PIECE_SIZE - span->start;
        uint32_t piece_len = piece == span->last ? span->end - span->start - from
                                                 : CACHE_PIECE_SIZE;
        if (XXH3_64bits(bytes + from, piece_len) != sums[piece])
            return false;
    }
    return true;
}

int cache_block_read(struct cache *cache, struct cache_object *object,
                     uint64_t block, uint32_t offset, uint32_t len, char *buf,
                     bool reuse)
{
    struct block_record record;
    uint64_t sums[CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE];
    char *bounce = NULL;
    int err;

    if (len == 0)
        return 0;
    err = block_record_get(cache, object, block, &record, sums);
    if (err != 0)
        return err;
    if ((uint64_t)offset + len > record.len)
        return EINVAL;

    /* read and verify the pieces the range touches */
    struct piece_span span = piece_span(offset, len, record.len);
    uint32_t span_len = span.end - span.start;
    /* whole pieces are read and checked in the caller's buffer (it gets
     * nothing unless they all match); others go through the bounce buffer */
    bool direct = span.start == offset && span.end == offset + len;
    bounce = direct ? buf : bounce_buffer(cache, span_len);
    if (bounce == NULL)
        return ENOMEM;
    ssize_t got = pread(object->fd, bounce, span_len,
                        (off_t)(block * cache->block_size + span.start));
    if (got < 0)
        return errno;
    if ((uint32_t)got != span_len) {
        drop_damaged_block(cache, object, block, record.tick, "data file too short");
        return ENOENT;
    }
    if (!piece_span_matches(&span, bounce, sums)) {
        drop_damaged_block(cache, object, block, record.tick, "checksum mismatch");
        return ENOENT;
    }
    if (!direct)
        memcpy(buf, bounce + (offset - span.start), len);
    atomic_fetch_add(&cache->served_bytes, len);
    if (reuse)
        cache_add_touch(cache, object->id, block, true);
    return 0;
}

/* ------------------------------------------------- blocks just filled */

/*
 * A spliced read checks its pieces where they lie in the page cache, a
 * second hash of bytes already hashed as they arrived. It is what finds
 * a block damaged on the disk, and a page that has never been written
 * back and read again cannot be: it holds what write(2) put there. So a
 * block this process filled (its commit noted here, with the tick its
 * record got) whose record still has that tick, and whose pages are all
 * dirty or under writeback (cachestat(2), asked after the splice took
 * its references), is served without that hash. A clean page may have
 * been dropped and read back from the disk since: it is hashed, as are
 * blocks the table forgot (a slot per block, the last filler wins),
 * blocks of an earlier mount, and every block where the kernel has no
 * cachestat (before Linux 6.5) or will not answer. A block once found
 * with a clean page is forgotten (fresh_block_forget()): its pages may be
 * read back from the disk from then on, whatever they look like later.
 */
static unsigned fresh_slot(uint64_t id, uint64_t block)
{
    return (unsigned)((id * 0x9e3779b97f4a7c15ull + block) % FRESH_SLOTS);
}

/* BLOCK of object ID was just committed with TICK by this process. */
static void fresh_block_note(struct cache *cache, uint64_t id, uint64_t block,
                             uint64_t tick)
{
    struct fresh_block *slot = &cache->fresh[fresh_slot(id, block)];

    pthread_mutex_lock(&cache->fresh_lock);
    *slot = (struct fresh_block){id, block, tick, true};
    pthread_mutex_unlock(&cache->fresh_lock);
}

/* Whether this process committed BLOCK of object ID with TICK, and has
 * not forgotten it. */
static bool fresh_block_is(struct cache *cache, uint64_t id, uint64_t block,
                           uint64_t tick)
{
    const struct fresh_block *slot = &cache->fresh[fresh_slot(id, block)];
    bool found;

    pthread_mutex_lock(&cache->fresh_lock);
    found = slot->used && slot->id == id && slot->block == block &&
            slot->tick == tick;
    pthread_mutex_unlock(&cache->fresh_lock);
    return found;
}

/* BLOCK of object ID, committed with TICK, has pages that are clean: it
 * is never taken for fresh again (until filled again), and its next
 * reads ask nothing of the kernel. */
static void fresh_block_forget(struct cache *cache, uint64_t id,
                               uint64_t block, uint64_t tick)
{
    struct fresh_block *slot = &cache->fresh[fresh_slot(id, block)];

    pthread_mutex_lock(&cache->fresh_lock);
    if (slot->used && slot->id == id && slot->block == block &&
        slot->tick == tick)
        slot->used = false;
    pthread_mutex_unlock(&cache->fresh_lock);
}

/* Whether every page of [OFFSET, OFFSET + LEN) of FD is in the page
 * cache dirty, or every one under writeback: not clean, so not read back
 * from the disk since it was last written. False when the kernel cannot
 * say (then it is never asked again). A folio that is dirty and under
 * writeback at once counts in both figures, so a mix of the two is not
 * trusted (hashed instead). */
static bool pages_unwritten(int fd, uint64_t offset, uint64_t len)
{
    static atomic_bool unsupported;
    struct cachestat_span span = {offset, len};
    struct cachestat_pages counts;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

    if (len == 0 || atomic_load_explicit(&unsupported, memory_order_relaxed))
        return false;
    if (cachestat_query(fd, &span, &counts) != 0) {
        if (errno == ENOSYS || errno == EPERM)
            atomic_store_explicit(&unsupported, true, memory_order_relaxed);
        return false;
    }
    uint64_t pages = (offset + len - 1) / page - offset / page + 1;
    return counts.nr_cache == pages &&
           (counts.nr_dirty == pages || counts.nr_writeback == pages);
}

int cache_block_splice(struct cache *cache, struct cache_object *object,
                       uint64_t block, uint32_t offset, uint32_t len,
                       int pipe_write, bool reuse, struct cache_holds *holds)
{
    struct block_record record, again;
    uint64_t sums[CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE];
    off_t block_start = (off_t)(block * cache->block_size);
    void *map = MAP_FAILED;
    size_t map_len = 0;
    size_t moved = 0;
    bool fresh = false;
    struct stat st;
    int err;

    if (len == 0)
        return 0;
    /* 0. held before its record is read: a drop committed before this
     * shows there, and one committed after punches nothing until the
     * answer has left (cache_holds_release()) */
    err = cache_hold_block(cache, object->id, block, holds);
    if (err != 0)
        return err;
    err = block_record_get(cache, object, block, &record, sums);
    if (err == 0 && (uint64_t)offset + len > record.len)
        err = EINVAL;
    if (err != 0)
        goto out;
    struct piece_span span = piece_span(offset, len, record.len);
    if (fstat(object->fd, &st) != 0) {
        err = errno;
        goto out;
    }
    if ((uint64_t)st.st_size < (uint64_t)block_start + span.end) {
        drop_damaged_block(cache, object, block, record.tick, "data file too short");
        err = ENOENT;
        goto out;
    }

    /* 1. the bytes into the pipe: references to the data file's pages,
     * no copy (their page cache pages stay what the pipe holds; held, the
     * block is not punched until the answer has left) */
    loff_t at = block_start + offset;
    while (moved < len) {
        ssize_t done = splice(object->fd, &at, pipe_write, NULL, len - moved,
                              SPLICE_F_NONBLOCK);
        if (done <= 0) {
            err = done == 0 ? EIO : errno == EAGAIN ? ENOBUFS : errno;
            goto out;
        }
        moved += (size_t)done;
    }
    /* 2. the pieces they lie in, hashed where they are (a mapping of the
     * page cache: no copy), unless they are the bytes this process just
     * wrote, still as written (see "blocks just filled" above) */
    if (fresh_block_is(cache, object->id, block, record.tick)) {
        fresh = pages_unwritten(object->fd, (uint64_t)block_start + span.start,
                                span.end - span.start);
        if (!fresh)
            fresh_block_forget(cache, object->id, block, record.tick);
    }
    if (!fresh) {
        map_len = span.end - span.start;
        map = mmap(NULL, map_len, PROT_READ, MAP_SHARED | MAP_POPULATE,
                   object->fd, block_start + span.start);
        if (map == MAP_FAILED) {
            err = errno;
            goto out;
        }
        /* (a page the kernel cannot give, as a file cut short meanwhile
         * or a disk's read error, reads as zeros here instead of killing
         * the daemon with SIGBUS: sigbus.h) */
        struct sigbus_guard guard;
        sigbus_guard_begin(&guard, map, map_len);
        bool matches = piece_span_matches(&span, map, sums);
        bool faulted = sigbus_guard_end(&guard);
        if (faulted || !matches) {
            drop_damaged_block(cache, object, block, record.tick,
                               faulted ? "unreadable (SIGBUS)"
                                       : "checksum mismatch");
            err = EAGAIN;
            goto out;
        }
    }
    /* 3. still the same record: nothing dropped or punched the block
     * between the splice and the hash, so the pages in the pipe are the
     * pages hashed (a punch comes only after its record is gone). The
     * same length and checksums, not the same tick: a read of the block
     * by another thread moves its tick (recency), and that is no change
     * of its bytes (taking it for one sent a GET for a cached block) */
    uint64_t sums_again[CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE];
    err = block_record_get(cache, object, block, &again, sums_again);
    if (err == 0 &&
        (again.len != record.len ||
         memcmp(sums_again + span.first, sums + span.first,
                (size_t)(span.last - span.first + 1) * sizeof(sums[0])) != 0))
        err = ENOENT;
    /* unhashed bytes need the very record whose fill wrote them: another
     * tick is a touch (rare in the read right after a fetch) or a drop
     * and a refill, whose pages the pipe may not hold; read again */
    if (err == 0 && fresh && again.tick != record.tick)
        err = ENOENT;
    if (err == ENOENT)
        err = EAGAIN;
out:
    if (map != MAP_FAILED)
        munmap(map, map_len);
    if (moved == 0)
        cache_hold_undo(holds); /* (the pipe has none of its pages) */
    if (err != 0)
        return moved > 0 && err != ENOBUFS ? EAGAIN : err;
    atomic_fetch_add(&cache->served_bytes, len);
    if (fresh)
        atomic_fetch_add(&cache->unhashed_bytes, len);
    if (reuse)
        cache_add_touch(cache, object->id, block, true);
    return 0;
}

/* ------------------------------------------------------------ writing */

int cache_fill_begin(struct cache *cache, struct cache_object *object,
                     uint64_t block, struct cache_fill **out)
{
    struct cache_fill *fill = NULL;
    uint32_t len = cache_object_block_len(object, block);
    int err;

    *out = NULL;
    if (len == 0)
        return EINVAL;
    err = cache_make_room(cache, account(len), account(len));
    if (err != 0)
        return err;
    fill = calloc(1, sizeof(*fill));
    if (fill == NULL) {
        cache_release_room(cache, account(len));
        return ENOMEM;
    }
    fill->cache = cache;
    fill->object = object;
    fill->block = block;
    fill->len = len;
    fill->reserved = (uint32_t)account(len);
    fill->piece_state = XXH3_createState();
    fill->sums = calloc(pieces_of(len), sizeof(uint64_t));
    if (fill->piece_state == NULL || fill->sums == NULL) {
        cache_release_room(cache, fill->reserved);
        XXH3_freeState(fill->piece_state);
        free(fill->sums);
        free(fill);
        return ENOMEM;
    }
    XXH3_64bits_reset(fill->piece_state);
    /* the block dropped while a read held it: the punch put off for its
     * range is the fill's (it writes that range), not the release's */
    fill->took_punch = cache_hold_take_punch(cache, object->id, block);
    pthread_mutex_lock(&cache->lock);
    object->refs++; /* the fill keeps the object (and its fd) alive */
    cache_unlock(cache);
    *out = fill;
    return 0;
}

/* Write LEN bytes at the block's byte AT from BYTES: 0 or an errno. */
static int fill_pwrite(struct cache_fill *fill, const char *bytes, size_t len,
                       uint32_t at)
{
    off_t base = (off_t)(fill->block * fill->cache->block_size);

    while (len > 0) {
        ssize_t done = pwrite(fill->object->fd, bytes, len, base + at);
        if (done < 0)
            return errno;
        if (done == 0)
            return EIO;
        bytes += done;
        len -= (size_t)done;
        at += (uint32_t)done;
    }
    return 0;
}

/* The pending bytes to the file. */
static int fill_flush(struct cache_fill *fill)
{
    int err = 0;

    if (fill->pending_len > 0)
        err = fill_pwrite(fill, fill->pending, fill->pending_len,
                          fill->written - fill->pending_len);
    fill->pending_len = 0;
    return err;
}

/* The checksums of LEN more bytes of the block. */
static void fill_hash(struct cache_fill *fill, const char *bytes, size_t len)
{
    size_t hashed = 0;

    while (hashed < len) {
        uint32_t in_piece = fill->written % CACHE_PIECE_SIZE;
        size_t take = CACHE_PIECE_SIZE - in_piece;
        if (take > len - hashed)
            take = len - hashed;
        XXH3_64bits_update(fill->piece_state, bytes + hashed, take);
        fill->written += (uint32_t)take;
        hashed += take;
        if (fill->written % CACHE_PIECE_SIZE == 0 || fill->written == fill->len) {
            fill->sums[(fill->written - 1) / CACHE_PIECE_SIZE] =
                XXH3_64bits_digest(fill->piece_state);
            XXH3_64bits_reset(fill->piece_state);
        }
    }
}

int cache_fill_write(struct cache_fill *fill, const void *data, size_t len)
{
    const char *bytes = data;
    int err = 0;

    if (len > fill->len - fill->written)
        return EINVAL; /* more than the block holds */
    if (fill->pending_len == 0 && len >= FILL_WRITE_SIZE) {
        /* large enough already: written from the caller's memory */
        err = fill_pwrite(fill, bytes, len, fill->written);
        if (err == 0)
            fill_hash(fill, bytes, len);
        return err;
    }
    if (fill->pending == NULL && (fill->pending = malloc(FILL_WRITE_SIZE)) == NULL)
        return ENOMEM;
    /* gathered (hashed as they come, while in the CPU's cache), written
     * when FILL_WRITE_SIZE are pending or the block is complete */
    while (len > 0) {
        size_t take = FILL_WRITE_SIZE - fill->pending_len;
        if (take > len)
            take = len;
        memcpy(fill->pending + fill->pending_len, bytes, take);
        fill->pending_len += (uint32_t)take;
        fill_hash(fill, bytes, take);
        bytes += take;
        len -= take;
        if (fill->pending_len == FILL_WRITE_SIZE || fill->written == fill->len) {
            err = fill_flush(fill);
            if (err != 0)
                return err;
        }
    }
    return 0;
}

static void fill_free(struct cache_fill *fill)
{
    cache_release_room(fill->cache, fill->reserved);
    cache_object_close(fill->cache, &fill->object);
    XXH3_freeState(fill->piece_state);
    free(fill->sums);
    free(fill->pending);
    free(fill);
}

void cache_fill_abort(struct cache_fill **fillp)
{
    struct cache_fill *fill = *fillp;

    if (fill == NULL)
        return;
    /* give back what was written, and what a punch put off for the
     * block's range was to give back */
    if (fill->written > 0 || fill->took_punch)
        cache_punch_block(fill->cache, fill->object->id, fill->block,
                          fill->took_punch ? fill->len : fill->written);
    fill_free(fill);
    *fillp = NULL;
}

int cache_fill_commit(struct cache_fill **fillp)
{
    struct cache_fill *fill = *fillp;
    struct cache *cache = fill->cache;
    uint64_t id = fill->object->id;
    uint32_t pieces = pieces_of(fill->len);
    size_t record_len = sizeof(struct block_record) + pieces * sizeof(uint64_t);
    struct block_record *record = NULL;
    struct db_txn *txn = NULL;
    struct usage_record usage;
    uint32_t old_len;
    uint64_t tick = 0;
    int err = 0;

    *fillp = NULL;
    if (fill->written != fill->len || fill->pending_len != 0) {
        err = EINVAL;
        goto out;
    }
    record = calloc(1, record_len);
    if (record == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    if (err == 0) {
        err = cache_drop_block_txn(txn, id, fill->block, &usage, &old_len);
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = cache_next_tick(txn, &tick);
    /* a pinned version's blocks are pinned from the start */
    uint8_t segment = SEGMENT_PROBATION;
    if (err == 0) {
        unsigned char id_key[8];
        const void *value;
        size_t value_len;
        struct object_record object;
        put_be64(id_key, id);
        if (db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value,
                   &value_len) == 0 && value_len >= sizeof(object)) {
            memcpy(&object, value, sizeof(object));
            if (object.flags & OBJECT_PINNED)
                segment = SEGMENT_PINNED;
        }
    }
    if (err == 0) {
        record->len = fill->len;
        record->segment = segment;
        record->tick = tick;
        memcpy(record + 1, fill->sums, pieces * sizeof(uint64_t));
        struct block_key key = block_key(id, fill->block);
        err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), record,
                     record_len);
    }
    if (err == 0) {
        struct recency_key rkey = recency_key(segment, tick, id, fill->block);
        err = db_put(txn, DB_RECENCY, rkey.bytes, sizeof(rkey.bytes), "", 0);
    }
    if (err == 0) {
        usage.bytes[usage_slot(segment)] += account(fill->len);
        usage.blocks++;
        err = cache_usage_commit(cache, &txn, &usage);
    }
    if (err == 0) {
        atomic_fetch_add(&cache->stored_bytes, fill->len);
        fresh_block_note(cache, id, fill->block, tick);
    }
out:
    db_txn_abort(&txn);
    free(record);
    fill_free(fill);
    return err;
}
