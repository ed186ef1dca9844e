/*
 * test_awsconfig.c - unit tests for awsconfig.c.
 *
 * Every test runs with a fresh temporary HOME (mkdtemp) holding generated
 * ~/.aws files, and with every AWS_* variable the module reads cleared.
 * Most cases are rows of one table: files, environment, options in;
 * return code, resolved fields or error-message fragments out. "$H" in any
 * string of a row stands for the temporary home directory. Every error
 * message is checked to contain none of the secret values used anywhere.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* nftw */
#endif

#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "creds/awsconfig.h"

/* Key material used in the fixtures; none may ever show in an errbuf. */
#define AK_DEF "AKIADEFAULT000000001"
#define SK_DEF "skDefault/Secret+0000000000000000000001"
#define AK_DEV "AKIADEV0000000000002"
#define SK_DEV "skDev/Secret+00000000000000000000000002"
#define TK_DEV "tokDevSessionToken0000000000000000002"
#define AK_ENV "AKIAENV0000000000003"
#define SK_ENV "skEnv/Secret+00000000000000000000000003"
#define TK_ENV "tokEnvSessionToken0000000000000000003"
#define AK_CFG "AKIACFG0000000000004"
#define SK_CFG "skCfg/Secret+00000000000000000000000004"
#define AK_FIL "AKIAFILE000000000005"
#define SK_FIL "skFile/Secret+0000000000000000000000005"
#define SK_BAD "skBad/Secret+00000000000000000000000006"

static const char *const all_secrets[] = {
    AK_DEF, SK_DEF, AK_DEV, SK_DEV, TK_DEV, AK_ENV, SK_ENV, TK_ENV,
    AK_CFG, SK_CFG, AK_FIL, SK_FIL, SK_BAD,
};

static const char *const aws_vars[] = {
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
    "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
};

/* ------------------------------------------------------------ fixtures */

#define CRED_BASIC                                                         \
    "[default]\n"                                                          \
    "aws_access_key_id = " AK_DEF "\n"                                     \
    "aws_secret_access_key = " SK_DEF "\n"                                 \
    "\n"                                                                   \
    "[dev]\n"                                                              \
    "aws_access_key_id = " AK_DEV "\n"                                     \
    "aws_secret_access_key = " SK_DEV "\n"                                 \
    "aws_session_token = " TK_DEV "\n"

#define CONFIG_BASIC                                                       \
    "[default]\n"                                                          \
    "region = eu-west-1\n"                                                 \
    "\n"                                                                   \
    "[profile dev]\n"                                                      \
    "region = ap-south-1\n"                                                \
    "endpoint_url = http://dev.example:9000\n"

#define ENV_KEYS "AWS_ACCESS_KEY_ID=" AK_ENV, "AWS_SECRET_ACCESS_KEY=" SK_ENV

#define CREDS ".aws/credentials"
#define CONFIG ".aws/config"
#define SRC_ENV "environment (AWS_ACCESS_KEY_ID)"

struct file_spec {
    const char *path;   /* relative to the temporary home */
    const char *text;   /* NULL: create a directory */
    mode_t mode;        /* 0: 0600 (0700 for a directory) */
};

struct rcase {
    const char *name;
    struct file_spec files[3];
    const char *env[6];          /* "NAME=value" */
    const char *o_profile, *o_credentials_file, *o_region, *o_endpoint;
    bool no_sign;
    bool allow_none;             /* allow_no_credentials */
    int rc;
    /* rc == 0: expected fields (NULL: must be NULL) */
    const char *ak, *sk, *tok, *region, *endpoint, *profile, *source;
    const char *process, *ec2_endpoint;
    /* rc != 0: fragments the message must contain */
    const char *err[3];
};

struct fx {
    char home[64];
    char errbuf[512];
    struct awsconfig cfg;
    const struct rcase *tc;
};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof aws_vars / sizeof *aws_vars; i++)
        unsetenv(aws_vars[i]);
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    char aws[128];

    if (fx == NULL)
        return -1;
    fx->tc = *state;
    strcpy(fx->home, "/tmp/test_awsconfig.XXXXXX");
    if (mkdtemp(fx->home) == NULL) {
        free(fx);
        return -1;
    }
    snprintf(aws, sizeof aws, "%s/.aws", fx->home);
    if (mkdir(aws, 0700) != 0) {
        rmdir(fx->home);
        free(fx);
        return -1;
    }
    clear_env();
    setenv("HOME", fx->home, 1);
    *state = fx;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;

    awsconfig_clear(&fx->cfg);
    nftw(fx->home, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    clear_env();
    free(fx);
    return 0;
}

/* Copy IN to OUT replacing each "$H" with HOME. */
static const char *expand(const char *home, const char *in, char *out,
                          size_t outlen)
{
    size_t o = 0;

    if (in == NULL)
        return NULL;
    for (const char *p = in; *p != '\0'; p++) {
        if (p[0] == '$' && p[1] == 'H') {
            size_t n = strlen(home);

            assert_true(o + n < outlen);
            memcpy(out + o, home, n);
            o += n;
            p++;
        } else {
            assert_true(o + 1 < outlen);
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return out;
}

static void write_file(const char *home, const char *rel, const char *text,
                       mode_t mode)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", home, rel);
    if (text == NULL) {
        assert_int_equal(mkdir(path, mode != 0 ? mode : 0700), 0);
        return;
    }
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode != 0 ? mode : 0600), 0);
}

static void assert_no_secret(const char *msg)
{
    for (size_t i = 0; i < sizeof all_secrets / sizeof *all_secrets; i++) {
        if (strstr(msg, all_secrets[i]) != NULL)
            fail_msg("secret %zu leaked into message: %s", i, msg);
    }
}

static void assert_str(const char *what, const char *got, const char *want)
{
    if (want == NULL && got == NULL)
        return;
    if (want == NULL || got == NULL || strcmp(got, want) != 0)
        fail_msg("%s: got '%s', want '%s'", what, got ? got : "(null)",
                 want ? want : "(null)");
}

static void assert_empty(const struct awsconfig *c)
{
    assert_null(c->access_key);
    assert_null(c->secret_key);
    assert_null(c->session_token);
    assert_null(c->region);
    assert_null(c->endpoint);
    assert_null(c->profile);
    assert_null(c->credentials_source);
}

/* Check an error outcome: code, one line, fragments, no secrets. */
static void check_error(const struct fx *fx, int rc, int want_rc,
                        const char *const frags[], size_t nfrags)
{
    char buf[512];

    if (rc != want_rc)
        fail_msg("rc %d (%s), want %d; errbuf: %s", rc, strerror(rc),
                 want_rc, fx->errbuf);
    assert_empty(&fx->cfg);
    assert_true(fx->errbuf[0] != '\0');
    assert_null(strchr(fx->errbuf, '\n'));
    for (size_t i = 0; i < nfrags && frags[i] != NULL; i++) {
        expand(fx->home, frags[i], buf, sizeof buf);
        if (strstr(fx->errbuf, buf) == NULL)
            fail_msg("errbuf '%s' lacks '%s'", fx->errbuf, buf);
    }
    assert_no_secret(fx->errbuf);
}

/* --------------------------------------------------------------- table */

static const struct rcase cases[] = {
    /* ---- environment credentials */
    { .name = "env_keys_without_token",
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "us-east-1",
      .source = SRC_ENV },
    { .name = "env_keys_with_token",
      .env = { ENV_KEYS, "AWS_SESSION_TOKEN=" TK_ENV },
      .ak = AK_ENV, .sk = SK_ENV, .tok = TK_ENV, .region = "us-east-1",
      .source = SRC_ENV },
    { .name = "env_beats_default_profile",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "eu-west-1",
      .profile = "default", .source = SRC_ENV },
    { .name = "env_beats_aws_profile_which_still_gives_region",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS, "AWS_PROFILE=dev" },
      .ak = AK_ENV, .sk = SK_ENV, .region = "ap-south-1",
      .endpoint = "http://dev.example:9000", .profile = "dev",
      .source = SRC_ENV },
    { .name = "empty_env_vars_are_unset",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .env = { "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=",
               "AWS_PROFILE=", "AWS_REGION=" },
      .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },

    /* ---- profiles */
    { .name = "option_profile_beats_env",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS, "AWS_SESSION_TOKEN=" TK_ENV },
      .o_profile = "dev",
      .ak = AK_DEV, .sk = SK_DEV, .tok = TK_DEV, .region = "ap-south-1",
      .endpoint = "http://dev.example:9000", .profile = "dev",
      .source = "profile 'dev' in $H/.aws/credentials" },
    { .name = "aws_profile",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev" },
      .ak = AK_DEV, .sk = SK_DEV, .tok = TK_DEV, .region = "ap-south-1",
      .endpoint = "http://dev.example:9000", .profile = "dev",
      .source = "profile 'dev' in $H/.aws/credentials" },
    { .name = "option_profile_beats_aws_profile",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev" },
      .o_profile = "default",
      .ak = AK_DEF, .sk = SK_DEF, .region = "eu-west-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "default_profile",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .ak = AK_DEF, .sk = SK_DEF, .region = "eu-west-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "session_token_without_keys_is_ignored",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .env = { "AWS_SESSION_TOKEN=" TK_ENV },
      .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "config_only_default_credentials",
      .files = { { CONFIG, "[default]\nregion = eu-north-1\n"
                           "aws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key = " SK_CFG "\n", 0 } },
      .ak = AK_CFG, .sk = SK_CFG, .region = "eu-north-1",
      .profile = "default", .source = "profile 'default' in $H/.aws/config" },
    { .name = "config_only_named_credentials",
      .files = { { CREDS, CRED_BASIC, 0 },
                 { CONFIG, "[profile ops]\naws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key = " SK_CFG "\n"
                           "aws_session_token = " TK_DEV "\n", 0 } },
      .o_profile = "ops",
      .ak = AK_CFG, .sk = SK_CFG, .tok = TK_DEV, .region = "us-east-1",
      .profile = "ops", .source = "profile 'ops' in $H/.aws/config" },
    { .name = "config_profile_default_spelling",
      .files = { { CONFIG, "[profile default]\n"
                           "aws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key = " SK_CFG "\n"
                           "region = sa-east-1\n", 0 } },
      .ak = AK_CFG, .sk = SK_CFG, .region = "sa-east-1",
      .profile = "default", .source = "profile 'default' in $H/.aws/config" },
    { .name = "credentials_file_keys_beat_config_keys",
      .files = { { CREDS, CRED_BASIC, 0 },
                 { CONFIG, "[default]\naws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key = " SK_CFG "\n", 0 } },
      .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "env_named_files_replace_home_files",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 },
                 { "alt.ini", "[dev]\naws_access_key_id = " AK_FIL "\n"
                              "aws_secret_access_key = " SK_FIL "\n"
                              "[profile dev]\nregion = ca-central-1\n", 0 } },
      .env = { "AWS_SHARED_CREDENTIALS_FILE=$H/alt.ini",
               "AWS_CONFIG_FILE=~/alt.ini", "AWS_PROFILE=dev" },
      .ak = AK_FIL, .sk = SK_FIL, .region = "ca-central-1", .profile = "dev",
      .source = "profile 'dev' in $H/alt.ini" },

    /* ---- region: -o region > AWS_REGION > AWS_DEFAULT_REGION > profile */
    { .name = "region_option_first",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS, "AWS_REGION=env-1", "AWS_DEFAULT_REGION=envdef-1" },
      .o_region = "opt-1",
      .ak = AK_ENV, .sk = SK_ENV, .region = "opt-1", .profile = "default",
      .source = SRC_ENV },
    { .name = "region_aws_region_second",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS, "AWS_REGION=env-1", "AWS_DEFAULT_REGION=envdef-1" },
      .ak = AK_ENV, .sk = SK_ENV, .region = "env-1", .profile = "default",
      .source = SRC_ENV },
    { .name = "region_aws_default_region_third",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS, "AWS_DEFAULT_REGION=envdef-1" },
      .ak = AK_ENV, .sk = SK_ENV, .region = "envdef-1", .profile = "default",
      .source = SRC_ENV },
    { .name = "region_profile_fourth",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "eu-west-1", .profile = "default",
      .source = SRC_ENV },
    { .name = "region_of_the_selected_profile",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev" }, .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://dev.example:9000",
      .profile = "dev", .source = "none (no_sign)" },
    { .name = "region_default_last",
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "us-east-1", .source = SRC_ENV },
    { .name = "region_in_credentials_file_not_used",
      .files = { { CREDS, "[default]\nregion = xx-west-9\n", 0 } },
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "us-east-1", .profile = "default",
      .source = SRC_ENV },

    /* ---- endpoint: -o endpoint > AWS_ENDPOINT_URL_S3 > AWS_ENDPOINT_URL
     *      > profile endpoint_url > none */
    { .name = "endpoint_option_first",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev", "AWS_ENDPOINT_URL_S3=http://s3env",
               "AWS_ENDPOINT_URL=http://env" },
      .o_endpoint = "http://opt", .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://opt", .profile = "dev",
      .source = "none (no_sign)" },
    { .name = "endpoint_s3_env_second",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev", "AWS_ENDPOINT_URL_S3=http://s3env",
               "AWS_ENDPOINT_URL=http://env" },
      .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://s3env", .profile = "dev",
      .source = "none (no_sign)" },
    { .name = "endpoint_generic_env_third",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev", "AWS_ENDPOINT_URL=http://env" },
      .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://env", .profile = "dev",
      .source = "none (no_sign)" },
    { .name = "endpoint_profile_fourth",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_PROFILE=dev" },
      .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://dev.example:9000",
      .profile = "dev", .source = "none (no_sign)" },
    { .name = "endpoint_none_last",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .no_sign = true,
      .region = "eu-west-1", .profile = "default",
      .source = "none (no_sign)" },

    /* ---- no_sign */
    { .name = "no_sign_ignores_all_credentials",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 },
                 { "loose.cred", CRED_BASIC, 0644 } },
      .env = { ENV_KEYS, "AWS_SESSION_TOKEN=" TK_ENV },
      .o_profile = "dev", .o_credentials_file = "$H/loose.cred",
      .no_sign = true,
      .region = "ap-south-1", .endpoint = "http://dev.example:9000",
      .profile = "dev", .source = "none (no_sign)" },
    { .name = "no_sign_tolerates_half_pairs_and_unknown_profile",
      .files = { { CREDS, "[x]\naws_access_key_id = " AK_DEF "\n", 0 } },
      .env = { "AWS_SECRET_ACCESS_KEY=" SK_ENV, "AWS_PROFILE=x" },
      .no_sign = true,
      .region = "us-east-1", .source = "none (no_sign)" },

    /* ---- -o credentials_file */
    { .name = "credentials_file_0600_beats_everything",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 },
                 { "s3.cred", "[default]\naws_access_key_id = " AK_FIL "\n"
                              "aws_secret_access_key = " SK_FIL "\n", 0600 } },
      .env = { ENV_KEYS },
      .o_credentials_file = "$H/s3.cred",
      .ak = AK_FIL, .sk = SK_FIL, .region = "eu-west-1",
      .profile = "default",
      .source = "credentials file $H/s3.cred (profile 'default')" },
    { .name = "credentials_file_0400_with_option_profile",
      .files = { { CONFIG, CONFIG_BASIC, 0 },
                 { "s3.cred", CRED_BASIC, 0400 } },
      .o_credentials_file = "$H/s3.cred", .o_profile = "dev",
      .ak = AK_DEV, .sk = SK_DEV, .tok = TK_DEV, .region = "ap-south-1",
      .endpoint = "http://dev.example:9000", .profile = "dev",
      .source = "credentials file $H/s3.cred (profile 'dev')" },
    { .name = "credentials_file_with_aws_profile",
      .files = { { "s3.cred", CRED_BASIC, 0600 } },
      .env = { "AWS_PROFILE=dev" },
      .o_credentials_file = "$H/s3.cred",
      .ak = AK_DEV, .sk = SK_DEV, .tok = TK_DEV, .region = "us-east-1",
      .profile = "dev",
      .source = "credentials file $H/s3.cred (profile 'dev')" },
    { .name = "credentials_file_0644_refused",
      .files = { { "s3.cred", CRED_BASIC, 0644 } },
      .env = { ENV_KEYS },
      .o_credentials_file = "$H/s3.cred",
      .rc = EACCES,
      .err = { "credentials file $H/s3.cred ", "(mode 0644)",
               "chmod 600" } },
    { .name = "credentials_file_0640_refused",
      .files = { { "s3.cred", CRED_BASIC, 0640 } },
      .o_credentials_file = "$H/s3.cred",
      .rc = EACCES, .err = { "$H/s3.cred", "mode 0640", "chmod 600" } },
    { .name = "credentials_file_0602_refused",
      .files = { { "s3.cred", CRED_BASIC, 0602 } },
      .o_credentials_file = "$H/s3.cred",
      .rc = EACCES, .err = { "$H/s3.cred", "mode 0602" } },
    { .name = "credentials_file_missing",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .o_credentials_file = "$H/nope.cred",
      .rc = ENOENT,
      .err = { "credentials file $H/nope.cred does not exist" } },
    { .name = "credentials_file_directory",
      .files = { { "dir.cred", NULL, 0700 } },
      .o_credentials_file = "$H/dir.cred",
      .rc = EINVAL, .err = { "$H/dir.cred is not a regular file" } },
    { .name = "credentials_file_profile_missing",
      .files = { { CREDS, CRED_BASIC, 0 },
                 { "s3.cred", "[other]\naws_access_key_id = " AK_FIL "\n"
                              "aws_secret_access_key = " SK_FIL "\n", 0600 } },
      .o_credentials_file = "$H/s3.cred", .o_profile = "dev",
      .rc = ENOENT,
      .err = { "profile 'dev' not found in credentials file $H/s3.cred" } },
    { .name = "credentials_file_half_pair",
      .files = { { "s3.cred", "[default]\naws_secret_access_key = " SK_FIL
                              "\n", 0600 } },
      .o_credentials_file = "$H/s3.cred",
      .rc = EINVAL,
      .err = { "profile 'default' in credentials file $H/s3.cred",
               "aws_secret_access_key but no aws_access_key_id" } },
    { .name = "credentials_file_without_keys",
      .files = { { "s3.cred", "[default]\nregion = eu-west-3\n", 0600 } },
      .o_credentials_file = "$H/s3.cred",
      .rc = ENOENT, .err = { "$H/s3.cred", "no aws_access_key_id" } },
    { .name = "credentials_file_syntax_error",
      .files = { { "s3.cred", "[default]\naws_access_key_id = " AK_FIL "\n"
                              "aws_secret_access_key " SK_FIL "\n", 0600 } },
      .o_credentials_file = "$H/s3.cred",
      .rc = EINVAL, .err = { "$H/s3.cred line 3: expected 'key = value'" } },

    /* ---- missing profiles and credentials */
    { .name = "option_profile_missing",
      .files = { { CREDS, CRED_BASIC, 0 }, { CONFIG, CONFIG_BASIC, 0 } },
      .env = { ENV_KEYS },
      .o_profile = "nope",
      .rc = ENOENT,
      .err = { "profile 'nope' (-o profile) not found in "
               "$H/.aws/credentials or $H/.aws/config" } },
    { .name = "aws_profile_missing",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .env = { "AWS_PROFILE=nope" },
      .rc = ENOENT, .err = { "profile 'nope' (AWS_PROFILE) not found" } },
    { .name = "aws_profile_missing_even_with_env_keys",
      .env = { ENV_KEYS, "AWS_PROFILE=nope" },
      .rc = ENOENT, .err = { "profile 'nope' (AWS_PROFILE) not found" } },
    { .name = "profile_names_are_case_sensitive",
      .files = { { CREDS, "[Dev]\naws_access_key_id = " AK_DEV "\n"
                          "aws_secret_access_key = " SK_DEV "\n", 0 } },
      .o_profile = "dev",
      .rc = ENOENT, .err = { "profile 'dev'", "not found" } },
    { .name = "config_section_without_profile_prefix_is_not_a_profile",
      .files = { { CONFIG, "[dev]\naws_access_key_id = " AK_DEV "\n"
                           "aws_secret_access_key = " SK_DEV "\n", 0 } },
      .o_profile = "dev",
      .rc = ENOENT, .err = { "profile 'dev'", "not found" } },
    { .name = "no_credentials_anywhere",
      .rc = ENOENT,
      .err = { "no credentials: set AWS_ACCESS_KEY_ID and "
               "AWS_SECRET_ACCESS_KEY", "-o profile=NAME", "-o no_sign" } },
    { .name = "no_credentials_config_has_region_only",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .env = { "AWS_SESSION_TOKEN=" TK_ENV },
      .rc = ENOENT, .err = { "no credentials", "-o no_sign" } },
    { .name = "named_profile_with_region_only",
      .files = { { CONFIG, CONFIG_BASIC, 0 } },
      .o_profile = "dev",
      .rc = ENOENT,
      .err = { "profile 'dev' (-o profile) has no aws_access_key_id and "
               "aws_secret_access_key in $H/.aws/credentials or "
               "$H/.aws/config" } },
    { .name = "named_profile_with_role_arn",
      .files = { { CONFIG, "[profile sso]\nrole_arn = arn:aws:iam::1:role/x\n"
                           "source_profile = default\n", 0 } },
      .env = { "AWS_PROFILE=sso" },
      .rc = ENOENT, .err = { "profile 'sso'", "role_arn is not supported" } },
    /* ---- allow_no_credentials (the daemon): credsource.c goes on */
    { .name = "allow_none_process_in_config",
      .files = { { CONFIG, "[default]\nregion = eu-west-1\n"
                           "credential_process = /bin/get-creds --x 'a b'\n"
                           "ec2_metadata_service_endpoint = http://127.0.0.1:9\n",
                   0 } },
      .allow_none = true, .region = "eu-west-1", .profile = "default",
      .process = "/bin/get-creds --x 'a b'",
      .ec2_endpoint = "http://127.0.0.1:9" },
    { .name = "allow_none_process_named_profile_in_credentials",
      .files = { { CREDS, "[dev]\ncredential_process = /bin/dev-creds\n", 0 },
                 { CONFIG, CONFIG_BASIC, 0 } },
      .o_profile = "dev", .allow_none = true, .region = "ap-south-1",
      .endpoint = "http://dev.example:9000", .profile = "dev",
      .process = "/bin/dev-creds" },
    { .name = "allow_none_keys_win_over_process",
      .files = { { CREDS, CRED_BASIC, 0 },
                 { CONFIG, "[default]\ncredential_process = /bin/x\n", 0 } },
      .allow_none = true, .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "allow_none_env_keys_win_over_process",
      .files = { { CONFIG, "[default]\ncredential_process = /bin/x\n", 0 } },
      .env = { ENV_KEYS }, .allow_none = true, .ak = AK_ENV, .sk = SK_ENV,
      .region = "us-east-1", .profile = "default", .source = SRC_ENV },
    { .name = "allow_none_nothing_at_all",
      .allow_none = true, .region = "us-east-1" },
    { .name = "allow_none_role_arn_still_refused",
      .files = { { CONFIG, "[profile sso]\nrole_arn = arn:aws:iam::1:role/x\n"
                           "source_profile = default\n", 0 } },
      .env = { "AWS_PROFILE=sso" }, .allow_none = true,
      .rc = ENOENT, .err = { "profile 'sso'", "role_arn is not supported" } },
    { .name = "without_allow_none_process_is_not_enough",
      .files = { { CONFIG, "[default]\ncredential_process = /bin/x\n", 0 } },
      .rc = ENOENT, .err = { "no credentials" } },
    { .name = "env_named_config_missing",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .env = { "AWS_CONFIG_FILE=$H/missing.cfg" },
      .rc = ENOENT,
      .err = { "AWS_CONFIG_FILE names $H/missing.cfg, which does not "
               "exist" } },
    { .name = "env_named_credentials_missing",
      .env = { "AWS_SHARED_CREDENTIALS_FILE=$H/missing.cred" },
      .rc = ENOENT,
      .err = { "AWS_SHARED_CREDENTIALS_FILE names $H/missing.cred" } },
    { .name = "default_credentials_path_is_directory",
      .files = { { CREDS, NULL, 0700 } },
      .env = { ENV_KEYS },
      .rc = EINVAL, .err = { "$H/.aws/credentials is not a regular file" } },

    /* ---- half pairs */
    { .name = "env_access_key_without_secret",
      .files = { { CREDS, CRED_BASIC, 0 } },
      .env = { "AWS_ACCESS_KEY_ID=" AK_ENV, "AWS_SESSION_TOKEN=" TK_ENV },
      .rc = EINVAL,
      .err = { "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not" } },
    { .name = "env_secret_without_access_key",
      .env = { "AWS_SECRET_ACCESS_KEY=" SK_ENV },
      .rc = EINVAL,
      .err = { "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not" } },
    { .name = "profile_access_key_without_secret",
      .files = { { CREDS, "[default]\naws_access_key_id = " AK_DEF "\n"
                          "aws_session_token = " TK_DEV "\n", 0 } },
      .rc = EINVAL,
      .err = { "profile 'default' in $H/.aws/credentials has "
               "aws_access_key_id but no aws_secret_access_key" } },
    { .name = "profile_secret_without_access_key",
      .files = { { CREDS, "[dev]\naws_secret_access_key = " SK_BAD "\n", 0 },
                 { CONFIG, "[profile dev]\naws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key = " SK_CFG "\n", 0 } },
      .o_profile = "dev",
      .rc = EINVAL,
      .err = { "profile 'dev' in $H/.aws/credentials has "
               "aws_secret_access_key but no aws_access_key_id" } },
    { .name = "config_half_pair",
      .files = { { CONFIG, "[profile dev]\naws_access_key_id = " AK_CFG "\n"
                           "aws_secret_access_key =\n", 0 } },
      .env = { "AWS_PROFILE=dev" },
      .rc = EINVAL,
      .err = { "profile 'dev' in $H/.aws/config has aws_access_key_id but "
               "no aws_secret_access_key" } },

    /* ---- syntax */
    { .name = "comments_and_odd_spacing",
      .files = {
          { CREDS,
            "# leading comment\r\n"
            "; another = comment\r\n"
            "   # indented comment\r\n"
            "\r\n"
            "  [default]   ; comment after the header\r\n"
            "AWS_Access_Key_ID=" AK_DEF "\r\n"
            "\t\r\n"
            "Aws_Secret_Access_Key\t =\t  " SK_DEF "   # inline comment\r\n"
            "[dev]#comment\n"
            "aws_access_key_id = " AK_DEV "\n", 0 },
          { CONFIG,
            "[default]\n"
            "REGION = eu-south-1 ; the region\n"
            "ENDPOINT_URL=http://h:9000/a#b;c\n", 0 } },
      .ak = AK_DEF, .sk = SK_DEF, .region = "eu-south-1",
      .endpoint = "http://h:9000/a#b;c", .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "nested_subsections_and_other_sections",
      .files = {
          { CONFIG,
            "[sso-session corp]\n"
            "sso_region = us-west-2\n"
            "[services local]\n"
            "s3 =\n"
            "  endpoint_url = http://wrong-1\n"
            "[profile dev]\n"
            "s3 =\n"
            "  endpoint_url = http://wrong-2\n"
            "  addressing_style = path\n"
            "\n"
            "  signature_version = s3v4\n"
            "region = eu-central-1\n"
            "services = local\n"
            "[dev]\n"
            "region = wrong-3\n"
            "[profile]\n"
            "region = wrong-4\n", 0 } },
      .env = { "AWS_PROFILE=dev" }, .no_sign = true,
      .region = "eu-central-1", .profile = "dev",
      .source = "none (no_sign)" },
    { .name = "continuation_lines_are_ignored",
      .files = { { CONFIG, "[default]\n"
                           "region = eu-west-2\n"
                           "   this line continues the value\n"
                           "endpoint_url = http://e\n", 0 } },
      .no_sign = true, .region = "eu-west-2", .endpoint = "http://e",
      .profile = "default", .source = "none (no_sign)" },
    { .name = "uniformly_indented_settings",
      .files = { { CREDS, "[default]\n"
                          "  aws_access_key_id = " AK_DEF "\n"
                          "  aws_secret_access_key = " SK_DEF "\n", 0 } },
      .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "spaces_in_section_headers",
      .files = { { CREDS, "[ dev ]\naws_access_key_id = " AK_DEV "\n"
                          "aws_secret_access_key = " SK_DEV "\n", 0 },
                 { CONFIG, "[profile \t dev]\nregion = me-south-1\n", 0 } },
      .o_profile = "dev",
      .ak = AK_DEV, .sk = SK_DEV, .region = "me-south-1", .profile = "dev",
      .source = "profile 'dev' in $H/.aws/credentials" },
    { .name = "repeated_section_merges_last_line_wins",
      .files = { { CREDS, "[default]\naws_access_key_id = " AK_DEV "\n"
                          "[dev]\naws_access_key_id = x\n"
                          "[default]\naws_secret_access_key = " SK_DEF "\n"
                          "aws_access_key_id = " AK_DEF "\n", 0 } },
      .ak = AK_DEF, .sk = SK_DEF, .region = "us-east-1",
      .profile = "default",
      .source = "profile 'default' in $H/.aws/credentials" },
    { .name = "empty_files",
      .files = { { CREDS, "", 0 }, { CONFIG, "# nothing\n", 0 } },
      .env = { ENV_KEYS },
      .ak = AK_ENV, .sk = SK_ENV, .region = "us-east-1", .source = SRC_ENV },
    { .name = "syntax_missing_bracket",
      .files = { { CREDS, "# c\n\n[default\naws_access_key_id = x\n", 0 } },
      .env = { ENV_KEYS },
      .rc = EINVAL,
      .err = { "$H/.aws/credentials line 3: missing ']'" } },
    { .name = "syntax_text_after_header",
      .files = { { CONFIG, "[default]\nregion = a\n[profile x] y\n", 0 } },
      .env = { ENV_KEYS },
      .rc = EINVAL,
      .err = { "$H/.aws/config line 3: unexpected text after ']'" } },
    { .name = "syntax_empty_section_name",
      .files = { { CREDS, "[ ]\n", 0 } },
      .rc = EINVAL, .err = { "$H/.aws/credentials line 1: empty section" } },
    { .name = "syntax_setting_outside_section",
      .files = { { CREDS, "aws_secret_access_key = " SK_BAD "\n", 0 } },
      .rc = EINVAL,
      .err = { "$H/.aws/credentials line 1: setting outside any [section]" } },
    { .name = "syntax_missing_key",
      .files = { { CREDS, "[default]\n\n\n = " SK_BAD "\n", 0 } },
      .rc = EINVAL,
      .err = { "$H/.aws/credentials line 4: missing key before '='" } },
    { .name = "syntax_no_equals_does_not_echo_secret",
      .files = { { CREDS, CRED_BASIC "[x]\n" SK_BAD "\n", 0 } },
      .env = { ENV_KEYS },
      .rc = EINVAL,
      .err = { "$H/.aws/credentials line 10: expected 'key = value'" } },
    { .name = "syntax_error_in_other_section_still_fails",
      .files = { { CONFIG, "[profile a]\nregion = x\n[profile b]\nbad\n",
                   0 } },
      .env = { ENV_KEYS, "AWS_PROFILE=a" },
      .rc = EINVAL, .err = { "$H/.aws/config line 4:" } },
};

#define N_CASES (sizeof cases / sizeof *cases)

static void run_case(void **state)
{
    struct fx *fx = *state;
    const struct rcase *tc = fx->tc;
    struct awsconfig_options opts = { 0 };
    char buf[7][512];
    int rc;

    for (size_t i = 0; i < 3 && tc->files[i].path != NULL; i++)
        write_file(fx->home, tc->files[i].path, tc->files[i].text,
                   tc->files[i].mode);
    for (size_t i = 0; i < 6 && tc->env[i] != NULL; i++) {
        char *eq;

        expand(fx->home, tc->env[i], buf[0], sizeof buf[0]);
        eq = strchr(buf[0], '=');
        assert_non_null(eq);
        *eq = '\0';
        assert_int_equal(setenv(buf[0], eq + 1, 1), 0);
    }
    opts.profile = tc->o_profile;
    opts.credentials_file = expand(fx->home, tc->o_credentials_file, buf[1],
                                   sizeof buf[1]);
    opts.region = tc->o_region;
    opts.endpoint = tc->o_endpoint;
    opts.no_sign = tc->no_sign;
    opts.allow_no_credentials = tc->allow_none;

    strcpy(fx->errbuf, "untouched");
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    if (tc->rc != 0) {
        check_error(fx, rc, tc->rc, tc->err, 3);
        return;
    }
    if (rc != 0)
        fail_msg("rc %d (%s); errbuf: %s", rc, strerror(rc), fx->errbuf);
    assert_string_equal(fx->errbuf, "");
    assert_str("access_key", fx->cfg.access_key, tc->ak);
    assert_str("secret_key", fx->cfg.secret_key, tc->sk);
    assert_str("session_token", fx->cfg.session_token, tc->tok);
    assert_str("region", fx->cfg.region, tc->region);
    assert_str("endpoint", fx->cfg.endpoint, tc->endpoint);
    assert_str("profile", fx->cfg.profile, tc->profile);
    assert_str("credentials_source", fx->cfg.credentials_source,
               expand(fx->home, tc->source, buf[2], sizeof buf[2]));
    if (fx->cfg.credentials_source != NULL) /* NULL: no keys (allow_none) */
        assert_no_secret(fx->cfg.credentials_source);
    assert_str("credential_process", fx->cfg.credential_process, tc->process);
    assert_str("ec2_metadata_endpoint", fx->cfg.ec2_metadata_endpoint,
               tc->ec2_endpoint);
}

/* ------------------------------------------------------- single tests */

static void test_file_too_large(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { 0 };
    const char *frags[] = { "/.aws/config is larger than 1 MiB" };
    char path[256], line[64];
    FILE *f;
    int rc;

    snprintf(path, sizeof path, "%s/.aws/config", fx->home);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("[default]\n", f);
    memset(line, '#', sizeof line - 1);
    line[sizeof line - 2] = '\n';
    line[sizeof line - 1] = '\0';
    for (int i = 0; i < (1024 * 1024) / 62 + 1; i++)
        fputs(line, f);
    assert_int_equal(fclose(f), 0);
    setenv("AWS_ACCESS_KEY_ID", AK_ENV, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SK_ENV, 1);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    check_error(fx, rc, EINVAL, frags, 1);

    /* Just under the cap is fine. */
    assert_int_equal(truncate(path, 1024 * 1024), 0);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, 0);
}

static void test_nul_byte(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { .no_sign = true };
    const char *frags[] = { "/.aws/config line 2: NUL byte" };
    static const char text[] = "[default]\nregion = a\0b\n";
    char path[256];
    FILE *f;
    int rc;

    snprintf(path, sizeof path, "%s/.aws/config", fx->home);
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, sizeof text - 1, f), sizeof text - 1);
    assert_int_equal(fclose(f), 0);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    check_error(fx, rc, EINVAL, frags, 1);
}

static void test_unreadable_file(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { 0 };
    const char *frags[] = { "cannot read", "/.aws/credentials" };
    int rc;

    if (geteuid() == 0)
        skip();
    write_file(fx->home, CREDS, CRED_BASIC, 0200);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    check_error(fx, rc, EACCES, frags, 2);
}

static void test_fifo_credentials_file(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { 0 };
    const char *frags[] = { "is not a regular file" };
    char path[256];
    int rc;

    snprintf(path, sizeof path, "%s/fifo.cred", fx->home);
    assert_int_equal(mkfifo(path, 0600), 0);
    opts.credentials_file = path;
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    check_error(fx, rc, EINVAL, frags, 1);
}

static void test_home_option_beats_env_home(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { .home = fx->home };
    int rc;

    write_file(fx->home, CREDS, CRED_BASIC, 0);
    setenv("HOME", "/nonexistent/home", 1);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, 0);
    assert_string_equal(fx->cfg.access_key, AK_DEF);
}

static void test_no_home(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { 0 };
    const char *frags[] = { "no credentials" };
    int rc;

    unsetenv("HOME");
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    check_error(fx, rc, ENOENT, frags, 1);

    setenv("AWS_ACCESS_KEY_ID", AK_ENV, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SK_ENV, 1);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, 0);
    assert_string_equal(fx->cfg.region, "us-east-1");
}

static void test_null_opts_and_errbuf(void **state)
{
    struct fx *fx = *state;
    char small[8];
    int rc;

    setenv("AWS_ACCESS_KEY_ID", AK_ENV, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SK_ENV, 1);
    rc = awsconfig_resolve(NULL, &fx->cfg, NULL, 0);
    assert_int_equal(rc, 0);
    assert_string_equal(fx->cfg.secret_key, SK_ENV);
    awsconfig_clear(&fx->cfg);

    /* A failure with no errbuf, then one with a tiny errbuf. */
    unsetenv("AWS_SECRET_ACCESS_KEY");
    rc = awsconfig_resolve(NULL, &fx->cfg, NULL, 0);
    assert_int_equal(rc, EINVAL);
    memset(small, 'x', sizeof small);
    rc = awsconfig_resolve(NULL, &fx->cfg, small, sizeof small);
    assert_int_equal(rc, EINVAL);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_empty(&fx->cfg);
}

static void test_result_is_overwritten(void **state)
{
    struct fx *fx = *state;
    struct awsconfig_options opts = { 0 };
    int rc;

    /* A resolve into a struct that already holds a result: the caller must
     * clear first, so clear, resolve, and check that a failure leaves the
     * struct zeroed. */
    write_file(fx->home, CREDS, CRED_BASIC, 0);
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, 0);
    awsconfig_clear(&fx->cfg);
    opts.profile = "missing";
    rc = awsconfig_resolve(&opts, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, ENOENT);
    assert_empty(&fx->cfg);
}

static void test_clear_twice(void **state)
{
    struct fx *fx = *state;
    struct awsconfig zero = { 0 };
    int rc;

    setenv("AWS_ACCESS_KEY_ID", AK_ENV, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SK_ENV, 1);
    setenv("AWS_SESSION_TOKEN", TK_ENV, 1);
    setenv("AWS_ENDPOINT_URL", "http://x", 1);
    rc = awsconfig_resolve(NULL, &fx->cfg, fx->errbuf, sizeof fx->errbuf);
    assert_int_equal(rc, 0);
    awsconfig_clear(&fx->cfg);
    assert_empty(&fx->cfg);
    awsconfig_clear(&fx->cfg);
    assert_empty(&fx->cfg);
    awsconfig_clear(&zero);
    awsconfig_clear(NULL);
}

int main(void)
{
    static const struct CMUnitTest singles[] = {
        cmocka_unit_test_setup_teardown(test_file_too_large, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_nul_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_file, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fifo_credentials_file, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_home_option_beats_env_home,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_home, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_opts_and_errbuf, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_result_is_overwritten, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_clear_twice, setup, teardown),
    };
    struct CMUnitTest tests[N_CASES + sizeof singles / sizeof *singles];

    for (size_t i = 0; i < N_CASES; i++) {
        tests[i] = (struct CMUnitTest){
            .name = cases[i].name,
            .test_func = run_case,
            .setup_func = setup,
            .teardown_func = teardown,
            .initial_state = (void *)&cases[i],
        };
    }
    for (size_t i = 0; i < sizeof singles / sizeof *singles; i++)
        tests[N_CASES + i] = singles[i];
    return cmocka_run_group_tests_name("awsconfig", tests, NULL, NULL);
}
