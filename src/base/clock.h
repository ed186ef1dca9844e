/*
 * clock.h - the program's one way to read the time.
 *
 * Two clocks: the monotonic one for intervals, timeouts and ages within a
 * run (never jumps), and the wall clock for what is stored or shown
 * (mtimes, ages that must survive a remount). Condition variables that
 * wait with a timeout are created with CLOCK_MONOTONIC
 * (pthread_condattr_setclock), and clock_monotonic_after() makes their
 * deadlines.
 */
#ifndef S3CFS_CLOCK_H
#define S3CFS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds on the monotonic clock (an arbitrary origin). */
double clock_monotonic_seconds(void);

/* Milliseconds on the monotonic clock. */
uint64_t clock_monotonic_ms(void);

/* The monotonic time SECONDS (>= 0) from now: a deadline for
 * pthread_cond_timedwait() on a condition variable of that clock. */
struct timespec clock_monotonic_after(double seconds);

/* The wall clock (CLOCK_REALTIME), as seconds since the epoch. */
double clock_wall_seconds(void);

/* The wall clock (CLOCK_REALTIME). */
struct timespec clock_wall_now(void);

#endif /* S3CFS_CLOCK_H */
