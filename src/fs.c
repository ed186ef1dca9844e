/*
 * fs.c - filesystem operations over the bucket (see fs.h).
 *
 * Pattern for every operation: pin the inode, copy what the request needs
 * under the table lock, release the lock, talk to S3, relock and store what
 * was learnt. No lock is held during network I/O.
 *
 * Lookup of NAME in directory P ("dir wins"):
 *   - P's listing is fresh: answer from it (absent -> negative entry); a
 *     file's s3fs headers come from the inode table when known for the
 *     same ETag, else from one HEAD, or from one GET of the whole file
 *     where lookups in P are followed by reads (see lookup_file()).
 *   - otherwise: LIST prefix=P+NAME+"/" max-keys=1 (a directory?), then
 *     HEAD P+NAME (a file?).
 */
#include "config.h"

#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "fs_internal.h"
#include "inode.h"
#include "log.h"
#include "metacache.h"
#include "names.h"
#include "reader.h"
#include "s3walk.h"
#include "workers.h"

#define MAX_REQUEST (8u << 20)           /* largest coalesced GET */
#define LOGGED_KEYS_MAX 10000            /* "skipped key" lines, once each */
#define STATFS_BLOCK 4096
#define STATFS_BLOCKS (1ull << 38)       /* report 1 PiB, all free */
#define UNKNOWN_INO 0xffffffffu          /* readdir: the kernel looks it up */
#define RELIST_PAGES_MAX 10              /* see worth_relisting() */
#define PROBES_BEFORE_LISTING 8          /* see fs_lookup() */
#define LOOKUP_FETCH_MAX (1u << 20)      /* largest file a lookup GETs whole */
#define READ_PATTERN_MIN 8               /* see reads_follow_lookups_locked() */
#define READ_PATTERN_WINDOW 64
#define STALE_LISTING_TTLS 10            /* see fs_lookup(), fs_opendir() */
#define LISTING_ATTEMPTS 3               /* see fs_get_listing() */
#define REFRESH_THREADS 2                /* background relistings at once */
#define REFRESH_QUEUE_MAX 64             /* and queued at most */

void fs_handle_add(struct fs *fs, struct fs_handle *list, struct fs_handle *handle)
{
    pthread_mutex_lock(&fs->handles_lock);
    handle->next = list->next;
    handle->prev = list;
    list->next->prev = handle;
    list->next = handle;
    pthread_mutex_unlock(&fs->handles_lock);
}

void fs_handle_remove(struct fs *fs, struct fs_handle *handle)
{
    if (handle->prev == NULL)
        return; /* never linked */
    pthread_mutex_lock(&fs->handles_lock);
    handle->prev->next = handle->next;
    handle->next->prev = handle->prev;
    handle->next = handle->prev = handle;
    pthread_mutex_unlock(&fs->handles_lock);
}

/* The first handle of LIST, unlinked; NULL when empty. */
static struct fs_handle *handle_pop(struct fs *fs, struct fs_handle *list)
{
    pthread_mutex_lock(&fs->handles_lock);
    struct fs_handle *handle = list->next != list ? list->next : NULL;
    if (handle != NULL) {
        handle->prev->next = handle->next;
        handle->next->prev = handle->prev;
        handle->next = handle->prev = handle;
    }
    pthread_mutex_unlock(&fs->handles_lock);
    return handle;
}

/* Log a skipped or hidden key once per mount, whatever the relistings. */
static void log_key_once(struct fs *fs, const char *key, const char *why)
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
    if (first)
        log_warn("key '%s' is not shown: %s", key, why);
}

/* ------------------------------------------------------------ attributes */

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

void fs_head_file_attrs(const struct fs *fs, const struct s3_object_info *info,
                            struct inode_attrs *out)
{
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
         * an object is never a directory */
        out->kind = inode_kind_of_mode(info->mode);
        if (out->kind == INODE_DIR)
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

void fs_fill_entry(const struct fs *fs, const struct inode *inode,
                       struct fs_entry *out)
{
    struct inode_attrs attrs = inode->attrs;

    out->ino = inode->ino;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs);
    fs_local_times_locked(inode, &attrs);
    fs_attrs_to_stat(fs, inode->ino, &attrs, &out->attr);
    out->attr_timeout = fs->conf.attr_ttl;
    out->entry_timeout = fs->conf.dir_ttl;
}

/* ------------------------------------------------------------- listings */

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
            log_key_once(fs, object->key, "it cannot be a file name");
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
            log_key_once(fs, page->prefixes[i], "it cannot be a directory name");
            break;
        }
    }
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
                log_key_once(fs, key, "a directory of the same name hides it");
            free(key);
            free(builder.entries[i].name);
            continue;
        }
        builder.entries[kept++] = builder.entries[i];
    }
    builder.count = kept;
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

/* Files being written or waiting for their upload are not in the bucket
 * yet: add them to DIR's new listing. Lock held. */
static void merge_staged_locked(struct fs *fs, struct inode *dir)
{
    struct staged_merge merge = {fs, dir, strlen(dir->key)};

    fs_staged_visit_locked(fs, dir->key, merge_one_locked, &merge);
}

/* Whether PREFIX starts KEY. */
static bool key_under(const char *key, const char *prefix)
{
    return strncmp(key, prefix, strlen(prefix)) == 0;
}

bool fs_move_under_way_locked(const struct fs *fs, const char *dir_key)
{
    for (const struct fs_dir_move *move = fs->dir_moves; move != NULL;
         move = move->next)
        if (key_under(dir_key, move->src_prefix) || key_under(dir_key, move->dst_prefix))
            return true;
    return false;
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
                clock_monotonic_seconds() - dir->listing->fetched_at < fs->conf.dir_ttl) {
                *out = inode_listing_ref_locked(dir->listing);
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
        } else if (metacache_get_listing(fs->conf.cache, dir_key, fs->conf.dir_ttl,
                                         &listing) != 0) {
            err = fetch_listing(fs, dir_key, max_pages, &listing);
            from_bucket = err == 0;
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

/*
 * Whether to answer a lookup or a revalidation in directory DIR by listing
 * it again rather than asking about one name. One page (up to 1000 keys)
 * never costs more than a probe; a few pages pay off when the listing then
 * serves the lookups of dir_ttl seconds, but not when dir_ttl is tiny.
 * Call with the table lock held.
 */
static bool worth_relisting_locked(const struct fs *fs, const struct inode *dir)
{
    if (dir->listing == NULL)
        return false;
    size_t pages = (dir->listing->count + LIST_PAGE - 1) / LIST_PAGE;
    return pages <= 1 || (fs->conf.dir_ttl >= 1.0 && pages <= RELIST_PAGES_MAX);
}

/* ---------------------------------------------------- parallel HEADs */

struct head_batch {
    pthread_mutex_t lock;
    pthread_cond_t all_done;
    size_t pending;
};

struct head_job {
    struct head_batch *batch;
    struct s3_client *s3;
    size_t slot;                 /* which entry of the batch it is for */
    char *key;
    struct s3_object_info info;
    int err;
};

static void head_job_main(void *arg)
{
    struct head_job *job = arg;

    job->err = s3_head_object(job->s3, job->key, &job->info);
    pthread_mutex_lock(&job->batch->lock);
    if (--job->batch->pending == 0)
        pthread_cond_signal(&job->batch->all_done);
    pthread_mutex_unlock(&job->batch->lock);
}

/* HEAD each job's key on the worker pool; returns when all are done. */
static void run_heads(struct fs *fs, struct head_job *jobs, size_t count)
{
    struct head_batch batch = {.pending = count};

    pthread_mutex_init(&batch.lock, NULL);
    pthread_cond_init(&batch.all_done, NULL);
    for (size_t i = 0; i < count; i++) {
        jobs[i].batch = &batch;
        jobs[i].s3 = fs->s3;
        if (workers_submit(fs->workers, head_job_main, &jobs[i]) != 0)
            head_job_main(&jobs[i]); /* pool gone: do it here */
    }
    pthread_mutex_lock(&batch.lock);
    while (batch.pending > 0)
        pthread_cond_wait(&batch.all_done, &batch.lock);
    pthread_mutex_unlock(&batch.lock);
    pthread_mutex_destroy(&batch.lock);
    pthread_cond_destroy(&batch.all_done);
}

/* --------------------------------------------------------------- lookup */

/* The attributes of file KEY whose listing said LISTED, if its s3fs
 * headers are already known for that ETag (in the inode table or the
 * metadata cache): no request needed. */
static bool known_file_attrs(struct fs *fs, const char *key,
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
    if (usable) {
        out->size = listed->size;
        out->fetched_at = listed->fetched_at;
    }
    return usable;
}

/* Apply the s3fs headers of directory marker INFO to ATTRS. */
static void apply_dir_headers(const struct fs *fs, const struct s3_object_info *info,
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
static bool known_dir_attrs(struct fs *fs, const char *dir_key,
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

/* A directory's mode and owner live in the headers of its marker (as s3fs
 * writes them): one HEAD per directory and mount; none when there is no
 * marker (defaults). Failures leave the defaults. */
static void resolve_dir(struct fs *fs, const char *dir_key, struct inode_attrs *attrs)
{
    struct s3_object_info info;

    if (known_dir_attrs(fs, dir_key, attrs))
        return;
    int err = s3_head_object(fs->s3, dir_key, &info);
    if (err == 0)
        apply_dir_headers(fs, &info, attrs);
    else if (err == ENOENT)
        attrs->headers_known = true; /* no marker: the defaults are right */
}

/* Attributes of file KEY whose listing said LISTED (may be NULL): the
 * known headers of the same ETag, or a HEAD (remembered by ETag). */
int fs_resolve_file(struct fs *fs, const char *key,
                        const struct inode_attrs *listed, struct inode_attrs *out)
{
    struct s3_object_info info;

    if (listed != NULL && known_file_attrs(fs, key, listed, out))
        return 0;
    int err = s3_head_object(fs->s3, key, &info);
    if (err == 0) {
        fs_head_file_attrs(fs, &info, out);
        metacache_put_attrs(fs->conf.cache, key, out);
    }
    return err;
}

/*
 * Whether the files that lookups in directory DIR ask the bucket about are
 * then read (a data loader opening files by name): at least half of the
 * recent ones were opened for reading. Lock held.
 */
static bool reads_follow_lookups_locked(const struct inode *dir)
{
    return dir->asking_lookups >= READ_PATTERN_MIN &&
           2 * dir->reads_after_lookup >= dir->asking_lookups;
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
static void note_read_open(struct fs *fs, struct inode *inode, const char *key)
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
 * date), else from the bucket (*asked). Where files
 * looked up are then read (reads_follow_lookups_locked), a small file is
 * fetched whole into the cache with one GET, which carries the same
 * headers as a HEAD: the open and read that follow need no request. That
 * costs at most LOOKUP_FETCH_MAX bytes for a file looked up but not read.
 */
static int lookup_file(struct fs *fs, struct inode *dir, const char *key,
                       const struct inode_attrs *listed, bool confirm,
                       struct inode_attrs *out, bool *asked)
{
    struct s3_object_info info;

    *asked = false;
    if (!confirm && known_file_attrs(fs, key, listed, out))
        return 0;
    *asked = true;
    inode_table_lock(fs->inodes);
    bool fetch = reads_follow_lookups_locked(dir);
    /* a newer version known here than the listing's: opening the cache
     * for the listed one would drop the newer one's blocks */
    struct inode *known = inode_find_locked(fs->inodes, key);
    if (known != NULL && known->attrs.fetched_at > listed->fetched_at)
        fetch = false;
    inode_table_unlock(fs->inodes);
    if (fetch && listed->size > 0 && listed->size <= LOOKUP_FETCH_MAX &&
        listed->etag[0] != '\0') {
        int err = reader_fetch_whole(fs->reader, key, listed->etag,
                                     listed->size, &info);
        if (err == 0) {
            fs_head_file_attrs(fs, &info, out);
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
    out->entry_timeout = fs->conf.dir_ttl;
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

    /* A directory listed before is listed again (one LIST per 1000 keys
     * answers every lookup in it for dir_ttl); others are probed. */
    /* Many lookups in a directory never listed (a data loader opening files
     * by name) are cheaper answered by listing it once, if that takes a
     * few pages: after PROBES_BEFORE_LISTING probes (two requests each) it
     * is tried. */
    if (parent->listing != NULL &&
        clock_monotonic_seconds() - parent->listing->fetched_at < fs->conf.dir_ttl)
        listing = inode_listing_ref_locked(parent->listing); /* fresh */
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
    if (listed && (parent->listing_fetch ||
                   clock_monotonic_seconds() - parent->listing->fetched_at <
                       STALE_LISTING_TTLS * fs->conf.dir_ttl)) {
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
    bool try_listing = listing == NULL && !listed && !parent->too_big_to_list &&
                       ++parent->probes >= PROBES_BEFORE_LISTING;
    inode_table_unlock(fs->inodes);
    if (listed || try_listing) {
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
            err = lookup_file(fs, parent, file_key, &entry->attrs, confirm,
                              &attrs, &asked);
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
        err = 0; /* negative entry */
        goto out;
    }
    if (err != 0)
        goto out;

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
    /* staged data is what the file is; an unlinked file keeps what it was */
    bool unlinked = inode->unlinked;
    bool local = inode->wfile != NULL || unlinked;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &attrs);
    fs_local_times_locked(inode, &attrs);
    inode_table_unlock(fs->inodes);
    if (!local && attrs.kind != INODE_DIR &&
        clock_monotonic_seconds() - attrs.fetched_at >= fs->conf.attr_ttl) {
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
        *timeout = fs->conf.attr_ttl;
    }
    inode_put(fs->inodes, inode);
    return err;
}

/* ----------------------------------------------------------- directories */

/* A listing of directory DIR fetched in the background (fs_opendir): the
 * job holds a pin of DIR and owns the struct. */
struct listing_refresh {
    struct fs *fs;
    struct inode *dir;
};

/* JOB ran, or could not be queued: undo what listing_to_show() set. */
static void listing_refresh_end(struct listing_refresh *job)
{
    struct fs *fs = job->fs;

    inode_table_lock(fs->inodes);
    job->dir->listing_refresh = false;
    fs->refreshes_queued--;
    inode_table_unlock(fs->inodes);
    inode_put(fs->inodes, job->dir);
    free(job);
}

static void listing_refresh_main(void *arg)
{
    struct listing_refresh *job = arg;
    struct fs *fs = job->fs;
    struct inode_listing *listing = NULL;

    inode_table_lock(fs->inodes);
    /* (nobody to show it to once the kernel forgot the directory) */
    bool skip = fs->stopping || job->dir->unlinked || job->dir->nlookup == 0;
    inode_table_unlock(fs->inodes);
    /* a failure leaves the old listing: the next opendir past the stale
     * window lists again in the foreground, and reports the error */
    if (!skip && fs_get_listing(fs, job->dir, 0, &listing) == 0)
        inode_listing_put(fs->inodes, listing);
    listing_refresh_end(job);
}

/*
 * The listing an opendir of DIR may show without waiting for a LIST, one
 * reference for the caller, or NULL. Stale-while-revalidate: a listing
 * younger than dir_ttl is shown as is; one younger than
 * STALE_LISTING_TTLS x dir_ttl is shown too, and a new one is fetched in
 * the background for the next opendir. So an `ls` repeated within a few
 * seconds never waits for a LIST (one costs about 0.25 s per 1000
 * keys on some servers), while what other nodes changed shows at the
 * latest STALE_LISTING_TTLS x dir_ttl later, as for lookups (fs_lookup).
 * Local changes are in the listing already (inode_listing_patch_locked).
 * Relistings run on a pool of their own (REFRESH_THREADS), so that they
 * never hold up the HEADs and read-ahead that callers wait for.
 */
static struct inode_listing *listing_to_show(struct fs *fs, struct inode *dir)
{
    struct listing_refresh *job = NULL;
    struct inode_listing *listing = NULL;

    inode_table_lock(fs->inodes);
    if (dir->listing != NULL) {
        double age = clock_monotonic_seconds() - dir->listing->fetched_at;
        if (age < STALE_LISTING_TTLS * fs->conf.dir_ttl)
            listing = inode_listing_ref_locked(dir->listing);
        /* a full queue (find, du): the next opendir asks again */
        if (listing != NULL && age >= fs->conf.dir_ttl && !dir->listing_fetch &&
            !dir->listing_refresh && !fs->stopping &&
            fs->refreshes_queued < REFRESH_QUEUE_MAX &&
            (job = malloc(sizeof(*job))) != NULL) {
            *job = (struct listing_refresh){fs, dir};
            dir->listing_refresh = true;
            fs->refreshes_queued++;
            inode_pin_locked(dir);
        }
    }
    inode_table_unlock(fs->inodes);
    if (job != NULL &&
        workers_submit(fs->refresh_workers, listing_refresh_main, job) != 0)
        listing_refresh_end(job);
    return listing;
}

int fs_opendir(struct fs *fs, fuse_ino_t ino, struct fs_dir **out)
{
    struct inode *inode = inode_get(fs->inodes, ino);
    struct fs_dir *dir = NULL;
    int err = 0;

    *out = NULL;
    if (inode == NULL)
        return ENOENT;
    inode_table_lock(fs->inodes);
    bool is_dir = inode->attrs.kind == INODE_DIR;
    inode_table_unlock(fs->inodes);
    if (!is_dir) {
        err = ENOTDIR;
        goto out;
    }
    dir = calloc(1, sizeof(*dir));
    if (dir == NULL) {
        err = ENOMEM;
        goto out;
    }
    dir->ino = ino;
    dir->listing = listing_to_show(fs, inode);
    if (dir->listing == NULL)
        err = fs_get_listing(fs, inode, 0, &dir->listing);
    if (err != 0) {
        free(dir);
        dir = NULL;
    } else {
        fs_handle_add(fs, &fs->open_dirs, &dir->link);
    }
out:
    inode_put(fs->inodes, inode);
    *out = dir;
    return err;
}

size_t fs_dir_count(const struct fs_dir *dir)
{
    return dir->listing->count + 2;
}

const char *fs_dir_entry(const struct fs *fs, const struct fs_dir *dir,
                         size_t index, struct stat *attr)
{
    memset(attr, 0, sizeof(*attr));
    if (index < 2) {
        attr->st_ino = dir->ino;
        attr->st_mode = S_IFDIR;
        return index == 0 ? "." : "..";
    }
    const struct inode_dirent *entry = &dir->listing->entries[index - 2];
    fs_attrs_to_stat(fs, UNKNOWN_INO, &entry->attrs, attr);
    return entry->name;
}

int fs_dir_entries_plus(struct fs *fs, struct fs_dir *dir, size_t index,
                        size_t count, struct fs_entry *out)
{
    struct inode *dir_inode = inode_get(fs->inodes, dir->ino);
    struct head_job *jobs = NULL;
    struct inode_attrs *attrs = NULL;
    size_t job_count = 0;
    size_t failed_at = 0;
    int err = 0;

    if (dir_inode == NULL)
        return ENOENT;
    char *dir_key = inode_key_dup(fs->inodes, dir_inode);
    if (dir_key == NULL) {
        inode_put(fs->inodes, dir_inode);
        return ENOMEM;
    }
    if (index + count > fs_dir_count(dir))
        count = index < fs_dir_count(dir) ? fs_dir_count(dir) - index : 0;
    jobs = calloc(count ? count : 1, sizeof(*jobs));
    attrs = calloc(count ? count : 1, sizeof(*attrs));
    if (jobs == NULL || attrs == NULL) {
        err = ENOMEM;
        goto out;
    }
    /* Which files lack their headers? Gather them, HEAD them in parallel. */
    for (size_t i = 0; i < count; i++) {
        size_t at = index + i;
        if (at < 2)
            continue;
        const struct inode_dirent *entry = &dir->listing->entries[at - 2];
        attrs[i] = entry->attrs;
        bool is_dir = entry->attrs.kind == INODE_DIR;
        /* a file staged when the listing was made (no ETag): known while it
         * stays staged; once it is not, only the bucket knows what it is */
        bool was_staged = !is_dir && entry->attrs.etag[0] == '\0';
        if (entry->attrs.headers_known && !was_staged)
            continue;
        char *key = names_child_key(dir_key, entry->name,
                                    strlen(entry->name), is_dir);
        if (key == NULL) {
            err = ENOMEM;
            goto out;
        }
        if (was_staged) {
            inode_table_lock(fs->inodes);
            struct inode *known = inode_find_locked(fs->inodes, key);
            bool staged = known != NULL && known->wfile != NULL;
            inode_table_unlock(fs->inodes);
            if (staged) {
                free(key);
                continue;
            }
        }
        if (is_dir ? known_dir_attrs(fs, key, &attrs[i])
                   : known_file_attrs(fs, key, &entry->attrs, &attrs[i])) {
            free(key);
            continue;
        }
        jobs[job_count].key = key;
        jobs[job_count].slot = i;
        job_count++;
    }
    run_heads(fs, jobs, job_count);
    for (size_t j = 0; j < job_count; j++) {
        /* a failed HEAD leaves the listing's attributes: never fail readdir */
        struct inode_attrs *slot = &attrs[jobs[j].slot];
        if (slot->kind == INODE_DIR) {
            if (jobs[j].err == 0)
                apply_dir_headers(fs, &jobs[j].info, slot);
            else if (jobs[j].err == ENOENT)
                slot->headers_known = true;
            if (jobs[j].err == 0 || jobs[j].err == ENOENT)
                slot->fetched_at = clock_monotonic_seconds(); /* newer than the inode's */
        } else if (jobs[j].err == 0) {
            fs_head_file_attrs(fs, &jobs[j].info, slot);
            metacache_put_attrs(fs->conf.cache, jobs[j].key, slot);
        }
    }

    inode_table_lock(fs->inodes);
    for (size_t i = 0; i < count; i++) {
        size_t at = index + i;
        memset(&out[i], 0, sizeof(out[i]));
        if (at < 2) {
            out[i].ino = dir->ino;
            out[i].attr.st_ino = dir->ino;
            out[i].attr.st_mode = S_IFDIR;
            continue;
        }
        const struct inode_dirent *entry = &dir->listing->entries[at - 2];
        char *key = names_child_key(dir_key, entry->name,
                                    strlen(entry->name), attrs[i].kind == INODE_DIR);
        struct inode *known = key ? inode_find_locked(fs->inodes, key) : NULL;
        bool staged = known != NULL && known->wfile != NULL;
        /* a listing shown stale (listing_to_show) may predate what a HEAD
         * or an open learnt since: keep the newer attributes */
        bool newer = known != NULL && known->attrs.fetched_at > attrs[i].fetched_at;
        /* a file that was staged when the listing was made, and no longer
         * is (uploaded, its inode forgotten since the first loop): what is
         * in the bucket is not known, and is asked for before it is used */
        bool unknown = !staged && attrs[i].kind == INODE_FILE &&
                       attrs[i].etag[0] == '\0';
        if (unknown) {
            attrs[i].headers_known = false;
            attrs[i].fetched_at = 0;
        }
        struct inode *child = key ? inode_ref_locked(fs->inodes, key,
                                                     staged || newer ? NULL
                                                                     : &attrs[i])
                                  : NULL;
        if (child != NULL && unknown && child->wfile == NULL &&
            child->attrs.etag[0] == '\0')
            child->object_unknown = true;
        free(key);
        if (child == NULL) {
            err = ENOMEM;
            failed_at = i;
            break;
        }
        fs_fill_entry(fs, child, &out[i]);
    }
    inode_table_unlock(fs->inodes);
    /* on failure the kernel gets none of them: return the references */
    for (size_t k = 0; err != 0 && k < failed_at; k++)
        if (index + k >= 2)
            inode_forget(fs->inodes, out[k].ino, 1);
out:
    for (size_t j = 0; j < job_count; j++)
        free(jobs[j].key);
    free(jobs);
    free(attrs);
    inode_put(fs->inodes, dir_inode);
    free(dir_key);
    return err;
}

void fs_releasedir(struct fs *fs, struct fs_dir *dir)
{
    if (dir == NULL)
        return;
    fs_handle_remove(fs, &dir->link);
    inode_listing_put(fs->inodes, dir->listing);
    free(dir);
}

/* ----------------------------------------------------------------- files */

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
        clock_monotonic_seconds() - attrs.fetched_at >= fs->conf.attr_ttl) {
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
            inode_table_unlock(fs->inodes);
        }
        goto out;
    }

    inode_table_lock(fs->inodes);
    *keep_cache = inode->opened_etag[0] != '\0' &&
                  strcmp(inode->opened_etag, attrs.etag) == 0;
    snprintf(inode->opened_etag, sizeof(inode->opened_etag), "%s", attrs.etag);
    key = strdup(inode->key);
    inode_table_unlock(fs->inodes);
    if (key != NULL)
        note_read_open(fs, inode, key);
    err = key == NULL ? ENOMEM
                      : reader_open(fs->reader, key, attrs.etag, attrs.size,
                                    &file->reader_file);
out:
    if (err != 0 && file != NULL) {
        fs_staged_put(fs, inode, &file->wfile);
        free(file);
        file = NULL;
    }
    if (err != 0) {
        fs_maybe_detach(fs, inode);
    } else {
        inode_table_lock(fs->inodes);
        inode->open_handles++;
        inode_table_unlock(fs->inodes);
        fs_handle_add(fs, &fs->open_files, &file->link);
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
    char *text = NULL;
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
    if (attrs.size == 0 || attrs.size >= PATH_MAX) {
        log_warn("symlink %llu has an invalid target length %llu",
                 (unsigned long long)ino, (unsigned long long)attrs.size);
        err = EIO;
        goto out;
    }
    text = calloc(1, (size_t)attrs.size + 1);
    if (text == NULL) {
        err = ENOMEM;
        goto out;
    }
    char *key = inode_key_dup(fs->inodes, inode);
    err = key == NULL ? ENOMEM
        : s3_get_object_range(fs->s3, key, 0, (size_t)attrs.size,
                              attrs.etag[0] ? attrs.etag : NULL, text, &got, NULL);
    free(key);
    if (err == 0 && (got != attrs.size || memchr(text, '\0', got) != NULL))
        err = EIO;
    if (err == 0) {
        inode_table_lock(fs->inodes);
        if (inode->symlink_target == NULL &&
            strcmp(inode->attrs.etag, attrs.etag) == 0)
            inode->symlink_target = strdup(text);
        inode_table_unlock(fs->inodes);
    }
out:
    inode_put(fs->inodes, inode);
    if (err != 0) {
        free(text);
        text = NULL;
    }
    *target = text;
    return err;
}

int fs_statfs(struct fs *fs, struct statvfs *out)
{
    (void)fs;
    memset(out, 0, sizeof(*out));
    out->f_bsize = STATFS_BLOCK;
    out->f_frsize = STATFS_BLOCK;
    out->f_blocks = STATFS_BLOCKS;
    out->f_bfree = STATFS_BLOCKS;
    out->f_bavail = STATFS_BLOCKS;
    out->f_files = 1ull << 32;
    out->f_ffree = 1ull << 32;
    out->f_favail = 1ull << 32;
    out->f_namemax = NAMES_NAME_MAX;
    return 0;
}

/* ------------------------------------------------------------- lifecycle */

int fs_create(const struct fs_conf *conf, struct s3_client *s3, struct fs **out)
{
    struct fs *fs = calloc(1, sizeof(*fs));
    struct inode_attrs root;
    int err = 0;

    *out = NULL;
    if (fs == NULL)
        return ENOMEM;
    fs->conf = *conf;
    fs->s3 = s3;
    pthread_mutex_init(&fs->logged_lock, NULL);
    pthread_mutex_init(&fs->handles_lock, NULL);
    fs->open_dirs.next = fs->open_dirs.prev = &fs->open_dirs;
    fs->open_files.next = fs->open_files.prev = &fs->open_files;
    pthread_cond_init(&fs->listing_done, NULL);
    pthread_cond_init(&fs->move_done, NULL);
    fs->mount_time = clock_wall_now();
    fs->root_key = strdup(conf->root_key);
    if (fs->root_key == NULL) {
        err = ENOMEM;
        goto out;
    }
    fs->conf.root_key = fs->root_key;
    fs_dir_attrs(fs, &root);
    if (conf->cache != NULL) {
        /* listings stored by earlier mounts that no lookup may use now;
         * all of them after a crash: the changes the crashed mount made
         * last (and the uploads recovery is about to make) may not be in
         * them, and a listing is trusted for dir_ttl without a request */
        bool crashed = cache_left_open(conf->cache);
        uint64_t pruned = 0;
        if (metacache_prune_listings(conf->cache, crashed ? 0 : conf->dir_ttl,
                                     &pruned) == 0 && pruned > 0)
            log_debug("dropped %llu stored listings %s", (unsigned long long)pruned,
                      crashed ? "(the last mount did not end cleanly)"
                              : "older than dir_ttl");
    }
    err = inode_table_create(fs->root_key, &root, &fs->inodes);
    if (err == 0)
        err = workers_create(conf->connections, &fs->workers);
    if (err == 0)
        err = workers_create(REFRESH_THREADS, &fs->refresh_workers);
    if (err == 0) {
        struct reader_conf reader_conf = {
            .s3 = s3,
            .cache = conf->cache,
            .workers = fs->workers,
            .read_ahead = conf->read_ahead,
            .max_request = MAX_REQUEST,
        };
        err = reader_create(&reader_conf, &fs->reader);
    }
    if (err == 0)
        err = workers_create(conf->connections, &fs->upload_workers);
    fs->upload = (struct upload_conf){
        .s3 = s3,
        .workers = fs->upload_workers,
        .parallel = conf->connections,
        .multipart_threshold = conf->multipart_threshold,
        .part_size = conf->part_size,
    };
    if (err == 0 && conf->journal != NULL) {
        struct writer_conf writer_conf = {
            .s3 = s3,
            .cache = conf->cache,
            .workers = fs->upload_workers,
            .journal = conf->journal,
            .writeback = conf->writeback,
            .uploaders = conf->connections < 8 ? conf->connections : 8,
            .parallel_parts = conf->connections,
            .multipart_threshold = conf->multipart_threshold,
            .part_size = conf->part_size,
            .uploaded = fs_uploaded,
            .uploaded_arg = fs,
            .fetch_base = fs_fetch_base,
            .fetch_arg = fs,
        };
        err = writer_create(&writer_conf, &fs->writer);
    }
out:
    if (err != 0)
        fs_destroy(&fs);
    *out = fs;
    return err;
}

static void no_free(void *node)
{
    (void)node;
}

static int compare_pointers(const void *a, const void *b)
{
    return a < b ? -1 : a > b;
}

int fs_recover(struct fs *fs)
{
    if (fs->writer == NULL)
        return 0;
    return writer_recover(fs->writer, fs_recovered, fs);
}

/* Put the staged file of every inode that has one (after the drain). */
static void detach_all(struct fs *fs)
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

uint64_t fs_drain(struct fs *fs)
{
    fs->stopping = true; /* background relistings are of no use any more */
    if (fs->writer == NULL)
        return 0;
    uint64_t left = writer_drain(fs->writer);
    detach_all(fs);
    return left;
}

void fs_destroy(struct fs **fsp)
{
    struct fs *fs = *fsp;

    if (fs == NULL)
        return;
    fs->stopping = true;
    /* handles whose release the kernel never sent */
    struct fs_handle *handle;
    while ((handle = handle_pop(fs, &fs->open_files)) != NULL)
        fs_release(fs, (struct fs_file *)handle);
    while ((handle = handle_pop(fs, &fs->open_dirs)) != NULL)
        fs_releasedir(fs, (struct fs_dir *)handle);
    if (fs->writer != NULL)
        fs_drain(fs);
    writer_destroy(&fs->writer);
    workers_destroy(&fs->upload_workers);
    if (fs->reader != NULL)
        reader_stop(fs->reader); /* queued read-ahead ends at once */
    workers_destroy(&fs->refresh_workers);
    workers_destroy(&fs->workers);
    reader_destroy(&fs->reader);
    inode_table_destroy(&fs->inodes);
    tdestroy(fs->logged_keys, free);
    tdestroy(fs->staged, no_free);
    pthread_mutex_destroy(&fs->logged_lock);
    pthread_mutex_destroy(&fs->handles_lock);
    pthread_cond_destroy(&fs->listing_done);
    pthread_cond_destroy(&fs->move_done);
    free(fs->root_key);
    free(fs);
    *fsp = NULL;
}

void fs_get_stats(struct fs *fs, struct fs_stats *out)
{
    struct reader_stats reader;

    memset(out, 0, sizeof(*out));
    s3_client_stats(fs->s3, &out->s3);
    cache_get_stats(fs->conf.cache, &out->cache);
    reader_get_stats(fs->reader, &reader);
    out->bytes_read = reader.bytes_read;
    out->hit_bytes = reader.hit_bytes;
    out->direct_bytes = reader.direct_bytes;
    out->inodes = inode_table_count(fs->inodes);
    if (fs->writer != NULL) {
        struct writer_stats writer;
        writer_get_stats(fs->writer, &writer);
        out->bytes_written = writer.bytes_written;
        out->uploads_pending = writer.uploads_pending;
        out->uploads_completed = writer.uploads_completed;
        out->upload_failures = writer.upload_failures;
        out->upload_retries = writer.upload_retries;
        out->copies_on_write = writer.copies_on_write;
    }
}

int fs_stats_text(struct fs *fs, char **text)
{
    struct fs_stats st;
    static const char *const op_names[S3_OP_COUNT] = {
        [S3_OP_GET] = "get", [S3_OP_HEAD] = "head", [S3_OP_LIST] = "list",
        [S3_OP_PUT] = "put", [S3_OP_DELETE] = "delete", [S3_OP_COPY] = "copy",
        [S3_OP_MULTIPART] = "multipart",
    };
    char requests[512] = "";
    size_t used = 0;

    fs_get_stats(fs, &st);
    for (int op = 0; op < S3_OP_COUNT; op++)
        used += (size_t)snprintf(requests + used, sizeof(requests) - used,
                                 "requests_%s %llu\n", op_names[op],
                                 (unsigned long long)st.s3.requests[op]);
    uint64_t served = st.hit_bytes;
    uint64_t fetched = st.s3.bytes_received;
    double hit_ratio = served + fetched > 0
                           ? (double)served / (double)(served + fetched) : 0;
    int n = asprintf(text,
        "bytes_read %llu\n"
        "bytes_from_cache %llu\n"
        "bytes_from_bucket %llu\n"
        "bytes_to_bucket %llu\n"
        "bytes_read_around_cache %llu\n"
        "cache_hit_ratio %.4f\n"
        "cache_used_bytes %llu\n"
        "cache_index_bytes %llu\n"
        "cache_protected_bytes %llu\n"
        "cache_size_bytes %llu\n"
        "cache_blocks %llu\n"
        "cache_evicted_blocks %llu\n"
        "cache_corrupt_blocks %llu\n"
        "%s"
        "retries %llu\n"
        "failures %llu\n"
        "inodes %llu\n"
        "bytes_written %llu\n"
        "uploads_pending %llu\n"
        "uploads_completed %llu\n"
        "upload_failures %llu\n"
        "upload_retries %llu\n"
        "copies_on_write %llu\n",
        (unsigned long long)st.bytes_read, (unsigned long long)served,
        (unsigned long long)fetched, (unsigned long long)st.s3.bytes_sent,
        (unsigned long long)st.direct_bytes, hit_ratio,
        (unsigned long long)st.cache.used_bytes,
        (unsigned long long)st.cache.index_bytes,
        (unsigned long long)st.cache.protected_bytes,
        (unsigned long long)st.cache.size_limit,
        (unsigned long long)st.cache.blocks,
        (unsigned long long)st.cache.evicted_blocks,
        (unsigned long long)st.cache.corrupt_blocks, requests,
        (unsigned long long)st.s3.retries, (unsigned long long)st.s3.failures,
        (unsigned long long)st.inodes, (unsigned long long)st.bytes_written,
        (unsigned long long)st.uploads_pending,
        (unsigned long long)st.uploads_completed,
        (unsigned long long)st.upload_failures,
        (unsigned long long)st.upload_retries,
        (unsigned long long)st.copies_on_write);
    if (n < 0) {
        *text = NULL;
        return ENOMEM;
    }
    return 0;
}
