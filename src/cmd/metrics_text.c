/*
 * metrics_text.c - the Prometheus text of a mount's counters (see
 * metrics_text.h). One table names every plain family: its name, type,
 * help and where its value is in struct fs_stats; the requests and their
 * latency histograms, labelled by kind, and the info and start-time
 * gauges are written after it. With a shared cache tier (-o shared_cache)
 * a second table names its families, tier_*, followed by its own requests
 * and latencies by kind; without one, none of them is written.
 */
#include "config.h"

#include "cmd/metrics_text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define PREFIX "s3cachefs_"

enum family_type { COUNTER, GAUGE };

struct family {
    const char *name;       /* after PREFIX */
    enum family_type type;
    const char *help;
    uint64_t (*value)(const struct metrics_snapshot *snapshot);
};

#define STAT(field)                                                        \
    static uint64_t value_##field(const struct metrics_snapshot *s)        \
    {                                                                      \
        return s->stats->field;                                            \
    }
#define S3_STAT(field)                                                     \
    static uint64_t value_s3_##field(const struct metrics_snapshot *s)     \
    {                                                                      \
        return s->stats->s3.field;                                         \
    }
#define CACHE_STAT(field)                                                  \
    static uint64_t value_cache_##field(const struct metrics_snapshot *s)  \
    {                                                                      \
        return s->stats->cache.field;                                      \
    }
#define TIER_STAT(field)                                                   \
    static uint64_t value_tier_##field(const struct metrics_snapshot *s)   \
    {                                                                      \
        return s->stats->tier.field;                                       \
    }

STAT(bytes_read)
STAT(hit_bytes)
STAT(direct_bytes)
STAT(inodes)
STAT(listing_bytes)
STAT(listings_dropped)
STAT(bytes_written)
STAT(uploads_pending)
STAT(uploads_completed)
STAT(upload_failures)
STAT(upload_retries)
STAT(copies_on_write)
S3_STAT(bytes_received)
S3_STAT(bytes_sent)
S3_STAT(retries)
S3_STAT(failures)
CACHE_STAT(used_bytes)
CACHE_STAT(index_bytes)
CACHE_STAT(protected_bytes)
CACHE_STAT(pinned_bytes)
CACHE_STAT(size_limit)
CACHE_STAT(blocks)
CACHE_STAT(evicted_blocks)
CACHE_STAT(corrupt_blocks)
TIER_STAT(hit_bytes)
TIER_STAT(put_bytes)
TIER_STAT(hits)
TIER_STAT(misses)
TIER_STAT(bad)
TIER_STAT(skipped)
TIER_STAT(puts)
TIER_STAT(put_exists)
TIER_STAT(put_dropped)
TIER_STAT(queued_bytes)
TIER_STAT(errors)
TIER_STAT(leases)
TIER_STAT(lease_waits)
TIER_STAT(lease_waits_met)

static uint64_t value_tier_lease_mode(const struct metrics_snapshot *s)
{
    int mode = s->stats->tier.lease_mode;
    return mode > 0 ? (uint64_t)mode : 0;
}

static uint64_t value_tier_skipping(const struct metrics_snapshot *s)
{
    return s->stats->tier.skipping ? 1 : 0;
}

static uint64_t value_block_size(const struct metrics_snapshot *s)
{
    return s->block_size;
}

static const struct family families[] = {
    {"read_bytes_total", COUNTER,
     "Bytes returned to readers.", value_bytes_read},
    {"cache_hit_bytes_total", COUNTER,
     "Bytes returned to readers from blocks already in the cache.",
     value_hit_bytes},
    {"read_around_cache_bytes_total", COUNTER,
     "Bytes read from the bucket without caching them (the cache was full).",
     value_direct_bytes},
    {"bucket_received_bytes_total", COUNTER,
     "Object data received from the bucket (bodies of GET requests).",
     value_s3_bytes_received},
    {"bucket_sent_bytes_total", COUNTER,
     "Object data sent to the bucket (bodies of PUT and part uploads).",
     value_s3_bytes_sent},
    {"request_retries_total", COUNTER,
     "Requests to the bucket sent again after a failed attempt.",
     value_s3_retries},
    {"request_failures_total", COUNTER,
     "Requests to the bucket that failed after their retries (a missing key "
     "is an answer, not a failure).",
     value_s3_failures},
    {"cache_used_bytes", GAUGE,
     "Bytes of cached blocks, rounded up to 4 KiB each.",
     value_cache_used_bytes},
    {"cache_index_bytes", GAUGE,
     "Bytes of the cache's index file in use.", value_cache_index_bytes},
    {"cache_protected_bytes", GAUGE,
     "Bytes of cached blocks read more than once (evicted last).",
     value_cache_protected_bytes},
    {"cache_pinned_bytes", GAUGE,
     "Bytes of the versions pinned by s3cachefs warm --pin (kept through "
     "eviction), each rounded up to 4 KiB.", value_cache_pinned_bytes},
    {"cache_limit_bytes", GAUGE,
     "The cache's size limit (-o cache_size).", value_cache_size_limit},
    {"cache_block_size_bytes", GAUGE,
     "The cache's block size.", value_block_size},
    {"cache_blocks", GAUGE,
     "Blocks in the cache.", value_cache_blocks},
    {"cache_evicted_blocks_total", COUNTER,
     "Blocks evicted to keep the cache within its limit.",
     value_cache_evicted_blocks},
    {"cache_corrupt_blocks_total", COUNTER,
     "Cached blocks that failed their checksum (fetched again).",
     value_cache_corrupt_blocks},
    {"inodes", GAUGE,
     "Inodes the kernel holds.", value_inodes},
    {"listing_bytes", GAUGE,
     "Memory the directories' listings take (-o listing_memory).",
     value_listing_bytes},
    {"listings_dropped_total", COUNTER,
     "Listings let go to keep within -o listing_memory.",
     value_listings_dropped},
    {"written_bytes_total", COUNTER,
     "Bytes written by applications.", value_bytes_written},
    {"uploads_pending", GAUGE,
     "Files written and not yet in the bucket.", value_uploads_pending},
    {"uploads_completed_total", COUNTER,
     "Uploads of written files that completed.", value_uploads_completed},
    {"upload_failures_total", COUNTER,
     "Upload attempts of written files that failed.", value_upload_failures},
    {"upload_retries_total", COUNTER,
     "Uploads of written files tried again in the background.",
     value_upload_retries},
    {"copies_on_write_total", COUNTER,
     "Staged files copied before a change because their upload was under "
     "way or promised.",
     value_copies_on_write},
};

/* The shared cache tier's, written only when it is configured. */
static const struct family tier_families[] = {
    {"tier_received_bytes_total", COUNTER,
     "Block data received from the shared cache and verified (blocks the "
     "bucket did not have to send).", value_tier_hit_bytes},
    {"tier_sent_bytes_total", COUNTER,
     "Block data written to the shared cache (blocks fetched from the "
     "bucket, for the other nodes).", value_tier_put_bytes},
    {"tier_hit_blocks_total", COUNTER,
     "Blocks read from the shared cache and verified.", value_tier_hits},
    {"tier_miss_blocks_total", COUNTER,
     "Blocks asked of the shared cache that it did not have (read from the "
     "bucket).", value_tier_misses},
    {"tier_bad_blocks_total", COUNTER,
     "Blocks of the shared cache that failed their check: damaged, cut "
     "short or another block (read from the bucket).", value_tier_bad},
    {"tier_skipped_blocks_total", COUNTER,
     "Blocks not asked of the shared cache because it was skipped after a "
     "failure.", value_tier_skipped},
    {"tier_written_blocks_total", COUNTER,
     "Blocks written to the shared cache.", value_tier_puts},
    {"tier_written_first_elsewhere_blocks_total", COUNTER,
     "Blocks whose write found the block already written by another node.",
     value_tier_put_exists},
    {"tier_dropped_blocks_total", COUNTER,
     "Blocks not written to the shared cache: its queue was full, it was "
     "skipped, or the block was evicted here before its turn.",
     value_tier_put_dropped},
    {"tier_queued_bytes", GAUGE,
     "Block data waiting to be written to the shared cache.",
     value_tier_queued_bytes},
    {"tier_request_failures_total", COUNTER,
     "Requests to the shared cache that failed (each has it skipped for a "
     "while).",
     value_tier_errors},
    {"tier_skipping", GAUGE,
     "1 while the shared cache is skipped after a failure (neither read nor "
     "written), else 0.", value_tier_skipping},
    {"tier_lease_mode", GAUGE,
     "How the shared cache's server takes leases: 0 not known yet, 1 by "
     "conditional writes, 2 written and read back (it has none).",
     value_tier_lease_mode},
    {"tier_leases_total", COUNTER,
     "Groups of blocks leased here before fetching them from the bucket.",
     value_tier_leases},
    {"tier_lease_waits_total", COUNTER,
     "Blocks waited for in the shared cache because another node leased "
     "them.", value_tier_lease_waits},
    {"tier_lease_waits_met_total", COUNTER,
     "Blocks waited for that came before the other node's lease ended.",
     value_tier_lease_waits_met},
};

static const char *const kind_names[S3_OP_COUNT] = {
    [S3_OP_GET] = "get",       [S3_OP_HEAD] = "head",
    [S3_OP_LIST] = "list",     [S3_OP_PUT] = "put",
    [S3_OP_DELETE] = "delete", [S3_OP_COPY] = "copy",
    [S3_OP_MULTIPART] = "multipart",
};

static void header(FILE *out, const char *name, const char *type,
                   const char *help)
{
    fprintf(out, "# HELP " PREFIX "%s %s\n# TYPE " PREFIX "%s %s\n", name,
            help, name, type);
}

/* VALUE as a label value: backslash, quote and newline escaped. */
static void label_value(FILE *out, const char *value)
{
    for (const char *c = value; *c != '\0'; c++) {
        if (*c == '\\' || *c == '"')
            fprintf(out, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", out);
        else
            fputc(*c, out);
    }
}

/* The requests of S3 by kind and their latency histograms, as the
 * families NAME_requests_total and NAME_request_duration_seconds (NAME
 * "" or "tier_"), to WHERE ("the bucket", "the shared cache"). */
static void requests(FILE *out, const char *name, const char *where,
                     const struct s3_stats *s3)
{
    char family[64], help[256];

    snprintf(family, sizeof(family), "%srequests_total", name);
    snprintf(help, sizeof(help), "Requests sent to %s by kind, retries "
             "included (multipart: create, part, complete; an abort is a "
             "delete).", where);
    header(out, family, "counter", help);
    for (int op = 0; op < S3_OP_COUNT; op++)
        fprintf(out, PREFIX "%s{kind=\"%s\"} %" PRIu64 "\n", family,
                kind_names[op], s3->requests[op]);

    snprintf(family, sizeof(family), "%srequest_duration_seconds", name);
    snprintf(help, sizeof(help), "Time from the start of a request to %s to "
             "the end of its answer (body included), each attempt on its own, "
             "by kind.", where);
    header(out, family, "histogram", help);
    for (int op = 0; op < S3_OP_COUNT; op++) {
        const struct s3_latency *latency = &s3->latency[op];
        uint64_t cumulative = 0;
        for (unsigned b = 0; b < S3_LATENCY_BUCKETS; b++) {
            cumulative += latency->counts[b];
            fprintf(out,
                    PREFIX "%s_bucket{kind=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                    family, kind_names[op], s3_latency_bound(b), cumulative);
        }
        cumulative += latency->counts[S3_LATENCY_BUCKETS];
        fprintf(out,
                PREFIX "%s_bucket{kind=\"%s\",le=\"+Inf\"} %" PRIu64 "\n"
                PREFIX "%s_sum{kind=\"%s\"} %" PRIu64 ".%06" PRIu64 "\n"
                PREFIX "%s_count{kind=\"%s\"} %" PRIu64 "\n",
                family, kind_names[op], cumulative, family, kind_names[op],
                latency->sum_us / 1000000, latency->sum_us % 1000000, family,
                kind_names[op], cumulative);
    }
}

/* Each of the N families of TABLE: HELP, TYPE, its one sample. */
static void plain_families(FILE *out, const struct family *table, size_t n,
                           const struct metrics_snapshot *snapshot)
{
    for (size_t i = 0; i < n; i++) {
        const struct family *f = &table[i];
        header(out, f->name, f->type == COUNTER ? "counter" : "gauge",
               f->help);
        fprintf(out, PREFIX "%s %" PRIu64 "\n", f->name, f->value(snapshot));
    }
}

int metrics_text_render(const struct metrics_snapshot *snapshot, char **text,
                        size_t *len)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&buf, &size);

    *text = NULL;
    *len = 0;
    if (out == NULL)
        return ENOMEM;
    plain_families(out, families, sizeof(families) / sizeof(families[0]),
                   snapshot);
    requests(out, "", "the bucket", &snapshot->stats->s3);
    if (snapshot->stats->tier_on) {
        plain_families(out, tier_families,
                       sizeof(tier_families) / sizeof(tier_families[0]),
                       snapshot);
        requests(out, "tier_", "the shared cache", &snapshot->stats->tier.s3);
    }
    header(out, "build_info", "gauge",
           "Always 1; the version of the daemon in its label.");
    fputs(PREFIX "build_info{version=\"", out);
    label_value(out, snapshot->version != NULL ? snapshot->version : "");
    fputs("\"} 1\n", out);
    header(out, "start_time_seconds", "gauge",
           "When the daemon started, in seconds since the epoch.");
    fprintf(out, PREFIX "start_time_seconds %.3f\n", snapshot->start_time);
    if (ferror(out)) {
        fclose(out);
        free(buf);
        return ENOMEM;
    }
    if (fclose(out) != 0) {
        free(buf);
        return ENOMEM;
    }
    *text = buf;
    *len = size;
    return 0;
}
