/*
 * s3.h - the S3 client (s3.c, s3_client.c): the only code that speaks HTTP.
 *
 * Every call is synchronous and thread-safe: many FUSE and worker threads
 * call in at once, each request borrowing one pooled keep-alive connection
 * (at most conf.max_connections at a time; callers beyond that wait).
 * Requests are signed with SigV4 (sigv4.h), XML answers parsed by s3xml.h,
 * and failures turned into errno by errmap.h. Idempotent requests are
 * retried with jittered exponential backoff on throttling, server errors,
 * timeouts and connection resets.
 *
 * Keys are passed as the raw UTF-8 object key; this module encodes them
 * and sends the path exactly as signed (dot segments and empty segments
 * included: "d/../x" is that key, never "x").
 *
 * Every request has a deadline, its retries and the pauses between them
 * included: request_timeout plus the time its bytes take at a floor rate
 * (the numbers are in one block in s3_internal.h). Past it the request
 * fails with ETIMEDOUT, so a server that trickles its answer cannot hold
 * a thread for longer.
 *
 * Functions return 0 or a positive errno: ENOENT (no such key or bucket),
 * EACCES (credentials, permissions), ESTALE (If-Match failed), EIO, ...
 * Secrets never leave the client: logs name the method, key and status.
 */
#ifndef S3CFS_S3_H
#define S3CFS_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "s3/s3xml.h"

/* Longest ETag we keep (quotes included); S3's are 34 or ~40 bytes. */
#define S3_ETAG_MAX 128

/* The base deadline of a request, in seconds, unless conf.request_timeout
 * says otherwise (see s3.c for what is added to it). */
#define S3_REQUEST_TIMEOUT_DEFAULT 30.0

struct s3_conf {
    const char *endpoint;       /* "http://127.0.0.1:9000"; NULL: AWS */
    const char *region;         /* signing region, e.g. "us-east-1" */
    const char *bucket;
    bool path_style;            /* forced on for custom endpoints */
    struct credentials *credentials; /* the keys to sign with, borrowed:
                                   must outlive the client; NULL: the three
                                   below, as keys that never change */
    const char *access_key;     /* NULL (and no credentials): unsigned
                                   requests (no_sign) */
    const char *secret_key;
    const char *session_token;  /* may be NULL */
    const char *ca_bundle;      /* PEM file; NULL: the system's */
    unsigned max_connections;   /* parallel requests, >= 1 */
    unsigned max_retries;       /* retries after the first attempt */
    double request_timeout;     /* seconds, the base deadline of every
                                   request; 0: S3_REQUEST_TIMEOUT_DEFAULT */
    uint32_t min_wire_rate;     /* bytes/s below which a transfer is too
                                   slow (added to the deadline); 0 or
                                   less than the default: the default */
};

/* Request types, for the counters. */
enum s3_op {
    S3_OP_GET,
    S3_OP_HEAD,
    S3_OP_LIST,
    S3_OP_PUT,
    S3_OP_DELETE,
    S3_OP_COPY,
    S3_OP_MULTIPART,   /* create, upload part, copy part, complete (an
                          abort is an S3_OP_DELETE: priced as one) */
    S3_OP_COUNT,
};

/*
 * How long requests took, one histogram per kind: each attempt (retries
 * are attempts of their own) from its start (connection setup, if any,
 * included) to the end of its answer, body included, or its failure; the
 * wait for a pooled connection and the pauses between retries left out.
 * Bucket I holds the attempts that took at most s3_latency_bound(I)
 * seconds and more than the bound before it; the last bucket
 * (S3_LATENCY_BUCKETS) holds the rest. Not cumulative.
 */
#define S3_LATENCY_BUCKETS 14

static inline double s3_latency_bound(unsigned i)
{
    static const double bounds[S3_LATENCY_BUCKETS] = {
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
        0.25, 0.5, 1, 2.5, 5, 10, 30,
    };
    return bounds[i];
}

struct s3_latency {
    uint64_t counts[S3_LATENCY_BUCKETS + 1];
    uint64_t sum_us;                /* of every attempt, microseconds */
};

/* Counters since the client was created; read with s3_client_stats(). */
struct s3_stats {
    uint64_t requests[S3_OP_COUNT]; /* attempts sent, retries included */
    struct s3_latency latency[S3_OP_COUNT];
    uint64_t bytes_received;        /* object data received (GET bodies) */
    uint64_t bytes_sent;            /* object data sent (PUT bodies) */
    uint64_t retries;
    uint64_t failures;              /* requests that failed for good (a
                                       missing key is an answer, not one) */
};

/* What HEAD or GET tells about an object. */
struct s3_object_info {
    uint64_t size;                  /* whole object size */
    char etag[S3_ETAG_MAX];         /* quotes included */
    struct timespec last_modified;
    char content_type[128];
    /* s3fs-compatible metadata (x-amz-meta-*); has_* false if absent or
     * unparsable. mode includes the file type bits (S_IFLNK, S_IFDIR). */
    bool has_mode, has_uid, has_gid, has_mtime;
    uint32_t mode;
    uint32_t uid, gid;
    struct timespec mtime;
    bool has_atime, has_ctime;      /* x-amz-meta-atime/ctime (s3fs) */
    struct timespec atime, ctime;
    bool has_rdev;                  /* x-amz-meta-rdev: a device number */
    uint32_t rdev;
};

/* Data to upload: LENGTH bytes from memory (DATA) or from FD at OFFSET. */
struct s3_body {
    const void *data;
    int fd;                         /* used when data is NULL */
    uint64_t offset;
    uint64_t length;
};

/* Metadata written with an object (s3fs conventions). */
struct s3_put_meta {
    const char *content_type;       /* NULL: application/octet-stream */
    bool has_mode, has_uid, has_gid, has_mtime;
    uint32_t mode, uid, gid;
    struct timespec mtime;
    bool has_atime, has_ctime, has_rdev;
    struct timespec atime, ctime;
    uint32_t rdev;
    bool if_none_match;             /* PUT only if the key is free
                                       (If-None-Match: *): ESTALE when it
                                       is taken; servers without
                                       conditional writes ignore it. Not
                                       logged: failures are the caller's
                                       to report */
    const char *if_match;           /* PUT only over the object of this
                                       ETag (If-Match; NULL: none): ESTALE
                                       when it has another, ENOENT (or
                                       ESTALE, by server) when there is
                                       none, EBUSY when another
                                       conditional write of it is under
                                       way; also ESTALE when a retry finds
                                       the first attempt's write. Servers
                                       may ignore it (s3rver) or refuse it
                                       (Swift: ENOSYS). Not logged, as
                                       if_none_match */
};

/* Why a request failed, for messages to the user (no secrets inside). */
struct s3_failure {
    int err;                        /* errno */
    bool server_answered;           /* false: transport (connect, TLS...) */
    char description[256];          /* from errmap_describe() */
};

struct s3_client;

/*
 * Create a client. Copies everything it needs from CONF (the caller may
 * free CONF's strings afterwards). Returns 0, EINVAL (bad endpoint URL,
 * with a sentence in ERRBUF) or ENOMEM. Call curl_global_init() before,
 * while the process is single-threaded.
 */
int s3_client_create(const struct s3_conf *conf, struct s3_client **out,
                     char *errbuf, size_t errlen);

/* Free the client and its connections; *client becomes NULL. Safe twice. */
void s3_client_destroy(struct s3_client **client);

/* A snapshot of the counters. */
void s3_client_stats(struct s3_client *client, struct s3_stats *out);

/*
 * One ListObjectsV2 request with max-keys=1 on PREFIX: proves the endpoint
 * answers, the credentials are accepted and the bucket exists. On failure
 * returns the errno and fills *why.
 */
int s3_check_bucket(struct s3_client *client, const char *prefix,
                    struct s3_failure *why);

/* HEAD KEY into *info. ENOENT if there is no such object. */
int s3_head_object(struct s3_client *client, const char *key,
                   struct s3_object_info *info);

/*
 * GET LENGTH bytes of KEY from OFFSET into BUF (LENGTH > 0). *received gets
 * the number of bytes stored: less than LENGTH only when the object ends
 * first. IF_MATCH, when not NULL, is the ETag the object must still have
 * (ESTALE otherwise). INFO, when not NULL, receives the object's headers.
 * Ranges past the end give EINVAL.
 */
int s3_get_object_range(struct s3_client *client, const char *key,
                        uint64_t offset, size_t length, const char *if_match,
                        void *buf, size_t *received,
                        struct s3_object_info *info);

/* Where the data of a streamed GET goes, in order. WRITE returns 0, or an
 * errno that ends the request (and is returned by it). */
struct s3_sink {
    int (*write)(void *arg, const void *data, size_t len);
    void *arg;
};

/*
 * GET LENGTH bytes of KEY from OFFSET into SINK, with If-Match IF_MATCH
 * when not NULL (ESTALE if the object changed). A retry resumes where the
 * data stopped, so SINK sees every byte exactly once, in order.
 * *delivered (may be NULL) gets how many bytes SINK accepted, also on
 * failure. No buffer of the object's size is ever held. INFO, when not
 * NULL, receives the object's headers (those of the last answer, after a
 * retry; its size is the whole object's).
 */
int s3_get_object_stream(struct s3_client *client, const char *key,
                         uint64_t offset, uint64_t length, const char *if_match,
                         const struct s3_sink *sink, uint64_t *delivered,
                         struct s3_object_info *info);

/*
 * One ListObjectsV2 page: keys under PREFIX, grouped by DELIMITER (NULL for
 * none), at most MAX_KEYS (1..1000), continuing from CONTINUATION_TOKEN
 * (NULL for the first page) or else after START_AFTER (may be NULL).
 * Fills *out (free with s3xml_listing_free()). A truncated page whose next
 * token is CONTINUATION_TOKEN again (a listing that would never end) is
 * EIO, with one log line; s3walk_next() (s3walk.h) guards whole walks.
 */
int s3_list_objects(struct s3_client *client, const char *prefix,
                    const char *delimiter, const char *continuation_token,
                    const char *start_after, unsigned max_keys,
                    struct s3xml_listing *out);

/* PUT an object in one request, with Content-MD5 checked by the server.
 * ETAG_OUT (S3_ETAG_MAX bytes) may be NULL. */
int s3_put_object(struct s3_client *client, const char *key,
                  const struct s3_body *body, const struct s3_put_meta *meta,
                  char *etag_out);

/* DELETE KEY. Deleting a missing key succeeds, as in S3. */
int s3_delete_object(struct s3_client *client, const char *key);

/*
 * Server-side copy of SRC_KEY to DST_KEY (objects up to 5 GiB), only if
 * SRC_KEY still has ETag SRC_ETAG (x-amz-copy-source-if-match; NULL: any
 * version). With META the metadata is replaced, otherwise copied.
 * ETAG_OUT may be NULL. ESTALE when the condition failed (412, not
 * logged: some servers refuse the condition for sources they hold in
 * parts, and the caller tells which with a HEAD).
 */
int s3_copy_object(struct s3_client *client, const char *src_key,
                   const char *src_etag, const char *dst_key,
                   const struct s3_put_meta *meta, char *etag_out);

/* Start a multipart upload; *upload_id is malloc'd (caller frees). */
int s3_multipart_create(struct s3_client *client, const char *key,
                        const struct s3_put_meta *meta, char **upload_id);

/* Upload part PART_NUMBER (1..10000); ETAG_OUT gets the part's ETag. */
int s3_multipart_upload_part(struct s3_client *client, const char *key,
                             const char *upload_id, unsigned part_number,
                             const struct s3_body *body, char *etag_out);

/*
 * UploadPartCopy: part PART_NUMBER (1..10000) of the upload is copied
 * server-side from bytes [OFFSET, OFFSET + LENGTH) of SRC_KEY, which must
 * still have ETag SRC_ETAG (x-amz-copy-source-if-match; NULL: any).
 * ETAG_OUT (S3_ETAG_MAX bytes) gets the part's ETag. Returns 0, ENOSYS
 * when the server does not implement UploadPartCopy (501 NotImplemented),
 * ESTALE when the source changed (412; neither is logged: the caller
 * decides what they mean),
 * ENOENT, EINVAL (bad part number, empty or overflowing range), EIO
 * (including a 200 answer carrying an <Error>), or another errno.
 */
int s3_multipart_copy_part(struct s3_client *client, const char *key,
                           const char *upload_id, unsigned part_number,
                           const char *src_key, const char *src_etag,
                           uint64_t offset, uint64_t length, char *etag_out);

/* Complete with PART_COUNT parts whose ETags are PART_ETAGS[0..]: as
 * s3_multipart_complete_object() with WHOLE NULL. */
int s3_multipart_complete(struct s3_client *client, const char *key,
                          const char *upload_id, const char *const *part_etags,
                          unsigned part_count, char *etag_out);

/*
 * Complete the upload with PART_COUNT parts whose ETags are PART_ETAGS[0..]
 * into ETAG_OUT (may be NULL). WHOLE, when not NULL, is the object the
 * parts make (its length is the object's size; its bytes, in memory or in
 * an fd as for uploads, or neither: fd -1 and data NULL).
 *
 * A complete whose answer was lost (the server completed it, the
 * connection broke) is retried, and the retry fails: NoSuchUpload on AWS,
 * InternalError on s3rver. So when an attempt may have run, or the
 * answer is NoSuchUpload (curl resends by itself, unseen, a request whose
 * kept-alive connection broke before the answer began), and the request
 * fails in the end, the object is checked with one HEAD and taken
 * as this upload when it is: its size is WHOLE's length (when given), and
 * its ETag is the multipart ETag of these parts ("MD5 of the part MD5s-N",
 * as AWS and Swift make it) or, where the server gives a plain MD5 of the
 * object (s3rver), the MD5 of WHOLE's bytes (one more pass over them; not
 * possible without them). Anything else returns the complete's errno.
 */
int s3_multipart_complete_object(struct s3_client *client, const char *key,
                                 const char *upload_id,
                                 const char *const *part_etags,
                                 unsigned part_count,
                                 const struct s3_body *whole, char *etag_out);

/* Abort an upload; an upload already gone counts as success. ENOSYS
 * (405/501: the server cannot abort) is returned without a log line. */
int s3_multipart_abort(struct s3_client *client, const char *key,
                       const char *upload_id);

#endif /* S3CFS_S3_H */
