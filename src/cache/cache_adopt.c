/*
 * cache_adopt.c - the block cache's calls for the write path: a staged
 * file adopted as the cached version of the object just uploaded from it
 * (renamed into data/, its blocks and checksums recorded in one
 * transaction, no copy), a version re-keyed after a server-side copy
 * (rename), and a deleted key forgotten.
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

/* In TXN, drop the version the key with HASH maps to, unless it is KEEP
 * (0: keep none); *dropped gets its id (0 if none was dropped), for
 * cache_retire_dropped_version() after the commit. The KEYS entry itself is
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
    struct usage_record usage;
    uint64_t dropped = 0;
    const void *value;
    size_t len;
    int err = cache_key_hash(cache->bucket, key, hash);

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
    if (err == 0)
        err = drop_key_version_txn(txn, hash, 0, &usage, &dropped);
    if (err == 0) {
        err = db_del(txn, DB_KEYS, hash, sizeof(hash));
        if (err == ENOENT)
            err = 0;
    }
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
    db_txn_abort(&txn);
    if (err != 0)
        return err;
    if (dropped != 0)
        cache_retire_dropped_version(cache, dropped);
    return 0;
}

int cache_rename_object(struct cache *cache, const char *key, const char *etag,
                        const char *new_key, const char *new_etag)
{
    unsigned char hash[KEY_HASH_LEN], new_hash[KEY_HASH_LEN];
    unsigned char id_key[8];
    struct object_record *record = NULL;
    struct db_txn *txn = NULL;
    struct usage_record usage;
    uint64_t id = 0, dropped = 0;
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag), new_etag_len = strlen(new_etag);
    int err;

    if (new_etag_len > 1024)
        return EINVAL;
    err = cache_key_hash(cache->bucket, key, hash);
    if (err == 0)
        err = cache_key_hash(cache->bucket, new_key, new_hash);
    if (err != 0)
        return err;
    err = db_txn_begin(cache->db, true, &txn);
    if (err == 0)
        err = cache_usage_get(txn, &usage);
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
        err = cache_usage_commit(cache, &txn, &usage);
    if (err == 0) {
        if (dropped != 0)
            cache_retire_dropped_version(cache, dropped);
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
 * drop_key_version_txn). USAGE is updated, for the caller to store. */
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
    struct usage_record usage;
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
    err = cache_key_hash(cache->bucket, key, hash);
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
    target = cache_data_path(cache, id);
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
    if (err == 0)
        err = publish_adopted_txn(cache, txn, hash, id, etag, size, sums,
                                  &usage, &dropped);
    if (err == 0)
        err = cache_usage_commit(cache, &txn, &usage);
    db_txn_abort(&txn);
    if (err == 0) {
        if (dropped != 0)
            cache_retire_dropped_version(cache, dropped);
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
