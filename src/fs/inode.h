/*
 * inode.h - the table of inodes the kernel knows about.
 *
 * Each inode stands for one key: an object ("a/b.txt", a file or symlink)
 * or a directory prefix ("a/", "" for the bucket root). The table gives
 * each key one inode number for as long as the kernel holds a lookup
 * reference, and keeps per inode what the fs layer learnt from the bucket:
 * attributes, a directory's listing, a symlink's target.
 *
 * Locking: one mutex per table guards every field marked (L) of every
 * inode; take it with inode_table_lock() for short, I/O-free sections only.
 * Keys change with renames: copy one under the lock (inode_key_dup())
 * before using it outside.
 * An inode stays allocated while the kernel references it (nlookup) or a
 * caller has pinned it (inode_get/inode_put), so callers can drop the lock,
 * do network I/O with a copy of the key, and relock.
 */
#ifndef S3CFS_INODE_H
#define S3CFS_INODE_H

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "s3/s3.h"

struct writer_file;
struct inode_patch;

/* The file types; the values are stored in the cache index (metacache). */
enum inode_kind {
    INODE_DIR,
    INODE_FILE,
    INODE_SYMLINK,
    INODE_FIFO,                 /* special files: empty objects whose */
    INODE_SOCKET,               /* x-amz-meta-mode has the type, as */
    INODE_CHARDEV,              /* s3fs writes them (fs_mknod) */
    INODE_BLOCKDEV,
};

/* What we know of an object or directory. */
struct inode_attrs {
    enum inode_kind kind;
    uint64_t size;
    struct timespec mtime;
    struct timespec atime;      /* x-amz-meta-atime; mtime without one */
    struct timespec ctime;      /* x-amz-meta-ctime; mtime without one */
    uint32_t mode;              /* permission bits only */
    uint32_t uid, gid;
    uint32_t rdev;              /* device nodes: the number (x-amz-meta-rdev) */
    char etag[S3_ETAG_MAX];     /* "" for directories without a marker */
    bool headers_known;         /* mode/uid/gid came from a HEAD of etag */
    double fetched_at;          /* monotonic seconds when last confirmed */
};

/* One entry of a directory listing. */
struct inode_dirent {
    char *name;
    struct inode_attrs attrs;   /* from the listing (headers_known false) */
};

/* A directory listing: an immutable, reference-counted snapshot. */
struct inode_listing {
    unsigned refs;              /* (L) */
    double fetched_at;
    size_t count;
    struct inode_dirent *entries; /* sorted by name (strcmp) */
};

struct inode {
    fuse_ino_t ino;             /* immutable */
    char *key;                  /* (L) directories end in '/'; changes on
                                   rename; the last one once unlinked */
    uint64_t nlookup;           /* (L) kernel references */
    unsigned pins;              /* (L) callers working on it */
    struct inode_attrs attrs;   /* (L) */
    struct inode_listing *listing; /* (L) directories: last listing */
    size_t listing_bytes;       /* (L) what it is charged against the
                                   table's listing budget */
    struct inode *listing_newer; /* (L) the table's directories holding a */
    struct inode *listing_older; /* listing, most recently used first */
    size_t evicted_count;       /* (L) entries of the listing the budget
                                   took from it (0: none taken since its
                                   last listing): a lookup lists it
                                   again as it would an old one */
    bool listing_fetch;         /* (L) a thread is listing it now */
    bool listing_refresh;       /* (L) a background listing is queued
                                   (fs_opendir showed an older one) */
    unsigned probes;            /* (L) lookups answered without a listing */
    bool too_big_to_list;       /* (L) more pages than a lookup may list */
    unsigned asking_lookups;    /* (L) directories: lookups of files here
                                   that had to ask the bucket (decaying) */
    unsigned reads_after_lookup; /* (L) directories: files of those opened
                                    for reading afterwards (decaying) */
    bool lookup_asked;          /* (L) files: the last lookup asked the
                                   bucket and no open for reading followed */
    bool plain_entries;         /* (L) directories: a readdirplus answered
                                   entries without attributes since the
                                   last head-ahead job (fs_ahead.c) */
    char *symlink_target;       /* (L) symlinks: target for attrs.etag */
    uint64_t opened_version;    /* (L) fs_version_tag() of the ETag at
                                   the last open (0: none), for keeping
                                   the kernel's page cache: a hash, not
                                   the ETag (120 bytes less an inode) */
    struct writer_file *wfile;  /* (L) staged data while written or
                                   pending upload (writer.h); one
                                   reference, and a pin of the inode */
    unsigned wfile_users;       /* (L) references to wfile the fs layer
                                   took (handles, operations under way):
                                   it stays attached while there are any */
    bool replaced_object;       /* (L) attrs.etag names the object of a
                                   file this staged one replaced (a rename
                                   over it before this one's upload): if
                                   this one leaves the key first, that
                                   object goes, it does not move */
    bool object_unknown;        /* (L) staged at recovery: whether an
                                   object is under its key is not known
                                   (a rename or unlink deletes it anyway) */
    unsigned write_handles;     /* (L) handles open for writing */
    unsigned open_handles;      /* (L) handles open at all */
    bool unlinked;              /* (L) removed: no longer found by key */
    bool detaching;             /* (L) its staged file is being let go (its
                                   data adopted by the cache as the
                                   version uploaded): fs->detach_done */
    struct timespec local_ctime; /* (L) the last change made here (setattr,
                                    rename; a directory's entries): the
                                    ctime shown is at least this. Kept
                                    in memory only (fs_local_times_locked) */
    struct timespec local_mtime; /* (L) directories: the last change of an
                                    entry made here; the mtime shown is at
                                    least this (no request to the bucket) */
    struct inode_patch *patches; /* (L) directories: local changes made
                                    while a listing was being fetched, to
                                    replay on it */
};

struct inode_table;

/* The kind of the file type bits of MODE (S_IFMT): a regular file for
 * none, or for a type this table has no kind for. */
enum inode_kind inode_kind_of_mode(uint32_t mode);

/* The file type bits (S_IFDIR, S_IFREG, ...) of KIND. */
uint32_t inode_kind_type(enum inode_kind kind);

/* Create a table whose root (FUSE_ROOT_ID) is the directory ROOT_KEY. */
int inode_table_create(const char *root_key, const struct inode_attrs *root,
                       struct inode_table **out);

/* Free the table and every inode; *table = NULL. Safe twice. */
void inode_table_destroy(struct inode_table **table);

void inode_table_lock(struct inode_table *table);
void inode_table_unlock(struct inode_table *table);

/* Wait on COND with the table lock (held by the caller). */
void inode_table_wait(struct inode_table *table, pthread_cond_t *cond);

/* Pin inode INO; NULL (ENOENT) if the kernel has forgotten it. Unlocked. */
struct inode *inode_get(struct inode_table *table, fuse_ino_t ino);

/* Pin an inode found under the table lock (held). */
void inode_pin_locked(struct inode *inode);

/* Unpin. Unlocked. */
void inode_put(struct inode_table *table, struct inode *inode);

/*
 * The inode for KEY (created if needed), with ATTRS stored (when ATTRS is
 * not NULL) and one more kernel reference. Returns NULL when out of
 * memory. Call with the table lock held.
 */
struct inode *inode_ref_locked(struct inode_table *table, const char *key,
                               const struct inode_attrs *attrs);

/* The inode for KEY if the table has one (no reference taken; valid while
 * the lock is held). */
struct inode *inode_find_locked(struct inode_table *table, const char *key);

/*
 * Store fresh ATTRS in INODE. Attributes from a listing (headers_known
 * false) keep the mode/uid/gid learnt from a HEAD of the same ETag; a new
 * ETag drops the cached symlink target; an ETag from the bucket ends
 * object_unknown (of an inode without a staged file). Call with the
 * table lock held.
 */
void inode_update_attrs_locked(struct inode *inode,
                               const struct inode_attrs *attrs);

/* Drop N kernel references to INO, freeing it when none remain. Unlocked. */
void inode_forget(struct inode_table *table, fuse_ino_t ino, uint64_t n);

/* Take a reference to LISTING (with the table lock held) / drop one
 * (unlocked). */
struct inode_listing *inode_listing_ref_locked(struct inode_listing *listing);
void inode_listing_put(struct inode_table *table, struct inode_listing *listing);

/* Replace DIR's listing with NEW_LISTING (refs = 1, owned by the table now).
 * Call with the table lock held; the old listing is released. */
void inode_set_listing_locked(struct inode_table *table, struct inode *dir,
                              struct inode_listing *new_listing);

/* Drop DIR's listing (the next use lists again); its holders keep their
 * references. Lock held. */
void inode_drop_listing_locked(struct inode_table *table, struct inode *dir);

/*
 * The memory the directories' listings may take (BYTES; 0: no bound).
 * Each listing a directory holds is charged its entries and names; when
 * the sum passes the budget, the listings used least recently are
 * dropped (never the one just set), and the next use of such a
 * directory reads it from the index or lists it again. Holders of a
 * reference (an open directory, a walk) keep theirs.
 */
void inode_table_set_listing_budget(struct inode_table *table, size_t bytes);

/* A reference to DIR's listing (which must be there), noting the use:
 * it goes last among those dropped for the budget. Lock held. */
struct inode_listing *inode_dir_listing_use_locked(struct inode_table *table,
                                                   struct inode *dir);

/* Bytes the directories' listings are charged now, and how many
 * listings the budget has dropped since the table was created. */
void inode_table_listing_usage(struct inode_table *table, uint64_t *bytes,
                               uint64_t *evicted);

/* Find NAME in LISTING (binary search); NULL if absent. */
const struct inode_dirent *inode_listing_find(const struct inode_listing *listing,
                                              const char *name);

/* Free a listing nobody references (refs must be 0 or it was never shared). */
void inode_listing_free(struct inode_listing *listing);

/* A copy of INODE's key (malloc'd; NULL when out of memory). Unlocked. */
char *inode_key_dup(struct inode_table *table, struct inode *inode);

/* The inode for KEY, created if needed, pinned, without a kernel
 * reference (for files the kernel has not looked up: recovered uploads).
 * NULL when out of memory. Lock held. */
struct inode *inode_obtain_locked(struct inode_table *table, const char *key);

/* INODE was removed: lookups by its key no longer find it (a new file of
 * that name gets a new inode); it lives on while referenced. Lock held. */
void inode_unlink_locked(struct inode_table *table, struct inode *inode);

/* Rename INODE to NEW_KEY (any inode of NEW_KEY must have been unlinked).
 * ENOMEM. Lock held. */
int inode_rekey_locked(struct inode_table *table, struct inode *inode,
                       const char *new_key);

/* The inodes whose key starts with PREFIX (not the unlinked ones), in
 * key order: a new array in *FOUND (caller frees; the inodes are valid
 * while the lock is held) of *COUNT. ENOMEM. Lock held. */
int inode_find_prefix_locked(struct inode_table *table, const char *prefix,
                             struct inode ***found, size_t *count);

/* Rename every inode whose key starts with OLD_PREFIX (a directory and
 * everything under it) to start with NEW_PREFIX. ENOMEM. Lock held. */
int inode_rekey_prefix_locked(struct inode_table *table, const char *old_prefix,
                              const char *new_prefix);

/*
 * Change DIR's listing (if it has one) for a local change: set NAME to
 * ATTRS (added or replaced), or remove it when ATTRS is NULL. The listing
 * is patched in place when nobody else holds it, else copied; while a
 * listing is being fetched the change is also kept to be replayed on it.
 * ENOMEM. Lock held.
 */
int inode_listing_patch_locked(struct inode_table *table, struct inode *dir,
                               const char *name, const struct inode_attrs *attrs);

/* Apply to DIR's new listing the local changes made while it was being
 * fetched (a LIST may predate them), and forget them. Lock held. */
void inode_listing_replay_locked(struct inode_table *table, struct inode *dir);

/* Forget DIR's recorded changes (a fetch starts, or failed). Lock held. */
void inode_listing_forget_patches_locked(struct inode *dir);

/* Number of inodes in the table (for statistics and tests). */
size_t inode_table_count(struct inode_table *table);

#endif /* S3CFS_INODE_H */
