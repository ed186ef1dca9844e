/*
 * fake_s3.c - an in-memory S3 behind the functions of s3.h, with hooks
 * for tests (see fake_s3.h).
 *
 * State, all under client->lock:
 *   objects     a sorted array of the bucket's objects (strcmp order)
 *   uploads     the multipart uploads under way, with their parts
 *   holds       hold rules, and held (the requests waiting, each a node
 *               on its caller's stack)
 *   fails       failure rules, oldest first
 *   log         every request, in arrival order
 *   stats       the counters of s3_client_stats()
 * `changed` is broadcast whenever a request arrives, is held, released or
 * ends: the waits of the hooks and the held requests all wait on it.
 *
 * Object data lives in blobs: immutable, reference-counted byte arrays.
 * A GET takes a reference under the lock and streams the blob without it,
 * so a sink may take any lock (the cache's) and a replacement meanwhile
 * does not change what the GET serves.
 *
 * Every request goes through request_begin() (log, count, hold, failure
 * rules) and request_end() (result into the log, failure counter, the
 * lost answer's errno). Continuation tokens are "fake:" then K or P (the
 * last entry of the page was a key or a common prefix) then that entry in
 * hex: opaque to callers, and a page after a common prefix skips every
 * key under it, as S3's do.
 */
#include "config.h"

#include "fake_s3.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "writer/upload.h"

#define MAX_PART_NUMBER 10000u
#define CONTENT_TYPE_DEFAULT "application/octet-stream"
#define TOKEN_PREFIX "fake:"

/* Immutable bytes of an object or a part. */
struct blob {
    unsigned refs;                  /* under the client's lock */
    uint64_t size;
    unsigned char md5[16];
    unsigned char bytes[];
};

/* The headers an object keeps (s3fs times in whole seconds). */
struct stored_meta {
    char content_type[128];
    bool has_mode, has_uid, has_gid, has_mtime, has_atime, has_ctime, has_rdev;
    uint32_t mode, uid, gid, rdev;
    time_t mtime, atime, ctime;
};

struct object {
    char *key;
    struct blob *blob;
    char etag[S3_ETAG_MAX];
    struct stored_meta meta;
    struct timespec last_modified;
};

struct part {
    struct blob *blob;              /* NULL: not uploaded */
    char etag[S3_ETAG_MAX];
};

struct upload {
    char *id;
    char *key;
    struct stored_meta meta;
    struct part *parts;             /* by part number - 1 */
    unsigned part_cap;
    struct upload *next;
};

struct rule {
    unsigned id;
    unsigned calls;
    char *key;                      /* NULL: any */
    bool prefix;
    /* failure rules */
    unsigned left;
    int err;
    bool lost;
    struct rule *next;
};

/* A request waiting in request_begin(), on its caller's stack. */
struct held {
    unsigned rule;
    uint64_t seq;
    bool released;
    struct held *next;
};

struct log_entry {
    struct fake_s3_request request;
    char *key, *source, *condition; /* what request's strings point to */
};

struct s3_client {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct object **objects;
    size_t object_count, object_cap;
    struct upload *uploads;
    uint64_t upload_serial;
    struct rule *holds, *fails;
    unsigned rule_serial;
    struct held *held;
    struct log_entry *log;
    size_t log_count, log_cap;
    uint64_t seq;
    unsigned under_way;             /* requests begun and not ended */
    time_t clock;
    enum fake_s3_conditions conditions;  /* what If-None-Match does */
    enum fake_s3_conditions if_match;    /* what If-Match on a PUT does */
    struct s3_stats stats;
};

/* One request on its way through the fake. */
struct request {
    enum fake_s3_call call;
    const char *key, *source, *condition;
    uint64_t offset, length;
    unsigned part_number;
    uint64_t seq;
    size_t log_index;
    bool logged;
    int lost_err;                   /* an answer to lose once it acted */
    char etag[S3_ETAG_MAX];         /* what it made, for the log */
};

static const enum s3_op op_of_call[FAKE_S3_CALL_COUNT] = {
    [FAKE_S3_HEAD] = S3_OP_HEAD,
    [FAKE_S3_GET] = S3_OP_GET,
    [FAKE_S3_LIST] = S3_OP_LIST,
    [FAKE_S3_PUT] = S3_OP_PUT,
    [FAKE_S3_DELETE] = S3_OP_DELETE,
    [FAKE_S3_COPY] = S3_OP_COPY,
    [FAKE_S3_MP_CREATE] = S3_OP_MULTIPART,
    [FAKE_S3_MP_PART] = S3_OP_MULTIPART,
    [FAKE_S3_MP_COPY_PART] = S3_OP_MULTIPART,
    [FAKE_S3_MP_COMPLETE] = S3_OP_MULTIPART,
    [FAKE_S3_MP_ABORT] = S3_OP_DELETE, /* (priced as one) */
};

static const char *const call_names[FAKE_S3_CALL_COUNT] = {
    [FAKE_S3_HEAD] = "HEAD",
    [FAKE_S3_GET] = "GET",
    [FAKE_S3_LIST] = "LIST",
    [FAKE_S3_PUT] = "PUT",
    [FAKE_S3_DELETE] = "DELETE",
    [FAKE_S3_COPY] = "COPY",
    [FAKE_S3_MP_CREATE] = "MP_CREATE",
    [FAKE_S3_MP_PART] = "MP_PART",
    [FAKE_S3_MP_COPY_PART] = "MP_COPY_PART",
    [FAKE_S3_MP_COMPLETE] = "MP_COMPLETE",
    [FAKE_S3_MP_ABORT] = "MP_ABORT",
};

void fake_s3_set_conditions(struct s3_client *s3,
                            enum fake_s3_conditions conditions)
{
    pthread_mutex_lock(&s3->lock);
    s3->conditions = conditions;
    s3->if_match = conditions;
    pthread_mutex_unlock(&s3->lock);
}

void fake_s3_set_if_match_conditions(struct s3_client *s3,
                                     enum fake_s3_conditions conditions)
{
    pthread_mutex_lock(&s3->lock);
    s3->if_match = conditions;
    pthread_mutex_unlock(&s3->lock);
}

const char *fake_s3_call_name(enum fake_s3_call call)
{
    return call < FAKE_S3_CALL_COUNT ? call_names[call] : "?";
}

/* ---------------------------------------------------------- MD5, ETags */

static void md5_of(const void *data, size_t len, unsigned char out[16])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int out_len = 0;

    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_md5(), NULL) != 1) {
        memset(out, 0, 16);
    } else {
        EVP_DigestUpdate(ctx, data, len);
        EVP_DigestFinal_ex(ctx, out, &out_len);
    }
    EVP_MD_CTX_free(ctx);
}

static void hex_of(const unsigned char *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

static void quoted_md5(const unsigned char md5[16], char *out)
{
    char hex[33];

    hex_of(md5, 16, hex);
    snprintf(out, S3_ETAG_MAX, "\"%s\"", hex);
}

/* The multipart ETag of COUNT parts whose binary MD5s are MD5S. */
static void multipart_etag(const unsigned char (*md5s)[16], unsigned count,
                           char *out)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char digest[16] = {0};
    unsigned int digest_len = 0;
    char hex[33];

    if (ctx != NULL && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1) {
        for (unsigned i = 0; i < count; i++)
            EVP_DigestUpdate(ctx, md5s[i], 16);
        EVP_DigestFinal_ex(ctx, digest, &digest_len);
    }
    EVP_MD_CTX_free(ctx);
    hex_of(digest, 16, hex);
    snprintf(out, S3_ETAG_MAX, "\"%s-%u\"", hex, count);
}

void fake_s3_etag_of(const void *data, size_t len, char *out)
{
    unsigned char md5[16];

    md5_of(data, len, md5);
    quoted_md5(md5, out);
}

void fake_s3_multipart_etag_of(const void *data, size_t len,
                               uint64_t part_size, char *out)
{
    unsigned count = (unsigned)((len + part_size - 1) / part_size);
    unsigned char (*md5s)[16] = calloc(count ? count : 1, 16);
    const unsigned char *bytes = data;

    if (md5s == NULL) {
        snprintf(out, S3_ETAG_MAX, "\"out of memory\"");
        return;
    }
    for (unsigned i = 0; i < count; i++) {
        uint64_t offset = (uint64_t)i * part_size;
        uint64_t length = len - offset < part_size ? len - offset : part_size;
        md5_of(bytes + offset, (size_t)length, md5s[i]);
    }
    multipart_etag((const unsigned char (*)[16])md5s, count, out);
    free(md5s);
}

/* ---------------------------------------------------------------- blobs */

static struct blob *blob_new(uint64_t size)
{
    struct blob *blob = malloc(sizeof(*blob) + (size_t)size);

    if (blob == NULL)
        return NULL;
    blob->refs = 1;
    blob->size = size;
    return blob;
}

/* Lock held (or the blob not shared yet). */
static void blob_unref_locked(struct blob *blob)
{
    if (blob != NULL && --blob->refs == 0)
        free(blob);
}

static void blob_unref(struct s3_client *s3, struct blob **blob)
{
    pthread_mutex_lock(&s3->lock);
    blob_unref_locked(*blob);
    pthread_mutex_unlock(&s3->lock);
    *blob = NULL;
}

/* A blob of BODY's bytes (memory, or LENGTH bytes of fd at OFFSET), with
 * its MD5. 0, ENOMEM, or EIO when the fd ends first or cannot be read. */
static int blob_of_body(const struct s3_body *body, struct blob **out)
{
    struct blob *blob = blob_new(body->length);

    *out = NULL;
    if (blob == NULL)
        return ENOMEM;
    if (body->data != NULL) {
        memcpy(blob->bytes, body->data, (size_t)body->length);
    } else {
        for (uint64_t done = 0; done < body->length;) {
            ssize_t got = pread(body->fd, blob->bytes + done,
                                (size_t)(body->length - done),
                                (off_t)(body->offset + done));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                free(blob);
                return EIO;
            }
            done += (uint64_t)got;
        }
    }
    md5_of(blob->bytes, (size_t)blob->size, blob->md5);
    *out = blob;
    return 0;
}

/* -------------------------------------------------------------- objects */

static void meta_store(const struct s3_put_meta *meta, struct stored_meta *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->content_type, sizeof(out->content_type), "%s",
             meta != NULL && meta->content_type != NULL ? meta->content_type
                                                        : CONTENT_TYPE_DEFAULT);
    if (meta == NULL)
        return;
    out->has_mode = meta->has_mode;
    out->mode = meta->mode;
    out->has_uid = meta->has_uid;
    out->uid = meta->uid;
    out->has_gid = meta->has_gid;
    out->gid = meta->gid;
    out->has_mtime = meta->has_mtime;
    out->mtime = meta->mtime.tv_sec;
    out->has_atime = meta->has_atime;
    out->atime = meta->atime.tv_sec;
    out->has_ctime = meta->has_ctime;
    out->ctime = meta->ctime.tv_sec;
    out->has_rdev = meta->has_rdev;
    out->rdev = meta->rdev;
}

static void info_fill(const struct object *object, struct s3_object_info *info)
{
    if (info == NULL)
        return;
    memset(info, 0, sizeof(*info));
    info->size = object->blob->size;
    snprintf(info->etag, sizeof(info->etag), "%s", object->etag);
    info->last_modified = object->last_modified;
    snprintf(info->content_type, sizeof(info->content_type), "%s",
             object->meta.content_type);
    const struct stored_meta *meta = &object->meta;
    info->has_mode = meta->has_mode;
    info->mode = meta->mode;
    info->has_uid = meta->has_uid;
    info->uid = meta->uid;
    info->has_gid = meta->has_gid;
    info->gid = meta->gid;
    info->has_mtime = meta->has_mtime;
    info->mtime.tv_sec = meta->mtime;
    info->has_atime = meta->has_atime;
    info->atime.tv_sec = meta->atime;
    info->has_ctime = meta->has_ctime;
    info->ctime.tv_sec = meta->ctime;
    info->has_rdev = meta->has_rdev;
    info->rdev = meta->rdev;
}

/* Where KEY is or would go in the sorted array (lock held). */
static size_t object_position_locked(struct s3_client *s3, const char *key,
                                     bool *found)
{
    size_t low = 0, high = s3->object_count;

    *found = false;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        int order = strcmp(s3->objects[middle]->key, key);
        if (order == 0) {
            *found = true;
            return middle;
        }
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

static struct object *object_find_locked(struct s3_client *s3, const char *key)
{
    bool found;
    size_t at = object_position_locked(s3, key, &found);

    return found ? s3->objects[at] : NULL;
}

/*
 * Store BLOB (the caller's reference passes to the object) as KEY with
 * META and ETAG, replacing any object there (lock held). 0 or ENOMEM (the
 * reference stays the caller's then).
 */
static int object_store_locked(struct s3_client *s3, const char *key,
                               struct blob *blob,
                               const struct stored_meta *meta, const char *etag)
{
    bool found;
    size_t at = object_position_locked(s3, key, &found);
    struct object *object;

    if (found) {
        object = s3->objects[at];
        blob_unref_locked(object->blob);
    } else {
        if (s3->object_count == s3->object_cap) {
            size_t cap = s3->object_cap ? 2 * s3->object_cap : 64;
            struct object **grown = realloc(s3->objects, cap * sizeof(*grown));
            if (grown == NULL)
                return ENOMEM;
            s3->objects = grown;
            s3->object_cap = cap;
        }
        object = calloc(1, sizeof(*object));
        if (object == NULL || (object->key = strdup(key)) == NULL) {
            free(object);
            return ENOMEM;
        }
        memmove(&s3->objects[at + 1], &s3->objects[at],
                (s3->object_count - at) * sizeof(*s3->objects));
        s3->objects[at] = object;
        s3->object_count++;
    }
    object->blob = blob;
    object->meta = *meta;
    snprintf(object->etag, sizeof(object->etag), "%s", etag);
    object->last_modified = (struct timespec){.tv_sec = ++s3->clock};
    return 0;
}

static bool object_remove_locked(struct s3_client *s3, const char *key)
{
    bool found;
    size_t at = object_position_locked(s3, key, &found);

    if (!found)
        return false;
    struct object *object = s3->objects[at];
    memmove(&s3->objects[at], &s3->objects[at + 1],
            (s3->object_count - at - 1) * sizeof(*s3->objects));
    s3->object_count--;
    blob_unref_locked(object->blob);
    free(object->key);
    free(object);
    return true;
}

/* -------------------------------------------------------------- uploads */

static struct upload *upload_find_locked(struct s3_client *s3, const char *key,
                                         const char *upload_id)
{
    for (struct upload *upload = s3->uploads; upload != NULL;
         upload = upload->next)
        if (strcmp(upload->id, upload_id) == 0 && strcmp(upload->key, key) == 0)
            return upload;
    return NULL;
}

static void upload_free_locked(struct upload *upload)
{
    for (unsigned i = 0; i < upload->part_cap; i++)
        blob_unref_locked(upload->parts[i].blob);
    free(upload->parts);
    free(upload->id);
    free(upload->key);
    free(upload);
}

static void upload_remove_locked(struct s3_client *s3, struct upload *upload)
{
    for (struct upload **link = &s3->uploads; *link != NULL;
         link = &(*link)->next) {
        if (*link == upload) {
            *link = upload->next;
            upload_free_locked(upload);
            return;
        }
    }
}

/* Store BLOB (the reference passes) as part NUMBER of UPLOAD (lock held).
 * 0 or ENOMEM (the reference stays the caller's). */
static int part_store_locked(struct upload *upload, unsigned number,
                             struct blob *blob, char *etag_out)
{
    if (number > upload->part_cap) {
        unsigned cap = upload->part_cap ? upload->part_cap : 16;
        while (cap < number)
            cap *= 2;
        if (cap > MAX_PART_NUMBER)
            cap = MAX_PART_NUMBER;
        struct part *grown = realloc(upload->parts, cap * sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        memset(&grown[upload->part_cap], 0,
               (cap - upload->part_cap) * sizeof(*grown));
        upload->parts = grown;
        upload->part_cap = cap;
    }
    struct part *part = &upload->parts[number - 1];
    blob_unref_locked(part->blob);
    part->blob = blob;
    quoted_md5(blob->md5, part->etag);
    snprintf(etag_out, S3_ETAG_MAX, "%s", part->etag);
    return 0;
}

/* ---------------------------------------------------------------- rules */

static bool matches(unsigned calls, const char *rule_key, bool prefix,
                    enum fake_s3_call call, const char *key)
{
    if (calls != 0 && !(calls & FAKE_S3_CALL(call)))
        return false;
    if (rule_key == NULL)
        return true;
    if (key == NULL)
        return false;
    return prefix ? strncmp(key, rule_key, strlen(rule_key)) == 0
                  : strcmp(key, rule_key) == 0;
}

static bool rule_matches(const struct rule *rule, enum fake_s3_call call,
                         const char *key)
{
    return matches(rule->calls, rule->key, rule->prefix, call, key);
}

static bool match_matches(const struct fake_s3_match *match,
                          const struct fake_s3_request *request)
{
    if (match == NULL)
        return true;
    return matches(match->calls, match->key, match->prefix, request->call,
                   request->key);
}

/* A new rule at the end of *LIST (lock held). */
static int rule_add_locked(struct s3_client *s3, struct rule **list,
                           const struct fake_s3_match *match, struct rule **out)
{
    struct rule *rule = calloc(1, sizeof(*rule));

    if (rule == NULL)
        return ENOMEM;
    if (match->key != NULL && (rule->key = strdup(match->key)) == NULL) {
        free(rule);
        return ENOMEM;
    }
    rule->id = ++s3->rule_serial;
    rule->calls = match->calls;
    rule->prefix = match->prefix;
    while (*list != NULL)
        list = &(*list)->next;
    *list = rule;
    *out = rule;
    return 0;
}

/* Remove rule ID (0: every one) from *LIST (lock held). */
static void rules_remove_locked(struct rule **list, unsigned id)
{
    while (*list != NULL) {
        struct rule *rule = *list;
        if (id == 0 || rule->id == id) {
            *list = rule->next;
            free(rule->key);
            free(rule);
        } else {
            list = &rule->next;
        }
    }
}

/* Absolute deadline of a hook's wait (CLOCK_MONOTONIC, as `changed`). */
static struct timespec wait_deadline(void)
{
    struct timespec until;

    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += FAKE_S3_WAIT_SECONDS;
    return until;
}

/* ------------------------------------------------------------- requests */

/* Log REQUEST (lock held). Its strings are copied; on ENOMEM it goes
 * unlogged. */
static void log_add_locked(struct s3_client *s3, struct request *request)
{
    if (s3->log_count == s3->log_cap) {
        size_t cap = s3->log_cap ? 2 * s3->log_cap : 256;
        struct log_entry *grown = realloc(s3->log, cap * sizeof(*grown));
        if (grown == NULL)
            return;
        s3->log = grown;
        s3->log_cap = cap;
    }
    struct log_entry *entry = &s3->log[s3->log_count];
    memset(entry, 0, sizeof(*entry));
    entry->key = request->key ? strdup(request->key) : NULL;
    entry->source = request->source ? strdup(request->source) : NULL;
    entry->condition = request->condition ? strdup(request->condition) : NULL;
    if ((request->key && !entry->key) || (request->source && !entry->source) ||
        (request->condition && !entry->condition)) {
        free(entry->key);
        free(entry->source);
        free(entry->condition);
        return;
    }
    entry->request = (struct fake_s3_request){
        .seq = request->seq,
        .call = request->call,
        .key = entry->key,
        .source = entry->source,
        .condition = entry->condition,
        .offset = request->offset,
        .length = request->length,
        .part_number = request->part_number,
    };
    request->log_index = s3->log_count++;
    request->logged = true;
}

/* The first hold rule matching REQUEST, or NULL (lock held). */
static struct rule *hold_rule_locked(struct s3_client *s3,
                                     const struct request *request)
{
    for (struct rule *rule = s3->holds; rule != NULL; rule = rule->next)
        if (rule_matches(rule, request->call, request->key))
            return rule;
    return NULL;
}

/*
 * A request arrives: log and count it, wait while a hold rule matches,
 * then apply the failure rules. Returns 0 for a request that is to act
 * (REQUEST->lost_err says whether its answer is then lost), or the errno
 * it fails with before acting. Lock not held on entry or return.
 */
static int request_begin(struct s3_client *s3, struct request *request)
{
    int err = 0;

    pthread_mutex_lock(&s3->lock);
    request->seq = s3->seq++;
    request->lost_err = 0;
    s3->under_way++;
    log_add_locked(s3, request);
    s3->stats.requests[op_of_call[request->call]]++;
    pthread_cond_broadcast(&s3->changed);

    struct rule *hold = hold_rule_locked(s3, request);
    if (hold != NULL) {
        struct held node = {.rule = hold->id, .seq = request->seq};
        struct held **tail = &s3->held;
        while (*tail != NULL)
            tail = &(*tail)->next;
        *tail = &node;
        pthread_cond_broadcast(&s3->changed);
        /* (whoever releases it takes it off the list) */
        while (!node.released)
            pthread_cond_wait(&s3->changed, &s3->lock);
    }

    for (struct rule *rule = s3->fails; rule != NULL; rule = rule->next) {
        if (rule->left == 0 || !rule_matches(rule, request->call, request->key))
            continue;
        if (rule->left != FAKE_S3_ALWAYS)
            rule->left--;
        if (rule->lost)
            request->lost_err = rule->err;
        else
            err = rule->err;
        break;
    }
    pthread_mutex_unlock(&s3->lock);
    return err;
}

/*
 * A request ends with ERR (its own outcome): record it in the log and
 * the counters. Returns what the caller gets: ERR, or the lost answer's
 * errno when it acted. Lock not held.
 */
static int request_end(struct s3_client *s3, struct request *request, int err)
{
    if (err == 0 && request->lost_err != 0)
        err = request->lost_err;
    pthread_mutex_lock(&s3->lock);
    if (request->logged && request->log_index < s3->log_count &&
        s3->log[request->log_index].request.seq == request->seq) {
        struct fake_s3_request *logged = &s3->log[request->log_index].request;
        logged->done = true;
        logged->result = err;
        snprintf(logged->etag, sizeof(logged->etag), "%s", request->etag);
    }
    if (err != 0 && err != ENOENT)
        s3->stats.failures++;
    s3->under_way--;
    pthread_cond_broadcast(&s3->changed);
    pthread_mutex_unlock(&s3->lock);
    return err;
}

/* ------------------------------------------------------- client life */

int fake_s3_create(struct s3_client **out)
{
    struct s3_client *s3 = calloc(1, sizeof(*s3));
    pthread_condattr_t monotonic;

    *out = NULL;
    if (s3 == NULL)
        return ENOMEM;
    pthread_mutex_init(&s3->lock, NULL);
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&s3->changed, &monotonic);
    pthread_condattr_destroy(&monotonic);
    s3->clock = FAKE_S3_EPOCH;
    *out = s3;
    return 0;
}

int s3_client_create(const struct s3_conf *conf, struct s3_client **out,
                     char *errbuf, size_t errlen)
{
    (void)conf;
    if (errbuf != NULL && errlen > 0)
        errbuf[0] = '\0';
    return fake_s3_create(out);
}

/* ----------------------------------------------------------- snapshots */

struct fake_s3_snapshot {
    struct object **objects;
    size_t count;
};

/* Free COUNT objects of OBJECTS (their blobs unreferenced; lock held). */
static void objects_free_locked(struct object **objects, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        blob_unref_locked(objects[i]->blob);
        free(objects[i]->key);
        free(objects[i]);
    }
    free(objects);
}

/* A copy of COUNT objects (blobs shared; lock held), or NULL. */
static struct object **objects_copy_locked(struct object *const *objects,
                                           size_t count)
{
    struct object **copy = calloc(count > 0 ? count : 1, sizeof(*copy));

    for (size_t i = 0; copy != NULL && i < count; i++) {
        copy[i] = malloc(sizeof(*copy[i]));
        char *key = copy[i] != NULL ? strdup(objects[i]->key) : NULL;
        if (key == NULL) {
            free(copy[i]);
            objects_free_locked(copy, i);
            return NULL;
        }
        *copy[i] = *objects[i];
        copy[i]->key = key;
        copy[i]->blob->refs++;
    }
    return copy;
}

int fake_s3_snapshot_take(struct s3_client *s3, struct fake_s3_snapshot **out)
{
    struct fake_s3_snapshot *snap = calloc(1, sizeof(*snap));

    *out = NULL;
    if (snap == NULL)
        return ENOMEM;
    pthread_mutex_lock(&s3->lock);
    snap->objects = objects_copy_locked(s3->objects, s3->object_count);
    snap->count = s3->object_count;
    pthread_mutex_unlock(&s3->lock);
    if (snap->objects == NULL) {
        free(snap);
        return ENOMEM;
    }
    *out = snap;
    return 0;
}

int fake_s3_snapshot_restore(struct s3_client *s3,
                             const struct fake_s3_snapshot *snap)
{
    pthread_mutex_lock(&s3->lock);
    struct object **copy = objects_copy_locked(snap->objects, snap->count);
    if (copy != NULL) {
        objects_free_locked(s3->objects, s3->object_count);
        s3->objects = copy;
        s3->object_cap = snap->count > 0 ? snap->count : 1;
        s3->object_count = snap->count;
    }
    pthread_mutex_unlock(&s3->lock);
    return copy != NULL ? 0 : ENOMEM;
}

void fake_s3_snapshot_free(struct s3_client *s3, struct fake_s3_snapshot **snapp)
{
    struct fake_s3_snapshot *snap = *snapp;

    if (snap == NULL)
        return;
    pthread_mutex_lock(&s3->lock);
    objects_free_locked(snap->objects, snap->count);
    pthread_mutex_unlock(&s3->lock);
    free(snap);
    *snapp = NULL;
}

void s3_client_destroy(struct s3_client **client)
{
    struct s3_client *s3 = *client;

    if (s3 == NULL)
        return;
    objects_free_locked(s3->objects, s3->object_count);
    while (s3->uploads != NULL) {
        struct upload *upload = s3->uploads;
        s3->uploads = upload->next;
        upload_free_locked(upload);
    }
    rules_remove_locked(&s3->holds, 0);
    rules_remove_locked(&s3->fails, 0);
    fake_s3_log_clear(s3);
    free(s3->log);
    pthread_cond_destroy(&s3->changed);
    pthread_mutex_destroy(&s3->lock);
    free(s3);
    *client = NULL;
}

void s3_client_stats(struct s3_client *client, struct s3_stats *out)
{
    pthread_mutex_lock(&client->lock);
    *out = client->stats;
    pthread_mutex_unlock(&client->lock);
}

/* ------------------------------------------------------------ reading */

int s3_check_bucket(struct s3_client *client, const char *prefix,
                    struct s3_failure *why)
{
    struct request request = {.call = FAKE_S3_LIST, .key = prefix ? prefix : "",
                              .length = 1};
    int err = request_begin(client, &request);

    err = request_end(client, &request, err);
    if (err != 0 && why != NULL) {
        why->err = err;
        why->server_answered = true;
        snprintf(why->description, sizeof(why->description), "%s",
                 strerror(err));
    }
    return err;
}

int s3_head_object(struct s3_client *client, const char *key,
                   struct s3_object_info *info)
{
    struct request request = {.call = FAKE_S3_HEAD, .key = key};
    int err = request_begin(client, &request);

    memset(info, 0, sizeof(*info));
    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        struct object *object = object_find_locked(client, key);
        if (object == NULL)
            err = ENOENT;
        else
            info_fill(object, info);
        pthread_mutex_unlock(&client->lock);
    }
    return request_end(client, &request, err);
}

/*
 * The version of KEY a GET of [OFFSET, OFFSET + LENGTH) with IF_MATCH
 * serves: a reference to its blob, and its headers into INFO (may be
 * NULL). ENOENT, ESTALE (If-Match), EINVAL (the range starts at or past
 * the end: 416).
 */
static int get_version(struct s3_client *s3, const char *key, uint64_t offset,
                       const char *if_match, struct blob **blob,
                       struct s3_object_info *info)
{
    int err = 0;

    *blob = NULL;
    pthread_mutex_lock(&s3->lock);
    struct object *object = object_find_locked(s3, key);
    if (object == NULL)
        err = ENOENT;
    else if (if_match != NULL && strcmp(if_match, object->etag) != 0)
        err = ESTALE;
    else if (offset >= object->blob->size)
        err = EINVAL;
    if (err == 0) {
        *blob = object->blob;
        (*blob)->refs++;
        info_fill(object, info);
    }
    pthread_mutex_unlock(&s3->lock);
    return err;
}

int s3_get_object_range(struct s3_client *client, const char *key,
                        uint64_t offset, size_t length, const char *if_match,
                        void *buf, size_t *received,
                        struct s3_object_info *info)
{
    struct request request = {.call = FAKE_S3_GET, .key = key,
                              .condition = if_match, .offset = offset,
                              .length = length};
    struct blob *blob = NULL;
    int err;

    *received = 0;
    if (info != NULL)
        memset(info, 0, sizeof(*info));
    if (length == 0)
        return EINVAL;
    err = request_begin(client, &request);
    if (err == 0)
        err = get_version(client, key, offset, if_match, &blob, info);
    if (err == 0) {
        uint64_t available = blob->size - offset;
        size_t copied = available < length ? (size_t)available : length;
        if (request.lost_err != 0)
            copied /= 2; /* the answer broke off half-way */
        memcpy(buf, blob->bytes + offset, copied);
        if (request.lost_err == 0) {
            *received = copied;
            pthread_mutex_lock(&client->lock);
            client->stats.bytes_received += copied;
            pthread_mutex_unlock(&client->lock);
        }
        blob_unref(client, &blob);
    }
    return request_end(client, &request, err);
}

int s3_get_object_stream(struct s3_client *client, const char *key,
                         uint64_t offset, uint64_t length, const char *if_match,
                         const struct s3_sink *sink, uint64_t *delivered,
                         struct s3_object_info *info)
{
    struct request request = {.call = FAKE_S3_GET, .key = key,
                              .condition = if_match, .offset = offset,
                              .length = length};
    struct blob *blob = NULL;
    uint64_t done = 0;
    int err;

    if (delivered != NULL)
        *delivered = 0;
    if (info != NULL)
        memset(info, 0, sizeof(*info));
    if (length == 0)
        return EINVAL;
    err = request_begin(client, &request);
    if (err == 0)
        err = get_version(client, key, offset, if_match, &blob, info);
    if (err == 0) {
        uint64_t available = blob->size - offset;
        uint64_t end = available < length ? available : length;
        if (request.lost_err != 0)
            end /= 2; /* the answer broke off half-way */
        while (err == 0 && done < end) {
            uint64_t piece = end - done < FAKE_S3_SINK_CHUNK
                                 ? end - done
                                 : FAKE_S3_SINK_CHUNK;
            err = sink->write(sink->arg, blob->bytes + offset + done,
                              (size_t)piece);
            if (err == 0)
                done += piece;
        }
        /* the object ended first: not the size the caller knows */
        if (err == 0 && request.lost_err == 0 && done != length)
            err = EIO;
        pthread_mutex_lock(&client->lock);
        client->stats.bytes_received += done;
        pthread_mutex_unlock(&client->lock);
        blob_unref(client, &blob);
    }
    if (delivered != NULL)
        *delivered = done;
    return request_end(client, &request, err);
}

/* ------------------------------------------------------------ listing */

/* TOKEN_PREFIX, then KIND, then ENTRY in hex: malloc'd, or NULL. */
static char *token_make(char kind, const char *entry)
{
    size_t len = strlen(entry);
    char *token = malloc(strlen(TOKEN_PREFIX) + 2 + 2 * len);

    if (token == NULL)
        return NULL;
    size_t at = (size_t)sprintf(token, "%s%c", TOKEN_PREFIX, kind);
    hex_of((const unsigned char *)entry, len, token + at);
    return token;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* TOKEN -> *KIND and a malloc'd *ENTRY. 0, EINVAL (not one of ours),
 * ENOMEM. */
static int token_parse(const char *token, char *kind, char **entry)
{
    size_t prefix_len = strlen(TOKEN_PREFIX);
    size_t len = strlen(token);

    *entry = NULL;
    if (len < prefix_len + 1 || strncmp(token, TOKEN_PREFIX, prefix_len) != 0 ||
        (token[prefix_len] != 'K' && token[prefix_len] != 'P') ||
        (len - prefix_len - 1) % 2 != 0)
        return EINVAL;
    *kind = token[prefix_len];
    const char *hex = token + prefix_len + 1;
    size_t bytes = strlen(hex) / 2;
    char *decoded = malloc(bytes + 1);
    if (decoded == NULL)
        return ENOMEM;
    for (size_t i = 0; i < bytes; i++) {
        int high = hex_value(hex[2 * i]), low = hex_value(hex[2 * i + 1]);
        if (high < 0 || low < 0 || (high == 0 && low == 0)) {
            free(decoded);
            return EINVAL;
        }
        decoded[i] = (char)(high << 4 | low);
    }
    decoded[bytes] = '\0';
    *entry = decoded;
    return 0;
}

/* Append a copy of OBJECT's entry to OUT. 0 or ENOMEM. */
static int listing_add_object(struct s3xml_listing *out,
                              const struct object *object)
{
    struct s3xml_object *grown =
        realloc(out->objects, (out->object_count + 1) * sizeof(*grown));
    if (grown == NULL)
        return ENOMEM;
    out->objects = grown;
    struct s3xml_object *entry = &out->objects[out->object_count];
    memset(entry, 0, sizeof(*entry));
    entry->key = strdup(object->key);
    entry->etag = strdup(object->etag);
    entry->size = object->blob->size;
    entry->mtime = object->last_modified;
    out->object_count++;
    return entry->key != NULL && entry->etag != NULL ? 0 : ENOMEM;
}

/* Append the common prefix PREFIX (its first LEN bytes) to OUT. 0 or
 * ENOMEM. */
static int listing_add_prefix(struct s3xml_listing *out, const char *prefix,
                              size_t len)
{
    char **grown =
        realloc(out->prefixes, (out->prefix_count + 1) * sizeof(*grown));

    if (grown == NULL)
        return ENOMEM;
    out->prefixes = grown;
    out->prefixes[out->prefix_count] = strndup(prefix, len);
    if (out->prefixes[out->prefix_count] == NULL)
        return ENOMEM;
    out->prefix_count++;
    return 0;
}

int s3_list_objects(struct s3_client *client, const char *prefix,
                    const char *delimiter, const char *continuation_token,
                    const char *start_after, unsigned max_keys,
                    struct s3xml_listing *out)
{
    if (prefix == NULL)
        prefix = "";
    if (delimiter != NULL && delimiter[0] == '\0')
        delimiter = NULL;
    max_keys = max_keys < 1 ? 1 : max_keys > 1000 ? 1000 : max_keys;
    struct request request = {.call = FAKE_S3_LIST, .key = prefix,
                              .length = max_keys};
    char resume_kind = 'K';
    char *resume = NULL;            /* list what sorts after this */
    char *last_prefix = NULL;       /* the common prefix listed last */
    size_t prefix_len = strlen(prefix);
    int err;

    memset(out, 0, sizeof(*out));
    err = request_begin(client, &request);
    if (err == 0 && continuation_token != NULL)
        err = token_parse(continuation_token, &resume_kind, &resume);
    else if (err == 0 && start_after != NULL &&
             (resume = strdup(start_after)) == NULL)
        err = ENOMEM;
    if (err != 0)
        goto out;

    pthread_mutex_lock(&client->lock);
    bool found;
    size_t at = resume != NULL ? object_position_locked(client, resume, &found)
                               : object_position_locked(client, prefix, &found);
    unsigned entries = 0;
    char last_kind = 'K';
    const char *last_entry = NULL;
    for (; err == 0 && at < client->object_count; at++) {
        const struct object *object = client->objects[at];
        if (strncmp(object->key, prefix, prefix_len) != 0) {
            if (strcmp(object->key, prefix) > 0)
                break; /* past every key under PREFIX */
            continue;
        }
        if (resume != NULL && strcmp(object->key, resume) <= 0)
            continue;
        if (resume != NULL && resume_kind == 'P' &&
            strncmp(object->key, resume, strlen(resume)) == 0)
            continue; /* under the common prefix the last page ended with */
        const char *split = delimiter != NULL
                                ? strstr(object->key + prefix_len, delimiter)
                                : NULL;
        size_t common_len =
            split != NULL ? (size_t)(split - object->key) + strlen(delimiter)
                          : 0;
        if (split != NULL && last_prefix != NULL &&
            strncmp(object->key, last_prefix, strlen(last_prefix)) == 0)
            continue; /* that common prefix is listed already */
        if (entries == max_keys) {
            out->truncated = true;
            break;
        }
        if (split != NULL) {
            err = listing_add_prefix(out, object->key, common_len);
            if (err == 0) {
                last_prefix = out->prefixes[out->prefix_count - 1];
                last_entry = last_prefix;
                last_kind = 'P';
            }
        } else {
            err = listing_add_object(out, object);
            last_entry = object->key;
            last_kind = 'K';
        }
        entries++;
    }
    if (err == 0 && out->truncated &&
        (out->next_token = token_make(last_kind, last_entry)) == NULL)
        err = ENOMEM;
    pthread_mutex_unlock(&client->lock);
out:
    free(resume);
    if (err != 0)
        s3xml_listing_free(out);
    return request_end(client, &request, err);
}

/* ------------------------------------------------------------ writing */

int s3_put_object(struct s3_client *client, const char *key,
                  const struct s3_body *body, const struct s3_put_meta *meta,
                  char *etag_out)
{
    const char *if_match = meta != NULL ? meta->if_match : NULL;
    struct request request = {.call = FAKE_S3_PUT, .key = key,
                              .length = body->length, .condition = if_match};
    struct stored_meta stored;
    struct blob *blob = NULL;
    int err = request_begin(client, &request);

    if (err == 0)
        err = blob_of_body(body, &blob);
    if (err == 0) {
        meta_store(meta, &stored);
        quoted_md5(blob->md5, request.etag);
        pthread_mutex_lock(&client->lock);
        bool conditional = meta != NULL && meta->if_none_match;
        struct object *there = object_find_locked(client, key);
        if ((conditional && client->conditions == FAKE_S3_CONDITIONS_REFUSED) ||
            (if_match != NULL && client->if_match == FAKE_S3_CONDITIONS_REFUSED))
            err = ENOSYS; /* 501, as Swift answers */
        else if (conditional &&
                 client->conditions == FAKE_S3_CONDITIONS_HONOURED &&
                 there != NULL)
            err = ESTALE; /* If-None-Match: * and the key is taken */
        else if (if_match != NULL &&
                 client->if_match == FAKE_S3_CONDITIONS_HONOURED)
            err = there == NULL                        ? ENOENT
                  : strcmp(there->etag, if_match) != 0 ? ESTALE
                                                       : 0;
        if (err == 0)
            err = object_store_locked(client, key, blob, &stored, request.etag);
        if (err == 0)
            client->stats.bytes_sent += body->length;
        else
            blob_unref_locked(blob);
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", request.etag);
    return err;
}

int s3_delete_object(struct s3_client *client, const char *key)
{
    struct request request = {.call = FAKE_S3_DELETE, .key = key};
    int err = request_begin(client, &request);

    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        object_remove_locked(client, key); /* a missing key is no error */
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    return err == ENOENT ? 0 : err;
}

int s3_copy_object(struct s3_client *client, const char *src_key,
                   const char *src_etag, const char *dst_key,
                   const struct s3_put_meta *meta, char *etag_out)
{
    struct request request = {.call = FAKE_S3_COPY, .key = dst_key,
                              .source = src_key, .condition = src_etag};
    int err = request_begin(client, &request);

    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        struct object *source = object_find_locked(client, src_key);
        if (source == NULL) {
            err = ENOENT;
        } else if (src_etag != NULL && strcmp(src_etag, source->etag) != 0) {
            err = ESTALE;
        } else {
            struct stored_meta stored = source->meta;
            struct blob *blob = source->blob;
            if (meta != NULL)
                meta_store(meta, &stored);
            blob->refs++;
            quoted_md5(blob->md5, request.etag);
            err = object_store_locked(client, dst_key, blob, &stored,
                                      request.etag);
            if (err != 0)
                blob_unref_locked(blob);
        }
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", request.etag);
    return err;
}

int s3_multipart_create(struct s3_client *client, const char *key,
                        const struct s3_put_meta *meta, char **upload_id)
{
    struct request request = {.call = FAKE_S3_MP_CREATE, .key = key};
    struct upload *upload = NULL;
    char *id_copy = NULL;
    int err = request_begin(client, &request);

    *upload_id = NULL;
    if (err == 0) {
        upload = calloc(1, sizeof(*upload));
        if (upload == NULL || (upload->key = strdup(key)) == NULL)
            err = ENOMEM;
    }
    if (err == 0) {
        meta_store(meta, &upload->meta);
        pthread_mutex_lock(&client->lock);
        char id[64];
        snprintf(id, sizeof(id), "fake-upload-%llu",
                 (unsigned long long)++client->upload_serial);
        upload->id = strdup(id);
        id_copy = strdup(id);
        if (upload->id == NULL || id_copy == NULL) {
            err = ENOMEM;
        } else {
            upload->next = client->uploads;
            client->uploads = upload;
            upload = NULL;
        }
        pthread_mutex_unlock(&client->lock);
    }
    if (upload != NULL) {
        free(upload->id);
        free(upload->key);
        free(upload);
    }
    err = request_end(client, &request, err);
    if (err == 0)
        *upload_id = id_copy;
    else
        free(id_copy);
    return err;
}

int s3_multipart_upload_part(struct s3_client *client, const char *key,
                             const char *upload_id, unsigned part_number,
                             const struct s3_body *body, char *etag_out)
{
    struct request request = {.call = FAKE_S3_MP_PART, .key = key,
                              .length = body->length,
                              .part_number = part_number};
    struct blob *blob = NULL;
    int err;

    if (part_number < 1 || part_number > MAX_PART_NUMBER)
        return EINVAL;
    err = request_begin(client, &request);
    if (err == 0)
        err = blob_of_body(body, &blob);
    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        struct upload *upload = upload_find_locked(client, key, upload_id);
        err = upload == NULL ? ENOENT
                             : part_store_locked(upload, part_number, blob,
                                                 request.etag);
        if (err == 0)
            client->stats.bytes_sent += body->length;
        else
            blob_unref_locked(blob);
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    if (err == 0)
        snprintf(etag_out, S3_ETAG_MAX, "%s", request.etag);
    return err;
}

int s3_multipart_copy_part(struct s3_client *client, const char *key,
                           const char *upload_id, unsigned part_number,
                           const char *src_key, const char *src_etag,
                           uint64_t offset, uint64_t length, char *etag_out)
{
    struct request request = {.call = FAKE_S3_MP_COPY_PART, .key = key,
                              .source = src_key, .condition = src_etag,
                              .offset = offset, .length = length,
                              .part_number = part_number};
    struct blob *blob = NULL;
    int err;

    if (part_number < 1 || part_number > MAX_PART_NUMBER || length == 0 ||
        offset + length < offset)
        return EINVAL;
    err = request_begin(client, &request);
    if (err == 0 && (blob = blob_new(length)) == NULL)
        err = ENOMEM;
    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        struct object *source = object_find_locked(client, src_key);
        struct upload *upload = upload_find_locked(client, key, upload_id);
        if (source == NULL || upload == NULL)
            err = ENOENT;
        else if (src_etag != NULL && strcmp(src_etag, source->etag) != 0)
            err = ESTALE;
        else if (offset + length > source->blob->size)
            err = EINVAL;
        if (err == 0) {
            memcpy(blob->bytes, source->blob->bytes + offset, (size_t)length);
            md5_of(blob->bytes, (size_t)length, blob->md5);
            err = part_store_locked(upload, part_number, blob, request.etag);
        }
        if (err != 0)
            blob_unref_locked(blob);
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    if (err == 0)
        snprintf(etag_out, S3_ETAG_MAX, "%s", request.etag);
    return err;
}

/* Complete UPLOAD_ID of KEY with PART_ETAGS (lock not held): the object
 * is made and the upload goes. ETAG gets the object's ETag. ENOENT (no
 * such upload), EINVAL (a part missing, another ETag, a part too small,
 * no parts), ENOMEM. */
static int complete_upload(struct s3_client *s3, const char *key,
                           const char *upload_id, const char *const *part_etags,
                           unsigned part_count, char *etag)
{
    unsigned char (*md5s)[16] = calloc(part_count ? part_count : 1, 16);
    struct blob *blob = NULL;
    uint64_t size = 0;
    int err = md5s == NULL ? ENOMEM : 0;

    pthread_mutex_lock(&s3->lock);
    struct upload *upload =
        err == 0 ? upload_find_locked(s3, key, upload_id) : NULL;
    if (err == 0 && upload == NULL)
        err = ENOENT;
    if (err == 0 && (part_count == 0 || part_count > upload->part_cap))
        err = EINVAL;
    for (unsigned i = 0; err == 0 && i < part_count; i++) {
        const struct part *part = &upload->parts[i];
        if (part->blob == NULL || strcmp(part->etag, part_etags[i]) != 0 ||
            (i + 1 < part_count && part->blob->size < UPLOAD_MIN_PART_SIZE))
            err = EINVAL;
        else
            size += part->blob->size;
    }
    if (err == 0 && (blob = blob_new(size)) == NULL)
        err = ENOMEM;
    if (err == 0) {
        uint64_t at = 0;
        for (unsigned i = 0; i < part_count; i++) {
            const struct blob *part = upload->parts[i].blob;
            memcpy(blob->bytes + at, part->bytes, (size_t)part->size);
            memcpy(md5s[i], part->md5, 16);
            at += part->size;
        }
        md5_of(blob->bytes, (size_t)blob->size, blob->md5);
        multipart_etag((const unsigned char (*)[16])md5s, part_count, etag);
        err = object_store_locked(s3, key, blob, &upload->meta, etag);
        if (err == 0)
            upload_remove_locked(s3, upload);
        else
            blob_unref_locked(blob);
    }
    pthread_mutex_unlock(&s3->lock);
    free(md5s);
    return err;
}

/* What s3.c does after a complete that may have run and failed: whether
 * KEY is the object of these parts (see s3_multipart_complete_object()
 * in s3.h). 0 with its ETag in ETAG, ESTALE, or HEAD's errno. */
static int complete_check_object(struct s3_client *s3, const char *key,
                                 const char *const *part_etags,
                                 unsigned part_count,
                                 const struct s3_body *whole, char *etag)
{
    struct s3_object_info info;
    unsigned char (*md5s)[16] = calloc(part_count ? part_count : 1, 16);
    char expected[S3_ETAG_MAX] = "";
    bool parts_are_md5s = md5s != NULL;
    int err = s3_head_object(s3, key, &info);

    for (unsigned i = 0; err == 0 && parts_are_md5s && i < part_count; i++) {
        const char *text = part_etags[i];
        parts_are_md5s =
            strlen(text) == 34 && text[0] == '"' && text[33] == '"';
        for (unsigned j = 0; parts_are_md5s && j < 16; j++) {
            int high = hex_value(text[1 + 2 * j]),
                low = hex_value(text[2 + 2 * j]);
            parts_are_md5s = high >= 0 && low >= 0;
            md5s[i][j] = (unsigned char)(high << 4 | low);
        }
    }
    if (err == 0 && parts_are_md5s)
        multipart_etag((const unsigned char (*)[16])md5s, part_count, expected);
    free(md5s);
    if (err != 0)
        return err;
    if (whole != NULL && info.size != whole->length)
        return ESTALE;
    if (expected[0] != '\0' && strcmp(info.etag, expected) == 0) {
        snprintf(etag, S3_ETAG_MAX, "%s", info.etag);
        return 0;
    }
    /* a plain MD5 of the object (s3rver's way): hash what was uploaded */
    if (whole != NULL && (whole->data != NULL || whole->fd >= 0)) {
        struct blob *bytes = NULL;
        char plain[S3_ETAG_MAX];
        err = blob_of_body(whole, &bytes);
        if (err != 0)
            return err;
        quoted_md5(bytes->md5, plain);
        free(bytes);
        if (strcmp(info.etag, plain) == 0) {
            snprintf(etag, S3_ETAG_MAX, "%s", info.etag);
            return 0;
        }
    }
    return ESTALE;
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
    struct request request = {.call = FAKE_S3_MP_COMPLETE, .key = key,
                              .part_number = part_count};
    int err = request_begin(client, &request);

    if (err == 0)
        err = complete_upload(client, key, upload_id, part_etags, part_count,
                              request.etag);
    bool may_have_run = err == 0 && request.lost_err != 0;
    err = request_end(client, &request, err);
    /* as s3.c: an attempt that may have run, or NoSuchUpload, is checked
     * in the bucket */
    if (err != 0 && (may_have_run || err == ENOENT) &&
        complete_check_object(client, key, part_etags, part_count, whole,
                              request.etag) == 0)
        err = 0;
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", request.etag);
    return err;
}

int s3_multipart_abort(struct s3_client *client, const char *key,
                       const char *upload_id)
{
    struct request request = {.call = FAKE_S3_MP_ABORT, .key = key};
    int err = request_begin(client, &request);

    if (err == 0) {
        pthread_mutex_lock(&client->lock);
        struct upload *upload = upload_find_locked(client, key, upload_id);
        if (upload != NULL)
            upload_remove_locked(client, upload);
        pthread_mutex_unlock(&client->lock);
    }
    err = request_end(client, &request, err);
    return err == ENOENT ? 0 : err;
}

/* ------------------------------------------------- the bucket, directly */

int fake_s3_put(struct s3_client *s3, const char *key, const void *data,
                size_t len, const struct s3_put_meta *meta, char *etag_out)
{
    struct s3_body body = {.data = len > 0 ? data : "", .length = len};
    struct stored_meta stored;
    struct blob *blob = NULL;
    char etag[S3_ETAG_MAX];
    int err = blob_of_body(&body, &blob);

    if (err != 0)
        return err;
    meta_store(meta, &stored);
    quoted_md5(blob->md5, etag);
    pthread_mutex_lock(&s3->lock);
    err = object_store_locked(s3, key, blob, &stored, etag);
    if (err != 0)
        blob_unref_locked(blob);
    pthread_mutex_unlock(&s3->lock);
    if (err == 0 && etag_out != NULL)
        snprintf(etag_out, S3_ETAG_MAX, "%s", etag);
    return err;
}

bool fake_s3_delete(struct s3_client *s3, const char *key)
{
    pthread_mutex_lock(&s3->lock);
    bool existed = object_remove_locked(s3, key);
    pthread_mutex_unlock(&s3->lock);
    return existed;
}

int fake_s3_get(struct s3_client *s3, const char *key, void **data,
                size_t *len, struct s3_object_info *info)
{
    int err = 0;

    *data = NULL;
    *len = 0;
    pthread_mutex_lock(&s3->lock);
    struct object *object = object_find_locked(s3, key);
    if (object == NULL) {
        err = ENOENT;
    } else if ((*data = malloc(object->blob->size ? object->blob->size : 1))
               == NULL) {
        err = ENOMEM;
    } else {
        memcpy(*data, object->blob->bytes, (size_t)object->blob->size);
        *len = (size_t)object->blob->size;
        info_fill(object, info);
    }
    pthread_mutex_unlock(&s3->lock);
    return err;
}

bool fake_s3_holds(struct s3_client *s3, const char *key, const void *data,
                   size_t len)
{
    pthread_mutex_lock(&s3->lock);
    struct object *object = object_find_locked(s3, key);
    bool same = object != NULL && object->blob->size == len &&
                memcmp(object->blob->bytes, data, len) == 0;
    pthread_mutex_unlock(&s3->lock);
    return same;
}

int fake_s3_keys(struct s3_client *s3, const char *prefix, char ***keys,
                 size_t *count)
{
    size_t prefix_len = prefix != NULL ? strlen(prefix) : 0;
    int err = 0;

    *keys = NULL;
    *count = 0;
    pthread_mutex_lock(&s3->lock);
    char **list =
        calloc(s3->object_count ? s3->object_count : 1, sizeof(*list));
    size_t found = 0;
    if (list == NULL)
        err = ENOMEM;
    for (size_t i = 0; err == 0 && i < s3->object_count; i++) {
        const char *key = s3->objects[i]->key;
        if (prefix != NULL && strncmp(key, prefix, prefix_len) != 0)
            continue;
        if ((list[found] = strdup(key)) == NULL)
            err = ENOMEM;
        else
            found++;
    }
    pthread_mutex_unlock(&s3->lock);
    if (err != 0) {
        fake_s3_keys_free(list, found);
        return err;
    }
    *keys = list;
    *count = found;
    return 0;
}

void fake_s3_keys_free(char **keys, size_t count)
{
    for (size_t i = 0; keys != NULL && i < count; i++)
        free(keys[i]);
    free(keys);
}

unsigned fake_s3_uploads(struct s3_client *s3, const char *key)
{
    unsigned count = 0;

    pthread_mutex_lock(&s3->lock);
    for (struct upload *upload = s3->uploads; upload != NULL;
         upload = upload->next)
        if (key == NULL || strcmp(upload->key, key) == 0)
            count++;
    pthread_mutex_unlock(&s3->lock);
    return count;
}

/* ------------------------------------------------------------ holding */

int fake_s3_hold(struct s3_client *s3, const struct fake_s3_match *match,
                 unsigned *rule)
{
    struct rule *added = NULL;

    pthread_mutex_lock(&s3->lock);
    int err = rule_add_locked(s3, &s3->holds, match, &added);
    pthread_mutex_unlock(&s3->lock);
    *rule = err == 0 ? added->id : 0;
    return err;
}

static unsigned held_count_locked(struct s3_client *s3, unsigned rule)
{
    unsigned count = 0;

    for (struct held *held = s3->held; held != NULL; held = held->next)
        if (rule == 0 || held->rule == rule)
            count++;
    return count;
}

unsigned fake_s3_held(struct s3_client *s3, unsigned rule)
{
    pthread_mutex_lock(&s3->lock);
    unsigned count = held_count_locked(s3, rule);
    pthread_mutex_unlock(&s3->lock);
    return count;
}

int fake_s3_wait_held(struct s3_client *s3, unsigned rule, unsigned count)
{
    struct timespec until = wait_deadline();
    int err = 0;

    pthread_mutex_lock(&s3->lock);
    while (err == 0 && held_count_locked(s3, rule) < count)
        err = pthread_cond_timedwait(&s3->changed, &s3->lock, &until);
    pthread_mutex_unlock(&s3->lock);
    return err;
}

/* Take HELD off the list and let its request go on (lock held). */
static void release_locked(struct s3_client *s3, struct held *held)
{
    for (struct held **link = &s3->held; *link != NULL; link = &(*link)->next) {
        if (*link == held) {
            *link = held->next;
            break;
        }
    }
    held->released = true;
    pthread_cond_broadcast(&s3->changed);
}

int fake_s3_release(struct s3_client *s3, unsigned rule, bool newest,
                    uint64_t *seq)
{
    struct held *chosen = NULL;

    pthread_mutex_lock(&s3->lock);
    for (struct held *held = s3->held; held != NULL; held = held->next) {
        if (rule != 0 && held->rule != rule)
            continue;
        if (chosen == NULL || newest)
            chosen = held; /* (the list is in arrival order) */
        if (!newest)
            break;
    }
    if (chosen != NULL && seq != NULL)
        *seq = chosen->seq;
    if (chosen != NULL)
        release_locked(s3, chosen);
    pthread_mutex_unlock(&s3->lock);
    return chosen != NULL ? 0 : ENOENT;
}

void fake_s3_release_all(struct s3_client *s3, unsigned rule)
{
    pthread_mutex_lock(&s3->lock);
    struct held *held = s3->held;
    while (held != NULL) {
        struct held *next = held->next;
        if (rule == 0 || held->rule == rule)
            release_locked(s3, held);
        held = next;
    }
    pthread_mutex_unlock(&s3->lock);
}

void fake_s3_hold_clear(struct s3_client *s3, unsigned rule)
{
    pthread_mutex_lock(&s3->lock);
    rules_remove_locked(&s3->holds, rule);
    pthread_mutex_unlock(&s3->lock);
    fake_s3_release_all(s3, rule);
}

/* ------------------------------------------------------------ failing */

int fake_s3_fail(struct s3_client *s3, const struct fake_s3_match *match,
                 unsigned count, int err, bool lost, unsigned *rule)
{
    struct rule *added = NULL;

    pthread_mutex_lock(&s3->lock);
    int added_err = rule_add_locked(s3, &s3->fails, match, &added);
    if (added_err == 0) {
        added->left = count;
        added->err = err;
        added->lost = lost;
    }
    pthread_mutex_unlock(&s3->lock);
    if (rule != NULL)
        *rule = added_err == 0 ? added->id : 0;
    return added_err;
}

void fake_s3_fail_clear(struct s3_client *s3, unsigned rule)
{
    pthread_mutex_lock(&s3->lock);
    rules_remove_locked(&s3->fails, rule);
    pthread_mutex_unlock(&s3->lock);
}

/* ---------------------------------------------------------------- log */

size_t fake_s3_log_count(struct s3_client *s3)
{
    pthread_mutex_lock(&s3->lock);
    size_t count = s3->log_count;
    pthread_mutex_unlock(&s3->lock);
    return count;
}

int fake_s3_log_get(struct s3_client *s3, size_t index,
                    struct fake_s3_request *out)
{
    int err = ENOENT;

    pthread_mutex_lock(&s3->lock);
    if (index < s3->log_count) {
        *out = s3->log[index].request;
        err = 0;
    }
    pthread_mutex_unlock(&s3->lock);
    return err;
}

long fake_s3_log_find(struct s3_client *s3, size_t from,
                      const struct fake_s3_match *match)
{
    long found = -1;

    pthread_mutex_lock(&s3->lock);
    for (size_t i = from; i < s3->log_count && found < 0; i++)
        if (match_matches(match, &s3->log[i].request))
            found = (long)i;
    pthread_mutex_unlock(&s3->lock);
    return found;
}

static unsigned count_locked(struct s3_client *s3,
                             const struct fake_s3_match *match)
{
    unsigned count = 0;

    for (size_t i = 0; i < s3->log_count; i++)
        if (match_matches(match, &s3->log[i].request))
            count++;
    return count;
}

unsigned fake_s3_count(struct s3_client *s3, const struct fake_s3_match *match)
{
    pthread_mutex_lock(&s3->lock);
    unsigned count = count_locked(s3, match);
    pthread_mutex_unlock(&s3->lock);
    return count;
}

int fake_s3_wait_count(struct s3_client *s3, const struct fake_s3_match *match,
                       unsigned count)
{
    struct timespec until = wait_deadline();
    int err = 0;

    pthread_mutex_lock(&s3->lock);
    while (err == 0 && count_locked(s3, match) < count)
        err = pthread_cond_timedwait(&s3->changed, &s3->lock, &until);
    pthread_mutex_unlock(&s3->lock);
    return err;
}

int fake_s3_wait_idle(struct s3_client *s3)
{
    struct timespec until = wait_deadline();
    int err = 0;

    pthread_mutex_lock(&s3->lock);
    while (err == 0 && s3->under_way > 0)
        err = pthread_cond_timedwait(&s3->changed, &s3->lock, &until);
    pthread_mutex_unlock(&s3->lock);
    return err;
}

void fake_s3_log_clear(struct s3_client *s3)
{
    pthread_mutex_lock(&s3->lock);
    for (size_t i = 0; i < s3->log_count; i++) {
        free(s3->log[i].key);
        free(s3->log[i].source);
        free(s3->log[i].condition);
    }
    s3->log_count = 0;
    pthread_mutex_unlock(&s3->lock);
}
