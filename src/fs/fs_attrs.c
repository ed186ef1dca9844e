/*
 * fs_attrs.c - the attributes the fs layer shows: of a directory, of a
 * file as a listing or a HEAD tells them, of a staged file, with the
 * times only this mount knows; and struct stat / fuse entries made of
 * them; the headers already known for a listed file (inode table, then
 * the index: fs_known_file_attrs()), and whether a directory's lookups
 * are followed by reads. No requests: called with the inode table lock
 * held where an inode is read.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/clock.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"

#define READ_PATTERN_MIN 8   /* see fs_reads_follow_lookups_locked() */
#include "base/log.h"
#include "fs/metacache.h"
#include "fs/names.h"

void fs_dir_attrs(const struct fs *fs, struct inode_attrs *out)
{
    *out = (struct inode_attrs){
        .kind = INODE_DIR,
        .mtime = fs->mount_time,
        .mode = fs->conf.dir_mode,
        .uid = fs->conf.uid,
        .gid = fs->conf.gid,
        .fetched_at = clock_monotonic_seconds(),
    };
}

bool fs_marker_attrs(const struct fs *fs, const char *dir_key,
                     struct inode_attrs *out)
{
    struct writer_meta meta;

    if (fs->writer == NULL || !writer_marker_pending(fs->writer, dir_key, &meta))
        return false;
    fs_dir_attrs(fs, out);
    out->mode = meta.mode & 07777;
    out->uid = meta.uid;
    out->gid = meta.gid;
    out->mtime = meta.mtime;
    out->atime = meta.atime;
    out->headers_known = true;
    return true;
}

void fs_head_file_attrs(const struct fs *fs, const char *key,
                        const struct s3_object_info *answer,
                        struct inode_attrs *out)
{
    struct s3_object_info plain;
    const struct s3_object_info *info = answer;

    if (fs_headerless(fs, key)) {
        /* (so that a file looked up without a listing shows as one found
         * in a listing does) */
        plain = *answer;
        plain.has_mode = plain.has_uid = plain.has_gid = false;
        plain.has_mtime = plain.has_atime = plain.has_ctime = false;
        plain.has_rdev = false;
        info = &plain;
    }
    *out = (struct inode_attrs){
        .kind = INODE_FILE,
        .size = info->size,
        .mtime = info->has_mtime ? info->mtime : info->last_modified,
        .mode = fs->conf.file_mode,
        .uid = info->has_uid ? info->uid : fs->conf.uid,
        .gid = info->has_gid ? info->gid : fs->conf.gid,
        .headers_known = true,
        .fetched_at = clock_monotonic_seconds(),
    };
    if (info->has_mode) {
        out->mode = info->mode & 07777;
        /* a symlink, FIFO, socket or device node (s3fs's convention);
         * an object is never a directory, and one larger than
         * FS_TYPED_OBJECT_MAX is a regular file: no link has so long a
         * target, no special file has bytes (and a readdirplus that did
         * not HEAD it said DT_REG) */
        out->kind = inode_kind_of_mode(info->mode);
        if (out->kind == INODE_DIR || info->size > FS_TYPED_OBJECT_MAX)
            out->kind = INODE_FILE;
    }
    if (info->has_atime)
        out->atime = info->atime;
    if (info->has_ctime)
        out->ctime = info->ctime;
    if (info->has_rdev && (out->kind == INODE_CHARDEV || out->kind == INODE_BLOCKDEV))
        out->rdev = info->rdev;
    snprintf(out->etag, sizeof(out->etag), "%s", info->etag);
}

/* A time the headers did not give (zero) is the mtime. */
static struct timespec time_or_mtime(const struct inode_attrs *attrs,
                                     const struct timespec *when)
{
    return when->tv_sec != 0 || when->tv_nsec != 0 ? *when : attrs->mtime;
}

void fs_attrs_to_stat(const struct fs *fs, fuse_ino_t ino,
                      const struct inode_attrs *attrs, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_mode = (mode_t)(inode_kind_type(attrs->kind) | attrs->mode);
    if (attrs->kind == INODE_DIR) {
        st->st_nlink = 2;
        st->st_size = 4096;
    } else {
        st->st_nlink = 1;
        st->st_size = (off_t)attrs->size;
    }
    if (attrs->kind == INODE_CHARDEV || attrs->kind == INODE_BLOCKDEV)
        st->st_rdev = attrs->rdev;
    st->st_uid = fs->conf.uid_forced ? fs->conf.uid : attrs->uid;
    st->st_gid = fs->conf.gid_forced ? fs->conf.gid : attrs->gid;
    st->st_blksize = 1 << 20;
    st->st_blocks = (blkcnt_t)((attrs->size + 511) / 512);
    st->st_mtim = attrs->mtime;
    st->st_ctim = time_or_mtime(attrs, &attrs->ctime);
    st->st_atim = time_or_mtime(attrs, &attrs->atime);
}

void fs_meta_attrs(const struct writer_meta *meta, uint64_t size, const char *etag,
                   struct inode_attrs *out)
{
    *out = (struct inode_attrs){
        .kind = INODE_FILE,
        .size = size,
        .mtime = meta->mtime,
        .atime = meta->atime,
        .mode = meta->mode & 07777,
        .uid = meta->uid,
        .gid = meta->gid,
        .headers_known = true,
        .fetched_at = clock_monotonic_seconds(),
    };
    snprintf(out->etag, sizeof(out->etag), "%s", etag);
}

void fs_staged_attrs_locked(const struct fs *fs, const struct inode *inode,
                            struct inode_attrs *out)
{
    struct writer_meta meta;
    uint64_t size;

    (void)fs;
    writer_file_info(inode->wfile, &size, &meta, NULL);
    fs_meta_attrs(&meta, size, inode->attrs.etag, out);
}

static bool time_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

void fs_local_times_locked(const struct inode *inode, struct inode_attrs *attrs)
{
    struct timespec ctime = time_or_mtime(attrs, &attrs->ctime);
    struct timespec atime = time_or_mtime(attrs, &attrs->atime);

    if (time_before(&attrs->mtime, &inode->local_mtime))
        attrs->mtime = inode->local_mtime;
    if (time_before(&ctime, &attrs->mtime))
        ctime = attrs->mtime;
    if (time_before(&ctime, &inode->local_ctime))
        ctime = inode->local_ctime;
    attrs->ctime = ctime;
    attrs->atime = atime;
}

void fs_touch_locked(struct inode *inode, bool entries)
{
    struct timespec now = clock_wall_now();

    inode->local_ctime = now;
    if (entries)
        inode->local_mtime = now;
}

uint64_t fs_version_tag(const char *etag)
{
    if (etag[0] == '\0')
        return 0;
    uint64_t tag = XXH3_64bits(etag, strlen(etag));
    return tag != 0 ? tag : 1;
}

/* Whether KEY starts with one of the COUNT PREFIXES. */
static bool under_any(char *const *prefixes, size_t count, const char *key)
{
    for (size_t i = 0; i < count; i++)
        if (strncmp(key, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

bool fs_trusts(const struct fs *fs, const char *key)
{
    return under_any(fs->trusted, fs->conf.trusted_count, key);
}

bool fs_headerless(const struct fs *fs, const char *key)
{
    return under_any(fs->headerless, fs->conf.headerless_count, key);
}

double fs_attr_ttl(const struct fs *fs, const char *key)
{
    return fs_trusts(fs, key) ? FS_TRUSTED_TTL : fs->conf.attr_ttl;
}

double fs_dir_ttl(const struct fs *fs, const char *dir_key)
{
    return fs_trusts(fs, dir_key) ? FS_TRUSTED_TTL : fs->conf.dir_ttl;
}

double fs_entry_ttl(const struct fs *fs, const char *key)
{
    /* the parent's listing: KEY strictly under a trusted prefix */
    for (size_t i = 0; i < fs->conf.trusted_count; i++) {
        size_t len = strlen(fs->trusted[i]);
        if (strncmp(key, fs->trusted[i], len) == 0 && key[len] != '\0')
            return FS_TRUSTED_TTL;
    }
    return fs->conf.dir_ttl;
}

void fs_fill_entry(const struct fs *fs, const struct inode *inode,
                   struct fs_entry *out)
{
    struct inode_attrs attrs = inode->attrs;

    out->ino = inode->ino;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs);
    fs_local_times_locked(inode, &attrs);
    fs_attrs_to_stat(fs, inode->ino, &attrs, &out->attr);
    out->attr_timeout = fs_attr_ttl(fs, inode->key);
    out->entry_timeout = fs_entry_ttl(fs, inode->key);
}

void fs_writer_meta_of(const struct inode_attrs *attrs, struct writer_meta *out)
{
    *out = (struct writer_meta){
        .mode = inode_kind_type(attrs->kind) | (attrs->mode & 07777),
        .uid = attrs->uid,
        .gid = attrs->gid,
        .mtime = attrs->mtime,
        .atime = attrs->atime,
    };
}

void fs_put_meta_of(const struct writer_meta *meta, const char *content_type,
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
void fs_put_meta_extras(const struct inode_attrs *attrs, struct s3_put_meta *out)
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

/* The attributes of file KEY whose listing said LISTED, if its s3fs
 * headers are already known for that ETag (in the inode table or the
 * metadata cache), or it has none (-o no_headers): no request needed. */
bool fs_known_file_attrs(struct fs *fs, const char *key,
                         const struct inode_attrs *listed,
                         struct inode_attrs *out)
{
    /* a file without an ETag is one staged here: what the bucket holds of
     * it is not known from that */
    if (listed->kind == INODE_FILE && listed->etag[0] == '\0')
        return false;
    inode_table_lock(fs->inodes);
    struct inode *known = inode_find_locked(fs->inodes, key);
    bool usable = known != NULL && known->attrs.headers_known &&
                  strcmp(known->attrs.etag, listed->etag) == 0;
    if (usable)
        *out = known->attrs;
    inode_table_unlock(fs->inodes);
    if (!usable)
        usable = metacache_get_attrs(fs->conf.cache, key, listed->etag, out) == 0;
    if (!usable && fs_headerless(fs, key)) {
        /* (headers this node learnt, above, still win: a file written
         * or changed here) */
        *out = *listed;
        out->headers_known = true;
        usable = true;
    }
    if (usable) {
        out->size = listed->size;
        out->fetched_at = listed->fetched_at;
    }
    return usable;
}

/*
 * Whether the files that lookups in directory DIR ask the bucket about are
 * then read (a data loader opening files by name): at least half of the
 * recent ones were opened for reading. Lock held.
 */
bool fs_reads_follow_lookups_locked(const struct inode *dir)
{
    return dir->asking_lookups >= READ_PATTERN_MIN &&
           2 * dir->reads_after_lookup >= dir->asking_lookups;
}
