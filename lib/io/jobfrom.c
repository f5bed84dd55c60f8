/* --job-from: the job id and store from the instance's metadata. */
#include "io/jobfrom.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "core/util.h"
#include "io/http.h"
#include "io/http_once.h"

#define TIMEOUT_MS 2000
#define VALUE_MAX 1024

struct jf {
  struct spot_http *http;
  char base[512];
  char token[128];
  char *err;
  size_t errlen;
};

static void
trim(struct spot_buf *b)
{
  while (b->len > 0 &&
         (b->data[b->len - 1] == '\n' || b->data[b->len - 1] == '\r' ||
          b->data[b->len - 1] == ' '))
    b->data[--b->len] = '\0';
}

/* GET base+path. 0 with *val (malloc'ed), 1 on 404, or negative errno. */
static int
get(struct jf *j, const char *path, bool gcp, char **val)
{
  char url[768], tokhdr[200];
  const char *hdrs[1];
  struct spot_http_req req;
  struct spot_http_reply rep;
  int r;

  snprintf(url, sizeof(url), "%s%s", j->base, path);
  if (gcp)
    hdrs[0] = "Metadata-Flavor: Google";
  else
    snprintf(tokhdr, sizeof(tokhdr), "X-aws-ec2-metadata-token: %s", j->token);
  if (!gcp)
    hdrs[0] = tokhdr;
  memset(&req, 0, sizeof(req));
  req.method = "GET";
  req.url = url;
  req.headers = hdrs;
  req.n_headers = 1;
  req.timeout_ms = TIMEOUT_MS;
  req.max_reply = VALUE_MAX;
  req.no_proxy = true;
  r = spot_http_once(j->http, &req, &rep);
  explicit_bzero(tokhdr, sizeof(tokhdr));
  if (r < 0) {
    snprintf(j->err, j->errlen, "metadata service %s: %s", j->base, rep.error);
    spot_buf_fini(&rep.body);
    return -EHOSTUNREACH;
  }
  if (rep.status == 404) {
    spot_buf_fini(&rep.body);
    return 1;
  }
  if (rep.status != 200) {
    snprintf(j->err, j->errlen, "metadata service %s: GET %s: HTTP %ld",
             j->base, path, rep.status);
    spot_buf_fini(&rep.body);
    return rep.status == 401 || rep.status == 403 ? -EACCES : -EIO;
  }
  trim(&rep.body);
  *val = spot_buf_steal(&rep.body);
  if (*val == NULL)
    *val = strdup("");
  spot_buf_fini(&rep.body);
  return *val != NULL ? 0 : -ENOMEM;
}

static int
aws_token(struct jf *j)
{
  const char *hdrs[] = {"X-aws-ec2-metadata-token-ttl-seconds: 60"};
  struct spot_http_req req;
  struct spot_http_reply rep;
  char url[600];
  int r;

  snprintf(url, sizeof(url), "%s/latest/api/token", j->base);
  memset(&req, 0, sizeof(req));
  req.method = "PUT";
  req.url = url;
  req.headers = hdrs;
  req.n_headers = 1;
  req.timeout_ms = TIMEOUT_MS;
  req.max_reply = sizeof(j->token) - 1;
  req.no_proxy = true;
  r = spot_http_once(j->http, &req, &rep);
  if (r < 0 || rep.status != 200) {
    if (r < 0)
      snprintf(j->err, j->errlen, "instance metadata (IMDSv2) at %s: %s",
               j->base, rep.error);
    else
      snprintf(j->err, j->errlen,
               "instance metadata (IMDSv2) at %s: token: HTTP %ld", j->base,
               rep.status);
    spot_buf_fini(&rep.body);
    return r < 0 ? -EHOSTUNREACH : -EACCES;
  }
  trim(&rep.body);
  spot_strlcpy(j->token, spot_buf_str(&rep.body), sizeof(j->token));
  explicit_bzero(rep.body.data, rep.body.len);
  spot_buf_fini(&rep.body);
  return 0;
}

static int
from(struct jf *j, bool gcp, char **job, char **store)
{
  const char *pre = gcp ? "/computeMetadata/v1/instance/attributes/"
                        : "/latest/meta-data/tags/instance/";
  char path[128];
  int r;

  if (!gcp && (r = aws_token(j)) < 0)
    return r;
  snprintf(path, sizeof(path), "%s%s", pre, SPOT_JOB_FROM_TAG_JOB);
  r = get(j, path, gcp, job);
  if (r == 1) {
    snprintf(j->err, j->errlen,
             gcp ? "this instance has no metadata attribute spotd-job "
                   "(set it in the instance template's metadata)"
                 : "this instance has no tag spotd-job in its metadata "
                   "(tag the instance, and enable InstanceMetadataTags in "
                   "the launch template's metadata options)");
    return -ENOENT;
  }
  if (r < 0)
    return r;
  snprintf(path, sizeof(path), "%s%s", pre, SPOT_JOB_FROM_TAG_STORE);
  r = get(j, path, gcp, store);
  if (r == 1) {
    *store = NULL;
    r = 0;
  }
  if (r < 0) {
    free(*job);
    *job = NULL;
  }
  return r;
}

static void
set_base(struct jf *j, const char *base_url, bool gcp)
{
  const char *env;

  if (base_url != NULL)
    spot_strlcpy(j->base, base_url, sizeof(j->base));
  else if (!gcp && (env = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT")) &&
           env[0] != '\0')
    spot_strlcpy(j->base, env, sizeof(j->base));
  else if (!gcp)
    spot_strlcpy(j->base, "http://169.254.169.254", sizeof(j->base));
  else if ((env = getenv("GCE_METADATA_HOST")) != NULL && env[0] != '\0')
    snprintf(j->base, sizeof(j->base), "http://%s", env);
  else
    spot_strlcpy(j->base, "http://metadata.google.internal", sizeof(j->base));
  while (j->base[0] != '\0' && j->base[strlen(j->base) - 1] == '/')
    j->base[strlen(j->base) - 1] = '\0';
}

int
spot_job_from_resolve(enum spot_job_from mode, const char *base_url, char **job,
                      char **store, const char **where, char *err,
                      size_t errlen)
{
  struct jf j;
  uv_loop_t loop;
  int r;

  if (mode <= SPOT_JOB_FROM_NONE || mode >= SPOT_JOB_FROM_LAST) {
    snprintf(err, errlen, "job-from: nothing to resolve");
    return -EINVAL;
  }
  memset(&j, 0, sizeof(j));
  if (errlen > 0)
    err[0] = '\0';
  j.err = err;
  j.errlen = errlen;
  if ((r = uv_loop_init(&loop)) < 0) {
    snprintf(err, errlen, "event loop: %s", uv_strerror(r));
    return r;
  }
  r = spot_http_new(&loop, &j.http);
  if (r == 0 && mode != SPOT_JOB_FROM_GCP_METADATA) {
    set_base(&j, base_url, false);
    r = from(&j, false, job, store);
    if (r == 0)
      *where = "aws-tag";
  }
  if (j.http != NULL && (mode == SPOT_JOB_FROM_GCP_METADATA ||
                         (mode == SPOT_JOB_FROM_AUTO && r < 0))) {
    char first[256];

    spot_strlcpy(first, err, sizeof(first));
    set_base(&j, base_url, true);
    r = from(&j, true, job, store);
    if (r == 0)
      *where = "gcp-metadata";
    else if (mode == SPOT_JOB_FROM_AUTO) {
      char second[256];

      spot_strlcpy(second, err, sizeof(second));
      snprintf(err, errlen, "job-from auto: AWS: %s; GCP: %s", first, second);
    }
  }
  explicit_bzero(j.token, sizeof(j.token));
  if (j.http != NULL)
    spot_http_close(j.http, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  (void)uv_loop_close(&loop);
  return r;
}
