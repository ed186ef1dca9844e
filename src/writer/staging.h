/*
 * staging.h - the files of CACHE/staging/: the data of files being written
 * or waiting for their upload, one file per version (see writer.h).
 *
 * A staging file is named by its id in hex (16 digits), an id the journal
 * hands out (journal_next_id), so that a journal entry names exactly one
 * of them. This module only does the file system part: create, open,
 * copy, make durable, remove. Who may change a staging file, and when, is
 * the writer's business.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef S3CFS_STAGING_H
#define S3CFS_STAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct staging_dir;

/* Open (creating it if needed) DIR/staging under the cache directory
 * CACHE_DIR. 0 or an errno (logged). */
int staging_dir_open(const char *cache_dir, struct staging_dir **out);

/* Close; *dir = NULL. Safe twice. */
void staging_dir_close(struct staging_dir **dir);

/* The directory's path (valid until closed). */
const char *staging_dir_path(const struct staging_dir *dir);

/* The path of staging file ID into OUT (CAP bytes, PATH_MAX is enough). */
void staging_path(const struct staging_dir *dir, uint64_t id, char *out,
                  size_t cap);

/* Create staging file ID, empty and new (O_EXCL); its descriptor in *fd.
 * ENOSPC (also for a full quota) or EIO, logged. */
int staging_create(struct staging_dir *dir, uint64_t id, int *fd);

/* Open the existing staging file ID for reading and writing. ENOENT when
 * it is missing, EIO. */
int staging_open(struct staging_dir *dir, uint64_t id, int *fd);

/* Make TO (an empty staging file) hold the first LENGTH bytes of FROM:
 * what FROM holds of them is copied in the kernel (copy_file_range, which
 * shares the blocks where the file system can), the rest reads as zeros.
 * ENOSPC or EIO. */
int staging_copy(int from, int to, uint64_t length);

/* Make the staging file FD durable, with its directory entry: fsync of the
 * file, then of the directory. ENOSPC or EIO, logged with WHAT (a key). */
int staging_sync(struct staging_dir *dir, int fd, const char *what);

/* Remove staging file ID (a missing one is no error). */
void staging_remove(struct staging_dir *dir, uint64_t id);

/*
 * Visit the id of every staging file in the directory (names that are not
 * 16 hex digits are skipped). VISIT returns 0 to go on. 0 or an errno.
 */
int staging_scan(struct staging_dir *dir,
                 int (*visit)(void *arg, uint64_t id), void *arg);

/*
 * Promises kept beside their staging files, for when the journal cannot
 * be written (a full or failing disk under it): staging file ID gets
 * ID.promise, holding RECORD (LEN bytes, a journal record), written
 * durably (fsync of the file and the directory). The next mount puts it
 * back into the journal. ENOSPC or EIO, logged.
 */
int staging_mark(struct staging_dir *dir, uint64_t id, const void *record,
                 size_t len);

/* Remove the promise kept for ID (none: no error). */
void staging_unmark(struct staging_dir *dir, uint64_t id);

/* Visit every promise kept (ID and its record, valid during the call;
 * records over 64 KiB are skipped with a log line). VISIT returns 0 to go
 * on. 0 or an errno. */
int staging_scan_marks(struct staging_dir *dir,
                       int (*visit)(void *arg, uint64_t id, const void *record,
                                    size_t len),
                       void *arg);

/* How many promises are kept beside their staging files (see
 * staging_mark()) into *COUNT. 0 or an errno. */
int staging_count_marks(struct staging_dir *dir, uint64_t *count);

#endif /* S3CFS_STAGING_H */
