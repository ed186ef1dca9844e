/*
 * fs_warm.c - the daemon's side of `s3cachefs warm` (warm_cmd.h): one
 * file's version fetched into the cache, its cached share told, its
 * blocks evicted, pinned or unpinned, answered as the text of warm_text.h
 * through an extended attribute of the file (fuse_ops.c).
 *
 * The version is the one the inode shows: a warm revalidates it first
 * when its attributes are older than attr_ttl (as open() does, so the
 * job's open finds what was warmed); --check never asks the bucket (it
 * reads the index only), so it tells about the version the mount knows.
 * A file with staged data (written, not uploaded yet) is local already:
 * nothing is fetched or evicted for it (status "staged").
 *
 * A pin (cache_pin_version()) is taken before the warm, so the blocks it
 * fetches are pinned as they come; one past the pinned share answers
 * "full" and fetches nothing. An unpin needs no request either.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "reader/reader.h"

int fs_warm(struct fs *fs, fuse_ino_t ino, enum fs_warm_op op,
            const atomic_bool *interrupted, struct warm_text_answer *out)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct inode_attrs attrs;
    char *key = NULL;
    int err = 0;

    *out = (struct warm_text_answer){.status = WARM_TEXT_DONE};
    if (inode == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    attrs = inode->attrs;
    bool staged = inode->wfile != NULL;
    double attr_ttl = fs_attr_ttl(fs, inode->key);
    inode_table_unlock(fs->inodes);
    if (attrs.kind == INODE_DIR && !staged) {
        err = EISDIR;
        goto out;
    }
    if (attrs.kind != INODE_FILE && !staged) {
        err = EINVAL; /* symlinks, devices, FIFOs: nothing to cache */
        goto out;
    }
    if (!staged && op == FS_WARM_FETCH &&
        clock_monotonic_seconds() - attrs.fetched_at >= attr_ttl) {
        err = fs_revalidate_file(fs, inode, &attrs);
        if (err != 0)
            goto out;
        inode_table_lock(fs->inodes);
        staged = inode->wfile != NULL;
        if (!staged)
            inode_update_attrs_locked(inode, &attrs);
        else
            attrs = inode->attrs;
        inode_table_unlock(fs->inodes);
    }
    out->size = attrs.size;
    if (staged) {
        out->status = WARM_TEXT_STAGED;
        out->before = out->cached = attrs.size;
        goto out;
    }
    key = inode_key_dup(fs->inodes, inode);
    if (key == NULL) {
        err = ENOMEM;
        goto out;
    }

    int op_err = 0;
    bool can_cache = attrs.etag[0] != '\0' && attrs.size > 0;
    switch (op) {
    case FS_WARM_PIN:
        /* the pin first: what the warm fetches is pinned as it comes */
        out->pin_max = cache_pin_max(fs->conf.cache);
        if (can_cache)
            op_err = cache_pin_version(fs->conf.cache, key, attrs.etag,
                                       attrs.size, true, &out->pin_used);
        if (op_err == ENOSPC) {
            out->status = WARM_TEXT_FULL;
            op_err = 0;
            break;
        }
        if (op_err != 0)
            break;
        out->pinned = can_cache;
        /* fall through */
    case FS_WARM_FETCH: {
        struct reader_warm_result result;
        op_err = reader_warm(fs->reader, key, attrs.etag, attrs.size,
                             fs->conf.connections, interrupted, &result);
        out->before = result.cached_before;
        out->fetched = result.fetched;
        out->cached = result.cached;
        break;
    }
    case FS_WARM_CHECK:
        if (can_cache)
            op_err = cache_version_cached_bytes(fs->conf.cache, key, attrs.etag,
                                                attrs.size, &out->cached,
                                                &out->pinned);
        out->before = out->cached;
        break;
    case FS_WARM_UNPIN:
        out->pin_max = cache_pin_max(fs->conf.cache);
        if (can_cache)
            op_err = cache_pin_version(fs->conf.cache, key, attrs.etag,
                                       attrs.size, false, &out->pin_used);
        if (op_err == 0 && can_cache)
            op_err = cache_version_cached_bytes(fs->conf.cache, key, attrs.etag,
                                                attrs.size, &out->cached, NULL);
        out->before = out->cached;
        break;
    case FS_WARM_EVICT:
        if (can_cache)
            op_err = cache_version_cached_bytes(fs->conf.cache, key, attrs.etag,
                                                attrs.size, &out->before, NULL);
        if (op_err == 0)
            op_err = cache_evict_key(fs->conf.cache, key, &out->freed);
        if (op_err == 0) {
            /* the next open drops the kernel's pages of it too */
            inode_table_lock(fs->inodes);
            inode->opened_version = 0;
            inode_table_unlock(fs->inodes);
            log_info("warm: evicted '%s' (%llu bytes)", key,
                     (unsigned long long)out->freed);
        }
        break;
    }
    if (op_err == EINTR) {
        out->status = WARM_TEXT_INTERRUPTED;
    } else if (op_err != 0) {
        out->status = WARM_TEXT_FAILED;
        out->error = op_err;
        if (op_err != ESTALE && op_err != ENOENT)
            log_warn("warm: '%s': %s", key, strerror(op_err));
    }
out:
    free(key);
    inode_put(fs->inodes, inode);
    return err;
}
