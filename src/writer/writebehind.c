/*
 * writebehind.c - uploading a large file while it is still being written
 * (see writebehind.h).
 *
 * Each part is IDLE (not sent, or sent with bytes since changed), SENDING
 * (a job on the worker pool reads it from the fd and uploads it) or SENT
 * (the server has it, with the ETag recorded). A change to a SENDING part
 * marks it stale: when its job ends it goes back to IDLE instead of SENT.
 * In the background only whole parts ending `lag` bytes or more before
 * `ready` are sent; a part whose background send failed (even once
 * finish() has begun) is left for finish(); finish() sends every part of
 * the final size, the last one possibly short, and fails if one of its
 * own sends fails.
 *
 * The lag: writers that are sequential but for going back a little to
 * patch what they wrote (Python's zipfile fills in each member's header
 * once the member is written) would make parts stale over and over. So
 * parts are held back two parts' worth behind the writer, and each time a
 * write lands in a part already sent, the lag grows to twice the distance
 * that write went back (up to LAG_MAX): such a writer pays once, then
 * its patches land in parts not sent yet.
 *
 * Locks: wb.lock guards everything but the immutable fields (conf, key,
 * upload_id, fd, base); it is never held during a request. part_done is
 * broadcast whenever a job ends. first_idle is a hint: no part below it
 * is IDLE, so scans for work start there (a writer's sequential progress
 * costs O(1) per write, not a scan of every part).
 */
#include "config.h"

#include "writer/writebehind.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define PARTS_PER_TIER 1000u
#define MIN_BASE UPLOAD_MIN_PART_SIZE
#define MAX_BASE (8ull << 20)  /* tier 9 parts stay under S3's 5 GiB */
#define LAG_MAX (1ull << 30)

enum part_state { PART_IDLE, PART_SENDING, PART_SENT };

struct wb_part {
    unsigned char state;
    bool stale;                 /* changed while SENDING */
    bool failed;                /* the background send failed */
    char etag[S3_ETAG_MAX];
};

struct writebehind {
    const struct upload_conf *conf;
    char *key;
    char *upload_id;
    int fd;
    uint64_t base;

    pthread_mutex_t lock;
    pthread_cond_t part_done;
    struct wb_part *parts;      /* [0, capacity) */
    unsigned capacity;
    unsigned first_idle;
    unsigned in_flight;
    uint64_t ready;             /* bytes the writer is done with */
    uint64_t lag;               /* parts end this far before ready */
    bool finishing;             /* finish(): send everything up to size */
    bool stopping;              /* abandon(), or the upload is lost */
    int lost_err;               /* the server no longer has the upload */
    uint64_t size;              /* finishing: the final size */
    int first_err;              /* finishing: the first failure */
};

struct part_job {
    struct writebehind *wb;
    unsigned index;
    uint64_t offset, length;
    bool final;                 /* queued by finish(): no second chance */
};

/* ------------------------------------------------------------- layout */

static uint64_t clamp_base(uint64_t base)
{
    return base < MIN_BASE ? MIN_BASE : base > MAX_BASE ? MAX_BASE : base;
}

void writebehind_part_range(unsigned index, uint64_t base, uint64_t *offset,
                            uint64_t *length)
{
    unsigned tier = index / PARTS_PER_TIER;
    uint64_t part = base << tier;

    /* tiers before this one: PARTS_PER_TIER * base * (2^tier - 1) bytes */
    *offset = PARTS_PER_TIER * base * ((1ull << tier) - 1) +
              (uint64_t)(index % PARTS_PER_TIER) * part;
    *length = part;
}

uint64_t writebehind_capacity(uint64_t base)
{
    uint64_t offset, length;

    writebehind_part_range(UPLOAD_MAX_PARTS - 1, clamp_base(base), &offset,
                           &length);
    return offset + length;
}

/* The part holding byte OFFSET. */
static unsigned part_index(uint64_t offset, uint64_t base)
{
    uint64_t tier_start = 0;

    for (unsigned tier = 0;; tier++) {
        uint64_t part = base << tier;
        uint64_t tier_bytes = PARTS_PER_TIER * part;
        if (offset - tier_start < tier_bytes || tier >= 20)
            return tier * PARTS_PER_TIER +
                   (unsigned)((offset - tier_start) / part);
        tier_start += tier_bytes;
    }
}

/* ------------------------------------------------------------- parts */

/* Make room for parts up to INDEX; false when out of memory. Lock held. */
static bool grow_locked(struct writebehind *wb, unsigned index)
{
    if (index < wb->capacity)
        return true;
    unsigned capacity = wb->capacity ? wb->capacity : 64;
    while (capacity <= index)
        capacity *= 2;
    if (capacity > UPLOAD_MAX_PARTS)
        capacity = UPLOAD_MAX_PARTS;
    struct wb_part *parts = realloc(wb->parts, capacity * sizeof(*parts));
    if (parts == NULL)
        return false;
    memset(parts + wb->capacity, 0,
           (capacity - wb->capacity) * sizeof(*parts));
    wb->parts = parts;
    wb->capacity = capacity;
    return true;
}

/* Parts overlapping [OFFSET, END) no longer hold what was sent; returns
 * whether any of them was sent or being sent. Lock held. */
static bool invalidate_locked(struct writebehind *wb, uint64_t offset,
                              uint64_t end)
{
    bool hit = false;

    if (end <= offset)
        return false;
    unsigned first = part_index(offset, wb->base);
    for (unsigned i = first; i < wb->capacity; i++) {
        uint64_t part_offset, part_length;
        writebehind_part_range(i, wb->base, &part_offset, &part_length);
        if (part_offset >= end)
            break;
        struct wb_part *part = &wb->parts[i];
        if (part->state == PART_SENDING) {
            part->stale = true;
            hit = true;
        } else if (part->state == PART_SENT) {
            part->state = PART_IDLE;
            hit = true;
        }
    }
    if (first < wb->first_idle)
        wb->first_idle = first;
    return hit;
}

/* finish() fails with ERR, unless it failed already; in the background a
 * failure only leaves parts for finish(). Lock held. */
static void fail_locked(struct writebehind *wb, int err)
{
    if (wb->finishing && wb->first_err == 0)
        wb->first_err = err;
}

static void part_job_run(void *arg);

/* Queue the parts that may be sent now, up to conf->parallel in flight.
 * Lock held. */
static void kick_locked(struct writebehind *wb)
{
    unsigned parallel = wb->conf->parallel > 0 ? wb->conf->parallel : 1;
    uint64_t limit = wb->finishing ? wb->size
                     : wb->ready > wb->lag ? wb->ready - wb->lag : 0;
    bool all_before = true; /* every part below i is SENDING or SENT */

    if (wb->stopping || (wb->finishing && wb->first_err != 0))
        return;
    for (unsigned i = wb->first_idle;
         i < UPLOAD_MAX_PARTS && wb->in_flight < parallel; i++) {
        uint64_t offset, length;
        writebehind_part_range(i, wb->base, &offset, &length);
        if (offset >= limit)
            break;
        if (offset + length > limit) {
            if (!wb->finishing)
                break; /* the writer is not done with it */
            length = limit - offset;
        }
        if (!grow_locked(wb, i)) {
            fail_locked(wb, ENOMEM);
            break;
        }
        struct wb_part *part = &wb->parts[i];
        bool taken = part->state != PART_IDLE;
        if (taken || (part->failed && !wb->finishing)) {
            all_before = all_before && taken;
            if (all_before)
                wb->first_idle = i + 1;
            continue;
        }
        struct part_job *job = malloc(sizeof(*job));
        if (job == NULL) {
            fail_locked(wb, ENOMEM);
            break;
        }
        *job = (struct part_job){wb, i, offset, length, wb->finishing};
        part->state = PART_SENDING;
        part->stale = false;
        if (workers_submit(wb->conf->workers, part_job_run, job) != 0) {
            part->state = PART_IDLE;
            free(job);
            fail_locked(wb, ESHUTDOWN);
            break;
        }
        wb->in_flight++;
        if (all_before)
            wb->first_idle = i + 1;
    }
}

static void part_job_run(void *arg)
{
    struct part_job *job = arg;
    struct writebehind *wb = job->wb;
    struct s3_body body = {.fd = wb->fd, .offset = job->offset,
                           .length = job->length};
    char etag[S3_ETAG_MAX] = "";
    int err = s3_multipart_upload_part(wb->conf->s3, wb->key, wb->upload_id,
                                       job->index + 1, &body, etag);

    pthread_mutex_lock(&wb->lock);
    struct wb_part *part = &wb->parts[job->index];
    if (err == 0 && !part->stale) {
        part->state = PART_SENT;
        part->failed = false;
        memcpy(part->etag, etag, sizeof(part->etag));
    } else {
        part->state = PART_IDLE;
        if (err == ENOENT || err == EINVAL) {
            /* NoSuchUpload (a lifecycle rule aborted it), InvalidPart: no
             * part of this upload can succeed any more */
            if (wb->lost_err == 0)
                log_info("upload %s: the multipart upload is gone from the "
                         "server (%s)", wb->key, strerror(err));
            wb->lost_err = err;
            wb->stopping = true;
            fail_locked(wb, err);
        } else if (err != 0 && !part->stale) {
            /* a part queued before finish() gets one more try from it,
             * also when it fails after finish() has begun */
            if (job->final) {
                fail_locked(wb, err);
            } else {
                part->failed = true;
                log_debug("upload %s: part %u failed while the file was "
                          "written (%s); it is sent again at the end",
                          wb->key, job->index + 1, strerror(err));
            }
        }
        part->stale = false;
        if (job->index < wb->first_idle)
            wb->first_idle = job->index;
    }
    wb->in_flight--;
    kick_locked(wb);
    pthread_cond_broadcast(&wb->part_done);
    pthread_mutex_unlock(&wb->lock);
    free(job);
}

/* ------------------------------------------------------------- API */

int writebehind_start(const struct upload_conf *conf, const char *key,
                      const struct s3_put_meta *meta, int fd,
                      struct writebehind **out)
{
    struct writebehind *wb = calloc(1, sizeof(*wb));
    int err;

    *out = NULL;
    if (wb == NULL || (wb->key = strdup(key)) == NULL) {
        free(wb);
        return ENOMEM;
    }
    err = s3_multipart_create(conf->s3, key, meta, &wb->upload_id);
    if (err != 0) {
        free(wb->key);
        free(wb);
        return err;
    }
    wb->conf = conf;
    wb->fd = fd;
    wb->base = clamp_base(conf->part_size);
    wb->lag = 2 * wb->base;
    pthread_mutex_init(&wb->lock, NULL);
    pthread_cond_init(&wb->part_done, NULL);
    *out = wb;
    return 0;
}

const char *writebehind_key(const struct writebehind *wb)
{
    return wb->key;
}

const char *writebehind_upload_id(const struct writebehind *wb)
{
    return wb->upload_id;
}

void writebehind_wrote(struct writebehind *wb, uint64_t offset, uint64_t length,
                       uint64_t ready)
{
    pthread_mutex_lock(&wb->lock);
    if (invalidate_locked(wb, offset, offset + length) && offset < ready) {
        uint64_t back = ready - offset;
        uint64_t lag = back > LAG_MAX / 2 ? LAG_MAX : 2 * back;
        if (lag > wb->lag) {
            log_debug("upload %s: the writer went back %llu bytes over "
                      "parts already sent; parts now wait %llu bytes behind "
                      "it", wb->key, (unsigned long long)back,
                      (unsigned long long)lag);
            wb->lag = lag;
        }
    }
    if (ready > wb->ready)
        wb->ready = ready;
    kick_locked(wb);
    pthread_mutex_unlock(&wb->lock);
}

void writebehind_truncated(struct writebehind *wb, uint64_t size)
{
    pthread_mutex_lock(&wb->lock);
    invalidate_locked(wb, size, UINT64_MAX);
    if (size < wb->ready)
        wb->ready = size;
    pthread_mutex_unlock(&wb->lock);
}

/* Wait until no part is in flight. Lock held. */
static void wait_parts_locked(struct writebehind *wb)
{
    while (wb->in_flight > 0)
        pthread_cond_wait(&wb->part_done, &wb->lock);
}

static void free_wb(struct writebehind *wb)
{
    pthread_cond_destroy(&wb->part_done);
    pthread_mutex_destroy(&wb->lock);
    free(wb->parts);
    free(wb->upload_id);
    free(wb->key);
    free(wb);
}

/* Whether parts [0, COUNT) are all SENT. Lock held. */
static bool all_sent_locked(const struct writebehind *wb, unsigned count)
{
    if (count > wb->capacity)
        return false;
    for (unsigned i = 0; i < count; i++)
        if (wb->parts[i].state != PART_SENT)
            return false;
    return true;
}

/* Whether a part below COUNT is IDLE (kick_locked() would send it).
 * Lock held. */
static bool has_idle_locked(const struct writebehind *wb, unsigned count)
{
    for (unsigned i = 0; i < count; i++)
        if (i >= wb->capacity || wb->parts[i].state == PART_IDLE)
            return true;
    return false;
}

int writebehind_finish(struct writebehind **wbp, uint64_t size, char *etag_out)
{
    struct writebehind *wb = *wbp;
    const char **etags = NULL;
    unsigned count = 0;
    int err;

    *wbp = NULL;
    if (size == 0 || size > writebehind_capacity(wb->base)) {
        err = size == 0 ? EINVAL : EFBIG;
        goto out;
    }
    count = part_index(size - 1, wb->base) + 1;

    pthread_mutex_lock(&wb->lock);
    wb->finishing = true;
    wb->size = size;
    wb->first_idle = 0; /* failed parts anywhere are sent again */
    wb->first_err = wb->lost_err;
    for (;;) {
        kick_locked(wb);
        wait_parts_locked(wb); /* (each part's end queues the next ones) */
        if (wb->first_err != 0 || all_sent_locked(wb, count))
            break;
        /* nothing in flight, nothing more to send, yet not all sent:
         * cannot happen, but must not hang */
        if (!has_idle_locked(wb, count)) {
            wb->first_err = EIO;
            break;
        }
    }
    err = wb->first_err;
    pthread_mutex_unlock(&wb->lock);
    if (err != 0)
        goto out;

    etags = calloc(count, sizeof(*etags));
    if (etags == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (unsigned i = 0; i < count; i++)
        etags[i] = wb->parts[i].etag;
    /* every byte is in the fd: write-behind uploads files written from 0 */
    struct s3_body whole = {.fd = wb->fd, .length = size};
    err = s3_multipart_complete_object(wb->conf->s3, wb->key, wb->upload_id,
                                       etags, count, &whole, etag_out);
out:
    free(etags);
    if (err != 0)
        writebehind_abandon(&wb); /* stops what is in flight, aborts */
    else
        free_wb(wb);
    return err;
}

void writebehind_abandon(struct writebehind **wbp)
{
    struct writebehind *wb = *wbp;

    if (wb == NULL)
        return;
    *wbp = NULL;
    pthread_mutex_lock(&wb->lock);
    wb->stopping = true;
    wait_parts_locked(wb);
    pthread_mutex_unlock(&wb->lock);
    upload_abandon(wb->conf, wb->key, wb->upload_id);
    free_wb(wb);
}
