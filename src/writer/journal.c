/*
 * journal.c - the durable record of writes not yet in the bucket (see
 * journal.h).
 *
 * One LMDB environment (db.c, opened durable: every commit is fsynced) in
 * which only the DB_JOURNAL table is used. Keys are the entry id as 8
 * big-endian bytes, so LMDB's byte order is id order. Values are a small
 * versioned record, every integer big-endian, every string a u16 length
 * and its bytes (no NUL):
 *
 *   u8  format (RECORD_FORMAT, 3)
 *   u8  kind: RECORD_KIND_UPLOAD or RECORD_KIND_MOVE
 *   str destination, "ENDPOINT/BUCKET" (1..JOURNAL_DESTINATION_MAX)
 *   an upload:
 *     u64 size
 *     u32 mode, u32 uid, u32 gid
 *     i64 mtime seconds, u32 mtime nanoseconds
 *     str key (1..JOURNAL_KEY_MAX)
 *     str upload id (0: none)
 *     u8  flags: FLAG_UNCLOSED
 *   a move:
 *     u8  flags: JOURNAL_MOVE_*
 *     u64 the id of the promise it replaces (0: none)
 *     str key or prefix moved, str where to (1..JOURNAL_KEY_MAX each)
 *     str the source's ETag (0: none known)
 *
 * Formats 1 and 2 (older versions) are uploads without a destination
 * (format 1 without the flags byte); they are still read, and taken as
 * the journal's own. An older s3cachefs skips (and keeps) a format 3
 * record, as every record it cannot read: it never acts on one, so it can
 * never upload an entry into another bucket than the one it names.
 *
 * A record that does not decode is logged and skipped by scans, never
 * deleted: it may be all that is left of what a user wrote.
 *
 * Group commit: journal_update() (and journal_put/journal_del, one change
 * each) queue an operation and wait. One waiting thread at a time is the leader: it takes every queued
 * operation, applies them in one write transaction (one fsync), and wakes
 * the others. Operations that arrive meanwhile form the next batch. If a
 * batch fails, each operation is tried again on its own: the changes of one
 * operation always share a transaction (all or none).
 * Locks: journal.lock guards queue_head/queue_tail, leader_active and each
 * queued operation's done/err; op_done is broadcast after every batch.
 * The lock is never held during the transaction. next_id is atomic.
 */
#include "config.h"

#include "writer/journal.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/db.h"
#include "base/log.h"

#define RECORD_FORMAT 3
#define RECORD_FORMAT_V2 2     /* an upload, no destination */
#define RECORD_FORMAT_V1 1     /* an upload, no destination, no flags */
#define RECORD_KIND_UPLOAD 1
#define RECORD_KIND_MOVE 2
#define FLAG_UNCLOSED 0x01
#define MOVE_FLAGS_KNOWN (JOURNAL_MOVE_PREFIX | JOURNAL_MOVE_COPY | \
                          JOURNAL_MOVE_DROP_TARGET)
#define JOURNAL_KEY_MAX 1024u
#define JOURNAL_UPLOAD_ID_MAX 2048u
#define JOURNAL_DESTINATION_MAX 2048u
#define JOURNAL_ETAG_MAX 255u
#define JOURNAL_MAP_SIZE (1ull << 30)
#define RECORD_HEAD_LEN (1 + 1 + 2)     /* format, kind, destination length */
#define UPLOAD_FIXED_LEN (8 + 4 + 4 + 4 + 8 + 4 + 2 + 2 + 1)
#define SCAN_BATCH 256
#define RESUME_KEY_MAX 512      /* LMDB's longest key is 511 bytes */

/* One record to write (VALUE) or remove (VALUE NULL). */
struct journal_change {
    uint64_t id;
    unsigned char *value;
    size_t value_len;
};

/* One queued update: its changes are applied in one transaction. Lives
 * on the stack of the thread waiting. */
struct journal_op {
    const struct journal_change *changes;
    size_t count;
    int err;
    bool done;
    struct journal_op *next;
};

struct journal {
    struct db *db;
    char *path;
    char *destination;            /* the bucket its entries are for */
    _Atomic uint64_t next_id;

    pthread_mutex_t lock;
    pthread_cond_t op_done;
    struct journal_op *queue_head, *queue_tail;
    bool leader_active;
    unsigned queued;              /* operations in the queue */
    uint64_t commits;             /* transactions committed */
    bool held;                    /* journal_hold() (tests) */
    pthread_cond_t changed;       /* queued or held changed */
};

/* ------------------------------------------------------------ records */

static void put_be(unsigned char *p, uint64_t value, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++)
        p[i] = (unsigned char)(value >> (8 * (bytes - 1 - i)));
}

static uint64_t get_be(const unsigned char *p, unsigned bytes)
{
    uint64_t value = 0;
    for (unsigned i = 0; i < bytes; i++)
        value = (value << 8) | p[i];
    return value;
}

static void id_key(uint64_t id, unsigned char key[8])
{
    put_be(key, id, 8);
}

/* The strings of an entry, measured. */
struct record_strings {
    size_t key, upload_id, destination, move_to, move_etag;
};

static size_t length_of(const char *text)
{
    return text != NULL ? strlen(text) : 0;
}

/* Whether ENTRY may be recorded; its string lengths in *LEN. */
static bool record_valid(const struct journal_entry *entry,
                         struct record_strings *len)
{
    len->key = length_of(entry->key);
    len->upload_id = length_of(entry->upload_id);
    len->destination = length_of(entry->destination);
    len->move_to = length_of(entry->move_to);
    len->move_etag = length_of(entry->move_etag);
    if (len->key == 0 || len->key > JOURNAL_KEY_MAX ||
        len->destination == 0 || len->destination > JOURNAL_DESTINATION_MAX)
        return false;
    if (entry->kind == JOURNAL_MOVE)
        return len->move_to > 0 && len->move_to <= JOURNAL_KEY_MAX &&
               len->move_etag <= JOURNAL_ETAG_MAX &&
               (entry->move_flags & ~MOVE_FLAGS_KNOWN) == 0;
    return entry->kind == JOURNAL_UPLOAD &&
           len->upload_id <= JOURNAL_UPLOAD_ID_MAX &&
           entry->mtime.tv_nsec >= 0 && entry->mtime.tv_nsec < 1000000000L;
}

/* Store a u16 length and LEN bytes of TEXT at P; returns the end. */
static unsigned char *put_text(unsigned char *p, const char *text, size_t len)
{
    put_be(p, len, 2);
    if (len > 0)
        memcpy(p + 2, text, len);
    return p + 2 + len;
}

/* Encode ENTRY into a malloc'd record. EINVAL for an unacceptable entry. */
static int record_encode(const struct journal_entry *entry,
                         unsigned char **out, size_t *out_len)
{
    struct record_strings len;
    unsigned char *record, *p;

    *out = NULL;
    if (!record_valid(entry, &len))
        return EINVAL;
    *out_len = RECORD_HEAD_LEN + len.destination;
    if (entry->kind == JOURNAL_MOVE)
        *out_len += 1 + 8 + 2 + len.key + 2 + len.move_to + 2 + len.move_etag;
    else
        *out_len += UPLOAD_FIXED_LEN + len.key + len.upload_id;
    record = malloc(*out_len);
    if (record == NULL)
        return ENOMEM;
    p = record;
    *p++ = RECORD_FORMAT;
    *p++ = entry->kind == JOURNAL_MOVE ? RECORD_KIND_MOVE : RECORD_KIND_UPLOAD;
    p = put_text(p, entry->destination, len.destination);
    if (entry->kind == JOURNAL_MOVE) {
        *p++ = (unsigned char)entry->move_flags;
        put_be(p, entry->move_replaces, 8), p += 8;
        p = put_text(p, entry->key, len.key);
        p = put_text(p, entry->move_to, len.move_to);
        p = put_text(p, entry->move_etag, len.move_etag);
    } else {
        put_be(p, entry->size, 8), p += 8;
        put_be(p, entry->mode, 4), p += 4;
        put_be(p, entry->uid, 4), p += 4;
        put_be(p, entry->gid, 4), p += 4;
        put_be(p, (uint64_t)(int64_t)entry->mtime.tv_sec, 8), p += 8;
        put_be(p, (uint64_t)entry->mtime.tv_nsec, 4), p += 4;
        p = put_text(p, entry->key, len.key);
        p = put_text(p, entry->upload_id, len.upload_id);
        *p++ = entry->unclosed ? FLAG_UNCLOSED : 0;
    }
    assert((size_t)(p - record) == *out_len);
    *out = record;
    return 0;
}

/* A decoded entry whose strings are NUL-terminated copies (one block). */
struct decoded {
    struct journal_entry entry;
    char *strings;
};

/* A record being read: what is left of it, and why it stopped. */
struct reader {
    const unsigned char *p, *end;
    const char *why;
};

/* The next N bytes as a big-endian number (0 and a reason past the end). */
static uint64_t read_number(struct reader *r, unsigned n)
{
    if (r->why != NULL || (size_t)(r->end - r->p) < n) {
        r->why = r->why ? r->why : "record too short";
        return 0;
    }
    uint64_t value = get_be(r->p, n);
    r->p += n;
    return value;
}

/* A u16-length string of MIN..MAX bytes, no NUL in it: its bytes in
 * *TEXT, its length returned. */
static size_t read_text(struct reader *r, size_t min, size_t max,
                        const char *what, const unsigned char **text)
{
    size_t len = (size_t)read_number(r, 2);

    *text = r->p;
    if (r->why != NULL)
        return 0;
    if (len < min || len > max || (size_t)(r->end - r->p) < len) {
        r->why = what;
        return 0;
    }
    if (memchr(r->p, '\0', len) != NULL) {
        r->why = "NUL byte in a string";
        return 0;
    }
    r->p += len;
    return len;
}

/* Copy the strings found (FOUND[i], LENS[i] bytes, NULL: absent) into one
 * block, NUL-terminated, and point the entry's fields (*FIELDS[i]) at
 * them. 0 or ENOMEM. */
static int copy_strings(struct decoded *out, const unsigned char *found[],
                        const size_t lens[], const char **fields[],
                        size_t count)
{
    size_t total = 0;

    for (size_t i = 0; i < count; i++)
        total += found[i] != NULL ? lens[i] + 1 : 0;
    out->strings = malloc(total > 0 ? total : 1);
    if (out->strings == NULL)
        return ENOMEM;
    char *at = out->strings;
    for (size_t i = 0; i < count; i++) {
        if (found[i] == NULL)
            continue;
        memcpy(at, found[i], lens[i]);
        at[lens[i]] = '\0';
        *fields[i] = at;
        at += lens[i] + 1;
    }
    return 0;
}

/*
 * Decode a record (key KEY) into *out; EPROTO with a reason when it is
 * malformed, ENOMEM. Formats 1 and 2 are uploads that name no
 * destination (older s3cachefs); format 3 is uploads and moves.
 */
static int record_decode(const unsigned char *key, size_t key_len,
                         const unsigned char *value, size_t len,
                         struct decoded *out, const char **why)
{
    struct reader r = {value, value + len, NULL};
    struct journal_entry *entry = &out->entry;
    const unsigned char *found[5] = {NULL};
    size_t lens[5] = {0};
    const char **fields[5] = {&entry->key, &entry->upload_id,
                              &entry->destination, &entry->move_to,
                              &entry->move_etag};
    enum { KEY, UPLOAD_ID, DESTINATION, MOVE_TO, MOVE_ETAG };

    memset(out, 0, sizeof(*out));
    *why = NULL;
    unsigned format = len >= 1 ? value[0] : 0;
    if (key_len != 8)
        *why = "its key is not an id";
    else if (format != RECORD_FORMAT && format != RECORD_FORMAT_V2 &&
             format != RECORD_FORMAT_V1)
        *why = "unknown record format";
    if (*why != NULL)
        return EPROTO;
    entry->id = get_be(key, 8);
    r.p++;
    if (format == RECORD_FORMAT) {
        unsigned kind = (unsigned)read_number(&r, 1);
        if (r.why == NULL && kind != RECORD_KIND_UPLOAD && kind != RECORD_KIND_MOVE)
            r.why = "unknown kind of entry";
        entry->kind = kind == RECORD_KIND_MOVE ? JOURNAL_MOVE : JOURNAL_UPLOAD;
        lens[DESTINATION] = read_text(&r, 1, JOURNAL_DESTINATION_MAX,
                                      "bad destination length",
                                      &found[DESTINATION]);
    }
    if (entry->kind == JOURNAL_MOVE) {
        entry->move_flags = (unsigned)read_number(&r, 1);
        if (r.why == NULL && (entry->move_flags & ~MOVE_FLAGS_KNOWN) != 0)
            r.why = "unknown flags";
        entry->move_replaces = read_number(&r, 8);
        lens[KEY] = read_text(&r, 1, JOURNAL_KEY_MAX, "bad key length",
                              &found[KEY]);
        lens[MOVE_TO] = read_text(&r, 1, JOURNAL_KEY_MAX, "bad target length",
                                  &found[MOVE_TO]);
        lens[MOVE_ETAG] = read_text(&r, 0, JOURNAL_ETAG_MAX, "bad ETag length",
                                    &found[MOVE_ETAG]);
    } else {
        entry->size = read_number(&r, 8);
        entry->mode = (uint32_t)read_number(&r, 4);
        entry->uid = (uint32_t)read_number(&r, 4);
        entry->gid = (uint32_t)read_number(&r, 4);
        entry->mtime.tv_sec = (time_t)(int64_t)read_number(&r, 8);
        entry->mtime.tv_nsec = (long)read_number(&r, 4);
        if (r.why == NULL && entry->mtime.tv_nsec >= 1000000000L)
            r.why = "bad mtime";
        lens[KEY] = read_text(&r, 1, JOURNAL_KEY_MAX, "bad key length",
                              &found[KEY]);
        lens[UPLOAD_ID] = read_text(&r, 0, JOURNAL_UPLOAD_ID_MAX,
                                    "bad upload id length", &found[UPLOAD_ID]);
        if (lens[UPLOAD_ID] == 0)
            found[UPLOAD_ID] = NULL;
        if (format != RECORD_FORMAT_V1) {
            unsigned flags = (unsigned)read_number(&r, 1);
            if (r.why == NULL && (flags & ~FLAG_UNCLOSED) != 0)
                r.why = "unknown flags";
            entry->unclosed = (flags & FLAG_UNCLOSED) != 0;
        }
    }
    if (r.why == NULL && r.p != r.end)
        r.why = "bytes after the record";
    if (r.why != NULL) {
        memset(out, 0, sizeof(*out));
        *why = r.why;
        return EPROTO;
    }
    int err = copy_strings(out, found, lens, fields, 5);
    if (err != 0)
        memset(out, 0, sizeof(*out));
    return err;
}

int journal_record_encode(const struct journal_entry *entry,
                          unsigned char **record, size_t *len)
{
    return record_encode(entry, record, len);
}

int journal_record_decode(const unsigned char *key, size_t key_len,
                          const unsigned char *value, size_t len,
                          struct journal_entry *entry, char **strings,
                          const char **why)
{
    struct decoded decoded;
    int err = record_decode(key, key_len, value, len, &decoded, why);

    *entry = decoded.entry;
    *strings = decoded.strings;
    return err;
}

/* ------------------------------------------------------- open / close */

static int find_max_id(void *arg, const void *key, size_t key_len,
                       const void *value, size_t value_len)
{
    uint64_t *max = arg;
    (void)value;
    (void)value_len;
    if (key_len == 8) {
        uint64_t id = get_be(key, 8);
        if (id > *max)
            *max = id;
    }
    return 0;
}

int journal_open(const char *path, const char *destination,
                 struct journal **out, char *errbuf, size_t errlen)
{
    struct journal *journal = calloc(1, sizeof(*journal));
    struct db_txn *txn = NULL;
    char db_error[512] = "";
    uint64_t max_id = 0;
    int err = 0;

    *out = NULL;
    if (journal == NULL) {
        snprintf(errbuf, errlen, "cannot open the upload journal in %s: %s",
                 path, strerror(ENOMEM));
        return ENOMEM;
    }
    pthread_mutex_init(&journal->lock, NULL);
    pthread_cond_init(&journal->op_done, NULL);
    pthread_cond_init(&journal->changed, NULL);
    journal->path = strdup(path);
    journal->destination = strdup(destination);
    if (journal->path == NULL || journal->destination == NULL) {
        err = ENOMEM;
        snprintf(errbuf, errlen, "cannot open the upload journal in %s: %s",
                 path, strerror(err));
        goto out;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        err = errno;
        snprintf(errbuf, errlen, "cannot create the upload journal %s: %s",
                 path, strerror(err));
        goto out;
    }
    err = db_open(path, JOURNAL_MAP_SIZE, true, &journal->db, db_error,
                  sizeof(db_error));
    if (err != 0) {
        snprintf(errbuf, errlen,
                 "cannot open the upload journal in %s (%s); it may hold "
                 "writes not yet uploaded, so it is left as it is",
                 path, db_error);
        goto out;
    }
    err = db_txn_begin(journal->db, false, &txn);
    if (err == 0)
        err = db_scan(txn, DB_JOURNAL, NULL, 0, find_max_id, &max_id);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot read the upload journal in %s: %s",
                 path, strerror(err));
        goto out;
    }
    atomic_store(&journal->next_id, max_id + 1);
    *out = journal;
    journal = NULL;
out:
    if (txn != NULL)
        db_txn_commit(&txn);
    journal_close(&journal);
    return err;
}

void journal_close(struct journal **journalp)
{
    struct journal *journal = *journalp;

    if (journal == NULL)
        return;
    db_close(&journal->db);
    pthread_cond_destroy(&journal->op_done);
    pthread_cond_destroy(&journal->changed);
    pthread_mutex_destroy(&journal->lock);
    free(journal->path);
    free(journal->destination);
    free(journal);
    *journalp = NULL;
}

int journal_peek(const char *path, uint64_t *count, char *errbuf,
                 size_t errlen)
{
    struct db *db = NULL;
    struct db_txn *txn = NULL;
    char db_error[512] = "", *data = NULL;
    struct stat st;
    int err = 0;

    *count = 0;
    if (asprintf(&data, "%s/data.mdb", path) < 0)
        return ENOMEM;
    bool exists = stat(data, &st) == 0;
    if (!exists && errno != ENOENT)
        err = errno;
    free(data);
    if (!exists) {
        if (err != 0)
            snprintf(errbuf, errlen, "cannot read the upload journal in %s: "
                     "%s", path, strerror(err));
        return err;
    }
    err = db_open(path, JOURNAL_MAP_SIZE, true, &db, db_error, sizeof(db_error));
    if (err == 0)
        err = db_txn_begin(db, false, &txn);
    if (err == 0)
        err = db_count(txn, DB_JOURNAL, count);
    if (txn != NULL)
        db_txn_commit(&txn);
    db_close(&db);
    if (err != 0)
        snprintf(errbuf, errlen, "cannot read the upload journal in %s: %s",
                 path, db_error[0] ? db_error : strerror(err));
    return err;
}

const char *journal_destination(const struct journal *journal)
{
    return journal->destination;
}

uint64_t journal_next_id(struct journal *journal)
{
    return atomic_fetch_add(&journal->next_id, 1);
}

/* --------------------------------------------------------- group commit */

static int apply_op(struct db_txn *txn, const struct journal_op *op)
{
    unsigned char key[8];
    int err = 0;

    for (size_t i = 0; err == 0 && i < op->count; i++) {
        const struct journal_change *change = &op->changes[i];
        id_key(change->id, key);
        if (change->value != NULL) {
            err = db_put(txn, DB_JOURNAL, key, sizeof(key), change->value,
                         change->value_len);
        } else {
            err = db_del(txn, DB_JOURNAL, key, sizeof(key));
            if (err == ENOENT)
                err = 0;
        }
    }
    return err;
}

/* Apply OPS (COUNT of them, linked) in one transaction: 0 or an errno. */
static int commit_ops(struct journal *journal, struct journal_op *ops,
                      unsigned count)
{
    struct db_txn *txn = NULL;
    int err = db_txn_begin(journal->db, true, &txn);
    unsigned n = 0;

    for (struct journal_op *op = ops; err == 0 && n < count; op = op->next, n++)
        err = apply_op(txn, op);
    if (err == 0)
        err = db_txn_commit(&txn);
    db_txn_abort(&txn);
    if (err == 0) {
        pthread_mutex_lock(&journal->lock);
        journal->commits++;
        pthread_mutex_unlock(&journal->lock);
    }
    return err;
}

/*
 * Write a batch: all in one transaction; if that fails and the batch had
 * more than one operation, each again on its own, so that one operation's
 * failure (ENOSPC) is not reported for the others.
 */
static void commit_batch(struct journal *journal, struct journal_op *batch)
{
    unsigned count = 0;

    for (struct journal_op *op = batch; op != NULL; op = op->next)
        count++;
    int err = commit_ops(journal, batch, count);
    for (struct journal_op *op = batch; op != NULL; op = op->next)
        op->err = err;
    if (err == 0 || count == 1)
        return;
    for (struct journal_op *op = batch; op != NULL; op = op->next)
        op->err = commit_ops(journal, op, 1);
}

/* Queue OP and return once it is committed (by this thread or another). */
static int submit(struct journal *journal, struct journal_op *op)
{
    pthread_mutex_lock(&journal->lock);
    op->next = NULL;
    if (journal->queue_tail != NULL)
        journal->queue_tail->next = op;
    else
        journal->queue_head = op;
    journal->queue_tail = op;
    journal->queued++;
    pthread_cond_broadcast(&journal->changed);
    while (!op->done) {
        if (journal->leader_active) {
            pthread_cond_wait(&journal->op_done, &journal->lock);
            continue;
        }
        if (journal->held) {
            pthread_cond_wait(&journal->changed, &journal->lock);
            continue;
        }
        struct journal_op *batch = journal->queue_head;
        journal->queue_head = journal->queue_tail = NULL;
        journal->queued = 0;
        journal->leader_active = true;
        pthread_mutex_unlock(&journal->lock);

        commit_batch(journal, batch);

        pthread_mutex_lock(&journal->lock);
        for (struct journal_op *done = batch, *next; done != NULL; done = next) {
            next = done->next; /* read before the owner may return */
            done->done = true;
        }
        journal->leader_active = false;
        pthread_cond_broadcast(&journal->op_done);
    }
    pthread_mutex_unlock(&journal->lock);
    return op->err;
}

uint64_t journal_commits(struct journal *journal)
{
    pthread_mutex_lock(&journal->lock);
    uint64_t commits = journal->commits;
    pthread_mutex_unlock(&journal->lock);
    return commits;
}

void journal_hold(struct journal *journal, bool hold)
{
    pthread_mutex_lock(&journal->lock);
    journal->held = hold;
    pthread_cond_broadcast(&journal->changed);
    pthread_mutex_unlock(&journal->lock);
}

void journal_wait_queued(struct journal *journal, unsigned count)
{
    pthread_mutex_lock(&journal->lock);
    while (journal->queued < count)
        pthread_cond_wait(&journal->changed, &journal->lock);
    pthread_mutex_unlock(&journal->lock);
}

int journal_update(struct journal *journal, const struct journal_entry *puts,
                   size_t put_count, const uint64_t *dels, size_t del_count)
{
    struct journal_change *changes = calloc(put_count + del_count + 1,
                                            sizeof(*changes));
    size_t count = 0;
    int err = changes == NULL ? ENOMEM : 0;

    for (size_t i = 0; err == 0 && i < put_count; i++) {
        struct journal_entry stamped = puts[i];
        if (stamped.destination == NULL)
            stamped.destination = journal->destination;
        changes[count].id = puts[i].id;
        err = record_encode(&stamped, &changes[count].value,
                            &changes[count].value_len);
        if (err == 0)
            count++;
    }
    for (size_t i = 0; err == 0 && i < del_count; i++) {
        bool replaced = false; /* a put of the same id wins */
        for (size_t j = 0; j < put_count; j++)
            replaced = replaced || puts[j].id == dels[i];
        if (!replaced)
            changes[count++].id = dels[i];
    }
    if (err == 0 && count > 0) {
        struct journal_op op = {.changes = changes, .count = count};
        err = submit(journal, &op);
    }
    for (size_t i = 0; changes != NULL && i < count; i++)
        free(changes[i].value);
    free(changes);
    return err;
}

int journal_put(struct journal *journal, const struct journal_entry *entry)
{
    return journal_update(journal, entry, 1, NULL, 0);
}

int journal_del(struct journal *journal, uint64_t id)
{
    return journal_update(journal, NULL, 0, &id, 1);
}

/* ---------------------------------------------------------------- scan */

struct scan_batch {
    struct decoded entries[SCAN_BATCH];
    unsigned count;
    bool full;                  /* stopped because the batch is full */
    unsigned char resume_key[RESUME_KEY_MAX]; /* the next batch's first key */
    size_t resume_len;
    const char *path;
    const char *destination;    /* the journal's */
    uint64_t elsewhere;         /* entries for another bucket, skipped */
    int err;
};

static int collect(void *arg, const void *key, size_t key_len,
                   const void *value, size_t value_len)
{
    struct scan_batch *batch = arg;
    const char *why = NULL;

    if (batch->count == SCAN_BATCH) {
        if (key_len > RESUME_KEY_MAX)
            return EIO; /* (LMDB keys stop at 511 bytes: cannot happen) */
        batch->full = true;
        memcpy(batch->resume_key, key, key_len);
        batch->resume_len = key_len;
        return -1;
    }
    int err = record_decode(key, key_len, value, value_len,
                            &batch->entries[batch->count], &why);
    if (err == EPROTO) {
        log_error("upload journal %s: skipping a damaged entry (%s%s%llu)",
                  batch->path, why, key_len == 8 ? ", id " : "",
                  key_len == 8 ? (unsigned long long)get_be(key, 8) : 0ull);
        return 0;
    }
    if (err != 0)
        return err;
    const char *for_bucket = batch->entries[batch->count].entry.destination;
    if (for_bucket != NULL && strcmp(for_bucket, batch->destination) != 0) {
        /* kept for a mount of the bucket it names, never acted on here */
        free(batch->entries[batch->count].strings);
        batch->elsewhere++;
        return 0;
    }
    batch->count++;
    return 0;
}

int journal_scan(struct journal *journal, journal_visit_fn visit, void *arg)
{
    struct scan_batch *batch = calloc(1, sizeof(*batch));
    int err = 0;

    if (batch == NULL)
        return ENOMEM;
    batch->path = journal->path;
    batch->destination = journal->destination;
    /* Entries are copied out in batches so that VISIT (which may upload)
     * never runs inside a transaction. */
    for (;;) {
        struct db_txn *txn = NULL;
        unsigned char start_key[RESUME_KEY_MAX];
        size_t start_len = batch->resume_len;

        memcpy(start_key, batch->resume_key, start_len);
        batch->count = 0;
        batch->full = false;
        err = db_txn_begin(journal->db, false, &txn);
        if (err == 0)
            err = db_scan(txn, DB_JOURNAL, start_key, start_len, collect,
                          batch);
        if (txn != NULL)
            db_txn_commit(&txn);
        for (unsigned i = 0; i < batch->count; i++) {
            if (err == 0)
                err = visit(arg, &batch->entries[i].entry);
            free(batch->entries[i].strings);
        }
        if (err != 0 || !batch->full)
            break;
    }
    if (batch->elsewhere > 0)
        log_error("upload journal %s: %llu entr%s for another bucket than %s "
                  "left as they are", journal->path,
                  (unsigned long long)batch->elsewhere,
                  batch->elsewhere == 1 ? "y" : "ies", journal->destination);
    free(batch);
    return err;
}

bool journal_has(struct journal *journal, uint64_t id)
{
    struct db_txn *txn = NULL;
    unsigned char key[8];
    const void *value = NULL;
    size_t len = 0;
    bool found = true; /* when in doubt, the data is kept */

    id_key(id, key);
    if (db_txn_begin(journal->db, false, &txn) == 0) {
        found = db_get(txn, DB_JOURNAL, key, sizeof(key), &value, &len) != ENOENT;
        db_txn_commit(&txn);
    }
    return found;
}

uint64_t journal_count(struct journal *journal)
{
    struct db_txn *txn = NULL;
    uint64_t count = 0;

    if (db_txn_begin(journal->db, false, &txn) == 0) {
        if (db_count(txn, DB_JOURNAL, &count) != 0)
            count = 0;
        db_txn_commit(&txn);
    }
    return count;
}
