/*
 * s3.c - S3 client over libcurl (see s3.h).
 *
 * Structure: public calls build a struct s3_request (method, key, query,
 * extra headers, body source, response sink) and hand it to s3_perform(),
 * which borrows a curl easy handle from the pool, signs, sends, classifies
 * the outcome with errmap, and retries when that is safe.
 *
 * Concurrency: the handle pool is the only shared mutable state besides the
 * atomic counters. pool.lock guards pool.idle/pool.idle_count/pool.created;
 * handle_free is signalled when a handle returns to the pool. No lock is
 * held during a transfer. Each easy handle keeps its own keep-alive
 * connection; a curl share object (with its own lock) shares DNS answers
 * and TLS sessions between handles.
 */
#include "config.h"

#include "s3.h"

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

#include "clock.h"
#include "endpoint.h"
#include "errmap.h"
#include "log.h"
#include "secret.h"
#include "sigv4.h"

#define ERROR_BODY_MAX (64u << 10)      /* error documents */
#define LIST_BODY_MAX (32u << 20)       /* one ListObjectsV2 page */
#define SMALL_BODY_MAX (1u << 20)       /* multipart/copy results */
#define BACKOFF_BASE_MS 100
#define BACKOFF_CAP_MS 10000
#define CONNECT_TIMEOUT_S 10
#define LOW_SPEED_LIMIT 1024            /* bytes/s: slower than this ... */
#define LOW_SPEED_TIME_S 30             /* ... this long aborts a transfer */
#define PART_ETAGS_XML_MAX (10000u * 200u)
#define META_LINES 8                    /* add_meta_headers(): Content-Type
                                           and the seven x-amz-meta-* */
#define RECEIVE_BUFFER (256L << 10)     /* per connection: GET bodies reach
                                           the cache in writes this large */

/*
 * Deadlines. A request ends within its deadline, every attempt, retry and
 * pause between them included (the waits for a free connection are not:
 * the requests holding them have deadlines of their own); past it, it
 * fails with ETIMEDOUT, or the error of its last attempt. Curl's
 * low-speed check alone let a server that trickles its answer just above
 * LOW_SPEED_LIMIT hold a FUSE thread (and the drain at unmount) for as
 * long as it liked. The deadline is
 *
 *     request_timeout                     (S3_REQUEST_TIMEOUT_DEFAULT, 30 s)
 *   + bytes on the wire / DEADLINE_WIRE_RATE         (GET ranges, PUT and
 *                                          part bodies; a LIST page counts
 *                                          as DEADLINE_LIST_BYTES)
 *   + bytes the server copies or joins / DEADLINE_SERVER_RATE  (CopyObject,
 *                                          UploadPartCopy, complete)
 *
 * So with the defaults: a HEAD, DELETE or small PUT 30 s, a 1 MiB block
 * 46 s, an 8 MiB read-ahead GET or part 158 s, a 16 MiB PUT 286 s, a 512
 * MiB part copy 62 s, a CopyObject (its size unknown here: counted as the
 * 5 GiB it can be) 350 s, completing a 1 GiB upload 94 s. The rates are
 * floors, far below what a working link or server does, so that only a
 * stuck or trickling transfer meets them: 64 KiB/s is 16 connections
 * sharing 8 Mbit/s.
 */
#define DEADLINE_WIRE_RATE (64u << 10)          /* bytes/s */
#define DEADLINE_SERVER_RATE (16u << 20)        /* bytes/s */
#define DEADLINE_LIST_BYTES (256u << 10)
#define DEADLINE_COPY_UNKNOWN (5ull << 30)

struct s3_client {
    char *bucket;
    char *region;
    char *access_key;
    char *secret_key;
    char *session_token;
    char *ca_bundle;
    struct endpoint endpoint; /* base URL, Host header, path prefix */
    unsigned max_retries;
    uint64_t deadline_base_ms;

    CURLSH *share;
    pthread_mutex_t share_lock;

    struct {
        pthread_mutex_t lock;
        pthread_cond_t handle_free;
        CURL **idle;
        unsigned idle_count;
        unsigned created;
        unsigned max;
    } pool;

    _Atomic uint64_t requests[S3_OP_COUNT];
    _Atomic uint64_t bytes_received;
    _Atomic uint64_t bytes_sent;
    _Atomic uint64_t retries;
    _Atomic uint64_t failures;
};

/* A growable buffer with a hard cap (anything bigger fails the transfer). */
struct capped_buf {
    char *data;
    size_t len;
    size_t cap;
};

struct s3_request {
    enum s3_op op;
    const char *method;
    const char *key;              /* NULL: the bucket itself */
    const char *query;            /* encoded and sorted, or NULL */
    const char *extra_headers[12];/* "name: value", signed when x-amz-* or
                                     content-*; NULL-terminated */
    bool has_range;               /* send Range: bytes=range_offset-... */
    uint64_t range_offset;
    uint64_t range_length;
    char range[64];               /* formatted for the current attempt */
    bool idempotent;
    bool quiet;                   /* the caller reports failures itself */
    uint64_t wire_bytes;          /* for the deadline: bytes to transfer */
    uint64_t server_bytes;        /* ... and bytes the server copies */
    bool may_have_run;            /* an attempt the server may have carried
                                     out failed (its answer lost) */
    /* checks a 2xx answer and parses its XML (req->xml) into parse_out: 0,
     * EPROTO (cut short, garbled, no ETag: retried), EIO with
     * req->s3_code (an <Error> in the body), or another errno; leaves
     * nothing to free on failure */
    int (*parse)(struct s3_request *req);
    void *parse_out;

    /* request body: at most one of these */
    const struct s3_body *body;   /* streamed upload */
    const char *post_data;        /* small POST body (XML) */
    size_t post_len;

    /* response sinks */
    const struct s3_sink *sink;   /* streamed object data of a GET */
    const char *if_match;         /* the ETag the answer must carry */
    uint64_t delivered;           /* bytes the sink accepted, all attempts */
    int sink_err;                 /* why the sink refused data */
    bool answer_checked;          /* this attempt's headers were checked */
    bool range_seen;              /* this attempt's Content-Range ... */
    uint64_t range_first, range_last, range_total;
    char answer_etag[S3_ETAG_MAX];/* ... and ETag */
    void *recv_buf;               /* object data of a GET */
    size_t recv_cap;
    size_t recv_len;
    struct capped_buf *xml;       /* XML answer (list, multipart, copy) */
    struct capped_buf error_body; /* error document, always capped */
    struct s3_object_info *info;  /* headers, may be NULL */
    uint64_t body_pos;            /* upload progress */

    long status;                  /* final HTTP status */
    char s3_code[64];             /* <Code> of the error body */
};

/* ------------------------------------------------------------- helpers */

static void capped_buf_free(struct capped_buf *buf)
{
    free(buf->data);
    buf->data = NULL;
    buf->len = 0;
}

/* Append; false when the cap would be exceeded or memory ran out. */
static bool capped_buf_append(struct capped_buf *buf, const char *data,
                              size_t len)
{
    if (len > buf->cap - buf->len)
        return false;
    char *grown = realloc(buf->data, buf->len + len + 1);
    if (grown == NULL)
        return false;
    memcpy(grown + buf->len, data, len);
    buf->data = grown;
    buf->len += len;
    buf->data[buf->len] = '\0';
    return true;
}

static char *strdup_or_null(const char *text)
{
    return text != NULL ? strdup(text) : NULL;
}

static void base64(const unsigned char *in, size_t len, char *out, size_t cap)
{
    if (cap < 4 * ((len + 2) / 3) + 1) {
        out[0] = '\0';
        return;
    }
    EVP_EncodeBlock((unsigned char *)out, in, (int)len);
}

/* ------------------------------------------------------ curl callbacks */

/*
 * Before a GET's first byte is taken: the answer must be the bytes asked
 * for (a 206 whose Content-Range starts where the data so far stopped and
 * ends where the request does; a plain 200 only when the whole object was
 * asked for from byte 0) and of the version asked for: a server that
 * ignores If-Match still sends its ETag, and an answer without one (a 200
 * carrying an error document, say) is not an object's.
 */
static int check_get_answer(const struct s3_request *req)
{
    uint64_t first = req->range_offset + req->delivered;
    uint64_t last = req->range_offset + req->range_length - 1;

    if (req->status == 206) {
        /* (an object that ends first ends the range there) */
        bool ends_early = req->range_seen && req->range_last < last &&
                          req->range_last + 1 == req->range_total;
        if (!req->range_seen || req->range_first != first ||
            (req->range_last != last && !ends_early)) {
            log_warn("GET %s: the server sent another range than asked for",
                     req->key);
            return EIO;
        }
    } else if (!(req->status == 200 && first == 0)) {
        log_warn("GET %s: the server ignored the range asked for", req->key);
        return EIO;
    }
    if (req->if_match != NULL && req->answer_etag[0] == '\0') {
        log_warn("GET %s: the answer carries no ETag", req->key);
        return EIO;
    }
    if (req->if_match != NULL && strcmp(req->answer_etag, req->if_match) != 0)
        return ESTALE;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t count, void *userp)
{
    struct s3_request *req = userp;
    size_t len = size * count;

    if (req->status == 0 || req->status >= 300) {
        /* error document: keep what fits, ignore the rest */
        size_t room = req->error_body.cap - req->error_body.len;
        capped_buf_append(&req->error_body, data, len < room ? len : room);
        return len;
    }
    if ((req->sink != NULL || req->recv_buf != NULL) && !req->answer_checked) {
        req->sink_err = check_get_answer(req);
        req->answer_checked = true;
        if (req->sink_err != 0)
            return 0;
    }
    if (req->sink != NULL) {
        if (len > req->range_length - req->delivered) {
            req->sink_err = EIO; /* more than asked for */
            return 0;
        }
        int err = req->sink->write(req->sink->arg, data, len);
        if (err != 0) {
            req->sink_err = err;
            return 0;
        }
        req->delivered += len;
        return len;
    }
    if (req->recv_buf != NULL) {
        if (len > req->recv_cap - req->recv_len) {
            req->sink_err = EIO; /* more than asked for */
            return 0;
        }
        memcpy((char *)req->recv_buf + req->recv_len, data, len);
        req->recv_len += len;
        return len;
    }
    if (req->xml != NULL)
        return capped_buf_append(req->xml, data, len) ? len : 0;
    return len; /* body not wanted */
}

/* Case-insensitive "Name:" match; returns the trimmed value or NULL. */
static const char *header_value(const char *line, size_t len, const char *name,
                                size_t *value_len)
{
    size_t name_len = strlen(name);

    if (len <= name_len || line[name_len] != ':' ||
        strncasecmp(line, name, name_len) != 0)
        return NULL;
    const char *value = line + name_len + 1;
    const char *end = line + len;
    while (value < end && (*value == ' ' || *value == '\t'))
        value++;
    while (end > value && (end[-1] == '\r' || end[-1] == '\n' ||
                           end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *value_len = (size_t)(end - value);
    return value;
}

static bool parse_u64(const char *text, size_t len, uint64_t *out)
{
    uint64_t value = 0;

    if (len == 0 || len > 20)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return false;
        uint64_t digit = (uint64_t)(text[i] - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return false;
        value = value * 10 + digit;
    }
    *out = value;
    return true;
}

/* s3fs writes mtime as whole seconds; accept a fraction too. */
static bool parse_epoch(const char *text, size_t len, struct timespec *out)
{
    const char *dot = memchr(text, '.', len);
    size_t int_len = dot != NULL ? (size_t)(dot - text) : len;
    uint64_t seconds;

    if (!parse_u64(text, int_len, &seconds) || seconds > INT64_MAX / 2)
        return false;
    out->tv_sec = (time_t)seconds;
    out->tv_nsec = 0;
    if (dot != NULL) {
        long scale = 100000000;
        for (size_t i = int_len + 1; i < len; i++) {
            if (text[i] < '0' || text[i] > '9')
                return false;
            out->tv_nsec += (text[i] - '0') * scale;
            scale /= 10;
        }
    }
    return true;
}

static void copy_header(char *dst, size_t cap, const char *value, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, value, len);
    dst[len] = '\0';
}

static void parse_info_header(struct s3_object_info *info, const char *line,
                              size_t len)
{
    const char *value;
    size_t vlen;
    uint64_t number;
    char text[64];

    if ((value = header_value(line, len, "ETag", &vlen)) != NULL) {
        copy_header(info->etag, sizeof(info->etag), value, vlen);
    } else if ((value = header_value(line, len, "Content-Range", &vlen))) {
        /* "bytes 0-9/1234": the total is the object size */
        const char *slash = memchr(value, '/', vlen);
        if (slash != NULL &&
            parse_u64(slash + 1, vlen - (size_t)(slash + 1 - value), &number))
            info->size = number;
    } else if ((value = header_value(line, len, "Content-Length", &vlen))) {
        if (info->size == 0 && parse_u64(value, vlen, &number))
            info->size = number;
    } else if ((value = header_value(line, len, "Last-Modified", &vlen))) {
        copy_header(text, sizeof(text), value, vlen);
        time_t when = curl_getdate(text, NULL);
        if (when != -1)
            info->last_modified = (struct timespec){.tv_sec = when};
    } else if ((value = header_value(line, len, "Content-Type", &vlen))) {
        copy_header(info->content_type, sizeof(info->content_type), value,
                    vlen);
    } else if ((value = header_value(line, len, "x-amz-meta-mode", &vlen))) {
        info->has_mode = parse_u64(value, vlen, &number) && number <= 0xffffffffu;
        info->mode = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-uid", &vlen))) {
        info->has_uid = parse_u64(value, vlen, &number) && number < 0xffffffffu;
        info->uid = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-gid", &vlen))) {
        info->has_gid = parse_u64(value, vlen, &number) && number < 0xffffffffu;
        info->gid = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-mtime", &vlen))) {
        info->has_mtime = parse_epoch(value, vlen, &info->mtime);
    } else if ((value = header_value(line, len, "x-amz-meta-atime", &vlen))) {
        info->has_atime = parse_epoch(value, vlen, &info->atime);
    } else if ((value = header_value(line, len, "x-amz-meta-ctime", &vlen))) {
        info->has_ctime = parse_epoch(value, vlen, &info->ctime);
    } else if ((value = header_value(line, len, "x-amz-meta-rdev", &vlen))) {
        info->has_rdev = parse_u64(value, vlen, &number) && number <= 0xffffffffu;
        info->rdev = (uint32_t)number;
    }
}

/* "bytes FIRST-LAST/TOTAL" -> FIRST, LAST, TOTAL. */
static bool parse_content_range(const char *value, size_t len, uint64_t *first,
                                uint64_t *last, uint64_t *total)
{
    const char *dash, *slash;

    if (len < 6 || strncasecmp(value, "bytes ", 6) != 0)
        return false;
    value += 6;
    len -= 6;
    dash = memchr(value, '-', len);
    slash = memchr(value, '/', len);
    return dash != NULL && slash != NULL && dash < slash &&
           parse_u64(value, (size_t)(dash - value), first) &&
           parse_u64(dash + 1, (size_t)(slash - dash - 1), last) &&
           parse_u64(slash + 1, len - (size_t)(slash + 1 - value), total) &&
           *first <= *last && *last < *total;
}

static size_t on_header(char *data, size_t size, size_t count, void *userp)
{
    struct s3_request *req = userp;
    size_t len = size * count;

    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        /* a new response (after 100 Continue or a redirect): start over */
        const char *space = memchr(data, ' ', len);
        req->status = space != NULL ? strtol(space + 1, NULL, 10) : 0;
        req->range_seen = false;
        req->answer_etag[0] = '\0';
        if (req->info != NULL)
            memset(req->info, 0, sizeof(*req->info));
        return len;
    }
    if (req->status >= 200 && req->status < 300) {
        const char *value;
        size_t vlen;
        if (req->info != NULL)
            parse_info_header(req->info, data, len);
        if ((value = header_value(data, len, "ETag", &vlen)) != NULL)
            copy_header(req->answer_etag, sizeof(req->answer_etag), value, vlen);
        else if ((value = header_value(data, len, "Content-Range", &vlen)) != NULL)
            req->range_seen = parse_content_range(value, vlen, &req->range_first,
                                                  &req->range_last,
                                                  &req->range_total);
    }
    return len;
}

static size_t on_upload_read(char *buffer, size_t size, size_t count,
                             void *userp)
{
    struct s3_request *req = userp;
    const struct s3_body *body = req->body;
    uint64_t left = body->length - req->body_pos;
    size_t want = size * count;

    if (want > left)
        want = (size_t)left;
    if (want == 0)
        return 0;
    if (body->data != NULL) {
        memcpy(buffer, (const char *)body->data + req->body_pos, want);
    } else {
        ssize_t got = pread(body->fd, buffer, want,
                            (off_t)(body->offset + req->body_pos));
        if (got <= 0)
            return CURL_READFUNC_ABORT;
        want = (size_t)got;
    }
    req->body_pos += want;
    return want;
}

/* curl rewinds the body when it sends the request again by itself: on a
 * fresh connection after the kept-alive one turned out closed by the
 * server. Without this it gave up (CURLE_SEND_FAIL_REWIND), and the
 * upload failed. */
static int on_upload_seek(void *userp, curl_off_t offset, int origin)
{
    struct s3_request *req = userp;

    if (origin != SEEK_SET || req->body == NULL || offset < 0 ||
        (uint64_t)offset > req->body->length)
        return CURL_SEEKFUNC_FAIL;
    req->body_pos = (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* ------------------------------------------------------------ the pool */

static void share_lock_cb(CURL *handle, curl_lock_data data,
                          curl_lock_access access, void *userp)
{
    struct s3_client *client = userp;
    pthread_mutex_lock(&client->share_lock);
    (void)handle; (void)data; (void)access;
}

static void share_unlock_cb(CURL *handle, curl_lock_data data, void *userp)
{
    struct s3_client *client = userp;
    pthread_mutex_unlock(&client->share_lock);
    (void)handle; (void)data;
}

static CURL *pool_new_handle(struct s3_client *client)
{
    CURL *curl = curl_easy_init();

    if (curl == NULL)
        return NULL;
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_SHARE, client->share);
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, (long)LOW_SPEED_LIMIT);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, (long)LOW_SPEED_TIME_S);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    /* the path goes out as it was signed: curl would remove dot segments
     * ("/b/d/../x" became "/b/x"), so another key than the one listed was
     * read, copied or deleted, or the signature did not match */
    curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (client->ca_bundle != NULL)
        curl_easy_setopt(curl, CURLOPT_CAINFO, client->ca_bundle);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, PACKAGE_NAME "/" PACKAGE_VERSION);
    /* libcurl's default (16 KiB) made a pwrite per 16 KiB of every GET,
     * a third of the daemon's CPU time in a cold read */
    curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, RECEIVE_BUFFER);
    return curl;
}

static CURL *pool_get(struct s3_client *client)
{
    CURL *curl = NULL;

    pthread_mutex_lock(&client->pool.lock);
    while (client->pool.idle_count == 0 &&
           client->pool.created >= client->pool.max)
        pthread_cond_wait(&client->pool.handle_free, &client->pool.lock);
    if (client->pool.idle_count > 0)
        curl = client->pool.idle[--client->pool.idle_count];
    else
        client->pool.created++;
    pthread_mutex_unlock(&client->pool.lock);

    if (curl == NULL) {
        curl = pool_new_handle(client);
        if (curl == NULL) {
            pthread_mutex_lock(&client->pool.lock);
            client->pool.created--;
            pthread_cond_signal(&client->pool.handle_free);
            pthread_mutex_unlock(&client->pool.lock);
        }
    }
    return curl;
}

static void pool_put(struct s3_client *client, CURL *curl)
{
    pthread_mutex_lock(&client->pool.lock);
    client->pool.idle[client->pool.idle_count++] = curl;
    pthread_cond_signal(&client->pool.handle_free);
    pthread_mutex_unlock(&client->pool.lock);
}

/* ------------------------------------------------------ request engine */

/* The pause before retry ATTEMPT + 1, in ms: "full jitter", anywhere
 * between 0 and a ceiling that doubles from BACKOFF_BASE_MS. */
static unsigned backoff_ms(unsigned attempt)
{
    unsigned ceiling = BACKOFF_BASE_MS;
    for (unsigned i = 0; i < attempt && ceiling < BACKOFF_CAP_MS; i++)
        ceiling *= 2;
    if (ceiling > BACKOFF_CAP_MS)
        ceiling = BACKOFF_CAP_MS;
    return arc4random_uniform(ceiling + 1);
}

static void sleep_ms(uint64_t ms)
{
    struct timespec pause = {.tv_sec = (time_t)(ms / 1000),
                             .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
        ;
}

/* REQ's deadline in ms from its start (see "Deadlines" at the top). */
static uint64_t request_deadline_ms(const struct s3_client *client,
                                    const struct s3_request *req)
{
    return client->deadline_base_ms +
           req->wire_bytes / (DEADLINE_WIRE_RATE / 1000u) +
           req->server_bytes / (DEADLINE_SERVER_RATE / 1000u);
}

/* Build URL path (encoded) for the request. Returns malloc'd or NULL. */
static char *request_path(const struct s3_client *client, const char *key)
{
    char *encoded = sigv4_uri_encode(key ? key : "", key ? strlen(key) : 0, true);
    char *path = NULL;

    if (encoded == NULL)
        return NULL;
    size_t len = strlen(client->endpoint.path_base) + strlen(encoded) + 3;
    path = malloc(len);
    if (path != NULL)
        snprintf(path, len, "%s/%s", client->endpoint.path_base, encoded);
    free(encoded);
    return path;
}

static bool is_signed_header(const char *line)
{
    return strncasecmp(line, "x-amz-", 6) == 0 ||
           strncasecmp(line, "content-md5:", 12) == 0 ||
           strncasecmp(line, "content-type:", 13) == 0;
}

/*
 * Add the SigV4 headers to HEADERS for one attempt (the date changes
 * between retries). Returns 0 or an errno.
 */
static int sign_request(const struct s3_client *client,
                        const struct s3_request *req, const char *path,
                        const char *payload_hash, struct curl_slist **headers)
{
    char amz_date[17];
    char line[512];
    struct sigv4_header signed_headers[16];
    char names[16][64];
    size_t count = 0;
    char *authorization = NULL;
    int err = 0;
    time_t now = time(NULL);
    struct tm tm;

    gmtime_r(&now, &tm);
    strftime(amz_date, sizeof(amz_date), "%Y%m%dT%H%M%SZ", &tm);

    snprintf(line, sizeof(line), "x-amz-date: %s", amz_date);
    *headers = curl_slist_append(*headers, line);
    snprintf(line, sizeof(line), "x-amz-content-sha256: %s", payload_hash);
    *headers = curl_slist_append(*headers, line);
    if (*headers == NULL)
        return ENOMEM;
    if (client->access_key == NULL)
        return 0; /* no_sign */

    signed_headers[count++] = (struct sigv4_header){"host", client->endpoint.host_header};
    signed_headers[count++] = (struct sigv4_header){"x-amz-date", amz_date};
    signed_headers[count++] = (struct sigv4_header){"x-amz-content-sha256", payload_hash};
    if (client->session_token != NULL) {
        signed_headers[count++] = (struct sigv4_header){"x-amz-security-token",
                                                        client->session_token};
    }
    for (size_t i = 0; req->extra_headers[i] != NULL && count < 16; i++) {
        const char *colon = strchr(req->extra_headers[i], ':');
        if (colon == NULL || !is_signed_header(req->extra_headers[i]))
            continue;
        size_t name_len = (size_t)(colon - req->extra_headers[i]);
        if (name_len >= sizeof(names[0]))
            continue;
        memcpy(names[count], req->extra_headers[i], name_len);
        names[count][name_len] = '\0';
        const char *value = colon + 1;
        while (*value == ' ')
            value++;
        signed_headers[count] = (struct sigv4_header){names[count], value};
        count++;
    }
    struct sigv4_request sig_req = {
        .method = req->method,
        .path = path,
        .query = req->query,
        .headers = signed_headers,
        .header_count = count,
        .payload_hash = payload_hash,
    };
    struct sigv4_scope scope = {amz_date, client->region, "s3"};
    err = sigv4_authorization(&sig_req, &scope, client->access_key,
                              client->secret_key, &authorization);
    if (err != 0)
        return err;
    size_t len = strlen(authorization) + 32;
    char *auth_line = malloc(len);
    if (auth_line == NULL) {
        err = ENOMEM;
        goto out;
    }
    snprintf(auth_line, len, "Authorization: %s", authorization);
    *headers = curl_slist_append(*headers, auth_line);
    explicit_bzero(auth_line, len);
    free(auth_line);
    if (*headers == NULL)
        err = ENOMEM;
out:
    free(authorization);
    return err;
}

/* Set up CURL for one attempt of REQ. */
static int prepare_attempt(struct s3_client *client, CURL *curl,
                           struct s3_request *req, const char *url,
                           const char *path, struct curl_slist **headers)
{
    char payload_hash[SIGV4_HEX_LEN + 1];

    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(curl, CURLOPT_NOBODY, 0L);
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    if (strcmp(req->method, "HEAD") == 0) {
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (strcmp(req->method, "PUT") == 0) {
        curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                         (curl_off_t)(req->body ? req->body->length : 0));
    } else if (strcmp(req->method, "POST") == 0) {
        curl_easy_setopt(curl, CURLOPT_POST, 1L);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, req->post_data ? req->post_data : "");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->post_len);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req->method);
    }
    if (req->has_range) {
        /* a streamed GET resumes after what the sink already has */
        uint64_t first = req->range_offset + (req->sink ? req->delivered : 0);
        snprintf(req->range, sizeof(req->range), "%llu-%llu",
                 (unsigned long long)first,
                 (unsigned long long)(req->range_offset + req->range_length - 1));
    }
    curl_easy_setopt(curl, CURLOPT_RANGE, req->has_range ? req->range : NULL);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, req);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, req);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_upload_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, req);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, on_upload_seek);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, req);
    /* a copy or a complete sends nothing (or blanks) while the server
     * works: only the deadline bounds those */
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     req->server_bytes > 0 ? 0L : (long)LOW_SPEED_TIME_S);

    /* No "Expect: 100-continue" round trip; the body follows at once. */
    *headers = curl_slist_append(NULL, "Expect:");
    if (req->post_data != NULL && req->post_len > 0)
        sigv4_sha256_hex(req->post_data, req->post_len, payload_hash);
    else if (req->body != NULL && req->body->length > 0)
        snprintf(payload_hash, sizeof(payload_hash), "%s", SIGV4_UNSIGNED_PAYLOAD);
    else
        snprintf(payload_hash, sizeof(payload_hash), "%s", SIGV4_EMPTY_SHA256);
    for (size_t i = 0; req->extra_headers[i] != NULL; i++)
        *headers = curl_slist_append(*headers, req->extra_headers[i]);
    if (client->session_token != NULL) {
        size_t len = strlen(client->session_token) + 32;
        char *token_line = malloc(len);
        if (token_line == NULL)
            return ENOMEM;
        snprintf(token_line, len, "x-amz-security-token: %s", client->session_token);
        *headers = curl_slist_append(*headers, token_line);
        explicit_bzero(token_line, len);
        free(token_line);
    }
    if (*headers == NULL)
        return ENOMEM;
    int err = sign_request(client, req, path, payload_hash, headers);
    if (err != 0)
        return err;
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, *headers);
        return 0;
}

static void reset_attempt(struct s3_request *req)
{
    req->status = 0;
    req->sink_err = 0;
    req->answer_checked = false;
    req->range_seen = false;
    req->answer_etag[0] = '\0';
    req->recv_len = 0;
    req->body_pos = 0;
    req->s3_code[0] = '\0';
    req->error_body.len = 0;
    if (req->error_body.data != NULL)
        req->error_body.data[0] = '\0';
    if (req->xml != NULL) {
        req->xml->len = 0;
        if (req->xml->data != NULL)
            req->xml->data[0] = '\0';
    }
    if (req->info != NULL)
        memset(req->info, 0, sizeof(*req->info));
}

/*
 * Run REQ to completion within its deadline: returns 0 when the server
 * answered 2xx (and REQ's parse accepted the body), else the errno;
 * FAILURE (may be NULL) receives the description of the last error.
 */
static int s3_perform(struct s3_client *client, struct s3_request *req,
                      struct s3_failure *failure)
{
    char *path = NULL;
    char *url = NULL;
    CURL *curl = NULL;
    int err = 0;
    char description[256] = "";
    uint64_t deadline_ms = request_deadline_ms(client, req);
    uint64_t deadline = 0;

    req->error_body.cap = ERROR_BODY_MAX;
    path = request_path(client, req->key);
    if (path == NULL) {
        err = ENOMEM;
        goto out;
    }
    size_t url_len = strlen(client->endpoint.url_base) + strlen(path) +
                     (req->query ? strlen(req->query) : 0) + 2;
    url = malloc(url_len);
    if (url == NULL) {
        err = ENOMEM;
        goto out;
    }
    snprintf(url, url_len, "%s%s%s%s", client->endpoint.url_base, path,
             req->query && req->query[0] ? "?" : "",
             req->query ? req->query : "");
    curl = pool_get(client);
    if (curl == NULL) {
        err = ENOMEM;
        goto out;
    }
    /* (the wait for a connection is not the request's: others bound it) */
    deadline = clock_monotonic_ms() + deadline_ms;

    for (unsigned attempt = 0;; attempt++) {
        struct curl_slist *headers = NULL;
        uint64_t now = clock_monotonic_ms();
        reset_attempt(req);
        err = prepare_attempt(client, curl, req, url, path, &headers);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                         (long)(deadline > now ? deadline - now : 1));
        CURLcode rc = CURLE_OK;
        if (err == 0) {
            atomic_fetch_add(&client->requests[req->op], 1);
            rc = curl_easy_perform(curl);
        }
        /* nothing of this request may leak into the next one on this handle */
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, NULL);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
        curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)-1);
        curl_easy_setopt(curl, CURLOPT_UPLOAD, 0L);
        curl_slist_free_all(headers);
        if (err != 0)
            goto out;
        if (rc == CURLE_OK) {
            long status = 0;
            curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
            req->status = status;
        }
        if (req->status >= 300 && req->error_body.len > 0) {
            struct s3xml_error parsed;
            if (s3xml_parse_error(req->error_body.data, req->error_body.len,
                                  &parsed) == 0)
                snprintf(req->s3_code, sizeof(req->s3_code), "%s", parsed.code);
        }
        if (req->sink_err != 0) {
            err = req->sink_err;
            snprintf(description, sizeof(description), "%s", strerror(err));
            break;
        }
        struct errmap_result result = {
            .curl_code = (int)rc,
            .http_status = rc == CURLE_OK ? req->status : 0,
            .s3_code = req->s3_code,
        };
        bool may_have_run = false;
        bool retry = false;
        bool parse_failed = false;
        err = errmap_errno(&result);
        if (err == 0 && req->parse != NULL) {
            err = req->parse(req);
            parse_failed = err != 0;
        }
        if (err == 0)
            break;
        if (parse_failed && (err == EPROTO || err == EOVERFLOW)) {
            /* a 2xx whose XML was cut short or garbled, or a PUT's without
             * its ETag: the server may have done the work, the answer did
             * not come whole */
            err = EIO;
            retry = may_have_run = true;
            snprintf(description, sizeof(description),
                     "the answer (HTTP %ld) is not what was asked for: XML "
                     "cut short or not valid, or no ETag", req->status);
        } else if (parse_failed && err == EIO) {
            result.error_in_body = true;
            err = errmap_errno(&result);
            retry = errmap_retryable(&result, &may_have_run);
            errmap_describe(&result, description, sizeof(description));
        } else if (parse_failed) {
            snprintf(description, sizeof(description), "%s", strerror(err));
            break;
        } else {
            retry = errmap_retryable(&result, &may_have_run);
            errmap_describe(&result, description, sizeof(description));
        }
        /* what the complete of a multipart upload checks afterwards */
        req->may_have_run = req->may_have_run || (retry && may_have_run);
        if (!retry || attempt >= client->max_retries ||
            (!req->idempotent && may_have_run))
            break;
        uint64_t pause = backoff_ms(attempt);
        now = clock_monotonic_ms();
        if (now + pause >= deadline) {
            snprintf(description + strlen(description),
                     sizeof(description) - strlen(description),
                     "; its deadline (%llu.%01llu s) %s",
                     (unsigned long long)(deadline_ms / 1000),
                     (unsigned long long)(deadline_ms % 1000 / 100),
                     now >= deadline ? "has passed"
                                     : "leaves no time for another attempt");
            break;
        }
        atomic_fetch_add(&client->retries, 1);
        log_debug("%s %s: %s; retry %u", req->method, req->key ? req->key : "/",
                  description, attempt + 1);
        /* let others use the connection while this request waits */
        pool_put(client, curl);
        curl = NULL;
        sleep_ms(pause);
        uint64_t waited_from = clock_monotonic_ms();
        curl = pool_get(client);
        if (curl == NULL) {
            err = ENOMEM;
            goto out;
        }
        deadline += clock_monotonic_ms() - waited_from;
    }
    if (req->sink != NULL)
        atomic_fetch_add(&client->bytes_received, req->delivered);
    if (err == 0) {
        if (req->recv_buf != NULL)
            atomic_fetch_add(&client->bytes_received, req->recv_len);
        if (req->body != NULL)
            atomic_fetch_add(&client->bytes_sent, req->body->length);
    } else if (err != ENOENT) {
        /* (a missing key is an ordinary answer: no failure, no log line) */
        atomic_fetch_add(&client->failures, 1);
        if (!req->quiet)
            log_warn("%s %s: %s", req->method, req->key ? req->key : "/",
                     description);
    }
out:
    if (curl != NULL)
        pool_put(client, curl);
    if (failure != NULL) {
        failure->err = err;
        failure->server_answered = req->status != 0;
        snprintf(failure->description, sizeof(failure->description), "%s",
                 description[0] ? description : strerror(err));
    }
    capped_buf_free(&req->error_body);
    free(url);
    free(path);
    return err;
}

/* --------------------------------------------------------- client life */

int s3_client_create(const struct s3_conf *conf, struct s3_client **out,
                     char *errbuf, size_t errlen)
{
    struct s3_client *client = calloc(1, sizeof(*client));
    int err = 0;

    *out = NULL;
    if (client == NULL)
        return ENOMEM;
    pthread_mutex_init(&client->share_lock, NULL);
    pthread_mutex_init(&client->pool.lock, NULL);
    pthread_cond_init(&client->pool.handle_free, NULL);
    client->pool.max = conf->max_connections > 0 ? conf->max_connections : 1;
    client->max_retries = conf->max_retries;
    client->deadline_base_ms = (uint64_t)((conf->request_timeout > 0
                                               ? conf->request_timeout
                                               : S3_REQUEST_TIMEOUT_DEFAULT) *
                                          1000.0);
    client->bucket = strdup(conf->bucket);
    client->region = strdup(conf->region ? conf->region : "us-east-1");
    client->access_key = strdup_or_null(conf->access_key);
    /* kept out of core dumps */
    client->secret_key = secret_strdup(conf->secret_key);
    client->session_token = secret_strdup(conf->session_token);
    client->ca_bundle = strdup_or_null(conf->ca_bundle);
    client->pool.idle = calloc(client->pool.max, sizeof(CURL *));
    client->share = curl_share_init();
    if (!client->bucket || !client->region || !client->pool.idle ||
        !client->share || (conf->access_key && !client->access_key) ||
        (conf->secret_key && !client->secret_key) ||
        (conf->session_token && !client->session_token) ||
        (conf->ca_bundle && !client->ca_bundle)) {
        err = ENOMEM;
        goto out;
    }
    if (conf->access_key != NULL && conf->secret_key == NULL) {
        snprintf(errbuf, errlen, "an access key was given without a secret key");
        err = EINVAL;
        goto out;
    }
    curl_share_setopt(client->share, CURLSHOPT_LOCKFUNC, share_lock_cb);
    curl_share_setopt(client->share, CURLSHOPT_UNLOCKFUNC, share_unlock_cb);
    curl_share_setopt(client->share, CURLSHOPT_USERDATA, client);
    curl_share_setopt(client->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(client->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    err = endpoint_resolve(conf->endpoint, client->region, conf->bucket,
                           conf->path_style, &client->endpoint, errbuf, errlen);
out:
    if (err != 0)
        s3_client_destroy(&client);
    *out = client;
    return err;
}

void s3_client_destroy(struct s3_client **clientp)
{
    struct s3_client *client = *clientp;

    if (client == NULL)
        return;
    for (unsigned i = 0; i < client->pool.idle_count; i++)
        curl_easy_cleanup(client->pool.idle[i]);
    free(client->pool.idle);
    if (client->share != NULL)
        curl_share_cleanup(client->share);
    pthread_mutex_destroy(&client->share_lock);
    pthread_mutex_destroy(&client->pool.lock);
    pthread_cond_destroy(&client->pool.handle_free);
    secret_free(&client->secret_key);
    secret_free(&client->session_token);
    free(client->access_key);
    free(client->bucket);
    free(client->region);
    free(client->ca_bundle);
    endpoint_clear(&client->endpoint);
    free(client);
    *clientp = NULL;
}

void s3_client_stats(struct s3_client *client, struct s3_stats *out)
{
    for (int i = 0; i < S3_OP_COUNT; i++)
        out->requests[i] = atomic_load(&client->requests[i]);
    out->bytes_received = atomic_load(&client->bytes_received);
    out->bytes_sent = atomic_load(&client->bytes_sent);
    out->retries = atomic_load(&client->retries);
    out->failures = atomic_load(&client->failures);
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
    struct capped_buf xml = {.cap = LIST_BODY_MAX};
    struct s3_request req = {
        .op = S3_OP_LIST, .method = "GET", .query = query, .xml = &xml,
        .idempotent = true, .quiet = true, .wire_bytes = DEADLINE_LIST_BYTES,
    };
    int err;

    if (!query_add(query, sizeof(query), "list-type", "2") ||
        !query_add(query, sizeof(query), "max-keys", "1") ||
        !query_add(query, sizeof(query), "prefix", prefix ? prefix : "")) {
        why->err = ENAMETOOLONG;
        snprintf(why->description, sizeof(why->description), "prefix too long");
        return ENAMETOOLONG;
    }
    err = s3_perform(client, &req, why);
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
    capped_buf_free(&xml);
    return err;
}

int s3_head_object(struct s3_client *client, const char *key,
                   struct s3_object_info *info)
{
    struct s3_request req = {
        .op = S3_OP_HEAD, .method = "HEAD", .key = key, .info = info,
        .idempotent = true,
    };
    return s3_perform(client, &req, NULL);
}

int s3_get_object_range(struct s3_client *client, const char *key,
                        uint64_t offset, size_t length, const char *if_match,
                        void *buf, size_t *received,
                        struct s3_object_info *info)
{
    char match_header[S3_ETAG_MAX + 16];
    struct s3_object_info local_info;
    struct s3_request req = {
        .op = S3_OP_GET, .method = "GET", .key = key, .has_range = true,
        .range_offset = offset, .range_length = length,
        .recv_buf = buf, .recv_cap = length, .if_match = if_match,
        .info = info ? info : &local_info, .idempotent = true,
        .wire_bytes = length,
    };
    int err;

    *received = 0;
    if (length == 0)
        return EINVAL;
    if (if_match != NULL) {
        snprintf(match_header, sizeof(match_header), "If-Match: %s", if_match);
        req.extra_headers[0] = match_header;
    }
    err = s3_perform(client, &req, NULL);
    if (err == 0)
        *received = req.recv_len;
    return err;
}

int s3_get_object_stream(struct s3_client *client, const char *key,
                         uint64_t offset, uint64_t length, const char *if_match,
                         const struct s3_sink *sink, uint64_t *delivered,
                         struct s3_object_info *info)
{
    char match_header[S3_ETAG_MAX + 16];
    struct s3_request req = {
        .op = S3_OP_GET, .method = "GET", .key = key, .has_range = true,
        .range_offset = offset, .range_length = length, .sink = sink,
        .if_match = if_match, .idempotent = true, .info = info,
        .wire_bytes = length,
    };
    int err;

    if (length == 0)
        return EINVAL;
    if (if_match != NULL) {
        snprintf(match_header, sizeof(match_header), "If-Match: %s", if_match);
        req.extra_headers[0] = match_header;
    }
    err = s3_perform(client, &req, NULL);
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
    struct capped_buf xml = {.cap = LIST_BODY_MAX};
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
    err = s3_perform(client, &req, NULL);
    if (err == 0 && continuation_token != NULL && out->truncated &&
        strcmp(out->next_token, continuation_token) == 0) {
        log_warn("LIST %s: the server answered with the continuation token "
                 "it was asked for, so the listing would never end: it is "
                 "cut short here", prefix ? prefix : "");
        s3xml_listing_free(out);
        err = EIO;
    }
out:
    capped_buf_free(&xml);
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
    err = s3_perform(client, &req, NULL);
    if (err == 0)
        copy_etag(&info, etag_out);
    return err;
}

int s3_delete_object(struct s3_client *client, const char *key)
{
    struct s3_request req = {
        .op = S3_OP_DELETE, .method = "DELETE", .key = key, .idempotent = true,
    };
    int err = s3_perform(client, &req, NULL);
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
    struct capped_buf xml = {.cap = SMALL_BODY_MAX};
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
    err = s3_perform(client, &req, &failure);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", etag);
    else if (err != 0 && err != ESTALE && err != ENOENT)
        log_warn("COPY %s -> %s: %s", src_key, dst_key, failure.description);
out:
    free(etag);
    free(source_header);
    capped_buf_free(&xml);
    return err;
}

int s3_multipart_create(struct s3_client *client, const char *key,
                        const struct s3_put_meta *meta, char **upload_id)
{
    char meta_storage[META_LINES][160];
    struct s3_put_meta default_meta = {0};
    struct capped_buf xml = {.cap = SMALL_BODY_MAX};
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "POST", .key = key, .query = "uploads=",
        .xml = &xml, .idempotent = false,
        .parse = parse_upload_id, .parse_out = upload_id,
    };
    size_t slot = 0;
    int err;

    *upload_id = NULL;
    add_meta_headers(&req, &slot, meta ? meta : &default_meta, meta_storage);
    err = s3_perform(client, &req, NULL);
    capped_buf_free(&xml);
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
    err = s3_perform(client, &req, NULL);
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
    struct capped_buf xml = {.cap = SMALL_BODY_MAX};
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
    err = s3_perform(client, &req, &failure);
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
    capped_buf_free(&xml);
    return err;
}

/* ------------------------------------------------- completing uploads */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

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
        int hi = hex_digit(etag[2 * i]), lo = hex_digit(etag[2 * i + 1]);
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
    struct capped_buf body = {.cap = PART_ETAGS_XML_MAX};
    struct capped_buf xml = {.cap = SMALL_BODY_MAX};
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
    bool ok = capped_buf_append(&body, "<CompleteMultipartUpload>", 25);
    int err = 0;

    for (unsigned i = 0; ok && i < part_count; i++) {
        int n = snprintf(part, sizeof(part),
                         "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
                         i + 1, part_etags[i]);
        ok = n > 0 && (size_t)n < sizeof(part) &&
             capped_buf_append(&body, part, (size_t)n);
    }
    ok = ok && capped_buf_append(&body, "</CompleteMultipartUpload>", 26) &&
         (query = upload_query(upload_id, 0)) != NULL;
    if (!ok) {
        err = ENOMEM;
        goto out;
    }
    req.query = query;
    req.post_data = body.data;
    req.post_len = body.len;
    err = s3_perform(client, &req, NULL);
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
    capped_buf_free(&body);
    capped_buf_free(&xml);
    return err;
}

int s3_multipart_abort(struct s3_client *client, const char *key,
                       const char *upload_id)
{
    char *query = upload_query(upload_id, 0);
    struct s3_failure failure;
    /* quiet: a server that cannot abort (ENOSYS) is the caller's to report */
    struct s3_request req = {
        .op = S3_OP_MULTIPART, .method = "DELETE", .key = key, .query = query,
        .idempotent = true, .quiet = true,
    };
    int err;

    if (query == NULL)
        return ENOMEM;
    err = s3_perform(client, &req, &failure);
    if (err != 0 && err != ENOENT && err != ENOSYS)
        log_warn("DELETE %s (abort multipart upload): %s", key,
                 failure.description);
    free(query);
    return err == ENOENT ? 0 : err;
}
