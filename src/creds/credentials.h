/*
 * credentials.h - the keys requests are signed with, and their refresh.
 *
 * A struct credentials owns the current keys (access key, secret key,
 * session token, expiration) of one source (credsource.h: static keys,
 * credential_process, container credentials, EC2 instance metadata) and
 * replaces them before they expire, without a remount. The S3 client
 * takes a generation of keys for each attempt it signs
 * (credentials_get()), so the three strings of one signature always come
 * from the same fetch, and reports keys the server rejected
 * (credentials_rejected()) to have them replaced at once.
 *
 * Refresh (see credentials.c for the states):
 *   - keys are "due" when less than min(5 min, a third of their lifetime)
 *     is left, "expired" when less than min(10 s, a tenth of it) is;
 *     keys without an expiration are never due;
 *   - one refresh at a time (single-flight), run by the signer that found
 *     the keys due, with no lock held while the source is asked; other
 *     signers keep using the current keys while they are not expired, and
 *     wait for the refresh when they are;
 *   - a failed refresh is retried after a backoff (1 s doubling to 60 s),
 *     logged once per streak of failures (the source's name and the
 *     reason: never a key); signers go on with the old keys until they
 *     expire, then fail with EKEYEXPIRED while the backoff runs.
 *
 * Secrets: secret keys and session tokens live in secret memory
 * (secret.h) and are wiped when the last reference to their generation is
 * dropped. Error messages name the source, a field or a reason, never a
 * value.
 *
 * Threads: every function may be called from any thread, except
 * credentials_destroy(), which no other call may overlap.
 */
#ifndef S3CFS_CREDENTIALS_H
#define S3CFS_CREDENTIALS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct credentials;

/* Cap on a credentials document (process output, metadata answer). */
#define CREDENTIALS_JSON_MAX (64u << 10)

/* One generation of keys. Immutable once handed out by credentials_get();
 * owned by the store and by each holder of a reference. */
struct credentials_keys {
    char *access_key;           /* secret memory, like the others */
    char *secret_key;           /* secret memory */
    char *session_token;        /* secret memory; NULL: none */
    double expiration;          /* wall-clock seconds; 0: never expires */
    double obtained;            /* wall-clock seconds of the fetch */
    uint64_t generation;        /* 1 for the first keys, then +1 a fetch */
    _Atomic unsigned refs;      /* the store's and each holder's */
};

/* What a source fills in: access and secret key set, the rest optional. */
struct credentials_fetched {
    char *access_key;           /* secret memory (secret_strdup) */
    char *secret_key;           /* secret memory */
    char *session_token;        /* secret memory or NULL */
    double expiration;          /* wall-clock seconds; 0: never */
};

/* Wipe and free the strings of KEYS; all fields zero. Safe twice. */
void credentials_fetched_clear(struct credentials_fetched *keys);

/* Where keys come from (credsource.h makes them). FETCH fills OUT, or
 * returns an errno with one sentence in ERRBUF that names the source and
 * the reason, never a key. It runs with no lock held, one call at a time
 * per store. */
struct credentials_source {
    char *name;                 /* for messages: "credential_process of
                                   profile 'x'"; malloc'd, owned */
    bool refreshable;           /* false: static keys, fetched once */
    int (*fetch)(void *arg, struct credentials_fetched *out, char *errbuf,
                 size_t errlen);
    void (*destroy)(void *arg); /* frees ARG; may be NULL */
    void *arg;
};

/* A source that hands out copies of fixed keys (never refreshed); NAME is
 * for messages ("environment (AWS_ACCESS_KEY_ID)"). The strings are
 * copied. Returns 0 or ENOMEM. */
int credentials_static_source(const char *access_key, const char *secret_key,
                              const char *session_token, const char *name,
                              struct credentials_source *out);

/* The clock the refresh decisions use (tests inject their own). */
struct credentials_clock {
    double (*now)(void *arg);   /* wall-clock seconds; NULL: the real one */
    void *arg;
};

/*
 * Take over SOURCE (its fields are moved out and zeroed, also on failure)
 * and fetch the first keys. CLOCK may be NULL (the real clock). Returns 0,
 * or the source's errno with its sentence in ERRBUF (the store is not
 * created), or ENOMEM.
 */
int credentials_create(struct credentials_source *source,
                       const struct credentials_clock *clock,
                       struct credentials **out, char *errbuf,
                       size_t errlen);

/* Free the store and wipe its keys; references still held stay valid
 * until released. *credsp = NULL; safe twice. */
void credentials_destroy(struct credentials **credsp);

/*
 * A reference to keys to sign with now, refreshed first when due (see the
 * top). Release it with credentials_keys_release(). Returns 0, or
 * EKEYEXPIRED when the keys have expired and no refresh succeeded (the
 * refresh's failure was logged).
 */
int credentials_get(struct credentials *creds,
                    struct credentials_keys **keysp);

/* Drop a reference from credentials_get(); wipes the keys when it was the
 * last. *keysp = NULL; safe with NULL. */
void credentials_keys_release(struct credentials *creds,
                              struct credentials_keys **keysp);

/*
 * The server rejected the keys of GENERATION (403 ExpiredToken,
 * InvalidAccessKeyId...): have them replaced. Returns 0 when keys of a
 * later generation are there to sign with (fetched now, or by another
 * thread meanwhile), EACCES when the source cannot give others (static
 * keys) or the refresh failed (logged).
 */
int credentials_rejected(struct credentials *creds, uint64_t generation);

/* The source's name, for messages; valid until credentials_destroy(). */
const char *credentials_source_name(const struct credentials *creds);

/* Counters, for tests and the stats. */
struct credentials_stats {
    uint64_t fetches;           /* calls of the source's fetch */
    uint64_t failures;          /* of those, failed */
    uint64_t generation;        /* of the current keys */
};
void credentials_stats(struct credentials *creds,
                       struct credentials_stats *out);

/* The S3 error codes that mean "these keys are not (or no longer) good":
 * ExpiredToken, TokenRefreshRequired, InvalidAccessKeyId, InvalidToken,
 * and SignatureDoesNotMatch (what Swift's s3api answers for an unknown
 * access key). */
bool credentials_code_rejects_keys(const char *s3_code);

/* ---------------------------------------------------------------- JSON */

/* The documents keys come in. */
enum credentials_format {
    /* credential_process output: {"Version": 1, "AccessKeyId",
     * "SecretAccessKey", "SessionToken"?, "Expiration"?} */
    CREDENTIALS_FORMAT_PROCESS,
    /* EC2 instance metadata and container credentials: {"AccessKeyId",
     * "SecretAccessKey", "Token"?, "Expiration"?, "Code"?} ("Code", when
     * present, must be "Success") */
    CREDENTIALS_FORMAT_METADATA,
};

/*
 * Parse a credentials document (TEXT, LEN bytes, not necessarily
 * NUL-terminated; at most CREDENTIALS_JSON_MAX) into OUT. Returns 0, or
 * EINVAL with a sentence in ERRBUF naming what is wrong ("not JSON: ...",
 * "no SecretAccessKey", "Expiration is not an ISO 8601 time"), never a
 * value, or ENOMEM. The strings json-c kept of the keys are wiped.
 */
int credentials_parse_json(const char *text, size_t len,
                           enum credentials_format format,
                           struct credentials_fetched *out, char *errbuf,
                           size_t errlen);

/* An ISO 8601 time as AWS writes it ("2026-12-02T05:00:00Z", with an
 * optional fraction, "Z" or an offset "+01:00"/"+0100") -> seconds since
 * the epoch. Returns 0 or EINVAL. */
int credentials_parse_time(const char *text, double *out);

#endif /* S3CFS_CREDENTIALS_H */
