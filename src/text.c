/*
 * text.c - small text helpers that several parsers share (see text.h).
 */
#include "config.h"

#include "text.h"

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
