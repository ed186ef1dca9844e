/*
 * s3_client.c - the S3 client's connections and requests (see s3.h):
 * the pool of curl easy handles, signing (sigv4.h), sending a struct
 * s3_request with retries within its deadline, classifying the outcome
 * (errmap.h), and taking the answer's headers and body. s3.c builds the
 * request of each S3 call; s3_internal.h is what the two share.
 *
 * Keys: each attempt is signed with one generation of keys taken from the
 * struct credentials (credentials.h), so the access key, secret and token
 * of one signature always belong together. An answer 403 with a code
 * that says the keys are bad (ExpiredToken, InvalidAccessKeyId, ...;
 * credentials_code_rejects_keys()) has them replaced and the request
 * signed again and sent once more, beyond the ordinary retries.
 *
 * Concurrency: the handle pool is the only shared mutable state besides the
 * atomic counters (the keys have their own lock, in credentials.c). pool.lock guards pool.idle/pool.idle_count/pool.created;
 * handle_free is signalled when a handle returns to the pool. No lock is
 * held during a transfer. Each easy handle keeps its own keep-alive
 * connection; a curl share object (with its own lock) shares DNS answers
 * and TLS sessions between handles.
 */
#include "config.h"

#include "s3/s3_internal.h"

#include <errno.h>
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
#include "base/text.h"
#include "s3/errmap.h"
#include "s3/sigv4.h"

#define ERROR_BODY_MAX (64u << 10)      /* error documents */
#define BACKOFF_BASE_MS 100
#define BACKOFF_CAP_MS 10000
#define CONNECT_TIMEOUT_S 10
#define LOW_SPEED_LIMIT 1024            /* bytes/s: slower than this ... */
#define LOW_SPEED_TIME_S 30             /* ... this long aborts a transfer */
#define RECEIVE_BUFFER (256L << 10)     /* per connection: GET bodies reach
                                           the cache in writes this large */

/* ------------------------------------------------------------- helpers */

void s3_buf_free(struct s3_buf *buf)
{
    free(buf->data);
    buf->data = NULL;
    buf->len = 0;
}

bool s3_buf_append(struct s3_buf *buf, const char *data,
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
        s3_buf_append(&req->error_body, data, len < room ? len : room);
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
        return s3_buf_append(req->xml, data, len) ? len : 0;
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

/* s3fs writes mtime as whole seconds; accept a fraction too. */
static bool parse_epoch(const char *text, size_t len, struct timespec *out)
{
    const char *dot = memchr(text, '.', len);
    size_t int_len = dot != NULL ? (size_t)(dot - text) : len;
    uint64_t seconds;

    if (!text_parse_u64(text, int_len, &seconds) || seconds > INT64_MAX / 2)
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
            text_parse_u64(slash + 1, vlen - (size_t)(slash + 1 - value), &number))
            info->size = number;
    } else if ((value = header_value(line, len, "Content-Length", &vlen))) {
        if (info->size == 0 && text_parse_u64(value, vlen, &number))
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
        info->has_mode = text_parse_u64(value, vlen, &number) && number <= 0xffffffffu;
        info->mode = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-uid", &vlen))) {
        info->has_uid = text_parse_u64(value, vlen, &number) && number < 0xffffffffu;
        info->uid = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-gid", &vlen))) {
        info->has_gid = text_parse_u64(value, vlen, &number) && number < 0xffffffffu;
        info->gid = (uint32_t)number;
    } else if ((value = header_value(line, len, "x-amz-meta-mtime", &vlen))) {
        info->has_mtime = parse_epoch(value, vlen, &info->mtime);
    } else if ((value = header_value(line, len, "x-amz-meta-atime", &vlen))) {
        info->has_atime = parse_epoch(value, vlen, &info->atime);
    } else if ((value = header_value(line, len, "x-amz-meta-ctime", &vlen))) {
        info->has_ctime = parse_epoch(value, vlen, &info->ctime);
    } else if ((value = header_value(line, len, "x-amz-meta-rdev", &vlen))) {
        info->has_rdev = text_parse_u64(value, vlen, &number) && number <= 0xffffffffu;
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
           text_parse_u64(value, (size_t)(dash - value), first) &&
           text_parse_u64(dash + 1, (size_t)(slash - dash - 1), last) &&
           text_parse_u64(slash + 1, len - (size_t)(slash + 1 - value), total) &&
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

/* One attempt of kind OP took SECONDS: counted, and into its latency
 * histogram (both after the attempt, so that a reader of the counters
 * sees the two agree). */
static void count_attempt(struct s3_client *client, enum s3_op op,
                          double seconds)
{
    unsigned bucket = 0;

    if (seconds < 0)
        seconds = 0;
    while (bucket < S3_LATENCY_BUCKETS && seconds > s3_latency_bound(bucket))
        bucket++;
    atomic_fetch_add(&client->latency[op].counts[bucket], 1);
    atomic_fetch_add(&client->latency[op].sum_us,
                     (uint64_t)(seconds * 1e6 + 0.5));
    atomic_fetch_add(&client->requests[op], 1);
}

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
           req->wire_bytes / (client->wire_rate / 1000u) +
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
                        const struct credentials_keys *keys,
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
    if (keys == NULL)
        return 0; /* no_sign */

    signed_headers[count++] = (struct sigv4_header){"host", client->endpoint.host_header};
    signed_headers[count++] = (struct sigv4_header){"x-amz-date", amz_date};
    signed_headers[count++] = (struct sigv4_header){"x-amz-content-sha256", payload_hash};
    if (keys->session_token != NULL) {
        signed_headers[count++] = (struct sigv4_header){"x-amz-security-token",
                                                        keys->session_token};
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
    err = sigv4_authorization(&sig_req, &scope, keys->access_key,
                              keys->secret_key, &authorization);
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

/* Set up CURL for one attempt of REQ, signed with KEYS (NULL: no_sign). */
static int prepare_attempt(struct s3_client *client,
                           const struct credentials_keys *keys, CURL *curl,
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
    if (keys != NULL && keys->session_token != NULL) {
        size_t len = strlen(keys->session_token) + 32;
        char *token_line = malloc(len);
        if (token_line == NULL)
            return ENOMEM;
        snprintf(token_line, len, "x-amz-security-token: %s", keys->session_token);
        *headers = curl_slist_append(*headers, token_line);
        explicit_bzero(token_line, len);
        free(token_line);
    }
    if (*headers == NULL)
        return ENOMEM;
    int err = sign_request(client, keys, req, path, payload_hash, headers);
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
 * One s3_client_perform(): what its steps share. The request is sent in
 * attempts (run_attempts()): each takes the keys current then
 * (attempt_keys()), is set up, signed and sent (attempt_send()), and has
 * its answer read (attempt_answer()) and judged (attempt_errno(),
 * attempt_new_keys(), attempt_failure()); between two attempts, a pause
 * within the deadline (run_time_left(), run_pause()).
 */
struct request_run {
    struct s3_client *client;
    struct s3_request *req;
    char *path;                   /* encoded, as signed */
    char *url;
    CURL *curl;                   /* NULL while none is held */
    struct credentials_keys *keys;/* this attempt's, or NULL (no_sign) */
    uint64_t deadline_ms;         /* the request's, from its start */
    uint64_t deadline;            /* clock_monotonic_ms() */
    unsigned attempt;             /* 0 for the first */
    bool resigned;                /* new keys were asked for (once) */
    bool abandoned;               /* a failure of our own (setting up or
                                     signing an attempt, memory, no
                                     connection): no counters, no log line */
    /* the last attempt */
    CURLcode rc;
    struct errmap_result result;
    bool parse_failed;            /* req->parse refused a 2xx answer */
    bool retry;                   /* another attempt may be made */
    char description[256];        /* what failed, for the log and FAILURE */
};

/* Takes RUN's path, URL and connection, and starts its deadline. Returns
 * 0 or ENOMEM. */
static int run_start(struct request_run *run)
{
    struct s3_client *client = run->client;
    struct s3_request *req = run->req;

    req->error_body.cap = ERROR_BODY_MAX;
    run->path = request_path(client, req->key);
    if (run->path == NULL)
        return ENOMEM;
    size_t url_len = strlen(client->endpoint.url_base) + strlen(run->path) +
                     (req->query ? strlen(req->query) : 0) + 2;
    run->url = malloc(url_len);
    if (run->url == NULL)
        return ENOMEM;
    snprintf(run->url, url_len, "%s%s%s%s", client->endpoint.url_base,
             run->path, req->query && req->query[0] ? "?" : "",
             req->query ? req->query : "");
    run->curl = pool_get(client);
    if (run->curl == NULL)
        return ENOMEM;
    /* (the wait for a connection is not the request's: others bound it) */
    run->deadline = clock_monotonic_ms() + run->deadline_ms;
    return 0;
}

/* Readies RUN's request for another attempt and takes the keys to sign
 * it with. Returns 0, or EACCES (with run->description) when they expired
 * and could not be replaced. */
static int attempt_keys(struct request_run *run)
{
    reset_attempt(run->req);
    credentials_keys_release(run->client->creds, &run->keys);
    if (run->client->creds != NULL &&
        credentials_get(run->client->creds, &run->keys) != 0) {
        snprintf(run->description, sizeof(run->description),
                 "the keys from %s have expired and could not be "
                 "replaced", credentials_source_name(run->client->creds));
        return EACCES;
    }
    return 0;
}

/* Sends RUN's request once, signed with run->keys, bounded by what is
 * left of the deadline at STARTED (ms), timed and counted; leaves nothing
 * of it on the handle. Returns 0 (run->rc tells how the transfer ended)
 * or the errno of setting it up. */
static int attempt_send(struct request_run *run, uint64_t started)
{
    struct curl_slist *headers = NULL;
    CURL *curl = run->curl;
    int err = prepare_attempt(run->client, run->keys, curl, run->req,
                              run->url, run->path, &headers);

    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     (long)(run->deadline > started ? run->deadline - started
                                                    : 1));
    run->rc = CURLE_OK;
    if (err == 0) {
        double sent = clock_monotonic_seconds();
        run->rc = curl_easy_perform(curl);
        count_attempt(run->client, run->req->op,
                      clock_monotonic_seconds() - sent);
    }
    /* nothing of this request may leak into the next one on this handle */
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, NULL);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)-1);
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 0L);
    curl_slist_free_all(headers);
    return err;
}

/* Takes the HTTP status of RUN's answer (when the transfer ended well)
 * and the <Code> of its error document into the request. */
static void attempt_answer(struct request_run *run)
{
    struct s3_request *req = run->req;

    if (run->rc == CURLE_OK) {
        long status = 0;
        curl_easy_getinfo(run->curl, CURLINFO_RESPONSE_CODE, &status);
        req->status = status;
    }
    if (req->status >= 300 && req->error_body.len > 0) {
        struct s3xml_error parsed;
        if (s3xml_parse_error(req->error_body.data, req->error_body.len,
                              &parsed) == 0)
            snprintf(req->s3_code, sizeof(req->s3_code), "%s", parsed.code);
    }
}

/* The errno of RUN's attempt (errmap's, then the request's parse of a
 * 2xx answer): 0 when it succeeded. Sets run->result and
 * run->parse_failed. */
static int attempt_errno(struct request_run *run)
{
    struct s3_request *req = run->req;
    int err;

    run->result = (struct errmap_result){
        .curl_code = (int)run->rc,
        .http_status = run->rc == CURLE_OK ? req->status : 0,
        .s3_code = req->s3_code,
    };
    run->parse_failed = false;
    err = errmap_errno(&run->result);
    if (err == 0 && req->parse != NULL) {
        err = req->parse(req);
        run->parse_failed = err != 0;
    }
    return err;
}

/* Whether RUN's attempt was refused for its keys and new ones were had:
 * then it is signed again and sent at once (once a request). */
static bool attempt_new_keys(struct request_run *run)
{
    struct s3_request *req = run->req;

    if (run->resigned || run->keys == NULL || run->rc != CURLE_OK ||
        req->status != 403 || !credentials_code_rejects_keys(req->s3_code))
        return false;
    /* keys that expired or were replaced: new ones, once */
    run->resigned = true;
    if (credentials_rejected(run->client->creds, run->keys->generation) != 0)
        return false;
    atomic_fetch_add(&run->client->retries, 1);
    log_debug("%s %s: 403 %s; signed again with new keys", req->method,
              req->key ? req->key : "/", req->s3_code);
    return true;
}

/* RUN's attempt failed with ERR (attempt_errno()'s): returns the errno it
 * fails with, with run->description, and run->retry saying whether
 * another attempt may be made (retryable, retries left, and safe for a
 * request that is not idempotent). */
static int attempt_failure(struct request_run *run, int err)
{
    struct s3_request *req = run->req;
    bool may_have_run = false;
    bool retry = false;

    run->retry = false;
    if (run->parse_failed && (err == EPROTO || err == EOVERFLOW)) {
        /* a 2xx whose XML was cut short or garbled, or a PUT's without
         * its ETag: the server may have done the work, the answer did
         * not come whole */
        err = EIO;
        retry = may_have_run = true;
        snprintf(run->description, sizeof(run->description),
                 "the answer (HTTP %ld) is not what was asked for: XML "
                 "cut short or not valid, or no ETag", req->status);
    } else if (run->parse_failed && err == EIO) {
        run->result.error_in_body = true;
        err = errmap_errno(&run->result);
        retry = errmap_retryable(&run->result, &may_have_run);
        errmap_describe(&run->result, run->description,
                        sizeof(run->description));
    } else if (run->parse_failed) {
        snprintf(run->description, sizeof(run->description), "%s",
                 strerror(err));
        return err;
    } else {
        retry = errmap_retryable(&run->result, &may_have_run);
        errmap_describe(&run->result, run->description,
                        sizeof(run->description));
    }
    /* what the complete of a multipart upload checks afterwards */
    req->may_have_run = req->may_have_run || (retry && may_have_run);
    run->retry = retry && run->attempt < run->client->max_retries &&
                 (req->idempotent || !may_have_run);
    return err;
}

/* Whether RUN's deadline leaves time for a pause of PAUSE ms and another
 * attempt; if not, run->description says so. */
static bool run_time_left(struct request_run *run, uint64_t pause)
{
    uint64_t now = clock_monotonic_ms();
    size_t used = strlen(run->description);

    if (now + pause < run->deadline)
        return true;
    snprintf(run->description + used, sizeof(run->description) - used,
             "; its deadline (%llu.%01llu s) %s",
             (unsigned long long)(run->deadline_ms / 1000),
             (unsigned long long)(run->deadline_ms % 1000 / 100),
             now >= run->deadline ? "has passed"
                                  : "leaves no time for another attempt");
    return false;
}

/* Counts and logs RUN's retry, then waits PAUSE ms without a connection
 * and takes one again, the deadline moved by the wait for it. Returns 0
 * or ENOMEM (no connection). */
static int run_pause(struct request_run *run, uint64_t pause)
{
    struct s3_request *req = run->req;

    atomic_fetch_add(&run->client->retries, 1);
    log_debug("%s %s: %s; retry %u", req->method, req->key ? req->key : "/",
              run->description, run->attempt + 1);
    /* let others use the connection while this request waits */
    pool_put(run->client, run->curl);
    run->curl = NULL;
    sleep_ms(pause);
    uint64_t waited_from = clock_monotonic_ms();
    run->curl = pool_get(run->client);
    if (run->curl == NULL)
        return ENOMEM;
    run->deadline += clock_monotonic_ms() - waited_from;
    return 0;
}

/* Sends RUN's request until an attempt succeeds, one fails for good, or
 * the deadline leaves no time for another. Returns 0 or the errno, with
 * run->description; run->abandoned when a failure of our own ended it. */
static int run_attempts(struct request_run *run)
{
    int err;

    for (run->attempt = 0;; run->attempt++) {
        /* (read before the keys are taken: the attempt's timeout counts
         * from here) */
        uint64_t started = clock_monotonic_ms();
        err = attempt_keys(run);
        if (err != 0)
            return err;
        err = attempt_send(run, started);
        if (err != 0) {
            run->abandoned = true;
            return err;
        }
        attempt_answer(run);
        if (run->req->sink_err != 0) {
            err = run->req->sink_err;
            snprintf(run->description, sizeof(run->description), "%s",
                     strerror(err));
            return err;
        }
        err = attempt_errno(run);
        if (err == 0)
            return 0;
        if (attempt_new_keys(run))
            continue;
        err = attempt_failure(run, err);
        if (!run->retry)
            return err;
        uint64_t pause = backoff_ms(run->attempt);
        if (!run_time_left(run, pause))
            return err;
        err = run_pause(run, pause);
        if (err != 0) {
            run->abandoned = true;
            return err;
        }
    }
}

/* Counts what RUN's request moved, or that it failed (ERR) with one log
 * line unless it is quiet. */
static void run_count(const struct request_run *run, int err)
{
    struct s3_client *client = run->client;
    const struct s3_request *req = run->req;

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
                     run->description);
    }
}

/* Gives back what RUN holds, and fills FAILURE (may be NULL) from ERR. */
static void run_finish(struct request_run *run, int err,
                       struct s3_failure *failure)
{
    credentials_keys_release(run->client->creds, &run->keys);
    if (run->curl != NULL)
        pool_put(run->client, run->curl);
    if (failure != NULL) {
        failure->err = err;
        failure->server_answered = run->req->status != 0;
        snprintf(failure->description, sizeof(failure->description), "%s",
                 run->description[0] ? run->description : strerror(err));
    }
    s3_buf_free(&run->req->error_body);
    free(run->url);
    free(run->path);
}

int s3_client_perform(struct s3_client *client, struct s3_request *req,
                      struct s3_failure *failure)
{
    struct request_run run = {
        .client = client,
        .req = req,
        .deadline_ms = request_deadline_ms(client, req),
    };
    int err = run_start(&run);

    if (err == 0) {
        err = run_attempts(&run);
        if (!run.abandoned)
            run_count(&run, err);
    }
    run_finish(&run, err, failure);
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
    client->wire_rate = conf->min_wire_rate > DEADLINE_WIRE_RATE
                            ? conf->min_wire_rate : DEADLINE_WIRE_RATE;
    client->bucket = strdup(conf->bucket);
    client->region = strdup(conf->region ? conf->region : "us-east-1");
    client->ca_bundle = strdup_or_null(conf->ca_bundle);
    client->pool.idle = calloc(client->pool.max, sizeof(CURL *));
    client->share = curl_share_init();
    if (!client->bucket || !client->region || !client->pool.idle ||
        !client->share || (conf->ca_bundle && !client->ca_bundle)) {
        err = ENOMEM;
        goto out;
    }
    if (conf->credentials != NULL) {
        client->creds = conf->credentials;
    } else if (conf->access_key != NULL) {
        struct credentials_source source;
        if (conf->secret_key == NULL) {
            snprintf(errbuf, errlen, "an access key was given without a secret key");
            err = EINVAL;
            goto out;
        }
        /* kept out of core dumps (secret.h) */
        err = credentials_static_source(conf->access_key, conf->secret_key,
                                        conf->session_token, NULL, &source);
        if (err == 0)
            err = credentials_create(&source, NULL, &client->creds, errbuf,
                                     errlen);
        if (err != 0)
            goto out;
        client->owns_creds = true;
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
    if (client->owns_creds)
        credentials_destroy(&client->creds);
    free(client->bucket);
    free(client->region);
    free(client->ca_bundle);
    endpoint_clear(&client->endpoint);
    free(client);
    *clientp = NULL;
}

void s3_client_stats(struct s3_client *client, struct s3_stats *out)
{
    for (int i = 0; i < S3_OP_COUNT; i++) {
        out->requests[i] = atomic_load(&client->requests[i]);
        for (unsigned b = 0; b <= S3_LATENCY_BUCKETS; b++)
            out->latency[i].counts[b] =
                atomic_load(&client->latency[i].counts[b]);
        out->latency[i].sum_us = atomic_load(&client->latency[i].sum_us);
    }
    out->bytes_received = atomic_load(&client->bytes_received);
    out->bytes_sent = atomic_load(&client->bytes_sent);
    out->retries = atomic_load(&client->retries);
    out->failures = atomic_load(&client->failures);
}
