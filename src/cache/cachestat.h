/*
 * cachestat.h - cachestat(2) (Linux 6.5): how many pages of a range of a
 * file are in the page cache, and how many of those are dirty or under
 * writeback.
 *
 * The block cache asks it to skip the second hash of a block this
 * process just filled (cache.c, "blocks just filled"): a page still
 * dirty or under writeback has not been read back from the disk since
 * write(2) put it there, so it cannot hold damage the hash would find.
 * glibc has no wrapper and older kernel headers no system call number:
 * both are here, in one place for the cache and its tests. The structs
 * are the kernel's layouts under names of their own, so that this header
 * and <linux/mman.h>, whose newer versions define them, can be included
 * together.
 */
#ifndef S3CFS_CACHESTAT_H
#define S3CFS_CACHESTAT_H

#include <errno.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The number is the same on the architectures below (the generic system
 * call table); elsewhere, without the headers' number, there is none. */
#if !defined(__NR_cachestat) &&                                          \
    (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || \
     defined(__arm__) || defined(__riscv))
#define __NR_cachestat 451
#endif

/* The range asked about: LEN bytes from OFF (LEN 0: to the end of the
 * file). The kernel's struct cachestat_range. */
struct cachestat_span {
    uint64_t off, len;
};

/* The kernel's answer, in pages (struct cachestat). A folio dirty and
 * under writeback at once counts in both nr_dirty and nr_writeback. */
struct cachestat_pages {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted,
        nr_recently_evicted;
};

/* cachestat(2) of SPAN of FD into *PAGES: 0, or -1 with errno: ENOSYS
 * where the kernel (before 6.5) or the headers lack the call, EPERM where
 * a seccomp filter refuses it, EBADF for a bad descriptor, EOPNOTSUPP
 * for a file without a page cache. */
static inline int cachestat_query(int fd, const struct cachestat_span *span,
                                  struct cachestat_pages *pages)
{
#ifdef __NR_cachestat
    return (int)syscall(__NR_cachestat, (unsigned)fd, span, pages, 0u);
#else
    (void)fd;
    (void)span;
    (void)pages;
    errno = ENOSYS;
    return -1;
#endif
}

#endif /* S3CFS_CACHESTAT_H */
