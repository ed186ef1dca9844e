/*
 * cache_dir.c - the block cache on its directory (see cache.h for the
 * layout): creating it, its lock, the state file that records the boot the
 * index was last opened in and whether it was closed cleanly, emptying the
 * index and data files when they may be damaged or were written for
 * another block size or format; sweeping data files whose version the
 * index no longer knows; and cache_open()/cache_close(), which
 * start and stop the flusher (cache_policy.c) and free what the data path
 * (cache.c) left. cache_lock_dir() runs before daemonizing, the rest
 * after; cache_open() and cache_close() run while no other thread uses
 * the cache.
 *
 * What emptying removes is exactly index/data.mdb, index/lock.mdb and
 * files named like data/XX/ID: CACHE/staging and CACHE/journal (the write
 * path's, cache.h) are never touched, whatever the reason for emptying.
 */
#include "config.h"

#include "cache/cache_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/sigbus.h"
#include "base/text.h"

/* ------------------------------------------------------------- emptying */

/* Names in the cache directory that belong to the write path (cache.h):
 * nothing here ever removes them or anything under them. */
static const char *const protected_names[] = {"staging", "journal"};

static bool is_protected_name(const char *name)
{
    for (size_t i = 0; i < sizeof(protected_names) / sizeof(protected_names[0]); i++)
        if (strcmp(name, protected_names[i]) == 0)
            return true;
    return false;
}

/* Whether NAME is LEN lower-case hex digits, as data/XX/ID names are. */
static bool is_hex_name(const char *name, size_t len)
{
    return strlen(name) == len && strspn(name, "0123456789abcdef") == len;
}

/* Remove the data files under DIR (the cache's data/): only what has the
 * shape of one, XX/ID in hex, and never a protected name. */
static void remove_data_files(const char *dir)
{
    DIR *top = opendir(dir);
    struct dirent *entry;

    if (top == NULL)
        return;
    while ((entry = readdir(top)) != NULL) {
        if (!is_hex_name(entry->d_name, 2) || is_protected_name(entry->d_name))
            continue;
        char *sub = NULL;
        if (asprintf(&sub, "%s/%s", dir, entry->d_name) < 0)
            continue;
        DIR *inner = opendir(sub);
        struct dirent *file;
        while (inner != NULL && (file = readdir(inner)) != NULL) {
            if (!is_hex_name(file->d_name, 16) || is_protected_name(file->d_name))
                continue;
            char *path = NULL;
            if (asprintf(&path, "%s/%s", sub, file->d_name) >= 0)
                unlink(path);
            free(path);
        }
        if (inner != NULL)
            closedir(inner);
        rmdir(sub); /* fails, harmlessly, if anything else is in it */
        free(sub);
    }
    closedir(top);
}

/* Remove the index files of the cache directory DIR. */
static void remove_index(const char *dir)
{
    char *path = NULL;
    const char *files[] = {"data.mdb", "lock.mdb"};

    for (size_t i = 0; i < 2; i++) {
        if (asprintf(&path, "%s/index/%s", dir, files[i]) >= 0) {
            unlink(path);
            free(path);
        }
    }
}

bool cache_left_open(const struct cache *cache)
{
    return cache->left_open;
}

const char *cache_dir_path(const struct cache *cache)
{
    return cache->dir;
}

/* ------------------------------------------------------------- locking */

/* mkdir -p DIR (mode 0700 for what it creates). */
static int make_dirs(const char *dir)
{
    char *path = strdup(dir);
    int err = 0;

    if (path == NULL)
        return ENOMEM;
    for (char *slash = strchr(path + 1, '/'); ; slash = strchr(slash + 1, '/')) {
        if (slash != NULL)
            *slash = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            err = errno;
            break;
        }
        if (slash == NULL)
            break;
        *slash = '/';
    }
    free(path);
    return err;
}

int cache_lock_dir(const char *dir, int *lock_fd, char *errbuf, size_t errlen)
{
    char *path = NULL;
    char holder[32] = "";
    int fd = -1;
    int err = 0;

    *lock_fd = -1;
    err = make_dirs(dir);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot create the cache directory %s: %s",
                 dir, strerror(err));
        return err;
    }
    if (asprintf(&path, "%s/lock", dir) < 0)
        return ENOMEM;
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        snprintf(errbuf, errlen, "cannot use the cache directory %s: %s", dir,
                 strerror(err));
        goto out;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        err = errno == EWOULDBLOCK ? EWOULDBLOCK : errno;
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        if (err == EWOULDBLOCK)
            snprintf(errbuf, errlen, "the cache directory %s is in use by "
                     "another s3cachefs mount (pid %s); use another -o cache=",
                     dir, holder[0] ? holder : "unknown");
        else
            snprintf(errbuf, errlen, "cannot lock the cache directory %s: %s",
                     dir, strerror(err));
        goto out;
    }
    /* the pid is rewritten after daemonizing too (see cache_open) */
    snprintf(holder, sizeof(holder), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, strlen(holder), 0) < 0) {
        /* only informative */
    }
    *lock_fd = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return err;
}

/* ------------------------------------------------------------ identity */

/*
 * CACHE/identity, the record of whose the directory is (cache.h):
 *
 *   s3cachefs cache identity 1
 *   endpoint https://s3.us-east-1.amazonaws.com
 *   bucket my-bucket
 *   prefix datasets/imagenet/
 *
 * Values are escaped (%XX for '%', controls, space and bytes over 0x7e),
 * so that each is one word; a prefix may be empty ("prefix " and nothing
 * after). Written to identity.tmp, fsynced, renamed, the directory
 * fsynced.
 */
#define IDENTITY_HEADER "s3cachefs cache identity 1"
#define IDENTITY_MAX 8192

/* An identity read back: its strings in one block of its own. */
struct stored_identity {
    char *endpoint, *bucket, *prefix;
};

static void stored_identity_clear(struct stored_identity *id)
{
    free(id->endpoint);
    free(id->bucket);
    free(id->prefix);
    memset(id, 0, sizeof(*id));
}

/* Append VALUE, escaped, to OUT (CAP bytes, *LEN used). False when it
 * does not fit. */
static bool escape_value(const char *value, char *out, size_t cap, size_t *len)
{
    static const char hex[] = "0123456789ABCDEF";

    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        bool plain = *p > ' ' && *p < 0x7f && *p != '%';
        if (*len + (plain ? 1 : 3) >= cap)
            return false;
        if (plain) {
            out[(*len)++] = (char)*p;
        } else {
            out[(*len)++] = '%';
            out[(*len)++] = hex[*p >> 4];
            out[(*len)++] = hex[*p & 15];
        }
    }
    return true;
}

/* The value of the line "NAME VALUE" (VALUE unescaped) at *CURSOR, which
 * moves past the line. NULL (EPROTO) when the line is not that. */
static char *read_value(const char **cursor, const char *name, int *err)
{
    const char *line = *cursor, *end = strchr(line, '\n');
    size_t name_len = strlen(name);

    *err = EPROTO;
    if (end == NULL || (size_t)(end - line) < name_len + 1 ||
        strncmp(line, name, name_len) != 0 || line[name_len] != ' ')
        return NULL;
    const char *value = line + name_len + 1;
    char *out = malloc((size_t)(end - value) + 1);
    size_t n = 0;
    if (out == NULL) {
        *err = ENOMEM;
        return NULL;
    }
    for (const char *p = value; p < end; p++) {
        if (*p == '%') {
            int high = p + 2 < end ? text_hex_digit(p[1]) : -1;
            int low = p + 2 < end ? text_hex_digit(p[2]) : -1;
            if (high < 0 || low < 0 || (high == 0 && low == 0))
                goto bad;
            out[n++] = (char)(high * 16 + low);
            p += 2;
        } else if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f) {
            goto bad;
        } else {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
    *cursor = end + 1;
    *err = 0;
    return out;
bad:
    free(out);
    return NULL;
}

/* Read DIR/identity into *OUT: 0, ENOENT (no record), EPROTO (a record
 * that does not parse), or another errno. */
static int identity_load(const char *dir, struct stored_identity *out)
{
    char *path = NULL, *text = NULL;
    int err = 0;

    memset(out, 0, sizeof(*out));
    if (asprintf(&path, "%s/identity", dir) < 0)
        return ENOMEM;
    FILE *fp = fopen(path, "re");
    free(path);
    if (fp == NULL)
        return errno;
    text = calloc(1, IDENTITY_MAX + 1);
    size_t len = text != NULL ? fread(text, 1, IDENTITY_MAX + 1, fp) : 0;
    if (text == NULL)
        err = ENOMEM;
    else if (ferror(fp))
        err = EIO;
    else if (len > IDENTITY_MAX || memchr(text, '\0', len) != NULL)
        err = EPROTO;
    fclose(fp);
    if (err != 0)
        goto out;
    const char *cursor = text;
    size_t header_len = strlen(IDENTITY_HEADER);
    if (strncmp(cursor, IDENTITY_HEADER "\n", header_len + 1) != 0) {
        err = EPROTO;
        goto out;
    }
    cursor += header_len + 1;
    if ((out->endpoint = read_value(&cursor, "endpoint", &err)) == NULL ||
        (out->bucket = read_value(&cursor, "bucket", &err)) == NULL ||
        (out->prefix = read_value(&cursor, "prefix", &err)) == NULL)
        goto out;
    if (*cursor != '\0' || out->endpoint[0] == '\0' || out->bucket[0] == '\0')
        err = EPROTO;
out:
    if (err != 0)
        stored_identity_clear(out);
    free(text);
    return err;
}

/* Write a file of DIR durably: NAME.tmp, fsync, rename to NAME, fsync of
 * DIR. 0 or an errno. */
static int write_durably(const char *dir, const char *name, const char *text,
                         size_t len)
{
    char *path = NULL, *tmp = NULL;
    int err = 0, fd = -1;

    if (asprintf(&path, "%s/%s", dir, name) < 0) {
        path = NULL;
        err = ENOMEM;
        goto out;
    }
    if (asprintf(&tmp, "%s/%s.tmp", dir, name) < 0) {
        tmp = NULL;
        err = ENOMEM;
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        goto out;
    }
    if (write(fd, text, len) != (ssize_t)len || fsync(fd) != 0)
        err = errno ? errno : EIO;
    close(fd);
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
    /* the rename is durable only with its directory */
    if (err == 0) {
        int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0 || fsync(dir_fd) != 0)
            err = errno ? errno : EIO;
        if (dir_fd >= 0)
            close(dir_fd);
    }
out:
    if (err != 0 && tmp != NULL)
        unlink(tmp);
    free(path);
    free(tmp);
    return err;
}

static int identity_store(const char *dir, const struct cache_identity *id)
{
    char text[IDENTITY_MAX];
    size_t len = 0;
    int n = snprintf(text, sizeof(text), "%s\nendpoint ", IDENTITY_HEADER);

    len = (size_t)n;
    if (!escape_value(id->endpoint, text, sizeof(text), &len) ||
        len + 8 >= sizeof(text))
        return ENAMETOOLONG;
    memcpy(text + len, "\nbucket ", 8), len += 8;
    if (!escape_value(id->bucket, text, sizeof(text), &len) ||
        len + 8 >= sizeof(text))
        return ENAMETOOLONG;
    memcpy(text + len, "\nprefix ", 8), len += 8;
    if (!escape_value(id->prefix, text, sizeof(text), &len) ||
        len + 1 >= sizeof(text))
        return ENAMETOOLONG;
    text[len++] = '\n';
    return write_durably(dir, "identity", text, len);
}

/* "bucket 'B' at E" or "bucket 'B' (prefix 'P') at E", for sentences. */
static void describe_identity(const char *endpoint, const char *bucket,
                              const char *prefix, char *out, size_t cap)
{
    snprintf(out, cap, "bucket '%s'%s%s%s at %s", bucket,
             prefix[0] ? " (prefix '" : "", prefix, prefix[0] ? "')" : "",
             endpoint);
}

static bool same_bucket(const struct stored_identity *stored,
                        const struct cache_identity *mine)
{
    return strcmp(stored->endpoint, mine->endpoint) == 0 &&
           strcmp(stored->bucket, mine->bucket) == 0;
}

bool cache_dir_is_for(const char *dir, const struct cache_identity *mine)
{
    struct stored_identity stored;
    int err = identity_load(dir, &stored);
    bool usable = err == ENOENT || (err == 0 && same_bucket(&stored, mine));

    stored_identity_clear(&stored);
    return usable;
}

int cache_dir_claim(const char *dir, const struct cache_identity *mine,
                    uint64_t pending, char *errbuf, size_t errlen)
{
    struct stored_identity stored;
    char theirs[1024], ours[1024];
    int err = identity_load(dir, &stored);

    describe_identity(mine->endpoint, mine->bucket, mine->prefix, ours,
                      sizeof(ours));
    if (err != 0 && err != ENOENT && err != EPROTO) {
        /* (unreadable is not another owner's: nothing is emptied) */
        snprintf(errbuf, errlen, "cannot read the identity record %s/identity "
                 "of the cache directory: %s", dir, strerror(err));
        goto out;
    }
    if (err == 0)
        describe_identity(stored.endpoint, stored.bucket, stored.prefix,
                          theirs, sizeof(theirs));
    else
        snprintf(theirs, sizeof(theirs), "an owner its record %s/identity "
                 "does not name (it does not parse)", dir);
    if (err == ENOENT) {
        /* new, or made by an older s3cachefs: its index already keys
         * blocks by bucket name, and what its journal holds was written
         * for the bucket mounted on it, as it always was */
        err = identity_store(dir, mine);
        goto stored;
    }
    if (err == 0 && same_bucket(&stored, mine) &&
        strcmp(stored.prefix, mine->prefix) == 0)
        goto out; /* ours */
    if (pending > 0) {
        snprintf(errbuf, errlen, "the cache directory %s holds %llu write%s "
                 "not yet in %s, and this mount is of %s: mount that one on "
                 "it until its unmount leaves nothing (`s3cachefs pending` "
                 "lists what is owed), or give this mount another -o cache=",
                 dir, (unsigned long long)pending, pending == 1 ? "" : "s",
                 theirs, ours);
        err = EEXIST;
        goto out;
    }
    if (err != 0 || !same_bucket(&stored, mine)) {
        char *data_dir = NULL;
        if (asprintf(&data_dir, "%s/data", dir) < 0) {
            err = ENOMEM;
            goto stored;
        }
        log_info("cache: %s held the cache of %s; emptied for %s", dir,
                 theirs, ours);
        remove_index(dir);
        remove_data_files(data_dir);
        free(data_dir);
    }
    err = identity_store(dir, mine);
stored:
    if (err != 0)
        snprintf(errbuf, errlen, "cannot record the identity of the cache "
                 "directory %s: %s", dir, strerror(err));
out:
    stored_identity_clear(&stored);
    return err;
}

/* --------------------------------------------------- session and boot */

static void read_boot_id(char *out, size_t len)
{
    FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");

    out[0] = '\0';
    if (fp != NULL) {
        if (fgets(out, (int)len, fp) == NULL)
            out[0] = '\0';
        fclose(fp);
    }
    out[strcspn(out, "\n")] = '\0';
}

/* The state file says "BOOT_ID clean|open": written (and fsynced, with
 * its directory) when the index is opened and when it is closed cleanly. */
static int write_state(const struct cache *cache, const char *boot_id,
                       bool clean)
{
    char *path = NULL, *tmp = NULL;
    int err = 0;

    if (asprintf(&path, "%s/state", cache->dir) < 0) {
        path = NULL;
        return ENOMEM;
    }
    if (asprintf(&tmp, "%s/state.tmp", cache->dir) < 0) {
        free(path);
        return ENOMEM;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        goto out;
    }
    char line[128];
    int n = snprintf(line, sizeof(line), "%s %s\n", boot_id, clean ? "clean" : "open");
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0)
        err = errno ? errno : EIO;
    close(fd);
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
    /* the rename is durable only with its directory: after a power cut,
     * a state of an older boot saying "clean" would have the next boot
     * trust an index that was open, and written without fsync */
    if (err == 0) {
        int dir = open(cache->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0 || fsync(dir) != 0)
            err = errno ? errno : EIO;
        if (dir >= 0)
            close(dir);
    }
out:
    free(path);
    free(tmp);
    return err;
}

/* What the state file says of the last mount: *LEFT_OPEN when it did not
 * close the cache (a crash of the process or of the machine), *OTHER_BOOT
 * when that was during another boot (the machine stopped: the index, written
 * without fsync, may be damaged). */
static void read_state(const struct cache *cache, const char *boot_id,
                       bool *left_open, bool *other_boot)
{
    char *path = NULL;
    char line[128] = "";

    *left_open = *other_boot = false;
    if (asprintf(&path, "%s/state", cache->dir) < 0)
        return;
    FILE *fp = fopen(path, "r");
    if (fp != NULL) {
        if (fgets(line, sizeof(line), fp) != NULL) {
            char *space = strchr(line, ' ');
            if (space != NULL) {
                *space = '\0';
                *left_open = strncmp(space + 1, "open", 4) == 0;
                *other_boot = *left_open && strcmp(line, boot_id) != 0;
            }
        }
        fclose(fp);
    }
    free(path);
}

/* ------------------------------------------------------------- opening */

static int check_format(struct cache *cache)
{
    struct db_txn *txn = NULL;
    uint64_t stored_block_size = 0, format = 0;
    int err = db_txn_begin(cache->db, true, &txn);

    if (err == 0)
        err = cache_meta_get_u64(txn, "format", &format);
    if (err == 0)
        err = cache_meta_get_u64(txn, "block_size", &stored_block_size);
    if (err != 0)
        goto out;
    if ((format != 0 && format != FORMAT_VERSION) ||
        (stored_block_size != 0 && stored_block_size != cache->block_size)) {
        log_warn("cache: %s holds blocks of %llu bytes (format %llu); "
                 "emptying it for blocks of %u bytes", cache->dir,
                 (unsigned long long)stored_block_size,
                 (unsigned long long)format, cache->block_size);
        for (int table = 0; table < DB_TABLE_COUNT && err == 0; table++)
            err = db_clear(txn, (enum db_table)table);
        remove_data_files(cache->data_dir);
    }
    if (err == 0)
        err = cache_meta_put_u64(txn, "format", FORMAT_VERSION);
    if (err == 0)
        err = cache_meta_put_u64(txn, "block_size", cache->block_size);
    if (err == 0)
        err = cache_usage_get(txn, &cache->usage);
    cache->usage_txn = db_txn_id(txn);
    if (err == 0)
        err = db_txn_commit(&txn);
out:
    db_txn_abort(&txn);
    return err;
}

/* Ids of data files, gathered before the index is asked about them. */
struct id_list {
    uint64_t *ids;
    size_t count, capacity;
};

static int id_list_add(struct id_list *list, uint64_t id)
{
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 64;
        uint64_t *grown = realloc(list->ids, capacity * sizeof(*grown));
        if (grown == NULL)
            return ENOMEM;
        list->ids = grown;
        list->capacity = capacity;
    }
    list->ids[list->count++] = id;
    return 0;
}

/* The ids of the files under DATA_DIR named as data files are (XX/ID in
 * hex, XX the low byte of ID); anything else is left alone. */
static int list_data_files(const char *data_dir, struct id_list *list)
{
    DIR *top = opendir(data_dir);
    struct dirent *entry;
    int err = 0;

    if (top == NULL)
        return errno == ENOENT ? 0 : errno;
    while (err == 0 && (entry = readdir(top)) != NULL) {
        if (!is_hex_name(entry->d_name, 2) || is_protected_name(entry->d_name))
            continue;
        char *sub = NULL;
        if (asprintf(&sub, "%s/%s", data_dir, entry->d_name) < 0) {
            err = ENOMEM;
            break;
        }
        unsigned long fan_out = strtoul(entry->d_name, NULL, 16);
        DIR *inner = opendir(sub);
        struct dirent *file;
        while (err == 0 && inner != NULL && (file = readdir(inner)) != NULL) {
            if (!is_hex_name(file->d_name, 16))
                continue;
            uint64_t id = strtoull(file->d_name, NULL, 16);
            if ((id & 0xff) == fan_out)
                err = id_list_add(list, id);
        }
        if (inner != NULL)
            closedir(inner);
        free(sub);
    }
    closedir(top);
    return err;
}

/*
 * Remove the data files of versions the index does not know: left by a
 * kill -9 between a transaction that dropped a version (eviction, a new
 * version, a deleted key) and the unlink that follows it, or while a
 * replaced version was still open, or during an adoption (the file is
 * renamed in before its version is recorded). Block records left under
 * such an id (a fill that committed after its version was dropped) go
 * with it, so the usage record stays right. Runs in cache_open, before
 * any handle exists; staging/ and journal/ are outside data/.
 */
static int sweep_orphan_files(struct cache *cache)
{
    struct id_list files = {0}, orphans = {0};
    struct db_txn *txn = NULL;
    struct usage_record usage = {0};
    int err = list_data_files(cache->data_dir, &files);

    if (err == 0 && files.count > 0)
        err = db_txn_begin(cache->db, true, &txn);
    if (err == 0 && txn != NULL)
        err = cache_usage_get(txn, &usage);
    for (size_t i = 0; err == 0 && i < files.count; i++) {
        unsigned char id_key[8];
        const void *value;
        size_t len;
        put_be64(id_key, files.ids[i]);
        err = db_get(txn, DB_OBJECTS, id_key, sizeof(id_key), &value, &len);
        if (err == ENOENT) {
            err = cache_drop_version_txn(txn, files.ids[i], &usage);
            if (err == 0)
                err = id_list_add(&orphans, files.ids[i]);
        }
    }
    if (err == 0 && orphans.count > 0) {
        err = cache_usage_commit(cache, &txn, &usage);
    }
    db_txn_abort(&txn);
    if (err == 0 && orphans.count > 0)
        log_info("cache: removing %zu data file(s) of versions no longer "
                 "in the index", orphans.count);
    for (size_t i = 0; err == 0 && i < orphans.count; i++)
        cache_unlink_data_file(cache, orphans.ids[i]);
    free(files.ids);
    free(orphans.ids);
    return err;
}

int cache_open(const struct cache_conf *conf, int lock_fd, struct cache **out,
               char *errbuf, size_t errlen)
{
    struct cache *cache = calloc(1, sizeof(*cache));
    char boot_id[64];
    char *index_dir = NULL;
    int err = 0;

    *out = NULL;
    if (cache == NULL)
        return ENOMEM;
    /* reads of the data files by mapping (cache_block_splice) */
    if ((err = sigbus_install()) != 0) {
        snprintf(errbuf, errlen, "cannot handle SIGBUS: %s", strerror(err));
        free(cache);
        return err;
    }
    cache->lock_fd = lock_fd;
    cache->size_limit = conf->size_limit;
    cache->min_free_bytes = conf->min_free_bytes;
    cache->min_free_ratio = conf->min_free_ratio;
    cache->block_size = conf->block_size;
    pthread_mutex_init(&cache->lock, NULL);
    pthread_mutex_init(&cache->evict_lock, NULL);
    pthread_mutex_init(&cache->fresh_lock, NULL);
    cache_holds_init(cache);
    /* the flusher's timed waits measure intervals: a clock that setting
     * the date does not move */
    pthread_condattr_t wake_attr;
    pthread_condattr_init(&wake_attr);
    pthread_condattr_setclock(&wake_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cache->flusher_wake, &wake_attr);
    pthread_condattr_destroy(&wake_attr);
    pthread_key_create(&cache->bounce_key, cache_free_bounce);
    cache->dir = strdup(conf->dir);
    cache->bucket = strdup(conf->bucket);
    cache->touches = calloc(TOUCHES_MAX, sizeof(*cache->touches));
    if (cache->dir == NULL || cache->bucket == NULL || cache->touches == NULL ||
        asprintf(&cache->data_dir, "%s/data", conf->dir) < 0 ||
        asprintf(&index_dir, "%s/index", conf->dir) < 0) {
        err = ENOMEM;
        goto out;
    }
    /* the daemon's pid, now that it has forked */
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(lock_fd, 0) != 0 || pwrite(lock_fd, pid, (size_t)n, 0) < 0) {
        /* only informative */
    }
    if ((mkdir(cache->data_dir, 0700) != 0 && errno != EEXIST) ||
        (mkdir(index_dir, 0700) != 0 && errno != EEXIST)) {
        err = errno;
        snprintf(errbuf, errlen, "cannot create %s: %s", index_dir, strerror(err));
        goto out;
    }
    read_boot_id(boot_id, sizeof(boot_id));
    bool other_boot = false;
    read_state(cache, boot_id, &cache->left_open, &other_boot);
    if (other_boot) {
        log_warn("cache: %s was in use when the machine stopped; its index "
                 "may be damaged, starting it empty", cache->dir);
        remove_index(cache->dir);
        remove_data_files(cache->data_dir);
    }
    err = write_state(cache, boot_id, false);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot write to the cache directory %s: %s",
                 cache->dir, strerror(err));
        goto out;
    }
    err = db_open(index_dir, INDEX_MAP_SIZE, false, &cache->db, errbuf, errlen);
    if (err != 0)
        goto out;
    err = check_format(cache);
    if (err == 0)
        err = sweep_orphan_files(cache);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot read the cache index in %s: %s",
                 index_dir, strerror(err));
        goto out;
    }
    err = pthread_create(&cache->flusher, NULL, cache_flusher_main, cache);
    if (err != 0) {
        snprintf(errbuf, errlen, "cannot start the cache flusher: %s", strerror(err));
        goto out;
    }
    cache->flusher_started = true;
out:
    free(index_dir);
    if (err != 0) {
        cache->lock_fd = -1; /* stays the caller's on failure */
        cache_close(&cache);
    }
    *out = cache;
    return err;
}

static void no_free(void *node)
{
    (void)node;
}

void cache_close(struct cache **cachep)
{
    struct cache *cache = *cachep;
    char boot_id[64];

    if (cache == NULL)
        return;
    if (cache->flusher_started) {
        pthread_mutex_lock(&cache->lock);
        cache->stopping = true;
        pthread_cond_signal(&cache->flusher_wake);
        cache_unlock(cache);
        pthread_join(cache->flusher, NULL);
    }
    if (cache->db != NULL) {
        cache_flush(cache);
        if (INVARIANTS_ON)
            cache_check_usage(cache);
        db_close(&cache->db);
        read_boot_id(boot_id, sizeof(boot_id));
        write_state(cache, boot_id, true);
    }
    tdestroy(cache->open_objects, no_free);
    if (cache->lock_fd >= 0)
        close(cache->lock_fd);
    pthread_key_delete(cache->bounce_key); /* runs no destructors: */
    while (cache->bounces != NULL) {
        struct bounce *next = cache->bounces->next;
        free(cache->bounces);
        cache->bounces = next;
    }
    pthread_mutex_destroy(&cache->lock);
    pthread_mutex_destroy(&cache->evict_lock);
    pthread_mutex_destroy(&cache->fresh_lock);
    cache_holds_destroy(cache);
    pthread_cond_destroy(&cache->flusher_wake);
    free(cache->touches);
    free(cache->dir);
    free(cache->bucket);
    free(cache->data_dir);
    free(cache);
    *cachep = NULL;
}
