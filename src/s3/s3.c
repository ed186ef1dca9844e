/*
 * s3.c - the S3 calls of s3.h: each builds a struct s3_request (method,
 * key, query, extra headers, body source, response sink, the check of a
 * 2xx answer) and hands it to s3_client_perform() (s3_client.c), which
 * borrows a connection, signs, sends, classifies the outcome with errmap
 * and retries when that is safe. Here too: Content-MD5 of bodies, the
 * s3fs metadata headers, and the check of a complete whose answer was
 * lost.
 */
#include "config.h"

#include "s3/s3_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/secret.h"
#include "base/text.h"
#include "s3/endpoint.h"
#include "s3/errmap.h"
#include "s3/sigv4.h"

#define LIST_BODY_MAX (32u << 20)       /* one ListObjectsV2 page */
#define SMALL_BODY_MAX (1u << 20)       /* multipart/copy results */
#define PART_ETAGS_XML_MAX (10000u * 200u)
#define META_LINES 8                    /* add_meta_headers(): Content-Type
                                           and the seven x-amz-meta-* */

static void base64(const unsigned char *in, size_t len, char *out, size_t cap)
{
    if (cap < 4 * ((len + 2) / 3) + 1) {
        out[0] = '\0';
        return;
    }
    EVP_EncodeBlock((unsigned char *)out, in, (int)len);
}

/* ------------------------------------------------------------ requests */

/* Append "name=value" (value encoded) to a query being built in BUF. */
static bool query_add(char *buf, size_t cap, const char *name, const char *value)
{
    char *encoded = sigv4_uri_encode(value, strlen(value), false);
    size_t used = strlen(buf);
    bool ok = false;

    if (encoded == NULL)
        return false;
    int n = snprintf(buf + used, cap - used, "%s%s=%s", used ? "&" : "", name,
                     encoded);
    ok = n >= 0 && (size_t)n < cap - used;
    free(encoded);
    return ok;
}

/* Room for a query of these values, each encoded (at most 3 bytes per
 * byte) with its name. */
static size_t query_room(const char *const *values, size_t count)
{
    size_t room = 256;
    for (size_t i = 0; i < count; i++)
        if (values[i] != NULL)
            room += 3 * strlen(values[i]) + 32;
    return room;
}

/* "partNumber=N&uploadId=ID" (PART_NUMBER 0: "uploadId=ID"), malloc'd, or
 * NULL when out of memory. Sized for any id: the journal keeps ids of up
 * to 2048 bytes, which a fixed 1 KiB buffer once refused. */
static char *upload_query(const char *upload_id, unsigned part_number)
{
    size_t room = query_room(&upload_id, 1);
    char *query = calloc(1, room);
    char number[16];

    if (query == NULL)
        return NULL;
    snprintf(number, sizeof(number), "%u", part_number);
    if ((part_number > 0 && !query_add(query, room, "partNumber", number)) ||
        !query_add(query, room, "uploadId", upload_id)) {
        free(query);
        return NULL;
    }
    return query;
}

/* req->parse for the XML answers (see struct s3_request). */
static int parse_listing(struct s3_request *req)
{
    return s3xml_parse_listing(req->xml->data ? req->xml->data : "",
                               req->xml->len, req->parse_out);
}

/* A PUT (object or part) is done only when its answer names the ETag the
 * server gave it: a 200 without one (a middlebox's error page, say) is no
 * proof that the data landed. */
static int parse_put_answer(struct s3_request *req)
{
    return req->answer_etag[0] != '\0' ? 0 : EPROTO;
}

static int parse_upload_id(struct s3_request *req)
{
    return s3xml_parse_upload_id(req->xml->data ? req->xml->data : "",
                                 req->xml->len, req->parse_out);
}

/* CopyObjectResult, CopyPartResult, CompleteMultipartUploadResult: the
 * ETag into *(char **)parse_out; an <Error> in their place (S3 sends it
 * after a 200 when the work fails) is EIO with its code in req->s3_code. */
static int parse_etag(struct s3_request *req)
{
    struct s3xml_error body_error;
    int err = s3xml_parse_etag_result(req->xml->data ? req->xml->data : "",
                                      req->xml->len, req->parse_out,
                                      &body_error);
    if (err == EIO)
        snprintf(req->s3_code, sizeof(req->s3_code), "%s", body_error.code);
    return err;
}

int s3_check_bucket(struct s3_client *client, const char *prefix,
                    struct s3_failure *why)
{
    char query[4096] = "";
    struct s3_buf xml = {.cap = LIST_BODY_MAX};
    struct s3_request req = {
        .op = S3_OP_LIST, .method = "GET", .query = query, .xml = &xml,
        .idempotent = true, .quiet = true, .wire_bytes = DEADLINE_LIST_BYTES,
    };
    int err;

    /* (url-encoded keys: Swift answers 500 to a page with a control
     * character in a key otherwise) */
    if (!query_add(query, sizeof(query), "encoding-type", "url") ||
        !query_add(query, sizeof(query), "list-type", "2") ||
        !query_add(query, sizeof(query), "max-keys", "1") ||
        !query_add(query, sizeof(query), "prefix", prefix ? prefix : "")) {
        why->err = ENAMETOOLONG;
        snprintf(why->description, sizeof(why->description), "prefix too long");
        return ENAMETOOLONG;
    }
    err = s3_client_perform(client, &req, why);
    if (err == 0) {
        struct s3xml_listing listing;
        err = s3xml_parse_listing(xml.data ? xml.data : "", xml.len, &listing);
        s3xml_listing_free(&listing);
        if (err != 0) {
            why->err = err;
            snprintf(why->description, sizeof(why->description),
                     "the endpoint's answer is not an S3 bucket listing");
        }
    }
    s3_buf_free(&xml);
    return err;
}

int s3_head_object(struct s3_client *client, const char *key,
                   struct s3_object_info *info)
{
    struct s3_request req = {
        .op = S3_OP_HEAD, .method = "HEAD", .key = key, .info = info,
        .idempotent = true,
    };
    return s3_client_perform(client, &req, NULL);
}

/*
 * What the two GETs share: REQ, of which the caller set only where the
 * answer goes (sink or buffer, and info), asks for LENGTH (> 0) bytes of
 * KEY from OFFSET, of the version IF_MATCH when not NULL (an If-Match
 * header), and is sent. Returns what s3_client_perform() returns.
 */
static int get_object(struct s3_client *client, const char *key,
                      uint64_t offset, uint64_t length, const char *if_match,
                      struct s3_request *req)
{
    char match_header[S3_ETAG_MAX + 16];
    int err;

    *req = (struct s3_request){
        .op = S3_OP_GET, .method = "GET", .key = key, .has_range = true,
        .range_offset = offset, .range_length = length, .if_match = if_match,
        .idempotent = true, .wire_bytes = length,
        /* where the answer goes: the caller's */
        .sink = req->sink, .recv_buf = req->recv_buf,
        .recv_cap = req->recv_cap, .info = req->info,
    };
    if (if_match != NULL) {
        snprintf(match_header, sizeof(match_header), "If-Match: %s", if_match);
        req->extra_headers[0] = match_header;
    }
    err = s3_client_perform(client, req, NULL);
    req->extra_headers[0] = NULL; /* (match_header ends here) */
    return err;
}

int s3_get_object_range(struct s3_client *client, const char *key,
                        uint64_t offset, size_t length, const char *if_match,
                        void *buf, size_t *received,
                        struct s3_object_info *info)
{
    struct s3_object_info local_info;
    struct s3_request req = {
        .recv_buf = buf, .recv_cap = length,
        .info = info ? info : &local_info,
    };
    int err;

    *received = 0;
    if (length == 0)
        return EINVAL;
    err = get_object(client, key, offset, length, if_match, &req);
    if (err == 0)
        *received = req.recv_len;
    return err;
}

int s3_get_object_stream(struct s3_client *client, const char *key,
                         uint64_t offset, uint64_t length, const char *if_match,
                         const struct s3_sink *sink, uint64_t *delivered,
                         struct s3_object_info *info)
{
    struct s3_request req = {.sink = sink, .info = info};
    int err;

    if (length == 0)
        return EINVAL;
    err = get_object(client, key, offset, length, if_match, &req);
    if (err == 0 && req.delivered != length)
        err = EIO; /* the object ended early: it is not the size we know */
    if (delivered != NULL)
        *delivered = req.delivered;
    return err;
}

int s3_list_objects(struct s3_client *client, const char *prefix,
                    const char *delimiter, const char *continuation_token,
                    const char *start_after, unsigned max_keys,
                    struct s3xml_listing *out)
{
    const char *values[] = {prefix, delimiter, continuation_token, start_after};
    size_t room = query_room(values, sizeof(values) / sizeof(values[0]));
    char *query = calloc(1, room);
    char max_keys_text[16];
    struct s3_buf xml = {.cap = LIST_BODY_MAX};
    struct s3_request req = {
        .op = S3_OP_LIST, .method = "GET", .query = query, .xml = &xml,
        .idempotent = true, .wire_bytes = DEADLINE_LIST_BYTES,
        .parse = parse_listing, .parse_out = out,
    };
    bool ok = query != NULL;
    int err = 0;

    memset(out, 0, sizeof(*out));
    if (!ok) {
        err = ENOMEM;
        goto out;
    }
    /* parameters in sorted order, as SigV4 canonicalises them */
    snprintf(max_keys_text, sizeof(max_keys_text), "%u",
             max_keys < 1 ? 1 : max_keys > 1000 ? 1000 : max_keys);
    if (continuation_token != NULL)
        ok = ok && query_add(query, room, "continuation-token", continuation_token);
    if (delimiter != NULL)
        ok = ok && query_add(query, room, "delimiter", delimiter);
    /* url-encoded keys survive XML (a raw CR in a key would not) */
    ok = ok && query_add(query, room, "encoding-type", "url");
    ok = ok && query_add(query, room, "list-type", "2");
    ok = ok && query_add(query, room, "max-keys", max_keys_text);
    ok = ok && query_add(query, room, "prefix", prefix ? prefix : "");
    if (start_after != NULL && continuation_token == NULL)
        ok = ok && query_add(query, room, "start-after", start_after);
    if (!ok) {
        err = ENOMEM;
        goto out;
    }
    err = s3_client_perform(client, &req, NULL);
    if (err == 0 && continuation_token != NULL && out->truncated &&
        strcmp(out->next_token, continuation_token) == 0) {
        log_warn("LIST %s: the server answered with the continuation token "
                 "it was asked for, so the listing would never end: it is "
                 "cut short here", prefix ? prefix : "");
        s3xml_listing_free(out);
        err = EIO;
    }
out:
    s3_buf_free(&xml);
    free(query);
    return err;
}

/* ------------------------------------------------------------- uploads */

/* Add the s3fs metadata headers of META to REQ starting at slot *slot,
 * formatted into STORAGE (META_LINES lines). */
static void add_meta_headers(struct s3_request *req, size_t *slot,
                             const struct s3_put_meta *meta,
                             char storage[META_LINES][160])
{
    size_t n = 0;
    if (meta == NULL)
        return;
    snprintf(storage[n], sizeof(storage[n]), "Content-Type: %s",
             meta->content_type ? meta->content_type : "application/octet-stream");
    req->extra_headers[(*slot)++] = storage[n++];
    if (meta->has_mode) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-mode: %u", meta->mode);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_uid) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-uid: %u", meta->uid);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_gid) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-gid: %u", meta->gid);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_mtime) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-mtime: %lld",
                 (long long)meta->mtime.tv_sec);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_atime) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-atime: %lld",
                 (long long)meta->atime.tv_sec);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_ctime) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-ctime: %lld",
                 (long long)meta->ctime.tv_sec);
        req->extra_headers[(*slot)++] = storage[n++];
    }
    if (meta->has_rdev) {
        snprintf(storage[n], sizeof(storage[n]), "x-amz-meta-rdev: %u", meta->rdev);
        req->extra_headers[(*slot)++] = storage[n++];
    }
}

/* The MD5 of a body (memory or file range) into DIGEST. */
static int body_md5_digest(const struct s3_body *body, unsigned char digest[16])
{
    unsigned int digest_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char *chunk = NULL;
    int err = 0;

    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_md5(), NULL) != 1) {
        err = EIO;
        goto out;
    }
    if (body->data != NULL) {
        EVP_DigestUpdate(ctx, body->data, body->length);
    } else {
        chunk = malloc(1u << 20);
        if (chunk == NULL) {
            err = ENOMEM;
            goto out;
        }
        for (uint64_t done = 0; done < body->length;) {
            uint64_t want = body->length - done;
            if (want > (1u << 20))
                want = 1u << 20;
            ssize_t got = pread(body->fd, chunk, (size_t)want,
                                (off_t)(body->offset + done));
            if (got <= 0) {
                err = got < 0 ? errno : EIO;
                goto out;
            }
            EVP_DigestUpdate(ctx, chunk, (size_t)got);
            done += (uint64_t)got;
        }
    }
    EVP_DigestFinal_ex(ctx, digest, &digest_len);
    if (digest_len != 16)
        err = EIO;
out:
    free(chunk);
    EVP_MD_CTX_free(ctx);
    return err;
}

/* Base64 MD5 of a body, for Content-MD5. */
static int body_md5(const struct s3_body *body, char *out, size_t cap)
{
    unsigned char digest[16];
    int err = body_md5_digest(body, digest);

    if (err == 0)
        base64(digest, sizeof(digest), out, cap);
    return err;
}

static void copy_etag(const struct s3_object_info *info, char *etag_out)
{
    if (etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", info->etag);
}

int s3_put_object(struct s3_client *client, const char *key,
                  const struct s3_body *body, const struct s3_put_meta *meta,
                  char *etag_out)
{
    char md5[32];
    char md5_header[64];
    char if_match_header[S3_ETAG_MAX + 16];
    char meta_storage[META_LINES][160];
    struct s3_object_info info;
    struct s3_put_meta default_meta = {0};
    struct s3_request req = {
        .op = S3_OP_PUT, .method = "PUT", .key = key, .body = body,
        .info = &info, .idempotent = true, .wire_bytes = body->length,
        .parse = parse_put_answer,
    };
    size_t slot = 0;
    int err = body_md5(body, md5, sizeof(md5));

    if (err != 0)
        return err;
    snprintf(md5_header, sizeof(md5_header), "Content-MD5: %s", md5);
    req.extra_headers[slot++] = md5_header;
    add_meta_headers(&req, &slot, meta ? meta : &default_meta, meta_storage);
    if (meta != NULL && meta->if_none_match) {
        /* a retry of a PUT that ran finds the key taken: also ESTALE */
        req.extra_headers[slot++] = "If-None-Match: *";
        req.quiet = true;
    }
    if (meta != NULL && meta->if_match != NULL) {
        snprintf(if_match_header, sizeof(if_match_header), "If-Match: %s",
                 meta->if_match);
        req.extra_headers[slot++] = if_match_header;
        req.quiet = true;
    }
    err = s3_client_perform(client, &req, NULL);
    if (err == 0)
        copy_etag(&info, etag_out);
    return err;
}

int s3_delete_object(struct s3_client *client, const char *key)
{
    struct s3_request req = {
        .op = S3_OP_DELETE, .method = "DELETE", .key = key, .idempotent = true,
    };
    int err = s3_client_perform(client, &req, NULL);
    return err == ENOENT ? 0 : err;
}

/* "x-amz-copy-source: /BUCKET/KEY" with the source URL-encoded (slashes
 * kept), malloc'd into *header. 0 or ENOMEM. */
static int copy_source_header(const struct s3_client *client,
                              const char *src_key, char **header)
{
    size_t len = strlen(client->bucket) + strlen(src_key) + 2;
    char *source = malloc(len);
    char *encoded = NULL;

    *header = NULL;
    if (source == NULL)
        return ENOMEM;
    snprintf(source, len, "%s/%s", client->bucket, src_key);
    encoded = sigv4_uri_encode(source, strlen(source), true);
    free(source);
    if (encoded == NULL)
        return ENOMEM;
    len = strlen(encoded) + 32;
    *header = malloc(len);
    if (*header != NULL)
        snprintf(*header, len, "x-amz-copy-source: /%s", encoded);
    free(encoded);
    return *header != NULL ? 0 : ENOMEM;
}

int s3_copy_object(struct s3_client *client, const char *src_key,
                   const char *src_etag, const char *dst_key,
                   const struct s3_put_meta *meta, char *etag_out)
{
    char meta_storage[META_LINES][160];
    char if_match_header[S3_ETAG_MAX + 40];
    struct s3_buf xml = {.cap = SMALL_BODY_MAX};
    char *etag = NULL;
    struct s3_failure failure;
    /* quiet: a failed condition is the caller's to report */
    struct s3_request req = {
        .op = S3_OP_COPY, .method = "PUT", .key = dst_key, .xml = &xml,
        .idempotent = true, .quiet = true,
        .server_bytes = DEADLINE_COPY_UNKNOWN,
        .parse = parse_etag, .parse_out = &etag,
    };
    char *source_header = NULL;
    size_t slot = 0;
    int err = copy_source_header(client, src_key, &source_header);

    if (err != 0)
        goto out;
    req.extra_headers[slot++] = source_header;
    if (src_etag != NULL) {
        snprintf(if_match_header, sizeof(if_match_header),
                 "x-amz-copy-source-if-match: %s", src_etag);
        req.extra_headers[slot++] = if_match_header;
    }
    if (meta != NULL) {
        req.extra_headers[slot++] = "x-amz-metadata-directive: REPLACE";
        add_meta_headers(&req, &slot, meta, meta_storage);
    }
    err = s3_client_perform(client, &req, &failure);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", etag);
    else if (err != 0 && err != ESTALE && err != ENOENT)
        log_warn("COPY %s -> %s: %s", src_key, dst_key, failure.description);
out:
    free(etag);
    free(source_header);
    s3_buf_free(&xml);
    return err;
}

int s3_multipart_create(struct s3_client *client, const char *key,
                        const struct s3_put_meta *meta, char **upload_id)
{
    char meta_storage[META_LINES][160];
    struct s3_put_meta default_meta = {0};
    struct s3_buf xml = {.cap = SMALL_BODY_MAX};
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "POST", .key = key, .query = "uploads=",
        .xml = &xml, .idempotent = false,
        .parse = parse_upload_id, .parse_out = upload_id,
    };
    size_t slot = 0;
    int err;

    *upload_id = NULL;
    add_meta_headers(&req, &slot, meta ? meta : &default_meta, meta_storage);
    err = s3_client_perform(client, &req, NULL);
    s3_buf_free(&xml);
    return err;
}

int s3_multipart_upload_part(struct s3_client *client, const char *key,
                             const char *upload_id, unsigned part_number,
                             const struct s3_body *body, char *etag_out)
{
    char *query = NULL;
    char md5[32];
    char md5_header[64];
    struct s3_object_info info;
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "PUT", .key = key, .body = body,
        .info = &info, .idempotent = true, .wire_bytes = body->length,
        .parse = parse_put_answer,
    };
    int err;

    if (part_number < 1 || part_number > 10000)
        return EINVAL;
    err = body_md5(body, md5, sizeof(md5));
    if (err != 0)
        goto out;
    if ((query = upload_query(upload_id, part_number)) == NULL) {
        err = ENOMEM;
        goto out;
    }
    req.query = query;
    snprintf(md5_header, sizeof(md5_header), "Content-MD5: %s", md5);
    req.extra_headers[0] = md5_header;
    err = s3_client_perform(client, &req, NULL);
    if (err == 0)
        copy_etag(&info, etag_out);
out:
    free(query);
    return err;
}

int s3_multipart_copy_part(struct s3_client *client, const char *key,
                           const char *upload_id, unsigned part_number,
                           const char *src_key, const char *src_etag,
                           uint64_t offset, uint64_t length, char *etag_out)
{
    char *query = NULL;
    char range_header[96];
    char *if_match_header = NULL;
    char *source_header = NULL;
    char *etag = NULL;
    struct s3_buf xml = {.cap = SMALL_BODY_MAX};
    struct s3_failure failure;
    /* quiet: no UploadPartCopy, or a changed source, is the caller's to
     * report */
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "PUT", .key = key,
        .xml = &xml, .idempotent = true, .quiet = true, .server_bytes = length,
        .parse = parse_etag, .parse_out = &etag,
    };
    size_t slot = 0;
    int err = 0;

    if (part_number < 1 || part_number > 10000 || length == 0 ||
        offset + length < offset)
        return EINVAL;
    if ((query = upload_query(upload_id, part_number)) == NULL) {
        err = ENOMEM;
        goto out;
    }
    req.query = query;
    err = copy_source_header(client, src_key, &source_header);
    if (err != 0)
        goto out;
    req.extra_headers[slot++] = source_header;
    snprintf(range_header, sizeof(range_header),
             "x-amz-copy-source-range: bytes=%llu-%llu",
             (unsigned long long)offset,
             (unsigned long long)(offset + length - 1));
    req.extra_headers[slot++] = range_header;
    if (src_etag != NULL) {
        size_t len = strlen(src_etag) + 40;
        if_match_header = malloc(len);
        if (if_match_header == NULL) {
            err = ENOMEM;
            goto out;
        }
        snprintf(if_match_header, len, "x-amz-copy-source-if-match: %s",
                 src_etag);
        req.extra_headers[slot++] = if_match_header;
    }
    err = s3_client_perform(client, &req, &failure);
    if (err == 0)
        snprintf(etag_out, S3_ETAG_MAX, "%s", etag);
    else if (err != ENOSYS && err != ESTALE)
        log_warn("PUT %s (copy part %u from %s): %s", key, part_number,
                 src_key, failure.description);
out:
    free(etag);
    free(if_match_header);
    free(source_header);
    free(query);
    s3_buf_free(&xml);
    return err;
}

/* ------------------------------------------------- completing uploads */

/* The 16 bytes of an ETag that is a quoted (or bare) 32-digit MD5. */
static bool etag_md5(const char *etag, unsigned char md5[16])
{
    size_t len = strlen(etag);

    if (len >= 2 && etag[0] == '"' && etag[len - 1] == '"') {
        etag++;
        len -= 2;
    }
    if (len != 32)
        return false;
    for (size_t i = 0; i < 16; i++) {
        int hi = text_hex_digit(etag[2 * i]), lo = text_hex_digit(etag[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        md5[i] = (unsigned char)(hi << 4 | lo);
    }
    return true;
}

static void hex_text(const unsigned char *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

/* The ETag AWS and Swift give the object of these parts, unquoted:
 * hex(MD5(part MD5s))-N. False when a part's ETag is not an MD5. */
static bool multipart_etag(const char *const *part_etags, unsigned part_count,
                           char out[48])
{
    unsigned char md5[16], digest[16];
    unsigned int digest_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1;

    for (unsigned i = 0; ok && i < part_count; i++) {
        ok = etag_md5(part_etags[i], md5) &&
             EVP_DigestUpdate(ctx, md5, sizeof(md5)) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, digest, &digest_len) == 1 &&
         digest_len == sizeof(digest);
    if (ok) {
        hex_text(digest, sizeof(digest), out);
        snprintf(out + 32, 16, "-%u", part_count);
    }
    EVP_MD_CTX_free(ctx);
    return ok;
}

static bool etag_equals(const char *etag, const char *unquoted)
{
    size_t len = strlen(etag);

    if (len >= 2 && etag[0] == '"' && etag[len - 1] == '"') {
        etag++;
        len -= 2;
    }
    return len == strlen(unquoted) && strncasecmp(etag, unquoted, len) == 0;
}

/*
 * After a failed complete whose earlier attempt may have run: whether KEY
 * in the bucket is the object of these parts (see
 * s3_multipart_complete_object()). 0 with its ETag in ETAG_OUT, ESTALE
 * when it is not (or cannot be shown to be), or HEAD's errno.
 */
static int complete_check_object(struct s3_client *client, const char *key,
                                 const char *const *part_etags,
                                 unsigned part_count,
                                 const struct s3_body *whole, char *etag_out)
{
    struct s3_object_info info;
    char expected[48];
    unsigned char md5[16], whole_md5[16];
    const char *proof = NULL;
    int err = s3_head_object(client, key, &info);

    if (err != 0)
        return err;
    if (whole != NULL && info.size != whole->length)
        return ESTALE;
    if (multipart_etag(part_etags, part_count, expected) &&
        etag_equals(info.etag, expected)) {
        proof = "its ETag is that of these parts";
    } else if (whole != NULL && (whole->data != NULL || whole->fd >= 0) &&
               etag_md5(info.etag, md5)) {
        /* a plain MD5 of the object (s3rver): hash what was uploaded */
        err = body_md5_digest(whole, whole_md5);
        if (err != 0)
            return err;
        if (memcmp(md5, whole_md5, sizeof(md5)) == 0)
            proof = "its ETag is the MD5 of the bytes uploaded";
    }
    if (proof == NULL)
        return ESTALE;
    log_info("complete multipart %s: the answer to an earlier attempt was "
             "lost, and the object in the bucket is this upload (%s, %llu "
             "bytes)", key, proof, (unsigned long long)info.size);
    copy_etag(&info, etag_out);
    return 0;
}

int s3_multipart_complete(struct s3_client *client, const char *key,
                          const char *upload_id, const char *const *part_etags,
                          unsigned part_count, char *etag_out)
{
    return s3_multipart_complete_object(client, key, upload_id, part_etags,
                                        part_count, NULL, etag_out);
}

int s3_multipart_complete_object(struct s3_client *client, const char *key,
                                 const char *upload_id,
                                 const char *const *part_etags,
                                 unsigned part_count,
                                 const struct s3_body *whole, char *etag_out)
{
    char *query = NULL;
    struct s3_buf body = {.cap = PART_ETAGS_XML_MAX};
    struct s3_buf xml = {.cap = SMALL_BODY_MAX};
    char *etag = NULL;
    /* without the size, count 8 MiB (write-behind's part) per part */
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "POST", .key = key,
        .xml = &xml, .idempotent = true,
        .server_bytes = whole != NULL ? whole->length
                                      : (uint64_t)part_count * (8u << 20),
        .parse = parse_etag, .parse_out = &etag,
    };
    char part[S3_ETAG_MAX + 96];
    bool ok = s3_buf_append(&body, "<CompleteMultipartUpload>", 25);
    int err = 0;

    for (unsigned i = 0; ok && i < part_count; i++) {
        int n = snprintf(part, sizeof(part),
                         "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
                         i + 1, part_etags[i]);
        ok = n > 0 && (size_t)n < sizeof(part) &&
             s3_buf_append(&body, part, (size_t)n);
    }
    ok = ok && s3_buf_append(&body, "</CompleteMultipartUpload>", 26) &&
         (query = upload_query(upload_id, 0)) != NULL;
    if (!ok) {
        err = ENOMEM;
        goto out;
    }
    req.query = query;
    req.post_data = body.data;
    req.post_len = body.len;
    err = s3_client_perform(client, &req, NULL);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", etag);
    /* (curl itself sends a request again, unseen here, when the answer
     * on a kept-alive connection breaks off before its first byte: so a
     * NoSuchUpload is checked as well, even from a first attempt) */
    if (err != 0 && (req.may_have_run || err == ENOENT)) {
        int check = complete_check_object(client, key, part_etags, part_count,
                                          whole, etag_out);
        if (check == 0)
            err = 0;
        else
            log_warn("complete multipart %s: an attempt may have completed "
                     "it, but the object in the bucket cannot be shown to be "
                     "this upload (%s)", key,
                     check == ESTALE ? "another size or ETag" : strerror(check));
    }
out:
    free(etag);
    free(query);
    s3_buf_free(&body);
    s3_buf_free(&xml);
    return err;
}

int s3_multipart_abort(struct s3_client *client, const char *key,
                       const char *upload_id)
{
    char *query = upload_query(upload_id, 0);
    struct s3_failure failure;
    /* quiet: a server that cannot abort (ENOSYS) is the caller's to report */
    struct s3_request req = {
        .op = S3_OP_DELETE, .method = "DELETE", .key = key, .query = query,
        .idempotent = true, .quiet = true,
    };
    int err;

    if (query == NULL)
        return ENOMEM;
    err = s3_client_perform(client, &req, &failure);
    if (err != 0 && err != ENOENT && err != ENOSYS)
        log_warn("DELETE %s (abort multipart upload): %s", key,
                 failure.description);
    free(query);
    return err == ENOENT ? 0 : err;
}
