/*
 * cache.c - the block cache's data path (see cache.h): object versions
 * and their handles, reading blocks back (verified piece by piece, damaged
 * ones dropped), filling blocks, statistics; and the helpers the other
 * parts share: the index accessors (meta values, the usage record, ticks)
 * and the data files. The write path's calls live here too: a staged file
 * adopted as a version (renamed into data/, its blocks recorded in one
 * transaction), a version re-keyed after a server-side copy, a deleted
 * key forgotten.
 *
 * cache_dir.c opens and closes the cache on its directory;
 * cache_policy.c decides what stays (room, eviction, recency), called
 * from here through cache_make_room() before a block is filled and
 * cache_add_touch() after a block is read again. The layouts, constants
 * and the locking rules are in cache_internal.h.
 */
#include "config.h"

#include "cache_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"

/* SHA-256 of "bucket NUL key": the index's name for a key. */
static int key_hash(const char *bucket, const char *key, unsigned char *out)
{
    size_t bucket_len = strlen(bucket) + 1;
    size_t key_len = strlen(key);
    char *text = malloc(bucket_len + key_len);
    unsigned int digest_len = 0;
    int err = 0;

    if (text == NULL)
        return ENOMEM;
    memcpy(text, bucket, bucket_len);
    memcpy(text + bucket_len, key, key_len);
    if (EVP_Digest(text, bucket_len + key_len, out, &digest_len, EVP_sha256(),
                   NULL) != 1)
        err = EIO;
    free(text);
    return err;
}

/* ----------------------------------------------------- index accessors */

int cache_meta_get_u64(struct db_txn *txn, const char *name, uint64_t *out)
{
    const void *value;
    size_t len;
    int err = db_get(txn, DB_META, name, strlen(name), &value, &len);

    if (err == ENOENT) {
        *out = 0;
        return 0;
    }
    if (err == 0 && len != sizeof(*out))
        return EIO;
    if (err == 0)
        memcpy(out, value, sizeof(*out));
    return err;
}

int cache_meta_put_u64(struct db_txn *txn, const char *name, uint64_t value)
{
    return db_put(txn, DB_META, name, strlen(name), &value, sizeof(value));
}

int cache_usage_get(struct db_txn *txn, struct usage_record *out)
{
    const void *value;
    size_t len;
    int err = db_get(txn, DB_META, "usage", 5, &value, &len);

    memset(out, 0, sizeof(*out));
    if (err == ENOENT)
        return 0;
    if (err == 0 && len == sizeof(*out))
        memcpy(out, value, sizeof(*out));
    return err;
}

int cache_usage_put(struct db_txn *txn, const struct usage_record *usage)
{
    return db_put(txn, DB_META, "usage", 5, usage, sizeof(*usage));
}

int cache_usage_commit(struct cache *cache, struct db_txn **txn,
                       const struct usage_record *before,
                       const struct usage_record *usage)
{
    int err = cache_usage_put(*txn, usage);

    if (err == 0)
        err = db_txn_commit(txn);
    if (err == 0)
        cache_usage_mirror(cache, before, usage);
    return err;
}

/* After a commit, move the in-memory mirror of the usage record by what
 * the transaction changed (BEFORE -> AFTER). Applying differences keeps
 * the mirror right whatever order committed transactions report in. */
void cache_usage_mirror(struct cache *cache, const struct usage_record *before,
                        const struct usage_record *after)
{
    pthread_mutex_lock(&cache->lock);
    for (int i = 0; i < 2; i++)
        cache->usage.bytes[i] += after->bytes[i] - before->bytes[i];
    cache->usage.blocks += after->blocks - before->blocks;
    pthread_mutex_unlock(&cache->lock);
}

int cache_next_tick(struct db_txn *txn, uint64_t *tick)
{
    int err = cache_meta_get_u64(txn, "tick", tick);
    if (err == 0)
        err = cache_meta_put_u64(txn, "tick", ++*tick);
    return err;
}

/* ------------------------------------------------------- paths, files */

static char *data_path(const struct cache *cache, uint64_t id)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%02x/%016llx", cache->data_dir,
                 (unsigned)(id & 0xff), (unsigned long long)id) < 0)
        return NULL;
    return path;
}

static int open_data_file(const struct cache *cache, uint64_t id, int *fd)
{
    char *path = data_path(cache, id);
    int err = 0;

    if (path == NULL)
        return ENOMEM;
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0 && errno == ENOENT) {
        /* the fan-out directory */
        char *slash = strrchr(path, '/');
        *slash = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            err = errno;
            goto out;
        }
        *slash = '/';
        *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    }
    if (*fd < 0)
        err = errno;
out:
    if (err != 0)
        log_error("cache: cannot open %s: %s", path, strerror(err));
    free(path);
    return err;
}

void cache_unlink_data_file(const struct cache *cache, uint64_t id)
{
    char *path = data_path(cache, id);
    if (path != NULL && unlink(path) != 0 && errno != ENOENT)
        log_warn("cache: cannot remove %s: %s", path, strerror(errno));
    free(path);
}

/* Give the disk space of a dropped block back (the index no longer
 * records it; a reader racing with us sees a checksum failure). */
void cache_punch_block(const struct cache *cache, uint64_t id, uint64_t block,
                       uint32_t len)
{
    char *path = data_path(cache, id);
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;

    if (fd >= 0) {
        if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)(block * cache->block_size), (off_t)len) != 0 &&
            errno != EOPNOTSUPP)
            log_warn("cache: cannot free block space in %s: %s", path,
                     strerror(errno));
        close(fd);
    }
    free(path);
}

/* ------------------------------------------------------------ accessors */

void cache_get_stats(struct cache *cache, struct cache_stats *out)
{
    pthread_mutex_lock(&cache->lock);
    out->used_bytes = cache->usage.bytes[0] + cache->usage.bytes[1];
    out->protected_bytes = cache->usage.bytes[SEGMENT_PROTECTED];
    out->blocks = cache->usage.blocks;
    pthread_mutex_unlock(&cache->lock);
    out->index_bytes = db_file_bytes(cache->db);
    out->size_limit = cache->size_limit;
    out->served_bytes = atomic_load(&cache->served_bytes);
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
    return key_hash(cache->bucket, name, out);
}

uint32_t cache_block_size(const struct cache *cache)
{
    return cache->block_size;
}

/* ------------------------------------------------------------ objects */

static int compare_object_id(const void *a, const void *b)
{
    const struct cache_object *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

bool cache_object_is_open_locked(struct cache *cache, uint64_t id)
{
    struct cache_object probe = {.id = id};
    return tfind(&probe, &cache->open_objects, compare_object_id) != NULL;
}

/* Remove block BLOCK of object ID from the index in TXN; *len gets its
 * length. ENOENT if it was not recorded. Updates USAGE. */
int cache_drop_block_txn(struct db_txn *txn, uint64_t id, uint64_t block,
                         struct usage_record *usage, uint32_t *len)
{
    struct block_key key = block_key(id, block);
    struct block_record record;
    const void *value;
    size_t value_len;
    int err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value,
                     &value_len);

    if (err != 0)
        return err;
    if (value_len < sizeof(record))
        return EIO;
    memcpy(&record, value, sizeof(record));
    struct recency_key rkey = recency_key(record.segment, record.tick, id, block);
    db_del(txn, DB_RECENCY, rkey.bytes, sizeof(rkey.bytes));
    err = db_del(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes));
    if (err == 0) {
        usage_sub(usage, record.segment == SEGMENT_PROTECTED,
                  account(record.len));
        if (usage->blocks > 0)
            usage->blocks--;
        *len = record.len;
    }
    return err;
}

struct block_list {
    uint64_t *blocks;
    size_t count;
    size_t capacity;
    uint64_t id;
};

static int collect_object_blocks(void *arg, const void *key, size_t key_len,
                                 const void *value, size_t value_len)
{
    struct block_list *list = arg;
    (void)value;
    (void)value_len;
    if (key_len != 16 || get_be64(key) != list->id)
        return -1; /* past this object's blocks */
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 64;
        uint64_t *grown = realloc(list->blocks, capacity * sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        list->blocks = grown;
        list->capacity = capacity;
    }
    list->blocks[list->count++] = get_be64((const unsigned char *)key + 8);
    return 0;
}

/* Forget version ID entirely (its blocks, its record) in TXN. */
int cache_drop_version_txn(struct db_txn *txn, uint64_t id,
                           struct usage_record *usage)
{
    struct block_list list = {.id = id};
    struct block_key start = block_key(id, 0);
    unsigned char id_key[8];
    uint32_t len;
    int err = db_scan(txn, DB_BLOCKS, start.bytes, sizeof(start.bytes),
                      collect_object_blocks, &list);

    for (size_t i = 0; err == 0 && i < list.count; i++)
        err = cache_drop_block_txn(txn, id, list.blocks[i], usage, &len);
    free(list.blocks);
    put_be64(id_key, id);
    if (err == 0) {
        err = db_del(txn, DB_OBJECTS, id_key, sizeof(id_key));
        if (err == ENOENT)
            err = 0;
    }
    return err;
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

/* Version ID has just been dropped from the index (committed): if a
 * handle has it open, its file goes at the handle's last close
 * (`replaced`), else now. */
static void retire_dropped_version(struct cache *cache, uint64_t id)
{
    pthread_mutex_lock(&cache->lock);
    struct cache_object probe = {.id = id};
    void *open = tfind(&probe, &cache->open_objects, compare_object_id);
    if (open != NULL)
        (*(struct cache_object **)open)->replaced = true;
    pthread_mutex_unlock(&cache->lock);
    if (open == NULL)
        cache_unlink_data_file(cache, id);
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
    struct usage_record usage, before;
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag);
    int err;

    *stale_id = 0;
    err = key_hash(cache->bucket, key, hash);
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
    before = usage;
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
        err = cache_usage_commit(cache, &txn, &before, &usage);
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
        retire_dropped_version(cache, stale_id);

    pthread_mutex_lock(&cache->lock);
    struct cache_object probe = {.id = id};
    void *found = tfind(&probe, &cache->open_objects, compare_object_id);
    if (found != NULL) {
        object = *(struct cache_object **)found;
        object->refs++;
    }
    pthread_mutex_unlock(&cache->lock);
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
    err = open_data_file(cache, id, &object->fd);
    if (err != 0)
        goto out;
    pthread_mutex_lock(&cache->lock);
    found = tfind(object, &cache->open_objects, compare_object_id);
    if (found != NULL) { /* another thread opened it meanwhile */
        struct cache_object *other = *(struct cache_object **)found;
        other->refs++;
        pthread_mutex_unlock(&cache->lock);
        close(object->fd);
        free(object->key);
        free(object);
        *out = other;
        return 0;
    }
    if (tsearch(object, &cache->open_objects, compare_object_id) == NULL)
        err = ENOMEM;
    pthread_mutex_unlock(&cache->lock);
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
    pthread_mutex_unlock(&cache->lock);
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
        tdelete(object, &cache->open_objects, compare_object_id);
    pthread_mutex_unlock(&cache->lock);
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

/* Drop a damaged block, unless it was replaced since we read its record. */
static void drop_damaged_block(struct cache *cache, struct cache_object *object,
                               uint64_t block, uint64_t tick, const char *why)
{
    struct db_txn *txn = NULL;
    struct block_key key = block_key(object->id, block);
    struct usage_record usage, before;
    const void *value;
    size_t len;
    uint32_t dropped_len = 0;
    bool dropped = false;

    if (db_txn_begin(cache->db, true, &txn) != 0)
        return;
    int err = cache_usage_get(txn, &usage);
    before = usage;
    if (err == 0)
        err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &len);
    if (err == 0 && len >= sizeof(struct block_record) &&
        ((const struct block_record *)value)->tick != tick)
        err = ESTALE; /* replaced since: not ours to drop */
    if (err == 0)
        err = cache_drop_block_txn(txn, object->id, block, &usage, &dropped_len);
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &before, &usage);
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
    pthread_mutex_unlock(&cache->lock);
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
    pthread_mutex_unlock(&cache->lock);
    free(bounce);
    pthread_setspecific(cache->bounce_key, fresh);
    return fresh->data;
}

int cache_block_read(struct cache *cache, struct cache_object *object,
                     uint64_t block, uint32_t offset, uint32_t len, char *buf,
                     bool reuse)
{
    struct db_txn *txn = NULL;
    struct block_key key = block_key(object->id, block);
    struct block_record record;
    uint64_t sums[CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE];
    const void *value;
    size_t value_len;
    char *bounce = NULL;
    int err;

    if (len == 0)
        return 0;
    err = db_txn_begin(cache->db, false, &txn);
    if (err != 0)
        return err;
    err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &value_len);
    memset(&record, 0, sizeof(record));
    bool damaged = false;
    if (err == 0 && value_len >= sizeof(record)) {
        memcpy(&record, value, sizeof(record));
        uint32_t pieces = pieces_of(record.len);
        damaged = value_len != sizeof(record) + pieces * sizeof(uint64_t) ||
                  record.len != cache_object_block_len(object, block);
        if (!damaged)
            memcpy(sums, (const char *)value + sizeof(record),
                   pieces * sizeof(uint64_t));
    } else if (err == 0) {
        damaged = true;
    }
    db_txn_abort(&txn);
    if (damaged) {
        drop_damaged_block(cache, object, block, record.tick, "bad index record");
        return ENOENT;
    }
    if (err != 0)
        return err;
    if ((uint64_t)offset + len > record.len)
        return EINVAL;

    /* read and verify the pieces the range touches */
    uint32_t first_piece = offset / CACHE_PIECE_SIZE;
    uint32_t last_piece = (offset + len - 1) / CACHE_PIECE_SIZE;
    uint32_t span_start = first_piece * CACHE_PIECE_SIZE;
    uint32_t span_end = (last_piece + 1) * CACHE_PIECE_SIZE;
    if (span_end > record.len)
        span_end = record.len;
    /* whole pieces are read and checked in the caller's buffer (it gets
     * nothing unless they all match); others go through the bounce buffer */
    bool direct = span_start == offset && span_end == offset + len;
    bounce = direct ? buf : bounce_buffer(cache, span_end - span_start);
    if (bounce == NULL)
        return ENOMEM;
    ssize_t got = pread(object->fd, bounce, span_end - span_start,
                        (off_t)(block * cache->block_size + span_start));
    if (got < 0)
        return errno;
    if ((uint32_t)got != span_end - span_start) {
        drop_damaged_block(cache, object, block, record.tick, "data file too short");
        return ENOENT;
    }
    for (uint32_t piece = first_piece; piece <= last_piece; piece++) {
        uint32_t from = piece * CACHE_PIECE_SIZE - span_start;
        uint32_t piece_len = piece == last_piece ? span_end - span_start - from
                                                 : CACHE_PIECE_SIZE;
        if (XXH3_64bits(bounce + from, piece_len) != sums[piece]) {
            drop_damaged_block(cache, object, block, record.tick, "checksum mismatch");
            return ENOENT;
        }
    }
    if (!direct)
        memcpy(buf, bounce + (offset - span_start), len);
    atomic_fetch_add(&cache->served_bytes, len);
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
    pthread_mutex_lock(&cache->lock);
    object->refs++; /* the fill keeps the object (and its fd) alive */
    pthread_mutex_unlock(&cache->lock);
    *out = fill;
    return 0;
}

int cache_fill_write(struct cache_fill *fill, const void *data, size_t len)
{
    const char *bytes = data;
    uint64_t base = fill->block * fill->cache->block_size;

    if (len > fill->len - fill->written)
        return EINVAL; /* more than the block holds */
    while (len > 0) {
        /* one write for all the caller has (few system calls), then the
         * checksums of the pieces it spans */
        ssize_t done = pwrite(fill->object->fd, bytes, len,
                              (off_t)(base + fill->written));
        if (done < 0)
            return errno;
        if (done == 0)
            return EIO;
        size_t hashed = 0;
        while (hashed < (size_t)done) {
            uint32_t in_piece = fill->written % CACHE_PIECE_SIZE;
            size_t take = CACHE_PIECE_SIZE - in_piece;
            if (take > (size_t)done - hashed)
                take = (size_t)done - hashed;
            XXH3_64bits_update(fill->piece_state, bytes + hashed, take);
            fill->written += (uint32_t)take;
            hashed += take;
            if (fill->written % CACHE_PIECE_SIZE == 0 || fill->written == fill->len) {
                fill->sums[(fill->written - 1) / CACHE_PIECE_SIZE] =
                    XXH3_64bits_digest(fill->piece_state);
                XXH3_64bits_reset(fill->piece_state);
            }
        }
        bytes += done;
        len -= (size_t)done;
    }
    return 0;
}

static void fill_free(struct cache_fill *fill)
{
    cache_release_room(fill->cache, fill->reserved);
    cache_object_close(fill->cache, &fill->object);
    XXH3_freeState(fill->piece_state);
    free(fill->sums);
    free(fill);
}

void cache_fill_abort(struct cache_fill **fillp)
{
    if (*fillp == NULL)
        return;
    if ((*fillp)->written > 0) /* give back what was written */
        cache_punch_block((*fillp)->cache, (*fillp)->object->id,
                          (*fillp)->block, (*fillp)->written);
    fill_free(*fillp);
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
    struct usage_record usage, before;
    uint32_t old_len;
    uint64_t tick = 0;
    int err = 0;

    *fillp = NULL;
    if (fill->written != fill->len) {
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
    before = usage;
    if (err == 0) {
        err = cache_drop_block_txn(txn, id, fill->block, &usage, &old_len);
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = cache_next_tick(txn, &tick);
    if (err == 0) {
        record->len = fill->len;
        record->segment = SEGMENT_PROBATION;
        record->tick = tick;
        memcpy(record + 1, fill->sums, pieces * sizeof(uint64_t));
        struct block_key key = block_key(id, fill->block);
        err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), record,
                     record_len);
    }
    if (err == 0) {
        struct recency_key rkey = recency_key(SEGMENT_PROBATION, tick, id,
                                              fill->block);
        err = db_put(txn, DB_RECENCY, rkey.bytes, sizeof(rkey.bytes), "", 0);
    }
    if (err == 0) {
        usage.bytes[SEGMENT_PROBATION] += account(fill->len);
        usage.blocks++;
        err = cache_usage_put(txn, &usage);
    }
    if (err == 0)
        err = db_txn_commit(&txn);
    if (err == 0) {
        cache_usage_mirror(cache, &before, &usage);
        atomic_fetch_add(&cache->stored_bytes, fill->len);
    }
out:
    db_txn_abort(&txn);
    free(record);
    fill_free(fill);
    return err;
}

/* ------------------------------------------------- the write path's needs */

/* In TXN, drop the version the key with HASH maps to, unless it is KEEP
 * (0: keep none); *dropped gets its id (0 if none was dropped), for
 * retire_dropped_version() after the commit. The KEYS entry itself is
 * left for the caller to replace or delete. */
static int drop_key_version_txn(struct db_txn *txn, const unsigned char *hash,
                                uint64_t keep, struct usage_record *usage,
                                uint64_t *dropped)
{
    const void *value;
    size_t len;
    uint64_t id;
    int err = db_get(txn, DB_KEYS, hash, KEY_HASH_LEN, &value, &len);

    *dropped = 0;
    if (err == ENOENT)
        return 0;
    if (err != 0)
        return err;
    if (len != sizeof(id))
        return 0; /* a broken entry: the caller overwrites or deletes it */
    memcpy(&id, value, sizeof(id));
    if (id == keep)
        return 0;
    err = cache_drop_version_txn(txn, id, usage);
    if (err == 0)
        *dropped = id;
    return err;
}

int cache_forget_key(struct cache *cache, const char *key)
{
    unsigned char hash[KEY_HASH_LEN];
    struct db_txn *txn = NULL;
    struct usage_record usage, before;
    uint64_t dropped = 0;
    const void *value;
    size_t len;
    int err = key_hash(cache->bucket, key, hash);

    if (err != 0)
        return err;
    /* the common case for a deleted object, nothing cached: no writer */
    err = db_txn_begin(cache->db, false, &txn);
    if (err != 0)
        return err;
    err = db_get(txn, DB_KEYS, hash, sizeof(hash), &value, &len);
    db_txn_abort(&txn);
    if (err == ENOENT)
        return 0;
    if (err != 0)
        return err;

    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    before = usage;
    if (err == 0)
        err = drop_key_version_txn(txn, hash, 0, &usage, &dropped);
    if (err == 0) {
        err = db_del(txn, DB_KEYS, hash, sizeof(hash));
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &before, &usage);
    db_txn_abort(&txn);
    if (err != 0)
        return err;
    if (dropped != 0)
        retire_dropped_version(cache, dropped);
    return 0;
}

int cache_rename_object(struct cache *cache, const char *key, const char *etag,
                        const char *new_key, const char *new_etag)
{
    unsigned char hash[KEY_HASH_LEN], new_hash[KEY_HASH_LEN];
    unsigned char id_key[8];
    struct object_record *record = NULL;
    struct db_txn *txn = NULL;
    struct usage_record usage, before;
    uint64_t id = 0, dropped = 0;
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag), new_etag_len = strlen(new_etag);
    int err;

    if (new_etag_len > 1024)
        return EINVAL;
    err = key_hash(cache->bucket, key, hash);
    if (err == 0)
        err = key_hash(cache->bucket, new_key, new_hash);
    if (err != 0)
        return err;
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    before = usage;
    if (err == 0)
        err = db_get(txn, DB_KEYS, hash, sizeof(hash), &value, &len);
    if (err == 0 && len != sizeof(id))
        err = ENOENT;
    if (err != 0)
        goto out;
    memcpy(&id, value, sizeof(id));
    put_be64(id_key, id);
    err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
    if (err == 0 && len != sizeof(*record) + etag_len)
        err = ENOENT; /* another version of KEY is cached */
    if (err != 0)
        goto out;
    record = calloc(1, sizeof(*record) + new_etag_len);
    if (record == NULL) {
        err = ENOMEM;
        goto out;
    }
    memcpy(record, value, sizeof(*record)); /* the size stays */
    if (record->etag_len != etag_len ||
        memcmp((const char *)value + sizeof(*record), etag, etag_len) != 0) {
        err = ENOENT;
        goto out;
    }
    memcpy(record->key_hash, new_hash, sizeof(new_hash));
    record->etag_len = (uint16_t)new_etag_len;
    memcpy((char *)(record + 1), new_etag, new_etag_len);

    /* the version keeps its id, blocks and data file: an open handle on
     * it goes on reading the same bytes, now under the new name */
    err = drop_key_version_txn(txn, new_hash, id, &usage, &dropped);
    if (err == 0 && memcmp(hash, new_hash, sizeof(hash)) != 0)
        err = db_del(txn, DB_KEYS, hash, sizeof(hash));
    if (err == 0)
        err = db_put(txn, DB_OBJECTS, id_key, sizeof(id_key), record,
                     sizeof(*record) + new_etag_len);
    if (err == 0)
        err = db_put(txn, DB_KEYS, new_hash, sizeof(new_hash), &id, sizeof(id));
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &before, &usage);
    if (err == 0) {
        if (dropped != 0)
            retire_dropped_version(cache, dropped);
    }
out:
    db_txn_abort(&txn);
    free(record);
    return err;
}

/* Pieces read per pread when checksumming a file to adopt. */
#define ADOPT_READ_PIECES 16

/* The XXH3 of each CACHE_PIECE_SIZE piece of the first SIZE bytes of FD
 * into SUMS (piece I covers [I * piece, (I + 1) * piece), the last one
 * possibly short): since blocks are whole numbers of pieces, these are
 * the blocks' checksums in order. EIO when the file is shorter. */
static int sum_file_pieces(int fd, uint64_t size, uint64_t *sums)
{
    size_t buf_size = (size_t)ADOPT_READ_PIECES * CACHE_PIECE_SIZE;
    char *buf = malloc(buf_size);
    uint64_t offset = 0;
    int err = 0;

    if (buf == NULL)
        return ENOMEM;
    while (err == 0 && offset < size) {
        size_t want = size - offset < buf_size ? (size_t)(size - offset) : buf_size;
        size_t got = 0;
        while (got < want) {
            ssize_t n = pread(fd, buf + got, want - got, (off_t)(offset + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                err = n < 0 ? errno : EIO;
                break;
            }
            got += (size_t)n;
        }
        for (size_t at = 0; err == 0 && at < want; at += CACHE_PIECE_SIZE) {
            size_t piece_len = want - at < CACHE_PIECE_SIZE ? want - at
                                                            : CACHE_PIECE_SIZE;
            sums[(offset + at) / CACHE_PIECE_SIZE] = XXH3_64bits(buf + at, piece_len);
        }
        offset += want;
    }
    free(buf);
    return err;
}

/* rename(FROM, TO), creating TO's fan-out directory if needed. */
static int rename_into_data(const char *from, char *to)
{
    if (rename(from, to) == 0)
        return 0;
    if (errno != ENOENT)
        return errno;
    char *slash = strrchr(to, '/');
    *slash = '\0';
    int err = mkdir(to, 0700) != 0 && errno != EEXIST ? errno : 0;
    *slash = '/';
    if (err == 0 && rename(from, to) != 0)
        err = errno;
    return err;
}

/* In TXN: version ID of KEY (HASH) is (ETAG, SIZE) with every block
 * recorded from SUMS (all pieces in order), in probation, most recent
 * last; other versions of the key are dropped (*dropped: see
 * drop_key_version_txn). USAGE is updated. */
static int publish_adopted_txn(struct cache *cache, struct db_txn *txn,
                               const unsigned char *hash, uint64_t id,
                               const char *etag, uint64_t size,
                               const uint64_t *sums,
                               struct usage_record *usage, uint64_t *dropped)
{
    size_t etag_len = strlen(etag);
    uint64_t blocks = (size + cache->block_size - 1) / cache->block_size;
    uint32_t block_pieces = cache->block_size / CACHE_PIECE_SIZE;
    size_t record_max = sizeof(struct block_record) +
                        block_pieces * sizeof(uint64_t);
    struct object_record *object = calloc(1, sizeof(*object) + etag_len);
    struct block_record *record = calloc(1, record_max);
    unsigned char id_key[8];
    uint64_t tick = 0;
    int err = 0;

    if (object == NULL || record == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = drop_key_version_txn(txn, hash, id, usage, dropped);
    if (err == 0) {
        object->size = size;
        memcpy(object->key_hash, hash, KEY_HASH_LEN);
        object->etag_len = (uint16_t)etag_len;
        memcpy((char *)(object + 1), etag, etag_len);
        put_be64(id_key, id);
        err = db_put(txn, DB_OBJECTS, id_key, sizeof(id_key), object,
                     sizeof(*object) + etag_len);
    }
    if (err == 0)
        err = db_put(txn, DB_KEYS, hash, KEY_HASH_LEN, &id, sizeof(id));
    if (err == 0)
        err = cache_meta_get_u64(txn, "tick", &tick);
    for (uint64_t block = 0; err == 0 && block < blocks; block++) {
        uint64_t start = block * cache->block_size;
        uint32_t len = size - start < cache->block_size
                           ? (uint32_t)(size - start) : cache->block_size;
        uint32_t pieces = pieces_of(len);
        struct block_key key = block_key(id, block);
        struct recency_key rkey;

        record->len = len;
        record->segment = SEGMENT_PROBATION;
        record->tick = ++tick;
        memcpy(record + 1, sums + block * block_pieces, pieces * sizeof(uint64_t));
        err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), record,
                     sizeof(*record) + pieces * sizeof(uint64_t));
        if (err == 0) {
            rkey = recency_key(SEGMENT_PROBATION, tick, id, block);
            err = db_put(txn, DB_RECENCY, rkey.bytes, sizeof(rkey.bytes), "", 0);
        }
        if (err == 0) {
            usage->bytes[SEGMENT_PROBATION] += account(len);
            usage->blocks++;
        }
    }
    if (err == 0 && blocks > 0)
        err = cache_meta_put_u64(txn, "tick", tick);
    if (err == 0)
        err = cache_usage_put(txn, usage);
out:
    free(object);
    free(record);
    return err;
}

/*
 * The order makes a kill -9 at any point harmless: the version gets a
 * fresh id, and the file is renamed to that id's data path before any
 * record names the id; one transaction then publishes the version and
 * all its blocks. Before the rename nothing but other versions of KEY
 * has changed; between the rename and the commit the data file is an
 * orphan (no object record), which cache_open sweeps. A fresh id (never
 * the version already cached, even for the same ETag) means no handle
 * can have the data path open on another inode, and nothing else ever
 * writes to the new file.
 */
int cache_adopt_file(struct cache *cache, const char *key, const char *etag,
                     uint64_t size, const char *path)
{
    unsigned char hash[KEY_HASH_LEN];
    struct db_txn *txn = NULL;
    struct usage_record usage, before;
    uint64_t *sums = NULL;
    uint64_t id = 0, dropped = 0, need = 0, reserved = 0;
    uint64_t blocks = (size + cache->block_size - 1) / cache->block_size;
    uint64_t pieces = (size + CACHE_PIECE_SIZE - 1) / CACHE_PIECE_SIZE;
    char *target = NULL;
    bool moved = false;
    struct stat st;
    int fd = -1;
    int err;

    if (strlen(etag) > 1024)
        return EINVAL;
    if (blocks > 0)
        need = (blocks - 1) * account(cache->block_size) +
               account(size - (blocks - 1) * cache->block_size);
    if (need > cache->size_limit)
        return ENOSPC; /* checked first: no eviction for nothing */
    err = key_hash(cache->bucket, key, hash);
    if (err != 0)
        return err;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    if (fstat(fd, &st) != 0)
        err = errno;
    else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
        err = EINVAL;
    if (err == 0 && pieces > 0) {
        sums = calloc(pieces, sizeof(*sums));
        err = sums == NULL ? ENOMEM : sum_file_pieces(fd, size, sums);
    }
    close(fd);
    if (err != 0)
        goto out;

    /* the old versions go first, so that their room counts */
    err = cache_forget_key(cache, key);
    if (err == 0)
        err = cache_make_room(cache, need, 0); /* the bytes are on disk already */
    if (err != 0)
        goto out;
    reserved = need;
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_meta_get_u64(txn, "next_id", &id);
    if (err == 0)
        err = cache_meta_put_u64(txn, "next_id", ++id);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    if (err != 0)
        goto out;
    target = data_path(cache, id);
    if (target == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = rename_into_data(path, target);
    if (err != 0)
        goto out;
    moved = true;

    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
    before = usage;
    if (err == 0)
        err = publish_adopted_txn(cache, txn, hash, id, etag, size, sums,
                                  &usage, &dropped);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    if (err == 0) {
        cache_usage_mirror(cache, &before, &usage);
        if (dropped != 0)
            retire_dropped_version(cache, dropped);
        atomic_fetch_add(&cache->stored_bytes, size);
    }
out:
    if (err != 0 && moved && rename(target, path) != 0) {
        log_error("cache: cannot move %s back to %s: %s", target, path,
                  strerror(errno));
        cache_unlink_data_file(cache, id);
    }
    if (reserved > 0)
        cache_release_room(cache, reserved);
    free(target);
    free(sums);
    return err;
}
