/*
 * stats_cmd.h - `s3cachefs stats MOUNTPOINT [--json] [--watch[=SECONDS]]
 * [--prices=NAME|FILE [--tier-prices=NAME|FILE]]`: what a mount has done
 * since it was mounted, and what its bucket traffic costs.
 *
 * The command reads the counters the daemon gives in the user.s3cachefs.stats
 * attribute of the mount root (fs.h, FS_STATS_XATTR) and prints them as a
 * table (stats_report.h), as one JSON object (--json), or as a line of
 * rates every SECONDS (--watch, until SIGINT or SIGTERM, then exit 0).
 * With --prices it adds the cost of the requests and bytes since the mount
 * and what the cache saved, at the prices of a preset or a file
 * (prices.h); with --tier-prices also the shared cache's traffic (-o
 * shared_cache) at its own prices, and what it saved at the bucket's.
 * It is a client of the daemon, like unmount_cmd.h: no lock, no state,
 * nothing written anywhere but stdout and stderr.
 *
 * A bucket may be called "stats", and mount.fuse3 runs `s3cachefs BUCKET
 * MOUNTPOINT -o ...` for an fstab line, so `s3cachefs stats X ...` is this
 * command only when X is the mount point of an s3cachefs mount (its type
 * in /proc/self/mountinfo is fuse.s3cachefs, or it is a FUSE mount whose
 * root answers user.s3cachefs.pid), when the arguments hold one of this
 * command's options (--json, --watch, --prices, --tier-prices, -h,
 * --help: a mount would refuse them), or when there is nothing after
 * "stats" at all. Otherwise
 * it is the mount of the bucket "stats", as before.
 *
 * The daemon is never waited for without a bound: the attributes are read
 * by a child process, given 5 seconds and then killed (a stopped or stuck
 * daemon leaves a getxattr() blocked until it answers). The mount point itself is
 * not stat()ed before /proc/self/mountinfo says what it is, for the same
 * reason.
 *
 * Exit status: 0 done (and --watch interrupted); 1 not a mount point, not
 * an s3cachefs mount, its daemon gone or not answering, counters that do
 * not parse, a price file that cannot be read or parsed, or output that
 * cannot be written; 2 bad usage (an unknown option, no mount point, a bad
 * --watch interval, a --prices that is neither a preset nor a file).
 */
#ifndef S3CFS_STATS_CMD_H
#define S3CFS_STATS_CMD_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs stats ...` rather than the mount of a bucket
 * named "stats" (see above). May read /proc/self/mountinfo and ask a FUSE
 * mount's root for its pid (5 seconds at most). */
bool stats_cmd_requested(int argc, char **argv);

/* Run it; returns the exit status (see above). */
int stats_cmd_main(int argc, char **argv);

#endif /* S3CFS_STATS_CMD_H */
