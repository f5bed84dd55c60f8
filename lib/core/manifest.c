/* The checkpoint manifest: builder, jansson serializer, strict parser.
 * Everything the restore relies on is checked in one place, validate(),
 * which both the builder (before writing) and the parser (after reading)
 * run, so a manifest we write is always one we accept. */
#include "core/manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/buf.h"
#include "core/util.h"

/* 1970-01-01T00:00:00Z .. 9999-12-31T23:59:59Z: what RFC 3339 can say
 * with a four-digit year */
#define CREATED_MAX_MS INT64_C(253402300799999)
/* where-strings like "files[999999].frames[9999]" */
#define WHERE_MAX 64

#define set_err spot_set_err

/* fail(err, errlen, r, fmt, ...) writes the message and evaluates to r.
 * A macro so that r shows at the call: the static analyzer does not step
 * into variadic functions, and would otherwise walk every failure as a
 * possible success (and warn about the outputs it did not set). */
#define fail(err, errlen, r, ...) (set_err((err), (errlen), __VA_ARGS__), (r))

/* Untrusted text quoted in an error message: at most 32 bytes, anything
 * but printable ASCII shown as '?', so a manifest can't put escape
 * sequences on the user's terminal. */
static const char *
quote(const char *s, char *buf, size_t size)
{
  size_t i;

  for (i = 0; s[i] && i + 1 < size && i < 32; i++)
    buf[i] = (s[i] > 0x20 && s[i] < 0x7f) ? s[i] : '?';
  buf[i] = '\0';
  return buf;
}

static bool
utf8_valid(const unsigned char *s, size_t n)
{
  size_t i = 0;

  while (i < n) {
    unsigned c = s[i], need;
    uint32_t cp, min;

    if (c < 0x80) {
      i++;
      continue;
    }
    if ((c & 0xE0) == 0xC0)
      need = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      need = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      need = 3, cp = c & 0x07, min = 0x10000;
    else
      return false;
    if (n - i <= need)
      return false;
    for (unsigned k = 1; k <= need; k++) {
      if ((s[i + k] & 0xC0) != 0x80)
        return false;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += need + 1;
  }
  return true;
}

/* NULL if p[0..len) is a valid relative path, else why not. */
static const char *
path_problem(const char *p, size_t len)
{
  size_t start = 0;

  if (len == 0)
    return "empty";
  if (len > SPOT_MANIFEST_PATH_MAX)
    return "longer than 4095 bytes (PATH_MAX)";
  if (memchr(p, '\0', len))
    return "contains a NUL byte";
  if (p[0] == '/')
    return "absolute (leading '/')";
  if (!utf8_valid((const unsigned char *)p, len))
    return "not valid UTF-8";
  for (size_t i = 0; i <= len; i++) {
    size_t clen;

    if (i < len && p[i] != '/')
      continue;
    clen = i - start;
    if (clen == 0)
      return "empty component ('//' or trailing '/')";
    if (clen == 1 && p[start] == '.')
      return "'.' component";
    if (clen == 2 && p[start] == '.' && p[start + 1] == '.')
      return "'..' component";
    if (clen > SPOT_MANIFEST_COMPONENT_MAX)
      return "component longer than 255 bytes";
    start = i + 1;
  }
  return NULL;
}

bool
spot_manifest_path_valid(const char *path)
{
  return path && path_problem(path, strlen(path)) == NULL;
}

bool
spot_ckpt_name_valid(const char *name)
{
  size_t n;

  if (!name)
    return false;
  n = strnlen(name, SPOT_CKPT_NAME_MAX + 1);
  if (n == 0 || n > SPOT_CKPT_NAME_MAX)
    return false;
  if (name[0] == '.' || strstr(name, ".."))
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];

    /* printable ASCII without space; '/' and '\\' would make folders */
    if (c <= 0x20 || c >= 0x7f || c == '/' || c == '\\')
      return false;
  }
  return true;
}

static int64_t
step_digits(const char *p)
{
  int64_t v = 0;

  if (*p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > ((int64_t)1 << 53) / 10)
      return -1;
    v = v * 10 + (*p - '0');
  }
  if (v > ((int64_t)1 << 53))
    return -1;
  return v;
}

int64_t
spot_ckpt_name_step(const char *name)
{
  const char *last = NULL;

  if (!spot_ckpt_name_valid(name))
    return -1;
  for (const char *p = name; *p != '\0'; p++)
    if (strncasecmp(p, "step", 4) == 0)
      last = p;
  if (last != NULL) {
    const char *d = last + 4;
    int64_t v;

    if (*d == '-' || *d == '_' || *d == '=' || *d == '.')
      d++;
    v = step_digits(d);
    /* the number must end the name or be followed by a separator */
    while (*d >= '0' && *d <= '9')
      d++;
    if (v >= 0 && (*d == '\0' || *d == '-' || *d == '_' || *d == '.'))
      return v;
    return -1;
  }
  return strspn(name, "0123456789") == strlen(name) ? step_digits(name) : -1;
}

/* The value of a marker line: decimal digits only, within the step
 * bound; -1 otherwise. */
static int64_t
marker_step_value(const char *v, size_t n)
{
  int64_t x = 0;

  if (n == 0 || n > 16)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9')
      return -1;
    x = x * 10 + (v[i] - '0');
  }
  return x <= SPOT_CKPT_STEP_MAX ? x : -1;
}

int
spot_marker_parse(const char *buf, size_t len, int64_t *step, char *err,
                  size_t errlen)
{
  int64_t found = -1;
  size_t line = 0;

  if (buf == NULL && len > 0)
    return fail(err, errlen, -EINVAL, "marker: no text");
  if (len > SPOT_MARKER_MAX)
    return fail(err, errlen, -EINVAL, "marker: larger than %d bytes",
                SPOT_MARKER_MAX);
  if (len > 0 && memchr(buf, '\0', len) != NULL)
    return fail(err, errlen, -EINVAL, "marker: holds a NUL byte");
  for (size_t pos = 0; pos < len;) {
    const char *l = buf + pos, *nl = memchr(l, '\n', len - pos), *eq;
    size_t n = nl != NULL ? (size_t)(nl - l) : len - pos, k;

    pos += n + (nl != NULL ? 1 : 0);
    line++;
    if (n > 0 && l[n - 1] == '\r')
      n--;
    while (n > 0 && (l[0] == ' ' || l[0] == '\t')) {
      l++;
      n--;
    }
    while (n > 0 && (l[n - 1] == ' ' || l[n - 1] == '\t'))
      n--;
    if (n == 0 || l[0] == '#')
      continue;
    eq = memchr(l, '=', n);
    if (eq == NULL)
      return fail(err, errlen, -EINVAL, "marker line %zu: no '='", line);
    k = (size_t)(eq - l);
    while (k > 0 && (l[k - 1] == ' ' || l[k - 1] == '\t'))
      k--;
    if (k != strlen(SPOT_MARKER_STEP_KEY) ||
        memcmp(l, SPOT_MARKER_STEP_KEY, k) != 0)
      continue; /* another key: for someone else */
    {
      const char *v = eq + 1;
      size_t vn = n - (size_t)(v - l);
      int64_t x;

      while (vn > 0 && (v[0] == ' ' || v[0] == '\t')) {
        v++;
        vn--;
      }
      x = marker_step_value(v, vn);
      if (x < 0)
        return fail(err, errlen, -EINVAL,
                    "marker line %zu: step is not a number in 0..2^53", line);
      if (found >= 0)
        return fail(err, errlen, -EINVAL, "marker line %zu: a second step",
                    line);
      found = x;
    }
  }
  *step = found;
  return 0;
}

bool
spot_manifest_link_valid(const char *path, const char *target)
{
  size_t len, depth = 0, up = 0;
  const char *p, *c;
  bool names = false;

  if (!path || !target || !spot_manifest_path_valid(path))
    return false;
  len = strnlen(target, SPOT_MANIFEST_PATH_MAX + 1);
  if (len == 0 || len > SPOT_MANIFEST_PATH_MAX || target[0] == '/')
    return false;
  for (p = strchr(path, '/'); p; p = strchr(p + 1, '/'))
    depth++; /* the folders the link is in */
  for (c = target; *c;) {
    const char *e = strchr(c, '/');
    size_t n = e ? (size_t)(e - c) : strlen(c);

    if (n == 0 || n > SPOT_MANIFEST_COMPONENT_MAX || (n == 1 && c[0] == '.'))
      return false;
    if (n == 2 && c[0] == '.' && c[1] == '.') {
      if (names || ++up > depth)
        return false; /* ".." after a name, or above the folder */
    } else {
      names = true;
    }
    if (!e)
      break;
    c = e + 1;
    if (!*c)
      return false; /* trailing '/' */
  }
  return true;
}

static void
file_fini(struct spot_manifest_file *f)
{
  free(f->path);
  free(f->key);
  free(f->link);
  free(f->frames);
}

void
spot_manifest_free(struct spot_manifest *m)
{
  if (!m)
    return;
  for (size_t i = 0; i < m->nfiles; i++)
    file_fini(&m->files[i]);
  free(m->files);
  for (size_t i = 0; i < m->npacks; i++)
    free(m->packs[i].key);
  free(m->packs);
  for (size_t i = 0; i < m->nrefs; i++) {
    free(m->refs[i].name);
    free(m->refs[i].key);
  }
  free(m->refs);
  free(m->name);
  free(m->job);
  free(m);
}

int
spot_manifest_new(const char *name, const char *job, int64_t created_ms,
                  struct spot_manifest **out)
{
  struct spot_manifest *m;

  if (!spot_ckpt_name_valid(name) || !spot_ckpt_name_valid(job) ||
      created_ms < 0 || created_ms > CREATED_MAX_MS)
    return -EINVAL;
  m = calloc(1, sizeof(*m));
  if (!m)
    return -ENOMEM;
  m->version = SPOT_MANIFEST_VERSION;
  m->created_ms = created_ms;
  m->step = -1;
  m->name = strdup(name);
  m->job = strdup(job);
  if (!m->name || !m->job) {
    spot_manifest_free(m);
    return -ENOMEM;
  }
  *out = m;
  return 0;
}

static bool
key_valid(const char *key)
{
  return spot_manifest_path_valid(key) && strcmp(key, SPOT_MANIFEST_NAME) != 0;
}

int
spot_manifest_add_file(struct spot_manifest *m, const char *path,
                       const char *key, uint64_t size, uint32_t mode,
                       int64_t mtime_ns, enum spot_filter filter,
                       size_t *out_index)
{
  struct spot_manifest_file *f;

  if (!spot_manifest_path_valid(path) || mode > 07777 ||
      mtime_ns < SPOT_MANIFEST_MTIME_MIN_NS ||
      (unsigned)filter >= SPOT_FILTER_LAST || (size == 0) != (key == NULL) ||
      (key && !key_valid(key)))
    return -EINVAL;
  if (m->nfiles >= SPOT_MANIFEST_FILES_MAX)
    return -E2BIG;
  if (m->nfiles == m->files_alloc) {
    size_t na = m->files_alloc ? m->files_alloc * 2 : 16;
    struct spot_manifest_file *nf;

    if (na > SPOT_MANIFEST_FILES_MAX)
      na = SPOT_MANIFEST_FILES_MAX;
    nf = realloc(m->files, na * sizeof(*nf));
    if (!nf)
      return -ENOMEM;
    m->files = nf;
    m->files_alloc = na;
  }
  f = &m->files[m->nfiles];
  memset(f, 0, sizeof(*f));
  f->path = strdup(path);
  f->key = key ? strdup(key) : NULL;
  if (!f->path || (key && !f->key)) {
    file_fini(f);
    return -ENOMEM;
  }
  f->size = size;
  f->mode = mode;
  f->mtime_ns = mtime_ns;
  f->filter = filter;
  if (out_index)
    *out_index = m->nfiles;
  m->nfiles++;
  return 0;
}

int
spot_manifest_add_link(struct spot_manifest *m, const char *path,
                       const char *target, int64_t mtime_ns, size_t *out_index)
{
  size_t idx;
  int r;

  if (!spot_manifest_link_valid(path, target))
    return -EINVAL;
  r = spot_manifest_add_file(m, path, NULL, 0, 0777, mtime_ns, SPOT_FILTER_NONE,
                             &idx);
  if (r < 0)
    return r;
  m->files[idx].link = strdup(target);
  if (!m->files[idx].link) {
    file_fini(&m->files[idx]);
    m->nfiles--;
    return -ENOMEM;
  }
  if (out_index)
    *out_index = idx;
  return 0;
}

int
spot_manifest_add_pack(struct spot_manifest *m, const char *key,
                       uint64_t stored, size_t *out_index)
{
  struct spot_manifest_pack *p;

  if (!key_valid(key))
    return -EINVAL;
  if (m->npacks >= SPOT_MANIFEST_PACKS_MAX)
    return -E2BIG;
  if (m->npacks == m->packs_alloc) {
    size_t na = m->packs_alloc ? m->packs_alloc * 2 : 4;

    p = realloc(m->packs, na * sizeof(*p));
    if (!p)
      return -ENOMEM;
    m->packs = p;
    m->packs_alloc = na;
  }
  p = &m->packs[m->npacks];
  p->key = strdup(key);
  if (!p->key)
    return -ENOMEM;
  p->stored = stored;
  if (out_index)
    *out_index = m->npacks;
  m->npacks++;
  return 0;
}

int
spot_manifest_set_pack_stored(struct spot_manifest *m, size_t index,
                              uint64_t stored)
{
  if (index >= m->npacks)
    return -EINVAL;
  m->packs[index].stored = stored;
  return 0;
}

int
spot_manifest_add_packed(struct spot_manifest *m, const char *path, size_t pack,
                         uint64_t pack_off, uint64_t size, uint32_t mode,
                         int64_t mtime_ns, enum spot_filter filter,
                         size_t *out_index)
{
  size_t idx;
  int r;

  if (size == 0 || pack >= m->npacks)
    return -EINVAL;
  /* added with a stand-in key, which is then dropped */
  r = spot_manifest_add_file(m, path, m->packs[pack].key, size, mode, mtime_ns,
                             filter, &idx);
  if (r < 0)
    return r;
  free(m->files[idx].key);
  m->files[idx].key = NULL;
  m->files[idx].pack = pack + 1;
  m->files[idx].pack_off = pack_off;
  if (out_index)
    *out_index = idx;
  return 0;
}

int
spot_manifest_set_pack_off(struct spot_manifest *m, size_t index,
                           uint64_t pack_off)
{
  if (index >= m->nfiles || m->files[index].pack == 0)
    return -EINVAL;
  m->files[index].pack_off = pack_off;
  return 0;
}

const char *
spot_manifest_object_key(const struct spot_manifest *m,
                         const struct spot_manifest_file *f)
{
  if (f->pack > 0 && f->pack <= m->npacks)
    return m->packs[f->pack - 1].key;
  return f->key;
}

int
spot_manifest_set_frame(struct spot_manifest *m, size_t index, size_t part,
                        uint64_t raw_len, uint64_t comp_len, uint32_t crc32c)
{
  struct spot_manifest_file *f;
  struct spot_manifest_frame *fr;

  if (index >= m->nfiles)
    return -EINVAL;
  f = &m->files[index];
  if (f->size == 0 || raw_len == 0 || raw_len > SPOT_CODEC_PART_MAX ||
      comp_len == 0 || comp_len > spot_codec_bound((size_t)raw_len))
    return -EINVAL;
  if (part >= SPOT_MANIFEST_FRAMES_MAX)
    return -E2BIG;
  if (part >= f->nframes) {
    size_t grow = part + 1 - f->nframes;

    if (m->total_frames + grow > SPOT_MANIFEST_TOTAL_FRAMES_MAX)
      return -E2BIG;
    if (part >= f->frames_alloc) {
      size_t na = f->frames_alloc ? f->frames_alloc : 4;
      struct spot_manifest_frame *nf;

      while (na <= part)
        na *= 2;
      if (na > SPOT_MANIFEST_FRAMES_MAX)
        na = SPOT_MANIFEST_FRAMES_MAX;
      nf = realloc(f->frames, na * sizeof(*nf));
      if (!nf)
        return -ENOMEM;
      f->frames = nf;
      f->frames_alloc = na;
    }
    memset(&f->frames[f->nframes], 0, grow * sizeof(*f->frames));
    f->nframes = part + 1;
    m->total_frames += grow;
  }
  fr = &f->frames[part];
  fr->raw_len = raw_len;
  fr->comp_len = comp_len;
  fr->crc32c = crc32c;
  fr->set = true;
  fr->ref = 0;
  return 0;
}

int
spot_manifest_set_frame_sha(struct spot_manifest *m, size_t index, size_t part,
                            const unsigned char *sha256)
{
  struct spot_manifest_frame *fr;

  if (index >= m->nfiles || part >= m->files[index].nframes || !sha256)
    return -EINVAL;
  fr = &m->files[index].frames[part];
  memcpy(fr->sha256, sha256, SPOT_MANIFEST_SHA256_LEN);
  fr->has_sha = true;
  return 0;
}

int
spot_manifest_add_ref(struct spot_manifest *m, const char *name,
                      const char *key, uint64_t stored, size_t *out_index)
{
  struct spot_manifest_ref *rf;

  if (!spot_ckpt_name_valid(name) || strcmp(name, m->name) == 0 ||
      !key_valid(key) || stored == 0 || stored > INT64_MAX)
    return -EINVAL;
  for (size_t i = 0; i < m->nrefs; i++)
    if (strcmp(m->refs[i].name, name) == 0 &&
        strcmp(m->refs[i].key, key) == 0) {
      *out_index = i;
      return 0;
    }
  if (m->nrefs >= SPOT_MANIFEST_REFS_MAX)
    return -E2BIG;
  if (m->nrefs == m->refs_alloc) {
    size_t na = m->refs_alloc ? m->refs_alloc * 2 : 4;
    struct spot_manifest_ref *p = realloc(m->refs, na * sizeof(*p));

    if (!p)
      return -ENOMEM;
    m->refs = p;
    m->refs_alloc = na;
  }
  rf = &m->refs[m->nrefs];
  rf->name = strdup(name);
  rf->key = strdup(key);
  rf->stored = stored;
  if (!rf->name || !rf->key) {
    free(rf->name);
    free(rf->key);
    return -ENOMEM;
  }
  *out_index = m->nrefs++;
  return 0;
}

int
spot_manifest_set_ref_frame(struct spot_manifest *m, size_t index, size_t part,
                            size_t ref, uint64_t comp_off, uint64_t raw_len,
                            uint64_t comp_len, uint32_t crc32c,
                            const unsigned char *sha256)
{
  struct spot_manifest_frame *fr;
  int r;

  if (index >= m->nfiles || ref >= m->nrefs || m->files[index].pack)
    return -EINVAL;
  r = spot_manifest_set_frame(m, index, part, raw_len, comp_len, crc32c);
  if (r < 0)
    return r;
  fr = &m->files[index].frames[part];
  fr->ref = (uint32_t)ref + 1;
  fr->comp_off = comp_off;
  if (sha256) {
    memcpy(fr->sha256, sha256, SPOT_MANIFEST_SHA256_LEN);
    fr->has_sha = true;
  }
  return 0;
}

int
spot_manifest_clear_key(struct spot_manifest *m, size_t index)
{
  if (index >= m->nfiles || m->files[index].pack)
    return -EINVAL;
  free(m->files[index].key);
  m->files[index].key = NULL;
  return 0;
}

const char *
spot_manifest_frame_key(const struct spot_manifest *m,
                        const struct spot_manifest_file *f,
                        const struct spot_manifest_frame *fr, const char **name)
{
  if (fr->ref > 0 && fr->ref <= m->nrefs) {
    *name = m->refs[fr->ref - 1].name;
    return m->refs[fr->ref - 1].key;
  }
  *name = NULL;
  return spot_manifest_object_key(m, f);
}

/* The cross-field rules. compute: fill in offsets (builder); else check
 * the parsed ones. Then the per-file and manifest totals are set. */
/* Uniqueness of paths and keys, and no path inside another's ("a" and
 * "a/b"), with sorted index arrays: 8 bytes per file, where hash sets of
 * jansson cost ~70 (memory is bounded for large manifests: README "What the
 * store refuses or never does"). */
static const struct spot_manifest *sort_m;
static bool sort_keys;

/* Keys: an index >= nfiles is pack (index - nfiles). */
static const char *
sort_str(size_t i)
{
  if (sort_keys && i >= sort_m->nfiles)
    return sort_m->packs[i - sort_m->nfiles].key;
  return sort_keys ? sort_m->files[i].key : sort_m->files[i].path;
}

static int
cmp_idx(const void *a, const void *b)
{
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  int c = strcmp(sort_str(x), sort_str(y));

  return c != 0 ? c : (x > y) - (x < y);
}

/* The smallest index that repeats an earlier one's string, or SIZE_MAX. */
static size_t
first_dup(const size_t *idx, size_t n)
{
  size_t best = SIZE_MAX;

  for (size_t k = 1; k < n; k++)
    if (strcmp(sort_str(idx[k - 1]), sort_str(idx[k])) == 0 && idx[k] < best)
      best = idx[k];
  return best;
}

/* Whether the first len bytes of p are another file's whole path. */
static bool
is_path(const size_t *idx, size_t n, const char *p, size_t len)
{
  size_t lo = 0, hi = n;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const char *q = sort_m->files[idx[mid]].path;
    int c = strncmp(q, p, len);

    if (c == 0 && q[len] == '\0')
      return true;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return false;
}

/* Not thread-safe (qsort's comparator reads sort_m): the manifest is
 * built and parsed on one thread at a time, as manifest.h says. */
static int
check_unique(const struct spot_manifest *m, char *err, size_t errlen)
{
  size_t *idx = malloc((m->nfiles + m->npacks + 1) * sizeof(*idx)), n = 0, d;
  int r = 0;

  if (!idx)
    return -ENOMEM;
  sort_m = m;
  sort_keys = false;
  for (size_t i = 0; i < m->nfiles; i++)
    idx[n++] = i;
  qsort(idx, n, sizeof(*idx), cmp_idx);
  d = first_dup(idx, n);
  if (d != SIZE_MAX)
    r = fail(err, errlen, -EBADMSG, "files[%zu].path: duplicate", d);
  /* "a" and "a/b" can't both be files */
  for (size_t i = 0; r == 0 && i < m->nfiles; i++) {
    const char *p = m->files[i].path;

    for (const char *s = strchr(p, '/'); s && r == 0; s = strchr(s + 1, '/'))
      if (is_path(idx, n, p, (size_t)(s - p)))
        r = fail(err, errlen, -EBADMSG,
                 "files[%zu].path: inside another file's path (%.*s)", i,
                 (int)(s - p), p);
  }
  if (r == 0) {
    sort_keys = true;
    n = 0;
    for (size_t i = 0; i < m->nfiles; i++)
      if (m->files[i].key)
        idx[n++] = i;
    for (size_t i = 0; i < m->npacks; i++)
      idx[n++] = m->nfiles + i;
    qsort(idx, n, sizeof(*idx), cmp_idx);
    d = first_dup(idx, n);
    if (d != SIZE_MAX && d >= m->nfiles)
      r = fail(err, errlen, -EBADMSG,
               "packs[%zu].key: same object as another pack or file",
               d - m->nfiles);
    else if (d != SIZE_MAX)
      r = fail(err, errlen, -EBADMSG,
               "files[%zu].key: same object as another file", d);
  }
  sort_m = NULL;
  free(idx);
  return r;
}

/* File i's frames tile the file, and those that are not references its
 * object; sets f->stored and adds referenced raw bytes to *ref_raw. */
static int
validate_frames(const struct spot_manifest *m, struct spot_manifest_file *f,
                size_t i, bool compute, uint64_t *ref_raw, char *err,
                size_t errlen)
{
  uint64_t raw = 0, comp = f->pack ? f->pack_off : 0;
  size_t own = 0;

  for (size_t j = 0; j < f->nframes; j++) {
    struct spot_manifest_frame *fr = &f->frames[j];

    if (!fr->set)
      return fail(err, errlen, -EBADMSG, "files[%zu].frames[%zu]: missing", i,
                  j);
    if (fr->raw_len == 0 || fr->raw_len > SPOT_CODEC_PART_MAX)
      return fail(err, errlen, -EBADMSG,
                  "files[%zu].frames[%zu].raw_len: %" PRIu64 " not in 1..%zu",
                  i, j, fr->raw_len, SPOT_CODEC_PART_MAX);
    if (fr->comp_len == 0 ||
        fr->comp_len > spot_codec_bound((size_t)fr->raw_len))
      return fail(err, errlen, -EBADMSG,
                  "files[%zu].frames[%zu].comp_len: %" PRIu64 " not in 1..%zu",
                  i, j, fr->comp_len, spot_codec_bound((size_t)fr->raw_len));
    if (fr->ref > 0) {
      const struct spot_manifest_ref *rf;

      if (fr->ref > m->nrefs || f->pack)
        return fail(
            err, errlen, -EBADMSG, "files[%zu].frames[%zu].ref: %s", i, j,
            f->pack ? "a packed file has no references" : "not in refs");
      rf = &m->refs[fr->ref - 1];
      /* comp_off <= INT64_MAX, comp_len <= bound(128 MiB): no overflow */
      if (fr->comp_off > rf->stored || fr->comp_len > rf->stored - fr->comp_off)
        return fail(err, errlen, -EBADMSG,
                    "files[%zu].frames[%zu].comp_off: %" PRIu64 "+%" PRIu64
                    " past refs[%u]'s %" PRIu64 " bytes",
                    i, j, fr->comp_off, fr->comp_len, fr->ref - 1, rf->stored);
      if (compute)
        fr->raw_off = raw;
      else if (fr->raw_off != raw)
        return fail(err, errlen, -EBADMSG,
                    "files[%zu].frames[%zu].raw_off: %" PRIu64
                    ", expected %" PRIu64 " (frames must be contiguous)",
                    i, j, fr->raw_off, raw);
      raw += fr->raw_len;
      *ref_raw += fr->raw_len;
      continue;
    }
    own++;
    if (compute) {
      fr->raw_off = raw;
      fr->comp_off = comp;
    } else if (fr->raw_off != raw) {
      return fail(err, errlen, -EBADMSG,
                  "files[%zu].frames[%zu].raw_off: %" PRIu64
                  ", expected %" PRIu64 " (frames must be contiguous)",
                  i, j, fr->raw_off, raw);
    } else if (fr->comp_off != comp) {
      return fail(err, errlen, -EBADMSG,
                  "files[%zu].frames[%zu].comp_off: %" PRIu64
                  ", expected %" PRIu64 " (frames must be contiguous)",
                  i, j, fr->comp_off, comp);
    }
    /* no overflow: <= 2^20 frames of <= spot_codec_bound(128 MiB) (< 2^48), and
     * pack_off < 2^63 */
    raw += fr->raw_len;
    comp += fr->comp_len;
  }
  if (raw != f->size)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].frames: cover %" PRIu64 " bytes, size is %" PRIu64,
                i, raw, f->size);
  if (own > 0 && !f->key && !f->pack)
    return fail(err, errlen, -EBADMSG, "files[%zu].key: missing", i);
  if (own == 0 && f->key)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].key: every frame is a reference, no object", i);
  f->stored = comp - (f->pack ? f->pack_off : 0);
  return 0;
}

/* Packed file i lies inside its pack, and is small enough for one ranged
 * read into a restore buffer. */
static int
validate_packed(const struct spot_manifest *m,
                const struct spot_manifest_file *f, size_t i, char *err,
                size_t errlen)
{
  const struct spot_manifest_pack *p = &m->packs[f->pack - 1];

  if (f->stored > SPOT_CODEC_PART_MAX)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].frames: a packed file stores %" PRIu64
                " bytes, more than %zu",
                i, f->stored, SPOT_CODEC_PART_MAX);
  if (f->pack_off > p->stored || f->stored > p->stored - f->pack_off)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].frames: bytes %" PRIu64 "..%" PRIu64
                " are outside its pack (%" PRIu64 " bytes)",
                i, f->pack_off, f->pack_off + f->stored, p->stored);
  return 0;
}

struct span {
  size_t pack, file;
  uint64_t off, end;
};

static int
cmp_span(const void *a, const void *b)
{
  const struct span *x = a, *y = b;

  if (x->pack != y->pack)
    return (x->pack > y->pack) - (x->pack < y->pack);
  if (x->off != y->off)
    return (x->off > y->off) - (x->off < y->off);
  return (x->file > y->file) - (x->file < y->file);
}

/* The referenced objects: names and keys. */
static int
validate_ref_list(const struct spot_manifest *m, char *err, size_t errlen)
{
  if (m->nrefs > SPOT_MANIFEST_REFS_MAX)
    return fail(err, errlen, -EBADMSG, "refs: more than %d",
                SPOT_MANIFEST_REFS_MAX);
  for (size_t i = 0; i < m->nrefs; i++) {
    const struct spot_manifest_ref *rf = &m->refs[i];
    const char *why = path_problem(rf->key, strlen(rf->key));

    if (!why && strcmp(rf->key, SPOT_MANIFEST_NAME) == 0)
      why = "reserved for the manifest";
    if (why)
      return fail(err, errlen, -EBADMSG, "refs[%zu].key: %s", i, why);
    if (!spot_ckpt_name_valid(rf->name) || strcmp(rf->name, m->name) == 0)
      return fail(err, errlen, -EBADMSG,
                  "refs[%zu].name: not another checkpoint's name", i);
    if (rf->stored == 0 || rf->stored > INT64_MAX)
      return fail(err, errlen, -EBADMSG, "refs[%zu].stored: not in 1..%lld", i,
                  (long long)INT64_MAX);
  }
  return 0;
}

/* Whether m uses what version 2 added (references, frame hashes). */
static bool
uses_refs(const struct spot_manifest *m)
{
  if (m->nrefs > 0)
    return true;
  for (size_t i = 0; i < m->nfiles; i++)
    for (size_t j = 0; j < m->files[i].nframes; j++)
      if (m->files[i].frames[j].has_sha || m->files[i].frames[j].ref)
        return true;
  return false;
}

/* The packs' keys and sizes. */
static int
validate_pack_list(const struct spot_manifest *m, char *err, size_t errlen)
{
  if (m->npacks > SPOT_MANIFEST_PACKS_MAX)
    return fail(err, errlen, -EBADMSG, "packs: more than %d",
                SPOT_MANIFEST_PACKS_MAX);
  for (size_t i = 0; i < m->npacks; i++) {
    const char *why = path_problem(m->packs[i].key, strlen(m->packs[i].key));

    if (!why && strcmp(m->packs[i].key, SPOT_MANIFEST_NAME) == 0)
      why = "reserved for the manifest";
    if (why)
      return fail(err, errlen, -EBADMSG, "packs[%zu].key: %s", i, why);
    if (m->packs[i].stored == 0 || m->packs[i].stored > INT64_MAX)
      return fail(err, errlen, -EBADMSG, "packs[%zu].stored: not in 1..%lld", i,
                  (long long)INT64_MAX);
  }
  return 0;
}

/* No two packed files' bytes overlap in a pack. */
static int
validate_packs(const struct spot_manifest *m, char *err, size_t errlen)
{
  struct span *sp;
  size_t n = 0;
  int r = 0;

  for (size_t i = 0; i < m->nfiles; i++)
    n += m->files[i].pack != 0;
  if (n < 2)
    return 0;
  sp = malloc(n * sizeof(*sp));
  if (!sp)
    return -ENOMEM;
  n = 0;
  for (size_t i = 0; i < m->nfiles; i++)
    if (m->files[i].pack != 0)
      sp[n++] = (struct span){m->files[i].pack, i, m->files[i].pack_off,
                              m->files[i].pack_off + m->files[i].stored};
  qsort(sp, n, sizeof(*sp), cmp_span);
  for (size_t k = 1; r == 0 && k < n; k++)
    if (sp[k].pack == sp[k - 1].pack && sp[k].off < sp[k - 1].end)
      r = fail(err, errlen, -EBADMSG,
               "files[%zu].frames: overlap files[%zu]'s in pack %s",
               sp[k].file > sp[k - 1].file ? sp[k].file : sp[k - 1].file,
               sp[k].file > sp[k - 1].file ? sp[k - 1].file : sp[k].file,
               m->packs[sp[k].pack - 1].key);
  free(sp);
  return r;
}

/* File i's own fields: path, mode, filter, link, key, frame count. */
static int
validate_file(const struct spot_manifest_file *f, size_t i, size_t npacks,
              char *err, size_t errlen)
{
  const char *why = path_problem(f->path, strlen(f->path));

  if (why)
    return fail(err, errlen, -EBADMSG, "files[%zu].path: %s", i, why);
  if (f->mode > 07777)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].mode: %" PRIu32 " has bits other than 07777", i,
                f->mode);
  if ((unsigned)f->filter >= SPOT_FILTER_LAST)
    return fail(err, errlen, -EBADMSG, "files[%zu].filter: unknown", i);
  if (f->link && (f->size != 0 || f->filter != SPOT_FILTER_NONE))
    return fail(err, errlen, -EBADMSG,
                "files[%zu].link: a symlink has size 0 and filter none", i);
  if (f->link && !spot_manifest_link_valid(f->path, f->link))
    return fail(err, errlen, -EBADMSG,
                "files[%zu].link: not a relative link inside the checkpoint",
                i);
  if (f->pack > npacks)
    return fail(err, errlen, -EBADMSG, "files[%zu].pack: not in packs", i);
  if (f->pack && (f->key || f->size == 0))
    return fail(err, errlen, -EBADMSG,
                "files[%zu].pack: a packed file has data and no key", i);
  if (f->size == 0 && (f->key || f->nframes))
    return fail(err, errlen, -EBADMSG,
                "files[%zu]: an empty file has no key and no frames", i);
  if (f->size > 0 && f->nframes == 0)
    return fail(err, errlen, -EBADMSG,
                "files[%zu].frames: empty, size is %" PRIu64, i, f->size);
  if (f->key) {
    why = path_problem(f->key, strlen(f->key));
    if (!why && strcmp(f->key, SPOT_MANIFEST_NAME) == 0)
      why = "reserved for the manifest";
    if (why)
      return fail(err, errlen, -EBADMSG, "files[%zu].key: %s", i, why);
  }
  if (f->nframes > SPOT_MANIFEST_FRAMES_MAX)
    return fail(err, errlen, -EBADMSG, "files[%zu].frames: more than %d", i,
                SPOT_MANIFEST_FRAMES_MAX);
  return 0;
}

static int
validate(struct spot_manifest *m, bool compute, char *err, size_t errlen)
{
  uint64_t total_raw = 0, total_stored = 0, ref_raw = 0;
  size_t total_frames = 0;
  int r;

  if (m->version != SPOT_MANIFEST_VERSION &&
      m->version != SPOT_MANIFEST_VERSION_REFS)
    return fail(err, errlen, -EPROTONOSUPPORT, "version: %u not supported",
                m->version);
  if (!spot_ckpt_name_valid(m->name))
    return fail(err, errlen, -EBADMSG, "name: not a valid checkpoint name");
  if (!spot_ckpt_name_valid(m->job))
    return fail(err, errlen, -EBADMSG, "job: not a valid job id");
  if (m->created_ms < 0 || m->created_ms > CREATED_MAX_MS)
    return fail(err, errlen, -EBADMSG, "created: outside 1970..9999");
  if (m->nfiles > SPOT_MANIFEST_FILES_MAX)
    return fail(err, errlen, -EBADMSG, "files: more than %d",
                SPOT_MANIFEST_FILES_MAX);
  r = validate_pack_list(m, err, errlen);
  if (r == 0)
    r = validate_ref_list(m, err, errlen);
  if (r < 0)
    return r;
  for (size_t i = 0; i < m->nfiles; i++) {
    struct spot_manifest_file *f = &m->files[i];

    r = validate_file(f, i, m->npacks, err, errlen);
    if (r < 0)
      return r;
    total_frames += f->nframes;
    if (total_frames > SPOT_MANIFEST_TOTAL_FRAMES_MAX)
      return fail(err, errlen, -EBADMSG,
                  "files[%zu].frames: more than %d in all", i,
                  SPOT_MANIFEST_TOTAL_FRAMES_MAX);
    r = validate_frames(m, f, i, compute, &ref_raw, err, errlen);
    if (r == 0 && f->pack)
      r = validate_packed(m, f, i, err, errlen);
    if (r < 0)
      return r;
    /* no overflow: <= 1e6 files of <= 1.4e12 bytes */
    total_raw += f->size;
    total_stored += f->stored;
  }
  r = validate_packs(m, err, errlen);
  if (r == 0)
    r = check_unique(m, err, errlen);
  if (r < 0)
    return r;
  m->total_raw = total_raw;
  m->total_stored = total_stored;
  m->total_frames = total_frames;
  m->total_ref_raw = ref_raw;
  return 0;
}

/* A JSON string, as jansson's compact output writes it (UTF-8 kept,
 * control bytes escaped). */
static int
put_str(struct spot_buf *b, const char *s)
{
  int r = spot_buf_append(b, "\"", 1);

  for (; r == 0 && *s; s++) {
    unsigned char c = (unsigned char)*s;
    static const char esc[] = "btn?fr";

    if (c == '"' || c == '\\')
      r = spot_buf_printf(b, "\\%c", c);
    else if (c >= '\b' && c <= '\r' && c != '\v')
      r = spot_buf_printf(b, "\\%c", esc[c - '\b']);
    else if (c < 0x20)
      r = spot_buf_printf(b, "\\u%04X", c);
    else
      r = spot_buf_append(b, s, 1);
  }
  return r == 0 ? spot_buf_append(b, "\"", 1) : r;
}

static int
put_file(struct spot_buf *b, const struct spot_manifest *m,
         const struct spot_manifest_file *f, bool first)
{
  int r = spot_buf_appends(b, first ? "{\"path\":" : ",{\"path\":");

  if (r == 0)
    r = put_str(b, f->path);
  if (r == 0)
    r = spot_buf_printf(b,
                        ",\"size\":%" PRIu64 ",\"mode\":%" PRIu32
                        ",\"mtime_ns\":%" PRId64 ",\"filter\":",
                        f->size, f->mode, f->mtime_ns);
  if (r == 0)
    r = put_str(b, spot_filter_name(f->filter));
  if (r == 0 && f->key) {
    r = spot_buf_appends(b, ",\"key\":");
    if (r == 0)
      r = put_str(b, f->key);
  }
  if (r == 0 && f->pack) {
    r = spot_buf_appends(b, ",\"pack\":");
    if (r == 0)
      r = put_str(b, m->packs[f->pack - 1].key);
  }
  if (r == 0 && f->link) {
    r = spot_buf_appends(b, ",\"link\":");
    if (r == 0)
      r = put_str(b, f->link);
  }
  if (r == 0)
    r = spot_buf_appends(b, ",\"frames\":[");
  for (size_t j = 0; r == 0 && j < f->nframes; j++) {
    const struct spot_manifest_frame *fr = &f->frames[j];

    r = spot_buf_printf(b, "%s{\"raw_off\":%" PRIu64 ",\"raw_len\":%" PRIu64,
                        j ? "," : "", fr->raw_off, fr->raw_len);
    if (r == 0 && fr->ref)
      r = spot_buf_printf(b, ",\"ref\":%" PRIu32, fr->ref - 1);
    if (r == 0)
      r = spot_buf_printf(b,
                          ",\"comp_off\":%" PRIu64 ",\"comp_len\":%" PRIu64
                          ",\"crc32c\":%" PRIu32,
                          fr->comp_off, fr->comp_len, fr->crc32c);
    if (r == 0 && fr->has_sha) {
      char hex[2 * SPOT_MANIFEST_SHA256_LEN + 1];

      for (size_t k = 0; k < SPOT_MANIFEST_SHA256_LEN; k++)
        snprintf(hex + 2 * k, 3, "%02x", fr->sha256[k]);
      r = spot_buf_printf(b, ",\"sha256\":\"%s\"", hex);
    }
    if (r == 0)
      r = spot_buf_appends(b, "}");
  }
  return r == 0 ? spot_buf_appends(b, "]}") : r;
}

/* Written straight into one buffer (capped at SPOT_MANIFEST_JSON_MAX), not
 * through a jansson tree of every file and frame. */
int
spot_manifest_to_json(struct spot_manifest *m, char **out, char *err,
                      size_t errlen)
{
  struct spot_buf b;
  char created[32];
  int r;

  r = validate(m, true, err, errlen);
  if (r == -ENOMEM)
    return r;
  if (r < 0)
    return -EINVAL;
  m->version =
      uses_refs(m) ? SPOT_MANIFEST_VERSION_REFS : SPOT_MANIFEST_VERSION;
  if (spot_rfc3339_format(m->created_ms, created, sizeof(created)) < 0)
    return fail(err, errlen, -EINVAL, "created: cannot format");
  spot_buf_init(&b, SPOT_MANIFEST_JSON_MAX + 1);
  r = spot_buf_printf(&b, "{\"format\":\"%s\",\"version\":%u,\"name\":",
                      SPOT_MANIFEST_FORMAT, m->version);
  if (r == 0)
    r = put_str(&b, m->name);
  if (r == 0)
    r = spot_buf_appends(&b, ",\"job\":");
  if (r == 0)
    r = put_str(&b, m->job);
  if (r == 0)
    r = spot_buf_printf(&b, ",\"created\":\"%s\"", created);
  if (r == 0 && m->epoch > 0)
    r = spot_buf_printf(&b, ",\"epoch\":%" PRIu64, m->epoch);
  if (r == 0 && m->step >= 0)
    r = spot_buf_printf(&b, ",\"step\":%" PRId64, m->step);
  if (r == 0)
    r = spot_buf_printf(&b,
                        ",\"totals\":{\"files\":%zu,"
                        "\"raw_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64,
                        m->nfiles, m->total_raw, m->total_stored);
  if (r == 0 && m->version >= SPOT_MANIFEST_VERSION_REFS)
    r = spot_buf_printf(&b, ",\"ref_bytes\":%" PRIu64, m->total_ref_raw);
  if (r == 0)
    r = spot_buf_appends(&b, "}");
  for (size_t i = 0; r == 0 && i < m->nrefs; i++) {
    r = spot_buf_appends(&b, i == 0 ? ",\"refs\":[{\"name\":" : ",{\"name\":");
    if (r == 0)
      r = put_str(&b, m->refs[i].name);
    if (r == 0)
      r = spot_buf_appends(&b, ",\"key\":");
    if (r == 0)
      r = put_str(&b, m->refs[i].key);
    if (r == 0)
      r = spot_buf_printf(&b, ",\"stored\":%" PRIu64 "}%s", m->refs[i].stored,
                          i + 1 == m->nrefs ? "]" : "");
  }
  for (size_t i = 0; r == 0 && i < m->npacks; i++) {
    r = spot_buf_appends(&b, i == 0 ? ",\"packs\":[{\"key\":" : ",{\"key\":");
    if (r == 0)
      r = put_str(&b, m->packs[i].key);
    if (r == 0)
      r = spot_buf_printf(&b, ",\"stored\":%" PRIu64 "}%s", m->packs[i].stored,
                          i + 1 == m->npacks ? "]" : "");
  }
  if (r == 0)
    r = spot_buf_appends(&b, ",\"files\":[");
  for (size_t i = 0; r == 0 && i < m->nfiles; i++)
    r = put_file(&b, m, &m->files[i], i == 0);
  if (r == 0)
    r = spot_buf_appends(&b, "]}");
  if (r == 0 && b.len > SPOT_MANIFEST_JSON_MAX)
    r = -E2BIG;
  if (r < 0) {
    spot_buf_fini(&b);
    if (r == -E2BIG)
      return fail(err, errlen, -EINVAL, "manifest: larger than %zu bytes",
                  SPOT_MANIFEST_JSON_MAX);
    return r;
  }
  *out = spot_buf_steal(&b);
  return *out ? 0 : -ENOMEM;
}

/* ---- parsing ---- */

struct parse {
  char *err;
  size_t errlen;
  /* Set when the "files" array is parsed one element at a time (see
   * split_files()): the document, and the array's elements. */
  const char *text;
  size_t nelems;
  size_t pos; /* the next element starts at or after text + pos */
  size_t end; /* the array's closing ']' */
  /* "packs": the manifest being parsed, its pack indices sorted by key */
  const struct spot_manifest *m;
  size_t *pack_idx;
  unsigned version; /* the manifest's, once read */
};

static int
cmp_pack_idx(const void *a, const void *b, void *data)
{
  const struct spot_manifest *m = data;

  return strcmp(m->packs[*(const size_t *)a].key,
                m->packs[*(const size_t *)b].key);
}

/* 1 + the index of the pack named key, or 0. */
static size_t
find_pack(const struct parse *ps, const char *key)
{
  size_t lo = 0, hi = ps->m != NULL ? ps->m->npacks : 0;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(ps->m->packs[ps->pack_idx[mid]].key, key);

    if (c == 0)
      return ps->pack_idx[mid] + 1;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

/* Rejects keys not in the NULL-terminated list. */
static int
only_keys(struct parse *ps, json_t *o, const char *where,
          const char *const *allowed)
{
  const char *k;
  json_t *v;

  json_object_foreach(o, k, v)
  {
    char q[40];
    size_t i;

    for (i = 0; allowed[i]; i++)
      if (strcmp(k, allowed[i]) == 0)
        break;
    if (!allowed[i])
      return fail(ps->err, ps->errlen, -EBADMSG, "%s%s%s: unknown key", where,
                  *where ? "." : "", quote(k, q, sizeof(q)));
  }
  return 0;
}

static int
get_int(struct parse *ps, json_t *o, const char *where, const char *key,
        int64_t min, int64_t max, int64_t *out)
{
  json_t *v = json_object_get(o, key);
  json_int_t x;
  const char *dot = *where ? "." : "";

  if (!v)
    return fail(ps->err, ps->errlen, -EBADMSG, "%s%s%s: missing", where, dot,
                key);
  if (!json_is_integer(v))
    return fail(ps->err, ps->errlen, -EBADMSG, "%s%s%s: not an integer", where,
                dot, key);
  x = json_integer_value(v);
  if (x < min || x > max)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "%s%s%s: %lld not in %" PRId64 "..%" PRId64, where, dot, key,
                (long long)x, min, max);
  *out = x;
  return 0;
}

static int
get_str(struct parse *ps, json_t *o, const char *where, const char *key,
        bool optional, const char **out, size_t *len)
{
  json_t *v = json_object_get(o, key);
  const char *dot = *where ? "." : "";

  if (!v && optional) {
    *out = NULL;
    *len = 0;
    return 0;
  }
  if (!v)
    return fail(ps->err, ps->errlen, -EBADMSG, "%s%s%s: missing", where, dot,
                key);
  if (!json_is_string(v))
    return fail(ps->err, ps->errlen, -EBADMSG, "%s%s%s: not a string", where,
                dot, key);
  *out = json_string_value(v);
  *len = json_string_length(v);
  return 0;
}

/* A hex digit's value, or -1. */
static int
hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* A frame's "ref" and "sha256" (version 2). */
static int
parse_frame_v2(struct parse *ps, json_t *o, const char *w,
               struct spot_manifest_frame *fr)
{
  const char *s;
  size_t len;
  int r;

  if (json_object_get(o, "ref")) {
    int64_t v;

    if (ps->version < SPOT_MANIFEST_VERSION_REFS)
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.ref: needs version 2", w);
    r = get_int(ps, o, w, "ref", 0, SPOT_MANIFEST_REFS_MAX - 1, &v);
    if (r < 0)
      return r;
    fr->ref = (uint32_t)v + 1;
  }
  r = get_str(ps, o, w, "sha256", true, &s, &len);
  if (r < 0 || !s)
    return r;
  if (ps->version < SPOT_MANIFEST_VERSION_REFS)
    return fail(ps->err, ps->errlen, -EBADMSG, "%s.sha256: needs version 2", w);
  if (len != 2 * SPOT_MANIFEST_SHA256_LEN)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "%s.sha256: not 64 lower-case hex digits", w);
  for (size_t k = 0; k < SPOT_MANIFEST_SHA256_LEN; k++) {
    int hi = hexval(s[2 * k]), lo = hexval(s[2 * k + 1]);

    if (hi < 0 || lo < 0)
      return fail(ps->err, ps->errlen, -EBADMSG,
                  "%s.sha256: not 64 lower-case hex digits", w);
    fr->sha256[k] = (unsigned char)(hi << 4 | lo);
  }
  fr->has_sha = true;
  return 0;
}

static int
parse_frames(struct parse *ps, json_t *arr, const char *where,
             struct spot_manifest_file *f)
{
  static const char *const frame_keys[] = {"raw_off",  "raw_len", "comp_off",
                                           "comp_len", "crc32c",  "ref",
                                           "sha256",   NULL};
  size_t n = json_array_size(arr);

  if (n > SPOT_MANIFEST_FRAMES_MAX)
    return fail(ps->err, ps->errlen, -EBADMSG, "%s.frames: more than %d", where,
                SPOT_MANIFEST_FRAMES_MAX);
  if (n == 0)
    return 0;
  f->frames = calloc(n, sizeof(*f->frames));
  if (!f->frames)
    return -ENOMEM;
  f->frames_alloc = n;
  for (size_t j = 0; j < n; j++) {
    struct spot_manifest_frame *fr = &f->frames[j];
    json_t *o = json_array_get(arr, j);
    char w[WHERE_MAX + 32];
    int64_t v[5];
    int r;

    snprintf(w, sizeof(w), "%s.frames[%zu]", where, j);
    if (!json_is_object(o))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s: not an object", w);
    r = only_keys(ps, o, w, frame_keys);
    if (r < 0)
      return r;
    for (int k = 0; k < 5; k++) {
      r = get_int(ps, o, w, frame_keys[k], 0,
                  k == 4 ? (int64_t)UINT32_MAX : INT64_MAX, &v[k]);
      if (r < 0)
        return r;
    }
    fr->raw_off = (uint64_t)v[0];
    fr->raw_len = (uint64_t)v[1];
    fr->comp_off = (uint64_t)v[2];
    fr->comp_len = (uint64_t)v[3];
    fr->crc32c = (uint32_t)v[4];
    fr->set = true;
    f->nframes = j + 1;
    r = parse_frame_v2(ps, o, w, fr);
    if (r < 0)
      return r;
  }
  return 0;
}

static int
parse_file(struct parse *ps, json_t *o, size_t i, struct spot_manifest_file *f)
{
  static const char *const file_keys[] = {"path",   "size", "mode", "mtime_ns",
                                          "filter", "key",  "pack", "link",
                                          "frames", NULL};
  char where[WHERE_MAX];
  const char *s;
  size_t len;
  int64_t v;
  json_t *frames;
  int r;

  snprintf(where, sizeof(where), "files[%zu]", i);
  if (!json_is_object(o))
    return fail(ps->err, ps->errlen, -EBADMSG, "%s: not an object", where);
  r = only_keys(ps, o, where, file_keys);
  if (r < 0)
    return r;
  r = get_str(ps, o, where, "path", false, &s, &len);
  if (r < 0)
    return r;
  /* checked here for NUL bytes, which strlen() would hide later */
  if (path_problem(s, len))
    return fail(ps->err, ps->errlen, -EBADMSG, "%s.path: %s", where,
                path_problem(s, len));
  f->path = strdup(s);
  if (!f->path)
    return -ENOMEM;
  r = get_str(ps, o, where, "key", true, &s, &len);
  if (r < 0)
    return r;
  if (s) {
    if (path_problem(s, len))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.key: %s", where,
                  path_problem(s, len));
    f->key = strdup(s);
    if (!f->key)
      return -ENOMEM;
  }
  r = get_str(ps, o, where, "pack", true, &s, &len);
  if (r < 0)
    return r;
  if (s) {
    f->pack = len == strlen(s) ? find_pack(ps, s) : 0;
    if (!f->pack)
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.pack: not in packs",
                  where);
  }
  r = get_str(ps, o, where, "link", true, &s, &len);
  if (r < 0)
    return r;
  if (s) {
    if (len != strlen(s))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.link: contains a NUL byte",
                  where);
    f->link = strdup(s);
    if (!f->link)
      return -ENOMEM;
  }
  r = get_int(ps, o, where, "size", 0, INT64_MAX, &v);
  if (r < 0)
    return r;
  f->size = (uint64_t)v;
  r = get_int(ps, o, where, "mode", 0, 07777, &v);
  if (r < 0)
    return r;
  f->mode = (uint32_t)v;
  r = get_int(ps, o, where, "mtime_ns", SPOT_MANIFEST_MTIME_MIN_NS, INT64_MAX,
              &f->mtime_ns);
  if (r < 0)
    return r;
  r = get_str(ps, o, where, "filter", false, &s, &len);
  if (r < 0)
    return r;
  if (spot_filter_from_name(s, &f->filter) < 0) {
    char q[40];

    return fail(ps->err, ps->errlen, -EBADMSG, "%s.filter: unknown '%s'", where,
                quote(s, q, sizeof(q)));
  }
  frames = json_object_get(o, "frames");
  if (!frames)
    return fail(ps->err, ps->errlen, -EBADMSG, "%s.frames: missing", where);
  if (!json_is_array(frames))
    return fail(ps->err, ps->errlen, -EBADMSG, "%s.frames: not an array",
                where);
  r = parse_frames(ps, frames, where, f);
  if (r == 0 && f->pack && f->nframes > 0)
    f->pack_off = f->frames[0].comp_off;
  return r;
}

/* ---- the "files" array, one element at a time
 *
 * A whole-document parse holds jansson's tree of every file and frame at
 * once (~1.4 KiB per file: 424 MiB for 300,000 empty files). The root is
 * parsed with "files" cut out, and each element of "files" on its own, so
 * the memory is the text, the manifest, and one element's tree. A scan
 * that finds nothing of the expected shape falls back to the whole-
 * document parse, which then reports the error. */

static size_t
skip_ws(const char *p, size_t n, size_t i)
{
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
    i++;
  return i;
}

/* After the string at p[i] == '"', or 0. */
static size_t
skip_str(const char *p, size_t n, size_t i)
{
  for (i++; i < n; i++) {
    if (p[i] == '\\')
      i++;
    else if (p[i] == '"')
      return i + 1;
  }
  return 0;
}

/* After the value starting at p[i], or 0. Scalars end at a delimiter;
 * jansson checks them later. */
static size_t
skip_value(const char *p, size_t n, size_t i)
{
  int depth = 0;

  if (i >= n)
    return 0;
  if (p[i] == '"')
    return skip_str(p, n, i);
  if (p[i] != '{' && p[i] != '[') {
    while (i < n && p[i] != ',' && p[i] != ']' && p[i] != '}' && p[i] != ' ' &&
           p[i] != '\t' && p[i] != '\n' && p[i] != '\r')
      i++;
    return i;
  }
  for (; i < n; i++) {
    if (p[i] == '"') {
      size_t j = skip_str(p, n, i);
      if (!j)
        return 0;
      i = j - 1;
    } else if (p[i] == '{' || p[i] == '[') {
      depth++;
    } else if ((p[i] == '}' || p[i] == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return 0;
}

/* The root's "files" array: [*a, *b) from '[' to after ']'. */
static bool
find_files(const char *p, size_t n, size_t *a, size_t *b)
{
  size_t i = skip_ws(p, n, 0);

  if (i >= n || p[i] != '{')
    return false;
  i = skip_ws(p, n, i + 1);
  while (i < n && p[i] == '"') {
    size_t ks = i, ke = skip_str(p, n, i), ve;

    if (!ke)
      return false;
    i = skip_ws(p, n, ke);
    if (i >= n || p[i] != ':')
      return false;
    i = skip_ws(p, n, i + 1);
    ve = skip_value(p, n, i);
    if (!ve)
      return false;
    if (ke - ks == 7 && memcmp(p + ks, "\"files\"", 7) == 0 && p[i] == '[') {
      *a = i;
      *b = ve;
      return true;
    }
    i = skip_ws(p, n, ve);
    if (i >= n || p[i] != ',')
      return false;
    i = skip_ws(p, n, i + 1);
  }
  return false;
}

/* Counts the elements of the array [a, b); false if it is not a list of
 * values separated by commas. */
static bool
count_elems(const char *p, size_t a, size_t b, size_t *count)
{
  size_t i = skip_ws(p, b, a + 1), n = 0;

  if (i < b && p[i] == ']') {
    *count = 0;
    return true;
  }
  for (;;) {
    size_t e = skip_value(p, b, i);

    if (!e || e == i)
      return false;
    if (++n > SPOT_MANIFEST_FILES_MAX) {
      *count = n; /* too many: parse_root says so, nothing parsed */
      return true;
    }
    i = skip_ws(p, b, e);
    if (i < b && p[i] == ']' && i + 1 == b) {
      *count = n;
      return true;
    }
    if (i >= b || p[i] != ',')
      return false;
    i = skip_ws(p, b, i + 1);
  }
}

/* Element i (in order) of the files array, parsed on its own. */
static int
parse_elem(struct parse *ps, size_t i, struct spot_manifest_file *f)
{
  size_t s = skip_ws(ps->text, ps->end, ps->pos);
  size_t e = skip_value(ps->text, ps->end, s);
  json_error_t jerr;
  json_t *o;
  int r;

  o = json_loadb(ps->text + s, e - s, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                 &jerr);
  if (!o) {
    for (char *p = jerr.text; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
        *p = '?';
    return fail(ps->err, ps->errlen, -EBADMSG,
                "files[%zu]: invalid JSON: %s (column %d)", i, jerr.text,
                jerr.column);
  }
  e = skip_ws(ps->text, ps->end, e);
  ps->pos = e + 1; /* past the ',' */
  r = parse_file(ps, o, i, f);
  json_decref(o);
  return r;
}

/* Documents up to this size may be parsed whole when the scan finds no
 * "files" array (jansson then names the problem); larger ones are
 * refused, so a hostile manifest never costs a tree of its whole text. */
#define WHOLE_PARSE_MAX ((size_t)1 << 20)

/* The document with "files": [] in place of the array, malloc'd, and
 * ps->text set; or NULL with *r = 0 (parse the whole document), or NULL
 * with *r < 0 (refused, err set). */
static char *
split_files(struct parse *ps, const char *json, size_t len, size_t *outlen,
            int *r)
{
  size_t a, b, n;
  char *root;

  *r = 0;
  if (!find_files(json, len, &a, &b)) {
    if (len > WHOLE_PARSE_MAX)
      *r = fail(ps->err, ps->errlen, -EBADMSG,
                "manifest: no \"files\" array found in %zu bytes", len);
    return NULL;
  }
  if (!count_elems(json, a, b, &n)) {
    *r = fail(ps->err, ps->errlen, -EBADMSG,
              "files: invalid JSON (not a list of values)");
    return NULL;
  }
  root = malloc(len - (b - a) + 2);
  if (!root) {
    *r = -ENOMEM;
    return NULL;
  }
  memcpy(root, json, a);
  root[a] = '[';
  root[a + 1] = ']';
  memcpy(root + a + 2, json + b, len - b);
  *outlen = len - (b - a) + 2;
  ps->text = json;
  ps->nelems = n;
  ps->pos = a + 1;
  ps->end = b - 1;
  return root;
}

/* format, version, the keys, name, job, created. */
static int
parse_header(struct parse *ps, json_t *root, struct spot_manifest *m)
{
  static const char *const root_keys[] = {
      "format", "version", "name",  "job",  "created", "epoch",
      "step",   "totals",  "packs", "refs", "files",   NULL};
  const char *s;
  size_t len;
  int64_t v;
  int r;

  if (!json_is_object(root))
    return fail(ps->err, ps->errlen, -EBADMSG, "manifest: not an object");
  r = get_str(ps, root, "", "format", false, &s, &len);
  if (r < 0)
    return r;
  if (strcmp(s, SPOT_MANIFEST_FORMAT) != 0)
    return fail(ps->err, ps->errlen, -EBADMSG, "format: not '%s'",
                SPOT_MANIFEST_FORMAT);
  /* the version before anything else, so a newer manifest says so */
  r = get_int(ps, root, "", "version", 0, INT64_MAX, &v);
  if (r < 0)
    return r;
  if (v != SPOT_MANIFEST_VERSION && v != SPOT_MANIFEST_VERSION_REFS)
    return fail(ps->err, ps->errlen, -EPROTONOSUPPORT,
                "version: %lld not supported (this build reads %d and %d)",
                (long long)v, SPOT_MANIFEST_VERSION,
                SPOT_MANIFEST_VERSION_REFS);
  m->version = (unsigned)v;
  ps->version = m->version;
  r = only_keys(ps, root, "", root_keys);
  if (r < 0)
    return r;
  r = get_str(ps, root, "", "name", false, &s, &len);
  if (r < 0)
    return r;
  if (len != strlen(s) || !spot_ckpt_name_valid(s))
    return fail(ps->err, ps->errlen, -EBADMSG,
                "name: not a valid checkpoint name");
  m->name = strdup(s);
  r = get_str(ps, root, "", "job", false, &s, &len);
  if (r < 0)
    return r;
  if (len != strlen(s) || !spot_ckpt_name_valid(s))
    return fail(ps->err, ps->errlen, -EBADMSG, "job: not a valid job id");
  m->job = strdup(s);
  if (!m->name || !m->job)
    return -ENOMEM;
  r = get_str(ps, root, "", "created", false, &s, &len);
  if (r < 0)
    return r;
  if (len != strlen(s) || spot_rfc3339_parse(s, &m->created_ms) < 0 ||
      m->created_ms < 0 || m->created_ms > CREATED_MAX_MS)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "created: not an RFC 3339 time in 1970..9999");
  /* optional: the writer's lease epoch (0 = none, older writers) */
  if (json_object_get(root, "epoch") != NULL) {
    r = get_int(ps, root, "", "epoch", 0, INT64_MAX, &v);
    if (r < 0)
      return r;
    m->epoch = (uint64_t)v;
  }
  /* optional: the trainer's step (absent = unknown, older writers) */
  m->step = -1;
  if (json_object_get(root, "step") != NULL) {
    r = get_int(ps, root, "", "step", 0, SPOT_CKPT_STEP_MAX, &v);
    if (r < 0)
      return r;
    m->step = v;
  }
  return 0;
}

/* "totals": checked against the files once they are parsed. */
static int
parse_totals(struct parse *ps, json_t *root, int64_t t[4])
{
  static const char *const totals_keys[] = {"files", "raw_bytes",
                                            "stored_bytes", "ref_bytes", NULL};
  json_t *totals;
  int r;

  totals = json_object_get(root, "totals");
  if (!totals)
    return fail(ps->err, ps->errlen, -EBADMSG, "totals: missing");
  if (!json_is_object(totals))
    return fail(ps->err, ps->errlen, -EBADMSG, "totals: not an object");
  r = only_keys(ps, totals, "totals", totals_keys);
  if (r >= 0)
    r = get_int(ps, totals, "totals", "files", 0, INT64_MAX, &t[0]);
  if (r >= 0)
    r = get_int(ps, totals, "totals", "raw_bytes", 0, INT64_MAX, &t[1]);
  if (r >= 0)
    r = get_int(ps, totals, "totals", "stored_bytes", 0, INT64_MAX, &t[2]);
  t[3] = -1;
  if (r >= 0 && json_object_get(totals, "ref_bytes")) {
    if (ps->version < SPOT_MANIFEST_VERSION_REFS)
      return fail(ps->err, ps->errlen, -EBADMSG,
                  "totals.ref_bytes: needs version 2");
    r = get_int(ps, totals, "totals", "ref_bytes", 0, INT64_MAX, &t[3]);
  }
  if (r < 0)
    return r;
  return 0;
}

/* "refs" (optional, version 2): parsed before the files, whose frames
 * index them. */
static int
parse_refs(struct parse *ps, json_t *root, struct spot_manifest *m)
{
  static const char *const ref_keys[] = {"name", "key", "stored", NULL};
  json_t *arr = json_object_get(root, "refs");
  size_t n;

  if (!arr)
    return 0;
  if (ps->version < SPOT_MANIFEST_VERSION_REFS)
    return fail(ps->err, ps->errlen, -EBADMSG, "refs: needs version 2");
  if (!json_is_array(arr))
    return fail(ps->err, ps->errlen, -EBADMSG, "refs: not an array");
  n = json_array_size(arr);
  if (n > SPOT_MANIFEST_REFS_MAX)
    return fail(ps->err, ps->errlen, -EBADMSG, "refs: more than %d",
                SPOT_MANIFEST_REFS_MAX);
  if (n == 0)
    return 0;
  m->refs = calloc(n, sizeof(*m->refs));
  if (!m->refs)
    return -ENOMEM;
  m->refs_alloc = n;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    struct spot_manifest_ref *rf = &m->refs[i];
    char where[WHERE_MAX];
    const char *s, *k;
    size_t len, klen;
    int64_t v;
    int r;

    snprintf(where, sizeof(where), "refs[%zu]", i);
    if (!json_is_object(o))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s: not an object", where);
    r = only_keys(ps, o, where, ref_keys);
    if (r == 0)
      r = get_str(ps, o, where, "name", false, &s, &len);
    if (r == 0)
      r = get_str(ps, o, where, "key", false, &k, &klen);
    if (r == 0)
      r = get_int(ps, o, where, "stored", 1, INT64_MAX, &v);
    if (r < 0)
      return r;
    if (len != strlen(s) || !spot_ckpt_name_valid(s))
      return fail(ps->err, ps->errlen, -EBADMSG,
                  "%s.name: not a valid checkpoint name", where);
    if (path_problem(k, klen))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.key: %s", where,
                  path_problem(k, klen));
    rf->name = strdup(s);
    rf->key = strdup(k);
    m->nrefs = i + 1;
    if (!rf->name || !rf->key)
      return -ENOMEM;
    rf->stored = (uint64_t)v;
  }
  return 0;
}

/* "packs" (optional): parsed before the files, which name them. */
static int
parse_packs(struct parse *ps, json_t *root, struct spot_manifest *m)
{
  static const char *const pack_keys[] = {"key", "stored", NULL};
  json_t *arr = json_object_get(root, "packs");
  size_t n;

  if (!arr)
    return 0;
  if (!json_is_array(arr))
    return fail(ps->err, ps->errlen, -EBADMSG, "packs: not an array");
  n = json_array_size(arr);
  if (n > SPOT_MANIFEST_PACKS_MAX)
    return fail(ps->err, ps->errlen, -EBADMSG, "packs: more than %d",
                SPOT_MANIFEST_PACKS_MAX);
  if (n == 0)
    return 0;
  m->packs = calloc(n, sizeof(*m->packs));
  ps->pack_idx = malloc(n * sizeof(*ps->pack_idx));
  if (!m->packs || !ps->pack_idx)
    return -ENOMEM;
  m->packs_alloc = n;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    char where[WHERE_MAX];
    const char *s;
    size_t len;
    int64_t v;
    int r;

    snprintf(where, sizeof(where), "packs[%zu]", i);
    if (!json_is_object(o))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s: not an object", where);
    r = only_keys(ps, o, where, pack_keys);
    if (r < 0)
      return r;
    r = get_str(ps, o, where, "key", false, &s, &len);
    if (r < 0)
      return r;
    if (path_problem(s, len))
      return fail(ps->err, ps->errlen, -EBADMSG, "%s.key: %s", where,
                  path_problem(s, len));
    r = get_int(ps, o, where, "stored", 1, INT64_MAX, &v);
    if (r < 0)
      return r;
    m->packs[i].key = strdup(s);
    if (!m->packs[i].key)
      return -ENOMEM;
    m->packs[i].stored = (uint64_t)v;
    m->npacks = i + 1;
    ps->pack_idx[i] = i;
  }
  ps->m = m;
  qsort_r(ps->pack_idx, n, sizeof(*ps->pack_idx), cmp_pack_idx, m);
  return 0;
}

static int
parse_root(struct parse *ps, json_t *root, struct spot_manifest *m)
{
  int64_t t[4], tf, traw, tstored;
  json_t *files;
  size_t nf;
  int r;

  r = parse_header(ps, root, m);
  if (r == 0)
    r = parse_totals(ps, root, t);
  if (r == 0)
    r = parse_packs(ps, root, m);
  if (r == 0)
    r = parse_refs(ps, root, m);
  if (r < 0)
    return r;
  tf = t[0];
  traw = t[1];
  tstored = t[2];
  files = json_object_get(root, "files");
  if (!files)
    return fail(ps->err, ps->errlen, -EBADMSG, "files: missing");
  if (!json_is_array(files))
    return fail(ps->err, ps->errlen, -EBADMSG, "files: not an array");
  nf = ps->text != NULL ? ps->nelems : json_array_size(files);
  if (nf > SPOT_MANIFEST_FILES_MAX)
    return fail(ps->err, ps->errlen, -EBADMSG, "files: more than %d",
                SPOT_MANIFEST_FILES_MAX);
  if (nf > 0) {
    m->files = calloc(nf, sizeof(*m->files));
    if (!m->files)
      return -ENOMEM;
    m->files_alloc = nf;
  }
  for (size_t i = 0; i < nf; i++) {
    /* counted first, so the file is freed whatever happens */
    m->nfiles = i + 1;
    r = ps->text != NULL
            ? parse_elem(ps, i, &m->files[i])
            : parse_file(ps, json_array_get(files, i), i, &m->files[i]);
    if (r < 0)
      return r;
    m->total_frames += m->files[i].nframes;
    if (m->total_frames > SPOT_MANIFEST_TOTAL_FRAMES_MAX)
      return fail(ps->err, ps->errlen, -EBADMSG,
                  "files[%zu].frames: more than %d in all", i,
                  SPOT_MANIFEST_TOTAL_FRAMES_MAX);
  }
  r = validate(m, false, ps->err, ps->errlen);
  if (r < 0)
    return r;
  if ((uint64_t)tf != m->nfiles)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "totals.files: %lld, the manifest lists %zu", (long long)tf,
                m->nfiles);
  if ((uint64_t)traw != m->total_raw)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "totals.raw_bytes: %lld, the files add up to %" PRIu64,
                (long long)traw, m->total_raw);
  if ((uint64_t)tstored != m->total_stored)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "totals.stored_bytes: %lld, the frames add up to %" PRIu64,
                (long long)tstored, m->total_stored);
  if (t[3] >= 0 && (uint64_t)t[3] != m->total_ref_raw)
    return fail(ps->err, ps->errlen, -EBADMSG,
                "totals.ref_bytes: %lld, the references add up to %" PRIu64,
                (long long)t[3], m->total_ref_raw);
  return 0;
}

int
spot_manifest_parse(const char *json, size_t len, struct spot_manifest **out,
                    char *err, size_t errlen)
{
  struct parse ps = {err, errlen, NULL, 0, 0, 0, NULL, NULL, 0};
  struct spot_manifest *m;
  json_error_t jerr;
  json_t *root;
  char *cut;
  size_t cutlen = 0;
  int r;

  if (len > SPOT_MANIFEST_JSON_MAX)
    return fail(err, errlen, -E2BIG, "manifest: larger than %zu bytes",
                SPOT_MANIFEST_JSON_MAX);
  cut = split_files(&ps, json, len, &cutlen, &r);
  if (r < 0)
    return r;
  if (cut) {
    root = json_loadb(cut, cutlen, JSON_REJECT_DUPLICATES, &jerr);
    free(cut);
  } else {
    root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  }
  if (!root) {
    /* jansson quotes the input near the error: no control bytes out */
    for (char *p = jerr.text; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
        *p = '?';
    return fail(err, errlen, -EBADMSG,
                "manifest: invalid JSON: %s (line %d, "
                "column %d)",
                jerr.text, jerr.line, jerr.column);
  }
  m = calloc(1, sizeof(*m));
  if (!m) {
    json_decref(root);
    return -ENOMEM;
  }
  r = parse_root(&ps, root, m);
  json_decref(root);
  free(ps.pack_idx);
  if (r < 0) {
    if (r == -ENOMEM)
      set_err(err, errlen, "manifest: out of memory");
    spot_manifest_free(m);
    return r;
  }
  *out = m;
  return 0;
}

const struct spot_manifest_file *
spot_manifest_find(const struct spot_manifest *m, const char *path)
{
  for (size_t i = 0; i < m->nfiles; i++)
    if (strcmp(m->files[i].path, path) == 0)
      return &m->files[i];
  return NULL;
}

uint64_t
spot_manifest_max_frame_raw(const struct spot_manifest *m)
{
  uint64_t max = 0;

  for (size_t i = 0; i < m->nfiles; i++)
    for (size_t j = 0; j < m->files[i].nframes; j++)
      if (m->files[i].frames[j].raw_len > max)
        max = m->files[i].frames[j].raw_len;
  return max;
}
