/*
 * fs_stage.c - the glue between inodes and the writer's staged files: an
 * inode gets one staged file while it is written or waits for its upload
 * (fs->staged is the set of those inodes), keeps it while any reference of
 * the fs layer uses it, and lets it go when nothing does. The writer's
 * callbacks land here: an upload finished (the inode learns its object),
 * a journaled file recovered at mount, the bytes of an edit's base.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"

#define FETCH_CHUNK (1u << 20)      /* fetching the base of an edit */

static int compare_pointers(const void *a, const void *b)
{
    return a < b ? -1 : a > b;
}

static void *owner_of(fuse_ino_t ino)
{
    return (void *)(uintptr_t)ino;
}

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
    fs_writer_meta_of(&attrs, &meta);
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
        inode->detaching = true;
        tdelete(inode, &fs->staged, compare_pointers);
    }
    inode_table_unlock(fs->inodes);
    if (wfile == NULL)
        return;
    writer_file_put(&wfile); /* the data becomes cached blocks */
    inode_table_lock(fs->inodes);
    inode->detaching = false;
    pthread_cond_broadcast(&fs->detach_done);
    inode_table_unlock(fs->inodes);
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

    if (etag == NULL) {
        /* failed, and perhaps landed all the same: where the inode knew
         * of no object under the key, a rename or unlink now deletes it
         * (else the file came back under its old name). Where it knew of
         * one, the object there is one of this file's versions anyway. */
        if (inode == NULL)
            return;
        inode_table_lock(fs->inodes);
        if (inode->wfile == file && !inode->unlinked &&
            strcmp(inode->key, key) == 0 && inode->attrs.etag[0] == '\0')
            inode->object_unknown = true;
        inode_table_unlock(fs->inodes);
        inode_put(fs->inodes, inode);
        return;
    }
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
            inode->opened_version = fs_version_tag(etag);
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
        fs_patch_parent(fs, key, &attrs);
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

static void no_free(void *node)
{
    (void)node;
}

void fs_staged_detach_all(struct fs *fs)
{
    for (;;) {
        inode_table_lock(fs->inodes);
        struct inode *inode = NULL;
        if (fs->staged != NULL) {
            inode = *(struct inode **)fs->staged; /* the tree's root */
            tdelete(inode, &fs->staged, compare_pointers);
        }
        struct writer_file *wfile = inode != NULL ? inode->wfile : NULL;
        if (inode != NULL)
            inode->wfile = NULL;
        inode_table_unlock(fs->inodes);
        if (inode == NULL)
            break;
        writer_file_put(&wfile);
        inode_put(fs->inodes, inode);
    }
}

void fs_staged_forget_all(struct fs *fs)
{
    tdestroy(fs->staged, no_free);
    fs->staged = NULL;
}
