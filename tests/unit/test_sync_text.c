/*
 * test_sync_text.c - the text of the answers to `sync` and `pending`
 * (sync_text.c) on its own: paths escaped and back (a table of names with
 * every byte that must not reach a line raw), lines joined within a cap,
 * split at tabs, summary values found by whole name.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>

#include "ctl/sync_text.h"

static void test_escape_round_trip(void **state)
{
    static const struct {
        const char *path, *escaped;
    } rows[] = {
        {"plain/name.bin", "plain/name.bin"},
        {"with space and %", "with space and %"},
        {"tab\there", "tab\\there"},
        {"new\nline", "new\\nline"},
        {"back\\slash", "back\\\\slash"},
        {"bell\a\x1f\x7f", "bell\\007\\037\\177"},
        {"\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9"}, /* UTF-8 passes */
        {"", ""},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char *escaped = sync_text_escape(rows[i].path);
        assert_non_null(escaped);
        assert_string_equal(escaped, rows[i].escaped);
        assert_null(strchr(escaped, '\t'));
        assert_null(strchr(escaped, '\n'));
        assert_int_equal(sync_text_unescape(escaped), 0);
        assert_string_equal(escaped, rows[i].path);
        free(escaped);
    }
    static const char *const bad[] = {"end\\", "\\x41", "\\000", "\\400", "\\7"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *copy = strdup(bad[i]);
        assert_int_equal(sync_text_unescape(copy), EINVAL);
        free(copy);
    }
}

static void test_join_within_cap(void **state)
{
    char *lines[] = {"file\ta\n", "file\tbb\n", "file\tccc\n"};
    const char *head = "h 1\nsummary files=3\n";
    size_t head_len = strlen(head), len = 0, listed = 0;
    char *out = NULL;

    (void)state;
    assert_int_equal(sync_text_join(head, lines, 3, 1000, &out, &len, &listed), 0);
    assert_string_equal(out, "h 1\nsummary files=3\nfile\ta\nfile\tbb\nfile\tccc\n");
    assert_int_equal(len, strlen(out));
    assert_int_equal(listed, 3);
    free(out);
    /* exactly the first two: the third is not cut */
    size_t cap = head_len + strlen(lines[0]) + strlen(lines[1]);
    assert_int_equal(sync_text_join(head, lines, 3, cap + 2, &out, &len, &listed), 0);
    assert_int_equal(len, cap);
    assert_int_equal(listed, 2);
    free(out);
    assert_int_equal(sync_text_join(head, lines, 3, head_len, &out, &len, &listed), 0);
    assert_string_equal(out, head);
    assert_int_equal(listed, 0);
    free(out);
    assert_int_equal(sync_text_join(head, lines, 3, head_len - 1, &out, &len, NULL),
                     ERANGE);
    assert_null(out);
}

static void test_split_and_summary(void **state)
{
    char line[] = "failed\t10240\t13\t2\tdir/a\\tb";
    char *fields[SYNC_TEXT_FIELDS_MAX];
    double value = 0;

    (void)state;
    assert_int_equal(sync_text_split(line, fields, SYNC_TEXT_FIELDS_MAX), 5);
    assert_string_equal(fields[0], "failed");
    assert_string_equal(fields[4], "dir/a\\tb");
    char two[] = "a\tb\tc";
    assert_int_equal(sync_text_split(two, fields, 2), 2);
    assert_string_equal(fields[1], "b\tc"); /* the last keeps the rest */

    const char *summary = "summary files=3 bytes=1073741824 seconds=8.25 "
                          "not_closed=1 failed=0";
    assert_true(sync_text_summary_get(summary, "files", &value));
    assert_true(value == 3);
    assert_true(sync_text_summary_get(summary, "bytes", &value));
    assert_true(value == 1073741824.0);
    assert_true(sync_text_summary_get(summary, "seconds", &value));
    assert_true(value == 8.25);
    assert_true(sync_text_summary_get(summary, "closed", &value) == false);
    assert_true(sync_text_summary_get(summary, "not_closed", &value));
    assert_true(value == 1);
    assert_false(sync_text_summary_get(summary, "waiting", &value));
    assert_false(sync_text_summary_get("summary files=x", "files", &value));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_round_trip),
        cmocka_unit_test(test_join_within_cap),
        cmocka_unit_test(test_split_and_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
