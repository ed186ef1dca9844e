/*
 * tier_cmd.c - `s3cachefs shared-cache prune` (see
 * tier_cmd.h): two walks over the tier's blocks, the first to
 * count its versions (tier_prune.h chooses), the second to delete the
 * chosen ones' objects; memory grows with the versions, not the blocks.
 */
#include "config.h"

#include "cmd/tier_cmd.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "cmd/args.h"
#include "cmd/options.h"
#include "cmd/stats_report.h"
#include "creds/awsconfig.h"
#include "creds/credentials.h"
#include "creds/credsource.h"
#include "s3/s3.h"
#include "s3/s3walk.h"
#include "tier/tier_prune.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

struct args {
    bool help;
    bool dry_run;
    const char *source;          /* BUCKET[:PREFIX] */
    const char *endpoint, *region, *profile;
    double older_than;           /* seconds; 0: no age limit */
    const char *older_than_text;
    uint64_t max_size;           /* bytes; 0: no size limit */
    const char *max_size_text;
};

static const char help[] =
"usage: s3cachefs shared-cache prune [OPTIONS] BUCKET[:PREFIX]\n"
"\n"
"Delete blocks of the shared cache (-o shared_cache=BUCKET[:PREFIX]) that\n"
"were written long ago, or the oldest beyond a size. A version of a file\n"
"goes whole; nodes read what is gone from the origin again.\n"
"\n"
"  --older-than AGE   versions written more than AGE ago (30d, 12h, 45m,\n"
"                     90s, or seconds)\n"
"  --max-size SIZE    then the oldest, until at most SIZE is left (500G)\n"
"  --dry-run          say what would go, delete nothing\n"
"  --endpoint URL     the tier's S3 endpoint (default: AWS, or the\n"
"                     profile's endpoint_url)\n"
"  --region NAME      its signing region\n"
"  --profile NAME     credentials from this profile (default: the\n"
"                     environment, then ~/.aws)\n"
"  -h, --help         this help\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "s3cachefs shared-cache: %s%s%s%s (see s3cachefs "
            "shared-cache --help)\n", what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "");
    return EXIT_USAGE;
}

/* "30d", "12h", "45m", "90s", "3600" -> seconds (> 0). */
static int parse_age(const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    double unit = 1;

    if (errno != 0 || end == text || !(value > 0))
        return EINVAL;
    if (*end != '\0') {
        switch (*end) {
        case 'd': unit = 86400; break;
        case 'h': unit = 3600; break;
        case 'm': unit = 60; break;
        case 's': unit = 1; break;
        default: return EINVAL;
        }
        if (end[1] != '\0')
            return EINVAL;
    }
    *out = value * unit;
    return 0;
}

bool tier_cmd_requested(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "shared-cache") != 0)
        return false;
    return argc == 2 || strcmp(argv[2], "prune") == 0 ||
           strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0;
}

static int parse_args(int argc, char **argv, struct args *args)
{
    *args = (struct args){0};
    if (argc < 3 || strcmp(argv[2], "prune") != 0) {
        if (argc >= 3 && (strcmp(argv[2], "-h") == 0 ||
                          strcmp(argv[2], "--help") == 0)) {
            args->help = true;
            return EXIT_OK;
        }
        return usage_error("the command is 'prune'", argc >= 3 ? argv[2] : NULL);
    }
    for (int i = 3; i < argc; i++) {
        const char *arg = argv[i], *value;
        bool missing = false;
        if (arg[0] != '-') {
            if (args->source != NULL)
                return usage_error("one BUCKET[:PREFIX] only", arg);
            args->source = arg;
        } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            args->help = true;
        } else if (strcmp(arg, "--dry-run") == 0) {
            args->dry_run = true;
        } else if ((value = args_value(argv, argc, &i, "--older-than",
                                       &missing)) != NULL || missing) {
            if (missing || parse_age(value, &args->older_than) != 0)
                return usage_error("--older-than wants an age such as 30d, "
                                   "12h or 3600", missing ? NULL : value);
            args->older_than_text = value;
        } else if ((value = args_value(argv, argc, &i, "--max-size",
                                       &missing)) != NULL || missing) {
            if (missing || options_parse_size(value, &args->max_size) != 0 ||
                args->max_size == 0)
                return usage_error("--max-size wants a size such as 500G",
                                   missing ? NULL : value);
            args->max_size_text = value;
        } else if ((value = args_value(argv, argc, &i, "--endpoint",
                                       &missing)) != NULL || missing) {
            if (missing)
                return usage_error("--endpoint wants a URL", NULL);
            args->endpoint = value;
        } else if ((value = args_value(argv, argc, &i, "--region",
                                       &missing)) != NULL || missing) {
            if (missing)
                return usage_error("--region wants a name", NULL);
            args->region = value;
        } else if ((value = args_value(argv, argc, &i, "--profile",
                                       &missing)) != NULL || missing) {
            if (missing)
                return usage_error("--profile wants a name", NULL);
            args->profile = value;
        } else {
            return usage_error("unknown option", arg);
        }
    }
    if (args->help)
        return EXIT_OK;
    if (args->source == NULL)
        return usage_error("no BUCKET[:PREFIX] of a shared cache", NULL);
    if (args->older_than == 0 && args->max_size == 0)
        return usage_error("say what goes: --older-than AGE, --max-size SIZE "
                           "or both", NULL);
    return EXIT_OK;
}

/* The tier's bucket and the root of its blocks ("PREFIX/" TIER_ROOT). */
static int split_source(const char *source, char **bucket, char **root)
{
    const char *colon = strchr(source, ':');
    size_t bucket_len = colon ? (size_t)(colon - source) : strlen(source);
    const char *prefix = colon ? colon + 1 : "";
    size_t prefix_len = strlen(prefix);

    while (*prefix == '/') {
        prefix++;
        prefix_len--;
    }
    while (prefix_len > 0 && prefix[prefix_len - 1] == '/')
        prefix_len--;
    *bucket = strndup(source, bucket_len);
    if (asprintf(root, "%.*s%s%s", (int)prefix_len, prefix,
                 prefix_len > 0 ? "/" : "", TIER_ROOT) < 0)
        *root = NULL;
    if (*bucket == NULL || *root == NULL || bucket_len == 0)
        return bucket_len == 0 ? EINVAL : ENOMEM;
    return 0;
}

struct client {
    struct awsconfig aws;
    struct credentials *creds;
    struct s3_client *s3;
};

static int client_open(const struct args *args, const char *bucket,
                       struct client *client)
{
    struct awsconfig_options opts = {
        .profile = args->profile,
        .region = args->region,
        .endpoint = args->endpoint,
        .allow_no_credentials = true,
    };
    char why[384];
    struct credentials_source source;

    if (awsconfig_resolve(&opts, &client->aws, why, sizeof(why)) != 0) {
        fprintf(stderr, "s3cachefs shared-cache: %s\n", why);
        return EXIT_FAILED;
    }
    struct credsource_conf source_conf = {.aws = &client->aws};
    if (credsource_choose(&source_conf, &source, why, sizeof(why)) != 0 ||
        credentials_create(&source, NULL, &client->creds, why, sizeof(why)) != 0) {
        fprintf(stderr, "s3cachefs shared-cache: cannot get credentials: %s\n",
                why);
        return EXIT_FAILED;
    }
    struct s3_conf conf = {
        .endpoint = client->aws.endpoint,
        .region = client->aws.region,
        .bucket = bucket,
        .credentials = client->creds,
        .max_connections = 4,
        .max_retries = 5,
    };
    why[0] = '\0';
    if (s3_client_create(&conf, &client->s3, why, sizeof(why)) != 0) {
        fprintf(stderr, "s3cachefs shared-cache: %s\n",
                why[0] ? why : "cannot create the S3 client");
        return EXIT_FAILED;
    }
    return EXIT_OK;
}

static void client_close(struct client *client)
{
    s3_client_destroy(&client->s3);
    credentials_destroy(&client->creds);
    awsconfig_clear(&client->aws);
}

/* Visit every object under ROOT; VISIT returns 0 or an errno that stops
 * the walk. 0 or the errno. */
static int walk(struct s3_client *s3, const char *root,
                int (*visit)(void *arg, const struct s3xml_object *object),
                void *arg)
{
    struct s3walk state = {0};
    int err = 0;

    while (err == 0 && !state.done) {
        struct s3xml_listing page = {0};
        err = s3walk_next(s3, &state, root, NULL, 1000, &page);
        for (size_t i = 0; err == 0 && i < page.object_count; i++)
            err = visit(arg, &page.objects[i]);
        s3xml_listing_free(&page);
    }
    s3walk_clear(&state);
    return err;
}

struct pass {
    struct s3_client *s3;
    struct tier_prune *prune;
    size_t root_len;
    uint64_t deleted, deleted_bytes, failed;
};

static int count_object(void *arg, const struct s3xml_object *object)
{
    struct pass *pass = arg;
    double mtime = (double)object->mtime.tv_sec + object->mtime.tv_nsec / 1e9;

    return tier_prune_add(pass->prune, object->key + pass->root_len,
                          object->size, mtime);
}

static int delete_object(void *arg, const struct s3xml_object *object)
{
    struct pass *pass = arg;

    if (!tier_prune_chosen(pass->prune, object->key + pass->root_len))
        return 0;
    if (s3_delete_object(pass->s3, object->key) != 0) {
        pass->failed++;     /* (logged by the client) */
        return 0;
    }
    pass->deleted++;
    pass->deleted_bytes += object->size;
    return 0;
}

static int prune(const struct args *args)
{
    struct tier_prune chosen = {0};
    struct client client = {0};
    char *bucket = NULL, *root = NULL;
    char size[32], going[32];
    int status = EXIT_FAILED;

    if (split_source(args->source, &bucket, &root) != 0) {
        free(bucket);
        free(root);
        return usage_error("expected BUCKET[:PREFIX]", args->source);
    }
    if (client_open(args, bucket, &client) != EXIT_OK)
        goto out;
    struct pass pass = {.s3 = client.s3, .prune = &chosen,
                        .root_len = strlen(root)};
    int err = walk(client.s3, root, count_object, &pass);
    if (err != 0) {
        fprintf(stderr, "s3cachefs shared-cache: cannot list %s/%s: %s\n",
                bucket, root, strerror(err));
        goto out;
    }
    tier_prune_choose(&chosen, clock_wall_seconds(), args->older_than,
                      args->max_size);
    uint64_t total = 0, objects = 0, gone = 0, gone_objects = 0, gone_versions = 0;
    for (size_t i = 0; i < chosen.count; i++) {
        const struct tier_prune_version *version = chosen.versions[i];
        total += version->bytes;
        objects += version->objects;
        if (version->chosen) {
            gone += version->bytes;
            gone_objects += version->objects;
            gone_versions++;
        }
    }
    stats_report_format_bytes(total, size, sizeof(size));
    stats_report_format_bytes(gone, going, sizeof(going));
    printf("shared cache %s/%s: %zu versions, %llu blocks, %s\n", bucket, root,
           chosen.count, (unsigned long long)objects, size);
    printf("%s %llu versions, %llu blocks, %s (", args->dry_run ? "would prune"
           : "pruning", (unsigned long long)gone_versions,
           (unsigned long long)gone_objects, going);
    if (args->older_than_text != NULL)
        printf("written more than %s ago%s", args->older_than_text,
               args->max_size_text != NULL ? ", then " : "");
    if (args->max_size_text != NULL)
        printf("the oldest beyond %s", args->max_size_text);
    printf(")\n");
    if (args->dry_run || gone_objects == 0) {
        status = EXIT_OK;
        goto out;
    }
    err = walk(client.s3, root, delete_object, &pass);
    stats_report_format_bytes(pass.deleted_bytes, going, sizeof(going));
    printf("deleted %llu blocks, %s", (unsigned long long)pass.deleted, going);
    stats_report_format_bytes(total - pass.deleted_bytes, size, sizeof(size));
    printf("; %s left\n", size);
    if (err != 0 || pass.failed > 0) {
        fprintf(stderr, "s3cachefs shared-cache: %s%s%llu deletes failed; "
                "run it again\n", err != 0 ? "the listing failed: " : "",
                err != 0 ? strerror(err) : "", (unsigned long long)pass.failed);
        goto out;
    }
    status = EXIT_OK;
out:
    tier_prune_free(&chosen);
    client_close(&client);
    free(bucket);
    free(root);
    return status;
}

int tier_cmd_main(int argc, char **argv)
{
    struct args args;
    int status = parse_args(argc, argv, &args);

    if (status != EXIT_OK)
        return status;
    if (args.help) {
        fputs(help, stdout);
        return EXIT_OK;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "s3cachefs shared-cache: cannot initialise libcurl\n");
        return EXIT_FAILED;
    }
    status = prune(&args);
    curl_global_cleanup();
    return status;
}
