/*
 * fs_recover.c - the fs layer's part of recovery at mount (fs_recover()):
 * the renames a crash interrupted are finished in the bucket, as their
 * moves in the journal say (finish_move(), writer_recover()'s FINISH),
 * then the journal's promises are attached to inodes (fs_recovered, in
 * fs_stage.c) and queued. Runs before the session loop, so before any
 * request. It is the last file of the layer: it uses the renames'.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <string.h>

#include "base/log.h"
#include "fs/fs_internal.h"
#include "fs/metacache.h"

/*
 * Finish MOVE (a JOURNAL_MOVE) in the bucket, as the rename that wrote it
 * would have, whatever it had done before the crash (each step is done
 * again or found done):
 *   - a directory's: every key left under its prefix moves;
 *   - a file's copy: the object under the old key, if it is still the
 *     version the rename began with, is copied to the new key, then
 *     deleted; gone, it was (the delete comes after the copy); another
 *     version there is left alone (it is not what was renamed), and
 *     ESTALE says the rename did not happen (the promise it replaced
 *     stays);
 *   - a file's without a copy: the old key's object goes (with an ETag
 *     recorded, only while it is that version: what a rename left to
 *     delete), and the new key's with JOURNAL_MOVE_DROP_TARGET.
 */
static int finish_move(void *arg, const struct journal_entry *move)
{
    struct fs *fs = arg;
    int err = 0;

    if ((move->move_flags & JOURNAL_MOVE_PREFIX) != 0) {
        err = fs_move_prefix(fs, move->key, move->move_to);
        /* what the index kept of both trees is not what they hold now
         * (as rename_dir forgets it once it is done) */
        if (err == 0) {
            metacache_forget_tree(fs->conf.cache, move->key, NULL, NULL);
            metacache_forget_tree(fs->conf.cache, move->move_to, NULL, NULL);
        }
        return err;
    }
    if ((move->move_flags & JOURNAL_MOVE_COPY) != 0) {
        struct s3_object_info info;
        char etag[S3_ETAG_MAX] = "";
        uint64_t size = 0;
        err = s3_head_object(fs->s3, move->key, &info);
        if (err == ENOENT)
            return 0;
        if (err != 0)
            return err;
        if (move->move_etag != NULL && move->move_etag[0] != '\0' &&
            strcmp(info.etag, move->move_etag) != 0) {
            log_warn("'%s' is another version (%s) than the one its rename to "
                     "'%s' began with (%s); it is left as it is", move->key,
                     info.etag, move->move_to, move->move_etag);
            return ESTALE;
        }
        err = fs_copy_object(fs, move->key, info.etag, info.size, move->move_to,
                             NULL, etag, &size);
        if (err == 0 || err == ENOENT)
            err = s3_delete_object(fs->s3, move->key);
        return err == ENOENT ? 0 : err;
    }
    /* an old key left to delete (the rename was done but for it) is
     * deleted only while it is the version the rename moved */
    if (move->move_etag != NULL && move->move_etag[0] != '\0') {
        struct s3_object_info info;
        err = s3_head_object(fs->s3, move->key, &info);
        if (err == ENOENT)
            return 0;
        if (err != 0)
            return err;
        if (strcmp(info.etag, move->move_etag) != 0)
            return 0; /* another version since: not the one moved */
    }
    err = s3_delete_object(fs->s3, move->key);
    if ((err == 0 || err == ENOENT) &&
        (move->move_flags & JOURNAL_MOVE_DROP_TARGET) != 0)
        err = s3_delete_object(fs->s3, move->move_to);
    return err == ENOENT ? 0 : err;
}

int fs_recover(struct fs *fs)
{
    if (fs->writer == NULL)
        return 0;
    return writer_recover(fs->writer, fs_recovered, finish_move, fs);
}
