/*
 * options.c - command-line parsing (see options.h).
 *
 * fuse_opt does the splitting: our own -o options are matched by template
 * into a struct of strings, then validated and converted in one place so
 * every error message has the same shape ("option 'X': ..."). Everything
 * we do not know goes on to libfuse, which rejects what it does not know
 * either.
 */
#include "config.h"

#include "cmd/options.h"
#include "s3/s3.h"                 /* S3_REQUEST_TIMEOUT_DEFAULT */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_ATTR_TTL 1.0
#define DEFAULT_DIR_TTL 1.0
#define DEFAULT_READ_AHEAD (64u << 20)
#define DEFAULT_LISTING_MEMORY (64u << 20)
#define MIN_LISTING_MEMORY (1u << 20)
#define DEFAULT_CONNECTIONS 16
#define DEFAULT_RETRIES 6
#define DEFAULT_REQUEST_TIMEOUT S3_REQUEST_TIMEOUT_DEFAULT
#define MIN_REQUEST_TIMEOUT 1.0
#define MAX_REQUEST_TIMEOUT 3600.0
#define MAX_CONNECTIONS 256
#define DEFAULT_MIN_FREE_RATIO 0.05
#define DEFAULT_BLOCK_SIZE (1u << 20)
#define MIN_BLOCK_SIZE (64u << 10)
#define MAX_BLOCK_SIZE (64u << 20)
#define MIN_CACHE_BLOCKS 16

/* Raw option strings as fuse_opt stores them. */
struct raw_options {
    char *endpoint, *region, *profile, *credentials_file, *cache_dir;
    char *uid, *gid, *file_mode, *dir_mode;
    char *attr_ttl, *dir_ttl, *read_ahead, *listing_memory, *connections;
    char *retries;
    char *request_timeout, *metrics, *access_log, *trust, *no_headers;
    char *shared_cache, *shared_cache_endpoint, *shared_cache_region;
    char *shared_cache_profile;
    char *cache_size, *cache_min_free, *block_size;
    int no_sign, path_style, allow_other, read_only, writeback;
};

enum option_key {
    KEY_HELP,
    KEY_VERSION,
    KEY_FOREGROUND,
    KEY_DEBUG,
    KEY_SECRET,
};

/* fuse_opt hands one pointer to templates and to process_arg alike. */
struct parse_state {
    struct raw_options raw;
    struct options *opts;
    int positional;
    char *error;          /* first error, malloc'd */
};

#define RAW(templ, field) {templ, offsetof(struct parse_state, raw.field), 0}
#define FLAG(templ, field) {templ, offsetof(struct parse_state, raw.field), 1}

static const struct fuse_opt option_spec[] = {
    RAW("endpoint=%s", endpoint),
    RAW("region=%s", region),
    RAW("profile=%s", profile),
    RAW("credentials_file=%s", credentials_file),
    RAW("cache=%s", cache_dir),
    RAW("uid=%s", uid),
    RAW("gid=%s", gid),
    RAW("file_mode=%s", file_mode),
    RAW("dir_mode=%s", dir_mode),
    RAW("attr_ttl=%s", attr_ttl),
    RAW("dir_ttl=%s", dir_ttl),
    RAW("read_ahead=%s", read_ahead),
    RAW("listing_memory=%s", listing_memory),
    RAW("connections=%s", connections),
    RAW("retries=%s", retries),
    RAW("request_timeout=%s", request_timeout),
    RAW("metrics=%s", metrics),
    RAW("access_log=%s", access_log),
    RAW("trust=%s", trust),
    RAW("no_headers=%s", no_headers),
    RAW("shared_cache=%s", shared_cache),
    RAW("shared_cache_endpoint=%s", shared_cache_endpoint),
    RAW("shared_cache_region=%s", shared_cache_region),
    RAW("shared_cache_profile=%s", shared_cache_profile),
    RAW("cache_size=%s", cache_size),
    RAW("cache_min_free=%s", cache_min_free),
    RAW("block_size=%s", block_size),
    FLAG("no_sign", no_sign),
    FLAG("writeback", writeback),
    FLAG("path_style", path_style),
    /* Kept for libfuse as well (the kernel enforces them). */
    FLAG("allow_other", allow_other),
    FLAG("ro", read_only),
    FUSE_OPT_KEY("allow_other", FUSE_OPT_KEY_KEEP),
    FUSE_OPT_KEY("ro", FUSE_OPT_KEY_KEEP),
    /* Secrets are never taken from argv (visible in ps and fstab), nor
     * passed on: libfuse's "unknown option" message would show them. */
    FUSE_OPT_KEY("access_key=", KEY_SECRET),
    FUSE_OPT_KEY("secret_key=", KEY_SECRET),
    FUSE_OPT_KEY("session_token=", KEY_SECRET),
    FUSE_OPT_KEY("aws_access_key_id=", KEY_SECRET),
    FUSE_OPT_KEY("aws_secret_access_key=", KEY_SECRET),
    FUSE_OPT_KEY("aws_session_token=", KEY_SECRET),
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_KEY("-V", KEY_VERSION),
    FUSE_OPT_KEY("--version", KEY_VERSION),
    FUSE_OPT_KEY("-f", KEY_FOREGROUND),
    FUSE_OPT_KEY("-d", KEY_DEBUG),
    FUSE_OPT_KEY("debug", KEY_DEBUG),
    FUSE_OPT_END,
};


__attribute__((format(printf, 2, 3)))
static void set_error(struct parse_state *state, const char *fmt, ...)
{
    va_list ap;

    if (state->error != NULL)
        return;
    va_start(ap, fmt);
    if (vasprintf(&state->error, fmt, ap) < 0)
        state->error = NULL;
    va_end(ap);
}

static int process_arg(void *data, const char *arg, int key,
                       struct fuse_args *outargs)
{
    struct parse_state *state = data;
    struct options *opts = state->opts;

    switch (key) {
    case KEY_HELP:
        opts->show_help = true;
        return 0;
    case KEY_VERSION:
        opts->show_version = true;
        return 0;
    case KEY_FOREGROUND:
        opts->foreground = true;
        return 0;
    case KEY_DEBUG:
        opts->debug = true;
        opts->foreground = true;
        return 0;
    case KEY_SECRET:
        set_error(state,
                  "option '%.*s': credentials are never taken from the command "
                  "line; use the environment, a profile or -o credentials_file",
                  (int)strcspn(arg, "="), arg);
        return -1;
    case FUSE_OPT_KEY_NONOPT:
        if (state->positional == 0) {
            const char *colon = strchr(arg, ':');
            size_t bucket_len = colon ? (size_t)(colon - arg) : strlen(arg);
            opts->bucket = strndup(arg, bucket_len);
            opts->prefix = strdup(colon ? colon + 1 : "");
            if (opts->bucket == NULL || opts->prefix == NULL) {
                set_error(state, "%s", "out of memory");
                return -1;
            }
        } else if (state->positional == 1) {
            opts->mountpoint = strdup(arg);
            if (opts->mountpoint == NULL) {
                set_error(state, "%s", "out of memory");
                return -1;
            }
        } else {
            set_error(state, "unexpected argument '%s'", arg);
            return -1;
        }
        state->positional++;
        return 0;
    default:
        return 1; /* FUSE_OPT_KEY_OPT and the rest: pass on to libfuse */
    }
    (void)outargs;
}

int options_parse_size(const char *text, uint64_t *out)
{
    char *end = NULL;
    double value;
    double multiplier = 1;

    if (text == NULL || text[0] == '\0' || text[0] == '-')
        return EINVAL;
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text || !isfinite(value) || value < 0)
        return EINVAL;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': multiplier = 1024.0; end++; break;
    case 'm': case 'M': multiplier = 1024.0 * 1024; end++; break;
    case 'g': case 'G': multiplier = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': multiplier = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: return EINVAL;
    }
    /* Accept "64KiB"/"64KB" as well as "64K". */
    if (multiplier > 1 && (end[0] == 'i' || end[0] == 'I'))
        end++;
    if (multiplier > 1 && (end[0] == 'b' || end[0] == 'B'))
        end++;
    if (*end != '\0')
        return EINVAL;
    value *= multiplier;
    if (value >= 18446744073709551616.0)
        return EINVAL;
    *out = (uint64_t)value;
    return 0;
}

int options_parse_mode(const char *text, mode_t *out)
{
    char *end = NULL;
    unsigned long value;

    if (text == NULL || text[0] == '\0' || text[0] == '-' || text[0] == '+')
        return EINVAL;
    errno = 0;
    value = strtoul(text, &end, 8);
    if (errno != 0 || *end != '\0' || value > 07777)
        return EINVAL;
    *out = (mode_t)value;
    return 0;
}

int options_parse_seconds(const char *text, double *out)
{
    char *end = NULL;
    double value;

    if (text == NULL || text[0] == '\0')
        return EINVAL;
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) ||
        value < 0 || value > 365.0 * 86400)
        return EINVAL;
    *out = value;
    return 0;
}

static int parse_id(const char *text, unsigned long *out)
{
    char *end = NULL;

    if (text == NULL || text[0] < '0' || text[0] > '9')
        return EINVAL;
    errno = 0;
    *out = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || *out >= 0xffffffffUL)
        return EINVAL;
    return 0;
}

static int parse_count(const char *text, unsigned min, unsigned max,
                       unsigned *out)
{
    unsigned long value;

    if (parse_id(text, &value) != 0 || value < min || value > max)
        return EINVAL;
    *out = (unsigned)value;
    return 0;
}

/* S3 bucket names: 3-63 of [a-z0-9.-]; other S3 servers allow upper case
 * and underscores, so accept those too, but nothing that needs escaping. */
static bool bucket_name_ok(const char *name)
{
    size_t len = strlen(name);

    if (len < 3 || len > 255)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_'))
            return false;
    }
    return true;
}

/* "a/b", "/a/b/", "a/b/" -> "a/b/"; "" or "/" -> "". EINVAL on an empty
 * or dot component. */
static int normalize_prefix(char **prefix)
{
    const char *in = *prefix;
    size_t len;
    char *out;

    while (*in == '/')
        in++;
    len = strlen(in);
    while (len > 0 && in[len - 1] == '/')
        len--;
    out = malloc(len + 2);
    if (out == NULL)
        return ENOMEM;
    memcpy(out, in, len);
    out[len] = '\0';
    for (const char *part = out; len > 0 && part != NULL;) {
        const char *slash = strchr(part, '/');
        size_t part_len = slash ? (size_t)(slash - part) : strlen(part);
        if (part_len == 0 || (part_len == 1 && part[0] == '.') ||
            (part_len == 2 && part[0] == '.' && part[1] == '.')) {
            free(out);
            return EINVAL;
        }
        part = slash ? slash + 1 : NULL;
    }
    if (len > 0) {
        out[len] = '/';
        out[len + 1] = '\0';
    }
    free(*prefix);
    *prefix = out;
    return 0;
}

/* -o shared_cache=BUCKET[:PREFIX] and its companions into OUT. 0,
 * EINVAL or ENOMEM. */
static int parse_shared_cache(struct raw_options *raw, struct options *out)
{
    const char *text = raw->shared_cache;
    const char *colon = strchr(text, ':');

    out->tier_bucket = strndup(text, colon ? (size_t)(colon - text) : strlen(text));
    out->tier_prefix = strdup(colon ? colon + 1 : "");
    if (out->tier_bucket == NULL || out->tier_prefix == NULL)
        return ENOMEM;
    if (!bucket_name_ok(out->tier_bucket))
        return EINVAL;
    int err = normalize_prefix(&out->tier_prefix);
    if (err != 0)
        return err;
    out->tier_endpoint = raw->shared_cache_endpoint;
    out->tier_region = raw->shared_cache_region;
    out->tier_profile = raw->shared_cache_profile;
    raw->shared_cache_endpoint = raw->shared_cache_region = NULL;
    raw->shared_cache_profile = NULL;
    return 0;
}

/* TEXT ("a/b:c", directories of the mount separated by ':'; "/" the
 * whole mount) added to *DIRS (*COUNT of them), each normalized as a
 * prefix ("a/b/", "c/", "" for the whole mount): -o trust, -o
 * no_headers. 0, EINVAL or ENOMEM. */
static int parse_dirs(const char *text, char ***dirs, size_t *count)
{
    char *copy = strdup(text), *save = NULL;
    int err = 0;

    if (copy == NULL)
        return ENOMEM;
    /* (no empty entry) */
    if (text[0] == '\0' || text[0] == ':' || text[strlen(text) - 1] == ':' ||
        strstr(text, "::") != NULL)
        err = EINVAL;
    for (char *part = strtok_r(copy, ":", &save); err == 0 && part != NULL;
         part = strtok_r(NULL, ":", &save)) {
        char *prefix = strdup(part);
        char **grown = realloc(*dirs, (*count + 1) * sizeof(*grown));
        if (prefix == NULL || grown == NULL) {
            free(prefix);
            if (grown != NULL)
                *dirs = grown;
            err = ENOMEM;
            break;
        }
        *dirs = grown;
        err = normalize_prefix(&prefix);
        if (err != 0) {
            free(prefix);
            break;
        }
        (*dirs)[(*count)++] = prefix;
    }
    free(copy);
    return err;
}

/* What parse_dirs() made of *DIRS, freed; none left. */
static void free_dirs(char ***dirs, size_t *count)
{
    for (size_t i = 0; i < *count; i++)
        free((*dirs)[i]);
    free(*dirs);
    *dirs = NULL;
    *count = 0;
}

int options_default_cache_dir(const char *bucket, const char *endpoint,
                              char **out, char **legacy)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    const char *scheme_end = strstr(endpoint, "://");
    const char *host = scheme_end != NULL ? scheme_end + 3 : endpoint;
    /* https, what every service in production speaks, is left out; plain
     * http is named (http:HOST), so that the two never share one */
    bool plain = strncmp(endpoint, "http://", 7) == 0;
    char *base = NULL;
    int n;

    *out = *legacy = NULL;
    if (geteuid() == 0)
        n = asprintf(&base, "/var/cache/s3cachefs");
    else if (xdg != NULL && xdg[0] == '/')
        n = asprintf(&base, "%s/s3cachefs", xdg);
    else if (home != NULL && home[0] == '/')
        n = asprintf(&base, "%s/.cache/s3cachefs", home);
    else
        return ENOENT;
    if (n < 0)
        return ENOMEM;
    /* (a bucket name has no '@' and no '/', a host no '/' and no "http:"
     * before it: the names of two endpoints or buckets never meet, nor
     * those of older versions) */
    if (asprintf(out, "%s/%s@%s%s", base, bucket, plain ? "http:" : "",
                 host) < 0) {
        *out = NULL;
        free(base);
        return ENOMEM;
    }
    if (asprintf(legacy, "%s/%s", base, bucket) < 0) {
        *legacy = NULL;
        free(*out);
        *out = NULL;
        free(base);
        return ENOMEM;
    }
    free(base);
    return 0;
}

static void set_defaults(struct options *opts)
{
    opts->uid = getuid();
    opts->gid = getgid();
    opts->file_mode = 0644;
    opts->dir_mode = 0755;
    opts->attr_ttl = DEFAULT_ATTR_TTL;
    opts->dir_ttl = DEFAULT_DIR_TTL;
    opts->read_ahead = DEFAULT_READ_AHEAD;
    opts->listing_memory = DEFAULT_LISTING_MEMORY;
    opts->connections = DEFAULT_CONNECTIONS;
    opts->retries = DEFAULT_RETRIES;
    opts->request_timeout = DEFAULT_REQUEST_TIMEOUT;
    opts->cache_min_free_ratio = DEFAULT_MIN_FREE_RATIO;
    opts->block_size = DEFAULT_BLOCK_SIZE;
}

/* "20G" -> bytes (ratio 0), "10%" -> ratio 0.10 (bytes 0). */
static int parse_size_or_percent(const char *text, uint64_t *bytes, double *ratio)
{
    size_t len = strlen(text);

    if (len > 1 && text[len - 1] == '%') {
        char *end = NULL;
        errno = 0;
        double percent = strtod(text, &end);
        if (errno != 0 || end != text + len - 1 || !(percent >= 0 && percent <= 100))
            return EINVAL;
        *ratio = percent / 100;
        *bytes = 0;
        return 0;
    }
    if (options_parse_size(text, bytes) != 0)
        return EINVAL;
    *ratio = 0;
    return 0;
}

/* Check and convert the raw strings; the first error wins. */
static void convert_raw(const struct raw_options *raw, struct options *opts,
                        struct parse_state *state)
{
    unsigned long id = 0;

    opts->no_sign = raw->no_sign;
    opts->path_style = raw->path_style;
    opts->allow_other = raw->allow_other;
    opts->read_only = raw->read_only;
    opts->writeback = raw->writeback;
    if (raw->uid != NULL) {
        if (parse_id(raw->uid, &id) != 0) {
            set_error(state, "option 'uid=%s': expected a numeric user id", raw->uid);
        } else {
            opts->uid = (uid_t)id;
            opts->uid_set = true;
        }
    }
    if (raw->gid != NULL) {
        if (parse_id(raw->gid, &id) != 0) {
            set_error(state, "option 'gid=%s': expected a numeric group id", raw->gid);
        } else {
            opts->gid = (gid_t)id;
            opts->gid_set = true;
        }
    }
    if (raw->file_mode != NULL && options_parse_mode(raw->file_mode, &opts->file_mode) != 0)
        set_error(state, "option 'file_mode=%s': expected octal permission bits such as 0644", raw->file_mode);
    if (raw->dir_mode != NULL && options_parse_mode(raw->dir_mode, &opts->dir_mode) != 0)
        set_error(state, "option 'dir_mode=%s': expected octal permission bits such as 0755", raw->dir_mode);
    if (raw->attr_ttl != NULL && options_parse_seconds(raw->attr_ttl, &opts->attr_ttl) != 0)
        set_error(state, "option 'attr_ttl=%s': expected seconds, such as 1 or 0.5", raw->attr_ttl);
    if (raw->dir_ttl != NULL && options_parse_seconds(raw->dir_ttl, &opts->dir_ttl) != 0)
        set_error(state, "option 'dir_ttl=%s': expected seconds, such as 1 or 0.5", raw->dir_ttl);
    if (raw->read_ahead != NULL &&
        (options_parse_size(raw->read_ahead, &opts->read_ahead) != 0 ||
         opts->read_ahead > (1ull << 30)))
        set_error(state, "option 'read_ahead=%s': expected a size up to 1G, such as 64M", raw->read_ahead);
    if (raw->listing_memory != NULL &&
        (options_parse_size(raw->listing_memory, &opts->listing_memory) != 0 ||
         opts->listing_memory < MIN_LISTING_MEMORY))
        set_error(state, "option 'listing_memory=%s': expected a size of at least 1M, "
                         "such as 64M", raw->listing_memory);
    if (raw->connections != NULL &&
        parse_count(raw->connections, 1, MAX_CONNECTIONS, &opts->connections) != 0)
        set_error(state, "option 'connections=%s': expected a number from 1 to 256", raw->connections);
    if (raw->retries != NULL && parse_count(raw->retries, 0, 100, &opts->retries) != 0)
        set_error(state, "option 'retries=%s': expected a number from 0 to 100", raw->retries);
    if (raw->request_timeout != NULL &&
        (options_parse_seconds(raw->request_timeout, &opts->request_timeout) != 0 ||
         opts->request_timeout < MIN_REQUEST_TIMEOUT ||
         opts->request_timeout > MAX_REQUEST_TIMEOUT))
        set_error(state, "option 'request_timeout=%s': expected seconds from "
                  "1 to 3600, such as 30", raw->request_timeout);
    if (raw->cache_min_free != NULL &&
        parse_size_or_percent(raw->cache_min_free, &opts->cache_min_free,
                              &opts->cache_min_free_ratio) != 0)
        set_error(state, "option 'cache_min_free=%s': expected a size such as 20G or a percentage such as 10%%", raw->cache_min_free);
    uint64_t block_size = 0;
    if (raw->block_size != NULL) {
        if (options_parse_size(raw->block_size, &block_size) != 0 ||
            block_size < MIN_BLOCK_SIZE || block_size > MAX_BLOCK_SIZE ||
            (block_size & (block_size - 1)) != 0)
            set_error(state, "option 'block_size=%s': expected a power of two from 64K to 64M, such as 1M", raw->block_size);
        else
            opts->block_size = (uint32_t)block_size;
    }
    if (raw->cache_size != NULL &&
        (options_parse_size(raw->cache_size, &opts->cache_size) != 0 ||
         opts->cache_size < MIN_CACHE_BLOCKS * (uint64_t)opts->block_size))
        set_error(state, "option 'cache_size=%s': expected a size of at least "
                  "%u blocks (%uM with block_size=%uK), such as 100G",
                  raw->cache_size, MIN_CACHE_BLOCKS,
                  MIN_CACHE_BLOCKS * (opts->block_size >> 10) >> 10,
                  opts->block_size >> 10);
}

static void free_raw(struct raw_options *raw)
{
    char **fields[] = {&raw->endpoint, &raw->region, &raw->profile,
                       &raw->credentials_file, &raw->cache_dir,
                       &raw->cache_size, &raw->cache_min_free, &raw->block_size,
                       &raw->uid, &raw->gid, &raw->file_mode, &raw->dir_mode,
                       &raw->attr_ttl, &raw->dir_ttl, &raw->read_ahead,
                       &raw->listing_memory,
                       &raw->connections, &raw->retries,
                       &raw->request_timeout, &raw->metrics,
                       &raw->access_log, &raw->trust, &raw->no_headers,
                       &raw->shared_cache,
                       &raw->shared_cache_endpoint, &raw->shared_cache_region,
                       &raw->shared_cache_profile};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        free(*fields[i]);
        *fields[i] = NULL;
    }
}

int options_parse(int argc, char **argv, struct options *out, char *errbuf,
                  size_t errlen)
{
    struct parse_state state = {.opts = out};
    struct raw_options *raw = &state.raw;
    int err = 0;

    memset(out, 0, sizeof(*out));
    set_defaults(out);
    out->fuse_args = (struct fuse_args)FUSE_ARGS_INIT(argc, argv);
    /* fuse_opt_parse copies what it keeps, so outargs never alias argv */
    if (fuse_opt_parse(&out->fuse_args, &state, option_spec, process_arg) != 0) {
        err = EINVAL;
        if (state.error == NULL)
            set_error(&state, "%s", "invalid command line (see --help)");
        goto out;
    }
    /* Strings we keep move into the options struct. */
    out->endpoint = raw->endpoint;
    out->region = raw->region;
    out->profile = raw->profile;
    out->credentials_file = raw->credentials_file;
    out->cache_dir = raw->cache_dir;
    out->metrics = raw->metrics;
    out->access_log = raw->access_log;
    raw->endpoint = raw->region = raw->profile = raw->credentials_file = NULL;
    raw->cache_dir = raw->metrics = raw->access_log = NULL;
    convert_raw(raw, out, &state);
    if (state.error != NULL) {
        err = EINVAL;
        goto out;
    }
    if (out->show_help || out->show_version)
        goto out;
    if (out->bucket == NULL || out->mountpoint == NULL) {
        set_error(&state, "%s", "usage: s3cachefs [options] BUCKET[:PREFIX] MOUNTPOINT (see --help)");
        err = EINVAL;
        goto out;
    }
    if (!bucket_name_ok(out->bucket)) {
        set_error(&state, "invalid bucket name '%s': expected 3 to 255 characters of letters, digits, '.', '-' and '_'", out->bucket);
        err = EINVAL;
        goto out;
    }
    if (out->cache_dir != NULL && out->cache_dir[0] == '\0') {
        set_error(&state, "%s", "option 'cache=': expected a directory");
        err = EINVAL;
        goto out;
    }
    err = normalize_prefix(&out->prefix);
    if (err == EINVAL)
        set_error(&state, "invalid prefix '%s': it has an empty, '.' or '..' component", out->prefix);
    if (err != 0)
        goto out;
    const struct {
        const char *name, *text;
        char ***dirs;
        size_t *count;
    } dir_options[] = {
        {"trust", raw->trust, &out->trusted, &out->trusted_count},
        {"no_headers", raw->no_headers, &out->headerless, &out->headerless_count},
    };
    for (size_t i = 0; i < sizeof(dir_options) / sizeof(dir_options[0]); i++) {
        if (dir_options[i].text == NULL)
            continue;
        err = parse_dirs(dir_options[i].text, dir_options[i].dirs,
                         dir_options[i].count);
        if (err == EINVAL)
            set_error(&state, "option '%s=%s': expected directories of the "
                      "mount separated by ':', such as datasets/imagenet:models "
                      "(no empty, '.' or '..' component)", dir_options[i].name,
                      dir_options[i].text);
        if (err != 0)
            goto out;
    }
    if (raw->shared_cache != NULL) {
        err = parse_shared_cache(raw, out);
        if (err == EINVAL)
            set_error(&state, "option 'shared_cache=%s': expected "
                      "BUCKET[:PREFIX], a bucket name of 3 to 255 letters, "
                      "digits, '.', '-' and '_' and a prefix without empty, "
                      "'.' or '..' components", raw->shared_cache);
        if (err != 0)
            goto out;
        if (out->tier_endpoint == NULL && strcmp(out->tier_bucket, out->bucket) == 0 &&
            strncmp(out->tier_prefix, out->prefix, strlen(out->prefix)) == 0) {
            set_error(&state, "option 'shared_cache=%s': the shared cache "
                      "would show inside the mount; give it a prefix outside "
                      "'%s' or a bucket of its own", raw->shared_cache,
                      out->prefix);
            err = EINVAL;
            goto out;
        }
    } else if (raw->shared_cache_endpoint != NULL ||
               raw->shared_cache_region != NULL ||
               raw->shared_cache_profile != NULL) {
        set_error(&state, "%s", "the shared_cache_* options need "
                  "-o shared_cache=BUCKET[:PREFIX]");
        err = EINVAL;
        goto out;
    }
    if (raw->read_only && raw->writeback) {
        set_error(&state, "%s", "-o writeback and -o ro do not go together");
        err = EINVAL;
    }
out:
    if (err != 0 && errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen, "%s", state.error ? state.error : strerror(err));
    free(state.error);
    free_raw(raw);
    return err;
}

void options_free(struct options *opts)
{
    char **fields[] = {&opts->bucket, &opts->prefix, &opts->mountpoint,
                       &opts->endpoint, &opts->region, &opts->profile,
                       &opts->credentials_file, &opts->cache_dir,
                       &opts->metrics, &opts->access_log,
                       &opts->tier_bucket, &opts->tier_prefix,
                       &opts->tier_endpoint, &opts->tier_region,
                       &opts->tier_profile};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        free(*fields[i]);
        *fields[i] = NULL;
    }
    free_dirs(&opts->trusted, &opts->trusted_count);
    free_dirs(&opts->headerless, &opts->headerless_count);
    fuse_opt_free_args(&opts->fuse_args);
}

void options_print_help(FILE *fp, const char *progname)
{
    fprintf(fp,
"usage: %s [-f] [-d] [-o OPTION[,OPTION...]] BUCKET[:PREFIX] MOUNTPOINT\n"
"\n"
"Mount an S3-compatible bucket (or the keys under PREFIX) at MOUNTPOINT.\n"
"Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/\n"
"AWS_SESSION_TOKEN, a profile in ~/.aws, or -o credentials_file=PATH.\n"
"\n"
"  -f                     stay in the foreground, log to stderr\n"
"  -d                     debug log (implies -f)\n"
"  -h, --help             this help\n"
"  -V, --version          print the version\n"
"\n"
"S3 options:\n"
"  -o endpoint=URL        S3 endpoint (default: AWS for the region)\n"
"  -o region=NAME         signing region (default: us-east-1)\n"
"  -o profile=NAME        profile in ~/.aws/credentials and ~/.aws/config\n"
"  -o credentials_file=PATH  credentials in ~/.aws/credentials format\n"
"                         (must not be readable by group or others)\n"
"  -o no_sign             send unsigned requests (public buckets)\n"
"  -o path_style          path-style addressing (default for endpoint=)\n"
"  -o connections=N       parallel requests to the bucket (default %d)\n"
"  -o retries=N           retries of a failed request (default %d)\n"
"  -o request_timeout=SECONDS  a request's deadline, retries included,\n"
"                         before the time its bytes take (default %g)\n"
"\n"
"File attributes:\n"
"  -o uid=N, -o gid=N     owner of every file, overriding s3fs headers\n"
"                         (default: headers, else the user mounting)\n"
"  -o file_mode=OCTAL     permissions of files without an s3fs mode\n"
"                         header (default 0644)\n"
"  -o dir_mode=OCTAL      directory permissions (default 0755)\n"
"  -o allow_other         let other users access the mount\n"
"  -o ro                  read-only mount\n"
"  -o writeback           close() returns at once; uploads run in the\n"
"                         background (journaled; fsync and unmount wait)\n"
"\n"
"Block cache (data read once stays on local disk, across remounts):\n"
"  -o cache=DIR           cache directory (default /var/cache/s3cachefs/BUCKET@HOST\n"
"                         for root, else $XDG_CACHE_HOME/s3cachefs/BUCKET@HOST\n"
"                         or ~/.cache/s3cachefs/BUCKET@HOST; HOST is the\n"
"                         endpoint's host[:port], after \"http:\" for http)\n"
"  -o cache_size=SIZE     largest size of the cache (default 80%% of its\n"
"                         filesystem)\n"
"  -o cache_min_free=SIZE|PCT  free space to leave on that filesystem\n"
"                         (default 5%%)\n"
"  -o block_size=SIZE     unit of caching and fetching (default 1M)\n"
"\n"
"Metadata and reading:\n"
"  -o attr_ttl=SECONDS    trust file attributes this long (default %g)\n"
"  -o dir_ttl=SECONDS     trust directory listings this long (default %g)\n"
"  -o read_ahead=SIZE     largest read-ahead window per file (default 64M)\n"
"  -o listing_memory=SIZE  memory kept for directory listings (default\n"
"                         64M); the least recently used go first\n"
"\n"
"Operating it:\n"
"  -o metrics=[ADDR:]PORT  serve the counters for Prometheus at\n"
"                         http://ADDR:PORT/metrics (ADDR: 127.0.0.1\n"
"                         unless named; off by default)\n"
"  -o access_log=FILE     append the path of each file opened for reading\n"
"                         (once per version), for s3cachefs warm --from\n"
"  -o trust=DIR[:DIR...]  directories that never change: their listings\n"
"                         and attributes are trusted until unmount, and\n"
"                         across remounts (no request once listed)\n"
"  -o no_headers=DIR[:DIR...]  directories of objects without s3fs headers\n"
"                         (written by other tools): attributes from\n"
"                         listings, no HEAD (no links, modes or owners)\n"
"\n"
"A cache shared by a cluster's nodes:\n"
"  -o shared_cache=BUCKET[:PREFIX]  a second bucket, near the nodes, asked\n"
"                         for blocks before the bucket mounted, and given\n"
"                         what the bucket sent\n"
"  -o shared_cache_endpoint=URL, shared_cache_region=REGION,\n"
"  -o shared_cache_profile=NAME  where it is and the credentials for it\n"
"                         (default: the mounted bucket's)\n"
"\n"
"Commands: s3cachefs stats|sync|pending MOUNTPOINT, s3cachefs warm PATH...,\n"
"s3cachefs --unmount MOUNTPOINT (each with --help).\n"
"\n"
"See s3cachefs(1) for details.\n",
            progname, DEFAULT_CONNECTIONS, DEFAULT_RETRIES,
            DEFAULT_REQUEST_TIMEOUT, DEFAULT_ATTR_TTL, DEFAULT_DIR_TTL);
}
