/*
 * test_warm.c - the pure text of `s3cachefs warm`: the daemon's answers
 * (warm_text.c: formatted, parsed back, refused when broken) and what the
 * command reads and prints (warm_report.c: --from lines, sizes,
 * durations, percentages, the progress line, the summary, JSON strings).
 * Table-driven where there are cases to list.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>

#include "cmd/warm_report.h"
#include "ctl/warm_text.h"

/* ------------------------------------------------------------ warmfmt */

static void test_answer_round_trip(void **state)
{
    (void)state;
    const struct warm_text_answer cases[] = {
        {.status = WARM_TEXT_DONE, .size = 5ull << 40, .before = 1, .fetched = 2,
         .cached = 3, .freed = 0, .pinned = true},
        {.status = WARM_TEXT_FAILED, .error = EIO, .size = 7},
        {.status = WARM_TEXT_INTERRUPTED, .size = UINT64_MAX, .cached = UINT64_MAX},
        {.status = WARM_TEXT_STAGED},
        {.status = WARM_TEXT_FULL, .size = 1, .pin_used = 1ull << 30,
         .pin_max = 2ull << 30},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[WARM_TEXT_VALUE_MAX];
        size_t len = 0;
        struct warm_text_answer back;
        assert_int_equal(warm_text_format(&cases[i], text, sizeof(text), &len), 0);
        assert_int_equal(len, strlen(text));
        assert_int_equal(warm_text_parse(text, len, &back), 0);
        assert_memory_equal(&back, &cases[i], sizeof(back));
    }
}

static void test_answer_text_is_as_documented(void **state)
{
    (void)state;
    struct warm_text_answer answer = {.status = WARM_TEXT_DONE, .size = 10,
                                    .fetched = 10, .cached = 10};
    char text[WARM_TEXT_VALUE_MAX];
    size_t len = 0;

    assert_int_equal(warm_text_format(&answer, text, sizeof(text), &len), 0);
    assert_string_equal(text, "s3cachefs-warm 1\nstatus done\nerror 0\nsize 10\n"
"before 0\nfetched 10\ncached 10\nfreed 0\npinned 0\n"
                              "pin_used 0\npin_max 0\n");
    /* too small a buffer says so */
    assert_int_equal(warm_text_format(&answer, text, 20, &len), ERANGE);
    assert_int_equal(len, 0);
}

static void test_answer_parse_cases(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int err;
        uint64_t size;
    } cases[] = {
        {"s3cachefs-warm 1\nstatus done\nsize 5\ncached 5\n", 0, 5},
        /* no final newline, names in another order, unknown names */
        {"s3cachefs-warm 1\ncached 5\nsize 6\nfuture 12 x\nstatus staged", 0, 6},
        {"s3cachefs-warm 2\nstatus done\nsize 5\ncached 5\n", EPROTONOSUPPORT, 0},
        {"s3cachefs-warm x\nstatus done\nsize 5\ncached 5\n", EINVAL, 0},
        {"s3cachefs-sync 1\nstatus done\nsize 5\ncached 5\n", EINVAL, 0},
        {"", EINVAL, 0},
        {"s3cachefs-warm 1\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsize 5\n", EINVAL, 0},         /* cached */
        {"s3cachefs-warm 1\nstatus done\ncached 5\n", EINVAL, 0},       /* size */
        {"s3cachefs-warm 1\nsize 5\ncached 5\n", EINVAL, 0},            /* status */
        {"s3cachefs-warm 1\nstatus maybe\nsize 5\ncached 5\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsize -5\ncached 5\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsize 5x\ncached 5\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsize 18446744073709551616\ncached 5\n",
         EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsize \ncached 5\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nsizeless\ncached 5\n", EINVAL, 0},
        {"s3cachefs-warm 1\nstatus done\nerror 70000\nsize 1\ncached 5\n",
         EINVAL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct warm_text_answer answer;
        int err = warm_text_parse(cases[i].text, strlen(cases[i].text), &answer);
        if (err != cases[i].err)
            fail_msg("case %zu: %d, not %d", i, err, cases[i].err);
        if (err == 0)
            assert_int_equal(answer.size, cases[i].size);
    }
    /* the length is what counts, not a NUL */
    const char text[] = "s3cachefs-warm 1\nstatus done\nsize 5\ncached 5\nsize 9";
    struct warm_text_answer answer;
    assert_int_equal(warm_text_parse(text, strlen(text) - 7, &answer), 0);
    assert_int_equal(answer.size, 5);
}

/* ------------------------------------------------------------ report */

static void test_list_lines(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        const char *path;       /* NULL: skipped */
    } cases[] = {
        {"data/a.bin\n", "data/a.bin"},
        {"data/a.bin\r\n", "data/a.bin"},
        {"  /data/with space.bin  \n", "/data/with space.bin"},
        {"\n", NULL},
        {"   \t \n", NULL},
        {"", NULL},
        {"# a comment\n", NULL},
        {"   # an indented comment\n", NULL},
        {"not#a comment\n", "not#a comment"},
        {"no-newline", "no-newline"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char line[128];
        snprintf(line, sizeof(line), "%s", cases[i].line);
        const char *path = warm_report_list_line(line);
        if (cases[i].path == NULL)
            assert_null(path);
        else
            assert_string_equal(path, cases[i].path);
    }
}

static void test_sizes_durations_percents(void **state)
{
    (void)state;
    static const struct {
        uint64_t bytes;
        const char *text;
    } sizes[] = {
        {0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
        {10 * 1024 - 1, "10 KiB"}, {1ull << 20, "1.0 MiB"},
        {(1ull << 30) * 3 / 2, "1.5 GiB"}, {1ull << 40, "1.0 TiB"},
        {UINT64_MAX, "16384 PiB"},
    };
    char text[32];
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        warm_report_format_bytes(sizes[i].bytes, text, sizeof(text));
        assert_string_equal(text, sizes[i].text);
    }
    static const struct {
        double seconds;
        const char *text;
    } durations[] = {
        {0, "0:00"}, {-3, "0:00"}, {59.9, "0:59"}, {61, "1:01"},
        {3599, "59:59"}, {3600, "1:00:00"}, {90061, "25:01:01"},
    };
    for (size_t i = 0; i < sizeof(durations) / sizeof(durations[0]); i++) {
        warm_report_format_duration(durations[i].seconds, text, sizeof(text));
        assert_string_equal(text, durations[i].text);
    }
    assert_int_equal(warm_report_percent(0, 10), 0);
    assert_int_equal(warm_report_percent(9, 10), 90);
    assert_int_equal(warm_report_percent(999, 1000), 99);   /* never 100 early */
    assert_int_equal(warm_report_percent(10, 10), 100);
    assert_int_equal(warm_report_percent(0, 0), 100);
    assert_int_equal(warm_report_percent(UINT64_MAX / 2, UINT64_MAX), 49);
}

static void test_summary_lines(void **state)
{
    (void)state;
    struct warm_totals totals = {
        .files = 12, .done = 12, .bytes = 4ull << 30, .before = 1ull << 30,
        .fetched = 3ull << 30, .cached = 4ull << 30,
    };
    char line[512];

    warm_report_summary_line(WARM_MODE_FETCH, &totals, 12.0, false, line, sizeof(line));
    assert_string_equal(line, "warm: 12 files, 4.0 GiB: 3.0 GiB fetched, 1.0 GiB "
                              "already cached, 12.0 s, 256 MiB/s, 0 failed");
    totals.failed = 2;
    totals.staged = 1;
    warm_report_summary_line(WARM_MODE_FETCH, &totals, 0, true, line, sizeof(line));
    assert_string_equal(line, "warm: 12 files, 4.0 GiB: 3.0 GiB fetched, 1.0 GiB "
                              "already cached, 0.0 s, 0 B/s, 2 failed, 1 staged "
                              "(not uploaded yet: left alone), interrupted");
    totals = (struct warm_totals){.files = 1, .bytes = 4096, .cached = 1024};
    warm_report_summary_line(WARM_MODE_CHECK, &totals, 1, false, line, sizeof(line));
    assert_string_equal(line, "check: 1 file, 4.0 KiB, 1.0 KiB cached (25%), "
                              "0 failed");
    totals.freed = 4096;
    warm_report_summary_line(WARM_MODE_EVICT, &totals, 1, false, line, sizeof(line));
    assert_string_equal(line, "evict: 1 file, 4.0 KiB freed, 0 failed");
    warm_report_summary_line(WARM_MODE_PIN, &totals, 1, false, line, sizeof(line));
    assert_true(strncmp(line, "pin: 1 file pinned, 4.0 KiB: ", 29) == 0);
    warm_report_summary_line(WARM_MODE_UNPIN, &totals, 1, false, line, sizeof(line));
    assert_string_equal(line, "unpin: 1 file unpinned, 4.0 KiB, 0 failed");
    totals.pin_used = 3ull << 30;
    totals.pin_max = 40ull << 30;
    warm_report_summary_line(WARM_MODE_UNPIN, &totals, 1, false, line, sizeof(line));
    assert_string_equal(line, "unpin: 1 file unpinned, 4.0 KiB, 0 failed; "
                              "pinned now: 3.0 GiB of 40 GiB allowed");
    warm_report_summary_line(WARM_MODE_EVICT, &totals, 1, false, line, sizeof(line));
    assert_string_equal(line, "evict: 1 file, 4.0 KiB freed, 0 failed");
    /* a short buffer cuts, never overflows */
    char tiny[8];
    warm_report_summary_line(WARM_MODE_FETCH, &totals, 1, true, tiny, sizeof(tiny));
    assert_int_equal(strlen(tiny), 7);
}

static void test_progress_line(void **state)
{
    (void)state;
    struct warm_totals totals = {.files = 4, .done = 1, .bytes = 4ull << 20,
                                 .bytes_done = 1ull << 20};
    char line[256];

    warm_report_progress_line(WARM_MODE_FETCH, &totals, 2.0, 200, line, sizeof(line));
    assert_string_equal(line, "warm  [#####               ] 1/4 files  "
                              "1.0 MiB/4.0 MiB  512 KiB/s  ETA 0:06");
    /* no rate or ETA before anything was done */
    totals.bytes_done = 0;
    warm_report_progress_line(WARM_MODE_PIN, &totals, 0.1, 200, line, sizeof(line));
    assert_string_equal(line, "pin   [                    ] 1/4 files  "
                              "0 B/4.0 MiB");
    totals.failed = 1;
    warm_report_progress_line(WARM_MODE_FETCH, &totals, 0.1, 30, line, sizeof(line));
    assert_int_equal(strlen(line), 30);          /* cut to the width */
}

static void test_json_strings(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"plain", "\"plain\""},
        {"q\"b\\", "\"q\\\"b\\\\\""},
        {"tab\tnl\n", "\"tab\\u0009nl\\u000a\""},
        {"caf\xc3\xa9", "\"caf\xc3\xa9\""},
        {"bad\xff", "\"bad\\ufffd\""},
        {"cut\xe2\x82", "\"cut\\ufffd\\ufffd\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);
        assert_non_null(out);
        warm_report_json_string(out, cases[i].in);
        fclose(out);
        assert_string_equal(text, cases[i].out);
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_round_trip),
        cmocka_unit_test(test_answer_text_is_as_documented),
        cmocka_unit_test(test_answer_parse_cases),
        cmocka_unit_test(test_list_lines),
        cmocka_unit_test(test_sizes_durations_percents),
        cmocka_unit_test(test_summary_lines),
        cmocka_unit_test(test_progress_line),
        cmocka_unit_test(test_json_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
