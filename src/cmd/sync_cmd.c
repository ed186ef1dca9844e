/*
 * sync_cmd.c - `s3cachefs sync` and `s3cachefs pending` (see sync_cmd.h):
 * find the mount, ask its daemon, print.
 *
 * The checks come in an order that gives each failure its own sentence:
 * the path, /proc/self/mountinfo (a mount point? of what type?), then the
 * daemon (user.s3cachefs.pid: alive? answering?), then the request itself
 * (ENODATA: a daemon older than the request). The mount point is never
 * stat()ed before mountinfo says what it is (a stuck daemon would hang the
 * command), and the quick questions (the pid, the pending list) are asked
 * by a child process given a few seconds: one the daemon never answers is
 * killed, and a kill ends a FUSE request that the daemon has not read yet.
 *
 * The sync itself is asked in this process, and may take as long as the
 * uploads do: the kernel gives a FUSE request no time limit, but a signal
 * to the waiting process makes it send the daemon an interrupt, which
 * ends the daemon's wait at once with a report of what is left. So
 * SIGINT, SIGTERM, SIGHUP and --timeout (SIGALRM) are caught without
 * SA_RESTART; the first one also arms an interval timer that keeps sending
 * SIGALRM every REASK_MS until getxattr() returns, since a signal that
 * came just before the request was sent interrupted nothing.
 */
#include "config.h"

#include "cmd/sync_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "base/clock.h"
#include "cmd/args.h"
#include "cmd/mounts.h"
#include "ctl/sync_text.h"
#include "fs/fs.h"

#define EXIT_OK 0
#define EXIT_FAILED 1
#define EXIT_USAGE 2

#define ASK_TIMEOUT_MS 5000         /* the daemon's pid */
#define LIST_TIMEOUT_MS 30000       /* the pending list */
#define REASK_MS 50                 /* a stop signal is sent again */
#define TIMEOUT_MAX 1e7             /* --timeout, seconds */

static volatile sig_atomic_t stop_signal;

struct args {
    const char *command;            /* "sync" or "pending" */
    const char *mountpoint;
    bool help, json, yes;
    double timeout;                 /* sync: seconds, 0: none */
    const char *drop;               /* pending --drop PATH */
};

/* The mount asked. */
struct target {
    char *path;                     /* absolute, as mountinfo has it */
    char type[64];                  /* "fuse.s3cachefs"... */
    long pid;                       /* the daemon's */
};

/* One file line of an answer: its fields (the path last, unescaped). */
struct file_line {
    char *fields[SYNC_TEXT_FIELDS_MAX];
    size_t count;
    const char *path;               /* the last field, unescaped */
    char *shown;                    /* the path as printed (escaped) */
};

/* An answer of the daemon (sync_text.h). */
struct report {
    char *text;                     /* owned; fields point into it */
    const char *summary;
    struct file_line *files;
    size_t count;
};

/* ------------------------------------------------------------ usage */

static const char sync_help[] =
    "usage: s3cachefs sync [--timeout SECONDS] [--json] MOUNTPOINT\n"
    "\n"
    "Upload everything written so far through the s3cachefs mount at\n"
    "MOUNTPOINT now, and return once it is in the bucket: every file waiting\n"
    "for its upload (queued, settling, or waiting to be retried), each as far\n"
    "as its last close. Bytes written through a descriptor still open, and\n"
    "not closed yet, are not waited for; such files are named. Prints each\n"
    "file waited for and a summary (files, bytes, seconds).\n"
    "\n"
    "  --timeout SECONDS  stop waiting after SECONDS (uploads go on)\n"
    "  --json             print the report as one JSON object\n"
    "  -h, --help         this text\n"
    "\n"
    "SIGINT, SIGTERM and SIGHUP stop the wait too. Exit status: 0 everything\n"
    "is in the bucket; 1 a file could not be uploaded (it stays journaled and\n"
    "is retried; s3cachefs pending shows it), the wait was stopped, or the\n"
    "mount could not be asked; 2 bad usage.\n";

static const char pending_help[] =
    "usage: s3cachefs pending [--json] MOUNTPOINT\n"
    "       s3cachefs pending MOUNTPOINT --drop PATH [--yes]\n"
    "\n"
    "List what the s3cachefs mount at MOUNTPOINT has not uploaded yet (its\n"
    "journal and staging area): per file its state, size, age since it was\n"
    "closed, failed attempts and path. States: open (written through a\n"
    "descriptor still open, not closed yet), waiting (closed, its upload\n"
    "queued or waiting for a retry), uploading, failed (its last upload\n"
    "failed: the error is shown; it is retried).\n"
    "\n"
    "  --json        print the list as one JSON object\n"
    "  --drop PATH   give up the pending data of the file at PATH (relative\n"
    "                to MOUNTPOINT, or under it), as listed: it is never\n"
    "                uploaded, its journal entry and staged data are removed\n"
    "                (the daemon logs it), and the file leaves the mount as\n"
    "                after an unlink that never reached the bucket (an older\n"
    "                object under its name stays there and shows again)\n"
    "  --yes         drop without asking (needed when stdin is not a terminal)\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 done; 1 the mount could not be asked, or the drop was\n"
    "refused; 2 bad usage.\n";

static int usage_error(const struct args *args, const char *what, const char *arg)
{
    fprintf(stderr, "s3cachefs %s: %s%s%s\n", args->command, what,
            arg != NULL ? ": " : "", arg != NULL ? arg : "");
    fprintf(stderr, "usage: %s (s3cachefs %s --help says more)\n",
            strcmp(args->command, "sync") == 0
                ? "s3cachefs sync [--timeout SECONDS] [--json] MOUNTPOINT"
                : "s3cachefs pending [--json] MOUNTPOINT [--drop PATH [--yes]]",
            args->command);
    return EXIT_USAGE;
}

/* An option of these commands (not of a mount): ARG, or its name before
 * '='. */
static bool own_option(const char *arg)
{
    static const char *const names[] = {"-h", "--help", "--json", "--timeout",
                                        "--drop", "--yes", "-y"};

    return args_is_one_of(arg, names, sizeof(names) / sizeof(names[0]));
}

static int parse_args(int argc, char **argv, struct args *args)
{
    bool options_done = false, sync = strcmp(argv[1], "sync") == 0;

    *args = (struct args){.command = argv[1]};
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *value;
        bool missing = false;
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            if (args->mountpoint != NULL)
                return usage_error(args, "one mount point only", arg);
            args->mountpoint = arg;
        } else if (strcmp(arg, "--") == 0) {
            options_done = true;
        } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            args->help = true;
        } else if (strcmp(arg, "--json") == 0) {
            args->json = true;
        } else if (!sync && (strcmp(arg, "--yes") == 0 || strcmp(arg, "-y") == 0)) {
            args->yes = true;
        } else if (sync && ((value = args_value(argv, argc, &i, "--timeout",
                                                  &missing)) != NULL ||
                            missing)) {
            char *end = NULL;
            args->timeout = missing ? -1 : strtod(value, &end);
            if (missing || end == value || *end != '\0' || !(args->timeout > 0) ||
                args->timeout > TIMEOUT_MAX)
                return usage_error(args, "--timeout wants a number of seconds "
                                   "above 0", missing ? NULL : value);
        } else if (!sync && ((value = args_value(argv, argc, &i, "--drop",
                                                   &missing)) != NULL ||
                             missing)) {
            if (missing || value[0] == '\0')
                return usage_error(args, "--drop wants a path", NULL);
            if (args->drop != NULL)
                return usage_error(args, "one --drop at a time", value);
            args->drop = value;
        } else {
            return usage_error(args, "unknown option", arg);
        }
    }
    if (args->help)
        return EXIT_OK;
    if (args->mountpoint == NULL)
        return usage_error(args, "no mount point", NULL);
    if (args->yes && args->drop == NULL)
        return usage_error(args, "--yes goes with --drop", NULL);
    if (args->json && args->drop != NULL)
        return usage_error(args, "--json lists; --drop drops: one or the other",
                           NULL);
    return EXIT_OK;
}

/* ------------------------------------------------------------ the mount */

/* Attribute NAME of PATH, read by a child process within TIMEOUT_MS
 * (mounts.h), into *VALUE (malloc'd) and *LEN. 0; getxattr()'s errno;
 * ETIMEDOUT; EIO, ENOMEM, or fork()'s errno. */
static int ask_xattr(const char *path, const char *name, int timeout_ms,
                     char **value, size_t *len)
{
    return mounts_ask_xattr(path, name, SYNC_TEXT_VALUE_MAX, timeout_ms, NULL,
                            NULL, value, len);
}

/* The mount at PATH: its type into TYPE (CAP bytes); false if PATH is not
 * a mount point. */
static bool find_mount(const char *path, char *type, size_t cap)
{
    struct mounts_entry *mount = malloc(sizeof(*mount));
    bool found = mount != NULL && mounts_at(path, mount);

    if (found)
        snprintf(type, cap, "%s", mount->type);
    free(mount);
    return found;
}

bool sync_cmd_requested(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "sync") != 0 && strcmp(argv[1], "pending") != 0))
        return false;
    if (argc == 2)
        return true;
    for (int i = 2; i < argc; i++)
        if (own_option(argv[i]))
            return true;
    if (argv[2][0] == '-')
        return false; /* `s3cachefs sync -f /mnt`: a mount's option */
    return mounts_is_s3cachefs(argv[2], ASK_TIMEOUT_MS);
}

/* Why asking TARGET's daemon for NAME failed with ERR (one sentence). */
static void report_ask_failure(const struct target *target, const char *name,
                               int err)
{
    const char *path = target->path;

    switch (err) {
    case ETIMEDOUT:
        fprintf(stderr, "s3cachefs: %s: its daemon does not answer (it is "
                "stopped or stuck; its log may say why)\n", path);
        break;
    case ENOTCONN:
        fprintf(stderr, "s3cachefs: %s: its daemon is gone; the mount is left "
                "over (fusermount3 -u %s removes it; the next mount on its "
                "cache directory uploads what its journal holds)\n", path, path);
        break;
    case ENODATA:
    case ENOTSUP:
        if (strcmp(name, FS_PID_XATTR) == 0)
            fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount (a %s "
                    "mount)\n", path, target->type);
        else
            fprintf(stderr, "s3cachefs: %s: its daemon (pid %ld) is older than "
                    "this command and does not answer %s; remount it with this "
                    "version (s3cachefs --unmount %s waits for its uploads)\n",
                    path, target->pid, name, path);
        break;
    case EACCES:
    case EPERM:
        fprintf(stderr, "s3cachefs: %s: %s (the request needs %s permission on "
                "the mount root)\n", path, strerror(err),
                strcmp(name, FS_DROP_XATTR) == 0 ? "write" : "read");
        break;
    default:
        fprintf(stderr, "s3cachefs: %s: cannot ask its daemon: %s\n", path,
                strerror(err));
        break;
    }
}

/* The mount at ARG and its daemon into *TARGET: 0, or an exit status after
 * one sentence on stderr. */
static int find_target(const char *arg, struct target *target)
{
    char *pid_text = NULL;
    size_t len = 0;
    struct stat st;

    int err = mounts_canonical_path(arg, &target->path);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s: %s\n", arg, strerror(err));
        return EXIT_FAILED;
    }
    if (!find_mount(target->path, target->type, sizeof(target->type))) {
        /* not a mount point (safe to stat now), unless a symbolic link to
         * one */
        if (lstat(arg, &st) != 0) {
            fprintf(stderr, "s3cachefs: %s: %s\n", arg, strerror(errno));
            return EXIT_FAILED;
        }
        char *resolved = S_ISLNK(st.st_mode) ? realpath(arg, NULL) : NULL;
        if (resolved == NULL ||
            !find_mount(resolved, target->type, sizeof(target->type))) {
            free(resolved);
            fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount (not a "
                    "mount point)\n", arg);
            return EXIT_FAILED;
        }
        free(target->path);
        target->path = resolved;
    }
    if (strncmp(target->type, "fuse", 4) != 0) {
        fprintf(stderr, "s3cachefs: %s is not an s3cachefs mount (a %s mount)\n",
                target->path, target->type);
        return EXIT_FAILED;
    }
    err = ask_xattr(target->path, FS_PID_XATTR, ASK_TIMEOUT_MS, &pid_text, &len);
    if (err != 0) {
        report_ask_failure(target, FS_PID_XATTR, err);
        return EXIT_FAILED;
    }
    char *end = NULL;
    target->pid = strtol(pid_text, &end, 10);
    if (end == pid_text || *end != '\0')
        target->pid = 0;
    free(pid_text);
    return EXIT_OK;
}

/* ------------------------------------------------------------ answers */

static void report_free(struct report *report)
{
    for (size_t i = 0; i < report->count; i++)
        free(report->files[i].shown);
    free(report->files);
    free(report->text);
    *report = (struct report){0};
}

/* TEXT (LEN bytes, owned by REPORT from now on) as an answer starting
 * with HEADER whose file lines have FIELDS fields after "file". 0 or
 * EPROTO (an answer this command cannot read), ENOMEM. */
static int report_parse(char *text, size_t len, const char *header,
                        size_t fields, struct report *report)
{
    size_t lines = 0;
    int err = 0;

    *report = (struct report){.text = text};
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    report->files = calloc(lines ? lines : 1, sizeof(*report->files));
    if (report->files == NULL)
        return ENOMEM;
    char *line = text, *next = NULL;
    for (size_t index = 0; err == 0 && line < text + len; index++, line = next) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (end == NULL)
            return EPROTO; /* cut short */
        *end = '\0';
        next = end + 1;
        if (index == 0) {
            if (strcmp(line, header) != 0)
                return EPROTO;
            continue;
        }
        if (strncmp(line, "summary ", 8) == 0) {
            report->summary = line;
            continue;
        }
        if (strncmp(line, "file\t", 5) != 0)
            continue; /* a line of a later version */
        struct file_line *file = &report->files[report->count];
        file->count = sync_text_split(line + 5, file->fields, fields);
        if (file->count != fields)
            return EPROTO;
        file->shown = strdup(file->fields[fields - 1]);
        if (file->shown == NULL)
            return ENOMEM;
        report->count++;
        if (sync_text_unescape(file->fields[fields - 1]) != 0)
            return EPROTO;
        file->path = file->fields[fields - 1];
    }
    return report->summary != NULL ? 0 : EPROTO;
}

static double summary_value(const struct report *report, const char *name)
{
    double value = 0;

    return sync_text_summary_get(report->summary, name, &value) ? value : 0;
}

static uint64_t number_of(const char *field)
{
    return strtoull(field, NULL, 10);
}

/* BYTES as "12.3 MiB" into BUF. */
static const char *human_size(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = (double)bytes;
    size_t unit = 0;

    if (bytes < 1024) {
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
        return buf;
    }
    value /= 1024;
    while (value >= 1024 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        value /= 1024;
        unit++;
    }
    snprintf(buf, cap, "%.1f %s", value, units[unit]);
    return buf;
}

/* SECONDS as "42s", "12m", "5.1h", "3.2d" into BUF. */
static const char *human_age(double seconds, char *buf, size_t cap)
{
    if (seconds < 120)
        snprintf(buf, cap, "%.0fs", seconds);
    else if (seconds < 7200)
        snprintf(buf, cap, "%.0fm", seconds / 60);
    else if (seconds < 172800)
        snprintf(buf, cap, "%.1fh", seconds / 3600);
    else
        snprintf(buf, cap, "%.1fd", seconds / 86400);
    return buf;
}

/* TEXT as a JSON string on OUT (UTF-8 passed through). */
static void json_string(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *at = (const unsigned char *)text; *at != '\0'; at++) {
        if (*at == '"' || *at == '\\')
            fprintf(out, "\\%c", *at);
        else if (*at == '\n')
            fputs("\\n", out);
        else if (*at == '\t')
            fputs("\\t", out);
        else if (*at < 0x20 || *at == 0x7f)
            fprintf(out, "\\u%04x", *at);
        else
            fputc(*at, out);
    }
    fputc('"', out);
}

/* The text of errno ERR as JSON (null for 0). */
static void json_error(FILE *out, int err)
{
    if (err == 0)
        fputs("null", out);
    else
        json_string(out, strerror(err));
}

/* Flush stdout: 0, or an exit status after a sentence. */
static int finish_output(int status)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "s3cachefs: cannot write the output: %s\n",
                strerror(errno));
        return EXIT_FAILED;
    }
    return status;
}

/* ---------------------------------------------------------------- sync */

static void on_stop(int signum)
{
    if (stop_signal == 0)
        stop_signal = signum;
    /* again and again until the request is interrupted (see the top) */
    struct itimerval again = {{0, REASK_MS * 1000}, {0, REASK_MS * 1000}};
    setitimer(ITIMER_REAL, &again, NULL);
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM};

static void catch_stop_signals(bool catch)
{
    struct sigaction action = {.sa_handler = catch ? on_stop : SIG_DFL};

    sigemptyset(&action.sa_mask);
    action.sa_flags = 0; /* no SA_RESTART: the getxattr is to end */
    for (size_t i = 0; i < sizeof(stop_signals) / sizeof(stop_signals[0]); i++)
        sigaction(stop_signals[i], &action, NULL);
}

/* What a sync file line says (its fields: STATE SIZE ERRNO RETRIES PATH). */
enum { SYNC_STATE, SYNC_SIZE, SYNC_ERRNO, SYNC_RETRIES, SYNC_PATH, SYNC_FIELDS };

static void print_sync_json(const struct target *target, const struct report *report,
                            const char *stopped)
{
    printf("{\"mountpoint\": ");
    json_string(stdout, target->path);
    printf(", \"files\": [");
    for (size_t i = 0; i < report->count; i++) {
        char *const *f = report->files[i].fields;
        int err = atoi(f[SYNC_ERRNO]);
        printf("%s\n  {\"path\": ", i ? "," : "");
        json_string(stdout, report->files[i].path);
        printf(", \"state\": ");
        json_string(stdout, f[SYNC_STATE]);
        printf(", \"size\": %" PRIu64 ", \"error\": ", number_of(f[SYNC_SIZE]));
        json_error(stdout, err);
        printf(", \"errno\": %d, \"retries\": %s}", err, f[SYNC_RETRIES]);
    }
    printf("%s], \"count\": %.0f, \"bytes\": %.0f, \"seconds\": %.3f, "
           "\"uploaded\": %.0f, \"failed\": %.0f, \"removed\": %.0f, "
           "\"not_closed\": %.0f, \"waiting\": %.0f, \"listed\": %zu, "
           "\"stopped\": ", report->count ? "\n" : "",
           summary_value(report, "files"), summary_value(report, "bytes"),
           summary_value(report, "seconds"), summary_value(report, "uploaded"),
           summary_value(report, "failed"), summary_value(report, "removed"),
           summary_value(report, "not_closed"), summary_value(report, "waiting"),
           report->count);
    if (stopped != NULL)
        json_string(stdout, stopped);
    else
        fputs("null", stdout);
    printf("}\n");
}

static void print_sync_text(const struct target *target, const struct report *report,
                            const char *stopped)
{
    /* what went, then what did not, failures last (stderr) */
    static const char *const order[] = {"uploaded", "removed", "not-closed",
                                        "waiting"};
    char size[32];

    for (size_t o = 0; o < sizeof(order) / sizeof(order[0]); o++)
        for (size_t i = 0; i < report->count; i++) {
            char *const *f = report->files[i].fields;
            if (strcmp(f[SYNC_STATE], order[o]) != 0)
                continue;
            const char *note = o == 1   ? "  (removed meanwhile: nothing to upload)"
                               : o == 2 ? "  (open for writing, nothing closed: "
                                          "not waited for)"
                               : o == 3 ? "  (not in the bucket yet)" : "";
            printf("%-10s %10s  %s%s\n", o == 2 ? "not closed" : o == 3
                   ? "waiting" : order[o], human_size(number_of(f[SYNC_SIZE]),
                                                      size, sizeof(size)),
                   report->files[i].shown, note);
        }
    fflush(stdout);
    for (size_t i = 0; i < report->count; i++) {
        char *const *f = report->files[i].fields;
        if (strcmp(f[SYNC_STATE], "failed") != 0)
            continue;
        unsigned retries = (unsigned)number_of(f[SYNC_RETRIES]);
        fprintf(stderr, "s3cachefs: %s (%s) could not be uploaded: %s (%u failed "
                "attempt%s since its last upload); it stays journaled and is "
                "retried (s3cachefs pending %s shows it)\n",
                report->files[i].shown,
                human_size(number_of(f[SYNC_SIZE]), size, sizeof(size)),
                strerror(atoi(f[SYNC_ERRNO])), retries, retries == 1 ? "" : "s",
                target->path);
    }
    double files = summary_value(report, "files");
    double listed = 0;
    for (size_t i = 0; i < report->count; i++)
        listed += strcmp(report->files[i].fields[SYNC_STATE], "not-closed") != 0;
    if (listed < files)
        printf("(%.0f more files not listed: the answer is limited to 64 KiB)\n",
               files - listed);
    double failed = summary_value(report, "failed");
    double waiting = summary_value(report, "waiting");
    printf("%s %.0f file%s, %s (%.0f bytes), in %.2f s",
           failed + waiting > 0 ? "waited for" : "synced", files,
           files == 1 ? "" : "s",
           human_size((uint64_t)summary_value(report, "bytes"), size, sizeof(size)),
           summary_value(report, "bytes"), summary_value(report, "seconds"));
    if (failed > 0)
        printf("; %.0f failed", failed);
    if (waiting > 0)
        printf("; %.0f not in the bucket yet (%s)", waiting,
               stopped != NULL ? stopped : "stopped");
    printf("\n");
}

static int run_sync(const struct target *target, const struct args *args)
{
    char *value = malloc(SYNC_TEXT_VALUE_MAX + 1);
    struct report report = {0};
    ssize_t len = -1;
    int err = 0;

    if (value == NULL) {
        fprintf(stderr, "s3cachefs: %s\n", strerror(ENOMEM));
        return EXIT_FAILED;
    }
    stop_signal = 0;
    catch_stop_signals(true);
    if (args->timeout > 0) {
        struct itimerval limit = {
            .it_value = {(time_t)args->timeout,
                         (suseconds_t)((args->timeout - (double)(time_t)args->timeout) * 1e6)},
        };
        if (limit.it_value.tv_sec == 0 && limit.it_value.tv_usec == 0)
            limit.it_value.tv_usec = 1;
        setitimer(ITIMER_REAL, &limit, NULL);
    }
    double started = clock_monotonic_seconds();
    for (;;) {
        len = getxattr(target->path, FS_SYNC_XATTR, value, SYNC_TEXT_VALUE_MAX);
        err = len < 0 ? errno : 0;
        /* EINTR with no signal of ours: again; with one, the daemon
         * answered nothing (never got the request, or an older one) */
        if (err != EINTR || stop_signal != 0)
            break;
    }
    double seconds = clock_monotonic_seconds() - started;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    catch_stop_signals(false);

    char why[64] = "";
    if (stop_signal == SIGALRM)
        snprintf(why, sizeof(why), "timed out after %g s", args->timeout);
    else if (stop_signal != 0)
        snprintf(why, sizeof(why), "stopped by SIG%s", sigabbrev_np(stop_signal));
    const char *stopped = stop_signal != 0 ? why : NULL;
    if (err == EINTR) {
        fprintf(stderr, "s3cachefs: %s: sync %s after %.1f s, before its "
                "daemon answered; the uploads go on\n", target->path, why,
                seconds);
        free(value);
        return EXIT_FAILED;
    }
    if (err != 0) {
        report_ask_failure(target, FS_SYNC_XATTR, err);
        free(value);
        return EXIT_FAILED;
    }
    value[len] = '\0';
    err = report_parse(value, (size_t)len, SYNC_TEXT_SYNC_HEADER, SYNC_FIELDS,
                       &report);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s: its daemon's answer cannot be read "
                "(%s): is it another version?\n", target->path,
                err == EPROTO ? "unknown format" : strerror(err));
        report_free(&report);
        return EXIT_FAILED;
    }
    if (args->json)
        print_sync_json(target, &report, stopped);
    else
        print_sync_text(target, &report, stopped);
    bool left = summary_value(&report, "failed") > 0 ||
                summary_value(&report, "waiting") > 0;
    report_free(&report);
    return finish_output(left ? EXIT_FAILED : EXIT_OK);
}

/* ------------------------------------------------------------- pending */

/* The fields of a pending file line. */
enum {
    PEND_STATE, PEND_SIZE, PEND_PROMISED, PEND_OPEN, PEND_AGE, PEND_RETRIES,
    PEND_ERRNO, PEND_ID, PEND_PATH, PEND_FIELDS
};

/* Whether pending line FIELDS is a directory's marker (no staging file:
 * writeback mode sends it soon), not a file. */
static bool pending_marker(char *const *fields)
{
    return strcmp(fields[PEND_ID], "-") == 0;
}

/* The pending list of TARGET into *REPORT: 0, or an exit status after a
 * sentence. */
static int read_pending(const struct target *target, struct report *report)
{
    char *value = NULL;
    size_t len = 0;
    int err = ask_xattr(target->path, FS_PENDING_XATTR, LIST_TIMEOUT_MS, &value,
                        &len);

    if (err != 0) {
        report_ask_failure(target, FS_PENDING_XATTR, err);
        return EXIT_FAILED;
    }
    err = report_parse(value, len, SYNC_TEXT_PENDING_HEADER, PEND_FIELDS, report);
    if (err != 0) {
        fprintf(stderr, "s3cachefs: %s: its daemon's answer cannot be read "
                "(%s): is it another version?\n", target->path,
                err == EPROTO ? "unknown format" : strerror(err));
        report_free(report);
        return EXIT_FAILED;
    }
    return EXIT_OK;
}

static void print_pending_json(const struct target *target, const struct report *report)
{
    printf("{\"mountpoint\": ");
    json_string(stdout, target->path);
    printf(", \"files\": [");
    for (size_t i = 0; i < report->count; i++) {
        char *const *f = report->files[i].fields;
        int err = atoi(f[PEND_ERRNO]);
        printf("%s\n  {\"path\": ", i ? "," : "");
        json_string(stdout, report->files[i].path);
        printf(", \"kind\": \"%s\"", pending_marker(f) ? "directory" : "file");
        printf(", \"state\": ");
        json_string(stdout, f[PEND_STATE]);
        printf(", \"size\": %" PRIu64 ", \"promised_size\": %s, "
               "\"open_for_writing\": %s, \"age_seconds\": %s, \"retries\": %s, "
               "\"last_error\": ", number_of(f[PEND_SIZE]),
               strcmp(f[PEND_PROMISED], "-") == 0 ? "null" : f[PEND_PROMISED],
               strcmp(f[PEND_OPEN], "1") == 0 ? "true" : "false",
               strcmp(f[PEND_AGE], "-") == 0 ? "null" : f[PEND_AGE],
               f[PEND_RETRIES]);
        json_error(stdout, err);
        printf(", \"errno\": %d, \"staging_id\": ", err);
        if (pending_marker(f))
            printf("null");
        else
            json_string(stdout, f[PEND_ID]);
        printf("}");
    }
    printf("%s], \"count\": %.0f, \"bytes\": %.0f, \"open\": %.0f, "
           "\"waiting\": %.0f, \"uploading\": %.0f, \"failed\": %.0f, "
           "\"journal_entries\": %.0f, \"markers\": %.0f, "
           "\"markers_failed\": %.0f, \"listed\": %zu}\n",
           report->count ? "\n" : "", summary_value(report, "files"),
           summary_value(report, "bytes"), summary_value(report, "open"),
           summary_value(report, "waiting"), summary_value(report, "uploading"),
           summary_value(report, "failed"),
           summary_value(report, "journal_entries"),
           summary_value(report, "markers"),
           summary_value(report, "markers_failed"), report->count);
}

static void print_pending_text(const struct report *report)
{
    char size[32], age[32];

    if (report->count > 0)
        printf("%-10s %10s %6s %7s  %s\n", "STATE", "SIZE", "AGE", "RETRIES",
               "PATH");
    for (size_t i = 0; i < report->count; i++) {
        char *const *f = report->files[i].fields;
        bool promised = strcmp(f[PEND_PROMISED], "-") != 0;
        bool open = strcmp(f[PEND_OPEN], "1") == 0;
        uint64_t bytes = number_of(promised ? f[PEND_PROMISED] : f[PEND_SIZE]);
        const char *shown_age = strcmp(f[PEND_AGE], "-") == 0
                                    ? "-" : human_age(strtod(f[PEND_AGE], NULL),
                                                      age, sizeof(age));
        bool marker = pending_marker(f);
        printf("%-10s %10s %6s %7s  %s%s\n", f[PEND_STATE],
               marker ? "-" : human_size(bytes, size, sizeof(size)), shown_age,
               f[PEND_RETRIES], report->files[i].shown,
               marker ? "  (directory marker)"
               : open && promised ? "  (open for writing: more may come)" : "");
        int err = atoi(f[PEND_ERRNO]);
        if (err != 0)
            printf("%-10s last error: %s\n", "", strerror(err));
    }
    double files = summary_value(report, "files");
    double markers = summary_value(report, "markers");
    if (report->count < files + markers)
        printf("(%.0f more not listed: the answer is limited to 64 KiB)\n",
               files + markers - (double)report->count);
    if (markers > 0)
        printf("%.0f directory marker%s waiting to be sent (%.0f failed)%s\n",
               markers, markers == 1 ? "" : "s",
               summary_value(report, "markers_failed"),
               files == 0 ? "; no file pending" : "");
    if (files == 0 && markers > 0)
        return;
    if (files == 0) {
        printf("nothing pending; the journal holds %.0f entr%s\n",
               summary_value(report, "journal_entries"),
               summary_value(report, "journal_entries") == 1 ? "y" : "ies");
        return;
    }
    printf("%.0f file%s pending, %s staged: %.0f failed, %.0f uploading, "
           "%.0f waiting, %.0f open (not closed); the journal holds %.0f "
           "entr%s\n", files, files == 1 ? "" : "s",
           human_size((uint64_t)summary_value(report, "bytes"), size, sizeof(size)),
           summary_value(report, "failed"), summary_value(report, "uploading"),
           summary_value(report, "waiting"), summary_value(report, "open"),
           summary_value(report, "journal_entries"),
           summary_value(report, "journal_entries") == 1 ? "y" : "ies");
}

static int run_pending(const struct target *target, const struct args *args)
{
    struct report report = {0};
    int status = read_pending(target, &report);

    if (status != EXIT_OK)
        return status;
    if (args->json)
        print_pending_json(target, &report);
    else
        print_pending_text(&report);
    report_free(&report);
    return finish_output(EXIT_OK);
}

/* Ask on the terminal whether to drop FILE: true for yes. */
static bool confirm_drop(const struct target *target, const struct file_line *file)
{
    char *const *f = file->fields;
    char size[32], answer[16];
    bool promised = strcmp(f[PEND_PROMISED], "-") != 0;
    int err = atoi(f[PEND_ERRNO]);

    fprintf(stderr, "drop %s (%s, %s%s%s) from %s? Its data is deleted and never "
            "uploaded; the bucket is not changed. [y/N] ", file->shown,
            human_size(number_of(promised ? f[PEND_PROMISED] : f[PEND_SIZE]),
                       size, sizeof(size)),
            f[PEND_STATE], err != 0 ? ": " : "", err != 0 ? strerror(err) : "",
            target->path);
    fflush(stderr);
    if (fgets(answer, sizeof(answer), stdin) == NULL)
        return false;
    return strcmp(answer, "y\n") == 0 || strcmp(answer, "yes\n") == 0 ||
           strcmp(answer, "Y\n") == 0;
}

static int run_drop(const struct target *target, const struct args *args)
{
    struct report report = {0};
    const char *path = args->drop;
    size_t root_len = strlen(target->path);
    int status;

    /* under the mount point, or relative to it */
    if (path[0] == '/') {
        if (strncmp(path, target->path, root_len) != 0 ||
            (path[root_len] != '/' && strcmp(target->path, "/") != 0)) {
            fprintf(stderr, "s3cachefs pending: %s is not under %s (give the "
                    "path as s3cachefs pending lists it)\n", path, target->path);
            return EXIT_USAGE;
        }
        path += root_len;
        while (path[0] == '/')
            path++;
    }
    status = read_pending(target, &report);
    if (status != EXIT_OK)
        return status;
    const struct file_line *file = NULL;
    for (size_t i = 0; i < report.count && file == NULL; i++)
        if (strcmp(report.files[i].path, path) == 0)
            file = &report.files[i];
    status = EXIT_FAILED;
    if (file == NULL) {
        fprintf(stderr, "s3cachefs: %s: nothing pending at %s (s3cachefs "
                "pending %s lists what is)\n", target->path, path, target->path);
        goto out;
    }
    if (pending_marker(file->fields)) {
        fprintf(stderr, "s3cachefs: %s is a directory's marker waiting to be "
                "sent: it holds no data to drop (s3cachefs sync %s sends it)\n",
                file->shown, target->path);
        goto out;
    }
    if (strcmp(file->fields[PEND_OPEN], "1") == 0) {
        fprintf(stderr, "s3cachefs: %s is open for writing: close it first "
                "(what is written and not closed is no journal entry)\n",
                file->shown);
        goto out;
    }
    if (!args->yes) {
        if (!isatty(STDIN_FILENO)) {
            fprintf(stderr, "s3cachefs pending: not asking on a terminal: give "
                    "--yes to drop %s\n", file->shown);
            status = EXIT_USAGE;
            goto out;
        }
        if (!confirm_drop(target, file)) {
            fprintf(stderr, "s3cachefs: nothing dropped\n");
            goto out;
        }
    }
    if (setxattr(target->path, FS_DROP_XATTR, path, strlen(path), 0) != 0) {
        int err = errno;
        switch (err) {
        case ENOENT:
            fprintf(stderr, "s3cachefs: %s: nothing pending at %s any more\n",
                    target->path, file->shown);
            break;
        case EALREADY:
            fprintf(stderr, "s3cachefs: %s reached the bucket meanwhile: "
                    "nothing to drop\n", file->shown);
            break;
        case EBUSY:
            fprintf(stderr, "s3cachefs: %s is open for writing or being "
                    "uploaded right now: try again once its upload has failed "
                    "(s3cachefs pending %s shows its state)\n", file->shown,
                    target->path);
            break;
        case EROFS:
            fprintf(stderr, "s3cachefs: %s is mounted read-only: nothing is "
                    "pending there\n", target->path);
            break;
        case ENOTSUP:
            report_ask_failure(target, FS_DROP_XATTR, ENODATA);
            break;
        default:
            report_ask_failure(target, FS_DROP_XATTR, err);
            break;
        }
        goto out;
    }
    char size[32];
    bool promised = strcmp(file->fields[PEND_PROMISED], "-") != 0;
    printf("dropped %s (%s, staging file %s): it is never uploaded; its journal "
           "entry and staged data are removed\n", file->shown,
           human_size(number_of(file->fields[promised ? PEND_PROMISED : PEND_SIZE]),
                      size, sizeof(size)), file->fields[PEND_ID]);
    status = finish_output(EXIT_OK);
out:
    report_free(&report);
    return status;
}

/* ----------------------------------------------------------------- main */

int sync_cmd_main(int argc, char **argv)
{
    struct args args;
    struct target target = {0};
    int status = parse_args(argc, argv, &args);

    if (status != EXIT_OK)
        return status;
    if (args.help) {
        fputs(strcmp(args.command, "sync") == 0 ? sync_help : pending_help, stdout);
        return finish_output(EXIT_OK);
    }
    status = find_target(args.mountpoint, &target);
    if (status == EXIT_OK) {
        if (strcmp(args.command, "sync") == 0)
            status = run_sync(&target, &args);
        else if (args.drop != NULL)
            status = run_drop(&target, &args);
        else
            status = run_pending(&target, &args);
    }
    free(target.path);
    return status;
}
