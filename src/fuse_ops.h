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

#include "fs.h"

struct fuse_ops_context {
    struct fs *fs;
};

/* The callback table for fuse_session_new(). */
const struct fuse_lowlevel_ops *fuse_ops_table(void);

#endif /* S3CFS_FUSE_OPS_H */
