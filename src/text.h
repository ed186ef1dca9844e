/*
 * text.h - small text helpers that several parsers share: a strict
 * decimal of known length, and a sentence written into a caller's error
 * buffer. Pure.
 */
#ifndef S3CFS_TEXT_H
#define S3CFS_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The decimal of exactly LEN bytes at TEXT (digits only, no sign, no
 * spaces; 2^64 and above refused) into *OUT. */
bool text_parse_u64(const char *text, size_t len, uint64_t *out);

/* FMT into ERRBUF (ERRLEN bytes; nothing when NULL or 0). */
void text_set_err(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* S3CFS_TEXT_H */
