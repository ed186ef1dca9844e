/*
 * awsconfig.h - resolve credentials, region and endpoint the way the AWS
 * tools do (environment, ~/.aws/credentials, ~/.aws/config, mount options).
 *
 * main() calls awsconfig_resolve() once, before the mount; the result is
 * handed to the S3 client. Nothing here performs network I/O. Secrets are
 * held only in the returned struct, never written to logs or error
 * messages: error messages name files, profiles and variables, not values.
 *
 * Precedence (first hit wins):
 *   credentials: -o no_sign (none) > -o credentials_file=PATH (INI file as
 *       ~/.aws/credentials, refused unless its mode grants nothing to group
 *       or others) > -o profile=NAME > AWS_ACCESS_KEY_ID +
 *       AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) > profile AWS_PROFILE or
 *       "default" from AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials,
 *       then from AWS_CONFIG_FILE or ~/.aws/config; with
 *       allow_no_credentials, a profile without keys yields its
 *       credential_process, or nothing (credsource.h: container, then
 *       instance metadata).
 *   region:   -o region > AWS_REGION > AWS_DEFAULT_REGION > profile's
 *       region in the config file > "us-east-1".
 *   endpoint: -o endpoint > AWS_ENDPOINT_URL_S3 > AWS_ENDPOINT_URL >
 *       profile's endpoint_url > none (the client derives AWS's endpoint).
 * In ~/.aws/config, profiles are "[profile NAME]" (and "[default]"); in the
 * credentials file, "[NAME]". Keys are case-insensitive, '#' and ';' start
 * comments, values are trimmed.
 */
#ifndef S3CFS_AWSCONFIG_H
#define S3CFS_AWSCONFIG_H

#include <stdbool.h>
#include <stddef.h>

/* What the user asked for on the command line (any field may be NULL). */
struct awsconfig_options {
    const char *profile;           /* -o profile=NAME */
    const char *credentials_file;  /* -o credentials_file=PATH */
    const char *region;            /* -o region= */
    const char *endpoint;          /* -o endpoint= */
    bool no_sign;                  /* -o no_sign */
    bool allow_no_credentials;     /* a profile without keys is no error:
                                      credsource.h looks further */
    const char *home;              /* home directory; NULL: $HOME */
};

/* The outcome. All strings malloc'd, owned by the struct; NULL if unset.
 * Free with awsconfig_clear(), which also wipes the secrets. */
struct awsconfig {
    char *access_key;
    char *secret_key;
    char *session_token;
    char *region;              /* never NULL after success */
    char *endpoint;            /* NULL: use AWS's endpoint for the region */
    char *profile;             /* the profile used, if any */
    char *credentials_source;  /* human-readable origin, e.g. "environment",
                                  "profile default in /root/.aws/credentials";
                                  for messages; NULL when no keys */
    char *credential_process;  /* the profile's, when it has no keys (only
                                  with allow_no_credentials) */
    char *ec2_metadata_endpoint; /* the profile's
                                    ec2_metadata_service_endpoint */
};

/*
 * Resolve everything. Returns 0 on success. On failure returns an errno
 * value and writes one sentence naming the problem into ERRBUF (ERRLEN
 * bytes), e.g. "credentials file /x is readable by group or others (mode
 * 0644); chmod 600 it", "profile 'prod' not found in /root/.aws/credentials
 * or /root/.aws/config", "no credentials: set AWS_ACCESS_KEY_ID and
 * AWS_SECRET_ACCESS_KEY, use -o profile=NAME or -o no_sign".
 *   EACCES  credentials file with a loose mode, or unreadable
 *   ENOENT  named file or profile missing; no credentials found at all
 *   EINVAL  a profile with an access key and no secret key, or the reverse;
 *           a syntax error in a file (with its line number)
 *   ENOMEM
 */
int awsconfig_resolve(const struct awsconfig_options *opts,
                      struct awsconfig *out, char *errbuf, size_t errlen);

/* Wipe secrets (explicit_bzero / OPENSSL_cleanse), free, zero. Safe twice. */
void awsconfig_clear(struct awsconfig *cfg);

#endif /* S3CFS_AWSCONFIG_H */
