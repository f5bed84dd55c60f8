/* The AWS credential chain on a libuv loop: steps 1 and 2 of
 * aws_conf.h, then the instance role through IMDSv2 (aws_imds.c). */
#ifndef SPOT_AWS_H
#define SPOT_AWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/aws_conf.h"
#include "io/http.h"
#include "io/s3.h"

/* ---- Async: the whole chain on a libuv loop ---- */

struct spot_aws;

struct spot_aws_options {
  const char *endpoint; /* --endpoint, or NULL */
  const char *region;   /* --region, or NULL */
  const char *profile;  /* NULL: $AWS_PROFILE, else "default" */
  /* NULL: $AWS_EC2_METADATA_SERVICE_ENDPOINT, else SPOT_AWS_IMDS_URL */
  const char *imds_url;
  bool imds_disabled;   /* also disabled by AWS_EC2_METADATA_DISABLED=true */
  long imds_timeout_ms; /* connect and whole request; 0 = 2000 */
};

/* err is 0 or a negative errno (-ENOKEY: no credentials anywhere,
 * -ECANCELED: closed before the end); msg is one line ("" on success),
 * borrowed for the duration of the call. */
typedef void (*spot_aws_ready_cb)(int err, const char *msg, void *data);
typedef void (*spot_aws_close_cb)(void *data);

/* http may be NULL when IMDS is not wanted. Options are copied. Returns 0
 * or -ENOMEM / -EINVAL (bad imds_url). */
int spot_aws_new(uv_loop_t *loop, struct spot_http *http,
                 const struct spot_aws_options *opts, struct spot_aws **out);
/* Runs the chain, region and endpoint resolution. Returns 0, then cb runs
 * exactly once from the loop (never from inside this call), or -EALREADY
 * when already started (cb never runs). Once cb reported 0 the accessors
 * below are valid and, for IMDS credentials, a refresh timer keeps them
 * fresh until spot_aws_close(). */
int spot_aws_start(struct spot_aws *aws, spot_aws_ready_cb cb, void *data);

/* For spot_s3_config.creds. get() returns the last good credentials
 * (stale ones rather than none while a refresh is failing: IMDS keeps
 * serving them and S3 answers with a clear ExpiredToken if it comes to
 * that), or -ENOKEY before the chain found any. */
struct spot_creds_provider *spot_aws_creds_provider(struct spot_aws *aws);
const char *spot_aws_region(const struct spot_aws *aws);
const char *spot_aws_endpoint(const struct spot_aws *aws);
bool spot_aws_path_style(const struct spot_aws *aws);
enum spot_aws_source spot_aws_source(const struct spot_aws *aws);
/* Successful IMDS credential refreshes since start (tests, status). */
unsigned spot_aws_refresh_count(const struct spot_aws *aws);
/* Fills endpoint, region, path_style and creds of an S3 config (borrowed
 * from aws: keep aws alive as long as the S3 client). */
void spot_aws_s3_config(struct spot_aws *aws, struct spot_s3_config *cfg);

/* Cancels a request in flight (the ready callback, if still due, runs with
 * -ECANCELED before this returns), stops the refresh timer and frees aws
 * from the last close callback, then calls cb (may be NULL). Call it before
 * spot_http_close() of the http it uses. Safe on NULL (cb is not called). */
void spot_aws_close(struct spot_aws *aws, spot_aws_close_cb cb, void *data);

#endif
