/*
 * invariant.h - checks of what a module's shared state must satisfy, in
 * debug builds (./configure --enable-debug defines S3CFS_DEBUG).
 *
 * Each module with shared state states its invariants in a comment at the
 * top and checks them where its lock is released (and before it waits on
 * a condition, which releases it too): the writer (writer_unlock), the
 * inode table (inode_table_unlock) and the block cache (cache_unlock).
 * s3backer's EC_PROTECT_CHECK_INVARIANTS is the model. A broken invariant
 * aborts with the condition, the file and the line, so a test that breaks
 * one fails where it breaks rather than later, somewhere else. Release
 * builds compile the checks out: INVARIANTS_ON is 0 and INVARIANT() does
 * nothing, so a check may be as slow as it needs to be.
 */
#ifndef S3CFS_INVARIANT_H
#define S3CFS_INVARIANT_H

#include <stdio.h>
#include <stdlib.h>

#ifdef S3CFS_DEBUG
#define INVARIANTS_ON 1
#else
#define INVARIANTS_ON 0
#endif

/* Abort with WHAT (the condition's text) at FILE:LINE, in WHERE. */
__attribute__((noreturn)) static inline void
invariant_failed(const char *what, const char *where, const char *file, int line)
{
    fprintf(stderr, "s3cachefs: invariant broken in %s (%s:%d): %s\n", where,
            file, line, what);
    abort();
}

/* Check COND (debug builds only); WHERE names the structure checked. */
#define INVARIANT(cond, where)                                             \
    do {                                                                   \
        if (INVARIANTS_ON && !(cond))                                      \
            invariant_failed(#cond, (where), __FILE__, __LINE__);          \
    } while (0)

#endif /* S3CFS_INVARIANT_H */
