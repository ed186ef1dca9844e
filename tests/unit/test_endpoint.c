/*
 * test_endpoint.c - where requests go: base URL, signed Host header and
 * path prefix for every addressing case (endpoint.c).
 */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "s3/endpoint.h"

struct endpoint_case {
    const char *name;
    const char *endpoint_url;   /* NULL: AWS */
    const char *region;
    const char *bucket;
    bool path_style;
    int expected_err;
    const char *url_base;
    const char *host_header;
    const char *path_base;
};

static const struct endpoint_case cases[] = {
    {"AWS: virtual-hosted", NULL, "us-east-1", "my-bucket", false, 0,
     "https://my-bucket.s3.us-east-1.amazonaws.com",
     "my-bucket.s3.us-east-1.amazonaws.com", ""},
    {"AWS: other region", NULL, "eu-west-3", "data", false, 0,
     "https://data.s3.eu-west-3.amazonaws.com", "data.s3.eu-west-3.amazonaws.com", ""},
    {"AWS: path_style asked", NULL, "us-west-2", "data", true, 0,
     "https://s3.us-west-2.amazonaws.com", "s3.us-west-2.amazonaws.com", "/data"},
    {"AWS: dotted bucket goes path style", NULL, "us-east-1", "my.data.bucket", false, 0,
     "https://s3.us-east-1.amazonaws.com", "s3.us-east-1.amazonaws.com",
     "/my.data.bucket"},
    {"custom endpoint with port: path style", "http://127.0.0.1:9000", "us-east-1",
     "b1", false, 0, "http://127.0.0.1:9000", "127.0.0.1:9000", "/b1"},
    {"trailing slash", "http://127.0.0.1:9000/", "us-east-1", "b1", false, 0,
     "http://127.0.0.1:9000", "127.0.0.1:9000", "/b1"},
    {"explicit default https port left out of Host", "https://s3.example.com:443",
     "auto", "b1", false, 0, "https://s3.example.com", "s3.example.com", "/b1"},
    {"explicit default http port left out of Host", "http://minio.local:80",
     "us-east-1", "b1", false, 0, "http://minio.local", "minio.local", "/b1"},
    {"non-default https port kept", "https://s3.example.com:8443", "us-east-1",
     "b1", false, 0, "https://s3.example.com:8443", "s3.example.com:8443", "/b1"},
    {"IPv6 literal", "http://[::1]:9000", "us-east-1", "b1", false, 0,
     "http://[::1]:9000", "[::1]:9000", "/b1"},
    /* the host keeps its case: curl sends it as given, and it is signed */
    {"upper-case scheme", "HTTPS://R2.example.com", "auto", "b1", false, 0,
     "https://R2.example.com", "R2.example.com", "/b1"},
    {"ftp refused", "ftp://127.0.0.1:21", "us-east-1", "b1", false, EINVAL,
     NULL, NULL, NULL},
    {"a path refused", "http://127.0.0.1:9000/prefix", "us-east-1", "b1", false,
     EINVAL, NULL, NULL, NULL},
    {"garbage refused", "not a url", "us-east-1", "b1", false, EINVAL, NULL,
     NULL, NULL},
    {"empty refused", "", "us-east-1", "b1", false, EINVAL, NULL, NULL, NULL},
};

static void test_endpoint_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct endpoint_case *c = &cases[i];
        struct endpoint ep;
        char errbuf[256] = "";
        int err = endpoint_resolve(c->endpoint_url, c->region, c->bucket,
                                   c->path_style, &ep, errbuf, sizeof(errbuf));
        if (err != c->expected_err)
            fail_msg("%s: error %d, expected %d (%s)", c->name, err,
                     c->expected_err, errbuf);
        if (err != 0) {
            if (strstr(errbuf, "invalid endpoint URL") == NULL)
                fail_msg("%s: message '%s'", c->name, errbuf);
            if (ep.url_base != NULL || ep.host_header != NULL)
                fail_msg("%s: output not cleared", c->name);
            continue;
        }
        if (strcmp(ep.url_base, c->url_base) != 0)
            fail_msg("%s: url_base '%s'", c->name, ep.url_base);
        if (strcmp(ep.host_header, c->host_header) != 0)
            fail_msg("%s: host_header '%s'", c->name, ep.host_header);
        if (strcmp(ep.path_base, c->path_base) != 0)
            fail_msg("%s: path_base '%s'", c->name, ep.path_base);
        endpoint_clear(&ep);
        endpoint_clear(&ep); /* safe twice */
    }
}

/* One name per service, however the endpoint is spelled. */
static const struct identity_case {
    const char *endpoint_url;   /* NULL: AWS */
    const char *region;
    const char *identity;       /* NULL: refused */
} identity_cases[] = {
    {NULL, "us-east-1", "https://s3.us-east-1.amazonaws.com"},
    {NULL, "eu-west-3", "https://s3.eu-west-3.amazonaws.com"},
    {"http://127.0.0.1:9000", "us-east-1", "http://127.0.0.1:9000"},
    {"http://127.0.0.1:9000/", "auto", "http://127.0.0.1:9000"},
    {"HTTPS://R2.Example.COM:443", "auto", "https://r2.example.com"},
    {"https://r2.example.com", "us-east-1", "https://r2.example.com"},
    {"http://[::1]:9000", "us-east-1", "http://[::1]:9000"},
    {"https://s3.example.com:8443", "us-east-1", "https://s3.example.com:8443"},
    {"ftp://127.0.0.1:21", "us-east-1", NULL},
    {"http://127.0.0.1:9000/prefix", "us-east-1", NULL},
};

static void test_endpoint_identity(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(identity_cases) / sizeof(identity_cases[0]); i++) {
        const struct identity_case *c = &identity_cases[i];
        char errbuf[256] = "";
        char *identity = NULL;
        int err = endpoint_identity(c->endpoint_url, c->region, &identity,
                                    errbuf, sizeof(errbuf));
        if (c->identity == NULL) {
            if (err != EINVAL || identity != NULL)
                fail_msg("%s: %d, expected EINVAL", c->endpoint_url, err);
            continue;
        }
        if (err != 0 || strcmp(identity, c->identity) != 0)
            fail_msg("%s: %d '%s', expected '%s'", c->endpoint_url ? c->endpoint_url
                     : "AWS", err, identity ? identity : "", c->identity);
        free(identity);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_table),
        cmocka_unit_test(test_endpoint_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
