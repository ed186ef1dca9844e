/*
 * unit_cache.h - what the unit tests of the cache index share: a cache
 * opened on a directory, and removing that directory afterwards. Include
 * after cmocka.h and cache.h.
 */
#ifndef S3CFS_UNIT_CACHE_H
#define S3CFS_UNIT_CACHE_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

#endif /* S3CFS_UNIT_CACHE_H */
