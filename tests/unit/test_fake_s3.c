/*
 * test_fake_s3.c - the in-memory S3 of the unit tests (fake_s3.c), tested
 * on its own: the tests of writer.c and reader.c are only as good as the
 * fake is faithful to s3.h.
 *
 * Covered: PUT/HEAD/GET with metadata, quoted MD5 ETags, If-Match, ranges
 * and the errors of each; streamed GETs (pieces, a sink that stops);
 * ListObjectsV2 with a prefix, a delimiter (common prefixes, never twice
 * across pages), max-keys, continuation tokens, start-after and byte
 * order, also walked through s3walk.c's guard; multipart uploads (AWS's
 * ETag, parts too small or unknown, abort, UploadPartCopy and its
 * condition); CopyObject with and without its condition and metadata;
 * PUTs with If-None-Match: * and If-Match (honoured, ignored, refused);
 * holds (wait, release oldest or newest, clear); failures before acting
 * and lost answers (the work done, the error returned; a lost complete
 * taken as done after one HEAD, as s3.c does); the log and the counters.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>

#include "base/log.h"
#include "fake_s3.h"
#include "s3/s3.h"
#include "s3/s3walk.h"
#include "s3/s3xml.h"
#include "writer/upload.h"

#define MIB (1u << 20)
#define ON(call, key) FAKE_S3_ON(FAKE_S3_CALL(call), key)

static int setup(void **state)
{
    struct s3_client *s3 = NULL;

    assert_int_equal(fake_s3_create(&s3), 0);
    *state = s3;
    return 0;
}

static int teardown(void **state)
{
    struct s3_client *s3 = *state;

    fake_s3_hold_clear(s3, 0);
    s3_client_destroy(&s3);
    return 0;
}

static void put_text(struct s3_client *s3, const char *key, const char *text,
                     char *etag_out)
{
    struct s3_body body = {.data = text, .length = strlen(text)};
    assert_int_equal(s3_put_object(s3, key, &body, NULL, etag_out), 0);
}

/* Bytes of a recognisable pattern: byte I of pattern SEED. */
static unsigned char *pattern(size_t len, unsigned seed)
{
    unsigned char *bytes = malloc(len ? len : 1);
    assert_non_null(bytes);
    for (size_t i = 0; i < len; i++)
        bytes[i] = (unsigned char)((i * 31 + seed * 7 + (i >> 12)) & 0xff);
    return bytes;
}

/* A sink that collects into a buffer, and may refuse after some bytes. */
struct collector {
    unsigned char *bytes;
    size_t len, cap;
    unsigned writes;
    size_t refuse_after;        /* 0: never */
};

static int collect(void *arg, const void *data, size_t len)
{
    struct collector *c = arg;

    if (c->refuse_after != 0 && c->len + len > c->refuse_after)
        return ENOSPC;
    if (c->len + len > c->cap)
        return EOVERFLOW;
    memcpy(c->bytes + c->len, data, len);
    c->len += len;
    c->writes++;
    return 0;
}

static void test_put_head_get(void **state)
{
    struct s3_client *s3 = *state;
    struct s3_put_meta meta = {
        .content_type = "text/plain",
        .has_mode = true, .mode = 0100640,
        .has_uid = true, .uid = 1000,
        .has_gid = true, .gid = 100,
        .has_mtime = true, .mtime = {.tv_sec = 1700000000, .tv_nsec = 999},
        .has_atime = true, .atime = {.tv_sec = 1700000001},
        .has_ctime = true, .ctime = {.tv_sec = 1700000002},
        .has_rdev = true, .rdev = 0x0801,
    };
    struct s3_body body = {.data = "hello, world", .length = 12};
    struct s3_object_info info;
    char etag[S3_ETAG_MAX], expected[S3_ETAG_MAX];
    char buf[32];
    size_t received = 0;

    assert_int_equal(s3_put_object(s3, "d/f", &body, &meta, etag), 0);
    /* md5("hello, world"), quoted */
    assert_string_equal(etag, "\"e4d7f1b4ed2e42d15898f4b27b019da4\"");
    fake_s3_etag_of("hello, world", 12, expected);
    assert_string_equal(etag, expected);

    assert_int_equal(s3_head_object(s3, "d/f", &info), 0);
    assert_int_equal(info.size, 12);
    assert_string_equal(info.etag, etag);
    assert_string_equal(info.content_type, "text/plain");
    assert_true(info.has_mode && info.has_uid && info.has_gid &&
                info.has_mtime);
    assert_int_equal(info.mode, 0100640);
    assert_int_equal(info.uid, 1000);
    assert_int_equal(info.gid, 100);
    assert_int_equal(info.mtime.tv_sec, 1700000000);
    assert_int_equal(info.mtime.tv_nsec, 0); /* headers carry seconds */
    assert_true(info.has_atime && info.has_ctime && info.has_rdev);
    assert_int_equal(info.atime.tv_sec, 1700000001);
    assert_int_equal(info.ctime.tv_sec, 1700000002);
    assert_int_equal(info.rdev, 0x0801);
    assert_true(info.last_modified.tv_sec > FAKE_S3_EPOCH);

    /* no metadata: the default content type, nothing else */
    put_text(s3, "plain", "x", NULL);
    assert_int_equal(s3_head_object(s3, "plain", &info), 0);
    assert_string_equal(info.content_type, "application/octet-stream");
    assert_false(info.has_mode || info.has_uid || info.has_mtime ||
                 info.has_rdev);

    /* ranges: inside, running past the end, starting past it */
    assert_int_equal(s3_get_object_range(s3, "d/f", 7, 5, etag, buf, &received,
                                         &info), 0);
    assert_int_equal(received, 5);
    assert_memory_equal(buf, "world", 5);
    assert_int_equal(info.size, 12);
    assert_int_equal(
        s3_get_object_range(s3, "d/f", 10, 20, NULL, buf, &received, NULL), 0);
    assert_int_equal(received, 2);
    assert_int_equal(s3_get_object_range(s3, "d/f", 12, 1, NULL, buf, &received,
                                         NULL), EINVAL);
    assert_int_equal(s3_get_object_range(s3, "d/f", 0, 0, NULL, buf, &received,
                                         NULL), EINVAL);
    assert_int_equal(s3_get_object_range(s3, "d/f", 0, 4, "\"other\"", buf,
                                         &received, NULL), ESTALE);
    assert_int_equal(s3_get_object_range(s3, "nope", 0, 4, NULL, buf, &received,
                                         NULL), ENOENT);
    assert_int_equal(s3_head_object(s3, "nope", &info), ENOENT);
    assert_int_equal(s3_head_object(s3, "d", &info), ENOENT);

    /* DELETE, also of a missing key */
    assert_int_equal(s3_delete_object(s3, "d/f"), 0);
    assert_int_equal(s3_delete_object(s3, "d/f"), 0);
    assert_int_equal(s3_head_object(s3, "d/f", &info), ENOENT);

    struct s3_stats stats;
    s3_client_stats(s3, &stats);
    assert_int_equal(stats.requests[S3_OP_PUT], 2);
    assert_int_equal(stats.requests[S3_OP_HEAD], 5);
    assert_int_equal(stats.requests[S3_OP_GET], 5); /* length 0: never sent */
    assert_int_equal(stats.requests[S3_OP_DELETE], 2);
    assert_int_equal(stats.bytes_sent, 13);
    assert_int_equal(stats.bytes_received, 7);
    assert_int_equal(stats.failures, 2); /* 416 and 412; 404 is an answer */
    assert_int_equal(stats.retries, 0);
}

static void test_streamed_get(void **state)
{
    struct s3_client *s3 = *state;
    size_t size = 3 * FAKE_S3_SINK_CHUNK + 123;
    unsigned char *bytes = pattern(size, 1);
    struct collector c = {.bytes = malloc(size), .cap = size};
    struct s3_sink sink = {collect, &c};
    struct s3_object_info info;
    char etag[S3_ETAG_MAX];
    uint64_t delivered = 0;

    assert_non_null(c.bytes);
    assert_int_equal(fake_s3_put(s3, "big", bytes, size, NULL, etag), 0);
    assert_int_equal(s3_get_object_stream(s3, "big", 1, size - 1, etag, &sink,
                                          &delivered, &info), 0);
    assert_int_equal(delivered, size - 1);
    assert_int_equal(c.len, size - 1);
    assert_memory_equal(c.bytes, bytes + 1, size - 1);
    assert_int_equal(c.writes, 4); /* pieces of FAKE_S3_SINK_CHUNK */
    assert_int_equal(info.size, size);
    assert_string_equal(info.etag, etag);

    /* the object ends before the range does: EIO, what came delivered */
    c.len = c.writes = 0;
    assert_int_equal(s3_get_object_stream(s3, "big", size - 10, 20, NULL, &sink,
                                          &delivered, NULL), EIO);
    assert_int_equal(delivered, 10);

    /* a sink that stops the request: its errno, what it took */
    c.len = c.writes = 0;
    c.refuse_after = FAKE_S3_SINK_CHUNK + 1;
    assert_int_equal(s3_get_object_stream(s3, "big", 0, size, NULL, &sink,
                                          &delivered, NULL), ENOSPC);
    assert_int_equal(delivered, FAKE_S3_SINK_CHUNK);

    assert_int_equal(s3_get_object_stream(s3, "big", 0, 10, "\"x\"", &sink,
                                          &delivered, NULL), ESTALE);
    assert_int_equal(delivered, 0);
    assert_int_equal(s3_get_object_stream(s3, "big", size, 1, NULL, &sink,
                                          &delivered, NULL), EINVAL);
    free(c.bytes);
    free(bytes);
}

/* Keys and prefixes of LISTING as one string: "k:KEY p:PREFIX ...". */
static void listing_text(const struct s3xml_listing *listing, char *out,
                         size_t cap)
{
    size_t at = 0;

    out[0] = '\0';
    for (size_t i = 0; i < listing->object_count; i++)
        at += (size_t)snprintf(out + at, cap - at, "k:%s ",
                               listing->objects[i].key);
    for (size_t i = 0; i < listing->prefix_count; i++)
        at +=
            (size_t)snprintf(out + at, cap - at, "p:%s ", listing->prefixes[i]);
}

static void test_listing(void **state)
{
    struct s3_client *s3 = *state;
    static const char *const keys[] = {
        "a/1", "a/2", "a/b/c", "a/b/d", "a/b/e/f", "a/z", "a/\xc3\xa9", "b",
        "c/x", "c/y", "d", "a/", "ab",
    };
    struct s3xml_listing page;
    char text[512], etag[S3_ETAG_MAX];

    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        put_text(s3, keys[i], keys[i], NULL);

    /* no delimiter: every key under the prefix, in byte order ("\xc3"
     * sorts after 'z'), with size, quoted ETag and time */
    assert_int_equal(s3_list_objects(s3, "a/", NULL, NULL, NULL, 1000, &page),
                     0);
    listing_text(&page, text, sizeof(text));
    assert_string_equal(text,
                        "k:a/ k:a/1 k:a/2 k:a/b/c k:a/b/d k:a/b/e/f k:a/z "
                        "k:a/\xc3\xa9 ");
    assert_false(page.truncated);
    assert_null(page.next_token);
    fake_s3_etag_of("a/b/c", 5, etag);
    assert_string_equal(page.objects[3].etag, etag);
    assert_int_equal(page.objects[3].size, 5);
    assert_true(page.objects[3].mtime.tv_sec > FAKE_S3_EPOCH);
    s3xml_listing_free(&page);

    /* a delimiter: common prefixes, the marker "a/" itself is a key */
    assert_int_equal(s3_list_objects(s3, "a/", "/", NULL, NULL, 1000, &page),
                     0);
    listing_text(&page, text, sizeof(text));
    assert_string_equal(text, "k:a/ k:a/1 k:a/2 k:a/z k:a/\xc3\xa9 p:a/b/ ");
    s3xml_listing_free(&page);
    assert_int_equal(s3_list_objects(s3, "", "/", NULL, NULL, 1000, &page), 0);
    listing_text(&page, text, sizeof(text));
    assert_string_equal(text, "k:ab k:b k:d p:a/ p:c/ ");
    s3xml_listing_free(&page);

    /* pages of 2: a common prefix counts as one entry, is never listed
     * twice, and the token after it skips every key under it */
    static const char *const pages[] = {"k:ab p:a/ ", "k:b p:c/ ", "k:d "};
    char *token = NULL;
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(s3_list_objects(s3, "", "/", token, NULL, 2, &page),
                         0);
        listing_text(&page, text, sizeof(text));
        assert_string_equal(text, pages[i]);
        assert_int_equal(page.truncated, i < 2);
        free(token);
        token = page.next_token != NULL ? strdup(page.next_token) : NULL;
        assert_int_equal(token != NULL, i < 2);
        s3xml_listing_free(&page);
    }
    free(token);

    /* start-after; a token that is not one of the fake's */
    assert_int_equal(s3_list_objects(s3, "a/", NULL, NULL, "a/b/d", 3, &page),
                     0);
    listing_text(&page, text, sizeof(text));
    assert_string_equal(text, "k:a/b/e/f k:a/z k:a/\xc3\xa9 ");
    assert_false(page.truncated);
    s3xml_listing_free(&page);
    assert_int_equal(s3_list_objects(s3, "a/", NULL, "garbage", NULL, 3, &page),
                     EINVAL);
    assert_int_equal(page.object_count, 0);

    /* max-keys outside 1..1000 is clamped, as s3.c does */
    assert_int_equal(s3_list_objects(s3, "c/", NULL, NULL, NULL, 0, &page), 0);
    assert_int_equal(page.object_count, 1);
    assert_true(page.truncated);
    s3xml_listing_free(&page);

    /* the guarded walk over pages of one key each */
    struct s3walk walk = {0};
    size_t walked = 0, prefixes = 0;
    while (!walk.done) {
        assert_int_equal(s3walk_next(s3, &walk, "a/", "/", 1, &page), 0);
        walked += page.object_count;
        prefixes += page.prefix_count;
        s3xml_listing_free(&page);
    }
    s3walk_clear(&walk);
    assert_int_equal(walked, 5);
    assert_int_equal(prefixes, 1);

    assert_int_equal(s3_check_bucket(s3, "", NULL), 0);
}

/* Upload part NUMBER of UPLOAD_ID from LEN bytes of DATA into ETAG. */
static int upload_part(struct s3_client *s3, const char *key,
                       const char *upload_id, unsigned number,
                       const unsigned char *data, size_t len, char *etag)
{
    struct s3_body body = {.data = data, .length = len};
    return s3_multipart_upload_part(s3, key, upload_id, number, &body, etag);
}

static void test_multipart(void **state)
{
    struct s3_client *s3 = *state;
    size_t size = 5 * MIB + 1000;
    unsigned char *bytes = pattern(size, 2);
    char etags[3][S3_ETAG_MAX], etag[S3_ETAG_MAX], expected[S3_ETAG_MAX];
    const char *parts[3] = {etags[0], etags[1], etags[2]};
    struct s3_put_meta meta = {.has_mode = true, .mode = 0100600};
    struct s3_object_info info;
    char *upload_id = NULL;

    assert_int_equal(s3_multipart_create(s3, "m", &meta, &upload_id), 0);
    assert_non_null(upload_id);
    assert_int_equal(fake_s3_uploads(s3, "m"), 1);
    assert_int_equal(upload_part(s3, "m", upload_id, 1, bytes, 5 * MIB,
                                 etags[0]), 0);
    fake_s3_etag_of(bytes, 5 * MIB, expected);
    assert_string_equal(etags[0], expected); /* a part's ETag: its MD5 */
    assert_int_equal(upload_part(s3, "m", upload_id, 2, bytes + 5 * MIB, 1000,
                                 etags[1]), 0);
    assert_int_equal(upload_part(s3, "m", upload_id, 0, bytes, 1, etag),
                     EINVAL);
    assert_int_equal(upload_part(s3, "m", "no-such-upload", 1, bytes, 1, etag),
                     ENOENT);
    assert_int_equal(upload_part(s3, "other", upload_id, 1, bytes, 1, etag),
                     ENOENT);

    /* a part named with another ETag: refused */
    const char *wrong[2] = {etags[0], "\"00000000000000000000000000000000\""};
    assert_int_equal(s3_multipart_complete(s3, "m", upload_id, wrong, 2, etag),
                     EINVAL);
    assert_int_equal(s3_multipart_complete(s3, "m", upload_id, parts, 2, etag),
                     0);
    /* "hex(md5(md5(part 1) md5(part 2)))-2" */
    fake_s3_multipart_etag_of(bytes, size, 5 * MIB, expected);
    assert_string_equal(etag, expected);
    assert_int_equal(strlen(etag), 36);
    assert_string_equal(etag + 33, "-2\"");
    assert_true(fake_s3_holds(s3, "m", bytes, size));
    assert_int_equal(s3_head_object(s3, "m", &info), 0);
    assert_true(info.has_mode);
    assert_int_equal(info.mode, 0100600); /* the metadata of the create */
    assert_int_equal(fake_s3_uploads(s3, NULL), 0);
    /* completed: the upload is gone; the object is this upload, so the
     * client's check (one HEAD) takes it as done, as s3.c does */
    assert_int_equal(s3_multipart_complete(s3, "m", upload_id, parts, 2, etag),
                     0);
    free(upload_id);

    /* a part other than the last under 5 MiB: EntityTooSmall */
    assert_int_equal(s3_multipart_create(s3, "small", NULL, &upload_id), 0);
    assert_int_equal(upload_part(s3, "small", upload_id, 1, bytes, 1000,
                                 etags[0]), 0);
    assert_int_equal(upload_part(s3, "small", upload_id, 2, bytes, 1000,
                                 etags[1]), 0);
    assert_int_equal(s3_multipart_complete(s3, "small", upload_id, parts, 2,
                                           etag), EINVAL);
    assert_int_equal(s3_multipart_abort(s3, "small", upload_id), 0);
    assert_int_equal(fake_s3_uploads(s3, NULL), 0);
    assert_int_equal(s3_multipart_abort(s3, "small", upload_id), 0); /* gone */
    assert_int_equal(s3_multipart_complete(s3, "small", upload_id, parts, 2,
                                           etag), ENOENT);
    free(upload_id);

    /* UploadPartCopy: ranges of a source, conditional on its ETag */
    char source_etag[S3_ETAG_MAX];
    assert_int_equal(fake_s3_put(s3, "src", bytes, size, NULL, source_etag), 0);
    assert_int_equal(s3_multipart_create(s3, "copy", NULL, &upload_id), 0);
    assert_int_equal(s3_multipart_copy_part(s3, "copy", upload_id, 1, "src",
                                            "\"stale\"", 0, 5 * MIB, etags[0]),
                     ESTALE);
    assert_int_equal(s3_multipart_copy_part(s3, "copy", upload_id, 1, "src",
                                            source_etag, 0, size + 1, etags[0]),
                     EINVAL);
    assert_int_equal(s3_multipart_copy_part(s3, "copy", upload_id, 1, "gone",
                                            NULL, 0, 1, etags[0]), ENOENT);
    assert_int_equal(s3_multipart_copy_part(s3, "copy", upload_id, 1, "src",
                                            source_etag, 0, 5 * MIB, etags[0]),
                     0);
    assert_int_equal(
        upload_part(s3, "copy", upload_id, 2, bytes + 5 * MIB, 1000, etags[1]),
        0);
    assert_int_equal(s3_multipart_complete(s3, "copy", upload_id, parts, 2,
                                           etag), 0);
    fake_s3_multipart_etag_of(bytes, size, 5 * MIB, expected);
    assert_string_equal(etag, expected);
    assert_true(fake_s3_holds(s3, "copy", bytes, size));
    free(upload_id);
    free(bytes);
}

static void test_copy_condition(void **state)
{
    struct s3_client *s3 = *state;
    struct s3_put_meta meta = {.content_type = "text/x-a", .has_uid = true,
                               .uid = 7};
    struct s3_put_meta replaced = {.has_uid = true, .uid = 8, .has_mode = true,
                                   .mode = 0100644};
    struct s3_object_info info;
    char etag[S3_ETAG_MAX], copied[S3_ETAG_MAX];

    assert_int_equal(fake_s3_put(s3, "a", "one", 3, &meta, etag), 0);
    /* metadata copied */
    assert_int_equal(s3_copy_object(s3, "a", etag, "b", NULL, copied), 0);
    assert_string_equal(copied, etag);
    assert_int_equal(s3_head_object(s3, "b", &info), 0);
    assert_string_equal(info.content_type, "text/x-a");
    assert_true(info.has_uid && !info.has_mode);
    assert_int_equal(info.uid, 7);
    /* metadata replaced, onto itself */
    assert_int_equal(s3_copy_object(s3, "b", etag, "b", &replaced, copied), 0);
    assert_int_equal(s3_head_object(s3, "b", &info), 0);
    assert_string_equal(info.content_type, "application/octet-stream");
    assert_true(info.has_uid && info.has_mode);
    assert_int_equal(info.uid, 8);
    assert_true(fake_s3_holds(s3, "b", "one", 3));

    /* the source changed: ESTALE, nothing copied */
    assert_int_equal(fake_s3_put(s3, "a", "two", 3, NULL, NULL), 0);
    assert_int_equal(s3_copy_object(s3, "a", etag, "c", NULL, copied), ESTALE);
    assert_int_equal(s3_head_object(s3, "c", &info), ENOENT);
    /* no condition: whatever version it is */
    assert_int_equal(s3_copy_object(s3, "a", NULL, "c", NULL, copied), 0);
    assert_true(fake_s3_holds(s3, "c", "two", 3));
    assert_int_equal(s3_copy_object(s3, "missing", NULL, "d", NULL, copied),
                     ENOENT);

    /* the log names source, destination and condition */
    long at = fake_s3_log_find(s3, 0, ON(FAKE_S3_COPY, "c"));
    struct fake_s3_request request;
    assert_true(at >= 0);
    assert_int_equal(fake_s3_log_get(s3, (size_t)at, &request), 0);
    assert_string_equal(request.source, "a");
    assert_string_equal(request.condition, etag);
    assert_true(request.done);
    assert_int_equal(request.result, ESTALE);
}

/* Writes with If-None-Match: * and with If-Match, on a server that
 * honours them (AWS), ignores them (s3rver) or refuses them (Swift). */
static void test_conditional_writes(void **state)
{
    struct s3_client *s3 = *state;
    struct s3_body body = {.data = "two", .length = 3};
    char etag[S3_ETAG_MAX], next[S3_ETAG_MAX];
    struct fake_s3_request logged;

    put_text(s3, "c", "one", etag);
    struct s3_put_meta fresh = {.if_none_match = true};
    assert_int_equal(s3_put_object(s3, "c", &body, &fresh, NULL), ESTALE);
    assert_int_equal(s3_put_object(s3, "d", &body, &fresh, NULL), 0);
    struct s3_put_meta wrong = {.if_match = "\"0\""};
    assert_int_equal(s3_put_object(s3, "c", &body, &wrong, NULL), ESTALE);
    assert_int_equal(s3_put_object(s3, "none", &body, &wrong, NULL), ENOENT);
    assert_true(fake_s3_holds(s3, "c", "one", 3));
    struct s3_put_meta same = {.if_match = etag};
    assert_int_equal(s3_put_object(s3, "c", &body, &same, next), 0);
    assert_true(fake_s3_holds(s3, "c", "two", 3));
    assert_string_not_equal(next, etag);
    assert_int_equal(s3_put_object(s3, "c", &body, &same, NULL), ESTALE);
    assert_int_equal(fake_s3_log_get(s3, fake_s3_log_count(s3) - 1, &logged), 0);
    assert_string_equal(logged.condition, etag);

    /* If-Match alone ignored: written over whatever is there */
    fake_s3_set_if_match_conditions(s3, FAKE_S3_CONDITIONS_IGNORED);
    assert_int_equal(s3_put_object(s3, "c", &body, &fresh, NULL), ESTALE);
    put_text(s3, "c", "one", NULL);
    assert_int_equal(s3_put_object(s3, "c", &body, &wrong, NULL), 0);
    assert_true(fake_s3_holds(s3, "c", "two", 3));
    /* both refused */
    fake_s3_set_conditions(s3, FAKE_S3_CONDITIONS_REFUSED);
    assert_int_equal(s3_put_object(s3, "c", &body, &fresh, NULL), ENOSYS);
    assert_int_equal(s3_put_object(s3, "c", &body, &same, NULL), ENOSYS);
    /* both ignored */
    fake_s3_set_conditions(s3, FAKE_S3_CONDITIONS_IGNORED);
    assert_int_equal(s3_put_object(s3, "c", &body, &fresh, NULL), 0);
    assert_int_equal(s3_put_object(s3, "c", &body, &wrong, NULL), 0);
}

/* A PUT in a thread of its own (it may be held). */
struct put_thread {
    pthread_t thread;
    struct s3_client *s3;
    const char *key, *text;
    int result;
};

static void *put_main(void *arg)
{
    struct put_thread *put = arg;
    struct s3_body body = {.data = put->text, .length = strlen(put->text)};

    put->result = s3_put_object(put->s3, put->key, &body, NULL, NULL);
    return NULL;
}

static void put_start(struct put_thread *put, struct s3_client *s3,
                      const char *key, const char *text)
{
    *put =
        (struct put_thread){.s3 = s3, .key = key, .text = text, .result = -1};
    assert_int_equal(pthread_create(&put->thread, NULL, put_main, put), 0);
}

static void test_hold_and_release(void **state)
{
    struct s3_client *s3 = *state;
    struct put_thread first, second, other;
    unsigned rule = 0, rule_all = 0;
    uint64_t seq = 0;

    assert_int_equal(fake_s3_hold(s3, ON(FAKE_S3_PUT, "k"), &rule), 0);
    put_start(&first, s3, "k", "first");
    assert_int_equal(fake_s3_wait_held(s3, rule, 1), 0);
    put_start(&second, s3, "k", "second");
    assert_int_equal(fake_s3_wait_held(s3, rule, 2), 0);
    /* not held: another key */
    put_start(&other, s3, "k2", "other");
    pthread_join(other.thread, NULL);
    assert_int_equal(other.result, 0);
    assert_int_equal(fake_s3_held(s3, 0), 2);
    assert_false(fake_s3_holds(s3, "k", "first", 5));

    /* newest first: "second" lands, then "first" over it */
    assert_int_equal(fake_s3_release(s3, rule, true, &seq), 0);
    pthread_join(second.thread, NULL);
    assert_int_equal(second.result, 0);
    assert_true(fake_s3_holds(s3, "k", "second", 6));
    struct fake_s3_request request;
    assert_int_equal(fake_s3_log_get(s3, (size_t)seq, &request), 0);
    assert_true(request.done);
    assert_int_equal(request.length, 6);
    assert_int_equal(fake_s3_release(s3, rule, false, NULL), 0);
    pthread_join(first.thread, NULL);
    assert_true(fake_s3_holds(s3, "k", "first", 5));
    assert_int_equal(fake_s3_release(s3, rule, false, NULL), ENOENT);

    /* a prefix rule, any call; clearing it lets its requests go */
    assert_int_equal(fake_s3_hold(s3, FAKE_S3_UNDER(0, "d/"),
                                  &rule_all), 0);
    put_start(&first, s3, "d/x", "x");
    assert_int_equal(fake_s3_wait_held(s3, rule_all, 1), 0);
    fake_s3_hold_clear(s3, rule_all);
    pthread_join(first.thread, NULL);
    assert_int_equal(first.result, 0);
    assert_int_equal(fake_s3_held(s3, 0), 0);
    assert_int_equal(fake_s3_count(s3, ON(FAKE_S3_PUT, NULL)), 4);
    /* the rule on "k" still holds */
    put_start(&first, s3, "k", "third");
    assert_int_equal(fake_s3_wait_held(s3, rule, 1), 0);
    fake_s3_release_all(s3, 0);
    pthread_join(first.thread, NULL);
    assert_true(fake_s3_holds(s3, "k", "third", 5));
    assert_int_equal(fake_s3_wait_idle(s3), 0);
}

static void test_failures_and_lost_answers(void **state)
{
    struct s3_client *s3 = *state;
    struct s3_body body = {.data = "data", .length = 4};
    struct s3_object_info info;
    char etag[S3_ETAG_MAX];
    unsigned rule = 0;

    /* the next 2 PUTs of "f" fail before acting */
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_PUT, "f"),
                                  2, EIO, false, &rule), 0);
    assert_int_equal(s3_put_object(s3, "f", &body, NULL, etag), EIO);
    assert_int_equal(s3_put_object(s3, "g", &body, NULL, etag), 0);
    assert_int_equal(s3_put_object(s3, "f", &body, NULL, etag), EIO);
    assert_int_equal(s3_head_object(s3, "f", &info), ENOENT);
    assert_int_equal(s3_put_object(s3, "f", &body, NULL, etag), 0);

    /* lost answers: the work is done, the error returned */
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_DELETE, NULL),
                                  1, ETIMEDOUT, true, NULL), 0);
    assert_int_equal(s3_delete_object(s3, "f"), ETIMEDOUT);
    assert_int_equal(s3_head_object(s3, "f", &info), ENOENT);
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_PUT, "h"),
                                  FAKE_S3_ALWAYS, EIO, true, &rule), 0);
    assert_int_equal(s3_put_object(s3, "h", &body, NULL, etag), EIO);
    assert_true(fake_s3_holds(s3, "h", "data", 4));
    assert_int_equal(s3_put_object(s3, "h", &body, NULL, etag), EIO);
    fake_s3_fail_clear(s3, rule);
    assert_int_equal(s3_put_object(s3, "h", &body, NULL, etag), 0);

    /* a GET whose answer breaks off: half the range delivered, then the
     * error */
    unsigned char buf[64];
    struct collector c = {.bytes = buf, .cap = sizeof(buf)};
    struct s3_sink sink = {collect, &c};
    uint64_t delivered = 0;
    assert_int_equal(fake_s3_put(s3, "r", "0123456789", 10, NULL, NULL), 0);
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_GET, NULL),
                                  1, ECONNRESET, true, NULL), 0);
    assert_int_equal(s3_get_object_stream(s3, "r", 0, 10, NULL, &sink,
                                          &delivered, NULL), ECONNRESET);
    assert_int_equal(delivered, 5);
    assert_memory_equal(buf, "01234", 5);

    /* a complete whose answer is lost: done, and the client's check (one
     * HEAD: the multipart ETag of these parts) takes it as done */
    size_t size = 5 * MIB + 1;
    unsigned char *bytes = pattern(size, 3);
    char parts[2][S3_ETAG_MAX], expected[S3_ETAG_MAX];
    const char *part_etags[2] = {parts[0], parts[1]};
    char *upload_id = NULL;
    assert_int_equal(s3_multipart_create(s3, "m", NULL, &upload_id), 0);
    assert_int_equal(upload_part(s3, "m", upload_id, 1, bytes, 5 * MIB,
                                 parts[0]), 0);
    assert_int_equal(upload_part(s3, "m", upload_id, 2, bytes + 5 * MIB, 1,
                                 parts[1]), 0);
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_MP_COMPLETE, NULL),
                                  1, EIO, true, NULL), 0);
    size_t before = fake_s3_log_count(s3);
    struct s3_body whole = {.fd = -1, .length = size};
    assert_int_equal(s3_multipart_complete_object(s3, "m", upload_id,
                                                  part_etags, 2, &whole, etag),
                     0);
    fake_s3_multipart_etag_of(bytes, size, 5 * MIB, expected);
    assert_string_equal(etag, expected);
    long complete = fake_s3_log_find(s3, before, ON(FAKE_S3_MP_COMPLETE, NULL));
    long head = fake_s3_log_find(s3, before, ON(FAKE_S3_HEAD, "m"));
    assert_true(complete >= 0 && head > complete);
    struct fake_s3_request request;
    assert_int_equal(fake_s3_log_get(s3, (size_t)complete, &request), 0);
    assert_int_equal(request.result, EIO);
    /* a complete that fails before acting is not taken as done */
    free(upload_id);
    assert_int_equal(s3_multipart_create(s3, "n", NULL, &upload_id), 0);
    assert_int_equal(upload_part(s3, "n", upload_id, 1, bytes, 10, parts[0]),
                     0);
    assert_int_equal(fake_s3_fail(s3, ON(FAKE_S3_MP_COMPLETE, NULL),
                                  1, EIO, false, NULL), 0);
    assert_int_equal(s3_multipart_complete(s3, "n", upload_id, part_etags, 1,
                                           etag), EIO);
    assert_int_equal(s3_head_object(s3, "n", &info), ENOENT);
    assert_int_equal(fake_s3_uploads(s3, "n"), 1);
    free(upload_id);
    free(bytes);

    struct s3_stats stats;
    s3_client_stats(s3, &stats);
    assert_true(stats.failures >= 8);
}

static void test_log_and_bucket_hooks(void **state)
{
    struct s3_client *s3 = *state;
    struct s3_object_info info;
    char etag[S3_ETAG_MAX];
    char **keys = NULL;
    size_t count = 0;
    void *data = NULL;
    size_t len = 0;

    put_text(s3, "d/f", "v1", NULL);
    assert_int_equal(s3_delete_object(s3, "d/f"), 0);
    put_text(s3, "e/f", "v2", NULL);
    long deleted = fake_s3_log_find(s3, 0, ON(FAKE_S3_DELETE, "d/f"));
    long put =
        fake_s3_log_find(s3, 0, FAKE_S3_UNDER(FAKE_S3_CALL(FAKE_S3_PUT), "e/"));
    assert_true(deleted >= 0 && put > deleted);
    assert_int_equal(fake_s3_log_find(s3, (size_t)put + 1, NULL), -1);
    assert_int_equal(fake_s3_count(s3, NULL), 3);
    assert_int_equal(fake_s3_wait_count(s3, NULL, 3), 0);
    struct fake_s3_request request;
    assert_int_equal(fake_s3_log_get(s3, (size_t)put, &request), 0);
    fake_s3_etag_of("v2", 2, etag);
    assert_string_equal(request.etag, etag);
    assert_int_equal(request.seq, 2);

    /* another client, behind the client's back: not logged */
    struct s3_put_meta meta = {.has_mtime = true, .mtime = {.tv_sec = 5}};
    assert_int_equal(fake_s3_put(s3, "x/1", "abc", 3, &meta, etag), 0);
    assert_int_equal(fake_s3_put(s3, "x/0", "", 0, NULL, NULL), 0);
    assert_int_equal(fake_s3_get(s3, "x/1", &data, &len, &info), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(data, "abc", 3);
    assert_string_equal(info.etag, etag);
    assert_int_equal(info.mtime.tv_sec, 5);
    free(data);
    assert_int_equal(fake_s3_get(s3, "x/0", &data, &len, NULL), 0);
    assert_int_equal(len, 0);
    free(data);
    assert_int_equal(fake_s3_get(s3, "x/2", &data, &len, NULL), ENOENT);
    assert_int_equal(fake_s3_keys(s3, "x/", &keys, &count), 0);
    assert_int_equal(count, 2);
    assert_string_equal(keys[0], "x/0");
    assert_string_equal(keys[1], "x/1");
    fake_s3_keys_free(keys, count);
    assert_true(fake_s3_delete(s3, "x/1"));
    assert_false(fake_s3_delete(s3, "x/1"));
    assert_int_equal(fake_s3_count(s3, NULL), 3);

    fake_s3_log_clear(s3);
    assert_int_equal(fake_s3_log_count(s3), 0);
    struct s3_stats stats;
    s3_client_stats(s3, &stats);
    assert_int_equal(stats.requests[S3_OP_PUT], 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_head_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streamed_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multipart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_condition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conditional_writes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hold_and_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures_and_lost_answers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_log_and_bucket_hooks, setup,
                                        teardown),
    };
    log_set_level(LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
