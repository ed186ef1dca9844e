/*
 * test_errmap.c - unit tests for errmap.c: (CURLcode, HTTP status, S3 error
 * code) -> errno, retryability and "may the server have run it", plus the
 * one-sentence descriptions and their truncation into small buffers.
 *
 * The main table has one named row per outcome; every row is checked
 * against errmap_errno() and errmap_retryable() alike.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "s3/errmap.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------ the main table */

struct map_case {
    const char *name;
    int curl_code;
    long status;
    const char *s3_code;
    int err;            /* expected errno */
    bool retry;         /* expected errmap_retryable() */
    bool may_have_run;  /* expected *sent_request_may_have_run */
};

#define HTTP(n, st, code, e, r, m) {n, CURLE_OK, st, code, e, r, m}
#define CURL(n, cc, e, r, m) {n, cc, 0, NULL, e, r, m}

static const struct map_case map_cases[] = {
    /* success */
    HTTP("200 OK", 200, NULL, 0, false, false),
    HTTP("204 No Content", 204, NULL, 0, false, false),
    HTTP("206 Partial Content", 206, NULL, 0, false, false),
    HTTP("200 with a stray code", 200, "InternalError", 0, false, false),

    /* not found */
    HTTP("404 NoSuchKey", 404, "NoSuchKey", ENOENT, false, true),
    HTTP("404 without a body", 404, NULL, ENOENT, false, true),
    HTTP("404 with an empty code", 404, "", ENOENT, false, true),
    HTTP("404 NoSuchBucket", 404, "NoSuchBucket", ENOENT, false, true),
    HTTP("404 NoSuchUpload", 404, "NoSuchUpload", ENOENT, false, true),
    HTTP("404 with an unknown code", 404, "SomethingNew", ENOENT, false, true),

    /* credentials and permissions */
    HTTP("403 AccessDenied", 403, "AccessDenied", EACCES, false, true),
    HTTP("403 SignatureDoesNotMatch", 403, "SignatureDoesNotMatch", EACCES,
         false, true),
    HTTP("403 InvalidAccessKeyId", 403, "InvalidAccessKeyId", EACCES, false,
         true),
    HTTP("400 ExpiredToken", 400, "ExpiredToken", EACCES, false, true),
    HTTP("403 RequestTimeTooSkewed", 403, "RequestTimeTooSkewed", EACCES,
         false, true),
    HTTP("403 without a body", 403, NULL, EACCES, false, true),
    HTTP("401 without a body", 401, NULL, EACCES, false, true),

    /* the S3 code beats the status */
    HTTP("400 AuthorizationHeaderMalformed", 400,
         "AuthorizationHeaderMalformed", EINVAL, false, true),
    HTTP("400 KeyTooLongError", 400, "KeyTooLongError", ENAMETOOLONG, false,
         true),
    HTTP("400 EntityTooLarge", 400, "EntityTooLarge", EFBIG, false, true),
    HTTP("400 BadDigest", 400, "BadDigest", EIO, false, true),
    HTTP("403 QuotaExceeded", 403, "QuotaExceeded", EDQUOT, false, true),
    HTTP("501 NotImplemented", 501, "NotImplemented", ENOSYS, false, true),
    HTTP("400 RequestTimeout retries", 400, "RequestTimeout", ETIMEDOUT, true,
         true),
    HTTP("400 InvalidRange", 400, "InvalidRange", EINVAL, false, true),

    /* conditions and ranges */
    HTTP("412 without a body", 412, NULL, ESTALE, false, true),
    HTTP("412 PreconditionFailed", 412, "PreconditionFailed", ESTALE, false,
         true),
    HTTP("416 without a body", 416, NULL, EINVAL, false, true),
    HTTP("409 conflict", 409, NULL, EBUSY, false, true),
    HTTP("405 method not allowed", 405, NULL, ENOSYS, false, true),

    /* throttling: the server did not act on the request */
    HTTP("503 SlowDown", 503, "SlowDown", EAGAIN, true, false),
    HTTP("503 without a body", 503, NULL, EAGAIN, true, false),
    HTTP("503 ServiceUnavailable", 503, "ServiceUnavailable", EAGAIN, true,
         false),
    HTTP("429 without a body", 429, NULL, EAGAIN, true, false),

    /* server errors: it may have acted */
    HTTP("500 InternalError", 500, "InternalError", EIO, true, true),
    HTTP("500 without a body", 500, NULL, EIO, true, true),
    HTTP("502 bad gateway", 502, NULL, EIO, true, true),
    HTTP("504 gateway timeout", 504, NULL, ETIMEDOUT, true, true),
    HTTP("501 without a body", 501, NULL, ENOSYS, false, true),

    /* statuses in no table */
    HTTP("unknown 4xx (418)", 418, NULL, EINVAL, false, true),
    HTTP("unknown 4xx with unknown code", 422, "Unprocessable", EINVAL, false,
         true),
    HTTP("unknown 5xx (599)", 599, NULL, EIO, true, true),
    HTTP("unknown 5xx (507)", 507, NULL, EIO, true, true),

    /* transport failures */
    CURL("couldn't connect", CURLE_COULDNT_CONNECT, ECONNREFUSED, true, false),
    CURL("couldn't resolve host", CURLE_COULDNT_RESOLVE_HOST, EHOSTUNREACH,
         true, false),
    CURL("couldn't resolve proxy", CURLE_COULDNT_RESOLVE_PROXY, EHOSTUNREACH,
         true, false),
    CURL("timed out", CURLE_OPERATION_TIMEDOUT, ETIMEDOUT, true, true),
    CURL("send error", CURLE_SEND_ERROR, ECONNRESET, true, true),
    CURL("recv error", CURLE_RECV_ERROR, ECONNRESET, true, true),
    CURL("got nothing", CURLE_GOT_NOTHING, ECONNRESET, true, true),
    CURL("partial file", CURLE_PARTIAL_FILE, EIO, true, true),
    CURL("weird server reply", CURLE_WEIRD_SERVER_REPLY, EIO, true, true),
    /* curl resent a body on a fresh connection and could not rewind it */
    CURL("rewind failed", CURLE_SEND_FAIL_REWIND, EIO, true, true),
    CURL("TLS handshake", CURLE_SSL_CONNECT_ERROR, ECONNREFUSED, true, false),
    CURL("peer failed verification", CURLE_PEER_FAILED_VERIFICATION, EACCES,
         false, false),
    CURL("CA bundle unreadable", CURLE_SSL_CACERT_BADFILE, EINVAL, false,
         false),
    CURL("malformed URL", CURLE_URL_MALFORMAT, EINVAL, false, false),
    CURL("unsupported protocol", CURLE_UNSUPPORTED_PROTOCOL, EINVAL, false,
         false),
    CURL("out of memory", CURLE_OUT_OF_MEMORY, ENOMEM, false, false),
    CURL("write error", CURLE_WRITE_ERROR, EIO, false, true),
    CURL("read error", CURLE_READ_ERROR, EIO, false, false),
    CURL("aborted by callback", CURLE_ABORTED_BY_CALLBACK, ECANCELED, false,
         true),
    CURL("unknown curl code", CURLE_FTP_WEIRD_PASV_REPLY, EIO, false, true),
    CURL("curl code out of range", 9999, EIO, false, true),
    /* a transport failure wins over anything in status and code */
    {"curl failure with a stale status", CURLE_COULDNT_CONNECT, 200,
     "NoSuchKey", ECONNREFUSED, true, false},
};

static void test_map_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(map_cases); i++) {
        const struct map_case *c = &map_cases[i];
        struct errmap_result r = {
            .curl_code = c->curl_code,
            .http_status = c->status,
            .s3_code = c->s3_code,
        };
        int err = errmap_errno(&r);
        bool may_have_run = !c->may_have_run; /* must be overwritten */
        bool retry = errmap_retryable(&r, &may_have_run);

        if (err != c->err)
            fail_msg("%s: errno %d (%s), expected %d (%s)", c->name, err,
                     strerror(err), c->err, strerror(c->err));
        if (retry != c->retry)
            fail_msg("%s: retryable %d, expected %d", c->name, retry,
                     c->retry);
        if (may_have_run != c->may_have_run)
            fail_msg("%s: may_have_run %d, expected %d", c->name,
                     may_have_run, c->may_have_run);
    }
}

/* Client errors never retry, unless the S3 code says the server timed out
 * or throttled: the header's promise, checked over the whole 4xx range. */
static void test_4xx_never_retry(void **state)
{
    (void)state;
    for (long status = 400; status < 500; status++) {
        struct errmap_result r = {.http_status = status};
        bool may_have_run = false;
        bool retry = errmap_retryable(&r, &may_have_run);

        if (status == 429)
            continue; /* Too Many Requests is throttling */
        if (retry)
            fail_msg("HTTP %ld without a code: retryable", status);
        if (errmap_errno(&r) == 0)
            fail_msg("HTTP %ld without a code: errno 0", status);
    }
}

/* Every 5xx is an error, and retryable unless the server says it cannot
 * do this at all (501). */
static void test_5xx_errors(void **state)
{
    (void)state;
    for (long status = 500; status < 600; status++) {
        struct errmap_result r = {.http_status = status};
        bool may_have_run = false;
        bool retry = errmap_retryable(&r, &may_have_run);

        if (errmap_errno(&r) == 0)
            fail_msg("HTTP %ld: errno 0", status);
        if (retry != (status != 501))
            fail_msg("HTTP %ld: retryable %d", status, retry);
    }
}

/*
 * Redirects are errors: the client does not follow them, so S3's
 * "301 PermanentRedirect" (bucket in another region) and
 * "307 TemporaryRedirect" must not count as a completed request.
 */
static void test_redirect_is_an_error(void **state)
{
    static const struct map_case rows[] = {
        HTTP("301 PermanentRedirect", 301, "PermanentRedirect", EINVAL, false,
             true),
        HTTP("301 without a body (HEAD)", 301, NULL, EINVAL, false, true),
        HTTP("307 TemporaryRedirect", 307, "TemporaryRedirect", EINVAL, false,
             true),
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        struct errmap_result r = {
            .http_status = rows[i].status,
            .s3_code = rows[i].s3_code,
        };
        bool may_have_run = false;
        int err = errmap_errno(&r);

        if (err == 0)
            fail_msg("%s: errno 0, the request would count as done",
                     rows[i].name);
        if (errmap_retryable(&r, &may_have_run))
            fail_msg("%s: retryable", rows[i].name);
        if (rows[i].s3_code != NULL &&
            strcmp(rows[i].s3_code, "PermanentRedirect") == 0 &&
            err != EINVAL)
            fail_msg("%s: errno %d, expected EINVAL", rows[i].name, err);
    }
}

/* A 2xx answer whose body is an <Error> document (S3 does this for copies
 * and completes once it has sent 200): an error, retried as its code says,
 * and the server may have acted on it whatever the code. */
static void test_error_in_body(void **state)
{
    static const struct map_case rows[] = {
        HTTP("200 InternalError", 200, "InternalError", EIO, true, true),
        HTTP("200 SlowDown", 200, "SlowDown", EAGAIN, true, true),
        HTTP("200 AccessDenied", 200, "AccessDenied", EACCES, false, true),
        HTTP("200 NoSuchKey", 200, "NoSuchKey", ENOENT, false, true),
        HTTP("200 unknown code", 200, "SomethingNew", EIO, false, true),
        HTTP("200 no code", 200, NULL, EIO, false, true),
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        const struct map_case *c = &rows[i];
        struct errmap_result r = {
            .http_status = c->status, .s3_code = c->s3_code,
            .error_in_body = true,
        };
        bool may_have_run = false;
        bool retry = errmap_retryable(&r, &may_have_run);
        int err = errmap_errno(&r);
        char buf[256];

        if (err != c->err)
            fail_msg("%s: errno %d, expected %d", c->name, err, c->err);
        if (retry != c->retry || may_have_run != c->may_have_run)
            fail_msg("%s: retry %d may_have_run %d, expected %d %d", c->name,
                     retry, may_have_run, c->retry, c->may_have_run);
        errmap_describe(&r, buf, sizeof(buf));
        if (strstr(buf, "body") == NULL || strstr(buf, "200") == NULL ||
            (c->s3_code != NULL && strstr(buf, c->s3_code) == NULL))
            fail_msg("%s: \"%s\" does not say what came", c->name, buf);
    }
}

/* --------------------------------------------------------- describing */

struct describe_case {
    const char *name;
    int curl_code;
    long status;
    const char *s3_code;
    const char *want[3];    /* fragments that must appear */
};

static const struct describe_case describe_cases[] = {
    {"404 NoSuchKey", CURLE_OK, 404, "NoSuchKey",
     {"no such key", "404", "NoSuchKey"}},
    {"404 NoSuchBucket", CURLE_OK, 404, "NoSuchBucket",
     {"bucket does not exist", "404", "NoSuchBucket"}},
    {"403 SignatureDoesNotMatch", CURLE_OK, 403, "SignatureDoesNotMatch",
     {"signature", "403", "SignatureDoesNotMatch"}},
    {"503 SlowDown", CURLE_OK, 503, "SlowDown",
     {"slow down", "503", "SlowDown"}},
    {"unknown code keeps the code", CURLE_OK, 400, "BrandNewError",
     {"bad request", "400", "BrandNewError"}},
    {"404 without a body", CURLE_OK, 404, NULL, {"not found", "HTTP 404"}},
    {"empty code is not printed", CURLE_OK, 416, "",
     {"range not satisfiable", "HTTP 416)"}},
    {"unknown status", CURLE_OK, 418, NULL, {"unexpected response", "418"}},
    {"couldn't connect", CURLE_COULDNT_CONNECT, 0, NULL,
     {"cannot connect to the endpoint"}},
    {"peer verification", CURLE_PEER_FAILED_VERIFICATION, 0, NULL,
     {"certificate"}},
    {"unknown curl code", 9999, 0, NULL, {"transfer failed"}},
};

static void test_describe_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(describe_cases); i++) {
        const struct describe_case *c = &describe_cases[i];
        struct errmap_result r = {
            .curl_code = c->curl_code,
            .http_status = c->status,
            .s3_code = c->s3_code,
        };
        char buf[256];
        const char *out;

        memset(buf, 'X', sizeof(buf));
        out = errmap_describe(&r, buf, sizeof(buf));
        if (out != buf)
            fail_msg("%s: did not return its buffer", c->name);
        if (memchr(buf, '\0', sizeof(buf)) == NULL)
            fail_msg("%s: not terminated", c->name);
        for (size_t j = 0; j < ARRAY_LEN(c->want) && c->want[j]; j++)
            if (strstr(buf, c->want[j]) == NULL)
                fail_msg("%s: \"%s\" lacks \"%s\"", c->name, buf, c->want[j]);
        if (c->curl_code != CURLE_OK &&
            strstr(buf, curl_easy_strerror((CURLcode)c->curl_code)) == NULL)
            fail_msg("%s: \"%s\" lacks curl's own message", c->name, buf);
        if (c->s3_code != NULL && c->s3_code[0] == '\0' &&
            strstr(buf, "()") != NULL)
            fail_msg("%s: \"%s\" has an empty code", c->name, buf);
    }
}

/* Small buffers get a terminated prefix of the full sentence and nothing
 * past LEN bytes is touched. */
static void test_describe_truncates(void **state)
{
    static const struct errmap_result results[] = {
        {CURLE_OK, 403, "SignatureDoesNotMatch", false},
        {CURLE_OK, 404, NULL, false},
        {CURLE_COULDNT_RESOLVE_HOST, 0, NULL, false},
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(results); i++) {
        char full[512];

        errmap_describe(&results[i], full, sizeof(full));
        assert_true(strlen(full) > 16);
        for (unsigned len = 1; len <= 16; len++) {
            char buf[32];

            memset(buf, '#', sizeof(buf));
            assert_ptr_equal(errmap_describe(&results[i], buf, len), buf);
            assert_int_equal(strlen(buf), len - 1);
            assert_memory_equal(buf, full, len - 1);
            for (size_t k = len; k < sizeof(buf); k++)
                if (buf[k] != '#')
                    fail_msg("row %zu, len %u: byte %zu overwritten", i, len,
                             k);
        }
    }
}

/* A zero-length buffer is not written at all. */
static void test_describe_zero_length(void **state)
{
    struct errmap_result r = {CURLE_OK, 500, "InternalError", false};
    char buf[4] = {'#', '#', '#', '#'};

    (void)state;
    assert_ptr_equal(errmap_describe(&r, buf, 0), buf);
    assert_memory_equal(buf, "####", 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_table),
        cmocka_unit_test(test_4xx_never_retry),
        cmocka_unit_test(test_5xx_errors),
        cmocka_unit_test(test_redirect_is_an_error),
        cmocka_unit_test(test_error_in_body),
        cmocka_unit_test(test_describe_table),
        cmocka_unit_test(test_describe_truncates),
        cmocka_unit_test(test_describe_zero_length),
    };

    return cmocka_run_group_tests_name("errmap", tests, NULL, NULL);
}
