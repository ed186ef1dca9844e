/*
 * writebehind.h - uploading a large file while it is still being written.
 *
 * A file written from its start (a checkpoint, a downloaded blob) does not
 * wait for close() or fsync() to begin its upload: once the writer has
 * written past the multipart threshold, a multipart upload is created and
 * every part the writer has filled is sent in the background, while it
 * writes the next ones. At close/fsync only the last parts and the
 * completion are left (writebehind_finish).
 *
 * Parts have fixed boundaries, known before the final size is: part i
 * (0-based) is base << (i / 1000) bytes long, base the smallest part size,
 * so 10,000 parts of a base of 8 MiB hold 8 TiB (S3 objects stop at
 * 5 TiB). A byte written again after its part was sent (or while it is
 * being sent) makes that part stale: it is sent again before the upload
 * completes. Truncating makes every part past the new end stale. So
 * whatever the writer does, finish() completes with exactly the staged
 * file's bytes; only sequential writers save time. Parts are held back a
 * little behind the writer (two parts, more for a writer seen going back
 * to patch what it wrote), so that such patches rarely hit a part sent.
 *
 * The staged data is read from FD with pread (never held in memory). The
 * caller reports each write after the bytes are in FD.
 *
 * Threads: parts are sent on CONF->workers, at most CONF->parallel at a
 * time per file. writebehind_wrote/truncated may be called from any
 * thread and never block on the network; finish and abandon wait for the
 * parts in flight and must not run on a thread of CONF->workers. A part
 * that fails in the background is sent again by finish().
 */
#ifndef S3CFS_WRITEBEHIND_H
#define S3CFS_WRITEBEHIND_H

#include <stdint.h>

#include "s3/s3.h"
#include "writer/upload.h"

struct writebehind;

/* Bytes [*offset, *offset + *length) of part INDEX (0-based) when the
 * smallest part is BASE bytes. */
void writebehind_part_range(unsigned index, uint64_t base, uint64_t *offset,
                            uint64_t *length);

/* The largest file whose parts fit in UPLOAD_MAX_PARTS with base BASE. */
uint64_t writebehind_capacity(uint64_t base);

/*
 * Start: create the multipart upload of KEY with META (one request, in
 * this thread). Parts are read from FD; none is sent before the first
 * writebehind_wrote() says how much of it is written. Returns 0 or the
 * S3 client's errno.
 */
int writebehind_start(const struct upload_conf *conf, const char *key,
                      const struct s3_put_meta *meta, int fd,
                      struct writebehind **out);

/* The key and upload id it was created with (valid until freed). */
const char *writebehind_key(const struct writebehind *wb);
const char *writebehind_upload_id(const struct writebehind *wb);

/*
 * [OFFSET, OFFSET + LENGTH) of FD was written; the first READY bytes of
 * the file are now final as far as the writer knows. Parts that were sent
 * and overlap the range become stale; parts within READY that are not
 * sent are queued.
 */
void writebehind_wrote(struct writebehind *wb, uint64_t offset, uint64_t length,
                       uint64_t ready);

/* The file was cut to SIZE: parts past it become stale, nothing past it
 * is sent until it is written again. */
void writebehind_truncated(struct writebehind *wb, uint64_t size);

/*
 * The file is complete with SIZE bytes (> 0; no write runs meanwhile):
 * send every part not sent, wait, complete the upload. ETAG_OUT
 * (S3_ETAG_MAX bytes) receives the object's ETag. On failure the
 * multipart upload is aborted. Frees *WB in every case (*WB = NULL).
 * Returns 0 or the first errno; EFBIG when SIZE does not fit.
 */
int writebehind_finish(struct writebehind **wb, uint64_t size, char *etag_out);

/* Give up: wait for the parts in flight, abort the multipart upload
 * (upload_abandon(): a failure is logged and handed over), free; *WB =
 * NULL. Safe with NULL. */
void writebehind_abandon(struct writebehind **wb);

#endif /* S3CFS_WRITEBEHIND_H */
