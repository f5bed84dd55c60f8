/* `spotctl status`: the daemon's state as the status object of proto.h. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "joblease.h"
#include "core/manifest.h"
#include "relaunch.h"
#include "startup.h"
#include "spotd.h"
#include "status.h"
#include "trainer.h"
#include "upload.h"
#include "core/util.h"
#include "io/meta.h"

/* Multi-node: "ranks": {rank, nranks, run, restored: {files, bytes,
 * raw_bytes, checkpoint_bytes, checkpoint_raw_bytes}} (bytes are stored,
 * i.e. downloaded, bytes). */
static json_t *
restored_json(struct spotd *d, json_t *j)
{
  const struct restored *r = &d->restored;
  json_t *ranks;

  if (j == NULL || d->store.nranks <= 1)
    return j;
  ranks = json_pack("{s:i, s:i, s:s}", "rank", (int)d->store.rank, "nranks",
                    (int)d->store.nranks, "run", d->fan.run);
  if (ranks != NULL && r->done)
    json_object_set_new(
        ranks, "restored",
        json_pack("{s:I, s:I, s:I, s:I, s:I}", "files", (json_int_t)r->files,
                  "bytes", (json_int_t)r->stored_bytes, "raw_bytes",
                  (json_int_t)r->raw_bytes, "checkpoint_bytes",
                  (json_int_t)r->ckpt_stored_bytes, "checkpoint_raw_bytes",
                  (json_int_t)r->ckpt_raw_bytes));
  if (ranks != NULL)
    json_object_set_new(j, "ranks", ranks);
  return j;
}

/* Steps per second need reports at least this far apart (a trainer may
 * report every step, a few ms apart). */
#define STEPS_RATE_MS 1000

void
status_step(struct spotd *d, int64_t step)
{
  uint64_t now = spot_now_mono_ms();

  if (d->steps.step < 0 || step < d->steps.step) {
    /* the first report, or a restarted trainer that resumed earlier */
    d->steps.rate = -1;
    d->steps.ref_step = step;
    d->steps.ref_ms = now;
  } else if (now >= d->steps.ref_ms + STEPS_RATE_MS) {
    d->steps.rate = (double)(step - d->steps.ref_step) * 1000.0 /
                    (double)(now - d->steps.ref_ms);
    d->steps.ref_step = step;
    d->steps.ref_ms = now;
  }
  d->steps.step = step;
}

/* The steps since the last committed checkpoint's step (the step its name
 * states); every step without a commit; -1 when the commit's step is
 * unknown. */
static int64_t
steps_at_risk(const struct spotd *d)
{
  int64_t at;

  if (d->steps.step < 0)
    return -1;
  if (d->last_commit[0] == '\0')
    return d->steps.step;
  at = d->last_commit_step;
  if (at < 0)
    return -1;
  return d->steps.step > at ? d->steps.step - at : 0;
}

json_t *
spotd_status_json(struct spotd *d)
{
  struct spot_proto_status st;
  char deadline[32] = "", commit_time[32] = "";
  char rtimes[SPOT_PROTO_MAX_RELAUNCH][32];
  const char *mw;
  json_t *j;
  uint64_t now = spot_now_mono_ms();

  memset(&st, 0, sizeof(st));
  st.state = spotd_state_name(d->eng.state);
  st.job = d->cfg->job;
  st.store = d->store_url;
  st.provider = d->meta != NULL
                    ? spot_provider_name(spot_meta_provider(d->meta))
                    : "none";
  if (d->eng.have_notice || d->eng.state == SPOTD_DRAINING) {
    st.has_notice = true;
    st.notice.kind = d->eng.reason[0] ? d->eng.reason : d->eng.notice.reason;
    st.notice.seconds_left = -1;
    if (d->eng.deadline_wall != 0) {
      spot_rfc3339_format(d->eng.deadline_wall, deadline, sizeof(deadline));
      st.notice.deadline = deadline;
    }
    if (d->eng.deadline_mono != 0)
      st.notice.seconds_left =
          d->eng.deadline_mono > now
              ? (int64_t)(d->eng.deadline_mono - now) / 1000
              : 0;
  }
  if (trainer_running(d)) {
    st.has_trainer = true;
    st.trainer.pid = d->trainer.pid;
    st.trainer.uptime_s = (int64_t)(now - d->trainer.start_ms) / 1000;
    st.trainer.restart_count = d->restarts.count;
    st.trainer.step = d->steps.step;
    st.trainer.steps_per_s = d->steps.rate;
    st.trainer.steps_at_risk = steps_at_risk(d);
  }
  if (d->last_commit[0] != '\0') {
    st.has_last_commit = true;
    st.last_commit.name = d->last_commit;
    spot_rfc3339_format(d->last_commit_wall, commit_time, sizeof(commit_time));
    st.last_commit.time = commit_time;
    st.last_commit.age_s = (spot_now_wall_ms() - d->last_commit_wall) / 1000;
  }
  if (d->up.state != UPLOAD_IDLE && d->up.name[0] != '\0') {
    const struct upload *u = &d->up;

    st.has_upload = true;
    st.upload.name = u->name;
    st.upload.bytes_done = u->done_bytes;
    st.upload.bytes_total = u->total_bytes;
    st.upload.rate = u->rate;
    st.upload.eta_s = -1;
    if (u->rate > 0 && u->total_bytes >= u->done_bytes)
      st.upload.eta_s =
          (int64_t)((double)(u->total_bytes - u->done_bytes) / u->rate);
  }
  for (size_t i = 0;
       i < d->nwarnings && st.n_warnings < SPOT_PROTO_MAX_WARNINGS; i++)
    st.warnings[st.n_warnings++] = d->warnings[i];
  mw = d->meta != NULL ? spot_meta_warning(d->meta) : NULL;
  if (mw != NULL && st.n_warnings < SPOT_PROTO_MAX_WARNINGS)
    st.warnings[st.n_warnings++] = mw;
  for (size_t i = 0; i < d->relaunch.n; i++) {
    const struct relaunch_attempt *a = &d->relaunch.attempts[i];

    spot_rfc3339_format(a->wall_ms, rtimes[i], sizeof(rtimes[i]));
    st.relaunch[i].time = rtimes[i];
    st.relaunch[i].reason = a->reason;
    st.relaunch[i].exit_status = a->exit_status;
    st.relaunch[i].ok = a->ok;
  }
  st.n_relaunch = d->relaunch.n;
  j = restored_json(d, spot_proto_status_to_json(&st));
  if (j != NULL)
    lease_status(d, j);
  if (j != NULL && d->restored_name[0] != '\0')
    json_object_set_new(j, "restored", json_string(d->restored_name));
  /* --max-restarts: {used, max, last_status|last_signal} */
  if (j != NULL && d->cfg->max_restarts > 0) {
    json_t *r = json_pack("{s:I, s:I}", "used", (json_int_t)d->crash.used,
                          "max", (json_int_t)d->cfg->max_restarts);

    if (r != NULL && d->crash.used > 0)
      json_object_set_new(
          r, d->crash.last_signal ? "last_signal" : "last_status",
          json_integer(d->crash.last_signal ? d->crash.last_signal
                                            : d->crash.last_status));
    if (r != NULL)
      json_object_set_new(j, "restarts", r);
  }
  return j;
}
