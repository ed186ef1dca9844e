/*
 * staging.c - the files of CACHE/staging/ (see staging.h).
 */
#include "config.h"

#include "writer/staging.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

#define COPY_CHUNK (1u << 20)          /* read/write fallback of a copy */
#define MARK_SUFFIX ".promise"
#define MARK_MAX (64u << 10)           /* a journal record is far smaller */

struct staging_dir {
    char *path;
    int fd;                            /* fsynced so new entries persist */
};

static int disk_errno(int err)
{
    return err == ENOSPC || err == EDQUOT ? ENOSPC : EIO;
}

int staging_dir_open(const char *cache_dir, struct staging_dir **out)
{
    struct staging_dir *dir = calloc(1, sizeof(*dir));
    int err = 0;

    *out = NULL;
    if (dir == NULL)
        return ENOMEM;
    dir->fd = -1;
    if (asprintf(&dir->path, "%s/staging", cache_dir) < 0) {
        dir->path = NULL;
        err = ENOMEM;
        goto out;
    }
    if (mkdir(dir->path, 0700) != 0 && errno != EEXIST) {
        err = errno;
        log_error("cannot create %s: %s", dir->path, strerror(err));
        goto out;
    }
    dir->fd = open(dir->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir->fd < 0) {
        err = errno;
        log_error("cannot open %s: %s", dir->path, strerror(err));
        goto out;
    }
    *out = dir;
    dir = NULL;
out:
    staging_dir_close(&dir);
    return err;
}

void staging_dir_close(struct staging_dir **dirp)
{
    struct staging_dir *dir = *dirp;

    if (dir == NULL)
        return;
    if (dir->fd >= 0)
        close(dir->fd);
    free(dir->path);
    free(dir);
    *dirp = NULL;
}

const char *staging_dir_path(const struct staging_dir *dir)
{
    return dir->path;
}

void staging_path(const struct staging_dir *dir, uint64_t id, char *out,
                  size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64, dir->path, id);
}

int staging_create(struct staging_dir *dir, uint64_t id, int *fd)
{
    char path[PATH_MAX];

    staging_path(dir, id, path, sizeof(path));
    *fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (*fd < 0) {
        int err = errno;
        log_error("cannot create staging file %s: %s", path, strerror(err));
        return disk_errno(err);
    }
    return 0;
}

int staging_open(struct staging_dir *dir, uint64_t id, int *fd)
{
    char path[PATH_MAX];

    staging_path(dir, id, path, sizeof(path));
    *fd = open(path, O_RDWR | O_CLOEXEC);
    if (*fd < 0)
        return errno == ENOENT ? ENOENT : EIO;
    return 0;
}

/* The read/write copy, for file systems without copy_file_range. */
static int copy_by_hand(int from, int to, uint64_t offset, uint64_t end)
{
    char *buf = malloc(COPY_CHUNK);
    int err = 0;

    if (buf == NULL)
        return ENOMEM;
    while (err == 0 && offset < end) {
        size_t want = end - offset < COPY_CHUNK ? (size_t)(end - offset) : COPY_CHUNK;
        ssize_t got = pread(from, buf, want, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            err = got < 0 ? EIO : 0;
            break; /* (the end of FROM: zeros follow) */
        }
        for (ssize_t done = 0; err == 0 && done < got;) {
            ssize_t n = pwrite(to, buf + done, (size_t)(got - done),
                               (off_t)offset + done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                err = n < 0 ? disk_errno(errno) : EIO;
            else
                done += n;
        }
        offset += (uint64_t)got;
    }
    free(buf);
    return err;
}

int staging_copy(int from, int to, uint64_t length)
{
    struct stat st;
    int err = 0;

    if (fstat(from, &st) != 0)
        return EIO;
    uint64_t end = (uint64_t)st.st_size < length ? (uint64_t)st.st_size : length;
    loff_t in = 0, out = 0;
    while ((uint64_t)in < end) {
        ssize_t n = copy_file_range(from, &in, to, &out, (size_t)(end - (uint64_t)in), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == ENOSYS || errno == EXDEV || errno == EINVAL ||
                      errno == EOPNOTSUPP)) {
            err = copy_by_hand(from, to, (uint64_t)in, end);
            break;
        }
        if (n < 0) {
            err = disk_errno(errno);
            break;
        }
        if (n == 0)
            break; /* FROM is shorter than it said: zeros follow */
    }
    if (err == 0 && ftruncate(to, (off_t)length) != 0)
        err = disk_errno(errno);
    return err;
}

int staging_sync(struct staging_dir *dir, int fd, const char *what)
{
    if (fsync(fd) != 0 || fsync(dir->fd) != 0) {
        int err = errno;
        log_error("staging file of '%s': fsync: %s", what, strerror(err));
        return disk_errno(err);
    }
    return 0;
}

void staging_remove(struct staging_dir *dir, uint64_t id)
{
    char path[PATH_MAX];

    staging_path(dir, id, path, sizeof(path));
    if (unlink(path) != 0 && errno != ENOENT)
        log_warn("cannot remove staging file %s: %s", path, strerror(errno));
}

int staging_scan(struct staging_dir *dir, int (*visit)(void *arg, uint64_t id),
                 void *arg)
{
    DIR *stream = opendir(dir->path);
    struct dirent *entry;
    int err = 0;

    if (stream == NULL)
        return errno == ENOENT ? 0 : EIO;
    while (err == 0 && (entry = readdir(stream)) != NULL) {
        char *end = NULL;
        if (strlen(entry->d_name) != 16)
            continue;
        uint64_t id = strtoull(entry->d_name, &end, 16);
        if (end == NULL || *end != '\0')
            continue;
        err = visit(arg, id);
    }
    closedir(stream);
    return err;
}

static void mark_path(const struct staging_dir *dir, uint64_t id,
                      const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016" PRIx64 "%s%s", dir->path, id, MARK_SUFFIX,
             suffix);
}

int staging_mark(struct staging_dir *dir, uint64_t id, const void *record,
                 size_t len)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int err = 0;

    mark_path(dir, id, "", path, sizeof(path));
    mark_path(dir, id, ".tmp", tmp, sizeof(tmp));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = disk_errno(errno);
        goto out;
    }
    ssize_t done = write(fd, record, len);
    if (done != (ssize_t)len || fsync(fd) != 0)
        err = done < 0 || done == (ssize_t)len ? disk_errno(errno) : ENOSPC;
    close(fd);
    if (err == 0 && rename(tmp, path) != 0)
        err = disk_errno(errno);
    if (err == 0 && fsync(dir->fd) != 0)
        err = disk_errno(errno);
out:
    if (err != 0) {
        log_error("cannot keep a promise in %s: %s", path, strerror(err));
        unlink(tmp);
    }
    return err;
}

void staging_unmark(struct staging_dir *dir, uint64_t id)
{
    char path[PATH_MAX];

    mark_path(dir, id, "", path, sizeof(path));
    if (unlink(path) == 0)
        fsync(dir->fd);
}

int staging_scan_marks(struct staging_dir *dir,
                       int (*visit)(void *arg, uint64_t id, const void *record,
                                    size_t len),
                       void *arg)
{
    DIR *stream = opendir(dir->path);
    struct dirent *entry;
    char *record = NULL;
    int err = 0;

    if (stream == NULL)
        return errno == ENOENT ? 0 : EIO;
    if ((record = malloc(MARK_MAX)) == NULL) {
        closedir(stream);
        return ENOMEM;
    }
    while (err == 0 && (entry = readdir(stream)) != NULL) {
        char *end = NULL;
        if (strlen(entry->d_name) != 16 + strlen(MARK_SUFFIX) ||
            strcmp(entry->d_name + 16, MARK_SUFFIX) != 0)
            continue;
        uint64_t id = strtoull(entry->d_name, &end, 16);
        if (end != entry->d_name + 16)
            continue;
        char path[PATH_MAX];
        mark_path(dir, id, "", path, sizeof(path));
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, record, MARK_MAX) : -1;
        if (fd >= 0)
            close(fd);
        if (got <= 0 || (size_t)got >= MARK_MAX) {
            log_error("cannot read the promise kept in %s; it is left there",
                      path);
            continue;
        }
        err = visit(arg, id, record, (size_t)got);
    }
    free(record);
    closedir(stream);
    return err;
}

static int count_mark(void *arg, uint64_t id, const void *record, size_t len)
{
    uint64_t *count = arg;

    (void)id;
    (void)record;
    (void)len;
    (*count)++;
    return 0;
}

int staging_count_marks(struct staging_dir *dir, uint64_t *count)
{
    *count = 0;
    return staging_scan_marks(dir, count_mark, count);
}
