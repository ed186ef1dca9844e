/*
 * test_sigbus.c - unit tests for sigbus.c: a read of a mapped file past
 * its end (the file truncated under the mapping, which raises SIGBUS on
 * every file system) inside a guarded range is survived and reported,
 * the pages before it still read right, guards nest, and a SIGBUS outside
 * any guard still ends the process with SIGBUS. (cmocka puts its own
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

#include "sigbus.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guarded_fault_is_survived),
        cmocka_unit_test(test_guards_nest),
        cmocka_unit_test(test_unguarded_fault_still_kills),
    };

    return cmocka_run_group_tests_name("sigbus", tests, NULL, NULL);
}
