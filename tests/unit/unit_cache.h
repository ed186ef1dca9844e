/*
 * unit_cache.h - what the unit tests of the cache index share: a cache
 * opened on a directory, removing that directory afterwards, and whether
 * the pages of a data file are still dirty (what decides whether a
 * spliced read hashes them again). Include after cmocka.h and cache.h.
 */
#ifndef S3CFS_UNIT_CACHE_H
#define S3CFS_UNIT_CACHE_H

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cachestat.h"

/* Remove PATH and everything under it. */
static void unit_remove_tree(const char *path)
{
    struct stat st;
    DIR *dir;
    struct dirent *entry;

    if (lstat(path, &st) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    dir = opendir(path);
    while (dir != NULL && (entry = readdir(dir)) != NULL) {
        char child[512];
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        if (snprintf(child, sizeof(child), "%s/%s", path, entry->d_name) <
            (int)sizeof(child))
            unit_remove_tree(child);
    }
    if (dir != NULL)
        closedir(dir);
    rmdir(path);
}

/* Lock CONF->dir and open the cache there; fails the test otherwise. */
static struct cache *unit_cache_open(const struct cache_conf *conf)
{
    struct cache *cache = NULL;
    char err[512] = "";
    int fd = -1;
    int rc = cache_lock_dir(conf->dir, &fd, err, sizeof(err));

    if (rc != 0)
        fail_msg("cache_lock_dir: %s (%s)", strerror(rc), err);
    rc = cache_open(conf, fd, &cache, err, sizeof(err));
    if (rc != 0) {
        close(fd);
        fail_msg("cache_open: %s (%s)", strerror(rc), err);
    }
    assert_non_null(cache);
    return cache;
}

/* Whether this kernel has cachestat(2) (Linux 6.5): a bad descriptor is
 * EBADF there, ENOSYS before. (Inline: not every test asks.) */
static inline bool unit_kernel_has_cachestat(void)
{
    struct cachestat_span span = {0, 0};
    struct cachestat_pages pages;

    return cachestat_query(-1, &span, &pages) != 0 && errno == EBADF;
}

/* Whether every page of [OFFSET, OFFSET + LEN) of FD is dirty now
 * (cachestat(2); false without it). A page dirty now was dirty at any
 * earlier moment since the last write to it: a read made then found it
 * so, whatever a sync run by anyone on the machine does afterwards. */
static inline bool unit_pages_dirty(int fd, uint64_t offset, uint64_t len)
{
    struct cachestat_span span = {offset, len};
    struct cachestat_pages pages;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

    if (!unit_kernel_has_cachestat() || cachestat_query(fd, &span, &pages) != 0)
        return false;
    return pages.nr_dirty == (offset + len - 1) / page - offset / page + 1;
}

#endif /* S3CFS_UNIT_CACHE_H */
