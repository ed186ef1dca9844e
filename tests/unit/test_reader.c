/*
 * test_reader.c - the read path (reader.c over the block cache) on the
 * in-memory S3 of fake_s3.h.
 *
 * Each test gets a cache directory under /tmp with 64 KiB blocks, a fake
 * bucket, a pool of 2 workers for read-ahead and a reader whose window
 * grows to 1 MiB (16 blocks) and whose GETs carry at most 256 KiB (4
 * blocks). Objects are put behind the reader's back (another client);
 * the reader is driven as fs.c drives it: reader_open() with the ETag
 * and size a lookup found, reader_read(), reader_close(). GET bodies
 * reach the cache in pieces of FAKE_S3_SINK_CHUNK bytes, which no block
 * boundary matches.
 *
 * Covered: a cold sequential read fetches every block exactly once (the
 * GETs' ranges tile the object, each with If-Match), in fewer GETs than
 * blocks, while its read-ahead window doubles from 4 blocks to 16;
 * random reads fetch exactly the block each touches and nothing ahead;
 * a second read, from another open, another reader or after the cache
 * is reopened, sends no GET; a lookup's whole-object fetch is one GET
 * and the read after it none; a version change behind the reader's back
 * (the next GET with If-Match gets ESTALE, also read-ahead GETs in
 * flight) never returns or caches bytes of the new version for the old
 * one; a GET whose answer breaks off leaves no partial block behind;
 * reads into a pipe (reader_read_pipe) give the same bytes, verified;
 * a block whose pages a pipe holds for a read not yet answered stays in
 * its data file until the answer has gone (the fill of a later block of
 * the same read evicts another block; an eviction of the key, a new
 * version or the key forgotten in between leave the pipe's bytes
 * whole), also on a tmpfs mounted with huge=always, where a punched
 * block of a large folio reads as zeros, where the test can mount one.
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
#include <time.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/magic.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/workers.h"
#include "cache/cache.h"
#include "fake_s3.h"
#include "reader/reader.h"
#include "s3/s3.h"
#include "unit_cache.h"

#define KIB (1u << 10)
#define BLOCK (64u * KIB)
#define READ_AHEAD (1u << 20)         /* 16 blocks */
#define MAX_REQUEST (256u * KIB)      /* 4 blocks */
#define INITIAL_WINDOW 4              /* blocks, as reader.h says */
#define MAX_GETS 256

#define ON(call, key) FAKE_S3_ON(FAKE_S3_CALL(call), key)

struct fixture {
    char dir[64];
    bool mounted;                 /* a tmpfs of the test's own on dir */
    struct cache_conf cache_conf;
    struct cache *cache;
    struct workers *workers;
    struct s3_client *s3;
    struct reader *reader;
};

/* A GET as the log has it. */
struct get {
    uint64_t offset, length;
    char condition[S3_ETAG_MAX];
    int result;
};

/* ------------------------------------------------------------ fixture */

static void reader_start(struct fixture *f)
{
    struct reader_conf conf = {
        .s3 = f->s3,
        .cache = f->cache,
        .workers = f->workers,
        .read_ahead = READ_AHEAD,
        .max_request = MAX_REQUEST,
    };
    assert_int_equal(reader_create(&conf, &f->reader), 0);
}

/* Stop and free the reader as fs_destroy() does: queued read-ahead ends,
 * the pool runs what is left, then the reader goes. */
static void reader_stop_all(struct fixture *f)
{
    if (f->reader != NULL)
        reader_stop(f->reader);
    workers_destroy(&f->workers);
    reader_destroy(&f->reader);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_reader.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->cache_conf = (struct cache_conf){
        .dir = f->dir,
        .bucket = "test-bucket",
        .size_limit = 64ull << 20,
        .block_size = BLOCK,
    };
    f->cache = unit_cache_open(&f->cache_conf);
    assert_int_equal(workers_create(2, &f->workers), 0);
    assert_int_equal(fake_s3_create(&f->s3), 0);
    reader_start(f);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    fake_s3_hold_clear(f->s3, 0);
    fake_s3_fail_clear(f->s3, 0);
    reader_stop_all(f);
    cache_close(&f->cache);
    s3_client_destroy(&f->s3);
    if (f->mounted)
        umount2(f->dir, MNT_DETACH);
    unit_remove_tree(f->dir);
    free(f);
    return 0;
}

/* ------------------------------------------------------------- helpers */

/* LEN bytes of version SEED of an object. */
static unsigned char *pattern(size_t len, unsigned seed)
{
    unsigned char *bytes = malloc(len ? len : 1);

    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] = (unsigned char)((i * 251 + seed * 97 + (i >> 16)) & 0xff);
    return bytes;
}

/* Put LEN bytes of version SEED as KEY (another client); the bytes, and
 * the ETag into ETAG. */
static unsigned char *object_put(struct fixture *f, const char *key,
                                 size_t len, unsigned seed, char *etag)
{
    unsigned char *bytes = pattern(len, seed);

    assert_int_equal(fake_s3_put(f->s3, key, bytes, len, NULL, etag), 0);
    return bytes;
}

/* The GETs of KEY logged from index FROM on, into GETS (MAX_GETS), in
 * arrival order; how many. */
static size_t gets_of(struct fixture *f, const char *key, size_t from,
                      struct get *gets)
{
    size_t count = 0;
    long at = (long)from - 1;

    while ((at = fake_s3_log_find(f->s3, (size_t)(at + 1),
                                  ON(FAKE_S3_GET, key))) >= 0) {
        struct fake_s3_request request;
        assert_int_equal(fake_s3_log_get(f->s3, (size_t)at, &request), 0);
        assert_true(count < MAX_GETS);
        gets[count] = (struct get){request.offset, request.length, "",
                                   request.result};
        snprintf(gets[count].condition, S3_ETAG_MAX, "%s",
                 request.condition ? request.condition : "");
        count++;
    }
    return count;
}

static int compare_gets(const void *a, const void *b)
{
    const struct get *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Whether the ranges of GETS (COUNT, reordered) cover [0, SIZE) exactly
 * once, each starting on a block and at most MAX_REQUEST long. */
static bool gets_tile(struct get *gets, size_t count, uint64_t size)
{
    uint64_t at = 0;

    qsort(gets, count, sizeof(*gets), compare_gets);
    for (size_t i = 0; i < count; i++) {
        if (gets[i].offset != at || gets[i].offset % BLOCK != 0 ||
            gets[i].length == 0 || gets[i].length > MAX_REQUEST)
            return false;
        at += gets[i].length;
    }
    return at == size;
}

static struct reader_stats reader_stats_of(struct fixture *f)
{
    struct reader_stats stats;

    reader_get_stats(f->reader, &stats);
    return stats;
}

/* Read [OFFSET, OFFSET + LEN) of FILE and compare it with EXPECTED (the
 * whole object). Returns reader_read's errno. */
static int read_check(struct reader_file *file, uint64_t offset, size_t len,
                      const unsigned char *expected)
{
    char *buf = malloc(len);
    size_t got = 0;

    assert_non_null(buf);
    int err = reader_read(file, offset, len, buf, &got);
    if (err == 0) {
        assert_int_equal(got, len);
        assert_memory_equal(buf, expected + offset, len);
    }
    free(buf);
    return err;
}

static void open_file(struct fixture *f, const char *key, const char *etag,
                      uint64_t size, struct reader_file **file)
{
    assert_int_equal(reader_open(f->reader, key, etag, size, file), 0);
    assert_non_null(*file);
}

/* ------------------------------------------------------------- tests */

static void test_cold_sequential_read(void **state)
{
    struct fixture *f = *state;
    const size_t blocks = 33;
    const size_t size = (blocks - 1) * BLOCK + 1000; /* a short last block */
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "seq", size, 1, etag);
    struct get gets[MAX_GETS];
    struct reader_file *file = NULL;

    open_file(f, "seq", etag, size, &file);
    for (size_t block = 0; block < blocks; block++) {
        uint64_t offset = block * BLOCK;
        size_t len = size - offset < BLOCK ? size - offset : BLOCK;
        assert_int_equal(read_check(file, offset, len, bytes), 0);
        /* blocks scheduled ahead of the reader: the window doubles from
         * 4 blocks to 16 (1 MiB), and never goes further */
        uint64_t ahead = 2 + reader_stats_of(f).blocks_prefetched - (block + 1);
        if (block == 0)
            assert_int_equal(reader_stats_of(f).blocks_prefetched, 0);
        else if (block <= 3)
            assert_int_equal(ahead, INITIAL_WINDOW << (block - 1));
        else if (2 + reader_stats_of(f).blocks_prefetched < blocks)
            assert_true(ahead >= 8 && ahead <= 16);
    }
    assert_int_equal(read_check(file, size - 1, 1, bytes), 0);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);

    /* every block fetched exactly once, with If-Match, in large GETs */
    size_t count = gets_of(f, "seq", 0, gets);
    for (size_t i = 0; i < count; i++) {
        assert_string_equal(gets[i].condition, etag);
        assert_int_equal(gets[i].result, 0);
    }
    assert_true(gets_tile(gets, count, size));
    assert_true(count < blocks / 2);
    struct s3_stats s3_stats;
    s3_client_stats(f->s3, &s3_stats);
    assert_int_equal(s3_stats.bytes_received, size);
    assert_int_equal(s3_stats.requests[S3_OP_GET], count);
    struct reader_stats stats = reader_stats_of(f);
    assert_int_equal(stats.bytes_read, size + 1);
    assert_int_equal(stats.blocks_prefetched, blocks - 2);
    assert_int_equal(stats.direct_bytes, 0);
    reader_close(&file);
    free(bytes);
}

static void test_random_reads_fetch_one_block(void **state)
{
    struct fixture *f = *state;
    const size_t size = 32 * BLOCK + 100;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "rnd", size, 2, etag);
    static const unsigned touched[] = {20, 3, 17, 9, 32, 25};
    struct get gets[MAX_GETS];
    struct reader_file *file = NULL;

    open_file(f, "rnd", etag, size, &file);
    for (size_t i = 0; i < sizeof(touched) / sizeof(touched[0]); i++) {
        uint64_t offset = touched[i] * (uint64_t)BLOCK + 50;
        assert_int_equal(read_check(file, offset, 40, bytes), 0);
        /* exactly the block read, whole, and nothing ahead */
        assert_int_equal(gets_of(f, "rnd", 0, gets), i + 1);
        assert_int_equal(gets[i].offset, touched[i] * (uint64_t)BLOCK);
        assert_int_equal(gets[i].length,
                         touched[i] == 32 ? 100 : BLOCK);
        assert_int_equal(reader_stats_of(f).blocks_prefetched, 0);
    }
    /* a read across two blocks, one of them cached: one GET */
    assert_int_equal(read_check(file, 10 * BLOCK - 10, 20, bytes), 0);
    assert_int_equal(gets_of(f, "rnd", 0, gets), 7);
    assert_int_equal(gets[6].offset, 10 * (uint64_t)BLOCK);
    /* again: all cached */
    assert_int_equal(read_check(file, 10 * BLOCK - 10, 20, bytes), 0);
    assert_int_equal(read_check(file, 20 * BLOCK, 10, bytes), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, NULL)), 7);
    reader_close(&file);
    free(bytes);
}

/* A reader faulting in a file at scattered places (mmap of weights): once
 * it has fetched 8 blocks out of order (one in 128 of the file's), the
 * rest of the file comes behind its reads, in file order, in runs of
 * MAX_REQUEST, each block once; its further reads are served from the
 * cache; what it fetched is not counted as cache hits. */
static void test_scattered_reader_gets_the_rest(void **state)
{
    struct fixture *f = *state;
    const size_t blocks = 200;
    const size_t size = (blocks - 1) * BLOCK + 321;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "weights", size, 7, etag);
    static const unsigned touched[] = {150, 7, 99, 180, 42, 3, 120, 61};
    struct get gets[MAX_GETS];
    struct reader_file *file = NULL;

    open_file(f, "weights", etag, size, &file);
    for (size_t i = 0; i < sizeof(touched) / sizeof(touched[0]); i++) {
        uint64_t offset = touched[i] * (uint64_t)BLOCK + 100;
        assert_int_equal(read_check(file, offset, 4096, bytes), 0);
        if (i < 7)   /* not yet: one block per read */
            assert_int_equal(gets_of(f, "weights", 0, gets), i + 1);
    }
    /* the sweep has begun: the reader goes on at scattered places (a
     * read now and then, as a loader between tensors) until every block
     * is in; each read is answered right */
    struct s3_stats s3_stats = {0};
    double until = clock_monotonic_seconds() + 20;
    for (unsigned round = 0; s3_stats.bytes_received < size; round++) {
        assert_true(clock_monotonic_seconds() < until);
        uint64_t block = (round * 37) % blocks;
        assert_int_equal(read_check(file, block * BLOCK, 10, bytes), 0);
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
        s3_client_stats(f->s3, &s3_stats);
    }
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    /* every block once: the faults and the sweep's runs tile the file */
    size_t count = gets_of(f, "weights", 0, gets);
    assert_true(gets_tile(gets, count, size));
    /* most of it by the sweep, in runs */
    assert_true(reader_stats_of(f).blocks_prefetched >= blocks / 2);
    /* now all cached: no request for any block */
    size_t before = fake_s3_count(f->s3, ON(FAKE_S3_GET, NULL));
    for (size_t block = 0; block < blocks; block += 13)
        assert_int_equal(read_check(file, block * BLOCK, 10, bytes), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, NULL)), before);
    /* what this open file fetched is not a cache hit */
    assert_int_equal(reader_stats_of(f).hit_bytes, 0);
    reader_close(&file);
    free(bytes);
}

/* Reading a few scattered blocks of a file (sampling it: fewer than 8)
 * fetches those blocks only; so does reading many of a file larger than
 * a quarter of the cache (16 MiB here). */
static void test_sampled_file_is_not_swept(void **state)
{
    struct fixture *f = *state;
    const size_t blocks = 250;
    const size_t size = blocks * BLOCK;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "sampled", size, 8, etag);
    struct reader_file *file = NULL;

    open_file(f, "sampled", etag, size, &file);
    for (unsigned i = 0; i < 7; i++) {
        uint64_t block = (i * 71 + 5) % blocks;
        assert_int_equal(read_check(file, block * BLOCK, 100, bytes), 0);
    }
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, "sampled")), 7);
    reader_close(&file);
    free(bytes);

    const size_t big_blocks = 300;             /* 18.75 MiB > 16 MiB */
    const size_t big_size = big_blocks * BLOCK;
    bytes = object_put(f, "big", big_size, 9, etag);
    open_file(f, "big", etag, big_size, &file);
    for (unsigned i = 0; i < 20; i++) {
        uint64_t block = (i * 97 + 5) % big_blocks;
        assert_int_equal(read_check(file, block * BLOCK, 100, bytes), 0);
    }
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, "big")), 20);
    assert_int_equal(reader_stats_of(f).blocks_prefetched, 0);
    reader_close(&file);
    free(bytes);
}

static void test_second_read_from_the_cache(void **state)
{
    struct fixture *f = *state;
    const size_t size = 20 * BLOCK + 5;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "warm", size, 3, etag);
    struct reader_file *file = NULL;

    open_file(f, "warm", etag, size, &file);
    assert_int_equal(read_check(file, 0, size, bytes), 0);
    reader_close(&file);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    unsigned cold = fake_s3_count(f->s3, NULL);
    assert_true(cold > 0);
    uint64_t hits = reader_stats_of(f).hit_bytes;

    /* another open of the same version: no request at all */
    open_file(f, "warm", etag, size, &file);
    for (uint64_t at = 0; at < size; at += 128 * KIB) {
        size_t len = size - at < 128 * KIB ? size - at : 128 * KIB;
        assert_int_equal(read_check(file, at, len, bytes), 0);
    }
    reader_close(&file);
    assert_int_equal(fake_s3_count(f->s3, NULL), cold);
    assert_int_equal(reader_stats_of(f).hit_bytes - hits, size);

    /* nor after the cache is closed and opened again (a remount) */
    reader_stop_all(f);
    cache_close(&f->cache);
    f->cache = unit_cache_open(&f->cache_conf);
    assert_int_equal(workers_create(2, &f->workers), 0);
    reader_start(f);
    open_file(f, "warm", etag, size, &file);
    assert_int_equal(read_check(file, 0, size, bytes), 0);
    reader_close(&file);
    assert_int_equal(fake_s3_count(f->s3, NULL), cold);

    /* a lookup's whole-object fetch: one GET; the read after it none */
    char small_etag[S3_ETAG_MAX];
    unsigned char *small = object_put(f, "small", 3 * BLOCK, 4, small_etag);
    struct s3_object_info info;
    assert_int_equal(reader_fetch_whole(f->reader, "small", small_etag,
                                        3 * BLOCK, &info), 0);
    assert_string_equal(info.etag, small_etag);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, "small")), 1);
    assert_int_equal(reader_fetch_whole(f->reader, "small", small_etag,
                                        3 * BLOCK, &info), EEXIST);
    open_file(f, "small", small_etag, 3 * BLOCK, &file);
    assert_int_equal(read_check(file, 0, 3 * BLOCK, small), 0);
    reader_close(&file);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, "small")), 1);
    free(small);
    free(bytes);
}

/* [OFFSET, OFFSET + LEN) of FILE through reader_read_pipe() into PIPE,
 * read back and compared with EXPECTED. Returns its errno. */
static int pipe_read_check(struct reader_file *file, const int pipe_fds[2],
                           uint64_t offset, size_t len,
                           const unsigned char *expected)
{
    char *buf = malloc(len);
    struct cache_holds holds = {0};
    size_t got = 0, drained = 0;

    assert_non_null(buf);
    int err = reader_read_pipe(file, offset, len, pipe_fds[1], &holds, &got);
    if (err == 0) {
        assert_int_equal(got, len);
        while (drained < got) {
            ssize_t n = read(pipe_fds[0], buf + drained, got - drained);
            assert_true(n > 0);
            drained += (size_t)n;
        }
        assert_memory_equal(buf, expected + offset, len);
    }
    cache_holds_release(&holds);
    free(buf);
    return err;
}

/* The one data file of the cache (tests with one version cached). */
static int data_file_open(struct fixture *f)
{
    char pattern_[128];
    glob_t found;
    int fd = -1;

    snprintf(pattern_, sizeof(pattern_), "%s/data/*/*", f->dir);
    if (glob(pattern_, 0, NULL, &found) == 0) {
        if (found.gl_pathc == 1)
            fd = open(found.gl_pathv[0], O_RDWR);
        globfree(&found);
    }
    return fd;
}

/* reader_read_pipe() gives the bytes reader_read() gives, from the cache
 * without a GET once cached, checks them as it does (a block damaged on
 * disk is fetched again, never passed on; bytes just fetched, still in
 * dirty pages, are not hashed twice), and says ENOBUFS when the pipe
 * cannot take the read. Skipped on tmpfs. */
static void test_pipe_read(void **state)
{
    struct fixture *f = *state;
    const size_t size = 20 * BLOCK + 5;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "piped", size, 5, etag);
    struct reader_file *file = NULL;
    struct statfs fs;
    int fds[2];

    /* tmpfs never writes its pages back: damage could not reach a disk */
    assert_int_equal(statfs(f->dir, &fs), 0);
    if (fs.f_type == TMPFS_MAGIC)
        skip();
    assert_int_equal(pipe(fds), 0);
    assert_true(fcntl(fds[1], F_SETPIPE_SZ, 1 << 20) >= (1 << 20));
    open_file(f, "piped", etag, size, &file);
    /* cold, sequential, in reads that straddle blocks: every byte is one
     * this process just wrote, spliced without a second hash where the
     * kernel says its pages are still dirty (cachestat(2)) */
    struct cache_stats before, after;
    cache_get_stats(f->cache, &before);
    for (uint64_t at = 0; at < size; at += 96 * KIB) {
        size_t len = size - at < 96 * KIB ? size - at : 96 * KIB;
        assert_int_equal(pipe_read_check(file, fds, at, len, bytes), 0);
    }
    cache_get_stats(f->cache, &after);
    /* at least the blocks whose pages are dirty still (a sync anyone
     * runs may have cleaned others since) */
    int fd = data_file_open(f);
    uint64_t surely = 0;
    assert_true(fd >= 0);
    for (uint64_t at = 0; at < size; at += BLOCK) {
        uint64_t len = size - at < BLOCK ? size - at : BLOCK;
        if (unit_pages_dirty(fd, at, len))
            surely += len;
    }
    close(fd);
    uint64_t unhashed = after.unhashed_bytes - before.unhashed_bytes;
    assert_true(unhashed >= surely &&
                unhashed <= (unit_kernel_has_cachestat() ? size : 0));
    if (unit_kernel_has_cachestat() && surely == 0)
        print_message("  (the pages were written back meanwhile)\n");
    reader_close(&file);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    unsigned cold = fake_s3_count(f->s3, NULL);

    /* warm: no request; past the end: nothing */
    open_file(f, "piped", etag, size, &file);
    assert_int_equal(pipe_read_check(file, fds, 0, 10 * BLOCK, bytes), 0);
    assert_int_equal(pipe_read_check(file, fds, 10 * BLOCK, size - 10 * BLOCK,
                                     bytes), 0);
    assert_int_equal(pipe_read_check(file, fds, 3 * BLOCK + 7, 1000, bytes), 0);
    size_t got = 1;
    struct cache_holds holds = {0};
    assert_int_equal(reader_read_pipe(file, size, 100, fds[1], &holds, &got), 0);
    assert_int_equal(got, 0);
    assert_int_equal(holds.count, 0);
    assert_int_equal(fake_s3_count(f->s3, NULL), cold);

    /* a byte flipped on disk in block 3, part of block 5 zeroed (written
     * back and dropped from memory, so that reads come from the disk: a
     * page still as this process wrote it is not hashed again): a pipe
     * read that meets one says EAGAIN (its bytes were in the pipe before
     * the check: the caller discards the pipe and reads again, as
     * fuse_ops.c does through reader_read()), the block is dropped and
     * the read again fetches it; never a wrong byte */
    fd = data_file_open(f);
    assert_true(fd >= 0);
    char byte, zeros[512] = {0};
    assert_int_equal(pread(fd, &byte, 1, 3 * BLOCK + 100), 1);
    byte ^= 0x5a;
    assert_int_equal(pwrite(fd, &byte, 1, 3 * BLOCK + 100), 1);
    assert_int_equal(pwrite(fd, zeros, sizeof(zeros), 5 * BLOCK + 4096),
                     (ssize_t)sizeof(zeros));
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    cache_get_stats(f->cache, &before);
    assert_int_equal(reader_read_pipe(file, 2 * BLOCK, 3 * BLOCK, fds[1], &holds,
                                      &got), EAGAIN);
    assert_int_equal(reader_read_pipe(file, 5 * BLOCK, BLOCK, fds[1], &holds,
                                      &got), EAGAIN);
    cache_get_stats(f->cache, &after);
    assert_int_equal(after.corrupt_blocks - before.corrupt_blocks, 2);
    assert_int_equal(read_check(file, 2 * BLOCK, 4 * BLOCK, bytes), 0);
    assert_int_equal(fake_s3_count(f->s3, NULL), cold + 2);
    close(fds[0]);
    close(fds[1]);
    cache_holds_release(&holds);
    assert_int_equal(pipe(fds), 0);
    assert_true(fcntl(fds[1], F_SETPIPE_SZ, 1 << 20) >= (1 << 20));
    assert_int_equal(pipe_read_check(file, fds, 2 * BLOCK, 4 * BLOCK, bytes), 0);
    assert_int_equal(fake_s3_count(f->s3, NULL), cold + 2);

    /* more than the pipe holds: ENOBUFS (the caller reads into memory),
     * also when the first block fitted: its bytes count as hits once,
     * when the read into memory answers */
    int small[2];
    assert_int_equal(pipe(small), 0);
    assert_true(fcntl(small[1], F_SETPIPE_SZ, BLOCK) == (int)BLOCK);
    uint64_t hits = reader_stats_of(f).hit_bytes;
    assert_int_equal(reader_read_pipe(file, 0, 4 * BLOCK, small[1], &holds,
                                      &got), ENOBUFS);
    assert_int_equal(reader_stats_of(f).hit_bytes, hits);
    assert_int_equal(read_check(file, 0, 4 * BLOCK, bytes), 0);
    /* (block 3 this open file fetched again above: not a hit) */
    assert_int_equal(reader_stats_of(f).hit_bytes - hits, 3 * BLOCK);
    close(small[0]);
    close(small[1]);
    cache_holds_release(&holds);
    reader_close(&file);
    close(fds[0]);
    close(fds[1]);
    free(bytes);
}

/* Sequential reads of a whole file in a thread of their own, each
 * compared with one version: the read stops at its first error. */
struct reading {
    pthread_t thread;
    struct reader_file *file;
    const unsigned char *expected;
    uint64_t size;
    uint64_t good;                 /* bytes read and equal to expected */
    int err;                       /* the first error, or 0 */
    bool mixed;                    /* a byte differed from expected */
};

static void *reading_main(void *arg)
{
    struct reading *reading = arg;
    char *buf = malloc(BLOCK);

    if (buf == NULL) {
        reading->err = ENOMEM;
        return NULL;
    }
    while (reading->good < reading->size && reading->err == 0 &&
           !reading->mixed) {
        size_t got = 0;
        uint64_t left = reading->size - reading->good;
        size_t len = left < BLOCK ? (size_t)left : BLOCK;
        reading->err = reader_read(reading->file, reading->good, len, buf,
                                   &got);
        if (reading->err == 0 && got != len)
            reading->err = EIO;
        if (reading->err == 0 &&
            memcmp(buf, reading->expected + reading->good, len) != 0)
            reading->mixed = true;
        else if (reading->err == 0)
            reading->good += len;
    }
    free(buf);
    return NULL;
}

static void test_version_change_mid_read(void **state)
{
    struct fixture *f = *state;
    const size_t size = 12 * BLOCK;
    char etag1[S3_ETAG_MAX], etag2[S3_ETAG_MAX];
    unsigned char *v1 = object_put(f, "v", size, 5, etag1);
    unsigned char *v2 = pattern(size, 6);
    struct reader_file *file = NULL;
    struct get gets[MAX_GETS];
    unsigned rule = 0;

    /* cached block 0 of v1; then another client replaces the object */
    open_file(f, "v", etag1, size, &file);
    assert_int_equal(read_check(file, 100, 10, v1), 0);
    assert_int_equal(fake_s3_put(f->s3, "v", v2, size, NULL, etag2), 0);
    /* the next GET (If-Match v1) fails: no byte of v2 is returned */
    assert_int_equal(read_check(file, 7 * BLOCK, 10, v1), ESTALE);
    assert_int_equal(read_check(file, BLOCK - 5, 10, v1), ESTALE);
    /* what v1 had cached is still v1 */
    assert_int_equal(read_check(file, 0, BLOCK, v1), 0);
    size_t count = gets_of(f, "v", 0, gets);
    assert_int_equal(count, 3);
    assert_int_equal(gets[1].result, ESTALE);
    assert_int_equal(gets[2].result, ESTALE);
    assert_string_equal(gets[2].condition, etag1);
    reader_close(&file);

    /* the new version read by a new open: v2's bytes only, none of v1 */
    open_file(f, "v", etag2, size, &file);
    assert_int_equal(read_check(file, 0, size, v2), 0);
    reader_close(&file);

    /* read-ahead in flight when the object changes: held GETs of the old
     * version, released after the change, fail; the reader stops with
     * ESTALE after the bytes of the version it opened */
    char etag3[S3_ETAG_MAX];
    unsigned char *v3 = object_put(f, "w", size, 7, etag3);
    size_t log_from = fake_s3_log_count(f->s3);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_GET, "w"), &rule), 0);
    struct reading reading = {.expected = v3, .size = size};
    open_file(f, "w", etag3, size, &reading.file);
    assert_int_equal(pthread_create(&reading.thread, NULL, reading_main,
                                    &reading), 0);
    /* block 0 (read alone), then block 1 with read-ahead of 2..5 */
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    assert_int_equal(fake_s3_release(f->s3, rule, false, NULL), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 2), 0);
    assert_int_equal(fake_s3_put(f->s3, "w", v1, size, NULL, NULL), 0);
    fake_s3_hold_clear(f->s3, rule);
    pthread_join(reading.thread, NULL);
    assert_false(reading.mixed);
    assert_int_equal(reading.err, ESTALE);
    assert_int_equal(reading.good, BLOCK);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    count = gets_of(f, "w", log_from, gets);
    assert_true(count >= 3);
    for (size_t i = 1; i < count; i++)
        assert_int_equal(gets[i].result, ESTALE);
    /* nothing of the new object was cached as the old version */
    struct cache_object *object = NULL;
    assert_int_equal(cache_object_open(f->cache, "w", etag3, size, &object), 0);
    assert_true(cache_block_present(f->cache, object, 0));
    for (uint64_t block = 1; block < size / BLOCK; block++)
        assert_false(cache_block_present(f->cache, object, block));
    cache_object_close(f->cache, &object);
    reader_close(&reading.file);
    free(v1);
    free(v2);
    free(v3);
}

static void test_broken_answer_leaves_no_partial_block(void **state)
{
    struct fixture *f = *state;
    const size_t size = 6 * BLOCK;
    char etag[S3_ETAG_MAX];
    unsigned char *bytes = object_put(f, "b", size, 8, etag);
    struct reader_file *file = NULL;

    /* the GET of block 2 delivers half the block, then breaks */
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_GET, "b"), 1, ECONNRESET,
                                  true, NULL), 0);
    open_file(f, "b", etag, size, &file);
    assert_int_equal(read_check(file, 2 * BLOCK, 100, bytes), ECONNRESET);
    struct cache_object *object = NULL;
    assert_int_equal(cache_object_open(f->cache, "b", etag, size, &object), 0);
    assert_false(cache_block_present(f->cache, object, 2));
    /* the next read fetches it again, whole and right */
    assert_int_equal(read_check(file, 2 * BLOCK, BLOCK, bytes), 0);
    assert_true(cache_block_present(f->cache, object, 2));
    cache_object_close(f->cache, &object);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_GET, "b")), 2);
    reader_close(&file);
    free(bytes);
}

/* --------------------------------------- reads answered from a pipe */

/* Open the cache again with SIZE_LIMIT bytes of room, on a tmpfs mounted
 * with huge=always over the test's directory where one can be mounted
 * (root, and a kernel with huge pages for tmpfs): there the data files'
 * pages are large folios, which a punch zeroes in place while a pipe
 * holds them (it cannot split them), so a punched block in a pipe reads
 * as zeros. Elsewhere a punch shows in the data file (and as zeros in a
 * pipe only where it cuts a page, at the end of an object). The cache
 * must hold nothing the test needs. */
static void restart_cache(struct fixture *f, uint64_t size_limit)
{
    reader_stop_all(f);
    cache_close(&f->cache);
    if (!f->mounted)
        f->mounted = mount("tmpfs", f->dir, "tmpfs", 0,
                           "size=64m,huge=always") == 0;
    if (!f->mounted)
        print_message("  (no tmpfs with huge=always here: the cache stays "
                      "on %s)\n", f->dir);
    f->cache_conf.size_limit = size_limit;
    f->cache = unit_cache_open(&f->cache_conf);
    assert_int_equal(workers_create(2, &f->workers), 0);
    reader_start(f);
}

/* Whether block BLOCK of the oldest data file (the version the test
 * cached first) holds the LEN bytes EXPECTED (the whole object) has
 * there: its bytes are still in the data file, not punched out. */
static bool block_on_disk(struct fixture *f, uint64_t block, size_t len,
                          const unsigned char *expected)
{
    char pattern_[128];
    glob_t found;
    bool same = false;

    snprintf(pattern_, sizeof(pattern_), "%s/data/*/*", f->dir);
    assert_int_equal(glob(pattern_, 0, NULL, &found), 0);
    int fd = open(found.gl_pathv[0], O_RDONLY);   /* (sorted: the lowest id) */
    globfree(&found);
    assert_true(fd >= 0);
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    same = pread(fd, buf, len, (off_t)(block * BLOCK)) == (ssize_t)len &&
           memcmp(buf, expected + block * BLOCK, len) == 0;
    free(buf);
    close(fd);
    return same;
}

/* The bytes of KEY at version ETAG the cache holds. */
static uint64_t cached_bytes(struct fixture *f, const char *key,
                             const char *etag, uint64_t size)
{
    uint64_t bytes = 0;

    assert_int_equal(cache_version_cached_bytes(f->cache, key, etag, size,
                                                &bytes, NULL), 0);
    return bytes;
}

/* A read answered as fuse_ops.c answers one: spliced into a pipe by
 * reader_read_pipe() (answer_splice, in the test's thread or in one of
 * its own), then, after what the test makes happen before the answer
 * leaves, read out of the pipe (answer_send), as libfuse's splice on to
 * /dev/fuse reads it. */
struct answer {
    struct reader_file *file;
    uint64_t offset;
    size_t len;
    int fds[2];
    struct cache_holds holds;
    size_t got;
    int err;
    pthread_t thread;
};

static void answer_begin(struct answer *a, struct reader_file *file,
                         uint64_t offset, size_t len)
{
    *a = (struct answer){.file = file, .offset = offset, .len = len};
    assert_int_equal(pipe(a->fds), 0);
    assert_true(fcntl(a->fds[1], F_SETPIPE_SZ, 1 << 20) >= (int)(2 * BLOCK));
}

static void answer_splice(struct answer *a)
{
    a->err = reader_read_pipe(a->file, a->offset, a->len, a->fds[1], &a->holds,
                              &a->got);
}

static void *answer_splice_main(void *arg)
{
    answer_splice(arg);
    return NULL;
}

/* The answer leaves: what the pipe holds compared with EXPECTED (the
 * whole object); the pipe closed. */
static void answer_send(struct answer *a, const unsigned char *expected)
{
    unsigned char *buf = malloc(a->len);
    size_t drained = 0;

    assert_non_null(buf);
    assert_int_equal(a->err, 0);
    assert_int_equal(a->got, a->len);
    while (drained < a->got) {
        ssize_t n = read(a->fds[0], buf + drained, a->got - drained);
        assert_true(n > 0);
        drained += (size_t)n;
    }
    close(a->fds[0]);
    close(a->fds[1]);
    cache_holds_release(&a->holds);
    size_t zeros = 0;
    for (size_t i = 0; i < a->len; i++)
        zeros += buf[i] != expected[a->offset + i] && buf[i] == 0;
    if (memcmp(buf, expected + a->offset, a->len) != 0)
        fail_msg("the answer to a read of %zu bytes at %llu is not the "
                 "object's bytes (%zu of them zeros)", a->len,
                 (unsigned long long)a->offset, zeros);
    free(buf);
}

/*
 * A read of two blocks in a full cache: block 0, which this open file
 * fetched first (the least recently used block, and reading it again
 * touches nothing), goes into the pipe; block 1 is missing, and its fill
 * makes room. The room must come from another block: block 0's pages are
 * in the pipe of a read not yet answered.
 */
static void test_pipe_read_keeps_its_blocks_until_answered(void **state)
{
    struct fixture *f = *state;
    char etag[S3_ETAG_MAX], other_etag[S3_ETAG_MAX];
    struct reader_file *file = NULL, *other = NULL;
    struct answer a;

    /* room for three blocks; no read-ahead (its window would be a
     * quarter of the cache: less than a block) */
    restart_cache(f, 3 * BLOCK);
    unsigned char *bytes = object_put(f, "k", 4 * BLOCK, 21, etag);
    unsigned char *other_bytes = object_put(f, "o", 2 * BLOCK, 22, other_etag);
    open_file(f, "k", etag, 4 * BLOCK, &file);
    assert_int_equal(read_check(file, 0, 100, bytes), 0);
    open_file(f, "o", other_etag, 2 * BLOCK, &other);
    assert_int_equal(read_check(other, 0, 2 * BLOCK, other_bytes), 0);
    reader_close(&other);
    struct cache_stats stats;
    cache_get_stats(f->cache, &stats);
    assert_int_equal(stats.used_bytes, 3 * BLOCK);

    answer_begin(&a, file, BLOCK / 2, BLOCK);
    answer_splice(&a);
    bool kept = block_on_disk(f, 0, BLOCK, bytes);
    answer_send(&a, bytes);
    if (!kept)
        fail_msg("block 0 was punched while a pipe held it for a read "
                 "not yet answered");
    /* the room came from the other object; the cache within its size */
    assert_int_equal(cached_bytes(f, "k", etag, 4 * BLOCK), 2 * BLOCK);
    assert_int_equal(cached_bytes(f, "o", other_etag, 2 * BLOCK), BLOCK);
    cache_get_stats(f->cache, &stats);
    assert_true(stats.used_bytes <= 3 * BLOCK);
    reader_close(&file);
    free(bytes);
    free(other_bytes);
}

/*
 * What drops blocks without making room leaves the bytes of a read not
 * yet answered alone too: the key evicted (`warm --evict`) while the read
 * waits for the GET of its second block, or between the splice of the
 * last block and the answer (the object ends within a page, which a
 * punch zeroes in place on any file system); a new version of the key
 * opened, and the key forgotten (removed through the mount), before the
 * answer. An evicted block's space comes back once the answer has gone.
 * (The blocks are cached through another open file, so that the reads
 * answered are not sequential ones, with read-ahead GETs of their own.)
 */
static void test_pipe_read_outlives_drops(void **state)
{
    struct fixture *f = *state;
    const size_t size = 4 * BLOCK - 1000;
    const size_t last = size - 3 * BLOCK;
    char etag[S3_ETAG_MAX], etag2[S3_ETAG_MAX];
    struct reader_file *file = NULL, *file2 = NULL, *loader = NULL;
    struct answer a;
    uint64_t freed = 0;
    unsigned rule = 0;

    restart_cache(f, 64ull << 20);
    unsigned char *bytes = object_put(f, "k", size, 23, etag);
    open_file(f, "k", etag, size, &loader);
    open_file(f, "k", etag, size, &file);
    assert_int_equal(read_check(loader, 0, BLOCK, bytes), 0);

    /* 1. evicted while the read waits for the GET of block 1 */
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_GET, "k"), &rule), 0);
    answer_begin(&a, file, BLOCK / 2, BLOCK);
    assert_int_equal(pthread_create(&a.thread, NULL, answer_splice_main, &a), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    assert_int_equal(cache_evict_key(f->cache, "k", &freed), 0);
    assert_int_equal(freed, BLOCK);
    bool kept = block_on_disk(f, 0, BLOCK, bytes);
    fake_s3_hold_clear(f->s3, rule);
    assert_int_equal(pthread_join(a.thread, NULL), 0);
    answer_send(&a, bytes);
    if (!kept)
        fail_msg("block 0, evicted, was punched while a pipe held it for "
                 "a read waiting for its next block");
    assert_false(block_on_disk(f, 0, BLOCK, bytes));   /* (now it is) */
    assert_int_equal(cached_bytes(f, "k", etag, size), BLOCK);

    /* 2. the last block evicted between its splice and the answer */
    assert_int_equal(read_check(loader, 3 * BLOCK, last, bytes), 0);
    answer_begin(&a, file, 3 * BLOCK, last);
    answer_splice(&a);
    assert_int_equal(cache_evict_key(f->cache, "k", &freed), 0);
    assert_int_equal(freed, BLOCK + last);
    kept = block_on_disk(f, 3, last, bytes);
    answer_send(&a, bytes);
    if (!kept)
        fail_msg("block 3, evicted, was punched while a pipe held it for "
                 "a read not yet answered");
    assert_false(block_on_disk(f, 3, last, bytes));
    assert_int_equal(cached_bytes(f, "k", etag, size), 0);

    /* 3. a new version opened between the splice and the answer (the old
     * one's blocks go from the index; its file at its last close) */
    assert_int_equal(read_check(loader, 3 * BLOCK, last, bytes), 0);
    answer_begin(&a, file, 3 * BLOCK, last);
    answer_splice(&a);
    unsigned char *bytes2 = object_put(f, "k", size, 24, etag2);
    open_file(f, "k", etag2, size, &file2);
    assert_int_equal(cached_bytes(f, "k", etag, size), 0);
    assert_true(block_on_disk(f, 3, last, bytes));
    answer_send(&a, bytes);
    reader_close(&file);
    reader_close(&loader);

    /* 4. the key forgotten between the splice and the answer */
    open_file(f, "k", etag2, size, &loader);
    assert_int_equal(read_check(loader, 3 * BLOCK, last, bytes2), 0);
    answer_begin(&a, file2, 3 * BLOCK, last);
    answer_splice(&a);
    assert_int_equal(cache_forget_key(f->cache, "k"), 0);
    assert_int_equal(cached_bytes(f, "k", etag2, size), 0);
    answer_send(&a, bytes2);
    reader_close(&file2);
    reader_close(&loader);
    free(bytes);
    free(bytes2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cold_sequential_read, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_random_reads_fetch_one_block,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_scattered_reader_gets_the_rest,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_sampled_file_is_not_swept,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_read_from_the_cache, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_version_change_mid_read, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_broken_answer_leaves_no_partial_block, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_pipe_read_keeps_its_blocks_until_answered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_read_outlives_drops, setup,
                                        teardown),
    };
    log_set_level(LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
