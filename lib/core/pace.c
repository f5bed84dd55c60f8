/* The concurrency controller of push and restore (pace.h). */
#include "core/pace.h"

#include <string.h>

#include "core/fsm.h"
#include "core/log.h"

static const char *const pace_names[] = {
    [SPOT_PACE_GROW] = "grow",
    [SPOT_PACE_HOLD] = "hold",
};

/* GROW and HOLD may each follow the other (lib/core/fsm.h). */
static const uint32_t pace_legal[SPOT_PACE_STATE_LAST] = {
    [SPOT_PACE_GROW] = SPOT_FSM_BIT(SPOT_PACE_HOLD),
    [SPOT_PACE_HOLD] = SPOT_FSM_BIT(SPOT_PACE_GROW),
};

static const struct spot_fsm pace_fsm = {
    "pace", pace_names, SPOT_PACE_STATE_LAST, pace_legal, 0, SPOT_LOG_DEBUG};

const char *
spot_pace_state_name(enum spot_pace_state s)
{
  return spot_fsm_name(&pace_fsm, (unsigned)s);
}

#define set_state(p, s) set_state_at((p), (s), __FILE__, __LINE__)

static void
set_state_at(struct spot_pace *p, enum spot_pace_state s, const char *file,
             int line)
{
  if (spot_fsm_move(&pace_fsm, p->state, s, file, line) > 0)
    p->state = s;
}

unsigned
spot_pace_for_rate(uint64_t target_bps, double conn_bps, unsigned max)
{
  double k;

  if (max == 0)
    max = 1;
  if (target_bps == 0 || !(conn_bps > 0))
    return max;
  k = (double)target_bps / conn_bps;
  if (k >= (double)max)
    return max;
  if (k <= 1)
    return 1;
  return (unsigned)k + ((double)(unsigned)k < k); /* rounded up */
}

void
spot_pace_init(struct spot_pace *p, const struct spot_pace_config *c)
{
  memset(p, 0, sizeof(*p));
  p->c = *c;
  if (p->c.max == 0)
    p->c.max = 1;
  if (p->c.fixed)
    p->c.min = 1; /* a fixed count is what it is, 1 included */
  else if (p->c.min == 0)
    p->c.min = SPOT_PACE_MIN;
  if (p->c.min > p->c.max)
    p->c.min = p->c.max;
  if (p->c.start == 0)
    p->c.start = SPOT_PACE_START;
  if (p->c.start > p->c.max)
    p->c.start = p->c.max;
  if (p->c.start < p->c.min)
    p->c.start = p->c.min;
  if (p->c.window_ms == 0)
    p->c.window_ms = SPOT_PACE_WINDOW_MS;
  p->limit = p->prev_limit = p->c.start;
  p->state = p->c.fixed ? SPOT_PACE_HOLD : SPOT_PACE_GROW; /* initial state */
  p->why = "start";
}

static void
window_reset(struct spot_pace *p, const struct spot_pace_sample *s)
{
  p->w_start_ms = s->now_ms;
  p->w_bytes = s->bytes;
  p->w_done = s->done;
  p->w_busy_ms = s->busy_ms;
  p->w_inflight_ms = 0;
  p->last_ms = s->now_ms;
  p->w_inflight_last = s->inflight;
}

static bool
set_limit(struct spot_pace *p, unsigned n, const char *why)
{
  if (n > p->c.max)
    n = p->c.max;
  if (n < p->c.min)
    n = p->c.min;
  if (n == p->limit)
    return false;
  p->prev_limit = p->limit;
  p->limit = n;
  p->why = why;
  p->held = 0;
  /* The transfers finishing next began before the change: let one
   * transfer's time pass before the next window. */
  p->settle_until_ms = p->last_ms + p->xfer_ms;
  return true;
}

/* +50 %, at least +4. */
static unsigned
grow_step(unsigned n)
{
  unsigned a = n + 4, b = n + n / 2;

  return a > b ? a : b;
}

/* Whether x gained at least f over base (no base yet: yes). */
static bool
gained(double x, double base, double f)
{
  return base <= 0 || x >= base * f;
}

/* A window closed: little is Little's law's rate estimate, rate the
 * bytes finished per second, conn_bps the per-transfer rate, saturated
 * whether the limit was nearly always in flight. A step pays only when
 * both figures say so: Little's law overrates a busy server (the
 * transfers that finish in a short window are its quick ones), the rate
 * can lag a change (which only stops growth early, never late). */
static bool
window_end(struct spot_pace *p, double little, double conn_bps, double rate,
           bool saturated)
{
  const struct spot_pace_config *c = &p->c;
  double est = little < rate ? little : rate;
  bool pays, full;
  unsigned n;

  p->rate_bps = rate;
  if (c->target_bps > 0 && est >= (double)c->target_bps)
    p->target_reached = true;
  else if (c->target_bps > 0 && est < 0.8 * (double)c->target_bps)
    p->target_reached = false;
  if (p->state == SPOT_PACE_HOLD) {
    p->held++;
    if (p->held < SPOT_PACE_PROBE || !saturated || p->target_reached ||
        p->limit >= c->max)
      return false;
    set_state(p, SPOT_PACE_GROW);
    p->est_bps = little;
    p->base_rate_bps = rate;
    return set_limit(p, grow_step(p->limit), "probing");
  }
  if (p->target_reached) {
    set_state(p, SPOT_PACE_HOLD);
    p->held = 0;
    return false;
  }
  if (!saturated)
    return false; /* short of parts: no figure of this limit's worth */
  pays =
      gained(little, p->est_bps, 1.10) && gained(rate, p->base_rate_bps, 1.10);
  /* A step that paid almost in full (+30 % for +50 %): the connections
   * are what limits, double. */
  full = p->est_bps > 0 && gained(little, p->est_bps, 1.3) &&
         gained(rate, p->base_rate_bps, 1.3);
  p->est_bps = little;
  p->base_rate_bps = rate;
  if (!pays) {
    set_state(p, SPOT_PACE_HOLD);
    /* The last step did not pay: give its connections back. */
    return set_limit(p, p->prev_limit < p->limit ? p->prev_limit : p->limit,
                     "plateau");
  }
  n = full ? 2 * p->limit : grow_step(p->limit);
  if (c->target_bps > 0) {
    unsigned k = spot_pace_for_rate(c->target_bps, conn_bps, c->max);
    if (k > n)
      n = k;
  }
  if (!set_limit(p, n,
                 c->target_bps > 0 ? "growing to the target" : "growing")) {
    set_state(p, SPOT_PACE_HOLD); /* at the budget's limit */
    p->held = 0;
    return false;
  }
  return true;
}

bool
spot_pace_sample(struct spot_pace *p, const struct spot_pace_sample *s)
{
  uint64_t elapsed, dt, d_done, d_bytes, d_busy, need;
  double avg, conn_bps, rate;
  bool saturated;

  if (p->c.fixed)
    return false;
  if (!p->started) {
    p->started = true;
    p->throttled = s->throttled;
    window_reset(p, s);
    return false;
  }
  if (s->now_ms > p->last_ms) {
    dt = s->now_ms - p->last_ms;
    p->w_inflight_ms += (double)dt * p->w_inflight_last;
    p->last_ms = s->now_ms;
  }
  p->w_inflight_last = s->inflight;
  if (s->throttled > p->throttled) {
    p->throttled = s->throttled;
    /* Throttles answered in the window a cut began were mostly asked for
     * before it: one cut per window. */
    if (!p->cut_window) {
      bool changed = set_limit(p, p->limit / 2, "throttled");

      set_state(p, SPOT_PACE_HOLD);
      p->held = 0;
      p->est_bps = 0;
      p->base_rate_bps = 0;
      p->cut_window = true;
      window_reset(p, s);
      return changed;
    }
  }
  if (s->now_ms < p->settle_until_ms) {
    window_reset(p, s);
    return false;
  }
  elapsed = s->now_ms - p->w_start_ms;
  d_done = s->done - p->w_done;
  need = p->limit / 2 < 2 ? 2 : p->limit / 2;
  if (elapsed < p->c.window_ms ||
      (d_done < need && elapsed < SPOT_PACE_WINDOW_MAX_MS))
    return false;
  d_bytes = s->bytes - p->w_bytes;
  d_busy = s->busy_ms - p->w_busy_ms;
  avg = p->w_inflight_ms / (double)elapsed;
  /* Transfers, not parts, are short when the limit is nearly always in
   * flight (a completion leaves a gap until the next part is sent). */
  saturated = avg >= 0.8 * (double)p->limit;
  p->cut_window = false;
  window_reset(p, s);
  if (d_done == 0 || d_bytes == 0)
    return false; /* nothing finished in 5 s: no figure */
  p->xfer_ms = d_busy / d_done;
  conn_bps = (double)d_bytes * 1000.0 / (double)(d_busy > 0 ? d_busy : 1);
  rate = (double)d_bytes * 1000.0 / (double)elapsed;
  return window_end(p, avg * conn_bps, conn_bps, rate, saturated);
}
