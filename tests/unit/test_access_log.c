/*
 * test_access_log.c - unit tests for access_log.c: one line per version
 * first opened, the path through the mount point with the prefix taken
 * off, later versions listed again, names with a newline left out, lines
 * appended to what the file held, 20,000 versions (the set grows), four
 * threads opening the same files (each line once), and the files it
 * refuses (inside the mount point, in a missing directory).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fs/access_log.h"

struct fixture {
    char dir[64];
    char mnt[96];
    char file[96];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (f == NULL)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_access_log.XXXXXX");
    if (mkdtemp(f->dir) == NULL)
        return -1;
    snprintf(f->mnt, sizeof(f->mnt), "%s/mnt", f->dir);
    snprintf(f->file, sizeof(f->file), "%s/opened.list", f->dir);
    if (mkdir(f->mnt, 0755) != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

/* The whole file (malloc'd). */
static char *contents(const char *path)
{
    FILE *in = fopen(path, "r");
    static char empty[] = "";
    char *text = NULL;
    size_t len = 0;

    assert_non_null(in);
    ssize_t got = getdelim(&text, &len, '\0', in);
    fclose(in);
    if (got < 0) {
        free(text);
        return strdup(empty);
    }
    return text;
}

static struct access_log *open_log(struct fixture *f, const char *root_key)
{
    struct access_log *log = NULL;
    char err[256] = "";

    assert_int_equal(access_log_open(f->file, f->mnt, root_key, &log, err,
                                     sizeof(err)), 0);
    assert_non_null(log);
    return log;
}

static void test_first_open_of_each_version(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = open_log(f, "");
    char expected[6 * sizeof(f->mnt) + 128];

    access_log_opened(log, "a.bin", "\"e1\"");
    access_log_opened(log, "d/b.bin", "\"e2\"");
    access_log_opened(log, "a.bin", "\"e1\"");      /* again: no line */
    access_log_opened(log, "d/b.bin", "\"e2\"");
    access_log_opened(log, "a.bin", "\"e3\"");      /* a new version */
    access_log_opened(log, "with space/é.txt", "\"e4\"");
    /* (key, ETag) pairs, not their concatenation */
    access_log_opened(log, "x", "\"ab\"");
    access_log_opened(log, "x\"", "ab\"");
    access_log_close(&log);
    assert_null(log);
    access_log_close(&log); /* safe twice */

    snprintf(expected, sizeof(expected),
             "%s/a.bin\n%s/d/b.bin\n%s/a.bin\n%s/with space/é.txt\n%s/x\n"
             "%s/x\"\n", f->mnt, f->mnt, f->mnt, f->mnt, f->mnt, f->mnt);
    char *text = contents(f->file);
    assert_string_equal(text, expected);
    free(text);
}

/* A mount of bucket:prefix/ lists paths without the prefix; a newline in
 * a name leaves it out; a later mount appends. */
static void test_prefix_newline_and_append(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = open_log(f, "models/");
    char expected[512];

    access_log_opened(log, "models/llama/w.safetensors", "\"1\"");
    access_log_opened(log, "models/bad\nname", "\"2\"");
    access_log_opened(log, "models/bad\nname", "\"2\"");
    access_log_close(&log);

    log = open_log(f, "models/");
    access_log_opened(log, "models/llama/w.safetensors", "\"1\"");
    access_log_close(&log);

    snprintf(expected, sizeof(expected),
             "%s/llama/w.safetensors\n%s/llama/w.safetensors\n", f->mnt,
             f->mnt);
    char *text = contents(f->file);
    assert_string_equal(text, expected);
    free(text);
}

/* 20,000 versions: the set grows many times; every line once. */
static void test_many_versions(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = open_log(f, "");
    char key[32];
    enum { COUNT = 20000 };

    for (int round = 0; round < 2; round++)
        for (int i = 0; i < COUNT; i++) {
            snprintf(key, sizeof(key), "k/%05d", i);
            access_log_opened(log, key, "\"v\"");
        }
    access_log_close(&log);

    char *text = contents(f->file);
    size_t lines = 0;
    char *p = text;
    for (int i = 0; i < COUNT; i++) {
        char line[128];
        snprintf(line, sizeof(line), "%s/k/%05d\n", f->mnt, i);
        assert_memory_equal(p, line, strlen(line));
        p += strlen(line);
        lines++;
    }
    assert_int_equal(*p, '\0');
    assert_int_equal(lines, COUNT);
    free(text);
}

struct opener {
    pthread_t thread;
    struct access_log *log;
};

static void *open_all(void *arg)
{
    struct opener *o = arg;
    char key[32];

    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof(key), "t/%03d", i);
        access_log_opened(o->log, key, "\"same\"");
    }
    return NULL;
}

static void test_threads_list_each_once(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = open_log(f, "");
    struct opener openers[4];

    for (int t = 0; t < 4; t++) {
        openers[t].log = log;
        assert_int_equal(pthread_create(&openers[t].thread, NULL, open_all,
                                        &openers[t]), 0);
    }
    for (int t = 0; t < 4; t++)
        pthread_join(openers[t].thread, NULL);
    access_log_close(&log);

    char *text = contents(f->file);
    bool seen[500] = {false};
    size_t lines = 0;
    for (char *line = strtok(text, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        int i = -1;
        char expected[128];
        const char *slash = strrchr(line, '/');
        assert_non_null(slash);
        i = atoi(slash + 1);
        assert_true(i >= 0 && i < 500);
        snprintf(expected, sizeof(expected), "%s/t/%03d", f->mnt, i);
        assert_string_equal(line, expected);
        assert_false(seen[i]);
        seen[i] = true;
        lines++;
    }
    assert_int_equal(lines, 500);
    free(text);
}

/* Writes that fail (the file size limit standing for a full disk): the
 * versions whose line was not written are listed at their next open, the
 * others not again, and the line cut short at the limit does not run into
 * the next one. 300 versions, so that forgetting one moves others back in
 * the set. */
static void test_failed_writes_listed_again(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = open_log(f, "");
    struct rlimit before, small;
    char key[32];
    enum { COUNT = 300 };
    size_t line_len = strlen(f->mnt) + strlen("/v/000\n");

    assert_int_equal(getrlimit(RLIMIT_FSIZE, &before), 0);
    small = before;
    small.rlim_cur = line_len * 100 + line_len / 2; /* 100 lines and a half */
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    for (int i = 0; i < COUNT; i++) {
        snprintf(key, sizeof(key), "v/%03d", i);
        access_log_opened(log, key, "\"e\"");
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &before), 0);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < COUNT; i++) {
            snprintf(key, sizeof(key), "v/%03d", i);
            access_log_opened(log, key, "\"e\"");
        }
    access_log_close(&log);

    char *text = contents(f->file);
    int seen[COUNT] = {0};
    size_t others = 0;
    for (char *line = strtok(text, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        char expected[128];
        int i = -1;
        const char *slash = strrchr(line, '/');
        if (slash != NULL && strlen(slash + 1) == 3)
            i = atoi(slash + 1);
        if (i >= 0 && i < COUNT) {
            snprintf(expected, sizeof(expected), "%s/v/%03d", f->mnt, i);
            if (strcmp(line, expected) == 0) {
                seen[i]++;
                continue;
            }
        }
        /* the line cut at the limit: a beginning of a path, alone */
        assert_true(strncmp(line, f->mnt, strlen(line)) == 0 ||
                    strncmp(line, f->mnt, strlen(f->mnt)) == 0);
        others++;
    }
    for (int i = 0; i < COUNT; i++)
        if (seen[i] != 1)
            fail_msg("v/%03d listed %d times", i, seen[i]);
    assert_int_equal(others, 1);
    free(text);
}

static void test_refused_files(void **state)
{
    struct fixture *f = *state;
    struct access_log *log = NULL;
    char path[160], err[256] = "";

    /* in the mount point, or under it: the daemon would write to itself */
    snprintf(path, sizeof(path), "%s/opened.list", f->mnt);
    assert_int_equal(access_log_open(path, f->mnt, "", &log, err, sizeof(err)),
                     EINVAL);
    assert_null(log);
    assert_non_null(strstr(err, "outside the mount point"));
    snprintf(path, sizeof(path), "%s/sub", f->mnt);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/sub/../sub/x", f->mnt);
    assert_int_equal(access_log_open(path, f->mnt, "", &log, err, sizeof(err)),
                     EINVAL);
    /* a sibling whose name begins like the mount point's is not in it */
    snprintf(path, sizeof(path), "%s/mnt2", f->dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/mnt2/x", f->dir);
    assert_int_equal(access_log_open(path, f->mnt, "", &log, err, sizeof(err)),
                     0);
    access_log_close(&log);

    snprintf(path, sizeof(path), "%s/missing/x", f->dir);
    assert_int_equal(access_log_open(path, f->mnt, "", &log, err, sizeof(err)),
                     ENOENT);
    assert_non_null(strstr(err, "access_log="));
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(access_log_open("", f->mnt, "", &log, err, sizeof(err)),
                     EINVAL);
    assert_null(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_first_open_of_each_version,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_newline_and_append,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_list_each_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_failed_writes_listed_again,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_files, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
