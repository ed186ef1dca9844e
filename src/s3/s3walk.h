/*
 * s3walk.h - the pages of one listing, walked with a guard against servers
 * whose pages go round.
 *
 * A server that repeats a continuation token, or sends pages that make no
 * progress, would otherwise be listed forever while the caller's memory
 * grows page by page. The walk asks s3_list_objects() (s3.h) for each
 * page; the guard itself (s3walk_advance()) needs no request, so it is
 * unit-tested on pages as servers send them.
 */
#ifndef S3CFS_S3WALK_H
#define S3CFS_S3WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "s3/s3.h"
#include "s3/s3xml.h"

/*
 * The pages of one listing, one after the other, with a guard: a
 * continuation token already used in this walk, or a page whose entries
 * all sort at or before the greatest one listed before (a page that makes
 * no progress), ends the walk with EIO and one log line, as does a run of
 * S3WALK_EMPTY_PAGES_MAX truncated pages without entries. A server that
 * sends the same pages over and over would otherwise be listed forever,
 * and the caller's memory would grow with it.
 *
 *     struct s3walk walk = {0};
 *     while (!walk.done) {
 *         err = s3walk_next(client, &walk, prefix, "/", 1000, &page);
 *         ... use page, s3xml_listing_free(&page) ...
 *     }
 *     s3walk_clear(&walk);
 *
 * A zeroed struct is a walk before its first page; walk.done is set by the
 * call that returned the last page. The fields are the walk's own.
 */
#define S3WALK_EMPTY_PAGES_MAX 100

struct s3walk {
    bool done;                /* the last page has been returned */
    char *token;              /* continuation token of the next page */
    char *greatest;           /* greatest key or prefix listed so far */
    uint64_t *tokens_seen;    /* hashes of the tokens used */
    size_t tokens_count, tokens_cap;
    unsigned empty_pages;     /* truncated pages without entries in a row */
};

/* The next page of PREFIX (DELIMITER, MAX_KEYS as s3_list_objects()) into
 * *out (free with s3xml_listing_free()). Returns 0, EIO (a page that would
 * make the walk go round, or a bad answer), EINVAL once WALK is done, or
 * s3_list_objects()'s errno; on error *out is empty. */
int s3walk_next(struct s3_client *client, struct s3walk *walk,
                const char *prefix, const char *delimiter,
                unsigned max_keys, struct s3xml_listing *out);

/* The guard and step of s3walk_next(), without the request: check
 * PAGE (a page of PREFIX just listed with WALK->token) against what WALK
 * has seen, and make WALK ready for the next page (or done). Returns 0,
 * EIO (logged: the walk would go round), EINVAL (WALK is done) or ENOMEM;
 * on error WALK is done. PAGE stays the caller's. */
int s3walk_advance(struct s3walk *walk, const char *prefix,
                   const struct s3xml_listing *page);

/* Free what WALK holds and zero it; safe twice. */
void s3walk_clear(struct s3walk *walk);

#endif /* S3CFS_S3WALK_H */
