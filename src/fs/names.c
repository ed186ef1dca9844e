/*
 * names.c - S3 key <-> file name mapping (see names.h).
 */
#include "config.h"

#include "fs/names.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"

int names_check(const char *name, size_t len)
{
    if (len > NAMES_NAME_MAX)
        return ENAMETOOLONG;
    if (len == 0 || memchr(name, '/', len) != NULL)
        return EINVAL;
    if (name[0] == '.' && (len == 1 || (len == 2 && name[1] == '.')))
        return EINVAL;
    for (size_t at = 0; at < len;) {
        size_t n = text_xml_char_len(name + at, len - at);
        if (n == 0 || name[at] == '\r')
            return EILSEQ;
        at += n;
    }
    return 0;
}

bool names_is_valid(const char *name, size_t len)
{
    return names_check(name, len) == 0;
}

void names_printable(const char *key, char *out, size_t cap)
{
    size_t len = strlen(key);
    size_t used = 0;

    if (cap == 0)
        return;
    for (size_t at = 0; at < len;) {
        size_t n = text_xml_char_len(key + at, len - at);
        bool escape = n == 0 || (unsigned char)key[at] < 0x20 ||
                      key[at] == 0x7f;
        size_t width = escape ? 4 : n;
        if (used + width >= cap)
            break;
        if (escape) {
            snprintf(out + used, cap - used, "\\x%02x",
                     (unsigned)(unsigned char)key[at]);
            at++;
        } else {
            memcpy(out + used, key + at, n);
            at += n;
        }
        used += width;
    }
    out[used] = '\0';
}

enum names_entry_kind names_classify(const char *dir_prefix, const char *key,
                                     const char **name, size_t *name_len)
{
    size_t prefix_len = strlen(dir_prefix);
    size_t key_len = strlen(key);

    *name = key + (key_len >= prefix_len ? prefix_len : key_len);
    *name_len = 0;
    if (key_len < prefix_len || memcmp(key, dir_prefix, prefix_len) != 0)
        return NAMES_ENTRY_INVALID;
    if (key_len == prefix_len)
        return NAMES_ENTRY_SELF;

    const char *rest = key + prefix_len;
    size_t rest_len = key_len - prefix_len;
    const char *slash = memchr(rest, '/', rest_len);
    if (slash == NULL) {
        *name_len = rest_len;
        return names_is_valid(rest, rest_len) ? NAMES_ENTRY_FILE
                                              : NAMES_ENTRY_INVALID;
    }
    /* A directory only when the slash is the last byte: "name/". Anything
     * deeper cannot come back from a delimiter listing of this prefix. */
    *name_len = (size_t)(slash - rest);
    if (slash != rest + rest_len - 1)
        return NAMES_ENTRY_INVALID;
    return names_is_valid(rest, *name_len) ? NAMES_ENTRY_DIR
                                           : NAMES_ENTRY_INVALID;
}

char *names_child_key(const char *dir_prefix, const char *name, size_t name_len,
                      bool as_dir)
{
    size_t prefix_len = strlen(dir_prefix);
    char *key = malloc(prefix_len + name_len + 2);

    if (key == NULL)
        return NULL;
    memcpy(key, dir_prefix, prefix_len);
    memcpy(key + prefix_len, name, name_len);
    size_t end = prefix_len + name_len;
    if (as_dir)
        key[end++] = '/';
    key[end] = '\0';
    return key;
}

char *names_parent_key(const char *key)
{
    size_t len = strlen(key);
    if (len > 0 && key[len - 1] == '/')
        len--;
    while (len > 0 && key[len - 1] != '/')
        len--;
    return strndup(key, len);
}

char *names_last_name(const char *key)
{
    size_t len = strlen(key);
    if (len > 0 && key[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && key[start - 1] != '/')
        start--;
    return strndup(key + start, len - start);
}
