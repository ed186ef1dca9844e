/*
 * writer_journal.c - promises. A version is promised by fsyncing its
 * staging file and then writing its journal entry (journal.h), replacing
 * the file's older entry in the same transaction; an entry moves with a
 * rename and goes once the bucket holds its version or a later one, or
 * the file is unlinked. Also the end of a file's last reference: its
 * staged data becomes the cached version it was uploaded as.
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

void writer_entry_of(uint64_t id, const char *key, uint64_t size,
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

void writer_journal_begin_locked(struct writer *writer, struct writer_file *file)
{
    while (file->journal_busy)
        writer_wait(writer, &writer->file_idle);
    file->journal_busy = true;
}

void writer_journal_end_locked(struct writer *writer, struct writer_file *file)
{
    file->journal_busy = false;
    pthread_cond_broadcast(&writer->file_idle);
}

int writer_promise(struct writer *writer, struct writer_file *file,
                   const struct version *v, const char *upload_id)
{
    struct journal_entry entry;
    struct staging_file *old = NULL, *freed = NULL;
    char *key = NULL, *id_copy = NULL;
    int err = 0;

    /* the journal must name complete data: fetch what an edit lacks */
    err = writer_make_present(writer, file, 0, v->size, false);
    if (err != 0) {
        log_error("cannot stage all of '%s' for the journal: %s", file->key,
                  strerror(err));
        pthread_mutex_lock(&writer->lock);
        end_promising_locked(file, v->staging);
        writer_unlock(writer);
        return err;
    }
    pthread_mutex_lock(&writer->lock);
    writer_journal_begin_locked(writer, file);
    bool done = file->unlinked ||
                (file->uploaded && file->uploaded_gen >= v->gen) ||
                (has_promise(file) && file->entry_gen >= v->gen &&
                 upload_id == NULL);
    /* the upload of V began after a newer version was promised: the entry
     * stays that newer promise and names V's upload, which recovery
     * aborts before it uploads the newer version (a crash may leave it
     * completing at the server) */
    bool newer = !done && has_promise(file) && file->entry_gen > v->gen;
    struct version promised = *v;
    if (newer) {
        promised = (struct version){
            .staging = file->entry, .size = file->entry_size,
            .gen = file->entry_gen, .data_gen = file->entry_data_gen,
            .meta = file->entry_meta,
        };
    }
    if (!done) {
        key = strdup(file->key);
        if (upload_id == NULL && file->wb != NULL && file->data == v->staging)
            upload_id = writebehind_upload_id(file->wb);
        /* an older version's upload under way stays named, for the same
         * reason */
        if (upload_id == NULL && file->sending != NULL)
            upload_id = file->entry_upload_id;
        id_copy = upload_id != NULL ? strdup(upload_id) : NULL;
        if (!newer && file->entry != NULL && file->entry != v->staging)
            old = file->entry;
    }
    writer_unlock(writer);

    if (!done && (key == NULL || (upload_id != NULL && id_copy == NULL)))
        err = ENOMEM;
    /* (a newer promise's data was made durable when it was written) */
    if (!done && !newer && err == 0) {
        err = staging_sync(writer->staging, v->staging->fd, key);
        /* what a failed fsync could not write may read back as zeros
         * (ext4 drops such pages): not promised, nor uploaded, until it
         * is written again */
        if (err != 0) {
            pthread_mutex_lock(&writer->lock);
            writer_unwritten_add_locked(file, 0, v->size, err);
            writer_unlock(writer);
        }
    }
    if (!done && err == 0) {
        writer_entry_of(promised.staging->id, key, promised.size,
                        &promised.meta, id_copy, false, &entry);
        err = journal_update(writer->conf.journal, &entry, 1,
                             old != NULL ? &old->id : NULL, old != NULL);
        if (err != 0)
            log_error("cannot journal the upload of '%s': %s", key,
                      strerror(err));
    }

    if (!done && err == 0)
        log_debug("'%s': journaled %016" PRIx64 " (%llu bytes, version %llu)%s%s",
                  key, promised.staging->id, (unsigned long long)promised.size,
                  (unsigned long long)promised.gen,
                  old != NULL ? ", older entry dropped" : "",
                  newer ? ", naming an older version's upload" : "");
    pthread_mutex_lock(&writer->lock);
    if (!done && err == 0 && newer) {
        free(file->entry_upload_id);
        file->entry_upload_id = id_copy;
        id_copy = NULL;
    } else if (!done && err == 0) {
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
    writer_journal_end_locked(writer, file);
    writer_unlock(writer);
    writer_staging_free(writer, freed, false);
    free(id_copy);
    free(key);
    return err;
}

void writer_forget_entry(struct writer *writer, struct writer_file *file,
                         uint64_t up_to)
{
    writer_forget_entry_with(writer, file, up_to, NULL, 0);
}

int writer_forget_entry_with(struct writer *writer, struct writer_file *file,
                             uint64_t up_to, const struct journal_entry *put,
                             uint64_t also)
{
    pthread_mutex_lock(&writer->lock);
    writer_journal_begin_locked(writer, file);
    struct staging_file *entry = file->entry;
    /* (an unclosed entry names a write-behind upload: it stays while that
     * upload is under way) */
    bool forget = entry != NULL &&
                  (up_to == 0 ||
                   (file->entry_unclosed ? file->wb == NULL
                                         : file->entry_gen <= up_to));
    uint64_t ids[2];
    size_t count = 0;
    if (forget)
        ids[count++] = entry->id;
    if (also != 0)
        ids[count++] = also;
    writer_unlock(writer);

    int err = count > 0 || put != NULL
                  ? journal_update(writer->conf.journal, put, put != NULL ? 1 : 0,
                                   ids, count)
                  : 0;
    if (forget && err == 0)
        log_debug("'%s': entry %016" PRIx64 " dropped", file->key, ids[0]);

    struct staging_file *freed = NULL;
    pthread_mutex_lock(&writer->lock);
    if (forget && err == 0) {
        file->entry = NULL;
        entry->journal_seal = entry->promising > 0 ? entry->journal_seal : 0;
        free(file->entry_upload_id);
        file->entry_upload_id = NULL;
        freed = unref_locked(entry);
    }
    writer_journal_end_locked(writer, file);
    writer_unlock(writer);
    if (err != 0)
        log_warn("'%s' stays in the journal (%s): the next mount uploads it "
                 "again", file->key, strerror(err));
    writer_staging_free(writer, freed, false);
    return err;
}

/* --------------------------------------------------------------- moves */

int writer_move_begin(struct writer *writer, const struct writer_move *move,
                      struct writer_file *replaced, uint64_t *id)
{
    struct journal_entry entry = {
        .id = journal_next_id(writer->conf.journal),
        .kind = JOURNAL_MOVE,
        .key = move->from,
        .move_to = move->to,
        .move_etag = move->etag,
        .move_flags = move->flags,
    };

    *id = 0;
    /* the replaced file's promise, as it is once a journal update of it
     * under way (a close that began before the rename unlinked it) is
     * done: the record names that one, and none comes after (unlinked) */
    if (replaced != NULL) {
        pthread_mutex_lock(&writer->lock);
        writer_journal_begin_locked(writer, replaced);
        if (replaced->entry != NULL && !replaced->entry_unclosed)
            entry.move_replaces = replaced->entry->id;
        writer_unlock(writer);
    }
    int err = journal_put(writer->conf.journal, &entry);
    if (replaced != NULL) {
        pthread_mutex_lock(&writer->lock);
        writer_journal_end_locked(writer, replaced);
        writer_unlock(writer);
    }
    if (err != 0) {
        log_error("cannot journal the rename of '%s' to '%s': %s", move->from,
                  move->to, strerror(err));
        return err;
    }
    log_debug("'%s' -> '%s': move %016" PRIx64 " journaled", move->from,
              move->to, entry.id);
    *id = entry.id;
    return 0;
}

/* Delete the record of move ID (with REPLACED's promise: DONE). A
 * failure is tried once more, then logged: a move record left behind is
 * finished again by the next mount. */
static int move_record_drop(struct writer *writer, uint64_t id,
                            struct writer_file *replaced, const char *what)
{
    int err = 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        err = replaced != NULL
                  ? writer_forget_entry_with(writer, replaced, 0, NULL, id)
                  : journal_del(writer->conf.journal, id);
        if (err == 0)
            return 0;
    }
    log_error("cannot drop the journal's record of a %s rename (%016" PRIx64
              "): %s; the next mount does that rename again", what, id,
              strerror(err));
    return err;
}

int writer_move_end(struct writer *writer, uint64_t id,
                    struct writer_file *replaced)
{
    return id != 0 ? move_record_drop(writer, id, replaced, "finished") : 0;
}

int writer_move_cancel(struct writer *writer, uint64_t id)
{
    return id != 0 ? move_record_drop(writer, id, NULL, "failed") : 0;
}

int writer_move_narrow(struct writer *writer, uint64_t id,
                       const struct writer_move *left,
                       struct writer_file *replaced)
{
    struct journal_entry entry = {
        .id = id,
        .kind = JOURNAL_MOVE,
        .key = left->from,
        .move_to = left->to,
        .move_etag = left->etag,
        .move_flags = left->flags,
    };
    int err = replaced != NULL
                  ? writer_forget_entry_with(writer, replaced, 0, &entry, 0)
                  : journal_put(writer->conf.journal, &entry);

    if (err != 0)
        log_error("cannot journal what is left of the rename of '%s' (%s); "
                  "the next mount finishes the whole rename again", left->from,
                  strerror(err));
    return err;
}

struct writer_file *writer_file_ref(struct writer_file *file)
{
    pthread_mutex_lock(&file->writer->lock);
    file->refs++;
    writer_unlock(file->writer);
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
        writer_unlock(writer);
        return;
    }
    if (file->all_prev != NULL)
        file->all_prev->all_next = file->all_next;
    else
        writer->all = file->all_next;
    if (file->all_next != NULL)
        file->all_next->all_prev = file->all_prev;
    bool pending = is_pending(file);
    /* data with bytes a write failed to write: promised to nobody */
    bool unwritten = pending && file->unwritten_err != 0;
    /* an entry left by a failed delete, for a file in the bucket */
    bool stale_entry = file->entry != NULL && !pending;
    writer_unlock(writer);

    /* (a write-behind upload left only on a file never uploaded: gone) */
    writebehind_abandon(&file->wb);
    if (stale_entry)
        writer_forget_entry(writer, file, 0);
    pthread_mutex_lock(&writer->lock);
    bool adopt = !pending && !file->unlinked && file->uploaded &&
                 file->uploaded_gen == file->gen && file->missing == 0 &&
                 file->entry == NULL && file->data->refs == 1;
    struct staging_file *entry = file->entry, *data = file->data;
    file->entry = file->data = NULL;
    writer_unlock(writer);

    if (pending) {
        /* only the fs layer's end (the drain said why); the data and its
         * entry stay for the next mount, but data that is not what was
         * written goes */
        bool keep = !unwritten || entry == data;
        if (keep)
            log_warn("'%s' is not uploaded yet; its staged data is kept",
                     file->key);
        if (entry != NULL && entry != data)
            writer_staging_free(writer, entry, true);
        writer_staging_free(writer, data, keep);
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
            writer_staging_free(writer, entry, true); /* (its entry stays) */
        writer_staging_free(writer, data, adopted || entry == data);
    }
    free(file->entry_upload_id);
    free(file->key);
    free(file->base_key);
    free(file->present);
    free(file->loading);
    free(file->written);
    free(file);
}

int writer_promise_current(struct writer *writer, struct writer_file *file)
{
    struct version v;

    pthread_mutex_lock(&writer->lock);
    writer_version_take_locked(writer, file, false, &v);
    /* bytes a write failed to write: not what anybody asked for */
    int err = file->unwritten_err;
    if (err != 0)
        end_promising_locked(file, v.staging);
    writer_unlock(writer);
    if (err == 0)
        err = writer_promise(writer, file, &v, NULL);
    writer_staging_drop(writer, &v.staging);
    return err;
}

int writer_move_entry(struct writer *writer, struct writer_file *file,
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
        writer_entry_of(file->entry->id, file->key, file->entry_size, &file->entry_meta,
                        NULL, false, &entry);
    if (replaced != NULL && replaced != file) {
        writer_journal_begin_locked(writer, replaced);
        if (replaced->entry != NULL)
            dels[del_count++] = replaced->entry->id;
    }
    writer_unlock(writer);

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
        writer_journal_end_locked(writer, replaced);
    }
    file->journal_busy = false;
    pthread_cond_broadcast(&writer->file_idle);
    writer_unlock(writer);
    writer_staging_free(writer, freed, false);
    writer_staging_free(writer, freed_replaced, false);
    return err;
}

void writer_promise_at_drain(struct writer *writer, struct writer_file *file)
{
    struct version v;
    struct journal_entry entry;
    unsigned char *record = NULL;
    size_t len = 0;

    pthread_mutex_lock(&writer->lock);
    writer_version_take_locked(writer, file, false, &v);
    char *key = strdup(file->key);
    writer_unlock(writer);
    int err = writer_promise(writer, file, &v, NULL);
    if (err != 0 && key != NULL) {
        writer_entry_of(v.staging->id, key, v.size, &v.meta, NULL, false, &entry);
        entry.destination = journal_destination(writer->conf.journal);
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
            writer_unlock(writer);
        }
    }
    free(record);
    free(key);
    writer_staging_drop(writer, &v.staging);
}

void writer_keep_orphan(void *arg, const char *key, const char *upload_id)
{
    struct writer *writer = arg;
    struct orphan_upload *orphan = calloc(1, sizeof(*orphan));
    struct writer_meta none = {0};
    struct journal_entry entry;

    if (orphan == NULL || (orphan->key = strdup(key)) == NULL ||
        (orphan->upload_id = strdup(upload_id)) == NULL) {
        log_error("upload %s: out of memory; its unfinished multipart upload "
                  "is left to the bucket's lifecycle rules", key);
        if (orphan != NULL)
            free(orphan->key);
        free(orphan);
        return;
    }
    orphan->id = journal_next_id(writer->conf.journal);
    writer_entry_of(orphan->id, key, 0, &none, upload_id, true, &entry);
    int err = journal_put(writer->conf.journal, &entry);
    if (err != 0) {
        log_error("upload %s: cannot journal its unfinished multipart upload "
                  "(%s); it is aborted at unmount, or else left to the "
                  "bucket's lifecycle rules", key, strerror(err));
        orphan->id = 0;
    } else {
        log_info("upload %s: its unfinished multipart upload is aborted at "
                 "unmount or by the next mount", key);
    }
    pthread_mutex_lock(&writer->lock);
    orphan->next = writer->orphans;
    writer->orphans = orphan;
    writer_unlock(writer);
}

unsigned writer_abort_orphans(struct writer *writer)
{
    unsigned left = 0;

    pthread_mutex_lock(&writer->lock);
    struct orphan_upload *orphans = writer->orphans;
    writer->orphans = NULL;
    writer_unlock(writer);
    while (orphans != NULL) {
        struct orphan_upload *orphan = orphans;
        orphans = orphan->next;
        int err = upload_abort(&writer->upload, orphan->key, orphan->upload_id);
        if (err == 0 && orphan->id != 0)
            journal_del(writer->conf.journal, orphan->id);
        if (err == 0) {
            log_debug("'%s': unfinished multipart upload aborted", orphan->key);
            free(orphan->key);
            free(orphan->upload_id);
            free(orphan);
            continue;
        }
        log_warn("upload %s: still cannot abort its unfinished multipart "
                 "upload (%s)%s", orphan->key, strerror(err),
                 orphan->id != 0 ? "; the next mount tries again" : "");
        left++;
        pthread_mutex_lock(&writer->lock);
        orphan->next = writer->orphans;
        writer->orphans = orphan;
        writer_unlock(writer);
    }
    return left;
}
