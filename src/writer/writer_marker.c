/*
 * writer_marker.c - directory markers owed to the bucket (writeback mode).
 *
 * In the default mode a directory's marker (its zero-byte `dir/` object
 * carrying the s3fs headers) is PUT by the call that changes it (mkdir,
 * chmod, utimes), as before. In writeback mode that cost one round trip
 * per call in the caller's thread, three per directory an untar makes
 * (mkdir, then utimensat and chmod once its files are in): at 20 ms a
 * request, most of an untar's time. Here instead the call journals the
 * marker (a journal entry whose key ends in '/', mode S_IFDIR, size 0:
 * durable when it returns, like a file's promise) and returns; sender
 * threads PUT it SETTLE_SECONDS later, several at a time, and drop the
 * entry. A call for a marker still waiting only replaces its metadata
 * (the entry too): the three calls of an untarred directory usually
 * cost one PUT.
 *
 * A waiting marker is not in the bucket: the fs layer shows it in
 * lookups and listings (writer_marker_pending/_visit), sends those under
 * a directory before renaming or removing it (writer_marker_flush,
 * writer_marker_forget), and counts them in uploads_pending. The drain
 * and `s3cachefs sync` send them all; after a crash writer_recover()
 * hands entries of markers back here (writer_marker_recovered).
 *
 * Locks: markers->lock guards the list and every marker's fields; it is
 * a leaf (nothing is taken under it; callers may hold the inode table or
 * writer lock) and never held across a request or a journal commit.
 * States of a marker: waiting (due at `due`), sending (`sending`: one
 * sender or flush has it), dropping (`dropping`, with `sending`: sent,
 * its entry being removed; marker_add waits for it to leave), and
 * `journaling` > 0 while a journal write of it is under way (it is then
 * not sent, so that the entry is never dropped before a write of it
 * lands; journal writes of one marker are one at a time). A marker
 * leaves the list only when the bucket has its latest metadata (`gen` ==
 * the generation sent), no journal write of it is under way and its
 * entry is gone, or when it is forgotten (rmdir).
 */
#include "config.h"

#include "writer/writer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/log.h"

#define MARKER_SETTLE_SECONDS 0.2   /* coalesce mkdir with its chmod/utimes */
#define MARKER_RETRY_FIRST 1.0
#define MARKER_RETRY_MAX 60.0
#define MARKER_SENDERS_MAX 8

struct marker {
    char *key;                    /* ends in '/' */
    struct s3_put_meta put;       /* content_type: put_type */
    char *put_type;
    uint64_t id;                  /* its journal entry; 0: none */
    uint64_t gen;                 /* bumped by every change */
    uint64_t attempts;            /* sends ended (success or failure) */
    int last_error;               /* of the last send; 0: none failed */
    unsigned retries;
    unsigned journaling;          /* journal writes of it under way */
    double due;                   /* monotonic */
    struct timespec changed_at;   /* wall clock: the last marker_add */
    bool sending;
    bool dropping;                /* sent: its entry is being dropped
                                     (sending stays set meanwhile) */
    bool forgotten;               /* removed from the list (rmdir) */
    unsigned refs;                /* the list, senders, waiters */
    struct marker *next;
};

struct writer_markers {
    struct writer *writer;
    pthread_mutex_t lock;
    pthread_cond_t work;          /* a marker became due, or stopping */
    pthread_cond_t changed;       /* a send or journal write ended */
    struct marker *head;
    uint64_t count;
    bool stopping;
    pthread_t threads[MARKER_SENDERS_MAX];
    unsigned thread_count;
};

static void marker_unref_locked(struct marker *marker)
{
    if (--marker->refs > 0)
        return;
    free(marker->key);
    free(marker->put_type);
    free(marker);
}

static struct marker *find_locked(struct writer_markers *markers,
                                  const char *key)
{
    for (struct marker *m = markers->head; m != NULL; m = m->next)
        if (strcmp(m->key, key) == 0)
            return m;
    return NULL;
}

static void unlink_locked(struct writer_markers *markers, struct marker *marker)
{
    for (struct marker **at = &markers->head; *at != NULL; at = &(*at)->next)
        if (*at == marker) {
            *at = marker->next;
            marker->next = NULL;
            markers->count--;
            marker->forgotten = true;
            marker_unref_locked(marker);
            return;
        }
}

static void meta_of(const struct s3_put_meta *put, struct writer_meta *out)
{
    *out = (struct writer_meta){
        .mode = put->mode, .uid = put->uid, .gid = put->gid,
        .mtime = put->mtime, .atime = put->has_atime ? put->atime
                                                     : (struct timespec){0, 0},
    };
}

static void entry_of(const struct marker *marker, struct journal_entry *out)
{
    struct writer_meta meta;

    meta_of(&marker->put, &meta);
    writer_entry_of(marker->id, marker->key, 0, &meta, NULL, false, out);
}

/* Copy PUT into MARKER (lock held); ENOMEM leaves it as it was. */
static int set_put_locked(struct marker *marker, const struct s3_put_meta *put)
{
    char *type = NULL;

    if (put->content_type != NULL &&
        (type = strdup(put->content_type)) == NULL)
        return ENOMEM;
    free(marker->put_type);
    marker->put_type = type;
    marker->put = *put;
    marker->put.content_type = type;
    marker->put.has_mode = true;
    marker->put.mode = S_IFDIR | (marker->put.mode & 07777);
    return 0;
}

/* ------------------------------------------------------------ sending */

/* PUT the marker's metadata as of now (lock not held); 0 or an errno. */
static int send_marker(struct writer *writer, const char *key,
                       const struct s3_put_meta *put)
{
    struct s3_body body = {.data = "", .fd = -1, .length = 0};

    return s3_put_object(writer->conf.s3, key, &body, put, NULL);
}

/* The first marker a sender may take now, or NULL with *NEXT_DUE the
 * earliest time one will be (0: none). Lock held. */
static struct marker *take_due_locked(struct writer_markers *markers,
                                      double *next_due)
{
    double now = clock_monotonic_seconds();

    *next_due = 0;
    for (struct marker *m = markers->head; m != NULL; m = m->next) {
        if (m->sending || m->journaling > 0)
            continue;
        if (m->due <= now)
            return m;
        if (*next_due == 0 || m->due < *next_due)
            *next_due = m->due;
    }
    return NULL;
}

/* Send MARKER (taken: sending set, a reference held) and settle its
 * state. Lock held on entry and on return, released meanwhile. */
static void send_taken_locked(struct writer_markers *markers,
                              struct marker *marker)
{
    struct writer *writer = markers->writer;
    uint64_t gen = marker->gen;
    struct s3_put_meta put = marker->put;
    char *key = strdup(marker->key);
    char *type = put.content_type != NULL ? strdup(put.content_type) : NULL;
    int err = key == NULL || (put.content_type != NULL && type == NULL)
                  ? ENOMEM : 0;

    put.content_type = type;
    pthread_mutex_unlock(&markers->lock);
    if (err == 0)
        err = send_marker(writer, key, &put);
    pthread_mutex_lock(&markers->lock);
    marker->sending = false;
    marker->attempts++;
    marker->last_error = err;
    if (err == 0)
        marker->retries = 0;
    bool done = err == 0 && !marker->forgotten && marker->gen == gen &&
                marker->journaling == 0;
    if (done) {
        /* the bucket has it: the promise goes, and only then the marker
         * (a flush or a drain that finds it gone finds its entry gone;
         * a change meanwhile waits for a new marker: marker_add) */
        uint64_t id = marker->id;
        marker->sending = true;
        marker->dropping = true;
        pthread_mutex_unlock(&markers->lock);
        journal_del(writer->conf.journal, id);
        pthread_mutex_lock(&markers->lock);
        marker->sending = marker->dropping = false;
        unlink_locked(markers, marker);
    } else if (err != 0 && !marker->forgotten) {
        double backoff = MARKER_RETRY_FIRST;
        for (unsigned i = 0; i < marker->retries && backoff < MARKER_RETRY_MAX; i++)
            backoff *= 2;
        if (backoff > MARKER_RETRY_MAX)
            backoff = MARKER_RETRY_MAX;
        marker->retries++;
        marker->due = clock_monotonic_seconds() + backoff;
        log_warn("directory marker '%s' not sent (%s); trying again in %.0f s",
                 key != NULL ? key : "?", strerror(err), backoff);
    } else if (!marker->forgotten) {
        marker->due = clock_monotonic_seconds(); /* changed meanwhile */
    }
    pthread_cond_broadcast(&markers->changed);
    pthread_cond_broadcast(&markers->work);
    free(key);
    free(type);
}

static void *sender_main(void *arg)
{
    struct writer_markers *markers = arg;

    pthread_mutex_lock(&markers->lock);
    for (;;) {
        double next_due;
        /* (stopping: after the drain; what waits stays journaled) */
        struct marker *marker = markers->stopping ? NULL
                              : take_due_locked(markers, &next_due);
        if (markers->stopping)
            break;
        if (marker == NULL) {
            if (next_due == 0) {
                pthread_cond_wait(&markers->work, &markers->lock);
            } else {
                struct timespec until =
                    clock_monotonic_after(next_due - clock_monotonic_seconds());
                pthread_cond_timedwait(&markers->work, &markers->lock, &until);
            }
            continue;
        }
        marker->sending = true;
        marker->refs++;
        send_taken_locked(markers, marker);
        marker_unref_locked(marker);
    }
    pthread_mutex_unlock(&markers->lock);
    return NULL;
}

/* ------------------------------------------------------------ the API */

int writer_markers_create(struct writer *writer, struct writer_markers **out)
{
    struct writer_markers *markers = calloc(1, sizeof(*markers));
    pthread_condattr_t monotonic;
    int err = 0;

    *out = NULL;
    if (markers == NULL)
        return ENOMEM;
    markers->writer = writer;
    pthread_mutex_init(&markers->lock, NULL);
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&markers->work, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pthread_cond_init(&markers->changed, NULL);
    if (!writer->conf.writeback) {
        *out = markers; /* sent by the caller: no thread */
        return 0;
    }
    unsigned count = writer->conf.uploaders ? writer->conf.uploaders : 1;
    if (count > MARKER_SENDERS_MAX)
        count = MARKER_SENDERS_MAX;
    for (; markers->thread_count < count; markers->thread_count++) {
        err = pthread_create(&markers->threads[markers->thread_count], NULL,
                             sender_main, markers);
        if (err != 0)
            break;
    }
    if (err != 0) {
        writer_markers_destroy(&markers);
        return err;
    }
    *out = markers;
    return 0;
}

void writer_markers_destroy(struct writer_markers **markersp)
{
    struct writer_markers *markers = *markersp;

    if (markers == NULL)
        return;
    pthread_mutex_lock(&markers->lock);
    markers->stopping = true;
    pthread_cond_broadcast(&markers->work);
    pthread_mutex_unlock(&markers->lock);
    for (unsigned i = 0; i < markers->thread_count; i++)
        pthread_join(markers->threads[i], NULL);
    while (markers->head != NULL)
        unlink_locked(markers, markers->head); /* (kept in the journal) */
    pthread_mutex_destroy(&markers->lock);
    pthread_cond_destroy(&markers->work);
    pthread_cond_destroy(&markers->changed);
    free(markers);
    *markersp = NULL;
}

uint64_t writer_markers_count(struct writer_markers *markers)
{
    pthread_mutex_lock(&markers->lock);
    uint64_t count = markers->count;
    pthread_mutex_unlock(&markers->lock);
    return count;
}

int writer_markers_pending(struct writer_markers *markers,
                           struct writer_pending **list, size_t *used,
                           size_t *cap)
{
    int err = 0;

    pthread_mutex_lock(&markers->lock);
    for (struct marker *marker = markers->head; err == 0 && marker != NULL;
         marker = marker->next) {
        if (marker->forgotten)
            continue;
        if (*used == *cap) {
            size_t grown = *cap ? *cap * 2 : 16;
            struct writer_pending *more = realloc(*list, grown * sizeof(**list));
            if (more == NULL) {
                err = ENOMEM;
                break;
            }
            *list = more;
            *cap = grown;
        }
        bool failed = marker->last_error != 0 && marker->retries > 0;
        (*list)[*used] = (struct writer_pending){
            .key = strdup(marker->key),
            .state = marker->sending ? WRITER_PENDING_UPLOADING
                     : failed        ? WRITER_PENDING_FAILED
                                     : WRITER_PENDING_WAITING,
            .promised = marker->id != 0,
            .closed_at = marker->changed_at,
            .retries = marker->retries,
            .last_error = failed ? marker->last_error : 0,
        };
        if ((*list)[*used].key == NULL)
            err = ENOMEM;
        else
            (*used)++;
    }
    pthread_mutex_unlock(&markers->lock);
    return err;
}

/* Add (or update) the waiting marker KEY with PUT and journal it; ID is
 * the entry's id when recovering it (its entry is then already there),
 * else 0. */
static int marker_add(struct writer *writer, const char *key,
                      const struct s3_put_meta *put, uint64_t id)
{
    struct writer_markers *markers = writer->markers;
    struct journal_entry entry;
    uint64_t stale_id = 0;
    int err = 0;

    pthread_mutex_lock(&markers->lock);
    struct marker *marker;
    while ((marker = find_locked(markers, key)) != NULL && marker->dropping)
        pthread_cond_wait(&markers->changed, &markers->lock);
    bool created = marker == NULL;
    if (created) {
        marker = calloc(1, sizeof(*marker));
        if (marker == NULL || (marker->key = strdup(key)) == NULL) {
            free(marker);
            pthread_mutex_unlock(&markers->lock);
            return ENOMEM;
        }
        marker->refs = 1;
        marker->id = id != 0 ? id : journal_next_id(writer->conf.journal);
        marker->due = clock_monotonic_seconds() +
                      (id != 0 ? 0 : MARKER_SETTLE_SECONDS);
    } else if (id != 0 && id != marker->id) {
        /* two entries of one key (a crash between a send and the drop of
         * its entry): the newer one stays */
        stale_id = id > marker->id ? marker->id : id;
        marker->id = id > marker->id ? id : marker->id;
    }
    err = set_put_locked(marker, put);
    if (err != 0 && created) {
        free(marker->key);
        free(marker);
        pthread_mutex_unlock(&markers->lock);
        return err;
    }
    if (created) {
        marker->next = markers->head;
        markers->head = marker;
        markers->count++;
    }
    marker->gen++;
    marker->retries = 0;
    clock_gettime(CLOCK_REALTIME, &marker->changed_at);
    double settle = clock_monotonic_seconds() + MARKER_SETTLE_SECONDS;
    if (!marker->sending && marker->due > settle)
        marker->due = settle; /* (a retry's backoff is cut short) */
    bool journal = id == 0;
    marker->refs++;
    if (journal) {
        /* one journal write of a marker at a time, each with the metadata
         * as it is when it begins: the last one written is the newest */
        while (marker->journaling > 0 && !marker->forgotten)
            pthread_cond_wait(&markers->changed, &markers->lock);
        journal = !marker->forgotten;
    }
    if (journal) {
        marker->journaling++;
        entry_of(marker, &entry); /* (its key stays: referenced) */
    }
    pthread_mutex_unlock(&markers->lock);

    if (journal)
        err = journal_put(writer->conf.journal, &entry);
    if (stale_id != 0)
        journal_del(writer->conf.journal, stale_id);

    pthread_mutex_lock(&markers->lock);
    if (journal) {
        marker->journaling--;
        if (err != 0 && created && marker->gen == 1 && !marker->sending &&
            !marker->forgotten)
            unlink_locked(markers, marker); /* the caller sends it itself */
        else
            err = 0; /* an older promise stands; this change is sent soon */
    }
    pthread_cond_broadcast(&markers->changed);
    pthread_cond_broadcast(&markers->work);
    marker_unref_locked(marker);
    pthread_mutex_unlock(&markers->lock);
    return err;
}

int writer_marker_put(struct writer *writer, const char *dir_key,
                      const struct s3_put_meta *put_meta)
{
    size_t len = strlen(dir_key);

    if (len == 0 || dir_key[len - 1] != '/')
        return EINVAL;
    if (!writer->conf.writeback)
        return send_marker(writer, dir_key, put_meta);
    int err = marker_add(writer, dir_key, put_meta, 0);
    if (err != 0) {
        log_warn("directory marker '%s': cannot journal it (%s); sending it "
                 "now", dir_key, strerror(err));
        err = send_marker(writer, dir_key, put_meta);
    }
    return err;
}

bool writer_marker_entry(const struct journal_entry *entry)
{
    size_t len = strlen(entry->key);

    return !entry->unclosed && entry->size == 0 && S_ISDIR(entry->mode) &&
           len > 0 && entry->key[len - 1] == '/';
}

void writer_marker_recovered(struct writer *writer,
                             const struct journal_entry *entry)
{
    struct s3_put_meta put = {
        .content_type = "application/x-directory",
        .has_mode = true, .has_uid = true, .has_gid = true, .has_mtime = true,
        .mode = entry->mode, .uid = entry->uid, .gid = entry->gid,
        .mtime = entry->mtime,
    };

    if (!writer->conf.writeback) {
        /* no senders: now, in this thread */
        if (send_marker(writer, entry->key, &put) == 0)
            journal_del(writer->conf.journal, entry->id);
        else
            log_warn("directory marker '%s' not sent; the next mount tries "
                     "again", entry->key);
        return;
    }
    log_debug("'%s': recovering directory marker %016" PRIx64, entry->key,
              entry->id);
    if (marker_add(writer, entry->key, &put, entry->id) != 0)
        log_warn("directory marker '%s' not recovered now (no memory); the "
                 "next mount tries again", entry->key);
}

bool writer_marker_pending(struct writer *writer, const char *dir_key,
                           struct writer_meta *meta)
{
    struct writer_markers *markers = writer->markers;

    pthread_mutex_lock(&markers->lock);
    struct marker *marker = find_locked(markers, dir_key);
    if (marker != NULL && meta != NULL)
        meta_of(&marker->put, meta);
    pthread_mutex_unlock(&markers->lock);
    return marker != NULL;
}

void writer_marker_visit(struct writer *writer, const char *prefix,
                         writer_marker_visit_fn visit, void *arg)
{
    struct writer_markers *markers = writer->markers;
    size_t prefix_len = strlen(prefix);
    struct writer_meta meta;

    pthread_mutex_lock(&markers->lock);
    for (struct marker *m = markers->head; m != NULL; m = m->next)
        if (strncmp(m->key, prefix, prefix_len) == 0) {
            meta_of(&m->put, &meta);
            visit(arg, m->key, &meta);
        }
    pthread_mutex_unlock(&markers->lock);
}

int writer_marker_flush(struct writer *writer, const char *prefix)
{
    struct writer_markers *markers = writer->markers;
    size_t prefix_len = strlen(prefix);
    int err = 0;

    pthread_mutex_lock(&markers->lock);
    /* each marker under PREFIX waiting now: sent by this thread unless a
     * sender has it; done when it is gone or a send that began after this
     * call ended in failure */
    for (;;) {
        struct marker *marker = NULL;
        bool busy = false;
        for (struct marker *m = markers->head; m != NULL; m = m->next) {
            if (strncmp(m->key, prefix, prefix_len) != 0 || m->last_error == -1)
                continue;
            if (m->sending || m->journaling > 0) {
                busy = true;
                continue;
            }
            marker = m;
            break;
        }
        if (marker == NULL && !busy)
            break;
        if (marker == NULL) {
            pthread_cond_wait(&markers->changed, &markers->lock);
            continue;
        }
        marker->sending = true;
        marker->refs++;
        send_taken_locked(markers, marker);
        if (marker->last_error != 0 && !marker->forgotten) {
            if (err == 0)
                err = marker->last_error;
            marker->last_error = -1; /* (tried by this flush: skip it) */
        }
        marker_unref_locked(marker);
    }
    /* the failed ones keep their backoff; clear what this flush marked */
    for (struct marker *m = markers->head; m != NULL; m = m->next)
        if (m->last_error == -1)
            m->last_error = err != 0 ? err : EIO;
    pthread_mutex_unlock(&markers->lock);
    return err;
}

void writer_marker_forget(struct writer *writer, const char *dir_key)
{
    struct writer_markers *markers = writer->markers;
    uint64_t id = 0;

    pthread_mutex_lock(&markers->lock);
    struct marker *marker;
    while ((marker = find_locked(markers, dir_key)) != NULL &&
           (marker->sending || marker->journaling > 0))
        pthread_cond_wait(&markers->changed, &markers->lock);
    if (marker != NULL) {
        id = marker->id;
        unlink_locked(markers, marker);
    }
    pthread_mutex_unlock(&markers->lock);
    if (id != 0)
        journal_del(writer->conf.journal, id);
}

uint64_t writer_marker_drain(struct writer *writer)
{
    int err = writer_marker_flush(writer, "");
    uint64_t left = writer_markers_count(writer->markers);

    if (left > 0)
        log_error("%llu directory marker%s could not be sent (%s); the next "
                  "mount sends %s", (unsigned long long)left,
                  left == 1 ? "" : "s", strerror(err ? err : EIO),
                  left == 1 ? "it" : "them");
    return left;
}
