/* SPOTD_RESTART_COUNT: how many times this job's trainer was started
 * again (relaunched elsewhere, or restarted here after a failure), kept in
 * the store as ROOT/RESTARTS ("N\n"). After a restore the count is fetched
 * (the trainer gets N + 1) and written back only once the trainer has
 * really started: a start that never launched it does not count. A fresh
 * job (nothing to restore) starts at 0 and writes nothing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "engine.h"
#include "core/fsm.h"
#include "hist.h"
#include "core/log.h"
#include "core/manifest.h"
#include "restarts.h"
#include "startup.h"
#include "spotd.h"
#include "upload.h"
#include "core/util.h"

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
  restarts_set_count(d, n + 1, true);
  restore_counted(d);
}

void
restarts_set_count(struct spotd *d, int64_t count, bool fetched)
{
  d->restarts.count = count;
  d->restarts.fetched = fetched;
}

void
restarts_fetch(struct spotd *d)
{
  char *key = spot_store_key_dup(&d->store, NULL, "RESTARTS");

  spot_buf_init(&d->restarts.body, 64);
  if (key == NULL || spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL,
                                 &d->restarts.body, get_cb, d, NULL) < 0) {
    spot_buf_fini(&d->restarts.body);
    restarts_set_count(d, 1, true);
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
  key = spot_store_key_dup(&d->store, NULL, "RESTARTS");
  if (key == NULL || spot_s3_put(d->s3, d->store.bucket, key, buf, strlen(buf),
                                 0, put_cb, d, NULL) < 0)
    spotd_warn(d, "cannot record the restart count in the store");
  free(key);
}

/* ------------------------------------------- restart of a failed trainer
 *
 * --max-restarts N: a trainer that fails on its own while running (a
 * non-zero status, or killed by a signal; not stopped by spotd) is started
 * again at most N times. Each restart: the backoff (a timer, so notices,
 * signals and the control socket are served meanwhile), then the upload
 * still running (a checkpoint completed just before the failure commits
 * first), then the newest committed checkpoint: its folder in CKPT_DIR is
 * reused when every file matches the committed manifest (sizes, each
 * frame's CRC32C, links), else it is downloaded as at startup. The trainer
 * then starts with SPOTD_RESTART_COUNT one higher; the count is written to
 * the store as for a relaunch, so it never goes back across spotd runs.
 * The job lease stays held throughout. */

/* The restart's steps: forward, and back to NONE from any (relaunched,
 * or given up). */
static const char *const crash_names[] = {
    "none", "backoff", "waiting", "manifest", "verifying", "download",
};
_Static_assert(SPOT_ARRAY_SIZE(crash_names) == CRASH_DOWNLOAD + 1,
               "crash_names");
static const uint32_t crash_legal[] = {
    [CRASH_NONE] = SPOT_FSM_BIT(CRASH_BACKOFF),
    [CRASH_BACKOFF] = SPOT_FSM_BIT(CRASH_WAITING),
    [CRASH_WAITING] =
        SPOT_FSM_BIT(CRASH_MANIFEST) | SPOT_FSM_BIT(CRASH_DOWNLOAD),
    [CRASH_MANIFEST] =
        SPOT_FSM_BIT(CRASH_VERIFYING) | SPOT_FSM_BIT(CRASH_DOWNLOAD),
    [CRASH_VERIFYING] = SPOT_FSM_BIT(CRASH_DOWNLOAD),
    [CRASH_DOWNLOAD] = 0,
};
static const struct spot_fsm crash_fsm = {"restart",
                                          crash_names,
                                          CRASH_DOWNLOAD + 1,
                                          crash_legal,
                                          SPOT_FSM_BIT(CRASH_NONE),
                                          SPOT_LOG_DEBUG};

#define crash_set_state(d, s) crash_set_state_at((d), (s), __FILE__, __LINE__)
static void
crash_set_state_at(struct spotd *d, enum crash_step s, const char *file,
                   int line)
{
  if (spot_fsm_move(&crash_fsm, d->crash.state, s, file, line) > 0)
    d->crash.state = s;
}

#define VERIFY_BUF ((size_t)1 << 20)

static void
backoff_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, crash.timer);

  if (d->closing || d->eng.state != SPOTD_RESTARTING ||
      d->crash.state != CRASH_BACKOFF)
    return;
  crash_set_state(d, CRASH_WAITING);
  spotd_advance(d);
}

void
restarts_init(struct spotd *d)
{
  uv_timer_init(d->loop, &d->crash.timer);
  spot_buf_init(&d->crash.body, 0);
}

static void
describe(const struct crash_restart *c, char *buf, size_t size)
{
  if (c->last_signal != 0)
    snprintf(buf, size, "killed by signal %d", c->last_signal);
  else
    snprintf(buf, size, "status %d", c->last_status);
}

bool
restart_after_crash(struct spotd *d)
{
  struct crash_restart *c = &d->crash;
  char what[48];

  if (d->cfg->max_restarts <= 0)
    return false;
  c->last_status = (int)d->trainer.exit_status;
  c->last_signal = d->trainer.term_signal;
  if (c->used >= d->cfg->max_restarts) {
    c->exhausted = true;
    return false;
  }
  describe(c, what, sizeof(what));
  c->wait_ms = spot_config_restart_backoff_ms(d->cfg->restart_backoff_ms,
                                              (unsigned)c->used + 1);
  if (!spotd_restart_begin(d))
    return false;
  c->used++;
  spotd_warn(d,
             "the trainer failed (%s): restart %" PRId64 " of %" PRId64
             " in %.1f s, from the newest committed checkpoint",
             what, c->used, d->cfg->max_restarts, (double)c->wait_ms / 1000.0);
  crash_set_state(d, CRASH_BACKOFF);
  uv_timer_start(&c->timer, backoff_cb, c->wait_ms, 0);
  return true;
}

static void
relaunch_now(struct spotd *d)
{
  crash_set_state(d, CRASH_NONE);
  hist_restart(d); /* the checkpoint it resumes from is known now */
  /* written at the start like a relaunch's: a fresh job's count too */
  restarts_set_count(d, d->restarts.count + 1, true);
  spotd_relaunch_trainer(d);
}

static void
download_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;
  int64_t wall = d->last_commit_wall;

  d->crash.restore = NULL;
  if (d->closing || d->eng.state != SPOTD_RESTARTING ||
      d->crash.state != CRASH_DOWNLOAD)
    return;
  if (res->err < 0) {
    log_err("restart: restoring checkpoint %s failed: %s", d->last_commit,
            res->message);
    spotd_fail(d, SPOTD_EXIT_ERROR);
    return;
  }
  if (restore_place(d, res) < 0) {
    spotd_fail(d, SPOTD_EXIT_ERROR);
    return;
  }
  /* known since its commit, not since this download */
  upload_set_last_commit(d, d->last_commit, d->last_commit_step,
                         d->last_commit_made, wall);
  relaunch_now(d);
}

static void
download(struct spotd *d)
{
  struct spot_store_config sc;
  char tmp[4300];
  int r;

  crash_set_state(d, CRASH_DOWNLOAD);
  log_warn("restart: the local copy of checkpoint %s cannot be used (%s): "
           "downloading it",
           d->last_commit, d->crash.why);
  snprintf(tmp, sizeof(tmp), "%s/.spotd-resume", d->ckpt_dir);
  if (access(tmp, F_OK) == 0)
    spot_rm_tree(tmp);
  restore_store_config(d, &sc);
  r = spot_store_restore(d->loop, &sc, d->last_commit, tmp, NULL, download_cb,
                         d, &d->crash.restore);
  if (r < 0) {
    d->crash.restore = NULL;
    log_err_errno(r, "restart: restoring checkpoint %s", d->last_commit);
    spotd_fail(d, SPOTD_EXIT_ERROR);
  }
}

/* One file of the manifest against its local copy; false with c->why. */
static bool
verify_file(struct crash_restart *c, const struct spot_manifest_file *f,
            unsigned char *buf)
{
  char path[8400], target[4100];
  struct stat st;
  bool ok = true;
  int fd;

  snprintf(path, sizeof(path), "%s/%s", c->dir, f->path);
  if (f->link != NULL) {
    ssize_t n = readlink(path, target, sizeof(target) - 1);

    if (n < 0 || (target[n] = '\0', strcmp(target, f->link) != 0)) {
      snprintf(c->why, sizeof(c->why), "%.200s: not the committed link",
               f->path);
      return false;
    }
    return true;
  }
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_size != f->size) {
    snprintf(c->why, sizeof(c->why), "%.200s: %s", f->path,
             fd < 0 ? strerror(errno) : "not the committed size");
    if (fd >= 0)
      close(fd);
    return false;
  }
  for (size_t i = 0; ok && i < f->nframes; i++) {
    const struct spot_manifest_frame *fr = &f->frames[i];
    uint32_t crc = 0;

    for (uint64_t off = 0; ok && off < fr->raw_len;) {
      size_t want = fr->raw_len - off < VERIFY_BUF ? (size_t)(fr->raw_len - off)
                                                   : VERIFY_BUF;
      ssize_t n = pread(fd, buf, want, (off_t)(fr->raw_off + off));

      if (n <= 0)
        ok = false;
      else {
        crc = spot_crc32c(crc, buf, (size_t)n);
        off += (uint64_t)n;
      }
    }
    if (ok && crc != fr->crc32c)
      ok = false;
  }
  close(fd);
  if (!ok)
    snprintf(c->why, sizeof(c->why), "%.200s: its content differs", f->path);
  return ok;
}

/* Files and links in the folder fd (taken; the top-level marker left
 * out); -1 on an error or anything else (a fifo, a socket). */
static int64_t
count_entries(int fd, bool top, int depth)
{
  struct dirent *e;
  int64_t n = 0;
  DIR *dh;

  if (fd < 0)
    return -1;
  dh = depth > 64 ? NULL : fdopendir(fd);
  if (dh == NULL) {
    close(fd);
    return -1;
  }
  while (n >= 0 && (e = readdir(dh)) != NULL) {
    struct stat st;

    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        (top && strcmp(e->d_name, SPOTD_COMPLETE) == 0))
      continue;
    bool ok = fstatat(dirfd(dh), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0;

    if (ok && S_ISDIR(st.st_mode)) {
      int sub = openat(dirfd(dh), e->d_name,
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      int64_t k = sub < 0 ? -1 : count_entries(sub, false, depth + 1);

      n = k < 0 ? -1 : n + k;
    } else if (ok && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))) {
      n++;
    } else {
      n = -1; /* unreadable, or a fifo, socket, device */
    }
  }
  closedir(dh);
  return n;
}

/* On the thread pool: no loop state, only c->dir, c->m and c->why. */
static void
verify_work_cb(uv_work_t *req)
{
  struct crash_restart *c = spot_container_of(req, struct crash_restart, work);
  unsigned char *buf;
  int64_t n;

  /* libuv's pool thread, named by the one job spotd gives it */
  pthread_setname_np(pthread_self(), "restart-check");
  buf = malloc(VERIFY_BUF);
  if (buf == NULL) {
    spot_strlcpy(c->why, "out of memory", sizeof(c->why));
    return;
  }
  for (size_t i = 0; i < c->m->nfiles; i++)
    if (!verify_file(c, &c->m->files[i], buf))
      break;
  free(buf);
  if (c->why[0] != '\0')
    return;
  /* A file the checkpoint does not have would reach the trainer too. */
  n = count_entries(open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), true, 0);
  if (n != (int64_t)c->m->nfiles)
    snprintf(c->why, sizeof(c->why),
             "it holds %" PRId64 " files, the checkpoint %zu", n, c->m->nfiles);
}

static void
verify_after_cb(uv_work_t *req, int status)
{
  struct crash_restart *c = spot_container_of(req, struct crash_restart, work);
  struct spotd *d = spot_container_of(c, struct spotd, crash);
  size_t files = c->m->nfiles;

  spot_manifest_free(c->m);
  c->m = NULL;
  if (d->closing || d->eng.state != SPOTD_RESTARTING ||
      c->state != CRASH_VERIFYING)
    return;
  if (status < 0)
    snprintf(c->why, sizeof(c->why), "the check did not run: %s",
             uv_strerror(status));
  if (c->why[0] != '\0') {
    download(d);
    return;
  }
  log_notice("restart: the local copy of checkpoint %s verifies (%zu files): "
             "reusing it, nothing downloaded",
             d->last_commit, files);
  spot_strlcpy(d->resume_dir, c->dir, sizeof(d->resume_dir));
  spot_strlcpy(d->restored_name, d->last_commit, sizeof(d->restored_name));
  relaunch_now(d);
}

static void
manifest_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct crash_restart *c = &d->crash;
  char err[256];
  int r;

  c->get = NULL;
  if (d->closing || d->eng.state != SPOTD_RESTARTING ||
      c->state != CRASH_MANIFEST) {
    spot_buf_fini(&c->body);
    return;
  }
  if (res->err < 0) {
    snprintf(c->why, sizeof(c->why), "its manifest could not be read: %s",
             res->message[0] ? res->message : strerror(-res->err));
    spot_buf_fini(&c->body);
    download(d);
    return;
  }
  r = spot_manifest_parse(spot_buf_str(&c->body), c->body.len, &c->m, err,
                          sizeof(err));
  spot_buf_fini(&c->body);
  if (r < 0) {
    c->m = NULL;
    snprintf(c->why, sizeof(c->why), "its manifest: %s", err);
    download(d);
    return;
  }
  crash_set_state(d, CRASH_VERIFYING);
  r = uv_queue_work(d->loop, &c->work, verify_work_cb, verify_after_cb);
  if (r < 0) {
    spot_manifest_free(c->m);
    c->m = NULL;
    snprintf(c->why, sizeof(c->why), "%s", uv_strerror(r));
    download(d);
  }
}

void
restart_advance(struct spotd *d)
{
  struct crash_restart *c = &d->crash;
  struct stat st;
  char *key;

  /* A checkpoint completed before the failure commits first. */
  if (c->state != CRASH_WAITING || !upload_idle(d))
    return;
  c->why[0] = '\0';
  if (d->last_commit[0] == '\0' || !d->cfg->restore) {
    log_notice("restart: %s: starting the trainer %s",
               d->last_commit[0] ? "restore is off" : "nothing committed yet",
               d->resume_dir[0] ? "with the same SPOTD_RESUME_DIR"
                                : "without SPOTD_RESUME_DIR");
    relaunch_now(d);
    return;
  }
  snprintf(c->dir, sizeof(c->dir), "%s/%s", d->ckpt_dir, d->last_commit);
  if (lstat(c->dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
    spot_strlcpy(c->why, "no folder of that name", sizeof(c->why));
    download(d);
    return;
  }
  crash_set_state(d, CRASH_MANIFEST);
  key = spot_store_key_dup(&d->store, d->last_commit, SPOT_MANIFEST_NAME);
  spot_buf_fini(&c->body);
  spot_buf_init(&c->body, SPOT_MANIFEST_JSON_MAX);
  if (key == NULL || spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL,
                                 &c->body, manifest_cb, d, &c->get) < 0) {
    c->get = NULL;
    spot_buf_fini(&c->body);
    spot_strlcpy(c->why, "its manifest could not be asked for", sizeof(c->why));
    download(d);
  }
  free(key);
}

void
restart_abandon(struct spotd *d)
{
  struct crash_restart *c = &d->crash;

  log_notice("restart %" PRId64 " of %" PRId64 " abandoned: the trainer is "
             "not started again",
             c->used, d->cfg->max_restarts);
  c->interrupted = true;
  crash_set_state(d, CRASH_NONE);
  uv_timer_stop(&c->timer);
  if (c->get != NULL)
    spot_s3_cancel(c->get);
  if (c->restore != NULL)
    spot_store_cancel(c->restore);
  /* a check on the thread pool ends by itself; its result is dropped */
}

void
restart_close(struct spotd *d)
{
  struct crash_restart *c = &d->crash;

  if (c->get != NULL)
    spot_s3_cancel(c->get);
  if (c->restore != NULL)
    spot_store_cancel(c->restore);
  if (c->timer.loop != NULL && !uv_is_closing((uv_handle_t *)&c->timer))
    uv_close((uv_handle_t *)&c->timer, NULL);
}
