/*
 * fs.c - the fs layer as a whole (see fs.h): creating it (the inode
 * table, the reader, the writer and their thread pools), the drain and
 * the end, statfs, the counters, and the list of open handles that the
 * end frees (recovery at mount is fs_recover.c's).
 *
 * The layer's files, each using only those before it: fs_attrs.c (what
 * an inode shows), fs_change.c (changes of names under way),
 * fs_listing.c (directory listings), fs_ahead.c (the
 * HEADs ahead of a walk's lookups), fs_lookup.c (lookup, getattr),
 * fs_stage.c (inodes and staged files), fs.c, fs_dir.c (open
 * directories), fs_file.c (open files), fs_write.c (changes),
 * fs_rename.c (rename), fs_recover.c (recovery at mount). fs_internal.h
 * is what they share.
 *
 * Pattern for every operation: pin the inode, copy what the request needs
 * under the table lock, release the lock, talk to S3, relock and store what
 * was learnt. No lock is held during network I/O.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/workers.h"
#include "cache/lifetime.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"
#include "reader/reader.h"
#include "s3/s3walk.h"

#define MAX_REQUEST (8u << 20)           /* largest coalesced GET */
#define STATFS_BLOCK 4096
#define STATFS_BLOCKS (1ull << 38)       /* report 1 PiB, all free */
#define REFRESH_THREADS 2                /* background relistings at once */

void fs_handle_add(struct fs *fs, struct fs_handle *list, struct fs_handle *handle,
                   void (*release)(struct fs *fs, struct fs_handle *handle))
{
    handle->release = release;
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

static int counters_now(void *arg, char **text);

/* COUNT directories of the mount (DIRS: "a/b/", "" for all of it) as
 * keys under ROOT_KEY, into *OUT (NULL when none). 0 or ENOMEM (what
 * was made is freed with free_prefixes(*OUT, COUNT)). */
static int prefixes_as_keys(const char *root_key, const char *const *dirs,
                            size_t count, char ***out)
{
    *out = NULL;
    if (count == 0)
        return 0;
    if ((*out = calloc(count, sizeof(**out))) == NULL)
        return ENOMEM;
    for (size_t i = 0; i < count; i++)
        if (asprintf(&(*out)[i], "%s%s", root_key, dirs[i]) < 0) {
            (*out)[i] = NULL;
            return ENOMEM;
        }
    return 0;
}

static void free_prefixes(char **prefixes, size_t count)
{
    for (size_t i = 0; prefixes != NULL && i < count; i++)
        free(prefixes[i]);
    free(prefixes);
}

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
    pthread_cond_init(&fs->detach_done, NULL);
    pthread_cond_init(&fs->ahead_done, NULL);
    fs->mount_time = clock_wall_now();
    fs_dir_headers_tag_init(fs);
    fs->root_key = strdup(conf->root_key);
    if (fs->root_key == NULL) {
        err = ENOMEM;
        goto out;
    }
    fs->conf.root_key = fs->root_key;
    err = prefixes_as_keys(fs->root_key, conf->trusted, conf->trusted_count,
                           &fs->trusted);
    if (err == 0)
        err = prefixes_as_keys(fs->root_key, conf->headerless,
                               conf->headerless_count, &fs->headerless);
    if (err != 0)
        goto out;
    fs->conf.trusted = (const char *const *)fs->trusted;
    fs->conf.headerless = (const char *const *)fs->headerless;
    fs_dir_attrs(fs, &root);
    if (conf->cache != NULL) {
        /* listings stored by earlier mounts that no lookup may use now;
         * all of them after a crash: the changes the crashed mount made
         * last (and the uploads recovery is about to make) may not be in
         * them, and a listing is trusted for dir_ttl without a request */
        bool crashed = cache_left_open(conf->cache);
        uint64_t pruned = 0;
        /* (with -o trust, listings stored by earlier mounts are what this
         * one serves under its trusted prefixes, and the index cannot tell
         * which are which: none goes, but after a crash) */
        if ((crashed || conf->trusted_count == 0) &&
            metacache_prune_listings(conf->cache, crashed ? 0 : conf->dir_ttl,
                                     &pruned) == 0 && pruned > 0)
            log_debug("dropped %llu stored listings %s", (unsigned long long)pruned,
                      crashed ? "(the last mount did not end cleanly)"
                              : "older than dir_ttl");
    }
    err = inode_table_create(fs->root_key, &root, &fs->inodes);
    if (err == 0)
        inode_table_set_listing_budget(fs->inodes, conf->listing_memory);
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
            .tier = conf->tier,
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
    if (err == 0 && conf->cache != NULL)
        err = lifetime_start(conf->cache, 0, counters_now, fs, &fs->lifetime);
out:
    if (err != 0)
        fs_destroy(&fs);
    *out = fs;
    return err;
}

uint64_t fs_drain(struct fs *fs)
{
    fs->stopping = true; /* background relistings are of no use any more */
    if (fs->writer == NULL)
        return 0;
    uint64_t left = writer_drain(fs->writer);
    fs_staged_detach_all(fs);
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
        handle->release(fs, handle);
    while ((handle = handle_pop(fs, &fs->open_dirs)) != NULL)
        handle->release(fs, handle);
    if (fs->writer != NULL)
        fs_drain(fs);
    lifetime_stop(&fs->lifetime); /* (the drain's uploads counted) */
    if (fs->reader != NULL)
        reader_stop(fs->reader); /* queued read-ahead ends at once */
    /* the background jobs end before the writer goes: a relisting begun
     * before the unmount merges the writer's waiting markers into what
     * it lists (CI: SIGSEGV in writer_marker_visit() from
     * listing_refresh_main(), at the unmount) */
    workers_destroy(&fs->refresh_workers);
    workers_destroy(&fs->workers);
    writer_destroy(&fs->writer);
    workers_destroy(&fs->upload_workers);
    if (fs->inodes != NULL)
        fs_ahead_end_all(fs); /* (their HEADs ran, or were dropped, above) */
    reader_destroy(&fs->reader);
    inode_table_destroy(&fs->inodes);
    tdestroy(fs->logged_keys, free);
    fs_change_free_left(fs);
    fs_staged_forget_all(fs);
    pthread_mutex_destroy(&fs->logged_lock);
    pthread_mutex_destroy(&fs->handles_lock);
    pthread_cond_destroy(&fs->listing_done);
    pthread_cond_destroy(&fs->move_done);
    pthread_cond_destroy(&fs->detach_done);
    pthread_cond_destroy(&fs->ahead_done);
    free_prefixes(fs->trusted, fs->conf.trusted_count);
    free_prefixes(fs->headerless, fs->conf.headerless_count);
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
    inode_table_listing_usage(fs->inodes, &out->listing_bytes, &out->listings_dropped);
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
    if (fs->conf.tier != NULL) {
        out->tier_on = true;
        tier_get_stats(fs->conf.tier, &out->tier);
    }
}

const char *fs_cache_dir(const struct fs *fs)
{
    return cache_dir_path(fs->conf.cache);
}

/* The shared cache tier's counter lines into BUF (LEN bytes), its
 * requests named by OP_NAMES. */
static void tier_counters_text(const struct tier_stats *tier,
                               const char *const *op_names, char *buf,
                               size_t len)
{
    int used = snprintf(buf, len,
        "bytes_from_tier %llu\n"
        "bytes_to_tier %llu\n"
        "tier_hit_blocks %llu\n"
        "tier_miss_blocks %llu\n"
        "tier_bad_blocks %llu\n"
        "tier_skipped_blocks %llu\n"
        "tier_written_blocks %llu\n"
        "tier_written_first_elsewhere %llu\n"
        "tier_dropped_blocks %llu\n"
        "tier_queued_bytes %llu\n"
        "tier_errors %llu\n"
        "tier_skipping %d\n"
        "tier_leases %llu\n"
        "tier_lease_waits %llu\n"
        "tier_lease_waits_met %llu\n"
        "tier_lease_mode %d\n",
        (unsigned long long)tier->hit_bytes, (unsigned long long)tier->put_bytes,
        (unsigned long long)tier->hits, (unsigned long long)tier->misses,
        (unsigned long long)tier->bad, (unsigned long long)tier->skipped,
        (unsigned long long)tier->puts, (unsigned long long)tier->put_exists,
        (unsigned long long)tier->put_dropped,
        (unsigned long long)tier->queued_bytes,
        (unsigned long long)tier->errors, tier->skipping ? 1 : 0,
        (unsigned long long)tier->leases, (unsigned long long)tier->lease_waits,
        (unsigned long long)tier->lease_waits_met,
        tier->lease_mode > 0 ? tier->lease_mode : 0);
    for (int op = 0; op < S3_OP_COUNT && used > 0 && (size_t)used < len; op++)
        used += snprintf(buf + used, len - (size_t)used,
                         "tier_requests_%s %llu\n", op_names[op],
                         (unsigned long long)tier->s3.requests[op]);
}

/* The counters of this mount, "name value" lines (also what the
 * lifetime totals add up). */
static int counters_now(void *arg, char **text)
{
    struct fs *fs = arg;
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
    char tier[1024] = "";
    if (st.tier_on)
        tier_counters_text(&st.tier, op_names, tier, sizeof(tier));
    uint64_t served = st.hit_bytes;
    uint64_t fetched = st.s3.bytes_received;
    /* (the ratio of the local cache: the tier's bytes count as misses) */
    uint64_t missed = fetched + st.tier.hit_bytes;
    double hit_ratio = served + missed > 0
                           ? (double)served / (double)(served + missed) : 0;
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
        "cache_pinned_bytes %llu\n"
        "cache_size_bytes %llu\n"
        "cache_block_size_bytes %llu\n"
        "cache_blocks %llu\n"
        "cache_evicted_blocks %llu\n"
        "cache_corrupt_blocks %llu\n"
        "%s"
        "retries %llu\n"
        "failures %llu\n"
        "inodes %llu\n"
        "listing_bytes %llu\n"
        "listings_dropped %llu\n"
        "bytes_written %llu\n"
        "uploads_pending %llu\n"
        "uploads_completed %llu\n"
        "upload_failures %llu\n"
        "upload_retries %llu\n"
        "copies_on_write %llu\n"
        "%s",
        (unsigned long long)st.bytes_read, (unsigned long long)served,
        (unsigned long long)fetched, (unsigned long long)st.s3.bytes_sent,
        (unsigned long long)st.direct_bytes, hit_ratio,
        (unsigned long long)st.cache.used_bytes,
        (unsigned long long)st.cache.index_bytes,
        (unsigned long long)st.cache.protected_bytes,
        (unsigned long long)st.cache.pinned_bytes,
        (unsigned long long)st.cache.size_limit,
        (unsigned long long)cache_block_size(fs->conf.cache),
        (unsigned long long)st.cache.blocks,
        (unsigned long long)st.cache.evicted_blocks,
        (unsigned long long)st.cache.corrupt_blocks, requests,
        (unsigned long long)st.s3.retries, (unsigned long long)st.s3.failures,
        (unsigned long long)st.inodes, (unsigned long long)st.listing_bytes,
        (unsigned long long)st.listings_dropped, (unsigned long long)st.bytes_written,
        (unsigned long long)st.uploads_pending,
        (unsigned long long)st.uploads_completed,
        (unsigned long long)st.upload_failures,
        (unsigned long long)st.upload_retries,
        (unsigned long long)st.copies_on_write, tier);
    if (n < 0) {
        *text = NULL;
        return ENOMEM;
    }
    return 0;
}

int fs_stats_text(struct fs *fs, char **text)
{
    char *now = NULL;
    int err = counters_now(fs, &now);

    if (err != 0 || fs->lifetime == NULL) {
        *text = now;
        return err;
    }
    err = lifetime_append(fs->lifetime, now, text);
    free(now);
    return err;
}
