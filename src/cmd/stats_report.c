/*
 * stats_report.c - the table, the JSON object and the --watch lines of
 * `s3cachefs stats` (see stats_report.h).
 *
 * The table shows the counters it knows in the groups an operator reads
 * them by, and any counter it does not know under "other", so a newer
 * daemon's counters are never hidden. Sizes are in binary units, counts
 * have thousands separators; money is printed from exact nanos (prices.h),
 * with 6 places in the table and 9 in JSON.
 */
#include "config.h"

#include "cmd/stats_report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LABEL_WIDTH 26
#define VALUE_WIDTH 22
#define LIFETIME_WIDTH 20       /* the column since the cache was created */
#define WATCH_WIDTH 7           /* of a --watch column, plus one blank */
#define MONEY_PLACES_TABLE 6
#define MONEY_PLACES_JSON 9

/* The counter behind each price item (prices.h order). */
static const char *const item_counters[PRICE_ITEM_COUNT] = {
    [PRICE_GET] = "requests_get", [PRICE_HEAD] = "requests_head",
    [PRICE_LIST] = "requests_list", [PRICE_PUT] = "requests_put",
    [PRICE_DELETE] = "requests_delete", [PRICE_COPY] = "requests_copy",
    [PRICE_MULTIPART] = "requests_multipart",
    [PRICE_EGRESS] = "bytes_from_bucket", [PRICE_INGRESS] = "bytes_to_bucket",
};

/* The same for the shared cache tier, priced at --tier-prices. */
static const char *const tier_item_counters[PRICE_ITEM_COUNT] = {
    [PRICE_GET] = "tier_requests_get", [PRICE_HEAD] = "tier_requests_head",
    [PRICE_LIST] = "tier_requests_list", [PRICE_PUT] = "tier_requests_put",
    [PRICE_DELETE] = "tier_requests_delete", [PRICE_COPY] = "tier_requests_copy",
    [PRICE_MULTIPART] = "tier_requests_multipart",
    [PRICE_EGRESS] = "bytes_from_tier", [PRICE_INGRESS] = "bytes_to_tier",
};

/* The counter that says a shared cache tier is configured. */
#define TIER_COUNTER "bytes_from_tier"

static const char *const item_labels[PRICE_ITEM_COUNT] = {
    [PRICE_GET] = "GET", [PRICE_HEAD] = "HEAD", [PRICE_LIST] = "LIST",
    [PRICE_PUT] = "PUT", [PRICE_DELETE] = "DELETE", [PRICE_COPY] = "COPY",
    [PRICE_MULTIPART] = "multipart", [PRICE_EGRESS] = "egress",
    [PRICE_INGRESS] = "ingress",
};

enum show {
    SHOW_BYTES, SHOW_COUNT, SHOW_PERCENT, SHOW_USED_OF_SIZE,
    SHOW_YES_NO,    /* 0: "no", else "yes" */
    SHOW_LEASE_MODE, /* enum tier_lease_mode, 0 while not known */
};

struct row {
    const char *counter;
    const char *label;
    enum show show;
};

#define GROUP_ROWS 16     /* at most 15 rows, then the NULL that ends them */

struct group {
    const char *title;
    struct row rows[GROUP_ROWS];
};

/* What the table shows, in its order; every name here is "known". */
static const struct group groups[] = {
    {"reads", {
        {"bytes_read", "read by programs", SHOW_BYTES},
        {"bytes_from_cache", "from the cache", SHOW_BYTES},
        {"bytes_from_tier", "from the shared cache", SHOW_BYTES},
        {"bytes_from_bucket", "from the bucket", SHOW_BYTES},
        {"bytes_read_around_cache", "read around the cache", SHOW_BYTES},
        {"cache_hit_ratio", "cache hit ratio", SHOW_PERCENT},
    }},
    {"cache", {
        {"cache_used_bytes", "used / size", SHOW_USED_OF_SIZE},
        {"cache_protected_bytes", "protected (read again)", SHOW_BYTES},
        {"cache_pinned_bytes", "pinned (warm --pin)", SHOW_BYTES},
        {"cache_index_bytes", "index", SHOW_BYTES},
        {"cache_blocks", "blocks", SHOW_COUNT},
        {"cache_evicted_blocks", "evicted blocks", SHOW_COUNT},
        {"cache_corrupt_blocks", "corrupt blocks", SHOW_COUNT},
    }},
    {"requests", {
        {"requests_get", "GET", SHOW_COUNT},
        {"requests_head", "HEAD", SHOW_COUNT},
        {"requests_list", "LIST", SHOW_COUNT},
        {"requests_put", "PUT", SHOW_COUNT},
        {"requests_delete", "DELETE", SHOW_COUNT},
        {"requests_copy", "COPY", SHOW_COUNT},
        {"requests_multipart", "multipart", SHOW_COUNT},
    }},
    {"shared cache", {
        {"tier_hit_blocks", "blocks read from it", SHOW_COUNT},
        {"tier_miss_blocks", "blocks it did not have", SHOW_COUNT},
        {"tier_bad_blocks", "blocks damaged", SHOW_COUNT},
        {"tier_skipped_blocks", "blocks not asked (skipped)", SHOW_COUNT},
        {"bytes_to_tier", "sent to it", SHOW_BYTES},
        {"tier_written_blocks", "blocks written", SHOW_COUNT},
        {"tier_written_first_elsewhere", "written first by others", SHOW_COUNT},
        {"tier_dropped_blocks", "blocks not written", SHOW_COUNT},
        {"tier_queued_bytes", "waiting to be written", SHOW_BYTES},
        {"tier_errors", "requests failed", SHOW_COUNT},
        {"tier_skipping", "skipped after a failure", SHOW_YES_NO},
        {"tier_lease_mode", "leases", SHOW_LEASE_MODE},
        {"tier_leases", "block groups leased", SHOW_COUNT},
        {"tier_lease_waits", "blocks waited for", SHOW_COUNT},
        {"tier_lease_waits_met", "of them came in time", SHOW_COUNT},
    }},
    {"shared cache requests", {
        {"tier_requests_get", "GET", SHOW_COUNT},
        {"tier_requests_head", "HEAD", SHOW_COUNT},
        {"tier_requests_list", "LIST", SHOW_COUNT},
        {"tier_requests_put", "PUT", SHOW_COUNT},
        {"tier_requests_delete", "DELETE", SHOW_COUNT},
        {"tier_requests_copy", "COPY", SHOW_COUNT},
        {"tier_requests_multipart", "multipart", SHOW_COUNT},
    }},
    {"writes", {
        {"bytes_written", "written by programs", SHOW_BYTES},
        {"bytes_to_bucket", "sent to the bucket", SHOW_BYTES},
        {"uploads_pending", "uploads pending", SHOW_COUNT},
        {"uploads_completed", "uploads completed", SHOW_COUNT},
        {"upload_failures", "uploads failed", SHOW_COUNT},
        {"upload_retries", "uploads retried", SHOW_COUNT},
        {"copies_on_write", "copies on write", SHOW_COUNT},
    }},
    {"errors", {
        {"retries", "requests retried", SHOW_COUNT},
        {"failures", "requests failed", SHOW_COUNT},
    }},
    {"other", {
        {"inodes", "inodes in use", SHOW_COUNT},
        {"listing_bytes", "listings in memory", SHOW_BYTES},
        {"listings_dropped", "listings dropped", SHOW_COUNT},
    }},
};
#define GROUP_COUNT (sizeof(groups) / sizeof(groups[0]))

#define LIFETIME_PREFIX "lifetime_"

/* Shown with cache_used_bytes, not on a row of its own. */
static const char *const also_known[] = {"cache_size_bytes"};

/* ------------------------------------------------------------ formatting */

void stats_report_format_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = (double)bytes;
    size_t unit = 0;

    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return;
    }
    value /= 1024;
    /* move up a unit when one decimal would print 1024.0 */
    while (value >= 1023.95 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        value /= 1024;
        unit++;
    }
    snprintf(buf, len, "%.1f %s", value, units[unit]);
}

void stats_report_format_count(uint64_t count, char *buf, size_t len)
{
    char digits[24], out[32];
    int n = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)count);
    size_t used = 0;

    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            out[used++] = ',';
        out[used++] = digits[i];
    }
    out[used] = '\0';
    snprintf(buf, len, "%s", out);
}

static bool known_counter(const char *name)
{
    /* lifetime_NAME: shown in the second column of NAME's row */
    if (strncmp(name, LIFETIME_PREFIX, strlen(LIFETIME_PREFIX)) == 0 &&
        (strcmp(name + strlen(LIFETIME_PREFIX), "since") == 0 ||
         known_counter(name + strlen(LIFETIME_PREFIX))))
        return true;
    for (size_t g = 0; g < GROUP_COUNT; g++)
        for (size_t r = 0;
             r < GROUP_ROWS && groups[g].rows[r].counter != NULL; r++)
            if (strcmp(groups[g].rows[r].counter, name) == 0)
                return true;
    for (size_t i = 0; i < sizeof(also_known) / sizeof(also_known[0]); i++)
        if (strcmp(also_known[i], name) == 0)
            return true;
    return false;
}

/* A counter's value for the table: as its row shows it, or as written. */
static void format_counter(const struct stats_text *stats,
                           const struct stats_counter *counter, enum show show,
                           char *buf, size_t len)
{
    char used[16], size[16];   /* "1023.9 KiB" at most */

    if (!counter->integer && show != SHOW_PERCENT) {
        snprintf(buf, len, "%s", counter->text);
        return;
    }
    switch (show) {
    case SHOW_BYTES:
        stats_report_format_bytes(counter->value, buf, len);
        break;
    case SHOW_COUNT:
        stats_report_format_count(counter->value, buf, len);
        break;
    case SHOW_PERCENT:
        snprintf(buf, len, "%.1f %%", counter->real * 100);
        break;
    case SHOW_YES_NO:
        snprintf(buf, len, "%s", counter->value != 0 ? "yes" : "no");
        break;
    case SHOW_LEASE_MODE:
        snprintf(buf, len, "%s",
                 counter->value == 1   ? "conditional writes"
                 : counter->value == 2 ? "written and read back"
                                       : "not known yet");
        break;
    case SHOW_USED_OF_SIZE: {
        uint64_t size_bytes;
        stats_report_format_bytes(counter->value, used, sizeof(used));
        if (stats_text_get(stats, "cache_size_bytes", &size_bytes) != 0) {
            snprintf(buf, len, "%s", used);
            break;
        }
        stats_report_format_bytes(size_bytes, size, sizeof(size));
        snprintf(buf, len, "%s / %s", used, size);
        break;
    }
    }
}

static void table_row(FILE *out, const char *label, const char *value)
{
    fprintf(out, "  %-*s%*s\n", LABEL_WIDTH, label, VALUE_WIDTH, value);
}

/* A row of the table with the second column, since the cache was created
 * (LIFETIME; "" where the row describes this moment only). */
static void table_row2(FILE *out, const char *label, const char *value,
                       const char *lifetime)
{
    if (lifetime[0] == '\0') {
        table_row(out, label, value);
        return;
    }
    /* (a blank before the column, however wide a total) */
    fprintf(out, "  %-*s%*s %*s\n", LABEL_WIDTH, label, VALUE_WIDTH, value,
            LIFETIME_WIDTH - 1, lifetime);
}

int stats_report_lifetime(const struct stats_text *stats,
                          struct stats_text *out, uint64_t *since)
{
    char *text = NULL;
    size_t size = 0;
    char err[128];

    *out = (struct stats_text){0};
    if (stats_text_get(stats, LIFETIME_PREFIX "since", since) != 0)
        return ENOENT;
    FILE *stream = open_memstream(&text, &size);
    if (stream == NULL)
        return ENOMEM;
    for (size_t i = 0; i < stats->count; i++) {
        const struct stats_counter *c = &stats->counters[i];
        size_t n = strlen(LIFETIME_PREFIX);
        if (strncmp(c->name, LIFETIME_PREFIX, n) == 0 &&
            strcmp(c->name + n, "since") != 0)
            fprintf(stream, "%s %s\n", c->name + n, c->text);
    }
    /* (what the savings need, and the ratio of the totals) */
    const struct stats_counter *block = stats_text_find(stats,
                                                        "cache_block_size_bytes");
    if (block != NULL)
        fprintf(stream, "cache_block_size_bytes %s\n", block->text);
    /* (the daemon's: the shared cache's bytes count as misses of the
     * local cache, like the bucket's) */
    uint64_t served = 0, fetched = 0, from_tier = 0;
    stats_text_get(stats, LIFETIME_PREFIX "bytes_from_cache", &served);
    stats_text_get(stats, LIFETIME_PREFIX "bytes_from_bucket", &fetched);
    stats_text_get(stats, LIFETIME_PREFIX TIER_COUNTER, &from_tier);
    uint64_t missed = fetched + from_tier;
    fprintf(stream, "cache_hit_ratio %.4f\n",
            served + missed > 0 ? (double)served / (double)(served + missed)
                                : 0.0);
    if (fclose(stream) != 0) {
        free(text);
        return ENOMEM;
    }
    int result = stats_text_parse(text, size, out, err, sizeof(err));
    free(text);
    if (result != 0)
        stats_text_free(out);
    return result;
}

/* "2026-12-02": the UTC date of SINCE (Unix seconds). */
static void format_date(uint64_t since, char *buf, size_t len)
{
    time_t t = (time_t)since;
    struct tm tm;

    if (gmtime_r(&t, &tm) == NULL || strftime(buf, len, "%Y-%m-%d", &tm) == 0)
        snprintf(buf, len, "?");
}

/* ------------------------------------------------------------------- cost */

/*
 * The cost of the traffic that COUNTERS (PRICE_ITEM_COUNT names) count in
 * STATS at PRICES, and what SERVED bytes (the counter of that name) saved
 * at SAVED_PRICES: their egress and one GET per BLOCK_SIZE. The origin's
 * and the shared cache's cost are this with other names and prices.
 */
static int cost_of(const struct stats_text *stats,
                   const char *const counters[PRICE_ITEM_COUNT],
                   const struct price_table *prices, const char *served,
                   const struct price_table *saved_prices, uint32_t block_size,
                   struct stats_cost *out, char *err, size_t errlen)
{
    const char *missing = NULL;
    uint64_t served_bytes;
    int result = ERANGE;

    memset(out, 0, sizeof(*out));
    for (int item = 0; item < PRICE_ITEM_COUNT; item++) {
        struct stats_cost_line *line = &out->items[item];
        if (stats_text_get(stats, counters[item], &line->quantity) != 0) {
            missing = counters[item];
            goto out;
        }
        if (prices_cost(&prices->items[item], line->quantity, &line->nanos) != 0 ||
            out->total + line->nanos < out->total)
            goto out;
        out->total += line->nanos;
    }
    if (stats_text_get(stats, served, &served_bytes) != 0) {
        missing = served;
        goto out;
    }
    out->saved_egress.quantity = served_bytes;
    out->saved_gets.quantity = served_bytes / block_size +
                               (served_bytes % block_size != 0);
    if (prices_cost(&saved_prices->items[PRICE_EGRESS], served_bytes,
                    &out->saved_egress.nanos) != 0 ||
        prices_cost(&saved_prices->items[PRICE_GET], out->saved_gets.quantity,
                    &out->saved_gets.nanos) != 0 ||
        out->saved_egress.nanos + out->saved_gets.nanos < out->saved_egress.nanos)
        goto out;
    out->saved_total = out->saved_egress.nanos + out->saved_gets.nanos;
    result = 0;
out:
    if (missing != NULL) {
        snprintf(err, errlen, "the daemon does not count '%s': no cost "
                 "without it", missing);
        result = ENOENT;
    } else if (result == ERANGE) {
        snprintf(err, errlen, "%s", "the cost is past what 64 bits of 10^-9 "
                 "hold: check the prices");
    }
    return result;
}

int stats_report_cost(const struct stats_text *stats,
                      const struct price_table *prices, uint32_t block_size,
                      struct stats_cost *out, char *err, size_t errlen)
{
    return cost_of(stats, item_counters, prices, "bytes_from_cache", prices,
                   block_size, out, err, errlen);
}

bool stats_report_has_tier(const struct stats_text *stats)
{
    return stats_text_find(stats, TIER_COUNTER) != NULL;
}

int stats_report_tier_cost(const struct stats_text *stats,
                           const struct price_table *tier_prices,
                           const struct price_table *origin_prices,
                           uint32_t block_size, struct stats_cost *out,
                           char *err, size_t errlen)
{
    if (!stats_report_has_tier(stats)) {
        memset(out, 0, sizeof(*out));
        snprintf(err, errlen, "%s", "the mount has no shared cache "
                 "(-o shared_cache): nothing for --tier-prices to price");
        return ENOENT;
    }
    return cost_of(stats, tier_item_counters, tier_prices, TIER_COUNTER,
                   origin_prices, block_size, out, err, errlen);
}

/* "519"; "4.295 GB" for bytes priced per GB, in binary units below a
 * thousandth of the unit ("113.7 KiB") or when free. */
static void format_quantity(const struct price *price, uint64_t quantity,
                            bool bytes, char *buf, size_t len)
{
    if (!bytes) {
        stats_report_format_count(quantity, buf, len);
    } else if (price->unit[0] != '\0' &&
               (quantity == 0 || (double)quantity / (double)price->per >= 0.001)) {
        snprintf(buf, len, "%.3f %s", (double)quantity / (double)price->per,
                 price->unit);
    } else {
        stats_report_format_bytes(quantity, buf, len);
    }
}

static void cost_row(FILE *out, const struct price_table *prices,
                     const char *label, const struct price *price,
                     const struct stats_cost_line *line, bool bytes)
{
    char quantity[40], price_text[64], money[40];

    format_quantity(price, line->quantity, bytes, quantity, sizeof(quantity));
    prices_format_price(prices, price, price_text, sizeof(price_text));
    prices_format_money(line->nanos, MONEY_PLACES_TABLE, true, money, sizeof(money));
    fprintf(out, "  %-20s %12s %s %-22s %12s %s\n", label, quantity,
            prices_is_free(price) ? " " : "x", price_text, money,
            prices->currency);
}

static void total_row(FILE *out, const struct price_table *prices,
                      const char *label, uint64_t nanos)
{
    char money[40];

    prices_format_money(nanos, MONEY_PLACES_TABLE, true, money, sizeof(money));
    fprintf(out, "  %-58s %12s %s\n", label, money, prices->currency);
}

/* A block size exactly: "256 KiB", "1 MiB". */
static void format_block_size(uint32_t bytes, char *buf, size_t len)
{
    if (bytes % (1u << 20) == 0)
        snprintf(buf, len, "%u MiB", bytes >> 20);
    else if (bytes % 1024 == 0)
        snprintf(buf, len, "%u KiB", bytes >> 10);
    else
        snprintf(buf, len, "%u B", bytes);
}

/* SAVED less COST (nanos), signed: "0.001234", "-0.000010" (PLACES,
 * GROUPED as prices_format_money()): negative when it cost more. */
static void format_net(uint64_t saved, uint64_t cost, unsigned places,
                       bool grouped, char *buf, size_t len)
{
    char money[40];

    prices_format_money(saved >= cost ? saved - cost : cost - saved, places,
                        grouped, money, sizeof(money));
    /* (no sign on what rounds to zero) */
    bool zero = money[strspn(money, "0.,")] == '\0';
    snprintf(buf, len, "%s%s", saved >= cost || zero ? "" : "-", money);
}

/*
 * The cost and the savings SINCE ("mount", or a date): of the bucket at
 * --prices, or with TIER of the shared cache at --tier-prices, its
 * savings at the bucket's prices (what its bytes would have cost from
 * the bucket) and, in one currency, the net of the two.
 */
static void table_cost(FILE *out, const struct stats_report *report,
                       const struct stats_cost *cost, const char *since,
                       bool tier)
{
    const struct price_table *prices = tier ? report->tier_prices
                                            : report->prices;
    const struct price_table *saved_at = report->prices;
    const char *what = tier ? "shared cache cost" : "cost";
    char block[32], served[32], label[64];

    fprintf(out, "\n%s since %s\n  prices %s: %s", what, since, prices->name,
            prices->title);
    if (prices->read_on[0] != '\0')
        fprintf(out, " (read %s)", prices->read_on);
    fprintf(out, "\n");
    for (int item = 0; item < PRICE_ITEM_COUNT; item++)
        cost_row(out, prices, item_labels[item], &prices->items[item],
                 &cost->items[item], item >= PRICES_REQUEST_KINDS);
    total_row(out, prices, "total", cost->total);

    format_block_size(report->block_size, block, sizeof(block));
    stats_report_format_bytes(cost->saved_egress.quantity, served, sizeof(served));
    if (tier)
        fprintf(out, "\nsaved by the shared cache since %s\n  %s read from "
                "the shared cache, at the bucket's prices (%s)\n", since,
                served, saved_at->name);
    else
        fprintf(out, "\nsaved by the cache since %s\n  %s read from the "
                "cache\n", since, served);
    cost_row(out, saved_at, "egress not paid", &saved_at->items[PRICE_EGRESS],
             &cost->saved_egress, true);
    snprintf(label, sizeof(label), "GET, one per %s", block);
    cost_row(out, saved_at, label, &saved_at->items[PRICE_GET],
             &cost->saved_gets, false);
    total_row(out, saved_at, "total", cost->saved_total);
    if (tier && strcmp(prices->currency, saved_at->currency) == 0) {
        char net[48];
        format_net(cost->saved_total, cost->total, MONEY_PLACES_TABLE, true,
                   net, sizeof(net));
        fprintf(out, "  %-58s %12s %s\n", "net, less the shared cache's cost",
                net, prices->currency);
    }
}

/* The paragraph about estimates, once, after the costs. */
static void table_cost_note(FILE *out, const struct stats_report *report)
{
    static const char *const from[] = {
        [STATS_BLOCK_SIZE_DEFAULT] = "the default: the daemon does not say",
        [STATS_BLOCK_SIZE_COUNTERS] = "given in the daemon's counters",
    };
    char block[32];

    format_block_size(report->block_size, block, sizeof(block));
    fprintf(out,
        "\n  Estimates from list prices, without free allowances or volume\n"
        "  tiers. Requests are counted as sent, retries included; egress is\n"
        "  object data only (not headers or listings). Savings: each byte read\n"
        "  from the cache fetched once instead, in one GET per block of\n"
        "  %s (block_size, %s).\n", block, from[report->block_size_from]);
    if (report->tier_prices != NULL)
        fprintf(out,
            "  The shared cache's savings: each byte read from it fetched from\n"
            "  the bucket instead, at the bucket's prices, one GET per block.\n");
}

/* Every cost a report shows. */
struct report_costs {
    struct stats_cost mount, lifetime;          /* the bucket's */
    struct stats_cost tier_mount, tier_lifetime;
};

/* The costs of REPORT into *OUT (LIFETIME: the totals, when SHOWN): the
 * bucket's with prices, the shared cache's with tier prices too. 0, or
 * the errno of the first that failed, with ERR set. */
static int report_costs(const struct stats_report *report,
                        const struct stats_text *lifetime, bool shown,
                        struct report_costs *out, char *err, size_t errlen)
{
    int result = 0;

    memset(out, 0, sizeof(*out));
    if (report->prices == NULL)
        return 0;
    result = stats_report_cost(report->stats, report->prices,
                               report->block_size, &out->mount, err, errlen);
    if (result == 0 && shown)
        result = stats_report_cost(lifetime, report->prices,
                                   report->block_size, &out->lifetime, err,
                                   errlen);
    if (result == 0 && report->tier_prices != NULL)
        result = stats_report_tier_cost(report->stats, report->tier_prices,
                                        report->prices, report->block_size,
                                        &out->tier_mount, err, errlen);
    if (result == 0 && report->tier_prices != NULL && shown)
        result = stats_report_tier_cost(lifetime, report->tier_prices,
                                        report->prices, report->block_size,
                                        &out->tier_lifetime, err, errlen);
    return result;
}

int stats_report_table(FILE *out, const struct stats_report *report,
                       char *err, size_t errlen)
{
    const struct stats_text *stats = report->stats;
    struct stats_text lifetime = {0};
    struct report_costs costs;
    uint64_t since = 0;
    char value[64], total[64], date[32];
    int result = 0;

    bool lifetime_shown = stats_report_lifetime(stats, &lifetime, &since) == 0;
    format_date(since, date, sizeof(date));
    result = report_costs(report, &lifetime, lifetime_shown, &costs, err,
                          errlen);
    if (result != 0)
        goto out;
    fprintf(out, "s3cachefs %s", report->mountpoint);
    if (report->source != NULL)
        fprintf(out, ": %s", report->source);
    if (report->pid > 0)
        fprintf(out, ", daemon pid %ld", report->pid);
    fprintf(out, "\n");
    if (lifetime_shown) {
        char head[48];
        snprintf(head, sizeof(head), "since %s", date);
        fprintf(out, "\n  %-*s%*s %*s\n", LABEL_WIDTH, "", VALUE_WIDTH,
                "this mount", LIFETIME_WIDTH - 1, head);
    }

    for (size_t g = 0; g < GROUP_COUNT; g++) {
        bool titled = false;
        for (size_t r = 0;
             r < GROUP_ROWS && groups[g].rows[r].counter != NULL; r++) {
            const struct row *row = &groups[g].rows[r];
            const struct stats_counter *counter = stats_text_find(stats, row->counter);
            if (counter == NULL)
                continue;
            if (!titled)
                fprintf(out, "\n%s\n", groups[g].title);
            titled = true;
            format_counter(stats, counter, row->show, value, sizeof(value));
            const struct stats_counter *sum =
                lifetime_shown ? stats_text_find(&lifetime, row->counter) : NULL;
            total[0] = '\0';
            if (sum != NULL)
                format_counter(&lifetime, sum, row->show, total, sizeof(total));
            table_row2(out, row->label, value, total);
        }
        if (strcmp(groups[g].title, "other") != 0)
            continue;
        /* counters of a newer daemon, under their own names */
        for (size_t i = 0; i < stats->count; i++) {
            const struct stats_counter *counter = &stats->counters[i];
            if (known_counter(counter->name))
                continue;
            if (!titled)
                fprintf(out, "\n%s\n", groups[g].title);
            titled = true;
            format_counter(stats, counter, SHOW_COUNT, value, sizeof(value));
            table_row(out, counter->name, value);
        }
    }
    if (report->prices != NULL) {
        table_cost(out, report, &costs.mount, "mount", false);
        if (lifetime_shown)
            table_cost(out, report, &costs.lifetime, date, false);
        if (report->tier_prices != NULL) {
            table_cost(out, report, &costs.tier_mount, "mount", true);
            if (lifetime_shown)
                table_cost(out, report, &costs.tier_lifetime, date, true);
        } else if (stats_report_has_tier(stats)) {
            fprintf(out, "\nshared cache: not priced (its requests and bytes "
                    "are not in the cost above;\n  --tier-prices=NAME|FILE "
                    "prices them)\n");
        }
        table_cost_note(out, report);
    }
out:
    stats_text_free(&lifetime);
    return result;
}

/* ------------------------------------------------------------------- JSON */

struct json {
    FILE *out;
    bool one_line;
    int depth;
    bool first;         /* no member written yet in the object open now */
};

/* A JSON string: escapes, and U+FFFD for bytes that are not UTF-8. */
static void json_string(FILE *out, const char *text)
{
    const unsigned char *at = (const unsigned char *)text;

    fputc('"', out);
    while (*at != '\0') {
        unsigned char c = *at;
        size_t length = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 :
                        c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        bool valid = length > 0;
        for (size_t i = 1; valid && i < length; i++)
            valid = (at[i] & 0xc0) == 0x80;
        /* no overlong forms, surrogates or code points past U+10FFFF */
        if (valid && length >= 3)
            valid = !((c == 0xe0 && at[1] < 0xa0) || (c == 0xed && at[1] >= 0xa0) ||
                      (c == 0xf0 && at[1] < 0x90) || (c == 0xf4 && at[1] >= 0x90));
        if (!valid) {
            fputs("\\ufffd", out);
            at++;
        } else if (c == '"' || c == '\\') {
            fprintf(out, "\\%c", c);
            at++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(out, "\\u%04x", c);
            at++;
        } else {
            fwrite(at, 1, length, out);
            at += length;
        }
    }
    fputc('"', out);
}

static void json_key(struct json *json, const char *key)
{
    if (!json->first)
        fputc(',', json->out);
    json->first = false;
    if (json->one_line) {
        if (key != NULL)
            fputc(' ', json->out);
    } else {
        fprintf(json->out, "\n%*s", json->depth * 2, "");
    }
    if (key != NULL) {
        json_string(json->out, key);
        fputs(": ", json->out);
    }
}

static void json_open(struct json *json, const char *key)
{
    if (key != NULL)
        json_key(json, key);
    fputc('{', json->out);
    json->depth++;
    json->first = true;
}

static void json_close(struct json *json)
{
    json->depth--;
    if (!json->one_line)
        fprintf(json->out, "\n%*s", json->depth * 2, "");
    else
        fputc(' ', json->out);
    fputc('}', json->out);
    json->first = false;
}

/* KEY: NUMBER, where NUMBER is already JSON number text. */
static void json_number(struct json *json, const char *key, const char *number)
{
    json_key(json, key);
    fputs(number, json->out);
}

static void json_integer(struct json *json, const char *key, uint64_t value)
{
    char text[24];

    snprintf(text, sizeof(text), "%llu", (unsigned long long)value);
    json_number(json, key, text);
}

static void json_money(struct json *json, const char *key, uint64_t nanos)
{
    char text[40];

    prices_format_money(nanos, MONEY_PLACES_JSON, false, text, sizeof(text));
    json_number(json, key, text);
}

static void json_text(struct json *json, const char *key, const char *text)
{
    json_key(json, key);
    json_string(json->out, text);
}

static void json_cost_line(struct json *json, const char *key,
                           const struct price *price,
                           const struct stats_cost_line *line, bool bytes)
{
    char amount[40];

    json_open(json, key);
    json_integer(json, "quantity", line->quantity);
    json_text(json, "unit", bytes ? "bytes" : "requests");
    prices_format_amount(price, amount, sizeof(amount));
    json_number(json, "price", amount);
    json_integer(json, "per", price->per);
    json_money(json, "amount", line->nanos);
    json_close(json);
}

/* KEY: COST (the bucket's, or with TIER the shared cache's: its prices
 * are --tier-prices', its savings at the bucket's, which "saved" names,
 * with the net of the two in one currency). */
static void json_cost(struct json *json, const struct stats_report *report,
                      const struct stats_cost *cost, const char *key, bool tier)
{
    const struct price_table *prices = tier ? report->tier_prices
                                            : report->prices;
    const struct price_table *saved_at = report->prices;

    json_open(json, key);
    json_text(json, "currency", prices->currency);
    json_text(json, "prices", prices->name);
    json_text(json, "prices_title", prices->title);
    if (prices->read_on[0] != '\0') {
        json_text(json, "prices_read_on", prices->read_on);
        json_text(json, "prices_source", prices->source);
    }
    json_key(json, "estimate");
    fputs("true", json->out);
    json_open(json, "items");
    for (int item = 0; item < PRICE_ITEM_COUNT; item++)
        json_cost_line(json, prices_item_name((enum price_item)item),
                       &prices->items[item], &cost->items[item],
                       item >= PRICES_REQUEST_KINDS);
    json_close(json);
    json_money(json, "total", cost->total);
    json_open(json, "saved");
    if (tier) {
        json_text(json, "currency", saved_at->currency);
        json_text(json, "prices", saved_at->name);
    }
    json_integer(json, "block_size", report->block_size);
    static const char *const from[] = {
        [STATS_BLOCK_SIZE_DEFAULT] = "default",
        [STATS_BLOCK_SIZE_COUNTERS] = "counters",
    };
    json_text(json, "block_size_from", from[report->block_size_from]);
    json_cost_line(json, "egress", &saved_at->items[PRICE_EGRESS],
                   &cost->saved_egress, true);
    json_cost_line(json, "get", &saved_at->items[PRICE_GET],
                   &cost->saved_gets, false);
    json_money(json, "total", cost->saved_total);
    if (tier && strcmp(prices->currency, saved_at->currency) == 0) {
        char net[48];
        format_net(cost->saved_total, cost->total, MONEY_PLACES_JSON, false,
                   net, sizeof(net));
        json_number(json, "net", net);
    }
    json_close(json);
    json_close(json);
}

int stats_report_json(FILE *out, const struct stats_report *report,
                      bool one_line, double time, char *err, size_t errlen)
{
    struct json json = {.out = out, .one_line = one_line};
    struct stats_text lifetime = {0};
    struct report_costs costs;
    uint64_t since;

    bool lifetime_shown =
        stats_report_lifetime(report->stats, &lifetime, &since) == 0;
    int result = report_costs(report, &lifetime, lifetime_shown, &costs, err,
                              errlen);
    if (result != 0) {
        stats_text_free(&lifetime);
        return result;
    }
    json_open(&json, NULL);
    if (time >= 0) {
        char text[32];
        snprintf(text, sizeof(text), "%.3f", time);
        json_number(&json, "time", text);
    }
    json_text(&json, "mountpoint", report->mountpoint);
    if (report->source != NULL)
        json_text(&json, "source", report->source);
    if (report->pid > 0)
        json_integer(&json, "pid", (uint64_t)report->pid);
    for (size_t i = 0; i < report->stats->count; i++)
        json_number(&json, report->stats->counters[i].name,
                    report->stats->counters[i].text);
    if (report->prices != NULL)
        json_cost(&json, report, &costs.mount, "cost", false);
    if (report->prices != NULL && lifetime_shown)
        json_cost(&json, report, &costs.lifetime, "lifetime_cost", false);
    if (report->prices != NULL && report->tier_prices != NULL) {
        json_cost(&json, report, &costs.tier_mount, "tier_cost", true);
        if (lifetime_shown)
            json_cost(&json, report, &costs.tier_lifetime,
                      "lifetime_tier_cost", true);
    }
    json_close(&json);
    fputc('\n', out);
    stats_text_free(&lifetime);
    return 0;
}

/* ------------------------------------------------------------------ watch */

struct watch_column {
    const char *counter;
    const char *head;
    bool bytes;         /* a rate in MiB/s; else per second */
    bool gauge;         /* the value now, not a rate */
};

static const struct watch_column watch_columns[] = {
    {"bytes_from_cache", "cache", true, false},
    {"bytes_from_bucket", "bucket", true, false},
    {"requests_get", "GET", false, false},
    {"requests_head", "HEAD", false, false},
    {"requests_list", "LIST", false, false},
    {"requests_put", "PUT", false, false},
    {"requests_delete", "DELETE", false, false},
    {"requests_copy", "COPY", false, false},
    {"requests_multipart", "MPU", false, false},
    {"bytes_to_bucket", "MiB/s", true, false},
    {"uploads_pending", "pending", false, true},
};
#define WATCH_COLUMNS (sizeof(watch_columns) / sizeof(watch_columns[0]))

/* TITLE centred in dashes over WIDTH characters. */
static void dashes(FILE *out, const char *title, int width)
{
    int inner = (int)strlen(title) + 2;
    int left = width > inner ? (width - inner) / 2 : 0;
    int right = width > inner ? width - inner - left : 0;

    fprintf(out, "%.*s %s %.*s", left, "----------------------------------------"
            "----------------------------------------", title, right,
            "--------------------------------------------------------------------"
            "------------");
}

void stats_report_watch_header(FILE *out, const struct price_table *prices)
{
    int column = WATCH_WIDTH + 1;

    fputc(' ', out);
    dashes(out, "MiB/s", 2 * column - 1);
    fputc(' ', out);
    dashes(out, "requests/s", 7 * column - 1);
    fputc(' ', out);
    dashes(out, "upload", 2 * column - 1);
    if (prices != NULL) {
        fputc(' ', out);
        dashes(out, "cost", column + 1);
    }
    fputc('\n', out);
    for (size_t i = 0; i < WATCH_COLUMNS; i++)
        fprintf(out, " %*s", WATCH_WIDTH, watch_columns[i].head);
    if (prices != NULL) {
        char head[16];
        snprintf(head, sizeof(head), "%s/h", prices->currency);
        fprintf(out, " %*s", WATCH_WIDTH + 2, head);
    }
    fputc('\n', out);
}

/* How much COUNTER grew from BEFORE to NOW (from 0 if it went down: a new
 * daemon). False if NOW lacks it. */
static bool growth(const struct stats_text *before, const struct stats_text *now,
                   const char *counter, uint64_t *out)
{
    uint64_t then = 0, value;

    if (stats_text_get(now, counter, &value) != 0)
        return false;
    if (stats_text_get(before, counter, &then) != 0 || then > value)
        then = 0;
    *out = value - then;
    return true;
}

void stats_report_watch_line(FILE *out, const struct stats_text *before,
                             const struct stats_text *now, double seconds,
                             const struct price_table *prices)
{
    for (size_t i = 0; i < WATCH_COLUMNS; i++) {
        const struct watch_column *column = &watch_columns[i];
        uint64_t value;
        if (column->gauge ? stats_text_get(now, column->counter, &value) != 0
                          : !growth(before, now, column->counter, &value)) {
            fprintf(out, " %*s", WATCH_WIDTH, "-");
        } else if (column->gauge) {
            fprintf(out, " %*llu", WATCH_WIDTH, (unsigned long long)value);
        } else {
            double rate = (double)value / seconds;
            if (column->bytes)
                rate /= 1 << 20;
            fprintf(out, " %*.1f", WATCH_WIDTH, rate);
        }
    }
    if (prices != NULL) {
        /* the cost of this interval's traffic, as an hourly rate */
        double nanos = 0;
        bool known = true;
        for (int item = 0; item < PRICE_ITEM_COUNT && known; item++) {
            uint64_t quantity, cost;
            known = growth(before, now, item_counters[item], &quantity);
            if (known && prices_cost(&prices->items[item], quantity, &cost) == 0)
                nanos += (double)cost;
        }
        if (known)
            fprintf(out, " %*.4f", WATCH_WIDTH + 2,
                    nanos / (double)PRICES_NANO_PER_UNIT * 3600 / seconds);
        else
            fprintf(out, " %*s", WATCH_WIDTH + 2, "-");
    }
    fputc('\n', out);
}
