/*
 * warm_cmd.c - `s3cachefs warm` (see warm_cmd.h): find the files, ask the
 * daemon of their mount about each, report.
 *
 * First the paths: each one's mount is found in /proc/self/mountinfo (the
 * longest mount point above its real path) and its daemon asked for its
 * pid by a child process given 5 s, once per mount, so a stuck daemon
 * costs an error rather than a hung command; then directories are walked
 * (nftw, physical, not across mounts) into a list of regular files with
 * their sizes (the total makes the ETA); a symbolic link named is
 * followed, one met in a tree is not. Then --jobs threads take the
 * files in order, one getxattr() of the file's request attribute each
 * (warm_text.h answers); the main thread draws the progress line and takes
 * the signals.
 *
 * Stopping: SIGINT, SIGTERM and SIGHUP are blocked in the worker threads
 * and caught (without SA_RESTART) by the main thread, which then sends
 * SIGUSR1 to each worker every REASK_MS until they are all done: a
 * signal to a thread waiting in a FUSE request makes the kernel send the
 * daemon an interrupt, and the daemon answers at once with what it did
 * (a signal that came just before the request was sent interrupted
 * nothing, hence the repeats).
 */
#include "config.h"

#include "cmd/warm_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <search.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "base/clock.h"
#include "cmd/args.h"
#include "cmd/mounts.h"
#include "cmd/warm_report.h"
#include "ctl/warm_text.h"
#include "fs/fs.h"

#define EXIT_OK 0
#define EXIT_FAILED 1
#define EXIT_USAGE 2

#define ASK_TIMEOUT_MS 5000         /* the daemon's pid */
#define REASK_MS 50                 /* a stop is sent again */
#define TICK_MS 200                 /* the progress line is redrawn */
#define PEEK_MS 1000                /* files under way are measured */
#define JOBS_DEFAULT 4
#define JOBS_MAX 64
#define NFTW_FDS 32

static volatile sig_atomic_t stop_signal;

struct args {
    enum warm_mode mode;
    bool help, json, mode_set;
    unsigned jobs;
    const char *from;               /* --from FILE|- */
    char **paths;                   /* argv's PATH arguments */
    size_t path_count;
};

/* A mount seen, and whether its daemon answered. */
struct mount {
    char *point;
    char type[64];
    int status;                     /* 0 answered; else an errno */
};

/* A path asked about: a regular file to ask the daemon, or a failure
 * found on the way (why != NULL). */
struct item {
    char *path;
    uint64_t size;
    char *why;                      /* malloc'd sentence: failed before asking */
    bool answered;
    bool interrupted;               /* the stop came before its answer */
    bool failed;
    struct warm_text_answer answer;
};

struct run {
    struct args args;
    const char *attr;               /* the attribute asked */
    struct mount *mounts;
    size_t mount_count;
    struct item *items;
    size_t count, cap;
    void *seen;                     /* tsearch set of dev/ino already listed */
    bool interrupted;

    pthread_mutex_t lock;           /* totals, items' answers, stderr */
    struct warm_totals totals;
    atomic_size_t next;             /* the next item a worker takes */
    atomic_bool stopping;
    bool terminal;                  /* stderr is a terminal: progress line */
    bool line_shown;                /* (lock) a progress line is on screen */
};

struct worker {
    struct run *run;
    pthread_t thread;
    bool started;
    atomic_bool finished;
    atomic_long current;            /* the item it asks about; -1: none */
};

/* ------------------------------------------------------------ usage */

static const char help_text[] =
    "usage: s3cachefs warm [--check|--evict|--pin|--unpin] [--from FILE|-]\n"
    "                      [--jobs N] [--json] PATH...\n"
    "\n"
    "Fetch the files at PATH (directories: every file under them) into the\n"
    "cache of the s3cachefs mount they are in, before a job reads them. The\n"
    "mount's daemon fetches them with its parallelism (-o connections); blocks\n"
    "already cached are skipped. A progress bar on a terminal, else a summary:\n"
    "files, bytes fetched, bytes already cached, seconds, rate, failures.\n"
    "\n"
    "  --from FILE  also the paths in FILE, one a line (\"-\": stdin; blank\n"
    "               lines and lines starting with # are skipped); relative\n"
    "               paths are taken from the current directory\n"
    "  --check      how much of each file is cached; fetches nothing and sends\n"
    "               no request to the bucket\n"
    "  --evict      drop the cached blocks of the files (data not uploaded\n"
    "               yet stays); prints the bytes freed\n"
    "  --pin        warm the files and keep them through eviction (model\n"
    "               weights), up to half of cache_size for all pinned files\n"
    "  --unpin      let eviction take them again\n"
    "  --jobs N     files asked at a time (default 4)\n"
    "  --json       print the result as one JSON object\n"
    "  -h, --help   this text\n"
    "\n"
    "SIGINT, SIGTERM and SIGHUP stop it: the cache keeps what was fetched.\n"
    "Exit status: 0 every file done; 1 a path failed (not found, not a\n"
    "regular file, outside an s3cachefs mount, fetch failed, did not fit) or\n"
    "it was stopped; 2 bad usage.\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "s3cachefs warm: %s%s%s\n", what, arg != NULL ? ": " : "",
            arg != NULL ? arg : "");
    fprintf(stderr, "usage: s3cachefs warm [--check|--evict|--pin|--unpin] "
            "[--from FILE|-] [--jobs N] [--json] PATH... (s3cachefs warm "
            "--help says more)\n");
    return EXIT_USAGE;
}

static bool own_option(const char *arg)
{
    static const char *const names[] = {"-h", "--help", "--json", "--from",
                                        "--check", "--evict", "--pin",
                                        "--unpin", "--jobs"};

    return args_is_one_of(arg, names, sizeof(names) / sizeof(names[0]));
}

static int set_mode(struct args *args, enum warm_mode mode, const char *arg)
{
    if (args->mode_set && args->mode != mode)
        return usage_error("one of --check, --evict, --pin and --unpin at a "
                           "time", arg);
    args->mode = mode;
    args->mode_set = true;
    return EXIT_OK;
}

static int parse_args(int argc, char **argv, struct args *args)
{
    bool options_done = false;
    int status;

    *args = (struct args){.jobs = JOBS_DEFAULT};
    args->paths = calloc((size_t)argc, sizeof(char *));
    if (args->paths == NULL)
        return EXIT_FAILED;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *value;
        bool missing = false;
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            args->paths[args->path_count++] = argv[i];
        } else if (strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            args->help = true;
        } else if (strcmp(arg, "--json") == 0) {
            args->json = true;
        } else if (strcmp(arg, "--check") == 0) {
            if ((status = set_mode(args, WARM_MODE_CHECK, arg)) != 0)
                return status;
        } else if (strcmp(arg, "--evict") == 0) {
            if ((status = set_mode(args, WARM_MODE_EVICT, arg)) != 0)
                return status;
        } else if (strcmp(arg, "--pin") == 0) {
            if ((status = set_mode(args, WARM_MODE_PIN, arg)) != 0)
                return status;
        } else if (strcmp(arg, "--unpin") == 0) {
            if ((status = set_mode(args, WARM_MODE_UNPIN, arg)) != 0)
                return status;
        } else if ((value = args_value(argv, argc, &i, "--from", &missing)) !=
                       NULL || missing) {
            if (missing || value[0] == '\0')
                return usage_error("--from wants a file (or - for stdin)", NULL);
            if (args->from != NULL)
                return usage_error("one --from at a time", value);
            args->from = value;
        } else if ((value = args_value(argv, argc, &i, "--jobs", &missing)) !=
                       NULL || missing) {
            char *end = NULL;
            long jobs = missing ? -1 : strtol(value, &end, 10);
            if (missing || end == value || *end != '\0' || jobs < 1 ||
                jobs > JOBS_MAX)
                return usage_error("--jobs wants a number from 1 to 64",
                                   missing ? NULL : value);
            args->jobs = (unsigned)jobs;
        } else {
            return usage_error("unknown option", arg);
        }
    }
    if (args->help)
        return EXIT_OK;
    if (args->path_count == 0 && args->from == NULL)
        return usage_error("no path (give PATH... or --from FILE)", NULL);
    return EXIT_OK;
}

/* ------------------------------------------------------------ mounts */

/* The mount PATH (absolute, resolved) is in (mounts.h): its point
 * (PATH_MAX bytes) and type. */
static bool mount_of(const char *path, char *point, char *type, size_t type_cap)
{
    struct mounts_entry *mount = malloc(sizeof(*mount));
    bool found = mount != NULL && mounts_holding(path, mount);

    if (found) {
        snprintf(point, PATH_MAX, "%s", mount->point);
        snprintf(type, type_cap, "%s", mount->type);
    }
    free(mount);
    return found;
}

/* Whether the daemon of the mount at POINT answers its pid, asked by a
 * child process within ASK_TIMEOUT_MS: 0, getxattr()'s errno, ETIMEDOUT
 * (the child is killed), EIO. */
static int ask_pid(const char *point)
{
    return mounts_ask_xattr(point, FS_PID_XATTR, 64, ASK_TIMEOUT_MS, NULL, NULL,
                            NULL, NULL);
}

/* The sentence for a mount whose daemon did not answer with ERR (into
 * BUF). */
static void mount_failure(const struct mount *mount, int err, char *buf,
                          size_t cap)
{
    switch (err) {
    case ETIMEDOUT:
        snprintf(buf, cap, "the daemon of %s does not answer (stopped or "
                 "stuck; its log may say why)", mount->point);
        break;
    case ENOTCONN:
        snprintf(buf, cap, "the daemon of %s is gone; the mount is left over "
                 "(fusermount3 -u %s removes it)", mount->point, mount->point);
        break;
    case ENODATA:
    case ENOTSUP:
        snprintf(buf, cap, "not inside an s3cachefs mount (%s is a %s mount)",
                 mount->point, mount->type);
        break;
    default:
        snprintf(buf, cap, "cannot ask the daemon of %s: %s", mount->point,
                 strerror(err));
        break;
    }
}

/* Whether PATH is in an s3cachefs mount whose daemon answers: NULL, or
 * why not (a static or RUN-owned sentence into BUF). */
static const char *check_mount(struct run *run, const char *path, char *buf,
                               size_t cap)
{
    char *real = realpath(path, NULL);
    char point[PATH_MAX], type[64];
    const char *why = NULL;

    if (real == NULL) {
        snprintf(buf, cap, "%s", strerror(errno));
        return buf;
    }
    if (!mount_of(real, point, type, sizeof(type)) ||
        strncmp(type, "fuse", 4) != 0) {
        snprintf(buf, cap, "not inside an s3cachefs mount");
        why = buf;
        goto out;
    }
    struct mount *mount = NULL;
    for (size_t i = 0; i < run->mount_count && mount == NULL; i++)
        if (strcmp(run->mounts[i].point, point) == 0)
            mount = &run->mounts[i];
    if (mount == NULL) {
        struct mount *grown = realloc(run->mounts,
                                      (run->mount_count + 1) * sizeof(*grown));
        char *copy = strdup(point);
        if (grown == NULL || copy == NULL) {
            free(copy);
            if (grown != NULL)
                run->mounts = grown;
            snprintf(buf, cap, "%s", strerror(ENOMEM));
            why = buf;
            goto out;
        }
        run->mounts = grown;
        mount = &run->mounts[run->mount_count++];
        mount->point = copy;
        snprintf(mount->type, sizeof(mount->type), "%s", type);
        /* fuse.s3cachefs, or a FUSE mount renamed by -o subtype= whose
         * root answers the pid */
        mount->status = ask_pid(point);
    }
    if (mount->status != 0) {
        mount_failure(mount, mount->status, buf, cap);
        why = buf;
    }
out:
    free(real);
    return why;
}

/* ------------------------------------------------------------ the list */

static struct item *item_add(struct run *run, const char *path)
{
    if (run->count == run->cap) {
        size_t cap = run->cap ? run->cap * 2 : 64;
        struct item *grown = realloc(run->items, cap * sizeof(*grown));
        if (grown == NULL)
            return NULL;
        run->items = grown;
        run->cap = cap;
    }
    struct item *item = &run->items[run->count];
    *item = (struct item){.path = strdup(path)};
    if (item->path == NULL)
        return NULL;
    run->count++;
    return item;
}

/* Add PATH as failed with WHY. false: out of memory. */
static bool item_fail(struct run *run, const char *path, const char *why)
{
    struct item *item = item_add(run, path);

    if (item == NULL || (item->why = strdup(why)) == NULL)
        return false;
    item->failed = true;
    run->totals.failed++;
    return true;
}

struct file_id {
    dev_t dev;
    ino_t ino;
};

static int compare_file_id(const void *a, const void *b)
{
    const struct file_id *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* Add the regular file PATH (ST) unless listed already. */
static bool item_file(struct run *run, const char *path, const struct stat *st)
{
    struct file_id *id = malloc(sizeof(*id));

    if (id == NULL)
        return false;
    *id = (struct file_id){st->st_dev, st->st_ino};
    void *found = tsearch(id, &run->seen, compare_file_id);
    if (found == NULL) {
        free(id);
        return false;
    }
    if (*(struct file_id **)found != id) {
        free(id); /* named twice: once is enough */
        return true;
    }
    struct item *item = item_add(run, path);
    if (item == NULL)
        return false;
    item->size = (uint64_t)st->st_size;
    run->totals.files++;
    run->totals.bytes += item->size;
    return true;
}

static struct run *walking; /* nftw() has no argument for its callback */

static int walk_visit(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw)
{
    (void)ftw;
    if (stop_signal != 0)
        return 1;
    switch (flag) {
    case FTW_F:
        if (S_ISREG(st->st_mode))
            return item_file(walking, path, st) ? 0 : -1;
        return 0; /* devices, FIFOs in a tree: nothing to cache */
    case FTW_SL:
    case FTW_SLN:
        return 0; /* not followed */
    case FTW_DNR:
        return item_fail(walking, path, "cannot read the directory") ? 0 : -1;
    case FTW_NS:
        return item_fail(walking, path, strerror(errno)) ? 0 : -1;
    default:
        return 0;
    }
}

/* PATH as given (an argument, a line of --from): its files into the list,
 * or its failure. false: out of memory. */
static bool add_path(struct run *run, const char *path)
{
    char why[PATH_MAX + 128];
    struct stat st;

    /* a symbolic link named is followed (a Hugging Face snapshot's files
     * are links to its blobs); inside a tree they are not */
    if (stat(path, &st) != 0)
        return item_fail(run, path, errno == ENOENT ? "not found" : strerror(errno));
    const char *bad = check_mount(run, path, why, sizeof(why));
    if (bad != NULL)
        return item_fail(run, path, bad);
    if (S_ISREG(st.st_mode))
        return item_file(run, path, &st);
    if (!S_ISDIR(st.st_mode))
        return item_fail(run, path, "not a regular file");
    walking = run;
    int result = nftw(path, walk_visit, NFTW_FDS, FTW_PHYS | FTW_MOUNT);
    walking = NULL;
    if (result < 0)
        return item_fail(run, path, strerror(errno));
    return true;
}

/* The paths of --from FILE. false: an exit status was decided (*STATUS). */
static bool add_list(struct run *run, const char *from, int *status)
{
    FILE *list = strcmp(from, "-") == 0 ? stdin : fopen(from, "re");
    char *line = NULL;
    size_t cap = 0;
    bool ok = true;

    if (list == NULL) {
        fprintf(stderr, "s3cachefs warm: --from %s: %s\n", from, strerror(errno));
        *status = EXIT_FAILED;
        return false;
    }
    while (ok && stop_signal == 0 && getline(&line, &cap, list) >= 0) {
        char *path = warm_report_list_line(line);
        if (path != NULL)
            ok = add_path(run, path);
    }
    if (ok && ferror(list)) {
        fprintf(stderr, "s3cachefs warm: --from %s: %s\n", from, strerror(errno));
        *status = EXIT_FAILED;
        ok = false;
    } else if (!ok) {
        *status = EXIT_FAILED;
    }
    free(line);
    if (list != stdin)
        fclose(list);
    return ok;
}

/* ------------------------------------------------------------ asking */

/* Clear the progress line before writing to stderr (lock held). */
static void clear_line_locked(struct run *run)
{
    if (run->line_shown) {
        fputs("\r\033[K", stderr);
        run->line_shown = false;
    }
}

static void report_item_failure_locked(struct run *run, const struct item *item,
                                       const char *why)
{
    clear_line_locked(run);
    fprintf(stderr, "s3cachefs warm: %s: %s\n", item->path, why);
}

/* Take ANSWER (or the getxattr() errno ERR) for ITEM into the totals. */
static void take_answer(struct run *run, struct item *item, int err,
                        const struct warm_text_answer *answer)
{
    char why[256] = "";

    pthread_mutex_lock(&run->lock);
    if (err == EINTR || (err == 0 && answer->status == WARM_TEXT_INTERRUPTED &&
                         atomic_load(&run->stopping))) {
        item->interrupted = true;
        if (err == 0) { /* what it did counts */
            item->answer = *answer;
            run->totals.before += answer->before;
            run->totals.fetched += answer->fetched;
        }
        pthread_mutex_unlock(&run->lock);
        return;
    }
    if (err != 0) {
        if (err == ENOTSUP || err == ENODATA)
            snprintf(why, sizeof(why), "its daemon is older than this command "
                     "(remount with this version)");
        else if (err == ENOENT)
            snprintf(why, sizeof(why), "not found (gone from the bucket?)");
        else if (err == EISDIR || err == EINVAL)
            snprintf(why, sizeof(why), "not a regular file");
        else
            snprintf(why, sizeof(why), "%s", strerror(err));
    } else {
        item->answered = true;
        item->answer = *answer;
        run->totals.done++;
        run->totals.bytes_done += item->size;
        run->totals.before += answer->before;
        run->totals.fetched += answer->fetched;
        run->totals.cached += answer->cached;
        run->totals.freed += answer->freed;
        if (answer->pin_max > 0) {
            run->totals.pin_used = answer->pin_used;
            run->totals.pin_max = answer->pin_max;
        }
        if (answer->status == WARM_TEXT_STAGED)
            run->totals.staged++;
        else if (answer->status == WARM_TEXT_FAILED)
            snprintf(why, sizeof(why), "fetch failed: %s%s",
                     strerror(answer->error),
                     answer->error == ESTALE ? " (it changed in the bucket)" : "");
        else if (answer->status == WARM_TEXT_FULL)
            snprintf(why, sizeof(why), "not pinned: it does not fit in the "
                     "share of the cache pinned files may take");
        else if (answer->status == WARM_TEXT_INTERRUPTED)
            snprintf(why, sizeof(why), "interrupted");
        else if ((run->args.mode == WARM_MODE_FETCH ||
                  run->args.mode == WARM_MODE_PIN) &&
                 answer->cached < answer->size) {
            char cached[32], size[32];
            warm_report_format_bytes(answer->cached, cached, sizeof(cached));
            warm_report_format_bytes(answer->size, size, sizeof(size));
            snprintf(why, sizeof(why), "only %s of %s stayed cached (the "
                     "cache is too small for it)", cached, size);
        }
    }
    if (why[0] != '\0') {
        item->failed = true;
        run->totals.failed++;
        report_item_failure_locked(run, item, why);
        free(item->why);
        item->why = strdup(why);
    }
    pthread_mutex_unlock(&run->lock);
}

static void *worker_main(void *arg)
{
    struct worker *worker = arg;
    struct run *run = worker->run;
    char value[WARM_TEXT_VALUE_MAX];

    while (!atomic_load(&run->stopping)) {
        size_t index = atomic_fetch_add(&run->next, 1);
        if (index >= run->count)
            break;
        struct item *item = &run->items[index];
        if (item->failed)
            continue;
        atomic_store(&worker->current, (long)index);
        ssize_t len = getxattr(item->path, run->attr, value, sizeof(value));
        int err = len < 0 ? errno : 0;
        struct warm_text_answer answer = {0};
        if (err == 0 && warm_text_parse(value, (size_t)len, &answer) != 0)
            err = EPROTO;
        atomic_store(&worker->current, -1L);
        take_answer(run, item, err, &answer);
    }
    atomic_store(&worker->finished, true);
    return NULL;
}

static void on_stop(int signum)
{
    stop_signal = signum;
}

static void on_wake(int signum)
{
    (void)signum; /* only there to interrupt a worker's getxattr() */
}

/* The bytes cached now of the files the workers are asking about
 * (a --check of each: no request to the bucket). */
static uint64_t peek_under_way(struct run *run, struct worker *workers,
                               unsigned count)
{
    char value[WARM_TEXT_VALUE_MAX];
    uint64_t bytes = 0;

    for (unsigned i = 0; i < count; i++) {
        long index = atomic_load(&workers[i].current);
        if (index < 0)
            continue;
        ssize_t len = getxattr(run->items[index].path, FS_CHECK_XATTR, value,
                               sizeof(value));
        struct warm_text_answer answer;
        if (len > 0 && warm_text_parse(value, (size_t)len, &answer) == 0)
            bytes += answer.cached;
    }
    return bytes;
}

static unsigned terminal_width(void)
{
    struct winsize size;

    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 20)
        return size.ws_col - 1;
    return 79;
}

/* Ask about every listed file with --jobs workers; draws the progress
 * line and takes the stop signals meanwhile. */
static int ask_all(struct run *run, double started)
{
    unsigned count = run->args.jobs;
    struct worker *workers = calloc(count, sizeof(*workers));
    sigset_t blocked, previous;
    uint64_t last_peek = 0, peeked = 0;

    if (workers == NULL)
        return ENOMEM;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &blocked, &previous);
    for (unsigned i = 0; i < count; i++) {
        workers[i].run = run;
        atomic_init(&workers[i].finished, false);
        atomic_init(&workers[i].current, -1L);
        workers[i].started = pthread_create(&workers[i].thread, NULL,
                                            worker_main, &workers[i]) == 0;
        if (!workers[i].started)
            atomic_store(&workers[i].finished, true);
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);

    for (;;) {
        bool all_done = true;
        for (unsigned i = 0; i < count; i++)
            all_done = all_done && atomic_load(&workers[i].finished);
        if (all_done)
            break;
        if (stop_signal != 0) {
            atomic_store(&run->stopping, true);
            for (unsigned i = 0; i < count; i++)
                if (workers[i].started && !atomic_load(&workers[i].finished))
                    pthread_kill(workers[i].thread, SIGUSR1);
        }
        /* (a stop signal ends the sleep early) */
        long ms = stop_signal != 0 ? REASK_MS : TICK_MS;
        nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
        if (run->terminal && stop_signal == 0) {
            uint64_t now = clock_monotonic_ms();
            bool fetching = run->args.mode == WARM_MODE_FETCH ||
                            run->args.mode == WARM_MODE_PIN;
            if (fetching && now - last_peek >= PEEK_MS) {
                peeked = peek_under_way(run, workers, count);
                last_peek = now;
            }
            char line[256];
            pthread_mutex_lock(&run->lock);
            struct warm_totals shown = run->totals;
            shown.bytes_done += peeked;
            if (shown.bytes_done > shown.bytes)
                shown.bytes_done = shown.bytes;
            warm_report_progress_line(run->args.mode, &shown,
                                      clock_monotonic_seconds() - started,
                                      terminal_width(), line, sizeof(line));
            fprintf(stderr, "\r%s\033[K", line);
            fflush(stderr);
            run->line_shown = true;
            pthread_mutex_unlock(&run->lock);
        }
    }
    for (unsigned i = 0; i < count; i++)
        if (workers[i].started)
            pthread_join(workers[i].thread, NULL);
    free(workers);
    pthread_mutex_lock(&run->lock);
    clear_line_locked(run);
    pthread_mutex_unlock(&run->lock);
    return 0;
}

/* ------------------------------------------------------------ output */

static void print_json(const struct run *run, double seconds)
{
    const struct warm_totals *t = &run->totals;
    FILE *out = stdout;

    fprintf(out, "{\"command\":\"%s\",\"interrupted\":%s,\"seconds\":%.3f,"
            "\"files\":%" PRIu64 ",\"done\":%" PRIu64 ",\"failed\":%" PRIu64
            ",\"staged\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"before\":%" PRIu64
            ",\"fetched\":%" PRIu64 ",\"cached\":%" PRIu64 ",\"freed\":%" PRIu64
            ",\"pin_used\":%" PRIu64 ",\"pin_max\":%" PRIu64 ",\"paths\":[",
            warm_report_mode_name(run->args.mode), run->interrupted ? "true" : "false",
            seconds, t->files, t->done, t->failed, t->staged, t->bytes, t->before,
            t->fetched, t->cached, t->freed, t->pin_used, t->pin_max);
    for (size_t i = 0; i < run->count; i++) {
        const struct item *item = &run->items[i];
        const struct warm_text_answer *a = &item->answer;
        fputs(i > 0 ? ",{\"path\":" : "{\"path\":", out);
        warm_report_json_string(out, item->path);
        if (item->answered || item->interrupted)
            fprintf(out, ",\"size\":%" PRIu64 ",\"status\":\"%s\",\"before\":%"
                    PRIu64 ",\"fetched\":%" PRIu64 ",\"cached\":%" PRIu64
                    ",\"freed\":%" PRIu64 ",\"pinned\":%s", item->size,
                    item->answered ? warm_text_status_name(a->status)
                                   : "interrupted",
                    a->before, a->fetched, a->cached, a->freed,
                    a->pinned ? "true" : "false");
        else if (!item->failed)
            fprintf(out, ",\"size\":%" PRIu64 ",\"status\":\"not asked\"",
                    item->size);
        if (item->why != NULL) {
            fputs(",\"error\":", out);
            warm_report_json_string(out, item->why);
        }
        fputc('}', out);
    }
    fputs("]}\n", out);
}

static void print_text(const struct run *run, double seconds)
{
    char line[512];

    if (run->args.mode == WARM_MODE_CHECK) {
        for (size_t i = 0; i < run->count; i++) {
            const struct item *item = &run->items[i];
            if (!item->answered || item->failed)
                continue;
            char cached[32], size[32];
            warm_report_format_bytes(item->answer.cached, cached, sizeof(cached));
            warm_report_format_bytes(item->answer.size, size, sizeof(size));
            printf("%3u%%  %9s of %-9s  %s%s\n",
                   warm_report_percent(item->answer.cached, item->answer.size), cached,
                   size, item->path,
                   item->answer.status == WARM_TEXT_STAGED ? "  (not uploaded "
                   "yet: local)" : item->answer.pinned ? "  (pinned)" : "");
        }
    }
    warm_report_summary_line(run->args.mode, &run->totals, seconds, run->interrupted,
                             line, sizeof(line));
    printf("%s\n", line);
}

/* ------------------------------------------------------------ dispatch */

/* Whether PATH, or the nearest directory above it that exists (a path
 * that does not: a warm that will say so), is in a fuse.s3cachefs mount. */
static bool inside_s3cachefs(const char *arg)
{
    char *path = strdup(arg), *real = NULL, point[PATH_MAX], type[64];

    while (path != NULL && path[0] != '\0' &&
           (real = realpath(path, NULL)) == NULL) {
        char *slash = strrchr(path, '/');
        if (slash == NULL)
            path[0] = '\0';
        else if (slash == path)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (slash == path) {
            real = realpath("/", NULL);
            break;
        }
    }
    if (real == NULL && path != NULL && path[0] == '\0')
        real = realpath(".", NULL);
    bool yes = real != NULL && mount_of(real, point, type, sizeof(type)) &&
               strcmp(type, "fuse.s3cachefs") == 0;
    free(real);
    free(path);
    return yes;
}

bool warm_cmd_requested(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "warm") != 0)
        return false;
    if (argc == 2)
        return true;
    for (int i = 2; i < argc; i++)
        if (own_option(argv[i]))
            return true;
    /* `s3cachefs warm -f /mnt -o ...` mounts a bucket named "warm": its
     * mount point is not inside an s3cachefs mount (an -o value is no
     * path) */
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0) {
            i++;
            continue;
        }
        if (argv[i][0] != '-' && inside_s3cachefs(argv[i]))
            return true;
    }
    return false;
}

static const char *attr_of(enum warm_mode mode)
{
    switch (mode) {
    case WARM_MODE_CHECK:
        return FS_CHECK_XATTR;
    case WARM_MODE_EVICT:
        return FS_EVICT_XATTR;
    case WARM_MODE_PIN:
        return FS_PIN_XATTR;
    case WARM_MODE_UNPIN:
        return FS_UNPIN_XATTR;
    default:
        return FS_WARM_XATTR;
    }
}

int warm_cmd_main(int argc, char **argv)
{
    struct run run = {0};
    int status = parse_args(argc, argv, &run.args);
    double started = clock_monotonic_seconds();

    if (status != EXIT_OK || run.args.help) {
        if (status == EXIT_OK)
            fputs(help_text, stdout);
        free(run.args.paths);
        return status;
    }
    run.attr = attr_of(run.args.mode);
    pthread_mutex_init(&run.lock, NULL);
    atomic_init(&run.next, 0);
    atomic_init(&run.stopping, false);
    run.terminal = !run.args.json && isatty(STDERR_FILENO);

    struct sigaction stop = {.sa_handler = on_stop}, wake = {.sa_handler = on_wake};
    sigemptyset(&stop.sa_mask);
    sigemptyset(&wake.sa_mask);
    sigaction(SIGINT, &stop, NULL);   /* no SA_RESTART: ends the wait */
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGHUP, &stop, NULL);
    sigaction(SIGUSR1, &wake, NULL);

    bool ok = true;
    for (size_t i = 0; ok && i < run.args.path_count && stop_signal == 0; i++)
        ok = add_path(&run, run.args.paths[i]);
    if (!ok && status == EXIT_OK) {
        fprintf(stderr, "s3cachefs warm: out of memory\n");
        status = EXIT_FAILED;
    }
    if (ok && run.args.from != NULL)
        ok = add_list(&run, run.args.from, &status);
    for (size_t i = 0; i < run.count; i++)
        if (run.items[i].failed)
            fprintf(stderr, "s3cachefs warm: %s: %s\n", run.items[i].path,
                    run.items[i].why);
    if (ok && stop_signal == 0)
        ask_all(&run, started);
    run.interrupted = stop_signal != 0;
    double seconds = clock_monotonic_seconds() - started;
    if (status == EXIT_OK || run.count > 0) {
        if (run.args.json)
            print_json(&run, seconds);
        else
            print_text(&run, seconds);
    }
    if (run.interrupted)
        fprintf(stderr, "s3cachefs warm: stopped by signal %d: what was fetched "
                "stays cached\n", (int)stop_signal);
    if (status == EXIT_OK && (run.totals.failed > 0 || run.interrupted))
        status = EXIT_FAILED;

    for (size_t i = 0; i < run.count; i++) {
        free(run.items[i].path);
        free(run.items[i].why);
    }
    free(run.items);
    tdestroy(run.seen, free);
    for (size_t i = 0; i < run.mount_count; i++)
        free(run.mounts[i].point);
    free(run.mounts);
    free(run.args.paths);
    pthread_mutex_destroy(&run.lock);
    return status;
}
