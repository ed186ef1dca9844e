/*
 * secret.c - memory for credentials kept out of core dumps (see secret.h).
 *
 * Each secret gets its own anonymous mapping (a page or a few): the length
 * is kept in front of the text, so that secret_free() knows what to unmap.
 */
#include "config.h"

#include "base/secret.h"

#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct secret_header {
    size_t mapped;                 /* bytes mapped, this header included */
};

char *secret_strdup(const char *text)
{
    if (text == NULL)
        return NULL;
    size_t len = strlen(text);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t need = sizeof(struct secret_header) + len + 1;
    size_t mapped = (need + page - 1) / page * page;
    void *memory = mmap(NULL, mapped, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (memory == MAP_FAILED)
        return NULL;
    /* best effort: a kernel without it still has PR_SET_DUMPABLE */
    madvise(memory, mapped, MADV_DONTDUMP);
    struct secret_header *header = memory;
    header->mapped = mapped;
    char *copy = (char *)(header + 1);
    memcpy(copy, text, len + 1);
    return copy;
}

void secret_free(char **secret)
{
    if (*secret == NULL)
        return;
    struct secret_header *header = (struct secret_header *)*secret - 1;
    size_t mapped = header->mapped;
    explicit_bzero(header, mapped);
    munmap(header, mapped);
    *secret = NULL;
}
