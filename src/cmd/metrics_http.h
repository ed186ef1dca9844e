/*
 * metrics_http.h - the HTTP endpoint of -o metrics=[ADDR:]PORT: GET
 * /metrics answers the text of metrics_text.h, for Prometheus to scrape.
 *
 * libmicrohttpd serves it on one thread of its own, with a bounded
 * number of connections and an idle timeout, so that a slow or hostile
 * client cannot hold the daemon. Nothing but GET and HEAD of /metrics
 * (and a pointer to it at /) is answered.
 *
 * Two steps, because the daemon forks: metrics_http_listen() binds the
 * socket before fuse_daemonize() (an address in use fails the mount with
 * a sentence on stderr), metrics_http_start() starts the thread after it.
 *
 * Off unless asked for. Without an address the endpoint is on 127.0.0.1:
 * the counters name no secret and no key, but how much a node reads and
 * writes is the operator's to publish, so another address must be named.
 */
#ifndef S3CFS_METRICS_HTTP_H
#define S3CFS_METRICS_HTTP_H

#include <stddef.h>
#include <sys/socket.h>

/* The page's text into *TEXT (malloc'd) and *LEN: 0 or an errno. */
typedef int (*metrics_render_fn)(void *arg, char **text, size_t *len);

struct metrics_http;

/*
 * Parse SPEC: "PORT" (on 127.0.0.1), "ADDR:PORT" with a numeric IPv4
 * address or "localhost", or "[ADDR]:PORT" with a numeric IPv6 address;
 * PORT 1-65535. 0, or EINVAL with a sentence in ERR.
 */
int metrics_http_parse_address(const char *spec, struct sockaddr_storage *addr,
                               socklen_t *addr_len, char *err, size_t errlen);

/* Bind and listen on SPEC. 0, or an errno with a sentence in ERR (EINVAL
 * for a bad SPEC, EADDRINUSE, EACCES...). */
int metrics_http_listen(const char *spec, struct metrics_http **out,
                        char *err, size_t errlen);

/* Serve on the thread of the HTTP library, RENDER(ARG) for each GET of
 * /metrics. 0, or an errno with a sentence in ERR. */
int metrics_http_start(struct metrics_http *http, metrics_render_fn render,
                       void *arg, char *err, size_t errlen);

/* "127.0.0.1:9101": the address listened on, for messages. */
const char *metrics_http_address(const struct metrics_http *http);

/* Stop serving (waits for the thread), close the socket, free; *HTTP =
 * NULL. Safe on NULL. */
void metrics_http_stop(struct metrics_http **http);

#endif /* S3CFS_METRICS_HTTP_H */
