/*
 * shared_cache.h - -o shared_cache made real: the tier's bucket client,
 * built from the mount options, and the tier (tier.h) over it.
 *
 * The tier's endpoint, region and credentials are its own options
 * (shared_cache_endpoint, shared_cache_region, shared_cache_profile), each
 * falling back to the mounted bucket's. Its requests have a short
 * deadline (SHARED_CACHE_TIMEOUT seconds plus the time of the bytes at
 * SHARED_CACHE_MIN_RATE) and one retry: a slow tier costs a read little
 * before it is skipped (a tier is near the nodes, or it is no use).
 *
 * At mount the tier's bucket is checked like the origin's: a server that
 * answers that the bucket is missing or refuses the credentials fails the
 * mount (a mistake in the options), a tier that cannot be reached is
 * reported and skipped (a node must boot while the tier is down).
 */
#ifndef S3CFS_SHARED_CACHE_H
#define S3CFS_SHARED_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cmd/options.h"
#include "creds/awsconfig.h"
#include "creds/credentials.h"
#include "tier/tier.h"

#define SHARED_CACHE_TIMEOUT 5.0
#define SHARED_CACHE_MIN_RATE (8u << 20)        /* bytes/s */
#define SHARED_CACHE_CONNECTIONS 16

struct shared_cache;

/*
 * The client of OPTS' shared cache (*out NULL when OPTS names none).
 * ORIGIN_AWS and ORIGIN_CREDS (may be NULL: unsigned) are the mounted
 * bucket's, borrowed for as long as the shared cache lives when its own
 * are not given. 0, or an errno with one sentence in ERRBUF.
 */
int shared_cache_open(const struct options *opts,
                      const struct awsconfig *origin_aws,
                      struct credentials *origin_creds, const char *ca_bundle,
                      struct shared_cache **out, char *errbuf, size_t errlen);

/* Start the tier over it, for the local cache CACHE (after the daemon
 * forked: it starts threads). 0 or an errno. */
int shared_cache_start(struct shared_cache *shared, struct cache *cache);

/* The tier (NULL before shared_cache_start or without a shared cache). */
struct tier *shared_cache_tier(struct shared_cache *shared);

/* Stop the tier and free everything; safe with NULL and twice. The
 * blocks still waiting to be written get SHARED_CACHE_FLUSH_SECONDS at
 * most (the next node's bytes; a node being torn down cannot wait
 * long). */
#define SHARED_CACHE_FLUSH_SECONDS 10.0
void shared_cache_close(struct shared_cache **shared);

#endif /* S3CFS_SHARED_CACHE_H */
