/*
 * warm_cmd.h - `s3cachefs warm PATH... [--from FILE|-] [--check]
 * [--evict] [--pin|--unpin] [--jobs N] [--json]`: the cache of a running
 * mount filled, measured or emptied for files and whole trees, asked of
 * its daemon one file at a time through an extended attribute of the
 * file (fs.h: FS_WARM_XATTR and its siblings; the answers are the text of
 * warm_text.h).
 *
 *   warm     every block of each file not cached yet is fetched by the
 *            daemon, with the mount's parallelism, into its cache (not
 *            through the page cache of this process); blocks cached are
 *            skipped, each block is fetched once. --jobs files at a time
 *            (4). A progress bar on a terminal, a one-line summary.
 *   --check  how much of each file is cached (nothing is fetched, no
 *            request is sent to the bucket for it).
 *   --evict  its cached blocks dropped (not data waiting for an upload).
 *   --pin    warmed and kept through eviction, within a share of the
 *            cache; --unpin gives it back to eviction.
 *
 * Directories are walked (not across other mounts; symbolic links in
 * them are not followed; one named as PATH is). --from FILE reads paths one a line (blank lines and
 * "#" comments skipped; "-" is stdin), relative to the current directory
 * or absolute. SIGINT, SIGTERM and SIGHUP stop it: the files under way
 * are answered at once with what was done (the cache keeps whole blocks
 * only), the summary says "interrupted", and it exits 1.
 *
 * A bucket may be called "warm": `s3cachefs warm X ...` is this command
 * when X is inside a mounted s3cachefs, when the arguments hold one of
 * its own options, or when nothing follows the word.
 *
 * Exit status: 0 every file done; 1 a path failed (not found, not a
 * regular file, outside an s3cachefs mount, a fetch that failed, a file
 * that did not stay cached, a pin beyond the share) or the run was
 * interrupted (the others are still done); 2 bad usage.
 */
#ifndef S3CFS_WARM_CMD_H
#define S3CFS_WARM_CMD_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs warm ...` rather than the mount of a bucket
 * called "warm" (see above). May read /proc/self/mountinfo. */
bool warm_cmd_requested(int argc, char **argv);

/* Run it; returns the exit status (see above). */
int warm_cmd_main(int argc, char **argv);

#endif /* S3CFS_WARM_CMD_H */
