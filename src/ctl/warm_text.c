/*
 * warm_text.c - the text of the answers to `s3cachefs warm` (see
 * warm_text.h).
 */
#include "config.h"

#include "base/text.h"
#include "ctl/warm_text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define HEADER "s3cachefs-warm "

static const char *const status_names[WARM_TEXT_STATUS_COUNT] = {
    [WARM_TEXT_DONE] = "done",
    [WARM_TEXT_INTERRUPTED] = "interrupted",
    [WARM_TEXT_FAILED] = "failed",
    [WARM_TEXT_STAGED] = "staged",
    [WARM_TEXT_FULL] = "full",
};

const char *warm_text_status_name(enum warm_text_status status)
{
    return (unsigned)status < WARM_TEXT_STATUS_COUNT ? status_names[status] : "?";
}

int warm_text_format(const struct warm_text_answer *answer, char *buf, size_t cap,
                     size_t *len)
{
    int n = snprintf(buf, cap,
                     HEADER "%d\nstatus %s\nerror %d\nsize %" PRIu64
                     "\nbefore %" PRIu64 "\nfetched %" PRIu64 "\ncached %" PRIu64
                     "\nfreed %" PRIu64 "\npinned %d\npin_used %" PRIu64
                     "\npin_max %" PRIu64 "\n",
                     WARM_TEXT_VERSION, warm_text_status_name(answer->status),
                     answer->error, answer->size, answer->before,
                     answer->fetched, answer->cached, answer->freed,
                     answer->pinned ? 1 : 0, answer->pin_used, answer->pin_max);

    *len = 0;
    if (n < 0 || (size_t)n >= cap)
        return ERANGE;
    *len = (size_t)n;
    return 0;
}

static bool word_is(const char *text, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(text, word, len) == 0;
}

int warm_text_parse(const char *text, size_t len, struct warm_text_answer *out)
{
    const char *end = text + len;
    bool have_status = false, have_size = false, have_cached = false;
    bool first = true;

    *out = (struct warm_text_answer){0};
    while (text < end) {
        const char *nl = memchr(text, '\n', (size_t)(end - text));
        const char *line_end = nl != NULL ? nl : end;
        const char *space = memchr(text, ' ', (size_t)(line_end - text));
        if (space == NULL)
            return EINVAL;
        const char *value = space + 1;
        size_t name_len = (size_t)(space - text);
        size_t value_len = (size_t)(line_end - value);
        uint64_t number = 0;

        if (first) {
            if (!word_is(text, name_len, "s3cachefs-warm") ||
                !text_parse_u64(value, value_len, &number))
                return EINVAL;
            if (number != WARM_TEXT_VERSION)
                return EPROTONOSUPPORT;
            first = false;
        } else if (word_is(text, name_len, "status")) {
            unsigned i;
            for (i = 0; i < WARM_TEXT_STATUS_COUNT; i++)
                if (word_is(value, value_len, status_names[i]))
                    break;
            if (i == WARM_TEXT_STATUS_COUNT)
                return EINVAL;
            out->status = (enum warm_text_status)i;
            have_status = true;
        } else if (word_is(text, name_len, "error") || word_is(text, name_len, "pinned")) {
            if (!text_parse_u64(value, value_len, &number) || number > 65535)
                return EINVAL;
            if (text[0] == 'e')
                out->error = (int)number;
            else
                out->pinned = number != 0;
        } else {
            uint64_t *field = word_is(text, name_len, "size")      ? &out->size
                              : word_is(text, name_len, "before")  ? &out->before
                              : word_is(text, name_len, "fetched") ? &out->fetched
                              : word_is(text, name_len, "cached")  ? &out->cached
                              : word_is(text, name_len, "freed")   ? &out->freed
                              : word_is(text, name_len, "pin_used") ? &out->pin_used
                              : word_is(text, name_len, "pin_max") ? &out->pin_max
                                                                   : NULL;
            /* a name not known: a newer daemon's, skipped */
            if (field != NULL && !text_parse_u64(value, value_len, field))
                return EINVAL;
            have_size = have_size || field == &out->size;
            have_cached = have_cached || field == &out->cached;
        }
        text = nl != NULL ? nl + 1 : end;
    }
    if (first || !have_status || !have_size || !have_cached)
        return EINVAL;
    return 0;
}
