/*
 * workers.h - a fixed pool of threads running queued jobs.
 *
 * The fs layer hands network work that can run in parallel (read-ahead
 * fetches, HEAD requests for a directory listing) to this pool, so the
 * number of threads, and therefore of simultaneous requests, is bounded
 * whatever the number of open files. Jobs run without any lock held by
 * the pool. The queue is unbounded in count but each job is small (a
 * function pointer and an argument); callers bound what they submit.
 */
#ifndef S3CFS_WORKERS_H
#define S3CFS_WORKERS_H

typedef void (*workers_job_fn)(void *arg);

struct workers;

/* Start THREADS threads. Returns 0, ENOMEM or the pthread_create error. */
int workers_create(unsigned threads, struct workers **out);

/* Queue FN(ARG). Returns 0, ENOMEM, or ESHUTDOWN once destroy has begun
 * (the job is then not run and ARG stays the caller's). */
int workers_submit(struct workers *pool, workers_job_fn fn, void *arg);

/* Run every queued job, stop the threads, free the pool; *pool = NULL.
 * Safe twice. */
void workers_destroy(struct workers **pool);

#endif /* S3CFS_WORKERS_H */
