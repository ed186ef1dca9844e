/*
 * prices.c - price tables: the presets, the text format, exact costs (see
 * prices.h).
 *
 * The presets are written in the file format itself and go through the
 * same parser, so what a user writes and what ships are one language.
 * Each preset says where and when its figures were read; what could not
 * be read from the provider's own page says so. All figures are list
 * prices without free allowances or volume tiers: what this mount adds
 * to a bill that has used its allowances up, which is an upper bound for
 * small accounts and the first tier for large ones. A GB is priced as
 * 10^9 bytes in every preset (the larger count of the two: a provider
 * that bills binary gigabytes charges 7.4% less for the same bytes).
 */
#include "config.h"

#include "cmd/prices.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_AMOUNT_UNITS 1000000ull       /* no price above this */
#define MAX_DECIMALS 12                   /* pico precision */
#define MAX_REQUESTS_PER 1000000000000ull /* "per N": N at most 10^12 */

static const char *const item_names[PRICE_ITEM_COUNT] = {
    [PRICE_GET] = "get", [PRICE_HEAD] = "head", [PRICE_LIST] = "list",
    [PRICE_PUT] = "put", [PRICE_DELETE] = "delete", [PRICE_COPY] = "copy",
    [PRICE_MULTIPART] = "multipart", [PRICE_EGRESS] = "egress",
    [PRICE_INGRESS] = "ingress",
};

static const struct {
    const char *name;
    uint64_t bytes;
} byte_units[] = {
    {"GB", 1000000000ull}, {"GiB", 1ull << 30},
    {"TB", 1000000000000ull}, {"TiB", 1ull << 40},
};

struct preset {
    const char *name;
    const char *read_on;
    const char *source;
    const char *text;   /* in the format of prices.h */
};

/*
 * All read on 2026-12-02, from stored copies of the pages (the `search`
 * tool's docs and pages corpora), not from the live web.
 */
static const struct preset presets[] = {
    /*
     * AWS S3 Standard, us-east-1. https://aws.amazon.com/s3/pricing/ is
     * the source, but its stored copy shows template tokens in place of
     * the request and transfer prices (they are filled in by a script),
     * so these figures could NOT be read from AWS's own page. They are
     * the ones quoted from it by https://c3x.dev/blog/s3-request-fees-explained
     * (PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD, SELECT $0.0004
     * per 1,000) and https://www.usage.ai/blogs/s3-egress-cost/ (updated
     * 2026-06-04: internet egress $0.09/GB from 100 GB to 10 TB a month,
     * the first 100 GB a month free, account-wide). DELETE is free: AWS's
     * own calculator legend (s3.amazonaws.com/calculator/calc5.html, old)
     * says "Delete Requests are not charged". Multipart requests are
     * priced as PUT/POST, AbortMultipartUpload (a DELETE) with them.
     * Egress is to the internet: reads from
     * EC2 in the same region pay no egress (use a file with `egress free`).
     */
    {"aws", "2026-12-02",
     "https://aws.amazon.com/s3/pricing/ (figures via c3x.dev and usage.ai; "
     "not readable on AWS's page)",
     "name AWS S3 Standard, us-east-1, internet egress\n"
     "get 0.0004 per 1000\n"
     "head 0.0004 per 1000\n"
     "list 0.005 per 1000\n"
     "put 0.005 per 1000\n"
     "delete free\n"
     "copy 0.005 per 1000\n"
     "multipart 0.005 per 1000\n"
     "egress 0.09 per GB\n"
     "ingress free\n"},
    /*
     * Cloudflare R2 Standard storage. https://developers.cloudflare.com/r2/pricing/
     * (its source, cloudflare/cloudflare-docs src/content/docs/r2/pricing.mdx
     * at commit 07ec87d4f0b2bb3dd731f801af428f16d6c1b71d): Class A $4.50
     * per million (ListObjects, PutObject, CopyObject, Create/Complete
     * MultipartUpload, UploadPart, UploadPartCopy), Class B $0.36 per
     * million (HeadObject, GetObject), DeleteObject and
     * AbortMultipartUpload free, egress free. Not applied: the monthly
     * free tier (1 million Class A, 10 million Class B) and R2's rounding
     * up to the next million.
     */
    {"r2", "2026-12-02", "https://developers.cloudflare.com/r2/pricing/",
     "name Cloudflare R2 Standard\n"
     "get 0.36 per 1000000\n"
     "head 0.36 per 1000000\n"
     "list 4.50 per 1000000\n"
     "put 4.50 per 1000000\n"
     "delete free\n"
     "copy 4.50 per 1000000\n"
     "multipart 4.50 per 1000000\n"
     "egress free\n"
     "ingress free\n"},
    /*
     * Backblaze B2. https://www.backblaze.com/cloud-storage/transaction-pricing:
     * Class A free (PutObject, Create/Complete/AbortMultipartUpload,
     * UploadPart, DeleteObject), Class B $0.004 per 10,000 (GetObject,
     * HeadObject), Class C $0.004 per 1,000 (ListObjectsV2, CopyObject,
     * UploadPartCopy). Not applied: the 2,500 free Class B and Class C
     * calls a day. UploadPartCopy (a multipart copy) is Class C but
     * priced here as multipart (free): an under-estimate for renames of
     * files over 5 GiB. Egress: $0.01/GB is from the older page
     * https://www.backblaze.com/b2/b2-transactions-price.html (the first
     * 1 GB a day free); the allowance B2 gives now (free egress up to a
     * multiple of the data stored, as reported elsewhere) could NOT be
     * read on Backblaze's own pages: the figure here is what egress past
     * the allowance costs.
     */
    {"b2", "2026-12-02",
     "https://www.backblaze.com/cloud-storage/transaction-pricing",
     "name Backblaze B2, egress past the free allowance\n"
     "get 0.004 per 10000\n"
     "head 0.004 per 10000\n"
     "list 0.004 per 1000\n"
     "put free\n"
     "delete free\n"
     "copy 0.004 per 1000\n"
     "multipart free\n"
     "egress 0.01 per GB\n"
     "ingress free\n"},
    /*
     * Google Cloud Storage, Standard storage in a region (such as
     * us-east1). https://cloud.google.com/storage/pricing-examples: Class
     * A operations $0.005 per 1,000, Class B $0.0004 per 1,000, outbound
     * data transfer $0.12/GB (to the Americas and EMEA, the first tier).
     * Classes (https://cloud.google.com/storage/pricing#operations-by-class,
     * XML API): listing a bucket, PUT and POST are Class A (a copy is a
     * PUT; each request of a multipart upload too), GET and HEAD of an
     * object Class B, DELETE free. The operation prices of the main page
     * could not be read in its stored copy; multi-region and dual-region
     * buckets pay more for Class A. Not applied: the always-free
     * allowances.
     */
    {"gcs", "2026-12-02", "https://cloud.google.com/storage/pricing-examples",
     "name Google Cloud Storage Standard, a region\n"
     "get 0.0004 per 1000\n"
     "head 0.0004 per 1000\n"
     "list 0.005 per 1000\n"
     "put 0.005 per 1000\n"
     "delete free\n"
     "copy 0.005 per 1000\n"
     "multipart 0.005 per 1000\n"
     "egress 0.12 per GB\n"
     "ingress free\n"},
};
#define PRESET_COUNT (sizeof(presets) / sizeof(presets[0]))

const char *prices_item_name(enum price_item item)
{
    return item < PRICE_ITEM_COUNT ? item_names[item] : "?";
}

const char *prices_preset_names(void)
{
    return "aws, r2, b2, gcs";
}

bool prices_is_free(const struct price *price)
{
    return price->amount_pico == 0;
}

/* ---------------------------------------------------------------- parsing */

struct parser {
    const char *origin;
    unsigned line;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 2, 3)))
static int fail(struct parser *parser, const char *format, ...)
{
    char message[256];
    va_list args;

    va_start(args, format);
    vsnprintf(message, sizeof(message), format, args);
    va_end(args);
    if (parser->err != NULL && parser->errlen > 0)
        snprintf(parser->err, parser->errlen, "%s:%u: %s", parser->origin,
                 parser->line, message);
    return EINVAL;
}

/* The next blank-separated word of *CURSOR into WORD (CAP bytes); "" at
 * the end. A word too long for WORD is cut (and then fails to match). */
static void next_word(const char **cursor, char *word, size_t cap)
{
    const char *at = *cursor;
    size_t used = 0;

    while (*at == ' ' || *at == '\t')
        at++;
    while (*at != '\0' && *at != ' ' && *at != '\t') {
        if (used + 1 < cap)
            word[used++] = *at;
        at++;
    }
    word[used] = '\0';
    *cursor = at;
}

/* "0.0004" -> 400000000 (pico). 0 or EINVAL. */
static int parse_amount(const char *text, uint64_t *pico)
{
    uint64_t units = 0, fraction = 0;
    unsigned decimals = 0;
    const char *at = text;

    if (*at < '0' || *at > '9')
        return EINVAL;
    for (; *at >= '0' && *at <= '9'; at++) {
        units = units * 10 + (uint64_t)(*at - '0');
        if (units > MAX_AMOUNT_UNITS)
            return EINVAL;
    }
    if (*at == '.') {
        at++;
        if (*at < '0' || *at > '9')
            return EINVAL;
        for (; *at >= '0' && *at <= '9'; at++) {
            if (++decimals > MAX_DECIMALS)
                return EINVAL;
            fraction = fraction * 10 + (uint64_t)(*at - '0');
        }
    }
    if (*at != '\0')
        return EINVAL;
    for (unsigned i = decimals; i < MAX_DECIMALS; i++)
        fraction *= 10;
    *pico = units * PRICES_PICO_PER_UNIT + fraction;
    if (*pico > MAX_AMOUNT_UNITS * PRICES_PICO_PER_UNIT)
        return EINVAL;
    return 0;
}

/* A positive integer of at most MAX_REQUESTS_PER. 0 or EINVAL. */
static int parse_count(const char *text, uint64_t *out)
{
    uint64_t value = 0;

    if (*text < '1' || *text > '9')
        return EINVAL;
    for (; *text != '\0'; text++) {
        if (*text < '0' || *text > '9')
            return EINVAL;
        value = value * 10 + (uint64_t)(*text - '0');
        if (value > MAX_REQUESTS_PER)
            return EINVAL;
    }
    *out = value;
    return 0;
}

/* The rest of an item's line (after its name) into *PRICE. */
static int parse_item(struct parser *parser, enum price_item item,
                      const char *rest, struct price *price)
{
    char amount[64], per[64], quantity[64], extra[64];
    bool bytes = item == PRICE_EGRESS || item == PRICE_INGRESS;
    const char *example = bytes ? "0.09 per GB" : "0.0004 per 1000";

    next_word(&rest, amount, sizeof(amount));
    if (strcmp(amount, "free") == 0) {
        next_word(&rest, extra, sizeof(extra));
        if (extra[0] != '\0')
            return fail(parser, "unexpected '%s' after '%s free'", extra,
                        item_names[item]);
        *price = (struct price){.amount_pico = 0, .per = 1};
        return 0;
    }
    if (amount[0] == '\0')
        return fail(parser, "'%s' needs a price, such as '%s %s', or 'free'",
                    item_names[item], item_names[item], example);
    if (parse_amount(amount, &price->amount_pico) != 0)
        return fail(parser, "'%s': expected a price such as %s (a decimal "
                    "of at most 12 places, at most 1000000), got '%s'",
                    item_names[item], bytes ? "0.09" : "0.0004", amount);
    next_word(&rest, per, sizeof(per));
    next_word(&rest, quantity, sizeof(quantity));
    next_word(&rest, extra, sizeof(extra));
    if (strcmp(per, "per") != 0 || quantity[0] == '\0')
        return fail(parser, "'%s %s': expected 'per' and %s, such as '%s %s'",
                    item_names[item], amount,
                    bytes ? "a unit (GB, GiB, TB or TiB)" : "a number of requests",
                    item_names[item], example);
    if (bytes) {
        size_t unit;
        for (unit = 0; unit < sizeof(byte_units) / sizeof(byte_units[0]); unit++)
            if (strcmp(quantity, byte_units[unit].name) == 0)
                break;
        if (unit == sizeof(byte_units) / sizeof(byte_units[0]))
            return fail(parser, "'%s': expected a unit of GB, GiB, TB or TiB "
                        "after 'per', got '%s'", item_names[item], quantity);
        price->per = byte_units[unit].bytes;
        snprintf(price->unit, sizeof(price->unit), "%s", byte_units[unit].name);
    } else {
        if (parse_count(quantity, &price->per) != 0)
            return fail(parser, "'%s': expected a number of requests from 1 to "
                        "1000000000000 after 'per' (digits only, such as 1000), "
                        "got '%s'", item_names[item], quantity);
        price->unit[0] = '\0';
    }
    if (extra[0] != '\0')
        return fail(parser, "unexpected '%s' after '%s %s per %s'", extra,
                    item_names[item], amount, quantity);
    return 0;
}

/* One line, comment and surrounding blanks removed, not empty. SEEN holds
 * the line on which each item (and name, currency) was first given. */
static int parse_line(struct parser *parser, const char *line,
                      struct price_table *out, unsigned *seen)
{
    enum { SEEN_NAME = PRICE_ITEM_COUNT, SEEN_CURRENCY, SEEN_COUNT };
    char keyword[64], word[64];
    const char *rest = line;
    int index = -1;

    next_word(&rest, keyword, sizeof(keyword));
    if (strcmp(keyword, "name") == 0) {
        index = SEEN_NAME;
    } else if (strcmp(keyword, "currency") == 0) {
        index = SEEN_CURRENCY;
    } else {
        for (int item = 0; item < PRICE_ITEM_COUNT; item++)
            if (strcmp(keyword, item_names[item]) == 0)
                index = item;
    }
    if (index < 0)
        return fail(parser, "unknown item '%s': expected name, currency, get, "
                    "head, list, put, delete, copy, multipart, egress or "
                    "ingress", keyword);
    if (seen[index] != 0)
        return fail(parser, "'%s' is given twice (first on line %u)", keyword,
                    seen[index]);
    seen[index] = parser->line;

    if (index == SEEN_NAME) {
        while (*rest == ' ' || *rest == '\t')
            rest++;
        if (*rest == '\0')
            return fail(parser, "'name' needs a label, such as 'name My provider'");
        if (strlen(rest) >= sizeof(out->title))
            return fail(parser, "the name is longer than %zu characters",
                        sizeof(out->title) - 1);
        snprintf(out->title, sizeof(out->title), "%s", rest);
        return 0;
    }
    if (index == SEEN_CURRENCY) {
        next_word(&rest, word, sizeof(word));
        bool code = strlen(word) == 3;
        for (int i = 0; code && i < 3; i++)
            code = word[i] >= 'A' && word[i] <= 'Z';
        if (!code)
            return fail(parser, "'currency': expected a three-letter code such "
                        "as USD, got '%s'", word);
        memcpy(out->currency, word, 4);
        next_word(&rest, word, sizeof(word));
        if (word[0] != '\0')
            return fail(parser, "unexpected '%s' after the currency", word);
        return 0;
    }
    return parse_item(parser, (enum price_item)index, rest, &out->items[index]);
}

int prices_parse(const char *text, size_t len, const char *origin,
                 struct price_table *out, char *err, size_t errlen)
{
    struct parser parser = {.origin = origin, .line = 0, .err = err,
                            .errlen = errlen};
    unsigned seen[PRICE_ITEM_COUNT + 2] = {0};
    char line[512];
    size_t at = 0;

    memset(out, 0, sizeof(*out));
    const char *base = strrchr(origin, '/');
    snprintf(out->name, sizeof(out->name), "%s", base ? base + 1 : origin);
    memcpy(out->currency, "USD", 4);
    for (int item = 0; item < PRICE_ITEM_COUNT; item++)
        out->items[item] = (struct price){.amount_pico = 0, .per = 1};

    while (at < len) {
        size_t end = at, used = 0;
        parser.line++;
        while (end < len && text[end] != '\n')
            end++;
        for (size_t i = at; i < end; i++) {
            if (text[i] == '\0')
                return fail(&parser, "%s", "a NUL byte: not a text file");
            if (text[i] == '#')
                break;
            if (used + 1 >= sizeof(line))
                return fail(&parser, "the line is longer than %zu characters",
                            sizeof(line) - 1);
            line[used++] = text[i] == '\r' || text[i] == '\t' ? ' ' : text[i];
        }
        while (used > 0 && line[used - 1] == ' ')
            used--;
        line[used] = '\0';
        at = end + 1;
        size_t start = strspn(line, " ");
        if (line[start] == '\0')
            continue;
        int result = parse_line(&parser, line + start, out, seen);
        if (result != 0)
            return result;
    }
    if (out->title[0] == '\0')
        snprintf(out->title, sizeof(out->title), "%s", out->name);
    return 0;
}

int prices_preset(const char *name, struct price_table *out)
{
    for (size_t i = 0; i < PRESET_COUNT; i++) {
        if (strcmp(name, presets[i].name) != 0)
            continue;
        char err[256];
        if (prices_parse(presets[i].text, strlen(presets[i].text),
                         presets[i].name, out, err, sizeof(err)) != 0)
            return EINVAL; /* cannot happen: test_prices parses every one */
        snprintf(out->read_on, sizeof(out->read_on), "%s", presets[i].read_on);
        snprintf(out->source, sizeof(out->source), "%s", presets[i].source);
        return 0;
    }
    return ENOENT;
}

/* ------------------------------------------------------------- arithmetic */

int prices_cost(const struct price *price, uint64_t quantity, uint64_t *nanos)
{
    /* quantity x amount_pico / (per x 1000), rounded half up:
     * floor((2 x numerator + denominator) / (2 x denominator)). The
     * amount is at most 10^18 < 2^60, so 2 x numerator < 2^125. */
    unsigned __int128 numerator = (unsigned __int128)quantity * price->amount_pico;
    unsigned __int128 denominator = (unsigned __int128)price->per * 1000u;
    unsigned __int128 result = (2 * numerator + denominator) / (2 * denominator);

    if (result > UINT64_MAX) {
        *nanos = UINT64_MAX;
        return ERANGE;
    }
    *nanos = (uint64_t)result;
    return 0;
}

/* ------------------------------------------------------------- formatting */

/* VALUE in decimal with a comma every three digits when GROUPED. */
static void format_integer(uint64_t value, bool grouped, char *buf, size_t len)
{
    char digits[32], out[40];
    int count = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)value);
    size_t used = 0;

    for (int i = 0; i < count; i++) {
        if (grouped && i > 0 && (count - i) % 3 == 0)
            out[used++] = ',';
        out[used++] = digits[i];
    }
    out[used] = '\0';
    snprintf(buf, len, "%s", out);
}

void prices_format_money(uint64_t nanos, unsigned decimals, bool grouped,
                         char *buf, size_t len)
{
    uint64_t scale = 1;
    char units[40];

    if (decimals > 9)
        decimals = 9;
    for (unsigned i = decimals; i < 9; i++)
        scale *= 10;
    /* rounded half up to DECIMALS places, in 128 bits (NANOS may be near
     * 2^64) */
    unsigned __int128 rounded = ((unsigned __int128)nanos + scale / 2) / scale;
    uint64_t one = PRICES_NANO_PER_UNIT / scale;   /* 10^decimals */
    format_integer((uint64_t)(rounded / one), grouped, units, sizeof(units));
    if (decimals == 0)
        snprintf(buf, len, "%s", units);
    else
        snprintf(buf, len, "%s.%0*llu", units, (int)decimals,
                 (unsigned long long)(rounded % one));
}

void prices_format_amount(const struct price *price, char *buf, size_t len)
{
    uint64_t units = price->amount_pico / PRICES_PICO_PER_UNIT;
    uint64_t fraction = price->amount_pico % PRICES_PICO_PER_UNIT;
    char digits[16];
    int places = MAX_DECIMALS;

    if (fraction == 0) {
        snprintf(buf, len, "%llu", (unsigned long long)units);
        return;
    }
    while (fraction % 10 == 0) {
        fraction /= 10;
        places--;
    }
    snprintf(digits, sizeof(digits), "%0*llu", places, (unsigned long long)fraction);
    snprintf(buf, len, "%llu.%s", (unsigned long long)units, digits);
}

void prices_format_price(const struct price_table *table,
                         const struct price *price, char *buf, size_t len)
{
    char amount[40], per[40];

    if (prices_is_free(price)) {
        snprintf(buf, len, "free");
        return;
    }
    prices_format_amount(price, amount, sizeof(amount));
    if (price->unit[0] != '\0')
        snprintf(per, sizeof(per), "%s", price->unit);
    else if (price->per == 1)
        snprintf(per, sizeof(per), "request");
    else
        format_integer(price->per, true, per, sizeof(per));
    snprintf(buf, len, "%s %s per %s", amount, table->currency, per);
}
