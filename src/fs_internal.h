/*
 * fs_internal.h - what the two halves of the fs layer share: fs.c (lookup,
 * attributes, listings, reading) and fs_write.c (everything that changes
 * the bucket). Not for other modules.
 */
#ifndef S3CFS_FS_INTERNAL_H
#define S3CFS_FS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "fs.h"
#include "inode.h"
#include "reader.h"
#include "upload.h"
#include "workers.h"
#include "writer.h"

#define LIST_PAGE 1000                   /* keys per LIST */
#define DIRECTORY_CONTENT_TYPE "application/x-directory"

/* Open directories and files are linked into the fs, so that handles the
 * kernel never released (an unmount drops queued releases) are freed at
 * the end. */
struct fs_handle {
    struct fs_handle *prev, *next;
};

/* A directory rename under way (rename_dir in fs_write.c): listings of
 * prefixes under either side fetched meanwhile are not kept. */
struct fs_dir_move {
    const char *src_prefix, *dst_prefix;
    struct fs_dir_move *next;
};

struct fs {
    struct fs_conf conf;
    char *root_key;
    struct s3_client *s3;
    struct inode_table *inodes;
    struct workers *workers;      /* read-ahead, HEADs, directory moves */
    struct workers *refresh_workers; /* background relistings (fs_opendir) */
    unsigned refreshes_queued;    /* (inode table lock) jobs on it */
    struct workers *upload_workers; /* parts of uploads and copies: their
                                     own pool, as a part may wait for
                                     read-ahead (an edit's base) */
    struct reader *reader;
    struct writer *writer;        /* NULL on a read-only mount */
    struct upload_conf upload;    /* server-side copies (rename) */
    struct timespec mount_time;
    void *staged;                 /* (inode table lock) tsearch set of the
                                     inodes that have a wfile */

    atomic_bool stopping;         /* unmounting (fs_drain, fs_destroy):
                                     queued relistings do nothing */
    struct fs_dir_move *dir_moves; /* (inode table lock) directory
                                     renames under way */
    pthread_cond_t listing_done;  /* with the inode table lock: a directory
                                     listing finished (inode.listing_fetch) */
    pthread_cond_t move_done;     /* with the inode table lock: a directory
                                     rename left dir_moves */
    pthread_mutex_t handles_lock; /* guards the two lists below */
    struct fs_handle open_dirs;   /* circular lists with a sentinel */
    struct fs_handle open_files;
    pthread_mutex_t logged_lock;  /* guards logged_keys, logged_count */
    void *logged_keys;            /* tsearch set of char * */
    size_t logged_count;
};

struct fs_dir {
    struct fs_handle link;        /* first: the list holds fs_dir pointers */
    fuse_ino_t ino;
    struct inode_listing *listing;
};

/* An open file: reads an object version through the reader, or the staged
 * data of a file being written (wfile). */
struct fs_file {
    struct fs_handle link;        /* first: the list holds fs_file pointers */
    fuse_ino_t ino;
    struct reader_file *reader_file;
    struct writer_file *wfile;    /* a reference, when staged */
    bool writable;                /* counted in inode.write_handles */
    bool append;
};

/* Link an open handle into LIST / unlink it. */
void fs_handle_add(struct fs *fs, struct fs_handle *list, struct fs_handle *handle);
void fs_handle_remove(struct fs *fs, struct fs_handle *handle);

void fs_dir_attrs(const struct fs *fs, struct inode_attrs *out);
void fs_head_file_attrs(const struct fs *fs, const struct s3_object_info *info,
                        struct inode_attrs *out);
void fs_attrs_to_stat(const struct fs *fs, fuse_ino_t ino,
                      const struct inode_attrs *attrs, struct stat *st);
void fs_fill_entry(const struct fs *fs, const struct inode *inode,
                   struct fs_entry *out);
int fs_get_listing(struct fs *fs, struct inode *dir, unsigned max_pages,
                   struct inode_listing **out);
int fs_resolve_file(struct fs *fs, const char *key,
                    const struct inode_attrs *listed, struct inode_attrs *out);
int fs_revalidate_file(struct fs *fs, struct inode *inode,
                       struct inode_attrs *attrs);

/* Apply INODE's local_ctime and local_mtime to ATTRS (what it shows):
 * changes made through this mount that the bucket does not record (a
 * directory's entries) or not yet (a staged file's chmod). Lock held. */
void fs_local_times_locked(const struct inode *inode, struct inode_attrs *attrs);

/* INODE changed now: its ctime, and with ENTRIES (a directory whose
 * entries changed) its mtime. Lock held. */
void fs_touch_locked(struct inode *inode, bool entries);

/* The attributes of a file of SIZE bytes and ETAG written with META. */
void fs_meta_attrs(const struct writer_meta *meta, uint64_t size, const char *etag,
                   struct inode_attrs *out);

/* Call VISIT for every inode with a staged file (a wfile) whose key
 * starts with PREFIX and that is not unlinked. Lock held; VISIT must not
 * attach or detach staged files. */
void fs_staged_visit_locked(struct fs *fs, const char *prefix,
                            void (*visit)(void *arg, struct inode *inode),
                            void *arg);

/* Whether a file under PREFIX waits for its upload. Lock held. */
bool fs_staged_pending_under_locked(struct fs *fs, const char *prefix);

/* Whether a directory rename moving keys from or to a prefix of KEY is
 * under way (fs->dir_moves). Lock held. */
bool fs_move_under_way_locked(const struct fs *fs, const char *key);

/* Attributes of a staged file (lock held). */
void fs_staged_attrs_locked(const struct fs *fs, const struct inode *inode,
                            struct inode_attrs *out);

/* Stage INODE's current content for writing (lock not held): attaches a
 * writer_file to the inode unless it has one; TRUNCATE skips loading the
 * old bytes. Returns 0 with a reference in *out, to drop with
 * fs_staged_put(): the staged file stays attached until then. */
int fs_stage_file(struct fs *fs, struct inode *inode, bool truncate,
                  struct writer_file **out);

/* A reference to INODE's staged file (lock held, one attached), to drop
 * with fs_staged_put(): it stays attached until then, so that every
 * change made through it is what the inode shows. */
struct writer_file *fs_staged_get_locked(struct inode *inode);

/* Drop a reference from fs_stage_file() or fs_staged_get_locked() (lock
 * not held; *wfile = NULL, safe with NULL), then detach the staged file if
 * nothing needs it any more (fs_maybe_detach). */
void fs_staged_put(struct fs *fs, struct inode *inode, struct writer_file **wfile);

/* Detach INODE's staged file when no reference of the fs layer uses it,
 * and it is neither open for writing nor pending (lock not held). Until
 * then every open, write and read of the inode goes to that one staged
 * file: two staged files for one key would upload in any order. */
void fs_maybe_detach(struct fs *fs, struct inode *inode);

/* Writer callback: an upload finished. */
void fs_uploaded(void *arg, struct writer_file *file, void *owner,
                 const char *key, const char *etag, uint64_t size,
                 const struct writer_meta *meta);

/* Writer callback: bytes of the object an edit started from. */
int fs_fetch_base(void *arg, const char *key, const char *etag, uint64_t size,
                  uint64_t offset, uint64_t len, int fd);

/* Writer callback at mount: a journaled file waits for its upload. */
void fs_recovered(void *arg, struct writer_file *file, const char *key,
                  uint64_t size, const struct writer_meta *meta);

#endif /* S3CFS_FS_INTERNAL_H */
