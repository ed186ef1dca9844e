/*
 * fs_write.c - the operations that change the bucket (see fs.h), but
 * rename (fs_rename.c).
 *
 * Files being written are staged (writer.h, fs_stage.c): the inode carries
 * a writer_file while it has handles open for writing or an upload
 * pending, pinned meanwhile, and listed in fs->staged so that listings and
 * lookups show it before it reaches the bucket. Everything else (mkdir,
 * unlink, rmdir, symlink, metadata changes) is done on the bucket at once,
 * then patched into the cached listings (fs_patch_parent) so that no LIST
 * is spent to see one's own change; the stored listings of the
 * directories touched are forgotten.
 *
 * Lock order: inode table lock, then the writer's lock (writer.h calls
 * back without its lock held).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/metacache.h"
#include "fs/names.h"

/* ------------------------------------------------------ helpers */

/* Look NAME up in PARENT for a change: its inode pinned in *out and its
 * key. When it does not exist: ENOENT if MUST_EXIST, else 0 and NULL. */
int fs_find_child(struct fs *fs, fuse_ino_t parent, const char *name,
                  bool must_exist, struct inode **out, char **key)
{
    struct fs_entry entry;
    int err = fs_lookup(fs, parent, name, &entry);

    *out = NULL;
    *key = NULL;
    if (err == 0 && entry.ino == 0 && must_exist)
        err = ENOENT;
    if (err != 0 || entry.ino == 0)
        return err;
    *out = inode_get(fs->inodes, entry.ino);
    fs_forget(fs, entry.ino, 1);
    if (*out == NULL)
        return ENOENT; /* gone meanwhile */
    *key = inode_key_dup(fs->inodes, *out);
    if (*key == NULL) {
        inode_put(fs->inodes, *out);
        *out = NULL;
        return ENOMEM;
    }
    return 0;
}

/* The key of NAME in directory PARENT (checked), malloc'd into *key. */
int fs_child_key(struct fs *fs, fuse_ino_t parent_ino, const char *name,
                 bool dir, char **key)
{
    struct inode *parent = inode_get(fs->inodes, parent_ino);
    size_t len = strlen(name);
    int err = 0;

    *key = NULL;
    if (parent == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    if (parent->attrs.kind != INODE_DIR)
        err = ENOTDIR;
    else
        err = names_check(name, len); /* EILSEQ: no listing would show it */
    if (err == 0 && (*key = names_child_key(parent->key, name, len, dir)) == NULL)
        err = ENOMEM;
    else if (err == 0 && strlen(*key) > NAMES_KEY_MAX)
        err = ENAMETOOLONG; /* S3's limit: the server would refuse it */
    inode_table_unlock(fs->inodes);
    if (err != 0) {
        free(*key);
        *key = NULL;
    }
    inode_put(fs->inodes, parent);
    return err;
}

/* The key of NAME in PARENT (as fs_child_key()) computed and entered as
 * a change (fs_change_enter()): computed again after a directory rename
 * that moved it. 0 with *KEY (malloc'd) and CHANGE to leave, or
 * fs_child_key()'s errno. */
static int enter_child_key(struct fs *fs, fuse_ino_t parent, const char *name,
                           bool dir, struct fs_change *change, char **key)
{
    bool entered = false;
    int err = 0;

    *key = NULL;
    while (err == 0 && !entered) {
        uint64_t seen = fs_change_seen(fs);
        free(*key);
        *key = NULL;
        err = fs_child_key(fs, parent, name, dir, key);
        if (err == 0)
            entered = fs_change_enter(fs, change, seen, *key, NULL);
    }
    return err;
}

/* A change of NAME in PARENT whose keys the inodes give when it starts
 * (SEEN: fs_change_seen() before): *STALE when a directory rename moved
 * them meanwhile (nothing was done). */
typedef int (*name_change_fn)(struct fs *fs, fuse_ino_t parent,
                              const char *name, uint64_t seen, bool *stale);

/* CHANGE of NAME in PARENT, done again while it finds its keys stale. */
static int change_name(struct fs *fs, fuse_ino_t parent, const char *name,
                       name_change_fn change)
{
    bool stale = true;
    int err = 0;

    if (fs->writer == NULL)
        return EROFS;
    while (stale)
        err = change(fs, parent, name, fs_change_seen(fs), &stale);
    return err;
}

/* Whether a file under PREFIX waits for its upload. */
static bool is_staged_pending_under(struct fs *fs, const char *prefix)
{
    inode_table_lock(fs->inodes);
    bool found = fs_staged_pending_under_locked(fs, prefix);
    inode_table_unlock(fs->inodes);
    return found;
}

struct marker_probe {
    const char *dir_key;
    bool found;
};

static void note_marker(void *arg, const char *key,
                        const struct writer_meta *meta)
{
    struct marker_probe *probe = arg;

    (void)meta;
    if (strcmp(key, probe->dir_key) != 0)
        probe->found = true; /* one under it */
}

/* Whether a directory marker under DIR_KEY (not its own) waits to be
 * sent: an empty subdirectory made in writeback mode. */
static bool marker_pending_under(struct fs *fs, const char *dir_key)
{
    struct marker_probe probe = {dir_key, false};

    if (fs->writer != NULL)
        writer_marker_visit(fs->writer, dir_key, note_marker, &probe);
    return probe.found;
}

/* ENOTEMPTY when directory DIR_KEY has anything in it (in the bucket, or
 * staged here). */
int fs_check_empty(struct fs *fs, const char *dir_key)
{
    struct s3xml_listing page;

    if (is_staged_pending_under(fs, dir_key) ||
        marker_pending_under(fs, dir_key))
        return ENOTEMPTY;
    int err = s3_list_objects(fs->s3, dir_key, NULL, NULL, NULL, 2, &page);
    if (err != 0)
        return err;
    for (size_t i = 0; i < page.object_count; i++)
        if (strcmp(page.objects[i].key, dir_key) != 0)
            err = ENOTEMPTY;
    if (page.prefix_count > 0)
        err = ENOTEMPTY;
    s3xml_listing_free(&page);
    return err;
}

/* ------------------------------------------------------ create, write */

int fs_create_file(struct fs *fs, fuse_ino_t parent, const char *name,
                   mode_t mode, int flags, uid_t uid, gid_t gid,
                   struct fs_entry *entry, struct fs_file **out)
{
    struct inode_attrs attrs = {
        .kind = INODE_FILE,
        .mtime = clock_wall_now(),
        .mode = mode & 07777,
        .uid = uid,
        .gid = gid,
        .headers_known = true,
        .fetched_at = clock_monotonic_seconds(),
    };
    struct fs_file *file = NULL;
    struct inode *inode = NULL;
    struct fs_change change;
    char *key = NULL;
    int err;

    memset(entry, 0, sizeof(*entry));
    *out = NULL;
    if (fs->writer == NULL)
        return EROFS;
    err = enter_child_key(fs, parent, name, false, &change, &key);
    if (err != 0)
        return err;
    file = calloc(1, sizeof(*file));
    if (file == NULL) {
        err = ENOMEM;
        goto out;
    }
    inode_table_lock(fs->inodes);
    struct inode *existing = inode_find_locked(fs->inodes, key);
    /* (an object already under the key stays known: a rename or unlink
     * before this file's upload must not leave it behind) */
    if (existing != NULL && existing->wfile == NULL)
        snprintf(attrs.etag, sizeof(attrs.etag), "%s", existing->attrs.etag);
    inode = inode_ref_locked(fs->inodes, key,
                             existing != NULL && existing->wfile != NULL ? NULL : &attrs);
    if (inode != NULL)
        inode_pin_locked(inode);
    inode_table_unlock(fs->inodes);
    if (inode == NULL) {
        err = ENOMEM;
        goto out;
    }
    err = fs_stage_file(fs, inode, true, &file->wfile);
    if (err == 0) {
        struct writer_meta meta = {
            .mode = S_IFREG | (mode & 07777), .uid = uid, .gid = gid,
            .mtime = attrs.mtime,
        };
        writer_file_set_meta(file->wfile, &meta);
        file->ino = inode->ino;
        file->writable = true;
        file->append = (flags & O_APPEND) != 0;
        writer_file_open_writer(file->wfile);
        inode_table_lock(fs->inodes);
        inode->write_handles++;
        inode->open_handles++;
        fs_fill_entry(fs, inode, entry);
        inode_table_unlock(fs->inodes);
        fs_file_link(fs, file);
        fs_patch_parent(fs, key, &attrs);
        fs_entry_changed(fs, key);
    } else {
        fs_forget(fs, inode->ino, 1);
    }
out:
    fs_change_leave(fs, &change);
    if (err != 0) {
        free(file);
        file = NULL;
    }
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    *out = file;
    return err;
}

int fs_write(struct fs *fs, struct fs_file *file, uint64_t offset,
             const char *buf, size_t size)
{
    (void)fs;
    if (file->wfile == NULL || !file->writable)
        return EBADF;
    return writer_file_write(file->wfile, offset, buf, size);
}

int fs_flush(struct fs *fs, struct fs_file *file)
{
    (void)fs;
    if (file->wfile == NULL || !file->writable)
        return 0;
    return writer_file_flush(file->wfile);
}

int fs_fsync(struct fs *fs, struct fs_file *file)
{
    (void)fs;
    if (file->wfile == NULL)
        return 0;
    return writer_file_sync(file->wfile);
}

/* ------------------------------------------------------ directories */

/* PUT a directory marker for DIR_KEY with META, and the atime and ctime
 * of ATTRS when it has them (ATTRS may be NULL). */
static int put_marker_with(struct fs *fs, const char *dir_key,
                           const struct writer_meta *meta,
                           const struct inode_attrs *attrs)
{
    struct s3_body body = {.data = "", .fd = -1, .length = 0};
    struct s3_put_meta put_meta;

    fs_put_meta_of(meta, DIRECTORY_CONTENT_TYPE, &put_meta);
    if (attrs != NULL)
        fs_put_meta_extras(attrs, &put_meta);
    if (fs->writer != NULL) /* writeback mode: journaled, sent soon */
        return writer_marker_put(fs->writer, dir_key, &put_meta);
    return s3_put_object(fs->s3, dir_key, &body, &put_meta, NULL);
}

/* PUT a directory marker for DIR_KEY with META. */
int fs_put_marker(struct fs *fs, const char *dir_key,
                  const struct writer_meta *meta)
{
    return put_marker_with(fs, dir_key, meta, NULL);
}

/* The tail of mkdir, symlink and mknod: KEY, just made in the bucket with
 * ATTRS, becomes an inode (a symlink's with its SYMLINK_TARGET, a
 * directory's with an empty listing: lookups in it need no LIST), handed
 * to the kernel in ENTRY, and its parent's listing and times show it. */
static int enter_created(struct fs *fs, const char *key,
                         const struct inode_attrs *attrs,
                         const char *symlink_target, struct fs_entry *entry)
{
    inode_table_lock(fs->inodes);
    struct inode *inode = inode_ref_locked(fs->inodes, key, attrs);
    if (inode != NULL && attrs->kind == INODE_DIR) {
        struct inode_listing *empty = calloc(1, sizeof(*empty));
        if (empty != NULL) {
            empty->fetched_at = clock_monotonic_seconds();
            inode_set_listing_locked(fs->inodes, inode, empty);
        }
    }
    if (inode != NULL && attrs->kind != INODE_DIR) {
        free(inode->symlink_target);
        inode->symlink_target = symlink_target ? strdup(symlink_target) : NULL;
    }
    if (inode != NULL)
        fs_fill_entry(fs, inode, entry);
    inode_table_unlock(fs->inodes);
    if (inode == NULL)
        return ENOMEM;
    /* a directory made here: its headers are kept in the index in place
     * of any that an earlier one of that name left (fs_store_dir_attrs()) */
    if (attrs->kind == INODE_DIR)
        fs_store_dir_attrs(fs, key, attrs);
    fs_patch_parent(fs, key, attrs);
    fs_entry_changed(fs, key);
    return 0;
}

int fs_mkdir(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
             uid_t uid, gid_t gid, struct fs_entry *entry)
{
    struct writer_meta meta = {
        .mode = S_IFDIR | (mode & 07777), .uid = uid, .gid = gid,
        .mtime = clock_wall_now(),
    };
    struct inode_attrs attrs;
    struct fs_change change;
    bool entered = false;
    char *key = NULL;

    memset(entry, 0, sizeof(*entry));
    if (fs->writer == NULL)
        return EROFS;
    int err = enter_child_key(fs, parent, name, true, &change, &key);
    entered = err == 0;
    if (err == 0)
        err = fs_put_marker(fs, key, &meta);
    if (err != 0)
        goto out;
    fs_dir_attrs(fs, &attrs);
    attrs.mode = mode & 07777;
    attrs.uid = uid;
    attrs.gid = gid;
    attrs.mtime = meta.mtime;
    attrs.headers_known = true;
    err = enter_created(fs, key, &attrs, NULL, entry);
out:
    if (entered)
        fs_change_leave(fs, &change);
    free(key);
    return err;
}

/* fs_rmdir() as unlink_name() for fs_unlink(). */
static int rmdir_name(struct fs *fs, fuse_ino_t parent, const char *name,
                      uint64_t seen, bool *stale)
{
    struct inode *inode = NULL;
    struct fs_change change;
    bool entered = false;
    char *key = NULL;

    *stale = false;
    int err = fs_find_child(fs, parent, name, true, &inode, &key);
    if (err == ENOENT)
        *stale = fs_change_missed(fs, seen, parent);
    if (err != 0)
        goto out;
    entered = fs_change_enter(fs, &change, seen, key, NULL);
    *stale = !entered;
    if (*stale)
        goto out;
    inode_table_lock(fs->inodes);
    bool is_dir = inode->attrs.kind == INODE_DIR;
    inode_table_unlock(fs->inodes);
    if (!is_dir) {
        err = ENOTDIR;
        goto out;
    }
    err = fs_check_empty(fs, key);
    if (err == 0) {
        /* a marker waiting to be sent is not sent now: the delete follows */
        writer_marker_forget(fs->writer, key);
        err = s3_delete_object(fs->s3, key);
    }
    if (err != 0)
        goto out;
    inode_table_lock(fs->inodes);
    inode_unlink_locked(fs->inodes, inode);
    inode_table_unlock(fs->inodes);
    /* its listing, and its headers (a directory made there later by
     * another client is not this one) */
    metacache_forget_tree(fs->conf.cache, key, NULL, NULL);
    fs_patch_parent(fs, key, NULL);
    fs_entry_changed(fs, key);
out:
    if (entered)
        fs_change_leave(fs, &change);
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    return err;
}

int fs_rmdir(struct fs *fs, fuse_ino_t parent, const char *name)
{
    return change_name(fs, parent, name, rmdir_name);
}

/* ------------------------------------------------------ unlink, symlink */

void fs_keep_parent_dir(struct fs *fs, const char *key)
{
    char *parent_key = names_parent_key(key);
    struct s3xml_listing page;
    bool emptied = false;

    if (parent_key == NULL || parent_key[0] == '\0' ||
        strcmp(parent_key, fs->conf.root_key) == 0 ||
        (fs->writer != NULL &&
         writer_marker_pending(fs->writer, parent_key, NULL))) {
        free(parent_key);
        return; /* (a marker waiting to be sent keeps it) */
    }
    inode_table_lock(fs->inodes);
    struct inode *dir = inode_find_locked(fs->inodes, parent_key);
    emptied = dir != NULL && dir->listing != NULL && dir->listing->count == 0;
    inode_table_unlock(fs->inodes);
    if (emptied && s3_list_objects(fs->s3, parent_key, NULL, NULL, NULL, 1, &page) == 0) {
        bool gone = page.object_count == 0 && page.prefix_count == 0;
        s3xml_listing_free(&page);
        if (gone) {
            struct writer_meta meta = {
                .mode = S_IFDIR | fs->conf.dir_mode, .uid = fs->conf.uid,
                .gid = fs->conf.gid,
                .mtime = clock_wall_now(),
            };
            fs_put_marker(fs, parent_key, &meta);
        }
    }
    free(parent_key);
}

/* fs_unlink() with the key of NAME as the inodes give it now (SEEN:
 * fs_change_seen() before it was computed). *STALE: a directory rename
 * moved it meanwhile; nothing was done. */
static int unlink_name(struct fs *fs, fuse_ino_t parent, const char *name,
                       uint64_t seen, bool *stale)
{
    struct writer_file *wfile = NULL;
    struct inode *inode = NULL;
    struct fs_change change;
    bool entered = false;
    char *key = NULL;

    *stale = false;
    int err = fs_find_child(fs, parent, name, true, &inode, &key);
    if (err == ENOENT)
        *stale = fs_change_missed(fs, seen, parent);
    if (err != 0)
        goto out;
    entered = fs_change_enter(fs, &change, seen, key, NULL);
    *stale = !entered;
    if (*stale)
        goto out;
    inode_table_lock(fs->inodes);
    bool is_dir = inode->attrs.kind == INODE_DIR && inode->wfile == NULL;
    bool in_bucket = inode->attrs.etag[0] != '\0' || inode->object_unknown;
    bool open = inode->open_handles > 0;
    if (inode->wfile != NULL)
        wfile = fs_staged_get_locked(inode);
    inode_table_unlock(fs->inodes);
    if (is_dir) {
        err = EISDIR;
        goto out;
    }
    /* descriptors still open read on after the unlink: keep the data */
    if (wfile == NULL && open && inode->attrs.kind == INODE_FILE)
        err = fs_stage_file(fs, inode, false, &wfile);
    if (err == 0 && wfile != NULL && open)
        err = writer_file_complete(wfile); /* before the object goes */
    if (err != 0)
        goto out;
    /* never uploaded now; if an upload got there meanwhile, its object
     * goes too. Its promise stays in the journal until the object under
     * the key is gone: a crash in between leaves the last promised
     * version, never an older one. */
    if (wfile != NULL && writer_file_unlink(wfile, false))
        in_bucket = true;
    if (in_bucket || wfile == NULL)
        err = s3_delete_object(fs->s3, key);
    if (err == 0 && wfile != NULL)
        writer_file_forget(wfile);
    log_debug("'%s': unlinked (%s)", key, !in_bucket && wfile != NULL
                                            ? "never in the bucket"
                                            : err == 0 ? "deleted" : strerror(err));
    if (err != 0) {
        if (wfile != NULL)
            writer_file_relink(wfile); /* still there: still to upload */
        goto out;
    }
    inode_table_lock(fs->inodes);
    inode_unlink_locked(fs->inodes, inode);
    inode_table_unlock(fs->inodes);
    cache_forget_key(fs->conf.cache, key);
    fs_patch_parent(fs, key, NULL);
    fs_entry_changed(fs, key);
    fs_keep_parent_dir(fs, key);
out:
    if (entered)
        fs_change_leave(fs, &change);
    if (wfile != NULL)
        fs_staged_put(fs, inode, &wfile);
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    return err;
}

int fs_unlink(struct fs *fs, fuse_ino_t parent, const char *name)
{
    return change_name(fs, parent, name, unlink_name);
}

/* Create NAME in PARENT as one object (BODY, with the s3fs headers of
 * META and ATTRS): symlinks and special files. ATTRS (the new file's)
 * gets its ETag; ENTRY the kernel's reference. */
static int create_object(struct fs *fs, fuse_ino_t parent, const char *name,
                         const struct s3_body *body, const struct writer_meta *meta,
                         struct inode_attrs *attrs, const char *symlink_target,
                         struct fs_entry *entry)
{
    struct s3_put_meta put_meta;
    struct fs_change change;
    char *key = NULL;

    memset(entry, 0, sizeof(*entry));
    int err = enter_child_key(fs, parent, name, false, &change, &key);
    bool entered = err == 0;
    fs_put_meta_of(meta, NULL, &put_meta);
    fs_put_meta_extras(attrs, &put_meta);
    if (err == 0)
        err = s3_put_object(fs->s3, key, body, &put_meta, attrs->etag);
    if (err != 0)
        goto out;
    metacache_put_attrs(fs->conf.cache, key, attrs);
    if (symlink_target != NULL && attrs->etag[0] != '\0')
        metacache_put_link(fs->conf.cache, key, attrs->etag, symlink_target);
    err = enter_created(fs, key, attrs, symlink_target, entry);
out:
    if (entered)
        fs_change_leave(fs, &change);
    free(key);
    return err;
}

int fs_symlink(struct fs *fs, const char *target, fuse_ino_t parent,
               const char *name, uid_t uid, gid_t gid, struct fs_entry *entry)
{
    struct writer_meta meta = {
        .mode = S_IFLNK | 0777, .uid = uid, .gid = gid,
        .mtime = clock_wall_now(),
    };
    struct inode_attrs attrs = {
        .kind = INODE_SYMLINK,
        .size = strlen(target),
        .mtime = meta.mtime,
        .mode = 0777,
        .uid = uid,
        .gid = gid,
        .headers_known = true,
        .fetched_at = clock_monotonic_seconds(),
    };
    struct s3_body body = {.data = target, .fd = -1, .length = strlen(target)};

    memset(entry, 0, sizeof(*entry));
    if (fs->writer == NULL)
        return EROFS;
    if (attrs.size == 0 || attrs.size >= PATH_MAX)
        return attrs.size == 0 ? EINVAL : ENAMETOOLONG;
    return create_object(fs, parent, name, &body, &meta, &attrs, target, entry);
}

int fs_mknod(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
             dev_t rdev, uid_t uid, gid_t gid, struct fs_entry *entry)
{
    enum inode_kind kind = inode_kind_of_mode(mode);
    struct writer_meta meta = {
        .mode = inode_kind_type(kind) | (mode & 07777), .uid = uid, .gid = gid,
        .mtime = clock_wall_now(),
    };
    struct inode_attrs attrs = {
        .kind = kind,
        .mtime = meta.mtime,
        .mode = mode & 07777,
        .uid = uid,
        .gid = gid,
        .headers_known = true,
        .fetched_at = clock_monotonic_seconds(),
    };
    struct s3_body body = {.data = "", .fd = -1, .length = 0};

    memset(entry, 0, sizeof(*entry));
    if (fs->writer == NULL)
        return EROFS;
    /* mkdir and symlink have calls of their own; no other type exists */
    if ((mode & S_IFMT) != 0 && (mode & S_IFMT) != inode_kind_type(kind))
        return EINVAL;
    if (kind == INODE_DIR || kind == INODE_SYMLINK)
        return EINVAL;
    if (kind == INODE_CHARDEV || kind == INODE_BLOCKDEV) {
        if (rdev > UINT32_MAX)
            return EINVAL; /* FUSE's device numbers have 32 bits */
        attrs.rdev = (uint32_t)rdev;
    }
    return create_object(fs, parent, name, &body, &meta, &attrs, NULL, entry);
}

int fs_link(struct fs *fs, const char *name)
{
    int err = names_check(name, strlen(name));

    (void)fs;
    return err != 0 ? err : EPERM; /* S3 has no hard links */
}

/* ------------------------------------------------------ copies */

/*
 * Server-side copy of object SRC_KEY to DST_KEY (META: new metadata; NULL:
 * its own). ETAG and SIZE are the version this mount knows (ETAG may be
 * ""): the copy is conditional on it, and if another client replaced the
 * object since, the version there now is copied instead (what rename and
 * chmod mean). The blocks cached for ETAG follow the copy only when it is
 * known to be of that version; otherwise SRC_KEY's are dropped, never
 * served as the bytes of the copy. NEW_ETAG (S3_ETAG_MAX bytes) and
 * *NEW_SIZE get the copy's. May run on a worker thread for objects up to
 * UPLOAD_MAX_COPY_SIZE (larger ones wait for parts on the upload pool).
 */
int fs_copy_object(struct fs *fs, const char *src_key, const char *etag,
                   uint64_t size, const char *dst_key,
                   const struct s3_put_meta *meta, char *new_etag,
                   uint64_t *new_size)
{
    bool same = false;
    int err = upload_copy(&fs->upload, src_key, etag[0] ? etag : NULL, size,
                          dst_key, meta, new_etag, &same);

    *new_size = size;
    if (err == ESTALE) {
        struct s3_object_info info;
        log_info("'%s' was replaced by another client since it was read "
                 "here; copying the version there now", src_key);
        err = s3_head_object(fs->s3, src_key, &info);
        if (err == 0) {
            *new_size = info.size;
            err = upload_copy(&fs->upload, src_key, info.etag, info.size,
                              dst_key, meta, new_etag, NULL);
        }
    }
    if (err != 0)
        return err;
    if (same)
        cache_rename_object(fs->conf.cache, src_key, etag, dst_key,
                            new_etag[0] ? new_etag : etag);
    else
        cache_forget_key(fs->conf.cache, src_key);
    return 0;
}

/* ------------------------------------------------------ metadata */

/* Rewrite the metadata of object KEY (ATTRS: what it is now, with the
 * atime and ctime it is to have) server-side; the new attributes go to
 * *attrs. */
static int replace_metadata(struct fs *fs, const char *key,
                            const struct writer_meta *meta, struct inode_attrs *attrs)
{
    struct s3_put_meta put_meta;
    char etag[S3_ETAG_MAX] = "";
    uint64_t size = 0;
    int err;

    fs_put_meta_of(meta, NULL, &put_meta);
    fs_put_meta_extras(attrs, &put_meta);
    err = fs_copy_object(fs, key, attrs->etag, attrs->size, key, &put_meta, etag,
                      &size);
    if (err != 0)
        return err;
    if (etag[0] != '\0')
        snprintf(attrs->etag, sizeof(attrs->etag), "%s", etag);
    attrs->size = size;
    attrs->mode = meta->mode & 07777;
    attrs->uid = meta->uid;
    attrs->gid = meta->gid;
    attrs->mtime = meta->mtime;
    attrs->headers_known = true;
    attrs->fetched_at = clock_monotonic_seconds();
    metacache_put_attrs(fs->conf.cache, key, attrs);
    return 0;
}

int fs_setattr(struct fs *fs, fuse_ino_t ino, const struct stat *want, int to_set,
               struct fs_file *file, struct stat *out, double *timeout)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct writer_file *wfile = NULL;
    struct inode_attrs attrs;
    struct fs_change change;
    bool entered = false;
    char *key = NULL;
    int err = 0;

    if (inode == NULL)
        return ENOENT;
    if (fs->writer == NULL) {
        err = EROFS;
        goto out;
    }
    /* (the object is copied onto itself, or the marker written again,
     * under the key: not while a directory rename moves it, fs_change.c) */
    while (err == 0 && !entered) {
        uint64_t seen = fs_change_seen(fs);
        free(key);
        key = inode_key_dup(fs->inodes, inode);
        if (key == NULL)
            err = ENOMEM;
        else
            entered = fs_change_enter(fs, &change, seen, key, NULL);
    }
    if (err != 0)
        goto out;

    if (to_set & FUSE_SET_ATTR_SIZE) {
        inode_table_lock(fs->inodes);
        bool is_dir = inode->attrs.kind == INODE_DIR;
        inode_table_unlock(fs->inodes);
        if (is_dir) {
            err = EISDIR;
            goto out;
        }
        err = fs_stage_file(fs, inode, want->st_size == 0, &wfile);
        if (err == 0)
            err = writer_file_truncate(wfile, (uint64_t)want->st_size);
        /* truncate(2) by path: no close() will follow to upload it */
        if (err == 0 && (file == NULL || !file->writable))
            err = writer_file_flush(wfile);
        if (err != 0)
            goto out;
    }

    if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID |
                  FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW |
                  FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
        struct writer_meta meta;
        inode_table_lock(fs->inodes);
        attrs = inode->attrs;
        if (inode->wfile != NULL) {
            fs_staged_attrs_locked(fs, inode, &attrs);
            if (wfile == NULL)
                wfile = fs_staged_get_locked(inode);
        }
        fs_local_times_locked(inode, &attrs);
        inode_table_unlock(fs->inodes);
        fs_writer_meta_of(&attrs, &meta);
        struct writer_meta before = meta;
        struct timespec atime_before = attrs.atime;
        if (to_set & FUSE_SET_ATTR_ATIME_NOW)
            attrs.atime = clock_wall_now();
        else if (to_set & FUSE_SET_ATTR_ATIME)
            attrs.atime = want->st_atim;
        meta.atime = attrs.atime; /* (a staged file's goes with its upload) */
        attrs.ctime = clock_wall_now(); /* a change of the inode */
        if (to_set & FUSE_SET_ATTR_MODE)
            meta.mode = (meta.mode & S_IFMT) | (want->st_mode & 07777);
        if (to_set & FUSE_SET_ATTR_UID)
            meta.uid = want->st_uid;
        if (to_set & FUSE_SET_ATTR_GID)
            meta.gid = want->st_gid;
        if (to_set & FUSE_SET_ATTR_MTIME_NOW)
            meta.mtime = clock_wall_now();
        else if (to_set & FUSE_SET_ATTR_MTIME)
            meta.mtime = want->st_mtim;

        /* tar sets what mkdir/create already set: no request for that
         * (times are kept to the second, as s3fs keeps them) */
        bool unchanged = meta.mode == before.mode && meta.uid == before.uid &&
                         meta.gid == before.gid &&
                         meta.mtime.tv_sec == before.mtime.tv_sec &&
                         attrs.atime.tv_sec == atime_before.tv_sec;
        if (unchanged && attrs.headers_known) {
            /* nothing to write (the ctime changes here: fs_touch_locked) */
            attrs.ctime = (struct timespec){0, 0};
        } else if (attrs.kind == INODE_DIR) {
            if (key[0] != '\0' && strcmp(key, fs->conf.root_key) != 0)
                err = put_marker_with(fs, key, &meta, &attrs);
            if (err == 0) {
                attrs.mode = meta.mode & 07777;
                attrs.uid = meta.uid;
                attrs.gid = meta.gid;
                attrs.mtime = meta.mtime;
                attrs.headers_known = true;
            }
        } else if (wfile != NULL) {
            /* staged: the metadata goes up with the data, with the pending
             * upload, at the next close, or now when no descriptor will
             * close it (a pending upload's journal entry keeps the metadata
             * it was closed with: after a crash, that is what goes up) */
            bool was_pending = writer_file_pending(wfile);
            writer_file_set_meta(wfile, &meta);
            inode_table_lock(fs->inodes);
            bool open_for_writing = inode->write_handles > 0;
            inode_table_unlock(fs->inodes);
            if (!was_pending && !open_for_writing)
                err = writer_file_flush(wfile);
        } else {
            err = replace_metadata(fs, key, &meta, &attrs);
        }
        if (err != 0)
            goto out;
        inode_table_lock(fs->inodes);
        if (inode->wfile == NULL || attrs.kind == INODE_DIR)
            inode->attrs = attrs;
        inode_table_unlock(fs->inodes);
        if (attrs.kind == INODE_DIR) /* (what the index keeps) */
            fs_store_dir_attrs(fs, key, &attrs);
        if (attrs.kind != INODE_DIR || key[0] != '\0')
            fs_patch_parent(fs, key, &attrs);
    }

    inode_table_lock(fs->inodes);
    fs_touch_locked(inode, false);
    attrs = inode->attrs;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs);
    fs_local_times_locked(inode, &attrs);
    inode_table_unlock(fs->inodes);
    fs_attrs_to_stat(fs, ino, &attrs, out);
    *timeout = fs->conf.attr_ttl;
out:
    if (entered)
        fs_change_leave(fs, &change);
    fs_staged_put(fs, inode, &wfile);
    fs_maybe_detach(fs, inode);
    inode_put(fs->inodes, inode);
    free(key);
    return err;
}
