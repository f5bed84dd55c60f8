/* The concurrency controller (lib/core/pace.c) against a simulated
 * network: transfers of a fixed size, each at min(conn_cap, agg_cap / n)
 * bytes/s, restarted as they finish while the limit allows (a pipe never
 * short of parts unless supply caps the number in flight), and a server
 * that throttles every request finishing while more than throttle_above
 * are in flight. Time is simulated: no sleeps. */
#include "cmocka-compat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pace.h"

#define MB 1000000.0
#define SIM_MAX 256

struct sim {
  double conn_cap, agg_cap; /* bytes/s; 0 = none */
  double size;              /* bytes per transfer */
  unsigned throttle_above;  /* 0 = never */
  unsigned supply;          /* at most this many in flight; 0 = no cap */
  /* state */
  unsigned n;
  double left[SIM_MAX];
  uint64_t started[SIM_MAX];
  struct spot_pace_sample s;
  unsigned max_seen, changes, cuts;
};

static void
sim_fill(struct sim *m, const struct spot_pace *p)
{
  unsigned cap = spot_pace_limit(p);

  if (m->supply > 0 && m->supply < cap)
    cap = m->supply;
  while (m->n < cap && m->n < SIM_MAX) {
    m->left[m->n] = m->size;
    m->started[m->n] = m->s.now_ms;
    m->n++;
  }
}

/* Runs ms of simulated time in 5 ms steps. */
static void
sim_run(struct sim *m, struct spot_pace *p, uint64_t ms)
{
  for (uint64_t t = 0; t < ms; t += 5) {
    double r;

    sim_fill(m, p);
    r = m->conn_cap;
    if (m->agg_cap > 0 && m->n > 0 && m->agg_cap / m->n < r)
      r = m->agg_cap / m->n;
    m->s.now_ms += 5;
    for (unsigned i = 0; i < m->n;) {
      m->left[i] -= r * 0.005;
      if (m->left[i] > 0) {
        i++;
        continue;
      }
      m->s.bytes += (uint64_t)m->size;
      m->s.done++;
      m->s.busy_ms += m->s.now_ms - m->started[i];
      if (m->throttle_above > 0 && m->n > m->throttle_above)
        m->s.throttled++;
      m->left[i] = m->left[m->n - 1];
      m->started[i] = m->started[m->n - 1];
      m->n--;
    }
    m->s.inflight = m->n;
    if (spot_pace_sample(p, &m->s)) {
      m->changes++;
      if (getenv("PACE_TRACE") != NULL)
        fprintf(stderr, "t=%llu limit %u (%s) est %.0f rate %.0f\n",
                (unsigned long long)m->s.now_ms, spot_pace_limit(p), p->why,
                p->est_bps / 1e6, p->rate_bps / 1e6);
      if (strcmp(p->why, "throttled") == 0)
        m->cuts++;
    }
    assert_true(spot_pace_limit(p) <= p->c.max);
    assert_true(spot_pace_limit(p) >= p->c.min);
    if (spot_pace_limit(p) > m->max_seen)
      m->max_seen = spot_pace_limit(p);
  }
}

static void
sim_init(struct sim *m, double conn_cap, double agg_cap)
{
  memset(m, 0, sizeof(*m));
  m->conn_cap = conn_cap;
  m->agg_cap = agg_cap;
  m->size = 8 << 20;
  m->s.now_ms = 1000;
}

/* Per-connection caps only: every step pays, so it grows to the budget. */
static void
test_grows_to_budget(void **state)
{
  struct spot_pace_config c = {.max = 48};
  struct spot_pace p;
  struct sim m;

  sim_init(&m, 60 * MB, 0);
  spot_pace_init(&p, &c);
  assert_int_equal(spot_pace_limit(&p), SPOT_PACE_START);
  sim_run(&m, &p, 10000);
  assert_int_equal(spot_pace_limit(&p), 48);
  assert_int_equal(m.max_seen, 48);
  assert_int_equal(p.state, SPOT_PACE_HOLD);
}

/* A shared bottleneck of 8 connections' worth: it stops near there. */
static void
test_plateau(void **state)
{
  struct spot_pace_config c = {.start = 4, .max = 128};
  struct spot_pace p;
  struct sim m;

  sim_init(&m, 60 * MB, 480 * MB);
  spot_pace_init(&p, &c);
  sim_run(&m, &p, 3000);
  assert_int_equal(p.state, SPOT_PACE_HOLD);
  assert_true(spot_pace_limit(&p) >= 8);
  assert_true(spot_pace_limit(&p) <= 18);
  assert_true(m.max_seen <= 27);
  /* Later probes go back down: it never runs away. */
  sim_run(&m, &p, 20000);
  assert_true(spot_pace_limit(&p) <= 27);
}

/* Throttling above 12 in flight: halves, and stays within a step of 12. */
static void
test_backoff_on_throttling(void **state)
{
  struct spot_pace_config c = {.start = 8, .max = 64};
  struct spot_pace p;
  struct sim m;
  unsigned before;

  sim_init(&m, 60 * MB, 0);
  m.throttle_above = 12;
  spot_pace_init(&p, &c);
  sim_run(&m, &p, 2000);
  assert_true(m.cuts >= 1);
  assert_true(m.max_seen <= 24); /* one step past 12 at most */
  before = m.cuts;
  sim_run(&m, &p, 20000);
  assert_true(m.max_seen <= 24);
  assert_true(spot_pace_limit(&p) <= 18);
  assert_true(spot_pace_limit(&p) >= 2);
  /* Probes find the throttle again now and then, no more. */
  assert_true(m.cuts - before <= 10);
}

/* One throttled answer halves the limit once, at once. */
static void
test_backoff_halves(void **state)
{
  struct spot_pace_config c = {.start = 32, .max = 64};
  struct spot_pace p;
  struct spot_pace_sample s = {.now_ms = 100, .inflight = 32};

  spot_pace_init(&p, &c);
  assert_false(spot_pace_sample(&p, &s));
  s.now_ms += 10;
  s.throttled = 3;
  assert_true(spot_pace_sample(&p, &s));
  assert_int_equal(spot_pace_limit(&p), 16);
  assert_string_equal(p.why, "throttled");
  /* more throttles of the same window: no second cut */
  s.now_ms += 10;
  s.throttled = 9;
  assert_false(spot_pace_sample(&p, &s));
  assert_int_equal(spot_pace_limit(&p), 16);
  /* never below min */
  c.start = 3;
  spot_pace_init(&p, &c);
  s.throttled = 0;
  assert_false(spot_pace_sample(&p, &s));
  s.throttled = 1;
  s.now_ms += 10;
  assert_true(spot_pace_sample(&p, &s)); /* 3 / 2 = 1 < min 2: 2 */
  assert_int_equal(spot_pace_limit(&p), 2);
}

/* A target of 600 MB/s at 60 MB/s per connection: 10, and no further. */
static void
test_target_rate(void **state)
{
  struct spot_pace_config c = {.start = 2, .max = 64, .target_bps = 600000000};
  struct spot_pace p;
  struct sim m;

  sim_init(&m, 60 * MB, 0);
  spot_pace_init(&p, &c);
  sim_run(&m, &p, 5000);
  assert_true(spot_pace_limit(&p) >= 10);
  assert_true(spot_pace_limit(&p) <= 12);
  assert_true(p.target_reached);
  assert_int_equal(m.changes, 1); /* straight there from the first window */
  sim_run(&m, &p, 20000);
  assert_true(spot_pace_limit(&p) <= 12);
}

/* Short of parts (CPU-bound): more connections cannot help. */
static void
test_supply_limited(void **state)
{
  struct spot_pace_config c = {.start = 8, .max = 64};
  struct spot_pace p;
  struct sim m;

  sim_init(&m, 60 * MB, 0);
  m.supply = 5;
  spot_pace_init(&p, &c);
  sim_run(&m, &p, 10000);
  assert_int_equal(spot_pace_limit(&p), 8);
  assert_int_equal(m.changes, 0);
}

static void
test_fixed_and_limits(void **state)
{
  struct spot_pace_config c = {.start = 5, .max = 64, .fixed = true};
  struct spot_pace p;
  struct sim m;

  sim_init(&m, 60 * MB, 0);
  spot_pace_init(&p, &c);
  sim_run(&m, &p, 5000);
  assert_int_equal(spot_pace_limit(&p), 5);
  assert_int_equal(m.changes, 0);
  c.start = 1; /* --parallel 1: below the adaptive floor */
  spot_pace_init(&p, &c);
  assert_int_equal(spot_pace_limit(&p), 1);
  /* the start is capped by the budget, min by max */
  memset(&c, 0, sizeof(c));
  c.max = 1;
  spot_pace_init(&p, &c);
  assert_int_equal(spot_pace_limit(&p), 1);
  assert_int_equal(p.c.min, 1);
  c.max = 0;
  spot_pace_init(&p, &c);
  assert_int_equal(spot_pace_limit(&p), 1);
}

static void
test_for_rate(void **state)
{
  assert_int_equal(spot_pace_for_rate(600, 60.0, 64), 10);
  assert_int_equal(spot_pace_for_rate(601, 60.0, 64), 11);
  assert_int_equal(spot_pace_for_rate(10, 60.0, 64), 1);
  assert_int_equal(spot_pace_for_rate(6000, 1.0, 64), 64);
  assert_int_equal(spot_pace_for_rate(0, 60.0, 64), 64);
  assert_int_equal(spot_pace_for_rate(600, 0.0, 7), 7);
  assert_string_equal(spot_pace_state_name(SPOT_PACE_GROW), "grow");
  assert_string_equal(spot_pace_state_name(SPOT_PACE_STATE_LAST), "?");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grows_to_budget),
      cmocka_unit_test(test_plateau),
      cmocka_unit_test(test_backoff_on_throttling),
      cmocka_unit_test(test_backoff_halves),
      cmocka_unit_test(test_target_rate),
      cmocka_unit_test(test_supply_limited),
      cmocka_unit_test(test_fixed_and_limits),
      cmocka_unit_test(test_for_rate),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
