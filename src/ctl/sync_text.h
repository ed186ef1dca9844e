/*
 * sync_text.h - the text the daemon answers `s3cachefs sync` and
 * `s3cachefs pending` with (the user.s3cachefs.sync and
 * user.s3cachefs.pending attributes of the mount root, fs.h): written by
 * fs_sync.c, read by sync_cmd.c. Pure: no state, no I/O.
 *
 * Lines, each ending in '\n':
 *   s3cachefs-sync 1                    (or: s3cachefs-pending 1)
 *   summary NAME=VALUE NAME=VALUE ...    every file counted, listed or not
 *   file<TAB>FIELD<TAB>...<TAB>PATH      one per file, as many as fit
 * The number after the name is the format's version, raised when the
 * fields of a file line change; a reader ignores summary names it does
 * not know. PATH, always last, is the file's path under the mount root,
 * escaped (sync_text_escape()). The fields:
 *   sync     STATE SIZE ERRNO RETRIES PATH
 *            STATE: uploaded, failed, removed, not-closed, waiting
 *            summary: files bytes seconds uploaded failed removed
 *            not_closed waiting interrupted
 *   pending  STATE SIZE PROMISED OPEN AGE RETRIES ERRNO STAGING_ID PATH
 *            STATE: open, waiting, uploading, failed; PROMISED: bytes the
 *            journal promises, or "-"; OPEN: 1 if open for writing; AGE:
 *            seconds since it was closed, or "-"; STAGING_ID: 16 hex
 *            digits (CACHE/staging/ID). A directory's marker waiting to
 *            be sent (writeback mode): PATH ends in '/', SIZE 0,
 *            STAGING_ID "-", AGE since the change it sends
 *            summary: files bytes open waiting uploading failed
 *            journal_entries markers markers_failed (files: not the
 *            markers)
 * An extended attribute's value has at most 64 KiB (the kernel's
 * XATTR_SIZE_MAX): the summary always goes, file lines while they fit,
 * the daemon putting first the ones that matter most (failures).
 */
#ifndef S3CFS_SYNC_TEXT_H
#define S3CFS_SYNC_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#define SYNC_TEXT_SYNC_HEADER "s3cachefs-sync 1"
#define SYNC_TEXT_PENDING_HEADER "s3cachefs-pending 1"
#define SYNC_TEXT_VALUE_MAX 65536     /* XATTR_SIZE_MAX */
#define SYNC_TEXT_FIELDS_MAX 16

/* TEXT with '\\', control bytes and DEL written as \\, \t, \n or \ooo
 * (three octal digits): malloc'd, NULL when out of memory. */
char *sync_text_escape(const char *text);

/* Undo sync_text_escape() in place (never longer). 0, or EINVAL for an
 * escape it never writes (TEXT is then undefined). */
int sync_text_unescape(char *text);

/*
 * HEAD, then LINES[0..COUNT) in order (each ending in '\n') while the
 * whole stays within CAP bytes: malloc'd into *OUT (NUL-terminated, its
 * length in *LEN, at most CAP without the NUL). *LISTED (may be NULL)
 * gets how many lines went in. 0, ENOMEM, or ERANGE when HEAD alone does
 * not fit.
 */
int sync_text_join(const char *head, char *const *lines, size_t count,
                   size_t cap, char **out, size_t *len, size_t *listed);

/* Split LINE (no '\n') at its tabs, in place, into at most MAX fields
 * (the last one keeps any further tabs); returns how many. */
size_t sync_text_split(char *line, char **fields, size_t max);

/* The value of NAME in SUMMARY ("summary a=1 b=2.5"): true and *VALUE, or
 * false when it is absent or not a number. */
bool sync_text_summary_get(const char *summary, const char *name, double *value);

#endif /* S3CFS_SYNC_TEXT_H */
