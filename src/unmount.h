/*
 * unmount.h - `s3cachefs --unmount MOUNTPOINT`: unmount, then wait for
 * the daemon to finish its uploads.
 *
 * The kernel lets a FUSE mount go at once, whatever its daemon still has
 * to do: after `fusermount3 -u /data` or `umount /data` the daemon goes on
 * uploading what is pending (see writer.h, "drain") and only then exits.
 * A node torn down in between would lose those files. This command asks
 * the daemon for its pid (the user.s3cachefs.pid attribute of the mount
 * root) before unmounting, and returns only once that process has exited,
 * so that `s3cachefs --unmount /data && poweroff` is safe. (umount(8)'s
 * per-type helpers cannot do it: for FUSE mounts it looks for
 * /sbin/umount.fuse, shared by every FUSE file system.)
 */
#ifndef S3CFS_UNMOUNT_H
#define S3CFS_UNMOUNT_H

#include <stdbool.h>

/* Whether ARGV is `s3cachefs --unmount ...`. */
bool unmount_requested(int argc, char **argv);

/* Run it: the exit status (0; 1 bad usage or the unmount failed). */
int unmount_main(int argc, char **argv);

#endif /* S3CFS_UNMOUNT_H */
