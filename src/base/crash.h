/*
 * crash.h - a report of the fault that ends the process.
 *
 * The daemon holds credentials, so it makes no core dump (main.c clears
 * its dumpable flag). A fault would then leave nothing but "exited with
 * -11". Instead, a fatal signal (SIGSEGV, SIGBUS outside a guarded
 * mapping, SIGFPE, SIGILL, SIGABRT) writes one line naming the signal and
 * the faulting address, then the thread's backtrace, to standard error
 * (the journal under systemd), and the process then dies of the signal as
 * it would have. Frames read "s3cachefs(+0x1234)": `addr2line -f -e
 * s3cachefs 0x1234` names the function and line. Nothing of the report
 * comes from memory the fault may have damaged but the stack itself, and
 * no secret is on it in text.
 */
#ifndef S3CFS_CRASH_H
#define S3CFS_CRASH_H

#include <stdbool.h>

/* Install the report for the fatal signals, once, before any thread
 * starts; whether it was. Not in a sanitizer build, whose own report is
 * better. */
bool crash_report_install(void);

#endif /* S3CFS_CRASH_H */
