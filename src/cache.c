/*
 * cache.c - block cache on local disk, indexed in LMDB (see cache.h).
 *
 * Index records (host byte order: a cache directory never moves between
 * machines; keys are big-endian so they sort numerically):
 *   DB_META     "format" u32, "block_size" u32, "next_id" u64, "tick" u64,
 *               "usage" struct usage_record
 *   DB_KEYS     sha256(bucket NUL key) -> u64 id of the cached version
 *   DB_OBJECTS  id -> struct object_record + etag + key hash
 *   DB_BLOCKS   id | block -> struct block_record + one XXH3 per piece
 *   DB_RECENCY  segment | tick | id | block -> (empty); oldest first
 *
 * Locks: `lock` guards open_objects, touches, reserved, usage (the
 * in-memory mirror of the committed usage record) and stopping;
 * `evict_lock` lets one thread at a time choose and drop victims;
 * flusher_wake is signalled to stop the flusher. An index transaction is
 * never open while `lock` is held, and neither is held across disk I/O.
 * Each cache_object's fd, id, size and key are immutable; refs is under
 * `lock`.
 */
#include "config.h"

#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "db.h"
#include "log.h"

#define FORMAT_VERSION 1
#define INDEX_MAP_SIZE (64ull << 30)   /* address space, not disk */
#define ACCOUNT_UNIT 4096u             /* disk blocks: usage rounds to this */
#define TOUCHES_MAX 16384              /* recency updates waiting for a flush */
#define PROTECTED_SHARE 0.8            /* of size_limit */
#define EVICT_BATCH 256                /* victims per eviction transaction */
#define FLUSH_INTERVAL_S 1
#define SEGMENT_PROBATION 0
#define SEGMENT_PROTECTED 1
#define KEY_HASH_LEN 32                /* SHA-256 */

struct usage_record {
    uint64_t bytes[2];        /* per segment, rounded to ACCOUNT_UNIT */
    uint64_t blocks;
};

struct object_record {
    uint64_t size;
    uint64_t blocks_present;
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
    uint32_t written;
    uint32_t reserved;        /* bytes of room reserved */
    XXH3_state_t *piece_state;
    uint64_t *sums;
};

/* A block-sized read buffer per reading thread, listed in the cache so
 * that cache_close() frees those of threads still alive. */
struct bounce {
    struct cache *cache;
    struct bounce *next, *prev;
    size_t size;
    char data[];
};

struct cache {
    char *dir;
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
    struct usage_record usage;
    bool stopping;
    pthread_cond_t flusher_wake;
    pthread_t flusher;
    bool flusher_started;
    pthread_mutex_t evict_lock;
    pthread_key_t bounce_key; /* per-thread read buffer (struct bounce) */
    struct bounce *bounces;   /* under lock: every live one */

    _Atomic uint64_t served_bytes;
    _Atomic uint64_t stored_bytes;
    _Atomic uint64_t evicted_blocks;
    _Atomic uint64_t corrupt_blocks;
};

/* ------------------------------------------------------------ encoding */

static void put_be64(unsigned char *out, uint64_t value)
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (unsigned char)value;
        value >>= 8;
    }
}

static uint64_t get_be64(const unsigned char *in)
{
    uint64_t value = 0;
    for (int i = 0; i < 8; i++)
        value = (value << 8) | in[i];
    return value;
}

static struct block_key block_key(uint64_t id, uint64_t block)
{
    struct block_key key;
    put_be64(key.bytes, id);
    put_be64(key.bytes + 8, block);
    return key;
}

static struct recency_key recency_key(uint8_t segment, uint64_t tick,
                                      uint64_t id, uint64_t block)
{
    struct recency_key key;
    key.bytes[0] = segment;
    put_be64(key.bytes + 1, tick);
    put_be64(key.bytes + 9, id);
    put_be64(key.bytes + 17, block);
    return key;
}

static uint64_t account(uint64_t len)
{
    return (len + ACCOUNT_UNIT - 1) / ACCOUNT_UNIT * ACCOUNT_UNIT;
}

static uint32_t pieces_of(uint32_t len)
{
    return (len + CACHE_PIECE_SIZE - 1) / CACHE_PIECE_SIZE;
}

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

/* --------------------------------------------------------- meta values */

static int meta_get_u64(struct db_txn *txn, const char *name, uint64_t *out)
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

static int meta_put_u64(struct db_txn *txn, const char *name, uint64_t value)
{
    return db_put(txn, DB_META, name, strlen(name), &value, sizeof(value));
}

static int usage_get(struct db_txn *txn, struct usage_record *out)
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

static int usage_put(struct db_txn *txn, const struct usage_record *usage)
{
    return db_put(txn, DB_META, "usage", 5, usage, sizeof(*usage));
}

/* After a commit, move the in-memory mirror of the usage record by what
 * the transaction changed (BEFORE -> AFTER). Applying differences keeps
 * the mirror right whatever order committed transactions report in. */
static void usage_mirror(struct cache *cache, const struct usage_record *before,
                         const struct usage_record *after)
{
    pthread_mutex_lock(&cache->lock);
    for (int i = 0; i < 2; i++)
        cache->usage.bytes[i] += after->bytes[i] - before->bytes[i];
    cache->usage.blocks += after->blocks - before->blocks;
    pthread_mutex_unlock(&cache->lock);
}

static int next_tick(struct db_txn *txn, uint64_t *tick)
{
    int err = meta_get_u64(txn, "tick", tick);
    if (err == 0)
        err = meta_put_u64(txn, "tick", ++*tick);
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

static void unlink_data_file(const struct cache *cache, uint64_t id)
{
    char *path = data_path(cache, id);
    if (path != NULL && unlink(path) != 0 && errno != ENOENT)
        log_warn("cache: cannot remove %s: %s", path, strerror(errno));
    free(path);
}

/* Give the disk space of a dropped block back (the index no longer
 * records it; a reader racing with us sees a checksum failure). */
static void punch_block(const struct cache *cache, uint64_t id, uint64_t block,
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

/* Remove every file under DIR (one level of fan-out directories). */
static void remove_data_files(const char *dir)
{
    DIR *top = opendir(dir);
    struct dirent *entry;

    if (top == NULL)
        return;
    while ((entry = readdir(top)) != NULL) {
        if (entry->d_name[0] == '.')
            continue;
        char *sub = NULL;
        if (asprintf(&sub, "%s/%s", dir, entry->d_name) < 0)
            continue;
        DIR *inner = opendir(sub);
        struct dirent *file;
        while (inner != NULL && (file = readdir(inner)) != NULL) {
            if (file->d_name[0] == '.')
                continue;
            char *path = NULL;
            if (asprintf(&path, "%s/%s", sub, file->d_name) >= 0)
                unlink(path);
            free(path);
        }
        if (inner != NULL)
            closedir(inner);
        rmdir(sub);
        free(sub);
    }
    closedir(top);
}

/* ------------------------------------------------------------- locking */

/* mkdir -p DIR (mode 0700 for what it creates). */
static int make_dirs(const char *dir)
{
    char *path = strdup(dir);
    int err = 0;

    if (path == NULL)
        return ENOMEM;
    for (char *slash = strchr(path + 1, '/'); ; slash = strchr(slash + 1, '/')) {
        if (slash != NULL)
            *slash = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            err = errno;
            break;
        }
        if (slash == NULL)
            break;
        *slash = '/';
    }
    free(path);
    return err;
}

int cache_lock_dir(const char *dir, int *lock_fd, char *errbuf, size_t errlen)
{
    char *path = NULL;
    char holder[32] = "";
    int fd = -1;
    int err = 0;

    *lock_fd = -1;
    err = make_dirs(dir);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot create the cache directory %s: %s",
                 dir, strerror(err));
        return err;
    }
    if (asprintf(&path, "%s/lock", dir) < 0)
        return ENOMEM;
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        snprintf(errbuf, errlen, "cannot use the cache directory %s: %s", dir,
                 strerror(err));
        goto out;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        err = errno == EWOULDBLOCK ? EWOULDBLOCK : errno;
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (err == EWOULDBLOCK)
            snprintf(errbuf, errlen, "the cache directory %s is in use by "
                     "another s3cachefs mount (pid %s); use another -o cache=",
                     dir, holder[0] ? holder : "unknown");
        else
            snprintf(errbuf, errlen, "cannot lock the cache directory %s: %s",
                     dir, strerror(err));
        goto out;
    }
    /* the pid is rewritten after daemonizing too (see cache_open) */
    snprintf(holder, sizeof(holder), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, strlen(holder), 0) < 0) {
        /* only informative */
    }
    *lock_fd = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return err;
}

/* --------------------------------------------------- session and boot */

static void read_boot_id(char *out, size_t len)
{
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");

    out[0] = '\0';
    if (fp != NULL) {
        if (fgets(out, (int)len, fp) == NULL)
            out[0] = '\0';
        fclose(fp);
    }
    out[strcspn(out, "\n")] = '\0';
}

/* The state file says "BOOT_ID clean|open": written (and fsynced) when the
 * index is opened and when it is closed cleanly. */
static int write_state(const struct cache *cache, const char *boot_id,
                       bool clean)
{
    char *path = NULL, *tmp = NULL;
    int err = 0;

    if (asprintf(&path, "%s/state", cache->dir) < 0) {
        path = NULL;
        return ENOMEM;
    }
    if (asprintf(&tmp, "%s/state.tmp", cache->dir) < 0) {
        free(path);
        return ENOMEM;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        goto out;
    }
    char line[128];
    int n = snprintf(line, sizeof(line), "%s %s\n", boot_id, clean ? "clean" : "open");
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0)
        err = errno ? errno : EIO;
    close(fd);
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
out:
    free(path);
    free(tmp);
    return err;
}

/* Whether the index may be damaged: left open (not closed cleanly) by a
 * boot that is not this one, i.e. the machine crashed while it was open. */
static bool index_may_be_damaged(const struct cache *cache, const char *boot_id)
{
    char *path = NULL;
    char line[128] = "";
    bool damaged = false;

    if (asprintf(&path, "%s/state", cache->dir) < 0)
        return false;
    FILE *fp = fopen(path, "r");
    if (fp != NULL) {
        if (fgets(line, sizeof(line), fp) != NULL) {
            char *space = strchr(line, ' ');
            if (space != NULL) {
                *space = '\0';
                damaged = strncmp(space + 1, "open", 4) == 0 &&
                          strcmp(line, boot_id) != 0;
            }
        }
        fclose(fp);
    }
    free(path);
    return damaged;
}

static void remove_index(const struct cache *cache)
{
    char *path = NULL;
    const char *files[] = {"data.mdb", "lock.mdb"};

    for (size_t i = 0; i < 2; i++) {
        if (asprintf(&path, "%s/index/%s", cache->dir, files[i]) >= 0) {
            unlink(path);
            free(path);
        }
    }
}

/* ------------------------------------------------------------- opening */

static int check_format(struct cache *cache)
{
    struct db_txn *txn = NULL;
    uint64_t stored_block_size = 0, format = 0;
    int err = db_txn_begin(cache->db, true, &txn);

    if (err == 0)
        err = meta_get_u64(txn, "format", &format);
    if (err == 0)
        err = meta_get_u64(txn, "block_size", &stored_block_size);
    if (err != 0)
        goto out;
    if ((format != 0 && format != FORMAT_VERSION) ||
        (stored_block_size != 0 && stored_block_size != cache->block_size)) {
        log_warn("cache: %s holds blocks of %llu bytes (format %llu); "
                 "emptying it for blocks of %u bytes", cache->dir,
                 (unsigned long long)stored_block_size,
                 (unsigned long long)format, cache->block_size);
        for (int table = 0; table < DB_TABLE_COUNT && err == 0; table++)
            err = db_clear(txn, (enum db_table)table);
        remove_data_files(cache->data_dir);
    }
    if (err == 0)
        err = meta_put_u64(txn, "format", FORMAT_VERSION);
    if (err == 0)
        err = meta_put_u64(txn, "block_size", cache->block_size);
    if (err == 0)
        err = usage_get(txn, &cache->usage);
    if (err == 0)
        err = db_txn_commit(&txn);
out:
    db_txn_abort(&txn);
    return err;
}

static void *flusher_main(void *arg);
static void free_bounce(void *arg);

int cache_open(const struct cache_conf *conf, int lock_fd, struct cache **out,
               char *errbuf, size_t errlen)
{
    struct cache *cache = calloc(1, sizeof(*cache));
    char boot_id[64];
    char *index_dir = NULL;
    int err = 0;

    *out = NULL;
    if (cache == NULL)
        return ENOMEM;
    cache->lock_fd = lock_fd;
    cache->size_limit = conf->size_limit;
    cache->min_free_bytes = conf->min_free_bytes;
    cache->min_free_ratio = conf->min_free_ratio;
    cache->block_size = conf->block_size;
    pthread_mutex_init(&cache->lock, NULL);
    pthread_mutex_init(&cache->evict_lock, NULL);
    pthread_cond_init(&cache->flusher_wake, NULL);
    pthread_key_create(&cache->bounce_key, free_bounce);
    cache->dir = strdup(conf->dir);
    cache->bucket = strdup(conf->bucket);
    cache->touches = calloc(TOUCHES_MAX, sizeof(*cache->touches));
    if (cache->dir == NULL || cache->bucket == NULL || cache->touches == NULL ||
        asprintf(&cache->data_dir, "%s/data", conf->dir) < 0 ||
        asprintf(&index_dir, "%s/index", conf->dir) < 0) {
        err = ENOMEM;
        goto out;
    }
    /* the daemon's pid, now that it has forked */
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(lock_fd, 0) != 0 || pwrite(lock_fd, pid, (size_t)n, 0) < 0) {
        /* only informative */
    }
    if ((mkdir(cache->data_dir, 0700) != 0 && errno != EEXIST) ||
        (mkdir(index_dir, 0700) != 0 && errno != EEXIST)) {
        err = errno;
        snprintf(errbuf, errlen, "cannot create %s: %s", index_dir, strerror(err));
        goto out;
    }
    read_boot_id(boot_id, sizeof(boot_id));
    if (index_may_be_damaged(cache, boot_id)) {
        log_warn("cache: %s was in use when the machine stopped; its index "
                 "may be damaged, starting it empty", cache->dir);
        remove_index(cache);
        remove_data_files(cache->data_dir);
    }
    err = write_state(cache, boot_id, false);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot write to the cache directory %s: %s",
                 cache->dir, strerror(err));
        goto out;
    }
    err = db_open(index_dir, INDEX_MAP_SIZE, false, &cache->db, errbuf, errlen);
    if (err != 0)
        goto out;
    err = check_format(cache);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot read the cache index in %s: %s",
                 index_dir, strerror(err));
        goto out;
    }
    err = pthread_create(&cache->flusher, NULL, flusher_main, cache);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot start the cache flusher: %s", strerror(err));
        goto out;
    }
    cache->flusher_started = true;
out:
    free(index_dir);
    if (err != 0) {
        cache->lock_fd = -1; /* stays the caller's on failure */
        cache_close(&cache);
    }
    *out = cache;
    return err;
}

static void no_free(void *node)
{
    (void)node;
}

void cache_close(struct cache **cachep)
{
    struct cache *cache = *cachep;
    char boot_id[64];

    if (cache == NULL)
        return;
    if (cache->flusher_started) {
        pthread_mutex_lock(&cache->lock);
        cache->stopping = true;
        pthread_cond_signal(&cache->flusher_wake);
        pthread_mutex_unlock(&cache->lock);
        pthread_join(cache->flusher, NULL);
    }
    if (cache->db != NULL) {
        cache_flush(cache);
        db_close(&cache->db);
        read_boot_id(boot_id, sizeof(boot_id));
        write_state(cache, boot_id, true);
    }
    tdestroy(cache->open_objects, no_free);
    if (cache->lock_fd >= 0)
        close(cache->lock_fd);
    pthread_key_delete(cache->bounce_key); /* runs no destructors: */
    while (cache->bounces != NULL) {
        struct bounce *next = cache->bounces->next;
        free(cache->bounces);
        cache->bounces = next;
    }
    pthread_mutex_destroy(&cache->lock);
    pthread_mutex_destroy(&cache->evict_lock);
    pthread_cond_destroy(&cache->flusher_wake);
    free(cache->touches);
    free(cache->dir);
    free(cache->bucket);
    free(cache->data_dir);
    free(cache);
    *cachep = NULL;
}

void cache_get_stats(struct cache *cache, struct cache_stats *out)
{
    pthread_mutex_lock(&cache->lock);
    out->used_bytes = cache->usage.bytes[0] + cache->usage.bytes[1];
    out->protected_bytes = cache->usage.bytes[SEGMENT_PROTECTED];
    out->blocks = cache->usage.blocks;
    pthread_mutex_unlock(&cache->lock);
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

static bool object_is_open_locked(struct cache *cache, uint64_t id)
{
    struct cache_object probe = {.id = id};
    return tfind(&probe, &cache->open_objects, compare_object_id) != NULL;
}

/* Remove block BLOCK of object ID from the index in TXN; *len gets its
 * length. ENOENT if it was not recorded. Updates USAGE. */
static int drop_block_txn(struct db_txn *txn, uint64_t id, uint64_t block,
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
        uint8_t segment = record.segment == SEGMENT_PROTECTED;
        uint64_t bytes = account(record.len);
        usage->bytes[segment] -= bytes < usage->bytes[segment] ? bytes
                                                               : usage->bytes[segment];
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
static int drop_version_txn(struct db_txn *txn, uint64_t id,
                            struct usage_record *usage)
{
    struct block_list list = {.id = id};
    struct block_key start = block_key(id, 0);
    unsigned char id_key[8];
    uint32_t len;
    int err = db_scan(txn, DB_BLOCKS, start.bytes, sizeof(start.bytes),
                      collect_object_blocks, &list);

    for (size_t i = 0; err == 0 && i < list.count; i++)
        err = drop_block_txn(txn, id, list.blocks[i], usage, &len);
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
    err = usage_get(txn, &usage);
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
        err = drop_version_txn(txn, *stale_id, &usage);
    } else if (err == ENOENT || err == 0) {
        err = 0;
    }
    if (err != 0)
        goto out;

    err = meta_get_u64(txn, "next_id", id);
    if (err == 0)
        err = meta_put_u64(txn, "next_id", ++*id);
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
        err = usage_put(txn, &usage);
    if (err == 0)
        err = db_txn_commit(&txn);
    if (err == 0) {
        usage_mirror(cache, &before, &usage);
    }
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
    if (stale_id != 0) {
        pthread_mutex_lock(&cache->lock);
        struct cache_object probe = {.id = stale_id};
        void *open = tfind(&probe, &cache->open_objects, compare_object_id);
        if (open != NULL)
            (*(struct cache_object **)open)->replaced = true;
        pthread_mutex_unlock(&cache->lock);
        if (open == NULL)
            unlink_data_file(cache, stale_id);
    }

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
            unlink_data_file(cache, object->id);
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
    int err = usage_get(txn, &usage);
    before = usage;
    if (err == 0)
        err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &len);
    if (err == 0 && len >= sizeof(struct block_record) &&
        ((const struct block_record *)value)->tick != tick)
        err = ESTALE; /* replaced since: not ours to drop */
    if (err == 0)
        err = drop_block_txn(txn, object->id, block, &usage, &dropped_len);
    if (err == 0)
        err = usage_put(txn, &usage);
    if (err == 0)
        err = db_txn_commit(&txn);
    if (err == 0) {
        dropped = true;
        usage_mirror(cache, &before, &usage);
    }
    db_txn_abort(&txn);
    if (dropped) {
        if (dropped_len > 0)
            punch_block(cache, object->id, block, dropped_len);
        atomic_fetch_add(&cache->corrupt_blocks, 1);
        log_warn("cache: block %llu of '%s' is damaged (%s); fetching it again",
                 (unsigned long long)block, object->key, why);
    }
}

static void free_bounce(void *arg)
{
    struct bounce *bounce = arg;
    struct cache *cache = bounce->cache;

    pthread_mutex_lock(&cache->lock);
    if (bounce->prev != NULL)
        bounce->prev->next = bounce->next;
    else
        cache->bounces = bounce->next;
    if (bounce->next != NULL)
        bounce->next->prev = bounce->prev;
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
    if (bounce != NULL) { /* replace the smaller one in the list */
        if (bounce->prev != NULL)
            bounce->prev->next = bounce->next;
        else
            cache->bounces = bounce->next;
        if (bounce->next != NULL)
            bounce->next->prev = bounce->prev;
    }
    fresh->next = cache->bounces;
    if (cache->bounces != NULL)
        cache->bounces->prev = fresh;
    cache->bounces = fresh;
    pthread_mutex_unlock(&cache->lock);
    free(bounce);
    pthread_setspecific(cache->bounce_key, fresh);
    return fresh->data;
}

static void add_touch(struct cache *cache, uint64_t id, uint64_t block, bool reuse)
{
    pthread_mutex_lock(&cache->lock);
    if (cache->touch_count < TOUCHES_MAX) /* recency is best effort */
        cache->touches[cache->touch_count++] = (struct touch){id, block, reuse};
    pthread_mutex_unlock(&cache->lock);
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
    bounce = bounce_buffer(cache, span_end - span_start);
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
    memcpy(buf, bounce + (offset - span_start), len);
    atomic_fetch_add(&cache->served_bytes, len);
    if (reuse)
        add_touch(cache, object->id, block, true);
    return 0;
}

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
};

static int collect_victim(void *arg, const void *key, size_t key_len,
                          const void *value, size_t value_len)
{
    struct victim_scan *scan = arg;
    const unsigned char *bytes = key;
    (void)value;
    (void)value_len;
    if (key_len != sizeof(struct recency_key) || scan->count == scan->max)
        return -1;
    scan->victims[scan->count++] = (struct victim){
        .segment = bytes[0],
        .id = get_be64(bytes + 9),
        .block = get_be64(bytes + 17),
    };
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
    bool open = object_is_open_locked(cache, id);
    pthread_mutex_unlock(&cache->lock);
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
    struct victim_scan scan = {.victims = victims, .max = EVICT_BATCH};
    uint64_t retired[EVICT_BATCH];
    size_t retired_count = 0;
    struct db_txn *txn = NULL;
    struct usage_record usage, before;
    uint64_t freed = 0;
    size_t dropped = 0;

    *err = db_txn_begin(cache->db, true, &txn);
    if (*err != 0)
        return 0;
    *err = usage_get(txn, &usage);
    before = usage;
    if (*err == 0)
        *err = db_scan(txn, DB_RECENCY, NULL, 0, collect_victim, &scan);
    for (size_t i = 0; *err == 0 && i < scan.count && freed < want; i++) {
        *err = drop_block_txn(txn, victims[i].id, victims[i].block, &usage,
                              &victims[i].len);
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
        *err = usage_put(txn, &usage);
    if (*err == 0)
        *err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    if (*err != 0)
        return 0;
    usage_mirror(cache, &before, &usage);

    for (size_t i = 0; i < dropped; i++) {
        bool gone = false;
        for (size_t k = 0; k < retired_count; k++)
            gone = gone || retired[k] == victims[i].id;
        if (!gone && victims[i].len > 0)
            punch_block(cache, victims[i].id, victims[i].block, victims[i].len);
    }
    for (size_t k = 0; k < retired_count; k++)
        unlink_data_file(cache, retired[k]);
    atomic_fetch_add(&cache->evicted_blocks, dropped);
    return freed;
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

/* Evict until NEED more bytes fit under both bounds, then reserve them
 * (checked and reserved under evict_lock, so concurrent fills cannot
 * overshoot together). ENOSPC if they cannot fit. */
static int make_room(struct cache *cache, uint64_t need)
{
    int err = 0;

    pthread_mutex_lock(&cache->evict_lock);
    for (;;) {
        uint64_t free_bytes, keep_free;
        pthread_mutex_lock(&cache->lock);
        uint64_t committed = cache->usage.bytes[0] + cache->usage.bytes[1] +
                             cache->reserved;
        pthread_mutex_unlock(&cache->lock);
        disk_space(cache, &free_bytes, &keep_free);
        uint64_t over_size = committed + need > cache->size_limit
                                 ? committed + need - cache->size_limit : 0;
        uint64_t over_disk = free_bytes < keep_free + need
                                 ? keep_free + need - free_bytes : 0;
        uint64_t want = over_size > over_disk ? over_size : over_disk;
        if (want == 0) {
            pthread_mutex_lock(&cache->lock);
            cache->reserved += need;
            pthread_mutex_unlock(&cache->lock);
            break;
        }
        if (evict_some(cache, want, &err) == 0) {
            if (err == 0)
                err = ENOSPC;
            break;
        }
    }
    pthread_mutex_unlock(&cache->evict_lock);
    return err;
}

static void release_room(struct cache *cache, uint64_t bytes)
{
    pthread_mutex_lock(&cache->lock);
    cache->reserved -= bytes;
    pthread_mutex_unlock(&cache->lock);
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
    err = make_room(cache, account(len));
    if (err != 0)
        return err;
    fill = calloc(1, sizeof(*fill));
    if (fill == NULL) {
        release_room(cache, account(len));
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
        release_room(cache, fill->reserved);
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
        uint32_t in_piece = fill->written % CACHE_PIECE_SIZE;
        size_t take = CACHE_PIECE_SIZE - in_piece;
        if (take > len)
            take = len;
        ssize_t done = pwrite(fill->object->fd, bytes, take,
                              (off_t)(base + fill->written));
        if (done < 0)
            return errno;
        if (done == 0)
            return EIO;
        XXH3_64bits_update(fill->piece_state, bytes, (size_t)done);
        fill->written += (uint32_t)done;
        bytes += done;
        len -= (size_t)done;
        if (fill->written % CACHE_PIECE_SIZE == 0 || fill->written == fill->len) {
            fill->sums[(fill->written - 1) / CACHE_PIECE_SIZE] =
                XXH3_64bits_digest(fill->piece_state);
            XXH3_64bits_reset(fill->piece_state);
        }
    }
    return 0;
}

static void fill_free(struct cache_fill *fill)
{
    release_room(fill->cache, fill->reserved);
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
        punch_block((*fillp)->cache, (*fillp)->object->id, (*fillp)->block,
                    (*fillp)->written);
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
        err = usage_get(txn, &usage);
    before = usage;
    if (err == 0) {
        err = drop_block_txn(txn, id, fill->block, &usage, &old_len);
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = next_tick(txn, &tick);
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
        err = usage_put(txn, &usage);
    }
    if (err == 0)
        err = db_txn_commit(&txn);
    if (err == 0) {
        usage_mirror(cache, &before, &usage);
        atomic_fetch_add(&cache->stored_bytes, fill->len);
    }
out:
    db_txn_abort(&txn);
    free(record);
    fill_free(fill);
    return err;
}

/* ------------------------------------------------------------ recency */

/* Move a touched block to the most recent end of its segment, promoting
 * a re-used probation block. */
static int apply_touch_txn(struct db_txn *txn, const struct touch *touch,
                           struct usage_record *usage, char *scratch)
{
    struct block_key key = block_key(touch->id, touch->block);
    struct block_record record;
    const void *value;
    size_t len;
    uint64_t tick;
    int err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &len);

    if (err == ENOENT)
        return 0; /* evicted since */
    if (err != 0 || len < sizeof(record) || len > sizeof(record) +
        (CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE) * sizeof(uint64_t))
        return err;
    memcpy(scratch, value, len);
    memcpy(&record, scratch, sizeof(record));
    struct recency_key old_key = recency_key(record.segment, record.tick,
                                             touch->id, touch->block);
    db_del(txn, DB_RECENCY, old_key.bytes, sizeof(old_key.bytes));
    err = next_tick(txn, &tick);
    if (err != 0)
        return err;
    if (touch->reuse && record.segment == SEGMENT_PROBATION) {
        uint64_t bytes = account(record.len);
        usage->bytes[SEGMENT_PROBATION] -= bytes < usage->bytes[SEGMENT_PROBATION]
                                               ? bytes : usage->bytes[SEGMENT_PROBATION];
        usage->bytes[SEGMENT_PROTECTED] += bytes;
        record.segment = SEGMENT_PROTECTED;
    }
    record.tick = tick;
    memcpy(scratch, &record, sizeof(record));
    struct recency_key new_key = recency_key(record.segment, tick, touch->id,
                                             touch->block);
    err = db_put(txn, DB_RECENCY, new_key.bytes, sizeof(new_key.bytes), "", 0);
    if (err == 0)
        err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), scratch, len);
    return err;
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
            struct block_key key = block_key(victims[i].id, victims[i].block);
            struct block_record record;
            const void *value;
            size_t len;
            uint64_t tick;
            err = db_get(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), &value, &len);
            if (err != 0 || len < sizeof(record))
                break;
            memcpy(scratch, value, len);
            memcpy(&record, scratch, sizeof(record));
            struct recency_key old_key = recency_key(SEGMENT_PROTECTED, record.tick,
                                                     victims[i].id, victims[i].block);
            db_del(txn, DB_RECENCY, old_key.bytes, sizeof(old_key.bytes));
            err = next_tick(txn, &tick);
            if (err != 0)
                break;
            uint64_t bytes = account(record.len);
            usage->bytes[SEGMENT_PROTECTED] -= bytes < usage->bytes[SEGMENT_PROTECTED]
                                                   ? bytes : usage->bytes[SEGMENT_PROTECTED];
            usage->bytes[SEGMENT_PROBATION] += bytes;
            record.segment = SEGMENT_PROBATION;
            record.tick = tick;
            memcpy(scratch, &record, sizeof(record));
            struct recency_key new_key = recency_key(SEGMENT_PROBATION, tick,
                                                     victims[i].id, victims[i].block);
            err = db_put(txn, DB_RECENCY, new_key.bytes, sizeof(new_key.bytes), "", 0);
            if (err == 0)
                err = db_put(txn, DB_BLOCKS, key.bytes, sizeof(key.bytes), scratch, len);
        }
    }
    return err;
}

int cache_flush(struct cache *cache)
{
    struct touch *touches = NULL;
    size_t count;
    struct db_txn *txn = NULL;
    struct usage_record usage, before;
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
    pthread_mutex_unlock(&cache->lock);
    if (count > 0 && touches == NULL)
        return ENOMEM;
    if (count == 0)
        return 0;
    scratch = malloc(sizeof(struct block_record) +
                     (CACHE_MAX_BLOCK_SIZE / CACHE_PIECE_SIZE) * sizeof(uint64_t));
    if (scratch == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = usage_get(txn, &usage);
    before = usage;
    for (size_t i = 0; err == 0 && i < count; i++)
        err = apply_touch_txn(txn, &touches[i], &usage, scratch);
    if (err == 0)
        err = demote_protected_txn(cache, txn, &usage, scratch);
    if (err == 0)
        err = usage_put(txn, &usage);
    if (err == 0)
        err = db_txn_commit(&txn);
    if (err == 0) {
        usage_mirror(cache, &before, &usage);
    }
out:
    db_txn_abort(&txn);
    free(scratch);
    free(touches);
    return err;
}

static void *flusher_main(void *arg)
{
    struct cache *cache = arg;

    pthread_mutex_lock(&cache->lock);
    while (!cache->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += FLUSH_INTERVAL_S;
        pthread_cond_timedwait(&cache->flusher_wake, &cache->lock, &until);
        if (cache->stopping)
            break;
        pthread_mutex_unlock(&cache->lock);
        int err = cache_flush(cache);
        if (err != 0)
            log_warn("cache: recency update failed: %s", strerror(err));
        pthread_mutex_lock(&cache->lock);
    }
    pthread_mutex_unlock(&cache->lock);
    return NULL;
}
