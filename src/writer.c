/*
 * writer.c - staged files, their uploads and the journal (see writer.h).
 *
 * State of a file, under the writer lock:
 *   gen           bumped by every change of data or metadata
 *   uploaded_gen  the gen now in the bucket (NEVER before a first upload
 *                 of a file that must be uploaded); dirty = the two differ
 *   queued        in the upload queue (the queue holds a reference)
 *   failed        the last upload failed (the data stays staged)
 *   journaled     the journal has an entry for it
 *   busy          an upload, rename, unlink or journal write is under way;
 *                 writes and other such operations wait (file_idle)
 *   active_writes writes and truncates running outside the lock; busy
 *                 operations wait for them to end (file_idle)
 * A file is pending when it is dirty and not unlinked. The fs layer keeps a
 * reference while a file is pending, so pending files live until uploaded.
 *
 * Write-behind (writebehind.h), in the default mode: a file that is not an
 * edit, written from its start past the multipart threshold (close() will
 * have to wait for its upload), gets a multipart upload (wb)
 * created by the write that crossed it; every write then tells it what
 * changed and how far the file is written contiguously from byte 0
 * (seq_end), and upload_now() finishes it instead of uploading the file.
 * Its upload id is journaled at once (an `unclosed` entry, or the
 * complete entry of a file closed before), so that a crash leaves no
 * multipart upload behind. The upload is created with the metadata of
 * that moment but without x-amz-meta-mtime (the object's Last-Modified,
 * read back once it is complete, becomes the file's mtime); if the mode,
 * owner or an explicit mtime changed meanwhile, the object is copied onto
 * itself with the new metadata once complete. A file renamed while its write-behind
 * upload is under way is first uploaded under its old name, then moved by
 * the caller as any uploaded object. (In writeback mode files are uploaded
 * after close, so that a file renamed before its upload, the usual fate of
 * a temporary name, is only ever sent under its final name.)
 *
 * Threads: `uploaders` background threads take files from the queue
 * (work_queued); writer_drain() waits on upload_done for the queue to
 * empty.
 */
#include "config.h"

#include "writer.h"

#include <dirent.h>
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

#include "log.h"
#include "upload.h"
#include "writebehind.h"

#define NEVER UINT64_MAX
#define GRANULE (1ull << 20)        /* unit of fetching an edited object */
#define RUN_MAX 64                  /* granules fetched in one go */
#define RESERVE_STEP (8ull << 20)   /* disk checked per 8 MiB of growth */
#define MAX_FILE_SIZE (5ull << 40)  /* S3's largest object */
#define SETTLE_SECONDS 0.2          /* writeback: wait this long after the
                                       last close before uploading, so a
                                       file reopened at once (the Hugging
                                       Face hub appends in a second open)
                                       is uploaded once */

struct writer_file {
    struct writer *writer;
    uint64_t id;                  /* staging file name */
    int fd;
    void *owner;
    unsigned refs;
    char *key;
    uint64_t size;
    uint64_t reserved;            /* disk space checked up to here */
    struct writer_meta meta;
    uint64_t gen, uploaded_gen;
    bool queued, failed, journaled, unlinked, busy, uploaded;
    unsigned active_writes;
    unsigned open_writers;        /* handles open for writing */
    double due;                   /* writeback: upload not before (monotonic) */
    int last_error;
    char etag[S3_ETAG_MAX];
    /* an edit of an object in the bucket (the base): its bytes are fetched
     * a granule at a time when needed, and never-written ranges are copied
     * server-side on upload */
    char *base_key;               /* NULL: not an edit */
    char base_etag[S3_ETAG_MAX];
    uint64_t base_size;           /* the base object's size */
    uint64_t base_limit;          /* bytes still the base's (truncates cut it) */
    uint64_t granules;            /* base granules tracked */
    unsigned char *present;       /* (W) per granule: data in the staging file */
    unsigned char *loading;       /* (W) per granule: being fetched */
    unsigned char *written;       /* (W) per granule: changed since staged */
    uint64_t missing;             /* (W) granules not present */
    /* write-behind (see the top of this file) */
    struct writebehind *wb;
    uint64_t seq_end;             /* bytes written contiguously from 0 */
    bool wb_starting;             /* a write is creating wb */
    bool wb_refused;              /* creating it failed: not again */
    bool wb_journaled;            /* an unclosed journal entry names wb */
    bool mtime_set;               /* mtime set explicitly since the last write */
    struct writer_meta wb_meta;   /* the metadata wb was created with */
    uint64_t journaled_size;      /* the journal entry's, when journaled */
    struct writer_meta journaled_meta;
    struct writer_file *queue_next;
    struct writer_file *all_prev, *all_next;
};

struct writer {
    struct writer_conf conf;
    struct upload_conf upload;
    char *staging_dir;
    int staging_dir_fd;           /* fsynced so new staging files persist */
    pthread_mutex_t lock;
    pthread_cond_t file_idle;     /* a file stopped being busy or written */
    pthread_cond_t work_queued;   /* the queue got a file, or stopping */
    pthread_cond_t upload_done;   /* a background upload ended */
    struct writer_file *queue_head, *queue_tail;
    struct writer_file *all;      /* every file (no reference) */
    pthread_t *threads;
    unsigned thread_count;
    unsigned running;             /* background uploads under way */
    bool stopping;
    bool draining;                /* upload everything now */
    struct writer_stats stats;
};

static double monotonic_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static bool is_dirty(const struct writer_file *file)
{
    return file->gen != file->uploaded_gen;
}

static bool is_pending(const struct writer_file *file)
{
    return is_dirty(file) && !file->unlinked;
}

static void staging_path(const struct writer *writer, uint64_t id, char *out,
                         size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64, writer->staging_dir, id);
}

static bool bit_get(const unsigned char *bits, uint64_t i)
{
    return (bits[i / 8] >> (i % 8)) & 1;
}

static void bit_set(unsigned char *bits, uint64_t i, bool value)
{
    if (value)
        bits[i / 8] |= (unsigned char)(1u << (i % 8));
    else
        bits[i / 8] &= (unsigned char)~(1u << (i % 8));
}

/*
 * Make the base's bytes of [OFFSET, OFFSET + LEN) present in the staging
 * file, fetching the granules that are not (runs of them in one fetch).
 * With COVERED, granules the range covers entirely are only marked
 * present: the caller is about to write all of them. Threads needing the
 * same granule share the work: one fetches, the others wait (file_idle).
 */
static int make_present(struct writer *writer, struct writer_file *file,
                        uint64_t offset, uint64_t len, bool covered)
{
    int err = 0;

    if (file->base_key == NULL || len == 0)
        return 0;
    uint64_t end = offset + len;
    pthread_mutex_lock(&writer->lock);
    uint64_t g = offset / GRANULE;
    while (err == 0 && g < file->granules && g * GRANULE < end) {
        uint64_t start = g * GRANULE;
        if (bit_get(file->loading, g)) {
            pthread_cond_wait(&writer->file_idle, &writer->lock);
            continue; /* look again */
        }
        if (bit_get(file->present, g) || start >= file->base_limit) {
            /* there, or nothing of the base left */
            if (!bit_get(file->present, g)) {
                bit_set(file->present, g, true);
                file->missing--;
            }
            g++;
            continue;
        }
        if (covered && offset <= start && end >= start + GRANULE) {
            /* all of it is about to be overwritten: claimed (loading) so
             * that nobody fetches it meanwhile; the writer settles it
             * (settle_covered) */
            bit_set(file->loading, g, true);
            g++;
            continue;
        }
        /* a run of granules to fetch, up to the end of the range */
        uint64_t first = g;
        while (g < file->granules && g * GRANULE < end && g - first < RUN_MAX &&
               g * GRANULE < file->base_limit && !bit_get(file->present, g) &&
               !bit_get(file->loading, g) &&
               !(covered && offset <= g * GRANULE && end >= (g + 1) * GRANULE)) {
            bit_set(file->loading, g, true);
            g++;
        }
        uint64_t stop = g * GRANULE < file->base_limit ? g * GRANULE : file->base_limit;
        char *key = strdup(file->base_key);
        char etag[S3_ETAG_MAX];
        snprintf(etag, sizeof(etag), "%s", file->base_etag);
        uint64_t base_size = file->base_size;
        pthread_mutex_unlock(&writer->lock);

        err = key == NULL ? ENOMEM
            : writer->conf.fetch_base(writer->conf.fetch_arg, key, etag, base_size,
                                      start, stop - start, file->fd);
        free(key);

        pthread_mutex_lock(&writer->lock);
        for (uint64_t k = first; k < g; k++) {
            bit_set(file->loading, k, false);
            if (err == 0) {
                bit_set(file->present, k, true);
                file->missing--;
            }
        }
        pthread_cond_broadcast(&writer->file_idle);
    }
    pthread_mutex_unlock(&writer->lock);
    return err;
}

/* After a write of [OFFSET, OFFSET + LEN) whose first WRITTEN bytes
 * landed: the granules it claimed whole are present if they were written
 * whole, else fetched again when needed. Lock held. */
static void settle_covered_locked(struct writer *writer, struct writer_file *file,
                                  uint64_t offset, uint64_t len, uint64_t written)
{
    if (file->base_key == NULL || len == 0)
        return;
    for (uint64_t g = (offset + GRANULE - 1) / GRANULE;
         g < file->granules && (g + 1) * GRANULE <= offset + len; g++) {
        if (!bit_get(file->loading, g))
            continue;
        bit_set(file->loading, g, false);
        if ((g + 1) * GRANULE <= offset + written) {
            bit_set(file->present, g, true);
            file->missing--;
        }
    }
    pthread_cond_broadcast(&writer->file_idle);
}

/* Mark the granules of [OFFSET, OFFSET + LEN) as changed. Lock held. */
static void mark_written_locked(struct writer_file *file, uint64_t offset,
                                uint64_t len)
{
    if (file->base_key == NULL || len == 0)
        return;
    for (uint64_t g = offset / GRANULE; g < file->granules &&
                                        g * GRANULE < offset + len; g++)
        bit_set(file->written, g, true);
}

static void now_wall(struct timespec *out)
{
    clock_gettime(CLOCK_REALTIME, out);
}

/* Wait until FILE may be changed (not busy, no write under way). Lock held. */
static void wait_idle_locked(struct writer *writer, struct writer_file *file)
{
    while (file->busy || file->active_writes > 0)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
}

static void end_busy(struct writer *writer, struct writer_file *file)
{
    pthread_mutex_lock(&writer->lock);
    file->busy = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
}

/* Queue FILE for a background upload (a reference goes with it). Lock held. */
static void enqueue_locked(struct writer *writer, struct writer_file *file)
{
    if (file->queued)
        return;
    file->queued = true;
    file->due = monotonic_now() + SETTLE_SECONDS;
    file->refs++;
    file->queue_next = NULL;
    if (writer->queue_tail != NULL)
        writer->queue_tail->queue_next = file;
    else
        writer->queue_head = file;
    writer->queue_tail = file;
    pthread_cond_signal(&writer->work_queued);
}

/* ------------------------------------------------------------- journal */

static void journal_entry_of(const struct writer_file *file, const char *key,
                             uint64_t size, const struct writer_meta *meta,
                             const char *upload_id, struct journal_entry *out)
{
    *out = (struct journal_entry){
        .id = file->id,
        .key = key,
        .size = size,
        .mode = meta->mode,
        .uid = meta->uid,
        .gid = meta->gid,
        .mtime = meta->mtime,
        .upload_id = upload_id,
    };
}

/* Make FILE's staged data durable and journal it (FILE is busy, so its
 * fields do not change; they are read under the lock all the same). */
static int journal_file(struct writer *writer, struct writer_file *file,
                        const char *upload_id)
{
    struct journal_entry entry;
    struct writer_meta meta;
    uint64_t size;
    char *key;

    /* the journal must name complete data: fetch what an edit lacks */
    pthread_mutex_lock(&writer->lock);
    uint64_t whole = file->size;
    pthread_mutex_unlock(&writer->lock);
    int fetched = make_present(writer, file, 0, whole, false);
    if (fetched != 0) {
        log_error("cannot stage all of '%s' for the journal: %s", file->key,
                  strerror(fetched));
        return fetched;
    }
    if (fsync(file->fd) != 0 ||
        (writer->staging_dir_fd >= 0 && fsync(writer->staging_dir_fd) != 0)) {
        int err = errno;
        log_error("staging file of '%s': fsync: %s", file->key, strerror(err));
        return err == ENOSPC ? ENOSPC : EIO;
    }
    pthread_mutex_lock(&writer->lock);
    key = strdup(file->key);
    size = file->size;
    meta = file->meta;
    /* a write-behind upload under way is named, to be aborted after a
     * crash (the next mount uploads the staged file whole) */
    if (upload_id == NULL && file->wb != NULL)
        upload_id = writebehind_upload_id(file->wb);
    pthread_mutex_unlock(&writer->lock);
    if (key == NULL)
        return ENOMEM;
    journal_entry_of(file, key, size, &meta, upload_id, &entry);
    int err = journal_put(writer->conf.journal, &entry);
    if (err == 0) {
        pthread_mutex_lock(&writer->lock);
        file->journaled = true;
        file->wb_journaled = false; /* the entry is complete now */
        file->journaled_size = size;
        file->journaled_meta = meta;
        pthread_mutex_unlock(&writer->lock);
    } else {
        log_error("cannot journal the upload of '%s': %s", key, strerror(err));
    }
    free(key);
    return err;
}

struct upload_context {
    struct writer *writer;
    struct writer_file *file;
};

/* A multipart upload started: journal its id, so that a crash leaves no
 * stale upload behind (the next mount aborts it). */
static int on_multipart(void *arg, const char *upload_id)
{
    struct upload_context *context = arg;
    /* journaling an edit would fetch every byte it copies server-side;
     * in default mode nothing was promised yet, so it is not journaled
     * (a crash leaves this upload for the bucket's lifecycle rules) */
    if (context->file->base_key != NULL && !context->writer->conf.writeback &&
        !context->file->journaled)
        return 0;
    return journal_file(context->writer, context->file, upload_id);
}

static bool base_range_unchanged(void *arg, uint64_t offset, uint64_t length)
{
    struct upload_context *context = arg;
    struct writer_file *file = context->file;

    pthread_mutex_lock(&context->writer->lock);
    /* past the granules tracked (a grown file) nothing is known unchanged */
    bool unchanged = offset + length <= file->base_limit &&
                     offset + length <= file->granules * GRANULE;
    for (uint64_t g = offset / GRANULE; unchanged && g < file->granules &&
                                        g * GRANULE < offset + length; g++)
        unchanged = !bit_get(file->written, g);
    pthread_mutex_unlock(&context->writer->lock);
    return unchanged;
}

static int base_materialize(void *arg, uint64_t offset, uint64_t length)
{
    struct upload_context *context = arg;
    return make_present(context->writer, context->file, offset, length, false);
}

/* ------------------------------------------------------------- uploads */

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
    };
}

/*
 * Complete write-behind upload *WBP of a file now SIZE bytes at KEY with
 * META (the writer is done: FILE is busy). If its mode or owner, or its
 * mtime explicitly, changed since the upload was created, the object is
 * copied onto itself with META. Otherwise the object carries no mtime
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
        meta->gid != wb_meta->gid || mtime_set) {
        struct s3_put_meta put_meta;
        char source_etag[S3_ETAG_MAX];
        fill_put_meta(meta, &put_meta);
        put_meta.has_mtime = mtime_set;
        snprintf(source_etag, sizeof(source_etag), "%s", etag);
        err = upload_copy(&writer->upload, key, source_etag, size, key,
                          &put_meta, etag);
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

/*
 * Upload FILE if it is dirty, in this thread. Returns 0 when the file is
 * in the bucket (now or already), else the upload's errno (the file stays
 * pending, journaled).
 */
static int upload_now(struct writer *writer, struct writer_file *file)
{
    struct writer_meta meta;
    struct s3_put_meta put_meta;
    char etag[S3_ETAG_MAX] = "";
    uint64_t gen, size;
    char *key;
    int err;

    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    if (!is_pending(file)) {
        err = file->unlinked || !file->failed ? 0 : file->last_error;
        pthread_mutex_unlock(&writer->lock);
        return err;
    }
    file->busy = true;
    gen = file->gen;
    size = file->size;
    meta = file->meta;
    key = strdup(file->key);
    void *owner = file->owner;
    struct writebehind *wb = file->wb;
    struct writer_meta wb_meta = file->wb_meta;
    bool mtime_set = file->mtime_set;
    bool wb_journaled = file->wb_journaled;
    /* finished or abandoned below, whatever happens; its unclosed entry
     * is deleted (uploaded) or replaced by a complete one (failed) */
    file->wb = NULL;
    file->wb_journaled = false;
    pthread_mutex_unlock(&writer->lock);
    if (key == NULL) {
        writebehind_abandon(&wb);
        end_busy(writer, file);
        return ENOMEM;
    }

    struct upload_context context = {writer, file};
    struct upload_base base = {
        .key = file->base_key,
        .etag = file->base_etag,
        .size = file->base_limit,
        .range_unchanged = base_range_unchanged,
        .materialize = base_materialize,
        .arg = &context,
    };
    struct upload_request request = {
        .key = key,
        .fd = file->fd,
        .size = size,
        .meta = &put_meta,
        .base = file->base_key != NULL ? &base : NULL,
        .on_multipart = on_multipart,
        .arg = &context,
    };
    fill_put_meta(&meta, &put_meta);
    bool fall_back = true;
    err = 0;
    if (wb != NULL)
        err = finish_writebehind(writer, &wb, key, size, &meta, &wb_meta,
                                 mtime_set, etag, &fall_back);
    if (fall_back)
        err = upload_file(&writer->upload, &request, etag);

    bool forget = false, remember = false;
    pthread_mutex_lock(&writer->lock);
    if (err == 0) {
        file->uploaded_gen = gen;
        file->uploaded = true;
        file->failed = false;
        snprintf(file->etag, sizeof(file->etag), "%s", etag);
        if (file->base_key != NULL) {
            /* the uploaded object is the base of what comes next: what is
             * not fetched yet is its bytes now */
            char *base_key = strdup(key);
            if (base_key != NULL) {
                free(file->base_key);
                file->base_key = base_key;
                snprintf(file->base_etag, sizeof(file->base_etag), "%s", etag);
                file->base_size = size;
                file->base_limit = size;
                memset(file->written, 0, (size_t)((file->granules + 7) / 8));
            }
        }
        writer->stats.uploads_completed++;
        forget = (file->journaled || wb_journaled) && !is_dirty(file);
        file->mtime_set = false;
        file->meta.mtime = meta.mtime; /* (the object's, after write-behind) */
    } else {
        file->failed = true;
        file->last_error = err;
        writer->stats.upload_failures++;
        remember = !file->journaled;
    }
    pthread_mutex_unlock(&writer->lock);

    if (err != 0) {
        log_error("upload of '%s' failed: %s; the data is kept in the cache "
                  "directory and the upload will be retried", key, strerror(err));
        /* a failed upload must survive a crash: journal it */
        if (remember)
            journal_file(writer, file, NULL);
    } else if (forget) {
        int del = journal_del(writer->conf.journal, file->id);
        if (del == 0) {
            pthread_mutex_lock(&writer->lock);
            file->journaled = false;
            pthread_mutex_unlock(&writer->lock);
        } else {
            log_warn("'%s' is in the bucket but stays in the journal (%s): "
                     "the next mount uploads it again", key, strerror(del));
        }
    }
    end_busy(writer, file);
    if (err == 0 && writer->conf.uploaded != NULL)
        writer->conf.uploaded(writer->conf.uploaded_arg, file, owner, key,
                              etag, size, &meta);
    free(key);
    return err;
}

static void *uploader_main(void *arg)
{
    struct writer *writer = arg;

    pthread_mutex_lock(&writer->lock);
    for (;;) {
        while (writer->queue_head == NULL && !writer->stopping)
            pthread_cond_wait(&writer->work_queued, &writer->lock);
        struct writer_file *file = writer->queue_head;
        if (file == NULL)
            break; /* stopping, nothing left */
        double wait = file->due - monotonic_now();
        if (wait > 0 && !writer->stopping && !writer->draining) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += (time_t)wait;
            until.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&writer->work_queued, &writer->lock, &until);
            continue;
        }
        writer->queue_head = file->queue_next;
        if (writer->queue_head == NULL)
            writer->queue_tail = NULL;
        file->queued = false;
        /* reopened for writing meanwhile: its last close queues it again */
        bool skip = file->open_writers > 0 && !writer->draining;
        writer->running++;
        pthread_mutex_unlock(&writer->lock);

        if (!skip)
            upload_now(writer, file);
        writer_file_put(&file);

        pthread_mutex_lock(&writer->lock);
        writer->running--;
        pthread_cond_broadcast(&writer->upload_done);
    }
    pthread_mutex_unlock(&writer->lock);
    return NULL;
}

/* ------------------------------------------------------------- files */

static int file_new(struct writer *writer, uint64_t id, int fd, const char *key,
                    const struct writer_meta *meta, void *owner,
                    struct writer_file **out)
{
    struct writer_file *file = calloc(1, sizeof(*file));

    if (file == NULL || (file->key = strdup(key)) == NULL) {
        free(file);
        return ENOMEM;
    }
    file->writer = writer;
    file->id = id;
    file->fd = fd;
    file->owner = owner;
    file->refs = 1;
    file->meta = *meta;
    pthread_mutex_lock(&writer->lock);
    file->all_next = writer->all;
    if (writer->all != NULL)
        writer->all->all_prev = file;
    writer->all = file;
    pthread_mutex_unlock(&writer->lock);
    *out = file;
    return 0;
}

int writer_file_create(struct writer *writer, const char *key,
                       const struct writer_meta *meta, bool dirty, void *owner,
                       struct writer_file **out)
{
    char path[PATH_MAX];
    uint64_t id = journal_next_id(writer->conf.journal);
    int err;

    *out = NULL;
    staging_path(writer, id, path, sizeof(path));
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        log_error("cannot create staging file %s: %s", path, strerror(err));
        return err == ENOSPC || err == EDQUOT ? ENOSPC : EIO;
    }
    err = file_new(writer, id, fd, key, meta, owner, out);
    if (err != 0) {
        close(fd);
        unlink(path);
        return err;
    }
    (*out)->gen = dirty ? 1 : 0;
    (*out)->uploaded_gen = 0;
    return 0;
}

int writer_file_create_edit(struct writer *writer, const char *key,
                            const struct writer_meta *meta, const char *etag,
                            uint64_t size, void *owner, struct writer_file **out)
{
    struct writer_file *file = NULL;
    int err = writer_file_create(writer, key, meta, false, owner, &file);

    *out = NULL;
    if (err != 0)
        return err;
    uint64_t granules = (size + GRANULE - 1) / GRANULE;
    size_t bytes = (size_t)((granules + 7) / 8);
    file->base_key = strdup(key);
    file->present = calloc(bytes ? bytes : 1, 1);
    file->loading = calloc(bytes ? bytes : 1, 1);
    file->written = calloc(bytes ? bytes : 1, 1);
    if (file->base_key == NULL || file->present == NULL || file->loading == NULL ||
        file->written == NULL)
        err = ENOMEM;
    else if (ftruncate(file->fd, (off_t)size) != 0)
        err = errno == ENOSPC || errno == EDQUOT ? ENOSPC : EIO;
    if (err != 0) {
        writer_file_put(&file);
        return err;
    }
    snprintf(file->base_etag, sizeof(file->base_etag), "%s", etag);
    file->base_size = size;
    file->base_limit = size;
    file->reserved = size; /* fetched bytes are not checked for room */
    file->granules = granules;
    file->missing = granules;
    file->size = size;
    *out = file;
    return 0;
}

struct writer_file *writer_file_ref(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    file->refs++;
    pthread_mutex_unlock(&file->writer->lock);
    return file;
}

void writer_file_put(struct writer_file **filep)
{
    struct writer_file *file = *filep;
    char path[PATH_MAX];

    if (file == NULL)
        return;
    *filep = NULL;
    struct writer *writer = file->writer;
    pthread_mutex_lock(&writer->lock);
    if (--file->refs > 0) {
        pthread_mutex_unlock(&writer->lock);
        return;
    }
    if (file->all_prev != NULL)
        file->all_prev->all_next = file->all_next;
    else
        writer->all = file->all_next;
    if (file->all_next != NULL)
        file->all_next->all_prev = file->all_prev;
    bool pending = is_pending(file);
    bool adopt = !pending && !file->unlinked && file->uploaded &&
                 file->uploaded_gen == file->gen && file->missing == 0;
    pthread_mutex_unlock(&writer->lock);

    /* (a write-behind upload left only on a file never uploaded: gone) */
    writebehind_abandon(&file->wb);
    staging_path(writer, file->id, path, sizeof(path));
    close(file->fd);
    if (pending) {
        /* cannot happen while the fs layer keeps pending files; the data
         * stays for the next mount all the same */
        log_warn("'%s' is not uploaded yet; its staged data is kept", file->key);
    } else if (!adopt ||
               cache_adopt_file(writer->conf.cache, file->key, file->etag,
                                file->size, path) != 0) {
        unlink(path);
    }
    free(file->key);
    free(file->base_key);
    free(file->present);
    free(file->loading);
    free(file->written);
    free(file);
}

/* Begin a change that grows the file to END: wait until it may change,
 * check the disk has room. Returns with active_writes taken, or an errno. */
static int begin_change(struct writer *writer, struct writer_file *file,
                        uint64_t end)
{
    if (end > MAX_FILE_SIZE)
        return EFBIG;
    pthread_mutex_lock(&writer->lock);
    while (file->busy)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    file->active_writes++;
    uint64_t reserved = file->reserved;
    pthread_mutex_unlock(&writer->lock);
    if (end > reserved) {
        uint64_t step = end - reserved > RESERVE_STEP ? end - reserved : RESERVE_STEP;
        int err = cache_reserve_disk(writer->conf.cache, step);
        pthread_mutex_lock(&writer->lock);
        if (err == 0 && reserved + step > file->reserved)
            file->reserved = reserved + step;
        if (err != 0) {
            file->active_writes--;
            pthread_cond_broadcast(&writer->file_idle);
        }
        pthread_mutex_unlock(&writer->lock);
        if (err != 0)
            return err;
    }
    return 0;
}

static void end_change(struct writer *writer, struct writer_file *file,
                       bool changed, uint64_t new_size, bool set_size,
                       uint64_t written)
{
    pthread_mutex_lock(&writer->lock);
    file->active_writes--;
    if (changed) {
        if (set_size)
            file->size = new_size;
        else if (new_size > file->size)
            file->size = new_size;
        file->gen++;
        now_wall(&file->meta.mtime);
        file->mtime_set = false;
        writer->stats.bytes_written += written;
    }
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
}

/*
 * Create FILE's write-behind upload: a write (still under way, so the
 * file is neither busy nor renamed meanwhile) took it past the multipart
 * threshold from its start. On failure the file is uploaded the usual way
 * at close.
 */
static void start_writebehind(struct writer *writer, struct writer_file *file)
{
    struct writebehind *wb = NULL;
    struct s3_put_meta put_meta;
    struct journal_entry entry;

    pthread_mutex_lock(&writer->lock);
    struct writer_meta meta = file->meta;
    char *key = strdup(file->key);
    uint64_t size = file->size;
    bool journaled = file->journaled;
    uint64_t journaled_size = file->journaled_size;
    struct writer_meta journaled_meta = file->journaled_meta;
    pthread_mutex_unlock(&writer->lock);

    fill_put_meta(&meta, &put_meta);
    put_meta.has_mtime = false; /* its Last-Modified is read back at the end */
    int err = key == NULL ? ENOMEM
                          : writebehind_start(&writer->upload, key, &put_meta,
                                              file->fd, &wb);
    if (err == 0) {
        /* never closed: a crash aborts the upload and drops the data; closed
         * before (journaled): the same entry, now naming the upload */
        journal_entry_of(file, key, journaled ? journaled_size : size,
                         journaled ? &journaled_meta : &meta,
                         writebehind_upload_id(wb), &entry);
        entry.unclosed = !journaled;
        err = journal_put(writer->conf.journal, &entry);
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
    file->wb_journaled = wb != NULL && !journaled;
    file->wb_meta = meta;
    uint64_t ready = file->seq_end;
    pthread_mutex_unlock(&writer->lock);
    /* parts are read only from now on: every write that ends later tells
     * wb what it changed */
    if (wb != NULL)
        writebehind_wrote(wb, 0, 0, ready);
    free(key);
}

int writer_file_write(struct writer_file *file, uint64_t offset, const void *data,
                      size_t len)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, offset + len);
    const char *at = data;
    uint64_t pos = offset;
    size_t left = len;

    if (err != 0)
        return err;
    /* an edit: the base's bytes around the written range first */
    err = make_present(writer, file, offset, len, true);
    if (err != 0) {
        pthread_mutex_lock(&writer->lock);
        settle_covered_locked(writer, file, offset, len, 0);
        pthread_mutex_unlock(&writer->lock);
        end_change(writer, file, false, 0, false, 0);
        return err;
    }
    pthread_mutex_lock(&writer->lock);
    mark_written_locked(file, offset, len);
    pthread_mutex_unlock(&writer->lock);
    while (left > 0) {
        ssize_t done = pwrite(file->fd, at, left, (off_t)pos);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0) {
            err = done < 0 && (errno == ENOSPC || errno == EDQUOT) ? ENOSPC : EIO;
            if (err == EIO)
                log_error("staging file of '%s': write: %s", file->key,
                          strerror(errno));
            break;
        }
        at += done;
        pos += (uint64_t)done;
        left -= (size_t)done;
    }
    pthread_mutex_lock(&writer->lock);
    settle_covered_locked(writer, file, offset, len, pos - offset);
    if (pos > offset && offset <= file->seq_end && pos > file->seq_end)
        file->seq_end = pos;
    struct writebehind *wb = file->wb;
    uint64_t ready = file->seq_end;
    bool start = pos > offset && wb == NULL && !writer->conf.writeback &&
                 !file->wb_starting &&
                 !file->wb_refused && file->present == NULL && !file->unlinked &&
                 ready > writer->conf.multipart_threshold;
    if (start)
        file->wb_starting = true;
    pthread_mutex_unlock(&writer->lock);
    /* (wb cannot be finished meanwhile: this write holds active_writes) */
    if (wb != NULL && pos > offset)
        writebehind_wrote(wb, offset, pos - offset, ready);
    else if (start)
        start_writebehind(writer, file);
    /* what was written before an error is part of the file */
    end_change(writer, file, pos > offset || len == 0, pos, false, pos - offset);
    return err;
}

int writer_file_read(struct writer_file *file, uint64_t offset, size_t len,
                     void *buf, size_t *got)
{
    char *at = buf;

    *got = 0;
    pthread_mutex_lock(&file->writer->lock);
    uint64_t size = file->size;
    pthread_mutex_unlock(&file->writer->lock);
    if (offset >= size)
        return 0;
    if (len > size - offset)
        len = (size_t)(size - offset);
    int err = make_present(file->writer, file, offset, len, false);
    if (err != 0)
        return err;
    while (len > 0) {
        ssize_t done = pread(file->fd, at, len, (off_t)offset);
        if (done < 0 && errno == EINTR)
            continue;
        if (done < 0)
            return EIO;
        if (done == 0) { /* a hole at the end not yet extended: zeros */
            memset(at, 0, len);
            done = (ssize_t)len;
        }
        at += done;
        offset += (uint64_t)done;
        len -= (size_t)done;
        *got += (size_t)done;
    }
    return 0;
}

int writer_file_truncate(struct writer_file *file, uint64_t size)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, size);

    if (err != 0)
        return err;
    pthread_mutex_lock(&writer->lock);
    if (size < file->base_limit) {
        /* past SIZE the base is gone: zeros if the file grows again; a
         * fetch already under way there must land before the cut */
        mark_written_locked(file, size, file->base_limit - size);
        file->base_limit = size;
        for (uint64_t g = size / GRANULE; g < file->granules; g++)
            while (bit_get(file->loading, g))
                pthread_cond_wait(&writer->file_idle, &writer->lock);
    }
    pthread_mutex_unlock(&writer->lock);
    if (ftruncate(file->fd, (off_t)size) != 0)
        err = errno == ENOSPC || errno == EDQUOT ? ENOSPC : EIO;
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && size < file->seq_end)
        file->seq_end = size;
    struct writebehind *wb = err == 0 ? file->wb : NULL;
    pthread_mutex_unlock(&writer->lock);
    if (wb != NULL)
        writebehind_truncated(wb, size);
    end_change(writer, file, err == 0, size, true, 0);
    return err;
}

void writer_file_info(struct writer_file *file, uint64_t *size,
                      struct writer_meta *meta, bool *pending)
{
    pthread_mutex_lock(&file->writer->lock);
    if (size != NULL)
        *size = file->size;
    if (meta != NULL)
        *meta = file->meta;
    if (pending != NULL)
        *pending = is_pending(file);
    pthread_mutex_unlock(&file->writer->lock);
}

void writer_file_set_meta(struct writer_file *file, const struct writer_meta *meta)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    if (meta->mtime.tv_sec != file->meta.mtime.tv_sec ||
        meta->mtime.tv_nsec != file->meta.mtime.tv_nsec)
        file->mtime_set = true;
    file->meta = *meta;
    file->gen++; /* uploaded with the data: the next flush sends it */
    pthread_mutex_unlock(&writer->lock);
}

int writer_file_flush(struct writer_file *file)
{
    struct writer *writer = file->writer;

    if (!writer->conf.writeback)
        return upload_now(writer, file);

    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    if (!is_pending(file)) {
        pthread_mutex_unlock(&writer->lock);
        return 0;
    }
    file->busy = true;
    pthread_mutex_unlock(&writer->lock);

    /* the promise of writeback mode: durable before close() returns; the
     * upload is queued when the last writer closes */
    int err = journal_file(writer, file, NULL);

    pthread_mutex_lock(&writer->lock);
    if (file->open_writers == 0)
        enqueue_locked(writer, file);
    file->busy = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
    return err;
}

int writer_file_sync(struct writer_file *file)
{
    return upload_now(file->writer, file);
}

void writer_file_open_writer(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    file->open_writers++;
    pthread_mutex_unlock(&file->writer->lock);
}

void writer_file_close_writer(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    if (file->open_writers > 0)
        file->open_writers--;
    if (file->open_writers == 0 && writer->conf.writeback && is_pending(file))
        enqueue_locked(writer, file);
    pthread_mutex_unlock(&writer->lock);
}

bool writer_file_pending(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool pending = is_pending(file);
    pthread_mutex_unlock(&file->writer->lock);
    return pending;
}

/* Make FILE busy for the caller (the hold of writer_file_rename). */
static void hold(struct writer *writer, struct writer_file *file)
{
    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    file->busy = true;
    pthread_mutex_unlock(&writer->lock);
}

int writer_file_rename(struct writer_file *file, const char *new_key,
                       enum writer_renamed *state)
{
    struct writer *writer = file->writer;
    char *copy = strdup(new_key);

    *state = WRITER_RENAMED_UPLOADED;
    if (copy == NULL) {
        hold(writer, file);
        return ENOMEM;
    }
    /* a write-behind upload is under way at the old key: finish it there,
     * then the object moves as any uploaded one (if that upload fails,
     * the file is pending again and goes to the new key later) */
    pthread_mutex_lock(&writer->lock);
    bool streamed = file->wb != NULL && is_pending(file);
    pthread_mutex_unlock(&writer->lock);
    if (streamed)
        upload_now(writer, file);
    /* the base object is about to move or go: fetch what is still there */
    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    uint64_t whole = file->size;
    bool partial = file->base_key != NULL;
    pthread_mutex_unlock(&writer->lock);
    if (partial) {
        int err = make_present(writer, file, 0, whole, false);
        if (err != 0) {
            free(copy);
            hold(writer, file);
            return err;
        }
    }
    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    if (file->missing == 0) {
        free(file->base_key); /* complete: nothing is copied from it now */
        file->base_key = NULL;
    }
    free(file->key);
    file->key = copy;
    if (is_pending(file))
        *state = file->journaled ? WRITER_RENAMED_JOURNALED
                                 : WRITER_RENAMED_UNSAVED;
    /* a write that got in after the upload above may have begun another
     * write-behind upload, for the old key: it goes */
    struct writebehind *stale = file->wb;
    bool unclosed_entry = stale != NULL && file->wb_journaled;
    file->wb = NULL;
    file->wb_journaled = false;
    bool rejournal = file->journaled && is_pending(file);
    file->busy = true; /* held from the new key on, in one step */
    pthread_mutex_unlock(&writer->lock);
    writebehind_abandon(&stale); /* (safe on NULL) */
    if (rejournal)
        return journal_file(writer, file, NULL);
    if (unclosed_entry)
        journal_del(writer->conf.journal, file->id);
    return 0;
}

int writer_file_rename_back(struct writer_file *file, const char *key)
{
    struct writer *writer = file->writer;
    char *copy = strdup(key);

    if (copy == NULL)
        return ENOMEM;
    pthread_mutex_lock(&writer->lock);
    free(file->key);
    file->key = copy;
    bool rejournal = file->journaled && is_pending(file);
    pthread_mutex_unlock(&writer->lock);
    return rejournal ? journal_file(writer, file, NULL) : 0; /* (held: busy) */
}

void writer_file_release(struct writer_file *file)
{
    end_busy(file->writer, file);
}

int writer_file_complete(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    uint64_t whole = file->size;
    pthread_mutex_unlock(&writer->lock);
    int err = make_present(writer, file, 0, whole, false);
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && file->missing == 0 && !file->busy) {
        free(file->base_key); /* nothing is copied from it now */
        file->base_key = NULL;
    }
    pthread_mutex_unlock(&writer->lock);
    return err;
}

void writer_file_set_owner(struct writer_file *file, void *owner)
{
    pthread_mutex_lock(&file->writer->lock);
    file->owner = owner;
    pthread_mutex_unlock(&file->writer->lock);
}

/* Take FILE out of the upload queue (lock held); returns whether it was
 * there (the queue's reference is then the caller's to drop). */
static bool dequeue_locked(struct writer *writer, struct writer_file *file)
{
    struct writer_file **link = &writer->queue_head, *previous = NULL;

    if (!file->queued)
        return false;
    while (*link != NULL && *link != file) {
        previous = *link;
        link = &(*link)->queue_next;
    }
    if (*link == NULL)
        return false;
    *link = file->queue_next;
    if (writer->queue_tail == file)
        writer->queue_tail = previous;
    file->queued = false;
    return true;
}

void writer_file_relink(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    file->unlinked = false;
    bool pending = is_pending(file);
    if (pending)
        file->busy = true;
    pthread_mutex_unlock(&writer->lock);
    if (!pending)
        return;
    /* it was journaled before the unlink took it out: again */
    int err = journal_file(writer, file, NULL);
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && file->open_writers == 0)
        enqueue_locked(writer, file);
    file->busy = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
}

bool writer_file_unlink(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    wait_idle_locked(writer, file);
    file->unlinked = true;
    bool uploaded = file->uploaded;
    /* its staged data goes as soon as nobody reads it: not at the queue's
     * pace */
    if (dequeue_locked(writer, file))
        file->refs--; /* the caller holds one more: never the last */
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    bool forget = file->journaled || file->wb_journaled;
    if (forget || wb != NULL)
        file->busy = true;
    pthread_mutex_unlock(&writer->lock);
    if (!forget && wb == NULL)
        return uploaded;
    writebehind_abandon(&wb);
    if (forget && journal_del(writer->conf.journal, file->id) == 0) {
        pthread_mutex_lock(&writer->lock);
        file->journaled = false;
        file->wb_journaled = false;
        pthread_mutex_unlock(&writer->lock);
    }
    end_busy(writer, file);
    return uploaded;
}

bool writer_file_etag(struct writer_file *file, char *etag_out)
{
    pthread_mutex_lock(&file->writer->lock);
    bool uploaded = file->uploaded && !is_dirty(file);
    if (uploaded)
        snprintf(etag_out, S3_ETAG_MAX, "%s", file->etag);
    pthread_mutex_unlock(&file->writer->lock);
    return uploaded;
}

/* ------------------------------------------------------------- lifecycle */

int writer_create(const struct writer_conf *conf, struct writer **out)
{
    struct writer *writer = calloc(1, sizeof(*writer));
    int err = 0;

    *out = NULL;
    if (writer == NULL)
        return ENOMEM;
    writer->conf = *conf;
    writer->staging_dir_fd = -1;
    writer->upload = (struct upload_conf){
        .s3 = conf->s3,
        .workers = conf->workers,
        .parallel = conf->parallel_parts ? conf->parallel_parts : 1,
        .multipart_threshold = conf->multipart_threshold,
        .part_size = conf->part_size,
    };
    pthread_mutex_init(&writer->lock, NULL);
    pthread_cond_init(&writer->file_idle, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&writer->work_queued, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pthread_cond_init(&writer->upload_done, NULL);
    if (asprintf(&writer->staging_dir, "%s/staging",
                 cache_dir_path(conf->cache)) < 0) {
        writer->staging_dir = NULL;
        err = ENOMEM;
        goto out;
    }
    writer->staging_dir_fd = -1;
    if (mkdir(writer->staging_dir, 0700) != 0 && errno != EEXIST) {
        err = errno;
        log_error("cannot create %s: %s", writer->staging_dir, strerror(err));
        goto out;
    }
    writer->staging_dir_fd = open(writer->staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (writer->staging_dir_fd < 0) {
        err = errno;
        log_error("cannot open %s: %s", writer->staging_dir, strerror(err));
        goto out;
    }
    unsigned count = conf->uploaders ? conf->uploaders : 1;
    writer->threads = calloc(count, sizeof(*writer->threads));
    if (writer->threads == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (; writer->thread_count < count; writer->thread_count++) {
        err = pthread_create(&writer->threads[writer->thread_count], NULL,
                             uploader_main, writer);
        if (err != 0)
            goto out;
    }
out:
    if (err != 0)
        writer_destroy(&writer);
    *out = writer;
    return err;
}

void writer_destroy(struct writer **writerp)
{
    struct writer *writer = *writerp;

    if (writer == NULL)
        return;
    pthread_mutex_lock(&writer->lock);
    writer->stopping = true;
    pthread_cond_broadcast(&writer->work_queued);
    pthread_mutex_unlock(&writer->lock);
    for (unsigned i = 0; i < writer->thread_count; i++)
        pthread_join(writer->threads[i], NULL);
    free(writer->threads);
    if (writer->staging_dir_fd >= 0)
        close(writer->staging_dir_fd);
    pthread_mutex_destroy(&writer->lock);
    pthread_cond_destroy(&writer->file_idle);
    pthread_cond_destroy(&writer->work_queued);
    pthread_cond_destroy(&writer->upload_done);
    free(writer->staging_dir);
    free(writer);
    *writerp = NULL;
}

void writer_get_stats(struct writer *writer, struct writer_stats *out)
{
    pthread_mutex_lock(&writer->lock);
    *out = writer->stats;
    out->uploads_pending = 0;
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file))
            out->uploads_pending++;
    pthread_mutex_unlock(&writer->lock);
}

uint64_t writer_drain(struct writer *writer)
{
    uint64_t left = 0;

    pthread_mutex_lock(&writer->lock);
    writer->draining = true;
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file))
            enqueue_locked(writer, file);
    pthread_cond_broadcast(&writer->work_queued);
    while (writer->queue_head != NULL || writer->running > 0)
        pthread_cond_wait(&writer->upload_done, &writer->lock);
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file)) {
            left++;
            log_error("'%s' could not be uploaded; it stays in the journal of "
                      "the cache directory and the next mount uploads it",
                      file->key);
        }
    pthread_mutex_unlock(&writer->lock);
    return left;
}

/* ------------------------------------------------------------- recovery */

struct recovery {
    struct writer *writer;
    writer_adopt_fn adopt;
    void *arg;
    uint64_t *ids;               /* journaled ids, for the staging sweep */
    size_t id_count, id_capacity;
    unsigned queued;
};

static int recover_entry(void *arg, const struct journal_entry *entry)
{
    struct recovery *recovery = arg;
    struct writer *writer = recovery->writer;
    struct writer_meta meta = {
        .mode = entry->mode, .uid = entry->uid, .gid = entry->gid,
        .mtime = entry->mtime,
    };
    struct writer_file *file = NULL;
    char path[PATH_MAX];
    struct stat st;

    if (recovery->id_count == recovery->id_capacity) {
        size_t capacity = recovery->id_capacity ? recovery->id_capacity * 2 : 64;
        uint64_t *grown = realloc(recovery->ids, capacity * sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        recovery->ids = grown;
        recovery->id_capacity = capacity;
    }
    if (entry->unclosed) {
        /* written when the crash came, never closed: nobody was promised
         * its data (its staging file goes with the others not journaled);
         * only its write-behind upload is to be aborted */
        int err = entry->upload_id != NULL
                      ? upload_abort(&writer->upload, entry->key, entry->upload_id)
                      : 0;
        if (err == 0)
            journal_del(writer->conf.journal, entry->id);
        else
            log_warn("cannot abort the unfinished upload of '%s' (%s); the "
                     "next mount tries again", entry->key, strerror(err));
        return 0;
    }
    recovery->ids[recovery->id_count++] = entry->id;

    if (entry->upload_id != NULL)
        upload_abort(&writer->upload, entry->key, entry->upload_id);
    staging_path(writer, entry->id, path, sizeof(path));
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        log_error("the journal names '%s' but its staging file %s is missing; "
                  "it cannot be uploaded and is dropped from the journal",
                  entry->key, path);
        if (fd >= 0)
            close(fd);
        journal_del(writer->conf.journal, entry->id);
        return 0;
    }
    uint64_t size = entry->size;
    if ((uint64_t)st.st_size != size) {
        /* changed in place after it was journaled (reopened and written
         * before its upload): what is on disk is the latest */
        log_warn("'%s' changed after it was closed and before the crash; "
                 "uploading it as it was then (%llu bytes)", entry->key,
                 (unsigned long long)st.st_size);
        size = (uint64_t)st.st_size;
    }
    int err = file_new(writer, entry->id, fd, entry->key, &meta, NULL, &file);
    if (err != 0) {
        close(fd);
        return err;
    }
    file->size = size;
    file->reserved = size;
    file->gen = 1;
    file->uploaded_gen = NEVER;
    file->journaled = true;
    file->journaled_size = entry->size;
    file->journaled_meta = meta;
    if (entry->upload_id != NULL || size != entry->size)
        journal_file(writer, file, NULL); /* the aborted id is gone */
    if (recovery->adopt != NULL)
        recovery->adopt(recovery->arg, writer_file_ref(file), entry->key,
                        size, &meta);
    pthread_mutex_lock(&writer->lock);
    enqueue_locked(writer, file);
    pthread_mutex_unlock(&writer->lock);
    writer_file_put(&file);
    recovery->queued++;
    return 0;
}

static int compare_ids(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int writer_recover(struct writer *writer, writer_adopt_fn adopt, void *arg)
{
    struct recovery recovery = {.writer = writer, .adopt = adopt, .arg = arg};
    int err = journal_scan(writer->conf.journal, recover_entry, &recovery);

    if (recovery.queued > 0)
        log_info("uploading %u file%s written before the last mount ended",
                 recovery.queued, recovery.queued == 1 ? "" : "s");
    /* staging files the journal does not name were never closed (or
     * were being written when the crash came: their entries are gone) */
    DIR *dir = err == 0 ? opendir(writer->staging_dir) : NULL;
    if (dir != NULL) {
        if (recovery.id_count > 0)
            qsort(recovery.ids, recovery.id_count, sizeof(uint64_t), compare_ids);
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            char *end = NULL;
            uint64_t id = strtoull(entry->d_name, &end, 16);
            if (entry->d_name[0] == '.' || end == NULL || *end != '\0')
                continue;
            if (recovery.id_count > 0 &&
                bsearch(&id, recovery.ids, recovery.id_count, sizeof(uint64_t),
                        compare_ids) != NULL)
                continue;
            /* a record this version cannot read may name promised data;
             * (an unclosed entry whose abort failed keeps its data until a
             * later mount removes both) */
            if (journal_has(writer->conf.journal, id))
                continue;
            char path[PATH_MAX];
            staging_path(writer, id, path, sizeof(path));
            unlink(path);
        }
        closedir(dir);
    }
    free(recovery.ids);
    return err;
}
