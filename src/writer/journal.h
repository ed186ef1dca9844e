/*
 * journal.h - the durable record of writes not yet in the bucket.
 *
 * Every staged file that must reach the bucket (closed in writeback mode,
 * or whose upload failed or is under way) has one entry here, and so does
 * a file still being written whose write-behind upload is under way
 * (`unclosed`, so that a crash leaves no stale multipart upload): the
 * staging file it lives in (by id), its destination key and the metadata
 * it is uploaded with. The journal is its own LMDB environment in
 * CACHE/journal, opened durable (each commit is fsynced, unlike the
 * cache index), so that an entry committed before close() returned
 * survives kill -9 and power loss with the cache disk intact. The next
 * mount scans it and uploads what it holds.
 *
 * Callers fsync the staging file before journal_put(): the entry must
 * never point at data that is not on disk.
 *
 * Threads: every function may be called from any thread; concurrent
 * journal_put/journal_del calls may share one fsync (group commit).
 */
#ifndef S3CFS_JOURNAL_H
#define S3CFS_JOURNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>

/* What an entry records. */
enum journal_kind {
    /* a staged file (or a directory marker, writer_marker.c) to upload */
    JOURNAL_UPLOAD = 0,
    /* a rename begun, to be finished by recovery if a crash stops it (see
     * "Renames" in HACKING.md): KEY moves to MOVE_TO */
    JOURNAL_MOVE,
};

/* Flags of a JOURNAL_MOVE. */
#define JOURNAL_MOVE_PREFIX 0x01u /* every key under the prefix KEY (a
                                     directory, ends in '/') moves */
#define JOURNAL_MOVE_COPY 0x02u   /* a file: the object under KEY is
                                     copied to MOVE_TO, then deleted */
#define JOURNAL_MOVE_DROP_TARGET 0x04u /* a file, no copy: the object under
                                     MOVE_TO goes too */

struct journal_entry {
    uint64_t id;                /* names the staging file (staging.h) */
    enum journal_kind kind;
    /* the bucket it is for, "ENDPOINT/BUCKET" (journal_open()): NULL in a
     * put means the journal's own; NULL from a scan, a record of an older
     * s3cachefs that did not record it (taken as the journal's) */
    const char *destination;
    const char *key;            /* destination key in the bucket; a
                                   move's source key or prefix */
    uint64_t size;              /* bytes to upload */
    uint32_t mode;              /* s3fs mode: file type bits included */
    uint32_t uid, gid;
    struct timespec mtime;
    const char *upload_id;      /* multipart upload under way, or NULL */
    /* the file was never closed (a write-behind upload under way): after
     * a crash its upload is aborted and nothing else is done (nobody was
     * promised its data) */
    bool unclosed;
    /* JOURNAL_MOVE only (an upload's are NULL/0) */
    const char *move_to;        /* the key or prefix it moves to */
    const char *move_etag;      /* a file's ETag when the move began ("" or
                                   NULL: none known) */
    unsigned move_flags;        /* JOURNAL_MOVE_* */
    uint64_t move_replaces;     /* a file's: the id of the promise of the
                                   file it replaces at MOVE_TO, which goes
                                   with the move (0: none) */
};

struct journal;

/*
 * Open (creating if needed) the journal in directory PATH, for the bucket
 * DESTINATION ("ENDPOINT/BUCKET", copied): every entry put is stamped with
 * it (unless it names its own), and scans hand out only the entries for
 * it (and those of older records, which name none). Returns 0, or an
 * errno with a sentence in ERRBUF (a damaged journal is an error, never
 * silently emptied: it may hold the only copy of what users wrote).
 */
int journal_open(const char *path, const char *destination,
                 struct journal **out, char *errbuf, size_t errlen);

/*
 * How many entries the journal in PATH holds, whatever they are for,
 * without keeping it open (before daemonizing: the environment is closed
 * again before it returns). No journal there: 0 entries. Returns 0, or an
 * errno with a sentence in ERRBUF.
 */
int journal_peek(const char *path, uint64_t *count, char *errbuf,
                 size_t errlen);

/* The journal's DESTINATION (valid until journal_close()). */
const char *journal_destination(const struct journal *journal);

/* Close; *journal = NULL. Safe twice. */
void journal_close(struct journal **journal);

/* A new id, greater than every id the journal holds or has handed out. */
uint64_t journal_next_id(struct journal *journal);

/* Insert or replace the entry ENTRY->id; durable when it returns 0.
 * ENOSPC, EIO, EINVAL (key empty or over 1024 bytes, a move without its
 * target). */
int journal_put(struct journal *journal, const struct journal_entry *entry);

/* Remove entry ID (absent: 0); durable when it returns 0. */
int journal_del(struct journal *journal, uint64_t id);

/*
 * Insert or replace the PUT_COUNT entries PUTS and remove the entries
 * DELS (absent ones are ignored; an id both put and removed is put) in
 * one transaction: after a crash either every change is there or none.
 * Durable when it returns 0. ENOSPC, EIO, EINVAL (a bad entry), ENOMEM.
 */
int journal_update(struct journal *journal, const struct journal_entry *puts,
                   size_t put_count, const uint64_t *dels, size_t del_count);

/*
 * Visit every entry for the journal's destination in id order (entries
 * for another bucket are kept and skipped, with one log line per scan).
 * The entry's strings are valid during the call only. VISIT returns 0 to
 * go on or an errno to stop (returned).
 */
typedef int (*journal_visit_fn)(void *arg, const struct journal_entry *entry);
int journal_scan(struct journal *journal, journal_visit_fn visit, void *arg);

/* Whether the journal holds a record for ID, readable or not (a record
 * of a format this version cannot read may still name data a newer one
 * promised). True when the journal cannot be read. */
bool journal_has(struct journal *journal, uint64_t id);

/* Number of entries. */
uint64_t journal_count(struct journal *journal);

/* Write transactions committed since the journal was opened (each one
 * fsync): with concurrent callers, fewer than their updates. */
uint64_t journal_commits(struct journal *journal);

/* For tests of the group commit: with HOLD, updates queue up and wait
 * and no commit begins until journal_hold(false); journal_wait_queued()
 * returns once COUNT updates are queued. */
void journal_hold(struct journal *journal, bool hold);
void journal_wait_queued(struct journal *journal, unsigned count);

/*
 * The record format on its own, no journal needed (tests, fuzzing, the
 * promises kept beside staging files).
 * journal_record_encode(): ENTRY (its id is the record's key, not part of
 * it; its destination must be set) -> a malloc'd *RECORD of *LEN bytes,
 * as journal_put() stores it. Returns 0, EINVAL for an entry
 * journal_put() refuses or one without a destination, ENOMEM.
 */
int journal_record_encode(const struct journal_entry *entry,
                          unsigned char **record, size_t *len);

/*
 * journal_record_decode(): the record VALUE (LEN bytes) stored under KEY
 * (KEY_LEN bytes: the id, 8 bytes big-endian) -> *ENTRY, as journal_scan()
 * hands it out. ENTRY's strings (key, destination, upload_id, move_to,
 * move_etag) point into one malloc'd block, *STRINGS, which the caller
 * frees. Returns 0; EPROTO for a record that
 * does not decode, with *WHY a static phrase saying why (NULL otherwise);
 * ENOMEM. On error *STRINGS is NULL.
 */
int journal_record_decode(const unsigned char *key, size_t key_len,
                          const unsigned char *value, size_t len,
                          struct journal_entry *entry, char **strings,
                          const char **why);

#endif /* S3CFS_JOURNAL_H */
