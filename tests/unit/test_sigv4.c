/*
 * test_sigv4.c - unit tests of src/sigv4.c.
 *
 * Group "sigv4 vectors" runs one test per row of sigv4_vectors.h (the AWS
 * SigV4 test suite, botocore's edited cases, the S3 API Reference examples)
 * and checks the canonical request, the string to sign, the signature and
 * the Authorization value byte for byte. Group "sigv4 units" covers URI
 * encoding, query and header canonicalisation, path handling and the error
 * returns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "s3/sigv4.h"
#include "sigv4_vectors.h"

/* ------------------------------------------------------------ vectors */

static size_t vector_header_count(const struct sigv4_vector *v)
{
    size_t n = 0;

    while (n < SIGV4_VECTOR_MAX_HEADERS && v->headers[n].name != NULL)
        n++;
    return n;
}

/* Remove the space after each comma: the S3 pages print it that way. */
static void compact_commas(char *s)
{
    char *d = s;

    for (const char *p = s; *p; p++) {
        *d++ = *p;
        if (*p == ',' && p[1] == ' ')
            p++;
    }
    *d = '\0';
}

static void test_vector(void **state)
{
    const struct sigv4_vector *v = *state;
    const struct sigv4_scope *scope = &v->creds->scope;
    struct sigv4_request req;
    char body_hash[SIGV4_HEX_LEN + 1];
    char creq_hash[SIGV4_HEX_LEN + 1];
    char sig[SIGV4_HEX_LEN + 1];
    const char *want_sig, *nl;
    char *creq = NULL, *sts = NULL, *authz = NULL;

    /* The data itself: the .sts ends with the SHA-256 of the .creq. */
    sigv4_sha256_hex(v->creq, strlen(v->creq), creq_hash);
    nl = strrchr(v->sts, '\n');
    assert_non_null(nl);
    assert_string_equal(nl + 1, creq_hash);

    sigv4_sha256_hex(v->body, strlen(v->body), body_hash);
    req = (struct sigv4_request){
        .method = v->method,
        .path = v->path,
        .query = v->query,
        .headers = v->headers,
        .header_count = vector_header_count(v),
        .payload_hash = body_hash,
        .normalize_path = v->normalize_path,
    };

    assert_int_equal(sigv4_canonical_request(&req, &creq), 0);
    assert_string_equal(creq, v->creq);

    assert_int_equal(sigv4_string_to_sign(creq, scope, &sts), 0);
    assert_string_equal(sts, v->sts);

    want_sig = strstr(v->authz, "Signature=");
    assert_non_null(want_sig);
    want_sig += strlen("Signature=");
    assert_int_equal(sigv4_signature(v->creds->secret_key, scope, sts, sig),
                     0);
    assert_string_equal(sig, want_sig);

    assert_int_equal(sigv4_authorization(&req, scope, v->creds->access_key,
                                         v->creds->secret_key, &authz),
                     0);
    if (v->authz_compact)
        compact_commas(authz);
    assert_string_equal(authz, v->authz);

    free(creq);
    free(sts);
    free(authz);
}

/* -------------------------------------------------------------- units */

static const struct sigv4_header host_only[] = {
    {"Host", "examplebucket.s3.amazonaws.com"},
};

static const struct sigv4_scope s3_scope = {"20130524T000000Z", "us-east-1",
                                            "s3"};

/* Line LINE (0-based) of the canonical request of REQ, malloc'd. */
static char *creq_line(const struct sigv4_request *req, int line)
{
    char *creq = NULL, *res;
    const char *p, *end;

    assert_int_equal(sigv4_canonical_request(req, &creq), 0);
    p = creq;
    for (int i = 0; i < line; i++) {
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    end = strchr(p, '\n');
    if (end == NULL)
        end = p + strlen(p);
    res = strndup(p, (size_t)(end - p));
    assert_non_null(res);
    free(creq);
    return res;
}

static void check_encode(const char *in, size_t len, bool keep_slash,
                         const char *want)
{
    char *got = sigv4_uri_encode(in, len, keep_slash);

    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_uri_encode(void **state)
{
    static const struct {
        const char *in;
        bool keep_slash;
        const char *want;
    } cases[] = {
        {"my key.txt", true, "my%20key.txt"},
        {"a b", false, "a%20b"},
        {"a+b", true, "a%2Bb"},
        {"100%", true, "100%25"},
        {"50%25", true, "50%2525"}, /* encoded text is encoded again */
        {"a#b?c&d=e", true, "a%23b%3Fc%26d%3De"},
        {"~user_name-1.0", true, "~user_name-1.0"},
        {"!*'()$@:;,", true, "%21%2A%27%28%29%24%40%3A%3B%2C"},
        {"test$file.text", true, "test%24file.text"}, /* S3 PUT example */
        {"caf\xC3\xA9", true, "caf%C3%A9"},
        {"\xE6\x97\xA5\xE6\x9C\xAC.txt", true, "%E6%97%A5%E6%9C%AC.txt"},
        {"\xF0\x9F\x98\x80", true, "%F0%9F%98%80"},
        {"\x7f\x80\xff", true, "%7F%80%FF"},
        {"dir/sub dir/file", true, "dir/sub%20dir/file"},
        {"dir/sub dir/file", false, "dir%2Fsub%20dir%2Ffile"},
        {"/", true, "/"},
        {"/", false, "%2F"},
        {"", false, ""},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_encode(cases[i].in, strlen(cases[i].in), cases[i].keep_slash,
                     cases[i].want);
    /* LEN bytes, not up to a NUL. */
    check_encode("a\0b", 3, false, "a%00b");
    check_encode("abcdef", 3, false, "abc");
    check_encode(NULL, 0, false, "");
}

static void test_query(void **state)
{
    static const struct {
        const char *query;
        const char *want;
    } cases[] = {
        {NULL, ""},
        {"", ""},
        {"acl", "acl="},
        {"a=&b", "a=&b="},
        {"a=1&&b=2&", "a=1&b=2"},
        {"prefix=photos/2024 summer&delimiter=/",
         "delimiter=%2F&prefix=photos%2F2024%20summer"},
        {"key=a%2Bb", "key=a%2Bb"},
        {"key=a+b", "key=a%2Bb"},
        {"x=%7e%2f%41", "x=~%2FA"},
        {"x=%zz%4", "x=%25zz%254"},
        {"a=b=c", "a=b%3Dc"},
        {"b=2&a=1&B=3&a=0", "B=3&a=0&a=1&b=2"},
        {"list-type=2&continuation-token=1%2Fabc%3D%3D",
         "continuation-token=1%2Fabc%3D%3D&list-type=2"},
        {"%E1%88%B4=%E2%82%AC", "%E1%88%B4=%E2%82%AC"},
        {"uploadId=x~y.z_-&partNumber=10", "partNumber=10&uploadId=x~y.z_-"},
    };
    struct sigv4_request req = {
        .method = "GET",
        .path = "/",
        .headers = host_only,
        .header_count = 1,
        .payload_hash = SIGV4_EMPTY_SHA256,
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got;

        req.query = cases[i].query;
        got = creq_line(&req, 2);
        assert_string_equal(got, cases[i].want);
        free(got);
    }
}

static void test_header_folding(void **state)
{
    static const struct sigv4_header headers[] = {
        {"Host", "examplebucket.s3.amazonaws.com"},
        {"X-Amz-Meta-Note", "  two   words\there \t "},
        {"x-amz-meta-empty", ""},
        {"X-AMZ-DATE", " 20130524T000000Z "},
        {"x-amz-meta-dup", "1"},
        {"X-Amz-Meta-Dup", "  2  "},
        {"x-amz-meta-ws", " \t "},
        {"X-Amz-Meta-Lines", "a\r\n  b"},
    };
    struct sigv4_request req = {
        .method = "HEAD",
        .path = "/key",
        .headers = headers,
        .header_count = sizeof(headers) / sizeof(headers[0]),
        .payload_hash = SIGV4_UNSIGNED_PAYLOAD,
    };
    char *creq = NULL;

    (void)state;
    assert_int_equal(sigv4_canonical_request(&req, &creq), 0);
    assert_string_equal(creq,
                        "HEAD\n"
                        "/key\n"
                        "\n"
                        "host:examplebucket.s3.amazonaws.com\n"
                        "x-amz-date:20130524T000000Z\n"
                        "x-amz-meta-dup:1,2\n"
                        "x-amz-meta-empty:\n"
                        "x-amz-meta-lines:a b\n"
                        "x-amz-meta-note:two words here\n"
                        "x-amz-meta-ws:\n"
                        "\n"
                        "host;x-amz-date;x-amz-meta-dup;x-amz-meta-empty;"
                        "x-amz-meta-lines;x-amz-meta-note;x-amz-meta-ws\n"
                        "UNSIGNED-PAYLOAD");
    free(creq);
}

static void test_path(void **state)
{
    static const struct {
        const char *path;
        bool normalize;
        const char *want;
    } cases[] = {
        /* S3: the path is used exactly as given. */
        {NULL, false, "/"},
        {"", false, "/"},
        {"/my-object//example//photo.user", false,
         "/my-object//example//photo.user"},
        {"/a/./b/../c", false, "/a/./b/../c"},
        {"/key%20with%20spaces", false, "/key%20with%20spaces"},
        /* Generic services. */
        {NULL, true, "/"},
        {"/", true, "/"},
        {"/a/./b/../c//d/", true, "/a/c/d/"},
        {"/a/b/..", true, "/a/"},
        {"/a/b/.", true, "/a/b/"},
        {"/../../a", true, "/a"},
        {"a/b", true, "/a/b"},
        {"/%41%2F/x y", true, "/%2541%252F/x%20y"},
        {"/.../..a/a..", true, "/.../..a/a.."},
    };
    struct sigv4_request req = {
        .method = "GET",
        .headers = host_only,
        .header_count = 1,
        .payload_hash = SIGV4_EMPTY_SHA256,
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got;

        req.path = cases[i].path;
        req.normalize_path = cases[i].normalize;
        got = creq_line(&req, 1);
        assert_string_equal(got, cases[i].want);
        free(got);
    }
}

static void test_sha256(void **state)
{
    char hex[SIGV4_HEX_LEN + 1];

    (void)state;
    sigv4_sha256_hex("", 0, hex);
    assert_string_equal(hex, SIGV4_EMPTY_SHA256);
    sigv4_sha256_hex(NULL, 0, hex);
    assert_string_equal(hex, SIGV4_EMPTY_SHA256);
    /* The x-amz-content-sha256 of the S3 PUT Object example. */
    sigv4_sha256_hex("Welcome to Amazon S3.", 21, hex);
    assert_string_equal(
        hex, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
}

static void test_unsigned_payload(void **state)
{
    static const struct sigv4_header headers[] = {
        {"Host", "examplebucket.s3.amazonaws.com"},
        {"x-amz-content-sha256", SIGV4_UNSIGNED_PAYLOAD},
        {"x-amz-date", "20130524T000000Z"},
    };
    struct sigv4_request req = {
        .method = "GET",
        .path = "/test.txt",
        .headers = headers,
        .header_count = 3,
        .payload_hash = SIGV4_UNSIGNED_PAYLOAD,
    };
    char *authz = NULL;
    char *last = creq_line(&req, 8);

    (void)state;
    assert_string_equal(last, "UNSIGNED-PAYLOAD");
    free(last);
    assert_int_equal(sigv4_authorization(&req, &s3_scope, "AKIAIOSFODNN7EXAMPLE",
                                         "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                                         &authz),
                     0);
    assert_non_null(strstr(authz, "Credential=AKIAIOSFODNN7EXAMPLE/20130524/"
                                  "us-east-1/s3/aws4_request, SignedHeaders="
                                  "host;x-amz-content-sha256;x-amz-date, "
                                  "Signature="));
    assert_int_equal(strlen(strstr(authz, "Signature=")),
                     strlen("Signature=") + SIGV4_HEX_LEN);
    free(authz);
}

static void test_errors(void **state)
{
    static const struct sigv4_header bad_names[][1] = {
        {{NULL, "v"}}, {{"", "v"}}, {{"Bad Name", "v"}}, {{"a:b", "v"}},
    };
    static const struct sigv4_header null_value[] = {{"Host", NULL}};
    static const struct sigv4_scope bad_scopes[] = {
        {NULL, "us-east-1", "s3"},
        {"20130524", "us-east-1", "s3"},
        {"20130524T000000", "us-east-1", "s3"},
        {"2013052AT000000Z", "us-east-1", "s3"},
        {"20130524X000000Z", "us-east-1", "s3"},
        {"20130524T000000Z", NULL, "s3"},
        {"20130524T000000Z", "", "s3"},
        {"20130524T000000Z", "us-east-1", "s/3"},
        {"20130524T000000Z", "us-east-1", ""},
    };
    const char *secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    struct sigv4_request good = {
        .method = "GET",
        .path = "/",
        .headers = host_only,
        .header_count = 1,
        .payload_hash = SIGV4_EMPTY_SHA256,
    };
    struct sigv4_request req;
    char sig[SIGV4_HEX_LEN + 1];
    char *out = (char *)"untouched";
    char *long_secret;

    (void)state;
    /* Canonical request. */
    req = good;
    req.method = NULL;
    assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    assert_null(out);
    out = (char *)"untouched";
    assert_int_equal(sigv4_authorization(&req, &s3_scope, "AKID", secret,
                                         &out),
                     EINVAL);
    assert_null(out);
    req.method = "";
    assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    req = good;
    req.payload_hash = NULL;
    assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    req = good;
    req.headers = NULL;
    assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
        req = good;
        req.headers = bad_names[i];
        assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    }
    req = good;
    req.headers = null_value;
    assert_int_equal(sigv4_canonical_request(&req, &out), EINVAL);
    assert_int_equal(sigv4_canonical_request(NULL, &out), EINVAL);
    assert_int_equal(sigv4_canonical_request(&good, NULL), EINVAL);
    /* No headers at all is a valid (if useless) request. */
    req = good;
    req.headers = NULL;
    req.header_count = 0;
    assert_int_equal(sigv4_canonical_request(&req, &out), 0);
    free(out);

    /* String to sign and signature: the scope. */
    assert_int_equal(sigv4_string_to_sign(NULL, &s3_scope, &out), EINVAL);
    assert_null(out);
    assert_int_equal(sigv4_string_to_sign("x", NULL, &out), EINVAL);
    assert_int_equal(sigv4_string_to_sign("x", &s3_scope, NULL), EINVAL);
    assert_int_equal(sigv4_signature(secret, NULL, "x", sig), EINVAL);
    for (size_t i = 0; i < sizeof(bad_scopes) / sizeof(bad_scopes[0]); i++) {
        assert_int_equal(sigv4_string_to_sign("x", &bad_scopes[i], &out),
                         EINVAL);
        assert_int_equal(sigv4_signature(secret, &bad_scopes[i], "x", sig),
                         EINVAL);
        assert_int_equal(sigv4_authorization(&good, &bad_scopes[i], "AKID",
                                             secret, &out),
                         EINVAL);
        assert_null(out);
    }

    /* Signature: missing inputs; the output is emptied. */
    memset(sig, 'x', sizeof(sig));
    assert_int_equal(sigv4_signature(NULL, &s3_scope, "x", sig), EINVAL);
    assert_string_equal(sig, "");
    assert_int_equal(sigv4_signature(secret, &s3_scope, NULL, sig), EINVAL);
    assert_int_equal(sigv4_signature(secret, &s3_scope, "x", NULL), EINVAL);
    long_secret = malloc(4096);
    assert_non_null(long_secret);
    memset(long_secret, 'k', 4095);
    long_secret[4095] = '\0';
    assert_int_equal(sigv4_signature(long_secret, &s3_scope, "x", sig),
                     EINVAL);
    free(long_secret);
    /* An empty secret is unusual but signs. */
    assert_int_equal(sigv4_signature("", &s3_scope, "x", sig), 0);
    assert_int_equal(strlen(sig), SIGV4_HEX_LEN);

    /* Authorization: the access key. */
    assert_int_equal(sigv4_authorization(&good, &s3_scope, NULL, secret,
                                         &out),
                     EINVAL);
    assert_int_equal(sigv4_authorization(&good, &s3_scope, "", secret, &out),
                     EINVAL);
    assert_int_equal(sigv4_authorization(&good, &s3_scope, "AK/ID", secret,
                                         &out),
                     EINVAL);
    assert_int_equal(sigv4_authorization(&good, &s3_scope, "AKID", NULL,
                                         &out),
                     EINVAL);
    assert_null(out);
    assert_int_equal(sigv4_authorization(&good, &s3_scope, "AKID", secret,
                                         NULL),
                     EINVAL);

    /* Encoding: NULL input with a length. */
    assert_null(sigv4_uri_encode(NULL, 3, false));
}

int main(void)
{
    static struct CMUnitTest vector_tests[SIGV4_VECTOR_COUNT];
    static const struct CMUnitTest unit_tests[] = {
        cmocka_unit_test(test_uri_encode),
        cmocka_unit_test(test_query),
        cmocka_unit_test(test_header_folding),
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_unsigned_payload),
        cmocka_unit_test(test_errors),
    };
    int failed = 0;

    for (size_t i = 0; i < SIGV4_VECTOR_COUNT; i++) {
        vector_tests[i] = (struct CMUnitTest){
            .name = sigv4_vectors[i].name,
            .test_func = test_vector,
            .initial_state = (void *)(uintptr_t)&sigv4_vectors[i],
        };
    }
    failed += cmocka_run_group_tests_name("sigv4 vectors", vector_tests, NULL,
                                          NULL);
    failed += cmocka_run_group_tests_name("sigv4 units", unit_tests, NULL,
                                          NULL);
    return failed != 0;
}
