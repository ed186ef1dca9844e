/*
 * text.c - small text helpers that several parsers share (see text.h).
 */
#include "config.h"

#include "base/text.h"

#include <stdarg.h>
#include <stdio.h>

bool text_parse_u64(const char *text, size_t len, uint64_t *out)
{
    uint64_t value = 0;

    if (len == 0 || len > 20)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return false;
        uint64_t digit = (uint64_t)(text[i] - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return false;
        value = value * 10 + digit;
    }
    *out = value;
    return true;
}

void text_set_err(char *errbuf, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (errbuf == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

size_t text_xml_char_len(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t need;
    uint32_t code;

    if (s[0] < 0x80)
        return s[0] >= 0x20 || s[0] == '\t' || s[0] == '\n' || s[0] == '\r'
                   ? 1 : 0;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        need = 2;
        code = s[0] & 0x1Fu;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        need = 3;
        code = s[0] & 0x0Fu;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        need = 4;
        code = s[0] & 0x07u;
    } else {
        return 0;   /* a continuation byte, C0/C1 (overlong), F5..FF */
    }
    if (len < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        code = code << 6 | (s[i] & 0x3Fu);
    }
    if ((need == 3 && code < 0x800) || (need == 4 && code < 0x10000) ||
        code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF) ||
        code == 0xFFFE || code == 0xFFFF)
        return 0;
    return need;
}

int text_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}
