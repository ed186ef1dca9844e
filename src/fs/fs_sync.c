/*
 * fs_sync.c - what `s3cachefs sync` and `s3cachefs pending` ask of the
 * mount (fs.h: the user.s3cachefs.sync, .pending and .drop attributes of
 * the mount root, answered by fuse_ops.c): the writer's reports turned
 * into paths under the mount root and into the text of sync_text.h, and a
 * pending file given up (drop) removed from the inode table and its
 * directory's listing as an unlink would, with no request to the bucket.
 *
 * The paths are the writer's keys without the mount's prefix (root_key):
 * the writer renames its files' keys with their inodes (writer_file_rename
 * under the rename's hold), so the key is the inode's. Nothing here holds
 * a lock across I/O: the sync waits in the writer with no lock of this
 * layer held, and a drop takes the table lock only to find and unlink the
 * inode (lock order: the table lock is never held when the writer is
 * called here, except writer_file_ref() through fs_staged_get_locked()).
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "ctl/sync_text.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"

/* A file line, sorted by RANK (what matters most first), then path. */
struct line {
    int rank;
    const char *path;             /* escaped; points into TEXT */
    char *text;                   /* the whole line, '\n' included */
};

static int compare_lines(const void *a, const void *b)
{
    const struct line *x = a, *y = b;

    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return strcmp(x->path, y->path);
}

/* KEY's path under the mount root (a pointer into KEY). */
static const char *path_of(const struct fs *fs, const char *key)
{
    size_t root_len = strlen(fs->root_key);

    return strncmp(key, fs->root_key, root_len) == 0 ? key + root_len : key;
}

/* LINES[0..COUNT) sorted, after HEAD, within CAP: *TEXT and *LEN. The
 * lines' texts are freed (the array stays the caller's). */
static int join_sorted(const char *head, struct line *lines, size_t count,
                       size_t cap, char **text, size_t *len)
{
    char **texts = count > 0 ? calloc(count, sizeof(*texts)) : NULL;
    int err = count > 0 && texts == NULL ? ENOMEM : 0;

    if (count > 1)
        qsort(lines, count, sizeof(*lines), compare_lines);
    for (size_t i = 0; err == 0 && i < count; i++)
        texts[i] = lines[i].text;
    if (err == 0)
        err = sync_text_join(head, texts, count, cap, text, len, NULL);
    for (size_t i = 0; i < count; i++) {
        free(lines[i].text);
        lines[i].text = NULL;
    }
    free(texts);
    return err;
}

/* The file line of FIELDS (tab-separated) and PATH (escaped here) into
 * *OUT, ranked RANK. 0 or ENOMEM. */
static int line_make(struct line *out, int rank, const char *fields,
                     const char *path)
{
    char *escaped = sync_text_escape(path);
    int n = escaped == NULL ? -1
                            : asprintf(&out->text, "file\t%s\t%s\n", fields, escaped);

    free(escaped);
    if (n < 0) {
        out->text = NULL;
        return ENOMEM;
    }
    out->rank = rank;
    out->path = strrchr(out->text, '\t') + 1; /* (the last field) */
    return 0;
}

/* ---------------------------------------------------------------- sync */

static const char *const outcome_names[] = {
    [WRITER_SYNC_UPLOADED] = "uploaded",
    [WRITER_SYNC_FAILED] = "failed",
    [WRITER_SYNC_REMOVED] = "removed",
    [WRITER_SYNC_NOT_CLOSED] = "not-closed",
    [WRITER_SYNC_WAITING] = "waiting",
};

static const int outcome_ranks[] = {
    [WRITER_SYNC_FAILED] = 0, [WRITER_SYNC_WAITING] = 1,
    [WRITER_SYNC_NOT_CLOSED] = 2, [WRITER_SYNC_REMOVED] = 3,
    [WRITER_SYNC_UPLOADED] = 4,
};

void fs_sync_wake(struct fs *fs)
{
    if (fs->writer != NULL)
        writer_sync_wake(fs->writer);
}

int fs_sync_text(struct fs *fs, const atomic_bool *interrupted, size_t cap,
                 char **text, size_t *len)
{
    struct writer_sync_report report = {0};
    struct line *lines = NULL;
    unsigned counts[WRITER_SYNC_WAITING + 1] = {0};
    uint64_t bytes = 0;
    char *head = NULL;
    double started = clock_monotonic_seconds();
    int err = 0;

    *text = NULL;
    *len = 0;
    if (fs->writer != NULL)
        err = writer_sync(fs->writer, interrupted, &report);
    double seconds = clock_monotonic_seconds() - started;
    if (err == 0 && report.count > 0 &&
        (lines = calloc(report.count, sizeof(*lines))) == NULL)
        err = ENOMEM;
    for (size_t i = 0; err == 0 && i < report.count; i++) {
        const struct writer_synced *file = &report.files[i];
        char fields[96];
        counts[file->outcome]++;
        if (file->outcome != WRITER_SYNC_NOT_CLOSED)
            bytes += file->size;
        snprintf(fields, sizeof(fields), "%s\t%" PRIu64 "\t%d\t%u",
                 outcome_names[file->outcome], file->size, file->err,
                 file->retries);
        err = line_make(&lines[i], outcome_ranks[file->outcome], fields,
                        path_of(fs, file->key));
        if (file->outcome == WRITER_SYNC_FAILED)
            log_warn("sync: '%s' could not be uploaded: %s (it stays "
                     "journaled and is retried)", file->key,
                     strerror(file->err));
    }
    size_t waited = report.count - counts[WRITER_SYNC_NOT_CLOSED];
    if (err == 0 &&
        asprintf(&head,
                 SYNC_TEXT_SYNC_HEADER "\n"
                 "summary files=%zu bytes=%" PRIu64 " seconds=%.3f "
                 "uploaded=%u failed=%u removed=%u not_closed=%u waiting=%u "
                 "interrupted=%d\n",
                 waited, bytes, seconds, counts[WRITER_SYNC_UPLOADED],
                 counts[WRITER_SYNC_FAILED], counts[WRITER_SYNC_REMOVED],
                 counts[WRITER_SYNC_NOT_CLOSED], counts[WRITER_SYNC_WAITING],
                 report.interrupted ? 1 : 0) < 0) {
        head = NULL;
        err = ENOMEM;
    }
    if (err == 0)
        err = join_sorted(head, lines, report.count, cap, text, len);
    if (err == 0)
        log_info("sync: %zu file%s (%" PRIu64 " bytes) waited for in %.2f s: "
                 "%u uploaded, %u failed%s", waited, waited == 1 ? "" : "s",
                 bytes, seconds, counts[WRITER_SYNC_UPLOADED],
                 counts[WRITER_SYNC_FAILED],
                 report.interrupted ? ", interrupted" : "");
    if (lines != NULL)
        for (size_t i = 0; i < report.count; i++)
            free(lines[i].text);
    free(lines);
    free(head);
    writer_sync_report_free(&report);
    return err;
}

/* ------------------------------------------------------------- pending */

static const char *const state_names[] = {
    [WRITER_PENDING_OPEN] = "open",
    [WRITER_PENDING_WAITING] = "waiting",
    [WRITER_PENDING_UPLOADING] = "uploading",
    [WRITER_PENDING_FAILED] = "failed",
};

static const int state_ranks[] = {
    [WRITER_PENDING_FAILED] = 0, [WRITER_PENDING_UPLOADING] = 1,
    [WRITER_PENDING_WAITING] = 2, [WRITER_PENDING_OPEN] = 3,
};

int fs_pending_text(struct fs *fs, size_t cap, char **text, size_t *len)
{
    struct writer_pending *list = NULL;
    struct line *lines = NULL;
    size_t count = 0, markers = 0, markers_failed = 0;
    uint64_t journal_entries = 0, bytes = 0;
    unsigned counts[WRITER_PENDING_FAILED + 1] = {0};
    char *head = NULL;
    int err = 0;

    *text = NULL;
    *len = 0;
    if (fs->writer != NULL)
        err = writer_pending_list(fs->writer, &list, &count, &journal_entries);
    if (err == 0 && count > 0 && (lines = calloc(count, sizeof(*lines))) == NULL)
        err = ENOMEM;
    double now = clock_wall_seconds();
    for (size_t i = 0; err == 0 && i < count; i++) {
        const struct writer_pending *file = &list[i];
        char fields[192], promised[24] = "-", age[24] = "-", id[24] = "-";
        size_t key_len = strlen(file->key);
        bool marker = key_len > 0 && file->key[key_len - 1] == '/';
        if (marker) { /* a directory's marker: counted apart */
            markers++;
            markers_failed += file->state == WRITER_PENDING_FAILED;
        } else {
            counts[file->state]++;
            bytes += file->size;
            snprintf(id, sizeof(id), "%016" PRIx64, file->staging_id);
        }
        if (file->promised)
            snprintf(promised, sizeof(promised), "%" PRIu64, file->promised_size);
        if (file->closed_at.tv_sec != 0 || file->closed_at.tv_nsec != 0) {
            double closed = (double)file->closed_at.tv_sec +
                            (double)file->closed_at.tv_nsec / 1e9;
            snprintf(age, sizeof(age), "%.1f", now > closed ? now - closed : 0.0);
        }
        snprintf(fields, sizeof(fields),
                 "%s\t%" PRIu64 "\t%s\t%d\t%s\t%u\t%d\t%s",
                 state_names[file->state], file->size, promised,
                 file->open ? 1 : 0, age, file->retries, file->last_error, id);
        err = line_make(&lines[i], state_ranks[file->state], fields,
                        path_of(fs, file->key));
    }
    if (err == 0 &&
        asprintf(&head,
                 SYNC_TEXT_PENDING_HEADER "\n"
                 "summary files=%zu bytes=%" PRIu64 " open=%u waiting=%u "
                 "uploading=%u failed=%u journal_entries=%" PRIu64
                 " markers=%zu markers_failed=%zu\n",
                 count - markers, bytes, counts[WRITER_PENDING_OPEN],
                 counts[WRITER_PENDING_WAITING],
                 counts[WRITER_PENDING_UPLOADING],
                 counts[WRITER_PENDING_FAILED], journal_entries, markers,
                 markers_failed) < 0) {
        head = NULL;
        err = ENOMEM;
    }
    if (err == 0)
        err = join_sorted(head, lines, count, cap, text, len);
    if (lines != NULL)
        for (size_t i = 0; i < count; i++)
            free(lines[i].text);
    free(lines);
    free(head);
    writer_pending_free(list, count);
    return err;
}

/* ---------------------------------------------------------------- drop */

int fs_drop(struct fs *fs, const char *path, size_t path_len)
{
    struct writer_file *wfile = NULL;
    struct inode *inode = NULL;
    char *key = NULL;
    uint64_t size = 0, staging_id = 0;
    int err = 0;

    if (fs->writer == NULL)
        return EROFS;
    while (path_len > 0 && path[0] == '/') {
        path++;
        path_len--;
    }
    if (path_len == 0 || memchr(path, '\0', path_len) != NULL ||
        path[path_len - 1] == '/')
        return EINVAL;
    if (asprintf(&key, "%s%.*s", fs->root_key, (int)path_len, path) < 0)
        return ENOMEM;

    inode_table_lock(fs->inodes);
    inode = inode_find_locked(fs->inodes, key);
    if (inode != NULL && (inode->wfile == NULL || inode->unlinked))
        inode = NULL;
    bool writing = false;
    if (inode != NULL) {
        inode_pin_locked(inode);
        wfile = fs_staged_get_locked(inode);
        writing = inode->write_handles > 0;
    }
    inode_table_unlock(fs->inodes);
    if (inode == NULL) {
        err = ENOENT;
        goto out;
    }
    err = writing ? EBUSY : writer_file_drop(wfile, &size, &staging_id);
    if (err != 0) {
        log_info("pending --drop '%s': %s", key,
                 err == EALREADY ? "nothing pending (uploaded meanwhile)"
                                 : strerror(err));
        goto out;
    }
    log_warn("pending --drop: gave up '%s' (%" PRIu64 " bytes, staging file "
             "%016" PRIx64 "): never uploaded; its journal entry and staged "
             "data are removed, nothing in the bucket was changed", key, size,
             staging_id);
    /* as an unlink that never reached the bucket: the mount shows what
     * the bucket has (an older object comes back with the next listing) */
    inode_table_lock(fs->inodes);
    if (!inode->unlinked && strcmp(inode->key, key) == 0)
        inode_unlink_locked(fs->inodes, inode);
    inode_table_unlock(fs->inodes);
    fs_patch_parent(fs, key, NULL);
    fs_entry_changed(fs, key);
out:
    if (wfile != NULL)
        fs_staged_put(fs, inode, &wfile); /* detaches it: the data goes */
    if (inode != NULL)
        inode_put(fs->inodes, inode);
    free(key);
    return err;
}
