/*
 * s3walk.c - the pages of one listing, walked with a guard (see s3walk.h).
 */
#include "config.h"

#include "s3/s3walk.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* FNV-1a: tokens are remembered as 64-bit hashes (a false "seen before"
 * needs a collision: about one in 2^64 per pair). */
static uint64_t token_hash(const char *token)
{
    uint64_t hash = 14695981039346656037ull;
    for (const unsigned char *p = (const unsigned char *)token; *p; p++) {
        hash ^= *p;
        hash *= 1099511628211ull;
    }
    return hash;
}

/* The greatest key or prefix of PAGE in byte order (S3's), or NULL. */
static const char *page_greatest(const struct s3xml_listing *page)
{
    const char *greatest = NULL;

    for (size_t i = 0; i < page->object_count; i++)
        if (greatest == NULL || strcmp(page->objects[i].key, greatest) > 0)
            greatest = page->objects[i].key;
    for (size_t i = 0; i < page->prefix_count; i++)
        if (greatest == NULL || strcmp(page->prefixes[i], greatest) > 0)
            greatest = page->prefixes[i];
    return greatest;
}

/* Whether PAGE may follow what WALK has seen; logs the reason when not. */
static bool walk_accepts(struct s3walk *walk, const char *prefix,
                         const struct s3xml_listing *page)
{
    const char *greatest = page_greatest(page);
    const char *shown = prefix != NULL ? prefix : "";

    if (greatest != NULL && walk->greatest != NULL &&
        strcmp(greatest, walk->greatest) <= 0) {
        log_warn("LIST %s: the server sent a page that lists nothing after "
                 "what it listed before, so the listing would never end: "
                 "it is cut short here", shown);
        return false;
    }
    if (greatest == NULL && page->truncated &&
        ++walk->empty_pages > S3WALK_EMPTY_PAGES_MAX) {
        log_warn("LIST %s: the server sent %u empty pages in a row, each "
                 "saying more follows: the listing is cut short here", shown,
                 walk->empty_pages);
        return false;
    }
    if (!page->truncated)
        return true;
    uint64_t hash = token_hash(page->next_token);
    for (size_t i = 0; i < walk->tokens_count; i++) {
        if (walk->tokens_seen[i] == hash) {
            log_warn("LIST %s: the server sent a continuation token it had "
                     "sent before, so the listing would never end: it is cut "
                     "short here", shown);
            return false;
        }
    }
    return true;
}

int s3walk_advance(struct s3walk *walk, const char *prefix,
                   const struct s3xml_listing *page)
{
    char *greatest = NULL;
    char *token = NULL;
    int err = 0;

    if (walk->done)
        return EINVAL;
    if (!walk_accepts(walk, prefix, page)) {
        err = EIO;
        goto out;
    }
    const char *page_max = page_greatest(page);
    if (page_max != NULL && (greatest = strdup(page_max)) == NULL) {
        err = ENOMEM;
        goto out;
    }
    if (page->truncated) {
        if (walk->tokens_count == walk->tokens_cap) {
            size_t cap = walk->tokens_cap ? walk->tokens_cap * 2 : 16;
            uint64_t *grown = realloc(walk->tokens_seen, cap * sizeof(*grown));
            if (grown == NULL) {
                err = ENOMEM;
                goto out;
            }
            walk->tokens_seen = grown;
            walk->tokens_cap = cap;
        }
        if ((token = strdup(page->next_token)) == NULL) {
            err = ENOMEM;
            goto out;
        }
        walk->tokens_seen[walk->tokens_count++] = token_hash(token);
    }
    if (greatest != NULL) {
        walk->empty_pages = 0;
        free(walk->greatest);
        walk->greatest = greatest;
        greatest = NULL;
    }
    free(walk->token);
    walk->token = token;
    token = NULL;
    walk->done = !page->truncated;
out:
    if (err != 0)
        walk->done = true;
    free(greatest);
    free(token);
    return err;
}

int s3walk_next(struct s3_client *client, struct s3walk *walk,
                const char *prefix, const char *delimiter,
                unsigned max_keys, struct s3xml_listing *out)
{
    int err;

    memset(out, 0, sizeof(*out));
    if (walk->done)
        return EINVAL;
    err = s3_list_objects(client, prefix, delimiter, walk->token, NULL,
                          max_keys, out);
    if (err == 0)
        err = s3walk_advance(walk, prefix, out);
    if (err != 0) {
        s3xml_listing_free(out);
        walk->done = true;
    }
    return err;
}

void s3walk_clear(struct s3walk *walk)
{
    free(walk->token);
    free(walk->greatest);
    free(walk->tokens_seen);
    memset(walk, 0, sizeof(*walk));
}
