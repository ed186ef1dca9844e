/*
 * credsource.c - the sources of keys (see credsource.h for the order and
 * the protocols): static keys, credential_process, container credentials,
 * EC2 instance metadata (IMDSv2).
 *
 * No shared state: each source's fetch is called one at a time by its
 * struct credentials, with no lock held; its argument is read-only after
 * credsource_choose().
 */
#include "config.h"

#include "creds/credsource.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "base/clock.h"
#include "base/secret.h"
#include "base/text.h"

extern char **environ;

#define PROCESS_TIMEOUT_MS 60000     /* a credential_process that hangs */
#define STDERR_QUOTE 200             /* bytes of its stderr in a message */
#define ECS_HOST "http://169.254.170.2"
#define IMDS_DEFAULT "http://169.254.169.254"
#define IMDS_DEFAULT_IPV6 "http://[fd00:ec2::254]"
#define IMDS_TOKEN_TTL "21600"
#define IMDS_ROLE_MAX 256
#define CONTAINER_TIMEOUT_S 2.0
#define CONTAINER_ATTEMPTS 3
#define TOKEN_FILE_MAX 16384

static const char *env_get(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && *value != '\0' ? value : NULL;
}

static void wipe_free(char **text)
{
    if (*text != NULL) {
        OPENSSL_cleanse(*text, strlen(*text));
        free(*text);
        *text = NULL;
    }
}

/* ------------------------------------------------------- splitting */

void credsource_argv_free(char ***argvp)
{
    char **argv = *argvp;

    if (argv == NULL)
        return;
    for (size_t i = 0; argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
    *argvp = NULL;
}

int credsource_split(const char *command, char ***argvp)
{
    size_t len = strlen(command), count = 0, cap = 4;
    char **argv = calloc(cap + 1, sizeof(char *));
    char *word = malloc(len + 1);
    size_t wlen = 0;
    bool in_word = false;
    int err = 0;

    *argvp = NULL;
    if (argv == NULL || word == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (const char *p = command;; p++) {
        char c = *p;

        if (c == '\0' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (in_word) {
                if (count == cap) {
                    char **grown = realloc(argv, (cap * 2 + 1) * sizeof(char *));
                    if (grown == NULL) {
                        err = ENOMEM;
                        goto out;
                    }
                    argv = grown;
                    cap *= 2;
                }
                argv[count] = strndup(word, wlen);
                if (argv[count] == NULL) {
                    err = ENOMEM;
                    goto out;
                }
                argv[++count] = NULL;
                wlen = 0;
                in_word = false;
            }
            if (c == '\0')
                break;
            continue;
        }
        in_word = true;
        if (c == '\\') {
            if (p[1] == '\0') {
                err = EINVAL;
                goto out;
            }
            word[wlen++] = *++p;
        } else if (c == '\'') {
            const char *end = strchr(p + 1, '\'');
            if (end == NULL) {
                err = EINVAL;
                goto out;
            }
            memcpy(word + wlen, p + 1, (size_t)(end - p - 1));
            wlen += (size_t)(end - p - 1);
            p = end;
        } else if (c == '"') {
            for (p++;; p++) {
                if (*p == '\0') {
                    err = EINVAL;
                    goto out;
                }
                if (*p == '"')
                    break;
                if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
                    p++;
                word[wlen++] = *p;
            }
        } else {
            word[wlen++] = c;
        }
    }
    if (count == 0)
        err = EINVAL;
out:
    free(word);
    if (err != 0)
        credsource_argv_free(&argv);
    *argvp = argv;
    return err;
}

/* ---------------------------------------------------------- process */

struct process_source {
    char **argv;
    char *name;                     /* the source's name, for messages */
};

static void process_destroy(void *arg)
{
    struct process_source *source = arg;

    credsource_argv_free(&source->argv);
    free(source->name);
    free(source);
}

/* The first line of TEXT (LEN bytes), printable, at most STDERR_QUOTE. */
static void quote_line(const char *text, size_t len, char *out, size_t cap)
{
    size_t n = 0;

    for (size_t i = 0; i < len && n + 1 < cap && n < STDERR_QUOTE; i++) {
        if (text[i] == '\n' || text[i] == '\r') {
            if (n > 0)
                break;
            continue;
        }
        out[n++] = (unsigned char)text[i] >= 0x20 &&
                   (unsigned char)text[i] < 0x7f ? text[i] : '?';
    }
    out[n] = '\0';
}

/*
 * One run of a credential_process: what process_fetch()'s steps share.
 * It is started (process_spawn()), its output read within the deadline
 * (process_collect()), waited for (process_reap()), and what it printed
 * or how it ended judged (process_verdict()); process_run_clear() gives
 * back what is held.
 */
struct process_run {
    const struct process_source *source;
    int out_pipe[2], err_pipe[2];   /* -1: closed */
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    bool actions_made, attr_made;
    pid_t pid;                      /* -1: none to wait for */
    int status;                     /* waitpid()'s */
    char *stdout_buf;               /* CREDENTIALS_JSON_MAX + 1; wiped */
    size_t stdout_len;
    char stderr_buf[1024];          /* the first bytes of stderr; wiped */
    size_t stderr_len;
    bool too_big;                   /* stdout over CREDENTIALS_JSON_MAX */
    bool timed_out;                 /* not done within PROCESS_TIMEOUT_MS */
};

/* RUN's file actions (stdin /dev/null, stdout and stderr into the pipes)
 * and attributes (no signal blocked, the deadly ones at their defaults).
 * Returns 0 or ENOMEM. */
static int process_spawn_attrs(struct process_run *run)
{
    sigset_t none, defaults;

    if (posix_spawn_file_actions_init(&run->actions) != 0)
        return ENOMEM;
    run->actions_made = true;
    posix_spawn_file_actions_addopen(&run->actions, 0, "/dev/null",
                                     O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&run->actions, run->out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&run->actions, run->err_pipe[1], 2);
    if (posix_spawnattr_init(&run->attr) != 0)
        return ENOMEM;
    run->attr_made = true;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGHUP);
    posix_spawnattr_setsigmask(&run->attr, &none);
    posix_spawnattr_setsigdefault(&run->attr, &defaults);
    posix_spawnattr_setflags(&run->attr, POSIX_SPAWN_SETSIGMASK |
                                             POSIX_SPAWN_SETSIGDEF);
    return 0;
}

/* Starts RUN's command with its output into pipes of ours. Returns 0, or
 * the errno with ERRBUF set (but for ENOMEM from the spawn's setup). */
static int process_spawn(struct process_run *run, char *errbuf, size_t errlen)
{
    const struct process_source *source = run->source;
    int err;

    run->stdout_buf = malloc(CREDENTIALS_JSON_MAX + 1);
    if (run->stdout_buf == NULL) {
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    if (pipe2(run->out_pipe, O_CLOEXEC) != 0 ||
        pipe2(run->err_pipe, O_CLOEXEC) != 0) {
        err = errno;
        text_set_err(errbuf, errlen, "%s: cannot make a pipe: %s", source->name,
                strerror(err));
        return err;
    }
    err = process_spawn_attrs(run);
    if (err != 0)
        return err;
    err = posix_spawnp(&run->pid, source->argv[0], &run->actions, &run->attr,
                       source->argv, environ);
    if (err != 0) {
        run->pid = -1;
        text_set_err(errbuf, errlen, "%s: cannot run %s: %s", source->name,
                source->argv[0], strerror(err));
        return err;
    }
    close(run->out_pipe[1]);
    close(run->err_pipe[1]);
    run->out_pipe[1] = run->err_pipe[1] = -1;
    return 0;
}

/* Reads what is ready on *FD (RUN's stdout when IS_STDOUT, else its
 * stderr) into its buffer, within the cap (stdout: past it run->too_big;
 * stderr: the rest dropped); closes *FD at its end. */
static void process_read(struct process_run *run, int *fd, bool is_stdout)
{
    char chunk[4096];
    ssize_t got = read(*fd, chunk, sizeof(chunk));

    if (got < 0 && errno == EINTR)
        return;
    if (got <= 0) {
        close(*fd);
        *fd = -1;
        return;
    }
    if (is_stdout) {
        if ((size_t)got > CREDENTIALS_JSON_MAX - run->stdout_len) {
            run->too_big = true;
        } else {
            memcpy(run->stdout_buf + run->stdout_len, chunk, (size_t)got);
            run->stdout_len += (size_t)got;
        }
    } else {
        size_t room = sizeof(run->stderr_buf) - run->stderr_len;
        size_t take = (size_t)got < room ? (size_t)got : room;
        memcpy(run->stderr_buf + run->stderr_len, chunk, take);
        run->stderr_len += take;
    }
    OPENSSL_cleanse(chunk, sizeof(chunk));
}

/* Reads RUN's stdout and stderr until both end, poll() fails, or
 * PROCESS_TIMEOUT_MS has passed (run->timed_out). */
static void process_collect(struct process_run *run)
{
    uint64_t deadline = clock_monotonic_ms() + PROCESS_TIMEOUT_MS;

    while (run->out_pipe[0] >= 0 || run->err_pipe[0] >= 0) {
        struct pollfd fds[2] = {{.fd = run->out_pipe[0], .events = POLLIN},
                                {.fd = run->err_pipe[0], .events = POLLIN}};
        uint64_t now = clock_monotonic_ms();
        if (now >= deadline) {
            run->timed_out = true;
            break;
        }
        int ready = poll(fds, 2, (int)(deadline - now));
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            break;
        for (int i = 0; i < 2; i++) {
            int *fd = i == 0 ? &run->out_pipe[0] : &run->err_pipe[0];
            if (*fd < 0 || fds[i].revents == 0)
                continue;
            process_read(run, fd, i == 0);
        }
    }
}

/* Waits for RUN's process (killed first when it timed out); its status
 * into run->status. */
static void process_reap(struct process_run *run)
{
    if (run->timed_out)
        kill(run->pid, SIGKILL);
    while (waitpid(run->pid, &run->status, 0) < 0 && errno == EINTR)
        ;
    run->pid = -1;
}

/* What RUN came to: 0 with the keys it printed in OUT, or the errno with
 * ERRBUF saying why (ETIMEDOUT, EIO for a signal or a failed exit with
 * the first line of its stderr, EINVAL for too much output, or the
 * parser's). */
static int process_verdict(const struct process_run *run,
                           struct credentials_fetched *out, char *errbuf,
                           size_t errlen)
{
    const struct process_source *source = run->source;
    int status = run->status, err = 0;
    char detail[512] = "";

    quote_line(run->stderr_buf, run->stderr_len, detail, sizeof(detail));
    if (run->timed_out) {
        err = ETIMEDOUT;
        text_set_err(errbuf, errlen, "%s did not finish within %d s (killed)",
                source->name, PROCESS_TIMEOUT_MS / 1000);
    } else if (WIFSIGNALED(status)) {
        err = EIO;
        text_set_err(errbuf, errlen, "%s was killed by signal %d%s%s",
                source->name, WTERMSIG(status), detail[0] ? ": " : "",
                detail);
    } else if (WEXITSTATUS(status) != 0) {
        err = EIO;
        text_set_err(errbuf, errlen, "%s exited with status %d%s%s", source->name,
                WEXITSTATUS(status), detail[0] ? ": " : "", detail);
    } else if (run->too_big) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "%s printed more than %u KiB", source->name,
                CREDENTIALS_JSON_MAX >> 10);
    } else {
        char why[256];
        err = credentials_parse_json(run->stdout_buf, run->stdout_len,
                                     CREDENTIALS_FORMAT_PROCESS, out, why,
                                     sizeof(why));
        if (err != 0)
            text_set_err(errbuf, errlen, "%s printed no valid credentials: %s",
                    source->name, why);
    }
    return err;
}

/* Gives back what RUN holds (a process still running is killed and
 * waited for) and wipes what it read. */
static void process_run_clear(struct process_run *run)
{
    if (run->pid > 0) {
        kill(run->pid, SIGKILL);
        while (waitpid(run->pid, &run->status, 0) < 0 && errno == EINTR)
            ;
    }
    for (int i = 0; i < 2; i++) {
        if (run->out_pipe[i] >= 0)
            close(run->out_pipe[i]);
        if (run->err_pipe[i] >= 0)
            close(run->err_pipe[i]);
    }
    if (run->actions_made)
        posix_spawn_file_actions_destroy(&run->actions);
    if (run->attr_made)
        posix_spawnattr_destroy(&run->attr);
    if (run->stdout_buf != NULL) {
        OPENSSL_cleanse(run->stdout_buf, CREDENTIALS_JSON_MAX + 1);
        free(run->stdout_buf);
    }
    OPENSSL_cleanse(run->stderr_buf, sizeof(run->stderr_buf));
}

static int process_fetch(void *arg, struct credentials_fetched *out,
                         char *errbuf, size_t errlen)
{
    struct process_run run = {
        .source = arg,
        .out_pipe = {-1, -1},
        .err_pipe = {-1, -1},
        .pid = -1,
    };
    int err = process_spawn(&run, errbuf, errlen);

    if (err == 0) {
        process_collect(&run);
        process_reap(&run);
        err = process_verdict(&run, out, errbuf, errlen);
    }
    process_run_clear(&run);
    return err;
}

/* ------------------------------------------------------------- HTTP */

struct http_answer {
    char *data;                     /* NUL-terminated; wiped when freed */
    size_t len;
    bool too_big;
    long status;
};

static void http_answer_free(struct http_answer *answer)
{
    if (answer->data != NULL) {
        OPENSSL_cleanse(answer->data, answer->len);
        free(answer->data);
    }
    memset(answer, 0, sizeof(*answer));
}

static size_t on_http_body(char *data, size_t size, size_t count, void *userp)
{
    struct http_answer *answer = userp;
    size_t len = size * count;

    if (len > CREDENTIALS_JSON_MAX - answer->len) {
        answer->too_big = true;
        return 0;
    }
    if (answer->data == NULL) {
        answer->data = malloc(CREDENTIALS_JSON_MAX + 1);
        if (answer->data == NULL)
            return 0;
    }
    memcpy(answer->data + answer->len, data, len);
    answer->len += len;
    answer->data[answer->len] = '\0';
    return len;
}

/* Wipe the header lines (they carry tokens), then free them. */
static void headers_free(struct curl_slist *headers)
{
    for (struct curl_slist *h = headers; h != NULL; h = h->next)
        OPENSSL_cleanse(h->data, strlen(h->data));
    curl_slist_free_all(headers);
}

/*
 * METHOD URL with HEADERS (may be NULL), within TIMEOUT seconds: *ANSWER
 * (any status). Returns 0 when the server answered, else EIO with the
 * transport's reason in ERRBUF.
 */
static int http_ask(const char *method, const char *url,
                    const struct curl_slist *headers, double timeout,
                    const char *ca_bundle, struct http_answer *answer,
                    char *errbuf, size_t errlen)
{
    CURL *curl = curl_easy_init();
    CURLcode rc;
    int err = 0;

    memset(answer, 0, sizeof(*answer));
    if (curl == NULL) {
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_PROXY, "");     /* no proxy ever sees them */
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout * 1000));
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (ca_bundle != NULL)
        curl_easy_setopt(curl, CURLOPT_CAINFO, ca_bundle);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, PACKAGE_NAME "/" PACKAGE_VERSION);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_http_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, answer);
    if (strcmp(method, "PUT") == 0) {
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, 0L);
    }
    rc = curl_easy_perform(curl);
    if (rc == CURLE_WRITE_ERROR && answer->too_big) {
        err = EIO;
        text_set_err(errbuf, errlen, "its answer is larger than %u KiB",
                CREDENTIALS_JSON_MAX >> 10);
    } else if (rc != CURLE_OK) {
        err = EIO;
        text_set_err(errbuf, errlen, "%s", curl_easy_strerror(rc));
    } else {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &answer->status);
        if (answer->data == NULL) {
            answer->data = calloc(1, 1);
            if (answer->data == NULL) {
                err = ENOMEM;
                text_set_err(errbuf, errlen, "out of memory");
            }
        }
    }
    if (err != 0)
        http_answer_free(answer);
    curl_easy_cleanup(curl);
    return err;
}

/* ------------------------------------------------------- container */

struct container_source {
    char *url;
    char *token_file;               /* NULL: token (or none) */
    char *token;                    /* secret memory; NULL: none */
    char *ca_bundle;
    char *name;
};

static void container_destroy(void *arg)
{
    struct container_source *source = arg;

    free(source->url);
    free(source->token_file);
    secret_free(&source->token);
    free(source->ca_bundle);
    free(source->name);
    free(source);
}

/* The token file's content, trimmed, in *TOKENP (malloc'd). */
static int read_token_file(const char *path, char **tokenp, char *errbuf,
                           size_t errlen)
{
    char *buf = malloc(TOKEN_FILE_MAX + 1);
    size_t len = 0;
    int fd = -1, err = 0;

    *tokenp = NULL;
    if (buf == NULL) {
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        err = errno;
        text_set_err(errbuf, errlen, "cannot read the token file %s "
                "(AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE): %s", path,
                strerror(err));
        goto out;
    }
    for (;;) {
        ssize_t got = read(fd, buf + len, TOKEN_FILE_MAX + 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            err = errno;
            text_set_err(errbuf, errlen, "cannot read the token file %s: %s",
                    path, strerror(err));
            goto out;
        }
        if (got == 0)
            break;
        len += (size_t)got;
        if (len > TOKEN_FILE_MAX) {
            err = EINVAL;
            text_set_err(errbuf, errlen, "the token file %s is larger than %u "
                    "bytes", path, TOKEN_FILE_MAX);
            goto out;
        }
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
                       buf[len - 1] == ' ' || buf[len - 1] == '\t'))
        len--;
    buf[len] = '\0';
    *tokenp = buf;
    buf = NULL;
out:
    if (fd >= 0)
        close(fd);
    if (buf != NULL) {
        OPENSSL_cleanse(buf, TOKEN_FILE_MAX + 1);
        free(buf);
    }
    return err;
}

/* "Authorization: TOKEN" appended to *HEADERS; refuses a token that would
 * break the header. */
static int add_auth_header(struct curl_slist **headers, const char *token,
                           char *errbuf, size_t errlen)
{
    char *line = NULL;
    int err = 0;

    for (const char *p = token; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) {
            text_set_err(errbuf, errlen, "the authorization token has a control "
                    "character");
            return EINVAL;
        }
    }
    if (asprintf(&line, "Authorization: %s", token) < 0) {
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    struct curl_slist *grown = curl_slist_append(*headers, line);
    if (grown == NULL) {
        err = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
    } else {
        *headers = grown;
    }
    wipe_free(&line);
    return err;
}

static int container_fetch(void *arg, struct credentials_fetched *out,
                           char *errbuf, size_t errlen)
{
    const struct container_source *source = arg;
    struct curl_slist *headers = NULL;
    struct http_answer answer = {0};
    char why[384] = "";
    char *file_token = NULL;
    int err = 0;

    if (source->token_file != NULL) {
        err = read_token_file(source->token_file, &file_token, why,
                              sizeof(why));
        if (err != 0)
            goto out;
    }
    const char *token = file_token != NULL ? file_token : source->token;
    headers = curl_slist_append(NULL, "Accept: application/json");
    if (headers == NULL) {
        err = ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    if (token != NULL && *token != '\0') {
        err = add_auth_header(&headers, token, why, sizeof(why));
        if (err != 0)
            goto out;
    }
    for (int attempt = 0; attempt < CONTAINER_ATTEMPTS; attempt++) {
        http_answer_free(&answer);
        err = http_ask("GET", source->url, headers, CONTAINER_TIMEOUT_S,
                       source->ca_bundle, &answer, why, sizeof(why));
        if (err == 0 && answer.status == 200)
            break;
        if (err == 0) {
            err = EIO;
            snprintf(why, sizeof(why), "HTTP %ld", answer.status);
            if (answer.status >= 400 && answer.status < 500)
                break; /* a refused token is not cured by asking again */
        }
    }
    if (err != 0)
        goto out;
    err = credentials_parse_json(answer.data, answer.len,
                                 CREDENTIALS_FORMAT_METADATA, out, why,
                                 sizeof(why));
out:
    if (err != 0)
        text_set_err(errbuf, errlen, "%s: %s", source->name, why);
    http_answer_free(&answer);
    headers_free(headers);
    wipe_free(&file_token);
    return err;
}

/* FULL_URI: https, or http to a loopback or agent address. */
static bool container_uri_allowed(const char *uri)
{
    static const char *const hosts[] = {
        "localhost", "::1", "[::1]", "169.254.170.2", "169.254.170.23",
        "fd00:ec2::23", "[fd00:ec2::23]",
    };
    CURLU *url = curl_url();
    char *scheme = NULL, *host = NULL;
    bool allowed = false;

    if (url == NULL)
        return false;
    if (curl_url_set(url, CURLUPART_URL, uri, 0) != CURLUE_OK ||
        curl_url_get(url, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(url, CURLUPART_HOST, &host, 0) != CURLUE_OK)
        goto out;
    if (strcasecmp(scheme, "https") == 0) {
        allowed = true;
    } else if (strcasecmp(scheme, "http") == 0) {
        unsigned a, b, c, d;
        char tail;
        if (sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 &&
            a == 127 && b < 256 && c < 256 && d < 256)
            allowed = true;
        for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
            if (strcasecmp(host, hosts[i]) == 0)
                allowed = true;
    }
out:
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(url);
    return allowed;
}

/* ------------------------------------------------------------- IMDS */

struct imds_source {
    bool fetched_once;              /* the mount's fetch explains itself */
    char *endpoint;                 /* no trailing '/' */
    double timeout;
    int attempts;
    char *name;
};

static void imds_destroy(void *arg)
{
    struct imds_source *source = arg;

    free(source->endpoint);
    free(source->name);
    free(source);
}

/* One request to the metadata service, retried ATTEMPTS times on
 * transport errors and 5xx. */
static int imds_ask(const struct imds_source *source, const char *method,
                    const char *path, const struct curl_slist *headers,
                    struct http_answer *answer, char *why, size_t whylen)
{
    char *url = NULL;
    int err = 0;

    if (asprintf(&url, "%s%s", source->endpoint, path) < 0) {
        snprintf(why, whylen, "out of memory");
        return ENOMEM;
    }
    for (int attempt = 0; attempt < source->attempts; attempt++) {
        http_answer_free(answer);
        err = http_ask(method, url, headers, source->timeout, NULL, answer,
                       why, whylen);
        if (err == 0 && answer->status < 500)
            break;
    }
    free(url);
    if (err == 0 && answer->status != 200) {
        snprintf(why, whylen, "%s %s answered HTTP %ld", method, path,
                 answer->status);
        err = EIO;
    } else if (err != 0) {
        char reason[256];
        snprintf(reason, sizeof(reason), "%s", why);
        snprintf(why, whylen, "%s %s: %s", method, path, reason);
    }
    return err;
}

static int imds_fetch(void *arg, struct credentials_fetched *out,
                      char *errbuf, size_t errlen)
{
    struct imds_source *source = arg;
    struct curl_slist *headers = NULL;
    struct http_answer answer = {0};
    char why[384] = "", role[IMDS_ROLE_MAX + 1] = "", *line = NULL;
    char *path = NULL;
    int err;

    headers = curl_slist_append(NULL, "X-aws-ec2-metadata-token-ttl-seconds: "
                                      IMDS_TOKEN_TTL);
    if (headers == NULL) {
        err = ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    err = imds_ask(source, "PUT", "/latest/api/token", headers, &answer, why,
                   sizeof(why));
    headers_free(headers);
    headers = NULL;
    if (err != 0)
        goto out;
    if (answer.len == 0 || strcspn(answer.data, "\r\n") != answer.len) {
        err = EIO;
        snprintf(why, sizeof(why), "the session token is empty or not one "
                 "line");
        goto out;
    }
    if (asprintf(&line, "X-aws-ec2-metadata-token: %s", answer.data) < 0) {
        line = NULL;
        err = ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    headers = curl_slist_append(NULL, line);
    wipe_free(&line);
    if (headers == NULL) {
        err = ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    err = imds_ask(source, "GET", "/latest/meta-data/iam/security-credentials/",
                   headers, &answer, why, sizeof(why));
    if (err != 0)
        goto out;
    size_t role_len = strcspn(answer.data, "\r\n");
    if (role_len == 0 || role_len > IMDS_ROLE_MAX ||
        strcspn(answer.data, "/?#% ") < role_len) {
        err = EIO;
        snprintf(why, sizeof(why), "no IAM role is attached to the instance "
                 "(or its name is not one)");
        goto out;
    }
    memcpy(role, answer.data, role_len);
    role[role_len] = '\0';
    if (asprintf(&path, "/latest/meta-data/iam/security-credentials/%s",
                 role) < 0) {
        path = NULL;
        err = ENOMEM;
        snprintf(why, sizeof(why), "out of memory");
        goto out;
    }
    err = imds_ask(source, "GET", path, headers, &answer, why, sizeof(why));
    if (err != 0)
        goto out;
    err = credentials_parse_json(answer.data, answer.len,
                                 CREDENTIALS_FORMAT_METADATA, out, why,
                                 sizeof(why));
    if (err != 0) {
        char reason[256];
        snprintf(reason, sizeof(reason), "%s", why);
        snprintf(why, sizeof(why), "the credentials of role %s: %s", role,
                 reason);
    }
out:
    if (err != 0 && !source->fetched_once)
        text_set_err(errbuf, errlen, "no credentials in the environment or the "
                "profile, no credential_process, no container credentials, "
                "and none from %s: %s (AWS_EC2_METADATA_DISABLED=true skips "
                "instance metadata)", source->name, why);
    else if (err != 0)
        text_set_err(errbuf, errlen, "%s: %s", source->name, why);
    source->fetched_once = true;
    http_answer_free(&answer);
    headers_free(headers);
    free(path);
    return err;
}

/* ----------------------------------------------------------- choice */

static bool env_true(const char *name)
{
    const char *value = env_get(name);
    return value != NULL && strcasecmp(value, "true") == 0;
}

static int make_process(const struct awsconfig *aws,
                        struct credentials_source *out, char *errbuf,
                        size_t errlen)
{
    struct process_source *source = calloc(1, sizeof(*source));
    const char *profile = aws->profile != NULL ? aws->profile : "default";
    int err;

    if (source == NULL)
        return ENOMEM;
    err = credsource_split(aws->credential_process, &source->argv);
    if (err == EINVAL)
        text_set_err(errbuf, errlen, "credential_process of profile '%s' cannot "
                "be split into words (an open quote or a trailing "
                "backslash), or is empty", profile);
    if (err == 0 && asprintf(&source->name, "credential_process of profile "
                             "'%s' (%s)", profile, source->argv[0]) < 0) {
        source->name = NULL;
        err = ENOMEM;
    }
    if (err == 0 && (out->name = strdup(source->name)) == NULL)
        err = ENOMEM;
    if (err != 0) {
        process_destroy(source);
        return err;
    }
    out->refreshable = true;
    out->fetch = process_fetch;
    out->destroy = process_destroy;
    out->arg = source;
    return 0;
}

static int make_container(const char *relative, const char *full,
                          const char *ca_bundle,
                          struct credentials_source *out, char *errbuf,
                          size_t errlen)
{
    struct container_source *source = calloc(1, sizeof(*source));
    const char *token = env_get("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    const char *token_file = env_get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    int err = 0, n;

    if (source == NULL)
        return ENOMEM;
    if (relative != NULL) {
        n = asprintf(&source->url, "%s%s%s", ECS_HOST,
                     relative[0] == '/' ? "" : "/", relative);
    } else {
        if (!container_uri_allowed(full)) {
            err = EINVAL;
            text_set_err(errbuf, errlen, "AWS_CONTAINER_CREDENTIALS_FULL_URI must "
                    "be https, or http to a loopback address or the "
                    "container agent's (169.254.170.2, 169.254.170.23)");
            goto out;
        }
        n = asprintf(&source->url, "%s", full);
    }
    if (n < 0) {
        source->url = NULL;
        err = ENOMEM;
        goto out;
    }
    if (token_file != NULL && (source->token_file = strdup(token_file)) == NULL)
        err = ENOMEM;
    if (token_file == NULL && token != NULL &&
        (source->token = secret_strdup(token)) == NULL)
        err = ENOMEM;
    if (ca_bundle != NULL && (source->ca_bundle = strdup(ca_bundle)) == NULL)
        err = ENOMEM;
    if (err == 0 && asprintf(&source->name, "container credentials at %s",
                             source->url) < 0) {
        source->name = NULL;
        err = ENOMEM;
    }
    if (err == 0 && (out->name = strdup(source->name)) == NULL)
        err = ENOMEM;
out:
    if (err != 0) {
        container_destroy(source);
        return err;
    }
    out->refreshable = true;
    out->fetch = container_fetch;
    out->destroy = container_destroy;
    out->arg = source;
    return 0;
}

static int make_imds(const struct awsconfig *aws,
                     struct credentials_source *out)
{
    struct imds_source *source = calloc(1, sizeof(*source));
    const char *endpoint = env_get("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    const char *mode = env_get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
    const char *timeout = env_get("AWS_METADATA_SERVICE_TIMEOUT");
    const char *attempts = env_get("AWS_METADATA_SERVICE_NUM_ATTEMPTS");
    size_t len;

    if (source == NULL)
        return ENOMEM;
    if (endpoint == NULL)
        endpoint = aws->ec2_metadata_endpoint;
    if (endpoint == NULL)
        endpoint = mode != NULL && strcasecmp(mode, "IPv6") == 0
                       ? IMDS_DEFAULT_IPV6 : IMDS_DEFAULT;
    source->endpoint = strdup(endpoint);
    source->timeout = timeout != NULL ? strtod(timeout, NULL) : 1.0;
    if (!(source->timeout > 0 && source->timeout <= 60))
        source->timeout = 1.0;
    source->attempts = attempts != NULL ? atoi(attempts) : 1;
    if (source->attempts < 1 || source->attempts > 10)
        source->attempts = 1;
    if (source->endpoint == NULL ||
        asprintf(&source->name, "instance metadata at %s", endpoint) < 0 ||
        (out->name = strdup(source->name)) == NULL) {
        imds_destroy(source);
        return ENOMEM;
    }
    len = strlen(source->endpoint);
    while (len > 0 && source->endpoint[len - 1] == '/')
        source->endpoint[--len] = '\0';
    out->refreshable = true;
    out->fetch = imds_fetch;
    out->destroy = imds_destroy;
    out->arg = source;
    return 0;
}

int credsource_choose(const struct credsource_conf *conf,
                      struct credentials_source *out, char *errbuf,
                      size_t errlen)
{
    const struct awsconfig *aws = conf->aws;
    const char *relative = env_get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    const char *full = env_get("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    int err;

    memset(out, 0, sizeof(*out));
    if (aws->access_key != NULL)
        err = credentials_static_source(aws->access_key, aws->secret_key,
                                        aws->session_token,
                                        aws->credentials_source, out);
    else if (aws->credential_process != NULL)
        err = make_process(aws, out, errbuf, errlen);
    else if (relative != NULL || full != NULL)
        err = make_container(relative, full, conf->ca_bundle, out, errbuf,
                             errlen);
    else if (!env_true("AWS_EC2_METADATA_DISABLED"))
        err = make_imds(aws, out);
    else {
        err = ENOENT;
        text_set_err(errbuf, errlen,
                "no credentials: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, add keys or credential_process to "
                "profile '%s', use -o profile=NAME or -o no_sign (no "
                "container credentials are set, and instance metadata is "
                "off: AWS_EC2_METADATA_DISABLED)",
                aws->profile != NULL ? aws->profile : "default");
    }
    if (err == ENOMEM)
        text_set_err(errbuf, errlen, "out of memory");
    return err;
}
