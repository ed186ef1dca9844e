/*
 * unmount_cmd.h - `s3cachefs --unmount MOUNTPOINT`: unmount, then wait for
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
#ifndef S3CFS_UNMOUNT_CMD_H
#define S3CFS_UNMOUNT_CMD_H

#include <stdbool.h>
#include <stdint.h>

/* Whether ARGV is `s3cachefs --unmount ...`. */
bool unmount_cmd_requested(int argc, char **argv);

/* Run it: the exit status (0; 1 bad usage, the unmount failed, or the
 * daemon left uploads undone or ended without saying). */
int unmount_cmd_main(int argc, char **argv);

/*
 * The daemon's exit report, a file of the cache directory (CACHE/
 * UNMOUNT_REPORT: "uploads_left N"), so that `--unmount` can say what the
 * daemon's exit status says, which only its parent can read. The daemon
 * removes an earlier run's report once it holds the cache's lock
 * (unmount_cmd_report_clear), and writes its own as its last act, after the
 * drain (unmount_cmd_report_write: a temporary file, fsynced, renamed). A
 * daemon killed before that leaves none.
 */
#define UNMOUNT_REPORT "exit-report"

void unmount_cmd_report_clear(const char *cache_dir);

/* LEFT: the files the drain could not upload. 0 or an errno (logged). */
int unmount_cmd_report_write(const char *cache_dir, uint64_t left);

#endif /* S3CFS_UNMOUNT_CMD_H */
