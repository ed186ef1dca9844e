/*
 * stats_text.c - parsing the text of user.s3cachefs.stats (see
 * stats_text.h). Strict: a line that is not "name value" is an error
 * rather than a counter silently lost, since a cost is computed from
 * these numbers.
 */
#include "config.h"

#include "ctl/stats_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* VALUE (NUL-terminated) into COUNTER: an unsigned integer that fits in
 * 64 bits, or digits '.' digits. 0 or EINVAL. */
static int parse_value(const char *value, struct stats_counter *counter)
{
    const char *at = value;
    uint64_t integer = 0;
    bool overflow = false;

    if (*at < '0' || *at > '9')
        return EINVAL;
    /* JSON forbids leading zeros ("007"), and so does this */
    if (at[0] == '0' && at[1] >= '0' && at[1] <= '9')
        return EINVAL;
    for (; *at >= '0' && *at <= '9'; at++) {
        uint64_t digit = (uint64_t)(*at - '0');
        if (integer > (UINT64_MAX - digit) / 10)
            overflow = true;
        integer = integer * 10 + digit;
    }
    counter->integer = *at == '\0';
    if (*at == '.') {
        at++;
        if (*at < '0' || *at > '9')
            return EINVAL;
        while (*at >= '0' && *at <= '9')
            at++;
    }
    if (*at != '\0' || (counter->integer && overflow))
        return EINVAL;
    counter->value = counter->integer ? integer : 0;
    counter->real = strtod(value, NULL);
    snprintf(counter->text, sizeof(counter->text), "%s", value);
    return 0;
}

int stats_text_parse(const char *text, size_t len, struct stats_text *out,
                     char *err, size_t errlen)
{
    size_t at = 0;
    unsigned line = 0;
    int result = 0;

    stats_text_free(out);
    out->counters = calloc(STATS_TEXT_MAX_COUNTERS, sizeof(*out->counters));
    if (out->counters == NULL)
        return ENOMEM;
    while (at < len) {
        size_t end = at;
        line++;
        while (end < len && text[end] != '\n')
            end++;
        size_t line_len = end - at;
        const char *start = text + at;
        at = end + 1;
        if (line_len == 0)
            continue;   /* a trailing newline, or a blank line */

        const char *space = memchr(start, ' ', line_len);
        size_t name_len = space ? (size_t)(space - start) : line_len;
        size_t value_len = space ? line_len - name_len - 1 : 0;
        char name[STATS_TEXT_MAX_NAME], value[STATS_TEXT_MAX_VALUE];
        bool good = space != NULL && name_len > 0 && name_len < sizeof(name) &&
                    value_len > 0 && value_len < sizeof(value);
        for (size_t i = 0; good && i < name_len; i++)
            good = name_char(start[i]);
        if (good) {
            memcpy(name, start, name_len);
            name[name_len] = '\0';
            memcpy(value, space + 1, value_len);
            value[value_len] = '\0';
            good = memchr(value, '\0', value_len) == NULL;
        }
        if (out->count == STATS_TEXT_MAX_COUNTERS) {
            snprintf(err, errlen, "more than %d counters",
                     STATS_TEXT_MAX_COUNTERS);
            result = EPROTO;
            break;
        }
        struct stats_counter *counter = &out->counters[out->count];
        if (!good || parse_value(value, counter) != 0) {
            snprintf(err, errlen, "line %u of the counters is not \"name "
                     "value\": '%.*s'", line, (int)(line_len > 60 ? 60 : line_len),
                     start);
            result = EPROTO;
            break;
        }
        if (stats_text_find(out, name) != NULL) {
            snprintf(err, errlen, "line %u of the counters repeats '%s'", line,
                     name);
            result = EPROTO;
            break;
        }
        snprintf(counter->name, sizeof(counter->name), "%s", name);
        out->count++;
    }
    if (result == 0 && out->count == 0) {
        snprintf(err, errlen, "%s", "no counters at all");
        result = EPROTO;
    }
    return result;
}

const struct stats_counter *stats_text_find(const struct stats_text *stats,
                                            const char *name)
{
    for (size_t i = 0; i < stats->count; i++)
        if (strcmp(stats->counters[i].name, name) == 0)
            return &stats->counters[i];
    return NULL;
}

int stats_text_get(const struct stats_text *stats, const char *name,
                   uint64_t *value)
{
    const struct stats_counter *counter = stats_text_find(stats, name);

    *value = 0;
    if (counter == NULL)
        return ENOENT;
    if (!counter->integer)
        return EINVAL;
    *value = counter->value;
    return 0;
}

void stats_text_free(struct stats_text *stats)
{
    free(stats->counters);
    stats->counters = NULL;
    stats->count = 0;
}
