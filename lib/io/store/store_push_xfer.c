/* Push, the transfer: read + compress parts on the pool (at most `workers`
 * at once), upload them (at most the controller's limit, pace.h), one
 * multipart upload per file bigger than a part, a single PUT otherwise.
 * Memory: `workers` raw part buffers and `workers + limit` compressed
 * ones, whatever the checkpoint size, within the memory budget. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

static const char *const file_state_names[] = {
    "wait", "creating", "open", "completing", "done", "aborting",
};
_Static_assert(SPOT_ARRAY_SIZE(file_state_names) == FILE_STATE_LAST,
               "file_state_names");

static const struct spot_fsm file_fsm = {
    "push file", file_state_names, FILE_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

/* A part's slot: read and encoded on the pool (the pool's job frees it),
 * ready, then sent; its transfer's end frees it. */
static const char *const slot_state_names[] = {
    "free",
    "encoding",
    "ready",
    "sending",
};
_Static_assert(SPOT_ARRAY_SIZE(slot_state_names) == SLOT_STATE_LAST,
               "slot_state_names");

static const uint32_t slot_legal[SLOT_STATE_LAST] = {
    [SLOT_FREE] = SPOT_FSM_BIT(SLOT_ENCODING) | SPOT_FSM_BIT(SLOT_READY),
    [SLOT_ENCODING] = SPOT_FSM_BIT(SLOT_FREE),
    [SLOT_READY] = SPOT_FSM_BIT(SLOT_SENDING),
    [SLOT_SENDING] = SPOT_FSM_BIT(SLOT_FREE),
};

static const struct spot_fsm slot_fsm = {
    "push slot", slot_state_names, SLOT_STATE_LAST, slot_legal,
    0,           SPOT_LOG_DEBUG};

void
spot__push_file_set_state_at(struct push_op *op, struct pfile *f,
                             enum file_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&file_fsm, f->state, s, file, line,
                           "name=%s file=%s", op->b.name, f->rel) > 0)
    f->state = s;
}

bool
spot__push_files_done(const struct push_op *op)
{
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].state != FILE_DONE)
      return false;
  return true;
}

#define fail_msg(op, ...) spot__store_fail_msg(&(op)->b, __VA_ARGS__)

int
spot__push_read_full(int fd, void *buf, size_t n, uint64_t off)
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

/* A part that goes out unfiltered in raw frames (incompressible data:
 * random, already compressed) is read straight into the frame's blocks
 * in the slot's buffer, one preadv per 64 blocks (8 MiB), instead of into
 * the raw buffer that spot_codec_encode() would copy from: a 1 GiB
 * random file to the discard sink, 0.84 -> 0.81 CPU-s, peak RSS 80 ->
 * 64 MiB (the raw buffers stay untouched). */
#define RAW_IOV 64

static int
read_raw_frame(struct spot__store_slot *s, int fd, uint64_t off)
{
  size_t n = (size_t)s->raw_len, len, i = 0;
  unsigned char *d = s->comp;
  uint32_t crc = 0;

  len = spot_codec_raw_frame(d, s->comp_cap, n);
  if (len == 0)
    return -ENOBUFS;
  while (i * SPOT_CODEC_RAW_BLOCK < n) {
    struct iovec iov[RAW_IOV];
    size_t k = 0, want = 0, first = i;
    ssize_t got;

    for (; k < RAW_IOV && i * SPOT_CODEC_RAW_BLOCK < n; k++, i++) {
      size_t b = n - i * SPOT_CODEC_RAW_BLOCK;

      iov[k].iov_base = d + spot_codec_raw_payload(n, i);
      iov[k].iov_len = b < SPOT_CODEC_RAW_BLOCK ? b : SPOT_CODEC_RAW_BLOCK;
      want += iov[k].iov_len;
    }
    got = preadv(fd, iov, (int)k, (off_t)(off + first * SPOT_CODEC_RAW_BLOCK));
    if (got < 0 && errno == EINTR) {
      i = first;
      continue;
    }
    if (got < 0)
      return -errno;
    if ((size_t)got < want) {
      /* short (rare: a signal, or the file shrank): the rest one block
       * at a time, with the plain reader's checks */
      for (size_t j = 0; j < k; j++) {
        size_t done =
            (size_t)got < iov[j].iov_len ? (size_t)got : iov[j].iov_len;
        int r = spot__push_read_full(
            fd, (char *)iov[j].iov_base + done, iov[j].iov_len - done,
            off + (first + j) * SPOT_CODEC_RAW_BLOCK + done);

        if (r < 0)
          return r;
        got -= (ssize_t)done;
      }
    }
    for (size_t j = 0; j < k; j++)
      crc = spot_crc32c(crc, iov[j].iov_base, iov[j].iov_len);
  }
  s->comp_len = len;
  s->crc = crc;
  return 0;
}

/* The part is pread into the coder's raw buffer and the codec reads it
 * from there. Mapping the file instead (MAP_POPULATE, the codec reading
 * the page cache directly) was measured and dropped: the pread's copy
 * goes away, but the grouping loop then reads memory that is cold in the
 * CPU's caches, and a 1 GiB push took 40 % more CPU (and a file that
 * shrinks while mapped raises SIGBUS). */
int
spot__push_pad(void *comp, size_t cap, size_t *len)
{
  return pad_part(comp, cap, len);
}

static void
encode_work_cb(uv_work_t *req)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct push_op *op = (struct push_op *)(void *)s->op;
  struct pfile *f = &op->files[s->file];
  uint64_t off = (uint64_t)s->part * op->b.cfg.c.part_size;
  uint64_t t0 = spot_now_mono_ms();
  int fd;

  if (f->pk != NULL) {
    spot__pack_encode(op, s); /* a part of a pack: whole small files */
    return;
  }
  if (f->df != NULL) {
    spot__dedup_encode(op, s, f); /* frames of dedup_frame, some sent */
    s->work_ns = (spot_now_mono_ms() - t0) * 1000000u + 1;
    return;
  }
  s->work_err = 0;
  fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    s->work_err = -errno;
    return;
  }
  if (s->mode == SPOT_CODEC_RAW && f->filter == SPOT_FILTER_NONE) {
    s->work_err = read_raw_frame(s, fd, off);
    close(fd);
  } else {
    /* With a grouping filter the part is read into the slot's buffer,
     * which the codec reads whole before its frame overwrites it
     * (codec.h): the coder's raw buffer stays untouched. Each buffer's
     * first touch costs the kernel's zeroing of its pages: with 16
     * workers, 16 raw buffers of a part each were a quarter of the pages
     * a 1 GiB push touched (bench/results/threads.md). */
    unsigned char *in = f->filter != SPOT_FILTER_NONE ? s->comp : s->coder->raw;

    s->work_err = spot__push_read_full(fd, in, (size_t)s->raw_len, off);
    close(fd);
    if (s->work_err < 0)
      return;
    s->work_err = spot_codec_encode(
        s->coder->codec, f->filter, (enum spot_codec_mode)s->mode, in,
        (size_t)s->raw_len, s->comp, s->comp_cap, &s->comp_len, &s->crc);
  }
  /* A file taken while it grew (store_follow.c): every part of at least
   * S3's minimum, the last one could not be told apart in time. */
  if (s->work_err == 0 &&
      (f->open_ended ? s->raw_len >= SPOT_STORE_PART_MIN
                     : f->nparts > 1 && s->part + 1 < f->nparts))
    s->work_err = pad_part(s->comp, s->comp_cap, &s->comp_len);
  s->work_ns = (spot_now_mono_ms() - t0) * 1000000u + 1;
}

static void
encode_after_cb(uv_work_t *req, int status)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct push_op *op = (struct push_op *)(void *)s->op;
  struct pfile *f = &op->files[s->file];
  int r = spot__store_pipe_worked(s, status);

  if (r == 0 && f->pk != NULL)
    r = spot__pack_encoded(op, s);
  else if (r == 0 && f->df != NULL)
    r = spot__dedup_encoded(op, s);
  else if (r == 0)
    r = spot_manifest_set_frame(op->manifest, f->midx, s->part, s->raw_len,
                                s->comp_len, s->crc);
  if (r == -ESTALE)
    fail_msg(op, r, "%s: file changed while it was pushed", f->rel);
  else if (r < 0)
    fail_msg(op, r, "%s part %zu: %s", f->rel, s->part + 1, strerror(-r));
  if (r == 0) {
    op->enc_bytes += s->raw_len;
    op->enc_ns += s->work_ns;
    op->b.raw_done += s->raw_len;
    spot__store_slot_set_state(s, SLOT_READY);
  }
  spot__push_pump(op);
}

static void
part_done_cb(const struct spot_s3_result *res, void *data)
{
  struct spot__store_slot *s = data;
  struct push_op *op = (struct push_op *)(void *)s->op;
  struct pfile *f = &op->files[s->file];

  spot__store_s3_done(&op->b, &s->s3op, res);
  op->active_xfers--;
  spot__store_slot_set_state(s, SLOT_FREE);
  if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "uploading %s part %zu", f->rel, s->part + 1);
    if (!spot__store_slot_too_slow(s, what))
      spot__store_fail_s3(&op->b, what, res);
    spot__push_pump(op);
    return;
  }
  spot__store_slot_finished(s, s->comp_len);
  op->b.stored_done += s->comp_len;
  op->net_bytes += s->comp_len;
  f->parts_done++;
  if (f->nparts == 1) {
    spot__push_file_set_state(op, f, FILE_DONE);
  } else {
    struct spot_s3_part_info *pi = &f->etags[s->part];
    pi->number = (int)s->part + 1;
    pi->size = s->comp_len;
    spot_strlcpy(pi->etag, res->etag != NULL ? res->etag : "",
                 sizeof(pi->etag));
    spot__resume_save(op, false);
  }
  spot__push_pump(op);
}

/* Create and complete of a file's multipart upload carry this context. */
struct fctx {
  struct push_op *op;
  size_t file;
};

static void
file_op_cb(const struct spot_s3_result *res, void *data)
{
  struct fctx *c = data;
  struct push_op *op = c->op;
  struct pfile *f = &op->files[c->file];
  bool complete = f->state == FILE_COMPLETING;

  free(c);
  spot__store_s3_done(&op->b, &f->s3op, res);
  if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "%s the upload of %s",
             complete ? "completing" : "starting", f->rel);
    spot__store_fail_s3(&op->b, what, res);
    /* A failed complete leaves the upload open (abort it). */
    spot__push_file_set_state(op, f, complete ? FILE_OPEN : FILE_WAIT);
  } else if (complete) {
    spot__push_file_set_state(op, f, FILE_DONE);
  } else if (res->upload_id == NULL || res->upload_id[0] == '\0') {
    fail_msg(op, -EPROTO, "starting the upload of %s: no upload id", f->rel);
    spot__push_file_set_state(op, f, FILE_WAIT);
  } else if ((f->upload_id = strdup(res->upload_id)) == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    spot__push_file_set_state(op, f, FILE_WAIT);
  } else {
    spot__push_file_set_state(op, f, FILE_OPEN);
    spot__resume_save(op, true);
  }
  spot__push_pump(op);
}

static int
file_op(struct push_op *op, size_t i, bool complete)
{
  struct pfile *f = &op->files[i];
  struct fctx *c = malloc(sizeof(*c));
  const struct spot__store_cfg *cfg = &op->b.cfg;
  int r;

  if (c == NULL)
    return -ENOMEM;
  c->op = op;
  c->file = i;
  if (complete)
    r = spot_s3_mpu_complete(cfg->c.s3, cfg->bucket, f->key, f->upload_id,
                             f->etags, f->nparts, file_op_cb, c, &f->s3op);
  else
    r = spot_s3_mpu_create(cfg->c.s3, cfg->bucket, f->key, file_op_cb, c,
                           &f->s3op);
  if (r < 0) {
    free(c);
    return r;
  }
  op->b.active_s3++;
  spot__push_file_set_state(op, f, complete ? FILE_COMPLETING : FILE_CREATING);
  return 0;
}

/* A multipart file's parts wait for its upload id. */
static bool
can_send(const struct spot__store_slot *s)
{
  const struct push_op *op = (const struct push_op *)(const void *)s->op;
  const struct pfile *f = &op->files[s->file];

  return f->nparts == 1 || f->state == FILE_OPEN;
}

static enum spot_codec_mode
choose_mode(struct push_op *op, const struct pfile *f)
{
  double cbps, nbps, ratio, secs;

  if (!f->compress)
    return SPOT_CODEC_RAW;
  if (op->b.cfg.c.compress != SPOT_STORE_COMPRESS_AUTO)
    return f->cmode;
  if (op->enc_ns == 0 || op->b.stored_done == 0)
    return f->cmode;
  /* All workers together; per-part time includes the read. */
  cbps = (double)op->enc_bytes / ((double)op->enc_ns / 1e9) *
         (double)op->b.cfg.c.workers;
  secs = (double)(spot_now_mono_ms() - op->net_ms_start) / 1000.0;
  nbps = secs > 0.05 ? (double)op->net_bytes / secs : 0;
  ratio = op->b.raw_done > 0 && op->b.stored_done > 0
              ? (double)op->enc_bytes / (double)op->b.stored_done
              : 1.0;
  /* Only trust the network figure while parts queue up for it. */
  if (op->active_xfers < spot_pace_limit(&op->b.pace))
    nbps = 0;
  return spot_codec_compress_pays(cbps, nbps, ratio) ? f->cmode
                                                     : SPOT_CODEC_RAW;
}

/* 1. uploads of encoded parts, oldest first */
static void
start_sends(struct push_op *op)
{
  const struct spot__store_cfg *cfg = &op->b.cfg;

  while (op->active_xfers < spot_pace_limit(&op->b.pace)) {
    struct spot__store_slot *s =
        spot__store_pipe_find(&op->pipe, SLOT_READY, can_send);
    struct pfile *f;
    int r;

    if (s == NULL)
      break;
    f = &op->files[s->file];
    if (f->nparts == 1)
      r = spot_s3_put(cfg->c.s3, cfg->bucket, f->key, s->comp, s->comp_len, 0,
                      part_done_cb, s, &s->s3op);
    else
      r = spot_s3_mpu_part(cfg->c.s3, cfg->bucket, f->key, f->upload_id,
                           (int)s->part + 1, s->comp, s->comp_len, part_done_cb,
                           s, &s->s3op);
    if (r < 0) {
      fail_msg(op, r, "uploading %s: %s", f->rel, strerror(-r));
      break;
    }
    if (op->net_ms_start == 0)
      op->net_ms_start = spot_now_mono_ms();
    spot__store_slot_sent(s, s->comp_len);
    spot__store_slot_set_state(s, SLOT_SENDING);
    op->b.active_s3++;
    op->active_xfers++;
  }
}

/* 2. encodes: a free encoder and a free slot per part */
static void
start_encodes(struct push_op *op)
{
  while (op->b.err == 0 && op->next_file < op->nfiles) {
    struct pfile *f = &op->files[op->next_file];
    struct spot__store_slot *s;
    int r;

    while (f->etags != NULL && f->next_part < f->nparts &&
           f->etags[f->next_part].number != 0)
      f->next_part++; /* stored before a resume */
    if (f->next_part >= f->nparts) {
      op->next_file++;
      continue;
    }
    r = spot__store_pipe_take(&op->pipe, &s);
    if (r < 0)
      fail_msg(op, r, "out of memory");
    if (r != 0)
      break;
    s->file = op->next_file;
    s->part = f->next_part;
    s->seq = op->pipe.seq++;
    s->raw_len = f->size - (uint64_t)s->part * op->b.cfg.c.part_size;
    if (s->raw_len > op->b.cfg.c.part_size)
      s->raw_len = op->b.cfg.c.part_size;
    if (f->pk != NULL)
      s->raw_len = spot__pack_part_raw(op, f, s->part);
    if (f->df != NULL)
      s->raw_len = spot__dedup_part_raw(op, f, s->part);
    s->mode = (int)choose_mode(op, f);
    r = spot__store_pipe_work(&op->pipe, s, encode_work_cb, encode_after_cb,
                              SLOT_ENCODING);
    if (r != 0)
      break; /* no encoder free, or failed */
    f->next_part++;
    if (f->nparts > 1 && f->state == FILE_WAIT) {
      r = file_op(op, op->next_file, false);
      if (r < 0) {
        fail_msg(op, r, "uploading %s: %s", f->rel, strerror(-r));
        break;
      }
    }
  }
}

/* 3. complete multipart uploads whose parts are all stored */
static void
start_completes(struct push_op *op)
{
  for (size_t i = 0; op->b.err == 0 && i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    int r;

    if (f->nparts > 1 && f->state == FILE_OPEN && f->parts_done == f->nparts &&
        !f->growing) {
      r = file_op(op, i, true);
      if (r < 0)
        fail_msg(op, r, "completing %s: %s", f->rel, strerror(-r));
    }
  }
}

void
spot__push_pump(struct push_op *op)
{
  if (op->state == PUSH_XFER && op->b.err == 0) {
    start_sends(op);
    start_encodes(op);
    if (spot__store_pace(&op->b, op->active_xfers)) {
      start_sends(op);
      start_encodes(op);
    }
    start_completes(op);
  }
  if (!spot__store_busy(&op->b))
    spot__push_advance(op);
}

void
spot__push_xfer_start(struct push_op *op)
{
  spot__push_set_state(op, PUSH_XFER);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_TRANSFER);
  spot__resume_save(op, true);
  spot__push_pump(op);
}

void
spot__push_xfer_cancel(struct push_op *op)
{
  spot__store_pipe_cancel(&op->pipe, SLOT_ENCODING, SLOT_SENDING);
  /* While a walk runs on the pool (the first one, or the follow's final
   * one), op->files is that worker's: it grows, moves and sorts the list,
   * and none of its files has a transfer yet. The walk's end moves the
   * push on to stop(). */
  if (op->state == PUSH_WALK || spot__follow_walking(op))
    return;
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].s3op != NULL)
      spot_s3_cancel(op->files[i].s3op);
}

/* Keys and manifest entries of the files. */
int
spot__push_add_to_manifest(struct push_op *op, struct pfile *f)
{
  char key_rel[4300], path[4200];
  int r;

  if (f->pk != NULL)
    return 0; /* a pack: in the manifest's packs (store_pack.c) */
  if (f->pack != 0)
    return spot__pack_add_member(op, f);
  if (op->b.cfg.c.nranks > 1)
    snprintf(path, sizeof(path), "rank-%u/%s", op->b.cfg.c.rank, f->rel);
  else
    snprintf(path, sizeof(path), "%s", f->rel);
  if (f->link != NULL) {
    r = spot_manifest_add_link(op->manifest, path, f->link, f->mtime_ns,
                               &f->midx);
    if (r < 0)
      fail_msg(op, r, "%s: the link cannot be recorded in the manifest",
               f->rel);
    else
      spot__push_file_set_state(op, f, FILE_DONE);
    return r;
  }
  if (f->size > 0) {
    /* Under this attempt's folder (rank-K/ first for a rank's files). */
    if (op->attempt[0] != '\0' && op->b.cfg.c.nranks > 1)
      snprintf(key_rel, sizeof(key_rel), "rank-%u/%s/%s.zst", op->b.cfg.c.rank,
               op->attempt, f->rel);
    else if (op->attempt[0] != '\0')
      snprintf(key_rel, sizeof(key_rel), "%s/%s.zst", op->attempt, path);
    else
      snprintf(key_rel, sizeof(key_rel), "%s.zst", path);
    f->key = spot__store_key(&op->b.cfg.c, op->b.name, key_rel);
    if (f->key == NULL)
      return -ENOMEM;
  }
  r = spot_manifest_add_file(op->manifest, path, f->size > 0 ? key_rel : NULL,
                             f->size, f->mode, f->mtime_ns, f->filter,
                             &f->midx);
  if (r == 0 && f->df != NULL)
    r = spot__dedup_add_refs(op, f);
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
    spot__push_file_set_state(op, f, FILE_DONE);
  return 0;
}

int64_t
spot_store_marker_step(const char *dir, char *err, size_t errlen)
{
  char path[4200], buf[SPOT_MARKER_MAX + 1];
  size_t len = 0;
  int64_t step = -1;
  ssize_t n;
  int fd;

  if (snprintf(path, sizeof(path), "%s/%s", dir, SPOT_STORE_MARKER) >=
      (int)sizeof(path))
    return -1;
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return -1;
  while (len < sizeof(buf)) {
    n = read(fd, buf + len, sizeof(buf) - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += (size_t)n;
  }
  close(fd);
  if (spot_marker_parse(buf, len, &step, err, errlen) < 0)
    return -EINVAL;
  return step;
}

int64_t
spot__push_step(const struct push_op *op)
{
  const struct spot_store_config *c = &op->b.cfg.c;
  int64_t step;

  if (c->step > 0 && c->step <= SPOT_CKPT_STEP_MAX)
    return c->step;
  step = op->dir != NULL ? spot_store_marker_step(op->dir, NULL, 0) : -1;
  return step >= 0 ? step : spot_ckpt_name_step(op->b.name);
}

int
spot__push_manifest_build(struct push_op *op)
{
  int r = spot_manifest_new(op->b.name, op->b.cfg.job, spot_now_wall_ms(),
                            &op->manifest);

  if (r < 0) {
    fail_msg(op, r, "checkpoint name '%s' or job '%s' is not valid", op->b.name,
             op->b.cfg.job);
    return r;
  }
  op->manifest->epoch = op->b.cfg.c.lease_epoch;
  op->manifest->step = spot__push_step(op);
  if ((r = spot__pack_plan(op)) < 0) {
    fail_msg(op, r, "packing small files: %s", strerror(-r));
    return r;
  }
  for (size_t i = 0; i < op->nfiles; i++)
    if ((r = spot__push_add_to_manifest(op, &op->files[i])) < 0)
      return r;
  return 0;
}

int
spot__push_xfer_setup(struct push_op *op)
{
  int r = op->b.cfg.c.dedup ? spot__dedup_plan(op) : 0;

  if (r < 0) {
    fail_msg(op, r, "planning the frames: %s", strerror(-r));
    return r;
  }
  r = spot__push_manifest_build(op);

  if (r < 0)
    return r;
  return spot__store_pipe_init(&op->pipe, &op->b, (size_t)op->b.cfg.c.part_size,
                               &slot_fsm);
}
