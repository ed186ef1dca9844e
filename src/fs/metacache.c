/*
 * metacache.c - attributes and listings in the cache index (see
 * metacache.h).
 *
 * Records (host byte order, like the rest of the index):
 *   DB_ATTRS  hash(key) -> struct attrs_record + ETag
 *   DB_DIRS   hash(prefix) -> struct listing_header, then per entry a
 *             struct entry_header + ETag + name
 *   DB_LINKS  hash(key) -> uint16_t ETag length, ETag, target
 */
#include "config.h"

#include "fs/metacache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/db.h"

#define HASH_LEN 32
#define PRUNE_BATCH 1024              /* listings dropped per transaction */

/* A record of another size (an older layout) does not match: a miss. */
struct attrs_record {
    uint8_t kind;
    uint8_t pad[3];
    uint32_t mode, uid, gid;
    uint64_t size;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint16_t etag_len;
    uint16_t pad2;
    int64_t atime_sec, ctime_sec;  /* 0 and 0: none (the mtime) */
    uint32_t atime_nsec, ctime_nsec;
    uint32_t rdev;
    uint32_t pad3;
};

struct listing_header {
    double fetched_at_wall;
    uint64_t count;
};

struct entry_header {
    uint8_t kind;
    uint8_t pad;
    uint16_t etag_len;
    uint16_t name_len;
    uint16_t pad2;
    uint32_t mtime_nsec;
    uint64_t size;
    int64_t mtime_sec;
};

int metacache_get_attrs(struct cache *cache, const char *key, const char *etag,
                        struct inode_attrs *out)
{
    unsigned char hash[HASH_LEN];
    struct db_txn *txn = NULL;
    struct attrs_record record;
    const void *value;
    size_t len;
    size_t etag_len = strlen(etag);
    int err = cache_name_hash(cache, key, hash);

    if (err == 0)
        err = db_txn_begin(cache_index(cache), false, &txn);
    if (err == 0)
        err = db_get(txn, DB_ATTRS, hash, sizeof(hash), &value, &len);
    if (err == 0) {
        memcpy(&record, value, len < sizeof(record) ? len : sizeof(record));
        if (len != sizeof(record) + record.etag_len || record.etag_len != etag_len ||
            memcmp((const char *)value + sizeof(record), etag, etag_len) != 0)
            err = ENOENT;
    }
    if (err == 0) {
        *out = (struct inode_attrs){
            .kind = (enum inode_kind)record.kind,
            .size = record.size,
            .mtime = {.tv_sec = (time_t)record.mtime_sec,
                      .tv_nsec = (long)record.mtime_nsec},
            .atime = {.tv_sec = (time_t)record.atime_sec,
                      .tv_nsec = (long)record.atime_nsec},
            .ctime = {.tv_sec = (time_t)record.ctime_sec,
                      .tv_nsec = (long)record.ctime_nsec},
            .mode = record.mode,
            .uid = record.uid,
            .gid = record.gid,
            .rdev = record.rdev,
            .headers_known = true,
            .fetched_at = clock_monotonic_seconds(),
        };
        memcpy(out->etag, etag, etag_len + 1);
    }
    db_txn_abort(&txn);
    return err;
}

int metacache_put_attrs(struct cache *cache, const char *key,
                        const struct inode_attrs *attrs)
{
    unsigned char hash[HASH_LEN];
    size_t etag_len = strlen(attrs->etag);
    struct attrs_record *record = calloc(1, sizeof(*record) + etag_len);
    struct db_txn *txn = NULL;
    int err;

    if (record == NULL)
        return ENOMEM;
    *record = (struct attrs_record){
        .kind = (uint8_t)attrs->kind,
        .mode = attrs->mode,
        .uid = attrs->uid,
        .gid = attrs->gid,
        .size = attrs->size,
        .mtime_sec = (int64_t)attrs->mtime.tv_sec,
        .mtime_nsec = (uint32_t)attrs->mtime.tv_nsec,
        .etag_len = (uint16_t)etag_len,
        .atime_sec = (int64_t)attrs->atime.tv_sec,
        .atime_nsec = (uint32_t)attrs->atime.tv_nsec,
        .ctime_sec = (int64_t)attrs->ctime.tv_sec,
        .ctime_nsec = (uint32_t)attrs->ctime.tv_nsec,
        .rdev = attrs->rdev,
    };
    memcpy(record + 1, attrs->etag, etag_len);
    err = cache_name_hash(cache, key, hash);
    if (err == 0)
        err = db_txn_begin(cache_index(cache), true, &txn);
    if (err == 0)
        err = db_put(txn, DB_ATTRS, hash, sizeof(hash), record,
                     sizeof(*record) + etag_len);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    free(record);
    return err;
}

int metacache_get_link(struct cache *cache, const char *key, const char *etag,
                       char **target)
{
    unsigned char hash[HASH_LEN];
    struct db_txn *txn = NULL;
    const char *value;
    const void *found;
    size_t len;
    uint16_t etag_len;
    int err = cache_name_hash(cache, key, hash);

    *target = NULL;
    if (etag[0] == '\0')
        return ENOENT;
    if (err == 0)
        err = db_txn_begin(cache_index(cache), false, &txn);
    if (err == 0)
        err = db_get(txn, DB_LINKS, hash, sizeof(hash), &found, &len);
    if (err == 0) {
        value = found;
        if (len > sizeof(etag_len))
            memcpy(&etag_len, value, sizeof(etag_len));
        if (len <= sizeof(etag_len) + etag_len || etag_len != strlen(etag) ||
            memcmp(value + sizeof(etag_len), etag, etag_len) != 0)
            err = ENOENT;
    }
    if (err == 0) {
        size_t target_len = len - sizeof(etag_len) - etag_len;
        const char *stored = value + sizeof(etag_len) + etag_len;
        if (memchr(stored, '\0', target_len) != NULL)
            err = ENOENT;
        else if ((*target = strndup(stored, target_len)) == NULL)
            err = ENOMEM;
    }
    db_txn_abort(&txn);
    return err;
}

int metacache_put_link(struct cache *cache, const char *key, const char *etag,
                       const char *target)
{
    unsigned char hash[HASH_LEN];
    size_t etag_len = strlen(etag), target_len = strlen(target);
    uint16_t stored_etag_len = (uint16_t)etag_len;
    struct db_txn *txn = NULL;
    char *record;
    int err;

    if (etag_len == 0 || etag_len > UINT16_MAX || target_len == 0)
        return EINVAL;
    record = malloc(sizeof(stored_etag_len) + etag_len + target_len);
    if (record == NULL)
        return ENOMEM;
    memcpy(record, &stored_etag_len, sizeof(stored_etag_len));
    memcpy(record + sizeof(stored_etag_len), etag, etag_len);
    memcpy(record + sizeof(stored_etag_len) + etag_len, target, target_len);
    err = cache_name_hash(cache, key, hash);
    if (err == 0)
        err = db_txn_begin(cache_index(cache), true, &txn);
    if (err == 0)
        err = db_put(txn, DB_LINKS, hash, sizeof(hash), record,
                     sizeof(stored_etag_len) + etag_len + target_len);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    free(record);
    return err;
}

int metacache_put_listing(struct cache *cache, const char *dir_key,
                          const struct inode_listing *listing,
                          double fetched_at_wall)
{
    unsigned char hash[HASH_LEN];
    struct listing_header header = {fetched_at_wall, listing->count};
    size_t total = sizeof(header);
    struct db_txn *txn = NULL;
    char *blob = NULL;
    int err;

    for (size_t i = 0; i < listing->count; i++)
        total += sizeof(struct entry_header) + strlen(listing->entries[i].attrs.etag) +
                 strlen(listing->entries[i].name);
    blob = malloc(total);
    if (blob == NULL)
        return ENOMEM;
    char *at = blob;
    memcpy(at, &header, sizeof(header));
    at += sizeof(header);
    for (size_t i = 0; i < listing->count; i++) {
        const struct inode_dirent *entry = &listing->entries[i];
        struct entry_header eh = {
            .kind = (uint8_t)entry->attrs.kind,
            .etag_len = (uint16_t)strlen(entry->attrs.etag),
            .name_len = (uint16_t)strlen(entry->name),
            .mtime_nsec = (uint32_t)entry->attrs.mtime.tv_nsec,
            .size = entry->attrs.size,
            .mtime_sec = (int64_t)entry->attrs.mtime.tv_sec,
        };
        memcpy(at, &eh, sizeof(eh));
        at += sizeof(eh);
        memcpy(at, entry->attrs.etag, eh.etag_len);
        at += eh.etag_len;
        memcpy(at, entry->name, eh.name_len);
        at += eh.name_len;
    }
    err = cache_name_hash(cache, dir_key, hash);
    if (err == 0)
        err = db_txn_begin(cache_index(cache), true, &txn);
    if (err == 0)
        err = db_put(txn, DB_DIRS, hash, sizeof(hash), blob, total);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    free(blob);
    return err;
}

/* Whether a listing stored AGE seconds ago may serve a caller that
 * accepts MAX_AGE (never one from the future: a clock set back). */
static bool listing_age_usable(double age, double max_age)
{
    return age >= 0 && age < max_age;
}

/* Decode a stored listing; EIO when it does not parse. */
static int decode_listing(const char *blob, size_t len, double max_age,
                          struct inode_listing **out)
{
    struct listing_header header;
    struct inode_listing *listing = NULL;
    double now_wall = clock_wall_seconds();
    const char *at = blob + sizeof(header);
    const char *end = blob + len;
    int err = 0;

    if (len < sizeof(header))
        return EIO;
    memcpy(&header, blob, sizeof(header));
    double age = now_wall - header.fetched_at_wall;
    if (!listing_age_usable(age, max_age))
        return ENOENT;
    if (header.count > len / sizeof(struct entry_header))
        return EIO;
    listing = calloc(1, sizeof(*listing));
    if (listing == NULL)
        return ENOMEM;
    listing->entries = calloc(header.count ? header.count : 1,
                              sizeof(*listing->entries));
    if (listing->entries == NULL) {
        free(listing);
        return ENOMEM;
    }
    listing->fetched_at = clock_monotonic_seconds() - age;
    for (uint64_t i = 0; i < header.count && err == 0; i++) {
        struct entry_header eh;
        if ((size_t)(end - at) < sizeof(eh)) {
            err = EIO;
            break;
        }
        memcpy(&eh, at, sizeof(eh));
        at += sizeof(eh);
        if ((size_t)(end - at) < (size_t)eh.etag_len + eh.name_len ||
            eh.etag_len >= S3_ETAG_MAX || eh.name_len == 0) {
            err = EIO;
            break;
        }
        struct inode_dirent *entry = &listing->entries[i];
        entry->attrs = (struct inode_attrs){
            .kind = (enum inode_kind)eh.kind,
            .size = eh.size,
            .mtime = {.tv_sec = (time_t)eh.mtime_sec, .tv_nsec = (long)eh.mtime_nsec},
            .fetched_at = listing->fetched_at,
        };
        memcpy(entry->attrs.etag, at, eh.etag_len);
        entry->attrs.etag[eh.etag_len] = '\0';
        at += eh.etag_len;
        entry->name = strndup(at, eh.name_len);
        at += eh.name_len;
        if (entry->name == NULL)
            err = ENOMEM;
        listing->count = i + 1;
    }
    if (err != 0) {
        inode_listing_free(listing);
        return err;
    }
    *out = listing;
    return 0;
}

int metacache_get_listing(struct cache *cache, const char *dir_key,
                          double max_age, struct inode_listing **out)
{
    unsigned char hash[HASH_LEN];
    struct db_txn *txn = NULL;
    const void *value;
    size_t len;
    int err = cache_name_hash(cache, dir_key, hash);

    *out = NULL;
    if (err == 0)
        err = db_txn_begin(cache_index(cache), false, &txn);
    if (err == 0)
        err = db_get(txn, DB_DIRS, hash, sizeof(hash), &value, &len);
    if (err == 0)
        err = decode_listing(value, len, max_age, out);
    db_txn_abort(&txn);
    return err == EIO ? ENOENT : err;
}

int metacache_forget_listing(struct cache *cache, const char *dir_key)
{
    unsigned char hash[HASH_LEN];
    struct db_txn *txn = NULL;
    int err = cache_name_hash(cache, dir_key, hash);

    if (err == 0)
        err = db_txn_begin(cache_index(cache), true, &txn);
    if (err == 0) {
        err = db_del(txn, DB_DIRS, hash, sizeof(hash));
        if (err == ENOENT)
            err = 0;
        if (err == 0)
            err = db_txn_commit(&txn);
        db_txn_abort(&txn);
    }
    return err;
}

/* Delete the record of KEY in TABLE from TXN; *COUNT counts it if it was
 * there. */
static int forget_record(struct cache *cache, struct db_txn *txn,
                         enum db_table table, const char *key, uint64_t *count)
{
    unsigned char hash[HASH_LEN];
    int err = cache_name_hash(cache, key, hash);

    if (err == 0)
        err = db_del(txn, table, hash, sizeof(hash));
    if (err == 0)
        (*count)++;
    return err == ENOENT ? 0 : err;
}

/* A stack of directory prefixes still to forget (metacache_forget_tree). */
struct prefix_stack {
    char **items;
    size_t count, capacity;
};

static int prefix_stack_push(struct prefix_stack *stack, char *prefix)
{
    if (prefix == NULL)
        return ENOMEM;
    if (stack->count == stack->capacity) {
        size_t capacity = stack->capacity ? stack->capacity * 2 : 16;
        char **grown = realloc(stack->items, capacity * sizeof(*grown));
        if (grown == NULL) {
            free(prefix);
            return ENOMEM;
        }
        stack->items = grown;
        stack->capacity = capacity;
    }
    stack->items[stack->count++] = prefix;
    return 0;
}

/* Forget the listing of directory PREFIX, the attributes of PREFIX and of
 * every entry it names; push its subdirectories onto STACK. */
static int forget_directory(struct cache *cache, const char *prefix,
                            struct prefix_stack *stack, uint64_t *listings,
                            uint64_t *records)
{
    struct inode_listing *listing = NULL;
    struct db_txn *txn = NULL;
    /* any age: an old listing may be served again under -o trust */
    int err = metacache_get_listing(cache, prefix, INFINITY, &listing);

    if (err == ENOENT)
        err = 0; /* none (or unreadable): the directory's own records still go */
    if (err == 0)
        err = db_txn_begin(cache_index(cache), true, &txn);
    if (err == 0)
        err = forget_record(cache, txn, DB_DIRS, prefix, listings);
    if (err == 0)
        err = forget_record(cache, txn, DB_ATTRS, prefix, records);
    for (size_t i = 0; err == 0 && listing != NULL && i < listing->count; i++) {
        const struct inode_dirent *entry = &listing->entries[i];
        bool is_dir = entry->attrs.kind == INODE_DIR;
        char *child = NULL;
        if (asprintf(&child, "%s%s%s", prefix, entry->name, is_dir ? "/" : "") < 0)
            err = ENOMEM;
        else if (is_dir)
            err = prefix_stack_push(stack, child); /* (it owns CHILD) */
        else
            err = forget_record(cache, txn, DB_ATTRS, child, records);
        if (!is_dir)
            free(child);
    }
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    inode_listing_free(listing);
    return err;
}

int metacache_forget_tree(struct cache *cache, const char *key,
                          uint64_t *listings, uint64_t *records)
{
    struct prefix_stack stack = {0};
    uint64_t listings_gone = 0, records_gone = 0;
    size_t len = strlen(key);
    int err = 0;

    if (len > 0 && key[len - 1] != '/') {
        struct db_txn *txn = NULL;
        err = db_txn_begin(cache_index(cache), true, &txn);
        if (err == 0)
            err = forget_record(cache, txn, DB_ATTRS, key, &records_gone);
        if (err == 0)
            err = db_txn_commit(&txn);
        db_txn_abort(&txn);
    } else {
        err = prefix_stack_push(&stack, strdup(key));
    }
    while (err == 0 && stack.count > 0) {
        char *prefix = stack.items[--stack.count];
        err = forget_directory(cache, prefix, &stack, &listings_gone, &records_gone);
        free(prefix);
    }
    while (stack.count > 0)
        free(stack.items[--stack.count]);
    free(stack.items);
    if (listings != NULL)
        *listings = listings_gone;
    if (records != NULL)
        *records = records_gone;
    return err;
}

/* db_scan visitor of metacache_prune_listings: gather the keys of
 * listings stored MAX_AGE or more seconds ago, up to PRUNE_BATCH. */
struct prune_scan {
    double max_age;
    double now_wall;
    unsigned char (*keys)[HASH_LEN];
    size_t count;
};

static int collect_old_listing(void *arg, const void *key, size_t key_len,
                               const void *value, size_t value_len)
{
    struct prune_scan *scan = arg;
    struct listing_header header;

    if (key_len != HASH_LEN)
        return 0;
    bool old = value_len < sizeof(header); /* unreadable: useless too */
    if (!old) {
        memcpy(&header, value, sizeof(header));
        old = !listing_age_usable(scan->now_wall - header.fetched_at_wall,
                                  scan->max_age);
    }
    if (old)
        memcpy(scan->keys[scan->count++], key, HASH_LEN);
    return scan->count == PRUNE_BATCH ? -1 : 0;
}

int metacache_prune_listings(struct cache *cache, double max_age, uint64_t *removed)
{
    struct prune_scan scan = {.max_age = max_age, .now_wall = clock_wall_seconds()};
    unsigned char start[HASH_LEN];
    size_t start_len = 0;
    int err = 0;

    *removed = 0;
    scan.keys = malloc(PRUNE_BATCH * sizeof(*scan.keys));
    if (scan.keys == NULL)
        return ENOMEM;
    for (;;) {
        struct db_txn *txn = NULL;
        scan.count = 0;
        err = db_txn_begin(cache_index(cache), false, &txn);
        if (err == 0)
            err = db_scan(txn, DB_DIRS, start, start_len, collect_old_listing, &scan);
        db_txn_abort(&txn);
        if (err == 0 && scan.count > 0)
            err = db_txn_begin(cache_index(cache), true, &txn);
        for (size_t i = 0; err == 0 && i < scan.count; i++) {
            err = db_del(txn, DB_DIRS, scan.keys[i], HASH_LEN);
            if (err == ENOENT)
                err = 0;
        }
        if (err == 0 && scan.count > 0)
            err = db_txn_commit(&txn);
        db_txn_abort(&txn);
        if (err != 0)
            break;
        *removed += scan.count;
        if (scan.count < PRUNE_BATCH)
            break; /* the scan reached the end */
        /* go on after the last key gathered (deleted now) */
        memcpy(start, scan.keys[scan.count - 1], HASH_LEN);
        start_len = HASH_LEN;
    }
    free(scan.keys);
    return err;
}
