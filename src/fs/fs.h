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

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <fuse_lowlevel.h>

#include "cache/cache.h"
#include "ctl/warm_text.h"
#include "s3/s3.h"
#include "tier/tier.h"

struct access_log;

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
    size_t listing_memory;    /* inode_table_set_listing_budget(); 0: no bound */
    unsigned connections;     /* worker threads for parallel requests */
    struct cache *cache;      /* the block cache; stays the caller's */
    struct journal *journal;  /* pending uploads; NULL: read-only mount */
    bool writeback;           /* close() does not wait for the upload */
    uint64_t multipart_threshold; /* larger files go multipart */
    uint64_t part_size;       /* smallest multipart part */
    struct access_log *access_log; /* -o access_log; NULL: none */
    /* -o trust: directories of the mount ("a/b/"; "": everything, as
     * options.h has them) whose listings and attributes never change:
     * trusted until unmount and, stored in the cache index, across
     * remounts. Copied, as keys under root_key. */
    const char *const *trusted;
    size_t trusted_count;
    /* -o no_headers: directories (the same form) whose objects carry no
     * s3fs headers: a listing's attributes are all there is to know, and
     * no file or marker there is HEADed for them. Copied, as keys. */
    const char *const *headerless;
    size_t headerless_count;
    struct tier *tier;        /* -o shared_cache (tier.h); NULL: none.
                                 Stays the caller's */
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
    uint64_t listing_bytes;   /* memory the directories' listings take */
    uint64_t listings_dropped; /* listings let go for listing_memory */
    uint64_t bytes_written;   /* by applications */
    uint64_t uploads_pending;
    uint64_t uploads_completed;
    uint64_t upload_failures;
    uint64_t upload_retries;
    uint64_t copies_on_write;
    bool tier_on;             /* a shared cache tier is configured: */
    struct tier_stats tier;   /* its counters */
};

/* The extended attribute of the mount root that holds the counters. */
#define FS_STATS_XATTR "user.s3cachefs.stats"
/* the daemon's pid, on the mount root (for the unmount helper, unmount_cmd.h) */
#define FS_PID_XATTR "user.s3cachefs.pid"
/* the cache directory, on the mount root (where the daemon leaves its
 * exit report for the unmount helper, unmount_cmd.h) */
#define FS_CACHE_XATTR "user.s3cachefs.cache"
/* Requests of `s3cachefs sync` and `s3cachefs pending` (sync_cmd.h) on
 * the mount root, not listed by listxattr (a copy of the root's
 * attributes must not run them): reading SYNC uploads every pending file
 * and answers when done (fs_sync_text), reading PENDING lists them
 * (fs_pending_text), setting DROP to a path gives its pending data up
 * (fs_drop). The answers are the text of sync_text.h. */
#define FS_SYNC_XATTR "user.s3cachefs.sync"
#define FS_PENDING_XATTR "user.s3cachefs.pending"
#define FS_DROP_XATTR "user.s3cachefs.drop"

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
 * Entries for readdirplus: for entries INDEX..INDEX+COUNT-1 fetch what is
 * missing (object headers, in parallel) and take one inode reference each
 * (not for "." and ".."); OUT[i] receives them. A file whose headers are
 * not known and that is too large to be anything but a regular file gets
 * no HEAD and no reference: OUT[i].ino is 0 (the kernel adds the name
 * with its type, attr.st_mode's S_IFREG, and looks it up when someone
 * stats it) and attr.st_ino a placeholder. The caller returns references
 * it could not pass to the kernel with fs_forget() (none for ino 0).
 */
int fs_dir_entries_plus(struct fs *fs, struct fs_dir *dir, size_t index,
                        size_t count, struct fs_entry *out);

void fs_releasedir(struct fs *fs, struct fs_dir *dir);

/* Open a file. Writing (or O_TRUNC) stages it (EROFS on a read-only
 * mount). *keep_cache says whether the kernel's page cache still holds
 * this version. EISDIR, ENOENT... */
int fs_open(struct fs *fs, fuse_ino_t ino, int flags, struct fs_file **out,
            bool *keep_cache);

int fs_read(struct fs *fs, struct fs_file *file, uint64_t offset, size_t size,
            char *buf, size_t *got);

/* fs_read() into the pipe PIPE_WRITE without a copy (reader_read_pipe()):
 * EOPNOTSUPP for staged data, and reader_read_pipe()'s errno values;
 * after an error the pipe holds anything, and EOPNOTSUPP, ENOSPC,
 * ENOBUFS, EAGAIN, ENOENT and ESTALE ask for fs_read() instead (which
 * also reads a file unlinked or replaced while open). The cache blocks
 * the pipe holds pages of are in HOLDS, to release once the answer has
 * left or the pipe is discarded (cache_holds_release()). */
int fs_read_pipe(struct fs *fs, struct fs_file *file, uint64_t offset,
                 size_t size, int pipe_write, struct cache_holds *holds,
                 size_t *got);

void fs_release(struct fs *fs, struct fs_file *file);

/* The target of symlink INO, malloc'd into *target. EINVAL if INO is not a
 * symlink. */
int fs_readlink(struct fs *fs, fuse_ino_t ino, char **target);

int fs_statfs(struct fs *fs, struct statvfs *out);

/* ---------------------------------------------- changes (fs_write.c)
 * All return EROFS on a read-only mount. */

/* Create and open NAME in PARENT (mode, owner: the caller's). Fills the
 * entry (one kernel reference) and the open file. */
int fs_create_file(struct fs *fs, fuse_ino_t parent, const char *name,
                   mode_t mode, int flags, uid_t uid, gid_t gid,
                   struct fs_entry *entry, struct fs_file **out);

/* Write to a file opened for writing: EBADF otherwise, ENOSPC when the
 * cache disk is full, EFBIG past 5 TiB. */
int fs_write(struct fs *fs, struct fs_file *file, uint64_t offset,
             const char *buf, size_t size);

/* close() of one descriptor: the upload (default mode) or its journal
 * entry (writeback); the upload's errno when it fails. */
int fs_flush(struct fs *fs, struct fs_file *file);

/* fsync(): returns once the file is in the bucket. */
int fs_fsync(struct fs *fs, struct fs_file *file);

int fs_mkdir(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
             uid_t uid, gid_t gid, struct fs_entry *entry);
/* ENOTEMPTY, ENOTDIR... */
int fs_rmdir(struct fs *fs, fuse_ino_t parent, const char *name);
int fs_unlink(struct fs *fs, fuse_ino_t parent, const char *name);
int fs_symlink(struct fs *fs, const char *target, fuse_ino_t parent,
               const char *name, uid_t uid, gid_t gid, struct fs_entry *entry);
/* mknod(2): a FIFO, socket, character or block device (or a regular
 * file), stored as s3fs stores them: an empty object whose
 * x-amz-meta-mode has the file type, and a device's number in
 * x-amz-meta-rdev. EINVAL for another type. */
int fs_mknod(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
             dev_t rdev, uid_t uid, gid_t gid, struct fs_entry *entry);
/* Hard links: EPERM, always, or names_check()'s errno for a NAME that
 * could not be made at all (EILSEQ...). */
int fs_link(struct fs *fs, const char *name);

/* chmod, chown, utimens, truncate (TO_SET: FUSE_SET_ATTR_* bits; FILE the
 * open file for ftruncate, or NULL). The new attributes go to *out. */
int fs_setattr(struct fs *fs, fuse_ino_t ino, const struct stat *want, int to_set,
               struct fs_file *file, struct stat *out, double *timeout);

/* rename(2) with RENAME_NOREPLACE (EEXIST); other flags: EINVAL. A
 * directory is moved key by key: not atomic. */
int fs_rename(struct fs *fs, fuse_ino_t parent, const char *name,
              fuse_ino_t new_parent, const char *new_name, unsigned flags);

/* At mount: queue the uploads the journal holds (a crash interrupted
 * them). */
int fs_recover(struct fs *fs);

/* At unmount: upload everything pending and wait; the number of files
 * that could not be uploaded (they stay journaled) is returned. */
uint64_t fs_drain(struct fs *fs);

/* ------------------------------ sync, pending, drop (fs_sync.c) */

/*
 * `s3cachefs sync`: upload every file pending now and wait (writer_sync():
 * a file open for writing is waited for as far as its last close), then
 * the report as the text of sync_text.h, at most CAP bytes (the summary
 * always, files while they fit, failures first): malloc'd into *TEXT
 * (NUL-terminated, *LEN bytes without it). Ends early, reporting what is
 * left as waiting, once *INTERRUPTED is true and fs_sync_wake() was
 * called. The calling thread only waits. 0, ENOMEM, ERANGE (CAP too small
 * for the summary).
 */
int fs_sync_text(struct fs *fs, const atomic_bool *interrupted, size_t cap,
                 char **text, size_t *len);

/* Make the syncs under way look at their INTERRUPTED flag (not with a
 * lock of the fs layer or the writer held). */
void fs_sync_wake(struct fs *fs);

/* `s3cachefs pending`: the pending files as the text of sync_text.h, as
 * fs_sync_text() gives it (failures first). */
int fs_pending_text(struct fs *fs, size_t cap, char **text, size_t *len);

/*
 * `s3cachefs pending --drop PATH`: give up the pending data of the file
 * at PATH (PATH_LEN bytes, under the mount root, as fs_pending_text()
 * names it, not NUL-terminated): its journal entry and staged data go,
 * logged, and the file leaves the mount as after an unlink that never
 * reached the bucket (nothing is deleted there: an older object under its
 * key shows again with the next listing). ENOENT: nothing staged there;
 * EBUSY: open for writing, or an upload of it under way; EALREADY:
 * uploaded meanwhile; EINVAL: not a file's path; EROFS; the journal's
 * errno (nothing changed then).
 */
int fs_drop(struct fs *fs, const char *path, size_t path_len);

/* ------------------------------------------------ warm (fs_warm.c) */

/* What `s3cachefs warm` asks of one file (fuse_ops.c: the attribute
 * names below). */
enum fs_warm_op {
    FS_WARM_FETCH,            /* fetch what is not cached */
    FS_WARM_CHECK,            /* how much is cached; no request */
    FS_WARM_EVICT,            /* drop its cached blocks */
    FS_WARM_PIN,              /* fetch, and keep through eviction */
    FS_WARM_UNPIN,            /* let eviction take it again */
};

/*
 * OP on the file INO: the answer in *OUT (warm_text.h; failures of the
 * fetch itself are an answer with status "failed" and their errno). A
 * fetch revalidates the file's attributes past attr_ttl, then fetches
 * every missing block with the mount's parallelism (reader_warm()); it
 * returns early, status "interrupted", once *INTERRUPTED (may be NULL)
 * is true (polled every 100 ms). A check asks nothing of the bucket. A
 * file with data not uploaded yet answers "staged" and is left alone.
 * Returns ENOENT (the inode is gone), EISDIR, EINVAL (not a regular
 * file), ENOMEM, or the revalidation's errno (ENOENT when the object is
 * gone from the bucket).
 */
int fs_warm(struct fs *fs, fuse_ino_t ino, enum fs_warm_op op,
            const atomic_bool *interrupted, struct warm_text_answer *out);

/* Requests of `s3cachefs warm` (warm_cmd.h) on a regular file, not
 * listed by listxattr: reading one does OP and answers with the text of
 * warm_text.h. */
#define FS_WARM_XATTR "user.s3cachefs.warm"
#define FS_CHECK_XATTR "user.s3cachefs.check"
#define FS_EVICT_XATTR "user.s3cachefs.evict"
#define FS_PIN_XATTR "user.s3cachefs.pin"
#define FS_UNPIN_XATTR "user.s3cachefs.unpin"

/* What fs_refresh() forgot. */
struct fs_refresh_report {
    uint64_t inodes;            /* inodes at or under the path */
    uint64_t listings;          /* listings dropped from memory */
    uint64_t stored_listings;   /* ... and from the cache index */
    uint64_t stored_records;    /* attribute records dropped from the index */
    uint64_t kernel_entries;    /* entries the kernel was told to forget */
};

/* Tell the kernel to forget the entry NAME of directory PARENT (PARENT
 * not 0), or the attributes of inode INO (PARENT 0). Called with no lock
 * held. */
typedef void (*fs_refresh_inval_fn)(void *arg, fuse_ino_t parent,
                                    const char *name, fuse_ino_t ino);

/*
 * `s3cachefs refresh` of inode INO (fs_refresh.c): what this mount
 * knows of it and, for a directory, of everything under it (listings and
 * attributes, in memory and in the cache index) is forgotten, and the
 * kernel told through INVAL (may be NULL) to forget the entries it holds
 * there; the next use asks the bucket again, also under -o trust. A
 * file's parent's listing goes too. Staged files keep their attributes.
 * Returns 0, ENOENT (the inode is gone), ENOMEM or the index's errno.
 */
int fs_refresh(struct fs *fs, fuse_ino_t ino, fs_refresh_inval_fn inval,
               void *arg, struct fs_refresh_report *out);

/* The request of `s3cachefs refresh` (refresh_cmd.h) on a file or
 * directory, not listed by listxattr: reading it runs fs_refresh() and
 * answers with "name value" lines (refresh 1, then the counts of struct
 * fs_refresh_report: inodes, listings, stored_listings, stored_records,
 * kernel_entries). */
#define FS_REFRESH_XATTR "user.s3cachefs.refresh"

/* The cache directory's absolute path (owned by the cache). */
const char *fs_cache_dir(const struct fs *fs);

/*
 * The counters as text, one "name value" pair per line (the format is
 * documented in s3cachefs(1)); malloc'd into *text. Returns 0 or ENOMEM.
 */
int fs_stats_text(struct fs *fs, char **text);

#endif /* S3CFS_FS_H */
