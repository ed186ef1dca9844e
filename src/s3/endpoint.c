/*
 * endpoint.c - base URL, Host header and path prefix for a bucket (see
 * endpoint.h).
 */
#include "config.h"

#include "s3/endpoint.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* asprintf() that leaves NULL behind when it fails. */
__attribute__((format(printf, 2, 3)))
static bool format(char **out, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    int n = vasprintf(out, fmt, ap);
    va_end(ap);
    if (n < 0)
        *out = NULL;
    return n >= 0;
}

void endpoint_clear(struct endpoint *ep)
{
    free(ep->url_base);
    free(ep->host_header);
    free(ep->path_base);
    memset(ep, 0, sizeof(*ep));
}

int endpoint_resolve(const char *endpoint_url, const char *region,
                     const char *bucket, bool path_style, struct endpoint *out,
                     char *errbuf, size_t errlen)
{
    CURLU *url = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
    char *aws_url = NULL;
    int err = 0;

    memset(out, 0, sizeof(*out));
    if (url == NULL)
        return ENOMEM;
    if (endpoint_url == NULL) {
        if (!format(&aws_url, "https://s3.%s.amazonaws.com", region)) {
            err = ENOMEM;
            goto out;
        }
        endpoint_url = aws_url;
    } else {
        path_style = true;
    }
    if (strchr(bucket, '.') != NULL)
        path_style = true;
    if (curl_url_set(url, CURLUPART_URL, endpoint_url, 0) != CURLUE_OK ||
        curl_url_get(url, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(url, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
        snprintf(errbuf, errlen, "invalid endpoint URL '%s': expected "
                 "http://HOST[:PORT] or https://HOST[:PORT]", endpoint_url);
        err = EINVAL;
        goto out;
    }
    if (curl_url_get(url, CURLUPART_PATH, &path, 0) == CURLUE_OK &&
        path[0] != '\0' && strcmp(path, "/") != 0) {
        snprintf(errbuf, errlen, "invalid endpoint URL '%s': it must not have "
                 "a path", endpoint_url);
        err = EINVAL;
        goto out;
    }
    /* curl leaves a default port out of the Host header; so must we, since
     * the Host header is signed */
    if (curl_url_get(url, CURLUPART_PORT, &port, CURLU_NO_DEFAULT_PORT) != CURLUE_OK)
        port = NULL;
    if (!format(&out->host_header, "%s%s%s%s%s", path_style ? "" : bucket,
                path_style ? "" : ".", host, port ? ":" : "", port ? port : "") ||
        !format(&out->url_base, "%s://%s", scheme, out->host_header) ||
        !format(&out->path_base, "%s%s", path_style ? "/" : "",
                path_style ? bucket : ""))
        err = ENOMEM;
out:
    if (err != 0)
        endpoint_clear(out);
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(url);
    free(aws_url);
    return err;
}

int endpoint_identity(const char *endpoint_url, const char *region, char **out,
                      char *errbuf, size_t errlen)
{
    struct endpoint ep;
    /* path style: the host names the service, not a bucket in it */
    int err = endpoint_resolve(endpoint_url, region, "bucket", true, &ep,
                               errbuf, errlen);

    *out = NULL;
    if (err != 0)
        return err;
    char *host = strstr(ep.url_base, "://");
    for (char *p = host != NULL ? host + 3 : ep.url_base; *p != '\0'; p++)
        *p = (char)tolower((unsigned char)*p);
    *out = ep.url_base;
    ep.url_base = NULL;
    endpoint_clear(&ep);
    return 0;
}
