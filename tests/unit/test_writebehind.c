/*
 * test_writebehind.c - write-behind (writebehind.c) against a fake server.
 *
 * writebehind.c talks to S3 through four calls (create, upload part,
 * complete, abort); this program defines them itself, as a server that
 * keeps each part's bytes in memory, reads every part twice (a part whose
 * bytes change while it is read is refused, as Content-MD5 makes a real
 * server refuse it) and, when told to, fails parts. Completing checks
 * that the parts named, in order, are byte for byte the staging file.
 * The integration tests run the same code against real servers; this one
 * drives the races they cannot: several threads writing, patching and
 * truncating while parts are in flight, parts failing in the background,
 * an upload that disappears.
 *
 * The writer side is what writer.c does: report each write after the
 * pwrite with the contiguous prefix written so far (seq_end), report
 * truncates, start the upload once seq_end passes 16 MiB, finish once
 * every writer is done.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/workers.h"
#include "s3/s3.h"
#include "writer/upload.h"
#include "writer/writebehind.h"

#define MIB (1ull << 20)
#define MAX_PART 64

/* cmocka's assertions may only fail on the thread running the test: the
 * writer threads and the worker pool's threads use this */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,         \
                    __LINE__, #cond);                                      \
            abort();                                                       \
        }                                                                  \
    } while (0)

/* ------------------------------------------------------------ the server */

static struct {
    pthread_mutex_t lock;
    unsigned char *data[MAX_PART + 1];   /* by part number */
    uint64_t length[MAX_PART + 1];
    unsigned version[MAX_PART + 1];
    unsigned sends[MAX_PART + 1];        /* UploadPart requests */
    unsigned versions;
    unsigned fail_percent;               /* of parts, while not finishing */
    int fail_errno;
    bool lost;                           /* the upload is gone: ENOENT */
    bool finishing;
    unsigned held_part;                  /* its first send waits, then fails */
    int held_errno;
    bool holding, released;
    pthread_cond_t changed;              /* holding or released changed */
    unsigned aborts, completes;
    int fd;                              /* the staging file */
    unsigned seed;
} server = {.lock = PTHREAD_MUTEX_INITIALIZER,
            .changed = PTHREAD_COND_INITIALIZER};

static void server_reset(int fd)
{
    pthread_mutex_lock(&server.lock);
    for (unsigned i = 0; i <= MAX_PART; i++) {
        free(server.data[i]);
        server.data[i] = NULL;
        server.length[i] = 0;
        server.version[i] = 0;
        server.sends[i] = 0;
    }
    server.fail_percent = 0;
    server.fail_errno = EIO;
    server.lost = false;
    server.finishing = false;
    server.held_part = 0;
    server.holding = server.released = false;
    server.aborts = server.completes = 0;
    server.fd = fd;
    pthread_mutex_unlock(&server.lock);
}

int s3_multipart_create(struct s3_client *client, const char *key,
                        const struct s3_put_meta *meta, char **upload_id)
{
    (void)client;
    (void)key;
    (void)meta;
    *upload_id = strdup("upload-1");
    return *upload_id != NULL ? 0 : ENOMEM;
}

int s3_multipart_upload_part(struct s3_client *client, const char *key,
                             const char *upload_id, unsigned part_number,
                             const struct s3_body *body, char *etag_out)
{
    (void)client;
    (void)key;
    (void)upload_id;
    CHECK(part_number >= 1 && part_number <= MAX_PART);
    unsigned char *first = malloc(body->length ? body->length : 1);
    unsigned char *again = malloc(body->length ? body->length : 1);
    CHECK(first != NULL);
    CHECK(again != NULL);
    ssize_t got = pread(body->fd, first, body->length, (off_t)body->offset);
    usleep(500 + (unsigned)rand() % 1500);
    ssize_t got_again = pread(body->fd, again, body->length, (off_t)body->offset);
    int err = 0;

    pthread_mutex_lock(&server.lock);
    server.sends[part_number]++;
    if (part_number == server.held_part && server.sends[part_number] == 1) {
        server.holding = true;
        pthread_cond_broadcast(&server.changed);
        while (!server.released)
            pthread_cond_wait(&server.changed, &server.lock);
        err = server.held_errno;
    } else if (server.lost)
        err = ENOENT;
    else if (got != (ssize_t)body->length || got_again != got ||
             memcmp(first, again, body->length) != 0)
        err = EIO;                 /* short, or changed: a bad digest */
    else if (!server.finishing &&
             (unsigned)rand_r(&server.seed) % 100 < server.fail_percent)
        err = server.fail_errno;
    if (err == 0) {
        free(server.data[part_number]);
        server.data[part_number] = first;
        first = NULL;
        server.length[part_number] = body->length;
        server.version[part_number] = ++server.versions;
        snprintf(etag_out, S3_ETAG_MAX, "\"v%u\"", server.version[part_number]);
    }
    pthread_mutex_unlock(&server.lock);
    free(first);
    free(again);
    return err;
}

int s3_multipart_complete(struct s3_client *client, const char *key,
                          const char *upload_id, const char *const *part_etags,
                          unsigned part_count, char *etag_out)
{
    (void)client;
    (void)key;
    (void)upload_id;
    struct stat st;
    assert_int_equal(fstat(server.fd, &st), 0);
    unsigned char *file = malloc((size_t)st.st_size + 1);
    assert_non_null(file);
    assert_int_equal(pread(server.fd, file, (size_t)st.st_size, 0), st.st_size);

    /* checked under the lock, failed after it (a failure longjmps) */
    char problem[160] = "";
    pthread_mutex_lock(&server.lock);
    bool lost = server.lost;
    uint64_t offset = 0;
    for (unsigned i = 1; !lost && i <= part_count && !problem[0]; i++) {
        char etag[S3_ETAG_MAX];
        snprintf(etag, sizeof(etag), "\"v%u\"", server.version[i]);
        if (strcmp(part_etags[i - 1], etag) != 0)
            snprintf(problem, sizeof(problem), "part %u: ETag %s, the server "
                     "has %s", i, part_etags[i - 1], etag);
        else if (i < part_count && server.length[i] < UPLOAD_MIN_PART_SIZE)
            snprintf(problem, sizeof(problem), "part %u is too small", i);
        else if (offset + server.length[i] > (uint64_t)st.st_size ||
                 memcmp(file + offset, server.data[i], server.length[i]) != 0)
            snprintf(problem, sizeof(problem), "part %u (bytes %llu-%llu) "
                     "differs from the file", i, (unsigned long long)offset,
                     (unsigned long long)(offset + server.length[i]));
        offset += server.length[i];
    }
    if (!lost && !problem[0] && offset != (uint64_t)st.st_size)
        snprintf(problem, sizeof(problem), "the parts hold %llu bytes, the "
                 "file %llu", (unsigned long long)offset,
                 (unsigned long long)st.st_size);
    if (!lost && !problem[0])
        server.completes++;
    pthread_mutex_unlock(&server.lock);
    free(file);
    if (lost)
        return ENOENT;
    if (problem[0])
        fail_msg("%s", problem);
    snprintf(etag_out, S3_ETAG_MAX, "\"done-%u\"", part_count);
    return 0;
}

/* What write-behind completes with: the object is the whole fd, which a
 * complete whose answer is lost checks the object in the bucket against. */
int s3_multipart_complete_object(struct s3_client *client, const char *key,
                                 const char *upload_id,
                                 const char *const *part_etags,
                                 unsigned part_count,
                                 const struct s3_body *whole, char *etag_out)
{
    struct stat st;
    assert_non_null(whole);
    assert_null(whole->data);
    assert_int_equal(whole->fd, server.fd);
    assert_int_equal(whole->offset, 0);
    assert_int_equal(fstat(server.fd, &st), 0);
    assert_int_equal(whole->length, (uint64_t)st.st_size);
    return s3_multipart_complete(client, key, upload_id, part_etags,
                                 part_count, etag_out);
}

void upload_abandon(const struct upload_conf *conf, const char *key,
                    const char *upload_id)
{
    (void)conf;
    (void)key;
    (void)upload_id;
    pthread_mutex_lock(&server.lock);
    server.aborts++;
    pthread_mutex_unlock(&server.lock);
}

/* ------------------------------------------------------------ the writer */

struct writer_model {
    int fd;
    pthread_mutex_t lock;
    uint64_t seq_end;            /* contiguous from 0, as writer.c keeps it */
    uint64_t cursor;             /* next sequential write */
    uint64_t target;             /* sequential writers stop here */
    struct writebehind *wb;
    unsigned patch_percent, truncate_percent;
    uint64_t patch_back;         /* 0: patches anywhere in the file */
    unsigned seed;
};

static void model_write(struct writer_model *m, uint64_t offset, size_t length,
                        unsigned char fill)
{
    unsigned char *buffer = malloc(length);
    CHECK(buffer != NULL);
    for (size_t i = 0; i < length; i++)
        buffer[i] = (unsigned char)(fill + i * 31 + (offset + i) / 4096);
    ssize_t done = pwrite(m->fd, buffer, length, (off_t)offset);
    CHECK(done == (ssize_t)length);
    free(buffer);
    pthread_mutex_lock(&m->lock);
    uint64_t end = offset + length;
    if (offset <= m->seq_end && end > m->seq_end)
        m->seq_end = end;
    uint64_t ready = m->seq_end;
    struct writebehind *wb = m->wb;
    pthread_mutex_unlock(&m->lock);
    if (wb != NULL)
        writebehind_wrote(wb, offset, length, ready);
}

static void model_truncate(struct writer_model *m, uint64_t size)
{
    pthread_mutex_lock(&m->lock);
    CHECK(ftruncate(m->fd, (off_t)size) == 0);
    if (size < m->seq_end)
        m->seq_end = size;
    if (m->cursor > size)
        m->cursor = size;
    struct writebehind *wb = m->wb;
    pthread_mutex_unlock(&m->lock);
    if (wb != NULL)
        writebehind_truncated(wb, size);
}

static uint64_t file_size(int fd)
{
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    return (uint64_t)st.st_size;
}

static void *writer_thread(void *arg)
{
    struct writer_model *m = arg;
    unsigned seed;

    pthread_mutex_lock(&m->lock);
    seed = m->seed++;
    pthread_mutex_unlock(&m->lock);
    for (;;) {
        unsigned dice = (unsigned)rand_r(&seed) % 100;
        uint64_t size = file_size(m->fd);
        if (dice < m->truncate_percent && size > 0) {
            model_truncate(m, (uint64_t)rand_r(&seed) % size);
        } else if (dice < m->truncate_percent + m->patch_percent && size > 0) {
            uint64_t back = m->patch_back ? m->patch_back : size;
            uint64_t from = size > back ? size - back : 0;
            uint64_t offset = from + (uint64_t)rand_r(&seed) % (size - from);
            model_write(m, offset, 1 + (size_t)rand_r(&seed) % 65536,
                        (unsigned char)rand_r(&seed));
        } else {
            pthread_mutex_lock(&m->lock);
            uint64_t offset = m->cursor;
            size_t length = 4096 + (size_t)rand_r(&seed) % (1 << 20);
            bool done = offset >= m->target;
            if (!done)
                m->cursor += length;
            pthread_mutex_unlock(&m->lock);
            if (done)
                break;
            model_write(m, offset, length, (unsigned char)rand_r(&seed));
        }
    }
    return NULL;
}

struct fixture {
    struct workers *pool;
    struct upload_conf conf;
    char path[64];
    int fd;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(workers_create(4, &f->pool), 0);
    f->conf = (struct upload_conf){
        .workers = f->pool, .parallel = 3, .part_size = 5 * MIB,
        .multipart_threshold = 16 * MIB,
    };
    snprintf(f->path, sizeof(f->path), "/tmp/test_writebehind.XXXXXX");
    f->fd = mkstemp(f->path);
    assert_true(f->fd >= 0);
    unlink(f->path);
    server_reset(f->fd);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    workers_destroy(&f->pool);
    close(f->fd);
    server_reset(-1);
    free(f);
    return 0;
}

/* Run THREADS writers on M until they are done, starting the upload once
 * 16 MiB are written from the start (or the writers finish first); then
 * finish. Returns finish()'s errno. */
static int run_writers(struct fixture *f, struct writer_model *m,
                       unsigned threads)
{
    pthread_t thread[4];
    struct writebehind *wb = NULL;
    char etag[S3_ETAG_MAX];

    assert_true(threads <= 4);
    for (unsigned i = 0; i < threads; i++)
        assert_int_equal(pthread_create(&thread[i], NULL, writer_thread, m), 0);
    for (;;) {
        pthread_mutex_lock(&m->lock);
        bool start = m->seq_end > f->conf.multipart_threshold;
        bool over = m->cursor >= m->target;
        pthread_mutex_unlock(&m->lock);
        if (start || over)
            break;
        usleep(200);
    }
    assert_int_equal(writebehind_start(&f->conf, "key", NULL, m->fd, &wb), 0);
    pthread_mutex_lock(&m->lock);
    m->wb = wb;
    uint64_t ready = m->seq_end;
    pthread_mutex_unlock(&m->lock);
    writebehind_wrote(wb, 0, 0, ready);
    for (unsigned i = 0; i < threads; i++)
        pthread_join(thread[i], NULL);
    pthread_mutex_lock(&server.lock);
    server.finishing = true;
    pthread_mutex_unlock(&server.lock);
    uint64_t size = file_size(m->fd);
    if (size == 0) {
        writebehind_abandon(&wb);
        return 0;
    }
    int err = writebehind_finish(&wb, size, etag);
    assert_null(wb);
    return err;
}

static void model_init(struct writer_model *m, int fd, uint64_t target,
                       unsigned seed)
{
    memset(m, 0, sizeof(*m));
    m->fd = fd;
    m->target = target;
    m->seed = seed;
    pthread_mutex_init(&m->lock, NULL);
}

/* One sequential writer: each part goes up once, most before finish. */
static void test_sequential_writer_sends_each_part_once(void **state)
{
    struct fixture *f = *state;
    struct writer_model m;

    model_init(&m, f->fd, 48 * MIB + 12345, 1);
    assert_int_equal(run_writers(f, &m, 1), 0);
    assert_int_equal(server.completes, 1);
    assert_int_equal(server.aborts, 0);
    unsigned parts = 0;
    for (unsigned i = 1; i <= MAX_PART; i++) {
        if (server.sends[i] == 0)
            continue;
        assert_int_equal(server.sends[i], 1);
        parts++;
    }
    assert_int_equal(parts, 10); /* 9 x 5 MiB, then the rest */
}

/* A writer that goes back a little to patch (zipfile): after the first
 * patch over a sent part, parts wait far enough behind it. */
static void test_patching_writer_pays_once(void **state)
{
    struct fixture *f = *state;
    struct writer_model m;

    model_init(&m, f->fd, 60 * MIB, 2);
    m.patch_percent = 10;
    m.patch_back = 4 * MIB;
    assert_int_equal(run_writers(f, &m, 1), 0);
    unsigned resent = 0;
    for (unsigned i = 1; i <= MAX_PART; i++)
        resent += server.sends[i] > 1 ? server.sends[i] - 1 : 0;
    assert_true(resent <= 1);
}

/* Several threads writing in sequence, patching anywhere, truncating,
 * with parts failing in the background: the object is the file. */
static void test_racing_writers_complete_with_the_file(void **state)
{
    struct fixture *f = *state;

    for (unsigned round = 0; round < 12; round++) {
        struct writer_model m;
        assert_int_equal(ftruncate(f->fd, 0), 0);
        server_reset(f->fd);
        server.seed = round + 1;
        server.fail_percent = round % 2 ? 15 : 0;
        model_init(&m, f->fd, 20 * MIB + round * 3 * MIB, round * 10 + 1);
        m.patch_percent = 10;
        m.truncate_percent = round % 3 == 0 ? 0 : 1;
        /* (the server's complete() asserts the bytes) */
        int err = run_writers(f, &m, 1 + round % 4);
        if (file_size(f->fd) > 0)
            assert_int_equal(err, 0);
    }
}

/* The upload disappears on the server (a lifecycle rule): background
 * sends stop, finish() says ENOENT and aborts. */
static void test_lost_upload(void **state)
{
    struct fixture *f = *state;
    struct writebehind *wb = NULL;
    struct writer_model m;
    char etag[S3_ETAG_MAX];

    model_init(&m, f->fd, 0, 3);
    assert_int_equal(writebehind_start(&f->conf, "key", NULL, f->fd, &wb), 0);
    m.wb = wb;
    model_write(&m, 0, 20 * MIB, 7);       /* part 1 may go up */
    pthread_mutex_lock(&server.lock);
    server.lost = true;
    pthread_mutex_unlock(&server.lock);
    model_write(&m, 20 * MIB, 30 * MIB, 8);
    usleep(50 * 1000);
    pthread_mutex_lock(&server.lock);
    unsigned sends_then = 0;
    for (unsigned i = 1; i <= MAX_PART; i++)
        sends_then += server.sends[i];
    pthread_mutex_unlock(&server.lock);
    model_write(&m, 50 * MIB, 20 * MIB, 9); /* nothing more is sent */
    usleep(50 * 1000);
    unsigned sends_now = 0;
    for (unsigned i = 1; i <= MAX_PART; i++)
        sends_now += server.sends[i];
    assert_true(sends_now <= sends_then + 3); /* (those already queued) */
    assert_int_equal(writebehind_finish(&wb, 70 * MIB, etag), ENOENT);
    assert_int_equal(server.aborts, 1);
    assert_int_equal(server.completes, 0);
}

struct finisher {
    struct writebehind *wb;
    uint64_t size;
    int err;
};

static void *finish_thread(void *arg)
{
    struct finisher *fin = arg;
    char etag[S3_ETAG_MAX];

    fin->err = writebehind_finish(&fin->wb, fin->size, etag);
    return NULL;
}

/* A part sent in the background that fails only once finish() has begun
 * is sent again, like one that failed before: close() must not fail for
 * what a retry fixes (a CI run saw EACCES from close() this way). */
static void test_background_part_failing_during_finish(void **state)
{
    struct fixture *f = *state;
    struct writer_model m;
    struct finisher fin = {.size = 20 * MIB + 3};
    pthread_t thread;

    model_init(&m, f->fd, 0, 5);
    pthread_mutex_lock(&server.lock);
    server.held_part = 1;
    server.held_errno = EACCES;
    pthread_mutex_unlock(&server.lock);
    assert_int_equal(writebehind_start(&f->conf, "key", NULL, f->fd, &fin.wb),
                     0);
    m.wb = fin.wb;
    model_write(&m, 0, 20 * MIB + 3, 6); /* parts 1 and 2 go now */
    pthread_mutex_lock(&server.lock);
    while (!server.holding)
        pthread_cond_wait(&server.changed, &server.lock);
    pthread_mutex_unlock(&server.lock);

    assert_int_equal(pthread_create(&thread, NULL, finish_thread, &fin), 0);
    /* the short last part goes only once finish() has begun */
    for (;;) {
        pthread_mutex_lock(&server.lock);
        bool last_sent = server.sends[5] > 0;
        pthread_mutex_unlock(&server.lock);
        if (last_sent)
            break;
        usleep(200);
    }
    pthread_mutex_lock(&server.lock);
    server.released = true;
    pthread_cond_broadcast(&server.changed);
    pthread_mutex_unlock(&server.lock);
    pthread_join(thread, NULL);

    assert_int_equal(fin.err, 0);
    assert_null(fin.wb);
    assert_int_equal(server.sends[1], 2);
    assert_int_equal(server.completes, 1);
    assert_int_equal(server.aborts, 0);
}

/* Abandoning waits for the parts in flight and aborts. */
static void test_abandon(void **state)
{
    struct fixture *f = *state;
    struct writebehind *wb = NULL;
    struct writer_model m;

    model_init(&m, f->fd, 0, 4);
    assert_int_equal(writebehind_start(&f->conf, "key", NULL, f->fd, &wb), 0);
    m.wb = wb;
    model_write(&m, 0, 40 * MIB, 1);
    writebehind_abandon(&wb);
    assert_null(wb);
    writebehind_abandon(&wb); /* safe twice */
    assert_int_equal(server.aborts, 1);
    assert_int_equal(server.completes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sequential_writer_sends_each_part_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_patching_writer_pays_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_racing_writers_complete_with_the_file,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_background_part_failing_during_finish,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandon, setup, teardown),
    };
    log_set_level(LOG_LEVEL_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
