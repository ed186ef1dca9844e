/*
 * test_sigbus.c - unit tests for sigbus.c: a read of a mapped file past
 * its end (the file truncated under the mapping, which raises SIGBUS on
 * every file system) inside a guarded range is survived and reported,
 * the pages before it still read right, guards nest, and a SIGBUS outside
 * any guard still ends the process with SIGBUS; with crash.c's report
 * installed before, such a fault (and a SIGSEGV) is reported with a
 * backtrace on standard error first. (cmocka puts its own
 * SIGBUS handler in place for each test: each test installs ours.)
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/crash.h"
#include "base/sigbus.h"

#define PAGES 4

struct mapped {
    char path[64];
    int fd;
    char *map;
    size_t page, len;
};

/* A file of PAGES pages of 'a', 'b', 'c'..., mapped whole, then cut to
 * its first page: the other pages of the mapping now fault. */
static void map_then_truncate(struct mapped *m)
{
    m->page = (size_t)sysconf(_SC_PAGESIZE);
    m->len = PAGES * m->page;
    snprintf(m->path, sizeof(m->path), "/tmp/test_sigbus.XXXXXX");
    m->fd = mkstemp(m->path);
    assert_true(m->fd >= 0);
    char *bytes = malloc(m->len);
    assert_non_null(bytes);
    for (size_t i = 0; i < PAGES; i++)
        memset(bytes + i * m->page, 'a' + (int)i, m->page);
    assert_int_equal(write(m->fd, bytes, m->len), (ssize_t)m->len);
    free(bytes);
    m->map = mmap(NULL, m->len, PROT_READ, MAP_SHARED, m->fd, 0);
    assert_true(m->map != MAP_FAILED);
    assert_int_equal(ftruncate(m->fd, (off_t)m->page), 0);
}

static void unmap(struct mapped *m)
{
    munmap(m->map, m->len);
    close(m->fd);
    unlink(m->path);
}

/* The sum of LEN bytes at P, read through a volatile pointer (the read
 * must happen). */
static unsigned sum_of(const char *p, size_t len)
{
    const volatile char *v = p;
    unsigned sum = 0;

    for (size_t i = 0; i < len; i++)
        sum += (unsigned char)v[i];
    return sum;
}

static void test_guarded_fault_is_survived(void **state)
{
    (void)state;
    struct mapped m;
    struct sigbus_guard guard;

    assert_int_equal(sigbus_install(), 0);
    map_then_truncate(&m);
    sigbus_guard_begin(&guard, m.map, m.len);
    unsigned first = sum_of(m.map, m.page);
    unsigned rest = sum_of(m.map + m.page, m.len - m.page);
    assert_true(sigbus_guard_end(&guard));
    assert_int_equal(first, 'a' * m.page);  /* what is there reads right */
    assert_int_equal(rest, 0);              /* the rest reads as zeros */

    sigbus_guard_begin(&guard, m.map, m.page);
    assert_int_equal(sum_of(m.map, m.page), 'a' * m.page);
    assert_false(sigbus_guard_end(&guard)); /* no fault, none reported */
    unmap(&m);
}

static void test_guards_nest(void **state)
{
    (void)state;
    struct mapped m;
    struct sigbus_guard outer, inner;

    assert_int_equal(sigbus_install(), 0);
    map_then_truncate(&m);
    sigbus_guard_begin(&outer, m.map, m.len);
    sigbus_guard_begin(&inner, m.map, m.page);   /* not the faulting page */
    (void)sum_of(m.map + 2 * m.page, m.page);
    assert_false(sigbus_guard_end(&inner));
    assert_true(sigbus_guard_end(&outer));
    unmap(&m);
}

static void test_unguarded_fault_still_kills(void **state)
{
    (void)state;
    struct mapped m;
    int status = 0;

    assert_int_equal(sigbus_install(), 0);
    map_then_truncate(&m);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        (void)sum_of(m.map + m.page, m.page);    /* no guard */
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);

    /* a guard on another range does not cover it either */
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct sigbus_guard guard;
        sigbus_guard_begin(&guard, m.map, m.page);
        (void)sum_of(m.map + 3 * m.page, m.page);
        _exit(0);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);
    unmap(&m);
}

/* Run FAULT(M) in a child with crash.c's report installed, then
 * sigbus.c's handler, its standard error into a pipe; the signal the
 * child died of, and what it wrote (into OUT, LEN bytes). */
static int child_report(void (*fault)(struct mapped *), struct mapped *m,
                        char *out, size_t len)
{
    int pipe_fds[2], status = 0;
    size_t got = 0;

    assert_int_equal(pipe(pipe_fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        if (!crash_report_install() || sigbus_install() != 0)
            _exit(2);
        fault(m);
        _exit(0);
    }
    close(pipe_fds[1]);
    for (ssize_t n; got + 1 < len &&
                    (n = read(pipe_fds[0], out + got, len - 1 - got)) > 0;)
        got += (size_t)n;
    out[got] = '\0';
    close(pipe_fds[0]);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    return WTERMSIG(status);
}

static void read_past_the_end(struct mapped *m)
{
    (void)sum_of(m->map + m->page, m->page); /* no guard */
}

static void read_null(struct mapped *m)
{
    const char *volatile near_null = (const char *)(uintptr_t)8;

    (void)m;
    (void)sum_of(near_null, 1);
}

static void test_fatal_faults_are_reported(void **state)
{
    (void)state;
    struct mapped m;
    char report[8192];

    bool sanitized = !crash_report_install();
    signal(SIGBUS, SIG_DFL); /* (the children install their own) */
    signal(SIGSEGV, SIG_DFL);
    if (sanitized)
        skip(); /* the sanitizer's own report is in place of ours */
    map_then_truncate(&m);
    assert_int_equal(child_report(read_past_the_end, &m, report, sizeof(report)),
                     SIGBUS);
    assert_non_null(strstr(report, "s3cachefs: fatal: SIGBUS"));
    assert_non_null(strstr(report, "backtrace"));
    assert_non_null(strstr(report, "test_sigbus(")); /* a frame of it */

    assert_int_equal(child_report(read_null, &m, report, sizeof(report)),
                     SIGSEGV);
    assert_non_null(strstr(report, "s3cachefs: fatal: SIGSEGV"));
    assert_non_null(strstr(report, "at address 0x8;"));
    assert_non_null(strstr(report, "test_sigbus("));
    unmap(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guarded_fault_is_survived),
        cmocka_unit_test(test_guards_nest),
        cmocka_unit_test(test_unguarded_fault_still_kills),
        cmocka_unit_test(test_fatal_faults_are_reported),
    };

    return cmocka_run_group_tests_name("sigbus", tests, NULL, NULL);
}
