/*
 * errmap.h - the one table that turns transport and S3 failures into errno.
 *
 * The S3 client reports every failure as (curl result, HTTP status, S3
 * error code); this module decides what errno the filesystem sees, whether
 * the request is worth retrying, and how to describe it in one sentence.
 * Nothing else in s3cachefs interprets HTTP statuses or CURLcodes.
 */
#ifndef S3CFS_ERRMAP_H
#define S3CFS_ERRMAP_H

#include <stdbool.h>

/* The outcome of one HTTP exchange, as the S3 client saw it. */
struct errmap_result {
    int curl_code;          /* CURLcode; 0 (CURLE_OK) if a response came */
    long http_status;       /* 0 if no response */
    const char *s3_code;    /* <Code> of the error body, or NULL */
    bool error_in_body;     /* a 2xx answer whose body is an <Error>
                               document with S3_CODE: S3 may answer a copy
                               or a complete so once it has sent 200 */
};

/* errno for a failed exchange (0 only for 2xx with CURLE_OK and no error
 * in the body; redirects are errors: the client never follows them). An
 * error in the body takes its code's errno, EIO for a code in no table. */
int errmap_errno(const struct errmap_result *result);

/*
 * Whether a retry may succeed: throttling (503, SlowDown), server errors
 * (500, 502, 504, InternalError, RequestTimeout), timeouts, resets and
 * refused connections, a request curl had to send again but could not
 * rewind. Client errors (4xx) never retry. An error in a 2xx body is
 * retried as its code says (InternalError, SlowDown: yes), and the server
 * may have acted on the request.
 * SENT_REQUEST_MAY_HAVE_RUN is true when the server may have acted on the
 * request (response lost, timeout after sending): non-idempotent requests
 * must not be retried then.
 */
bool errmap_retryable(const struct errmap_result *result,
                      bool *sent_request_may_have_run);

/*
 * A short human phrase for the failure, e.g. "bucket does not exist
 * (NoSuchBucket)", "access denied: check the credentials (403
 * SignatureDoesNotMatch)", "cannot connect to the endpoint (Couldn't
 * connect to server)". Written into BUF (LEN bytes); returns BUF.
 */
const char *errmap_describe(const struct errmap_result *result, char *buf,
                            unsigned len);

#endif /* S3CFS_ERRMAP_H */
