/*
 * fs_dir.c - open directories: opendir takes a listing (stale while
 * revalidated in the background, within limits), readdir walks it, and
 * readdirplus fills in the attributes it lacks with HEADs in parallel,
 * except for files whose type the listing makes certain: those go to the
 * kernel as plain entries (ino 0), and a stat of one is a lookup, which
 * the head-ahead of fs_ahead.c serves.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"

#define UNKNOWN_INO 0xffffffffu          /* readdir: the kernel looks it up */
#define REFRESH_QUEUE_MAX 64             /* and queued at most */

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
        double ttl = fs_dir_ttl(fs, dir->key);
        if (age < STALE_LISTING_TTLS * ttl)
            listing = inode_dir_listing_use_locked(fs->inodes, dir);
        /* a full queue (find, du): the next opendir asks again */
        if (listing != NULL && age >= ttl && !dir->listing_fetch &&
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

static void release_dir_handle(struct fs *fs, struct fs_handle *handle)
{
    fs_releasedir(fs, (struct fs_dir *)handle);
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
        fs_handle_add(fs, &fs->open_dirs, &dir->link, release_dir_handle);
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
    bool *plain = NULL;
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
    plain = calloc(count ? count : 1, sizeof(*plain));
    if (jobs == NULL || attrs == NULL || plain == NULL) {
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
        /* A file too large to be a link or a special file is a regular
         * file: the kernel gets its name and type, no attributes and no
         * inode (ino 0), and no HEAD is sent. `find`, `ls` and os.walk
         * never ask for more; a stat is a lookup, and the first one in
         * this directory starts the HEADs of the entries after it (the
         * head-ahead of fs_ahead.c). A file the inode table has (the
         * kernel may hold it) is answered in full, as before; so is one
         * whose headers are known, unless a head-ahead job holds them
         * for the lookup the walk will send. */
        bool large = !is_dir && !was_staged &&
                     entry->attrs.size > FS_TYPED_OBJECT_MAX;
        /* Under -o no_headers every object is a regular file, whatever
         * its size, and a lookup of it is answered from the listing with
         * no request: plain too, so that the daemon keeps no inode for
         * each of the million files a `find` walks past. */
        bool headerless = !is_dir && !was_staged && fs_headerless(fs, key);
        if (large || headerless) {
            inode_table_lock(fs->inodes);
            plain[i] = inode_find_locked(fs->inodes, key) == NULL &&
                       (headerless ||
                        fs_ahead_holds_locked(fs, dir_inode, entry->name));
            inode_table_unlock(fs->inodes);
            if (plain[i]) {
                free(key);
                continue;
            }
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
        if (is_dir ? fs_known_dir_attrs(fs, key, &attrs[i]) ||
                         fs_stored_dir_attrs(fs, key, &attrs[i]) ||
                         fs_headerless_dir_attrs(fs, key, &attrs[i])
                   : fs_known_file_attrs(fs, key, &entry->attrs, &attrs[i])) {
            free(key);
            continue;
        }
        if (large) { /* its headers not known: plain (above) */
            inode_table_lock(fs->inodes);
            plain[i] = inode_find_locked(fs->inodes, key) == NULL;
            inode_table_unlock(fs->inodes);
            if (plain[i]) {
                free(key);
                continue;
            }
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
                fs_apply_dir_headers(fs, &jobs[j].info, slot);
            else if (jobs[j].err == ENOENT)
                slot->headers_known = true;
            if (jobs[j].err == 0 || jobs[j].err == ENOENT)
                slot->fetched_at = clock_monotonic_seconds(); /* newer than the inode's */
            fs_store_dir_attrs(fs, jobs[j].key, slot);
        } else if (jobs[j].err == 0) {
            fs_head_file_attrs(fs, jobs[j].key, &jobs[j].info, slot);
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
        if (attrs[i].kind != INODE_DIR)
            fs_ahead_entry_passed_locked(fs, dir_inode, entry->name, plain[i]);
        if (plain[i]) {
            /* a name and a type (DT_REG), not looked up: no reference */
            fs_attrs_to_stat(fs, UNKNOWN_INO, &attrs[i], &out[i].attr);
            continue;
        }
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
        if (index + k >= 2 && out[k].ino != 0)
            inode_forget(fs->inodes, out[k].ino, 1);
out:
    for (size_t j = 0; j < job_count; j++)
        free(jobs[j].key);
    free(jobs);
    free(attrs);
    free(plain);
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
