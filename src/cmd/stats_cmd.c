/*
 * stats_cmd.c - `s3cachefs stats MOUNTPOINT` (see stats_cmd.h): find the
 * mount, ask its daemon, print.
 *
 * The order of the checks gives each failure its own sentence: the path
 * (exists?), /proc/self/mountinfo (a mount point? of what type?), then
 * the daemon (user.s3cachefs.pid: an s3cachefs? alive? answering?). Every
 * getxattr() on the mount runs in a child process (ask_daemon()), so that
 * a stuck daemon costs 5 seconds and an error, not a hung command: the
 * child is killed, which ends its FUSE request, where a thread would stay
 * blocked in this process.
 *
 * --watch blocks SIGINT and SIGTERM and takes them only inside ppoll(),
 * so one that comes between two waits is not lost: the loop stops at the
 * next wait at the latest, and the command exits 0.
 */
#include "config.h"

#include "cmd/stats_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "base/clock.h"
#include "cmd/mounts.h"
#include "cmd/prices.h"
#include "cmd/stats_report.h"
#include "ctl/stats_text.h"
#include "fs/fs.h"

#define EXIT_OK 0
#define EXIT_FAILED 1
#define EXIT_USAGE 2

#define ASK_TIMEOUT_MS 5000         /* how long the daemon gets to answer */
#define XATTR_VALUE_MAX 65536       /* the kernel's limit for one value */
#define PRICE_FILE_MAX 65536
#define WATCH_DEFAULT 1.0
#define WATCH_MIN 0.05
#define WATCH_MAX 86400.0
#define DEFAULT_BLOCK_SIZE (1u << 20)  /* options.c's, when -o block_size is not given */
#define MIN_BLOCK_SIZE (64u << 10)
#define MAX_BLOCK_SIZE (64u << 20)

/* The signal that ends --watch (0: none yet), and the mask that lets it
 * in: the one ppoll() waits with. */
static volatile sig_atomic_t stop_signal;
static sigset_t wait_mask;

struct stats_args {
    const char *mountpoint;
    bool json;
    bool watch;
    double interval;        /* seconds */
    const char *prices;     /* a preset name or a file; NULL: no cost */
    const char *tier_prices;    /* the shared cache's, the same; NULL: not
                                   priced */
};

/* The mount being reported on. */
struct target {
    char *path;             /* absolute, as /proc/self/mountinfo has it */
    struct mounts_entry mount;
    long pid;               /* the daemon's */
};

/* ------------------------------------------------------------ the mount */

/* ------------------------------------------------------ the daemon */

/* The extended attribute NAME of PATH, asked by a child within
 * ASK_TIMEOUT_MS (mounts.h): 0; getxattr()'s errno; ETIMEDOUT; EINTR
 * if a signal let in by wait_mask came first; ENOMEM, EAGAIN, EIO. */
static int ask_daemon(const char *path, const char *name, char **value,
                      size_t *length)
{
    return mounts_ask_xattr(path, name, XATTR_VALUE_MAX, ASK_TIMEOUT_MS,
                            &wait_mask, &stop_signal, value, length);
}

/* Say why asking the daemon of TARGET failed with ERR. */
static void report_ask_failure(const struct target *target, int err)
{
    const char *path = target->path;

    switch (err) {
    case ETIMEDOUT:
        fprintf(stderr, "s3cachefs: %s: its daemon does not answer (waited %d "
                "seconds): it is stopped or stuck; its log may say why\n",
                path, ASK_TIMEOUT_MS / 1000);
        break;
    case ENOTCONN:
        fprintf(stderr, "s3cachefs: %s: its daemon is gone, the mount is left "
                "over (fusermount3 -u %s removes it)\n", path, path);
        break;
    case ENODATA:
    case ENOTSUP:
        if (strcmp(target->mount.type, "fuse.s3cachefs") == 0)
            fprintf(stderr, "s3cachefs: %s: its daemon gives no counters (an "
                    "s3cachefs from before %s?)\n", path, FS_STATS_XATTR);
        else
            fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount (it is a "
                    "%s mount of %s)\n", path, target->mount.type,
                    target->mount.source);
        break;
    default:
        fprintf(stderr, "s3cachefs: %s: cannot ask its daemon: %s\n", path,
                strerror(err));
        break;
    }
}

/*
 * Find the mount at ARG and its daemon into *TARGET: 0, or an exit status
 * after one sentence on stderr.
 */
static int find_target(const char *arg, struct target *target)
{
    struct stat st;
    char *pid_text = NULL;
    size_t length;
    int err;

    err = mounts_canonical_path(arg, &target->path);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s: %s\n", arg, strerror(err));
        return EXIT_FAILED;
    }
    if (!mounts_at(target->path, &target->mount)) {
        /* not a mount point: stat()ing it is safe now, unless it is a
         * symbolic link to one */
        if (lstat(arg, &st) != 0) {
            fprintf(stderr, "s3cachefs: %s: %s\n", arg, strerror(errno));
            return EXIT_FAILED;
        }
        char *resolved = S_ISLNK(st.st_mode) ? realpath(arg, NULL) : NULL;
        if (resolved == NULL || !mounts_at(resolved, &target->mount)) {
            free(resolved);
            fprintf(stderr, "s3cachefs: %s is not a mount point\n", arg);
            return EXIT_FAILED;
        }
        free(target->path);
        target->path = resolved;
    }
    if (strncmp(target->mount.type, "fuse", 4) != 0) {
        fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount (it is a %s "
                "mount of %s)\n", target->path, target->mount.type,
                target->mount.source);
        return EXIT_FAILED;
    }
    err = ask_daemon(target->path, FS_PID_XATTR, &pid_text, &length);
    if (err == EINTR)
        return EXIT_OK;
    if (err != 0) {
        report_ask_failure(target, err);
        return EXIT_FAILED;
    }
    char *end = NULL;
    target->pid = strtol(pid_text, &end, 10);
    if (end == pid_text || *end != '\0' || target->pid <= 0)
        target->pid = 0;
    free(pid_text);
    return EXIT_OK;
}

/* The counters of TARGET into *STATS: 0, EINTR (the watch is over), or an
 * exit status after one sentence on stderr. */
static int read_counters(const struct target *target, struct stats_text *stats)
{
    char *text = NULL, err_text[200];
    size_t length;
    int err = ask_daemon(target->path, FS_STATS_XATTR, &text, &length);

    if (err == EINTR)
        return EINTR;
    if (err != 0) {
        report_ask_failure(target, err);
        return EXIT_FAILED;
    }
    err = stats_text_parse(text, length, stats, err_text, sizeof(err_text));
    free(text);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s: %s\n", target->path,
                err == ENOMEM ? strerror(err) : err_text);
        return EXIT_FAILED;
    }
    return 0;
}

/* --------------------------------------------------------- block size */

/* The cache's block size, for the savings, and where it came from: the
 * counters (cache_block_size_bytes), or else the default, assumed. */
static uint32_t block_size_of(const struct stats_text *stats,
                              enum stats_block_size_from *from)
{
    uint64_t from_counters;

    if (stats_text_get(stats, "cache_block_size_bytes", &from_counters) == 0 &&
        from_counters >= MIN_BLOCK_SIZE && from_counters <= MAX_BLOCK_SIZE) {
        *from = STATS_BLOCK_SIZE_COUNTERS;
        return (uint32_t)from_counters;
    }
    *from = STATS_BLOCK_SIZE_DEFAULT;
    return DEFAULT_BLOCK_SIZE;
}

/* ------------------------------------------------------------- prices */

/* The price table SPEC names (the value of OPTION, "--prices" or
 * "--tier-prices") into *OUT: 0, or an exit status after one sentence on
 * stderr. A name without '/' is a preset if there is one; anything else
 * is a file. */
static int load_prices(const char *option, const char *spec,
                       struct price_table *out)
{
    char err[512], *text = NULL;
    struct stat st;
    ssize_t length = 0, got;
    int fd = -1, status = EXIT_FAILED;

    if (strchr(spec, '/') == NULL && prices_preset(spec, out) == 0)
        return EXIT_OK;
    fd = open(spec, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && strchr(spec, '/') == NULL) {
        fprintf(stderr, "s3cachefs stats: %s=%s: not a preset (%s) nor a "
                "file\n", option, spec, prices_preset_names());
        return EXIT_USAGE;
    }
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "s3cachefs: price file %s: %s\n", spec, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > PRICE_FILE_MAX) {
        fprintf(stderr, "s3cachefs: price file %s: %s\n", spec,
                S_ISREG(st.st_mode) ? "larger than 64 KiB" : "not a regular file");
        goto out;
    }
    text = malloc((size_t)st.st_size + 1);
    if (text == NULL) {
        fprintf(stderr, "s3cachefs: price file %s: %s\n", spec, strerror(ENOMEM));
        goto out;
    }
    while (length < st.st_size &&
           (got = read(fd, text + length, (size_t)(st.st_size - length))) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            fprintf(stderr, "s3cachefs: price file %s: %s\n", spec, strerror(errno));
            goto out;
        }
        length += got;
    }
    if (prices_parse(text, (size_t)length, spec, out, err, sizeof(err)) != 0) {
        fprintf(stderr, "s3cachefs: price file %s\n", err);
        goto out;
    }
    status = EXIT_OK;
out:
    if (fd >= 0)
        close(fd);
    free(text);
    return status;
}

/* ---------------------------------------------------------- arguments */

static void print_usage(FILE *out)
{
    fprintf(out,
"usage: s3cachefs stats MOUNTPOINT [--json] [--watch[=SECONDS]] [--prices=NAME|FILE]\n"
"                       [--tier-prices=NAME|FILE]\n"
"\n"
"What the s3cachefs mount at MOUNTPOINT has done since it was mounted: reads\n"
"(from the cache, the shared cache, the bucket), the cache, requests by\n"
"kind, writes and uploads, errors.\n"
"\n"
"  --json               one JSON object, every counter under its own name\n"
"  --watch[=SECONDS]    a line of rates every SECONDS (default 1) until\n"
"                       interrupted; with --json, one object a line\n"
"  --prices=NAME|FILE   what the requests and bytes since the mount cost\n"
"                       and what the cache saved (an estimate), at the list\n"
"                       prices of a preset (%s) or of a file\n"
"                       (man s3cachefs, STATS)\n"
"  --tier-prices=NAME|FILE\n"
"                       with --prices: what the shared cache's requests and\n"
"                       bytes (-o shared_cache) cost at its own prices, and\n"
"                       what it saved at the bucket's\n"
"  -h, --help           this help\n"
"\n"
"Exit status: 0 done; 1 not an s3cachefs mount, its daemon not answering,\n"
"a bad price file; 2 bad usage.\n", prices_preset_names());
}

__attribute__((format(printf, 1, 2)))
static int usage_error(const char *format, ...)
{
    va_list args;

    fprintf(stderr, "s3cachefs stats: ");
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fprintf(stderr, "\nusage: s3cachefs stats MOUNTPOINT [--json] "
            "[--watch[=SECONDS]] [--prices=NAME|FILE] "
            "[--tier-prices=NAME|FILE] (see --help)\n");
    return EXIT_USAGE;
}

static bool is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* Whether ARG is one of this command's options (for the dispatch). */
static bool is_stats_option(const char *arg)
{
    return is_help(arg) || strcmp(arg, "--json") == 0 ||
           strcmp(arg, "--watch") == 0 || strncmp(arg, "--watch=", 8) == 0 ||
           strcmp(arg, "--prices") == 0 || strncmp(arg, "--prices=", 9) == 0 ||
           strcmp(arg, "--tier-prices") == 0 ||
           strncmp(arg, "--tier-prices=", 14) == 0;
}

/* argv after "stats" into *OUT: 0, -1 for --help (printed), or EXIT_USAGE
 * after the message. */
static int parse_args(int argc, char **argv, struct stats_args *out)
{
    *out = (struct stats_args){.interval = WATCH_DEFAULT};
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (is_help(arg)) {
            print_usage(stdout);
            return -1;
        } else if (strcmp(arg, "--json") == 0) {
            out->json = true;
        } else if (strcmp(arg, "--watch") == 0) {
            out->watch = true;
        } else if (strncmp(arg, "--watch=", 8) == 0) {
            char *end = NULL;
            out->watch = true;
            out->interval = strtod(arg + 8, &end);
            if (end == arg + 8 || *end != '\0' || !(out->interval >= WATCH_MIN) ||
                out->interval > WATCH_MAX)
                return usage_error("--watch=%s: expected seconds from %.2f to "
                                   "%.0f, such as 1 or 0.5", arg + 8, WATCH_MIN,
                                   WATCH_MAX);
        } else if (strcmp(arg, "--prices") == 0 || strncmp(arg, "--prices=", 9) == 0) {
            if (arg[8] == '=')
                out->prices = arg + 9;
            else if (i + 1 < argc)
                out->prices = argv[++i];
            if (out->prices == NULL || out->prices[0] == '\0')
                return usage_error("--prices needs a preset (%s) or a file",
                                   prices_preset_names());
        } else if (strcmp(arg, "--tier-prices") == 0 ||
                   strncmp(arg, "--tier-prices=", 14) == 0) {
            if (arg[13] == '=')
                out->tier_prices = arg + 14;
            else if (i + 1 < argc)
                out->tier_prices = argv[++i];
            if (out->tier_prices == NULL || out->tier_prices[0] == '\0')
                return usage_error("--tier-prices needs a preset (%s) or a "
                                   "file", prices_preset_names());
        } else if (arg[0] == '-' && arg[1] != '\0') {
            return usage_error("unknown option '%s'", arg);
        } else if (out->mountpoint != NULL) {
            return usage_error("one mount point only ('%s', then '%s')",
                               out->mountpoint, arg);
        } else {
            out->mountpoint = arg;
        }
    }
    if (out->mountpoint == NULL)
        return usage_error("%s", "no mount point");
    if (out->tier_prices != NULL && out->prices == NULL)
        return usage_error("%s", "--tier-prices needs --prices too: what the "
                           "shared cache saved is priced at the bucket's "
                           "prices");
    return 0;
}

/* ------------------------------------------------------------ output */

static void stop_on_signal(int signum)
{
    stop_signal = signum;
}

/* Sleep until the monotonic DEADLINE (seconds) or a stop signal. */
static void wait_until(double deadline)
{
    while (stop_signal == 0) {
        double left = deadline - clock_monotonic_seconds();
        if (left <= 0)
            return;
        struct timespec wait = {.tv_sec = (time_t)left,
                                .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        ppoll(NULL, 0, &wait, &wait_mask);
    }
}

/* stdout after a write: 0, or the exit status (and a message unless the
 * reader has gone, which ends a watch quietly). */
static int check_output(bool watching)
{
    if (fflush(stdout) == 0 && !ferror(stdout))
        return EXIT_OK;
    if (watching && errno == EPIPE)
        return EXIT_OK;
    fprintf(stderr, "s3cachefs: cannot write the counters: %s\n", strerror(errno));
    return EXIT_FAILED;
}

static int report_once(const struct stats_args *args,
                       const struct stats_report *report)
{
    char err[256];
    int result = args->json
        ? stats_report_json(stdout, report, false, -1, err, sizeof(err))
        : stats_report_table(stdout, report, err, sizeof(err));

    if (result != 0) {
        fflush(stdout);
        fprintf(stderr, "s3cachefs: %s: %s\n", report->mountpoint, err);
        return EXIT_FAILED;
    }
    return check_output(false);
}

/*
 * --watch: a line every interval until a stop signal; FIRST is the sample
 * taken before (the watch frees it). The JSON form prints the counters as
 * they are, one object a line, the first one at once.
 */
static int watch(const struct stats_args *args, const struct target *target,
                 struct stats_report *report, struct stats_text *first)
{
    struct stats_text before = *first, now = {0};
    double then = clock_monotonic_seconds(), next = then;
    char err[256];
    int status = EXIT_OK;

    *first = (struct stats_text){0};
    report->stats = &before;
    if (!args->json) {
        stats_report_watch_header(stdout, report->prices);
    } else if (stats_report_json(stdout, report, true, clock_wall_seconds(),
                                 err, sizeof(err)) != 0) {
        fprintf(stderr, "s3cachefs: %s: %s\n", target->path, err);
        status = EXIT_FAILED;
        goto out;
    }
    status = check_output(true);
    while (status == EXIT_OK && stop_signal == 0 && !ferror(stdout)) {
        next += args->interval;
        if (next < clock_monotonic_seconds())
            next = clock_monotonic_seconds() + args->interval; /* fell behind */
        wait_until(next);
        if (stop_signal != 0)
            break;
        int result = read_counters(target, &now);
        if (result == EINTR)
            break;
        if (result != 0) {
            status = result;
            break;
        }
        double at = clock_monotonic_seconds();
        if (args->json) {
            report->stats = &now;
            if (stats_report_json(stdout, report, true, clock_wall_seconds(),
                                  err, sizeof(err)) != 0) {
                fprintf(stderr, "s3cachefs: %s: %s\n", target->path, err);
                status = EXIT_FAILED;
                break;
            }
        } else {
            stats_report_watch_line(stdout, &before, &now,
                                    at > then ? at - then : 1e-9, report->prices);
        }
        status = check_output(true);
        stats_text_free(&before);
        before = now;
        now = (struct stats_text){0};
        then = at;
    }
out:
    stats_text_free(&before);
    stats_text_free(&now);
    return status;
}

bool stats_cmd_requested(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "stats") != 0)
        return false;
    if (argc == 2)
        return true;    /* no bucket is mounted without a mount point */
    for (int i = 2; i < argc; i++)
        if (is_stats_option(argv[i]))
            return true;
    return mounts_is_s3cachefs(argv[2], ASK_TIMEOUT_MS);
}

int stats_cmd_main(int argc, char **argv)
{
    struct stats_args args;
    struct target target = {0};
    struct price_table prices, tier_prices;
    struct stats_text stats = {0};
    int status = parse_args(argc, argv, &args);

    if (status != 0)
        return status < 0 ? EXIT_OK : status;
    if (args.prices != NULL &&
        (status = load_prices("--prices", args.prices, &prices)) != 0)
        return status;
    if (args.tier_prices != NULL &&
        (status = load_prices("--tier-prices", args.tier_prices,
                              &tier_prices)) != 0)
        return status;
    if (args.watch) {
        /* SIGINT and SIGTERM end the watch; they are let in only while it
         * waits (wait_mask), so that none is lost between two waits */
        struct sigaction action = {.sa_handler = stop_on_signal};
        sigset_t stops;
        sigemptyset(&action.sa_mask);
        sigaction(SIGINT, &action, NULL);
        sigaction(SIGTERM, &action, NULL);
        signal(SIGPIPE, SIG_IGN);   /* a reader gone is EPIPE: the end */
        sigemptyset(&stops);
        sigaddset(&stops, SIGINT);
        sigaddset(&stops, SIGTERM);
        sigprocmask(SIG_BLOCK, &stops, &wait_mask);
        sigdelset(&wait_mask, SIGINT);
        sigdelset(&wait_mask, SIGTERM);
    } else {
        sigprocmask(SIG_SETMASK, NULL, &wait_mask);
    }

    status = find_target(args.mountpoint, &target);
    if (status != EXIT_OK || stop_signal != 0)
        goto out;
    int result = read_counters(&target, &stats);
    if (result != 0) {
        status = result == EINTR ? EXIT_OK : result;
        goto out;
    }
    struct stats_report report = {
        .mountpoint = target.path,
        .source = target.mount.source,
        .pid = target.pid,
        .stats = &stats,
        .prices = args.prices != NULL ? &prices : NULL,
        .tier_prices = args.tier_prices != NULL ? &tier_prices : NULL,
    };
    report.block_size = block_size_of(&stats, &report.block_size_from);
    if (args.watch)
        status = watch(&args, &target, &report, &stats);
    else
        status = report_once(&args, &report);
out:
    stats_text_free(&stats);
    free(target.path);
    return status;
}
