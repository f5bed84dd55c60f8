/* The push journal: what a push in progress has stored, so a push killed
 * mid-way (spotd SIGKILLed, the machine rebooted) resumes its multipart
 * uploads instead of starting over. One JSON file per checkpoint, written
 * to a temporary name and renamed, so a reader sees the old or the new
 * journal, never a torn one:
 *
 *   { "version": 1, "job": "J", "name": "N", "part_size": 8388608,
 *     "files": [ { "path": "model.pt", "size": 123, "mtime_ns": 1,
 *                  "ino": 42, "upload_id": "2~abc",
 *                  "parts": [ { "n": 1, "raw_len": 8388608,
 *                               "comp_len": 7000000, "crc32c": 1,
 *                               "etag": "\"9b2c\"" } ] } ] }
 *
 * The journal is a hint, never trusted alone: a resumed part must also be
 * listed by the server (ListParts) with the same ETag and size, and the
 * file must still have the size, mtime and inode it had. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/util.h"
#include "io/store/store_journal.h"

#define JOURNAL_VERSION 1
#define JOURNAL_MAX ((size_t)64 << 20)

char *
spot__journal_path(const char *dir, const char *job, const char *name)
{
  char *p = NULL;

  if (dir == NULL || asprintf(&p, "%s/%s--%s.json", dir, job, name) < 0)
    return NULL;
  return p;
}

void
spot__store_attempt_new(char out[SPOT__STORE_ATTEMPT_LEN + 1])
{
  uint64_t v = ((uint64_t)spot_random_u32() << 32) | spot_random_u32();

  snprintf(out, SPOT__STORE_ATTEMPT_LEN + 1, "attempt-%016" PRIx64, v);
}

bool
spot__store_attempt_valid(const char *a)
{
  if (strlen(a) != SPOT__STORE_ATTEMPT_LEN || strncmp(a, "attempt-", 8) != 0)
    return false;
  for (size_t i = 8; i < SPOT__STORE_ATTEMPT_LEN; i++)
    if (!((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f')))
      return false;
  return true;
}

void
spot__journal_free(struct spot__journal *j)
{
  if (j == NULL)
    return;
  for (size_t i = 0; i < j->nfiles; i++) {
    free(j->files[i].path);
    free(j->files[i].upload_id);
    free(j->files[i].parts);
  }
  free(j->files);
  free(j->job);
  free(j->name);
  free(j->attempt);
  free(j);
}

static json_t *
file_json(const struct spot__journal_file *f)
{
  json_t *parts = json_array();
  json_t *o;

  if (parts == NULL)
    return NULL;
  for (size_t i = 0; i < f->nparts; i++) {
    const struct spot__journal_part *p = &f->parts[i];
    json_t *jp =
        json_pack("{s:i, s:I, s:I, s:I, s:s}", "n", p->n, "raw_len",
                  (json_int_t)p->raw_len, "comp_len", (json_int_t)p->comp_len,
                  "crc32c", (json_int_t)p->crc32c, "etag", p->etag);
    if (jp == NULL || json_array_append_new(parts, jp) < 0) {
      json_decref(parts);
      return NULL;
    }
  }
  o = json_pack("{s:s, s:I, s:I, s:I, s:s, s:o}", "path", f->path, "size",
                (json_int_t)f->size, "mtime_ns", (json_int_t)f->mtime_ns, "ino",
                (json_int_t)f->ino, "upload_id", f->upload_id, "parts", parts);
  return o;
}

int
spot__journal_save(const char *path, const struct spot__journal *j)
{
  json_t *root, *files;
  char *text = NULL, *tmp = NULL;
  size_t len, off = 0;
  int fd, r = 0;

  files = json_array();
  if (files == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < j->nfiles; i++) {
    json_t *f = file_json(&j->files[i]);
    if (f == NULL || json_array_append_new(files, f) < 0) {
      json_decref(files);
      return -ENOMEM;
    }
  }
  root = json_pack("{s:i, s:s, s:s, s:I, s:o}", "version", JOURNAL_VERSION,
                   "job", j->job, "name", j->name, "part_size",
                   (json_int_t)j->part_size, "files", files);
  if (root == NULL)
    return -ENOMEM;
  if (j->attempt != NULL && j->attempt[0] != '\0' &&
      json_object_set_new(root, "attempt", json_string(j->attempt)) < 0) {
    json_decref(root);
    root = NULL;
  }
  text = root != NULL ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (text == NULL || asprintf(&tmp, "%s.tmp", path) < 0) {
    free(text);
    return -ENOMEM;
  }
  len = strlen(text);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    r = -errno;
    goto out;
  }
  while (off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      r = -errno;
      break;
    }
    off += (size_t)w;
  }
  if (close(fd) < 0 && r == 0)
    r = -errno;
  /* No fsync: the journal only has to survive the process, not the
   * machine (a machine that goes away takes its local disk with it). */
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0)
    unlink(tmp);
out:
  free(tmp);
  free(text);
  return r;
}

static int
get_u64(json_t *o, const char *k, uint64_t *out)
{
  json_t *v = json_object_get(o, k);

  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -EBADMSG;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

static int
load_file(json_t *jf, struct spot__journal_file *f)
{
  json_t *parts = json_object_get(jf, "parts");
  const char *path = json_string_value(json_object_get(jf, "path"));
  const char *id = json_string_value(json_object_get(jf, "upload_id"));
  uint64_t mt;
  size_t i;
  json_t *jp;

  if (path == NULL || id == NULL || !json_is_array(parts) ||
      get_u64(jf, "size", &f->size) < 0 || get_u64(jf, "mtime_ns", &mt) < 0 ||
      get_u64(jf, "ino", &f->ino) < 0 || json_array_size(parts) > 10000)
    return -EBADMSG;
  f->mtime_ns = (int64_t)mt;
  f->path = strdup(path);
  f->upload_id = strdup(id);
  f->parts = calloc(json_array_size(parts) + 1, sizeof(*f->parts));
  if (f->path == NULL || f->upload_id == NULL || f->parts == NULL)
    return -ENOMEM;
  json_array_foreach(parts, i, jp)
  {
    struct spot__journal_part *p = &f->parts[f->nparts];
    const char *etag = json_string_value(json_object_get(jp, "etag"));
    uint64_t n, crc;

    if (etag == NULL || get_u64(jp, "n", &n) < 0 || n < 1 || n > 10000 ||
        get_u64(jp, "raw_len", &p->raw_len) < 0 ||
        get_u64(jp, "comp_len", &p->comp_len) < 0 ||
        get_u64(jp, "crc32c", &crc) < 0 || crc > UINT32_MAX ||
        spot_strlcpy(p->etag, etag, sizeof(p->etag)) >= sizeof(p->etag))
      return -EBADMSG;
    p->n = (int)n;
    p->crc32c = (uint32_t)crc;
    f->nparts++;
  }
  return 0;
}

int
spot__journal_load(const char *path, struct spot__journal **out)
{
  struct spot__journal *j;
  json_error_t jerr;
  json_t *root, *files, *jf;
  const char *job, *name;
  size_t i;
  int r = 0;

  root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return access(path, F_OK) == 0 ? -EBADMSG : -ENOENT;
  files = json_object_get(root, "files");
  job = json_string_value(json_object_get(root, "job"));
  name = json_string_value(json_object_get(root, "name"));
  if (json_integer_value(json_object_get(root, "version")) != JOURNAL_VERSION ||
      job == NULL || name == NULL || !json_is_array(files) ||
      json_array_size(files) > 1000000) {
    json_decref(root);
    return -EBADMSG;
  }
  j = calloc(1, sizeof(*j));
  if (j == NULL) {
    json_decref(root);
    return -ENOMEM;
  }
  j->job = strdup(job);
  j->name = strdup(name);
  {
    const char *a = json_string_value(json_object_get(root, "attempt"));
    if (a != NULL && spot__store_attempt_valid(a))
      j->attempt = strdup(a);
  }
  j->files = calloc(json_array_size(files) + 1, sizeof(*j->files));
  if (j->job == NULL || j->name == NULL || j->files == NULL ||
      get_u64(root, "part_size", &j->part_size) < 0)
    r = -EBADMSG;
  json_array_foreach(files, i, jf)
  {
    if (r < 0)
      break;
    r = load_file(jf, &j->files[j->nfiles]);
    j->nfiles++;
  }
  json_decref(root);
  if (r < 0) {
    spot__journal_free(j);
    return r;
  }
  *out = j;
  return 0;
}
