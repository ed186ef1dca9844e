/*
 * tier.c - the shared cache tier (see tier.h).
 *
 * tier->lock guards the write queue (a FIFO of offered blocks and the
 * bytes it holds), the leases to give back (releases), the writers'
 * state and the skip state (skip_until, the current pause, the last
 * answers to reads and to writes), and whether a thread probes for the
 * lease mode. lease_lock guards own[] (this node's leases, with their
 * ETags and whether each is to be given back) and the list of groups
 * being claimed (claiming): a thread
 * claims a group only while no other thread of the node does (it waits
 * on claim_done), so the node's claims of one group go one at a time and
 * those of different groups at once (a writer giving a lease back
 * claims its group too). The two locks are never held together. The
 * counters are atomics. No lock is held during a request or a sleep: a
 * tier that stalls costs each reader at most the request it waits for,
 * at the same time.
 */
#include "config.h"

#include "tier/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/log.h"
#include "tier/tier_format.h"

struct tier_put {
    struct tier_put *next;
    struct cache_object *object; /* where the block is cached */
    char *key;                   /* the origin's */
    char *etag;
    uint64_t index;
    uint32_t len;
};

/* A lease object's text: "EXPIRES FIRST LAST NODE INTENDS\n" (wall
 * seconds, the blocks of the group its node fetches, the node's random
 * token, the last block of the group it means to fetch: LAST, or the
 * group's last when it reads on). */
struct lease {
    double expires;
    uint64_t first, last;
    uint64_t node;
    uint64_t intends;
    char etag[S3_ETAG_MAX];      /* of the object it was read from or
                                    written as; "": not known */
};

#define TIER_OWN_LEASES 64            /* this node's leases remembered */

struct tier {
    struct s3_client *s3;
    struct cache *cache;
    char *prefix;
    char *origin;
    uint32_t block_size;
    uint64_t queue_limit;        /* blocks */
    uint64_t queued_blocks;
    double skip_first;

    pthread_mutex_t lock;
    pthread_cond_t work;         /* a block was queued, or stopping */
    pthread_cond_t idle;         /* the queue emptied and no one writes */
    struct tier_put *head, *tail;
    struct tier_release {
        struct tier_release *next;
        char *lease_key;
    } *releases;                 /* this node's leases to give back, LIFO */
    uint64_t queued_bytes;
    unsigned writing;            /* writers inside a PUT */
    bool stopping;
    double skip_until;           /* monotonic seconds; 0: not skipped */
    double skip_pause;           /* the pause the next failure sets */
    double last_read_answer;     /* monotonic: the last answer to a GET
                                    or HEAD came */
    double last_write_answer;    /* ... to a PUT or DELETE */
    bool probe_writes;           /* the skip began with a write's failure:
                                    the probes are writes */
    double probe_every;          /* seconds between probes; <= 0: none */
    double next_probe;           /* monotonic: while skipped, the next */
    bool probe_running;          /* a writer is probing the tier */
    pthread_t writers[TIER_WRITERS];
    unsigned writer_count;

    atomic_bool conditional;     /* writes carry If-None-Match: * (until
                                    the server refuses it) */
    atomic_int lease_mode;       /* enum tier_lease_mode */
    atomic_bool if_match;        /* the server takes If-Match on writes
                                    (found by the lease probe): leases
                                    are taken over over the ETag seen */
    uint64_t node;               /* this node's token, in its leases */
    uint64_t damaged[TIER_DAMAGED_MAX]; /* hashes of the keys of blocks
                                    seen damaged (0: none), a ring: their
                                    next write replaces them (lock) */
    unsigned damaged_next;
    pthread_mutex_t lease_lock;  /* own[] and claiming (never held across
                                    a request) */
    pthread_cond_t claim_done;   /* a claim left claiming */
    struct claim_busy {
        struct claim_busy *next;
        const char *lease_key;
    } *claiming;                 /* the groups whose claims are under way */
    struct own_lease {
        char *key;
        struct lease lease;
        bool releasing;          /* to be given back (a writer will) */
    } own[TIER_OWN_LEASES];      /* this node's latest leases */
    unsigned own_next;
    bool probing;                /* a thread is finding lease_mode out */
    pthread_cond_t probed;       /* it did */
    _Atomic uint64_t leases, lease_waits, lease_waits_met;
    _Atomic uint64_t hits, hit_bytes, misses, bad, errors, skipped;
    _Atomic uint64_t puts, put_bytes, put_exists, put_dropped;
};

/* ---------------------------------------------------------- skipping */

static bool skipped_now_locked(const struct tier *tier)
{
    return tier->skip_until > 0 && clock_monotonic_seconds() < tier->skip_until;
}

static bool skipped_now(struct tier *tier)
{
    pthread_mutex_lock(&tier->lock);
    bool skipped = skipped_now_locked(tier);
    pthread_mutex_unlock(&tier->lock);
    return skipped;
}

/* A request to the tier, sent at SENT (monotonic), a write (PUT, DELETE)
 * or not (GET, HEAD), failed with ERR: skip it for a while (longer each
 * time it keeps failing). Not for a timeout while the tier answered a
 * request of the same kind after this one was sent: four nodes' reads,
 * leases and writes on one busy server (s3rver) time one out now and
 * then, and skipping it for that sent the rest of a 1 GiB read to the
 * origin (2.75x the file, four nodes at once). A read's answer says
 * nothing of writes, though: a tier whose writes stall while its reads
 * answer is a failing tier (before, such a tier was never skipped, and
 * each lease write cost a read the whole deadline). */
static void note_failure(struct tier *tier, const char *what, bool write,
                         int err, double sent)
{
    atomic_fetch_add(&tier->errors, 1);
    pthread_mutex_lock(&tier->lock);
    double answered = write ? tier->last_write_answer : tier->last_read_answer;
    bool busy = err == ETIMEDOUT && answered > sent;
    bool already = busy || skipped_now_locked(tier);
    double pause = tier->skip_pause;
    if (busy)
        log_debug("shared cache: %s timed out; the tier answers others", what);
    if (!already) {
        double now = clock_monotonic_seconds();
        tier->skip_until = now + pause;
        tier->skip_pause = pause * 2 < TIER_SKIP_MAX ? pause * 2 : TIER_SKIP_MAX;
        tier->next_probe = now + tier->probe_every;
        tier->probe_writes = write;
        pthread_cond_broadcast(&tier->work); /* a writer times the probe */
    }
    pthread_mutex_unlock(&tier->lock);
    if (!already)
        log_warn("shared cache: %s failed (%s); reading from the origin "
                 "only for %.0f s", what, strerror(err), pause);
}

/* A request to the tier, a write or not, was answered: the next failure
 * pauses briefly again. */
static void note_success(struct tier *tier, bool write)
{
    pthread_mutex_lock(&tier->lock);
    if (write)
        tier->last_write_answer = clock_monotonic_seconds();
    else
        tier->last_read_answer = clock_monotonic_seconds();
    bool back = tier->skip_until > 0 && !skipped_now_locked(tier);
    if (back) {
        tier->skip_until = 0;
        tier->skip_pause = tier->skip_first;
    }
    pthread_mutex_unlock(&tier->lock);
    if (back)
        log_info("shared cache: answering again");
}

/* ---------------------------------------------------- damaged blocks */

/* A block the tier holds damaged (it does not verify) is fetched from the
 * origin and offered again; its write must replace it, where writes
 * carry If-None-Match: * and would be refused as "there already" (and
 * every node reading the block would pay an origin GET for it until a
 * prune). The tier remembers the last TIER_DAMAGED_MAX such keys. */
static uint64_t damaged_hash(const char *tier_key)
{
    uint64_t hash = XXH3_64bits(tier_key, strlen(tier_key));
    return hash != 0 ? hash : 1;
}

static void damaged_remember(struct tier *tier, const char *tier_key)
{
    uint64_t hash = damaged_hash(tier_key);

    pthread_mutex_lock(&tier->lock);
    tier->damaged[tier->damaged_next] = hash;
    tier->damaged_next = (tier->damaged_next + 1) % TIER_DAMAGED_MAX;
    pthread_mutex_unlock(&tier->lock);
}

/* Whether TIER_KEY was seen damaged (forgotten now: one replacement). */
static bool damaged_take(struct tier *tier, const char *tier_key)
{
    uint64_t hash = damaged_hash(tier_key);
    bool found = false;

    pthread_mutex_lock(&tier->lock);
    for (unsigned i = 0; !found && i < TIER_DAMAGED_MAX; i++)
        if (tier->damaged[i] == hash) {
            tier->damaged[i] = 0;
            found = true;
        }
    pthread_mutex_unlock(&tier->lock);
    return found;
}

/* ------------------------------------------------------------ reading */

/* tier_get_block(); a miss is counted only with COUNT_MISS (a wait for
 * a block another node fetches asks several times). */
static int get_block(struct tier *tier, const char *key, const char *etag,
                     uint64_t index, uint32_t len, char *scratch,
                     const char **data, bool count_miss)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, index};
    char *tier_key = NULL;
    size_t got = 0;

    *data = NULL;
    if (skipped_now(tier)) {
        atomic_fetch_add(&tier->skipped, 1);
        return ENOENT;
    }
    int err = tier_block_key(tier->prefix, &id, &tier_key);
    if (err != 0)
        return err;
    double sent = clock_monotonic_seconds();
    err = s3_get_object_range(tier->s3, tier_key, 0,
                              (size_t)len + TIER_HEADER_LEN, NULL, scratch,
                              &got, NULL);
    if ((err == 0 && got < (size_t)len + TIER_HEADER_LEN) || err == EIO)
        err = ENOENT;   /* short, or an answer that was not the range
                           asked for: a server that writes in place
                           (s3rver) shows a block being written part way,
                           or one rewritten under the read */
    if (err == ENOENT || err == EINVAL) {
        /* (EINVAL: a range past the end, an empty object) */
        if (count_miss)
            atomic_fetch_add(&tier->misses, 1);
        note_success(tier, false);
        err = ENOENT;
    } else if (err != 0) {
        note_failure(tier, "a read", false, err, sent);
    } else if (tier_frame_check(&id, scratch, got, len) != 0) {
        atomic_fetch_add(&tier->bad, 1);
        damaged_remember(tier, tier_key);
        log_warn("shared cache: block %llu of '%s' there does not verify; "
                 "read from the origin, and written there again",
                 (unsigned long long)index, key);
        err = EBADMSG;
    } else {
        atomic_fetch_add(&tier->hits, 1);
        atomic_fetch_add(&tier->hit_bytes, len);
        note_success(tier, false);
        *data = scratch + TIER_HEADER_LEN;
    }
    free(tier_key);
    return err;
}

int tier_get_block(struct tier *tier, const char *key, const char *etag,
                   uint64_t index, uint32_t len, char *scratch,
                   const char **data)
{
    return get_block(tier, key, etag, index, len, scratch, data, true);
}

/* ------------------------------------------------------------- leases */

#define LEASE_POLL_FIRST 0.02         /* seconds between GETs while waiting, */
#define LEASE_POLL_MAX 0.25           /* doubling up to this */
#define LEASE_WIDEN_WAIT 0.15         /* seconds a lease on earlier blocks
                                         is watched for growing */
#define LEASE_TEXT_MAX 128
#define READ_BACK_PAUSE_MIN 0.005     /* seconds between a lease's write */
#define READ_BACK_PAUSE_MAX 0.5       /* and its read back */
#define LEASE_RECHECK 0.5             /* seconds between looks at the lease
                                         a wait is for */
#define LEASE_GIVEN_BACK 1.0          /* (wall seconds) a lease given back
                                         says it ran out then */
#define RENEW_BLIND_MIN 2.0           /* seconds a lease must have left to
                                         be renewed without If-Match and
                                         without reading it first */

static void sleep_seconds(double seconds)
{
    struct timespec nap = {.tv_sec = (time_t)seconds,
                           .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&nap, NULL);
}

/* Whether LEASE runs now (one past its time, or too far ahead to be
 * believed, is not). */
static bool lease_runs(const struct lease *lease)
{
    double left = lease->expires - clock_wall_seconds();
    return left > 0 && left <= TIER_LEASE_SECONDS + 1;
}

/* ERR, the outcome of a lease request (WRITE: a PUT or DELETE) sent at
 * SENT, noted: an answer (lease_answered(): the object, no such key, a
 * condition that failed or is refused, an empty or garbled object) or a
 * failure, which may skip the tier. Returns ERR. */
static bool lease_answered(bool write, int err)
{
    return err == 0 || err == ENOENT || err == ESTALE || err == EBUSY ||
           err == ENOSYS || err == EINVAL || (!write && err == EIO);
}

static int lease_noted(struct tier *tier, bool write, double sent, int err)
{
    if (lease_answered(write, err))
        note_success(tier, write);
    else
        note_failure(tier, write ? "a lease write" : "a lease read", write,
                     err, sent);
    return err;
}

/* Read the lease at LEASE_KEY (with its ETag): 0 (an unreadable text
 * reads as a lease long past, of no node), ENOENT (also for a text
 * without its newline: one being written), or the client's errno. */
static int read_lease(struct tier *tier, const char *lease_key,
                      struct lease *lease)
{
    char text[LEASE_TEXT_MAX];
    unsigned long long first = 0, last = 0, node = 0, intends = 0;
    struct s3_object_info info;
    size_t got = 0;
    double sent = clock_monotonic_seconds();
    int err = lease_noted(tier, false, sent,
                          s3_get_object_range(tier->s3, lease_key, 0,
                                              sizeof(text) - 2, NULL, text,
                                              &got, &info));

    memset(lease, 0, sizeof(*lease));
    if (err == 0)
        snprintf(lease->etag, sizeof(lease->etag), "%s", info.etag);
    if (err != 0)       /* (EINVAL: empty; EIO: being rewritten in place) */
        return err == EINVAL || err == EIO ? ENOENT : err;
    if (got == 0 || text[got - 1] != '\n')
        return ENOENT;  /* part written (a server that writes in place) */
    text[got] = '\0';
    int fields = sscanf(text, "%lf %llu %llu %llx %llu", &lease->expires,
                        &first, &last, &node, &intends);
    if (fields < 3)
        lease->expires = 0;
    lease->first = first;
    lease->last = last;
    lease->node = node;
    lease->intends = fields == 5 && intends > last ? intends : last;
    return 0;
}

/* Write WANT (its blocks; this node's, from now) to LEASE_KEY, until
 * EXPIRES (wall seconds; 0: a lease's time from now): with
 * If-None-Match: * when CONDITIONAL, over the object of ETag IF_MATCH
 * only when not NULL (it may be *WRITTEN's: that is written after the
 * request), plainly else; what was written (and its ETag) in *WRITTEN. */
static int write_lease(struct tier *tier, const char *lease_key,
                       const struct lease *want, double expires,
                       bool conditional, const char *if_match,
                       struct lease *written)
{
    struct s3_put_meta meta = {.if_none_match = conditional,
                               .if_match = if_match};
    struct lease lease = {expires > 0 ? expires
                                      : clock_wall_seconds() + TIER_LEASE_SECONDS,
                          want->first, want->last, tier->node,
                          want->intends > want->last ? want->intends
                                                     : want->last, ""};
    char text[LEASE_TEXT_MAX];
    int len = snprintf(text, sizeof(text), "%.3f %llu %llu %016llx %llu\n",
                       lease.expires, (unsigned long long)lease.first,
                       (unsigned long long)lease.last,
                       (unsigned long long)lease.node,
                       (unsigned long long)lease.intends);
    struct s3_body body = {.data = text, .fd = -1, .length = (uint64_t)len};
    double sent = clock_monotonic_seconds();
    int err = lease_noted(tier, true, sent,
                          s3_put_object(tier->s3, lease_key, &body, &meta,
                                        lease.etag));

    if (err == 0)
        *written = lease;
    return err;
}

/* The ETag to write over LEASE with (If-Match: only over that very
 * object), or NULL where the server does not take If-Match on writes,
 * or it is not known. */
static const char *over_etag(struct tier *tier, const struct lease *lease)
{
    return atomic_load(&tier->if_match) && lease->etag[0] != '\0'
               ? lease->etag
               : NULL;
}

/* write_lease() of WANT, not with If-None-Match, and over the object of
 * ETag OVER only when not NULL (over_etag()): 0, EAGAIN when the tier
 * holds another object there now, or none (look again), or the client's
 * errno. */
static int write_lease_over(struct tier *tier, const char *lease_key,
                            const struct lease *want, double expires,
                            const char *over, struct lease *written)
{
    int err = write_lease(tier, lease_key, want, expires, false, over, written);

    return over != NULL && (err == ESTALE || err == ENOENT || err == EBUSY)
               ? EAGAIN
               : err;
}

/* This node's lease at LEASE_KEY, as remembered (lease_lock held); NULL
 * when it is not. */
static struct own_lease *own_find_locked(struct tier *tier,
                                         const char *lease_key)
{
    for (unsigned i = 0; i < TIER_OWN_LEASES; i++)
        if (tier->own[i].key != NULL && strcmp(tier->own[i].key, lease_key) == 0)
            return &tier->own[i];
    return NULL;
}

/* A copy of this node's lease at LEASE_KEY into *LEASE: whether it is
 * remembered. */
static bool own_get(struct tier *tier, const char *lease_key,
                    struct lease *lease)
{
    pthread_mutex_lock(&tier->lease_lock);
    struct own_lease *known = own_find_locked(tier, lease_key);
    if (known != NULL)
        *lease = known->lease;
    pthread_mutex_unlock(&tier->lease_lock);
    return known != NULL;
}

/* Remember LEASE, this node's at LEASE_KEY, in place of the oldest
 * remembered (a forgotten one is read from the tier). */
static void own_remember(struct tier *tier, const char *lease_key,
                         const struct lease *lease)
{
    char *key = strdup(lease_key);

    pthread_mutex_lock(&tier->lease_lock);
    struct own_lease *slot = own_find_locked(tier, lease_key);
    if (slot == NULL && key != NULL) {
        slot = &tier->own[tier->own_next];
        tier->own_next = (tier->own_next + 1) % TIER_OWN_LEASES;
        free(slot->key);
        slot->key = key;
        slot->releasing = false;
        key = NULL;
    }
    if (slot != NULL)
        slot->lease = *lease;
    pthread_mutex_unlock(&tier->lease_lock);
    free(key);
}

/* This thread claims the group of LEASE_KEY (BUSY, the caller's, goes on
 * the list while it does), once no other thread of the node does: the
 * wait is for a claim under way, which its requests' deadlines bound. */
static void claim_begin(struct tier *tier, const char *lease_key,
                        struct claim_busy *busy)
{
    pthread_mutex_lock(&tier->lease_lock);
    for (;;) {
        struct claim_busy *other = tier->claiming;
        while (other != NULL && strcmp(other->lease_key, lease_key) != 0)
            other = other->next;
        if (other == NULL)
            break;
        pthread_cond_wait(&tier->claim_done, &tier->lease_lock);
    }
    busy->lease_key = lease_key;
    busy->next = tier->claiming;
    tier->claiming = busy;
    pthread_mutex_unlock(&tier->lease_lock);
}

/* The claim of BUSY is over: threads waiting to claim its group go on. */
static void claim_end(struct tier *tier, struct claim_busy *busy)
{
    pthread_mutex_lock(&tier->lease_lock);
    struct claim_busy **at = &tier->claiming;
    while (*at != busy)
        at = &(*at)->next;
    *at = busy->next;
    pthread_cond_broadcast(&tier->claim_done);
    pthread_mutex_unlock(&tier->lease_lock);
}

/* This node's random token, which its leases carry. */
static uint64_t node_token(void)
{
    uint64_t token = 0;
    struct timespec now;

    if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
        clock_gettime(CLOCK_REALTIME, &now);
        token = ((uint64_t)getpid() << 40) ^ (uint64_t)now.tv_sec * 1000000007u ^
                (uint64_t)now.tv_nsec;
    }
    return token != 0 ? token : 1;
}

/* A write of the lease probe's object KEY with META, noted; its ETag
 * into ETAG_OUT (may be NULL). */
static int probe_write(struct tier *tier, const char *key,
                       const struct s3_put_meta *meta, char *etag_out)
{
    struct s3_body body = {.data = "probe\n", .fd = -1, .length = 6};
    double sent = clock_monotonic_seconds();

    return lease_noted(tier, true, sent,
                       s3_put_object(tier->s3, key, &body, meta, etag_out));
}

/* Whether the server refuses a second conditional write of one key: two
 * writes of a probe object; where it does, whether it takes If-Match on
 * writes too (tier->if_match): refused over another ETag, done over the
 * one written; then the object's delete. The lease mode, or
 * TIER_LEASES_UNKNOWN when the tier failed (ask later). */
static int probe_leases(struct tier *tier)
{
    struct s3_put_meta fresh = {.if_none_match = true};
    struct s3_put_meta other = {.if_match = "\"00000000000000000000000000000000\""};
    struct s3_put_meta same = {0};
    char etag[S3_ETAG_MAX] = "";
    struct timespec now;
    char *key = NULL;
    int mode = TIER_LEASES_UNKNOWN;

    clock_gettime(CLOCK_REALTIME, &now);
    if (asprintf(&key, "%s%sprobe-%ld-%ld%09ld", tier->prefix, TIER_ROOT,
                 (long)getpid(), (long)now.tv_sec, now.tv_nsec) < 0)
        return TIER_LEASES_UNKNOWN;
    int first = probe_write(tier, key, &fresh, etag);
    int second = first != 0 ? first : probe_write(tier, key, &fresh, NULL);
    if (first == 0 && second == ESTALE)
        mode = TIER_LEASES_CONDITIONAL;
    else if (first == ENOSYS || second == ENOSYS || (first == 0 && second == 0))
        mode = TIER_LEASES_READ_BACK;
    if (mode == TIER_LEASES_CONDITIONAL) {
        same.if_match = etag;
        int refused = probe_write(tier, key, &other, NULL);
        int done = refused == ESTALE ? probe_write(tier, key, &same, NULL)
                                     : refused;
        if (!lease_answered(true, refused) || !lease_answered(true, done))
            mode = TIER_LEASES_UNKNOWN;
        atomic_store(&tier->if_match, refused == ESTALE && done == 0);
    }
    if (first == 0 || second == 0) {
        double sent = clock_monotonic_seconds();
        lease_noted(tier, true, sent, s3_delete_object(tier->s3, key));
    }
    free(key);
    if (mode == TIER_LEASES_READ_BACK)
        log_info("shared cache: the server has no conditional writes; "
                 "leases are written, then read back (two nodes that miss "
                 "a block at the same moment may still both fetch it)");
    else if (mode == TIER_LEASES_CONDITIONAL && !atomic_load(&tier->if_match))
        log_info("shared cache: the server has If-None-Match but not "
                 "If-Match on writes; a lease past its time is taken over "
                 "by a write read back after a pause (two nodes taking "
                 "it over at once may both fetch its blocks)");
    return mode;                    /* (a failure was noted) */
}

/* The lease mode, found out on first use (threads that need it
 * meanwhile wait for the probe: the first reads of nodes started
 * together are the ones leases are for); TIER_LEASES_UNKNOWN when the
 * probe failed. */
static int lease_mode(struct tier *tier)
{
    int mode = atomic_load(&tier->lease_mode);
    bool waited = false;

    if (mode != TIER_LEASES_UNKNOWN)
        return mode;
    pthread_mutex_lock(&tier->lock);
    while (tier->probing) {
        waited = true;
        pthread_cond_wait(&tier->probed, &tier->lock);
    }
    mode = atomic_load(&tier->lease_mode);
    if (mode != TIER_LEASES_UNKNOWN || waited) {
        pthread_mutex_unlock(&tier->lock);
        return mode;            /* (a failed probe is tried again later) */
    }
    tier->probing = true;
    pthread_mutex_unlock(&tier->lock);
    mode = probe_leases(tier);
    pthread_mutex_lock(&tier->lock);
    atomic_store(&tier->lease_mode, mode);
    tier->probing = false;
    pthread_cond_broadcast(&tier->probed);
    pthread_mutex_unlock(&tier->lock);
    return mode;
}

/* Claim the blocks of WANT at LEASE_KEY by a conditional write: 0,
 * ESTALE (a lease is there: it in HELD), or the client's errno. */
static int claim_conditional(struct tier *tier, const char *lease_key,
                             const struct lease *want, struct lease *held)
{
    int err = write_lease(tier, lease_key, want, 0, true, NULL, held);

    if (err != ESTALE && err != EBUSY)  /* (EBUSY: another's write of it
                                           under way, 409 on AWS) */
        return err;
    err = read_lease(tier, lease_key, held);
    return err == 0 ? ESTALE : err == ENOENT ? EAGAIN : err;
}

/* This node claims a group again, for a later run of it: its lease OWN
 * (running or not) is rewritten to cover WANT's blocks as well as what
 * it covers while it runs (other nodes may be waiting for those), unless
 * it covers them already for a while yet. Where the server takes
 * If-Match on writes, only over the object OWN was written as (or read
 * from): EAGAIN when the tier holds another now (another node took the
 * group over: read it and see). Without If-Match, plainly, with no read
 * back: other nodes do not write over a running lease, unless one saw it
 * past its time while this one did not (their clocks more than
 * RENEW_BLIND_MIN apart): then both fetch the group. 0 (OWN is what the
 * tier holds now), EAGAIN, or the client's errno. */
static int renew_own(struct tier *tier, const char *lease_key,
                     struct lease *own, const struct lease *want)
{    struct lease wider = *want;

    if (lease_runs(own) && own->first <= own->last) {
        if (own->first <= want->first && want->last <= own->last &&
            want->intends <= own->intends &&
            own->expires - clock_wall_seconds() > TIER_LEASE_SECONDS / 2)
            return 0;           /* covered already */
        if (own->first < wider.first)
            wider.first = own->first;
        if (own->last > wider.last)
            wider.last = own->last;
        if (own->intends > wider.intends)
            wider.intends = own->intends;
    }
    return write_lease_over(tier, lease_key, &wider, 0, over_etag(tier, own),
                            own);
}

/* Whether this node renews its remembered lease OWN without reading the
 * tier first: it runs, and the write is conditional (If-Match) or comes
 * while no other node's clock should see OWN past its time. */
static bool renew_blind(struct tier *tier, const struct lease *own)
{
    return lease_runs(own) &&
           (atomic_load(&tier->if_match) ||
            own->expires - clock_wall_seconds() > RENEW_BLIND_MIN);
}

/* Write WANT plainly to LEASE_KEY, then read it back after a pause as
 * long as the write took, the time another node's write begun meanwhile
 * needs to land: 0 (this node's lease is there: in HELD), ESTALE
 * (another node's: in HELD) or the client's errno. */
static int write_read_back(struct tier *tier, const char *lease_key,
                           const struct lease *want, struct lease *held)
{
    double began = clock_monotonic_seconds();
    int err = write_lease(tier, lease_key, want, 0, false, NULL, held);

    if (err != 0)
        return err;
    double pause = clock_monotonic_seconds() - began;
    sleep_seconds(pause < READ_BACK_PAUSE_MIN   ? READ_BACK_PAUSE_MIN
                  : pause > READ_BACK_PAUSE_MAX ? READ_BACK_PAUSE_MAX
                                                : pause);
    err = read_lease(tier, lease_key, held);
    if (err == ENOENT)
        return 0;       /* pruned meanwhile: fetch, as the holder */
    if (err != 0)
        return err;
    return held->node == tier->node ? 0 : ESTALE;
}

/* Claim the blocks of WANT at LEASE_KEY without conditional writes: a
 * running lease of another node there already wins; else this node's is
 * written and read back (write_read_back()). 0, ESTALE (another node's
 * lease is there: it in HELD) or the client's errno; *RENEWED says the
 * lease was this node's already. */
static int claim_read_back(struct tier *tier, const char *lease_key,
                           const struct lease *want, struct lease *held,
                           bool *renewed)
{
    int err = read_lease(tier, lease_key, held);

    if (err == 0 && held->node != tier->node && lease_runs(held))
        return ESTALE;
    if (err != 0 && err != ENOENT)
        return err;
    if (err == 0 && held->node == tier->node) {
        *renewed = true;
        return renew_own(tier, lease_key, held, want);
    }
    return write_read_back(tier, lease_key, want, held);
}

/* Take over for WANT's blocks the lease HELD, another node's, found past
 * its time at LEASE_KEY (its node died, or is stuck). Where the server
 * takes If-Match on writes, by a write over that very object (HELD's
 * ETag): of nodes taking it over at once one wins, the others' writes
 * are refused and they look again (EAGAIN). Without, by a plain write
 * read back (write_read_back()): nodes whose writes land within each
 * other's pause agree on the last; one whose write lands later, after
 * the other read back, fetches the group too (a duplicate fetch, never
 * other bytes, and never a wait past a lease's time). 0 (this node's
 * lease: in HELD), ESTALE (another node's: in HELD), EAGAIN, or the
 * client's errno. */
static int take_over(struct tier *tier, const char *lease_key,
                     const struct lease *want, struct lease *held)
{
    const char *expired = over_etag(tier, held);

    if (expired == NULL)
        return write_read_back(tier, lease_key, want, held);
    return write_lease_over(tier, lease_key, want, 0, expired, held);
}

/* Claim WANT's blocks of the group of its first (all within it): 0 (this
 * node's lease in HELD), ESTALE (another node's lease: it in HELD; one
 * that does not run covers no block), ECANCELED (the tier is skipped,
 * maybe by the claim this one waited for), or an errno. *RENEWED says
 * the group was this node's already (its lease now covers WANT's too).
 * The node's claims of one group go one at a time (claim_begin()), so
 * that two threads renewing one lease do not each write over the other's
 * blocks. */
static int claim_group(struct tier *tier, int mode,
                       const struct tier_block_id *id,
                       const struct lease *want, struct lease *held,
                       bool *renewed)
{
    char *lease_key = NULL;
    struct tier_block_id group = *id;
    struct claim_busy busy;
    struct lease own;
    int err;

    *renewed = false;
    group.index = want->first;
    err = tier_lease_key(tier->prefix, &group, TIER_LEASE_BLOCKS, &lease_key);
    if (err != 0)
        return err;
    claim_begin(tier, lease_key, &busy);
    if (skipped_now(tier)) {
        err = ECANCELED;
        goto out;
    }
    if (own_get(tier, lease_key, &own) && renew_blind(tier, &own)) {
        *renewed = true;
        err = renew_own(tier, lease_key, &own, want);
        *held = own;
        if (err == 0)
            own_remember(tier, lease_key, &own);
        if (err != EAGAIN)
            goto out;
        *renewed = false;   /* not this node's any more: see whose */
    }
    for (int attempt = 0;; attempt++) {
        if (mode == TIER_LEASES_READ_BACK) {
            err = claim_read_back(tier, lease_key, want, held, renewed);
            break;
        }
        /* (EAGAIN: deleted between the write and the read, or another
         * node's takeover came first: once more) */
        err = claim_conditional(tier, lease_key, want, held);
        if (err == ESTALE && !lease_runs(held) && held->node != tier->node)
            err = take_over(tier, lease_key, want, held);
        if (err != EAGAIN || attempt == 1)
            break;
    }
    if (err == EAGAIN) {
        memset(held, 0, sizeof(*held));
        err = ESTALE;       /* (twice: fetch without a lease) */
    }
    if (err == ESTALE && held->node == tier->node) {
        *renewed = true;    /* (one this node no longer remembered) */
        err = renew_own(tier, lease_key, held, want);
        if (err == EAGAIN) {
            memset(held, 0, sizeof(*held));
            err = ESTALE;   /* (changed again: fetch without a lease) */
        }
    }
    if (err == 0)
        own_remember(tier, lease_key, held);
out:
    claim_end(tier, &busy);
    free(lease_key);
    if (err == ESTALE && !lease_runs(held))
        held->first = 1, held->last = 0;     /* covers nothing: fetch */
    return err;
}

/* Whether another node's lease HELD on the group of ID (at FIRST)
 * covers FIRST, now or after a moment. A running lease on other blocks
 * may widen: before FIRST, that node, reading the group in order, may be
 * about to take FIRST in; after FIRST, its reads run in parallel, and
 * the one of the blocks before them may not have claimed yet (the
 * kernel's read of one block, say, behind the read-ahead of the ones
 * after it). Such a lease is looked at again for a while
 * (LEASE_WIDEN_WAIT; TIER_LEASE_INTENT_WAIT when it says that node reads
 * on: to FIRST, or, for a lease after FIRST, to the group's end); HELD
 * gets the lease that came to cover FIRST. */
static bool lease_covers(struct tier *tier, const struct tier_block_id *id,
                         uint64_t first, struct lease *held)
{
    struct lease again;
    char *lease_key = NULL;
    double pause = LEASE_POLL_FIRST;
    /* (a lease of read-ahead intends the group's end) */
    bool reads_on =
        held->last < first
            ? first <= held->intends
            : held->intends % TIER_LEASE_BLOCKS == TIER_LEASE_BLOCKS - 1;
    double patience = reads_on ? TIER_LEASE_INTENT_WAIT : LEASE_WIDEN_WAIT;
    bool widened = false;

    if (held->first <= first && first <= held->last)
        return true;
    if (!lease_runs(held) ||
        tier_lease_key(tier->prefix, id, TIER_LEASE_BLOCKS, &lease_key) != 0)
        return false;
    for (double waited = 0; !widened && waited < patience; waited += pause) {
        sleep_seconds(pause);
        pause = pause * 2 < LEASE_POLL_MAX ? pause * 2 : LEASE_POLL_MAX;
        if (read_lease(tier, lease_key, &again) != 0 ||
            again.node != held->node || !lease_runs(&again))
            break;
        widened = again.first <= first && first <= again.last;
        if (widened)
            *held = again;
    }
    free(lease_key);
    return widened;
}

/* Of a run to LAST that this node fetches from a block before HELD's
 * lease (another node's), the last block it fetches: the one before the
 * lease's first, or LAST. */
static uint64_t stop_before(const struct lease *held, uint64_t from,
                            uint64_t last)
{
    return held->first > from && held->first <= held->last &&
                   held->first <= last
               ? held->first - 1
               : last;
}

/* What this node leases of a run FROM..LAST in the group of FROM (which
 * ends at GROUP_LAST): the run's part there, and the rest of the group
 * too when it READS_ON. */
static struct lease lease_wanted(uint64_t from, uint64_t last,
                                 uint64_t group_last, bool reading_on)
{
    struct lease want = {0};

    want.first = from;
    want.last = last < group_last ? last : group_last;
    want.intends = reading_on ? group_last : want.last;
    return want;
}

/* Claim the part of a run up to LAST in the group after the one that
 * ends at GROUP_LAST: the last block of the run this node fetches (LAST,
 * or the block before another node's lease there). */
static uint64_t claim_next_group(struct tier *tier, int mode,
                                 const struct tier_block_id *id,
                                 uint64_t group_last, uint64_t last,
                                 bool reading_on)
{
    struct tier_block_id next = *id;
    struct lease held = {0};
    bool renewed = false;

    if (last <= group_last)
        return last;
    next.index = group_last + 1;
    struct lease want = lease_wanted(next.index, last,
                                     group_last + TIER_LEASE_BLOCKS, reading_on);
    int err = claim_group(tier, mode, &next, &want, &held, &renewed);
    if (err == 0 && !renewed)
        atomic_fetch_add(&tier->leases, 1);
    if (err != ESTALE)
        return last;
    /* another node's lease there covers the group's first blocks, or
     * later ones it may yet widen down to (lease_covers()): the tier is
     * asked for the group again when the run gets to it */
    return held.first <= held.last ? group_last : last;
}

enum tier_claim tier_claim_blocks(struct tier *tier, const char *key,
                                  const char *etag, uint64_t first,
                                  uint64_t last, bool reading_on,
                                  uint64_t *covered, double *until)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, first};
    uint64_t group_last = first - first % TIER_LEASE_BLOCKS + TIER_LEASE_BLOCKS - 1;
    struct lease want = lease_wanted(first, last, group_last, reading_on);
    struct lease held = {0};
    bool renewed = false;
    int mode;

    *covered = last;
    if (skipped_now(tier) ||
        (mode = lease_mode(tier)) == TIER_LEASES_UNKNOWN)
        return TIER_FETCH;
    int err = claim_group(tier, mode, &id, &want, &held, &renewed);
    if (err == 0) {
        if (!renewed)
            atomic_fetch_add(&tier->leases, 1);
        *covered = claim_next_group(tier, mode, &id, group_last, last,
                                    reading_on);
        return TIER_FETCH;
    }
    if (err != ESTALE) {
        /* (the failure was noted where it happened.) A busy tier's
         * timeout, not a skip: another node may hold the group; fetch
         * FIRST alone and ask the tier again for the rest */
        if (err != ECANCELED && !skipped_now(tier))
            *covered = first;
        return TIER_FETCH;
    }
    if (!lease_covers(tier, &id, first, &held)) {
        /* its lease is on other blocks of the group: fetch up to them */
        *covered = stop_before(&held, first, last);
        if (*covered == last)
            *covered = claim_next_group(tier, mode, &id, group_last, last,
                                        reading_on);
        return TIER_FETCH;
    }
    *covered = held.last;
    *until = clock_monotonic_seconds() + (held.expires - clock_wall_seconds());
    return TIER_AWAIT;
}

/* Whether a lease still promises block INDEX of version ETAG of KEY: it
 * runs and covers it. Not when it was given back (its node dropped a
 * block), taken over for other blocks, or is gone; a request that
 * failed says nothing (the wait goes on, to its end). */
static bool lease_still_covers(struct tier *tier, const char *key,
                               const char *etag, uint64_t index)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, index};
    struct lease lease;
    char *lease_key = NULL;

    if (tier_lease_key(tier->prefix, &id, TIER_LEASE_BLOCKS, &lease_key) != 0)
        return true;
    int err = read_lease(tier, lease_key, &lease);
    free(lease_key);
    if (err == ENOENT)
        return false;
    return err != 0 || (lease_runs(&lease) && lease.first <= index &&
                        index <= lease.last);
}

int tier_await_block(struct tier *tier, const char *key, const char *etag,
                     uint64_t index, uint32_t len, char *scratch,
                     const char **data, double until)
{
    double pause = LEASE_POLL_FIRST;
    double looked = clock_monotonic_seconds();  /* (the claim read it) */
    int err;

    atomic_fetch_add(&tier->lease_waits, 1);
    for (;;) {
        err = get_block(tier, key, etag, index, len, scratch, data, false);
        if (err != ENOENT || skipped_now(tier))
            break;
        double now = clock_monotonic_seconds();
        double left = until - now;
        if (left <= 0)
            break;
        if (now - looked >= LEASE_RECHECK) {
            looked = now;
            if (!lease_still_covers(tier, key, etag, index))
                break;  /* claimed again by the caller */
        }
        sleep_seconds(pause < left ? pause : left);
        pause = pause * 2 < LEASE_POLL_MAX ? pause * 2 : LEASE_POLL_MAX;
    }
    if (err == 0)
        atomic_fetch_add(&tier->lease_waits_met, 1);
    return err;
}

/* Block INDEX of version ETAG of KEY will not reach the tier from this
 * node (its offer was dropped: the queue full, the block evicted, its
 * write failed; or its fetch from the origin failed: tier_forgo_blocks()).
 * If this node's running lease covers it, other nodes may be waiting for
 * it: the lease is given back, by a writer thread (lease_release()), so
 * that they claim the block now rather than when the lease runs out.
 * Not while the tier is skipped: no request goes there, and the waits
 * end with the lease. */
static void lease_give_back(struct tier *tier, const char *key,
                            const char *etag, uint64_t index)
{
    struct tier_block_id id = {tier->origin, key, etag, tier->block_size, index};
    struct tier_release *release = NULL;
    char *lease_key = NULL;

    if (skipped_now(tier) ||
        tier_lease_key(tier->prefix, &id, TIER_LEASE_BLOCKS, &lease_key) != 0)
        return;
    pthread_mutex_lock(&tier->lease_lock);
    struct own_lease *own = own_find_locked(tier, lease_key);
    bool give = own != NULL && !own->releasing && lease_runs(&own->lease) &&
                own->lease.first <= index && index <= own->lease.last &&
                (release = calloc(1, sizeof(*release))) != NULL;
    if (give)
        own->releasing = true;
    pthread_mutex_unlock(&tier->lease_lock);
    if (!give) {
        free(lease_key);
        return;
    }
    release->lease_key = lease_key;
    pthread_mutex_lock(&tier->lock);
    release->next = tier->releases;
    tier->releases = release;
    pthread_cond_signal(&tier->work);
    pthread_mutex_unlock(&tier->lock);
}

void tier_forgo_blocks(struct tier *tier, const char *key, const char *etag,
                       uint64_t first, uint64_t count)
{
    /* (per block: a run may span two groups; a lease marked already is
     * not marked again) */
    for (uint64_t index = first; index - first < count; index++)
        lease_give_back(tier, key, etag, index);
}

/* Give back this node's lease at LEASE_KEY (marked by lease_give_back()):
 * written as past its time, over its ETag where the server takes
 * If-Match (a lease another node took over meanwhile is left alone),
 * plainly else, and then only while renew_blind() would renew it. */
static void lease_release(struct tier *tier, const char *lease_key)
{
    struct claim_busy busy;
    struct lease own, released;

    claim_begin(tier, lease_key, &busy);
    pthread_mutex_lock(&tier->lease_lock);
    struct own_lease *known = own_find_locked(tier, lease_key);
    bool give = known != NULL && known->releasing;
    if (give) {
        own = known->lease;
        known->releasing = false;
    }
    pthread_mutex_unlock(&tier->lease_lock);
    if (give && renew_blind(tier, &own) && !skipped_now(tier) &&
        write_lease_over(tier, lease_key, &own, LEASE_GIVEN_BACK,
                         over_etag(tier, &own), &released) == 0)
        own_remember(tier, lease_key, &released);
    claim_end(tier, &busy);
}

/* ------------------------------------------------------------ writing */

/* An offered block of KEY (version ETAG), INDEX, not written: counted,
 * and the lease on it given back (lease_give_back()). */
static void offer_dropped(struct tier *tier, const char *key,
                          const char *etag, uint64_t index)
{
    atomic_fetch_add(&tier->put_dropped, 1);
    lease_give_back(tier, key, etag, index);
}

static void put_free(struct tier *tier, struct tier_put *put)
{
    if (put == NULL)
        return;
    cache_object_close(tier->cache, &put->object);
    free(put->key);
    free(put->etag);
    free(put);
}

void tier_offer_block(struct tier *tier, struct cache_object *object,
                      const char *key, const char *etag, uint64_t index)
{
    pthread_mutex_lock(&tier->lock);
    bool room = !tier->stopping && !skipped_now_locked(tier) &&
                tier->queued_blocks < tier->queue_limit;
    pthread_mutex_unlock(&tier->lock);
    struct tier_put *put = room ? calloc(1, sizeof(*put)) : NULL;
    if (put != NULL) {
        put->key = strdup(key);
        put->etag = strdup(etag);
        put->index = index;
        put->len = cache_object_block_len(object, index);
        put->object = cache_object_ref(tier->cache, object);
    }
    if (put == NULL || put->key == NULL || put->etag == NULL ||
        put->object == NULL) {
        offer_dropped(tier, key, etag, index);
        put_free(tier, put);
        return;
    }
    uint32_t len = put->len;
    pthread_mutex_lock(&tier->lock);
    bool take = !tier->stopping && !skipped_now_locked(tier) &&
                tier->queued_blocks < tier->queue_limit;
    if (take) {
        if (tier->tail != NULL)
            tier->tail->next = put;
        else
            tier->head = put;
        tier->tail = put;
        tier->queued_bytes += len;
        tier->queued_blocks++;
        pthread_cond_signal(&tier->work);
    }
    pthread_mutex_unlock(&tier->lock);
    if (!take) {
        offer_dropped(tier, key, etag, index);
        put_free(tier, put);
    }
}

/* Write one queued block, read back from the local cache into BUFFER
 * (block_size + TIER_HEADER_LEN bytes): framed, If-None-Match: *. */
static void write_block(struct tier *tier, struct tier_put *put, char *buffer)
{
    struct tier_block_id id = {tier->origin, put->key, put->etag,
                               tier->block_size, put->index};
    struct s3_put_meta meta = {.if_none_match = atomic_load(&tier->conditional)};
    struct s3_body body = {.data = buffer, .fd = -1,
                           .length = (uint64_t)put->len + TIER_HEADER_LEN};
    char *tier_key = NULL;

    if (cache_block_read(tier->cache, put->object, put->index, 0, put->len,
                         buffer + TIER_HEADER_LEN, false) != 0) {
        offer_dropped(tier, put->key, put->etag, put->index); /* evicted */
        return;
    }
    int err = tier_frame_header(&id, buffer + TIER_HEADER_LEN, put->len,
                                (unsigned char *)buffer);

    double sent = clock_monotonic_seconds();

    if (err == 0)
        err = tier_block_key(tier->prefix, &id, &tier_key);
    if (err == 0 && meta.if_none_match && damaged_take(tier, tier_key))
        meta.if_none_match = false; /* replace what does not verify */
    if (err == 0)
        err = s3_put_object(tier->s3, tier_key, &body, &meta, NULL);
    if (err == ENOSYS && meta.if_none_match) {
        /* (Swift's s3api answers 501 to If-None-Match on a PUT) */
        if (atomic_exchange(&tier->conditional, false))
            log_info("shared cache: the server does not take conditional "
                     "writes; of nodes writing one block at once the last "
                     "wins (the same bytes)");
        meta.if_none_match = false;
        err = s3_put_object(tier->s3, tier_key, &body, &meta, NULL);
    }
    if (err == 0) {
        atomic_fetch_add(&tier->puts, 1);
        atomic_fetch_add(&tier->put_bytes, put->len);
        note_success(tier, true);
    } else if (err == ESTALE) {
        atomic_fetch_add(&tier->put_exists, 1); /* another node was first */
        note_success(tier, true);
    } else {
        note_failure(tier, "a write", true, err, sent);
        offer_dropped(tier, put->key, put->etag, put->index);
    }
    free(tier_key);
}

/* While the tier is skipped: whether a probe is due now (then this
 * thread runs it), else in *WAKE when one will be (0: none). */
static bool probe_due_locked(struct tier *tier, double *wake)
{
    *wake = 0;
    if (tier->probe_every <= 0 || tier->probe_running ||
        !skipped_now_locked(tier))
        return false;
    if (clock_monotonic_seconds() >= tier->next_probe)
        return true;
    *wake = tier->next_probe;
    return false;
}

/* One probe of a skipped tier: a HEAD of a key no block has, or, when
 * the skip began with a write's failure (a tier whose writes stall may
 * answer reads), a PUT of that key (a few bytes). Any answer but an
 * error (to a HEAD, "no such key" too) ends the skip; its pause goes
 * back to the first on the next answer to a real request
 * (note_success()), so a tier that answers probes and fails requests
 * still backs off. Called and returns with the lock held. */
static void probe_locked(struct tier *tier)
{
    struct s3_object_info info;
    struct s3_body body = {.data = "alive\n", .fd = -1, .length = 6};
    bool write = tier->probe_writes;
    char *key = NULL;
    int err = ENOMEM;

    tier->probe_running = true;
    pthread_mutex_unlock(&tier->lock);
    if (asprintf(&key, "%s%salive", tier->prefix, TIER_ROOT) >= 0)
        err = write ? s3_put_object(tier->s3, key, &body, NULL, NULL)
                    : s3_head_object(tier->s3, key, &info);
    free(key);
    pthread_mutex_lock(&tier->lock);
    tier->probe_running = false;
    double now = clock_monotonic_seconds();
    tier->next_probe = now + tier->probe_every;
    if ((err == 0 || (err == ENOENT && !write)) && skipped_now_locked(tier)) {
        tier->skip_until = now;   /* (> 0: note_success() resets the pause) */
        log_debug("shared cache: a probe was answered; asking it again");
    }
}

static void *writer_main(void *arg)
{
    struct tier *tier = arg;
    char *buffer = malloc((size_t)tier->block_size + TIER_HEADER_LEN);

    pthread_mutex_lock(&tier->lock);
    for (;;) {
        while (!tier->stopping && tier->head == NULL &&
               tier->releases == NULL) {
            double wake;
            if (probe_due_locked(tier, &wake)) {
                probe_locked(tier);
                continue;
            }
            if (wake == 0) {
                pthread_cond_wait(&tier->work, &tier->lock);
            } else {
                struct timespec at = clock_monotonic_after(
                    wake - clock_monotonic_seconds());
                pthread_cond_timedwait(&tier->work, &tier->lock, &at);
            }
        }
        if (tier->stopping)
            break;
        if (tier->releases != NULL) {   /* first: nodes may be waiting */
            struct tier_release *release = tier->releases;
            tier->releases = release->next;
            tier->writing++;
            pthread_mutex_unlock(&tier->lock);
            lease_release(tier, release->lease_key);
            free(release->lease_key);
            free(release);
            pthread_mutex_lock(&tier->lock);
            tier->writing--;
            if (tier->head == NULL && tier->releases == NULL &&
                tier->writing == 0)
                pthread_cond_broadcast(&tier->idle);
            continue;
        }
        struct tier_put *put = tier->head;
        tier->head = put->next;
        if (tier->head == NULL)
            tier->tail = NULL;
        bool skipped = skipped_now_locked(tier);
        tier->writing++;
        pthread_mutex_unlock(&tier->lock);
        if (skipped || buffer == NULL)
            offer_dropped(tier, put->key, put->etag, put->index);
        else
            write_block(tier, put, buffer);
        uint32_t len = put->len;
        put_free(tier, put);
        pthread_mutex_lock(&tier->lock);
        tier->writing--;
        tier->queued_bytes -= len;
        tier->queued_blocks--;
        if (tier->head == NULL && tier->releases == NULL &&
            tier->writing == 0)
            pthread_cond_broadcast(&tier->idle);
    }
    pthread_mutex_unlock(&tier->lock);
    free(buffer);
    return NULL;
}

bool tier_flush(struct tier *tier, double seconds)
{
    struct timespec deadline = clock_monotonic_after(seconds > 0 ? seconds : 0);

    pthread_mutex_lock(&tier->lock);
    while (!tier->stopping && (tier->head != NULL || tier->releases != NULL ||
                               tier->writing > 0)) {
        if (seconds <= 0)
            pthread_cond_wait(&tier->idle, &tier->lock);
        else if (pthread_cond_timedwait(&tier->idle, &tier->lock, &deadline) ==
                 ETIMEDOUT)
            break;
    }
    bool empty = tier->head == NULL && tier->releases == NULL &&
                 tier->writing == 0;
    pthread_mutex_unlock(&tier->lock);
    return empty;
}

/* ------------------------------------------------------------ the rest */

int tier_create(const struct tier_conf *conf, struct tier **out)
{
    struct tier *tier;
    int err = 0;

    *out = NULL;
    if (conf->s3 == NULL || conf->cache == NULL || conf->origin == NULL ||
        conf->block_size == 0)
        return EINVAL;
    tier = calloc(1, sizeof(*tier));
    if (tier == NULL)
        return ENOMEM;
    tier->s3 = conf->s3;
    tier->cache = conf->cache;
    tier->prefix = strdup(conf->prefix != NULL ? conf->prefix : "");
    tier->origin = strdup(conf->origin);
    tier->block_size = conf->block_size;
    tier->queue_limit = conf->queue_blocks ? conf->queue_blocks : TIER_QUEUE_BLOCKS;
    tier->skip_first = conf->skip_seconds > 0 ? conf->skip_seconds
                                              : TIER_SKIP_SECONDS;
    tier->skip_pause = tier->skip_first;
    tier->probe_every = conf->probe_seconds == 0 ? TIER_PROBE_SECONDS
                                                 : conf->probe_seconds;
    atomic_init(&tier->conditional, true);
    atomic_init(&tier->lease_mode, TIER_LEASES_UNKNOWN);
    tier->node = node_token();
    pthread_mutex_init(&tier->lock, NULL);
    pthread_mutex_init(&tier->lease_lock, NULL);
    pthread_cond_init(&tier->claim_done, NULL);
    pthread_cond_init(&tier->probed, NULL);
    pthread_condattr_t monotonic;       /* (tier_flush and the writers'
                                           probes wait with deadlines) */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&tier->work, &monotonic);
    pthread_cond_init(&tier->idle, &monotonic);
    pthread_condattr_destroy(&monotonic);
    if (tier->prefix == NULL || tier->origin == NULL)
        err = ENOMEM;
    for (unsigned i = 0; err == 0 && i < TIER_WRITERS; i++) {
        err = pthread_create(&tier->writers[i], NULL, writer_main, tier);
        if (err == 0)
            tier->writer_count++;
    }
    if (err != 0) {
        tier_destroy(&tier);
        return err;
    }
    *out = tier;
    return 0;
}

void tier_destroy(struct tier **tierp)
{
    struct tier *tier = *tierp;

    if (tier == NULL)
        return;
    pthread_mutex_lock(&tier->lock);
    tier->stopping = true;
    pthread_cond_broadcast(&tier->work);
    pthread_cond_broadcast(&tier->idle);
    pthread_mutex_unlock(&tier->lock);
    for (unsigned i = 0; i < tier->writer_count; i++)
        pthread_join(tier->writers[i], NULL);
    while (tier->head != NULL) {
        struct tier_put *put = tier->head;
        tier->head = put->next;
        put_free(tier, put);
    }
    while (tier->releases != NULL) {    /* (they run out in a lease) */
        struct tier_release *release = tier->releases;
        tier->releases = release->next;
        free(release->lease_key);
        free(release);
    }
    pthread_cond_destroy(&tier->idle);
    pthread_cond_destroy(&tier->work);
    pthread_cond_destroy(&tier->probed);
    pthread_mutex_destroy(&tier->lock);
    pthread_mutex_destroy(&tier->lease_lock);
    pthread_cond_destroy(&tier->claim_done);
    for (unsigned i = 0; i < TIER_OWN_LEASES; i++)
        free(tier->own[i].key);
    free(tier->prefix);
    free(tier->origin);
    free(tier);
    *tierp = NULL;
}

void tier_get_stats(struct tier *tier, struct tier_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->hits = atomic_load(&tier->hits);
    out->hit_bytes = atomic_load(&tier->hit_bytes);
    out->misses = atomic_load(&tier->misses);
    out->bad = atomic_load(&tier->bad);
    out->errors = atomic_load(&tier->errors);
    out->skipped = atomic_load(&tier->skipped);
    out->puts = atomic_load(&tier->puts);
    out->put_bytes = atomic_load(&tier->put_bytes);
    out->put_exists = atomic_load(&tier->put_exists);
    out->put_dropped = atomic_load(&tier->put_dropped);
    out->leases = atomic_load(&tier->leases);
    out->lease_waits = atomic_load(&tier->lease_waits);
    out->lease_waits_met = atomic_load(&tier->lease_waits_met);
    out->lease_mode = atomic_load(&tier->lease_mode);
    pthread_mutex_lock(&tier->lock);
    out->queued_bytes = tier->queued_bytes;
    out->skipping = skipped_now_locked(tier);
    pthread_mutex_unlock(&tier->lock);
    s3_client_stats(tier->s3, &out->s3);
}
