/*
 * text.h - small text helpers that several parsers share: a strict
 * decimal of known length, a sentence written into a caller's error
 * buffer, the characters XML 1.0 can carry, a hexadecimal digit. Pure.
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

/*
 * The length (1 to 4) of the character XML 1.0 allows that starts at
 * TEXT (LEN bytes there, LEN > 0), in strict UTF-8 (no overlong form, no
 * surrogate, nothing past U+10FFFF); 0 when the bytes there are none:
 * NUL and the C0 controls but tab, LF and CR, U+FFFE, U+FFFF, or a
 * sequence that is not UTF-8. (XML 1.0's Char production; expat refuses
 * a document with anything else in it.)
 */
size_t text_xml_char_len(const char *text, size_t len);

/* The value (0 to 15) of the hexadecimal digit C, either case; -1 when C
 * is not one. */
int text_hex_digit(char c);

#endif /* S3CFS_TEXT_H */
