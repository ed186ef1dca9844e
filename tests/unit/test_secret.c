/*
 * test_secret.c - unit tests for secret.c: copies of credentials live in
 * pages the kernel leaves out of core dumps (VmFlags "dd" in
 * /proc/self/smaps), and are wiped and unmapped when freed.
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

#include "base/secret.h"

/* The VmFlags line of the mapping of /proc/self/smaps holding ADDRESS. */
static void vm_flags_of(const void *address, char *out, size_t cap)
{
    FILE *smaps = fopen("/proc/self/smaps", "r");
    char line[512];
    bool inside = false;

    assert_non_null(smaps);
    out[0] = '\0';
    while (fgets(line, sizeof(line), smaps) != NULL) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) {
            inside = (uintptr_t)address >= start && (uintptr_t)address < end;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, cap, "%s", line + 8);
            break;
        }
    }
    fclose(smaps);
}

static void test_copy_not_dumped(void **state)
{
    (void)state;
    char flags[512];
    char *secret = secret_strdup("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");

    assert_non_null(secret);
    assert_string_equal(secret, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
    vm_flags_of(secret, flags, sizeof(flags));
    assert_non_null(strstr(flags, " dd"));
    secret_free(&secret);
    assert_null(secret);
    secret_free(&secret); /* safe twice */
}

static void test_long_and_empty(void **state)
{
    (void)state;
    size_t len = 3 * 4096 + 17; /* more than one page */
    char *text = malloc(len + 1);
    assert_non_null(text);
    memset(text, 'k', len);
    text[len] = '\0';
    char *secret = secret_strdup(text);
    assert_non_null(secret);
    assert_string_equal(secret, text);
    secret_free(&secret);
    free(text);

    char *empty = secret_strdup("");
    assert_non_null(empty);
    assert_string_equal(empty, "");
    secret_free(&empty);
    assert_null(secret_strdup(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_not_dumped),
        cmocka_unit_test(test_long_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
