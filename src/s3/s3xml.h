/*
 * s3xml.h - parse the XML bodies S3 returns (expat), no I/O.
 *
 * The S3 client hands every XML response body to one of these parsers:
 * ListObjectsV2 results, error documents, and the small results of the
 * multipart and copy calls. Parsers are strict about structure and lenient
 * about unknown elements (S3 adds fields over time). Every string they
 * produce is capped (S3XML_MAX_TEXT), so a hostile server cannot make the
 * daemon allocate without bound.
 *
 * Keys are bytes, read as the server holds them: a key with bytes XML 1.0
 * cannot carry (controls, not UTF-8), which servers that ignore
 * encoding-type=url (s3rver) write raw into the document, is read
 * exactly, the rest of the page with it; so is a raw CR, which XML would
 * read as LF. Whether a key can be a file name is names.c's to say. In
 * every other text, such a byte reads as '|'.
 *
 * Thread-safe: no shared state.
 */
#ifndef S3CFS_S3XML_H
#define S3CFS_S3XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Longest text of one element we accept (a key is at most 1024 bytes). */
#define S3XML_MAX_TEXT 4096

/* One <Contents> entry of a listing. */
struct s3xml_object {
    char *key;               /* full key, bytes as the server holds them
                                (not always UTF-8), URL-decoded if the
                                listing said EncodingType=url */
    uint64_t size;
    char *etag;              /* as sent, quotes included: "\"abc...\"" */
    struct timespec mtime;   /* LastModified, UTC (fraction kept) */
};

/* A parsed ListObjectsV2 page. Owned by the caller; free with
 * s3xml_listing_free(). */
struct s3xml_listing {
    struct s3xml_object *objects;
    size_t object_count;
    char **prefixes;          /* <CommonPrefixes><Prefix> values, decoded */
    size_t prefix_count;
    bool truncated;           /* <IsTruncated>true */
    char *next_token;         /* <NextContinuationToken>, NULL if none
                                 (opaque: never URL-decoded) */
    char **skipped;           /* keys and prefixes left out of the page: no
                                 string holds them (a NUL) or they cannot
                                 be decoded (a bad %-escape); each as the
                                 server sent it, a NUL written %00, cut to
                                 S3XML_MAX_TEXT bytes: for a log line */
    size_t skipped_count;
};

/* Parsed <Error> document. Fields are empty strings when absent;
 * longer values are truncated. */
struct s3xml_error {
    char code[64];            /* "NoSuchBucket", "SlowDown", ... */
    char message[256];
};

/*
 * Parse a ListObjectsV2 response body of LEN bytes. Returns 0 and fills
 * *out (zeroed first), EPROTO when the body is not a ListBucketResult or is
 * malformed, EOVERFLOW when a text exceeds S3XML_MAX_TEXT, ENOMEM. A key
 * that cannot be read is no failure: it goes to out->skipped. On error
 * *out is left empty (nothing to free, though freeing is harmless).
 */
int s3xml_parse_listing(const char *body, size_t len, struct s3xml_listing *out);

/* Free what a listing holds and zero it; safe on a zeroed listing. */
void s3xml_listing_free(struct s3xml_listing *listing);

/*
 * Parse an <Error> document. Returns 0 and fills *out, or EPROTO when the
 * body is not an S3 error document (HTML error pages, empty bodies).
 */
int s3xml_parse_error(const char *body, size_t len, struct s3xml_error *out);

/*
 * InitiateMultipartUploadResult -> malloc'd <UploadId> in *upload_id.
 * Returns 0, EPROTO, ENOMEM.
 */
int s3xml_parse_upload_id(const char *body, size_t len, char **upload_id);

/*
 * The <ETag> of a CopyObjectResult, CopyPartResult or
 * CompleteMultipartUploadResult -> malloc'd string in *etag. S3 may answer
 * 200 with an <Error> body to these calls: that returns EIO and, when ERR is
 * not NULL, fills *err. Returns 0, EIO, EPROTO, ENOMEM.
 */
int s3xml_parse_etag_result(const char *body, size_t len, char **etag,
                            struct s3xml_error *err);

/*
 * Parse an ISO 8601 UTC timestamp as S3 writes it
 * ("2009-10-12T17:50:30.000Z", fraction optional). Returns 0 or EINVAL.
 */
int s3xml_parse_time(const char *text, struct timespec *out);

#endif /* S3CFS_S3XML_H */
