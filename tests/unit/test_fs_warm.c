/*
 * test_fs_warm.c - the daemon's side of `s3cachefs warm` (fs_warm(),
 * reader_warm(), cache_version_cached_bytes(), cache_evict_key()) driven
 * as fuse_ops.c drives it, on the in-memory S3 of fake_s3.h: what each
 * request sends to the bucket is read in the fake's log.
 *
 * Each test gets a cache under /tmp (64 KiB blocks, so a file of a MiB is
 * 17 blocks), a journal, a fake bucket and an fs with 2 connections and
 * TTLs of an hour (nothing is revalidated behind a test's back).
 *
 * Covered: a warm fetches every block once, in GETs that never overlap,
 * and a second warm nothing; a warm after a partial read fetches only
 * the rest; reading a warmed file sends nothing; --check sends no
 * request and tells 0 then all; evict frees the version's bytes and the
 * next read fetches exactly them again; a warm and a reader of the same
 * file at once fetch each block once; an interrupted warm answers at
 * once (its GETs still held) and the file reads right afterwards; a
 * failed GET is an answer with its errno; a file larger than the cache
 * is fetched once, and the answer says how much stayed; a file being
 * written is left
 * alone ("staged"); directories are refused. Pins (a cache of 2 MiB):
 * a pinned file stays whole through reads of three times the cache while
 * a control file warmed the same way goes, also after the cache is
 * closed and opened again; pins stop at half the cache ("full", nothing
 * fetched); unpin and evict give the room back.
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
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "ctl/warm_text.h"
#include "fake_s3.h"
#include "fs/fs.h"
#include "unit_cache.h"
#include "writer/journal.h"

#define KIB (1u << 10)
#define MIB (1u << 20)
#define BLOCK (64u * KIB)
#define ROOT FUSE_ROOT_ID
#define TTL 3600.0

/* cmocka's assertions may only fail on the test's own thread */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            abort();                                                       \
        }                                                                  \
    } while (0)

#define ON(call, key) FAKE_S3_ON(FAKE_S3_CALL(call), key)

struct fixture {
    char dir[64];
    struct cache_conf cache_conf;
    struct cache *cache;
    struct journal *journal;
    struct s3_client *s3;
    struct fs *fs;
    unsigned char *data;
};

static void fs_start(struct fixture *f)
{
    struct fs_conf conf = {
        .root_key = "",
        .uid = 1000,
        .gid = 1000,
        .file_mode = 0644,
        .dir_mode = 0755,
        .attr_ttl = TTL,
        .dir_ttl = TTL,
        .read_ahead = 256 * KIB,
        .connections = 2,
        .cache = f->cache,
        .journal = f->journal,
        .multipart_threshold = MIB,
        .part_size = 5 * MIB,
    };
    assert_int_equal(fs_create(&conf, f->s3, &f->fs), 0);
}

static int setup_size(void **state, uint64_t cache_size)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char path[128], errbuf[256] = "";

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_fs_warm.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->cache_conf = (struct cache_conf){
        .dir = f->dir,
        .bucket = "test-bucket",
        .size_limit = cache_size,
        .block_size = BLOCK,
    };
    f->cache = unit_cache_open(&f->cache_conf);
    snprintf(path, sizeof(path), "%s/journal", f->dir);
    int err = journal_open(path, "http://fake.invalid/bucket", &f->journal, errbuf, sizeof(errbuf));
    if (err != 0)
        fail_msg("journal_open: %s (%s)", strerror(err), errbuf);
    assert_int_equal(fake_s3_create(&f->s3), 0);
    fs_start(f);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_size(state, 256ull * MIB);
}

/* A cache of 2 MiB: pins may take 1 MiB of it. */
static int setup_small(void **state)
{
    return setup_size(state, 2ull * MIB);
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    fake_s3_hold_clear(f->s3, 0);
    fake_s3_fail_clear(f->s3, 0);
    fs_destroy(&f->fs);
    journal_close(&f->journal);
    cache_close(&f->cache);
    s3_client_destroy(&f->s3);
    unit_remove_tree(f->dir);
    free(f->data);
    free(f);
    return 0;
}

/* ------------------------------------------------------------- helpers */

/* Another client puts KEY with LEN pattern bytes (kept in f->data). */
static const unsigned char *put(struct fixture *f, const char *key, size_t len)
{
    free(f->data);
    f->data = malloc(len ? len : 1);
    assert_non_null(f->data);
    for (size_t i = 0; i < len; i++)
        f->data[i] = (unsigned char)((i * 131 + (i >> 12) * 7) & 0xff);
    assert_int_equal(fake_s3_put(f->s3, key, f->data, len, NULL, NULL), 0);
    return f->data;
}

static fuse_ino_t lookup(struct fixture *f, const char *name)
{
    struct fs_entry entry;

    assert_int_equal(fs_lookup(f->fs, ROOT, name, &entry), 0);
    assert_int_not_equal(entry.ino, 0);
    return entry.ino;
}

static struct warm_text_answer ask(struct fixture *f, fuse_ino_t ino,
                                   enum fs_warm_op op)
{
    struct warm_text_answer answer;

    assert_int_equal(fs_warm(f->fs, ino, op, NULL, &answer), 0);
    return answer;
}

/* Bytes the GETs of KEY logged from entry FROM on asked for; every two
 * of them must not overlap (each block fetched once). */
static uint64_t get_bytes_since(struct fixture *f, const char *key, size_t from)
{
    struct { uint64_t offset, length; } ranges[256];
    size_t count = 0;
    uint64_t total = 0;

    for (size_t i = from; i < fake_s3_log_count(f->s3); i++) {
        struct fake_s3_request request;
        assert_int_equal(fake_s3_log_get(f->s3, i, &request), 0);
        if (request.call != FAKE_S3_GET || strcmp(request.key, key) != 0)
            continue;
        for (size_t k = 0; k < count; k++)
            assert_true(request.offset + request.length <= ranges[k].offset ||
                        ranges[k].offset + ranges[k].length <= request.offset);
        assert_true(count < 256);
        ranges[count].offset = request.offset;
        ranges[count].length = request.length;
        count++;
        total += request.length;
    }
    return total;
}

/* Read all of INO (LEN bytes) through an open handle and compare. */
static void read_back(struct fixture *f, fuse_ino_t ino, const unsigned char *data,
                      size_t len)
{
    struct fs_file *file = NULL;
    bool keep = false;
    char *buf = malloc(len + 1);

    assert_non_null(buf);
    assert_int_equal(fs_open(f->fs, ino, O_RDONLY, &file, &keep), 0);
    size_t done = 0;
    while (done < len) {
        size_t got = 0, want = len - done < 128 * KIB ? len - done : 128 * KIB;
        assert_int_equal(fs_read(f->fs, file, done, want, buf + done, &got), 0);
        assert_true(got > 0);
        done += got;
    }
    assert_memory_equal(buf, data, len);
    fs_release(f->fs, file);
    free(buf);
}

/* ------------------------------------------------------------- tests */

static void test_warm_fetches_every_block_once(void **state)
{
    struct fixture *f = *state;
    const size_t len = MIB + 100;
    const unsigned char *data = put(f, "model.bin", len);
    fuse_ino_t ino = lookup(f, "model.bin");
    size_t mark = fake_s3_log_count(f->s3);

    struct warm_text_answer answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.size, len);
    assert_int_equal(answer.before, 0);
    assert_int_equal(answer.fetched, len);
    assert_int_equal(answer.cached, len);
    assert_int_equal(get_bytes_since(f, "model.bin", mark), len);

    /* a second warm: everything is there */
    mark = fake_s3_log_count(f->s3);
    answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.before, len);
    assert_int_equal(answer.fetched, 0);
    assert_int_equal(fake_s3_log_count(f->s3), mark);

    /* and the job's reads are cache reads */
    read_back(f, ino, data, len);
    assert_int_equal(fake_s3_log_count(f->s3), mark);
}

static void test_warm_after_a_partial_read_fetches_the_rest(void **state)
{
    struct fixture *f = *state;
    const size_t len = 2 * MIB;
    put(f, "part.bin", len);
    fuse_ino_t ino = lookup(f, "part.bin");
    struct fs_file *file = NULL;
    bool keep = false;
    char buf[BLOCK];
    size_t got = 0;

    /* one block in the middle, read at random (no read-ahead) */
    assert_int_equal(fs_open(f->fs, ino, O_RDONLY, &file, &keep), 0);
    assert_int_equal(fs_read(f->fs, file, 10 * BLOCK, BLOCK, buf, &got), 0);
    fs_release(f->fs, file);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    struct warm_text_answer answer = ask(f, ino, FS_WARM_CHECK);
    uint64_t cached = answer.cached;
    assert_true(cached >= BLOCK && cached < len);

    size_t mark = fake_s3_log_count(f->s3);
    answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.before, cached);
    assert_int_equal(answer.fetched, len - cached);
    assert_int_equal(answer.cached, len);
    assert_int_equal(get_bytes_since(f, "part.bin", mark), len - cached);
}

static void test_check_sends_no_request(void **state)
{
    struct fixture *f = *state;
    const size_t len = 300 * KIB;
    put(f, "weights.bin", len);
    fuse_ino_t ino = lookup(f, "weights.bin");

    size_t mark = fake_s3_log_count(f->s3);
    struct warm_text_answer answer = ask(f, ino, FS_WARM_CHECK);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.size, len);
    assert_int_equal(answer.cached, 0);
    assert_int_equal(fake_s3_log_count(f->s3), mark);

    ask(f, ino, FS_WARM_FETCH);
    mark = fake_s3_log_count(f->s3);
    answer = ask(f, ino, FS_WARM_CHECK);
    assert_int_equal(answer.cached, len);
    assert_int_equal(answer.fetched, 0);
    assert_int_equal(fake_s3_log_count(f->s3), mark);
}

static void test_evict_then_read_fetches_it_again(void **state)
{
    struct fixture *f = *state;
    const size_t len = 700 * KIB + 3;
    const unsigned char *data = put(f, "evict.bin", len);
    fuse_ino_t ino = lookup(f, "evict.bin");
    struct cache_stats stats;

    ask(f, ino, FS_WARM_FETCH);
    struct warm_text_answer answer = ask(f, ino, FS_WARM_EVICT);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.before, len);
    assert_int_equal(answer.freed, len);
    cache_get_stats(f->cache, &stats);
    assert_int_equal(stats.used_bytes, 0);
    assert_int_equal(ask(f, ino, FS_WARM_CHECK).cached, 0);
    /* nothing left to evict */
    assert_int_equal(ask(f, ino, FS_WARM_EVICT).freed, 0);

    size_t mark = fake_s3_log_count(f->s3);
    read_back(f, ino, data, len);
    assert_int_equal(get_bytes_since(f, "evict.bin", mark), len);
}

static void test_evict_of_an_open_file_keeps_it_readable(void **state)
{
    struct fixture *f = *state;
    const size_t len = 300 * KIB;
    const unsigned char *data = put(f, "open.bin", len);
    fuse_ino_t ino = lookup(f, "open.bin");
    struct fs_file *file = NULL;
    bool keep = false;
    char *buf = malloc(len);

    assert_non_null(buf);
    ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(fs_open(f->fs, ino, O_RDONLY, &file, &keep), 0);
    assert_int_equal(ask(f, ino, FS_WARM_EVICT).freed, len);
    size_t mark = fake_s3_log_count(f->s3);
    size_t done = 0;
    while (done < len) {
        size_t got = 0;
        assert_int_equal(fs_read(f->fs, file, done, len - done, buf + done, &got), 0);
        assert_true(got > 0);
        done += got;
    }
    assert_memory_equal(buf, data, len);
    assert_int_equal(get_bytes_since(f, "open.bin", mark), len);
    fs_release(f->fs, file);
    free(buf);
    /* what the handle fetched again is cached */
    assert_int_equal(ask(f, ino, FS_WARM_CHECK).cached, len);
}

struct warm_thread {
    pthread_t thread;
    struct fixture *f;
    fuse_ino_t ino;
    atomic_bool stop;
    int result;
    struct warm_text_answer answer;
};

static void *warm_main(void *arg)
{
    struct warm_thread *warm = arg;

    warm->result = fs_warm(warm->f->fs, warm->ino, FS_WARM_FETCH, &warm->stop,
                           &warm->answer);
    return NULL;
}

struct read_thread {
    pthread_t thread;
    struct fixture *f;
    fuse_ino_t ino;
    size_t from;                 /* reads [from, len) */
    size_t len;
    const unsigned char *data;
};

static void *read_main(void *arg)
{
    struct read_thread *reading = arg;
    struct fs_file *file = NULL;
    bool keep = false;
    char *buf = malloc(reading->len);

    CHECK(buf != NULL);
    CHECK(fs_open(reading->f->fs, reading->ino, O_RDONLY, &file, &keep) == 0);
    for (size_t done = reading->from; done < reading->len;) {
        size_t got = 0;
        CHECK(fs_read(reading->f->fs, file, done, 128 * KIB, buf + done, &got) == 0);
        CHECK(got > 0);
        done += got;
    }
    CHECK(memcmp(buf + reading->from, reading->data + reading->from,
                 reading->len - reading->from) == 0);
    fs_release(reading->f->fs, file);
    free(buf);
    return NULL;
}

static void test_warm_and_read_together_fetch_each_block_once(void **state)
{
    struct fixture *f = *state;
    const size_t len = 20 * MIB + 5;  /* 3 runs of 8 MiB, 2 at once */
    const unsigned char *data = put(f, "shared.bin", len);
    fuse_ino_t ino = lookup(f, "shared.bin");
    struct warm_thread warm = {.f = f, .ino = ino};
    /* the reader starts in the last run, which the warm reaches last */
    struct read_thread reading = {.f = f, .ino = ino, .from = len - 2 * MIB,
                                  .len = len, .data = data};
    unsigned rule = 0;

    atomic_init(&warm.stop, false);
    size_t mark = fake_s3_log_count(f->s3);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_GET, "shared.bin"), &rule), 0);
    assert_int_equal(pthread_create(&reading.thread, NULL, read_main, &reading), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    assert_int_equal(pthread_create(&warm.thread, NULL, warm_main, &warm), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 3), 0);
    /* let them race: release the held GETs one at a time as they come */
    for (int i = 0; i < 200 && fake_s3_held(f->s3, rule) > 0; i++)
        fake_s3_release(f->s3, rule, i % 2 == 1, NULL);
    fake_s3_hold_clear(f->s3, rule);
    pthread_join(warm.thread, NULL);
    pthread_join(reading.thread, NULL);
    assert_int_equal(warm.result, 0);
    assert_int_equal(warm.answer.status, WARM_TEXT_DONE);
    assert_int_equal(warm.answer.cached, len);
    /* each block once, whoever fetched it */
    assert_int_equal(get_bytes_since(f, "shared.bin", mark), len);
    assert_true(warm.answer.fetched <= len);
}

static void test_interrupted_warm_answers_at_once(void **state)
{
    struct fixture *f = *state;
    const size_t len = 24 * MIB;   /* 3 GETs of 8 MiB: 2 at once */
    const unsigned char *data = put(f, "big.bin", len);
    fuse_ino_t ino = lookup(f, "big.bin");
    struct warm_thread warm = {.f = f, .ino = ino};
    unsigned rule = 0;

    atomic_init(&warm.stop, false);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_GET, "big.bin"), &rule), 0);
    assert_int_equal(pthread_create(&warm.thread, NULL, warm_main, &warm), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 2), 0);
    atomic_store(&warm.stop, true);
    /* it answers while its GETs are still held */
    pthread_join(warm.thread, NULL);
    assert_true(fake_s3_held(f->s3, rule) >= 2);
    assert_int_equal(warm.result, 0);
    assert_int_equal(warm.answer.status, WARM_TEXT_INTERRUPTED);
    assert_true(warm.answer.cached < len);
    fake_s3_hold_clear(f->s3, rule);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    read_back(f, ino, data, len);
}

static void test_failed_get_is_an_answer(void **state)
{
    struct fixture *f = *state;
    const size_t len = 200 * KIB;
    put(f, "broken.bin", len);
    fuse_ino_t ino = lookup(f, "broken.bin");
    unsigned rule = 0;

    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_GET, "broken.bin"),
                                  FAKE_S3_ALWAYS, EIO, false, &rule), 0);
    struct warm_text_answer answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_FAILED);
    assert_int_equal(answer.error, EIO);
    assert_int_equal(answer.cached, 0);
    fake_s3_fail_clear(f->s3, rule);
    answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.cached, len);
}

static void test_file_being_written_is_left_alone(void **state)
{
    struct fixture *f = *state;
    struct fs_entry entry;
    struct fs_file *file = NULL;
    char bytes[1000];

    memset(bytes, 'w', sizeof(bytes));
    assert_int_equal(fs_create_file(f->fs, ROOT, "new.bin", 0644,
                                     O_WRONLY | O_CREAT, 1000, 1000, &entry,
                                     &file), 0);
    assert_int_equal(fs_write(f->fs, file, 0, bytes, sizeof(bytes)), 0);
    size_t mark = fake_s3_log_count(f->s3);
    struct warm_text_answer answer = ask(f, entry.ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_STAGED);
    answer = ask(f, entry.ino, FS_WARM_EVICT);
    assert_int_equal(answer.status, WARM_TEXT_STAGED);
    assert_int_equal(answer.freed, 0);
    assert_int_equal(fake_s3_log_count(f->s3), mark);
    assert_int_equal(fs_flush(f->fs, file), 0);
    fs_release(f->fs, file);
}

static void test_directories_are_refused(void **state)
{
    struct fixture *f = *state;
    struct warm_text_answer answer;

    assert_int_equal(fs_warm(f->fs, ROOT, FS_WARM_FETCH, NULL, &answer), EISDIR);
    assert_int_equal(fs_warm(f->fs, 12345, FS_WARM_CHECK, NULL, &answer), ENOENT);
}

/* Put LEN pattern bytes at KEY without keeping them (another client). */
static void put_other(struct fixture *f, const char *key, size_t len, unsigned seed)
{
    unsigned char *bytes = malloc(len);

    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] = (unsigned char)(i * 7 + seed);
    assert_int_equal(fake_s3_put(f->s3, key, bytes, len, NULL, NULL), 0);
    free(bytes);
}

#define DATASET_FILES 12

/* 6 MiB of other files in the bucket (before the first lookup: the
 * root's listing is kept for an hour). */
static void put_dataset(struct fixture *f)
{
    for (unsigned i = 0; i < DATASET_FILES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "dataset-%u.bin", i);
        put_other(f, name, 512 * KIB, i);
    }
}

/* Warm the dataset through the cache: the eviction pressure of a job
 * reading three times the cache. */
static void pressure(struct fixture *f)
{
    for (unsigned i = 0; i < DATASET_FILES; i++) {
        char name[32];
        snprintf(name, sizeof(name), "dataset-%u.bin", i);
        fuse_ino_t ino = lookup(f, name);
        struct warm_text_answer answer = ask(f, ino, FS_WARM_FETCH);
        assert_int_equal(answer.status, WARM_TEXT_DONE);
    }
}

static void test_pinned_version_survives_eviction_pressure(void **state)
{
    struct fixture *f = *state;
    const size_t len = 768 * KIB + 10;
    const unsigned char *data = put(f, "weights.bin", len);
    put_other(f, "unpinned.bin", 300 * KIB, 99);
    put_dataset(f);
    fuse_ino_t weights = lookup(f, "weights.bin");
    fuse_ino_t unpinned = lookup(f, "unpinned.bin");

    struct warm_text_answer answer = ask(f, weights, FS_WARM_PIN);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_true(answer.pinned);
    assert_int_equal(answer.fetched, len);
    assert_int_equal(answer.cached, len);
    assert_int_equal(answer.pin_max, MIB);
    assert_true(answer.pin_used >= len && answer.pin_used < len + 4 * KIB);
    assert_int_equal(ask(f, unpinned, FS_WARM_FETCH).cached, 300 * KIB);

    pressure(f);
    answer = ask(f, weights, FS_WARM_CHECK);
    assert_int_equal(answer.cached, len);
    assert_true(answer.pinned);
    /* the control, warmed the same way and not pinned, was evicted */
    assert_true(ask(f, unpinned, FS_WARM_CHECK).cached < 300 * KIB);
    size_t mark = fake_s3_log_count(f->s3);
    read_back(f, weights, data, len);
    assert_int_equal(get_bytes_since(f, "weights.bin", mark), 0);
}

static void test_file_larger_than_the_cache_is_fetched_once(void **state)
{
    struct fixture *f = *state;
    const size_t len = 3 * MIB;
    put(f, "huge.bin", len);
    fuse_ino_t ino = lookup(f, "huge.bin");

    size_t mark = fake_s3_log_count(f->s3);
    struct warm_text_answer answer = ask(f, ino, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.fetched, len);
    assert_true(answer.cached <= 2 * MIB);      /* what stayed: it tells */
    assert_int_equal(get_bytes_since(f, "huge.bin", mark), len);
}

static void test_pin_is_kept_across_a_remount(void **state)
{
    struct fixture *f = *state;
    const size_t len = 512 * KIB;
    const unsigned char *data = put(f, "kept.bin", len);
    put_dataset(f);
    fuse_ino_t ino = lookup(f, "kept.bin");

    assert_true(ask(f, ino, FS_WARM_PIN).pinned);
    fs_destroy(&f->fs);
    cache_close(&f->cache);
    f->cache = unit_cache_open(&f->cache_conf);
    fs_start(f);
    ino = lookup(f, "kept.bin");
    struct warm_text_answer answer = ask(f, ino, FS_WARM_CHECK);
    assert_true(answer.pinned);
    assert_int_equal(answer.cached, len);
    pressure(f);
    assert_int_equal(ask(f, ino, FS_WARM_CHECK).cached, len);
    size_t mark = fake_s3_log_count(f->s3);
    read_back(f, ino, data, len);
    assert_int_equal(get_bytes_since(f, "kept.bin", mark), 0);

    /* the disk full (min_free beyond what it has): a fill evicts every
     * block it can and reads go around the cache, but pinned blocks
     * stay */
    fs_destroy(&f->fs);
    cache_close(&f->cache);
    f->cache_conf.min_free_bytes = UINT64_MAX / 4;
    f->cache = unit_cache_open(&f->cache_conf);
    fs_start(f);
    ino = lookup(f, "kept.bin");
    struct cache_stats stats;
    cache_get_stats(f->cache, &stats);
    assert_true(stats.used_bytes > len);     /* the dataset's last blocks */
    fuse_ino_t other = lookup(f, "dataset-0.bin");
    answer = ask(f, other, FS_WARM_FETCH);
    assert_int_equal(answer.status, WARM_TEXT_FAILED);
    assert_int_equal(answer.error, ENOSPC);
    cache_get_stats(f->cache, &stats);
    assert_int_equal(stats.used_bytes, (len + 4 * KIB - 1) / (4 * KIB) * (4 * KIB));
    assert_int_equal(ask(f, ino, FS_WARM_CHECK).cached, len);
}

/* What the counters say is pinned (cache_pinned_bytes). */
static uint64_t pinned_bytes(struct fixture *f)
{
    struct cache_stats stats;

    cache_get_stats(f->cache, &stats);
    return stats.pinned_bytes;
}

static void test_pins_stay_within_half_the_cache(void **state)
{
    struct fixture *f = *state;
    put_other(f, "first.bin", 640 * KIB, 1);
    put_other(f, "second.bin", 512 * KIB, 2);
    put_dataset(f);
    fuse_ino_t first = lookup(f, "first.bin"), second = lookup(f, "second.bin");

    assert_int_equal(ask(f, first, FS_WARM_PIN).status, WARM_TEXT_DONE);
    size_t mark = fake_s3_log_count(f->s3);
    struct warm_text_answer answer = ask(f, second, FS_WARM_PIN);
    assert_int_equal(answer.status, WARM_TEXT_FULL);
    assert_false(answer.pinned);
    assert_int_equal(answer.fetched, 0);
    assert_int_equal(answer.pin_used, 640 * KIB);
    assert_int_equal(pinned_bytes(f), 640 * KIB);
    assert_int_equal(get_bytes_since(f, "second.bin", mark), 0);
    assert_false(ask(f, second, FS_WARM_CHECK).pinned);

    /* an unpin gives the room back (and a second unpin is harmless) */
    answer = ask(f, first, FS_WARM_UNPIN);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.pin_used, 0);
    assert_int_equal(ask(f, first, FS_WARM_UNPIN).pin_used, 0);
    assert_int_equal(pinned_bytes(f), 0);
    assert_false(ask(f, first, FS_WARM_CHECK).pinned);
    answer = ask(f, second, FS_WARM_PIN);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.pin_used, 512 * KIB);
    /* the unpinned one is evictable again */
    pressure(f);
    assert_true(ask(f, first, FS_WARM_CHECK).cached < 640 * KIB);
    assert_int_equal(ask(f, second, FS_WARM_CHECK).cached, 512 * KIB);
    /* evicting a pinned file ends its pin */
    answer = ask(f, second, FS_WARM_EVICT);
    assert_int_equal(answer.freed, 512 * KIB);
    assert_int_equal(pinned_bytes(f), 0);
    answer = ask(f, first, FS_WARM_PIN);
    assert_int_equal(answer.status, WARM_TEXT_DONE);
    assert_int_equal(answer.pin_used, 640 * KIB);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_warm_fetches_every_block_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_warm_after_a_partial_read_fetches_the_rest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_sends_no_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_evict_then_read_fetches_it_again,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_evict_of_an_open_file_keeps_it_readable, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_warm_and_read_together_fetch_each_block_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_warm_answers_at_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_get_is_an_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_file_being_written_is_left_alone,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_directories_are_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_pinned_version_survives_eviction_pressure, setup_small, teardown),
        cmocka_unit_test_setup_teardown(
            test_file_larger_than_the_cache_is_fetched_once, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_pin_is_kept_across_a_remount,
                                        setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_pins_stay_within_half_the_cache,
                                        setup_small, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
