/*
 * test_s3list.c - unit tests for the guard of paginated listings
 * (s3walk_advance() in s3walk.c): pages as a server sends them, parsed
 * by s3xml, fed to a walk one after the other. A walk over pages that go
 * round (a token seen before, a page that lists nothing new, endless empty
 * pages) must end with EIO; a walk over honest pages, however odd (empty
 * pages now and then, prefixes only, s3rver's order), must not.
 *
 * The requests themselves are not here: the integration tests list
 * through a proxy that repeats tokens (test_faults.py).
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

#include <cmocka.h>

#include "base/log.h"
#include "s3/s3walk.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PAGE_MAX 8

/* A page as the server would send it: keys, common prefixes, and the
 * next token (NULL: the last page). */
struct page_spec {
    const char *keys[PAGE_MAX];
    const char *prefixes[PAGE_MAX];
    const char *next_token;
};

static void parse_page(const struct page_spec *spec, struct s3xml_listing *out)
{
    char xml[4096];
    size_t used = 0;

#define ADD(...) \
    used += (size_t)snprintf(xml + used, sizeof(xml) - used, __VA_ARGS__)
    ADD("<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>%s"
        "</IsTruncated>", spec->next_token ? "true" : "false");
    if (spec->next_token != NULL)
        ADD("<NextContinuationToken>%s</NextContinuationToken>",
            spec->next_token);
    for (size_t i = 0; i < PAGE_MAX && spec->keys[i] != NULL; i++)
        ADD("<Contents><Key>%s</Key><Size>1</Size></Contents>", spec->keys[i]);
    for (size_t i = 0; i < PAGE_MAX && spec->prefixes[i] != NULL; i++)
        ADD("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>",
            spec->prefixes[i]);
    ADD("</ListBucketResult>");
#undef ADD
    assert_true(used < sizeof(xml));
    assert_int_equal(s3xml_parse_listing(xml, used, out), 0);
}

/* Feed PAGES to a new walk; returns the errno of the first page refused
 * (its index in *at) or 0, checking the walk's token after each page. */
static int walk_pages(const struct page_spec *pages, size_t count, size_t *at)
{
    struct s3walk walk = {0};
    int err = 0;

    for (*at = 0; *at < count && err == 0; (*at)++) {
        struct s3xml_listing page;
        parse_page(&pages[*at], &page);
        err = s3walk_advance(&walk, "d/", &page);
        s3xml_listing_free(&page);
        if (err != 0)
            break;
        if (pages[*at].next_token != NULL) {
            assert_false(walk.done);
            assert_string_equal(walk.token, pages[*at].next_token);
        } else {
            assert_true(walk.done);
            assert_null(walk.token);
        }
    }
    if (err == 0)
        assert_true(walk.done);
    else
        assert_true(walk.done); /* a refused walk cannot go on */
    s3walk_clear(&walk);
    s3walk_clear(&walk); /* safe twice */
    return err;
}

static void test_honest_pages(void **state)
{
    static const struct page_spec pages[] = {
        {{"d/a", "d/b"}, {"d/c/"}, "t1"},
        {{"d/d"}, {"d/e/", "d/f/"}, "t2"},
        {{"d/g", "d/h"}, {0}, NULL},
    };
    size_t at;

    (void)state;
    assert_int_equal(walk_pages(pages, ARRAY_LEN(pages), &at), 0);
}

/* s3rver lists a directory's keys before a file that sorts first
 * ("m.txt" < "m/"), and may name a common prefix again on the next page:
 * progress is the greatest entry growing, not order within pages. */
static void test_s3rver_order(void **state)
{
    static const struct page_spec pages[] = {
        {{"d/a", "d/m.txt"}, {"d/m/"}, "t1"},
        {{"d/n"}, {"d/m/"}, "t2"},
        {{"d/z"}, {0}, NULL},
    };
    size_t at;

    (void)state;
    assert_int_equal(walk_pages(pages, ARRAY_LEN(pages), &at), 0);
}

static void test_one_page(void **state)
{
    static const struct page_spec pages[] = {{{"d/a"}, {0}, NULL}};
    static const struct page_spec empty[] = {{{0}, {0}, NULL}};
    size_t at;

    (void)state;
    assert_int_equal(walk_pages(pages, 1, &at), 0);
    assert_int_equal(walk_pages(empty, 1, &at), 0);
}

/* The proxy's repeat_token, and longer rounds: a token seen before. */
static void test_token_seen_before(void **state)
{
    static const struct page_spec twice[] = {
        {{"d/a"}, {0}, "t1"},
        {{"d/b"}, {0}, "t1"},
    };
    static const struct page_spec round[] = {
        {{"d/a"}, {0}, "t1"},
        {{"d/b"}, {0}, "t2"},
        {{"d/c"}, {0}, "t3"},
        {{"d/d"}, {0}, "t2"},
    };
    size_t at;

    (void)state;
    assert_int_equal(walk_pages(twice, ARRAY_LEN(twice), &at), EIO);
    assert_int_equal(at, 1);
    assert_int_equal(walk_pages(round, ARRAY_LEN(round), &at), EIO);
    assert_int_equal(at, 3);
}

/* New tokens, but the same entries again (or older ones): no progress. */
static void test_page_without_progress(void **state)
{
    static const struct page_spec same[] = {
        {{"d/a", "d/b"}, {0}, "t1"},
        {{"d/a", "d/b"}, {0}, "t2"},
    };
    static const struct page_spec older[] = {
        {{"d/m"}, {"d/x/"}, "t1"},
        {{"d/n"}, {"d/p/"}, "t2"},
    };
    static const struct page_spec last_again[] = {
        {{"d/a"}, {0}, "t1"},
        {{"d/a"}, {0}, NULL},
    };
    size_t at;

    (void)state;
    assert_int_equal(walk_pages(same, ARRAY_LEN(same), &at), EIO);
    assert_int_equal(at, 1);
    assert_int_equal(walk_pages(older, ARRAY_LEN(older), &at), EIO);
    assert_int_equal(at, 1);
    assert_int_equal(walk_pages(last_again, ARRAY_LEN(last_again), &at), EIO);
}

/* Empty truncated pages with fresh tokens: tolerated, up to
 * S3WALK_EMPTY_PAGES_MAX in a row; a page with entries starts over. */
static void test_empty_pages(void **state)
{
    size_t count = 2 * S3WALK_EMPTY_PAGES_MAX + 4;
    struct page_spec *pages = calloc(count, sizeof(*pages));
    char (*tokens)[16] = calloc(count, sizeof(*tokens));
    size_t at;

    (void)state;
    assert_non_null(pages);
    assert_non_null(tokens);
    for (size_t i = 0; i < count; i++) {
        snprintf(tokens[i], sizeof(tokens[i]), "t%zu", i);
        pages[i].next_token = tokens[i];
    }
    /* entries at 0 and after S3WALK_EMPTY_PAGES_MAX empty pages */
    pages[0].keys[0] = "d/a";
    pages[S3WALK_EMPTY_PAGES_MAX + 1].keys[0] = "d/b";
    pages[count - 1].next_token = NULL;
    assert_int_equal(walk_pages(pages, count, &at), EIO);
    /* the run after "d/b" is one page too long */
    assert_int_equal(at, 2 * S3WALK_EMPTY_PAGES_MAX + 2);
    pages[2 * S3WALK_EMPTY_PAGES_MAX + 2].keys[0] = "d/c";
    assert_int_equal(walk_pages(pages, count, &at), 0);
    free(tokens);
    free(pages);
}

/* The request of s3walk_next(), answered from SERVER_PAGES: the page
 * after the one whose next token the request carries (the first page
 * without one), or SERVER_ERR. */
static const struct page_spec *server_pages;
static size_t server_count;
static int server_err;
static unsigned server_requests;

int s3_list_objects(struct s3_client *client, const char *prefix,
                    const char *delimiter, const char *continuation_token,
                    const char *start_after, unsigned max_keys,
                    struct s3xml_listing *out)
{
    size_t at = 0;

    (void)client, (void)delimiter, (void)start_after, (void)max_keys;
    assert_string_equal(prefix, "d/");
    server_requests++;
    memset(out, 0, sizeof(*out));
    if (server_err != 0)
        return server_err;
    if (continuation_token != NULL) {
        while (at < server_count &&
               (server_pages[at].next_token == NULL ||
                strcmp(server_pages[at].next_token, continuation_token) != 0))
            at++;
        at++; /* the page after the one that gave the token */
    }
    assert_true(at < server_count);
    parse_page(&server_pages[at], out);
    return 0;
}

/* Walk the server's pages to the end: the number of pages and keys seen,
 * and the errno that ended the walk. */
static int walk_server(unsigned *pages_seen, unsigned *keys_seen)
{
    struct s3walk walk = {0};
    int err = 0;

    *pages_seen = *keys_seen = 0;
    server_requests = 0;
    while (!walk.done) {
        struct s3xml_listing page;
        err = s3walk_next(NULL, &walk, "d/", "/", 1000, &page);
        if (err != 0) {
            assert_int_equal(page.object_count + page.prefix_count, 0);
            break;
        }
        (*pages_seen)++;
        *keys_seen += (unsigned)page.object_count;
        s3xml_listing_free(&page);
    }
    assert_true(walk.done);
    assert_int_equal(server_requests, *pages_seen + (err != 0));
    s3walk_clear(&walk);
    return err;
}

static void test_walk_requests(void **state)
{
    static const struct page_spec honest[] = {
        {{"d/a", "d/b"}, {0}, "t1"},
        {{"d/c"}, {0}, "t2"},
        {{"d/d"}, {0}, NULL},
    };
    /* the second page hands out the first page's token again */
    static const struct page_spec round[] = {
        {{"d/a"}, {0}, "t1"},
        {{"d/b"}, {0}, "t1"},
    };
    unsigned pages, keys;

    (void)state;
    server_pages = honest, server_count = ARRAY_LEN(honest), server_err = 0;
    assert_int_equal(walk_server(&pages, &keys), 0);
    assert_int_equal(pages, 3);
    assert_int_equal(keys, 4);
    server_pages = round, server_count = ARRAY_LEN(round);
    assert_int_equal(walk_server(&pages, &keys), EIO);
    assert_int_equal(pages, 1);
    server_err = EACCES; /* the request's own errno ends the walk */
    assert_int_equal(walk_server(&pages, &keys), EACCES);
    assert_int_equal(pages, 0);
    server_err = 0;
}

static void test_done_walk(void **state)
{
    struct s3walk walk = {0};
    struct s3xml_listing page;
    static const struct page_spec last = {{"d/a"}, {0}, NULL};

    (void)state;
    parse_page(&last, &page);
    assert_int_equal(s3walk_advance(&walk, "d/", &page), 0);
    assert_true(walk.done);
    assert_int_equal(s3walk_advance(&walk, "d/", &page), EINVAL);
    s3xml_listing_free(&page);
    s3walk_clear(&walk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_pages),
        cmocka_unit_test(test_s3rver_order),
        cmocka_unit_test(test_one_page),
        cmocka_unit_test(test_token_seen_before),
        cmocka_unit_test(test_page_without_progress),
        cmocka_unit_test(test_empty_pages),
        cmocka_unit_test(test_done_walk),
        cmocka_unit_test(test_walk_requests),
    };

    log_set_level(LOG_LEVEL_ERROR); /* the refusals are logged: quiet */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
