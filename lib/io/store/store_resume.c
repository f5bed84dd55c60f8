/* Push, resuming: the journal of multipart uploads in progress
 * (store_journal.c holds the file format), and what a push does before
 * its transfer:
 *
 *   JOURNAL        one journaled upload at a time: ListParts when its file
 *                  is unchanged (parts with the journaled ETag and size are
 *                  taken as stored), abort it when the file changed
 *   ORPHANS_LIST   list the uploads of this checkpoint name
 *   ORPHANS_ABORT  abort those no journal claims: an earlier push of the
 *                  same name died (a name commits once, so no live push
 *                  owns them)
 *   DONE           hand over to the transfer */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

static const char *const resume_state_names[] = {
    "journal",
    "orphans-list",
    "orphans-abort",
    "done",
};
_Static_assert(SPOT_ARRAY_SIZE(resume_state_names) == RESUME_STATE_LAST,
               "resume_state_names");

static void step(struct push_op *op);

static const struct spot_fsm resume_fsm = {
    "push resume", resume_state_names, RESUME_STATE_LAST, NULL, 0,
    SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct push_op *op, enum resume_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&resume_fsm, op->resume.state, s, file, line,
                           "name=%s", op->b.name) > 0)
    op->resume.state = s;
}

int
spot__resume_init(struct push_op *op)
{
  struct spot__journal *j = NULL;

  if (op->b.cfg.journal_dir == NULL)
    return 0;
  op->resume.journal_path =
      spot__journal_path(op->b.cfg.journal_dir, op->b.cfg.job, op->b.name);
  if (op->resume.journal_path == NULL)
    return -ENOMEM;
  /* A journaled push resumes its uploads under its attempt's keys (or
   * the old layout's, for a journal written before attempts). */
  if (spot__journal_load(op->resume.journal_path, &j) == 0) {
    if (j->attempt != NULL)
      spot_strlcpy(op->attempt, j->attempt, sizeof(op->attempt));
    else
      op->attempt[0] = '\0';
    op->resume.attempt_from_journal = j->attempt != NULL;
    spot__journal_free(j);
  }
  return 0;
}

void
spot__resume_fini(struct push_op *op)
{
  struct resume *rs = &op->resume;

  free(rs->journal_path);
  spot__journal_free(rs->journal);
  for (size_t i = 0; i < rs->norphans; i++) {
    free(rs->orphan_keys[i]);
    free(rs->orphan_ids[i]);
  }
  free(rs->orphan_keys);
  free(rs->orphan_ids);
}

void
spot__resume_remove(struct push_op *op)
{
  if (op->resume.journal_path != NULL)
    unlink(op->resume.journal_path);
}

/* One journal entry per open multipart upload, with its stored parts. */
static int
journal_file(const struct push_op *op, const struct pfile *f,
             struct spot__journal_file *jf)
{
  const struct spot_manifest_file *mf = &op->manifest->files[f->midx];

  jf->path = f->rel;
  jf->size = f->size;
  jf->mtime_ns = f->mtime_ns;
  jf->ino = (uint64_t)f->ino;
  jf->upload_id = f->upload_id;
  jf->parts = calloc(f->nparts + 1, sizeof(*jf->parts));
  if (jf->parts == NULL)
    return -ENOMEM;
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
  return 0;
}

/* Writes what is stored so far: the upload id of each multipart file and
 * its parts with their ETags, sizes and CRCs. Throttled, except when an
 * upload id is new (losing one would orphan its upload). */
void
spot__resume_save(struct push_op *op, bool force)
{
  struct spot__journal j;
  uint64_t now = spot_now_mono_ms();
  size_t n = 0;
  int r;

  if (op->resume.journal_path == NULL || op->manifest == NULL)
    return;
  if (!force && now < op->resume.journal_saved_ms + 250)
    return;
  op->resume.journal_saved_ms = now;
  memset(&j, 0, sizeof(j));
  j.job = op->b.cfg.job;
  j.name = op->b.name;
  j.attempt = op->attempt;
  j.part_size = op->b.cfg.c.part_size;
  j.files = calloc(op->nfiles + 1, sizeof(*j.files));
  if (j.files == NULL)
    return;
  for (size_t i = 0; i < op->nfiles; i++) {
    const struct pfile *f = &op->files[i];

    /* packs are not journaled: a resumed push uploads them again */
    if (f->nparts < 2 || f->pk != NULL ||
        (f->state != FILE_OPEN && f->state != FILE_COMPLETING))
      continue;
    if (journal_file(op, f, &j.files[n++]) < 0)
      break;
  }
  j.nfiles = n;
  r = spot__journal_save(op->resume.journal_path, &j);
  if (r < 0)
    log_debug("push name=%s: journal: %s", op->b.name, strerror(-r));
  for (size_t i = 0; i < n; i++)
    free(j.files[i].parts);
  free(j.files);
}

static struct pfile *
find_file(struct push_op *op, const char *rel)
{
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].pk == NULL && strcmp(op->files[i].rel, rel) == 0)
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

static bool
is_ours(const struct push_op *op, const char *upload_id)
{
  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].upload_id != NULL &&
        strcmp(op->files[i].upload_id, upload_id) == 0)
      return true;
  return false;
}

/* An upload under this attempt's folder (a push of ours that lost it), or
 * older than the stale bound: never another live attempt's (a
 * concurrent push of the same name must not be disturbed). */
static bool
orphan_of_ours_or_stale(const struct push_op *op,
                        const struct spot_s3_upload_info *u)
{
  uint64_t bound = op->b.cfg.c.stale_upload_age_ms;
  int64_t init;
  const char *a;

  if (op->attempt[0] != '\0' && (a = strstr(u->key, op->attempt)) != NULL &&
      a[strlen(op->attempt)] == '/')
    return true;
  if (op->attempt[0] == '\0')
    return true; /* an older journal's layout: as before */
  return spot_rfc3339_parse(u->initiated, &init) == 0 &&
         spot_now_wall_ms() - init >= (int64_t)bound;
}

/* Keeps the listed uploads no file of ours owns. */
static void
got_orphans(struct push_op *op, const struct spot_s3_result *res)
{
  struct resume *rs = &op->resume;

  if (res->err < 0 || res->n_uploads == 0)
    return;
  rs->orphan_keys = calloc(res->n_uploads, sizeof(char *));
  rs->orphan_ids = calloc(res->n_uploads, sizeof(char *));
  for (size_t i = 0;
       rs->orphan_keys != NULL && rs->orphan_ids != NULL && i < res->n_uploads;
       i++) {
    if (is_ours(op, res->uploads[i].upload_id) ||
        !orphan_of_ours_or_stale(op, &res->uploads[i]))
      continue;
    rs->orphan_keys[rs->norphans] = strdup(res->uploads[i].key);
    rs->orphan_ids[rs->norphans] = strdup(res->uploads[i].upload_id);
    rs->norphans++;
    if (rs->orphan_keys[rs->norphans - 1] == NULL ||
        rs->orphan_ids[rs->norphans - 1] == NULL)
      break;
  }
}

static void
orphans_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (spot__store_cancelled(&op->b)) {
    spot__push_advance(op);
    return;
  }
  if (op->resume.state == RESUME_ORPHANS_LIST) {
    got_orphans(op, res);
    set_state(op, RESUME_ORPHANS_ABORT);
  } else {
    if (res->err == 0 || res->err == -ENOENT)
      op->aborted++;
    op->resume.orphan_idx++;
  }
  step(op);
}

/* ListParts of a journaled upload: parts the server lists with the ETag
 * and size the journal recorded are taken as stored. */
static size_t
take_parts(struct push_op *op, struct pfile *f,
           const struct spot__journal_file *jf,
           const struct spot_s3_result *res)
{
  size_t found = 0;

  if (f->df != NULL)
    return 0; /* parts of frames (store_dedup.c): the journal has no
                 frame lengths, every part is sent again */
  for (size_t i = 0; i < jf->nparts; i++) {
    const struct spot__journal_part *jp = &jf->parts[i];
    size_t p = (size_t)jp->n - 1;
    uint64_t want_raw;

    if (jp->n < 1 || p >= f->nparts || f->etags[p].number != 0)
      continue;
    want_raw = f->size - (uint64_t)p * op->b.cfg.c.part_size;
    if (want_raw > op->b.cfg.c.part_size)
      want_raw = op->b.cfg.c.part_size;
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
      op->b.raw_done += jp->raw_len;
      op->b.stored_done += jp->comp_len;
      found++;
      break;
    }
  }
  return found;
}

static void
list_parts_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  struct resume *rs = &op->resume;
  const struct spot__journal_file *jf = &rs->journal->files[rs->idx];
  struct pfile *f = find_file(op, jf->path);
  size_t found;

  spot__store_s3_done(&op->b, &op->s3op, res);
  rs->idx++;
  if (spot__store_cancelled(&op->b)) {
    spot__push_advance(op);
    return;
  }
  if (res->err < 0 || f == NULL || f->state != FILE_WAIT) {
    /* Gone (aborted, completed) or unreadable: upload the file afresh. */
    log_info("push name=%s: journaled upload of %s not resumable, starting "
             "it over",
             op->b.name, jf->path);
    step(op);
    return;
  }
  found = take_parts(op, f, jf, res);
  f->upload_id = strdup(jf->upload_id);
  if (f->upload_id != NULL)
    spot__push_file_set_state(op, f, FILE_OPEN);
  rs->resumed_parts += (unsigned)found;
  log_info("push name=%s: resuming the upload of %s: %zu of %zu parts "
           "already stored",
           op->b.name, f->rel, found, f->nparts);
  step(op);
}

static void
journal_abort_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (res->err == 0 || res->err == -ENOENT)
    op->aborted++;
  op->resume.idx++;
  if (spot__store_cancelled(&op->b))
    spot__push_advance(op);
  else
    step(op);
}

/* JOURNAL: the next journaled upload; 1 when there is none left. */
static int
journal_step(struct push_op *op)
{
  struct resume *rs = &op->resume;
  const struct spot__store_cfg *cfg = &op->b.cfg;

  while (rs->journal != NULL && rs->idx < rs->journal->nfiles) {
    const struct spot__journal_file *jf = &rs->journal->files[rs->idx];
    struct pfile *f = find_file(op, jf->path);
    char rel[4200], *key;
    int r;

    if (f != NULL && f->nparts > 1 && f->size == jf->size &&
        f->mtime_ns == jf->mtime_ns && (uint64_t)f->ino == jf->ino) {
      if (spot_s3_mpu_list_parts(cfg->c.s3, cfg->bucket, f->key, jf->upload_id,
                                 list_parts_cb, op, &op->s3op) == 0)
        return 0;
      rs->idx++;
      continue;
    }
    log_info("push name=%s: %s changed since the journal: aborting its "
             "old upload",
             op->b.name, jf->path);
    snprintf(rel, sizeof(rel), "%s%s%s.zst",
             rs->journal->attempt ? rs->journal->attempt : "",
             rs->journal->attempt ? "/" : "", jf->path);
    key = spot__store_key(&cfg->c, op->b.name, rel);
    r = key == NULL
            ? -ENOMEM
            : spot_s3_mpu_abort(cfg->c.s3, cfg->bucket, key, jf->upload_id,
                                journal_abort_cb, op, &op->s3op);
    free(key);
    if (r == 0)
      return 0;
    rs->idx++;
  }
  return 1;
}

/* ORPHANS_LIST: list uploads of this name (this rank's, with ranks). */
static int
orphans_list(struct push_op *op)
{
  char rel[64] = "", *key;
  int r = -ENOMEM;

  /* Another rank's live uploads of this name are not orphans; another
   * attempt's are only once older than the stale bound (got_orphans). */
  if (op->b.cfg.c.nranks > 1)
    snprintf(rel, sizeof(rel), "rank-%u/", op->b.cfg.c.rank);
  key = spot__store_key(&op->b.cfg.c, op->b.name, rel);
  if (key != NULL)
    r = spot_s3_list_uploads(op->b.cfg.c.s3, op->b.cfg.bucket, key, orphans_cb,
                             op, &op->s3op);
  free(key);
  return r;
}

/* ORPHANS_ABORT: the next orphan; 1 when there is none left. */
static int
orphans_abort(struct push_op *op)
{
  struct resume *rs = &op->resume;

  while (rs->orphan_idx < rs->norphans &&
         (rs->orphan_keys[rs->orphan_idx] == NULL ||
          rs->orphan_ids[rs->orphan_idx] == NULL))
    rs->orphan_idx++;
  if (rs->orphan_idx >= rs->norphans)
    return 1;
  log_info("push name=%s: aborting an upload of %s left by an earlier push",
           op->b.name, rs->orphan_keys[rs->orphan_idx]);
  return spot_s3_mpu_abort(
      op->b.cfg.c.s3, op->b.cfg.bucket, rs->orphan_keys[rs->orphan_idx],
      rs->orphan_ids[rs->orphan_idx], orphans_cb, op, &op->s3op);
}

/* Issues the next request of the current state, or hands over to the
 * transfer. A request that cannot start skips what it was for: resuming
 * is an optimisation, never a reason to fail. */
static void
step(struct push_op *op)
{
  int r = 1;

  if (op->resume.state == RESUME_JOURNAL) {
    r = journal_step(op);
    if (r == 1) {
      spot__journal_free(op->resume.journal);
      op->resume.journal = NULL;
      set_state(op, RESUME_ORPHANS_LIST);
    }
  }
  if (op->resume.state == RESUME_ORPHANS_LIST)
    r = orphans_list(op);
  else if (op->resume.state == RESUME_ORPHANS_ABORT)
    r = orphans_abort(op);
  if (r == 0) {
    op->b.active_s3++;
    return;
  }
  set_state(op, RESUME_DONE);
  spot__push_xfer_start(op);
}

/* A journal of another job, name or part size cannot be reused: abort
 * its uploads. */
static void
load_journal(struct push_op *op)
{
  struct spot__journal *j = NULL;
  int r = spot__journal_load(op->resume.journal_path, &j);

  if (r == -ENOENT)
    return;
  if (r < 0) {
    log_warn("push name=%s: unreadable journal %s: starting over", op->b.name,
             op->resume.journal_path);
    return;
  }
  if (strcmp(j->job, op->b.cfg.job) != 0 || strcmp(j->name, op->b.name) != 0 ||
      j->part_size != op->b.cfg.c.part_size)
    for (size_t i = 0; i < j->nfiles; i++)
      j->files[i].ino = UINT64_MAX;
  log_info("push name=%s: found a journal of %zu upload(s) in progress",
           op->b.name, j->nfiles);
  op->resume.journal = j;
}

void
spot__resume_start(struct push_op *op)
{
  spot__push_set_state(op, PUSH_RESUME);
  if (op->resume.journal_path != NULL)
    load_journal(op);
  op->resume.idx = 0;
  step(op);
}
