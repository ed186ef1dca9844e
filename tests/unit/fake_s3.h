/*
 * fake_s3.h - an in-memory S3 for the unit tests of the core.
 *
 * fake_s3.c defines every function of s3.h on one bucket held in memory,
 * so that a test program links it instead of s3.c and drives writer.c,
 * reader.c, upload.c or s3walk.c without a server: what s3.h promises
 * (errno values, quoted ETags, If-Match, ranges, streamed GETs, listings
 * with delimiters and continuation tokens, copies with and without
 * x-amz-copy-source-if-match, PUTs with If-None-Match: * or If-Match, multipart
 * uploads with AWS's ETags) holds here too. On top of that, the hooks
 * below let a test
 *   - hold requests until it releases them, and wait for them to arrive;
 *   - fail requests, before they act or after ("answer lost");
 *   - change the bucket behind the client's back, as another client;
 *   - read the log of every request, in order.
 *
 * Caveats:
 *   - One bucket per client, no retries: an injected failure is what the
 *     real client returns once its retries are spent. s3_client_stats()
 *     counts one attempt per call (held and failed ones included); its
 *     retries stay 0.
 *   - A request is logged and counted when it arrives, then waits while a
 *     hold rule matches it, then meets the failure rules, then acts. A
 *     request body (PUT, UploadPart) is read when the request acts: bytes
 *     changed while it was held are stored changed, as a server reading
 *     the stream would store them. A GET serves the version the object
 *     has when it acts, whole, even if the object is replaced meanwhile.
 *   - A held request blocks its caller's thread until it is released.
 *     Release every hold (fake_s3_hold_clear(s3, 0)) before joining or
 *     destroying what made the requests, also when a test fails (in its
 *     teardown), and before s3_client_destroy(): no request may be under
 *     way then.
 *   - Nothing sleeps. The waits of the hooks end after
 *     FAKE_S3_WAIT_SECONDS with ETIMEDOUT, so a broken test fails instead
 *     of hanging.
 *   - Keys are compared as bytes (strcmp orders as unsigned char: the
 *     binary UTF-8 order S3 lists in). Nothing is URL-encoded or signed.
 *   - Last-Modified comes from a clock of the fake's own: it starts at
 *     FAKE_S3_EPOCH and moves one second per object written, so times are
 *     the same from run to run and each write is later than the one
 *     before. The s3fs times (mtime, atime, ctime) keep whole seconds, as
 *     their headers do.
 *   - Streamed GETs reach the sink in pieces of FAKE_S3_SINK_CHUNK bytes
 *     (a size that divides no block size), the last one shorter.
 *   - Parts of a multipart upload other than the last must have at least
 *     UPLOAD_MIN_PART_SIZE bytes (EINVAL at complete, as AWS's
 *     EntityTooSmall). A CopyObject's ETag is the MD5 of the bytes, also
 *     for a multipart source.
 *   - The fake behaves as AWS does. Other servers' quirks are a failure
 *     rule away: s3rver's missing UploadPartCopy and abort (ENOSYS,
 *     FAKE_S3_ALWAYS), Swift's 412 on a multipart copy source (ESTALE),
 *     a 200 carrying an <Error> (EIO).
 *
 * Threads: every function may be called from any thread; one mutex guards
 * the whole fake and is never held while a sink is called.
 */
#ifndef S3CFS_FAKE_S3_H
#define S3CFS_FAKE_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "s3/s3.h"

#define FAKE_S3_EPOCH 1767225600       /* 2026-01-01T00:00:00Z */
#define FAKE_S3_WAIT_SECONDS 30
#define FAKE_S3_SINK_CHUNK 100000u
#define FAKE_S3_ALWAYS 0xffffffffu     /* a failure rule that never runs out */

/* What a request asks for. The s3_op it is counted under is in
 * parentheses. */
enum fake_s3_call {
    FAKE_S3_HEAD,            /* s3_head_object (HEAD) */
    FAKE_S3_GET,             /* s3_get_object_range, _stream (GET) */
    FAKE_S3_LIST,            /* s3_list_objects, s3_check_bucket (LIST) */
    FAKE_S3_PUT,             /* s3_put_object (PUT) */
    FAKE_S3_DELETE,          /* s3_delete_object (DELETE) */
    FAKE_S3_COPY,            /* s3_copy_object (COPY) */
    FAKE_S3_MP_CREATE,       /* s3_multipart_create (MULTIPART) */
    FAKE_S3_MP_PART,         /* s3_multipart_upload_part (MULTIPART) */
    FAKE_S3_MP_COPY_PART,    /* s3_multipart_copy_part (MULTIPART) */
    FAKE_S3_MP_COMPLETE,     /* s3_multipart_complete(_object) (MULTIPART) */
    FAKE_S3_MP_ABORT,        /* s3_multipart_abort (MULTIPART) */
    FAKE_S3_CALL_COUNT,
};

/* A set of calls, for struct fake_s3_match. */
#define FAKE_S3_CALL(call) (1u << (call))
/* Every request that writes an object or a part of one. */
#define FAKE_S3_UPLOADS                                                    \
    (FAKE_S3_CALL(FAKE_S3_PUT) | FAKE_S3_CALL(FAKE_S3_COPY) |              \
     FAKE_S3_CALL(FAKE_S3_MP_CREATE) | FAKE_S3_CALL(FAKE_S3_MP_PART) |     \
     FAKE_S3_CALL(FAKE_S3_MP_COPY_PART) | FAKE_S3_CALL(FAKE_S3_MP_COMPLETE))

/* Which requests a rule or a count applies to. The fake copies KEY. */
struct fake_s3_match {
    unsigned calls;          /* FAKE_S3_CALL() bits; 0: every call */
    const char *key;         /* NULL: any key */
    bool prefix;             /* KEY is a prefix of the keys it matches */
};

/* A match of the calls CALL_SET on exactly KEY_EXACT (NULL: any key), or
 * on every key under KEY_PREFIX. */
#define FAKE_S3_ON(call_set, key_exact)                                    \
    (&(const struct fake_s3_match){.calls = (call_set), .key = (key_exact)})
#define FAKE_S3_UNDER(call_set, key_prefix)                                \
    (&(const struct fake_s3_match){.calls = (call_set), .key = (key_prefix), \
                                   .prefix = true})

/* One request, as the log keeps it. Its strings are owned by the fake
 * and valid until fake_s3_log_clear() or s3_client_destroy(). */
struct fake_s3_request {
    uint64_t seq;            /* 0, 1, 2... in the order requests arrived */
    enum fake_s3_call call;
    const char *key;         /* the key; LIST: the prefix; COPY: the
                                destination */
    const char *source;      /* COPY, MP_COPY_PART: the source key; NULL */
    const char *condition;   /* the If-Match (GET, PUT) or
                                x-amz-copy-source-if-match sent, or NULL */
    uint64_t offset;         /* GET, MP_COPY_PART: first byte asked for */
    uint64_t length;         /* GET, MP_COPY_PART: bytes asked for; PUT,
                                MP_PART: body length; LIST: max-keys */
    unsigned part_number;    /* MP_PART, MP_COPY_PART */
    bool done;               /* the caller got its answer */
    int result;              /* once done: the errno returned (0: none) */
    char etag[S3_ETAG_MAX];  /* once done: the ETag it made (PUT, COPY,
                                parts, complete), else "" */
};

/* Create an empty bucket and a client on it: the struct s3_client * to
 * hand to the code under test. Free it with s3_client_destroy(). 0 or
 * ENOMEM. (s3_client_create() does the same, ignoring its conf.) */
int fake_s3_create(struct s3_client **out);

/* What a write with If-None-Match: * (s3_put_meta.if_none_match) or
 * If-Match (s3_put_meta.if_match) does. */
enum fake_s3_conditions {
    FAKE_S3_CONDITIONS_HONOURED,   /* ESTALE when the key is taken (If-
                                      None-Match) or holds another ETag
                                      (If-Match; ENOENT when it is free),
                                      as AWS (the default) */
    FAKE_S3_CONDITIONS_IGNORED,    /* written anyway, as s3rver */
    FAKE_S3_CONDITIONS_REFUSED,    /* ENOSYS (501), as Swift's s3api */
};

/* Both conditions of writes behave as CONDITIONS. */
void fake_s3_set_conditions(struct s3_client *s3,
                            enum fake_s3_conditions conditions);

/* If-Match on writes alone behaves as CONDITIONS (a server may honour
 * If-None-Match and not If-Match). */
void fake_s3_set_if_match_conditions(struct s3_client *s3,
                                     enum fake_s3_conditions conditions);

/* The name of CALL ("PUT", "MP_COMPLETE"...), for messages. Static. */
const char *fake_s3_call_name(enum fake_s3_call call);

/* ------------------------------------------------- the bucket, directly */

/*
 * Another client puts KEY with LEN bytes of DATA and META (NULL: only
 * the default content type), replacing any object there: not logged, not
 * counted, never held or failed. ETAG_OUT (S3_ETAG_MAX bytes, may be
 * NULL) gets the new ETag, the quoted MD5 of DATA. 0 or ENOMEM.
 */
int fake_s3_put(struct s3_client *s3, const char *key, const void *data,
                size_t len, const struct s3_put_meta *meta, char *etag_out);

/* Another client deletes KEY (not logged). Whether it was there. */
bool fake_s3_delete(struct s3_client *s3, const char *key);

/*
 * A copy of object KEY: *DATA (malloc'd, the caller frees it; never NULL
 * on success, even for an empty object) of *LEN bytes, and its headers in
 * *INFO (may be NULL) as HEAD gives them. Not logged. 0, ENOENT, ENOMEM.
 */
int fake_s3_get(struct s3_client *s3, const char *key, void **data,
                size_t *len, struct s3_object_info *info);

/* Whether object KEY exists with exactly the LEN bytes of DATA. */
bool fake_s3_holds(struct s3_client *s3, const char *key, const void *data,
                   size_t len);

/*
 * The keys under PREFIX (NULL: all), in order: *KEYS is a malloc'd array
 * of *COUNT malloc'd strings; free it with fake_s3_keys_free(). 0 or
 * ENOMEM.
 */
int fake_s3_keys(struct s3_client *s3, const char *prefix, char ***keys,
                 size_t *count);
void fake_s3_keys_free(char **keys, size_t count);

/* Multipart uploads of KEY (NULL: of any key) created and neither
 * completed nor aborted. */
unsigned fake_s3_uploads(struct s3_client *s3, const char *key);

/* The quoted ETag S3 gives a single PUT of LEN bytes of DATA (hex MD5),
 * into OUT (S3_ETAG_MAX bytes). */
void fake_s3_etag_of(const void *data, size_t len, char *out);

/* The quoted ETag S3 gives a multipart upload of the LEN bytes of DATA
 * sent in parts of PART_SIZE bytes (the last one shorter):
 * "hex(MD5(the parts' binary MD5s))-N", into OUT (S3_ETAG_MAX bytes). */
void fake_s3_multipart_etag_of(const void *data, size_t len,
                               uint64_t part_size, char *out);

/* ---------------------------------------------------------- snapshots */

/*
 * The objects of the bucket as they are now (keys, bytes, ETags, headers,
 * times; not multipart uploads under way), taken and later put back:
 * what a crash test restores the bucket to, as the moment of a kill -9
 * left it. The snapshot belongs to the client S3 and must be freed with
 * it (before s3_client_destroy()). 0 or ENOMEM.
 */
struct fake_s3_snapshot;
int fake_s3_snapshot_take(struct s3_client *s3, struct fake_s3_snapshot **out);
int fake_s3_snapshot_restore(struct s3_client *s3,
                             const struct fake_s3_snapshot *snap);
void fake_s3_snapshot_free(struct s3_client *s3, struct fake_s3_snapshot **snap);

/* ------------------------------------------------------------ holding */

/*
 * From now on, requests that MATCH wait, in their caller's thread, until
 * they are released. *RULE gets the rule's id (> 0), for the calls below.
 * 0 or ENOMEM.
 */
int fake_s3_hold(struct s3_client *s3, const struct fake_s3_match *match,
                 unsigned *rule);

/* Requests RULE (0: any rule) holds now. */
unsigned fake_s3_held(struct s3_client *s3, unsigned rule);

/* Wait until RULE (0: any rule) holds at least COUNT requests. 0 or
 * ETIMEDOUT (after FAKE_S3_WAIT_SECONDS). */
int fake_s3_wait_held(struct s3_client *s3, unsigned rule, unsigned count);

/*
 * Let one request RULE (0: any rule) holds go on: the one that arrived
 * first, or with NEWEST the one that arrived last. The rule stays: later
 * requests are held again. *SEQ (may be NULL) gets the request's seq in
 * the log. 0, or ENOENT when RULE holds none.
 */
int fake_s3_release(struct s3_client *s3, unsigned rule, bool newest,
                    uint64_t *seq);

/* Let every request RULE (0: any rule) holds go on; the rule stays. */
void fake_s3_release_all(struct s3_client *s3, unsigned rule);

/* Remove hold rule RULE (0: every one), releasing what it holds. */
void fake_s3_hold_clear(struct s3_client *s3, unsigned rule);

/* ------------------------------------------------------------ failing */

/*
 * The next COUNT requests that MATCH (FAKE_S3_ALWAYS: all of them, until
 * cleared) fail with ERR. Without LOST they fail before acting: nothing
 * changes in the bucket. With LOST the answer is lost: the request acts
 * (the object is written, deleted, the part stored...) and then ERR is
 * returned, as when the connection breaks after the server did the work;
 * a GET delivers half of its range first, then fails; a complete then
 * does what s3.h says the client does (one HEAD decides: the object of
 * these parts is taken as done). When several rules match, the oldest
 * that has requests left applies. *RULE (may be NULL) gets the rule's
 * id. 0 or ENOMEM.
 */
int fake_s3_fail(struct s3_client *s3, const struct fake_s3_match *match,
                 unsigned count, int err, bool lost, unsigned *rule);

/* Remove failure rule RULE (0: every one). */
void fake_s3_fail_clear(struct s3_client *s3, unsigned rule);

/* ---------------------------------------------------------------- log */

/* Requests logged so far. */
size_t fake_s3_log_count(struct s3_client *s3);

/* A copy of entry INDEX (0-based, arrival order) into *OUT; see struct
 * fake_s3_request for how long its strings stay valid. 0 or ENOENT. */
int fake_s3_log_get(struct s3_client *s3, size_t index,
                    struct fake_s3_request *out);

/* The index of the first request at or after FROM that matches MATCH,
 * or -1. */
long fake_s3_log_find(struct s3_client *s3, size_t from,
                      const struct fake_s3_match *match);

/* How many logged requests match MATCH (NULL: all). */
unsigned fake_s3_count(struct s3_client *s3, const struct fake_s3_match *match);

/* Wait until at least COUNT logged requests match MATCH. 0 or
 * ETIMEDOUT. */
int fake_s3_wait_count(struct s3_client *s3, const struct fake_s3_match *match,
                       unsigned count);

/* Wait until no request is under way (a held one is: release it first).
 * 0 or ETIMEDOUT. */
int fake_s3_wait_idle(struct s3_client *s3);

/* Forget the log (the counters of s3_client_stats() stay). No request
 * may be under way. */
void fake_s3_log_clear(struct s3_client *s3);

#endif /* S3CFS_FAKE_S3_H */
