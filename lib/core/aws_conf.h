/* AWS credentials, region and endpoint, resolved the way the AWS SDKs do
 * (pure part: environment, profile files, endpoint rules, the IMDS JSON;
 * the async chain with IMDS is io/aws.h).
 *
 * Credentials, first found wins:
 *   1. environment: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY
 *      (+ AWS_SESSION_TOKEN);
 *   2. shared files for the profile (AWS_PROFILE, else "default"):
 *      AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials ([NAME] sections),
 *      then AWS_CONFIG_FILE or ~/.aws/config ([profile NAME], [default]);
 *      a setting in the credentials file beats the same one in the config
 *      file, and the key id and secret always come from the same file;
 *   3. the instance role through IMDSv2 (async, refreshed ahead of expiry;
 *      off when AWS_EC2_METADATA_DISABLED=true).
 * Region: --region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region,
 * then IMDS (placement/region). Endpoint: --endpoint, AWS_ENDPOINT_URL_S3,
 * AWS_ENDPOINT_URL, else https://s3.REGION.amazonaws.com. Custom endpoints
 * use path-style addressing (and region us-east-1 when none is set), AWS
 * uses virtual-host style. TLS verification cannot be turned off.
 *
 * Error messages (err, errlen out-parameters: filled on failure only) are
 * one line and never contain a secret key or a token. A missing file is
 * ignored only at its default path; a file named by AWS_SHARED_CREDENTIALS_FILE
 * or AWS_CONFIG_FILE must be readable.
 *
 * Profile files are parsed with inih; this module raises inih's process-wide
 * line limit to 16 KiB (heap buffer) so that session tokens fit. */
#ifndef SPOT_AWS_CONF_H
#define SPOT_AWS_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Credentials as S3 requests need them. */
struct spot_creds {
  char *access_key;
  char *secret_key;
  char *session_token; /* NULL when none */
  int64_t expires_ms;  /* wall clock, 0 = never */
};

#define SPOT_AWS_IMDS_URL "http://169.254.169.254"
#define SPOT_AWS_REGION_MAX 32    /* characters, without the NUL */
#define SPOT_AWS_ENDPOINT_MAX 512 /* characters, without the NUL */
#define SPOT_AWS_DEFAULT_CUSTOM_REGION "us-east-1"
/* The message when the whole chain came up empty. */
#define SPOT_AWS_NO_CREDS_MSG                                                  \
  "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "    \
  "a profile in ~/.aws/credentials, or run on an instance with a role"

enum spot_aws_source {
  SPOT_AWS_SOURCE_NONE,
  SPOT_AWS_SOURCE_ENV,
  SPOT_AWS_SOURCE_PROFILE,
  SPOT_AWS_SOURCE_IMDS,
  SPOT_AWS_SOURCE_LAST,
};

/* "none", "env", "profile", "imds". */
const char *spot_aws_source_name(enum spot_aws_source s);

/* explicit_bzero()s the secret and the token, frees every field and
 * zeroes the struct. Safe on NULL and on a zeroed struct. */
void spot_aws_creds_clear(struct spot_creds *c);
/* Deep copy; dst is overwritten (not cleared first). 0 or -ENOMEM. */
int spot_aws_creds_copy(const struct spot_creds *src, struct spot_creds *dst);

/* Steps 1 and 2 of the chain. profile NULL means $AWS_PROFILE, else
 * "default". Returns 0 with *out filled (clear it with
 * spot_aws_creds_clear) and *src set, 1 when neither the environment nor
 * the files hold credentials (the caller may try IMDS next; err then holds
 * SPOT_AWS_NO_CREDS_MSG for callers that will not), or a negative
 * errno with a message: -EINVAL half-set environment or bad value,
 * -ENOENT profile named explicitly but absent from both files, -ENOTSUP a
 * profile that needs a provider we lack (role_arn, sso, credential_process),
 * or the errno of an unreadable file. */
int spot_aws_creds_resolve_sync(const char *profile, struct spot_creds *out,
                                enum spot_aws_source *src, char *err,
                                size_t errlen);

/* Region without IMDS: opt_region (--region), AWS_REGION,
 * AWS_DEFAULT_REGION, the profile's region. Returns 0 and copies it into
 * out (size >= SPOT_AWS_REGION_MAX + 1), 1 when none is set, or a negative
 * errno (-EINVAL invalid region, or an unreadable config file). */
int spot_aws_region_resolve_sync(const char *opt_region, const char *profile,
                                 char *out, size_t outlen, char *err,
                                 size_t errlen);

/* [a-z0-9-], 1 to SPOT_AWS_REGION_MAX characters. */
bool spot_aws_region_valid(const char *region);

/* Checks an endpoint URL: http:// or https://, a host, an optional port,
 * no user or password, no path other than "/", no query or fragment.
 * Writes the normalised form (no trailing slash) into out when out is not
 * NULL. 0 or -EINVAL with a message. */
int spot_aws_endpoint_check(const char *url, char *out, size_t outlen,
                            char *err, size_t errlen);

/* Endpoint: opt_endpoint, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else the
 * regional AWS endpoint (region required then: -EINVAL when NULL). Sets
 * *path_style (true for custom endpoints) and *custom. 0 or -EINVAL. */
int spot_aws_endpoint_resolve(const char *opt_endpoint, const char *region,
                              char *out, size_t outlen, bool *path_style,
                              bool *custom, char *err, size_t errlen);
/* Whether opt_endpoint or the environment names a custom endpoint (no
 * validation). */
bool spot_aws_endpoint_is_custom(const char *opt_endpoint);

/* True when AWS_EC2_METADATA_DISABLED is "true" (any case). */
bool spot_aws_imds_disabled_by_env(void);

/* Parses the JSON of GET /latest/meta-data/iam/security-credentials/ROLE
 * (AccessKeyId, SecretAccessKey, Token, Expiration; Code must be "Success"
 * when present). Pure. 0 with *out filled, or -EINVAL with a message that
 * never quotes a key, secret or token (only Code or Expiration). */
int spot_aws_imds_creds_parse(const char *json, size_t len,
                              struct spot_creds *out, char *err, size_t errlen);

/* When to refresh credentials that expire at expires_ms (wall clock), seen
 * at now_ms: 5 minutes before expiry when more than 10 minutes are left,
 * else at half of what is left; never sooner than 1 s. Returns the delay
 * in milliseconds, or -1 when expires_ms is 0 (never expires). Pure. */
int64_t spot_aws_refresh_delay_ms(int64_t now_ms, int64_t expires_ms);

#endif
