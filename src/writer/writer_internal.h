/*
 * writer_internal.h - what the files of the writer share (not for other
 * modules): the state of staged files and of the writer, the small
 * helpers every part uses, and each file's functions for the files above
 * it. The files, each using only those before it:
 *
 *   writer_state.c    staging files (versions and their seals), taking a
 *                     version, the upload queue and its retries
 *   writer_edit.c     edits of objects in the bucket: granules of the
 *                     base fetched when needed, server-side copies
 *   writer_journal.c  promises: journal entries written, moved, dropped;
 *                     the last reference of a file
 *   writer_upload.c   uploading a version, write-behind, the uploaders
 *   writer_marker.c   directory markers owed to the bucket (writeback
 *                     mode): journaled, sent in the background, coalesced
 *   writer.c          the API of writer.h: files, writes, close, sync,
 *                     rename and unlink, the drain
 *   writer_sync.c     `s3cachefs sync` and `pending`: every pending file
 *                     uploaded now and waited for, the list of pending
 *                     files, a pending file given up (drop)
 *   writer_recover.c  recovery after a crash
 *
 * The states, locks and invariants are described at the top of writer.c.
 * "(W)" marks fields guarded by the writer lock.
 */
#ifndef S3CFS_WRITER_INTERNAL_H
#define S3CFS_WRITER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/invariant.h"
#include "writer/staging.h"
#include "writer/upload.h"
#include "writer/writebehind.h"
#include "writer/writer.h"

#define GRANULE (1ull << 20)        /* unit of fetching an edited object */

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
    /* a write or truncate of it that failed (writer.c): the bytes of
     * [unwritten_from, unwritten_to) are not what was asked for, so its
     * data is neither promised nor uploaded (its promise still is) until
     * they are written again or cut off; 0: none */
    int unwritten_err;            /* (W) the failure's errno */
    uint64_t unwritten_from, unwritten_to; /* (W) non-empty iff an errno */
    unsigned active_writes;
    unsigned open_writers;        /* handles open for writing */
    double due;                   /* upload not before (monotonic) */
    unsigned retries;             /* failed uploads since the last one */
    int last_error;
    /* for writer_sync() (writer_sync.c) */
    unsigned attempts;            /* (W) calls of writer_upload_version()
                                     past their wait that ended (one at a
                                     time: they wait for `sending`) */
    int attempt_err;              /* (W) the last one's errno; 0: it sent its
                                     version, or had nothing to send */
    unsigned sync_wanted;         /* (W) syncs waiting for it: the uploaders
                                     send its promise even while it is open
                                     for writing in writeback mode */
    struct timespec closed_at;    /* (W) wall clock: its last close while
                                     pending (recovered: its entry's mtime);
                                     0: never closed */
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
    struct orphan_upload *orphans; /* multipart uploads whose abort failed */
    struct sync_waiter *sync_waiters; /* writer_sync() calls waiting */
    struct writer_stats stats;
    struct writer_markers *markers; /* directory markers owed (writer_marker.c) */
};

/* A writer_sync() waiting (writer_sync.c): the files it may wait for
 * whose state changed since it last looked (an upload attempt ended, an
 * unlink, a drop), so that a wake costs what changed, not a pass over
 * every file. (W) */
struct sync_waiter {
    struct sync_waiter *next;
    struct writer_file **touched; /* no references: looked up, not used */
    size_t touched_count, touched_cap;
    bool overflow;                /* TOUCHED could not grow: look at all */
};

/* A multipart upload left on the server because its abort failed: an
 * unclosed journal entry (id) names it, so that the drain or the next
 * mount aborts it (writer_keep_orphan). */
struct orphan_upload {
    uint64_t id;                  /* its journal entry; 0: none written */
    char *key, *upload_id;
    struct orphan_upload *next;
};

/* A version of a file: what an upload sends or a journal entry names. */
struct version {
    struct staging_file *staging; /* a reference */
    uint64_t size, gen, data_gen;
    struct writer_meta meta;
};

/* What an upload's callbacks (upload.h) are given: the version of FILE
 * being uploaded. */
struct upload_context {
    struct writer *writer;
    struct writer_file *file;
    const struct version *version;
};

/* ------------------------------------------------ small state helpers */

static inline bool is_dirty(const struct writer_file *file)
{
    return file->gen != file->uploaded_gen;
}

static inline bool is_pending(const struct writer_file *file)
{
    return is_dirty(file) && !file->unlinked;
}

/* Whether the journal promises a version newer than the bucket's. */
static inline bool has_promise(const struct writer_file *file)
{
    return file->entry != NULL && !file->entry_unclosed &&
           file->entry_gen > file->uploaded_gen;
}

static inline bool bit_get(const unsigned char *bits, uint64_t i)
{
    return (bits[i / 8] >> (i % 8)) & 1;
}

static inline void bit_set(unsigned char *bits, uint64_t i, bool value)
{
    if (value)
        bits[i / 8] |= (unsigned char)(1u << (i % 8));
    else
        bits[i / 8] &= (unsigned char)~(1u << (i % 8));
}

static inline struct staging_file *hold_locked(struct staging_file *staging)
{
    staging->refs++;
    return staging;
}

/* Drop a reference (lock held); returns STAGING when it was the last, for
 * writer_staging_free() once the lock is released, else NULL. */
static inline struct staging_file *unref_locked(struct staging_file *staging)
{
    if (staging == NULL || --staging->refs > 0)
        return NULL;
    return staging;
}

/* The bytes of STAGING that must not change in place. */
static inline uint64_t sealed_size(const struct staging_file *staging)
{
    return staging->journal_seal > staging->upload_seal ? staging->journal_seal
                                                        : staging->upload_seal;
}

/* A journal write of the first SIZE bytes of STAGING begins (lock held):
 * they are sealed until end_promising_locked(). */
static inline void begin_promising_locked(struct staging_file *staging, uint64_t size)
{
    staging->promising++;
    if (size > staging->journal_seal)
        staging->journal_seal = size;
}

/* A journal write of STAGING ended (lock held): its seal is what its entry
 * promises, if it has one, unless another write of it is still under way. */
static inline void end_promising_locked(struct writer_file *file,
                                        struct staging_file *staging)
{
    if (--staging->promising > 0)
        return;
    staging->journal_seal = file->entry == staging && !file->entry_unclosed
                                ? file->entry_size : 0;
}

/* ------------------------------------------------------- writer_state.c */

/* Check the writer's invariants (see the top of writer.c); lock held.
 * Called by writer_unlock() and writer_wait() in debug builds. */
void writer_check_invariants_locked(const struct writer *writer);

/* Release the writer lock / wait on COND with it (or until UNTIL, a
 * monotonic time: ETIMEDOUT), checking the invariants first in debug
 * builds. */
static inline void writer_unlock(struct writer *writer)
{
    if (INVARIANTS_ON)
        writer_check_invariants_locked(writer);
    pthread_mutex_unlock(&writer->lock);
}

static inline void writer_wait(struct writer *writer, pthread_cond_t *cond)
{
    if (INVARIANTS_ON)
        writer_check_invariants_locked(writer);
    pthread_cond_wait(cond, &writer->lock);
}

static inline int writer_wait_until(struct writer *writer, pthread_cond_t *cond,
                                    const struct timespec *until)
{
    if (INVARIANTS_ON)
        writer_check_invariants_locked(writer);
    return pthread_cond_timedwait(cond, &writer->lock, until);
}

int writer_staging_new(struct writer *writer, struct staging_file **out);

/* Close and free STAGING, removing its file unless KEEP. Lock not held. */
void writer_staging_free(struct writer *writer, struct staging_file *staging,
                         bool keep);

/* Drop a reference, lock not held; *STAGING = NULL. */
void writer_staging_drop(struct writer *writer, struct staging_file **staging);

/*
 * Take FILE's current version (lock held): waits until no write or copy of
 * its data is under way, and seals the version's bytes in its staging file
 * (FOR_UPLOAD: for an upload, else for a journal write, which the caller
 * ends with end_promising_locked()).
 */
void writer_version_take_locked(struct writer *writer, struct writer_file *file,
                                bool for_upload, struct version *out);

/* A write or truncate of FILE over [FROM, TO) failed with ERR (lock
 * held): those bytes are not what was asked for, and FILE's data is not
 * promised nor uploaded until writer_unwritten_cover_locked() says they
 * are. Nothing for an empty range or EFBIG (a size refused before
 * anything was tried). */
void writer_unwritten_add_locked(struct writer_file *file, uint64_t from,
                                 uint64_t to, int err);

/* [FROM, TO) of FILE was written as asked (a write; a truncate to FROM
 * passes TO = UINT64_MAX): what it covers of the unwritten bytes is good
 * again (lock held). */
void writer_unwritten_cover_locked(struct writer_file *file, uint64_t from,
                                   uint64_t to);

/* Queue FILE for a background upload not before DELAY seconds from now
 * (a reference goes with it). Lock held. */
void writer_enqueue_locked(struct writer *writer, struct writer_file *file,
                           double delay);

/* Take FILE out of the upload queue (lock held); returns whether it was
 * there (the queue's reference is then the caller's to drop). */
bool writer_dequeue_locked(struct writer *writer, struct writer_file *file);

/* A failed upload of FILE: try again in the background, later each time
 * (lock held). Not during the drain, which tries each file once more. */
void writer_schedule_retry_locked(struct writer *writer, struct writer_file *file);

/* FILE's upload attempt ended, or it was unlinked (lock held): tell the
 * syncs waiting for it (sync_wanted), which look at it when woken
 * (file_idle, which the caller broadcasts). */
void writer_sync_touch_locked(struct writer *writer, struct writer_file *file);

/* A new file of KEY whose data is DATA (its reference goes with it),
 * with one reference for the caller. Not on the writer's list, where
 * other threads see it, until writer_file_publish(): the caller fills it
 * in first. ENOMEM. */
int writer_file_new(struct writer *writer, struct staging_file *data,
                    const char *key, const struct writer_meta *meta,
                    void *owner, struct writer_file **out);

/* Put FILE, filled in, on the writer's list. */
void writer_file_publish(struct writer *writer, struct writer_file *file);

/* Free FILE, never published, and its data's staging file. */
void writer_file_discard(struct writer *writer, struct writer_file *file);


/* ------------------------------------------------------- writer_edit.c */

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
                        uint64_t offset, uint64_t len, bool covered);

/* After a write of [OFFSET, OFFSET + LEN) whose first WRITTEN bytes
 * landed: the granules it claimed whole are present if they were written
 * whole, else fetched again when needed. Lock held. */
void writer_settle_covered_locked(struct writer *writer, struct writer_file *file,
                                  uint64_t offset, uint64_t len, uint64_t written);

/* Mark the granules of [OFFSET, OFFSET + LEN) as changed. Lock held. */
void writer_mark_written_locked(struct writer_file *file, uint64_t offset,
                                uint64_t len);

/* Whether FILE's data may be copied: every byte of it is in its staging
 * file (not an edit, or an edit with every granule fetched). */
bool writer_copyable(const struct writer_file *file);

/* Forget the base of a complete edit (lock held): nothing is copied from
 * it any more. (An upload under way has its own copy of the base's key,
 * and nothing left to fetch from it.) */
void writer_drop_base_locked(struct writer_file *file);

bool writer_base_range_unchanged(void *arg, uint64_t offset, uint64_t length);

int writer_base_materialize(void *arg, uint64_t offset, uint64_t length);

/* The uploaded object is the base of what comes next (lock held, the
 * upload of version V just ended): what is not fetched yet is its bytes.
 * If the data changed since V was taken, the base is no longer known to
 * hold what the file does anywhere: it is dropped (the file is complete
 * then: only complete data is copied on write). */
void writer_rebase_locked(struct writer_file *file, const struct version *v,
                          const char *key, const char *etag);


/* ---------------------------------------------------- writer_journal.c */

void writer_entry_of(uint64_t id, const char *key, uint64_t size,
                     const struct writer_meta *meta, const char *upload_id,
                     bool unclosed, struct journal_entry *out);

/* Wait for FILE's journal updates to be its caller's (lock held). */
void writer_journal_begin_locked(struct writer *writer, struct writer_file *file);

void writer_journal_end_locked(struct writer *writer, struct writer_file *file);

/*
 * Promise version V of FILE (taken with writer_version_take_locked(..., false),
 * whose seal this ends): make its staging file durable and journal it,
 * replacing the file's previous entry in the same transaction. UPLOAD_ID
 * (may be NULL) is a multipart upload of it to abort after a crash.
 * Returns 0 when the journal promises V (or a later version, or the
 * bucket has it), else the errno (logged). Lock not held.
 */
int writer_promise(struct writer *writer, struct writer_file *file,
                   const struct version *v, const char *upload_id);

/*
 * Delete FILE's journal entry if what it promises is in the bucket
 * (UP_TO: the gen that is) or the file is unlinked (UP_TO 0: whatever it
 * promises). Lock not held. A failure is logged: the next mount uploads
 * the entry again, which costs a request, never data.
 */
void writer_forget_entry(struct writer *writer, struct writer_file *file,
                         uint64_t up_to);

/* The same, putting PUT (NULL: none) and deleting the record ALSO (0:
 * none) in the same transaction; returns the journal's errno. */
int writer_forget_entry_with(struct writer *writer, struct writer_file *file,
                             uint64_t up_to, const struct journal_entry *put,
                             uint64_t also);

/* Promise FILE's current version in the journal (writeback close). */
int writer_promise_current(struct writer *writer, struct writer_file *file);

/*
 * Move FILE's journal entry to FILE's key (after a rename; FILE is held),
 * deleting REPLACED's entry in the same transaction when REPLACED is not
 * NULL. An unclosed entry only goes: its upload was for the old key.
 */
int writer_move_entry(struct writer *writer, struct writer_file *file,
                      struct writer_file *replaced);

/*
 * The drain's last try for a pending file the journal does not hold (its
 * promise could not be written before: a full or failing disk): promise
 * it now, or failing that, keep its promise beside its staging file
 * (staging_mark), which the next mount puts back into the journal. Its
 * staged data is kept either way (it is pending).
 */
void writer_promise_at_drain(struct writer *writer, struct writer_file *file);


/* upload.h's abort_failed (ARG: the writer): UPLOAD_ID of KEY is left on
 * the server. It is journaled as an unclosed entry of its own, so that a
 * crash leaves it to the next mount's recovery to abort, and kept for the
 * drain to abort (writer_abort_orphans). Never with the lock held. */
void writer_keep_orphan(void *arg, const char *key, const char *upload_id);

/* Abort the uploads writer_keep_orphan() kept; each aborted goes from the
 * journal and the list, the others stay for the next mount. Returns the
 * number left. Lock not held. */
unsigned writer_abort_orphans(struct writer *writer);

/* ----------------------------------------------------- writer_upload.c */

/* Which version of a file an upload sends. */
enum writer_upload_what {
    WRITER_UPLOAD_CURRENT,        /* what it holds now (a close, an fsync) */
    WRITER_UPLOAD_PROMISED,       /* what its journal entry promises */
    /* a background upload: what it holds, or only its promise if it is
     * open for writing by the time the version is taken (what is written
     * and not closed is not sent; in writeback mode nothing is, unless a
     * sync waits for it: its last close queues it again) */
    WRITER_UPLOAD_CLOSED,
};

/*
 * Upload a version of FILE in this thread, as WHAT says. Waits for an
 * upload of the file under way first (and, unless only its promise is
 * to go, for writes under way). Returns 0 when that version (or a later
 * one) is in the bucket, or when there is nothing to send; else the
 * upload's errno (the file stays pending, journaled, and is tried again
 * in the background).
 */
int writer_upload_version(struct writer *writer, struct writer_file *file,
                          enum writer_upload_what what);

void *writer_uploader_main(void *arg);

/*
 * Create FILE's write-behind upload: a write (still under way, so the
 * file is neither held nor copied meanwhile) took it past the multipart
 * threshold from its start. Its upload id goes into the journal: in an
 * `unclosed` entry (nobody was promised this data: after a crash the
 * upload is aborted, the data dropped), or into the file's entry if it
 * has one (the promised version is uploaded after the abort). On failure
 * the file is uploaded the usual way at close.
 */
void writer_start_writebehind(struct writer *writer, struct writer_file *file);

/* ----------------------------------------------------- writer_marker.c */

struct writer_markers;

/* The markers of WRITER (its conf set): sender threads in writeback mode
 * only. 0 or an errno. */
int writer_markers_create(struct writer *writer, struct writer_markers **out);

/* Stop the senders; markers still waiting stay in the journal for the
 * next mount. *markers = NULL; safe twice. */
void writer_markers_destroy(struct writer_markers **markers);

/* Markers waiting (sent or not yet). */
uint64_t writer_markers_count(struct writer_markers *markers);

/* Append the markers waiting to *LIST (USED of CAP entries, grown as
 * needed), as writer_pending entries: their key ends in '/', size 0,
 * staging_id 0, closed_at the time of the change they wait to send.
 * 0 or ENOMEM (what was appended stays, *USED says how many). */
int writer_markers_pending(struct writer_markers *markers,
                           struct writer_pending **list, size_t *used,
                           size_t *cap);

/* Whether ENTRY (read back from the journal) is a directory marker's. */
bool writer_marker_entry(const struct journal_entry *entry);

/* Recovery: ENTRY, a marker's, is owed again; sent in the background (in
 * the default mode: now). */
void writer_marker_recovered(struct writer *writer,
                             const struct journal_entry *entry);

/* The drain: every marker sent now; the number left (they stay in the
 * journal for the next mount), each failure logged. */
uint64_t writer_marker_drain(struct writer *writer);

#endif /* S3CFS_WRITER_INTERNAL_H */
