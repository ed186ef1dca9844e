/*
 * fuse_ops.h - the libfuse low-level callbacks.
 *
 * Thin shims: decode the request, call the fs layer (fs.h), reply exactly
 * once. The session's userdata is a struct fuse_ops_context whose fs
 * pointer is set once the daemon has forked (worker threads must start
 * after fork).
 */
#ifndef S3CFS_FUSE_OPS_H
#define S3CFS_FUSE_OPS_H

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

#include "fs/fs.h"

/* The read-ahead init asks for; main.c raises the mount's bdi limit to it
 * (the kernel caps read-ahead at the smaller of the two). */
#define FUSE_OPS_MAX_READAHEAD (1u << 20)

struct fuse_ops_context {
    struct fs *fs;
    /* set by init: the kernel offered parallel lookups and init wants them */
    bool parallel_dirops;
    uint64_t init_unique;         /* the INIT request read, 0 once answered */
    struct fuse_session *session; /* for the kernel's notifications (refresh);
                                     NULL: none sent */
};

/*
 * The largest read the mount should take (its max_read): 1 MiB, or less
 * where this process cannot make a pipe of more than 1 MiB (no
 * CAP_SYS_RESOURCE and /proc/sys/fs/pipe-max-size at its default),
 * since libfuse splices a reply only through a pipe that holds it and
 * its headers: 512 KiB reads spliced cost the daemon less CPU than 1 MiB
 * reads copied.
 */
size_t fuse_ops_read_size(void);

/* The max_read the user gave instead (what init must ask for too); 0
 * for none. */
void fuse_ops_set_read_size(size_t size);

/* The callback table for fuse_session_new(). */
const struct fuse_lowlevel_ops *fuse_ops_table(void);

/*
 * Make the session SE (mounted, its userdata a struct fuse_ops_context)
 * read and answer the kernel through functions of this module, so that
 * the INIT reply carries FUSE_PARALLEL_DIROPS when init asked for it:
 * libfuse before 3.16.2 never passes that flag on, and the kernel then
 * runs the lookups of one directory one at a time. Returns 0, or a
 * positive errno (the session then keeps libfuse's own I/O: correct,
 * only slower).
 */
int fuse_ops_use_io(struct fuse_session *se);

#endif /* S3CFS_FUSE_OPS_H */
