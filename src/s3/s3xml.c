/*
 * s3xml.c - expat parsers for the XML bodies S3 returns.
 *
 * One streaming pass per body. A small context tracks the element depth, the
 * root element and the depth-2 section (Contents, CommonPrefixes); a table
 * says which leaf elements are captured. Element names are compared by local
 * name only: the parser splits "namespace-URI<SEP>local", so the S3 default
 * namespace, s3rver's misspelt one and none at all all work alike.
 *
 * Hostile bodies: DOCTYPE declarations are refused outright (no entity can
 * be declared, so none can be expanded), every captured text is capped at
 * S3XML_MAX_TEXT and a listing page at MAX_ENTRIES entries.
 *
 * EncodingType=url: S3 percent-encodes keys and prefixes. Only %XX is
 * decoded; '+' stays '+'. AWS, Ceph and Swift encode a literal '+' in a key
 * as %2B and a space as %20, so reading '+' as a space would corrupt keys
 * that contain '+'. The bytes decoded are the key, UTF-8 or not. The
 * continuation token is opaque and never decoded (the S3 API encodes
 * only Delimiter, Prefix, Key and StartAfter).
 *
 * Keys sent raw: a server that ignores encoding-type=url (s3rver) writes
 * keys into the XML as they are, bytes XML 1.0 cannot carry (controls,
 * not UTF-8) included, and expat would refuse the whole page for one of
 * them. Such bytes are fed to expat as '|' (scrub(), a copy made only
 * when there are any), and a key's text is taken from the body's own
 * bytes wherever expat hands it out as it stands there (key_bytes()): the
 * key is read exactly, a raw CR too (XML would read it as LF). The body
 * is read as UTF-8 whatever its declaration says, so scrub() and expat
 * agree on what a character is. A key no C string holds (a NUL) or that
 * cannot be decoded is left out of the page, kept in listing->skipped.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE 1 /* timegm() */
#endif

#include "s3/s3xml.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <expat.h>

#include "base/text.h"

/* Namespace separator: a character XML forbids even as a character
 * reference, so it can never be part of a namespace URI or a name. */
#define NS_SEP '\x01'

/* Most entries (objects plus prefixes) accepted in one listing page. S3
 * sends at most 1000. */
#define MAX_ENTRIES 100000

/* Bytes handed to XML_Parse() per call (it takes an int length). */
#define FEED_CHUNK 65536

enum doc_kind { KIND_LISTING, KIND_ERROR, KIND_UPLOAD_ID, KIND_ETAG };

enum root {
    ROOT_NONE,
    ROOT_LISTING,   /* ListBucketResult */
    ROOT_ERROR,     /* Error */
    ROOT_UPLOAD,    /* InitiateMultipartUploadResult */
    ROOT_ETAG,      /* CopyObjectResult, CopyPartResult,
                       CompleteMultipartUploadResult */
};

enum section { SEC_NONE, SEC_CONTENTS, SEC_PREFIXES, SEC_OTHER };

enum field {
    F_NONE,
    F_TRUNCATED,
    F_NEXT_TOKEN,
    F_ENCODING,
    F_KEY,
    F_SIZE,
    F_ETAG,
    F_MTIME,
    F_PREFIX,
    F_CODE,
    F_MESSAGE,
    F_UPLOAD_ID,
    F_RESULT_ETAG,
};

/* Which leaf elements are captured, by root, depth and section. */
static const struct field_rule {
    enum root root;
    unsigned depth;
    enum section section;   /* only checked below depth 2 */
    const char *name;
    enum field field;
} field_rules[] = {
    { ROOT_LISTING, 2, SEC_NONE, "IsTruncated", F_TRUNCATED },
    { ROOT_LISTING, 2, SEC_NONE, "NextContinuationToken", F_NEXT_TOKEN },
    { ROOT_LISTING, 2, SEC_NONE, "EncodingType", F_ENCODING },
    { ROOT_LISTING, 3, SEC_CONTENTS, "Key", F_KEY },
    { ROOT_LISTING, 3, SEC_CONTENTS, "Size", F_SIZE },
    { ROOT_LISTING, 3, SEC_CONTENTS, "ETag", F_ETAG },
    { ROOT_LISTING, 3, SEC_CONTENTS, "LastModified", F_MTIME },
    { ROOT_LISTING, 3, SEC_PREFIXES, "Prefix", F_PREFIX },
    { ROOT_ERROR, 2, SEC_NONE, "Code", F_CODE },
    { ROOT_ERROR, 2, SEC_NONE, "Message", F_MESSAGE },
    { ROOT_UPLOAD, 2, SEC_NONE, "UploadId", F_UPLOAD_ID },
    { ROOT_ETAG, 2, SEC_NONE, "ETag", F_RESULT_ETAG },
};

/* Bits of parse_ctx.seen: fields met so far in the current scope. */
enum {
    SEEN_KEY = 1u << 0,
    SEEN_SIZE = 1u << 1,
    SEEN_ETAG = 1u << 2,
    SEEN_MTIME = 1u << 3,
    SEEN_TRUNCATED = 1u << 4,
    SEEN_NEXT_TOKEN = 1u << 5,
    SEEN_ENCODING = 1u << 6,
    SEEN_CODE = 1u << 7,
    SEEN_MESSAGE = 1u << 8,
    SEEN_VALUE = 1u << 9,
};

struct parse_ctx {
    XML_Parser parser;
    enum doc_kind kind;
    int err;                    /* first failure; parser stopped */
    unsigned depth;             /* root element is depth 1 */
    enum root root;
    enum section section;       /* depth-2 element we are inside */
    enum field field;           /* leaf being captured, F_NONE if none */
    unsigned seen;              /* document-wide SEEN_* bits */
    unsigned obj_seen;          /* SEEN_* bits of the current <Contents> */
    size_t text_len;
    char text[S3XML_MAX_TEXT + 1];
    bool text_has_nul;          /* the key being captured holds a NUL */

    /* the body as received, and what expat reads: the same, or a copy
     * with '|' for the bytes XML cannot carry (see the file header) */
    const char *raw;
    const char *fed;
    size_t fed_len;

    /* KIND_LISTING */
    struct s3xml_listing listing;
    size_t objects_cap;
    size_t prefixes_cap;
    struct s3xml_object obj;    /* <Contents> being built */
    bool obj_skipped;           /* its key went to listing.skipped */
    size_t skipped_cap;
    bool url_encoded;

    /* ROOT_ERROR (KIND_ERROR, KIND_ETAG) */
    struct s3xml_error error;

    /* KIND_UPLOAD_ID, KIND_ETAG */
    char *value;
};

static void fail(struct parse_ctx *c, int err)
{
    if (c->err == 0) {
        c->err = err;
        XML_StopParser(c->parser, XML_FALSE);
    }
}

static const char *local_name(const XML_Char *name)
{
    const char *sep = strrchr(name, NS_SEP);

    return sep != NULL ? sep + 1 : name;
}

static enum root root_for(enum doc_kind kind, const char *name)
{
    switch (kind) {
    case KIND_LISTING:
        if (strcmp(name, "ListBucketResult") == 0)
            return ROOT_LISTING;
        break;
    case KIND_ERROR:
        if (strcmp(name, "Error") == 0)
            return ROOT_ERROR;
        break;
    case KIND_UPLOAD_ID:
        if (strcmp(name, "InitiateMultipartUploadResult") == 0)
            return ROOT_UPLOAD;
        break;
    case KIND_ETAG:
        if (strcmp(name, "CopyObjectResult") == 0 ||
            strcmp(name, "CopyPartResult") == 0 ||
            strcmp(name, "CompleteMultipartUploadResult") == 0)
            return ROOT_ETAG;
        if (strcmp(name, "Error") == 0)
            return ROOT_ERROR;
        break;
    }
    return ROOT_NONE;
}

static enum field field_for(const struct parse_ctx *c, const char *name)
{
    for (size_t i = 0; i < sizeof(field_rules) / sizeof(field_rules[0]); i++) {
        const struct field_rule *r = &field_rules[i];

        if (r->root == c->root && r->depth == c->depth &&
            (c->depth == 2 || r->section == c->section) &&
            strcmp(r->name, name) == 0)
            return r->field;
    }
    return F_NONE;
}

static void free_object(struct s3xml_object *obj)
{
    free(obj->key);
    free(obj->etag);
    memset(obj, 0, sizeof(*obj));
}

void s3xml_listing_free(struct s3xml_listing *listing)
{
    if (listing == NULL)
        return;
    for (size_t i = 0; i < listing->object_count; i++)
        free_object(&listing->objects[i]);
    free(listing->objects);
    for (size_t i = 0; i < listing->prefix_count; i++)
        free(listing->prefixes[i]);
    free(listing->prefixes);
    free(listing->next_token);
    for (size_t i = 0; i < listing->skipped_count; i++)
        free(listing->skipped[i]);
    free(listing->skipped);
    memset(listing, 0, sizeof(*listing));
}

/* Make room for element COUNT of an array of SIZE-byte elements with
 * capacity *CAP. Returns the (maybe moved) array, or NULL when out of
 * memory, in which case ARRAY is untouched. */
static void *reserve(void *array, size_t *cap, size_t count, size_t size)
{
    size_t ncap;
    void *p;

    if (count < *cap)
        return array;
    ncap = *cap ? *cap * 2 : 16;
    p = realloc(array, ncap * size);
    if (p != NULL)
        *cap = ncap;
    return p;
}

static size_t entry_count(const struct parse_ctx *c)
{
    return c->listing.object_count + c->listing.prefix_count +
           c->listing.skipped_count;
}

/* Leave the key TEXT (LEN bytes) out of the page: keep it for a log
 * line, as sent, a NUL written %00, cut to S3XML_MAX_TEXT bytes. */
static int skip_key(struct parse_ctx *c, const char *text, size_t len)
{
    struct s3xml_listing *l = &c->listing;
    size_t shown_len = 0, n = 0;
    char *shown;
    void *p;

    for (; n < len; n++) {
        size_t width = text[n] == '\0' ? 3 : 1;
        if (shown_len + width > S3XML_MAX_TEXT)
            break;
        shown_len += width;
    }
    p = reserve(l->skipped, &c->skipped_cap, l->skipped_count,
                sizeof(*l->skipped));
    if (p == NULL)
        return ENOMEM;
    l->skipped = p;
    if ((shown = malloc(shown_len + 1)) == NULL)
        return ENOMEM;
    for (size_t i = 0, at = 0; i < n; i++) {
        if (text[i] == '\0') {
            memcpy(shown + at, "%00", 3);
            at += 3;
        } else {
            shown[at++] = text[i];
        }
    }
    shown[shown_len] = '\0';
    l->skipped[l->skipped_count++] = shown;
    return 0;
}

static char *text_dup(const struct parse_ctx *c)
{
    char *s = malloc(c->text_len + 1);

    if (s != NULL) {
        memcpy(s, c->text, c->text_len);
        s[c->text_len] = '\0';
    }
    return s;
}

/* Digits only, no sign, no blanks; overflow is an error. */
static int parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;

    if (*s == '\0')
        return EPROTO;
    for (; *s != '\0'; s++) {
        unsigned d;

        if (*s < '0' || *s > '9')
            return EPROTO;
        d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return EPROTO;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Copy at most CAP-1 bytes of SRC, never splitting a UTF-8 sequence. */
static void copy_truncated(char *dst, size_t cap, const char *src, size_t len)
{
    size_t n = len < cap - 1 ? len : cap - 1;

    if (n < len)
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Claim a SEEN_* bit in *SEEN; a second occurrence is a protocol error. */
static int claim(unsigned *seen, unsigned bit)
{
    if (*seen & bit)
        return EPROTO;
    *seen |= bit;
    return 0;
}

/* A captured leaf element ended: store its text. */
static int finish_field(struct parse_ctx *c)
{
    struct s3xml_listing *l = &c->listing;
    char **slot = NULL;
    void *p;
    int rc = 0;

    switch (c->field) {
    case F_NONE:
        break;
    case F_TRUNCATED:
        rc = claim(&c->seen, SEEN_TRUNCATED);
        if (rc == 0 && strcmp(c->text, "true") == 0)
            l->truncated = true;
        else if (rc == 0 && strcmp(c->text, "false") != 0)
            rc = EPROTO;
        break;
    case F_NEXT_TOKEN:
        rc = claim(&c->seen, SEEN_NEXT_TOKEN);
        if (rc == 0 && c->text_len > 0)
            slot = &l->next_token;
        break;
    case F_ENCODING:
        rc = claim(&c->seen, SEEN_ENCODING);
        if (rc == 0 && strcmp(c->text, "url") == 0)
            c->url_encoded = true;
        else if (rc == 0)
            rc = EPROTO;
        break;
    case F_KEY:
        rc = claim(&c->obj_seen, SEEN_KEY);
        if (rc == 0 && c->text_len == 0)
            rc = EPROTO;
        if (rc == 0 && c->text_has_nul) {
            c->obj_skipped = true;
            rc = entry_count(c) >= MAX_ENTRIES
                     ? EOVERFLOW : skip_key(c, c->text, c->text_len);
        } else {
            slot = &c->obj.key;
        }
        break;
    case F_SIZE:
        rc = claim(&c->obj_seen, SEEN_SIZE);
        if (rc == 0)
            rc = parse_u64(c->text, &c->obj.size);
        break;
    case F_ETAG:
        rc = claim(&c->obj_seen, SEEN_ETAG);
        slot = &c->obj.etag;
        break;
    case F_MTIME:
        rc = claim(&c->obj_seen, SEEN_MTIME);
        if (rc == 0 && s3xml_parse_time(c->text, &c->obj.mtime) != 0)
            rc = EPROTO;
        break;
    case F_PREFIX:
        if (c->text_len == 0)
            rc = EPROTO;
        else if (entry_count(c) >= MAX_ENTRIES)
            rc = EOVERFLOW;
        else if (c->text_has_nul)
            rc = skip_key(c, c->text, c->text_len);
        if (rc != 0 || c->text_has_nul)
            break;
        p = reserve(l->prefixes, &c->prefixes_cap, l->prefix_count,
                    sizeof(*l->prefixes));
        if (p == NULL) {
            rc = ENOMEM;
        } else {
            l->prefixes = p;
            l->prefixes[l->prefix_count] = text_dup(c);
            if (l->prefixes[l->prefix_count] == NULL)
                rc = ENOMEM;
            else
                l->prefix_count++;
        }
        break;
    case F_CODE:
        rc = claim(&c->seen, SEEN_CODE);
        if (rc == 0)
            copy_truncated(c->error.code, sizeof(c->error.code), c->text,
                           c->text_len);
        break;
    case F_MESSAGE:
        rc = claim(&c->seen, SEEN_MESSAGE);
        if (rc == 0)
            copy_truncated(c->error.message, sizeof(c->error.message), c->text,
                           c->text_len);
        break;
    case F_UPLOAD_ID:
    case F_RESULT_ETAG:
        rc = claim(&c->seen, SEEN_VALUE);
        if (rc == 0 && c->text_len == 0)
            rc = EPROTO;
        slot = &c->value;
        break;
    }
    if (rc == 0 && slot != NULL) {
        *slot = text_dup(c);
        if (*slot == NULL)
            rc = ENOMEM;
    }
    return rc;
}

/* </Contents>: the object must have a key and a size. */
static int finish_object(struct parse_ctx *c)
{
    struct s3xml_listing *l = &c->listing;
    void *p;
    int rc = 0;

    if ((c->obj_seen & (SEEN_KEY | SEEN_SIZE)) != (SEEN_KEY | SEEN_SIZE)) {
        rc = EPROTO;
        goto out;
    }
    if (c->obj_skipped)
        goto out;   /* counted among the skipped already */
    if (entry_count(c) >= MAX_ENTRIES) {
        rc = EOVERFLOW;
        goto out;
    }
    if (c->obj.etag == NULL) {
        c->obj.etag = strdup("");
        if (c->obj.etag == NULL) {
            rc = ENOMEM;
            goto out;
        }
    }
    p = reserve(l->objects, &c->objects_cap, l->object_count,
                sizeof(*l->objects));
    if (p == NULL) {
        rc = ENOMEM;
        goto out;
    }
    l->objects = p;
    l->objects[l->object_count++] = c->obj;
    memset(&c->obj, 0, sizeof(c->obj));
out:
    return rc;
}

static void XMLCALL on_start(void *ud, const XML_Char *name,
                             const XML_Char **attrs)
{
    struct parse_ctx *c = ud;
    const char *local = local_name(name);

    (void)attrs;
    if (c->err != 0)
        return;
    if (c->field != F_NONE) {
        fail(c, EPROTO);        /* markup inside a text value */
        return;
    }
    c->depth++;
    if (c->depth == 1) {
        c->root = root_for(c->kind, local);
        if (c->root == ROOT_NONE)
            fail(c, EPROTO);
        return;
    }
    if (c->depth == 2) {
        c->section = SEC_OTHER;
        if (c->root == ROOT_LISTING && strcmp(local, "Contents") == 0) {
            c->section = SEC_CONTENTS;
            c->obj_seen = 0;
            c->obj_skipped = false;
        } else if (c->root == ROOT_LISTING &&
                   strcmp(local, "CommonPrefixes") == 0) {
            c->section = SEC_PREFIXES;
        }
    }
    c->field = field_for(c, local);
    c->text_len = 0;
    c->text[0] = '\0';
    c->text_has_nul = false;
}

static void XMLCALL on_end(void *ud, const XML_Char *name)
{
    struct parse_ctx *c = ud;
    int rc = 0;

    (void)name;
    if (c->err != 0)
        return;
    if (c->field != F_NONE) {
        rc = finish_field(c);
        c->field = F_NONE;
    }
    if (rc == 0 && c->depth == 2) {
        if (c->section == SEC_CONTENTS)
            rc = finish_object(c);
        free_object(&c->obj);
        c->section = SEC_NONE;
    }
    c->depth--;
    if (rc != 0)
        fail(c, rc);
}

/* A key's text as the body holds it: where expat hands out TEXT (*LEN
 * bytes) as it stands in what it was fed, or an end of line for a raw CR,
 * the body's own bytes in *TEXT and *LEN instead (bytes XML cannot carry,
 * fed as '|', and a raw CR are the key's). Entities and character
 * references stay expat's to decode. */
static void key_bytes(struct parse_ctx *c, const char **text, size_t *len)
{
    XML_Index at = XML_GetCurrentByteIndex(c->parser);
    int count = XML_GetCurrentByteCount(c->parser);

    if (at < 0 || count <= 0 || (uint64_t)at > c->fed_len ||
        (size_t)count > c->fed_len - (size_t)at)
        return;
    const char *fed = c->fed + at;
    bool as_fed = (size_t)count == *len && memcmp(fed, *text, *len) == 0;
    bool raw_cr = *len == 1 && **text == '\n' && fed[0] == '\r';
    if (!as_fed && !raw_cr)
        return;
    *text = c->raw + at;
    *len = (size_t)count;
    if (memchr(*text, '\0', *len) != NULL)
        c->text_has_nul = true;
}

static void XMLCALL on_text(void *ud, const XML_Char *s, int len)
{
    struct parse_ctx *c = ud;
    const char *text = s;
    size_t n = (size_t)len;

    if (c->err != 0 || c->field == F_NONE || len <= 0)
        return;
    if (c->field == F_KEY || c->field == F_PREFIX)
        key_bytes(c, &text, &n);
    if (n > S3XML_MAX_TEXT - c->text_len) {
        /* Error codes and messages are truncated on output anyway. */
        if (c->field != F_CODE && c->field != F_MESSAGE) {
            fail(c, EOVERFLOW);
            return;
        }
        n = S3XML_MAX_TEXT - c->text_len;
    }
    memcpy(c->text + c->text_len, text, n);
    c->text_len += n;
    c->text[c->text_len] = '\0';
}

/* No S3 response has a DTD: refusing any stops entity expansion attacks
 * (billion laughs, external entities) before a declaration is read. */
static void XMLCALL on_doctype(void *ud, const XML_Char *name,
                               const XML_Char *sysid, const XML_Char *pubid,
                               int has_internal_subset)
{
    (void)name;
    (void)sysid;
    (void)pubid;
    (void)has_internal_subset;
    fail(ud, EPROTO);
}

static void XMLCALL on_entity_decl(void *ud, const XML_Char *name,
                                   int is_parameter_entity,
                                   const XML_Char *value, int value_length,
                                   const XML_Char *base,
                                   const XML_Char *sysid,
                                   const XML_Char *pubid,
                                   const XML_Char *notation)
{
    (void)name;
    (void)is_parameter_entity;
    (void)value;
    (void)value_length;
    (void)base;
    (void)sysid;
    (void)pubid;
    (void)notation;
    fail(ud, EPROTO);
}

/* A copy of BODY (LEN bytes) with '|' for every byte that is part of no
 * XML 1.0 character, into *OUT; NULL there when there is none. '|' is no
 * markup: where it stands for a byte of markup, the document stays
 * malformed. 0 or ENOMEM. */
static int scrub(const char *body, size_t len, char **out)
{
    char *copy = NULL;

    *out = NULL;
    for (size_t at = 0; at < len;) {
        size_t n = text_xml_char_len(body + at, len - at);
        if (n > 0) {
            at += n;
            continue;
        }
        if (copy == NULL) {
            if ((copy = malloc(len)) == NULL)
                return ENOMEM;
            memcpy(copy, body, len);
        }
        copy[at++] = '|';
    }
    *out = copy;
    return 0;
}

/* Parse BODY into C. Leading white space is skipped: S3 and Swift send
 * spaces as keep-alives before a CompleteMultipartUpload result, which
 * would otherwise put text before the XML declaration. */
static int run_parser(struct parse_ctx *c, const char *body, size_t len)
{
    char *scrubbed = NULL;
    int rc = 0;

    if (body == NULL)
        len = 0;
    while (len > 0 && (*body == ' ' || *body == '\t' || *body == '\r' ||
                       *body == '\n')) {
        body++;
        len--;
    }
    if (len == 0) {
        rc = EPROTO;
        goto out;
    }

    rc = scrub(body, len, &scrubbed);
    if (rc != 0)
        goto out;
    c->raw = body;
    c->fed = scrubbed != NULL ? scrubbed : body;
    c->fed_len = len;

    c->parser = XML_ParserCreateNS("UTF-8", NS_SEP);
    if (c->parser == NULL) {
        rc = ENOMEM;
        goto out;
    }
    XML_SetUserData(c->parser, c);
    XML_SetElementHandler(c->parser, on_start, on_end);
    XML_SetCharacterDataHandler(c->parser, on_text);
    XML_SetStartDoctypeDeclHandler(c->parser, on_doctype);
    XML_SetEntityDeclHandler(c->parser, on_entity_decl);
    XML_SetParamEntityParsing(c->parser, XML_PARAM_ENTITY_PARSING_NEVER);

    for (size_t at = 0; at < len;) {
        size_t n = len - at < FEED_CHUNK ? len - at : FEED_CHUNK;
        int final = at + n == len;

        if (XML_Parse(c->parser, c->fed + at, (int)n, final) != XML_STATUS_OK) {
            if (c->err != 0)
                rc = c->err;
            else if (XML_GetErrorCode(c->parser) == XML_ERROR_NO_MEMORY)
                rc = ENOMEM;
            else
                rc = EPROTO;
            goto out;
        }
        at += n;
    }
    rc = c->err;
out:
    XML_ParserFree(c->parser);     /* NULL is fine */
    c->parser = NULL;
    c->raw = c->fed = NULL;
    free(scrubbed);
    return rc;
}

/* TEXT with %XX decoded into *OUT (malloc'd). '+' is kept (see the file
 * header); the bytes decoded are the key's, UTF-8 or not. EPROTO for a bad
 * escape or an encoded NUL (no string holds it), ENOMEM. */
static int url_decode(const char *text, char **out)
{
    char *decoded = malloc(strlen(text) + 1);
    char *w = decoded;
    int rc = 0;

    *out = NULL;
    if (decoded == NULL)
        return ENOMEM;
    for (const char *r = text; *r != '\0' && rc == 0;) {
        int hi = *r == '%' ? text_hex_digit(r[1]) : -1;
        int lo = hi < 0 ? -1 : text_hex_digit(r[2]);

        if (*r != '%')
            *w++ = *r++;
        else if (lo < 0 || (hi | lo) == 0)
            rc = EPROTO;
        else {
            *w++ = (char)(hi << 4 | lo);
            r += 3;
        }
    }
    *w = '\0';
    if (rc == 0)
        *out = decoded;
    else
        free(decoded);
    return rc;
}

/* EncodingType=url: *KEY decoded in place of the text sent; one that
 * cannot be decoded goes to the skipped ones, and *KEY is freed and
 * NULL. 0 or ENOMEM. */
static int decode_key(struct parse_ctx *c, char **key)
{
    char *decoded = NULL;
    int rc = url_decode(*key, &decoded);

    if (rc == EPROTO)
        rc = skip_key(c, *key, strlen(*key));
    else if (rc != 0)
        goto out;
    free(*key);
    *key = decoded;
out:
    return rc;
}

static int finish_listing(struct parse_ctx *c)
{
    struct s3xml_listing *l = &c->listing;
    size_t kept = 0;
    int rc = 0;

    /* A truncated page we cannot continue would loop or lose entries. */
    if (l->truncated && l->next_token == NULL) {
        rc = EPROTO;
        goto out;
    }
    if (!c->url_encoded)
        goto out;
    /* (entries left out close up; after a failure the rest are kept as
     * they are, for s3xml_listing_free()) */
    for (size_t i = 0; i < l->object_count; i++) {
        if (rc == 0)
            rc = decode_key(c, &l->objects[i].key);
        if (l->objects[i].key == NULL)
            free_object(&l->objects[i]);
        else
            l->objects[kept++] = l->objects[i];
    }
    l->object_count = kept;
    kept = 0;
    for (size_t i = 0; i < l->prefix_count; i++) {
        if (rc == 0)
            rc = decode_key(c, &l->prefixes[i]);
        if (l->prefixes[i] != NULL)
            l->prefixes[kept++] = l->prefixes[i];
    }
    l->prefix_count = kept;
out:
    return rc;
}

/* Contexts hold a text buffer of S3XML_MAX_TEXT: keep them off the stack
 * of FUSE worker threads. */
static struct parse_ctx *ctx_new(enum doc_kind kind)
{
    struct parse_ctx *c = calloc(1, sizeof(*c));

    if (c != NULL)
        c->kind = kind;
    return c;
}

static void ctx_free(struct parse_ctx *c)
{
    if (c == NULL)
        return;
    s3xml_listing_free(&c->listing);
    free_object(&c->obj);
    free(c->value);
    free(c);
}

/* The skeleton of every parse: BODY parsed as a document of KIND into a
 * new context in *out (the caller takes its results, then ctx_free()s
 * it). On failure *out is NULL. A single value (an upload id, an ETag)
 * too long for its cap is no answer S3 sends: EPROTO. */
static int parse_body(enum doc_kind kind, const char *body, size_t len,
                      struct parse_ctx **out)
{
    struct parse_ctx *c = ctx_new(kind);
    int rc;

    *out = NULL;
    if (c == NULL)
        return ENOMEM;
    rc = run_parser(c, body, len);
    if (rc == EOVERFLOW && (kind == KIND_UPLOAD_ID || kind == KIND_ETAG))
        rc = EPROTO;
    if (rc != 0) {
        ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int s3xml_parse_listing(const char *body, size_t len, struct s3xml_listing *out)
{
    struct parse_ctx *c;

    memset(out, 0, sizeof(*out));
    int rc = parse_body(KIND_LISTING, body, len, &c);
    if (rc == 0)
        rc = finish_listing(c);
    if (rc == 0) {
        *out = c->listing;
        memset(&c->listing, 0, sizeof(c->listing));
    }
    ctx_free(c);
    return rc;
}

int s3xml_parse_error(const char *body, size_t len, struct s3xml_error *out)
{
    struct parse_ctx *c;

    memset(out, 0, sizeof(*out));
    int rc = parse_body(KIND_ERROR, body, len, &c);
    if (rc == 0)
        *out = c->error;
    ctx_free(c);
    return rc;
}

int s3xml_parse_upload_id(const char *body, size_t len, char **upload_id)
{
    struct parse_ctx *c;

    *upload_id = NULL;
    int rc = parse_body(KIND_UPLOAD_ID, body, len, &c);
    if (rc == 0 && c->value == NULL)
        rc = EPROTO;
    if (rc == 0) {
        *upload_id = c->value;
        c->value = NULL;
    }
    ctx_free(c);
    return rc;
}

int s3xml_parse_etag_result(const char *body, size_t len, char **etag,
                            struct s3xml_error *err)
{
    struct parse_ctx *c;

    *etag = NULL;
    if (err != NULL)
        memset(err, 0, sizeof(*err));
    int rc = parse_body(KIND_ETAG, body, len, &c);
    if (rc == 0 && c->root == ROOT_ERROR) {
        if (err != NULL)
            *err = c->error;
        rc = EIO;
    } else if (rc == 0 && c->value == NULL) {
        rc = EPROTO;
    }
    if (rc == 0) {
        *etag = c->value;
        c->value = NULL;
    }
    ctx_free(c);
    return rc;
}

static bool is_leap(int year)
{
    return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

/* Value of the N digits at S (already checked to be digits). */
static int digits(const char *s, int n)
{
    int v = 0;

    for (int i = 0; i < n; i++)
        v = v * 10 + (s[i] - '0');
    return v;
}

int s3xml_parse_time(const char *text, struct timespec *out)
{
    /* 'd' is a digit, anything else must match exactly. */
    static const char pattern[] = "dddd-dd-ddTdd:dd:dd";
    static const int mdays[] = { 31, 28, 31, 30, 31, 30,
                                 31, 31, 30, 31, 30, 31 };
    const size_t plen = sizeof(pattern) - 1;
    struct tm tm;
    const char *p;
    long nsec = 0;
    int year, mon, day, hour, min, sec, ndig = 0, dim;
    time_t t;
    int rc = 0;

    out->tv_sec = 0;
    out->tv_nsec = 0;
    if (text == NULL) {
        rc = EINVAL;
        goto out;
    }
    /* Stops at the first mismatch, so never reads past a short string. */
    for (size_t i = 0; i < plen; i++) {
        bool ok = pattern[i] == 'd' ? text[i] >= '0' && text[i] <= '9'
                                    : text[i] == pattern[i];
        if (!ok) {
            rc = EINVAL;
            goto out;
        }
    }
    p = text + plen;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, ndig++) {
            if (ndig == 9) {
                rc = EINVAL;
                goto out;
            }
            nsec = nsec * 10 + (*p - '0');
        }
        if (ndig == 0) {
            rc = EINVAL;
            goto out;
        }
        for (int i = ndig; i < 9; i++)
            nsec *= 10;
    }
    if (p[0] != 'Z' || p[1] != '\0') {
        rc = EINVAL;
        goto out;
    }

    year = digits(text, 4);
    mon = digits(text + 5, 2);
    day = digits(text + 8, 2);
    hour = digits(text + 11, 2);
    min = digits(text + 14, 2);
    sec = digits(text + 17, 2);
    if (mon < 1 || mon > 12) {
        rc = EINVAL;
        goto out;
    }
    dim = mdays[mon - 1] + (mon == 2 && is_leap(year));
    if (day < 1 || day > dim || hour > 23 || min > 59 || sec > 59) {
        rc = EINVAL;
        goto out;
    }

    memset(&tm, 0, sizeof(tm));
    tm.tm_year = year - 1900;
    tm.tm_mon = mon - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = min;
    tm.tm_sec = sec;
    t = timegm(&tm);
    /* -1 is also a real instant, one second before the epoch. */
    if (t == (time_t)-1 &&
        !(year == 1969 && mon == 12 && day == 31 && hour == 23 &&
          min == 59 && sec == 59)) {
        rc = EINVAL;
        goto out;
    }
    out->tv_sec = t;
    out->tv_nsec = nsec;
out:
    return rc;
}
