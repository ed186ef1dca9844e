/*
 * clock.c - the program's one way to read the time (see clock.h).
 */
#include "config.h"

#include "base/clock.h"

#define NS_PER_S 1000000000L

static double seconds_of(const struct timespec *t)
{
    return (double)t->tv_sec + (double)t->tv_nsec / 1e9;
}

double clock_monotonic_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return seconds_of(&now);
}

uint64_t clock_monotonic_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

struct timespec clock_monotonic_after(double seconds)
{
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    if (seconds < 0)
        seconds = 0;
    at.tv_sec += (time_t)seconds;
    at.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (at.tv_nsec >= NS_PER_S) {
        at.tv_sec++;
        at.tv_nsec -= NS_PER_S;
    }
    return at;
}

double clock_wall_seconds(void)
{
    struct timespec now = clock_wall_now();
    return seconds_of(&now);
}

struct timespec clock_wall_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now;
}
