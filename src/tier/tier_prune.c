/*
 * tier_prune.c - choosing the versions a prune deletes (see
 * tier_prune.h).
 */
#include "config.h"

#include "tier/tier_prune.h"

#include <errno.h>
#include <search.h>
#include <stdlib.h>
#include <string.h>

/* The version directory of KEY ("HEX/..." with 64 lowercase hex digits
 * and a block name "SIZE-INDEX"), or false. */
static bool version_of(const char *key, char *hex)
{
    size_t i = 0;

    for (; i < TIER_VERSION_HEX; i++) {
        char c = key[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        hex[i] = c;
    }
    hex[i] = '\0';
    const char *name = key + TIER_VERSION_HEX;
    if (name[0] != '/' || strchr(name + 1, '/') != NULL)
        return false;
    if (strncmp(name + 1, "lease-", 6) == 0)
        name += 6;   /* a lease on a group of blocks goes with them */
    if (name[1] < '0' || name[1] > '9')
        return false;
    size_t digits = strspn(name + 1, "0123456789");
    return name[1 + digits] == '-' && name[2 + digits] >= '0' &&
           name[2 + digits] <= '9' &&
           strspn(name + 2 + digits, "0123456789") == strlen(name + 2 + digits);
}

static int by_hex(const void *a, const void *b)
{
    return strcmp(((const struct tier_prune_version *)a)->hex,
                  ((const struct tier_prune_version *)b)->hex);
}

int tier_prune_add(struct tier_prune *prune, const char *key, uint64_t size,
                   double mtime)
{
    struct tier_prune_version probe, *version;

    if (!version_of(key, probe.hex)) {
        prune->ignored++;
        return 0;
    }
    void *found = tfind(&probe, &prune->index, by_hex);
    if (found != NULL) {
        version = *(struct tier_prune_version **)found;
    } else {
        if (prune->count == prune->cap) {
            size_t cap = prune->cap ? 2 * prune->cap : 64;
            void *grown = realloc(prune->versions, cap * sizeof(*prune->versions));
            if (grown == NULL)
                return ENOMEM;
            prune->versions = grown;
            prune->cap = cap;
        }
        version = calloc(1, sizeof(*version));
        if (version == NULL)
            return ENOMEM;
        memcpy(version->hex, probe.hex, sizeof(probe.hex));
        if (tsearch(version, &prune->index, by_hex) == NULL) {
            free(version);
            return ENOMEM;
        }
        prune->versions[prune->count++] = version;
    }
    version->bytes += size;
    version->objects++;
    if (mtime > version->newest)
        version->newest = mtime;
    return 0;
}

static int by_age(const void *a, const void *b)
{
    const struct tier_prune_version *x = *(const struct tier_prune_version *const *)a;
    const struct tier_prune_version *y = *(const struct tier_prune_version *const *)b;
    if (x->newest != y->newest)
        return x->newest < y->newest ? -1 : 1;
    return strcmp(x->hex, y->hex);
}

void tier_prune_choose(struct tier_prune *prune, double now, double max_age,
                       uint64_t max_bytes)
{
    uint64_t left = 0;

    for (size_t i = 0; i < prune->count; i++) {
        struct tier_prune_version *version = prune->versions[i];
        version->chosen = max_age > 0 && now - version->newest > max_age;
        if (!version->chosen)
            left += version->bytes;
    }
    if (max_bytes == 0 || left <= max_bytes)
        return;
    /* oldest first (the array's order is only for this) */
    qsort(prune->versions, prune->count, sizeof(*prune->versions), by_age);
    for (size_t i = 0; i < prune->count && left > max_bytes; i++)
        if (!prune->versions[i]->chosen) {
            prune->versions[i]->chosen = true;
            left -= prune->versions[i]->bytes;
        }
}

bool tier_prune_chosen(const struct tier_prune *prune, const char *key)
{
    struct tier_prune_version probe;

    if (!version_of(key, probe.hex))
        return false;
    void *found = tfind(&probe, (void *const *)&prune->index, by_hex);
    return found != NULL && (*(struct tier_prune_version **)found)->chosen;
}

static void no_free(void *node)
{
    (void)node;
}

void tier_prune_free(struct tier_prune *prune)
{
    tdestroy(prune->index, no_free);
    for (size_t i = 0; i < prune->count; i++)
        free(prune->versions[i]);
    free(prune->versions);
    memset(prune, 0, sizeof(*prune));
}
