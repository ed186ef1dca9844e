/*
 * shared_cache.c - the shared cache tier's client from the mount options
 * (see shared_cache.h).
 */
#include "config.h"

#include "cmd/tier_setup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "creds/credsource.h"
#include "s3/s3.h"

struct shared_cache {
    struct awsconfig aws;        /* its own, with shared_cache_profile */
    struct credentials *own_creds;
    struct s3_client *s3;
    char *origin;                /* "ENDPOINT BUCKET" of the mounted bucket */
    char *prefix;
    struct tier *tier;
};

static const char *endpoint_name(const char *endpoint)
{
    return endpoint != NULL ? endpoint : "AWS S3";
}

/* Resolve the profile of -o shared_cache_profile and its keys. */
static int own_credentials(const struct options *opts, const char *ca_bundle,
                           struct shared_cache *shared, char *errbuf,
                           size_t errlen)
{
    struct awsconfig_options aws_opts = {
        .profile = opts->tier_profile,
        .credentials_file = opts->credentials_file,
        .region = opts->tier_region,
        .endpoint = opts->tier_endpoint,
        .allow_no_credentials = true,
    };
    char why[384];
    int err = awsconfig_resolve(&aws_opts, &shared->aws, why, sizeof(why));

    if (err == 0) {
        struct credsource_conf source_conf = {.aws = &shared->aws,
                                              .ca_bundle = ca_bundle};
        struct credentials_source source;
        err = credsource_choose(&source_conf, &source, why, sizeof(why));
        if (err == 0)
            err = credentials_create(&source, NULL, &shared->own_creds, why,
                                     sizeof(why));
    }
    if (err != 0)
        snprintf(errbuf, errlen, "shared cache: %s", why);
    return err;
}

int shared_cache_open(const struct options *opts,
                      const struct awsconfig *origin_aws,
                      struct credentials *origin_creds, const char *ca_bundle,
                      struct shared_cache **out, char *errbuf, size_t errlen)
{
    struct shared_cache *shared;
    int err = 0;

    *out = NULL;
    if (opts->tier_bucket == NULL)
        return 0;
    shared = calloc(1, sizeof(*shared));
    if (shared == NULL)
        return ENOMEM;
    if (asprintf(&shared->origin, "%s %s", endpoint_name(origin_aws->endpoint),
                 opts->bucket) < 0)
        shared->origin = NULL;
    shared->prefix = strdup(opts->tier_prefix);
    if (shared->origin == NULL || shared->prefix == NULL) {
        shared_cache_close(&shared);
        return ENOMEM;
    }
    struct credentials *creds = origin_creds;
    const char *endpoint = opts->tier_endpoint != NULL ? opts->tier_endpoint
                                                       : origin_aws->endpoint;
    const char *region = opts->tier_region != NULL ? opts->tier_region
                                                   : origin_aws->region;
    if (opts->tier_profile != NULL) {
        err = own_credentials(opts, ca_bundle, shared, errbuf, errlen);
        if (err != 0) {
            shared_cache_close(&shared);
            return err;
        }
        creds = shared->own_creds;
        if (opts->tier_endpoint == NULL && shared->aws.endpoint != NULL)
            endpoint = shared->aws.endpoint; /* the profile's endpoint_url */
        if (opts->tier_region == NULL)
            region = shared->aws.region;
    }
    struct s3_conf conf = {
        .endpoint = endpoint,
        .region = region,
        .bucket = opts->tier_bucket,
        .path_style = opts->path_style,
        .credentials = creds,
        .ca_bundle = ca_bundle,
        .max_connections = SHARED_CACHE_CONNECTIONS,
        .max_retries = 1,
        .request_timeout = SHARED_CACHE_TIMEOUT,
        .min_wire_rate = SHARED_CACHE_MIN_RATE,
    };
    char why[256] = "";
    err = s3_client_create(&conf, &shared->s3, why, sizeof(why));
    if (err != 0) {
        snprintf(errbuf, errlen, "shared cache: %s",
                 why[0] ? why : "cannot create its S3 client");
        shared_cache_close(&shared);
        return err;
    }
    struct s3_failure failure;
    err = s3_check_bucket(shared->s3, shared->prefix, &failure);
    if (err != 0 && failure.server_answered &&
        (err == ENOENT || err == EACCES)) {
        snprintf(errbuf, errlen, "shared cache: bucket '%s' at %s: %s",
                 opts->tier_bucket, endpoint_name(endpoint),
                 err == ENOENT ? "no such bucket" : failure.description);
        shared_cache_close(&shared);
        return err;
    }
    if (err != 0)
        fprintf(stderr, "s3cachefs: shared cache: bucket '%s' at %s cannot "
                "be reached now (%s); reads go to the origin until it "
                "answers\n", opts->tier_bucket, endpoint_name(endpoint),
                failure.description);
    *out = shared;
    return 0;
}

int shared_cache_start(struct shared_cache *shared, struct cache *cache)
{
    struct tier_conf conf = {
        .s3 = shared->s3,
        .cache = cache,
        .prefix = shared->prefix,
        .origin = shared->origin,
        .block_size = cache_block_size(cache),
    };
    return tier_create(&conf, &shared->tier);
}

struct tier *shared_cache_tier(struct shared_cache *shared)
{
    return shared != NULL ? shared->tier : NULL;
}

void shared_cache_close(struct shared_cache **sharedp)
{
    struct shared_cache *shared = *sharedp;

    if (shared == NULL)
        return;
    if (shared->tier != NULL &&
        !tier_flush(shared->tier, SHARED_CACHE_FLUSH_SECONDS))
        log_warn("shared cache: unmounting with blocks not written to it");
    tier_destroy(&shared->tier);
    s3_client_destroy(&shared->s3);
    credentials_destroy(&shared->own_creds);
    awsconfig_clear(&shared->aws);
    free(shared->origin);
    free(shared->prefix);
    free(shared);
    *sharedp = NULL;
}
