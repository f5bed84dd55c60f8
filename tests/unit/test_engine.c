/* The engine's step function alone (daemon/engine.c on lib/core, no
 * libuv): whole runs replayed from INIT to EXIT as tables of events, each
 * with the facts the driver would read and the commands the engine must
 * answer, in order, and the state it must be in after. Nothing of the
 * engine is set by hand: every run starts at spotd_engine_init() and only
 * events move it. Then the legal moves: the table refuses what it does
 * not allow, and nothing moves an exited engine. */
#include "cmocka-compat.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

/* The clocks at the start of every run. */
#define T0 UINT64_C(5000000)
#define W0 INT64_C(1700000000000)

/* Facts, as bits of a row. */
#define TR (1u << 0)   /* the trainer runs */
#define ST (1u << 1)   /* the trainer was started */
#define BUSY (1u << 2) /* an upload runs */
#define REQ (1u << 3)  /* a checkpoint request is pending */
#define LOST (1u << 4) /* the job lease is lost */
#define EXH (1u << 5)  /* --max-restarts used up */
#define INTR (1u << 6) /* a notice interrupted a restart */
#define SAME (1u << 7) /* the final commit is the restored checkpoint */

struct row {
  enum spotd_event_kind ev;
  uint64_t t; /* ms after T0 */
  int code;   /* FAIL, SIGNAL, TRAINER_EXITED */
  bool run_it;
  const struct spot_notice *notice;
  unsigned f;
  enum final_state final;
  const char *last; /* the last commit, NULL none */
  const char *want; /* the commands, as render() writes them */
  enum spotd_state st;
  bool refused;
  const char *log; /* a line the step logs holds this (NULL: not checked) */
};

struct scenario {
  const char *name;
  struct spotd_engine_config cfg;
  const struct row *rows;
};

static const struct spot_notice aws = {
    .provider = SPOT_PROVIDER_AWS,
    .kind = SPOT_NOTICE_TERMINATE,
    .deadline_mono_ms = T0 + 120000,
    .deadline_wall_ms = W0 + 120000,
    .id = "i-1@2026-12-07T03:00:00Z",
    .reason = "aws-spot-terminate",
};

static const struct spot_notice gcp_short = {
    .provider = SPOT_PROVIDER_GCP,
    .kind = SPOT_NOTICE_TERMINATE,
    .deadline_mono_ms = T0 + 40000,
    .deadline_wall_ms = W0 + 40000,
    .id = "preempted",
    .reason = "gcp-preempted",
};

static const struct spot_notice azure = {
    .provider = SPOT_PROVIDER_AZURE,
    .kind = SPOT_NOTICE_TERMINATE,
    .deadline_mono_ms = T0 + 60000,
    .deadline_wall_ms = W0 + 60000,
    .id = "602d9444-d2cd-49c7-8624-8643e7171297",
    .reason = "azure-preempt",
};

static const struct spot_notice peer = {
    .provider = SPOT_PROVIDER_NONE,
    .kind = SPOT_NOTICE_TERMINATE,
    .deadline_mono_ms = T0 + 100000,
    .deadline_wall_ms = W0 + 100000,
    .id = "rank-1",
    .reason = "aws-spot-terminate",
};

static const struct spot_notice rebalance = {
    .provider = SPOT_PROVIDER_AWS,
    .kind = SPOT_NOTICE_REBALANCE,
    .id = "rebalance-1",
    .reason = "aws-rebalance",
};

/* Whether a line the step logs (a LOG command: the engine writes none
 * itself) holds text. */
static bool
logged(const struct spotd_cmds *o, const char *text)
{
  for (unsigned i = 0; i < o->n; i++)
    if (o->c[i].kind == SPOTD_CMD_LOG && strstr(o->c[i].text, text) != NULL)
      return true;
  return false;
}

/* The commands as one line: their names, with what they carry. */
static void
render(const struct spotd_cmds *o, char *buf, size_t size)
{
  size_t len = 0;

  buf[0] = '\0';
  for (unsigned i = 0; i < o->n && len < size; i++) {
    const struct spotd_cmd *c = &o->c[i];
    int w;

    if (c->kind == SPOTD_CMD_LOG)
      continue; /* the lines: logged() */
    w = snprintf(buf + len, size - len, "%s%s", len > 0 ? " " : "",
                 spotd_cmd_name(c->kind));

    if (w < 0)
      break;
    len += (size_t)w;
    if (len >= size)
      break;
    switch (c->kind) {
    case SPOTD_CMD_NOTIFY:
      w = snprintf(buf + len, size - len, ":%s",
                   strncmp(c->text, "STATUS=", 7) == 0 ? c->text + 7 : c->text);
      break;
    case SPOTD_CMD_START_TRAINER:
    case SPOTD_CMD_RUNNING:
    case SPOTD_CMD_EXIT:
      w = snprintf(buf + len, size - len, ":%d", c->arg);
      break;
    case SPOTD_CMD_STOP_TRAINER:
    case SPOTD_CMD_ARM_DEADLINE:
      w = snprintf(buf + len, size - len, ":%" PRIu64, c->ms);
      break;
    case SPOTD_CMD_ACK:
    case SPOTD_CMD_PUBLISH:
    case SPOTD_CMD_HIST_NOTICE:
      w = snprintf(buf + len, size - len, ":%s",
                   c->notice != NULL ? c->notice->reason : "NULL");
      break;
    default:
      w = 0;
      break;
    }
    if (w < 0)
      break;
    len += (size_t)w;
  }
}

static void
facts_of(const struct row *r, struct spotd_facts *f)
{
  memset(f, 0, sizeof(*f));
  f->trainer_running = (r->f & TR) != 0;
  f->trainer_started = (r->f & ST) != 0;
  f->upload_idle = (r->f & BUSY) == 0;
  f->request_pending = (r->f & REQ) != 0;
  f->lease_lost = (r->f & LOST) != 0;
  f->final = r->final;
  f->final_is_restored = (r->f & SAME) != 0;
  f->final_cut = "";
  f->last_commit = r->last != NULL ? r->last : "";
  f->last_commit_made = W0 - 60000;
  f->upload_failed = "";
  f->crash_exhausted = (r->f & EXH) != 0;
  f->crash_interrupted = (r->f & INTR) != 0;
  f->crash_last_status = 1;
  f->crash_used = 1;
}

/* Replays sc from INIT; every row's commands, state and refusal must be
 * the ones it says. Returns the exit status the run ended with. */
static int
replay(const struct scenario *sc)
{
  struct spotd_engine e;
  struct spotd_cmds out;
  char got[1024];
  int exit_code = -1;

  print_message("# %s\n", sc->name);
  spotd_engine_init(&e, &sc->cfg);
  assert_int_equal(e.state, SPOTD_INIT);
  for (size_t i = 0; sc->rows[i].want != NULL; i++) {
    const struct row *r = &sc->rows[i];
    struct spotd_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.kind = r->ev;
    ev.now_mono = T0 + r->t;
    ev.now_wall = W0 + (int64_t)r->t;
    ev.code = r->code;
    ev.run_it = r->run_it;
    ev.notice = r->notice;
    facts_of(r, &ev.facts);
    spotd_engine_step(&e, &ev, &out);
    render(&out, got, sizeof(got));
    if (strcmp(got, r->want) != 0 || e.state != r->st ||
        out.refused != r->refused)
      print_error("%s, row %zu (%s): got [%s] in %s%s, want [%s] in %s%s\n",
                  sc->name, i, spotd_event_name(r->ev), got,
                  spotd_state_name(e.state), out.refused ? " (refused)" : "",
                  r->want, spotd_state_name(r->st),
                  r->refused ? " (refused)" : "");
    assert_string_equal(got, r->want);
    assert_int_equal(e.state, r->st);
    assert_int_equal(out.refused, r->refused);
    assert_int_equal(out.dropped, 0);
    if (r->log != NULL && !logged(&out, r->log))
      fail_msg("%s, row %zu (%s): no log line holds \"%s\"", sc->name, i,
               spotd_event_name(r->ev), r->log);
    for (unsigned k = 0; k < out.n; k++)
      if (out.c[k].kind == SPOTD_CMD_EXIT) {
        assert_int_equal(exit_code, -1); /* once */
        exit_code = out.c[k].arg;
      }
  }
  /* every run ends exited, with the status the engine holds */
  assert_int_equal(e.state, SPOTD_EXITING);
  assert_int_equal(e.exit_code, exit_code);
  return exit_code;
}

/* The startup every run goes through, to RUNNING at t = 1000. */
#define STARTUP                                                                \
  {.ev = SPOTD_EV_STARTED,                                                     \
   .want = "notify:connecting",                                                \
   .st = SPOTD_CONNECTING},                                                    \
      {.ev = SPOTD_EV_RESTORING,                                               \
       .t = 200,                                                               \
       .want = "notify:restoring",                                             \
       .st = SPOTD_RESTORING},                                                 \
      {.ev = SPOTD_EV_LAUNCH,                                                  \
       .t = 900,                                                               \
       .want = "fanout-start start-trainer:0",                                 \
       .st = SPOTD_RESTORING},                                                 \
  {                                                                            \
    .ev = SPOTD_EV_TRAINER_STARTED, .t = 1000, .f = TR | ST,                   \
    .want = "notify:running running:0", .st = SPOTD_RUNNING                    \
  }

#define END                                                                    \
  {                                                                            \
    .want = NULL                                                               \
  }

/* The trainer ends by itself, status 0: its upload finishes, the lease is
 * released, exit 0. */
static const struct row clean_finish[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 60000,
     .code = 0,
     .f = ST | BUSY,
     .last = "ckpt-5",
     .want = "trainer-gone notify:finishing advance",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 60001,
     .f = ST | BUSY,
     .last = "ckpt-5",
     .want = "",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 65000,
     .f = ST,
     .last = "ckpt-6",
     .want = "release-lease",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 65100,
     .f = ST,
     .last = "ckpt-6",
     .want = "notify:exiting hist-end exit:0",
     .st = SPOTD_EXITING},
    /* what still arrives does nothing */
    {.ev = SPOTD_EV_ADVANCE,
     .t = 65200,
     .f = ST,
     .want = "",
     .st = SPOTD_EXITING},
    END,
};

/* A notice while the trainer runs: the final checkpoint (requested,
 * uploaded, committed), the relaunch step, the trainer stopped, exit 75.
 * The deadline is armed 2 s before the notice's (120 s - 10 s - 2 s);
 * the trainer's grace is --grace (30 s), well inside the deadline. */
static const struct row notice_relaunch[] = {
    STARTUP,
    {.ev = SPOTD_EV_NOTICE,
     .t = 10000,
     .notice = &aws,
     .f = TR | ST,
     .last = "ckpt-8",
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate "
             "stop-interval notify:draining request-final "
             "arm-deadline:108000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 10001,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-8",
     .want = "",
     .st = SPOTD_DRAINING},
    /* the same notice again (the metadata repeats it): nothing new */
    {.ev = SPOTD_EV_NOTICE,
     .t = 12000,
     .notice = &aws,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-8",
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 20000,
     .f = TR | ST | BUSY,
     .final = FINAL_UPLOADING,
     .last = "ckpt-8",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 28000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "disarm-deadline notify:relaunching claim-relaunch",
     .st = SPOTD_RELAUNCHING},
    {.ev = SPOTD_EV_CLAIM,
     .t = 28001,
     .run_it = true,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "run-relaunch",
     .st = SPOTD_RELAUNCHING},
    {.ev = SPOTD_EV_RELAUNCH_ENDED,
     .t = 30000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "notify:stopping stop-trainer:30000",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 31000,
     .code = 143,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 31001,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 31200,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-9",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* SIGTERM: a drain of 90 s (--relaunch set, but a stop relaunches
 * nothing), the final checkpoint committed: exit 0. */
static const struct row sigterm_drain[] = {
    STARTUP,
    {.ev = SPOTD_EV_SIGNAL,
     .t = 10000,
     .code = 15,
     .f = TR | ST,
     .last = "ckpt-3",
     .want = "publish:sigterm stop-interval notify:draining request-final "
             "arm-deadline:88000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 10001,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-3",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 20000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "disarm-deadline notify:stopping stop-trainer:30000",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 21000,
     .code = 143,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 21001,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 21100,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "notify:exiting hist-end exit:0",
     .st = SPOTD_EXITING},
    END,
};

/* The trainer fails (status 1), no peer's notice, a restart (backoff,
 * restore, start again: restarts.c), then it finishes: exit 0. */
static const struct row crash_restart_ok[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 5000,
     .code = 1,
     .f = ST,
     .last = "ckpt-1",
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 5100,
     .f = ST,
     .last = "ckpt-1",
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_RESTART_BEGIN,
     .t = 5101,
     .f = ST,
     .last = "ckpt-1",
     .want = "notify:restarting",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 7000,
     .f = ST,
     .last = "ckpt-1",
     .want = "restart-advance",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_RELAUNCH_TRAINER,
     .t = 8000,
     .f = ST,
     .last = "ckpt-1",
     .want = "start-trainer:1",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_TRAINER_STARTED,
     .t = 8001,
     .f = TR | ST,
     .last = "ckpt-1",
     .want = "notify:running running:1",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 50000,
     .code = 0,
     .f = ST,
     .last = "ckpt-7",
     .want = "trainer-gone notify:finishing advance",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 50001,
     .f = ST,
     .last = "ckpt-7",
     .want = "release-lease",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 50100,
     .f = ST,
     .last = "ckpt-7",
     .want = "notify:exiting hist-end exit:0",
     .st = SPOTD_EXITING},
    END,
};

/* --max-restarts 1: the second failure finds them used up: exit 70. */
static const struct row restarts_used_up[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 5000,
     .code = 1,
     .f = ST,
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 5100,
     .f = ST,
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_RESTART_BEGIN,
     .t = 5101,
     .f = ST,
     .want = "notify:restarting",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_RELAUNCH_TRAINER,
     .t = 8000,
     .f = ST,
     .want = "start-trainer:1",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_TRAINER_STARTED,
     .t = 8001,
     .f = TR | ST,
     .want = "notify:running running:1",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 9000,
     .code = 1,
     .f = ST,
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 9100,
     .f = ST,
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_NO_RESTART,
     .t = 9101,
     .f = ST | EXH,
     .want = "notify:finishing release-lease",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 9200,
     .f = ST | EXH,
     .want = "notify:exiting hist-end exit:70",
     .st = SPOTD_EXITING},
    END,
};

/* No --max-restarts: a failed trainer's status is spotd's (a warning says
 * it is not relaunched), once its upload is done. */
static const struct row crash_no_restarts[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 5000,
     .code = 2,
     .f = ST | BUSY,
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 5100,
     .f = ST | BUSY,
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_NO_RESTART,
     .t = 5101,
     .f = ST | BUSY,
     .want = "warn notify:finishing",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 6000,
     .f = ST,
     .want = "release-lease",
     .st = SPOTD_FINISHING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 6100,
     .f = ST,
     .want = "notify:exiting hist-end exit:2",
     .st = SPOTD_EXITING},
    END,
};

/* The job lease lost while the trainer runs: uploads cancelled, the
 * trainer frozen and killed, exit 73 once it is gone. */
static const struct row lease_lost[] = {
    STARTUP,
    {.ev = SPOTD_EV_LEASE_LOST,
     .t = 30000,
     .f = TR | ST | BUSY,
     .last = "ckpt-2",
     .want = "cancel-uploads freeze stop-trainer:0 notify:stopping",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 30100,
     .code = 137,
     .f = ST | LOST | BUSY,
     .last = "ckpt-2",
     .want = "notify:exiting hist-end exit:73",
     .st = SPOTD_EXITING},
    END,
};

/* The lease lost while a failed trainer is being restarted (none runs):
 * exit 73 at once. */
static const struct row lease_lost_restarting[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 5000,
     .code = 1,
     .f = ST,
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 5100,
     .f = ST,
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_RESTART_BEGIN,
     .t = 5101,
     .f = ST,
     .want = "notify:restarting",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_LEASE_LOST,
     .t = 6000,
     .f = ST | LOST,
     .want = "cancel-uploads notify:exiting hist-end exit:73",
     .st = SPOTD_EXITING},
    END,
};

/* A notice while the startup restores: the trainer is never started; once
 * the restore is done the engine drains (nothing to ask) and exits 75 on
 * the restored commit. */
static const struct row notice_during_restore[] = {
    {.ev = SPOTD_EV_STARTED,
     .want = "notify:connecting",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_RESTORING,
     .t = 200,
     .want = "notify:restoring",
     .st = SPOTD_RESTORING},
    {.ev = SPOTD_EV_NOTICE,
     .t = 500,
     .notice = &aws,
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate",
     .st = SPOTD_RESTORING},
    {.ev = SPOTD_EV_LAUNCH,
     .t = 3000,
     .last = "ckpt-10",
     .want = "fanout-start stop-interval notify:draining request-final "
             "arm-deadline:115000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 3001,
     .last = "ckpt-10",
     .want = "disarm-deadline notify:stopping release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 3100,
     .last = "ckpt-10",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* The same with nothing committed in the store: exit 76. */
static const struct row notice_during_connect_nothing[] = {
    {.ev = SPOTD_EV_STARTED,
     .want = "notify:connecting",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_NOTICE,
     .t = 500,
     .notice = &aws,
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_LAUNCH,
     .t = 3000,
     .want = "fanout-start stop-interval notify:draining request-final "
             "arm-deadline:115000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 3001,
     .want = "disarm-deadline notify:stopping release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 3100,
     .want = "notify:exiting hist-end exit:76",
     .st = SPOTD_EXITING},
    END,
};

/* A peer's notice (fanout.c): drained as the node's own, but not
 * published again; the relaunch claim goes to another rank; exit 75. */
static const struct row peer_notice_claim_lost[] = {
    STARTUP,
    {.ev = SPOTD_EV_JOB_NOTICE,
     .t = 20000,
     .notice = &peer,
     .f = TR | ST,
     .last = "ckpt-4",
     .want = "hist-notice:aws-spot-terminate stop-interval notify:draining "
             "request-final arm-deadline:78000 advance",
     .st = SPOTD_DRAINING},
    /* a claim or an end before RELAUNCHING is not the engine's to act on */
    {.ev = SPOTD_EV_CLAIM,
     .t = 20001,
     .run_it = true,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-4",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_RELAUNCH_ENDED,
     .t = 20002,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-4",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 40000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "disarm-deadline notify:relaunching claim-relaunch",
     .st = SPOTD_RELAUNCHING},
    /* another notice changes nothing now */
    {.ev = SPOTD_EV_JOB_NOTICE,
     .t = 40001,
     .notice = &aws,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "hist-notice:aws-spot-terminate",
     .st = SPOTD_RELAUNCHING},
    /* rank 0's marker landed first: this rank runs no relaunch step; the
     * trainer gets its --grace (the deadline is 55 s away) */
    {.ev = SPOTD_EV_CLAIM,
     .t = 45000,
     .run_it = false,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "notify:stopping stop-trainer:30000",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 46000,
     .code = 0,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 46001,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 46100,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-5",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* A short notice (40 s): the deadline passes before the final commit; the
 * final checkpoint is given up, the trainer gets what is left of the
 * deadline (1 s), the last commit stays: exit 75. */
static const struct row deadline_passes[] = {
    STARTUP,
    {.ev = SPOTD_EV_NOTICE,
     .t = 10000,
     .notice = &gcp_short,
     .f = TR | ST,
     .last = "ckpt-2",
     .want = "hist-notice:gcp-preempted publish:gcp-preempted "
             "stop-interval notify:draining request-final "
             "arm-deadline:28000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 30000,
     .f = TR | ST | BUSY,
     .final = FINAL_UPLOADING,
     .last = "ckpt-2",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_DEADLINE,
     .t = 38000,
     .f = TR | ST | BUSY,
     .final = FINAL_UPLOADING,
     .last = "ckpt-2",
     .want = "final-deadline advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 38001,
     .f = TR | ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-2",
     .want = "disarm-deadline notify:stopping stop-trainer:999",
     .st = SPOTD_STOPPING},
    /* the deadline again (a late timer): not the drain's any more */
    {.ev = SPOTD_EV_DEADLINE,
     .t = 38002,
     .f = TR | ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-2",
     .want = "",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 39000,
     .code = 143,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-2",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 39001,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-2",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 39100,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-2",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* `spotctl checkpoint --final`: a notice of the engine's own, with
 * SIGTERM's 90 s, told to the other ranks first; exit 75. A rebalance
 * recommendation before it only asks for an early checkpoint. */
static const struct row operator_final[] = {
    STARTUP,
    {.ev = SPOTD_EV_NOTICE,
     .t = 2000,
     .notice = &rebalance,
     .f = TR | ST,
     .want = "hist-notice:aws-rebalance request-checkpoint",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_OPERATOR_FINAL,
     .t = 10000,
     .f = TR | ST,
     .last = "ckpt-3",
     .want = "publish:spotctl-final hist-notice:spotctl-final stop-interval "
             "notify:draining request-final arm-deadline:88000 advance",
     .st = SPOTD_DRAINING},
    /* again: only while running */
    {.ev = SPOTD_EV_OPERATOR_FINAL,
     .t = 10001,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-3",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 15000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "disarm-deadline notify:stopping stop-trainer:30000",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 16000,
     .code = 0,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 16001,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 16100,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-4",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* The trainer exits while the drain waits for its final checkpoint: the
 * request is given up (the final-checkpoint rule), the last commit
 * stays; an Azure notice is acknowledged once drained; exit 75. */
static const struct row trainer_exits_in_drain[] = {
    STARTUP,
    {.ev = SPOTD_EV_NOTICE,
     .t = 10000,
     .notice = &azure,
     .f = TR | ST,
     .last = "ckpt-6",
     .want = "hist-notice:azure-preempt publish:azure-preempt "
             "stop-interval notify:draining request-final "
             "arm-deadline:48000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 10001,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-6",
     .want = "",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 12000,
     .code = 1,
     .f = ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-6",
     .want = "trainer-gone advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 12001,
     .f = ST,
     .final = FINAL_REQUESTED,
     .last = "ckpt-6",
     .want = "final-give-up advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 12002,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-6",
     .want = "disarm-deadline ack:azure-preempt notify:stopping "
             "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 12100,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-6",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* SIGTERM while a notice's drain stops the trainer: finish that drain
 * (its relaunch and status kept); with the final checkpoint committed
 * the trainer is stopped now. A second signal stops at once: 128 + 15. */
static const struct row second_signal[] = {
    STARTUP,
    {.ev = SPOTD_EV_NOTICE,
     .t = 10000,
     .notice = &aws,
     .f = TR | ST,
     .last = "ckpt-1",
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate "
             "stop-interval notify:draining request-final "
             "arm-deadline:108000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_SIGNAL,
     .t = 11000,
     .code = 15,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-2",
     .want = "stop-trainer:0",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_SIGNAL,
     .t = 12000,
     .code = 15,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-2",
     .want = "notify:exiting hist-end exit:143",
     .st = SPOTD_EXITING},
    /* a third: already exiting */
    {.ev = SPOTD_EV_SIGNAL,
     .t = 12001,
     .code = 2,
     .want = "",
     .st = SPOTD_EXITING},
    END,
};

/* SIGTERM in a pod (SPOTD_TERMINATION_GRACE=30): the node goes away, a
 * preemption: 30 s, in the history as a notice, and 75 (not 128 + 15)
 * without a final commit; 2 ranks: told to the others. */
static const struct row sigterm_reclaim[] = {
    STARTUP,
    {.ev = SPOTD_EV_SIGNAL,
     .t = 10000,
     .code = 15,
     .f = TR | ST,
     .last = "ckpt-3",
     .want = "hist-notice:sigterm publish:sigterm stop-interval "
             "notify:draining request-final arm-deadline:28000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_DEADLINE,
     .t = 38000,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .last = "ckpt-3",
     .want = "final-deadline advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 38001,
     .f = TR | ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-3",
     .want = "disarm-deadline notify:stopping stop-trainer:999",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 39000,
     .code = 137,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-3",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 39001,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-3",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 39100,
     .f = ST,
     .final = FINAL_ABANDONED,
     .last = "ckpt-3",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* A notice during a SIGTERM's drain starts the drain again on the
 * notice's deadline (no new state: no STATUS=); still a stop: exit 0 on
 * the final commit. */
static const struct row notice_in_sigterm_drain[] = {
    STARTUP,
    {.ev = SPOTD_EV_SIGNAL,
     .t = 10000,
     .code = 15,
     .f = TR | ST,
     .want = "publish:sigterm stop-interval notify:draining request-final "
             "arm-deadline:88000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_NOTICE,
     .t = 20000,
     .notice = &aws,
     .f = TR | ST | REQ,
     .final = FINAL_REQUESTED,
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate "
             "stop-interval request-final arm-deadline:98000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 30000,
     .f = TR | ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-1",
     .want = "disarm-deadline notify:stopping stop-trainer:30000",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 31000,
     .code = 0,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-1",
     .want = "trainer-gone advance",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 31001,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-1",
     .want = "release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 31100,
     .f = ST,
     .final = FINAL_COMMITTED,
     .last = "ckpt-1",
     .want = "notify:exiting hist-end exit:0",
     .st = SPOTD_EXITING},
    END,
};

/* A notice while a failed trainer is being restarted: the restart is
 * abandoned, nothing runs to ask, the newest commit is kept: 75. */
static const struct row notice_while_restarting[] = {
    STARTUP,
    {.ev = SPOTD_EV_TRAINER_EXITED,
     .t = 5000,
     .code = 1,
     .f = ST,
     .last = "ckpt-1",
     .want = "trainer-gone peer-check",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_PEER_CHECKED,
     .t = 5100,
     .f = ST,
     .last = "ckpt-1",
     .want = "try-restart",
     .st = SPOTD_RUNNING},
    {.ev = SPOTD_EV_RESTART_BEGIN,
     .t = 5101,
     .f = ST,
     .last = "ckpt-1",
     .want = "notify:restarting",
     .st = SPOTD_RESTARTING},
    {.ev = SPOTD_EV_NOTICE,
     .t = 6000,
     .notice = &aws,
     .f = ST,
     .last = "ckpt-1",
     .want = "hist-notice:aws-spot-terminate publish:aws-spot-terminate "
             "abandon-restart stop-interval notify:draining request-final "
             "arm-deadline:112000 advance",
     .st = SPOTD_DRAINING},
    {.ev = SPOTD_EV_ADVANCE,
     .t = 6001,
     .f = ST | INTR,
     .last = "ckpt-1",
     .want = "disarm-deadline notify:stopping release-lease",
     .st = SPOTD_STOPPING},
    {.ev = SPOTD_EV_LEASE_RELEASED,
     .t = 6100,
     .f = ST | INTR,
     .last = "ckpt-1",
     .want = "notify:exiting hist-end exit:75",
     .st = SPOTD_EXITING},
    END,
};

/* A signal before the trainer runs stops at once; so does a command that
 * cannot be started (127) and a failure of the start (the status it
 * says). */
static const struct row signal_while_connecting[] = {
    {.ev = SPOTD_EV_STARTED,
     .want = "notify:connecting",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_SIGNAL,
     .t = 100,
     .code = 2,
     .want = "notify:exiting hist-end exit:130",
     .st = SPOTD_EXITING},
    END,
};

static const struct row no_command[] = {
    {.ev = SPOTD_EV_STARTED,
     .want = "notify:connecting",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_LAUNCH,
     .t = 900,
     .want = "fanout-start start-trainer:0",
     .st = SPOTD_CONNECTING},
    {.ev = SPOTD_EV_FAIL,
     .t = 901,
     .code = 127,
     .want = "notify:exiting hist-end exit:127",
     .st = SPOTD_EXITING},
    END,
};

static const struct row close_undecided[] = {
    {.ev = SPOTD_EV_CLOSE,
     .want = "notify:exiting hist-end exit:71",
     .st = SPOTD_EXITING},
    END,
};

/* Moves the table refuses: the event changes nothing but says so. */
static const struct row refused_moves[] = {
    STARTUP,
    {.ev = SPOTD_EV_RESTORING,
     .t = 2000,
     .f = TR | ST,
     .want = "",
     .st = SPOTD_RUNNING,
     .refused = true},
    {.ev = SPOTD_EV_STARTED,
     .t = 2001,
     .f = TR | ST,
     .want = "",
     .st = SPOTD_RUNNING,
     .refused = true},
    {.ev = SPOTD_EV_SIGNAL,
     .t = 3000,
     .code = 15,
     .f = TR | ST,
     .want = "publish:sigterm stop-interval notify:draining request-final "
             "arm-deadline:88000 advance",
     .st = SPOTD_DRAINING},
    /* a failed trainer is not restarted once draining */
    {.ev = SPOTD_EV_RESTART_BEGIN,
     .t = 3001,
     .f = ST,
     .want = "",
     .st = SPOTD_DRAINING,
     .refused = true},
    {.ev = SPOTD_EV_TRAINER_STARTED,
     .t = 3002,
     .f = ST,
     .want = "",
     .st = SPOTD_DRAINING,
     .refused = true},
    {.ev = SPOTD_EV_FAIL,
     .t = 3003,
     .code = 71,
     .want = "notify:exiting hist-end exit:71",
     .st = SPOTD_EXITING},
    /* exited: nothing moves it */
    {.ev = SPOTD_EV_FAIL,
     .t = 3004,
     .code = 69,
     .want = "",
     .st = SPOTD_EXITING},
    {.ev = SPOTD_EV_NOTICE,
     .t = 3005,
     .notice = &aws,
     .want = "",
     .st = SPOTD_EXITING},
    END,
};

#define CFG_DEFAULT                                                            \
  {                                                                            \
    .job = "engine-test", .grace_ms = 30000, .nranks = 1                       \
  }

static void
test_replays(void **state)
{
  static const struct {
    struct scenario sc;
    int exit_code;
  } runs[] = {
      {{"clean finish", CFG_DEFAULT, clean_finish}, 0},
      {{"notice, final checkpoint, relaunch",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .relaunch = true},
        notice_relaunch},
       75},
      {{"SIGTERM drain",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .relaunch = true},
        sigterm_drain},
       0},
      {{"crash, restart, success",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .max_restarts = 3},
        crash_restart_ok},
       0},
      {{"restarts used up",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .max_restarts = 1},
        restarts_used_up},
       70},
      {{"crash without restarts", CFG_DEFAULT, crash_no_restarts}, 2},
      {{"lease lost", CFG_DEFAULT, lease_lost}, 73},
      {{"lease lost while restarting",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .max_restarts = 2},
        lease_lost_restarting},
       73},
      {{"notice during restore", CFG_DEFAULT, notice_during_restore}, 75},
      {{"notice while connecting, nothing committed", CFG_DEFAULT,
        notice_during_connect_nothing},
       76},
      {{"peer notice, relaunch claim lost",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 2,
         .relaunch = true},
        peer_notice_claim_lost},
       75},
      {{"deadline before the final commit", CFG_DEFAULT, deadline_passes}, 75},
      {{"operator --final", CFG_DEFAULT, operator_final}, 75},
      {{"trainer exits during the drain (Azure)", CFG_DEFAULT,
        trainer_exits_in_drain},
       75},
      {{"second signal", CFG_DEFAULT, second_signal}, 128 + 15},
      {{"SIGTERM in a pod",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 2,
         .termination_grace = "30"},
        sigterm_reclaim},
       75},
      {{"notice in a SIGTERM drain",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .relaunch = true},
        notice_in_sigterm_drain},
       0},
      {{"notice while restarting",
        {.job = "engine-test",
         .grace_ms = 30000,
         .nranks = 1,
         .max_restarts = 2},
        notice_while_restarting},
       75},
      {{"signal while connecting", CFG_DEFAULT, signal_while_connecting},
       128 + 2},
      {{"no command", CFG_DEFAULT, no_command}, 127},
      {{"closed undecided", CFG_DEFAULT, close_undecided}, 71},
      {{"refused moves", CFG_DEFAULT, refused_moves}, 71},
  };

  (void)state;
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++)
    assert_int_equal(replay(&runs[i].sc), runs[i].exit_code);
}

/* A SIGTERM with no final commit and nothing committed: a stop says
 * 128 + 15; the same in a pod is a preemption with nothing saved, 76. */
static void
test_sigterm_nothing_committed(void **state)
{
  static const struct row stop[] = {
      STARTUP,
      {.ev = SPOTD_EV_SIGNAL,
       .t = 5000,
       .code = 15,
       .f = TR | ST,
       .want = "publish:sigterm stop-interval notify:draining "
               "request-final arm-deadline:88000 advance",
       .st = SPOTD_DRAINING,
       .log = "signal 15: final checkpoint, then stop"},
      {.ev = SPOTD_EV_TRAINER_EXITED,
       .t = 6000,
       .code = 143,
       .f = ST | REQ,
       .final = FINAL_REQUESTED,
       .want = "trainer-gone advance",
       .st = SPOTD_DRAINING},
      {.ev = SPOTD_EV_ADVANCE,
       .t = 6001,
       .f = ST,
       .final = FINAL_REQUESTED,
       .want = "final-give-up advance",
       .st = SPOTD_DRAINING},
      {.ev = SPOTD_EV_ADVANCE,
       .t = 6002,
       .f = ST,
       .final = FINAL_ABANDONED,
       .want = "disarm-deadline notify:stopping release-lease",
       .st = SPOTD_STOPPING},
      {.ev = SPOTD_EV_LEASE_RELEASED,
       .t = 6100,
       .f = ST,
       .final = FINAL_ABANDONED,
       .want = "notify:exiting hist-end exit:143",
       .st = SPOTD_EXITING,
       .log = "stopped: no checkpoint of job engine-test is committed"},
      END,
  };
  static const struct row pod[] = {
      STARTUP,
      {.ev = SPOTD_EV_SIGNAL,
       .t = 5000,
       .code = 15,
       .f = TR | ST,
       .want = "hist-notice:sigterm publish:sigterm stop-interval "
               "notify:draining request-final arm-deadline:3000 advance",
       .st = SPOTD_DRAINING,
       .log = "SIGTERM grace: 5 s (SPOTD_TERMINATION_GRACE)"},
      {.ev = SPOTD_EV_TRAINER_EXITED,
       .t = 6000,
       .code = 143,
       .f = ST | REQ,
       .final = FINAL_REQUESTED,
       .want = "trainer-gone advance",
       .st = SPOTD_DRAINING},
      {.ev = SPOTD_EV_ADVANCE,
       .t = 6001,
       .f = ST,
       .final = FINAL_REQUESTED,
       .want = "final-give-up advance",
       .st = SPOTD_DRAINING},
      {.ev = SPOTD_EV_ADVANCE,
       .t = 6002,
       .f = ST,
       .final = FINAL_ABANDONED,
       .want = "disarm-deadline notify:stopping release-lease",
       .st = SPOTD_STOPPING},
      {.ev = SPOTD_EV_LEASE_RELEASED,
       .t = 6100,
       .f = ST,
       .final = FINAL_ABANDONED,
       .want = "notify:exiting hist-end exit:76",
       .st = SPOTD_EXITING},
      END,
  };
  const struct scenario a = {"SIGTERM, nothing committed", CFG_DEFAULT, stop};
  const struct scenario b = {"SIGTERM in a pod, nothing committed",
                             {.job = "engine-test",
                              .grace_ms = 30000,
                              .nranks = 1,
                              .termination_grace = "5"},
                             pod};

  (void)state;
  assert_int_equal(replay(&a), 128 + 15);
  assert_int_equal(replay(&b), 76);
}

/* The deadline arithmetic: the final checkpoint's share ends 2 s before
 * the deadline, the trainer's 1 s before; none without a deadline. */
static void
test_deadline_math(void **state)
{
  static const struct spotd_engine_config cfg = CFG_DEFAULT;
  struct spotd_engine e;
  struct spotd_cmds out;
  struct spotd_event ev;

  (void)state;
  spotd_engine_init(&e, &cfg);
  assert_int_equal(spotd_engine_ms_left(&e, T0), UINT64_MAX);
  assert_int_equal(spotd_engine_final_ms_left(&e, T0), UINT64_MAX);
  assert_int_equal(spotd_engine_final_deadline_wall(&e), 0);
  memset(&ev, 0, sizeof(ev));
  ev.now_mono = T0;
  ev.now_wall = W0;
  ev.kind = SPOTD_EV_STARTED;
  spotd_engine_step(&e, &ev, &out);
  ev.kind = SPOTD_EV_LAUNCH;
  spotd_engine_step(&e, &ev, &out);
  ev.kind = SPOTD_EV_TRAINER_STARTED;
  ev.facts.trainer_running = true;
  spotd_engine_step(&e, &ev, &out);
  ev.kind = SPOTD_EV_NOTICE;
  ev.notice = &aws;
  spotd_engine_step(&e, &ev, &out);
  assert_int_equal(e.state, SPOTD_DRAINING);
  assert_int_equal(spotd_engine_ms_left(&e, T0 + 20000), 100000);
  assert_int_equal(spotd_engine_final_ms_left(&e, T0 + 20000), 98000);
  assert_int_equal(spotd_engine_final_ms_left(&e, T0 + 119000), 0);
  assert_int_equal(spotd_engine_ms_left(&e, T0 + 200000), 0);
  assert_int_equal(spotd_engine_final_deadline_wall(&e), W0 + 118000);
}

/* Every state, event and command has its name. */
static void
test_names(void **state)
{
  (void)state;
  for (int s = 0; s < SPOTD_STATE_LAST; s++)
    assert_string_not_equal(spotd_state_name((enum spotd_state)s), "?");
  for (int k = 0; k < SPOTD_EV_LAST; k++)
    assert_string_not_equal(spotd_event_name((enum spotd_event_kind)k), "?");
  for (int k = 0; k < SPOTD_CMD_LAST; k++)
    assert_string_not_equal(spotd_cmd_name((enum spotd_cmd_kind)k), "?");
  assert_string_equal(spotd_state_name(SPOTD_STATE_LAST), "?");
  assert_string_equal(spotd_state_name(SPOTD_EXITING), "exiting");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replays),
      cmocka_unit_test(test_sigterm_nothing_committed),
      cmocka_unit_test(test_deadline_math),
      cmocka_unit_test(test_names),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
