/*
 * tier_cmd.h - `s3cachefs shared-cache prune BUCKET[:PREFIX]`:
 * delete what a shared cache tier (tier.h, -o shared_cache) holds beyond
 * an age or a size, for a cron job or a systemd timer, without a mount.
 *
 *   --older-than AGE   versions whose newest block was written more than
 *                      AGE ago (30d, 12h, 45m, 90s, or seconds)
 *   --max-size SIZE    then the oldest versions, until at most SIZE
 *                      (500G, 2T...) is left
 *   --dry-run          say what would go, delete nothing
 *   --endpoint URL, --region NAME, --profile NAME  where the tier is and
 *                      the credentials for it (as for a mount: the
 *                      environment, then ~/.aws; awsconfig.h)
 *
 * Only objects that are blocks of the tier's layout (tier_format.h) are
 * ever deleted; a version goes whole (tier_prune.h). Nodes reading a
 * version while it is pruned read its missing blocks from the origin.
 *
 * Exit status: 0 done; 1 the listing or a delete failed (what was deleted
 * stays deleted; run it again); 2 bad usage.
 */
#ifndef S3CFS_TIER_CMD_H
#define S3CFS_TIER_CMD_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs shared-cache ...` (the word, then prune,
 * -h or --help, or nothing) rather than the mount of a bucket of that
 * name. */
bool tier_cmd_requested(int argc, char **argv);

/* Run it; returns the exit status. */
int tier_cmd_main(int argc, char **argv);

#endif /* S3CFS_TIER_CMD_H */
