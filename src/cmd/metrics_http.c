/*
 * metrics_http.c - the endpoint of -o metrics (see metrics_http.h), on
 * libmicrohttpd: a socket bound before the daemon forks, handed to the
 * library's own polling thread afterwards.
 */
#include "config.h"

#include "cmd/metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/log.h"

/* At most this many scrapers at once, each idle for at most this long:
 * Prometheus needs one. */
#define CONNECTION_LIMIT 8
#define CONNECTION_TIMEOUT_SECONDS 10

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics_http {
    int fd;                     /* until the library owns it */
    int family;
    char address[INET6_ADDRSTRLEN + 8];
    struct MHD_Daemon *daemon;
    metrics_render_fn render;
    void *arg;
};

/* PORT into *OUT: 0 or EINVAL. */
static int parse_port(const char *text, uint16_t *out)
{
    char *end;

    if (text[0] < '0' || text[0] > '9')
        return EINVAL;
    errno = 0;
    unsigned long port = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || port < 1 || port > 65535)
        return EINVAL;
    *out = (uint16_t)port;
    return 0;
}

int metrics_http_parse_address(const char *spec, struct sockaddr_storage *addr,
                               socklen_t *addr_len, char *err, size_t errlen)
{
    char host[INET6_ADDRSTRLEN + 1] = "127.0.0.1";
    const char *port_text = spec;
    bool bracketed = spec[0] == '[';
    uint16_t port;

    memset(addr, 0, sizeof(*addr));
    if (bracketed) {
        const char *close = strchr(spec, ']');
        if (close == NULL || close[1] != ':' ||
            (size_t)(close - spec - 1) >= sizeof(host)) {
            snprintf(err, errlen, "metrics=%s: an IPv6 address is written "
                     "[ADDR]:PORT", spec);
            return EINVAL;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = '\0';
        port_text = close + 2;
    } else if (strchr(spec, ':') != NULL) {
        const char *colon = strrchr(spec, ':');
        if ((size_t)(colon - spec) >= sizeof(host) ||
            memchr(spec, ':', (size_t)(colon - spec)) != NULL) {
            snprintf(err, errlen, "metrics=%s: not ADDR:PORT (an IPv6 "
                     "address is written [ADDR]:PORT)", spec);
            return EINVAL;
        }
        memcpy(host, spec, (size_t)(colon - spec));
        host[colon - spec] = '\0';
        port_text = colon + 1;
        if (strcmp(host, "localhost") == 0)
            strcpy(host, "127.0.0.1");
    }
    if (parse_port(port_text, &port) != 0) {
        snprintf(err, errlen, "metrics=%s: the port must be a number from 1 "
                 "to 65535", spec);
        return EINVAL;
    }
    struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)addr;
    if (!bracketed && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        *addr_len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        *addr_len = sizeof(*v6);
    } else {
        snprintf(err, errlen, "metrics=%s: '%s' is not a numeric %s",
                 spec, host, bracketed ? "IPv6 address"
                                       : "IPv4 address (nor localhost)");
        return EINVAL;
    }
    return 0;
}

int metrics_http_listen(const char *spec, struct metrics_http **out,
                        char *err, size_t errlen)
{
    struct sockaddr_storage addr;
    socklen_t addr_len;
    struct metrics_http *http;
    int one = 1;

    *out = NULL;
    int rc = metrics_http_parse_address(spec, &addr, &addr_len, err, errlen);
    if (rc != 0)
        return rc;
    if ((http = calloc(1, sizeof(*http))) == NULL) {
        snprintf(err, errlen, "metrics=%s: out of memory", spec);
        return ENOMEM;
    }
    http->family = addr.ss_family;
    char host[INET6_ADDRSTRLEN];
    uint16_t port;
    if (addr.ss_family == AF_INET) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
        port = ntohs(v4->sin_port);
        snprintf(http->address, sizeof(http->address), "%s:%u", host, port);
    } else {
        struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
        port = ntohs(v6->sin6_port);
        snprintf(http->address, sizeof(http->address), "[%s]:%u", host, port);
    }
    http->fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (http->fd < 0) {
        rc = errno;
        snprintf(err, errlen, "metrics on %s: cannot create a socket: %s",
                 http->address, strerror(rc));
        free(http);
        return rc;
    }
    setsockopt(http->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* (IPv6: the system's default, dual-stack on Linux: [::] takes IPv4
     * scrapers too) */
    if (bind(http->fd, (struct sockaddr *)&addr, addr_len) != 0 ||
        listen(http->fd, 16) != 0) {
        rc = errno;
        snprintf(err, errlen, "metrics on %s: %s%s", http->address,
                 strerror(rc), rc == EADDRINUSE
                                   ? " (another program serves that port: "
                                     "choose another with -o metrics=)"
                                   : "");
        close(http->fd);
        free(http);
        return rc;
    }
    *out = http;
    return 0;
}

/* Queue STATUS with BODY (copied) and the content type TYPE. */
static enum MHD_Result answer(struct MHD_Connection *connection,
                              unsigned status, const char *body,
                              const char *type, const char *allow)
{
    struct MHD_Response *response = MHD_create_response_from_buffer(
        strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);

    if (response == NULL)
        return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (allow != NULL)
        MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result queued = MHD_queue_response(connection, status, response);
    MHD_destroy_response(response);
    return queued;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *connection,
                              const char *url, const char *method,
                              const char *version, const char *upload_data,
                              size_t *upload_data_size, void **state)
{
    struct metrics_http *http = cls;
    static int first_call;

    (void)version;
    (void)upload_data;
    /* the first call sees the headers only: a body, if any, follows */
    if (*state == NULL) {
        *state = &first_call;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* (a body is never wanted: dropped) */
        return MHD_YES;
    }
    bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!head && strcmp(method, MHD_HTTP_METHOD_GET) != 0)
        return answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED,
                      "only GET and HEAD are answered here\n",
                      "text/plain; charset=utf-8", "GET, HEAD");
    if (strcmp(url, "/") == 0)
        return answer(connection, MHD_HTTP_OK,
                      "s3cachefs: the counters are at /metrics\n",
                      "text/plain; charset=utf-8", NULL);
    if (strcmp(url, "/metrics") != 0)
        return answer(connection, MHD_HTTP_NOT_FOUND,
                      "not found: the counters are at /metrics\n",
                      "text/plain; charset=utf-8", NULL);

    char *text = NULL;
    size_t len = 0;
    int rc = http->render(http->arg, &text, &len);
    if (rc != 0) {
        log_warn("metrics: cannot render the counters: %s", strerror(rc));
        return answer(connection, MHD_HTTP_INTERNAL_SERVER_ERROR,
                      "cannot render the counters\n",
                      "text/plain; charset=utf-8", NULL);
    }
    struct MHD_Response *response =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (response == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                            CONTENT_TYPE);
    enum MHD_Result queued = MHD_queue_response(connection, MHD_HTTP_OK,
                                                response);
    MHD_destroy_response(response);
    return queued;
}

int metrics_http_start(struct metrics_http *http, metrics_render_fn render,
                       void *arg, char *err, size_t errlen)
{
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD;

    if (http->family == AF_INET6)
        flags |= MHD_USE_IPv6;
    http->render = render;
    http->arg = arg;
    /* The library gets a copy: it closes the socket it is given when it
     * stops, and on some of its failures but not all, so that our own
     * descriptor is never closed twice (nor one reused meanwhile). */
    int copy = fcntl(http->fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        int rc = errno;
        snprintf(err, errlen, "metrics on %s: %s", http->address, strerror(rc));
        return rc;
    }
    http->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, http,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)copy,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONNECTION_LIMIT,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONNECTION_TIMEOUT_SECONDS,
        MHD_OPTION_END);
    if (http->daemon == NULL) {
        /* the copy may be open or closed (and its number reused): stop
         * listening through ours, which both share, and leave the copy */
        shutdown(http->fd, SHUT_RDWR);
        snprintf(err, errlen, "metrics on %s: cannot start the HTTP server",
                 http->address);
        return EIO;
    }
    close(http->fd); /* the library serves on its copy, and closes it */
    http->fd = -1;
    log_info("metrics: serving http://%s/metrics", http->address);
    return 0;
}

const char *metrics_http_address(const struct metrics_http *http)
{
    return http->address;
}

void metrics_http_stop(struct metrics_http **httpp)
{
    struct metrics_http *http = *httpp;

    if (http == NULL)
        return;
    if (http->daemon != NULL)
        MHD_stop_daemon(http->daemon);
    if (http->fd >= 0)
        close(http->fd);
    free(http);
    *httpp = NULL;
}
