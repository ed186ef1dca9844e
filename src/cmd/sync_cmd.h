/*
 * sync_cmd.h - `s3cachefs sync MOUNTPOINT` and `s3cachefs pending
 * MOUNTPOINT [--drop PATH]`: the uploads of a running mount, asked of its
 * daemon through the mount root (fs.h, FS_SYNC_XATTR, FS_PENDING_XATTR,
 * FS_DROP_XATTR; the answers are the text of sync_text.h).
 *
 *   sync     returns once everything written so far through the mount is
 *            in the bucket: every file pending when it starts, each as
 *            far as its last close (bytes of a descriptor still open and
 *            not closed are not waited for; such a file is named). Prints
 *            each file waited for (size, path) and a summary (count,
 *            bytes, seconds). A file whose upload fails makes it exit 1,
 *            naming the file and the error (the file stays journaled and
 *            is retried). --timeout SECONDS, SIGINT, SIGTERM and SIGHUP
 *            end the wait (the daemon answers at once with what it has:
 *            exit 1, the files not in the bucket yet named). What a
 *            spot-termination handler runs before the node goes.
 *   pending  what the journal and the staging area hold: per file its
 *            state (open: written, not closed; waiting; uploading;
 *            failed, with the last error and the retries), size, age
 *            since closed and path; --json. With --drop PATH, gives up
 *            that file's pending data (asks first on a terminal unless
 *            --yes): the daemon logs it and removes its journal entry and
 *            staged data; the file leaves the mount as after an unlink
 *            that never reached the bucket.
 *
 * A bucket may be called "sync" or "pending", and mount.fuse3 runs
 * `s3cachefs BUCKET MOUNTPOINT -o ...` for an fstab line: `s3cachefs sync
 * X ...` is this command only when X is a mounted s3cachefs (its type in
 * /proc/self/mountinfo is fuse.s3cachefs, or its root answers
 * user.s3cachefs.pid), when the arguments hold one of this command's own
 * options (-h, --help, --json, --timeout, --drop, --yes: a mount refuses
 * them), or when nothing follows the word. Otherwise it is the mount of
 * that bucket, as before (main.c adds a line saying so if that fails).
 *
 * Exit status: 0 done; 1 failure (not an s3cachefs mount, its daemon gone,
 * stuck or too old to know the request, a file that could not be
 * uploaded, the wait interrupted, a drop refused); 2 bad usage.
 */
#ifndef S3CFS_SYNC_CMD_H
#define S3CFS_SYNC_CMD_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs sync|pending ...` rather than the mount of a
 * bucket of that name (see above). May read /proc/self/mountinfo and ask
 * a FUSE mount's root for its pid (5 seconds at most). */
bool sync_cmd_requested(int argc, char **argv);

/* Run it; returns the exit status (see above). */
int sync_cmd_main(int argc, char **argv);

#endif /* S3CFS_SYNC_CMD_H */
