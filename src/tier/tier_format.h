/*
 * tier_format.h - how a block is named and framed in the shared cache
 * tier (tier.h): pure functions, no I/O.
 *
 * A block of an origin object lives in the tier bucket as one object:
 *
 *   PREFIX s3cachefs-tier/v2/VVVV.../BLOCK_SIZE-INDEX
 *
 * where VVVV is the hex SHA-256 of the block's version: the origin
 * (endpoint and bucket), the key and the ETag. Another version, another
 * bucket, another block size never share a name, and every block of one
 * version sits under one prefix, which a lifecycle rule or `shared-cache
 * prune` can drop at once.
 *
 * The object is a header of TIER_HEADER_LEN bytes, then the block's bytes:
 *
 *   "S3CFSTB2"          8 bytes, the format
 *   data length         4 bytes, little-endian
 *   reserved            4 bytes, zero
 *   identity            32 bytes: SHA-256 of (version hash, block size,
 *                       index): the block this claims to be
 *   checksum            16 bytes: XXH3-128 of the data (xxhash's
 *                       canonical form, big-endian)
 *
 * The tier is not trusted: a node reads a block from it only if the frame
 * is whole, names the block asked for and its data matches its checksum.
 * This catches truncated, damaged, misplaced and mixed-up objects; it does
 * not stop someone allowed to write the tier bucket from writing a block
 * with a matching checksum (whoever may write the tier is trusted as the
 * origin's readers are). So the checksum need not resist forgery, only
 * damage, and is a fast one: SHA-256 of the data (format 1, "v1/") cost
 * a node reading from the tier a third of its CPU.
 */
#ifndef S3CFS_TIER_FORMAT_H
#define S3CFS_TIER_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define TIER_HEADER_LEN 64
#define TIER_HASH_LEN 32        /* SHA-256: version and identity */
#define TIER_CHECKSUM_LEN 16    /* XXH3-128: data */
#define TIER_VERSION_HEX (2 * TIER_HASH_LEN)
/* The root of the tier's keys under its prefix (another format, another
 * root: nodes of different formats never read each other's blocks). */
#define TIER_ROOT "s3cachefs-tier/v2/"

/* Which block: of version ETAG of KEY in the origin ORIGIN ("endpoint
 * bucket"), cut in blocks of BLOCK_SIZE bytes. */
struct tier_block_id {
    const char *origin;
    const char *key;
    const char *etag;
    uint32_t block_size;
    uint64_t index;
};

/* The hex hash naming ID's version, NUL-terminated into
 * OUT[TIER_VERSION_HEX + 1]. 0 or ENOMEM/EIO (libcrypto). */
int tier_version_hex(const struct tier_block_id *id, char *out);

/* The tier key of block ID under PREFIX ("" or "a/b/"): a malloc'd string
 * in *out. 0, ENOMEM or EIO. */
int tier_block_key(const char *prefix, const struct tier_block_id *id,
                   char **out);

/* The key of the lease on block ID's group of GROUP_BLOCKS blocks
 * ("VVVV.../lease-SIZE-GROUP"): a malloc'd string in *out. 0, ENOMEM or
 * EIO. */
int tier_lease_key(const char *prefix, const struct tier_block_id *id,
                   uint32_t group_blocks, char **out);

/* Write the header of block ID holding LEN bytes of DATA into
 * HEADER[TIER_HEADER_LEN]. 0 or EIO. */
int tier_frame_header(const struct tier_block_id *id, const void *data,
                      uint32_t len, unsigned char *header);

/* Whether OBJECT (OBJECT_LEN bytes, as read from the tier) is block ID
 * with exactly LEN bytes of data, whole and undamaged: 0, or EBADMSG. */
int tier_frame_check(const struct tier_block_id *id, const void *object,
                     size_t object_len, uint32_t len);

#endif /* S3CFS_TIER_FORMAT_H */
