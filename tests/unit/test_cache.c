/*
 * test_cache.c - unit tests for the block cache (cache.c over db.c).
 *
 * Every test gets a fresh cache directory under /tmp (removed with all its
 * contents in teardown) and small blocks: 64 KiB (one checksummed piece)
 * or 256 KiB (four pieces). Block contents are a deterministic function of
 * (seed, offset in the object), so any byte served from the wrong place,
 * the wrong version or a damaged file shows up as a mismatch. Blocks are
 * written in uneven chunks (1000 bytes, then sizes that straddle piece
 * boundaries) to exercise the per-piece checksums.
 *
 * Covered: round trips and statistics, argument errors, detection of
 * damaged, truncated and deleted data files, object versions, persistence,
 * the size bound, scan-resistant eviction, the directory lock, crash
 * detection by boot id, a changed block size, the free-space bound, and a
 * multi-threaded smoke test and the size bound under concurrency. The
 * write path's needs: staging/ and journal/ survive every emptying,
 * cache_reserve_disk (bounds; eviction order, on /dev/shm), adopting a
 * staged file (contents, versions, room), re-keying, forgetting; data
 * files left by a killed process swept at open; the flusher thread; the
 * usage in memory when a commit that drops blocks overtakes the one that
 * recorded them (db_txn_commit() wrapped to stop a thread between the two).
 * TEST_CACHE_FILTER, a cmocka name pattern, runs a subset.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/db.h"
#include "base/log.h"
#include "cache/cache.h"
#include "unit_cache.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define KIB 1024u
#define PIECE CACHE_PIECE_SIZE
#define SMALL_BLOCK (64u * KIB)
#define LARGE_BLOCK (256u * KIB)
#define MAX_TEST_BLOCK LARGE_BLOCK
#define ETAG "\"0123456789abcdef\""

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

static const uint32_t small_block = SMALL_BLOCK;
static const uint32_t large_block = LARGE_BLOCK;

/* Bytes the cache accounts for a block of LEN bytes (4 KiB units). */
static uint64_t rounded(uint64_t len)
{
    return (len + 4095) / 4096 * 4096;
}

/* ------------------------------------------------------------ contents */

/* Byte POS of the object whose contents are named by SEED. */
static unsigned char content_byte(uint32_t seed, uint64_t pos)
{
    uint64_t x = (pos + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 17);

    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 29;
    return (unsigned char)x;
}

static void make_bytes(char *out, uint32_t seed, uint64_t pos, size_t len)
{
    for (size_t i = 0; i < len; i++)
        out[i] = (char)content_byte(seed, pos + i);
}

/* Uneven write sizes: across and along piece boundaries. */
static const size_t chunk_sizes[] = {1000, 70001, 3, PIECE, 12345, 2 * PIECE};

/*
 * Store block BLOCK of O (contents SEED) through begin/write.../commit,
 * SCRATCH holding at least a block. Returns the first error. No cmocka
 * asserts: threads use it too.
 */
static int store_raw(struct cache *cache, struct cache_object *o,
                     uint64_t block, uint32_t seed, char *scratch)
{
    uint64_t base = block * cache_block_size(cache);
    uint32_t len = cache_object_block_len(o, block);
    struct cache_fill *fill = NULL;
    size_t done = 0;
    int rc = cache_fill_begin(cache, o, block, &fill);

    if (rc != 0)
        return fill == NULL ? rc : -1;
    make_bytes(scratch, seed, base, len);
    for (size_t i = 0; done < len; i++) {
        size_t n = chunk_sizes[i % ARRAY_LEN(chunk_sizes)];
        if (n > len - done)
            n = len - done;
        rc = cache_fill_write(fill, scratch + done, n);
        if (rc != 0) {
            cache_fill_abort(&fill);
            return rc;
        }
        done += n;
    }
    rc = cache_fill_commit(&fill);
    return fill == NULL ? rc : -1;
}

/*
 * Read LEN bytes at OFF in BLOCK of O into BUF and compare them with the
 * contents SEED (EXPECT is scratch space). Returns cache_block_read's
 * result, or -1 when it reported success with wrong bytes.
 */
static int read_raw(struct cache *cache, struct cache_object *o,
                    uint64_t block, uint32_t off, uint32_t len, uint32_t seed,
                    bool reuse, char *buf, char *expect)
{
    uint64_t base = block * cache_block_size(cache);
    int rc;

    memset(buf, 0x5a, len);
    rc = cache_block_read(cache, o, block, off, len, buf, reuse);
    if (rc != 0)
        return rc;
    make_bytes(expect, seed, base + off, len);
    return memcmp(buf, expect, len) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------- fixture */

struct fixture {
    char dir[64];
    struct cache_conf conf;
    struct cache *cache;
    char *scratch;    /* a block being stored */
    char *buf;        /* what the cache returned */
    char *expect;     /* what it should have returned */
};

static void cache_start(struct fixture *f)
{
    f->cache = unit_cache_open(&f->conf);
}

static void cache_stop(struct fixture *f)
{
    cache_close(&f->cache);
    assert_null(f->cache);
}

static void cache_restart(struct fixture *f)
{
    cache_stop(f);
    cache_start(f);
}

/* Start again from an empty directory. */
static void cache_wipe(struct fixture *f)
{
    cache_stop(f);
    unit_remove_tree(f->dir);
    assert_int_equal(mkdir(f->dir, 0700), 0);
    cache_start(f);
}

/* The prestate, if any, is the block size. */
static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    uint32_t block_size = *state != NULL ? *(const uint32_t *)*state
                                         : SMALL_BLOCK;

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_cache.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->conf = (struct cache_conf){
        .dir = f->dir,
        .bucket = "test-bucket",
        .size_limit = 64ull * block_size,
        .min_free_bytes = 0,
        .min_free_ratio = 0.0,
        .block_size = block_size,
    };
    f->scratch = malloc(MAX_TEST_BLOCK);
    f->buf = malloc(MAX_TEST_BLOCK);
    f->expect = malloc(MAX_TEST_BLOCK);
    assert_non_null(f->scratch);
    assert_non_null(f->buf);
    assert_non_null(f->expect);
    *state = f;
    cache_start(f);
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    cache_close(&f->cache);
    umount2(f->dir, MNT_DETACH);     /* (a test's own tmpfs, if left) */
    unit_remove_tree(f->dir);
    free(f->scratch);
    free(f->buf);
    free(f->expect);
    free(f);
    return 0;
}

static struct cache_object *open_object(struct fixture *f, const char *key,
                                        const char *etag, uint64_t size)
{
    struct cache_object *o = NULL;
    int rc = cache_object_open(f->cache, key, etag, size, &o);

    if (rc != 0)
        fail_msg("cache_object_open(%s): %s", key, strerror(rc));
    assert_non_null(o);
    return o;
}

static void store(struct fixture *f, struct cache_object *o, uint64_t block,
                  uint32_t seed)
{
    int rc = store_raw(f->cache, o, block, seed, f->scratch);

    if (rc != 0)
        fail_msg("storing block %llu: %s", (unsigned long long)block,
                 rc > 0 ? strerror(rc) : "fill not consumed");
    assert_true(cache_block_present(f->cache, o, block));
}

/* A successful read of the right bytes. */
static void expect_read(struct fixture *f, struct cache_object *o,
                        uint64_t block, uint32_t off, uint32_t len,
                        uint32_t seed)
{
    int rc = read_raw(f->cache, o, block, off, len, seed, false, f->buf,
                      f->expect);

    if (rc == -1)
        fail_msg("block %llu [%u, +%u): wrong bytes reported as a hit",
                 (unsigned long long)block, off, len);
    if (rc != 0)
        fail_msg("block %llu [%u, +%u): %s", (unsigned long long)block, off,
                 len, strerror(rc));
}

/* A read that must fail with ERR (and certainly not succeed wrongly). */
static void expect_read_error(struct fixture *f, struct cache_object *o,
                              uint64_t block, uint32_t off, uint32_t len,
                              int err)
{
    int rc = cache_block_read(f->cache, o, block, off, len, f->buf, false);

    if (rc != err)
        fail_msg("block %llu [%u, +%u): %s, expected %s",
                 (unsigned long long)block, off, len,
                 rc == 0 ? "success" : strerror(rc), strerror(err));
}

/* Whole block BLOCK is gone: ENOENT, then not present. */
static void expect_missing(struct fixture *f, struct cache_object *o,
                           uint64_t block)
{
    expect_read_error(f, o, block, 0, cache_object_block_len(o, block), ENOENT);
    assert_false(cache_block_present(f->cache, o, block));
}

static struct cache_stats stats(struct fixture *f)
{
    struct cache_stats s;

    memset(&s, 0xff, sizeof(s));
    cache_get_stats(f->cache, &s);
    return s;
}

/* Paths of the files under DIR/data/XX/ (up to MAX); returns how many. */
static size_t data_files(struct fixture *f, char (*paths)[256], size_t max)
{
    char top_path[128];
    DIR *top;
    struct dirent *sub;
    size_t count = 0;

    snprintf(top_path, sizeof(top_path), "%s/data", f->dir);
    top = opendir(top_path);
    while (top != NULL && (sub = readdir(top)) != NULL) {
        char sub_path[256];
        DIR *inner;
        struct dirent *file;
        if (sub->d_name[0] == '.')
            continue;
        if (snprintf(sub_path, sizeof(sub_path), "%s/%s", top_path,
                     sub->d_name) >= (int)sizeof(sub_path))
            continue;
        inner = opendir(sub_path);
        while (inner != NULL && (file = readdir(inner)) != NULL) {
            if (file->d_name[0] == '.')
                continue;
            if (count < max &&
                snprintf(paths[count], sizeof(paths[count]), "%s/%s",
                         sub_path, file->d_name) >= (int)sizeof(paths[count]))
                fail_msg("path too long under %s", sub_path);
            count++;
        }
        if (inner != NULL)
            closedir(inner);
    }
    if (top != NULL)
        closedir(top);
    return count;
}

/* The one data file of the cache (it must be the only one). */
static void only_data_file(struct fixture *f, char path[256])
{
    char paths[4][256];
    size_t n = data_files(f, paths, ARRAY_LEN(paths));
    const char *name;

    if (n != 1)
        fail_msg("expected one data file, found %zu", n);
    /* DIR/data/XX/<16 hex digits> */
    name = strrchr(paths[0], '/') + 1;
    assert_int_equal(strlen(name), 16);
    assert_int_equal(strspn(name, "0123456789abcdef"), 16);
    memcpy(path, paths[0], sizeof(paths[0]));
}

static void read_boot_id(char *out, size_t len)
{
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");

    assert_non_null(fp);
    assert_non_null(fgets(out, (int)len, fp));
    fclose(fp);
    out[strcspn(out, "\n")] = '\0';
    assert_true(strlen(out) > 0);
}

static void read_text_file(const char *path, char *out, size_t len)
{
    FILE *fp = fopen(path, "r");
    size_t n;

    assert_non_null(fp);
    n = fread(out, 1, len - 1, fp);
    out[n] = '\0';
    fclose(fp);
}

static void write_text_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");

    assert_non_null(fp);
    assert_int_equal(fputs(text, fp) >= 0, 1);
    assert_int_equal(fclose(fp), 0);
}

/* ---------------------------------------------------------- round trip */

static void test_round_trip(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint32_t tail = bs / 2 + 1000;
    uint64_t size = 2ull * bs + tail;
    uint64_t hits = 0;
    struct cache_object *o = open_object(f, "dir/round trip.bin", ETAG, size);
    struct cache_object *again;
    struct cache_stats s;

    assert_int_equal(cache_block_size(f->cache), bs);
    assert_int_equal(cache_object_blocks(o), 3);
    assert_int_equal(cache_object_block_len(o, 0), bs);
    assert_int_equal(cache_object_block_len(o, 1), bs);
    assert_int_equal(cache_object_block_len(o, 2), tail);
    assert_int_equal(cache_object_block_len(o, 3), 0);

    s = stats(f);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.size_limit, f->conf.size_limit);

    for (uint64_t b = 0; b < 3; b++) {
        assert_false(cache_block_present(f->cache, o, b));
        store(f, o, b, 7);
    }
    assert_false(cache_block_present(f->cache, o, 3));

    s = stats(f);
    assert_int_equal(s.blocks, 3);
    assert_int_equal(s.stored_bytes, size);
    assert_int_equal(s.used_bytes, 2ull * bs + rounded(tail));
    assert_int_equal(s.served_bytes, 0);
    assert_int_equal(s.evicted_blocks, 0);
    assert_int_equal(s.corrupt_blocks, 0);

    for (uint64_t b = 0; b < 3; b++) {
        uint32_t len = cache_object_block_len(o, b);
        /* whole block, edges, and ranges across piece boundaries */
        const struct {
            uint32_t off, len;
        } ranges[] = {
            {0, len},
            {0, 1},
            {len - 1, 1},
            {1, len - 2},
            {len / 2 - 7, 13},
            {PIECE - 10, 20},
            {PIECE - 1, PIECE + 2},
            {2 * PIECE - 3, 6},
            {PIECE, 2 * PIECE},
            {3 * PIECE - 1, PIECE + 1},
        };
        for (size_t i = 0; i < ARRAY_LEN(ranges); i++) {
            if ((uint64_t)ranges[i].off + ranges[i].len > len)
                continue;
            expect_read(f, o, b, ranges[i].off, ranges[i].len, 7);
            hits += ranges[i].len;
        }
    }

    /* a second handle on the same version sees the same blocks */
    again = open_object(f, "dir/round trip.bin", ETAG, size);
    expect_read(f, again, 2, 0, tail, 7);
    hits += tail;
    cache_object_close(f->cache, &again);
    assert_null(again);

    s = stats(f);
    assert_int_equal(s.served_bytes, hits);
    assert_int_equal(s.blocks, 3);
    assert_int_equal(s.corrupt_blocks, 0);

    cache_object_close(f->cache, &o);
    assert_null(o);
    cache_object_close(f->cache, &o); /* safe on NULL */
}

/* A fill keeps its object alive after the caller's handle is closed. */
static void test_fill_outlives_handle(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o = open_object(f, "k", ETAG, bs);
    struct cache_fill *fill = NULL;

    assert_int_equal(cache_fill_begin(f->cache, o, 0, &fill), 0);
    cache_object_close(f->cache, &o);
    make_bytes(f->scratch, 3, 0, bs);
    assert_int_equal(cache_fill_write(fill, f->scratch, 1000), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch + 1000, bs - 1000), 0);
    assert_int_equal(cache_fill_commit(&fill), 0);
    assert_null(fill);

    o = open_object(f, "k", ETAG, bs);
    expect_read(f, o, 0, 0, bs, 3);
    cache_object_close(f->cache, &o);
}

/* -------------------------------------------------------------- errors */

static void test_errors(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o = open_object(f, "errors", ETAG, 2ull * bs + 5000);
    struct cache_object *empty = open_object(f, "empty", ETAG, 0);
    struct cache_fill *fill = NULL;
    struct cache_stats before, after;

    /* nothing stored yet */
    expect_read_error(f, o, 0, 0, 10, ENOENT);
    expect_read_error(f, o, 2, 0, 5000, ENOENT);

    store(f, o, 0, 11);
    store(f, o, 2, 11);

    /* ranges past the end of the block */
    expect_read_error(f, o, 0, bs - 10, 11, EINVAL);
    expect_read_error(f, o, 0, bs, 1, EINVAL);
    expect_read_error(f, o, 0, 0, bs + 1, EINVAL);
    expect_read_error(f, o, 2, 4990, 11, EINVAL);
    expect_read_error(f, o, 2, 0, 5001, EINVAL);
    expect_read(f, o, 2, 4990, 10, 11);
    expect_read(f, o, 0, bs - 10, 10, 11);

    /* no block past the object's end, none in an empty object */
    assert_int_equal(cache_object_blocks(empty), 0);
    assert_int_not_equal(cache_fill_begin(f->cache, o, 3, &fill), 0);
    assert_null(fill);
    assert_int_not_equal(cache_fill_begin(f->cache, empty, 0, &fill), 0);
    assert_null(fill);

    /* writing more than the block holds */
    before = stats(f);
    make_bytes(f->scratch, 11, bs, bs);
    assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), 0);
    assert_non_null(fill);
    assert_int_equal(cache_fill_write(fill, f->scratch, bs + 1), EINVAL);
    assert_int_equal(cache_fill_write(fill, f->scratch, bs - 10), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch, 11), EINVAL);
    cache_fill_abort(&fill);
    assert_null(fill);
    cache_fill_abort(&fill); /* safe twice */
    assert_false(cache_block_present(f->cache, o, 1));

    /* committing an incomplete block: an error and nothing recorded */
    assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch, 1000), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch + 1000, bs / 2), 0);
    assert_int_not_equal(cache_fill_commit(&fill), 0);
    assert_null(fill);
    assert_false(cache_block_present(f->cache, o, 1));
    expect_read_error(f, o, 1, 0, 100, ENOENT);

    after = stats(f);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.used_bytes, before.used_bytes);
    assert_int_equal(after.stored_bytes, before.stored_bytes);

    /* the untouched blocks are still good */
    expect_read(f, o, 0, 0, bs, 11);
    expect_read(f, o, 2, 0, 5000, 11);
    cache_object_close(f->cache, &o);
    cache_object_close(f->cache, &empty);

    /*
     * Aborted and failed fills give their reservation back: with room for
     * exactly one block, a leaked reservation would make the last fill
     * fail with ENOSPC.
     */
    f->conf.size_limit = bs;
    cache_restart(f);
    o = open_object(f, "errors", ETAG, 2ull * bs + 5000);
    assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), 0);
    cache_fill_abort(&fill);
    assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch, 10), 0);
    assert_int_not_equal(cache_fill_commit(&fill), 0);
    store(f, o, 1, 11);
    expect_read(f, o, 1, 0, bs, 11);
    after = stats(f);
    assert_int_equal(after.blocks, 1);
    assert_int_equal(after.used_bytes, bs);
    cache_object_close(f->cache, &o);
}

/* ----------------------------------------------------------- integrity */

/* Flip one byte in piece 2 of block 1 (the middle of it for one-piece
 * blocks): reads touching it fail, the block is dropped and counted. */
static void test_integrity_flipped_byte(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint32_t at = bs > 2 * PIECE ? 2 * PIECE + 100 : bs / 2;
    struct cache_object *o = open_object(f, "flip", ETAG, 2ull * bs);
    char path[256];
    unsigned char byte;
    struct cache_stats s;
    int fd;

    store(f, o, 0, 21);
    store(f, o, 1, 21);
    only_data_file(f, path);

    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &byte, 1, (off_t)bs + at), 1);
    byte ^= 0x10;
    assert_int_equal(pwrite(fd, &byte, 1, (off_t)bs + at), 1);
    close(fd);

    if (at >= PIECE) /* pieces not read are not checked */
        expect_read(f, o, 1, 0, PIECE, 21);
    s = stats(f);
    assert_int_equal(s.corrupt_blocks, 0);

    expect_read_error(f, o, 1, 0, bs, ENOENT);
    s = stats(f);
    assert_int_equal(s.corrupt_blocks, 1);
    assert_int_equal(s.blocks, 1);
    assert_int_equal(s.used_bytes, bs);
    assert_false(cache_block_present(f->cache, o, 1));
    /* dropped: even the good piece is no longer served */
    expect_read_error(f, o, 1, 0, 10, ENOENT);
    assert_int_equal(stats(f).corrupt_blocks, 1);

    /* the neighbour is unaffected, and a new fill repairs the block */
    expect_read(f, o, 0, 0, bs, 21);
    store(f, o, 1, 21);
    expect_read(f, o, 1, 0, bs, 21);
    assert_int_equal(stats(f).blocks, 2);
    cache_object_close(f->cache, &o);
}

/* This thread's write system calls so far (/proc/thread-self/io). */
static uint64_t thread_write_calls(void)
{
    FILE *io = fopen("/proc/thread-self/io", "r");
    char line[128];
    unsigned long long calls = 0;

    assert_non_null(io);
    while (fgets(line, sizeof(line), io) != NULL)
        if (sscanf(line, "syscw: %llu", &calls) == 1)
            break;
    fclose(io);
    return calls;
}

/* A fill gathers small writes (curl hands 16 KiB at a time) into writes
 * of FILL_WRITE_SIZE (256 KiB), takes a large one as it is, and gives
 * back what it gathered when aborted; the bytes are right either way. */
static void test_fill_gathers_writes(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size; /* 256 KiB */
    struct cache_object *o = open_object(f, "gathered", ETAG, 3ull * bs);
    struct cache_fill *fill = NULL;

    /* 16 KiB pieces: one write, when the last one completes the block */
    make_bytes(f->scratch, 61, 0, bs);
    assert_int_equal(cache_fill_begin(f->cache, o, 0, &fill), 0);
    uint64_t calls = thread_write_calls();
    for (uint32_t at = 0; at < bs; at += 16 * KIB) {
        assert_int_equal(cache_fill_write(fill, f->scratch + at, 16 * KIB), 0);
        assert_int_equal(thread_write_calls() - calls, at + 16 * KIB < bs ? 0 : 1);
    }
    assert_int_equal(cache_fill_commit(&fill), 0);
    expect_read(f, o, 0, 0, bs, 61);

    /* the whole block at once: one write, from the caller's memory */
    make_bytes(f->scratch, 61, bs, bs);
    assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), 0);
    calls = thread_write_calls();
    assert_int_equal(cache_fill_write(fill, f->scratch, bs), 0);
    assert_int_equal(thread_write_calls() - calls, 1);
    assert_int_equal(cache_fill_commit(&fill), 0);
    expect_read(f, o, 1, 0, bs, 61);

    /* aborted with bytes gathered and not written: nothing stays */
    make_bytes(f->scratch, 61, 2ull * bs, bs);
    assert_int_equal(cache_fill_begin(f->cache, o, 2, &fill), 0);
    assert_int_equal(cache_fill_write(fill, f->scratch, 1000), 0);
    cache_fill_abort(&fill);
    assert_null(fill);
    expect_missing(f, o, 2);
    store(f, o, 2, 61);
    expect_read(f, o, 2, 0, bs, 61);
    assert_int_equal(stats(f).blocks, 3);
    cache_object_close(f->cache, &o);
}

/* A data file cut short under an open object. */
static void test_integrity_truncated(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o = open_object(f, "truncated", ETAG, 3ull * bs);
    char path[256];
    struct cache_stats s;

    for (uint64_t b = 0; b < 3; b++)
        store(f, o, b, 31);
    only_data_file(f, path);
    assert_int_equal(truncate(path, (off_t)bs + 100), 0);

    expect_read(f, o, 0, 0, bs, 31);
    expect_read_error(f, o, 1, 0, 50, ENOENT);
    expect_missing(f, o, 1);
    expect_missing(f, o, 2);
    s = stats(f);
    assert_int_equal(s.corrupt_blocks, 2);
    assert_int_equal(s.blocks, 1);
    assert_int_equal(s.used_bytes, bs);
    cache_object_close(f->cache, &o);
}

/*
 * A block punched out of its data file behind the index's back, in a
 * cache on a tmpfs that is full, is a damaged block for
 * cache_block_splice(): never spliced, and the process lives. (Kernels
 * that allocate a tmpfs page on a read fault of a hole answer SIGBUS
 * when full, which the guard of sigbus.h turns into zeros; 6.18 maps
 * the zero page instead. Zeros do not match the checksums either way.)
 * Needs root (a tmpfs of its own); skipped otherwise.
 */
static void test_splice_of_a_punched_block_on_a_full_tmpfs(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o;
    char path[256], filler[320];
    struct cache_holds holds = {0};
    int pipe_fds[2], fd;

    cache_stop(f);
    if (mount("tmpfs", f->dir, "tmpfs", 0, "size=2m") != 0) {
        cache_start(f);
        skip();
    }
    cache_start(f);
    o = open_object(f, "holes", ETAG, 2ull * bs);
    store(f, o, 0, 41);
    store(f, o, 1, 42);
    only_data_file(f, path);
    /* the tmpfs filled up, then block 0's pages punched out */
    snprintf(filler, sizeof(filler), "%s/filler", f->dir);
    fd = open(filler, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    memset(f->scratch, 1, bs);
    while (write(fd, f->scratch, bs) > 0)
        ;
    close(fd);
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               0, bs), 0);
    close(fd);

    assert_int_equal(pipe(pipe_fds), 0);
    assert_true(fcntl(pipe_fds[1], F_SETPIPE_SZ, 2 * bs) >= (int)bs);
    assert_int_equal(cache_block_splice(f->cache, o, 0, 0, bs, pipe_fds[1],
                                        false, &holds), EAGAIN); /* and alive */
    /* (the full tmpfs refused the index's write that drops it; with
     * room again, a read finds the block damaged and drops it) */
    assert_int_equal(unlink(filler), 0);
    expect_missing(f, o, 0);
    assert_true(stats(f).corrupt_blocks >= 1);
    expect_read(f, o, 1, 0, bs, 42);             /* the other is intact */
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    cache_holds_release(&holds);
    cache_object_close(f->cache, &o);
    cache_stop(f);
    assert_int_equal(umount2(f->dir, MNT_DETACH), 0);
    cache_start(f);
}

/* A spliced read not yet answered: LEN bytes at OFF in BLOCK of an
 * object spliced into a pipe of its own (spliced_begin); its answer reads
 * the pipe out, as the answer's splice on to /dev/fuse does. */
struct spliced {
    int fds[2];
    uint64_t block;
    uint32_t off, len;
    struct cache_holds holds;
};

static int spliced_begin(struct fixture *f, struct cache_object *o,
                         struct spliced *s, uint64_t block, uint32_t off,
                         uint32_t len)
{
    *s = (struct spliced){.block = block, .off = off, .len = len};
    assert_int_equal(pipe(s->fds), 0);
    assert_true(fcntl(s->fds[1], F_SETPIPE_SZ, 1 << 20) >= (int)len);
    return cache_block_splice(f->cache, o, block, off, len, s->fds[1], false,
                              &s->holds);
}

/* The answer leaves: whether the pipe held the contents SEED; the pipe
 * closed. */
static bool spliced_answer(struct fixture *f, struct spliced *s,
                           uint32_t seed)
{
    size_t got = 0;

    while (got < s->len) {
        ssize_t n = read(s->fds[0], f->buf + got, s->len - got);
        assert_true(n > 0);
        got += (size_t)n;
    }
    close(s->fds[0]);
    close(s->fds[1]);
    cache_holds_release(&s->holds);
    make_bytes(f->expect, seed, s->block * f->conf.block_size + s->off, s->len);
    return memcmp(f->buf, f->expect, s->len) == 0;
}

/* Flip the byte at AT of the data file PATH. */
static void damage_byte(const char *path, off_t at)
{
    int fd = open(path, O_RDWR);
    unsigned char byte;

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &byte, 1, at), 1);
    byte ^= 0x5a;
    assert_int_equal(pwrite(fd, &byte, 1, at), 1);
    close(fd);
}

/* Whether the LEN bytes at AT of the data file PATH are all zeros (a
 * hole: the space given back). */
static bool zeros_on_disk(struct fixture *f, const char *path, off_t at,
                          uint32_t len)
{
    int fd = open(path, O_RDONLY);
    bool zeros = true;

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, f->buf, len, at), (ssize_t)len);
    for (uint32_t i = 0; i < len && zeros; i++)
        zeros = f->buf[i] == 0;
    close(fd);
    return zeros;
}

/*
 * The last block of an object (it ends within a page), its last piece in
 * the pipe of a read not yet answered, found damaged in its first piece
 * by another read and dropped: the pipe's bytes stay whole until the
 * answer (a punch would zero the page it cuts, in place), and the
 * block's space comes back after it. Dropped so again and filled again
 * (fetched by the read that found it damaged) before the answer: the
 * refilled block stays whole after the answer.
 */
static void test_spliced_block_dropped_as_damaged(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size; /* 256 KiB: four pieces */
    uint64_t size = 2ull * bs - 1000;
    struct cache_object *o = open_object(f, "damaged", ETAG, size);
    uint32_t len = cache_object_block_len(o, 1);
    uint32_t tail = 3 * PIECE;
    struct spliced s;
    char path[256];

    store(f, o, 0, 61);
    store(f, o, 1, 61);
    only_data_file(f, path);
    for (int refill = 0; refill < 2; refill++) {
        print_message("  %s\n", refill ? "filled again before the answer"
                                       : "answered, then filled again");
        assert_int_equal(spliced_begin(f, o, &s, 1, tail, len - tail), 0);
        damage_byte(path, (off_t)bs + 100);
        expect_read_error(f, o, 1, 0, 100, ENOENT);
        expect_missing(f, o, 1);
        if (refill)
            store(f, o, 1, 61);
        if (!spliced_answer(f, &s, 61))
            fail_msg("the pipe's bytes of block 1 changed after it was "
                     "dropped, before the answer");
        if (!refill) {
            assert_true(zeros_on_disk(f, path, (off_t)bs, len));
            store(f, o, 1, 61);
        }
    }
    expect_read(f, o, 1, 0, len, 61);
    expect_read(f, o, 0, 0, bs, 61);
    assert_int_equal(stats(f).corrupt_blocks, 2);
    cache_object_close(f->cache, &o);
}

/* A data file deleted while the cache was down: the index still lists the
 * blocks, reads must not believe it. */
static void test_integrity_deleted(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t size = 2ull * bs + 10;
    struct cache_object *o = open_object(f, "deleted", ETAG, size);
    char path[256];
    struct cache_stats s;

    for (uint64_t b = 0; b < 3; b++)
        store(f, o, b, 41);
    cache_object_close(f->cache, &o);
    only_data_file(f, path);
    assert_int_equal(unlink(path), 0);

    cache_restart(f);
    o = open_object(f, "deleted", ETAG, size);
    for (uint64_t b = 0; b < 3; b++) {
        int rc = read_raw(f->cache, o, b, 0, cache_object_block_len(o, b), 41,
                          true, f->buf, f->expect);
        assert_int_equal(rc, ENOENT);
        assert_false(cache_block_present(f->cache, o, b));
    }
    s = stats(f);
    assert_int_equal(s.corrupt_blocks, 3);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.used_bytes, 0);

    /* and the cache heals */
    store(f, o, 1, 41);
    expect_read(f, o, 1, 0, bs, 41);
    cache_object_close(f->cache, &o);
}

/* LEN bytes at OFF in BLOCK of O spliced into a fresh pipe, read back and
 * compared with the contents SEED. Returns cache_block_splice's result,
 * or -1 when it reported success with wrong bytes. */
static int splice_check(struct fixture *f, struct cache_object *o,
                        uint64_t block, uint32_t off, uint32_t len,
                        uint32_t seed)
{
    struct cache_holds holds = {0};
    int fds[2];
    size_t got = 0;

    assert_int_equal(pipe(fds), 0);
    assert_true(fcntl(fds[1], F_SETPIPE_SZ, 1 << 20) >= (int)len);
    int rc = cache_block_splice(f->cache, o, block, off, len, fds[1], false,
                                &holds);
    if (rc == 0) {
        while (got < len) {
            ssize_t n = read(fds[0], f->buf + got, len - got);
            assert_true(n > 0);
            got += (size_t)n;
        }
        make_bytes(f->expect, seed, block * cache_block_size(f->cache) + off,
                   len);
        if (memcmp(f->buf, f->expect, len) != 0)
            rc = -1;
    }
    close(fds[0]);
    close(fds[1]);
    cache_holds_release(&holds);
    return rc;
}

/* The data file's pages written to the disk and dropped from memory: the
 * next read of them comes from the disk. */
static void pages_to_disk(const char *path)
{
    int fd = open(path, O_RDWR);

    assert_true(fd >= 0);
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* Spliced reads of a block this process just filled, whose pages are
 * still dirty, are served without the second hash (unhashed_bytes); once
 * the pages were written back, or the cache was reopened, they are
 * hashed again, and a byte damaged on the disk is found and the block
 * dropped; a block once read with clean pages is hashed from then on,
 * even with dirty ones. Without cachestat(2) nothing is unhashed, and
 * the rest holds.
 * Skipped on tmpfs, whose pages are never written back. */
static void test_splice_fresh_block(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size; /* 256 KiB: four pieces */
    struct cache_object *o = NULL;
    bool kernel_tells = unit_kernel_has_cachestat();
    struct statfs fs;
    char path[256];

    assert_int_equal(statfs(f->dir, &fs), 0);
    if (fs.f_type == TMPFS_MAGIC)
        skip();
    o = open_object(f, "fresh", ETAG, 4ull * bs);

    for (uint64_t b = 0; b < 4; b++)
        store(f, o, b, 51);
    only_data_file(f, path);

    /* just written: the whole block and a part of one piece; unhashed
     * when their pages are still dirty after the reads (then they were
     * during them: a sync anyone runs meanwhile may have cleaned them) */
    struct cache_stats before = stats(f);
    assert_int_equal(splice_check(f, o, 0, 0, bs, 51), 0);
    assert_int_equal(splice_check(f, o, 1, PIECE + 10, 100, 51), 0);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    uint64_t surely = (unit_pages_dirty(fd, 0, bs) ? bs : 0) +
                      (unit_pages_dirty(fd, bs + PIECE, PIECE) ? 100 : 0);
    close(fd);
    uint64_t unhashed = stats(f).unhashed_bytes - before.unhashed_bytes;
    assert_true(unhashed >= surely && unhashed <= (kernel_tells ? bs + 100 : 0));
    if (kernel_tells && surely == 0)
        print_message("  (the pages were written back meanwhile)\n");
    assert_int_equal(stats(f).served_bytes - before.served_bytes, bs + 100);

    /* written back and read again from the disk: hashed, and a byte
     * flipped there is found */
    fd = open(path, O_RDWR);
    unsigned char byte;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &byte, 1, 2 * (off_t)bs + PIECE + 7), 1);
    byte ^= 0x40;
    assert_int_equal(pwrite(fd, &byte, 1, 2 * (off_t)bs + PIECE + 7), 1);
    close(fd);
    pages_to_disk(path);
    before = stats(f);
    assert_int_equal(splice_check(f, o, 0, 0, bs, 51), 0);
    assert_int_equal(splice_check(f, o, 2, 0, PIECE, 51), 0); /* piece 0 is good */
    assert_int_equal(splice_check(f, o, 2, 0, bs, 51), EAGAIN);
    struct cache_stats after = stats(f);
    assert_int_equal(after.unhashed_bytes, before.unhashed_bytes);
    assert_int_equal(after.corrupt_blocks - before.corrupt_blocks, 1);
    assert_false(cache_block_present(f->cache, o, 2));

    /* a block once found clean is not trusted again, though its pages be
     * dirty once more: a byte flipped in memory (block 0, read above
     * after the write-back) is found */
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, f->scratch, bs, 0), (ssize_t)bs);
    f->scratch[100] ^= 0x01;
    assert_int_equal(pwrite(fd, f->scratch, bs, 0), (ssize_t)bs); /* all dirty */
    close(fd);
    before = stats(f);
    assert_int_equal(splice_check(f, o, 0, 0, bs, 51), EAGAIN);
    after = stats(f);
    assert_int_equal(after.unhashed_bytes, before.unhashed_bytes);
    assert_int_equal(after.corrupt_blocks - before.corrupt_blocks, 1);
    store(f, o, 0, 51);

    /* filled again: fresh again, and right */
    store(f, o, 2, 51);
    before = stats(f);
    assert_int_equal(splice_check(f, o, 2, 0, bs, 51), 0);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    surely = unit_pages_dirty(fd, 2ull * bs, bs) ? bs : 0;
    close(fd);
    unhashed = stats(f).unhashed_bytes - before.unhashed_bytes;
    assert_true(unhashed >= surely && unhashed <= (kernel_tells ? bs : 0));

    /* a block another mount of the cache filled is hashed, dirty or not */
    cache_object_close(f->cache, &o);
    cache_restart(f);
    o = open_object(f, "fresh", ETAG, 4ull * bs);
    before = stats(f);
    for (uint64_t b = 0; b < 4; b++)
        assert_int_equal(splice_check(f, o, b, 0, bs, 51), 0);
    assert_int_equal(stats(f).unhashed_bytes, before.unhashed_bytes);
    assert_int_equal(stats(f).corrupt_blocks, before.corrupt_blocks);
    cache_object_close(f->cache, &o);
}

/* ------------------------------------------------------------ versions */

struct version_case {
    const char *name;
    const char *etag;
    uint64_t size_delta;  /* added to the old size */
};

static const struct version_case version_cases[] = {
    {"new ETag", "\"fedcba9876543210\"", 0},
    {"new size", ETAG, 1},
    {"new ETag and size", "\"fedcba9876543210-2\"", 12345},
};

static void test_versions(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t size = 2ull * bs;

    for (size_t i = 0; i < ARRAY_LEN(version_cases); i++) {
        const struct version_case *c = &version_cases[i];
        char old_path[256], paths[4][256];
        struct cache_object *o, *other;
        struct stat st;

        print_message("  %s\n", c->name);
        cache_wipe(f);
        /* another key, untouched by the version change */
        other = open_object(f, "versions/other", ETAG, bs);
        store(f, other, 0, 50);
        cache_object_close(f->cache, &other);
        only_data_file(f, old_path); /* for now, the other key's */

        o = open_object(f, "versions/key", ETAG, size);
        store(f, o, 0, 51);
        store(f, o, 1, 51);
        cache_object_close(f->cache, &o);
        assert_int_equal(stats(f).used_bytes, 3ull * bs);
        assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 2);
        strcpy(old_path, strcmp(paths[0], old_path) != 0 ? paths[0] : paths[1]);

        o = open_object(f, "versions/key", c->etag, size + c->size_delta);
        assert_false(cache_block_present(f->cache, o, 0));
        assert_false(cache_block_present(f->cache, o, 1));
        expect_read_error(f, o, 0, 0, bs, ENOENT);
        assert_int_equal(stats(f).used_bytes, bs);
        assert_int_equal(stats(f).blocks, 1);
        /* the old version's file is gone (it was not open) */
        assert_int_equal(stat(old_path, &st), -1);
        assert_int_equal(errno, ENOENT);

        store(f, o, 0, 52);
        expect_read(f, o, 0, 0, bs, 52);
        cache_object_close(f->cache, &o);

        /* back to the first version: nothing of either is served */
        o = open_object(f, "versions/key", ETAG, size);
        assert_false(cache_block_present(f->cache, o, 0));
        assert_false(cache_block_present(f->cache, o, 1));
        expect_read_error(f, o, 0, 0, bs, ENOENT);
        cache_object_close(f->cache, &o);

        other = open_object(f, "versions/other", ETAG, bs);
        expect_read(f, other, 0, 0, bs, 50);
        cache_object_close(f->cache, &other);
        assert_int_equal(stats(f).used_bytes, bs);
        assert_int_equal(stats(f).blocks, 1);
    }
}

/*
 * A version replaced while a handle on it is open: the handle serves
 * nothing more, and once it is closed the old data file is gone (or at
 * least holds no data): its bytes are outside used_bytes and the bound.
 */
static void test_replaced_open_version(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *old, *cur;
    struct cache_fill *fill = NULL;
    char old_path[256];
    struct stat st;

    old = open_object(f, "busy", ETAG, 4ull * bs);
    for (uint64_t b = 0; b < 3; b++)
        store(f, old, b, 61);
    only_data_file(f, old_path);
    /* a fill in flight on the old version when it is replaced */
    assert_int_equal(cache_fill_begin(f->cache, old, 3, &fill), 0);

    cur = open_object(f, "busy", "\"new\"", 4ull * bs);
    assert_true(cache_object_id(cur) != cache_object_id(old));
    expect_read_error(f, old, 0, 0, bs, ENOENT);
    assert_int_equal(stats(f).used_bytes, 0);
    assert_int_equal(stats(f).blocks, 0);
    store(f, cur, 0, 62);
    expect_read(f, cur, 0, 0, bs, 62);

    /* whatever the late fill does, the new version never sees its bytes */
    make_bytes(f->scratch, 61, 3ull * bs, bs);
    assert_int_equal(cache_fill_write(fill, f->scratch, bs), 0);
    (void)cache_fill_commit(&fill);
    assert_null(fill);
    assert_false(cache_block_present(f->cache, cur, 3));
    expect_read_error(f, cur, 3, 0, bs, ENOENT);

    cache_object_close(f->cache, &old);
    assert_false(stat(old_path, &st) == 0 && st.st_blocks > 0);
    expect_read(f, cur, 0, 0, bs, 62);
    cache_object_close(f->cache, &cur);
}

/* Blocks survive cache_close/cache_open; buckets are separate namespaces. */
static void test_persistence(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t size = 3ull * bs - 100;
    struct cache_object *o = open_object(f, "persist/a", ETAG, size);
    struct cache_stats before, after;

    for (uint64_t b = 0; b < 3; b++)
        store(f, o, b, 71);
    cache_object_close(f->cache, &o);
    before = stats(f);

    cache_restart(f);
    after = stats(f);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.used_bytes, before.used_bytes);
    o = open_object(f, "persist/a", ETAG, size);
    for (uint64_t b = 0; b < 3; b++) {
        assert_true(cache_block_present(f->cache, o, b));
        expect_read(f, o, b, 0, cache_object_block_len(o, b), 71);
    }
    cache_object_close(f->cache, &o);

    /* same directory, another bucket: the key is not the same object */
    f->conf.bucket = "another-bucket";
    cache_restart(f);
    o = open_object(f, "persist/a", ETAG, size);
    assert_false(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);

    f->conf.bucket = "test-bucket";
    cache_restart(f);
    o = open_object(f, "persist/a", ETAG, size);
    expect_read(f, o, 2, 0, cache_object_block_len(o, 2), 71);
    cache_object_close(f->cache, &o);
}

/* -------------------------------------------------------------- bounds */

static void check_bound(struct fixture *f)
{
    struct cache_stats s = stats(f);

    if (s.used_bytes > f->conf.size_limit)
        fail_msg("used_bytes %llu over the limit %llu",
                 (unsigned long long)s.used_bytes,
                 (unsigned long long)f->conf.size_limit);
}

static void test_bounds(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t big_size = 20ull * bs + 777;
    struct cache_object *o;
    struct cache_stats s;
    char paths[8][256];

    f->conf.size_limit = 8ull * bs;
    cache_restart(f);

    for (unsigned obj = 0; obj < 3; obj++) {
        char key[32];
        snprintf(key, sizeof(key), "bounds/%u", obj);
        o = open_object(f, key, ETAG, 10ull * bs);
        for (uint64_t b = 0; b < 10; b++) {
            store(f, o, b, 80 + obj);
            check_bound(f);
            s = stats(f);
            assert_true(s.blocks <= 8);
            assert_int_equal(s.used_bytes, s.blocks * bs);
        }
        cache_object_close(f->cache, &o);
    }
    s = stats(f);
    assert_int_equal(s.blocks, 8);
    assert_int_equal(s.evicted_blocks, 30 - 8);
    assert_int_equal(s.stored_bytes, 30ull * bs);
    /* objects whose blocks all went are forgotten, files and all */
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 1);

    /* the last 8 blocks stored are the ones kept */
    o = open_object(f, "bounds/2", ETAG, 10ull * bs);
    for (uint64_t b = 0; b < 10; b++) {
        if (b < 2)
            assert_false(cache_block_present(f->cache, o, b));
        else
            expect_read(f, o, b, 0, bs, 82);
    }
    cache_object_close(f->cache, &o);

    /* a file larger than the cache: store, read, store, read... */
    o = open_object(f, "bounds/big", ETAG, big_size);
    for (uint64_t b = 0; b < cache_object_blocks(o); b++) {
        store(f, o, b, 89);
        check_bound(f);
        expect_read(f, o, b, 0, cache_object_block_len(o, b), 89);
    }
    assert_false(cache_block_present(f->cache, o, 0));
    assert_true(cache_block_present(f->cache, o, 20));
    s = stats(f);
    assert_true(s.blocks <= 8);
    assert_int_equal(s.used_bytes, (s.blocks - 1) * bs + rounded(777));
    cache_object_close(f->cache, &o);
}

/* ---------------------------------------------------- scan resistance */

struct scan_case {
    const char *name;
    unsigned hot_blocks;
    unsigned hot_reads;     /* first-touch reads of each hot block */
    unsigned hot_survive;   /* the last this many hot blocks stay */
};

static const struct scan_case scan_cases[] = {
    /* re-used blocks are protected from a scan */
    {"4 hot blocks read twice", 4, 2, 4},
    {"4 hot blocks read once", 4, 1, 4},
    /* control: never re-used, they age out like the scan */
    {"4 blocks never read", 4, 0, 0},
    /* protected is held to 80% of the cache: 6 of 8 blocks */
    {"8 hot blocks read twice", 8, 2, 6},
};

static void test_scan_resistance(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    const unsigned cache_blocks = 8, scan_blocks = 20;

    f->conf.size_limit = (uint64_t)cache_blocks * bs;
    for (size_t i = 0; i < ARRAY_LEN(scan_cases); i++) {
        const struct scan_case *c = &scan_cases[i];
        struct cache_object *hot, *scan;
        char hot_key[32], scan_key[32];
        unsigned survivors = 0, scan_kept = 0;

        print_message("  %s\n", c->name);
        cache_wipe(f);
        snprintf(hot_key, sizeof(hot_key), "hot/%zu", i);
        snprintf(scan_key, sizeof(scan_key), "scan/%zu", i);

        hot = open_object(f, hot_key, ETAG, (uint64_t)c->hot_blocks * bs);
        for (unsigned b = 0; b < c->hot_blocks; b++)
            store(f, hot, b, 90);
        for (unsigned b = 0; b < c->hot_blocks; b++) {
            for (unsigned r = 0; r < c->hot_reads; r++) {
                int rc = read_raw(f->cache, hot, b, 0, bs, 90, true, f->buf,
                                  f->expect);
                assert_int_equal(rc, 0);
            }
        }
        assert_int_equal(cache_flush(f->cache), 0);

        scan = open_object(f, scan_key, ETAG, (uint64_t)scan_blocks * bs);
        for (unsigned b = 0; b < scan_blocks; b++) {
            store(f, scan, b, 91);
            check_bound(f);
        }

        for (unsigned b = 0; b < c->hot_blocks; b++) {
            bool present = cache_block_present(f->cache, hot, b);
            bool expected = b >= c->hot_blocks - c->hot_survive;
            if (present != expected)
                fail_msg("%s: hot block %u is%s present", c->name, b,
                         present ? "" : " not");
            survivors += present;
        }
        for (unsigned b = 0; b < scan_blocks; b++) {
            bool present = cache_block_present(f->cache, scan, b);
            /* the newest scan blocks fill what the hot ones left */
            bool expected = b >= scan_blocks - (cache_blocks - survivors);
            if (present != expected)
                fail_msg("%s: scan block %u is%s present", c->name, b,
                         present ? "" : " not");
            scan_kept += present;
        }
        assert_int_equal(stats(f).blocks, survivors + scan_kept);
        for (unsigned b = c->hot_blocks - c->hot_survive; b < c->hot_blocks; b++)
            expect_read(f, hot, b, 0, bs, 90);
        cache_object_close(f->cache, &hot);
        cache_object_close(f->cache, &scan);
    }
}

/*
 * A hit by a reader that had not read the block just before updates its
 * recency (cache.h): block 0, read just before the cache fills, outlives
 * block 1.
 */
static void test_hit_updates_recency(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o;
    char *buf = malloc(bs);

    assert_non_null(buf);
    f->conf.size_limit = 4ull * bs;
    cache_restart(f);
    o = open_object(f, "recency", ETAG, 5ull * bs);
    for (uint64_t b = 0; b < 4; b++)
        store(f, o, b, 95);
    assert_int_equal(cache_block_read(f->cache, o, 0, 0, bs, buf, true), 0);
    assert_int_equal(cache_flush(f->cache), 0);
    store(f, o, 4, 95);
    assert_int_equal(stats(f).blocks, 4);
    assert_true(cache_block_present(f->cache, o, 0));
    assert_false(cache_block_present(f->cache, o, 1));
    cache_object_close(f->cache, &o);
    free(buf);
}

/* ------------------------------------------------------- read buffers */

/* Bytes of heap in use (0 when it cannot be told). */
static size_t heap_in_use(void)
{
#if defined(TEST_ASAN)
    return __sanitizer_get_current_allocated_bytes();
#elif defined(__GLIBC__)
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
#else
    return 0;
#endif
}

/*
 * cache_close() frees the read buffers of threads still alive (here the
 * main thread's, each round): pthread_key_delete() alone would not.
 */
static void test_close_frees_read_buffers(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    const unsigned rounds = 8;
    struct cache_object *o = open_object(f, "buffers", ETAG, bs);
    size_t before, after;

    store(f, o, 0, 130);
    expect_read(f, o, 0, 0, bs, 130);
    cache_object_close(f->cache, &o);
    cache_restart(f);
    before = heap_in_use();
    for (unsigned i = 0; i < rounds; i++) {
        o = open_object(f, "buffers", ETAG, bs);
        expect_read(f, o, 0, 0, bs, 130);
        cache_object_close(f->cache, &o);
        cache_restart(f);
    }
    after = heap_in_use();
    if (after > before && after - before >= (size_t)rounds / 2 * bs)
        fail_msg("%zu bytes of heap kept after %u rounds of open, read, close",
                 after - before, rounds);
}

/* ------------------------------------------------------------- locking */

static void test_lock(void **state)
{
    struct fixture *f = *state;
    char err[512] = "", pid[32], lock_path[128], holder[64];
    int first = -1, second = -1, third = -1;
    int rc;

    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(lock_path, sizeof(lock_path), "%s/lock", f->dir);

    /* the open cache holds the lock */
    rc = cache_lock_dir(f->dir, &second, err, sizeof(err));
    assert_int_equal(rc, EWOULDBLOCK);
    assert_int_equal(second, -1);
    assert_non_null(strstr(err, "in use"));
    read_text_file(lock_path, holder, sizeof(holder));
    holder[strcspn(holder, "\n")] = '\0';
    assert_string_equal(holder, pid);

    /* closing the cache releases it */
    cache_stop(f);
    err[0] = '\0';
    assert_int_equal(cache_lock_dir(f->dir, &first, err, sizeof(err)), 0);
    assert_true(first >= 0);

    err[0] = '\0';
    rc = cache_lock_dir(f->dir, &second, err, sizeof(err));
    assert_int_equal(rc, EWOULDBLOCK);
    assert_int_equal(second, -1);
    assert_non_null(strstr(err, "in use"));
    assert_non_null(strstr(err, pid)); /* names the holder */

    close(first);
    assert_int_equal(cache_lock_dir(f->dir, &third, err, sizeof(err)), 0);
    assert_true(third >= 0);

    /* a lock taken by hand is handed to cache_open */
    rc = cache_open(&f->conf, third, &f->cache, err, sizeof(err));
    if (rc != 0) {
        close(third);
        fail_msg("cache_open: %s", err);
    }

    /* a directory that cannot be created */
    second = -1;
    err[0] = '\0';
    rc = cache_lock_dir("/proc/no/such/dir", &second, err, sizeof(err));
    assert_int_not_equal(rc, 0);
    assert_int_equal(second, -1);
    assert_true(strlen(err) > 0);
}

/* ------------------------------------------------- crash detection */

struct crash_case {
    const char *name;
    bool this_boot;       /* the state names the current boot */
    const char *word;     /* "open" or "clean"; NULL: no state file */
    bool emptied;
};

static const struct crash_case crash_cases[] = {
    {"another boot, left open (machine crash)", false, "open", true},
    {"this boot, left open (kill -9)", true, "open", false},
    {"another boot, closed cleanly", false, "clean", false},
    {"no state file", true, NULL, false},
};

static void test_crash_detection(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    char boot_id[64], other_boot[64], state_path[128], text[256], line[256];
    char paths[4][256];

    read_boot_id(boot_id, sizeof(boot_id));
    snprintf(other_boot, sizeof(other_boot), "%s", boot_id);
    other_boot[0] = other_boot[0] == '0' ? '1' : '0';
    snprintf(state_path, sizeof(state_path), "%s/state", f->dir);

    for (size_t i = 0; i < ARRAY_LEN(crash_cases); i++) {
        const struct crash_case *c = &crash_cases[i];
        struct cache_object *o;
        struct cache_stats s;

        print_message("  %s\n", c->name);
        cache_wipe(f);
        o = open_object(f, "crash", ETAG, 2ull * bs);
        store(f, o, 0, 100 + (uint32_t)i);
        store(f, o, 1, 100 + (uint32_t)i);
        cache_object_close(f->cache, &o);

        /* while open the state says so; a clean close says that */
        snprintf(line, sizeof(line), "%s open\n", boot_id);
        read_text_file(state_path, text, sizeof(text));
        assert_string_equal(text, line);
        cache_stop(f);
        snprintf(line, sizeof(line), "%s clean\n", boot_id);
        read_text_file(state_path, text, sizeof(text));
        assert_string_equal(text, line);

        if (c->word != NULL) {
            snprintf(line, sizeof(line), "%s %s\n",
                     c->this_boot ? boot_id : other_boot, c->word);
            write_text_file(state_path, line);
        } else {
            assert_int_equal(unlink(state_path), 0);
        }

        cache_start(f);
        s = stats(f);
        if (c->emptied) {
            assert_int_equal(s.blocks, 0);
            assert_int_equal(s.used_bytes, 0);
            assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 0);
        } else {
            assert_int_equal(s.blocks, 2);
            assert_int_equal(s.used_bytes, 2ull * bs);
        }
        o = open_object(f, "crash", ETAG, 2ull * bs);
        for (uint64_t b = 0; b < 2; b++) {
            if (c->emptied)
                expect_missing(f, o, b);
            else
                expect_read(f, o, b, 0, bs, 100 + (uint32_t)i);
        }
        /* usable either way */
        store(f, o, 1, 200);
        expect_read(f, o, 1, 0, bs, 200);
        cache_object_close(f->cache, &o);
    }
}

/* --------------------------------------------------- block size change */

static void test_block_size_change(void **state)
{
    struct fixture *f = *state;
    uint64_t size = 3ull * SMALL_BLOCK;
    struct cache_object *o;
    struct cache_stats s;
    char paths[4][256];

    o = open_object(f, "resize", ETAG, size);
    for (uint64_t b = 0; b < 3; b++)
        store(f, o, b, 110);
    cache_object_close(f->cache, &o);
    assert_int_equal(stats(f).blocks, 3);

    f->conf.block_size = LARGE_BLOCK;
    cache_restart(f);
    assert_int_equal(cache_block_size(f->cache), LARGE_BLOCK);
    s = stats(f);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 0);

    o = open_object(f, "resize", ETAG, size);
    assert_int_equal(cache_object_blocks(o), 1);
    assert_int_equal(cache_object_block_len(o, 0), size);
    expect_missing(f, o, 0);
    store(f, o, 0, 110);
    expect_read(f, o, 0, 0, (uint32_t)size, 110);
    expect_read(f, o, 0, PIECE - 5, PIECE + 10, 110);
    cache_object_close(f->cache, &o);

    f->conf.block_size = SMALL_BLOCK;
    cache_restart(f);
    assert_int_equal(stats(f).blocks, 0);
    o = open_object(f, "resize", ETAG, size);
    for (uint64_t b = 0; b < 3; b++)
        expect_missing(f, o, b);
    store(f, o, 2, 110);
    expect_read(f, o, 2, 0, SMALL_BLOCK, 110);
    cache_object_close(f->cache, &o);
}

/* ------------------------------------------------------------ min_free */

struct min_free_case {
    const char *name;
    double ratio;
    uint64_t bytes;
};

static const struct min_free_case min_free_cases[] = {
    {"min_free_ratio 1.0", 1.0, 0},
    {"min_free_bytes 4 EiB", 0.0, 1ull << 62},
};

static void test_min_free(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;

    for (size_t i = 0; i < ARRAY_LEN(min_free_cases); i++) {
        const struct min_free_case *c = &min_free_cases[i];
        struct cache_object *o, *closed;
        struct cache_fill *fill = NULL;
        struct cache_stats s;

        print_message("  %s\n", c->name);
        f->conf.min_free_ratio = 0.0;
        f->conf.min_free_bytes = 0;
        cache_wipe(f);
        o = open_object(f, "min_free/open", ETAG, 3ull * bs);
        closed = open_object(f, "min_free/closed", ETAG, 2ull * bs);
        for (uint64_t b = 0; b < 3; b++)
            store(f, o, b, 120);
        store(f, closed, 1, 121);
        cache_object_close(f->cache, &o);
        cache_object_close(f->cache, &closed);

        f->conf.min_free_ratio = c->ratio;
        f->conf.min_free_bytes = c->bytes;
        cache_restart(f);
        assert_int_equal(stats(f).blocks, 4);
        o = open_object(f, "min_free/open", ETAG, 3ull * bs);
        assert_int_equal(cache_fill_begin(f->cache, o, 0, &fill), ENOSPC);
        assert_null(fill);
        s = stats(f);
        assert_int_equal(s.blocks, 0);
        assert_int_equal(s.used_bytes, 0);
        assert_int_equal(s.evicted_blocks, 4);
        assert_int_equal(s.stored_bytes, 0);
        for (uint64_t b = 0; b < 3; b++)
            expect_missing(f, o, b);
        /* again: nothing left to evict, still ENOSPC, still consistent */
        assert_int_equal(cache_fill_begin(f->cache, o, 1, &fill), ENOSPC);
        assert_null(fill);
        s = stats(f);
        assert_int_equal(s.blocks, 0);
        assert_int_equal(s.evicted_blocks, 4);
        assert_int_equal(s.corrupt_blocks, 0);
        cache_object_close(f->cache, &o);

        /* reopened without the impossible bound, the cache works */
        f->conf.min_free_ratio = 0.0;
        f->conf.min_free_bytes = 0;
        cache_restart(f);
        assert_int_equal(stats(f).blocks, 0);
        o = open_object(f, "min_free/open", ETAG, 3ull * bs);
        store(f, o, 2, 120);
        expect_read(f, o, 2, 0, bs, 120);
        cache_object_close(f->cache, &o);
    }
}

/* ------------------------------------------------- the write path's needs */

/* DIR/staging/NAME, created with the contents SEED (SIZE bytes). */
static void staging_file(struct fixture *f, const char *name, uint32_t seed,
                         uint64_t size, char path[256])
{
    char dir[128];
    int fd;

    snprintf(dir, sizeof(dir), "%s/staging", f->dir);
    assert_true(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(path, 256, "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    for (uint64_t at = 0; at < size;) {
        size_t n = size - at < MAX_TEST_BLOCK ? (size_t)(size - at) : MAX_TEST_BLOCK;
        make_bytes(f->scratch, seed, at, n);
        assert_int_equal(pwrite(fd, f->scratch, n, (off_t)at), (ssize_t)n);
        at += n;
    }
    assert_int_equal(close(fd), 0);
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Every block of KEY/ETAG (SIZE bytes) is cached with the contents SEED:
 * whole blocks, and a range across a piece boundary. */
static void expect_object(struct fixture *f, const char *key, const char *etag,
                          uint64_t size, uint32_t seed)
{
    struct cache_object *o = open_object(f, key, etag, size);

    for (uint64_t b = 0; b < cache_object_blocks(o); b++) {
        uint32_t len = cache_object_block_len(o, b);
        assert_true(cache_block_present(f->cache, o, b));
        expect_read(f, o, b, 0, len, seed);
        if (len > PIECE + 10)
            expect_read(f, o, b, PIECE - 10, 20, seed);
    }
    cache_object_close(f->cache, &o);
}

/* Files the write path keeps in the cache directory, with their text. */
static const char *const write_path_files[][2] = {
    {"staging", NULL},
    {"staging/0000000000000001", "a staged write"},
    {"staging/ab", NULL},
    {"staging/ab/0123456789abcdef", "shaped like a data file"},
    {"journal", NULL},
    {"journal/data.mdb", "the journal"},
    {"journal/lock.mdb", "its lock"},
    {"data/journal", "misplaced, but a protected name"},
};

static void make_write_path_files(struct fixture *f)
{
    for (size_t i = 0; i < ARRAY_LEN(write_path_files); i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", f->dir, write_path_files[i][0]);
        if (write_path_files[i][1] == NULL)
            assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
        else
            write_text_file(path, write_path_files[i][1]);
    }
}

static void expect_write_path_files(struct fixture *f, const char *when)
{
    for (size_t i = 0; i < ARRAY_LEN(write_path_files); i++) {
        char path[256], text[128];
        snprintf(path, sizeof(path), "%s/%s", f->dir, write_path_files[i][0]);
        if (!file_exists(path))
            fail_msg("%s: %s is gone", when, write_path_files[i][0]);
        if (write_path_files[i][1] != NULL) {
            read_text_file(path, text, sizeof(text));
            assert_string_equal(text, write_path_files[i][1]);
        }
    }
}

/* Write the state file as if the machine had crashed while the cache was
 * open: the next cache_open rebuilds the cache empty. */
static void fake_machine_crash(struct fixture *f)
{
    char boot_id[64], line[128], path[128];

    read_boot_id(boot_id, sizeof(boot_id));
    boot_id[0] = boot_id[0] == '0' ? '1' : '0';
    snprintf(line, sizeof(line), "%s open\n", boot_id);
    snprintf(path, sizeof(path), "%s/state", f->dir);
    write_text_file(path, line);
}

/*
 * cache_dir_path() names the directory, and no way the cache empties
 * itself (a rebuild after a machine crash, a new block size, evicting
 * everything) removes CACHE/staging or CACHE/journal or their contents.
 */
static void test_write_path_files_survive(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o;
    char paths[4][256];

    assert_string_equal(cache_dir_path(f->cache), f->dir);
    make_write_path_files(f);
    o = open_object(f, "survive", ETAG, 2ull * bs);
    store(f, o, 0, 140);
    store(f, o, 1, 140);
    cache_object_close(f->cache, &o);

    cache_stop(f);
    fake_machine_crash(f);
    cache_start(f);
    assert_int_equal(stats(f).blocks, 0);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 0);
    expect_write_path_files(f, "rebuilt after a crash");

    o = open_object(f, "survive", ETAG, 2ull * bs);
    store(f, o, 0, 141);
    cache_object_close(f->cache, &o);
    f->conf.block_size = LARGE_BLOCK;
    cache_restart(f);
    assert_int_equal(stats(f).blocks, 0);
    expect_write_path_files(f, "a new block size");

    o = open_object(f, "survive", ETAG, LARGE_BLOCK);
    store(f, o, 0, 142);
    cache_object_close(f->cache, &o);
    f->conf.min_free_ratio = 1.0;
    cache_restart(f);
    assert_int_equal(cache_reserve_disk(f->cache, 1), ENOSPC);
    assert_int_equal(stats(f).blocks, 0);
    expect_write_path_files(f, "evicting everything");
    f->conf.min_free_ratio = 0.0;
    cache_restart(f);
    expect_write_path_files(f, "reopened");
}

/* Free bytes on the filesystem of PATH, as the cache sees them. */
static uint64_t free_bytes(const char *path)
{
    struct statvfs st;

    assert_int_equal(statvfs(path, &st), 0);
    return (uint64_t)st.f_bavail * st.f_frsize;
}

/* cache_reserve_disk() with bounds that cannot or always hold. */
static void test_reserve_disk_bounds(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o = open_object(f, "reserve", ETAG, 4ull * bs);
    char staged[256];
    struct cache_stats s;

    for (uint64_t b = 0; b < 4; b++)
        store(f, o, b, 150);
    cache_object_close(f->cache, &o);
    staging_file(f, "reserve", 151, 3ull * bs, staged);

    /* no min_free: room enough, nothing evicted */
    assert_int_equal(cache_reserve_disk(f->cache, 1u << 20), 0);
    assert_int_equal(cache_reserve_disk(f->cache, 0), 0);
    assert_int_equal(stats(f).blocks, 4);
    assert_int_equal(stats(f).evicted_blocks, 0);

    /* more than the filesystem has: every clean block goes, then ENOSPC */
    assert_int_equal(cache_reserve_disk(f->cache, 1ull << 62), ENOSPC);
    s = stats(f);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.evicted_blocks, 4);
    /* only cache blocks: the staging file is intact */
    assert_true(file_exists(staged));
    assert_int_equal(cache_adopt_file(f->cache, "reserve", "\"s\"", 3ull * bs,
                                      staged), 0);
    expect_object(f, "reserve", "\"s\"", 3ull * bs, 151);

    /* min_free_bytes out of reach: ENOSPC again, whatever is asked */
    f->conf.min_free_bytes = 1ull << 62;
    cache_restart(f);
    assert_int_equal(cache_reserve_disk(f->cache, 1), ENOSPC);
    assert_int_equal(stats(f).blocks, 0);
    assert_int_equal(cache_reserve_disk(f->cache, UINT64_MAX), ENOSPC);

    /* min_free_ratio: whichever of the two is larger holds */
    f->conf.min_free_bytes = 0;
    f->conf.min_free_ratio = 0.0;
    cache_restart(f);
    assert_int_equal(cache_reserve_disk(f->cache, 4096), 0);
    f->conf.min_free_ratio = 1.0;
    cache_restart(f);
    assert_int_equal(cache_reserve_disk(f->cache, 4096), ENOSPC);
}

/*
 * cache_reserve_disk() evicts just enough, least recently used first,
 * probation before protected. Run on /dev/shm (tmpfs, which frees punched
 * holes at once and which nothing else writes to) so that the free space
 * moves only with what the test does; skipped without it.
 */
static void test_reserve_disk_order(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *hot, *old, *recent, *o;
    char shm_dir[64] = "/dev/shm/test_cache.XXXXXX";
    uint64_t margin, want, before, evicted = 0;
    const uint64_t probation_blocks = 8;

    if (mkdtemp(shm_dir) == NULL) {
        print_message("  no /dev/shm: skipped\n");
        return;
    }
    cache_stop(f);
    unit_remove_tree(f->dir);
    memcpy(f->dir, shm_dir, sizeof(shm_dir)); /* teardown removes it */
    cache_start(f);

    /* two re-used (protected) blocks, the oldest of all, then 4 + 4 in
     * probation */
    hot = open_object(f, "order/hot", ETAG, 2ull * bs);
    store(f, hot, 0, 160);
    store(f, hot, 1, 160);
    expect_read(f, hot, 0, 0, bs, 160);
    expect_read(f, hot, 1, 0, bs, 160);
    for (uint64_t b = 0; b < 2; b++)
        assert_int_equal(cache_block_read(f->cache, hot, b, 0, bs, f->buf, true), 0);
    assert_int_equal(cache_flush(f->cache), 0);
    assert_int_equal(stats(f).protected_bytes, 2ull * bs);
    old = open_object(f, "order/old", ETAG, 4ull * bs);
    recent = open_object(f, "order/recent", ETAG, 4ull * bs);
    for (uint64_t b = 0; b < 4; b++)
        store(f, old, b, 161);
    for (uint64_t b = 0; b < 4; b++)
        store(f, recent, b, 162);
    cache_object_close(f->cache, &hot);
    cache_object_close(f->cache, &old);
    cache_object_close(f->cache, &recent);

    /* min_free just under what is free once the cache is open again */
    cache_stop(f);
    f->conf.min_free_bytes = free_bytes(f->dir) - (1u << 20);
    cache_start(f);
    before = free_bytes(f->dir);
    assert_true(before > f->conf.min_free_bytes);
    margin = before - f->conf.min_free_bytes;
    want = margin + 5ull * bs + bs / 2; /* 5.5 blocks more than there is */
    assert_int_equal(cache_reserve_disk(f->cache, want), 0);
    assert_true(free_bytes(f->dir) >= f->conf.min_free_bytes + want);

    /* the evicted blocks are the oldest of probation, in order */
    old = open_object(f, "order/old", ETAG, 4ull * bs);
    recent = open_object(f, "order/recent", ETAG, 4ull * bs);
    for (uint64_t i = 0; i < probation_blocks; i++) {
        o = i < 4 ? old : recent;
        bool present = cache_block_present(f->cache, o, i % 4);
        if (!present && evicted < i)
            fail_msg("probation block %llu evicted, but not block %llu "
                     "stored before it", (unsigned long long)i,
                     (unsigned long long)evicted);
        evicted += !present;
    }
    print_message("  %llu blocks evicted for 5.5 blocks of room\n",
                  (unsigned long long)evicted);
    /* 6 blocks at least; a little more if the index grew meanwhile */
    if (evicted < 6 || evicted > probation_blocks)
        fail_msg("%llu blocks evicted for 5.5 blocks of room",
                 (unsigned long long)evicted);
    for (uint64_t i = evicted; i < probation_blocks; i++)
        expect_read(f, i < 4 ? old : recent, i % 4, 0, bs, i < 4 ? 161 : 162);
    cache_object_close(f->cache, &old);
    cache_object_close(f->cache, &recent);
    hot = open_object(f, "order/hot", ETAG, 2ull * bs);
    expect_read(f, hot, 0, 0, bs, 160);
    expect_read(f, hot, 1, 0, bs, 160);
    cache_object_close(f->cache, &hot);
    assert_int_equal(stats(f).evicted_blocks, evicted);
}

/* A staged file becomes the cached version: every byte reads back. */
static void test_adopt(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t size = 3ull * bs + PIECE + 1234; /* a short last block */
    uint64_t blocks = (size + bs - 1) / bs;
    char staged[256], paths[4][256];
    struct cache_object *o;
    struct cache_stats s;

    staging_file(f, "adopt-1", 170, size, staged);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/a", ETAG, size, staged), 0);
    assert_false(file_exists(staged));
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 1);
    s = stats(f);
    assert_int_equal(s.blocks, blocks);
    assert_int_equal(s.used_bytes, (blocks - 1) * bs +
                                   rounded(size - (blocks - 1) * bs));
    assert_int_equal(s.protected_bytes, 0);
    assert_int_equal(s.stored_bytes, size);
    expect_object(f, "adopt/a", ETAG, size, 170);

    /* it persists like any other version */
    cache_restart(f);
    expect_object(f, "adopt/a", ETAG, size, 170);

    /* the same key, a new ETag: the old version goes, even while open */
    o = open_object(f, "adopt/a", ETAG, size);
    staging_file(f, "adopt-2", 171, 2ull * bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/a", "\"v2\"", 2ull * bs,
                                      staged), 0);
    expect_missing(f, o, 0);
    expect_missing(f, o, blocks - 1);
    expect_object(f, "adopt/a", "\"v2\"", 2ull * bs, 171);
    cache_object_close(f->cache, &o);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 1);
    s = stats(f);
    assert_int_equal(s.blocks, 2);
    assert_int_equal(s.used_bytes, 2ull * bs);
    o = open_object(f, "adopt/a", ETAG, size);
    assert_false(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);

    /* the same key and ETag again (a repeated upload): replaced */
    staging_file(f, "adopt-3", 171, 2ull * bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/a", "\"v2\"", 2ull * bs,
                                      staged), 0);
    expect_object(f, "adopt/a", "\"v2\"", 2ull * bs, 171);
    assert_int_equal(stats(f).blocks, 2);

    /* an empty object */
    staging_file(f, "adopt-4", 172, 0, staged);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/empty", ETAG, 0, staged), 0);
    assert_false(file_exists(staged));
    o = open_object(f, "adopt/empty", ETAG, 0);
    assert_int_equal(cache_object_blocks(o), 0);
    cache_object_close(f->cache, &o);
    assert_int_equal(stats(f).blocks, 2);

    /* a size that is not the file's, a missing file: nothing changes */
    staging_file(f, "adopt-5", 173, bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/a", "\"v3\"", bs + 1,
                                      staged), EINVAL);
    assert_true(file_exists(staged));
    expect_object(f, "adopt/a", "\"v2\"", 2ull * bs, 171);
    assert_int_equal(cache_adopt_file(f->cache, "adopt/a", "\"v3\"", bs,
                                      "/nonexistent/staged"), ENOENT);
    expect_object(f, "adopt/a", "\"v2\"", 2ull * bs, 171);
}

/* Adopting makes room like fills do; too big for the cache: ENOSPC. */
static void test_adopt_room(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o;
    char staged[256];
    struct cache_stats s;

    f->conf.size_limit = 8ull * bs;
    cache_restart(f);
    o = open_object(f, "room/other", ETAG, 6ull * bs);
    for (uint64_t b = 0; b < 6; b++)
        store(f, o, b, 180);
    cache_object_close(f->cache, &o);

    /* bigger than cache_size: ENOSPC, the file stays, nothing evicted */
    staging_file(f, "room-big", 181, 8ull * bs + 1, staged);
    assert_int_equal(cache_adopt_file(f->cache, "room/big", ETAG, 8ull * bs + 1,
                                      staged), ENOSPC);
    assert_true(file_exists(staged));
    s = stats(f);
    assert_int_equal(s.blocks, 6);
    assert_int_equal(s.evicted_blocks, 0);

    /* 5 blocks into a cache holding 6 of 8: the 3 oldest go */
    staging_file(f, "room-fit", 182, 5ull * bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "room/fit", ETAG, 5ull * bs,
                                      staged), 0);
    check_bound(f);
    s = stats(f);
    assert_int_equal(s.blocks, 8);
    assert_int_equal(s.evicted_blocks, 3);
    expect_object(f, "room/fit", ETAG, 5ull * bs, 182);
    o = open_object(f, "room/other", ETAG, 6ull * bs);
    for (uint64_t b = 0; b < 6; b++)
        assert_int_equal(cache_block_present(f->cache, o, b), b >= 3);
    expect_read(f, o, 5, 0, bs, 180);
    cache_object_close(f->cache, &o);

    /* a new version of a key may use its old version's room: nothing
     * else goes */
    staging_file(f, "room-again", 183, 5ull * bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "room/fit", "\"v2\"", 5ull * bs,
                                      staged), 0);
    s = stats(f);
    assert_int_equal(s.evicted_blocks, 3);
    assert_int_equal(s.blocks, 8);
    expect_object(f, "room/fit", "\"v2\"", 5ull * bs, 183);
    check_bound(f);

    /* exactly cache_size: everything else goes */
    staging_file(f, "room-all", 184, 8ull * bs, staged);
    assert_int_equal(cache_adopt_file(f->cache, "room/all", ETAG, 8ull * bs,
                                      staged), 0);
    s = stats(f);
    assert_int_equal(s.blocks, 8);
    assert_int_equal(s.used_bytes, 8ull * bs);
    expect_object(f, "room/all", ETAG, 8ull * bs, 184);
}

/* A rename re-keys the cached version without copying a byte. */
static void test_rename_object(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    uint64_t size = 3ull * bs - 7;
    struct cache_object *reader, *o;
    char before_path[256], after_path[256], paths[4][256];
    struct cache_stats s;

    o = open_object(f, "mv/from", ETAG, size);
    for (uint64_t b = 0; b < 3; b++)
        store(f, o, b, 190);
    cache_object_close(f->cache, &o);
    only_data_file(f, before_path);
    /* a reader of the old name keeps its handle across the rename */
    reader = open_object(f, "mv/from", ETAG, size);
    /* the new name had a version of its own */
    o = open_object(f, "mv/to", "\"old-to\"", bs);
    store(f, o, 0, 191);
    cache_object_close(f->cache, &o);

    assert_int_equal(cache_rename_object(f->cache, "mv/from", "\"wrong\"",
                                         "mv/to", "\"new\""), ENOENT);
    assert_int_equal(cache_rename_object(f->cache, "mv/none", ETAG, "mv/to",
                                         "\"new\""), ENOENT);
    assert_int_equal(stats(f).blocks, 4);

    assert_int_equal(cache_rename_object(f->cache, "mv/from", ETAG, "mv/to",
                                         "\"new\""), 0);
    s = stats(f);
    assert_int_equal(s.blocks, 3);
    assert_int_equal(s.used_bytes, 2ull * bs + rounded(bs - 7));
    expect_object(f, "mv/to", "\"new\"", size, 190);
    for (uint64_t b = 0; b < 3; b++)
        expect_read(f, reader, b, 0, cache_object_block_len(reader, b), 190);
    cache_object_close(f->cache, &reader);
    /* same data file, no copy; the new name's old version is gone */
    only_data_file(f, after_path);
    assert_string_equal(before_path, after_path);

    /* the old name has nothing cached any more */
    assert_int_equal(cache_rename_object(f->cache, "mv/from", ETAG, "mv/x",
                                         ETAG), ENOENT);
    o = open_object(f, "mv/from", ETAG, size);
    assert_false(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);
    assert_int_equal(stats(f).blocks, 3);

    /* a new ETag on the same key (a copy onto itself) */
    assert_int_equal(cache_rename_object(f->cache, "mv/to", "\"new\"", "mv/to",
                                         "\"newer\""), 0);
    expect_object(f, "mv/to", "\"newer\"", size, 190);
    cache_restart(f);
    expect_object(f, "mv/to", "\"newer\"", size, 190);
    o = open_object(f, "mv/to", "\"new\"", size);
    assert_false(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 2); /* + "from" */
}

/* A deleted object's blocks go; an open handle then reads nothing. */
static void test_forget_key(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o, *keep;
    char paths[4][256];
    struct cache_stats s;

    assert_int_equal(cache_forget_key(f->cache, "forget/none"), 0);
    keep = open_object(f, "forget/keep", ETAG, bs);
    store(f, keep, 0, 200);
    cache_object_close(f->cache, &keep);
    o = open_object(f, "forget/a", ETAG, 2ull * bs);
    store(f, o, 0, 201);
    store(f, o, 1, 201);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 2);

    assert_int_equal(cache_forget_key(f->cache, "forget/a"), 0);
    s = stats(f);
    assert_int_equal(s.blocks, 1);
    assert_int_equal(s.used_bytes, bs);
    expect_missing(f, o, 0);
    expect_missing(f, o, 1);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 2); /* still open */
    cache_object_close(f->cache, &o);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 1);
    assert_int_equal(cache_forget_key(f->cache, "forget/a"), 0);

    cache_restart(f);
    o = open_object(f, "forget/a", ETAG, 2ull * bs);
    assert_false(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);
    expect_object(f, "forget/keep", ETAG, bs, 200);
    assert_int_equal(stats(f).blocks, 1);
}

/* --------------------------------------------- adopting under readers */

#define ADOPT_ROUNDS 24
#define ADOPT_READERS 3

struct adopt_reader {
    struct cache *cache;
    _Atomic unsigned *generation;
    _Atomic bool *stop;
    unsigned reads, misses, failures;
    char first_failure[160];
};

static uint64_t adopt_size(unsigned generation, uint32_t bs)
{
    return (uint64_t)(1 + generation % 3) * bs + generation * 100u;
}

static void adopt_etag(unsigned generation, char etag[32])
{
    snprintf(etag, 32, "\"gen-%u\"", generation);
}

static void *adopt_reader_main(void *arg)
{
    struct adopt_reader *r = arg;
    uint32_t bs = cache_block_size(r->cache);
    char *buf = malloc(bs), *expect = malloc(bs);

    while (buf != NULL && expect != NULL && !atomic_load(r->stop)) {
        unsigned g = atomic_load(r->generation);
        struct cache_object *o = NULL;
        char etag[32];
        int rc;

        if (g == 0)
            continue;
        adopt_etag(g, etag);
        rc = cache_object_open(r->cache, "adopted", etag, adopt_size(g, bs), &o);
        if (rc != 0) {
            if (r->failures++ == 0)
                snprintf(r->first_failure, sizeof(r->first_failure),
                         "open gen %u: %s", g, strerror(rc));
            continue;
        }
        for (uint64_t b = 0; b < cache_object_blocks(o); b++) {
            rc = read_raw(r->cache, o, b, 0, cache_object_block_len(o, b),
                          300 + g, b % 2 == 0, buf, expect);
            if (rc == 0)
                r->reads++;
            else if (rc == ENOENT)
                r->misses++;
            else if (r->failures++ == 0)
                snprintf(r->first_failure, sizeof(r->first_failure),
                         "gen %u block %llu: %s", g, (unsigned long long)b,
                         rc > 0 ? strerror(rc) : "wrong bytes");
        }
        cache_object_close(r->cache, &o);
    }
    free(buf);
    free(expect);
    return NULL;
}

/*
 * New versions of a key adopted while readers open whatever version is
 * current and read it: never a wrong byte, and once everything is
 * closed the usage record matches what is recorded.
 */
static void test_adopt_under_readers(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct adopt_reader readers[ADOPT_READERS];
    pthread_t threads[ADOPT_READERS];
    _Atomic unsigned generation = 0;
    _Atomic bool stop = false;
    unsigned reads = 0, misses = 0;
    struct cache_object *o;
    char staged[256], etag[32];
    uint64_t used = 0;

    for (unsigned i = 0; i < ADOPT_READERS; i++) {
        readers[i] = (struct adopt_reader){.cache = f->cache,
                                           .generation = &generation,
                                           .stop = &stop};
        assert_int_equal(pthread_create(&threads[i], NULL, adopt_reader_main,
                                        &readers[i]), 0);
    }
    for (unsigned g = 1; g <= ADOPT_ROUNDS; g++) {
        adopt_etag(g, etag);
        staging_file(f, "under-readers", 300 + g, adopt_size(g, bs), staged);
        assert_int_equal(cache_adopt_file(f->cache, "adopted", etag,
                                          adopt_size(g, bs), staged), 0);
        atomic_store(&generation, g);
        if (g % 4 == 0)
            assert_int_equal(cache_flush(f->cache), 0);
        usleep(2000);
    }
    atomic_store(&stop, true);
    for (unsigned i = 0; i < ADOPT_READERS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        if (readers[i].failures > 0)
            fail_msg("reader %u: %u failures, first: %s", i,
                     readers[i].failures, readers[i].first_failure);
        reads += readers[i].reads;
        misses += readers[i].misses;
    }
    print_message("  %u blocks read, %u missed\n", reads, misses);
    assert_int_equal(cache_flush(f->cache), 0);

    /* whatever version the races left, the accounting matches it */
    adopt_etag(ADOPT_ROUNDS, etag);
    o = open_object(f, "adopted", etag, adopt_size(ADOPT_ROUNDS, bs));
    for (uint64_t b = 0; b < cache_object_blocks(o); b++) {
        if (cache_block_present(f->cache, o, b)) {
            expect_read(f, o, b, 0, cache_object_block_len(o, b), 300 + ADOPT_ROUNDS);
            used += rounded(cache_object_block_len(o, b));
        }
    }
    cache_object_close(f->cache, &o);
    assert_int_equal(stats(f).used_bytes, used);
    cache_restart(f);
    assert_int_equal(stats(f).used_bytes, used);
}

/* ------------------------------------------- usage across two commits */

/*
 * Calls from the cache to db_txn_commit() come to the wrapper below
 * first (-Wl,--wrap=db_txn_commit; no hook in the code): a test stops one
 * thread right after the commit that recorded some blocks, before the
 * cache's copy of its usage record learns of it, and meanwhile commits a
 * transaction that drops those blocks again.
 */
int __real_db_txn_commit(struct db_txn **txn);
int __wrap_db_txn_commit(struct db_txn **txn);

#define SEAM_WAIT_SECONDS 10

static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool armed;                  /* `thread` stops after a commit... */
    pthread_t thread;
    bool (*when)(void *arg);     /* ...once this holds after it */
    void *arg;
    bool stopped;                /* it waits */
    bool go;                     /* let it go on */
} seam = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

int __wrap_db_txn_commit(struct db_txn **txn)
{
    int err = __real_db_txn_commit(txn);

    pthread_mutex_lock(&seam.lock);
    bool ours = err == 0 && seam.armed && pthread_equal(seam.thread, pthread_self());
    bool (*when)(void *arg) = seam.when;
    void *arg = seam.arg;
    pthread_mutex_unlock(&seam.lock);
    if (!ours || !when(arg))
        return err;
    pthread_mutex_lock(&seam.lock);
    seam.armed = false;
    seam.stopped = true;
    pthread_cond_broadcast(&seam.changed);
    while (!seam.go)
        pthread_cond_wait(&seam.changed, &seam.lock);
    pthread_mutex_unlock(&seam.lock);
    return err;
}

/* Before the thread that will stop is started: none stopped yet. */
static void seam_reset(void)
{
    pthread_mutex_lock(&seam.lock);
    seam.armed = seam.stopped = seam.go = false;
    pthread_mutex_unlock(&seam.lock);
}

/* Stop the calling thread after its first commit past which WHEN(ARG). */
static void seam_arm(bool (*when)(void *arg), void *arg)
{
    pthread_mutex_lock(&seam.lock);
    seam.thread = pthread_self();
    seam.when = when;
    seam.arg = arg;
    seam.armed = true;
    pthread_mutex_unlock(&seam.lock);
}

/* Wait (a bounded time) for the armed thread to stop: 0 or ETIMEDOUT. */
static int seam_wait_stopped(void)
{
    struct timespec until;
    int err = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += SEAM_WAIT_SECONDS;
    pthread_mutex_lock(&seam.lock);
    while (err == 0 && !seam.stopped)
        err = pthread_cond_timedwait(&seam.changed, &seam.lock, &until);
    pthread_mutex_unlock(&seam.lock);
    return err;
}

static void seam_release(void)
{
    pthread_mutex_lock(&seam.lock);
    seam.armed = false;
    seam.go = true;
    pthread_cond_broadcast(&seam.changed);
    pthread_mutex_unlock(&seam.lock);
}

#define RACED_KEY "raced"
#define RACED_OLD_ETAG "\"old\""
#define RACED_NEW_ETAG "\"new\""

/* What the thread that records blocks works with. */
struct usage_race {
    struct cache *cache;
    uint32_t bs;
    char staged[256];            /* a file to adopt */
    struct cache_object *object; /* a version to fill */
    char *scratch;
    int rc;
};

static uint64_t raced_new_size(uint32_t bs)
{
    return 2ull * bs + 100; /* three blocks, the last one short */
}

/* Adopt a new version of RACED_KEY... */
static int race_adopt(struct usage_race *race)
{
    return cache_adopt_file(race->cache, RACED_KEY, RACED_NEW_ETAG,
                            raced_new_size(race->bs), race->staged);
}

/* ...committed once the index holds it... */
static bool race_adopted(void *arg)
{
    struct usage_race *race = arg;
    uint64_t bytes = 0;

    return cache_version_cached_bytes(race->cache, RACED_KEY, RACED_NEW_ETAG,
                                      raced_new_size(race->bs), &bytes,
                                      NULL) == 0 && bytes > 0;
}

/* ...and dropped by a reader opening the version it saw before. */
static int race_open_old(struct usage_race *race)
{
    struct cache_object *o = NULL;
    int rc = cache_object_open(race->cache, RACED_KEY, RACED_OLD_ETAG,
                               race->bs, &o);

    cache_object_close(race->cache, &o);
    return rc;
}

/* Fill block 0 of the open version... */
static int race_fill(struct usage_race *race)
{
    return store_raw(race->cache, race->object, 0, 404, race->scratch);
}

/* ...committed once it is recorded... */
static bool race_filled(void *arg)
{
    struct usage_race *race = arg;

    return cache_block_present(race->cache, race->object, 0);
}

/* ...and evicted with its key. */
static int race_evict(struct usage_race *race)
{
    uint64_t freed = 0;
    int rc = cache_evict_key(race->cache, RACED_KEY, &freed);

    return rc == 0 && freed != race->bs ? -1 : rc;
}

static const struct usage_race_case {
    const char *name;
    int (*record)(struct usage_race *race);   /* in a thread */
    bool (*recorded)(void *arg);              /* where it stops */
    int (*drop)(struct usage_race *race);     /* meanwhile: 0 or an errno */
} usage_race_cases[] = {
    {"adopt, stale open", race_adopt, race_adopted, race_open_old},
    {"fill, evict", race_fill, race_filled, race_evict},
};

static const struct usage_race_case *usage_race_case;

static void *usage_race_main(void *arg)
{
    struct usage_race *race = arg;

    seam_arm(usage_race_case->recorded, race);
    race->rc = usage_race_case->record(race);
    seam_release(); /* (if it never stopped) */
    return NULL;
}

/*
 * A transaction that records blocks commits, and before the cache's
 * copy of the usage record takes it in, a later one drops those blocks
 * and updates the copy. The copy must only ever be what the record was
 * after some commit: here the one block of another key, never less (it
 * was: fewer than no blocks, some 2^64 bytes in 64-bit arithmetic, which
 * debug builds' check of the copy caught in test_adopt_under_readers
 * about one run in two).
 */
static void test_usage_commits_overtaken(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;

    for (size_t i = 0; i < ARRAY_LEN(usage_race_cases); i++) {
        struct usage_race race = {.cache = f->cache, .bs = bs};
        struct cache_object *kept;
        pthread_t thread;
        struct cache_stats meanwhile, s;
        uint64_t freed = 0;
        int drop_rc;

        usage_race_case = &usage_race_cases[i];
        print_message("  %s\n", usage_race_case->name);
        kept = open_object(f, "race/kept", ETAG, bs);
        store(f, kept, 0, 401);
        cache_object_close(f->cache, &kept);
        staging_file(f, "raced", 403, raced_new_size(bs), race.staged);
        race.object = open_object(f, RACED_KEY, RACED_OLD_ETAG, bs);
        race.scratch = malloc(bs);
        assert_non_null(race.scratch);

        seam_reset();
        assert_int_equal(pthread_create(&thread, NULL, usage_race_main, &race), 0);
        if (seam_wait_stopped() != 0) {
            seam_release();
            pthread_join(thread, NULL);
            fail_msg("%s: never stopped after its commit (rc %d)",
                     usage_race_case->name, race.rc);
        }
        drop_rc = usage_race_case->drop(&race);
        meanwhile = stats(f);
        seam_release(); /* (before asserting: no thread left waiting) */
        assert_int_equal(pthread_join(thread, NULL), 0);

        assert_int_equal(drop_rc, 0);
        if (meanwhile.used_bytes != bs || meanwhile.blocks != 1)
            fail_msg("%s: %llu bytes in %llu blocks used, expected %u in 1",
                     usage_race_case->name,
                     (unsigned long long)meanwhile.used_bytes,
                     (unsigned long long)meanwhile.blocks, bs);
        assert_int_equal(race.rc, 0);
        cache_object_close(f->cache, &race.object);
        free(race.scratch);
        s = stats(f);
        assert_int_equal(s.used_bytes, bs);
        assert_int_equal(s.blocks, 1);
        cache_restart(f); /* (debug builds check the record against the blocks) */
        s = stats(f);
        assert_int_equal(s.used_bytes, bs);
        assert_int_equal(s.blocks, 1);
        assert_int_equal(cache_evict_key(f->cache, "race/kept", &freed), 0);
        assert_int_equal(cache_evict_key(f->cache, RACED_KEY, &freed), 0);
        assert_int_equal(stats(f).blocks, 0);
    }
}

/* ------------------------------------------------------- orphan files */

/*
 * A process killed while a replaced version was still open (its file
 * goes at the last close, which never came), or between an eviction's
 * commit and its unlink, or during an adoption leaves data files whose
 * version the index does not know: cache_open removes them, and only
 * them.
 */
static void test_orphan_files_swept(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    char paths[4][256], orphan[256], foreign[256], keep_path[256];
    struct cache_object *o;
    struct cache_stats s;
    pid_t child;
    int status = 0;

    o = open_object(f, "orphan/keep", ETAG, bs);
    store(f, o, 0, 210);
    cache_object_close(f->cache, &o);
    only_data_file(f, keep_path);
    make_write_path_files(f);
    cache_stop(f);

    /* the child dies holding a replaced version, as kill -9 would leave it */
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct cache *cache = NULL;
        struct cache_object *old = NULL, *cur = NULL;
        char err[256], *scratch = malloc(bs);
        int fd = -1;
        if (scratch == NULL || cache_lock_dir(f->dir, &fd, err, sizeof(err)) != 0 ||
            cache_open(&f->conf, fd, &cache, err, sizeof(err)) != 0 ||
            cache_object_open(cache, "orphan/old", ETAG, 2ull * bs, &old) != 0 ||
            store_raw(cache, old, 0, 211, scratch) != 0 ||
            store_raw(cache, old, 1, 211, scratch) != 0 ||
            cache_object_open(cache, "orphan/old", "\"v2\"", bs, &cur) != 0 ||
            store_raw(cache, cur, 0, 212, scratch) != 0)
            _exit(1);
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 3);

    /* a file renamed in by an adoption that never got recorded, and one
     * that is not named like a data file */
    snprintf(orphan, sizeof(orphan), "%s/data/de", f->dir);
    assert_true(mkdir(orphan, 0700) == 0 || errno == EEXIST);
    snprintf(orphan, sizeof(orphan), "%s/data/de/00000000000abcde", f->dir);
    write_text_file(orphan, "never recorded");
    snprintf(foreign, sizeof(foreign), "%s/data/de/notes", f->dir);
    write_text_file(foreign, "not ours");
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 5);

    cache_start(f);
    assert_int_equal(data_files(f, paths, ARRAY_LEN(paths)), 3); /* keep, v2, notes */
    assert_false(file_exists(orphan));
    assert_true(file_exists(foreign));
    assert_true(file_exists(keep_path));
    expect_write_path_files(f, "sweeping orphans");
    s = stats(f);
    assert_int_equal(s.blocks, 2);
    assert_int_equal(s.used_bytes, 2ull * bs);
    expect_object(f, "orphan/keep", ETAG, bs, 210);
    expect_object(f, "orphan/old", "\"v2\"", bs, 212);
    assert_int_equal(unlink(foreign), 0);
}

/* ------------------------------------------------------------- flusher */

static double seconds(clockid_t clock)
{
    struct timespec now;

    clock_gettime(clock, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/*
 * The flusher thread writes recency on its own about once a second, and
 * sleeps in between: a timed wait whose deadline is read from another
 * clock than the condition variable's would return at once and spin.
 */
static void test_flusher(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct cache_object *o = open_object(f, "flusher", ETAG, bs);
    double start, cpu;

    store(f, o, 0, 220);
    assert_int_equal(cache_block_read(f->cache, o, 0, 0, bs, f->buf, true), 0);
    cache_object_close(f->cache, &o);
    start = seconds(CLOCK_MONOTONIC);
    while (stats(f).protected_bytes == 0 && seconds(CLOCK_MONOTONIC) - start < 5)
        usleep(20000);
    assert_int_equal(stats(f).protected_bytes, bs);

    cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
    usleep(1500000);
    cpu = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    if (cpu > 0.3)
        fail_msg("%.2f s of CPU in 1.5 s with nothing to do", cpu);
}

/* --------------------------------------------------------- concurrency */

#define THREADS 4
#define THREAD_OPS 200
#define THREAD_OBJECT_BLOCKS 6

struct worker {
    struct cache *cache;
    unsigned index;
    unsigned hits, misses, failures;
    uint64_t max_used;
    char first_failure[160];
};

static void worker_fail(struct worker *w, const char *what, unsigned op, int rc)
{
    if (w->failures++ == 0)
        snprintf(w->first_failure, sizeof(w->first_failure),
                 "thread %u op %u: %s: %s", w->index, op, what,
                 rc > 0 ? strerror(rc) : "wrong bytes");
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint32_t bs = cache_block_size(w->cache);
    uint32_t seed = 1000 + w->index;
    char key[32];
    char *scratch = malloc(bs), *buf = malloc(bs), *expect = malloc(bs);
    struct cache_object *o = NULL;
    int rc;

    snprintf(key, sizeof(key), "threads/%u", w->index);
    if (scratch == NULL || buf == NULL || expect == NULL) {
        worker_fail(w, "malloc", 0, ENOMEM);
        goto out;
    }
    rc = cache_object_open(w->cache, key, ETAG,
                           (uint64_t)THREAD_OBJECT_BLOCKS * bs, &o);
    if (rc != 0) {
        worker_fail(w, "open", 0, rc);
        goto out;
    }
    for (unsigned op = 0; op < THREAD_OPS; op++) {
        uint64_t block = (op * 5u + w->index) % THREAD_OBJECT_BLOCKS;
        struct cache_object *extra = NULL;
        struct cache_stats s;

        if (!cache_block_present(w->cache, o, block) || op % 3 == 0) {
            rc = store_raw(w->cache, o, block, seed, scratch);
            if (rc != 0)
                worker_fail(w, "store", op, rc);
        }
        cache_get_stats(w->cache, &s);
        if (s.used_bytes > w->max_used)
            w->max_used = s.used_bytes;

        /* a second handle on the same version, now and then */
        if (op % 7 == 0) {
            rc = cache_object_open(w->cache, key, ETAG,
                                   (uint64_t)THREAD_OBJECT_BLOCKS * bs, &extra);
            if (rc != 0)
                worker_fail(w, "second open", op, rc);
        }
        rc = read_raw(w->cache, extra != NULL ? extra : o, block, 0, bs, seed,
                      op % 2 == 0, buf, expect);
        if (rc == 0)
            w->hits++;
        else if (rc == ENOENT)
            w->misses++; /* evicted by another thread meanwhile */
        else
            worker_fail(w, "read", op, rc);
        rc = read_raw(w->cache, o, block, PIECE / 2 - 3, 101, seed, false,
                      buf, expect);
        if (rc != 0 && rc != ENOENT)
            worker_fail(w, "partial read", op, rc);
        cache_object_close(w->cache, &extra);
        if (w->index == 0 && op % 50 == 0 && (rc = cache_flush(w->cache)) != 0)
            worker_fail(w, "flush", op, rc);
    }
out:
    cache_object_close(w->cache, &o);
    free(scratch);
    free(buf);
    free(expect);
    return NULL;
}

static void test_concurrency(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct worker workers[THREADS];
    pthread_t threads[THREADS];
    uint64_t present = 0;
    unsigned hits = 0, misses = 0;
    struct cache_stats s;

    /* 24 distinct blocks, room for 8 */
    f->conf.size_limit = 8ull * bs;
    cache_restart(f);
    for (unsigned i = 0; i < THREADS; i++) {
        workers[i] = (struct worker){.cache = f->cache, .index = i};
        assert_int_equal(pthread_create(&threads[i], NULL, worker_main,
                                        &workers[i]), 0);
    }
    for (unsigned i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    for (unsigned i = 0; i < THREADS; i++) {
        if (workers[i].failures > 0)
            fail_msg("%u failures; first: %s", workers[i].failures,
                     workers[i].first_failure);
        hits += workers[i].hits;
        misses += workers[i].misses;
    }
    s = stats(f);
    print_message("  %u hits, %u misses, %llu evicted, %llu corrupt\n", hits,
                  misses, (unsigned long long)s.evicted_blocks,
                  (unsigned long long)s.corrupt_blocks);
    assert_true(hits > 0);
    assert_true(s.evicted_blocks > 0);
    /* no check_bound(f) here: see test_concurrent_bound */

    /* the usage record matches what is actually recorded */
    for (unsigned i = 0; i < THREADS; i++) {
        char key[32];
        struct cache_object *o;
        snprintf(key, sizeof(key), "threads/%u", i);
        o = open_object(f, key, ETAG, (uint64_t)THREAD_OBJECT_BLOCKS * bs);
        for (uint64_t b = 0; b < THREAD_OBJECT_BLOCKS; b++) {
            if (cache_block_present(f->cache, o, b)) {
                present++;
                expect_read(f, o, b, 0, bs, 1000 + i);
            }
        }
        cache_object_close(f->cache, &o);
    }
    /* the usage record in the index matches the blocks it lists (the
     * in-memory copy follows it) */
    cache_restart(f);
    s = stats(f);
    assert_int_equal(s.blocks, present);
    assert_int_equal(s.used_bytes, present * bs);
}

/*
 * Concurrent fills never take the cache past size_limit: room is checked
 * and reserved together, and the in-memory usage moves by each commit's
 * difference, whatever order commits report in. Each thread records the
 * largest used_bytes it sees.
 */
static void test_concurrent_bound(void **state)
{
    struct fixture *f = *state;
    uint32_t bs = f->conf.block_size;
    struct worker workers[THREADS];
    pthread_t threads[THREADS];
    uint64_t max_used = 0;

    f->conf.size_limit = 8ull * bs;
    cache_restart(f);
    for (unsigned round = 0; round < 3; round++) {
        for (unsigned i = 0; i < THREADS; i++) {
            workers[i] = (struct worker){.cache = f->cache, .index = i};
            assert_int_equal(pthread_create(&threads[i], NULL, worker_main,
                                            &workers[i]), 0);
        }
        for (unsigned i = 0; i < THREADS; i++)
            assert_int_equal(pthread_join(threads[i], NULL), 0);
        for (unsigned i = 0; i < THREADS; i++) {
            assert_int_equal(workers[i].failures, 0);
            if (workers[i].max_used > max_used)
                max_used = workers[i].max_used;
        }
    }
    if (max_used > f->conf.size_limit)
        fail_msg("used_bytes reached %llu, over the limit %llu",
                 (unsigned long long)max_used,
                 (unsigned long long)f->conf.size_limit);
}

/* Whether the fixture's one cached block of "k" is still there once the
 * cache is reopened after claim() (the block is stored first). */
static bool block_survives(struct fixture *f,
                           int (*claim)(struct fixture *f, void *arg), void *arg)
{
    struct cache_object *o = open_object(f, "k", ETAG, SMALL_BLOCK);
    store(f, o, 0, 7);
    cache_object_close(f->cache, &o);
    cache_stop(f);
    assert_int_equal(claim(f, arg), 0);
    cache_start(f);
    o = open_object(f, "k", ETAG, SMALL_BLOCK);
    bool present = cache_block_present(f->cache, o, 0);
    if (present)
        expect_read(f, o, 0, 0, SMALL_BLOCK, 7);
    cache_object_close(f->cache, &o);
    return present;
}

static int claim_as(struct fixture *f, void *arg)
{
    char errbuf[1024] = "";
    int err = cache_dir_claim(f->dir, arg, 0, errbuf, sizeof(errbuf));
    if (err != 0)
        fail_msg("cache_dir_claim: %s (%s)", strerror(err), errbuf);
    return err;
}

/*
 * A cache directory knows whose it is (CACHE/identity): the first claim
 * records it; the same endpoint and bucket keep the blocks (a new prefix
 * is only recorded); another endpoint or bucket, or a record that does
 * not parse, empties the index and the data files, never staging/ or
 * journal/; with writes still owed, another identity is refused with a
 * sentence naming both, and nothing changes.
 */
static void test_identity_binds_the_directory(void **state)
{
    struct fixture *f = *state;
    struct cache_identity mine = {"http://127.0.0.1:9000", "models", ""};
    struct cache_identity prefixed = {"http://127.0.0.1:9000", "models", "v2/"};
    struct cache_identity other_bucket = {"http://127.0.0.1:9000", "data", ""};
    struct cache_identity other_endpoint = {"https://r2.example.com", "models", ""};
    char path[512], text[1024], errbuf[1024];

    /* (a staged file and a journal file, which nothing may touch) */
    snprintf(path, sizeof(path), "%s/staging", f->dir);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/staging/0000000000000001", f->dir);
    write_text_file(path, "staged");
    snprintf(path, sizeof(path), "%s/journal", f->dir);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/journal/data.mdb", f->dir);
    write_text_file(path, "journal");

    assert_true(cache_dir_is_for(f->dir, &other_bucket)); /* no record yet */
    assert_true(block_survives(f, claim_as, &mine));
    snprintf(path, sizeof(path), "%s/identity", f->dir);
    read_text_file(path, text, sizeof(text));
    assert_string_equal(text, "s3cachefs cache identity 1\n"
                              "endpoint http://127.0.0.1:9000\n"
                              "bucket models\nprefix \n");
    assert_true(block_survives(f, claim_as, &mine));
    assert_true(block_survives(f, claim_as, &prefixed));
    read_text_file(path, text, sizeof(text));
    assert_non_null(strstr(text, "prefix v2/\n"));
    assert_true(cache_dir_is_for(f->dir, &mine));
    assert_false(cache_dir_is_for(f->dir, &other_bucket));
    assert_false(cache_dir_is_for(f->dir, &other_endpoint));

    /* owed writes: refused, the record and the blocks as they were */
    cache_stop(f);
    assert_int_equal(cache_dir_claim(f->dir, &other_bucket, 2, errbuf,
                                     sizeof(errbuf)), EEXIST);
    assert_non_null(strstr(errbuf, "holds 2 writes not yet in bucket 'models' "
                                   "(prefix 'v2/') at http://127.0.0.1:9000"));
    assert_non_null(strstr(errbuf, "this mount is of bucket 'data' at "
                                   "http://127.0.0.1:9000"));
    assert_non_null(strstr(errbuf, "s3cachefs pending"));
    assert_int_equal(cache_dir_claim(f->dir, &mine, 1, errbuf,
                                     sizeof(errbuf)), EEXIST); /* the prefix */
    cache_start(f);
    assert_true(block_survives(f, claim_as, &prefixed));

    assert_false(block_survives(f, claim_as, &other_endpoint));
    assert_true(cache_dir_is_for(f->dir, &other_endpoint));
    assert_false(block_survives(f, claim_as, &other_bucket));
    write_text_file(path, "s3cachefs cache identity 1\nendpoint x\n");
    assert_false(cache_dir_is_for(f->dir, &other_bucket));
    assert_false(block_survives(f, claim_as, &other_bucket));
    assert_true(block_survives(f, claim_as, &other_bucket));

    snprintf(path, sizeof(path), "%s/staging/0000000000000001", f->dir);
    read_text_file(path, text, sizeof(text));
    assert_string_equal(text, "staged");
    snprintf(path, sizeof(path), "%s/journal/data.mdb", f->dir);
    read_text_file(path, text, sizeof(text));
    assert_string_equal(text, "journal");
}

/* An identity record that cannot be read (here a directory in its place:
 * EIO) is not taken for another owner's: the claim fails with a sentence
 * and the cache is not emptied. (Before: emptied, as a record that does
 * not parse is.) */
static void test_identity_that_cannot_be_read_keeps_the_cache(void **state)
{
    struct fixture *f = *state;
    struct cache_identity mine = {"http://127.0.0.1:9000", "models", ""};
    char path[512], errbuf[1024] = "";

    assert_true(block_survives(f, claim_as, &mine));
    cache_stop(f);
    snprintf(path, sizeof(path), "%s/identity", f->dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    int err = cache_dir_claim(f->dir, &mine, 0, errbuf, sizeof(errbuf));
    assert_int_not_equal(err, 0);
    assert_non_null(strstr(errbuf, "cannot read"));
    assert_int_equal(rmdir(path), 0);
    cache_start(f);
    struct cache_object *o = open_object(f, "k", ETAG, SMALL_BLOCK);
    assert_true(cache_block_present(f->cache, o, 0));
    cache_object_close(f->cache, &o);
}

/* A prefix with spaces, '%' and controls is recorded as one word and
 * read back exactly. */
static void test_identity_record_escapes(void **state)
{
    struct fixture *f = *state;
    struct cache_identity odd = {"http://127.0.0.1:9000", "models",
                                 "a b/100%/\x01\xc3\xa9/"};
    struct cache_identity plain = {"http://127.0.0.1:9000", "models", "a b/"};
    char path[512], text[1024], errbuf[1024];

    cache_stop(f);
    assert_int_equal(cache_dir_claim(f->dir, &odd, 0, errbuf, sizeof(errbuf)), 0);
    snprintf(path, sizeof(path), "%s/identity", f->dir);
    read_text_file(path, text, sizeof(text));
    assert_non_null(strstr(text, "prefix a%20b/100%25/%01%C3%A9/\n"));
    /* the same: nothing to refuse even with writes owed */
    assert_int_equal(cache_dir_claim(f->dir, &odd, 3, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(cache_dir_claim(f->dir, &plain, 3, errbuf, sizeof(errbuf)),
                     EEXIST);
    cache_start(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_round_trip, setup,
                                                 teardown, (void *)&small_block),
        cmocka_unit_test_prestate_setup_teardown(test_round_trip, setup,
                                                 teardown, (void *)&large_block),
        cmocka_unit_test_setup_teardown(test_identity_binds_the_directory,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_identity_record_escapes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_identity_that_cannot_be_read_keeps_the_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_outlives_handle, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_prestate_setup_teardown(test_integrity_flipped_byte,
                                                 setup, teardown,
                                                 (void *)&small_block),
        cmocka_unit_test_prestate_setup_teardown(test_integrity_flipped_byte,
                                                 setup, teardown,
                                                 (void *)&large_block),
        cmocka_unit_test_prestate_setup_teardown(test_splice_fresh_block,
                                                 setup, teardown,
                                                 (void *)&large_block),
        cmocka_unit_test_prestate_setup_teardown(
            test_spliced_block_dropped_as_damaged, setup, teardown,
            (void *)&large_block),
        cmocka_unit_test_prestate_setup_teardown(test_fill_gathers_writes,
                                                 setup, teardown,
                                                 (void *)&large_block),
        cmocka_unit_test_setup_teardown(test_integrity_truncated, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_integrity_deleted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replaced_open_version,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
        cmocka_unit_test_prestate_setup_teardown(test_bounds, setup, teardown,
                                                 (void *)&small_block),
        cmocka_unit_test_prestate_setup_teardown(test_bounds, setup, teardown,
                                                 (void *)&large_block),
        cmocka_unit_test_setup_teardown(test_scan_resistance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hit_updates_recency, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_close_frees_read_buffers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_detection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_size_change, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_min_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_path_files_survive, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserve_disk_bounds, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_reserve_disk_order, setup,
                                        teardown),
        cmocka_unit_test_prestate_setup_teardown(test_adopt, setup, teardown,
                                                 (void *)&small_block),
        cmocka_unit_test_prestate_setup_teardown(test_adopt, setup, teardown,
                                                 (void *)&large_block),
        cmocka_unit_test_setup_teardown(test_adopt_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rename_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forget_key, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_splice_of_a_punched_block_on_a_full_tmpfs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopt_under_readers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_usage_commits_overtaken, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_orphan_files_swept, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_flusher, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_bound, setup,
                                        teardown),
    };

    log_set_level(LOG_LEVEL_ERROR); /* damage is logged as a warning */
    if (getenv("TEST_CACHE_FILTER") != NULL) /* e.g. "test_concurren*" */
        cmocka_set_test_filter(getenv("TEST_CACHE_FILTER"));
    return cmocka_run_group_tests_name("cache", tests, NULL, NULL);
}
