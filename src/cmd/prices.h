/*
 * prices.h - what bucket traffic costs: price tables and exact money
 * arithmetic, for `s3cachefs stats --prices` (stats_cmd.h).
 *
 * A price table gives a price for each kind of request the daemon counts
 * (GET, HEAD, LIST, PUT, DELETE, COPY, multipart) and for the bytes that
 * leave the bucket (egress) and enter it (ingress). Four presets carry
 * providers' published list prices, with where and when they were read
 * (prices.c); a file in the same small text format gives one's own:
 *
 *     # a comment
 *     name My provider, eu-west
 *     currency USD
 *     get 0.0004 per 1000
 *     list 0.005 per 1000
 *     delete free
 *     egress 0.09 per GB
 *
 * One item per line: `ITEM AMOUNT per N` for a request kind (N requests),
 * `ITEM AMOUNT per UNIT` for egress and ingress (UNIT: GB = 10^9 bytes,
 * GiB = 2^30, TB = 10^12, TiB = 2^40), or `ITEM free`. An item not listed
 * costs nothing. AMOUNT is a plain decimal (at most 12 decimals, at most
 * 1000000). `name` is a label; `currency` a three-letter code (USD when
 * not given).
 *
 * Money is never a floating-point number here: prices are kept in 10^-12
 * of the currency, and a cost is count x price / per computed exactly
 * (128-bit) and rounded half up to 10^-9 of the currency (a "nano").
 * Everything is pure: no I/O, no allocation.
 */
#ifndef S3CFS_PRICES_H
#define S3CFS_PRICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What is priced; the first PRICES_REQUEST_KINDS are request kinds, in the
 * order of the daemon's requests_* counters. */
enum price_item {
    PRICE_GET,
    PRICE_HEAD,
    PRICE_LIST,
    PRICE_PUT,
    PRICE_DELETE,
    PRICE_COPY,
    PRICE_MULTIPART,
    PRICE_EGRESS,   /* bytes from the bucket (bytes_from_bucket) */
    PRICE_INGRESS,  /* bytes to the bucket (bytes_to_bucket) */
    PRICE_ITEM_COUNT
};
#define PRICES_REQUEST_KINDS 7

#define PRICES_PICO_PER_UNIT 1000000000000ull  /* 10^-12 of the currency */
#define PRICES_NANO_PER_UNIT 1000000000ull     /* 10^-9: what costs are in */

struct price {
    uint64_t amount_pico;   /* the price of PER requests or bytes */
    uint64_t per;           /* > 0; 1 for a free item */
    char unit[4];           /* "" for requests; "GB", "GiB", "TB", "TiB" */
};

struct price_table {
    char name[64];          /* the preset's name, or what the caller gave */
    char title[128];        /* the `name` line, or the preset's title */
    char read_on[16];       /* presets: the date the prices were read */
    char source[160];       /* presets: where they were read */
    char currency[4];       /* three capital letters; "USD" by default */
    struct price items[PRICE_ITEM_COUNT];
};

/* "get", "head", ..., "multipart", "egress", "ingress". */
const char *prices_item_name(enum price_item item);

/* The preset names, for messages: "aws, r2, b2, gcs". */
const char *prices_preset_names(void);

/* The preset NAME into *OUT. 0, or ENOENT if there is none by that name. */
int prices_preset(const char *name, struct price_table *out);

/*
 * Parse a price table in the format above from TEXT (LEN bytes, need not
 * end in NUL). ORIGIN (a file name) starts error messages. Returns 0 and
 * fills *OUT (its name is ORIGIN's last component); or EINVAL, with one
 * sentence in ERR ("ORIGIN:LINE: what is wrong"), and *OUT unspecified.
 */
int prices_parse(const char *text, size_t len, const char *origin,
                 struct price_table *out, char *err, size_t errlen);

/*
 * The cost of QUANTITY requests or bytes at PRICE, in nanos of the
 * currency, rounded half up, into *NANOS. 0, or ERANGE past 2^64 nanos.
 */
int prices_cost(const struct price *price, uint64_t quantity, uint64_t *nanos);

/*
 * NANOS as a decimal with DECIMALS places (0-9, rounded half up), with
 * thousands separators when GROUPED: "1,234.567890". Always NUL-terminated
 * (truncated if LEN is too small; 32 bytes are enough).
 */
void prices_format_money(uint64_t nanos, unsigned decimals, bool grouped,
                         char *buf, size_t len);

/* A price's amount as the shortest exact decimal: "0.0004", "4.5", "0". */
void prices_format_amount(const struct price *price, char *buf, size_t len);

/* "0.0004 USD per 1,000", "0.09 USD per GB", or "free". */
void prices_format_price(const struct price_table *table,
                         const struct price *price, char *buf, size_t len);

/* Whether PRICE costs nothing. */
bool prices_is_free(const struct price *price);

#endif /* S3CFS_PRICES_H */
