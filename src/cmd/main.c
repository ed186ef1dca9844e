/*
 * main.c - s3cachefs entry point: parse options, resolve credentials, check
 * the bucket, mount, daemonize, serve, unmount.
 *
 * Everything that can fail because of user input fails before the mount,
 * with one sentence on stderr and exit status 1. Threads (request workers,
 * libfuse's loop) start only after fuse_daemonize() has forked.
 */
#include "config.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <fuse_lowlevel.h>
#include <systemd/sd-daemon.h>

#include "base/crash.h"
#include "base/log.h"
#include "cache/cache.h"
#include "cmd/mounts.h"
#include "cmd/metrics_http.h"
#include "cmd/metrics_text.h"
#include "cmd/options.h"
#include "cmd/refresh_cmd.h"
#include "cmd/tier_setup.h"
#include "cmd/tier_cmd.h"
#include "cmd/stats_cmd.h"
#include "cmd/sync_cmd.h"
#include "cmd/unmount_cmd.h"
#include "cmd/warm_cmd.h"
#include "creds/awsconfig.h"
#include "creds/credentials.h"
#include "creds/credsource.h"
#include "fs/access_log.h"
#include "fs/fs.h"
#include "fs/fuse_ops.h"
#include "s3/endpoint.h"
#include "s3/s3.h"
#include "writer/journal.h"
#include "writer/staging.h"

#define MULTIPART_THRESHOLD (16ull << 20)  /* larger files go multipart */
#define PART_SIZE (8ull << 20)             /* smallest part */

/* Whether the user gave FUSE option NAME (as "-oNAME..." or "-o" "NAME..."),
 * and where its value starts (after '=', up to ',' or the end) into
 * *VALUE (may be NULL; NULL when the option has none). */
static bool find_fuse_option(const struct fuse_args *args, const char *name,
                             const char **value)
{
    size_t name_len = strlen(name);

    for (int i = 0; i < args->argc; i++) {
        const char *opts = NULL;
        if (strcmp(args->argv[i], "-o") == 0 && i + 1 < args->argc)
            opts = args->argv[++i];
        else if (strncmp(args->argv[i], "-o", 2) == 0)
            opts = args->argv[i] + 2;
        for (const char *at = opts ? strstr(opts, name) : NULL; at != NULL;
             at = strstr(at + 1, name)) {
            bool starts = at == opts || at[-1] == ',';
            bool ends = at[name_len] == '\0' || at[name_len] == '=' ||
                        at[name_len] == ',';
            if (starts && ends) {
                if (value != NULL)
                    *value = at[name_len] == '=' ? at + name_len + 1 : NULL;
                return true;
            }
        }
    }
    return false;
}

static bool has_fuse_option(const struct fuse_args *args, const char *name)
{
    return find_fuse_option(args, name, NULL);
}

/* Add NAME[=VALUE] to the FUSE arguments unless the user gave NAME; VALUE
 * is escaped (a prefix may hold commas). Returns 0 or -1. */
static int add_fuse_default(struct fuse_args *args, const char *name,
                            const char *value)
{
    char *opts = NULL;
    char *option = NULL;
    int result = -1;

    if (has_fuse_option(args, name))
        return 0;
    if (value == NULL) {
        result = fuse_opt_add_opt(&opts, name);
    } else if (asprintf(&option, "%s=%s", name, value) >= 0) {
        result = fuse_opt_add_opt_escaped(&opts, option);
        free(option);
    }
    if (result == 0)
        result = fuse_opt_add_arg(args, "-o") == 0 &&
                 fuse_opt_add_arg(args, opts) == 0 ? 0 : -1;
    free(opts);
    return result;
}

/* cache_size, or 80% of the cache directory's filesystem by default. */
static uint64_t cache_size_limit(const struct options *opts)
{
    struct statvfs st;

    if (opts->cache_size != 0)
        return opts->cache_size;
    if (statvfs(opts->cache_dir, &st) != 0)
        return 10ull << 30;
    return (uint64_t)((double)st.f_blocks * (double)st.f_frsize * 0.8);
}

/*
 * -o cache= when it was not given: one directory per endpoint and bucket
 * (options_default_cache_dir()), or the one per bucket of older versions
 * while it exists and no other endpoint's cache is recorded in it (so an
 * upgrade keeps its cache and, above all, its journal).
 */
static int choose_cache_dir(struct options *opts, const struct cache_identity *mine)
{
    char *dir = NULL, *legacy = NULL;
    struct stat st;
    int err = options_default_cache_dir(opts->bucket, mine->endpoint, &dir,
                                        &legacy);

    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s\n", err == ENOENT
                ? "no cache directory: set -o cache=DIR (HOME is not an "
                  "absolute path)" : strerror(err));
        return err;
    }
    if (stat(dir, &st) != 0 && stat(legacy, &st) == 0 && S_ISDIR(st.st_mode) &&
        cache_dir_is_for(legacy, mine)) {
        free(dir);
        dir = legacy;
        legacy = NULL;
    }
    opts->cache_dir = dir;
    free(legacy);
    return 0;
}

/*
 * Bind the locked cache directory to this mount's identity
 * (cache_dir_claim()), counting what its journal and staging files still
 * owe a bucket. Before daemonizing: a refusal is one sentence on stderr.
 */
static int claim_cache_dir(const char *cache_dir, const struct cache_identity *mine)
{
    char errbuf[1024] = "", *journal_dir = NULL;
    uint64_t entries = 0, marks = 0;
    struct staging_dir *staging = NULL;
    int err = 0;

    if (asprintf(&journal_dir, "%s/journal", cache_dir) < 0)
        return ENOMEM;
    err = journal_peek(journal_dir, &entries, errbuf, sizeof(errbuf));
    free(journal_dir);
    if (err == 0)
        err = staging_dir_open(cache_dir, &staging);
    if (err == 0)
        err = staging_count_marks(staging, &marks);
    staging_dir_close(&staging);
    if (err == 0)
        err = cache_dir_claim(cache_dir, mine, entries + marks, errbuf,
                              sizeof(errbuf));
    if (err != 0)
        fprintf(stderr, "s3cachefs: %s\n", errbuf[0] ? errbuf : strerror(err));
    return err;
}

/* Where the keys came from, for messages ("none (no_sign)" without). */
static const char *keys_origin(const struct credentials *creds,
                               const struct awsconfig *aws)
{
    if (creds != NULL)
        return credentials_source_name(creds);
    return aws->credentials_source != NULL ? aws->credentials_source
                                           : "nowhere";
}

static const char *endpoint_name(const struct awsconfig *aws)
{
    return aws->endpoint != NULL ? aws->endpoint : "AWS S3";
}

/* The sentence for a failed bucket check. */
static void report_check_failure(const struct options *opts,
                                 const struct awsconfig *aws,
                                 const struct credentials *creds,
                                 const struct s3_failure *why)
{
    const char *hint = "";

    switch (why->err) {
    case ENOENT:
        fprintf(stderr, "s3cachefs: bucket '%s' does not exist at %s\n",
                opts->bucket, endpoint_name(aws));
        return;
    case EACCES:
        if (!why->server_answered)
            break; /* TLS verification, not the credentials */
        fprintf(stderr,
                "s3cachefs: %s refused access to bucket '%s' with credentials "
                "from %s: %s\n",
                endpoint_name(aws), opts->bucket, keys_origin(creds, aws),
                why->description);
        return;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case ECONNRESET:
        hint = "; check -o endpoint and the network";
        break;
    default:
        break;
    }
    fprintf(stderr, "s3cachefs: cannot reach bucket '%s' at %s: %s%s\n",
            opts->bucket, endpoint_name(aws), why->description, hint);
}

/* The mount point must be a directory; it is made absolute, since the
 * daemon runs in "/" (libfuse unmounts by that path on a signal). */
static int check_mountpoint(char **path)
{
    struct stat st;
    char *absolute;

    if (stat(*path, &st) != 0) {
        fprintf(stderr, "s3cachefs: mount point %s: %s\n", *path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "s3cachefs: mount point %s is not a directory\n", *path);
        return -1;
    }
    absolute = realpath(*path, NULL);
    if (absolute == NULL) {
        fprintf(stderr, "s3cachefs: mount point %s: %s\n", *path, strerror(errno));
        return -1;
    }
    free(*path);
    *path = absolute;
    return 0;
}

/*
 * The kernel reads ahead on a FUSE mount no further than the smaller of
 * what init asked for (FUSE_OPS_MAX_READAHEAD) and the read_ahead_kb of the
 * mount's bdi, 128 KiB by default: sequential reads then reach the daemon
 * as 128 KiB requests, and a re-read from the cache ran at two thirds of
 * the speed it has with 1 MiB requests. Raise the bdi's limit for this
 * mount. The device number comes from /proc/self/mountinfo (a stat of the
 * mount point would wait for the daemon, which does not serve yet). Only
 * root may write the file; otherwise the default stays, said in the debug
 * log.
 */
static void raise_read_ahead(const char *mountpoint)
{
    unsigned want_kb = FUSE_OPS_MAX_READAHEAD >> 10;
    unsigned major = 0, minor = 0, current_kb = 0;
    struct mounts_entry *mount = malloc(sizeof(*mount));
    bool found = mount != NULL && mounts_at(mountpoint, mount) &&
                 strncmp(mount->type, "fuse", 4) == 0;

    if (found) {
        major = mount->major; /* (the last one is the newest mount) */
        minor = mount->minor;
    }
    free(mount);
    if (!found)
        return;

    char path[128];
    snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", major, minor);
    FILE *setting = fopen(path, "r+");
    if (setting == NULL) {
        log_debug("read-ahead of the mount stays at the default: %s: %s", path,
                  strerror(errno));
        return;
    }
    if (fscanf(setting, "%u", &current_kb) == 1 && current_kb < want_kb) {
        rewind(setting);
        fprintf(setting, "%u\n", want_kb);
    }
    if (fclose(setting) != 0)
        log_debug("read-ahead of the mount stays at the default: %s: %s", path,
                  strerror(errno));
}

/* AWS_CA_BUNDLE, made absolute for the same reason; NULL if unset. */
static int resolve_ca_bundle(char **out)
{
    const char *bundle = getenv("AWS_CA_BUNDLE");

    *out = NULL;
    if (bundle == NULL || bundle[0] == '\0')
        return 0;
    *out = realpath(bundle, NULL);
    if (*out == NULL) {
        fprintf(stderr, "s3cachefs: AWS_CA_BUNDLE %s: %s\n", bundle, strerror(errno));
        return -1;
    }
    return 0;
}

/* What the endpoint of -o metrics renders from. */
struct metrics_source {
    struct fs *fs;
    struct cache *cache;
    double start_time;
};

static int render_metrics(void *arg, char **text, size_t *len)
{
    struct metrics_source *source = arg;
    struct fs_stats stats;

    fs_get_stats(source->fs, &stats);
    struct metrics_snapshot snapshot = {
        .stats = &stats,
        .block_size = cache_block_size(source->cache),
        .start_time = source->start_time,
        .version = PACKAGE_VERSION,
    };
    return metrics_text_render(&snapshot, text, len);
}

/* Everything a mount holds, from its options to its fs layer: each step
 * of main() makes some of it, daemon_end() frees what was made. */
struct daemon {
    struct options opts;
    struct awsconfig aws;
    struct credentials *creds;
    char *ca_bundle;
    char *endpoint_id, *destination; /* whose the cache is */
    struct cache_identity identity;
    struct s3_client *s3;
    struct tier_setup *shared;
    int cache_lock_fd;
    struct metrics_http *metrics;
    struct access_log *access_log;
    struct fuse_session *session;
    struct fuse_loop_config *loop_config;
    struct fuse_ops_context context;
    bool mounted, handlers;
    sigset_t mask_before;         /* the signal mask before the loop's */
    struct cache *cache;
    struct journal *journal;
    struct metrics_source metrics_source;
    struct timespec started;
    int status;                   /* the exit status */
    char errbuf[512];
};

/* A command (`--unmount`, `stats`, `sync`, `pending`, `warm`,
 * `shared-cache prune`, `refresh`) when ARGV is one: its exit status;
 * -1 when ARGV is a mount. A word that names a command but is followed
 * by no mount of ours is a bucket's name (the command's own test). */
static int run_command(int argc, char **argv)
{
    if (unmount_cmd_requested(argc, argv))
        return unmount_cmd_main(argc, argv);
    if (stats_cmd_requested(argc, argv))
        return stats_cmd_main(argc, argv);
    if (sync_cmd_requested(argc, argv))
        return sync_cmd_main(argc, argv);
    if (warm_cmd_requested(argc, argv))
        return warm_cmd_main(argc, argv);
    if (tier_cmd_requested(argc, argv))
        return tier_cmd_main(argc, argv);
    if (refresh_cmd_requested(argc, argv))
        return refresh_cmd_main(argc, argv);
    return -1;
}

/* The options, and --help or --version (then status 0 and done): 0 to go
 * on, -1 to stop. */
static int parse_options(struct daemon *d, int argc, char **argv)
{
    if (options_parse(argc, argv, &d->opts, d->errbuf, sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    if (d->opts.show_help) {
        options_print_help(stdout, "s3cachefs");
        d->status = 0;
        return -1;
    }
    if (d->opts.show_version) {
        printf("s3cachefs %s\n", PACKAGE_VERSION);
        printf("libfuse %s, %s\n", fuse_pkgversion(), curl_version());
        d->status = 0;
        return -1;
    }
    log_set_level(d->opts.debug ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO);
    return 0;
}

/* The FUSE session, from our defaults and the user's FUSE options, which
 * libfuse checks here, before any network I/O. */
static int make_session(struct daemon *d)
{
    struct options *opts = &d->opts;
    char fsname[300], max_read[24];
    const char *user_max_read = NULL;

    snprintf(fsname, sizeof(fsname), "%s%s%s", opts->bucket,
             opts->prefix[0] ? ":" : "", opts->prefix);
    /* reads no larger than libfuse can splice (fuse_ops.h), unless the
     * user says otherwise (init must then ask for the same) */
    if (find_fuse_option(&opts->fuse_args, "max_read", &user_max_read) &&
        user_max_read != NULL)
        fuse_ops_set_read_size((size_t)strtoul(user_max_read, NULL, 10));
    snprintf(max_read, sizeof(max_read), "%zu", fuse_ops_read_size());
    if (add_fuse_default(&opts->fuse_args, "fsname", fsname) != 0 ||
        add_fuse_default(&opts->fuse_args, "subtype", "s3cachefs") != 0 ||
        add_fuse_default(&opts->fuse_args, "max_read", max_read) != 0 ||
        add_fuse_default(&opts->fuse_args, "default_permissions", NULL) != 0) {
        fprintf(stderr, "s3cachefs: out of memory\n");
        return -1;
    }
    d->session = fuse_session_new(&opts->fuse_args, fuse_ops_table(),
                                  sizeof(*fuse_ops_table()), &d->context);
    if (d->session == NULL) {
        fprintf(stderr, "s3cachefs: unknown or invalid mount option (see the "
                        "line above and s3cachefs --help)\n");
        return -1;
    }
    d->context.session = d->session; /* (refresh: the kernel's entries) */
    return 0;
}

/* Where the bucket is and whose the cache will be: the AWS settings, the
 * mount point, the CA bundle, the endpoint's identity, the default cache
 * directory, and the keys (their first fetch here, so that a source that
 * fails fails the mount). */
static int resolve_bucket(struct daemon *d)
{
    struct options *opts = &d->opts;
    struct awsconfig_options aws_opts = {
        .profile = opts->profile,
        .credentials_file = opts->credentials_file,
        .region = opts->region,
        .endpoint = opts->endpoint,
        .no_sign = opts->no_sign,
        .allow_no_credentials = true,
    };

    if (awsconfig_resolve(&aws_opts, &d->aws, d->errbuf, sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    if (check_mountpoint(&opts->mountpoint) != 0 ||
        resolve_ca_bundle(&d->ca_bundle) != 0)
        return -1;
    /* whose the cache is, and so whose its journal's entries are */
    d->errbuf[0] = '\0';
    if (endpoint_identity(d->aws.endpoint, d->aws.region, &d->endpoint_id,
                          d->errbuf, sizeof(d->errbuf)) != 0 ||
        asprintf(&d->destination, "%s/%s", d->endpoint_id, opts->bucket) < 0) {
        d->destination = NULL;
        fprintf(stderr, "s3cachefs: %s\n",
                d->errbuf[0] ? d->errbuf : strerror(ENOMEM));
        return -1;
    }
    d->identity = (struct cache_identity){
        .endpoint = d->endpoint_id, .bucket = opts->bucket, .prefix = opts->prefix,
    };
    if (opts->cache_dir == NULL && choose_cache_dir(opts, &d->identity) != 0)
        return -1;
    if (opts->no_sign)
        return 0;
    struct credsource_conf source_conf = {.aws = &d->aws,
                                          .ca_bundle = d->ca_bundle};
    struct credentials_source source;
    if (credsource_choose(&source_conf, &source, d->errbuf,
                          sizeof(d->errbuf)) != 0 ||
        credentials_create(&source, NULL, &d->creds, d->errbuf,
                           sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: cannot get credentials: %s\n", d->errbuf);
        return -1;
    }
    return 0;
}

/* The S3 client, the bucket checked with one request, and the shared
 * cache's client (so that a mistake in its options fails the mount). */
static int check_bucket(struct daemon *d)
{
    struct options *opts = &d->opts;
    struct s3_conf s3_conf = {
        .endpoint = d->aws.endpoint,
        .region = d->aws.region,
        .bucket = opts->bucket,
        .path_style = opts->path_style,
        .credentials = d->creds,
        .ca_bundle = d->ca_bundle,
        .max_connections = opts->connections,
        .max_retries = opts->retries,
        .request_timeout = opts->request_timeout,
    };
    struct s3_failure why;

    d->errbuf[0] = '\0';
    if (s3_client_create(&s3_conf, &d->s3, d->errbuf, sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n",
                d->errbuf[0] ? d->errbuf : "cannot create the S3 client");
        return -1;
    }
    if (s3_check_bucket(d->s3, opts->prefix, &why) != 0) {
        report_check_failure(opts, &d->aws, d->creds, &why);
        return -1;
    }
    if (tier_setup_open(opts, &d->aws, d->creds, d->ca_bundle, &d->shared,
                        d->errbuf, sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    return 0;
}

/* The cache directory locked, made absolute (the daemon runs in /) and
 * bound to this mount's identity; the metrics port bound (a port in use
 * fails the mount; served once the daemon has forked) and the access log
 * opened (the name may be relative). */
static int claim_cache(struct daemon *d)
{
    struct options *opts = &d->opts;

    if (cache_lock_dir(opts->cache_dir, &d->cache_lock_fd, d->errbuf,
                       sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    char *cache_dir = realpath(opts->cache_dir, NULL);
    if (cache_dir == NULL) {
        fprintf(stderr, "s3cachefs: cache directory %s: %s\n", opts->cache_dir,
                strerror(errno));
        return -1;
    }
    free(opts->cache_dir);
    opts->cache_dir = cache_dir;
    if (claim_cache_dir(cache_dir, &d->identity) != 0)
        return -1;
    unmount_cmd_report_clear(cache_dir); /* an earlier run's (the lock is ours) */
    if (opts->metrics != NULL &&
        metrics_http_listen(opts->metrics, &d->metrics, d->errbuf,
                            sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    if (opts->access_log != NULL &&
        access_log_open(opts->access_log, opts->mountpoint, opts->prefix,
                        &d->access_log, d->errbuf, sizeof(d->errbuf)) != 0) {
        fprintf(stderr, "s3cachefs: %s\n", d->errbuf);
        return -1;
    }
    return 0;
}

/* Mounted, detached (unless -f), logging to syslog when detached, and the
 * signals that stop the mount blocked for every thread from here on. */
static int mount_and_detach(struct daemon *d)
{
    struct options *opts = &d->opts;

    if (fuse_set_signal_handlers(d->session) != 0)
        return -1;
    d->handlers = true;
    if (fuse_session_mount(d->session, opts->mountpoint) != 0) {
        fprintf(stderr, "s3cachefs: cannot mount on %s\n", opts->mountpoint);
        return -1;
    }
    d->mounted = true;
    raise_read_ahead(opts->mountpoint);
    int io_err = fuse_ops_use_io(d->session);
    if (io_err != 0 && io_err != ENOSYS)
        fprintf(stderr, "s3cachefs: cannot take over the session's I/O (%s): "
                        "lookups in one directory will run one at a time\n",
                strerror(io_err));
    /* Only a daemon in the foreground is a service's main process: one
     * that forks must not speak for whatever started it (sd_notify) */
    if (!opts->foreground)
        unsetenv("NOTIFY_SOCKET");
    if (fuse_daemonize(opts->foreground) != 0)
        return -1;
    if (!opts->foreground)
        log_use_syslog();
    /* The signals that stop the mount must reach this thread, the one that
     * waits in libfuse's loop: its handler sets "exited" on whichever
     * thread takes the signal, and only this thread's wait is broken by
     * it. The threads started from here on (ours, and those they start)
     * inherit the mask, so they never take one; a signal that comes
     * before the loop waits, pending, until it starts (libfuse blocks
     * them in its own workers too). Before, a SIGINT sent while this
     * thread had signals blocked for a moment (pthread_create) could be
     * taken by a worker of ours, and the loop slept until a request came
     * (`test_signal_unmounts` hung once in CI). */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    sigaddset(&stop_signals, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, &d->mask_before);
    return 0;
}

/* In the daemon (LMDB and threads must not cross the fork): the cache,
 * the journal, the shared cache's writers. Errors are logged: the mount
 * is in place. */
static int open_storage(struct daemon *d)
{
    struct options *opts = &d->opts;
    struct cache_conf cache_conf = {
        .dir = opts->cache_dir,
        .bucket = opts->bucket,
        .size_limit = cache_size_limit(opts),
        .min_free_bytes = opts->cache_min_free,
        .min_free_ratio = opts->cache_min_free_ratio,
        .block_size = opts->block_size,
    };

    if (cache_open(&cache_conf, d->cache_lock_fd, &d->cache, d->errbuf,
                   sizeof(d->errbuf)) != 0) {
        log_error("cannot start: %s", d->errbuf);
        return -1;
    }
    d->cache_lock_fd = -1; /* the cache owns it now */
    if (!opts->read_only) {
        char *journal_dir = NULL;
        if (asprintf(&journal_dir, "%s/journal", cache_dir_path(d->cache)) < 0) {
            log_error("cannot start: %s", strerror(ENOMEM));
            return -1;
        }
        int opened = journal_open(journal_dir, d->destination, &d->journal,
                                  d->errbuf, sizeof(d->errbuf));
        free(journal_dir);
        if (opened != 0) {
            log_error("cannot start: %s", d->errbuf);
            return -1;
        }
    }
    if (d->shared != NULL && tier_setup_start(d->shared, d->cache) != 0) {
        log_error("cannot start the shared cache: %s", strerror(ENOMEM));
        return -1;
    }
    return 0;
}

/* The fs layer over them, its recovery, and the metrics endpoint. Errors
 * are logged. */
static int start_fs(struct daemon *d)
{
    struct options *opts = &d->opts;
    struct fs_conf fs_conf = {
        .cache = d->cache,
        .root_key = opts->prefix,
        .uid = opts->uid,
        .gid = opts->gid,
        .uid_forced = opts->uid_set,
        .gid_forced = opts->gid_set,
        .file_mode = opts->file_mode,
        .dir_mode = opts->dir_mode,
        .attr_ttl = opts->attr_ttl,
        .dir_ttl = opts->dir_ttl,
        .read_ahead = opts->read_ahead,
        .listing_memory = (size_t)opts->listing_memory,
        .connections = opts->connections,
        .journal = d->journal,
        .writeback = opts->writeback,
        .multipart_threshold = MULTIPART_THRESHOLD,
        .part_size = PART_SIZE,
        .access_log = d->access_log,
        .trusted = (const char *const *)opts->trusted,
        .trusted_count = opts->trusted_count,
        .headerless = (const char *const *)opts->headerless,
        .headerless_count = opts->headerless_count,
        .tier = tier_setup_tier(d->shared),
    };
    int err = fs_create(&fs_conf, d->s3, &d->context.fs);
    if (err == 0)
        err = fs_recover(d->context.fs);
    if (err != 0) {
        log_error("cannot start: %s", strerror(err));
        return -1;
    }
    if (d->metrics != NULL) {
        d->metrics_source = (struct metrics_source){
            .fs = d->context.fs,
            .cache = d->cache,
            .start_time = (double)d->started.tv_sec + d->started.tv_nsec / 1e9,
        };
        /* (the mount goes on without its endpoint: logged) */
        if (metrics_http_start(d->metrics, render_metrics, &d->metrics_source,
                               d->errbuf, sizeof(d->errbuf)) != 0) {
            log_error("%s", d->errbuf);
            metrics_http_stop(&d->metrics);
        }
    }
    return 0;
}

/* libfuse's loop until the unmount or a signal that stops it (success). */
static void serve(struct daemon *d)
{
    struct options *opts = &d->opts;

    log_info("mounted bucket '%s'%s%s at %s", opts->bucket,
             opts->prefix[0] ? " prefix " : "", opts->prefix, opts->mountpoint);
    /* a unit of Type=notify is started now (nothing without NOTIFY_SOCKET):
     * the mount is in place, its requests wait for the loop below */
    sd_notifyf(0, "READY=1\nSTATUS=serving bucket '%s'%s%s at %s", opts->bucket,
               opts->prefix[0] ? " prefix " : "", opts->prefix, opts->mountpoint);
    d->loop_config = fuse_loop_cfg_create();
    if (d->loop_config == NULL)
        return;
    fuse_loop_cfg_set_max_threads(d->loop_config, opts->connections * 2 + 4);
    fuse_loop_cfg_set_idle_threads(d->loop_config, 8);
    /* The loop returns the number of the signal that stopped it: being
     * told to unmount is success. */
    pthread_sigmask(SIG_SETMASK, &d->mask_before, NULL);
    int loop_result = fuse_session_loop_mt(d->session, d->loop_config);
    d->status = loop_result == 0 || loop_result == SIGTERM ||
                loop_result == SIGINT || loop_result == SIGHUP ? 0 : 1;
    log_info("unmounting %s", opts->mountpoint);
    sd_notify(0, "STOPPING=1\nSTATUS=unmounting");
}

/* A mount that failed before mounting, of a bucket named like a command
 * whose mount point is no mount of ours: the sentence says which it was. */
static void explain_command_word(const struct daemon *d, int argc, char **argv)
{
    if (d->status == 0 || d->mounted || argc <= 2 || argv[2][0] == '-')
        return;
    if (strcmp(argv[1], "stats") == 0)
        fprintf(stderr, "s3cachefs: (this was the mount of a bucket named "
                "'stats': %s is not an s3cachefs mount for 's3cachefs stats' "
                "to report on)\n", argv[2]);
    if (strcmp(argv[1], "sync") == 0 || strcmp(argv[1], "pending") == 0)
        fprintf(stderr, "s3cachefs: (this was the mount of a bucket named "
                "'%s': %s is not an s3cachefs mount for 's3cachefs %s' to "
                "ask)\n", argv[1], argv[2], argv[1]);
    if (strcmp(argv[1], "warm") == 0)
        fprintf(stderr, "s3cachefs: (this was the mount of a bucket named "
                "'warm': %s is not inside an s3cachefs mount for 's3cachefs "
                "warm' to fetch)\n", argv[2]);
}

/* Unmounted (if mounted); what waits for its upload goes now, before
 * exiting; everything freed. A second SIGTERM (a shutdown that does not
 * wait) must not cut the uploads short: the node may be gone before
 * another mount could finish them. */
static void daemon_end(struct daemon *d)
{
    if (d->mounted)
        fuse_session_unmount(d->session);
    if (d->handlers)
        fuse_remove_signal_handlers(d->session);
    if (d->session != NULL)
        fuse_session_destroy(d->session);
    if (d->loop_config != NULL)
        fuse_loop_cfg_destroy(d->loop_config);
    if (d->context.fs != NULL) {
        struct fs_stats stats;
        fs_get_stats(d->context.fs, &stats);
        if (stats.uploads_pending > 0) {
            signal(SIGTERM, SIG_IGN);
            signal(SIGINT, SIG_IGN);
            signal(SIGHUP, SIG_IGN);
            log_info("uploading %llu file%s before exiting",
                     (unsigned long long)stats.uploads_pending,
                     stats.uploads_pending == 1 ? "" : "s");
            sd_notifyf(0, "STATUS=uploading %llu file%s before exiting",
                       (unsigned long long)stats.uploads_pending,
                       stats.uploads_pending == 1 ? "" : "s");
        }
        uint64_t left = fs_drain(d->context.fs);
        if (left > 0)
            d->status = 1; /* kept in the journal for the next mount (logged) */
        /* what --unmount, which is not our parent, tells its caller */
        unmount_cmd_report_write(d->opts.cache_dir, left);
    }
    /* (served until the uploads above are done: they are counted) */
    metrics_http_stop(&d->metrics);
    fs_destroy(&d->context.fs);
    tier_setup_close(&d->shared);
    access_log_close(&d->access_log);
    journal_close(&d->journal);
    cache_close(&d->cache);
    if (d->cache_lock_fd >= 0)
        close(d->cache_lock_fd);
    s3_client_destroy(&d->s3);
    credentials_destroy(&d->creds);
    awsconfig_clear(&d->aws);
    free(d->ca_bundle);
    free(d->endpoint_id);
    free(d->destination);
    options_free(&d->opts);
}

int main(int argc, char **argv)
{
    static struct daemon state; /* (zeroed: nothing made yet) */
    struct daemon *d = &state;

    crash_report_install(); /* a fault says where it was (crash.h) */
    int command = run_command(argc, argv);
    if (command >= 0)
        return command;
    d->cache_lock_fd = -1;
    d->status = 1;
    clock_gettime(CLOCK_REALTIME, &d->started);
    /* the process is about to hold credentials: no core dump of it (and
     * the secrets themselves are in MADV_DONTDUMP pages, secret.h) */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "s3cachefs: cannot initialise libcurl\n");
        return 1;
    }
    if (parse_options(d, argc, argv) == 0 && make_session(d) == 0 &&
        resolve_bucket(d) == 0 && check_bucket(d) == 0 &&
        claim_cache(d) == 0 && mount_and_detach(d) == 0 &&
        open_storage(d) == 0 && start_fs(d) == 0)
        serve(d);
    explain_command_word(d, argc, argv);
    daemon_end(d);
    curl_global_cleanup();
    return d->status;
}
