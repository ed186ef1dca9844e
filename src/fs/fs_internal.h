/*
 * fs_internal.h - what the files of the fs layer share: struct fs, open
 * handles, and each file's functions for the files above it, in the
 * order fs.c's header gives: fs_attrs, fs_change, fs_listing, fs_lookup, fs_ahead,
 * fs_stage, fs, fs_dir, fs_file, fs_write, fs_rename, fs_recover. Not for
 * other modules.
 */
#ifndef S3CFS_FS_INTERNAL_H
#define S3CFS_FS_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/workers.h"
#include "fs/fs.h"
#include "fs/inode.h"
#include "reader/reader.h"
#include "writer/upload.h"
#include "writer/writer.h"

#define LIST_PAGE 1000                   /* keys per LIST */
#define STALE_LISTING_TTLS 10            /* a listing this many dir_ttl old is
                                            still shown (fs_lookup, fs_opendir) */
#define DIRECTORY_CONTENT_TYPE "application/x-directory"
#define FS_ENDED_MOVES 32                /* directory renames remembered, for
                                            the changes that began before */
/* The largest object that may be anything but a regular file: a symbolic
 * link's target is shorter than PATH_MAX (readlink refuses a longer
 * one) and special files are empty objects (s3fs's convention, and
 * fs_mknod's). A larger object is a regular file whatever the type bits
 * of its x-amz-meta-mode say (fs_head_file_attrs), so a listing alone
 * tells its type: a readdirplus answers it without a HEAD. */
#define FS_TYPED_OBJECT_MAX (PATH_MAX - 1)

struct head_ahead;

/* Open directories and files are linked into the fs, so that handles the
 * kernel never released (an unmount drops queued releases) are freed at
 * the end. */
struct fs_handle {
    struct fs_handle *prev, *next;
    /* what frees it (fs_release, fs_releasedir), for fs_destroy */
    void (*release)(struct fs *fs, struct fs_handle *handle);
};

/* A directory rename registered (fs_change_enter_move(), fs_change.c):
 * changes of names under either prefix wait for it; once started,
 * listings of prefixes under either side fetched meanwhile are not kept,
 * and files are not staged there (fs_move_under_way_locked()). */
struct fs_dir_move {
    const char *src_prefix, *dst_prefix;
    bool started;                 /* (inode table lock) it moves keys */
    struct fs_dir_move *next;
};

/* Any other change of names under way (fs_change.c): the keys it is
 * about to change (the second may be NULL). */
struct fs_change {
    const char *keys[2];
    struct fs_change *next;
};

/* An old key a rename could not delete once its copy was made
 * (fs_rename.c): the journal keeps a move record to delete it at the next
 * mount while it holds ETAG. A change of that key here first drops the
 * record, for the key is then the change's (fs_change.c). */
struct fs_left_key {
    char *key;
    char etag[S3_ETAG_MAX];
    uint64_t move_id;
    struct fs_left_key *next;
};

struct fs {
    struct fs_conf conf;
    char **trusted;               /* conf.trusted, as keys */
    char **headerless;            /* conf.headerless, as keys */
    struct lifetime *lifetime;    /* counters since the cache was created */
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
    char dir_headers_tag[S3_ETAG_MAX]; /* what this mount keeps directories'
                                     headers under in the index (see
                                     fs_store_dir_attrs()) */
    void *staged;                 /* (inode table lock) tsearch set of the
                                     inodes that have a wfile */

    atomic_bool stopping;         /* unmounting (fs_drain, fs_destroy):
                                     queued relistings do nothing */
    struct fs_dir_move *dir_moves; /* (inode table lock) directory
                                     renames registered, in order */
    struct fs_change *changes;    /* (inode table lock) other changes of
                                     names under way */
    uint64_t moves_ended;         /* (inode table lock) directory renames
                                     ended since the mount */
    struct {                      /* (inode table lock) the prefixes of the
                                     last FS_ENDED_MOVES of them, the n-th
                                     at n % FS_ENDED_MOVES (fs_change.c) */
        char *src_prefix, *dst_prefix;
    } ended_moves[FS_ENDED_MOVES];
    struct fs_left_key *left_keys; /* (inode table lock) old keys renames
                                     could not delete */
    struct head_ahead *aheads;    /* (inode table lock) directories whose
                                     headers are fetched ahead of the
                                     lookups (fs_ahead.c) */
    unsigned ahead_count;         /* (inode table lock) jobs in aheads */
    pthread_cond_t ahead_done;    /* with the inode table lock: a HEAD of
                                     a head-ahead job was answered */
    pthread_cond_t listing_done;  /* with the inode table lock: a directory
                                     listing finished (inode.listing_fetch) */
    pthread_cond_t detach_done;   /* with the inode table lock: an inode's
                                     detaching ended */
    pthread_cond_t move_done;     /* with the inode table lock: a directory
                                     rename left dir_moves, or a change
                                     left changes */
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

/* ---------------------------------------------------------------- fs.c */

/* Link an open handle into LIST, with the function that frees it / unlink
 * it. fs_destroy() frees the handles still linked: those the kernel never
 * released (an unmount drops queued releases). */
void fs_handle_add(struct fs *fs, struct fs_handle *list, struct fs_handle *handle,
                   void (*release)(struct fs *fs, struct fs_handle *handle));
void fs_handle_remove(struct fs *fs, struct fs_handle *handle);

/* ---------------------------------------------------------- fs_attrs.c */

/* -o trust: whether KEY (a file's, or a directory's with its '/') is at
 * or under a trusted prefix; the seconds its attributes (attr) or, for a
 * directory, its listing (dir) are trusted: FS_TRUSTED_TTL there, else
 * attr_ttl and dir_ttl. An entry (a name in its parent) is trusted when
 * its parent's listing is. */
#define FS_TRUSTED_TTL (365.0 * 24 * 3600)
/* A directory's headers as the index keeps them for this mount, or for
 * every mount under -o trust (false when not known), and kept there once
 * learnt or changed here (fs_lookup.c). fs_dir_headers_tag_init() names
 * this mount's records, at fs_create(). */
bool fs_stored_dir_attrs(struct fs *fs, const char *dir_key,
                         struct inode_attrs *attrs);
void fs_store_dir_attrs(struct fs *fs, const char *dir_key,
                        const struct inode_attrs *attrs);
void fs_dir_headers_tag_init(struct fs *fs);
/* Under -o no_headers: true, and ATTRS (a listing's: the defaults) marked
 * as all there is to know of directory DIR_KEY. */
bool fs_headerless_dir_attrs(const struct fs *fs, const char *dir_key,
                             struct inode_attrs *attrs);
bool fs_trusts(const struct fs *fs, const char *key);
/* What inode.opened_version keeps of ETAG: its XXH3-64, never 0 (0 for
 * ""). Two ETags of one key alike in it (one chance in 2^64 for a
 * change) would keep the kernel's pages of the older version. */
uint64_t fs_version_tag(const char *etag);
/* Whether KEY is under a prefix of -o no_headers: what its listing says
 * of it is all there is (fs_known_file_attrs(), resolve_dir()). */
bool fs_headerless(const struct fs *fs, const char *key);
double fs_attr_ttl(const struct fs *fs, const char *key);
double fs_dir_ttl(const struct fs *fs, const char *dir_key);
double fs_entry_ttl(const struct fs *fs, const char *key);

void fs_dir_attrs(const struct fs *fs, struct inode_attrs *out);
/* A directory whose marker waits to be sent (writeback mode, writer.h's
 * writer_marker_put): its attributes in *OUT, as the marker will carry
 * them. False when none waits. Takes no fs lock. */
bool fs_marker_attrs(const struct fs *fs, const char *dir_key,
                     struct inode_attrs *out);
/* The attributes of file KEY as a HEAD (or a GET) answered INFO; under
 * -o no_headers without what its s3fs headers say. */
void fs_head_file_attrs(const struct fs *fs, const char *key,
                        const struct s3_object_info *info,
                        struct inode_attrs *out);
void fs_attrs_to_stat(const struct fs *fs, fuse_ino_t ino,
                      const struct inode_attrs *attrs, struct stat *st);
void fs_fill_entry(const struct fs *fs, const struct inode *inode,
                   struct fs_entry *out);

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

/* Attributes of a staged file (lock held). */
void fs_staged_attrs_locked(const struct fs *fs, const struct inode *inode,
                            struct inode_attrs *out);

/* The writer's metadata of a file with ATTRS (file type bits included). */
void fs_writer_meta_of(const struct inode_attrs *attrs, struct writer_meta *out);

/* The s3fs headers of META, with CONTENT_TYPE (NULL: the default). */
void fs_put_meta_of(const struct writer_meta *meta, const char *content_type,
                    struct s3_put_meta *out);

/* What META cannot say: the times an object has besides its mtime, when
 * ATTRS knows them, and a device node's number. */
void fs_put_meta_extras(const struct inode_attrs *attrs, struct s3_put_meta *out);

/* Whether the inode table or the index knows the s3fs headers of file KEY
 * as LISTED (same ETag), or KEY has none to know (-o no_headers: LISTED
 * is all); *out gets them. */
bool fs_known_file_attrs(struct fs *fs, const char *key,
                         const struct inode_attrs *listed, struct inode_attrs *out);

/* Whether the files that lookups in DIR ask the bucket about are then
 * read (a data loader opening files by name). Lock held. */
bool fs_reads_follow_lookups_locked(const struct inode *dir);

/* --------------------------------------------------------- fs_change.c */

/* The count of directory renames ended, to give fs_change_enter(): take
 * it before computing the keys of a change. */
uint64_t fs_change_seen(struct fs *fs);

/*
 * Enter a change of KEY and OTHER_KEY (may be NULL; both the caller's,
 * valid until fs_change_leave()), whose keys were computed after SEEN
 * (fs_change_seen()). True: registered, do it, then fs_change_leave().
 * False: a directory rename moves (or moved, since SEEN) keys of it: it
 * waited for that rename to end, and the keys are to be computed again
 * from the inodes (then enter again, with a new SEEN).
 */
bool fs_change_enter(struct fs *fs, struct fs_change *change, uint64_t seen,
                     const char *key, const char *other_key);
void fs_change_leave(struct fs *fs, struct fs_change *change);

/* KEY (at version ETAG) is left in the bucket by a rename that could not
 * delete it, recorded as move MOVE_ID (writer_move_narrow()). */
void fs_change_leave_key(struct fs *fs, const char *key, const char *etag,
                         uint64_t move_id);

/* Before a directory rename of PREFIX moves its keys: the old keys left
 * under it (fs_change_leave_key()) go now, while they hold the version
 * left, and their records with them. 0, or the DELETE's errno (the
 * rename must not move them). */
int fs_change_drop_left_under(struct fs *fs, const char *prefix);

/* At the end: the list of old keys left (their records stay for the next
 * mount) and the renames remembered. */
void fs_change_free_left(struct fs *fs);

/* A lookup in PARENT for a change, begun after SEEN, found nothing: true
 * when a directory rename moved PARENT meanwhile (waited for, if it is
 * under way), and the name is to be looked up again. */
bool fs_change_missed(struct fs *fs, uint64_t seen, fuse_ino_t parent);

/*
 * Enter the directory rename MOVE (its prefixes the caller's, valid until
 * it leaves): false as fs_change_enter() (compute its prefixes again);
 * true once it is registered, the changes under its prefixes already
 * inside have left and no earlier rename meets it: started. Leave with
 * fs_change_leave_move_locked() (inode table lock held: the inodes are
 * re-keyed in the same locked section).
 */
bool fs_change_enter_move(struct fs *fs, struct fs_dir_move *move, uint64_t seen);
void fs_change_leave_move_locked(struct fs *fs, struct fs_dir_move *move);

/* Whether a started directory rename moving keys from or to a prefix of
 * KEY is under way (fs->dir_moves). Lock held. */
bool fs_move_under_way_locked(const struct fs *fs, const char *key);

/* -------------------------------------------------------- fs_listing.c */

/* Log a skipped or hidden key once per mount, whatever the relistings
 * (its control characters and bytes that are not UTF-8 as \xNN). */
void fs_log_key_once(struct fs *fs, const char *key, const char *why);

/* DIR's listing, fresh from the bucket (at most MAX_PAGES pages: EFBIG
 * past them), merged with what is staged here, in *out (a reference, for
 * inode_listing_put). */
int fs_get_listing(struct fs *fs, struct inode *dir, unsigned max_pages,
                   struct inode_listing **out);

/* Call VISIT for every inode with a staged file (a wfile) whose key
 * starts with PREFIX and that is not unlinked. Lock held; VISIT must not
 * attach or detach staged files. */
void fs_staged_visit_locked(struct fs *fs, const char *prefix,
                            void (*visit)(void *arg, struct inode *inode),
                            void *arg);

/* Whether a file under PREFIX waits for its upload. Lock held. */
bool fs_staged_pending_under_locked(struct fs *fs, const char *prefix);

/* A local change of KEY: patch its parent's cached listing (ATTRS NULL:
 * removed) and forget the stored one. */
void fs_patch_parent(struct fs *fs, const char *key,
                     const struct inode_attrs *attrs);

/* The entries of KEY's parent directory changed (a name came or went):
 * its mtime and ctime, as this mount shows them. */
void fs_entry_changed(struct fs *fs, const char *key);

/* --------------------------------------------------------- fs_lookup.c */

/* The attributes of file KEY (LISTED: what its listing said, may be
 * NULL), from the inode table, the index or a HEAD, in *out. */
int fs_resolve_file(struct fs *fs, const char *key,
                    const struct inode_attrs *listed, struct inode_attrs *out);

/* Whether INODE's attributes still hold (a HEAD past attr_ttl); *attrs
 * gets what holds now. */
int fs_revalidate_file(struct fs *fs, struct inode *inode,
                       struct inode_attrs *attrs);

/* Whether the inode table or the index knows the s3fs headers of
 * directory DIR_KEY; *out gets them. */
bool fs_known_dir_attrs(struct fs *fs, const char *dir_key,
                        struct inode_attrs *out);

/* A directory marker's HEAD (INFO) applied to ATTRS. */
void fs_apply_dir_headers(const struct fs *fs, const struct s3_object_info *info,
                          struct inode_attrs *attrs);

/* INODE (KEY) was opened for reading: what lookups in its directory are
 * for (see fs_reads_follow_lookups_locked()). */
void fs_note_read_open(struct fs *fs, struct inode *inode, const char *key);


/* ---------------------------------------------------------- fs_ahead.c */

/* Whether a walk of DIR's listing is under way: a head-ahead job of DIR
 * whose answers lookups took within STALE_LISTING_TTLS x TTL (see
 * fs_ahead.c). Lock held. */
bool fs_ahead_live_locked(struct fs *fs, const struct inode *dir, double ttl);

/* A lookup of file NAME in DIR (key DIR_KEY), listed as LISTED: 0 or
 * ENOENT with the answer of DIR's head-ahead job in *out (after waiting
 * for its HEAD if under way), EAGAIN when the job has none. Unlocked. */
int fs_ahead_take(struct fs *fs, struct inode *dir, const char *dir_key,
                  const char *name, const struct inode_attrs *listed,
                  struct inode_attrs *out);

/* A lookup of file NAME in DIR (key DIR_KEY) is about to ask the bucket:
 * start a head-ahead job of DIR after NAME if a readdirplus gave plain
 * entries there since the last one and none runs. Unlocked. */
void fs_ahead_start(struct fs *fs, struct inode *dir, const char *dir_key,
                    const char *name);

/* A readdirplus of DIR passed NAME to the kernel with its attributes, or
 * without them (PLAIN: entry ino 0, no inode reference, the kernel will
 * send a LOOKUP if someone stats it). A head-ahead job of DIR (see
 * fs_ahead.c) no longer keeps NAME's answer for a lookup; a plain entry
 * lets the next lookup in DIR that asks the bucket start one. Lock
 * held. */
void fs_ahead_entry_passed_locked(struct fs *fs, struct inode *dir,
                                  const char *name, bool plain);

/* Whether a head-ahead job of DIR holds an answer for NAME, or is asking
 * for it: a readdirplus then leaves NAME to the lookup that will take it
 * (a plain entry), rather than give the kernel an entry whose timeout
 * may pass before the walker stats it (its lookup would then need a
 * fresh listing: the headers are known). Lock held. */
bool fs_ahead_holds_locked(struct fs *fs, const struct inode *dir,
                           const char *name);

/* End every head-ahead job (fs_destroy, after the worker pool is gone):
 * their pins and listings go. Unlocked. */
void fs_ahead_end_all(struct fs *fs);

/* End the head-ahead jobs of the directories at or under PREFIX (a
 * refresh: their answers predate it). Those with HEADs under way go when
 * the last one is answered. Unlocked. */
void fs_ahead_end_under(struct fs *fs, const char *prefix);

/* ---------------------------------------------------------- fs_stage.c */

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

/* Put the staged file of every inode that has one (after the drain). */
void fs_staged_detach_all(struct fs *fs);

/* Forget the set of staged inodes without touching them (fs_destroy). */
void fs_staged_forget_all(struct fs *fs);

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

/* ----------------------------------------------------------- fs_file.c */

/* Link FILE, just opened, into the open files (fs_handle_add). */
void fs_file_link(struct fs *fs, struct fs_file *file);

/* ---------------------------------------------------------- fs_write.c */

/* Look NAME up in PARENT for a change: its inode pinned in *out and its
 * key. When it does not exist: ENOENT if MUST_EXIST, else 0 and NULL. */
int fs_find_child(struct fs *fs, fuse_ino_t parent, const char *name,
                  bool must_exist, struct inode **out, char **key);

/* The key of NAME in directory PARENT (checked), malloc'd into *key.
 * ENOTDIR, ENAMETOOLONG, EILSEQ (a name no listing carries back:
 * names_check()), EINVAL, ENOMEM. */
int fs_child_key(struct fs *fs, fuse_ino_t parent_ino, const char *name,
                 bool dir, char **key);

/* ENOTEMPTY when directory DIR_KEY has anything in it (in the bucket, or
 * staged here). */
int fs_check_empty(struct fs *fs, const char *dir_key);

/* KEY was removed from its directory (unlink, rename). A directory that
 * existed only as the prefix of its keys would vanish with its last one,
 * though nobody removed it: when the cached listing says it is now empty
 * and the bucket agrees (one LIST), give it a marker. */
void fs_keep_parent_dir(struct fs *fs, const char *key);

/* PUT a directory marker for DIR_KEY with META. */
int fs_put_marker(struct fs *fs, const char *dir_key,
                  const struct writer_meta *meta);

/* Server-side copy of SRC_KEY, known as version ETAG of SIZE bytes, to
 * DST_KEY with META (NULL: the same headers); see fs_write.c. */
int fs_copy_object(struct fs *fs, const char *src_key, const char *etag,
                   uint64_t size, const char *dst_key,
                   const struct s3_put_meta *meta, char *new_etag,
                   uint64_t *new_size);

/* --------------------------------------------------------- fs_rename.c */

/* Server-side move of every key under SRC_PREFIX to DST_PREFIX: copies
 * first (a batch at a time, in parallel), deletes after, so that a
 * failure leaves every key somewhere; a marker for DST_PREFIX if none
 * moved and none is there. Run again after a crash, it moves what is
 * left. 0 or an errno. */
int fs_move_prefix(struct fs *fs, const char *src_prefix, const char *dst_prefix);

#endif /* S3CFS_FS_INTERNAL_H */
