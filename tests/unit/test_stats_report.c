/*
 * test_stats_report.c - unit tests for stats_text.c and stats_report.c:
 * parsing the text of user.s3cachefs.stats (good and bad lines), sizes and
 * counts for people, the cost and the savings (exact, from the example of
 * man s3cachefs, COUNTERS), the whole table, the JSON object (escaping,
 * one line for --watch) and the --watch lines.
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

#include "cmd/prices.h"
#include "cmd/stats_report.h"
#include "ctl/stats_text.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The man page's example (a 4 GiB dataset read twice), and one counter a
 * newer daemon might add. */
static const char sample[] =
    "bytes_read 8589934592\n"
    "bytes_from_cache 4294967296\n"
    "bytes_from_bucket 4294967296\n"
    "bytes_to_bucket 0\n"
    "bytes_read_around_cache 0\n"
    "cache_hit_ratio 0.5000\n"
    "cache_used_bytes 4294967296\n"
    "cache_index_bytes 1114112\n"
    "cache_protected_bytes 4294967296\n"
    "cache_size_bytes 536870912000\n"
    "cache_blocks 4096\n"
    "cache_evicted_blocks 0\n"
    "cache_corrupt_blocks 0\n"
    "requests_get 519\n"
    "requests_head 2\n"
    "requests_list 3\n"
    "requests_put 0\n"
    "requests_delete 0\n"
    "requests_copy 0\n"
    "requests_multipart 0\n"
    "retries 0\n"
    "failures 0\n"
    "inodes 4\n"
    "bytes_written 0\n"
    "uploads_pending 0\n"
    "uploads_completed 0\n"
    "upload_failures 0\n"
    "upload_retries 0\n"
    "copies_on_write 0\n"
    "new_counter 12345\n";

static void parse(const char *text, struct stats_text *stats)
{
    char err[200] = "";
    if (stats_text_parse(text, strlen(text), stats, err, sizeof(err)) != 0)
        fail_msg("parse: %s", err);
}

/* What FN wrote to a memory stream, NUL-terminated; free() it. */
#define CAPTURE(buffer, statement) do {                                 \
        size_t capture_len_ = 0;                                        \
        FILE *out = open_memstream(&(buffer), &capture_len_);           \
        assert_non_null(out);                                           \
        statement;                                                      \
        assert_int_equal(fclose(out), 0);                               \
    } while (0)

/* ------------------------------------------------------------ stats_text */

static void test_text_parse(void **state)
{
    struct stats_text stats = {0};
    uint64_t value = 99;
    (void)state;
    parse(sample, &stats);
    assert_int_equal(stats.count, 30);
    assert_string_equal(stats.counters[0].name, "bytes_read");
    assert_string_equal(stats.counters[29].name, "new_counter");
    assert_int_equal(stats_text_get(&stats, "requests_get", &value), 0);
    assert_int_equal(value, 519);
    assert_int_equal(stats_text_get(&stats, "cache_size_bytes", &value), 0);
    assert_int_equal(value, 536870912000ull);
    const struct stats_counter *ratio = stats_text_find(&stats, "cache_hit_ratio");
    assert_non_null(ratio);
    assert_false(ratio->integer);
    assert_string_equal(ratio->text, "0.5000");
    assert_true(ratio->real == 0.5);
    assert_int_equal(stats_text_get(&stats, "cache_hit_ratio", &value), EINVAL);
    assert_int_equal(value, 0);
    assert_int_equal(stats_text_get(&stats, "requests_nothing", &value), ENOENT);
    assert_null(stats_text_find(&stats, "bytes"));

    /* parsing again replaces; no newline at the end; blank lines; LEN */
    parse("a 1\n\nb 18446744073709551615", &stats);
    assert_int_equal(stats.count, 2);
    assert_int_equal(stats_text_get(&stats, "b", &value), 0);
    assert_int_equal(value, UINT64_MAX);
    char err[100];
    assert_int_equal(stats_text_parse("a 1\nb x", 4, &stats, err, sizeof(err)), 0);
    assert_int_equal(stats.count, 1);
    stats_text_free(&stats);
    stats_text_free(&stats);
    assert_null(stats.counters);
}

static const struct {
    const char *text;
    const char *message;
} bad_texts[] = {
    {"", "no counters at all"},
    {"\n\n", "no counters at all"},
    {"a 1\nb\n", "line 2 of the counters is not \"name value\": 'b'"},
    {"a 1\nb \n", "line 2 of the counters is not \"name value\": 'b '"},
    {" 1\n", "line 1 of the counters is not \"name value\": ' 1'"},
    {"Bytes 1\n", "line 1 of the counters is not \"name value\": 'Bytes 1'"},
    {"a-b 1\n", "line 1 of the counters is not \"name value\": 'a-b 1'"},
    {"a  1\n", "line 1 of the counters is not \"name value\": 'a  1'"},
    {"a 1 2\n", "line 1 of the counters is not \"name value\": 'a 1 2'"},
    {"a abc\n", "line 1 of the counters is not \"name value\": 'a abc'"},
    {"a -1\n", "line 1 of the counters is not \"name value\": 'a -1'"},
    {"a 01\n", "line 1 of the counters is not \"name value\": 'a 01'"},
    {"a 1.\n", "line 1 of the counters is not \"name value\": 'a 1.'"},
    {"a .5\n", "line 1 of the counters is not \"name value\": 'a .5'"},
    {"a 1e5\n", "line 1 of the counters is not \"name value\": 'a 1e5'"},
    {"a 18446744073709551616\n",
     "line 1 of the counters is not \"name value\": 'a 18446744073709551616'"},
    {"a 1\r\n", "line 1 of the counters is not \"name value\": 'a 1\r'"},
    {"a 1\na 2\n", "line 2 of the counters repeats 'a'"},
};

static void test_text_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad_texts); i++) {
        struct stats_text stats = {0};
        char err[200] = "";
        int result = stats_text_parse(bad_texts[i].text, strlen(bad_texts[i].text),
                                      &stats, err, sizeof(err));
        if (result != EPROTO || strcmp(err, bad_texts[i].message) != 0)
            fail_msg("row %zu: %d '%s', expected '%s'", i, result, err,
                     bad_texts[i].message);
        stats_text_free(&stats);
    }
    /* a NUL inside a value; a name too long; too many counters */
    struct stats_text stats = {0};
    char err[200], text[64 * 300];
    assert_int_equal(stats_text_parse("a 1\0", 4, &stats, err, sizeof(err)), EPROTO);
    memset(text, 'n', 64);
    memcpy(text + 64, " 1\n", 4);
    assert_int_equal(stats_text_parse(text, strlen(text), &stats, err,
                                      sizeof(err)), EPROTO);
    size_t used = 0;
    for (int i = 0; i <= STATS_TEXT_MAX_COUNTERS; i++)
        used += (size_t)snprintf(text + used, sizeof(text) - used, "c%d 1\n", i);
    assert_int_equal(stats_text_parse(text, used, &stats, err, sizeof(err)), EPROTO);
    assert_string_equal(err, "more than 256 counters");
    stats_text_free(&stats);
}

/* ------------------------------------------------------ sizes and counts */

static const struct {
    uint64_t bytes;
    const char *text;
} byte_rows[] = {
    {0, "0 B"},
    {1023, "1023 B"},
    {1024, "1.0 KiB"},
    {1536, "1.5 KiB"},
    {1048524, "1023.9 KiB"},
    {1048525, "1.0 MiB"},          /* 1023.95 KiB would print 1024.0 */
    {1114112, "1.1 MiB"},
    {4294967296ull, "4.0 GiB"},
    {536870912000ull, "500.0 GiB"},
    {1ull << 40, "1.0 TiB"},
    {UINT64_MAX, "16.0 EiB"},
};

static const struct {
    uint64_t count;
    const char *text;
} count_rows[] = {
    {0, "0"}, {999, "999"}, {1000, "1,000"}, {4096, "4,096"},
    {1234567, "1,234,567"}, {UINT64_MAX, "18,446,744,073,709,551,615"},
};

static void test_sizes_and_counts(void **state)
{
    char text[40];
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(byte_rows); i++) {
        stats_report_format_bytes(byte_rows[i].bytes, text, sizeof(text));
        if (strcmp(text, byte_rows[i].text) != 0)
            fail_msg("%llu bytes: '%s', expected '%s'",
                     (unsigned long long)byte_rows[i].bytes, text, byte_rows[i].text);
    }
    for (size_t i = 0; i < ARRAY_LEN(count_rows); i++) {
        stats_report_format_count(count_rows[i].count, text, sizeof(text));
        assert_string_equal(text, count_rows[i].text);
    }
}

/* ------------------------------------------------------------------ cost */

static void test_cost_of_the_example(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws;
    struct stats_cost cost;
    char err[200];
    (void)state;
    parse(sample, &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    assert_int_equal(stats_report_cost(&stats, &aws, 1 << 20, &cost, err,
                                       sizeof(err)), 0);
    /* 519 x 0.0004 / 1000 USD = 207,600 nanos; 2 HEAD 800; 3 LIST 15,000 */
    assert_int_equal(cost.items[PRICE_GET].quantity, 519);
    assert_int_equal(cost.items[PRICE_GET].nanos, 207600);
    assert_int_equal(cost.items[PRICE_HEAD].nanos, 800);
    assert_int_equal(cost.items[PRICE_LIST].nanos, 15000);
    assert_int_equal(cost.items[PRICE_PUT].nanos, 0);
    /* 2^32 bytes x 0.09 / 10^9 = 0.38654705664 USD */
    assert_int_equal(cost.items[PRICE_EGRESS].quantity, 4294967296ull);
    assert_int_equal(cost.items[PRICE_EGRESS].nanos, 386547057);
    assert_int_equal(cost.total, 207600 + 800 + 15000 + 386547057);
    /* saved: the same egress, and 4096 GETs of 1 MiB */
    assert_int_equal(cost.saved_egress.nanos, 386547057);
    assert_int_equal(cost.saved_gets.quantity, 4096);
    assert_int_equal(cost.saved_gets.nanos, 1638400);
    assert_int_equal(cost.saved_total, 386547057 + 1638400);

    /* GETs saved round up to whole blocks */
    parse("requests_get 0\nrequests_head 0\nrequests_list 0\nrequests_put 0\n"
          "requests_delete 0\nrequests_copy 0\nrequests_multipart 0\n"
          "bytes_from_bucket 0\nbytes_to_bucket 0\nbytes_from_cache 262145\n",
          &stats);
    assert_int_equal(stats_report_cost(&stats, &aws, 262144, &cost, err,
                                       sizeof(err)), 0);
    assert_int_equal(cost.saved_gets.quantity, 2);
    assert_int_equal(cost.total, 0);

    /* a counter missing */
    parse("requests_get 1\n", &stats);
    assert_int_equal(stats_report_cost(&stats, &aws, 1 << 20, &cost, err,
                                       sizeof(err)), ENOENT);
    assert_string_equal(err, "the daemon does not count 'requests_head': no "
                        "cost without it");
    /* past 2^64 nanos */
    struct price_table dear;
    assert_int_equal(prices_parse("get 1000000 per 1\n", 18, "dear", &dear, err,
                                  sizeof(err)), 0);
    parse("requests_get 18447\nrequests_head 0\nrequests_list 0\nrequests_put 0\n"
          "requests_delete 0\nrequests_copy 0\nrequests_multipart 0\n"
          "bytes_from_bucket 0\nbytes_to_bucket 0\nbytes_from_cache 0\n", &stats);
    assert_int_equal(stats_report_cost(&stats, &dear, 1 << 20, &cost, err,
                                       sizeof(err)), ERANGE);
    stats_text_free(&stats);
}

/* ----------------------------------------------------------------- table */

static const char expected_table[] =
    "s3cachefs /data: my-bucket:datasets, daemon pid 4242\n"
    "\n"
    "reads\n"
    "  read by programs                         8.0 GiB\n"
    "  from the cache                           4.0 GiB\n"
    "  from the bucket                          4.0 GiB\n"
    "  read around the cache                        0 B\n"
    "  cache hit ratio                           50.0 %\n"
    "\n"
    "cache\n"
    "  used / size                  4.0 GiB / 500.0 GiB\n"
    "  protected (read again)                   4.0 GiB\n"
    "  index                                    1.1 MiB\n"
    "  blocks                                     4,096\n"
    "  evicted blocks                                 0\n"
    "  corrupt blocks                                 0\n"
    "\n"
    "requests\n"
    "  GET                                          519\n"
    "  HEAD                                           2\n"
    "  LIST                                           3\n"
    "  PUT                                            0\n"
    "  DELETE                                         0\n"
    "  COPY                                           0\n"
    "  multipart                                      0\n"
    "\n"
    "writes\n"
    "  written by programs                          0 B\n"
    "  sent to the bucket                           0 B\n"
    "  uploads pending                                0\n"
    "  uploads completed                              0\n"
    "  uploads failed                                 0\n"
    "  uploads retried                                0\n"
    "  copies on write                                0\n"
    "\n"
    "errors\n"
    "  requests retried                               0\n"
    "  requests failed                                0\n"
    "\n"
    "other\n"
    "  inodes in use                                  4\n"
    "  new_counter                               12,345\n"
    "\n"
    "cost since mount\n"
    "  prices aws: AWS S3 Standard, us-east-1, internet egress (read 2026-12-02)\n"
    "  GET                           519 x 0.0004 USD per 1,000       0.000208 USD\n"
    "  HEAD                            2 x 0.0004 USD per 1,000       0.000001 USD\n"
    "  LIST                            3 x 0.005 USD per 1,000        0.000015 USD\n"
    "  PUT                             0 x 0.005 USD per 1,000        0.000000 USD\n"
    "  DELETE                          0   free                       0.000000 USD\n"
    "  COPY                            0 x 0.005 USD per 1,000        0.000000 USD\n"
    "  multipart                       0 x 0.005 USD per 1,000        0.000000 USD\n"
    "  egress                   4.295 GB x 0.09 USD per GB            0.386547 USD\n"
    "  ingress                       0 B   free                       0.000000 USD\n"
    "  total                                                          0.386770 USD\n"
    "\n"
    "saved by the cache since mount\n"
    "  4.0 GiB read from the cache\n"
    "  egress not paid          4.295 GB x 0.09 USD per GB            0.386547 USD\n"
    "  GET, one per 1 MiB          4,096 x 0.0004 USD per 1,000       0.001638 USD\n"
    "  total                                                          0.388185 USD\n"
    "\n"
    "  Estimates from list prices, without free allowances or volume\n"
    "  tiers. Requests are counted as sent, retries included; egress is\n"
    "  object data only (not headers or listings). Savings: each byte read\n"
    "  from the cache fetched once instead, in one GET per block of\n"
    "  1 MiB (block_size, given in the daemon's counters).\n"
    ;

static void test_table(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws;
    char *text = NULL, err[200];
    (void)state;
    parse(sample, &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    struct stats_report report = {
        .mountpoint = "/data", .source = "my-bucket:datasets", .pid = 4242,
        .stats = &stats, .prices = &aws, .block_size = 1 << 20,
        .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    if (strcmp(text, expected_table) != 0)
        fail_msg("table:\n%s", text);
    free(text);

    /* without prices: no cost; a counter missing: its row is left out */
    parse("bytes_read 1\ncache_used_bytes 2048\nretries 3\n", &stats);
    report.prices = NULL;
    report.source = NULL;
    report.pid = 0;
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    assert_string_equal(text,
        "s3cachefs /data\n"
        "\n"
        "reads\n"
        "  read by programs                             1 B\n"
        "\n"
        "cache\n"
        "  used / size                              2.0 KiB\n"
        "\n"
        "errors\n"
        "  requests retried                               3\n");
    free(text);
    /* prices, but a counter the cost needs is missing */
    report.prices = &aws;
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), ENOENT));
    free(text);
    stats_text_free(&stats);
}

/* A daemon that counts since the cache was created: the second column,
 * rows describing this moment without it, the ratio of the totals, and
 * the cost since that day after the cost since mount. */
static const char lifetime_lines[] =
    "lifetime_bytes_read 1099511627776\n"
    "lifetime_bytes_from_cache 824633720832\n"
    "lifetime_bytes_from_bucket 274877906944\n"
    "lifetime_bytes_to_bucket 1073741824\n"
    "lifetime_bytes_read_around_cache 0\n"
    "lifetime_cache_evicted_blocks 100\n"
    "lifetime_cache_corrupt_blocks 1\n"
    "lifetime_requests_get 262144\n"
    "lifetime_requests_head 1000\n"
    "lifetime_requests_list 200\n"
    "lifetime_requests_put 1024\n"
    "lifetime_requests_delete 3\n"
    "lifetime_requests_copy 2\n"
    "lifetime_requests_multipart 10\n"
    "lifetime_retries 7\n"
    "lifetime_failures 0\n"
    "lifetime_bytes_written 1073741824\n"
    "lifetime_uploads_completed 1024\n"
    "lifetime_upload_failures 0\n"
    "lifetime_upload_retries 0\n"
    "lifetime_copies_on_write 0\n"
    /* (given by a daemon that knows the shared cache, with or without one) */
    "lifetime_bytes_from_tier 0\n"
    "lifetime_bytes_to_tier 0\n"
    "lifetime_tier_bad_blocks 0\n"
    "lifetime_tier_errors 0\n"
    "lifetime_tier_requests_get 0\n"
    "lifetime_tier_requests_head 0\n"
    "lifetime_tier_requests_list 0\n"
    "lifetime_tier_requests_put 0\n"
    "lifetime_tier_requests_delete 0\n"
    "lifetime_tier_requests_copy 0\n"
    "lifetime_tier_requests_multipart 0\n"
    "lifetime_since 1764633600\n";   /* 2025-12-02 00:00 UTC */

static void test_table_lifetime(void **state)
{
    struct stats_text stats = {0}, totals = {0};
    struct price_table aws;
    char *text = NULL, err[200], *input = NULL;
    uint64_t since = 0, value = 0;
    (void)state;

    assert_true(asprintf(&input, "%s%s", sample, lifetime_lines) > 0);
    parse(input, &stats);
    free(input);
    /* the view under plain names */
    assert_int_equal(stats_report_lifetime(&stats, &totals, &since), 0);
    assert_int_equal(since, 1764633600);
    assert_int_equal(stats_text_get(&totals, "requests_get", &value), 0);
    assert_int_equal(value, 262144);
    assert_null(stats_text_find(&totals, "since"));
    assert_null(stats_text_find(&totals, "cache_used_bytes"));
    assert_string_equal(stats_text_find(&totals, "cache_hit_ratio")->text,
                        "0.7500");
    stats_text_free(&totals);

    assert_int_equal(prices_preset("aws", &aws), 0);
    struct stats_report report = {
        .mountpoint = "/data", .source = "b", .pid = 1,
        .stats = &stats, .prices = &aws, .block_size = 1 << 20,
        .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    static const char *const expected_lines[] = {
        "s3cachefs /data: b, daemon pid 1\n"
        "\n"
        "                                        this mount    since 2025-12-02\n"
        "\n"
        "reads\n"
        "  read by programs                         8.0 GiB             1.0 TiB\n"
        "  from the cache                           4.0 GiB           768.0 GiB\n"
        "  from the bucket                          4.0 GiB           256.0 GiB\n"
        "  read around the cache                        0 B                 0 B\n"
        "  cache hit ratio                           50.0 %              75.0 %\n"
        "\n"
        "cache\n"
        "  used / size                  4.0 GiB / 500.0 GiB\n"
        "  protected (read again)                   4.0 GiB\n",
        "  evicted blocks                                 0                 100\n",
        "  GET                                          519             262,144\n",
        "  uploads pending                                0\n",
        "  inodes in use                                  4\n"
        "  new_counter                               12,345\n"
        "\n"
        "cost since mount\n",
        "  total                                                          0.386770 USD\n"
        "\n"
        "saved by the cache since mount\n",
        "  total                                                          0.388185 USD\n"
        "\n"
        "cost since 2025-12-02\n",
        "  GET                       262,144 x 0.0004 USD per 1,000       0.104858 USD\n",
        "saved by the cache since 2025-12-02\n"
        "  768.0 GiB read from the cache\n",
        "  Estimates from list prices",
    };
    const char *at = text;
    for (size_t i = 0; i < sizeof(expected_lines) / sizeof(expected_lines[0]); i++) {
        const char *found = strstr(at, expected_lines[i]);
        if (found == NULL)
            fail_msg("table, no\n%s\nafter\n%s", expected_lines[i], at);
        at = found + strlen(expected_lines[i]);
    }
    /* the paragraph about estimates, once, at the end; lifetime_* are not
     * listed as counters of their own */
    assert_null(strstr(at, "Estimates"));
    assert_null(strstr(text, "lifetime_"));
    /* nor is a shared cache the mount does not have */
    assert_null(strstr(text, "shared"));
    free(text);

    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_non_null(strstr(text, "\n  \"lifetime_requests_get\": 262144,\n"));
    assert_non_null(strstr(text, "\n  \"lifetime_since\": 1764633600,\n"));
    const char *lifetime_cost = strstr(text, "\"lifetime_cost\": {");
    assert_non_null(lifetime_cost);
    assert_true(lifetime_cost > strstr(text, "\"cost\": {"));
    assert_non_null(strstr(lifetime_cost, "\"quantity\": 262144,"));
    free(text);
    stats_text_free(&stats);
}

/* ---------------------------------------------------------- shared cache */

/* The man page's example on a node of a cluster with -o shared_cache: of
 * 6 GiB fetched, 2 GiB came from the shared cache (2048 blocks of 1 MiB),
 * and 1 GiB fetched from the bucket was written to it. */
static const char tier_lines[] =
    "bytes_from_tier 2147483648\n"
    "bytes_to_tier 1073741824\n"
    "tier_hit_blocks 2048\n"
    "tier_miss_blocks 1030\n"
    "tier_bad_blocks 1\n"
    "tier_skipped_blocks 5\n"
    "tier_written_blocks 1000\n"
    "tier_written_first_elsewhere 24\n"
    "tier_dropped_blocks 6\n"
    "tier_queued_bytes 3145728\n"
    "tier_errors 2\n"
    "tier_skipping 1\n"
    "tier_requests_get 3079\n"
    "tier_requests_head 0\n"
    "tier_requests_list 1\n"
    "tier_requests_put 1024\n"
    "tier_requests_delete 0\n"
    "tier_requests_copy 0\n"
    "tier_requests_multipart 0\n";

/* A price table for the shared cache: a bucket in the cluster's region. */
static const char tier_price_file[] =
    "name In-region bucket\n"
    "get 0.0001 per 1000\n"
    "list 0.001 per 1000\n"
    "put 0.001 per 1000\n"
    "egress 0.01 per GB\n";

static void tier_prices(struct price_table *out)
{
    char err[200];
    if (prices_parse(tier_price_file, strlen(tier_price_file), "near", out,
                     err, sizeof(err)) != 0)
        fail_msg("tier prices: %s", err);
}

/* The sample with the tier's counters after copies_on_write (where the
 * daemon writes them), then EXTRA. */
static void parse_with_tier(const char *extra, struct stats_text *stats)
{
    char *input = NULL;
    const char *cut = strstr(sample, "new_counter");
    assert_non_null(cut);
    assert_true(asprintf(&input, "%.*s%s%s%s", (int)(cut - sample), sample,
                         tier_lines, cut, extra) > 0);
    parse(input, stats);
    free(input);
}

static void test_tier_cost(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws, near;
    struct stats_cost cost;
    char err[200];
    (void)state;
    parse_with_tier("", &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    tier_prices(&near);
    assert_true(stats_report_has_tier(&stats));
    assert_int_equal(stats_report_tier_cost(&stats, &near, &aws, 1 << 20,
                                            &cost, err, sizeof(err)), 0);
    /* at the tier's prices: 3079 GET x 0.0001 / 1000 = 307,900 nanos; 1
     * LIST 1,000; 1024 PUT x 0.001 / 1000 = 1,024,000; 2^31 bytes x 0.01 /
     * 10^9 = 21,474,836.48 -> 21,474,836; ingress free */
    assert_int_equal(cost.items[PRICE_GET].quantity, 3079);
    assert_int_equal(cost.items[PRICE_GET].nanos, 307900);
    assert_int_equal(cost.items[PRICE_LIST].nanos, 1000);
    assert_int_equal(cost.items[PRICE_PUT].quantity, 1024);
    assert_int_equal(cost.items[PRICE_PUT].nanos, 1024000);
    assert_int_equal(cost.items[PRICE_HEAD].nanos, 0);
    assert_int_equal(cost.items[PRICE_EGRESS].quantity, 2147483648ull);
    assert_int_equal(cost.items[PRICE_EGRESS].nanos, 21474836);
    assert_int_equal(cost.items[PRICE_INGRESS].quantity, 1073741824ull);
    assert_int_equal(cost.items[PRICE_INGRESS].nanos, 0);
    assert_int_equal(cost.total, 307900 + 1000 + 1024000 + 21474836);
    /* saved, at the bucket's (aws) prices: 2^31 bytes x 0.09 / 10^9 =
     * 193,273,528.32 -> 193,273,528, and 2048 GETs x 0.0004 / 1000 */
    assert_int_equal(cost.saved_egress.quantity, 2147483648ull);
    assert_int_equal(cost.saved_egress.nanos, 193273528);
    assert_int_equal(cost.saved_gets.quantity, 2048);
    assert_int_equal(cost.saved_gets.nanos, 819200);
    assert_int_equal(cost.saved_total, 193273528 + 819200);

    /* the bucket's own cost is unchanged by the tier's counters */
    assert_int_equal(stats_report_cost(&stats, &aws, 1 << 20, &cost, err,
                                       sizeof(err)), 0);
    assert_int_equal(cost.items[PRICE_GET].quantity, 519);
    assert_int_equal(cost.total, 207600 + 800 + 15000 + 386547057);

    /* no tier: a sentence that says so; a tier counter missing */
    parse(sample, &stats);
    assert_false(stats_report_has_tier(&stats));
    assert_int_equal(stats_report_tier_cost(&stats, &near, &aws, 1 << 20,
                                            &cost, err, sizeof(err)), ENOENT);
    assert_string_equal(err, "the mount has no shared cache (-o shared_cache): "
                        "nothing for --tier-prices to price");
    parse("bytes_from_tier 1\nbytes_from_cache 0\n", &stats);
    assert_int_equal(stats_report_tier_cost(&stats, &near, &aws, 1 << 20,
                                            &cost, err, sizeof(err)), ENOENT);
    assert_string_equal(err, "the daemon does not count 'tier_requests_get': "
                        "no cost without it");
    stats_text_free(&stats);
}

static void test_tier_table(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws, near;
    char *text = NULL, err[200];
    (void)state;
    parse_with_tier("", &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    tier_prices(&near);
    struct stats_report report = {
        .mountpoint = "/data", .source = "my-bucket:datasets", .pid = 4242,
        .stats = &stats, .prices = &aws, .tier_prices = &near,
        .block_size = 1 << 20, .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    static const char *const expected_parts[] = {
        "reads\n"
        "  read by programs                         8.0 GiB\n"
        "  from the cache                           4.0 GiB\n"
        "  from the shared cache                    2.0 GiB\n"
        "  from the bucket                          4.0 GiB\n",
        "requests\n"
        "  GET                                          519\n",
        "shared cache\n"
        "  blocks read from it                        2,048\n"
        "  blocks it did not have                     1,030\n"
        "  blocks damaged                                 1\n"
        "  blocks not asked (skipped)                     5\n"
        "  sent to it                               1.0 GiB\n"
        "  blocks written                             1,000\n"
        "  written first by others                       24\n"
        "  blocks not written                             6\n"
        "  waiting to be written                    3.0 MiB\n"
        "  requests failed                                2\n"
        "  skipped after a failure                      yes\n"
        "\n"
        "shared cache requests\n"
        "  GET                                        3,079\n"
        "  HEAD                                           0\n"
        "  LIST                                           1\n"
        "  PUT                                        1,024\n"
        "  DELETE                                         0\n"
        "  COPY                                           0\n"
        "  multipart                                      0\n"
        "\n"
        "writes\n",
        "other\n"
        "  inodes in use                                  4\n"
        "  new_counter                               12,345\n"
        "\n"
        "cost since mount\n",
        "  GET                           519 x 0.0004 USD per 1,000       0.000208 USD\n",
        "saved by the cache since mount\n",
        "  total                                                          0.388185 USD\n"
        "\n"
        "shared cache cost since mount\n"
        "  prices near: In-region bucket\n"
        "  GET                         3,079 x 0.0001 USD per 1,000       0.000308 USD\n"
        "  HEAD                            0   free                       0.000000 USD\n"
        "  LIST                            1 x 0.001 USD per 1,000        0.000001 USD\n"
        "  PUT                         1,024 x 0.001 USD per 1,000        0.001024 USD\n"
        "  DELETE                          0   free                       0.000000 USD\n"
        "  COPY                            0   free                       0.000000 USD\n"
        "  multipart                       0   free                       0.000000 USD\n"
        "  egress                   2.147 GB x 0.01 USD per GB            0.021475 USD\n"
        "  ingress                   1.0 GiB   free                       0.000000 USD\n"
        "  total                                                          0.022808 USD\n"
        "\n"
        "saved by the shared cache since mount\n"
        "  2.0 GiB read from the shared cache, at the bucket's prices (aws)\n"
        "  egress not paid          2.147 GB x 0.09 USD per GB            0.193274 USD\n"
        "  GET, one per 1 MiB          2,048 x 0.0004 USD per 1,000       0.000819 USD\n"
        "  total                                                          0.194093 USD\n"
        "  net, less the shared cache's cost                              0.171285 USD\n"
        "\n"
        "  Estimates from list prices",
        "  The shared cache's savings: each byte read from it fetched from\n"
        "  the bucket instead, at the bucket's prices, one GET per block.\n",
    };
    const char *at = text;
    for (size_t i = 0; i < ARRAY_LEN(expected_parts); i++) {
        const char *found = strstr(at, expected_parts[i]);
        if (found == NULL)
            fail_msg("table, no\n%s\nafter\n%s", expected_parts[i], at);
        at = found + strlen(expected_parts[i]);
    }
    /* the tier's counters are known: none under "other" by its name */
    assert_null(strstr(text, "tier_"));
    assert_null(strstr(text, "not priced"));
    free(text);

    /* the bucket priced, the tier not: said once, after the costs */
    report.tier_prices = NULL;
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    static const char not_priced[] =
        "\nshared cache: not priced (its requests and bytes are not in the "
        "cost above;\n  --tier-prices=NAME|FILE prices them)\n";
    const char *said = strstr(text, not_priced);
    assert_non_null(said);
    assert_true(said > strstr(text, "saved by the cache since mount"));
    assert_null(strstr(said + strlen(not_priced), "not priced"));
    assert_null(strstr(text, "shared cache cost"));
    assert_null(strstr(text, "The shared cache's savings"));
    free(text);

    /* without a tier: neither the groups nor the line */
    parse(sample, &stats);
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    assert_null(strstr(text, "shared"));
    free(text);
    /* tier prices for a mount without a tier: the error, nothing printed */
    report.tier_prices = &near;
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), ENOENT));
    assert_string_equal(text, "");
    assert_non_null(strstr(err, "no shared cache"));
    free(text);
    stats_text_free(&stats);
}

/* The shared cache dearer than what it saved: the net is negative; and
 * in another currency than the bucket's, there is no net. */
static void test_tier_net(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws, dear;
    char *text = NULL, err[200];
    static const char dear_file[] = "currency EUR\nput 1 per 1000\n";
    (void)state;
    parse_with_tier("", &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    assert_int_equal(prices_parse(dear_file, strlen(dear_file), "dear", &dear,
                                  err, sizeof(err)), 0);
    struct stats_report report = {
        .mountpoint = "/data", .stats = &stats, .prices = &aws,
        .tier_prices = &dear, .block_size = 1 << 20,
        .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    /* 1024 PUT x 1 EUR / 1000 = 1.024 EUR; saved 0.194092728 USD */
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    assert_non_null(strstr(text, "  total                                    "
                           "                      1.024000 EUR\n"));
    assert_non_null(strstr(text, "  total                                    "
                           "                      0.194093 USD\n"));
    assert_null(strstr(text, "net, less"));
    free(text);
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_null(strstr(text, "\"net\""));
    free(text);

    memcpy(dear.currency, "USD", 4);
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    /* 0.194092728 - 1.024 = -0.829907272 */
    assert_non_null(strstr(text, "  net, less the shared cache's cost        "
                           "                     -0.829907 USD\n"));
    free(text);
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_non_null(strstr(text, "\"net\": -0.829907272\n"));
    free(text);

    /* 100 nanos short: no sign on the 6 places that round it to zero,
     * the sign in the 9 of JSON. 1024 PUT x 0.0001 = 0.1024, 1 LIST
     * 0.091692828: 0.194092828 */
    static const char close_file[] = "put 0.0001 per 1\n"
                                     "list 0.091692828 per 1\n";
    assert_int_equal(prices_parse(close_file, strlen(close_file), "close",
                                  &dear, err, sizeof(err)), 0);
    CAPTURE(text, assert_int_equal(stats_report_table(out, &report, err,
                                                      sizeof(err)), 0));
    assert_non_null(strstr(text, "  net, less the shared cache's cost        "
                           "                      0.000000 USD\n"));
    free(text);
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_non_null(strstr(text, "\"net\": -0.000000100\n"));
    free(text);
    stats_text_free(&stats);
}

/* The JSON object: the tier's counters as they are, "tier_cost" shaped
 * like "cost", and the totals since the cache was created. */
static void test_tier_json(void **state)
{
    struct stats_text stats = {0};
    struct price_table aws, near;
    char *text = NULL, err[200];
    (void)state;
    parse_with_tier("lifetime_bytes_from_cache 4294967296\n"
                    "lifetime_bytes_from_bucket 4294967296\n"
                    "lifetime_bytes_to_bucket 0\n"
                    "lifetime_requests_get 519\n"
                    "lifetime_requests_head 2\n"
                    "lifetime_requests_list 3\n"
                    "lifetime_requests_put 0\n"
                    "lifetime_requests_delete 0\n"
                    "lifetime_requests_copy 0\n"
                    "lifetime_requests_multipart 0\n"
                    "lifetime_bytes_from_tier 12884901888\n"
                    "lifetime_bytes_to_tier 1073741824\n"
                    "lifetime_tier_bad_blocks 1\n"
                    "lifetime_tier_errors 2\n"
                    "lifetime_tier_requests_get 12289\n"
                    "lifetime_tier_requests_head 0\n"
                    "lifetime_tier_requests_list 1\n"
                    "lifetime_tier_requests_put 1024\n"
                    "lifetime_tier_requests_delete 0\n"
                    "lifetime_tier_requests_copy 0\n"
                    "lifetime_tier_requests_multipart 0\n"
                    "lifetime_since 1764633600\n", &stats);
    assert_int_equal(prices_preset("aws", &aws), 0);
    tier_prices(&near);
    struct stats_report report = {
        .mountpoint = "/data", .stats = &stats, .prices = &aws,
        .tier_prices = &near, .block_size = 1 << 20,
        .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_non_null(strstr(text, "\n  \"bytes_from_tier\": 2147483648,\n"));
    assert_non_null(strstr(text, "\n  \"tier_skipping\": 1,\n"));
    assert_non_null(strstr(text, "\n  \"tier_requests_put\": 1024,\n"));
    assert_non_null(strstr(text, "\n  \"lifetime_tier_requests_get\": 12289,\n"));
    const char *cost = strstr(text, "\n  \"cost\": {");
    const char *tier = strstr(text, "\n  \"tier_cost\": {");
    const char *lifetime = strstr(text, "\n  \"lifetime_tier_cost\": {");
    assert_non_null(cost);
    assert_non_null(tier);
    assert_non_null(lifetime);
    assert_true(cost < tier && tier < lifetime);
    assert_non_null(strstr(tier,
        "\"tier_cost\": {\n"
        "    \"currency\": \"USD\",\n"
        "    \"prices\": \"near\",\n"
        "    \"prices_title\": \"In-region bucket\",\n"
        "    \"estimate\": true,\n"
        "    \"items\": {\n"
        "      \"get\": {\n"
        "        \"quantity\": 3079,\n"
        "        \"unit\": \"requests\",\n"
        "        \"price\": 0.0001,\n"
        "        \"per\": 1000,\n"
        "        \"amount\": 0.000307900\n"
        "      },\n"));
    assert_non_null(strstr(tier,
        "      \"egress\": {\n"
        "        \"quantity\": 2147483648,\n"
        "        \"unit\": \"bytes\",\n"
        "        \"price\": 0.01,\n"
        "        \"per\": 1000000000,\n"
        "        \"amount\": 0.021474836\n"
        "      },\n"));
    assert_non_null(strstr(tier,
        "    \"total\": 0.022807736,\n"
        "    \"saved\": {\n"
        "      \"currency\": \"USD\",\n"
        "      \"prices\": \"aws\",\n"
        "      \"block_size\": 1048576,\n"
        "      \"block_size_from\": \"counters\",\n"
        "      \"egress\": {\n"
        "        \"quantity\": 2147483648,\n"
        "        \"unit\": \"bytes\",\n"
        "        \"price\": 0.09,\n"
        "        \"per\": 1000000000,\n"
        "        \"amount\": 0.193273528\n"
        "      },\n"
        "      \"get\": {\n"
        "        \"quantity\": 2048,\n"
        "        \"unit\": \"requests\",\n"
        "        \"price\": 0.0004,\n"
        "        \"per\": 1000,\n"
        "        \"amount\": 0.000819200\n"
        "      },\n"
        "      \"total\": 0.194092728,\n"
        "      \"net\": 0.171284992\n"
        "    }\n"
        "  }"));
    /* since the cache was created: 12 GiB from the tier, 12289 GETs
     * (1,228,900 nanos), 2^33 + 2^32 bytes x 0.01 = 128,849,018.88 ->
     * 128,849,019; saved 12288 GETs at 0.0004 / 1000 */
    assert_non_null(strstr(lifetime, "\"amount\": 0.001228900\n"));
    assert_non_null(strstr(lifetime, "\"amount\": 0.128849019\n"));
    assert_non_null(strstr(lifetime, "\"quantity\": 12288,"));
    assert_non_null(strstr(lifetime,
        "    \"total\": 0.131102919,\n"));   /* + 1,000 LIST + 1,024,000 PUT */
    /* the saved "currency" and "prices" are the tier's only */
    assert_true(strstr(text, "\"saved\": {\n      \"currency\"") > tier);
    free(text);

    /* the lifetime ratio counts the tier's bytes as misses: 4 / (4+4+12) */
    struct stats_text totals = {0};
    uint64_t since;
    assert_int_equal(stats_report_lifetime(&stats, &totals, &since), 0);
    assert_string_equal(stats_text_find(&totals, "cache_hit_ratio")->text,
                        "0.2000");
    stats_text_free(&totals);
    stats_text_free(&stats);
}

/* ------------------------------------------------------------------ JSON */

static void test_json(void **state)
{
    struct stats_text stats = {0};
    struct price_table r2;
    char *text = NULL, err[200];
    (void)state;
    parse(sample, &stats);
    assert_int_equal(prices_preset("r2", &r2), 0);
    struct stats_report report = {
        .mountpoint = "/data", .source = "my-bucket:datasets", .pid = 4242,
        .stats = &stats, .prices = &r2, .block_size = 262144,
        .block_size_from = STATS_BLOCK_SIZE_COUNTERS,
    };
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, false, -1,
                                                     err, sizeof(err)), 0));
    assert_true(strncmp(text, "{\n  \"mountpoint\": \"/data\",\n", 27) == 0);
    assert_non_null(strstr(text, "\n  \"requests_get\": 519,\n"));
    assert_non_null(strstr(text, "\n  \"cache_hit_ratio\": 0.5000,\n"));
    assert_non_null(strstr(text, "\n  \"new_counter\": 12345,\n"));
    assert_null(strstr(text, "\"time\""));
    /* 519 x 0.36 / 10^6 USD */
    assert_non_null(strstr(text, "\"get\": {\n        \"quantity\": 519,\n"
                           "        \"unit\": \"requests\",\n"
                           "        \"price\": 0.36,\n"
                           "        \"per\": 1000000,\n"
                           "        \"amount\": 0.000186840\n"));
    assert_non_null(strstr(text, "\"prices_read_on\": \"2026-12-02\""));
    /* 16384 blocks of 256 KiB */
    assert_non_null(strstr(text, "\"block_size\": 262144,\n"
                           "      \"block_size_from\": \"counters\",\n"));
    assert_non_null(strstr(text, "\"quantity\": 16384,"));
    assert_int_equal(text[strlen(text) - 1], '\n');
    assert_int_equal(text[strlen(text) - 2], '}');
    free(text);

    /* one line, a time, strings escaped, bytes that are not UTF-8 */
    report.prices = NULL;
    report.mountpoint = "/mnt/a\"b\\c\td\x01" "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                        "\xff\xc3(\xed\xa0\x80";
    report.source = NULL;
    report.pid = 0;
    parse("a 1\nb 0.25\n", &stats);
    CAPTURE(text, assert_int_equal(stats_report_json(out, &report, true,
                                                     1764643200.25, err,
                                                     sizeof(err)), 0));
    assert_string_equal(text,
        "{ \"time\": 1764643200.250, \"mountpoint\": "
        "\"/mnt/a\\\"b\\\\c\\u0009d\\u0001\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
        "\\ufffd\\ufffd(\\ufffd\\ufffd\\ufffd\", \"a\": 1, \"b\": 0.25 }\n");
    free(text);
    stats_text_free(&stats);
}

/* ----------------------------------------------------------------- watch */

static void test_watch(void **state)
{
    struct stats_text before = {0}, now = {0};
    struct price_table aws;
    char *text = NULL;
    (void)state;
    assert_int_equal(prices_preset("aws", &aws), 0);
    parse("bytes_from_cache 0\nbytes_from_bucket 1048576\nrequests_get 10\n"
          "requests_head 0\nrequests_list 0\nrequests_put 0\nrequests_delete 0\n"
          "requests_copy 0\nrequests_multipart 0\nbytes_to_bucket 0\n"
          "uploads_pending 0\n", &before);
    /* two seconds later: 8 MiB from the cache, 4 MiB more from the bucket,
     * 4 GETs, 3 PUTs and 2 MiB sent, 1 upload pending */
    parse("bytes_from_cache 8388608\nbytes_from_bucket 5242880\nrequests_get 14\n"
          "requests_head 0\nrequests_list 0\nrequests_put 3\nrequests_delete 0\n"
          "requests_copy 0\nrequests_multipart 0\nbytes_to_bucket 2097152\n"
          "uploads_pending 1\n", &now);
    CAPTURE(text, stats_report_watch_header(out, &aws);
                  stats_report_watch_line(out, &before, &now, 2.0, &aws));
    /* cost, in nanos: 4 GET 1,600 + 3 PUT 15,000 + 4,194,304 bytes of
     * egress x 0.09 = 377,487.36 -> 377,487; 394,087 in 2 s is
     * 0.7093566 USD an hour */
    assert_string_equal(text,
        " ---- MiB/s ---- --------------------- requests/s ---------------------- "
        "--- upload ---- - cost --\n"
        "   cache  bucket     GET    HEAD    LIST     PUT  DELETE    COPY     MPU"
        "   MiB/s pending     USD/h\n"
        "     4.0     2.0     2.0     0.0     0.0     1.5     0.0     0.0     0.0"
        "     1.0       1    0.7094\n");
    free(text);

    /* counters that went down (another daemon) count from 0; a counter
     * missing shows "-"; no cost column without prices */
    parse("bytes_from_cache 1048576\nrequests_get 2\n", &before);
    parse("bytes_from_cache 0\nrequests_get 1\n", &now);
    CAPTURE(text, stats_report_watch_line(out, &before, &now, 1.0, NULL));
    assert_string_equal(text,
        "     0.0       -     1.0       -       -       -       -       -       -"
        "       -       -\n");
    free(text);
    stats_text_free(&before);
    stats_text_free(&now);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_parse),
        cmocka_unit_test(test_text_errors),
        cmocka_unit_test(test_sizes_and_counts),
        cmocka_unit_test(test_cost_of_the_example),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_table_lifetime),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_tier_cost),
        cmocka_unit_test(test_tier_table),
        cmocka_unit_test(test_tier_net),
        cmocka_unit_test(test_tier_json),
        cmocka_unit_test(test_watch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
