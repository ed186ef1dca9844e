/*
 * s3_internal.h - what the two files of the S3 client share, and nothing
 * else includes: s3_client.c (the client: its connections, signing,
 * sending a request with retries within its deadline, reading the
 * answer's headers) and s3.c (each S3 call of s3.h, built as a struct
 * s3_request and sent with s3_client_perform()).
 */
#ifndef S3CFS_S3_INTERNAL_H
#define S3CFS_S3_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "creds/credentials.h"
#include "s3/endpoint.h"
#include "s3/s3.h"

/*
 * Deadlines. A request ends within its deadline, every attempt, retry and
 * pause between them included (the waits for a free connection are not:
 * the requests holding them have deadlines of their own); past it, it
 * fails with ETIMEDOUT, or the error of its last attempt. Curl's
 * low-speed check alone let a server that trickles its answer just above
 * LOW_SPEED_LIMIT hold a FUSE thread (and the drain at unmount) for as
 * long as it liked. The deadline is
 *
 *     request_timeout                     (S3_REQUEST_TIMEOUT_DEFAULT, 30 s)
 *   + bytes on the wire / DEADLINE_WIRE_RATE         (GET ranges, PUT and
 *                                          part bodies; a LIST page counts
 *                                          as DEADLINE_LIST_BYTES)
 *   + bytes the server copies or joins / DEADLINE_SERVER_RATE  (CopyObject,
 *                                          UploadPartCopy, complete)
 *
 * So with the defaults: a HEAD, DELETE or small PUT 30 s, a 1 MiB block
 * 46 s, an 8 MiB read-ahead GET or part 158 s, a 16 MiB PUT 286 s, a 512
 * MiB part copy 62 s, a CopyObject (its size unknown here: counted as the
 * 5 GiB it can be) 350 s, completing a 1 GiB upload 94 s. The rates are
 * floors, far below what a working link or server does, so that only a
 * stuck or trickling transfer meets them: 64 KiB/s is 16 connections
 * sharing 8 Mbit/s.
 */
#define DEADLINE_WIRE_RATE (64u << 10)          /* bytes/s */
#define DEADLINE_SERVER_RATE (16u << 20)        /* bytes/s */
#define DEADLINE_LIST_BYTES (256u << 10)
#define DEADLINE_COPY_UNKNOWN (5ull << 30)

struct s3_client {
    char *bucket;
    char *region;
    struct credentials *creds;    /* NULL: unsigned requests (no_sign) */
    bool owns_creds;              /* made from s3_conf's static keys */
    char *ca_bundle;
    struct endpoint endpoint; /* base URL, Host header, path prefix */
    unsigned max_retries;
    uint64_t deadline_base_ms;
    uint32_t wire_rate;           /* bytes/s: DEADLINE_WIRE_RATE, or the
                                     conf's higher floor */

    CURLSH *share;
    pthread_mutex_t share_lock;

    struct {
        pthread_mutex_t lock;
        pthread_cond_t handle_free;
        CURL **idle;
        unsigned idle_count;
        unsigned created;
        unsigned max;
    } pool;

    _Atomic uint64_t requests[S3_OP_COUNT];
    struct {
        _Atomic uint64_t counts[S3_LATENCY_BUCKETS + 1];
        _Atomic uint64_t sum_us;
    } latency[S3_OP_COUNT];
    _Atomic uint64_t bytes_received;
    _Atomic uint64_t bytes_sent;
    _Atomic uint64_t retries;
    _Atomic uint64_t failures;
};

/* A growable buffer with a hard cap (anything bigger fails the transfer). */
struct s3_buf {
    char *data;
    size_t len;
    size_t cap;
};

struct s3_request {
    enum s3_op op;
    const char *method;
    const char *key;              /* NULL: the bucket itself */
    const char *query;            /* encoded and sorted, or NULL */
    const char *extra_headers[12];/* "name: value", signed when x-amz-* or
                                     content-*; NULL-terminated */
    bool has_range;               /* send Range: bytes=range_offset-... */
    uint64_t range_offset;
    uint64_t range_length;
    char range[64];               /* formatted for the current attempt */
    bool idempotent;
    bool quiet;                   /* the caller reports failures itself */
    uint64_t wire_bytes;          /* for the deadline: bytes to transfer */
    uint64_t server_bytes;        /* ... and bytes the server copies */
    bool may_have_run;            /* an attempt the server may have carried
                                     out failed (its answer lost) */
    /* checks a 2xx answer and parses its XML (req->xml) into parse_out: 0,
     * EPROTO (cut short, garbled, no ETag: retried), EIO with
     * req->s3_code (an <Error> in the body), or another errno; leaves
     * nothing to free on failure */
    int (*parse)(struct s3_request *req);
    void *parse_out;

    /* request body: at most one of these */
    const struct s3_body *body;   /* streamed upload */
    const char *post_data;        /* small POST body (XML) */
    size_t post_len;

    /* response sinks */
    const struct s3_sink *sink;   /* streamed object data of a GET */
    const char *if_match;         /* the ETag the answer must carry */
    uint64_t delivered;           /* bytes the sink accepted, all attempts */
    int sink_err;                 /* why the sink refused data */
    bool answer_checked;          /* this attempt's headers were checked */
    bool range_seen;              /* this attempt's Content-Range ... */
    uint64_t range_first, range_last, range_total;
    char answer_etag[S3_ETAG_MAX];/* ... and ETag */
    void *recv_buf;               /* object data of a GET */
    size_t recv_cap;
    size_t recv_len;
    struct s3_buf *xml;       /* XML answer (list, multipart, copy) */
    struct s3_buf error_body; /* error document, always capped */
    struct s3_object_info *info;  /* headers, may be NULL */
    uint64_t body_pos;            /* upload progress */

    long status;                  /* final HTTP status */
    char s3_code[64];             /* <Code> of the error body */
};

/* Free BUF's data (it stays usable, empty). */
void s3_buf_free(struct s3_buf *buf);

/* Append LEN bytes of DATA to BUF; false when its cap would be exceeded
 * or memory ran out. */
bool s3_buf_append(struct s3_buf *buf, const char *data, size_t len);

/*
 * Run REQ to completion within its deadline, with CLIENT's connections,
 * signed, retrying what is safe to retry: returns 0 when the server
 * answered 2xx (and REQ's parse accepted the body), else the errno
 * (ETIMEDOUT past the deadline); FAILURE (may be NULL) receives the
 * description of the last error.
 */
int s3_client_perform(struct s3_client *client, struct s3_request *req,
                      struct s3_failure *failure);

#endif /* S3CFS_S3_INTERNAL_H */
