/*
 * test_tier.c - the shared cache tier (tier.c, tier_format.c) and the
 * reader that asks it (reader.c), on two in-memory S3 buckets of
 * fake_s3.h: the origin and the tier.
 *
 * Each test has two "nodes": two cache directories with 64 KiB blocks,
 * each with its own reader, sharing the origin and the tier as the nodes
 * of a cluster would. Covered: block names and frames (another version,
 * origin or block size never shares a name; a damaged, truncated,
 * misplaced or mixed-up frame never verifies); what one node fetched from
 * the origin the other reads from the tier with no request to the
 * origin, the same bytes; a damaged block in the tier is counted and read
 * from the origin by itself; a tier that fails is skipped (no more requests for a
 * while) and never fails a read; of two nodes writing a block the first
 * wins (If-None-Match); a full write queue drops offers instead of
 * holding memory. Leases: waited on, read back, taken over (by
 * If-Match, one node of two at once), renewed without writing over
 * another node's, given back when a block is dropped or its fetch from
 * the origin fails; a tier whose writes stall is skipped after one
 * write per reader, at once.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/clock.h"
#include "base/workers.h"
#include "cache/cache.h"
#include "fake_s3.h"
#include "reader/reader.h"
#include "s3/s3.h"
#include "tier/tier.h"
#include "tier/tier_format.h"
#include "tier/tier_prune.h"
#include "unit_cache.h"

#define BLOCK (64u << 10)
#define ORIGIN "http://127.0.0.1:9000 data"
#define NODES 2

#define ON(call, key) FAKE_S3_ON(FAKE_S3_CALL(call), key)
#define UNDER(call, prefix) FAKE_S3_UNDER(FAKE_S3_CALL(call), prefix)

struct node {
    char dir[64];
    struct cache *cache;
    struct workers *workers;
    struct tier *tier;
    struct reader *reader;
    bool full_disk;              /* its cache keeps all of its disk free
                                    (min_free): a fill is ENOSPC */
};

struct fixture {
    struct s3_client *origin;
    struct s3_client *tier_s3;
    struct node nodes[NODES];
};

/* NODE's reader, its GETs (and runs of blocks) up to MAX_REQUEST bytes. */
static void node_reader_start(struct fixture *f, struct node *node,
                              uint64_t max_request)
{
    struct reader_conf reader_conf = {
        .s3 = f->origin,
        .cache = node->cache,
        .workers = node->workers,
        .read_ahead = 1u << 20,
        .max_request = max_request,
        .tier = node->tier,
    };

    assert_int_equal(reader_create(&reader_conf, &node->reader), 0);
}

/* NODE with a cache of its own, a tier client (QUEUE_BLOCKS: 0 for the
 * default; PROBE_SECONDS: < 0 for no probes while skipped, so that what
 * a test sees skipped stays so) and a reader. */
static void node_start(struct fixture *f, struct node *node,
                       uint64_t queue_blocks, double probe_seconds)
{
    struct cache_conf cache_conf = {
        .dir = node->dir,
        .bucket = "data",
        .size_limit = 64ull << 20,
        .block_size = BLOCK,
        .min_free_ratio = node->full_disk ? 1.0 : 0.0,
    };
    struct tier_conf tier_conf = {
        .s3 = f->tier_s3,
        .prefix = "shared/",
        .origin = ORIGIN,
        .block_size = BLOCK,
        .queue_blocks = queue_blocks,
        .probe_seconds = probe_seconds,
    };

    snprintf(node->dir, sizeof(node->dir), "/tmp/test_tier.XXXXXX");
    assert_non_null(mkdtemp(node->dir));
    node->cache = unit_cache_open(&cache_conf);
    tier_conf.cache = node->cache;
    assert_int_equal(workers_create(2, &node->workers), 0);
    assert_int_equal(tier_create(&tier_conf, &node->tier), 0);
    node_reader_start(f, node, 256u << 10);
}

static void node_stop(struct node *node)
{
    if (node->reader != NULL)
        reader_stop(node->reader);
    workers_destroy(&node->workers);
    reader_destroy(&node->reader);
    tier_destroy(&node->tier);
    cache_close(&node->cache);
    unit_remove_tree(node->dir);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    assert_int_equal(fake_s3_create(&f->origin), 0);
    assert_int_equal(fake_s3_create(&f->tier_s3), 0);
    for (int i = 0; i < NODES; i++)
        node_start(f, &f->nodes[i], 0, -1);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    fake_s3_hold_clear(f->tier_s3, 0);
    fake_s3_hold_clear(f->origin, 0);
    fake_s3_fail_clear(f->tier_s3, 0);
    fake_s3_fail_clear(f->origin, 0);
    for (int i = 0; i < NODES; i++)
        node_stop(&f->nodes[i]);
    s3_client_destroy(&f->origin);
    s3_client_destroy(&f->tier_s3);
    free(f);
    return 0;
}

/* LEN bytes of version SEED. */
static unsigned char *pattern(size_t len, unsigned seed)
{
    unsigned char *bytes = malloc(len);

    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] = (unsigned char)((i * 131 + seed * 29 + (i >> 12)) & 0xff);
    return bytes;
}

/* Read all of KEY (version ETAG, SIZE bytes) on NODE and compare it with
 * EXPECTED; 0 or the read's errno. */
static int read_all(struct node *node, const char *key, const char *etag,
                    size_t size, const unsigned char *expected)
{
    struct reader_file *file = NULL;
    char *buf = malloc(size);
    size_t got = 0;
    int err = reader_open(node->reader, key, etag, size, &file);

    assert_non_null(buf);
    for (size_t at = 0; err == 0 && at < size; at += got) {
        size_t want = size - at < 3 * BLOCK ? size - at : 3 * BLOCK;
        err = reader_read(file, at, want, buf + at, &got);
        if (err == 0)
            assert_int_equal(got, want);
    }
    if (err == 0)
        assert_memory_equal(buf, expected, size);
    reader_close(&file);
    free(buf);
    return err;
}

/* What the origin sent, once no GET is under way: a read-ahead GET may
 * end (and be counted) after the read that needed its blocks. */
static uint64_t origin_bytes(struct fixture *f)
{
    struct s3_stats stats;

    assert_int_equal(fake_s3_wait_idle(f->origin), 0);
    s3_client_stats(f->origin, &stats);
    return stats.bytes_received;
}

static struct tier_stats tier_stats_of(struct node *node)
{
    struct tier_stats stats;

    tier_get_stats(node->tier, &stats);
    return stats;
}

/* Poll (up to 5 s, no fixed sleep) until PREDICATE of NODE's counters,
 * STATS, holds. */
#define WAIT_STATS(node, predicate)                                          \
    do {                                                                     \
        for (int waited_ = 0; waited_ < 5000; waited_++) {                   \
            struct tier_stats stats = tier_stats_of(node);                   \
            if (predicate)                                                   \
                break;                                                       \
            usleep(1000);                                                    \
        }                                                                    \
    } while (0)

/* What the tier holds of one block of a version node 0 has read. */
struct stored_block {
    char etag[S3_ETAG_MAX]; /* the version */
    char *key;              /* the block's key in the tier */
    void *frame;            /* the object there (header and bytes) */
    size_t frame_len;
};

/* SIZE bytes of BYTES put in the origin as KEY, read whole on node 0 and
 * flushed to the tier: *OUT gets the tier's key of block INDEX and the
 * frame stored there (free with stored_block_free()). */
static void stored_block_get(struct fixture *f, const char *key,
                             const unsigned char *bytes, size_t size,
                             uint64_t index, struct stored_block *out)
{
    *out = (struct stored_block){.key = NULL};
    assert_int_equal(fake_s3_put(f->origin, key, bytes, size, NULL, out->etag), 0);
    assert_int_equal(read_all(&f->nodes[0], key, out->etag, size, bytes), 0);
    tier_flush(f->nodes[0].tier, 0);
    struct tier_block_id id = {ORIGIN, key, out->etag, BLOCK, index};
    assert_int_equal(tier_block_key("shared/", &id, &out->key), 0);
    assert_int_equal(fake_s3_get(f->tier_s3, out->key, &out->frame,
                                 &out->frame_len, NULL), 0);
}

static void stored_block_free(struct stored_block *block)
{
    free(block->key);
    free(block->frame);
    *block = (struct stored_block){.key = NULL};
}

/* BLOCK's frame put back in the tier with one bit of its data flipped:
 * whole, but it no longer verifies. */
static void stored_block_damage(struct fixture *f, struct stored_block *block)
{
    assert_int_equal(block->frame_len, TIER_HEADER_LEN + BLOCK);
    ((unsigned char *)block->frame)[TIER_HEADER_LEN + 100] ^= 0x40;
    assert_int_equal(fake_s3_put(f->tier_s3, block->key, block->frame,
                                 block->frame_len, NULL, NULL), 0);
}

/* ------------------------------------------------------------- tests */

static void test_names_and_frames(void **state)
{
    (void)state;
    struct tier_block_id id = {ORIGIN, "dir/w.bin", "\"abc\"", BLOCK, 7};
    struct tier_block_id other = id;
    char *key = NULL, *other_key = NULL;
    unsigned char *data = pattern(1000, 1);
    unsigned char *frame = malloc(TIER_HEADER_LEN + 1000);

    assert_int_equal(tier_block_key("p/", &id, &key), 0);
    assert_int_equal(strncmp(key, "p/" TIER_ROOT, strlen("p/" TIER_ROOT)), 0);
    assert_string_equal(key + strlen(key) - strlen("/65536-7"), "/65536-7");
    /* another version, origin, key split, block size: another name */
    const struct tier_block_id changes[] = {
        {ORIGIN, "dir/w.bin", "\"abd\"", BLOCK, 7},
        {"http://127.0.0.1:9001 data", "dir/w.bin", "\"abc\"", BLOCK, 7},
        {ORIGIN "dir/", "w.bin", "\"abc\"", BLOCK, 7},
        {ORIGIN, "dir/w.bin", "\"abc\"", 2 * BLOCK, 7},
        {ORIGIN, "dir/w.bin", "\"abc\"", BLOCK, 8},
    };
    for (size_t i = 0; i < sizeof(changes) / sizeof(changes[0]); i++) {
        assert_int_equal(tier_block_key("p/", &changes[i], &other_key), 0);
        assert_string_not_equal(key, other_key);
        free(other_key);
    }

    /* the format the man page gives: "v2/" keys; a 64-byte header of
     * "S3CFSTB2", the length, zeros, the identity, XXH3-128 of the data */
    assert_int_equal(strncmp(key, "p/s3cachefs-tier/v2/", 20), 0);
    assert_int_equal(TIER_HEADER_LEN, 64);
    assert_int_equal(tier_frame_header(&id, data, 1000, frame), 0);
    XXH128_canonical_t checksum;
    XXH128_canonicalFromHash(&checksum, XXH3_128bits(data, 1000));
    assert_memory_equal(frame, "S3CFSTB2\xe8\x03\0\0\0\0\0\0", 16);
    assert_memory_equal(frame + 48, &checksum, 16);

    /* a frame verifies as itself only */
    memcpy(frame + TIER_HEADER_LEN, data, 1000);
    assert_int_equal(tier_frame_check(&id, frame, TIER_HEADER_LEN + 1000, 1000), 0);
    assert_int_equal(tier_frame_check(&id, frame, TIER_HEADER_LEN + 999, 1000),
                     EBADMSG);                           /* truncated */
    assert_int_equal(tier_frame_check(&id, frame, TIER_HEADER_LEN + 1000, 999),
                     EBADMSG);                           /* another length */
    other.index = 8;
    assert_int_equal(tier_frame_check(&other, frame, TIER_HEADER_LEN + 1000,
                                      1000), EBADMSG);   /* another block */
    other = id;
    other.etag = "\"abd\"";
    assert_int_equal(tier_frame_check(&other, frame, TIER_HEADER_LEN + 1000,
                                      1000), EBADMSG);   /* another version */
    frame[TIER_HEADER_LEN + 500] ^= 1;
    assert_int_equal(tier_frame_check(&id, frame, TIER_HEADER_LEN + 1000, 1000),
                     EBADMSG);                           /* a flipped bit */
    frame[TIER_HEADER_LEN + 500] ^= 1;
    frame[3] ^= 1;
    assert_int_equal(tier_frame_check(&id, frame, TIER_HEADER_LEN + 1000, 1000),
                     EBADMSG);                           /* not a frame */
    free(key);
    free(data);
    free(frame);
}

/* What node 0 fetched from the origin, node 1 reads from the tier: the
 * same bytes, no request to the origin; the tier holds each block once. */
static void test_second_node_reads_from_the_tier(void **state)
{
    struct fixture *f = *state;
    const size_t size = 20 * BLOCK + 777;     /* 21 blocks, the last short */
    unsigned char *bytes = pattern(size, 3);
    char etag[S3_ETAG_MAX];
    char **keys = NULL;
    size_t count = 0;

    assert_int_equal(fake_s3_put(f->origin, "w.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(read_all(&f->nodes[0], "w.bin", etag, size, bytes), 0);
    assert_int_equal(origin_bytes(f), size);
    tier_flush(f->nodes[0].tier, 0);
    struct tier_stats first = tier_stats_of(&f->nodes[0]);
    assert_int_equal(first.puts, 21);
    assert_int_equal(first.put_bytes, size);
    assert_int_equal(first.hits, 0);
    assert_int_equal(fake_s3_keys(f->tier_s3, "shared/" TIER_ROOT, &keys, &count), 0);
    size_t leases = 0;
    for (size_t i = 0; i < count; i++)
        leases += strstr(keys[i], "/lease-") != NULL;
    assert_int_equal(count - leases, 21);          /* the blocks, once */
    assert_int_equal(leases, first.leases);        /* (the probe is gone) */
    assert_true(leases >= 3);                      /* 21 blocks: 3 groups */
    fake_s3_keys_free(keys, count);

    unsigned origin_gets = fake_s3_count(f->origin, ON(FAKE_S3_GET, NULL));
    assert_int_equal(read_all(&f->nodes[1], "w.bin", etag, size, bytes), 0);
    assert_int_equal(fake_s3_count(f->origin, ON(FAKE_S3_GET, NULL)), origin_gets);
    assert_int_equal(origin_bytes(f), size);
    struct tier_stats second = tier_stats_of(&f->nodes[1]);
    assert_int_equal(second.hits, 21);
    assert_int_equal(second.hit_bytes, size);
    assert_int_equal(second.bad + second.errors + second.puts, 0);

    /* a new version is not the old one's blocks */
    unsigned char *changed = pattern(size, 4);
    assert_int_equal(fake_s3_put(f->origin, "w.bin", changed, size, NULL, etag), 0);
    assert_int_equal(read_all(&f->nodes[1], "w.bin", etag, size, changed), 0);
    assert_int_equal(origin_bytes(f), 2 * size);
    free(changed);
    free(bytes);
}

/* A block damaged in the tier is counted, read from the origin, and the
 * bytes are right. */
static void test_damaged_block_is_read_from_the_origin(void **state)
{
    struct fixture *f = *state;
    const size_t size = 8 * BLOCK;
    unsigned char *bytes = pattern(size, 5);
    struct stored_block stored;

    stored_block_get(f, "d.bin", bytes, size, 5, &stored);
    stored_block_damage(f, &stored);

    uint64_t before = origin_bytes(f);
    assert_int_equal(read_all(&f->nodes[1], "d.bin", stored.etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.bad, 1);
    assert_true(stats.hits >= 5);
    /* the damaged block alone came from the origin */
    assert_int_equal(origin_bytes(f) - before, BLOCK);

    /* and the tier has it whole again: the write of the block fetched
     * replaces the damaged one, If-None-Match or not (before: refused as
     * there already, and every node reading it paid an origin GET) */
    tier_flush(f->nodes[1].tier, 0);
    void *frame = NULL;
    size_t frame_len = 0;
    assert_int_equal(fake_s3_get(f->tier_s3, stored.key, &frame, &frame_len,
                                 NULL), 0);
    struct tier_block_id id = {ORIGIN, "d.bin", stored.etag, BLOCK, 5};
    assert_int_equal(tier_frame_check(&id, frame, frame_len, BLOCK), 0);
    assert_int_equal(tier_stats_of(&f->nodes[1]).puts, 1);
    free(frame);
    stored_block_free(&stored);
    free(bytes);
}

/* One damaged block in the middle of a run of 8 (a warm, one run at a
 * time) is read from the origin by itself: the tier is asked for the
 * blocks after it, and the origin sends one block. */
static void test_damaged_block_alone_is_read_from_the_origin(void **state)
{
    struct fixture *f = *state;
    const size_t size = 8 * BLOCK;
    unsigned char *bytes = pattern(size, 13);
    struct node *second = &f->nodes[1];
    struct stored_block stored;
    struct reader_warm_result warmed;

    stored_block_get(f, "m.bin", bytes, size, 3, &stored);
    stored_block_damage(f, &stored);
    reader_stop(second->reader);
    reader_destroy(&second->reader);
    node_reader_start(f, second, size);           /* runs of 8 blocks */

    uint64_t before = origin_bytes(f);
    assert_int_equal(reader_warm(second->reader, "m.bin", stored.etag, size,
                                 1, NULL, &warmed), 0);
    assert_int_equal(origin_bytes(f) - before, BLOCK);
    struct tier_stats stats = tier_stats_of(second);
    assert_int_equal(stats.bad, 1);
    assert_int_equal(stats.hits, 7);
    assert_int_equal(read_all(second, "m.bin", stored.etag, size, bytes), 0);
    assert_int_equal(origin_bytes(f) - before, BLOCK);
    stored_block_free(&stored);
    free(bytes);
}

/* A block found short in the tier (a server that writes in place, as
 * s3rver, shows a block being written part way) is not there yet: not
 * counted as damaged; it is claimed and fetched from the origin, by
 * itself, and the blocks after it still come from the tier. */
static void test_short_block_is_not_there_yet(void **state)
{
    struct fixture *f = *state;
    const size_t size = 8 * BLOCK;
    unsigned char *bytes = pattern(size, 6);
    struct stored_block stored;

    stored_block_get(f, "s.bin", bytes, size, 2, &stored);
    assert_int_equal(fake_s3_put(f->tier_s3, stored.key, stored.frame,
                                 stored.frame_len / 2, NULL, NULL), 0);

    uint64_t before = origin_bytes(f);
    assert_int_equal(read_all(&f->nodes[1], "s.bin", stored.etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.bad, 0);
    assert_int_equal(stats.hits, 7);
    assert_true(stats.misses >= 1);
    assert_int_equal(origin_bytes(f) - before, BLOCK);
    stored_block_free(&stored);
    free(bytes);
}

/* A block read whose answer is not the range asked for (EIO: s3rver,
 * which writes objects in place, answers so during a rewrite) is a
 * miss for that block, not a failing tier: nothing is skipped, and the
 * block itself, under node 0's lease still, is asked for again and
 * comes from the tier too. */
static void test_garbled_answer_is_a_miss(void **state)
{
    struct fixture *f = *state;
    const size_t size = 8 * BLOCK;
    unsigned char *bytes = pattern(size, 12);
    struct stored_block stored;

    stored_block_get(f, "g.bin", bytes, size, 3, &stored);
    assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_GET, stored.key), 1,
                                  EIO, false, NULL), 0);
    uint64_t before = origin_bytes(f);
    assert_int_equal(read_all(&f->nodes[1], "g.bin", stored.etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.errors, 0);
    assert_false(stats.skipping);
    assert_int_equal(stats.misses, 1);
    assert_int_equal(stats.hits, 8);
    assert_int_equal(origin_bytes(f), before);
    stored_block_free(&stored);
    free(bytes);
}

/* A tier that fails is skipped: reads go on from the origin with the
 * right bytes, and it is not asked again for a while. */
static void test_failing_tier_is_skipped(void **state)
{
    struct fixture *f = *state;
    const size_t size = 16 * BLOCK;
    unsigned char *bytes = pattern(size, 6);
    char etag[S3_ETAG_MAX];

    assert_int_equal(fake_s3_put(f->origin, "s.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, FAKE_S3_ON(0, NULL), FAKE_S3_ALWAYS,
                                  ECONNREFUSED, false, NULL), 0);
    assert_int_equal(read_all(&f->nodes[0], "s.bin", etag, size, bytes), 0);
    assert_int_equal(origin_bytes(f), size);
    struct tier_stats stats = tier_stats_of(&f->nodes[0]);
    assert_int_equal(stats.errors, 1);
    assert_true(stats.skipping);
    assert_true(stats.skipped > 0);
    /* one request found it failing; nothing was offered while skipped */
    assert_int_equal(fake_s3_count(f->tier_s3, NULL), 1);
    assert_int_equal(stats.puts, 0);
    free(bytes);
}

/* A tier skipped for a failure is probed while skipped: once a probe is
 * answered, it is asked again, long before the skip's 10 s (before, a
 * node whose first tier request failed read 1 GiB from the origin in
 * that time: 2.01x the file for four nodes at once). Probes that fail
 * keep it skipped. */
static void test_skipped_tier_is_probed_back(void **state)
{
    struct fixture *f = *state;
    struct node *node = &f->nodes[0];
    const size_t size = 4 * BLOCK;
    unsigned char *bytes = pattern(size, 29);
    char etag[S3_ETAG_MAX];
    unsigned fail = 0;

    node_stop(node);
    node_start(f, node, 0, 0.05);
    assert_int_equal(fake_s3_put(f->origin, "p.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, FAKE_S3_ON(0, NULL), FAKE_S3_ALWAYS,
                                  ECONNREFUSED, false, &fail), 0);
    assert_int_equal(read_all(node, "p.bin", etag, size, bytes), 0);
    assert_true(tier_stats_of(node).skipping);
    /* failing probes: still skipped */
    double started = clock_monotonic_seconds();
    while (fake_s3_count(f->tier_s3, ON(FAKE_S3_HEAD, NULL)) < 3 &&
           clock_monotonic_seconds() - started < 5)
        usleep(10000);
    assert_true(fake_s3_count(f->tier_s3, ON(FAKE_S3_HEAD, NULL)) >= 3);
    assert_true(tier_stats_of(node).skipping);
    /* the tier answers again: the next probe ends the skip */
    fake_s3_fail_clear(f->tier_s3, fail);
    started = clock_monotonic_seconds();
    while (tier_stats_of(node).skipping &&
           clock_monotonic_seconds() - started < 5)
        usleep(10000);
    assert_false(tier_stats_of(node).skipping);
    /* and the blocks it fetches go to the tier again */
    assert_int_equal(fake_s3_put(f->origin, "q.bin", bytes, 2 * BLOCK, NULL,
                                 etag), 0);
    assert_int_equal(read_all(node, "q.bin", etag, 2 * BLOCK, bytes), 0);
    tier_flush(node->tier, 0);
    assert_int_equal(tier_stats_of(node).puts, 2);
    free(bytes);
}

struct get_call {
    struct tier *tier;
    const char *key, *etag;
    uint64_t index;
    int result;
};

static void *get_block_main(void *arg)
{
    struct get_call *call = arg;
    char *scratch = malloc(BLOCK + TIER_HEADER_LEN);
    const char *data = NULL;

    assert_non_null(scratch);
    call->result = tier_get_block(call->tier, call->key, call->etag,
                                  call->index, BLOCK, scratch, &data);
    free(scratch);
    return NULL;
}

/* A GET of the tier that times out while the tier answered a GET sent
 * after it is a busy tier's slow answer: counted, not skipped, and the
 * next blocks still come from the tier. A timeout with no answer since
 * it was sent is a failing tier: skipped. (Before: skipped on the first,
 * and a node of four reading 1 GiB at once read the rest from the
 * origin.) */
static void test_timeout_of_a_busy_tier_is_not_a_skip(void **state)
{
    struct fixture *f = *state;
    const size_t size = 4 * BLOCK;
    unsigned char *bytes = pattern(size, 17);
    char *scratch = malloc(BLOCK + TIER_HEADER_LEN);
    const char *data = NULL;
    char *block3 = NULL;
    unsigned rule = 0, fail = 0;
    pthread_t thread;
    struct stored_block stored;

    assert_non_null(scratch);
    stored_block_get(f, "t.bin", bytes, size, 0, &stored);
    const char *etag = stored.etag, *block0 = stored.key;
    struct tier_block_id id = {ORIGIN, "t.bin", etag, BLOCK, 3};
    assert_int_equal(tier_block_key("shared/", &id, &block3), 0);

    struct tier *tier = f->nodes[1].tier;
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_GET, block0), &rule), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_GET, block0), 1,
                                  ETIMEDOUT, false, &fail), 0);
    struct get_call slow = {tier, "t.bin", etag, 0, -1};
    assert_int_equal(pthread_create(&thread, NULL, get_block_main, &slow), 0);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, 1), 0);
    /* another GET, sent after it, is answered */
    assert_int_equal(tier_get_block(tier, "t.bin", etag, 1, BLOCK, scratch, &data), 0);
    assert_memory_equal(data, bytes + BLOCK, BLOCK);
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(slow.result, ETIMEDOUT);
    struct tier_stats stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.errors, 1);
    assert_false(stats.skipping);
    assert_int_equal(tier_get_block(tier, "t.bin", etag, 2, BLOCK, scratch, &data), 0);
    assert_memory_equal(data, bytes + 2 * BLOCK, BLOCK);

    /* a timeout after which nothing answered: skipped */
    assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_GET, block3), 1,
                                  ETIMEDOUT, false, NULL), 0);
    assert_int_equal(tier_get_block(tier, "t.bin", etag, 3, BLOCK, scratch, &data),
                     ETIMEDOUT);
    stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.errors, 2);
    assert_true(stats.skipping);
    stored_block_free(&stored);
    free(block3);
    free(scratch);
    free(bytes);
}

/* The prefix of the block objects of version ETAG of KEY in the tier
 * (not their leases): "shared/s3cachefs-tier/v1/HEX/6" (65536-...). */
static void blocks_prefix(const char *key, const char *etag, char *out, size_t len)
{
    struct tier_block_id id = {ORIGIN, key, etag, BLOCK, 0};
    char hex[TIER_VERSION_HEX + 1];

    assert_int_equal(tier_version_hex(&id, hex), 0);
    snprintf(out, len, "shared/" TIER_ROOT "%s/6", hex);
}

struct node_read {
    struct node *node;
    const char *key, *etag;
    size_t size;
    const unsigned char *expected;
    int result;
};

static void *node_read_main(void *arg)
{
    struct node_read *read = arg;

    read->result = read_all(read->node, read->key, read->etag, read->size,
                            read->expected);
    return NULL;
}

/* Two nodes that miss the same blocks at once, on a tier server whose
 * conditional writes behave as CONDITIONS: the first claims them (a
 * lease: MODE) and fetches them from the origin; the second sees the
 * lease and waits for the blocks in the tier: the origin sends them
 * once. */
static void second_node_waits(struct fixture *f,
                              enum fake_s3_conditions conditions, int mode)
{
    const size_t size = 6 * BLOCK;
    unsigned char *bytes = pattern(size, 7);
    char etag[S3_ETAG_MAX], prefix[160];
    unsigned rule = 0;
    pthread_t thread;

    fake_s3_set_conditions(f->tier_s3, conditions);
    assert_int_equal(fake_s3_put(f->origin, "r.bin", bytes, size, NULL, etag), 0);
    blocks_prefix("r.bin", etag, prefix, sizeof(prefix));
    /* node 0's blocks reach the tier only when the test says so */
    assert_int_equal(fake_s3_hold(f->tier_s3, UNDER(FAKE_S3_PUT, prefix), &rule), 0);
    assert_int_equal(read_all(&f->nodes[0], "r.bin", etag, size, bytes), 0);
    assert_int_equal(origin_bytes(f), size);
    assert_true(tier_stats_of(&f->nodes[0]).leases >= 1);
    assert_int_equal(tier_stats_of(&f->nodes[0]).lease_mode, mode);

    struct node_read second = {&f->nodes[1], "r.bin", etag, size, bytes, -1};
    assert_int_equal(pthread_create(&thread, NULL, node_read_main, &second), 0);
    WAIT_STATS(&f->nodes[1], stats.lease_waits > 0);
    assert_true(tier_stats_of(&f->nodes[1]).lease_waits >= 1);
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(second.result, 0);
    assert_int_equal(origin_bytes(f), size);      /* not a byte more */
    struct tier_stats b = tier_stats_of(&f->nodes[1]);
    assert_int_equal(b.hits, 6);
    assert_true(b.lease_waits_met >= 1);
    assert_int_equal(b.leases + b.puts, 0);
    free(bytes);
}

static void test_second_node_waits_for_the_first(void **state)
{
    second_node_waits(*state, FAKE_S3_CONDITIONS_HONOURED,
                      TIER_LEASES_CONDITIONAL);
}

/* The same where the server ignores If-None-Match (s3rver) or refuses it
 * (Swift): the lease is written, then read back. */
static void test_lease_read_back_where_conditions_are_ignored(void **state)
{
    second_node_waits(*state, FAKE_S3_CONDITIONS_IGNORED,
                      TIER_LEASES_READ_BACK);
}

static void test_lease_read_back_where_conditions_are_refused(void **state)
{
    second_node_waits(*state, FAKE_S3_CONDITIONS_REFUSED,
                      TIER_LEASES_READ_BACK);
}

/* Without conditional writes, two nodes that write a lease at the same
 * moment both read back the write that landed last: its node fetches
 * the blocks, the other waits for them, and the origin sends them once. */
static void test_read_back_leases_agree_on_the_last_write(void **state)
{
    struct fixture *f = *state;
    const size_t size = 6 * BLOCK;
    unsigned char *bytes = pattern(size, 5);
    struct tier_block_id id = {ORIGIN, "race.bin", NULL, BLOCK, 0};
    char etag[S3_ETAG_MAX], *lease = NULL;
    unsigned rule = 0, read_back = 0;
    pthread_t threads[NODES];
    struct node_read reads[NODES];

    fake_s3_set_conditions(f->tier_s3, FAKE_S3_CONDITIONS_IGNORED);
    assert_int_equal(fake_s3_put(f->origin, "race.bin", bytes, size, NULL, etag), 0);
    id.etag = etag;
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    /* both nodes' lease writes wait, then land one just after the other;
     * both read back after both landed (what the pause after a write is
     * for: the one here is too short for a loaded machine's scheduler) */
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_PUT, lease), &rule), 0);
    for (int i = 0; i < NODES; i++) {
        reads[i] = (struct node_read){&f->nodes[i], "race.bin", etag, size,
                                      bytes, -1};
        assert_int_equal(pthread_create(&threads[i], NULL, node_read_main,
                                        &reads[i]), 0);
    }
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, NODES), 0);
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_GET, lease),
                                  &read_back), 0);
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, read_back, NODES), 0);
    fake_s3_hold_clear(f->tier_s3, read_back);
    for (int i = 0; i < NODES; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(reads[i].result, 0);
    }
    assert_int_equal(origin_bytes(f), size);      /* once, not twice */
    struct tier_stats a = tier_stats_of(&f->nodes[0]);
    struct tier_stats b = tier_stats_of(&f->nodes[1]);
    assert_int_equal(a.lease_mode, TIER_LEASES_READ_BACK);
    assert_int_equal(a.leases + b.leases, 1);
    struct tier_stats *waiter = a.leases == 0 ? &a : &b;
    assert_int_equal(waiter->hits, 6);
    assert_true(waiter->lease_waits_met >= 1);
    free(lease);
    free(bytes);
}

struct node_warm {
    struct node *node;
    const char *key, *etag;
    size_t size;
    int result;
};

static void *node_warm_main(void *arg)
{
    struct node_warm *warm = arg;
    struct reader_warm_result result;

    warm->result = reader_warm(warm->node->reader, warm->key, warm->etag,
                               warm->size, 1, NULL, &result);
    return NULL;
}

/* A busy tier (one that answers others) times out a GET of a block a
 * run of 4 (a warm) asks for: that block alone comes from the origin,
 * and the tier serves the ones after it (before, the rest of the run
 * came from the origin: with other nodes' leases on it, up to 8 MiB
 * fetched twice). */
static void test_busy_timeout_of_a_tier_read_fetches_one_block(void **state)
{
    struct fixture *f = *state;
    const size_t size = 4 * BLOCK;
    unsigned char *bytes = pattern(size, 23);
    char *scratch = malloc(BLOCK + TIER_HEADER_LEN);
    const char *data = NULL;
    unsigned rule = 0;
    pthread_t thread;
    struct stored_block stored;

    assert_non_null(scratch);
    stored_block_get(f, "b.bin", bytes, size, 1, &stored);
    const char *etag = stored.etag, *block1 = stored.key;
    uint64_t before = origin_bytes(f);
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_GET, block1), &rule), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_GET, block1), 1,
                                  ETIMEDOUT, false, NULL), 0);
    struct node_warm warm = {&f->nodes[1], "b.bin", etag, size, -1};
    assert_int_equal(pthread_create(&thread, NULL, node_warm_main, &warm), 0);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, 1), 0);
    /* the tier answers a request sent after the held one */
    assert_int_equal(tier_get_block(f->nodes[1].tier, "b.bin", etag, 3, BLOCK,
                                    scratch, &data), 0);
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(warm.result, 0);
    assert_int_equal(origin_bytes(f) - before, BLOCK);
    assert_int_equal(read_all(&f->nodes[1], "b.bin", etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[1]);
    assert_int_equal(stats.errors, 1);
    assert_false(stats.skipping);
    stored_block_free(&stored);
    free(scratch);
    free(bytes);
}


struct claim_call {
    struct tier *tier;
    const char *key, *etag;
    uint64_t first, last;
    bool reading_on;
    int claim;
    uint64_t covered;
    double until;
};

static void *claim_main(void *arg)
{
    struct claim_call *call = arg;

    call->claim = (int)tier_claim_blocks(call->tier, call->key, call->etag,
                                         call->first, call->last,
                                         call->reading_on, &call->covered,
                                         &call->until);
    return NULL;
}

/* Another node's lease covers blocks 2..7 of a group this node warms
 * (one GET at a time, runs of 4 blocks): it fetches 0..1 from the
 * origin, not the whole run 0..3, and waits for 2..7, which that node
 * puts in the tier. */
static void test_run_stops_at_another_nodes_lease(void **state)
{
    struct fixture *f = *state;
    const size_t size = 8 * BLOCK;
    unsigned char *bytes = pattern(size, 4);
    struct tier_block_id id = {ORIGIN, "l.bin", NULL, BLOCK, 0};
    char etag[S3_ETAG_MAX], text[96], *lease = NULL;
    pthread_t thread;
    struct timespec now;

    assert_int_equal(fake_s3_put(f->origin, "l.bin", bytes, size, NULL, etag), 0);
    id.etag = etag;
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(text, sizeof(text), "%ld.000 2 7 00000000000000ab 7\n",
             (long)now.tv_sec + 9);
    assert_int_equal(fake_s3_put(f->tier_s3, lease, text, strlen(text), NULL,
                                 NULL), 0);

    struct node_warm warm = {&f->nodes[0], "l.bin", etag, size, -1};
    assert_int_equal(pthread_create(&thread, NULL, node_warm_main, &warm), 0);
    WAIT_STATS(&f->nodes[0], stats.lease_waits > 0);
    assert_true(tier_stats_of(&f->nodes[0]).lease_waits >= 1);
    for (uint64_t block = 2; block < 8; block++) {   /* the other node */
        unsigned char frame[TIER_HEADER_LEN + BLOCK];
        char *key = NULL;
        id.index = block;
        assert_int_equal(tier_frame_header(&id, bytes + block * BLOCK, BLOCK,
                                           frame), 0);
        memcpy(frame + TIER_HEADER_LEN, bytes + block * BLOCK, BLOCK);
        assert_int_equal(tier_block_key("shared/", &id, &key), 0);
        assert_int_equal(fake_s3_put(f->tier_s3, key, frame, sizeof(frame),
                                     NULL, NULL), 0);
        free(key);
    }
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(warm.result, 0);
    assert_int_equal(read_all(&f->nodes[0], "l.bin", etag, size, bytes), 0);
    assert_int_equal(origin_bytes(f), 2 * BLOCK);
    struct tier_stats stats = tier_stats_of(&f->nodes[0]);
    assert_int_equal(stats.hits, 6);
    assert_true(stats.lease_waits_met >= 1);
    free(lease);
    free(bytes);
}

/* Another node's running lease on group GROUP_FIRST.. of KEY (version
 * ETAG): blocks FIRST..LAST, read on to INTENDS, for 9 s more. */
static void put_other_lease_for(struct fixture *f, const char *key,
                                const char *etag, uint64_t group_first,
                                unsigned first, unsigned last, unsigned intends,
                                double seconds)
{
    struct tier_block_id id = {ORIGIN, key, etag, BLOCK, group_first};
    char text[96], *lease = NULL;

    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    snprintf(text, sizeof(text), "%.3f %u %u 00000000000000ab %u\n",
             clock_wall_seconds() + seconds, first, last, intends);
    assert_int_equal(fake_s3_put(f->tier_s3, lease, text, strlen(text), NULL,
                                 NULL), 0);
    free(lease);
}

static void put_other_lease(struct fixture *f, const char *key,
                            const char *etag, uint64_t group_first,
                            unsigned first, unsigned last, unsigned intends)
{
    put_other_lease_for(f, key, etag, group_first, first, last, intends, 9);
}

/* A node's reads run in parallel: the read-ahead of blocks 3..7 may
 * claim the group before the read of blocks 0..2 does. Another node
 * that misses block 0 meanwhile waits for that lease to widen down to
 * it, and then waits for the blocks, rather than fetching 0..2 too. */
static void test_lease_after_the_block_is_waited_for(void **state)
{
    struct fixture *f = *state;
    char etag[] = "\"e1\"", *lease = NULL;
    struct tier_block_id id = {ORIGIN, "w.bin", etag, BLOCK, 0};
    uint64_t covered = 0;
    double until = 0;
    unsigned rule = 0;

    put_other_lease(f, "w.bin", etag, 0, 3, 7, 7);      /* read-ahead */
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_GET, lease), &rule), 0);
    struct tier *tier = f->nodes[0].tier;
    struct claim_call call = {tier, "w.bin", etag, 0, 3, true, -1, 0, 0};
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, claim_main, &call), 0);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, 1), 0);
    assert_int_equal(fake_s3_release(f->tier_s3, rule, false, NULL), 0);
    /* the claim saw 3..7; while it looks again, that node takes 0 in */
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, 1), 0);
    put_other_lease(f, "w.bin", etag, 0, 0, 7, 7);
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(call.claim, TIER_AWAIT);
    assert_int_equal(call.covered, 7);
    assert_true(call.until > 0);

    /* a lease of one read, not read-ahead, that does not widen: the
     * blocks before it are fetched after a moment */
    put_other_lease(f, "w.bin", etag, 0, 3, 3, 3);
    assert_int_equal(tier_claim_blocks(tier, "w.bin", etag, 0, 3, true,
                                       &covered, &until), TIER_FETCH);
    assert_int_equal(covered, 2);
    assert_int_equal(tier_stats_of(&f->nodes[0]).leases, 0);
    free(lease);
}

/* A run over two groups, where another node's lease in the second is on
 * blocks after the run's: the run's blocks in the first group are
 * fetched; the second group is asked of the tier again when the run
 * gets to it (that node may widen its lease down to them meanwhile),
 * not fetched without a lease. */
static void test_run_stops_before_a_group_another_node_leases(void **state)
{
    struct fixture *f = *state;
    char etag[] = "\"e2\"";
    uint64_t covered = 0;
    double until = 0;
    struct tier *tier = f->nodes[0].tier;

    put_other_lease(f, "n.bin", etag, 8, 12, 15, 15);
    assert_int_equal(tier_claim_blocks(tier, "n.bin", etag, 4, 11, true,
                                       &covered, &until), TIER_FETCH);
    assert_int_equal(covered, 7);
    assert_int_equal(tier_stats_of(&f->nodes[0]).leases, 1);
    /* with no lease there, the run goes on into it, leased */
    assert_int_equal(tier_claim_blocks(tier, "n.bin", etag, 20, 27, true,
                                       &covered, &until), TIER_FETCH);
    assert_int_equal(covered, 27);
    assert_int_equal(tier_stats_of(&f->nodes[0]).leases, 3);
}

/* A claim whose lease write times out on a busy tier (it answered a
 * write sent after it: a reader's claim of another group, at the same
 * time): the claim says to fetch the first block only, and ask the tier
 * again for the rest (another node may hold the group); the tier is not
 * skipped. Before, the whole run was fetched. */
static void test_busy_timeout_of_a_claim_fetches_one_block(void **state)
{
    struct fixture *f = *state;
    char etag[] = "\"e3\"", *lease = NULL;
    struct tier_block_id id = {ORIGIN, "c.bin", etag, BLOCK, 0};
    unsigned rule = 0;
    pthread_t thread;

    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_PUT, lease), &rule), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_PUT, lease), 1,
                                  ETIMEDOUT, false, NULL), 0);
    struct tier *tier = f->nodes[0].tier;
    struct claim_call call = {tier, "c.bin", etag, 0, 3, true, -1, 0, 0};
    assert_int_equal(pthread_create(&thread, NULL, claim_main, &call), 0);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, 1), 0);
    uint64_t covered = 0;
    double until = 0;
    assert_int_equal(tier_claim_blocks(tier, "c.bin", etag, 8, 11, true,
                                       &covered, &until), TIER_FETCH);
    assert_int_equal(covered, 11);                     /* an answer */
    fake_s3_hold_clear(f->tier_s3, rule);
    assert_int_equal(pthread_join(thread, NULL), 0);
    assert_int_equal(call.claim, TIER_FETCH);
    assert_int_equal(call.covered, 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[0]);
    assert_int_equal(stats.errors, 1);
    assert_false(stats.skipping);
    free(lease);
}

/* Until HOLD holds COUNT requests, or SECONDS have passed: how many it
 * holds (a node that sends its requests one after another never has
 * more than one held). */
static unsigned held_within(struct s3_client *s3, unsigned hold,
                            unsigned count, double seconds)
{
    double started = clock_monotonic_seconds();

    while (fake_s3_held(s3, hold) < count &&
           clock_monotonic_seconds() - started < seconds)
        usleep(1000);
    return fake_s3_held(s3, hold);
}

/* One block read on NODE and flushed to the tier: the lease mode is
 * known and the tier has answered a write. Returns the origin's bytes
 * so far. */
static uint64_t tier_warmed(struct fixture *f, struct node *node)
{
    const size_t size = BLOCK;
    unsigned char *bytes = pattern(size, 40);
    char etag[S3_ETAG_MAX];

    assert_int_equal(fake_s3_put(f->origin, "warm.bin", bytes, size, NULL,
                                 etag), 0);
    assert_int_equal(read_all(node, "warm.bin", etag, size, bytes), 0);
    assert_true(tier_flush(node->tier, 0));
    assert_int_equal(tier_stats_of(node).puts, 1);
    free(bytes);
    return origin_bytes(f);
}

#define READERS 3

/* A tier whose writes stall while its reads answer: readers of one node
 * that miss blocks at once each send one lease write, all at the same
 * time (no lock across a request), and when they time out the tier is
 * skipped: no reader pays a second request's deadline, and none waits
 * for another's. Before, the node's claims went one at a time under a
 * lock held across their requests, and a write's timeout counted as a
 * busy tier's as long as its reads answered, so each block cost one
 * deadline, one reader after another. */
static void test_stalled_lease_writes_skip_the_tier_at_once(void **state)
{
    struct fixture *f = *state;
    struct node *node = &f->nodes[0];
    const size_t size = 4 * BLOCK;
    unsigned char *bytes[READERS];
    char etags[READERS][S3_ETAG_MAX], keys[READERS][16];
    struct node_read reads[READERS];
    pthread_t threads[READERS];
    unsigned rule = 0;

    uint64_t before = tier_warmed(f, node);
    unsigned puts_before = fake_s3_count(f->tier_s3, ON(FAKE_S3_PUT, NULL));
    assert_int_equal(fake_s3_hold(f->tier_s3, UNDER(FAKE_S3_PUT, "shared/"),
                                  &rule), 0);
    assert_int_equal(fake_s3_fail(f->tier_s3, UNDER(FAKE_S3_PUT, "shared/"),
                                  FAKE_S3_ALWAYS, ETIMEDOUT, false, NULL), 0);
    for (int i = 0; i < READERS; i++) {
        bytes[i] = pattern(size, 41 + i);
        snprintf(keys[i], sizeof(keys[i]), "r%d.bin", i);
        assert_int_equal(fake_s3_put(f->origin, keys[i], bytes[i], size, NULL,
                                     etags[i]), 0);
        reads[i] = (struct node_read){node, keys[i], etags[i], size, bytes[i], -1};
        assert_int_equal(pthread_create(&threads[i], NULL, node_read_main,
                                        &reads[i]), 0);
    }
    unsigned held = held_within(f->tier_s3, rule, READERS, 3);
    fake_s3_hold_clear(f->tier_s3, rule);      /* they time out */
    for (int i = 0; i < READERS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(reads[i].result, 0);
    }
    if (held < READERS)
        fail_msg("%u lease write(s) under way at once, not one per reader "
                 "(%d)", held, READERS);
    struct tier_stats stats = tier_stats_of(node);
    assert_true(stats.skipping);
    /* one write per reader, none after the timeouts */
    assert_int_equal(fake_s3_count(f->tier_s3, ON(FAKE_S3_PUT, NULL)) -
                         puts_before, held);
    assert_int_equal(origin_bytes(f) - before, READERS * size);
    for (int i = 0; i < READERS; i++)
        free(bytes[i]);
}

/* A tier skipped because its writes time out is probed with a write,
 * not a HEAD, which its reads would answer: it stays skipped while its
 * writes fail, and is asked again once one is answered. Before, a lease
 * write that timed out while reads answered did not skip it at all. */
static void test_tier_whose_writes_fail_is_probed_with_a_write(void **state)
{
    struct fixture *f = *state;
    struct node *node = &f->nodes[0];
    const size_t size = 4 * BLOCK;
    unsigned char *bytes = pattern(size, 45);
    char etag[S3_ETAG_MAX];
    unsigned fail = 0;

    node_stop(node);
    node_start(f, node, 0, 0.05);
    tier_warmed(f, node);
    assert_int_equal(fake_s3_fail(f->tier_s3, UNDER(FAKE_S3_PUT, "shared/"),
                                  FAKE_S3_ALWAYS, ETIMEDOUT, false, &fail), 0);
    assert_int_equal(fake_s3_put(f->origin, "p.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(read_all(node, "p.bin", etag, size, bytes), 0);
    assert_true(tier_stats_of(node).skipping);
    unsigned heads = fake_s3_count(f->tier_s3, ON(FAKE_S3_HEAD, NULL));
    unsigned puts = fake_s3_count(f->tier_s3, ON(FAKE_S3_PUT, NULL));
    double started = clock_monotonic_seconds();
    while (fake_s3_count(f->tier_s3, ON(FAKE_S3_PUT, NULL)) < puts + 3 &&
           clock_monotonic_seconds() - started < 5)
        usleep(10000);
    assert_true(tier_stats_of(node).skipping);  /* failing probes */
    assert_int_equal(fake_s3_count(f->tier_s3, ON(FAKE_S3_HEAD, NULL)), heads);
    assert_true(fake_s3_count(f->tier_s3, ON(FAKE_S3_PUT, NULL)) >= puts + 3);
    fake_s3_fail_clear(f->tier_s3, fail);
    started = clock_monotonic_seconds();
    while (tier_stats_of(node).skipping &&
           clock_monotonic_seconds() - started < 5)
        usleep(10000);
    assert_false(tier_stats_of(node).skipping);
    free(bytes);
}

/* A lease past its time (its node died) is taken over: the block is
 * fetched from the origin at once, not waited for. The takeover is a
 * write over that very lease (If-Match its ETag), never a DELETE, which
 * could remove another node's takeover. */
static void test_expired_lease_is_taken_over(void **state)
{
    struct fixture *f = *state;
    const size_t size = 2 * BLOCK;
    unsigned char *bytes = pattern(size, 9);
    struct tier_block_id id = {ORIGIN, "x.bin", NULL, BLOCK, 0};
    char etag[S3_ETAG_MAX], old_etag[S3_ETAG_MAX], *lease = NULL;
    const char old[] = "1000.000 0 7\n";       /* expired in 1970 */
    struct fake_s3_request takeover;

    assert_int_equal(fake_s3_put(f->origin, "x.bin", bytes, size, NULL, etag), 0);
    id.etag = etag;
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    assert_int_equal(fake_s3_put(f->tier_s3, lease, old, strlen(old), NULL,
                                 old_etag), 0);
    assert_int_equal(read_all(&f->nodes[0], "x.bin", etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[0]);
    assert_int_equal(stats.leases, 1);
    assert_int_equal(stats.lease_waits, 0);
    assert_int_equal(fake_s3_count(f->tier_s3, ON(FAKE_S3_DELETE, lease)), 0);
    long at = fake_s3_log_find(f->tier_s3, 0, ON(FAKE_S3_PUT, lease));
    assert_true(at >= 0);                       /* If-None-Match: refused */
    at = fake_s3_log_find(f->tier_s3, (size_t)at + 1, ON(FAKE_S3_PUT, lease));
    assert_true(at >= 0);
    assert_int_equal(fake_s3_log_get(f->tier_s3, (size_t)at, &takeover), 0);
    assert_non_null(takeover.condition);
    assert_string_equal(takeover.condition, old_etag);
    assert_int_equal(takeover.result, 0);
    assert_false(fake_s3_holds(f->tier_s3, lease, old, strlen(old)));
    assert_int_equal(origin_bytes(f), size);
    free(lease);
    free(bytes);
}

/* A claim on a thread of its own that says when it is done. */
struct claim_run {
    struct claim_call call;
    atomic_bool done;
};

static void *claim_run_main(void *arg)
{
    struct claim_run *run = arg;

    claim_main(&run->call);
    atomic_store(&run->done, true);
    return NULL;
}

/* Two nodes find the same expired lease and take it over at the same
 * moment, node 0's takeover landing first, whole, then node 1's, on a
 * server that has If-Match on writes or (IF_MATCH false) only
 * If-None-Match. With If-Match: one wins the group and fetches it, the
 * other finds that node's lease and waits for the blocks. Before, a
 * takeover was a DELETE and a new conditional write: the second node's
 * DELETE removed the lease the first had just written, and both
 * fetched the group. Without: a plain write read back, and node 1's
 * landing after node 0 read back, both fetch: the bound there, a
 * duplicate fetch and no more. */
static void expired_lease_taken_over_at_once(struct fixture *f, bool if_match)
{
    char etag[] = "\"e4\"", *lease = NULL;
    struct tier_block_id id = {ORIGIN, "t.bin", etag, BLOCK, 0};
    const char old[] = "1000.000 0 7\n";       /* expired in 1970 */
    struct claim_run runs[NODES];
    pthread_t threads[NODES];
    unsigned reads = 0, writes = 0;

    if (!if_match)
        fake_s3_set_if_match_conditions(f->tier_s3, FAKE_S3_CONDITIONS_IGNORED);
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    assert_int_equal(fake_s3_put(f->tier_s3, lease, old, strlen(old), NULL,
                                 NULL), 0);
    /* both read the expired lease before either takes it over */
    assert_int_equal(fake_s3_hold(f->tier_s3, ON(FAKE_S3_GET, lease), &reads), 0);
    for (int i = 0; i < NODES; i++) {
        runs[i].call = (struct claim_call){f->nodes[i].tier, "t.bin", etag, 0,
                                           3, false, -1, 0, 0};
        atomic_init(&runs[i].done, false);
        assert_int_equal(pthread_create(&threads[i], NULL, claim_run_main,
                                        &runs[i]), 0);
        assert_int_equal(fake_s3_wait_held(f->tier_s3, reads, i + 1), 0);
    }
    struct fake_s3_match lease_writes = {
        .calls = FAKE_S3_CALL(FAKE_S3_PUT) | FAKE_S3_CALL(FAKE_S3_DELETE),
        .key = lease};
    assert_int_equal(fake_s3_hold(f->tier_s3, &lease_writes, &writes), 0);
    for (unsigned i = 0; i < NODES; i++) {
        assert_int_equal(fake_s3_release(f->tier_s3, reads, false, NULL), 0);
        assert_int_equal(fake_s3_wait_held(f->tier_s3, writes, i + 1), 0);
    }
    fake_s3_hold_clear(f->tier_s3, reads);
    /* node 0's takeover goes first, all of it; node 1's after */
    assert_int_equal(fake_s3_release(f->tier_s3, writes, false, NULL), 0);
    double started = clock_monotonic_seconds();
    while (!atomic_load(&runs[0].done) &&
           clock_monotonic_seconds() - started < 5) {
        if (fake_s3_held(f->tier_s3, writes) >= 2)
            fake_s3_release(f->tier_s3, writes, true, NULL);
        usleep(1000);
    }
    fake_s3_hold_clear(f->tier_s3, writes);
    for (int i = 0; i < NODES; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(runs[0].call.claim, TIER_FETCH);
    assert_int_equal(runs[0].call.covered, 3);
    assert_int_equal(runs[1].call.covered, 3);
    unsigned leases = tier_stats_of(&f->nodes[0]).leases +
                      tier_stats_of(&f->nodes[1]).leases;
    if (if_match) {
        assert_int_equal(runs[1].call.claim, TIER_AWAIT); /* node 0's lease */
        assert_int_equal(leases, 1);
    } else {
        assert_int_equal(runs[1].call.claim, TIER_FETCH);
        assert_int_equal(leases, 2);
    }
    assert_int_equal(fake_s3_count(f->tier_s3, ON(FAKE_S3_DELETE, lease)), 0);
    free(lease);
}

static void test_expired_lease_is_taken_over_once(void **state)
{
    expired_lease_taken_over_at_once(*state, true);
}

static void test_expired_lease_taken_over_without_if_match(void **state)
{
    expired_lease_taken_over_at_once(*state, false);
}

/* This node's lease on a group was taken over by another node (its
 * clock ahead, say, saw it past its time): the next run of the group
 * here renews the lease only over the object it wrote (If-Match), finds
 * the other node's instead, leaves it and waits for its blocks. Before,
 * the renewal was a plain write: it replaced the other node's lease,
 * and both fetched the group (the other node's waiters, that lease's
 * blocks, from either). */
static void test_renewal_never_writes_over_another_nodes_lease(void **state)
{
    struct fixture *f = *state;
    char etag[] = "\"e5\"", text[96], *lease = NULL;
    struct tier_block_id id = {ORIGIN, "o.bin", etag, BLOCK, 0};
    struct tier *tier = f->nodes[0].tier;
    uint64_t covered = 0;
    double until = 0;

    assert_int_equal(tier_claim_blocks(tier, "o.bin", etag, 0, 1, false,
                                       &covered, &until), TIER_FETCH);
    assert_int_equal(covered, 1);
    assert_int_equal(tier_stats_of(&f->nodes[0]).leases, 1);
    /* another node's lease in its place, on the whole group */
    assert_int_equal(tier_lease_key("shared/", &id, TIER_LEASE_BLOCKS, &lease), 0);
    snprintf(text, sizeof(text), "%.3f 0 7 00000000000000ab 7\n",
             clock_wall_seconds() + 9);
    assert_int_equal(fake_s3_put(f->tier_s3, lease, text, strlen(text), NULL,
                                 NULL), 0);
    /* this node's next run of the group */
    enum tier_claim claim = tier_claim_blocks(tier, "o.bin", etag, 2, 3, false,
                                              &covered, &until);
    assert_true(fake_s3_holds(f->tier_s3, lease, text, strlen(text)));
    assert_int_equal(claim, TIER_AWAIT);
    assert_int_equal(covered, 7);
    free(lease);
}

/* Another node leased the blocks and never wrote them (its writes
 * failed, or it went). A node waiting for them, when the lease runs out,
 * claims the group in turn, and a node that misses them then waits for
 * it: the origin sends them once. Before, the first fetched the rest of
 * its run without a lease, and every node that waited did the same (in
 * CI, three nodes reading one file at once took 1.29 times it from the
 * origin after one failed tier request). */
static void test_lease_that_ran_out_is_claimed_by_its_waiter(void **state)
{
    struct fixture *f = *state;
    const size_t size = 6 * BLOCK;
    unsigned char *bytes = pattern(size, 11);
    char etag[S3_ETAG_MAX], prefix[160];
    unsigned rule = 0;
    pthread_t threads[NODES];

    assert_int_equal(fake_s3_put(f->origin, "l.bin", bytes, size, NULL, etag), 0);
    put_other_lease_for(f, "l.bin", etag, 0, 0, 7, 7, 0.5);
    blocks_prefix("l.bin", etag, prefix, sizeof(prefix));
    /* node 0's blocks reach the tier only when the test says so */
    assert_int_equal(fake_s3_hold(f->tier_s3, UNDER(FAKE_S3_PUT, prefix), &rule), 0);
    struct node_read reads[NODES] = {
        {&f->nodes[0], "l.bin", etag, size, bytes, -1},
        {&f->nodes[1], "l.bin", etag, size, bytes, -1},
    };
    assert_int_equal(pthread_create(&threads[0], NULL, node_read_main, &reads[0]), 0);
    WAIT_STATS(&f->nodes[0], stats.leases >= 1);
    struct tier_stats first = tier_stats_of(&f->nodes[0]);
    assert_true(first.lease_waits >= 1);   /* for the other node's lease */
    assert_int_equal(first.leases, 1);     /* then its own */
    assert_int_equal(pthread_create(&threads[1], NULL, node_read_main, &reads[1]), 0);
    WAIT_STATS(&f->nodes[1], stats.lease_waits >= 1);
    assert_true(tier_stats_of(&f->nodes[1]).lease_waits >= 1);
    fake_s3_hold_clear(f->tier_s3, rule);
    for (int i = 0; i < NODES; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(reads[i].result, 0);
    }
    assert_int_equal(origin_bytes(f), size);      /* not a byte more */
    struct tier_stats second = tier_stats_of(&f->nodes[1]);
    assert_int_equal(second.hits, 6);
    assert_int_equal(second.leases, 0);
    free(bytes);
}

/* Node 0 leases a file's blocks and fetches them, but they do not
 * reach the tier: with QUEUE_FULL its write queue (one block) is full,
 * else the write of block 0 times out while the tier answers the
 * others (not a skip). Node 1, waiting for block 0 under node 0's
 * lease, must not sit out the lease (10 s): node 0 gives it back, and
 * node 1 claims and fetches the blocks at once (a duplicate fetch, the
 * cost of a block that never reached the tier). */
static void dropped_offer_gives_the_lease_back(struct fixture *f,
                                               bool queue_full)
{
    struct node *first = &f->nodes[0];
    const size_t size = 6 * BLOCK;
    unsigned char *bytes = pattern(size, 50);
    char etag[S3_ETAG_MAX], prefix[160], *block0 = NULL;
    unsigned fetches = 0, writes = 0;
    pthread_t threads[NODES];

    if (queue_full) {
        node_stop(first);
        node_start(f, first, 1, -1);
    }
    assert_int_equal(fake_s3_put(f->origin, "g.bin", bytes, size, NULL, etag), 0);
    blocks_prefix("g.bin", etag, prefix, sizeof(prefix));
    struct tier_block_id id = {ORIGIN, "g.bin", etag, BLOCK, 0};
    assert_int_equal(tier_block_key("shared/", &id, &block0), 0);
    /* node 0's block writes wait (block 0's, to time out) */
    assert_int_equal(fake_s3_hold(f->tier_s3, queue_full
                                                  ? UNDER(FAKE_S3_PUT, prefix)
                                                  : ON(FAKE_S3_PUT, block0),
                                  &writes), 0);
    if (!queue_full)
        assert_int_equal(fake_s3_fail(f->tier_s3, ON(FAKE_S3_PUT, block0), 1,
                                      ETIMEDOUT, false, NULL), 0);
    /* node 0's fetch waits until node 1 waits on its lease */
    assert_int_equal(fake_s3_hold(f->origin, ON(FAKE_S3_GET, "g.bin"),
                                  &fetches), 0);
    struct node_read reads[NODES] = {
        {&f->nodes[0], "g.bin", etag, size, bytes, -1},
        {&f->nodes[1], "g.bin", etag, size, bytes, -1},
    };
    assert_int_equal(pthread_create(&threads[0], NULL, node_read_main, &reads[0]), 0);
    assert_int_equal(fake_s3_wait_held(f->origin, fetches, 1), 0);
    assert_int_equal(pthread_create(&threads[1], NULL, node_read_main, &reads[1]), 0);
    WAIT_STATS(&f->nodes[1], stats.lease_waits >= 1);
    assert_true(tier_stats_of(&f->nodes[1]).lease_waits >= 1);
    double released = clock_monotonic_seconds();
    fake_s3_hold_clear(f->origin, fetches);
    if (!queue_full) {
        /* the other blocks' writes are answered, then block 0's times out */
        WAIT_STATS(first, stats.puts >= 5);
        fake_s3_release_all(f->tier_s3, writes);
    }
    assert_int_equal(pthread_join(threads[1], NULL), 0);
    double waited = clock_monotonic_seconds() - released;
    fake_s3_hold_clear(f->tier_s3, writes);
    assert_int_equal(pthread_join(threads[0], NULL), 0);
    for (int i = 0; i < NODES; i++)
        assert_int_equal(reads[i].result, 0);
    struct tier_stats a = tier_stats_of(first);
    assert_true(a.put_dropped >= 1);
    assert_false(a.skipping);
    if (waited >= TIER_LEASE_SECONDS / 2)
        fail_msg("node 1 waited %.1f s for a block node 0 dropped (its lease "
                 "ran %.0f s)", waited, TIER_LEASE_SECONDS);
    assert_true(origin_bytes(f) <= 2 * size);
    free(block0);
    free(bytes);
}

static void test_offer_dropped_by_a_full_queue_gives_the_lease_back(void **state)
{
    dropped_offer_gives_the_lease_back(*state, true);
}

static void test_offer_whose_write_failed_gives_the_lease_back(void **state)
{
    dropped_offer_gives_the_lease_back(*state, false);
}

/* How node 0's fetch from the origin of the blocks it leased fails. */
struct origin_failure {
    const char *name;
    int err;                     /* what the GET (and the warm) returns */
    bool lost;                   /* half the range is delivered first */
    bool full_disk;              /* the GET succeeds; node 0's cache
                                    cannot take a block (err: ENOSPC) */
};

static const struct origin_failure origin_failures[] = {
    {"the origin refuses the GET", EACCES, false, false},
    {"the GET times out half way", ETIMEDOUT, true, false},
    {"node 0's cache disk is full", ENOSPC, false, true},
};

/* Node 0 leases a group (a warm: blocks 0..3 of 6, one GET) and its
 * fetch of it from the origin fails, one way of ORIGIN_FAILURES each.
 * Node 1, waiting for block 0 under node 0's lease, must not sit out
 * the lease (10 s): node 0, which knows it will not deliver, gives the
 * lease back as for a dropped offer, and node 1 claims the blocks and
 * fetches them itself within about the 0.5 s it takes to look at the
 * lease again. The origin sends each block to node 1 once (node 0's
 * failed GET is the only other request: at most a duplicate fetch). */
static void test_failed_origin_fetch_gives_the_lease_back(void **state)
{
    struct fixture *f = *state;
    struct node *first = &f->nodes[0];
    const size_t size = 6 * BLOCK;

    for (size_t i = 0; i < sizeof(origin_failures) / sizeof(origin_failures[0]);
         i++) {
        const struct origin_failure *c = &origin_failures[i];
        unsigned char *bytes = pattern(size, 60 + (unsigned)i);
        char key[16], etag[S3_ETAG_MAX];
        unsigned fetches = 0, got[6] = {0}, failed = 0;
        pthread_t warm_thread, read_thread;

        print_message("  %s\n", c->name);
        snprintf(key, sizeof(key), "o%zu.bin", i);
        if (c->full_disk) {
            node_stop(first);
            first->full_disk = true;
            node_start(f, first, 0, -1);
        }
        assert_int_equal(fake_s3_put(f->origin, key, bytes, size, NULL, etag), 0);
        uint64_t before = origin_bytes(f);
        size_t log_from = fake_s3_log_count(f->origin);
        uint64_t leases_before = tier_stats_of(first).leases;
        if (!c->full_disk)
            assert_int_equal(fake_s3_fail(f->origin, ON(FAKE_S3_GET, key), 1,
                                          c->err, c->lost, NULL), 0);
        /* node 0's fetch waits until node 1 waits on its lease */
        assert_int_equal(fake_s3_hold(f->origin, ON(FAKE_S3_GET, key),
                                      &fetches), 0);
        struct node_warm warm = {first, key, etag, size, -1};
        assert_int_equal(pthread_create(&warm_thread, NULL, node_warm_main,
                                        &warm), 0);
        assert_int_equal(fake_s3_wait_held(f->origin, fetches, 1), 0);
        assert_int_equal(tier_stats_of(first).leases, leases_before + 1);
        struct node_read read = {&f->nodes[1], key, etag, size, bytes, -1};
        uint64_t waits_before = tier_stats_of(&f->nodes[1]).lease_waits;
        assert_int_equal(pthread_create(&read_thread, NULL, node_read_main,
                                        &read), 0);
        WAIT_STATS(&f->nodes[1], stats.lease_waits > waits_before);
        assert_true(tier_stats_of(&f->nodes[1]).lease_waits > waits_before);
        double released = clock_monotonic_seconds();
        assert_int_equal(fake_s3_release(f->origin, fetches, false, NULL), 0);
        assert_int_equal(pthread_join(warm_thread, NULL), 0);
        assert_int_equal(warm.result, c->err);
        /* node 1's GETs, once it claimed the blocks, go on */
        fake_s3_fail_clear(f->origin, 0);
        fake_s3_hold_clear(f->origin, fetches);
        assert_int_equal(pthread_join(read_thread, NULL), 0);
        double waited = clock_monotonic_seconds() - released;
        assert_int_equal(read.result, 0);
        if (waited >= 1.0)
            fail_msg("%s: node 1 waited %.1f s for blocks node 0 failed to "
                     "fetch (its lease ran %.0f s)", c->name, waited,
                     TIER_LEASE_SECONDS);
        assert_true(tier_stats_of(&f->nodes[1]).leases >= 1);
        /* node 0's one failed GET; node 1's fetch each block once */
        assert_true(origin_bytes(f) - before <= 2 * size);
        for (size_t at = log_from; at < fake_s3_log_count(f->origin); at++) {
            struct fake_s3_request request;
            assert_int_equal(fake_s3_log_get(f->origin, at, &request), 0);
            if (request.call != FAKE_S3_GET || strcmp(request.key, key) != 0)
                continue;
            if (request.result != 0) {
                failed++;
                continue;
            }
            for (uint64_t b = request.offset / BLOCK;
                 b * BLOCK < request.offset + request.length; b++)
                got[b]++;
        }
        assert_int_equal(failed, 1);
        for (size_t b = 0; b < 6; b++)
            assert_true(got[b] <= 1);
        if (c->full_disk) {
            node_stop(first);
            first->full_disk = false;
            node_start(f, first, 0, -1);
        }
        free(bytes);
    }
}

/* Of two nodes writing one block, the first wins; the second learns it
 * from the If-None-Match answer. */
static void test_first_writer_wins(void **state)
{
    struct fixture *f = *state;
    const size_t size = 2 * BLOCK;
    unsigned char *bytes = pattern(size, 7);
    char etag[S3_ETAG_MAX];

    assert_int_equal(fake_s3_put(f->origin, "r.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(read_all(&f->nodes[0], "r.bin", etag, size, bytes), 0);
    tier_flush(f->nodes[0].tier, 0);
    assert_int_equal(tier_stats_of(&f->nodes[0]).puts, 2);
    /* offered again (as by a node that fetched it too): refused */
    struct cache_object *object = NULL;
    assert_int_equal(cache_object_open(f->nodes[0].cache, "r.bin", etag, size,
                                       &object), 0);
    tier_offer_block(f->nodes[0].tier, object, "r.bin", etag, 0);
    cache_object_close(f->nodes[0].cache, &object);
    tier_flush(f->nodes[0].tier, 0);
    struct tier_stats a = tier_stats_of(&f->nodes[0]);
    assert_int_equal(a.put_exists, 1);
    assert_int_equal(a.puts, 2);
    assert_int_equal(a.errors, 0);
    free(bytes);
}

/* A server that refuses If-None-Match on writes (Swift: 501) gets plain
 * writes: the blocks land, and nothing is counted as failing. */
static void test_server_without_conditional_writes(void **state)
{
    struct fixture *f = *state;
    const size_t size = 3 * BLOCK;
    unsigned char *bytes = pattern(size, 8);
    char etag[S3_ETAG_MAX];

    fake_s3_set_conditions(f->tier_s3, FAKE_S3_CONDITIONS_REFUSED);
    assert_int_equal(fake_s3_put(f->origin, "n.bin", bytes, size, NULL, etag), 0);
    assert_int_equal(read_all(&f->nodes[0], "n.bin", etag, size, bytes), 0);
    tier_flush(f->nodes[0].tier, 0);
    struct tier_stats stats = tier_stats_of(&f->nodes[0]);
    assert_int_equal(stats.puts, 3);
    assert_int_equal(stats.errors + stats.put_dropped, 0);
    assert_int_equal(stats.leases, 1);               /* written, read back */
    assert_int_equal(stats.lease_mode, TIER_LEASES_READ_BACK);
    assert_false(stats.skipping);
    /* the first writes refused (one per writer at most), then 3 plain */
    char prefix[160];
    blocks_prefix("n.bin", etag, prefix, sizeof(prefix));
    unsigned writes = fake_s3_count(f->tier_s3, UNDER(FAKE_S3_PUT, prefix));
    assert_true(writes >= 4 && writes <= 3 + 3);
    assert_int_equal(read_all(&f->nodes[1], "n.bin", etag, size, bytes), 0);
    assert_int_equal(tier_stats_of(&f->nodes[1]).hits, 3);
    free(bytes);
}

/* Offers past the queue's bound are dropped, not held; the queue holds
 * references to cached blocks, not their bytes. */
static void test_full_queue_drops_offers(void **state)
{
    struct fixture *f = *state;
    struct node *node = &f->nodes[1];
    const size_t size = 6 * BLOCK;
    unsigned char *bytes = pattern(size, 10);
    char etag[S3_ETAG_MAX], prefix[160];
    unsigned rule = 0;

    node_stop(node);
    node_start(f, node, 2, -1);
    assert_int_equal(fake_s3_put(f->origin, "q.bin", bytes, size, NULL, etag), 0);
    blocks_prefix("q.bin", etag, prefix, sizeof(prefix));
    assert_int_equal(fake_s3_hold(f->tier_s3, UNDER(FAKE_S3_PUT, prefix), &rule), 0);
    assert_int_equal(read_all(node, "q.bin", etag, size, bytes), 0);
    struct tier_stats stats = tier_stats_of(node);
    assert_int_equal(stats.put_dropped, 4);
    assert_true(stats.queued_bytes <= 2 * BLOCK);
    fake_s3_hold_clear(f->tier_s3, rule);
    tier_flush(node->tier, 0);
    stats = tier_stats_of(node);
    assert_int_equal(stats.puts, 2);
    assert_int_equal(stats.queued_bytes, 0);
    free(bytes);
}

/* A block evicted from the local cache before its turn is not written
 * (nothing else holds its bytes): the writers are kept busy with another
 * file's blocks meanwhile. */
static void test_evicted_before_written(void **state)
{
    struct fixture *f = *state;
    struct node *node = &f->nodes[0];
    unsigned char *busy = pattern(TIER_WRITERS * BLOCK, 12);
    unsigned char *bytes = pattern(3 * BLOCK, 11);
    char busy_etag[S3_ETAG_MAX], etag[S3_ETAG_MAX], prefix[160];
    unsigned rule = 0;
    uint64_t freed = 0;

    assert_int_equal(fake_s3_put(f->origin, "busy.bin", busy, TIER_WRITERS * BLOCK,
                                 NULL, busy_etag), 0);
    assert_int_equal(fake_s3_put(f->origin, "e.bin", bytes, 3 * BLOCK, NULL,
                                 etag), 0);
    blocks_prefix("busy.bin", busy_etag, prefix, sizeof(prefix));
    assert_int_equal(fake_s3_hold(f->tier_s3, UNDER(FAKE_S3_PUT, prefix), &rule), 0);
    assert_int_equal(read_all(node, "busy.bin", busy_etag, TIER_WRITERS * BLOCK,
                              busy), 0);
    assert_int_equal(fake_s3_wait_held(f->tier_s3, rule, TIER_WRITERS), 0);
    assert_int_equal(read_all(node, "e.bin", etag, 3 * BLOCK, bytes), 0);
    assert_int_equal(cache_evict_key(node->cache, "e.bin", &freed), 0);
    assert_true(freed > 0);
    fake_s3_hold_clear(f->tier_s3, rule);
    tier_flush(node->tier, 0);
    struct tier_stats stats = tier_stats_of(node);
    assert_int_equal(stats.puts, TIER_WRITERS);
    assert_int_equal(stats.put_dropped, 3);
    free(busy);
    free(bytes);
}

/* A prune goes by version: older than the age, then the oldest past the
 * size; keys of another shape are never chosen. */
static void test_prune_choice(void **state)
{
    (void)state;
    struct tier_prune prune = {0};
    char a[80], b[80], c[80];

    memset(a, 'a', 64);
    memset(b, 'b', 64);
    memset(c, 'c', 64);
    strcpy(a + 64, "/1048576-0");
    strcpy(b + 64, "/1048576-0");
    strcpy(c + 64, "/1048576-0");
    assert_int_equal(tier_prune_add(&prune, a, 100, 1000), 0);   /* a: 200 */
    a[73] = '1';                                               /* block 1 */
    assert_int_equal(tier_prune_add(&prune, a, 100, 5000), 0);   /* newest 5000 */
    assert_int_equal(tier_prune_add(&prune, b, 300, 2000), 0);   /* b: 300 */
    assert_int_equal(tier_prune_add(&prune, c, 50, 3000), 0);    /* c: 50 */
    const char *odd[] = {"README", "ABAB/1-0", "", "aaaa/1-0"};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(tier_prune_add(&prune, odd[i], 1, 0), 0);
    char not_block[80];
    memcpy(not_block, a, 64);
    strcpy(not_block + 64, "/lease");
    assert_int_equal(tier_prune_add(&prune, not_block, 1, 0), 0);
    assert_int_equal(prune.count, 3);
    assert_int_equal(prune.ignored, 5);

    /* older than 2500 s at 5500: b (2000) only; a's newest block is 5000 */
    tier_prune_choose(&prune, 5500, 2500, 0);
    assert_false(tier_prune_chosen(&prune, a));
    assert_true(tier_prune_chosen(&prune, b));
    assert_false(tier_prune_chosen(&prune, c));
    assert_false(tier_prune_chosen(&prune, "README"));
    assert_false(tier_prune_chosen(&prune, not_block));

    /* at most 200 bytes: the oldest go first (b 2000, c 3000), a stays */
    tier_prune_choose(&prune, 5500, 0, 200);
    assert_true(tier_prune_chosen(&prune, b));
    assert_true(tier_prune_chosen(&prune, c));
    assert_false(tier_prune_chosen(&prune, a));
    /* both: b by age, then nothing more (a + c = 250 > 240: c goes) */
    tier_prune_choose(&prune, 5500, 2500, 240);
    assert_true(tier_prune_chosen(&prune, b));
    assert_true(tier_prune_chosen(&prune, c));
    assert_false(tier_prune_chosen(&prune, a));
    tier_prune_choose(&prune, 5500, 0, 10000);
    assert_false(tier_prune_chosen(&prune, b));
    tier_prune_free(&prune);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_frames),
        cmocka_unit_test(test_prune_choice),
        cmocka_unit_test_setup_teardown(test_second_node_reads_from_the_tier,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_damaged_block_is_read_from_the_origin, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_damaged_block_alone_is_read_from_the_origin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_block_is_not_there_yet,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbled_answer_is_a_miss, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_timeout_of_a_busy_tier_is_not_a_skip,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_busy_timeout_of_a_tier_read_fetches_one_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_tier_is_skipped, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_skipped_tier_is_probed_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_second_node_waits_for_the_first,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_lease_read_back_where_conditions_are_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_lease_read_back_where_conditions_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_read_back_leases_agree_on_the_last_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_stops_at_another_nodes_lease,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_after_the_block_is_waited_for,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_run_stops_before_a_group_another_node_leases, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_busy_timeout_of_a_claim_fetches_one_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_that_ran_out_is_claimed_by_its_waiter,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired_lease_is_taken_over,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired_lease_is_taken_over_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_expired_lease_taken_over_without_if_match, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_renewal_never_writes_over_another_nodes_lease, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_stalled_lease_writes_skip_the_tier_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_tier_whose_writes_fail_is_probed_with_a_write, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_offer_dropped_by_a_full_queue_gives_the_lease_back, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_offer_whose_write_failed_gives_the_lease_back, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_failed_origin_fetch_gives_the_lease_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_writer_wins, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_server_without_conditional_writes,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_queue_drops_offers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_evicted_before_written, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
