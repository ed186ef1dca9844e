/*
 * cache.h - the block cache: object data on local disk, indexed in LMDB.
 *
 * Layout of the cache directory (see HACKING.md for the reasons):
 *   lock            flock()ed by the mount using the directory; holds its pid
 *   index/          LMDB environment (db.h): versions, blocks, recency
 *   data/XX/ID      one sparse file per object version; block N of the
 *                   object lives at offset N * block_size
 *
 * An object version is (bucket, key, ETag, size): a new ETag for a key gets
 * a new version and the old one's blocks are dropped, so data of an old
 * ETag is never served for a new one. Each block is recorded with its
 * length and one XXH3-64 checksum per 64 KiB piece; every read verifies the
 * pieces it touches, so bit rot, a truncated or deleted data file, or a
 * block half-written before a crash is noticed, logged, dropped and fetched
 * again: wrong bytes never reach a reader.
 *
 * Pins: a pinned version (cache_pin_version(), for model weights) is
 * never evicted; pinned versions take at most half of cache_size.
 *
 * Holds: a block whose pages a pipe holds for a read not yet answered
 * (cache_block_splice()) is held until the caller lets it go
 * (cache_holds_release()), once the answer has left. A held block is
 * never punched (a punch zeroes in place what it cuts of a page or a
 * large folio, the pipe's bytes with them) and eviction passes it by;
 * dropped from the index meanwhile (the key evicted, a damaged block),
 * its space comes back at the last release, unless a fill of the block
 * took it over.
 *
 * Bounds: the bytes recorded (rounded up to 4 KiB) stay under cache_size
 * and the filesystem's free space over min_free; room is made before a
 * block is written, by evicting the least recently used blocks. Eviction
 * resists scans: blocks enter a probation segment and move to a protected
 * one when read again from the cache; probation is evicted first, and the
 * protected segment is held to 80% of cache_size.
 *
 * Crash safety: the index is written without fsync (MDB_NOSYNC), so a kill
 * -9 loses nothing committed. After a system crash the index may be
 * damaged; the cache records the boot it was last opened in and whether it
 * was closed cleanly, and rebuilds itself empty when both say it may be.
 *
 * Threads: every function may be called from any thread. Index
 * transactions are short and never span network I/O; block data is
 * written and read with pwrite/pread outside any lock.
 *
 * Implemented in cache_store.c (the index, data files, holds),
 * cache_policy.c (room, eviction, recency, the flusher), cache.c
 * (objects, reading, filling), cache_adopt.c (the write path's calls)
 * and cache_dir.c (the directory, cache_open/cache_close);
 * cache_internal.h is what they share, and says which file does what.
 */
#ifndef S3CFS_CACHE_H
#define S3CFS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct db;

/* Checksummed unit inside a block. */
#define CACHE_PIECE_SIZE (64u << 10)
#define CACHE_MIN_BLOCK_SIZE CACHE_PIECE_SIZE
#define CACHE_MAX_BLOCK_SIZE (64u << 20)
#define CACHE_DEFAULT_BLOCK_SIZE (1u << 20)

struct cache_conf {
    const char *dir;          /* created if missing */
    const char *bucket;       /* namespace of keys in the index */
    uint64_t size_limit;      /* cache_size, bytes */
    uint64_t min_free_bytes;  /* keep this much free on the filesystem ... */
    double min_free_ratio;    /* ... and this fraction of it (0..1) */
    uint32_t block_size;      /* power of two, 64 KiB .. 64 MiB */
};

struct cache_stats {
    uint64_t used_bytes;          /* recorded, rounded to 4 KiB */
    uint64_t index_bytes;         /* the index file's pages in use (not
                                     under size_limit) */
    uint64_t protected_bytes;     /* of which read again (kept longest) */
    uint64_t pinned_bytes;        /* the pinned versions' sizes together,
                                     each rounded up to 4 KiB */
    uint64_t size_limit;
    uint64_t blocks;              /* blocks recorded */
    uint64_t served_bytes;        /* bytes read from the cache (fetched
                                     ones included) */
    uint64_t unhashed_bytes;      /* of served_bytes, those spliced
                                     without a second hash: the bytes this
                                     process had just written, not yet
                                     written back (cache_block_splice()) */
    uint64_t stored_bytes;        /* bytes written into the cache */
    uint64_t evicted_blocks;
    uint64_t corrupt_blocks;      /* failed a checksum or short read */
};

struct cache;
struct cache_object;  /* an open object version, reference-counted */
struct cache_fill;    /* a block being written */
struct cache_holds;   /* blocks held for reads not yet answered */

/*
 * Take the directory's lock (EWOULDBLOCK when another mount holds it, with
 * the holder in ERRBUF). Call before daemonizing: the lock is kept across
 * fork. Returns 0 and an open lock in *lock_fd, or an errno + sentence.
 */
int cache_lock_dir(const char *dir, int *lock_fd, char *errbuf, size_t errlen);

/*
 * Whose a cache directory is: the endpoint (endpoint_identity()), the
 * bucket and the mount's prefix in it. Recorded in CACHE/identity when the
 * directory is first claimed, so that what the cache holds of one bucket
 * (blocks, listings, headers) is never served for another, and what its
 * journal holds is never uploaded into another (see cache_dir_claim()).
 */
struct cache_identity {
    const char *endpoint;     /* "https://s3.us-east-1.amazonaws.com" */
    const char *bucket;
    const char *prefix;       /* "" for the whole bucket */
};

/*
 * Bind the cache directory DIR (locked by this process: cache_lock_dir())
 * to MINE, before cache_open(). PENDING is what the directory's journal
 * and staging files still owe to a bucket (journal_peek()).
 *   - No record (a new directory, or one made by an older s3cachefs,
 *     whose index already names keys by their bucket): MINE is recorded.
 *   - A record of MINE: nothing changes.
 *   - Another identity and PENDING > 0: refused (EEXIST) with one
 *     sentence in ERRBUF naming both identities and the way out.
 *   - MINE's endpoint and bucket, another prefix: MINE is recorded; every
 *     block and listing is of keys of this bucket, and stays.
 *   - Another endpoint or bucket (or a record that does not parse): the
 *     index and the data files are emptied (one log line naming both),
 *     then MINE is recorded. Staging and journal files are never touched.
 *   - A record that cannot be read (EIO, EACCES...): that errno, with a
 *     sentence; nothing is emptied.
 * The record is written durably (file and directory fsynced) after the
 * emptying, so a crash in between empties again at the next mount.
 * Returns 0, EEXIST, or an errno with a sentence in ERRBUF.
 */
int cache_dir_claim(const char *dir, const struct cache_identity *mine,
                    uint64_t pending, char *errbuf, size_t errlen);

/*
 * Whether DIR may be used for MINE without emptying: it has no identity
 * record, or one of MINE's endpoint and bucket (any prefix). For the
 * default cache directory of older versions (one per bucket name).
 */
bool cache_dir_is_for(const char *dir, const struct cache_identity *mine);

/*
 * Open the cache in CONF->dir, whose lock LOCK_FD this process holds
 * (ownership passes to the cache). Opens the index after daemonizing
 * (LMDB must not cross fork). A changed block size empties the cache.
 * Returns 0, or an errno with a sentence in ERRBUF.
 */
int cache_open(const struct cache_conf *conf, int lock_fd, struct cache **out,
               char *errbuf, size_t errlen);

/* Record a clean shutdown, close everything; *cache = NULL. Safe twice. */
void cache_close(struct cache **cache);

void cache_get_stats(struct cache *cache, struct cache_stats *out);

uint32_t cache_block_size(const struct cache *cache);

/*
 * The version (KEY, ETAG, SIZE): found, or created (dropping blocks of any
 * other version of KEY). Returns 0 and a reference in *out, or an errno.
 */
int cache_object_open(struct cache *cache, const char *key, const char *etag,
                      uint64_t size, struct cache_object **out);

/* Another reference to OBJECT (for a background job). */
struct cache_object *cache_object_ref(struct cache *cache,
                                      struct cache_object *object);

/* Drop a reference; *object = NULL. Safe on NULL. */
void cache_object_close(struct cache *cache, struct cache_object **object);

/* The version's id in the index (stable while the version is cached). */
uint64_t cache_object_id(const struct cache_object *object);

/* Number of blocks of the object (0 for an empty object). */
uint64_t cache_object_blocks(const struct cache_object *object);

/* Length of block BLOCK of the object (the last one may be short). */
uint32_t cache_object_block_len(const struct cache_object *object,
                                uint64_t block);

/* Whether BLOCK is recorded (not verified: for planning fetches only). */
bool cache_block_present(struct cache *cache, struct cache_object *object,
                         uint64_t block);

/* The bytes of OBJECT's blocks recorded now (not verified), into
 * *BYTES. 0 or the index's errno. */
int cache_object_cached_bytes(struct cache *cache, struct cache_object *object,
                              uint64_t *bytes);

/*
 * The bytes recorded of version (KEY, ETAG, SIZE) into *BYTES: 0 when
 * another version of KEY, or none, is cached. Reads the index only: it
 * creates no version and drops none (`s3cachefs warm --check`). 0, or
 * the index's errno.
 */
int cache_version_cached_bytes(struct cache *cache, const char *key,
                               const char *etag, uint64_t size, uint64_t *bytes,
                               bool *pinned);

/* The most the pinned versions may take together: PIN_SHARE (half) of
 * cache_size, so that eviction always has the other half to work with. */
uint64_t cache_pin_max(const struct cache *cache);

/*
 * Pin (PIN) or unpin version (KEY, ETAG, SIZE). A pinned version's blocks
 * are never evicted (those it has and those fetched later) and the pin is
 * kept in the index, across remounts; the pinned versions' sizes together
 * stay within cache_pin_max(). A pin makes the version the cached one
 * (dropping another version of KEY, as an open does) so that what is
 * fetched next is pinned as it comes; a new version of KEY (the object
 * changed) is not pinned, and dropping a pinned version (a new ETag
 * opened, cache_evict_key(), cache_forget_key()) ends its pin. An unpin
 * puts its blocks back at the recent end of probation. *PINNED_TOTAL
 * gets the sum of the pinned versions' sizes afterwards. 0 (also: unpin
 * of a version not pinned or not cached); ENOSPC: pinning it would pass
 * cache_pin_max() (nothing changed); EINVAL (an ETag too long), ENOMEM,
 * EIO.
 */
int cache_pin_version(struct cache *cache, const char *key, const char *etag,
                      uint64_t size, bool pin, uint64_t *pinned_total);

/*
 * Drop every cached block of KEY's version (whichever ETag is cached), as
 * eviction would: *FREED gets the bytes of the blocks dropped. Handles
 * open on the version stay valid and fetch what they read again; the
 * version's record goes when none is open; a pinned version is
 * unpinned. Staged data is not the cache's: nothing under staging/ is
 * touched. 0 (also when nothing was
 * cached), ENOMEM or EIO.
 */
int cache_evict_key(struct cache *cache, const char *key, uint64_t *freed);

/*
 * Copy LEN bytes at OFFSET inside block BLOCK into BUF, verifying the
 * checksums of the pieces read. Returns 0, ENOENT (not cached, or it was
 * corrupt and has been dropped), or an I/O errno; on failure BUF may hold
 * anything (unverified bytes among them). REUSE says the block is
 * being read again: the reader did not fetch it and had not read it just
 * before. Such a read updates the block's recency and moves it to the
 * protected segment; data read right after its fetch stays in probation,
 * which is what lets one pass over a big dataset evict only itself.
 */
int cache_block_read(struct cache *cache, struct cache_object *object,
                     uint64_t block, uint32_t offset, uint32_t len, char *buf,
                     bool reuse);

/*
 * The zero-copy form of cache_block_read(): splice LEN bytes at OFFSET
 * inside block BLOCK into the pipe PIPE_WRITE, after what it holds,
 * without copying them through this process. The pieces they lie in are
 * verified where they are (a mapping of the data file's page cache,
 * hashed in place) after the splice took its references to those pages,
 * and the block's record is read again afterwards: a block dropped or
 * replaced meanwhile (whose pages the pipe may not share any more) does
 * not count. They are not hashed a second time when they provably are
 * the bytes this process wrote: the block is one of the last it filled,
 * its record unchanged since, and every page of the pieces is still
 * dirty or under writeback (cachestat(2): never read back from the disk
 * since it was written); those bytes count in unhashed_bytes. The block
 * is held in HOLDS (see "Holds" above) whenever bytes of it went into the
 * pipe, whatever the result: release HOLDS after the pipe is read out or
 * closed. Returns 0; ENOENT (not cached, or damaged and dropped, with
 * nothing added to the pipe); EAGAIN (bytes were added, and then the
 * block was found damaged, dropped or replaced: what the pipe holds is
 * to be discarded, and the read made again); ENOBUFS (the pipe is full:
 * it holds part of the bytes; or HOLDS is full or no memory for the
 * hold, with nothing added); or an I/O errno (the pipe may hold part of
 * them).
 */
int cache_block_splice(struct cache *cache, struct cache_object *object,
                       uint64_t block, uint32_t offset, uint32_t len,
                       int pipe_write, bool reuse, struct cache_holds *holds);

/* The most blocks one set of holds takes: a read answered from a pipe of
 * at most 2 MiB spans at most 33 blocks of 64 KiB. */
#define CACHE_HOLDS_MAX 40

/*
 * The blocks a read's pipe holds pages of, until its answer has left:
 * the caller's (zeroed: empty; no allocation), filled by
 * cache_block_splice(), emptied by cache_holds_release().
 */
struct cache_holds {
    struct cache *cache;         /* set by the first hold */
    unsigned count;
    struct {
        uint64_t id;
        uint64_t block;
    } held[CACHE_HOLDS_MAX];
};

/*
 * Let go of the blocks HOLDS holds: call once the pipe they went into is
 * read out (the answer has left) or closed. A held block dropped
 * meanwhile gets its space back here (a punch: disk I/O) at the last
 * release. HOLDS is empty afterwards; an empty one is fine.
 */
void cache_holds_release(struct cache_holds *holds);

/*
 * Start writing block BLOCK: makes room first (evicting, or ENOSPC when
 * nothing can be evicted). Data then arrives in order through
 * cache_fill_write() and is recorded by cache_fill_commit() once the whole
 * block is there; cache_fill_abort() forgets it.
 */
int cache_fill_begin(struct cache *cache, struct cache_object *object,
                     uint64_t block, struct cache_fill **out);
int cache_fill_write(struct cache_fill *fill, const void *data, size_t len);
int cache_fill_commit(struct cache_fill **fill);
void cache_fill_abort(struct cache_fill **fill);

/* The index environment, for the metadata cache that shares it
 * (metacache.h); owned by the cache. */
struct db *cache_index(struct cache *cache);

/* SHA-256 of "BUCKET NUL NAME" into OUT (32 bytes): how the index names
 * keys and prefixes. 0, ENOMEM or EIO. */
int cache_name_hash(const struct cache *cache, const char *name,
                    unsigned char *out);

/* Write recency updates and flush the index (the background flusher
 * calls this every second; tests call it directly). */
int cache_flush(struct cache *cache);

/*
 * Notes the layers above keep with the cache, so that they last as long
 * as it does (the counters since the cache was created, lifetime.h):
 * NAME's text into *TEXT (malloc'd, NUL-terminated), or ENOENT if none;
 * and NAME's text set. Names are the caller's, prefixed "note:" in the
 * index. 0 or an errno.
 */
int cache_note_get(struct cache *cache, const char *name, char **text);
int cache_note_put(struct cache *cache, const char *name, const char *text);

/* ------------------------------------------------ the write path's needs */

/* Whether the last mount on this cache directory ended without closing it
 * (kill -9, a crash): what it stored of the bucket's state (listings) may
 * have been overtaken by changes it made and did not record. */
bool cache_left_open(const struct cache *cache);

/* The cache directory, as opened (staging files and the journal live in
 * it: CACHE/staging, CACHE/journal; the cache never removes them, not
 * even when it rebuilds its index). Valid until cache_close(). */
const char *cache_dir_path(const struct cache *cache);

/*
 * Make sure BYTES more can be written to the cache's filesystem outside
 * the block cache (staging files of writes) and still leave min_free
 * free, evicting clean blocks as needed (least recently used first,
 * probation before protected; nothing but cached blocks is ever removed).
 * Nothing is reserved: call it before each step of a few MiB (it costs a
 * statvfs). ENOSPC when that cannot be done even by evicting every block
 * (not logged: see cache_disk_full()).
 */
int cache_reserve_disk(struct cache *cache, uint64_t bytes);

/* Say that the cache directory's file system is full (a write to it
 * failed with ENOSPC, or cache_reserve_disk() did): one line naming the
 * directory, its free space and what cache_min_free keeps, once a minute
 * at most. Fills of blocks and adoptions say it themselves. */
void cache_disk_full(struct cache *cache);

/*
 * Enter the file at PATH (on the cache's filesystem), which holds the
 * whole version KEY/ETAG of SIZE bytes laid out as the object, into the
 * cache as that version: it is renamed into data/ and every block is
 * recorded with its checksums, in probation, making room under
 * cache_size as fills do (its bytes are on disk already, so min_free is
 * not asked for them again). Other versions of KEY are dropped, the
 * version KEY/ETAG itself too if it was cached (readers holding it get
 * ENOENT and reopen). PATH must not change during the call. Returns 0
 * (PATH is gone), or: EINVAL (PATH is not a regular file of SIZE bytes,
 * or the ETag is too long), ENOSPC (cache_size cannot hold it), EXDEV,
 * EIO... and then PATH stays where it was and the caller removes it.
 * After a kill -9 during the call, PATH may be gone (the cache removes
 * what it took at the next cache_open): call it only once the upload no
 * longer needs the file.
 */
int cache_adopt_file(struct cache *cache, const char *key, const char *etag,
                     uint64_t size, const char *path);

/*
 * The object KEY/ETAG was copied server-side to NEW_KEY with ETag
 * NEW_ETAG (a rename): its cached blocks now belong to NEW_KEY/NEW_ETAG
 * (no data is copied; other versions of NEW_KEY are dropped; KEY has
 * nothing cached afterwards). A handle open on the version under KEY
 * keeps reading the same blocks. 0, or ENOENT when KEY/ETAG is not
 * cached, EINVAL for an ETag too long, EIO.
 */
int cache_rename_object(struct cache *cache, const char *key, const char *etag,
                        const char *new_key, const char *new_etag);

/* Drop every cached block of KEY (the object was deleted); handles open
 * on it read ENOENT from now on. 0 (also when nothing was cached) or
 * EIO. */
int cache_forget_key(struct cache *cache, const char *key);

#endif /* S3CFS_CACHE_H */
