/*
 * writer_recover.c - after a crash: every promise the journal (or a
 * promise kept beside its staging file, when the journal refused it)
 * holds is recovered as a pending file, exactly the bytes that were
 * closed, and queued for upload; multipart uploads that entries name are
 * aborted; staging files no promise names are removed.
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

/* A journal entry read back, its strings copied. */
struct recovered {
    struct journal_entry entry;
    char *key, *upload_id, *move_to, *move_etag;
    bool dropped;                /* a finished move's replaced promise */
};

struct recovery {
    struct writer *writer;
    writer_adopt_fn adopt;
    void *arg;
    struct recovered *entries;   /* every upload entry, in id order */
    size_t count, capacity;
    struct recovered *moves;     /* every move, in id order */
    size_t move_count, move_capacity;
    uint64_t *ids;               /* ids of staging files kept (sorted) */
    size_t id_count;
    unsigned queued;
    unsigned markers;            /* directory markers owed again */
    uint64_t *foreign;           /* ids of promises kept for another bucket */
    size_t foreign_count;
};

static void recovered_free(struct recovered *copy)
{
    free(copy->key);
    free(copy->upload_id);
    free(copy->move_to);
    free(copy->move_etag);
}

/* A copy of TEXT, or NULL for NULL; *FAILED when out of memory. */
static char *copy_text(const char *text, bool *failed)
{
    char *copy = text != NULL ? strdup(text) : NULL;
    *failed = *failed || (text != NULL && copy == NULL);
    return copy;
}

static int collect_entry(void *arg, const struct journal_entry *entry)
{
    struct recovery *recovery = arg;
    bool move = entry->kind == JOURNAL_MOVE;
    struct recovered **list = move ? &recovery->moves : &recovery->entries;
    size_t *count = move ? &recovery->move_count : &recovery->count;
    size_t *cap = move ? &recovery->move_capacity : &recovery->capacity;

    if (*count == *cap) {
        size_t capacity = *cap ? *cap * 2 : 64;
        void *grown = realloc(*list, capacity * sizeof(**list));
        if (grown == NULL)
            return ENOMEM;
        *list = grown;
        *cap = capacity;
    }
    struct recovered *copy = &(*list)[*count];
    bool failed = false;
    *copy = (struct recovered){.entry = *entry};
    copy->key = copy_text(entry->key, &failed);
    copy->upload_id = copy_text(entry->upload_id, &failed);
    copy->move_to = copy_text(entry->move_to, &failed);
    copy->move_etag = copy_text(entry->move_etag, &failed);
    if (failed) {
        recovered_free(copy);
        return ENOMEM;
    }
    copy->entry.key = copy->key;
    copy->entry.upload_id = copy->upload_id;
    copy->entry.move_to = copy->move_to;
    copy->entry.move_etag = copy->move_etag;
    copy->entry.destination = NULL; /* (the journal's: a scan gives no other) */
    (*count)++;
    return 0;
}

/* A directory's move: every promise (and marker) under its old prefix
 * is made to name the new one, in the journal and here. The file being
 * written when the crash came (unclosed) keeps its key: only its
 * write-behind upload, of the old key, is to be aborted. */
static int move_promises(struct recovery *recovery, const struct journal_entry *move)
{
    size_t from_len = strlen(move->key);

    for (size_t i = 0; i < recovery->count; i++) {
        struct recovered *copy = &recovery->entries[i];
        /* (a promise a finished rename dropped is not moved back in) */
        if (copy->dropped || copy->entry.unclosed ||
            strncmp(copy->key, move->key, from_len) != 0)
            continue;
        char *key = NULL;
        if (asprintf(&key, "%s%s", move->move_to, copy->key + from_len) < 0)
            return ENOMEM;
        struct journal_entry moved = copy->entry;
        moved.key = key;
        int err = journal_put(recovery->writer->conf.journal, &moved);
        if (err != 0) {
            free(key);
            return err;
        }
        free(copy->key);
        copy->key = key;
        copy->entry.key = key;
    }
    return 0;
}

/*
 * Finish the renames a crash interrupted, in the order they began: a
 * directory's promises move to its new prefix, FINISH does what is left
 * in the bucket, then the move's record goes with the promise it
 * replaced (which is not uploaded). The first failure stops the recovery:
 * the records stay for the next mount.
 */
static int finish_moves(struct recovery *recovery, writer_finish_fn finish,
                        void *arg)
{
    struct journal *journal = recovery->writer->conf.journal;

    for (size_t m = 0; m < recovery->move_count; m++) {
        const struct journal_entry *move = &recovery->moves[m].entry;
        int err = 0;
        if ((move->move_flags & JOURNAL_MOVE_PREFIX) != 0)
            err = move_promises(recovery, move);
        if (err == 0)
            err = finish != NULL ? finish(arg, move) : ENOTSUP;
        /* ESTALE: the rename did not happen (the source is another
         * version now): its record goes, the promise it replaced stays */
        bool done = err == 0;
        if (err == ESTALE) {
            log_warn("the rename of '%s' to '%s' that the last mount began "
                     "did not happen; '%s' keeps what it had", move->key,
                     move->move_to, move->move_to);
            err = 0;
        }
        if (err != 0) {
            log_error("cannot finish the rename of '%s' to '%s' that the last "
                      "mount began: %s; the next mount tries again", move->key,
                      move->move_to, strerror(err));
            return err;
        }
        uint64_t ids[2] = {move->id, 0};
        size_t count = 1;
        for (size_t i = 0; done && move->move_replaces != 0 &&
                           i < recovery->count; i++) {
            if (recovery->entries[i].entry.id == move->move_replaces &&
                !recovery->entries[i].dropped) {
                recovery->entries[i].dropped = true;
                ids[count++] = move->move_replaces;
            }
        }
        err = journal_update(journal, NULL, 0, ids, count);
        if (err != 0)
            log_warn("the rename of '%s' to '%s' is done, but its journal "
                     "record stays (%s): the next mount finishes it again",
                     move->key, move->move_to, strerror(err));
        if (done)
            log_info("finished the rename of '%s' to '%s' that the last mount "
                     "began", move->key, move->move_to);
    }
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
    if (writer_file_new(writer, staging, entry->key, &meta, NULL, &file) != 0) {
        writer_staging_free(writer, staging, true);
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
    file->closed_at = meta.mtime; /* (its close was at least as late) */
    writer_file_publish(writer, file);
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
    writer_enqueue_locked(writer, file, 0);
    writer_unlock(writer);
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
    for (size_t i = 0; i < recovery->foreign_count; i++)
        if (recovery->foreign[i] == id)
            return 0; /* another bucket's promise names it */
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
    const char *ours = journal_destination(writer->conf.journal);
    if (entry.destination != NULL && strcmp(entry.destination, ours) != 0) {
        log_error("a promise kept in %s (%016" PRIx64 ") is for %s, not %s; "
                  "it is left there", staging_dir_path(writer->staging), id,
                  entry.destination, ours);
        free(strings);
        uint64_t *grown = realloc(recovery->foreign, (recovery->foreign_count + 1) *
                                                         sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        recovery->foreign = grown;
        recovery->foreign[recovery->foreign_count++] = id;
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

int writer_recover(struct writer *writer, writer_adopt_fn adopt,
                   writer_finish_fn finish, void *arg)
{
    struct recovery recovery = {.writer = writer, .adopt = adopt, .arg = arg};
    int err = journal_scan(writer->conf.journal, collect_entry, &recovery);

    if (err == 0)
        err = staging_scan_marks(writer->staging, collect_mark, &recovery);
    if (err == 0)
        err = finish_moves(&recovery, finish, arg);

    if (err == 0 && recovery.count > 0 &&
        (recovery.ids = calloc(recovery.count, sizeof(uint64_t))) == NULL)
        err = ENOMEM;
    if (err == 0 && recovery.count > 0)
        qsort(recovery.entries, recovery.count, sizeof(*recovery.entries),
              compare_by_key);
    for (size_t i = 0; err == 0 && i < recovery.count; i++) {
        const struct journal_entry *entry = &recovery.entries[i].entry;
        if (recovery.entries[i].dropped)
            continue; /* replaced by a rename that recovery finished */
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
        if (writer_marker_entry(entry)) {
            /* a directory marker owed (writeback mode): no staging file */
            writer_marker_recovered(writer, entry);
            recovery.markers++;
            continue;
        }
        /* one promise per key: the journal replaces an entry in the same
         * transaction as it writes the next, so two would be a defect;
         * the newest (the last one here) is the one kept */
        bool superseded = false;
        for (size_t j = i + 1; j < recovery.count; j++) {
            if (strcmp(recovery.entries[j].key, entry->key) != 0)
                break;
            superseded = superseded || (!recovery.entries[j].entry.unclosed &&
                                        !recovery.entries[j].dropped);
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
    if (recovery.markers > 0)
        log_info("sending %u directory marker%s made before the last mount "
                 "ended", recovery.markers, recovery.markers == 1 ? "" : "s");
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
    for (size_t i = 0; i < recovery.count; i++)
        recovered_free(&recovery.entries[i]);
    for (size_t i = 0; i < recovery.move_count; i++)
        recovered_free(&recovery.moves[i]);
    free(recovery.entries);
    free(recovery.moves);
    free(recovery.ids);
    free(recovery.foreign);
    return err;
}
