/* The store check before the trainer starts: spotd writes, reads back and
 * deletes a tiny probe object under the job root. A bucket typo, missing
 * permissions or a wrong endpoint would otherwise only show at the first
 * upload, after training from scratch. One line says what is wrong and
 * spotd exits 69 (SPOTD_EXIT_UNAVAILABLE).
 *
 * Part of the startup (startup.c): PUT -> GET -> DELETE, then
 * restore_probed(). After close its callbacks do nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "probe.h"
#include "startup.h"
#include "spotd.h"
#include "core/util.h"

#define PROBE_BODY "spotd store check\n"

static const char *
hint(const struct spot_s3_result *res)
{
  if (strcmp(res->s3_code, "NoSuchBucket") == 0)
    return "the bucket does not exist: check --store";
  if (spot_s3_bad_credentials(res))
    return "the credentials are wrong (a wrong secret key, an unknown or "
           "disabled access key id, or an expired session token): check "
           "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the profile or the "
           "instance role";
  if (res->err == -EACCES)
    return "access denied: spotd needs s3:PutObject, s3:GetObject and "
           "s3:DeleteObject under the job root (check the credentials and "
           "the bucket policy)";
  if (strcmp(res->s3_code, "PermanentRedirect") == 0 ||
      strcmp(res->s3_code, "AuthorizationHeaderMalformed") == 0)
    return "wrong region: check --region";
  if (res->http_status == 0)
    return "the endpoint cannot be reached: check --endpoint and --region";
  return "check --store, --endpoint, --region and the credentials";
}

static void
probe_fail(struct spotd *d, const char *step, const struct spot_s3_result *res)
{
  char tmp[512];

  log_err("the store %s cannot be used (%s of a probe object: %s): %s",
          d->store_url, step, spot_s3_strerror(res, tmp, sizeof(tmp)),
          hint(res));
  restore_probed(d, -EIO);
}

static void
delete_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  d->restore.s3op = NULL;
  if (d->closing)
    return;
  if (res->err < 0 || res->n_failed_keys > 0) {
    probe_fail(d, "DELETE", res);
    return;
  }
  log_info("store %s: write, read and delete work", d->store_url);
  restore_probed(d, 0);
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  const char *keys[1] = {d->restore.probe_key};
  bool same = res->err == 0 &&
              strcmp(spot_buf_str(&d->restore.probe_body), PROBE_BODY) == 0;

  d->restore.s3op = NULL;
  spot_buf_fini(&d->restore.probe_body);
  if (d->closing)
    return;
  if (res->err < 0) {
    probe_fail(d, "GET", res);
    return;
  }
  if (!same) {
    log_err("the store %s cannot be used: a probe object read back "
            "differs from what was written",
            d->store_url);
    restore_probed(d, -EIO);
    return;
  }
  if (spot_s3_delete_objects(d->s3, d->store.bucket, keys, 1, delete_cb, d,
                             &d->restore.s3op) < 0)
    restore_probed(d, -ENOMEM);
}

static void
put_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  int64_t skew;

  d->restore.s3op = NULL;
  if (d->closing)
    return;
  if (res->err < 0) {
    probe_fail(d, "PUT", res);
    return;
  }
  skew = spot_s3_clock_skew_ms(res);
  if (llabs(skew) > 1000)
    log_warn("clock: this node's clock is %.1f s %s S3's (by its Date "
             "header): leases allow %.1f s by default; fix the clock (NTP, "
             "chrony)",
             (double)llabs(skew) / 1000.0, skew > 0 ? "ahead of" : "behind",
             SPOT_LEASE_GRACE_DEFAULT_MS / 1000.0);
  spot_buf_init(&d->restore.probe_body, 256);
  if (spot_s3_get(d->s3, d->store.bucket, d->restore.probe_key, 0, 0, NULL,
                  &d->restore.probe_body, get_cb, d, &d->restore.s3op) < 0) {
    spot_buf_fini(&d->restore.probe_body);
    restore_probed(d, -ENOMEM);
  }
}

void
probe_start(struct spotd *d)
{
  char rel[128];

  snprintf(rel, sizeof(rel), ".spotd-probe-%d-%08x", (int)getpid(),
           spot_random_u32());
  free(d->restore.probe_key);
  d->restore.probe_key = spot_store_key_dup(&d->store, NULL, rel);
  if (d->restore.probe_key == NULL ||
      spot_s3_put(d->s3, d->store.bucket, d->restore.probe_key, PROBE_BODY,
                  strlen(PROBE_BODY), 0, put_cb, d, &d->restore.s3op) < 0)
    restore_probed(d, -ENOMEM);
}

void
probe_fini(struct spotd *d)
{
  free(d->restore.probe_key);
  d->restore.probe_key = NULL;
}
