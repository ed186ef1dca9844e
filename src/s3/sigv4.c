/*
 * sigv4.c - AWS Signature Version 4 request signing (see sigv4.h).
 *
 * The four steps of the algorithm are kept apart: the canonical request
 * (method, canonical URI, canonical query, canonical headers, signed header
 * list, payload hash), the string to sign (algorithm, date, credential
 * scope, SHA-256 of the canonical request), the signature (HMAC-SHA256 chain
 * AWS4<secret> -> date -> region -> service -> "aws4_request", then over the
 * string to sign) and the Authorization value that assembles them. Strings
 * are built in a small growable buffer that remembers an allocation failure
 * so that callers check once at the end. SHA-256 and HMAC-SHA256 come from
 * OpenSSL 3 libcrypto. No global state; key material is wiped after use.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "s3/sigv4.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/text.h"

#define ALGORITHM "AWS4-HMAC-SHA256"
#define TERMINATOR "aws4_request"
#define SHA256_LEN 32
#define AMZ_DATE_LEN 16  /* YYYYMMDDTHHMMSSZ */
#define DATE_LEN 8       /* YYYYMMDD */
/* The signing key "AWS4" + secret lives on the stack: longer secrets
 * (real ones are 40 bytes) are refused with EINVAL. */
#define MAX_SECRET_LEN 1024

/* ------------------------------------------------------------ buffer */

struct buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;  /* an allocation failed: the content is incomplete */
};

static void buf_append(struct buf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (n > SIZE_MAX - b->len - 1) {
        b->failed = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *nd = realloc(b->data, cap);
        if (nd == NULL) {
            b->failed = true;
            return;
        }
        b->data = nd;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_puts(struct buf *b, const char *s)
{
    buf_append(b, s, strlen(s));
}

static void buf_putc(struct buf *b, char c)
{
    buf_append(b, &c, 1);
}

/* Hand the string over to *out (0), or free it and return ENOMEM. */
static int buf_finish(struct buf *b, char **out)
{
    if (!b->failed && b->data == NULL)
        buf_append(b, "", 0);
    if (b->failed) {
        free(b->data);
        *b = (struct buf){0};
        return ENOMEM;
    }
    *out = b->data;
    *b = (struct buf){0};
    return 0;
}

static void buf_free(struct buf *b)
{
    free(b->data);
    *b = (struct buf){0};
}

/* ------------------------------------------------------- encodings */

static bool is_unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
           c == '~';
}

static void encode_into(struct buf *b, const char *in, size_t len,
                        bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";

    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (is_unreserved(c) || (keep_slash && c == '/')) {
            buf_putc(b, (char)c);
        } else {
            char esc[3] = {'%', hex[c >> 4], hex[c & 0x0f]};
            buf_append(b, esc, sizeof(esc));
        }
    }
}

char *sigv4_uri_encode(const char *in, size_t len, bool keep_slash)
{
    struct buf b = {0};
    char *out = NULL;

    if (in == NULL && len > 0)
        return NULL;
    encode_into(&b, in, len, keep_slash);
    if (buf_finish(&b, &out) != 0)
        return NULL;
    return out;
}

/*
 * Decode %XX sequences of IN into DST (room for LEN bytes); a '%' not
 * followed by two hex digits is kept as is. '+' is not a space here: SigV4
 * signs it as %2B. Returns the decoded length.
 */
static size_t percent_decode(const char *in, size_t len, char *dst)
{
    size_t n = 0;

    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (in[i] == '%' && i + 2 < len &&
            (hi = text_hex_digit(in[i + 1])) >= 0 &&
            (lo = text_hex_digit(in[i + 2])) >= 0) {
            dst[n++] = (char)((hi << 4) | lo);
            i += 2;
        } else {
            dst[n++] = in[i];
        }
    }
    return n;
}

static void hex_lower(const unsigned char *md, size_t len, char *out)
{
    static const char hex[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 0x0f];
    }
    out[2 * len] = '\0';
}

/* ----------------------------------------------------------- crypto */

static int sha256_raw(const void *data, size_t len,
                      unsigned char md[SHA256_LEN])
{
    unsigned int mdlen = 0;

    if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1 ||
        mdlen != SHA256_LEN)
        return EIO;
    return 0;
}

/* On a libcrypto failure OUT is left empty, so no signature can match. */
void sigv4_sha256_hex(const void *data, size_t len, char *out)
{
    unsigned char md[SHA256_LEN];

    if (out == NULL)
        return;
    out[0] = '\0';
    if (data == NULL) {
        if (len > 0)
            return;
        data = "";
    }
    if (sha256_raw(data, len, md) != 0)
        return;
    hex_lower(md, sizeof(md), out);
}

static int hmac_sha256(const void *key, size_t keylen, const void *data,
                       size_t len, unsigned char mac[SHA256_LEN])
{
    unsigned int maclen = 0;

    if (keylen > INT_MAX)
        return EINVAL;
    if (HMAC(EVP_sha256(), key, (int)keylen, data, len, mac, &maclen) ==
            NULL ||
        maclen != SHA256_LEN)
        return EIO;
    return 0;
}

/* ------------------------------------------------------ canonical URI */

struct span {
    const char *p;
    size_t len;
};

/*
 * The generic (non-S3) rules: remove dot segments (RFC 3986 section 5.2.4),
 * merge runs of '/', keep a trailing '/', and percent-encode every segment;
 * the path given is already encoded, so that encoding is the second one.
 */
static int append_normalized_path(struct buf *b, const char *path)
{
    size_t plen = strlen(path);
    size_t nseg = 0, maxseg = 1;
    struct span *segs = NULL;
    bool trailing = false;
    int err = 0;

    for (size_t i = 0; i < plen; i++)
        if (path[i] == '/')
            maxseg++;
    segs = calloc(maxseg, sizeof(*segs));
    if (segs == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= plen;) {
        size_t j = i;
        while (j < plen && path[j] != '/')
            j++;
        const char *seg = path + i;
        size_t slen = j - i;
        bool last = j >= plen;
        bool dot = slen == 1 && seg[0] == '.';
        bool dotdot = slen == 2 && seg[0] == '.' && seg[1] == '.';

        if (dot || dotdot) {
            if (dotdot && nseg > 0)
                nseg--;
            if (last)
                trailing = true;
        } else if (slen > 0) {
            segs[nseg].p = seg;
            segs[nseg].len = slen;
            nseg++;
        } else if (last) {
            trailing = true;
        }
        i = j + 1;
    }
    if (nseg == 0) {
        buf_putc(b, '/');
        goto out;
    }
    for (size_t k = 0; k < nseg; k++) {
        buf_putc(b, '/');
        encode_into(b, segs[k].p, segs[k].len, false);
    }
    if (trailing)
        buf_putc(b, '/');
out:
    free(segs);
    return err;
}

static int append_canonical_uri(struct buf *b, const char *path,
                                bool normalize)
{
    if (path == NULL || path[0] == '\0') {
        buf_putc(b, '/');
        return 0;
    }
    if (!normalize) {
        buf_puts(b, path);
        return 0;
    }
    return append_normalized_path(b, path);
}

/* ---------------------------------------------------- canonical query */

struct qparam {
    char *name;   /* encoded */
    char *value;  /* encoded */
};

static int qparam_cmp(const void *a, const void *b)
{
    const struct qparam *x = a, *y = b;
    int c = strcmp(x->name, y->name);

    return c != 0 ? c : strcmp(x->value, y->value);
}

/* Decode then re-encode LEN bytes of IN into a new string (NULL: ENOMEM). */
static char *reencode(const char *in, size_t len, char *scratch)
{
    size_t n = percent_decode(in, len, scratch);

    return sigv4_uri_encode(scratch, n, false);
}

static int append_canonical_query(struct buf *b, const char *query)
{
    size_t qlen, nmax = 1, n = 0;
    struct qparam *params = NULL;
    char *scratch = NULL;
    int err = 0;

    if (query == NULL || query[0] == '\0')
        return 0;
    qlen = strlen(query);
    for (size_t i = 0; i < qlen; i++)
        if (query[i] == '&')
            nmax++;
    params = calloc(nmax, sizeof(*params));
    scratch = malloc(qlen + 1);
    if (params == NULL || scratch == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= qlen;) {
        size_t j = i;
        while (j < qlen && query[j] != '&')
            j++;
        if (j > i) {
            const char *p = query + i;
            const char *eq = memchr(p, '=', j - i);
            size_t nlen = eq ? (size_t)(eq - p) : j - i;
            size_t vlen = eq ? j - i - nlen - 1 : 0;

            params[n].name = reencode(p, nlen, scratch);
            params[n].value = reencode(eq ? eq + 1 : "", vlen, scratch);
            n++;
            if (params[n - 1].name == NULL || params[n - 1].value == NULL) {
                err = ENOMEM;
                goto out;
            }
        }
        i = j + 1;
    }
    qsort(params, n, sizeof(*params), qparam_cmp);
    for (size_t k = 0; k < n; k++) {
        if (k > 0)
            buf_putc(b, '&');
        buf_puts(b, params[k].name);
        buf_putc(b, '=');
        buf_puts(b, params[k].value);
    }
out:
    for (size_t k = 0; params != NULL && k < n; k++) {
        free(params[k].name);
        free(params[k].value);
    }
    free(params);
    free(scratch);
    return err;
}

/* -------------------------------------------------- canonical headers */

struct hentry {
    char *name;   /* lower-cased */
    char *value;  /* trimmed, whitespace runs folded */
    size_t index; /* position in the request: keeps duplicates in order */
};

static int hentry_cmp(const void *a, const void *b)
{
    const struct hentry *x = a, *y = b;
    int c = strcmp(x->name, y->name);

    if (c != 0)
        return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' ||
           c == '\f';
}

/* A header name is a non-empty token: no ':', whitespace or controls. */
static bool header_name_ok(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p <= 0x20 || *p == 0x7f || *p == ':')
            return false;
    return true;
}

static char *lower_dup(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);

    if (d == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        d[i] = (s[i] >= 'A' && s[i] <= 'Z') ? (char)(s[i] - 'A' + 'a') : s[i];
    d[n] = '\0';
    return d;
}

static char *fold_dup(const char *s)
{
    size_t n = 0;
    bool pending_space = false;
    char *d = malloc(strlen(s) + 1);

    if (d == NULL)
        return NULL;
    for (; *s; s++) {
        if (is_space(*s)) {
            pending_space = n > 0;
            continue;
        }
        if (pending_space)
            d[n++] = ' ';
        pending_space = false;
        d[n++] = *s;
    }
    d[n] = '\0';
    return d;
}

static int append_canonical_headers(struct buf *b, struct buf *signed_hdrs,
                                    const struct sigv4_header *headers,
                                    size_t count)
{
    struct hentry *ent = NULL;
    size_t n = 0;
    int err = 0;

    if (count == 0)
        return 0;
    ent = calloc(count, sizeof(*ent));
    if (ent == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (; n < count; n++) {
        ent[n].index = n;
        ent[n].name = lower_dup(headers[n].name);
        ent[n].value = fold_dup(headers[n].value);
        if (ent[n].name == NULL || ent[n].value == NULL) {
            n++;
            err = ENOMEM;
            goto out;
        }
    }
    qsort(ent, n, sizeof(*ent), hentry_cmp);
    for (size_t k = 0; k < n; k++) {
        bool first = k == 0 || strcmp(ent[k].name, ent[k - 1].name) != 0;
        bool last = k + 1 == n || strcmp(ent[k].name, ent[k + 1].name) != 0;

        if (first) {
            if (k > 0)
                buf_putc(signed_hdrs, ';');
            buf_puts(signed_hdrs, ent[k].name);
            buf_puts(b, ent[k].name);
            buf_putc(b, ':');
        } else {
            buf_putc(b, ',');
        }
        buf_puts(b, ent[k].value);
        if (last)
            buf_putc(b, '\n');
    }
out:
    for (size_t k = 0; ent != NULL && k < n; k++) {
        free(ent[k].name);
        free(ent[k].value);
    }
    free(ent);
    return err;
}

/* --------------------------------------------------- canonical request */

static int check_request(const struct sigv4_request *req)
{
    if (req == NULL || req->method == NULL || req->method[0] == '\0' ||
        req->payload_hash == NULL || req->payload_hash[0] == '\0')
        return EINVAL;
    if (req->header_count > 0 && req->headers == NULL)
        return EINVAL;
    for (size_t i = 0; i < req->header_count; i++)
        if (!header_name_ok(req->headers[i].name) ||
            req->headers[i].value == NULL)
            return EINVAL;
    return 0;
}

/* The canonical request and, if SIGNED_OUT, the signed header list. */
static int build_canonical(const struct sigv4_request *req, char **creq_out,
                           char **signed_out)
{
    struct buf b = {0}, sh = {0};
    int err;

    err = check_request(req);
    if (err != 0)
        goto out;
    buf_puts(&b, req->method);
    buf_putc(&b, '\n');
    err = append_canonical_uri(&b, req->path, req->normalize_path);
    if (err != 0)
        goto out;
    buf_putc(&b, '\n');
    err = append_canonical_query(&b, req->query);
    if (err != 0)
        goto out;
    buf_putc(&b, '\n');
    err = append_canonical_headers(&b, &sh, req->headers, req->header_count);
    if (err == 0 && sh.failed)
        err = ENOMEM;
    if (err != 0)
        goto out;
    buf_putc(&b, '\n');
    buf_append(&b, sh.data ? sh.data : "", sh.len);
    buf_putc(&b, '\n');
    buf_puts(&b, req->payload_hash);
    err = buf_finish(&b, creq_out);
    if (err != 0)
        goto out;
    if (signed_out != NULL) {
        err = buf_finish(&sh, signed_out);
        if (err != 0) {
            free(*creq_out);
            *creq_out = NULL;
        }
    }
out:
    buf_free(&b);
    buf_free(&sh);
    return err;
}

int sigv4_canonical_request(const struct sigv4_request *req, char **out)
{
    if (out == NULL)
        return EINVAL;
    *out = NULL;
    return build_canonical(req, out, NULL);
}

/* ----------------------------------------------------- string to sign */

static bool scope_part_ok(const char *s)
{
    if (s == NULL || s[0] == '\0')
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= 0x20 || *p == 0x7f || *p == '/')
            return false;
    return true;
}

static bool scope_ok(const struct sigv4_scope *scope)
{
    const char *d;

    if (scope == NULL || scope->amz_date == NULL ||
        !scope_part_ok(scope->region) || !scope_part_ok(scope->service))
        return false;
    d = scope->amz_date;
    if (strlen(d) != AMZ_DATE_LEN || d[DATE_LEN] != 'T' ||
        d[AMZ_DATE_LEN - 1] != 'Z')
        return false;
    for (size_t i = 0; i < AMZ_DATE_LEN - 1; i++)
        if (i != DATE_LEN && (d[i] < '0' || d[i] > '9'))
            return false;
    return true;
}

/* "DATE/REGION/SERVICE/aws4_request" */
static void append_credential_scope(struct buf *b,
                                    const struct sigv4_scope *scope)
{
    buf_append(b, scope->amz_date, DATE_LEN);
    buf_putc(b, '/');
    buf_puts(b, scope->region);
    buf_putc(b, '/');
    buf_puts(b, scope->service);
    buf_puts(b, "/" TERMINATOR);
}

int sigv4_string_to_sign(const char *canonical_request,
                         const struct sigv4_scope *scope, char **out)
{
    struct buf b = {0};
    unsigned char md[SHA256_LEN];
    char hex[SIGV4_HEX_LEN + 1];
    int err;

    if (out == NULL)
        return EINVAL;
    *out = NULL;
    if (canonical_request == NULL || !scope_ok(scope)) {
        err = EINVAL;
        goto out;
    }
    err = sha256_raw(canonical_request, strlen(canonical_request), md);
    if (err != 0)
        goto out;
    hex_lower(md, sizeof(md), hex);
    buf_puts(&b, ALGORITHM "\n");
    buf_puts(&b, scope->amz_date);
    buf_putc(&b, '\n');
    append_credential_scope(&b, scope);
    buf_putc(&b, '\n');
    buf_puts(&b, hex);
    err = buf_finish(&b, out);
out:
    buf_free(&b);
    return err;
}

/* ---------------------------------------------------------- signature */

int sigv4_signature(const char *secret_key, const struct sigv4_scope *scope,
                    const char *string_to_sign, char *out)
{
    unsigned char key[4 + MAX_SECRET_LEN];
    unsigned char k1[SHA256_LEN], k2[SHA256_LEN], k3[SHA256_LEN];
    unsigned char k4[SHA256_LEN], mac[SHA256_LEN];
    size_t slen;
    int err;

    if (out == NULL)
        return EINVAL;
    out[0] = '\0';
    if (secret_key == NULL || string_to_sign == NULL || !scope_ok(scope))
        return EINVAL;
    slen = strlen(secret_key);
    if (slen > MAX_SECRET_LEN)
        return EINVAL;
    memcpy(key, "AWS4", 4);
    memcpy(key + 4, secret_key, slen);

    err = hmac_sha256(key, 4 + slen, scope->amz_date, DATE_LEN, k1);
    if (err != 0)
        goto out;
    err = hmac_sha256(k1, sizeof(k1), scope->region, strlen(scope->region),
                      k2);
    if (err != 0)
        goto out;
    err = hmac_sha256(k2, sizeof(k2), scope->service, strlen(scope->service),
                      k3);
    if (err != 0)
        goto out;
    err = hmac_sha256(k3, sizeof(k3), TERMINATOR, strlen(TERMINATOR), k4);
    if (err != 0)
        goto out;
    err = hmac_sha256(k4, sizeof(k4), string_to_sign, strlen(string_to_sign),
                      mac);
    if (err != 0)
        goto out;
    hex_lower(mac, sizeof(mac), out);
out:
    OPENSSL_cleanse(key, sizeof(key));
    OPENSSL_cleanse(k1, sizeof(k1));
    OPENSSL_cleanse(k2, sizeof(k2));
    OPENSSL_cleanse(k3, sizeof(k3));
    OPENSSL_cleanse(k4, sizeof(k4));
    return err;
}

/* ------------------------------------------------------ authorization */

int sigv4_authorization(const struct sigv4_request *req,
                        const struct sigv4_scope *scope,
                        const char *access_key, const char *secret_key,
                        char **out)
{
    struct buf b = {0};
    char *creq = NULL, *signed_hdrs = NULL, *sts = NULL;
    char sig[SIGV4_HEX_LEN + 1];
    int err;

    if (out == NULL)
        return EINVAL;
    *out = NULL;
    if (!scope_part_ok(access_key)) {
        err = EINVAL;
        goto out;
    }
    err = build_canonical(req, &creq, &signed_hdrs);
    if (err != 0)
        goto out;
    err = sigv4_string_to_sign(creq, scope, &sts);
    if (err != 0)
        goto out;
    err = sigv4_signature(secret_key, scope, sts, sig);
    if (err != 0)
        goto out;
    buf_puts(&b, ALGORITHM " Credential=");
    buf_puts(&b, access_key);
    buf_putc(&b, '/');
    append_credential_scope(&b, scope);
    buf_puts(&b, ", SignedHeaders=");
    buf_puts(&b, signed_hdrs);
    buf_puts(&b, ", Signature=");
    buf_puts(&b, sig);
    err = buf_finish(&b, out);
out:
    buf_free(&b);
    free(creq);
    free(signed_hdrs);
    free(sts);
    return err;
}
