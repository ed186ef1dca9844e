/*
 * metacache.h - object attributes and directory listings, persisted in the
 * cache's LMDB index so that a remount does not pay for them again.
 *
 * Attributes are stored with the ETag they were read for: a listing that
 * shows the same ETag later (one LIST covers 1000 keys) proves them still
 * valid, so `ls -l` after a remount costs LIST requests, not one HEAD per
 * file. Listings are stored with the wall-clock time they were fetched and
 * are used while younger than dir_ttl; older ones are pruned at mount.
 * Attributes are kept (one small record per object ever HEADed).
 *
 * Thread-safe; each call is one short index transaction. Failures are
 * logged by the index layer and reported as errno, and callers treat them
 * as cache misses: this is an optimisation, never a source of truth.
 */
#ifndef S3CFS_METACACHE_H
#define S3CFS_METACACHE_H

#include "cache/cache.h"
#include "fs/inode.h"

/* Attributes of KEY known for ETAG: 0 and *out filled (headers_known
 * true), or ENOENT (unknown, or known for another ETag). */
int metacache_get_attrs(struct cache *cache, const char *key, const char *etag,
                        struct inode_attrs *out);

/* Remember ATTRS (from a HEAD: headers_known) of KEY. */
int metacache_put_attrs(struct cache *cache, const char *key,
                        const struct inode_attrs *attrs);

/* The target of symbolic link KEY in its version ETAG: 0 and a new
 * string in *target (caller frees), or ENOENT (unknown, or known for
 * another ETag). A link read once is never fetched again, even after a
 * remount: a Hugging Face snapshot is a tree of them. */
int metacache_get_link(struct cache *cache, const char *key, const char *etag,
                       char **target);

/* Remember TARGET of symbolic link KEY in its version ETAG. */
int metacache_put_link(struct cache *cache, const char *key, const char *etag,
                       const char *target);

/* Remember LISTING of directory prefix DIR_KEY (fetched_at_wall: when). */
int metacache_put_listing(struct cache *cache, const char *dir_key,
                          const struct inode_listing *listing,
                          double fetched_at_wall);

/*
 * The listing of DIR_KEY stored less than MAX_AGE seconds ago: 0 and a new
 * listing in *out (refs 0, caller owns; attributes have headers_known
 * false), or ENOENT.
 */
int metacache_get_listing(struct cache *cache, const char *dir_key,
                          double max_age, struct inode_listing **out);

/* Forget the stored listing of DIR_KEY (the directory changed here).
 * 0, or the index's errno. */
int metacache_forget_listing(struct cache *cache, const char *dir_key);

/*
 * Forget what the index holds under KEY (`s3cachefs refresh`): for a
 * directory prefix (ending in '/', or "" for the bucket's root) its
 * listing, those of the directories its stored listings name, at any
 * depth, and the attributes of every file and directory they name and of
 * the directory itself; for a file, its attributes. Symbolic link targets
 * stay (kept by ETag: a new target is a new ETag). One write transaction
 * per directory. *LISTINGS and *RECORDS (may be NULL) get how many
 * listings and attribute records went. 0, ENOMEM or the index's errno
 * (what was dropped before a failure stays dropped).
 */
int metacache_forget_tree(struct cache *cache, const char *key,
                          uint64_t *listings, uint64_t *records);

/*
 * Drop the stored listings MAX_AGE or more seconds old (and unreadable
 * ones): nothing uses them any more, since a listing is only served while
 * younger than dir_ttl. Called at mount, so that the index does not keep
 * every directory ever listed. *removed gets how many went. 0, ENOMEM or
 * the index's errno (what was dropped before a failure stays dropped).
 */
int metacache_prune_listings(struct cache *cache, double max_age, uint64_t *removed);

#endif /* S3CFS_METACACHE_H */
