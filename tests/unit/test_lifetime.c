/*
 * test_lifetime.c - unit tests for lifetime.c on a real cache directory:
 * a new cache counts from now; what one "mount" counted is added to the
 * next one's; states (gauges) are not summed; a name of a newer version
 * in the note survives; a note that is not counters, and a sum past
 * 2^64, do no harm.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
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

#include "cache/cache.h"
#include "cache/lifetime.h"
#include "unit_cache.h"

struct fixture {
    char dir[64];
    struct cache_conf conf;
    struct cache *cache;
    const char *now;        /* what counters_now() answers */
};

static int counters_now(void *arg, char **text)
{
    struct fixture *f = arg;

    *text = strdup(f->now);
    return *text != NULL ? 0 : ENOMEM;
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_lifetime.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->conf = (struct cache_conf){
        .dir = f->dir, .bucket = "b", .size_limit = 64u << 20,
        .block_size = 1 << 20,
    };
    f->cache = unit_cache_open(&f->conf);
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

/* The lifetime lines of NOW as the lifetime of the cache sees them. */
static char *appended(struct fixture *f, const char *now)
{
    struct lifetime *lifetime = NULL;
    char *text = NULL;

    f->now = now;
    assert_int_equal(lifetime_start(f->cache, 0, counters_now, f, &lifetime), 0);
    assert_int_equal(lifetime_append(lifetime, now, &text), 0);
    lifetime_stop(&lifetime); /* stores the totals */
    assert_null(lifetime);
    return text;
}

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);

    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return true;
    return false;
}

static void test_mounts_add_up(void **state)
{
    struct fixture *f = *state;
    time_t before = time(NULL);

    char *text = appended(f, "bytes_read 100\nrequests_get 3\n"
                             "cache_used_bytes 4096\nuploads_pending 2\n");
    /* the mount's own lines first, unchanged */
    assert_true(strncmp(text, "bytes_read 100\nrequests_get 3\n", 30) == 0);
    assert_true(has_line(text, "lifetime_bytes_read 100"));
    assert_true(has_line(text, "lifetime_requests_get 3"));
    assert_true(has_line(text, "lifetime_bytes_from_bucket 0"));
    /* states are not summed */
    assert_null(strstr(text, "lifetime_cache_used_bytes"));
    assert_null(strstr(text, "lifetime_uploads_pending"));
    const char *since_line = strstr(text, "lifetime_since ");
    assert_non_null(since_line);
    long long since = atoll(since_line + strlen("lifetime_since "));
    assert_true(since >= before && since <= time(NULL));
    free(text);

    /* the next mount of the cache counts from zero: the totals add up */
    text = appended(f, "bytes_read 50\nrequests_get 1\ncache_used_bytes 8192\n");
    assert_true(has_line(text, "lifetime_bytes_read 150"));
    assert_true(has_line(text, "lifetime_requests_get 4"));
    char expected[64];
    snprintf(expected, sizeof(expected), "lifetime_since %lld", since);
    assert_true(has_line(text, expected));
    free(text);

    /* ... and across a close and open of the cache itself */
    cache_close(&f->cache);
    f->cache = unit_cache_open(&f->conf);
    text = appended(f, "bytes_read 1\n");
    assert_true(has_line(text, "lifetime_bytes_read 151"));
    assert_true(has_line(text, "lifetime_requests_get 4"));
    free(text);
    assert_true(lifetime_counts("requests_multipart"));
    assert_false(lifetime_counts("cache_used_bytes"));
    assert_false(lifetime_counts("lifetime_bytes_read"));
}

/* A note written by a newer version: its names kept, sums go on. A note
 * that is not counters: ignored. Sums stop at 2^64 - 1. */
static void test_notes_of_other_versions(void **state)
{
    struct fixture *f = *state;
    char *text = NULL;

    assert_int_equal(cache_note_put(f->cache, "lifetime",
                                    "since 1000\nbytes_read 18446744073709551610\n"
                                    "future_counter 77\nnot a line\n"
                                    "requests_get -5\nrequests_head 12x\n"),
                     0);
    text = appended(f, "bytes_read 100\nrequests_head 1\n");
    assert_true(has_line(text, "lifetime_since 1000"));
    assert_true(has_line(text, "lifetime_bytes_read 18446744073709551615"));
    assert_true(has_line(text, "lifetime_requests_get 0"));
    assert_true(has_line(text, "lifetime_requests_head 1"));
    free(text);
    assert_int_equal(cache_note_get(f->cache, "lifetime", &text), 0);
    assert_true(has_line(text, "future_counter 77"));
    assert_true(has_line(text, "since 1000"));
    assert_true(has_line(text, "requests_head 1"));
    free(text);

    /* a note of no counters at all */
    assert_int_equal(cache_note_put(f->cache, "lifetime", "\x01\x02garbage"), 0);
    text = appended(f, "bytes_read 5\n");
    assert_true(has_line(text, "lifetime_bytes_read 5"));
    free(text);

    assert_int_equal(cache_note_get(f->cache, "never-written", &text), ENOENT);
    assert_null(text);
}

/* The thread stores the totals every period, without a stop: what a
 * daemon killed keeps. */
static void test_stored_every_period(void **state)
{
    struct fixture *f = *state;
    struct lifetime *lifetime = NULL;
    char *note = NULL;

    f->now = "bytes_read 7\n";
    assert_int_equal(lifetime_start(f->cache, 0.05, counters_now, f,
                                    &lifetime), 0);
    /* the start of a new cache's count is stored at once */
    assert_int_equal(cache_note_get(f->cache, "lifetime", &note), 0);
    assert_non_null(strstr(note, "since "));
    free(note);
    f->now = "bytes_read 9\n";
    double until = (double)time(NULL) + 10;
    bool stored = false;
    while (!stored && (double)time(NULL) < until) {
        struct timespec pause = {.tv_nsec = 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
        assert_int_equal(cache_note_get(f->cache, "lifetime", &note), 0);
        stored = has_line(note, "bytes_read 9");
        free(note);
    }
    assert_true(stored);
    lifetime_stop(&lifetime);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mounts_add_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notes_of_other_versions, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stored_every_period, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
