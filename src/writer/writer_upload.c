/*
 * writer_upload.c - uploading a file: one version at a time (so versions
 * of a file land in order), read from a sealed staging file while writes
 * go on in a copy; the end of a write-behind upload (default mode) or a
 * whole upload (upload.h); the callbacks to the fs layer; the background
 * uploader threads that take files from the queue.
 */
#include "config.h"

#include "writer/writer_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

/* A multipart upload started: journal its id, so that a crash leaves no
 * stale upload behind (the next mount aborts it and uploads the version
 * again; in the default mode the close under way had not returned, so
 * nobody was promised otherwise). */
static int on_multipart(void *arg, const char *upload_id)
{
    struct upload_context *context = arg;
    struct writer *writer = context->writer;
    struct writer_file *file = context->file;
    struct version promised;

    /* journaling an edit would fetch every byte it copies server-side;
     * in default mode nothing was promised yet, so it is not journaled
     * (a crash leaves this upload for the bucket's lifecycle rules) */
    pthread_mutex_lock(&writer->lock);
    bool skip = file->base_key != NULL && !writer->conf.writeback &&
                !has_promise(file);
    if (!skip) {
        promised = *context->version;
        hold_locked(promised.staging);
        begin_promising_locked(promised.staging, promised.size);
    }
    writer_unlock(writer);
    if (skip)
        return 0;
    int err = writer_promise(writer, file, &promised, upload_id);
    writer_staging_drop(writer, &promised.staging);
    return err;
}

static void fill_put_meta(const struct writer_meta *meta, struct s3_put_meta *out)
{
    *out = (struct s3_put_meta){
        .content_type = NULL,
        .has_mode = true,
        .has_uid = true,
        .has_gid = true,
        .has_mtime = true,
        .mode = meta->mode,
        .uid = meta->uid,
        .gid = meta->gid,
        .mtime = meta->mtime,
        .has_atime = meta->atime.tv_sec != 0 || meta->atime.tv_nsec != 0,
        .atime = meta->atime,
    };
}

/*
 * Complete write-behind upload *WBP of a file now SIZE bytes at KEY with
 * META (the writer is done with this version). If its mode or owner, or
 * its mtime explicitly, changed since the upload was created, the object
 * is copied onto itself with META. Otherwise the object carries no mtime
 * header and META->mtime becomes its Last-Modified time (one HEAD), so
 * that this mount shows what every other client sees.
 *
 * Returns 0 with the object's ETag in ETAG, or an errno. *FALL_BACK says
 * that the file is to be uploaded the usual way instead, now: the upload
 * does not fit (renamed meanwhile, too small now), it was lost on the
 * server (aborted by a lifecycle rule: ENOENT), or its metadata could not
 * be set afterwards (the data goes again, with the right headers).
 */
static int finish_writebehind(struct writer *writer, struct writebehind **wbp,
                              const char *key, uint64_t size,
                              struct writer_meta *meta,
                              const struct writer_meta *wb_meta, bool mtime_set,
                              char *etag, bool *fall_back)
{
    *fall_back = false;
    if (strcmp(writebehind_key(*wbp), key) != 0 ||
        size <= writer->conf.multipart_threshold) {
        writebehind_abandon(wbp);
        *fall_back = true;
        return 0;
    }
    int err = writebehind_finish(wbp, size, etag);
    if (err == ENOENT || err == EINVAL) {
        log_warn("upload %s: the multipart upload made while it was written "
                 "is gone from the server (%s); uploading it again",
                 key, strerror(err));
        *fall_back = true;
        return 0;
    }
    if (err != 0)
        return err;
    if (meta->mode != wb_meta->mode || meta->uid != wb_meta->uid ||
        meta->gid != wb_meta->gid || mtime_set ||
        meta->atime.tv_sec != wb_meta->atime.tv_sec) {
        struct s3_put_meta put_meta;
        char source_etag[S3_ETAG_MAX];
        fill_put_meta(meta, &put_meta);
        put_meta.has_mtime = mtime_set;
        snprintf(source_etag, sizeof(source_etag), "%s", etag);
        bool same = false;
        err = upload_copy(&writer->upload, key, source_etag, size, key,
                          &put_meta, etag, &same);
        if (err == 0 && !same)
            err = ESTALE; /* another client's object now: ours goes again */
        if (err != 0) {
            log_warn("upload %s: cannot set its metadata after the upload "
                     "(%s); uploading it again with it", key, strerror(err));
            *fall_back = true;
            return 0;
        }
        if (mtime_set)
            return 0;
    }
    /* the object's own time is its mtime (on AWS, a multipart object's
     * Last-Modified is when the upload was created) */
    struct s3_object_info info;
    if (s3_head_object(writer->conf.s3, key, &info) == 0 &&
        strcmp(info.etag, etag) == 0)
        meta->mtime = info.has_mtime ? info.mtime : info.last_modified;
    return 0;
}

/* One attempt of writer_upload_version(): the version taken and what it
 * is sent with. */
struct upload_attempt {
    struct version v;
    char *key;                    /* where it goes (a copy) */
    void *owner;
    char *base_key;               /* an edit's base, or NULL */
    char base_etag[S3_ETAG_MAX];
    uint64_t base_limit;
    struct writebehind *wb;       /* a write-behind upload to finish */
    struct writer_meta wb_meta;
    bool mtime_set;
    int unwritten;                /* a failed write's errno: the promise
                                     alone goes */
    char etag[S3_ETAG_MAX];       /* what the upload made */
};

/*
 * After the wait for what is under way (lock held): what may go of FILE
 * (see enum writer_upload_what), taken into ATTEMPT and marked as being
 * sent. False when there is nothing to send, with *ERR what the attempt
 * says (the lock still held).
 */
static bool attempt_take_locked(struct writer *writer, struct writer_file *file,
                                enum writer_upload_what what,
                                struct upload_attempt *attempt, int *err)
{
    bool promised_only = what == WRITER_UPLOAD_PROMISED;

    *err = 0;
    /* a background upload: what may go is what the file is now, after the
     * wait (opened and written meanwhile, its bytes were not closed) */
    if (what == WRITER_UPLOAD_CLOSED) {
        bool writing = file->open_writers > 0 && !writer->draining;
        if (writing && writer->conf.writeback && file->sync_wanted == 0)
            return false; /* (its last close queues it again) */
        promised_only = writing;
    }
    /* bytes a write failed to write: only the promise may go */
    attempt->unwritten = is_pending(file) ? file->unwritten_err : 0;
    if (attempt->unwritten != 0)
        promised_only = true;
    if (!is_pending(file) || (promised_only && !has_promise(file))) {
        *err = attempt->unwritten != 0 ? attempt->unwritten
               : file->unlinked || !file->failed || !is_pending(file)
                   ? 0 : file->last_error;
        /* an attempt that had nothing to send (a sync counts them) */
        file->attempts++;
        file->attempt_err = attempt->unwritten;
        writer_sync_touch_locked(writer, file);
        pthread_cond_broadcast(&writer->file_idle);
        return false;
    }
    attempt->wb_meta = file->wb_meta;
    if (promised_only) {
        attempt->v = (struct version){
            .staging = hold_locked(file->entry),
            .size = file->entry_size,
            .gen = file->entry_gen,
            .data_gen = file->entry_data_gen,
            .meta = file->entry_meta,
        };
        attempt->v.staging->upload_seal = attempt->v.size;
    } else {
        writer_version_take_locked(writer, file, true, &attempt->v);
        /* finished or abandoned by attempt_send(), whatever happens */
        attempt->wb = file->wb;
        file->wb = NULL;
        attempt->mtime_set = file->mtime_set;
    }
    file->sending = attempt->v.staging;
    attempt->key = strdup(file->key);
    attempt->owner = file->owner;
    if (file->base_key != NULL) {
        attempt->base_key = strdup(file->base_key);
        snprintf(attempt->base_etag, sizeof(attempt->base_etag), "%s",
                 file->base_etag);
        attempt->base_limit = file->base_limit;
    }
    return true;
}

/* The version sent (no lock held): a write-behind upload finished, or
 * one PUT or a multipart upload from the staging file. 0 or an errno. */
static int attempt_send(struct writer *writer, struct writer_file *file,
                        struct upload_attempt *attempt)
{
    struct version *v = &attempt->v;
    struct s3_put_meta put_meta;
    struct upload_context context = {writer, file, v};
    struct upload_base base = {
        .key = attempt->base_key,
        .etag = attempt->base_etag,
        .size = attempt->base_limit,
        .range_unchanged = writer_base_range_unchanged,
        .materialize = writer_base_materialize,
        .arg = &context,
    };
    struct upload_request request = {
        .key = attempt->key,
        .fd = v->staging->fd,
        .size = v->size,
        .meta = &put_meta,
        .base = attempt->base_key != NULL ? &base : NULL,
        .on_multipart = on_multipart,
        .arg = &context,
    };
    bool fall_back = true;
    int err = attempt->key == NULL ? ENOMEM : 0;

    fill_put_meta(&v->meta, &put_meta);
    if (err == 0 && attempt->wb != NULL)
        err = finish_writebehind(writer, &attempt->wb, attempt->key, v->size,
                                 &v->meta, &attempt->wb_meta, attempt->mtime_set,
                                 attempt->etag, &fall_back);
    writebehind_abandon(&attempt->wb); /* (on a failure before finishing) */
    if (err == 0 && fall_back)
        err = upload_file(&writer->upload, &request, attempt->etag);
    return err;
}

/* What the attempt (ERR) did, recorded in FILE (lock held); true when a
 * failed upload's version is to be promised now (it must survive a
 * crash). */
static bool attempt_record_locked(struct writer *writer, struct writer_file *file,
                                  struct upload_attempt *attempt, int err)
{
    struct version *v = &attempt->v;

    if (err != 0) {
        file->failed = true;
        file->last_error = err;
        writer->stats.upload_failures++;
        bool need_promise = !file->unlinked &&
                            !(has_promise(file) && file->entry_gen >= v->gen);
        if (need_promise)
            begin_promising_locked(v->staging, v->size);
        return need_promise;
    }
    if (v->gen > file->uploaded_gen)
        file->uploaded_gen = v->gen;
    file->uploaded = true;
    file->failed = false;
    file->retries = 0;
    snprintf(file->etag, sizeof(file->etag), "%s", attempt->etag);
    writer_rebase_locked(file, v, attempt->key, attempt->etag);
    writer->stats.uploads_completed++;
    if (!is_dirty(file)) {
        file->mtime_set = false;
        file->meta.mtime = v->meta.mtime; /* (the object's, after write-behind) */
    }
    return false;
}

/* Its consequences (no lock held): the journal entry it made needless
 * dropped, or the failed version promised and logged; the fs layer told
 * under the key it went to. */
static void attempt_tell(struct writer *writer, struct writer_file *file,
                         struct upload_attempt *attempt, int err,
                         bool need_promise)
{
    struct version *v = &attempt->v;

    if (err == 0) {
        writer_forget_entry(writer, file, v->gen);
        if (writer->conf.uploaded != NULL)
            writer->conf.uploaded(writer->conf.uploaded_arg, file,
                                  attempt->owner, attempt->key, attempt->etag,
                                  v->size, &v->meta);
        return;
    }
    log_error("upload of '%s' failed: %s; the data is kept in the cache "
              "directory and the upload will be retried",
              attempt->key != NULL ? attempt->key : "?", strerror(err));
    if (need_promise)
        writer_promise(writer, file, v, NULL);
    if (attempt->key != NULL && writer->conf.uploaded != NULL)
        writer->conf.uploaded(writer->conf.uploaded_arg, file, attempt->owner,
                              attempt->key, NULL, v->size, &v->meta);
}

int writer_upload_version(struct writer *writer, struct writer_file *file,
                          enum writer_upload_what what)
{
    struct upload_attempt attempt = {0};
    int err;

    pthread_mutex_lock(&writer->lock);
    /* (writes under way end first: one that fails leaves the data not to
     * be sent; a promise alone need not wait for them) */
    while (file->held || file->sending != NULL ||
           (what != WRITER_UPLOAD_PROMISED &&
            (file->active_writes > 0 || file->copying)))
        writer_wait(writer, &writer->file_idle);
    if (!attempt_take_locked(writer, file, what, &attempt, &err)) {
        writer_unlock(writer);
        return err;
    }
    writer_unlock(writer);

    err = attempt_send(writer, file, &attempt);
    /* the upload counts as under way (sending) until its consequences are
     * recorded: its journal entry, and the fs layer told under the key it
     * went to; a rename or unlink waiting for it comes after all of that
     * (else a late callback put the old name back in a listing) */
    pthread_mutex_lock(&writer->lock);
    bool need_promise = attempt_record_locked(writer, file, &attempt, err);
    writer_unlock(writer);
    attempt_tell(writer, file, &attempt, err, need_promise);

    pthread_mutex_lock(&writer->lock);
    file->sending = NULL;
    attempt.v.staging->upload_seal = 0;
    if (err != 0)
        writer_schedule_retry_locked(writer, file);
    else if (attempt.unwritten != 0 && is_pending(file))
        err = attempt.unwritten; /* its promise went, not its data */
    file->attempts++;
    file->attempt_err = err;
    writer_sync_touch_locked(writer, file);
    pthread_cond_broadcast(&writer->file_idle);
    writer_unlock(writer);
    writer_staging_drop(writer, &attempt.v.staging);
    free(attempt.base_key);
    free(attempt.key);
    return err;
}

void *writer_uploader_main(void *arg)
{
    struct writer *writer = arg;

    pthread_mutex_lock(&writer->lock);
    for (;;) {
        while (writer->queue_head == NULL && !writer->stopping)
            writer_wait(writer, &writer->work_queued);
        /* the first file that is due (retries wait longer than new ones) */
        double now = clock_monotonic_seconds(), first_due = 0;
        struct writer_file *file = NULL, *previous = NULL;
        for (struct writer_file *at = writer->queue_head, *before = NULL;
             at != NULL; before = at, at = at->queue_next) {
            if (at->due <= now || writer->stopping || writer->draining) {
                file = at;
                previous = before;
                break;
            }
            if (first_due == 0 || at->due < first_due)
                first_due = at->due;
        }
        if (file == NULL && writer->queue_head == NULL)
            break; /* stopping, nothing left */
        if (file == NULL) {
            double wait = first_due - now;
            struct timespec until = clock_monotonic_after(wait);
            writer_wait_until(writer, &writer->work_queued, &until);
            continue;
        }
        if (previous != NULL)
            previous->queue_next = file->queue_next;
        else
            writer->queue_head = file->queue_next;
        if (writer->queue_tail == file)
            writer->queue_tail = previous;
        file->queued = false;
        /* open for writing: in writeback mode its last close queues it
         * again (unless a sync waits for it: then its promise goes now);
         * in the default mode only what was promised goes (a retry), not
         * what is being written */
        bool writing = file->open_writers > 0 && !writer->draining;
        bool skip = writing && writer->conf.writeback && file->sync_wanted == 0;
        writer->running++;
        writer_unlock(writer);

        if (!skip)
            writer_upload_version(writer, file, WRITER_UPLOAD_CLOSED);
        writer_file_put(&file);

        pthread_mutex_lock(&writer->lock);
        writer->running--;
        pthread_cond_broadcast(&writer->upload_done);
    }
    writer_unlock(writer);
    return NULL;
}

void writer_start_writebehind(struct writer *writer, struct writer_file *file)
{
    struct writebehind *wb = NULL;
    struct s3_put_meta put_meta;
    struct journal_entry entry;
    struct staging_file *freed = NULL;

    pthread_mutex_lock(&writer->lock);
    struct writer_meta meta = file->meta;
    char *key = strdup(file->key);
    int fd = file->data->fd;
    writer_unlock(writer);

    fill_put_meta(&meta, &put_meta);
    put_meta.has_mtime = false; /* its Last-Modified is read back at the end */
    int err = key == NULL ? ENOMEM
                          : writebehind_start(&writer->upload, key, &put_meta,
                                              fd, &wb);
    char *upload_id = err == 0 ? strdup(writebehind_upload_id(wb)) : NULL;
    if (err == 0 && upload_id == NULL)
        err = ENOMEM;
    bool promised = false;
    if (err == 0) {
        pthread_mutex_lock(&writer->lock);
        writer_journal_begin_locked(writer, file);
        promised = has_promise(file);
        struct staging_file *named = promised ? file->entry : file->data;
        if (promised)
            writer_entry_of(named->id, key, file->entry_size, &file->entry_meta,
                            upload_id, false, &entry);
        else
            writer_entry_of(named->id, key, file->size, &meta, upload_id, true, &entry);
        uint64_t old_id = file->entry != NULL && file->entry != named
                              ? file->entry->id : 0;
        writer_unlock(writer);
        err = journal_update(writer->conf.journal, &entry, 1, &old_id,
                             old_id != 0);
        pthread_mutex_lock(&writer->lock);
        if (err == 0) {
            if (!promised && file->entry != file->data) {
                freed = unref_locked(file->entry);
                file->entry = hold_locked(file->data);
                file->entry_gen = 0;
                file->entry_unclosed = true;
            }
            free(file->entry_upload_id);
            file->entry_upload_id = upload_id;
            upload_id = NULL;
        }
        writer_journal_end_locked(writer, file);
        writer_unlock(writer);
        if (err != 0)
            writebehind_abandon(&wb);
    }
    if (err != 0)
        log_debug("'%s' is uploaded at close, not while it is written: %s",
                  file->key, strerror(err));

    pthread_mutex_lock(&writer->lock);
    file->wb_starting = false;
    file->wb = wb;
    file->wb_refused = wb == NULL;
    file->wb_meta = meta;
    uint64_t ready = file->seq_end;
    writer_unlock(writer);
    /* parts are read only from now on: every write that ends later tells
     * wb what it changed */
    if (wb != NULL)
        writebehind_wrote(wb, 0, 0, ready);
    writer_staging_free(writer, freed, false);
    free(upload_id);
    free(key);
}
