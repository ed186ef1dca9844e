/*
 * writer_edit.c - edits of objects already in the bucket. Nothing is
 * fetched when an edit begins: the base object's bytes come a granule
 * (GRANULE) at a time into the staging file when they are read or partly
 * overwritten, runs of missing granules in one fetch, and threads needing
 * the same granule share it. On upload, ranges never written are copied
 * server-side from the base (UploadPartCopy) where the server can, and
 * fetched where it cannot (writer_base_materialize). After an upload the
 * new object becomes the base of what comes next.
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

#define RUN_MAX 64                  /* granules fetched in one go */

/*
 * Make the base's bytes of [OFFSET, OFFSET + LEN) present in the staging
 * file, fetching the granules that are not (runs of them in one fetch).
 * With COVERED, granules the range covers entirely are only marked
 * present: the caller is about to write all of them. Threads needing the
 * same granule share the work: one fetches, the others wait (file_idle).
 * (An edit with granules missing is never copied on write: its data
 * staging file stays the same meanwhile.)
 */
int writer_make_present(struct writer *writer, struct writer_file *file,
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
            writer_wait(writer, &writer->file_idle);
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
        writer_unlock(writer);

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
    writer_unlock(writer);
    return err;
}

void writer_settle_covered_locked(struct writer *writer, struct writer_file *file,
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

void writer_mark_written_locked(struct writer_file *file, uint64_t offset,
                                uint64_t len)
{
    if (file->base_key == NULL || len == 0)
        return;
    for (uint64_t g = offset / GRANULE; g < file->granules &&
                                        g * GRANULE < offset + len; g++)
        bit_set(file->written, g, true);
}

bool writer_copyable(const struct writer_file *file)
{
    return file->base_key == NULL || file->missing == 0;
}

void writer_drop_base_locked(struct writer_file *file)
{
    if (file->base_key != NULL && file->missing == 0) {
        free(file->base_key);
        file->base_key = NULL;
    }
}

bool writer_base_range_unchanged(void *arg, uint64_t offset, uint64_t length)
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
    writer_unlock(context->writer);
    return unchanged;
}

int writer_base_materialize(void *arg, uint64_t offset, uint64_t length)
{
    struct upload_context *context = arg;
    return writer_make_present(context->writer, context->file, offset, length, false);
}

void writer_rebase_locked(struct writer_file *file, const struct version *v,
                          const char *key, const char *etag)
{
    if (file->base_key == NULL)
        return;
    if (file->data_gen != v->data_gen) {
        writer_drop_base_locked(file);
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

int writer_file_complete(struct writer_file *file)
{
    struct writer *writer = file->writer;

    pthread_mutex_lock(&writer->lock);
    uint64_t whole = file->size;
    writer_unlock(writer);
    int err = writer_make_present(writer, file, 0, whole, false);
    pthread_mutex_lock(&writer->lock);
    if (err == 0 && !file->held)
        writer_drop_base_locked(file);
    writer_unlock(writer);
    return err;
}
