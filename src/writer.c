/*
 * writer.c - staged files, their uploads and the journal (see writer.h).
 *
 * Versions. A file's data lives in a staging file (staging.h); the one
 * writes go to is the file's `data`. A staging file is *sealed* up to a
 * size while a journal entry names it (the bytes promised) or an upload
 * reads it (the bytes being sent): those bytes never change in place. A
 * write or truncate that would change sealed bytes first copies the data
 * to a new staging file (copy on write) and goes on there, so that
 *   - close() and writes never wait for an upload under way;
 *   - a journal entry always names exactly the bytes that were closed, and
 *     after a crash the next mount uploads those (the issue of a journaled
 *     file reopened and rewritten in place is gone);
 *   - an upload reads a version that does not change underneath it.
 * Writes past the sealed size (appends) go in place: they do not touch
 * the sealed bytes, and an entry records its size. An edit of an object
 * with bytes not fetched yet cannot be copied (its holes are fetched into
 * its staging file by the upload itself): its writes wait for the seal to
 * end, as every write did before.
 *
 * State of a file, under the writer lock:
 *   gen           bumped by every change of data or metadata; data_gen by
 *                 changes of data only
 *   uploaded_gen  the gen now in the bucket (0 before a first upload)
 *   data          the staging file of the current data (a reference)
 *   entry         the staging file its journal entry names (a reference),
 *                 NULL when the journal has none; entry_gen is the gen it
 *                 promises (0 for an `unclosed` entry, which only names a
 *                 write-behind upload to abort after a crash)
 *   sending       the staging file an upload of it is reading (a
 *                 reference): at most one upload of a file at a time,
 *                 so versions of one file reach the bucket in order
 *   journal_busy  a journal update for it is under way (they are
 *                 serialized, so an entry is never deleted after a newer
 *                 promise of the same id was written)
 *   held          a rename or unlink holds it: writes, uploads and
 *                 journal updates of others wait
 *   copying       a copy on write is under way: writes wait
 *   active_writes writes and truncates running outside the lock; a seal
 *                 and a copy wait for them
 *   queued        in the upload queue (the queue holds a reference)
 * A file is pending when gen != uploaded_gen and it is not unlinked. The
 * fs layer keeps a reference while a file is pending.
 *
 * Invariants: a journal entry is replaced (newer promise, rename) in one
 * journal transaction with the entry it supersedes (journal_update), so
 * the journal never holds two promises for one key; an entry is deleted
 * only once the bucket has its version or a later one, or the file is
 * unlinked; a staging file is removed when nothing references it.
 *
 * Write-behind (writebehind.h), in the default mode: a file that is not an
 * edit, written from its start past the multipart threshold, gets a
 * multipart upload (wb) created by the write that crossed it; every write
 * then tells it what changed and how far the file is written contiguously
 * from byte 0 (seq_end), and the upload at close finishes it instead of
 * uploading the file. Its upload id is journaled at once (an `unclosed`
 * entry, or the file's complete entry), so that a crash leaves no
 * multipart upload behind. The upload is created without x-amz-meta-mtime
 * (the object's Last-Modified, read back once it is complete, becomes the
 * file's mtime); if the mode, owner or an explicit mtime changed
 * meanwhile, the object is copied onto itself with them. A copy on write
 * abandons it (its parts read the old staging file). A file renamed while
 * its write-behind upload is under way is first uploaded under its old
 * name, then moved by the caller as any uploaded object.
 *
 * Failed uploads are retried in the background with exponential backoff
 * (RETRY_FIRST_SECONDS doubling up to RETRY_MAX_SECONDS), until they reach
 * the bucket, the file is unlinked, or the drain at unmount.
 *
 * Threads: `uploaders` background threads take files from the queue
 * (work_queued); writer_drain() waits on upload_done for the queue to
 * empty. Lock order: a caller may hold the fs layer's inode table lock
 * when it calls in; the writer lock is taken inside and never held across
 * disk or network I/O.
 */
#include "config.h"

#include "writer.h"

#include <assert.h>
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

#include "clock.h"
#include "log.h"
#include "staging.h"
#include "upload.h"
#include "writebehind.h"

#define GRANULE (1ull << 20)        /* unit of fetching an edited object */
#define RUN_MAX 64                  /* granules fetched in one go */
#define RESERVE_STEP (8ull << 20)   /* disk checked per 8 MiB of growth */
#define MAX_FILE_SIZE (5ull << 40)  /* S3's largest object */
#define SETTLE_SECONDS 0.2          /* writeback: wait this long after the
                                       last close before uploading, so a
                                       file reopened at once (the Hugging
                                       Face hub appends in a second open)
                                       is uploaded once */
#define RETRY_FIRST_SECONDS 1.0     /* a failed upload is tried again ... */
#define RETRY_MAX_SECONDS 300.0     /* ... doubling the wait up to this */

/* One staging file: a version of a file's data. */
struct staging_file {
    uint64_t id;
    int fd;
    unsigned refs;                /* (W) data, entry, sending, callers */
    uint64_t journal_seal;        /* (W) bytes an entry promises, or one
                                     being written will */
    unsigned promising;           /* (W) journal writes of it under way */
    uint64_t upload_seal;         /* (W) bytes an upload is reading */
};

struct writer_file {
    struct writer *writer;
    void *owner;
    unsigned refs;
    char *key;
    uint64_t size;
    uint64_t reserved;            /* disk space checked up to here */
    struct writer_meta meta;
    uint64_t gen, uploaded_gen, data_gen;
    struct staging_file *data;
    /* the journal entry (see the top of this file) */
    struct staging_file *entry;
    uint64_t entry_gen, entry_data_gen, entry_size;
    struct writer_meta entry_meta;
    bool entry_unclosed;
    char *entry_upload_id;        /* the multipart upload it names, or NULL */
    struct staging_file *sending;
    bool journal_busy, held, copying;
    bool queued, failed, unlinked, uploaded;
    bool drain_tried;             /* the drain tried to journal it */
    bool marked;                  /* its promise is kept beside its staging
                                     file (the journal refused it) */
    unsigned active_writes;
    unsigned open_writers;        /* handles open for writing */
    double due;                   /* upload not before (monotonic) */
    unsigned retries;             /* failed uploads since the last one */
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
    bool mtime_set;               /* mtime set explicitly since the last write */
    struct writer_meta wb_meta;   /* the metadata wb was created with */
    struct writer_file *queue_next;
    struct writer_file *all_prev, *all_next;
};

struct writer {
    struct writer_conf conf;
    struct upload_conf upload;
    struct staging_dir *staging;
    pthread_mutex_t lock;
    pthread_cond_t file_idle;     /* a file's state changed (see above) */
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

/* A version of a file: what an upload sends or a journal entry names. */
struct version {
    struct staging_file *staging; /* a reference */
    uint64_t size, gen, data_gen;
    struct writer_meta meta;
};

static bool is_dirty(const struct writer_file *file)
{
    return file->gen != file->uploaded_gen;
}

static bool is_pending(const struct writer_file *file)
{
    return is_dirty(file) && !file->unlinked;
}

/* Whether the journal promises a version newer than the bucket's. */
static bool has_promise(const struct writer_file *file)
{
    return file->entry != NULL && !file->entry_unclosed &&
           file->entry_gen > file->uploaded_gen;
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

/* ------------------------------------------------------- staging files */

static int staging_file_new(struct writer *writer, struct staging_file **out)
{
    struct staging_file *staging = calloc(1, sizeof(*staging));
    int err;

    *out = NULL;
    if (staging == NULL)
        return ENOMEM;
    staging->id = journal_next_id(writer->conf.journal);
    staging->refs = 1;
    err = staging_create(writer->staging, staging->id, &staging->fd);
    if (err != 0) {
        free(staging);
        return err;
    }
    *out = staging;
    return 0;
}

static struct staging_file *hold_locked(struct staging_file *staging)
{
    staging->refs++;
    return staging;
}

/* Drop a reference (lock held); returns STAGING when it was the last, for
 * staging_file_free() once the lock is released, else NULL. */
static struct staging_file *unref_locked(struct staging_file *staging)
{
    if (staging == NULL || --staging->refs > 0)
        return NULL;
    return staging;
}

/* Close and free STAGING, removing its file unless KEEP. Lock not held. */
static void staging_file_free(struct writer *writer, struct staging_file *staging,
                              bool keep)
{
    if (staging == NULL)
        return;
    log_debug("staging file %016" PRIx64 " %s", staging->id,
              keep ? "closed, kept" : "removed");
    close(staging->fd);
    if (!keep)
        staging_remove(writer->staging, staging->id);
    free(staging);
}

/* Drop a reference, lock not held; *STAGING = NULL. */
static void staging_file_drop(struct writer *writer, struct staging_file **staging)
{
    pthread_mutex_lock(&writer->lock);
    struct staging_file *last = unref_locked(*staging);
    pthread_mutex_unlock(&writer->lock);
    staging_file_free(writer, last, false);
    *staging = NULL;
}

/* The bytes of STAGING that must not change in place. */
static uint64_t sealed_size(const struct staging_file *staging)
{
    return staging->journal_seal > staging->upload_seal ? staging->journal_seal
                                                        : staging->upload_seal;
}

/* A journal write of the first SIZE bytes of STAGING begins (lock held):
 * they are sealed until end_promising_locked(). */
static void begin_promising_locked(struct staging_file *staging, uint64_t size)
{
    staging->promising++;
    if (size > staging->journal_seal)
        staging->journal_seal = size;
}

/* A journal write of STAGING ended (lock held): its seal is what its entry
 * promises, if it has one, unless another write of it is still under way. */
static void end_promising_locked(struct writer_file *file,
                                 struct staging_file *staging)
{
    if (--staging->promising > 0)
        return;
    staging->journal_seal = file->entry == staging && !file->entry_unclosed
                                ? file->entry_size : 0;
}

/*
 * Take FILE's current version (lock held): waits until no write or copy of
 * its data is under way, and seals the version's bytes in its staging file
 * (FOR_UPLOAD: for an upload, else for a journal write, which the caller
 * ends with end_promising_locked()).
 */
static void version_take_locked(struct writer *writer, struct writer_file *file,
                                bool for_upload, struct version *out)
{
    while (file->active_writes > 0 || file->copying)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    *out = (struct version){
        .staging = hold_locked(file->data),
        .size = file->size,
        .gen = file->gen,
        .data_gen = file->data_gen,
        .meta = file->meta,
    };
    if (for_upload)
        out->staging->upload_seal = file->size;
    else
        begin_promising_locked(out->staging, file->size);
}

/* ------------------------------------------------------------- edits */

/*
 * Make the base's bytes of [OFFSET, OFFSET + LEN) present in the staging
 * file, fetching the granules that are not (runs of them in one fetch).
 * With COVERED, granules the range covers entirely are only marked
 * present: the caller is about to write all of them. Threads needing the
 * same granule share the work: one fetches, the others wait (file_idle).
 * (An edit with granules missing is never copied on write: its data
 * staging file stays the same meanwhile.)
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
    while (err == 0 && file->base_key != NULL && g < file->granules &&
           g * GRANULE < end) {
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
        int fd = file->data->fd;
        pthread_mutex_unlock(&writer->lock);

        err = key == NULL ? ENOMEM
            : writer->conf.fetch_base(writer->conf.fetch_arg, key, etag, base_size,
                                      start, stop - start, fd);
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

/* Whether FILE's data may be copied: every byte of it is in its staging
 * file (not an edit, or an edit with every granule fetched). */
static bool copyable(const struct writer_file *file)
{
    return file->base_key == NULL || file->missing == 0;
}

/* Forget the base of a complete edit (lock held): nothing is copied from
 * it any more. (An upload under way has its own copy of the base's key,
 * and nothing left to fetch from it.) */
static void drop_base_locked(struct writer_file *file)
{
    if (file->base_key != NULL && file->missing == 0) {
        free(file->base_key);
        file->base_key = NULL;
    }
}

/* ------------------------------------------------------------- queue */

/* Queue FILE for a background upload not before DELAY seconds from now
 * (a reference goes with it). Lock held. */
static void enqueue_locked(struct writer *writer, struct writer_file *file,
                           double delay)
{
    if (file->queued)
        return;
    file->queued = true;
    file->due = clock_monotonic_seconds() + delay;
    file->refs++;
    file->queue_next = NULL;
    if (writer->queue_tail != NULL)
        writer->queue_tail->queue_next = file;
    else
        writer->queue_head = file;
    writer->queue_tail = file;
    pthread_cond_signal(&writer->work_queued);
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

/* A failed upload of FILE: try again in the background, later each time
 * (lock held). Not during the drain, which tries each file once more. */
static void schedule_retry_locked(struct writer *writer, struct writer_file *file)
{
    if (writer->draining || writer->stopping || !is_pending(file) || file->queued)
        return;
    double delay = RETRY_FIRST_SECONDS;
    for (unsigned i = 0; i < file->retries && delay < RETRY_MAX_SECONDS; i++)
        delay *= 2;
    if (delay > RETRY_MAX_SECONDS)
        delay = RETRY_MAX_SECONDS;
    /* a little jitter, so that files failed together do not retry in step */
    delay *= 0.75 + 0.25 * (double)arc4random_uniform(1001) / 1000.0;
    file->retries++;
    writer->stats.upload_retries++;
    log_warn("'%s' is tried again in %.0f s (retry %u)", file->key, delay,
             file->retries);
    enqueue_locked(writer, file, delay);
}

/* ------------------------------------------------------------- journal */

static void entry_of(uint64_t id, const char *key, uint64_t size,
                     const struct writer_meta *meta, const char *upload_id,
                     bool unclosed, struct journal_entry *out)
{
    *out = (struct journal_entry){
        .id = id,
        .key = key,
        .size = size,
        .mode = meta->mode,
        .uid = meta->uid,
        .gid = meta->gid,
        .mtime = meta->mtime,
        .upload_id = upload_id,
        .unclosed = unclosed,
    };
}

/* Wait for FILE's journal updates to be its caller's (lock held). */
static void journal_begin_locked(struct writer *writer, struct writer_file *file)
{
    while (file->journal_busy)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    file->journal_busy = true;
}

static void journal_end_locked(struct writer *writer, struct writer_file *file)
{
    file->journal_busy = false;
    pthread_cond_broadcast(&writer->file_idle);
}

/*
 * Promise version V of FILE (taken with version_take_locked(..., false),
 * whose seal this ends): make its staging file durable and journal it,
 * replacing the file's previous entry in the same transaction. UPLOAD_ID
 * (may be NULL) is a multipart upload of it to abort after a crash.
 * Returns 0 when the journal promises V (or a later version, or the
 * bucket has it), else the errno (logged). Lock not held.
 */
static int promise(struct writer *writer, struct writer_file *file,
                   const struct version *v, const char *upload_id)
{
    struct journal_entry entry;
    struct staging_file *old = NULL, *freed = NULL;
    char *key = NULL, *id_copy = NULL;
    int err = 0;

    /* the journal must name complete data: fetch what an edit lacks */
    err = make_present(writer, file, 0, v->size, false);
    if (err != 0) {
        log_error("cannot stage all of '%s' for the journal: %s", file->key,
                  strerror(err));
        pthread_mutex_lock(&writer->lock);
        end_promising_locked(file, v->staging);
        pthread_mutex_unlock(&writer->lock);
        return err;
    }
    pthread_mutex_lock(&writer->lock);
    journal_begin_locked(writer, file);
    bool done = file->unlinked ||
                (file->uploaded && file->uploaded_gen >= v->gen) ||
                (has_promise(file) && file->entry_gen >= v->gen &&
                 upload_id == NULL);
    if (!done) {
        key = strdup(file->key);
        if (upload_id == NULL && file->wb != NULL && file->data == v->staging)
            upload_id = writebehind_upload_id(file->wb);
        id_copy = upload_id != NULL ? strdup(upload_id) : NULL;
        if (file->entry != NULL && file->entry != v->staging)
            old = file->entry;
    }
    pthread_mutex_unlock(&writer->lock);

    if (!done && (key == NULL || (upload_id != NULL && id_copy == NULL)))
        err = ENOMEM;
    if (!done && err == 0)
        err = staging_sync(writer->staging, v->staging->fd, key);
    if (!done && err == 0) {
        entry_of(v->staging->id, key, v->size, &v->meta, id_copy, false, &entry);
        err = journal_update(writer->conf.journal, &entry, 1,
                             old != NULL ? &old->id : NULL, old != NULL);
        if (err != 0)
            log_error("cannot journal the upload of '%s': %s", key,
                      strerror(err));
    }

    if (!done && err == 0)
        log_debug("'%s': journaled %016" PRIx64 " (%llu bytes, version %llu)%s",
                  key, v->staging->id, (unsigned long long)v->size,
                  (unsigned long long)v->gen, old != NULL ? ", older entry dropped" : "");
    pthread_mutex_lock(&writer->lock);
    if (!done && err == 0) {
        if (file->entry != v->staging) {
            freed = unref_locked(file->entry);
            file->entry = hold_locked(v->staging);
        }
        if (old != NULL && old->promising == 0)
            old->journal_seal = 0;
        file->entry_gen = v->gen;
        file->entry_data_gen = v->data_gen;
        file->entry_size = v->size;
        file->entry_meta = v->meta;
        file->entry_unclosed = false;
        free(file->entry_upload_id);
        file->entry_upload_id = id_copy;
        id_copy = NULL;
    }
    end_promising_locked(file, v->staging);
    journal_end_locked(writer, file);
    pthread_mutex_unlock(&writer->lock);
    staging_file_free(writer, freed, false);
    free(id_copy);
    free(key);
    return err;
}

/*
 * Delete FILE's journal entry if what it promises is in the bucket
 * (UP_TO: the gen that is) or the file is unlinked (UP_TO 0: whatever it
 * promises). Lock not held. A failure is logged: the next mount uploads
 * the entry again, which costs a request, never data.
 */
static void forget_entry(struct writer *writer, struct writer_file *file,
                         uint64_t up_to)
{
    pthread_mutex_lock(&writer->lock);
    journal_begin_locked(writer, file);
    struct staging_file *entry = file->entry;
    /* (an unclosed entry names a write-behind upload: it stays while that
     * upload is under way) */
    bool forget = entry != NULL &&
                  (up_to == 0 ||
                   (file->entry_unclosed ? file->wb == NULL
                                         : file->entry_gen <= up_to));
    uint64_t id = forget ? entry->id : 0;
    pthread_mutex_unlock(&writer->lock);

    int err = forget ? journal_del(writer->conf.journal, id) : 0;
    if (forget && err == 0)
        log_debug("'%s': entry %016" PRIx64 " dropped", file->key, id);

    struct staging_file *freed = NULL;
    pthread_mutex_lock(&writer->lock);
    if (forget && err == 0) {
        file->entry = NULL;
        entry->journal_seal = entry->promising > 0 ? entry->journal_seal : 0;
        free(file->entry_upload_id);
        file->entry_upload_id = NULL;
        freed = unref_locked(entry);
    }
    journal_end_locked(writer, file);
    pthread_mutex_unlock(&writer->lock);
    if (err != 0)
        log_warn("'%s' stays in the journal (%s): the next mount uploads it "
                 "again", file->key, strerror(err));
    staging_file_free(writer, freed, false);
}

/* ------------------------------------------------------------- uploads */

struct upload_context {
    struct writer *writer;
    struct writer_file *file;
    const struct version *version;
};

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
    pthread_mutex_unlock(&writer->lock);
    if (skip)
        return 0;
    int err = promise(writer, file, &promised, upload_id);
    staging_file_drop(writer, &promised.staging);
    return err;
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
        meta->gid != wb_meta->gid || mtime_set) {
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

/* The uploaded object is the base of what comes next (lock held, the
 * upload of version V just ended): what is not fetched yet is its bytes.
 * If the data changed since V was taken, the base is no longer known to
 * hold what the file does anywhere: it is dropped (the file is complete
 * then: only complete data is copied on write). */
static void rebase_locked(struct writer_file *file, const struct version *v,
                          const char *key, const char *etag)
{
    if (file->base_key == NULL)
        return;
    if (file->data_gen != v->data_gen) {
        drop_base_locked(file);
        return;
    }
    char *base_key = strdup(key);
    if (base_key == NULL)
        return;
    free(file->base_key);
    file->base_key = base_key;
    snprintf(file->base_etag, sizeof(file->base_etag), "%s", etag);
    file->base_size = v->size;
    file->base_limit = v->size;
    memset(file->written, 0, (size_t)((file->granules + 7) / 8));
}

/*
 * Upload a version of FILE in this thread: the current one, or with
 * PROMISED_ONLY the one its journal entry promises (a background retry
 * while the file is open for writing: what is written and not closed is
 * not sent). Waits for an upload of the file under way first. Returns 0
 * when that version (or a later one) is in the bucket, or when there is
 * nothing to send; else the upload's errno (the file stays pending,
 * journaled, and is tried again in the background).
 */
static int upload_version(struct writer *writer, struct writer_file *file,
                          bool promised_only)
{
    struct version v;
    struct s3_put_meta put_meta;
    char etag[S3_ETAG_MAX] = "";
    char *base_key = NULL;
    char base_etag[S3_ETAG_MAX] = "";
    uint64_t base_limit = 0;
    int err;

    pthread_mutex_lock(&writer->lock);
    while (file->held || file->sending != NULL)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    if (!is_pending(file) || (promised_only && !has_promise(file))) {
        err = file->unlinked || !file->failed || !is_pending(file)
                  ? 0 : file->last_error;
        pthread_mutex_unlock(&writer->lock);
        return err;
    }
    struct writebehind *wb = NULL;
    struct writer_meta wb_meta = file->wb_meta;
    bool mtime_set = false;
    if (promised_only) {
        v = (struct version){
            .staging = hold_locked(file->entry),
            .size = file->entry_size,
            .gen = file->entry_gen,
            .data_gen = file->entry_data_gen,
            .meta = file->entry_meta,
        };
        v.staging->upload_seal = v.size;
    } else {
        version_take_locked(writer, file, true, &v);
        /* finished or abandoned below, whatever happens */
        wb = file->wb;
        file->wb = NULL;
        mtime_set = file->mtime_set;
    }
    file->sending = v.staging;
    char *key = strdup(file->key);
    void *owner = file->owner;
    if (file->base_key != NULL) {
        base_key = strdup(file->base_key);
        snprintf(base_etag, sizeof(base_etag), "%s", file->base_etag);
        base_limit = file->base_limit;
    }
    pthread_mutex_unlock(&writer->lock);

    struct upload_context context = {writer, file, &v};
    struct upload_base base = {
        .key = base_key,
        .etag = base_etag,
        .size = base_limit,
        .range_unchanged = base_range_unchanged,
        .materialize = base_materialize,
        .arg = &context,
    };
    struct upload_request request = {
        .key = key,
        .fd = v.staging->fd,
        .size = v.size,
        .meta = &put_meta,
        .base = base_key != NULL ? &base : NULL,
        .on_multipart = on_multipart,
        .arg = &context,
    };
    fill_put_meta(&v.meta, &put_meta);
    bool fall_back = true;
    err = key == NULL ? ENOMEM : 0;
    if (err == 0 && wb != NULL)
        err = finish_writebehind(writer, &wb, key, v.size, &v.meta, &wb_meta,
                                 mtime_set, etag, &fall_back);
    writebehind_abandon(&wb); /* (on a failure before finishing) */
    if (err == 0 && fall_back)
        err = upload_file(&writer->upload, &request, etag);

    /* the upload counts as under way (sending) until its consequences are
     * recorded: its journal entry, and the fs layer told under the key it
     * went to; a rename or unlink waiting for it comes after all of that
     * (else a late callback put the old name back in a listing) */
    bool need_promise = false;
    pthread_mutex_lock(&writer->lock);
    if (err == 0) {
        if (v.gen > file->uploaded_gen)
            file->uploaded_gen = v.gen;
        file->uploaded = true;
        file->failed = false;
        file->retries = 0;
        snprintf(file->etag, sizeof(file->etag), "%s", etag);
        rebase_locked(file, &v, key, etag);
        writer->stats.uploads_completed++;
        if (!is_dirty(file)) {
            file->mtime_set = false;
            file->meta.mtime = v.meta.mtime; /* (the object's, after write-behind) */
        }
    } else {
        file->failed = true;
        file->last_error = err;
        writer->stats.upload_failures++;
        /* a failed upload must survive a crash: journal it */
        need_promise = !file->unlinked &&
                       !(has_promise(file) && file->entry_gen >= v.gen);
        if (need_promise)
            begin_promising_locked(v.staging, v.size);
    }
    pthread_mutex_unlock(&writer->lock);

    if (err == 0) {
        forget_entry(writer, file, v.gen);
        if (writer->conf.uploaded != NULL)
            writer->conf.uploaded(writer->conf.uploaded_arg, file, owner, key,
                                  etag, v.size, &v.meta);
    } else {
        log_error("upload of '%s' failed: %s; the data is kept in the cache "
                  "directory and the upload will be retried",
                  key != NULL ? key : "?", strerror(err));
        if (need_promise)
            promise(writer, file, &v, NULL);
    }
    pthread_mutex_lock(&writer->lock);
    file->sending = NULL;
    v.staging->upload_seal = 0;
    if (err != 0)
        schedule_retry_locked(writer, file);
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
    staging_file_drop(writer, &v.staging);
    free(base_key);
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
            pthread_cond_timedwait(&writer->work_queued, &writer->lock, &until);
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
         * again; in the default mode only what was promised goes (a
         * retry), not what is being written */
        bool writing = file->open_writers > 0 && !writer->draining;
        bool skip = writing && writer->conf.writeback;
        writer->running++;
        pthread_mutex_unlock(&writer->lock);

        if (!skip)
            upload_version(writer, file, writing);
        writer_file_put(&file);

        pthread_mutex_lock(&writer->lock);
        writer->running--;
        pthread_cond_broadcast(&writer->upload_done);
    }
    pthread_mutex_unlock(&writer->lock);
    return NULL;
}

/* ------------------------------------------------------------- files */

static int file_new(struct writer *writer, struct staging_file *data,
                    const char *key, const struct writer_meta *meta,
                    void *owner, struct writer_file **out)
{
    struct writer_file *file = calloc(1, sizeof(*file));

    *out = NULL;
    if (file == NULL || (file->key = strdup(key)) == NULL) {
        free(file);
        return ENOMEM;
    }
    file->writer = writer;
    file->data = data;
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
    struct staging_file *data = NULL;
    int err = staging_file_new(writer, &data);

    *out = NULL;
    if (err != 0)
        return err;
    err = file_new(writer, data, key, meta, owner, out);
    if (err != 0) {
        staging_file_free(writer, data, false);
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
    else if (ftruncate(file->data->fd, (off_t)size) != 0)
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
    /* an entry left by a failed delete, for a file in the bucket */
    bool stale_entry = file->entry != NULL && !pending;
    pthread_mutex_unlock(&writer->lock);

    /* (a write-behind upload left only on a file never uploaded: gone) */
    writebehind_abandon(&file->wb);
    if (stale_entry)
        forget_entry(writer, file, 0);
    pthread_mutex_lock(&writer->lock);
    bool adopt = !pending && !file->unlinked && file->uploaded &&
                 file->uploaded_gen == file->gen && file->missing == 0 &&
                 file->entry == NULL && file->data->refs == 1;
    struct staging_file *entry = file->entry, *data = file->data;
    file->entry = file->data = NULL;
    pthread_mutex_unlock(&writer->lock);

    if (pending) {
        /* cannot happen while the fs layer keeps pending files; the data
         * and its entry stay for the next mount all the same */
        log_warn("'%s' is not uploaded yet; its staged data is kept", file->key);
        if (entry != NULL && entry != data)
            staging_file_free(writer, entry, true);
        staging_file_free(writer, data, true);
    } else {
        staging_path(writer->staging, data->id, path, sizeof(path));
        /* the uploaded data becomes the cached version */
        bool adopted = adopt && cache_adopt_file(writer->conf.cache, file->key,
                                                 file->etag, file->size,
                                                 path) == 0;
        if (adopted)
            log_debug("'%s': staging file %016" PRIx64 " is its cached version "
                      "now", file->key, data->id);
        if (entry != NULL && entry != data)
            staging_file_free(writer, entry, true); /* (its entry stays) */
        staging_file_free(writer, data, adopted || entry == data);
    }
    free(file->entry_upload_id);
    free(file->key);
    free(file->base_key);
    free(file->present);
    free(file->loading);
    free(file->written);
    free(file);
}

/*
 * Copy FILE's data to a new staging file (copy on write), keeping its
 * first KEEP bytes (lock held on entry and return; dropped meanwhile).
 * Its write-behind upload goes: its parts read the old staging file. The
 * old staging file stays as long as an entry or an upload needs it.
 */
static int copy_on_write_locked(struct writer *writer, struct writer_file *file,
                                uint64_t keep)
{
    struct staging_file *fresh = NULL, *freed = NULL;

    file->copying = true;
    while (file->active_writes > 0)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    uint64_t length = keep < file->size ? keep : file->size;
    struct staging_file *from = hold_locked(file->data);
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    pthread_mutex_unlock(&writer->lock);

    writebehind_abandon(&wb);
    int err = cache_reserve_disk(writer->conf.cache, length);
    if (err == 0)
        err = staging_file_new(writer, &fresh);
    if (err == 0)
        err = staging_copy(from->fd, fresh->fd, length);
    if (err == 0)
        log_debug("'%s': copied %016" PRIx64 " to %016" PRIx64 " (%llu bytes) "
                  "before changing it", file->key, from->id, fresh->id,
                  (unsigned long long)length);
    if (err != 0)
        log_error("cannot copy the staged data of '%s' before changing it: %s",
                  file->key, strerror(err));
    else
        log_debug("'%s': %llu bytes copied on write (the old ones are being "
                  "uploaded or journaled)", file->key, (unsigned long long)length);

    pthread_mutex_lock(&writer->lock);
    if (err == 0) {
        freed = unref_locked(file->data);
        file->data = fresh;
        fresh = NULL;
        file->reserved = length;
        writer->stats.copies_on_write++;
    }
    struct staging_file *freed_from = unref_locked(from);
    file->copying = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
    staging_file_free(writer, freed, false);
    staging_file_free(writer, freed_from, false);
    staging_file_free(writer, fresh, false);
    pthread_mutex_lock(&writer->lock);
    return err;
}

/*
 * Begin a change of FILE's data from byte FROM (a write's offset, or a
 * truncate's new size) that grows the file to END, keeping its first KEEP
 * bytes if it must be copied first: waits while the file is held or
 * copied, copies on write when the change would touch sealed bytes,
 * checks the disk has room. Returns with active_writes taken, or an errno.
 */
static int begin_change(struct writer *writer, struct writer_file *file,
                        uint64_t from, uint64_t keep, uint64_t end)
{
    int err = 0;

    if (end > MAX_FILE_SIZE)
        return EFBIG;
    pthread_mutex_lock(&writer->lock);
    for (;;) {
        while (file->held || file->copying)
            pthread_cond_wait(&writer->file_idle, &writer->lock);
        if (from >= sealed_size(file->data))
            break;
        if (!copyable(file)) { /* an edit with holes: wait for the seal */
            pthread_cond_wait(&writer->file_idle, &writer->lock);
            continue;
        }
        err = copy_on_write_locked(writer, file, keep);
        if (err != 0) {
            pthread_mutex_unlock(&writer->lock);
            return err;
        }
    }
    file->active_writes++;
    uint64_t reserved = file->reserved;
    pthread_mutex_unlock(&writer->lock);
    if (end > reserved) {
        uint64_t step = end - reserved > RESERVE_STEP ? end - reserved : RESERVE_STEP;
        err = cache_reserve_disk(writer->conf.cache, step);
        pthread_mutex_lock(&writer->lock);
        if (err == 0 && reserved + step > file->reserved)
            file->reserved = reserved + step;
        if (err != 0) {
            file->active_writes--;
            pthread_cond_broadcast(&writer->file_idle);
        }
        pthread_mutex_unlock(&writer->lock);
    }
    return err;
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
        file->data_gen++;
        file->meta.mtime = clock_wall_now();
        file->mtime_set = false;
        writer->stats.bytes_written += written;
    }
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
}

/*
 * Create FILE's write-behind upload: a write (still under way, so the
 * file is neither held nor copied meanwhile) took it past the multipart
 * threshold from its start. Its upload id goes into the journal: in an
 * `unclosed` entry (nobody was promised this data: after a crash the
 * upload is aborted, the data dropped), or into the file's entry if it
 * has one (the promised version is uploaded after the abort). On failure
 * the file is uploaded the usual way at close.
 */
static void start_writebehind(struct writer *writer, struct writer_file *file)
{
    struct writebehind *wb = NULL;
    struct s3_put_meta put_meta;
    struct journal_entry entry;
    struct staging_file *freed = NULL;

    pthread_mutex_lock(&writer->lock);
    struct writer_meta meta = file->meta;
    char *key = strdup(file->key);
    int fd = file->data->fd;
    pthread_mutex_unlock(&writer->lock);

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
        journal_begin_locked(writer, file);
        promised = has_promise(file);
        struct staging_file *named = promised ? file->entry : file->data;
        if (promised)
            entry_of(named->id, key, file->entry_size, &file->entry_meta,
                     upload_id, false, &entry);
        else
            entry_of(named->id, key, file->size, &meta, upload_id, true, &entry);
        uint64_t old_id = file->entry != NULL && file->entry != named
                              ? file->entry->id : 0;
        pthread_mutex_unlock(&writer->lock);
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
        journal_end_locked(writer, file);
        pthread_mutex_unlock(&writer->lock);
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
    pthread_mutex_unlock(&writer->lock);
    /* parts are read only from now on: every write that ends later tells
     * wb what it changed */
    if (wb != NULL)
        writebehind_wrote(wb, 0, 0, ready);
    staging_file_free(writer, freed, false);
    free(upload_id);
    free(key);
}

int writer_file_write(struct writer_file *file, uint64_t offset, const void *data,
                      size_t len)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, offset, UINT64_MAX, offset + len);
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
    int fd = file->data->fd; /* (no copy while this write is active) */
    pthread_mutex_unlock(&writer->lock);
    while (left > 0) {
        ssize_t done = pwrite(fd, at, left, (off_t)pos);
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
    struct writer *writer = file->writer;
    char *at = buf;

    *got = 0;
    pthread_mutex_lock(&writer->lock);
    uint64_t size = file->size;
    pthread_mutex_unlock(&writer->lock);
    if (offset >= size)
        return 0;
    if (len > size - offset)
        len = (size_t)(size - offset);
    int err = make_present(writer, file, offset, len, false);
    if (err != 0)
        return err;
    /* the staging file of the data now, kept while it is read: a copy on
     * write may replace it meanwhile */
    pthread_mutex_lock(&writer->lock);
    struct staging_file *staging = hold_locked(file->data);
    pthread_mutex_unlock(&writer->lock);
    while (len > 0) {
        ssize_t done = pread(staging->fd, at, len, (off_t)offset);
        if (done < 0 && errno == EINTR)
            continue;
        if (done < 0) {
            err = EIO;
            break;
        }
        if (done == 0) { /* a hole at the end not yet extended: zeros */
            memset(at, 0, len);
            done = (ssize_t)len;
        }
        at += done;
        offset += (uint64_t)done;
        len -= (size_t)done;
        *got += (size_t)done;
    }
    staging_file_drop(writer, &staging);
    return err;
}

int writer_file_truncate(struct writer_file *file, uint64_t size)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, size, size, size);

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
    int fd = file->data->fd;
    pthread_mutex_unlock(&writer->lock);
    if (ftruncate(fd, (off_t)size) != 0)
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
    while (file->held)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    if (meta->mtime.tv_sec != file->meta.mtime.tv_sec ||
        meta->mtime.tv_nsec != file->meta.mtime.tv_nsec)
        file->mtime_set = true;
    file->meta = *meta;
    file->gen++; /* uploaded with the data: the next flush sends it */
    pthread_mutex_unlock(&writer->lock);
}

/* Promise FILE's current version in the journal (writeback close). */
static int promise_current(struct writer *writer, struct writer_file *file)
{
    struct version v;

    pthread_mutex_lock(&writer->lock);
    version_take_locked(writer, file, false, &v);
    pthread_mutex_unlock(&writer->lock);
    int err = promise(writer, file, &v, NULL);
    staging_file_drop(writer, &v.staging);
    return err;
}

int writer_file_flush(struct writer_file *file)
{
    struct writer *writer = file->writer;

    if (!writer->conf.writeback)
        return upload_version(writer, file, false);

    pthread_mutex_lock(&writer->lock);
    while (file->held)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    bool pending = is_pending(file);
    pthread_mutex_unlock(&writer->lock);
    if (!pending)
        return 0;

    /* the promise of writeback mode: durable before close() returns; the
     * upload is queued when the last writer closes (an upload of an older
     * version under way is not waited for) */
    int err = promise_current(writer, file);

    pthread_mutex_lock(&writer->lock);
    if (file->open_writers == 0 && is_pending(file))
        enqueue_locked(writer, file, SETTLE_SECONDS);
    pthread_mutex_unlock(&writer->lock);
    return err;
}

int writer_file_sync(struct writer_file *file)
{
    return upload_version(file->writer, file, false);
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
        enqueue_locked(writer, file, SETTLE_SECONDS);
    pthread_mutex_unlock(&writer->lock);
}

bool writer_file_pending(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool pending = is_pending(file);
    pthread_mutex_unlock(&file->writer->lock);
    return pending;
}

bool writer_file_uploading(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool uploading = file->sending != NULL;
    pthread_mutex_unlock(&file->writer->lock);
    return uploading;
}

/* ------------------------------------------------------ rename, unlink */

/* Wait until FILE may be held by a rename or unlink, and hold it (lock
 * held): no write, copy, upload or journal update of it is under way. */
static void hold_locked_wait(struct writer *writer, struct writer_file *file)
{
    while (file->held || file->sending != NULL || file->journal_busy ||
           file->active_writes > 0 || file->copying)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    file->held = true;
}

/*
 * Move FILE's journal entry to FILE's key (after a rename; FILE is held),
 * deleting REPLACED's entry in the same transaction when REPLACED is not
 * NULL. An unclosed entry only goes: its upload was for the old key.
 */
static int move_entry(struct writer *writer, struct writer_file *file,
                      struct writer_file *replaced)
{
    struct journal_entry entry;
    struct staging_file *freed = NULL;
    uint64_t dels[2];
    size_t del_count = 0;
    int err;

    pthread_mutex_lock(&writer->lock);
    file->journal_busy = true; /* (held: no other journal update runs) */
    bool promised = has_promise(file);
    if (file->entry != NULL && !promised)
        dels[del_count++] = file->entry->id;
    if (promised)
        entry_of(file->entry->id, file->key, file->entry_size, &file->entry_meta,
                 NULL, false, &entry);
    if (replaced != NULL && replaced != file) {
        journal_begin_locked(writer, replaced);
        if (replaced->entry != NULL)
            dels[del_count++] = replaced->entry->id;
    }
    pthread_mutex_unlock(&writer->lock);

    err = promised || del_count > 0
              ? journal_update(writer->conf.journal, &entry, promised ? 1 : 0,
                               dels, del_count)
              : 0;
    if (err != 0)
        log_error("cannot move the journal entry of '%s': %s", file->key,
                  strerror(err));

    pthread_mutex_lock(&writer->lock);
    if (err == 0 && file->entry != NULL && !promised) {
        freed = unref_locked(file->entry);
        file->entry = NULL;
    }
    if (err == 0) {
        free(file->entry_upload_id);
        file->entry_upload_id = NULL;
    }
    struct staging_file *freed_replaced = NULL;
    if (replaced != NULL && replaced != file) {
        if (err == 0 && replaced->entry != NULL) {
            replaced->entry->journal_seal = 0;
            freed_replaced = unref_locked(replaced->entry);
            replaced->entry = NULL;
        }
        journal_end_locked(writer, replaced);
    }
    file->journal_busy = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
    staging_file_free(writer, freed, false);
    staging_file_free(writer, freed_replaced, false);
    return err;
}

int writer_file_hold(struct writer_file *file, enum writer_renamed *state)
{
    struct writer *writer = file->writer;
    int err = 0;

    *state = WRITER_RENAMED_UPLOADED;
    /* a write-behind upload is under way at the old key: finish it there,
     * then the object moves as any uploaded one (if that upload fails,
     * the file is pending again and goes to the new key later) */
    pthread_mutex_lock(&writer->lock);
    bool streamed = file->wb != NULL && is_pending(file);
    uint64_t whole = file->size;
    pthread_mutex_unlock(&writer->lock);
    if (streamed)
        upload_version(writer, file, false);
    /* the base object is about to move or go: fetch what is still there */
    err = make_present(writer, file, 0, whole, false);

    pthread_mutex_lock(&writer->lock);
    hold_locked_wait(writer, file); /* held from here on, even on failure */
    if (err != 0) {
        pthread_mutex_unlock(&writer->lock);
        return err;
    }
    drop_base_locked(file); /* complete: nothing is copied from it now */
    if (is_pending(file))
        *state = has_promise(file) ? WRITER_RENAMED_JOURNALED
                                   : WRITER_RENAMED_UNSAVED;
    /* a write that got in after the upload above may have begun another
     * write-behind upload, for the old key: it goes */
    struct writebehind *stale = file->wb;
    file->wb = NULL;
    pthread_mutex_unlock(&writer->lock);
    writebehind_abandon(&stale); /* (safe on NULL) */
    return 0;
}

int writer_file_rename(struct writer_file *file, const char *new_key,
                       struct writer_file *replaced)
{
    struct writer *writer = file->writer;
    char *copy = strdup(new_key);

    if (copy == NULL)
        return ENOMEM;
    pthread_mutex_lock(&writer->lock);
    assert(file->held);
    free(file->key);
    file->key = copy;
    /* (held: the state writer_file_hold() found has not changed) */
    bool takes_place = is_pending(file) && has_promise(file);
    bool journaled = file->entry != NULL;
    pthread_mutex_unlock(&writer->lock);
    /* the entry names the new key; the replaced file's promise goes in the
     * same transaction only when this one takes its place in the journal
     * (otherwise the caller drops it once the bucket has the new object:
     * writer_file_forget) */
    if (journaled || (takes_place && replaced != NULL))
        return move_entry(writer, file, takes_place ? replaced : NULL);
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
    bool journaled = file->entry != NULL;
    pthread_mutex_unlock(&writer->lock);
    return journaled ? move_entry(writer, file, NULL) : 0; /* (held) */
}

void writer_file_release(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    file->held = false;
    pthread_cond_broadcast(&writer->file_idle);
    pthread_mutex_unlock(&writer->lock);
}

int writer_file_complete(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    uint64_t whole = file->size;
    pthread_mutex_unlock(&writer->lock);
    int err = make_present(writer, file, 0, whole, false);
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && !file->held)
        drop_base_locked(file);
    pthread_mutex_unlock(&writer->lock);
    return err;
}

void writer_file_set_owner(struct writer_file *file, void *owner)
{
    pthread_mutex_lock(&file->writer->lock);
    file->owner = owner;
    pthread_mutex_unlock(&file->writer->lock);
}

void writer_file_relink(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    while (file->held)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    file->unlinked = false;
    bool pending = is_pending(file);
    /* its promise was dropped with the unlink (or the rename that failed
     * had replaced it): promise what it holds again */
    bool promise_again = pending && !(has_promise(file) &&
                                      file->entry_gen >= file->gen) &&
                         (writer->conf.writeback || file->failed);
    pthread_mutex_unlock(&writer->lock);
    if (!pending)
        return;
    int err = promise_again ? promise_current(writer, file) : 0;
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && file->open_writers == 0 && writer->conf.writeback)
        enqueue_locked(writer, file, 0);
    pthread_mutex_unlock(&writer->lock);
}

bool writer_file_unlink(struct writer_file *file, bool forget)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    /* an upload under way lands first: the caller deletes what it made */
    while (file->held || file->sending != NULL)
        pthread_cond_wait(&writer->file_idle, &writer->lock);
    file->unlinked = true;
    bool uploaded = file->uploaded;
    /* its staged data goes as soon as nobody reads it: not at the queue's
     * pace */
    if (dequeue_locked(writer, file))
        file->refs--; /* the caller holds one more: never the last */
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    pthread_mutex_unlock(&writer->lock);
    writebehind_abandon(&wb);
    if (forget)
        forget_entry(writer, file, 0);
    return uploaded;
}

void writer_file_forget(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool unlinked = file->unlinked;
    pthread_mutex_unlock(&file->writer->lock);
    if (unlinked)
        forget_entry(file->writer, file, 0);
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
    err = staging_dir_open(cache_dir_path(conf->cache), &writer->staging);
    if (err != 0)
        goto out;
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
    staging_dir_close(&writer->staging);
    pthread_mutex_destroy(&writer->lock);
    pthread_cond_destroy(&writer->file_idle);
    pthread_cond_destroy(&writer->work_queued);
    pthread_cond_destroy(&writer->upload_done);
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

/*
 * The drain's last try for a pending file the journal does not hold (its
 * promise could not be written before: a full or failing disk): promise
 * it now, or failing that, keep its promise beside its staging file
 * (staging_mark), which the next mount puts back into the journal. Its
 * staged data is kept either way (it is pending).
 */
static void promise_at_drain(struct writer *writer, struct writer_file *file)
{
    struct version v;
    struct journal_entry entry;
    unsigned char *record = NULL;
    size_t len = 0;

    pthread_mutex_lock(&writer->lock);
    version_take_locked(writer, file, false, &v);
    char *key = strdup(file->key);
    pthread_mutex_unlock(&writer->lock);
    int err = promise(writer, file, &v, NULL);
    if (err != 0 && key != NULL) {
        entry_of(v.staging->id, key, v.size, &v.meta, NULL, false, &entry);
        err = journal_record_encode(&entry, &record, &len);
        if (err == 0)
            err = staging_sync(writer->staging, v.staging->fd, key);
        if (err == 0)
            err = staging_mark(writer->staging, v.staging->id, record, len);
        if (err == 0) {
            log_warn("'%s': the journal refuses it; its promise is kept in "
                     "%s for the next mount", key,
                     staging_dir_path(writer->staging));
            pthread_mutex_lock(&writer->lock);
            file->marked = true;
            pthread_mutex_unlock(&writer->lock);
        }
    }
    free(record);
    free(key);
    staging_file_drop(writer, &v.staging);
}

uint64_t writer_drain(struct writer *writer)
{
    uint64_t left = 0;

    pthread_mutex_lock(&writer->lock);
    writer->draining = true;
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file))
            enqueue_locked(writer, file, 0);
    pthread_cond_broadcast(&writer->work_queued);
    while (writer->queue_head != NULL || writer->running > 0)
        pthread_cond_wait(&writer->upload_done, &writer->lock);
    /* what is left must be in the journal for the next mount: a promise
     * that could not be written before (a full disk, an I/O error) gets
     * one more try now */
    for (;;) {
        struct writer_file *file = writer->all;
        while (file != NULL && !(is_pending(file) && !has_promise(file) &&
                                 !file->drain_tried))
            file = file->all_next;
        if (file == NULL)
            break;
        file->drain_tried = true; /* (tried once here) */
        file->refs++;
        pthread_mutex_unlock(&writer->lock);
        promise_at_drain(writer, file);
        writer_file_put(&file);
        pthread_mutex_lock(&writer->lock);
    }
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file)) {
            left++;
            if (has_promise(file) || file->marked)
                log_error("'%s' could not be uploaded; it stays in the cache "
                          "directory and the next mount uploads it", file->key);
            else
                log_error("'%s' could not be uploaded, nor recorded in the "
                          "journal: its data is lost when this mount ends",
                          file->key);
        }
    pthread_mutex_unlock(&writer->lock);
    return left;
}

/* ------------------------------------------------------------- recovery */

/* A journal entry read back, its strings copied. */
struct recovered {
    struct journal_entry entry;
    char *key, *upload_id;
};

struct recovery {
    struct writer *writer;
    writer_adopt_fn adopt;
    void *arg;
    struct recovered *entries;   /* every entry, in id order */
    size_t count, capacity;
    uint64_t *ids;               /* ids of staging files kept (sorted) */
    size_t id_count;
    unsigned queued;
};

static int collect_entry(void *arg, const struct journal_entry *entry)
{
    struct recovery *recovery = arg;

    if (recovery->count == recovery->capacity) {
        size_t capacity = recovery->capacity ? recovery->capacity * 2 : 64;
        void *grown = realloc(recovery->entries, capacity * sizeof(*recovery->entries));
        if (grown == NULL)
            return ENOMEM;
        recovery->entries = grown;
        recovery->capacity = capacity;
    }
    struct recovered *copy = &recovery->entries[recovery->count];
    copy->entry = *entry;
    copy->key = strdup(entry->key);
    copy->upload_id = entry->upload_id != NULL ? strdup(entry->upload_id) : NULL;
    if (copy->key == NULL || (entry->upload_id != NULL && copy->upload_id == NULL)) {
        free(copy->key);
        free(copy->upload_id);
        return ENOMEM;
    }
    copy->entry.key = copy->key;
    copy->entry.upload_id = copy->upload_id;
    recovery->count++;
    return 0;
}

static int compare_by_key(const void *a, const void *b)
{
    const struct recovered *x = a, *y = b;
    int order = strcmp(x->key, y->key);
    if (order != 0)
        return order;
    return x->entry.id < y->entry.id ? -1 : x->entry.id > y->entry.id;
}

static int compare_ids(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Upload the promise ENTRY again: a file for it, attached and queued.
 * Returns whether its staging file is kept. */
static bool recover_promise(struct recovery *recovery, const struct journal_entry *entry)
{
    struct writer *writer = recovery->writer;
    struct writer_meta meta = {
        .mode = entry->mode, .uid = entry->uid, .gid = entry->gid,
        .mtime = entry->mtime,
    };
    struct staging_file *staging = calloc(1, sizeof(*staging));
    struct writer_file *file = NULL;
    char path[PATH_MAX];
    struct stat st;

    if (entry->upload_id != NULL)
        upload_abort(&writer->upload, entry->key, entry->upload_id);
    staging_path(writer->staging, entry->id, path, sizeof(path));
    int err = staging == NULL ? ENOMEM
            : staging_open(writer->staging, entry->id, &staging->fd);
    if (err == 0 && (fstat(staging->fd, &st) != 0 ||
                     (uint64_t)st.st_size < entry->size)) {
        close(staging->fd);
        err = ENODATA;
    }
    if (err != 0) {
        log_error("the journal names '%s' but its staging file %s is %s; it "
                  "cannot be uploaded and is dropped from the journal",
                  entry->key, path, err == ENODATA ? "shorter" : "missing");
        free(staging);
        journal_del(writer->conf.journal, entry->id);
        return false;
    }
    if ((uint64_t)st.st_size > entry->size) {
        /* appended to after it was closed, never closed again: what was
         * closed is what goes */
        log_info("'%s': uploading the %llu bytes that were closed (%llu more "
                 "were written and not closed before the crash)", entry->key,
                 (unsigned long long)entry->size,
                 (unsigned long long)((uint64_t)st.st_size - entry->size));
        if (ftruncate(staging->fd, (off_t)entry->size) != 0)
            log_warn("'%s': cannot cut its staging file to what was closed: %s",
                     entry->key, strerror(errno));
    }
    log_debug("'%s': recovering %016" PRIx64 " (%llu bytes)", entry->key,
              entry->id, (unsigned long long)entry->size);
    staging->id = entry->id;
    staging->refs = 2; /* data and entry */
    staging->journal_seal = entry->size;
    if (file_new(writer, staging, entry->key, &meta, NULL, &file) != 0) {
        staging_file_free(writer, staging, true);
        return true; /* the entry stays for the next mount */
    }
    file->size = entry->size;
    file->reserved = entry->size;
    file->gen = file->data_gen = 1;
    file->uploaded_gen = 0;
    file->entry = staging;
    file->entry_gen = file->entry_data_gen = 1;
    file->entry_size = entry->size;
    file->entry_meta = meta;
    if (entry->upload_id != NULL) {
        /* the aborted upload is gone: the entry without it */
        struct journal_entry again = *entry;
        again.upload_id = NULL;
        journal_put(writer->conf.journal, &again);
    }
    if (recovery->adopt != NULL)
        recovery->adopt(recovery->arg, writer_file_ref(file), entry->key,
                        entry->size, &meta);
    pthread_mutex_lock(&writer->lock);
    enqueue_locked(writer, file, 0);
    pthread_mutex_unlock(&writer->lock);
    writer_file_put(&file);
    recovery->queued++;
    return true;
}

static int sweep_staging(void *arg, uint64_t id)
{
    struct recovery *recovery = arg;

    if (recovery->id_count > 0 &&
        bsearch(&id, recovery->ids, recovery->id_count, sizeof(uint64_t),
                compare_ids) != NULL)
        return 0;
    /* a record this version cannot read may name promised data; an
     * unclosed entry whose abort failed keeps its data until a later
     * mount removes both */
    if (!journal_has(recovery->writer->conf.journal, id))
        staging_remove(recovery->writer->staging, id);
    return 0;
}

/* A promise a drain kept beside its staging file: back into the journal,
 * and recovered with the journal's entries. */
static int collect_mark(void *arg, uint64_t id, const void *record, size_t len)
{
    struct recovery *recovery = arg;
    struct writer *writer = recovery->writer;
    struct journal_entry entry;
    unsigned char key[8];
    char *strings = NULL;
    const char *why = NULL;

    for (unsigned i = 0; i < 8; i++)
        key[i] = (unsigned char)(id >> (8 * (7 - i)));
    if (journal_has(writer->conf.journal, id)) {
        staging_unmark(writer->staging, id); /* the journal has it again */
        return 0;
    }
    int err = journal_record_decode(key, sizeof(key), record, len, &entry,
                                    &strings, &why);
    if (err != 0) {
        log_error("a promise kept in %s (%016" PRIx64 ") does not decode (%s); "
                  "it is left there", staging_dir_path(writer->staging), id,
                  why != NULL ? why : strerror(err));
        return 0;
    }
    err = journal_put(writer->conf.journal, &entry);
    if (err == 0)
        staging_unmark(writer->staging, id);
    else
        log_error("'%s': the journal still refuses it (%s); it is uploaded "
                  "now and its promise stays beside it", entry.key,
                  strerror(err));
    err = collect_entry(recovery, &entry);
    free(strings);
    return err;
}

int writer_recover(struct writer *writer, writer_adopt_fn adopt, void *arg)
{
    struct recovery recovery = {.writer = writer, .adopt = adopt, .arg = arg};
    int err = journal_scan(writer->conf.journal, collect_entry, &recovery);

    if (err == 0)
        err = staging_scan_marks(writer->staging, collect_mark, &recovery);

    if (err == 0 && recovery.count > 0 &&
        (recovery.ids = calloc(recovery.count, sizeof(uint64_t))) == NULL)
        err = ENOMEM;
    if (err == 0 && recovery.count > 0)
        qsort(recovery.entries, recovery.count, sizeof(*recovery.entries),
              compare_by_key);
    for (size_t i = 0; err == 0 && i < recovery.count; i++) {
        const struct journal_entry *entry = &recovery.entries[i].entry;
        if (entry->unclosed) {
            /* written when the crash came, never closed: nobody was
             * promised its data (its staging file goes with the others
             * not kept); only its write-behind upload is to be aborted */
            int aborted = entry->upload_id != NULL
                ? upload_abort(&writer->upload, entry->key, entry->upload_id) : 0;
            if (aborted == 0)
                journal_del(writer->conf.journal, entry->id);
            else
                log_warn("cannot abort the unfinished upload of '%s' (%s); the "
                         "next mount tries again", entry->key, strerror(aborted));
            continue;
        }
        /* one promise per key: the journal replaces an entry in the same
         * transaction as it writes the next, so two would be a defect;
         * the newest (the last one here) is the one kept */
        bool superseded = false;
        for (size_t j = i + 1; j < recovery.count; j++) {
            if (strcmp(recovery.entries[j].key, entry->key) != 0)
                break;
            superseded = superseded || !recovery.entries[j].entry.unclosed;
        }
        if (superseded) {
            log_warn("the journal holds more than one upload of '%s'; the "
                     "newest one goes, entry %016" PRIx64 " is dropped",
                     entry->key, entry->id);
            journal_del(writer->conf.journal, entry->id);
            continue;
        }
        if (recover_promise(&recovery, entry))
            recovery.ids[recovery.id_count++] = entry->id;
    }
    if (recovery.queued > 0)
        log_info("uploading %u file%s written before the last mount ended",
                 recovery.queued, recovery.queued == 1 ? "" : "s");
    /* staging files no entry keeps were never closed (or were being
     * written when the crash came: their entries are gone) */
    if (err == 0) {
        if (recovery.id_count > 0)
            qsort(recovery.ids, recovery.id_count, sizeof(uint64_t), compare_ids);
        staging_scan(writer->staging, sweep_staging, &recovery);
    }
    for (size_t i = 0; i < recovery.count; i++) {
        free(recovery.entries[i].key);
        free(recovery.entries[i].upload_id);
    }
    free(recovery.entries);
    free(recovery.ids);
    return err;
}
