/*
 * test_names.c - unit tests for names.c: which byte strings can be file
 * names (every listing carries them back unchanged: strict UTF-8 of
 * XML 1.0 characters, no CR), how a key from a delimiter listing of a
 * directory prefix is
 * classified (file, directory, the directory's own marker, invalid), and
 * how a child's key is built, at the bucket root ("") and below.
 *
 * Long names are built at run time: a row gives a unit string and a repeat
 * count instead of spelling out 255 bytes.
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

#include "fs/names.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* "\xe6\x97\xa5" is U+65E5, three bytes of UTF-8. */
#define CJK "\xe6\x97\xa5"

/* A malloc'd string: HEAD, then UNIT REPEAT times, then TAIL. */
static char *build(const char *head, const char *unit, size_t repeat,
                   const char *tail)
{
    size_t hl = strlen(head), ul = unit ? strlen(unit) : 0, tl = strlen(tail);
    char *s = malloc(hl + ul * repeat + tl + 1);
    char *p = s;

    assert_non_null(s);
    memcpy(p, head, hl);
    p += hl;
    for (size_t i = 0; i < repeat; i++, p += ul)
        memcpy(p, unit, ul);
    memcpy(p, tail, tl + 1);
    return s;
}

static const char *kind_name(enum names_entry_kind kind)
{
    switch (kind) {
    case NAMES_ENTRY_FILE: return "FILE";
    case NAMES_ENTRY_DIR: return "DIR";
    case NAMES_ENTRY_SELF: return "SELF";
    case NAMES_ENTRY_INVALID: return "INVALID";
    }
    return "?";
}

/* ---------------------------------------------------- names_is_valid */

struct valid_case {
    const char *name;
    const char *text;     /* or the unit when repeat > 0 */
    size_t len;           /* bytes of text; ignored when repeat > 0 */
    size_t repeat;
    bool valid;
};

static const struct valid_case valid_cases[] = {
    {"empty", "", 0, 0, false},
    {"empty length of a non-empty string", "abc", 0, 0, false},
    {"dot", ".", 1, 0, false},
    {"dot dot", "..", 2, 0, false},
    {"three dots", "...", 3, 0, true},
    {"hidden file", ".profile", 8, 0, true},
    {"dot dot prefix", "..a", 3, 0, true},
    {"dot a", ".a", 2, 0, true},
    {"plain", "file.txt", 8, 0, true},
    {"one byte", "a", 1, 0, true},
    {"space", " ", 1, 0, true},
    {"embedded slash", "a/b", 3, 0, false},
    {"leading slash", "/a", 2, 0, false},
    {"trailing slash", "a/", 2, 0, false},
    {"lone slash", "/", 1, 0, false},
    {"embedded NUL", "a\0b", 3, 0, false},
    {"length shorter than the string", "abc/def", 3, 0, true},
    {"length cuts to dot dot", "..x", 2, 0, false},
    {"length cuts to dot", ".x", 1, 0, false},
    {"UTF-8", "caf\xc3\xa9", 5, 0, true},
    {"UTF-8 CJK", CJK CJK, 6, 0, true},
    {"tab and newline (XML carries them)", "a\tb\nc", 5, 0, true},

    /* What a listing carries back unchanged: strict UTF-8 of XML 1.0
     * characters (#x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] |
     * [#x10000-#x10FFFF]), CR left out (XML reads a raw CR as LF). */
    {"4-byte UTF-8 (U+1F600)", "\xf0\x9f\x98\x80", 4, 0, true},
    {"last code point U+10FFFF", "\xf4\x8f\xbf\xbf", 4, 0, true},
    {"U+D7FF, below the surrogates", "\xed\x9f\xbf", 3, 0, true},
    {"U+E000, above the surrogates", "\xee\x80\x80", 3, 0, true},
    {"U+FFFD", "\xef\xbf\xbd", 3, 0, true},
    {"U+FDD0, a non-character XML allows", "\xef\xb7\x90", 3, 0, true},
    {"DEL", "a\x7f" "b", 3, 0, true},
    {"C1 control U+0085", "a\xc2\x85" "b", 4, 0, true},
    {"U+0001", "a\x01" "b", 3, 0, false},
    {"U+0008", "\x08", 1, 0, false},
    {"vertical tab", "a\vb", 3, 0, false},
    {"form feed", "a\fb", 3, 0, false},
    {"carriage return", "a\rb", 3, 0, false},
    {"escape", "\x1b[0m", 4, 0, false},
    {"U+001F", "a\x1f", 2, 0, false},
    {"0xFF", "a\xff" "b", 3, 0, false},
    {"0xFE", "\xfe", 1, 0, false},
    {"lone continuation byte", "a\x80", 2, 0, false},
    {"overlong '/' (2 bytes)", "a\xc0\xaf", 3, 0, false},
    {"overlong 'A' (C1 81)", "\xc1\x81", 2, 0, false},
    {"overlong '/' (3 bytes)", "\xe0\x80\xaf", 3, 0, false},
    {"overlong '/' (4 bytes)", "\xf0\x80\x80\xaf", 4, 0, false},
    {"surrogate U+D800", "\xed\xa0\x80", 3, 0, false},
    {"surrogate U+DFFF", "\xed\xbf\xbf", 3, 0, false},
    {"above U+10FFFF", "\xf4\x90\x80\x80", 4, 0, false},
    {"lead byte F5", "\xf5\x80\x80\x80", 4, 0, false},
    {"5-byte sequence", "\xf8\x88\x80\x80\x80", 5, 0, false},
    {"truncated at the end", "a\xe2\x82", 3, 0, false},
    {"truncated before ASCII", "\xe2\x82" "x", 3, 0, false},
    {"truncated 4-byte", "\xf0\x9f\x98", 3, 0, false},
    {"length cuts a sequence", "caf\xc3\xa9", 4, 0, false},
    {"U+FFFE", "\xef\xbf\xbe", 3, 0, false},
    {"U+FFFF", "a\xef\xbf\xbf", 4, 0, false},
    {"255 bytes", "a", 0, 255, true},
    {"256 bytes", "a", 0, 256, false},
    {"254 bytes", "a", 0, 254, true},
    {"255 bytes of UTF-8 (85 x 3)", CJK, 0, 85, true},
    {"258 bytes of UTF-8 (86 x 3)", CJK, 0, 86, false},
    {"4096 bytes", "x", 0, 4096, false},
};

static void test_is_valid_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(valid_cases); i++) {
        const struct valid_case *c = &valid_cases[i];
        char *owned = NULL;
        const char *text = c->text;
        size_t len = c->len;

        if (c->repeat > 0) {
            owned = build("", c->text, c->repeat, "");
            text = owned;
            len = strlen(owned);
        }
        if (names_is_valid(text, len) != c->valid)
            fail_msg("%s: names_is_valid is %d, expected %d", c->name,
                     !c->valid, c->valid);
        free(owned);
    }
}

/* The errno of each way a name is refused: what a create returns. */
static void test_check_errnos(void **state)
{
    static const struct {
        const char *text;
        size_t len;
        int err;
    } rows[] = {
        {"a", 1, 0},
        {"caf\xc3\xa9", 5, 0},
        {"", 0, EINVAL},
        {".", 1, EINVAL},
        {"..", 2, EINVAL},
        {"a/b", 3, EINVAL},
        {"a\x01" "b", 3, EILSEQ},
        {"a\rb", 3, EILSEQ},
        {"a\0b", 3, EILSEQ},
        {"\xff", 1, EILSEQ},
        {"\xef\xbf\xbe", 3, EILSEQ},
    };
    char *long_name = build("", "n", NAMES_NAME_MAX + 1, "");

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(rows); i++)
        if (names_check(rows[i].text, rows[i].len) != rows[i].err)
            fail_msg("row %zu: names_check is %d, expected %d", i,
                     names_check(rows[i].text, rows[i].len), rows[i].err);
    assert_int_equal(names_check(long_name, NAMES_NAME_MAX + 1), ENAMETOOLONG);
    long_name[3] = '\x01';   /* too long first */
    assert_int_equal(names_check(long_name, NAMES_NAME_MAX + 1), ENAMETOOLONG);
    free(long_name);
}

/* How a key that is no name shows in a log line. */
static void test_printable(void **state)
{
    static const struct {
        const char *key;
        const char *shown;
    } rows[] = {
        {"plain/key", "plain/key"},
        {"d/ctl\x01name", "d/ctl\\x01name"},
        {"d/cr\rx\n\t", "d/cr\\x0dx\\x0a\\x09"},
        {"del\x7f", "del\\x7f"},
        {"caf\xc3\xa9", "caf\xc3\xa9"},
        {"bad\xff\xc3", "bad\\xff\\xc3"},
        {"\xef\xbf\xbe", "\\xef\\xbf\\xbe"},
        {"back\\slash", "back\\slash"},
    };
    char out[64];

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        names_printable(rows[i].key, out, sizeof(out));
        if (strcmp(out, rows[i].shown) != 0)
            fail_msg("row %zu: \"%s\", expected \"%s\"", i, out,
                     rows[i].shown);
    }
    /* cut short at a whole escape or character */
    names_printable("ab\x01" "cd", out, 6);
    assert_string_equal(out, "ab");
    names_printable("ab\x01" "cd", out, 7);
    assert_string_equal(out, "ab\\x01");
    names_printable("a\xc3\xa9", out, 3);
    assert_string_equal(out, "a");
    names_printable("abc", out, 1);
    assert_string_equal(out, "");
}

/* ---------------------------------------------------- names_classify */

struct classify_case {
    const char *name;
    const char *prefix;
    const char *key;      /* the key is KEY + UNIT * REPEAT + TAIL */
    const char *unit;
    size_t repeat;
    const char *tail;
    enum names_entry_kind kind;
    const char *child;    /* expected name for FILE and DIR rows */
    size_t child_repeat;  /* or unit repeated this often */
};

#define ROW(n, p, k, kind, child) {n, p, k, NULL, 0, "", kind, child, 0}
#define LONG(n, p, k, u, r, t, kind, cr) {n, p, k, u, r, t, kind, NULL, cr}

static const struct classify_case classify_cases[] = {
    /* the bucket root */
    ROW("root: file", "", "file.txt", NAMES_ENTRY_FILE, "file.txt"),
    ROW("root: dir", "", "dir/", NAMES_ENTRY_DIR, "dir"),
    ROW("root: one-byte dir", "", "x/", NAMES_ENTRY_DIR, "x"),
    ROW("root: self", "", "", NAMES_ENTRY_SELF, NULL),
    ROW("root: lone slash", "", "/", NAMES_ENTRY_INVALID, NULL),
    ROW("root: leading slash", "", "/a", NAMES_ENTRY_INVALID, NULL),
    ROW("root: deeper key", "", "a/b", NAMES_ENTRY_INVALID, NULL),
    ROW("root: deeper dir", "", "a/b/", NAMES_ENTRY_INVALID, NULL),
    ROW("root: dot", "", ".", NAMES_ENTRY_INVALID, NULL),
    ROW("root: dot dot", "", "..", NAMES_ENTRY_INVALID, NULL),
    ROW("root: dot dir", "", "./", NAMES_ENTRY_INVALID, NULL),
    ROW("root: dot dot dir", "", "../", NAMES_ENTRY_INVALID, NULL),
    ROW("root: three dots", "", "...", NAMES_ENTRY_FILE, "..."),
    ROW("root: hidden dir", "", ".git/", NAMES_ENTRY_DIR, ".git"),
    ROW("root: UTF-8 file", "", CJK ".txt", NAMES_ENTRY_FILE, CJK ".txt"),

    /* one level down */
    ROW("a/: file", "a/", "a/b", NAMES_ENTRY_FILE, "b"),
    ROW("a/: dir", "a/", "a/b/", NAMES_ENTRY_DIR, "b"),
    ROW("a/: dir x/", "a/", "a/x/", NAMES_ENTRY_DIR, "x"),
    ROW("a/: self marker", "a/", "a/", NAMES_ENTRY_SELF, NULL),
    ROW("a/: spaces", "a/", "a/my file", NAMES_ENTRY_FILE, "my file"),
    ROW("a/: UTF-8 dir", "a/", "a/caf\xc3\xa9/", NAMES_ENTRY_DIR,
        "caf\xc3\xa9"),
    ROW("a/: tab", "a/", "a/t\tb", NAMES_ENTRY_FILE, "t\tb"),
    ROW("a/: control character", "a/", "a/c\x01", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: control character dir", "a/", "a/c\x1f/", NAMES_ENTRY_INVALID,
        NULL),
    ROW("a/: carriage return", "a/", "a/c\rr", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: not UTF-8", "a/", "a/bad\xff", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: not UTF-8 dir", "a/", "a/\xc0\xaf/", NAMES_ENTRY_INVALID,
        NULL),
    ROW("a/: U+FFFE", "a/", "a/\xef\xbf\xbe", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: deeper key", "a/", "a/b/c", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: deeper dir", "a/", "a/b/c/", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: empty component", "a/", "a//", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: empty component, file", "a/", "a//b", NAMES_ENTRY_INVALID,
        NULL),
    ROW("a/: double slash at the end", "a/", "a/b//", NAMES_ENTRY_INVALID,
        NULL),
    ROW("a/: dot", "a/", "a/.", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: dot dot", "a/", "a/..", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: dot dir", "a/", "a/./", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: dot dot dir", "a/", "a/../", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: not under prefix", "a/", "b/c", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: shares first byte only", "a/", "ab", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: shorter than prefix", "a/", "a", NAMES_ENTRY_INVALID, NULL),
    ROW("a/: empty key", "a/", "", NAMES_ENTRY_INVALID, NULL),

    /* two levels down */
    ROW("a/b/: file", "a/b/", "a/b/c.txt", NAMES_ENTRY_FILE, "c.txt"),
    ROW("a/b/: dir", "a/b/", "a/b/c/", NAMES_ENTRY_DIR, "c"),
    ROW("a/b/: self", "a/b/", "a/b/", NAMES_ENTRY_SELF, NULL),
    ROW("a/b/: sibling prefix", "a/b/", "a/bc", NAMES_ENTRY_INVALID, NULL),
    ROW("a/b/: parent's marker", "a/b/", "a/", NAMES_ENTRY_INVALID, NULL),

    /* name lengths */
    LONG("255-byte file", "a/", "a/", "n", 255, "", NAMES_ENTRY_FILE, 255),
    LONG("256-byte file", "a/", "a/", "n", 256, "", NAMES_ENTRY_INVALID, 0),
    LONG("255-byte dir", "a/", "a/", "n", 255, "/", NAMES_ENTRY_DIR, 255),
    LONG("256-byte dir", "a/", "a/", "n", 256, "/", NAMES_ENTRY_INVALID, 0),
    LONG("root: 255-byte file", "", "", "n", 255, "", NAMES_ENTRY_FILE, 255),
    LONG("root: 256-byte dir", "", "", "n", 256, "/", NAMES_ENTRY_INVALID, 0),
    LONG("255-byte component one level down", "", "", "n", 255, "/x",
         NAMES_ENTRY_INVALID, 0),
};

static void test_classify_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(classify_cases); i++) {
        const struct classify_case *c = &classify_cases[i];
        char *key = build(c->key, c->unit, c->repeat, c->tail);
        char *want = c->child_repeat > 0
                         ? build("", c->unit, c->child_repeat, "")
                         : NULL;
        const char *child = c->child != NULL ? c->child : want;
        const char *name = NULL;
        size_t name_len = 99999;
        enum names_entry_kind kind;

        kind = names_classify(c->prefix, key, &name, &name_len);
        if (kind != c->kind)
            fail_msg("%s: kind %s, expected %s", c->name, kind_name(kind),
                     kind_name(c->kind));
        /* *name always points into the key */
        if (name == NULL || name < key || name > key + strlen(key))
            fail_msg("%s: name pointer outside the key", c->name);
        if (kind == NAMES_ENTRY_FILE || kind == NAMES_ENTRY_DIR) {
            assert_non_null(child);
            if (name != key + strlen(c->prefix))
                fail_msg("%s: name does not start after the prefix", c->name);
            if (name_len != strlen(child) ||
                memcmp(name, child, name_len) != 0)
                fail_msg("%s: name \"%.*s\", expected \"%s\"", c->name,
                         (int)name_len, name, child);
            if (!names_is_valid(name, name_len))
                fail_msg("%s: classified name is not valid", c->name);
        }
        if (kind == NAMES_ENTRY_SELF && name_len != 0)
            fail_msg("%s: SELF with name length %zu", c->name, name_len);
        free(key);
        free(want);
    }
}

/* The same key under a long prefix: only the part after it is the name. */
static void test_classify_long_prefix(void **state)
{
    char *prefix = build("", "p", 300, "/");
    char *file = build("", "p", 300, "/x");
    char *dir = build("", "p", 300, "/y/");
    const char *name;
    size_t len;

    (void)state;
    assert_int_equal(names_classify(prefix, file, &name, &len),
                     NAMES_ENTRY_FILE);
    assert_int_equal(len, 1);
    assert_memory_equal(name, "x", 1);
    assert_int_equal(names_classify(prefix, dir, &name, &len),
                     NAMES_ENTRY_DIR);
    assert_int_equal(len, 1);
    assert_memory_equal(name, "y", 1);
    assert_int_equal(names_classify(prefix, prefix, &name, &len),
                     NAMES_ENTRY_SELF);
    free(prefix);
    free(file);
    free(dir);
}

/* --------------------------------------------------- names_child_key */

struct child_case {
    const char *name;
    const char *prefix;
    const char *child;
    size_t len;
    bool as_dir;
    const char *key;
};

static const struct child_case child_cases[] = {
    {"root file", "", "x", 1, false, "x"},
    {"root dir", "", "x", 1, true, "x/"},
    {"file under a/", "a/", "b", 1, false, "a/b"},
    {"dir under a/", "a/", "b", 1, true, "a/b/"},
    {"file under a/b/", "a/b/", "c.txt", 5, false, "a/b/c.txt"},
    {"dir under a/b/", "a/b/", "c", 1, true, "a/b/c/"},
    {"only len bytes of the name", "a/", "bcd", 1, false, "a/b"},
    {"only len bytes, as dir", "a/", "bcd/ef", 3, true, "a/bcd/"},
    {"UTF-8 name", "d/", CJK, 3, false, "d/" CJK},
    {"spaces", "", "my file", 7, false, "my file"},
    {"three dots", "", "...", 3, true, ".../"},
};

static void test_child_key_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(child_cases); i++) {
        const struct child_case *c = &child_cases[i];
        char *key = names_child_key(c->prefix, c->child, c->len, c->as_dir);
        const char *name;
        size_t name_len;
        enum names_entry_kind kind;

        assert_non_null(key);
        if (strcmp(key, c->key) != 0)
            fail_msg("%s: key \"%s\", expected \"%s\"", c->name, key, c->key);
        /* and back: classify gives the same child */
        kind = names_classify(c->prefix, key, &name, &name_len);
        if (kind != (c->as_dir ? NAMES_ENTRY_DIR : NAMES_ENTRY_FILE))
            fail_msg("%s: round trip gives %s", c->name, kind_name(kind));
        if (name_len != c->len || memcmp(name, c->child, c->len) != 0)
            fail_msg("%s: round trip gives \"%.*s\"", c->name, (int)name_len,
                     name);
        free(key);
    }
}

/* 255-byte names round-trip at the root and below. */
static void test_child_key_long(void **state)
{
    static const char *const prefixes[] = {"", "a/", "a/b/c/"};

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(prefixes); i++) {
        char *child = build("", "z", NAMES_NAME_MAX, "");
        for (int as_dir = 0; as_dir <= 1; as_dir++) {
            char *key = names_child_key(prefixes[i], child, NAMES_NAME_MAX,
                                        as_dir);
            const char *name;
            size_t len;

            assert_non_null(key);
            assert_int_equal(strlen(key), strlen(prefixes[i]) +
                                              NAMES_NAME_MAX + (size_t)as_dir);
            assert_int_equal(names_classify(prefixes[i], key, &name, &len),
                             as_dir ? NAMES_ENTRY_DIR : NAMES_ENTRY_FILE);
            assert_int_equal(len, NAMES_NAME_MAX);
            assert_memory_equal(name, child, NAMES_NAME_MAX);
            free(key);
        }
        free(child);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_valid_table),
        cmocka_unit_test(test_check_errnos),
        cmocka_unit_test(test_printable),
        cmocka_unit_test(test_classify_table),
        cmocka_unit_test(test_classify_long_prefix),
        cmocka_unit_test(test_child_key_table),
        cmocka_unit_test(test_child_key_long),
    };

    return cmocka_run_group_tests_name("names", tests, NULL, NULL);
}
