/*
 * tier_setup.c - the shared cache tier's client from the mount options
 * (see tier_setup.h).
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

struct tier_setup {
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
                           struct tier_setup *shared, char *errbuf,
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

int tier_setup_open(const struct options *opts,
                    const struct awsconfig *origin_aws,
                    struct credentials *origin_creds, const char *ca_bundle,
                    struct tier_setup **out, char *errbuf, size_t errlen)
{
    struct tier_setup *shared;
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
        tier_setup_close(&shared);
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
            tier_setup_close(&shared);
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
        .max_connections = TIER_SETUP_CONNECTIONS,
        .max_retries = 1,
        .request_timeout = TIER_SETUP_TIMEOUT,
        .min_wire_rate = TIER_SETUP_MIN_RATE,
    };
    char why[256] = "";
    err = s3_client_create(&conf, &shared->s3, why, sizeof(why));
    if (err != 0) {
        snprintf(errbuf, errlen, "shared cache: %s",
                 why[0] ? why : "cannot create its S3 client");
        tier_setup_close(&shared);
        return err;
    }
    struct s3_failure failure;
    err = s3_check_bucket(shared->s3, shared->prefix, &failure);
    if (err != 0 && failure.server_answered &&
        (err == ENOENT || err == EACCES)) {
        snprintf(errbuf, errlen, "shared cache: bucket '%s' at %s: %s",
                 opts->tier_bucket, endpoint_name(endpoint),
                 err == ENOENT ? "no such bucket" : failure.description);
        tier_setup_close(&shared);
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

int tier_setup_start(struct tier_setup *shared, struct cache *cache)
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

struct tier *tier_setup_tier(struct tier_setup *shared)
{
    return shared != NULL ? shared->tier : NULL;
}

void tier_setup_close(struct tier_setup **sharedp)
{
    struct tier_setup *shared = *sharedp;

    if (shared == NULL)
        return;
    if (shared->tier != NULL &&
        !tier_flush(shared->tier, TIER_SETUP_FLUSH_SECONDS))
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
