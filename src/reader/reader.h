/*
 * reader.h - reading object data for open files, through the block cache.
 *
 * A read is served block by block from the cache (cache.h). A missing
 * block is fetched with a ranged GET that streams straight into the cache
 * (no buffer of the data is held in memory), and concurrent readers of a
 * block share that one request. Sequential readers also get a read-ahead
 * window of blocks fetched in parallel on the worker pool, coalesced into
 * GETs of up to max_request bytes; the window starts at 4 blocks and
 * doubles up to read_ahead. A read that does not continue the previous one
 * resets the window, so random readers (mmap of safetensors) fetch only
 * the blocks they touch.
 *
 * Every GET carries If-Match with the ETag seen at open: if the object
 * changes underneath, reads fail with ESTALE rather than mixing versions.
 * When the cache cannot make room (its disk is full of other data) reads
 * still work, fetching just the bytes asked for.
 *
 * Memory bound: one block-sized buffer per thread that reads (FUSE
 * threads) plus libcurl's buffers per connection; nothing grows with the
 * number of open files or the size of the window.
 */
#ifndef S3CFS_READER_H
#define S3CFS_READER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/workers.h"
#include "cache/cache.h"
#include "s3/s3.h"
#include "tier/tier.h"

struct reader_conf {
    struct s3_client *s3;
    struct cache *cache;
    struct workers *workers;     /* runs the read-ahead fetches */
    uint64_t read_ahead;         /* largest window per file, bytes */
    uint64_t max_request;        /* largest GET, bytes */
    struct tier *tier;           /* the shared cache tier, asked before
                                    the bucket and given what the bucket
                                    sent (tier.h); NULL: none */
};

struct reader_stats {
    uint64_t bytes_read;         /* bytes returned to readers */
    uint64_t blocks_prefetched;  /* read-ahead blocks requested */
    uint64_t direct_bytes;       /* read without the cache (it was full) */
    uint64_t hit_bytes;          /* returned from blocks already cached
                                    (not fetched for this open file) */
};

struct reader;
struct reader_file;

int reader_create(const struct reader_conf *conf, struct reader **out);

/* Stop starting read-ahead (queued jobs end at once); for unmount. */
void reader_stop(struct reader *reader);

void reader_destroy(struct reader **reader);
void reader_get_stats(struct reader *reader, struct reader_stats *out);

/* Start reading version ETAG (SIZE bytes) of KEY. 0, ENOMEM, or the
 * cache's errno. */
int reader_open(struct reader *reader, const char *key, const char *etag,
                uint64_t size, struct reader_file **out);

/*
 * Read up to SIZE bytes at OFFSET into BUF; *got is less than SIZE only at
 * the end of the object. Safe for concurrent reads of one file. Returns 0,
 * ESTALE (object changed), or the S3 client's or the cache's errno.
 */
int reader_read(struct reader_file *file, uint64_t offset, size_t size,
                char *buf, size_t *got);

/*
 * reader_read() without a copy: the bytes go into the pipe PIPE_WRITE
 * (empty, with room for SIZE bytes) as references to the cache's pages,
 * verified as reader_read() verifies them (cache_block_splice()). The
 * blocks they come from are held in HOLDS (the caller's, empty), also on
 * failure: the caller releases them (cache_holds_release()) once the
 * pipe is read out by the answer, or closed. *GOT is less than SIZE only
 * at the end of the file. On failure the pipe holds anything (the caller
 * discards it) and the result is an errno: EOPNOTSUPP (the file is read
 * around the cache), ENOSPC (the cache cannot hold the blocks), ENOBUFS
 * (the pipe or HOLDS is too small) and EAGAIN (a block was found
 * damaged, and dropped, after part of the read was in the pipe) ask for
 * reader_read() instead; the others are reader_read()'s.
 */
int reader_read_pipe(struct reader_file *file, uint64_t offset, size_t size,
                     int pipe_write, struct cache_holds *holds, size_t *got);

/* Never read ahead past byte END (0: no limit): a reader that knows the
 * range it needs (the base of an edit) fetches nothing else. */
void reader_limit_prefetch(struct reader_file *file, uint64_t end);

/*
 * Fetch all of version ETAG (SIZE bytes, > 0) of KEY into the cache with
 * one GET, and its headers into *INFO: what a lookup does instead of a
 * HEAD when the file will be read next (see fs.c). EEXIST when part of it
 * is already cached or being fetched, ENOSPC when the cache cannot hold it
 * or it needs more than one GET (nothing fetched in either case), ESTALE
 * when the object is no longer ETAG, ENOENT when it is gone, or the S3
 * client's errno.
 */
int reader_fetch_whole(struct reader *reader, const char *key, const char *etag,
                       uint64_t size, struct s3_object_info *info);

/* What reader_warm() did. */
struct reader_warm_result {
    uint64_t cached_before;      /* bytes of the version cached before */
    uint64_t fetched;            /* bytes this call's GETs stored */
    uint64_t cached;             /* bytes cached when it returned */
};

/*
 * `s3cachefs warm`: fetch every block of version ETAG (SIZE bytes) of KEY
 * that is not cached, in runs of up to max_request, with at most
 * PARALLEL GETs at once on the worker pool; blocks cached are skipped
 * and blocks another reader is fetching are waited for, not asked again
 * (each block is fetched once, also when the cache is too small to keep
 * them all: out->cached then says how much stayed; a block whose fetch by
 * another reader failed is left missing). Blocks go through the cache's ordinary
 * fill path (probation). Stops starting GETs once *STOP (may be NULL) is
 * true or the reader stops, and returns EINTR at once: the GETs under
 * way finish on their own, so the cache holds whole blocks only. *OUT is
 * filled also on failure. 0 (also for an empty object or one without an
 * ETag: nothing to cache), EINTR, ENOSPC (the cache cannot take it),
 * ESTALE (the object changed), ENOENT, ENOMEM, or the S3 client's errno.
 */
int reader_warm(struct reader *reader, const char *key, const char *etag,
                uint64_t size, unsigned parallel, const atomic_bool *stop,
                struct reader_warm_result *out);

void reader_close(struct reader_file **file);

#endif /* S3CFS_READER_H */
