/* The metadata poller: watches the cloud's interruption notices on a
 * libuv loop through spot_http, and reports each notice once.
 *
 * AWS: IMDSv2 (token PUT, refreshed before expiry, one retry with a new
 * token on 401), polls spot/instance-action, events/recommendations/
 * rebalance, events/maintenance/scheduled (and optionally
 * autoscaling/target-lifecycle-state) every poll interval.
 * GCP: two concurrent long polls (instance/preempted and
 * instance/maintenance-event, wait_for_change + last_etag).
 * Azure: polls Scheduled Events (api-version 2020-07-01) for events whose
 * Resources name this VM; spot_meta_ack() approves an event.
 *
 * Errors never stop the poller: every failure (5xx, 429, reset, timeout,
 * garbage) is logged and retried with jittered backoff; after warn_after
 * consecutive failures of one request spot_meta_warning() returns a line
 * for `spotctl status` until that request succeeds again.
 *
 * Callback contract:
 * - every callback runs on the loop thread, never from inside an API call
 *   except spot_meta_close() (which runs pending ack callbacks with
 *   UV_ECANCELED before it returns);
 * - the notice passed to notice_cb is borrowed: copy what you keep;
 * - each notice (provider + id) is reported once per spot_meta;
 * - any callback may call spot_meta_close(); nothing runs after that
 *   except the close callback and cancelled acks' callbacks. */
#ifndef SPOT_META_H
#define SPOT_META_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "core/notice.h"
#include "io/http.h"

struct spot_meta;

typedef void (*spot_meta_notice_cb)(struct spot_meta *m,
                                    const struct spot_notice *n, void *data);
/* The provider was resolved (auto detection finished) or the warning was
 * set or cleared. Read spot_meta_provider() / spot_meta_warning(). */
typedef void (*spot_meta_status_cb)(struct spot_meta *m, void *data);
/* status: 0 when the service accepted the ack, else negative errno
 * (UV_ECANCELED when closed first, -EIO for an HTTP error). */
typedef void (*spot_meta_ack_cb)(int status, void *data);
typedef void (*spot_meta_close_cb)(void *data);

struct spot_meta_config {
  enum spot_provider provider;   /* AUTO, AWS, GCP, AZURE or NONE */
  const char *base_url;          /* NULL: the provider's link-local address */
  unsigned poll_interval_ms;     /* default 1000 */
  unsigned http_timeout_ms;      /* per request; default 2000 */
  unsigned probe_timeout_ms;     /* auto detection; default 500 */
  unsigned gcp_wait_sec;         /* long poll timeout_sec; default 60 */
  unsigned warn_after;           /* consecutive failures; default 5 */
  unsigned token_ttl_sec;        /* IMDSv2 token TTL, 1..21600; default 21600 */
  bool imdsv1_fallback;          /* go tokenless when the token PUT fails */
  bool aws_lifecycle;            /* also watch target-lifecycle-state */
  const char *vm_name;           /* Azure; NULL: ask IMDS compute/name */
  int64_t (*wall_now)(void);     /* NULL: spot_now_wall_ms (tests inject) */
  spot_meta_status_cb status_cb; /* optional; gets the same data as cb */
};

/* Fills the defaults (provider auto). */
void spot_meta_config_init(struct spot_meta_config *cfg);

/* http is borrowed and must outlive the meta. cfg's strings are copied.
 * Returns 0 or -EINVAL / -ENOMEM. Nothing runs until spot_meta_start(). */
int spot_meta_new(uv_loop_t *loop, struct spot_http *http,
                  const struct spot_meta_config *cfg, spot_meta_notice_cb cb,
                  void *data, struct spot_meta **out);
/* Starts detection (auto) or polling. 0 or negative errno. */
int spot_meta_start(struct spot_meta *m);
/* Cancels every request, closes every handle and frees m in the last
 * close callback, then calls cb (may be NULL). Legal in every state. */
void spot_meta_close(struct spot_meta *m, spot_meta_close_cb cb, void *data);

/* SPOT_PROVIDER_AUTO while detection runs; NONE if nobody answered. */
enum spot_provider spot_meta_provider(const struct spot_meta *m);
/* NULL when healthy, else one line describing the repeated failure. */
const char *spot_meta_warning(const struct spot_meta *m);
/* Approves an Azure scheduled event (StartRequests). Only call it once
 * the checkpoint is committed: the event then starts at once. 0 (cb will
 * run exactly once) or -ENOTSUP (not Azure), -EINVAL, -ECANCELED
 * (closing), -ENOMEM (cb never runs). */
int spot_meta_ack(struct spot_meta *m, const char *event_id,
                  spot_meta_ack_cb cb, void *data);

#endif
