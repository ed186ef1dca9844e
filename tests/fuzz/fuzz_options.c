/*
 * fuzz_options.c - libFuzzer target for the command-line parser
 * (src/options.c).
 *
 * An input is the command line after argv[0], its arguments separated by
 * NUL bytes: "bucket\0/mnt\0-o\0cache=/c,ro" is what mount.fuse3 runs for
 * an fstab line (the options string is one argument after -o). Each
 * argument also goes through the value parsers on their own
 * (options_parse_size, _mode, _seconds).
 *
 * Beyond ASan and UBSan (and leaks, options_free() being called in every
 * case as options.h asks), the target checks options.h's promises: EINVAL
 * with one sentence in the error buffer, or options every one of which is
 * within the bounds the parser enforces (bucket name, normalised prefix,
 * block and cache sizes, counts, modes, durations, ro without writeback).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fuse_log.h>

#include "cmd/options.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz_options: %s:%d: check failed: %s\n",     \
                    __FILE__, __LINE__, #cond);                            \
            abort();                                                       \
        }                                                                  \
    } while (0)

#define MAX_ARGS 64

static bool bucket_ok(const char *name)
{
    size_t len = strlen(name);

    if (len < 3 || len > 255)
        return false;
    return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789.-_") == len;
}

/* "" or "a/b/": no leading slash, one trailing, no empty, "." or ".."
 * component. */
static bool prefix_ok(const char *prefix)
{
    const char *part = prefix;
    size_t len = strlen(prefix);

    if (len == 0)
        return true;
    if (prefix[0] == '/' || prefix[len - 1] != '/')
        return false;
    while (*part != '\0') {
        size_t n = strcspn(part, "/");

        if (n == 0 || (n == 1 && part[0] == '.') ||
            (n == 2 && part[0] == '.' && part[1] == '.'))
            return false;
        part += n + 1;
    }
    return true;
}

static void check_options(const struct options *o)
{
    CHECK(o->fuse_args.argc >= 1 && o->fuse_args.argv != NULL);
    if (o->show_help || o->show_version)
        return;
    CHECK(o->bucket != NULL && bucket_ok(o->bucket));
    CHECK(o->prefix != NULL && prefix_ok(o->prefix));
    CHECK(o->mountpoint != NULL);
    /* (NULL: not given; main.c chooses one per endpoint and bucket) */
    CHECK(o->cache_dir == NULL || o->cache_dir[0] != '\0');
    CHECK(!o->debug || o->foreground);
    CHECK(o->file_mode <= 07777 && o->dir_mode <= 07777);
    CHECK(isfinite(o->attr_ttl) && o->attr_ttl >= 0 &&
          o->attr_ttl <= 365.0 * 86400);
    CHECK(isfinite(o->dir_ttl) && o->dir_ttl >= 0 &&
          o->dir_ttl <= 365.0 * 86400);
    CHECK(o->read_ahead <= (1ull << 30));
    CHECK(o->connections >= 1 && o->connections <= 256);
    CHECK(o->retries <= 100);
    CHECK(o->block_size >= (64u << 10) && o->block_size <= (64u << 20) &&
          (o->block_size & (o->block_size - 1)) == 0);
    CHECK(o->cache_size == 0 || o->cache_size >= 16ull * o->block_size);
    CHECK(o->cache_min_free_ratio >= 0 && o->cache_min_free_ratio <= 1);
    CHECK(o->cache_min_free == 0 || o->cache_min_free_ratio == 0);
    CHECK(!(o->read_only && o->writeback));
}

/* One argument through the value parsers; what they accept is in range. */
static void fuzz_values(const char *arg)
{
    uint64_t bytes = 0;
    mode_t mode = 0;
    double seconds = -1;

    if (options_parse_size(arg, &bytes) == 0)
        CHECK(arg[0] != '-');
    if (options_parse_mode(arg, &mode) == 0)
        CHECK(mode <= 07777);
    if (options_parse_seconds(arg, &seconds) == 0)
        CHECK(isfinite(seconds) && seconds >= 0 && seconds <= 365.0 * 86400);
}

/* libfuse's complaints about bad arguments ("fuse: missing argument
 * after `-o'") would flood the fuzzer's output. */
static void quiet_log(enum fuse_log_level level, const char *fmt, va_list ap)
{
    (void)level;
    (void)fmt;
    (void)ap;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuse_set_log_func(quiet_log);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[MAX_ARGS + 2];
    char *text = malloc(size + 1);
    struct options opts;
    char errbuf[256];
    int argc = 0, rc;

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    argv[argc++] = (char *)"s3cachefs";
    for (size_t at = 0; at <= size && argc <= MAX_ARGS;) {
        argv[argc++] = text + at;
        at += strlen(text + at) + 1;
    }
    argv[argc] = NULL;
    for (int i = 1; i < argc; i++)
        fuzz_values(argv[i]);

    memset(errbuf, 'x', sizeof(errbuf));
    rc = options_parse(argc, argv, &opts, errbuf, sizeof(errbuf));
    CHECK(rc == 0 || rc == EINVAL || rc == ENOMEM || rc == ENOENT);
    if (rc != 0) {
        CHECK(memchr(errbuf, '\0', sizeof(errbuf)) != NULL);
        CHECK(errbuf[0] != '\0');
    } else {
        check_options(&opts);
    }
    options_free(&opts);
    options_free(&opts);                /* safe twice */
    free(text);
    return 0;
}
