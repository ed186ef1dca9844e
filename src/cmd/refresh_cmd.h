/*
 * refresh_cmd.h - `s3cachefs refresh PATH...`: a running mount forgets
 * what it knows of each PATH (a directory: everything under it, at any
 * depth; a file: its attributes and its directory's listing), in memory,
 * in the cache index and in the kernel, so that the next use lists and
 * asks the bucket again. The "told otherwise" of -o trust, whose
 * listings and attributes are otherwise kept until unmounted and across
 * remounts; on paths outside the trust it only makes the next listing
 * come sooner. Asked of the daemon through an extended attribute of the
 * path (fs.h: FS_REFRESH_XATTR), one path at a time; one line per path
 * says what was forgotten. Nothing is sent to the bucket by the command.
 *
 * A bucket may be called "refresh": `s3cachefs refresh X ...` is this
 * command when X is inside a mounted s3cachefs, when the arguments hold
 * -h or --help, or when nothing follows the word.
 *
 * Exit status: 0 every path done; 1 a path failed (not found, outside an
 * s3cachefs mount, a daemon that does not answer or does not know the
 * request); 2 bad usage.
 */
#ifndef S3CFS_REFRESH_CMD_H
#define S3CFS_REFRESH_CMD_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs refresh ...` rather than the mount of a
 * bucket called "refresh" (see above). May read /proc/self/mountinfo. */
bool refresh_cmd_requested(int argc, char **argv);

/* Run it; returns the exit status (see above). */
int refresh_cmd_main(int argc, char **argv);

#endif /* S3CFS_REFRESH_CMD_H */
