/*
 * test_db.c - unit tests for db.c on a file system that is full.
 *
 * LMDB keeps its lock table in lock.mdb, a file it extends with
 * ftruncate() (a hole) and then writes through a shared mapping: on a
 * full tmpfs or ext4, the first store into a page of that hole cannot be
 * given a block and raises SIGBUS. Its data file is written with
 * pwrite(), whose short write on a full file system LMDB reports as EIO.
 * Covered: opening an environment on a full file system is ENOSPC with
 * a sentence naming the directory; two hundred readers at once on one
 * opened before the file system filled up (their slots reach past the
 * lock table's first page); a commit that does not fit is ENOSPC (not
 * EIO), logged once while the file system stays full, and the next
 * commit with room again succeeds.
 *
 * Each test mounts a 1 MiB tmpfs of its own: needs root, skipped
 * otherwise.
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
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/db.h"

#define MAP_SIZE (1ull << 30)
#define READERS 200
#define PAGE 4096

struct fixture {
    char dir[64];       /* the tmpfs */
    char env[96];       /* the environment's directory in it */
    char filler[96];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_db.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->env, sizeof(f->env), "%s/env", f->dir);
    snprintf(f->filler, sizeof(f->filler), "%s/filler", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    umount2(f->dir, MNT_DETACH);  /* (everything was on the tmpfs) */
    rmdir(f->dir);
    free(f);
    return 0;
}

/* A 1 MiB tmpfs on the fixture's directory, with the environment's
 * directory in it; skips the test when it cannot be mounted. */
static void small_tmpfs(struct fixture *f)
{
    if (mount("tmpfs", f->dir, "tmpfs", 0, "size=1m") != 0)
        skip();
    assert_int_equal(mkdir(f->env, 0700), 0);
}

/* Fill the file system of the fixture with its filler file, then give
 * back the last LEAVE pages of it. */
static void fill(struct fixture *f, unsigned leave)
{
    static char chunk[64 * 1024];
    int fd = open(f->filler, O_WRONLY | O_CREAT | O_APPEND, 0600);
    off_t size = 0;

    assert_true(fd >= 0);
    for (size_t step = sizeof(chunk); step >= PAGE; step /= 2) {
        ssize_t done;
        while ((done = write(fd, chunk, step)) > 0)
            size += done;
        assert_int_equal(errno, ENOSPC);
    }
    assert_int_equal(ftruncate(fd, size - (off_t)leave * PAGE), 0);
    close(fd);
}

static struct db *open_db(const struct fixture *f)
{
    struct db *db = NULL;
    char errbuf[512] = "";

    if (db_open(f->env, MAP_SIZE, true, &db, errbuf, sizeof(errbuf)) != 0)
        fail_msg("db_open: %s", errbuf);
    return db;
}

/* One write transaction putting VALUE_LEN bytes under KEY: its commit's
 * result. */
static int put_one(struct db *db, const char *key, size_t value_len)
{
    static char value[64 * 1024];
    struct db_txn *txn = NULL;
    int err = db_txn_begin(db, true, &txn);

    assert_true(value_len <= sizeof(value));
    memset(value, 'v', value_len);
    if (err == 0)
        err = db_put(txn, DB_JOURNAL, key, strlen(key), value, value_len);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    return err;
}

/* Standard error of the calls between capture_begin and capture_end,
 * into a file of the fixture's directory's parent (not the full one). */
struct capture {
    char path[64];
    int saved;
};

static void capture_begin(struct capture *c)
{
    snprintf(c->path, sizeof(c->path), "/tmp/test_db.log.XXXXXX");
    int fd = mkstemp(c->path);
    assert_true(fd >= 0);
    fflush(stderr);
    c->saved = dup(STDERR_FILENO);
    assert_true(c->saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    close(fd);
}

/* What was captured, NUL-terminated, into OUT (CAP bytes). */
static void capture_end(struct capture *c, char *out, size_t cap)
{
    fflush(stderr);
    assert_true(dup2(c->saved, STDERR_FILENO) >= 0);
    close(c->saved);
    int fd = open(c->path, O_RDONLY);
    assert_true(fd >= 0);
    ssize_t len = read(fd, out, cap - 1);
    out[len > 0 ? len : 0] = '\0';
    close(fd);
    unlink(c->path);
    fputs(out, stderr); /* still in the test's log */
}

static unsigned count_of(const char *text, const char *needle)
{
    unsigned count = 0;

    for (const char *at = text; (at = strstr(at, needle)) != NULL; at++)
        count++;
    return count;
}

/* An environment created on a full file system: ENOSPC and a sentence
 * naming the directory (before: SIGBUS in mdb_env_open, the first store
 * into the lock table's new mapping). */
static void test_open_on_a_full_file_system(void **state)
{
    struct fixture *f = *state;
    struct db *db = NULL;
    char errbuf[512] = "";

    small_tmpfs(f);
    fill(f, 0);
    int err = db_open(f->env, MAP_SIZE, true, &db, errbuf, sizeof(errbuf));
    assert_int_equal(err, ENOSPC);
    assert_null(db);
    assert_non_null(strstr(errbuf, f->env));
    assert_non_null(strstr(errbuf, "full"));
    /* with room again, it opens and takes writes */
    assert_int_equal(unlink(f->filler), 0);
    db = open_db(f);
    assert_int_equal(put_one(db, "k", 100), 0);
    db_close(&db);
}

/* Two hundred read transactions at once, the file system having filled
 * up after the environment was opened: every reader gets its slot (each
 * slot is 64 bytes: from the 63rd on they are past the lock table's
 * first page, which before were holes that SIGBUS'd when written). */
static void test_readers_on_a_full_file_system(void **state)
{
    struct fixture *f = *state;
    struct db_txn *readers[READERS] = {NULL};

    small_tmpfs(f);
    struct db *db = open_db(f);
    assert_int_equal(put_one(db, "k", 100), 0);
    fill(f, 0);
    for (int i = 0; i < READERS; i++) {
        const void *value = NULL;
        size_t len = 0;
        assert_int_equal(db_txn_begin(db, false, &readers[i]), 0);
        assert_int_equal(db_get(readers[i], DB_JOURNAL, "k", 1, &value, &len), 0);
        assert_int_equal(len, 100);
    }
    for (int i = 0; i < READERS; i++)
        db_txn_abort(&readers[i]);
    db_close(&db);
}

/* A commit that needs more pages than the file system has: ENOSPC (LMDB
 * says EIO for the short write; before, so did db_txn_commit), one log
 * line naming the directory for as long as it stays full, and the same
 * commit succeeds once there is room. */
static void test_commit_on_a_full_file_system(void **state)
{
    struct fixture *f = *state;
    struct capture capture;
    char log[8192];

    small_tmpfs(f);
    struct db *db = open_db(f);
    assert_int_equal(put_one(db, "small", 100), 0);
    fill(f, 1);             /* one page left: the 40 KB value needs ten */
    capture_begin(&capture);
    int first = put_one(db, "big", 40000);
    int second = put_one(db, "big", 40000);
    int third = put_one(db, "big2", 30000);
    capture_end(&capture, log, sizeof(log));
    assert_int_equal(first, ENOSPC);
    assert_int_equal(second, ENOSPC);
    assert_int_equal(third, ENOSPC);
    assert_int_equal(count_of(log, "full"), 1);
    assert_int_equal(count_of(log, f->env), 1);

    assert_int_equal(unlink(f->filler), 0);
    assert_int_equal(put_one(db, "big", 40000), 0);
    const void *value = NULL;
    size_t len = 0;
    struct db_txn *txn = NULL;
    assert_int_equal(db_txn_begin(db, false, &txn), 0);
    assert_int_equal(db_get(txn, DB_JOURNAL, "big", 3, &value, &len), 0);
    assert_int_equal(len, 40000);
    assert_int_equal(db_get(txn, DB_JOURNAL, "small", 5, &value, &len), 0);
    assert_int_equal(len, 100);
    db_txn_abort(&txn);
    db_close(&db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_on_a_full_file_system,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_readers_on_a_full_file_system,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_on_a_full_file_system,
                                        setup, teardown),
    };

    return cmocka_run_group_tests_name("db", tests, NULL, NULL);
}
