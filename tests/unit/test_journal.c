/*
 * test_journal.c - unit tests for the upload journal (journal.c over db.c).
 *
 * Every test gets a fresh directory under /tmp (removed in teardown) and
 * checks what a reopened journal holds, since surviving a close is the
 * journal's whole point. Covered: put, replace, delete, updates of several
 * entries in one transaction, scan order, ids
 * after reopen, keys with control and non-UTF-8 bytes, argument errors,
 * a damaged record (skipped with a log line, kept), a directory that is
 * not a journal (an error, not emptied), records of the first format and
 * the unclosed flag, early stop of a scan, scans
 * longer than one internal batch, eight threads putting at once, and the
 * record codec on its own.
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
#include <ftw.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/db.h"
#include "base/log.h"
#include "writer/journal.h"

#define THREADS 8
#define HERE "http://fake.invalid/bucket"
#define ELSEWHERE "http://other.invalid/bucket"
#define PUTS_PER_THREAD 50

struct fixture {
    char dir[64];
    char path[96];
};

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_journal.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/journal", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

static struct journal *open_journal(const struct fixture *f)
{
    struct journal *journal = NULL;
    char errbuf[512] = "";
    int err = journal_open(f->path, HERE, &journal, errbuf, sizeof(errbuf));
    if (err != 0)
        fail_msg("journal_open: %s", errbuf);
    return journal;
}

static struct journal_entry make_entry(uint64_t id, const char *key,
                                       const char *upload_id)
{
    return (struct journal_entry){
        .id = id, .key = key, .size = id * 1000 + 7, .mode = 0100644,
        .uid = 1000 + (uint32_t)id, .gid = 2000 + (uint32_t)id,
        .mtime = {.tv_sec = 1700000000 + (time_t)id, .tv_nsec = 123456789},
        .upload_id = upload_id,
    };
}

/* Everything a scan saw, copied. */
struct seen {
    unsigned count;
    uint64_t ids[1024];
    char *keys[1024];
    char *upload_ids[1024];
    struct journal_entry entries[1024];
    unsigned stop_after;        /* 0: never stop */
};

static int remember(void *arg, const struct journal_entry *entry)
{
    struct seen *seen = arg;
    assert_true(seen->count < 1024);
    seen->ids[seen->count] = entry->id;
    seen->keys[seen->count] = strdup(entry->key);
    seen->upload_ids[seen->count] =
        entry->upload_id ? strdup(entry->upload_id) : NULL;
    seen->entries[seen->count] = *entry;
    seen->count++;
    if (seen->stop_after != 0 && seen->count == seen->stop_after)
        return ECANCELED;
    return 0;
}

static void seen_free(struct seen *seen)
{
    for (unsigned i = 0; i < seen->count; i++) {
        free(seen->keys[i]);
        free(seen->upload_ids[i]);
    }
    seen->count = 0;
}

static void assert_entry(const struct seen *seen, unsigned i,
                         const struct journal_entry *want)
{
    const struct journal_entry *got = &seen->entries[i];
    assert_int_equal(seen->ids[i], want->id);
    assert_string_equal(seen->keys[i], want->key);
    if (want->upload_id == NULL)
        assert_null(seen->upload_ids[i]);
    else
        assert_string_equal(seen->upload_ids[i], want->upload_id);
    assert_int_equal(got->size, want->size);
    assert_int_equal(got->mode, want->mode);
    assert_int_equal(got->uid, want->uid);
    assert_int_equal(got->gid, want->gid);
    assert_int_equal(got->mtime.tv_sec, want->mtime.tv_sec);
    assert_int_equal(got->mtime.tv_nsec, want->mtime.tv_nsec);
    assert_int_equal(got->unclosed, want->unclosed);
}

static void test_put_scan_reopen(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct seen seen = {0};
    /* put out of order: the scan must come back in id order, including
     * ids whose little-endian bytes would sort differently */
    struct journal_entry entries[] = {
        make_entry(300, "dir/c", NULL),
        make_entry(2, "a", "upload-2"),
        make_entry(256, "dir/b", NULL),
        make_entry(1, "x/y/z.bin", "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA"),
    };
    unsigned order[] = {3, 1, 2, 0};

    assert_int_equal(journal_count(journal), 0);
    for (unsigned i = 0; i < 4; i++)
        assert_int_equal(journal_put(journal, &entries[i]), 0);
    assert_int_equal(journal_count(journal), 4);
    journal_close(&journal);
    assert_null(journal);
    journal_close(&journal); /* safe twice */

    journal = open_journal(f);
    assert_int_equal(journal_count(journal), 4);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 4);
    for (unsigned i = 0; i < 4; i++)
        assert_entry(&seen, i, &entries[order[i]]);
    seen_free(&seen);
    /* ids continue above the largest one held */
    uint64_t id = journal_next_id(journal);
    assert_true(id > 300);
    assert_true(journal_next_id(journal) > id);
    journal_close(&journal);
}

static void test_replace_and_delete(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct seen seen = {0};
    struct journal_entry first = make_entry(5, "file", NULL);
    struct journal_entry second = make_entry(5, "renamed/file", "upload-xyz");
    struct journal_entry other = make_entry(6, "other", NULL);

    second.size = 1ull << 40;
    second.mtime.tv_sec = -5; /* before 1970: kept as is */
    second.mtime.tv_nsec = 999999999;
    assert_int_equal(journal_put(journal, &first), 0);
    assert_int_equal(journal_put(journal, &other), 0);
    assert_int_equal(journal_put(journal, &second), 0);
    assert_int_equal(journal_count(journal), 2);
    assert_int_equal(journal_del(journal, 6), 0);
    assert_int_equal(journal_del(journal, 6), 0);   /* absent: 0 */
    assert_int_equal(journal_del(journal, 999), 0);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_count(journal), 1);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 1);
    assert_entry(&seen, 0, &second);
    seen_free(&seen);
    /* the largest id held is 5, but 6 was once held: ids only have to be
     * above what the journal holds at open */
    assert_true(journal_next_id(journal) > 5);
    assert_int_equal(journal_del(journal, 5), 0);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_count(journal), 0);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 0);
    assert_int_equal(journal_next_id(journal), 1);
    journal_close(&journal);
}

/* journal_update: puts and deletes of one call land together or not at
 * all (a rename moves one promise over another this way) */
static void test_update_is_one_transaction(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct seen seen = {0};
    struct journal_entry a = make_entry(1, "ckpt", NULL);
    struct journal_entry b = make_entry(2, "tmp", NULL);
    struct journal_entry moved = make_entry(2, "ckpt", NULL);
    struct journal_entry bad = make_entry(3, "", NULL);  /* empty key */
    struct journal_entry c = make_entry(4, "c", NULL);
    uint64_t dels[] = {1, 77};

    assert_int_equal(journal_put(journal, &a), 0);
    assert_int_equal(journal_put(journal, &b), 0);
    /* b moves over a: one call */
    assert_int_equal(journal_update(journal, &moved, 1, dels, 2), 0);
    /* a bad put fails the whole call: 2 is not deleted */
    uint64_t two = 2;
    assert_int_equal(journal_update(journal, &bad, 1, &two, 1), EINVAL);
    /* an id both put and deleted is put */
    uint64_t four = 4;
    assert_int_equal(journal_update(journal, &c, 1, &four, 1), 0);
    /* nothing at all: nothing happens */
    assert_int_equal(journal_update(journal, NULL, 0, NULL, 0), 0);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    assert_entry(&seen, 0, &moved);
    assert_entry(&seen, 1, &c);
    seen_free(&seen);
    journal_close(&journal);
}

static void test_odd_bytes(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct seen seen = {0};
    char long_key[1025];
    char longest_key[1025];
    const char odd[] = "tab\there/new\nline/\x01\x7f/\xff\xfe not utf-8/"
                       "caf\xc3\xa9/%41+ /\\";

    memset(longest_key, 'k', 1024);
    longest_key[1024] = '\0';
    struct journal_entry entries[] = {
        make_entry(10, odd, "id with spaces & \"quotes\""),
        make_entry(11, longest_key, NULL),
        make_entry(12, "/", ""), /* an empty upload id means none */
    };
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(journal_put(journal, &entries[i]), 0);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 3);
    assert_entry(&seen, 0, &entries[0]);
    assert_entry(&seen, 1, &entries[1]);
    assert_string_equal(seen.keys[2], "/");
    assert_null(seen.upload_ids[2]);
    seen_free(&seen);

    /* argument errors change nothing */
    memset(long_key, 'k', 1024);
    long_key[1024] = '\0';
    struct journal_entry bad = make_entry(20, long_key, NULL);
    char too_long[1026];
    memset(too_long, 'k', 1025);
    too_long[1025] = '\0';
    bad.key = too_long;
    assert_int_equal(journal_put(journal, &bad), EINVAL);
    bad.key = "";
    assert_int_equal(journal_put(journal, &bad), EINVAL);
    bad.key = NULL;
    assert_int_equal(journal_put(journal, &bad), EINVAL);
    bad.key = "fine";
    bad.mtime.tv_nsec = 1000000000L;
    assert_int_equal(journal_put(journal, &bad), EINVAL);
    assert_int_equal(journal_count(journal), 3);
    journal_close(&journal);
}

static void test_scan_stops_and_batches(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct seen *seen = calloc(1, sizeof(*seen));
    char key[32];

    assert_non_null(seen);
    /* more than one internal batch of the scan */
    for (uint64_t id = 1; id <= 700; id++) {
        snprintf(key, sizeof(key), "k%llu", (unsigned long long)id);
        struct journal_entry entry = make_entry(id * 3, key, NULL);
        assert_int_equal(journal_put(journal, &entry), 0);
    }
    assert_int_equal(journal_scan(journal, remember, seen), 0);
    assert_int_equal(seen->count, 700);
    for (unsigned i = 0; i < 700; i++) {
        snprintf(key, sizeof(key), "k%u", i + 1);
        assert_int_equal(seen->ids[i], (i + 1) * 3);
        assert_string_equal(seen->keys[i], key);
    }
    seen_free(seen);
    /* VISIT's errno stops the scan and is returned */
    seen->stop_after = 300;
    assert_int_equal(journal_scan(journal, remember, seen), ECANCELED);
    assert_int_equal(seen->count, 300);
    seen_free(seen);
    free(seen);
    journal_close(&journal);
}

static void test_damaged_record(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct journal_entry before = make_entry(1, "before", NULL);
    struct journal_entry after = make_entry(4, "after", NULL);
    struct seen seen = {0};
    struct db *db = NULL;
    struct db_txn *txn = NULL;
    char errbuf[256];
    const unsigned char id2[8] = {0, 0, 0, 0, 0, 0, 0, 2};
    const unsigned char id3[8] = {0, 0, 0, 0, 0, 0, 0, 3};
    const unsigned char unknown_format[] = {99, 1, 2, 3};
    unsigned char truncated[40] = {1};

    assert_int_equal(journal_put(journal, &before), 0);
    assert_int_equal(journal_put(journal, &after), 0);
    journal_close(&journal);

    /* write two records the journal cannot read, behind its back */
    assert_int_equal(db_open(f->path, 1ull << 30, true, &db, errbuf,
                             sizeof(errbuf)), 0);
    assert_int_equal(db_txn_begin(db, true, &txn), 0);
    assert_int_equal(db_put(txn, DB_JOURNAL, id2, 8, unknown_format,
                            sizeof(unknown_format)), 0);
    truncated[33] = 0x10; /* key length 4096: past the record's end */
    assert_int_equal(db_put(txn, DB_JOURNAL, id3, 8, truncated,
                            sizeof(truncated)), 0);
    assert_int_equal(db_txn_commit(&txn), 0);
    db_close(&db);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    assert_entry(&seen, 0, &before);
    assert_entry(&seen, 1, &after);
    seen_free(&seen);
    /* kept, not silently dropped; ids stay above them; the journal says
     * it holds them (their staging files are not to be swept) */
    assert_int_equal(journal_count(journal), 4);
    assert_true(journal_has(journal, 2));
    assert_true(journal_has(journal, 3));
    assert_true(journal_has(journal, 4));
    assert_false(journal_has(journal, 5));
    assert_true(journal_next_id(journal) > 4);
    journal_close(&journal);
}

/* A record of the first format (no flags byte), as a journal written by
 * an older s3cachefs holds it, is still read; the unclosed flag survives
 * a reopen and a replace clears it. */
static void test_formats_and_unclosed(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct journal_entry open_file = make_entry(2, "being/written", "mpu-2");
    struct journal_entry old = make_entry(5, "old", "u1");
    struct seen seen = {0};
    struct db *db = NULL;
    struct db_txn *txn = NULL;
    char errbuf[256];
    const unsigned char id5[8] = {0, 0, 0, 0, 0, 0, 0, 5};
    /* format 1: size 5007, mode 0100644, uid 1005, gid 2005, mtime
     * 1700000005.123456789, key "old", upload id "u1" */
    const unsigned char v1[] = {
        1,
        0, 0, 0, 0, 0, 0, 0x13, 0x8f,
        0, 0, 0x81, 0xa4,
        0, 0, 0x03, 0xed,
        0, 0, 0x07, 0xd5,
        0, 0, 0, 0, 0x65, 0x53, 0xf1, 0x05,
        0x07, 0x5b, 0xcd, 0x15,
        0, 3, 'o', 'l', 'd',
        0, 2, 'u', '1',
    };

    open_file.unclosed = true;
    assert_int_equal(journal_put(journal, &open_file), 0);
    journal_close(&journal);
    assert_int_equal(db_open(f->path, 1ull << 30, true, &db, errbuf,
                             sizeof(errbuf)), 0);
    assert_int_equal(db_txn_begin(db, true, &txn), 0);
    assert_int_equal(db_put(txn, DB_JOURNAL, id5, 8, v1, sizeof(v1)), 0);
    assert_int_equal(db_txn_commit(&txn), 0);
    db_close(&db);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    assert_entry(&seen, 0, &open_file);
    assert_entry(&seen, 1, &old);
    seen_free(&seen);

    /* closed: the same id, now a complete entry */
    open_file.unclosed = false;
    open_file.upload_id = NULL;
    assert_int_equal(journal_put(journal, &open_file), 0);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    assert_entry(&seen, 0, &open_file);
    seen_free(&seen);
    journal_close(&journal);
}

static void test_not_a_journal(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = NULL;
    char errbuf[512] = "";
    char file[160];
    int fd;

    /* a data file that is not LMDB: an error with a sentence, untouched */
    assert_int_equal(mkdir(f->path, 0700), 0);
    snprintf(file, sizeof(file), "%s/data.mdb", f->path);
    fd = open(file, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    char garbage[8192];
    memset(garbage, 0x5a, sizeof(garbage));
    assert_int_equal(write(fd, garbage, sizeof(garbage)), (ssize_t)sizeof(garbage));
    close(fd);
    assert_int_not_equal(journal_open(f->path, HERE, &journal, errbuf, sizeof(errbuf)), 0);
    assert_null(journal);
    assert_non_null(strstr(errbuf, "upload journal"));
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_size, (off_t)sizeof(garbage));
    char check[8192];
    fd = open(file, O_RDONLY);
    assert_int_equal(read(fd, check, sizeof(check)), (ssize_t)sizeof(check));
    close(fd);
    assert_memory_equal(check, garbage, sizeof(garbage));

    /* a path under a regular file cannot be created */
    snprintf(file, sizeof(file), "%s/data.mdb/journal", f->path);
    assert_int_equal(journal_open(file, HERE, &journal, errbuf, sizeof(errbuf)), ENOTDIR);
    assert_null(journal);
}

struct worker_arg {
    struct journal *journal;
    unsigned thread;
    uint64_t ids[PUTS_PER_THREAD];
    unsigned count;               /* puts to make; 0: PUTS_PER_THREAD */
    int err;
};

static void *put_many(void *argp)
{
    struct worker_arg *arg = argp;
    char key[64];

    unsigned count = arg->count ? arg->count : PUTS_PER_THREAD;

    for (unsigned i = 0; i < count && arg->err == 0; i++) {
        uint64_t id = journal_next_id(arg->journal);
        snprintf(key, sizeof(key), "thread%u/file%u", arg->thread, i);
        struct journal_entry entry = make_entry(id, key, i % 2 ? "up" : NULL);
        arg->ids[i] = id;
        arg->err = journal_put(arg->journal, &entry);
        /* every other one is deleted again, also concurrently */
        if (arg->err == 0 && i % 5 == 4)
            arg->err = journal_del(arg->journal, id);
    }
    return NULL;
}

/* Group commit: closes that arrive while a commit is under way (here:
 * held) share the next one, and every one of them is durable when its
 * call returns (a "crash", closing and reopening, finds them all). */
static void test_concurrent_puts_share_one_commit(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct worker_arg args[THREADS];
    pthread_t threads[THREADS];

    journal_hold(journal, true);
    uint64_t before = journal_commits(journal);
    for (unsigned t = 0; t < THREADS; t++) {
        args[t] = (struct worker_arg){.journal = journal, .thread = t,
                                      .count = 1};
        assert_int_equal(pthread_create(&threads[t], NULL, put_many, &args[t]), 0);
    }
    journal_wait_queued(journal, THREADS);
    assert_int_equal(journal_commits(journal), before);
    journal_hold(journal, false);
    for (unsigned t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        assert_int_equal(args[t].err, 0);
    }
    assert_int_equal(journal_commits(journal), before + 1);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_count(journal), THREADS);
    for (unsigned t = 0; t < THREADS; t++)
        assert_true(journal_has(journal, args[t].ids[0]));
    journal_close(&journal);
}

static void test_concurrent_puts(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct worker_arg args[THREADS];
    pthread_t threads[THREADS];
    struct seen *seen = calloc(1, sizeof(*seen));
    unsigned expected = 0;

    assert_non_null(seen);
    for (unsigned t = 0; t < THREADS; t++) {
        args[t] = (struct worker_arg){.journal = journal, .thread = t};
        assert_int_equal(pthread_create(&threads[t], NULL, put_many, &args[t]), 0);
    }
    for (unsigned t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        assert_int_equal(args[t].err, 0);
    }
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, seen), 0);
    for (unsigned t = 0; t < THREADS; t++)
        for (unsigned i = 0; i < PUTS_PER_THREAD; i++)
            if (i % 5 != 4)
                expected++;
    assert_int_equal(seen->count, expected);
    assert_int_equal(journal_count(journal), expected);
    /* each surviving put is there with its own key; ids all distinct */
    for (unsigned t = 0; t < THREADS; t++) {
        for (unsigned i = 0; i < PUTS_PER_THREAD; i++) {
            char key[64];
            bool found = false;
            snprintf(key, sizeof(key), "thread%u/file%u", t, i);
            for (unsigned s = 0; s < seen->count; s++) {
                if (seen->ids[s] == args[t].ids[i]) {
                    assert_false(found);
                    found = true;
                    assert_string_equal(seen->keys[s], key);
                }
            }
            assert_int_equal(found, i % 5 != 4);
        }
    }
    for (unsigned s = 1; s < seen->count; s++)
        assert_true(seen->ids[s] > seen->ids[s - 1]);
    seen_free(seen);
    free(seen);
    journal_close(&journal);
}

/* The record codec on its own (journal_record_encode/_decode, which the
 * fuzz target tests/fuzz/fuzz_journal.c drives): what one encodes the
 * other gives back, in the third format, with its destination, for an
 * upload and for a move; a record cut short or with a bad key says why;
 * an entry without a destination or a move without a target is refused. */
static void test_record_codec(void **state)
{
    const unsigned char id9[8] = {0, 0, 0, 0, 0, 0, 0, 9};
    struct journal_entry entry = make_entry(9, "dir/f\x01le", "mpu-9");
    struct journal_entry got;
    unsigned char *record = NULL;
    char *strings = NULL;
    const char *why = NULL;
    size_t len = 0;

    (void)state;
    entry.unclosed = true;
    assert_int_equal(journal_record_encode(&entry, &record, &len), EINVAL);
    entry.destination = HERE;
    assert_int_equal(journal_record_encode(&entry, &record, &len), 0);
    assert_int_equal(record[0], 3);
    assert_int_equal(journal_record_decode(id9, 8, record, len, &got,
                                           &strings, &why), 0);
    assert_null(why);
    assert_int_equal(got.id, 9);
    assert_int_equal(got.kind, JOURNAL_UPLOAD);
    assert_string_equal(got.destination, HERE);
    assert_string_equal(got.key, entry.key);
    assert_string_equal(got.upload_id, "mpu-9");
    assert_int_equal(got.size, entry.size);
    assert_int_equal(got.mode, entry.mode);
    assert_int_equal(got.uid, entry.uid);
    assert_int_equal(got.gid, entry.gid);
    assert_int_equal(got.mtime.tv_sec, entry.mtime.tv_sec);
    assert_int_equal(got.mtime.tv_nsec, entry.mtime.tv_nsec);
    assert_true(got.unclosed);
    assert_null(got.move_to);
    free(strings);
    strings = NULL;

    /* one byte short, or one too many: refused, with a reason, nothing to
     * free */
    assert_int_equal(journal_record_decode(id9, 8, record, len - 1, &got,
                                           &strings, &why), EPROTO);
    assert_non_null(why);
    assert_null(strings);
    unsigned char *longer = malloc(len + 1);
    assert_non_null(longer);
    memcpy(longer, record, len);
    longer[len] = 0;
    assert_int_equal(journal_record_decode(id9, 8, longer, len + 1, &got,
                                           &strings, &why), EPROTO);
    assert_string_equal(why, "bytes after the record");
    free(longer);
    assert_int_equal(journal_record_decode(id9, 7, record, len, &got,
                                           &strings, &why), EPROTO);
    assert_string_equal(why, "its key is not an id");
    free(record);

    entry.unclosed = false;
    entry.upload_id = NULL;
    assert_int_equal(journal_record_encode(&entry, &record, &len), 0);
    assert_int_equal(journal_record_decode(id9, 8, record, len, &got,
                                           &strings, &why), 0);
    assert_null(got.upload_id);
    assert_false(got.unclosed);
    free(strings);
    free(record);

    /* a move: its flags, target and ETag come back */
    struct journal_entry move = {
        .id = 9, .kind = JOURNAL_MOVE, .destination = HERE, .key = "ckpt/",
        .move_to = "ckpt.old/", .move_etag = "\"abc\"",
        .move_flags = JOURNAL_MOVE_PREFIX, .move_replaces = 0x0102030405060708,
    };
    assert_int_equal(journal_record_encode(&move, &record, &len), 0);
    assert_int_equal(journal_record_decode(id9, 8, record, len, &got,
                                           &strings, &why), 0);
    assert_int_equal(got.kind, JOURNAL_MOVE);
    assert_string_equal(got.destination, HERE);
    assert_string_equal(got.key, "ckpt/");
    assert_string_equal(got.move_to, "ckpt.old/");
    assert_string_equal(got.move_etag, "\"abc\"");
    assert_int_equal(got.move_flags, JOURNAL_MOVE_PREFIX);
    assert_int_equal(got.move_replaces, 0x0102030405060708);
    free(strings);
    free(record);
    move.move_to = NULL;
    assert_int_equal(journal_record_encode(&move, &record, &len), EINVAL);
    move.move_to = "b";
    move.move_flags = 0x80;
    assert_int_equal(journal_record_encode(&move, &record, &len), EINVAL);

    entry.key = "";
    assert_int_equal(journal_record_encode(&entry, &record, &len), EINVAL);
}

/* A record of the second format (flags, no destination), as an older
 * s3cachefs wrote it, is read as the journal's own. */
static void test_second_format_is_read(void **state)
{
    const unsigned char id4[8] = {0, 0, 0, 0, 0, 0, 0, 4};
    /* format 2: size 7, mode 0100600, uid 1, gid 2, mtime 1700000000.5,
     * key "k", no upload id, unclosed */
    const unsigned char v2[] = {
        2,
        0, 0, 0, 0, 0, 0, 0, 7,
        0, 0, 0x81, 0x80,
        0, 0, 0, 1,
        0, 0, 0, 2,
        0, 0, 0, 0, 0x65, 0x53, 0xf1, 0x00,
        0x1d, 0xcd, 0x65, 0x00,
        0, 1, 'k',
        0, 0,
        1,
    };
    struct journal_entry got;
    char *strings = NULL;
    const char *why = NULL;

    (void)state;
    assert_int_equal(journal_record_decode(id4, 8, v2, sizeof(v2), &got,
                                           &strings, &why), 0);
    assert_int_equal(got.kind, JOURNAL_UPLOAD);
    assert_null(got.destination);
    assert_string_equal(got.key, "k");
    assert_null(got.upload_id);
    assert_int_equal(got.size, 7);
    assert_int_equal(got.mtime.tv_nsec, 500000000);
    assert_true(got.unclosed);
    free(strings);
}

/* Entries name the bucket they are for: a put is stamped with the
 * journal's; a scan of a journal opened for another bucket hands out
 * none of them, and keeps them for the first; journal_peek counts all,
 * with the journal closed. */
static void test_entries_belong_to_their_bucket(void **state)
{
    struct fixture *f = *state;
    struct journal *journal = open_journal(f);
    struct journal_entry one = make_entry(1, "a", NULL);
    struct journal_entry two = make_entry(2, "b", NULL);
    struct seen seen = {0};
    char errbuf[256] = "";
    uint64_t count = 99;

    assert_int_equal(journal_peek(f->path, &count, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(count, 0);
    assert_int_equal(journal_put(journal, &one), 0);
    assert_int_equal(journal_put(journal, &two), 0);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    seen_free(&seen);
    journal_close(&journal);
    assert_int_equal(journal_peek(f->path, &count, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(count, 2);

    assert_int_equal(journal_open(f->path, ELSEWHERE, &journal, errbuf,
                                  sizeof(errbuf)), 0);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 0);
    assert_int_equal(journal_count(journal), 2);
    /* what it puts is its own, and only that is handed out */
    struct journal_entry three = make_entry(3, "c", NULL);
    assert_int_equal(journal_put(journal, &three), 0);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 1);
    assert_int_equal(seen.ids[0], 3);
    seen_free(&seen);
    journal_close(&journal);

    journal = open_journal(f);
    assert_int_equal(journal_scan(journal, remember, &seen), 0);
    assert_int_equal(seen.count, 2);
    assert_entry(&seen, 0, &one);
    assert_entry(&seen, 1, &two);
    seen_free(&seen);
    journal_close(&journal);

    /* no journal there yet: nothing owed */
    char absent[128];
    snprintf(absent, sizeof(absent), "%s/none", f->dir);
    assert_int_equal(journal_peek(absent, &count, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(count, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_scan_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_and_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_update_is_one_transaction, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_odd_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_stops_and_batches, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_damaged_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_formats_and_unclosed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_not_a_journal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_puts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_puts_share_one_commit,
                                        setup, teardown),
        cmocka_unit_test(test_record_codec),
        cmocka_unit_test(test_second_format_is_read),
        cmocka_unit_test_setup_teardown(test_entries_belong_to_their_bucket,
                                        setup, teardown),
    };
    log_set_level(LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
