/* Checkpoint requests, uploads and the final checkpoint.
 *
 * Requests: the checkpoint signal on the interval, on `spotctl checkpoint`,
 * on a rebalance and on a drain; one at a time; a request not answered
 * within --ckpt-timeout is dropped with a warning (after a notice the
 * notice's deadline rules instead).
 *
 * Uploads: one push at a time; a checkpoint completed while one runs
 * waits, and the newest waiting one supersedes older waiting ones. Newest
 * by its marker's mtime, not by the order a scan finds folders in: one
 * scan may find several complete, in readdir's order. The push has its
 * own state (enum upload_state): IDLE -> PUSHING -> IDLE for a complete
 * folder; with overlap IDLE -> FOLLOWING (the trainer still writes it),
 * FOLLOWING <-> CAUGHT_UP (all written so far is uploaded), then PUSHING
 * once the folder is noted complete, or IDLE when the push ends first.
 *
 * The final checkpoint (enum final_state) is the one rule of a drain, all
 * of it here: NONE -> REQUESTED (the trainer was asked) -> UPLOADING (its
 * folder is complete) -> COMMITTED, or -> ABANDONED from either (the
 * trainer exited without it, the upload failed, the deadline or the
 * checkpoint timeout passed): then the last commit stays. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control.h"
#include "engine.h"
#include "core/fsm.h"
#include "hist.h"
#include "joblease.h"
#include "core/log.h"
#include "core/manifest.h"
#include "request.h"
#include "spotd.h"
#include "trainer.h"
#include "upload.h"
#include "core/util.h"
#include "watch.h"

static void start_upload(struct spotd *d, const char *name, bool follow);
static bool new_commit(struct spotd *d, const char *name, bool follow,
                       int64_t *step);
static bool complete_note(struct spotd *d, const char *name);
static bool final_complete(struct spotd *d, const char *name);

/* When the marker of folder name was made, in ms of the wall clock; -1
 * when it cannot be read. */
static int64_t
marker_ms(const struct spotd *d, const char *name)
{
  char marker[4300];
  struct stat st;

  snprintf(marker, sizeof(marker), "%s/%s/%s", d->ckpt_dir, name,
           SPOTD_COMPLETE);
  if (lstat(marker, &st) < 0)
    return -1;
  return (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
}

/* The step folder name's marker states, -1 when none (an empty marker,
 * as older trainers write it) or unreadable; warn: say why a marker is
 * not understood. The trainer wrote the file: read at most
 * SPOT_MARKER_MAX + 1 bytes, never through a symlink (store.h). */
static int64_t
marker_step(const struct spotd *d, const char *name, bool warn)
{
  char dir[4300], err[200];
  int64_t step;

  snprintf(dir, sizeof(dir), "%s/%s", d->ckpt_dir, name);
  step = spot_store_marker_step(dir, err, sizeof(err));
  if (step == -EINVAL && warn)
    log_warn("checkpoint %s: ignoring its %s (%s): its step is unknown", name,
             SPOTD_COMPLETE, err);
  return step >= 0 ? step : -1;
}

int64_t
upload_ckpt_step(const struct spotd *d, const char *name)
{
  int64_t step;

  if (d->last_commit[0] != '\0' && strcmp(name, d->last_commit) == 0)
    return d->last_commit_step;
  step = marker_step(d, name, false);
  return step >= 0 ? step : spot_ckpt_name_step(name);
}

/* Whether folder name completed before folder other: both markers read,
 * and name's is older. */
static bool
completed_before(const struct spotd *d, const char *name, const char *other)
{
  int64_t a = marker_ms(d, name), b = marker_ms(d, other);

  return a >= 0 && b >= 0 && a < b;
}

/* ------------------------------------------------------- final state */

static const char *const final_names[] = {
    "none", "requested", "uploading", "committed", "abandoned",
};
_Static_assert(SPOT_ARRAY_SIZE(final_names) == FINAL_STATE_LAST, "final_names");

/* legal[from] is the set of states it may move to. */
#define B(s) SPOT_FSM_BIT(s)
static const uint32_t final_legal[FINAL_STATE_LAST] = {
    [FINAL_NONE] = B(FINAL_REQUESTED),
    [FINAL_REQUESTED] = B(FINAL_UPLOADING) | B(FINAL_ABANDONED),
    [FINAL_UPLOADING] = B(FINAL_COMMITTED) | B(FINAL_ABANDONED),
    [FINAL_COMMITTED] = 0,
    [FINAL_ABANDONED] = 0,
};

static const struct spot_fsm final_fsm = {
    "final checkpoint", final_names, FINAL_STATE_LAST,
    final_legal,        0,           SPOT_LOG_INFO};

const char *
final_state_name(enum final_state s)
{
  return spot_fsm_name(&final_fsm, (unsigned)s);
}

#define final_set_state(d, s) final_set_state_at((d), (s), __FILE__, __LINE__)
static bool
final_set_state_at(struct spotd *d, enum final_state s, const char *file,
                   int line)
{
  struct final_ckpt *f = &d->final;
  int r = f->name[0] != '\0'
              ? spot_fsm_move_detail(&final_fsm, f->state, s, file, line,
                                     "name=%s", f->name)
              : spot_fsm_move(&final_fsm, f->state, s, file, line);

  if (r > 0)
    f->state = s;
  return r >= 0;
}

/* ------------------------------------------------------ upload state */

static const char *const upload_names[] = {
    "idle",
    "following",
    "caught-up",
    "pushing",
};
_Static_assert(SPOT_ARRAY_SIZE(upload_names) == UPLOAD_STATE_LAST,
               "upload_names");

/* A followed folder becomes a complete one, never the reverse: a push of
 * a complete folder only ends. */
static const uint32_t upload_legal[UPLOAD_STATE_LAST] = {
    [UPLOAD_IDLE] = B(UPLOAD_FOLLOWING) | B(UPLOAD_PUSHING),
    [UPLOAD_FOLLOWING] =
        B(UPLOAD_CAUGHT_UP) | B(UPLOAD_PUSHING) | B(UPLOAD_IDLE),
    [UPLOAD_CAUGHT_UP] =
        B(UPLOAD_FOLLOWING) | B(UPLOAD_PUSHING) | B(UPLOAD_IDLE),
    [UPLOAD_PUSHING] = B(UPLOAD_IDLE),
};

static const struct spot_fsm upload_fsm = {
    "upload", upload_names, UPLOAD_STATE_LAST, upload_legal, 0, SPOT_LOG_DEBUG};

const char *
upload_state_name(enum upload_state s)
{
  return spot_fsm_name(&upload_fsm, (unsigned)s);
}

/* The only way the push's state changes. Moves are logged at debug level:
 * the lines "uploading checkpoint", "committed" and "cancelled" already
 * say them at every checkpoint. */
#define upload_set_state(d, s) upload_set_state_at((d), (s), __FILE__, __LINE__)
static bool
upload_set_state_at(struct spotd *d, enum upload_state s, const char *file,
                    int line)
{
  struct upload *u = &d->up;
  int r = u->name[0] != '\0'
              ? spot_fsm_move_detail(&upload_fsm, u->state, s, file, line,
                                     "name=%s", u->name)
              : spot_fsm_move(&upload_fsm, u->state, s, file, line);

  if (r <= 0)
    return r >= 0;
  /* A followed push waits for the trainer while CAUGHT_UP: not upload
   * time, left out of the rate measured (committed()). */
  if (u->wait_since != 0) {
    u->wait_ms += spot_now_mono_ms() - u->wait_since;
    u->wait_since = 0;
  }
  if (s == UPLOAD_CAUGHT_UP)
    u->wait_since = spot_now_mono_ms();
  u->state = s;
  return true;
}

/* Whether the push running follows a folder not noted complete yet. */
static bool
upload_following(const struct spotd *d)
{
  return d->up.state == UPLOAD_FOLLOWING || d->up.state == UPLOAD_CAUGHT_UP;
}

bool
upload_idle(const struct spotd *d)
{
  return d->up.state == UPLOAD_IDLE && d->up.waiting[0] == '\0';
}

void
upload_cancel_all(struct spotd *d)
{
  d->up.waiting[0] = '\0';
  if (d->up.state != UPLOAD_IDLE)
    spot_store_cancel(d->up.op);
}

void
final_give_up(struct spotd *d, const char *why)
{
  const char *last = d->last_commit[0] ? d->last_commit : "none";

  if (d->final.state != FINAL_REQUESTED && d->final.state != FINAL_UPLOADING)
    return;
  /* In its commit phase the manifest PUT (then LATEST's) may be on the
   * wire: what the store holds is not known, and saying "kept" would be
   * a guess. */
  if (d->final.state == FINAL_UPLOADING && d->up.state != UPLOAD_IDLE &&
      d->up.phase >= SPOT_STORE_PHASE_COMMIT &&
      strcmp(d->up.name, d->final.name) == 0) {
    spot_strlcpy(d->final.cut, d->final.name, sizeof(d->final.cut));
    spotd_warn(d,
               "%s: the commit of %s was under way and may be written: the "
               "job resumes from %s if LATEST names it, else from %s",
               why, d->final.name, d->final.name, last);
  } else {
    spotd_warn(d, "%s: the last committed checkpoint (%s) is kept", why, last);
  }
  final_set_state(d, FINAL_ABANDONED);
  upload_cancel_all(d);
}

void
final_deadline(struct spotd *d)
{
  switch (d->final.state) {
  case FINAL_REQUESTED:
    request_drop(d);
    final_give_up(d, "the trainer did not complete a final checkpoint "
                     "before the deadline");
    break;
  case FINAL_UPLOADING:
    final_give_up(d, "the final upload could not finish before the deadline");
    break;
  default:
    if (!upload_idle(d)) {
      log_warn("deadline: cancelling the upload of %s", d->up.name);
      upload_cancel_all(d);
    }
    break;
  }
}

/* A job-wide notice: when the trainers of a multi-node job agree on the
 * step to save at (train_ddp.py), the peer's request already made this
 * trainer save. A folder completed after the peer's notice (by its
 * marker's mtime: the node clocks agree, the save takes a step) is the
 * final one, taken as it is if it is committed or on its way. Asking
 * again would make every rank save, and commit, a second checkpoint.
 * Returns true when it was taken. */
static bool
final_saved_for_peer(struct spotd *d)
{
  const char *name = d->last_complete;
  int64_t at = d->fan.peer_notice_wall_ms;
  bool committed = strcmp(d->last_commit, name) == 0;

  if (at <= 0 || name[0] == '\0' || request_pending(d) ||
      marker_ms(d, name) < at)
    return false;
  if (!committed &&
      (d->up.state == UPLOAD_IDLE || strcmp(d->up.name, name) != 0) &&
      strcmp(d->up.waiting, name) != 0)
    return false; /* not on its way (its upload failed): ask again */
  log_info("checkpoint %s%s was saved after the peer's notice: it is the "
           "final one",
           name, committed ? ", committed," : "");
  if (!committed) {
    (void)final_complete(d, name);
    return true;
  }
  spot_strlcpy(d->final.name, name, sizeof(d->final.name));
  final_set_state(d, FINAL_UPLOADING);
  final_set_state(d, FINAL_COMMITTED);
  return true;
}

/* The trainer has made no step since the checkpoint it resumed from
 * (a notice while it loads, or while its ranks meet): that checkpoint is
 * the final one, there is nothing newer to wait for. Only when the helper
 * says so (request_no_step()); a trainer without it is asked as always.
 * Returns true when it was taken. */
static bool
final_resumed_is_final(struct spotd *d)
{
  const char *name = d->restored_name;

  if (name[0] == '\0' || strcmp(d->last_commit, name) != 0 ||
      request_pending(d) || !request_no_step(d))
    return false;
  log_notice("the trainer has made no step since checkpoint %s, which it "
             "resumed from: that is the final checkpoint",
             name);
  spot_strlcpy(d->final.name, name, sizeof(d->final.name));
  final_set_state(d, FINAL_UPLOADING);
  final_set_state(d, FINAL_COMMITTED);
  return true;
}

/* The upload time spotd keeps for the final checkpoint: its last
 * upload's bytes at that upload's rate, in ms; 0 when none was measured
 * (no checkpoint committed since spotd started). */
static uint64_t
upload_estimate_ms(const struct spotd *d)
{
  if (d->up.last_bps <= 0)
    return 0;
  return (uint64_t)((double)d->up.last_raw / d->up.last_bps * 1000.0);
}

/* The DEADLINE the request carries to the trainer (reqfile.h): when its
 * checkpoint must be complete for spotd to upload it before it gives the
 * final checkpoint up; 0 when the drain has no deadline. */
static void
final_trainer_deadline(struct spotd *d)
{
  int64_t end = spotd_final_deadline_wall(d), at;
  uint64_t upload = upload_estimate_ms(d);
  char when[32];

  if (end <= 0) {
    request_set_deadline(d, 0);
    return;
  }
  at = end - (int64_t)upload;
  if (at <= 0)
    at = 1;
  request_set_deadline(d, at);
  spot_rfc3339_format(at, when, sizeof(when));
  log_info("the trainer's deadline: its checkpoint complete by %s (in %.1f "
           "s): the deadline less %.1f s to stop the trainer and %.1f s for "
           "the upload%s",
           when, (double)(at - spot_now_wall_ms()) / 1000.0,
           (double)(spotd_ms_left(d) - spotd_final_ms_left(d)) / 1000.0,
           (double)upload / 1000.0,
           upload > 0 ? " (the last one's bytes at its rate)"
                      : " (no upload rate measured yet)");
}

/* What the push of folder dir reads, as the store's walk does: regular
 * files (through symlinks), in every subfolder, but the marker. */
static void
folder_size(const char *dir, int depth, uint64_t *files, uint64_t *bytes)
{
  DIR *dp;
  struct dirent *de;

  if (depth > 64 || (dp = opendir(dir)) == NULL)
    return;
  while ((de = readdir(dp)) != NULL) {
    char path[4300];
    struct stat st;

    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
        (depth == 0 && strcmp(de->d_name, SPOTD_COMPLETE) == 0) ||
        (size_t)snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >=
            sizeof(path) ||
        stat(path, &st) < 0)
      continue;
    if (S_ISDIR(st.st_mode)) {
      folder_size(path, depth + 1, files, bytes);
    } else if (S_ISREG(st.st_mode)) {
      (*files)++;
      *bytes += (uint64_t)st.st_size;
    }
  }
  closedir(dp);
}

/* The final checkpoint name is complete and its upload starts (or goes
 * on, when it was followed): one line says what it sends, at what rate,
 * and whether that fits the time left before spotd gives it up (README
 * "The final checkpoint fits the notice"). */
static void
final_fit_log(struct spotd *d, const char *name)
{
  char dir[4300], send[32], rate[32], sofar[64] = "";
  uint64_t files = 0, bytes = 0, done = 0, left = spotd_final_ms_left(d);
  double est, secs_left = (double)left / 1000.0;

  snprintf(dir, sizeof(dir), "%s/%s", d->ckpt_dir, name);
  folder_size(dir, 0, &files, &bytes);
  if (d->up.state != UPLOAD_IDLE && strcmp(d->up.name, name) == 0 &&
      d->up.done_bytes > 0) {
    char all[32];

    done = d->up.done_bytes < bytes ? d->up.done_bytes : bytes;
    snprintf(sofar, sizeof(sofar), " (of %s, the rest uploaded while written)",
             spot_fmt_bytes(bytes, all, sizeof(all)));
  }
  spot_fmt_bytes(bytes - done, send, sizeof(send));
  if (d->up.last_bps <= 0) {
    if (left == UINT64_MAX)
      log_info("final checkpoint %s: %" PRIu64 " file%s, %s to send%s; no "
               "upload rate measured yet (nothing committed since spotd "
               "started); no deadline known",
               name, files, files == 1 ? "" : "s", send, sofar);
    else
      log_info("final checkpoint %s: %" PRIu64 " file%s, %s to send%s; no "
               "upload rate measured yet (nothing committed since spotd "
               "started): whether it fits the %.1f s left is unknown",
               name, files, files == 1 ? "" : "s", send, sofar, secs_left);
    return;
  }
  spot_fmt_bytes((uint64_t)d->up.last_bps, rate, sizeof(rate));
  est = (double)(bytes - done) / d->up.last_bps;
  if (left == UINT64_MAX)
    log_info("final checkpoint %s: %" PRIu64 " file%s, %s to send%s at %s/s "
             "measured, about %.1f s; no deadline known",
             name, files, files == 1 ? "" : "s", send, sofar, rate, est);
  else if (est <= secs_left)
    log_info("final checkpoint %s: %" PRIu64 " file%s, %s to send%s at %s/s "
             "measured, about %.1f s; %.1f s left: fits",
             name, files, files == 1 ? "" : "s", send, sofar, rate, est,
             secs_left);
  else
    spotd_warn(d,
               "final checkpoint %s: %" PRIu64 " file%s, %s to send%s at %s/s "
               "measured, about %.1f s; %.1f s left: will not fit: spotd "
               "uploads it until the time is up, then keeps the last "
               "committed checkpoint (%s)",
               name, files, files == 1 ? "" : "s", send, sofar, rate, est,
               secs_left, d->last_commit[0] ? d->last_commit : "none");
}

void
final_begin(struct spotd *d, const char *reason)
{
  uint64_t left = spotd_ms_left(d);

  if (!trainer_running(d))
    return; /* nothing to ask: FINAL_NONE */
  d->final.name[0] = '\0';
  final_set_state(d, FINAL_REQUESTED);
  if (final_saved_for_peer(d) || final_resumed_is_final(d))
    return;
  /* Before the request (or at once, to the one pending): the trainer
   * reads it with the request. */
  final_trainer_deadline(d);
  /* A checkpoint signalled moments ago counts as the final one. */
  if (!request_pending(d))
    spotd_request_checkpoint(d, reason);
  /* Deadline-aware: say early when it cannot fit. */
  if (d->up.last_bps > 0 && left != UINT64_MAX) {
    double est = (double)d->req.last_save_ms +
                 (double)d->up.last_raw / d->up.last_bps * 1000.0;
    if (est > (double)left)
      spotd_warn(d,
                 "the final checkpoint needs about %.1f s but the deadline "
                 "is in %.1f s: it may not be committed, and then the last "
                 "committed checkpoint (%s) is kept",
                 est / 1000.0, (double)left / 1000.0,
                 d->last_commit[0] ? d->last_commit : "none");
  }
}

/* A complete folder while draining: it is the final checkpoint, and goes
 * first (an older upload is cancelled). Returns true when it was queued. */
static bool
final_complete(struct spotd *d, const char *name)
{
  if (d->eng.state != SPOTD_DRAINING)
    return false;
  if (d->final.state != FINAL_REQUESTED && d->final.state != FINAL_UPLOADING)
    return false;
  spot_strlcpy(d->final.name, name, sizeof(d->final.name));
  final_set_state(d, FINAL_UPLOADING);
  final_fit_log(d, name);
  if (d->up.state != UPLOAD_IDLE && strcmp(d->up.name, name) != 0) {
    log_info("cancelling the upload of %s for the final checkpoint %s",
             d->up.name, name);
    spot_strlcpy(d->up.waiting, name, sizeof(d->up.waiting));
    spot_store_cancel(d->up.op);
    return true;
  }
  return false;
}

/* The push of name ended with err (0: committed). */
static void
final_pushed(struct spotd *d, const char *name, int err)
{
  if (d->final.state != FINAL_UPLOADING || strcmp(name, d->final.name) != 0)
    return;
  if (err == 0)
    final_set_state(d, FINAL_COMMITTED);
  else if (err != -ECANCELED)
    final_give_up(d, "the final checkpoint could not be committed");
}

/* ------------------------------------------------------------ uploads */

/* Whether local folder n is older than the commit keep: by the trainer's
 * step when both are known, else by their markers (the restored folder,
 * which has none, is older than any commit made since). Unknown: no. */
static bool
older_than_commit(const struct spotd *d, const char *n, const char *keep)
{
  int64_t a = upload_ckpt_step(d, n), b = upload_ckpt_step(d, keep);

  if (a >= 0 && b >= 0)
    return a < b;
  return strcmp(n, d->restored_name) == 0 || completed_before(d, n, keep);
}

void
upload_drop_local(struct spotd *d)
{
  char path[4300];

  if (d->up.drop[0] == '\0')
    return;
  snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, d->up.drop);
  d->up.drop[0] = '\0';
  spot_rm_tree(path);
}

/* Local copies older than the newest commit are not needed any more,
 * but for the --keep-local N - 1 newest of them (by step): each takes its
 * full size on the local disk. */
static void
prune_local(struct spotd *d, const char *keep)
{
  const char *old[SPOTD_NAMES_MAX];
  int64_t old_step[SPOTD_NAMES_MAX];
  size_t nold = 0, spare = (size_t)d->cfg->keep_local - 1;

  upload_drop_local(d);
  for (size_t i = 0; i < d->nknown && nold < SPOTD_NAMES_MAX; i++) {
    const char *n = d->known[i];
    char path[4300];
    int64_t step;
    size_t j;

    if (strcmp(n, keep) == 0 || strcmp(n, d->up.waiting) == 0 ||
        (d->up.state != UPLOAD_IDLE && strcmp(n, d->up.name) == 0) ||
        !older_than_commit(d, n, keep))
      continue; /* newer, or not known older: never removed for it */
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, n);
    if (access(path, F_OK) != 0)
      continue;
    /* newest first */
    step = upload_ckpt_step(d, n);
    for (j = nold; j > 0 && old_step[j - 1] < step; j--) {
      old[j] = old[j - 1];
      old_step[j] = old_step[j - 1];
    }
    old[j] = n;
    old_step[j] = step;
    nold++;
  }
  for (size_t i = spare; i < nold; i++) {
    char path[4300];

    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, old[i]);
    log_info("removing local checkpoint %s (committed %s is newer)", old[i],
             keep);
    spot_rm_tree(path);
  }
}

static void
upload_progress_cb(const struct spot_store_progress *p, void *data)
{
  struct spotd *d = data;
  struct upload *u = &d->up;
  double secs = (double)p->elapsed_ms / 1000.0;

  u->phase = p->phase;
  u->done_bytes = p->raw_done;
  u->total_bytes = p->raw_total;
  u->rate = secs > 0 ? (double)p->raw_done / secs : 0;
  /* Following a folder the trainer still writes: once all it wrote is
   * uploaded, what is left is the trainer's save, not the upload (100% at
   * 0 MB/s would say otherwise). */
  if (p->phase == SPOT_STORE_PHASE_TRANSFER && p->marker_pending &&
      p->raw_done >= p->raw_total) {
    if (u->state == UPLOAD_FOLLOWING) {
      u->marker_wait_ms = p->elapsed_ms;
      upload_set_state(d, UPLOAD_CAUGHT_UP);
    }
    if (p->elapsed_ms >= u->log_ms + 2000) {
      char done[32];

      u->log_ms = p->elapsed_ms;
      log_info("uploading %s: the %s written so far is uploaded; waiting for "
               "the trainer's %s marker (%.0f s)",
               p->name, spot_fmt_bytes(p->raw_done, done, sizeof(done)),
               SPOTD_COMPLETE,
               (double)(p->elapsed_ms - u->marker_wait_ms) / 1000.0);
    }
    return;
  }
  /* A wait for the trainer just ended: the next line 2 s from now, not 2 s
   * from the last wait line (its rate would count the wait: "100% at 0
   * MB/s" while the check at the marker runs). */
  if (u->marker_wait_ms != 0)
    u->log_ms = p->elapsed_ms;
  u->marker_wait_ms = 0;
  if (u->state == UPLOAD_CAUGHT_UP)
    upload_set_state(d, UPLOAD_FOLLOWING); /* the trainer wrote more */
  /* One progress line every 2 s for long uploads. */
  if (p->phase == SPOT_STORE_PHASE_TRANSFER && p->raw_total > 0 &&
      p->elapsed_ms >= u->log_ms + 2000) {
    char done[32], total[32];

    u->log_ms = p->elapsed_ms;
    log_info("uploading %s: %s / %s (%.0f%%) at %.0f MB/s, ratio %.2f", p->name,
             spot_fmt_bytes(p->raw_done, done, sizeof(done)),
             spot_fmt_bytes(p->raw_total, total, sizeof(total)),
             100.0 * (double)p->raw_done / (double)p->raw_total, u->rate / 1e6,
             p->stored_done > 0 ? (double)p->raw_done / (double)p->stored_done
                                : 1.0);
  }
}

void
upload_set_last_commit(struct spotd *d, const char *name, int64_t step,
                       int64_t made_ms, int64_t known_ms)
{
  if (name != d->last_commit)
    spot_strlcpy(d->last_commit, name, sizeof(d->last_commit));
  d->last_commit_step = step;
  d->last_commit_made = made_ms;
  d->last_commit_wall = known_ms;
}

static void
committed(struct spotd *d, const char *name,
          const struct spot_store_result *res)
{
  int64_t now;
  double secs = (double)res->elapsed_ms / 1000.0;
  /* the push's own time: less what it waited for the trainer's save */
  uint64_t busy_ms =
      res->elapsed_ms > d->up.wait_ms ? res->elapsed_ms - d->up.wait_ms : 0;
  char waited[96] = "";
  /* Multi-node, rank 0: the line describes the checkpoint committed (every
   * rank's files, as its manifest lists them), then this rank's share. */
  bool merged = res->ckpt_files > 0;
  uint64_t files = merged ? res->ckpt_files : res->files;
  uint64_t raw = merged ? res->ckpt_raw_bytes : res->raw_bytes;
  uint64_t stored = merged ? res->ckpt_stored_bytes : res->stored_bytes;
  char own[128] = "";

  if (merged)
    snprintf(own, sizeof(own),
             "; rank %u uploaded files=%" PRIu64 " raw=%" PRIu64
             " stored=%" PRIu64,
             d->store.rank, res->files, res->raw_bytes, res->stored_bytes);
  if (d->up.wait_ms > 0)
    snprintf(waited, sizeof(waited), "; %.1f s of it waiting for the save",
             (double)d->up.wait_ms / 1000.0);
  log_info("committed checkpoint name=%s files=%" PRIu64 " raw=%" PRIu64
           " stored=%" PRIu64 " ratio=%.2f in %.1f s (%u retries%s)%s",
           name, files, raw, stored,
           stored > 0 ? (double)raw / (double)stored : 1.0, secs, res->retries,
           waited, own);
  if (res->warning != NULL && res->warning[0] != '\0')
    spotd_warn(d, "%s", res->warning);
  /* the step the store recorded: its marker's (there now), else its
   * name's */
  now = spot_now_wall_ms();
  upload_set_last_commit(d, name, upload_ckpt_step(d, name), now, now);
  d->up.failed[0] = '\0';
  if (busy_ms > 0 && res->raw_bytes > 0) {
    d->up.last_bps = (double)res->raw_bytes / ((double)busy_ms / 1000.0);
    d->up.last_raw = res->raw_bytes;
  }
  spotd_notify(d, "STATUS=committed %s", name);
  prune_local(d, name);
}

/* After an upload: the one waiting (the newest complete) goes next. */
static void
start_waiting(struct spotd *d)
{
  if (d->up.waiting[0] != '\0') {
    char next[256];

    spot_strlcpy(next, d->up.waiting, sizeof(next));
    d->up.waiting[0] = '\0';
    start_upload(d, next, false);
  }
  spotd_advance(d);
}

/* A followed push refused its folder once the marker stated its step
 * (-EALREADY): judged as a complete folder is. True when handled. */
static bool
not_new(struct spotd *d, const char *name)
{
  int64_t step;

  if (new_commit(d, name, false, &step))
    return false; /* not known older after all: the failure stands */
  if (d->final.state == FINAL_UPLOADING && strcmp(d->final.name, name) == 0)
    final_pushed(d, name, -ESTALE);
  control_commit_event(d, name, -ESTALE, "older than the committed checkpoint");
  return true;
}

static void
push_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;
  char name[256];
  bool followed = upload_following(d);

  d->up.op = NULL;
  upload_set_state(d, UPLOAD_IDLE);
  spot_strlcpy(name, d->up.name, sizeof(name));
  d->up.name[0] = '\0';
  if (d->closing)
    return;
  if (followed && (res->err == 0 || marker_ms(d, name) >= 0)) {
    (void)complete_note(d, name); /* the push saw the marker first */
    followed = false;
  }
  if (followed && res->err < 0) {
    /* Never complete: nothing was committed, its uploads are gone. If
     * the marker comes after all, the folder is pushed then. */
    log_info("stopped uploading %s before it was complete%s%s", name,
             res->err == -ECANCELED ? "" : ": ",
             res->err == -ECANCELED ? "" : res->message);
    start_waiting(d);
    return;
  }
  if (res->err == -EALREADY && not_new(d, name)) {
    start_waiting(d);
    return;
  }
  hist_pushed(d, name, res);
  if (res->err == 0) {
    committed(d, name, res);
  } else if (res->err == -ECANCELED) {
    log_info("upload of %s cancelled", name);
  } else {
    spotd_warn(d, "upload of checkpoint %s failed: %s", name, res->message);
    spot_strlcpy(d->up.failed, name, sizeof(d->up.failed));
  }
  control_commit_event(d, name, res->err,
                       res->err == 0            ? ""
                       : res->err == -ECANCELED ? "cancelled"
                                                : res->message);
  final_pushed(d, name, res->err);
  start_waiting(d);
}

/* Whether folder name is a new commit after the checkpoint LATEST names
 * as far as this spotd knows (the one it restored or last committed),
 * in the trainer's steps (its marker's, else its name's):
 * - older: never uploaded, the store would refuse to move LATEST back to
 *   it; it stays in --ckpt-dir, for an operator to look at;
 * - the same step (a finished job started again saves its last step
 *   again, maybe with other bytes): not a new commit and not an error;
 *   the committed one stays, the local copy is dropped;
 * - step unknown (either side), and the folder was complete before this
 *   spotd restored its checkpoint: an earlier run's, older than what the
 *   trainer resumed from; kept, not uploaded.
 * Returns true when name is to be uploaded; *step its step. A folder
 * still written (follow) is only not followed when its name says it is
 * not newer: it is judged again once complete. */
static bool
new_commit(struct spotd *d, const char *name, bool follow, int64_t *step)
{
  int64_t ref = d->last_commit_step, at;

  *step = follow ? -1 : marker_step(d, name, true);
  if (*step < 0)
    *step = spot_ckpt_name_step(name);
  if (d->last_commit[0] == '\0')
    return true;
  if (follow)
    return *step < 0 || ref < 0 || *step > ref;
  if (*step >= 0 && ref >= 0 && *step < ref) {
    log_info("not uploading checkpoint %s (step %" PRId64 "): %s (step %" PRId64
             ") is newer; the folder is kept in %s",
             name, *step, d->last_commit, ref, d->ckpt_dir);
    return false;
  }
  if (*step >= 0 && ref >= 0 && *step == ref) {
    /* removed once the trainer is done with it: it may still fsync the
     * folder it has just marked */
    log_info("checkpoint %s holds step %" PRId64 ", as the committed %s "
             "does: not a new commit; its local copy is dropped",
             name, *step, d->last_commit);
    upload_drop_local(d);
    spot_strlcpy(d->up.drop, name, sizeof(d->up.drop));
    if (d->final.state == FINAL_UPLOADING && strcmp(d->final.name, name) == 0) {
      spot_strlcpy(d->final.name, d->last_commit, sizeof(d->final.name));
      final_set_state(d, FINAL_COMMITTED);
    }
    control_commit_event(d, d->last_commit, 0, "");
    return false;
  }
  at = marker_ms(d, name);
  if ((*step < 0 || ref < 0) && d->restored_at_wall > 0 && at >= 0 &&
      at < d->restored_at_wall) {
    log_info("not uploading checkpoint %s: its step is unknown and it was "
             "complete before %s was restored, which the trainer resumed "
             "from; the folder is kept in %s",
             name, d->restored_name, d->ckpt_dir);
    return false;
  }
  return true;
}

static void
start_upload(struct spotd *d, const char *name, bool follow)
{
  struct upload *u = &d->up;
  /* This push's settings: the store's, with what differs per push. */
  struct spot_store_config sc = d->store;
  char dir[4300];
  int64_t step;
  int r;

  if (!new_commit(d, name, follow, &step))
    return;
  /* the push reads the marker's step itself when it has none yet, and
   * refuses a step not past the committed one before its manifest */
  sc.step = follow ? 0 : step;
  sc.step_floor = d->last_commit[0] != '\0' && d->last_commit_step >= 0
                      ? d->last_commit_step + 1
                      : 0;
  snprintf(dir, sizeof(dir), "%s/%s", d->ckpt_dir, name);
  spot_strlcpy(u->name, name, sizeof(u->name));
  u->done_bytes = u->total_bytes = 0;
  u->rate = 0;
  u->log_ms = 0;
  u->marker_wait_ms = 0;
  u->wait_ms = u->wait_since = 0;
  /* This spotd holds the job lease, so it is the job's only writer:
   * uploads begun before it started belong to a dead or fenced
   * predecessor and are aborted by the retention step. The ranks of a
   * multi-node job upload at once: the store's default bound. */
  sc.stale_upload_age_ms =
      d->cfg->nranks > 1
          ? 0
          : (uint64_t)(spot_now_wall_ms() - d->start_wall_ms) + 1000;
  if (!lease_may_commit(d)) {
    u->name[0] = '\0';
    spotd_warn(d, "not uploading checkpoint %s: the job lease is not held",
               name);
    spot_strlcpy(u->failed, name, sizeof(u->failed));
    final_pushed(d, name, -ESTALE);
    return;
  }
  sc.lease_seq = lease_next_seq(d);
  /* After a notice every second counts: start at many transfers at once
   * (within the memory budget); a periodic upload starts gently and grows
   * only while it pays, so training keeps its network. */
  sc.parallel_start = d->eng.state == SPOTD_DRAINING && d->eng.have_notice
                          ? SPOT_STORE_PARALLEL_URGENT
                          : SPOT_STORE_PARALLEL_GENTLE;
  log_info("uploading checkpoint %s%s", name,
           follow ? " while the trainer writes it (overlap)" : "");
  sc.follow = follow;
  upload_set_state(d, follow ? UPLOAD_FOLLOWING : UPLOAD_PUSHING);
  d->up.phase = SPOT_STORE_PHASE_PLAN;
  r = spot_store_push(d->loop, &sc, dir, name, upload_progress_cb, push_done_cb,
                      d, &u->op);
  if (r < 0) {
    u->op = NULL;
    u->name[0] = '\0';
    upload_set_state(d, UPLOAD_IDLE);
  }
  if (r < 0 && follow) {
    log_warn("cannot upload checkpoint %s while it is written: %s", name,
             strerror(-r));
    return; /* it is pushed once complete */
  }
  if (r < 0) {
    spotd_warn(d, "cannot upload checkpoint %s: %s", name, strerror(-r));
    spot_strlcpy(u->failed, name, sizeof(u->failed));
    final_pushed(d, name, r);
  }
}

/* Whether the push running follows name, which is not complete yet. */
static bool
following(const struct spotd *d, const char *name)
{
  return upload_following(d) && strcmp(d->up.name, name) == 0;
}

void
upload_follow_maybe(struct spotd *d, const char *name)
{
  char path[4300];
  struct stat st;
  int64_t signal_wall;

  /* dedup hashes whole files before it uploads: it waits for the marker */
  if (!d->cfg->overlap || d->store.dedup || !request_pending(d) || d->closing ||
      d->cfg->nranks > 1 || !upload_idle(d) || d->up.follow_seq == d->req.seq ||
      watch_is_known(d, name) ||
      (d->eng.state != SPOTD_RUNNING && d->eng.state != SPOTD_DRAINING) ||
      !lease_may_commit(d))
    return;
  /* A folder the trainer made for this request, not one an earlier save
   * left behind: changed since the signal (1 s of clock slack). */
  signal_wall = spot_now_wall_ms() -
                (int64_t)(spot_now_mono_ms() - d->req.signal_mono) - 1000;
  snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, name);
  if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) ||
      (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000 <
          signal_wall)
    return;
  d->up.follow_seq = d->req.seq;
  start_upload(d, name, true);
}

void
upload_follow_drop(struct spotd *d, const char *why)
{
  char marker[4300];
  struct stat st;

  if (!upload_following(d))
    return;
  snprintf(marker, sizeof(marker), "%s/%s/%s", d->ckpt_dir, d->up.name,
           SPOTD_COMPLETE);
  if (lstat(marker, &st) == 0)
    return; /* complete after all: the push sees it */
  log_info("%s: not uploading %s, which is not complete", why, d->up.name);
  spot_store_cancel(d->up.op);
}

/* A folder is complete: the bookkeeping, and the final checkpoint rule.
 * Returns true when final_complete() queued it. */
static bool
complete_note(struct spotd *d, const char *name)
{
  /* The folder followed is complete: its push is now an ordinary one. */
  if (following(d, name))
    upload_set_state(d, UPLOAD_PUSHING);
  watch_mark_known(d, name);
  hist_complete(d, name);
  spot_strlcpy(d->last_complete, name, sizeof(d->last_complete));
  request_completed(d);
  log_info("checkpoint %s is complete%s", name,
           d->eng.state == SPOTD_DRAINING ? " (final)" : "");
  return final_complete(d, name);
}

int
spotd_checkpoint_complete(struct spotd *d, const char *name)
{
  char path[4300];
  struct stat st;
  bool mine;

  if (d->closing)
    return -ECANCELED;
  if (!spot_ckpt_name_valid(name) || name[0] == '.')
    return -EINVAL;
  if (watch_is_known(d, name))
    return -EALREADY;
  snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, name);
  if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
    return -ENOENT;
  mine = following(d, name);
  if (complete_note(d, name))
    return 0;
  snprintf(path, sizeof(path), "%s/%s/%s", d->ckpt_dir, name, SPOTD_COMPLETE);
  if (mine && lstat(path, &st) < 0) {
    /* `done` without the marker file: the follow would wait for it */
    spot_strlcpy(d->up.waiting, name, sizeof(d->up.waiting));
    spot_store_cancel(d->up.op);
  }
  if (mine) {
    /* its upload runs already and sees the marker itself: now */
    spot_store_push_poke(d->up.op);
    spotd_advance(d);
    return 0;
  }
  if (upload_following(d)) {
    /* a newer checkpoint is complete: the one followed never will be */
    log_info("checkpoint %s is complete: not uploading %s, which is not", name,
             d->up.name);
    spot_strlcpy(d->up.waiting, name, sizeof(d->up.waiting));
    spot_store_cancel(d->up.op);
    spotd_advance(d);
    return 0;
  }
  if (d->up.state != UPLOAD_IDLE) {
    const char *newer = d->up.waiting[0] != '\0' ? d->up.waiting : d->up.name;

    if (completed_before(d, name, newer)) {
      /* found by the same scan as a newer one, after it */
      log_info("checkpoint %s is older than %s: not uploading it", name, newer);
      spotd_advance(d);
      return 0;
    }
    if (d->up.waiting[0] != '\0')
      log_info("checkpoint %s supersedes %s, which waited for upload", name,
               d->up.waiting);
    spot_strlcpy(d->up.waiting, name, sizeof(d->up.waiting));
  } else {
    start_upload(d, name, false);
  }
  spotd_advance(d);
  return 0;
}
