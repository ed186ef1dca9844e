/*
 * tier_prune.h - what `s3cachefs shared-cache prune` deletes from a
 * shared cache tier: pure bookkeeping, no I/O (tier_cmd.c lists
 * and deletes).
 *
 * The unit of pruning is a version: every block of one version of one
 * origin object sits under one directory of the tier (tier_format.h), and
 * a version is kept or dropped whole (a half-pruned version would cost its
 * next reader as much as a pruned one, with the rest still paid for).
 * A version's age is that of its newest block: S3 keeps no access times,
 * so "written long ago" is the best a listing tells (a lifecycle rule on
 * the tier's bucket ages objects the same way).
 *
 * Choosing: first every version written more than max_age ago, then,
 * while what is left is over max_bytes, the oldest versions left.
 */
#ifndef S3CFS_TIER_PRUNE_H
#define S3CFS_TIER_PRUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tier/tier_format.h"

struct tier_prune_version {
    char hex[TIER_VERSION_HEX + 1];  /* the version's directory */
    uint64_t bytes;                  /* of its objects */
    uint64_t objects;
    double newest;                   /* Unix seconds, its newest object */
    bool chosen;                     /* to be deleted */
};

struct tier_prune {
    struct tier_prune_version **versions;  /* in the order first seen
                                              (oldest first after a
                                              choice by size) */
    size_t count, cap;
    void *index;                     /* tsearch tree of them, by hex */
    uint64_t ignored;                /* keys under the root that are not
                                        blocks of a version: never deleted */
};

/*
 * Count the object KEY (the part after PREFIX TIER_ROOT, e.g.
 * "3fa9.../1048576-7", or a lease "3fa9.../lease-1048576-0"), SIZE bytes, last modified at MTIME (Unix seconds).
 * 0 or ENOMEM; a key of another shape is counted in ->ignored.
 */
int tier_prune_add(struct tier_prune *prune, const char *key, uint64_t size,
                   double mtime);

/* Mark what goes at time NOW: versions older than MAX_AGE seconds (0: no
 * age limit), then the oldest until the rest is at most MAX_BYTES (0: no
 * size limit). */
void tier_prune_choose(struct tier_prune *prune, double now, double max_age,
                       uint64_t max_bytes);

/* Whether KEY (as for tier_prune_add) belongs to a chosen version. */
bool tier_prune_chosen(const struct tier_prune *prune, const char *key);

void tier_prune_free(struct tier_prune *prune);

#endif /* S3CFS_TIER_PRUNE_H */
