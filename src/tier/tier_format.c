/*
 * tier_format.c - names and frames of blocks in the shared cache tier
 * (see tier_format.h).
 */
#include "config.h"

#include "tier/tier_format.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <xxhash.h>

static const char frame_magic[8] = {'S', '3', 'C', 'F', 'S', 'T', 'B', '2'};

/* Where the fields of a frame's header are (tier_format.h). */
enum {
    FRAME_LEN_AT = 8,
    FRAME_RESERVED_AT = 12,
    FRAME_IDENTITY_AT = 16,
    FRAME_CHECKSUM_AT = FRAME_IDENTITY_AT + TIER_HASH_LEN,
};
_Static_assert(FRAME_CHECKSUM_AT + TIER_CHECKSUM_LEN == TIER_HEADER_LEN,
               "the header's fields fill it");
_Static_assert(sizeof(XXH128_canonical_t) == TIER_CHECKSUM_LEN,
               "XXH3-128's canonical form is the checksum field");

/* SHA-256 of the COUNT pieces PARTS[i] of LENS[i] bytes into OUT. */
static int sha256_parts(const void *const *parts, const size_t *lens,
                        size_t count, unsigned char *out)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned len = 0;
    bool ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;

    for (size_t i = 0; ok && i < count; i++)
        ok = EVP_DigestUpdate(ctx, parts[i], lens[i]) == 1;
    ok = ok && EVP_DigestFinal_ex(ctx, out, &len) == 1 && len == TIER_HASH_LEN;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : EIO;
}

static int version_hash(const struct tier_block_id *id, unsigned char *out)
{
    /* the NULs keep ("a", "bc") and ("ab", "c") apart */
    const void *parts[] = {id->origin, id->key, id->etag};
    size_t lens[] = {strlen(id->origin) + 1, strlen(id->key) + 1,
                     strlen(id->etag) + 1};
    return sha256_parts(parts, lens, 3, out);
}

static void to_hex(const unsigned char *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

static void put_le(unsigned char *at, uint64_t value, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        at[i] = (unsigned char)(value >> (8 * i));
}

static uint64_t get_le(const unsigned char *at, size_t bytes)
{
    uint64_t value = 0;

    for (size_t i = 0; i < bytes; i++)
        value |= (uint64_t)at[i] << (8 * i);
    return value;
}

/* What a frame of block ID says it is: SHA-256 of its version's hash,
 * block size and index. */
static int identity_hash(const struct tier_block_id *id, unsigned char *out)
{
    unsigned char version[TIER_HASH_LEN], geometry[12];
    int err = version_hash(id, version);

    put_le(geometry, id->block_size, 4);
    put_le(geometry + 4, id->index, 8);
    const void *parts[] = {version, geometry};
    size_t lens[] = {sizeof(version), sizeof(geometry)};
    return err != 0 ? err : sha256_parts(parts, lens, 2, out);
}

int tier_version_hex(const struct tier_block_id *id, char *out)
{
    unsigned char version[TIER_HASH_LEN];
    int err = version_hash(id, version);

    if (err == 0)
        to_hex(version, sizeof(version), out);
    return err;
}

int tier_block_key(const char *prefix, const struct tier_block_id *id,
                   char **out)
{
    char version[TIER_VERSION_HEX + 1];
    int err = tier_version_hex(id, version);

    *out = NULL;
    if (err != 0)
        return err;
    if (asprintf(out, "%s%s%s/%u-%llu", prefix, TIER_ROOT, version,
                 (unsigned)id->block_size, (unsigned long long)id->index) < 0) {
        *out = NULL;
        return ENOMEM;
    }
    return 0;
}

int tier_lease_key(const char *prefix, const struct tier_block_id *id,
                   uint32_t group_blocks, char **out)
{
    char version[TIER_VERSION_HEX + 1];
    int err = tier_version_hex(id, version);

    *out = NULL;
    if (err != 0)
        return err;
    if (asprintf(out, "%s%s%s/lease-%u-%llu", prefix, TIER_ROOT, version,
                 (unsigned)id->block_size,
                 (unsigned long long)(id->index / group_blocks)) < 0) {
        *out = NULL;
        return ENOMEM;
    }
    return 0;
}

int tier_frame_header(const struct tier_block_id *id, const void *data,
                      uint32_t len, unsigned char *header)
{
    XXH128_canonical_t checksum;

    memset(header, 0, TIER_HEADER_LEN);
    memcpy(header, frame_magic, sizeof(frame_magic));
    put_le(header + FRAME_LEN_AT, len, 4);
    XXH128_canonicalFromHash(&checksum, XXH3_128bits(data, len));
    memcpy(header + FRAME_CHECKSUM_AT, &checksum, sizeof(checksum));
    return identity_hash(id, header + FRAME_IDENTITY_AT);
}

int tier_frame_check(const struct tier_block_id *id, const void *object,
                     size_t object_len, uint32_t len)
{
    const unsigned char *header = object;
    unsigned char expected[TIER_HEADER_LEN];

    if (object_len != (size_t)TIER_HEADER_LEN + len ||
        memcmp(header, frame_magic, sizeof(frame_magic)) != 0 ||
        get_le(header + FRAME_LEN_AT, 4) != len ||
        get_le(header + FRAME_RESERVED_AT, 4) != 0)
        return EBADMSG;
    if (tier_frame_header(id, header + TIER_HEADER_LEN, len, expected) != 0)
        return EBADMSG;
    return CRYPTO_memcmp(header, expected, TIER_HEADER_LEN) == 0 ? 0 : EBADMSG;
}
