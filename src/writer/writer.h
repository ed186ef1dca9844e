/*
 * writer.h - files being written: staged on local disk, uploaded, journaled.
 *
 * A writer_file is the staged content of one key while it is being
 * written or waits for its upload: a file CACHE/staging/<id> holding the
 * whole object as it will be uploaded (holes read as zeros), its size and
 * the s3fs metadata it will carry. The fs layer attaches one to an inode
 * while the inode has handles open for writing or an upload pending, and
 * reads and writes go to the staging file meanwhile.
 *
 * The promise (see HACKING.md, "Durability"):
 *   - default mode: writer_file_flush() (close()) returns after the object
 *     is in the bucket;
 *   - writeback mode: writer_file_flush() fsyncs the staging file, records
 *     it in the journal (journal.h, durable) and queues the upload for the
 *     background uploaders; it returns without waiting for the upload;
 *   - writer_file_sync() (fsync()) returns after the object is in the
 *     bucket, in both modes;
 *   - a failed upload keeps the staged data and its journal entry, counts
 *     in the statistics, and is returned by flush/sync; it is tried again
 *     in the background (backoff from 1 s up to 5 min), by the next sync,
 *     the drain at unmount, or the next mount (writer_recover());
 *   - versions of one file reach the bucket in the order they were written,
 *     and a version that was not closed never replaces one that was;
 *   - a write or truncate that fails (ENOSPC, EIO, a failed fetch of an
 *     edit's base) leaves the file's data other than what was asked for:
 *     until those bytes are written again (or cut off by a truncate), its
 *     data is neither journaled nor uploaded, flush and sync return that
 *     errno, and only its last promise, if any, goes up; the drain leaves
 *     it (counted, logged) and its data goes with the mount. A rewrite
 *     that fails never puts a short or empty object in place of a good one.
 *   - writer_drain() (unmount) returns once nothing is left to upload, or
 *     what is left has failed again (it stays journaled for the next mount).
 *
 * Locking: one writer mutex guards the fields of every file and the
 * queues; it is never held across disk or network I/O. Bytes being
 * uploaded or promised by the journal never change in place: a write over
 * them goes to a copy (see writer.c), so writes and close() do not wait
 * for uploads. A rename or an unlink holds a file (writes wait) and waits
 * for an upload of it under way. Writes themselves run outside the lock.
 */
#ifndef S3CFS_WRITER_H
#define S3CFS_WRITER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/workers.h"
#include "cache/cache.h"
#include "s3/s3.h"
#include "writer/journal.h"

/* What is uploaded with the data (s3fs headers). */
struct writer_meta {
    uint32_t mode;                /* file type bits included */
    uint32_t uid, gid;
    struct timespec mtime;
    struct timespec atime;        /* set by utimensat; 0: none (the mtime
                                     is shown). Not journaled: a crash
                                     before the upload forgets it */
};

struct writer_file;

/* Told to the fs layer when an upload of FILE (created for OWNER) finished,
 * from the thread that ran it, no lock held; FILE stays referenced during
 * the call, and its upload counts as under way until it returns (a rename
 * or unlink of FILE waits for it). ETAG is the new object's; NULL when the
 * upload failed: an object of it may be under KEY all the same (a request
 * whose answer was lost, or that the server applies after the client gave
 * up on it), for a rename or unlink to delete. */
typedef void (*writer_uploaded_fn)(void *arg, struct writer_file *file,
                                   void *owner, const char *key,
                                   const char *etag, uint64_t size,
                                   const struct writer_meta *meta);

/* Copy LEN bytes at OFFSET of object KEY version ETAG (SIZE bytes) to the
 * same offset of file FD (the base of an edit); 0 or an errno. */
typedef int (*writer_fetch_fn)(void *arg, const char *key, const char *etag,
                               uint64_t size, uint64_t offset, uint64_t len,
                               int fd);

struct writer_conf {
    struct s3_client *s3;
    struct cache *cache;          /* staging lives in its directory */
    struct workers *workers;      /* runs multipart parts */
    struct journal *journal;
    bool writeback;
    unsigned uploaders;           /* background upload threads */
    unsigned parallel_parts;      /* parts in flight per upload */
    uint64_t multipart_threshold;
    uint64_t part_size;
    writer_uploaded_fn uploaded;
    void *uploaded_arg;
    writer_fetch_fn fetch_base;   /* edits of objects in the bucket */
    void *fetch_arg;
};

struct writer_stats {
    uint64_t bytes_written;       /* by applications */
    uint64_t uploads_pending;     /* staged files not yet in the bucket */
    uint64_t uploads_completed;
    uint64_t upload_failures;     /* uploads that failed (each attempt) */
    uint64_t upload_retries;      /* of which tried again in the background */
    uint64_t copies_on_write;     /* staged data copied before a change */
    uint64_t syncs_waiting;       /* writer_sync() calls under way now */
    uint64_t uploads_running;     /* files the uploader threads took from
                                     the queue and send now */
};

struct writer;
struct writer_file;

int writer_create(const struct writer_conf *conf, struct writer **out);

/* Stop the uploaders (after writer_drain()), free everything; files still
 * referenced must have been put. *writer = NULL. Safe twice. */
void writer_destroy(struct writer **writer);

void writer_get_stats(struct writer *writer, struct writer_stats *out);

/*
 * After a crash: first finish every rename the journal records a move of
 * (writer_move_begin()), in order: for a directory's, the promises under
 * its old prefix move to the new one; FINISH does the rest in the bucket;
 * then the record goes, with the promise it replaces. A FINISH that fails
 * fails the recovery (the records stay for the next mount). Then queue
 * an upload for every journal entry (aborting the multipart upload it
 * records, if any) and remove staging files the journal does not name
 * (never closed: nobody was promised them). For
 * each entry, ADOPT is told its key, size and metadata with a new
 * reference to its file (the fs layer attaches it to an inode, so that
 * the pending file is visible). Returns 0 or an errno.
 */
typedef void (*writer_adopt_fn)(void *arg, struct writer_file *file,
                                const char *key, uint64_t size,
                                const struct writer_meta *meta);
/* Finish in the bucket the move MOVE (a JOURNAL_MOVE entry) that a crash
 * interrupted, idempotently: 0 once it is done; ESTALE when it was not
 * and is not to be (its source is another version than it moved: the
 * record goes, the promise it replaces stays); or an errno. */
typedef int (*writer_finish_fn)(void *arg, const struct journal_entry *move);
int writer_recover(struct writer *writer, writer_adopt_fn adopt,
                   writer_finish_fn finish, void *arg);

/*
 * Upload everything pending (queued, failed or dirty and closed), and wait.
 * Returns the number of files still not in the bucket (their data stays
 * staged and journaled for the next mount).
 */
uint64_t writer_drain(struct writer *writer);

/* ----------------------------------- `s3cachefs sync` and `pending`
 * (writer_sync.c; see HACKING.md, "Sync and pending") */

/* What writer_sync() found for one file. */
enum writer_sync_outcome {
    WRITER_SYNC_UPLOADED,     /* the version waited for (or a later one) is
                                 in the bucket */
    WRITER_SYNC_FAILED,       /* an upload of it begun by the sync, or
                                 after it began, failed (err): it stays
                                 pending, journaled, retried in the
                                 background; or a write to it failed (err)
                                 and was not written again: not uploaded */
    WRITER_SYNC_REMOVED,      /* unlinked or dropped meanwhile */
    WRITER_SYNC_NOT_CLOSED,   /* open for writing with nothing closed to
                                 wait for (no promise): not waited for */
    WRITER_SYNC_WAITING,      /* still under way when the sync was
                                 interrupted */
};

struct writer_synced {
    char *key;                /* the file's key at the end (malloc'd) */
    void *owner;              /* as writer_file_create() was told */
    uint64_t size;            /* bytes of the version waited for */
    enum writer_sync_outcome outcome;
    int err;                  /* FAILED: the upload's errno */
    unsigned retries;         /* failed uploads since its last success */
};

/* Owned by the caller: writer_sync_report_free(). */
struct writer_sync_report {
    struct writer_synced *files;
    size_t count;
    bool interrupted;         /* *interrupted ended the wait */
};

/*
 * Upload every file pending now and wait (`s3cachefs sync`): without
 * stopping anything, each file pending when the call begins is made due
 * now (a settle delay or a retry's backoff is cut short) and waited for:
 * its current version if nobody has it open for writing, else its last
 * closed version, the one its journal entry promises (bytes not closed
 * yet are not "written so far"; such a file with no promise is reported
 * NOT_CLOSED and not waited for). One upload begun after the call began
 * decides a file: success, or FAILED with its errno (the S3 client has
 * spent its retries). Files that become pending meanwhile are not waited
 * for. Returns when every file is decided, or when *INTERRUPTED is true
 * (set it, then call writer_sync_wake()): what is undecided is WAITING.
 * The calling thread only waits: uploads run on the uploader threads.
 * Fills *OUT (files in no particular order); 0 or ENOMEM.
 */
int writer_sync(struct writer *writer, const atomic_bool *interrupted,
                struct writer_sync_report *out);
void writer_sync_report_free(struct writer_sync_report *report);

/* Make every writer_sync() under way look at its INTERRUPTED flag. Takes
 * the writer lock: never call it with the lock held. */
void writer_sync_wake(struct writer *writer);

/* A pending file as `s3cachefs pending` shows it. */
enum writer_pending_state {
    WRITER_PENDING_OPEN,      /* written through a descriptor still open,
                                 nothing of it promised: not closed */
    WRITER_PENDING_WAITING,   /* closed (promised) and waiting for its
                                 upload: queued, settling, or a retry's
                                 backoff */
    WRITER_PENDING_UPLOADING, /* an upload of it is under way */
    WRITER_PENDING_FAILED,    /* its last upload failed (last_error); a
                                 retry is queued. Or a write to it failed
                                 (last_error) and was not written again:
                                 not uploaded until it is */
};

struct writer_pending {
    char *key;                /* malloc'd */
    void *owner;
    enum writer_pending_state state;
    uint64_t size;            /* its data now */
    bool promised;            /* the journal holds a promise of it ... */
    uint64_t promised_size;   /* ... of this many bytes */
    bool open;                /* open for writing */
    uint64_t staging_id;      /* the staging file of its promise, else of
                                 its data (CACHE/staging/ID, in hex) */
    struct timespec closed_at; /* wall clock; 0: never closed */
    unsigned retries;         /* failed uploads since its last success */
    int last_error;           /* of the last failed upload; 0: none */
};

/*
 * The files pending now (dirty and not unlinked), in the writer's order,
 * then the directory markers waiting to be sent (writeback mode: a key
 * ending in '/', size 0, staging_id 0, closed_at the change it sends):
 * *LIST (malloc'd, COUNT entries; writer_pending_free()), and the number
 * of entries the journal holds (promises, multipart uploads to abort,
 * records this version cannot read) in *JOURNAL_ENTRIES. 0 or ENOMEM.
 */
int writer_pending_list(struct writer *writer, struct writer_pending **list,
                        size_t *count, uint64_t *journal_entries);
void writer_pending_free(struct writer_pending *list, size_t count);

/*
 * Give FILE's pending data up (`s3cachefs pending --drop`): it is never
 * uploaded; its journal entry goes now and its staging data with the last
 * reference, as for an unlink, but nothing is deleted in the bucket (an
 * older object under its key stays). *SIZE and *STAGING_ID say what went
 * (the size promised, or written; its promise's staging file, or its
 * data's). Waits while a rename holds it. Returns 0; EBUSY when it is open
 * for writing or being written or uploaded now (try again once the
 * upload has failed); EALREADY when nothing of it is pending (uploaded
 * meanwhile); the journal's errno when its entry could not be removed
 * (then nothing changed: it is still to be uploaded).
 */
int writer_file_drop(struct writer_file *file, uint64_t *size,
                     uint64_t *staging_id);

/*
 * A new staged file for KEY, empty (size 0). DIRTY says whether it must be
 * uploaded even if nothing is written (a created file). OWNER is passed
 * back in the uploaded callback. Returns 0, ENOSPC, EIO...
 */
int writer_file_create(struct writer *writer, const char *key,
                       const struct writer_meta *meta, bool dirty, void *owner,
                       struct writer_file **out);

/*
 * A staged edit of object KEY (version ETAG, SIZE bytes), clean: nothing is
 * fetched now; the base's bytes are fetched (fetch_base) a granule at a
 * time when read or partly overwritten, and ranges never written are
 * copied server-side when it is uploaded (where the server can). Journaling
 * it (writeback close, a failed upload) fetches the rest first.
 */
int writer_file_create_edit(struct writer *writer, const char *key,
                            const struct writer_meta *meta, const char *etag,
                            uint64_t size, void *owner, struct writer_file **out);

/* Another reference / drop one; *file = NULL. When the last reference goes
 * and the file is not pending, its staged data becomes the cached version
 * it was uploaded as (or is removed). */
struct writer_file *writer_file_ref(struct writer_file *file);
void writer_file_put(struct writer_file **file);

/* Write (makes the file dirty, updates mtime). ENOSPC, EIO, EFBIG; on
 * a failure but EFBIG the file is not uploaded until [OFFSET, OFFSET +
 * LEN) is written again (see the promise above). */
int writer_file_write(struct writer_file *file, uint64_t offset, const void *data,
                      size_t len);

/* Read from the staged data; *got < LEN only at the end. */
int writer_file_read(struct writer_file *file, uint64_t offset, size_t len,
                     void *buf, size_t *got);

/* Change the size (dirty). */
int writer_file_truncate(struct writer_file *file, uint64_t size);

/* Size, metadata and state of the file. */
void writer_file_info(struct writer_file *file, uint64_t *size,
                      struct writer_meta *meta, bool *pending);

/* Replace the metadata; it makes the file dirty: the next flush uploads
 * it (with the data). */
void writer_file_set_meta(struct writer_file *file, const struct writer_meta *meta);

/* close(): see the promise above. */
int writer_file_flush(struct writer_file *file);

/* fsync(): returns once the file is in the bucket (or its upload failed). */
int writer_file_sync(struct writer_file *file);

/* A handle was opened for writing / closed (after its flush). In
 * writeback mode the upload starts once the last one is closed. */
void writer_file_open_writer(struct writer_file *file);
void writer_file_close_writer(struct writer_file *file);

/* Whether the file still has to reach the bucket (dirty, queued, being
 * uploaded or failed). */
bool writer_file_pending(struct writer_file *file);

/* Whether an upload of the file is under way or concluding (its uploaded
 * callback not returned yet): what it made is not recorded everywhere. */
bool writer_file_uploading(struct writer_file *file);

/* What a renamed file's data was, as writer_file_hold() found it. */
enum writer_renamed {
    /* in the bucket: the object at the old key is the file (to be moved) */
    WRITER_RENAMED_UPLOADED,
    /* to be uploaded, its promise in the journal: an object at the old key
     * is an older version, to be deleted before the promise leaves the key
     * (writer_file_rename()), so that a crash in between leaves the old
     * name with its last promise, never with that older version */
    WRITER_RENAMED_JOURNALED,
    /* to be uploaded, saved nowhere yet (written, not yet closed): an
     * object at the old key is the last saved version, the only one a
     * crash would leave (it is to be kept, under the new key) */
    WRITER_RENAMED_UNSAVED,
};

/* Hold the file for a rename: wait for an upload of it under way, fetch
 * what an edit still needs of its base, and keep every upload, write or
 * other change of it from beginning, also on failure, until
 * writer_file_release(). *STATE says what the data is (see enum
 * writer_renamed); it stays so while the file is held. A rename moves
 * the old object first, and an upload of the new data must not land
 * before it. 0 or the fetch's errno. */
int writer_file_hold(struct writer_file *file, enum writer_renamed *state);

/* The file, held, is now to be uploaded as NEW_KEY (a rename); once not
 * UPLOADED, its data goes to NEW_KEY when it is uploaded, and its journal
 * entry names NEW_KEY on return. REPLACED (may be NULL) is the staged
 * file the rename replaces at NEW_KEY, unlinked before with
 * writer_file_unlink(REPLACED, false): when the state is JOURNALED, its
 * journal entry goes in the same transaction as this file's entry moves
 * to NEW_KEY (a crash leaves one promise or the other); otherwise the
 * caller drops it with writer_file_forget() once the bucket holds what
 * NEW_KEY now names. 0, ENOMEM or the journal's errno (the key is the
 * new one even then: writer_file_rename_back() puts it back). */
int writer_file_rename(struct writer_file *file, const char *new_key,
                       struct writer_file *replaced);

/* Undo writer_file_rename() of a held file: it is to be uploaded as KEY
 * again (re-journaled if it was), still held. */
int writer_file_rename_back(struct writer_file *file, const char *key);

/* End the hold of writer_file_hold(). */
void writer_file_release(struct writer_file *file);

/* Fetch every byte of an edit's base that is not staged yet (its object
 * is about to go away). 0 or the fetch's errno. */
int writer_file_complete(struct writer_file *file);

/* The file was created for OWNER (attached to a recovered file). */
void writer_file_set_owner(struct writer_file *file, void *owner);

/* The file was unlinked: never upload it; its data goes when the last
 * reference does (the caller holds one). Waits for an upload of it under
 * way (so that the caller's DELETE comes after it). FORGET: its journal
 * entry goes now (else it stays until writer_file_forget() or
 * writer_file_rename(), for a rename that replaces it). Returns whether
 * an upload of it reached the bucket (then the object is there to
 * delete). */
bool writer_file_unlink(struct writer_file *file, bool forget);

/* Drop the journal entry of a file unlinked with writer_file_unlink(file,
 * false). */
void writer_file_forget(struct writer_file *file);

/* Undo writer_file_unlink() (the operation that unlinked it failed): it
 * is journaled again if its entry went, and uploaded if it is pending. */
void writer_file_relink(struct writer_file *file);

/* Whether the object was uploaded and its ETag (S3_ETAG_MAX bytes). */
bool writer_file_etag(struct writer_file *file, char *etag_out);

/* FILE's uploaded object was copied to FILE's key (a rename, FILE held
 * since writer_file_rename()), where it has ETAG: that is the version of
 * its staged data now, the one the cache adopts it as (an ETag of its
 * own when the copy was of parts). Nothing if FILE changed since. */
void writer_file_copied(struct writer_file *file, const char *etag);

/* ------------------------------------------------------ renames
 * (writer_journal.c; see HACKING.md, "Renames") */

/* A rename's change of the bucket, as the journal records it. */
struct writer_move {
    const char *from;             /* a key, or a directory's prefix */
    const char *to;
    unsigned flags;               /* JOURNAL_MOVE_* (journal.h) */
    const char *etag;             /* a file's ETag at FROM ("" or NULL) */
};

/*
 * Record MOVE in the journal before the first request of a rename that
 * changes the bucket, so that a crash between its requests is finished
 * by the next mount (writer_recover()'s FINISH) rather than left half
 * done. REPLACED (may be NULL): the staged file the rename replaces at
 * MOVE->to (unlinked with writer_file_unlink(REPLACED, false)): the move
 * names its promise, which recovery drops once it has finished the move,
 * and writer_move_end() in the same transaction as the move's record.
 * *ID gets the record's id. 0 or the journal's errno (logged; nothing was
 * recorded, nothing must be changed).
 */
int writer_move_begin(struct writer *writer, const struct writer_move *move,
                      struct writer_file *replaced, uint64_t *id);

/* The move ID is done in the bucket: its record goes, with REPLACED's
 * promise (the one writer_move_begin() was given, or NULL) in the same
 * transaction. ID 0: nothing. 0 or the journal's errno (logged, after one
 * more try: the record stays, and the next mount finishes the move
 * again, over whatever this mount changed of those names since; it takes
 * a journal whose disk refuses a delete). */
int writer_move_end(struct writer *writer, uint64_t id,
                    struct writer_file *replaced);

/* The rename of move ID failed and is undone (REPLACED keeps its
 * promise): the record goes. ID 0: nothing. 0 or the journal's errno
 * (logged, after one more try: the next mount then does the rename that
 * failed). */
int writer_move_cancel(struct writer *writer, uint64_t id);

/* The rename of move ID is done but for LEFT (what the next mount is to
 * finish: an old key whose delete got no answer): the record becomes
 * LEFT, and REPLACED's promise goes, in one transaction. 0 or the
 * journal's errno (logged; the whole move stays recorded). */
int writer_move_narrow(struct writer *writer, uint64_t id,
                       const struct writer_move *left,
                       struct writer_file *replaced);

/* ------------------------------------------ directory markers
 * (writer_marker.c; see HACKING.md, "Directory markers in writeback mode") */

/*
 * The marker of directory DIR_KEY (ends in '/') is to be PUT with
 * PUT_META (content type and s3fs headers; the mode's file type is set to
 * S_IFDIR). Default mode: sent now, in this thread; returns its errno.
 * Writeback mode: journaled (durable when it returns 0) and sent in the
 * background a moment later, several at a time, coalesced with later
 * calls for the same key (the last metadata wins: an untarred directory's
 * mkdir, utimes and chmod cost one PUT). Until it is sent it counts in
 * uploads_pending, writer_marker_pending() sees it, and writer_drain(),
 * writer_sync() and the next mount after a crash send it. When the
 * journal refuses it, it is sent now instead. EINVAL for a key not ending
 * in '/', or the PUT's errno.
 */
int writer_marker_put(struct writer *writer, const char *dir_key,
                      const struct s3_put_meta *put_meta);

/* Whether the marker of DIR_KEY waits to be sent; its metadata in *META
 * (may be NULL). */
bool writer_marker_pending(struct writer *writer, const char *dir_key,
                           struct writer_meta *meta);

/* VISIT is called for every waiting marker whose key starts with PREFIX,
 * with the markers' lock held (a leaf: VISIT must not call the writer;
 * the inode table lock may be held by the caller). KEY is valid during
 * the call only. */
typedef void (*writer_marker_visit_fn)(void *arg, const char *key,
                                       const struct writer_meta *meta);
void writer_marker_visit(struct writer *writer, const char *prefix,
                         writer_marker_visit_fn visit, void *arg);

/* Send every marker waiting under PREFIX ("": all) now, in this thread
 * (or wait for a sender that has it) and return once each is in the
 * bucket or has failed once: 0, or the errno of a failure (that marker
 * stays waiting, retried in the background). Before a directory is
 * renamed: the move must find its markers in the bucket. */
int writer_marker_flush(struct writer *writer, const char *prefix);

/* The marker of DIR_KEY is no longer owed (rmdir): waits for a send or a
 * journal write of it under way, then drops it and its journal entry.
 * The caller deletes the object afterwards. */
void writer_marker_forget(struct writer *writer, const char *dir_key);

#endif /* S3CFS_WRITER_H */
