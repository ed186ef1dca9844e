/*
 * fuse_ops.c - libfuse low-level callbacks (see fuse_ops.h).
 *
 * Every function replies exactly once on every path. Open files and
 * directories travel in fi->fh as pointers to fs-layer handles. Reads of
 * cached bytes are answered by splice from a pipe each FUSE thread keeps
 * (thread-specific, emptied by every reply, dropped after a failure).
 */
#include "config.h"

#include "fs/fuse_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ctl/sync_text.h"

static struct fs *request_fs(fuse_req_t req)
{
    return ((struct fuse_ops_context *)fuse_req_userdata(req))->fs;
}

/*
 * Reply with an error the kernel and blocking callers read correctly: the
 * kernel takes ENOSYS from open/opendir as "no such operation" for the
 * whole mount, and EAGAIN (throttling that outlasted the retries) would
 * make blocking readers spin.
 */
static void reply_error(fuse_req_t req, int err)
{
    if (err == ENOSYS || err == EAGAIN)
        err = EIO;
    fuse_reply_err(req, err);
}

static int reply_entry(fuse_req_t req, const struct fs_entry *entry)
{
    struct fuse_entry_param param = {
        .ino = entry->ino,
        .attr = entry->attr,
        .attr_timeout = entry->attr_timeout,
        .entry_timeout = entry->entry_timeout,
    };
    return fuse_reply_entry(req, &param);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    struct fuse_ops_context *context = userdata;
    /* Large kernel read-ahead requests mean fewer round trips through FUSE. */
    conn->max_readahead = FUSE_OPS_MAX_READAHEAD;
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want |= FUSE_CAP_READDIRPLUS;
    /* Lookups in one directory may run in parallel (the kernel serialises
     * them otherwise): a data loader's workers open files side by side. */
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
        conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    /* libfuse 3.14 drops it from the reply: see io_writev() */
    context->parallel_dirops = (conn->want & FUSE_CAP_PARALLEL_DIROPS) != 0;
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
    /* open(O_TRUNC) arrives as one request: a truncated file is never
     * loaded first just to be emptied */
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    /* fewer, larger writes */
    conn->max_write = 1u << 20;
    /* libfuse asks for it by default: the kernel then checks a file's
     * attributes on every read once attr_ttl has passed, a GETATTR that
     * holds the read up for a HEAD about once a second while a file is
     * read. Not needed: an open handle reads the version it opened
     * (If-Match), and open() drops the page cache of a changed object
     * (keep_cache only while the ETag is the same). */
    conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
    /* as the max_read mount option says (main.c), or libfuse refuses */
    conn->max_read = (unsigned)fuse_ops_read_size();
    /* read replies spliced from the cache's files (op_read) */
    if (conn->capable & FUSE_CAP_SPLICE_WRITE)
        conn->want |= FUSE_CAP_SPLICE_WRITE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs_entry entry;
    int err = fs_lookup(request_fs(req), parent, name, &entry);

    if (err != 0)
        reply_error(req, err);
    else if (reply_entry(req, &entry) != 0 && entry.ino != 0)
        fs_forget(request_fs(req), entry.ino, 1); /* the kernel never saw it */
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    fs_forget(request_fs(req), ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count,
                            struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        fs_forget(request_fs(req), forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat attr;
    double timeout = 0;
    int err = fs_getattr(request_fs(req), ino, &attr, &timeout);

    (void)fi;
    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_attr(req, &attr, timeout);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    char *target = NULL;
    int err = fs_readlink(request_fs(req), ino, &target);

    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_readlink(req, target);
    free(target);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_dir *dir = NULL;
    int err = fs_opendir(request_fs(req), ino, &dir);

    if (err != 0) {
        reply_error(req, err);
        return;
    }
    fi->fh = (uint64_t)(uintptr_t)dir;
    fi->cache_readdir = 0;
    if (fuse_reply_open(req, fi) != 0)
        fs_releasedir(request_fs(req), dir); /* interrupted: nobody owns it */
}

/* readdir and readdirplus: the entries of DIR from OFFSET that fit in SIZE
 * bytes, with (PLUS) or without their attributes and a kernel reference
 * each. Entries that would not fit are never looked up: no HEAD and no
 * reference is spent on one the kernel will not get. */
static void reply_dir(fuse_req_t req, size_t size, off_t offset,
                      struct fuse_file_info *fi, bool plus)
{
    struct fs *fs = request_fs(req);
    struct fs_dir *dir = (struct fs_dir *)(uintptr_t)fi->fh;
    struct fs_entry *entries = NULL;
    char *buf = NULL;
    size_t used = 0;
    size_t index = (size_t)offset;
    size_t count = 0;
    int err = 0;

    if (dir == NULL) { /* never opened: cannot happen with a sane kernel */
        fuse_reply_err(req, EBADF);
        return;
    }
    if ((buf = malloc(size)) == NULL) {
        err = ENOMEM;
        goto out;
    }
    /* how many entries fit, asked exactly */
    for (size_t need = 0; index + count < fs_dir_count(dir); count++) {
        struct stat attr;
        const char *name = fs_dir_entry(fs, dir, index + count, &attr);
        need += plus ? fuse_add_direntry_plus(req, NULL, 0, name, NULL, 0)
                     : fuse_add_direntry(req, NULL, 0, name, NULL, 0);
        if (need > size)
            break;
    }
    if (count == 0)
        goto out;
    if (plus) {
        entries = calloc(count, sizeof(*entries));
        err = entries == NULL ? ENOMEM
                              : fs_dir_entries_plus(fs, dir, index, count, entries);
        if (err != 0)
            goto out;
    }
    for (size_t i = 0; i < count; i++) {
        struct stat attr;
        const char *name = fs_dir_entry(fs, dir, index + i, &attr);
        off_t next = (off_t)(index + i) + 1;
        if (plus) {
            struct fuse_entry_param param = {
                .ino = entries[i].ino,
                .attr = entries[i].attr,
                .attr_timeout = entries[i].attr_timeout,
                .entry_timeout = entries[i].entry_timeout,
            };
            used += fuse_add_direntry_plus(req, buf + used, size - used, name,
                                           &param, next);
        } else {
            used += fuse_add_direntry(req, buf + used, size - used, name,
                                      &attr, next);
        }
    }
out:
    if (err != 0) {
        reply_error(req, err);
    } else if (fuse_reply_buf(req, buf, used) != 0 && plus) {
        /* the kernel never saw them: give the references back */
        for (size_t i = 0; i < count; i++)
            if (index + i >= 2 && entries[i].ino != 0)
                fs_forget(fs, entries[i].ino, 1);
    }
    free(buf);
    free(entries);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
                       struct fuse_file_info *fi)
{
    (void)ino;
    reply_dir(req, size, offset, fi, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
                           off_t offset, struct fuse_file_info *fi)
{
    (void)ino;
    reply_dir(req, size, offset, fi, true);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    fs_releasedir(request_fs(req), (struct fs_dir *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_file *file = NULL;
    bool keep_cache = false;
    int err = fs_open(request_fs(req), ino, fi->flags, &file, &keep_cache);

    if (err != 0) {
        reply_error(req, err);
        return;
    }
    fi->fh = (uint64_t)(uintptr_t)file;
    fi->keep_cache = keep_cache;
    if (fuse_reply_open(req, fi) != 0)
        fs_release(request_fs(req), file);
}

/* ------------------------------------------------------------ reading */

/*
 * Reads are answered without copying their bytes through this process
 * where the cache holds them: the reader splices them from the cache's
 * data file into a pipe of this thread (verified where they are, see
 * cache_block_splice()), and libfuse splices the pipe into /dev/fuse
 * (FUSE_CAP_SPLICE_WRITE; the kernel copies once, into the file's page
 * cache). Each thread keeps one pipe, sized for the largest read. The
 * cache blocks whose pages the pipe holds are held (cache.h, "Holds")
 * until fuse_reply_data() has returned: by then the kernel has copied
 * them (the splice on to /dev/fuse copies before it returns, and
 * libfuse's own pipe is emptied or dropped), or the pipe is discarded.
 */
#define READ_PIPE_SIZE (2u << 20)   /* a 1 MiB read, and libfuse's headers */
#define READ_SIZE_MAX (1u << 20)    /* what the kernel sends at most anyway */
#define READ_SIZE_MIN (128u << 10)

struct read_pipe {
    int fds[2];
    size_t capacity;
};

static pthread_key_t read_pipe_key;
static pthread_once_t read_pipe_once = PTHREAD_ONCE_INIT;

static void read_pipe_free(void *arg)
{
    struct read_pipe *pipe_ = arg;
    close(pipe_->fds[0]);
    close(pipe_->fds[1]);
    free(pipe_);
}

static void read_pipe_key_create(void)
{
    if (pthread_key_create(&read_pipe_key, read_pipe_free) != 0)
        read_pipe_key = (pthread_key_t)-1;
}

/* This thread's pipe (empty), or NULL where there is none to be had. */
static struct read_pipe *read_pipe_get(void)
{
    pthread_once(&read_pipe_once, read_pipe_key_create);
    if (read_pipe_key == (pthread_key_t)-1)
        return NULL;
    struct read_pipe *pipe_ = pthread_getspecific(read_pipe_key);
    if (pipe_ != NULL)
        return pipe_;
    pipe_ = calloc(1, sizeof(*pipe_));
    if (pipe_ == NULL)
        return NULL;
    if (pipe2(pipe_->fds, O_CLOEXEC) != 0) {
        free(pipe_);
        return NULL;
    }
    int size = fcntl(pipe_->fds[1], F_SETPIPE_SZ, READ_PIPE_SIZE);
    if (size < 0)
        size = fcntl(pipe_->fds[1], F_SETPIPE_SZ, READ_PIPE_SIZE / 2);
    if (size < 0)
        size = fcntl(pipe_->fds[1], F_GETPIPE_SZ);
    pipe_->capacity = size > 0 ? (size_t)size : 0;
    if (pthread_setspecific(read_pipe_key, pipe_) != 0) {
        read_pipe_free(pipe_);
        return NULL;
    }
    return pipe_;
}

static size_t read_size_found;  /* fuse_ops_read_size()'s once asked, or
                                   the user's ((size_t)-1 for 0) */

void fuse_ops_set_read_size(size_t size)
{
    read_size_found = size == 0 ? (size_t)-1 : size;  /* 0: no limit */
}

size_t fuse_ops_read_size(void)
{
    /* libfuse splices a reply through a pipe of its own holding the data
     * and a page or three of headers: a pipe as large as the read fails
     * and libfuse copies instead */
    int fds[2];
    size_t read_size = READ_SIZE_MAX;

    if (read_size_found != 0)
        return read_size_found == (size_t)-1 ? 0 : read_size_found;
    if (pipe2(fds, O_CLOEXEC) != 0)
        return READ_SIZE_MAX;
    int size = fcntl(fds[1], F_SETPIPE_SZ, READ_PIPE_SIZE);
    if (size < 0) { /* without CAP_SYS_RESOURCE: pipe-max-size at most */
        FILE *max_file = fopen("/proc/sys/fs/pipe-max-size", "r");
        unsigned long max_size = 0;
        if (max_file != NULL) {
            if (fscanf(max_file, "%lu", &max_size) != 1)
                max_size = 0;
            fclose(max_file);
        }
        read_size = READ_SIZE_MAX;
        while (read_size > READ_SIZE_MIN && read_size + (16u << 10) > max_size)
            read_size /= 2;
    }
    close(fds[0]);
    close(fds[1]);
    read_size_found = read_size;
    return read_size;
}

/* Forget this thread's pipe (it may hold bytes of a failed read). */
static void read_pipe_discard(struct read_pipe *pipe_)
{
    pthread_setspecific(read_pipe_key, NULL);
    read_pipe_free(pipe_);
}

/* Answer a read through this thread's pipe. Returns true when answered
 * (with its bytes or an error), false when fs_read() must answer it. */
static bool read_spliced(fuse_req_t req, struct fs_file *file, size_t size,
                         off_t offset)
{
    struct read_pipe *pipe_ = read_pipe_get();
    struct cache_holds holds = {0};
    size_t got = 0;

    /* the pages the read spans must fit the pipe (it is never waited on:
     * a full one fails the splice, and the read is copied) */
    size_t page = 4096;
    size_t spanned = ((size_t)offset % page + size + page - 1) / page * page;
    if (pipe_ == NULL || spanned > pipe_->capacity)
        return false;
    int err = fs_read_pipe(request_fs(req), file, (uint64_t)offset, size,
                           pipe_->fds[1], &holds, &got);
    if (err != 0) {
        read_pipe_discard(pipe_);
        cache_holds_release(&holds);
        if (err == EOPNOTSUPP || err == ENOSPC || err == ENOBUFS ||
            err == EAGAIN || err == ENOENT || err == ESTALE)
            return false;
        reply_error(req, err);
        return true;
    }
    struct fuse_bufvec data = FUSE_BUFVEC_INIT(got);
    data.buf[0].flags = FUSE_BUF_IS_FD;
    data.buf[0].fd = pipe_->fds[0];
    /* libfuse splices the pipe on to /dev/fuse, or reads it into
     * memory and writes them (a small read, no splice): either way the
     * pipe is left empty, unless the reply failed */
    if (fuse_reply_data(req, &data, 0) != 0)
        read_pipe_discard(pipe_);
    cache_holds_release(&holds);
    return true;
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset,
                    struct fuse_file_info *fi)
{
    struct fs_file *file = (struct fs_file *)(uintptr_t)fi->fh;
    char *buf = NULL;
    size_t got = 0;
    int err;

    (void)ino;
    if (file == NULL) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (size > 0 && read_spliced(req, file, size, offset))
        return;
    buf = malloc(size ? size : 1);
    if (buf == NULL) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    err = fs_read(request_fs(req), file, (uint64_t)offset, size, buf, &got);
    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_buf(req, buf, got);
    free(buf);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                     off_t offset, struct fuse_file_info *fi)
{
    struct fs_file *file = (struct fs_file *)(uintptr_t)fi->fh;
    int err = file == NULL ? EBADF
                           : fs_write(request_fs(req), file, (uint64_t)offset, buf, size);

    (void)ino;
    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_write(req, size);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_file *file = (struct fs_file *)(uintptr_t)fi->fh;
    int err = file == NULL ? 0 : fs_flush(request_fs(req), file);

    (void)ino;
    reply_error(req, err);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                     struct fuse_file_info *fi)
{
    struct fs_file *file = (struct fs_file *)(uintptr_t)fi->fh;
    int err = file == NULL ? 0 : fs_fsync(request_fs(req), file);

    (void)ino;
    (void)datasync;
    reply_error(req, err);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
                        struct fuse_file_info *fi)
{
    (void)ino;
    (void)datasync;
    (void)fi;
    fuse_reply_err(req, 0); /* directory changes are made in the bucket at once */
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
                      mode_t mode, struct fuse_file_info *fi)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    struct fs_entry entry;
    struct fs_file *file = NULL;
    int err = fs_create_file(request_fs(req), parent, name, mode, fi->flags,
                             ctx->uid, ctx->gid, &entry, &file);

    if (err != 0) {
        reply_error(req, err);
        return;
    }
    struct fuse_entry_param param = {
        .ino = entry.ino,
        .attr = entry.attr,
        .attr_timeout = entry.attr_timeout,
        .entry_timeout = entry.entry_timeout,
    };
    fi->fh = (uint64_t)(uintptr_t)file;
    fi->keep_cache = 0;
    if (fuse_reply_create(req, &param, fi) != 0) {
        fs_release(request_fs(req), file);
        fs_forget(request_fs(req), entry.ino, 1);
    }
}

static void reply_new_entry(fuse_req_t req, int err, const struct fs_entry *entry)
{
    if (err != 0)
        reply_error(req, err);
    else if (reply_entry(req, entry) != 0)
        fs_forget(request_fs(req), entry->ino, 1);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
                     mode_t mode)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    struct fs_entry entry;
    int err = fs_mkdir(request_fs(req), parent, name, mode, ctx->uid, ctx->gid,
                       &entry);
    reply_new_entry(req, err, &entry);
}

/* FIFOs, sockets (bind), device nodes, and regular files made by
 * mknod(2): empty objects; FIFO and socket I/O stays in the kernel. */
static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
                     mode_t mode, dev_t rdev)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    struct fs_entry entry;
    int err = fs_mknod(request_fs(req), parent, name, mode, rdev, ctx->uid,
                       ctx->gid, &entry);
    reply_new_entry(req, err, &entry);
}

static void op_symlink(fuse_req_t req, const char *target, fuse_ino_t parent,
                       const char *name)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    struct fs_entry entry;
    int err = fs_symlink(request_fs(req), target, parent, name, ctx->uid,
                         ctx->gid, &entry);
    reply_new_entry(req, err, &entry);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent,
                    const char *name)
{
    (void)ino;
    (void)parent;
    reply_error(req, fs_link(request_fs(req), name));
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    reply_error(req, fs_unlink(request_fs(req), parent, name));
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    reply_error(req, fs_rmdir(request_fs(req), parent, name));
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
                      fuse_ino_t new_parent, const char *new_name,
                      unsigned int flags)
{
    reply_error(req, fs_rename(request_fs(req), parent, name, new_parent,
                               new_name, flags));
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
                       int to_set, struct fuse_file_info *fi)
{
    struct fs_file *file = fi != NULL ? (struct fs_file *)(uintptr_t)fi->fh : NULL;
    struct stat out;
    double timeout = 0;
    int err = fs_setattr(request_fs(req), ino, attr, to_set, file, &out, &timeout);

    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_attr(req, &out, timeout);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    fs_release(request_fs(req), (struct fs_file *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    struct statvfs st;
    int err = fs_statfs(request_fs(req), &st);

    (void)ino;
    if (err != 0)
        reply_error(req, err);
    else
        fuse_reply_statfs(req, &st);
}

/* Reply to getxattr/listxattr with VALUE: its size when SIZE is 0, else
 * the bytes, or ERANGE when they do not fit. */
static void reply_xattr_value(fuse_req_t req, const char *value, size_t len,
                              size_t size)
{
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (len > size)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, value, len);
}

/* A sync under way (reply_sync): what an interrupt of its request sets. */
struct sync_wait {
    struct fs *fs;
    atomic_bool interrupted;
};

/* libfuse's interrupt callback (another worker thread, the request's
 * lock held): the caller of `s3cachefs sync` got a signal (^C, its
 * --timeout, a shutdown's SIGTERM). The sync answers with what it has. */
static void sync_interrupted(fuse_req_t req, void *data)
{
    struct sync_wait *wait = data;

    (void)req;
    atomic_store(&wait->interrupted, true);
    fs_sync_wake(wait->fs);
}

/*
 * FS_SYNC_XATTR / FS_PENDING_XATTR: the text of sync_text.h, within what
 * the caller's buffer takes (a size probe gets the length of what a 64
 * KiB buffer would get; a sync then runs for the probe too). A sync
 * keeps this worker thread until it is done (libfuse starts others
 * meanwhile, up to its maximum), like an fsync(); the kernel puts no
 * time limit on it, so an interrupt of the request (any signal to the
 * caller) ends the wait.
 */
static void reply_report(fuse_req_t req, bool sync, size_t size)
{
    size_t cap = size == 0 || size > SYNC_TEXT_VALUE_MAX ? SYNC_TEXT_VALUE_MAX : size;
    char *text = NULL;
    size_t len = 0;
    int err;

    if (sync) {
        struct sync_wait wait = {.fs = request_fs(req)};
        atomic_init(&wait.interrupted, false);
        fuse_req_interrupt_func(req, sync_interrupted, &wait);
        err = fs_sync_text(wait.fs, &wait.interrupted, cap, &text, &len);
        /* (waits for a callback running now: WAIT goes with this frame) */
        fuse_req_interrupt_func(req, NULL, NULL);
    } else {
        err = fs_pending_text(request_fs(req), cap, &text, &len);
    }
    if (err != 0)
        reply_error(req, err);
    else
        reply_xattr_value(req, text, len, size);
    free(text);
}

/* A warm under way (reply_warm): what an interrupt of its request sets. */
struct warm_wait {
    atomic_bool interrupted;
};

/* libfuse's interrupt callback: the caller of `s3cachefs warm` got a
 * signal; fs_warm() sees the flag within 100 ms and answers with what
 * it did. */
static void warm_interrupted(fuse_req_t req, void *data)
{
    struct warm_wait *wait = data;

    (void)req;
    atomic_store(&wait->interrupted, true);
}

/* The request of `s3cachefs warm` that NAME is (fs.h: FS_WARM_XATTR...),
 * or false. */
static bool warm_request(const char *name, enum fs_warm_op *op)
{
    static const struct {
        const char *name;
        enum fs_warm_op op;
    } requests[] = {
        {FS_WARM_XATTR, FS_WARM_FETCH}, {FS_CHECK_XATTR, FS_WARM_CHECK},
        {FS_EVICT_XATTR, FS_WARM_EVICT}, {FS_PIN_XATTR, FS_WARM_PIN},
        {FS_UNPIN_XATTR, FS_WARM_UNPIN},
    };

    for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++) {
        if (strcmp(name, requests[i].name) == 0) {
            *op = requests[i].op;
            return true;
        }
    }
    return false;
}

/*
 * A request of `s3cachefs warm` on file INO: the answer is the text of
 * warm_text.h. A fetch keeps this worker thread while its GETs run on the
 * read pool (the command sends a few files at a time); an interrupt of
 * the request (a signal to the caller) ends it early. Each read of the
 * attribute is a request, the size probe too (the command reads once,
 * with a buffer of WARM_TEXT_VALUE_MAX).
 */
static void reply_warm(fuse_req_t req, fuse_ino_t ino, enum fs_warm_op op,
                       size_t size)
{
    struct warm_wait wait;
    struct warm_text_answer answer;
    char text[WARM_TEXT_VALUE_MAX];
    size_t len = 0;

    atomic_init(&wait.interrupted, false);
    bool long_one = op == FS_WARM_FETCH || op == FS_WARM_PIN;
    if (long_one)
        fuse_req_interrupt_func(req, warm_interrupted, &wait);
    int err = fs_warm(request_fs(req), ino, op, &wait.interrupted, &answer);
    if (long_one) /* (waits for a callback running now) */
        fuse_req_interrupt_func(req, NULL, NULL);
    if (err == 0)
        err = warm_text_format(&answer, text, sizeof(text), &len);
    if (err != 0)
        reply_error(req, err);
    else
        reply_xattr_value(req, text, len, size);
}

/* fs_refresh()'s INVAL: the kernel forgets an entry or an inode's
 * attributes (ENOENT, it held none, is no failure). */
static void refresh_inval(void *arg, fuse_ino_t parent, const char *name,
                          fuse_ino_t ino)
{
    struct fuse_session *se = arg;

    if (parent != 0)
        fuse_lowlevel_notify_inval_entry(se, parent, name, strlen(name));
    else
        fuse_lowlevel_notify_inval_inode(se, ino, -1, 0); /* attributes only */
}

/* FS_REFRESH_XATTR on INO (`s3cachefs refresh`): forget, answer the
 * counts. */
static void reply_refresh(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    struct fuse_ops_context *context = fuse_req_userdata(req);
    struct fs_refresh_report report;
    char text[256];
    int err = fs_refresh(context->fs, ino,
                         context->session != NULL ? refresh_inval : NULL,
                         context->session, &report);

    if (err != 0) {
        reply_error(req, err);
        return;
    }
    int len = snprintf(text, sizeof(text),
                       "refresh 1\ninodes %llu\nlistings %llu\n"
                       "stored_listings %llu\nstored_records %llu\n"
                       "kernel_entries %llu\n",
                       (unsigned long long)report.inodes,
                       (unsigned long long)report.listings,
                       (unsigned long long)report.stored_listings,
                       (unsigned long long)report.stored_records,
                       (unsigned long long)report.kernel_entries);
    reply_xattr_value(req, text, (size_t)len, size);
}

/* The mount root carries the counters (fs.h: FS_STATS_XATTR), the
 * daemon's pid (FS_PID_XATTR) and its cache directory (FS_CACHE_XATTR),
 * and answers the requests of `s3cachefs sync` and `pending`
 * (FS_SYNC_XATTR, FS_PENDING_XATTR); every regular file answers the
 * requests of `s3cachefs warm` (FS_WARM_XATTR...); every inode the
 * request of `s3cachefs refresh` (FS_REFRESH_XATTR); nothing else has
 * extended attributes. */
static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
                        size_t size)
{
    char *text = NULL;
    enum fs_warm_op warm_op;

    if (warm_request(name, &warm_op)) {
        reply_warm(req, ino, warm_op, size);
        return;
    }
    if (strcmp(name, FS_REFRESH_XATTR) == 0) {
        reply_refresh(req, ino, size);
        return;
    }
    if (ino == FUSE_ROOT_ID && (strcmp(name, FS_SYNC_XATTR) == 0 ||
                                strcmp(name, FS_PENDING_XATTR) == 0)) {
        reply_report(req, strcmp(name, FS_SYNC_XATTR) == 0, size);
        return;
    }

    if (ino == FUSE_ROOT_ID && strcmp(name, FS_PID_XATTR) == 0) {
        char pid[24];
        int len = snprintf(pid, sizeof(pid), "%ld", (long)getpid());
        reply_xattr_value(req, pid, (size_t)len, size);
        return;
    }
    if (ino == FUSE_ROOT_ID && strcmp(name, FS_CACHE_XATTR) == 0) {
        const char *dir = fs_cache_dir(request_fs(req));
        reply_xattr_value(req, dir, strlen(dir), size);
        return;
    }
    if (ino != FUSE_ROOT_ID || strcmp(name, FS_STATS_XATTR) != 0) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    int err = fs_stats_text(request_fs(req), &text);
    if (err != 0)
        reply_error(req, err);
    else
        reply_xattr_value(req, text, strlen(text), size);
    free(text);
}

/* `s3cachefs pending --drop PATH`: FS_DROP_XATTR set to PATH on the mount
 * root (the kernel holds the root's inode lock meanwhile: lookups in the
 * root directory wait for the drop). Any other attribute: ENOTSUP, as
 * before there was a setxattr (the kernel now asks each time instead of
 * remembering the ENOSYS). */
static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
                        const char *value, size_t size, int flags)
{
    (void)flags;
    if (ino != FUSE_ROOT_ID || strcmp(name, FS_DROP_XATTR) != 0) {
        fuse_reply_err(req, ENOTSUP);
        return;
    }
    reply_error(req, fs_drop(request_fs(req), value, size));
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    static const char names[] = FS_STATS_XATTR "\0" FS_PID_XATTR "\0"
                                FS_CACHE_XATTR;
    if (ino == FUSE_ROOT_ID)
        reply_xattr_value(req, names, sizeof(names), size);
    else
        reply_xattr_value(req, "", 0, size);
}

static const struct fuse_lowlevel_ops ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .readlink = op_readlink,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .releasedir = op_releasedir,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .flush = op_flush,
    .fsync = op_fsync,
    .fsyncdir = op_fsyncdir,
    .release = op_release,
    .create = op_create,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .symlink = op_symlink,
    .link = op_link,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .setattr = op_setattr,
    .statfs = op_statfs,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
};

const struct fuse_lowlevel_ops *fuse_ops_table(void)
{
    return &ops;
}

/* ------------------------------------------------------- the session's I/O */

/* Remember which request is INIT, to find its reply in io_writev(). */
static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
    struct fuse_ops_context *context = userdata;
    ssize_t got = read(fd, buf, len);

    if (got >= (ssize_t)sizeof(struct fuse_in_header)) {
        const struct fuse_in_header *in = buf;
        if (in->opcode == FUSE_INIT)
            __atomic_store_n(&context->init_unique, in->unique, __ATOMIC_RELEASE);
    }
    return got;
}

/*
 * Send a reply; the successful reply to INIT gets FUSE_PARALLEL_DIROPS
 * when init wanted it. libfuse up to 3.16.1 takes the capability in
 * conn->want but never sets the flag in the reply (fixed upstream by
 * libfuse pull request #861), so without this the kernel serialises the
 * lookups of a directory: eight readers opening the files of one
 * directory waited for one another's HEADs. Replies to other requests
 * pass unchanged.
 */
static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    struct fuse_ops_context *context = userdata;
    uint64_t init_unique = __atomic_load_n(&context->init_unique, __ATOMIC_ACQUIRE);
    const size_t flags_end = offsetof(struct fuse_init_out, flags) + sizeof(uint32_t);

    if (init_unique == 0 || count != 2 ||
        iov[0].iov_len != sizeof(struct fuse_out_header))
        return writev(fd, iov, count);
    const struct fuse_out_header *out = iov[0].iov_base;
    if (out->unique != init_unique || out->error != 0 ||
        iov[1].iov_len < flags_end || iov[1].iov_len > sizeof(struct fuse_init_out))
        return writev(fd, iov, count);

    struct fuse_init_out init;
    struct iovec patched[2] = {iov[0], {&init, iov[1].iov_len}};
    memcpy(&init, iov[1].iov_base, iov[1].iov_len);
    if (context->parallel_dirops)
        init.flags |= FUSE_PARALLEL_DIROPS;
    __atomic_store_n(&context->init_unique, 0, __ATOMIC_RELEASE);
    return writev(fd, patched, 2);
}

/* libfuse splices a reply (op_read's) to the kernel through this; without
 * it a session with custom I/O never splices. */
static ssize_t io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout,
                              size_t len, unsigned int flags, void *userdata)
{
    (void)userdata;
    return splice(fdin, offin, fdout, offout, len, flags);
}

int fuse_ops_use_io(struct fuse_session *se)
{
#ifdef HAVE_FUSE_SESSION_CUSTOM_IO
    static const struct fuse_custom_io io = {
        .read = io_read,
        .writev = io_writev,
        .splice_send = io_splice_send,
    };
    int err = fuse_session_custom_io(se, &io, fuse_session_fd(se));
    return err < 0 ? -err : err;
#else
    (void)se;
    (void)io_read;
    (void)io_writev;
    (void)io_splice_send;
    return ENOSYS;
#endif
}
