/*
 * workers.c - fixed thread pool with a FIFO job queue (see workers.h).
 *
 * lock guards head/tail/stopping; job_queued is signalled when a job is
 * added or when stopping begins. Threads drain the queue before exiting.
 */
#include "config.h"

#include "base/workers.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct job {
    workers_job_fn fn;
    void *arg;
    struct job *next;
};

struct workers {
    pthread_mutex_t lock;
    pthread_cond_t job_queued;
    struct job *head, *tail;
    bool stopping;
    pthread_t *threads;
    unsigned thread_count;
};

static void *worker_main(void *arg)
{
    struct workers *pool = arg;

    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (pool->head == NULL && !pool->stopping)
            pthread_cond_wait(&pool->job_queued, &pool->lock);
        struct job *job = pool->head;
        if (job == NULL)
            break; /* stopping and drained */
        pool->head = job->next;
        if (pool->head == NULL)
            pool->tail = NULL;
        pthread_mutex_unlock(&pool->lock);
        job->fn(job->arg);
        free(job);
        pthread_mutex_lock(&pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

int workers_create(unsigned threads, struct workers **out)
{
    struct workers *pool = calloc(1, sizeof(*pool));
    int err = 0;

    *out = NULL;
    if (pool == NULL)
        return ENOMEM;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->job_queued, NULL);
    pool->threads = calloc(threads, sizeof(pthread_t));
    if (pool->threads == NULL) {
        err = ENOMEM;
        goto out;
    }
    for (; pool->thread_count < threads; pool->thread_count++) {
        err = pthread_create(&pool->threads[pool->thread_count], NULL,
                             worker_main, pool);
        if (err != 0)
            goto out;
    }
out:
    if (err != 0)
        workers_destroy(&pool);
    *out = pool;
    return err;
}

int workers_submit(struct workers *pool, workers_job_fn fn, void *arg)
{
    struct job *job = malloc(sizeof(*job));

    if (job == NULL)
        return ENOMEM;
    *job = (struct job){.fn = fn, .arg = arg};
    pthread_mutex_lock(&pool->lock);
    if (pool->stopping) {
        pthread_mutex_unlock(&pool->lock);
        free(job);
        return ESHUTDOWN;
    }
    if (pool->tail != NULL)
        pool->tail->next = job;
    else
        pool->head = job;
    pool->tail = job;
    pthread_cond_signal(&pool->job_queued);
    pthread_mutex_unlock(&pool->lock);
    return 0;
}

void workers_destroy(struct workers **poolp)
{
    struct workers *pool = *poolp;

    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->job_queued);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < pool->thread_count; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->job_queued);
    free(pool);
    *poolp = NULL;
}
