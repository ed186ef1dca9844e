/*
 * test_metacache.c - unit tests for attributes and listings kept in the
 * cache index (metacache.c over cache.c and db.c).
 *
 * Each test opens a real cache in a fresh directory under /tmp (removed in
 * teardown). Covered: attributes round-trip and are tied to their ETag;
 * listings round-trip entry by entry, survive a reopen, are refused once
 * older than the asked age; pruning drops exactly the listings past the
 * age (also past one transaction's batch) and keeps the attributes.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <time.h>

#include "base/db.h"
#include "cache/cache.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "unit_cache.h"

struct fixture {
    char dir[64];
    struct cache_conf conf;
    struct cache *cache;
};

static double wall_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static void cache_start(struct fixture *f)
{
    f->cache = unit_cache_open(&f->conf);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_metacache.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->conf = (struct cache_conf){
        .dir = f->dir,
        .bucket = "test-bucket",
        .size_limit = 64ull << 20,
        .block_size = CACHE_DEFAULT_BLOCK_SIZE,
    };
    cache_start(f);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    cache_close(&f->cache);
    unit_remove_tree(f->dir);
    free(f);
    return 0;
}

/* A listing of COUNT files named f00000..., file I of size I and ETag
 * "e<I>" (refs 0: the caller frees it). */
static struct inode_listing *make_listing(size_t count)
{
    struct inode_listing *listing = calloc(1, sizeof(*listing));

    assert_non_null(listing);
    listing->entries = calloc(count ? count : 1, sizeof(*listing->entries));
    assert_non_null(listing->entries);
    listing->count = count;
    for (size_t i = 0; i < count; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%05zu", i);
        listing->entries[i].name = strdup(name);
        assert_non_null(listing->entries[i].name);
        listing->entries[i].attrs = (struct inode_attrs){
            .kind = i % 5 == 0 ? INODE_DIR : INODE_FILE,
            .size = i,
            .mtime = {.tv_sec = 1700000000 + (time_t)i, .tv_nsec = (long)i * 1000},
        };
        snprintf(listing->entries[i].attrs.etag, S3_ETAG_MAX, "\"e%zu\"", i);
    }
    return listing;
}

static void put_listing(struct fixture *f, const char *dir_key, size_t count,
                        double age)
{
    struct inode_listing *listing = make_listing(count);

    assert_int_equal(metacache_put_listing(f->cache, dir_key, listing,
                                           wall_now() - age), 0);
    inode_listing_free(listing);
}

/* Whether DIR_KEY has a stored listing younger than MAX_AGE. */
static bool has_listing(struct fixture *f, const char *dir_key, double max_age)
{
    struct inode_listing *listing = NULL;
    int rc = metacache_get_listing(f->cache, dir_key, max_age, &listing);

    if (rc == 0)
        inode_listing_free(listing);
    else
        assert_int_equal(rc, ENOENT);
    return rc == 0;
}

static void test_attrs_are_tied_to_their_etag(void **state)
{
    struct fixture *f = *state;
    struct inode_attrs attrs = {
        .kind = INODE_SYMLINK,
        .size = 12345,
        .mtime = {.tv_sec = 1700000000, .tv_nsec = 42},
        .mode = 0751,
        .uid = 1001,
        .gid = 1002,
        .headers_known = true,
        .etag = "\"abc\"",
    };
    struct inode_attrs got;

    assert_int_equal(metacache_get_attrs(f->cache, "a/b", "\"abc\"", &got), ENOENT);
    assert_int_equal(metacache_put_attrs(f->cache, "a/b", &attrs), 0);
    assert_int_equal(metacache_get_attrs(f->cache, "a/b", "\"abc\"", &got), 0);
    assert_int_equal(got.kind, INODE_SYMLINK);
    assert_int_equal(got.size, 12345);
    assert_int_equal(got.mtime.tv_sec, 1700000000);
    assert_int_equal(got.mtime.tv_nsec, 42);
    assert_int_equal(got.mode, 0751);
    assert_int_equal(got.uid, 1001);
    assert_int_equal(got.gid, 1002);
    assert_true(got.headers_known);
    assert_string_equal(got.etag, "\"abc\"");
    /* another version of the object, or another key: unknown */
    assert_int_equal(metacache_get_attrs(f->cache, "a/b", "\"abd\"", &got), ENOENT);
    assert_int_equal(metacache_get_attrs(f->cache, "a/c", "\"abc\"", &got), ENOENT);
}

/* Special files and the times s3fs writes besides the mtime. */
static void test_attrs_keep_type_times_and_device(void **state)
{
    struct fixture *f = *state;
    struct inode_attrs attrs = {
        .kind = INODE_CHARDEV,
        .mtime = {.tv_sec = 1700000000},
        .atime = {.tv_sec = 1600000000, .tv_nsec = 7},
        .ctime = {.tv_sec = 1800000000, .tv_nsec = 9},
        .mode = 0640,
        .rdev = 0x10203,
        .headers_known = true,
        .etag = "\"dev\"",
    };
    struct inode_attrs got;

    assert_int_equal(metacache_put_attrs(f->cache, "d/null", &attrs), 0);
    cache_close(&f->cache); /* kept across mounts */
    cache_start(f);
    assert_int_equal(metacache_get_attrs(f->cache, "d/null", "\"dev\"", &got), 0);
    assert_int_equal(got.kind, INODE_CHARDEV);
    assert_int_equal(got.rdev, 0x10203);
    assert_int_equal(got.atime.tv_sec, 1600000000);
    assert_int_equal(got.atime.tv_nsec, 7);
    assert_int_equal(got.ctime.tv_sec, 1800000000);
    assert_int_equal(got.ctime.tv_nsec, 9);
    assert_int_equal(got.mode, 0640);
}

/* A record of the layout before atime, ctime and rdev (a cache written by
 * an older version) is a miss: one HEAD, never misread fields. */
static void test_older_attrs_records_miss(void **state)
{
    struct fixture *f = *state;
    struct {
        uint8_t kind, pad[3];
        uint32_t mode, uid, gid;
        uint64_t size;
        int64_t mtime_sec;
        uint32_t mtime_nsec;
        uint16_t etag_len, pad2;
        char etag[5];
    } old = {.kind = INODE_FILE, .mode = 0644, .size = 3, .mtime_sec = 1700000000,
             .etag_len = 5, .etag = "\"old\""};
    unsigned char hash[32];
    struct db_txn *txn = NULL;
    struct inode_attrs got;

    assert_int_equal(cache_name_hash(f->cache, "f", hash), 0);
    assert_int_equal(db_txn_begin(cache_index(f->cache), true, &txn), 0);
    assert_int_equal(db_put(txn, DB_ATTRS, hash, sizeof(hash), &old,
                            offsetof(__typeof__(old), etag) + 5), 0);
    assert_int_equal(db_txn_commit(&txn), 0);
    assert_int_equal(metacache_get_attrs(f->cache, "f", "\"old\"", &got), ENOENT);
}

static void test_listing_round_trip(void **state)
{
    struct fixture *f = *state;
    struct inode_listing *listing = NULL;

    put_listing(f, "dir/", 1500, 0);
    cache_close(&f->cache); /* kept across mounts */
    cache_start(f);
    assert_int_equal(metacache_get_listing(f->cache, "dir/", 60, &listing), 0);
    assert_int_equal(listing->count, 1500);
    for (size_t i = 0; i < listing->count; i++) {
        char name[32], etag[32];
        snprintf(name, sizeof(name), "f%05zu", i);
        snprintf(etag, sizeof(etag), "\"e%zu\"", i);
        const struct inode_dirent *entry = &listing->entries[i];
        assert_string_equal(entry->name, name);
        assert_string_equal(entry->attrs.etag, etag);
        assert_int_equal(entry->attrs.size, i);
        assert_int_equal(entry->attrs.kind, i % 5 == 0 ? INODE_DIR : INODE_FILE);
        assert_int_equal(entry->attrs.mtime.tv_sec, 1700000000 + (time_t)i);
        assert_int_equal(entry->attrs.mtime.tv_nsec, (long)i * 1000);
        assert_false(entry->attrs.headers_known);
    }
    inode_listing_free(listing);
    assert_false(has_listing(f, "other/", 60));
}

static void test_old_listings_are_not_served(void **state)
{
    struct fixture *f = *state;

    put_listing(f, "dir/", 3, 30);
    assert_true(has_listing(f, "dir/", 31));
    assert_false(has_listing(f, "dir/", 29));
    /* a clock that went back: never trusted */
    put_listing(f, "future/", 3, -3600);
    assert_false(has_listing(f, "future/", 1e9));
}

static void test_prune_drops_only_old_listings(void **state)
{
    struct fixture *f = *state;
    struct inode_attrs attrs = {.kind = INODE_FILE, .size = 1, .headers_known = true,
                                .etag = "\"x\""};
    struct inode_attrs got;
    uint64_t removed = 99;
    char key[32];

    assert_int_equal(metacache_prune_listings(f->cache, 10, &removed), 0);
    assert_int_equal(removed, 0);
    /* more old ones than one transaction drops, mixed with fresh ones */
    for (int i = 0; i < 2600; i++) {
        snprintf(key, sizeof(key), "old%04d/", i);
        put_listing(f, key, 2, 100);
        if (i % 100 == 0) {
            snprintf(key, sizeof(key), "new%04d/", i);
            put_listing(f, key, 2, 0);
        }
    }
    assert_int_equal(metacache_put_attrs(f->cache, "old0000/f00000", &attrs), 0);
    assert_int_equal(metacache_prune_listings(f->cache, 10, &removed), 0);
    assert_int_equal(removed, 2600);
    for (int i = 0; i < 2600; i++) {
        snprintf(key, sizeof(key), "old%04d/", i);
        assert_false(has_listing(f, key, 1e9));
        snprintf(key, sizeof(key), "new%04d/", i);
        assert_int_equal(has_listing(f, key, 10), i % 100 == 0);
    }
    /* attributes stay: they hold as long as the ETag */
    assert_int_equal(metacache_get_attrs(f->cache, "old0000/f00000", "\"x\"", &got), 0);
    assert_int_equal(metacache_prune_listings(f->cache, 10, &removed), 0);
    assert_int_equal(removed, 0);
    /* age 0 (dir_ttl=0): nothing stored is of any use */
    assert_int_equal(metacache_prune_listings(f->cache, 0, &removed), 0);
    assert_int_equal(removed, 26);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_attrs_are_tied_to_their_etag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attrs_keep_type_times_and_device, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_older_attrs_records_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listing_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_listings_are_not_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_drops_only_old_listings, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
