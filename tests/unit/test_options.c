/*
 * test_options.c - unit tests for options.c: the value parsers (sizes,
 * octal modes, seconds), every -o option with valid and invalid values,
 * BUCKET[:PREFIX] and the bucket name, the positional arguments, -f/-d,
 * --help/--version, refused credentials, and what is handed on to libfuse
 * in fuse_args.
 *
 * Every case parses into a freshly poisoned struct options and frees it;
 * argv is built from the row with argv[0] = "s3cachefs". Error messages
 * are checked to name the option they complain about.
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
#include <unistd.h>

#include <cmocka.h>

#include "cmd/options.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_ARGS 16

/* ------------------------------------------------------------ helpers */

/* A mutable argv: "s3cachefs" and ARGS (NULL-terminated), each strdup'd. */
struct argv_buf {
    int argc;
    char *argv[MAX_ARGS + 2];
};

static void argv_build(struct argv_buf *ab, const char *const *args)
{
    ab->argc = 0;
    ab->argv[ab->argc++] = strdup("s3cachefs");
    for (size_t i = 0; args[i] != NULL; i++) {
        assert_true(i < MAX_ARGS);
        ab->argv[ab->argc++] = strdup(args[i]);
    }
    ab->argv[ab->argc] = NULL;
    for (int i = 0; i < ab->argc; i++)
        assert_non_null(ab->argv[i]);
}

static void argv_free(struct argv_buf *ab)
{
    for (int i = 0; i < ab->argc; i++)
        free(ab->argv[i]);
    ab->argc = 0;
}

/* Everything a case needs: argv, the result and the error text. */
struct parsed {
    struct argv_buf ab;
    struct options opts;
    char err[512];
    int rc;
};

static void parse(struct parsed *p, const char *const *args)
{
    argv_build(&p->ab, args);
    memset(&p->opts, 0xa5, sizeof(p->opts)); /* parse must set everything */
    memset(p->err, 0, sizeof(p->err));
    p->rc = options_parse(p->ab.argc, p->ab.argv, &p->opts, p->err,
                          sizeof(p->err));
}

/* options_free before argv_free: after a failed parse fuse_args may still
 * point at our argv. */
static void parsed_free(struct parsed *p)
{
    options_free(&p->opts);
    argv_free(&p->ab);
}

/* How many of the comma-separated options in every "-o X" and "-oX" of
 * ARGS equal OPT. */
static int count_fuse_opt(const struct fuse_args *args, const char *opt)
{
    int count = 0;

    for (int i = 1; i < args->argc; i++) {
        const char *list = NULL;

        if (strcmp(args->argv[i], "-o") == 0 && i + 1 < args->argc)
            list = args->argv[++i];
        else if (strncmp(args->argv[i], "-o", 2) == 0)
            list = args->argv[i] + 2;
        if (list == NULL)
            continue;
        for (const char *p = list; p != NULL;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if (len == strlen(opt) && memcmp(p, opt, len) == 0)
                count++;
            p = comma ? comma + 1 : NULL;
        }
    }
    return count;
}

/* How many elements of ARGS (after argv[0]) equal ARG exactly. */
static int count_fuse_arg(const struct fuse_args *args, const char *arg)
{
    int count = 0;

    for (int i = 1; i < args->argc; i++)
        if (strcmp(args->argv[i], arg) == 0)
            count++;
    return count;
}

/* Whether TEXT appears anywhere in fuse_args, even inside an element. */
static bool fuse_args_mention(const struct fuse_args *args, const char *text)
{
    for (int i = 0; i < args->argc; i++)
        if (strstr(args->argv[i], text) != NULL)
            return true;
    return false;
}

/* ------------------------------------------------- options_parse_size */

struct size_case {
    const char *name;
    const char *text;
    int rc;
    uint64_t value;
};

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define TIB (1024ull * GIB)

static const struct size_case size_cases[] = {
    {"plain bytes", "4096", 0, 4096},
    {"zero", "0", 0, 0},
    {"K", "64K", 0, 64 * KIB},
    {"k", "64k", 0, 64 * KIB},
    {"M", "8M", 0, 8 * MIB},
    {"m", "8m", 0, 8 * MIB},
    {"G", "2G", 0, 2 * GIB},
    {"T", "2T", 0, 2 * TIB},
    {"KiB", "64KiB", 0, 64 * KIB},
    {"KB", "64KB", 0, 64 * KIB},
    {"MiB", "3MiB", 0, 3 * MIB},
    {"GB", "1GB", 0, GIB},
    {"lower-case kib", "1kib", 0, KIB},
    {"1.5G", "1.5G", 0, 3 * GIB / 2},
    {"0.5K", "0.5K", 0, 512},
    {"0.25M", "0.25M", 0, MIB / 4},
    {"largest T below 2^64", "16777215T", 0, 16777215ull * TIB},
    {"empty", "", EINVAL, 0},
    {"NULL", NULL, EINVAL, 0},
    {"suffix only", "K", EINVAL, 0},
    {"bad suffix", "64X", EINVAL, 0},
    {"E is not a suffix", "1E", EINVAL, 0},
    {"P is not a suffix", "1P", EINVAL, 0},
    {"iB without a multiplier", "64iB", EINVAL, 0},
    {"B without a multiplier", "64B", EINVAL, 0},
    {"trailing garbage", "64Kx", EINVAL, 0},
    {"doubled B", "64KBB", EINVAL, 0},
    {"doubled suffix", "64KK", EINVAL, 0},
    {"space before suffix", "64 K", EINVAL, 0},
    {"trailing space", "64 ", EINVAL, 0},
    {"negative", "-1", EINVAL, 0},
    {"negative zero", "-0", EINVAL, 0},
    {"negative with suffix", "-1K", EINVAL, 0},
    {"two dots", "1.5.5", EINVAL, 0},
    {"word", "abc", EINVAL, 0},
    {"infinity", "inf", EINVAL, 0},
    {"not a number", "nan", EINVAL, 0},
    {"2^64 bytes", "18446744073709551616", EINVAL, 0},
    {"2^64 in T", "16777216T", EINVAL, 0},
    {"far too large", "1e30", EINVAL, 0},
    {"overflows a double", "1e400", EINVAL, 0},
};

static void test_parse_size_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(size_cases); i++) {
        const struct size_case *c = &size_cases[i];
        uint64_t value = 0x5a5a5a5a5a5a5a5aull;
        int rc = options_parse_size(c->text, &value);

        if (rc != c->rc)
            fail_msg("%s: rc %d, expected %d", c->name, rc, c->rc);
        if (rc == 0 && value != c->value)
            fail_msg("%s: %llu, expected %llu", c->name,
                     (unsigned long long)value, (unsigned long long)c->value);
        if (rc != 0 && value != 0x5a5a5a5a5a5a5a5aull)
            fail_msg("%s: output written on error", c->name);
    }
}

/* ------------------------------------------------- options_parse_mode */

struct mode_case {
    const char *name;
    const char *text;
    int rc;
    mode_t value;
};

static const struct mode_case mode_cases[] = {
    {"0644", "0644", 0, 0644},
    {"755 without a leading 0", "755", 0, 0755},
    {"0", "0", 0, 0},
    {"000", "000", 0, 0},
    {"0600", "0600", 0, 0600},
    {"setuid bits 4755", "4755", 0, 04755},
    {"sticky 1777", "1777", 0, 01777},
    {"07777", "07777", 0, 07777},
    {"7777", "7777", 0, 07777},
    {"over 07777", "10000", EINVAL, 0},
    {"file type bits", "0100644", EINVAL, 0},
    {"17777", "17777", EINVAL, 0},
    {"digit 8", "0648", EINVAL, 0},
    {"digit 9", "9", EINVAL, 0},
    {"hex", "0x1ff", EINVAL, 0},
    {"0o prefix", "0o644", EINVAL, 0},
    {"symbolic", "u+rw", EINVAL, 0},
    {"trailing garbage", "0644x", EINVAL, 0},
    {"trailing space", "0644 ", EINVAL, 0},
    {"negative", "-644", EINVAL, 0},
    {"plus sign", "+644", EINVAL, 0},
    {"empty", "", EINVAL, 0},
    {"NULL", NULL, EINVAL, 0},
    {"overflows unsigned long", "7777777777777777777777777777", EINVAL, 0},
};

static void test_parse_mode_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(mode_cases); i++) {
        const struct mode_case *c = &mode_cases[i];
        mode_t value = 0123;
        int rc = options_parse_mode(c->text, &value);

        if (rc != c->rc)
            fail_msg("%s: rc %d, expected %d", c->name, rc, c->rc);
        if (rc == 0 && value != c->value)
            fail_msg("%s: 0%o, expected 0%o", c->name, (unsigned)value,
                     (unsigned)c->value);
        if (rc != 0 && value != 0123)
            fail_msg("%s: output written on error", c->name);
    }
}

/* ---------------------------------------------- options_parse_seconds */

struct seconds_case {
    const char *name;
    const char *text;
    int rc;
    double value;
};

static const struct seconds_case seconds_cases[] = {
    {"zero", "0", 0, 0.0},
    {"one", "1", 0, 1.0},
    {"half", "0.5", 0, 0.5},
    {"leading dot", ".25", 0, 0.25},
    {"an hour", "3600", 0, 3600.0},
    {"a year", "31536000", 0, 31536000.0},
    {"more than a year", "31536001", EINVAL, 0},
    {"huge", "1e12", EINVAL, 0},
    {"overflows a double", "1e400", EINVAL, 0},
    {"negative", "-1", EINVAL, 0},
    {"negative fraction", "-0.5", EINVAL, 0},
    {"word", "abc", EINVAL, 0},
    {"unit suffix", "1s", EINVAL, 0},
    {"trailing garbage", "0.5x", EINVAL, 0},
    {"empty", "", EINVAL, 0},
    {"NULL", NULL, EINVAL, 0},
    {"infinity", "inf", EINVAL, 0},
    {"not a number", "nan", EINVAL, 0},
};

static void test_parse_seconds_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(seconds_cases); i++) {
        const struct seconds_case *c = &seconds_cases[i];
        double value = 42.0;
        int rc = options_parse_seconds(c->text, &value);

        if (rc != c->rc)
            fail_msg("%s: rc %d, expected %d", c->name, rc, c->rc);
        if (rc == 0 && value != c->value)
            fail_msg("%s: %g, expected %g", c->name, value, c->value);
        if (rc != 0 && value != 42.0)
            fail_msg("%s: output written on error", c->name);
    }
}

/* ------------------------------------------------- every -o option */

enum field {
    F_NONE,
    F_ENDPOINT, F_REGION, F_PROFILE, F_CREDENTIALS_FILE,
    F_NO_SIGN, F_PATH_STYLE, F_ALLOW_OTHER, F_READ_ONLY, F_WRITEBACK,
    F_UID, F_GID, F_FILE_MODE, F_DIR_MODE,
    F_ATTR_TTL, F_DIR_TTL, F_READ_AHEAD, F_LISTING_MEMORY, F_CONNECTIONS, F_RETRIES,
    F_REQUEST_TIMEOUT,
};

struct opt_case {
    const char *name;
    const char *opt;          /* the argument of -o */
    int rc;
    enum field field;         /* what a good value sets */
    unsigned long long u;     /* integer fields, modes, booleans */
    double d;                 /* seconds */
    const char *s;            /* strings */
};

#define OK_U(n, o, f, v) {n, o, 0, f, v, 0, NULL}
#define OK_D(n, o, f, v) {n, o, 0, f, 0, v, NULL}
#define OK_S(n, o, f, v) {n, o, 0, f, 0, 0, v}
#define BAD(n, o) {n, o, EINVAL, F_NONE, 0, 0, NULL}

static const struct opt_case opt_cases[] = {
    OK_S("endpoint", "endpoint=http://127.0.0.1:9000", F_ENDPOINT,
         "http://127.0.0.1:9000"),
    OK_S("region", "region=eu-west-1", F_REGION, "eu-west-1"),
    OK_S("profile", "profile=dev", F_PROFILE, "dev"),
    OK_S("credentials_file", "credentials_file=/etc/s3/creds",
         F_CREDENTIALS_FILE, "/etc/s3/creds"),
    OK_U("no_sign", "no_sign", F_NO_SIGN, 1),
    OK_U("path_style", "path_style", F_PATH_STYLE, 1),
    OK_U("allow_other", "allow_other", F_ALLOW_OTHER, 1),
    OK_U("ro", "ro", F_READ_ONLY, 1),
    OK_U("writeback", "writeback", F_WRITEBACK, 1),

    OK_U("uid 0", "uid=0", F_UID, 0),
    OK_U("uid 1000", "uid=1000", F_UID, 1000),
    OK_U("uid 4294967294", "uid=4294967294", F_UID, 4294967294ull),
    BAD("empty cache directory", "cache="),
    BAD("uid -1 (the 'no change' id)", "uid=4294967295"),
    BAD("uid over 32 bits", "uid=4294967296"),
    BAD("uid negative", "uid=-1"),
    BAD("uid by name", "uid=root"),
    BAD("uid with garbage", "uid=12a"),
    BAD("uid plus sign", "uid=+5"),
    BAD("uid leading space", "uid= 5"),
    BAD("uid empty", "uid="),
    BAD("uid fraction", "uid=1.5"),
    BAD("uid far too large", "uid=99999999999999999999999"),
    OK_U("gid 0", "gid=0", F_GID, 0),
    OK_U("gid 100", "gid=100", F_GID, 100),
    BAD("gid by name", "gid=users"),
    BAD("gid negative", "gid=-5"),
    BAD("gid empty", "gid="),

    OK_U("file_mode 0600", "file_mode=0600", F_FILE_MODE, 0600),
    OK_U("file_mode 444", "file_mode=444", F_FILE_MODE, 0444),
    OK_U("file_mode 07777", "file_mode=07777", F_FILE_MODE, 07777),
    BAD("file_mode over 07777", "file_mode=10000"),
    BAD("file_mode digit 8", "file_mode=0688"),
    BAD("file_mode symbolic", "file_mode=rw-r--r--"),
    BAD("file_mode empty", "file_mode="),
    BAD("file_mode negative", "file_mode=-1"),
    OK_U("dir_mode 0700", "dir_mode=0700", F_DIR_MODE, 0700),
    OK_U("dir_mode 555", "dir_mode=555", F_DIR_MODE, 0555),
    BAD("dir_mode over 07777", "dir_mode=20000"),
    BAD("dir_mode digit 9", "dir_mode=0799"),
    BAD("dir_mode empty", "dir_mode="),

    OK_D("attr_ttl 0", "attr_ttl=0", F_ATTR_TTL, 0.0),
    OK_D("attr_ttl 0.5", "attr_ttl=0.5", F_ATTR_TTL, 0.5),
    OK_D("attr_ttl 60", "attr_ttl=60", F_ATTR_TTL, 60.0),
    BAD("attr_ttl negative", "attr_ttl=-1"),
    BAD("attr_ttl word", "attr_ttl=abc"),
    BAD("attr_ttl huge", "attr_ttl=1e300"),
    BAD("attr_ttl empty", "attr_ttl="),
    OK_D("dir_ttl 0", "dir_ttl=0", F_DIR_TTL, 0.0),
    OK_D("dir_ttl 2.5", "dir_ttl=2.5", F_DIR_TTL, 2.5),
    BAD("dir_ttl negative", "dir_ttl=-0.5"),
    BAD("dir_ttl unit", "dir_ttl=5s"),
    BAD("dir_ttl huge", "dir_ttl=99999999999"),

    OK_U("read_ahead 4096", "read_ahead=4096", F_READ_AHEAD, 4096),
    OK_U("read_ahead 128K", "read_ahead=128K", F_READ_AHEAD, 128 * KIB),
    OK_U("read_ahead 16MiB", "read_ahead=16MiB", F_READ_AHEAD, 16 * MIB),
    OK_U("read_ahead 0.5G", "read_ahead=0.5G", F_READ_AHEAD, GIB / 2),
    OK_U("read_ahead 1G (the limit)", "read_ahead=1G", F_READ_AHEAD, GIB),
    OK_U("read_ahead 1024M", "read_ahead=1024M", F_READ_AHEAD, GIB),
    BAD("read_ahead 1G + 1", "read_ahead=1073741825"),
    BAD("read_ahead 1.5G", "read_ahead=1.5G"),
    BAD("read_ahead 2T", "read_ahead=2T"),
    BAD("read_ahead bad suffix", "read_ahead=64Q"),
    OK_U("listing_memory by default", "read_ahead=1M", F_LISTING_MEMORY, 64 * MIB),
    OK_U("listing_memory 1G", "listing_memory=1G", F_LISTING_MEMORY, GIB),
    OK_U("listing_memory 1M (the least)", "listing_memory=1M", F_LISTING_MEMORY, MIB),
    BAD("listing_memory below 1M", "listing_memory=512K"),
    BAD("listing_memory 0", "listing_memory=0"),
    BAD("listing_memory bad suffix", "listing_memory=64Q"),
    BAD("read_ahead negative", "read_ahead=-64M"),
    BAD("read_ahead overflow", "read_ahead=99999999999999999999T"),
    BAD("read_ahead empty", "read_ahead="),

    OK_U("connections 1", "connections=1", F_CONNECTIONS, 1),
    OK_U("connections 64", "connections=64", F_CONNECTIONS, 64),
    OK_U("connections 256", "connections=256", F_CONNECTIONS, 256),
    BAD("connections 0", "connections=0"),
    BAD("connections 257", "connections=257"),
    BAD("connections negative", "connections=-1"),
    BAD("connections word", "connections=many"),
    BAD("connections 2^32", "connections=4294967296"),
    BAD("connections empty", "connections="),
    OK_U("retries 0", "retries=0", F_RETRIES, 0),
    OK_U("retries 3", "retries=3", F_RETRIES, 3),
    OK_U("retries 100", "retries=100", F_RETRIES, 100),
    BAD("retries 101", "retries=101"),
    BAD("retries negative", "retries=-1"),
    BAD("retries fraction", "retries=1.5"),
    BAD("retries empty", "retries="),
    OK_D("request_timeout 1", "request_timeout=1", F_REQUEST_TIMEOUT, 1.0),
    OK_D("request_timeout 2.5", "request_timeout=2.5", F_REQUEST_TIMEOUT, 2.5),
    OK_D("request_timeout 3600", "request_timeout=3600", F_REQUEST_TIMEOUT,
         3600.0),
    BAD("request_timeout 0", "request_timeout=0"),
    BAD("request_timeout 0.5", "request_timeout=0.5"),
    BAD("request_timeout 3601", "request_timeout=3601"),
    BAD("request_timeout negative", "request_timeout=-5"),
    BAD("request_timeout word", "request_timeout=long"),
    BAD("request_timeout empty", "request_timeout="),
};

static void check_field(const struct opt_case *c, const struct options *o)
{
    unsigned long long u = 0;
    double d = 0;
    const char *s = NULL;

    switch (c->field) {
    case F_NONE: return;
    case F_ENDPOINT: s = o->endpoint; break;
    case F_REGION: s = o->region; break;
    case F_PROFILE: s = o->profile; break;
    case F_CREDENTIALS_FILE: s = o->credentials_file; break;
    case F_NO_SIGN: u = o->no_sign; break;
    case F_PATH_STYLE: u = o->path_style; break;
    case F_ALLOW_OTHER: u = o->allow_other; break;
    case F_READ_ONLY: u = o->read_only; break;
    case F_WRITEBACK: u = o->writeback; break;
    case F_UID:
        u = o->uid;
        if (!o->uid_set)
            fail_msg("%s: uid_set not set", c->name);
        break;
    case F_GID:
        u = o->gid;
        if (!o->gid_set)
            fail_msg("%s: gid_set not set", c->name);
        break;
    case F_FILE_MODE: u = o->file_mode; break;
    case F_DIR_MODE: u = o->dir_mode; break;
    case F_ATTR_TTL: d = o->attr_ttl; break;
    case F_DIR_TTL: d = o->dir_ttl; break;
    case F_READ_AHEAD: u = o->read_ahead; break;
    case F_LISTING_MEMORY: u = o->listing_memory; break;
    case F_CONNECTIONS: u = o->connections; break;
    case F_RETRIES: u = o->retries; break;
    case F_REQUEST_TIMEOUT: d = o->request_timeout; break;
    }
    switch (c->field) {
    case F_ENDPOINT: case F_REGION: case F_PROFILE: case F_CREDENTIALS_FILE:
        if (s == NULL || strcmp(s, c->s) != 0)
            fail_msg("%s: \"%s\", expected \"%s\"", c->name,
                     s ? s : "(null)", c->s);
        break;
    case F_ATTR_TTL: case F_DIR_TTL: case F_REQUEST_TIMEOUT:
        if (d != c->d)
            fail_msg("%s: %g, expected %g", c->name, d, c->d);
        break;
    default:
        if (u != c->u)
            fail_msg("%s: %llu (0%llo), expected %llu (0%llo)", c->name, u, u,
                     c->u, c->u);
        break;
    }
}

/* Each option alone, as "-o OPT" before the positionals. */
static void test_option_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(opt_cases); i++) {
        const struct opt_case *c = &opt_cases[i];
        const char *args[] = {"-o", c->opt, "bucket", "/mnt", NULL};
        struct parsed p;

        parse(&p, args);
        if (p.rc != c->rc)
            fail_msg("%s: rc %d, expected %d (%s)", c->name, p.rc, c->rc,
                     p.err);
        if (p.rc == 0) {
            check_field(c, &p.opts);
        } else {
            /* one sentence that names the option and its value */
            char want[256];

            snprintf(want, sizeof(want), "option '%s'", c->opt);
            if (strstr(p.err, want) == NULL)
                fail_msg("%s: message \"%s\" does not name %s", c->name,
                         p.err, want);
            if (strchr(p.err, '\n') != NULL)
                fail_msg("%s: message has a newline", c->name);
        }
        parsed_free(&p);
    }
}

/* The same options work as "-oOPT", after the positionals, and split. */
static void test_option_forms(void **state)
{
    static const char *const forms[][7] = {
        {"-oretries=3,connections=8", "bucket", "/mnt", NULL},
        {"bucket", "/mnt", "-o", "retries=3,connections=8", NULL},
        {"-o", "retries=3", "bucket", "-o", "connections=8", "/mnt", NULL},
        {"-oretries=3", "-oconnections=8", "bucket", "/mnt", NULL},
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(forms); i++) {
        struct parsed p;

        parse(&p, forms[i]);
        if (p.rc != 0)
            fail_msg("form %zu: rc %d (%s)", i, p.rc, p.err);
        assert_int_equal(p.opts.retries, 3);
        assert_int_equal(p.opts.connections, 8);
        assert_string_equal(p.opts.bucket, "bucket");
        assert_string_equal(p.opts.mountpoint, "/mnt");
        parsed_free(&p);
    }
}

/* With no options, the documented defaults. */
static void test_defaults(void **state)
{
    const char *args[] = {"bucket", "/mnt", NULL};
    struct parsed p;

    (void)state;
    parse(&p, args);
    assert_int_equal(p.rc, 0);
    assert_string_equal(p.opts.bucket, "bucket");
    assert_string_equal(p.opts.prefix, "");
    assert_string_equal(p.opts.mountpoint, "/mnt");
    assert_false(p.opts.foreground);
    assert_false(p.opts.debug);
    assert_false(p.opts.show_help);
    assert_false(p.opts.show_version);
    assert_null(p.opts.endpoint);
    assert_null(p.opts.region);
    assert_null(p.opts.profile);
    assert_null(p.opts.credentials_file);
    assert_false(p.opts.no_sign);
    assert_false(p.opts.path_style);
    assert_int_equal(p.opts.uid, getuid());
    assert_int_equal(p.opts.gid, getgid());
    assert_false(p.opts.uid_set);
    assert_false(p.opts.gid_set);
    assert_int_equal(p.opts.file_mode, 0644);
    assert_int_equal(p.opts.dir_mode, 0755);
    assert_false(p.opts.read_only);
    assert_false(p.opts.writeback);
    assert_false(p.opts.allow_other);
    assert_true(p.opts.attr_ttl == 1.0);
    assert_true(p.opts.dir_ttl == 1.0);
    assert_int_equal(p.opts.read_ahead, 64 * MIB);
    assert_int_equal(p.opts.connections, 16);
    assert_int_equal(p.opts.retries, 6);
    assert_true(p.opts.request_timeout == 30.0);
    parsed_free(&p);
}

/* uid= does not imply gid= and the other way round. */
static void test_uid_gid_flags(void **state)
{
    const char *uid_only[] = {"-o", "uid=1234", "bucket", "/mnt", NULL};
    const char *gid_only[] = {"-o", "gid=4321", "bucket", "/mnt", NULL};
    struct parsed p;

    (void)state;
    parse(&p, uid_only);
    assert_int_equal(p.rc, 0);
    assert_true(p.opts.uid_set);
    assert_int_equal(p.opts.uid, 1234);
    assert_false(p.opts.gid_set);
    assert_int_equal(p.opts.gid, getgid());
    parsed_free(&p);

    parse(&p, gid_only);
    assert_int_equal(p.rc, 0);
    assert_false(p.opts.uid_set);
    assert_int_equal(p.opts.uid, getuid());
    assert_true(p.opts.gid_set);
    assert_int_equal(p.opts.gid, 4321);
    parsed_free(&p);
}

/* The first bad option is the one reported. */
static void test_first_error_wins(void **state)
{
    const char *args[] = {"-o", "retries=999,uid=x", "bucket", "/mnt", NULL};
    struct parsed p;

    (void)state;
    parse(&p, args);
    assert_int_equal(p.rc, EINVAL);
    /* convert_raw checks uid before retries: either is fine, but only one
     * sentence, naming one of them */
    assert_true(strstr(p.err, "uid=x") != NULL ||
                strstr(p.err, "retries=999") != NULL);
    assert_false(strstr(p.err, "uid=x") != NULL &&
                 strstr(p.err, "retries=999") != NULL);
    parsed_free(&p);
}

/* ------------------------------------------- positionals and prefixes */

struct pos_case {
    const char *name;
    const char *args[6];
    int rc;
    const char *bucket;      /* expected on success */
    const char *prefix;
    const char *mountpoint;
    const char *err_has;     /* expected in the message on failure */
};

static const struct pos_case pos_cases[] = {
    {"bucket and mountpoint", {"bucket", "/mnt", NULL}, 0,
     "bucket", "", "/mnt", NULL},
    {"relative mountpoint", {"bucket", "mnt/x", NULL}, 0,
     "bucket", "", "mnt/x", NULL},
    {"prefix a/b", {"bucket:a/b", "/mnt", NULL}, 0,
     "bucket", "a/b/", "/mnt", NULL},
    {"prefix /a/b/", {"bucket:/a/b/", "/mnt", NULL}, 0,
     "bucket", "a/b/", "/mnt", NULL},
    {"prefix a/b/", {"bucket:a/b/", "/mnt", NULL}, 0,
     "bucket", "a/b/", "/mnt", NULL},
    {"prefix single component", {"bucket:photos", "/mnt", NULL}, 0,
     "bucket", "photos/", "/mnt", NULL},
    {"empty prefix", {"bucket:", "/mnt", NULL}, 0,
     "bucket", "", "/mnt", NULL},
    {"prefix /", {"bucket:/", "/mnt", NULL}, 0,
     "bucket", "", "/mnt", NULL},
    {"prefix with three dots", {"bucket:a/.../b", "/mnt", NULL}, 0,
     "bucket", "a/.../b/", "/mnt", NULL},
    {"hidden component", {"bucket:.cache", "/mnt", NULL}, 0,
     "bucket", ".cache/", "/mnt", NULL},
    {"only the first colon splits", {"bucket:a:b", "/mnt", NULL}, 0,
     "bucket", "a:b/", "/mnt", NULL},
    {"options after positionals", {"bucket:x", "/mnt", "-f", NULL}, 0,
     "bucket", "x/", "/mnt", NULL},
    {"prefix a//b", {"bucket:a//b", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix 'a//b'"},
    {"prefix a/./b", {"bucket:a/./b", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix 'a/./b'"},
    {"prefix a/../b", {"bucket:a/../b", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix 'a/../b'"},
    {"prefix .", {"bucket:.", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix"},
    {"prefix ..", {"bucket:..", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix"},
    {"prefix ending in /.", {"bucket:a/.", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid prefix"},
    {"no arguments", {NULL}, EINVAL, NULL, NULL, NULL, "usage:"},
    {"no mountpoint", {"bucket", NULL}, EINVAL, NULL, NULL, NULL, "usage:"},
    {"no mountpoint, with options", {"-f", "-o", "ro", "bucket:p", NULL},
     EINVAL, NULL, NULL, NULL, "usage:"},
    {"too many positionals", {"bucket", "/mnt", "extra", NULL}, EINVAL,
     NULL, NULL, NULL, "unexpected argument 'extra'"},
    {"far too many positionals", {"a1b", "/m", "x", "y", NULL}, EINVAL,
     NULL, NULL, NULL, "unexpected argument 'x'"},

    /* bucket names */
    {"3-character bucket", {"abc", "/mnt", NULL}, 0,
     "abc", "", "/mnt", NULL},
    {"dots and dashes", {"my.bucket-1", "/mnt", NULL}, 0,
     "my.bucket-1", "", "/mnt", NULL},
    {"upper case and underscore", {"My_Bucket", "/mnt", NULL}, 0,
     "My_Bucket", "", "/mnt", NULL},
    {"2-character bucket", {"ab", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name 'ab'"},
    {"1-character bucket", {"b", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name 'b'"},
    {"empty bucket", {":prefix", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name"},
    {"space in bucket", {"my bucket", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name 'my bucket'"},
    {"slash in bucket", {"my/bucket", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name"},
    {"percent in bucket", {"my%20bucket", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name"},
    {"non-ASCII bucket", {"b\xc3\xbc" "cket", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name"},
    {"URL as bucket", {"s3://bucket", "/mnt", NULL}, EINVAL,
     NULL, NULL, NULL, "invalid bucket name"},
};

static void test_positional_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(pos_cases); i++) {
        const struct pos_case *c = &pos_cases[i];
        struct parsed p;

        parse(&p, c->args);
        if (p.rc != c->rc)
            fail_msg("%s: rc %d, expected %d (%s)", c->name, p.rc, c->rc,
                     p.err);
        if (p.rc == 0) {
            if (p.opts.bucket == NULL || strcmp(p.opts.bucket, c->bucket))
                fail_msg("%s: bucket \"%s\"", c->name,
                         p.opts.bucket ? p.opts.bucket : "(null)");
            if (p.opts.prefix == NULL || strcmp(p.opts.prefix, c->prefix))
                fail_msg("%s: prefix \"%s\", expected \"%s\"", c->name,
                         p.opts.prefix ? p.opts.prefix : "(null)", c->prefix);
            if (p.opts.mountpoint == NULL ||
                strcmp(p.opts.mountpoint, c->mountpoint))
                fail_msg("%s: mountpoint \"%s\"", c->name,
                         p.opts.mountpoint ? p.opts.mountpoint : "(null)");
        } else if (strstr(p.err, c->err_has) == NULL) {
            fail_msg("%s: message \"%s\" lacks \"%s\"", c->name, p.err,
                     c->err_has);
        }
        parsed_free(&p);
    }
}

/* Bucket names of 3 to 255 characters; 256 is too long. */
static void test_bucket_length(void **state)
{
    static const struct {
        size_t len;
        int rc;
    } rows[] = {{3, 0}, {63, 0}, {64, 0}, {255, 0}, {256, EINVAL},
                {1000, EINVAL}};

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        char *bucket = malloc(rows[i].len + 1);
        const char *args[] = {bucket, "/mnt", NULL};
        struct parsed p;

        assert_non_null(bucket);
        memset(bucket, 'b', rows[i].len);
        bucket[rows[i].len] = '\0';
        parse(&p, args);
        if (p.rc != rows[i].rc)
            fail_msg("%zu-character bucket: rc %d, expected %d", rows[i].len,
                     p.rc, rows[i].rc);
        if (p.rc != 0 && strstr(p.err, "invalid bucket name") == NULL)
            fail_msg("%zu-character bucket: message \"%s\"", rows[i].len,
                     p.err);
        parsed_free(&p);
        free(bucket);
    }
}

/* ---------------------------------------------------------- the flags */

struct flag_case {
    const char *name;
    const char *args[6];
    bool foreground, debug, help, version;
};

static const struct flag_case flag_cases[] = {
    {"none", {"bucket", "/mnt", NULL}, false, false, false, false},
    {"-f", {"-f", "bucket", "/mnt", NULL}, true, false, false, false},
    {"-f after positionals", {"bucket", "/mnt", "-f", NULL},
     true, false, false, false},
    {"-d implies -f", {"-d", "bucket", "/mnt", NULL},
     true, true, false, false},
    {"-o debug implies -f", {"-o", "debug", "bucket", "/mnt", NULL},
     true, true, false, false},
    {"-f and -d", {"-f", "-d", "bucket", "/mnt", NULL},
     true, true, false, false},
    {"-h alone", {"-h", NULL}, false, false, true, false},
    {"--help alone", {"--help", NULL}, false, false, true, false},
    {"--help with positionals", {"--help", "bucket", "/mnt", NULL},
     false, false, true, false},
    {"--help with only a bucket", {"bucket", "--help", NULL},
     false, false, true, false},
    {"-V alone", {"-V", NULL}, false, false, false, true},
    {"--version alone", {"--version", NULL}, false, false, false, true},
    {"--version and -f", {"-f", "--version", NULL},
     true, false, false, true},
};

static void test_flag_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(flag_cases); i++) {
        const struct flag_case *c = &flag_cases[i];
        struct parsed p;

        parse(&p, c->args);
        if (p.rc != 0)
            fail_msg("%s: rc %d (%s)", c->name, p.rc, p.err);
        if (p.opts.foreground != c->foreground)
            fail_msg("%s: foreground %d", c->name, p.opts.foreground);
        if (p.opts.debug != c->debug)
            fail_msg("%s: debug %d", c->name, p.opts.debug);
        if (p.opts.show_help != c->help)
            fail_msg("%s: show_help %d", c->name, p.opts.show_help);
        if (p.opts.show_version != c->version)
            fail_msg("%s: show_version %d", c->name, p.opts.show_version);
        /* ours, not libfuse's */
        if (count_fuse_arg(&p.opts.fuse_args, "-f") != 0 ||
            count_fuse_arg(&p.opts.fuse_args, "-d") != 0 ||
            count_fuse_opt(&p.opts.fuse_args, "debug") != 0 ||
            count_fuse_arg(&p.opts.fuse_args, "--help") != 0 ||
            count_fuse_arg(&p.opts.fuse_args, "-h") != 0 ||
            count_fuse_arg(&p.opts.fuse_args, "--version") != 0 ||
            count_fuse_arg(&p.opts.fuse_args, "-V") != 0)
            fail_msg("%s: a flag of ours was passed on to libfuse", c->name);
        parsed_free(&p);
    }
}

/* -------------------------------------------------------- credentials */

struct secret_case {
    const char *name;
    const char *args[6];
    const char *option;      /* named in the message */
    const char *secret;      /* never in the message */
};

static const struct secret_case secret_cases[] = {
    {"access_key", {"-o", "access_key=AKIAQUITESECRET0001", "bucket", "/mnt",
                    NULL},
     "access_key", "AKIAQUITESECRET0001"},
    {"secret_key", {"-o", "secret_key=wJalr/K7MDENG+bPxRfiCYSECRET", "bucket",
                    "/mnt", NULL},
     "secret_key", "wJalr/K7MDENG+bPxRfiCYSECRET"},
    {"session_token", {"-o", "session_token=FQoGZXIvYXdzTOKENSECRET",
                       "bucket", "/mnt", NULL},
     "session_token", "FQoGZXIvYXdzTOKENSECRET"},
    {"-oSECRET form", {"-osecret_key=inlineSECRETvalue", "bucket", "/mnt",
                       NULL},
     "secret_key", "inlineSECRETvalue"},
    {"among other options", {"-o", "region=x,secret_key=midSECRET,ro",
                             "bucket", "/mnt", NULL},
     "secret_key", "midSECRET"},
    {"after positionals", {"bucket", "/mnt", "-o",
                           "access_key=lateSECRETkey", NULL},
     "access_key", "lateSECRETkey"},
    {"without positionals", {"-o", "secret_key=loneSECRET", NULL},
     "secret_key", "loneSECRET"},
    {"even with --help", {"--help", "-o", "secret_key=helpSECRET", NULL},
     "secret_key", "helpSECRET"},
    {"empty value", {"-o", "secret_key=", "bucket", "/mnt", NULL},
     "secret_key", NULL},
    /* the names of ~/.aws/credentials: passed on, libfuse's "unknown
     * option" line would show the value */
    {"aws_access_key_id", {"-o", "aws_access_key_id=AKIAFILESECRET0002",
                           "bucket", "/mnt", NULL},
     "aws_access_key_id", "AKIAFILESECRET0002"},
    {"aws_secret_access_key",
     {"-o", "ro,aws_secret_access_key=wJalrFileSECRETKEY", "bucket", "/mnt",
      NULL},
     "aws_secret_access_key", "wJalrFileSECRETKEY"},
    {"aws_session_token", {"-oaws_session_token=FwoFileTOKENSECRET",
                           "bucket", "/mnt", NULL},
     "aws_session_token", "FwoFileTOKENSECRET"},
};

static void test_secret_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(secret_cases); i++) {
        const struct secret_case *c = &secret_cases[i];
        char want[64];
        struct parsed p;

        parse(&p, c->args);
        if (p.rc != EINVAL)
            fail_msg("%s: rc %d, expected EINVAL", c->name, p.rc);
        snprintf(want, sizeof(want), "option '%s'", c->option);
        if (strstr(p.err, want) == NULL)
            fail_msg("%s: message \"%s\" does not name %s", c->name, p.err,
                     c->option);
        if (strstr(p.err, "SECRET") != NULL ||
            (c->secret != NULL && strstr(p.err, c->secret) != NULL))
            fail_msg("%s: message \"%s\" shows the secret", c->name, p.err);
        if (strstr(p.err, "command line") == NULL)
            fail_msg("%s: message \"%s\" does not say why", c->name, p.err);
        parsed_free(&p);
    }
}

/* ------------------------------------------------ what goes to libfuse */

struct fuse_case {
    const char *name;
    const char *args[8];
    const char *opts_kept[4];     /* each exactly once in -o lists */
    const char *args_kept[3];     /* each exactly once as an element */
    const char *absent[6];        /* nowhere in fuse_args */
    bool allow_other;
};

static const struct fuse_case fuse_cases[] = {
    {"nothing extra", {"bucket", "/mnt", NULL},
     {NULL}, {NULL}, {"bucket", "/mnt", "ro", "writeback"}, false},
    {"ro", {"-o", "ro", "bucket", "/mnt", NULL},
     {"ro"}, {NULL}, {"bucket"}, false},
    {"writeback is ours", {"-o", "writeback", "bucket", "/mnt", NULL},
     {NULL}, {NULL}, {"writeback", "ro"}, false},
    {"allow_other", {"-o", "allow_other", "bucket", "/mnt", NULL},
     {"allow_other"}, {NULL}, {"bucket"}, true},
    {"default_permissions", {"-o", "default_permissions", "bucket", "/mnt",
                             NULL},
     {"default_permissions"}, {NULL}, {NULL}, false},
    {"fsname=x", {"-o", "fsname=x", "bucket", "/mnt", NULL},
     {"fsname=x"}, {NULL}, {NULL}, false},
    {"unknown option", {"-o", "no_such_option=1", "bucket", "/mnt", NULL},
     {"no_such_option=1"}, {NULL}, {NULL}, false},
    {"fstab mount options", {"-o", "nosuid,nodev,noatime", "bucket", "/mnt",
                             NULL},
     {"nosuid", "nodev", "noatime"}, {NULL}, {"ro"}, false},
    {"ro given: passed once", {"-o", "ro", "bucket", "/mnt", NULL},
     {"ro"}, {NULL}, {NULL}, false},
    {"ours mixed with libfuse's",
     {"-o", "uid=5,allow_other,endpoint=http://h:1,fsname=s3", "-o",
      "region=r,path_style,no_sign,retries=2", "bucket", "/mnt", NULL},
     {"allow_other", "fsname=s3"}, {NULL},
     {"uid=", "endpoint=", "region=", "path_style", "no_sign", "retries="},
     true},
    {"unknown dash option", {"-s", "bucket", "/mnt", NULL},
     {NULL}, {"-s"}, {NULL}, false},
    {"-f and -d stay here", {"-f", "-d", "-o", "debug", "bucket", "/mnt",
                             NULL},
     {NULL}, {NULL}, {"debug"}, false},
};

static void test_fuse_args_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(fuse_cases); i++) {
        const struct fuse_case *c = &fuse_cases[i];
        const struct fuse_args *fa;
        struct parsed p;

        parse(&p, c->args);
        if (p.rc != 0)
            fail_msg("%s: rc %d (%s)", c->name, p.rc, p.err);
        fa = &p.opts.fuse_args;
        if (fa->argc < 1 || fa->argv == NULL ||
            strcmp(fa->argv[0], "s3cachefs") != 0)
            fail_msg("%s: argv[0] not kept", c->name);
        if (fa->argv[fa->argc] != NULL)
            fail_msg("%s: fuse_args not NULL-terminated", c->name);
        /* copies, never our argv */
        for (int j = 0; j < fa->argc; j++)
            for (int k = 0; k < p.ab.argc; k++)
                if (fa->argv[j] == p.ab.argv[k])
                    fail_msg("%s: fuse_args aliases argv", c->name);
        for (size_t j = 0; j < ARRAY_LEN(c->opts_kept) && c->opts_kept[j];
             j++) {
            int n = count_fuse_opt(fa, c->opts_kept[j]);
            if (n != 1)
                fail_msg("%s: -o %s passed %d times", c->name,
                         c->opts_kept[j], n);
        }
        for (size_t j = 0; j < ARRAY_LEN(c->args_kept) && c->args_kept[j];
             j++) {
            int n = count_fuse_arg(fa, c->args_kept[j]);
            if (n != 1)
                fail_msg("%s: %s passed %d times", c->name, c->args_kept[j],
                         n);
        }
        for (size_t j = 0; j < ARRAY_LEN(c->absent) && c->absent[j]; j++)
            if (fuse_args_mention(fa, c->absent[j]))
                fail_msg("%s: \"%s\" passed to libfuse", c->name,
                         c->absent[j]);
        if (p.opts.allow_other != c->allow_other)
            fail_msg("%s: allow_other %d", c->name, p.opts.allow_other);
        if (p.opts.read_only != (count_fuse_opt(fa, "ro") == 1))
            fail_msg("%s: read_only %d", c->name, p.opts.read_only);
        parsed_free(&p);
    }
}

/* Writeback needs a read-write mount: a clear sentence otherwise. */
static void test_writeback_with_ro(void **state)
{
    const char *args[] = {"-o", "writeback,ro", "bucket", "/mnt", NULL};
    struct parsed p;

    (void)state;
    parse(&p, args);
    assert_int_equal(p.rc, EINVAL);
    assert_non_null(strstr(p.err, "writeback"));
    assert_non_null(strstr(p.err, "ro"));
    parsed_free(&p);
}

/* -o trust and -o no_headers: directories made prefixes ("/" the whole
 * mount); empty entries and '.' or '..' components refused with the
 * option named. The two are independent. */
static void test_directory_lists(void **state)
{
    static const struct {
        const char *value;
        const char *prefixes[4];    /* NULL-terminated; none: refused */
    } cases[] = {
        {"datasets/imagenet", {"datasets/imagenet/"}},
        {"/a//:b/", {"a/", "b/"}},          /* (slashes at the ends) */
        {"a//b", {NULL}},
        {"a/b:c:/d/", {"a/b/", "c/", "d/"}},
        {"/", {""}},
        {"", {NULL}},
        {"a::b", {NULL}},
        {":a", {NULL}},
        {"a:", {NULL}},
        {"a/../b", {NULL}},
        {"./a", {NULL}},
    };
    static const char *const names[] = {"trust", "no_headers"};
    (void)state;
    for (size_t k = 0; k < ARRAY_LEN(names); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            char option[64], named[32];
            snprintf(option, sizeof(option), "%s=%s", names[k], cases[i].value);
            snprintf(named, sizeof(named), "option '%s=", names[k]);
            const char *args[] = {"-o", option, "bucket", "/mnt", NULL};
            struct parsed p;
            parse(&p, args);
            if (cases[i].prefixes[0] == NULL) {
                if (p.rc != EINVAL || strstr(p.err, named) == NULL)
                    fail_msg("%s: accepted, or '%s'", option, p.err);
                parsed_free(&p);
                continue;
            }
            assert_int_equal(p.rc, 0);
            size_t n = 0;
            while (n < 4 && cases[i].prefixes[n] != NULL)
                n++;
            char **got = k == 0 ? p.opts.trusted : p.opts.headerless;
            assert_int_equal(k == 0 ? p.opts.trusted_count
                                    : p.opts.headerless_count, n);
            assert_int_equal(k == 0 ? p.opts.headerless_count
                                    : p.opts.trusted_count, 0);
            for (size_t j = 0; j < n; j++)
                assert_string_equal(got[j], cases[i].prefixes[j]);
            parsed_free(&p);
        }

    /* both at once */
    const char *args[] = {"-o", "trust=models,no_headers=data:/", "bucket",
                          "/mnt", NULL};
    struct parsed p;
    parse(&p, args);
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.opts.trusted_count, 1);
    assert_string_equal(p.opts.trusted[0], "models/");
    assert_int_equal(p.opts.headerless_count, 2);
    assert_string_equal(p.opts.headerless[0], "data/");
    assert_string_equal(p.opts.headerless[1], "");
    parsed_free(&p);
}

/* ---------------------------------------------- errors and freeing */

/* A small error buffer gets a terminated prefix; a NULL one is fine. */
static void test_error_buffer(void **state)
{
    const char *args[] = {"-o", "connections=0", "bucket", "/mnt", NULL};
    struct argv_buf ab;
    struct options opts;
    char small[12];
    char full[256];

    (void)state;
    argv_build(&ab, args);
    assert_int_equal(options_parse(ab.argc, ab.argv, &opts, full,
                                   sizeof(full)), EINVAL);
    options_free(&opts);

    memset(small, '#', sizeof(small));
    assert_int_equal(options_parse(ab.argc, ab.argv, &opts, small, 8),
                     EINVAL);
    options_free(&opts);
    assert_int_equal(strlen(small), 7);
    assert_memory_equal(small, full, 7);
    assert_memory_equal(small + 8, "####", 4);

    assert_int_equal(options_parse(ab.argc, ab.argv, &opts, NULL, 0), EINVAL);
    options_free(&opts);
    memset(small, '#', sizeof(small));
    assert_int_equal(options_parse(ab.argc, ab.argv, &opts, small, 0),
                     EINVAL);
    assert_int_equal(small[0], '#');
    options_free(&opts);
    argv_free(&ab);
}

/* options_free twice, after success and after failure, leaves NULLs. */
static void test_free_twice(void **state)
{
    static const char *const cases[][6] = {
        {"-o", "endpoint=http://x,region=r,profile=p", "bucket:a", "/mnt",
         NULL},
        {"-o", "credentials_file=/c,uid=bad", "bucket", "/mnt", NULL},
        {"-o", "secret_key=x", "bucket", "/mnt", NULL},
        {"bucket", NULL},
        {"--help", NULL},
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct parsed p;

        parse(&p, cases[i]);
        options_free(&p.opts);
        assert_null(p.opts.bucket);
        assert_null(p.opts.prefix);
        assert_null(p.opts.mountpoint);
        assert_null(p.opts.endpoint);
        assert_null(p.opts.region);
        assert_null(p.opts.profile);
        assert_null(p.opts.credentials_file);
        assert_null(p.opts.fuse_args.argv);
        options_free(&p.opts);
        argv_free(&p.ab);
    }
}

/* A zeroed struct that was never parsed can be freed too. */
static void test_free_zeroed(void **state)
{
    struct options opts;

    (void)state;
    memset(&opts, 0, sizeof(opts));
    options_free(&opts);
    options_free(&opts);
}

/* --help names every option the parser knows. */
static void test_help_mentions_options(void **state)
{
    static const char *const names[] = {
        "endpoint=", "region=", "profile=", "credentials_file=", "no_sign",
        "path_style", "uid=", "gid=", "file_mode=", "dir_mode=",
        "allow_other", "attr_ttl=", "dir_ttl=", "read_ahead=", "connections=",
        "retries=", "request_timeout=", "metrics=", "access_log=", "trust=",
        "-f", "-d", "--help", "--version",
        "PROGNAME-X",
    };
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);

    (void)state;
    assert_non_null(fp);
    options_print_help(fp, "PROGNAME-X");
    assert_int_equal(fclose(fp), 0);
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        if (strstr(text, names[i]) == NULL)
            fail_msg("help does not mention %s", names[i]);
    free(text);
}

/* The default cache directory is one per endpoint and bucket; the one
 * older versions used (per bucket) is named beside it. */
static void test_default_cache_dir(void **state)
{
    char *dir = NULL, *legacy = NULL, *other = NULL, *other_legacy = NULL;
    const char *base = geteuid() == 0 ? "/var/cache/s3cachefs" : NULL;
    char want[512];

    (void)state;
    if (base == NULL) {
        setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
        base = "/tmp/xdg/s3cachefs";
    }
    assert_int_equal(options_default_cache_dir("models", "http://127.0.0.1:9000",
                                               &dir, &legacy), 0);
    snprintf(want, sizeof(want), "%s/models@http:127.0.0.1:9000", base);
    assert_string_equal(dir, want);
    snprintf(want, sizeof(want), "%s/models", base);
    assert_string_equal(legacy, want);
    assert_int_equal(options_default_cache_dir("models",
                                               "https://s3.us-east-1.amazonaws.com",
                                               &other, &other_legacy), 0);
    snprintf(want, sizeof(want), "%s/models@s3.us-east-1.amazonaws.com", base);
    assert_string_equal(other, want);
    assert_string_equal(other_legacy, legacy);
    free(other);
    free(other_legacy);
    /* one host, http and https: two directories */
    assert_int_equal(options_default_cache_dir("models", "https://127.0.0.1:9000",
                                               &other, &other_legacy), 0);
    snprintf(want, sizeof(want), "%s/models@127.0.0.1:9000", base);
    assert_string_equal(other, want);
    free(dir);
    free(legacy);
    free(other);
    free(other_legacy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size_table),
        cmocka_unit_test(test_default_cache_dir),
        cmocka_unit_test(test_directory_lists),
        cmocka_unit_test(test_parse_mode_table),
        cmocka_unit_test(test_parse_seconds_table),
        cmocka_unit_test(test_option_table),
        cmocka_unit_test(test_option_forms),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_uid_gid_flags),
        cmocka_unit_test(test_first_error_wins),
        cmocka_unit_test(test_positional_table),
        cmocka_unit_test(test_bucket_length),
        cmocka_unit_test(test_flag_table),
        cmocka_unit_test(test_secret_table),
        cmocka_unit_test(test_fuse_args_table),
        cmocka_unit_test(test_writeback_with_ro),
        cmocka_unit_test(test_error_buffer),
        cmocka_unit_test(test_free_twice),
        cmocka_unit_test(test_free_zeroed),
        cmocka_unit_test(test_help_mentions_options),
    };

    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
