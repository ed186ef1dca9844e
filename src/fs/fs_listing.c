/*
 * fs_listing.c - directory listings: fetched page by page (guarded, see
 * s3walk.h), turned into sorted entries, merged with the files staged
 * here that the bucket does not have yet, kept per directory inode, and
 * patched in place for the changes this mount makes. A listing that a
 * directory rename overlapped is never kept (fs->dir_moves).
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"
#include "s3/s3walk.h"

#define LOGGED_KEYS_MAX 10000            /* "skipped key" lines, once each */
#define LISTING_ATTEMPTS 3               /* see fs_get_listing() */

static void listing_file_attrs(const struct fs *fs, const struct s3xml_object *object,
                               struct inode_attrs *out)
{
    *out = (struct inode_attrs){
        .kind = INODE_FILE,
        .size = object->size,
        .mtime = object->mtime,
        .mode = fs->conf.file_mode,
        .uid = fs->conf.uid,
        .gid = fs->conf.gid,
        .fetched_at = clock_monotonic_seconds(),
    };
    snprintf(out->etag, sizeof(out->etag), "%s", object->etag ? object->etag : "");
}

/* A listing from the index has what a LIST says (kind, size, mtime,
 * ETag): the rest as a listing from the bucket has it, this mount's
 * defaults (a directory's as fs_dir_attrs() gives them). */
static void stored_listing_defaults(const struct fs *fs,
                                    struct inode_listing *listing)
{
    for (size_t i = 0; i < listing->count; i++) {
        struct inode_attrs *attrs = &listing->entries[i].attrs;
        if (attrs->kind == INODE_DIR) {
            double fetched_at = attrs->fetched_at;
            fs_dir_attrs(fs, attrs);
            attrs->fetched_at = fetched_at;
        } else {
            attrs->mode = fs->conf.file_mode;
            attrs->uid = fs->conf.uid;
            attrs->gid = fs->conf.gid;
        }
    }
}

/* Log a skipped or hidden key once per mount, whatever the relistings. */
void fs_log_key_once(struct fs *fs, const char *key, const char *why)
{
    bool first = false;

    pthread_mutex_lock(&fs->logged_lock);
    if (fs->logged_count < LOGGED_KEYS_MAX &&
        tfind(key, &fs->logged_keys, (int (*)(const void *, const void *))strcmp) == NULL) {
        char *copy = strdup(key);
        if (copy != NULL &&
            tsearch(copy, &fs->logged_keys, (int (*)(const void *, const void *))strcmp) != NULL) {
            fs->logged_count++;
            first = true;
        } else {
            free(copy);
        }
    }
    pthread_mutex_unlock(&fs->logged_lock);
    if (first) {
        char shown[768];
        names_printable(key, shown, sizeof(shown));
        log_warn("key '%s' is not shown: %s", shown, why);
    }
}

struct listing_builder {
    struct inode_dirent *entries;
    size_t count;
    size_t capacity;
};

static int builder_add(struct listing_builder *builder, const char *name,
                       size_t name_len, const struct inode_attrs *attrs)
{
    if (builder->count == builder->capacity) {
        size_t capacity = builder->capacity ? builder->capacity * 2 : 64;
        struct inode_dirent *grown = realloc(builder->entries,
                                             capacity * sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        builder->entries = grown;
        builder->capacity = capacity;
    }
    char *copy = strndup(name, name_len);
    if (copy == NULL)
        return ENOMEM;
    builder->entries[builder->count++] = (struct inode_dirent){copy, *attrs};
    return 0;
}

static int compare_entries(const void *a, const void *b)
{
    const struct inode_dirent *x = a, *y = b;
    int order = strcmp(x->name, y->name);
    /* same name: the directory first, so it is the one kept */
    if (order == 0)
        order = (x->attrs.kind != INODE_DIR) - (y->attrs.kind != INODE_DIR);
    return order;
}

/* Add one page of a delimiter listing of DIR_KEY to BUILDER. */
static int add_page(struct fs *fs, const char *dir_key,
                    const struct s3xml_listing *page,
                    struct listing_builder *builder)
{
    struct inode_attrs attrs;
    const char *name;
    size_t name_len;
    int err = 0;

    for (size_t i = 0; i < page->object_count && err == 0; i++) {
        const struct s3xml_object *object = &page->objects[i];
        switch (names_classify(dir_key, object->key, &name, &name_len)) {
        case NAMES_ENTRY_FILE:
            listing_file_attrs(fs, object, &attrs);
            err = builder_add(builder, name, name_len, &attrs);
            break;
        case NAMES_ENTRY_DIR:  /* a "name/" marker listed as an object */
            fs_dir_attrs(fs, &attrs);
            err = builder_add(builder, name, name_len, &attrs);
            break;
        case NAMES_ENTRY_SELF:
            break;
        case NAMES_ENTRY_INVALID:
            fs_log_key_once(fs, object->key, "it cannot be a file name");
            break;
        }
    }
    for (size_t i = 0; i < page->prefix_count && err == 0; i++) {
        switch (names_classify(dir_key, page->prefixes[i], &name, &name_len)) {
        case NAMES_ENTRY_DIR:
            fs_dir_attrs(fs, &attrs);
            err = builder_add(builder, name, name_len, &attrs);
            break;
        case NAMES_ENTRY_SELF:
            break;
        default:
            fs_log_key_once(fs, page->prefixes[i], "it cannot be a directory name");
            break;
        }
    }
    for (size_t i = 0; i < page->skipped_count; i++)
        fs_log_key_once(fs, page->skipped[i], "the server's listing holds it "
                        "with a NUL or a bad %-escape, so it cannot be read");
    return err;
}

/* LIST every page of DIR_KEY into a new sorted, de-duplicated listing.
 * EFBIG when it has more than MAX_PAGES pages (0: no limit); EIO when the
 * server's pages would go round for ever (s3walk_next()). */
static int fetch_listing(struct fs *fs, const char *dir_key, unsigned max_pages,
                         struct inode_listing **out)
{
    struct listing_builder builder = {0};
    struct s3walk walk = {0};
    unsigned pages = 0;
    int err = 0;

    *out = NULL;
    do {
        struct s3xml_listing page;
        err = s3walk_next(fs->s3, &walk, dir_key, "/", LIST_PAGE, &page);
        if (err == 0)
            err = add_page(fs, dir_key, &page, &builder);
        if (err == 0 && !walk.done && max_pages > 0 && ++pages >= max_pages)
            err = EFBIG;
        else if (err == 0 && !walk.done && fs->stopping)
            err = ECANCELED; /* a background relisting at unmount */
        s3xml_listing_free(&page);
    } while (err == 0 && !walk.done);
    s3walk_clear(&walk);
    if (err != 0)
        goto out;

    if (builder.count > 0)
        qsort(builder.entries, builder.count, sizeof(builder.entries[0]),
              compare_entries);
    size_t kept = 0;
    for (size_t i = 0; i < builder.count; i++) {
        if (kept > 0 && strcmp(builder.entries[kept - 1].name,
                               builder.entries[i].name) == 0) {
            char *key = names_child_key(dir_key, builder.entries[i].name,
                                        strlen(builder.entries[i].name), false);
            if (key != NULL)
                fs_log_key_once(fs, key, "a directory of the same name hides it");
            free(key);
            free(builder.entries[i].name);
            continue;
        }
        builder.entries[kept++] = builder.entries[i];
    }
    builder.count = kept;
    /* the array grew by doubling: up to half of it unused, kept for as
     * long as the listing (100 bytes a key of a large directory) */
    if (builder.count > 0 && builder.count < builder.capacity) {
        struct inode_dirent *fitted = realloc(builder.entries,
                                              builder.count * sizeof(*fitted));
        if (fitted != NULL) {
            builder.entries = fitted;
            builder.capacity = builder.count;
        }
    }
    *out = calloc(1, sizeof(**out));
    if (*out == NULL) {
        err = ENOMEM;
        goto out;
    }
    (*out)->fetched_at = clock_monotonic_seconds();
    (*out)->count = builder.count;
    (*out)->entries = builder.entries;
    builder.entries = NULL;
    builder.count = 0;
out:
    for (size_t i = 0; i < builder.count; i++)
        free(builder.entries[i].name);
    free(builder.entries);
    return err;
}

struct staged_merge {
    struct fs *fs;
    struct inode *dir;
    size_t dir_len;
};

struct staged_visit {
    const char *prefix;
    size_t prefix_len;
    void (*visit)(void *arg, struct inode *inode);
    void *arg;
};

static void staged_visit_node(const void *node, VISIT which, void *arg)
{
    struct staged_visit *walk = arg;
    struct inode *inode = *(struct inode *const *)node;

    if ((which == postorder || which == leaf) && !inode->unlinked &&
        strncmp(inode->key, walk->prefix, walk->prefix_len) == 0)
        walk->visit(walk->arg, inode);
}

void fs_staged_visit_locked(struct fs *fs, const char *prefix,
                            void (*visit)(void *arg, struct inode *inode),
                            void *arg)
{
    struct staged_visit walk = {prefix, strlen(prefix), visit, arg};

    twalk_r(fs->staged, staged_visit_node, &walk);
}

static void probe_pending(void *arg, struct inode *inode)
{
    bool *found = arg;

    if (writer_file_pending(inode->wfile))
        *found = true;
}

bool fs_staged_pending_under_locked(struct fs *fs, const char *prefix)
{
    bool found = false;

    fs_staged_visit_locked(fs, prefix, probe_pending, &found);
    return found;
}

static void merge_one_locked(void *arg, struct inode *inode)
{
    struct staged_merge *merge = arg;
    const char *name = inode->key + merge->dir_len;
    const char *slash = strchr(name, '/');
    struct inode_attrs attrs;

    if (name[0] == '\0')
        return; /* the directory itself */
    if (slash != NULL) {
        /* deeper: its directory may have no key in the bucket yet (after a
         * crash during a directory rename, recovery uploads its files
         * under the new name), and is shown meanwhile */
        char *dir_name = strndup(name, (size_t)(slash - name));
        if (dir_name != NULL && slash[1] != '\0' &&
            inode_listing_find(merge->dir->listing, dir_name) == NULL &&
            writer_file_pending(inode->wfile)) {
            fs_dir_attrs(merge->fs, &attrs);
            inode_listing_patch_locked(merge->fs->inodes, merge->dir, dir_name,
                                       &attrs);
        }
        free(dir_name);
        return;
    }
    fs_staged_attrs_locked(merge->fs, inode, &attrs);
    inode_listing_patch_locked(merge->fs->inodes, merge->dir, name, &attrs);
}

/* A directory marker waiting to be sent (writeback mode) under the
 * directory being merged: the directory it names, or the one of DIR that
 * holds it, is shown. (The markers' lock is held: no writer call.) */
static void merge_marker_locked(void *arg, const char *key,
                                const struct writer_meta *meta)
{
    struct staged_merge *merge = arg;
    const char *name = key + merge->dir_len;
    const char *slash = strchr(name, '/');
    struct inode_attrs attrs;

    if (name[0] == '\0' || slash == NULL)
        return; /* the directory itself */
    char *dir_name = strndup(name, (size_t)(slash - name));
    if (dir_name == NULL)
        return;
    if (inode_listing_find(merge->dir->listing, dir_name) == NULL) {
        fs_dir_attrs(merge->fs, &attrs);
        if (slash[1] == '\0') { /* its own marker: its metadata */
            attrs.mode = meta->mode & 07777;
            attrs.uid = meta->uid;
            attrs.gid = meta->gid;
            attrs.mtime = meta->mtime;
        }
        inode_listing_patch_locked(merge->fs->inodes, merge->dir, dir_name,
                                   &attrs);
    }
    free(dir_name);
}

/* Files being written or waiting for their upload are not in the bucket
 * yet, nor are directory markers waiting to be sent: add them to DIR's
 * new listing. Lock held. */
static void merge_staged_locked(struct fs *fs, struct inode *dir)
{
    struct staged_merge merge = {fs, dir, strlen(dir->key)};

    fs_staged_visit_locked(fs, dir->key, merge_one_locked, &merge);
    if (fs->writer != NULL)
        writer_marker_visit(fs->writer, dir->key, merge_marker_locked, &merge);
}

/* An empty listing for the caller alone (a removed directory's): NULL
 * when out of memory. */
static struct inode_listing *empty_listing(void)
{
    struct inode_listing *listing = calloc(1, sizeof(*listing));

    if (listing != NULL) {
        listing->refs = 1;
        listing->fetched_at = clock_monotonic_seconds();
    }
    return listing;
}

/*
 * The listing of directory DIR, one reference for the caller: the one in
 * memory or in the metadata cache while younger than dir_ttl, else a new
 * one from the bucket (EFBIG past MAX_PAGES pages, 0: any number). One
 * thread lists a directory at a time; the others wait for its listing.
 * A listing that a directory rename may have overlapped is never kept
 * (nor stored in the cache index): when DIR was renamed meanwhile, it is
 * fetched again under the new name, up to LISTING_ATTEMPTS times; while
 * a move is under way, it goes to the caller alone (listing again would
 * only see the move half done again). A removed directory lists empty,
 * without a request (its key is gone).
 */
int fs_get_listing(struct fs *fs, struct inode *dir, unsigned max_pages,
                   struct inode_listing **out)
{
    struct inode_listing *listing = NULL;
    int err = 0;

    inode_table_lock(fs->inodes);
    for (unsigned attempt = 1;; attempt++) {
        if (dir->unlinked) {
            inode_table_unlock(fs->inodes);
            *out = empty_listing();
            return *out != NULL ? 0 : ENOMEM;
        }
        for (;;) {
            if (dir->listing != NULL &&
                clock_monotonic_seconds() - dir->listing->fetched_at <
                    fs_dir_ttl(fs, dir->key)) {
                *out = inode_dir_listing_use_locked(fs->inodes, dir);
                inode_table_unlock(fs->inodes);
                return 0;
            }
            if (!dir->listing_fetch)
                break;
            inode_table_wait(fs->inodes, &fs->listing_done);
        }
        dir->listing_fetch = true;
        inode_listing_forget_patches_locked(dir);
        char *dir_key = strdup(dir->key);
        inode_table_unlock(fs->inodes);

        bool from_bucket = false;
        if (dir_key == NULL) {
            err = ENOMEM;
        } else if (metacache_get_listing(fs->conf.cache, dir_key,
                                         fs_dir_ttl(fs, dir_key),
                                         &listing) != 0) {
            err = fetch_listing(fs, dir_key, max_pages, &listing);
            from_bucket = err == 0;
        } else {
            stored_listing_defaults(fs, listing);
        }
        /* stored before the check: a rename that ends after it forgets
         * the stored listing itself, one that ended before is seen below */
        if (from_bucket)
            metacache_put_listing(fs->conf.cache, dir_key, listing, clock_wall_seconds());

        inode_table_lock(fs->inodes);
        dir->listing_fetch = false;
        pthread_cond_broadcast(&fs->listing_done);
        bool renamed = dir->unlinked || strcmp(dir->key, dir_key) != 0;
        bool moved = err == 0 && (renamed || fs_move_under_way_locked(fs, dir_key));
        bool again = moved && renamed && attempt < LISTING_ATTEMPTS;
        /* local changes made while listing: the stored copy lacks them */
        bool patched = dir->patches != NULL;
        if (err == 0 && !moved) {
            inode_set_listing_locked(fs->inodes, dir, listing);
            /* what changed here while listing, the LIST may not show yet */
            inode_listing_replay_locked(fs->inodes, dir);
            merge_staged_locked(fs, dir);
            *out = inode_listing_ref_locked(dir->listing);
        } else {
            inode_listing_forget_patches_locked(dir);
        }
        if (moved && !again) {
            listing->refs = 1; /* the caller's alone */
            *out = listing;
        }
        inode_table_unlock(fs->inodes);
        if ((moved || patched) && from_bucket)
            metacache_forget_listing(fs->conf.cache, dir_key);
        free(dir_key);
        if (!again)
            return err;
        inode_listing_free(listing);
        listing = NULL;
        inode_table_lock(fs->inodes);
    }
}

/* A local change of KEY: patch its parent's cached listing (ATTRS NULL:
 * removed) and forget the stored one. */
void fs_patch_parent(struct fs *fs, const char *key,
                     const struct inode_attrs *attrs)
{
    char *parent_key = names_parent_key(key);
    char *name = names_last_name(key);

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
void fs_entry_changed(struct fs *fs, const char *key)
{
    char *parent_key = names_parent_key(key);

    if (parent_key == NULL)
        return;
    inode_table_lock(fs->inodes);
    struct inode *dir = inode_find_locked(fs->inodes, parent_key);
    if (dir != NULL)
        fs_touch_locked(dir, true);
    inode_table_unlock(fs->inodes);
    free(parent_key);
}
