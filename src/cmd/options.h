/*
 * options.h - the command line: `s3cachefs [-f] [-d] [-o OPT,...] BUCKET[:PREFIX]
 * MOUNTPOINT`, --help, --version.
 *
 * options_parse() turns argv into a struct options, validating every value
 * (sizes, modes, durations, the bucket name) so that a bad option fails
 * before anything is mounted, with one sentence naming it. Options that
 * belong to FUSE (allow_other, default_permissions, fsname, ...) and the
 * generic mount options that mount.fuse3 passes from /etc/fstab are kept in
 * fuse_args for fuse_session_new(). No secrets are accepted here:
 * credentials come from the environment or files (awsconfig.h).
 */
#ifndef S3CFS_OPTIONS_H
#define S3CFS_OPTIONS_H

#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct options {
    char *bucket;             /* bucket name */
    char *prefix;             /* "" or "a/b/": the key prefix mounted as root */
    char *mountpoint;         /* as given */

    bool foreground;          /* -f */
    bool debug;               /* -d: debug log, implies -f */
    bool show_help;           /* -h, --help */
    bool show_version;        /* -V, --version */

    /* S3 endpoint and credentials (awsconfig.h resolves the rest) */
    char *endpoint;
    char *region;
    char *profile;
    char *credentials_file;
    bool no_sign;
    bool path_style;

    /* what files look like: defaults for objects without s3fs headers */
    uid_t uid;
    gid_t gid;
    bool uid_set;             /* -o uid= given: overrides s3fs headers */
    bool gid_set;
    mode_t file_mode;         /* permission bits only */
    mode_t dir_mode;
    bool read_only;           /* -o ro */
    bool writeback;           /* -o writeback: close() does not wait */
    bool allow_other;

    /* the block cache */
    char *cache_dir;          /* -o cache=DIR (NULL: not given, see
                                 options_default_cache_dir()) */
    uint64_t cache_size;      /* bytes; 0: 80% of the cache filesystem */
    uint64_t cache_min_free;  /* bytes to keep free on it ... */
    double cache_min_free_ratio; /* ... or this fraction of it */
    uint32_t block_size;

    /* metadata and data fetching */
    double attr_ttl;          /* seconds attributes are trusted */
    double dir_ttl;           /* seconds a directory listing is trusted */
    uint64_t read_ahead;      /* largest read-ahead window per open file */
    uint64_t listing_memory;  /* what directory listings may take in memory */
    unsigned connections;     /* parallel requests to the bucket */
    unsigned retries;         /* retries of a failed idempotent request */
    double request_timeout;   /* seconds: the base deadline of a request */

    /* operating it */
    char *metrics;            /* -o metrics=[ADDR:]PORT; NULL: no endpoint */
    char *access_log;         /* -o access_log=FILE; NULL: none */
    char **trusted;           /* -o trust=: prefixes under the mount root
                                 ("a/b/"; "" the whole mount) */
    size_t trusted_count;
    char **headerless;        /* -o no_headers=: the same, for objects
                                 whose attributes come from listings */
    size_t headerless_count;

    /* -o shared_cache=BUCKET[:PREFIX] (tier.h); NULL bucket: none */
    char *tier_bucket;
    char *tier_prefix;        /* "" or "a/b/" */
    char *tier_endpoint;      /* -o shared_cache_endpoint; NULL: the
                                 origin's */
    char *tier_region;        /* -o shared_cache_region; NULL: the
                                 profile's, then the origin's */
    char *tier_profile;       /* -o shared_cache_profile; NULL: the
                                 origin's credentials */

    struct fuse_args fuse_args; /* what goes on to libfuse (argv[0] first) */
};

/*
 * Parse ARGC/ARGV into *OUT (defaults first). Returns 0 on success; on a
 * bad command line returns EINVAL and writes one sentence into ERRBUF
 * (ERRLEN bytes). With --help or --version the positional arguments are
 * not required. Free with options_free() in every case.
 */
int options_parse(int argc, char **argv, struct options *out, char *errbuf,
                  size_t errlen);

/* Free what options_parse() allocated; safe twice. */
void options_free(struct options *opts);

/*
 * The default cache directory of BUCKET at ENDPOINT (endpoint_identity(),
 * "scheme://host[:port]") into *OUT: BASE/BUCKET@HOST[:PORT] for https,
 * BASE/BUCKET@http:HOST[:PORT] for http, one per endpoint and bucket, BASE being /var/cache/s3cachefs for root, else
 * $XDG_CACHE_HOME/s3cachefs or ~/.cache/s3cachefs. *LEGACY: the one
 * versions that did not record a cache's endpoint used, BASE/BUCKET
 * (cache_dir_is_for() says whether it may be used). Both malloc'd.
 * Returns 0, ENOENT (neither root nor an absolute HOME or
 * XDG_CACHE_HOME), ENOMEM.
 */
int options_default_cache_dir(const char *bucket, const char *endpoint,
                              char **out, char **legacy);

/* Print the option summary for --help to FP. */
void options_print_help(FILE *fp, const char *progname);

/* "4096", "64K", "8M", "1.5G", "2T" (binary multiples) -> bytes. 0 or EINVAL. */
int options_parse_size(const char *text, uint64_t *out);

/* Octal permission bits "0644" / "755" (no file type bits). 0 or EINVAL. */
int options_parse_mode(const char *text, mode_t *out);

/* Seconds, decimal ("1", "0.5", "0"); no negatives. 0 or EINVAL. */
int options_parse_seconds(const char *text, double *out);

#endif /* S3CFS_OPTIONS_H */
