/*
 * tier_setup.h - -o shared_cache made real: the tier's bucket client,
 * built from the mount options, and the tier (tier.h) over it.
 *
 * The tier's endpoint, region and credentials are its own options
 * (shared_cache_endpoint, shared_cache_region, shared_cache_profile), each
 * falling back to the mounted bucket's. Its requests have a short
 * deadline (TIER_SETUP_TIMEOUT seconds plus the time of the bytes at
 * TIER_SETUP_MIN_RATE) and one retry: a slow tier costs a read little
 * before it is skipped (a tier is near the nodes, or it is no use).
 *
 * At mount the tier's bucket is checked like the origin's: a server that
 * answers that the bucket is missing or refuses the credentials fails the
 * mount (a mistake in the options), a tier that cannot be reached is
 * reported and skipped (a node must boot while the tier is down).
 */
#ifndef S3CFS_TIER_SETUP_H
#define S3CFS_TIER_SETUP_H

#include <stddef.h>
#include <stdint.h>

#include "cmd/options.h"
#include "creds/awsconfig.h"
#include "creds/credentials.h"
#include "tier/tier.h"

#define TIER_SETUP_TIMEOUT 5.0
#define TIER_SETUP_MIN_RATE (8u << 20)        /* bytes/s */
#define TIER_SETUP_CONNECTIONS 16

struct tier_setup;

/*
 * The client of OPTS' shared cache (*out NULL when OPTS names none).
 * ORIGIN_AWS and ORIGIN_CREDS (may be NULL: unsigned) are the mounted
 * bucket's, borrowed for as long as the shared cache lives when its own
 * are not given. 0, or an errno with one sentence in ERRBUF.
 */
int tier_setup_open(const struct options *opts,
                    const struct awsconfig *origin_aws,
                    struct credentials *origin_creds, const char *ca_bundle,
                    struct tier_setup **out, char *errbuf, size_t errlen);

/* Start the tier over it, for the local cache CACHE (after the daemon
 * forked: it starts threads). 0 or an errno. */
int tier_setup_start(struct tier_setup *shared, struct cache *cache);

/* The tier (NULL before tier_setup_start or without a shared cache). */
struct tier *tier_setup_tier(struct tier_setup *shared);

/* Stop the tier and free everything; safe with NULL and twice. The
 * blocks still waiting to be written get TIER_SETUP_FLUSH_SECONDS at
 * most (the next node's bytes; a node being torn down cannot wait
 * long). */
#define TIER_SETUP_FLUSH_SECONDS 10.0
void tier_setup_close(struct tier_setup **shared);

#endif /* S3CFS_TIER_SETUP_H */
