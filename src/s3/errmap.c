/*
 * errmap.c - HTTP status / S3 error code / CURLcode -> errno (see errmap.h).
 *
 * S3 error codes are more precise than statuses, so the code table is
 * consulted first; the status table catches servers that send no XML body
 * (HEAD responses, HTML error pages). Pure functions, no state.
 */
#include "config.h"

#include "s3/errmap.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

struct code_row {
    const char *s3_code;
    int err;
    bool retry;
    const char *phrase;
};

static const struct code_row code_table[] = {
    {"NoSuchKey", ENOENT, false, "no such key"},
    {"NoSuchBucket", ENOENT, false, "bucket does not exist"},
    {"NoSuchUpload", ENOENT, false, "multipart upload does not exist"},
    {"AccessDenied", EACCES, false, "access denied"},
    {"AllAccessDisabled", EACCES, false, "access to the bucket is disabled"},
    {"InvalidAccessKeyId", EACCES, false,
     "the access key is not known to the server: check the credentials"},
    {"SignatureDoesNotMatch", EACCES, false,
     "the request signature was rejected: check the secret key and region"},
    {"ExpiredToken", EACCES, false, "the session token has expired"},
    {"InvalidToken", EACCES, false, "the session token is invalid"},
    {"RequestTimeTooSkewed", EACCES, false,
     "the clock of this machine is too far from the server's"},
    {"AuthorizationHeaderMalformed", EINVAL, false,
     "the server rejected the authorization header: check the region"},
    {"PermanentRedirect", EINVAL, false,
     "the bucket is in another region or needs another endpoint"},
    {"TemporaryRedirect", EINVAL, false,
     "the bucket is being redirected: check the region and endpoint"},
    {"InvalidBucketName", EINVAL, false, "invalid bucket name"},
    {"InvalidRange", EINVAL, false, "invalid range"},
    {"InvalidArgument", EINVAL, false, "invalid argument"},
    {"InvalidRequest", EINVAL, false, "invalid request"},
    {"KeyTooLongError", ENAMETOOLONG, false, "key too long"},
    {"EntityTooLarge", EFBIG, false, "object too large"},
    {"EntityTooSmall", EINVAL, false, "multipart part too small"},
    {"InvalidPart", EINVAL, false, "invalid multipart part"},
    {"InvalidPartOrder", EINVAL, false, "multipart parts out of order"},
    {"BadDigest", EIO, false, "the payload checksum did not match"},
    {"InvalidDigest", EIO, false, "invalid payload checksum"},
    {"PreconditionFailed", ESTALE, false,
     "the object changed (precondition failed)"},
    {"QuotaExceeded", EDQUOT, false, "quota exceeded"},
    {"NotImplemented", ENOSYS, false, "not implemented by the server"},
    {"MethodNotAllowed", ENOSYS, false, "method not allowed by the server"},
    {"SlowDown", EAGAIN, true, "the server asked to slow down"},
    {"ServiceUnavailable", EAGAIN, true, "the service is unavailable"},
    {"InternalError", EIO, true, "the server had an internal error"},
    {"RequestTimeout", ETIMEDOUT, true, "the server timed out the request"},
};

struct status_row {
    long status;
    int err;
    bool retry;
    const char *phrase;
};

static const struct status_row status_table[] = {
    {301, EINVAL, false, "moved: check the region and endpoint"},
    {307, EINVAL, false, "redirected: check the region and endpoint"},
    {400, EINVAL, false, "bad request"},
    {401, EACCES, false, "unauthorized"},
    {403, EACCES, false, "access denied"},
    {404, ENOENT, false, "not found"},
    {405, ENOSYS, false, "method not allowed by the server"},
    {409, EBUSY, false, "conflict"},
    {411, EINVAL, false, "length required"},
    {412, ESTALE, false, "the object changed (precondition failed)"},
    {416, EINVAL, false, "range not satisfiable"},
    {429, EAGAIN, true, "too many requests"},
    {500, EIO, true, "internal server error"},
    {501, ENOSYS, false, "not implemented by the server"},
    {502, EIO, true, "bad gateway"},
    {503, EAGAIN, true, "service unavailable"},
    {504, ETIMEDOUT, true, "gateway timeout"},
};

struct curl_row {
    int code;
    int err;
    bool retry;
    bool may_have_run;
    const char *phrase;
};

static const struct curl_row curl_table[] = {
    {CURLE_COULDNT_RESOLVE_HOST, EHOSTUNREACH, true, false,
     "cannot resolve the endpoint's host name"},
    {CURLE_COULDNT_RESOLVE_PROXY, EHOSTUNREACH, true, false,
     "cannot resolve the proxy's host name"},
    {CURLE_COULDNT_CONNECT, ECONNREFUSED, true, false,
     "cannot connect to the endpoint"},
    {CURLE_OPERATION_TIMEDOUT, ETIMEDOUT, true, true,
     "the request timed out (its deadline passed, or no progress for 30 s)"},
    {CURLE_SEND_ERROR, ECONNRESET, true, true,
     "the connection failed while sending"},
    {CURLE_RECV_ERROR, ECONNRESET, true, true,
     "the connection failed while receiving"},
    {CURLE_GOT_NOTHING, ECONNRESET, true, true,
     "the server closed the connection without answering"},
    {CURLE_PARTIAL_FILE, EIO, true, true, "the response was cut short"},
    {CURLE_WEIRD_SERVER_REPLY, EIO, true, true,
     "the server's answer is not valid HTTP"},
    /* a request resent on a fresh connection (the kept-alive one had been
     * closed by the server) whose body could not be read again */
    {CURLE_SEND_FAIL_REWIND, EIO, true, true,
     "the request had to be sent again and its body could not be rewound"},
    {CURLE_SSL_CONNECT_ERROR, ECONNREFUSED, true, false,
     "the TLS handshake failed"},
    {CURLE_PEER_FAILED_VERIFICATION, EACCES, false, false,
     "the server's TLS certificate could not be verified"},
    {CURLE_SSL_CACERT_BADFILE, EINVAL, false, false,
     "cannot read the CA bundle"},
    {CURLE_URL_MALFORMAT, EINVAL, false, false, "malformed endpoint URL"},
    {CURLE_UNSUPPORTED_PROTOCOL, EINVAL, false, false,
     "unsupported endpoint URL scheme"},
    {CURLE_OUT_OF_MEMORY, ENOMEM, false, false, "out of memory"},
    {CURLE_WRITE_ERROR, EIO, false, true,
     "the response did not fit the expected size"},
    {CURLE_READ_ERROR, EIO, false, false, "cannot read the data to send"},
    {CURLE_ABORTED_BY_CALLBACK, ECANCELED, false, true,
     "the request was cancelled"},
};

static const struct code_row *find_code(const char *s3_code)
{
    if (s3_code == NULL || s3_code[0] == '\0')
        return NULL;
    for (size_t i = 0; i < sizeof(code_table) / sizeof(code_table[0]); i++)
        if (strcmp(code_table[i].s3_code, s3_code) == 0)
            return &code_table[i];
    return NULL;
}

static const struct status_row *find_status(long status)
{
    for (size_t i = 0; i < sizeof(status_table) / sizeof(status_table[0]); i++)
        if (status_table[i].status == status)
            return &status_table[i];
    return NULL;
}

static const struct curl_row *find_curl(int code)
{
    for (size_t i = 0; i < sizeof(curl_table) / sizeof(curl_table[0]); i++)
        if (curl_table[i].code == code)
            return &curl_table[i];
    return NULL;
}

int errmap_errno(const struct errmap_result *result)
{
    if (result->curl_code != CURLE_OK) {
        const struct curl_row *row = find_curl(result->curl_code);
        return row != NULL ? row->err : EIO;
    }
    if (result->http_status >= 200 && result->http_status < 300 &&
        !result->error_in_body)
        return 0;
    const struct code_row *code = find_code(result->s3_code);
    if (code != NULL)
        return code->err;
    if (result->error_in_body)
        return EIO;
    const struct status_row *status = find_status(result->http_status);
    if (status != NULL)
        return status->err;
    return result->http_status >= 500 ? EIO : EINVAL;
}

bool errmap_retryable(const struct errmap_result *result,
                      bool *sent_request_may_have_run)
{
    *sent_request_may_have_run = false;
    if (result->curl_code != CURLE_OK) {
        const struct curl_row *row = find_curl(result->curl_code);
        if (row == NULL) {
            *sent_request_may_have_run = true;
            return false;
        }
        *sent_request_may_have_run = row->may_have_run;
        return row->retry;
    }
    if (result->http_status >= 200 && result->http_status < 300 &&
        !result->error_in_body)
        return false;
    /* The server answered: a throttled request was not carried out, an
     * internal error may have been. After a 200 it may have been, always. */
    const struct code_row *code = find_code(result->s3_code);
    if (code != NULL) {
        *sent_request_may_have_run = code->err != EAGAIN ||
                                     result->error_in_body;
        return code->retry;
    }
    if (result->error_in_body) {
        *sent_request_may_have_run = true;
        return false;
    }
    const struct status_row *status = find_status(result->http_status);
    if (status != NULL) {
        *sent_request_may_have_run = status->err != EAGAIN;
        return status->retry;
    }
    *sent_request_may_have_run = true;
    return result->http_status >= 500;
}

const char *errmap_describe(const struct errmap_result *result, char *buf,
                            unsigned len)
{
    if (result->curl_code != CURLE_OK) {
        const struct curl_row *row = find_curl(result->curl_code);
        snprintf(buf, len, "%s (%s)",
                 row != NULL ? row->phrase : "transfer failed",
                 curl_easy_strerror((CURLcode)result->curl_code));
        return buf;
    }
    const struct code_row *code = find_code(result->s3_code);
    const struct status_row *status = find_status(result->http_status);
    const char *phrase = code != NULL ? code->phrase
                         : status != NULL ? status->phrase
                                          : "unexpected response";
    if (result->error_in_body)
        snprintf(buf, len, "%s (an error in the body of an HTTP %ld answer: "
                 "%s)", code != NULL ? code->phrase : "unexpected error",
                 result->http_status,
                 result->s3_code != NULL && result->s3_code[0] != '\0'
                     ? result->s3_code : "no code");
    else if (result->s3_code != NULL && result->s3_code[0] != '\0')
        snprintf(buf, len, "%s (HTTP %ld %s)", phrase, result->http_status,
                 result->s3_code);
    else
        snprintf(buf, len, "%s (HTTP %ld)", phrase, result->http_status);
    return buf;
}
