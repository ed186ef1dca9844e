/*
 * db.h - the LMDB layer: one environment, named tables, short transactions.
 *
 * The only module that includes lmdb.h, and the one place MDB_* results
 * become errno values (MDB_NOTFOUND -> ENOENT, MDB_MAP_FULL -> ENOSPC, a
 * corrupt or incompatible file -> EIO, with a log line naming it).
 *
 * Threads: read transactions may be used by any one thread at a time
 * (the environment is opened with MDB_NOTLS, so FUSE threads can share);
 * LMDB serialises write transactions itself. Never keep a transaction open
 * across network I/O. Pointers returned by db_get() and passed to a scan
 * callback point into the map and are valid only until the transaction
 * ends or writes to that table.
 */
#ifndef S3CFS_DB_H
#define S3CFS_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum db_table {
    DB_META,       /* format, block size, counters, session state */
    DB_KEYS,       /* hash(bucket, key) -> object version id */
    DB_OBJECTS,    /* id -> object version record */
    DB_BLOCKS,     /* id | block -> block record (length, checksums, recency) */
    DB_RECENCY,    /* segment | tick | id | block -> nothing (eviction order) */
    DB_ATTRS,      /* hash(bucket, key) -> object attributes (metacache.c) */
    DB_DIRS,       /* hash(bucket, prefix) -> directory listing (metacache.c) */
    DB_LINKS,      /* hash(bucket, key) -> symlink target (metacache.c) */
    DB_JOURNAL,    /* id -> pending upload (journal.c; its own environment) */
    DB_TABLE_COUNT,
};

struct db;
struct db_txn;

/*
 * Open (creating if needed) the environment in directory PATH. With
 * DURABLE false, commits are not flushed (MDB_NOSYNC): a process crash
 * loses nothing committed, a system crash may corrupt the file, so callers
 * must be able to rebuild it. Returns 0, or an errno with a sentence in
 * ERRBUF: ENOSPC when the file system of PATH has no room for the
 * environment's files (the sentence says PATH is full).
 */
int db_open(const char *path, uint64_t map_size, bool durable, struct db **out,
            char *errbuf, size_t errlen);

/* Flush and close; *db = NULL. Safe twice. */
void db_close(struct db **db);

/* Flush committed transactions to disk. */
int db_sync(struct db *db);

/* Bytes of the environment's data file in use: its pages up to the last
 * one written. The file never shrinks; pages freed inside it are reused. */
uint64_t db_file_bytes(struct db *db);

int db_txn_begin(struct db *db, bool write, struct db_txn **out);
/* The transaction's id (LMDB's mdb_txn_id): a write transaction's is
 * greater than that of every write transaction committed before it, so
 * the ids of committed writes are the order of their commits. Read it
 * before the commit (the transaction is gone after). */
uint64_t db_txn_id(struct db_txn *txn);

/* Commit (or end a read transaction); *txn = NULL either way. ENOSPC
 * when the file system is full (logged once a minute at most, naming
 * the environment's directory) or the map is. */
int db_txn_commit(struct db_txn **txn);
/* Abort; *txn = NULL. Safe on NULL. */
void db_txn_abort(struct db_txn **txn);

/* Look KEY up: 0 with the value (pointing into the map) in VALUE and
 * VALUE_LEN, or ENOENT. */
int db_get(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len, const void **value, size_t *value_len);

int db_put(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len, const void *value, size_t value_len);

/* Delete KEY: 0, or ENOENT if it was not there. */
int db_del(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len);

/* Remove every entry of TABLE. */
int db_clear(struct db_txn *txn, enum db_table table);

/*
 * Visit entries of TABLE in key order, starting at the first key >= START
 * (START_LEN 0: from the beginning). VISIT returns 0 to go on, a negative
 * value to stop (db_scan then returns 0), or a positive errno to stop and
 * return it. VISIT must not write to TABLE.
 */
typedef int (*db_visit_fn)(void *arg, const void *key, size_t key_len,
                           const void *value, size_t value_len);
int db_scan(struct db_txn *txn, enum db_table table, const void *start,
            size_t start_len, db_visit_fn visit, void *arg);

/* Number of entries in TABLE. */
int db_count(struct db_txn *txn, enum db_table table, uint64_t *count);

#endif /* S3CFS_DB_H */
