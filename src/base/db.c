/*
 * db.c - LMDB environment and tables (see db.h).
 *
 * A full file system. LMDB writes its data file with pwrite(), so a
 * full disk is an error there; but it makes a new lock file (its reader
 * table) with ftruncate(), a hole, and writes it through a shared
 * mapping, where a store into a page the file system cannot give (a
 * full tmpfs or ext4) is SIGBUS. db_open() gives the lock file its
 * blocks first (lock_file_allocate), so that a full disk is ENOSPC at
 * the open and no later reader slot faults. A commit that does not fit
 * is ENOSPC, said once a minute at most per environment (commit_result:
 * LMDB reports a short write as EIO).
 */
#include "config.h"

#include "base/db.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/log.h"

#define DB_READERS 512
/* Room for LMDB's reader table of DB_READERS slots: 64 bytes a slot (a
 * cache line) after a header of under a page, in whole pages. LMDB
 * takes a lock file at least as large as its own table as it is. */
#define LOCK_FILE_BYTES (((off_t)DB_READERS * 64 + 2 * 4096 - 1) & ~(off_t)4095)
/* A file system with less free than this after LMDB's short write is
 * full (a commit writes at least a page: 4 KiB) */
#define FULL_BELOW (64u << 10)

static const char *const table_names[DB_TABLE_COUNT] = {
    [DB_META] = "meta",
    [DB_KEYS] = "keys",
    [DB_OBJECTS] = "objects",
    [DB_BLOCKS] = "blocks",
    [DB_RECENCY] = "recency",
    [DB_ATTRS] = "attrs",
    [DB_DIRS] = "dirs",
    [DB_LINKS] = "links",
    [DB_JOURNAL] = "journal",
};

struct db {
    MDB_env *env;
    MDB_dbi tables[DB_TABLE_COUNT];
    char *path;                       /* the environment's directory */
    _Atomic uint64_t full_logged;     /* log_due() of "is full" */
};

struct db_txn {
    struct db *db;
    MDB_txn *txn;
};

/* The one place LMDB results become errno values. */
static int mdb_errno(int rc, const char *what)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_NOTFOUND:
        return ENOENT;
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
        log_error("cache index: %s: %s", what, mdb_strerror(rc));
        return ENOSPC;
    case MDB_READERS_FULL:
        log_error("cache index: %s: %s", what, mdb_strerror(rc));
        return EAGAIN;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
    case MDB_BAD_TXN:
    case MDB_PANIC:
        log_error("cache index: %s: %s", what, mdb_strerror(rc));
        return EIO;
    default:
        if (rc > 0)
            return rc; /* a system errno */
        log_error("cache index: %s: %s", what, mdb_strerror(rc));
        return EIO;
    }
}

/* Whether the file system of PATH has (next to) nothing free. */
static bool file_system_full(const char *path)
{
    struct statvfs st;

    return statvfs(path, &st) == 0 &&
           (uint64_t)st.f_bavail * st.f_frsize < FULL_BELOW;
}

/* What the commit of a write transaction of DB that returned RC means:
 * RC, except that a full file system is ENOSPC (a short write is EIO to
 * LMDB; a quota, EDQUOT), logged once a minute at most. */
static int commit_result(struct db *db, int rc)
{
    if (rc == EDQUOT || (rc == EIO && file_system_full(db->path)))
        rc = ENOSPC;
    if (rc == ENOSPC && log_due(&db->full_logged))
        log_error("%s is full: its commits fail with ENOSPC until its file "
                  "system has room again", db->path);
    return rc;
}

/* Allocate the blocks of PATH/lock.mdb (created if need be) before LMDB
 * maps it: 0, ENOSPC when its file system is full, or open's errno. A
 * file system without fallocate() is left to LMDB as before. */
static int lock_file_allocate(const char *path)
{
    char lock_path[PATH_MAX];
    struct stat st;
    int err = 0;

    if (snprintf(lock_path, sizeof(lock_path), "%s/lock.mdb", path) >=
        (int)sizeof(lock_path))
        return ENAMETOOLONG;
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    off_t len = LOCK_FILE_BYTES;
    if (fstat(fd, &st) == 0 && st.st_size > len)
        len = st.st_size;
    /* (mode 0 allocates the holes only: a table in use keeps its bytes) */
    if (fallocate(fd, 0, 0, len) != 0 && errno != EOPNOTSUPP)
        err = errno == EDQUOT ? ENOSPC : errno;
    close(fd);
    return err;
}

int db_open(const char *path, uint64_t map_size, bool durable, struct db **out,
            char *errbuf, size_t errlen)
{
    struct db *db = calloc(1, sizeof(*db));
    MDB_txn *txn = NULL;
    unsigned flags = MDB_NOTLS | MDB_NORDAHEAD | (durable ? 0 : MDB_NOSYNC);
    int rc;

    *out = NULL;
    if (db == NULL || (db->path = strdup(path)) == NULL) {
        free(db);
        return ENOMEM;
    }
    rc = mdb_env_create(&db->env);
    if (rc == 0)
        rc = mdb_env_set_mapsize(db->env, (size_t)map_size);
    if (rc == 0)
        rc = mdb_env_set_maxdbs(db->env, DB_TABLE_COUNT);
    if (rc == 0)
        rc = mdb_env_set_maxreaders(db->env, DB_READERS);
    if (rc == 0)
        rc = lock_file_allocate(path);
    if (rc == 0)
        rc = mdb_env_open(db->env, path, flags, 0600);
    if (rc == 0)
        rc = mdb_txn_begin(db->env, NULL, 0, &txn);
    for (int i = 0; rc == 0 && i < DB_TABLE_COUNT; i++)
        rc = mdb_dbi_open(txn, table_names[i], MDB_CREATE, &db->tables[i]);
    if (rc == 0) {
        rc = commit_result(db, mdb_txn_commit(txn));
        txn = NULL;
    }
    if (rc == EDQUOT)
        rc = ENOSPC;
    if (rc == ENOSPC)
        snprintf(errbuf, errlen, "%s is full: its file system has no room "
                 "for the LMDB files there (%s)", path, strerror(rc));
    else if (rc != 0)
        snprintf(errbuf, errlen, "cannot open the cache index in %s: %s", path,
                 mdb_strerror(rc));
    if (rc != 0) {
        if (txn != NULL)
            mdb_txn_abort(txn);
        if (db->env != NULL)
            mdb_env_close(db->env);
        free(db->path);
        free(db);
        return rc > 0 ? rc : EIO;
    }
    *out = db;
    return 0;
}

void db_close(struct db **dbp)
{
    struct db *db = *dbp;

    if (db == NULL)
        return;
    mdb_env_sync(db->env, 1);
    mdb_env_close(db->env);
    free(db->path);
    free(db);
    *dbp = NULL;
}

int db_sync(struct db *db)
{
    return mdb_errno(mdb_env_sync(db->env, 1), "sync");
}

uint64_t db_file_bytes(struct db *db)
{
    MDB_envinfo info;
    MDB_stat stat;

    if (mdb_env_info(db->env, &info) != 0 || mdb_env_stat(db->env, &stat) != 0)
        return 0;
    return ((uint64_t)info.me_last_pgno + 1) * stat.ms_psize;
}

int db_txn_begin(struct db *db, bool write, struct db_txn **out)
{
    struct db_txn *txn = malloc(sizeof(*txn));
    int rc;

    *out = NULL;
    if (txn == NULL)
        return ENOMEM;
    txn->db = db;
    rc = mdb_txn_begin(db->env, NULL, write ? 0 : MDB_RDONLY, &txn->txn);
    if (rc != 0) {
        free(txn);
        return mdb_errno(rc, "begin transaction");
    }
    *out = txn;
    return 0;
}

uint64_t db_txn_id(struct db_txn *txn)
{
    return mdb_txn_id(txn->txn);
}

int db_txn_commit(struct db_txn **txnp)
{
    struct db_txn *txn = *txnp;
    int rc = commit_result(txn->db, mdb_txn_commit(txn->txn));

    free(txn);
    *txnp = NULL;
    return mdb_errno(rc, "commit");
}

void db_txn_abort(struct db_txn **txnp)
{
    if (*txnp == NULL)
        return;
    mdb_txn_abort((*txnp)->txn);
    free(*txnp);
    *txnp = NULL;
}

int db_get(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len, const void **value, size_t *value_len)
{
    MDB_val k = {key_len, (void *)key};
    MDB_val v;
    int rc = mdb_get(txn->txn, txn->db->tables[table], &k, &v);

    if (rc != 0)
        return mdb_errno(rc, "read");
    *value = v.mv_data;
    *value_len = v.mv_size;
    return 0;
}

int db_put(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len, const void *value, size_t value_len)
{
    MDB_val k = {key_len, (void *)key};
    MDB_val v = {value_len, (void *)value};
    return mdb_errno(mdb_put(txn->txn, txn->db->tables[table], &k, &v, 0),
                     "write");
}

int db_del(struct db_txn *txn, enum db_table table, const void *key,
           size_t key_len)
{
    MDB_val k = {key_len, (void *)key};
    return mdb_errno(mdb_del(txn->txn, txn->db->tables[table], &k, NULL),
                     "delete");
}

int db_clear(struct db_txn *txn, enum db_table table)
{
    return mdb_errno(mdb_drop(txn->txn, txn->db->tables[table], 0), "clear");
}

int db_scan(struct db_txn *txn, enum db_table table, const void *start,
            size_t start_len, db_visit_fn visit, void *arg)
{
    MDB_cursor *cursor = NULL;
    MDB_val k = {start_len, (void *)start};
    MDB_val v;
    int rc = mdb_cursor_open(txn->txn, txn->db->tables[table], &cursor);
    int err = 0;

    if (rc != 0)
        return mdb_errno(rc, "cursor");
    rc = mdb_cursor_get(cursor, &k, &v, start_len > 0 ? MDB_SET_RANGE : MDB_FIRST);
    while (rc == 0) {
        int result = visit(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        if (result != 0) {
            err = result > 0 ? result : 0;
            goto out;
        }
        rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT);
    }
    if (rc != MDB_NOTFOUND)
        err = mdb_errno(rc, "scan");
out:
    mdb_cursor_close(cursor);
    return err;
}

int db_count(struct db_txn *txn, enum db_table table, uint64_t *count)
{
    MDB_stat stat;
    int rc = mdb_stat(txn->txn, txn->db->tables[table], &stat);

    if (rc != 0)
        return mdb_errno(rc, "stat");
    *count = stat.ms_entries;
    return 0;
}
