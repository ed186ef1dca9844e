/*
 * fs_ahead.c - the head-ahead: HEADs of a walked directory's next
 * entries, sent in the background so that the lookups of a walk find
 * their answers. fs_lookup.c starts a job (fs_ahead_start()) and takes
 * its answers (fs_ahead_take()); this file uses fs_attrs.c's
 * fs_known_file_attrs() and fs_reads_follow_lookups_locked(), never
 * fs_lookup.c.
 *
 * Why: a readdirplus answers a file whose headers are
 * not known and whose type the listing makes certain (larger than
 * FS_TYPED_OBJECT_MAX) without them: `find`, `ls` and os.walk never stat,
 * and cost LISTs only. A stat of such an entry is a LOOKUP; the first one
 * in a directory so answered that has to ask the bucket starts a job that
 * HEADs the directory's next entries in listing order on the worker pool,
 * `connections` at a time, so that the lookups of `ls -l` or `du`, which
 * the kernel sends one at a time, find their answer there or join its
 * HEAD under way instead of each paying a round trip. What bounds it:
 *   - at most AHEAD_SLOTS entries HEADed and not yet taken by a lookup
 *     (or passed to the kernel by a readdirplus): a job whose answers
 *     nobody takes stops there. A data loader that scanned the tree and
 *     opens files by name in random order costs at most that many HEADs
 *     per job it started, and a job stops once lookups in its directory
 *     are followed by reads (fs_reads_follow_lookups_locked() in
 *     fs_attrs.c: a lookup answered from a job counts as one that asked
 *     the bucket);
 *   - at most AHEAD_JOBS_MAX jobs: a new one ends the one whose answers
 *     were taken longest ago;
 *   - an answer is used for the entry of the ETag the job listed, in the
 *     directory (key) the job was started for: headers of that ETag
 *     whenever (as the index's), another answer (a new ETag, or gone)
 *     if it came after the listing the lookup goes by.
 * Locks: a job's fields, and inode.plain_entries, are guarded by the
 * inode table lock; a job holds a pin of its directory and a reference
 * to the listing it walks, and is freed by whoever unlinks it from
 * fs->aheads once none of its HEADs is under way (running == 0).
 */
#include "config.h"

#include "fs/fs.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/workers.h"
#include "fs/fs_internal.h"
#include "fs/inode.h"
#include "fs/metacache.h"
#include "fs/names.h"

#define AHEAD_SLOTS 64                   /* HEADs under way or answered, not
                                            yet taken, per head-ahead job */
#define AHEAD_JOBS_MAX 8                 /* head-ahead jobs at a time */

enum ahead_state {
    AHEAD_FREE,
    AHEAD_ASKING,                /* a HEAD is under way */
    AHEAD_ANSWERED,              /* err and attrs hold its answer */
};

struct ahead_slot {
    enum ahead_state state;
    size_t index;                /* of the entry in the job's listing */
    int err;                     /* 0 or ENOENT: an answer to use */
    double answered_at;          /* monotonic */
    struct inode_attrs attrs;
};

struct head_ahead {
    struct head_ahead *next_job;  /* in fs->aheads */
    struct fs *fs;
    struct inode *dir;            /* pinned */
    char *dir_key;                /* when the job started */
    struct inode_listing *listing; /* a reference: what it walks */
    size_t next;                  /* the next entry to consider */
    unsigned running;             /* tasks queued or under way */
    unsigned waiters;             /* lookups waiting for one of them */
    unsigned used;                /* slots not free */
    bool ended;                   /* unlinked from fs->aheads */
    double last_taken;            /* monotonic: an answer was taken */
    struct ahead_slot slots[AHEAD_SLOTS];
};

/* One HEAD of a job, on the worker pool. */
struct ahead_task {
    struct head_ahead *job;
    struct ahead_slot *slot;
    char *key;
    struct inode_attrs listed;
};

static void ahead_free(struct fs *fs, struct head_ahead *job)
{
    inode_listing_put(fs->inodes, job->listing);
    inode_put(fs->inodes, job->dir);
    free(job->dir_key);
    free(job);
}

/* Whether JOB, unlinked, is no one's any more: whoever sees it so frees
 * it (ahead_free), after unlocking. Lock held. */
static bool ahead_unused_locked(const struct head_ahead *job)
{
    return job->ended && job->running == 0 && job->waiters == 0;
}

/* Unlink JOB from fs->aheads; whether it can be freed now (no task of it
 * under way and no lookup waiting: else the last of them frees it). Lock
 * held. */
static bool ahead_unlink_locked(struct fs *fs, struct head_ahead *job)
{
    for (struct head_ahead **at = &fs->aheads; *at != NULL; at = &(*at)->next_job)
        if (*at == job) {
            *at = job->next_job;
            fs->ahead_count--;
            break;
        }
    job->ended = true;
    pthread_cond_broadcast(&fs->ahead_done); /* waiters look again */
    return ahead_unused_locked(job);
}

/* JOB walked its whole listing and every answer was taken: unlink it,
 * and whether it can be freed now (as ahead_unlink_locked). Lock held. */
static bool ahead_end_if_done_locked(struct fs *fs, struct head_ahead *job)
{
    return !job->ended && job->next >= job->listing->count &&
           job->running == 0 && job->used == 0 && ahead_unlink_locked(fs, job);
}

static struct head_ahead *ahead_find_locked(struct fs *fs, const struct inode *dir)
{
    for (struct head_ahead *job = fs->aheads; job != NULL; job = job->next_job)
        if (job->dir == dir)
            return job;
    return NULL;
}

static struct ahead_slot *ahead_slot_of_locked(struct head_ahead *job, size_t index)
{
    for (size_t i = 0; i < AHEAD_SLOTS; i++)
        if (job->slots[i].state != AHEAD_FREE && job->slots[i].index == index)
            return &job->slots[i];
    return NULL;
}

static void ahead_slot_free_locked(struct head_ahead *job, struct ahead_slot *slot)
{
    slot->state = AHEAD_FREE;
    job->used--;
}

/* The entry of JOB's listing to HEAD next, in a free slot: a task for it
 * (malloc'd, its key built), or NULL when there is none, no room, or the
 * job should stop. Lock held. */
static struct ahead_task *ahead_next_task_locked(struct fs *fs, struct head_ahead *job)
{
    if (job->ended || fs->stopping || job->used >= AHEAD_SLOTS ||
        job->running >= (fs->conf.connections ? fs->conf.connections : 1))
        return NULL;
    if (fs_reads_follow_lookups_locked(job->dir))
        return NULL; /* a data loader: its lookups GET whole files */
    while (job->next < job->listing->count) {
        size_t index = job->next++;
        const struct inode_dirent *entry = &job->listing->entries[index];
        /* directories are HEADed by readdirplus; files staged when the
         * listing was made (no ETag) are this mount's */
        if (entry->attrs.kind != INODE_FILE || entry->attrs.etag[0] == '\0' ||
            ahead_slot_of_locked(job, index) != NULL)
            continue;
        struct ahead_task *task = calloc(1, sizeof(*task));
        char *key = names_child_key(job->dir_key, entry->name,
                                    strlen(entry->name), false);
        if (task == NULL || key == NULL) {
            free(task);
            free(key);
            return NULL;
        }
        struct ahead_slot *slot = NULL;
        for (size_t i = 0; slot == NULL && i < AHEAD_SLOTS; i++)
            if (job->slots[i].state == AHEAD_FREE)
                slot = &job->slots[i];
        slot->state = AHEAD_ASKING;
        slot->index = index;
        job->used++;
        job->running++;
        *task = (struct ahead_task){job, slot, key, entry->attrs};
        return task;
    }
    return NULL;
}

static void ahead_task_main(void *arg);

/* Queue TASKS (a NULL-terminated array, freed here) on the worker pool;
 * a task that cannot be queued is undone. Unlocked. */
static void ahead_submit(struct fs *fs, struct ahead_task **tasks, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (workers_submit(fs->workers, ahead_task_main, tasks[i]) == 0)
            continue;
        struct head_ahead *job = tasks[i]->job;
        inode_table_lock(fs->inodes);
        ahead_slot_free_locked(job, tasks[i]->slot);
        job->running--;
        bool free_job = ahead_unused_locked(job);
        pthread_cond_broadcast(&fs->ahead_done);
        inode_table_unlock(fs->inodes);
        free(tasks[i]->key);
        free(tasks[i]);
        if (free_job)
            ahead_free(fs, job);
    }
}

/* Take the tasks JOB has room for into TASKS (connections at most).
 * Lock held. */
static size_t ahead_fill_locked(struct fs *fs, struct head_ahead *job,
                                struct ahead_task **tasks, size_t max)
{
    size_t count = 0;

    while (count < max && (tasks[count] = ahead_next_task_locked(fs, job)) != NULL)
        count++;
    return count;
}

#define AHEAD_FILL_MAX 64 /* tasks queued by one call */

static void ahead_task_main(void *arg)
{
    struct ahead_task *task = arg;
    struct head_ahead *job = task->job;
    struct fs *fs = job->fs;
    struct s3_object_info info;
    struct inode_attrs attrs;
    struct ahead_task *more[1];
    size_t more_count = 0;
    int err = ECANCELED;

    inode_table_lock(fs->inodes);
    bool ended = job->ended;
    inode_table_unlock(fs->inodes);
    if (!fs->stopping && !ended) {
        if (fs_known_file_attrs(fs, task->key, &task->listed, &attrs)) {
            err = ECANCELED; /* known: lookups find it without the job */
        } else {
            err = s3_head_object(fs->s3, task->key, &info);
            if (err == 0) {
                fs_head_file_attrs(fs, task->key, &info, &attrs);
                metacache_put_attrs(fs->conf.cache, task->key, &attrs);
            }
        }
    }
    inode_table_lock(fs->inodes);
    if (err == 0 || err == ENOENT) {
        task->slot->state = AHEAD_ANSWERED;
        task->slot->err = err;
        task->slot->answered_at = clock_monotonic_seconds();
        if (err == 0)
            task->slot->attrs = attrs;
    } else {
        ahead_slot_free_locked(job, task->slot); /* the lookup asks itself */
    }
    pthread_cond_broadcast(&fs->ahead_done);
    job->running--;
    more_count = ahead_fill_locked(fs, job, more, 1); /* this one's place */
    ahead_end_if_done_locked(fs, job);
    bool free_job = ahead_unused_locked(job);
    inode_table_unlock(fs->inodes);
    free(task->key);
    free(task);
    if (free_job)
        ahead_free(fs, job);
    else
        ahead_submit(fs, more, more_count);
}

/*
 * Whether a walk of DIR's listing is under way: a head-ahead job of DIR
 * whose answers lookups took within STALE_LISTING_TTLS x TTL. Its
 * lookups go by the listing the walk is of, however old (each asks the
 * bucket about its file anyway, which confirms it): a 10,000-key `ls
 * -l` of a minute listed the directory again every 10 s, 10 LISTs each
 * in the foreground of one lookup. Lock held.
 */
bool fs_ahead_live_locked(struct fs *fs, const struct inode *dir, double ttl)
{
    const struct head_ahead *job = ahead_find_locked(fs, dir);

    return job != NULL && !job->ended &&
           clock_monotonic_seconds() - job->last_taken < STALE_LISTING_TTLS * ttl;
}

/*
 * A lookup of file NAME in DIR (key DIR_KEY), listed as LISTED, whose
 * headers a head-ahead job of DIR may have: 0 or ENOENT with its answer
 * (*out), after waiting for its HEAD if under way; EAGAIN when the job
 * has none (the lookup asks the bucket itself: an entry the job had not
 * reached yet is then skipped by it). Lock not held.
 */
int fs_ahead_take(struct fs *fs, struct inode *dir, const char *dir_key,
                  const char *name, const struct inode_attrs *listed,
                  struct inode_attrs *out)
{
    struct ahead_task *tasks[AHEAD_FILL_MAX];
    size_t task_count = 0;
    struct head_ahead *job_to_free = NULL;
    int err = EAGAIN;

    inode_table_lock(fs->inodes);
    struct head_ahead *job = ahead_find_locked(fs, dir);
    if (job != NULL && strcmp(job->dir_key, dir_key) != 0) {
        /* renamed since: its keys are the old ones */
        if (ahead_unlink_locked(fs, job))
            job_to_free = job;
        job = NULL;
    }
    const struct inode_dirent *entry =
        job != NULL ? inode_listing_find(job->listing, name) : NULL;
    if (entry != NULL && strcmp(entry->attrs.etag, listed->etag) == 0) {
        size_t index = (size_t)(entry - job->listing->entries);
        struct ahead_slot *slot;
        job->waiters++;
        while (!job->ended && (slot = ahead_slot_of_locked(job, index)) != NULL &&
               slot->state == AHEAD_ASKING)
            inode_table_wait(fs->inodes, &fs->ahead_done);
        job->waiters--;
        if (ahead_unused_locked(job))
            job_to_free = job;
        slot = job->ended ? NULL : ahead_slot_of_locked(job, index);
        if (slot != NULL) {
            /* headers for the listed ETag hold as long as it does (as the
             * index's do); another answer (a new ETag, or gone) only if
             * it came after the listing the lookup goes by */
            bool same = slot->err == 0 &&
                        strcmp(slot->attrs.etag, listed->etag) == 0;
            if (same || slot->answered_at >= listed->fetched_at) {
                err = slot->err;
                if (err == 0) {
                    *out = slot->attrs;
                    out->size = listed->size;
                }
                job->last_taken = clock_monotonic_seconds();
            }
            ahead_slot_free_locked(job, slot);
        } else if (!job->ended && index >= job->next) {
            job->next = index + 1; /* ahead of the job: the lookup asks */
        }
        if (!job->ended)
            task_count = ahead_fill_locked(fs, job, tasks, AHEAD_FILL_MAX);
        if (ahead_end_if_done_locked(fs, job))
            job_to_free = job;
    }
    inode_table_unlock(fs->inodes);
    if (job_to_free != NULL)
        ahead_free(fs, job_to_free);
    ahead_submit(fs, tasks, task_count);
    return err;
}

/*
 * A lookup of file NAME in DIR (key DIR_KEY) is about to ask the bucket:
 * if a readdirplus answered entries of DIR without attributes since the
 * last job (someone walked DIR) and no job of DIR runs, start one after
 * NAME (the lookup asks for NAME itself, at the same time). Lock not
 * held.
 */
void fs_ahead_start(struct fs *fs, struct inode *dir, const char *dir_key,
                    const char *name)
{
    struct ahead_task *tasks[AHEAD_FILL_MAX];
    size_t task_count = 0;
    struct head_ahead *job = NULL, *evicted = NULL;

    inode_table_lock(fs->inodes);
    bool wanted = dir->plain_entries && dir->listing != NULL && !fs->stopping &&
                  ahead_find_locked(fs, dir) == NULL &&
                  !fs_reads_follow_lookups_locked(dir);
    inode_table_unlock(fs->inodes);
    if (!wanted || (job = calloc(1, sizeof(*job))) == NULL ||
        (job->dir_key = strdup(dir_key)) == NULL) {
        free(job);
        return;
    }
    inode_table_lock(fs->inodes);
    const struct inode_dirent *entry = inode_listing_find(dir->listing, name);
    if (!dir->plain_entries || fs->stopping || entry == NULL ||
        ahead_find_locked(fs, dir) != NULL) {
        inode_table_unlock(fs->inodes);
        free(job->dir_key);
        free(job);
        return;
    }
    dir->plain_entries = false;
    if (fs->ahead_count >= AHEAD_JOBS_MAX) {
        /* the one whose answers were taken longest ago goes */
        struct head_ahead *oldest = fs->aheads;
        for (struct head_ahead *other = fs->aheads; other != NULL;
             other = other->next_job)
            if (other->last_taken < oldest->last_taken)
                oldest = other;
        if (ahead_unlink_locked(fs, oldest))
            evicted = oldest;
    }
    job->fs = fs;
    job->dir = dir;
    inode_pin_locked(dir);
    job->listing = inode_listing_ref_locked(dir->listing);
    job->next = (size_t)(entry - dir->listing->entries) + 1;
    job->last_taken = clock_monotonic_seconds();
    job->next_job = fs->aheads;
    fs->aheads = job;
    fs->ahead_count++;
    task_count = ahead_fill_locked(fs, job, tasks, AHEAD_FILL_MAX);
    inode_table_unlock(fs->inodes);
    if (evicted != NULL)
        ahead_free(fs, evicted);
    ahead_submit(fs, tasks, task_count);
}

bool fs_ahead_holds_locked(struct fs *fs, const struct inode *dir,
                           const char *name)
{
    struct head_ahead *job = ahead_find_locked(fs, dir);
    const struct inode_dirent *entry =
        job != NULL && !job->ended ? inode_listing_find(job->listing, name) : NULL;

    return entry != NULL &&
           ahead_slot_of_locked(job, (size_t)(entry - job->listing->entries)) != NULL;
}

void fs_ahead_entry_passed_locked(struct fs *fs, struct inode *dir,
                                  const char *name, bool plain)
{
    if (plain)
        dir->plain_entries = true;
    struct head_ahead *job = ahead_find_locked(fs, dir);
    const struct inode_dirent *entry =
        job != NULL ? inode_listing_find(job->listing, name) : NULL;
    if (entry == NULL)
        return;
    struct ahead_slot *slot =
        ahead_slot_of_locked(job, (size_t)(entry - job->listing->entries));
    /* the kernel got its attributes: no lookup will take this answer
     * (room for the next entry, taken by the next lookup or task) */
    if (slot != NULL && slot->state == AHEAD_ANSWERED && !plain)
        ahead_slot_free_locked(job, slot);
}

void fs_ahead_end_under(struct fs *fs, const char *prefix)
{
    for (;;) {
        inode_table_lock(fs->inodes);
        struct head_ahead *job = fs->aheads;
        while (job != NULL && prefix != NULL &&
               strncmp(job->dir_key, prefix, strlen(prefix)) != 0)
            job = job->next_job;
        bool free_job = job != NULL && ahead_unlink_locked(fs, job);
        inode_table_unlock(fs->inodes);
        if (job == NULL)
            return;
        if (free_job)
            ahead_free(fs, job);
    }
}

void fs_ahead_end_all(struct fs *fs)
{
    fs_ahead_end_under(fs, NULL);
}
