/*
 * tier.h - the shared cache tier: a second bucket, close to a cluster's
 * nodes, that holds blocks of the origin's objects so that each byte
 * leaves the origin once per cluster rather than once per node
 * (-o shared_cache=BUCKET[:PREFIX]).
 *
 * The reader asks the tier for a block its local cache misses
 * (tier_get_block) before it asks the origin; a block fetched from the
 * origin is offered to the tier (tier_offer_block) once it is in the
 * local cache, and written there in the background by TIER_WRITERS
 * threads, which read it back from the local cache (verified). The queue
 * holds references, not bytes (a block evicted meanwhile is not written:
 * counted as dropped), at most TIER_QUEUE_BLOCKS of them: past that,
 * offers are dropped too, so a slow tier never holds memory or a reader.
 * Memory: one block buffer per writer, ~100 bytes per queued block.
 *
 * Blocks are named and framed by tier_format.h: by origin, key, ETag and
 * block size, with a checksum. The tier is not trusted: a block that is
 * not whole, not the one asked for, or does not match its checksum is
 * counted as bad and the reader goes to the origin; the write of the
 * block it fetches replaces the damaged one. Writes carry
 * If-None-Match: * so that of several nodes writing one block the first
 * wins and the others learn it (counted); a server that ignores the
 * header (s3rver) lets the last win, with the same bytes, and one that
 * refuses it (Swift: 501) gets plain writes from then on.
 *
 * A tier that fails (refused, down, answering errors, slower than its
 * request timeout) is skipped, reads and writes, for skip_seconds,
 * doubling while it keeps failing up to TIER_SKIP_MAX: it can never fail
 * a read, only cost the time of the request that found it failing.
 * Meanwhile a writer thread sends a probe (a HEAD of one key; a small
 * PUT of it when a write's failure began the skip) every probe_seconds;
 * the first the tier answers ends the skip, so a stall of a few seconds
 * does not send the next 10 s of reads to the origin. A request that
 * timed out while the tier answered another of its kind (a read, a
 * write) after it was sent is a busy tier's slow answer, not a failing
 * tier: it is counted (an error) and the tier is not skipped. Lease
 * writes, deletes and block writes count as failures as reads do, so a
 * tier that answers reads and stalls writes is skipped too. No lock is
 * held across a request: readers that meet a stalling tier at once each
 * wait for their own request, at the same time.
 *
 * Thread-safe. The tier's S3 client is the caller's and must outlive it.
 */
#ifndef S3CFS_TIER_H
#define S3CFS_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/cache.h"
#include "s3/s3.h"

#define TIER_WRITERS 4
#define TIER_QUEUE_BLOCKS 65536
#define TIER_SKIP_SECONDS 10.0
#define TIER_SKIP_MAX 300.0
#define TIER_PROBE_SECONDS 1.0
#define TIER_DAMAGED_MAX 64   /* damaged blocks remembered for replacing */

struct tier_conf {
    struct s3_client *s3;        /* the tier bucket's client, borrowed */
    const char *prefix;          /* "" or "a/b/": where blocks go in it */
    const char *origin;          /* the origin, "ENDPOINT BUCKET" */
    struct cache *cache;         /* the local cache, where offered blocks
                                    are read back from */
    uint32_t block_size;         /* the cache's */
    uint64_t queue_blocks;       /* blocks waiting to be written, at most;
                                    0: TIER_QUEUE_BLOCKS */
    double skip_seconds;         /* first pause after a failure; 0:
                                    TIER_SKIP_SECONDS */
    double probe_seconds;        /* between probes while skipped; 0:
                                    TIER_PROBE_SECONDS; < 0: none */
};

/* How this tier's server lets nodes lease blocks (found out once, by a
 * probe: tier_claim_blocks()). */
enum tier_lease_mode {
    TIER_LEASES_UNKNOWN = -1,    /* not probed yet */
    TIER_LEASES_CONDITIONAL = 1, /* If-None-Match: * on writes (and
                                    If-Match, where it has it) */
    TIER_LEASES_READ_BACK = 2,   /* no conditional writes: written, then
                                    read back after a pause */
};

struct tier_stats {
    uint64_t hits;               /* blocks read from the tier, verified */
    uint64_t hit_bytes;
    uint64_t misses;             /* blocks the tier did not have */
    uint64_t bad;                /* blocks that did not verify */
    uint64_t errors;             /* requests that failed (then skipped) */
    uint64_t skipped;            /* blocks not asked for: tier skipped */
    uint64_t puts;               /* blocks written */
    uint64_t put_bytes;
    uint64_t put_exists;         /* written first by another node */
    uint64_t put_dropped;        /* not written: queue full, tier skipped,
                                    evicted here before its turn */
    uint64_t leases;             /* block groups claimed here */
    uint64_t lease_waits;        /* blocks waited for (claimed elsewhere) */
    uint64_t lease_waits_met;    /* of which came in time */
    int lease_mode;              /* enum tier_lease_mode */
    uint64_t queued_bytes;       /* waiting to be written (or being
                                    written), now */
    bool skipping;               /* the tier is skipped now */
    struct s3_stats s3;          /* the tier client's requests */
};

struct tier;

/* 0, ENOMEM, EINVAL (no client, no origin, block size 0), or a
 * pthread errno. */
int tier_create(const struct tier_conf *conf, struct tier **out);

/* Stop the writers (the block being written finishes, the queue is
 * dropped: the tier is a cache) and free. Safe twice. */
void tier_destroy(struct tier **tier);

/*
 * Block INDEX of version ETAG of KEY, LEN bytes (the block's length in
 * the object), into DATA. SCRATCH is the caller's buffer of LEN +
 * TIER_HEADER_LEN bytes (tier_format.h). 0; ENOENT when the tier has no
 * such block, or only part of it, or answers with another range (a
 * server that writes in place shows a block being written part way), or
 * is being skipped; EBADMSG when what it has does not verify; the
 * client's errno when the request failed (the tier is skipped from now,
 * unless it timed out while the tier answered others).
 */
int tier_get_block(struct tier *tier, const char *key, const char *etag,
                   uint64_t index, uint32_t len, char *scratch,
                   const char **data);

/*
 * Leases, so that nodes that miss the same blocks at the same moment do
 * not all fetch them from the origin. Blocks are leased in groups of
 * TIER_LEASE_BLOCKS: before fetching blocks FIRST..LAST (one run) from
 * the origin, a node claims the group of FIRST, and of LAST if that is
 * another, each with a conditional write (If-None-Match: *) of a small
 * object that says which blocks of the group it fetches and until when
 * (TIER_LEASE_SECONDS).
 *
 * Where the server has no conditional writes (it ignores the header, as
 * s3rver does, or refuses it, as Swift does), a lease is read first (one
 * that runs and is another node's is waited on), written plainly, and
 * read back after a pause as long as the write took: the node whose
 * lease is there holds it. Two nodes that miss the group at once agree
 * on the last write, unless one write lands after the other node read
 * back (writes that take more than twice as long as each other): then
 * both fetch the group, as without leases. A lease never changes what
 * a read returns, only who fetches from the origin.
 *
 * READING_ON: the run is read-ahead, and the node will go on to the
 * rest of the group: its lease says so, and a node that misses a block
 * there waits a while (TIER_LEASE_INTENT_WAIT) for the lease to take it
 * in rather than fetching it too; so does a node that misses a block
 * before such a lease (that node's read of it may claim after its
 * read-ahead).
 *
 * TIER_FETCH: fetch blocks FIRST..*covered from the origin, then ask the
 * tier again for the rest of the run (this node claimed FIRST's group,
 * or another node's lease there is on other blocks: *covered stops
 * before blocks another node's lease covers, and before a next group
 * where another node's lease runs; or the tier is skipped: *covered is
 * LAST; or the claim failed and the tier is not skipped, a busy tier's
 * timeout: *covered is FIRST). TIER_AWAIT: another node's lease covers
 * blocks FIRST..*covered (up to *until, monotonic seconds): wait for them with
 * tier_await_block(). A lease past its time is taken over: where the
 * server has If-Match on writes too, by a write over that very lease
 * (its ETag), so that of nodes taking it over at once one wins and the
 * others wait for it; without (If-None-Match alone), by a write read
 * back, as above: two nodes may then both fetch the group (at most a
 * duplicate fetch, never other bytes or a wait past the lease).
 */
#define TIER_LEASE_BLOCKS 8
#define TIER_LEASE_SECONDS 10.0
#define TIER_LEASE_INTENT_WAIT 1.0

enum tier_claim { TIER_FETCH, TIER_AWAIT };

enum tier_claim tier_claim_blocks(struct tier *tier, const char *key,
                                  const char *etag, uint64_t first,
                                  uint64_t last, bool reading_on,
                                  uint64_t *covered, double *until);

/* tier_get_block(), asked again (at growing intervals) while the block
 * is not there, until UNTIL (monotonic seconds), or until the lease it
 * is waited for under no longer covers it (looked at every 0.5 s: given
 * back by its node, which dropped the block, taken over for other
 * blocks, gone): 0 with the block, or the last answer (ENOENT: it did
 * not come; claim it again). */
int tier_await_block(struct tier *tier, const char *key, const char *etag,
                     uint64_t index, uint32_t len, char *scratch,
                     const char **data, double until);

/* Offer block INDEX of version ETAG of KEY, cached in OBJECT (a
 * reference is taken while it waits): written to the tier later, if it
 * is still cached then. A block that does not get there (the queue
 * full, evicted first, its write failed) and that this node's lease
 * covers has the lease given back (written as past its time, by a
 * writer thread), so that nodes waiting for it claim it at once. */
void tier_offer_block(struct tier *tier, struct cache_object *object,
                      const char *key, const char *etag, uint64_t index);

/* Blocks FIRST..FIRST+COUNT-1 of version ETAG of KEY, which this node
 * set out to fetch from the origin, will not be offered: the fetch
 * failed (refused, timed out, the bytes not cached here). Where this
 * node's running lease covers one, the lease is given back as for a
 * dropped offer (written as past its time, by a writer thread), so that
 * nodes waiting for them claim them at once rather than when the lease
 * runs out. */
void tier_forgo_blocks(struct tier *tier, const char *key, const char *etag,
                       uint64_t first, uint64_t count);

/* Wait until nothing is queued or being written, or SECONDS have passed
 * (0: no limit): whether the queue emptied. At unmount, a node's last
 * blocks go to the tier for the next node, within a bound. */
bool tier_flush(struct tier *tier, double seconds);

void tier_get_stats(struct tier *tier, struct tier_stats *out);

#endif /* S3CFS_TIER_H */
