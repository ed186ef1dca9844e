/*
 * reader.h - reading object data for open files: ranged GETs with a
 * parallel read-ahead window for sequential readers.
 *
 * Each open file gets a struct reader_file. Sequential reads (each starting
 * where the last ended) fetch CHUNK-sized pieces and keep a window of the
 * following chunks in flight on the worker pool, doubling the window up to
 * read_ahead bytes. A read elsewhere resets the window and fetches just the
 * bytes asked for, so random readers (mmap of safetensors) cause no wasted
 * transfer. Every GET carries If-Match with the ETag seen at open: if the
 * object changes underneath, reads fail with ESTALE rather than mixing
 * versions.
 *
 * Memory bound: chunk buffers of all files together stay under
 * memory_budget for read-ahead, plus one chunk per reading FUSE thread for
 * the chunk a read is waiting on.
 *
 * The block cache (a later layer) slots in under reader_read(): chunks will
 * be looked up there first and written there after a fetch.
 */
#ifndef S3CFS_READER_H
#define S3CFS_READER_H

#include <stddef.h>
#include <stdint.h>

#include "s3.h"
#include "workers.h"

/* Unit of sequential fetching and of read-ahead. */
#define READER_CHUNK_SIZE (4u << 20)

struct reader_conf {
    struct s3_client *s3;
    struct workers *workers;     /* runs the read-ahead fetches */
    uint64_t read_ahead;         /* largest window per file, bytes */
    uint64_t memory_budget;      /* all read-ahead buffers together */
};

/* Counters for the statistics interface. */
struct reader_stats {
    uint64_t bytes_read;         /* bytes returned to readers */
    uint64_t chunks_prefetched;  /* read-ahead fetches started */
    uint64_t memory_in_use;      /* bytes of chunk buffers now */
};

struct reader;
struct reader_file;

int reader_create(const struct reader_conf *conf, struct reader **out);
void reader_destroy(struct reader **reader);
void reader_get_stats(struct reader *reader, struct reader_stats *out);

/*
 * Start reading object KEY of SIZE bytes, version ETAG. Copies KEY and
 * ETAG. Returns 0 or ENOMEM.
 */
int reader_open(struct reader *reader, const char *key, const char *etag,
                uint64_t size, struct reader_file **out);

/*
 * Read up to SIZE bytes at OFFSET into BUF; *got is less than SIZE only at
 * the end of the object. Thread-safe for concurrent reads of one file.
 * Returns 0, ESTALE (object changed), or the S3 client's errno.
 */
int reader_read(struct reader_file *file, uint64_t offset, size_t size,
                char *buf, size_t *got);

/* Wait for the file's fetches to finish, free it; *file = NULL. */
void reader_close(struct reader_file **file);

#endif /* S3CFS_READER_H */
