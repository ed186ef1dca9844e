/*
 * access_log.c - the file of -o access_log (see access_log.h): a set of
 * the versions seen (open addressing on 64-bit XXH3 hashes, grown at half
 * full) and one appended line per new one.
 */
#include "config.h"

#include "fs/access_log.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/log.h"

#define INITIAL_SLOTS 1024

struct access_log {
    pthread_mutex_t lock;
    int fd;
    char *prefix;           /* the mount point, without a trailing '/' */
    char *root_key;
    size_t root_len;
    uint64_t *slots;        /* 0: empty */
    size_t slot_count;      /* a power of two */
    size_t used;
    pthread_mutex_t write_lock; /* the file, and the two below */
    bool cut;               /* the last line was cut short (no newline) */
    bool failing;           /* the last write failed (logged once) */
};

/* Is PATH's directory the mount point or under it? (Both resolved.) */
static bool inside(const char *path, const char *mountpoint)
{
    char *copy = strdup(path);
    char *dir = copy != NULL ? realpath(dirname(copy), NULL) : NULL;
    char *mnt = realpath(mountpoint, NULL);
    bool result = false;

    if (dir != NULL && mnt != NULL) {
        size_t n = strlen(mnt);
        result = strncmp(dir, mnt, n) == 0 &&
                 (dir[n] == '\0' || dir[n] == '/' || strcmp(mnt, "/") == 0);
    }
    free(copy);
    free(dir);
    free(mnt);
    return result;
}

int access_log_open(const char *path, const char *mountpoint,
                    const char *root_key, struct access_log **out,
                    char *err, size_t errlen)
{
    struct access_log *log;

    *out = NULL;
    if (path[0] == '\0') {
        snprintf(err, errlen, "access_log=: a file name is needed");
        return EINVAL;
    }
    if (inside(path, mountpoint)) {
        snprintf(err, errlen, "access_log=%s: the file must be outside the "
                 "mount point %s", path, mountpoint);
        return EINVAL;
    }
    if ((log = calloc(1, sizeof(*log))) == NULL) {
        snprintf(err, errlen, "access_log=%s: out of memory", path);
        return ENOMEM;
    }
    pthread_mutex_init(&log->lock, NULL);
    /* (0640: on an allow_other mount, what everyone opened is not for
     * every user of the machine to read) */
    log->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY,
                   0640);
    if (log->fd < 0) {
        int rc = errno;
        snprintf(err, errlen, "access_log=%s: %s", path, strerror(rc));
        access_log_close(&log);
        return rc;
    }
    log->prefix = strdup(mountpoint);
    log->root_key = strdup(root_key);
    log->slot_count = INITIAL_SLOTS;
    log->slots = calloc(log->slot_count, sizeof(*log->slots));
    if (log->prefix == NULL || log->root_key == NULL || log->slots == NULL) {
        snprintf(err, errlen, "access_log=%s: out of memory", path);
        access_log_close(&log);
        return ENOMEM;
    }
    size_t n = strlen(log->prefix);
    while (n > 0 && log->prefix[n - 1] == '/')
        log->prefix[--n] = '\0';
    log->root_len = strlen(log->root_key);
    *out = log;
    return 0;
}

static uint64_t version_hash(const char *key, const char *etag)
{
    /* the key's hash (its NUL included) seeds the ETag's: ("x", "ab")
     * and ("xa", "b") differ */
    uint64_t hash = XXH3_64bits_withSeed(etag, strlen(etag),
                                         XXH3_64bits(key, strlen(key) + 1));
    return hash != 0 ? hash : 1;
}

/* Insert HASH (lock held): whether it was new. On ENOMEM to grow, the
 * table stays as it is and HASH counts as new (a line too many). */
static bool insert_locked(struct access_log *log, uint64_t hash)
{
    if ((log->used + 1) * 2 > log->slot_count) {
        size_t count = log->slot_count * 2;
        uint64_t *slots = calloc(count, sizeof(*slots));
        if (slots == NULL)
            return true;
        for (size_t i = 0; i < log->slot_count; i++) {
            uint64_t h = log->slots[i];
            if (h == 0)
                continue;
            size_t at = h & (count - 1);
            while (slots[at] != 0)
                at = (at + 1) & (count - 1);
            slots[at] = h;
        }
        free(log->slots);
        log->slots = slots;
        log->slot_count = count;
    }
    size_t at = hash & (log->slot_count - 1);
    while (log->slots[at] != 0) {
        if (log->slots[at] == hash)
            return false;
        at = (at + 1) & (log->slot_count - 1);
    }
    log->slots[at] = hash;
    log->used++;
    return true;
}

/* Remove HASH (lock held), moving back the entries after it that could
 * not sit in their own slot (linear probing keeps no tombstones). */
static void remove_locked(struct access_log *log, uint64_t hash)
{
    size_t mask = log->slot_count - 1, at = hash & mask;

    while (log->slots[at] != hash) {
        if (log->slots[at] == 0)
            return;
        at = (at + 1) & mask;
    }
    log->slots[at] = 0;
    log->used--;
    for (size_t next = (at + 1) & mask; log->slots[next] != 0;
         next = (next + 1) & mask) {
        size_t home = log->slots[next] & mask;
        /* NEXT may move to AT if its home is not in (AT, NEXT] */
        bool between = at <= next ? (home > at && home <= next)
                                  : (home > at || home <= next);
        if (!between) {
            log->slots[at] = log->slots[next];
            log->slots[next] = 0;
            at = next;
        }
    }
}

/* KEY with a newline or other control byte shown escaped, for a log
 * line (malloc'd; NULL on ENOMEM). */
static char *escaped(const char *key)
{
    char *out = malloc(strlen(key) * 4 + 1), *at = out;

    if (out == NULL)
        return NULL;
    for (const unsigned char *c = (const unsigned char *)key; *c != '\0'; c++)
        at += *c < 0x20 || *c == 0x7f ? sprintf(at, "\\x%02x", *c)
                                      : sprintf(at, "%c", *c);
    *at = '\0';
    return out;
}

void access_log_opened(struct access_log *log, const char *key,
                       const char *etag)
{
    if (log == NULL)
        return;
    uint64_t hash = version_hash(key, etag);
    const char *rel = strncmp(key, log->root_key, log->root_len) == 0
                          ? key + log->root_len : key;

    pthread_mutex_lock(&log->lock);
    bool fresh = insert_locked(log, hash);
    pthread_mutex_unlock(&log->lock);
    if (!fresh)
        return;
    if (strchr(rel, '\n') != NULL) {
        char *shown = escaped(key);
        log_warn("access log: '%s' has a newline in its name and is not "
                 "listed", shown != NULL ? shown : "?");
        free(shown);
        return;
    }
    char *line = NULL;
    int len = asprintf(&line, "\n%s/%s\n", log->prefix, rel);
    if (len < 0)
        return;
    /* One write per line, under the write lock only (a slow disk holds
     * back other first opens, never the set): with O_APPEND a line lands
     * whole. After a short write (a full disk) the next line begins with
     * the newline the cut one lacks, so that it stays a line of its own;
     * a failed write forgets the version, listed again at its next open. */
    pthread_mutex_lock(&log->write_lock);
    const char *from = log->cut ? line : line + 1;
    size_t want = (size_t)len - (log->cut ? 0 : 1);
    ssize_t wrote = write(log->fd, from, want);
    int err = wrote < 0 ? errno : 0;
    if (wrote > 0)
        log->cut = (size_t)wrote < want;
    bool failed = (size_t)wrote != want;
    bool first_failure = failed && !log->failing;
    log->failing = failed;
    pthread_mutex_unlock(&log->write_lock);
    free(line);
    if (!failed)
        return;
    pthread_mutex_lock(&log->lock);
    remove_locked(log, hash);
    pthread_mutex_unlock(&log->lock);
    if (first_failure)
        log_warn("access log: cannot append: %s (logged once until a write "
                 "succeeds)", err != 0 ? strerror(err) : "short write");
}

void access_log_close(struct access_log **logp)
{
    struct access_log *log = *logp;

    if (log == NULL)
        return;
    if (log->fd >= 0)
        close(log->fd);
    pthread_mutex_destroy(&log->lock);
    pthread_mutex_destroy(&log->write_lock);
    free(log->slots);
    free(log->prefix);
    free(log->root_key);
    free(log);
    *logp = NULL;
}
