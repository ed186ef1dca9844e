/*
 * writer_state.c - the bottom of the writer (see writer_internal.h):
 * staging files, each a version of a file's data, referenced by the file
 * (its data), its journal entry and an upload under way; taking a
 * version, which seals its bytes; the queue of files waiting for a
 * background upload, and the retries of failed ones (backoff from
 * RETRY_FIRST_SECONDS doubling up to RETRY_MAX_SECONDS).
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

#define RETRY_FIRST_SECONDS 1.0     /* a failed upload is tried again ... */
#define RETRY_MAX_SECONDS 300.0     /* ... doubling the wait up to this */

/* ------------------------------------------------------- staging files */

int writer_staging_new(struct writer *writer, struct staging_file **out)
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

void writer_staging_free(struct writer *writer, struct staging_file *staging,
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

void writer_staging_drop(struct writer *writer, struct staging_file **staging)
{
    pthread_mutex_lock(&writer->lock);
    struct staging_file *last = unref_locked(*staging);
    writer_unlock(writer);
    writer_staging_free(writer, last, false);
    *staging = NULL;
}

void writer_version_take_locked(struct writer *writer, struct writer_file *file,
                                bool for_upload, struct version *out)
{
    while (file->active_writes > 0 || file->copying)
        writer_wait(writer, &writer->file_idle);
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

/* ------------------------------------------------- bytes not written */

void writer_unwritten_add_locked(struct writer_file *file, uint64_t from,
                                 uint64_t to, int err)
{
    if (to <= from || err == EFBIG)
        return;
    if (file->unwritten_err == 0 || from < file->unwritten_from)
        file->unwritten_from = from;
    if (file->unwritten_err == 0 || to > file->unwritten_to)
        file->unwritten_to = to;
    file->unwritten_err = err;
}

void writer_unwritten_cover_locked(struct writer_file *file, uint64_t from,
                                   uint64_t to)
{
    if (file->unwritten_err == 0 || to <= from)
        return;
    /* (one range: a write in its middle leaves all of it unwritten) */
    if (from <= file->unwritten_from && to >= file->unwritten_to)
        file->unwritten_err = 0;
    else if (from <= file->unwritten_from && to > file->unwritten_from)
        file->unwritten_from = to;
    else if (from < file->unwritten_to && to >= file->unwritten_to)
        file->unwritten_to = from;
    if (file->unwritten_err == 0)
        file->unwritten_from = file->unwritten_to = 0;
}

/* ------------------------------------------------------------- queue */

/* Queue FILE for a background upload not before DELAY seconds from now
 * (a reference goes with it). Lock held. */
void writer_enqueue_locked(struct writer *writer, struct writer_file *file,
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

bool writer_dequeue_locked(struct writer *writer, struct writer_file *file)
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

void writer_schedule_retry_locked(struct writer *writer, struct writer_file *file)
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
    writer_enqueue_locked(writer, file, delay);
}

void writer_sync_touch_locked(struct writer *writer, struct writer_file *file)
{
    if (file->sync_wanted == 0)
        return;
    for (struct sync_waiter *waiter = writer->sync_waiters; waiter != NULL;
         waiter = waiter->next) {
        if (waiter->overflow)
            continue;
        if (waiter->touched_count == waiter->touched_cap) {
            size_t cap = waiter->touched_cap ? waiter->touched_cap * 2 : 64;
            struct writer_file **grown =
                realloc(waiter->touched, cap * sizeof(*grown));
            if (grown == NULL) {
                waiter->overflow = true; /* (it looks at every file) */
                continue;
            }
            waiter->touched = grown;
            waiter->touched_cap = cap;
        }
        waiter->touched[waiter->touched_count++] = file;
    }
}

/* ------------------------------------------------------------- files */

int writer_file_new(struct writer *writer, struct staging_file *data,
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
    *out = file;
    return 0;
}

void writer_file_publish(struct writer *writer, struct writer_file *file)
{
    pthread_mutex_lock(&writer->lock);
    file->all_next = writer->all;
    if (writer->all != NULL)
        writer->all->all_prev = file;
    writer->all = file;
    writer_unlock(writer);
}

void writer_file_discard(struct writer *writer, struct writer_file *file)
{
    writer_staging_free(writer, file->data, false);
    free(file->key);
    free(file->base_key);
    free(file->present);
    free(file->loading);
    free(file->written);
    free(file);
}

/* ------------------------------------------------------------ invariants */

/* A staging file no journal write is under way for is sealed exactly as
 * far as the file's entry promises, if it is that entry, else not. */
static void check_journal_seal(const struct writer_file *file,
                               const struct staging_file *staging)
{
    if (staging == NULL || staging->promising > 0)
        return;
    bool promised = file->entry == staging && !file->entry_unclosed;
    INVARIANT(staging->journal_seal == (promised ? file->entry_size : 0),
              file->key);
}

void writer_check_invariants_locked(const struct writer *writer)
{
    size_t queued = 0, in_queue = 0;

    for (const struct writer_file *file = writer->all; file != NULL;
         file = file->all_next) {
        INVARIANT(file->writer == writer, file->key);
        INVARIANT(file->refs > 0, file->key);
        INVARIANT(file->all_next == NULL || file->all_next->all_prev == file,
                  file->key);
        /* gens only grow; the bucket's and the promised one are among
         * them */
        INVARIANT(file->uploaded_gen <= file->gen, file->key);
        INVARIANT(file->data_gen <= file->gen, file->key);
        INVARIANT(file->entry == NULL || file->entry_gen <= file->gen, file->key);
        /* every staging file it names is referenced */
        INVARIANT(file->data == NULL || file->data->refs > 0, file->key);
        INVARIANT(file->entry == NULL || file->entry->refs > 0, file->key);
        INVARIANT(file->sending == NULL || file->sending->refs > 0, file->key);
        check_journal_seal(file, file->data);
        check_journal_seal(file, file->entry);
        /* an unlinked file is never uploaded, nor streamed */
        INVARIANT(!file->unlinked || (!file->queued && file->wb == NULL),
                  file->key);
        INVARIANT(file->missing <= file->granules, file->key);
        INVARIANT((file->unwritten_err != 0) ==
                      (file->unwritten_to > file->unwritten_from), file->key);
        if (file->queued)
            queued++;
    }
    const struct writer_file *last = NULL;
    for (const struct writer_file *file = writer->queue_head; file != NULL;
         file = file->queue_next) {
        INVARIANT(file->queued, file->key);
        last = file;
        in_queue++;
    }
    INVARIANT(writer->queue_tail == last, "the upload queue");
    INVARIANT(queued == in_queue, "the upload queue");
    INVARIANT(writer->running <= writer->thread_count, "the uploaders");
}
