/*
 * fs_rename.c - rename of files and directories.
 *
 * A file moves with a server-side copy and a delete, or, while its data
 * waits for its upload, by changing the key it will be uploaded to (the
 * journal follows, and an older object under the old key goes first). A
 * directory moves key by key (copies of a batch, then its deletes); the
 * staged files under it are held until the keys have moved, so no upload
 * of theirs lands under the new name before the old object moved there.
 *
 * Whatever changes the bucket in more than one request is recorded in the
 * journal as a move first (writer_move_begin()) and the record dropped
 * once the rename is done: a crash in between has the next mount finish
 * it (fs_recover.c), so a crash never leaves a state between the one
 * before the rename and the one after it. A request that fails undoes
 * the rename while nothing is copied yet; once the copy is there, it is
 * done.
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

#define MOVE_BATCH 64               /* keys copied or deleted per batch */

struct move_job {
    struct fs *fs;
    const char *src_key;
    char *dst_key;
    uint64_t size;
    char etag[S3_ETAG_MAX];
    char new_etag[S3_ETAG_MAX];
    bool delete_only;
    int err;
    pthread_mutex_t *lock;
    pthread_cond_t *done;
    size_t *pending;
};

static void move_job_main(void *arg)
{
    struct move_job *job = arg;

    uint64_t size;

    if (job->delete_only)
        job->err = s3_delete_object(job->fs->s3, job->src_key);
    else
        job->err = fs_copy_object(job->fs, job->src_key, job->etag, job->size,
                                  job->dst_key, NULL, job->new_etag, &size);
    pthread_mutex_lock(job->lock);
    if (--*job->pending == 0)
        pthread_cond_signal(job->done);
    pthread_mutex_unlock(job->lock);
}

/* Run JOBS (copies or deletes) on the worker pool, COUNT at a time. */
static void run_move_jobs(struct fs *fs, struct move_job *jobs, size_t count)
{
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t done = PTHREAD_COND_INITIALIZER;
    size_t pending = count;

    for (size_t i = 0; i < count; i++) {
        jobs[i].fs = fs;
        jobs[i].lock = &lock;
        jobs[i].done = &done;
        jobs[i].pending = &pending;
        if (!jobs[i].delete_only && jobs[i].size > UPLOAD_MAX_COPY_SIZE) {
            /* multipart copy waits on the pool: not from inside it */
            move_job_main(&jobs[i]);
        } else if (workers_submit(fs->workers, move_job_main, &jobs[i]) != 0) {
            move_job_main(&jobs[i]);
        }
    }
    pthread_mutex_lock(&lock);
    while (pending > 0)
        pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
}

int fs_move_prefix(struct fs *fs, const char *src_prefix, const char *dst_prefix)
{
    size_t src_len = strlen(src_prefix);
    bool had_marker = false;
    char *moved[MOVE_BATCH];      /* the keys the last batch deleted */
    size_t moved_count = 0;
    int err = 0;

    /* each batch is copied then deleted, so listing from the start again
     * finds the next one, until nothing is left */
    for (;;) {
        struct s3xml_listing page;
        struct move_job jobs[MOVE_BATCH];
        size_t count = 0;

        err = s3_list_objects(fs->s3, src_prefix, NULL, NULL, NULL, MOVE_BATCH,
                              &page);
        if (err != 0)
            break;
        /* a key the last batch deleted, listed again: the loop would copy
         * and delete it forever (keys are compared, not their order, which
         * some servers do not keep) */
        for (size_t i = 0; err == 0 && i < page.object_count; i++)
            for (size_t j = 0; err == 0 && j < moved_count; j++)
                if (strcmp(page.objects[i].key, moved[j]) == 0) {
                    log_error("rename of %s: '%s' is still listed after its "
                              "delete; stopping", src_prefix, moved[j]);
                    err = EIO;
                }
        /* a key the listing could not read cannot be copied: the move
         * would leave it behind */
        if (err == 0 && page.skipped_count > 0) {
            log_error("rename of %s: '%s' cannot be read from the listing; "
                      "stopping", src_prefix, page.skipped[0]);
            err = EIO;
        }
        if (err != 0) {
            s3xml_listing_free(&page);
            break;
        }
        memset(jobs, 0, sizeof(jobs));
        for (size_t i = 0; i < page.object_count && count < MOVE_BATCH; i++) {
            const struct s3xml_object *object = &page.objects[i];
            if (strcmp(object->key, src_prefix) == 0)
                had_marker = true;
            if (asprintf(&jobs[count].dst_key, "%s%s", dst_prefix,
                         object->key + src_len) < 0) {
                jobs[count].dst_key = NULL;
                err = ENOMEM;
                break;
            }
            jobs[count].src_key = object->key;
            jobs[count].size = object->size;
            snprintf(jobs[count].etag, sizeof(jobs[count].etag), "%s",
                     object->etag ? object->etag : "");
            count++;
        }
        if (err == 0)
            run_move_jobs(fs, jobs, count);
        for (size_t i = 0; err == 0 && i < count; i++)
            err = jobs[i].err;
        if (err == 0) {
            for (size_t i = 0; i < count; i++)
                jobs[i].delete_only = true;
            run_move_jobs(fs, jobs, count);
            for (size_t i = 0; err == 0 && i < count; i++)
                err = jobs[i].err;
        }
        for (size_t i = 0; i < moved_count; i++)
            free(moved[i]);
        moved_count = 0;
        for (size_t i = 0; i < count; i++) {
            free(jobs[i].dst_key);
            if (err == 0 && (moved[moved_count] = strdup(jobs[i].src_key)) != NULL)
                moved_count++;
        }
        s3xml_listing_free(&page);
        if (err != 0 || count == 0)
            break;
    }
    for (size_t i = 0; i < moved_count; i++)
        free(moved[i]);
    /* no marker moved: the new directory gets one, unless it has one
     * already (a move finished again after a crash moved it before) */
    struct s3_object_info marker;
    if (err == 0 && !had_marker &&
        s3_head_object(fs->s3, dst_prefix, &marker) == 0)
        had_marker = true;
    if (err == 0 && !had_marker) {
        struct writer_meta meta = {
            .mode = S_IFDIR | fs->conf.dir_mode, .uid = fs->conf.uid,
            .gid = fs->conf.gid,
            .mtime = clock_wall_now(),
        };
        err = fs_put_marker(fs, dst_prefix, &meta);
    }
    return err;
}

/* Delete the object under the key of INODE, a file with a promise in the
 * journal (held): it is an older version, or a replaced file's object.
 * This comes before the promise leaves the key (writer_file_rename(),
 * writer_file_forget()), so that a crash in between leaves the name with
 * its last promise, never with that older version. */
static int drop_older_object(struct fs *fs, struct inode *inode)
{
    char *key = NULL;
    int err = 0;

    inode_table_lock(fs->inodes);
    if (inode->attrs.etag[0] != '\0' || inode->object_unknown)
        key = strdup(inode->key);
    bool none = key == NULL && inode->attrs.etag[0] == '\0' &&
                !inode->object_unknown;
    inode_table_unlock(fs->inodes);
    if (none)
        return 0;
    if (key == NULL)
        return ENOMEM;
    err = s3_delete_object(fs->s3, key);
    if (err == 0) {
        inode_table_lock(fs->inodes);
        if (strcmp(inode->key, key) == 0) {
            inode->attrs.etag[0] = '\0'; /* nothing under the key now */
            inode->object_unknown = inode->replaced_object = false;
        }
        inode_table_unlock(fs->inodes);
    }
    free(key);
    return err;
}

/* One staged file under a directory being renamed. */
struct staged_move {
    struct inode *inode;          /* pinned */
    struct writer_file *wfile;    /* for fs_staged_put */
    char *new_key;
};

struct staged_rename {
    const char *src_prefix, *dst_prefix;
    struct staged_move *files;
    size_t count, capacity;
};

static void collect_staged(void *arg, struct inode *inode)
{
    struct staged_rename *rename = arg;
    size_t len = strlen(rename->src_prefix);

    if (rename->count == rename->capacity) {
        size_t capacity = rename->capacity ? rename->capacity * 2 : 16;
        void *files = realloc(rename->files, capacity * sizeof(*rename->files));
        if (files == NULL)
            return;
        rename->files = files;
        rename->capacity = capacity;
    }
    char *key = NULL;
    if (asprintf(&key, "%s%s", rename->dst_prefix, inode->key + len) < 0)
        return;
    inode_pin_locked(inode);
    rename->files[rename->count] = (struct staged_move){
        .inode = inode, .wfile = fs_staged_get_locked(inode), .new_key = key,
    };
    rename->count++;
}

/* Rename the directory MOVE->src_prefix to MOVE->dst_prefix in the
 * bucket (an empty directory there, REPLACES_DIR, is replaced). MOVE has
 * started (fs_change_enter_move()) and ends here, whatever happens: the
 * inodes are re-keyed as it leaves, and *SEEN_AFTER gets
 * fs_change_seen() as it left. */
static int rename_dir(struct fs *fs, struct fs_dir_move *move, bool replaces_dir,
                      uint64_t *seen_after)
{
    const char *src_prefix = move->src_prefix, *dst_prefix = move->dst_prefix;
    struct staged_rename staged = {src_prefix, dst_prefix, NULL, 0, 0};
    uint64_t move_id = 0;
    /* directory markers waiting to be sent (writeback mode) go first: the
     * move copies what the bucket holds */
    int err = fs->writer ? writer_marker_flush(fs->writer, src_prefix) : EROFS;
    if (err == 0)
        err = writer_marker_flush(fs->writer, dst_prefix);
    /* old keys renames left under it go first: not moved as files */
    if (err == 0)
        err = fs_change_drop_left_under(fs, src_prefix);
    if (err != 0) {
        inode_table_lock(fs->inodes);
        fs_change_leave_move_locked(fs, move);
        *seen_after = fs->moves_ended;
        inode_table_unlock(fs->inodes);
        return err;
    }

    /* files not uploaded yet go to their new names when they are (the
     * move started: no other is staged meanwhile); a listing fetched
     * meanwhile is not kept (fs_get_listing) */
    inode_table_lock(fs->inodes);
    fs_staged_visit_locked(fs, src_prefix, collect_staged, &staged);
    inode_table_unlock(fs->inodes);
    size_t held = 0, renamed = 0;
    err = 0;
    /* The objects of all of them move below, as every key does; they are
     * held meanwhile, so that no upload of their new data under the new
     * name lands before the move of their old object there. */
    for (; err == 0 && held < staged.count; held++) {
        struct staged_move *file = &staged.files[held];
        enum writer_renamed state;
        err = writer_file_hold(file->wfile, &state);
        /* a promise leaves its key only once the older version under it is
         * gone, and that version is not moved */
        if (err == 0 && state == WRITER_RENAMED_JOURNALED)
            err = drop_older_object(fs, file->inode);
    }
    /* From here the journal says the move is under way: a crash before it
     * is done has the next mount finish it (finish_move() in
     * fs_recover.c), the files' promises moved to the new prefix
     * included, so that the bucket holds the tree before the rename or
     * after it, never a mix. */
    if (err == 0) {
        struct writer_move record = {
            .from = src_prefix, .to = dst_prefix, .flags = JOURNAL_MOVE_PREFIX,
        };
        err = writer_move_begin(fs->writer, &record, NULL, &move_id);
    }
    /* the empty target directory is replaced: its marker goes, so that
     * the moved one (or a new one) takes its place */
    if (err == 0 && replaces_dir)
        err = s3_delete_object(fs->s3, dst_prefix);
    for (; err == 0 && renamed < staged.count; renamed++)
        err = writer_file_rename(staged.files[renamed].wfile,
                                 staged.files[renamed].new_key, NULL);
    if (err == 0)
        err = fs_move_prefix(fs, src_prefix, dst_prefix);
    if (err == 0) {
        writer_move_end(fs->writer, move_id, NULL);
    } else {
        /* a request failed (no crash): what moved in the bucket stays
         * moved; files not uploaded yet go back where the directory
         * still is, before anything of theirs is uploaded under the new
         * name, and the move is not finished by a later mount */
        size_t len = strlen(dst_prefix);
        for (size_t i = 0; i < renamed; i++) {
            char *back = NULL;
            if (asprintf(&back, "%s%s", src_prefix, staged.files[i].new_key + len) >= 0)
                writer_file_rename_back(staged.files[i].wfile, back);
            free(back);
        }
        writer_move_cancel(fs->writer, move_id);
    }
    inode_table_lock(fs->inodes);
    if (err == 0)
        err = inode_rekey_prefix_locked(fs->inodes, src_prefix, dst_prefix);
    fs_change_leave_move_locked(fs, move);
    *seen_after = fs->moves_ended;
    inode_table_unlock(fs->inodes);
    /* uploads may go now: their inodes have the files' keys (fs_uploaded) */
    for (size_t i = 0; i < held; i++)
        writer_file_release(staged.files[i].wfile);
    for (size_t i = 0; i < staged.count; i++) {
        fs_staged_put(fs, staged.files[i].inode, &staged.files[i].wfile);
        inode_put(fs->inodes, staged.files[i].inode);
        free(staged.files[i].new_key);
    }
    free(staged.files);
    if (err != 0)
        return err;
    /* the index keeps directories' headers (fs_store_dir_attrs()): what
     * it kept under the old names is gone from the bucket, and what it
     * kept under the new name (a directory there before) is not this one */
    metacache_forget_tree(fs->conf.cache, src_prefix, NULL, NULL);
    metacache_forget_tree(fs->conf.cache, dst_prefix, NULL, NULL);
    struct inode_attrs moved;
    inode_table_lock(fs->inodes);
    struct inode *top = inode_find_locked(fs->inodes, dst_prefix);
    bool known = top != NULL && top->attrs.kind == INODE_DIR;
    if (known)
        moved = top->attrs;
    inode_table_unlock(fs->inodes);
    if (known)
        fs_store_dir_attrs(fs, dst_prefix, &moved);
    return err;
}

/*
 * The bucket's part of a file's rename recorded as a move: the object
 * SRC_KEY (version ETAG of SIZE bytes) is copied to DST_KEY, then deleted.
 * A request whose answer was lost may have been done all the same: a HEAD
 * says (DST_WAS: the ETag under DST_KEY before, "" for none, NULL when
 * not known; a copy of parts has an ETag of its own, so a DST_KEY that is
 * not what it was is taken as the copy). Once the copy is there the
 * rename goes on whatever happens, for the object it replaced is gone and
 * the state before cannot come back: a delete that fails leaves SRC_KEY
 * to the next mount (*LEFT). Returns 0 (the copy's ETag in NEW_ETAG,
 * S3_ETAG_MAX bytes, and its size), or the copy's errno when the copy is
 * not there (ENOENT: no SRC_KEY).
 */
static int move_object(struct fs *fs, const char *src_key, const char *etag,
                       uint64_t size, const char *dst_key, const char *dst_was,
                       char *new_etag, uint64_t *new_size, bool *left)
{
    struct s3_object_info info;

    *left = false;
    int err = fs_copy_object(fs, src_key, etag, size, dst_key, NULL, new_etag,
                             new_size);
    if (err != 0 && err != ENOENT && etag[0] != '\0' &&
        s3_head_object(fs->s3, dst_key, &info) == 0 &&
        (strcmp(info.etag, etag) == 0 ||
         (dst_was != NULL && strcmp(info.etag, dst_was) != 0))) {
        /* its answer was lost, not the copy */
        snprintf(new_etag, S3_ETAG_MAX, "%s", info.etag);
        *new_size = info.size;
        err = 0;
    }
    if (err != 0)
        return err;
    err = s3_delete_object(fs->s3, src_key);
    if (err != 0 && s3_head_object(fs->s3, src_key, &info) != ENOENT) {
        log_warn("rename of '%s' to '%s': the old key cannot be deleted (%s); "
                 "the next mount deletes it", src_key, dst_key, strerror(err));
        *left = true;
    }
    return 0;
}

/* A file's rename in the bucket, as rename_file() does it. */
struct file_move {
    struct inode *inode;
    const char *src_key, *dst_key;
    struct writer_file *replaced; /* the target's staged file, or NULL */
    const char *dst_was;          /* the ETag under DST_KEY ("": none,
                                     NULL: not known) */
    struct writer_file *wfile;    /* the source's staged file, held */
    enum writer_renamed state;
    struct inode_attrs attrs;     /* the source's, as uploaded */
    bool own_object;              /* the object at the old key is the
                                     file's last saved version */
    bool some_object;             /* some object is at the old key */
    struct writer_move record;    /* journaled before the bucket changes */
    char source_etag[S3_ETAG_MAX]; /* the version the record moves */
    uint64_t move_id;             /* the record's, or 0 */
    bool left;                    /* the old key stays, to delete later */
};

/* The source held (its staged file, if any: no upload lands meanwhile),
 * what its data is, what is under its old key; a journaled file's older
 * object deleted and its promise moved to the new key. */
static int file_move_hold(struct fs *fs, struct file_move *m)
{
    struct inode *inode = m->inode;
    int err = 0;

    inode_table_lock(fs->inodes);
    /* its staged data being adopted by the cache (the kernel's RELEASE
     * came just before): the cache's move below needs it adopted, else
     * it lands under the old key, a version nobody reads, and the file
     * is fetched again (a torch.save-style rename on a loaded machine) */
    while (inode->detaching)
        inode_table_wait(fs->inodes, &fs->detach_done);
    if (inode->wfile != NULL)
        m->wfile = fs_staged_get_locked(inode);
    inode_table_unlock(fs->inodes);
    if (m->wfile != NULL)
        err = writer_file_hold(m->wfile, &m->state);
    inode_table_lock(fs->inodes);
    m->attrs = inode->attrs;
    /* whether the object at the old key is this file's last saved
     * version: not when it is one this file replaced, or when nobody
     * knows (recovery) */
    m->own_object = inode->attrs.etag[0] != '\0' && !inode->replaced_object &&
                    !inode->object_unknown;
    m->some_object = inode->attrs.etag[0] != '\0' || inode->object_unknown;
    if (inode->wfile != NULL)
        fs_staged_attrs_locked(fs, inode, &m->attrs); /* what was uploaded */
    inode_table_unlock(fs->inodes);
    if (err == 0 && m->state == WRITER_RENAMED_JOURNALED)
        err = drop_older_object(fs, inode);
    if (err == 0 && m->wfile != NULL)
        err = writer_file_rename(m->wfile, m->dst_key, m->replaced);
    if (err == 0 && m->wfile != NULL && m->state == WRITER_RENAMED_UPLOADED) {
        char etag[S3_ETAG_MAX];
        if (writer_file_etag(m->wfile, etag))
            snprintf(m->attrs.etag, sizeof(m->attrs.etag), "%s", etag);
    }
    return err;
}

/* Not uploaded yet: only where it goes changes; an object under the old
 * name goes away as rename says (journaled: gone already). Saved nowhere
 * (never closed, no older version): the object the rename replaces is
 * not kept until this file's upload, for a crash before it would bring
 * the replaced file back. */
static int file_move_unsaved(struct fs *fs, struct file_move *m)
{
    bool unsaved = m->state == WRITER_RENAMED_UNSAVED;
    bool dst_object = m->dst_was == NULL || m->dst_was[0] != '\0';
    int err = 0;

    m->record.flags = dst_object ? JOURNAL_MOVE_DROP_TARGET : 0;
    if (unsaved && (m->some_object || dst_object))
        err = writer_move_begin(fs->writer, &m->record, m->replaced, &m->move_id);
    if (err == 0 && unsaved && m->some_object)
        err = s3_delete_object(fs->s3, m->src_key);
    if (err == 0 && unsaved && dst_object)
        err = s3_delete_object(fs->s3, m->dst_key);
    if (err == 0 && unsaved) {
        inode_table_lock(fs->inodes);
        m->inode->attrs.etag[0] = '\0'; /* nothing under the new key */
        inode_table_unlock(fs->inodes);
    }
    return err;
}

/* Not uploaded yet, and its new bytes saved nowhere else (open, written):
 * the object at the old key is its only saved version, so it moves
 * first, and a crash before the file's upload leaves it under the new
 * name. Whatever version is there now (the inode's ETag may be older
 * than a copy's): a HEAD says; none (another client deleted it), the
 * file is saved nowhere, and moves as such. */
static int file_move_saved_version(struct fs *fs, struct file_move *m)
{
    struct s3_object_info info;
    char etag[S3_ETAG_MAX] = "";
    uint64_t size;
    int err = s3_head_object(fs->s3, m->src_key, &info);

    if (err == ENOENT) {
        m->some_object = false;
        return file_move_unsaved(fs, m);
    }
    m->record.flags = JOURNAL_MOVE_COPY;
    if (err == 0)
        snprintf(m->source_etag, sizeof(m->source_etag), "%s", info.etag);
    if (err == 0)
        err = writer_move_begin(fs->writer, &m->record, m->replaced, &m->move_id);
    if (err == 0)
        err = move_object(fs, m->src_key, info.etag, info.size, m->dst_key,
                          m->dst_was, etag, &size, &m->left);
    if (err == ENOENT)
        err = s3_delete_object(fs->s3, m->src_key); /* (gone: nothing moves) */
    return err;
}

/* In the bucket: copied to the new key and deleted from the old; the
 * inode, the index's attributes and a link's target follow. */
static int file_move_uploaded(struct fs *fs, struct file_move *m)
{
    struct inode_attrs *attrs = &m->attrs;
    char etag[S3_ETAG_MAX] = "";

    m->record.flags = JOURNAL_MOVE_COPY;
    snprintf(m->source_etag, sizeof(m->source_etag), "%s", attrs->etag);
    int err = writer_move_begin(fs->writer, &m->record, m->replaced, &m->move_id);
    if (err == 0)
        err = move_object(fs, m->src_key, attrs->etag, attrs->size, m->dst_key,
                          m->dst_was, etag, &attrs->size, &m->left);
    /* the staged data, adopted by the cache once released, is the copy's
     * version (its own ETag when the upload was of parts) */
    if (err == 0 && m->wfile != NULL && etag[0] != '\0')
        writer_file_copied(m->wfile, etag);
    if (err == 0 && etag[0] != '\0')
        snprintf(attrs->etag, sizeof(attrs->etag), "%s", etag);
    if (err != 0)
        return err;
    inode_table_lock(fs->inodes);
    m->inode->attrs = *attrs;
    char *link = m->inode->symlink_target != NULL
        ? strdup(m->inode->symlink_target) : NULL;
    inode_table_unlock(fs->inodes);
    if (attrs->headers_known)
        metacache_put_attrs(fs->conf.cache, m->dst_key, attrs);
    if (link != NULL && attrs->etag[0] != '\0')
        metacache_put_link(fs->conf.cache, m->dst_key, attrs->etag, link);
    free(link);
    return 0;
}

/* The record after the requests (ERR: theirs). Done: it goes with
 * REPLACED's promise, in one transaction (but for an old key left to
 * delete, which stays recorded, guarded by its ETag, and listed for this
 * mount's changes of it); failed: it goes, REPLACED keeps its promise. */
static void file_move_record_end(struct fs *fs, struct file_move *m, int err)
{
    if (err == 0 && m->left) {
        struct writer_move rest = {.from = m->src_key, .to = m->dst_key,
                                   .etag = m->record.etag};
        if (writer_move_narrow(fs->writer, m->move_id, &rest, m->replaced) == 0)
            fs_change_leave_key(fs, m->src_key, m->record.etag, m->move_id);
    } else if (err == 0) {
        writer_move_end(fs->writer, m->move_id, m->replaced);
    } else {
        writer_move_cancel(fs->writer, m->move_id);
    }
}

/* Rename the file INODE from SRC_KEY to DST_KEY in the bucket, replacing
 * the staged file REPLACED (may be NULL); DST_WAS is the ETag of the
 * object under DST_KEY ("" for none, NULL when not known). *STATE_OUT says what the file's data was (see
 * writer_file_hold). A staged file is held (writer_file_hold) and handed
 * to the caller in *HELD (a reference for fs_staged_put), to release once
 * the inode has its new key: no upload of it may land under the new name
 * before the old object is moved there. */
static int rename_file(struct fs *fs, struct inode *inode, const char *src_key,
                       const char *dst_key, struct writer_file *replaced,
                       const char *dst_was, struct writer_file **held,
                       enum writer_renamed *state_out)
{
    struct file_move m = {
        .inode = inode, .src_key = src_key, .dst_key = dst_key,
        .replaced = replaced, .dst_was = dst_was,
        .state = WRITER_RENAMED_UPLOADED,
        .record = {.from = src_key, .to = dst_key},
    };

    m.record.etag = m.source_etag;
    *state_out = WRITER_RENAMED_UPLOADED;
    int err = file_move_hold(fs, &m);
    *held = m.wfile;
    /* Every change of the bucket below is journaled as a move first (the
     * journaled file's is one journal transaction and needs none): a
     * crash between its requests has the next mount finish it
     * (fs_recover.c), with REPLACED's promise dropped, rather than leave
     * both names, or neither. A request that fails undoes it instead. */
    if (err == 0 && m.state == WRITER_RENAMED_UNSAVED && m.own_object)
        err = file_move_saved_version(fs, &m);
    else if (err == 0 && m.state != WRITER_RENAMED_UPLOADED)
        err = file_move_unsaved(fs, &m);
    else if (err == 0)
        err = file_move_uploaded(fs, &m);
    file_move_record_end(fs, &m, err);
    if (err != 0 && m.wfile != NULL)
        writer_file_rename_back(m.wfile, src_key); /* back where it was */
    if (err == 0)
        *state_out = m.state;
    return err;
}

/* One rename of names, as rename_names() does it: what its steps find
 * and hold, freed by rename_op_end(). */
struct rename_op {
    struct inode *src, *dst;      /* pinned; DST NULL: no target */
    char *src_key, *dst_key;      /* DST_KEY: the target's, if any */
    char *dst_file_key;           /* where the source goes */
    bool src_dir, dst_dir;
    struct writer_file *dst_wfile; /* the target's staged file */
    char dst_etag[S3_ETAG_MAX];   /* the object under the target's key */
    bool dst_unknown;             /* ... or one of unknown version */
    struct writer_file *held;     /* the source's, held by rename_file */
    enum writer_renamed state;    /* what the source's data was */
    struct fs_change change;      /* a file's rename, entered */
    struct fs_dir_move move;      /* a directory's, entered */
    bool entered, moving;
    uint64_t move_seen;           /* fs_change_seen() as the move ended */
};

/* The source and target of the names and their keys, as the inodes give
 * them now (after SEEN). ENOENT also sets *STALE when a directory rename
 * moved the source's directory meanwhile. */
static int rename_find(struct fs *fs, struct rename_op *op, fuse_ino_t parent,
                       const char *name, fuse_ino_t new_parent,
                       const char *new_name, uint64_t seen, bool *stale)
{
    int err = fs_find_child(fs, parent, name, true, &op->src, &op->src_key);

    if (err == ENOENT)
        *stale = fs_change_missed(fs, seen, parent);
    if (err == 0)
        err = fs_find_child(fs, new_parent, new_name, false, &op->dst,
                            &op->dst_key);
    if (err != 0)
        return err;
    inode_table_lock(fs->inodes);
    op->src_dir = op->src->attrs.kind == INODE_DIR && op->src->wfile == NULL;
    op->dst_dir = op->dst != NULL && op->dst->attrs.kind == INODE_DIR &&
                  op->dst->wfile == NULL;
    inode_table_unlock(fs->inodes);
    if (op->dst == op->src)
        return 0; /* the same file (rename_names does nothing) */
    return fs_child_key(fs, new_parent, new_name, op->src_dir, &op->dst_file_key);
}

/* No directory rename may move these keys while this one changes them
 * (fs_change.c): false (*STALE) after waiting for one; they are to be
 * computed again. */
static bool rename_enter(struct fs *fs, struct rename_op *op, uint64_t seen)
{
    if (op->src_dir) {
        op->move = (struct fs_dir_move){.src_prefix = op->src_key,
                                        .dst_prefix = op->dst_file_key};
        op->moving = fs_change_enter_move(fs, &op->move, seen);
        return op->moving;
    }
    op->entered = fs_change_enter(fs, &op->change, seen, op->src_key,
                                  op->dst_file_key);
    return op->entered;
}

/* What rename(2) refuses: an existing target with RENAME_NOREPLACE, a
 * file onto a directory and the other way, a directory that is not
 * empty, a directory into itself. */
static int rename_check(struct fs *fs, const struct rename_op *op,
                        unsigned flags)
{
    int err = 0;

    if (op->dst != NULL) {
        if (flags & RENAME_NOREPLACE)
            err = EEXIST;
        else if (op->src_dir && !op->dst_dir)
            err = ENOTDIR;
        else if (!op->src_dir && op->dst_dir)
            err = EISDIR;
        else if (op->dst_dir)
            err = fs_check_empty(fs, op->dst_key);
    }
    if (err == 0 && op->src_dir &&
        strncmp(op->dst_file_key, op->src_key, strlen(op->src_key)) == 0)
        err = EINVAL; /* into itself */
    return err;
}

/* The target file to replace, if any: what is under its key, its staged
 * file unlinked. A file replaced by the rename never reaches the bucket;
 * its journal entry goes once the rename is done (or with the move of the
 * source's entry, in the same journal transaction): a crash before leaves
 * the version it promised. */
static int rename_prepare_target(struct fs *fs, struct rename_op *op)
{
    struct inode *dst = op->dst;
    int err = 0;

    if (dst == NULL || op->dst_dir)
        return 0;
    inode_table_lock(fs->inodes);
    snprintf(op->dst_etag, sizeof(op->dst_etag), "%s", dst->attrs.etag);
    op->dst_unknown = dst->object_unknown;
    bool open = dst->open_handles > 0 && dst->attrs.kind == INODE_FILE;
    if (dst->wfile != NULL)
        op->dst_wfile = fs_staged_get_locked(dst);
    inode_table_unlock(fs->inodes);
    /* descriptors still open on the target read and write on after the
     * rename, as after an unlink: its data is kept staged, and whole,
     * before its object is replaced (an edit would fetch its missing
     * bytes from the object the rename puts there) */
    if (op->dst_wfile == NULL && open)
        err = fs_stage_file(fs, dst, false, &op->dst_wfile);
    if (err == 0 && op->dst_wfile != NULL && open)
        err = writer_file_complete(op->dst_wfile);
    if (err != 0)
        return err;
    /* an upload of it that was under way has landed now: its object is
     * under the key, whatever the inode said before */
    if (op->dst_wfile != NULL && writer_file_unlink(op->dst_wfile, false) &&
        !writer_file_etag(op->dst_wfile, op->dst_etag))
        op->dst_unknown = true;
    return 0;
}

/* The rename done: the inode table (the target unlinked, the source
 * re-keyed, what is under its new key), the parents' listings and times,
 * and the marker of a directory the rename emptied. */
static int rename_apply(struct fs *fs, struct rename_op *op)
{
    struct inode *src = op->src;
    struct inode_attrs attrs;
    int err = 0;

    inode_table_lock(fs->inodes);
    if (op->dst != NULL)
        inode_unlink_locked(fs->inodes, op->dst);
    if (!op->src_dir)
        err = inode_rekey_locked(fs->inodes, src, op->dst_file_key);
    if (!op->src_dir && op->state == WRITER_RENAMED_JOURNALED) {
        /* the replaced file's object stays under the key until this one's
         * upload replaces it; it goes if this one leaves first */
        snprintf(src->attrs.etag, sizeof(src->attrs.etag), "%s", op->dst_etag);
        src->replaced_object = op->dst_etag[0] != '\0';
        src->object_unknown = op->dst_unknown;
    } else if (!op->src_dir && op->state == WRITER_RENAMED_UNSAVED) {
        /* its own saved version moved here, or nothing is here */
        src->replaced_object = src->object_unknown = false;
    }
    fs_touch_locked(src, false);
    attrs = src->attrs;
    if (src->wfile != NULL)
        fs_staged_attrs_locked(fs, src, &attrs);
    inode_table_unlock(fs->inodes);
    fs_patch_parent(fs, op->src_key, NULL);
    fs_patch_parent(fs, op->dst_file_key, &attrs);
    fs_entry_changed(fs, op->src_key);
    fs_entry_changed(fs, op->dst_file_key);
    if (!op->src_dir) {
        fs_keep_parent_dir(fs, op->src_key); /* (the change is entered still) */
    } else {
        /* the move has ended: the marker of the directory it left, if it
         * is empty now, is a change of its own, not while a rename moves
         * that directory (then that rename's new name has one) */
        struct fs_change keep;
        if (fs_change_enter(fs, &keep, op->move_seen, op->src_key, NULL)) {
            fs_keep_parent_dir(fs, op->src_key);
            fs_change_leave(fs, &keep);
        }
    }
    return err;
}

/* Everything OP holds let go: the source's hold (its inode has the file's
 * key again: uploads may go), the change, the inodes, the keys. */
static void rename_op_end(struct fs *fs, struct rename_op *op)
{
    if (op->held != NULL) {
        writer_file_release(op->held);
        fs_staged_put(fs, op->src, &op->held);
    }
    if (op->entered)
        fs_change_leave(fs, &op->change);
    if (op->moving) {
        inode_table_lock(fs->inodes);
        fs_change_leave_move_locked(fs, &op->move);
        inode_table_unlock(fs->inodes);
    }
    if (op->dst != NULL) {
        fs_staged_put(fs, op->dst, &op->dst_wfile);
        fs_maybe_detach(fs, op->dst);
        inode_put(fs->inodes, op->dst);
    }
    if (op->src != NULL)
        inode_put(fs->inodes, op->src);
    free(op->src_key);
    free(op->dst_key);
    free(op->dst_file_key);
}

/* fs_rename() with the keys of its names as the inodes give them now
 * (SEEN: fs_change_seen() before they were computed). *STALE: a directory
 * rename moved them meanwhile; nothing was done, do it again. */
static int rename_names(struct fs *fs, fuse_ino_t parent, const char *name,
                        fuse_ino_t new_parent, const char *new_name,
                        unsigned flags, uint64_t seen, bool *stale)
{
    struct rename_op op = {.state = WRITER_RENAMED_UPLOADED};
    int err;

    *stale = false;
    err = rename_find(fs, &op, parent, name, new_parent, new_name, seen, stale);
    if (err != 0 || op.dst == op.src)
        goto out;
    *stale = !rename_enter(fs, &op, seen);
    if (*stale)
        goto out;
    err = rename_check(fs, &op, flags);
    if (err == 0)
        err = rename_prepare_target(fs, &op);
    if (err != 0)
        goto out;
    if (op.src_dir) {
        op.moving = false; /* (rename_dir ends the move, whatever happens) */
        err = rename_dir(fs, &op.move, op.dst_dir, &op.move_seen);
    } else {
        err = rename_file(fs, op.src, op.src_key, op.dst_file_key, op.dst_wfile,
                          op.dst_unknown ? NULL : op.dst_etag, &op.held,
                          &op.state);
    }
    if (err != 0) {
        if (op.dst_wfile != NULL)
            writer_file_relink(op.dst_wfile); /* the target stays */
        goto out;
    }
    if (op.dst_wfile != NULL)
        writer_file_forget(op.dst_wfile);
    err = rename_apply(fs, &op);
out:
    rename_op_end(fs, &op);
    return err;
}

int fs_rename(struct fs *fs, fuse_ino_t parent, const char *name,
              fuse_ino_t new_parent, const char *new_name, unsigned flags)
{
    bool stale = true;
    int err = 0;

    if (fs->writer == NULL)
        return EROFS;
    if (flags & ~(unsigned)RENAME_NOREPLACE)
        return EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
    while (stale)
        err = rename_names(fs, parent, name, new_parent, new_name, flags,
                           fs_change_seen(fs), &stale);
    return err;
}
