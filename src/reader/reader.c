/*
 * reader.c - reads through the block cache, fetches, read-ahead (see
 * reader.h).
 *
 * In-flight table: reader->lock guards `inflight` (a tsearch tree of the
 * blocks some thread is fetching, by object id and block) and `stopping`;
 * block_done is broadcast whenever blocks leave the table. A thread that
 * misses a block either registers it (with the blocks after it that it
 * will fetch in the same GET) or waits until it leaves the table, then
 * reads the cache again. No lock is held during a GET.
 *
 * reader->lock also guards lookup_fetched: the objects reader_fetch_whole()
 * fetched for a lookup. The first reader_open() of one takes it out and
 * counts its blocks as fetched by that open file, so reading them is
 * neither a cache hit nor a second use that protects them from eviction.
 *
 * A read into a pipe holds each block it splices (cache.h, "Holds") for
 * its caller, who lets go once the answer has left: the blocks spliced
 * first stay in the pipe while a later one is fetched, for seconds
 * maybe, and must not be punched meanwhile.
 *
 * Per file: file->lock guards the sequential-reader state (next_offset,
 * window, last_block, prefetched_to) and the scattered-reader state
 * (random_fetches, scatter_*, claimed_map).
 *
 * A reader that reads a file at scattered places (safetensors, numpy and
 * other loaders map a file and fault in pages in any order) gets no
 * read-ahead from the sequential window, and would pay a request per
 * block. Once it has fetched SCATTER_MIN_FETCHES blocks out of order, and
 * one in SCATTER_DENSITY of the file's blocks (it is reading the file
 * broadly, not sampling it), the file is fetched in file order behind its
 * reads, up to twice max_window blocks ahead of what the cache holds (the
 * reader's own faults no longer need the window), in runs of
 * max_request, each block once, and a fault ahead of the sweep fetches a
 * run too: the faults then find their blocks cached or in flight. Only a
 * file that fits a quarter of the cache is swept so.
 */
#include "config.h"

#include "reader/reader.h"

#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "tier/tier_format.h"

#define INITIAL_WINDOW_BLOCKS 4
#define CLAIMED_RING 128              /* blocks a file remembers fetching */
#define MAX_FETCHES_PER_READ 3
#define LOOKUP_FETCHED_RING 256       /* objects fetched whole, not yet opened */
/* A file read at scattered places (mmap of weights) fetches the rest of
 * itself once its reader has fetched this many blocks out of order, and
 * at least one in SCATTER_DENSITY of its blocks: see scatter_fetch().
 * (With 1 MiB blocks: a file of up to 1 GiB after 8 faults, one of 4 GiB
 * after 32.) */
#define SCATTER_MIN_FETCHES 8
#define SCATTER_DENSITY 128

struct inflight {
    uint64_t id;       /* the cache object */
    uint64_t block;
};

struct reader {
    struct reader_conf conf;
    uint32_t block_size;
    uint64_t max_window;         /* blocks: read_ahead, at most a quarter of
                                    the cache so read-ahead is not evicted
                                    before it is read */
    uint64_t scatter_max_blocks; /* a quarter of the cache: the largest
                                    file a scattered reader fetches whole */
    pthread_mutex_t lock;
    pthread_cond_t block_done;
    void *inflight;              /* tsearch tree of struct inflight * */
    bool stopping;
    uint64_t lookup_fetched[LOOKUP_FETCHED_RING]; /* object ids + 1 that
                                    reader_fetch_whole() filled and no
                                    reader_open() took yet */
    unsigned lookup_fetched_next;
    _Atomic uint64_t bytes_read;
    _Atomic uint64_t blocks_prefetched;
    _Atomic uint64_t direct_bytes;
    _Atomic uint64_t hit_bytes;
};

struct reader_file {
    struct reader *reader;
    struct cache_object *object;
    uint64_t object_id;
    char *key;
    char *etag;                  /* NULL: no If-Match (no ETag known) */
    uint64_t size;

    pthread_mutex_t lock;
    uint64_t next_offset;        /* where a sequential read would start */
    uint64_t window;             /* blocks to keep ahead; 0: random reader */
    uint64_t last_block;         /* block of the previous read, + 1 (0: none) */
    uint64_t prefetched_to;      /* blocks below this were scheduled */
    uint64_t prefetch_end;       /* blocks from here are never prefetched
                                    (0: no limit) */
    uint64_t claimed[CLAIMED_RING]; /* blocks this file fetched, + 1 */
    unsigned claimed_next;
    uint64_t random_fetches;     /* blocks fetched for out-of-order reads */
    bool scatter;                /* the sweep of a scattered reader is on */
    uint64_t scatter_done;       /* blocks below are cached (or were) */
    uint64_t scatter_next;       /* the sweep has scheduled blocks below */
    uint8_t *claimed_map;        /* with scatter: a bit per block fetched
                                    for this file (the ring is too small) */
};

/* ----------------------------------------------------------- in flight */

static int compare_inflight(const void *a, const void *b)
{
    const struct inflight *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->block < y->block ? -1 : x->block > y->block;
}

static bool inflight_has_locked(struct reader *reader, uint64_t id, uint64_t block)
{
    struct inflight probe = {id, block};
    return tfind(&probe, &reader->inflight, compare_inflight) != NULL;
}

static bool inflight_add_locked(struct reader *reader, uint64_t id, uint64_t block)
{
    struct inflight *entry = malloc(sizeof(*entry));

    if (entry == NULL)
        return false;
    *entry = (struct inflight){id, block};
    if (tsearch(entry, &reader->inflight, compare_inflight) == NULL) {
        free(entry);
        return false;
    }
    return true;
}

static void inflight_remove(struct reader *reader, uint64_t id, uint64_t first,
                            uint64_t count)
{
    pthread_mutex_lock(&reader->lock);
    for (uint64_t block = first; block < first + count; block++) {
        struct inflight probe = {id, block};
        void *found = tfind(&probe, &reader->inflight, compare_inflight);
        if (found != NULL) {
            struct inflight *entry = *(struct inflight **)found;
            tdelete(entry, &reader->inflight, compare_inflight);
            free(entry);
        }
    }
    pthread_cond_broadcast(&reader->block_done);
    pthread_mutex_unlock(&reader->lock);
}

/*
 * Register blocks FIRST.. (at most MAX, stopping at one cached or already
 * in flight, or at the end of the object) as fetched by the caller.
 * Returns how many were registered (0: FIRST is in flight already).
 */
static uint64_t claim_run(struct reader_file *file, uint64_t first, uint64_t max)
{
    struct reader *reader = file->reader;
    uint64_t blocks = cache_object_blocks(file->object);
    uint64_t count = 0;

    pthread_mutex_lock(&reader->lock);
    while (count < max && first + count < blocks) {
        uint64_t block = first + count;
        if (inflight_has_locked(reader, file->object_id, block))
            break;
        /* another thread may have just finished it */
        if (cache_block_present(reader->conf.cache, file->object, block))
            break;
        if (!inflight_add_locked(reader, file->object_id, block))
            break;
        count++;
    }
    pthread_mutex_unlock(&reader->lock);
    pthread_mutex_lock(&file->lock);
    for (uint64_t block = first; block < first + count; block++) {
        file->claimed[file->claimed_next] = block + 1;
        file->claimed_next = (file->claimed_next + 1) % CLAIMED_RING;
        if (file->claimed_map != NULL)
            file->claimed_map[block / 8] |= (uint8_t)(1u << (block % 8));
    }
    pthread_mutex_unlock(&file->lock);
    return count;
}

/* Whether this file fetched BLOCK recently (then reading it is not a
 * re-use of cached data). */
static bool claimed_by(struct reader_file *file, uint64_t block)
{
    bool found = false;

    pthread_mutex_lock(&file->lock);
    if (file->claimed_map != NULL)
        found = (file->claimed_map[block / 8] >> (block % 8)) & 1;
    for (unsigned i = 0; i < CLAIMED_RING && !found; i++)
        found = file->claimed[i] == block + 1;
    pthread_mutex_unlock(&file->lock);
    return found;
}

/* ------------------------------------------------------------ fetching */

/* Splits one GET's bytes (or a block from the tier) into consecutive
 * cache blocks, each committed and out of the in-flight table as soon as
 * its last byte is in (and offered to the shared cache tier, if there is
 * one and the bytes did not come from it). */
struct run_sink {
    struct reader_file *file;
    uint64_t block;              /* block being filled */
    uint64_t done_until;         /* blocks below this are committed */
    struct cache_fill *fill;
    uint32_t left;               /* bytes the current block still needs */
    bool from_tier;              /* the bytes are the tier's: not offered */
};

/* RUN's current block, all its bytes written: committed, offered to the
 * tier, out of the in-flight table; RUN moves to the next block. 0 or
 * the cache's errno (then the block stays in flight: the caller removes
 * what it did not commit). */
static int run_sink_commit(struct run_sink *run)
{
    struct reader_file *file = run->file;
    int err = cache_fill_commit(&run->fill);

    if (err != 0)
        return err;
    if (!run->from_tier && file->reader->conf.tier != NULL && file->etag != NULL)
        tier_offer_block(file->reader->conf.tier, file->object, file->key,
                         file->etag, run->block);
    run->block++;
    run->done_until = run->block;
    /* let waiters of finished blocks go as soon as they are in */
    inflight_remove(file->reader, file->object_id, run->block - 1, 1);
    return 0;
}

static int run_sink_write(void *arg, const void *data, size_t len)
{
    struct run_sink *run = arg;
    struct cache *cache = run->file->reader->conf.cache;
    const char *bytes = data;
    int err = 0;

    while (len > 0) {
        if (run->fill == NULL) {
            err = cache_fill_begin(cache, run->file->object, run->block, &run->fill);
            if (err != 0)
                return err;
            run->left = cache_object_block_len(run->file->object, run->block);
        }
        size_t take = len < run->left ? len : run->left;
        err = cache_fill_write(run->fill, bytes, take);
        if (err != 0)
            return err;
        bytes += take;
        len -= take;
        run->left -= (uint32_t)take;
        if (run->left == 0) {
            err = run_sink_commit(run);
            if (err != 0)
                return err;
        }
    }
    return 0;
}

static void log_if_changed(const struct reader_file *file, int err)
{
    if (err == ESTALE)
        log_warn("'%s' changed while open; reopen it to read the new version",
                 file->key);
}

/* DATA, block BLOCK of FILE (LEN bytes, the whole block) from the tier,
 * into the cache through the run sink; the block leaves the in-flight
 * table. 0 or the cache's errno. */
static int fill_block(struct reader_file *file, uint64_t block,
                      const char *data, uint32_t len)
{
    struct run_sink run = {.file = file, .block = block, .done_until = block,
                           .from_tier = true};
    int err;

    if (len != cache_object_block_len(file->object, block))
        return EINVAL;
    err = run_sink_write(&run, data, len);
    cache_fill_abort(&run.fill);
    return err;
}

/*
 * Blocks FIRST.. (at most COUNT, registered in flight) from the shared
 * cache tier into the cache, as long as it has them: how many were
 * filled (each has left the in-flight table). *FETCH gets how many of
 * the blocks after them to fetch from the origin before asking the tier
 * again: a block it does not have is claimed (tier_claim_blocks(), for
 * the rest of the run): when another node's lease covers it, that node
 * is fetching it from the origin, and the block is waited for in the
 * tier instead (and claimed if the lease runs out first); this node
 * fetches what it claimed, up to blocks another node's lease covers. A
 * block the tier holds damaged, or whose request failed, is fetched from
 * the origin by itself (*FETCH is 1): the tier is asked again for the
 * blocks after it. READING_ON: the run is read-ahead (the reader means
 * to go on past it). SCRATCH: block_size + TIER_HEADER_LEN bytes of the
 * caller's, for each block's frame in turn. FILE has an ETag and its
 * reader a tier.
 */
static uint64_t fill_from_tier(struct reader_file *file, uint64_t first,
                               uint64_t count, bool reading_on, char *scratch,
                               uint64_t *fetch)
{
    struct tier *tier = file->reader->conf.tier;
    uint64_t filled = 0, covered = 0;
    double until = 0;
    bool awaiting = false;

    *fetch = count;
    for (; filled < count; filled++) {
        uint64_t block = first + filled;
        uint32_t len = cache_object_block_len(file->object, block);
        const char *data = NULL;
        int err;
        if (awaiting && block <= covered) {
            err = tier_await_block(tier, file->key, file->etag, block, len,
                                   scratch, &data, until);
        } else {
            awaiting = false;
            err = tier_get_block(tier, file->key, file->etag, block, len,
                                 scratch, &data);
        }
        /* not there: claimed, or waited for where another node's lease
         * covers it. A lease that ran out without the block (its node's
         * write failed, or the node went) is claimed in turn, so that this
         * node takes the group over and the nodes still waiting wait for
         * it: fetching the rest of the run without a lease sent it to the
         * origin once per waiting node. Twice at most; then the block
         * alone is fetched. */
        for (int claims = 0; err == ENOENT && claims < 2; claims++) {
            uint64_t last = first + count - 1;
            if (tier_claim_blocks(tier, file->key, file->etag, block, last,
                                  reading_on, &covered,
                                  &until) == TIER_FETCH) {
                *fetch = covered - block + 1;
                return filled;
            }
            awaiting = true;
            err = tier_await_block(tier, file->key, file->etag, block, len,
                                   scratch, &data, until);
        }
        if (err != 0) {
            /* one damaged block, one request that failed (a busy tier's
             * timeout does not skip it), or one whose lease ran out
             * twice, says nothing of the blocks after it: they stay the
             * tier's to serve (a tier skipped from now answers ENOENT at
             * once, and the rest of the run goes in one GET) */
            *fetch = 1;
            break;
        }
        err = fill_block(file, block, data, len);
        if (err != 0) {
            *fetch = count - filled;
            break;
        }
    }
    return filled;
}

/* Blocks FIRST..FIRST+COUNT-1 (registered in flight) with one GET from
 * the bucket; every one leaves the in-flight table, fetched or not.
 * *DONE_UNTIL gets the block below which all were committed. */
static int fetch_from_origin(struct reader_file *file, uint64_t first,
                             uint64_t count, struct s3_object_info *info,
                             uint64_t *done_until)
{
    struct reader *reader = file->reader;
    uint64_t offset = first * reader->block_size;
    uint64_t end = (first + count) * reader->block_size;

    if (end > file->size)
        end = file->size;
    struct run_sink run = {.file = file, .block = first, .done_until = first};
    struct s3_sink sink = {run_sink_write, &run};
    int err = s3_get_object_stream(reader->conf.s3, file->key, offset,
                                   end - offset, file->etag, &sink, NULL, info);
    cache_fill_abort(&run.fill);
    inflight_remove(reader, file->object_id, run.done_until,
                    first + count - run.done_until);
    *done_until = run.done_until;
    return err;
}

/* Blocks FIRST..FIRST+COUNT-1 (registered in flight by the caller) into
 * the cache: from the shared cache tier while it has them, the others
 * with a GET from the bucket each time the tier has not; every one
 * leaves the in-flight table, fetched or not. INFO (may be NULL)
 * receives the object's headers (then the tier is not asked: only the
 * bucket has them); STORED (may be NULL) the bytes committed to the
 * cache, also when a GET failed part way. READING_ON: the run is
 * read-ahead or warming (more of the file is to come). */
static int fetch_run_counted(struct reader_file *file, uint64_t first,
                             uint64_t count, struct s3_object_info *info,
                             uint64_t *stored, bool reading_on)
{
    uint32_t block_size = file->reader->block_size;
    uint64_t end = first + count;
    uint64_t done = first;        /* blocks below are in the cache */
    char *scratch = NULL;         /* a tier block's frame: one for the run,
                                     which may go to the tier many times */
    int err = 0;

    if (info == NULL && file->reader->conf.tier != NULL && file->etag != NULL)
        scratch = malloc((size_t)block_size + TIER_HEADER_LEN);
    while (done < end) {
        uint64_t fetch = end - done;
        if (scratch != NULL)
            done += fill_from_tier(file, done, end - done, reading_on, scratch,
                                   &fetch);
        if (done == end)
            break;
        uint64_t done_until = done;
        err = fetch_from_origin(file, done, fetch, info, &done_until);
        if (err != 0 && done + fetch < end)
            inflight_remove(file->reader, file->object_id, done + fetch,
                            end - (done + fetch));
        /* blocks this node may have leased and will not bring: the
         * nodes waiting for them claim them now, not when the lease ends */
        if (err != 0 && scratch != NULL)
            tier_forgo_blocks(file->reader->conf.tier, file->key, file->etag,
                              done_until, done + fetch - done_until);
        done = err == 0 ? done + fetch : done_until;
        if (err != 0)
            break;
    }
    if (stored != NULL) {
        uint64_t stored_end = done * block_size;
        *stored = (stored_end < file->size ? stored_end : file->size) -
                  first * block_size;
    }
    free(scratch);
    return err;
}

static int fetch_run(struct reader_file *file, uint64_t first, uint64_t count,
                     struct s3_object_info *info)
{
    return fetch_run_counted(file, first, count, info, NULL, false);
}

struct prefetch_job {
    struct reader_file *file;    /* a private copy: outlives the open file */
    uint64_t first;
    uint64_t count;
};

static void prefetch_job_main(void *arg)
{
    struct prefetch_job *job = arg;
    struct reader *reader = job->file->reader;

    pthread_mutex_lock(&reader->lock);
    bool stopping = reader->stopping;
    pthread_mutex_unlock(&reader->lock);
    if (stopping)
        inflight_remove(reader, job->file->object_id, job->first, job->count);
    else
        log_if_changed(job->file, fetch_run_counted(job->file, job->first,
                                                    job->count, NULL, NULL,
                                                    true));
    reader_close(&job->file);
    free(job);
}

/* A copy of FILE for a background job: the same cache object (another
 * reference), so the job fills exactly the version and id it claimed. */
static struct reader_file *file_clone(struct reader_file *file)
{
    struct reader_file *copy = calloc(1, sizeof(*copy));

    if (copy == NULL)
        return NULL;
    copy->reader = file->reader;
    copy->size = file->size;
    copy->object_id = file->object_id;
    copy->key = strdup(file->key);
    copy->etag = file->etag ? strdup(file->etag) : NULL;
    pthread_mutex_init(&copy->lock, NULL);
    if (copy->key == NULL || (file->etag != NULL && copy->etag == NULL)) {
        reader_close(&copy);
        return NULL;
    }
    copy->object = cache_object_ref(file->reader->conf.cache, file->object);
    return copy;
}

/* Make sure blocks up to UNTIL (exclusive) are cached or being fetched,
 * in runs of up to max_request on the worker pool. */
static void schedule_read_ahead(struct reader_file *file, uint64_t from,
                                uint64_t until)
{
    struct reader *reader = file->reader;
    uint64_t run_max = reader->conf.max_request / reader->block_size;
    uint64_t blocks = cache_object_blocks(file->object);

    if (run_max == 0)
        run_max = 1;
    if (until > blocks)
        until = blocks;
    for (uint64_t block = from; block < until;) {
        if (cache_block_present(reader->conf.cache, file->object, block)) {
            block++;
            continue;
        }
        uint64_t count = claim_run(file, block, until - block < run_max
                                                    ? until - block : run_max);
        if (count == 0) { /* someone else is on it */
            block++;
            continue;
        }
        struct prefetch_job *job = malloc(sizeof(*job));
        struct reader_file *copy = job ? file_clone(file) : NULL;
        if (copy != NULL)
            *job = (struct prefetch_job){copy, block, count};
        if (copy == NULL || workers_submit(reader->conf.workers,
                                           prefetch_job_main, job) != 0) {
            inflight_remove(reader, file->object_id, block, count);
            reader_close(&copy);
            free(job);
            return;
        }
        atomic_fetch_add(&reader->blocks_prefetched, count);
        block += count;
    }
}

/* ------------------------------------------------------------- reading */

/* Where a read's bytes go: a buffer, or (buf NULL) a pipe, with the
 * blocks it holds pages of in holds. */
struct read_target {
    char *buf;
    int pipe_write;
    struct cache_holds *holds;
};

/* The bytes of one block, from the cache, fetching the block when it is
 * missing (or waiting for whoever fetches it), into TO->buf + AT or the
 * pipe of TO. Adds LEN to *HITS when the bytes were in the cache already
 * (the caller counts them once the whole read is answered). */
static int read_block(struct reader_file *file, uint64_t block, uint32_t offset,
                      uint32_t len, const struct read_target *to, size_t at,
                      bool first_touch, uint64_t *hits)
{
    struct reader *reader = file->reader;
    unsigned fetches = 0;

    for (;;) {
        bool fetched_here = claimed_by(file, block);
        bool reuse = first_touch && !fetched_here;
        int err = to->buf != NULL
                      ? cache_block_read(reader->conf.cache, file->object, block,
                                         offset, len, to->buf + at, reuse)
                      : cache_block_splice(reader->conf.cache, file->object, block,
                                           offset, len, to->pipe_write, reuse,
                                           to->holds);
        if (err == 0 && !fetched_here)
            *hits += len;
        if (err != ENOENT)
            return err;
        pthread_mutex_lock(&reader->lock);
        bool waiting = false;
        while (inflight_has_locked(reader, file->object_id, block)) {
            waiting = true;
            pthread_cond_wait(&reader->block_done, &reader->lock);
        }
        pthread_mutex_unlock(&reader->lock);
        if (waiting)
            continue; /* fetched by another thread: read the cache again */
        /* a swept file is fetched whole anyway: a miss ahead of the sweep
         * takes a run (same wait, up to max_request more of the file) */
        pthread_mutex_lock(&file->lock);
        uint64_t want = file->scatter ? reader->conf.max_request / reader->block_size
                                      : 1;
        pthread_mutex_unlock(&file->lock);
        uint64_t claimed = claim_run(file, block, want > 0 ? want : 1);
        if (claimed == 0)
            continue; /* another thread claimed or finished it just now */
        err = fetch_run(file, block, claimed, NULL);
        log_if_changed(file, err);
        if (err != 0)
            return err;
        pthread_mutex_lock(&file->lock);
        if (file->window == 0)
            file->random_fetches++;
        pthread_mutex_unlock(&file->lock);
        /* evicted again before we could read it (a cache far too small
         * for the readers at work): the caller reads around the cache */
        if (++fetches == MAX_FETCHES_PER_READ)
            return ENOSPC;
    }
}

/* The cache cannot hold more (its disk is full of other data): read the
 * bytes straight from the bucket. */
static int read_direct(struct reader_file *file, uint64_t offset, size_t size,
                       char *buf, size_t *got)
{
    int err = s3_get_object_range(file->reader->conf.s3, file->key, offset,
                                  size, file->etag, buf, got, NULL);
    if (err == 0 && *got != size)
        err = EIO;
    if (err == 0)
        atomic_fetch_add(&file->reader->direct_bytes, size);
    return err;
}

/* Update the sequential-reader state for a read of [OFFSET, OFFSET+SIZE)
 * and return the block after which read-ahead should reach, or 0. */
static uint64_t note_read(struct reader_file *file, uint64_t offset, size_t size,
                          uint64_t *from)
{
    struct reader *reader = file->reader;
    uint64_t block_size = reader->block_size;
    uint64_t max_window = reader->max_window;
    uint64_t last_block = (offset + size - 1) / block_size;
    uint64_t until = 0;

    pthread_mutex_lock(&file->lock);
    /* the kernel may send the reads of one stream slightly out of order */
    bool sequential = offset <= file->next_offset + block_size &&
                      offset + block_size >= file->next_offset &&
                      file->last_block != 0;
    if (!sequential) {
        file->window = 0;
        file->prefetched_to = 0;
    } else if (max_window > 0 && last_block + 1 != file->last_block) {
        /* entering a new block: grow the window */
        if (file->window == 0)
            file->window = INITIAL_WINDOW_BLOCKS < max_window
                               ? INITIAL_WINDOW_BLOCKS : max_window;
        else if (file->window * 2 <= max_window)
            file->window *= 2;
        else
            file->window = max_window;
    }
    if (offset + size > file->next_offset || !sequential)
        file->next_offset = offset + size;
    file->last_block = last_block + 1;
    /* refill when half the window is used, so GETs stay large */
    if (file->window > 0 && last_block + 1 + file->window / 2 >= file->prefetched_to) {
        *from = last_block + 1 > file->prefetched_to ? last_block + 1
                                                     : file->prefetched_to;
        until = last_block + 1 + file->window;
        if (file->prefetch_end != 0 && until > file->prefetch_end)
            until = file->prefetch_end;
        if (until <= *from)
            until = 0;
        else
            file->prefetched_to = until;
    }
    pthread_mutex_unlock(&file->lock);
    return until;
}

/* A scattered reader (see the top of this file): once it qualifies, keep
 * up to twice max_window blocks (at most a quarter of the cache) of the
 * sweep scheduled ahead of what the cache holds, from the start of the
 * file to its end. */
static void scatter_fetch(struct reader_file *file)
{
    struct reader *reader = file->reader;
    uint64_t blocks = cache_object_blocks(file->object);
    uint64_t budget = 2 * reader->max_window < reader->scatter_max_blocks
                          ? 2 * reader->max_window : reader->scatter_max_blocks;
    uint64_t from = 0, until = 0;

    pthread_mutex_lock(&file->lock);
    if (!file->scatter) {
        if (budget == 0 || file->window != 0 || blocks > reader->scatter_max_blocks ||
            file->random_fetches < SCATTER_MIN_FETCHES ||
            file->random_fetches * SCATTER_DENSITY < blocks ||
            (file->claimed_map = calloc((blocks + 7) / 8, 1)) == NULL) {
            pthread_mutex_unlock(&file->lock);
            return;
        }
        file->scatter = true;
        /* (what the ring holds goes on being this file's) */
        for (unsigned i = 0; i < CLAIMED_RING; i++)
            if (file->claimed[i] != 0 && file->claimed[i] - 1 < blocks)
                file->claimed_map[(file->claimed[i] - 1) / 8] |=
                    (uint8_t)(1u << ((file->claimed[i] - 1) % 8));
        log_debug("'%s' is read at scattered places: fetching the rest of "
                  "it behind the reads", file->key);
    }
    while (file->scatter_done < file->scatter_next &&
           cache_block_present(reader->conf.cache, file->object, file->scatter_done))
        file->scatter_done++;
    uint64_t end = file->prefetch_end != 0 && file->prefetch_end < blocks
                       ? file->prefetch_end : blocks;
    if (file->scatter_next < end &&
        file->scatter_next - file->scatter_done <= budget / 2) {
        from = file->scatter_next;
        until = from + budget - (file->scatter_next - file->scatter_done);
        if (until > end)
            until = end;
        file->scatter_next = until;
    }
    pthread_mutex_unlock(&file->lock);
    if (until > from)
        schedule_read_ahead(file, from, until);
}

static int read_into(struct reader_file *file, uint64_t offset, size_t size,
                     const struct read_target *to, size_t *got)
{
    struct reader *reader = file->reader;
    uint64_t block_size = reader->block_size;
    uint64_t from = 0, hits = 0;
    int err = 0;

    *got = 0;
    if (offset >= file->size || size == 0)
        return 0;
    if (size > file->size - offset)
        size = (size_t)(file->size - offset);

    if (file->object == NULL) { /* not cached: see reader_open() */
        if (to->buf == NULL)
            return EOPNOTSUPP;
        err = read_direct(file, offset, size, to->buf, got);
        if (err == 0)
            atomic_fetch_add(&reader->bytes_read, *got);
        return err;
    }
    pthread_mutex_lock(&file->lock);
    uint64_t previous_block = file->last_block;
    pthread_mutex_unlock(&file->lock);
    uint64_t until = note_read(file, offset, size, &from);
    if (until > 0)
        schedule_read_ahead(file, from, until);
    else
        scatter_fetch(file);

    while (*got < size) {
        uint64_t at = offset + *got;
        uint64_t block = at / block_size;
        uint32_t in_block = (uint32_t)(at % block_size);
        uint32_t len = (uint32_t)(block_size - in_block);
        if (len > size - *got)
            len = (uint32_t)(size - *got);
        err = read_block(file, block, in_block, len, to, *got,
                         block + 1 != previous_block, &hits);
        if (err == ENOSPC && to->buf != NULL) {
            size_t direct = 0;
            err = read_direct(file, at, size - *got, to->buf + *got, &direct);
            if (err == 0)
                *got += direct;
            break;
        }
        if (err != 0)
            break;
        *got += len;
        previous_block = block + 1;
    }
    /* (a read into a pipe that fails part way is read again into memory:
     * its bytes count then, once) */
    if (err == 0) {
        atomic_fetch_add(&reader->bytes_read, *got);
        atomic_fetch_add(&reader->hit_bytes, hits);
    }
    return err;
}

int reader_read(struct reader_file *file, uint64_t offset, size_t size,
                char *buf, size_t *got)
{
    struct read_target to = {.buf = buf, .pipe_write = -1};
    return read_into(file, offset, size, &to, got);
}

int reader_read_pipe(struct reader_file *file, uint64_t offset, size_t size,
                     int pipe_write, struct cache_holds *holds, size_t *got)
{
    struct read_target to = {NULL, pipe_write, holds};
    return read_into(file, offset, size, &to, got);
}

/* ----------------------------------------------------------- lifecycle */

int reader_create(const struct reader_conf *conf, struct reader **out)
{
    struct reader *reader = calloc(1, sizeof(*reader));

    *out = reader;
    if (reader == NULL)
        return ENOMEM;
    reader->conf = *conf;
    reader->block_size = cache_block_size(conf->cache);
    struct cache_stats stats;
    cache_get_stats(conf->cache, &stats);
    uint64_t window_bytes = conf->read_ahead;
    if (window_bytes > stats.size_limit / 4)
        window_bytes = stats.size_limit / 4;
    reader->max_window = window_bytes / reader->block_size;
    reader->scatter_max_blocks = stats.size_limit / 4 / reader->block_size;
    pthread_mutex_init(&reader->lock, NULL);
    pthread_cond_init(&reader->block_done, NULL);
    return 0;
}

void reader_stop(struct reader *reader)
{
    pthread_mutex_lock(&reader->lock);
    reader->stopping = true;
    pthread_mutex_unlock(&reader->lock);
}

void reader_destroy(struct reader **readerp)
{
    struct reader *reader = *readerp;

    if (reader == NULL)
        return;
    tdestroy(reader->inflight, free);
    pthread_mutex_destroy(&reader->lock);
    pthread_cond_destroy(&reader->block_done);
    free(reader);
    *readerp = NULL;
}

void reader_get_stats(struct reader *reader, struct reader_stats *out)
{
    out->bytes_read = atomic_load(&reader->bytes_read);
    out->blocks_prefetched = atomic_load(&reader->blocks_prefetched);
    out->direct_bytes = atomic_load(&reader->direct_bytes);
    out->hit_bytes = atomic_load(&reader->hit_bytes);
}

void reader_limit_prefetch(struct reader_file *file, uint64_t end)
{
    uint64_t block_size = file->reader->block_size;

    pthread_mutex_lock(&file->lock);
    file->prefetch_end = end == 0 ? 0 : (end + block_size - 1) / block_size;
    pthread_mutex_unlock(&file->lock);
}

/* If a lookup fetched FILE's object, its blocks count as fetched by
 * FILE (see the top of the file). */
static void take_lookup_fetched(struct reader_file *file)
{
    struct reader *reader = file->reader;
    bool found = false;

    pthread_mutex_lock(&reader->lock);
    for (unsigned i = 0; i < LOOKUP_FETCHED_RING && !found; i++) {
        if (reader->lookup_fetched[i] == file->object_id + 1) {
            reader->lookup_fetched[i] = 0;
            found = true;
        }
    }
    pthread_mutex_unlock(&reader->lock);
    if (!found)
        return;
    uint64_t blocks = cache_object_blocks(file->object);
    pthread_mutex_lock(&file->lock);
    for (uint64_t block = 0; block < blocks && block < CLAIMED_RING; block++) {
        file->claimed[file->claimed_next] = block + 1;
        file->claimed_next = (file->claimed_next + 1) % CLAIMED_RING;
    }
    pthread_mutex_unlock(&file->lock);
}

int reader_open(struct reader *reader, const char *key, const char *etag,
                uint64_t size, struct reader_file **out)
{
    struct reader_file *file = calloc(1, sizeof(*file));
    int err = 0;

    *out = NULL;
    if (file == NULL)
        return ENOMEM;
    file->reader = reader;
    file->size = size;
    file->key = strdup(key);
    file->etag = etag[0] != '\0' ? strdup(etag) : NULL;
    pthread_mutex_init(&file->lock, NULL);
    if (file->key == NULL || (etag[0] != '\0' && file->etag == NULL)) {
        err = ENOMEM;
        goto out;
    }
    /* Without an ETag a changed object could not be told from the cached
     * one; an empty object has nothing to cache; and a cache that cannot
     * take the object (its disk or index full) must not stop the read:
     * such files are read straight from the bucket. */
    if (etag[0] != '\0' && size > 0) {
        int cache_err = cache_object_open(reader->conf.cache, key, etag, size,
                                          &file->object);
        if (cache_err == 0) {
            file->object_id = cache_object_id(file->object);
            take_lookup_fetched(file);
        }
        else if (cache_err != ENOMEM)
            log_warn("cache: cannot cache '%s' (%s); reading it directly",
                     key, strerror(cache_err));
        else
            err = ENOMEM;
    }
out:
    if (err != 0)
        reader_close(&file);
    *out = file;
    return err;
}

int reader_fetch_whole(struct reader *reader, const char *key, const char *etag,
                       uint64_t size, struct s3_object_info *info)
{
    struct reader_file *file = NULL;
    int err = 0;

    if (etag[0] == '\0' || size == 0)
        return EINVAL;
    err = reader_open(reader, key, etag, size, &file);
    if (err != 0)
        return err;
    uint64_t blocks = file->object ? cache_object_blocks(file->object) : 0;
    uint64_t run_max = reader->conf.max_request / reader->block_size;
    if (file->object == NULL || blocks > (run_max ? run_max : 1)) {
        err = ENOSPC; /* not cached, or more than one GET */
        goto out;
    }
    uint64_t claimed = claim_run(file, 0, blocks);
    if (claimed < blocks) {
        /* some of it is cached or being fetched: a HEAD is cheaper */
        inflight_remove(reader, file->object_id, 0, claimed);
        err = EEXIST;
        goto out;
    }
    err = fetch_run(file, 0, blocks, info);
    if (err == 0 && strcmp(info->etag, etag) != 0)
        err = ESTALE; /* a server that ignored If-Match */
    if (err == 0) {
        pthread_mutex_lock(&reader->lock);
        reader->lookup_fetched[reader->lookup_fetched_next] = file->object_id + 1;
        reader->lookup_fetched_next = (reader->lookup_fetched_next + 1) %
                                      LOOKUP_FETCHED_RING;
        pthread_mutex_unlock(&reader->lock);
    }
out:
    reader_close(&file);
    return err;
}

void reader_close(struct reader_file **filep)
{
    struct reader_file *file = *filep;

    if (file == NULL)
        return;
    cache_object_close(file->reader->conf.cache, &file->object);
    pthread_mutex_destroy(&file->lock);
    free(file->claimed_map);
    free(file->key);
    free(file->etag);
    free(file);
    *filep = NULL;
}

/* ------------------------------------------------------------- warming */

/* One reader_warm() call and its GETs on the worker pool. The call and
 * each job hold a reference; the last one frees it, so a call that
 * returns early (interrupted) leaves its jobs to finish on their own. */
struct warm_batch {
    pthread_mutex_t lock;
    pthread_cond_t job_done;     /* a job ended (running went down) */
    unsigned refs;
    unsigned running;            /* jobs submitted and not ended */
    uint64_t fetched;            /* bytes the jobs committed */
    int err;                     /* the first job's errno */
};

struct warm_job {
    struct warm_batch *batch;
    struct reader_file *file;    /* a private copy (file_clone) */
    uint64_t first;
    uint64_t count;
};

static void warm_batch_put(struct warm_batch *batch)
{
    pthread_mutex_lock(&batch->lock);
    bool last = --batch->refs == 0;
    pthread_mutex_unlock(&batch->lock);
    if (!last)
        return;
    pthread_mutex_destroy(&batch->lock);
    pthread_cond_destroy(&batch->job_done);
    free(batch);
}

static void warm_job_main(void *arg)
{
    struct warm_job *job = arg;
    struct reader *reader = job->file->reader;
    struct warm_batch *batch = job->batch;
    uint64_t stored = 0;
    int err;

    pthread_mutex_lock(&reader->lock);
    bool stopping = reader->stopping;
    pthread_mutex_unlock(&reader->lock);
    if (stopping) {
        inflight_remove(reader, job->file->object_id, job->first, job->count);
        err = ECANCELED;
    } else {
        err = fetch_run_counted(job->file, job->first, job->count, NULL,
                                &stored, true);
        log_if_changed(job->file, err);
    }
    pthread_mutex_lock(&batch->lock);
    batch->fetched += stored;
    if (err != 0 && batch->err == 0)
        batch->err = err;
    batch->running--;
    pthread_cond_broadcast(&batch->job_done);
    pthread_mutex_unlock(&batch->lock);
    reader_close(&job->file);
    warm_batch_put(batch);
    free(job);
}

static bool warm_stopped(struct reader *reader, const atomic_bool *stop)
{
    if (stop != NULL && atomic_load(stop))
        return true;
    pthread_mutex_lock(&reader->lock);
    bool stopping = reader->stopping;
    pthread_mutex_unlock(&reader->lock);
    return stopping;
}

/* Wait on BATCH (its lock held) for a job to end, or WARM_POLL_MS: the
 * caller looks at its stop flag between waits. */
#define WARM_POLL_MS 100

/* WARM_POLL_MS from now on the wall clock (block_done and job_done
 * wait on CLOCK_REALTIME, the default). */
static struct timespec warm_poll_deadline(void)
{
    struct timespec until = clock_wall_now();
    until.tv_nsec += WARM_POLL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return until;
}
static void warm_batch_wait_locked(struct warm_batch *batch)
{
    struct timespec until = warm_poll_deadline();
    pthread_cond_timedwait(&batch->job_done, &batch->lock, &until);
}

/* Wait (polling STOP) until no block of FILE's object is in flight: the
 * blocks another reader was fetching when the warm passed them. */
static void warm_wait_inflight(struct reader_file *file, const atomic_bool *stop)
{
    struct reader *reader = file->reader;
    uint64_t blocks = cache_object_blocks(file->object);

    for (uint64_t block = 0; block < blocks && !warm_stopped(reader, stop);) {
        pthread_mutex_lock(&reader->lock);
        bool busy = inflight_has_locked(reader, file->object_id, block);
        if (busy) {
            struct timespec until = warm_poll_deadline();
            pthread_cond_timedwait(&reader->block_done, &reader->lock, &until);
        }
        pthread_mutex_unlock(&reader->lock);
        if (!busy)
            block++;
    }
}

/* One pass over FILE's blocks: every missing one claimed and fetched in
 * runs on the pool, at most PARALLEL at once. */
static void warm_pass(struct reader_file *file, unsigned parallel,
                      const atomic_bool *stop, struct warm_batch *batch)
{
    struct reader *reader = file->reader;
    uint64_t run_max = reader->conf.max_request / reader->block_size;
    uint64_t blocks = cache_object_blocks(file->object);

    if (run_max == 0)
        run_max = 1;
    for (uint64_t block = 0; block < blocks;) {
        pthread_mutex_lock(&batch->lock);
        while (batch->running >= parallel && batch->err == 0 &&
               !warm_stopped(reader, stop))
            warm_batch_wait_locked(batch);
        bool failed = batch->err != 0;
        pthread_mutex_unlock(&batch->lock);
        if (failed || warm_stopped(reader, stop))
            return;
        if (cache_block_present(reader->conf.cache, file->object, block)) {
            block++;
            continue;
        }
        uint64_t count = claim_run(file, block, blocks - block < run_max
                                                    ? blocks - block : run_max);
        if (count == 0) { /* another reader is fetching it */
            block++;
            continue;
        }
        struct warm_job *job = malloc(sizeof(*job));
        struct reader_file *copy = job != NULL ? file_clone(file) : NULL;
        if (copy != NULL) {
            *job = (struct warm_job){batch, copy, block, count};
            pthread_mutex_lock(&batch->lock);
            batch->refs++;
            batch->running++;
            pthread_mutex_unlock(&batch->lock);
        }
        if (copy == NULL || workers_submit(reader->conf.workers, warm_job_main,
                                           job) != 0) {
            inflight_remove(reader, file->object_id, block, count);
            pthread_mutex_lock(&batch->lock);
            if (copy != NULL) {
                batch->refs--;
                batch->running--;
            }
            if (batch->err == 0)
                batch->err = ENOMEM;
            pthread_mutex_unlock(&batch->lock);
            reader_close(&copy);
            free(job);
            return;
        }
        block += count;
    }
}

int reader_warm(struct reader *reader, const char *key, const char *etag,
                uint64_t size, unsigned parallel, const atomic_bool *stop,
                struct reader_warm_result *out)
{
    struct reader_file *file = NULL;
    struct warm_batch *batch = NULL;
    int err;

    *out = (struct reader_warm_result){0};
    if (etag[0] == '\0' || size == 0)
        return 0; /* nothing that could be cached */
    err = reader_open(reader, key, etag, size, &file);
    if (err != 0)
        return err;
    if (file->object == NULL) {
        err = ENOSPC; /* the cache cannot take it (logged by reader_open) */
        goto out;
    }
    err = cache_object_cached_bytes(reader->conf.cache, file->object,
                                    &out->cached_before);
    if (err != 0)
        goto out;
    batch = calloc(1, sizeof(*batch));
    if (batch == NULL) {
        err = ENOMEM;
        goto out;
    }
    pthread_mutex_init(&batch->lock, NULL);
    pthread_cond_init(&batch->job_done, NULL);
    batch->refs = 1;
    if (parallel == 0)
        parallel = 1;
    /* One pass: a block evicted again before the end (a file larger
     * than the cache) is not fetched twice; the answer's `cached` tells.
     * Blocks another reader was fetching are waited for, and counted if
     * that fetch succeeded. */
    warm_pass(file, parallel, stop, batch);
    pthread_mutex_lock(&batch->lock);
    while (batch->running > 0 && !warm_stopped(reader, stop))
        warm_batch_wait_locked(batch);
    bool failed = batch->err != 0;
    pthread_mutex_unlock(&batch->lock);
    if (!failed)
        warm_wait_inflight(file, stop);
    pthread_mutex_lock(&batch->lock);
    out->fetched = batch->fetched;
    err = batch->err;
    pthread_mutex_unlock(&batch->lock);
    if (err == 0 && warm_stopped(reader, stop))
        err = EINTR;
    int sum_err = cache_object_cached_bytes(reader->conf.cache, file->object,
                                            &out->cached);
    if (err == 0)
        err = sum_err;
out:
    if (batch != NULL)
        warm_batch_put(batch);
    reader_close(&file);
    return err;
}
