/*
 * fuzz_s3xml.c - libFuzzer target for the S3 XML parsers (src/s3xml.c).
 *
 * Each input is a response body, handed to every public parser in turn
 * (listing, error, upload id, ETag result with and without an error
 * struct), and its first line to s3xml_parse_time(). Beyond ASan and UBSan,
 * the target checks what s3xml.h promises: only the errno values listed,
 * empty outputs after a failure, every string produced at most
 * S3XML_MAX_TEXT bytes, valid UTF-8 but in keys and prefixes, which are
 * bytes as the server holds them (expat hands out nothing else, bytes XML
 * cannot carry read as '|', and truncation must not split a sequence),
 * keys, prefixes and the keys left out never empty, a
 * truncated page always with a token, times that gmtime() turns back into
 * the digits they came from, and results that do not depend on where the
 * body is cut into feeds. A broken promise aborts, which libFuzzer reports
 * as a crash.
 */
#define _GNU_SOURCE /* memmem() */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "s3/s3xml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz_s3xml: %s:%d: check failed: %s\n",       \
                    __FILE__, __LINE__, #cond);                            \
            abort();                                                       \
        }                                                                  \
    } while (0)

/* Well-formed UTF-8 (no overlongs, surrogates or code points past
 * U+10FFFF), the subset expat produces. */
static bool utf8_ok(const char *text)
{
    const unsigned char *s = (const unsigned char *)text;

    while (*s != 0) {
        unsigned extra;
        uint32_t code;

        if (*s < 0x80) {
            s++;
            continue;
        }
        if ((*s & 0xE0) == 0xC0) {
            extra = 1;
            code = *s & 0x1F;
        } else if ((*s & 0xF0) == 0xE0) {
            extra = 2;
            code = *s & 0x0F;
        } else if ((*s & 0xF8) == 0xF0) {
            extra = 3;
            code = *s & 0x07;
        } else {
            return false;
        }
        for (unsigned i = 1; i <= extra; i++) {
            if ((s[i] & 0xC0) != 0x80)
                return false;
            code = code << 6 | (s[i] & 0x3F);
        }
        if ((extra == 1 && code < 0x80) || (extra == 2 && code < 0x800) ||
            (extra == 3 && code < 0x10000) || code > 0x10FFFF ||
            (code >= 0xD800 && code <= 0xDFFF))
            return false;
        s += extra + 1;
    }
    return true;
}

/* A string a parser handed out: present, capped, UTF-8. */
static void check_text(const char *text, bool may_be_empty)
{
    CHECK(text != NULL);
    CHECK(strlen(text) <= S3XML_MAX_TEXT);
    CHECK(may_be_empty || text[0] != '\0');
    CHECK(utf8_ok(text));
}

/* A key or prefix: present, capped, not empty; any bytes. */
static void check_key(const char *key)
{
    CHECK(key != NULL);
    CHECK(strlen(key) <= S3XML_MAX_TEXT);
    CHECK(key[0] != '\0');
}

static bool all_zero(const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++)
        if (b[i] != 0)
            return false;
    return true;
}

static void check_error_struct(const struct s3xml_error *err)
{
    CHECK(memchr(err->code, '\0', sizeof(err->code)) != NULL);
    CHECK(memchr(err->message, '\0', sizeof(err->message)) != NULL);
    CHECK(utf8_ok(err->code));
    CHECK(utf8_ok(err->message));
}

static void fuzz_listing(const char *body, size_t len)
{
    struct s3xml_listing listing;
    int rc = s3xml_parse_listing(body, len, &listing);

    CHECK(rc == 0 || rc == EPROTO || rc == EOVERFLOW || rc == ENOMEM);
    if (rc != 0) {
        CHECK(all_zero(&listing, sizeof(listing)));
        return;
    }
    CHECK(listing.object_count == 0 || listing.objects != NULL);
    CHECK(listing.prefix_count == 0 || listing.prefixes != NULL);
    for (size_t i = 0; i < listing.object_count; i++) {
        const struct s3xml_object *obj = &listing.objects[i];

        check_key(obj->key);
        check_text(obj->etag, true);
        CHECK(obj->mtime.tv_nsec >= 0 && obj->mtime.tv_nsec < 1000000000L);
    }
    for (size_t i = 0; i < listing.prefix_count; i++)
        check_key(listing.prefixes[i]);
    CHECK(listing.skipped_count == 0 || listing.skipped != NULL);
    for (size_t i = 0; i < listing.skipped_count; i++)
        check_key(listing.skipped[i]);
    if (listing.next_token != NULL)
        check_text(listing.next_token, false);
    CHECK(!listing.truncated || listing.next_token != NULL);
    s3xml_listing_free(&listing);
    CHECK(all_zero(&listing, sizeof(listing)));
    s3xml_listing_free(&listing);       /* safe twice */
}

static void fuzz_error(const char *body, size_t len)
{
    struct s3xml_error err;
    int rc = s3xml_parse_error(body, len, &err);

    CHECK(rc == 0 || rc == EPROTO || rc == ENOMEM);
    check_error_struct(&err);
    if (rc != 0)
        CHECK(all_zero(&err, sizeof(err)));
}

static void fuzz_upload_id(const char *body, size_t len)
{
    char *upload_id = (char *)"unset";  /* must be overwritten */
    int rc = s3xml_parse_upload_id(body, len, &upload_id);

    CHECK(rc == 0 || rc == EPROTO || rc == ENOMEM);
    if (rc != 0) {
        CHECK(upload_id == NULL);
        return;
    }
    check_text(upload_id, false);
    free(upload_id);
}

static void fuzz_etag_result(const char *body, size_t len, bool want_error)
{
    struct s3xml_error err;
    char *etag = (char *)"unset";       /* must be overwritten */
    int rc = s3xml_parse_etag_result(body, len, &etag,
                                     want_error ? &err : NULL);

    CHECK(rc == 0 || rc == EIO || rc == EPROTO || rc == ENOMEM);
    if (want_error) {
        check_error_struct(&err);
        if (rc != EIO)
            CHECK(all_zero(&err, sizeof(err)));
    }
    if (rc != 0) {
        CHECK(etag == NULL);
        return;
    }
    check_text(etag, false);
    free(etag);
}

/* Value of the N digits at S, or -1 if they are not all digits. */
static int digits_at(const char *s, int n)
{
    int v = 0;

    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* The input's first line as a timestamp. An accepted one must name the
 * instant gmtime() turns back into the same fields. */
static void fuzz_time(const uint8_t *data, size_t size)
{
    size_t len = 0;
    struct timespec ts;
    struct tm tm;
    char *text;
    int rc;

    while (len < size && len < 64 && data[len] != '\n' && data[len] != '\0')
        len++;
    text = malloc(len + 1);
    if (text == NULL)
        return;
    memcpy(text, data, len);
    text[len] = '\0';
    rc = s3xml_parse_time(text, &ts);
    CHECK(rc == 0 || rc == EINVAL);
    if (rc != 0) {
        CHECK(ts.tv_sec == 0 && ts.tv_nsec == 0);
    } else {
        CHECK(len >= 20);
        CHECK(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
        CHECK(gmtime_r(&ts.tv_sec, &tm) != NULL);
        CHECK(tm.tm_year + 1900 == digits_at(text, 4));
        CHECK(tm.tm_mon + 1 == digits_at(text + 5, 2));
        CHECK(tm.tm_mday == digits_at(text + 8, 2));
        CHECK(tm.tm_hour == digits_at(text + 11, 2));
        CHECK(tm.tm_min == digits_at(text + 14, 2));
        CHECK(tm.tm_sec == digits_at(text + 17, 2));
    }
    free(text);
}

/* s3xml.c feeds expat 64 KiB at a time; inputs are shorter than that. */
#define FEED_CHUNK 65536

static bool same_text(const char *a, const char *b)
{
    return (a == NULL && b == NULL) ||
           (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static bool same_listing(const struct s3xml_listing *a,
                         const struct s3xml_listing *b)
{
    if (a->object_count != b->object_count ||
        a->prefix_count != b->prefix_count ||
        a->skipped_count != b->skipped_count || a->truncated != b->truncated ||
        !same_text(a->next_token, b->next_token))
        return false;
    for (size_t i = 0; i < a->skipped_count; i++)
        if (!same_text(a->skipped[i], b->skipped[i]))
            return false;
    for (size_t i = 0; i < a->object_count; i++) {
        const struct s3xml_object *x = &a->objects[i], *y = &b->objects[i];

        if (!same_text(x->key, y->key) || !same_text(x->etag, y->etag) ||
            x->size != y->size || x->mtime.tv_sec != y->mtime.tv_sec ||
            x->mtime.tv_nsec != y->mtime.tv_nsec)
            return false;
    }
    for (size_t i = 0; i < a->prefix_count; i++)
        if (!same_text(a->prefixes[i], b->prefixes[i]))
            return false;
    return true;
}

/*
 * Whatever way a body is cut into feeds, it parses the same. A body that
 * starts with an XML declaration is parsed again with white space after
 * the declaration (which XML allows there), as much as moves the first
 * 64 KiB feed boundary to an offset of the document picked from the
 * input; results and errors must not change.
 */
static void fuzz_feed_boundary(const char *body, size_t len)
{
    struct s3xml_listing one, two;
    struct s3xml_error err_one, err_two;
    char *value_one = NULL, *value_two = NULL;
    const char *decl_end;
    size_t head, tail, at, padded_len;
    char *padded;
    int rc_one, rc_two;

    if (len < 7 || memcmp(body, "<?xml", 5) != 0)
        return;
    decl_end = memmem(body, len, "?>", 2);
    if (decl_end == NULL)
        return;
    head = (size_t)(decl_end + 2 - body);
    tail = len - head;
    if (tail == 0)
        return;
    at = (len * 2654435761u + (unsigned char)body[len / 2]) % tail;
    padded_len = FEED_CHUNK - at + tail;
    padded = malloc(padded_len);
    if (padded == NULL)
        return;
    memcpy(padded, body, head);
    memset(padded + head, '\n', FEED_CHUNK - at - head);
    memcpy(padded + FEED_CHUNK - at, body + head, tail);

    rc_one = s3xml_parse_listing(body, len, &one);
    rc_two = s3xml_parse_listing(padded, padded_len, &two);
    CHECK(rc_one == rc_two);
    CHECK(same_listing(&one, &two));
    s3xml_listing_free(&one);
    s3xml_listing_free(&two);

    rc_one = s3xml_parse_error(body, len, &err_one);
    rc_two = s3xml_parse_error(padded, padded_len, &err_two);
    CHECK(rc_one == rc_two);
    CHECK(memcmp(&err_one, &err_two, sizeof(err_one)) == 0);

    rc_one = s3xml_parse_etag_result(body, len, &value_one, &err_one);
    rc_two = s3xml_parse_etag_result(padded, padded_len, &value_two,
                                     &err_two);
    CHECK(rc_one == rc_two);
    CHECK(same_text(value_one, value_two));
    CHECK(memcmp(&err_one, &err_two, sizeof(err_one)) == 0);
    free(value_one);
    free(value_two);
    free(padded);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* libFuzzer hands each input in a heap block of exactly SIZE bytes,
     * so ASan sees any read past the body's end. */
    const char *body = (const char *)data;

    fuzz_listing(body, size);
    fuzz_error(body, size);
    fuzz_upload_id(body, size);
    fuzz_etag_result(body, size, true);
    fuzz_etag_result(body, size, false);
    fuzz_time(data, size);
    if (size < FEED_CHUNK / 2)
        fuzz_feed_boundary(body, size);
    return 0;
}
