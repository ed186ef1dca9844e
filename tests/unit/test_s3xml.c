/*
 * test_s3xml.c - unit tests for the S3 XML body parsers (src/s3xml.c).
 *
 * Bodies are modelled on what the servers we meet actually send: AWS as
 * documented (pretty-printed, default namespace, &quot;-quoted ETags),
 * s3rver (no white space, a misspelt namespace, no NextContinuationToken on
 * the last page) and OpenStack Swift s3api (lxml output: single-quoted XML
 * declaration, <Prefix/>, raw '"' in ETags, Python quote() for
 * EncodingType=url). Hostile and broken bodies check that every failure is
 * a clean errno with empty outputs.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "s3/s3xml.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define XML_DECL "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define S3_NS "http://s3.amazonaws.com/doc/2006-03-01/"
#define LBR_PAGE(inner) XML_DECL "<ListBucketResult xmlns=\"" S3_NS "\">" \
    "<IsTruncated>false</IsTruncated>" inner "</ListBucketResult>"

/* ------------------------------------------------------------ helpers */

struct buf {
    char *p;
    size_t len;
    size_t cap;
};

static void buf_add(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void buf_add(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;

        while (ncap < b->len + (size_t)n + 1)
            ncap *= 2;
        b->p = realloc(b->p, ncap);
        assert_non_null(b->p);
        b->cap = ncap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void buf_repeat(struct buf *b, const char *s, size_t times)
{
    for (size_t i = 0; i < times; i++)
        buf_add(b, "%s", s);
}

static int parse_listing_str(const char *body, struct s3xml_listing *out)
{
    return s3xml_parse_listing(body, strlen(body), out);
}

/* Fill with junk so that the tests see whether a parser clears outputs. */
static void poison_listing(struct s3xml_listing *l)
{
    static char junk[] = "junk";

    l->objects = (struct s3xml_object *)(void *)junk;
    l->object_count = 7;
    l->prefixes = (char **)(void *)junk;
    l->prefix_count = 7;
    l->truncated = true;
    l->next_token = junk;
    l->skipped = (char **)(void *)junk;
    l->skipped_count = 7;
}

static void assert_listing_empty(const struct s3xml_listing *l)
{
    assert_null(l->objects);
    assert_int_equal(l->object_count, 0);
    assert_null(l->prefixes);
    assert_int_equal(l->prefix_count, 0);
    assert_false(l->truncated);
    assert_null(l->next_token);
    assert_null(l->skipped);
    assert_int_equal(l->skipped_count, 0);
}

/* Expect RC from parsing BODY as a listing, and nothing left behind. */
static void expect_listing_fails(const char *name, const char *body,
                                 size_t len, int want)
{
    struct s3xml_listing l;
    int rc;

    poison_listing(&l);
    rc = s3xml_parse_listing(body, len, &l);
    if (rc != want)
        fail_msg("%s: rc %d (%s), want %d (%s)", name, rc, strerror(rc),
                 want, strerror(want));
    assert_listing_empty(&l);
    s3xml_listing_free(&l);
}

/* ------------------------------------------------- realistic listings */

static const char aws_listing[] =
    XML_DECL
    "<ListBucketResult xmlns=\"" S3_NS "\">\n"
    "    <Name>example-bucket</Name>\n"
    "    <Prefix>photos/</Prefix>\n"
    "    <KeyCount>5</KeyCount>\n"
    "    <MaxKeys>1000</MaxKeys>\n"
    "    <Delimiter>/</Delimiter>\n"
    "    <IsTruncated>false</IsTruncated>\n"
    "    <Contents>\n"
    "        <Key>photos/sample.jpg</Key>\n"
    "        <LastModified>2009-10-12T17:50:30.000Z</LastModified>\n"
    "        <ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>\n"
    "        <ChecksumAlgorithm>CRC32</ChecksumAlgorithm>\n"
    "        <Size>434234</Size>\n"
    "        <StorageClass>STANDARD</StorageClass>\n"
    "        <Owner>\n"
    "            <ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID>\n"
    "            <DisplayName>mtd@amazon.com</DisplayName>\n"
    "        </Owner>\n"
    "    </Contents>\n"
    "    <Contents>\n"
    "        <Key>photos/empty</Key>\n"
    "        <LastModified>2019-06-05T13:45:12.345Z</LastModified>\n"
    "        <ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag>\n"
    "        <Size>0</Size>\n"
    "        <StorageClass>STANDARD</StorageClass>\n"
    "    </Contents>\n"
    "    <Contents>\n"
    "        <Key>photos/video.mp4</Key>\n"
    "        <LastModified>2020-02-29T23:59:59.999Z</LastModified>\n"
    "        <ETag>&quot;3858f62230ac3c915f300c664312c11f-9&quot;</ETag>\n"
    "        <Size>5368709120</Size>\n"
    "        <StorageClass>GLACIER</StorageClass>\n"
    "        <RestoreStatus><IsRestoreInProgress>false</IsRestoreInProgress>"
    "</RestoreStatus>\n"
    "    </Contents>\n"
    "    <CommonPrefixes>\n"
    "        <Prefix>photos/2006/</Prefix>\n"
    "    </CommonPrefixes>\n"
    "    <CommonPrefixes>\n"
    "        <Prefix>photos/2007/</Prefix>\n"
    "    </CommonPrefixes>\n"
    "</ListBucketResult>\n";

static void test_listing_aws(void **state)
{
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(aws_listing, &l), 0);
    assert_int_equal(l.object_count, 3);
    assert_string_equal(l.objects[0].key, "photos/sample.jpg");
    assert_int_equal(l.objects[0].size, 434234);
    assert_string_equal(l.objects[0].etag,
                        "\"fba9dede5f27731c9771645a39863328\"");
    assert_int_equal(l.objects[0].mtime.tv_sec, 1255369830);
    assert_int_equal(l.objects[0].mtime.tv_nsec, 0);
    assert_string_equal(l.objects[1].key, "photos/empty");
    assert_int_equal(l.objects[1].size, 0);
    assert_int_equal(l.objects[1].mtime.tv_sec, 1559742312);
    assert_int_equal(l.objects[1].mtime.tv_nsec, 345000000);
    assert_string_equal(l.objects[2].etag,
                        "\"3858f62230ac3c915f300c664312c11f-9\"");
    assert_int_equal(l.objects[2].size, UINT64_C(5368709120));
    assert_int_equal(l.objects[2].mtime.tv_sec, 1583020799);
    assert_int_equal(l.objects[2].mtime.tv_nsec, 999000000);
    /* The top-level <Prefix>photos/</Prefix> is not a common prefix. */
    assert_int_equal(l.prefix_count, 2);
    assert_string_equal(l.prefixes[0], "photos/2006/");
    assert_string_equal(l.prefixes[1], "photos/2007/");
    assert_false(l.truncated);
    assert_null(l.next_token);
    s3xml_listing_free(&l);
    assert_listing_empty(&l);
}

/* s3rver: fast-xml-parser output, namespace misspelt as doc.s3.amazonaws.com,
 * Owner only with fetch-owner, no NextContinuationToken when complete. */
static const char s3rver_listing[] =
    XML_DECL
    "<ListBucketResult xmlns=\"http://doc.s3.amazonaws.com/2006-03-01/\">"
    "<Name>bucket-a</Name><Prefix></Prefix><KeyCount>2</KeyCount>"
    "<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
    "<IsTruncated>false</IsTruncated>"
    "<Contents><Key>file with space.txt</Key>"
    "<LastModified>2023-11-14T08:02:01.123Z</LastModified>"
    "<ETag>&quot;5d41402abc4b2a76b9719d911017c592&quot;</ETag>"
    "<Size>5</Size><Owner><ID>123456789000</ID>"
    "<DisplayName>S3rver</DisplayName></Owner>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>R&amp;D+notes #1.md</Key>"
    "<LastModified>2006-02-03T16:45:09.000Z</LastModified>"
    "<ETag>&quot;7215ee9c7d9dc229d2921a40e899ec5f&quot;</ETag>"
    "<Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"
    "<CommonPrefixes><Prefix>dir/</Prefix></CommonPrefixes>"
    "</ListBucketResult>";

static void test_listing_s3rver(void **state)
{
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(s3rver_listing, &l), 0);
    assert_int_equal(l.object_count, 2);
    assert_string_equal(l.objects[0].key, "file with space.txt");
    assert_string_equal(l.objects[0].etag,
                        "\"5d41402abc4b2a76b9719d911017c592\"");
    assert_int_equal(l.objects[0].size, 5);
    assert_int_equal(l.objects[0].mtime.tv_sec, 1699948921);
    assert_int_equal(l.objects[0].mtime.tv_nsec, 123000000);
    assert_string_equal(l.objects[1].key, "R&D+notes #1.md");
    assert_int_equal(l.objects[1].mtime.tv_sec, 1138985109);
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "dir/");
    assert_false(l.truncated);
    assert_null(l.next_token);
    s3xml_listing_free(&l);
}

/* Swift s3api (lxml): single-quoted declaration, <Prefix/>, a raw '"' in the
 * ETag, Python quote() for keys (safe='/', so '/' stays, '+' is %2B). */
static const char swift_listing[] =
    "<?xml version='1.0' encoding='UTF-8'?>\n"
    "<ListBucketResult xmlns=\"" S3_NS "\">"
    "<Name>c1</Name><Prefix/>"
    "<NextContinuationToken>ZGlyJTJCcGx1cy8=</NextContinuationToken>"
    "<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><Delimiter>/</Delimiter>"
    "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
    "<Contents><Key>caf%C3%A9%20menu%2B1.txt</Key>"
    "<LastModified>2024-03-01T09:00:00.000Z</LastModified>"
    "<ETag>\"0cc175b9c0f1b6a831c399e269772661\"</ETag><Size>1</Size>"
    "<Owner><ID>test:tester</ID><DisplayName>test:tester</DisplayName>"
    "</Owner><StorageClass>STANDARD</StorageClass></Contents>"
    "<CommonPrefixes><Prefix>dir%2Bplus/</Prefix></CommonPrefixes>"
    "</ListBucketResult>";

static void test_listing_swift(void **state)
{
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(swift_listing, &l), 0);
    assert_int_equal(l.object_count, 1);
    assert_string_equal(l.objects[0].key, "caf\xC3\xA9 menu+1.txt");
    assert_string_equal(l.objects[0].etag,
                        "\"0cc175b9c0f1b6a831c399e269772661\"");
    assert_int_equal(l.objects[0].mtime.tv_sec, 1709283600);
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "dir+plus/");
    assert_true(l.truncated);
    /* Tokens are opaque: never URL-decoded. */
    assert_string_equal(l.next_token, "ZGlyJTJCcGx1cy8=");
    s3xml_listing_free(&l);
}

static void test_listing_without_namespace(void **state)
{
    static const char body[] =
        "<ListBucketResult><IsTruncated>false</IsTruncated>"
        "<Contents><Key>k</Key><Size>3</Size></Contents>"
        "</ListBucketResult>";
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(l.object_count, 1);
    assert_string_equal(l.objects[0].key, "k");
    /* Optional metadata missing: empty ETag, zero time. */
    assert_string_equal(l.objects[0].etag, "");
    assert_int_equal(l.objects[0].mtime.tv_sec, 0);
    assert_int_equal(l.objects[0].mtime.tv_nsec, 0);
    s3xml_listing_free(&l);
}

static void test_listing_prefixed_namespace(void **state)
{
    static const char body[] =
        "<s3:ListBucketResult xmlns:s3=\"" S3_NS "\">"
        "<s3:IsTruncated>false</s3:IsTruncated>"
        "<s3:CommonPrefixes><s3:Prefix>a/</s3:Prefix></s3:CommonPrefixes>"
        "</s3:ListBucketResult>";
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "a/");
    s3xml_listing_free(&l);
}

/* Unknown elements are skipped wherever they are, and a captured name only
 * counts in its own place: Key/Size only inside Contents, Prefix only inside
 * CommonPrefixes, IsTruncated only directly under the root. */
static void test_listing_unknown_elements(void **state)
{
    static const char body[] =
        "<ListBucketResult xmlns=\"" S3_NS "\">"
        "<Prefix>top/</Prefix><StartAfter>a</StartAfter>"
        "<FutureExtension><Key>no</Key><Size>x</Size><Prefix>no/</Prefix>"
        "<IsTruncated>maybe</IsTruncated></FutureExtension>"
        "<Contents><Key>k</Key><Size>1</Size><Prefix>no/</Prefix>"
        "<Owner><Key>no</Key><Size>x</Size><ETag>no</ETag></Owner>"
        "<IsTruncated>maybe</IsTruncated>"
        "<ChecksumType>FULL_OBJECT</ChecksumType></Contents>"
        "<CommonPrefixes><Prefix>p/</Prefix><Key>no</Key><Size>x</Size>"
        "<Extra><Prefix>no/</Prefix></Extra></CommonPrefixes>"
        "<IsTruncated>false</IsTruncated>"
        "<?processing instruction?><!-- a comment -->"
        "</ListBucketResult>";
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(l.object_count, 1);
    assert_string_equal(l.objects[0].key, "k");
    assert_string_equal(l.objects[0].etag, "");
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "p/");
    assert_false(l.truncated);
    s3xml_listing_free(&l);
}

static void test_listing_empty(void **state)
{
    static const char *const bodies[] = {
        XML_DECL "<ListBucketResult xmlns=\"" S3_NS "\"><Name>b</Name>"
        "<Prefix>nothing/</Prefix><KeyCount>0</KeyCount>"
        "<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
        "<IsTruncated>false</IsTruncated></ListBucketResult>",
        "<ListBucketResult xmlns=\"" S3_NS "\"/>",
        "<ListBucketResult><IsTruncated>false</IsTruncated>"
        "<NextContinuationToken/></ListBucketResult>",
        "\r\n  <ListBucketResult></ListBucketResult>\n\n",
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bodies); i++) {
        struct s3xml_listing l;
        int rc;

        poison_listing(&l);
        rc = parse_listing_str(bodies[i], &l);
        if (rc != 0)
            fail_msg("body %zu: rc %d", i, rc);
        assert_listing_empty(&l);
        s3xml_listing_free(&l);
    }
}

static void test_listing_truncated(void **state)
{
    static const char body[] =
        XML_DECL "<ListBucketResult xmlns=\"" S3_NS "\">"
        "<Name>b</Name><Prefix></Prefix>"
        "<ContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
        "</ContinuationToken>"
        "<NextContinuationToken>1w41l63U0xa8q7smH50vCxyTQqdxo69O3EmK28Bi5PcR"
        "OI4wI/EyIJg==</NextContinuationToken>"
        "<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>"
        "<IsTruncated>true</IsTruncated>"
        "<Contents><Key>a</Key><LastModified>2014-11-21T19:40:05.000Z"
        "</LastModified><ETag>&quot;70ee1738b6b21e2c8a43f3a5ab0eee71&quot;"
        "</ETag><Size>111</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents>"
        "<Contents><Key>b</Key><LastModified>2014-11-21T19:40:05.000Z"
        "</LastModified><ETag>&quot;70ee1738b6b21e2c8a43f3a5ab0eee71&quot;"
        "</ETag><Size>222</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents></ListBucketResult>";
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_true(l.truncated);
    assert_string_equal(l.next_token,
                        "1w41l63U0xa8q7smH50vCxyTQqdxo69O3EmK28Bi5PcROI4wI/"
                        "EyIJg==");
    assert_int_equal(l.object_count, 2);
    assert_int_equal(l.objects[1].size, 222);
    assert_int_equal(l.objects[1].mtime.tv_sec, 1416598805);
    s3xml_listing_free(&l);
}

/* A token on the last page (some servers send one) is kept as is. */
static void test_listing_token_not_truncated(void **state)
{
    static const char body[] =
        "<ListBucketResult><IsTruncated>false</IsTruncated>"
        "<NextContinuationToken>tok</NextContinuationToken>"
        "</ListBucketResult>";
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_false(l.truncated);
    assert_string_equal(l.next_token, "tok");
    s3xml_listing_free(&l);
}

/* ------------------------------------------------------ awkward keys */

struct key_case {
    const char *name;
    bool url;             /* send <EncodingType>url</EncodingType> */
    const char *xml;      /* key text as it appears in the body */
    const char *want;     /* decoded key */
};

static const struct key_case key_cases[] = {
    { "utf8", false, "\xE6\x97\xA5\xE6\x9C\xAC/\xE3\x83\x95\xE3\x82\xA1"
      "\xE3\x82\xA4\xE3\x83\xAB.txt",
      "\xE6\x97\xA5\xE6\x9C\xAC/\xE3\x83\x95\xE3\x82\xA1\xE3\x82\xA4\xE3\x83"
      "\xAB.txt" },
    { "amp", false, "a&amp;b", "a&b" },
    { "all entities", false, "Tom &amp; Jerry &lt;1&gt; &apos;x&apos; "
      "&quot;y&quot;", "Tom & Jerry <1> 'x' \"y\"" },
    { "spaces kept", false, "  lead and trail  ", "  lead and trail  " },
    { "plus", false, "plus+sign", "plus+sign" },
    { "percent not decoded", false, "100% and %41", "100% and %41" },
    { "hash and query", false, "hash#tag?q=1", "hash#tag?q=1" },
    { "char ref emoji", false, "&#x1F600; face", "\xF0\x9F\x98\x80 face" },
    { "cdata", false, "<![CDATA[a<b&c]]>", "a<b&c" },
    { "char ref CR", false, "cr&#13;lf", "cr\rlf" },
    { "tab", false, "tab\there", "tab\there" },
    /* A key is what the server holds: a raw CR (s3rver sends keys as they
     * are) is the key's own, not an end of line to normalise. */
    { "raw CRLF kept", false, "line\r\nbreak", "line\r\nbreak" },
    { "raw CR kept", false, "cr\rx", "cr\rx" },
    /* Bytes XML 1.0 cannot carry, as servers that ignore encoding-type=url
     * (s3rver) send them: the key as it is, for names.c to refuse. */
    { "raw U+0001", false, "ctl\x01name", "ctl\x01name" },
    { "raw U+001F", false, "ctl\x1f", "ctl\x1f" },
    { "raw controls and entities", false, "a&amp;\x02\x03&lt;b",
      "a&\x02\x03<b" },
    { "raw 0xFF", false, "bad\xffname", "bad\xffname" },
    { "raw bad UTF-8", false, "\xC3\x28", "\xC3\x28" },
    { "raw overlong", false, "\xc0\xaf", "\xc0\xaf" },
    { "raw truncated", false, "a\xe2\x82", "a\xe2\x82" },
    { "raw surrogate", false, "\xed\xa0\x80x", "\xed\xa0\x80x" },
    { "raw U+FFFE", false, "\xef\xbf\xbenonchar", "\xef\xbf\xbenonchar" },
    { "url space", true, "a%20b", "a b" },
    { "url plus literal", true, "a+b", "a+b" },
    { "url plus encoded", true, "a%2Bb", "a+b" },
    { "url utf8", true, "caf%C3%A9", "caf\xC3\xA9" },
    { "url lower hex", true, "%e6%97%a5", "\xE6\x97\xA5" },
    { "url percent", true, "100%25", "100%" },
    { "url hash", true, "hash%23tag", "hash#tag" },
    { "url amp", true, "a%26b", "a&b" },
    { "url amp entity", true, "a&amp;b", "a&b" },
    { "url slash", true, "dir/sub%2Ffile", "dir/sub/file" },
    { "url CR", true, "cr%0Dlf", "cr\rlf" },
    /* Keys are bytes: one that is not UTF-8 is decoded as it is (names.c
     * says it is no name; a rename moves it unchanged). */
    { "url 0xFF", true, "bad%FFname", "bad\xffname" },
    { "url truncated", true, "%C3", "\xC3" },
    { "url overlong", true, "%C0%AF", "\xC0\xAF" },
    { "url surrogate", true, "%ED%A0%80", "\xED\xA0\x80" },
    { "url above U+10FFFF", true, "%F4%90%80%80", "\xF4\x90\x80\x80" },
    { "url U+0001", true, "ctl%01name", "ctl\x01name" },
};

static char *key_body(bool url, const char *key_xml, bool url_after)
{
    struct buf b = { 0 };

    buf_add(&b, XML_DECL "<ListBucketResult xmlns=\"" S3_NS "\">"
            "<Name>b</Name>%s<IsTruncated>false</IsTruncated>",
            url && !url_after ? "<EncodingType>url</EncodingType>" : "");
    buf_add(&b, "<Contents><Key>%s</Key>"
            "<LastModified>2009-10-12T17:50:30.000Z</LastModified>"
            "<ETag>&quot;x&quot;</ETag><Size>1</Size></Contents>"
            "<CommonPrefixes><Prefix>%s/</Prefix></CommonPrefixes>",
            key_xml, key_xml);
    buf_add(&b, "%s</ListBucketResult>",
            url && url_after ? "<EncodingType>url</EncodingType>" : "");
    return b.p;
}

static void test_listing_keys(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(key_cases); i++) {
        const struct key_case *kc = &key_cases[i];

        /* EncodingType may come before or after the keys. */
        for (int after = 0; after <= (kc->url ? 1 : 0); after++) {
            char *body = key_body(kc->url, kc->xml, after);
            struct s3xml_listing l;
            char want_prefix[256];
            int rc = parse_listing_str(body, &l);

            if (rc != 0)
                fail_msg("%s: rc %d", kc->name, rc);
            assert_int_equal(l.object_count, 1);
            assert_int_equal(l.prefix_count, 1);
            if (strcmp(l.objects[0].key, kc->want) != 0)
                fail_msg("%s: key \"%s\", want \"%s\"", kc->name,
                         l.objects[0].key, kc->want);
            snprintf(want_prefix, sizeof(want_prefix), "%s/", kc->want);
            if (strcmp(l.prefixes[0], want_prefix) != 0)
                fail_msg("%s: prefix \"%s\", want \"%s\"", kc->name,
                         l.prefixes[0], want_prefix);
            s3xml_listing_free(&l);
            free(body);
        }
    }
}

/* A key no string can hold (a NUL, decoded or raw) or that cannot be
 * decoded (a bad %-escape) is left out of the page; the rest of the page
 * is listed. */
static void test_listing_unreadable_keys_are_left_out(void **state)
{
    static const char *const bad[] = {
        "%zz", "abc%", "abc%4", "%4g", "%00", "a%00b",
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char *body = key_body(true, bad[i], false);
        struct s3xml_listing l;
        int rc = parse_listing_str(body, &l);

        if (rc != 0)
            fail_msg("%s: rc %d (%s)", bad[i], rc, strerror(rc));
        if (l.object_count != 0 || l.prefix_count != 0)
            fail_msg("%s: %zu objects, %zu prefixes listed", bad[i],
                     l.object_count, l.prefix_count);
        /* kept as sent, for the log line */
        assert_int_equal(l.skipped_count, 2);
        assert_string_equal(l.skipped[0], bad[i]);
        assert_memory_equal(l.skipped[1], bad[i], strlen(bad[i]));
        assert_string_equal(l.skipped[1] + strlen(bad[i]), "/");
        s3xml_listing_free(&l);
        free(body);
    }

    /* between two readable keys, raw and url-encoded */
    static const char raw_nul[] =
        LBR_PAGE("<Contents><Key>a</Key><Size>1</Size></Contents>"
                 "<Contents><Key>b\0c</Key><Size>1</Size></Contents>"
                 "<CommonPrefixes><Prefix>p\0/</Prefix></CommonPrefixes>"
                 "<Contents><Key>d</Key><Size>1</Size></Contents>");
    static const char url_bad[] =
        LBR_PAGE("<EncodingType>url</EncodingType>"
                 "<Contents><Key>a</Key><Size>1</Size></Contents>"
                 "<Contents><Key>b%00c</Key><Size>1</Size></Contents>"
                 "<CommonPrefixes><Prefix>p%zz/</Prefix></CommonPrefixes>"
                 "<CommonPrefixes><Prefix>q/</Prefix></CommonPrefixes>"
                 "<Contents><Key>d%2</Key><Size>1</Size></Contents>"
                 "<Contents><Key>e</Key><Size>1</Size></Contents>");
    struct s3xml_listing l;

    assert_int_equal(s3xml_parse_listing(raw_nul, sizeof(raw_nul) - 1, &l), 0);
    assert_int_equal(l.object_count, 2);
    assert_string_equal(l.objects[0].key, "a");
    assert_string_equal(l.objects[1].key, "d");
    assert_int_equal(l.prefix_count, 0);
    assert_int_equal(l.skipped_count, 2);
    assert_string_equal(l.skipped[0], "b%00c");
    assert_string_equal(l.skipped[1], "p%00/");
    s3xml_listing_free(&l);
    assert_int_equal(parse_listing_str(url_bad, &l), 0);
    assert_int_equal(l.object_count, 2);
    assert_string_equal(l.objects[0].key, "a");
    assert_string_equal(l.objects[1].key, "e");
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "q/");
    assert_int_equal(l.skipped_count, 3);
    assert_string_equal(l.skipped[0], "b%00c");
    assert_string_equal(l.skipped[1], "d%2");
    assert_string_equal(l.skipped[2], "p%zz/");
    s3xml_listing_free(&l);
    assert_listing_empty(&l);
}

/* s3rver ignores encoding-type=url and writes keys into the XML as they
 * are, control characters and all, which XML 1.0 cannot carry: expat
 * refuses such a page. Every key of it is read exactly (what s3rver
 * 3.7 sent for these keys, put with boto3 and curl). */
static const char s3rver_raw_listing[] =
    XML_DECL
    "<ListBucketResult xmlns=\"http://doc.s3.amazonaws.com/2006-03-01/\">"
    "<Name>bkt</Name><Prefix>d/</Prefix><KeyCount>6</KeyCount>"
    "<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
    "<IsTruncated>false</IsTruncated>"
    "<Contents><Key>d/bad%FFname</Key>"
    "<LastModified>2026-12-03T14:19:59.000Z</LastModified>"
    "<ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag><Size>1</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>d/cr\rx</Key>"
    "<LastModified>2026-12-03T14:19:59.000Z</LastModified>"
    "<ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag><Size>1</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>d/ctl\x01name</Key>"
    "<LastModified>2026-12-03T14:19:59.000Z</LastModified>"
    "<ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag><Size>1</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>d/ok</Key>"
    "<LastModified>2026-12-03T14:19:59.000Z</LastModified>"
    "<ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag><Size>2</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>d/\xef\xbf\xbenonchar</Key>"
    "<LastModified>2026-12-03T14:19:59.000Z</LastModified>"
    "<ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag><Size>1</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<CommonPrefixes><Prefix>d/sub\x1b/</Prefix></CommonPrefixes>"
    "</ListBucketResult>";

static void test_listing_s3rver_raw_controls(void **state)
{
    struct s3xml_listing l;

    (void)state;
    assert_int_equal(parse_listing_str(s3rver_raw_listing, &l), 0);
    assert_int_equal(l.object_count, 5);
    assert_string_equal(l.objects[0].key, "d/bad%FFname");
    assert_string_equal(l.objects[1].key, "d/cr\rx");
    assert_string_equal(l.objects[2].key, "d/ctl\x01name");
    assert_string_equal(l.objects[3].key, "d/ok");
    assert_int_equal(l.objects[3].size, 2);
    assert_string_equal(l.objects[3].etag,
                        "\"9dd4e461268c8034f5c8564e155c67a6\"");
    assert_string_equal(l.objects[4].key, "d/\xef\xbf\xbenonchar");
    assert_int_equal(l.prefix_count, 1);
    assert_string_equal(l.prefixes[0], "d/sub\x1b/");
    s3xml_listing_free(&l);
}

/* ------------------------------------------------------ size limits */

static char *single_key_body(const char *key_xml)
{
    struct buf b = { 0 };

    buf_add(&b, "<ListBucketResult xmlns=\"" S3_NS "\"><Contents><Key>%s"
            "</Key><Size>1</Size></Contents></ListBucketResult>", key_xml);
    return b.p;
}

static void test_listing_long_texts(void **state)
{
    struct s3xml_listing l;
    struct buf key = { 0 };
    char *body;

    (void)state;
    /* Exactly S3XML_MAX_TEXT bytes is fine. */
    buf_repeat(&key, "k", S3XML_MAX_TEXT);
    body = single_key_body(key.p);
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(strlen(l.objects[0].key), S3XML_MAX_TEXT);
    assert_string_equal(l.objects[0].key, key.p);
    s3xml_listing_free(&l);
    free(body);

    /* One more byte is not. */
    buf_add(&key, "k");
    body = single_key_body(key.p);
    expect_listing_fails("key max+1", body, strlen(body), EOVERFLOW);
    free(body);
    free(key.p);

    /* Entities split the text into many callbacks: all are accumulated
     * and count after decoding ("a&amp;" is two bytes of key). */
    memset(&key, 0, sizeof(key));
    buf_repeat(&key, "a&amp;", S3XML_MAX_TEXT / 2);
    body = single_key_body(key.p);
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(strlen(l.objects[0].key), S3XML_MAX_TEXT);
    for (size_t i = 0; i < S3XML_MAX_TEXT; i += 2)
        assert_memory_equal(l.objects[0].key + i, "a&", 2);
    s3xml_listing_free(&l);
    free(body);
    buf_add(&key, "b");
    body = single_key_body(key.p);
    expect_listing_fails("entity key max+1", body, strlen(body), EOVERFLOW);
    free(body);
    free(key.p);
}

static void test_listing_long_token_and_prefix(void **state)
{
    struct buf big = { 0 };
    struct buf body = { 0 };
    struct s3xml_listing l;

    (void)state;
    buf_repeat(&big, "t", S3XML_MAX_TEXT + 1);

    buf_add(&body, "<ListBucketResult><IsTruncated>true</IsTruncated>"
            "<NextContinuationToken>%s</NextContinuationToken>"
            "</ListBucketResult>", big.p);
    expect_listing_fails("token", body.p, body.len, EOVERFLOW);
    free(body.p);
    memset(&body, 0, sizeof(body));

    buf_add(&body, "<ListBucketResult><CommonPrefixes><Prefix>%s/</Prefix>"
            "</CommonPrefixes></ListBucketResult>", big.p);
    expect_listing_fails("prefix", body.p, body.len, EOVERFLOW);
    free(body.p);
    memset(&body, 0, sizeof(body));

    /* Elements we do not capture may be long: nothing is kept of them. */
    buf_add(&body, "<ListBucketResult><Name>%s</Name><Contents><Key>k</Key>"
            "<Size>1</Size><Owner><DisplayName>%s</DisplayName></Owner>"
            "</Contents></ListBucketResult>", big.p, big.p);
    assert_int_equal(s3xml_parse_listing(body.p, body.len, &l), 0);
    assert_int_equal(l.object_count, 1);
    s3xml_listing_free(&l);
    free(body.p);
    free(big.p);
}

/* A body far larger than one XML_Parse() feed, with long keys full of
 * entities and multi-byte characters: wherever the feed boundaries fall,
 * texts split across them must come out whole. */
static void test_listing_split_across_feeds(void **state)
{
    enum { N = 700 };
    struct buf body = { 0 };
    struct s3xml_listing l;

    (void)state;
    buf_add(&body, XML_DECL "<ListBucketResult xmlns=\"" S3_NS "\">"
            "<IsTruncated>false</IsTruncated>");
    for (int i = 0; i < N; i++) {
        buf_add(&body, "<Contents><Key>%05d/", i);
        for (int j = 0; j < 60; j++)
            buf_add(&body, "x&amp;\xC3\xA9\xE2\x82\xAC%c", 'a' + j % 26);
        buf_add(&body, "</Key><LastModified>2009-10-12T17:50:30.%03dZ"
                "</LastModified><ETag>&quot;%032d&quot;</ETag>"
                "<Size>%d</Size></Contents>", i % 1000, i, i * 7);
    }
    buf_add(&body, "</ListBucketResult>");
    assert_true(body.len > 8 * 65536);

    assert_int_equal(s3xml_parse_listing(body.p, body.len, &l), 0);
    assert_int_equal(l.object_count, N);
    for (int i = 0; i < N; i++) {
        struct buf want = { 0 };
        char etag[40];

        buf_add(&want, "%05d/", i);
        for (int j = 0; j < 60; j++)
            buf_add(&want, "x&\xC3\xA9\xE2\x82\xAC%c", 'a' + j % 26);
        if (strcmp(l.objects[i].key, want.p) != 0)
            fail_msg("object %d: key differs", i);
        snprintf(etag, sizeof(etag), "\"%032d\"", i);
        assert_string_equal(l.objects[i].etag, etag);
        assert_int_equal(l.objects[i].size, i * 7);
        assert_int_equal(l.objects[i].mtime.tv_nsec, (i % 1000) * 1000000L);
        free(want.p);
    }
    s3xml_listing_free(&l);
    free(body.p);
}

static char *prefixes_body(size_t n)
{
    struct buf b = { 0 };

    buf_add(&b, "<ListBucketResult>");
    for (size_t i = 0; i < n; i++)
        buf_add(&b, "<CommonPrefixes><Prefix>p%zu/</Prefix>"
                "</CommonPrefixes>", i);
    buf_add(&b, "</ListBucketResult>");
    return b.p;
}

static void test_listing_entry_cap(void **state)
{
    struct s3xml_listing l;
    char *body;

    (void)state;
    body = prefixes_body(100000);
    assert_int_equal(parse_listing_str(body, &l), 0);
    assert_int_equal(l.prefix_count, 100000);
    assert_string_equal(l.prefixes[99999], "p99999/");
    s3xml_listing_free(&l);
    free(body);

    body = prefixes_body(100001);
    expect_listing_fails("100001 prefixes", body, strlen(body), EOVERFLOW);
    free(body);

    /* keys left out count too: one more of them is one too many */
    struct buf b = { 0 };
    buf_add(&b, "<ListBucketResult><EncodingType>url</EncodingType>");
    for (size_t i = 0; i < 99999; i++)
        buf_add(&b, "<CommonPrefixes><Prefix>p%zu/</Prefix>"
                "</CommonPrefixes>", i);
    buf_add(&b, "<Contents><Key>k%%00</Key><Size>1</Size></Contents>"
            "</ListBucketResult>");
    assert_int_equal(parse_listing_str(b.p, &l), 0);
    assert_int_equal(l.prefix_count, 99999);
    assert_int_equal(l.skipped_count, 1);
    s3xml_listing_free(&l);
    b.len -= strlen("</ListBucketResult>");
    buf_add(&b, "<Contents><Key>k%%00</Key><Size>1</Size></Contents>"
            "</ListBucketResult>");
    expect_listing_fails("100000 prefixes and 2 keys left out", b.p, b.len,
                         EOVERFLOW);
    free(b.p);
}

/* A key of raw NULs is kept for its log line cut to S3XML_MAX_TEXT bytes,
 * a whole %00 at a time. */
static void test_listing_skipped_key_cap(void **state)
{
    struct buf b = { 0 };
    struct s3xml_listing l;

    (void)state;
    buf_add(&b, "<ListBucketResult><Contents><Key>x");
    size_t nul_at = b.len;
    buf_repeat(&b, "n", 2000);
    buf_add(&b, "</Key><Size>1</Size></Contents></ListBucketResult>");
    memset(b.p + nul_at, '\0', 2000);
    assert_int_equal(s3xml_parse_listing(b.p, b.len, &l), 0);
    assert_int_equal(l.object_count, 0);
    assert_int_equal(l.skipped_count, 1);
    assert_int_equal(strlen(l.skipped[0]), 1 + 3 * ((S3XML_MAX_TEXT - 1) / 3));
    assert_memory_equal(l.skipped[0], "x%00%00", 7);
    s3xml_listing_free(&l);
    free(b.p);
}

/* ------------------------------------------------- broken listings */

struct bad_case {
    const char *name;
    const char *body;
    int rc;
};

#define LBR(inner) "<ListBucketResult xmlns=\"" S3_NS "\">" inner \
    "</ListBucketResult>"
#define OBJ(inner) LBR("<Contents>" inner "</Contents>")

static const struct bad_case bad_listings[] = {
    { "empty", "", EPROTO },
    { "blanks", " \r\n\t ", EPROTO },
    { "text", "Service Unavailable", EPROTO },
    { "unclosed root", "<ListBucketResult>", EPROTO },
    { "truncated body", "<ListBucketResult><Contents><Key>a</Key>", EPROTO },
    { "mismatched tags", "<ListBucketResult><Key>a</Size>"
      "</ListBucketResult>", EPROTO },
    { "junk after root", LBR("") "<x/>", EPROTO },
    { "two roots", LBR("") LBR(""), EPROTO },
    { "undefined entity", OBJ("<Key>&nbsp;</Key><Size>1</Size>"), EPROTO },
    { "char ref NUL", OBJ("<Key>a&#0;</Key><Size>1</Size>"), EPROTO },
    /* bytes XML cannot carry are a key's own only inside its text */
    { "control char in a tag", LBR("<Contents><Ke\x01y>a</Key><Size>1"
      "</Size></Contents>"), EPROTO },
    { "control char in an end tag", OBJ("<Key>a</Key\x01><Size>1</Size>"),
      EPROTO },
    { "not UTF-8 in a tag", OBJ("<Key>a</Key><Si\xffze>1</Size>"), EPROTO },
    { "control char before the root", XML_DECL "\x01" LBR(""), EPROTO },
    { "control char in the size", OBJ("<Key>a</Key><Size>1\x01</Size>"),
      EPROTO },
    { "control char in the time", OBJ("<Key>a</Key><Size>1</Size>"
      "<LastModified>2009-10-12T17:50:30.000Z\x01</LastModified>"), EPROTO },
    { "unbound prefix", "<s3:ListBucketResult/>", EPROTO },
    { "wrong root", "<ListVersionsResult xmlns=\"" S3_NS "\">"
      "</ListVersionsResult>", EPROTO },
    { "error root", "<Error><Code>NoSuchBucket</Code></Error>", EPROTO },
    { "html", "<html><body><h1>502 Bad Gateway</h1></body></html>",
      EPROTO },
    { "size letters", OBJ("<Key>a</Key><Size>12a</Size>"), EPROTO },
    { "size empty", OBJ("<Key>a</Key><Size></Size>"), EPROTO },
    { "size negative", OBJ("<Key>a</Key><Size>-1</Size>"), EPROTO },
    { "size plus", OBJ("<Key>a</Key><Size>+1</Size>"), EPROTO },
    { "size blank", OBJ("<Key>a</Key><Size> 12</Size>"), EPROTO },
    { "size float", OBJ("<Key>a</Key><Size>1.5</Size>"), EPROTO },
    { "size 2^64", OBJ("<Key>a</Key><Size>18446744073709551616</Size>"),
      EPROTO },
    { "size huge", OBJ("<Key>a</Key><Size>99999999999999999999999</Size>"),
      EPROTO },
    { "missing key", OBJ("<Size>1</Size>"), EPROTO },
    { "empty key", OBJ("<Key></Key><Size>1</Size>"), EPROTO },
    { "missing size", OBJ("<Key>a</Key>"), EPROTO },
    { "two keys", OBJ("<Key>a</Key><Key>b</Key><Size>1</Size>"), EPROTO },
    { "two sizes", OBJ("<Key>a</Key><Size>1</Size><Size>1</Size>"), EPROTO },
    { "two etags", OBJ("<Key>a</Key><Size>1</Size><ETag>x</ETag>"
      "<ETag>y</ETag>"), EPROTO },
    { "markup in key", OBJ("<Key>a<b>c</b></Key><Size>1</Size>"), EPROTO },
    { "bad time", OBJ("<Key>a</Key><Size>1</Size>"
      "<LastModified>Mon, 12 Oct 2009 17:50:30 GMT</LastModified>"),
      EPROTO },
    { "truncated yes", LBR("<IsTruncated>yes</IsTruncated>"), EPROTO },
    { "truncated True", LBR("<IsTruncated>True</IsTruncated>"), EPROTO },
    { "truncated twice", LBR("<IsTruncated>false</IsTruncated>"
      "<IsTruncated>false</IsTruncated>"), EPROTO },
    { "truncated no token", LBR("<IsTruncated>true</IsTruncated>"
      "<NextMarker>a</NextMarker>"), EPROTO },
    { "truncated empty token", LBR("<IsTruncated>true</IsTruncated>"
      "<NextContinuationToken></NextContinuationToken>"), EPROTO },
    { "two tokens", LBR("<NextContinuationToken>a</NextContinuationToken>"
      "<NextContinuationToken>b</NextContinuationToken>"), EPROTO },
    { "unknown encoding", LBR("<EncodingType>base64</EncodingType>"),
      EPROTO },
    { "empty common prefix", LBR("<CommonPrefixes><Prefix/>"
      "</CommonPrefixes>"), EPROTO },
    { "xml decl not first", "<!-- c --><?xml version=\"1.0\"?>" LBR(""),
      EPROTO },
};

static void test_listing_bad(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad_listings); i++)
        expect_listing_fails(bad_listings[i].name, bad_listings[i].body,
                             strlen(bad_listings[i].body),
                             bad_listings[i].rc);
    /* A NUL inside the body, and a NULL body. */
    expect_listing_fails("embedded NUL", LBR("") "\0", sizeof(LBR("")),
                         EPROTO);
    expect_listing_fails("NULL body", NULL, 0, EPROTO);
}

/* ------------------------------------------------------- DOCTYPEs */

static const char *const doctype_bodies[] = {
    /* billion laughs */
    "<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n"
    " <!ENTITY lol \"lol\">\n"
    " <!ENTITY lol1 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">\n"
    " <!ENTITY lol2 \"&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;\">\n"
    " <!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">\n"
    " <!ENTITY lol4 \"&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;\">\n"
    " <!ENTITY lol5 \"&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;\">\n"
    " <!ENTITY lol6 \"&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;\">\n"
    " <!ENTITY lol7 \"&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;\">\n"
    " <!ENTITY lol8 \"&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;\">\n"
    " <!ENTITY lol9 \"&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;\">\n"
    "]>\n"
    "<ListBucketResult><Contents><Key>&lol9;</Key><Size>1</Size>"
    "</Contents><CommonPrefixes><Prefix>&lol9;</Prefix></CommonPrefixes>"
    "<Error><Code>&lol9;</Code></Error><UploadId>&lol9;</UploadId>"
    "<ETag>&lol9;</ETag></ListBucketResult>",
    /* external entity */
    "<!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>"
    "<ListBucketResult><Contents><Key>&x;</Key><Size>1</Size></Contents>"
    "</ListBucketResult>",
    /* parameter entity from outside */
    "<!DOCTYPE r [<!ENTITY % p SYSTEM \"http://127.0.0.1:1/x.dtd\"> %p;]>"
    "<Error><Code>x</Code></Error>",
    /* harmless-looking, still refused */
    "<!DOCTYPE ListBucketResult><ListBucketResult/>",
    "<!DOCTYPE Error SYSTEM \"err.dtd\"><Error/>",
    /* an HTML error page */
    "<!DOCTYPE html>\n<html><head><title>503</title></head>"
    "<body>Service Unavailable</body></html>",
};

static void test_doctype_refused(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(doctype_bodies); i++) {
        const char *body = doctype_bodies[i];
        size_t len = strlen(body);
        struct s3xml_error e;
        char *s = NULL;
        int rc;

        expect_listing_fails("doctype", body, len, EPROTO);
        rc = s3xml_parse_error(body, len, &e);
        if (rc != EPROTO)
            fail_msg("error doc %zu: rc %d", i, rc);
        assert_string_equal(e.code, "");
        rc = s3xml_parse_upload_id(body, len, &s);
        if (rc != EPROTO)
            fail_msg("upload id %zu: rc %d", i, rc);
        assert_null(s);
        rc = s3xml_parse_etag_result(body, len, &s, &e);
        if (rc != EPROTO)
            fail_msg("etag %zu: rc %d", i, rc);
        assert_null(s);
        assert_string_equal(e.code, "");
    }
}

/* -------------------------------------------------- error documents */

struct error_case {
    const char *name;
    const char *body;
    const char *code;
    const char *message;
};

static const struct error_case error_cases[] = {
    { "aws NoSuchBucket",
      XML_DECL "<Error><Code>NoSuchBucket</Code>"
      "<Message>The specified bucket does not exist</Message>"
      "<BucketName>nosuch</BucketName>"
      "<RequestId>4442587FB7D0A2F9</RequestId>"
      "<HostId>tLfYqSbPzlM+nB3sVm3fzUcmwZsjvk4kqMsoSBVC1yAB4HdGfIqhZd8gmsL7"
      "hOoGTJnjdcVdl6E=</HostId></Error>",
      "NoSuchBucket", "The specified bucket does not exist" },
    { "aws SignatureDoesNotMatch",
      XML_DECL "<Error><Code>SignatureDoesNotMatch</Code>"
      "<Message>The request signature we calculated does not match the "
      "signature you provided. Check your key and signing method.</Message>"
      "<AWSAccessKeyId>AKIAIOSFODNN7EXAMPLE</AWSAccessKeyId>"
      "<StringToSign>AWS4-HMAC-SHA256\n20130524T000000Z\n"
      "20130524/us-east-1/s3/aws4_request\n7344ae5b7ee6c3e7e6b0fe0640412a37"
      "625d1fbfff95c48bbb2dc43964946972</StringToSign>"
      "<SignatureProvided>f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd9"
      "1039c6036bdb41</SignatureProvided>"
      "<StringToSignBytes>41 57 53 34</StringToSignBytes>"
      "<CanonicalRequest>GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws"
      ".com\n</CanonicalRequest>"
      "<CanonicalRequestBytes>47 45 54</CanonicalRequestBytes>"
      "<RequestId>Z0B6T3K4R9HT0CPX</RequestId><HostId>abc=</HostId></Error>",
      "SignatureDoesNotMatch",
      "The request signature we calculated does not match the signature you "
      "provided. Check your key and signing method." },
    { "aws AccessDenied pretty",
      XML_DECL "\n<Error>\n  <Code>AccessDenied</Code>\n"
      "  <Message>Access Denied</Message>\n"
      "  <RequestId>656c76696e6727732072657175657374</RequestId>\n"
      "  <HostId>Uuag1LuByRx9e6j5Onimru9pO4ZVKnJ2Qz7/C1NPcfTWAtRPfTaOFg=="
      "</HostId>\n</Error>\n",
      "AccessDenied", "Access Denied" },
    { "s3rver NoSuchKey",
      XML_DECL "<Error><Code>NoSuchKey</Code>"
      "<Message>The specified key does not exist.</Message>"
      "<Key>dir/a&amp;b.txt</Key></Error>",
      "NoSuchKey", "The specified key does not exist." },
    { "a raw control character in an element not read",
      XML_DECL "<Error><Code>NoSuchKey</Code>"
      "<Message>The specified key does not exist.</Message>"
      "<Key>d/ctl\x01name</Key></Error>",
      "NoSuchKey", "The specified key does not exist." },
    { "bytes XML cannot carry in the message",
      "<Error><Code>InvalidURI</Code><Message>bad \x01\xff key</Message>"
      "</Error>", "InvalidURI", "bad || key" },
    { "swift SlowDown",
      "<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>SlowDown</Code>"
      "<Message>Please reduce your request rate.</Message>"
      "<RequestId>tx3f0e1b8a2c4d4e6f8a0b2-0065a1b2c3</RequestId></Error>",
      "SlowDown", "Please reduce your request rate." },
    { "namespaced", "<Error xmlns=\"" S3_NS "\"><Code>InvalidRange</Code>"
      "<Message>The requested range is not satisfiable</Message></Error>",
      "InvalidRange", "The requested range is not satisfiable" },
    { "entities in message", "<Error><Code>InvalidArgument</Code>"
      "<Message>a &lt;b&gt; &amp; &quot;c&quot;</Message></Error>",
      "InvalidArgument", "a <b> & \"c\"" },
    { "order swapped", "<Error><Message>m</Message><Code>c</Code></Error>",
      "c", "m" },
    { "code only", "<Error><Code>InternalError</Code></Error>",
      "InternalError", "" },
    { "empty error", "<Error/>", "", "" },
    { "nested detail ignored", "<Error><Code>MalformedXML</Code><Details>"
      "<Code>inner</Code><Message>inner</Message></Details></Error>",
      "MalformedXML", "" },
};

static void test_error_documents(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(error_cases); i++) {
        const struct error_case *ec = &error_cases[i];
        struct s3xml_error e;
        int rc;

        memset(&e, 'x', sizeof(e));
        rc = s3xml_parse_error(ec->body, strlen(ec->body), &e);
        if (rc != 0)
            fail_msg("%s: rc %d", ec->name, rc);
        if (strcmp(e.code, ec->code) != 0 ||
            strcmp(e.message, ec->message) != 0)
            fail_msg("%s: got \"%s\" / \"%s\"", ec->name, e.code, e.message);
    }
}

static void test_error_truncation(void **state)
{
    struct buf code = { 0 };
    struct buf msg = { 0 };
    struct buf body = { 0 };
    struct s3xml_error e;

    (void)state;
    buf_repeat(&code, "C", 100);
    /* 2-byte characters: 255 bytes would split one. */
    buf_repeat(&msg, "\xC3\xA9", 300);
    buf_add(&body, "<Error><Code>%s</Code><Message>%s</Message></Error>",
            code.p, msg.p);
    assert_int_equal(s3xml_parse_error(body.p, body.len, &e), 0);
    assert_int_equal(strlen(e.code), sizeof(e.code) - 1);
    assert_memory_equal(e.code, code.p, sizeof(e.code) - 1);
    assert_int_equal(strlen(e.message), 254);
    assert_memory_equal(e.message, msg.p, 254);
    free(body.p);
    free(msg.p);

    /* A message longer than S3XML_MAX_TEXT is still just truncated. */
    memset(&msg, 0, sizeof(msg));
    memset(&body, 0, sizeof(body));
    buf_repeat(&msg, "m", 3 * S3XML_MAX_TEXT);
    buf_add(&body, "<Error><Code>SlowDown</Code><Message>%s</Message>"
            "</Error>", msg.p);
    assert_int_equal(s3xml_parse_error(body.p, body.len, &e), 0);
    assert_string_equal(e.code, "SlowDown");
    assert_int_equal(strlen(e.message), sizeof(e.message) - 1);
    free(body.p);
    free(msg.p);
    free(code.p);
}

static const struct bad_case bad_errors[] = {
    { "empty", "", EPROTO },
    { "blanks", "\n\n", EPROTO },
    { "plain text", "Bad Gateway", EPROTO },
    { "html", "<html><head><title>502 Bad Gateway</title></head><body>"
      "<center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center>"
      "</body></html>", EPROTO },
    { "html unclosed", "<html><body><p>Oops<br></body></html>", EPROTO },
    { "listing", LBR(""), EPROTO },
    { "unclosed", "<Error><Code>x</Code>", EPROTO },
    { "mismatched", "<Error><Code>x</Error>", EPROTO },
    { "markup in code", "<Error><Code><b>x</b></Code></Error>", EPROTO },
    { "two codes", "<Error><Code>a</Code><Code>b</Code></Error>", EPROTO },
};

static void test_error_bad(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad_errors); i++) {
        const struct bad_case *bc = &bad_errors[i];
        struct s3xml_error e;
        int rc;

        memset(&e, 'x', sizeof(e));
        rc = s3xml_parse_error(bc->body, strlen(bc->body), &e);
        if (rc != bc->rc)
            fail_msg("%s: rc %d, want %d", bc->name, rc, bc->rc);
        assert_string_equal(e.code, "");
        assert_string_equal(e.message, "");
    }
}

/* ------------------------------------------------------- upload ids */

static void test_upload_id(void **state)
{
    static const struct {
        const char *body;
        const char *want;
    } cases[] = {
        { XML_DECL "<InitiateMultipartUploadResult xmlns=\"" S3_NS "\">"
          "<Bucket>example-bucket</Bucket><Key>example-object</Key>"
          "<UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG"
          "9hZA</UploadId></InitiateMultipartUploadResult>",
          "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA" },
        { XML_DECL "<InitiateMultipartUploadResult xmlns=\"http://doc.s3."
          "amazonaws.com/2006-03-01/\"><Bucket>b</Bucket><Key>a b+c</Key>"
          "<UploadId>e2fbf3a6f5b84ea6b2d9fd1a3e5e9c43</UploadId>"
          "</InitiateMultipartUploadResult>",
          "e2fbf3a6f5b84ea6b2d9fd1a3e5e9c43" },
        { "<?xml version='1.0' encoding='UTF-8'?>\n"
          "<InitiateMultipartUploadResult xmlns=\"" S3_NS "\"><Bucket>c1"
          "</Bucket><Key>obj</Key><UploadId>MWEyN2M3ZTYtMTFmZi00YTE2LWE3NWM"
          "tNWU1ZDBlN2YzMDk2</UploadId></InitiateMultipartUploadResult>",
          "MWEyN2M3ZTYtMTFmZi00YTE2LWE3NWMtNWU1ZDBlN2YzMDk2" },
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *id = NULL;
        int rc = s3xml_parse_upload_id(cases[i].body, strlen(cases[i].body),
                                       &id);

        if (rc != 0)
            fail_msg("case %zu: rc %d", i, rc);
        assert_string_equal(id, cases[i].want);
        free(id);
    }
}

static void test_upload_id_bad(void **state)
{
    static const struct bad_case cases[] = {
        { "empty", "", EPROTO },
        { "no id", "<InitiateMultipartUploadResult><Bucket>b</Bucket>"
          "</InitiateMultipartUploadResult>", EPROTO },
        { "empty id", "<InitiateMultipartUploadResult><UploadId></UploadId>"
          "</InitiateMultipartUploadResult>", EPROTO },
        { "two ids", "<InitiateMultipartUploadResult><UploadId>a</UploadId>"
          "<UploadId>b</UploadId></InitiateMultipartUploadResult>", EPROTO },
        { "nested id", "<InitiateMultipartUploadResult><X><UploadId>a"
          "</UploadId></X></InitiateMultipartUploadResult>", EPROTO },
        { "error doc", "<Error><Code>AccessDenied</Code></Error>", EPROTO },
        { "wrong root", "<CompleteMultipartUploadResult><UploadId>a"
          "</UploadId></CompleteMultipartUploadResult>", EPROTO },
        { "html", "<html><body>Forbidden</body></html>", EPROTO },
        { "unclosed", "<InitiateMultipartUploadResult><UploadId>a</UploadId>",
          EPROTO },
    };
    static char sentinel[] = "sentinel";
    struct buf big = { 0 };
    char *id;

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int rc;

        id = sentinel;          /* must be cleared */
        rc = s3xml_parse_upload_id(cases[i].body, strlen(cases[i].body),
                                   &id);
        if (rc != cases[i].rc)
            fail_msg("%s: rc %d", cases[i].name, rc);
        assert_null(id);
    }
    /* Overlong: reported as EPROTO (the header's error set). */
    buf_add(&big, "<InitiateMultipartUploadResult><UploadId>");
    buf_repeat(&big, "u", S3XML_MAX_TEXT + 1);
    buf_add(&big, "</UploadId></InitiateMultipartUploadResult>");
    assert_int_equal(s3xml_parse_upload_id(big.p, big.len, &id), EPROTO);
    assert_null(id);
    free(big.p);
}

/* ------------------------------------------------------ etag results */

static void test_etag_results(void **state)
{
    static const struct {
        const char *name;
        const char *body;
        const char *want;
    } cases[] = {
        { "aws CopyObjectResult",
          XML_DECL "<CopyObjectResult xmlns=\"" S3_NS "\">"
          "<LastModified>2009-10-28T22:32:00.000Z</LastModified>"
          "<ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>"
          "</CopyObjectResult>",
          "\"9b2cf535f27731c974343645a3985328\"" },
        { "aws CopyPartResult",
          XML_DECL "<CopyPartResult xmlns=\"" S3_NS "\">"
          "<LastModified>2011-04-11T20:34:56.000Z</LastModified>"
          "<ETag>\"9b2cf535f27731c974343645a3985328\"</ETag>"
          "</CopyPartResult>",
          "\"9b2cf535f27731c974343645a3985328\"" },
        { "aws CompleteMultipartUploadResult after keep-alive blanks",
          "   \n    \n" XML_DECL
          "<CompleteMultipartUploadResult xmlns=\"" S3_NS "\">\n"
          "  <Location>http://Example-Bucket.s3.amazonaws.com/Example-Object"
          "</Location>\n  <Bucket>Example-Bucket</Bucket>\n"
          "  <Key>Example-Object</Key>\n"
          "  <ETag>\"3858f62230ac3c915f300c664312c11f-9\"</ETag>\n"
          "</CompleteMultipartUploadResult>",
          "\"3858f62230ac3c915f300c664312c11f-9\"" },
        { "swift Complete with heartbeat blanks after the declaration",
          "<?xml version='1.0' encoding='UTF-8'?>\n          "
          "<CompleteMultipartUploadResult xmlns=\"" S3_NS "\"><Location>"
          "http://127.0.0.1:8080/c1/big</Location><Bucket>c1</Bucket>"
          "<Key>big</Key><ETag>\"0d7d8ca26d1d8bd7d1c5f3f3ea8d4cf1-2\"</ETag>"
          "</CompleteMultipartUploadResult>",
          "\"0d7d8ca26d1d8bd7d1c5f3f3ea8d4cf1-2\"" },
        { "s3rver CopyObjectResult",
          XML_DECL "<CopyObjectResult><LastModified>2023-11-14T08:02:01.123Z"
          "</LastModified><ETag>&quot;5d41402abc4b2a76b9719d911017c592&quot;"
          "</ETag></CopyObjectResult>",
          "\"5d41402abc4b2a76b9719d911017c592\"" },
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct s3xml_error e;
        char *etag = NULL;
        int rc = s3xml_parse_etag_result(cases[i].body, strlen(cases[i].body),
                                         &etag, &e);

        if (rc != 0)
            fail_msg("%s: rc %d", cases[i].name, rc);
        assert_string_equal(etag, cases[i].want);
        free(etag);
        /* ERR is optional. */
        rc = s3xml_parse_etag_result(cases[i].body, strlen(cases[i].body),
                                     &etag, NULL);
        assert_int_equal(rc, 0);
        free(etag);
    }
}

static void test_etag_result_error_in_200(void **state)
{
    static const char *const bodies[] = {
        XML_DECL "\n<Error>\n  <Code>InternalError</Code>\n"
        "  <Message>We encountered an internal error. Please try again."
        "</Message>\n  <RequestId>656c76696e6727732072657175657374"
        "</RequestId>\n  <HostId>Uuag1LuByRx9e6j5Onimru9pO4ZVKnJ2Qz7/C1NPcf"
        "TWAtRPfTaOFg==</HostId>\n</Error>",
        /* after keep-alive white space, as CompleteMultipartUpload does */
        "     \n     " XML_DECL "<Error><Code>InternalError</Code><Message>"
        "We encountered an internal error. Please try again.</Message>"
        "</Error>",
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bodies); i++) {
        struct s3xml_error e;
        char *etag = NULL;

        assert_int_equal(s3xml_parse_etag_result(bodies[i], strlen(bodies[i]),
                                                 &etag, &e), EIO);
        assert_null(etag);
        assert_string_equal(e.code, "InternalError");
        assert_string_equal(e.message,
                            "We encountered an internal error. Please try "
                            "again.");
        assert_int_equal(s3xml_parse_etag_result(bodies[i], strlen(bodies[i]),
                                                 &etag, NULL), EIO);
        assert_null(etag);
    }
}

static void test_etag_result_bad(void **state)
{
    static const struct bad_case cases[] = {
        { "empty", "", EPROTO },
        { "no etag", "<CopyObjectResult><LastModified>2009-10-28T22:32:00"
          ".000Z</LastModified></CopyObjectResult>", EPROTO },
        { "empty etag", "<CopyObjectResult><ETag/></CopyObjectResult>",
          EPROTO },
        { "two etags", "<CopyPartResult><ETag>a</ETag><ETag>b</ETag>"
          "</CopyPartResult>", EPROTO },
        { "wrong root", "<InitiateMultipartUploadResult><ETag>a</ETag>"
          "</InitiateMultipartUploadResult>", EPROTO },
        { "listing", OBJ("<Key>a</Key><Size>1</Size><ETag>a</ETag>"),
          EPROTO },
        { "html", "<html><body>Internal Server Error</body></html>",
          EPROTO },
        { "malformed", "<CompleteMultipartUploadResult><ETag>\"a\"</ETag>",
          EPROTO },
        { "malformed error", "<Error><Code>InternalError</Code>", EPROTO },
    };
    static char sentinel[] = "sentinel";
    struct buf big = { 0 };
    struct s3xml_error e;
    char *etag;

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int rc;

        etag = sentinel;
        memset(&e, 'x', sizeof(e));
        rc = s3xml_parse_etag_result(cases[i].body, strlen(cases[i].body),
                                     &etag, &e);
        if (rc != cases[i].rc)
            fail_msg("%s: rc %d", cases[i].name, rc);
        assert_null(etag);
        assert_string_equal(e.code, "");
        assert_string_equal(e.message, "");
    }
    buf_add(&big, "<CopyObjectResult><ETag>");
    buf_repeat(&big, "e", S3XML_MAX_TEXT + 1);
    buf_add(&big, "</ETag></CopyObjectResult>");
    assert_int_equal(s3xml_parse_etag_result(big.p, big.len, &etag, NULL),
                     EPROTO);
    assert_null(etag);
    free(big.p);
}

/* ------------------------------------------------------------- times */

static void test_parse_time_valid(void **state)
{
    static const struct {
        const char *text;
        int64_t sec;
        long nsec;
    } cases[] = {
        { "2009-10-12T17:50:30.000Z", 1255369830, 0 },
        { "2009-10-12T17:50:30Z", 1255369830, 0 },
        { "2009-10-12T17:50:30.5Z", 1255369830, 500000000 },
        { "2009-10-12T17:50:30.123456789Z", 1255369830, 123456789 },
        { "2009-10-12T17:50:30.000001Z", 1255369830, 1000 },
        { "2020-02-29T23:59:59.999Z", 1583020799, 999000000 },
        { "1970-01-01T00:00:00Z", 0, 0 },
        { "1969-12-31T23:59:59Z", -1, 0 },
        { "1969-12-31T23:59:59.5Z", -1, 500000000 },
        { "1900-03-01T00:00:00Z", -2203891200, 0 },
        { "2000-02-29T12:00:00Z", 951825600, 0 },
        { "2038-01-19T03:14:08Z", 2147483648, 0 },
        { "9999-12-31T23:59:59Z", 253402300799, 0 },
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct timespec ts;
        int rc = s3xml_parse_time(cases[i].text, &ts);

        if (sizeof(time_t) < 8 && (cases[i].sec > INT32_MAX ||
                                   cases[i].sec < INT32_MIN))
            continue;
        if (rc != 0)
            fail_msg("%s: rc %d", cases[i].text, rc);
        if ((int64_t)ts.tv_sec != cases[i].sec || ts.tv_nsec != cases[i].nsec)
            fail_msg("%s: got %lld.%09ld", cases[i].text,
                     (long long)ts.tv_sec, ts.tv_nsec);
    }
}

static void test_parse_time_invalid(void **state)
{
    static const char *const bad[] = {
        "",
        "2009-10-12",
        "2009-10-12T17:50:30",
        "2009-10-12T17:50:30.000",
        "2009-10-12T17:50:30.Z",
        "2009-10-12T17:50:30.1234567890Z",
        "2009-10-12T17:50:30.000+00:00",
        "2009-10-12T17:50:30+00:00",
        "2009-10-12T17:50:30z",
        "2009-10-12t17:50:30Z",
        "2009-10-12 17:50:30Z",
        "2009-13-12T17:50:30Z",
        "2009-00-12T17:50:30Z",
        "2009-10-00T17:50:30Z",
        "2009-10-32T17:50:30Z",
        "2009-04-31T17:50:30Z",
        "2019-02-29T00:00:00Z",
        "1900-02-29T00:00:00Z",
        "2009-10-12T24:00:00Z",
        "2009-10-12T17:60:30Z",
        "2009-10-12T17:50:60Z",
        "2009-10-12T17:50:30ZZ",
        "2009-10-12T17:50:30Z ",
        " 2009-10-12T17:50:30Z",
        "+2009-10-12T17:50:30Z",
        "209-10-12T17:50:30Z",
        "20091-10-12T17:50:30Z",
        "20091012T175030Z",
        "2009-1-12T17:50:30Z",
        "2009/10/12T17:50:30Z",
        "2009-10-12T17:50:3aZ",
        "2009-10-12T17:50:30.1a3Z",
        "2009-10-12T17:50:30.-1Z",
        "Mon, 12 Oct 2009 17:50:30 GMT",
        "1255369830",
    };

    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        struct timespec ts = { 12345, 678 };
        int rc = s3xml_parse_time(bad[i], &ts);

        if (rc != EINVAL)
            fail_msg("\"%s\": rc %d, want EINVAL", bad[i], rc);
        assert_int_equal(ts.tv_sec, 0);
        assert_int_equal(ts.tv_nsec, 0);
    }
    {
        struct timespec ts;

        assert_int_equal(s3xml_parse_time(NULL, &ts), EINVAL);
    }
}

/* ------------------------------------------------------------ misc */

static void test_listing_free_safe(void **state)
{
    struct s3xml_listing l;

    (void)state;
    memset(&l, 0, sizeof(l));
    s3xml_listing_free(&l);
    s3xml_listing_free(&l);
    s3xml_listing_free(NULL);
    assert_int_equal(parse_listing_str(aws_listing, &l), 0);
    s3xml_listing_free(&l);
    s3xml_listing_free(&l);
    assert_listing_empty(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listing_aws),
        cmocka_unit_test(test_listing_s3rver),
        cmocka_unit_test(test_listing_swift),
        cmocka_unit_test(test_listing_without_namespace),
        cmocka_unit_test(test_listing_prefixed_namespace),
        cmocka_unit_test(test_listing_unknown_elements),
        cmocka_unit_test(test_listing_empty),
        cmocka_unit_test(test_listing_truncated),
        cmocka_unit_test(test_listing_token_not_truncated),
        cmocka_unit_test(test_listing_keys),
        cmocka_unit_test(test_listing_unreadable_keys_are_left_out),
        cmocka_unit_test(test_listing_s3rver_raw_controls),
        cmocka_unit_test(test_listing_long_texts),
        cmocka_unit_test(test_listing_long_token_and_prefix),
        cmocka_unit_test(test_listing_split_across_feeds),
        cmocka_unit_test(test_listing_entry_cap),
        cmocka_unit_test(test_listing_skipped_key_cap),
        cmocka_unit_test(test_listing_bad),
        cmocka_unit_test(test_doctype_refused),
        cmocka_unit_test(test_error_documents),
        cmocka_unit_test(test_error_truncation),
        cmocka_unit_test(test_error_bad),
        cmocka_unit_test(test_upload_id),
        cmocka_unit_test(test_upload_id_bad),
        cmocka_unit_test(test_etag_results),
        cmocka_unit_test(test_etag_result_error_in_200),
        cmocka_unit_test(test_etag_result_bad),
        cmocka_unit_test(test_parse_time_valid),
        cmocka_unit_test(test_parse_time_invalid),
        cmocka_unit_test(test_listing_free_safe),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
