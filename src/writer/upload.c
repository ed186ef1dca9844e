/*
 * upload.c - putting staged data into the bucket (see upload.h).
 *
 * A multipart upload (or multipart copy) is one struct upload_run on the
 * caller's stack and an array of parts. The caller submits parts to the
 * worker pool, at most CONF->parallel in flight, and sleeps on part_done
 * until a slot frees; each part job copies or uploads its range and
 * reports back. After the first failure no new part is submitted, the
 * ones in flight are waited for, and the upload is aborted.
 *
 * Locks: run.lock guards run.in_flight and run.first_err; part_done is
 * signalled whenever a part finishes. No lock is held during a request.
 * run.copy_refused is atomic: set once the server answered that it has
 * no UploadPartCopy, so later parts of that upload go straight to the fd.
 *
 * Swift's s3api answers 412 to x-amz-copy-source-if-match whenever the
 * source is itself a multipart object, although its ETag is the one asked
 * for (GET's If-Match works). So a 412 on a copy is checked with a HEAD:
 * if the source still has the expected ETag, run.if_match_ignored is set,
 * the parts are copied without the condition, and the source's ETag is
 * checked once more before the upload is completed.
 *
 * The base's range_unchanged() and materialize() callbacks are called
 * from worker threads, several at once.
 */
#include "config.h"

#include "writer/upload.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define MIB (1ull << 20)

/* Overridable at build time only to exercise multipart copies with small
 * objects (a test driver); the defaults are S3's limit and a part size
 * that keeps a 5 TiB copy within the part count in few requests. */
#ifndef UPLOAD_COPY_LIMIT
#define UPLOAD_COPY_LIMIT UPLOAD_MAX_COPY_SIZE
#endif
#ifndef UPLOAD_COPY_PART_SIZE
#define UPLOAD_COPY_PART_SIZE (512ull << 20)
#endif

struct upload_run;

struct upload_part {
    struct upload_run *run;
    unsigned number;            /* 1..UPLOAD_MAX_PARTS */
    uint64_t offset;
    uint64_t length;
    char etag[S3_ETAG_MAX];
};

struct upload_run {
    const struct upload_conf *conf;
    const char *key;
    const char *upload_id;
    int fd;                         /* -1: a pure server-side copy */
    const struct upload_base *base; /* NULL: every byte is in FD */
    const char *copy_key;           /* source of copied parts, or NULL */
    const char *copy_etag;
    uint64_t copy_size;             /* parts past this are never copied */
    _Atomic bool copy_refused;      /* the server has no UploadPartCopy */
    _Atomic bool if_match_ignored;  /* copies go without the ETag check */
    _Atomic unsigned copied_parts;  /* for the log line at the end */

    pthread_mutex_t lock;
    pthread_cond_t part_done;
    unsigned in_flight;
    int first_err;
};

uint64_t upload_part_size(uint64_t size, uint64_t min_part_size)
{
    uint64_t part = min_part_size < UPLOAD_MIN_PART_SIZE ? UPLOAD_MIN_PART_SIZE
                                                         : min_part_size;
    uint64_t needed = size / UPLOAD_MAX_PARTS + (size % UPLOAD_MAX_PARTS != 0);

    if (part < needed)
        part = (needed + MIB - 1) / MIB * MIB;
    return part;
}

/* --------------------------------------------------------------- parts */

/* 0 when the copy source still has the ETag expected, ESTALE when it
 * changed, or HEAD's errno. */
static int source_unchanged(struct upload_run *run)
{
    struct s3_object_info info;
    int err = s3_head_object(run->conf->s3, run->copy_key, &info);

    if (err == 0 && strcmp(info.etag, run->copy_etag) != 0)
        err = ESTALE;
    return err;
}

static int copy_part(struct upload_run *run, struct upload_part *part,
                     bool with_condition)
{
    return s3_multipart_copy_part(run->conf->s3, run->key, run->upload_id,
                                  part->number, run->copy_key,
                                  with_condition ? run->copy_etag : NULL,
                                  part->offset, part->length, part->etag);
}

/* Copy PART server-side if it may be: 0 when done, ENOSYS when it must be
 * uploaded from the fd instead, or the copy's errno. */
static int part_try_copy(struct upload_part *part)
{
    struct upload_run *run = part->run;
    const struct upload_base *base = run->base;
    int err;

    if (run->copy_key == NULL || atomic_load(&run->copy_refused) ||
        part->offset + part->length > run->copy_size)
        return ENOSYS;
    if (base != NULL &&
        !base->range_unchanged(base->arg, part->offset, part->length))
        return ENOSYS;
    bool with_condition = run->copy_etag != NULL &&
                          !atomic_load(&run->if_match_ignored);
    err = copy_part(run, part, with_condition);
    /* (once another part has proven the condition unusable, no HEAD) */
    if (err == ESTALE && with_condition &&
        (atomic_load(&run->if_match_ignored) || source_unchanged(run) == 0)) {
        if (!atomic_exchange(&run->if_match_ignored, true))
            log_info("upload %s: the server refuses the ETag condition on "
                     "copies from %s although its ETag is unchanged; copying "
                     "without it and checking the ETag before completing",
                     run->key, run->copy_key);
        err = copy_part(run, part, false);
    }
    if (err == ESTALE)
        log_warn("upload %s: %s is no longer version %s", run->key,
                 run->copy_key, run->copy_etag ? run->copy_etag : "(any)");
    if (err == 0) {
        atomic_fetch_add(&run->copied_parts, 1);
    } else if (err == ENOSYS && run->fd >= 0) {
        if (!atomic_exchange(&run->copy_refused, true))
            log_info("upload %s: the server cannot copy parts "
                     "(UploadPartCopy); sending unchanged parts instead",
                     run->key);
    }
    return err;
}

static int part_send(struct upload_part *part)
{
    struct upload_run *run = part->run;
    int err = part_try_copy(part);

    if (err != ENOSYS || run->fd < 0)
        return err;
    if (run->base != NULL) {
        err = run->base->materialize(run->base->arg, part->offset, part->length);
        if (err != 0) {
            log_warn("upload %s: cannot fetch bytes %llu-%llu of the original: "
                     "%s", run->key, (unsigned long long)part->offset,
                     (unsigned long long)(part->offset + part->length - 1),
                     strerror(err));
            return err;
        }
    }
    struct s3_body body = {
        .fd = run->fd, .offset = part->offset, .length = part->length,
    };
    return s3_multipart_upload_part(run->conf->s3, run->key, run->upload_id,
                                    part->number, &body, part->etag);
}

static void part_job(void *arg)
{
    struct upload_part *part = arg;
    struct upload_run *run = part->run;
    int err = 0;

    pthread_mutex_lock(&run->lock);
    bool skip = run->first_err != 0;    /* another part failed meanwhile */
    pthread_mutex_unlock(&run->lock);
    if (!skip)
        err = part_send(part);
    pthread_mutex_lock(&run->lock);
    if (err != 0 && run->first_err == 0)
        run->first_err = err;
    run->in_flight--;
    pthread_cond_signal(&run->part_done);
    pthread_mutex_unlock(&run->lock);
}

/*
 * Send the SIZE bytes of RUN as parts of PART_SIZE bytes, at most
 * conf->parallel at a time, then complete the upload into ETAG_OUT. On
 * any failure the upload is aborted. Returns 0 or the first errno.
 */
static int run_parts(struct upload_run *run, uint64_t size, uint64_t part_size,
                     char *etag_out)
{
    const struct upload_conf *conf = run->conf;
    unsigned parallel = conf->parallel > 0 ? conf->parallel : 1;
    uint64_t count64 = (size + part_size - 1) / part_size;
    struct upload_part *parts = NULL;
    const char **etags = NULL;
    unsigned count = 0;
    int err = 0;

    if (count64 == 0 || count64 > UPLOAD_MAX_PARTS) {
        err = EFBIG;
        goto out;
    }
    count = (unsigned)count64;
    parts = calloc(count, sizeof(*parts));
    etags = calloc(count, sizeof(*etags));
    if (parts == NULL || etags == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (unsigned i = 0; i < count; i++) {
        uint64_t offset = (uint64_t)i * part_size;
        parts[i] = (struct upload_part){
            .run = run, .number = i + 1, .offset = offset,
            .length = size - offset < part_size ? size - offset : part_size,
        };
        etags[i] = parts[i].etag;
    }

    pthread_mutex_lock(&run->lock);
    for (unsigned i = 0; i < count && run->first_err == 0; i++) {
        while (run->in_flight >= parallel && run->first_err == 0)
            pthread_cond_wait(&run->part_done, &run->lock);
        if (run->first_err != 0)
            break;
        run->in_flight++;
        pthread_mutex_unlock(&run->lock);
        err = workers_submit(conf->workers, part_job, &parts[i]);
        pthread_mutex_lock(&run->lock);
        if (err != 0) {
            run->in_flight--;
            if (run->first_err == 0)
                run->first_err = err;
        }
    }
    while (run->in_flight > 0)
        pthread_cond_wait(&run->part_done, &run->lock);
    err = run->first_err;
    pthread_mutex_unlock(&run->lock);

    if (err == 0 && atomic_load(&run->if_match_ignored)) {
        err = source_unchanged(run);
        if (err == ESTALE)
            log_warn("upload %s: %s changed while its parts were copied",
                     run->key, run->copy_key);
    }

    if (err == 0) {
        /* what the object must be, should the complete's answer be lost:
         * its bytes are all in the fd unless parts are copied */
        struct s3_body whole = {
            .fd = run->base == NULL && run->copy_key == NULL ? run->fd : -1,
            .length = size,
        };
        err = s3_multipart_complete_object(conf->s3, run->key, run->upload_id,
                                           etags, count, &whole, etag_out);
    }
out:
    if (err != 0)
        upload_abandon(conf, run->key, run->upload_id);
    else if (run->copy_key != NULL)
        log_debug("upload %s: %u of %u parts copied server-side", run->key,
                  atomic_load(&run->copied_parts), count);
    free(etags);
    free(parts);
    return err;
}

static void run_init(struct upload_run *run, const struct upload_conf *conf,
                     const char *key, const char *upload_id)
{
    memset(run, 0, sizeof(*run));
    run->conf = conf;
    run->key = key;
    run->upload_id = upload_id;
    run->fd = -1;
    atomic_init(&run->copy_refused, false);
    atomic_init(&run->if_match_ignored, false);
    atomic_init(&run->copied_parts, 0);
    pthread_mutex_init(&run->lock, NULL);
    pthread_cond_init(&run->part_done, NULL);
}

static void run_destroy(struct upload_run *run)
{
    pthread_cond_destroy(&run->part_done);
    pthread_mutex_destroy(&run->lock);
}

/* ------------------------------------------------------------- uploads */

static int upload_single(const struct upload_conf *conf,
                         const struct upload_request *req, char *etag_out)
{
    struct s3_body body = {.fd = req->fd, .offset = 0, .length = req->size};

    if (req->base != NULL && req->size > 0) {
        int err = req->base->materialize(req->base->arg, 0, req->size);
        if (err != 0) {
            log_warn("upload %s: cannot fetch the rest of the original: %s",
                     req->key, strerror(err));
            return err;
        }
    }
    return s3_put_object(conf->s3, req->key, &body, req->meta, etag_out);
}

int upload_file(const struct upload_conf *conf, const struct upload_request *req,
                char *etag_out)
{
    struct upload_run run;
    char *upload_id = NULL;
    int err;

    if (req->size <= conf->multipart_threshold)
        return upload_single(conf, req, etag_out);

    err = s3_multipart_create(conf->s3, req->key, req->meta, &upload_id);
    if (err != 0)
        return err;
    if (req->on_multipart != NULL) {
        err = req->on_multipart(req->arg, upload_id);
        if (err != 0) {
            upload_abandon(conf, req->key, upload_id);
            goto out;
        }
    }
    run_init(&run, conf, req->key, upload_id);
    run.fd = req->fd;
    run.base = req->base;
    if (req->base != NULL) {
        run.copy_key = req->base->key;
        run.copy_etag = req->base->etag;
        run.copy_size = req->base->size;
    }
    err = run_parts(&run, req->size,
                    upload_part_size(req->size, conf->part_size), etag_out);
    run_destroy(&run);
out:
    free(upload_id);
    return err;
}

/* Metadata of SRC_KEY as the s3fs headers a copy must carry (META_OUT
 * points into INFO). ESTALE when it is no longer the object expected. */
static int copy_meta_from_head(const struct upload_conf *conf,
                               const char *src_key, const char *src_etag,
                               uint64_t size, struct s3_object_info *info,
                               struct s3_put_meta *meta_out)
{
    int err = s3_head_object(conf->s3, src_key, info);

    if (err != 0)
        return err;
    if ((src_etag != NULL && strcmp(info->etag, src_etag) != 0) ||
        info->size != size)
        return ESTALE;
    *meta_out = (struct s3_put_meta){
        .content_type = info->content_type[0] ? info->content_type : NULL,
        .has_mode = info->has_mode, .mode = info->mode,
        .has_uid = info->has_uid, .uid = info->uid,
        .has_gid = info->has_gid, .gid = info->gid,
        .has_mtime = info->has_mtime, .mtime = info->mtime,
        .has_atime = info->has_atime, .atime = info->atime,
        .has_ctime = info->has_ctime, .ctime = info->ctime,
        .has_rdev = info->has_rdev, .rdev = info->rdev,
    };
    return 0;
}

/* Whether a copy whose result has ETag COPIED is of version SRC_ETAG, as
 * far as the ETags tell. A single-part ETag is the MD5 of the bytes, and so
 * is the copy's: they must be equal (a server that ignores the condition,
 * as s3rver does, is caught here). A multipart one ("...-N") says nothing
 * of the copy's, which is single-part: the server's check is all there is. */
static bool copy_matches(const char *src_etag, const char *copied)
{
    if (strchr(src_etag, '-') != NULL)
        return true;
    return strcmp(src_etag, copied) == 0;
}

/* One CopyObject of SRC_KEY, conditional on SRC_ETAG (see upload_copy). */
static int copy_single(const struct upload_conf *conf, const char *src_key,
                       const char *src_etag, const char *dst_key,
                       const struct s3_put_meta *meta, char *etag_out,
                       bool *same_version)
{
    struct s3_object_info info;
    char copied[S3_ETAG_MAX] = "";

    if (etag_out == NULL)
        etag_out = copied;
    *same_version = false;
    int err = s3_copy_object(conf->s3, src_key, src_etag, dst_key, meta,
                             etag_out);
    if (err != ESTALE || src_etag == NULL) {
        *same_version = err == 0 && src_etag != NULL &&
                        copy_matches(src_etag, etag_out);
        if (err == 0 && src_etag != NULL && !*same_version)
            log_info("copy %s -> %s: the copy is not version %s (the server "
                     "did not check it); what this mount cached of it is not "
                     "kept", src_key, dst_key, src_etag);
        return err;
    }
    /* 412: the source changed, or the server refuses the condition */
    err = s3_head_object(conf->s3, src_key, &info);
    if (err == 0 && strcmp(info.etag, src_etag) != 0)
        err = ESTALE;
    if (err != 0)
        return err;
    err = s3_copy_object(conf->s3, src_key, NULL, dst_key, meta, etag_out);
    if (err != 0)
        return err;
    /* the same version before and after the copy: the copy is of it
     * (unless it was replaced and put back in between, by a writer this
     * mount cannot see) */
    *same_version = s3_head_object(conf->s3, src_key, &info) == 0 &&
                    strcmp(info.etag, src_etag) == 0 &&
                    copy_matches(src_etag, etag_out);
    if (!*same_version)
        log_info("copy %s -> %s: the source changed meanwhile; what this "
                 "mount cached of it is not kept", src_key, dst_key);
    return 0;
}

int upload_copy(const struct upload_conf *conf, const char *src_key,
                const char *src_etag, uint64_t size, const char *dst_key,
                const struct s3_put_meta *meta, char *etag_out,
                bool *same_version)
{
    struct s3_object_info info;
    struct s3_put_meta head_meta;
    struct upload_run run;
    char *upload_id = NULL;
    bool same = false;
    int err;

    bool asked = src_etag != NULL;

    if (same_version == NULL)
        same_version = &same;
    *same_version = false;
    if (size <= UPLOAD_COPY_LIMIT)
        return copy_single(conf, src_key, src_etag, dst_key, meta, etag_out,
                           same_version);

    /* a multipart upload takes its metadata at creation */
    if (meta == NULL) {
        err = copy_meta_from_head(conf, src_key, src_etag, size, &info,
                                  &head_meta);
        if (err != 0)
            return err;
        meta = &head_meta;
        if (src_etag == NULL)
            src_etag = info.etag; /* the parts must all copy this version */
    }
    err = s3_multipart_create(conf->s3, dst_key, meta, &upload_id);
    if (err != 0)
        return err;
    run_init(&run, conf, dst_key, upload_id);
    run.copy_key = src_key;
    run.copy_etag = src_etag;
    run.copy_size = size;
    err = run_parts(&run, size, upload_part_size(size, UPLOAD_COPY_PART_SIZE),
                    etag_out);
    run_destroy(&run);
    free(upload_id);
    /* every part was copied from SRC_ETAG (checked per part, or by HEAD
     * before completing where the server refuses the condition) */
    *same_version = err == 0 && asked;
    return err;
}

int upload_abort(const struct upload_conf *conf, const char *key,
                 const char *upload_id)
{
    static atomic_bool told;
    int err = s3_multipart_abort(conf->s3, key, upload_id);

    if (err == ENOSYS) {
        if (!atomic_exchange(&told, true))
            log_info("the server cannot abort multipart uploads; "
                     "unfinished ones are left to its own clean-up");
        err = 0;
    }
    return err;
}

void upload_abandon(const struct upload_conf *conf, const char *key,
                    const char *upload_id)
{
    int err = upload_abort(conf, key, upload_id);

    if (err == 0)
        return;
    log_warn("upload %s: cannot abort the unfinished multipart upload: %s",
             key, strerror(err));
    if (conf->abort_failed != NULL)
        conf->abort_failed(conf->abort_failed_arg, key, upload_id);
}
