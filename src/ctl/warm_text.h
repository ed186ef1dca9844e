/*
 * warm_text.h - the text of the answers to `s3cachefs warm` (warm_cmd.h),
 * which the daemon gives as the value of an extended attribute of the
 * file asked about (fs.h: FS_WARM_XATTR and its siblings). Pure: no I/O.
 *
 *   s3cachefs-warm 1          header: the format's version
 *   status done               done, interrupted, failed, staged, full
 *   error 0                   failed: the errno (same machine)
 *   size 1048576              the version's bytes
 *   before 0                  bytes of it cached when the request came
 *   fetched 1048576           bytes this request fetched
 *   cached 1048576            bytes of it cached when it answered
 *   freed 0                   --evict: bytes dropped
 *   pinned 0                  1: the version is pinned (kept by eviction)
 *   pin_used 0                --pin, --unpin: the pinned versions' bytes
 *   pin_max 0                 --pin, --unpin: what they may take
 *
 * One "name value" line each, numbers in decimal; a reader ignores names
 * it does not know (a newer daemon may add some) and requires status,
 * size and cached. A version other than 1 is refused.
 */
#ifndef S3CFS_WARM_TEXT_H
#define S3CFS_WARM_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WARM_TEXT_VERSION 1
#define WARM_TEXT_VALUE_MAX 512        /* an answer is never longer */

enum warm_text_status {
    WARM_TEXT_DONE,          /* as asked (a warm may still have found less
                              room than the file: cached < size) */
    WARM_TEXT_INTERRUPTED,   /* the caller was interrupted: what was done */
    WARM_TEXT_FAILED,        /* error says why; the counts are what was done */
    WARM_TEXT_STAGED,        /* the file has data not uploaded yet: it is
                              local already, nothing to fetch or evict */
    WARM_TEXT_FULL,          /* --pin: pinning it would pass the pinned
                              share of the cache (nothing pinned) */
    WARM_TEXT_STATUS_COUNT,
};

struct warm_text_answer {
    enum warm_text_status status;
    int error;
    uint64_t size;
    uint64_t before;
    uint64_t fetched;
    uint64_t cached;
    uint64_t freed;
    bool pinned;
    uint64_t pin_used;
    uint64_t pin_max;
};

/* The word of STATUS ("done"...); "?" for no status. Static. */
const char *warm_text_status_name(enum warm_text_status status);

/* ANSWER as text into BUF (CAP bytes, NUL-terminated; *LEN without the
 * NUL). 0 or ERANGE (CAP too small: WARM_TEXT_VALUE_MAX always fits). */
int warm_text_format(const struct warm_text_answer *answer, char *buf, size_t cap,
                     size_t *len);

/* TEXT (LEN bytes, not necessarily NUL-terminated) into *OUT. 0; EINVAL
 * (not this format, a bad number, a required line missing, a status not
 * known); EPROTONOSUPPORT (another version of the format). */
int warm_text_parse(const char *text, size_t len, struct warm_text_answer *out);

#endif /* S3CFS_WARM_TEXT_H */
