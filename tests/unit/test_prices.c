/*
 * test_prices.c - unit tests for prices.c: every preset's figures (as read
 * from the providers' pages, see the comments in prices.c), the price file
 * format, bad files with their message and line number, the exact
 * arithmetic of costs (rounding half up to 10^-9, 128-bit products, the
 * 2^64 limit) and how money and prices are written.
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
#include <string.h>

#include <cmocka.h>

#include "cmd/prices.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define GB 1000000000ull

/* --------------------------------------------------------------- presets */

/* One row per preset and item: the price as the preset states it. */
static const struct {
    const char *preset;
    enum price_item item;
    const char *amount;     /* prices_format_amount() */
    uint64_t per;
    const char *unit;
} preset_rows[] = {
    {"aws", PRICE_GET, "0.0004", 1000, ""},
    {"aws", PRICE_HEAD, "0.0004", 1000, ""},
    {"aws", PRICE_LIST, "0.005", 1000, ""},
    {"aws", PRICE_PUT, "0.005", 1000, ""},
    {"aws", PRICE_DELETE, "0", 1, ""},
    {"aws", PRICE_COPY, "0.005", 1000, ""},
    {"aws", PRICE_MULTIPART, "0.005", 1000, ""},
    {"aws", PRICE_EGRESS, "0.09", GB, "GB"},
    {"aws", PRICE_INGRESS, "0", 1, ""},

    {"r2", PRICE_GET, "0.36", 1000000, ""},
    {"r2", PRICE_HEAD, "0.36", 1000000, ""},
    {"r2", PRICE_LIST, "4.5", 1000000, ""},
    {"r2", PRICE_PUT, "4.5", 1000000, ""},
    {"r2", PRICE_DELETE, "0", 1, ""},
    {"r2", PRICE_COPY, "4.5", 1000000, ""},
    {"r2", PRICE_MULTIPART, "4.5", 1000000, ""},
    {"r2", PRICE_EGRESS, "0", 1, ""},
    {"r2", PRICE_INGRESS, "0", 1, ""},

    {"b2", PRICE_GET, "0.004", 10000, ""},
    {"b2", PRICE_HEAD, "0.004", 10000, ""},
    {"b2", PRICE_LIST, "0.004", 1000, ""},
    {"b2", PRICE_PUT, "0", 1, ""},
    {"b2", PRICE_DELETE, "0", 1, ""},
    {"b2", PRICE_COPY, "0.004", 1000, ""},
    {"b2", PRICE_MULTIPART, "0", 1, ""},
    {"b2", PRICE_EGRESS, "0.01", GB, "GB"},
    {"b2", PRICE_INGRESS, "0", 1, ""},

    {"gcs", PRICE_GET, "0.0004", 1000, ""},
    {"gcs", PRICE_HEAD, "0.0004", 1000, ""},
    {"gcs", PRICE_LIST, "0.005", 1000, ""},
    {"gcs", PRICE_PUT, "0.005", 1000, ""},
    {"gcs", PRICE_DELETE, "0", 1, ""},
    {"gcs", PRICE_COPY, "0.005", 1000, ""},
    {"gcs", PRICE_MULTIPART, "0.005", 1000, ""},
    {"gcs", PRICE_EGRESS, "0.12", GB, "GB"},
    {"gcs", PRICE_INGRESS, "0", 1, ""},
};

static void test_every_preset_item(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(preset_rows); i++) {
        struct price_table table;
        char amount[40];
        assert_int_equal(prices_preset(preset_rows[i].preset, &table), 0);
        const struct price *price = &table.items[preset_rows[i].item];
        prices_format_amount(price, amount, sizeof(amount));
        if (strcmp(amount, preset_rows[i].amount) != 0 ||
            price->per != preset_rows[i].per ||
            strcmp(price->unit, preset_rows[i].unit) != 0)
            fail_msg("%s %s: %s per %llu %s, expected %s per %llu %s",
                     preset_rows[i].preset, prices_item_name(preset_rows[i].item),
                     amount, (unsigned long long)price->per, price->unit,
                     preset_rows[i].amount,
                     (unsigned long long)preset_rows[i].per, preset_rows[i].unit);
    }
}

static void test_presets_say_where_and_when(void **state)
{
    const char *names[] = {"aws", "r2", "b2", "gcs"};
    (void)state;
    /* every name prices_preset_names() lists exists, with its provenance */
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        struct price_table table;
        assert_int_equal(prices_preset(names[i], &table), 0);
        assert_non_null(strstr(prices_preset_names(), names[i]));
        assert_string_equal(table.name, names[i]);
        assert_string_equal(table.currency, "USD");
        assert_string_equal(table.read_on, "2026-12-02");
        assert_true(strncmp(table.source, "https://", 8) == 0);
        assert_true(strlen(table.title) > 10);
        /* every preset prices each row of preset_rows: none was left out */
        size_t rows = 0;
        for (size_t r = 0; r < ARRAY_LEN(preset_rows); r++)
            rows += strcmp(preset_rows[r].preset, names[i]) == 0;
        assert_int_equal(rows, PRICE_ITEM_COUNT);
    }
    struct price_table table;
    assert_int_equal(prices_preset("azure", &table), ENOENT);
    assert_int_equal(prices_preset("AWS", &table), ENOENT);
    assert_int_equal(prices_preset("", &table), ENOENT);
}

/* ----------------------------------------------------------- file format */

static void parse_ok(const char *text, struct price_table *table)
{
    char err[256] = "";
    int result = prices_parse(text, strlen(text), "/etc/s3cachefs/mine.prices",
                              table, err, sizeof(err));
    if (result != 0)
        fail_msg("parse failed: %s", err);
}

static void test_file_every_item_and_unit(void **state)
{
    struct price_table table;
    char text[64];
    (void)state;
    parse_ok("# my provider\n"
             "name  Mine, eu-west  \n"
             "currency EUR\n"
             "get 1 per 1\n"
             "head 0.000000000001 per 1000000000000\n"
             "list 1000000 per 7\n"
             "put 0.5 per 1000 # a comment after an item\n"
             "delete free\n"
             "copy 0 per 1000\n"
             "\tmultipart   2.25\tper 10\n"
             "egress 0.02 per GiB\r\n"
             "ingress 3 per TiB\n"
             "\n   \n# the end\n", &table);
    assert_string_equal(table.name, "mine.prices");
    assert_string_equal(table.title, "Mine, eu-west");
    assert_string_equal(table.currency, "EUR");
    assert_string_equal(table.read_on, "");
    assert_int_equal(table.items[PRICE_GET].amount_pico, 1000000000000ull);
    assert_int_equal(table.items[PRICE_GET].per, 1);
    assert_int_equal(table.items[PRICE_HEAD].amount_pico, 1);
    assert_int_equal(table.items[PRICE_HEAD].per, 1000000000000ull);
    assert_int_equal(table.items[PRICE_LIST].amount_pico,
                     1000000ull * 1000000000000ull);
    assert_int_equal(table.items[PRICE_LIST].per, 7);
    assert_int_equal(table.items[PRICE_PUT].amount_pico, 500000000000ull);
    assert_true(prices_is_free(&table.items[PRICE_DELETE]));
    assert_true(prices_is_free(&table.items[PRICE_COPY]));
    assert_int_equal(table.items[PRICE_MULTIPART].amount_pico, 2250000000000ull);
    assert_int_equal(table.items[PRICE_MULTIPART].per, 10);
    assert_int_equal(table.items[PRICE_EGRESS].per, 1ull << 30);
    assert_string_equal(table.items[PRICE_EGRESS].unit, "GiB");
    assert_int_equal(table.items[PRICE_INGRESS].per, 1ull << 40);
    assert_string_equal(table.items[PRICE_INGRESS].unit, "TiB");

    parse_ok("egress 1 per GB\ningress 1 per TB\n", &table);
    assert_int_equal(table.items[PRICE_EGRESS].per, GB);
    assert_int_equal(table.items[PRICE_INGRESS].per, 1000 * GB);

    prices_format_price(&table, &table.items[PRICE_EGRESS], text, sizeof(text));
    assert_string_equal(text, "1 USD per GB");
}

static void test_file_defaults(void **state)
{
    struct price_table table;
    (void)state;
    /* nothing listed: everything free, USD, named after the file */
    parse_ok("", &table);
    assert_string_equal(table.currency, "USD");
    assert_string_equal(table.title, "mine.prices");
    for (int item = 0; item < PRICE_ITEM_COUNT; item++)
        assert_true(prices_is_free(&table.items[item]));
    /* no newline at the end; a file name without a directory */
    char err[128];
    const char *text = "get 0.4 per 1000";
    assert_int_equal(prices_parse(text, strlen(text), "p", &table, err,
                                  sizeof(err)), 0);
    assert_string_equal(table.name, "p");
    assert_int_equal(table.items[PRICE_GET].amount_pico, 400000000000ull);
    /* LEN bounds the text: what follows is not read */
    assert_int_equal(prices_parse("get 1 per 1\nbogus", 11, "p", &table, err,
                                  sizeof(err)), 0);
}

/* Bad files: the whole message, file and line number included. */
static const struct {
    const char *text;
    const char *message;
} bad_rows[] = {
    {"gets 1 per 1000\n",
     "p.txt:1: unknown item 'gets': expected name, currency, get, head, list, "
     "put, delete, copy, multipart, egress or ingress"},
    {"# ok\n\nget 1 per 1000\nget 2 per 1000\n",
     "p.txt:4: 'get' is given twice (first on line 3)"},
    {"get\n", "p.txt:1: 'get' needs a price, such as 'get 0.0004 per 1000', or 'free'"},
    {"egress\n", "p.txt:1: 'egress' needs a price, such as 'egress 0.09 per GB', or 'free'"},
    {"get abc per 1000\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got 'abc'"},
    {"get -1 per 1000\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got '-1'"},
    {"get 1e-4 per 1000\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got '1e-4'"},
    {"get .5 per 1000\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got '.5'"},
    {"get 5. per 1000\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got '5.'"},
    {"get 0.0000000000001 per 1\n",
     "p.txt:1: 'get': expected a price such as 0.0004 (a decimal of at most 12 "
     "places, at most 1000000), got '0.0000000000001'"},
    {"egress 1000000.000000000001 per GB\n",
     "p.txt:1: 'egress': expected a price such as 0.09 (a decimal of at most 12 "
     "places, at most 1000000), got '1000000.000000000001'"},
    {"get 0.0004\n",
     "p.txt:1: 'get 0.0004': expected 'per' and a number of requests, such as "
     "'get 0.0004 per 1000'"},
    {"get 0.0004 for 1000\n",
     "p.txt:1: 'get 0.0004': expected 'per' and a number of requests, such as "
     "'get 0.0004 per 1000'"},
    {"egress 0.09 per\n",
     "p.txt:1: 'egress 0.09': expected 'per' and a unit (GB, GiB, TB or TiB), "
     "such as 'egress 0.09 per GB'"},
    {"get 0.0004 per 0\n",
     "p.txt:1: 'get': expected a number of requests from 1 to 1000000000000 "
     "after 'per' (digits only, such as 1000), got '0'"},
    {"get 0.0004 per 1,000\n",
     "p.txt:1: 'get': expected a number of requests from 1 to 1000000000000 "
     "after 'per' (digits only, such as 1000), got '1,000'"},
    {"get 0.0004 per 1000000000001\n",
     "p.txt:1: 'get': expected a number of requests from 1 to 1000000000000 "
     "after 'per' (digits only, such as 1000), got '1000000000001'"},
    {"egress 0.09 per gb\n",
     "p.txt:1: 'egress': expected a unit of GB, GiB, TB or TiB after 'per', got 'gb'"},
    {"egress 0.09 per 1000\n",
     "p.txt:1: 'egress': expected a unit of GB, GiB, TB or TiB after 'per', got '1000'"},
    {"get 0.0004 per 1000 requests\n",
     "p.txt:1: unexpected 'requests' after 'get 0.0004 per 1000'"},
    {"delete free of charge\n", "p.txt:1: unexpected 'of' after 'delete free'"},
    {"currency usd\n",
     "p.txt:1: 'currency': expected a three-letter code such as USD, got 'usd'"},
    {"currency US$\n",
     "p.txt:1: 'currency': expected a three-letter code such as USD, got 'US$'"},
    {"currency USD EUR\n", "p.txt:1: unexpected 'EUR' after the currency"},
    {"name\n", "p.txt:1: 'name' needs a label, such as 'name My provider'"},
    {"name a\nname b\n", "p.txt:2: 'name' is given twice (first on line 1)"},
};

static void test_file_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad_rows); i++) {
        struct price_table table;
        char err[512] = "";
        int result = prices_parse(bad_rows[i].text, strlen(bad_rows[i].text),
                                  "/tmp/p.txt", &table, err, sizeof(err));
        /* the origin is given whole; the rows name it by its last part */
        if (result != EINVAL || strncmp(err, "/tmp/", 5) != 0 ||
            strcmp(err + 5, bad_rows[i].message) != 0)
            fail_msg("row %zu: %d '%s'\n  expected '/tmp/%s'", i, result, err,
                     bad_rows[i].message);
    }
}

static void test_file_binary_and_long_lines(void **state)
{
    struct price_table table;
    char err[256], text[1200];
    (void)state;
    assert_int_equal(prices_parse("get 1 per 1\n\0x", 14, "f", &table, err,
                                  sizeof(err)), EINVAL);
    assert_string_equal(err, "f:2: a NUL byte: not a text file");
    memset(text, 'x', sizeof(text));
    memcpy(text, "name ", 5);
    assert_int_equal(prices_parse(text, sizeof(text), "f", &table, err,
                                  sizeof(err)), EINVAL);
    assert_string_equal(err, "f:1: the line is longer than 511 characters");
    /* a long comment is fine */
    text[0] = '#';
    assert_int_equal(prices_parse(text, sizeof(text), "f", &table, err,
                                  sizeof(err)), 0);
    /* a name just too long for the table */
    snprintf(text, sizeof(text), "name %0128d\n", 0);
    assert_int_equal(prices_parse(text, strlen(text), "f", &table, err,
                                  sizeof(err)), EINVAL);
    assert_string_equal(err, "f:1: the name is longer than 127 characters");
    /* ERR may be NULL */
    assert_int_equal(prices_parse("x", 1, "f", &table, NULL, 0), EINVAL);
}

/* ------------------------------------------------------------ arithmetic */

static const struct {
    const char *price;      /* a line of the format */
    uint64_t quantity;
    uint64_t nanos;
} cost_rows[] = {
    {"get 0.0004 per 1000", 0, 0},
    {"get 0.0004 per 1000", 1, 400},             /* 4e-7 USD a request */
    {"get 0.0004 per 1000", 519, 207600},
    {"get 0.0004 per 1000", 1000, 400000},
    {"get 0.000000001 per 2", 1, 1},             /* 0.5 nano: half up */
    {"get 0.000000001 per 2", 3, 2},             /* 1.5: half up */
    {"get 0.000000001 per 2", 2, 1},
    {"get 0.000000001 per 3", 1, 0},             /* 0.33: down */
    {"get 0.000000001 per 3", 2, 1},             /* 0.67: up */
    {"get 0.36 per 1000000", 7, 2520},
    {"get 0.004 per 10000", 12345, 4938000},
    {"list 4.50 per 1000000", 1000001, 4500004500ull},
    {"put 0.005 per 1000", 10000000000ull, 50000000000000ull},
    {"egress 0.09 per GB", 4294967296ull, 386547057}, /* 386547056.64 */
    {"egress 0.09 per GB", 5, 0},                /* 0.45 */
    {"egress 0.09 per GB", 6, 1},                /* 0.54 */
    {"egress 0.1 per GB", 5, 1},                 /* 0.5: half up */
    {"egress 0.1 per GB", 4, 0},
    {"egress 0.09 per GiB", 4294967296ull, 360000000},
    {"egress 0.12 per GB", 1, 0},                /* 0.12 nano */
    {"egress 0.01 per GB", 999999999999ull, 10000000000ull}, /* ...999.99 */
    {"ingress 1 per TiB", 1ull << 40, 1000000000},
    /* the largest price times a count whose product needs 128 bits */
    {"get 1000000 per 1", 18446, 18446000000000000000ull},
    {"delete free", UINT64_MAX, 0},
};

static void test_costs(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cost_rows); i++) {
        struct price_table table;
        char item[16];
        uint64_t nanos = 12345;
        parse_ok(cost_rows[i].price, &table);
        sscanf(cost_rows[i].price, "%15s", item);
        int which = -1;
        for (int k = 0; k < PRICE_ITEM_COUNT; k++)
            if (strcmp(prices_item_name((enum price_item)k), item) == 0)
                which = k;
        assert_true(which >= 0);
        assert_int_equal(prices_cost(&table.items[which], cost_rows[i].quantity,
                                     &nanos), 0);
        if (nanos != cost_rows[i].nanos)
            fail_msg("row %zu (%s x %llu): %llu nanos, expected %llu", i,
                     cost_rows[i].price, (unsigned long long)cost_rows[i].quantity,
                     (unsigned long long)nanos,
                     (unsigned long long)cost_rows[i].nanos);
    }
}

static void test_cost_overflow(void **state)
{
    struct price_table table;
    uint64_t nanos = 0;
    (void)state;
    parse_ok("get 1000000 per 1", &table);
    /* 18447 x 10^15 nanos > 2^64 */
    assert_int_equal(prices_cost(&table.items[PRICE_GET], 18447, &nanos),
                     ERANGE);
    assert_int_equal(nanos, UINT64_MAX);
    assert_int_equal(prices_cost(&table.items[PRICE_GET], UINT64_MAX, &nanos),
                     ERANGE);
}

/* ------------------------------------------------------------ formatting */

static const struct {
    uint64_t nanos;
    unsigned decimals;
    bool grouped;
    const char *text;
} money_rows[] = {
    {0, 6, true, "0.000000"},
    {208, 9, false, "0.000000208"},
    {208, 6, true, "0.000000"},
    {500, 6, true, "0.000001"},          /* half up */
    {499, 6, true, "0.000000"},
    {386547057, 6, true, "0.386547"},
    {386547057, 2, true, "0.39"},
    {1234567890123ull, 6, true, "1,234.567890"},
    {1234567890123ull, 6, false, "1234.567890"},
    {999999999500ull, 6, true, "1,000.000000"}, /* carry into the units */
    {999999999999ull, 2, true, "1,000.00"},
    {1500000000, 0, true, "2"},
    {UINT64_MAX, 9, true, "18,446,744,073.709551615"},
    {UINT64_MAX, 0, false, "18446744074"},
    {5, 12, false, "0.000000005"},        /* more than 9 decimals: 9 */
};

static void test_money(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(money_rows); i++) {
        char text[40];
        prices_format_money(money_rows[i].nanos, money_rows[i].decimals,
                            money_rows[i].grouped, text, sizeof(text));
        if (strcmp(text, money_rows[i].text) != 0)
            fail_msg("row %zu: '%s', expected '%s'", i, text, money_rows[i].text);
    }
    char small[6];
    prices_format_money(1234567890123ull, 6, true, small, sizeof(small));
    assert_string_equal(small, "1,234");
}

static void test_prices_written(void **state)
{
    struct price_table table;
    char text[64];
    (void)state;
    assert_int_equal(prices_preset("aws", &table), 0);
    prices_format_price(&table, &table.items[PRICE_GET], text, sizeof(text));
    assert_string_equal(text, "0.0004 USD per 1,000");
    prices_format_price(&table, &table.items[PRICE_EGRESS], text, sizeof(text));
    assert_string_equal(text, "0.09 USD per GB");
    prices_format_price(&table, &table.items[PRICE_DELETE], text, sizeof(text));
    assert_string_equal(text, "free");
    assert_int_equal(prices_preset("r2", &table), 0);
    prices_format_price(&table, &table.items[PRICE_LIST], text, sizeof(text));
    assert_string_equal(text, "4.5 USD per 1,000,000");
    parse_ok("currency EUR\nget 1.000000000001 per 1\n", &table);
    prices_format_price(&table, &table.items[PRICE_GET], text, sizeof(text));
    assert_string_equal(text, "1.000000000001 EUR per request");
    assert_string_equal(prices_item_name(PRICE_MULTIPART), "multipart");
    assert_string_equal(prices_item_name(PRICE_ITEM_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_preset_item),
        cmocka_unit_test(test_presets_say_where_and_when),
        cmocka_unit_test(test_file_every_item_and_unit),
        cmocka_unit_test(test_file_defaults),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_file_binary_and_long_lines),
        cmocka_unit_test(test_costs),
        cmocka_unit_test(test_cost_overflow),
        cmocka_unit_test(test_money),
        cmocka_unit_test(test_prices_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
