/*
 * fuzz_awsconfig.c - libFuzzer target for the credentials and config
 * resolution (src/awsconfig.c): the ~/.aws/config and ~/.aws/credentials
 * dialect, -o credentials_file, the AWS_* environment and the options.
 *
 * An input is two flag bytes, then fields separated by the byte 0x1e
 * (ASCII record separator), in this order:
 *   0 the config file         (AWS_CONFIG_FILE names it, flag F_CONFIG)
 *   1 the credentials file    (AWS_SHARED_CREDENTIALS_FILE, F_CREDENTIALS)
 *   2 the -o credentials_file (F_CREDFILE; mode 0600, or 0644 with
 *                             F_CREDFILE_LOOSE, which must be refused)
 *   3 -o profile   4 AWS_PROFILE   5 -o region   6 AWS_REGION
 *   7 AWS_DEFAULT_REGION   8 -o endpoint   9 AWS_ENDPOINT_URL
 *   10 AWS_ENDPOINT_URL_S3
 * Missing fields are empty (unset). Each file is a memfd made for this
 * input alone (named by /proc/self/fd/N, closed before returning), so the
 * files the parser reads hold exactly the bytes fuzzed, NULs and all. The
 * home directory does not exist (the default ~/.aws files are missing),
 * or with F_NO_HOME there is none at all. Environment values are cut at
 * the first line end and trimmed, as a shell would hand them over.
 *
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, when
 * set (F_ENV_*), hold marker values; beyond ASan, UBSan and leaks, the
 * target checks that no marker ever reaches the error message (unless
 * the input itself spells it), that a failure returns a listed errno with
 * a sentence and an empty result, and that a success has a region, both
 * keys or neither (no_sign), and values free of line ends and of the
 * blanks that trimming removes.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "creds/awsconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz_awsconfig: %s:%d: check failed: %s\n",   \
                    __FILE__, __LINE__, #cond);                            \
            abort();                                                       \
        }                                                                  \
    } while (0)

enum {
    F_CONFIG = 1 << 0,
    F_CREDENTIALS = 1 << 1,
    F_CREDFILE = 1 << 2,
    F_CREDFILE_LOOSE = 1 << 3,
    F_NO_SIGN = 1 << 4,
    F_ENV_ACCESS = 1 << 5,
    F_ENV_SECRET = 1 << 6,
    F_ENV_TOKEN = 1 << 7,
    /* second byte */
    F_NO_HOME = 1 << 8,
    F_TILDE = 1 << 9,         /* AWS_CONFIG_FILE as "~/..." */
};

enum {
    FIELD_CONFIG,
    FIELD_CREDENTIALS,
    FIELD_CREDFILE,
    FIELD_OPT_PROFILE,
    FIELD_ENV_PROFILE,
    FIELD_OPT_REGION,
    FIELD_ENV_REGION,
    FIELD_ENV_DEFAULT_REGION,
    FIELD_OPT_ENDPOINT,
    FIELD_ENV_ENDPOINT,
    FIELD_ENV_ENDPOINT_S3,
    FIELD_COUNT
};

#define SEPARATOR 0x1e
#define MISSING_HOME "/nonexistent/fuzz_awsconfig-home"
#define MARKER_ACCESS "AKIAFUZZMARKER0ACCESS"
#define MARKER_SECRET "fuzzmarker/secret/0123456789abcdefghij"
#define MARKER_TOKEN "fuzzmarker/token/ZYXWVUTSRQPONMLKJIHG"

static const char *const env_vars[] = {
    "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE",
    "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "HOME",
};

struct field {
    const uint8_t *data;
    size_t len;
};

/* A memfd holding LEN bytes of DATA with mode MODE; its path in PATH.
 * Returns the descriptor, or -1. */
static int memfd_file(const struct field *f, mode_t mode, char *path,
                      size_t path_len)
{
    int fd = memfd_create("fuzz_awsconfig", MFD_CLOEXEC);
    size_t done = 0;

    if (fd < 0)
        return -1;
    while (done < f->len) {
        ssize_t n = write(fd, f->data + done, f->len - done);

        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    if (fchmod(fd, mode) != 0) {
        close(fd);
        return -1;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

/* FIELD as a C string: up to the first NUL or line end, blanks trimmed,
 * NULL when empty. Malloc'd. */
static char *field_text(const struct field *f)
{
    size_t start = 0, end = 0;
    char *s;

    while (end < f->len && f->data[end] != '\0' && f->data[end] != '\n' &&
           f->data[end] != '\r')
        end++;
    while (start < end && strchr(" \t\v\f", f->data[start]) != NULL)
        start++;
    while (end > start && strchr(" \t\v\f", f->data[end - 1]) != NULL)
        end--;
    if (end == start)
        return NULL;
    s = malloc(end - start + 1);
    if (s == NULL)
        abort();
    memcpy(s, f->data + start, end - start);
    s[end - start] = '\0';
    return s;
}

static void set_env(const char *name, const char *value)
{
    if (value != NULL)
        setenv(name, value, 1);
}

static bool input_has(const uint8_t *data, size_t size, const char *text)
{
    return memmem(data, size, text, strlen(text)) != NULL;
}

static bool blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* A value that came out of a file or a trimmed variable. */
static void check_value(const char *value)
{
    size_t len;

    if (value == NULL)
        return;
    len = strlen(value);
    CHECK(len > 0);
    CHECK(strchr(value, '\n') == NULL);
    CHECK(!blank(value[0]) && !blank(value[len - 1]));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct field fields[FIELD_COUNT] = {{0}};
    char *text[FIELD_COUNT] = {0};
    char paths[3][64], tilde[80];
    int fds[3] = {-1, -1, -1};
    struct awsconfig_options opts = {0};
    struct awsconfig cfg;
    char errbuf[512];
    unsigned flags;
    size_t at, n = 0;
    int rc;

    if (size < 2)
        return 0;
    flags = data[0] | (unsigned)data[1] << 8;
    for (at = 2; n < FIELD_COUNT; n++) {
        const uint8_t *sep = memchr(data + at, SEPARATOR, size - at);
        size_t len = sep != NULL ? (size_t)(sep - (data + at)) : size - at;

        fields[n].data = data + at;
        fields[n].len = len;
        if (sep == NULL)
            break;
        at += len + 1;
    }
    for (size_t i = FIELD_CREDFILE + 1; i < FIELD_COUNT; i++)
        text[i] = field_text(&fields[i]);

    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++)
        unsetenv(env_vars[i]);
    if (flags & F_CONFIG) {
        fds[0] = memfd_file(&fields[FIELD_CONFIG], 0644, paths[0],
                            sizeof(paths[0]));
        if (fds[0] < 0)
            goto out;
        if (flags & F_TILDE) {
            /* "~/" + the path: resolved against the home directory */
            snprintf(tilde, sizeof(tilde), "~/../../..%s", paths[0]);
            setenv("AWS_CONFIG_FILE", tilde, 1);
        } else {
            setenv("AWS_CONFIG_FILE", paths[0], 1);
        }
    }
    if (flags & F_CREDENTIALS) {
        fds[1] = memfd_file(&fields[FIELD_CREDENTIALS], 0600, paths[1],
                            sizeof(paths[1]));
        if (fds[1] < 0)
            goto out;
        setenv("AWS_SHARED_CREDENTIALS_FILE", paths[1], 1);
    }
    if (flags & F_CREDFILE) {
        fds[2] = memfd_file(&fields[FIELD_CREDFILE],
                            flags & F_CREDFILE_LOOSE ? 0644 : 0600, paths[2],
                            sizeof(paths[2]));
        if (fds[2] < 0)
            goto out;
        opts.credentials_file = paths[2];
    }
    if (flags & F_ENV_ACCESS)
        setenv("AWS_ACCESS_KEY_ID", MARKER_ACCESS, 1);
    if (flags & F_ENV_SECRET)
        setenv("AWS_SECRET_ACCESS_KEY", MARKER_SECRET, 1);
    if (flags & F_ENV_TOKEN)
        setenv("AWS_SESSION_TOKEN", MARKER_TOKEN, 1);
    set_env("AWS_PROFILE", text[FIELD_ENV_PROFILE]);
    set_env("AWS_REGION", text[FIELD_ENV_REGION]);
    set_env("AWS_DEFAULT_REGION", text[FIELD_ENV_DEFAULT_REGION]);
    set_env("AWS_ENDPOINT_URL", text[FIELD_ENV_ENDPOINT]);
    set_env("AWS_ENDPOINT_URL_S3", text[FIELD_ENV_ENDPOINT_S3]);
    opts.profile = text[FIELD_OPT_PROFILE];
    opts.region = text[FIELD_OPT_REGION];
    opts.endpoint = text[FIELD_OPT_ENDPOINT];
    opts.no_sign = (flags & F_NO_SIGN) != 0;
    if (!(flags & F_NO_HOME)) {
        if (flags & F_TILDE)
            opts.home = "/"; /* so that "~/../../../proc/..." resolves */
        else
            opts.home = MISSING_HOME;
    }

    memset(errbuf, 'x', sizeof(errbuf));
    rc = awsconfig_resolve(&opts, &cfg, errbuf, sizeof(errbuf));
    CHECK(memchr(errbuf, '\0', sizeof(errbuf)) != NULL);
    if (!input_has(data, size, MARKER_ACCESS))
        CHECK(strstr(errbuf, MARKER_ACCESS) == NULL);
    if (!input_has(data, size, MARKER_SECRET))
        CHECK(strstr(errbuf, MARKER_SECRET) == NULL);
    if (!input_has(data, size, MARKER_TOKEN))
        CHECK(strstr(errbuf, MARKER_TOKEN) == NULL);
    if (rc != 0) {
        static const struct awsconfig empty;

        CHECK(rc == EACCES || rc == ENOENT || rc == EINVAL || rc == ENOMEM);
        CHECK(errbuf[0] != '\0');
        CHECK(memcmp(&cfg, &empty, sizeof(cfg)) == 0);
        goto out;
    }
    if ((flags & F_CREDFILE) && (flags & F_CREDFILE_LOOSE) &&
        !opts.no_sign)
        CHECK(!"a credentials file readable by others was accepted");
    CHECK(cfg.region != NULL);
    CHECK(cfg.credentials_source != NULL);
    if (opts.no_sign) {
        CHECK(cfg.access_key == NULL && cfg.secret_key == NULL &&
              cfg.session_token == NULL);
    } else {
        CHECK(cfg.access_key != NULL && cfg.secret_key != NULL);
    }
    check_value(cfg.access_key);
    check_value(cfg.secret_key);
    check_value(cfg.session_token);
    check_value(cfg.region);
    check_value(cfg.endpoint);
    check_value(cfg.profile);
    awsconfig_clear(&cfg);
    awsconfig_clear(&cfg);              /* safe twice */
out:
    for (size_t i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    for (size_t i = 0; i < FIELD_COUNT; i++)
        free(text[i]);
    return 0;
}
