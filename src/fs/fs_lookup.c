/*
 * fs_lookup.c - lookup, getattr and revalidation: what a name is, and
 * whether what the inode table knows of it still holds.
 *
 * Lookup of NAME in directory P ("dir wins"):
 *   - P's listing is fresh: answer from it (absent -> negative entry); a
 *     file's s3fs headers come from the inode table when known for the
 *     same ETag, else from one HEAD, or from one GET of the whole file
 *     where lookups in P are followed by reads (see lookup_file()).
 *   - otherwise: LIST prefix=P+NAME+"/" max-keys=1 (a directory?), then
 *     HEAD P+NAME (a file?).
 *   - a name with files under it that wait for their upload here is a
 *     directory, whatever the bucket has.
 *
 * The head-ahead that lookups in a walked directory start and take
 * their answers from is in fs_ahead.c.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <stdatomic.h>
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

#define RELIST_PAGES_MAX 10              /* see worth_relisting_locked() */
#define PROBES_BEFORE_LISTING 8          /* see fs_lookup() */
#define LOOKUP_FETCH_MAX (1u << 20)      /* largest file a lookup GETs whole */
#define READ_PATTERN_WINDOW 64   /* see note_asking_lookup_locked() */

/*
 * Whether to answer a lookup or a revalidation in directory DIR by listing
 * it again rather than asking about one name. One page (up to 1000 keys)
 * never costs more than a probe; a few pages pay off when the listing then
 * serves the lookups of dir_ttl seconds, but not when dir_ttl is tiny.
 * Call with the table lock held.
 */
static bool worth_relisting_locked(const struct fs *fs, const struct inode *dir)
{
    /* (a listing the memory budget took counts as listed: inode.h) */
    size_t count = dir->listing != NULL ? dir->listing->count : dir->evicted_count;
    if (count == 0)
        return false;
    size_t pages = (count + LIST_PAGE - 1) / LIST_PAGE;
    return pages <= 1 || (fs->conf.dir_ttl >= 1.0 && pages <= RELIST_PAGES_MAX);
}

/* Apply the s3fs headers of directory marker INFO to ATTRS. */
void fs_apply_dir_headers(const struct fs *fs, const struct s3_object_info *info,
                          struct inode_attrs *attrs)
{
    if (info->has_mode)
        attrs->mode = info->mode & 07777;
    if (info->has_uid)
        attrs->uid = info->uid;
    if (info->has_gid)
        attrs->gid = info->gid;
    if (info->has_mtime)
        attrs->mtime = info->mtime;
    if (info->has_atime)
        attrs->atime = info->atime;
    if (info->has_ctime)
        attrs->ctime = info->ctime;
    (void)fs;
    attrs->headers_known = true;
}

/* Whether the headers of directory DIR_KEY are known in the inode table:
 * copied into ATTRS. */
bool fs_known_dir_attrs(struct fs *fs, const char *dir_key,
                        struct inode_attrs *attrs)
{
    inode_table_lock(fs->inodes);
    struct inode *known = inode_find_locked(fs->inodes, dir_key);
    bool usable = known != NULL && known->attrs.kind == INODE_DIR &&
                  known->attrs.headers_known;
    if (usable)
        *attrs = known->attrs;
    inode_table_unlock(fs->inodes);
    return usable;
}

/*
 * What the headers of directories are kept under in the index. A
 * directory's marker is HEADed once per mount: the answer outlives the
 * inode, which the kernel forgets under memory pressure, so a walk of a
 * large tree does not HEAD its directories again. A listing names a
 * directory, not its marker's ETag, so the record is tagged with this
 * mount instead (fs->dir_headers_tag), and a remount asks again; under
 * -o trust, with a tag every mount shares, so a directory is HEADed once
 * ever. Every local change of a directory's headers (mkdir, setattr,
 * rename, rmdir) reaches the record; `s3cachefs refresh` forgets it.
 */
#define TRUSTED_DIR_TAG "\"s3cachefs:trusted-directory\""

static const char *dir_headers_tag(const struct fs *fs, const char *dir_key)
{
    return fs_trusts(fs, dir_key) ? TRUSTED_DIR_TAG : fs->dir_headers_tag;
}

void fs_dir_headers_tag_init(struct fs *fs)
{
    static atomic_uint mounts; /* unit tests mount many times a process */
    struct timespec now = clock_wall_now();

    snprintf(fs->dir_headers_tag, sizeof(fs->dir_headers_tag),
             "\"s3cachefs:directory:%lld.%09ld:%ld:%u\"", (long long)now.tv_sec,
             now.tv_nsec, (long)getpid(), atomic_fetch_add(&mounts, 1));
}

bool fs_stored_dir_attrs(struct fs *fs, const char *dir_key,
                         struct inode_attrs *attrs)
{
    if (metacache_get_attrs(fs->conf.cache, dir_key,
                            dir_headers_tag(fs, dir_key), attrs) != 0)
        return false;
    attrs->etag[0] = '\0';
    return true;
}

void fs_store_dir_attrs(struct fs *fs, const char *dir_key,
                        const struct inode_attrs *attrs)
{
    if (!attrs->headers_known)
        return;
    struct inode_attrs kept = *attrs;
    snprintf(kept.etag, sizeof(kept.etag), "%s", dir_headers_tag(fs, dir_key));
    metacache_put_attrs(fs->conf.cache, dir_key, &kept);
}

bool fs_headerless_dir_attrs(const struct fs *fs, const char *dir_key,
                             struct inode_attrs *attrs)
{
    if (!fs_headerless(fs, dir_key))
        return false;
    attrs->headers_known = true; /* (the defaults: no marker says more) */
    return true;
}

/* A directory's mode and owner live in the headers of its marker (as s3fs
 * writes them): one HEAD per directory and mount; none when there is no
 * marker (defaults). Failures leave the defaults, and are asked again.
 * Under -o trust, one HEAD per directory ever; under -o no_headers,
 * none. */
static void resolve_dir(struct fs *fs, const char *dir_key, struct inode_attrs *attrs)
{
    struct s3_object_info info;

    if (fs_known_dir_attrs(fs, dir_key, attrs) ||
        fs_marker_attrs(fs, dir_key, attrs) ||
        fs_stored_dir_attrs(fs, dir_key, attrs) ||
        fs_headerless_dir_attrs(fs, dir_key, attrs))
        return;
    int err = s3_head_object(fs->s3, dir_key, &info);
    if (err == 0)
        fs_apply_dir_headers(fs, &info, attrs);
    else if (err == ENOENT)
        attrs->headers_known = true; /* no marker: the defaults are right */
    fs_store_dir_attrs(fs, dir_key, attrs);
}

/* Attributes of file KEY whose listing said LISTED (may be NULL): the
 * known headers of the same ETag, or a HEAD (remembered by ETag). */
int fs_resolve_file(struct fs *fs, const char *key,
                    const struct inode_attrs *listed, struct inode_attrs *out)
{
    struct s3_object_info info;

    if (listed != NULL && fs_known_file_attrs(fs, key, listed, out))
        return 0;
    int err = s3_head_object(fs->s3, key, &info);
    if (err == 0) {
        fs_head_file_attrs(fs, key, &info, out);
        metacache_put_attrs(fs->conf.cache, key, out);
    }
    return err;
}

/* A lookup in DIR asked the bucket about file CHILD. Lock held. */
static void note_asking_lookup_locked(struct inode *dir, struct inode *child)
{
    if (++dir->asking_lookups > READ_PATTERN_WINDOW) {
        /* older lookups count less: a changed pattern shows soon */
        dir->asking_lookups /= 2;
        dir->reads_after_lookup /= 2;
    }
    child->lookup_asked = true;
}

/* File INODE (key KEY) is opened for reading: if its lookup asked the
 * bucket, count it for its directory. */
void fs_note_read_open(struct fs *fs, struct inode *inode, const char *key)
{
    const char *slash = strrchr(key, '/');
    char *parent_key = strndup(key, slash ? (size_t)(slash - key) + 1 : 0);

    if (parent_key == NULL)
        return;
    inode_table_lock(fs->inodes);
    struct inode *dir = inode->lookup_asked
                            ? inode_find_locked(fs->inodes, parent_key) : NULL;
    inode->lookup_asked = false;
    if (dir != NULL && dir->reads_after_lookup < dir->asking_lookups)
        dir->reads_after_lookup++;
    inode_table_unlock(fs->inodes);
    free(parent_key);
}

/*
 * Attributes of file KEY in directory DIR, whose listing said LISTED: the
 * known headers for its ETag (unless CONFIRM: the listing may be out of
 * date), else from the bucket (*asked). Where files looked up are then
 * read (fs_reads_follow_lookups_locked), a small file is fetched whole
 * into the cache with one GET, which carries the same headers as a HEAD:
 * the open and read that follow need no request. That
 * costs at most LOOKUP_FETCH_MAX bytes for a file looked up but not read.
 */
static int lookup_file(struct fs *fs, struct inode *dir, const char *dir_key,
                       const char *name, const char *key,
                       const struct inode_attrs *listed, bool confirm,
                       struct inode_attrs *out, bool *asked)
{
    struct s3_object_info info;

    *asked = false;
    /* a HEAD of a head-ahead job answers as the lookup's own would (it
     * confirms the listing too): counted as asking the bucket, so that
     * reads after such lookups still show (and end the job) */
    int err = fs_ahead_take(fs, dir, dir_key, name, listed, out);
    if (err != EAGAIN) {
        *asked = true;
        return err;
    }
    if (!confirm && fs_known_file_attrs(fs, key, listed, out))
        return 0;
    *asked = true;
    fs_ahead_start(fs, dir, dir_key, name);
    inode_table_lock(fs->inodes);
    bool fetch = fs_reads_follow_lookups_locked(dir);
    /* a newer version known here than the listing's: opening the cache
     * for the listed one would drop the newer one's blocks */
    struct inode *known = inode_find_locked(fs->inodes, key);
    if (known != NULL && known->attrs.fetched_at > listed->fetched_at)
        fetch = false;
    inode_table_unlock(fs->inodes);
    if (fetch && listed->size > 0 && listed->size <= LOOKUP_FETCH_MAX &&
        listed->etag[0] != '\0') {
        err = reader_fetch_whole(fs->reader, key, listed->etag,
                                 listed->size, &info);
        if (err == 0) {
            fs_head_file_attrs(fs, key, &info, out);
            metacache_put_attrs(fs->conf.cache, key, out);
            return 0;
        }
        if (err == ENOENT)
            return err;
        /* cached already, changed since the listing, no room: a HEAD */
    }
    return fs_resolve_file(fs, key, NULL, out);
}

/* Probe the bucket for NAME in DIR_KEY without a listing. */
static int probe_name(struct fs *fs, const char *file_key, const char *dir_key,
                      struct inode_attrs *attrs, bool *is_dir)
{
    struct s3xml_listing page;
    int err = s3_list_objects(fs->s3, dir_key, NULL, NULL, NULL, 1, &page);

    if (err != 0)
        return err;
    *is_dir = page.object_count > 0 || page.prefix_count > 0;
    s3xml_listing_free(&page);
    if (*is_dir) {
        fs_dir_attrs(fs, attrs);
        resolve_dir(fs, dir_key, attrs);
        return 0;
    }
    return fs_resolve_file(fs, file_key, NULL, attrs);
}

int fs_lookup(struct fs *fs, fuse_ino_t parent_ino, const char *name,
              struct fs_entry *out)
{
    struct inode *parent = inode_get(fs->inodes, parent_ino);
    struct inode_listing *listing = NULL;
    struct inode_attrs attrs;
    char *file_key = NULL, *dir_key = NULL, *parent_key = NULL;
    bool is_dir = false, asked = false;
    size_t name_len = strlen(name);
    int err = 0;

    memset(out, 0, sizeof(*out));
    out->entry_timeout = fs->conf.dir_ttl; /* (a negative entry: below) */
    if (parent == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    bool parent_is_dir = parent->attrs.kind == INODE_DIR;
    inode_table_unlock(fs->inodes);
    if (!parent_is_dir) {
        err = ENOTDIR;
        goto out;
    }
    if (name_len > NAMES_NAME_MAX) {
        err = ENAMETOOLONG;
        goto out;
    }
    if (!names_is_valid(name, name_len))
        goto out; /* negative entry */
    parent_key = inode_key_dup(fs->inodes, parent);
    if (parent_key != NULL) {
        file_key = names_child_key(parent_key, name, name_len, false);
        dir_key = names_child_key(parent_key, name, name_len, true);
    }
    if (file_key == NULL || dir_key == NULL) {
        err = ENOMEM;
        goto out;
    }

    /* A file being written or waiting for its upload is not in the bucket
     * yet: the inode table knows it. */
    inode_table_lock(fs->inodes);
    struct inode *staged = inode_find_locked(fs->inodes, file_key);
    if (staged != NULL && staged->wfile != NULL) {
        staged = inode_ref_locked(fs->inodes, file_key, NULL);
        fs_fill_entry(fs, staged, out);
        inode_table_unlock(fs->inodes);
        goto out;
    }
    inode_table_unlock(fs->inodes);
    /* So is a directory whose marker waits to be sent (writeback mode);
     * it wins over a file of the same name, as in the bucket. */
    if (fs_marker_attrs(fs, dir_key, &attrs)) {
        is_dir = true;
        goto found;
    }
    inode_table_lock(fs->inodes);

    /* A directory a walk is under way in (its head-ahead's answers being
     * taken: HEADs of keys under it, so it is one) is answered as the
     * inode table knows it, with no request: the walker's stats go
     * through its name, whose kernel entry lasts dir_ttl, so `ls -l` of a
     * large directory looked it up again every second, each time listing
     * or probing its parent in the foreground (on s3rver, whose LISTs
     * scan the whole bucket, about 0.3 s each). */
    struct inode *walked_dir = inode_find_locked(fs->inodes, dir_key);
    if (walked_dir != NULL && walked_dir->attrs.kind == INODE_DIR &&
        walked_dir->attrs.headers_known &&
        fs_ahead_live_locked(fs, walked_dir, fs_dir_ttl(fs, dir_key))) {
        attrs = walked_dir->attrs;
        is_dir = true;
        inode_table_unlock(fs->inodes);
        goto found;
    }

    /* A directory listed before is listed again (one LIST per 1000 keys
     * answers every lookup in it for dir_ttl); others are probed. */
    /* Many lookups in a directory never listed (a data loader opening files
     * by name) are cheaper answered by listing it once, if that takes a
     * few pages: after PROBES_BEFORE_LISTING probes (two requests each) it
     * is tried. */
    double parent_ttl = fs_dir_ttl(fs, parent_key);
    out->entry_timeout = parent_ttl; /* (a name that is not there, too) */
    if (parent->listing != NULL &&
        clock_monotonic_seconds() - parent->listing->fetched_at < parent_ttl)
        listing = inode_dir_listing_use_locked(fs->inodes, parent); /* fresh */
    bool listed = listing == NULL && worth_relisting_locked(fs, parent);
    /* A file of the last listing whose headers are not known here needs a
     * request of its own anyway, and that request (a GET with the listed
     * ETag, or a HEAD) confirms it: answer from the last listing, if it is
     * not much older than dir_ttl or another thread is listing the
     * directory again, rather than wait for a LIST. A data loader's first
     * pass then lists its directory once, not every dir_ttl (LISTs cost
     * more than GETs, in money and on the server). What only a new listing
     * would show is a directory of the same name, which hides the file
     * ("dir wins", above): that may take STALE_LISTING_TTLS x dir_ttl. */
    bool confirm = false;
    /* (a walk under way goes by the listing it walks, even where a new
     * one would not be fetched but names probed: fs_ahead_live_locked()) */
    bool walked = listing == NULL && parent->listing != NULL &&
                  fs_ahead_live_locked(fs, parent, parent_ttl);
    if ((listed && (parent->listing_fetch ||
                    (parent->listing != NULL &&
                     clock_monotonic_seconds() - parent->listing->fetched_at <
                         STALE_LISTING_TTLS * parent_ttl))) ||
        walked) {
        const struct inode_dirent *last = inode_listing_find(parent->listing, name);
        struct inode *known = inode_find_locked(fs->inodes, file_key);
        if (last != NULL && last->attrs.kind == INODE_FILE &&
            (known == NULL || !known->attrs.headers_known ||
             strcmp(known->attrs.etag, last->attrs.etag) != 0)) {
            listing = inode_listing_ref_locked(parent->listing);
            listed = false;
            confirm = true;
        }
    }
    /* the last listing took more pages than a lookup lists: trying would
     * send RELIST_PAGES_MAX LISTs to end with EFBIG (seen: ls -l of a
     * directory of 10,000 keys after a remount sent 10 for nothing) */
    if (parent->listing != NULL && !parent->too_big_to_list &&
        (parent->listing->count + LIST_PAGE - 1) / LIST_PAGE > RELIST_PAGES_MAX)
        parent->too_big_to_list = true;
    /* Under -o trust a directory's listing is kept in the index for good:
     * one the kernel forgot (memory pressure, drop_caches) and looks up a
     * name in again, with no readdir, reads it from there with no request
     * (probing the name asked the bucket, and showed another client's
     * change under a trusted prefix) */
    bool stored = listing == NULL && !listed && parent->listing == NULL &&
                  fs_trusts(fs, parent_key);
    bool try_listing = listing == NULL && !listed && !stored &&
                       !parent->too_big_to_list &&
                       ++parent->probes >= PROBES_BEFORE_LISTING;
    inode_table_unlock(fs->inodes);
    if (listed || try_listing || stored) {
        err = fs_get_listing(fs, parent, RELIST_PAGES_MAX, &listing);
        if (err == EFBIG) {
            inode_table_lock(fs->inodes);
            parent->too_big_to_list = true;
            inode_table_unlock(fs->inodes);
            err = 0;
        }
        if (err != 0)
            goto out;
    }

    if (listing != NULL) {
        const struct inode_dirent *entry = inode_listing_find(listing, name);
        if (entry == NULL) {
            err = ENOENT;
        } else if ((is_dir = entry->attrs.kind == INODE_DIR)) {
            attrs = entry->attrs;
            resolve_dir(fs, dir_key, &attrs);
        } else
            err = lookup_file(fs, parent, parent_key, name, file_key,
                              &entry->attrs, confirm, &attrs, &asked);
    } else {
        err = probe_name(fs, file_key, dir_key, &attrs, &is_dir);
        asked = !is_dir;
    }
    if (err == ENOENT) {
        /* a directory whose only keys wait for their upload here */
        inode_table_lock(fs->inodes);
        bool pending = fs_staged_pending_under_locked(fs, dir_key);
        inode_table_unlock(fs->inodes);
        if (pending) {
            err = 0;
            is_dir = true;
            asked = false;
            fs_dir_attrs(fs, &attrs);
        }
    }
    if (err == ENOENT) {
        /* negative entry: under -o trust not kept by the kernel at all
         * (the trusted listing answers it again without a request), so
         * that a name that appears after `s3cachefs refresh` is seen: the
         * kernel's negative entries cannot be listed to be forgotten,
         * and only those below a directory whose entry is forgotten go
         * with it (not those of the mount's root) */
        if (fs_trusts(fs, parent_key))
            out->entry_timeout = 0;
        err = 0;
        goto out;
    }
    if (err != 0)
        goto out;

found:
    inode_table_lock(fs->inodes);
    struct inode *child = inode_ref_locked(fs->inodes, is_dir ? dir_key : file_key,
                                           &attrs);
    if (child != NULL && asked)
        note_asking_lookup_locked(parent, child);
    if (child != NULL)
        fs_fill_entry(fs, child, out);
    inode_table_unlock(fs->inodes);
    if (child == NULL)
        err = ENOMEM;
out:
    inode_listing_put(fs->inodes, listing);
    inode_put(fs->inodes, parent);
    free(parent_key);
    free(file_key);
    free(dir_key);
    return err;
}

void fs_forget(struct fs *fs, fuse_ino_t ino, uint64_t nlookup)
{
    inode_forget(fs->inodes, ino, nlookup);
}

/*
 * Fresh attributes for file INODE whose ATTRS are older than attr_ttl:
 * from its directory's listing when that directory is listed anyway (one
 * LIST revalidates up to 1000 files), else from a HEAD. ENOENT if the
 * object is gone.
 */
int fs_revalidate_file(struct fs *fs, struct inode *inode,
                       struct inode_attrs *attrs)
{
    char *key = inode_key_dup(fs->inodes, inode);
    struct inode *parent = NULL;
    struct inode_listing *listing = NULL;
    int err = 0;

    if (key == NULL)
        return ENOMEM;
    const char *slash = strrchr(key, '/');
    size_t parent_len = slash ? (size_t)(slash - key) + 1 : 0;
    char *parent_key = strndup(key, parent_len);
    if (parent_key == NULL) {
        free(key);
        return ENOMEM;
    }
    inode_table_lock(fs->inodes);
    parent = inode_find_locked(fs->inodes, parent_key);
    if (parent != NULL && worth_relisting_locked(fs, parent))
        inode_pin_locked(parent);
    else
        parent = NULL;
    inode_table_unlock(fs->inodes);
    free(parent_key);

    if (parent != NULL && fs_get_listing(fs, parent, RELIST_PAGES_MAX, &listing) == 0) {
        const struct inode_dirent *entry =
            inode_listing_find(listing, key + parent_len);
        if (entry == NULL || entry->attrs.kind == INODE_DIR) {
            err = ENOENT;
        } else if (strcmp(entry->attrs.etag, attrs->etag) == 0) {
            attrs->size = entry->attrs.size;
            attrs->fetched_at = entry->attrs.fetched_at;
        } else {
            err = fs_resolve_file(fs, key, &entry->attrs, attrs);
        }
        inode_listing_put(fs->inodes, listing);
    } else {
        err = fs_resolve_file(fs, key, NULL, attrs);
    }
    inode_put(fs->inodes, parent);
    free(key);
    return err;
}

int fs_getattr(struct fs *fs, fuse_ino_t ino, struct stat *out, double *timeout)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct inode_attrs attrs;
    int err = 0;

    if (inode == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    attrs = inode->attrs;
    double attr_ttl = fs_attr_ttl(fs, inode->key);
    /* staged data is what the file is; an unlinked file keeps what it was */
    bool unlinked = inode->unlinked;
    bool local = inode->wfile != NULL || unlinked;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs);
    fs_local_times_locked(inode, &attrs);
    inode_table_unlock(fs->inodes);
    if (!local && attrs.kind != INODE_DIR &&
        clock_monotonic_seconds() - attrs.fetched_at >= attr_ttl) {
        err = fs_revalidate_file(fs, inode, &attrs);
        if (err == 0) {
            inode_table_lock(fs->inodes);
            inode_update_attrs_locked(inode, &attrs);
            fs_local_times_locked(inode, &attrs);
            inode_table_unlock(fs->inodes);
        }
    }
    if (err == 0) {
        fs_attrs_to_stat(fs, ino, &attrs, out);
        if (unlinked)
            out->st_nlink = 0; /* fstat of a descriptor open on it */
        *timeout = attr_ttl;
    }
    inode_put(fs->inodes, inode);
    return err;
}
