/*
 * credsource.h - where the keys come from: the sources a struct
 * credentials (credentials.h) asks, chosen as the AWS CLI chooses them.
 *
 * Precedence (first hit wins; -o no_sign needs no source at all):
 *   1. static keys, as awsconfig.h resolves them: -o credentials_file,
 *      AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), the
 *      profile's aws_access_key_id/aws_secret_access_key. Never refreshed.
 *   2. the profile's credential_process: the command, split as the AWS CLI
 *      splits it (POSIX shell words and quotes; no shell runs), prints
 *      {"Version": 1, "AccessKeyId", "SecretAccessKey", "SessionToken"?,
 *      "Expiration"?} on its standard output. Run again before Expiration;
 *      no Expiration: the keys never expire.
 *   3. container credentials: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (from
 *      http://169.254.170.2) or AWS_CONTAINER_CREDENTIALS_FULL_URI (https,
 *      or http to a loopback address or the ECS/EKS agent's), with
 *      "Authorization:" the content of AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE
 *      (read again for each fetch) or AWS_CONTAINER_AUTHORIZATION_TOKEN.
 *   4. EC2 instance metadata, IMDSv2 only: PUT /latest/api/token, then
 *      GET /latest/meta-data/iam/security-credentials/ (the role) and
 *      .../ROLE with X-aws-ec2-metadata-token. Endpoint:
 *      AWS_EC2_METADATA_SERVICE_ENDPOINT > the profile's
 *      ec2_metadata_service_endpoint > http://[fd00:ec2::254] when
 *      AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6 > http://169.254.169.254.
 *      AWS_METADATA_SERVICE_TIMEOUT (s, default 1) and
 *      AWS_METADATA_SERVICE_NUM_ATTEMPTS (default 1) as in the AWS CLI.
 *      Off with AWS_EC2_METADATA_DISABLED=true.
 *
 * The metadata endpoints are asked with libcurl here, not through the S3
 * client: they are not S3 (no signing, no pool, no S3 errors), and are
 * asked a few times an hour. No proxy is used for them, redirects are not
 * followed, answers are capped at CREDENTIALS_JSON_MAX.
 *
 * Secrets: messages name the source (profile, URL, role), the command's
 * first word, a status or a reason, never a key or a token; the command's
 * standard error is quoted (its first line, 200 bytes at most), its
 * standard output never.
 */
#ifndef S3CFS_CREDSOURCE_H
#define S3CFS_CREDSOURCE_H

#include <stddef.h>

#include "creds/awsconfig.h"
#include "creds/credentials.h"

/* What the choice depends on besides the environment. */
struct credsource_conf {
    const struct awsconfig *aws;  /* awsconfig_resolve()'d with
                                     allow_no_credentials */
    const char *ca_bundle;        /* for an https container URI; NULL:
                                     the system's */
};

/*
 * Choose the source (see the top) and fill OUT for credentials_create().
 * Does no I/O. Returns 0, ENOENT when there is none (a sentence in ERRBUF
 * saying what was looked at), EINVAL (a credential_process that cannot be
 * split, a container URI refused, with a sentence), or ENOMEM.
 */
int credsource_choose(const struct credsource_conf *conf,
                      struct credentials_source *out, char *errbuf,
                      size_t errlen);

/*
 * Split COMMAND into words as Python's shlex.split() does (what the AWS
 * CLI does with credential_process): blanks separate words; '...' is
 * literal; in "..." a backslash escapes only '"' and '\'; outside quotes
 * it escapes any character. *ARGVP: a NULL-terminated malloc'd array of
 * malloc'd words (free with credsource_argv_free()). Returns 0, EINVAL
 * (an open quote or a trailing backslash; no word at all) or ENOMEM.
 */
int credsource_split(const char *command, char ***argvp);

/* Free what credsource_split() made; *argvp = NULL; safe twice. */
void credsource_argv_free(char ***argvp);

#endif /* S3CFS_CREDSOURCE_H */
