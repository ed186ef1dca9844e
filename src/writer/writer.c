/*
 * writer.c - staged files, their uploads and the journal (see writer.h):
 * the API of writer.h. The other parts are listed in writer_internal.h.
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
 *   unwritten_*   a write or truncate that failed (a full disk, a failed
 *                 fetch of an edit's base) left a range of the file other
 *                 than what was asked for: until it is written again or
 *                 cut off, the file's data is neither promised (close()
 *                 and fsync() return that errno) nor uploaded, but its
 *                 last promise still is. So a rewrite that fails never
 *                 puts a short or empty object in place of a good one.
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
 * abandons it (its parts read the old staging file), and so does a
 * rename (writer_file_hold): its bytes were never closed, and the file
 * goes up under its new name at its close.
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

#include "writer/writer_internal.h"

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

#include "base/clock.h"
#include "base/log.h"
#include "writer/staging.h"
#include "writer/upload.h"
#include "writer/writebehind.h"

#define RESERVE_STEP (8ull << 20)   /* disk checked per 8 MiB of growth */
#define MAX_FILE_SIZE (5ull << 40)  /* S3's largest object */
#define SETTLE_SECONDS 0.2          /* writeback: wait this long after the
                                       last close before uploading, so a
                                       file reopened at once (the Hugging
                                       Face hub appends in a second open)
                                       is uploaded once */

/* A new file for KEY (see writer_file_create), not published yet. */
static int file_create(struct writer *writer, const char *key,
                       const struct writer_meta *meta, bool dirty, void *owner,
                       struct writer_file **out)
{
    struct staging_file *data = NULL;
    int err = writer_staging_new(writer, &data);

    *out = NULL;
    if (err != 0)
        return err;
    err = writer_file_new(writer, data, key, meta, owner, out);
    if (err != 0) {
        writer_staging_free(writer, data, false);
        return err;
    }
    (*out)->gen = dirty ? 1 : 0;
    (*out)->uploaded_gen = 0;
    return 0;
}

int writer_file_create(struct writer *writer, const char *key,
                       const struct writer_meta *meta, bool dirty, void *owner,
                       struct writer_file **out)
{
    int err = file_create(writer, key, meta, dirty, owner, out);

    if (err == 0)
        writer_file_publish(writer, *out);
    return err;
}

int writer_file_create_edit(struct writer *writer, const char *key,
                            const struct writer_meta *meta, const char *etag,
                            uint64_t size, void *owner, struct writer_file **out)
{
    struct writer_file *file = NULL;
    int err = file_create(writer, key, meta, false, owner, &file);

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
        writer_file_discard(writer, file);
        return err;
    }
    snprintf(file->base_etag, sizeof(file->base_etag), "%s", etag);
    file->base_size = size;
    file->base_limit = size;
    file->reserved = size; /* fetched bytes are not checked for room */
    file->granules = granules;
    file->missing = granules;
    file->size = size;
    writer_file_publish(writer, file);
    *out = file;
    return 0;
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
        writer_wait(writer, &writer->file_idle);
    uint64_t length = keep < file->size ? keep : file->size;
    struct staging_file *from = hold_locked(file->data);
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    writer_unlock(writer);

    writebehind_abandon(&wb);
    int err = cache_reserve_disk(writer->conf.cache, length);
    if (err == ENOSPC)
        cache_disk_full(writer->conf.cache);
    if (err == 0)
        err = writer_staging_new(writer, &fresh);
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
    writer_unlock(writer);
    writer_staging_free(writer, freed, false);
    writer_staging_free(writer, freed_from, false);
    writer_staging_free(writer, fresh, false);
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
            writer_wait(writer, &writer->file_idle);
        if (from >= sealed_size(file->data))
            break;
        if (!writer_copyable(file)) { /* an edit with holes: wait for the seal */
            writer_wait(writer, &writer->file_idle);
            continue;
        }
        err = copy_on_write_locked(writer, file, keep);
        if (err != 0) {
            writer_unlock(writer);
            return err;
        }
    }
    file->active_writes++;
    uint64_t reserved = file->reserved;
    writer_unlock(writer);
    if (end > reserved) {
        uint64_t need = end - reserved;
        uint64_t step = need > RESERVE_STEP ? need : RESERVE_STEP;
        err = cache_reserve_disk(writer->conf.cache, step);
        /* a disk with less than a step left still takes what fits */
        if (err == ENOSPC && step > need) {
            step = need;
            err = cache_reserve_disk(writer->conf.cache, step);
        }
        if (err == ENOSPC)
            cache_disk_full(writer->conf.cache);
        pthread_mutex_lock(&writer->lock);
        if (err == 0 && reserved + step > file->reserved)
            file->reserved = reserved + step;
        if (err != 0) {
            file->active_writes--;
            pthread_cond_broadcast(&writer->file_idle);
        }
        writer_unlock(writer);
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
    writer_unlock(writer);
}

int writer_file_write(struct writer_file *file, uint64_t offset, const void *data,
                      size_t len)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, offset, UINT64_MAX, offset + len);
    const char *at = data;
    uint64_t pos = offset;
    size_t left = len;

    if (err != 0) {
        /* (nothing of it landed: a version taken meanwhile is whole) */
        pthread_mutex_lock(&writer->lock);
        writer_unwritten_add_locked(file, offset, offset + len, err);
        writer_unlock(writer);
        return err;
    }
    /* an edit: the base's bytes around the written range first */
    err = writer_make_present(writer, file, offset, len, true);
    if (err != 0) {
        pthread_mutex_lock(&writer->lock);
        writer_settle_covered_locked(writer, file, offset, len, 0);
        writer_unwritten_add_locked(file, offset, offset + len, err);
        writer_unlock(writer);
        end_change(writer, file, false, 0, false, 0);
        return err;
    }
    pthread_mutex_lock(&writer->lock);
    writer_mark_written_locked(file, offset, len);
    int fd = file->data->fd; /* (no copy while this write is active) */
    writer_unlock(writer);
    while (left > 0) {
        ssize_t done = pwrite(fd, at, left, (off_t)pos);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0) {
            err = done < 0 && (errno == ENOSPC || errno == EDQUOT) ? ENOSPC : EIO;
            if (err == EIO)
                log_error("staging file of '%s': write: %s", file->key,
                          strerror(errno));
            else
                cache_disk_full(writer->conf.cache);
            break;
        }
        at += done;
        pos += (uint64_t)done;
        left -= (size_t)done;
    }
    pthread_mutex_lock(&writer->lock);
    writer_settle_covered_locked(writer, file, offset, len, pos - offset);
    /* (before end_change: no version is taken with part of a failed
     * write in it and no mark of it) */
    if (err != 0)
        writer_unwritten_add_locked(file, offset, offset + len, err);
    else
        writer_unwritten_cover_locked(file, offset, offset + len);
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
    writer_unlock(writer);
    /* (wb cannot be finished meanwhile: this write holds active_writes) */
    if (wb != NULL && pos > offset)
        writebehind_wrote(wb, offset, pos - offset, ready);
    else if (start)
        writer_start_writebehind(writer, file);
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
    writer_unlock(writer);
    if (offset >= size)
        return 0;
    if (len > size - offset)
        len = (size_t)(size - offset);
    int err = writer_make_present(writer, file, offset, len, false);
    if (err != 0)
        return err;
    /* the staging file of the data now, kept while it is read: a copy on
     * write may replace it meanwhile */
    pthread_mutex_lock(&writer->lock);
    struct staging_file *staging = hold_locked(file->data);
    writer_unlock(writer);
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
    writer_staging_drop(writer, &staging);
    return err;
}

/* A truncate of FILE to SIZE failed with ERR (lock held, FILE's size
 * still the old one): the bytes between the two sizes are not as asked. */
static void truncate_failed_locked(struct writer_file *file, uint64_t size,
                                   int err)
{
    uint64_t low = size < file->size ? size : file->size;
    uint64_t high = size < file->size ? file->size : size;

    writer_unwritten_add_locked(file, low, high, err);
}

int writer_file_truncate(struct writer_file *file, uint64_t size)
{
    struct writer *writer = file->writer;
    int err = begin_change(writer, file, size, size, size);

    if (err != 0) {
        pthread_mutex_lock(&writer->lock);
        truncate_failed_locked(file, size, err);
        writer_unlock(writer);
        return err;
    }
    pthread_mutex_lock(&writer->lock);
    if (size < file->base_limit) {
        /* past SIZE the base is gone: zeros if the file grows again; a
         * fetch already under way there must land before the cut */
        writer_mark_written_locked(file, size, file->base_limit - size);
        file->base_limit = size;
        for (uint64_t g = size / GRANULE; g < file->granules; g++)
            while (bit_get(file->loading, g))
                writer_wait(writer, &writer->file_idle);
        /* nothing is left to fetch in granules wholly past the cut (the
         * staging file holds what they are: zeros): without this an edit
         * cut short would never be complete, and a write over promised
         * bytes would wait for their upload instead of copying them */
        for (uint64_t g = (size + GRANULE - 1) / GRANULE; g < file->granules; g++)
            if (!bit_get(file->present, g)) {
                bit_set(file->present, g, true);
                file->missing--;
            }
    }
    int fd = file->data->fd;
    writer_unlock(writer);
    if (ftruncate(fd, (off_t)size) != 0)
        err = errno == ENOSPC || errno == EDQUOT ? ENOSPC : EIO;
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && size < file->seq_end)
        file->seq_end = size;
    if (err != 0)
        truncate_failed_locked(file, size, err);
    else
        writer_unwritten_cover_locked(file, size, UINT64_MAX);
    struct writebehind *wb = err == 0 ? file->wb : NULL;
    writer_unlock(writer);
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
    writer_unlock(file->writer);
}

void writer_file_set_meta(struct writer_file *file, const struct writer_meta *meta)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    while (file->held)
        writer_wait(writer, &writer->file_idle);
    if (meta->mtime.tv_sec != file->meta.mtime.tv_sec ||
        meta->mtime.tv_nsec != file->meta.mtime.tv_nsec)
        file->mtime_set = true;
    file->meta = *meta;
    file->gen++; /* uploaded with the data: the next flush sends it */
    writer_unlock(writer);
}

int writer_file_flush(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    if (is_pending(file))
        file->closed_at = clock_wall_now(); /* its age in `s3cachefs pending` */
    if (!writer->conf.writeback) {
        writer_unlock(writer);
        return writer_upload_version(writer, file, WRITER_UPLOAD_CURRENT);
    }
    while (file->held)
        writer_wait(writer, &writer->file_idle);
    bool pending = is_pending(file);
    writer_unlock(writer);
    if (!pending)
        return 0;

    /* the promise of writeback mode: durable before close() returns; the
     * upload is queued when the last writer closes (an upload of an older
     * version under way is not waited for) */
    int err = writer_promise_current(writer, file);

    pthread_mutex_lock(&writer->lock);
    if (file->open_writers == 0 && is_pending(file))
        writer_enqueue_locked(writer, file, SETTLE_SECONDS);
    writer_unlock(writer);
    return err;
}

int writer_file_sync(struct writer_file *file)
{
    return writer_upload_version(file->writer, file, WRITER_UPLOAD_CURRENT);
}

void writer_file_open_writer(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    file->open_writers++;
    writer_unlock(file->writer);
}

void writer_file_close_writer(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    if (file->open_writers > 0)
        file->open_writers--;
    if (file->open_writers == 0 && writer->conf.writeback && is_pending(file))
        writer_enqueue_locked(writer, file, SETTLE_SECONDS);
    writer_unlock(writer);
}

bool writer_file_pending(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool pending = is_pending(file);
    writer_unlock(file->writer);
    return pending;
}

bool writer_file_uploading(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool uploading = file->sending != NULL;
    writer_unlock(file->writer);
    return uploading;
}

/* ------------------------------------------------------ rename, unlink */

/* Wait until FILE may be held by a rename or unlink, and hold it (lock
 * held): no write, copy, upload or journal update of it is under way. */
static void hold_locked_wait(struct writer *writer, struct writer_file *file)
{
    while (file->held || file->sending != NULL || file->journal_busy ||
           file->active_writes > 0 || file->copying)
        writer_wait(writer, &writer->file_idle);
    file->held = true;
}

int writer_file_hold(struct writer_file *file, enum writer_renamed *state)
{
    struct writer *writer = file->writer;
    int err = 0;

    *state = WRITER_RENAMED_UPLOADED;
    pthread_mutex_lock(&writer->lock);
    uint64_t whole = file->size;
    writer_unlock(writer);
    /* the base object is about to move or go: fetch what is still there */
    err = writer_make_present(writer, file, 0, whole, false);

    pthread_mutex_lock(&writer->lock);
    hold_locked_wait(writer, file); /* held from here on, even on failure */
    if (err != 0) {
        writer_unlock(writer);
        return err;
    }
    writer_drop_base_locked(file); /* complete: nothing is copied from it now */
    if (is_pending(file))
        *state = has_promise(file) ? WRITER_RENAMED_JOURNALED
                                   : WRITER_RENAMED_UNSAVED;
    /* a write-behind upload (of a file being written, never closed) is
     * for the old key and holds bytes nobody closed: it goes, and the
     * file is uploaded under its new name when it is closed. Finishing it
     * would put those bytes in the bucket in place of the last saved
     * version. */
    struct writebehind *stale = file->wb;
    file->wb = NULL;
    writer_unlock(writer);
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
    writer_unlock(writer);
    /* the entry names the new key; the replaced file's promise goes in the
     * same transaction only when this one takes its place in the journal
     * (otherwise the caller drops it once the bucket has the new object:
     * writer_file_forget) */
    if (journaled || (takes_place && replaced != NULL))
        return writer_move_entry(writer, file, takes_place ? replaced : NULL);
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
    writer_unlock(writer);
    return journaled ? writer_move_entry(writer, file, NULL) : 0; /* (held) */
}

void writer_file_release(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    file->held = false;
    pthread_cond_broadcast(&writer->file_idle);
    writer_unlock(writer);
}

void writer_file_set_owner(struct writer_file *file, void *owner)
{
    pthread_mutex_lock(&file->writer->lock);
    file->owner = owner;
    writer_unlock(file->writer);
}

void writer_file_relink(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    while (file->held)
        writer_wait(writer, &writer->file_idle);
    file->unlinked = false;
    bool pending = is_pending(file);
    /* its promise was dropped with the unlink (or the rename that failed
     * had replaced it): promise what it holds again */
    bool promise_again = pending && !(has_promise(file) &&
                                      file->entry_gen >= file->gen) &&
                         (writer->conf.writeback || file->failed);
    writer_unlock(writer);
    if (!pending)
        return;
    int err = promise_again ? writer_promise_current(writer, file) : 0;
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && file->open_writers == 0 && writer->conf.writeback)
        writer_enqueue_locked(writer, file, 0);
    writer_unlock(writer);
}

bool writer_file_unlink(struct writer_file *file, bool forget)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    /* an upload under way lands first: the caller deletes what it made */
    while (file->held || file->sending != NULL)
        writer_wait(writer, &writer->file_idle);
    file->unlinked = true;
    writer_sync_touch_locked(writer, file);
    pthread_cond_broadcast(&writer->file_idle); /* (a sync waiting for it) */
    bool uploaded = file->uploaded;
    /* its staged data goes as soon as nobody reads it: not at the queue's
     * pace */
    if (writer_dequeue_locked(writer, file))
        file->refs--; /* the caller holds one more: never the last */
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    writer_unlock(writer);
    writebehind_abandon(&wb);
    if (forget)
        writer_forget_entry(writer, file, 0);
    return uploaded;
}

void writer_file_forget(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    bool unlinked = file->unlinked;
    writer_unlock(file->writer);
    if (unlinked)
        writer_forget_entry(file->writer, file, 0);
}

bool writer_file_etag(struct writer_file *file, char *etag_out)
{
    pthread_mutex_lock(&file->writer->lock);
    bool uploaded = file->uploaded && !is_dirty(file);
    if (uploaded)
        snprintf(etag_out, S3_ETAG_MAX, "%s", file->etag);
    writer_unlock(file->writer);
    return uploaded;
}

void writer_file_copied(struct writer_file *file, const char *etag)
{
    pthread_mutex_lock(&file->writer->lock);
    if (file->uploaded && !is_dirty(file))
        snprintf(file->etag, sizeof(file->etag), "%s", etag);
    writer_unlock(file->writer);
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
        .abort_failed = writer_keep_orphan,
        .abort_failed_arg = writer,
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
    if (err == 0)
        err = writer_markers_create(writer, &writer->markers);
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
                             writer_uploader_main, writer);
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
    writer_markers_destroy(&writer->markers);
    pthread_mutex_lock(&writer->lock);
    writer->stopping = true;
    pthread_cond_broadcast(&writer->work_queued);
    writer_unlock(writer);
    for (unsigned i = 0; i < writer->thread_count; i++)
        pthread_join(writer->threads[i], NULL);
    free(writer->threads);
    while (writer->orphans != NULL) {
        struct orphan_upload *orphan = writer->orphans;
        writer->orphans = orphan->next;
        free(orphan->key);
        free(orphan->upload_id);
        free(orphan);
    }
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
    out->syncs_waiting = 0;
    for (struct sync_waiter *w = writer->sync_waiters; w != NULL; w = w->next)
        out->syncs_waiting++;
    out->uploads_running = writer->running;
    writer_unlock(writer);
    /* (the markers' lock is a leaf, not taken under the writer's) */
    out->uploads_pending += writer_markers_count(writer->markers);
}

uint64_t writer_drain(struct writer *writer)
{
    uint64_t left = 0;

    pthread_mutex_lock(&writer->lock);
    writer->draining = true;
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file))
            writer_enqueue_locked(writer, file, 0);
    pthread_cond_broadcast(&writer->work_queued);
    while (writer->queue_head != NULL || writer->running > 0)
        writer_wait(writer, &writer->upload_done);
    /* what is left must be in the journal for the next mount: a promise
     * that could not be written before (a full disk, an I/O error) gets
     * one more try now; data with bytes a write failed to write is
     * nobody's to promise */
    for (;;) {
        struct writer_file *file = writer->all;
        while (file != NULL && !(is_pending(file) && !has_promise(file) &&
                                 file->unwritten_err == 0 && !file->drain_tried))
            file = file->all_next;
        if (file == NULL)
            break;
        file->drain_tried = true; /* (tried once here) */
        file->refs++;
        writer_unlock(writer);
        writer_promise_at_drain(writer, file);
        writer_file_put(&file);
        pthread_mutex_lock(&writer->lock);
    }
    for (struct writer_file *file = writer->all; file != NULL; file = file->all_next)
        if (is_pending(file)) {
            left++;
            if (file->unwritten_err != 0)
                log_error("'%s' is not uploaded: a write to it failed (%s) "
                          "and its bytes were not written again; %s",
                          file->key, strerror(file->unwritten_err),
                          has_promise(file)
                              ? "the next mount uploads its last closed "
                                "version"
                              : "its data is dropped, and the bucket keeps "
                                "what it had");
            else if (has_promise(file) || file->marked)
                log_error("'%s' could not be uploaded; it stays in the cache "
                          "directory and the next mount uploads it", file->key);
            else
                log_error("'%s' could not be uploaded, nor recorded in the "
                          "journal: its data is lost when this mount ends",
                          file->key);
        }
    writer_unlock(writer);
    left += writer_marker_drain(writer);
    /* (a multipart upload whose abort failed is no loss of data) */
    writer_abort_orphans(writer);
    return left;
}
