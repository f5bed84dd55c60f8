/* What every command that talks to S3 opens: a loop, the HTTP client, the
 * AWS chain (credentials, region, endpoint) and an S3 client; and closes
 * them in order, requiring an empty loop at the end. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/s3url.h"
#include "core/util.h"
#include "io/store/store.h"
#include "spotctl.h"

static void
aws_ready_cb(int err, const char *msg, void *data)
{
  struct spotctl_s3 *c = data;

  c->aws_err = err;
  if (err < 0)
    snprintf(c->aws_msg, sizeof(c->aws_msg), "%s",
             msg != NULL && msg[0] != '\0' ? msg : strerror(-err));
  c->aws_done = true;
}

int
spotctl_s3_open_loop(struct spotctl_s3 *c, char *err, size_t errlen)
{
  int r;

  r = uv_loop_init(&c->loop);
  if (r < 0) {
    spot_set_err(err, errlen, "event loop: %s", uv_strerror(r));
    return r;
  }
  c->loop_ready = true;
  r = spot_http_new(&c->loop, &c->http);
  if (r < 0)
    spot_set_err(err, errlen, "HTTP client: %s", strerror(-r));
  return r;
}

int
spotctl_s3_open_aws(struct spotctl_s3 *c, const struct spotctl_s3_options *o,
                    char *err, size_t errlen)
{
  struct spot_aws_options ao;
  struct spot_s3_config sc;
  int r;

  memset(&ao, 0, sizeof(ao));
  ao.endpoint = o->endpoint;
  ao.region = o->region;
  ao.profile = o->profile;
  ao.imds_url = o->imds_url;
  r = spot_aws_new(&c->loop, c->http, &ao, &c->aws);
  if (r == 0)
    r = spot_aws_start(c->aws, aws_ready_cb, c);
  if (r < 0) {
    spot_set_err(err, errlen, "AWS settings: %s", strerror(-r));
    return r;
  }
  while (!c->aws_done && uv_run(&c->loop, UV_RUN_ONCE) != 0)
    ;
  if (!c->aws_done)
    c->aws_err = -EIO; /* the loop ran dry without an answer */
  if (c->aws_err < 0) {
    c->aws_failed = true;
    spot_set_err(err, errlen, "%s",
                 c->aws_msg[0] ? c->aws_msg : strerror(-c->aws_err));
    return c->aws_err;
  }
  memset(&sc, 0, sizeof(sc));
  spot_aws_s3_config(c->aws, &sc);
  sc.max_retries = o->max_retries;
  r = spot_s3_new(c->http, &sc, &c->s3);
  if (r < 0)
    spot_set_err(err, errlen, "S3 client: %s", strerror(-r));
  return r;
}

int
spotctl_s3_open(struct spotctl_s3 *c, const struct spotctl_s3_options *o)
{
  char err[600];

  if (spotctl_s3_open_loop(c, err, sizeof(err)) < 0 ||
      spotctl_s3_open_aws(c, o, err, sizeof(err)) < 0)
    return spotctl_fail("%s", err);
  return 0;
}

int
spotctl_s3_open_job(struct spotctl_s3 *c, const char *url,
                    const struct spotctl_s3_options *o,
                    struct spot_store_config *cfg)
{
  char err[256];
  int r;

  if (spot_s3_url_parse_job(url, &c->bucket, &c->prefix, &c->job, err,
                            sizeof(err)) < 0)
    return spotctl_usage("%s", err);
  r = spotctl_s3_open(c, o);
  if (r != 0 || cfg == NULL)
    return r;
  cfg->s3 = c->s3;
  cfg->bucket = c->bucket;
  cfg->prefix = c->prefix;
  cfg->job = c->job;
  return 0;
}

void
spotctl_s3_close(struct spotctl_s3 *c)
{
  int r;

  spot_s3_free(c->s3);
  c->s3 = NULL;
  if (c->aws != NULL)
    spot_aws_close(c->aws, NULL, NULL);
  c->aws = NULL;
  if (c->http != NULL)
    spot_http_close(c->http, NULL, NULL);
  c->http = NULL;
  if (c->loop_ready) {
    uv_run(&c->loop, UV_RUN_DEFAULT);
    r = uv_loop_close(&c->loop);
    if (r != 0)
      log_err("internal: event loop not empty at exit: %s", uv_strerror(r));
    c->loop_ready = false;
  }
  free(c->bucket);
  free(c->prefix);
  free(c->job);
  c->bucket = c->prefix = c->job = NULL;
}
