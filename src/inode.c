/*
 * inode.c - inode table (see inode.h).
 *
 * Two search trees (POSIX tsearch) index the same inodes, by number and by
 * key. Inode numbers are never reused within a mount (a 64-bit counter), so
 * a stale number from the kernel can only miss, never hit another file.
 * Invariants, under the lock: every inode is in both trees; the root has
 * nlookup >= 1 forever; an inode with nlookup == 0 and pins == 0 is freed.
 */
#include "config.h"

#include "inode.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <search.h>
#include <stdlib.h>
#include <string.h>

struct inode_table {
    pthread_mutex_t lock;
    void *by_ino;         /* tsearch tree of struct inode *, by ino */
    void *by_key;         /* tsearch tree of struct inode *, by key */
    fuse_ino_t next_ino;
    size_t count;
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

static void inode_free(struct inode *inode)
{
    free(inode->key);
    free(inode->symlink_target);
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
        inode_free(inode);
        return NULL;
    }
    if (tsearch(inode, &table->by_key, compare_key) == NULL) {
        tdelete(inode, &table->by_ino, compare_ino);
        inode_free(inode);
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
    tdelete(inode, &table->by_key, compare_key);
    table->count--;
    inode_free(inode);
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
    inode_free(node);
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
    pthread_mutex_unlock(&table->lock);
}

void inode_table_wait(struct inode_table *table, pthread_cond_t *cond)
{
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
    pthread_mutex_unlock(&table->lock);
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
    pthread_mutex_unlock(&table->lock);
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
    pthread_mutex_unlock(&table->lock);
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
    pthread_mutex_unlock(&table->lock);
}

void inode_set_listing_locked(struct inode_table *table, struct inode *dir,
                              struct inode_listing *new_listing)
{
    (void)table;
    release_listing_locked(dir->listing);
    new_listing->refs = 1;
    dir->listing = new_listing;
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

size_t inode_table_count(struct inode_table *table)
{
    pthread_mutex_lock(&table->lock);
    size_t count = table->count;
    pthread_mutex_unlock(&table->lock);
    return count;
}
