/*
 * sigv4.h - AWS Signature Version 4 request signing (pure, no I/O).
 *
 * The S3 client builds a request (method, encoded path, encoded query,
 * headers, payload hash) and asks this module for the Authorization header.
 * Each step of the algorithm is exposed on its own so that the unit tests can
 * check the canonical request, the string to sign and the signature against
 * the published AWS test suite.
 *
 * Thread-safe: no state; every function works only on its arguments.
 * Secrets passed in are never copied into returned strings other than the
 * derived signature.
 */
#ifndef S3CFS_SIGV4_H
#define S3CFS_SIGV4_H

#include <stdbool.h>
#include <stddef.h>

/* Length of a hex SHA-256 digest, without the terminating NUL. */
#define SIGV4_HEX_LEN 64

/* The SHA-256 of an empty body, hex: what S3 expects for GET/HEAD/DELETE. */
#define SIGV4_EMPTY_SHA256 \
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* The payload hash S3 accepts when the body is not hashed. */
#define SIGV4_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"

struct sigv4_header {
    const char *name;   /* any case; lowered when canonicalised */
    const char *value;  /* trimmed, inner runs of spaces folded to one */
};

struct sigv4_request {
    const char *method;        /* "GET", "PUT", ... */
    const char *path;          /* URI path as sent on the wire, already
                                  percent-encoded (S3: each key byte encoded
                                  once, '/' kept); "" means "/" */
    const char *query;         /* query string as sent, without '?'; may be
                                  NULL or "". Parameters are decoded, then
                                  re-encoded and sorted when canonicalised */
    const struct sigv4_header *headers; /* the headers to sign; must include
                                           host and x-amz-date */
    size_t header_count;
    const char *payload_hash;  /* hex SHA-256 of the body, or
                                  SIGV4_UNSIGNED_PAYLOAD */
    bool normalize_path;       /* false for S3. true applies the generic AWS
                                  rules (remove dot segments, merge slashes,
                                  encode each segment a second time); only
                                  the test suite of other services uses it */
};

struct sigv4_scope {
    const char *amz_date;  /* "YYYYMMDDTHHMMSSZ" (the x-amz-date value) */
    const char *region;    /* "us-east-1" */
    const char *service;   /* "s3" */
};

/*
 * Percent-encode LEN bytes of IN as SigV4 requires: unreserved characters
 * (A-Z a-z 0-9 - _ . ~) stay, every other byte becomes %XX (upper-case hex);
 * '/' stays when keep_slash is true. Returns a malloc'd NUL-terminated
 * string the caller frees, or NULL when out of memory.
 */
char *sigv4_uri_encode(const char *in, size_t len, bool keep_slash);

/* Hex SHA-256 of LEN bytes of DATA into OUT (SIGV4_HEX_LEN + 1 bytes). */
void sigv4_sha256_hex(const void *data, size_t len, char *out);

/*
 * Build the canonical request. On success returns 0 and stores a malloc'd
 * string in *out (caller frees). Returns EINVAL for a malformed request
 * (missing method or payload hash), ENOMEM when out of memory.
 */
int sigv4_canonical_request(const struct sigv4_request *req, char **out);

/*
 * Build the string to sign from a canonical request and a scope. Returns 0
 * and a malloc'd string in *out, EINVAL (bad scope) or ENOMEM.
 */
int sigv4_string_to_sign(const char *canonical_request,
                         const struct sigv4_scope *scope, char **out);

/*
 * Derive the signing key from SECRET_KEY and SCOPE and sign STRING_TO_SIGN.
 * Writes the hex signature into OUT (SIGV4_HEX_LEN + 1 bytes). Returns 0,
 * EINVAL (bad scope) or EIO (libcrypto failure).
 */
int sigv4_signature(const char *secret_key, const struct sigv4_scope *scope,
                    const char *string_to_sign, char *out);

/*
 * The whole algorithm: returns 0 and a malloc'd Authorization header value
 * ("AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=..., Signature=...") in *out. Errors as above.
 */
int sigv4_authorization(const struct sigv4_request *req,
                        const struct sigv4_scope *scope,
                        const char *access_key, const char *secret_key,
                        char **out);

#endif /* S3CFS_SIGV4_H */
