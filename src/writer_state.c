/*
 * writer_state.c - the bottom of the writer (see writer_internal.h):
 * staging files, each a version of a file's data, referenced by the file
 * (its data), its journal entry and an upload under way; taking a
 * version, which seals its bytes; the queue of files waiting for a
 * background upload, and the retries of failed ones (backoff from
 * RETRY_FIRST_SECONDS doubling up to RETRY_MAX_SECONDS).
 */
#include "config.h"

#include "writer_internal.h"

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
    pthread_mutex_unlock(&writer->lock);
    writer_staging_free(writer, last, false);
    *staging = NULL;
}

void writer_version_take_locked(struct writer *writer, struct writer_file *file,
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
    pthread_mutex_lock(&writer->lock);
    file->all_next = writer->all;
    if (writer->all != NULL)
        writer->all->all_prev = file;
    writer->all = file;
    pthread_mutex_unlock(&writer->lock);
    *out = file;
    return 0;
}
