/*
 * fs_refresh.c - `s3cachefs refresh PATH` (refresh_cmd.h), the daemon's
 * side: what this mount knows of a directory tree, or of one file, is
 * forgotten, so that the next use lists and asks the bucket again. The
 * "told otherwise" of -o trust (fs_attrs.c), whose listings and
 * attributes are otherwise kept for a year, across remounts.
 *
 * Three places hold what is forgotten:
 *   - the inode table: the listings of the directories at or under the
 *     path are dropped, and the attributes of every inode there are
 *     marked unconfirmed (fetched_at -inf, headers not known), so that a
 *     lookup, getattr or open asks again; a staged file's attributes are
 *     this mount's own and stay;
 *   - the cache index (metacache_forget_tree()): the stored listings of
 *     the tree, the attributes they name, the directory's own;
 *   - the kernel: the entries and attributes of the inodes it holds,
 *     through the caller's INVAL callback (fuse_lowlevel_notify_inval_*,
 *     which must not be called under the table lock: it waits for the
 *     kernel's locks, and the kernel may be waiting for a request that
 *     needs the table lock).
 * A file's refresh drops its parent's listing too (its ETag and size are
 * there). A listing fetched while the refresh runs may still be kept: it
 * was asked of the bucket after the refresh began, or served from the
 * index before it (a race the caller avoids by not listing meanwhile).
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"

/* What the kernel is told to forget, gathered under the table lock. */
struct kernel_entry {
    fuse_ino_t parent;      /* 0: the parent is not in the table */
    fuse_ino_t ino;
    char *name;
};

/* Forget what INODE knows (lock held). */
static void forget_inode_locked(struct fs *fs, struct inode *inode,
                                struct fs_refresh_report *report)
{
    if (inode->listing != NULL) {
        inode_drop_listing_locked(fs->inodes, inode);
        report->listings++;
    }
    inode->too_big_to_list = false;
    inode->probes = 0;
    if (inode->wfile == NULL) {
        inode->attrs.fetched_at = -INFINITY;
        inode->attrs.headers_known = false;
    }
    report->inodes++;
}

/* The kernel's entry of INODE, if it holds one: into *OUT. ENOMEM. */
static int kernel_entry_locked(struct fs *fs, const struct inode *inode,
                               struct kernel_entry *out, bool *held)
{
    *held = inode->nlookup > 0;
    if (!*held)
        return 0;
    *out = (struct kernel_entry){.ino = inode->ino};
    if (inode->ino == FUSE_ROOT_ID)
        return 0;
    char *parent_key = names_parent_key(inode->key);
    out->name = names_last_name(inode->key);
    if (parent_key == NULL || out->name == NULL) {
        free(parent_key);
        free(out->name);
        return ENOMEM;
    }
    struct inode *parent = inode_find_locked(fs->inodes, parent_key);
    if (parent != NULL && parent->attrs.kind == INODE_DIR)
        out->parent = parent->ino;
    free(parent_key);
    return 0;
}

int fs_refresh(struct fs *fs, fuse_ino_t ino, fs_refresh_inval_fn inval,
               void *arg, struct fs_refresh_report *out)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct inode **found = NULL;
    struct kernel_entry *entries = NULL;
    size_t found_count = 0, entry_count = 0;
    char *key = NULL, *parent_key = NULL;
    int err = 0;

    memset(out, 0, sizeof(*out));
    if (inode == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    bool is_dir = inode->attrs.kind == INODE_DIR;
    key = strdup(inode->key);
    if (key == NULL) {
        err = ENOMEM;
    } else if (is_dir) {
        err = inode_find_prefix_locked(fs->inodes, key, &found, &found_count);
    } else if ((found = malloc(sizeof(*found))) == NULL) {
        err = ENOMEM;
    } else {
        found[found_count++] = inode;
        parent_key = names_parent_key(key);
        if (parent_key == NULL)
            err = ENOMEM;
    }
    if (err == 0 && found_count > 0 &&
        (entries = calloc(found_count, sizeof(*entries))) == NULL)
        err = ENOMEM;
    for (size_t i = 0; err == 0 && i < found_count; i++) {
        bool held = false;
        forget_inode_locked(fs, found[i], out);
        err = kernel_entry_locked(fs, found[i], &entries[entry_count], &held);
        if (err == 0 && held)
            entry_count++;
    }
    if (err == 0 && parent_key != NULL) {
        /* a file: its parent's listing holds its ETag and size */
        struct inode *parent = inode_find_locked(fs->inodes, parent_key);
        if (parent != NULL && parent->listing != NULL) {
            inode_drop_listing_locked(fs->inodes, parent);
            out->listings++;
        }
    }
    inode_table_unlock(fs->inodes);

    /* HEADs of a walk's head-ahead (fs_ahead.c) are of before it */
    if (err == 0)
        fs_ahead_end_under(fs, is_dir ? key : parent_key);
    if (err == 0) {
        uint64_t listings = 0, records = 0;
        err = metacache_forget_tree(fs->conf.cache, key, &listings, &records);
        if (err == 0 && parent_key != NULL &&
            metacache_forget_listing(fs->conf.cache, parent_key) == 0)
            listings++;
        out->stored_listings = listings;
        out->stored_records = records;
    }
    /* the kernel, with no lock held: each name, then each inode's
     * attributes (the directory's own entry too: its parent looks it up
     * again, through a listing that is still trusted) */
    for (size_t i = 0; inval != NULL && i < entry_count; i++) {
        if (entries[i].parent != 0)
            inval(arg, entries[i].parent, entries[i].name, 0);
        inval(arg, 0, NULL, entries[i].ino);
    }
    out->kernel_entries = entry_count;
    for (size_t i = 0; i < entry_count; i++)
        free(entries[i].name);
    free(entries);
    free(found);
    free(parent_key);
    if (err == 0)
        log_info("refresh of '%s': %llu inodes, %llu stored listings and "
                 "%llu stored attributes forgotten", key,
                 (unsigned long long)out->inodes,
                 (unsigned long long)out->stored_listings,
                 (unsigned long long)out->stored_records);
    free(key);
    inode_put(fs->inodes, inode);
    return err;
}
