/*
 * access_log.h - the file of -o access_log=FILE: the paths a job opened,
 * so that the next node can `s3cachefs warm --from FILE` the same list
 * before its job starts.
 *
 * One line per object version, the first time it is opened for reading
 * in this mount: the path through the mount point ("/data/hf/x.bin"),
 * then a newline. A file written through the mount is listed once it is
 * read from the bucket (a checkpoint that the next run resumes from), not
 * while its data is staged. Lines are appended with one write(2) each,
 * under a lock of their own (not the set's), so that a line is whole even
 * if the node dies; a write that fails forgets the version, listed again
 * at its next open, and a line cut short (a full disk) is followed by a
 * newline before the next one.
 * The file is never truncated (a later mount appends: duplicates are
 * harmless to warm, which skips what is cached). A path with a newline in it cannot
 * be a line: it is left out, with one log line.
 *
 * Thread-safe. What was seen is kept as 64-bit hashes of (key, ETag):
 * 16 to 32 bytes per version (a table at most half full, doubled as it
 * grows), 16 to 32 MiB for a million files.
 */
#ifndef S3CFS_ACCESS_LOG_H
#define S3CFS_ACCESS_LOG_H

#include <stddef.h>

struct access_log;

/*
 * Open (create, mode 0640) PATH for appending. MOUNTPOINT (absolute) and
 * ROOT_KEY ("" or "prefix/") turn keys into paths. PATH must not be
 * inside MOUNTPOINT (the daemon would write through itself). 0, or an
 * errno with a sentence in ERR. Call before the daemon forks (PATH
 * relative to the current directory).
 */
int access_log_open(const char *path, const char *mountpoint,
                    const char *root_key, struct access_log **out,
                    char *err, size_t errlen);

/* KEY (under ROOT_KEY) was opened for reading at version ETAG. */
void access_log_opened(struct access_log *log, const char *key,
                       const char *etag);

/* Close and free; *LOG = NULL. Safe on NULL. */
void access_log_close(struct access_log **log);

#endif /* S3CFS_ACCESS_LOG_H */
