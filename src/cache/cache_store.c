/*
 * cache_store.c - what every part of the block cache builds on: the
 * index's accessors (meta values, the usage record and its copy in
 * struct cache, recency ticks), the data files of versions (path, open,
 * punch, unlink), and dropping blocks and versions from the index. It
 * calls nothing else of the cache: cache.c, cache_adopt.c and
 * cache_policy.c sit above it.
 *
 * Invariants of the usage accounting: the usage record holds, per
 * segment, the sum of account(len) of the blocks recorded in that
 * segment, and their number. Every transaction that changes blocks
 * stores the record and commits through cache_usage_commit(), which
 * then makes it struct cache's copy (usage) unless the copy already is
 * the record of a later commit (usage_txn): the copy is always the record
 * as one commit left it, at most a few commits behind, never a mixture.
 * Under `lock`: the copy's bytes are whole ACCOUNT_UNITs, none without
 * blocks and at least a unit per block, at most TOUCHES_MAX touches
 * wait, and every open version is referenced. Debug builds check these
 * where the lock is released (cache_unlock), and the record against the
 * block records, and the copy against the record, when the cache closes
 * (cache_check_usage).
 *
 * Holds (cache.h): the blocks whose pages are in the pipes of reads not
 * yet answered, HOLD_SHARDS small tables by (id, block), each under a
 * leaf mutex, so that the reads of different blocks meet on no lock. A
 * read holds a block before it reads the block's record; whoever drops a
 * block commits the drop before it asks for the punch: either the hold
 * came first (the punch waits for the last release: punch_len), or the
 * drop did (the read finds no record and splices nothing). At the last
 * release the put-off punch is made outside the lock, the entry marked
 * `punching` meanwhile, so that a fill of the block (which writes the
 * same range) waits for it instead of having its bytes punched; a fill
 * that comes first takes the punch over. A hold lasts for one read of an
 * open file, and a moment past its answer (the file's release may come
 * first): a put-off punch of a version no longer open goes by its path,
 * to its data file or to nothing if that was removed.
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
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"

/* SHA-256 of "bucket NUL key": the index's name for a key. */
int cache_key_hash(const char *bucket, const char *key, unsigned char *out)
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

/* "note:NAME" into KEY (KEY_LEN bytes): its length, or 0 if too long. */
static size_t note_key(const char *name, char *key, size_t key_len)
{
    int n = snprintf(key, key_len, "note:%s", name);

    return n > 0 && (size_t)n < key_len ? (size_t)n : 0;
}

int cache_note_get(struct cache *cache, const char *name, char **text)
{
    struct db_txn *txn = NULL;
    const void *value;
    size_t len;
    char key[128];
    size_t key_len = note_key(name, key, sizeof(key));

    *text = NULL;
    if (key_len == 0)
        return EINVAL;
    int err = db_txn_begin(cache->db, false, &txn);
    if (err == 0)
        err = db_get(txn, DB_META, key, key_len, &value, &len);
    if (err == 0) {
        *text = malloc(len + 1);
        if (*text == NULL) {
            err = ENOMEM;
        } else {
            memcpy(*text, value, len);
            (*text)[len] = '\0';
        }
    }
    db_txn_abort(&txn);
    return err;
}

int cache_note_put(struct cache *cache, const char *name, const char *text)
{
    struct db_txn *txn = NULL;
    char key[128];
    size_t key_len = note_key(name, key, sizeof(key));

    if (key_len == 0)
        return EINVAL;
    int err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = db_put(txn, DB_META, key, key_len, text, strlen(text));
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    return err;
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

/*
 * LMDB runs one write transaction at a time, but what each writer does
 * after its commit runs in any order: a transaction that drops blocks
 * may come here before the one that recorded them, though it committed
 * after it (a reader opening the version it knew while an adoption
 * publishes the next, an eviction of blocks a fill has just recorded).
 * The copy used to be moved by each commit's difference, and so went
 * through totals the record never had: fewer blocks than none, wrapped
 * round to 2^64. Whole records, the latest commit's winning, keep it to
 * totals the record had.
 */
int cache_usage_commit(struct cache *cache, struct db_txn **txn,
                       const struct usage_record *usage)
{
    uint64_t txn_id = db_txn_id(*txn);
    int err = db_put(*txn, DB_META, "usage", 5, usage, sizeof(*usage));

    if (err == 0)
        err = db_txn_commit(txn);
    if (err != 0)
        return err;
    pthread_mutex_lock(&cache->lock);
    if (txn_id > cache->usage_txn) {
        cache->usage = *usage;
        cache->usage_txn = txn_id;
    }
    cache_unlock(cache);
    return 0;
}

int cache_next_tick(struct db_txn *txn, uint64_t *tick)
{
    int err = cache_meta_get_u64(txn, "tick", tick);
    if (err == 0)
        err = cache_meta_put_u64(txn, "tick", ++*tick);
    return err;
}

/* ------------------------------------------------------- paths, files */

char *cache_data_path(const struct cache *cache, uint64_t id)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%02x/%016llx", cache->data_dir,
                 (unsigned)(id & 0xff), (unsigned long long)id) < 0)
        return NULL;
    return path;
}

int cache_open_data_file(const struct cache *cache, uint64_t id, int *fd)
{
    char *path = cache_data_path(cache, id);
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
    char *path = cache_data_path(cache, id);
    if (path != NULL && unlink(path) != 0 && errno != ENOENT)
        log_warn("cache: cannot remove %s: %s", path, strerror(errno));
    free(path);
}

/* Give the disk space of a dropped block back, now. */
static void punch_now(const struct cache *cache, uint64_t id, uint64_t block,
                      uint32_t len)
{
    char *path = cache_data_path(cache, id);
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

/* Whether punching BLOCK of object ID waits for the last release of its
 * holds (the punch is put off, LEN bytes at least); false: punch now. */
static bool hold_defer_punch(struct cache *cache, uint64_t id, uint64_t block,
                             uint32_t len);

void cache_punch_block(struct cache *cache, uint64_t id, uint64_t block,
                       uint32_t len)
{
    if (!hold_defer_punch(cache, id, block, len))
        punch_now(cache, id, block, len);
}

/* -------------------------------------------------------------- holds */

static struct hold_shard *hold_shard_of(struct cache *cache, uint64_t id,
                                        uint64_t block)
{
    uint64_t mix = (id * 0x9e3779b97f4a7c15ull) ^ block;
    return &cache->holds[(mix ^ (mix >> 29)) % HOLD_SHARDS];
}

/* The entry of (ID, BLOCK) in SHARD (its lock held), or NULL. */
static struct held_block *held_find_locked(struct hold_shard *shard,
                                           uint64_t id, uint64_t block)
{
    for (size_t i = 0; i < shard->count; i++)
        if (shard->blocks[i].id == id && shard->blocks[i].block == block)
            return &shard->blocks[i];
    return NULL;
}

/* Remove ENTRY from SHARD (its lock held). */
static void held_remove_locked(struct hold_shard *shard,
                               struct held_block *entry)
{
    *entry = shard->blocks[--shard->count];
}

void cache_holds_init(struct cache *cache)
{
    for (unsigned i = 0; i < HOLD_SHARDS; i++) {
        pthread_mutex_init(&cache->holds[i].lock, NULL);
        pthread_cond_init(&cache->holds[i].punched, NULL);
    }
}

void cache_holds_destroy(struct cache *cache)
{
    for (unsigned i = 0; i < HOLD_SHARDS; i++) {
        INVARIANT(cache->holds[i].count == 0,
                  "no block held once the cache closes");
        free(cache->holds[i].blocks);
        pthread_mutex_destroy(&cache->holds[i].lock);
        pthread_cond_destroy(&cache->holds[i].punched);
    }
}

int cache_hold_block(struct cache *cache, uint64_t id, uint64_t block,
                     struct cache_holds *holds)
{
    struct hold_shard *shard = hold_shard_of(cache, id, block);
    int err = 0;

    if (holds->count == CACHE_HOLDS_MAX ||
        (holds->cache != NULL && holds->cache != cache))
        return ENOBUFS;
    pthread_mutex_lock(&shard->lock);
    struct held_block *entry = held_find_locked(shard, id, block);
    if (entry == NULL && shard->count == shard->capacity) {
        size_t capacity = shard->capacity ? shard->capacity * 2 : 8;
        struct held_block *grown = realloc(shard->blocks,
                                           capacity * sizeof(*grown));
        if (grown == NULL) {
            err = ENOBUFS;
            goto out;
        }
        shard->blocks = grown;
        shard->capacity = capacity;
    }
    if (entry == NULL) {
        entry = &shard->blocks[shard->count++];
        *entry = (struct held_block){.id = id, .block = block};
    }
    entry->holds++;
out:
    pthread_mutex_unlock(&shard->lock);
    if (err == 0) {
        holds->cache = cache;
        holds->held[holds->count].id = id;
        holds->held[holds->count].block = block;
        holds->count++;
    }
    return err;
}

/* Let go of one hold of (ID, BLOCK); the last one makes the punch put
 * off for it (and one put off again meanwhile). */
static void hold_release(struct cache *cache, uint64_t id, uint64_t block)
{
    struct hold_shard *shard = hold_shard_of(cache, id, block);

    pthread_mutex_lock(&shard->lock);
    struct held_block *entry = held_find_locked(shard, id, block);
    INVARIANT(entry != NULL && entry->holds > 0, "a hold released once");
    if (entry == NULL || --entry->holds > 0 || entry->punching) {
        pthread_mutex_unlock(&shard->lock);
        return; /* (a release that is punching removes it) */
    }
    while (entry->holds == 0 && entry->punch_len > 0) {
        uint32_t punch_len = entry->punch_len;
        entry->punch_len = 0;
        entry->punching = true;
        pthread_mutex_unlock(&shard->lock);
        punch_now(cache, id, block, punch_len);
        pthread_mutex_lock(&shard->lock);
        entry = held_find_locked(shard, id, block); /* (it may have moved) */
        entry->punching = false;
        pthread_cond_broadcast(&shard->punched);
    }
    if (entry->holds == 0)
        held_remove_locked(shard, entry);
    pthread_mutex_unlock(&shard->lock);
}

void cache_hold_undo(struct cache_holds *holds)
{
    if (holds->count == 0)
        return;
    holds->count--;
    hold_release(holds->cache, holds->held[holds->count].id,
                 holds->held[holds->count].block);
}

void cache_holds_release(struct cache_holds *holds)
{
    while (holds->count > 0)
        cache_hold_undo(holds);
}

bool cache_block_held(struct cache *cache, uint64_t id, uint64_t block)
{
    struct hold_shard *shard = hold_shard_of(cache, id, block);

    pthread_mutex_lock(&shard->lock);
    struct held_block *entry = held_find_locked(shard, id, block);
    bool held = entry != NULL && entry->holds > 0;
    pthread_mutex_unlock(&shard->lock);
    return held;
}

static bool hold_defer_punch(struct cache *cache, uint64_t id, uint64_t block,
                             uint32_t len)
{
    struct hold_shard *shard = hold_shard_of(cache, id, block);

    /* (a hold taken after this lock reads the block's record after the
     * drop's commit, which came before it: it finds none) */
    pthread_mutex_lock(&shard->lock);
    struct held_block *entry = held_find_locked(shard, id, block);
    bool defer = entry != NULL && entry->holds > 0;
    if (defer && len > entry->punch_len)
        entry->punch_len = len;
    pthread_mutex_unlock(&shard->lock);
    return defer;
}

bool cache_hold_take_punch(struct cache *cache, uint64_t id, uint64_t block)
{
    struct hold_shard *shard = hold_shard_of(cache, id, block);
    bool taken = false;

    pthread_mutex_lock(&shard->lock);
    struct held_block *entry;
    while ((entry = held_find_locked(shard, id, block)) != NULL &&
           entry->punching)
        pthread_cond_wait(&shard->punched, &shard->lock);
    if (entry != NULL && entry->punch_len > 0) {
        entry->punch_len = 0;
        taken = true;
    }
    pthread_mutex_unlock(&shard->lock);
    return taken;
}

int cache_compare_object_id(const void *a, const void *b)
{
    const struct cache_object *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

bool cache_object_is_open_locked(struct cache *cache, uint64_t id)
{
    struct cache_object probe = {.id = id};
    return tfind(&probe, &cache->open_objects, cache_compare_object_id) != NULL;
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

int cache_object_blocks_txn(struct db_txn *txn, uint64_t id, uint64_t **blocks,
                            size_t *count)
{
    struct block_list list = {.id = id};
    struct block_key start = block_key(id, 0);
    int err = db_scan(txn, DB_BLOCKS, start.bytes, sizeof(start.bytes),
                      collect_object_blocks, &list);

    if (err != 0) {
        free(list.blocks);
        list = (struct block_list){0};
    }
    *blocks = list.blocks;
    *count = list.count;
    return err;
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
    if (err == 0)
        err = cache_pin_release_txn(txn, id);
    if (err == 0) {
        err = db_del(txn, DB_OBJECTS, id_key, sizeof(id_key));
        if (err == ENOENT)
            err = 0;
    }
    return err;
}

/* Version ID's object record into *RECORD; ENOENT, or EIO for a record
 * too short. */
static int object_record_txn(struct db_txn *txn, uint64_t id,
                             struct object_record *record)
{
    unsigned char id_key[8];
    const void *value;
    size_t len;

    put_be64(id_key, id);
    int err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
    if (err == 0 && len < sizeof(*record))
        err = EIO;
    if (err == 0)
        memcpy(record, value, sizeof(*record));
    return err;
}

int cache_pin_release_txn(struct db_txn *txn, uint64_t id)
{
    struct object_record record;
    uint64_t pinned = 0;
    int err = object_record_txn(txn, id, &record);

    if (err == ENOENT)
        return 0;
    if (err != 0 || !(record.flags & OBJECT_PINNED))
        return err;
    err = cache_meta_get_u64(txn, "pinned", &pinned);
    if (err == 0) {
        uint64_t size = account(record.size);
        err = cache_meta_put_u64(txn, "pinned", pinned > size ? pinned - size : 0);
    }
    return err;
}

int cache_pin_clear_txn(struct db_txn *txn, uint64_t id, bool *was_pinned)
{
    unsigned char id_key[8];
    const void *value;
    size_t len;
    int err;

    *was_pinned = false;
    put_be64(id_key, id);
    err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
    if (err == ENOENT)
        return 0;
    if (err == 0 && len < sizeof(struct object_record))
        err = EIO;
    if (err != 0)
        return err;
    struct object_record record;
    memcpy(&record, value, sizeof(record));
    if (!(record.flags & OBJECT_PINNED))
        return 0;
    char *copy = malloc(len);
    if (copy == NULL)
        return ENOMEM;
    memcpy(copy, value, len);
    err = cache_pin_release_txn(txn, id);
    record.flags &= ~(uint64_t)OBJECT_PINNED;
    memcpy(copy, &record, sizeof(record));
    if (err == 0)
        err = db_put(txn, DB_OBJECTS, id_key, sizeof(id_key), copy, len);
    free(copy);
    *was_pinned = err == 0;
    return err;
}

/* Version ID has just been dropped from the index (committed): if a
 * handle has it open, its file goes at the handle's last close
 * (`replaced`), else now. */
void cache_retire_dropped_version(struct cache *cache, uint64_t id)
{
    pthread_mutex_lock(&cache->lock);
    struct cache_object probe = {.id = id};
    void *open = tfind(&probe, &cache->open_objects, cache_compare_object_id);
    if (open != NULL)
        (*(struct cache_object **)open)->replaced = true;
    cache_unlock(cache);
    if (open == NULL)
        cache_unlink_data_file(cache, id);
}

/* ------------------------------------------------------------ invariants */

static void check_open_object(const void *node, VISIT which, void *arg)
{
    const struct cache_object *object = *(const struct cache_object *const *)node;

    (void)arg;
    if (which == postorder || which == leaf)
        INVARIANT(object->refs > 0, object->key ? object->key : "a version");
}

void cache_check_locked(struct cache *cache)
{
    const struct usage_record *usage = &cache->usage;
    uint64_t bytes = usage->bytes[0] + usage->bytes[1];

    INVARIANT(usage->bytes[0] % ACCOUNT_UNIT == 0 &&
                  usage->bytes[1] % ACCOUNT_UNIT == 0,
              "the cache's usage");
    INVARIANT((usage->blocks == 0) == (bytes == 0), "the cache's usage");
    INVARIANT(bytes >= usage->blocks * ACCOUNT_UNIT, "the cache's usage");
    INVARIANT(cache->touch_count <= TOUCHES_MAX, "the cache's touches");
    twalk_r(cache->open_objects, check_open_object, NULL);
}

struct usage_sum {
    struct usage_record usage;
    bool bad_record;
};

static int add_block(void *arg, const void *key, size_t key_len,
                     const void *value, size_t value_len)
{
    struct usage_sum *sum = arg;
    struct block_record record;

    (void)key, (void)key_len;
    if (value_len < sizeof(record)) {
        sum->bad_record = true;
        return 0;
    }
    memcpy(&record, value, sizeof(record));
    if (record.segment > SEGMENT_PINNED) {
        sum->bad_record = true;
        return 0;
    }
    sum->usage.bytes[usage_slot(record.segment)] += account(record.len);
    sum->usage.blocks++;
    return 0;
}

void cache_check_usage(struct cache *cache)
{
    struct db_txn *txn = NULL;
    struct usage_sum sum = {0};
    struct usage_record stored;

    if (db_txn_begin(cache->db, false, &txn) != 0)
        return;
    int err = cache_usage_get(txn, &stored);
    if (err == 0)
        err = db_scan(txn, DB_BLOCKS, NULL, 0, add_block, &sum);
    db_txn_abort(&txn);
    if (err != 0)
        return;
    INVARIANT(!sum.bad_record, "the cache's block records");
    INVARIANT(stored.bytes[0] == sum.usage.bytes[0] &&
                  stored.bytes[1] == sum.usage.bytes[1] &&
                  stored.blocks == sum.usage.blocks,
              "the usage record against the block records");
    INVARIANT(memcmp(&stored, &cache->usage, sizeof(stored)) == 0,
              "the cache's copy of its usage record");
}
