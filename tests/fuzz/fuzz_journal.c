/*
 * fuzz_journal.c - libFuzzer target for the journal's record decoder
 * (journal_record_decode() in src/journal.c), what a scan applies to every
 * value it finds in CACHE/journal after a crash.
 *
 * An input is one byte whose low four bits give the length of the LMDB
 * key (8 for a real id), that many key bytes, then the record. Beyond
 * ASan, UBSan and leaks, the target checks journal.h's promises: EPROTO
 * with a reason or ENOMEM and nothing allocated, or an entry whose key is
 * 1 to 1024 bytes, whose upload id is absent or at most 2048, whose mtime
 * is normalised and whose id is the key's. And the round trip: the
 * encoder turns a decoded entry back into the very record it came from
 * (a format 2 record without flags comes back in format 1, which is how
 * the encoder writes such an entry).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "writer/journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz_journal: %s:%d: check failed: %s\n",     \
                    __FILE__, __LINE__, #cond);                            \
            abort();                                                       \
        }                                                                  \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct journal_entry entry;
    const uint8_t *key, *value;
    size_t key_len, len;
    unsigned char *record = NULL;
    size_t record_len = 0;
    char *strings = (char *)"unset";
    const char *why = "unset";
    uint64_t id = 0;
    int rc;

    if (size < 1)
        return 0;
    key_len = data[0] & 0x0f;
    if (size - 1 < key_len)
        return 0;
    key = data + 1;
    value = key + key_len;
    len = size - 1 - key_len;

    rc = journal_record_decode(key, key_len, value, len, &entry, &strings,
                               &why);
    CHECK(rc == 0 || rc == EPROTO || rc == ENOMEM);
    if (rc != 0) {
        CHECK(strings == NULL);
        CHECK(rc != EPROTO || why != NULL);
        return 0;
    }
    CHECK(why == NULL);
    CHECK(key_len == 8);
    for (size_t i = 0; i < 8; i++)
        id = id << 8 | key[i];
    CHECK(entry.id == id);
    CHECK(entry.key != NULL);
    CHECK(strlen(entry.key) >= 1 && strlen(entry.key) <= 1024);
    CHECK(entry.upload_id == NULL ||
          (strlen(entry.upload_id) >= 1 && strlen(entry.upload_id) <= 2048));
    CHECK(entry.mtime.tv_nsec >= 0 && entry.mtime.tv_nsec < 1000000000L);

    CHECK(entry.kind == JOURNAL_UPLOAD || entry.kind == JOURNAL_MOVE);
    CHECK(entry.destination == NULL || (strlen(entry.destination) >= 1 &&
                                        strlen(entry.destination) <= 2048));
    if (entry.kind == JOURNAL_MOVE) {
        CHECK(value[0] == 3);
        CHECK(entry.move_to != NULL && strlen(entry.move_to) >= 1 &&
              strlen(entry.move_to) <= 1024);
        CHECK(entry.move_etag != NULL && strlen(entry.move_etag) <= 255);
    } else {
        CHECK(entry.move_to == NULL && entry.move_etag == NULL);
    }

    if (value[0] == 3) {
        /* the current format: encoding gives back the very bytes */
        CHECK(entry.destination != NULL);
        rc = journal_record_encode(&entry, &record, &record_len);
        CHECK(rc == 0 || rc == ENOMEM);
        if (rc == 0) {
            CHECK(record_len == len);
            CHECK(memcmp(record, value, len) == 0);
        }
    } else {
        /* an older format (no destination): it goes into the current one
         * with the journal's, and comes back the same */
        struct journal_entry again;
        char *again_strings = NULL;
        const char *again_why = NULL;
        CHECK(entry.destination == NULL);
        entry.destination = "http://127.0.0.1:1/b";
        rc = journal_record_encode(&entry, &record, &record_len);
        CHECK(rc == 0 || rc == ENOMEM);
        if (rc == 0) {
            CHECK(record[0] == 3);
            rc = journal_record_decode(key, key_len, record, record_len, &again,
                                       &again_strings, &again_why);
            CHECK(rc == 0 || rc == ENOMEM);
            if (rc == 0) {
                CHECK(strcmp(again.key, entry.key) == 0);
                CHECK((again.upload_id == NULL) == (entry.upload_id == NULL));
                CHECK(again.upload_id == NULL ||
                      strcmp(again.upload_id, entry.upload_id) == 0);
                CHECK(again.size == entry.size && again.mode == entry.mode &&
                      again.uid == entry.uid && again.gid == entry.gid &&
                      again.unclosed == entry.unclosed);
                CHECK(again.mtime.tv_sec == entry.mtime.tv_sec &&
                      again.mtime.tv_nsec == entry.mtime.tv_nsec);
                CHECK(strcmp(again.destination, entry.destination) == 0);
            }
            free(again_strings);
        }
    }
    free(record);
    free(strings);
    return 0;
}
