/*
 * fs_file.c - open files: open (a version to read, or the staged data of a
 * file being written; a version opened is told to the access log), read
 * (into a buffer, or into a pipe without a copy), release, and readlink.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/access_log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"

static void release_file_handle(struct fs *fs, struct fs_handle *handle)
{
    fs_release(fs, (struct fs_file *)handle);
}

void fs_file_link(struct fs *fs, struct fs_file *file)
{
    fs_handle_add(fs, &fs->open_files, &file->link, release_file_handle);
}

int fs_open(struct fs *fs, fuse_ino_t ino, int flags, struct fs_file **out,
            bool *keep_cache)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct inode_attrs attrs;
    struct fs_file *file = NULL;
    bool writing = (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
    char *key = NULL;
    int err = 0;

    *out = NULL;
    *keep_cache = false;
    if (inode == NULL)
        return ENOENT;
    if (writing && fs->writer == NULL) {
        err = EROFS;
        goto out;
    }
    inode_table_lock(fs->inodes);
    attrs = inode->attrs;
    bool staged = inode->wfile != NULL;
    double attr_ttl = fs_attr_ttl(fs, inode->key);
    inode_table_unlock(fs->inodes);
    if (attrs.kind == INODE_DIR && !staged) {
        err = EISDIR;
        goto out;
    }
    if (attrs.kind != INODE_FILE && attrs.kind != INODE_SYMLINK && !staged) {
        /* the kernel opens FIFOs and devices itself (nodev) and refuses
         * sockets: only a race with a change of type gets here */
        err = ENXIO;
        goto out;
    }
    file = calloc(1, sizeof(*file));
    if (file == NULL) {
        err = ENOMEM;
        goto out;
    }
    file->ino = ino;

    /* close-to-open: revalidate what is older than the attribute TTL */
    if (!staged && !(flags & O_TRUNC) &&
        clock_monotonic_seconds() - attrs.fetched_at >= attr_ttl) {
        err = fs_revalidate_file(fs, inode, &attrs);
        if (err != 0)
            goto out;
        inode_table_lock(fs->inodes);
        if (inode->wfile == NULL)
            inode_update_attrs_locked(inode, &attrs);
        inode_table_unlock(fs->inodes);
    }

    if (staged || writing) {
        /* the staged data is what this file is now */
        err = fs_stage_file(fs, inode, (flags & O_TRUNC) != 0, &file->wfile);
        /* O_TRUNC is a change even of an empty file: mtime and ctime */
        if (err == 0 && (flags & O_TRUNC))
            err = writer_file_truncate(file->wfile, 0);
        if (err != 0)
            goto out;
        if (writing) {
            file->writable = true;
            file->append = (flags & O_APPEND) != 0;
            writer_file_open_writer(file->wfile);
            inode_table_lock(fs->inodes);
            inode->write_handles++;
            inode->open_handles++; /* (counted together) */
            inode_table_unlock(fs->inodes);
        }
        goto out;
    }

    inode_table_lock(fs->inodes);
    uint64_t version = fs_version_tag(attrs.etag);
    *keep_cache = version != 0 && inode->opened_version == version;
    inode->opened_version = version;
    key = strdup(inode->key);
    inode_table_unlock(fs->inodes);
    if (key != NULL)
        fs_note_read_open(fs, inode, key);
    err = key == NULL ? ENOMEM
                      : reader_open(fs->reader, key, attrs.etag, attrs.size,
                                    &file->reader_file);
    if (err == 0)
        access_log_opened(fs->conf.access_log, key, attrs.etag);
out:
    if (err != 0 && file != NULL) {
        fs_staged_put(fs, inode, &file->wfile);
        free(file);
        file = NULL;
    }
    if (err != 0) {
        fs_maybe_detach(fs, inode);
    } else {
        if (!file->writable) {
            inode_table_lock(fs->inodes);
            inode->open_handles++;
            inode_table_unlock(fs->inodes);
        }
        fs_file_link(fs, file);
    }
    inode_put(fs->inodes, inode);
    free(key);
    *out = file;
    return err;
}

int fs_read(struct fs *fs, struct fs_file *file, uint64_t offset, size_t size,
            char *buf, size_t *got)
{
    struct writer_file *staged = __atomic_load_n(&file->wfile, __ATOMIC_ACQUIRE);
    if (staged != NULL)
        return writer_file_read(staged, offset, size, buf, got);
    int err = reader_read(file->reader_file, offset, size, buf, got);
    if (err == ENOENT || err == ESTALE) {
        /* unlinked or replaced while open: its data was kept staged */
        struct inode *inode = inode_get(fs->inodes, file->ino);
        struct writer_file *kept = NULL;
        if (inode != NULL) {
            inode_table_lock(fs->inodes);
            if (inode->unlinked && inode->wfile != NULL)
                kept = fs_staged_get_locked(inode);
            inode_table_unlock(fs->inodes);
        }
        if (kept != NULL) {
            /* concurrent reads of this handle may all get here: one sets
             * it; the reader stays open until release */
            struct writer_file *none = NULL;
            if (!__atomic_compare_exchange_n(&file->wfile, &none, kept, false,
                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                fs_staged_put(fs, inode, &kept);
            err = writer_file_read(file->wfile, offset, size, buf, got);
        }
        if (inode != NULL)
            inode_put(fs->inodes, inode);
    }
    return err;
}

int fs_read_pipe(struct fs *fs, struct fs_file *file, uint64_t offset,
                 size_t size, int pipe_write, struct cache_holds *holds,
                 size_t *got)
{
    (void)fs;
    *got = 0;
    if (__atomic_load_n(&file->wfile, __ATOMIC_ACQUIRE) != NULL ||
        file->reader_file == NULL)
        return EOPNOTSUPP; /* staged data: fs_read() */
    return reader_read_pipe(file->reader_file, offset, size, pipe_write, holds,
                            got);
}

void fs_release(struct fs *fs, struct fs_file *file)
{
    if (file == NULL)
        return;
    fs_handle_remove(fs, &file->link);
    reader_close(&file->reader_file);
    struct inode *inode = inode_get(fs->inodes, file->ino);
    if (inode != NULL) {
        inode_table_lock(fs->inodes);
        inode->open_handles--;
        if (file->writable)
            inode->write_handles--;
        inode_table_unlock(fs->inodes);
    }
    if (file->wfile != NULL) {
        if (file->writable)
            writer_file_close_writer(file->wfile);
        if (inode != NULL)
            fs_staged_put(fs, inode, &file->wfile);
        else
            writer_file_put(&file->wfile);
    }
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(file);
}

int fs_readlink(struct fs *fs, fuse_ino_t ino, char **target)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct inode_attrs attrs;
    char *text = NULL, *key = NULL;
    size_t got = 0;
    int err = 0;

    *target = NULL;
    if (inode == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    attrs = inode->attrs;
    if (inode->symlink_target != NULL)
        text = strdup(inode->symlink_target);
    inode_table_unlock(fs->inodes);
    if (attrs.kind != INODE_SYMLINK) {
        err = EINVAL;
        goto out;
    }
    if (text != NULL)
        goto out;
    /* read once, even across remounts (the index keeps it per version) */
    key = inode_key_dup(fs->inodes, inode);
    if (key == NULL) {
        err = ENOMEM;
        goto out;
    }
    if (metacache_get_link(fs->conf.cache, key, attrs.etag, &text) == 0)
        goto remember;
    if (attrs.size == 0 || attrs.size > FS_TYPED_OBJECT_MAX) {
        log_warn("symlink %llu has an invalid target length %llu",
                 (unsigned long long)ino, (unsigned long long)attrs.size);
        err = EIO;
        goto out;
    }
    text = calloc(1, (size_t)attrs.size + 1);
    err = text == NULL ? ENOMEM
        : s3_get_object_range(fs->s3, key, 0, (size_t)attrs.size,
                              attrs.etag[0] ? attrs.etag : NULL, text, &got, NULL);
    if (err == 0 && (got != attrs.size || memchr(text, '\0', got) != NULL))
        err = EIO;
    if (err == 0 && attrs.etag[0] != '\0')
        metacache_put_link(fs->conf.cache, key, attrs.etag, text);
remember:
    if (err == 0) {
        inode_table_lock(fs->inodes);
        if (inode->symlink_target == NULL &&
            strcmp(inode->attrs.etag, attrs.etag) == 0)
            inode->symlink_target = strdup(text);
        inode_table_unlock(fs->inodes);
    }
out:
    free(key);
    inode_put(fs->inodes, inode);
    if (err != 0) {
        free(text);
        text = NULL;
    }
    *target = text;
    return err;
}
