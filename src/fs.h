/*
 * fs.h - the filesystem layer: POSIX semantics on top of the bucket.
 *
 * The FUSE callbacks (fuse_ops.c) decode requests and call these functions,
 * which know nothing of FUSE's reply mechanics: they return 0 or a positive
 * errno and fill plain structs. Below, they use the inode table (inode.h),
 * the S3 client (s3.h) and the reader (reader.h). That split lets tests and
 * tools drive the filesystem without a kernel mount.
 *
 * Consistency: attributes are trusted for attr_ttl seconds and directory
 * listings for dir_ttl; open() revalidates an object whose attributes are
 * older than attr_ttl (close-to-open), and data is always read for the
 * ETag seen at open.
 *
 * Directories are key prefixes ("a/b/") and "a/b/" marker objects. When a
 * name is both an object and a prefix, the directory wins (the object is
 * hidden, with one log line), the same way in listings and lookups.
 */
#ifndef S3CFS_FS_H
#define S3CFS_FS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <fuse_lowlevel.h>

#include "cache.h"
#include "s3.h"

struct fs_conf {
    const char *root_key;     /* "" or "prefix/" */
    uid_t uid;                /* owner when the object has no header */
    gid_t gid;
    bool uid_forced;          /* -o uid given: overrides headers */
    bool gid_forced;
    mode_t file_mode;         /* permission bits for files without header */
    mode_t dir_mode;
    double attr_ttl;
    double dir_ttl;
    uint64_t read_ahead;
    unsigned connections;     /* worker threads for parallel requests */
    struct cache *cache;      /* the block cache; stays the caller's */
};

/* What lookup hands to the kernel: a referenced inode and its attributes. */
struct fs_entry {
    fuse_ino_t ino;           /* 0: negative entry (name does not exist) */
    struct stat attr;
    double attr_timeout;
    double entry_timeout;
};

/* Statistics for the visibility interface. */
struct fs_stats {
    struct s3_stats s3;
    struct cache_stats cache;
    uint64_t bytes_read;      /* returned to readers */
    uint64_t hit_bytes;       /* of which already cached */
    uint64_t direct_bytes;    /* read around a full cache */
    uint64_t inodes;          /* inodes the kernel holds */
};

/* The extended attribute of the mount root that holds the counters. */
#define FS_STATS_XATTR "user.s3cachefs.stats"

struct fs;
struct fs_dir;      /* an open directory: a snapshot of its listing */
struct fs_file;     /* an open file */

/* Create the layer; S3 stays owned by the caller and must outlive it. */
int fs_create(const struct fs_conf *conf, struct s3_client *s3, struct fs **out);
void fs_destroy(struct fs **fs);
void fs_get_stats(struct fs *fs, struct fs_stats *out);

/* Look NAME up in directory PARENT. ENOENT comes back as 0 with
 * out->ino == 0 (a negative entry the kernel may cache), ENOTDIR,
 * ENAMETOOLONG, EIO... */
int fs_lookup(struct fs *fs, fuse_ino_t parent, const char *name,
              struct fs_entry *out);

/* The kernel dropped NLOOKUP references to INO. */
void fs_forget(struct fs *fs, fuse_ino_t ino, uint64_t nlookup);

int fs_getattr(struct fs *fs, fuse_ino_t ino, struct stat *out, double *timeout);

/* Open a directory: lists it unless the listing is fresh. */
int fs_opendir(struct fs *fs, fuse_ino_t ino, struct fs_dir **out);

/* Entries of an open directory: "." and ".." first, then the listing. */
size_t fs_dir_count(const struct fs_dir *dir);

/* Name and (partial) attributes of entry INDEX, for plain readdir. The
 * name stays valid until fs_releasedir(). */
const char *fs_dir_entry(const struct fs *fs, const struct fs_dir *dir,
                         size_t index, struct stat *attr);

/*
 * Full entries for readdirplus: for entries INDEX..INDEX+COUNT-1 fetch what
 * is missing (object headers, in parallel) and take one inode reference
 * each (not for "." and ".."); OUT[i] receives them. The caller returns
 * references it could not pass to the kernel with fs_forget().
 */
int fs_dir_entries_plus(struct fs *fs, struct fs_dir *dir, size_t index,
                        size_t count, struct fs_entry *out);

void fs_releasedir(struct fs *fs, struct fs_dir *dir);

/* Open a file for reading. *keep_cache says whether the kernel's page
 * cache still holds this version. EROFS for writes, EISDIR, ENOENT... */
int fs_open(struct fs *fs, fuse_ino_t ino, int flags, struct fs_file **out,
            bool *keep_cache);

int fs_read(struct fs *fs, struct fs_file *file, uint64_t offset, size_t size,
            char *buf, size_t *got);

void fs_release(struct fs *fs, struct fs_file *file);

/* The target of symlink INO, malloc'd into *target. EINVAL if INO is not a
 * symlink. */
int fs_readlink(struct fs *fs, fuse_ino_t ino, char **target);

int fs_statfs(struct fs *fs, struct statvfs *out);

/*
 * The counters as text, one "name value" pair per line (the format is
 * documented in s3cachefs(1)); malloc'd into *text. Returns 0 or ENOMEM.
 */
int fs_stats_text(struct fs *fs, char **text);

#endif /* S3CFS_FS_H */
