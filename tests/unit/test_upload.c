/*
 * test_upload.c - unit tests for the pure part of the uploader: the part
 * size, and the fixed part layout of write-behind uploads. (The network
 * side runs against real servers in the integration tests.)
 *
 * One row per object size: the part size must never be below the minimum
 * asked for (nor below S3's 5 MiB), must be a multiple of 1 MiB once it
 * had to grow, and must fit the object in 10,000 parts, up to S3's
 * largest object (5 TiB).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "writer/upload.h"
#include "writer/writebehind.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define TIB (1ull << 40)

struct row {
    uint64_t size;
    uint64_t min_part;
    uint64_t expected;          /* 0: only check the invariants */
};

static const struct row rows[] = {
    {0, 5 * MIB, 5 * MIB},
    {1, 5 * MIB, 5 * MIB},
    {5 * MIB, 5 * MIB, 5 * MIB},
    {40 * MIB, 8 * MIB, 8 * MIB},
    {10000 * 5 * MIB, 5 * MIB, 5 * MIB},       /* exactly 10,000 parts */
    {10000 * 5 * MIB + 1, 5 * MIB, 6 * MIB},   /* one byte more: grows */
    {50 * GIB, 5 * MIB, 6 * MIB},
    {50 * GIB, 64 * MIB, 64 * MIB},
    {1 * TIB, 5 * MIB, 105 * MIB},
    {5 * TIB, 5 * MIB, 525 * MIB},
    {5 * TIB, 512 * MIB, 525 * MIB},
    {5 * TIB, 1 * GIB, 1 * GIB},
    {100 * MIB, 1 * MIB, 5 * MIB},             /* below S3's minimum */
    {100 * MIB, 0, 5 * MIB},
    {3 * GIB, 5 * MIB + 1, 5 * MIB + 1},       /* odd minimum kept if it fits */
    {100 * GIB, 5 * MIB + 1, 11 * MIB},
    {UINT64_MAX / 2, 5 * MIB, 0},
};

static void test_part_size_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const struct row *row = &rows[i];
        uint64_t part = upload_part_size(row->size, row->min_part);
        uint64_t floor = row->min_part > UPLOAD_MIN_PART_SIZE
                             ? row->min_part : UPLOAD_MIN_PART_SIZE;
        uint64_t parts = (row->size + part - 1) / part;

        if (row->expected != 0 && part != row->expected)
            fail_msg("row %zu: size %llu min %llu: part %llu, expected %llu",
                     i, (unsigned long long)row->size,
                     (unsigned long long)row->min_part,
                     (unsigned long long)part,
                     (unsigned long long)row->expected);
        assert_true(part >= floor);
        assert_true(parts <= UPLOAD_MAX_PARTS);
        if (part != floor)
            assert_int_equal(part % MIB, 0);
    }
}

/* Every size around the growth steps: parts fit and the size is the
 * smallest multiple of 1 MiB that fits. */
static void test_part_size_is_smallest(void **state)
{
    (void)state;
    for (uint64_t mib = 5; mib <= 600; mib++) {
        uint64_t edge = mib * MIB * UPLOAD_MAX_PARTS;
        for (int delta = -1; delta <= 1; delta++) {
            uint64_t size = edge + (uint64_t)(int64_t)delta;
            uint64_t part = upload_part_size(size, UPLOAD_MIN_PART_SIZE);
            assert_true((size + part - 1) / part <= UPLOAD_MAX_PARTS);
            assert_int_equal(part % MIB, 0);
            if (part > UPLOAD_MIN_PART_SIZE)
                assert_true((size + (part - MIB) - 1) / (part - MIB) >
                            UPLOAD_MAX_PARTS);
        }
    }
    /* the largest object S3 accepts fits, with parts under S3's 5 GiB */
    uint64_t part = upload_part_size(5 * TIB, UPLOAD_MIN_PART_SIZE);
    assert_true((5 * TIB + part - 1) / part <= UPLOAD_MAX_PARTS);
    assert_true(part <= 5 * GIB);
}

/* Write-behind parts: contiguous from 0, each between S3's 5 MiB and
 * 5 GiB, doubling every 1000 parts, and 10,000 of them hold 5 TiB. */
static void test_writebehind_layout(void **state)
{
    (void)state;
    const uint64_t bases[] = {5 * MIB, 8 * MIB};
    uint64_t offset, length;

    writebehind_part_range(0, 8 * MIB, &offset, &length);
    assert_int_equal(offset, 0);
    assert_int_equal(length, 8 * MIB);
    writebehind_part_range(999, 8 * MIB, &offset, &length);
    assert_int_equal(offset, 999 * 8 * MIB);
    writebehind_part_range(1000, 8 * MIB, &offset, &length);
    assert_int_equal(offset, 8000 * MIB);
    assert_int_equal(length, 16 * MIB);
    writebehind_part_range(2001, 8 * MIB, &offset, &length);
    assert_int_equal(offset, 8000 * MIB + 16000 * MIB + 32 * MIB);
    assert_int_equal(length, 32 * MIB);

    for (size_t b = 0; b < sizeof(bases) / sizeof(bases[0]); b++) {
        uint64_t expected = 0;
        for (unsigned i = 0; i < UPLOAD_MAX_PARTS; i++) {
            writebehind_part_range(i, bases[b], &offset, &length);
            assert_int_equal(offset, expected);
            assert_true(length >= UPLOAD_MIN_PART_SIZE);
            assert_true(length <= 5 * GIB);
            expected = offset + length;
        }
        assert_int_equal(writebehind_capacity(bases[b]), expected);
    }
    assert_true(writebehind_capacity(8 * MIB) >= 5 * TIB);
    /* bases outside S3's limits are clamped: still 5 MiB parts at least,
     * and never a part over 5 GiB */
    assert_int_equal(writebehind_capacity(1 * MIB),
                     writebehind_capacity(5 * MIB));
    assert_int_equal(writebehind_capacity(64 * MIB),
                     writebehind_capacity(8 * MIB));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_part_size_table),
        cmocka_unit_test(test_part_size_is_smallest),
        cmocka_unit_test(test_writebehind_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
