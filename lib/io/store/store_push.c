/* Push: a folder becomes one committed checkpoint. The main state
 * machine (enum push_state in store_push.h):
 *
 *   WALK     (thread pool) list regular files, stat them, try the filters
 *            on each file's first MiB
 *   CHECK    GET 1 byte of the manifest: a committed name is never
 *            overwritten
 *   RESUME   store_resume.c: resume journaled uploads, abort orphans
 *   XFER     store_push_xfer.c: the pipeline
 *   VERIFY   (thread pool) stat every file again: a file that changed
 *            while it was read fails the push
 *   RANKS    store_ranks.c (nranks > 1): rank markers, wait, merge
 *   COMMIT   PUT MANIFEST.json with If-None-Match: *
 *   COMMIT_CHECK  a retried commit said 412: read it back, ours or not
 *   LATEST   PUT LATEST
 *   RETAIN   store_retain.c
 *   ABORT    after an error: abort this push's multipart uploads
 *
 * Only spot__push_set_state() changes state; spot__push_advance() moves
 * on from the current one when nothing is in flight. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/codec.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

static const char *const push_state_names[] = {
    "walk",   "check",        "dedup",  "resume", "transfer", "verify", "ranks",
    "commit", "commit-check", "latest", "retain", "abort",    "done",
};
_Static_assert(SPOT_ARRAY_SIZE(push_state_names) == PUSH_STATE_LAST,
               "push_state_names");

#define WALK_FILES_MAX SPOT_MANIFEST_FILES_MAX
#define WALK_DEPTH_MAX 64

#define fail_msg(op, ...) spot__store_fail_msg(&(op)->b, __VA_ARGS__)

static const struct spot_fsm push_fsm = {
    "push", push_state_names, PUSH_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

void
spot__push_set_state_at(struct push_op *op, enum push_state s, const char *file,
                        int line)
{
  if (spot_fsm_move_detail(&push_fsm, op->state, s, file, line, "name=%s",
                           op->b.name != NULL ? op->b.name : "?") > 0)
    op->state = s;
}

/* ---------------------------------------------------------------- walk */

static int
add_file(struct push_op *op, size_t *alloc, const char *rel, const char *abs,
         const struct stat *st)
{
  struct pfile *f;

  if (op->nfiles >= WALK_FILES_MAX)
    return -E2BIG;
  if (op->nfiles == *alloc) {
    size_t n = *alloc ? *alloc * 2 : 16;
    struct pfile *p = realloc(op->files, n * sizeof(*p));
    if (p == NULL)
      return -ENOMEM;
    op->files = p;
    *alloc = n;
  }
  f = &op->files[op->nfiles];
  memset(f, 0, sizeof(*f));
  if (spot__push_pfile_init(f, rel, abs, st) < 0)
    return -ENOMEM;
  op->nfiles++;
  return 0;
}

int
spot__push_pfile_init(struct pfile *f, const char *rel, const char *abs,
                      const struct stat *st)
{
  f->rel = strdup(rel);
  f->abs = strdup(abs);
  if (f->rel == NULL || f->abs == NULL) {
    free(f->rel);
    free(f->abs);
    f->rel = f->abs = NULL;
    return -ENOMEM;
  }
  f->size = (uint64_t)st->st_size;
  f->mode = st->st_mode & 07777;
  f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  f->dev = st->st_dev;
  f->ino = st->st_ino;
  return 0;
}

/* A symlink: a relative link that stays inside the folder is stored as a
 * link; any other fails the push, unless follow_symlinks stores the
 * regular file it points to. Never skipped silently: a checkpoint
 * missing a file it had would restore as if whole. */
static int
walk_link(struct push_op *op, size_t *alloc, const char *abs, const char *rel,
          const struct stat *lst)
{
  char target[SPOT_MANIFEST_PATH_MAX + 2];
  ssize_t n = readlink(abs, target, sizeof(target) - 1);
  struct stat st;
  char *real;
  int r;

  if (n < 0) {
    fail_msg(op, -errno, "%s: %s", rel, strerror(errno));
    return -errno;
  }
  target[n] = '\0';
  if (spot_manifest_link_valid(rel, target)) {
    r = add_file(op, alloc, rel, abs, lst);
    if (r == 0) {
      struct pfile *f = &op->files[op->nfiles - 1];
      f->size = 0;
      f->link = strdup(target);
      r = f->link != NULL ? 0 : -ENOMEM;
    }
    if (r < 0)
      fail_msg(op, r, "%s: %s", rel, strerror(-r));
    return r;
  }
  if (!op->b.cfg.c.follow_symlinks) {
    fail_msg(op, -EINVAL,
             "%s: a symlink to '%.300s', which is not a relative link inside "
             "the checkpoint folder; nothing committed (--follow-symlinks "
             "stores the file it points to)",
             rel, target);
    return -EINVAL;
  }
  if (stat(abs, &st) < 0 || !S_ISREG(st.st_mode)) {
    fail_msg(op, -EINVAL,
             "%s: a symlink to '%.300s', which is not a regular file "
             "(--follow-symlinks stores files only)",
             rel, target);
    return -EINVAL;
  }
  real = realpath(abs, NULL);
  r = real != NULL ? add_file(op, alloc, rel, real, &st) : -errno;
  free(real);
  if (r < 0)
    fail_msg(op, r, "%s: %s", rel, strerror(-r));
  return r;
}

static void
walk_note(struct push_op *op, const char *path, const char *why)
{
  log_warn("push: skipping %s: %s", path, why);
  if (op->walk_warn[0] == '\0')
    snprintf(op->walk_warn, sizeof(op->walk_warn), "skipped %.300s: %.100s",
             path, why);
}

/* Whether a sample is text (no control bytes but tab, newline, CR, FF):
 * byte grouping is for floats, and text must stay a plain zstd stream of
 * the file even when a grouping happens to gain on a regular layout. A
 * float tensor's mantissa bytes hit the control range at once. */
bool
spot__push_looks_like_text(const unsigned char *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if ((p[i] < 0x20 && p[i] != '\t' && p[i] != '\n' && p[i] != '\r' &&
         p[i] != '\f') ||
        p[i] == 0x7f)
      return false;
  return n > 0;
}

/* Runs on the thread pool. Errors go to op->err/msg, which the loop reads
 * only after the work is done. */
static int
walk_dir(struct push_op *op, size_t *alloc, const char *abs, const char *rel,
         int depth)
{
  DIR *d;
  struct dirent *de;
  int r = 0;

  if (depth > WALK_DEPTH_MAX) {
    fail_msg(op, -ELOOP, "%s: folders nested too deep", abs);
    return -ELOOP;
  }
  d = opendir(abs);
  if (d == NULL) {
    r = -errno;
    fail_msg(op, r, "%s: %s", abs, strerror(errno));
    return r;
  }
  while ((de = readdir(d)) != NULL) {
    char cabs[4096], crel[4096];
    struct stat st;

    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    /* The trainer's completion marker is not part of the checkpoint. */
    if (depth == 0 && strcmp(de->d_name, SPOT_STORE_MARKER) == 0)
      continue;
    if ((size_t)snprintf(cabs, sizeof(cabs), "%s/%s", abs, de->d_name) >=
            sizeof(cabs) ||
        (size_t)snprintf(crel, sizeof(crel), "%s%s%s", rel, rel[0] ? "/" : "",
                         de->d_name) >= sizeof(crel)) {
      r = -ENAMETOOLONG;
      fail_msg(op, r, "%s/%s: path too long", abs, de->d_name);
      break;
    }
    if (lstat(cabs, &st) < 0) {
      r = -errno;
      fail_msg(op, r, "%s: %s", cabs, strerror(errno));
      break;
    }
    if (S_ISLNK(st.st_mode)) {
      r = walk_link(op, alloc, cabs, crel, &st);
      if (r < 0)
        break;
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      r = walk_dir(op, alloc, cabs, crel, depth + 1);
      if (r < 0)
        break;
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      walk_note(op, crel, "not a regular file");
      continue;
    }
    if (!spot_manifest_path_valid(crel)) {
      r = -EINVAL;
      fail_msg(op, r, "%s: cannot be stored (path rules)", crel);
      break;
    }
    r = add_file(op, alloc, crel, cabs, &st);
    if (r == -E2BIG)
      fail_msg(op, r,
               "%s holds more than %d files, the limit of a checkpoint; "
               "nothing was uploaded",
               op->dir, WALK_FILES_MAX);
    if (r < 0) {
      fail_msg(op, r, "%s: %s", cabs, strerror(-r));
      break;
    }
  }
  closedir(d);
  return r;
}

static int
cmp_files(const void *a, const void *b)
{
  return strcmp(((const struct pfile *)a)->rel, ((const struct pfile *)b)->rel);
}

/* A followed folder is walked once its marker exists (store_follow.c):
 * here only its existence is checked. */
static void
walk_work_cb(uv_work_t *req)
{
  struct push_op *op = spot_container_of(req, struct push_op, b.work);
  struct stat st;

  if (op->follow == NULL)
    spot__push_walk(op);
  else if (stat(op->dir, &st) < 0)
    fail_msg(op, -errno, "%s: %s", op->dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    fail_msg(op, -ENOTDIR, "%s: not a folder", op->dir);
}

void
spot__push_walk(struct push_op *op)
{
  size_t alloc = 0;
  struct stat st;
  struct spot_codec *codec = NULL;
  void *sample = NULL;
  int r;

  if (stat(op->dir, &st) < 0) {
    fail_msg(op, -errno, "%s: %s", op->dir, strerror(errno));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    fail_msg(op, -ENOTDIR, "%s: not a folder", op->dir);
    return;
  }
  if (walk_dir(op, &alloc, op->dir, "", 0) < 0)
    return;
  if (op->nfiles > 1)
    qsort(op->files, op->nfiles, sizeof(*op->files), cmp_files);

  /* Choose each file's filter from its first MiB. Also proves every file
   * is readable before anything is uploaded. */
  r = spot_codec_new(SPOT_CODEC_SAMPLE_MAX, &codec);
  sample = malloc(SPOT_CODEC_SAMPLE_MAX);
  if (r < 0 || sample == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    size_t n = f->size < SPOT_CODEC_SAMPLE_MAX ? (size_t)f->size
                                               : SPOT_CODEC_SAMPLE_MAX;
    struct spot_codec_trial t;
    int fd;

    if (f->link != NULL)
      continue; /* stored as a link: nothing to read */
    fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0) {
      fail_msg(op, -errno, "%s: %s", f->rel, strerror(errno));
      break;
    }
    r = spot__push_read_full(fd, sample, n, 0);
    close(fd);
    if (r < 0) {
      fail_msg(op, r, "%s: %s", f->rel,
               r == -ESTALE ? "file changed while it was pushed"
                            : strerror(-r));
      break;
    }
    if (op->b.cfg.c.compress == SPOT_STORE_COMPRESS_NEVER || n == 0) {
      f->filter = SPOT_FILTER_NONE;
      f->compress = false;
    } else if (spot__pack_small(op, f)) {
      f->filter = SPOT_FILTER_NONE; /* packed: no trial (store_pack.c) */
      f->compress = true;
      f->cmode = SPOT_CODEC_ZSTD;
    } else {
      r = spot_codec_choose_filter(codec, sample, n, &t);
      if (r < 0) {
        fail_msg(op, r, "%s: codec trial failed", f->rel);
        break;
      }
      f->filter =
          spot__push_looks_like_text(sample, n) ? SPOT_FILTER_NONE : t.filter;
      f->compress = t.compress;
      f->cmode = t.mode;
    }
    f->nparts = f->size == 0 ? 0
                             : (size_t)((f->size + op->b.cfg.c.part_size - 1) /
                                        op->b.cfg.c.part_size);
    if (f->nparts > SPOT_MANIFEST_PARTS_MAX) {
      fail_msg(op, -EFBIG, "%s: too big for %" PRIu64 "-byte parts", f->rel,
               op->b.cfg.c.part_size);
      break;
    }
  }
out:
  free(sample);
  spot_codec_free(codec);
}

/* ------------------------------------------------------------ verify */

static void
verify_work_cb(uv_work_t *req)
{
  struct push_op *op = spot_container_of(req, struct push_op, b.work);

  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    struct stat st;
    int64_t mt;

    if (f->link != NULL || f->pk != NULL)
      continue; /* a link or a pack: nothing was read from it */
    if (lstat(f->abs, &st) < 0) {
      fail_msg(op, -errno, "%s: %s", f->rel, strerror(errno));
      return;
    }
    mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if ((uint64_t)st.st_size != f->size || mt != f->mtime_ns ||
        st.st_ino != f->ino || st.st_dev != f->dev) {
      fail_msg(op, -ESTALE, "%s: file changed while it was pushed", f->rel);
      return;
    }
  }
}

/* ------------------------------------------------------------- the op */

static void
tick(struct spot__store_op *b)
{
  struct push_op *op = (struct push_op *)(void *)b;

  spot__store_progress(b, op->state <= PUSH_XFER ? SPOT_STORE_PHASE_TRANSFER
                                                 : SPOT_STORE_PHASE_COMMIT);
}

void
spot__push_pfile_fini(struct pfile *f)
{
  free(f->rel);
  free(f->abs);
  free(f->link);
  free(f->key);
  free(f->upload_id);
  free(f->etags);
  spot__pack_free(f);
  spot__dedup_pfile_fini(f);
}

static void
op_free(struct spot__store_op *b)
{
  struct push_op *op = (struct push_op *)(void *)b;

  for (size_t i = 0; i < op->nfiles; i++)
    spot__push_pfile_fini(&op->files[i]);
  free(op->files);
  spot__follow_fini(op);
  spot__store_pipe_fini(&op->pipe);
  spot_manifest_free(op->manifest);
  free(op->manifest_json);
  spot__resume_fini(op);
  spot__ranks_fini(op);
  spot__retain_fini(op);
  spot__dedup_fini(op);
  spot_buf_fini(&op->body);
  free(op->dir);
}

static void
close_handles(struct spot__store_op *b)
{
  spot__ranks_close((struct push_op *)(void *)b);
  spot__follow_close((struct push_op *)(void *)b);
}

static void
finish(struct push_op *op)
{
  struct spot_store_result res;

  spot__push_set_state(op, PUSH_DONE);
  /* Committed, or failed with its uploads aborted: nothing to resume. A
   * push that is killed never gets here, and its journal stays. */
  spot__resume_remove(op);
  memset(&res, 0, sizeof(res));
  res.files = op->nfiles - op->npacks;
  res.raw_bytes = op->b.raw_total;
  res.stored_bytes = op->manifest != NULL ? op->manifest->total_stored : 0;
  if (op->ranks.state == RANKS_MERGED) /* files, raw_bytes: this rank's */
    res.stored_bytes = op->ranks.own_stored;
  if (op->ranks.state == RANKS_MERGED && op->manifest != NULL) {
    res.ckpt_files = op->manifest->nfiles;
    res.ckpt_raw_bytes = op->manifest->total_raw;
    res.ckpt_stored_bytes = op->manifest->total_stored;
  }
  res.commit_ms = op->commit_ms;
  res.deleted = op->deleted;
  res.aborted = op->aborted;
  res.resumed_parts = op->resume.resumed_parts;
  res.warning = op->warning[0] != '\0' ? op->warning : op->walk_warn;
  spot__store_finish(&op->b, &res);
}

/* ------------------------------------------------------------ requests */

static int put_latest(struct push_op *op);
static void publish_read(struct push_op *op);

static void
check_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (res->err == 0 && op->resume.attempt_from_journal &&
      op->b.cfg.c.nranks <= 1 && !spot__store_cancelled(&op->b)) {
    publish_read(op); /* ours, killed before LATEST? */
    return;
  }
  if (res->err == 0)
    fail_msg(op, -EEXIST,
             "checkpoint %s of job %s is already committed; pick another name",
             op->b.name, op->b.cfg.job);
  else if (res->err != -ENOENT)
    spot__store_fail_s3(&op->b, "checking the checkpoint name", res);
  spot__push_advance(op);
}

/* The manifest an earlier run of this push wrote, read whole: ours when
 * it names objects under our journaled attempt's folder (16 random hex
 * digits no other push uses). Then only LATEST is left to do. */
static void
publish_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  struct spot_manifest *m = NULL;
  char err[200], needle[SPOT__STORE_ATTEMPT_LEN + 3];
  bool ours = false;

  spot__store_s3_done(&op->b, &op->s3op, res);
  snprintf(needle, sizeof(needle), "%s/", op->attempt);
  if (res->err == 0 &&
      spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &m, err,
                          sizeof(err)) == 0) {
    for (size_t i = 0; !ours && i < m->nfiles; i++)
      ours = m->files[i].key != NULL &&
             strncmp(m->files[i].key, needle, strlen(needle)) == 0;
    for (size_t i = 0; !ours && i < m->npacks; i++)
      ours = strncmp(m->packs[i].key, needle, strlen(needle)) == 0;
    op->publish_epoch = m->epoch;
    spot_manifest_free(m);
  }
  if (res->err < 0 && res->err != -ECANCELED)
    spot__store_fail_s3(&op->b, "reading the checkpoint's manifest", res);
  else if (res->err == 0 && !ours)
    fail_msg(op, -EEXIST,
             "checkpoint %s of job %s is already committed; pick another name",
             op->b.name, op->b.cfg.job);
  if (op->b.err < 0 || res->err < 0) {
    spot__push_advance(op);
    return;
  }
  log_info("push name=%s: an earlier run committed its manifest (attempt "
           "%s, epoch %" PRIu64 ") but was stopped before LATEST: "
           "publishing it",
           op->b.name, op->attempt, op->publish_epoch);
  op->publish = true;
  if (put_latest(op) == 1)
    finish(op);
}

static void
publish_read(struct push_op *op)
{
  char *key = spot__store_key(&op->b.cfg.c, op->b.name, SPOT_MANIFEST_NAME);
  int r = -ENOMEM;

  spot_buf_reset(&op->body);
  if (key != NULL)
    r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0, NULL,
                    &op->body, publish_cb, op, &op->s3op);
  free(key);
  if (r < 0) {
    fail_msg(op, r, "reading the checkpoint's manifest: %s", strerror(-r));
    spot__push_advance(op);
  } else {
    op->b.active_s3++;
  }
}

/* A 1-byte GET rather than HEAD: a refused GET carries the S3 code
 * (SignatureDoesNotMatch, InvalidAccessKeyId) that a HEAD reply cannot,
 * and this is the first request of a push. */
static void
check_name(struct push_op *op)
{
  char *key = spot__store_key(&op->b.cfg.c, op->b.name, SPOT_MANIFEST_NAME);
  int r = -ENOMEM;

  spot__push_set_state(op, PUSH_CHECK);
  spot_buf_reset(&op->body);
  if (key != NULL)
    r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 1, NULL,
                    &op->body, check_cb, op, &op->s3op);
  free(key);
  if (r < 0)
    fail_msg(op, r, "checking the checkpoint name: %s", strerror(-r));
  else
    op->b.active_s3++;
}

bool
spot__push_body_is_ours(const struct push_op *op)
{
  return op->manifest_json != NULL &&
         op->body.len == strlen(op->manifest_json) &&
         memcmp(spot_buf_str(&op->body), op->manifest_json, op->body.len) == 0;
}

/* A retried If-None-Match PUT answered 412: the first attempt may have
 * landed with its response lost (a reset). Reads key back for the caller
 * to compare with spot__push_body_is_ours(). */
bool
spot__push_read_back(struct push_op *op, char *key, spot_s3_cb cb)
{
  int r = -ENOMEM;

  if (key != NULL) {
    spot_buf_reset(&op->body);
    r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0, NULL,
                    &op->body, cb, op, &op->s3op);
    free(key);
  }
  if (r < 0)
    return false;
  op->b.active_s3++;
  return true;
}

static void
commit_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  bool check = op->state == PUSH_COMMIT_CHECK;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (!check && res->err == -EEXIST && res->retries > 0 &&
      !spot__store_cancelled(&op->b)) {
    spot__push_set_state(op, PUSH_COMMIT_CHECK);
    if (spot__push_read_back(
            op, spot__store_key(&op->b.cfg.c, op->b.name, SPOT_MANIFEST_NAME),
            commit_cb))
      return;
  }
  if (check ? !(res->err == 0 && spot__push_body_is_ours(op))
            : res->err == -EEXIST)
    fail_msg(op, -EEXIST, "checkpoint %s was committed by someone else",
             op->b.name);
  else if (!check && res->err < 0)
    spot__store_fail_s3(&op->b, "writing the manifest", res);
  else
    op->commit_ms = spot_now_mono_ms() - op->b.start_ms;
  if (op->b.err == 0)
    spot_fault_point("after-manifest");
  spot__push_advance(op);
}

static void
fence_cb(const struct spot_latest_result *res, void *data)
{
  struct push_op *op = data;

  op->b.active_s3--;
  op->b.retries += res->retries;
  op->latest_op = NULL;
  if (res->err == -ECANCELED) {
    spot__store_fail(&op->b, -ECANCELED);
  } else if (res->err < 0) {
    fail_msg(op, res->err == -ESTALE ? -ESTALE : res->err,
             "checkpoint %s not committed (no manifest written): %s",
             op->b.name, res->message);
  } else {
    op->fenced = true;
    spot__push_commit(op);
    return;
  }
  spot__push_advance(op);
}

/* The commit's order, unordered (0.0) without a lease: the step rule
 * alone. */
static struct spot_latest_order
commit_order(const struct push_op *op)
{
  const struct spot_store_config *c = &op->b.cfg.c;
  struct spot_latest_order order = {c->lease_epoch, c->lease_seq};

  if (c->lease_owner == NULL)
    order.epoch = order.seq = 0;
  return order;
}

/* Read the lease (when there is one) and LATEST just before the manifest,
 * so a writer that lost its lease, or whose commit LATEST's order or step
 * would refuse, writes no manifest (the LATEST update checks again after
 * it). 0 when the read runs, 1 when it is done already. */
static int
fence(struct push_op *op)
{
  const struct spot_store_config *c = &op->b.cfg.c;
  char root[1200];
  int64_t step;
  int r;

  if (op->fenced)
    return 1;
  step = spot__push_step(op);
  if (c->step_floor > 0 && step >= 0 && step < c->step_floor) {
    fail_msg(op, -EALREADY,
             "checkpoint %s (step %" PRId64 ") is no new commit: step %" PRId64
             " is committed (no manifest written)",
             op->b.name, step, c->step_floor - 1);
    spot__push_advance(op);
    return 0;
  }
  snprintf(root, sizeof(root), "%s%s%s", c->prefix, c->prefix[0] ? "/" : "",
           c->job);
  r = spot_latest_fence(c->s3, op->b.cfg.bucket, root, op->b.name,
                        commit_order(op), step, c->lease_owner, fence_cb, op,
                        &op->latest_op);
  if (r == 0 && c->latest_damaged[0] != '\0')
    spot_latest_set_damaged(op->latest_op, c->latest_damaged);
  if (r < 0) {
    fail_msg(op, r, "checking the lease before the commit: %s", strerror(-r));
    spot__push_advance(op);
    return 0;
  }
  op->b.active_s3++;
  return 0;
}

void
spot__push_commit(struct push_op *op)
{
  char *key;
  int r = -ENOMEM;

  spot__push_set_state(op, PUSH_COMMIT);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_COMMIT);
  if (!op->fenced)
    spot_fault_point("before-commit");
  if (fence(op) == 0)
    return;
  key = spot__store_key(&op->b.cfg.c, op->b.name, SPOT_MANIFEST_NAME);
  if (key != NULL)
    r = spot_s3_put(op->b.cfg.c.s3, op->b.cfg.bucket, key, op->manifest_json,
                    strlen(op->manifest_json), SPOT_S3_IF_NONE_MATCH, commit_cb,
                    op, &op->s3op);
  free(key);
  if (r < 0) {
    fail_msg(op, r, "writing the manifest: %s", strerror(-r));
    spot__push_advance(op);
    return;
  }
  op->b.active_s3++;
}

static void
fenced_cb(const struct spot_latest_result *res, void *data)
{
  struct push_op *op = data;

  op->b.active_s3--;
  op->b.retries += res->retries;
  op->latest_op = NULL;
  if (res->err == -ESTALE)
    fail_msg(op, -ESTALE,
             "checkpoint %s: manifest written, LATEST not moved: %s",
             op->b.name, res->message);
  else if (res->err < 0 && res->err != -ECANCELED)
    snprintf(op->warning, sizeof(op->warning),
             "committed, but updating LATEST failed: %s", res->message);
  else if (res->err == -ECANCELED)
    spot__store_fail(&op->b, -ECANCELED);
  spot__push_advance(op);
}

/* LATEST through the forward-only compare-and-swap (latest.h), fenced
 * by the lease when there is one. */
static int
put_latest_fenced(struct push_op *op)
{
  const struct spot_store_config *c = &op->b.cfg.c;
  char root[1200];
  int r;

  snprintf(root, sizeof(root), "%s%s%s", c->prefix, c->prefix[0] ? "/" : "",
           c->job);
  r = spot_latest_update(c->s3, op->b.cfg.bucket, root, op->b.name,
                         commit_order(op), spot__push_step(op), c->lease_owner,
                         fenced_cb, op, &op->latest_op);
  if (r == 0 && op->publish)
    spot_latest_set_max_epoch(op->latest_op, op->publish_epoch);
  if (r == 0 && c->latest_damaged[0] != '\0')
    spot_latest_set_damaged(op->latest_op, c->latest_damaged);
  if (r < 0) {
    snprintf(op->warning, sizeof(op->warning),
             "committed, but updating LATEST failed: %s", strerror(-r));
    return 1;
  }
  op->b.active_s3++;
  return 0;
}

/* 0, or 1 when LATEST could not even be asked (a warning). */
static int
put_latest(struct push_op *op)
{
  log_debug("committed checkpoint name=%s job=%s files=%zu", op->b.name,
            op->b.cfg.job, op->nfiles);
  spot__push_set_state(op, PUSH_LATEST);
  return put_latest_fenced(op);
}

/* --------------------------------------------------- abort after error */

static void abort_next(struct push_op *op);

static void
abort_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (res->err < 0 && res->err != -ENOENT)
    log_warn("push name=%s: aborting an upload failed (retention will "
             "abort it later)",
             op->b.name);
  abort_next(op);
}

static void del_own_next(struct push_op *op);

static void
del_own_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (res->err < 0)
    log_warn("push name=%s: deleting this attempt's objects failed (they "
             "stay, unreferenced)",
             op->b.name);
  del_own_next(op);
}

/* The next batch of this attempt's completed objects; then finish. They
 * live under the attempt's own folder: no other writer uses those keys. */
static void
del_own_next(struct push_op *op)
{
  size_t n = 0;

  while (op->del_own && op->del_idx < op->nfiles &&
         n < SPOT_ARRAY_SIZE(op->del_keys)) {
    const struct pfile *f = &op->files[op->del_idx++];

    if (f->state == FILE_DONE && f->key != NULL)
      op->del_keys[n++] = f->key;
  }
  if (n > 0 &&
      spot_s3_delete_objects(op->b.cfg.c.s3, op->b.cfg.bucket, op->del_keys, n,
                             del_own_cb, op, &op->s3op) == 0) {
    op->b.active_s3++;
    return;
  }
  if (n > 0)
    del_own_next(op);
  else
    finish(op);
}

static void
abort_next(struct push_op *op)
{
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    if (f->state != FILE_OPEN)
      continue;
    spot__push_file_set_state(op, f, FILE_ABORTING);
    if (spot_s3_mpu_abort(op->b.cfg.c.s3, op->b.cfg.bucket, f->key,
                          f->upload_id, abort_cb, op, &op->s3op) == 0) {
      op->b.active_s3++;
      return;
    }
  }
  op->del_idx = 0;
  del_own_next(op);
}

/* ---------------------------------------------------- the state machine */

/* Failed or cancelled, nothing in flight. Nothing was committed before
 * LATEST: drop this push's multipart uploads; the objects of completed
 * files stay as uncommitted leftovers that no reader trusts and a later
 * push of the same name overwrites. */
static void
stop(struct push_op *op)
{
  switch (op->state) {
  case PUSH_DONE:
  case PUSH_ABORT:
    return;
  case PUSH_RESUME:
  case PUSH_XFER:
  case PUSH_VERIFY:
  case PUSH_COMMIT:
  case PUSH_COMMIT_CHECK:
    /* A commit that failed otherwise than 412 may have been written. */
    op->del_own =
        op->attempt[0] != '\0' &&
        ((op->state != PUSH_COMMIT && op->state != PUSH_COMMIT_CHECK) ||
         op->b.err == -EEXIST);
    spot__push_set_state(op, PUSH_ABORT);
    abort_next(op);
    return;
  default:
    finish(op);
    return;
  }
}

static void
verified(struct push_op *op)
{
  char err[256];
  int r = spot__pack_finish(op);

  if (r == 0)
    r = spot_manifest_to_json(op->manifest, &op->manifest_json, err,
                              sizeof(err));
  else
    snprintf(err, sizeof(err), "packs: %s", strerror(-r));
  if (r < 0) {
    fail_msg(op, r, "building the manifest: %s", err);
    stop(op);
  } else if (op->b.cfg.c.nranks > 1) {
    spot__ranks_start(op);
  } else {
    spot__push_commit(op);
  }
}

/* After the walk: the totals, and the manifest's size within the limit
 * before anything is uploaded. The estimate is what spot_manifest_to_json()
 * writes per file (path, key, numbers) and per frame, a little over. */
int
spot__push_walked(struct push_op *op)
{
  uint64_t est = 300;

  op->b.raw_total = 0;
  for (size_t i = 0; i < op->nfiles; i++) {
    const struct pfile *f = &op->files[i];

    op->b.raw_total += f->size;
    size_t len = strlen(f->rel) + 12; /* + "rank-K/" */

    /* {"path":P,"size":S,"mode":M,"mtime_ns":T,"filter":F,"frames":[]}
     * is 95 bytes but P; "key":K and "link":L when there; a frame's five
     * numbers about 100. */
    est += len + 110 + (f->size > 0 ? len + 12 : 0) +
           (f->link ? strlen(f->link) + 12 : 0) + (uint64_t)f->nparts * 115 +
           (spot__pack_small(op, f) ? 60 : 0); /* "pack":KEY, not "key" */
  }
  if (est <= SPOT_MANIFEST_JSON_MAX)
    return 0;
  fail_msg(op, -EFBIG,
           "the manifest of %zu files would be about %" PRIu64
           " MiB, more than the %zu MiB a checkpoint's manifest may be "
           "(fewer files, or a bigger --part-size); nothing was uploaded",
           op->nfiles, est >> 20, SPOT_MANIFEST_JSON_MAX >> 20);
  return -EFBIG;
}

void
spot__push_advance(struct push_op *op)
{
  int r;

  if (spot__store_busy(&op->b))
    return;
  if (op->b.err < 0) {
    stop(op);
    return;
  }
  switch (op->state) {
  case PUSH_WALK:
    if (spot__push_walked(op) == 0)
      check_name(op);
    break;
  case PUSH_CHECK:
    if (spot__dedup_on(op)) {
      spot__dedup_start(op); /* then PUSH_DEDUP */
      return;
    }
    if (op->b.cfg.c.dedup && op->b.cfg.c.part_size < SPOT_STORE_DEDUP_PART_MIN)
      log_warn("push name=%s: dedup needs parts of at least %" PRIu64
               " MiB (part size %" PRIu64 "): every byte is uploaded",
               op->b.name, SPOT_STORE_DEDUP_PART_MIN >> 20,
               op->b.cfg.c.part_size);
    /* fall through */
  case PUSH_DEDUP:
    if (op->state == PUSH_DEDUP && !spot__dedup_done(op))
      return;
    r = spot__push_xfer_setup(op);
    if (r < 0)
      spot__store_fail(&op->b, r);
    else
      spot__resume_start(op);
    break;
  case PUSH_XFER:
    if (!spot__push_files_done(op))
      return; /* the pump has more to do */
    if (op->follow != NULL && spot__follow_hold(op))
      return; /* no marker yet, or the final walk runs */
    spot__push_set_state(op, PUSH_VERIFY);
    r = spot__store_queue(&op->b, verify_work_cb);
    if (r < 0)
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
    break;
  case PUSH_VERIFY:
    verified(op);
    return;
  case PUSH_RANKS:
    if (op->ranks.state == RANKS_COMMITTED)
      finish(op); /* LATEST and retention are rank 0's business */
    return;
  case PUSH_COMMIT:
  case PUSH_COMMIT_CHECK:
    if (put_latest(op) == 1)
      finish(op);
    return;
  case PUSH_LATEST:
    spot__retain_start(op);
    return;
  case PUSH_RETAIN:
    finish(op);
    return;
  default:
    return;
  }
  if (op->b.err < 0 && !spot__store_busy(&op->b))
    stop(op);
}

static void
advance_cb(struct spot__store_op *b)
{
  spot__push_advance((struct push_op *)(void *)b);
}

static void
cancel(struct spot__store_op *b)
{
  struct push_op *op = (struct push_op *)(void *)b;

  spot__push_xfer_cancel(op);
  /* A multipart abort already in s3op is cleanup and must run, not be
   * cancelled too. The parts cancelled above call back from the loop;
   * the abort of their uploads starts once the last one has (stop()). */
  if (op->s3op != NULL && op->state != PUSH_ABORT)
    spot_s3_cancel(op->s3op);
  if (op->latest_op != NULL)
    spot_latest_cancel(op->latest_op);
  spot__ranks_cancel(op);
  spot__follow_cancel(op);
}

static const struct spot__store_kind push_kind = {
    .name = "push",
    .advance = advance_cb,
    .cancel = cancel,
    .free = op_free,
    .tick = tick,
    .close = close_handles,
};

void
spot_store_push_poke(struct spot_store_op *op)
{
  struct spot__store_op *b = (struct spot__store_op *)(void *)op;

  if (b != NULL && b->kind == &push_kind)
    spot__follow_poke((struct push_op *)(void *)b);
}

/* The name defaults to the folder's base name. */
static int
set_dir_and_name(struct push_op *op, const char *dir, const char *name)
{
  const char *base;
  size_t dlen;

  op->dir = strdup(dir);
  if (op->dir == NULL)
    return -ENOMEM;
  dlen = strlen(op->dir);
  while (dlen > 1 && op->dir[dlen - 1] == '/')
    op->dir[--dlen] = '\0';
  base = strrchr(op->dir, '/');
  base = base != NULL ? base + 1 : op->dir;
  op->b.name = strdup(name != NULL ? name : base);
  if (op->b.name == NULL)
    return -ENOMEM;
  return spot_ckpt_name_valid(op->b.name) ? 0 : -EINVAL;
}

int
spot_store_push(uv_loop_t *loop, const struct spot_store_config *cfg,
                const char *dir, const char *name,
                spot_store_progress_cb progress, spot_store_cb cb, void *data,
                struct spot_store_op **out)
{
  struct spot__store_op *b;
  struct push_op *op;
  int r;

  if (loop == NULL || cfg == NULL || dir == NULL || cb == NULL)
    return -EINVAL;
  r = spot__store_op_new(sizeof(*op), &push_kind, loop, cfg, progress, cb, data,
                         &b);
  if (r < 0)
    return r;
  op = (struct push_op *)(void *)b;
  op->b.pipe = &op->pipe;
  spot_buf_init(&op->body, SPOT__STORE_MANIFEST_CAP);
  r = set_dir_and_name(op, dir, name);
  spot__store_attempt_new(op->attempt);
  if (r == 0)
    r = spot__resume_init(op);
  if (r == 0)
    r = spot__ranks_init(op);
  if (r == 0 && cfg->follow)
    r = spot__follow_init(op);
  if (r == 0)
    r = spot__store_queue(&op->b, walk_work_cb);
  if (r < 0) {
    /* the timers are initialised: free through their close callbacks,
     * and make sure the user callback never runs */
    spot__store_close(&op->b);
    return r;
  }
  spot__store_progress_start(&op->b);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_PLAN);
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
}
