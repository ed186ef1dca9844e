/*
 * stats_report.h - what `s3cachefs stats` prints, from a mount's counters
 * (stats_text.h) and, with --prices, a price table (prices.h): the table
 * for people, the JSON object for programs, the lines of --watch, and the
 * cost of the bucket traffic with what the cache saved.
 *
 * Pure apart from writing to the FILE it is given (a memory stream in the
 * unit tests); stats_cmd.c does the asking, the waiting and the signals.
 *
 * The cost is an estimate from list prices (see prices.c): each request
 * kind's count times its price, bytes_from_bucket priced as egress and
 * bytes_to_bucket as ingress, each line exact and rounded half up to
 * 10^-9 of the currency, the total their sum. What the cache saved:
 * bytes_from_cache priced as egress, plus the GETs they would have
 * needed, counted as one per block_size (rounded up).
 *
 * With a shared cache tier (-o shared_cache: the tier_* counters and
 * bytes_from_tier, bytes_to_tier) and --tier-prices, the tier is priced
 * the same way with its own counters: tier_requests_* per kind,
 * bytes_from_tier as its egress and bytes_to_tier as its ingress. What it
 * saved is priced at the bucket's prices: bytes_from_tier as the bucket's
 * egress plus one bucket GET per block_size, the bytes and requests the
 * bucket would have served without it.
 */
#ifndef S3CFS_STATS_REPORT_H
#define S3CFS_STATS_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cmd/prices.h"
#include "ctl/stats_text.h"

struct stats_cost_line {
    uint64_t quantity;      /* requests, or bytes */
    uint64_t nanos;         /* its cost, in 10^-9 of the currency */
};

struct stats_cost {
    struct stats_cost_line items[PRICE_ITEM_COUNT];
    uint64_t total;                 /* nanos: the sum of the items */
    struct stats_cost_line saved_egress;   /* bytes_from_cache (the tier's:
                                              bytes_from_tier) */
    struct stats_cost_line saved_gets;     /* GETs they would have needed */
    uint64_t saved_total;           /* nanos */
};

/* Where the block size of the savings came from. */
enum stats_block_size_from {
    STATS_BLOCK_SIZE_DEFAULT,       /* nowhere: the default, 1 MiB, assumed */
    STATS_BLOCK_SIZE_COUNTERS,      /* the cache_block_size_bytes counter */
};

/* What a report is made of; nothing is owned. */
struct stats_report {
    const char *mountpoint;
    const char *source;             /* the mount's source (bucket[:prefix]) or NULL */
    long pid;                       /* the daemon's, or 0 */
    const struct stats_text *stats;
    const struct price_table *prices;   /* NULL: no cost */
    const struct price_table *tier_prices;  /* the shared cache's; NULL:
                                           not priced. Used only with PRICES */
    uint32_t block_size;            /* of the cache: for the savings */
    enum stats_block_size_from block_size_from;
};

/*
 * The cost of the traffic the counters of STATS show, at PRICES, with
 * BLOCK_SIZE (> 0) for the savings. 0; ENOENT if a counter it needs is
 * missing, ERANGE if a sum passes 2^64 nanos (a sentence in ERR either
 * way).
 */
int stats_report_cost(const struct stats_text *stats,
                      const struct price_table *prices, uint32_t block_size,
                      struct stats_cost *out, char *err, size_t errlen);

/* Whether STATS has the counters of a shared cache tier. */
bool stats_report_has_tier(const struct stats_text *stats);

/*
 * The cost of the shared cache tier's traffic that STATS show, at
 * TIER_PRICES, and what it saved at ORIGIN_PRICES with BLOCK_SIZE (> 0),
 * into *OUT (the shape of stats_report_cost()'s, its savings in
 * ORIGIN_PRICES' currency). 0; ENOENT if STATS has no tier or a counter
 * it needs is missing, ERANGE if a sum passes 2^64 nanos (a sentence in
 * ERR either way).
 */
int stats_report_tier_cost(const struct stats_text *stats,
                           const struct price_table *tier_prices,
                           const struct price_table *origin_prices,
                           uint32_t block_size, struct stats_cost *out,
                           char *err, size_t errlen);

/*
 * The table for people, grouped (reads, cache, requests, the shared
 * cache and its requests when there is one, writes, errors, other
 * counters) and, with prices, the cost and the savings, then the shared
 * cache's with tier prices (without them, a line that it is not priced).
 * 0, or the errno of stats_report_cost() or stats_report_tier_cost() with
 * ERR set.
 */
int stats_report_table(FILE *out, const struct stats_report *report,
                       char *err, size_t errlen);

/*
 * One JSON object: "mountpoint", "source", "pid", every counter under its
 * own name with its value as a number, and with prices a "cost" object
 * (amounts as decimal numbers with 9 places; "block_size_from" is
 * "default" or "counters"), "lifetime_cost" when the daemon gives the
 * totals, and with tier prices "tier_cost" and "lifetime_tier_cost" of
 * the same shape (their "saved" names the bucket's "currency" and
 * "prices", and in one currency has "net": saved less cost, signed).
 * ONE_LINE: no newlines but
 * the last (for --watch --json); TIME >= 0 adds "time" (Unix seconds).
 * 0, or the errno of stats_report_cost() with ERR set.
 */
int stats_report_json(FILE *out, const struct stats_report *report,
                      bool one_line, double time, char *err, size_t errlen);

/* The two header lines of --watch (a cost column with PRICES). */
void stats_report_watch_header(FILE *out, const struct price_table *prices);

/* One line of --watch: the rates between BEFORE and NOW, SECONDS apart
 * (> 0). A counter lower in NOW (another daemon) counts from 0. */
void stats_report_watch_line(FILE *out, const struct stats_text *before,
                             const struct stats_text *now, double seconds,
                             const struct price_table *prices);

/*
 * The counters since the cache was created, when the daemon gives them
 * ("lifetime_NAME" for NAME, and "lifetime_since"): into *OUT under their
 * plain names (with cache_block_size_bytes, and cache_hit_ratio of the
 * totals), *SINCE the Unix time counting began. 0; ENOENT when the
 * daemon does not give them; ENOMEM. Free *OUT with stats_text_free().
 */
int stats_report_lifetime(const struct stats_text *stats,
                          struct stats_text *out, uint64_t *since);

/* BYTES for people: "0 B", "1023 B", "1.0 KiB", "4.0 GiB" (binary units,
 * one decimal). Always NUL-terminated. */
void stats_report_format_bytes(uint64_t bytes, char *buf, size_t len);

/* COUNT with thousands separators: "1,234,567". */
void stats_report_format_count(uint64_t count, char *buf, size_t len);

#endif /* S3CFS_STATS_REPORT_H */
