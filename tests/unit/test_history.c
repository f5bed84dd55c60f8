#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/history.h"

#define T0 ((int64_t)1764748800000) /* 2025-12-03T08:00:00Z */
#define S(x) ((int64_t)(x)*1000)

static void
test_roundtrip(void **state)
{
  struct spot_hist_event ev, back;
  char err[256], *json = NULL, *json2 = NULL;

  assert_int_equal(
      spot_hist_event_init(&ev, SPOT_HIST_CHECKPOINT, T0, "node-a.1_x", 7), 0);
  assert_int_equal(SPOT_HIST_SET(&ev, checkpoint, "step-1200"), 0);
  assert_int_equal(SPOT_HIST_SET(&ev, reason, "periodic"), 0);
  ev.save_s = 2.5;
  ev.upload_s = 9.125;
  ev.raw_bytes = 707000000;
  ev.stored_bytes = 580000000;
  ev.committed = true;
  ev.step = 1200;
  assert_int_equal(spot_hist_encode(&ev, &json), 0);
  assert_non_null(strstr(json, "\"type\":\"checkpoint\""));
  assert_non_null(strstr(json, "\"committed\":true"));
  /* Defaults are left out, fields of other types too. */
  assert_null(strstr(json, "deadline_ms"));
  assert_null(strstr(json, "host"));
  assert_int_equal(spot_hist_parse(json, strlen(json), &back, err, sizeof(err)),
                   0);
  assert_int_equal(back.type, SPOT_HIST_CHECKPOINT);
  assert_true(back.time_ms == T0);
  assert_string_equal(back.owner, "node-a.1_x");
  assert_int_equal(back.seq, 7);
  assert_string_equal(back.checkpoint, "step-1200");
  assert_true(back.save_s == 2.5 && back.upload_s == 9.125);
  assert_true(back.raw_bytes == 707000000 && back.stored_bytes == 580000000);
  assert_true(back.committed);
  assert_int_equal(back.step, 1200);
  assert_int_equal(back.deadline_ms, -1);
  assert_int_equal(spot_hist_encode(&back, &json2), 0);
  assert_string_equal(json, json2);
  free(json);
  free(json2);

  /* Every type encodes and parses back to the same text. */
  for (int t = 0; t < SPOT_HIST_LAST; t++) {
    assert_int_equal(spot_hist_event_init(&ev, t, T0 + t, "o", 0), 0);
    assert_int_equal(SPOT_HIST_SET(&ev, host, "h"), 0);
    assert_int_equal(SPOT_HIST_SET(&ev, kind, "gcp-preempted"), 0);
    ev.deadline_ms = T0 + S(30);
    ev.epoch = 3;
    assert_int_equal(spot_hist_encode(&ev, &json), 0);
    assert_int_equal(
        spot_hist_parse(json, strlen(json), &back, err, sizeof(err)), 0);
    assert_int_equal(back.type, t);
    assert_int_equal(spot_hist_encode(&back, &json2), 0);
    assert_string_equal(json, json2);
    assert_string_equal(spot_hist_type_name(t), spot_hist_type_name(back.type));
    free(json);
    free(json2);
  }
}

static void
test_bad_events(void **state)
{
  static const struct {
    const char *json, *msg;
  } cases[] = {
      {"", "invalid JSON"},
      {"[]", "object"},
      {"{\"v\":2,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a\",\"seq\":0}",
       "v:"},
      {"{\"v\":1,\"type\":\"nope\",\"time_ms\":1,\"owner\":\"a\",\"seq\":0}",
       "type"},
      {"{\"v\":1,\"type\":\"lease\",\"time_ms\":-5,\"owner\":\"a\",\"seq\":0}",
       "time_ms"},
      {"{\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a/b\",\"seq\":0}",
       "owner"},
      {"{\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"..\",\"seq\":0}",
       "owner"},
      {"{\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a\",\"seq\":1.5}",
       "seq"},
      {"{\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a\",\"seq\":0,"
       "\"epoch\":\"3\"}",
       "epoch"},
      {"{\"v\":1,\"type\":\"checkpoint\",\"time_ms\":1,\"owner\":\"a\","
       "\"seq\":0,\"committed\":1}",
       "committed"},
      {"{\"v\":1,\"type\":\"checkpoint\",\"time_ms\":1,\"owner\":\"a\","
       "\"seq\":0,\"save_s\":1e300}",
       "save_s"},
      {"{\"v\":1,\"type\":\"checkpoint\",\"time_ms\":1,\"owner\":\"a\","
       "\"seq\":0,\"raw_bytes\":-1}",
       "raw_bytes"},
      {"{\"v\":1,\"type\":\"notice\",\"time_ms\":1,\"owner\":\"a\",\"seq\":0,"
       "\"kind\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
       "kind"},
      {"{\"v\":1,\"type\":\"notice\",\"time_ms\":1,\"owner\":\"a\",\"seq\":0,"
       "\"kind\":\"a\\u0000b\"}",
       "NUL"},
      {"{\"v\":1,\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a\","
       "\"seq\":0}",
       "invalid JSON"},
  };
  struct spot_hist_event ev;
  char err[256], big[SPOT_HIST_EVENT_MAX + 2];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    err[0] = '\0';
    assert_int_equal(spot_hist_parse(cases[i].json, strlen(cases[i].json), &ev,
                                     err, sizeof(err)),
                     -EINVAL);
    if (strstr(err, cases[i].msg) == NULL)
      fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
  }
  memset(big, ' ', sizeof(big));
  assert_int_equal(spot_hist_parse(big, sizeof(big), &ev, err, sizeof(err)),
                   -E2BIG);
  /* A key of another type or a newer writer is ignored. */
  {
    const char *j = "{\"v\":1,\"type\":\"lease\",\"time_ms\":1,\"owner\":\"a\","
                    "\"seq\":0,\"save_s\":\"x\",\"future\":[1]}";
    assert_int_equal(spot_hist_parse(j, strlen(j), &ev, err, sizeof(err)), 0);
    assert_true(ev.save_s == 0);
  }
  assert_int_equal(spot_hist_event_init(&ev, SPOT_HIST_LAST, 0, "a", 0),
                   -EINVAL);
  assert_int_equal(spot_hist_event_init(&ev, SPOT_HIST_LEASE, 0, "", 0),
                   -EINVAL);
  assert_int_equal(
      SPOT_HIST_SET(&ev, reason, "0123456789012345678901234567890123"), -E2BIG);
}

/* The scenario of the integration test: two runs, a preemption without a
 * final commit (a short notice), a gap, then a run that finishes. */
static size_t
scenario(struct spot_hist_event *ev, bool final_commit)
{
  size_t n = 0;

  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_START, T0, "a", 0);
  SPOT_HIST_SET(&ev[n], host, "node-a");
  SPOT_HIST_SET(&ev[n++], instance_type, "g5.xlarge");
  spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(600), "a", 1);
  ev[n].save_s = 5;
  ev[n].upload_s = 10;
  ev[n].step = 585;
  ev[n++].committed = true;
  spot_hist_event_init(&ev[n], SPOT_HIST_NOTICE, T0 + S(1000), "a", 2);
  SPOT_HIST_SET(&ev[n], kind, "aws-spot-terminate");
  ev[n].deadline_ms = T0 + S(1120);
  ev[n++].step = 1000;
  if (final_commit) {
    spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(1020), "a", 3);
    ev[n].save_s = 4;
    ev[n].upload_s = 12;
    ev[n].step = 1004;
    ev[n++].committed = true;
  }
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(1030), "a", 4);
  SPOT_HIST_SET(&ev[n], outcome, "preempted");
  ev[n++].committed = final_commit;
  spot_hist_event_init(&ev[n], SPOT_HIST_RELAUNCH, T0 + S(1031), "a", 5);
  SPOT_HIST_SET(&ev[n++], result, "ok");
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_START, T0 + S(1200), "b", 0);
  SPOT_HIST_SET(&ev[n++], host, "node-b");
  spot_hist_event_init(&ev[n], SPOT_HIST_RESTORE, T0 + S(1230), "b", 1);
  SPOT_HIST_SET(&ev[n], checkpoint, "ckpt-1");
  ev[n].seconds = 25;
  ev[n++].step = 585;
  spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(1800), "b", 2);
  ev[n].save_s = 5;
  ev[n].upload_s = 10;
  ev[n++].committed = false;
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(2400), "b", 3);
  SPOT_HIST_SET(&ev[n], outcome, "exited");
  ev[n++].exit_code = 0;
  return n;
}

static void
test_summary(void **state)
{
  struct spot_hist_event ev[16];
  struct spot_hist_summary s;
  size_t n = scenario(ev, false);
  char *json;
  json_t *root;

  /* Sorting restores order whatever order the store listed them in. */
  for (size_t i = 0; i < n / 2; i++) {
    struct spot_hist_event t = ev[i];
    ev[i] = ev[n - 1 - i];
    ev[n - 1 - i] = t;
  }
  spot_hist_sort(ev, n);
  assert_true(ev[0].time_ms == T0 && ev[n - 1].time_ms == T0 + S(2400));
  assert_int_equal(spot_hist_summarize(ev, n, 0.40, 1.20, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.preemptions, 1);
  assert_int_equal(s.crashes, 0);
  assert_int_equal(s.notices, 1);
  assert_int_equal(s.checkpoints, 2);
  assert_int_equal(s.commits, 1);
  assert_int_equal(s.failed, 1);
  assert_int_equal(s.relaunches, 1);
  assert_int_equal(s.relaunch_failures, 0);
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_PREEMPTED);
  assert_int_equal(s.runs[1].outcome, SPOT_HIST_EXITED);
  assert_string_equal(s.runs[0].host, "node-a");
  assert_string_equal(s.runs[1].restored, "ckpt-1");
  /* Lost: the commit at 600 s captured the state of 585 s; the notice
   * came at 1000 s and nothing was committed after it. */
  assert_true(s.runs[0].lost_ms == S(415));
  assert_true(s.runs[0].lost_steps == 415);
  assert_true(s.runs[1].lost_ms == -1);
  assert_true(s.lost_ms == S(415));
  /* Gap: node a ended at 1030 s, node b trained from 1230 s. */
  assert_true(s.runs[1].gap_before_ms == S(200));
  assert_true(s.gap_ms == S(200) && s.max_gap_ms == S(200));
  assert_true(s.wall_ms == S(2400));
  assert_true(s.train_ms == S(1030) + S(1170));
  assert_true(s.node_ms == S(1030) + S(1200));
  assert_true(s.save_s == 10 && s.upload_s == 20);
  assert_int_equal(s.nodes[0].ncommit_times, 1);
  assert_true(s.nodes[0].commit_times[0] == T0 + S(600));
  assert_int_equal(s.nodes[1].ncommit_times, 0);
  assert_true(s.priced);
  assert_float_equal(s.cost_spot, 2230.0 / 3600 * 0.40, 1e-9);
  assert_float_equal(s.cost_on_demand, (2200.0 - 415) / 3600 * 1.20, 1e-9);

  assert_int_equal(spot_hist_summary_json(&s, "job-1", ev, n, &json), 0);
  root = json_loads(json, 0, NULL);
  assert_non_null(root);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(root, "summary"), "preemptions")),
                   1);
  assert_float_equal(json_real_value(json_object_get(
                         json_object_get(root, "summary"), "lost_s")),
                     415.0, 1e-9);
  assert_int_equal(json_array_size(json_object_get(root, "runs")), 2);
  assert_int_equal(json_array_size(json_object_get(root, "events")), n);
  json_decref(root);
  free(json);
  spot_hist_summary_fini(&s);

  /* A final checkpoint committed after the notice saves the work. */
  n = scenario(ev, true);
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_true(s.runs[0].lost_ms == 0);
  assert_true(s.runs[0].lost_steps == 0);
  assert_true(s.runs[0].final_committed);
  assert_false(s.priced);
  spot_hist_summary_fini(&s);
}

static void
test_crash_and_running(void **state)
{
  struct spot_hist_event ev[8];
  struct spot_hist_summary s;
  size_t n = 0;

  /* Node a vanishes without a word after a commit; b is still running. */
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "a", 0);
  spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(100), "a", 1);
  ev[n].save_s = 1;
  ev[n++].committed = true;
  /* its trainer failed once and was restarted in place */
  spot_hist_event_init(&ev[n], SPOT_HIST_RESTART, T0 + S(200), "a", 2);
  ev[n].restart_count = 1;
  ev[n++].exit_code = 3;
  spot_hist_event_init(&ev[n++], SPOT_HIST_LEASE, T0 + S(300), "a", 3);
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0 + S(400), "b", 0);
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_CRASHED);
  assert_int_equal(s.runs[1].outcome, SPOT_HIST_RUNNING);
  assert_int_equal(s.crashes, 1);
  assert_int_equal(s.preemptions, 0);
  assert_int_equal(s.lease_changes, 1);
  assert_int_equal(s.restarts, 1);
  /* Last seen at 300 s; the commit held the state of 99 s. */
  assert_true(s.runs[0].lost_ms == S(201));
  assert_true(s.runs[0].lost_steps == -1);
  assert_true(s.lost_steps == -1);
  assert_true(s.runs[1].gap_before_ms == S(100));
  spot_hist_summary_fini(&s);

  /* No events at all. */
  assert_int_equal(spot_hist_summarize(NULL, 0, 1, 2, &s), 0);
  assert_int_equal(s.nruns, 0);
  assert_true(s.wall_ms == 0 && s.cost_spot == 0);
  spot_hist_summary_fini(&s);
  spot_hist_summary_fini(NULL);
}

/* Totals over many long runs stay positive: 2000 runs that each span the
 * whole range the parser accepts (2^53 ms) add up past INT64_MAX, which
 * must saturate, not wrap into a negative "time training". */
static void
test_summary_saturates(void **state)
{
  enum { RUNS = 2000 };
  const int64_t far = (int64_t)1 << 53;
  struct spot_hist_event *ev = calloc(2 * RUNS, sizeof(*ev));
  struct spot_hist_summary s;
  char owner[16];

  (void)state;
  assert_non_null(ev);
  for (int i = 0; i < RUNS; i++) {
    snprintf(owner, sizeof(owner), "n%d", i);
    spot_hist_event_init(&ev[2 * i], SPOT_HIST_RUN_START, 0, owner, 0);
    spot_hist_event_init(&ev[2 * i + 1], SPOT_HIST_NOTICE, far, owner, 1);
    ev[2 * i + 1].step = far;
  }
  spot_hist_sort(ev, 2 * RUNS);
  assert_int_equal(spot_hist_summarize(ev, 2 * RUNS, 1, 2, &s), 0);
  assert_int_equal(s.nruns, RUNS);
  assert_true(s.train_ms == INT64_MAX);
  assert_true(s.node_ms == INT64_MAX);
  assert_true(s.lost_ms == INT64_MAX);
  assert_true(s.lost_steps == INT64_MAX);
  assert_true(s.wall_ms == far);
  assert_true(s.cost_on_demand >= 0);
  spot_hist_summary_fini(&s);
  free(ev);
}

/* A checkpoint of owner committed at T0 + at, saved and uploaded in 1 s
 * each (its state is that of 2 s before). */
static void
committed_at(struct spot_hist_event *ev, const char *owner, int64_t at,
             uint64_t seq, const char *name, int64_t step)
{
  spot_hist_event_init(ev, SPOT_HIST_CHECKPOINT, T0 + at, owner, seq);
  SPOT_HIST_SET(ev, checkpoint, name);
  ev->save_s = 1;
  ev->upload_s = 1;
  ev->step = step;
  ev->committed = true;
}

/* spotd killed (kill -9) after a commit at step 279 while its trainer
 * reached step 300: nothing but its PROGRESS events says how far it got.
 * The next start restores step-279: 21 steps lost, and the time from
 * that checkpoint's state to the last progress seen. */
static void
test_killed_lost_steps(void **state)
{
  struct spot_hist_event ev[8];
  struct spot_hist_summary s;
  size_t n = 0;
  char *json;
  json_t *root, *run;

  (void)state;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "a", 0);
  committed_at(&ev[n++], "a", S(100), 1, "step-279", 279);
  spot_hist_event_init(&ev[n], SPOT_HIST_PROGRESS, T0 + S(115), "a", 2);
  ev[n++].step = 290;
  spot_hist_event_init(&ev[n], SPOT_HIST_PROGRESS, T0 + S(130), "a", 3);
  ev[n++].step = 300;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0 + S(200), "b", 0);
  spot_hist_event_init(&ev[n], SPOT_HIST_RESTORE, T0 + S(210), "b", 1);
  SPOT_HIST_SET(&ev[n], checkpoint, "step-279");
  ev[n++].seconds = 5;
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(400), "b", 2);
  SPOT_HIST_SET(&ev[n], outcome, "exited");
  ev[n++].exit_code = 0;
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_CRASHED);
  assert_int_equal(s.crashes, 1);
  assert_int_equal(s.nodes[0].last_step, 300);
  assert_true(s.runs[0].lost_steps == 300 - 279);
  assert_true(s.lost_steps == 300 - 279);
  /* The commit at 100 s held the state of 98 s; last seen at 130 s. */
  assert_true(s.runs[0].lost_ms == S(32));
  assert_true(s.lost_ms == S(32));
  assert_int_equal(spot_hist_summary_json(&s, "j", NULL, 0, &json), 0);
  root = json_loads(json, 0, NULL);
  assert_non_null(root);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(root, "summary"), "lost_steps")),
                   21);
  run = json_array_get(json_object_get(root, "runs"), 0);
  assert_int_equal(json_integer_value(json_object_get(run, "lost_steps")), 21);
  assert_float_equal(json_real_value(json_object_get(run, "lost_s")), 32.0,
                     1e-9);
  json_decref(root);
  free(json);
  spot_hist_summary_fini(&s);

  /* The next start resumed from an older checkpoint (the newest did not
   * verify): the work since that one is what was lost. */
  spot_hist_event_init(&ev[0], SPOT_HIST_CHECKPOINT, T0 + S(50), "a", 10);
  SPOT_HIST_SET(&ev[0], checkpoint, "step-120");
  ev[0].step = 120;
  ev[0].committed = true;
  for (size_t i = 0; i < n; i++)
    if (ev[i].type == SPOT_HIST_RESTORE)
      SPOT_HIST_SET(&ev[i], checkpoint, "step-120");
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_true(s.runs[0].lost_steps == 300 - 120);
  assert_true(s.runs[0].lost_ms == S(80));
  spot_hist_summary_fini(&s);
}

/* A 2-node job (two spotd processes per run, one per rank, sharing the
 * run id) preempted once and then finished: 2 runs, not 4; training is
 * a share of the job's wall time, not of the ranks' sum. */
static size_t
two_nodes(struct spot_hist_event *ev, const char *run2)
{
  static const char *const owners[] = {"a0", "a1", "b0", "b1"};
  size_t n = 0;

  for (int k = 0; k < 4; k++) {
    const char *o = owners[k];
    int64_t t = k < 2 ? T0 + S(k) : T0 + S(1000 + k);
    spot_hist_event_init(&ev[n], SPOT_HIST_RUN_START, t, o, 0);
    SPOT_HIST_SET(&ev[n], host, k % 2 ? "node-1" : "node-0");
    SPOT_HIST_SET(&ev[n], run, k < 2 ? "job.0" : run2);
    ev[n].rank = k % 2;
    ev[n++].nranks = 2;
    if (k < 2) {
      spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(400), o, 1);
      SPOT_HIST_SET(&ev[n], checkpoint, "step-400");
      ev[n].save_s = 2;
      ev[n].step = 400;
      ev[n++].committed = true;
      spot_hist_event_init(&ev[n], SPOT_HIST_NOTICE, T0 + S(600), o, 2);
      ev[n++].step = 600;
      spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(700), o, 3);
      SPOT_HIST_SET(&ev[n++], outcome, "preempted");
    } else {
      spot_hist_event_init(&ev[n], SPOT_HIST_RESTORE, T0 + S(1100), o, 1);
      SPOT_HIST_SET(&ev[n], checkpoint, "step-400");
      ev[n++].seconds = 50;
      spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(2000), o, 2);
      SPOT_HIST_SET(&ev[n++], outcome, "exited");
    }
  }
  return n;
}

static void
test_multinode_runs(void **state)
{
  struct spot_hist_event ev[16];
  struct spot_hist_summary s;
  size_t n = two_nodes(ev, "job.1");

  (void)state;
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 1, 3, &s), 0);
  assert_int_equal(s.nnodes, 4);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.trained_runs, 2);
  assert_int_equal(s.preemptions, 1);
  assert_int_equal(s.crashes, 0);
  assert_int_equal(s.notices, 1);
  assert_int_equal(s.checkpoints, 1);
  assert_int_equal(s.runs[0].nnodes, 2);
  assert_string_equal(s.runs[0].run_id, "job.0");
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_PREEMPTED);
  assert_int_equal(s.runs[1].outcome, SPOT_HIST_EXITED);
  /* The job trained from when its last rank was ready: 1..700 s and
   * 1100..2000 s of its 2000 s. */
  assert_true(s.wall_ms == S(2000));
  assert_true(s.train_ms == S(699) + S(900));
  assert_true(s.train_ms <= s.wall_ms);
  /* Both nodes cost: 2 x 700 s, then 2 x ~1000 s. */
  assert_true(s.node_ms == S(700) + S(699) + S(998) + S(997));
  /* One preemption's loss, not one per rank: 600 - 398 s, 200 steps. */
  assert_true(s.lost_ms == S(202));
  assert_true(s.lost_steps == 200);
  assert_true(s.gap_ms == S(400));
  /* Ranks are the nodes of each run. */
  for (size_t i = 0; i < s.nnodes; i++) {
    assert_int_equal(s.nodes[i].run, i / 2);
    assert_int_equal(s.nodes[i].rank, (int64_t)(i % 2));
  }
  /* On demand, each rank needs its own node. */
  assert_float_equal(s.cost_on_demand, 2.0 * (1599.0 - 202.0) / 3600.0 * 3.0,
                     1e-9);
  spot_hist_summary_fini(&s);

  /* A run id used again (a second start with the same id): the ranks it
   * already has make a new run. */
  n = two_nodes(ev, "job.0");
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.preemptions, 1);
  spot_hist_summary_fini(&s);

  /* Ranks that read different RESTARTS counts (no --run-id): rank 1 of
   * the second run says r2, rank 0 r1; they ran together, one run. */
  n = two_nodes(ev, "r1");
  for (size_t i = 0; i < n; i++)
    if (strcmp(ev[i].owner, "b1") == 0 && ev[i].type == SPOT_HIST_RUN_START)
      SPOT_HIST_SET(&ev[i], run, "r2");
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.runs[1].nnodes, 2);
  spot_hist_summary_fini(&s);
}

/* A start refused because another node holds the job lease: a refused
 * start, neither a crash nor a run, and it loses nothing. */
static void
test_refused_start(void **state)
{
  struct spot_hist_event ev[12];
  struct spot_hist_summary s;
  size_t n = 0;
  char *json;
  json_t *root;

  (void)state;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "a", 0);
  spot_hist_event_init(&ev[n], SPOT_HIST_LEASE, T0 + S(1), "a", 1);
  SPOT_HIST_SET(&ev[n++], action, "held");
  spot_hist_event_init(&ev[n], SPOT_HIST_PROGRESS, T0 + S(100), "a", 2);
  ev[n++].step = 100;
  /* b starts while a runs, finds the lease held and gives up. */
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0 + S(50), "b", 0);
  spot_hist_event_init(&ev[n], SPOT_HIST_LEASE, T0 + S(51), "b", 1);
  SPOT_HIST_SET(&ev[n++], action, "failed");
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(52), "b", 2);
  SPOT_HIST_SET(&ev[n], outcome, "refused");
  SPOT_HIST_SET(&ev[n], reason, "lease-held");
  ev[n++].exit_code = -1;
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(200), "a", 3);
  SPOT_HIST_SET(&ev[n++], outcome, "exited");
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 2);
  assert_int_equal(s.trained_runs, 1);
  assert_int_equal(s.refused, 1);
  assert_int_equal(s.crashes, 0);
  assert_int_equal(s.runs[1].outcome, SPOT_HIST_REFUSED);
  assert_string_equal(s.runs[1].refused, "lease-held");
  assert_true(s.runs[1].lost_ms == -1 && s.runs[1].gap_before_ms == -1);
  assert_true(s.lost_ms == 0 && s.lost_steps == -1);
  assert_true(s.train_ms == S(200));
  assert_int_equal(spot_hist_summary_json(&s, "j", NULL, 0, &json), 0);
  root = json_loads(json, 0, NULL);
  assert_non_null(root);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(root, "summary"), "refused")),
                   1);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(root, "summary"), "crashes")),
                   0);
  assert_string_equal(
      json_string_value(json_object_get(
          json_array_get(json_object_get(root, "runs"), 1), "outcome")),
      "refused");
  json_decref(root);
  free(json);
  spot_hist_summary_fini(&s);

  /* The same without its run_end (old writer, or killed while refusing)
   * is lost without an end: a crash, as before. */
  n = 0;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "b", 0);
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0 + S(5), "c", 0);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.refused, 0);
  assert_int_equal(s.crashes, 1);
  spot_hist_summary_fini(&s);
}

/* The wait for the job lease is a phase of its own: not the restore. */
static void
test_lease_wait(void **state)
{
  struct spot_hist_event ev[8];
  struct spot_hist_summary s;
  size_t n = 0;

  (void)state;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "a", 0);
  spot_hist_event_init(&ev[n], SPOT_HIST_LEASE, T0 + S(5), "a", 1);
  SPOT_HIST_SET(&ev[n++], action, "waiting");
  spot_hist_event_init(&ev[n], SPOT_HIST_LEASE, T0 + S(65), "a", 2);
  SPOT_HIST_SET(&ev[n], action, "held");
  ev[n++].epoch = 2;
  spot_hist_event_init(&ev[n], SPOT_HIST_RESTORE, T0 + S(75), "a", 3);
  SPOT_HIST_SET(&ev[n], checkpoint, "c");
  ev[n++].seconds = 10;
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(100), "a", 4);
  SPOT_HIST_SET(&ev[n++], outcome, "exited");
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_true(s.nodes[0].lease_from_ms == T0 + S(5));
  assert_true(s.nodes[0].lease_wait_ms == S(60));
  assert_true(s.nodes[0].restore_from_ms == T0 + S(65));
  assert_true(s.nodes[0].train_start_ms == T0 + S(75));
  assert_true(s.runs[0].lease_wait_ms == S(60));
  assert_true(s.lease_wait_ms == S(60));
  assert_float_equal(s.runs[0].restore_s, 10.0, 1e-9);
  spot_hist_summary_fini(&s);

  /* A fresh start (nothing to restore) trains once it holds the lease. */
  ev[3] = ev[4];
  n = 4;
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_true(s.nodes[0].restore_from_ms == -1);
  assert_true(s.nodes[0].train_start_ms == T0 + S(65));
  assert_true(s.train_ms == S(35));
  assert_true(s.lease_wait_ms == S(60));
  spot_hist_summary_fini(&s);
}

/* Restarts in place: the trainer failed at step 150 (commit step-100 held
 * the state of 98 s), was down 12 s (backoff and restore) and ran again
 * at 212 s; then failed for good at step 130 with its restarts used up.
 * Each failure loses the work back to step-100; the downtime is not
 * training. */
static void
test_restarts_ledger(void **state)
{
  struct spot_hist_event ev[8];
  struct spot_hist_summary s;
  size_t n = 0;
  char *json;
  json_t *root, *run;

  (void)state;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "a", 0);
  committed_at(&ev[n++], "a", S(100), 1, "step-100", 100);
  spot_hist_event_init(&ev[n], SPOT_HIST_RESTART, T0 + S(212), "a", 2);
  SPOT_HIST_SET(&ev[n], checkpoint, "step-100");
  ev[n].restart_count = 1;
  ev[n].exit_code = 1;
  ev[n].seconds = 10;
  ev[n].down_s = 12;
  ev[n++].step = 150;
  spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(260), "a", 3);
  SPOT_HIST_SET(&ev[n], outcome, "crashed");
  SPOT_HIST_SET(&ev[n], reason, "restarts-used");
  ev[n].exit_code = 1;
  ev[n++].step = 130;
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 1);
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_CRASHED);
  assert_true(s.runs[0].exhausted);
  assert_int_equal(s.exhausted, 1);
  assert_int_equal(s.crashes, 1);
  assert_int_equal(s.restarts, 1);
  assert_int_equal(s.nodes[0].restarts, 1);
  assert_true(s.nodes[0].down_ms == S(12));
  assert_true(s.down_ms == S(12));
  /* failed at 200 s, state of 98 s: 102 s and 50 steps; then from the
   * restart at 212 s to the end at 260 s: 48 s and 30 steps */
  assert_true(s.nodes[0].restart_lost_ms == S(102));
  assert_true(s.nodes[0].restart_lost_steps == 50);
  assert_true(s.runs[0].lost_ms == S(102) + S(48));
  assert_true(s.runs[0].lost_steps == 50 + 30);
  assert_true(s.train_ms == S(260) - S(12));
  assert_int_equal(s.nodes[0].nrestart_times, 3);
  assert_true(s.nodes[0].restart_times[0] == T0 + S(200));
  assert_true(s.nodes[0].restart_times[1] == T0 + S(212));
  assert_true(s.nodes[0].restart_times[2] == T0 + S(98));
  assert_false(s.runs[0].lost_bound);
  assert_int_equal(spot_hist_summary_json(&s, "j", ev, n, &json), 0);
  root = json_loads(json, 0, NULL);
  assert_non_null(root);
  run = json_array_get(json_object_get(root, "runs"), 0);
  assert_true(json_is_true(json_object_get(run, "exhausted")));
  assert_int_equal(json_integer_value(json_object_get(run, "restarts")), 1);
  assert_float_equal(json_real_value(json_object_get(run, "down_s")), 12.0,
                     1e-9);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(root, "summary"), "restarts_used_up")),
                   1);
  json_decref(root);
  free(json);
  spot_hist_summary_fini(&s);

  /* The restart's fields survive a round trip. */
  {
    struct spot_hist_event back;
    char err[128];
    for (size_t i = 0; i < n; i++)
      if (ev[i].type == SPOT_HIST_RESTART) {
        assert_int_equal(spot_hist_encode(&ev[i], &json), 0);
        assert_int_equal(
            spot_hist_parse(json, strlen(json), &back, err, sizeof(err)), 0);
        assert_true(back.step == 150);
        assert_float_equal(back.down_s, 12.0, 1e-9);
        free(json);
      }
  }

  /* Killed, no step ever reported: the loss is a lower bound. */
  n = 0;
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0, "k", 0);
  spot_hist_event_init(&ev[n++], SPOT_HIST_LEASE, T0 + S(30), "k", 1);
  spot_hist_event_init(&ev[n++], SPOT_HIST_RUN_START, T0 + S(100), "l", 0);
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.runs[0].outcome, SPOT_HIST_CRASHED);
  assert_true(s.runs[0].lost_bound);
  assert_true(s.lost_bound);
  spot_hist_summary_fini(&s);
}

/* Two ranks preempted once, the final checkpoint committed by both: rank
 * 1 learned of the notice through the store a second after its trainer
 * saved for rank 0 (the checkpoint's state is older than its notice), yet
 * no rank lost anything: the job resumes from that final checkpoint. */
static void
test_multinode_final_loses_nothing(void **state)
{
  struct spot_hist_event ev[12];
  struct spot_hist_summary s;
  size_t n = 0;
  const char *own[2] = {"r0", "r1"};

  (void)state;
  for (int k = 0; k < 2; k++) {
    spot_hist_event_init(&ev[n], SPOT_HIST_RUN_START, T0, own[k], 0);
    SPOT_HIST_SET(&ev[n], run, "run-1");
    ev[n].rank = k;
    ev[n++].nranks = 2;
  }
  spot_hist_event_init(&ev[n], SPOT_HIST_NOTICE, T0 + S(100), "r0", 1);
  ev[n++].step = 400;
  spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(103), "r0", 2);
  SPOT_HIST_SET(&ev[n], checkpoint, "step-401");
  ev[n].save_s = 1;
  ev[n].upload_s = 1.9;
  ev[n].step = 401;
  ev[n++].committed = true;
  /* rank 1: its trainer saved at 100.2 s, it saw the notice at 101.1 s */
  spot_hist_event_init(&ev[n], SPOT_HIST_NOTICE, T0 + 101100, "r1", 1);
  ev[n++].step = 405;
  spot_hist_event_init(&ev[n], SPOT_HIST_CHECKPOINT, T0 + S(103), "r1", 2);
  SPOT_HIST_SET(&ev[n], checkpoint, "step-401");
  ev[n].upload_s = 2.8;
  ev[n].step = 401;
  ev[n++].committed = true;
  for (int k = 0; k < 2; k++) {
    spot_hist_event_init(&ev[n], SPOT_HIST_RUN_END, T0 + S(105), own[k], 3);
    SPOT_HIST_SET(&ev[n], outcome, "preempted");
    ev[n++].committed = true;
  }
  spot_hist_sort(ev, n);
  assert_int_equal(spot_hist_summarize(ev, n, 0, 0, &s), 0);
  assert_int_equal(s.nruns, 1);
  assert_int_equal(s.preemptions, 1);
  assert_true(s.nodes[0].lost_ms == 0 && s.nodes[1].lost_ms == 0);
  assert_true(s.runs[0].lost_ms == 0);
  assert_true(s.runs[0].lost_steps == 0);
  spot_hist_summary_fini(&s);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_bad_events),
      cmocka_unit_test(test_summary),
      cmocka_unit_test(test_crash_and_running),
      cmocka_unit_test(test_summary_saturates),
      cmocka_unit_test(test_killed_lost_steps),
      cmocka_unit_test(test_restarts_ledger),
      cmocka_unit_test(test_multinode_final_loses_nothing),
      cmocka_unit_test(test_multinode_runs),
      cmocka_unit_test(test_refused_start),
      cmocka_unit_test(test_lease_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
