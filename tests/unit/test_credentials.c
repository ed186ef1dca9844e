/*
 * test_credentials.c - unit tests for credentials.c (the keys, their
 * refresh, the JSON documents) and credsource.c (the choice of a source,
 * splitting credential_process, running it for real).
 *
 * The refresh tests drive a store with a fake clock and a fake source
 * whose keys, failures and pauses each test sets; the single-flight tests
 * hold the source's fetch on a condition variable while other threads
 * ask for keys. No test reaches the network: the metadata sources are
 * only chosen here (their protocols run against local servers in
 * tests/integration/test_credentials.py), and the one fetch that is
 * attempted goes to a closed port on 127.0.0.1.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "base/secret.h"
#include "creds/credentials.h"
#include "creds/credsource.h"

#define AK "AKIATESTACCESS000001"
#define SK "sk/Test+Secret0000000000000000000000001"
#define TK "tokTestSessionToken00000000000000000001"

/* No error message may hold any of these. */
static void assert_no_secret(const char *text)
{
    static const char *const secrets[] = {AK, SK, TK, "S3CR3T-IN-STDOUT"};

    for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
        if (strstr(text, secrets[i]) != NULL)
            fail_msg("a secret in the message: %s", text);
    }
}

static void assert_contains(const char *text, const char *part)
{
    if (strstr(text, part) == NULL)
        fail_msg("'%s' is not in '%s'", part, text);
}

/* ------------------------------------------------------------- JSON */

struct json_row {
    const char *name;
    enum credentials_format format;
    const char *json;
    int err;
    const char *message;        /* a part of the error message */
    bool token;                 /* a session token is expected */
    double expiration;          /* expected; 0: none */
};

static const struct json_row json_rows[] = {
    {"process, every field", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"SessionToken\": \"" TK "\", \"Expiration\": "
     "\"2026-12-02T05:00:00Z\"}", 0, NULL, true, 1796187600},
    {"process, no token, no expiration", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\"}\n", 0, NULL, false, 0},
    {"process, null token and expiration", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"SessionToken\": null, \"Expiration\": null}", 0, NULL, false,
     0},
    {"process, no Version", CREDENTIALS_FORMAT_PROCESS,
     "{\"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \"" SK "\"}",
     EINVAL, "no Version", false, 0},
    {"process, Version 2", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 2, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\"}", EINVAL, "Version is not 1", false, 0},
    {"process, Version as a string", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": \"1\", \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\"}", EINVAL, "Version is not 1", false, 0},
    {"process, no access key", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"SecretAccessKey\": \"" SK "\"}", EINVAL,
     "no AccessKeyId", false, 0},
    {"process, secret not a string", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": 7}",
     EINVAL, "SecretAccessKey is not a string", false, 0},
    {"process, empty secret", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \"\"}",
     EINVAL, "SecretAccessKey is empty", false, 0},
    {"process, a token with a line break", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"SessionToken\": \"" TK "\\r\\nX-Evil: 1\"}", EINVAL,
     "SessionToken has characters", false, 0},
    {"process, bad date", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"Expiration\": \"tomorrow\"}", EINVAL,
     "Expiration is not an ISO 8601 time", false, 0},
    {"process, date without a zone", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"Expiration\": \"2026-12-02T05:00:00\"}", EINVAL,
     "Expiration is not an ISO 8601 time", false, 0},
    {"process, date as a number", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\", \"Expiration\": 1796187600}", EINVAL,
     "Expiration is not an ISO 8601 time", false, 0},
    {"process, cut short", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK, EINVAL, "not JSON", false, 0},
    {"process, text after it", CREDENTIALS_FORMAT_PROCESS,
     "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \""
     SK "\"} and more", EINVAL, "not JSON", false, 0},
    {"process, an array", CREDENTIALS_FORMAT_PROCESS, "[1, 2]", EINVAL,
     "not a JSON object", false, 0},
    {"process, empty", CREDENTIALS_FORMAT_PROCESS, "", EINVAL, "empty",
     false, 0},
    {"process, not JSON at all", CREDENTIALS_FORMAT_PROCESS,
     "AccessKeyId=" AK, EINVAL, "not JSON", false, 0},
    {"metadata, IMDS answer", CREDENTIALS_FORMAT_METADATA,
     "{\n  \"Code\" : \"Success\",\n  \"LastUpdated\" : "
     "\"2026-12-02T04:00:00Z\",\n  \"Type\" : \"AWS-HMAC\",\n  "
     "\"AccessKeyId\" : \"" AK "\",\n  \"SecretAccessKey\" : \"" SK "\",\n"
     "  \"Token\" : \"" TK "\",\n  \"Expiration\" : "
     "\"2026-12-02T10:00:00Z\"\n}", 0, NULL, true, 1796205600},
    {"metadata, container answer (offset, fraction)",
     CREDENTIALS_FORMAT_METADATA,
     "{\"RoleArn\": \"arn:aws:iam::1:role/x\", \"AccessKeyId\": \"" AK
     "\", \"SecretAccessKey\": \"" SK "\", \"Token\": \"" TK "\", "
     "\"Expiration\": \"2026-12-02T06:00:00.500+01:00\"}", 0, NULL, true,
     1796187600.5},
    {"metadata, SessionToken is not its name", CREDENTIALS_FORMAT_METADATA,
     "{\"AccessKeyId\": \"" AK "\", \"SecretAccessKey\": \"" SK "\", "
     "\"SessionToken\": \"" TK "\"}", 0, NULL, false, 0},
    {"metadata, Code not Success", CREDENTIALS_FORMAT_METADATA,
     "{\"Code\": \"AssumeRoleUnauthorizedAccess\", \"AccessKeyId\": \"" AK
     "\", \"SecretAccessKey\": \"" SK "\"}", EINVAL,
     "AssumeRoleUnauthorizedAccess", false, 0},
    {"metadata, no secret", CREDENTIALS_FORMAT_METADATA,
     "{\"AccessKeyId\": \"" AK "\", \"Token\": \"" TK "\"}", EINVAL,
     "no SecretAccessKey", false, 0},
};

static void test_parse_json_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(json_rows) / sizeof(json_rows[0]); i++) {
        const struct json_row *row = &json_rows[i];
        struct credentials_fetched keys;
        char errbuf[256] = "";
        int err = credentials_parse_json(row->json, strlen(row->json),
                                         row->format, &keys, errbuf,
                                         sizeof(errbuf));
        if (err != row->err)
            fail_msg("%s: %d (%s), expected %d", row->name, err, errbuf,
                     row->err);
        assert_no_secret(errbuf);
        if (err != 0) {
            assert_contains(errbuf, row->message);
            assert_null(keys.access_key);
            assert_null(keys.secret_key);
            assert_null(keys.session_token);
            continue;
        }
        assert_string_equal(keys.access_key, AK);
        assert_string_equal(keys.secret_key, SK);
        if (row->token)
            assert_string_equal(keys.session_token, TK);
        else
            assert_null(keys.session_token);
        if (keys.expiration != row->expiration)
            fail_msg("%s: expiration %.3f, expected %.3f", row->name,
                     keys.expiration, row->expiration);
        credentials_fetched_clear(&keys);
        assert_null(keys.secret_key);
    }
}

/* Over the cap: refused whole, before parsing; a NUL byte too. */
static void test_parse_json_huge(void **state)
{
    size_t len = CREDENTIALS_JSON_MAX + 1;
    char *text = malloc(len + 1);
    struct credentials_fetched keys;
    char errbuf[256];
    static const char with_nul[] = "{\"Version\": 1,\0 \"AccessKeyId\": 1}";

    (void)state;
    assert_non_null(text);
    memset(text, ' ', len);
    memcpy(text, "{\"Version\": 1, \"AccessKeyId\": \"" AK "\", "
                 "\"SecretAccessKey\": \"" SK "\"}", 90);
    text[len] = '\0';
    assert_int_equal(credentials_parse_json(text, len,
                                            CREDENTIALS_FORMAT_PROCESS, &keys,
                                            errbuf, sizeof(errbuf)), EINVAL);
    assert_contains(errbuf, "larger than 64 KiB");
    /* deep nesting: json-c's depth limit, not the stack */
    memset(text, '[', len);
    assert_int_equal(credentials_parse_json(text, 60000,
                                            CREDENTIALS_FORMAT_PROCESS, &keys,
                                            errbuf, sizeof(errbuf)), EINVAL);
    assert_contains(errbuf, "not JSON");
    assert_int_equal(credentials_parse_json(with_nul, sizeof(with_nul) - 1,
                                            CREDENTIALS_FORMAT_PROCESS, &keys,
                                            errbuf, sizeof(errbuf)), EINVAL);
    assert_contains(errbuf, "NUL");
    free(text);
}

struct time_row {
    const char *text;
    int err;
    double seconds;
};

static void test_parse_time(void **state)
{
    static const struct time_row rows[] = {
        {"2026-12-02T05:00:00Z", 0, 1796187600},
        {"2026-12-02t05:00:00z", 0, 1796187600},
        {"2026-12-02T05:00:00.25Z", 0, 1796187600.25},
        {"2026-12-02T07:00:00+02:00", 0, 1796187600},
        {"2026-12-02T00:30:00-0430", 0, 1796187600},
        {"2024-02-29T00:00:00Z", 0, 1709164800},
        {"1970-01-01T00:00:00Z", 0, 0},
        {"2026-02-29T00:00:00Z", EINVAL, 0},
        {"2026-13-01T00:00:00Z", EINVAL, 0},
        {"2026-12-32T00:00:00Z", EINVAL, 0},
        {"2026-12-02T24:00:00Z", EINVAL, 0},
        {"2026-12-02T05:00:00", EINVAL, 0},
        {"2026-12-02T05:00Z", EINVAL, 0},
        {"2026-12-02", EINVAL, 0},
        {"2026-12-02T05:00:00Z trailing", EINVAL, 0},
        {"2026-12-02T05:00:00.Z", EINVAL, 0},
        {"2026-12-02T05:00:00+2", EINVAL, 0},
        {"", EINVAL, 0},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        double seconds = -1;
        int err = credentials_parse_time(rows[i].text, &seconds);
        if (err != rows[i].err)
            fail_msg("'%s': %d, expected %d", rows[i].text, err, rows[i].err);
        if (err == 0 && seconds != rows[i].seconds)
            fail_msg("'%s': %.3f, expected %.3f", rows[i].text, seconds,
                     rows[i].seconds);
    }
}

static void test_codes(void **state)
{
    (void)state;
    assert_true(credentials_code_rejects_keys("ExpiredToken"));
    assert_true(credentials_code_rejects_keys("TokenRefreshRequired"));
    assert_true(credentials_code_rejects_keys("InvalidAccessKeyId"));
    assert_true(credentials_code_rejects_keys("InvalidToken"));
    assert_true(credentials_code_rejects_keys("SignatureDoesNotMatch"));
    assert_false(credentials_code_rejects_keys("AccessDenied"));
    assert_false(credentials_code_rejects_keys("NoSuchBucket"));
    assert_false(credentials_code_rejects_keys(""));
    assert_false(credentials_code_rejects_keys(NULL));
}

/* ------------------------------------------------- the fake source */

struct fake {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    double now;                 /* the fake wall clock */
    double lifetime;            /* of the keys handed out; 0: never expire */
    int fail;                   /* errno the next fetches return */
    unsigned fetches;
    unsigned in_fetch;          /* fetches running now */
    unsigned max_in_fetch;
    bool hold;                  /* fetches wait until it is cleared */
};

static struct fake fake;

static double fake_now(void *arg)
{
    struct fake *f = arg;
    pthread_mutex_lock(&f->lock);
    double now = f->now;
    pthread_mutex_unlock(&f->lock);
    return now;
}

static void fake_set_now(double now)
{
    pthread_mutex_lock(&fake.lock);
    fake.now = now;
    pthread_mutex_unlock(&fake.lock);
}

static int fake_fetch(void *arg, struct credentials_fetched *out,
                      char *errbuf, size_t errlen)
{
    struct fake *f = arg;
    char access[64];
    int err;

    pthread_mutex_lock(&f->lock);
    f->fetches++;
    f->in_fetch++;
    if (f->in_fetch > f->max_in_fetch)
        f->max_in_fetch = f->in_fetch;
    pthread_cond_broadcast(&f->changed);
    while (f->hold)
        pthread_cond_wait(&f->changed, &f->lock);
    err = f->fail;
    snprintf(access, sizeof(access), "AKIAFAKE%u", f->fetches);
    out->expiration = f->lifetime != 0 ? f->now + f->lifetime : 0;
    f->in_fetch--;
    pthread_mutex_unlock(&f->lock);
    if (err != 0) {
        snprintf(errbuf, errlen, "the fake source is down");
        return err;
    }
    out->access_key = secret_strdup(access);
    out->secret_key = secret_strdup(SK);
    out->session_token = secret_strdup(TK);
    return 0;
}

static int fake_setup(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof(fake));
    pthread_mutex_init(&fake.lock, NULL);
    pthread_cond_init(&fake.changed, NULL);
    fake.now = 1000000;
    fake.lifetime = 3600;
    return 0;
}

static int fake_teardown(void **state)
{
    (void)state;
    pthread_mutex_destroy(&fake.lock);
    pthread_cond_destroy(&fake.changed);
    return 0;
}

static struct credentials *fake_store(bool refreshable)
{
    struct credentials_source source = {
        .name = strdup("the fake source"),
        .refreshable = refreshable,
        .fetch = fake_fetch,
        .arg = &fake,
    };
    struct credentials_clock clock = {.now = fake_now, .arg = &fake};
    struct credentials *creds = NULL;
    char errbuf[256];

    assert_int_equal(credentials_create(&source, &clock, &creds, errbuf,
                                        sizeof(errbuf)), 0);
    assert_null(source.name); /* taken over */
    return creds;
}

/* The access key of the keys handed out now (their generation in *GEN). */
static unsigned current_key(struct credentials *creds, uint64_t *gen)
{
    struct credentials_keys *keys = NULL;
    unsigned number = 0;

    assert_int_equal(credentials_get(creds, &keys), 0);
    sscanf(keys->access_key, "AKIAFAKE%u", &number);
    if (gen != NULL)
        *gen = keys->generation;
    credentials_keys_release(creds, &keys);
    assert_null(keys);
    return number;
}

/* One-hour keys: refreshed 5 minutes before they expire, not earlier. */
static void test_refresh_when_due(void **state)
{
    struct credentials *creds;

    (void)state;
    creds = fake_store(true);
    assert_int_equal(fake.fetches, 1);
    assert_int_equal(current_key(creds, NULL), 1);
    fake_set_now(1000000 + 3600 - 301);
    assert_int_equal(current_key(creds, NULL), 1);
    assert_int_equal(fake.fetches, 1);
    fake_set_now(1000000 + 3600 - 299);
    assert_int_equal(current_key(creds, NULL), 2);
    assert_int_equal(fake.fetches, 2);
    assert_int_equal(current_key(creds, NULL), 2);
    assert_int_equal(fake.fetches, 2);
    credentials_destroy(&creds);
    assert_null(creds);
    credentials_destroy(&creds);
}

/* Short-lived keys (30 s): due after two thirds of their life, expired in
 * the last tenth; and keys without an expiration are never refreshed. */
static void test_refresh_short_lived_and_never(void **state)
{
    struct credentials *creds;

    (void)state;
    fake.lifetime = 30;
    creds = fake_store(true);
    fake_set_now(1000000 + 19);
    assert_int_equal(current_key(creds, NULL), 1);
    fake_set_now(1000000 + 21);
    assert_int_equal(current_key(creds, NULL), 2);
    credentials_destroy(&creds);

    fake.lifetime = 0;
    creds = fake_store(true);
    fake_set_now(1000000 + 10 * 365 * 86400.0);
    assert_int_equal(current_key(creds, NULL), 3);
    assert_int_equal(fake.fetches, 3);
    credentials_destroy(&creds);
}

/* A failing source: the old keys go on until they expire; the backoff
 * spaces the attempts; then EKEYEXPIRED; a success ends the streak. */
static void test_refresh_failure_backoff(void **state)
{
    struct credentials *creds;
    struct credentials_keys *keys = NULL;
    struct credentials_stats stats;
    double t0 = 1000000;

    (void)state;
    creds = fake_store(true);
    fake.fail = EIO;
    fake_set_now(t0 + 3400);                      /* due */
    assert_int_equal(current_key(creds, NULL), 1); /* failed: old keys */
    assert_int_equal(fake.fetches, 2);
    assert_int_equal(current_key(creds, NULL), 1); /* in backoff: no fetch */
    assert_int_equal(fake.fetches, 2);
    fake_set_now(t0 + 3401.5);                    /* backoff (1 s) over */
    assert_int_equal(current_key(creds, NULL), 1);
    assert_int_equal(fake.fetches, 3);
    fake_set_now(t0 + 3402);                      /* second backoff: 2 s */
    assert_int_equal(current_key(creds, NULL), 1);
    assert_int_equal(fake.fetches, 3);
    fake_set_now(t0 + 3589);                      /* not expired yet */
    assert_int_equal(current_key(creds, NULL), 1); /* fetch 4 failed */
    assert_int_equal(fake.fetches, 4);
    credentials_stats(creds, &stats);
    assert_int_equal(stats.failures, 3);
    fake_set_now(t0 + 3591);          /* expired (10 s margin), in backoff */
    assert_int_equal(credentials_get(creds, &keys), EKEYEXPIRED);
    assert_null(keys);
    assert_int_equal(fake.fetches, 4);
    fake.fail = 0;
    fake_set_now(t0 + 3700);                      /* backoff over */
    assert_int_equal(current_key(creds, NULL), 5);
    assert_int_equal(fake.fetches, 5);
    credentials_stats(creds, &stats);
    assert_int_equal(stats.generation, 2);
    credentials_destroy(&creds);
}

/* Keys already expired when they arrive: the mount fails. */
static void test_create_expired(void **state)
{
    struct credentials_source source = {
        .name = strdup("the fake source"), .refreshable = true,
        .fetch = fake_fetch, .arg = &fake,
    };
    struct credentials_clock clock = {.now = fake_now, .arg = &fake};
    struct credentials *creds = NULL;
    char errbuf[256];

    (void)state;
    fake.lifetime = -5;
    assert_int_equal(credentials_create(&source, &clock, &creds, errbuf,
                                        sizeof(errbuf)), EKEYEXPIRED);
    assert_null(creds);
    assert_contains(errbuf, "gave keys that expired at");
    fake.lifetime = 3600;
    fake.fail = EIO;
    source = (struct credentials_source){
        .name = strdup("the fake source"), .refreshable = true,
        .fetch = fake_fetch, .arg = &fake,
    };
    assert_int_equal(credentials_create(&source, &clock, &creds, errbuf,
                                        sizeof(errbuf)), EIO);
    assert_string_equal(errbuf, "the fake source is down");
}

/* Rejected keys: a refresh now, once per generation; static keys cannot
 * be replaced. */
static void test_rejected(void **state)
{
    struct credentials *creds;
    uint64_t gen = 0, gen2 = 0;

    (void)state;
    creds = fake_store(true);
    current_key(creds, &gen);
    assert_int_equal(credentials_rejected(creds, gen), 0);
    assert_int_equal(fake.fetches, 2);
    assert_int_equal(current_key(creds, &gen2), 2);
    assert_int_equal(gen2, gen + 1);
    /* a second signer with the old generation: nothing fetched */
    assert_int_equal(credentials_rejected(creds, gen), 0);
    assert_int_equal(fake.fetches, 2);
    /* a source that fails: EACCES, and no second fetch in the backoff */
    fake.fail = EIO;
    assert_int_equal(credentials_rejected(creds, gen2), EACCES);
    assert_int_equal(credentials_rejected(creds, gen2), EACCES);
    assert_int_equal(fake.fetches, 3);
    credentials_destroy(&creds);

    fake.fail = 0;
    creds = fake_store(false);
    current_key(creds, &gen);
    assert_int_equal(credentials_rejected(creds, gen), EACCES);
    assert_int_equal(fake.fetches, 4);
    credentials_destroy(&creds);
}

/* A reference outlives a refresh: the keys it holds stay intact. */
static void test_reference_outlives_refresh(void **state)
{
    struct credentials *creds;
    struct credentials_keys *old = NULL;

    (void)state;
    creds = fake_store(true);
    assert_int_equal(credentials_get(creds, &old), 0);
    assert_int_equal(credentials_rejected(creds, old->generation), 0);
    assert_string_equal(old->access_key, "AKIAFAKE1");
    assert_string_equal(old->secret_key, SK);
    assert_int_equal(current_key(creds, NULL), 2);
    credentials_destroy(&creds);
    assert_string_equal(old->session_token, TK);
    credentials_keys_release(NULL, &old);
}

/* ---------------------------------------------------- single-flight */

#define SIGNERS 8

struct signer {
    struct credentials *creds;
    int err;
    unsigned key;
    bool done;
};

static void *signer_main(void *arg)
{
    struct signer *signer = arg;
    struct credentials_keys *keys = NULL;

    signer->err = credentials_get(signer->creds, &keys);
    if (signer->err == 0) {
        sscanf(keys->access_key, "AKIAFAKE%u", &signer->key);
        credentials_keys_release(signer->creds, &keys);
    }
    pthread_mutex_lock(&fake.lock);
    signer->done = true;
    pthread_cond_broadcast(&fake.changed);
    pthread_mutex_unlock(&fake.lock);
    return NULL;
}

/* Wait on fake.changed (fake.lock held), failing after 10 s rather than
 * hanging when the store does not do what the test waits for. */
static void wait_changed(void)
{
    struct timespec deadline;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    if (pthread_cond_timedwait(&fake.changed, &fake.lock, &deadline) ==
        ETIMEDOUT)
        fail_msg("timed out: fetches running %u, fetches %u", fake.in_fetch,
                 fake.fetches);
}

static unsigned signers_done(struct signer *signers)
{
    unsigned done = 0;
    for (int i = 0; i < SIGNERS; i++)
        done += signers[i].done;
    return done;
}

/* Due, not expired: one signer refreshes (held in the source), the others
 * go on at once with the current keys. */
static void test_single_flight_due(void **state)
{
    struct signer signers[SIGNERS];
    pthread_t threads[SIGNERS];
    struct credentials *creds;

    (void)state;
    creds = fake_store(true);
    fake_set_now(1000000 + 3400);
    pthread_mutex_lock(&fake.lock);
    fake.hold = true;
    pthread_mutex_unlock(&fake.lock);
    for (int i = 0; i < SIGNERS; i++) {
        signers[i] = (struct signer){.creds = creds};
        assert_int_equal(pthread_create(&threads[i], NULL, signer_main,
                                        &signers[i]), 0);
    }
    pthread_mutex_lock(&fake.lock);
    /* all but the refresher finish while the fetch is held */
    while (fake.in_fetch != 1 || signers_done(signers) != SIGNERS - 1)
        wait_changed();
    fake.hold = false;
    pthread_cond_broadcast(&fake.changed);
    pthread_mutex_unlock(&fake.lock);
    unsigned old = 0, fresh = 0;
    for (int i = 0; i < SIGNERS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(signers[i].err, 0);
        old += signers[i].key == 1;
        fresh += signers[i].key == 2;
    }
    assert_int_equal(old, SIGNERS - 1);
    assert_int_equal(fresh, 1);
    assert_int_equal(fake.fetches, 2);
    assert_int_equal(fake.max_in_fetch, 1);
    credentials_destroy(&creds);
}

/* Expired: every signer waits for the one refresh and signs with its
 * keys; the source is asked once. */
static void test_single_flight_expired(void **state)
{
    struct signer signers[SIGNERS];
    pthread_t threads[SIGNERS];
    struct credentials *creds;

    (void)state;
    creds = fake_store(true);
    fake_set_now(1000000 + 3599);
    pthread_mutex_lock(&fake.lock);
    fake.hold = true;
    pthread_mutex_unlock(&fake.lock);
    for (int i = 0; i < SIGNERS; i++) {
        signers[i] = (struct signer){.creds = creds};
        assert_int_equal(pthread_create(&threads[i], NULL, signer_main,
                                        &signers[i]), 0);
    }
    pthread_mutex_lock(&fake.lock);
    while (fake.in_fetch != 1)
        wait_changed();
    pthread_mutex_unlock(&fake.lock);
    usleep(50 * 1000); /* let the others reach the wait */
    pthread_mutex_lock(&fake.lock);
    assert_int_equal(signers_done(signers), 0);
    fake.hold = false;
    pthread_cond_broadcast(&fake.changed);
    pthread_mutex_unlock(&fake.lock);
    for (int i = 0; i < SIGNERS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(signers[i].err, 0);
        assert_int_equal(signers[i].key, 2);
    }
    assert_int_equal(fake.fetches, 2);
    assert_int_equal(fake.max_in_fetch, 1);
    credentials_destroy(&creds);
}

/* Many threads asking and rejecting while the clock runs: no more than
 * one fetch at a time, and every answer a whole generation. */
static void *churn_main(void *arg)
{
    struct credentials *creds = arg;

    for (int i = 0; i < 2000; i++) {
        struct credentials_keys *keys = NULL;
        if (credentials_get(creds, &keys) != 0)
            continue;
        unsigned number = 0;
        assert_int_equal(sscanf(keys->access_key, "AKIAFAKE%u", &number), 1);
        assert_string_equal(keys->secret_key, SK);
        if (i % 97 == 0)
            credentials_rejected(creds, keys->generation);
        credentials_keys_release(creds, &keys);
        if (i % 50 == 0) {
            pthread_mutex_lock(&fake.lock);
            fake.now += 1;
            pthread_mutex_unlock(&fake.lock);
        }
    }
    return NULL;
}

static void test_single_flight_churn(void **state)
{
    pthread_t threads[SIGNERS];
    struct credentials *creds;

    (void)state;
    fake.lifetime = 30;
    creds = fake_store(true);
    for (int i = 0; i < SIGNERS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, churn_main, creds),
                         0);
    for (int i = 0; i < SIGNERS; i++)
        pthread_join(threads[i], NULL);
    assert_int_equal(fake.max_in_fetch, 1);
    assert_true(fake.fetches > 2);
    credentials_destroy(&creds);
}

/* --------------------------------------------------------- sources */

struct split_row {
    const char *command;
    int err;
    const char *words[5];
};

static void test_split(void **state)
{
    static const struct split_row rows[] = {
        {"/usr/bin/get-creds --profile prod", 0,
         {"/usr/bin/get-creds", "--profile", "prod"}},
        {"  a\tb  ", 0, {"a", "b"}},
        {"'/opt/my tools/creds' \"arg with space\"", 0,
         {"/opt/my tools/creds", "arg with space"}},
        {"a\\ b c", 0, {"a b", "c"}},
        {"\"x\\\"y\\\\z\\n\"", 0, {"x\"y\\z\\n"}},
        {"'it''s'", 0, {"its"}},
        {"pre'fix'\"post\"", 0, {"prefixpost"}},
        {"\"\"", 0, {""}},
        {"'open", EINVAL, {NULL}},
        {"\"open", EINVAL, {NULL}},
        {"trailing\\", EINVAL, {NULL}},
        {"   ", EINVAL, {NULL}},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char **argv = NULL;
        int err = credsource_split(rows[i].command, &argv);
        if (err != rows[i].err)
            fail_msg("'%s': %d, expected %d", rows[i].command, err,
                     rows[i].err);
        if (err != 0) {
            assert_null(argv);
            continue;
        }
        size_t n = 0;
        for (; rows[i].words[n] != NULL; n++) {
            assert_non_null(argv[n]);
            assert_string_equal(argv[n], rows[i].words[n]);
        }
        assert_null(argv[n]);
        credsource_argv_free(&argv);
        assert_null(argv);
    }
}

static const char *const aws_vars[] = {
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "AWS_METADATA_SERVICE_TIMEOUT",
    "AWS_METADATA_SERVICE_NUM_ATTEMPTS",
};

static char tmpdir[64];

static int env_setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(aws_vars) / sizeof(aws_vars[0]); i++)
        unsetenv(aws_vars[i]);
    /* never the real metadata services, whatever a test forgets */
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1", 1);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_credentials.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return fake_setup(state);
}

static int env_teardown(void **state)
{
    char command[128];

    snprintf(command, sizeof(command), "rm -rf '%s'", tmpdir);
    assert_int_equal(system(command), 0);
    return fake_teardown(state);
}

/* Choose with AWS (no static keys unless given) and fetch once through a
 * store; returns the store's error, the message in ERRBUF. */
static int choose_and_create(const struct awsconfig *aws,
                             struct credentials **creds, char *errbuf,
                             size_t errlen)
{
    struct credsource_conf conf = {.aws = aws};
    struct credentials_source source;
    int err = credsource_choose(&conf, &source, errbuf, errlen);

    *creds = NULL;
    if (err != 0)
        return err;
    return credentials_create(&source, NULL, creds, errbuf, errlen);
}

static void write_script(const char *name, const char *body, char *path,
                         size_t len)
{
    snprintf(path, len, "%s/%s", tmpdir, name);
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    fprintf(file, "#!/bin/sh\n%s", body);
    fclose(file);
    assert_int_equal(chmod(path, 0700), 0);
}

/* credential_process for real: keys from its output; its failures and
 * bad output are errors that name the profile and hold no secret. */
static void test_process_source(void **state)
{
    char path[256], command[512], errbuf[512];
    struct awsconfig aws = {.profile = "prod"};
    struct credentials *creds = NULL;
    struct credentials_keys *keys = NULL;

    (void)state;
    write_script("good", "echo '{\"Version\": 1, \"AccessKeyId\": \"" AK
                 "\", \"SecretAccessKey\": \"" SK "\", \"SessionToken\": \""
                 TK "\", \"Expiration\": \"2099-01-01T00:00:00Z\"}'\n"
                 "echo \"$1\" > \"$(dirname \"$0\")/arg\"\n", path,
                 sizeof(path));
    snprintf(command, sizeof(command), "'%s' 'one arg'", path);
    aws.credential_process = command;
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     0);
    assert_contains(credentials_source_name(creds),
                    "credential_process of profile 'prod'");
    assert_int_equal(credentials_get(creds, &keys), 0);
    assert_string_equal(keys->access_key, AK);
    assert_string_equal(keys->secret_key, SK);
    assert_string_equal(keys->session_token, TK);
    assert_true(keys->expiration == 4070908800.0);
    credentials_keys_release(creds, &keys);
    credentials_destroy(&creds);
    snprintf(path, sizeof(path), "%s/arg", tmpdir);
    FILE *arg = fopen(path, "r");
    char line[64] = "";
    assert_non_null(arg);
    assert_non_null(fgets(line, sizeof(line), arg));
    fclose(arg);
    assert_string_equal(line, "one arg\n"); /* one word, no shell */

    write_script("fails", "echo '{\"SecretAccessKey\": \"S3CR3T-IN-STDOUT\"}'\n"
                 "echo 'token service unreachable' >&2\nexit 3\n", path,
                 sizeof(path));
    aws.credential_process = path;
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     EIO);
    assert_contains(errbuf, "credential_process of profile 'prod'");
    assert_contains(errbuf, "exited with status 3");
    assert_contains(errbuf, "token service unreachable");
    assert_no_secret(errbuf);

    write_script("garbage", "echo 'AccessKeyId=" AK " Secret=" SK "'\n",
                 path, sizeof(path));
    aws.credential_process = path;
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     EINVAL);
    assert_contains(errbuf, "printed no valid credentials: not JSON");
    assert_no_secret(errbuf);

    write_script("huge", "head -c 70000 /dev/zero | tr '\\0' ' '\n", path,
                 sizeof(path));
    aws.credential_process = path;
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     EINVAL);
    assert_contains(errbuf, "printed more than 64 KiB");

    aws.credential_process = "/nonexistent/get-creds";
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     ENOENT);
    assert_contains(errbuf, "cannot run /nonexistent/get-creds");

    aws.credential_process = "'unbalanced";
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     EINVAL);
    assert_contains(errbuf, "cannot be split");
}

/* The order: static keys, credential_process, container, metadata; the
 * container's full URI must be https or loopback; metadata can be off. */
static void test_choose(void **state)
{
    struct awsconfig aws = {0};
    struct credsource_conf conf = {.aws = &aws};
    struct credentials_source source;
    char errbuf[512];

    (void)state;
    aws.access_key = AK;
    aws.secret_key = SK;
    aws.credentials_source = "environment (AWS_ACCESS_KEY_ID)";
    aws.credential_process = "/bin/false";
    setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/x", 1);
    assert_int_equal(credsource_choose(&conf, &source, errbuf,
                                       sizeof(errbuf)), 0);
    assert_false(source.refreshable);
    assert_string_equal(source.name, "environment (AWS_ACCESS_KEY_ID)");
    struct credentials *creds = NULL;
    assert_int_equal(credentials_create(&source, NULL, &creds, errbuf,
                                        sizeof(errbuf)), 0);
    credentials_destroy(&creds);

    aws.access_key = aws.secret_key = NULL;
    assert_int_equal(credsource_choose(&conf, &source, errbuf,
                                       sizeof(errbuf)), 0);
    assert_true(source.refreshable);
    assert_contains(source.name, "credential_process of profile 'default'");
    source.destroy(source.arg);
    free(source.name);

    aws.credential_process = NULL;
    assert_int_equal(credsource_choose(&conf, &source, errbuf,
                                       sizeof(errbuf)), 0);
    assert_string_equal(source.name, "container credentials at "
                        "http://169.254.170.2/v2/credentials/x");
    source.destroy(source.arg);
    free(source.name);

    unsetenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    static const struct {
        const char *uri;
        bool allowed;
    } uris[] = {
        {"http://127.0.0.1:8080/creds", true},
        {"http://127.1.2.3/creds", true},
        {"http://localhost/creds", true},
        {"http://[::1]:9/creds", true},
        {"http://169.254.170.23/v1/credentials", true},
        {"https://creds.example.com/x", true},
        {"http://creds.example.com/x", false},
        {"http://128.0.0.1/x", false},
        {"http://127.0.0.1.example.com/x", false},
        {"ftp://127.0.0.1/x", false},
        {"not a url", false},
    };
    for (size_t i = 0; i < sizeof(uris) / sizeof(uris[0]); i++) {
        setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uris[i].uri, 1);
        int err = credsource_choose(&conf, &source, errbuf, sizeof(errbuf));
        if (err != (uris[i].allowed ? 0 : EINVAL))
            fail_msg("%s: %d", uris[i].uri, err);
        if (err == 0) {
            source.destroy(source.arg);
            free(source.name);
        } else {
            assert_contains(errbuf, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
        }
    }
    unsetenv("AWS_CONTAINER_CREDENTIALS_FULL_URI");

    /* instance metadata, at the endpoint of the environment (a closed
     * port here): the mount's message explains why it was asked */
    assert_int_equal(choose_and_create(&aws, &creds, errbuf, sizeof(errbuf)),
                     EIO);
    assert_contains(errbuf, "instance metadata at http://127.0.0.1:1");
    assert_contains(errbuf, "AWS_EC2_METADATA_DISABLED=true");

    setenv("AWS_EC2_METADATA_DISABLED", "TRUE", 1);
    assert_int_equal(credsource_choose(&conf, &source, errbuf,
                                       sizeof(errbuf)), ENOENT);
    assert_contains(errbuf, "no credentials");
    unsetenv("AWS_EC2_METADATA_DISABLED");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_json_rows),
        cmocka_unit_test(test_parse_json_huge),
        cmocka_unit_test(test_parse_time),
        cmocka_unit_test(test_codes),
        cmocka_unit_test_setup_teardown(test_refresh_when_due, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_refresh_short_lived_and_never,
                                        fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_refresh_failure_backoff,
                                        fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_create_expired, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_rejected, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_reference_outlives_refresh,
                                        fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_single_flight_due, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_single_flight_expired,
                                        fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_single_flight_churn, fake_setup,
                                        fake_teardown),
        cmocka_unit_test(test_split),
        cmocka_unit_test_setup_teardown(test_process_source, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(test_choose, env_setup,
                                        env_teardown),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return failed;
}
