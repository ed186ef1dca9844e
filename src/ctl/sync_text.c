/*
 * sync_text.c - the text of the answers to `sync` and `pending` (see
 * sync_text.h): escaping paths, joining lines within the size of an
 * extended attribute, splitting them again.
 */
#include "config.h"

#include "ctl/sync_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *sync_text_escape(const char *text)
{
    size_t len = strlen(text);
    char *out = malloc(len * 4 + 1); /* every byte as \ooo at worst */
    char *at = out;

    if (out == NULL)
        return NULL;
    for (const unsigned char *in = (const unsigned char *)text; *in != '\0'; in++) {
        if (*in == '\\') {
            *at++ = '\\';
            *at++ = '\\';
        } else if (*in == '\t') {
            *at++ = '\\';
            *at++ = 't';
        } else if (*in == '\n') {
            *at++ = '\\';
            *at++ = 'n';
        } else if (*in < 0x20 || *in == 0x7f) {
            at += sprintf(at, "\\%03o", *in);
        } else {
            *at++ = (char)*in;
        }
    }
    *at = '\0';
    return out;
}

int sync_text_unescape(char *text)
{
    char *out = text;

    for (const char *in = text; *in != '\0'; in++) {
        if (*in != '\\') {
            *out++ = *in;
            continue;
        }
        in++;
        if (*in == '\\') {
            *out++ = '\\';
        } else if (*in == 't') {
            *out++ = '\t';
        } else if (*in == 'n') {
            *out++ = '\n';
        } else if (in[0] >= '0' && in[0] <= '3' && in[1] >= '0' && in[1] <= '7' &&
                   in[2] >= '0' && in[2] <= '7') {
            int value = (in[0] - '0') * 64 + (in[1] - '0') * 8 + (in[2] - '0');
            if (value == 0)
                return EINVAL;
            *out++ = (char)value;
            in += 2;
        } else {
            return EINVAL;
        }
    }
    *out = '\0';
    return 0;
}

int sync_text_join(const char *head, char *const *lines, size_t count,
                   size_t cap, char **out, size_t *len, size_t *listed)
{
    size_t head_len = strlen(head), total = head_len, taken = 0;

    *out = NULL;
    *len = 0;
    if (listed != NULL)
        *listed = 0;
    if (head_len > cap)
        return ERANGE;
    while (taken < count && total + strlen(lines[taken]) <= cap)
        total += strlen(lines[taken++]);
    char *text = malloc(total + 1);
    if (text == NULL)
        return ENOMEM;
    memcpy(text, head, head_len);
    size_t used = head_len;
    for (size_t i = 0; i < taken; i++) {
        size_t line_len = strlen(lines[i]);
        memcpy(text + used, lines[i], line_len);
        used += line_len;
    }
    text[used] = '\0';
    *out = text;
    *len = used;
    if (listed != NULL)
        *listed = taken;
    return 0;
}

size_t sync_text_split(char *line, char **fields, size_t max)
{
    size_t count = 0;

    if (max == 0)
        return 0;
    fields[count++] = line;
    for (char *at = line; *at != '\0' && count < max; at++)
        if (*at == '\t') {
            *at = '\0';
            fields[count++] = at + 1;
        }
    return count;
}

bool sync_text_summary_get(const char *summary, const char *name, double *value)
{
    size_t name_len = strlen(name);

    for (const char *at = summary; (at = strstr(at, name)) != NULL; at++) {
        bool starts = at == summary || at[-1] == ' ';
        if (!starts || at[name_len] != '=')
            continue;
        char *end = NULL;
        errno = 0;
        double parsed = strtod(at + name_len + 1, &end);
        if (errno != 0 || end == at + name_len + 1 ||
            (*end != ' ' && *end != '\n' && *end != '\0'))
            return false;
        *value = parsed;
        return true;
    }
    return false;
}
