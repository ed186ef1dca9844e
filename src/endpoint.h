/*
 * endpoint.h - where requests for a bucket go: base URL, Host header and
 * path prefix, from the endpoint URL (or AWS's, by region) and the
 * addressing style. Pure (uses only libcurl's URL parser); unit-tested.
 *
 * Path style ("https://host/bucket/key") is used for custom endpoints, with
 * path_style, and for bucket names with dots (they break the wildcard TLS
 * certificate of virtual-hosted style); AWS otherwise gets virtual-hosted
 * style ("https://bucket.s3.REGION.amazonaws.com/key").
 */
#ifndef S3CFS_ENDPOINT_H
#define S3CFS_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>

struct endpoint {
    char *url_base;     /* "https://bucket.s3.us-east-1.amazonaws.com" */
    char *host_header;  /* what the Host header carries (and SigV4 signs):
                           host, plus ":port" unless the scheme's default */
    char *path_base;    /* "/bucket" (path style) or "" */
};

/*
 * Resolve ENDPOINT_URL (NULL: AWS for REGION) for BUCKET. Returns 0 and
 * fills *out (free with endpoint_clear()), EINVAL with a sentence in ERRBUF
 * (not http/https, a path after the host, unparsable), or ENOMEM.
 */
int endpoint_resolve(const char *endpoint_url, const char *region,
                     const char *bucket, bool path_style, struct endpoint *out,
                     char *errbuf, size_t errlen);

/* Free what *ep holds; safe twice. */
void endpoint_clear(struct endpoint *ep);

#endif /* S3CFS_ENDPOINT_H */
