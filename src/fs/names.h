/*
 * names.h - the mapping between S3 keys and file names (pure).
 *
 * A directory's key prefix is "" (the bucket root) or ends in '/'. A child
 * called NAME of a directory with prefix P is the object P+NAME (file or
 * symlink) or the prefix P+NAME+"/" (directory). Keys that cannot be file
 * names (empty components, "." or "..", components over NAME_MAX bytes,
 * bytes a listing does not carry back) are reported so the caller can skip
 * them with one log line.
 *
 * A name is what every server's listing gives back unchanged: UTF-8 (S3
 * keys are UTF-8; s3rver stores other bytes as their %-escapes, Swift
 * refuses them) of characters XML 1.0 carries as they are, so no C0
 * control but tab and LF (servers that ignore encoding-type=url, s3rver
 * among them, send keys raw in the XML; a raw CR reads as LF), no U+FFFE
 * or U+FFFF. The same rule decides what a create may make and what a
 * listing shows, so every name shown can be made again.
 */
#ifndef S3CFS_NAMES_H
#define S3CFS_NAMES_H

#include <stdbool.h>
#include <stddef.h>

/* Longest file name component, as Linux. */
#define NAMES_NAME_MAX 255

/* Longest key S3 stores (bytes of UTF-8): a longer path cannot be made. */
#define NAMES_KEY_MAX 1024

/* Whether LEN bytes of NAME can be a file name: 1..255 bytes, no '/',
 * not "." or "..", characters a listing carries back (see above). */
bool names_is_valid(const char *name, size_t len);

/* names_is_valid() as an errno: 0; ENAMETOOLONG over NAMES_NAME_MAX
 * bytes; EILSEQ for a byte sequence no listing carries back (not UTF-8,
 * a control character but tab and LF, U+FFFE, U+FFFF; NUL included);
 * EINVAL for "", ".", ".." or a '/'. */
int names_check(const char *name, size_t len);

/* KEY as a log line shows it: every byte of a control character (C0, DEL)
 * or of a sequence that is not UTF-8 written as \xNN, the rest as it is,
 * into OUT (CAP bytes, NUL-terminated; cut short, never inside an
 * escape, when it does not fit). */
void names_printable(const char *key, char *out, size_t cap);

enum names_entry_kind {
    NAMES_ENTRY_FILE,      /* an object directly under the prefix */
    NAMES_ENTRY_DIR,       /* a common prefix, or a "name/" marker object */
    NAMES_ENTRY_SELF,      /* the prefix's own "dir/" marker object */
    NAMES_ENTRY_INVALID,   /* cannot be shown as a file name */
};

/*
 * Classify KEY (an object key or a common prefix from a delimiter listing of
 * DIR_PREFIX, which KEY must start with). On return *name points into KEY
 * at the child's name and *name_len is its length (without a trailing '/').
 */
enum names_entry_kind names_classify(const char *dir_prefix, const char *key,
                                     const char **name, size_t *name_len);

/*
 * The key of child NAME of DIR_PREFIX: P+NAME, or P+NAME+"/" when AS_DIR.
 * Returns a malloc'd string (caller frees) or NULL when out of memory.
 */
char *names_child_key(const char *dir_prefix, const char *name, size_t name_len,
                      bool as_dir);

/* The prefix of KEY's parent directory ("a/b/" for "a/b/c" and "a/b/c/",
 * "" at the top), malloc'd; NULL when out of memory. */
char *names_parent_key(const char *key);

/* The last component of KEY without a trailing '/', malloc'd; NULL when
 * out of memory. */
char *names_last_name(const char *key);

#endif /* S3CFS_NAMES_H */
