/*
 * reader.c - ranged reads with sequential read-ahead (see reader.h).
 *
 * Per file: lock guards slots[], window, next_offset and inflight; chunk_done is broadcast whenever a slot leaves FETCHING.
 * Slot states: EMPTY -> FETCHING -> READY | FAILED -> EMPTY (reused).
 * A FETCHING slot's buffer belongs to the thread fetching it; nobody else
 * touches it until the state changes under the lock. No lock is held
 * during a GET.
 *
 * The reader-wide budget (memory_in_use) is an atomic: read-ahead is
 * skipped, never waited for, when it is spent.
 */
#include "config.h"

#include "reader.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define MAX_SLOTS 64

enum slot_state { SLOT_EMPTY, SLOT_FETCHING, SLOT_READY, SLOT_FAILED };

struct slot {
    enum slot_state state;
    uint64_t chunk;          /* chunk number: offset / READER_CHUNK_SIZE */
    char *data;
    size_t len;
    int err;
};

struct reader {
    struct reader_conf conf;
    _Atomic uint64_t memory_in_use;
    _Atomic uint64_t bytes_read;
    _Atomic uint64_t chunks_prefetched;
};

struct reader_file {
    struct reader *reader;
    char *key;
    char *etag;
    uint64_t size;

    pthread_mutex_t lock;
    pthread_cond_t chunk_done;
    struct slot slots[MAX_SLOTS];
    unsigned slot_count;     /* slots usable: window + 2, <= MAX_SLOTS */
    unsigned window;         /* chunks to keep ahead; 0 = random reader */
    uint64_t next_offset;    /* where a sequential read would start */
    unsigned inflight;       /* read-ahead jobs not yet finished */
};

struct fetch_job {
    struct reader_file *file;
    struct slot *slot;
};

int reader_create(const struct reader_conf *conf, struct reader **out)
{
    struct reader *reader = calloc(1, sizeof(*reader));

    *out = reader;
    if (reader == NULL)
        return ENOMEM;
    reader->conf = *conf;
    return 0;
}

void reader_destroy(struct reader **reader)
{
    free(*reader);
    *reader = NULL;
}

void reader_get_stats(struct reader *reader, struct reader_stats *out)
{
    out->bytes_read = atomic_load(&reader->bytes_read);
    out->chunks_prefetched = atomic_load(&reader->chunks_prefetched);
    out->memory_in_use = atomic_load(&reader->memory_in_use);
}

int reader_open(struct reader *reader, const char *key, const char *etag,
                uint64_t size, struct reader_file **out)
{
    struct reader_file *file = calloc(1, sizeof(*file));
    uint64_t window_chunks = reader->conf.read_ahead / READER_CHUNK_SIZE;

    *out = NULL;
    if (file == NULL)
        return ENOMEM;
    file->key = strdup(key);
    file->etag = etag[0] != '\0' ? strdup(etag) : NULL;
    if (file->key == NULL || (etag[0] != '\0' && file->etag == NULL)) {
        free(file->key);
        free(file->etag);
        free(file);
        return ENOMEM;
    }
    file->reader = reader;
    file->size = size;
    file->slot_count = (unsigned)(window_chunks + 2 > MAX_SLOTS ? MAX_SLOTS
                                                                : window_chunks + 2);
    pthread_mutex_init(&file->lock, NULL);
    pthread_cond_init(&file->chunk_done, NULL);
    *out = file;
    return 0;
}

static size_t chunk_length(const struct reader_file *file, uint64_t chunk)
{
    uint64_t start = chunk * READER_CHUNK_SIZE;
    uint64_t left = file->size - start;
    return left < READER_CHUNK_SIZE ? (size_t)left : READER_CHUNK_SIZE;
}

/* GET one chunk into SLOT (state FETCHING, buffer allocated). Unlocked. */
static void fetch_chunk(struct reader_file *file, struct slot *slot)
{
    size_t got = 0;
    uint64_t chunk = slot->chunk;
    size_t want = chunk_length(file, chunk);
    int err = s3_get_object_range(file->reader->conf.s3, file->key,
                                  chunk * READER_CHUNK_SIZE, want, file->etag,
                                  slot->data, &got, NULL);
    if (err == 0 && got != want)
        err = EIO; /* the object is shorter than it was at open */
    if (err == ESTALE)
        log_warn("'%s' changed while open; reopen it to read the new version",
                 file->key);

    pthread_mutex_lock(&file->lock);
    slot->len = got;
    slot->err = err;
    slot->state = err == 0 ? SLOT_READY : SLOT_FAILED;
    pthread_cond_broadcast(&file->chunk_done);
    pthread_mutex_unlock(&file->lock);
}

static void fetch_job_main(void *arg)
{
    struct fetch_job *job = arg;
    struct reader_file *file = job->file;

    fetch_chunk(file, job->slot);
    free(job);
    pthread_mutex_lock(&file->lock);
    file->inflight--;
    pthread_cond_broadcast(&file->chunk_done);
    pthread_mutex_unlock(&file->lock);
}

static struct slot *find_slot_locked(struct reader_file *file, uint64_t chunk)
{
    for (unsigned i = 0; i < file->slot_count; i++)
        if (file->slots[i].state != SLOT_EMPTY && file->slots[i].chunk == chunk)
            return &file->slots[i];
    return NULL;
}

static void release_slot_locked(struct reader_file *file, struct slot *slot)
{
    if (slot->data != NULL)
        atomic_fetch_sub(&file->reader->memory_in_use, READER_CHUNK_SIZE);
    free(slot->data);
    slot->data = NULL;
    slot->state = SLOT_EMPTY;
}

/*
 * A slot for CHUNK, emptied of chunks behind BEHIND first (a sequential
 * reader has consumed them). NULL when every slot is busy.
 */
static struct slot *claim_slot_locked(struct reader_file *file, uint64_t chunk,
                                      uint64_t behind)
{
    struct slot *victim = NULL;

    for (unsigned i = 0; i < file->slot_count; i++) {
        struct slot *slot = &file->slots[i];
        if (slot->state == SLOT_EMPTY)
            return slot;
        if (slot->state == SLOT_FETCHING)
            continue;
        /* prefer a chunk the reader has passed, else the farthest ahead */
        bool slot_passed = slot->chunk < behind;
        bool victim_passed = victim != NULL && victim->chunk < behind;
        if (victim == NULL || (slot_passed && !victim_passed) ||
            (slot_passed == victim_passed && slot->chunk > victim->chunk))
            victim = slot;
    }
    if (victim != NULL && victim->chunk != chunk)
        release_slot_locked(file, victim);
    return victim;
}

/* Start read-ahead of chunks after CURRENT, up to the window. */
static void schedule_read_ahead_locked(struct reader_file *file, uint64_t current)
{
    struct reader *reader = file->reader;
    uint64_t last_chunk = file->size == 0 ? 0 : (file->size - 1) / READER_CHUNK_SIZE;

    for (uint64_t chunk = current + 1;
         chunk <= current + file->window && chunk <= last_chunk; chunk++) {
        if (find_slot_locked(file, chunk) != NULL)
            continue;
        uint64_t used = atomic_fetch_add(&reader->memory_in_use, READER_CHUNK_SIZE);
        if (used + READER_CHUNK_SIZE > reader->conf.memory_budget) {
            atomic_fetch_sub(&reader->memory_in_use, READER_CHUNK_SIZE);
            return;
        }
        struct slot *slot = claim_slot_locked(file, chunk, current);
        struct fetch_job *job = slot ? malloc(sizeof(*job)) : NULL;
        char *data = job ? malloc(READER_CHUNK_SIZE) : NULL;
        if (data == NULL) {
            free(job);
            atomic_fetch_sub(&reader->memory_in_use, READER_CHUNK_SIZE);
            return;
        }
        *slot = (struct slot){.state = SLOT_FETCHING, .chunk = chunk, .data = data};
        *job = (struct fetch_job){.file = file, .slot = slot};
        file->inflight++;
        if (workers_submit(reader->conf.workers, fetch_job_main, job) != 0) {
            file->inflight--;
            release_slot_locked(file, slot);
            free(job);
            return;
        }
        atomic_fetch_add(&reader->chunks_prefetched, 1);
    }
}

/* Make CHUNK available in a slot, fetching it in this thread if nobody is.
 * Returns the READY slot (locked), or NULL with *err set. */
static struct slot *wait_chunk_locked(struct reader_file *file, uint64_t chunk,
                                      int *err)
{
    for (;;) {
        struct slot *slot = find_slot_locked(file, chunk);
        if (slot != NULL && slot->state == SLOT_READY)
            return slot;
        if (slot != NULL && slot->state == SLOT_FAILED) {
            *err = slot->err;
            release_slot_locked(file, slot); /* the next read tries again */
            return NULL;
        }
        if (slot != NULL) { /* FETCHING: share that request */
            pthread_cond_wait(&file->chunk_done, &file->lock);
            continue;
        }
        slot = claim_slot_locked(file, chunk, chunk);
        if (slot == NULL) { /* all slots fetching: wait for one */
            pthread_cond_wait(&file->chunk_done, &file->lock);
            continue;
        }
        char *data = malloc(READER_CHUNK_SIZE);
        if (data == NULL) {
            *err = ENOMEM;
            return NULL;
        }
        atomic_fetch_add(&file->reader->memory_in_use, READER_CHUNK_SIZE);
        *slot = (struct slot){.state = SLOT_FETCHING, .chunk = chunk, .data = data};
        pthread_mutex_unlock(&file->lock);
        fetch_chunk(file, slot);
        pthread_mutex_lock(&file->lock);
    }
}

/* A read not in sequence: fetch exactly the bytes asked for. */
static int read_direct(struct reader_file *file, uint64_t offset, size_t size,
                       char *buf, size_t *got)
{
    int err = s3_get_object_range(file->reader->conf.s3, file->key, offset,
                                  size, file->etag, buf, got, NULL);
    if (err == 0 && *got != size)
        err = EIO;
    return err;
}

int reader_read(struct reader_file *file, uint64_t offset, size_t size,
                char *buf, size_t *got)
{
    struct reader *reader = file->reader;
    int err = 0;

    *got = 0;
    if (offset >= file->size || size == 0)
        return 0;
    if (size > file->size - offset)
        size = (size_t)(file->size - offset);

    pthread_mutex_lock(&file->lock);
    uint64_t first_chunk = offset / READER_CHUNK_SIZE;
    uint64_t last_chunk = (offset + size - 1) / READER_CHUNK_SIZE;
    bool sequential = offset == file->next_offset;
    bool cached = find_slot_locked(file, first_chunk) != NULL &&
                  find_slot_locked(file, last_chunk) != NULL;
    if (sequential) {
        /* grow the window each time the reader enters a new chunk */
        uint64_t max_window = file->slot_count - 2;
        if (file->window == 0)
            file->window = 1;
        else if (offset % READER_CHUNK_SIZE < size && file->window < max_window)
            file->window = file->window * 2 > max_window ? (unsigned)max_window
                                                         : file->window * 2;
    } else if (!cached) {
        file->window = 0;
    }
    file->next_offset = offset + size;

    if (file->window == 0 && !cached) {
        pthread_mutex_unlock(&file->lock);
        err = read_direct(file, offset, size, buf, got);
        goto out;
    }
    schedule_read_ahead_locked(file, last_chunk);
    for (uint64_t chunk = first_chunk; chunk <= last_chunk && err == 0; chunk++) {
        struct slot *slot = wait_chunk_locked(file, chunk, &err);
        if (slot == NULL)
            break;
        uint64_t chunk_start = chunk * READER_CHUNK_SIZE;
        uint64_t from = offset + *got - chunk_start;
        size_t take = size - *got;
        if (take > slot->len - from)
            take = (size_t)(slot->len - from);
        memcpy(buf + *got, slot->data + from, take);
        *got += take;
    }
    pthread_mutex_unlock(&file->lock);
out:
    if (err == 0)
        atomic_fetch_add(&reader->bytes_read, *got);
    return err;
}

void reader_close(struct reader_file **filep)
{
    struct reader_file *file = *filep;

    if (file == NULL)
        return;
    pthread_mutex_lock(&file->lock);
    while (file->inflight > 0)
        pthread_cond_wait(&file->chunk_done, &file->lock);
    for (unsigned i = 0; i < file->slot_count; i++)
        if (file->slots[i].state != SLOT_EMPTY)
            release_slot_locked(file, &file->slots[i]);
    pthread_mutex_unlock(&file->lock);
    pthread_mutex_destroy(&file->lock);
    pthread_cond_destroy(&file->chunk_done);
    free(file->key);
    free(file->etag);
    free(file);
    *filep = NULL;
}
