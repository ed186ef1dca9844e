/*
 * awsconfig.c - resolve credentials, region and endpoint the way the AWS
 * tools do (see awsconfig.h for the precedence rules).
 *
 * Only the one profile in use is extracted from each file. The dialect is
 * the AWS CLI's INI:
 *   - sections: "[NAME]" in a credentials file; "[profile NAME]" and
 *     "[default]" (also "[profile default]") in the config file, where any
 *     other section ("[sso-session x]", "[services x]", "[NAME]") is
 *     skipped. Names are trimmed and case-sensitive. A repeated section is
 *     merged with the earlier one; for a repeated key the last line wins.
 *   - settings: "key = value"; keys case-insensitive, values trimmed, an
 *     empty value means "not set".
 *   - comments: a line whose first non-blank character is '#' or ';'; after
 *     a section's ']'; inside a value only when the '#' or ';' follows a
 *     space or tab ("a ;b" is "a", "http://h/a#b" is kept whole).
 *   - a line indented deeper than the setting above it is a continuation
 *     or a nested sub-setting ("s3 =\n  endpoint_url = ..."): ignored.
 *   - CRLF line ends are accepted; anything else is a syntax error reported
 *     as "FILE line N: ..."; files over 1 MiB or with NUL bytes are refused.
 *
 * Decisions where the header is silent:
 *   - An empty option or environment variable counts as unset.
 *   - AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE (a leading "~/" is
 *     expanded) name files explicitly: missing is ENOENT. The default
 *     ~/.aws files may be missing.
 *   - A profile named by -o profile or AWS_PROFILE must exist in the
 *     credentials or config file even when the keys come from elsewhere
 *     (as the AWS CLI does), except with -o no_sign (credentials files are
 *     then not read at all and a missing profile only loses its region)
 *     and with -o credentials_file (the profile must exist in that file).
 *   - In a profile, keys are taken from the credentials file if it has
 *     either key, else from the config file; the session token comes from
 *     the same file as the keys. A profile with no keys is ENOENT, unless
 *     allow_no_credentials and it names no provider this program lacks
 *     (role_arn, sso_*...): then the result has no keys, and
 *     credential_process (from the config file, else the credentials file)
 *     if the profile has one; credsource.c goes on from there.
 *   - region and endpoint_url are read from the config file only.
 *   - AWS_PROFILE also selects the section of -o credentials_file.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "base/text.h"
#include "creds/awsconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/crypto.h>

#define AWSCFG_MAX_FILE (1024 * 1024)   /* "1 MiB" in the message */
#define AWSCFG_DEFAULT_REGION "us-east-1"

enum { K_ACCESS, K_SECRET, K_TOKEN, K_REGION, K_ENDPOINT, K_PROCESS,
       K_EC2_ENDPOINT, K_COUNT };

static const char *const key_names[K_COUNT] = {
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
    "region", "endpoint_url", "credential_process",
    "ec2_metadata_service_endpoint",
};

/* Credential providers we do not implement: named in the "no credentials"
 * message so that the user knows why the profile yields nothing. */
static const char *const other_cred_keys[] = {
    "role_arn", "sso_session", "sso_start_url",
    "web_identity_token_file", "credential_source",
};

/* The settings of one profile, as found in one file. */
struct prof {
    bool found;                 /* the section exists */
    char *val[K_COUNT];         /* indexed by K_*; NULL when not set */
    const char *other;          /* first other_cred_keys entry seen */
};

static void free_secret(char **s)
{
    if (*s != NULL) {
        OPENSSL_cleanse(*s, strlen(*s));
        free(*s);
        *s = NULL;
    }
}

static void prof_clear(struct prof *p)
{
    for (int i = 0; i < K_COUNT; i++)
        free_secret(&p->val[i]);
    p->found = false;
    p->other = NULL;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static char *ltrim(char *s)
{
    while (is_blank(*s))
        s++;
    return s;
}

static char *trim(char *s)
{
    size_t n;

    s = ltrim(s);
    n = strlen(s);
    while (n > 0 && is_blank(s[n - 1]))
        s[--n] = '\0';
    return s;
}

static const char *nonempty(const char *s)
{
    return s != NULL && *s != '\0' ? s : NULL;
}

static const char *env_get(const char *name)
{
    return nonempty(getenv(name));
}

/* The path of one shared file: $VAR if set (leading "~/" expanded), else
 * HOME/.aws/NAME, else NULL (no home: nothing to read). *VARP is set to VAR
 * when the variable was used. */
static int shared_path(const char *var, const char *home, const char *name,
                       char **pathp, const char **varp)
{
    const char *v = env_get(var);
    int rc = 0, n;

    *pathp = NULL;
    *varp = NULL;
    if (v != NULL) {
        *varp = var;
        if (strncmp(v, "~/", 2) == 0 && home != NULL)
            n = asprintf(pathp, "%s%s", home, v + 1);
        else
            n = asprintf(pathp, "%s", v);
    } else if (home != NULL) {
        n = asprintf(pathp, "%s/.aws/%s", home, name);
    } else {
        goto out;
    }
    if (n < 0) {
        *pathp = NULL;
        rc = ENOMEM;
    }
out:
    return rc;
}

/*
 * Read PATH into a NUL-terminated malloc'd buffer (*BUFP, length *LENP).
 * A missing default file (VAR NULL, not STRICT) leaves *BUFP NULL and is not
 * an error. STRICT is -o credentials_file: it must exist, and its mode must
 * grant nothing to group or others.
 */
static int read_file(const char *path, const char *var, bool strict,
                     char **bufp, size_t *lenp, char *errbuf, size_t errlen)
{
    struct stat st;
    char *buf = NULL;
    size_t size = 0, len = 0;
    int rc = 0, fd = -1;

    *bufp = NULL;
    *lenp = 0;
    if (path == NULL)
        goto out;
    /* O_NONBLOCK: opening a FIFO must not hang; harmless on regular files. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        rc = errno;
        if (rc == ENOENT || rc == ENOTDIR) {
            rc = ENOENT;
            if (strict)
                text_set_err(errbuf, errlen, "credentials file %s does not exist",
                        path);
            else if (var != NULL)
                text_set_err(errbuf, errlen, "%s names %s, which does not exist",
                        var, path);
            else
                rc = 0;
        } else if (rc == EACCES) {
            text_set_err(errbuf, errlen, "cannot read %s: permission denied",
                    path);
        } else {
            text_set_err(errbuf, errlen, "cannot open %s: %s", path,
                    strerror(rc));
        }
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        rc = errno;
        text_set_err(errbuf, errlen, "cannot stat %s: %s", path, strerror(rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s is not a regular file", path);
        goto out;
    }
    if (strict && (st.st_mode & 077) != 0) {
        rc = EACCES;
        text_set_err(errbuf, errlen,
                "credentials file %s is accessible to group or others "
                "(mode %04o); run chmod 600 %s",
                path, (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    if (st.st_size > AWSCFG_MAX_FILE) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s is larger than 1 MiB", path);
        goto out;
    }
    size = (size_t)st.st_size;
    buf = malloc(size + 1);
    if (buf == NULL) {
        rc = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory reading %s", path);
        goto out;
    }
    while (len < size) {
        ssize_t n = read(fd, buf + len, size - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = errno;
            text_set_err(errbuf, errlen, "cannot read %s: %s", path,
                    strerror(rc));
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *bufp = buf;
    *lenp = len;
    buf = NULL;
out:
    if (buf != NULL) {
        OPENSSL_cleanse(buf, size + 1);
        free(buf);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Handle a "[...]" line T (trimmed, starting with '['): work out which
 * profile it opens, if any, and whether that is WANT. */
static int parse_section(char *t, const char *path, unsigned line,
                         bool is_config, const char *want, bool *in_want,
                         char *errbuf, size_t errlen)
{
    char *close = strchr(t, ']');
    char *rest, *name, *pname = NULL;
    int rc = 0;

    if (close == NULL) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s line %u: missing ']' in section header",
                path, line);
        goto out;
    }
    *close = '\0';
    rest = ltrim(close + 1);
    if (*rest != '\0' && *rest != '#' && *rest != ';') {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s line %u: unexpected text after ']'",
                path, line);
        goto out;
    }
    name = trim(t + 1);
    if (*name == '\0') {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s line %u: empty section name", path,
                line);
        goto out;
    }
    if (!is_config)
        pname = name;
    else if (strcmp(name, "default") == 0)
        pname = name;
    else if (strncmp(name, "profile", 7) == 0 && is_blank(name[7]))
        pname = ltrim(name + 7);
    *in_want = pname != NULL && strcmp(pname, want) == 0;
out:
    return rc;
}

/* Record KEY = VALUE of the profile being extracted. */
static int store_setting(struct prof *p, const char *key, const char *value)
{
    int rc = 0;

    for (int i = 0; i < K_COUNT; i++) {
        if (strcasecmp(key, key_names[i]) != 0)
            continue;
        free_secret(&p->val[i]);
        if (*value != '\0') {
            p->val[i] = strdup(value);
            if (p->val[i] == NULL)
                rc = ENOMEM;
        }
        goto out;
    }
    for (size_t i = 0; i < sizeof other_cred_keys / sizeof *other_cred_keys;
         i++) {
        if (p->other == NULL && *value != '\0' &&
            strcasecmp(key, other_cred_keys[i]) == 0)
            p->other = other_cred_keys[i];
    }
out:
    return rc;
}

/* Parse the file BUF (LEN bytes, NUL-terminated, modified in place) and
 * extract the settings of profile WANT into P. */
static int parse_ini(char *buf, size_t len, const char *path, bool is_config,
                     const char *want, struct prof *p, char *errbuf,
                     size_t errlen)
{
    char *s = buf, *end = buf + len, *nul;
    bool in_section = false, in_want = false, after_key = false;
    size_t key_indent = 0;
    unsigned line = 0;
    int rc = 0;

    nul = memchr(buf, '\0', len);
    if (nul != NULL) {
        line = 1;
        for (char *q = buf; q < nul; q++)
            line += *q == '\n';
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s line %u: NUL byte in file", path, line);
        goto out;
    }
    while (s < end) {
        char *eol = memchr(s, '\n', (size_t)(end - s));
        char *t = s, *eq, *key, *value;
        size_t indent;

        if (eol != NULL) {
            *eol = '\0';
            s = eol + 1;
        } else {
            s = end;
        }
        line++;
        indent = (size_t)(ltrim(t) - t);
        if (t[indent] == '\0')
            continue;
        /* Continuation or nested sub-setting of the previous key. */
        if (after_key && indent > key_indent)
            continue;
        t = trim(t);
        if (*t == '#' || *t == ';')
            continue;
        if (*t == '[') {
            rc = parse_section(t, path, line, is_config, want, &in_want,
                               errbuf, errlen);
            if (rc != 0)
                goto out;
            in_section = true;
            after_key = false;
            if (in_want)
                p->found = true;
            continue;
        }
        eq = strchr(t, '=');
        if (eq == NULL) {
            rc = EINVAL;
            text_set_err(errbuf, errlen, "%s line %u: expected 'key = value'",
                    path, line);
            goto out;
        }
        if (!in_section) {
            rc = EINVAL;
            text_set_err(errbuf, errlen, "%s line %u: setting outside any "
                    "[section]", path, line);
            goto out;
        }
        *eq = '\0';
        key = trim(t);
        if (*key == '\0') {
            rc = EINVAL;
            text_set_err(errbuf, errlen, "%s line %u: missing key before '='",
                    path, line);
            goto out;
        }
        value = eq + 1;
        for (char *q = value; *q != '\0'; q++) {
            if ((*q == '#' || *q == ';') && q > value && is_blank(q[-1])) {
                *q = '\0';
                break;
            }
        }
        value = trim(value);
        after_key = true;
        key_indent = indent;
        if (in_want) {
            rc = store_setting(p, key, value);
            if (rc != 0) {
                text_set_err(errbuf, errlen, "out of memory reading %s", path);
                goto out;
            }
        }
    }
out:
    return rc;
}

/* Extract profile WANT from PATH into P (see read_file for VAR, STRICT). */
static int load_profile(const char *path, const char *var, bool is_config,
                        bool strict, const char *want, struct prof *p,
                        char *errbuf, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    int rc;

    rc = read_file(path, var, strict, &buf, &len, errbuf, errlen);
    if (rc != 0 || buf == NULL)
        goto out;
    rc = parse_ini(buf, len, path, is_config, want, p, errbuf, errlen);
out:
    if (buf != NULL) {
        OPENSSL_cleanse(buf, len);
        free(buf);
    }
    return rc;
}

static bool has_key(const struct prof *p)
{
    return p->val[K_ACCESS] != NULL || p->val[K_SECRET] != NULL;
}

/* Move the key pair and token of profile NAME out of P (which has at least
 * one key) into OUT. WHERE names the file for messages. */
static int take_pair(struct prof *p, const char *name, const char *where,
                     struct awsconfig *out, char *errbuf, size_t errlen)
{
    int rc = 0;

    if (p->val[K_ACCESS] == NULL || p->val[K_SECRET] == NULL) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "profile '%s' in %s has %s but no %s", name,
                where,
                key_names[p->val[K_ACCESS] != NULL ? K_ACCESS : K_SECRET],
                key_names[p->val[K_ACCESS] != NULL ? K_SECRET : K_ACCESS]);
        goto out;
    }
    out->access_key = p->val[K_ACCESS];
    out->secret_key = p->val[K_SECRET];
    out->session_token = p->val[K_TOKEN];
    p->val[K_ACCESS] = p->val[K_SECRET] = p->val[K_TOKEN] = NULL;
out:
    return rc;
}

/* Credentials from the environment; *TOOK false if neither key is set. */
static int env_creds(struct awsconfig *out, bool *took, char *errbuf,
                     size_t errlen)
{
    const char *ak = env_get("AWS_ACCESS_KEY_ID");
    const char *sk = env_get("AWS_SECRET_ACCESS_KEY");
    const char *tok = env_get("AWS_SESSION_TOKEN");
    int rc = 0;

    *took = false;
    if (ak == NULL && sk == NULL)
        goto out;
    if (ak == NULL || sk == NULL) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "%s is set but %s is not",
                ak != NULL ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                ak != NULL ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        goto out;
    }
    out->access_key = strdup(ak);
    out->secret_key = strdup(sk);
    out->session_token = tok != NULL ? strdup(tok) : NULL;
    out->credentials_source = strdup("environment (AWS_ACCESS_KEY_ID)");
    if (out->access_key == NULL || out->secret_key == NULL ||
        (tok != NULL && out->session_token == NULL) ||
        out->credentials_source == NULL) {
        rc = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
        goto out;
    }
    *took = true;
out:
    return rc;
}

/*
 * Credentials of profile NAME from the shared credentials file (CREDP,
 * CRED_PATH) or, failing that, the config file (CFGP, CFG_PATH). FROM is
 * how the profile was chosen ("-o profile", "AWS_PROFILE") or NULL for the
 * implicit "default". A profile without keys is ENOENT.
 */
static int profile_creds(const char *name, const char *from,
                         struct prof *credp, const char *cred_path,
                         struct prof *cfgp, const char *cfg_path,
                         bool allow_none, struct awsconfig *out,
                         char *errbuf, size_t errlen)
{
    const char *other = credp->other != NULL ? credp->other : cfgp->other;
    struct prof *p = NULL;
    const char *where = NULL;
    int rc = 0;

    if (has_key(credp)) {
        p = credp;
        where = cred_path;
    } else if (has_key(cfgp)) {
        p = cfgp;
        where = cfg_path;
    }
    if (p == NULL && allow_none && other == NULL) {
        /* credential_process, container or instance credentials follow
         * (credsource.c) */
        goto out;
    }
    if (p == NULL) {
        rc = ENOENT;
        if (from == NULL)
            text_set_err(errbuf, errlen,
                    "no credentials: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, add them to profile '%s' in %s, "
                    "use -o profile=NAME or -o no_sign%s%s%s",
                    name, cred_path, other != NULL ? " (" : "",
                    other != NULL ? other : "",
                    other != NULL ? " is not supported)" : "");
        else
            text_set_err(errbuf, errlen,
                    "profile '%s' (%s) has no aws_access_key_id and "
                    "aws_secret_access_key in %s or %s%s%s%s",
                    name, from, cred_path, cfg_path,
                    other != NULL ? " (" : "",
                    other != NULL ? other : "",
                    other != NULL ? " is not supported)" : "");
        goto out;
    }
    rc = take_pair(p, name, where, out, errbuf, errlen);
    if (rc != 0)
        goto out;
    if (asprintf(&out->credentials_source, "profile '%s' in %s", name,
                 where) < 0) {
        out->credentials_source = NULL;
        rc = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
    }
out:
    return rc;
}

/* -o credentials_file=PATH: profile NAME of that file (P). */
static int file_creds(const char *path, const char *name, struct prof *p,
                      struct awsconfig *out, char *errbuf, size_t errlen)
{
    char *where = NULL;
    int rc;

    rc = load_profile(path, NULL, false, true, name, p, errbuf, errlen);
    if (rc != 0)
        goto out;
    if (!p->found) {
        rc = ENOENT;
        text_set_err(errbuf, errlen, "profile '%s' not found in credentials "
                "file %s", name, path);
        goto out;
    }
    if (!has_key(p)) {
        rc = ENOENT;
        text_set_err(errbuf, errlen, "profile '%s' in credentials file %s has no "
                "aws_access_key_id and aws_secret_access_key", name, path);
        goto out;
    }
    if (asprintf(&where, "credentials file %s", path) < 0) {
        where = NULL;
        rc = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
        goto out;
    }
    rc = take_pair(p, name, where, out, errbuf, errlen);
    if (rc != 0)
        goto out;
    if (asprintf(&out->credentials_source, "credentials file %s "
                 "(profile '%s')", path, name) < 0) {
        out->credentials_source = NULL;
        rc = ENOMEM;
        text_set_err(errbuf, errlen, "out of memory");
    }
out:
    free(where);
    return rc;
}

int awsconfig_resolve(const struct awsconfig_options *opts,
                      struct awsconfig *out, char *errbuf, size_t errlen)
{
    const struct awsconfig_options none = { 0 };
    struct prof credp = { 0 }, cfgp = { 0 }, filep = { 0 };
    char *cred_path = NULL, *cfg_path = NULL;
    const char *cred_var, *cfg_var, *home, *profile, *from, *v;
    const char *cred_disp, *cfg_disp;
    bool took = false;
    int rc;

    if (errbuf != NULL && errlen > 0)
        errbuf[0] = '\0';
    if (out == NULL) {
        rc = EINVAL;
        text_set_err(errbuf, errlen, "awsconfig_resolve: no output struct");
        goto out;
    }
    memset(out, 0, sizeof *out);
    if (opts == NULL)
        opts = &none;

    profile = nonempty(opts->profile);
    from = "-o profile";
    if (profile == NULL) {
        profile = env_get("AWS_PROFILE");
        from = "AWS_PROFILE";
    }
    if (profile == NULL) {
        profile = "default";
        from = NULL;
    }
    home = nonempty(opts->home);
    if (home == NULL)
        home = env_get("HOME");
    rc = shared_path("AWS_SHARED_CREDENTIALS_FILE", home, "credentials",
                     &cred_path, &cred_var);
    if (rc == 0)
        rc = shared_path("AWS_CONFIG_FILE", home, "config", &cfg_path,
                         &cfg_var);
    if (rc != 0) {
        text_set_err(errbuf, errlen, "out of memory");
        goto out;
    }
    cred_disp = cred_path != NULL ? cred_path
                                  : "~/.aws/credentials (HOME is not set)";
    cfg_disp = cfg_path != NULL ? cfg_path
                                : "~/.aws/config (HOME is not set)";

    rc = load_profile(cfg_path, cfg_var, true, false, profile, &cfgp, errbuf,
                      errlen);
    if (rc != 0)
        goto out;

    if (opts->no_sign) {
        out->credentials_source = strdup("none (no_sign)");
        if (out->credentials_source == NULL)
            rc = ENOMEM;
    } else if (nonempty(opts->credentials_file) != NULL) {
        rc = file_creds(opts->credentials_file, profile, &filep, out, errbuf,
                        errlen);
    } else {
        rc = load_profile(cred_path, cred_var, false, false, profile, &credp,
                          errbuf, errlen);
        if (rc != 0)
            goto out;
        if (from != NULL && !credp.found && !cfgp.found) {
            rc = ENOENT;
            text_set_err(errbuf, errlen, "profile '%s' (%s) not found in %s or %s",
                    profile, from, cred_disp, cfg_disp);
            goto out;
        }
        if (opts->profile == NULL || *opts->profile == '\0')
            rc = env_creds(out, &took, errbuf, errlen);
        if (rc == 0 && !took)
            rc = profile_creds(profile, from, &credp, cred_disp, &cfgp,
                               cfg_disp, opts->allow_no_credentials, out,
                               errbuf, errlen);
    }
    if (rc != 0)
        goto out;

    v = nonempty(opts->region);
    if (v == NULL)
        v = env_get("AWS_REGION");
    if (v == NULL)
        v = env_get("AWS_DEFAULT_REGION");
    if (v == NULL)
        v = cfgp.val[K_REGION];
    if (v == NULL)
        v = AWSCFG_DEFAULT_REGION;
    out->region = strdup(v);

    v = nonempty(opts->endpoint);
    if (v == NULL)
        v = env_get("AWS_ENDPOINT_URL_S3");
    if (v == NULL)
        v = env_get("AWS_ENDPOINT_URL");
    if (v == NULL)
        v = cfgp.val[K_ENDPOINT];
    out->endpoint = v != NULL ? strdup(v) : NULL;

    if (credp.found || cfgp.found || filep.found)
        out->profile = strdup(profile);

    if (out->region == NULL || (v != NULL && out->endpoint == NULL) ||
        ((credp.found || cfgp.found || filep.found) && out->profile == NULL))
        rc = ENOMEM;
    if (!opts->no_sign && out->access_key == NULL &&
        nonempty(opts->credentials_file) == NULL) {
        v = cfgp.val[K_PROCESS] != NULL ? cfgp.val[K_PROCESS]
                                        : credp.val[K_PROCESS];
        if (v != NULL && (out->credential_process = strdup(v)) == NULL)
            rc = ENOMEM;
    }
    v = cfgp.val[K_EC2_ENDPOINT];
    if (v != NULL && (out->ec2_metadata_endpoint = strdup(v)) == NULL)
        rc = ENOMEM;
out:
    if (rc == ENOMEM && errbuf != NULL && errlen > 0 && errbuf[0] == '\0')
        text_set_err(errbuf, errlen, "out of memory");
    if (rc != 0)
        awsconfig_clear(out);
    prof_clear(&credp);
    prof_clear(&cfgp);
    prof_clear(&filep);
    free(cred_path);
    free(cfg_path);
    return rc;
}

void awsconfig_clear(struct awsconfig *cfg)
{
    if (cfg == NULL)
        return;
    free_secret(&cfg->access_key);
    free_secret(&cfg->secret_key);
    free_secret(&cfg->session_token);
    free_secret(&cfg->region);
    free_secret(&cfg->endpoint);
    free_secret(&cfg->profile);
    free_secret(&cfg->credentials_source);
    free_secret(&cfg->credential_process);
    free_secret(&cfg->ec2_metadata_endpoint);
    memset(cfg, 0, sizeof *cfg);
}
