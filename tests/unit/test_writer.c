/*
 * test_writer.c - the write path (writer.c with journal.c, upload.c,
 * writebehind.c, staging.c and the cache) driven directly, on the
 * in-memory S3 of fake_s3.h: no FUSE, no root, no server.
 *
 * Each test gets a cache directory under /tmp with its journal, a fake
 * bucket, a pool of 2 upload workers and a writer with small multipart
 * sizes (threshold 1 MiB, 5 MiB parts), and drives the writer as the fs
 * layer does: writer_file_open_writer(), writes, writer_file_flush() (a
 * close), writer_file_close_writer() (its release), writer_file_put().
 * Outcomes are checked where they land: bytes and ETags in the bucket,
 * the requests and their order in the fake's log, the journal's entries,
 * the staging directory, the writer's counters.
 *
 * Covered:
 *   - default mode: close uploads (PUT under the threshold; a multipart
 *     upload above it, written sequentially (write-behind, its `unclosed`
 *     entry while written) or not (parts at close, the upload id
 *     journaled while it runs)); a failed upload keeps the data and its
 *     promise and reaches the bucket through the background retry; a
 *     lost answer: a complete taken as done (one HEAD), a PUT sent again;
 *   - writeback mode: close journals and returns while an older version's
 *     upload is held; a read right after close returns the closed bytes;
 *     the versions land in order and the bucket ends with the last one,
 *     with the held uploads released late or at once;
 *   - rename: what writer_file_hold() says (UPLOADED, JOURNALED, UNSAVED),
 *     the journal entry following the new key, and no upload of a held
 *     file before writer_file_release();
 *   - unlink while the file's upload is held: it waits, the DELETE comes
 *     after the PUT, the journal forgets the file;
 *   - recovery after a crash (every upload refused, the writer destroyed
 *     without a drain): exactly what was closed is uploaded, also after a
 *     reopen that truncated and wrote a few bytes (sealed bytes go to a
 *     copy), an append never closed (cut to the
 *     entry's size), a newer promise of a file closed twice; the
 *     multipart uploads the journal names are aborted (a write-behind
 *     upload of a file never closed only that; a failed close's, or a
 *     write-behind upload begun after a promise, before the promise goes
 *     up); a file never closed is not uploaded; stray staging files are
 *     swept;
 *   - a multipart upload whose abort failed is kept in the journal and
 *     aborted by the drain (test_failed_abort_is_not_forgotten);
 *   - sync (writer_sync()): it returns only once every pending file is in
 *     the bucket (uploads held, a multipart one among them); a retry's
 *     backoff is cut short and a refused upload reported with its errno,
 *     its data kept; a file open for writing is synced as far as its
 *     last close, one never closed is named, not waited for; an
 *     interrupted sync returns at once; two syncs of 100 files at once;
 *   - the pending list (each state, errno and retries) and drop: refused
 *     for a file open or uploading, its journal entry and staging file
 *     gone otherwise, and not recovered after a crash;
 *   - a rewrite whose write fails on a full staging directory (a tmpfs of
 *     its own; root only): close, fsync and sync say so, the drain leaves
 *     the old object alone, and once the failed bytes are written again
 *     the new ones go up exactly.
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

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/workers.h"
#include "cache/cache.h"
#include "fake_s3.h"
#include "s3/s3.h"
#include "unit_cache.h"
#include "writer/journal.h"
#include "writer/writer.h"

#define KIB (1u << 10)
#define MIB (1u << 20)
#define THRESHOLD (1ull * MIB)
#define PART_SIZE (5ull * MIB)
#define MAX_ADOPTED 16
#define MAX_ENTRIES 16
#define WAIT_SECONDS FAKE_S3_WAIT_SECONDS

/* cmocka's assertions may only fail on the thread running the test: the
 * writer's threads (its callbacks) and the test's helper threads use this */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            abort();                                                       \
        }                                                                  \
    } while (0)

#define ON(call, key) FAKE_S3_ON(FAKE_S3_CALL(call), key)

static const bool default_mode = false;
static const bool writeback_mode = true;

struct fixture {
    char dir[64];
    bool writeback;
    struct cache_conf cache_conf;
    struct cache *cache;
    struct journal *journal;
    struct workers *workers;
    struct s3_client *s3;
    struct writer *writer;
    unsigned char *scratch;        /* a test's bytes, freed in teardown */
    bool staging_tmpfs;            /* CACHE/staging is a tmpfs of the test */

    /* what the writer's callbacks told (under lock, signalled on told) */
    pthread_mutex_t lock;
    pthread_cond_t told;
    unsigned uploads;              /* uploaded callbacks */
    unsigned failures_told;        /* uploaded callbacks of a failure */
    char last_key[256];
    char last_etag[S3_ETAG_MAX];
    uint64_t last_size;
    struct writer_meta last_meta;
    struct writer_file *adopted[MAX_ADOPTED]; /* references from recovery */
    char adopted_keys[MAX_ADOPTED][64];
    uint64_t adopted_sizes[MAX_ADOPTED];
    unsigned adopted_count;
};

/* A journal entry, copied out of journal_scan(). */
struct entry_copy {
    uint64_t id;
    char key[256];
    uint64_t size;
    bool unclosed;
    bool has_upload_id;
};

/* ------------------------------------------------------------ fixture */

static void on_uploaded(void *arg, struct writer_file *file, void *owner,
                        const char *key, const char *etag, uint64_t size,
                        const struct writer_meta *meta)
{
    struct fixture *f = arg;

    (void)file;
    (void)owner;
    pthread_mutex_lock(&f->lock);
    if (etag == NULL) { /* failed: told so that a rename deletes KEY */
        f->failures_told++;
        pthread_cond_broadcast(&f->told);
        pthread_mutex_unlock(&f->lock);
        return;
    }
    f->uploads++;
    snprintf(f->last_key, sizeof(f->last_key), "%s", key);
    snprintf(f->last_etag, sizeof(f->last_etag), "%s", etag);
    f->last_size = size;
    f->last_meta = *meta;
    pthread_cond_broadcast(&f->told);
    pthread_mutex_unlock(&f->lock);
}

static void on_adopt(void *arg, struct writer_file *file, const char *key,
                     uint64_t size, const struct writer_meta *meta)
{
    struct fixture *f = arg;

    (void)meta;
    pthread_mutex_lock(&f->lock);
    CHECK(f->adopted_count < MAX_ADOPTED);
    f->adopted[f->adopted_count] = file;
    snprintf(f->adopted_keys[f->adopted_count], sizeof(f->adopted_keys[0]),
             "%s", key);
    f->adopted_sizes[f->adopted_count] = size;
    f->adopted_count++;
    pthread_mutex_unlock(&f->lock);
}

static void writer_start(struct fixture *f)
{
    struct writer_conf conf = {
        .s3 = f->s3,
        .cache = f->cache,
        .workers = f->workers,
        .journal = f->journal,
        .writeback = f->writeback,
        .uploaders = 2,
        .parallel_parts = 2,
        .multipart_threshold = THRESHOLD,
        .part_size = PART_SIZE,
        .uploaded = on_uploaded,
        .uploaded_arg = f,
    };
    assert_int_equal(writer_create(&conf, &f->writer), 0);
}

static void journal_start(struct fixture *f)
{
    char path[128], errbuf[256] = "";

    snprintf(path, sizeof(path), "%s/journal", f->dir);
    int err = journal_open(path, "http://fake.invalid/bucket", &f->journal, errbuf, sizeof(errbuf));
    if (err != 0)
        fail_msg("journal_open: %s (%s)", strerror(err), errbuf);
}

/* STATE points at the mode: default_mode or writeback_mode. */
static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->writeback = *(const bool *)*state;
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_writer.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->cache_conf = (struct cache_conf){
        .dir = f->dir,
        .bucket = "test-bucket",
        .size_limit = 256ull * MIB,
        .block_size = CACHE_DEFAULT_BLOCK_SIZE,
    };
    f->cache = unit_cache_open(&f->cache_conf);
    journal_start(f);
    assert_int_equal(workers_create(2, &f->workers), 0);
    assert_int_equal(fake_s3_create(&f->s3), 0);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->told, NULL);
    writer_start(f);
    *state = f;
    return 0;
}

static void adopted_put(struct fixture *f)
{
    for (unsigned i = 0; i < f->adopted_count; i++)
        writer_file_put(&f->adopted[i]);
    f->adopted_count = 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    /* whatever the test left held or failing goes on now */
    fake_s3_hold_clear(f->s3, 0);
    fake_s3_fail_clear(f->s3, 0);
    if (f->writer != NULL)
        writer_drain(f->writer);
    adopted_put(f);
    writer_destroy(&f->writer);
    if (f->staging_tmpfs) {
        char path[128];
        snprintf(path, sizeof(path), "%s/staging", f->dir);
        umount2(path, MNT_DETACH);
    }
    workers_destroy(&f->workers);
    journal_close(&f->journal);
    cache_close(&f->cache);
    s3_client_destroy(&f->s3);
    pthread_cond_destroy(&f->told);
    pthread_mutex_destroy(&f->lock);
    unit_remove_tree(f->dir);
    free(f->scratch);
    free(f);
    return 0;
}

/* Wait until COUNT uploads were told in all. 0 or ETIMEDOUT. */
static int wait_uploads(struct fixture *f, unsigned count)
{
    struct timespec until;
    int err = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_SECONDS;
    pthread_mutex_lock(&f->lock);
    while (err == 0 && f->uploads < count)
        err = pthread_cond_timedwait(&f->told, &f->lock, &until);
    pthread_mutex_unlock(&f->lock);
    return err;
}

static unsigned uploads_told(struct fixture *f)
{
    pthread_mutex_lock(&f->lock);
    unsigned count = f->uploads;
    pthread_mutex_unlock(&f->lock);
    return count;
}

/* ------------------------------------------------------------- helpers */

/* LEN bytes of pattern SEED. */
static unsigned char *pattern(size_t len, unsigned seed)
{
    unsigned char *bytes = malloc(len ? len : 1);

    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] =
            (unsigned char)((i * 131 + seed * 17 + (i >> 10) * seed) & 0xff);
    return bytes;
}

static const struct writer_meta file_meta = {
    .mode = 0100644, .uid = 1000, .gid = 1000,
    .mtime = {.tv_sec = 1700000000},
};

/* A new file KEY, open for writing (as fs_create does). */
static struct writer_file *file_open(struct fixture *f, const char *key)
{
    struct writer_file *file = NULL;

    assert_int_equal(writer_file_create(f->writer, key, &file_meta, true, NULL,
                                        &file), 0);
    writer_file_open_writer(file);
    return file;
}

/* Write LEN bytes of DATA at OFFSET in chunks of CHUNK bytes (0: one). */
static void file_write(struct writer_file *file, uint64_t offset,
                       const unsigned char *data, size_t len, size_t chunk)
{
    if (chunk == 0)
        chunk = len;
    for (size_t done = 0; done < len; done += chunk) {
        size_t piece = len - done < chunk ? len - done : chunk;
        assert_int_equal(writer_file_write(file, offset + done, data + done,
                                           piece), 0);
    }
}

/* Whether FILE reads as exactly the LEN bytes of DATA. */
static bool file_reads(struct writer_file *file, const unsigned char *data,
                       size_t len)
{
    unsigned char *buf = malloc(len + 1);
    size_t got = 0;
    uint64_t size = 0;

    assert_non_null(buf);
    writer_file_info(file, &size, NULL, NULL);
    bool same = size == len &&
                writer_file_read(file, 0, len + 1, buf, &got) == 0 &&
                got == len && memcmp(buf, data, len) == 0;
    free(buf);
    return same;
}

static int copy_entry(void *arg, const struct journal_entry *entry)
{
    struct entry_copy *copies = arg;
    size_t at = 0;

    while (at < MAX_ENTRIES && copies[at].key[0] != '\0')
        at++;
    if (at == MAX_ENTRIES)
        return ENOSPC;
    copies[at].id = entry->id;
    snprintf(copies[at].key, sizeof(copies[at].key), "%s", entry->key);
    copies[at].size = entry->size;
    copies[at].unclosed = entry->unclosed;
    copies[at].has_upload_id = entry->upload_id != NULL;
    return 0;
}

/* The journal's entries into OUT (MAX_ENTRIES), in id order; how many. */
static size_t journal_entries(struct fixture *f, struct entry_copy *out)
{
    memset(out, 0, MAX_ENTRIES * sizeof(*out));
    assert_int_equal(journal_scan(f->journal, copy_entry, out), 0);
    size_t count = 0;
    while (count < MAX_ENTRIES && out[count].key[0] != '\0')
        count++;
    return count;
}

/* The entry for KEY in ENTRIES (COUNT), or NULL. */
/* KEY's entry among ENTRIES: its promise, or else its unclosed entry. */
static const struct entry_copy *entry_for(const struct entry_copy *entries,
                                          size_t count, const char *key)
{
    const struct entry_copy *found = NULL;

    for (size_t i = 0; i < count; i++)
        if (strcmp(entries[i].key, key) == 0 &&
            (found == NULL || found->unclosed))
            found = &entries[i];
    return found;
}

/* Files in CACHE/staging (staging files and kept promises). */
static unsigned staging_files(struct fixture *f)
{
    char path[128];
    unsigned count = 0;

    snprintf(path, sizeof(path), "%s/staging", f->dir);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    for (struct dirent *entry; (entry = readdir(dir)) != NULL;)
        if (entry->d_name[0] != '.')
            count++;
    closedir(dir);
    return count;
}

static struct writer_stats stats_of(struct fixture *f)
{
    struct writer_stats stats;

    writer_get_stats(f->writer, &stats);
    return stats;
}

/* The ETags of the requests of CALL on KEY that succeeded, in order,
 * into ETAGS (CAP); how many. */
static size_t etags_made(struct fixture *f, enum fake_s3_call call,
                         const char *key, char (*etags)[S3_ETAG_MAX],
                         size_t cap)
{
    size_t count = 0;
    long at = -1;

    while ((at = fake_s3_log_find(f->s3, (size_t)(at + 1), ON(call, key)))
           >= 0) {
        struct fake_s3_request request;
        assert_int_equal(fake_s3_log_get(f->s3, (size_t)at, &request), 0);
        if (request.done && request.result == 0 && count < cap)
            snprintf(etags[count++], S3_ETAG_MAX, "%s", request.etag);
    }
    return count;
}

/* A writer call in a thread of its own (it may wait for a held request). */
struct call_thread {
    pthread_t thread;
    struct writer_file *file;
    enum { CALL_FLUSH, CALL_SYNC, CALL_UNLINK } what;
    int result;                    /* errno, or for unlink whether uploaded */
};

static void *call_main(void *arg)
{
    struct call_thread *call = arg;

    switch (call->what) {
    case CALL_FLUSH:
        call->result = writer_file_flush(call->file);
        break;
    case CALL_SYNC:
        call->result = writer_file_sync(call->file);
        break;
    case CALL_UNLINK:
        call->result = writer_file_unlink(call->file, true);
        break;
    }
    return NULL;
}

static void call_start(struct call_thread *call, struct writer_file *file,
                       int what)
{
    *call = (struct call_thread){.file = file, .what = what, .result = -1};
    assert_int_equal(pthread_create(&call->thread, NULL, call_main, call), 0);
}

/* ------------------------------------------------------- default mode */

static void test_default_close_puts_a_small_file(void **state)
{
    struct fixture *f = *state;
    size_t size = 100 * KIB + 7;
    unsigned char *bytes = pattern(size, 1);
    char etag[S3_ETAG_MAX], told[S3_ETAG_MAX];
    struct entry_copy entries[MAX_ENTRIES];

    struct writer_file *file = file_open(f, "d/small");
    file_write(file, 0, bytes, size, 4096);
    assert_true(writer_file_pending(file));
    assert_int_equal(fake_s3_count(f->s3, NULL), 0); /* nothing before close */
    assert_int_equal(writer_file_flush(file), 0);

    /* in the bucket when close returns: one PUT, its ETag the MD5 */
    fake_s3_etag_of(bytes, size, etag);
    assert_true(fake_s3_holds(f->s3, "d/small", bytes, size));
    assert_int_equal(fake_s3_count(f->s3, NULL), 1);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "d/small")), 1);
    assert_true(writer_file_etag(file, told));
    assert_string_equal(told, etag);
    assert_false(writer_file_pending(file));
    assert_int_equal(uploads_told(f), 1);
    assert_string_equal(f->last_key, "d/small");
    assert_string_equal(f->last_etag, etag);
    assert_int_equal(f->last_size, size);
    /* the s3fs headers went with it */
    struct s3_object_info info;
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(fake_s3_get(f->s3, "d/small", &data, &len, &info), 0);
    free(data);
    assert_true(info.has_mode && info.has_uid && info.has_gid &&
                info.has_mtime);
    assert_int_equal(info.mode, 0100644);
    assert_int_equal(info.uid, 1000);
    /* the default mode journals nothing that went up at close */
    assert_int_equal(journal_entries(f, entries), 0);
    assert_int_equal(stats_of(f).uploads_completed, 1);
    assert_int_equal(stats_of(f).bytes_written, size);

    /* the last reference: the staged data becomes the cached version */
    writer_file_close_writer(file);
    writer_file_put(&file);
    assert_int_equal(staging_files(f), 0);
    struct cache_object *object = NULL;
    assert_int_equal(cache_object_open(f->cache, "d/small", etag, size,
                                       &object), 0);
    assert_true(cache_block_present(f->cache, object, 0));
    cache_object_close(f->cache, &object);
    free(bytes);
}

static void test_default_close_of_a_large_file_written_in_order(void **state)
{
    struct fixture *f = *state;
    size_t size = 11 * MIB;
    unsigned char *bytes = pattern(size, 2);
    char etag[S3_ETAG_MAX];
    struct entry_copy entries[MAX_ENTRIES];

    struct writer_file *file = file_open(f, "big");
    file_write(file, 0, bytes, size, MIB);
    /* past the threshold from byte 0: a write-behind upload, journaled
     * as unclosed (to abort after a crash) */
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_CREATE, "big")), 1);
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "big");
    assert_true(entries[0].unclosed);
    assert_true(entries[0].has_upload_id);

    assert_int_equal(writer_file_flush(file), 0);
    fake_s3_multipart_etag_of(bytes, size, PART_SIZE, etag);
    assert_true(fake_s3_holds(f->s3, "big", bytes, size));
    assert_string_equal(f->last_etag, etag);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, NULL)), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_PART, "big")), 3);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_COMPLETE, "big")), 1);
    assert_int_equal(fake_s3_uploads(f->s3, NULL), 0);
    /* created without an mtime header: the object's Last-Modified (one
     * HEAD) is the file's mtime */
    struct s3_object_info info;
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(fake_s3_get(f->s3, "big", &data, &len, &info), 0);
    free(data);
    assert_false(info.has_mtime);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_HEAD, "big")), 1);
    assert_int_equal(f->last_meta.mtime.tv_sec, info.last_modified.tv_sec);
    assert_int_equal(journal_entries(f, entries), 0);

    writer_file_close_writer(file);
    writer_file_put(&file);
    free(bytes);
}

/* Flush of a file on a thread of its own, waiting for its complete. */
static void test_default_close_of_a_large_file_written_backwards(void **state)
{
    struct fixture *f = *state;
    size_t size = 11 * MIB;
    unsigned char *bytes = pattern(size, 3);
    char etag[S3_ETAG_MAX];
    struct entry_copy entries[MAX_ENTRIES];
    struct call_thread flush;
    unsigned rule = 0;

    struct writer_file *file = file_open(f, "back");
    /* from the end to the start: never written contiguously from byte 0
     * past the threshold, so no write-behind: the parts go at close */
    for (size_t at = size; at > 0; at -= MIB)
        file_write(file, at - MIB, bytes + at - MIB, MIB, 0);
    assert_int_equal(fake_s3_count(f->s3, NULL), 0);

    assert_int_equal(
        fake_s3_hold(f->s3, ON(FAKE_S3_MP_COMPLETE, "back"), &rule), 0);
    call_start(&flush, file, CALL_FLUSH);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    /* while the parts are up: the upload id is journaled with the closed
     * version, so a crash leaves no multipart upload behind */
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "back");
    assert_false(entries[0].unclosed);
    assert_true(entries[0].has_upload_id);
    assert_int_equal(entries[0].size, size);
    assert_int_equal(fake_s3_uploads(f->s3, "back"), 1);
    fake_s3_hold_clear(f->s3, rule);
    pthread_join(flush.thread, NULL);
    assert_int_equal(flush.result, 0);

    fake_s3_multipart_etag_of(bytes, size, PART_SIZE, etag);
    assert_true(fake_s3_holds(f->s3, "back", bytes, size));
    assert_string_equal(f->last_etag, etag);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_PART, "back")), 3);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_HEAD, NULL)), 0);
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_close_writer(file);
    writer_file_put(&file);
    free(bytes);
}

static void test_default_failed_upload_is_retried(void **state)
{
    struct fixture *f = *state;
    size_t size = 64 * KIB;
    unsigned char *bytes = pattern(size, 4);
    char etags[4][S3_ETAG_MAX], etag[S3_ETAG_MAX];
    struct entry_copy entries[MAX_ENTRIES];

    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "r"), 1, EACCES, false,
                                  NULL), 0);
    struct writer_file *file = file_open(f, "r");
    file_write(file, 0, bytes, size, 0);
    assert_int_equal(writer_file_flush(file), EACCES);
    writer_file_close_writer(file);

    /* not in the bucket, but kept: staged, pending, promised */
    assert_false(fake_s3_holds(f->s3, "r", bytes, size));
    assert_true(writer_file_pending(file));
    assert_true(file_reads(file, bytes, size));
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "r");
    assert_int_equal(entries[0].size, size);
    assert_false(entries[0].unclosed);
    struct writer_stats stats = stats_of(f);
    assert_int_equal(stats.upload_failures, 1);
    assert_int_equal(stats.upload_retries, 1);
    assert_int_equal(stats.uploads_pending, 1);

    /* the background retry (about a second later) takes it up */
    assert_int_equal(wait_uploads(f, 1), 0);
    fake_s3_etag_of(bytes, size, etag);
    assert_true(fake_s3_holds(f->s3, "r", bytes, size));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "r")), 2);
    assert_int_equal(etags_made(f, FAKE_S3_PUT, "r", etags, 4), 1);
    assert_string_equal(etags[0], etag);
    assert_false(writer_file_pending(file));
    assert_int_equal(journal_entries(f, entries), 0);
    assert_int_equal(stats_of(f).uploads_completed, 1);
    writer_file_put(&file);
    free(bytes);
}

static void test_default_lost_answers(void **state)
{
    struct fixture *f = *state;
    size_t size = 6 * MIB;
    unsigned char *bytes = pattern(size, 5);
    char etag[S3_ETAG_MAX];
    struct entry_copy entries[MAX_ENTRIES];

    /* the complete's answer is lost after the bucket made the object:
     * one HEAD shows it is this upload, and close succeeds */
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_MP_COMPLETE, "m"), 1, EIO,
                                  true, NULL), 0);
    struct writer_file *file = file_open(f, "m");
    file_write(file, 0, bytes, size, MIB);
    assert_int_equal(writer_file_flush(file), 0);
    fake_s3_multipart_etag_of(bytes, size, PART_SIZE, etag);
    assert_string_equal(f->last_etag, etag);
    assert_true(fake_s3_holds(f->s3, "m", bytes, size));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_COMPLETE, "m")), 1);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, NULL)), 0);
    assert_int_equal(stats_of(f).upload_failures, 0);
    writer_file_close_writer(file);
    writer_file_put(&file);

    /* a PUT's answer is lost: close fails (nobody can tell), the data is
     * kept and promised, and the retry sends it again */
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "p"), 1, ECONNRESET,
                                  true, NULL), 0);
    file = file_open(f, "p");
    file_write(file, 0, bytes, 10 * KIB, 0);
    assert_int_equal(writer_file_flush(file), ECONNRESET);
    writer_file_close_writer(file);
    assert_true(fake_s3_holds(f->s3, "p", bytes, 10 * KIB));
    assert_true(writer_file_pending(file));
    assert_int_equal(journal_entries(f, entries), 1);
    assert_int_equal(wait_uploads(f, 2), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "p")), 2);
    assert_true(fake_s3_holds(f->s3, "p", bytes, 10 * KIB));
    assert_false(writer_file_pending(file));
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_put(&file);
    free(bytes);
}

/*
 * A multipart upload whose parts and whose abort both failed is not
 * forgotten: upload.c hands it over (upload_conf.abort_failed), the writer
 * journals it as an unclosed entry of its own, and the drain aborts it
 * and drops that entry. (Before: the file's promise kept that upload's
 * id, but the next attempt journaled its own upload's id in its place,
 * and the first upload stayed in the bucket, billed, with nothing left to
 * abort it.)
 */
static void test_failed_abort_is_not_forgotten(void **state)
{
    struct fixture *f = *state;
    size_t size = 2 * MIB;
    struct entry_copy entries[MAX_ENTRIES];

    unsigned char *bytes = f->scratch = pattern(size, 6);
    /* the parts and the abort of the first attempt fail */
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_MP_PART, "m"), 1, EIO,
                                  false, NULL), 0);
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_MP_ABORT, "m"), 1, EIO,
                                  false, NULL), 0);
    struct writer_file *file = file_open(f, "m");
    /* (not in order from byte 0: no write-behind, the parts go at close) */
    file_write(file, MIB, bytes + MIB, size - MIB, 0);
    file_write(file, 0, bytes, MIB, 0);
    assert_int_equal(writer_file_flush(file), EIO);
    assert_int_equal(fake_s3_uploads(f->s3, "m"), 1);
    /* the promise, and the upload left over in an entry of its own */
    assert_int_equal(journal_entries(f, entries), 2);
    assert_true(entries[0].has_upload_id && entries[1].has_upload_id);
    assert_true(entries[0].unclosed != entries[1].unclosed);

    /* the next attempt succeeds */
    assert_int_equal(writer_file_sync(file), 0);
    assert_true(fake_s3_holds(f->s3, "m", bytes, size));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_CREATE, "m")), 2);
    writer_file_close_writer(file);
    writer_file_put(&file);
    assert_int_equal(writer_drain(f->writer), 0);
    /* the first upload aborted by the drain, and its entry gone */
    assert_int_equal(fake_s3_uploads(f->s3, "m"), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_ABORT, "m")), 2);
    assert_int_equal(journal_entries(f, entries), 0);
}

/* ----------------------------------------------------- writeback mode */

/*
 * Write version SEED of KEY's file (SIZE bytes, over whatever it held: a
 * truncate to 0 first, as open(O_TRUNC)), close it: returns its bytes.
 */
static unsigned char *write_version(struct writer_file *file, size_t size,
                                    unsigned seed)
{
    unsigned char *bytes = pattern(size, seed);

    writer_file_open_writer(file);
    assert_int_equal(writer_file_truncate(file, 0), 0);
    file_write(file, 0, bytes, size, 0);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    return bytes;
}

static void test_writeback_close_does_not_wait_for_an_upload(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    char etags[4][S3_ETAG_MAX], etag[S3_ETAG_MAX];
    unsigned rule = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "ckpt"), &rule), 0);
    struct writer_file *file = NULL;
    assert_int_equal(writer_file_create(f->writer, "ckpt", &file_meta, true,
                                        NULL, &file), 0);
    unsigned char *v1 = write_version(file, 300 * KIB, 11);
    /* journaled when close returned, uploaded later */
    assert_int_equal(journal_entries(f, entries), 1);
    assert_int_equal(entries[0].size, 300 * KIB);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);

    /* a new version closes while the old one's PUT is held: close does
     * not wait, and a read right after it returns the new bytes */
    unsigned char *v2 = write_version(file, 200 * KIB, 12);
    assert_int_equal(fake_s3_held(f->s3, rule), 1);
    assert_true(file_reads(file, v2, 200 * KIB));
    assert_int_equal(journal_entries(f, entries), 1); /* one promise a key */
    assert_int_equal(entries[0].size, 200 * KIB);
    assert_true(writer_file_pending(file));

    /* the held PUT sends the version it began with, unchanged */
    fake_s3_release(f->s3, rule, false, NULL);
    assert_int_equal(wait_uploads(f, 1), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", v1, 300 * KIB));
    assert_true(file_reads(file, v2, 200 * KIB));
    assert_int_equal(stats_of(f).copies_on_write, 1); /* how: v2 is a copy */
    /* then the newer one */
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    fake_s3_release(f->s3, rule, false, NULL);
    assert_int_equal(wait_uploads(f, 2), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", v2, 200 * KIB));
    assert_int_equal(etags_made(f, FAKE_S3_PUT, "ckpt", etags, 4), 2);
    fake_s3_etag_of(v1, 300 * KIB, etag);
    assert_string_equal(etags[0], etag);
    fake_s3_etag_of(v2, 200 * KIB, etag);
    assert_string_equal(etags[1], etag);
    assert_false(writer_file_pending(file));
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_put(&file);
    free(v1);
    free(v2);
}

/*
 * Three versions of one file, their uploads held and released at
 * different moments: versions reach the bucket in order, never two
 * uploads of the file at once, and the bucket ends with the last.
 * RELEASE_EACH: each upload is let go before the next version closes
 * (every version goes up); else all three close first (the one in flight
 * goes up, then the last).
 */
static void check_versions_land_in_order(struct fixture *f, const char *key,
                                         bool release_each)
{
    const size_t sizes[3] = {100 * KIB, 130 * KIB, 70 * KIB};
    unsigned char *versions[3];
    char etags[4][S3_ETAG_MAX], etag[S3_ETAG_MAX];
    unsigned rule = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, key), &rule), 0);
    unsigned told = uploads_told(f);
    struct writer_file *file = NULL;
    assert_int_equal(writer_file_create(f->writer, key, &file_meta, true, NULL,
                                        &file), 0);
    for (unsigned v = 0; v < 3; v++) {
        versions[v] = write_version(file, sizes[v], 20 + v);
        assert_true(file_reads(file, versions[v], sizes[v]));
        if (v == 0 || release_each) {
            assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
            assert_int_equal(fake_s3_held(f->s3, rule), 1);
        }
        if (release_each) {
            fake_s3_release(f->s3, rule, false, NULL);
            assert_int_equal(wait_uploads(f, told + v + 1), 0);
            assert_true(fake_s3_holds(f->s3, key, versions[v], sizes[v]));
        }
    }
    if (!release_each) {
        /* the PUT of the first version is still held; the last closes
         * went to the journal only */
        assert_int_equal(fake_s3_held(f->s3, rule), 1);
        fake_s3_release(f->s3, rule, true, NULL);
        assert_int_equal(wait_uploads(f, told + 1), 0);
        assert_true(fake_s3_holds(f->s3, key, versions[0], sizes[0]));
        assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
        assert_int_equal(fake_s3_held(f->s3, rule), 1);
        fake_s3_release(f->s3, rule, true, NULL);
        assert_int_equal(wait_uploads(f, told + 2), 0);
    }
    assert_true(fake_s3_holds(f->s3, key, versions[2], sizes[2]));
    assert_false(writer_file_pending(file));
    /* every PUT of the key, in order, made versions in order */
    size_t made = etags_made(f, FAKE_S3_PUT, key, etags, 4);
    assert_int_equal(made, release_each ? 3 : 2);
    for (size_t i = 0, v = 0; i < made; i++, v++) {
        if (!release_each && i == 1)
            v = 2; /* the second version was never sent: the third was */
        fake_s3_etag_of(versions[v], sizes[v], etag);
        assert_string_equal(etags[i], etag);
    }
    fake_s3_hold_clear(f->s3, rule);
    writer_file_put(&file);
    for (unsigned v = 0; v < 3; v++)
        free(versions[v]);
}

static void test_writeback_versions_land_in_order(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];

    check_versions_land_in_order(f, "each", true);
    check_versions_land_in_order(f, "late", false);
    assert_int_equal(journal_entries(f, entries), 0);
    assert_int_equal(fake_s3_uploads(f->s3, NULL), 0);
}

/* ------------------------------------------------------------- rename */

static void test_rename_states_and_hold(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    enum writer_renamed renamed;
    unsigned char *bytes = pattern(50 * KIB, 30);

    /* UPLOADED: closed, and its upload done */
    struct writer_file *uploaded = file_open(f, "up");
    file_write(uploaded, 0, bytes, 50 * KIB, 0);
    assert_int_equal(writer_file_flush(uploaded), 0);
    writer_file_close_writer(uploaded);
    assert_int_equal(wait_uploads(f, 1), 0);
    assert_int_equal(writer_file_hold(uploaded, &renamed), 0);
    assert_int_equal(renamed, WRITER_RENAMED_UPLOADED);
    assert_int_equal(writer_file_rename(uploaded, "up2", NULL), 0);
    writer_file_release(uploaded);
    writer_file_put(&uploaded);

    /* UNSAVED: written, never closed */
    struct writer_file *unsaved = file_open(f, "un");
    file_write(unsaved, 0, bytes, 10 * KIB, 0);
    assert_int_equal(writer_file_hold(unsaved, &renamed), 0);
    assert_int_equal(renamed, WRITER_RENAMED_UNSAVED);
    assert_int_equal(writer_file_rename(unsaved, "un2", NULL), 0);
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_release(unsaved);

    /* JOURNALED: closed (still open elsewhere, so not queued yet) */
    struct writer_file *journaled = file_open(f, "jo");
    file_write(journaled, 0, bytes, 20 * KIB, 0);
    assert_int_equal(writer_file_flush(journaled), 0);
    assert_int_equal(writer_file_hold(journaled, &renamed), 0);
    assert_int_equal(renamed, WRITER_RENAMED_JOURNALED);
    assert_int_equal(writer_file_rename(journaled, "jo2", NULL), 0);
    /* the promise follows the key at once */
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "jo2");

    /* held: its last close queues it, and a file queued after it goes up,
     * but it does not */
    writer_file_close_writer(journaled);
    struct writer_file *other = file_open(f, "other");
    file_write(other, 0, bytes, KIB, 0);
    assert_int_equal(writer_file_flush(other), 0);
    writer_file_close_writer(other);
    assert_int_equal(wait_uploads(f, 2), 0);
    assert_string_equal(f->last_key, "other");
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "jo")), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "jo2")), 0);
    assert_true(writer_file_pending(journaled));
    writer_file_release(journaled);
    assert_int_equal(wait_uploads(f, 3), 0);
    assert_true(fake_s3_holds(f->s3, "jo2", bytes, 20 * KIB));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "jo")), 0);
    assert_false(writer_file_pending(journaled));

    /* the unsaved file closes under its new name */
    assert_int_equal(writer_file_flush(unsaved), 0);
    writer_file_close_writer(unsaved);
    assert_int_equal(wait_uploads(f, 4), 0);
    assert_true(fake_s3_holds(f->s3, "un2", bytes, 10 * KIB));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "un")), 0);
    assert_int_equal(journal_entries(f, entries), 0);

    writer_file_put(&journaled);
    writer_file_put(&unsaved);
    writer_file_put(&other);
    free(bytes);
}

/* In the default mode, a failed upload's promise makes it JOURNALED. */
static void test_rename_of_a_failed_upload(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    enum writer_renamed renamed;
    unsigned char *bytes = pattern(8 * KIB, 31);
    unsigned rule = 0;

    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "f"), FAKE_S3_ALWAYS,
                                  EIO, false, &rule), 0);
    struct writer_file *file = file_open(f, "f");
    file_write(file, 0, bytes, 8 * KIB, 0);
    assert_int_equal(writer_file_flush(file), EIO);
    assert_int_equal(writer_file_hold(file, &renamed), 0);
    assert_int_equal(renamed, WRITER_RENAMED_JOURNALED);
    assert_int_equal(writer_file_rename(file, "g", NULL), 0);
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "g");
    writer_file_release(file);
    fake_s3_fail_clear(f->s3, rule);
    /* fsync sends it, to the new key */
    assert_int_equal(writer_file_sync(file), 0);
    assert_true(fake_s3_holds(f->s3, "g", bytes, 8 * KIB));
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_close_writer(file);
    writer_file_put(&file);
    free(bytes);
}

/* ------------------------------------------------------------- unlink */

static void test_unlink_while_the_upload_is_held(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    unsigned char *bytes = pattern(40 * KIB, 40);
    struct call_thread unlinker;
    unsigned rule = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "d/f"), &rule), 0);
    struct writer_file *file = file_open(f, "d/f");
    file_write(file, 0, bytes, 40 * KIB, 0);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);

    /* unlink waits for the upload under way, and says it landed: the
     * caller deletes what it made */
    call_start(&unlinker, file, CALL_UNLINK);
    fake_s3_hold_clear(f->s3, rule);
    pthread_join(unlinker.thread, NULL);
    assert_int_equal(unlinker.result, true);
    assert_int_equal(s3_delete_object(f->s3, "d/f"), 0);

    long put = fake_s3_log_find(f->s3, 0, ON(FAKE_S3_PUT, "d/f"));
    long deleted = fake_s3_log_find(f->s3, 0, ON(FAKE_S3_DELETE, "d/f"));
    assert_true(put >= 0 && deleted > put);
    struct fake_s3_request request;
    assert_int_equal(fake_s3_log_get(f->s3, (size_t)put, &request), 0);
    assert_true(request.done);
    assert_int_equal(request.result, 0);
    assert_int_equal(fake_s3_count(f->s3, NULL), 2);
    char **keys = NULL;
    size_t count = 0;
    assert_int_equal(fake_s3_keys(f->s3, NULL, &keys, &count), 0);
    assert_int_equal(count, 0);
    fake_s3_keys_free(keys, count);
    assert_false(writer_file_pending(file));
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_put(&file);
    /* (the uploader drops its reference once its upload has ended: the
     * drain waits for that) */
    assert_int_equal(writer_drain(f->writer), 0);
    assert_int_equal(staging_files(f), 0);

    /* a file unlinked before its upload began is never sent */
    file = file_open(f, "d/g");
    file_write(file, 0, bytes, KIB, 0);
    assert_int_equal(writer_file_flush(file), 0);
    assert_int_equal(journal_entries(f, entries), 1);
    assert_false(writer_file_unlink(file, true));
    writer_file_close_writer(file);
    writer_file_put(&file);
    assert_int_equal(writer_drain(f->writer), 0);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "d/g")), 0);
    assert_int_equal(journal_entries(f, entries), 0);
    assert_int_equal(staging_files(f), 0);
    free(bytes);
}

/* ----------------------------------------------------------- recovery */

/* The mount ends without a drain: every reference put, the writer and
 * the journal closed as a kill would leave them. */
static void crash(struct fixture *f, struct writer_file **files, size_t count)
{
    for (size_t i = 0; i < count; i++)
        writer_file_put(&files[i]);
    writer_destroy(&f->writer);
    journal_close(&f->journal);
}

/*
 * Writeback: version 1 (multipart) closed and its upload begun, its
 * CreateMultipartUpload held at the fake; version 2 (small) closed
 * meanwhile, promised. When the create is released, the journal still
 * promises version 2, and names version 1's upload, which recovery aborts
 * before it uploads version 2; after a crash there, version 2 is what the
 * bucket ends with. (Before: the upload's start journaled version 1 with
 * its id over version 2's promise, and recovery uploaded version 1;
 * found by the crash torture, seed 3068818.)
 */
static void test_older_upload_begun_after_a_newer_promise(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    unsigned create = 0, parts = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_MP_CREATE, "ckpt"),
                                  &create), 0);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_MP_PART, "ckpt"),
                                  &parts), 0);
    struct writer_file *file = NULL;
    assert_int_equal(writer_file_create(f->writer, "ckpt", &file_meta, true,
                                        NULL, &file), 0);
    unsigned char *v1 = write_version(file, 2 * MIB, 21);
    assert_int_equal(fake_s3_wait_held(f->s3, create, 1), 0);
    unsigned char *v2 = write_version(file, 10 * KIB, 22);
    assert_int_equal(journal_entries(f, entries), 1);
    assert_int_equal(entries[0].size, 10 * KIB);
    assert_false(entries[0].has_upload_id);

    /* version 1's upload now exists: the promise stays version 2's */
    fake_s3_release(f->s3, create, false, NULL);
    assert_int_equal(fake_s3_wait_held(f->s3, parts, 1), 0);
    assert_int_equal(journal_entries(f, entries), 1);
    assert_int_equal(entries[0].size, 10 * KIB);
    assert_false(entries[0].unclosed);
    assert_true(entries[0].has_upload_id);

    /* a crash with version 1's parts on their way: nothing more reaches
     * the bucket */
    assert_int_equal(fake_s3_fail(f->s3, FAKE_S3_ON(
                                      FAKE_S3_UPLOADS |
                                      FAKE_S3_CALL(FAKE_S3_MP_ABORT), NULL),
                                  FAKE_S3_ALWAYS, EIO, false, NULL), 0);
    fake_s3_hold_clear(f->s3, 0);
    crash(f, &file, 1);
    fake_s3_fail_clear(f->s3, 0);
    journal_start(f);
    writer_start(f);
    assert_int_equal(writer_recover(f->writer, on_adopt, NULL, f), 0);
    assert_int_equal(writer_drain(f->writer), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", v2, 10 * KIB));
    assert_int_equal(fake_s3_uploads(f->s3, "ckpt"), 0);
    assert_int_equal(journal_entries(f, entries), 0);
    adopted_put(f);
    free(v1);
    free(v2);
}

static void *flush_on_thread(void *arg)
{
    struct writer_file *file = arg;

    return (void *)(intptr_t)writer_file_flush(file);
}

/*
 * Writeback: eight closes that arrive while a journal commit is under way
 * (held here) share the next one: one commit for all eight promises, and
 * every close returns only then. A crash right after loses none of them:
 * the next mount uploads all eight, each as it was closed.
 */
static void test_writeback_closes_share_a_commit_and_survive_a_crash(
    void **state)
{
    struct fixture *f = *state;
    enum { FILES = 8 };
    struct writer_file *files[FILES];
    unsigned char *data[FILES];
    pthread_t threads[FILES];
    char key[16];

    /* nothing reaches the bucket before the crash */
    assert_int_equal(fake_s3_fail(f->s3, FAKE_S3_ON(FAKE_S3_UPLOADS, NULL),
                                  FAKE_S3_ALWAYS, EIO, false, NULL), 0);
    for (unsigned i = 0; i < FILES; i++) {
        snprintf(key, sizeof(key), "small%u", i);
        data[i] = pattern(10 * KIB + i, 60 + i);
        files[i] = file_open(f, key);
        file_write(files[i], 0, data[i], 10 * KIB + i, 0);
    }
    journal_hold(f->journal, true);
    uint64_t before = journal_commits(f->journal);
    for (unsigned i = 0; i < FILES; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, flush_on_thread,
                                        files[i]), 0);
    journal_wait_queued(f->journal, FILES);
    assert_int_equal(journal_commits(f->journal), before);
    journal_hold(f->journal, false);
    for (unsigned i = 0; i < FILES; i++) {
        void *result = NULL;
        pthread_join(threads[i], &result);
        assert_int_equal((intptr_t)result, 0);
    }
    assert_int_equal(journal_commits(f->journal), before + 1);

    crash(f, files, FILES);
    fake_s3_fail_clear(f->s3, 0);
    journal_start(f);
    writer_start(f);
    assert_int_equal(writer_recover(f->writer, on_adopt, NULL, f), 0);
    assert_int_equal(writer_drain(f->writer), 0);
    for (unsigned i = 0; i < FILES; i++) {
        snprintf(key, sizeof(key), "small%u", i);
        assert_true(fake_s3_holds(f->s3, key, data[i], 10 * KIB + i));
        free(data[i]);
    }
    adopted_put(f);
}

static void test_recovery_uploads_what_was_closed(void **state)
{
    struct fixture *f = *state;
    struct entry_copy entries[MAX_ENTRIES];
    const size_t a_size = 300 * KIB, b_size = 200 * KIB, c_size = 2 * MIB;
    const size_t d_size = 100 * KIB, e_size = 120 * KIB, f_size = 2 * MIB;
    const size_t g_size = 100 * KIB, g_more = 2 * MIB;
    unsigned char *a = pattern(a_size, 50), *b = pattern(b_size + 50 * KIB, 51);
    unsigned char *c = pattern(c_size, 52), *d = pattern(d_size, 53);
    unsigned char *e1 = pattern(e_size, 54), *e2 = pattern(e_size, 55);
    unsigned char *f_bytes = pattern(f_size, 56), *g1 = pattern(g_size, 57);
    unsigned char *g2 = pattern(g_more, 58);
    struct writer_file *files[7];

    /* the bucket refuses every upload (creating one excepted) and abort */
    assert_int_equal(fake_s3_fail(f->s3, FAKE_S3_ON(
                                      (FAKE_S3_UPLOADS &
                                       ~FAKE_S3_CALL(FAKE_S3_MP_CREATE)) |
                                      FAKE_S3_CALL(FAKE_S3_MP_ABORT), NULL),
                                  FAKE_S3_ALWAYS, EIO, false, NULL), 0);

    /* a: closed (its upload failed: journaled), then reopened with
     * O_TRUNC and a few bytes written, never closed */
    files[0] = file_open(f, "a");
    file_write(files[0], 0, a, a_size, 64 * KIB);
    assert_int_equal(writer_file_flush(files[0]), EIO);
    assert_int_equal(writer_file_truncate(files[0], 0), 0);
    file_write(files[0], 0, (const unsigned char *)"xyz", 3, 0);
    /* b: closed, then appended to, never closed again */
    files[1] = file_open(f, "b");
    file_write(files[1], 0, b, b_size, 0);
    assert_int_equal(writer_file_flush(files[1]), EIO);
    file_write(files[1], b_size, b + b_size, 50 * KIB, 0);
    /* c: past the threshold from byte 0, never closed: a write-behind
     * upload, journaled as unclosed */
    files[2] = file_open(f, "c");
    file_write(files[2], 0, c, c_size, 256 * KIB);
    assert_int_equal(fake_s3_uploads(f->s3, "c"), 1);
    /* d: written, never closed */
    files[3] = file_open(f, "d");
    file_write(files[3], 0, d, d_size, 0);
    /* e: closed twice; the second promise replaces the first */
    files[4] = file_open(f, "e");
    file_write(files[4], 0, e1, e_size, 0);
    assert_int_equal(writer_file_flush(files[4]), EIO);
    file_write(files[4], 0, e2, e_size, 0);
    assert_int_equal(writer_file_flush(files[4]), EIO);
    /* f: past the threshold but not from byte 0 in order (no
     * write-behind): its close creates a multipart upload, journals the
     * promise with the upload's id, and fails; the abort fails too */
    files[5] = file_open(f, "f");
    file_write(files[5], MIB, f_bytes + MIB, f_size - MIB, 0);
    file_write(files[5], 0, f_bytes, MIB, 0);
    assert_int_equal(writer_file_flush(files[5]), EIO);
    assert_int_equal(fake_s3_uploads(f->s3, "f"), 1);
    /* (its retries create no other upload, so that the one upload is
     * what recovery aborts) */
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_MP_CREATE, "f"),
                                  FAKE_S3_ALWAYS, EIO, false, NULL), 0);
    /* g: closed (failed: promised), then rewritten from byte 0 past the
     * threshold: a write-behind upload, its id in g's promise */
    files[6] = file_open(f, "g");
    file_write(files[6], 0, g1, g_size, 0);
    assert_int_equal(writer_file_flush(files[6]), EIO);
    assert_int_equal(writer_file_truncate(files[6], 0), 0);
    file_write(files[6], 0, g2, g_more, 256 * KIB);
    assert_int_equal(fake_s3_uploads(f->s3, "g"), 1);

    /* (and f's upload, whose abort failed, in an unclosed entry of its
     * own: see test_failed_abort_is_not_forgotten) */
    size_t count = journal_entries(f, entries);
    assert_int_equal(count, 7);
    unsigned f_entries = 0, f_unclosed = 0;
    for (size_t i = 0; i < count; i++)
        if (strcmp(entries[i].key, "f") == 0) {
            f_entries++;
            f_unclosed += entries[i].unclosed && entries[i].has_upload_id;
        }
    assert_int_equal(f_entries, 2);
    assert_int_equal(f_unclosed, 1);
    assert_int_equal(entry_for(entries, count, "a")->size, a_size);
    assert_int_equal(entry_for(entries, count, "b")->size, b_size);
    assert_true(entry_for(entries, count, "c")->unclosed);
    assert_null(entry_for(entries, count, "d"));
    assert_int_equal(entry_for(entries, count, "e")->size, e_size);
    assert_int_equal(entry_for(entries, count, "f")->size, f_size);
    assert_true(entry_for(entries, count, "f")->has_upload_id);
    assert_int_equal(entry_for(entries, count, "g")->size, g_size);
    assert_false(entry_for(entries, count, "g")->unclosed);
    assert_true(entry_for(entries, count, "g")->has_upload_id);
    /* what is written still reads back (the copy, the append) */
    assert_true(file_reads(files[0], (const unsigned char *)"xyz", 3));
    assert_true(file_reads(files[1], b, b_size + 50 * KIB));

    crash(f, files, 7);

    /* the next mount, on the same cache directory and journal */
    fake_s3_fail_clear(f->s3, 0);
    fake_s3_log_clear(f->s3);
    journal_start(f);
    writer_start(f);
    assert_int_equal(writer_recover(f->writer, on_adopt, NULL, f), 0);
    /* the staging files no promise names are gone (a's copy, c, d, g's
     * copy): the five promised ones stay */
    assert_int_equal(staging_files(f), 5);
    assert_int_equal(writer_drain(f->writer), 0);

    assert_true(fake_s3_holds(f->s3, "a", a, a_size));
    assert_true(fake_s3_holds(f->s3, "b", b, b_size));
    assert_true(fake_s3_holds(f->s3, "e", e2, e_size));
    assert_true(fake_s3_holds(f->s3, "f", f_bytes, f_size));
    assert_true(fake_s3_holds(f->s3, "g", g1, g_size));
    char **keys = NULL;
    size_t key_count = 0;
    assert_int_equal(fake_s3_keys(f->s3, NULL, &keys, &key_count), 0);
    assert_int_equal(key_count, 5); /* no c, no d */
    fake_s3_keys_free(keys, key_count);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, NULL)), 4);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_CREATE, NULL)), 1);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_MP_COMPLETE, "f")), 1);
    /* c's upload was aborted, nothing else done for it (twice when the
     * simulated crash's abandon, refused, kept it in an entry of its own
     * too: a kill -9 abandons nothing); f's and g's aborted before their
     * promises went up */
    unsigned c_aborts = fake_s3_count(f->s3, ON(FAKE_S3_MP_ABORT, "c"));
    assert_true(c_aborts >= 1 && c_aborts <= 2);
    assert_int_equal(fake_s3_count(f->s3, FAKE_S3_ON(0, "c")), c_aborts);
    long aborted = fake_s3_log_find(f->s3, 0, ON(FAKE_S3_MP_ABORT, "f"));
    assert_true(aborted >= 0 &&
                fake_s3_log_find(f->s3, 0, ON(FAKE_S3_MP_CREATE, "f")) >
                    aborted);
    aborted = fake_s3_log_find(f->s3, 0, ON(FAKE_S3_MP_ABORT, "g"));
    assert_true(aborted >= 0 &&
                fake_s3_log_find(f->s3, 0, ON(FAKE_S3_PUT, "g")) > aborted);
    assert_int_equal(fake_s3_uploads(f->s3, NULL), 0);
    assert_int_equal(journal_entries(f, entries), 0);

    /* each recovered file was handed to the fs layer with its promise */
    static const char *const promised[] = {"a", "b", "e", "f", "g"};
    const uint64_t promised_sizes[] = {a_size, b_size, e_size, f_size, g_size};
    assert_int_equal(f->adopted_count, 5);
    for (unsigned i = 0; i < f->adopted_count; i++) {
        assert_string_equal(f->adopted_keys[i], promised[i]); /* key order */
        assert_int_equal(f->adopted_sizes[i], promised_sizes[i]);
        assert_false(writer_file_pending(f->adopted[i]));
    }
    adopted_put(f);
    assert_int_equal(staging_files(f), 0);
    free(a);
    free(b);
    free(c);
    free(d);
    free(e1);
    free(e2);
    free(f_bytes);
    free(g1);
    free(g2);
}

/* ------------------------------------------------- sync and pending */

/* writer_sync() on a thread of its own (it waits for held uploads). */
struct sync_thread {
    pthread_t thread;
    struct writer *writer;
    atomic_bool interrupted;
    atomic_bool done;
    struct writer_sync_report report;
    int result;
};

static void *sync_main(void *arg)
{
    struct sync_thread *sync = arg;

    sync->result = writer_sync(sync->writer, &sync->interrupted, &sync->report);
    atomic_store(&sync->done, true);
    return NULL;
}

/* Start a sync in a thread of its own; returns once it has taken its list
 * of pending files (it is among the writer's waiting syncs) or is done,
 * so that what the test does next happens after the sync began. */
static void sync_start(struct sync_thread *sync, struct writer *writer)
{
    struct writer_stats stats;
    uint64_t before;
    double until = clock_monotonic_seconds() + WAIT_SECONDS;

    memset(sync, 0, sizeof(*sync));
    sync->writer = writer;
    sync->result = -1;
    atomic_init(&sync->interrupted, false);
    atomic_init(&sync->done, false);
    writer_get_stats(writer, &stats);
    before = stats.syncs_waiting;
    assert_int_equal(pthread_create(&sync->thread, NULL, sync_main, sync), 0);
    for (;;) {
        writer_get_stats(writer, &stats);
        if (stats.syncs_waiting > before || atomic_load(&sync->done))
            break;
        assert_true(clock_monotonic_seconds() < until);
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
}

static void sync_join(struct sync_thread *sync)
{
    assert_int_equal(pthread_join(sync->thread, NULL), 0);
    assert_int_equal(sync->result, 0);
}

/* KEY's entry in REPORT (the test fails without one). */
static const struct writer_synced *synced_of(const struct writer_sync_report *report,
                                             const char *key)
{
    for (size_t i = 0; i < report->count; i++)
        if (strcmp(report->files[i].key, key) == 0)
            return &report->files[i];
    fail_msg("no %s in the sync's report", key);
    return NULL;
}

/* KEY's entry among the pending files LIST (COUNT), or NULL. */
static const struct writer_pending *pending_of(const struct writer_pending *list,
                                               size_t count, const char *key)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(list[i].key, key) == 0)
            return &list[i];
    return NULL;
}

/* A new file KEY with LEN bytes of pattern SEED, closed (flush, release):
 * the file (a reference) and its bytes in *BYTES. FLUSHED: what flush
 * returned. */
static struct writer_file *closed_file(struct fixture *f, const char *key,
                                       size_t len, unsigned seed,
                                       unsigned char **bytes, int flushed)
{
    struct writer_file *file = file_open(f, key);

    *bytes = pattern(len, seed);
    file_write(file, 0, *bytes, len, 256 * KIB);
    assert_int_equal(writer_file_flush(file), flushed);
    writer_file_close_writer(file);
    return file;
}

/*
 * Writeback: three files closed, every upload held at the fake (a large
 * one in parts). writer_sync() does not return while they are held; once
 * they are released it returns with each file uploaded, its size told,
 * and the bucket holds every byte. A file that was already in the bucket
 * is not in the report.
 */
static void test_sync_uploads_every_pending_file(void **state)
{
    struct fixture *f = *state;
    struct writer_file *files[4];
    unsigned char *bytes[4];
    static const char *const keys[] = {"a", "big", "c", "old"};
    const size_t sizes[] = {100 * KIB + 1, 7 * MIB + 3, 10 * KIB, 5 * KIB};
    struct sync_thread sync;
    unsigned rule = 0;

    /* "old" is in the bucket before: nothing to wait for */
    files[3] = closed_file(f, keys[3], sizes[3], 30, &bytes[3], 0);
    assert_int_equal(wait_uploads(f, 1), 0);
    assert_int_equal(fake_s3_hold(f->s3, FAKE_S3_ON(FAKE_S3_UPLOADS, NULL),
                                  &rule), 0);
    for (unsigned i = 0; i < 3; i++)
        files[i] = closed_file(f, keys[i], sizes[i], 31 + i, &bytes[i], 0);

    sync_start(&sync, f->writer);
    /* both uploaders are held: the sync cannot be done */
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 2), 0);
    assert_false(atomic_load(&sync.done));
    assert_int_equal(stats_of(f).uploads_pending, 3);
    fake_s3_hold_clear(f->s3, rule);
    sync_join(&sync);

    assert_false(sync.report.interrupted);
    assert_int_equal(sync.report.count, 3);
    for (unsigned i = 0; i < 3; i++) {
        const struct writer_synced *synced = synced_of(&sync.report, keys[i]);
        assert_int_equal(synced->outcome, WRITER_SYNC_UPLOADED);
        assert_int_equal(synced->size, sizes[i]);
        assert_int_equal(synced->err, 0);
        /* in the bucket when the sync returns */
        assert_true(fake_s3_holds(f->s3, keys[i], bytes[i], sizes[i]));
        assert_false(writer_file_pending(files[i]));
    }
    assert_true(fake_s3_count(f->s3, ON(FAKE_S3_MP_PART, "big")) >= 2);
    assert_int_equal(stats_of(f).uploads_pending, 0);
    writer_sync_report_free(&sync.report);
    for (unsigned i = 0; i < 4; i++) {
        writer_file_put(&files[i]);
        free(bytes[i]);
    }
}

/*
 * Writeback: a directory marker waiting to be sent, whose PUT is held,
 * and two files closed in it. A sync takes its files when it begins:
 * they are in its report even though their uploads land while it is
 * still sending the marker (before, it sent the markers first and took
 * the files afterwards: a sync begun then reported none of them).
 */
static void test_sync_takes_its_files_before_the_markers(void **state)
{
    struct fixture *f = *state;
    const struct s3_put_meta dir_meta = {.content_type = "application/x-directory"};
    unsigned char *x_bytes, *y_bytes;
    struct sync_thread sync;
    unsigned rule = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "d/"), &rule), 0);
    assert_int_equal(writer_marker_put(f->writer, "d/", &dir_meta), 0);
    struct writer_file *x = closed_file(f, "d/x", 10 * KIB, 50, &x_bytes, 0);
    struct writer_file *y = closed_file(f, "d/y", 20 * KIB, 51, &y_bytes, 0);
    sync_start(&sync, f->writer);
    assert_int_equal(wait_uploads(f, 2), 0);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    assert_false(atomic_load(&sync.done));          /* the marker is held */
    fake_s3_hold_clear(f->s3, rule);
    sync_join(&sync);
    assert_int_equal(sync.report.count, 2);
    assert_int_equal(synced_of(&sync.report, "d/x")->outcome, WRITER_SYNC_UPLOADED);
    assert_int_equal(synced_of(&sync.report, "d/y")->outcome, WRITER_SYNC_UPLOADED);
    assert_true(fake_s3_holds(f->s3, "d/", "", 0));
    writer_sync_report_free(&sync.report);
    writer_file_put(&x);
    writer_file_put(&y);
    free(x_bytes);
    free(y_bytes);
}

/*
 * Default mode: "good" failed once at close and waits for its retry's
 * backoff (about a second), "bad" is refused for good. writer_sync()
 * sends both now: "good" is uploaded without waiting for the backoff,
 * "bad" is reported FAILED with the upload's errno, and stays pending
 * and journaled; once the bucket takes it, the next sync uploads it.
 */
static void test_sync_reports_a_failed_upload(void **state)
{
    struct fixture *f = *state;
    struct writer_sync_report report;
    struct entry_copy entries[MAX_ENTRIES];
    unsigned char *good_bytes, *bad_bytes;
    atomic_bool never;
    unsigned bad_rule = 0;

    atomic_init(&never, false);
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "good"), 1, EIO,
                                  false, NULL), 0);
    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "bad"), FAKE_S3_ALWAYS,
                                  EACCES, false, &bad_rule), 0);
    struct writer_file *good = closed_file(f, "good", 64 * KIB, 40,
                                           &good_bytes, EIO);
    struct writer_file *bad = closed_file(f, "bad", 32 * KIB, 41, &bad_bytes,
                                          EACCES);

    struct timespec started, ended;
    clock_gettime(CLOCK_MONOTONIC, &started);
    assert_int_equal(writer_sync(f->writer, &never, &report), 0);
    clock_gettime(CLOCK_MONOTONIC, &ended);
    double seconds = (double)(ended.tv_sec - started.tv_sec) +
                     (double)(ended.tv_nsec - started.tv_nsec) / 1e9;
    assert_int_equal(report.count, 2);
    assert_int_equal(synced_of(&report, "good")->outcome, WRITER_SYNC_UPLOADED);
    const struct writer_synced *failed = synced_of(&report, "bad");
    assert_int_equal(failed->outcome, WRITER_SYNC_FAILED);
    assert_int_equal(failed->err, EACCES);
    assert_int_equal(failed->size, 32 * KIB);
    assert_true(failed->retries >= 1);
    writer_sync_report_free(&report);
    /* the retries' backoff (at least 0.75 s) did not decide the timing */
    assert_true(seconds < 0.7);
    assert_true(fake_s3_holds(f->s3, "good", good_bytes, 64 * KIB));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "good")), 2);
    /* the failed one is kept: pending, journaled, its data staged */
    assert_true(writer_file_pending(bad));
    assert_int_equal(journal_entries(f, entries), 1);
    assert_string_equal(entries[0].key, "bad");
    assert_true(file_reads(bad, bad_bytes, 32 * KIB));

    fake_s3_fail_clear(f->s3, bad_rule);
    assert_int_equal(writer_sync(f->writer, &never, &report), 0);
    assert_int_equal(report.count, 1);
    assert_int_equal(synced_of(&report, "bad")->outcome, WRITER_SYNC_UPLOADED);
    writer_sync_report_free(&report);
    assert_true(fake_s3_holds(f->s3, "bad", bad_bytes, 32 * KIB));
    assert_int_equal(journal_entries(f, entries), 0);
    writer_file_put(&good);
    writer_file_put(&bad);
    free(good_bytes);
    free(bad_bytes);
}

/*
 * Writeback: "w" closed once (promised), then written again through a
 * descriptor still open; "n" created and written, never closed. A sync
 * uploads what "w"'s close promised, not the bytes written since (the
 * uploaders send its promise although it is open), and reports "n" as
 * not closed without waiting for it. Closing "w" then promises and
 * uploads its new bytes.
 */
static void test_sync_of_files_open_for_writing(void **state)
{
    struct fixture *f = *state;
    struct writer_sync_report report;
    atomic_bool never;
    size_t v1_size = 80 * KIB, v2_size = 120 * KIB;
    unsigned char *v1 = pattern(v1_size, 50), *v2 = pattern(v2_size, 51);
    unsigned char *n_bytes = pattern(20 * KIB, 52);

    atomic_init(&never, false);
    struct writer_file *w = file_open(f, "w");
    file_write(w, 0, v1, v1_size, 0);
    assert_int_equal(writer_file_flush(w), 0); /* promised; still open */
    file_write(w, 0, v2, v2_size, 0);          /* not closed */
    struct writer_file *n = file_open(f, "n");
    file_write(n, 0, n_bytes, 20 * KIB, 0);

    assert_int_equal(writer_sync(f->writer, &never, &report), 0);
    assert_int_equal(report.count, 2);
    const struct writer_synced *synced = synced_of(&report, "w");
    assert_int_equal(synced->outcome, WRITER_SYNC_UPLOADED);
    assert_int_equal(synced->size, v1_size);
    synced = synced_of(&report, "n");
    assert_int_equal(synced->outcome, WRITER_SYNC_NOT_CLOSED);
    assert_int_equal(synced->size, 20 * KIB);
    writer_sync_report_free(&report);
    /* the bucket has what was closed, and nothing of "n" */
    assert_true(fake_s3_holds(f->s3, "w", v1, v1_size));
    assert_int_equal(fake_s3_count(f->s3, FAKE_S3_ON(0, "n")), 0);
    assert_true(writer_file_pending(w)); /* the bytes not closed */
    assert_true(file_reads(w, v2, v2_size));

    assert_int_equal(writer_file_flush(w), 0);
    writer_file_close_writer(w);
    assert_int_equal(writer_sync(f->writer, &never, &report), 0);
    assert_int_equal(synced_of(&report, "w")->outcome, WRITER_SYNC_UPLOADED);
    assert_int_equal(synced_of(&report, "w")->size, v2_size);
    assert_int_equal(synced_of(&report, "n")->outcome, WRITER_SYNC_NOT_CLOSED);
    writer_sync_report_free(&report);
    assert_true(fake_s3_holds(f->s3, "w", v2, v2_size));
    writer_file_close_writer(n);
    writer_file_put(&w);
    writer_file_put(&n);
    free(v1);
    free(v2);
    free(n_bytes);
}

/*
 * Writeback: 100 small files closed while every upload is held, two syncs
 * at once: both return once released, each with every file uploaded (the
 * files whose attempts end are told to both waiting syncs).
 */
static void test_two_syncs_of_many_files(void **state)
{
    struct fixture *f = *state;
    enum { FILES = 100 };
    struct writer_file **files = calloc(FILES, sizeof(*files));
    struct sync_thread syncs[2];
    unsigned char byte = 'x';
    char key[32];
    unsigned rule = 0;

    assert_non_null(files);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, NULL), &rule), 0);
    for (unsigned i = 0; i < FILES; i++) {
        snprintf(key, sizeof(key), "many/%03u", i);
        files[i] = file_open(f, key);
        file_write(files[i], 0, &byte, 1, 0);
        assert_int_equal(writer_file_flush(files[i]), 0);
        writer_file_close_writer(files[i]);
    }
    sync_start(&syncs[0], f->writer);
    sync_start(&syncs[1], f->writer);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 2), 0);
    assert_false(atomic_load(&syncs[0].done) || atomic_load(&syncs[1].done));
    fake_s3_hold_clear(f->s3, rule);
    for (unsigned s = 0; s < 2; s++) {
        sync_join(&syncs[s]);
        assert_int_equal(syncs[s].report.count, FILES);
        for (size_t i = 0; i < syncs[s].report.count; i++)
            assert_int_equal(syncs[s].report.files[i].outcome,
                             WRITER_SYNC_UPLOADED);
        writer_sync_report_free(&syncs[s].report);
    }
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, NULL)), FILES);
    assert_int_equal(stats_of(f).uploads_pending, 0);
    for (unsigned i = 0; i < FILES; i++)
        writer_file_put(&files[i]);
    free(files);
}

/* Writeback, the upload held: an interrupted sync returns at once, the
 * file WAITING; the upload goes on and lands once released. */
static void test_sync_interrupted(void **state)
{
    struct fixture *f = *state;
    struct sync_thread sync;
    unsigned char *bytes;
    unsigned rule = 0;

    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "slow"), &rule), 0);
    struct writer_file *file = closed_file(f, "slow", 30 * KIB, 60, &bytes, 0);
    sync_start(&sync, f->writer);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    assert_false(atomic_load(&sync.done));
    atomic_store(&sync.interrupted, true);
    writer_sync_wake(f->writer);
    sync_join(&sync);
    assert_true(sync.report.interrupted);
    assert_int_equal(sync.report.count, 1);
    assert_int_equal(sync.report.files[0].outcome, WRITER_SYNC_WAITING);
    writer_sync_report_free(&sync.report);

    fake_s3_hold_clear(f->s3, rule);
    assert_int_equal(wait_uploads(f, 1), 0);
    assert_true(fake_s3_holds(f->s3, "slow", bytes, 30 * KIB));
    writer_file_put(&file);
    free(bytes);
}

/*
 * Writeback: the pending list names each state: "refused" failed (its
 * errno, its retries), "held" uploading (its PUT held), "open" written
 * and never closed, "reopened" closed (promised) and open again: waiting.
 * Dropping what is open or uploading is refused (EBUSY); dropping
 * "refused" removes its journal entry and, with its last reference, its
 * staging file; a drop of it again finds nothing pending. After a crash
 * the next writer recovers everything but the dropped file.
 */
static void test_pending_list_and_drop(void **state)
{
    struct fixture *f = *state;
    struct writer_pending *list = NULL;
    struct entry_copy entries[MAX_ENTRIES];
    size_t count = 0;
    uint64_t journal_count = 0, size = 0, staging_id = 0;
    unsigned char *refused_bytes, *held_bytes, *open_bytes, *reopened_bytes;
    unsigned held_rule = 0;

    assert_int_equal(fake_s3_fail(f->s3, ON(FAKE_S3_PUT, "refused"),
                                  FAKE_S3_ALWAYS, EACCES, false, NULL), 0);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "held"), &held_rule), 0);
    struct writer_file *refused = closed_file(f, "refused", 12 * KIB, 70,
                                              &refused_bytes, 0);
    struct writer_file *held = closed_file(f, "held", 13 * KIB, 71, &held_bytes, 0);
    struct writer_file *open = file_open(f, "open");
    open_bytes = pattern(14 * KIB, 72);
    file_write(open, 0, open_bytes, 14 * KIB, 0);
    struct writer_file *reopened = file_open(f, "reopened");
    reopened_bytes = pattern(15 * KIB, 73);
    file_write(reopened, 0, reopened_bytes, 15 * KIB, 0);
    assert_int_equal(writer_file_flush(reopened), 0);
    file_write(reopened, 15 * KIB, reopened_bytes, 1 * KIB, 0);
    /* "held" is being uploaded; "refused" failed (an fsync returns once
     * its failure is recorded; its next retry is at least 0.75 s away) */
    assert_int_equal(fake_s3_wait_held(f->s3, held_rule, 1), 0);
    assert_int_equal(writer_file_sync(refused), EACCES);

    assert_int_equal(writer_pending_list(f->writer, &list, &count,
                                         &journal_count), 0);
    assert_int_equal(count, 4);
    assert_int_equal(journal_count, 3); /* refused, held, reopened */
    const struct writer_pending *item = pending_of(list, count, "refused");
    assert_non_null(item);
    assert_int_equal(item->state, WRITER_PENDING_FAILED);
    assert_int_equal(item->last_error, EACCES);
    assert_true(item->retries >= 1);
    assert_true(item->promised);
    assert_int_equal(item->promised_size, 12 * KIB);
    assert_false(item->open);
    assert_true(item->closed_at.tv_sec > 0);
    uint64_t refused_id = item->staging_id;
    item = pending_of(list, count, "held");
    assert_int_equal(item->state, WRITER_PENDING_UPLOADING);
    assert_int_equal(item->last_error, 0);
    item = pending_of(list, count, "open");
    assert_int_equal(item->state, WRITER_PENDING_OPEN);
    assert_false(item->promised);
    assert_true(item->open);
    assert_int_equal(item->size, 14 * KIB);
    assert_int_equal(item->closed_at.tv_sec, 0);
    item = pending_of(list, count, "reopened");
    assert_int_equal(item->state, WRITER_PENDING_WAITING);
    assert_true(item->open);
    assert_int_equal(item->promised_size, 15 * KIB);
    assert_int_equal(item->size, 16 * KIB);
    writer_pending_free(list, count);

    assert_int_equal(writer_file_drop(open, &size, &staging_id), EBUSY);
    assert_int_equal(writer_file_drop(held, &size, &staging_id), EBUSY);
    assert_int_equal(writer_file_drop(refused, &size, &staging_id), 0);
    assert_int_equal(size, 12 * KIB);
    assert_int_equal(staging_id, refused_id);
    assert_false(writer_file_pending(refused));
    assert_null(entry_for(entries, journal_entries(f, entries), "refused"));
    assert_int_equal(writer_file_drop(refused, &size, &staging_id), EALREADY);
    unsigned staged = staging_files(f);
    writer_file_put(&refused); /* the last reference: its data goes */
    assert_int_equal(staging_files(f), staged - 1);

    /* a crash: the next writer recovers the others, not the dropped one */
    fake_s3_hold_clear(f->s3, held_rule);
    fake_s3_fail_clear(f->s3, 0);
    assert_int_equal(fake_s3_wait_idle(f->s3), 0);
    struct writer_file *files[] = {held, open, reopened};
    crash(f, files, 3);
    fake_s3_log_clear(f->s3);
    journal_start(f);
    writer_start(f);
    assert_int_equal(writer_recover(f->writer, on_adopt, NULL, f), 0);
    assert_int_equal(writer_drain(f->writer), 0);
    for (unsigned i = 0; i < f->adopted_count; i++)
        assert_string_not_equal(f->adopted_keys[i], "refused");
    assert_int_equal(fake_s3_count(f->s3, FAKE_S3_ON(0, "refused")), 0);
    assert_false(fake_s3_holds(f->s3, "refused", refused_bytes, 12 * KIB));
    assert_true(fake_s3_holds(f->s3, "reopened", reopened_bytes, 15 * KIB));
    free(refused_bytes);
    free(held_bytes);
    free(open_bytes);
    free(reopened_bytes);
}

/* ----------------------------------------------------- a full staging disk */

/* Put CACHE/staging on a tmpfs of its own mounted with OPTIONS
 * ("size=64k"; MS_REMOUNT in FLAGS: change the one there), the writer
 * started again over it when it is new. Whether that could be done (root
 * only; nothing changed otherwise). */
static bool staging_tmpfs(struct fixture *f, unsigned long flags,
                          const char *options)
{
    char path[128];

    snprintf(path, sizeof(path), "%s/staging", f->dir);
    if (flags & MS_REMOUNT)
        return mount("tmpfs", path, "tmpfs", flags, options) == 0;
    assert_int_equal(writer_drain(f->writer), 0);
    writer_destroy(&f->writer);
    f->staging_tmpfs = mount("tmpfs", path, "tmpfs", flags, options) == 0;
    writer_start(f);
    return f->staging_tmpfs;
}

/*
 * The object "ckpt" is in the bucket; it is rewritten (a new staged
 * file, as open(O_TRUNC) makes) on a staging directory that fills up (a
 * 64 KiB tmpfs): a write fails with ENOSPC. Every write that returned is
 * in the staging file, but the file is not what was asked for (a write
 * failed and was not written again): close() and fsync() return ENOSPC,
 * a sync reports it failed with ENOSPC, the pending list shows it failed
 * with ENOSPC and nothing promised, and the drain leaves it (1 file
 * left): no PUT, the bucket keeps the old bytes. With room again, the
 * failed bytes written again, close() returns 0 and the drain puts the
 * new bytes exactly. Before: close() returned 0 (and in the default mode
 * uploaded the part written), and the part written replaced the old
 * object.
 */
static void test_a_failed_write_never_replaces_the_object(void **state)
{
    struct fixture *f = *state;
    const size_t old_len = 48 * KIB, new_len = 256 * KIB, chunk = 16 * KIB;
    struct writer_sync_report report;
    struct writer_pending *list = NULL;
    size_t count = 0, written = 0;
    uint64_t journal_count = 0;
    atomic_bool interrupted = false;
    int err = 0;

    unsigned char *old = pattern(old_len, 80);
    f->scratch = pattern(new_len, 81);
    assert_int_equal(fake_s3_put(f->s3, "ckpt", old, old_len, NULL, NULL), 0);
    if (!staging_tmpfs(f, 0, "size=64k")) {
        free(old);
        skip();
    }
    struct writer_file *file = file_open(f, "ckpt");
    while (written < new_len &&
           (err = writer_file_write(file, written, f->scratch + written,
                                    chunk)) == 0)
        written += chunk;
    assert_int_equal(err, ENOSPC);
    assert_true(written > 0 && written < new_len);
    unsigned char *back = malloc(written);
    size_t got = 0;
    assert_non_null(back);
    assert_int_equal(writer_file_read(file, 0, written, back, &got), 0);
    assert_int_equal(got, written);
    assert_memory_equal(back, f->scratch, written);
    free(back);

    assert_int_equal(writer_file_flush(file), ENOSPC);
    assert_int_equal(writer_file_sync(file), ENOSPC);
    writer_file_close_writer(file);
    assert_int_equal(writer_sync(f->writer, &interrupted, &report), 0);
    assert_int_equal(report.count, 1);
    assert_int_equal(report.files[0].outcome, WRITER_SYNC_FAILED);
    assert_int_equal(report.files[0].err, ENOSPC);
    writer_sync_report_free(&report);
    assert_int_equal(writer_pending_list(f->writer, &list, &count,
                                         &journal_count), 0);
    const struct writer_pending *item = pending_of(list, count, "ckpt");
    assert_non_null(item);
    assert_int_equal(item->state, WRITER_PENDING_FAILED);
    assert_int_equal(item->last_error, ENOSPC);
    assert_false(item->promised);
    writer_pending_free(list, count);
    assert_int_equal(writer_drain(f->writer), 1);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "ckpt")), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", old, old_len));
    assert_true(writer_file_pending(file));

    /* room again: the failed write's bytes written again */
    assert_true(staging_tmpfs(f, MS_REMOUNT, "size=1m"));
    writer_file_open_writer(file);
    file_write(file, written, f->scratch + written, new_len - written, chunk);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    assert_int_equal(writer_drain(f->writer), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", f->scratch, new_len));
    writer_file_put(&file);
    free(old);
}

/* Wait until COUNT files are taken by the uploader threads. */
static void wait_running(struct fixture *f, unsigned count)
{
    time_t deadline = time(NULL) + WAIT_SECONDS;
    struct writer_stats stats;

    for (;;) {
        writer_get_stats(f->writer, &stats);
        if (stats.uploads_running >= count)
            return;
        if (time(NULL) > deadline)
            fail_msg("%u uploads running, not %u", (unsigned)stats.uploads_running,
                     count);
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
}

/* Wait until no uploader thread sends a file. */
static void wait_idle_uploaders(struct fixture *f)
{
    time_t deadline = time(NULL) + WAIT_SECONDS;
    struct writer_stats stats;

    for (;;) {
        writer_get_stats(f->writer, &stats);
        if (stats.uploads_running == 0)
            return;
        if (time(NULL) > deadline)
            fail_msg("%u uploads still running", (unsigned)stats.uploads_running);
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
}

/* Writeback: v1 closed and its upload held; v2 closed, taken by the other
 * uploader, which waits for v1's; then the file is opened and written
 * again (v3, not closed). When v1's upload ends, the other uploader sends
 * nothing (the file is open for writing: its last close queues it), and
 * v2 stays promised; the close of v3 sends v3. (Before: it had decided
 * the file was not open before it waited, and sent what it held after:
 * v3, never closed.) */
static void test_an_upload_taken_before_an_open_sends_what_was_closed(void **state)
{
    struct fixture *f = *state;
    const size_t len = 20 * KIB;
    unsigned char *v1 = pattern(len, 84), *v2 = pattern(len, 85);
    unsigned rule = 0;

    f->scratch = pattern(len, 86);
    assert_int_equal(fake_s3_hold(f->s3, ON(FAKE_S3_PUT, "k"), &rule), 0);
    struct writer_file *file = file_open(f, "k");
    file_write(file, 0, v1, len, 0);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    assert_int_equal(fake_s3_wait_held(f->s3, rule, 1), 0);
    writer_file_open_writer(file);
    file_write(file, 0, v2, len, 0);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    wait_running(f, 2);
    writer_file_open_writer(file);
    file_write(file, 0, f->scratch, len, 0); /* v3: written, not closed */
    fake_s3_hold_clear(f->s3, rule);
    assert_int_equal(wait_uploads(f, 1), 0);
    wait_idle_uploaders(f);
    assert_true(fake_s3_holds(f->s3, "k", v1, len));
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "k")), 1);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    assert_int_equal(writer_drain(f->writer), 0);
    assert_true(fake_s3_holds(f->s3, "k", f->scratch, len));
    writer_file_put(&file);
    free(v1);
    free(v2);
}

/* fsync(2) of staging files fails while FSYNC_FAILURES > 0 (each failure
 * counts down): -Wl,--wrap=fsync, for the calls of the library. */
static atomic_int fsync_failures;

int __real_fsync(int fd);
int __wrap_fsync(int fd);

int __wrap_fsync(int fd)
{
    int left = atomic_load(&fsync_failures);
    while (left > 0 && !atomic_compare_exchange_weak(&fsync_failures, &left,
                                                     left - 1))
        ;
    if (left > 0) {
        errno = EIO;
        return -1;
    }
    return __real_fsync(fd);
}

/* Writeback: the fsync of a staging file at close fails (on ext4, a
 * delayed allocation that finds no room drops the pages it could not
 * write): close() says so, and what the file holds is not uploaded over
 * the object (it may be zeros now), until it is written again.
 * (Before: the uploaders sent it all the same.) */
static void test_a_failed_staging_fsync_is_not_uploaded(void **state)
{
    struct fixture *f = *state;
    const size_t len = 40 * KIB;
    unsigned char *old = pattern(len, 82);

    f->scratch = pattern(len, 83);
    assert_int_equal(fake_s3_put(f->s3, "ckpt", old, len, NULL, NULL), 0);
    struct writer_file *file = file_open(f, "ckpt");
    file_write(file, 0, f->scratch, len, 0);
    atomic_store(&fsync_failures, 1);
    assert_int_equal(writer_file_flush(file), EIO);
    atomic_store(&fsync_failures, 0);
    writer_file_close_writer(file);
    assert_int_equal(writer_drain(f->writer), 1);
    assert_int_equal(fake_s3_count(f->s3, ON(FAKE_S3_PUT, "ckpt")), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", old, len));

    /* written again: it goes up as written */
    writer_file_open_writer(file);
    file_write(file, 0, f->scratch, len, 0);
    assert_int_equal(writer_file_flush(file), 0);
    writer_file_close_writer(file);
    assert_int_equal(writer_drain(f->writer), 0);
    assert_true(fake_s3_holds(f->s3, "ckpt", f->scratch, len));
    writer_file_put(&file);
    free(old);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(
            test_default_close_puts_a_small_file, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_default_close_of_a_large_file_written_in_order, setup,
            teardown, (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_default_close_of_a_large_file_written_backwards, setup,
            teardown, (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_default_failed_upload_is_retried, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_default_lost_answers, setup, teardown, (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_failed_abort_is_not_forgotten, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_writeback_close_does_not_wait_for_an_upload, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_older_upload_begun_after_a_newer_promise, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_writeback_versions_land_in_order, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_rename_states_and_hold, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_rename_of_a_failed_upload, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_unlink_while_the_upload_is_held, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_writeback_closes_share_a_commit_and_survive_a_crash, setup,
            teardown, (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_recovery_uploads_what_was_closed, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_sync_uploads_every_pending_file, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_sync_reports_a_failed_upload, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_sync_of_files_open_for_writing, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_sync_interrupted, setup, teardown, (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_sync_takes_its_files_before_the_markers, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_two_syncs_of_many_files, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_pending_list_and_drop, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_a_failed_write_never_replaces_the_object, setup, teardown,
            (void *)&default_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_a_failed_write_never_replaces_the_object, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_a_failed_staging_fsync_is_not_uploaded, setup, teardown,
            (void *)&writeback_mode),
        cmocka_unit_test_prestate_setup_teardown(
            test_an_upload_taken_before_an_open_sends_what_was_closed, setup,
            teardown, (void *)&writeback_mode),
    };
    log_set_level(LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
