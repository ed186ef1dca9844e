/*
 * inode.c - inode table (see inode.h).
 *
 * Two search trees (POSIX tsearch) index the same inodes, by number and by
 * key. Inode numbers are never reused within a mount (a 64-bit counter), so
 * a stale number from the kernel can only miss, never hit another file.
 * Invariants, under the lock: every inode is in the tree by number, and
 * in the tree by key unless it is unlinked (it keeps its last key); count is
 * the number of inodes; the root has nlookup >= 1 forever; an inode with
 * nlookup == 0 and pins == 0 is freed; an inode with a staged file
 * (wfile) is pinned by it, and the fs layer's users of that file are
 * counted only while it is there; handles open for writing are among the
 * handles open; a listing is referenced; a directory holds a listing
 * exactly when it is in the recency list of the listing budget, and the
 * table's charge is the sum of its directories'. Debug builds check them where
 * the lock is released (table_unlock): every inode while the table holds
 * at most CHECK_ALL_MAX, else at one release in count / CHECK_ALL_MAX.
 */
#include "config.h"

#include "fs/inode.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/invariant.h"

#define CHECK_ALL_MAX 512

struct inode_table {
    pthread_mutex_t lock;
    void *by_ino;         /* tsearch tree of struct inode *, by ino */
    void *by_key;         /* tsearch tree of struct inode *, by key */
    fuse_ino_t next_ino;
    size_t count;
    size_t unlocks;       /* releases of the lock (debug builds) */
    /* directories holding a listing, most recently used first, and what
     * their listings are charged (inode_table_set_listing_budget) */
    struct inode *listing_newest, *listing_oldest;
    size_t listing_bytes;
    size_t listing_budget; /* 0: no bound */
    uint64_t listings_evicted;
};

static int compare_ino(const void *a, const void *b)
{
    const struct inode *x = a, *y = b;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

static int compare_key(const void *a, const void *b)
{
    const struct inode *x = a, *y = b;
    return strcmp(x->key, y->key);
}

struct check_walk {
    const struct inode_table *table;
    size_t count;
    size_t listing_bytes;
};

static void check_inode(const void *node, VISIT which, void *arg)
{
    struct check_walk *walk = arg;
    const struct inode *inode = *(const struct inode *const *)node;

    if (which != postorder && which != leaf)
        return;
    walk->count++;
    const char *where = inode->key[0] ? inode->key : "the root";
    INVARIANT(inode->nlookup > 0 || inode->pins > 0, where);
    INVARIANT(inode->ino != FUSE_ROOT_ID || inode->nlookup > 0, where);
    void *by_key = inode->unlinked
                       ? NULL
                       : tfind(inode, &walk->table->by_key, compare_key);
    INVARIANT(inode->unlinked ||
                  (by_key != NULL && *(struct inode **)by_key == inode),
              where);
    INVARIANT(inode->wfile == NULL || inode->pins > 0, where);
    INVARIANT(inode->wfile != NULL || inode->wfile_users == 0, where);
    INVARIANT(inode->write_handles <= inode->open_handles, where);
    INVARIANT(inode->listing == NULL || inode->listing->refs > 0, where);
    INVARIANT((inode->listing != NULL) ==
                  (inode->listing_newer != NULL || inode->listing_older != NULL ||
                   walk->table->listing_newest == inode),
              where);
    if (inode->listing != NULL)
        walk->listing_bytes += inode->listing_bytes;
}

/* The invariants at the top of this file; lock held. */
static void check_table_locked(struct inode_table *table)
{
    size_t every = table->count / CHECK_ALL_MAX + 1;

    if (++table->unlocks % every != 0)
        return;
    struct check_walk walk = {table, 0, 0};
    twalk_r(table->by_ino, check_inode, &walk);
    INVARIANT(walk.count == table->count, "the inode table");
    INVARIANT(walk.listing_bytes == table->listing_bytes, "the listing charges");
}

/* Release the lock (after checking the invariants, in debug builds). */
static void table_unlock(struct inode_table *table)
{
    if (INVARIANTS_ON)
        check_table_locked(table);
    pthread_mutex_unlock(&table->lock);
}

/* kinds and their file type bits, in enum order */
static const uint32_t kind_types[] = {
    [INODE_DIR] = S_IFDIR, [INODE_FILE] = S_IFREG, [INODE_SYMLINK] = S_IFLNK,
    [INODE_FIFO] = S_IFIFO, [INODE_SOCKET] = S_IFSOCK,
    [INODE_CHARDEV] = S_IFCHR, [INODE_BLOCKDEV] = S_IFBLK,
};

enum inode_kind inode_kind_of_mode(uint32_t mode)
{
    for (size_t kind = 0; kind < sizeof(kind_types) / sizeof(kind_types[0]); kind++)
        if ((mode & S_IFMT) == kind_types[kind])
            return (enum inode_kind)kind;
    return INODE_FILE;
}

uint32_t inode_kind_type(enum inode_kind kind)
{
    return (size_t)kind < sizeof(kind_types) / sizeof(kind_types[0])
               ? kind_types[kind] : S_IFREG;
}

void inode_listing_free(struct inode_listing *listing)
{
    if (listing == NULL)
        return;
    for (size_t i = 0; i < listing->count; i++)
        free(listing->entries[i].name);
    free(listing->entries);
    free(listing);
}

static void release_listing_locked(struct inode_listing *listing)
{
    if (listing != NULL && --listing->refs == 0)
        inode_listing_free(listing);
}

struct inode_patch {
    struct inode_patch *next;
    bool removed;
    struct inode_attrs attrs;
    char name[];
};

static void free_patches(struct inode *dir)
{
    while (dir->patches != NULL) {
        struct inode_patch *next = dir->patches->next;
        free(dir->patches);
        dir->patches = next;
    }
}

/* What an entry named NAME adds to its listing's charge: the entry and
 * the name's allocation (with malloc's header). */
static size_t entry_charge(const char *name)
{
    return sizeof(struct inode_dirent) + strlen(name) + 1 + 2 * sizeof(size_t);
}

static size_t listing_charge(const struct inode_listing *listing)
{
    size_t bytes = sizeof(*listing);

    for (size_t i = 0; i < listing->count; i++)
        bytes += entry_charge(listing->entries[i].name);
    return bytes;
}

static void listing_unlink_locked(struct inode_table *table, struct inode *dir)
{
    if (dir->listing_newer != NULL)
        dir->listing_newer->listing_older = dir->listing_older;
    else if (table->listing_newest == dir)
        table->listing_newest = dir->listing_older;
    if (dir->listing_older != NULL)
        dir->listing_older->listing_newer = dir->listing_newer;
    else if (table->listing_oldest == dir)
        table->listing_oldest = dir->listing_newer;
    dir->listing_newer = dir->listing_older = NULL;
}

static void listing_link_newest_locked(struct inode_table *table, struct inode *dir)
{
    dir->listing_older = table->listing_newest;
    dir->listing_newer = NULL;
    if (table->listing_newest != NULL)
        table->listing_newest->listing_newer = dir;
    table->listing_newest = dir;
    if (table->listing_oldest == NULL)
        table->listing_oldest = dir;
}

/* DIR's listing is charged BYTES more (GROW) or less: a patch added or
 * removed an entry. */
static void charge_locked(struct inode_table *table, struct inode *dir,
                          size_t bytes, bool grow)
{
    dir->listing_bytes = grow ? dir->listing_bytes + bytes : dir->listing_bytes - bytes;
    table->listing_bytes = grow ? table->listing_bytes + bytes
                                : table->listing_bytes - bytes;
}

/* DIR lets its listing go (the caller sets the new one or NULL). */
static void listing_detach_locked(struct inode_table *table, struct inode *dir)
{
    if (dir->listing == NULL)
        return;
    listing_unlink_locked(table, dir);
    table->listing_bytes -= dir->listing_bytes;
    dir->listing_bytes = 0;
    release_listing_locked(dir->listing);
    dir->listing = NULL;
}

/* Drop the listings used least recently, but KEEP's, while over budget. */
static void listing_budget_locked(struct inode_table *table, const struct inode *keep)
{
    while (table->listing_budget != 0 &&
           table->listing_bytes > table->listing_budget &&
           table->listing_oldest != NULL && table->listing_oldest != keep) {
        struct inode *dir = table->listing_oldest;
        size_t count = dir->listing->count;
        listing_detach_locked(table, dir);
        dir->evicted_count = count > 0 ? count : 1;
        table->listings_evicted++;
    }
}

static void inode_free(struct inode_table *table, struct inode *inode)
{
    free_patches(inode);
    free(inode->key);
    free(inode->symlink_target);
    if (table != NULL)
        listing_detach_locked(table, inode);
    else
        release_listing_locked(inode->listing);
    free(inode);
}

static struct inode *inode_new_locked(struct inode_table *table, const char *key)
{
    struct inode *inode = calloc(1, sizeof(*inode));

    if (inode == NULL || (inode->key = strdup(key)) == NULL) {
        free(inode);
        return NULL;
    }
    inode->ino = table->next_ino++;
    if (tsearch(inode, &table->by_ino, compare_ino) == NULL) {
        inode_free(table, inode);
        return NULL;
    }
    if (tsearch(inode, &table->by_key, compare_key) == NULL) {
        tdelete(inode, &table->by_ino, compare_ino);
        inode_free(table, inode);
        return NULL;
    }
    table->count++;
    return inode;
}

static void maybe_free_locked(struct inode_table *table, struct inode *inode)
{
    if (inode->nlookup > 0 || inode->pins > 0)
        return;
    assert(inode->ino != FUSE_ROOT_ID);
    tdelete(inode, &table->by_ino, compare_ino);
    if (!inode->unlinked)
        tdelete(inode, &table->by_key, compare_key);
    table->count--;
    inode_free(table, inode);
}

int inode_table_create(const char *root_key, const struct inode_attrs *root,
                       struct inode_table **out)
{
    struct inode_table *table = calloc(1, sizeof(*table));

    *out = NULL;
    if (table == NULL)
        return ENOMEM;
    pthread_mutex_init(&table->lock, NULL);
    table->next_ino = FUSE_ROOT_ID;
    struct inode *inode = inode_new_locked(table, root_key);
    if (inode == NULL) {
        inode_table_destroy(&table);
        return ENOMEM;
    }
    inode->nlookup = 1;
    inode->attrs = *root;
    *out = table;
    return 0;
}

static void free_node(void *node)
{
    inode_free(NULL, node); /* the table goes too: no charges to keep */
}

static void no_free(void *node)
{
    (void)node;
}

void inode_table_destroy(struct inode_table **tablep)
{
    struct inode_table *table = *tablep;

    if (table == NULL)
        return;
    tdestroy(table->by_key, no_free);
    tdestroy(table->by_ino, free_node);
    pthread_mutex_destroy(&table->lock);
    free(table);
    *tablep = NULL;
}

void inode_table_lock(struct inode_table *table)
{
    pthread_mutex_lock(&table->lock);
}

void inode_table_unlock(struct inode_table *table)
{
    table_unlock(table);
}

void inode_table_wait(struct inode_table *table, pthread_cond_t *cond)
{
    if (INVARIANTS_ON)
        check_table_locked(table);
    pthread_cond_wait(cond, &table->lock);
}

struct inode *inode_get(struct inode_table *table, fuse_ino_t ino)
{
    struct inode probe = {.ino = ino};
    struct inode *inode = NULL;

    pthread_mutex_lock(&table->lock);
    void *found = tfind(&probe, &table->by_ino, compare_ino);
    if (found != NULL) {
        inode = *(struct inode **)found;
        inode->pins++;
    }
    table_unlock(table);
    return inode;
}

void inode_pin_locked(struct inode *inode)
{
    inode->pins++;
}

void inode_put(struct inode_table *table, struct inode *inode)
{
    if (inode == NULL)
        return;
    pthread_mutex_lock(&table->lock);
    assert(inode->pins > 0);
    inode->pins--;
    maybe_free_locked(table, inode);
    table_unlock(table);
}

struct inode *inode_ref_locked(struct inode_table *table, const char *key,
                               const struct inode_attrs *attrs)
{
    struct inode probe = {.key = (char *)key};
    struct inode *inode;
    void *found = tfind(&probe, &table->by_key, compare_key);

    if (found != NULL)
        inode = *(struct inode **)found;
    else if ((inode = inode_new_locked(table, key)) == NULL)
        return NULL;
    inode->nlookup++;
    if (attrs != NULL)
        inode_update_attrs_locked(inode, attrs);
    return inode;
}

struct inode *inode_find_locked(struct inode_table *table, const char *key)
{
    struct inode probe = {.key = (char *)key};
    void *found = tfind(&probe, &table->by_key, compare_key);
    return found != NULL ? *(struct inode **)found : NULL;
}

void inode_update_attrs_locked(struct inode *inode,
                               const struct inode_attrs *attrs)
{
    bool same_version = strcmp(inode->attrs.etag, attrs->etag) == 0;

    /* the object under the key is known now: it is what this file is (a
     * staged file's attributes are the writer's, never set here) */
    if (attrs->etag[0] != '\0' && inode->wfile == NULL)
        inode->object_unknown = false;

    if (!same_version) {
        free(inode->symlink_target);
        inode->symlink_target = NULL;
    }
    if (!attrs->headers_known && inode->attrs.headers_known && same_version) {
        inode->attrs.size = attrs->size;
        inode->attrs.fetched_at = attrs->fetched_at;
        return;
    }
    inode->attrs = *attrs;
}

void inode_forget(struct inode_table *table, fuse_ino_t ino, uint64_t n)
{
    struct inode probe = {.ino = ino};

    pthread_mutex_lock(&table->lock);
    void *found = tfind(&probe, &table->by_ino, compare_ino);
    if (found != NULL) {
        struct inode *inode = *(struct inode **)found;
        inode->nlookup = n >= inode->nlookup ? 0 : inode->nlookup - n;
        if (ino == FUSE_ROOT_ID && inode->nlookup == 0)
            inode->nlookup = 1;
        maybe_free_locked(table, inode);
    }
    table_unlock(table);
}

struct inode_listing *inode_listing_ref_locked(struct inode_listing *listing)
{
    if (listing != NULL)
        listing->refs++;
    return listing;
}

void inode_listing_put(struct inode_table *table, struct inode_listing *listing)
{
    if (listing == NULL)
        return;
    pthread_mutex_lock(&table->lock);
    release_listing_locked(listing);
    table_unlock(table);
}

void inode_set_listing_locked(struct inode_table *table, struct inode *dir,
                              struct inode_listing *new_listing)
{
    listing_detach_locked(table, dir);
    new_listing->refs = 1;
    dir->listing = new_listing;
    dir->listing_bytes = listing_charge(new_listing);
    dir->evicted_count = 0;
    table->listing_bytes += dir->listing_bytes;
    listing_link_newest_locked(table, dir);
    listing_budget_locked(table, dir);
}

void inode_drop_listing_locked(struct inode_table *table, struct inode *dir)
{
    listing_detach_locked(table, dir);
}

void inode_table_set_listing_budget(struct inode_table *table, size_t bytes)
{
    pthread_mutex_lock(&table->lock);
    table->listing_budget = bytes;
    listing_budget_locked(table, NULL);
    table_unlock(table);
}

struct inode_listing *inode_dir_listing_use_locked(struct inode_table *table,
                                                   struct inode *dir)
{
    if (table->listing_newest != dir) {
        listing_unlink_locked(table, dir);
        listing_link_newest_locked(table, dir);
    }
    return inode_listing_ref_locked(dir->listing);
}

void inode_table_listing_usage(struct inode_table *table, uint64_t *bytes,
                               uint64_t *evicted)
{
    pthread_mutex_lock(&table->lock);
    *bytes = table->listing_bytes;
    *evicted = table->listings_evicted;
    pthread_mutex_unlock(&table->lock);
}

static int compare_dirent(const void *a, const void *b)
{
    const char *name = a;
    const struct inode_dirent *entry = b;
    return strcmp(name, entry->name);
}

const struct inode_dirent *inode_listing_find(const struct inode_listing *listing,
                                              const char *name)
{
    if (listing == NULL || listing->count == 0)
        return NULL;
    return bsearch(name, listing->entries, listing->count,
                   sizeof(listing->entries[0]), compare_dirent);
}

char *inode_key_dup(struct inode_table *table, struct inode *inode)
{
    pthread_mutex_lock(&table->lock);
    char *key = strdup(inode->key);
    table_unlock(table);
    return key;
}

struct inode *inode_obtain_locked(struct inode_table *table, const char *key)
{
    struct inode *inode = inode_find_locked(table, key);

    if (inode == NULL)
        inode = inode_new_locked(table, key);
    if (inode != NULL)
        inode->pins++;
    return inode;
}

void inode_unlink_locked(struct inode_table *table, struct inode *inode)
{
    if (inode->unlinked || inode->ino == FUSE_ROOT_ID)
        return;
    tdelete(inode, &table->by_key, compare_key);
    inode->unlinked = true;
}

int inode_rekey_locked(struct inode_table *table, struct inode *inode,
                       const char *new_key)
{
    char *copy = strdup(new_key);

    if (copy == NULL)
        return ENOMEM;
    if (!inode->unlinked)
        tdelete(inode, &table->by_key, compare_key);
    struct inode *other = inode_find_locked(table, new_key);
    if (other != NULL)
        inode_unlink_locked(table, other);
    free(inode->key);
    inode->key = copy;
    inode->unlinked = false;
    if (tsearch(inode, &table->by_key, compare_key) == NULL) {
        inode->unlinked = true; /* out of memory: findable no more */
        return ENOMEM;
    }
    return 0;
}

struct prefix_visit {
    const char *prefix;
    size_t prefix_len;
    struct inode **found;
    size_t count, capacity;
    bool failed;
};

static void collect_prefix(const void *node, VISIT which, void *arg)
{
    if (which != postorder && which != leaf)
        return;
    struct inode *inode = *(struct inode *const *)node;
    struct prefix_visit *visit = arg;
    if (strncmp(inode->key, visit->prefix, visit->prefix_len) != 0)
        return;
    if (visit->count == visit->capacity) {
        size_t capacity = visit->capacity ? visit->capacity * 2 : 16;
        struct inode **grown = realloc(visit->found, capacity * sizeof(*grown));
        if (grown == NULL) {
            visit->failed = true;
            return;
        }
        visit->found = grown;
        visit->capacity = capacity;
    }
    visit->found[visit->count++] = inode;
}

static int find_prefix_locked(struct inode_table *table, const char *prefix,
                              struct prefix_visit *visit)
{
    *visit = (struct prefix_visit){.prefix = prefix, .prefix_len = strlen(prefix)};
    twalk_r(table->by_key, collect_prefix, visit);
    if (visit->failed) {
        free(visit->found);
        visit->found = NULL;
        return ENOMEM;
    }
    return 0;
}

int inode_find_prefix_locked(struct inode_table *table, const char *prefix,
                             struct inode ***found, size_t *count)
{
    struct prefix_visit visit;
    int err = find_prefix_locked(table, prefix, &visit);

    *found = visit.found;
    *count = err == 0 ? visit.count : 0;
    return err;
}

int inode_rekey_prefix_locked(struct inode_table *table, const char *old_prefix,
                              const char *new_prefix)
{
    struct prefix_visit visit;
    size_t old_len = strlen(old_prefix);
    int err = find_prefix_locked(table, old_prefix, &visit);

    for (size_t i = 0; err == 0 && i < visit.count; i++) {
        char *key = NULL;
        if (asprintf(&key, "%s%s", new_prefix, visit.found[i]->key + old_len) < 0)
            err = ENOMEM;
        else
            err = inode_rekey_locked(table, visit.found[i], key);
        free(key);
    }
    free(visit.found);
    return err;
}

static struct inode_listing *listing_copy(const struct inode_listing *listing)
{
    struct inode_listing *copy = calloc(1, sizeof(*copy));

    if (copy == NULL)
        return NULL;
    copy->fetched_at = listing->fetched_at;
    copy->entries = calloc(listing->count + 1, sizeof(copy->entries[0]));
    if (copy->entries == NULL) {
        free(copy);
        return NULL;
    }
    for (; copy->count < listing->count; copy->count++) {
        copy->entries[copy->count] = listing->entries[copy->count];
        copy->entries[copy->count].name = strdup(listing->entries[copy->count].name);
        if (copy->entries[copy->count].name == NULL) {
            inode_listing_free(copy);
            return NULL;
        }
    }
    return copy;
}

int inode_listing_patch_locked(struct inode_table *table, struct inode *dir,
                               const char *name, const struct inode_attrs *attrs)
{
    struct inode_listing *listing = dir->listing;

    if (dir->listing_fetch) {
        /* a LIST under way may not see this change: keep it for replay */
        size_t len = strlen(name) + 1;
        struct inode_patch *patch = malloc(sizeof(*patch) + len);
        if (patch != NULL) {
            patch->removed = attrs == NULL;
            if (attrs != NULL)
                patch->attrs = *attrs;
            memcpy(patch->name, name, len);
            patch->next = NULL;
            struct inode_patch **tail = &dir->patches;
            while (*tail != NULL)
                tail = &(*tail)->next;
            *tail = patch;
        }
    }
    if (listing == NULL)
        return 0;
    if (listing->refs > 1) { /* an open directory holds it: copy */
        listing = listing_copy(listing);
        if (listing == NULL) {
            listing_detach_locked(table, dir); /* listed again when next needed */
            return ENOMEM;
        }
        inode_set_listing_locked(table, dir, listing);
    }
    /* find NAME, or where it goes */
    size_t low = 0, high = listing->count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (strcmp(listing->entries[mid].name, name) < 0)
            low = mid + 1;
        else
            high = mid;
    }
    bool present = low < listing->count && strcmp(listing->entries[low].name, name) == 0;
    if (attrs == NULL) {
        if (present) {
            charge_locked(table, dir, entry_charge(listing->entries[low].name), false);
            free(listing->entries[low].name);
            memmove(&listing->entries[low], &listing->entries[low + 1],
                    (listing->count - low - 1) * sizeof(listing->entries[0]));
            listing->count--;
        }
        return 0;
    }
    if (present) {
        listing->entries[low].attrs = *attrs;
        return 0;
    }
    char *copy = strdup(name);
    struct inode_dirent *grown = realloc(listing->entries,
                                         (listing->count + 1) * sizeof(*grown));
    if (copy == NULL || grown == NULL) {
        free(copy);
        if (grown != NULL)
            listing->entries = grown;
        listing_detach_locked(table, dir);
        return ENOMEM;
    }
    listing->entries = grown;
    memmove(&listing->entries[low + 1], &listing->entries[low],
            (listing->count - low) * sizeof(listing->entries[0]));
    listing->entries[low] = (struct inode_dirent){copy, *attrs};
    listing->count++;
    charge_locked(table, dir, entry_charge(copy), true);
    return 0;
}

void inode_listing_forget_patches_locked(struct inode *dir)
{
    free_patches(dir);
}

void inode_listing_replay_locked(struct inode_table *table, struct inode *dir)
{
    struct inode_patch *patches = dir->patches;

    dir->patches = NULL; /* not recorded again while replayed */
    for (struct inode_patch *patch = patches; patch != NULL; patch = patch->next)
        inode_listing_patch_locked(table, dir, patch->name,
                                   patch->removed ? NULL : &patch->attrs);
    dir->patches = patches;
    free_patches(dir);
}

size_t inode_table_count(struct inode_table *table)
{
    pthread_mutex_lock(&table->lock);
    size_t count = table->count;
    table_unlock(table);
    return count;
}
