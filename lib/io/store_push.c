/* Push: a folder becomes one committed checkpoint.
 *
 *   WALK      (thread pool) list regular files, stat them, try the filters
 *             on each file's first MiB
 *   CHECK     HEAD the manifest: a committed name is never overwritten
 *   XFER      the pipeline: read+compress parts on the pool (at most
 *             `workers` at once), upload them (at most `parallel`), one
 *             multipart upload per file bigger than a part, a single PUT
 *             otherwise
 *   VERIFY    (thread pool) stat every file again: a file that changed
 *             while it was read fails the push
 *   MARKER    (nranks > 1) PUT ranks/rank-K.json, this rank's partial
 *             manifest, with If-None-Match: * instead of committing
 *   RANK_WAIT (rank 0) list ranks/ every 500 ms until every rank's marker
 *             is there, at most rank_wait_ms
 *   RANK_READ (rank 0) GET the markers and merge them into one manifest,
 *             then COMMIT it
 *   COMMIT_WAIT (rank > 0) GET 1 byte of MANIFEST.json every 500 ms until
 *             rank 0 committed, at most rank_wait_ms; then done
 *   COMMIT    PUT MANIFEST.json with If-None-Match: *
 *   LATEST    PUT LATEST
 *   RETAIN    list checkpoints, read their manifests, delete the oldest
 *             beyond `keep` (manifest first, so a half-deleted checkpoint
 *             is never seen as committed), abort stale multipart uploads
 *   ABORT     after an error: abort this push's multipart uploads
 *
 * Only set_state() changes state; advance() moves on from the current one
 * when nothing is in flight. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "log.h"
#include "manifest.h"
#include "store_internal.h"
#include "store_journal.h"
#include "util.h"

enum push_state {
  PUSH_WALK,
  PUSH_CHECK,
  PUSH_RESUME,
  PUSH_XFER,
  PUSH_VERIFY,
  PUSH_MARKER,
  PUSH_RANK_WAIT,
  PUSH_RANK_READ,
  PUSH_COMMIT_WAIT,
  PUSH_COMMIT,
  PUSH_LATEST,
  PUSH_RETAIN_LIST,
  PUSH_RETAIN_READ,
  PUSH_RETAIN_DELETE,
  PUSH_RETAIN_UPLOADS,
  PUSH_ABORT,
  PUSH_DONE,
  PUSH_STATE_LAST,
};

static const char *const push_state_names[] = {
    "walk",   "check",       "resume",      "transfer",      "verify",
    "marker", "rank-wait",   "rank-read",   "commit-wait",   "commit",
    "latest", "retain-list", "retain-read", "retain-delete", "retain-uploads",
    "abort",  "done",
};

#define WALK_FILES_MAX 1000000
#define WALK_DEPTH_MAX 64

struct pfile {
  char *rel;
  char *abs;
  char *key;
  uint64_t size;
  uint32_t mode;
  int64_t mtime_ns;
  dev_t dev;
  ino_t ino;
  enum spot_filter filter;
  bool compress;
  enum spot_codec_mode cmode; /* what the trial chose (zstd or dense) */
  size_t nparts;
  size_t next_part; /* next part to dispatch */
  size_t parts_done;
  size_t midx; /* index in the manifest */
  char *upload_id;
  bool creating, completing, done, aborting;
  struct spot_s3_part_info *etags;
  struct spot_s3_op *s3op; /* create or complete */
};

struct encoder {
  struct spot_codec *codec;
  void *raw;
  bool busy;
};

enum slot_state {
  SLOT_FREE,
  SLOT_ENCODING,
  SLOT_READY,
  SLOT_SENDING,
};

struct slot {
  struct push_op *op;
  enum slot_state state;
  size_t file, part;
  uint64_t seq;
  void *comp;
  size_t comp_cap, comp_len;
  uint64_t raw_len;
  uint32_t crc;
  enum spot_codec_mode mode;
  struct encoder *enc;
  uv_work_t work;
  int work_err;
  uint64_t work_ns;
  struct spot_s3_op *s3op;
};

struct retain_entry {
  char *name;
  int64_t created_ms;
};

struct push_op {
  struct spot__store_hdr hdr;
  uv_loop_t *loop;
  struct spot__store_cfg cfg;
  enum push_state state;
  char *dir;
  char *name;
  spot_store_progress_cb progress;
  spot_store_cb cb;
  void *data;

  int err;
  char msg[768];
  char warning[512];
  bool cancelled;

  struct pfile *files;
  size_t nfiles;
  size_t next_file; /* dispatch cursor */
  char walk_warn[512];

  struct encoder *encs;
  struct slot *slots;
  size_t nslots;
  uint64_t seq;
  unsigned active_work;
  unsigned active_s3; /* s3 ops in flight of any kind */
  unsigned active_xfers;

  struct spot_manifest *manifest;
  char *manifest_json;
  struct spot_s3_op *s3op; /* the one sequential op (check, commit, ...) */
  uv_work_t work;          /* walk / verify */

  /* throughput figures for the raw/compress choice */
  uint64_t enc_bytes, enc_ns;
  uint64_t net_bytes, net_ms_start;
  uint64_t raw_done, stored_done;
  unsigned retries;
  uint64_t start_ms, commit_ms;
  uv_timer_t progress_timer;

  /* retention */
  char **names;
  size_t nnames, names_alloc;
  char *list_token;
  struct retain_entry *entries;
  size_t nentries, read_idx, del_idx;
  int del_phase; /* 0 manifest, 1 list the rest, 2 delete a page */
  struct spot_buf body;
  char **del_keys;
  size_t ndel_keys;
  unsigned deleted, aborted;
  /* resume journal (store_journal.c) */
  char *journal_path;
  uint64_t journal_saved_ms;
  struct spot__journal *resume;
  size_t resume_idx;
  unsigned resumed_parts;
  char **orphan_keys, **orphan_ids; /* uploads of this name not resumed */
  size_t norphans, orphan_idx;
  bool orphans_listed;
  struct spot_s3_upload_info *uploads;
  size_t nuploads, upload_idx;
  char *abort_key, *abort_id;
  /* multi-node (nranks > 1) */
  uv_timer_t wait_timer; /* the 500 ms poll; initialised iff nranks > 1 */
  bool wait_armed;
  unsigned handles; /* open timers: op_free() after the last close */
  uint64_t wait_start_ms;
  bool *rank_seen;   /* RANK_WAIT: markers listed this round */
  char *rank_token;  /* RANK_WAIT: next list page */
  unsigned rank_idx; /* RANK_READ: next marker to read */
  struct spot_manifest *merged;
  bool did_merge;      /* op->manifest is the merged one ... */
  uint64_t own_stored; /* ... and this rank's part stored this much */
};

#define RANK_POLL_MS 500
#define RANK_WAIT_DEFAULT_MS 60000

static void advance(struct push_op *op);
static void pump(struct push_op *op);
static void journal_save(struct push_op *op, bool force);

static void
set_state(struct push_op *op, enum push_state s)
{
  log_debug("push name=%s state %s -> %s", op->name ? op->name : "?",
            push_state_names[op->state], push_state_names[s]);
  op->state = s;
}

static void
fail(struct push_op *op, int err)
{
  if (op->err == 0)
    op->err = err < 0 ? err : -EIO;
}

static void fail_msg(struct push_op *op, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
fail_msg(struct push_op *op, int err, const char *fmt, ...)
{
  va_list ap;

  if (op->msg[0] == '\0') {
    va_start(ap, fmt);
    vsnprintf(op->msg, sizeof(op->msg), fmt, ap);
    va_end(ap);
  }
  fail(op, err);
}

static void
fail_s3(struct push_op *op, const char *what, const struct spot_s3_result *res)
{
  spot__store_s3_msg(op->msg, sizeof(op->msg), what, res);
  fail(op, res->err);
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
  f->rel = strdup(rel);
  f->abs = strdup(abs);
  if (f->rel == NULL || f->abs == NULL) {
    free(f->rel);
    free(f->abs);
    return -ENOMEM;
  }
  f->size = (uint64_t)st->st_size;
  f->mode = st->st_mode & 07777;
  f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
  f->dev = st->st_dev;
  f->ino = st->st_ino;
  op->nfiles++;
  return 0;
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
static bool
looks_like_text(const unsigned char *p, size_t n)
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
      walk_note(op, crel, "a symlink (symlinks are not followed)");
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

static int
read_full(int fd, void *buf, size_t n, uint64_t off)
{
  size_t got = 0;

  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0)
      return -ESTALE; /* the file shrank under us */
    got += (size_t)r;
  }
  return 0;
}

static void
walk_work_cb(uv_work_t *req)
{
  struct push_op *op = spot_container_of(req, struct push_op, work);
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
    int fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0) {
      fail_msg(op, -errno, "%s: %s", f->rel, strerror(errno));
      break;
    }
    r = read_full(fd, sample, n, 0);
    close(fd);
    if (r < 0) {
      fail_msg(op, r, "%s: %s", f->rel,
               r == -ESTALE ? "file changed while it was pushed"
                            : strerror(-r));
      break;
    }
    if (op->cfg.c.compress == SPOT_STORE_COMPRESS_NEVER || n == 0) {
      f->filter = SPOT_FILTER_NONE;
      f->compress = false;
    } else {
      r = spot_codec_choose_filter(codec, sample, n, &t);
      if (r < 0) {
        fail_msg(op, r, "%s: codec trial failed", f->rel);
        break;
      }
      f->filter = looks_like_text(sample, n) ? SPOT_FILTER_NONE : t.filter;
      f->compress = t.compress;
      f->cmode = t.mode;
    }
    f->nparts = f->size == 0 ? 0
                             : (size_t)((f->size + op->cfg.c.part_size - 1) /
                                        op->cfg.c.part_size);
    if (f->nparts > SPOT_MANIFEST_FRAMES_MAX) {
      fail_msg(op, -EFBIG, "%s: too big for %" PRIu64 "-byte parts", f->rel,
               op->cfg.c.part_size);
      break;
    }
  }
out:
  free(sample);
  spot_codec_free(codec);
}

/* ------------------------------------------------------------- helpers */

static void
report_progress(struct push_op *op, enum spot_store_phase phase)
{
  struct spot_store_progress p;
  uint64_t total = 0;

  if (op->progress == NULL)
    return;
  for (size_t i = 0; i < op->nfiles; i++)
    total += op->files[i].size;
  p.phase = phase;
  p.name = op->name;
  p.raw_done = op->raw_done;
  p.raw_total = total;
  p.stored_done = op->stored_done;
  p.elapsed_ms = spot_now_mono_ms() - op->start_ms;
  p.retries = op->retries;
  op->progress(&p, op->data);
}

static void
progress_timer_cb(uv_timer_t *t)
{
  struct push_op *op = spot_container_of(t, struct push_op, progress_timer);

  report_progress(op, op->state <= PUSH_XFER ? SPOT_STORE_PHASE_TRANSFER
                                             : SPOT_STORE_PHASE_COMMIT);
}

static void
op_free(struct push_op *op)
{
  free(op->journal_path);
  spot__journal_free(op->resume);
  for (size_t i = 0; i < op->norphans; i++) {
    free(op->orphan_keys[i]);
    free(op->orphan_ids[i]);
  }
  free(op->orphan_keys);
  free(op->orphan_ids);
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    free(f->rel);
    free(f->abs);
    free(f->key);
    free(f->upload_id);
    free(f->etags);
  }
  free(op->files);
  for (size_t i = 0; op->encs != NULL && i < op->cfg.c.workers; i++) {
    spot_codec_free(op->encs[i].codec);
    free(op->encs[i].raw);
  }
  free(op->encs);
  for (size_t i = 0; i < op->nslots; i++)
    free(op->slots[i].comp);
  free(op->slots);
  spot_manifest_free(op->manifest);
  free(op->manifest_json);
  for (size_t i = 0; i < op->nnames; i++)
    free(op->names[i]);
  free(op->names);
  free(op->list_token);
  for (size_t i = 0; i < op->nentries; i++)
    free(op->entries[i].name);
  free(op->entries);
  for (size_t i = 0; i < op->ndel_keys; i++)
    free(op->del_keys[i]);
  free(op->del_keys);
  for (size_t i = 0; i < op->nuploads; i++) {
    free((char *)op->uploads[i].key);
    free((char *)op->uploads[i].upload_id);
    free((char *)op->uploads[i].initiated);
  }
  free(op->uploads);
  free(op->abort_key);
  free(op->abort_id);
  free(op->rank_seen);
  free(op->rank_token);
  spot_manifest_free(op->merged);
  spot_buf_fini(&op->body);
  spot__store_cfg_fini(&op->cfg);
  free(op->dir);
  free(op->name);
  free(op);
}

static void
timer_close_cb(uv_handle_t *h)
{
  struct push_op *op = spot_container_of(h, struct push_op, progress_timer);

  if (--op->handles == 0)
    op_free(op);
}

static void
wait_close_cb(uv_handle_t *h)
{
  struct push_op *op = spot_container_of(h, struct push_op, wait_timer);

  if (--op->handles == 0)
    op_free(op);
}

/* Closes the op's timers; the last close callback frees it. */
static void
close_timers(struct push_op *op)
{
  uv_timer_stop(&op->progress_timer);
  uv_close((uv_handle_t *)&op->progress_timer, timer_close_cb);
  if (op->cfg.c.nranks > 1) {
    uv_timer_stop(&op->wait_timer);
    uv_close((uv_handle_t *)&op->wait_timer, wait_close_cb);
  }
}

static void
finish(struct push_op *op)
{
  struct spot_store_result res;
  uint64_t raw = 0;

  set_state(op, PUSH_DONE);
  /* Committed, or failed with its uploads aborted: nothing to resume. A
   * push that is killed never gets here, and its journal stays. */
  if (op->journal_path != NULL)
    unlink(op->journal_path);
  for (size_t i = 0; i < op->nfiles; i++)
    raw += op->files[i].size;
  memset(&res, 0, sizeof(res));
  res.err = op->err;
  if (op->err < 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "%s", strerror(-op->err));
  res.message = op->err < 0 ? op->msg : "";
  res.name = op->name != NULL ? op->name : "";
  res.files = op->nfiles;
  res.raw_bytes = raw;
  res.stored_bytes = op->manifest != NULL ? op->manifest->total_stored : 0;
  if (op->did_merge) /* files and raw_bytes are this rank's: so is this */
    res.stored_bytes = op->own_stored;
  res.retries = op->retries;
  res.elapsed_ms = spot_now_mono_ms() - op->start_ms;
  res.commit_ms = op->commit_ms;
  res.deleted = op->deleted;
  res.aborted = op->aborted;
  res.resumed_parts = op->resumed_parts;
  res.warning = op->warning[0] != '\0' ? op->warning : op->walk_warn;
  if (op->err == 0)
    report_progress(op, SPOT_STORE_PHASE_FINISH);
  op->cb(&res, op->data);
  close_timers(op);
}

static bool
busy(const struct push_op *op)
{
  return op->active_work > 0 || op->active_s3 > 0;
}

/* -------------------------------------------------------------- xfer */

/* S3 wants every part of a multipart upload but the last to be at least
 * 5 MiB, and a well-compressed frame of a 5-8 MiB part is smaller (text,
 * sparse tensors, bf16 at 8 MiB parts is just above). Such a frame is
 * followed by a zstd skippable frame (magic 0x184D2A50, LE32 length, zero
 * bytes) up to SPOT_STORE_PART_MIN: `zstd -d` and every zstd decoder skip
 * it, so the object stays a plain zstd stream; the manifest's comp_len
 * covers both frames, and restore checks the trailer is exactly that.
 * Grouping frames into bigger parts would need a staging buffer per
 * transfer; padding keeps memory where it is. Called on the worker. */
static int
pad_part(void *comp, size_t cap, size_t *len)
{
  unsigned char *p = (unsigned char *)comp + *len;
  size_t pad;

  if (*len >= SPOT_STORE_PART_MIN)
    return 0;
  pad = (size_t)SPOT_STORE_PART_MIN - *len;
  if (pad < 8)
    pad = 8; /* the skippable frame's header */
  if (pad > cap - *len)
    return -ENOBUFS;
  p[0] = 0x50;
  p[1] = 0x2A;
  p[2] = 0x4D;
  p[3] = 0x18;
  p[4] = (unsigned char)((pad - 8) & 0xff);
  p[5] = (unsigned char)(((pad - 8) >> 8) & 0xff);
  p[6] = (unsigned char)(((pad - 8) >> 16) & 0xff);
  p[7] = (unsigned char)(((pad - 8) >> 24) & 0xff);
  memset(p + 8, 0, pad - 8);
  *len += pad;
  return 0;
}

static void
encode_work_cb(uv_work_t *req)
{
  struct slot *s = spot_container_of(req, struct slot, work);
  struct push_op *op = s->op;
  struct pfile *f = &op->files[s->file];
  uint64_t off = (uint64_t)s->part * op->cfg.c.part_size;
  uint64_t t0 = spot_now_mono_ms();
  int fd;

  s->work_err = 0;
  fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    s->work_err = -errno;
    return;
  }
  s->work_err = read_full(fd, s->enc->raw, (size_t)s->raw_len, off);
  close(fd);
  if (s->work_err < 0)
    return;
  s->work_err = spot_codec_encode(s->enc->codec, f->filter, s->mode,
                                  s->enc->raw, (size_t)s->raw_len, s->comp,
                                  s->comp_cap, &s->comp_len, &s->crc);
  if (s->work_err == 0 && f->nparts > 1 && s->part + 1 < f->nparts)
    s->work_err = pad_part(s->comp, s->comp_cap, &s->comp_len);
  s->work_ns = (spot_now_mono_ms() - t0) * 1000000u + 1;
}

static void
encode_after_cb(uv_work_t *req, int status)
{
  struct slot *s = spot_container_of(req, struct slot, work);
  struct push_op *op = s->op;
  struct pfile *f = &op->files[s->file];

  op->active_work--;
  s->enc->busy = false;
  s->enc = NULL;
  if (status < 0 || s->work_err < 0) {
    int r = status < 0 ? status : s->work_err;
    if (r == -ESTALE)
      fail_msg(op, r, "%s: file changed while it was pushed", f->rel);
    else
      fail_msg(op, r, "%s part %zu: %s", f->rel, s->part + 1, strerror(-r));
    s->state = SLOT_FREE;
  } else {
    int r = spot_manifest_set_frame(op->manifest, f->midx, s->part, s->raw_len,
                                    s->comp_len, s->crc);
    if (r < 0) {
      fail_msg(op, r, "%s part %zu: manifest: %s", f->rel, s->part + 1,
               strerror(-r));
      s->state = SLOT_FREE;
    } else {
      op->enc_bytes += s->raw_len;
      op->enc_ns += s->work_ns;
      op->raw_done += s->raw_len;
      s->state = SLOT_READY;
    }
  }
  pump(op);
}

static void
part_done_cb(const struct spot_s3_result *res, void *data)
{
  struct slot *s = data;
  struct push_op *op = s->op;
  struct pfile *f = &op->files[s->file];

  op->active_s3--;
  op->active_xfers--;
  s->s3op = NULL;
  op->retries += res->retries;
  if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "uploading %s part %zu", f->rel, s->part + 1);
    fail_s3(op, what, res);
  } else {
    op->stored_done += s->comp_len;
    op->net_bytes += s->comp_len;
    if (f->nparts > 1) {
      struct spot_s3_part_info *pi = &f->etags[s->part];
      pi->number = (int)s->part + 1;
      pi->size = s->comp_len;
      spot_strlcpy(pi->etag, res->etag != NULL ? res->etag : "",
                   sizeof(pi->etag));
    }
    f->parts_done++;
    if (f->nparts == 1)
      f->done = true;
    else
      journal_save(op, false);
  }
  s->state = SLOT_FREE;
  pump(op);
}

/* Create and complete of a file's multipart upload carry this context. */
struct fctx {
  struct push_op *op;
  size_t file;
  bool complete;
};

static void
file_op_cb(const struct spot_s3_result *res, void *data)
{
  struct fctx *c = data;
  struct push_op *op = c->op;
  struct pfile *f = &op->files[c->file];
  bool complete = c->complete;

  free(c);
  op->active_s3--;
  f->s3op = NULL;
  f->creating = false;
  op->retries += res->retries;
  if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "%s the upload of %s",
             complete ? "completing" : "starting", f->rel);
    fail_s3(op, what, res);
  } else if (complete) {
    f->done = true;
  } else if (res->upload_id == NULL || res->upload_id[0] == '\0') {
    fail_msg(op, -EPROTO, "starting the upload of %s: no upload id", f->rel);
  } else {
    f->upload_id = strdup(res->upload_id);
    if (f->upload_id == NULL)
      fail_msg(op, -ENOMEM, "out of memory");
    else
      journal_save(op, true);
  }
  pump(op);
}

static int
file_op(struct push_op *op, size_t i, bool complete)
{
  struct pfile *f = &op->files[i];
  struct fctx *c = malloc(sizeof(*c));
  int r;

  if (c == NULL)
    return -ENOMEM;
  c->op = op;
  c->file = i;
  c->complete = complete;
  if (complete)
    r = spot_s3_mpu_complete(op->cfg.c.s3, op->cfg.bucket, f->key, f->upload_id,
                             f->etags, f->nparts, file_op_cb, c, &f->s3op);
  else
    r = spot_s3_mpu_create(op->cfg.c.s3, op->cfg.bucket, f->key, file_op_cb, c,
                           &f->s3op);
  if (r < 0) {
    free(c);
    return r;
  }
  op->active_s3++;
  if (complete)
    f->completing = true;
  else
    f->creating = true;
  return 0;
}

static struct slot *
oldest_ready(struct push_op *op)
{
  struct slot *best = NULL;

  for (size_t i = 0; i < op->nslots; i++) {
    struct slot *s = &op->slots[i];
    if (s->state != SLOT_READY)
      continue;
    if (op->files[s->file].nparts > 1 && op->files[s->file].upload_id == NULL)
      continue; /* waiting for its upload id */
    if (best == NULL || s->seq < best->seq)
      best = s;
  }
  return best;
}

static enum spot_codec_mode
choose_mode(struct push_op *op, const struct pfile *f)
{
  double cbps, nbps, ratio, secs;

  if (!f->compress)
    return SPOT_CODEC_RAW;
  if (op->cfg.c.compress != SPOT_STORE_COMPRESS_AUTO)
    return f->cmode;
  if (op->enc_ns == 0 || op->stored_done == 0)
    return f->cmode;
  /* All workers together; per-part time includes the read. */
  cbps = (double)op->enc_bytes / ((double)op->enc_ns / 1e9) *
         (double)op->cfg.c.workers;
  secs = (double)(spot_now_mono_ms() - op->net_ms_start) / 1000.0;
  nbps = secs > 0.05 ? (double)op->net_bytes / secs : 0;
  ratio = op->raw_done > 0 && op->stored_done > 0
              ? (double)op->enc_bytes / (double)op->stored_done
              : 1.0;
  /* Only trust the network figure while parts queue up for it. */
  if (op->active_xfers < op->cfg.c.parallel)
    nbps = 0;
  return spot_codec_compress_pays(cbps, nbps, ratio) ? f->cmode
                                                     : SPOT_CODEC_RAW;
}

static void
pump(struct push_op *op)
{
  int r;

  if (op->state != PUSH_XFER) {
    advance(op);
    return;
  }
  if (op->err < 0 || op->cancelled) {
    if (!busy(op))
      advance(op);
    return;
  }

  /* 1. start uploads of encoded parts, oldest first */
  while (op->active_xfers < op->cfg.c.parallel) {
    struct slot *s = oldest_ready(op);
    struct pfile *f;

    if (s == NULL)
      break;
    f = &op->files[s->file];
    if (f->nparts == 1)
      r = spot_s3_put(op->cfg.c.s3, op->cfg.bucket, f->key, s->comp,
                      s->comp_len, 0, part_done_cb, s, &s->s3op);
    else
      r = spot_s3_mpu_part(op->cfg.c.s3, op->cfg.bucket, f->key, f->upload_id,
                           (int)s->part + 1, s->comp, s->comp_len, part_done_cb,
                           s, &s->s3op);
    if (r < 0) {
      fail_msg(op, r, "uploading %s: %s", f->rel, strerror(-r));
      break;
    }
    if (op->net_ms_start == 0)
      op->net_ms_start = spot_now_mono_ms();
    s->state = SLOT_SENDING;
    op->active_s3++;
    op->active_xfers++;
  }

  /* 2. dispatch encodes: a free encoder and a free slot per part */
  while (op->err == 0 && op->next_file < op->nfiles) {
    struct pfile *f = &op->files[op->next_file];
    struct encoder *e = NULL;
    struct slot *s = NULL;

    while (f->etags != NULL && f->next_part < f->nparts &&
           f->etags[f->next_part].number != 0)
      f->next_part++; /* stored before a resume */
    if (f->next_part >= f->nparts) {
      op->next_file++;
      continue;
    }
    for (size_t i = 0; i < op->cfg.c.workers; i++)
      if (!op->encs[i].busy) {
        e = &op->encs[i];
        break;
      }
    for (size_t i = 0; e != NULL && i < op->nslots; i++)
      if (op->slots[i].state == SLOT_FREE) {
        s = &op->slots[i];
        break;
      }
    if (e == NULL || s == NULL)
      break;
    if (f->nparts > 1 && f->upload_id == NULL && !f->creating) {
      r = file_op(op, op->next_file, false);
      if (r < 0) {
        fail_msg(op, r, "uploading %s: %s", f->rel, strerror(-r));
        break;
      }
    }
    s->file = op->next_file;
    s->part = f->next_part++;
    s->seq = op->seq++;
    s->raw_len = f->size - (uint64_t)s->part * op->cfg.c.part_size;
    if (s->raw_len > op->cfg.c.part_size)
      s->raw_len = op->cfg.c.part_size;
    s->mode = choose_mode(op, f);
    s->enc = e;
    e->busy = true;
    r = uv_queue_work(op->loop, &s->work, encode_work_cb, encode_after_cb);
    if (r < 0) {
      e->busy = false;
      s->enc = NULL;
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      break;
    }
    s->state = SLOT_ENCODING;
    op->active_work++;
  }

  /* 3. complete multipart uploads whose parts are all stored */
  for (size_t i = 0; op->err == 0 && i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    if (f->nparts > 1 && f->parts_done == f->nparts && !f->completing &&
        !f->done) {
      r = file_op(op, i, true);
      if (r < 0)
        fail_msg(op, r, "completing %s: %s", f->rel, strerror(-r));
    }
  }

  if (!busy(op))
    advance(op);
}

/* ------------------------------------------------------------ journal */

/* Writes what is stored so far: the upload id of each multipart file and
 * its parts with their ETags, sizes and CRCs. Throttled, except when an
 * upload id is new (losing one would orphan its upload). */
static void
journal_save(struct push_op *op, bool force)
{
  struct spot__journal j;
  uint64_t now = spot_now_mono_ms();
  size_t n = 0;
  int r;

  if (op->journal_path == NULL || op->manifest == NULL)
    return;
  if (!force && now < op->journal_saved_ms + 250)
    return;
  op->journal_saved_ms = now;
  memset(&j, 0, sizeof(j));
  j.job = op->cfg.job;
  j.name = op->name;
  j.part_size = op->cfg.c.part_size;
  j.files = calloc(op->nfiles + 1, sizeof(*j.files));
  if (j.files == NULL)
    return;
  for (size_t i = 0; i < op->nfiles; i++) {
    const struct pfile *f = &op->files[i];
    const struct spot_manifest_file *mf = &op->manifest->files[f->midx];
    struct spot__journal_file *jf = &j.files[n];

    if (f->nparts < 2 || f->upload_id == NULL || f->done)
      continue;
    jf->path = f->rel;
    jf->size = f->size;
    jf->mtime_ns = f->mtime_ns;
    jf->ino = (uint64_t)f->ino;
    jf->upload_id = f->upload_id;
    jf->parts = calloc(f->nparts + 1, sizeof(*jf->parts));
    if (jf->parts == NULL)
      break;
    for (size_t p = 0; p < f->nparts; p++) {
      const struct spot_s3_part_info *pi = &f->etags[p];
      struct spot__journal_part *jp = &jf->parts[jf->nparts];

      if (pi->number == 0 || !mf->frames[p].set)
        continue;
      jp->n = pi->number;
      jp->raw_len = mf->frames[p].raw_len;
      jp->comp_len = mf->frames[p].comp_len;
      jp->crc32c = mf->frames[p].crc32c;
      spot_strlcpy(jp->etag, pi->etag, sizeof(jp->etag));
      jf->nparts++;
    }
    n++;
  }
  j.nfiles = n;
  r = spot__journal_save(op->journal_path, &j);
  if (r < 0)
    log_debug("push name=%s: journal: %s", op->name, strerror(-r));
  for (size_t i = 0; i < n; i++)
    free(j.files[i].parts);
  free(j.files);
}

static struct pfile *
find_file(struct push_op *op, const char *rel)
{
  for (size_t i = 0; i < op->nfiles; i++)
    if (strcmp(op->files[i].rel, rel) == 0)
      return &op->files[i];
  return NULL;
}

static bool
same_etag(const char *a, const char *b)
{
  size_t la, lb;

  /* Servers differ in quoting ETags; compare what is inside the quotes. */
  if (*a == '"')
    a++;
  if (*b == '"')
    b++;
  la = strlen(a);
  lb = strlen(b);
  if (la > 0 && a[la - 1] == '"')
    la--;
  if (lb > 0 && b[lb - 1] == '"')
    lb--;
  return la == lb && la > 0 && memcmp(a, b, la) == 0;
}

static void resume_step(struct push_op *op);
static void orphans_step(struct push_op *op);

static bool
is_ours(const struct push_op *op, const char *upload_id)
{
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].upload_id != NULL &&
        strcmp(op->files[i].upload_id, upload_id) == 0)
      return true;
  return false;
}

/* Uploads of this checkpoint name that no journal claims belong to an
 * earlier push of the same name that died (a name commits once, so no
 * live push can own them): abort them before uploading. */
static void
orphans_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  if (op->cancelled) {
    advance(op);
    return;
  }
  if (!op->orphans_listed) {
    op->orphans_listed = true;
    if (res->err == 0 && res->n_uploads > 0) {
      op->orphan_keys = calloc(res->n_uploads, sizeof(char *));
      op->orphan_ids = calloc(res->n_uploads, sizeof(char *));
      for (size_t i = 0; op->orphan_keys != NULL && op->orphan_ids != NULL &&
                         i < res->n_uploads;
           i++) {
        if (is_ours(op, res->uploads[i].upload_id))
          continue;
        op->orphan_keys[op->norphans] = strdup(res->uploads[i].key);
        op->orphan_ids[op->norphans] = strdup(res->uploads[i].upload_id);
        if (op->orphan_keys[op->norphans] == NULL ||
            op->orphan_ids[op->norphans] == NULL) {
          op->norphans++;
          break;
        }
        op->norphans++;
      }
    }
  } else {
    if (res->err == 0 || res->err == -ENOENT)
      op->aborted++;
    op->orphan_idx++;
  }
  orphans_step(op);
}

static void
orphans_step(struct push_op *op)
{
  char *key = NULL;
  int r = -ENOMEM;

  if (!op->orphans_listed) {
    char rel[32] = "";

    /* Another rank's live uploads of this name are not orphans. */
    if (op->cfg.c.nranks > 1)
      snprintf(rel, sizeof(rel), "rank-%u/", op->cfg.c.rank);
    key = spot__store_key(&op->cfg.c, op->name, rel);
    if (key != NULL)
      r = spot_s3_list_uploads(op->cfg.c.s3, op->cfg.bucket, key, orphans_cb,
                               op, &op->s3op);
  } else {
    while (op->orphan_idx < op->norphans &&
           (op->orphan_keys[op->orphan_idx] == NULL ||
            op->orphan_ids[op->orphan_idx] == NULL))
      op->orphan_idx++;
    if (op->orphan_idx < op->norphans) {
      log_info("push name=%s: aborting an upload of %s left by an earlier "
               "push",
               op->name, op->orphan_keys[op->orphan_idx]);
      r = spot_s3_mpu_abort(
          op->cfg.c.s3, op->cfg.bucket, op->orphan_keys[op->orphan_idx],
          op->orphan_ids[op->orphan_idx], orphans_cb, op, &op->s3op);
    } else {
      r = 1; /* done */
    }
  }
  free(key);
  if (r == 0) {
    op->active_s3++;
    return;
  }
  set_state(op, PUSH_XFER);
  report_progress(op, SPOT_STORE_PHASE_TRANSFER);
  journal_save(op, true);
  pump(op);
}

/* ListParts of a journaled upload: parts the server lists with the ETag
 * and size the journal recorded are taken as stored. */
static void
resume_list_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  const struct spot__journal_file *jf = &op->resume->files[op->resume_idx];
  struct pfile *f = find_file(op, jf->path);
  size_t found = 0;

  op->active_s3--;
  op->s3op = NULL;
  op->resume_idx++;
  if (op->cancelled) {
    advance(op);
    return;
  }
  if (res->err < 0 || f == NULL || f->upload_id != NULL) {
    /* Gone (aborted, completed) or unreadable: upload the file afresh. */
    log_info("push name=%s: journaled upload of %s not resumable, starting "
             "it over",
             op->name, jf->path);
    resume_step(op);
    return;
  }
  for (size_t i = 0; i < jf->nparts; i++) {
    const struct spot__journal_part *jp = &jf->parts[i];
    size_t p = (size_t)jp->n - 1;
    uint64_t want_raw;

    if (jp->n < 1 || p >= f->nparts || f->etags[p].number != 0)
      continue;
    want_raw = f->size - (uint64_t)p * op->cfg.c.part_size;
    if (want_raw > op->cfg.c.part_size)
      want_raw = op->cfg.c.part_size;
    if (jp->raw_len != want_raw)
      continue;
    for (size_t k = 0; k < res->n_parts; k++) {
      const struct spot_s3_part_info *sp = &res->parts[k];

      if (sp->number != jp->n || sp->size != jp->comp_len ||
          !same_etag(sp->etag, jp->etag))
        continue;
      if (spot_manifest_set_frame(op->manifest, f->midx, p, jp->raw_len,
                                  jp->comp_len, jp->crc32c) < 0)
        break;
      f->etags[p].number = jp->n;
      f->etags[p].size = jp->comp_len;
      spot_strlcpy(f->etags[p].etag, jp->etag, sizeof(f->etags[p].etag));
      f->parts_done++;
      op->raw_done += jp->raw_len;
      op->stored_done += jp->comp_len;
      found++;
      break;
    }
  }
  f->upload_id = strdup(jf->upload_id);
  op->resumed_parts += (unsigned)found;
  log_info("push name=%s: resuming the upload of %s: %zu of %zu parts "
           "already stored",
           op->name, f->rel, found, f->nparts);
  resume_step(op);
}

static void
resume_abort_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  if (res->err == 0 || res->err == -ENOENT)
    op->aborted++;
  op->resume_idx++;
  if (op->cancelled)
    advance(op);
  else
    resume_step(op);
}

/* One journaled upload at a time: resumed when its file is unchanged,
 * aborted when the file changed (a stale journal). Then the transfer. */
static void
resume_step(struct push_op *op)
{
  while (op->resume != NULL && op->resume_idx < op->resume->nfiles) {
    const struct spot__journal_file *jf = &op->resume->files[op->resume_idx];
    struct pfile *f = find_file(op, jf->path);
    char *key;
    int r;

    if (f != NULL && f->nparts > 1 && f->size == jf->size &&
        f->mtime_ns == jf->mtime_ns && (uint64_t)f->ino == jf->ino) {
      r = spot_s3_mpu_list_parts(op->cfg.c.s3, op->cfg.bucket, f->key,
                                 jf->upload_id, resume_list_cb, op, &op->s3op);
    } else {
      char rel[4200];

      log_info("push name=%s: %s changed since the journal: aborting its "
               "old upload",
               op->name, jf->path);
      snprintf(rel, sizeof(rel), "%s.zst", jf->path);
      key = spot__store_key(&op->cfg.c, op->name, rel);
      r = key == NULL ? -ENOMEM
                      : spot_s3_mpu_abort(op->cfg.c.s3, op->cfg.bucket, key,
                                          jf->upload_id, resume_abort_cb, op,
                                          &op->s3op);
      free(key);
    }
    if (r == 0) {
      op->active_s3++;
      return;
    }
    op->resume_idx++;
  }
  spot__journal_free(op->resume);
  op->resume = NULL;
  orphans_step(op);
}

/* ------------------------------------------------------------ states */

static void
walk_after_cb(uv_work_t *req, int status)
{
  struct push_op *op = spot_container_of(req, struct push_op, work);

  op->active_work--;
  if (status < 0)
    fail_msg(op, status, "%s", uv_strerror(status));
  advance(op);
}

static void
verify_work_cb(uv_work_t *req)
{
  struct push_op *op = spot_container_of(req, struct push_op, work);

  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    struct stat st;
    int64_t mt;

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

static void
check_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  if (res->err == 0)
    fail_msg(op, -EEXIST,
             "checkpoint %s of job %s is already committed; pick another name",
             op->name, op->cfg.job);
  else if (res->err != -ENOENT)
    fail_s3(op, "checking the checkpoint name", res);
  advance(op);
}

/* "ROOT/checkpoints/NAME/ranks/rank-K.json", malloc'd. */
static char *
marker_key(const struct push_op *op, unsigned rank)
{
  char rel[64];

  snprintf(rel, sizeof(rel), "ranks/rank-%u.json", rank);
  return spot__store_key(&op->cfg.c, op->name, rel);
}

/* The manifest read back after a retried commit said 412: the lost
 * response was our own first attempt's if the bytes are ours. */
static void
commit_check_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  if (res->err == 0 && op->body.len == strlen(op->manifest_json) &&
      memcmp(spot_buf_str(&op->body), op->manifest_json, op->body.len) == 0) {
    if (op->state == PUSH_COMMIT)
      op->commit_ms = spot_now_mono_ms() - op->start_ms;
  } else if (op->state == PUSH_MARKER) {
    fail_msg(op, -EEXIST,
             "rank %u's part of checkpoint %s is already in the store",
             op->cfg.c.rank, op->name);
  } else {
    fail_msg(op, -EEXIST, "checkpoint %s was committed by someone else",
             op->name);
  }
  advance(op);
}

/* A retried If-None-Match PUT answered 412: the first attempt may have
 * landed with its response lost (a reset). Reads key (malloc'd, freed
 * here) back for commit_check_cb to compare; true when the GET started. */
static bool
read_back(struct push_op *op, char *key)
{
  int r = -ENOMEM;

  if (key != NULL) {
    spot_buf_reset(&op->body);
    r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL, &op->body,
                    commit_check_cb, op, &op->s3op);
    free(key);
  }
  if (r < 0)
    return false;
  op->active_s3++;
  return true;
}

static void
seq_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  switch (op->state) {
  case PUSH_MARKER:
    if (res->err == -EEXIST && res->retries > 0 && !op->cancelled &&
        read_back(op, marker_key(op, op->cfg.c.rank)))
      return;
    if (res->err == -EEXIST)
      fail_msg(op, -EEXIST,
               "rank %u's part of checkpoint %s is already in the store",
               op->cfg.c.rank, op->name);
    else if (res->err < 0)
      fail_s3(op, "writing this rank's marker", res);
    break;
  case PUSH_COMMIT:
    if (res->err == -EEXIST && res->retries > 0 && !op->cancelled &&
        read_back(op,
                  spot__store_key(&op->cfg.c, op->name, SPOT_MANIFEST_NAME)))
      return;
    if (res->err == -EEXIST)
      fail_msg(op, -EEXIST, "checkpoint %s was committed by someone else",
               op->name);
    else if (res->err < 0)
      fail_s3(op, "writing the manifest", res);
    else
      op->commit_ms = spot_now_mono_ms() - op->start_ms;
    break;
  case PUSH_LATEST:
    if (res->err < 0) {
      /* The checkpoint is committed; LATEST lags. Readers fall back to
       * the newest manifest, so this is a warning. */
      char tmp[512];
      snprintf(op->warning, sizeof(op->warning),
               "committed, but updating LATEST failed: %s",
               spot_s3_strerror(res, tmp, sizeof(tmp)));
    }
    break;
  default:
    break;
  }
  advance(op);
}

static int
start_file_uploads(struct push_op *op)
{
  uint64_t bound = spot_codec_bound((size_t)op->cfg.c.part_size);
  int r = spot_manifest_new(op->name, op->cfg.job, spot_now_wall_ms(),
                            &op->manifest);

  if (r < 0) {
    fail_msg(op, r, "checkpoint name '%s' or job '%s' is not valid", op->name,
             op->cfg.job);
    return r;
  }
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    char key_rel[4224], path[4200];

    if (op->cfg.c.nranks > 1)
      snprintf(path, sizeof(path), "rank-%u/%s", op->cfg.c.rank, f->rel);
    else
      snprintf(path, sizeof(path), "%s", f->rel);
    if (f->size > 0) {
      snprintf(key_rel, sizeof(key_rel), "%s.zst", path);
      f->key = spot__store_key(&op->cfg.c, op->name, key_rel);
      if (f->key == NULL)
        return -ENOMEM;
    }
    r = spot_manifest_add_file(op->manifest, path, f->size > 0 ? key_rel : NULL,
                               f->size, f->mode, f->mtime_ns, f->filter,
                               &f->midx);
    if (r < 0) {
      fail_msg(op, r, "%s: cannot be recorded in the manifest", f->rel);
      return r;
    }
    if (f->nparts > 1) {
      f->etags = calloc(f->nparts, sizeof(*f->etags));
      if (f->etags == NULL)
        return -ENOMEM;
    }
    if (f->nparts == 0)
      f->done = true;
  }
  op->encs = calloc(op->cfg.c.workers, sizeof(*op->encs));
  op->nslots = op->cfg.c.workers + op->cfg.c.parallel;
  op->slots = calloc(op->nslots, sizeof(*op->slots));
  if (op->encs == NULL || op->slots == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < op->cfg.c.workers; i++) {
    r = spot_codec_new((size_t)op->cfg.c.part_size, &op->encs[i].codec);
    if (r < 0)
      return r;
    op->encs[i].raw = malloc((size_t)op->cfg.c.part_size);
    if (op->encs[i].raw == NULL)
      return -ENOMEM;
  }
  for (size_t i = 0; i < op->nslots; i++) {
    op->slots[i].op = op;
    op->slots[i].comp_cap = (size_t)bound;
    /* Untouched pages of these buffers cost no memory. */
    op->slots[i].comp = malloc((size_t)bound);
    if (op->slots[i].comp == NULL)
      return -ENOMEM;
  }
  return 0;
}

/* Retention ------------------------------------------------------- */

static void retain_step(struct push_op *op);

static void
retain_warn(struct push_op *op, const char *what,
            const struct spot_s3_result *res)
{
  char tmp[512];

  if (op->warning[0] == '\0')
    snprintf(op->warning, sizeof(op->warning), "retention: %s: %s", what,
             res != NULL ? spot_s3_strerror(res, tmp, sizeof(tmp)) : "failed");
}

static int
push_name(struct push_op *op, char *name)
{
  if (op->nnames == op->names_alloc) {
    size_t n = op->names_alloc ? op->names_alloc * 2 : 16;
    char **nn = realloc(op->names, n * sizeof(*nn));
    if (nn == NULL)
      return -ENOMEM;
    op->names = nn;
    op->names_alloc = n;
  }
  op->names[op->nnames++] = name;
  return 0;
}

static void
free_del_keys(struct push_op *op)
{
  for (size_t i = 0; i < op->ndel_keys; i++)
    free(op->del_keys[i]);
  free(op->del_keys);
  op->del_keys = NULL;
  op->ndel_keys = 0;
}

static void
retain_got_list(struct push_op *op, const struct spot_s3_result *res)
{
  for (size_t i = 0; i < res->n_common_prefixes; i++) {
    char *name = NULL;
    int r = spot__store_prefix_name(res->common_prefixes[i], &name);

    if (r == -EINVAL)
      continue;
    if (r < 0 || push_name(op, name) < 0) {
      free(name);
      retain_warn(op, "listing checkpoints", NULL);
      return;
    }
  }
  free(op->list_token);
  op->list_token = NULL;
  if (res->next_token != NULL) {
    op->list_token = strdup(res->next_token);
    if (op->list_token != NULL)
      return; /* next page */
  }
  op->read_idx = 0;
  set_state(op, PUSH_RETAIN_READ);
}

static void
retain_got_uploads(struct push_op *op, const struct spot_s3_result *res)
{
  int64_t now = spot_now_wall_ms();

  op->uploads = calloc(res->n_uploads + 1, sizeof(*op->uploads));
  if (op->uploads == NULL) {
    set_state(op, PUSH_DONE);
    return;
  }
  for (size_t i = 0; i < res->n_uploads; i++) {
    const struct spot_s3_upload_info *u = &res->uploads[i];
    struct spot_s3_upload_info *d = &op->uploads[op->nuploads];
    int64_t init;

    if (spot_rfc3339_parse(u->initiated, &init) < 0 ||
        now - init < (int64_t)op->cfg.c.stale_upload_age_ms)
      continue;
    d->key = strdup(u->key);
    d->upload_id = strdup(u->upload_id);
    d->initiated = strdup(u->initiated);
    op->nuploads++;
    if (d->key == NULL || d->upload_id == NULL || d->initiated == NULL)
      break;
  }
  op->upload_idx = 0;
}

static void
retain_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  if (op->cancelled) {
    fail(op, -ECANCELED);
    set_state(op, PUSH_DONE);
    finish(op);
    return;
  }
  switch (op->state) {
  case PUSH_RETAIN_LIST:
    if (res->err < 0) {
      retain_warn(op, "listing checkpoints", res);
      set_state(op, PUSH_RETAIN_UPLOADS);
    } else {
      retain_got_list(op, res);
    }
    break;
  case PUSH_RETAIN_READ: {
    struct spot_manifest *m = NULL;
    char err[256];

    /* 404: not committed (a leftover or a push in progress): kept. */
    if (res->err == 0 &&
        spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &m, err,
                            sizeof(err)) == 0) {
      struct retain_entry *e = &op->entries[op->nentries];
      e->name = strdup(op->names[op->read_idx]);
      e->created_ms = m->created_ms;
      if (e->name != NULL)
        op->nentries++;
      spot_manifest_free(m);
    }
    op->read_idx++;
    break;
  }
  case PUSH_RETAIN_DELETE:
    if (res->err < 0 || res->n_failed_keys > 0) {
      retain_warn(op, "deleting an old checkpoint", res);
      set_state(op, PUSH_RETAIN_UPLOADS);
      break;
    }
    if (op->del_phase == 0) {
      op->deleted++;
      op->del_phase = 1;
    } else if (op->del_phase == 1) {
      free_del_keys(op);
      if (res->n_objects == 0) {
        op->del_idx++;
        op->del_phase = 0;
        break;
      }
      op->del_keys = calloc(res->n_objects, sizeof(char *));
      if (op->del_keys == NULL) {
        retain_warn(op, "deleting an old checkpoint", NULL);
        set_state(op, PUSH_RETAIN_UPLOADS);
        break;
      }
      for (size_t i = 0; i < res->n_objects; i++) {
        op->del_keys[i] = strdup(res->objects[i].key);
        if (op->del_keys[i] == NULL)
          break;
        op->ndel_keys++;
      }
      op->del_phase = 2;
    } else {
      free_del_keys(op);
      op->del_phase = 1; /* list again until nothing is left */
    }
    break;
  case PUSH_RETAIN_UPLOADS:
    if (op->abort_key != NULL) {
      if (res->err == 0 || res->err == -ENOENT)
        op->aborted++;
      free(op->abort_key);
      free(op->abort_id);
      op->abort_key = op->abort_id = NULL;
      op->upload_idx++;
    } else if (res->err < 0) {
      retain_warn(op, "listing multipart uploads", res);
      set_state(op, PUSH_DONE);
    } else {
      retain_got_uploads(op, res);
    }
    break;
  default:
    break;
  }
  retain_step(op);
}

static int
cmp_entries(const void *a, const void *b)
{
  const struct retain_entry *x = a, *y = b;

  if (x->created_ms != y->created_ms)
    return x->created_ms > y->created_ms ? -1 : 1;
  return strcmp(y->name, x->name);
}

/* Issues the next retention request, or finishes. Retention is best
 * effort: the checkpoint is already committed, so trouble here becomes a
 * warning, never an error. */
static void
retain_step(struct push_op *op)
{
  char *key = NULL;
  int r = -ENOMEM;

  for (;;) {
    switch (op->state) {
    case PUSH_RETAIN_LIST:
      key = spot__store_key(&op->cfg.c, NULL, "checkpoints/");
      if (key != NULL)
        r = spot_s3_list(op->cfg.c.s3, op->cfg.bucket, key, "/", op->list_token,
                         0, retain_cb, op, &op->s3op);
      break;
    case PUSH_RETAIN_READ:
      if (op->entries == NULL)
        op->entries = calloc(op->nnames + 1, sizeof(*op->entries));
      if (op->entries == NULL)
        break;
      if (op->read_idx < op->nnames) {
        spot_buf_fini(&op->body);
        spot_buf_init(&op->body, SPOT__STORE_MANIFEST_CAP);
        key = spot__store_key(&op->cfg.c, op->names[op->read_idx],
                              SPOT_MANIFEST_NAME);
        if (key != NULL)
          r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL,
                          &op->body, retain_cb, op, &op->s3op);
        break;
      }
      if (op->nentries > 1)
        qsort(op->entries, op->nentries, sizeof(*op->entries), cmp_entries);
      op->del_idx = op->cfg.c.keep;
      op->del_phase = 0;
      set_state(op, PUSH_RETAIN_DELETE);
      continue;
    case PUSH_RETAIN_DELETE:
      /* Oldest beyond keep; never the one just pushed. */
      while (op->del_phase == 0 && op->del_idx < op->nentries &&
             (op->entries[op->del_idx].name == NULL ||
              strcmp(op->entries[op->del_idx].name, op->name) == 0))
        op->del_idx++;
      if (op->del_idx >= op->nentries) {
        set_state(op, PUSH_RETAIN_UPLOADS);
        continue;
      }
      if (op->del_phase == 0) {
        /* The manifest first, so the checkpoint stops being committed
         * before any of its objects goes. */
        free_del_keys(op);
        op->del_keys = calloc(1, sizeof(char *));
        if (op->del_keys == NULL)
          break;
        op->del_keys[0] = spot__store_key(
            &op->cfg.c, op->entries[op->del_idx].name, SPOT_MANIFEST_NAME);
        if (op->del_keys[0] == NULL)
          break;
        op->ndel_keys = 1;
        r = spot_s3_delete_objects(op->cfg.c.s3, op->cfg.bucket,
                                   (const char *const *)op->del_keys, 1,
                                   retain_cb, op, &op->s3op);
      } else if (op->del_phase == 1) {
        key = spot__store_key(&op->cfg.c, op->entries[op->del_idx].name, "");
        if (key != NULL)
          r = spot_s3_list(op->cfg.c.s3, op->cfg.bucket, key, NULL, NULL, 1000,
                           retain_cb, op, &op->s3op);
      } else {
        r = spot_s3_delete_objects(op->cfg.c.s3, op->cfg.bucket,
                                   (const char *const *)op->del_keys,
                                   op->ndel_keys, retain_cb, op, &op->s3op);
      }
      break;
    case PUSH_RETAIN_UPLOADS:
      if (op->uploads == NULL) {
        key = spot__store_key(&op->cfg.c, NULL, "checkpoints/");
        if (key != NULL)
          r = spot_s3_list_uploads(op->cfg.c.s3, op->cfg.bucket, key, retain_cb,
                                   op, &op->s3op);
        break;
      }
      if (op->upload_idx < op->nuploads) {
        struct spot_s3_upload_info *u = &op->uploads[op->upload_idx];
        if (u->key == NULL || u->upload_id == NULL) {
          op->upload_idx++;
          continue;
        }
        op->abort_key = strdup(u->key);
        op->abort_id = strdup(u->upload_id);
        if (op->abort_key != NULL && op->abort_id != NULL)
          r = spot_s3_mpu_abort(op->cfg.c.s3, op->cfg.bucket, op->abort_key,
                                op->abort_id, retain_cb, op, &op->s3op);
        break;
      }
      set_state(op, PUSH_DONE);
      finish(op);
      return;
    default:
      finish(op);
      return;
    }
    break;
  }
  free(key);
  if (r == 0) {
    op->active_s3++;
    return;
  }
  if (op->warning[0] == '\0')
    snprintf(op->warning, sizeof(op->warning), "retention stopped: %s",
             strerror(-r));
  set_state(op, PUSH_DONE);
  finish(op);
}

/* Abort after an error ------------------------------------------- */

static void abort_next(struct push_op *op);

static void
abort_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  if (res->err < 0 && res->err != -ENOENT)
    log_warn("push name=%s: aborting an upload failed (retention will "
             "abort it later)",
             op->name);
  abort_next(op);
}

static void
abort_next(struct push_op *op)
{
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    if (f->upload_id == NULL || f->done || f->aborting)
      continue;
    f->aborting = true;
    if (spot_s3_mpu_abort(op->cfg.c.s3, op->cfg.bucket, f->key, f->upload_id,
                          abort_cb, op, &op->s3op) == 0) {
      op->active_s3++;
      return;
    }
  }
  finish(op);
}

/* Multi-node ------------------------------------------------------ */

static void rank_step(struct push_op *op);

/* PUT MANIFEST.json (op->manifest_json) with If-None-Match: the commit. */
static void
commit_put(struct push_op *op)
{
  char *key;
  int r;

  set_state(op, PUSH_COMMIT);
  report_progress(op, SPOT_STORE_PHASE_COMMIT);
  key = spot__store_key(&op->cfg.c, op->name, SPOT_MANIFEST_NAME);
  if (key == NULL) {
    fail(op, -ENOMEM);
    advance(op);
    return;
  }
  r = spot_s3_put(op->cfg.c.s3, op->cfg.bucket, key, op->manifest_json,
                  strlen(op->manifest_json), SPOT_S3_IF_NONE_MATCH, seq_cb, op,
                  &op->s3op);
  free(key);
  if (r < 0) {
    fail_msg(op, r, "writing the manifest: %s", strerror(-r));
    advance(op);
    return;
  }
  op->active_s3++;
}

static void
wait_timer_cb(uv_timer_t *t)
{
  struct push_op *op = spot_container_of(t, struct push_op, wait_timer);

  op->wait_armed = false;
  if (op->cancelled || op->err < 0) {
    advance(op);
    return;
  }
  rank_step(op);
}

/* Not there yet: poll again in RANK_POLL_MS, or give up. */
static void
rank_wait_more(struct push_op *op)
{
  uint64_t waited = spot_now_mono_ms() - op->wait_start_ms;

  if (waited >= op->cfg.c.rank_wait_ms) {
    if (op->state == PUSH_COMMIT_WAIT) {
      fail_msg(op, -ETIMEDOUT, "rank 0 did not commit %s within %" PRIu64 " s",
               op->name, op->cfg.c.rank_wait_ms / 1000);
    } else {
      char missing[256] = "";
      size_t len = 0;

      for (unsigned k = 0; k < op->cfg.c.nranks && len + 16 < sizeof(missing);
           k++)
        if (!op->rank_seen[k])
          len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
                                  len > 0 ? "," : "", k);
      fail_msg(op, -ETIMEDOUT,
               "rank(s) %s did not write their part of %s within %" PRIu64
               " s; nothing committed",
               missing, op->name, op->cfg.c.rank_wait_ms / 1000);
    }
    advance(op);
    return;
  }
  uv_timer_start(&op->wait_timer, wait_timer_cb, RANK_POLL_MS, 0);
  op->wait_armed = true;
}

/* Adds rank's partial manifest (in op->body) to op->merged. */
static int
merge_marker(struct push_op *op, unsigned rank)
{
  struct spot_manifest *m = NULL;
  char err[256], prefix[32];
  size_t plen;
  int r;

  r = spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &m, err,
                          sizeof(err));
  if (r < 0) {
    fail_msg(op, -EBADMSG, "rank %u's part of %s is unreadable: %s", rank,
             op->name, err);
    return -EBADMSG;
  }
  plen = (size_t)snprintf(prefix, sizeof(prefix), "rank-%u/", rank);
  if (strcmp(m->name, op->name) != 0 || strcmp(m->job, op->cfg.job) != 0) {
    fail_msg(op, -EBADMSG, "rank %u's part of %s names another checkpoint",
             rank, op->name);
    spot_manifest_free(m);
    return -EBADMSG;
  }
  for (size_t i = 0; i < m->nfiles; i++) {
    const struct spot_manifest_file *f = &m->files[i];
    size_t idx;

    if (strncmp(f->path, prefix, plen) != 0 ||
        (f->key != NULL && strncmp(f->key, prefix, plen) != 0)) {
      fail_msg(op, -EBADMSG, "rank %u's part of %s holds %s, outside %s", rank,
               op->name, f->path, prefix);
      spot_manifest_free(m);
      return -EBADMSG;
    }
    r = spot_manifest_add_file(op->merged, f->path, f->key, f->size, f->mode,
                               f->mtime_ns, f->filter, &idx);
    for (size_t j = 0; r == 0 && j < f->nframes; j++)
      r = spot_manifest_set_frame(op->merged, idx, j, f->frames[j].raw_len,
                                  f->frames[j].comp_len, f->frames[j].crc32c);
    if (r < 0) {
      fail_msg(op, r, "merging rank %u's part of %s: %s", rank, op->name,
               strerror(-r));
      spot_manifest_free(m);
      return r;
    }
  }
  spot_manifest_free(m);
  return 0;
}

static void
rank_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  char what[64];

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  if (op->cancelled) {
    advance(op);
    return;
  }
  switch (op->state) {
  case PUSH_RANK_WAIT:
    if (res->err < 0) {
      fail_s3(op, "listing the rank markers", res);
      break;
    }
    for (size_t i = 0; i < res->n_objects; i++) {
      const char *b = strrchr(res->objects[i].key, '/');
      unsigned k;
      char tail;

      if (b != NULL && sscanf(b, "/rank-%u.jso%c", &k, &tail) == 2 &&
          tail == 'n' && k < op->cfg.c.nranks)
        op->rank_seen[k] = true;
    }
    free(op->rank_token);
    op->rank_token = NULL;
    if (res->next_token != NULL) {
      op->rank_token = strdup(res->next_token);
      if (op->rank_token == NULL) {
        fail(op, -ENOMEM);
        break;
      }
      rank_step(op); /* next page */
      return;
    }
    for (unsigned k = 0; k < op->cfg.c.nranks; k++)
      if (!op->rank_seen[k]) {
        rank_wait_more(op);
        return;
      }
    log_info("push name=%s: all %u ranks wrote their part", op->name,
             op->cfg.c.nranks);
    if (spot_manifest_new(op->name, op->cfg.job, spot_now_wall_ms(),
                          &op->merged) < 0) {
      fail(op, -ENOMEM);
      break;
    }
    op->rank_idx = 0;
    set_state(op, PUSH_RANK_READ);
    rank_step(op);
    return;
  case PUSH_RANK_READ:
    if (res->err < 0) {
      snprintf(what, sizeof(what), "reading rank %u's marker", op->rank_idx);
      fail_s3(op, what, res);
      break;
    }
    if (merge_marker(op, op->rank_idx) < 0)
      break;
    op->rank_idx++;
    rank_step(op);
    return;
  case PUSH_COMMIT_WAIT:
    if (res->err == -ENOENT) {
      rank_wait_more(op);
      return;
    }
    if (res->err < 0) {
      fail_s3(op, "checking for rank 0's commit", res);
      break;
    }
    op->commit_ms = spot_now_mono_ms() - op->start_ms;
    log_info("push name=%s: rank 0 committed the checkpoint", op->name);
    break;
  default:
    break;
  }
  advance(op);
}

/* One step of the multi-node wait or merge. */
static void
rank_step(struct push_op *op)
{
  char err[256];
  char *key = NULL;
  int r = -ENOMEM;

  switch (op->state) {
  case PUSH_RANK_WAIT:
    if (op->rank_token == NULL)
      memset(op->rank_seen, 0, op->cfg.c.nranks * sizeof(*op->rank_seen));
    key = spot__store_key(&op->cfg.c, op->name, "ranks/");
    if (key != NULL)
      r = spot_s3_list(op->cfg.c.s3, op->cfg.bucket, key, NULL, op->rank_token,
                       0, rank_cb, op, &op->s3op);
    break;
  case PUSH_RANK_READ:
    if (op->rank_idx >= op->cfg.c.nranks) {
      /* Every part is in: the merged manifest is the commit. */
      op->own_stored = op->manifest->total_stored;
      op->did_merge = true;
      spot_manifest_free(op->manifest);
      op->manifest = op->merged;
      op->merged = NULL;
      free(op->manifest_json);
      op->manifest_json = NULL;
      r = spot_manifest_to_json(op->manifest, &op->manifest_json, err,
                                sizeof(err));
      if (r < 0) {
        fail_msg(op, r, "building the merged manifest: %s", err);
        advance(op);
        return;
      }
      commit_put(op);
      return;
    }
    spot_buf_reset(&op->body);
    key = marker_key(op, op->rank_idx);
    if (key != NULL)
      r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL, &op->body,
                      rank_cb, op, &op->s3op);
    break;
  case PUSH_COMMIT_WAIT:
    spot_buf_reset(&op->body);
    key = spot__store_key(&op->cfg.c, op->name, SPOT_MANIFEST_NAME);
    if (key != NULL)
      r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 1, NULL, &op->body,
                      rank_cb, op, &op->s3op);
    break;
  default:
    return;
  }
  free(key);
  if (r < 0) {
    fail_msg(op, r, "waiting for the other ranks: %s", strerror(-r));
    advance(op);
    return;
  }
  op->active_s3++;
}

/* The state machine ---------------------------------------------- */

static void
advance(struct push_op *op)
{
  int r;

  if (busy(op))
    return;
  if (op->err < 0 || op->cancelled) {
    if (op->err == 0)
      op->err = -ECANCELED;
    if (op->state == PUSH_DONE || op->state == PUSH_ABORT)
      return;
    /* Nothing was committed. Drop this push's multipart uploads; the
     * objects of completed files stay as uncommitted leftovers that no
     * reader trusts and a later push of the same name overwrites. */
    if (op->state == PUSH_RESUME || op->state == PUSH_XFER ||
        op->state == PUSH_VERIFY || op->state == PUSH_COMMIT) {
      set_state(op, PUSH_ABORT);
      abort_next(op);
      return;
    }
    set_state(op, PUSH_DONE);
    finish(op);
    return;
  }

  switch (op->state) {
  case PUSH_WALK: {
    char *key = spot__store_key(&op->cfg.c, op->name, SPOT_MANIFEST_NAME);

    set_state(op, PUSH_CHECK);
    if (key == NULL) {
      fail(op, -ENOMEM);
      advance(op);
      return;
    }
    /* A 1-byte GET rather than HEAD: a refused GET carries the S3 code
     * (SignatureDoesNotMatch, InvalidAccessKeyId) that a HEAD reply
     * cannot, and this is the first request of a push. */
    spot_buf_reset(&op->body);
    r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 1, NULL, &op->body,
                    check_cb, op, &op->s3op);
    free(key);
    if (r < 0) {
      fail_msg(op, r, "checking the checkpoint name: %s", strerror(-r));
      advance(op);
      return;
    }
    op->active_s3++;
    return;
  }
  case PUSH_CHECK:
    r = start_file_uploads(op);
    if (r < 0) {
      fail(op, r);
      advance(op);
      return;
    }
    if (op->journal_path != NULL) {
      struct spot__journal *j = NULL;

      r = spot__journal_load(op->journal_path, &j);
      if (r == 0 &&
          (strcmp(j->job, op->cfg.job) != 0 || strcmp(j->name, op->name) != 0 ||
           j->part_size != op->cfg.c.part_size)) {
        /* Another part size: its parts cannot be reused. Abort them. */
        for (size_t i = 0; i < j->nfiles; i++)
          j->files[i].ino = UINT64_MAX;
      }
      if (r == 0) {
        log_info("push name=%s: found a journal of %zu upload(s) in progress",
                 op->name, j->nfiles);
        op->resume = j;
        op->resume_idx = 0;
        set_state(op, PUSH_RESUME);
        resume_step(op);
        return;
      }
      if (r != -ENOENT)
        log_warn("push name=%s: unreadable journal %s: starting over", op->name,
                 op->journal_path);
    }
    set_state(op, PUSH_RESUME);
    orphans_step(op);
    return;
  case PUSH_XFER:
    for (size_t i = 0; i < op->nfiles; i++)
      if (!op->files[i].done)
        return; /* pump() has more to do */
    set_state(op, PUSH_VERIFY);
    r = uv_queue_work(op->loop, &op->work, verify_work_cb, walk_after_cb);
    if (r < 0) {
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      advance(op);
      return;
    }
    op->active_work++;
    return;
  case PUSH_VERIFY: {
    char err[256];
    char *key;

    r = spot_manifest_to_json(op->manifest, &op->manifest_json, err,
                              sizeof(err));
    if (r < 0) {
      fail_msg(op, r, "building the manifest: %s", err);
      advance(op);
      return;
    }
    if (op->cfg.c.nranks <= 1) {
      commit_put(op);
      return;
    }
    /* Multi-node: this rank's part is complete; say so. */
    set_state(op, PUSH_MARKER);
    report_progress(op, SPOT_STORE_PHASE_COMMIT);
    key = marker_key(op, op->cfg.c.rank);
    if (key == NULL) {
      fail(op, -ENOMEM);
      advance(op);
      return;
    }
    r = spot_s3_put(op->cfg.c.s3, op->cfg.bucket, key, op->manifest_json,
                    strlen(op->manifest_json), SPOT_S3_IF_NONE_MATCH, seq_cb,
                    op, &op->s3op);
    free(key);
    if (r < 0) {
      fail_msg(op, r, "writing this rank's marker: %s", strerror(-r));
      advance(op);
      return;
    }
    op->active_s3++;
    return;
  }
  case PUSH_MARKER:
    log_info("push name=%s: rank %u of %u wrote its part", op->name,
             op->cfg.c.rank, op->cfg.c.nranks);
    op->wait_start_ms = spot_now_mono_ms();
    set_state(op, op->cfg.c.rank == 0 ? PUSH_RANK_WAIT : PUSH_COMMIT_WAIT);
    rank_step(op);
    return;
  case PUSH_COMMIT_WAIT:
    /* Rank 0 committed the whole checkpoint; LATEST and retention are
     * its business. */
    set_state(op, PUSH_DONE);
    finish(op);
    return;
  case PUSH_COMMIT: {
    char *key = spot__store_key(&op->cfg.c, NULL, "LATEST");

    log_debug("committed checkpoint name=%s job=%s files=%zu", op->name,
              op->cfg.job, op->nfiles);
    set_state(op, PUSH_LATEST);
    if (key == NULL) {
      fail(op, -ENOMEM);
      advance(op);
      return;
    }
    r = spot_s3_put(op->cfg.c.s3, op->cfg.bucket, key, op->name,
                    strlen(op->name), 0, seq_cb, op, &op->s3op);
    free(key);
    if (r < 0) {
      snprintf(op->warning, sizeof(op->warning),
               "committed, but updating LATEST failed: %s", strerror(-r));
      set_state(op, PUSH_DONE);
      finish(op);
      return;
    }
    op->active_s3++;
    return;
  }
  case PUSH_LATEST:
    report_progress(op, SPOT_STORE_PHASE_RETAIN);
    if (op->cfg.c.keep == 0) {
      set_state(op, PUSH_RETAIN_UPLOADS);
    } else {
      set_state(op, PUSH_RETAIN_LIST);
    }
    retain_step(op);
    return;
  default:
    return;
  }
}

void
spot__store_push_cancel(struct spot_store_op *sop)
{
  struct push_op *op = (struct push_op *)(void *)sop;

  if (op->state == PUSH_DONE || op->cancelled)
    return;
  op->cancelled = true;
  fail(op, -ECANCELED);
  spot__store_msg(op->msg, sizeof(op->msg), "cancelled");
  for (size_t i = 0; i < op->nslots; i++) {
    struct slot *s = &op->slots[i];
    if (s->state == SLOT_ENCODING)
      uv_cancel((uv_req_t *)&s->work);
    else if (s->state == SLOT_SENDING && s->s3op != NULL)
      spot_s3_cancel(s->s3op);
  }
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].s3op != NULL)
      spot_s3_cancel(op->files[i].s3op);
  /* Cancelling the parts above runs their callbacks at once, which may
   * already have moved to ABORT and started a multipart abort in s3op:
   * that cleanup must run, not be cancelled too. */
  if (op->s3op != NULL && op->state != PUSH_ABORT)
    spot_s3_cancel(op->s3op);
  /* Between two polls nothing is in flight: finish from the loop. */
  if (op->wait_armed)
    uv_timer_start(&op->wait_timer, wait_timer_cb, 0, 0);
}

int
spot_store_push(uv_loop_t *loop, const struct spot_store_config *cfg,
                const char *dir, const char *name,
                spot_store_progress_cb progress, spot_store_cb cb, void *data,
                struct spot_store_op **out)
{
  struct push_op *op;
  const char *base;
  size_t dlen;
  int r;

  if (loop == NULL || cfg == NULL || dir == NULL || cb == NULL)
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  op->hdr.kind = SPOT__STORE_PUSH;
  op->loop = loop;
  r = spot__store_cfg_copy(&op->cfg, cfg);
  if (r < 0) {
    free(op);
    return r;
  }
  spot_buf_init(&op->body, SPOT__STORE_MANIFEST_CAP);
  op->dir = strdup(dir);
  if (op->dir == NULL)
    goto nomem;
  /* The name defaults to the folder's base name. */
  dlen = strlen(op->dir);
  while (dlen > 1 && op->dir[dlen - 1] == '/')
    op->dir[--dlen] = '\0';
  base = strrchr(op->dir, '/');
  base = base != NULL ? base + 1 : op->dir;
  op->name = strdup(name != NULL ? name : base);
  if (op->name == NULL)
    goto nomem;
  if (!spot_ckpt_name_valid(op->name)) {
    r = -EINVAL;
    goto err;
  }
  if (op->cfg.c.nranks == 0)
    op->cfg.c.nranks = 1;
  if (op->cfg.c.rank_wait_ms == 0)
    op->cfg.c.rank_wait_ms = RANK_WAIT_DEFAULT_MS;
  if (op->cfg.c.rank >= op->cfg.c.nranks || op->cfg.c.nranks > 1024) {
    r = -EINVAL;
    goto err;
  }
  if (op->cfg.c.nranks > 1) {
    op->rank_seen = calloc(op->cfg.c.nranks, sizeof(*op->rank_seen));
    if (op->rank_seen == NULL)
      goto nomem;
  }
  if (op->cfg.journal_dir != NULL) {
    op->journal_path =
        spot__journal_path(op->cfg.journal_dir, op->cfg.job, op->name);
    if (op->journal_path == NULL)
      goto nomem;
  }
  op->progress = progress;
  op->cb = cb;
  op->data = data;
  op->start_ms = spot_now_mono_ms();
  r = uv_timer_init(loop, &op->progress_timer);
  if (r < 0)
    goto err;
  op->handles = 1;
  if (op->cfg.c.nranks > 1) {
    /* Cannot fail once a timer of the same loop initialised. */
    (void)uv_timer_init(loop, &op->wait_timer);
    op->handles++;
  }
  if (progress != NULL) {
    uv_timer_start(&op->progress_timer, progress_timer_cb, 250, 250);
    uv_unref((uv_handle_t *)&op->progress_timer);
  }
  r = uv_queue_work(loop, &op->work, walk_work_cb, walk_after_cb);
  if (r < 0) {
    /* the timers are initialised: free through their close callbacks,
     * and make sure the user callback never runs */
    close_timers(op);
    return r;
  }
  op->active_work++;
  report_progress(op, SPOT_STORE_PHASE_PLAN);
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
nomem:
  r = -ENOMEM;
err:
  op_free(op);
  return r;
}
