/*
 * journal.c - the durable record of writes not yet in the bucket (see
 * journal.h).
 *
 * One LMDB environment (db.c, opened durable: every commit is fsynced) in
 * which only the DB_JOURNAL table is used. Keys are the entry id as 8
 * big-endian bytes, so LMDB's byte order is id order. Values are a small
 * versioned record, every integer big-endian:
 *
 *   u8  format (RECORD_FORMAT)
 *   u64 size
 *   u32 mode, u32 uid, u32 gid
 *   i64 mtime seconds, u32 mtime nanoseconds
 *   u16 key length (1..JOURNAL_KEY_MAX), key bytes (no NUL)
 *   u16 upload id length (0: none), upload id bytes (no NUL)
 *   u8  flags (format 2 only): FLAG_UNCLOSED
 *
 * A record with no flag set is written in format 1 (no flags byte), so
 * that an older s3cachefs reads every complete entry; only unclosed
 * entries, which it could not act on, need format 2.
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

#include "journal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "db.h"
#include "log.h"

#define RECORD_FORMAT 2
#define RECORD_FORMAT_V1 1     /* without the flags byte */
#define FLAG_UNCLOSED 0x01
#define JOURNAL_KEY_MAX 1024u
#define JOURNAL_UPLOAD_ID_MAX 2048u
#define JOURNAL_MAP_SIZE (1ull << 30)
#define RECORD_FIXED_LEN (1 + 8 + 4 + 4 + 4 + 8 + 4 + 2 + 2)
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

/* Encode ENTRY into a malloc'd record. EINVAL for an unacceptable entry. */
static int record_encode(const struct journal_entry *entry,
                         unsigned char **out, size_t *out_len)
{
    size_t key_len = entry->key != NULL ? strlen(entry->key) : 0;
    size_t upload_id_len = entry->upload_id != NULL ? strlen(entry->upload_id) : 0;
    unsigned char *record, *p;

    *out = NULL;
    if (key_len == 0 || key_len > JOURNAL_KEY_MAX ||
        upload_id_len > JOURNAL_UPLOAD_ID_MAX || entry->mtime.tv_nsec < 0 ||
        entry->mtime.tv_nsec >= 1000000000L)
        return EINVAL;
    bool flags = entry->unclosed;
    *out_len = RECORD_FIXED_LEN + key_len + upload_id_len + (flags ? 1 : 0);
    record = malloc(*out_len);
    if (record == NULL)
        return ENOMEM;
    p = record;
    *p++ = flags ? RECORD_FORMAT : RECORD_FORMAT_V1;
    put_be(p, entry->size, 8), p += 8;
    put_be(p, entry->mode, 4), p += 4;
    put_be(p, entry->uid, 4), p += 4;
    put_be(p, entry->gid, 4), p += 4;
    put_be(p, (uint64_t)(int64_t)entry->mtime.tv_sec, 8), p += 8;
    put_be(p, (uint64_t)entry->mtime.tv_nsec, 4), p += 4;
    put_be(p, key_len, 2), p += 2;
    memcpy(p, entry->key, key_len), p += key_len;
    put_be(p, upload_id_len, 2), p += 2;
    if (upload_id_len > 0)
        memcpy(p, entry->upload_id, upload_id_len), p += upload_id_len;
    if (flags)
        *p = FLAG_UNCLOSED;
    *out = record;
    return 0;
}

/* A decoded entry whose strings are NUL-terminated copies (one block). */
struct decoded {
    struct journal_entry entry;
    char *strings;
};

/* Decode a record (key KEY) into *out; EPROTO with a reason when it is
 * malformed, ENOMEM. */
static int record_decode(const unsigned char *key, size_t key_len,
                         const unsigned char *value, size_t len,
                         struct decoded *out, const char **why)
{
    const unsigned char *p = value, *end = value + len;
    size_t name_len, upload_id_len;
    struct journal_entry *entry = &out->entry;

    memset(out, 0, sizeof(*out));
    *why = NULL;
    if (key_len != 8)
        *why = "its key is not an id";
    else if (len < 1 || (value[0] != RECORD_FORMAT &&
                         value[0] != RECORD_FORMAT_V1))
        *why = "unknown record format";
    else if (len < RECORD_FIXED_LEN)
        *why = "record too short";
    if (*why != NULL)
        return EPROTO;
    entry->id = get_be(key, 8);
    p++;
    entry->size = get_be(p, 8), p += 8;
    entry->mode = (uint32_t)get_be(p, 4), p += 4;
    entry->uid = (uint32_t)get_be(p, 4), p += 4;
    entry->gid = (uint32_t)get_be(p, 4), p += 4;
    entry->mtime.tv_sec = (time_t)(int64_t)get_be(p, 8), p += 8;
    entry->mtime.tv_nsec = (long)get_be(p, 4), p += 4;
    name_len = (size_t)get_be(p, 2), p += 2;
    if (entry->mtime.tv_nsec >= 1000000000L) {
        *why = "bad mtime";
        return EPROTO;
    }
    if (name_len == 0 || name_len > JOURNAL_KEY_MAX ||
        (size_t)(end - p) < name_len + 2) {
        *why = "bad key length";
        return EPROTO;
    }
    const unsigned char *name = p;
    p += name_len;
    upload_id_len = (size_t)get_be(p, 2), p += 2;
    size_t flags_len = value[0] == RECORD_FORMAT_V1 ? 0 : 1;
    if (upload_id_len > JOURNAL_UPLOAD_ID_MAX ||
        (size_t)(end - p) != upload_id_len + flags_len) {
        *why = "bad upload id length";
        return EPROTO;
    }
    if (memchr(name, '\0', name_len) != NULL ||
        memchr(p, '\0', upload_id_len) != NULL) {
        *why = "NUL byte in a string";
        return EPROTO;
    }
    out->strings = malloc(name_len + 1 + upload_id_len + 1);
    if (out->strings == NULL)
        return ENOMEM;
    memcpy(out->strings, name, name_len);
    out->strings[name_len] = '\0';
    entry->key = out->strings;
    if (upload_id_len > 0) {
        char *upload_id = out->strings + name_len + 1;
        memcpy(upload_id, p, upload_id_len);
        upload_id[upload_id_len] = '\0';
        entry->upload_id = upload_id;
    }
    if (flags_len > 0) {
        unsigned flags = p[upload_id_len];
        if ((flags & ~FLAG_UNCLOSED) != 0) {
            free(out->strings);
            out->strings = NULL;
            *why = "unknown flags";
            return EPROTO;
        }
        entry->unclosed = (flags & FLAG_UNCLOSED) != 0;
    }
    return 0;
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

int journal_open(const char *path, struct journal **out, char *errbuf,
                 size_t errlen)
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
    if (journal->path == NULL) {
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
    free(journal);
    *journalp = NULL;
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
        changes[count].id = puts[i].id;
        err = record_encode(&puts[i], &changes[count].value,
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
