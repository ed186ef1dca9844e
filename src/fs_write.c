/*
 * fs_write.c - the operations that change the bucket (see fs.h).
 *
 * Files being written are staged (writer.h): the inode carries a
 * writer_file while it has handles open for writing or an upload pending,
 * pinned meanwhile, and listed in fs->staged so that listings and lookups
 * show it before it reaches the bucket. Everything else (mkdir, unlink,
 * rmdir, symlink, rename of what is in the bucket, metadata changes) is
 * done on the bucket at once, then patched into the cached listings
 * (inode_listing_patch_locked) so that no LIST is spent to see one's own
 * change; the stored listings of the directories touched are forgotten.
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

#include "clock.h"
#include "fs_internal.h"
#include "log.h"
#include "metacache.h"
#include "names.h"

#define FETCH_CHUNK (1u << 20)      /* fetching the base of an edit */
#define MOVE_BATCH 64               /* keys copied or deleted per batch */

static int compare_pointers(const void *a, const void *b)
{
    return a < b ? -1 : a > b;
}

static void *owner_of(fuse_ino_t ino)
{
    return (void *)(uintptr_t)ino;
}

/* The parent prefix of KEY ("a/b/" for "a/b/c" and "a/b/c/"). */
static char *parent_of(const char *key)
{
    size_t len = strlen(key);
    if (len > 0 && key[len - 1] == '/')
        len--;
    while (len > 0 && key[len - 1] != '/')
        len--;
    return strndup(key, len);
}

/* The last component of KEY, without a trailing '/'. */
static char *name_of(const char *key)
{
    size_t len = strlen(key);
    if (len > 0 && key[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && key[start - 1] != '/')
        start--;
    return strndup(key + start, len - start);
}

/* A local change of KEY: patch its parent's cached listing (ATTRS NULL:
 * removed) and forget the stored one. */
static void patch_parent(struct fs *fs, const char *key,
                         const struct inode_attrs *attrs)
{
    char *parent_key = parent_of(key);
    char *name = name_of(key);

    if (parent_key != NULL && name != NULL && name[0] != '\0') {
        inode_table_lock(fs->inodes);
        struct inode *dir = inode_find_locked(fs->inodes, parent_key);
        if (dir != NULL)
            inode_listing_patch_locked(fs->inodes, dir, name, attrs);
        inode_table_unlock(fs->inodes);
        metacache_forget_listing(fs->conf.cache, parent_key);
    }
    free(parent_key);
    free(name);
}

/* The entries of KEY's parent directory changed (a name came or went):
 * its mtime and ctime, as this mount shows them. */
static void entry_changed(struct fs *fs, const char *key)
{
    char *parent_key = parent_of(key);

    if (parent_key == NULL)
        return;
    inode_table_lock(fs->inodes);
    struct inode *dir = inode_find_locked(fs->inodes, parent_key);
    if (dir != NULL)
        fs_touch_locked(dir, true);
    inode_table_unlock(fs->inodes);
    free(parent_key);
}

static void meta_of_attrs(const struct inode_attrs *attrs, struct writer_meta *out)
{
    *out = (struct writer_meta){
        .mode = inode_kind_type(attrs->kind) | (attrs->mode & 07777),
        .uid = attrs->uid,
        .gid = attrs->gid,
        .mtime = attrs->mtime,
    };
}

static void put_meta_of(const struct writer_meta *meta, const char *content_type,
                        struct s3_put_meta *out)
{
    *out = (struct s3_put_meta){
        .content_type = content_type,
        .has_mode = true, .has_uid = true, .has_gid = true, .has_mtime = true,
        .mode = meta->mode, .uid = meta->uid, .gid = meta->gid,
        .mtime = meta->mtime,
    };
}

/* What META cannot say: the times an object has besides its mtime, when
 * ATTRS knows them, and a device node's number. */
static void put_meta_extras(const struct inode_attrs *attrs, struct s3_put_meta *out)
{
    if (attrs->atime.tv_sec != 0 || attrs->atime.tv_nsec != 0) {
        out->has_atime = true;
        out->atime = attrs->atime;
    }
    if (attrs->ctime.tv_sec != 0 || attrs->ctime.tv_nsec != 0) {
        out->has_ctime = true;
        out->ctime = attrs->ctime;
    }
    if (attrs->kind == INODE_CHARDEV || attrs->kind == INODE_BLOCKDEV) {
        out->has_rdev = true;
        out->rdev = attrs->rdev;
    }
}

/* ------------------------------------------------------ staged files */

int fs_fetch_base(void *arg, const char *key, const char *etag, uint64_t size,
                  uint64_t offset, uint64_t len, int fd)
{
    struct fs *fs = arg;
    struct reader_file *reader_file = NULL;
    char *buf = NULL;
    /* one reader for the run: its read-ahead coalesces the GETs */
    int err = reader_open(fs->reader, key, etag, size, &reader_file);

    /* read-ahead within the range only (it runs on the read pool, which
     * never waits for upload parts: no deadlock) */
    if (err == 0)
        reader_limit_prefetch(reader_file, offset + len);
    if (err == 0 && (buf = malloc(FETCH_CHUNK)) == NULL)
        err = ENOMEM;
    while (err == 0 && len > 0) {
        size_t got = 0;
        size_t want = len < FETCH_CHUNK ? (size_t)len : FETCH_CHUNK;
        err = reader_read(reader_file, offset, want, buf, &got);
        if (err == 0 && got == 0)
            err = EIO; /* shorter than it said */
        for (size_t done = 0; err == 0 && done < got;) {
            ssize_t n = pwrite(fd, buf + done, got - done, (off_t)(offset + done));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                err = n < 0 && (errno == ENOSPC || errno == EDQUOT) ? ENOSPC : EIO;
            else
                done += (size_t)n;
        }
        offset += got;
        len -= got;
    }
    free(buf);
    reader_close(&reader_file);
    return err;
}

struct writer_file *fs_staged_get_locked(struct inode *inode)
{
    inode->wfile_users++;
    return writer_file_ref(inode->wfile);
}

void fs_staged_put(struct fs *fs, struct inode *inode, struct writer_file **wfile)
{
    if (*wfile == NULL)
        return;
    inode_table_lock(fs->inodes);
    inode->wfile_users--;
    inode_table_unlock(fs->inodes);
    writer_file_put(wfile);
    fs_maybe_detach(fs, inode);
}

/* Attach WFILE (our reference passes to the inode) unless another thread
 * attached one first; *out gets a reference to the attached one (for
 * fs_staged_put), unless OUT is NULL. */
static void attach_locked(struct fs *fs, struct inode *inode,
                          struct writer_file **wfile, struct writer_file **out)
{
    if (inode->wfile == NULL) {
        inode->wfile = *wfile;
        *wfile = NULL;
        inode_pin_locked(inode);
        tsearch(inode, &fs->staged, compare_pointers);
    }
    if (out != NULL)
        *out = fs_staged_get_locked(inode);
}

int fs_stage_file(struct fs *fs, struct inode *inode, bool truncate,
                  struct writer_file **out)
{
    struct writer_file *wfile = NULL;
    struct writer_meta meta;
    struct inode_attrs attrs;
    int err = 0;

    *out = NULL;
again:
    inode_table_lock(fs->inodes);
    /* a directory rename collects the staged files under it when it
     * starts: one staged during the move would keep the old key */
    while (inode->wfile == NULL && fs_move_under_way_locked(fs, inode->key))
        inode_table_wait(fs->inodes, &fs->move_done);
    if (inode->wfile != NULL) {
        *out = fs_staged_get_locked(inode);
        inode_table_unlock(fs->inodes);
        err = truncate ? writer_file_truncate(*out, 0) : 0;
        if (err != 0)
            fs_staged_put(fs, inode, out);
        return err;
    }
    attrs = inode->attrs;
    char *key = strdup(inode->key);
    inode_table_unlock(fs->inodes);
    if (key == NULL)
        return ENOMEM;

    if (!truncate && attrs.kind == INODE_FILE && attrs.etag[0] == '\0') {
        /* no ETag for a file that is not staged: not "empty", unknown (an
         * inode that lost its staged file's version); the bucket says */
        struct inode_attrs fresh = attrs;
        int found = fs_resolve_file(fs, key, NULL, &fresh);
        if (found == 0) {
            attrs = fresh;
            inode_table_lock(fs->inodes);
            if (inode->wfile == NULL) {
                inode_update_attrs_locked(inode, &fresh);
                inode->object_unknown = false;
            }
            inode_table_unlock(fs->inodes);
        } else if (found != ENOENT) {
            free(key);
            return found;
        }
    }
    meta_of_attrs(&attrs, &meta);
    meta.mode = S_IFREG | (meta.mode & 07777);
    log_debug("'%s': staged %s (%llu bytes, ETag %s)", key,
              truncate || attrs.size == 0 || attrs.etag[0] == '\0' ? "empty"
                                                                : "as an edit",
              (unsigned long long)attrs.size, attrs.etag[0] ? attrs.etag : "none");
    if (truncate || attrs.size == 0 || attrs.etag[0] == '\0')
        err = writer_file_create(fs->writer, key, &meta,
                                 truncate || attrs.etag[0] == '\0',
                                 owner_of(inode->ino), &wfile);
    else /* nothing is fetched until it is needed */
        err = writer_file_create_edit(fs->writer, key, &meta, attrs.etag,
                                      attrs.size, owner_of(inode->ino), &wfile);
    bool moving = false;
    if (err == 0) {
        inode_table_lock(fs->inodes);
        /* a rename that began meanwhile would not know of ours: again */
        moving = inode->wfile == NULL &&
                 (strcmp(inode->key, key) != 0 ||
                  fs_move_under_way_locked(fs, key));
        if (!moving)
            attach_locked(fs, inode, &wfile, out);
        inode_table_unlock(fs->inodes);
    }
    if (wfile != NULL) {
        /* another open attached one first, or a rename came: ours never
         * existed */
        writer_file_unlink(wfile, true);
        if (err == 0 && truncate && !moving)
            err = writer_file_truncate(*out, 0);
    }
    writer_file_put(&wfile);
    free(key);
    if (moving)
        goto again;
    if (err != 0)
        fs_staged_put(fs, inode, out);
    return err;
}

/* fs_maybe_detach(), from the uploaded callback of INODE's staged file
 * (CONCLUDING): that upload is the one under way, and ends with this. */
static void maybe_detach(struct fs *fs, struct inode *inode, bool concluding)
{
    struct writer_file *wfile = NULL;

    inode_table_lock(fs->inodes);
    /* an unlinked file's data stays for the descriptors still open; an
     * upload that is concluding has yet to record what it made (its
     * callback sets the inode's ETag): until then the file stays */
    if (inode->wfile != NULL && inode->wfile_users == 0 &&
        inode->write_handles == 0 &&
        !(inode->unlinked && inode->open_handles > 0) &&
        !writer_file_pending(inode->wfile) &&
        (concluding || !writer_file_uploading(inode->wfile))) {
        wfile = inode->wfile;
        inode->wfile = NULL;
        tdelete(inode, &fs->staged, compare_pointers);
    }
    inode_table_unlock(fs->inodes);
    if (wfile == NULL)
        return;
    writer_file_put(&wfile); /* the data becomes cached blocks */
    inode_put(fs->inodes, inode); /* the pin of attach_locked() */
}

void fs_maybe_detach(struct fs *fs, struct inode *inode)
{
    maybe_detach(fs, inode, false);
}

void fs_uploaded(void *arg, struct writer_file *file, void *owner, const char *key,
                 const char *etag, uint64_t size, const struct writer_meta *meta)
{
    struct fs *fs = arg;
    struct inode *inode = inode_get(fs->inodes, (fuse_ino_t)(uintptr_t)owner);
    struct inode_attrs attrs;
    bool current = false;

    fs_meta_attrs(meta, size, etag, &attrs);
    if (inode != NULL) {
        inode_table_lock(fs->inodes);
        bool mine = inode->wfile == file && !inode->unlinked;
        current = mine && strcmp(inode->key, key) == 0;
        if (!current)
            log_debug("'%s': uploaded for inode %llu, now '%s'%s%s", key,
                      (unsigned long long)inode->ino, inode->key,
                      inode->wfile != file ? ", another staged file" : "",
                      inode->unlinked ? ", unlinked" : "");
        if (current) {
            inode->attrs = attrs;
            inode->replaced_object = inode->object_unknown = false;
            /* the kernel's pages are what was uploaded */
            snprintf(inode->opened_etag, sizeof(inode->opened_etag), "%s", etag);
        } else if (mine) {
            /* renamed since: rename_file() knows the object's new ETag */
            char renamed_etag[S3_ETAG_MAX];
            snprintf(renamed_etag, sizeof(renamed_etag), "%s", inode->attrs.etag);
            inode->attrs = attrs;
            snprintf(inode->attrs.etag, sizeof(inode->attrs.etag), "%s", renamed_etag);
        }
        inode_table_unlock(fs->inodes);
    }
    log_debug("'%s': uploaded as %s (%s)", key, etag,
              inode == NULL ? "no inode" : current ? "current" : "not current");
    if (current) {
        metacache_put_attrs(fs->conf.cache, key, &attrs);
        patch_parent(fs, key, &attrs);
    }
    if (inode != NULL) {
        maybe_detach(fs, inode, true);
        inode_put(fs->inodes, inode);
    }
}

void fs_recovered(void *arg, struct writer_file *file, const char *key,
                  uint64_t size, const struct writer_meta *meta)
{
    struct fs *fs = arg;
    struct inode_attrs attrs;
    fs_meta_attrs(meta, size, "", &attrs);

    inode_table_lock(fs->inodes);
    struct inode *inode = inode_obtain_locked(fs->inodes, key);
    if (inode != NULL) {
        if (inode->wfile == NULL) {
            inode->attrs = attrs;
            inode->object_unknown = true; /* an older version, perhaps */
        }
        writer_file_set_owner(file, owner_of(inode->ino));
        attach_locked(fs, inode, &file, NULL);
    }
    inode_table_unlock(fs->inodes);
    if (file != NULL) {
        /* cannot happen: recovery runs before any request, with one entry
         * per key; the file stays queued and journaled all the same */
        log_error("'%s' was recovered twice; uploading both versions", key);
        writer_file_put(&file);
    }
    if (inode != NULL)
        inode_put(fs->inodes, inode); /* obtain's pin; attach holds its own */
}

/* ------------------------------------------------------ helpers */

/* Look NAME up in PARENT for a change: its inode pinned in *out and its
 * key. When it does not exist: ENOENT if MUST_EXIST, else 0 and NULL. */
static int find_child(struct fs *fs, fuse_ino_t parent, const char *name,
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
static int child_key(struct fs *fs, fuse_ino_t parent_ino, const char *name,
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
    else if (len > NAMES_NAME_MAX)
        err = ENAMETOOLONG;
    else if (!names_is_valid(name, len))
        err = EINVAL;
    else if ((*key = names_child_key(parent->key, name, len, dir)) == NULL)
        err = ENOMEM;
    else if (strlen(*key) > NAMES_KEY_MAX)
        err = ENAMETOOLONG; /* S3's limit: the server would refuse it */
    inode_table_unlock(fs->inodes);
    if (err != 0) {
        free(*key);
        *key = NULL;
    }
    inode_put(fs->inodes, parent);
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

/* ENOTEMPTY when directory DIR_KEY has anything in it (in the bucket, or
 * staged here). */
static int check_empty(struct fs *fs, const char *dir_key)
{
    struct s3xml_listing page;

    if (is_staged_pending_under(fs, dir_key))
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
    char *key = NULL;
    int err;

    memset(entry, 0, sizeof(*entry));
    *out = NULL;
    if (fs->writer == NULL)
        return EROFS;
    err = child_key(fs, parent, name, false, &key);
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
        struct writer_meta meta = {S_IFREG | (mode & 07777), uid, gid, attrs.mtime};
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
        fs_handle_add(fs, &fs->open_files, &file->link);
        patch_parent(fs, key, &attrs);
        entry_changed(fs, key);
    } else {
        fs_forget(fs, inode->ino, 1);
    }
out:
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

    put_meta_of(meta, DIRECTORY_CONTENT_TYPE, &put_meta);
    if (attrs != NULL)
        put_meta_extras(attrs, &put_meta);
    return s3_put_object(fs->s3, dir_key, &body, &put_meta, NULL);
}

/* PUT a directory marker for DIR_KEY with META. */
static int put_marker(struct fs *fs, const char *dir_key,
                      const struct writer_meta *meta)
{
    return put_marker_with(fs, dir_key, meta, NULL);
}

int fs_mkdir(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
             uid_t uid, gid_t gid, struct fs_entry *entry)
{
    struct writer_meta meta = {S_IFDIR | (mode & 07777), uid, gid, clock_wall_now()};
    struct inode_attrs attrs;
    char *key = NULL;

    memset(entry, 0, sizeof(*entry));
    if (fs->writer == NULL)
        return EROFS;
    int err = child_key(fs, parent, name, true, &key);
    if (err == 0)
        err = put_marker(fs, key, &meta);
    if (err != 0)
        goto out;
    fs_dir_attrs(fs, &attrs);
    attrs.mode = mode & 07777;
    attrs.uid = uid;
    attrs.gid = gid;
    attrs.mtime = meta.mtime;
    attrs.headers_known = true;
    inode_table_lock(fs->inodes);
    struct inode *inode = inode_ref_locked(fs->inodes, key, &attrs);
    if (inode != NULL) {
        /* a new directory is empty: lookups in it need no LIST */
        struct inode_listing *empty = calloc(1, sizeof(*empty));
        if (empty != NULL) {
            empty->fetched_at = clock_monotonic_seconds();
            inode_set_listing_locked(fs->inodes, inode, empty);
        }
        fs_fill_entry(fs, inode, entry);
    }
    inode_table_unlock(fs->inodes);
    if (inode == NULL) {
        err = ENOMEM;
    } else {
        patch_parent(fs, key, &attrs);
        entry_changed(fs, key);
    }
out:
    free(key);
    return err;
}

int fs_rmdir(struct fs *fs, fuse_ino_t parent, const char *name)
{
    struct inode *inode = NULL;
    char *key = NULL;

    if (fs->writer == NULL)
        return EROFS;
    int err = find_child(fs, parent, name, true, &inode, &key);
    if (err != 0)
        goto out;
    inode_table_lock(fs->inodes);
    bool is_dir = inode->attrs.kind == INODE_DIR;
    inode_table_unlock(fs->inodes);
    if (!is_dir) {
        err = ENOTDIR;
        goto out;
    }
    err = check_empty(fs, key);
    if (err == 0)
        err = s3_delete_object(fs->s3, key);
    if (err != 0)
        goto out;
    inode_table_lock(fs->inodes);
    inode_unlink_locked(fs->inodes, inode);
    inode_table_unlock(fs->inodes);
    metacache_forget_listing(fs->conf.cache, key);
    patch_parent(fs, key, NULL);
    entry_changed(fs, key);
out:
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    return err;
}

/* ------------------------------------------------------ unlink, symlink */

/*
 * KEY was removed from its directory. A directory that existed only as the
 * prefix of its keys would vanish with its last one, though nobody removed
 * it: when the cached listing says it is now empty and the bucket agrees,
 * give it a marker.
 */
static void keep_parent_dir(struct fs *fs, const char *key)
{
    char *parent_key = parent_of(key);
    struct s3xml_listing page;
    bool emptied = false;

    if (parent_key == NULL || parent_key[0] == '\0' ||
        strcmp(parent_key, fs->conf.root_key) == 0) {
        free(parent_key);
        return;
    }
    inode_table_lock(fs->inodes);
    struct inode *dir = inode_find_locked(fs->inodes, parent_key);
    emptied = dir != NULL && dir->listing != NULL && dir->listing->count == 0;
    inode_table_unlock(fs->inodes);
    if (emptied && s3_list_objects(fs->s3, parent_key, NULL, NULL, NULL, 1, &page) == 0) {
        bool gone = page.object_count == 0 && page.prefix_count == 0;
        s3xml_listing_free(&page);
        if (gone) {
            struct writer_meta meta = {S_IFDIR | fs->conf.dir_mode, fs->conf.uid,
                                       fs->conf.gid, clock_wall_now()};
            put_marker(fs, parent_key, &meta);
        }
    }
    free(parent_key);
}

int fs_unlink(struct fs *fs, fuse_ino_t parent, const char *name)
{
    struct writer_file *wfile = NULL;
    struct inode *inode = NULL;
    char *key = NULL;

    if (fs->writer == NULL)
        return EROFS;
    int err = find_child(fs, parent, name, true, &inode, &key);
    if (err != 0)
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
    patch_parent(fs, key, NULL);
    entry_changed(fs, key);
    keep_parent_dir(fs, key);
out:
    if (wfile != NULL)
        fs_staged_put(fs, inode, &wfile);
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    return err;
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
    char *key = NULL;

    memset(entry, 0, sizeof(*entry));
    int err = child_key(fs, parent, name, false, &key);
    put_meta_of(meta, NULL, &put_meta);
    put_meta_extras(attrs, &put_meta);
    if (err == 0)
        err = s3_put_object(fs->s3, key, body, &put_meta, attrs->etag);
    if (err != 0)
        goto out;
    metacache_put_attrs(fs->conf.cache, key, attrs);
    inode_table_lock(fs->inodes);
    struct inode *inode = inode_ref_locked(fs->inodes, key, attrs);
    if (inode != NULL) {
        free(inode->symlink_target);
        inode->symlink_target = symlink_target ? strdup(symlink_target) : NULL;
        fs_fill_entry(fs, inode, entry);
    }
    inode_table_unlock(fs->inodes);
    if (inode == NULL) {
        err = ENOMEM;
    } else {
        patch_parent(fs, key, attrs);
        entry_changed(fs, key);
    }
out:
    free(key);
    return err;
}

int fs_symlink(struct fs *fs, const char *target, fuse_ino_t parent,
               const char *name, uid_t uid, gid_t gid, struct fs_entry *entry)
{
    struct writer_meta meta = {S_IFLNK | 0777, uid, gid, clock_wall_now()};
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
    struct writer_meta meta = {inode_kind_type(kind) | (mode & 07777), uid, gid,
                               clock_wall_now()};
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

int fs_link(struct fs *fs)
{
    (void)fs;
    return EPERM; /* S3 has no hard links */
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
static int copy_object(struct fs *fs, const char *src_key, const char *etag,
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

    put_meta_of(meta, NULL, &put_meta);
    put_meta_extras(attrs, &put_meta);
    err = copy_object(fs, key, attrs->etag, attrs->size, key, &put_meta, etag,
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
    char *key = NULL;
    int err = 0;

    if (inode == NULL)
        return ENOENT;
    if (fs->writer == NULL) {
        err = EROFS;
        goto out;
    }
    key = inode_key_dup(fs->inodes, inode);
    if (key == NULL) {
        err = ENOMEM;
        goto out;
    }

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
        meta_of_attrs(&attrs, &meta);
        struct writer_meta before = meta;
        struct timespec atime_before = attrs.atime;
        if (to_set & FUSE_SET_ATTR_ATIME_NOW)
            attrs.atime = clock_wall_now();
        else if (to_set & FUSE_SET_ATTR_ATIME)
            attrs.atime = want->st_atim;
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
        if (attrs.kind != INODE_DIR || key[0] != '\0')
            patch_parent(fs, key, &attrs);
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
    fs_staged_put(fs, inode, &wfile);
    fs_maybe_detach(fs, inode);
    inode_put(fs->inodes, inode);
    free(key);
    return err;
}

/* ------------------------------------------------------ rename */

struct move_job {
    struct fs *fs;
    const char *src_key;
    char *dst_key;
    uint64_t size;
    char etag[S3_ETAG_MAX];
    char new_etag[S3_ETAG_MAX];
    bool delete_only;
    int err;
    pthread_mutex_t *lock;
    pthread_cond_t *done;
    size_t *pending;
};

static void move_job_main(void *arg)
{
    struct move_job *job = arg;

    uint64_t size;

    if (job->delete_only)
        job->err = s3_delete_object(job->fs->s3, job->src_key);
    else
        job->err = copy_object(job->fs, job->src_key, job->etag, job->size,
                               job->dst_key, NULL, job->new_etag, &size);
    pthread_mutex_lock(job->lock);
    if (--*job->pending == 0)
        pthread_cond_signal(job->done);
    pthread_mutex_unlock(job->lock);
}

/* Run JOBS (copies or deletes) on the worker pool, COUNT at a time. */
static void run_move_jobs(struct fs *fs, struct move_job *jobs, size_t count)
{
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t done = PTHREAD_COND_INITIALIZER;
    size_t pending = count;

    for (size_t i = 0; i < count; i++) {
        jobs[i].fs = fs;
        jobs[i].lock = &lock;
        jobs[i].done = &done;
        jobs[i].pending = &pending;
        if (!jobs[i].delete_only && jobs[i].size > UPLOAD_MAX_COPY_SIZE) {
            /* multipart copy waits on the pool: not from inside it */
            move_job_main(&jobs[i]);
        } else if (workers_submit(fs->workers, move_job_main, &jobs[i]) != 0) {
            move_job_main(&jobs[i]);
        }
    }
    pthread_mutex_lock(&lock);
    while (pending > 0)
        pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
}

/* Server-side move of every key under SRC_PREFIX to DST_PREFIX: copies
 * first (a batch at a time, in parallel), deletes after, so a failure
 * leaves every key somewhere. Not atomic (documented). */
static int move_prefix(struct fs *fs, const char *src_prefix, const char *dst_prefix)
{
    size_t src_len = strlen(src_prefix);
    bool had_marker = false;
    char *moved[MOVE_BATCH];      /* the keys the last batch deleted */
    size_t moved_count = 0;
    int err = 0;

    /* each batch is copied then deleted, so listing from the start again
     * finds the next one, until nothing is left */
    for (;;) {
        struct s3xml_listing page;
        struct move_job jobs[MOVE_BATCH];
        size_t count = 0;

        err = s3_list_objects(fs->s3, src_prefix, NULL, NULL, NULL, MOVE_BATCH,
                              &page);
        if (err != 0)
            break;
        /* a key the last batch deleted, listed again: the loop would copy
         * and delete it forever (keys are compared, not their order, which
         * some servers do not keep) */
        for (size_t i = 0; err == 0 && i < page.object_count; i++)
            for (size_t j = 0; err == 0 && j < moved_count; j++)
                if (strcmp(page.objects[i].key, moved[j]) == 0) {
                    log_error("rename of %s: '%s' is still listed after its "
                              "delete; stopping", src_prefix, moved[j]);
                    err = EIO;
                }
        if (err != 0) {
            s3xml_listing_free(&page);
            break;
        }
        memset(jobs, 0, sizeof(jobs));
        for (size_t i = 0; i < page.object_count && count < MOVE_BATCH; i++) {
            const struct s3xml_object *object = &page.objects[i];
            if (strcmp(object->key, src_prefix) == 0)
                had_marker = true;
            if (asprintf(&jobs[count].dst_key, "%s%s", dst_prefix,
                         object->key + src_len) < 0) {
                jobs[count].dst_key = NULL;
                err = ENOMEM;
                break;
            }
            jobs[count].src_key = object->key;
            jobs[count].size = object->size;
            snprintf(jobs[count].etag, sizeof(jobs[count].etag), "%s",
                     object->etag ? object->etag : "");
            count++;
        }
        if (err == 0)
            run_move_jobs(fs, jobs, count);
        for (size_t i = 0; err == 0 && i < count; i++)
            err = jobs[i].err;
        if (err == 0) {
            for (size_t i = 0; i < count; i++)
                jobs[i].delete_only = true;
            run_move_jobs(fs, jobs, count);
            for (size_t i = 0; err == 0 && i < count; i++)
                err = jobs[i].err;
        }
        for (size_t i = 0; i < moved_count; i++)
            free(moved[i]);
        moved_count = 0;
        for (size_t i = 0; i < count; i++) {
            free(jobs[i].dst_key);
            if (err == 0 && (moved[moved_count] = strdup(jobs[i].src_key)) != NULL)
                moved_count++;
        }
        s3xml_listing_free(&page);
        if (err != 0 || count == 0)
            break;
    }
    for (size_t i = 0; i < moved_count; i++)
        free(moved[i]);
    if (err == 0 && !had_marker) {
        struct writer_meta meta = {S_IFDIR | fs->conf.dir_mode, fs->conf.uid,
                                   fs->conf.gid, clock_wall_now()};
        err = put_marker(fs, dst_prefix, &meta);
    }
    return err;
}

/* Delete the object under the key of INODE, a file with a promise in the
 * journal (held): it is an older version, or a replaced file's object.
 * This comes before the promise leaves the key (writer_file_rename(),
 * writer_file_forget()), so that a crash in between leaves the name with
 * its last promise, never with that older version. */
static int drop_older_object(struct fs *fs, struct inode *inode)
{
    char *key = NULL;
    int err = 0;

    inode_table_lock(fs->inodes);
    if (inode->attrs.etag[0] != '\0' || inode->object_unknown)
        key = strdup(inode->key);
    bool none = key == NULL && inode->attrs.etag[0] == '\0' &&
                !inode->object_unknown;
    inode_table_unlock(fs->inodes);
    if (none)
        return 0;
    if (key == NULL)
        return ENOMEM;
    err = s3_delete_object(fs->s3, key);
    if (err == 0) {
        inode_table_lock(fs->inodes);
        if (strcmp(inode->key, key) == 0) {
            inode->attrs.etag[0] = '\0'; /* nothing under the key now */
            inode->object_unknown = inode->replaced_object = false;
        }
        inode_table_unlock(fs->inodes);
    }
    free(key);
    return err;
}

/* One staged file under a directory being renamed. */
struct staged_move {
    struct inode *inode;          /* pinned */
    struct writer_file *wfile;    /* for fs_staged_put */
    char *new_key;
};

struct staged_rename {
    const char *src_prefix, *dst_prefix;
    struct staged_move *files;
    size_t count, capacity;
};

static void collect_staged(void *arg, struct inode *inode)
{
    struct staged_rename *rename = arg;
    size_t len = strlen(rename->src_prefix);

    if (rename->count == rename->capacity) {
        size_t capacity = rename->capacity ? rename->capacity * 2 : 16;
        void *files = realloc(rename->files, capacity * sizeof(*rename->files));
        if (files == NULL)
            return;
        rename->files = files;
        rename->capacity = capacity;
    }
    char *key = NULL;
    if (asprintf(&key, "%s%s", rename->dst_prefix, inode->key + len) < 0)
        return;
    inode_pin_locked(inode);
    rename->files[rename->count] = (struct staged_move){
        .inode = inode, .wfile = fs_staged_get_locked(inode), .new_key = key,
    };
    rename->count++;
}

static int rename_dir(struct fs *fs, const char *src_prefix, const char *dst_prefix)
{
    struct staged_rename staged = {src_prefix, dst_prefix, NULL, 0, 0};
    struct fs_dir_move move = {src_prefix, dst_prefix, NULL};
    int err;

    /* files not uploaded yet go to their new names when they are; a
     * listing fetched meanwhile is not kept (fs_get_listing) */
    inode_table_lock(fs->inodes);
    move.next = fs->dir_moves;
    fs->dir_moves = &move;
    fs_staged_visit_locked(fs, src_prefix, collect_staged, &staged);
    inode_table_unlock(fs->inodes);
    size_t held = 0, renamed = 0;
    err = 0;
    /* The objects of all of them move below, as every key does; they are
     * held meanwhile, so that no upload of their new data under the new
     * name lands before the move of their old object there. */
    for (; err == 0 && held < staged.count; held++) {
        struct staged_move *file = &staged.files[held];
        enum writer_renamed state;
        err = writer_file_hold(file->wfile, &state);
        /* a promise leaves its key only once the older version under it is
         * gone, and that version is not moved */
        if (err == 0 && state == WRITER_RENAMED_JOURNALED)
            err = drop_older_object(fs, file->inode);
    }
    for (; err == 0 && renamed < staged.count; renamed++)
        err = writer_file_rename(staged.files[renamed].wfile,
                                 staged.files[renamed].new_key, NULL);
    if (err == 0)
        err = move_prefix(fs, src_prefix, dst_prefix);
    if (err != 0) {
        /* what moved in the bucket stays moved (not atomic); files not
         * uploaded yet go back where the directory still is, before
         * anything of theirs is uploaded under the new name */
        size_t len = strlen(dst_prefix);
        for (size_t i = 0; i < renamed; i++) {
            char *back = NULL;
            if (asprintf(&back, "%s%s", src_prefix, staged.files[i].new_key + len) >= 0)
                writer_file_rename_back(staged.files[i].wfile, back);
            free(back);
        }
    }
    inode_table_lock(fs->inodes);
    if (err == 0)
        err = inode_rekey_prefix_locked(fs->inodes, src_prefix, dst_prefix);
    struct fs_dir_move **link = &fs->dir_moves;
    while (*link != &move)
        link = &(*link)->next;
    *link = move.next;
    pthread_cond_broadcast(&fs->move_done);
    inode_table_unlock(fs->inodes);
    /* uploads may go now: their inodes have the files' keys (fs_uploaded) */
    for (size_t i = 0; i < held; i++)
        writer_file_release(staged.files[i].wfile);
    for (size_t i = 0; i < staged.count; i++) {
        fs_staged_put(fs, staged.files[i].inode, &staged.files[i].wfile);
        inode_put(fs->inodes, staged.files[i].inode);
        free(staged.files[i].new_key);
    }
    free(staged.files);
    if (err != 0)
        return err;
    metacache_forget_listing(fs->conf.cache, src_prefix);
    metacache_forget_listing(fs->conf.cache, dst_prefix);
    return err;
}

/* Rename the file INODE from SRC_KEY to DST_KEY in the bucket, replacing
 * the staged file REPLACED (may be NULL); DST_OBJECT says whether an object
 * may be under DST_KEY. *STATE_OUT says what the file's data was (see
 * writer_file_hold). A staged file is held (writer_file_hold) and handed
 * to the caller in *HELD (a reference for fs_staged_put), to release once
 * the inode has its new key: no upload of it may land under the new name
 * before the old object is moved there. */
static int rename_file(struct fs *fs, struct inode *inode, const char *src_key,
                       const char *dst_key, struct writer_file *replaced,
                       bool dst_object, struct writer_file **held,
                       enum writer_renamed *state_out)
{
    struct writer_file *wfile = NULL;
    struct inode_attrs attrs, object;
    enum writer_renamed state = WRITER_RENAMED_UPLOADED;
    int err = 0;

    *held = NULL;
    *state_out = WRITER_RENAMED_UPLOADED;
    inode_table_lock(fs->inodes);
    if (inode->wfile != NULL)
        wfile = fs_staged_get_locked(inode);
    inode_table_unlock(fs->inodes);

    if (wfile != NULL) {
        err = writer_file_hold(wfile, &state);
        *held = wfile;
    }
    inode_table_lock(fs->inodes);
    attrs = inode->attrs;
    object = inode->attrs; /* the object at the old key, if any */
    /* whether that object is this file's last saved version: not when it
     * is one this file replaced, or when nobody knows (recovery) */
    bool own_object = object.etag[0] != '\0' && !inode->replaced_object &&
                      !inode->object_unknown;
    bool some_object = object.etag[0] != '\0' || inode->object_unknown;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs); /* what was uploaded */
    inode_table_unlock(fs->inodes);
    if (err == 0 && state == WRITER_RENAMED_JOURNALED)
        err = drop_older_object(fs, inode);
    if (err == 0 && wfile != NULL)
        err = writer_file_rename(wfile, dst_key, replaced);
    if (err == 0 && wfile != NULL && state == WRITER_RENAMED_UPLOADED) {
        char etag[S3_ETAG_MAX];
        if (writer_file_etag(wfile, etag))
            snprintf(attrs.etag, sizeof(attrs.etag), "%s", etag);
    }
    if (err == 0 && state == WRITER_RENAMED_UNSAVED && own_object) {
        /* not uploaded yet, and its new bytes saved nowhere else (open,
         * written): the object at the old key is its only saved version,
         * so it moves first, and a crash before the file's upload leaves
         * it under the new name. Whatever version is there now (the
         * inode's ETag may be older than a copy's): a HEAD says. */
        struct s3_object_info info;
        char etag[S3_ETAG_MAX] = "";
        uint64_t size;
        err = s3_head_object(fs->s3, src_key, &info);
        if (err == 0)
            err = copy_object(fs, src_key, info.etag, info.size, dst_key, NULL,
                              etag, &size);
        if (err == 0 || err == ENOENT)
            err = s3_delete_object(fs->s3, src_key);
    } else if (err == 0 && state != WRITER_RENAMED_UPLOADED) {
        /* not uploaded yet: only where it goes changes; an object under
         * the old name goes away as rename says (journaled: gone above) */
        if (state == WRITER_RENAMED_UNSAVED && some_object)
            err = s3_delete_object(fs->s3, src_key);
        /* saved nowhere (never closed, no older version): the object the
         * rename replaces is not kept until this file's upload, for a
         * crash before it would bring the replaced file back */
        if (err == 0 && state == WRITER_RENAMED_UNSAVED && dst_object)
            err = s3_delete_object(fs->s3, dst_key);
        if (err == 0 && state == WRITER_RENAMED_UNSAVED) {
            inode_table_lock(fs->inodes);
            inode->attrs.etag[0] = '\0'; /* nothing under the new key */
            inode_table_unlock(fs->inodes);
        }
    } else if (err == 0) {
        char etag[S3_ETAG_MAX] = "";
        err = copy_object(fs, src_key, attrs.etag, attrs.size, dst_key, NULL,
                          etag, &attrs.size);
        if (err == 0)
            err = s3_delete_object(fs->s3, src_key);
        if (err == 0 && etag[0] != '\0')
            snprintf(attrs.etag, sizeof(attrs.etag), "%s", etag);
        if (err == 0) {
            inode_table_lock(fs->inodes);
            inode->attrs = attrs;
            inode_table_unlock(fs->inodes);
            if (attrs.headers_known)
                metacache_put_attrs(fs->conf.cache, dst_key, &attrs);
        }
    }
    if (err != 0 && wfile != NULL)
        writer_file_rename_back(wfile, src_key); /* back where it was */
    if (err == 0)
        *state_out = state;
    return err;
}

int fs_rename(struct fs *fs, fuse_ino_t parent, const char *name,
              fuse_ino_t new_parent, const char *new_name, unsigned flags)
{
    struct inode *src = NULL, *dst = NULL;
    char *src_key = NULL, *dst_key = NULL, *dst_file_key = NULL;
    struct writer_file *dst_wfile = NULL, *held = NULL;
    int err;

    if (fs->writer == NULL)
        return EROFS;
    if (flags & ~(unsigned)RENAME_NOREPLACE)
        return EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
    err = find_child(fs, parent, name, true, &src, &src_key);
    if (err == 0)
        err = find_child(fs, new_parent, new_name, false, &dst, &dst_key);
    if (err != 0)
        goto out;

    inode_table_lock(fs->inodes);
    bool src_dir = src->attrs.kind == INODE_DIR && src->wfile == NULL;
    bool dst_dir = dst != NULL && dst->attrs.kind == INODE_DIR && dst->wfile == NULL;
    inode_table_unlock(fs->inodes);
    if (dst != NULL) {
        if (dst == src)
            goto out; /* the same file: nothing to do */
        if (flags & RENAME_NOREPLACE)
            err = EEXIST;
        else if (src_dir && !dst_dir)
            err = ENOTDIR;
        else if (!src_dir && dst_dir)
            err = EISDIR;
        else if (dst_dir)
            err = check_empty(fs, dst_key);
        if (err != 0)
            goto out;
    }
    err = child_key(fs, new_parent, new_name, src_dir, &dst_file_key);
    if (err != 0)
        goto out;
    if (src_dir && strncmp(dst_file_key, src_key, strlen(src_key)) == 0) {
        err = EINVAL; /* into itself */
        goto out;
    }

    /* a file replaced by the rename never reaches the bucket; its journal
     * entry goes once the rename is done (or with the move of the source's
     * entry, in the same journal transaction): a crash before leaves the
     * version it promised */
    char dst_etag[S3_ETAG_MAX] = "";  /* the object under the target's key */
    bool dst_unknown = false;
    if (dst != NULL && !dst_dir) {
        inode_table_lock(fs->inodes);
        snprintf(dst_etag, sizeof(dst_etag), "%s", dst->attrs.etag);
        dst_unknown = dst->object_unknown;
        bool open = dst->open_handles > 0 && dst->attrs.kind == INODE_FILE;
        if (dst->wfile != NULL)
            dst_wfile = fs_staged_get_locked(dst);
        inode_table_unlock(fs->inodes);
        /* descriptors still open on the target read and write on after the
         * rename, as after an unlink: its data is kept staged, and whole,
         * before its object is replaced (an edit would fetch its missing
         * bytes from the object the rename puts there) */
        if (dst_wfile == NULL && open)
            err = fs_stage_file(fs, dst, false, &dst_wfile);
        if (err == 0 && dst_wfile != NULL && open)
            err = writer_file_complete(dst_wfile);
        if (err != 0)
            goto out;
        if (dst_wfile != NULL)
            writer_file_unlink(dst_wfile, false);
    }

    /* the empty target directory is replaced: its marker goes first, so
     * that the moved one takes its place */
    if (dst_dir)
        err = s3_delete_object(fs->s3, dst_key);
    enum writer_renamed state = WRITER_RENAMED_UPLOADED;
    if (err == 0)
        err = src_dir ? rename_dir(fs, src_key, dst_file_key)
                      : rename_file(fs, src, src_key, dst_file_key, dst_wfile,
                                    dst_etag[0] != '\0' || dst_unknown, &held,
                                    &state);
    if (err != 0) {
        if (dst_wfile != NULL)
            writer_file_relink(dst_wfile); /* the target stays */
        goto out;
    }
    if (dst_wfile != NULL)
        writer_file_forget(dst_wfile);

    struct inode_attrs attrs;
    inode_table_lock(fs->inodes);
    if (dst != NULL)
        inode_unlink_locked(fs->inodes, dst);
    if (!src_dir)
        err = inode_rekey_locked(fs->inodes, src, dst_file_key);
    if (!src_dir && state == WRITER_RENAMED_JOURNALED) {
        /* the replaced file's object stays under the key until this one's
         * upload replaces it; it goes if this one leaves first */
        snprintf(src->attrs.etag, sizeof(src->attrs.etag), "%s", dst_etag);
        src->replaced_object = dst_etag[0] != '\0';
        src->object_unknown = dst_unknown;
    } else if (!src_dir && state == WRITER_RENAMED_UNSAVED) {
        /* its own saved version moved here, or nothing is here */
        src->replaced_object = src->object_unknown = false;
    }
    fs_touch_locked(src, false);
    attrs = src->attrs;
    if (src->wfile != NULL)
        fs_staged_attrs_locked(fs, src, &attrs);
    inode_table_unlock(fs->inodes);
    patch_parent(fs, src_key, NULL);
    patch_parent(fs, dst_file_key, &attrs);
    entry_changed(fs, src_key);
    entry_changed(fs, dst_file_key);
out:
    if (held != NULL) { /* the inode has the file's key again: uploads may go */
        writer_file_release(held);
        fs_staged_put(fs, src, &held);
    }
    if (dst != NULL) {
        fs_staged_put(fs, dst, &dst_wfile);
        fs_maybe_detach(fs, dst);
        inode_put(fs->inodes, dst);
    }
    if (src != NULL)
        inode_put(fs->inodes, src);
    free(src_key);
    free(dst_key);
    free(dst_file_key);
    return err;
}
