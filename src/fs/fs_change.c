/*
 * fs_change.c - changes of names under way, so that none acts on keys a
 * directory rename is moving.
 *
 * The kernel runs a rename of a directory (which locks only the parent of
 * its name) at the same time as changes of names inside it: `mv ckpt
 * ckpt.old` while the trainer renames ckpt/last.tmp over ckpt/last, or
 * `rm d/x` while d moves. A change computes its keys from the inodes,
 * which the directory rename re-keys only once every key has moved: one
 * that went on with the old keys uploaded, deleted or copied under a name
 * the rename had moved away, and brought it back. So every change of
 * names enters here with the keys it is about to change:
 *
 *   - a change whose keys a directory rename moves (its old prefix or its
 *     new one) waits for that rename to end, then is told its keys are
 *     stale: it computes them again from the inodes, re-keyed by then;
 *     so is one that computed its keys before a rename of their prefix
 *     ended (the last FS_ENDED_MOVES renames are remembered; past them,
 *     any is taken as one);
 *   - a lookup of the change's name that found nothing while a rename
 *     moved its directory is told to look again (fs_change_missed());
 *   - a directory rename (fs_change_enter_move()) is registered at once,
 *     so that changes arriving later wait for it, then waits for the
 *     changes already inside under its prefixes, and for earlier renames
 *     overlapping its own, before it starts (marked `started`).
 *
 * An old key a rename could not delete after its copy (fs_left_key) is
 * recorded for the next mount to delete while it holds the version left;
 * a change of that key here drops the record first (the key is the
 * change's now, whatever it holds: the same bytes renamed back have the
 * same ETag), and a directory rename deletes the old keys under it before
 * it moves anything (or a ghost of the old version would move along).
 *
 * Only started renames count for fs_move_under_way_locked() (listings
 * overlapped by a move, files staged during one): a rename registered
 * and waiting has moved nothing, and a change inside that stages a file
 * must not wait for a rename that waits for it.
 *
 * Locks: everything here is under the inode table lock; fs->move_done
 * is broadcast when a rename or a change leaves.
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/fs_internal.h"

/* Whether PREFIX starts KEY. */
static bool key_under(const char *key, const char *prefix)
{
    return strncmp(key, prefix, strlen(prefix)) == 0;
}

/* Whether a key of CHANGE is under a prefix of MOVE. */
static bool change_meets(const struct fs_change *change,
                         const struct fs_dir_move *move)
{
    for (size_t i = 0; i < 2; i++)
        if (change->keys[i] != NULL &&
            (key_under(change->keys[i], move->src_prefix) ||
             key_under(change->keys[i], move->dst_prefix)))
            return true;
    return false;
}

/* Whether the prefixes of two renames overlap (one under the other). */
static bool moves_meet(const struct fs_dir_move *a, const struct fs_dir_move *b)
{
    const char *ours[2] = {a->src_prefix, a->dst_prefix};
    const char *theirs[2] = {b->src_prefix, b->dst_prefix};

    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j < 2; j++)
            if (key_under(ours[i], theirs[j]) || key_under(theirs[j], ours[i]))
                return true;
    return false;
}

bool fs_move_under_way_locked(const struct fs *fs, const char *key)
{
    for (const struct fs_dir_move *move = fs->dir_moves; move != NULL;
         move = move->next)
        if (move->started &&
            (key_under(key, move->src_prefix) || key_under(key, move->dst_prefix)))
            return true;
    return false;
}

uint64_t fs_change_seen(struct fs *fs)
{
    inode_table_lock(fs->inodes);
    uint64_t seen = fs->moves_ended;
    inode_table_unlock(fs->inodes);
    return seen;
}

/* Whether a directory rename that ended after SEEN may have moved a key
 * of CHANGE (computed before it ended). Lock held. */
static bool moved_since_locked(const struct fs *fs, uint64_t seen,
                               const struct fs_change *change)
{
    if (fs->moves_ended - seen > FS_ENDED_MOVES)
        return true; /* (too many since: not remembered) */
    for (uint64_t n = seen; n < fs->moves_ended; n++) {
        const struct fs_dir_move ended = {
            .src_prefix = fs->ended_moves[n % FS_ENDED_MOVES].src_prefix,
            .dst_prefix = fs->ended_moves[n % FS_ENDED_MOVES].dst_prefix,
        };
        if (ended.src_prefix == NULL || ended.dst_prefix == NULL ||
            change_meets(change, &ended))
            return true;
    }
    return false;
}

/* The registered rename that CHANGE meets, or NULL. Lock held. */
static const struct fs_dir_move *move_met_locked(const struct fs *fs,
                                                 const struct fs_change *change)
{
    for (const struct fs_dir_move *move = fs->dir_moves; move != NULL;
         move = move->next)
        if (change_meets(change, move))
            return move;
    return NULL;
}

/* The old keys left (fs->left_keys) that are KEY or, with PREFIX, under
 * KEY, taken out of the list. Lock held. */
static struct fs_left_key *take_left_locked(struct fs *fs, const char *key,
                                            bool prefix)
{
    struct fs_left_key *taken = NULL;

    for (struct fs_left_key **link = &fs->left_keys; *link != NULL;) {
        struct fs_left_key *left = *link;
        bool matches = prefix ? key_under(left->key, key)
                              : strcmp(left->key, key) == 0;
        if (matches) {
            *link = left->next;
            left->next = taken;
            taken = left;
        } else {
            link = &left->next;
        }
    }
    return taken;
}

static void left_key_free(struct fs_left_key *left)
{
    free(left->key);
    free(left);
}

/* A change of the keys of CHANGE: the records of old keys left among them
 * go (no lock held). */
static void forget_left_keys(struct fs *fs, const struct fs_change *change)
{
    struct fs_left_key *taken = NULL;

    inode_table_lock(fs->inodes);
    for (size_t i = 0; i < 2; i++) {
        if (change->keys[i] == NULL || fs->left_keys == NULL)
            continue;
        struct fs_left_key *found = take_left_locked(fs, change->keys[i], false);
        while (found != NULL) {
            struct fs_left_key *next = found->next;
            found->next = taken;
            taken = found;
            found = next;
        }
    }
    inode_table_unlock(fs->inodes);
    while (taken != NULL) {
        struct fs_left_key *next = taken->next;
        if (fs->writer != NULL)
            writer_move_cancel(fs->writer, taken->move_id);
        left_key_free(taken);
        taken = next;
    }
}

void fs_change_leave_key(struct fs *fs, const char *key, const char *etag,
                         uint64_t move_id)
{
    struct fs_left_key *left = calloc(1, sizeof(*left));

    if (left == NULL || (left->key = strdup(key)) == NULL) {
        free(left);
        return; /* (the record stays: the next mount deletes the key) */
    }
    snprintf(left->etag, sizeof(left->etag), "%s", etag);
    left->move_id = move_id;
    inode_table_lock(fs->inodes);
    left->next = fs->left_keys;
    fs->left_keys = left;
    inode_table_unlock(fs->inodes);
}

int fs_change_drop_left_under(struct fs *fs, const char *prefix)
{
    int err = 0;

    inode_table_lock(fs->inodes);
    struct fs_left_key *taken = take_left_locked(fs, prefix, true);
    inode_table_unlock(fs->inodes);
    while (taken != NULL) {
        struct fs_left_key *left = taken;
        struct s3_object_info info;
        taken = left->next;
        int there = err == 0 ? s3_head_object(fs->s3, left->key, &info) : 0;
        if (err == 0 && there == 0 && strcmp(info.etag, left->etag) == 0)
            there = s3_delete_object(fs->s3, left->key);
        else if (err == 0 && (there == 0 || there == ENOENT))
            there = 0; /* gone, or another version: not the one left */
        if (err == 0 && there == 0) {
            writer_move_cancel(fs->writer, left->move_id);
            left_key_free(left);
            continue;
        }
        if (err == 0)
            err = there;
        /* still there, or not asked: kept for the next try */
        inode_table_lock(fs->inodes);
        left->next = fs->left_keys;
        fs->left_keys = left;
        inode_table_unlock(fs->inodes);
    }
    return err;
}

void fs_change_free_left(struct fs *fs)
{
    for (size_t i = 0; i < FS_ENDED_MOVES; i++) {
        free(fs->ended_moves[i].src_prefix);
        free(fs->ended_moves[i].dst_prefix);
        fs->ended_moves[i].src_prefix = fs->ended_moves[i].dst_prefix = NULL;
    }
    while (fs->left_keys != NULL) {
        struct fs_left_key *next = fs->left_keys->next;
        left_key_free(fs->left_keys);
        fs->left_keys = next;
    }
}

bool fs_change_enter(struct fs *fs, struct fs_change *change, uint64_t seen,
                     const char *key, const char *other_key)
{
    bool stale = false;

    *change = (struct fs_change){.keys = {key, other_key}};
    inode_table_lock(fs->inodes);
    while (move_met_locked(fs, change) != NULL) {
        inode_table_wait(fs->inodes, &fs->move_done);
        stale = true;
    }
    stale = stale || moved_since_locked(fs, seen, change);
    if (!stale) {
        change->next = fs->changes;
        fs->changes = change;
    }
    inode_table_unlock(fs->inodes);
    if (!stale && fs->left_keys != NULL)
        forget_left_keys(fs, change);
    return !stale;
}

void fs_change_leave(struct fs *fs, struct fs_change *change)
{
    inode_table_lock(fs->inodes);
    struct fs_change **link = &fs->changes;
    while (*link != NULL && *link != change)
        link = &(*link)->next;
    if (*link != NULL)
        *link = change->next;
    pthread_cond_broadcast(&fs->move_done);
    inode_table_unlock(fs->inodes);
}

bool fs_change_enter_move(struct fs *fs, struct fs_dir_move *move, uint64_t seen)
{
    /* (as a change of its own two prefixes, first) */
    struct fs_change as_change = {.keys = {move->src_prefix, move->dst_prefix}};
    bool stale = false;

    move->started = false;
    inode_table_lock(fs->inodes);
    while (move_met_locked(fs, &as_change) != NULL) {
        inode_table_wait(fs->inodes, &fs->move_done);
        stale = true;
    }
    if (stale || moved_since_locked(fs, seen, &as_change)) {
        inode_table_unlock(fs->inodes);
        return false;
    }
    /* registered now: changes that come later wait for it (appended, so
     * that the list is in the order renames registered) */
    struct fs_dir_move **link = &fs->dir_moves;
    while (*link != NULL)
        link = &(*link)->next;
    move->next = NULL;
    *link = move;
    for (;;) {
        bool waits = false;
        for (const struct fs_change *change = fs->changes;
             change != NULL && !waits; change = change->next)
            waits = change_meets(change, move);
        for (const struct fs_dir_move *earlier = fs->dir_moves;
             earlier != move && !waits; earlier = earlier->next)
            waits = moves_meet(earlier, move);
        if (!waits)
            break;
        inode_table_wait(fs->inodes, &fs->move_done);
    }
    move->started = true;
    inode_table_unlock(fs->inodes);
    return true;
}

void fs_change_leave_move_locked(struct fs *fs, struct fs_dir_move *move)
{
    struct fs_dir_move **link = &fs->dir_moves;
    while (*link != NULL && *link != move)
        link = &(*link)->next;
    if (*link != NULL)
        *link = move->next;
    /* remembered for the changes whose keys were computed before (a
     * failed copy is taken as a move of everything: NULL) */
    size_t slot = fs->moves_ended % FS_ENDED_MOVES;
    free(fs->ended_moves[slot].src_prefix);
    free(fs->ended_moves[slot].dst_prefix);
    fs->ended_moves[slot].src_prefix = strdup(move->src_prefix);
    fs->ended_moves[slot].dst_prefix = strdup(move->dst_prefix);
    fs->moves_ended++;
    pthread_cond_broadcast(&fs->move_done);
}

bool fs_change_missed(struct fs *fs, uint64_t seen, fuse_ino_t parent)
{
    struct inode *dir = inode_get(fs->inodes, parent);
    char *key = dir != NULL ? inode_key_dup(fs->inodes, dir) : NULL;
    struct fs_change probe;
    bool missed = false;

    if (key != NULL) {
        missed = !fs_change_enter(fs, &probe, seen, key, NULL);
        if (!missed)
            fs_change_leave(fs, &probe);
    }
    free(key);
    if (dir != NULL)
        inode_put(fs->inodes, dir);
    return missed;
}
