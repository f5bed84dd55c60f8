/* The startup, one operation (struct restore_op, enum restore_state):
 *
 *   CONNECTING  credentials and the S3 client (none: exit 69)
 *   PROBING     the store check (probe.c): write, read, delete under the
 *               job root, or exit 69 with one line
 *   LEASING     the job lease (lease.c): wait while another node holds
 *               it, then take it (rank 0 only in a multi-node job)
 *   RESUMING    a push a killed spotd left (journal.c), finished first so
 *               the restore brings the newest checkpoint back
 *   RESTORING   the newest committed checkpoint into CKPT_DIR/NAME
 *   COUNTING    the store's RESTARTS (restarts.c)
 *   JOINING     a multi-node job outside Slurm: the run id (runjoin.c)
 *   DONE        then spotd_launch(); or FAILED (spotd_fail()) or CANCELLED
 *
 * A restore that fails on the local disk (res->local: no space, read-only,
 * no permission) ends the start with exit 74 and one line with the bytes
 * needed and free; a checkpoint of another rank count with exit 65. Only
 * damage in the store itself makes fallback.c try an older checkpoint.
 *
 * Once spotd is closing (a signal during the startup), every callback of
 * this operation only records CANCELLED: the exit status the signal set
 * stays. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "fallback.h"
#include "core/fsm.h"
#include "hist.h"
#include "joblease.h"
#include "journal.h"
#include "core/log.h"
#include "io/aws.h"
#include "probe.h"
#include "restarts.h"
#include "startup.h"
#include "runjoin.h"
#include "spotd.h"
#include "upload.h"
#include "core/util.h"
#include "watch.h"

static const char *const names[] = {
    [RESTORE_NONE] = "none",           [RESTORE_CONNECTING] = "connecting",
    [RESTORE_PROBING] = "probing",     [RESTORE_LEASING] = "leasing",
    [RESTORE_RESUMING] = "resuming",   [RESTORE_RESTORING] = "restoring",
    [RESTORE_COUNTING] = "counting",   [RESTORE_JOINING] = "joining",
    [RESTORE_DONE] = "done",           [RESTORE_FAILED] = "failed",
    [RESTORE_CANCELLED] = "cancelled",
};
_Static_assert(SPOT_ARRAY_SIZE(names) == RESTORE_STATE_LAST, "names");

#define B(s) SPOT_FSM_BIT(s)
static const uint32_t legal[RESTORE_STATE_LAST] = {
    [RESTORE_NONE] = B(RESTORE_CONNECTING),
    [RESTORE_CONNECTING] = B(RESTORE_PROBING) | B(RESTORE_FAILED),
    [RESTORE_PROBING] = B(RESTORE_LEASING) | B(RESTORE_RESUMING) |
                        B(RESTORE_RESTORING) | B(RESTORE_JOINING) |
                        B(RESTORE_DONE) | B(RESTORE_FAILED),
    [RESTORE_LEASING] = B(RESTORE_RESUMING) | B(RESTORE_RESTORING) |
                        B(RESTORE_JOINING) | B(RESTORE_DONE) |
                        B(RESTORE_FAILED),
    [RESTORE_RESUMING] =
        B(RESTORE_RESTORING) | B(RESTORE_JOINING) | B(RESTORE_DONE),
    [RESTORE_RESTORING] = B(RESTORE_COUNTING) | B(RESTORE_JOINING) |
                          B(RESTORE_DONE) | B(RESTORE_FAILED),
    [RESTORE_COUNTING] = B(RESTORE_JOINING) | B(RESTORE_DONE),
    [RESTORE_JOINING] = B(RESTORE_DONE) | B(RESTORE_FAILED),
};

/* Closing: whatever was running ends as CANCELLED, from any state. */
static const struct spot_fsm restore_fsm = {
    "startup",     names, RESTORE_STATE_LAST, legal, B(RESTORE_CANCELLED),
    SPOT_LOG_DEBUG};

const char *
restore_state_name(enum restore_state s)
{
  return spot_fsm_name(&restore_fsm, (unsigned)s);
}

#define set_state(d, s) set_state_at((d), (s), __FILE__, __LINE__)
static bool
set_state_at(struct spotd *d, enum restore_state s, const char *file, int line)
{
  int r = spot_fsm_move(&restore_fsm, d->restore.state, s, file, line);

  if (r > 0)
    d->restore.state = s;
  return r >= 0;
}

/* A callback of this operation after close: record it, do nothing. */
static bool
cancelled(struct spotd *d)
{
  d->restore.op = NULL;
  if (!d->closing)
    return false;
  set_state(d, RESTORE_CANCELLED);
  return true;
}

/* The folders a restore downloads into: spotd's own and the store's
 * temporary one next to it (".NAME.spotd-restore-XXXXXX"). */
#define RESUME_DIR ".spotd-resume"
#define RESUME_PARTIAL "..spotd-resume.spotd-restore-"

/* Removes what a restore left half-downloaded in the checkpoint folder:
 * a spotd killed during its restore leaves it, and nothing else would
 * ever remove it. */
static void
remove_partial(struct spotd *d)
{
  char path[4400];
  DIR *dir;
  struct dirent *de;

  snprintf(path, sizeof(path), "%s/" RESUME_DIR, d->ckpt_dir);
  if (access(path, F_OK) == 0)
    spot_rm_tree(path);
  dir = opendir(d->ckpt_dir);
  if (dir == NULL)
    return;
  while ((de = readdir(dir)) != NULL) {
    if (strncmp(de->d_name, RESUME_PARTIAL, strlen(RESUME_PARTIAL)) != 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, de->d_name);
    log_info("removing %s, an incomplete restore download", path);
    spot_rm_tree(path);
  }
  closedir(dir);
}

/* Folders of the checkpoint folder that hold no SPOTD_COMPLETE marker
 * before the trainer starts: an earlier run's saves that never finished
 * (never uploaded, never removed by spotd: a restored copy has no marker
 * either, and a folder may be the only copy of someone's bytes). Said in
 * one line, so the disk they take is no surprise. */
static void
report_unmarked(struct spotd *d)
{
  char found[512] = "", path[4400];
  size_t len = 0;
  unsigned n = 0;
  DIR *dir = opendir(d->ckpt_dir);
  struct dirent *de;
  struct stat st;

  if (dir == NULL)
    return;
  while ((de = readdir(dir)) != NULL) {
    if (de->d_name[0] == '.' || strcmp(de->d_name, d->restored_name) == 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, de->d_name);
    if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
      continue;
    snprintf(path, sizeof(path), "%s/%s/" SPOTD_COMPLETE, d->ckpt_dir,
             de->d_name);
    if (lstat(path, &st) == 0)
      continue;
    n++;
    if (len < sizeof(found) - 1) {
      int w = snprintf(found + len, sizeof(found) - len, "%s%s",
                       len > 0 ? ", " : "", de->d_name);
      len = w > 0 ? len + (size_t)w : len;
      if (len >= sizeof(found))
        len = sizeof(found) - 1;
    }
  }
  closedir(dir);
  if (n > 0)
    log_warn("%u folder%s in %s ha%s no %s marker and will never be "
             "uploaded (an earlier run's unfinished saves or restored "
             "copies): %s; remove what is not needed to free the disk",
             n, n == 1 ? "" : "s", d->ckpt_dir, n == 1 ? "s" : "ve",
             SPOTD_COMPLETE, found);
}

static void
fail_code(struct spotd *d, int exit_code)
{
  hist_refused(d, "restore");
  set_state(d, RESTORE_FAILED);
  remove_partial(d);
  spotd_fail(d, exit_code);
}

static void
fail(struct spotd *d, int exit_code)
{
  fail_code(d, exit_code);
}

static void
done(struct spotd *d)
{
  if (runjoin_needed(d)) {
    set_state(d, RESTORE_JOINING);
    runjoin_start(d); /* restore_joined() follows */
    return;
  }
  set_state(d, RESTORE_DONE);
  report_unmarked(d);
  spotd_launch(d);
}

void
restore_joined(struct spotd *d, int err)
{
  if (d->closing) {
    set_state(d, RESTORE_CANCELLED);
    return;
  }
  if (err < 0) {
    fail(d, SPOTD_EXIT_UNAVAILABLE); /* the store could not be listed */
    return;
  }
  done(d);
}

void
restore_counted(struct spotd *d)
{
  if (d->closing)
    return;
  done(d);
}

/* What this rank downloaded, for the log and `spotctl status`. */
static void
restored_record(struct spotd *d, const struct spot_store_result *res)
{
  struct restored *r = &d->restored;

  r->files = res->files;
  r->raw_bytes = res->raw_bytes;
  r->stored_bytes = res->stored_bytes;
  r->ckpt_raw_bytes = res->ckpt_raw_bytes;
  r->ckpt_stored_bytes = res->ckpt_stored_bytes;
  r->done = true;
  if (d->store.nranks > 1)
    log_info("rank %u restored %" PRIu64 " files: %" PRIu64
             " bytes downloaded (%" PRIu64 " raw) of the checkpoint's %" PRIu64
             " (%" PRIu64 " raw)",
             d->store.rank, res->files, res->stored_bytes, res->raw_bytes,
             res->ckpt_stored_bytes, res->ckpt_raw_bytes);
}

/* The restored folder becomes CKPT_DIR/NAME; SPOTD_RESUME_DIR points at
 * it (multi-node: at its rank-N subfolder), absolute. */
int
restore_place(struct spotd *d, const struct spot_store_result *res)
{
  char tmp[4300], dst[4300], mine[4400];
  int64_t now;

  snprintf(tmp, sizeof(tmp), "%s/" RESUME_DIR, d->ckpt_dir);
  snprintf(dst, sizeof(dst), "%s/%s", d->ckpt_dir, res->name);
  if (access(dst, F_OK) == 0)
    spot_rm_tree(dst);
  if (rename(tmp, dst) < 0) {
    int e = errno;

    log_err("restore: the local disk failed, not the store: moving %s to "
            "%s: %s; no older checkpoint is restored",
            tmp, dst, strerror(e));
    return -e;
  }
  log_info("restored checkpoint %s into %s (%" PRIu64 " bytes in %.1f s)",
           res->name, dst, res->raw_bytes, (double)res->elapsed_ms / 1000.0);
  restored_record(d, res);
  /* One node, or --reshard (every rank's folder is here; the trainer
   * reshards): the whole folder. Multi-node: this node restored its own
   * rank-K/ folder (and the files shared by all ranks); its trainer
   * resumes from rank-K/. */
  spot_strlcpy(d->resume_dir, dst, sizeof(d->resume_dir));
  if (d->store.nranks > 1 && res->ckpt_nranks == d->store.nranks) {
    snprintf(mine, sizeof(mine), "%s/rank-%u", dst, d->store.rank);
    if (strlen(mine) < sizeof(d->resume_dir) && access(mine, F_OK) == 0) {
      spot_strlcpy(d->resume_dir, mine, sizeof(d->resume_dir));
    } else {
      log_warn("checkpoint %s holds no files of rank %u: no "
               "SPOTD_RESUME_DIR",
               res->name, d->store.rank);
      d->resume_dir[0] = '\0';
    }
  }
  spot_strlcpy(d->restored_name, res->name, sizeof(d->restored_name));
  d->restored_at_wall = spot_now_wall_ms();
  if (d->fb.nbad > 0) {
    log_warn("restored checkpoint %s instead of the newest, which failed "
             "verification (see above)",
             res->name);
    /* the trainer's next commits replace it, whatever its step */
    spot_strlcpy(d->store.latest_damaged, d->fb.bad[0],
                 sizeof(d->store.latest_damaged));
  }
  /* The restored checkpoint was committed by an earlier run: the last
   * line names that time, not this restore's. */
  now = spot_now_wall_ms();
  upload_set_last_commit(d, res->name, res->step,
                         res->created_ms > 0 ? res->created_ms : now, now);
  watch_mark_known(d, res->name);
  hist_restored(d, res);
  return 0;
}

void
restore_failed(struct spotd *d, int exit_code)
{
  fail_code(d, exit_code);
}

static void
restore_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;

  if (cancelled(d))
    return;
  restore_finished(d, res);
}

void
restore_finished(struct spotd *d, const struct spot_store_result *res)
{
  if (res->err == -ENOENT && strstr(res->message, "LATEST") != NULL &&
      d->fb.nbad == 0) {
    log_info("no committed checkpoint for job %s: starting fresh", d->cfg->job);
    done(d);
    return;
  }
  if (res->err < 0 && res->local) {
    /* The disk, not the store: an older checkpoint would roll the
     * training back for nothing, and calling the store damaged could get
     * good checkpoints deleted. */
    bool full = res->err == -ENOSPC || res->err == -EDQUOT;

    log_err("restore: the local disk failed, not the store: %s; no older "
            "checkpoint is restored: %s %s or give --ckpt-dir %s, then start "
            "again",
            res->message, full ? "free space in" : "make writable", d->ckpt_dir,
            full ? "a disk with room" : "another folder");
    fail_code(d, SPOTD_EXIT_IOERR);
    return;
  }
  if (res->err == -EXDEV) { /* the rank count: the message says both */
    log_err("restore: %s", res->message);
    fail_code(d, SPOTD_EXIT_DATAERR);
    return;
  }
  if (res->err < 0) {
    if (fallback_damage(res) && fallback_next(d, res))
      return;
    /* Not damage, not the local disk: the store cannot be reached or
     * refused (the network, the server, permissions): exit 69 as the
     * probe's. */
    log_err("restore failed: %s", res->message);
    fail(d, res->err == -ENOMEM ? SPOTD_EXIT_ERROR : SPOTD_EXIT_UNAVAILABLE);
    return;
  }
  if (restore_place(d, res) < 0) {
    fail_code(d, SPOTD_EXIT_IOERR);
    return;
  }
  set_state(d, RESTORE_COUNTING);
  restarts_fetch(d);
}

void
restore_store_config(const struct spotd *d, struct spot_store_config *sc)
{
  *sc = d->store;
  /* place() replaces CKPT_DIR/NAME: the store may remove that old copy
   * first when the checkpoint fits only without it */
  sc->replace_parent = d->ckpt_dir;
  /* The trainer waits for the restore: start many transfers at once. */
  sc->parallel_start = SPOT_STORE_PARALLEL_URGENT;
}

static void
begin_restore(struct spotd *d)
{
  struct spot_store_config sc;
  char tmp[4300];
  int r;

  if (!d->cfg->restore) {
    done(d);
    return;
  }
  set_state(d, RESTORE_RESTORING);
  spotd_restoring(d);
  remove_partial(d);
  snprintf(tmp, sizeof(tmp), "%s/" RESUME_DIR, d->ckpt_dir);
  restore_store_config(d, &sc);
  r = spot_store_restore(d->loop, &sc, NULL, tmp, NULL, restore_done_cb, d,
                         &d->restore.op);
  if (r < 0) {
    d->restore.op = NULL;
    log_err_errno(r, "restore");
    fail(d, SPOTD_EXIT_ERROR);
  }
}

static void
resume_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;

  if (cancelled(d))
    return;
  if (res->err == 0)
    log_info("resumed and committed checkpoint %s left by the previous spotd "
             "(%u parts were already stored)",
             res->name, res->resumed_parts);
  else
    spotd_warn(d, "the upload of %s left by the previous spotd failed: %s",
               res->name, res->message);
  begin_restore(d);
}

/* Returns true when a push of a journaled upload was started. */
static bool
resume_journaled(struct spotd *d)
{
  char name[256], dir[4300];
  struct spot_store_config sc = d->store;
  int r;

  if (!journal_find(d, name, sizeof(name)) || !lease_may_commit(d))
    return false;
  sc.lease_seq = lease_next_seq(d);
  /* the step its marker states: LATEST's step rule judges it before its
   * manifest is written */
  sc.step = upload_ckpt_step(d, name);
  log_info("the previous spotd was interrupted while uploading %s: resuming "
           "that upload",
           name);
  set_state(d, RESTORE_RESUMING);
  spotd_restoring(d);
  watch_mark_known(d, name);
  snprintf(dir, sizeof(dir), "%s/%s", d->ckpt_dir, name);
  r = spot_store_push(d->loop, &sc, dir, name, NULL, resume_done_cb, d,
                      &d->restore.op);
  if (r < 0) {
    d->restore.op = NULL;
    spotd_warn(d, "cannot resume the upload of %s: %s", name, strerror(-r));
    return false;
  }
  return true;
}

static void
aws_ready_cb(int err, const char *msg, void *data)
{
  struct spotd *d = data;
  struct spot_s3_config sc;
  int r;

  if (cancelled(d))
    return;
  if (err < 0) {
    /* No credentials (or no region) to reach the store with: the store
     * is not available, as when the probe fails. */
    log_err("%s", msg[0] ? msg : strerror(-err));
    fail(d, err == -ENOMEM ? SPOTD_EXIT_ERROR : SPOTD_EXIT_UNAVAILABLE);
    return;
  }
  memset(&sc, 0, sizeof(sc));
  spot_aws_s3_config(d->aws, &sc);
  r = spot_s3_new(d->http, &sc, &d->s3);
  if (r < 0) {
    log_err_errno(r, "S3 client");
    fail(d, SPOTD_EXIT_ERROR);
    return;
  }
  d->store.s3 = d->s3;
  hist_open(d);
  set_state(d, RESTORE_PROBING);
  probe_start(d);
}

void
restore_probed(struct spotd *d, int err)
{
  if (d->closing)
    return;
  if (err < 0) {
    /* The probe said why in one line: the store is not available. */
    fail(d, SPOTD_EXIT_UNAVAILABLE);
    return;
  }
  set_state(d, RESTORE_LEASING);
  if (lease_begin(d) == 0)
    return; /* restore_leased() follows */
  restore_leased(d);
}

void
restore_leased(struct spotd *d)
{
  if (d->closing)
    return;
  if (!resume_journaled(d))
    begin_restore(d);
}

int
restore_start(struct spotd *d)
{
  struct spot_aws_options ao;
  int r;

  memset(&ao, 0, sizeof(ao));
  ao.endpoint = d->cfg->endpoint;
  ao.region = d->cfg->region;
  r = spot_aws_new(d->loop, d->http, &ao, &d->aws);
  if (r == 0)
    r = spot_aws_start(d->aws, aws_ready_cb, d);
  if (r < 0)
    return log_err_errno(r, "AWS settings");
  set_state(d, RESTORE_CONNECTING);
  return 0;
}
