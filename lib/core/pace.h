/* How many transfers a push or a restore keeps in flight: a pure
 * controller (no I/O, no clock of its own) fed with samples by the store.
 *
 * It starts at `start`, measures each window (at least window_ms and a
 * few finished transfers), and
 *   - grows (+50 %, at least +4; x2 when the last step gained 30 % or
 *     more) while the aggregate rate gains at least 10 % per step, both
 *     as measured and as estimated (below), and the transfers are the
 *     bottleneck (nearly always `limit` in flight: a pipe short of parts,
 *     CPU-bound, is not helped by more connections);
 *   - goes back to the previous limit and holds when a step gained less
 *     (a plateau), probing one step up again every SPOT_PACE_PROBE
 *     windows;
 *   - halves on throttling (503 SlowDown, 429, RequestTimeout: the S3
 *     client counts them), at most once per window, and then holds;
 *   - with target_bps, jumps after the first window to the concurrency the
 *     measured per-connection rate says reaches the target, and stops
 *     growing once the target is reached;
 *   - never goes above max (what the memory budget fits) nor below min.
 *
 * The estimate is Little's law: the average number in flight times the
 * per-transfer rate (bytes of the transfers finished in the window over
 * the time they took): the connections just added count at once, with
 * the rate their peers get, where bytes finished per second lag a change.
 * It overrates a busy server (the transfers finishing in a short window
 * are its quick ones), hence both figures. After a change the next window
 * starts one mean transfer time later, so that the transfers it measures
 * ran under the new limit. */
#ifndef SPOT_PACE_H
#define SPOT_PACE_H

#include <stdbool.h>
#include <stdint.h>

#define SPOT_PACE_START 8       /* default first limit */
#define SPOT_PACE_MIN 2         /* default floor */
#define SPOT_PACE_WINDOW_MS 100 /* default shortest window */
#define SPOT_PACE_WINDOW_MAX_MS 5000
#define SPOT_PACE_PROBE 16 /* windows held before probing up again */
#define SPOT_PACE_COOL 8   /* windows after a cut before probing */

struct spot_pace_config {
  unsigned start;      /* 0 = SPOT_PACE_START (capped to max) */
  unsigned min;        /* 0 = SPOT_PACE_MIN (capped to max) */
  unsigned max;        /* what the memory budget fits; 0 = 1 */
  uint64_t target_bps; /* aggregate bytes/s to reach; 0 = as fast as it goes */
  uint64_t window_ms;  /* 0 = SPOT_PACE_WINDOW_MS */
  bool fixed;          /* the limit stays start: no adaptation */
};

/* Cumulative figures at one instant; the controller takes differences. */
struct spot_pace_sample {
  uint64_t now_ms;    /* monotonic */
  uint64_t bytes;     /* bytes of finished transfers */
  uint64_t done;      /* finished transfers */
  uint64_t busy_ms;   /* the sum of their durations (start to end) */
  uint64_t throttled; /* throttled responses (503 SlowDown, 429, ...) */
  unsigned inflight;  /* transfers in flight now */
};

enum spot_pace_state {
  SPOT_PACE_GROW = 0,
  SPOT_PACE_HOLD,
  SPOT_PACE_STATE_LAST,
};

struct spot_pace {
  struct spot_pace_config c;
  enum spot_pace_state state;
  unsigned limit, prev_limit;
  const char *why; /* the reason of the last change, for a log line */
  bool started;
  bool target_reached;
  bool cut_window; /* this window began with a cut: throttles ignored */
  unsigned held;   /* windows held since the last change */
  /* the window: figures at its start */
  uint64_t w_start_ms, w_bytes, w_done, w_busy_ms;
  uint64_t throttled; /* the last count seen */
  uint64_t last_ms;   /* the previous sample, for the average in flight */
  double w_inflight_ms;
  unsigned w_inflight_last;
  uint64_t xfer_ms;         /* a transfer's mean duration, last window */
  uint64_t settle_until_ms; /* no window before this (after a change) */
  double est_bps;           /* the baseline window's Little's law estimate */
  double base_rate_bps;     /* and its measured rate (0: no baseline yet) */
  double rate_bps;          /* the last window's bytes per second, measured */
};

void spot_pace_init(struct spot_pace *p, const struct spot_pace_config *c);
/* Feeds one sample (now_ms never decreasing). Returns true when the limit
 * changed: spot_pace_limit() and p->why say to what and why. */
bool spot_pace_sample(struct spot_pace *p, const struct spot_pace_sample *s);

static inline unsigned
spot_pace_limit(const struct spot_pace *p)
{
  return p->limit;
}

/* The concurrency that reaches target_bps at conn_bps per connection
 * (rounded up), within [1, max]. */
unsigned spot_pace_for_rate(uint64_t target_bps, double conn_bps, unsigned max);

const char *spot_pace_state_name(enum spot_pace_state s);

#endif
