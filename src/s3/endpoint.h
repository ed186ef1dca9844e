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

/*
 * The name of the service ENDPOINT_URL (NULL: AWS's for REGION) points at,
 * whatever the bucket and addressing: "scheme://host[:port]", the host in
 * lower case and a default port left out ("https://s3.us-east-1.amazonaws.com",
 * "http://127.0.0.1:9000"), so that two spellings of one endpoint give one
 * name. A cache directory records it as part of whose it is (cache.h).
 * Returns 0 and a malloc'd *OUT, EINVAL with a sentence in ERRBUF (as
 * endpoint_resolve()), or ENOMEM.
 */
int endpoint_identity(const char *endpoint_url, const char *region, char **out,
                      char *errbuf, size_t errlen);

/* Free what *ep holds; safe twice. */
void endpoint_clear(struct endpoint *ep);

#endif /* S3CFS_ENDPOINT_H */
