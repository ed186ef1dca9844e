/*
 * cache_internal.h - what the files of the block cache share, and nothing
 * else includes: the in-memory and stored layouts, the tuning constants,
 * and the helpers one part calls in another. The public API is cache.h.
 *
 *   cache_store.c   what the others build on: the index accessors (meta
 *                   values, the usage record, ticks), the data files,
 *                   dropping blocks and versions, the open-version
 *                   registry, the blocks held for reads not yet
 *                   answered; the invariant checks
 *   cache_policy.c  room and eviction (cache_reserve_disk too), recency
 *                   (touches, promotion, demotion), cache_flush and the
 *                   flusher thread
 *   cache.c         objects (versions, open/close), reading and filling
 *                   blocks, statistics
 *   cache_adopt.c   the write path's calls: adopting a staged file,
 *                   re-keying a version after a copy, forgetting a key
 *   cache_dir.c     the directory: lock, state file and boot id, format
 *                   check, cache_open/cache_close
 * Each uses only those listed before it (cache_dir.c any of them).
 *
 * Index records (host byte order: a cache directory never moves between
 * machines; keys are big-endian so they sort numerically):
 *   DB_META     "format" u64, "block_size" u64, "next_id" u64, "tick" u64,
 *               "usage" struct usage_record, "pinned" u64 (the sum of
 *               account(size) of the versions flagged OBJECT_PINNED)
 *   DB_KEYS     sha256(bucket NUL key) -> u64 id of the cached version
 *   DB_OBJECTS  id -> struct object_record (with the key hash) + etag
 *   DB_BLOCKS   id | block -> struct block_record + one XXH3 per piece
 *   DB_RECENCY  segment | tick | id | block -> (empty); oldest first;
 *               eviction scans probation, then protected, and stops at
 *               SEGMENT_PINNED (the blocks of a pinned version)
 * The record structs below are stored as they are: changing one changes
 * the format (bump FORMAT_VERSION, which empties old caches on open).
 *
 * Locks: `lock` guards open_objects, touches, reserved, usage and
 * usage_txn (a copy of the committed usage record), bounces and stopping,
 * and each cache_object's refs and replaced; flusher_wake (on
 * CLOCK_MONOTONIC) is signalled under it to stop the flusher.
 * `evict_lock` lets one thread at a time choose and drop victims and
 * reserve room; it is held across a whole
 * eviction (its write transaction, then the holes and unlinks).
 * Each of the HOLD_SHARDS shards of `holds` has a mutex of its own, a
 * leaf (nothing else is taken under it, no I/O under it), over the held
 * blocks that hash to it (cache_store.c, "holds").
 * Order: evict_lock, then an index transaction, then `lock`. The rule is
 * never to begin an index transaction while holding `lock` (LMDB's writer
 * lock would then be taken in the opposite order); `lock` may be taken
 * briefly inside one, as retire_object_txn (cache_policy.c) does to ask
 * whether an object is open. `lock` is never held across disk I/O, and
 * block data is read and written outside any transaction.
 * Each cache_object's fd, id, size, block_size and key are immutable.
 */
#ifndef S3CFS_CACHE_INTERNAL_H
#define S3CFS_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <xxhash.h>

#include "base/db.h"
#include "base/invariant.h"
#include "cache/cache.h"

#define FORMAT_VERSION 1
#define INDEX_MAP_SIZE (64ull << 30)   /* address space, not disk */
#define ACCOUNT_UNIT 4096u             /* disk blocks: usage rounds to this */
#define TOUCHES_MAX 16384              /* recency updates waiting for a flush */
#define PROTECTED_SHARE 0.8            /* of size_limit */
#define EVICT_BATCH 256                /* victims per eviction transaction */
#define FLUSH_INTERVAL_S 1
#define SEGMENT_PROBATION 0
#define SEGMENT_PROTECTED 1
#define SEGMENT_PINNED 2               /* blocks of pinned versions: never
                                          evicted; their bytes are counted
                                          in the usage record's probation
                                          slot (usage_slot()), so the
                                          record's layout stays */
#define PIN_SHARE 0.5                  /* of size_limit: pinned versions */
#define OBJECT_PINNED 1u               /* object_record.flags */
#define KEY_HASH_LEN 32                /* SHA-256 */

struct usage_record {
    uint64_t bytes[2];        /* per segment, rounded to ACCOUNT_UNIT */
    uint64_t blocks;
};

struct object_record {
    uint64_t size;
    uint64_t flags;           /* OBJECT_PINNED; 0 in caches written
                                 before pins (the field was
                                 blocks_present, never used, always 0):
                                 the stored layout and FORMAT_VERSION
                                 stay as they are */
    unsigned char key_hash[KEY_HASH_LEN];
    uint16_t etag_len;        /* the ETag follows */
};

struct block_record {
    uint32_t len;
    uint8_t segment;
    uint8_t pad[3];
    uint64_t tick;
    /* uint64_t sums[pieces] follow */
};

struct block_key {
    unsigned char bytes[16];  /* id, block: big-endian */
};

struct recency_key {
    unsigned char bytes[25];  /* segment, tick, id, block */
};

struct touch {
    uint64_t id;
    uint64_t block;
    bool reuse;
};

struct cache_object {
    uint64_t id;
    uint64_t size;
    uint32_t block_size;
    int fd;
    unsigned refs;            /* under cache->lock */
    bool replaced;            /* under cache->lock: a newer version took
                                 its place; its file goes at last close */
    char *key;                /* for log lines */
};

struct cache_fill {
    struct cache *cache;
    struct cache_object *object;
    uint64_t block;
    uint32_t len;             /* the block's full length */
    bool took_punch;          /* a punch put off for a held block was the
                                 fill's to do (on abort) */
    uint32_t written;         /* bytes taken (hashed), in order */
    uint32_t reserved;        /* bytes of room reserved */
    XXH3_state_t *piece_state;
    uint64_t *sums;
    char *pending;            /* FILL_WRITE_SIZE bytes, or NULL: taken
                                 bytes not yet written to the file */
    uint32_t pending_len;     /* the last pending_len of `written` */
};

/* A fill gathers what it is given into writes of up to this many bytes:
 * curl hands a GET's body over 16 KiB at a time (CURL_MAX_WRITE_SIZE,
 * whatever CURLOPT_BUFFERSIZE), and a pwrite each was 64 Ki calls per
 * GiB, each paying the syscall and ext4's per-call work. */
#define FILL_WRITE_SIZE (256u << 10)

/* A block held by reads not yet answered (see "Holds" in cache.h). */
struct held_block {
    uint64_t id;
    uint64_t block;
    unsigned holds;           /* how many sets of holds have it */
    uint32_t punch_len;       /* a punch put off until the last release;
                                 0: none */
    bool punching;            /* the last release is punching it now */
};

/* The held blocks that hash to one shard (hold_shard_of()). */
struct hold_shard {
    pthread_mutex_t lock;     /* a leaf */
    pthread_cond_t punched;   /* a punch of one of its blocks ended */
    struct held_block *blocks;
    size_t count;
    size_t capacity;
};
#define HOLD_SHARDS 64

/* A block-sized read buffer per reading thread, listed in the cache so
 * that cache_close() frees those of threads still alive. */
struct bounce {
    struct cache *cache;
    struct bounce *next, *prev;
    size_t size;
    char data[];
};

/* A block this process filled: its record's tick when it was committed. */
struct fresh_block {
    uint64_t id;
    uint64_t block;
    uint64_t tick;
    bool used;
};
/* How many blocks struct cache remembers filling (a slot per block,
 * chosen by id and block: a run of consecutive blocks takes consecutive
 * slots). 4096: 4 GiB of 1 MiB blocks, far more than the read-ahead keeps
 * ahead of a reader. */
#define FRESH_SLOTS 4096

struct cache {
    char *dir;
    bool left_open;           /* the last mount did not close it (crash) */
    char *bucket;
    char *data_dir;
    uint64_t size_limit;
    uint64_t min_free_bytes;
    double min_free_ratio;
    uint32_t block_size;
    int lock_fd;
    struct db *db;

    pthread_mutex_t lock;
    void *open_objects;       /* tsearch tree of struct cache_object * by id */
    struct touch *touches;
    size_t touch_count;
    uint64_t reserved;
    struct usage_record usage;   /* the usage record as commit usage_txn
                                    left it (cache_usage_commit) */
    uint64_t usage_txn;          /* db_txn_id() of that commit */
    bool stopping;
    pthread_cond_t flusher_wake;
    pthread_t flusher;
    bool flusher_started;
    pthread_mutex_t evict_lock;
    pthread_key_t bounce_key; /* per-thread read buffer (struct bounce) */
    struct bounce *bounces;   /* under lock: every live one */

    /* the blocks this process filled last (see fresh_block_note() in
     * cache.c); fresh_lock guards them and is a leaf */
    pthread_mutex_t fresh_lock;
    struct fresh_block fresh[FRESH_SLOTS];

    /* blocks held for reads not yet answered (cache_store.c) */
    struct hold_shard holds[HOLD_SHARDS];

    _Atomic uint64_t served_bytes;
    _Atomic uint64_t unhashed_bytes;
    _Atomic uint64_t stored_bytes;
    _Atomic uint64_t evicted_blocks;
    _Atomic uint64_t corrupt_blocks;
    _Atomic uint64_t full_logged;  /* log_due() of cache_disk_full() */
};

/* ------------------------------------------------------------ encoding */

static inline void put_be64(unsigned char *out, uint64_t value)
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (unsigned char)value;
        value >>= 8;
    }
}

static inline uint64_t get_be64(const unsigned char *in)
{
    uint64_t value = 0;
    for (int i = 0; i < 8; i++)
        value = (value << 8) | in[i];
    return value;
}

static inline struct block_key block_key(uint64_t id, uint64_t block)
{
    struct block_key key;
    put_be64(key.bytes, id);
    put_be64(key.bytes + 8, block);
    return key;
}

static inline struct recency_key recency_key(uint8_t segment, uint64_t tick,
                                             uint64_t id, uint64_t block)
{
    struct recency_key key;
    key.bytes[0] = segment;
    put_be64(key.bytes + 1, tick);
    put_be64(key.bytes + 9, id);
    put_be64(key.bytes + 17, block);
    return key;
}

static inline uint64_t account(uint64_t len)
{
    return (len + ACCOUNT_UNIT - 1) / ACCOUNT_UNIT * ACCOUNT_UNIT;
}

static inline uint32_t pieces_of(uint32_t len)
{
    return (len + CACHE_PIECE_SIZE - 1) / CACHE_PIECE_SIZE;
}

/* The slot of the usage record that counts segment SEGMENT's bytes. */
static inline unsigned usage_slot(uint8_t segment)
{
    return segment == SEGMENT_PROTECTED ? SEGMENT_PROTECTED : SEGMENT_PROBATION;
}

/* Take BYTES off segment SEGMENT's usage, stopping at 0. */
static inline void usage_sub(struct usage_record *usage, uint8_t segment,
                             uint64_t bytes)
{
    unsigned slot = usage_slot(segment);
    usage->bytes[slot] -= bytes < usage->bytes[slot] ? bytes : usage->bytes[slot];
}

/* ---------------------------------------- cache_store.c: invariants */

/* Check what holds under `lock` (see the top of cache_store.c); lock
 * held. Called by cache_unlock() in debug builds. */
void cache_check_locked(struct cache *cache);

/* Check the usage record against the index: its bytes per segment and its
 * block count are those of the block records, and the copy in struct
 * cache is the record. Nothing else may use the cache meanwhile (the
 * flusher stopped: cache_close() calls it in debug builds). */
void cache_check_usage(struct cache *cache);

/* Release `lock`, checking cache_check_locked() first in debug builds. */
static inline void cache_unlock(struct cache *cache)
{
    if (INVARIANTS_ON)
        cache_check_locked(cache);
    pthread_mutex_unlock(&cache->lock);
}

/* ------------------------------------- cache_store.c: index accessors */

/* The hash naming KEY of BUCKET in the index (HASH_LEN bytes into OUT). */
int cache_key_hash(const char *bucket, const char *key, unsigned char *out);

/* A u64 in DB_META (0 when absent). */
int cache_meta_get_u64(struct db_txn *txn, const char *name, uint64_t *out);
int cache_meta_put_u64(struct db_txn *txn, const char *name, uint64_t value);

/* The stored usage record (zeros when absent). */
int cache_usage_get(struct db_txn *txn, struct usage_record *out);

/* Store USAGE as the usage record, commit the write transaction *TXN
 * (*TXN = NULL, as db_txn_commit), and make USAGE cache->usage unless a
 * later commit's record is there already (takes `lock`). The one way a
 * transaction that changed blocks ends in a commit. */
int cache_usage_commit(struct cache *cache, struct db_txn **txn,
                       const struct usage_record *usage);

/* The next recency tick, stored in TXN. */
int cache_next_tick(struct db_txn *txn, uint64_t *tick);

/* Remove block BLOCK of object ID from the index in TXN, updating USAGE;
 * *len gets its length. ENOENT if it was not recorded. */
int cache_drop_block_txn(struct db_txn *txn, uint64_t id, uint64_t block,
                         struct usage_record *usage, uint32_t *len);

/* Forget version ID in TXN: its blocks (updating USAGE) and its object
 * record (the KEYS entry naming it, if any, stays). */
int cache_drop_version_txn(struct db_txn *txn, uint64_t id,
                           struct usage_record *usage);

/* The blocks object ID has recorded, in order: *BLOCKS (malloc'd, the
 * caller frees it; NULL when none) and *COUNT. 0, ENOMEM or the index's
 * errno. */
int cache_object_blocks_txn(struct db_txn *txn, uint64_t id, uint64_t **blocks,
                            size_t *count);

/* Version ID's record in TXN is going (its blocks are gone): if it was
 * pinned, its size leaves the "pinned" sum. Call before deleting it. */
int cache_pin_release_txn(struct db_txn *txn, uint64_t id);

/* If version ID is pinned: its flag cleared, its size out of the
 * "pinned" sum (its blocks stay where they are: the caller moves or
 * drops them). *was_pinned says whether it was. */
int cache_pin_clear_txn(struct db_txn *txn, uint64_t id, bool *was_pinned);

/* Whether object ID has an open handle; call with `lock` held. */
bool cache_object_is_open_locked(struct cache *cache, uint64_t id);

/* The order of cache->open_objects (by id). */
int cache_compare_object_id(const void *a, const void *b);

/* Version ID has just been dropped from the index (committed): if a
 * handle has it open, its file goes at the handle's last close
 * (`replaced`), else now. */
void cache_retire_dropped_version(struct cache *cache, uint64_t id);

/* ----------------------------------------- cache_store.c: data files */

/* The path of object ID's data file, malloc'd (NULL: out of memory). */
char *cache_data_path(const struct cache *cache, uint64_t id);

/* Open (creating) object ID's data file into *fd. */
int cache_open_data_file(const struct cache *cache, uint64_t id, int *fd);

/* Remove the data file of object ID (a missing one is fine). */
void cache_unlink_data_file(const struct cache *cache, uint64_t id);

/* Give the disk space of block BLOCK (LEN bytes) of object ID back,
 * which the index no longer records: now, or, while the block is held,
 * at its last release (a fill of the block may take that over:
 * cache_hold_take_punch()). */
void cache_punch_block(struct cache *cache, uint64_t id, uint64_t block,
                       uint32_t len);

/* ---------------------------------------------- cache_store.c: holds */

/* Set up and tear down the shards of cache->holds (cache_dir.c: the
 * cache opened, the cache closed with no block held). */
void cache_holds_init(struct cache *cache);
void cache_holds_destroy(struct cache *cache);

/* Hold block BLOCK of object ID in HOLDS, before its record is read (so
 * that a drop committed before the hold is seen, and one committed after
 * it punches nothing until the release). 0, or ENOBUFS (HOLDS full, or
 * no memory). */
int cache_hold_block(struct cache *cache, uint64_t id, uint64_t block,
                     struct cache_holds *holds);

/* Let go of the last block cache_hold_block() added to HOLDS (nothing of
 * it went into the pipe). */
void cache_hold_undo(struct cache_holds *holds);

/* Whether block BLOCK of object ID is held (eviction passes it by).
 * Takes its shard's lock: callable inside an index transaction. */
bool cache_block_held(struct cache *cache, uint64_t id, uint64_t block);

/* A fill of block BLOCK of object ID begins: a punch put off for its
 * range (a held block dropped) is the fill's now (it writes the same
 * range: true, and an abort punches the block), and one under way is
 * waited for. */
bool cache_hold_take_punch(struct cache *cache, uint64_t id, uint64_t block);

/* ------------------------------------------------------------- cache.c */

/* The destructor of bounce_key: frees a thread's read buffer. */
void cache_free_bounce(void *arg);

/* --------------------------------------------------- cache_policy.c */

/* Evict (clean blocks, least recently used first, probation before
 * protected) until NEED more bytes fit under cache_size and DISK_NEED
 * more bytes can be written to the filesystem leaving min_free; then
 * reserve NEED (give it back with cache_release_room()). A fill passes
 * its block for both; an adopted file, already on disk, only NEED; a
 * staging file (cache_reserve_disk) only DISK_NEED. ENOSPC if evicting
 * everything would not do. */
int cache_make_room(struct cache *cache, uint64_t need, uint64_t disk_need);

/* File block BLOCK of object ID under segment TO (at its most recent
 * end), updating USAGE; ENOENT when it is not recorded. */
int cache_segment_move_txn(struct db_txn *txn, uint64_t id, uint64_t block,
                           uint8_t to, struct usage_record *usage);

/* Give back BYTES reserved by cache_make_room(). */
void cache_release_room(struct cache *cache, uint64_t bytes);

/* Note that block BLOCK of object ID was read (REUSE: read again), for
 * the next cache_flush(). Best effort: dropped when too many wait. */
void cache_add_touch(struct cache *cache, uint64_t id, uint64_t block,
                     bool reuse);

/* The flusher thread: cache_flush() every FLUSH_INTERVAL_S until
 * cache->stopping. */
void *cache_flusher_main(void *arg);

#endif /* S3CFS_CACHE_INTERNAL_H */
