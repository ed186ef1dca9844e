/*
 * writer_sync.c - what `s3cachefs sync` and `s3cachefs pending` ask of the
 * writer (see writer.h and HACKING.md, "Sync and pending"): every pending
 * file uploaded now and waited for, the list of pending files, and a
 * pending file given up.
 *
 * A sync takes, under the writer lock, the files pending when it begins
 * (a reference each) and the version it waits for in each:
 *   - nobody has it open for writing: its current version (gen);
 *   - open for writing: its last closed version, the one its journal
 *     entry promises (entry_gen); with no promise it is NOT_CLOSED and not
 *     waited for. Bytes not closed are not "written so far": nobody was
 *     told they were saved, their close will upload or journal them, and
 *     a sync could only guess when the writer is done with them.
 * Each file waited for gets sync_wanted (the uploaders then send the
 * promise of a file open for writing in writeback mode, which they skip
 * otherwise) and is made due now: a queued file's settle delay or retry
 * backoff is cut to now, one not queued is queued. Then the sync waits on
 * file_idle (every attempt of writer_upload_version() broadcasts it as it
 * ends, so does an unlink or a drop) and decides each file, lock held:
 *   UPLOADED  uploaded_gen reached the version (a later one counts), and
 *             the attempt that got it there has concluded (its journal
 *             entry is gone and the fs layer was told: a `pending` right
 *             after the sync does not list it);
 *   REMOVED   unlinked or dropped meanwhile;
 *   FAILED    an attempt that began after the sync began (attempts past
 *             attempts_before: the one under way at the start does not
 *             count) ended with an errno; one attempt decides, since the
 *             S3 client spent its retries within request_timeout, and the
 *             background retries go on afterwards;
 *   NOT_CLOSED (later) it was opened for writing again and its promise
 *             does not hold the version: nothing can send that version;
 *   WAITING   what is left when the caller interrupts the sync.
 * A file undecided with no upload under way nor queued is queued again
 * (an attempt that sent an older version, or nothing): each such attempt
 * either reaches the version or fails, so the loop ends.
 *
 * The sync holds no lock across I/O (it only waits), and takes no lock
 * but the writer's. It looks at every file once; afterwards only at what
 * changed: a sync_waiter on the writer's list collects the files it may
 * wait for whose attempt ended or that were unlinked or dropped
 * (writer_sync_touch_locked()), so a sync of N files costs O(N log N)
 * under the lock rather than a pass over the undecided files per upload
 * (for 100,000 small files, minutes of the lock held). A waiter whose
 * list could not grow looks at every file again.
 */
#include "config.h"

#include "writer/writer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "writer/journal.h"

/* One file a sync waits for. */
struct target {
    struct writer_file *file;     /* a reference */
    uint64_t gen;                 /* the version waited for */
    uint64_t size;                /* its bytes */
    unsigned attempts_before;     /* attempts begun before the sync */
    bool concluding;              /* in the bucket, its upload concluding: */
    unsigned concluded_after;     /* decided once attempts pass this */
    bool wanted;                  /* counted in file->sync_wanted */
    enum writer_sync_outcome outcome; /* WAITING until decided */
    int err;
};

/* Targets in the order of their files' addresses, for target_of(). */
static int compare_targets(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct target *)a)->file;
    uintptr_t y = (uintptr_t)((const struct target *)b)->file;

    return x < y ? -1 : x > y;
}

/* The target of FILE among TARGETS (COUNT, sorted), or NULL. */
static struct target *target_of(struct target *targets, size_t count,
                                struct writer_file *file)
{
    struct target key = {.file = file};

    return count > 0 ? bsearch(&key, targets, count, sizeof(*targets),
                               compare_targets)
                     : NULL;
}

/* FILE is to go up now (lock held): a settle delay or a retry's backoff
 * ends now; a file not queued (its upload under way ended with an older
 * version) is queued. Whether the uploaders must be woken. */
static bool hurry_locked(struct writer *writer, struct writer_file *file)
{
    double now = clock_monotonic_seconds();

    if (file->sending != NULL)
        return false; /* (decided, or queued again, once it ends) */
    if (file->queued) {
        if (file->due <= now)
            return false;
        file->due = now;
        return true;
    }
    writer_enqueue_locked(writer, file, 0);
    return true;
}

/* Decide T if its file allows it now (lock held); an undecided file is
 * hurried. Whether the uploaders must be woken. */
static bool decide_locked(struct writer *writer, struct target *t)
{
    struct writer_file *file = t->file;

    if (file->uploaded_gen >= t->gen) {
        /* the upload that got it there concludes first (its journal
         * entry dropped, the fs layer told): the attempt under way now,
         * if any, is that one or a later one */
        if (file->sending == NULL ||
            (t->concluding && file->attempts > t->concluded_after))
            t->outcome = WRITER_SYNC_UPLOADED;
        else if (!t->concluding) {
            t->concluding = true;
            t->concluded_after = file->attempts;
        }
        return false;
    }
    if (file->unlinked) {
        t->outcome = WRITER_SYNC_REMOVED;
        return false;
    }
    if (file->attempts > t->attempts_before && file->attempt_err != 0) {
        t->outcome = WRITER_SYNC_FAILED;
        t->err = file->attempt_err;
        return false;
    }
    if (file->sending != NULL)
        return false;
    /* reopened for writing since: only its promise can go up now */
    if (file->open_writers > 0 &&
        !(has_promise(file) && file->entry_gen >= t->gen)) {
        t->outcome = WRITER_SYNC_NOT_CLOSED;
        return false;
    }
    return hurry_locked(writer, file);
}

/* Decide T (lock held) if it is undecided: whether it is decided now;
 * *WAKE is set if the uploaders must be woken. */
static bool look_at_locked(struct writer *writer, struct target *t, bool *wake)
{
    if (t->outcome != WRITER_SYNC_WAITING)
        return false;
    *wake |= decide_locked(writer, t);
    return t->outcome != WRITER_SYNC_WAITING;
}

int writer_sync(struct writer *writer, const atomic_bool *interrupted,
                struct writer_sync_report *out)
{
    struct target *targets = NULL;
    struct sync_waiter waiter = {0};
    size_t count = 0, cap = 0, undecided = 0;
    int err = 0;

    *out = (struct writer_sync_report){0};
    pthread_mutex_lock(&writer->lock);
    for (struct writer_file *file = writer->all; file != NULL;
         file = file->all_next)
        if (is_pending(file))
            cap++;
    /* (no I/O: an allocation under the lock, sized while it is held) */
    if (cap > 0 && (targets = calloc(cap, sizeof(*targets))) == NULL) {
        writer_unlock(writer);
        return ENOMEM;
    }
    bool wake = false;
    for (struct writer_file *file = writer->all; file != NULL;
         file = file->all_next) {
        if (!is_pending(file))
            continue;
        struct target *t = &targets[count++];
        t->file = file;
        file->refs++;
        t->outcome = WRITER_SYNC_WAITING;
        if (file->open_writers > 0 && !has_promise(file)) {
            t->outcome = WRITER_SYNC_NOT_CLOSED;
            t->size = file->size;
            continue;
        }
        if (file->open_writers > 0) {
            t->gen = file->entry_gen;
            t->size = file->entry_size;
        } else {
            t->gen = file->gen;
            t->size = file->size;
        }
        t->attempts_before = file->attempts + (file->sending != NULL ? 1 : 0);
        t->wanted = true;
        file->sync_wanted++;
        wake |= hurry_locked(writer, file);
        undecided++;
    }
    log_debug("sync: %zu pending files", count);
    /* from here on, what changes for a target is told to the waiter
     * (writer_sync_touch_locked), and only that is looked at again */
    if (count > 1)
        qsort(targets, count, sizeof(*targets), compare_targets);
    waiter.next = writer->sync_waiters;
    writer->sync_waiters = &waiter;
    waiter.overflow = true; /* (the first pass looks at every file) */
    /* directory markers are sent now too, after the files were taken (what
     * was pending when the sync began is what it reports, whatever lands
     * while the markers go) and while their uploads run. A failed marker
     * stays waiting, retried in the background, and is not in the
     * report, which is about files. */
    if (wake)
        pthread_cond_broadcast(&writer->work_queued);
    wake = false;
    writer_unlock(writer);
    writer_marker_flush(writer, "");
    pthread_mutex_lock(&writer->lock);
    for (;;) {
        if (waiter.overflow) {
            waiter.overflow = false;
            waiter.touched_count = 0;
            for (size_t i = 0; i < count; i++)
                undecided -= look_at_locked(writer, &targets[i], &wake);
        }
        for (size_t i = 0; i < waiter.touched_count; i++) {
            struct target *t = target_of(targets, count, waiter.touched[i]);
            if (t != NULL)
                undecided -= look_at_locked(writer, t, &wake);
        }
        waiter.touched_count = 0;
        if (wake)
            pthread_cond_broadcast(&writer->work_queued);
        wake = false;
        if (undecided == 0 || atomic_load(interrupted)) {
            out->interrupted = undecided > 0;
            break;
        }
        writer_wait(writer, &writer->file_idle);
    }
    struct sync_waiter **link = &writer->sync_waiters;
    while (*link != &waiter)
        link = &(*link)->next;
    *link = waiter.next;
    out->files = count > 0 ? calloc(count, sizeof(*out->files)) : NULL;
    if (count > 0 && out->files == NULL)
        err = ENOMEM;
    for (size_t i = 0; i < count; i++) {
        struct target *t = &targets[i];
        if (t->wanted)
            t->file->sync_wanted--;
        if (err != 0)
            continue;
        struct writer_synced *synced = &out->files[i];
        *synced = (struct writer_synced){
            .key = strdup(t->file->key),
            .owner = t->file->owner,
            .size = t->size,
            .outcome = t->outcome,
            .err = t->err,
            .retries = t->file->retries,
        };
        if (synced->key == NULL)
            err = ENOMEM;
        out->count = i + 1;
    }
    writer_unlock(writer);
    for (size_t i = 0; i < count; i++)
        writer_file_put(&targets[i].file);
    free(targets);
    free(waiter.touched);
    if (err != 0)
        writer_sync_report_free(out);
    return err;
}

void writer_sync_report_free(struct writer_sync_report *report)
{
    for (size_t i = 0; i < report->count; i++)
        free(report->files[i].key);
    free(report->files);
    *report = (struct writer_sync_report){0};
}

void writer_sync_wake(struct writer *writer)
{
    pthread_mutex_lock(&writer->lock);
    pthread_cond_broadcast(&writer->file_idle);
    writer_unlock(writer);
}

/* ------------------------------------------------------------- pending */

int writer_pending_list(struct writer *writer, struct writer_pending **list,
                        size_t *count, uint64_t *journal_entries)
{
    struct writer_pending *items = NULL;
    size_t used = 0, cap = 0;
    int err = 0;

    *list = NULL;
    *count = 0;
    pthread_mutex_lock(&writer->lock);
    for (struct writer_file *file = writer->all; file != NULL;
         file = file->all_next)
        if (is_pending(file))
            cap++;
    if (cap > 0 && (items = calloc(cap, sizeof(*items))) == NULL)
        err = ENOMEM;
    for (struct writer_file *file = writer->all; err == 0 && file != NULL;
         file = file->all_next) {
        if (!is_pending(file))
            continue;
        bool promised = has_promise(file);
        bool open = file->open_writers > 0;
        struct writer_pending *item = &items[used++];
        *item = (struct writer_pending){
            .key = strdup(file->key),
            .owner = file->owner,
            .state = file->sending != NULL ? WRITER_PENDING_UPLOADING
                     : file->failed || file->unwritten_err != 0
                                           ? WRITER_PENDING_FAILED
                     : open && !promised   ? WRITER_PENDING_OPEN
                                           : WRITER_PENDING_WAITING,
            .size = file->size,
            .promised = promised,
            .promised_size = promised ? file->entry_size : 0,
            .open = open,
            .staging_id = promised ? file->entry->id : file->data->id,
            .closed_at = file->closed_at,
            .retries = file->retries,
            .last_error = file->unwritten_err != 0 ? file->unwritten_err
                          : file->failed               ? file->last_error
                                                       : 0,
        };
        if (item->key == NULL)
            err = ENOMEM;
    }
    writer_unlock(writer);
    /* then the directory markers waiting (writeback mode) */
    if (err == 0 && writer->markers != NULL)
        err = writer_markers_pending(writer->markers, &items, &used, &cap);
    if (err != 0) {
        writer_pending_free(items, used);
        return err;
    }
    /* (the journal's count reads its environment: not under the lock) */
    *journal_entries = journal_count(writer->conf.journal);
    *list = items;
    *count = used;
    return 0;
}

void writer_pending_free(struct writer_pending *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(list[i].key);
    free(list);
}

/* ---------------------------------------------------------------- drop */

int writer_file_drop(struct writer_file *file, uint64_t *size,
                     uint64_t *staging_id)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    while (file->held)
        writer_wait(writer, &writer->file_idle);
    if (!is_pending(file)) {
        writer_unlock(writer);
        return EALREADY;
    }
    if (file->open_writers > 0 || file->sending != NULL ||
        file->active_writes > 0 || file->copying || file->wb_starting) {
        writer_unlock(writer);
        return EBUSY;
    }
    bool promised = has_promise(file);
    *size = promised ? file->entry_size : file->size;
    *staging_id = promised ? file->entry->id : file->data->id;
    /* as an unlink: never uploaded from now on */
    file->unlinked = true;
    if (writer_dequeue_locked(writer, file))
        file->refs--; /* the caller holds one more: never the last */
    struct writebehind *wb = file->wb;
    file->wb = NULL;
    writer_sync_touch_locked(writer, file);
    pthread_cond_broadcast(&writer->file_idle); /* (a sync waiting for it) */
    writer_unlock(writer);
    writebehind_abandon(&wb);

    writer_forget_entry(writer, file, 0);
    pthread_mutex_lock(&writer->lock);
    bool kept = file->entry != NULL;
    if (kept) {
        /* the journal refused to let it go (logged): it still promises
         * the file, which is to be uploaded as before */
        file->unlinked = false;
        writer_enqueue_locked(writer, file, 0);
    }
    writer_unlock(writer);
    return kept ? EIO : 0;
}
