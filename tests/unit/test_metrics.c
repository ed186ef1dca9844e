/*
 * test_metrics.c - unit tests for the endpoint of -o metrics: the text
 * (metrics_text.c: every family with HELP and TYPE before its samples,
 * the values where they belong, histograms cumulative with +Inf equal to
 * _count, label values escaped), the addresses -o metrics accepts and
 * refuses (metrics_http_parse_address), and the HTTP server itself on
 * loopback (metrics_http.c: the page, 404, 405, HEAD, a failed render, a
 * port in use), asked with libcurl.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "cmd/metrics_http.h"
#include "cmd/metrics_text.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------ text */

/* A snapshot whose every counter has a value of its own. */
static struct fs_stats sample_stats(void)
{
    struct fs_stats st = {0};

    st.bytes_read = 1001;
    st.hit_bytes = 1002;
    st.direct_bytes = 1003;
    st.inodes = 1004;
    st.bytes_written = 1005;
    st.uploads_pending = 1006;
    st.uploads_completed = 1007;
    st.upload_failures = 1008;
    st.upload_retries = 1009;
    st.copies_on_write = 1010;
    st.s3.bytes_received = 2001;
    st.s3.bytes_sent = 2002;
    st.s3.retries = 2003;
    st.s3.failures = 2004;
    st.cache.used_bytes = 3001;
    st.cache.index_bytes = 3002;
    st.cache.protected_bytes = 3003;
    st.cache.pinned_bytes = 3008;
    st.cache.size_limit = 3004;
    st.cache.blocks = 3005;
    st.cache.evicted_blocks = 3006;
    st.cache.corrupt_blocks = 3007;
    for (int op = 0; op < S3_OP_COUNT; op++)
        st.s3.requests[op] = 100 + (uint64_t)op;
    /* GETs: 2 at most 1 ms, 3 in (0.1, 0.25], 1 over 30 s: 6 in 45.5 s */
    st.s3.latency[S3_OP_GET].counts[0] = 2;
    st.s3.latency[S3_OP_GET].counts[7] = 3;
    st.s3.latency[S3_OP_GET].counts[S3_LATENCY_BUCKETS] = 1;
    st.s3.latency[S3_OP_GET].sum_us = 45500001;
    return st;
}

/* The same with a shared cache tier whose every counter has its own
 * value too. */
static struct fs_stats sample_tier_stats(void)
{
    struct fs_stats st = sample_stats();

    st.tier_on = true;
    st.tier.hit_bytes = 4001;
    st.tier.put_bytes = 4002;
    st.tier.hits = 4003;
    st.tier.misses = 4004;
    st.tier.bad = 4005;
    st.tier.skipped = 4006;
    st.tier.puts = 4007;
    st.tier.put_exists = 4008;
    st.tier.put_dropped = 4009;
    st.tier.queued_bytes = 4010;
    st.tier.errors = 4011;
    st.tier.skipping = true;
    for (int op = 0; op < S3_OP_COUNT; op++)
        st.tier.s3.requests[op] = 500 + (uint64_t)op;
    /* tier GETs: 4 at most 5 ms, 1 in (1, 2.5]: 5 in 1.500002 s */
    st.tier.s3.latency[S3_OP_GET].counts[2] = 4;
    st.tier.s3.latency[S3_OP_GET].counts[10] = 1;
    st.tier.s3.latency[S3_OP_GET].sum_us = 1500002;
    /* (the tier's own byte counts are framed blocks: not shown) */
    st.tier.s3.bytes_received = 9999;
    return st;
}

static char *render(const struct fs_stats *st, const char *version)
{
    struct metrics_snapshot snapshot = {
        .stats = st,
        .block_size = 1 << 20,
        .start_time = 1700000000.25,
        .version = version,
    };
    char *text = NULL;
    size_t len = 0;

    assert_int_equal(metrics_text_render(&snapshot, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

/* The line of TEXT that is exactly LINE (the test fails without one). */
static void has_line(const char *text, const char *line)
{
    size_t n = strlen(line);

    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    fail_msg("no line '%s'", line);
}

static void test_text_values(void **state)
{
    (void)state;
    struct fs_stats st = sample_stats();
    char *text = render(&st, "0.1.0");
    static const char *const lines[] = {
        "s3cachefs_read_bytes_total 1001",
        "s3cachefs_cache_hit_bytes_total 1002",
        "s3cachefs_read_around_cache_bytes_total 1003",
        "s3cachefs_inodes 1004",
        "s3cachefs_written_bytes_total 1005",
        "s3cachefs_uploads_pending 1006",
        "s3cachefs_uploads_completed_total 1007",
        "s3cachefs_upload_failures_total 1008",
        "s3cachefs_upload_retries_total 1009",
        "s3cachefs_copies_on_write_total 1010",
        "s3cachefs_bucket_received_bytes_total 2001",
        "s3cachefs_bucket_sent_bytes_total 2002",
        "s3cachefs_request_retries_total 2003",
        "s3cachefs_request_failures_total 2004",
        "s3cachefs_cache_used_bytes 3001",
        "s3cachefs_cache_index_bytes 3002",
        "s3cachefs_cache_protected_bytes 3003",
        "s3cachefs_cache_pinned_bytes 3008",
        "s3cachefs_cache_limit_bytes 3004",
        "s3cachefs_cache_blocks 3005",
        "s3cachefs_cache_evicted_blocks_total 3006",
        "s3cachefs_cache_corrupt_blocks_total 3007",
        "s3cachefs_cache_block_size_bytes 1048576",
        "s3cachefs_requests_total{kind=\"get\"} 100",
        "s3cachefs_requests_total{kind=\"head\"} 101",
        "s3cachefs_requests_total{kind=\"list\"} 102",
        "s3cachefs_requests_total{kind=\"put\"} 103",
        "s3cachefs_requests_total{kind=\"delete\"} 104",
        "s3cachefs_requests_total{kind=\"copy\"} 105",
        "s3cachefs_requests_total{kind=\"multipart\"} 106",
        "s3cachefs_build_info{version=\"0.1.0\"} 1",
        "s3cachefs_start_time_seconds 1700000000.250",
        "# TYPE s3cachefs_read_bytes_total counter",
        "# TYPE s3cachefs_cache_used_bytes gauge",
        "# TYPE s3cachefs_request_duration_seconds histogram",
    };
    for (size_t i = 0; i < ARRAY_LEN(lines); i++)
        has_line(text, lines[i]);
    free(text);
}

/* Histograms: cumulative, +Inf equal to _count, the sum in seconds; the
 * kinds with no request at zero throughout. */
static void test_text_histogram(void **state)
{
    (void)state;
    struct fs_stats st = sample_stats();
    char *text = render(&st, "0.1.0");
    static const char *const lines[] = {
        "s3cachefs_request_duration_seconds_bucket{kind=\"get\",le=\"0.001\"} 2",
        "s3cachefs_request_duration_seconds_bucket{kind=\"get\",le=\"0.1\"} 2",
        "s3cachefs_request_duration_seconds_bucket{kind=\"get\",le=\"0.25\"} 5",
        "s3cachefs_request_duration_seconds_bucket{kind=\"get\",le=\"30\"} 5",
        "s3cachefs_request_duration_seconds_bucket{kind=\"get\",le=\"+Inf\"} 6",
        "s3cachefs_request_duration_seconds_count{kind=\"get\"} 6",
        "s3cachefs_request_duration_seconds_sum{kind=\"get\"} 45.500001",
        "s3cachefs_request_duration_seconds_bucket{kind=\"put\",le=\"+Inf\"} 0",
        "s3cachefs_request_duration_seconds_sum{kind=\"put\"} 0.000000",
    };
    for (size_t i = 0; i < ARRAY_LEN(lines); i++)
        has_line(text, lines[i]);
    /* one bucket line per bound and +Inf, for each of the 7 kinds */
    size_t buckets = 0;
    for (const char *p = text; (p = strstr(p, "_bucket{")) != NULL; p++)
        buckets++;
    assert_int_equal(buckets, S3_OP_COUNT * (S3_LATENCY_BUCKETS + 1));
    free(text);
}

/* Every sample's family in TEXT has HELP and TYPE lines before it, once;
 * at least MIN_FAMILIES of them. */
static void every_family_described(const char *text, size_t min_families)
{
    char *copy = strdup(text);
    char described[64][96];
    size_t count = 0;

    assert_non_null(copy);
    for (char *line = strtok(copy, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        char name[96];
        if (strncmp(line, "# HELP ", 7) == 0) {
            assert_true(sscanf(line + 7, "%95s", name) == 1);
            for (size_t i = 0; i < count; i++)
                assert_string_not_equal(described[i], name);
            assert_true(count < ARRAY_LEN(described));
            snprintf(described[count++], sizeof(described[0]), "%s", name);
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            assert_true(sscanf(line + 7, "%95s", name) == 1);
            assert_string_equal(described[count - 1], name);
            continue;
        }
        size_t n = strcspn(line, "{ ");
        assert_true(n < sizeof(name));
        memcpy(name, line, n);
        name[n] = '\0';
        /* a histogram's series belong to its family */
        static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
        bool found = false;
        for (size_t i = 0; i < count && !found; i++) {
            if (strcmp(described[i], name) == 0)
                found = true;
            for (size_t s = 0; s < ARRAY_LEN(suffixes) && !found; s++) {
                size_t d = strlen(described[i]);
                if (strncmp(name, described[i], d) == 0 &&
                    strcmp(name + d, suffixes[s]) == 0)
                    found = true;
            }
        }
        if (!found)
            fail_msg("sample '%s' before its HELP line", line);
    }
    assert_true(count >= min_families);
    free(copy);
}

static void test_text_every_family_described(void **state)
{
    (void)state;
    struct fs_stats st = sample_stats();
    char *text = render(&st, "0.1.0");
    every_family_described(text, 25);
    free(text);
    st = sample_tier_stats();
    text = render(&st, "0.1.0");
    every_family_described(text, 25 + 14);
    free(text);
}

/* The shared cache's families, with their values, only with a tier. */
static void test_text_tier(void **state)
{
    (void)state;
    struct fs_stats st = sample_stats();
    char *text = render(&st, "0.1.0");
    assert_null(strstr(text, "tier"));
    free(text);

    st = sample_tier_stats();
    text = render(&st, "0.1.0");
    static const char *const lines[] = {
        "s3cachefs_tier_received_bytes_total 4001",
        "s3cachefs_tier_sent_bytes_total 4002",
        "s3cachefs_tier_hit_blocks_total 4003",
        "s3cachefs_tier_miss_blocks_total 4004",
        "s3cachefs_tier_bad_blocks_total 4005",
        "s3cachefs_tier_skipped_blocks_total 4006",
        "s3cachefs_tier_written_blocks_total 4007",
        "s3cachefs_tier_written_first_elsewhere_blocks_total 4008",
        "s3cachefs_tier_dropped_blocks_total 4009",
        "s3cachefs_tier_queued_bytes 4010",
        "s3cachefs_tier_request_failures_total 4011",
        "s3cachefs_tier_skipping 1",
        "# TYPE s3cachefs_tier_received_bytes_total counter",
        "# TYPE s3cachefs_tier_queued_bytes gauge",
        "# TYPE s3cachefs_tier_skipping gauge",
        "# TYPE s3cachefs_tier_requests_total counter",
        "# TYPE s3cachefs_tier_request_duration_seconds histogram",
        "s3cachefs_tier_requests_total{kind=\"get\"} 500",
        "s3cachefs_tier_requests_total{kind=\"head\"} 501",
        "s3cachefs_tier_requests_total{kind=\"list\"} 502",
        "s3cachefs_tier_requests_total{kind=\"put\"} 503",
        "s3cachefs_tier_requests_total{kind=\"delete\"} 504",
        "s3cachefs_tier_requests_total{kind=\"copy\"} 505",
        "s3cachefs_tier_requests_total{kind=\"multipart\"} 506",
        "s3cachefs_tier_request_duration_seconds_bucket{kind=\"get\",le=\"0.001\"} 0",
        "s3cachefs_tier_request_duration_seconds_bucket{kind=\"get\",le=\"0.005\"} 4",
        "s3cachefs_tier_request_duration_seconds_bucket{kind=\"get\",le=\"1\"} 4",
        "s3cachefs_tier_request_duration_seconds_bucket{kind=\"get\",le=\"2.5\"} 5",
        "s3cachefs_tier_request_duration_seconds_bucket{kind=\"get\",le=\"+Inf\"} 5",
        "s3cachefs_tier_request_duration_seconds_count{kind=\"get\"} 5",
        "s3cachefs_tier_request_duration_seconds_sum{kind=\"get\"} 1.500002",
        "s3cachefs_tier_request_duration_seconds_count{kind=\"put\"} 0",
        /* the bucket's are the bucket's still */
        "s3cachefs_requests_total{kind=\"get\"} 100",
        "s3cachefs_bucket_received_bytes_total 2001",
        "s3cachefs_request_duration_seconds_count{kind=\"get\"} 6",
    };
    for (size_t i = 0; i < ARRAY_LEN(lines); i++)
        has_line(text, lines[i]);
    assert_null(strstr(text, "9999"));
    /* one bucket line per bound and +Inf, for each kind, bucket and tier */
    size_t buckets = 0;
    for (const char *p = text; (p = strstr(p, "_bucket{")) != NULL; p++)
        buckets++;
    assert_int_equal(buckets, 2 * S3_OP_COUNT * (S3_LATENCY_BUCKETS + 1));
    free(text);
}

static void test_text_label_escaped(void **state)
{
    (void)state;
    struct fs_stats st = {0};
    char *text = render(&st, "1.0 \"x\"\\y\nz");

    has_line(text, "s3cachefs_build_info{version=\"1.0 \\\"x\\\"\\\\y\\nz\"} 1");
    free(text);
}

/* ------------------------------------------------------------- addresses */

static void test_address_accepted(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        int family;
        const char *host;
        unsigned port;
    } cases[] = {
        {"9101", AF_INET, "127.0.0.1", 9101},
        {"127.0.0.1:9101", AF_INET, "127.0.0.1", 9101},
        {"localhost:80", AF_INET, "127.0.0.1", 80},
        {"0.0.0.0:65535", AF_INET, "0.0.0.0", 65535},
        {"10.1.2.3:1", AF_INET, "10.1.2.3", 1},
        {"[::1]:9101", AF_INET6, "::1", 9101},
        {"[::]:9101", AF_INET6, "::", 9101},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct sockaddr_storage addr;
        socklen_t len = 0;
        char err[256] = "", host[INET6_ADDRSTRLEN];
        assert_int_equal(metrics_http_parse_address(cases[i].spec, &addr, &len,
                                                    err, sizeof(err)), 0);
        assert_int_equal(addr.ss_family, cases[i].family);
        if (cases[i].family == AF_INET) {
            struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
            assert_int_equal(len, sizeof(*v4));
            inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
            assert_int_equal(ntohs(v4->sin_port), cases[i].port);
        } else {
            struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
            assert_int_equal(len, sizeof(*v6));
            inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
            assert_int_equal(ntohs(v6->sin6_port), cases[i].port);
        }
        assert_string_equal(host, cases[i].host);
    }
}

static void test_address_refused(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        const char *says;      /* part of the message */
    } cases[] = {
        {"", "port"},
        {"0", "port"},
        {"65536", "port"},
        {"-1", "port"},
        {"+80", "port"},
        {"80x", "port"},
        {"127.0.0.1:", "port"},
        {"127.0.0.1:99999999999999999999", "port"},
        {"metrics.example:80", "not a numeric"},
        {"::1:9101", "[ADDR]:PORT"},
        {"[::1]9101", "[ADDR]:PORT"},
        {"[::1:9101", "[ADDR]:PORT"},
        {"[127.0.0.1]:80", "not a numeric IPv6"},
        {"256.0.0.1:80", "not a numeric"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct sockaddr_storage addr;
        socklen_t len = 0;
        char err[256] = "";
        int rc = metrics_http_parse_address(cases[i].spec, &addr, &len, err,
                                            sizeof(err));
        if (rc != EINVAL)
            fail_msg("'%s' accepted", cases[i].spec);
        if (strstr(err, cases[i].says) == NULL ||
            strstr(err, "metrics=") == NULL)
            fail_msg("'%s': message '%s'", cases[i].spec, err);
    }
}

/* ------------------------------------------------------------ the server */

struct page {               /* (shared with the server's thread) */
    atomic_int calls;
    atomic_int fail;        /* render's answer */
};

static int render_page(void *arg, char **text, size_t *len)
{
    struct page *page = arg;

    page->calls++;
    if (page->fail != 0)
        return page->fail;
    *text = strdup("s3cachefs_inodes 7\n");
    *len = strlen(*text);
    return *text != NULL ? 0 : ENOMEM;
}

struct body {
    char data[4096];
    size_t len;
};

static size_t collect(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct body *body = arg;
    size_t n = size * nmemb;

    if (body->len + n >= sizeof(body->data))
        return 0;
    memcpy(body->data + body->len, ptr, n);
    body->len += n;
    body->data[body->len] = '\0';
    return n;
}

/* METHOD URL: its status, the body into *BODY, the content type into
 * TYPE (when not NULL). */
static long ask(const char *method, const char *url, struct body *body,
                char *type, size_t type_len)
{
    CURL *curl = curl_easy_init();
    long status = 0;
    char *content_type = NULL;

    assert_non_null(curl);
    memset(body, 0, sizeof(*body));
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    if (strcmp(method, "POST") == 0)
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "x=1");
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
    assert_int_equal(curl_easy_perform(curl), CURLE_OK);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &content_type);
    if (type != NULL)
        snprintf(type, type_len, "%s", content_type ? content_type : "");
    curl_easy_cleanup(curl);
    return status;
}

/* A port of 127.0.0.1 free a moment ago. */
static unsigned free_port(void)
{
    struct sockaddr_in addr = {.sin_family = AF_INET};
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
    close(fd);
    return ntohs(addr.sin_port);
}

static void test_server_answers(void **state)
{
    (void)state;
    struct metrics_http *http = NULL;
    struct page page = {0};
    struct body body;
    char spec[32], url[64], type[128], err[256] = "";
    unsigned port = free_port();

    snprintf(spec, sizeof(spec), "%u", port);
    assert_int_equal(metrics_http_listen(spec, &http, err, sizeof(err)), 0);
    snprintf(url, sizeof(url), "127.0.0.1:%u", port);
    assert_string_equal(metrics_http_address(http), url);
    assert_int_equal(metrics_http_start(http, render_page, &page, err,
                                        sizeof(err)), 0);

    snprintf(url, sizeof(url), "http://127.0.0.1:%u/metrics", port);
    assert_int_equal(ask("GET", url, &body, type, sizeof(type)), 200);
    assert_string_equal(body.data, "s3cachefs_inodes 7\n");
    assert_string_equal(type, "text/plain; version=0.0.4; charset=utf-8");
    assert_int_equal(page.calls, 1);

    assert_int_equal(ask("HEAD", url, &body, NULL, 0), 200);
    assert_int_equal(body.len, 0);

    assert_int_equal(ask("POST", url, &body, NULL, 0), 405);
    assert_int_equal(ask("DELETE", url, &body, NULL, 0), 405);
    assert_int_equal(page.calls, 2); /* (GET and HEAD only) */

    page.fail = EIO;
    assert_int_equal(ask("GET", url, &body, NULL, 0), 500);
    page.fail = 0;

    snprintf(url, sizeof(url), "http://127.0.0.1:%u/other", port);
    assert_int_equal(ask("GET", url, &body, NULL, 0), 404);
    assert_non_null(strstr(body.data, "/metrics"));
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/", port);
    assert_int_equal(ask("GET", url, &body, NULL, 0), 200);
    assert_non_null(strstr(body.data, "/metrics"));

    /* the port is taken while it serves: a second endpoint says so */
    struct metrics_http *second = NULL;
    assert_int_equal(metrics_http_listen(spec, &second, err, sizeof(err)),
                     EADDRINUSE);
    assert_null(second);
    assert_non_null(strstr(err, "127.0.0.1"));
    assert_non_null(strstr(err, "-o metrics="));

    metrics_http_stop(&http);
    assert_null(http);
    metrics_http_stop(&http); /* safe twice */
    /* and free again once stopped */
    assert_int_equal(metrics_http_listen(spec, &http, err, sizeof(err)), 0);
    metrics_http_stop(&http);
}

/* Listening but never started (a mount that failed after binding). */
static void test_server_stopped_before_start(void **state)
{
    (void)state;
    struct metrics_http *http = NULL;
    char spec[32], err[256];

    snprintf(spec, sizeof(spec), "127.0.0.1:%u", free_port());
    assert_int_equal(metrics_http_listen(spec, &http, err, sizeof(err)), 0);
    metrics_http_stop(&http);
    assert_int_equal(metrics_http_listen(spec, &http, err, sizeof(err)), 0);
    metrics_http_stop(&http);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_values),
        cmocka_unit_test(test_text_histogram),
        cmocka_unit_test(test_text_every_family_described),
        cmocka_unit_test(test_text_tier),
        cmocka_unit_test(test_text_label_escaped),
        cmocka_unit_test(test_address_accepted),
        cmocka_unit_test(test_address_refused),
        cmocka_unit_test(test_server_answers),
        cmocka_unit_test(test_server_stopped_before_start),
    };
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return failed;
}
