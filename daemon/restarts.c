/* SPOTD_RESTART_COUNT: how many times this job was relaunched, kept in the
 * store as ROOT/RESTARTS ("N\n"). After a restore the count is fetched
 * (the trainer gets N + 1) and written back only once the trainer has
 * really started: a start that never launched it does not count. A fresh
 * job (nothing to restore) starts at 0 and writes nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "spotd.h"
#include "store_internal.h"
#include "util.h"

/* "N\n" -> N; -1 when it is not a count. */
static int64_t
parse_count(const char *s)
{
  char num[32];
  size_t len = spot_strlcpy(num, s, sizeof(num));
  int64_t n;

  if (len >= sizeof(num))
    len = sizeof(num) - 1;
  while (len > 0 &&
         (num[len - 1] == '\n' || num[len - 1] == '\r' || num[len - 1] == ' '))
    num[--len] = '\0';
  return spot_parse_int64(num, 0, INT32_MAX, &n) < 0 ? -1 : n;
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  int64_t n = 0;

  if (res->err == 0) {
    n = parse_count(spot_buf_str(&d->restarts.body));
    if (n < 0) {
      spotd_warn(d, "the store's RESTARTS is not a count: starting at 1");
      n = 0;
    }
  }
  spot_buf_fini(&d->restarts.body);
  if (d->closing)
    return;
  d->restarts.count = n + 1;
  d->restarts.fetched = true;
  restore_counted(d);
}

void
restarts_fetch(struct spotd *d)
{
  char *key = spot__store_key(&d->store, NULL, "RESTARTS");

  spot_buf_init(&d->restarts.body, 64);
  if (key == NULL || spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL,
                                 &d->restarts.body, get_cb, d, NULL) < 0) {
    spot_buf_fini(&d->restarts.body);
    d->restarts.count = 1;
    d->restarts.fetched = true;
    restore_counted(d);
  }
  free(key);
}

static void
put_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  if (res->err < 0 && res->err != -ECANCELED && !d->closing)
    spotd_warn(d, "cannot record the restart count in the store");
}

void
restarts_record(struct spotd *d)
{
  char *key, *buf = d->restarts.buf;

  if (!d->restarts.fetched)
    return;
  snprintf(buf, sizeof(d->restarts.buf), "%lld\n",
           (long long)d->restarts.count);
  key = spot__store_key(&d->store, NULL, "RESTARTS");
  if (key == NULL || spot_s3_put(d->s3, d->store.bucket, key, buf, strlen(buf),
                                 0, put_cb, d, NULL) < 0)
    spotd_warn(d, "cannot record the restart count in the store");
  free(key);
}
