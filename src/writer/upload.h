/*
 * upload.h - putting staged data into the bucket.
 *
 * One PUT (with Content-MD5) for objects up to multipart_threshold; above
 * that a multipart upload whose parts are sent in parallel on the worker
 * pool, with a part size that grows so that any object up to 5 TiB fits in
 * 10,000 parts, each part with its Content-MD5. A failed multipart upload
 * is aborted. Data is read from the staging file with pread, never held
 * whole in memory (one MD5 pass, then curl streams it).
 *
 * When the staged file is an edit of an object already in the bucket (the
 * "base"), parts the writer never touched are copied server-side
 * (UploadPartCopy with x-amz-copy-source-if-match) instead of being
 * downloaded and sent again; where the server cannot copy (501), the part
 * is materialized and uploaded instead.
 *
 * Server-side copies (rename, metadata): CopyObject up to 5 GiB,
 * multipart copy above, both conditional on the source's ETag.
 *
 * Threads: upload_file() and upload_copy() block until done and must not
 * be called from a thread of CONF->workers (they wait for jobs on it).
 */
#ifndef S3CFS_UPLOAD_H
#define S3CFS_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/workers.h"
#include "s3/s3.h"

#define UPLOAD_MAX_PARTS 10000u
#define UPLOAD_MIN_PART_SIZE (5ull << 20)
#define UPLOAD_MAX_COPY_SIZE (5ull << 30)      /* one CopyObject */

struct upload_conf {
    struct s3_client *s3;
    struct workers *workers;       /* runs the parts */
    unsigned parallel;             /* parts in flight per upload (>= 1) */
    uint64_t multipart_threshold;  /* larger objects go multipart */
    uint64_t part_size;            /* smallest part, >= 5 MiB */
    /* Told of a multipart upload left on the server because its abort
     * failed (upload_abandon()), so that it can be aborted later (stored
     * parts are billed until then); may be NULL. */
    void (*abort_failed)(void *arg, const char *key, const char *upload_id);
    void *abort_failed_arg;
};

/* The part size for an object of SIZE bytes: MIN_PART_SIZE, grown to a
 * multiple of 1 MiB so that SIZE fits in UPLOAD_MAX_PARTS parts. */
uint64_t upload_part_size(uint64_t size, uint64_t min_part_size);

/* An object in the bucket that the staged file was made from. */
struct upload_base {
    const char *key;
    const char *etag;
    uint64_t size;
    /* Whether [offset, offset + length) of the staged file still holds the
     * base object's bytes and was never materialized (so it may be copied
     * server-side). */
    bool (*range_unchanged)(void *arg, uint64_t offset, uint64_t length);
    /* Make [offset, offset + length) present in the staging file before it
     * is read; 0 or an errno. */
    int (*materialize)(void *arg, uint64_t offset, uint64_t length);
    void *arg;
};

struct upload_request {
    const char *key;               /* destination */
    int fd;                        /* staged data, read with pread */
    uint64_t size;
    const struct s3_put_meta *meta;
    const struct upload_base *base; /* NULL: every byte is in FD */
    /* Called once a multipart upload exists and before any part is sent,
     * so that the caller can journal UPLOAD_ID (to abort it after a crash);
     * a non-zero return aborts the upload with that errno. May be NULL. */
    int (*on_multipart)(void *arg, const char *upload_id);
    void *arg;
};

/* Upload REQ; ETAG_OUT (S3_ETAG_MAX bytes) receives the new ETag.
 * Returns 0 or the S3 client's errno (retries already done). */
int upload_file(const struct upload_conf *conf, const struct upload_request *req,
                char *etag_out);

/*
 * Copy SRC_KEY (SIZE bytes) to DST_KEY server-side, with META replacing
 * the metadata (NULL: copied), only if SRC_KEY is still version SRC_ETAG
 * (NULL: whatever it is). ETAG_OUT may be NULL. *SAME_VERSION (may be
 * NULL) says whether DST_KEY is known to hold version SRC_ETAG now: true
 * when the server checked the condition; where it refuses the condition
 * (Swift, for sources it holds in parts), the copy is made without it
 * between two HEADs that see SRC_ETAG, and true only then. Only with it
 * true may a caller treat the copy's bytes as the ones it knows (cached
 * blocks). Returns 0, ESTALE when SRC_KEY is another version (nothing was
 * copied), or the S3 client's errno.
 */
int upload_copy(const struct upload_conf *conf, const char *src_key,
                const char *src_etag, uint64_t size, const char *dst_key,
                const struct s3_put_meta *meta, char *etag_out,
                bool *same_version);

/* Abort multipart upload UPLOAD_ID of KEY (a left-over after a crash);
 * a server that cannot abort is logged and counts as done. */
int upload_abort(const struct upload_conf *conf, const char *key,
                 const char *upload_id);

/* Abort UPLOAD_ID of KEY, an upload that failed or is given up. A failure
 * to abort is logged and told to conf->abort_failed: the caller's error is
 * already the upload's, and the upload is to be aborted later. */
void upload_abandon(const struct upload_conf *conf, const char *key,
                    const char *upload_id);

#endif /* S3CFS_UPLOAD_H */
