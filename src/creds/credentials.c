/*
 * credentials.c - the keys requests are signed with, refreshed before
 * they expire (see credentials.h), and the JSON documents keys come in
 * (json-c).
 *
 * State, guarded by `lock`:
 *   current      the keys handed out now; never NULL; the store holds one
 *                reference. Replaced (generation + 1) by a refresh that
 *                succeeded, never changed in place.
 *   refreshing   a thread is asking the source (without the lock); no
 *                other thread asks it meanwhile (single-flight). Threads
 *                that need newer keys wait on `refresh_done`.
 *   retry_at     after a failed refresh: no refresh before this time
 *                (backoff), unless a thread is already running one.
 *   streak       failed refreshes in a row (the first is logged).
 * Invariants: current != NULL; current->refs >= 1; !refreshing when no
 * thread is between refresh_begin and refresh_end.
 *
 * The states of the current keys, by the time left (see key_due()):
 *   FRESH    signers use them;
 *   DUE      the first signer to see it refreshes (unless in backoff);
 *            the others sign with them meanwhile;
 *   EXPIRED  signers wait for a refresh under way, or run one, or fail
 *            with EKEYEXPIRED while in backoff.
 */
#include "config.h"

#include "creds/credentials.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "base/clock.h"
#include "base/invariant.h"
#include "base/log.h"
#include "base/secret.h"
#include "base/text.h"

#define DUE_MARGIN_MAX 300.0        /* s: refresh 5 minutes before ... */
#define DUE_MARGIN_SHARE 3.0        /* ... or a third of the lifetime */
#define EXPIRED_MARGIN_MAX 10.0     /* s: stop signing 10 s before ... */
#define EXPIRED_MARGIN_SHARE 10.0   /* ... or a tenth of the lifetime */
#define BACKOFF_FIRST 1.0           /* s, doubling ... */
#define BACKOFF_MAX 60.0            /* ... up to this */

struct credentials {
    pthread_mutex_t lock;
    pthread_cond_t refresh_done;    /* a refresh ended (either way) */
    struct credentials_source source;
    struct credentials_clock clock;
    struct credentials_keys *current;
    bool refreshing;
    double retry_at;
    unsigned streak;
    uint64_t fetches;
    uint64_t failures;
};

static double now_of(const struct credentials *creds)
{
    if (creds->clock.now != NULL)
        return creds->clock.now(creds->clock.arg);
    return clock_wall_seconds();
}

/* "2026-12-02T05:00:00Z" for messages (expirations are not secrets). */
static const char *format_time(double when, char *buf, size_t len)
{
    struct tm tm;
    time_t t = (time_t)when;

    if (when <= 0 || gmtime_r(&t, &tm) == NULL)
        snprintf(buf, len, "never");
    else
        strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

void credentials_fetched_clear(struct credentials_fetched *keys)
{
    if (keys == NULL)
        return;
    secret_free(&keys->access_key);
    secret_free(&keys->secret_key);
    secret_free(&keys->session_token);
    keys->expiration = 0;
}

static void keys_free(struct credentials_keys *keys)
{
    secret_free(&keys->access_key);
    secret_free(&keys->secret_key);
    secret_free(&keys->session_token);
    explicit_bzero(keys, sizeof(*keys));
    free(keys);
}

void credentials_keys_release(struct credentials *creds,
                              struct credentials_keys **keysp)
{
    struct credentials_keys *keys = *keysp;

    (void)creds;
    if (keys == NULL)
        return;
    *keysp = NULL;
    if (atomic_fetch_sub(&keys->refs, 1) == 1)
        keys_free(keys);
}

/* The margin before EXPIRATION, for keys of LIFETIME seconds: the smaller
 * of MAX and LIFETIME / SHARE. */
static double margin(double lifetime, double max, double share)
{
    double part = lifetime > 0 ? lifetime / share : 0;
    return part < max ? part : max;
}

static double lifetime_of(const struct credentials_keys *keys)
{
    double life = keys->expiration - keys->obtained;
    return life > 0 ? life : 0;
}

static bool key_due(const struct credentials_keys *keys, double now)
{
    return keys->expiration > 0 &&
           now >= keys->expiration - margin(lifetime_of(keys), DUE_MARGIN_MAX,
                                            DUE_MARGIN_SHARE);
}

static bool key_expired(const struct credentials_keys *keys, double now)
{
    return keys->expiration > 0 &&
           now >= keys->expiration - margin(lifetime_of(keys),
                                            EXPIRED_MARGIN_MAX,
                                            EXPIRED_MARGIN_SHARE);
}

static void check_invariants(const struct credentials *creds)
{
    INVARIANT(creds->current != NULL, "the store has keys");
    INVARIANT(atomic_load(&creds->current->refs) >= 1,
              "the store holds a reference to its keys");
}

/* Move FETCHED into new keys of GENERATION obtained at NOW. */
static struct credentials_keys *keys_new(struct credentials_fetched *fetched,
                                         uint64_t generation, double now)
{
    struct credentials_keys *keys = calloc(1, sizeof(*keys));

    if (keys == NULL)
        return NULL;
    keys->access_key = fetched->access_key;
    keys->secret_key = fetched->secret_key;
    keys->session_token = fetched->session_token;
    keys->expiration = fetched->expiration;
    keys->obtained = now;
    keys->generation = generation;
    atomic_init(&keys->refs, 1);
    fetched->access_key = fetched->secret_key = fetched->session_token = NULL;
    fetched->expiration = 0;
    return keys;
}

/* Ask the source once (no lock held). Keys that are expired when they
 * arrive count as a failure. */
static int fetch_keys(struct credentials *creds, double now,
                      struct credentials_fetched *out, char *errbuf,
                      size_t errlen)
{
    char when[32];
    int err;

    memset(out, 0, sizeof(*out));
    err = creds->source.fetch(creds->source.arg, out, errbuf, errlen);
    if (err == 0 && (out->access_key == NULL || out->secret_key == NULL)) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "%s gave no keys", creds->source.name);
    }
    if (err == 0 && out->expiration > 0 && out->expiration <= now) {
        err = EKEYEXPIRED;
        text_set_err(errbuf, errlen, "%s gave keys that expired at %s",
                creds->source.name,
                format_time(out->expiration, when, sizeof(when)));
    }
    if (err != 0)
        credentials_fetched_clear(out);
    return err;
}

/*
 * Refresh: called with the lock held and no refresh running; asks the
 * source without the lock and returns with it held again, the new keys
 * published or the failure recorded. Returns 0 or the source's errno.
 */
static int refresh_locked(struct credentials *creds)
{
    struct credentials_fetched fetched;
    struct credentials_keys *keys = NULL, *old = NULL;
    char errbuf[512] = "", when[32];
    double now = now_of(creds);
    int err;

    creds->refreshing = true;
    creds->fetches++;
    check_invariants(creds);
    pthread_mutex_unlock(&creds->lock);

    err = fetch_keys(creds, now, &fetched, errbuf, sizeof(errbuf));
    if (err == 0) {
        keys = keys_new(&fetched, 0, now);
        if (keys == NULL) {
            credentials_fetched_clear(&fetched);
            err = ENOMEM;
            snprintf(errbuf, sizeof(errbuf), "out of memory");
        }
    }

    pthread_mutex_lock(&creds->lock);
    now = now_of(creds);
    if (err == 0) {
        keys->generation = creds->current->generation + 1;
        old = creds->current;
        creds->current = keys;
        if (creds->streak > 0)
            log_info("credentials: new keys from %s after %u failed "
                     "attempts; they expire at %s", creds->source.name,
                     creds->streak,
                     format_time(keys->expiration, when, sizeof(when)));
        else
            log_debug("credentials: new keys from %s (generation %llu), "
                      "expiring at %s", creds->source.name,
                      (unsigned long long)keys->generation,
                      format_time(keys->expiration, when, sizeof(when)));
        creds->streak = 0;
        creds->retry_at = 0;
    } else {
        double pause = BACKOFF_FIRST;
        for (unsigned i = 0; i < creds->streak && pause < BACKOFF_MAX; i++)
            pause *= 2;
        if (pause > BACKOFF_MAX)
            pause = BACKOFF_MAX;
        creds->failures++;
        creds->streak++;
        creds->retry_at = now + pause;
        /* once per streak: a source that is down for an hour is one line */
        if (creds->streak == 1)
            log_warn("credentials: cannot refresh: %s; the current keys "
                     "expire at %s; retrying with a backoff", errbuf,
                     format_time(creds->current->expiration, when,
                                 sizeof(when)));
        else
            log_debug("credentials: refresh %u failed: %s", creds->streak,
                      errbuf);
    }
    creds->refreshing = false;
    pthread_cond_broadcast(&creds->refresh_done);
    check_invariants(creds);
    if (old != NULL)
        credentials_keys_release(creds, &old);
    explicit_bzero(errbuf, sizeof(errbuf));
    return err;
}

static struct credentials_keys *take_ref(struct credentials_keys *keys)
{
    atomic_fetch_add(&keys->refs, 1);
    return keys;
}

int credentials_get(struct credentials *creds,
                    struct credentials_keys **keysp)
{
    bool refreshed = false;
    int err = 0;

    *keysp = NULL;
    pthread_mutex_lock(&creds->lock);
    for (;;) {
        struct credentials_keys *keys = creds->current;
        double now = now_of(creds);

        if (!key_due(keys, now) || !creds->source.refreshable)
            break;
        if (creds->refreshing) {
            if (!key_expired(keys, now))
                break;
            pthread_cond_wait(&creds->refresh_done, &creds->lock);
            continue;
        }
        if (refreshed || now < creds->retry_at) {
            if (!key_expired(keys, now))
                break;
            err = EKEYEXPIRED;
            goto out;
        }
        refreshed = true;
        refresh_locked(creds);
    }
    *keysp = take_ref(creds->current);
out:
    check_invariants(creds);
    pthread_mutex_unlock(&creds->lock);
    return err;
}

int credentials_rejected(struct credentials *creds, uint64_t generation)
{
    bool tried = false;
    int err = 0;

    pthread_mutex_lock(&creds->lock);
    for (;;) {
        if (creds->current->generation != generation)
            break;
        if (creds->refreshing) {
            pthread_cond_wait(&creds->refresh_done, &creds->lock);
            continue;
        }
        if (!creds->source.refreshable || tried ||
            now_of(creds) < creds->retry_at) {
            err = EACCES;
            break;
        }
        tried = true;
        log_info("credentials: the server rejected the keys from %s; "
                 "asking for new ones", creds->source.name);
        if (refresh_locked(creds) != 0) {
            err = EACCES;
            break;
        }
    }
    check_invariants(creds);
    pthread_mutex_unlock(&creds->lock);
    return err;
}

int credentials_create(struct credentials_source *source,
                       const struct credentials_clock *clock,
                       struct credentials **out, char *errbuf, size_t errlen)
{
    struct credentials *creds = calloc(1, sizeof(*creds));
    struct credentials_fetched fetched;
    pthread_condattr_t attr;
    int err = 0;

    *out = NULL;
    if (creds == NULL) {
        err = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
        if (source->destroy != NULL)
            source->destroy(source->arg);
        free(source->name);
        memset(source, 0, sizeof(*source));
        return err;
    }
    creds->source = *source;
    memset(source, 0, sizeof(*source));
    if (clock != NULL)
        creds->clock = *clock;
    pthread_mutex_init(&creds->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&creds->refresh_done, &attr);
    pthread_condattr_destroy(&attr);
    if (creds->source.name == NULL || creds->source.fetch == NULL) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "no credentials source");
        goto out;
    }
    creds->fetches = 1;
    double now = now_of(creds);
    err = fetch_keys(creds, now, &fetched, errbuf, errlen);
    if (err != 0)
        goto out;
    creds->current = keys_new(&fetched, 1, now);
    if (creds->current == NULL) {
        credentials_fetched_clear(&fetched);
        err = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
    }
out:
    if (err != 0)
        credentials_destroy(&creds);
    *out = creds;
    return err;
}

void credentials_destroy(struct credentials **credsp)
{
    struct credentials *creds = *credsp;

    if (creds == NULL)
        return;
    credentials_keys_release(creds, &creds->current);
    if (creds->source.destroy != NULL)
        creds->source.destroy(creds->source.arg);
    free(creds->source.name);
    pthread_mutex_destroy(&creds->lock);
    pthread_cond_destroy(&creds->refresh_done);
    free(creds);
    *credsp = NULL;
}

const char *credentials_source_name(const struct credentials *creds)
{
    return creds->source.name;
}

void credentials_stats(struct credentials *creds,
                       struct credentials_stats *out)
{
    pthread_mutex_lock(&creds->lock);
    out->fetches = creds->fetches;
    out->failures = creds->failures;
    out->generation = creds->current->generation;
    pthread_mutex_unlock(&creds->lock);
}

bool credentials_code_rejects_keys(const char *s3_code)
{
    static const char *const codes[] = {
        "ExpiredToken", "TokenRefreshRequired", "InvalidAccessKeyId",
        "InvalidToken", "SignatureDoesNotMatch",
    };

    if (s3_code == NULL)
        return false;
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (strcmp(s3_code, codes[i]) == 0)
            return true;
    return false;
}

/* ------------------------------------------------------- static keys */

static int static_fetch(void *arg, struct credentials_fetched *out,
                        char *errbuf, size_t errlen)
{
    const struct credentials_fetched *keys = arg;

    out->access_key = secret_strdup(keys->access_key);
    out->secret_key = secret_strdup(keys->secret_key);
    out->session_token = secret_strdup(keys->session_token);
    out->expiration = 0;
    if (out->access_key == NULL || out->secret_key == NULL ||
        (keys->session_token != NULL && out->session_token == NULL)) {
        credentials_fetched_clear(out);
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    return 0;
}

static void static_destroy(void *arg)
{
    credentials_fetched_clear(arg);
    free(arg);
}

int credentials_static_source(const char *access_key, const char *secret_key,
                              const char *session_token, const char *name,
                              struct credentials_source *out)
{
    struct credentials_fetched *keys = calloc(1, sizeof(*keys));

    memset(out, 0, sizeof(*out));
    if (keys == NULL)
        return ENOMEM;
    keys->access_key = secret_strdup(access_key);
    keys->secret_key = secret_strdup(secret_key);
    keys->session_token = secret_strdup(session_token);
    out->name = strdup(name != NULL ? name : "static keys");
    if (keys->access_key == NULL || keys->secret_key == NULL ||
        (session_token != NULL && keys->session_token == NULL) ||
        out->name == NULL) {
        static_destroy(keys);
        free(out->name);
        out->name = NULL;
        return ENOMEM;
    }
    out->refreshable = false;
    out->fetch = static_fetch;
    out->destroy = static_destroy;
    out->arg = keys;
    return 0;
}

/* ---------------------------------------------------------------- JSON */

static bool parse_digits(const char **p, int count, int *out)
{
    int value = 0;

    for (int i = 0; i < count; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return false;
        value = value * 10 + (c - '0');
    }
    *p += count;
    *out = value;
    return true;
}

static bool expect(const char **p, char c)
{
    if (**p != c)
        return false;
    (*p)++;
    return true;
}

int credentials_parse_time(const char *text, double *out)
{
    static const int month_days[12] = {31, 29, 31, 30, 31, 30,
                                       31, 31, 30, 31, 30, 31};
    const char *p = text;
    int year, month, day, hour, minute, second, off_h = 0, off_m = 0;
    double fraction = 0, scale = 0.1;
    int sign = 0;
    struct tm tm = {0};
    time_t t;

    if (text == NULL)
        return EINVAL;
    if (!parse_digits(&p, 4, &year) || !expect(&p, '-') ||
        !parse_digits(&p, 2, &month) || !expect(&p, '-') ||
        !parse_digits(&p, 2, &day) || !(*p == 'T' || *p == 't' || *p == ' '))
        return EINVAL;
    p++;
    if (!parse_digits(&p, 2, &hour) || !expect(&p, ':') ||
        !parse_digits(&p, 2, &minute) || !expect(&p, ':') ||
        !parse_digits(&p, 2, &second))
        return EINVAL;
    if (*p == '.' || *p == ',') {
        p++;
        if (*p < '0' || *p > '9')
            return EINVAL;
        while (*p >= '0' && *p <= '9') {
            fraction += (*p - '0') * scale;
            scale /= 10;
            p++;
        }
    }
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        sign = *p == '+' ? 1 : -1;
        p++;
        if (!parse_digits(&p, 2, &off_h))
            return EINVAL;
        if (*p == ':')
            p++;
        if (!parse_digits(&p, 2, &off_m))
            return EINVAL;
        if (off_h > 23 || off_m > 59)
            return EINVAL;
    } else {
        return EINVAL; /* a time without a zone is not one instant */
    }
    if (*p != '\0')
        return EINVAL;
    if (year < 1970 || month < 1 || month > 12 || day < 1 ||
        day > month_days[month - 1] || hour > 23 || minute > 59 ||
        second > 60)
        return EINVAL;
    if (month == 2 && day == 29 &&
        !(year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)))
        return EINVAL;
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    t = timegm(&tm);
    if (t == (time_t)-1)
        return EINVAL;
    *out = (double)t + fraction - sign * (off_h * 3600.0 + off_m * 60.0);
    return 0;
}

/* A key, secret or token goes into a header: printable ASCII, no space. */
static bool header_safe(const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] <= 0x20 || (unsigned char)text[i] >= 0x7f)
            return false;
    return true;
}

/* Wipe the copy json-c keeps of a string value (it is about to be freed;
 * json-c has no call that would do it). */
static void wipe_json_string(struct json_object *value)
{
    char *text = (char *)json_object_get_string(value);
    int len = json_object_get_string_len(value);

    if (text != NULL && len > 0)
        OPENSSL_cleanse(text, (size_t)len);
}

/* String field NAME of OBJ into secret memory *OUT. A missing field is
 * ENOENT when OPTIONAL, else EINVAL. */
static int take_field(struct json_object *obj, const char *name,
                      bool optional, char **out, char *errbuf,
                      size_t errlen)
{
    struct json_object *value = NULL;
    const char *text;
    int len;

    if (!json_object_object_get_ex(obj, name, &value) || value == NULL ||
        json_object_is_type(value, json_type_null)) {
        if (optional)
            return ENOENT;
        text_set_err(errbuf, errlen, "no %s", name);
        return EINVAL;
    }
    if (!json_object_is_type(value, json_type_string)) {
        text_set_err(errbuf, errlen, "%s is not a string", name);
        return EINVAL;
    }
    text = json_object_get_string(value);
    len = json_object_get_string_len(value);
    if (len == 0) {
        if (optional)
            return ENOENT;
        text_set_err(errbuf, errlen, "%s is empty", name);
        return EINVAL;
    }
    if (!header_safe(text, (size_t)len) || strlen(text) != (size_t)len) {
        wipe_json_string(value);
        text_set_err(errbuf, errlen, "%s has characters a header cannot carry",
                name);
        return EINVAL;
    }
    *out = secret_strdup(text);
    wipe_json_string(value);
    if (*out == NULL) {
        text_set_err(errbuf, errlen, "out of memory");
        return ENOMEM;
    }
    return 0;
}

int credentials_parse_json(const char *text, size_t len,
                           enum credentials_format format,
                           struct credentials_fetched *out, char *errbuf,
                           size_t errlen)
{
    struct json_tokener *tok = NULL;
    struct json_object *obj = NULL, *value = NULL;
    const char *token_name =
        format == CREDENTIALS_FORMAT_PROCESS ? "SessionToken" : "Token";
    enum json_tokener_error jerr;
    int err = 0;

    memset(out, 0, sizeof(*out));
    if (len > CREDENTIALS_JSON_MAX) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "the document is larger than %u KiB",
                CREDENTIALS_JSON_MAX >> 10);
        goto out;
    }
    if (len == 0) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "the document is empty");
        goto out;
    }
    if (memchr(text, '\0', len) != NULL) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "not JSON: a NUL byte");
        goto out;
    }
    tok = json_tokener_new_ex(16);
    if (tok == NULL) {
        err = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
        goto out;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    obj = json_tokener_parse_ex(tok, text, (int)len);
    jerr = json_tokener_get_error(tok);
    if (jerr == json_tokener_continue) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "not JSON: it ends too early");
        goto out;
    }
    if (obj == NULL || jerr != json_tokener_success) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "not JSON: %s",
                jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                                             : "null");
        goto out;
    }
    for (size_t i = json_tokener_get_parse_end(tok); i < len; i++) {
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' &&
            text[i] != '\r') {
            err = EINVAL;
            text_set_err(errbuf, errlen, "not JSON: text after the object");
            goto out;
        }
    }
    if (!json_object_is_type(obj, json_type_object)) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "not a JSON object");
        goto out;
    }
    if (format == CREDENTIALS_FORMAT_PROCESS) {
        if (!json_object_object_get_ex(obj, "Version", &value)) {
            err = EINVAL;
            text_set_err(errbuf, errlen, "no Version");
            goto out;
        }
        if (!json_object_is_type(value, json_type_int) ||
            json_object_get_int64(value) != 1) {
            err = EINVAL;
            text_set_err(errbuf, errlen, "Version is not 1 (the only version "
                    "there is)");
            goto out;
        }
    } else if (json_object_object_get_ex(obj, "Code", &value) &&
               !(json_object_is_type(value, json_type_string) &&
                 strcmp(json_object_get_string(value), "Success") == 0)) {
        err = EINVAL;
        text_set_err(errbuf, errlen, "the answer's Code is '%.64s', not Success",
                json_object_is_type(value, json_type_string)
                    ? json_object_get_string(value) : "?");
        goto out;
    }
    err = take_field(obj, "AccessKeyId", false, &out->access_key, errbuf,
                     errlen);
    if (err == 0)
        err = take_field(obj, "SecretAccessKey", false, &out->secret_key,
                         errbuf, errlen);
    if (err == 0) {
        err = take_field(obj, token_name, true, &out->session_token, errbuf,
                         errlen);
        if (err == ENOENT)
            err = 0;
    }
    if (err != 0)
        goto out;
    if (json_object_object_get_ex(obj, "Expiration", &value) &&
        !json_object_is_type(value, json_type_null)) {
        if (!json_object_is_type(value, json_type_string) ||
            credentials_parse_time(json_object_get_string(value),
                                   &out->expiration) != 0) {
            err = EINVAL;
            text_set_err(errbuf, errlen, "Expiration is not an ISO 8601 time");
            goto out;
        }
    }
out:
    if (err != 0)
        credentials_fetched_clear(out);
    if (obj != NULL) {
        /* every string of the document: the keys were wiped above, but a
         * document refused half-way may hold others */
        if (json_object_is_type(obj, json_type_object)) {
            json_object_object_foreach(obj, name, member) {
                (void)name;
                if (member != NULL &&
                    json_object_is_type(member, json_type_string))
                    wipe_json_string(member);
            }
        }
        json_object_put(obj);
    }
    if (tok != NULL)
        json_tokener_free(tok);
    return err;
}
